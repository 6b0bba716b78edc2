"""Drafting with the native stack (``ops.stack_drafting``): drafter forwards over rows of
tokens and greedy chains in one call each, against the per-op Python path - every
proposed chain and every output the same, step after step, for MTP heads (both layouts),
draft models (also with a sliding window and a padded vocabulary) and the packaged models
at batch 4; row forwards equal bit for bit."""
import pytest
import torch

import sonarspec_ext.spec.chains as chains_mod
from helpers.drafting import PROMPTS, record_drafts
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.models.llama import vocab_logits
from sonarspec_ext.ops.stack_drafting import chain, rows_forward
from sonarspec_ext.spec.chains import native_chains

@pytest.mark.parametrize("which,k", [("random", 3), ("random_eagle1", 4), ("trained", 2)])
def test_mtp_chains_equal_round_by_round(llama_dir, heads, which, k, monkeypatch):
    spec = SpecConfig(method="mtp", draft=heads[which], num_draft_tokens=k)
    a, out_a, used = record_drafts(llama_dir, spec, PROMPTS, True, monkeypatch)
    b, out_b, _ = record_drafts(llama_dir, spec, PROMPTS, False, monkeypatch)
    assert any(used), "the native chain never ran"
    assert a == b and out_a == out_b


def test_mtp_chains_over_a_draft_vocabulary_equal_round_by_round(llama_dir, heads, tmp_path, monkeypatch):
    """A head proposing from a draft vocabulary: the native chain embeds the token of each
    picked lm_head row, as the rounds one by one do."""
    from helpers.mtp_fixtures import save
    from sonarspec_ext.models.loader import load_model
    from sonarspec_ext.models.mtp_loader import load_mtp_head
    head = load_mtp_head(heads["trained"], load_model(llama_dir))
    head.set_draft_vocab(torch.arange(0, 256, 2))
    spec = SpecConfig(method="mtp", draft=save(head, str(tmp_path / "vocab")), num_draft_tokens=3)
    a, out_a, used = record_drafts(llama_dir, spec, PROMPTS, True, monkeypatch)
    b, out_b, _ = record_drafts(llama_dir, spec, PROMPTS, False, monkeypatch)
    assert any(used), "the native chain never ran"
    assert a == b and out_a == out_b


@pytest.mark.parametrize("fixture", ["draft_dir", "padded_draft_dir", "mistral_dir"])
def test_draft_model_chains_equal_round_by_round(llama_dir, mistral_dir, request, fixture, monkeypatch):
    target = mistral_dir if fixture == "mistral_dir" else llama_dir
    spec = SpecConfig(method="draft_target", draft=request.getfixturevalue(fixture), num_draft_tokens=4)
    a, out_a, used = record_drafts(target, spec, PROMPTS, True, monkeypatch)
    b, out_b, _ = record_drafts(target, spec, PROMPTS, False, monkeypatch)
    assert any(used), "the native chain never ran"
    assert a == b and out_a == out_b


@pytest.mark.parametrize("method,k", [("mtp", 3), ("draft_target", 4)])
def test_sampled_drafts_equal_round_by_round(method, k, monkeypatch):
    """Drafts drawn from the drafter's distribution (draft_sampling): the native calls - the
    drafter's refill with its chain (``refill_chain``), else the chain alone - draw the
    same tokens with the same distributions as the rounds one by one, for seeded sampled
    requests mixed with a greedy one, and the outputs agree."""
    spec = SpecConfig(method=method, num_draft_tokens=k)
    prompts = ["def parse_args(argv):", "import os\n", "class Stack:"]
    params = [SamplingParams(max_tokens=40, temperature=t, top_k=tk, top_p=tp, seed=s, ignore_eos=True)
              for t, tk, tp, s in ((0.8, 0, 0.95, 1), (1.0, 50, 1.0, 2), (0.0, 0, 1.0, 3))]
    runs, used = [], []

    def counting(*a, **kw):
        out = native_chains(*a, **kw)
        used.append(out is not None)
        return out
    for native in (True, False):
        monkeypatch.setattr(chains_mod, "native_chains", counting if native else (lambda *a, **kw: None))
        llm = LLM("default", spec=spec, draft_sampling=True)
        llm.engine.proposer.device_chain = native
        fused = llm.engine.proposer.runner.refill_chain
        if native:
            def fused_counting(*a, fused=fused, **kw):
                out = fused(*a, **kw)
                used.append(out is not None and kw.get("sampling") is not None)
                return out
            llm.engine.proposer.runner.refill_chain = fused_counting
        else:   # the rounds one by one, the waiting refills run first
            llm.engine.proposer._refill_chains = lambda seqs, ks: None
        seen, real = [], llm.engine.proposer.propose

        def recording(seqs, ks, real=real, seen=seen):
            out = real(seqs, ks)
            seen.append([(d.token_ids, d.probs) for d in out])
            return out
        llm.engine.proposer.propose = recording
        outs = [o.token_ids for o in llm.generate(prompts, params)]
        runs.append((seen, outs))
    (a, out_a), (b, out_b) = runs
    assert sum(used) >= 5, "the native chain never ran"
    assert out_a == out_b and len(a) == len(b)
    for step_a, step_b in zip(a, b):
        assert [t for t, _ in step_a] == [t for t, _ in step_b]
        for (_, pa), (_, pb) in zip(step_a, step_b):
            assert (pa is None and pb is None) or torch.equal(pa, pb)
    assert any(pa is None for step in a for _, pa in step) and any(pa is not None for step in a for _, pa in step)


