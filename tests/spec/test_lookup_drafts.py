"""Lookup drafts beside a chain drafter (SpecConfig.lookup_draft_tokens): the incremental
context index against the plain scan, lossless greedy and sampled output, the drafter's
own state kept right across lookup steps, bad settings refused."""
import random

import pytest

import sonarspec_ext.spec.chain_drafter as chain_drafter
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.engine.spec_control import SpeculationControl
from sonarspec_ext.spec.lookup import ContextIndex, LookupDrafts

from helpers.models import VOCAB
from helpers.prompts import prompts
from helpers.spec_checks import check_sampled_law

GREEDY = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)


def scan(ids, k, max_ngram, min_ngram):
    """The oracle: scan backwards for the most recent earlier occurrence of the longest
    suffix n-gram of ``ids`` (max_ngram down to min_ngram tokens); up to ``k`` tokens that
    followed it."""
    n_ids = len(ids)
    for n in range(min(max_ngram, n_ids - 1), min_ngram - 1, -1):
        suffix = ids[n_ids - n:]
        for start in range(n_ids - n - 1, -1, -1):
            if ids[start:start + n] == suffix:
                return ids[start + n:start + n + k]
    return []


def repetitive_prompts(n, seed):
    """Prompts that repeat themselves, so that the context has n-grams to look up."""
    return [p * 3 for p in prompts(n, seed=seed)]


@pytest.mark.parametrize("vocab", [2, 3, 7, 50])
def test_the_index_finds_what_the_scan_finds(vocab):
    rng = random.Random(vocab)
    for _ in range(100):
        max_ngram = rng.randint(1, 5)
        min_ngram = rng.randint(1, max_ngram)
        index, ids = ContextIndex(max_ngram, min_ngram), []
        for _ in range(rng.randint(1, 40)):
            ids += [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]   # steps add 1-4 tokens
            k = rng.randint(0, 7)
            assert index.draft(ids, k) == (scan(ids, k, max_ngram, min_ngram) if k else []), (ids, k)


def test_each_sequence_has_its_own_index_until_reset():
    class Seq:
        def __init__(self, seq_id, ids):
            self.seq_id, self.all_ids = seq_id, ids

    drafts = LookupDrafts(4, 2)
    a, b = Seq(0, [1, 2, 3, 9, 1, 2]), Seq(1, [7, 8, 5, 7, 8])
    assert drafts.draft(a, 3) == [3, 9, 1] and drafts.draft(b, 3) == [5, 7, 8]
    drafts.reset(a)
    assert set(drafts.indexes) == {1}
    assert drafts.draft(Seq(0, [4, 4]), 2) == []   # a new sequence with the old id starts afresh


@pytest.mark.parametrize("bad", [(0, 0), (2, 3), (3, 0)])
def test_bad_ngram_lengths_are_refused(bad):
    with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
        ContextIndex(*bad)


def _lookup_steps(llm) -> int:
    """Steps of finished requests that drafted from the context; checked against the
    positions drafted past the chain length, which only lookup drafts reach."""
    st = llm.stats()
    beyond = sum(llm.engine.finished.drafted_per_position[llm.engine.proposer.max_draft_tokens:])
    assert st["num_lookup_steps"] >= (beyond > 0) and st["num_lookup_accepted_tokens"] <= st["num_accepted_tokens"]
    return st["num_lookup_steps"]


@pytest.mark.parametrize("method", ["mtp", "draft_target"])
def test_greedy_output_equals_plain_decoding(method, heads, draft_dir, llama_dir, plain_greedy):
    ps = repetitive_prompts(8, seed=4) + prompts(4, seed=5)
    draft = heads["trained"] if method == "mtp" else draft_dir
    llm = LLM(llama_dir, spec=SpecConfig(method=method, draft=draft, num_draft_tokens=2, lookup_draft_tokens=6))
    for bs in (1, 12):
        out = llm.generate(ps[:bs], GREEDY)
        assert [o.token_ids for o in out] == plain_greedy(ps[:bs], GREEDY)
    assert _lookup_steps(llm) > 0 and llm.stats()["num_lookup_accepted_tokens"] > 0
    assert sum(o.stats["num_lookup_steps"] for o in out) > 0
    without = LLM(llama_dir, spec=SpecConfig(method=method, draft=draft, num_draft_tokens=2))
    without.generate(ps, GREEDY)
    assert without.stats()["num_lookup_steps"] == 0
    assert llm.engine.planner.num_free_pages == llm.engine.kv_cache.num_pages
    assert not llm.engine.proposer.lookups.indexes   # finished sequences leave no index behind


