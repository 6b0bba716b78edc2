"""The ``sonarspec`` console script."""
import json
import os
import shutil
import statistics
import subprocess
import sys

import pytest

from helpers.models import CHATML

from sonarspec_ext import LLM, SamplingParams
from sonarspec_ext.chat_cli import HELP


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "sonarspec_ext.cli", *args], capture_output=True, text=True,
                          timeout=300)


def test_generate_prints_the_greedy_continuation_and_speed(llama_dir):
    r = run_cli("generate", "hello", "--model", llama_dir, "--max-tokens", "12", "--ignore-eos")
    assert r.returncode == 0, r.stderr
    ref = LLM(llama_dir).generate("hello", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    assert r.stdout.rstrip("\n") == "hello" + ref.text
    assert "12 tokens in" in r.stderr and "tok/s" in r.stderr


def test_generate_reports_bad_input_cleanly(llama_dir, tmp_path):
    r = run_cli("generate", "hello", "--model", str(tmp_path / "missing"))
    assert r.returncode == 2 and "model directory or GGUF file not found" in r.stderr
    r = run_cli("generate", "hello", "--model", llama_dir, "--top-p", "0")
    assert r.returncode == 2 and "top_p" in r.stderr
    r = run_cli("generate", "hello", "--model", llama_dir, "--draft-stop-prob", "1.5")
    assert r.returncode == 2 and "--draft-stop-prob: must lie in [0, 1)" in r.stderr
    r = run_cli("generate", "hello", "--model", llama_dir, "--lookup-draft-tokens", "17")
    assert r.returncode == 2 and "--lookup-draft-tokens: must lie in [0, 16]" in r.stderr


def test_generate_stops_before_a_stop_string_as_the_library_does(llama_dir):
    full = LLM(llama_dir).generate("hello", SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]   # two characters from the middle of the reply
    ref = LLM(llama_dir).generate("hello", SamplingParams(max_tokens=24, temperature=0, ignore_eos=True,
                                                           stop=["@@never@@", stop]))[0]
    assert len(ref.text) < len(full) and stop not in ref.text
    r = run_cli("generate", "hello", "--model", llama_dir, "--max-tokens", "24", "--ignore-eos",
                "--stop", "@@never@@", "--stop", stop)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == "hello" + ref.text
    r = run_cli("generate", "hello", "--model", llama_dir, "--stop", "")
    assert r.returncode == 2 and "stop must be non-empty strings" in r.stderr


def test_generate_with_confidence_stopped_chains_prints_the_plain_continuation():
    args = ("generate", "hello", "--model", "default", "--max-tokens", "16", "--ignore-eos", "--spec-control",
            "always")
    plain = run_cli(*args, "--spec", "none")
    stopped = run_cli(*args, "--spec", "mtp", "--num-draft-tokens", "4", "--draft-stop-prob", "0.3")
    assert plain.returncode == 0 and stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == plain.stdout and "acceptance length" in stopped.stderr
    assert "drafts accepted" in stopped.stderr and "acceptance length" not in plain.stderr   # no drafts, no tau


@pytest.mark.parametrize("args,lookup", [(["--spec", "mtp"], 8), (["--spec", "draft_target"], 8),
                                         (["--spec", "mtp", "--lookup-draft-tokens", "0"], 0),
                                         (["--spec", "mtp", "--lookup-draft-tokens", "5"], 5),
                                         (["--spec", "ngram"], 0), (["--spec", "eagle_tree"], 0)])
def test_chain_drafters_draft_from_lookups_by_default(args, lookup, monkeypatch):
    import sonarspec_ext.llm
    from sonarspec_ext.cli import main

    class Built(Exception):
        pass

    def fake_llm(model, spec, **kwargs):
        raise Built(spec)
    monkeypatch.setattr(sonarspec_ext.llm, "LLM", fake_llm)
    with pytest.raises(Built) as built:
        main(["generate", "hello", "--model", "default", *args])
    assert built.value.args[0].lookup_draft_tokens == lookup


@pytest.mark.slow
def test_bench_compares_with_transformers(llama_dir, tmp_path):
    out = tmp_path / "bench.json"
    r = run_cli("bench", "--model", llama_dir, "--batch-sizes", "1", "2", "--max-tokens", "8", "--repeats", "1",
                "--json", str(out))
    assert r.returncode == 0, r.stderr
    info = json.loads(out.read_text())
    assert [row["batch_size"] for row in info["results"]] == [1, 2]
    assert info["results"][0]["greedy_agreement"] == "1/1"
    assert all(row["sonarspec_tok_s"] > 0 and row["transformers_tok_s"] > 0 for row in info["results"])
    _check_cpu_record(info["cpu"])


def _check_cpu_record(cpu):
    """The JSON's machine record against lscpu's own reading of the CPU, where it runs."""
    assert cpu["logical_cpus"] == os.cpu_count()
    lscpu = shutil.which("lscpu")
    if lscpu is None or not os.path.exists("/proc/cpuinfo"):
        return
    fields, todo = {}, json.loads(subprocess.run([lscpu, "-J"], capture_output=True, text=True,
                                                 check=True).stdout)["lscpu"]
    while todo:   # newer lscpu nests fields under "children"
        f = todo.pop()
        fields.setdefault(f["field"].rstrip(":"), f["data"])
        todo += f.get("children", [])
    assert cpu["vendor"] == fields["Vendor ID"]
    assert cpu["model_name"] == fields["Model name"]
    flags = set(fields.get("Flags", "").split())
    assert set(cpu["features"]) == {f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni",
                                                "amx_tile", "amx_int8", "amx_bf16") if f in flags}