@pytest.mark.parametrize("method", ["mtp", "draft_target"])
def test_draft_sampling_keeps_greedy_requests_on_the_fused_refill_and_chain(method):
    """Draft sampling (the default) changes nothing for greedy requests: their steps still
    run the drafter's waiting re-run and its chain of top tokens as one native call
    (``refill_chain``), as often and with the same drafts and outputs as an engine that
    never samples drafts; a sampled request's steps draw their drafts (with their
    distributions) in that call."""
    spec = SpecConfig(method=method, num_draft_tokens=3)
    prompts = ["def parse_args(argv):", "class Stack:"]
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    runs = {}
    for sampling in (True, False):
        llm = LLM("default", spec=spec, draft_sampling=sampling)
        fused, real = [], llm.engine.proposer.runner.refill_chain
        seen, propose = [], llm.engine.proposer.propose

        def counting(*a, real=real, fused=fused, **kw):
            fused.append(kw.get("sampling") is not None)
            return real(*a, **kw)

        def recording(seqs, ks, propose=propose, seen=seen):
            out = propose(seqs, ks)
            seen.append([(d.token_ids, d.probs is None) for d in out])
            return out
        llm.engine.proposer.runner.refill_chain = counting
        llm.engine.proposer.propose = recording
        outs = [o.token_ids for o in llm.generate(prompts, greedy)]
        runs[sampling] = (outs, list(seen), list(fused))
        if sampling:   # one sampled request: its steps draw drafts (with their distributions), fused too
            n = len(fused)
            llm.generate(prompts[:1], SamplingParams(max_tokens=20, temperature=0.8, seed=5, ignore_eos=True))
            assert sum(fused[n:]) > 2 and any(not point for step in seen for _, point in step)
    assert runs[True][0] == runs[False][0] and runs[True][1] == runs[False][1]
    assert runs[True][2] == runs[False][2] and len(runs[True][2]) > 5 and not any(runs[True][2])


@pytest.mark.parametrize("method,k", [("mtp", 3), ("draft_target", 4)])
def test_packaged_models_batch_4(method, k, monkeypatch):
    spec = SpecConfig(method=method, num_draft_tokens=k)
    prompts = ["def parse_args(argv):", "import os\n", "class Stack:", "for i in range(10):"]
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    a, out_a, used = record_drafts("default", spec, prompts, True, monkeypatch, params)
    b, out_b, _ = record_drafts("default", spec, prompts, False, monkeypatch, params)
    assert sum(used) >= 8
    assert a == b and out_a == out_b


@pytest.mark.parametrize("method,k", [("mtp", 3), ("draft_target", 4)])
def test_penalized_requests_draft_alike_natively_and_round_by_round(method, k, monkeypatch):
    """Requests with penalties and a logit bias: the drafter applies them to its logits
    (from the tokens before the step) in the native calls as in the rounds one by one -
    the same drafts and outputs - and never drafts the token a -100 bias bans, though
    without the bias it is the one drafted most."""
    from collections import Counter
    spec = SpecConfig(method=method, num_draft_tokens=k)
    prompts = ["def parse_args(argv):", "import os\n", "class Stack:", "for i in range(10):"]
    free, _, _ = record_drafts("default", spec, prompts, True, monkeypatch,
                               SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))
    banned, n = Counter(t for step in free for chain in step for t in chain).most_common(1)[0]
    assert n >= 10
    cases = [(dict(repetition_penalty=1.3), {}), (dict(presence_penalty=1.0, frequency_penalty=0.5), {}), ({}, {}),
             (dict(repetition_penalty=0.9), {13: 2.0})]
    params = [SamplingParams(max_tokens=48, temperature=0, ignore_eos=True, logit_bias={banned: -100.0, **bias},
                             **extra) for extra, bias in cases]
    a, out_a, used = record_drafts("default", spec, prompts, True, monkeypatch, params)
    b, out_b, _ = record_drafts("default", spec, prompts, False, monkeypatch, params)
    assert sum(used) >= 8
    assert a == b and out_a == out_b
    assert not any(banned in chain for step in a for chain in step)
    assert not any(banned in out for out in out_a)