def test_the_adaptive_control_measures_lookup_steps_apart(llama_dir, heads, plain_greedy, monkeypatch):
    """Under the adaptive control, the engine tells it which sequences drafted from the
    context - as many as the requests' own statistics count - and those steps reach its
    lookup measurements (engine/lookup_steps.py); the output stays plain decoding's."""
    told = []
    record = SpeculationControl.record

    def counting(self, *args, lookup=None, **kwargs):
        told.append(sum(lookup or []))
        return record(self, *args, lookup=lookup, **kwargs)

    monkeypatch.setattr(SpeculationControl, "record", counting)
    ps = repetitive_prompts(6, seed=7)
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=2,
                                         lookup_draft_tokens=6), adaptive_speculation=True)
    for bs in (1, 6):
        assert [o.token_ids for o in llm.generate(ps[:bs], GREEDY)] == plain_greedy(ps[:bs], GREEDY)
    controls = llm.engine.spec_control.classes.values()
    looked = sum(c.lookup_steps.samples for c in controls)
    assert _lookup_steps(llm) > 0 and looked > 0
    assert sum(told) == llm.stats()["num_lookup_steps"]
    assert all(0 <= c.lookup_steps.share <= 1 for c in controls)


def test_lookup_drafts_stop_at_max_tokens_and_the_context():
    """Near max_tokens and the end of the context a lookup draft is cut to the room left."""
    ps = [list(range(10, 30)) * 3, [7, 8, 9, 5] * 12, [3, 1, 4, 1, 5, 9, 2, 6] * 6]   # 48-60 tokens
    llm = LLM("default", spec=SpecConfig(method="mtp", num_draft_tokens=2, lookup_draft_tokens=16),
              max_model_len=90)
    plain = LLM("default", max_model_len=90)
    for params in (SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True),
                   SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)):
        outs = llm.generate(ps, params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in plain.generate(ps, params)]
        assert all(o.finish_reason == "length" for o in outs)
    assert _lookup_steps(llm) > 0


def test_a_draft_model_keeps_its_cache_right_across_lookup_steps(llama_dir, plain_greedy, monkeypatch):
    """The target drafting for itself proposes exactly its own greedy continuation - as long
    as the draft's KV cache holds the right entries, which a lookup step (the draft model
    ran no chain over those tokens) must not leave stale."""
    chains = []
    original = chain_drafter.ChainDrafter._chains

    def recording(self, seqs, ks):
        drafts = original(self, seqs, ks)
        chains.extend((list(s.all_ids), d.token_ids) for s, d in zip(seqs, drafts))
        return drafts
    monkeypatch.setattr(chain_drafter.ChainDrafter, "_chains", recording)
    ps = repetitive_prompts(6, seed=12)
    llm = LLM(llama_dir, spec=SpecConfig(method="draft_target", draft=llama_dir, num_draft_tokens=3,
                                         lookup_draft_tokens=5))
    outs = llm.generate(ps, GREEDY)
    full = [p + o for p, o in zip(ps, plain_greedy(ps, GREEDY))]
    assert [o.token_ids for o in outs] == [f[len(p):] for f, p in zip(full, ps)]
    assert _lookup_steps(llm) > 0 and chains
    for ids, draft in chains:
        seq = next(f for f in full if f[:len(ids)] == ids)
        assert draft == seq[len(ids):len(ids) + len(draft)]


@pytest.mark.parametrize("draft_sampling", [True, False])
def test_sampled_output_follows_the_target_distribution(llama_dir, heads, draft_sampling):
    """The second token is the first one verified; for it to come from a lookup draft
    whatever the first token was, the prompt holds most tokens of the vocabulary (all that
    the context leaves room for) and the lookup matches single tokens (the engine's lookups
    need 3; the verification is the same)."""
    prompt = tuple(range(VOCAB - 50))
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=2,
                                         lookup_draft_tokens=4), max_num_seqs=256, draft_sampling=draft_sampling)
    found = []

    class Counted(LookupDrafts):
        def draft(self, seq, k):
            tokens = super().draft(seq, k)
            found.append(bool(tokens))
            return tokens
    llm.engine.proposer.lookups = Counted(4, 1)
    check_sampled_law(llm, llama_dir, 0.3, 0, 1.0, prompt=prompt)
    assert sum(found) > 500   # of 1000 requests, each verifying its second token


@pytest.mark.parametrize("bad", [-1, 17, 2.0, True, "4"])
def test_bad_lookup_lengths_are_refused(bad):
    with pytest.raises(ValueError, match="lookup_draft_tokens must be an integer in"):
        SpecConfig(method="mtp", lookup_draft_tokens=bad)


@pytest.mark.parametrize("method", ["ngram", "eagle_tree", "none"])
def test_lookup_drafts_need_a_chain_drafter(method):
    with pytest.raises(ValueError, match="takes method 'mtp' or 'draft_target'"):
        SpecConfig(method=method, lookup_draft_tokens=4)
