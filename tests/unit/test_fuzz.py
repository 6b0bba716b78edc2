"""Fuzzing in the suite (bounded, seeded): the public ops, the native decoder stack, native
drafting, the native planner and the step-metadata builders under hypothesis in fresh interpreters
(``helpers/fuzz_{ops,stack,drafting,planner,metadata}_script.py``), and the engine under random request
streams."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("hypothesis")


def _fuzz_script(name: str, examples: int) -> dict:
    """Runs helpers/NAME with ``examples`` per function in a fresh interpreter; returns
    {fuzzed function: calls that returned a result (checked against its oracle)}."""
    import helpers
    script = os.path.join(os.path.dirname(helpers.__file__), name)
    r = subprocess.run([sys.executable, script, str(examples)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-4000:]}"
    return {ln.split()[1]: int(ln.split()[-1]) for ln in r.stdout.splitlines() if ln.startswith("fuzzed fuzz_")}


def test_public_ops_match_their_references_or_refuse():
    computed = _fuzz_script("fuzz_ops_script.py", 150)
    assert len(computed) == 7, computed
    assert all(n >= 10 for n in computed.values()), computed   # valid calls were checked, not only refusals


def test_decoder_stack_refuses_bad_indices_and_writes_only_its_slots():
    computed = _fuzz_script("fuzz_stack_script.py", 200)
    assert computed.keys() == {"fuzz_decoder_stack"} and computed["fuzz_decoder_stack"] >= 50, computed


def test_drafting_refuses_bad_indices_and_writes_only_its_slots():
    computed = _fuzz_script("fuzz_drafting_script.py", 300)
    assert computed.keys() == {"fuzz_drafting"} and computed["fuzz_drafting"] >= 100, computed


def test_planner_refuses_bad_calls_atomically_and_keeps_every_page():
    computed = _fuzz_script("fuzz_planner_script.py", 300)   # computed: calls accepted and checked
    assert computed.keys() == {"fuzz_planner"} and computed["fuzz_planner"] >= 1000, computed


def test_metadata_builders_match_the_reference_or_refuse():
    computed = _fuzz_script("fuzz_metadata_script.py", 300)   # computed: valid calls checked against numpy
    assert computed.keys() == {"fuzz_build_metadata", "fuzz_planner_metadata"}, computed
    assert all(n >= 50 for n in computed.values()), computed


# valid values most of the time, limits and invalid ones sometimes
PARAM_CHOICES = dict(
    max_tokens=[1, 5, 17, 40] * 3 + [0, -3, 2 ** 40, "7"],
    temperature=[0.0] * 6 + [0.7, 1.3, 1e-45, -1.0, float("nan")],
    top_k=[0] * 6 + [3, 2 ** 31 - 1, 2 ** 63, -1], top_p=[1.0] * 5 + [0.9, 0.0, 1.5],
    seed=[None, 3, 7, 11, 2 ** 63 - 1, 2 ** 64, -(2 ** 63)], stop=[None] * 5 + ["e", ["ab", "\n"], [""], 5],
)


def _random_params(rng):
    kw = {k: rng.choice(v) for k, v in PARAM_CHOICES.items()}
    kw["ignore_eos"] = rng.random() < 0.5
    return kw


@pytest.mark.parametrize("method", ["none", "ngram", "draft_target", "mtp", "mtp+lookup", "eagle_tree"])
def test_engine_under_random_request_streams(llama_dir, draft_dir, heads, method):
    """Random requests (every parameter at and past its limits), aborts, closed streams,
    a small KV pool and two submitting threads. Only ValueError escapes, and only at
    submission; every request finishes; every page comes back; greedy requests equal the
    same request run alone."""
    import random
    import threading
    import zlib
    from sonarspec_ext import LLM, SamplingParams, SpecConfig
    name, lookup = method.partition("+")[0], 6 if method.endswith("+lookup") else 0   # lookup drafts beside the head
    draft = {"draft_target": draft_dir, "mtp": heads["trained"], "eagle_tree": heads["trained"]}.get(name)
    spec = SpecConfig(method=name, draft=draft, num_draft_tokens=3, lookup_draft_tokens=lookup)
    llm = LLM(llama_dir, spec=spec, num_pages=24, page_size=4, max_num_seqs=6)
    alone = LLM(llama_dir, num_pages=24, page_size=4)
    rng = random.Random(zlib.crc32(method.encode()))   # str hashes vary per process: not a seed
    results, errors = [], []

    def submit(worker_rng, count):
        for _ in range(count):
            prompt = [worker_rng.randrange(280) for _ in range(worker_rng.randint(0, 30))]
            try:
                params = SamplingParams(**_random_params(worker_rng))
            except ValueError:
                continue
            try:
                if worker_rng.random() < 0.25:   # a stream, sometimes closed early
                    s = llm.stream(prompt, params)
                    for i, _ in enumerate(s):
                        if i == 2 and worker_rng.random() < 0.5:
                            s.close()
                            break
                    continue
                out = llm.generate([prompt], params)[0]
                results.append((prompt, params, out))
            except ValueError:
                continue
            except Exception as e:   # noqa: BLE001 - anything else is a failure
                errors.append(repr(e))
    threads = [threading.Thread(target=submit, args=(random.Random(rng.random()), 20)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a submitting thread hung"
    assert not errors, errors[:3]
    eng = llm.engine
    assert not eng.seqs and eng.planner.num_free_pages == eng.kv_cache.num_pages
    assert not lookup or not eng.proposer.lookups.indexes   # every finished request's index dropped
    assert results and all(o.finish_reason in ("stop", "length") for _, _, o in results)
    greedy = [(p, sp, o) for p, sp, o in results if sp.greedy]
    assert greedy
    for p, sp, o in greedy:
        assert alone.generate([p], sp)[0].token_ids == o.token_ids