def _drafter_rows(method: str, seed: int):
    """The packaged drafter's runner, three rows (start, tokens, page table) of 5, 1 and 3
    tokens, and target features for an MTP head."""
    runner = LLM("default", spec=SpecConfig(method=method, num_draft_tokens=4)).engine.proposer.runner
    g = torch.Generator().manual_seed(seed)
    rows = [(0, torch.randint(0, 8000, (5,), generator=g).tolist(), [3, 1]),
            (7, torch.randint(0, 8000, (1,), generator=g).tolist(), [0]),
            (12, torch.randint(0, 8000, (3,), generator=g).tolist(), [2, 4])]
    return runner, rows, (torch.randn(9, 256, generator=g) if method == "mtp" else None)


@pytest.mark.parametrize("method", ["mtp", "draft_target"])
def test_row_forwards_equal_the_per_op_path(method):
    """A drafter's forward over rows of several tokens (refills), native and op by op on the
    same cache: the same logits and outputs, bit for bit."""
    runner, rows, feats = _drafter_rows(method, seed=0)
    native = runner._native_rows(rows, None, feats)
    assert native is not None
    runner._native_rows = lambda *a, **k: None
    per_op = runner.forward_rows(rows, None, features=feats)
    if feats is None:
        per_op = (per_op, None)
    assert torch.equal(native[0], per_op[0])
    if feats is not None:
        assert torch.equal(native[1], per_op[1])


def test_greedy_chain_rejects_bad_input():
    llm = LLM("default", spec=SpecConfig(method="draft_target", num_draft_tokens=3))
    runner = llm.engine.proposer.runner
    stack, model = runner.stack(), llm.engine.proposer.model
    embed, lm_head = model.model.embed_tokens.weight, model.lm_head.weight
    table = torch.arange(4).view(1, 4)
    one = torch.tensor([1])
    with pytest.raises(ValueError, match="outside the block table"):
        chain(stack, embed, lm_head, 100, one, torch.tensor([63]), table, 16, 0, 2)
    # page ids outside the pools: the token's own page, or a page of keys it reads, refused
    # (before, the stack left such rows without attention and drafting returned their logits)
    for page_id in (-1, 1 << 62):
        with pytest.raises(ValueError, match="is not one of the KV pools"):
            rows_forward(stack, embed, lm_head, one, torch.tensor([3]), torch.tensor([1]),
                         torch.tensor([[page_id, 1]]), 16)
        with pytest.raises(ValueError, match="read keys outside the KV pools"):
            chain(stack, embed, lm_head, 100, one, torch.tensor([20]), torch.tensor([[page_id, 1]]), 16, 0, 2)
    with pytest.raises(ValueError, match="page_size must be a positive integer, got 0"):
        chain(stack, embed, lm_head, 100, one, torch.tensor([3]), table, 0, 0, 2)
    with pytest.raises(ValueError, match="tokens must be"):
        chain(stack, embed, lm_head, 100, one.int(), torch.tensor([3]), table, 16, 0, 2)
    with pytest.raises(ValueError, match="vocab"):
        chain(stack, embed, lm_head, lm_head.shape[0] + 1, one, torch.tensor([3]), table, 16, 0, 2)
    with pytest.raises(ValueError, match="features go with MTP heads"):
        chain(stack, embed, lm_head, 100, one, torch.tensor([3]), table, 16, 0, 2,
              features=torch.zeros(1, model.config.hidden_size))
    with pytest.raises(ValueError, match="uniforms must be"):
        chain(stack, embed, lm_head, 100, one, torch.tensor([3]), table, 16, 0, 2,
              sampling=(torch.ones(1), torch.zeros(1, dtype=torch.long), torch.ones(1), torch.zeros(1, 3).double()))
    with pytest.raises(ValueError, match="rows of at least one token"):
        rows_forward(stack, embed, lm_head, one, torch.tensor([3]), torch.tensor([0]), table, 16)
    from sonarspec_ext.ops.stack_drafting import block_table
    padded = block_table([[2, 0], [1]])   # row 1 has one page: position 20 lies past it, on no page (not page 0)
    assert padded.tolist() == [[2, 0], [1, -1]]
    with pytest.raises(ValueError, match="is not one of the KV pools"):
        rows_forward(stack, embed, lm_head, torch.tensor([1, 2]), torch.tensor([3, 20]), torch.tensor([1, 1]),
                     padded, 16)
    with pytest.raises(ValueError, match="token 9000 out of range"):
        rows_forward(stack, embed, lm_head, torch.tensor([9000]), torch.tensor([3]), torch.tensor([1]), table, 16)
    with pytest.raises(ValueError, match="one per lm_head row"):
        chain(stack, embed, lm_head, 100, one, torch.tensor([3]), table, 16, 0, 2, row_ids=torch.arange(5))
    with pytest.raises(ValueError, match=r"row_ids must lie in \[0, "):
        chain(stack, embed, lm_head, 100, one, torch.tensor([3]), table, 16, 0, 2,
              row_ids=torch.full((lm_head.shape[0],), embed.shape[0]))
    # the native call checks the count it is given against the lm_head's rows itself
    from sonarspec_ext.ops.stack_drafting import _io
    ids = torch.arange(lm_head.shape[0])
    args, _ = _io(stack, embed, lm_head, table, 16, 0, 1, None, 1, ids)
    out, positions = torch.empty(1, 2, dtype=torch.int64), torch.tensor([3])
    with pytest.raises(ValueError, match="row_tokens needs one token per lm_head row"):
        stack._native.chain(args[:-1] + (5,), 100, one.data_ptr(), 0, positions.data_ptr(), 1, 2,
                            (0, 0, 0, 0, 0), out.data_ptr(), 1, (0, 0.0, 0), (0, 0))