@pytest.mark.slow
@pytest.mark.slow
def test_bench_spec_mtp_runs_every_scheme_in_one_run(llama_dir, draft_dir, tmp_path):
    from helpers.mtp_fixtures import random_head, save
    head = save(random_head(llama_dir), str(tmp_path / "head"))
    out = tmp_path / "spec.json"
    r = run_cli("bench", "--spec", "mtp", "--model", llama_dir, "--draft", draft_dir, "--mtp", head, "--ks", "2",
                "--mtp-ks", "1", "2", "--batch-sizes", "1", "--max-tokens", "8", "--repeats", "2",
                "--json", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["results"]
    assert [row["scheme"] for row in rows] == ["plain", "draft_target K=2", "mtp K=1", "mtp K=2", "mtp K=2 +lookup 8"]
    assert all(row["tok_s"] > 0 and row["tau"] >= 1 for row in rows)
    assert len(rows[3]["accepted_per_position"]) == 2
    assert all(row["greedy_agreement"] == "8/8" for row in rows)   # the 8 benchmark prompts
    assert all(len(row["round_s"]) == 2 and row["tok_s"] == pytest.approx(8 * 8 / statistics.median(row["round_s"]),
                                                                         rel=0.05) for row in rows)
    info = json.loads(out.read_text())
    assert (info["device"], info["dtype"]) == ("cpu", "float32")
    r = run_cli("bench", "--spec", "mtp", "--model", llama_dir, "--draft", draft_dir, "--mtp", str(tmp_path / "missing"))
    assert r.returncode == 2 and "MTP head directory not found" in r.stderr
    r = run_cli("bench", "--model", llama_dir, "--device", "cuda")
    assert r.returncode == 2 and "apply to --spec all/mtp/eagle_tree" in r.stderr
    r = run_cli("bench", "--spec", "mtp", "--model", llama_dir, "--draft", draft_dir, "--mtp", head, "--cuda-graphs")
    assert r.returncode == 2 and "cuda_graphs needs a CUDA device" in r.stderr
    r = run_cli("bench", "--spec", "mtp", "--model", llama_dir, "--draft", draft_dir, "--mtp", head, "--ks", "2",
                "--mtp-ks", "2", "--batch-sizes", "1", "--max-tokens", "8", "--repeats", "1", "--temperature", "0.8",
                "--top-p", "0.9", "--no-draft-sampling", "--json", str(out))
    assert r.returncode == 0, r.stderr
    info = json.loads(out.read_text())
    assert (info["temperature"], info["top_p"], info["draft_sampling"]) == (0.8, 0.9, False) and "T = 0.8" in r.stdout
    assert all(row["tok_s"] > 0 and "greedy_agreement" not in row for row in info["results"])


@pytest.mark.slow
@pytest.mark.slow
def test_bench_eagle_tree_sets_trees_beside_chains_and_times_attention(llama_dir, tmp_path):
    from helpers.mtp_fixtures import random_head, save
    head = save(random_head(llama_dir), str(tmp_path / "head"))
    out = tmp_path / "tree.json"
    r = run_cli("bench", "--spec", "eagle_tree", "--model", llama_dir, "--mtp", head, "--mtp-ks", "2",
                "--tree-top-k", "2", "--tree-nodes", "5", "--batch-sizes", "1", "--max-tokens", "8", "--repeats", "1",
                "--json", str(out))
    assert r.returncode == 0, r.stderr
    info = json.loads(out.read_text())
    assert [row["scheme"] for row in info["results"]] == ["plain", "mtp K=2", "eagle_tree d=2 k=2 n=5"]
    assert all(row["tok_s"] > 0 and row["tau"] >= 1 for row in info["results"])
    assert {(a["context"], a["query_tokens"]) for a in info["attention"]} >= {(128, 17), (512, 33)}
    assert all(a["chain_us"] > 0 and a["tree_us"] > 0 for a in info["attention"])
    r = run_cli("generate", "hello", "--model", llama_dir, "--spec", "eagle_tree", "--draft", head,
                "--max-tokens", "12", "--ignore-eos")
    ref = LLM(llama_dir).generate("hello", SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    assert r.returncode == 0 and r.stdout.rstrip("\n") == "hello" + ref.text, r.stderr


def test_bench_spec_records_a_failing_scheme_and_measures_the_rest(llama_dir, draft_dir, monkeypatch, capsys):
    import sonarspec_ext.bench.spec as bs
    run = bs.run_batches

    def flaky(llm, *args):
        if llm.engine.spec.num_draft_tokens == 3:
            raise RuntimeError("kernel launch failed")
        return run(llm, *args)
    monkeypatch.setattr(bs, "run_batches", flaky)
    info = bs.bench_spec(llama_dir, draft_dir, ks=(2, 3), batch_sizes=(1,), max_tokens=4, repeats=1,
                         with_transformers=False, mtp_ks=(), with_ngram=False)
    rows = {r["scheme"]: r for r in info["results"]}
    assert rows["draft_target K=3"] == {"batch_size": 1, "scheme": "draft_target K=3",
                                        "error": "RuntimeError: kernel launch failed"}
    assert rows["plain"]["tok_s"] > 0 and rows["draft_target K=2"]["greedy_agreement"] == "8/8"
    bs.print_spec_table(info)
    assert "draft_target K=3           failed: RuntimeError: kernel launch failed" in capsys.readouterr().out


def test_chat_and_generate_chat_on_a_gguf_file(tmp_path):
    """`sonarspec chat` streams each reply (the same text LLM.chat gives) and reports speed per
    turn; /reset starts over; `generate --chat` answers one message."""
    from helpers.models import make_hf_model
    from helpers.gguf_fixtures import write_gguf
    hf = str(tmp_path / "hf")
    make_hf_model(hf, "llama", seed=5)
    path = write_gguf(hf, str(tmp_path / "chat.gguf"), chat_template=CHATML)
    ref = LLM(path).chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=6, temperature=0))[0]
    r = subprocess.run([sys.executable, "-m", "sonarspec_ext.cli", "chat", "--model", path, "--max-tokens", "6"],
                       input="hi\n/reset\n/help\n/hlep\nhi\n/exit\n", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(ref.text) >= 2 and "(new conversation)" in r.stderr
    assert r.stderr.count(f"[{len(ref.token_ids)} tokens in") == 2 and "tok/s" in r.stderr   # commands get no reply
    assert r.stderr.count(HELP) == 3 and f"unknown command /hlep; {HELP}" in r.stderr   # start, /help, /hlep
    m = LLM(path).memory()   # the start line says what the engine holds
    assert f"KV pool {m['kv_pool_bytes'] / 2**20:.0f} MiB ({m['kv_pool_tokens']} tokens)" in r.stderr
    r = run_cli("generate", "hi", "--chat", "--model", path, "--max-tokens", "6", "--spec", "none")
    assert r.returncode == 0, r.stderr
    assert r.stdout.rstrip("\n") == ref.text


def test_timing_rounds_rotate_their_order():
    from sonarspec_ext.bench import rotated
    assert [rotated("abc", r) for r in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert rotated([], 3) == []


def test_a_chat_turn_reports_its_speculation():
    """The per-turn line counts this turn's steps only: acceptance, drafts accepted, the
    steps whose drafts came from the context (lookup drafts) and the prompt tokens found in
    the prefix cache, when there were any."""
    import io
    from sonarspec_ext.chat_cli import chat_turn

    class Stub:   # an LLM whose counters move by one turn's worth while it streams
        def __init__(self, lookups, cached):
            keys = ("num_output_tokens", "num_steps", "num_accepted_tokens", "num_draft_tokens", "num_lookup_steps",
                    "num_prompt_tokens", "num_cached_tokens")
            self.now = dict.fromkeys(keys, 5)
            self.turn = dict(zip(keys, (12, 4, 8, 11, lookups, 40, cached)))

        def stats(self):
            return dict(self.now)

        def stream_chat(self, messages, params):
            yield "Hello"
            self.now = {k: v + self.turn[k] for k, v in self.now.items()}
            yield " there"

    for lookups, cached, note in ((3, 0, " (3 of 4 steps drafted from the context)"), (0, 32, "")):
        out, err = io.StringIO(), io.StringIO()
        assert chat_turn(Stub(lookups, cached), [], SamplingParams(), out, err) == "Hello there"
        assert out.getvalue() == "Hello there\n"
        line = err.getvalue()
        assert line.startswith("[12 tokens in ") and line.endswith(f", acceptance length 3.00, 8/11 drafts accepted{note}]\n")
        assert (", 32 of 40 prompt tokens from the prefix cache," in line) == bool(cached)