def test_decode_rows_forward_is_rows_forward_token_by_token_with_its_top_tokens():
    """The engine's lean decode call: at every token, the same logits and outputs as the
    checked op run one token at a time over the same slots (a token's result does not depend
    on what else is in the call), its top tokens the logits' argmax; bad rows refused by the
    native checks with ValueError."""
    from sonarspec_ext.ops.stack_drafting import decode_rows_forward
    llm = LLM("default", spec=SpecConfig(method="draft_target", num_draft_tokens=3))
    runner = llm.engine.proposer.runner
    stack, model = runner.stack(), llm.engine.proposer.model
    embed, lm_head = model.model.embed_tokens.weight, model.lm_head.weight
    rows = [(5, [3, 9, 14], [2, 0]), (0, [7], [1])]
    got = decode_rows_forward(stack, embed, lm_head, rows, 16)
    t = 0
    for start, toks, table in rows:
        for i, tok in enumerate(toks):
            logits, out = rows_forward(stack, embed, lm_head, torch.tensor([tok]), torch.tensor([start + i]),
                                       torch.tensor([1]), torch.tensor([table]), 16)
            assert torch.equal(got[0][t], logits[0]) and torch.equal(got[1][t], out[0]), t
            t += 1
    assert got[2] == got[0].numpy().argmax(-1).tolist()
    for bad, match in [([(5, [3], [10 ** 6])], "is not one of the KV pools"), ([(5, [9000], [2])], "out of range"),
                       ([(40, [3], [2])], "outside the block table"), ([(5, [], [2])], "at least one token"),
                       ([(5, [2 ** 70], [2])], "past int64"), ([], "at least one token"),
                       ([(5, [3], [2, 0]), (20, [4], [1])], "is not one of the KV pools")]:   # past its table
        with pytest.raises(ValueError, match=match):
            decode_rows_forward(stack, embed, lm_head, bad, 16)
    with pytest.raises(ValueError, match="page_size"):
        decode_rows_forward(stack, embed, lm_head, rows, 0)


@pytest.mark.parametrize("method", ["mtp", "draft_target"])
def test_refill_chain_equals_rows_forward_then_top_token_then_chain(method):
    """A drafter's refill and next chain in one native call: bit for bit the row forward,
    torch's argmax of its logits, and the chain from there (an MTP head from the row
    forward's outputs)."""
    from sonarspec_ext.ops.stack_drafting import block_table
    runner, rows, feats = _drafter_rows(method, seed=1)
    logits, outputs, tokens, scores, probs = runner.refill_chain(rows, None, 8192, 3, features=feats)
    assert scores is None and probs is None
    ref_logits, ref_outputs = runner._native_rows(rows, None, feats)
    first = ref_logits.argmax(-1)
    positions = torch.tensor([start + len(toks) for start, toks, _ in rows])
    embed, lm_head, row_ids = runner.model.drafting_io()
    ref_chain, _ = chain(runner.stack(), embed, lm_head, 8192, first, positions,
                         block_table([t for *_, t in rows]), runner.kv_cache.page_size, None, 3,
                         ref_outputs if method == "mtp" else None, row_ids=row_ids)
    assert torch.equal(vocab_logits(logits, row_ids, runner.model.vocab_size), ref_logits)
    assert torch.equal(outputs, ref_outputs)
    assert torch.equal(tokens[:, 0], first) and torch.equal(tokens[:, 1:], ref_chain)


def test_sampled_refill_chain_takes_well_formed_sampling_only():
    """``ops.stack_drafting.refill_chain`` with sampling: uniforms of one per token drafted
    (1 + steps per row) and no scores (a sampled chain does not stop early); else ValueError
    naming what is wrong, before any native work."""
    from sonarspec_ext.ops.stack_drafting import refill_chain as native_refill_chain
    runner, rows, _ = _drafter_rows("draft_target", seed=3)
    stack, io, row_ids, table, ids, starts, lens = runner._native_inputs(rows)
    params = (torch.full((3,), 0.8), torch.zeros(3, dtype=torch.long), torch.ones(3))

    def run(uniforms, scores=None):
        return native_refill_chain(stack, *io, 8192, ids, starts, lens, table, runner.kv_cache.page_size, None, 3,
                                   None, row_ids, scores=scores, sampling=params + (uniforms,))
    _, _, tokens, probs = run(torch.rand(3, 4, dtype=torch.float64))
    assert tokens.shape == (3, 4) and probs.shape == (3, 4, 8192)
    assert torch.allclose(probs.sum(-1), torch.ones(3, 4), atol=1e-5)
    assert (probs.gather(2, tokens[:, :, None]) > 0).all()   # each token drawn where its distribution has mass
    with pytest.raises(ValueError, match="uniforms must be"):
        run(torch.rand(3, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="greedy chains"):
        run(torch.rand(3, 4, dtype=torch.float64), scores=torch.empty(3, 4))


def test_chain_scores_are_the_drafter_probabilities_and_stop_the_chain():
    """Greedy chains scored: each drafted token's softmax probability under the logits it was
    picked from (the refill's for the first, then each round's, recomputed by a row forward
    over the previous token); with stop_below the rounds end once every draft's product of
    scores falls below it (later tokens -1, scores 0), and without it the tokens are the
    unscored chain's."""
    from sonarspec_ext.ops.stack_drafting import refill_chain as native_refill_chain
    runner, rows, _ = _drafter_rows("draft_target", seed=2)
    stack, io, row_ids, table, ids, starts, lens = runner._native_inputs(rows)

    def run(scores=None, stop_below=0.0):
        return native_refill_chain(stack, *io, 8192, ids, starts, lens, table, runner.kv_cache.page_size, None, 3,
                                   None, row_ids, scores=scores, stop_below=stop_below)
    logits, _, tokens, _ = run()
    scores = torch.empty(3, 4)
    assert torch.equal(run(scores)[2], tokens)
    assert torch.allclose(scores[:, 0].double(), torch.softmax(logits.double(), -1).max(-1).values, rtol=1e-5)
    for j in range(1, 4):
        after = [(start + len(toks) + j - 1, [int(tokens[b, j - 1])], t) for b, (start, toks, t) in enumerate(rows)]
        round_logits, _ = runner._native_rows(after, None, None)
        expect = torch.softmax(round_logits.double(), -1).gather(1, tokens[:, j:j + 1]).squeeze(1)
        assert torch.allclose(scores[:, j].double(), expect, rtol=1e-5)
    first = scores[:, 0].clone()
    assert (first < 1).all()
    stopped = run(scores, stop_below=1.0)[2]   # every draft is already below 1: no round runs
    assert torch.equal(stopped[:, 0], tokens[:, 0]) and (stopped[:, 1:] == -1).all() and (scores[:, 1:] == 0).all()
    # the most likely first token keeps the rounds going, until its product falls below it
    stopped = run(scores, stop_below=float(first.max()))[2]
    assert torch.equal(stopped[:, :2], tokens[:, :2]) and (stopped[:, 2:] == -1).all()
    with pytest.raises(ValueError, match="stop_below must lie in"):
        run(scores, stop_below=1.5)
    with pytest.raises(ValueError, match="scores must be a contiguous float32"):
        run(torch.empty(3, 3))
