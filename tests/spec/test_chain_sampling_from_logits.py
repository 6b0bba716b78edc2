"""ops.chain_sampling_from_logits: the processed distributions and the chain rejection
sampling in one native call give exactly the tokens of the two ops it fuses (each tested
against torch and the exact law elsewhere), on awkward shapes and sampling parameters;
an exact one-hot case; bad input is a ValueError that names it."""
import json
import sys

import pytest
import torch

from helpers.tools import import_tool
from sonarspec_ext import ops
from sonarspec_ext.ops.sampling import processed_probs, processed_probs_reference


def _case(g, B, K, V, with_q):
    logits = torch.randn(B, K + 1, V, generator=g) * 3
    temperature = [float(torch.rand(1, generator=g)) * 1.5 + 0.05 for _ in range(B)]
    top_k = [int(torch.randint(0, 7, (1,), generator=g)) for _ in range(B)]
    top_p = [float(torch.rand(1, generator=g)) * 0.9 + 0.1 if b % 2 else 1.0 for b in range(B)]
    ids = torch.randint(0, V, (B, K), generator=g)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1) if with_q else None
    u = torch.rand(B, K + 1, dtype=torch.float64, generator=g)
    return logits, temperature, top_k, top_p, ids, q, u


@pytest.mark.parametrize("with_q", [False, True])
def test_equals_processed_probs_then_chain_sampling(with_q):
    g = torch.Generator().manual_seed(7 + with_q)
    for trial in range(120):
        B, K = int(torch.randint(1, 6, (1,), generator=g)), int(torch.randint(0, 5, (1,), generator=g))
        V = [1, 2, 31, 257, 4099][trial % 5]
        logits, t, k, p, ids, q, u = _case(g, B, K, V, with_q and K > 0)
        out, emitted = ops.chain_sampling_from_logits(logits, t, k, p, ids.tolist(), q, u.view(-1).tolist())
        probs = torch.stack([processed_probs(logits[b], t[b], k[b], p[b]) for b in range(B)])
        ref, _, ref_emitted = ops.chain_speculative_sampling(q, ids, probs, uniforms=u)
        assert out == ref.tolist() and emitted == ref_emitted.tolist(), (trial, B, K, V)


def test_large_vocabulary_batch_matches_torch_distributions():
    """A SmolLM2-sized vocabulary through the threaded path, against distributions from
    torch's softmax (``processed_probs_reference``): the same tokens wherever no uniform
    falls within float rounding of a boundary - here every one of them."""
    g = torch.Generator().manual_seed(3)
    logits, t, k, p, ids, q, u = _case(g, 6, 3, 49152, True)
    out, emitted = ops.chain_sampling_from_logits(logits, t, k, p, ids.tolist(), q, u.view(-1).tolist())
    probs = torch.stack([processed_probs_reference(logits[b], t[b], k[b], p[b]) for b in range(6)])
    ref, _, ref_emitted = ops.chain_speculative_sampling(q, ids, probs, uniforms=u)
    assert out == ref.tolist() and emitted == ref_emitted.tolist()


def test_one_hot_case():
    """Logits far apart make each processed row a point mass: drafts equal to those tokens
    are accepted and the bonus is the last row's token; a wrong draft is replaced."""
    V = 6
    logits = torch.full((1, 3, V), -1e4)
    for r, tok in enumerate([2, 5, 1]):
        logits[0, r, tok] = 0.0
    out, emitted = ops.chain_sampling_from_logits(logits, [1.0], [0], [1.0], [[2, 5]], None, [0.5, 0.5, 0.5])
    assert out == [[2, 5, 1]] and emitted == [2]
    out, emitted = ops.chain_sampling_from_logits(logits, [1.0], [0], [1.0], [[2, 4]], None, [0.5, 0.5, 0.5])
    assert out == [[2, 5, -1]] and emitted == [1]


def test_rejects_bad_input():
    logits = torch.randn(2, 3, 11)
    ok = dict(temperature=[1.0, 0.7], top_k=[0, 3], top_p=[1.0, 0.9], draft_token_ids=[[1, 2], [3, 4]],
              draft_probs=None, uniforms=[0.5] * 6)

    def call(**kw):
        args = {**ok, **kw}
        return ops.chain_sampling_from_logits(kw.pop("logits", logits), args["temperature"], args["top_k"],
                                              args["top_p"], args["draft_token_ids"], args["draft_probs"],
                                              args["uniforms"])
    call()
    for bad, match in [(dict(temperature=[1.0, 0.0]), "invalid sampling parameters"),
                       (dict(temperature=[float("nan"), 1.0]), "invalid sampling parameters"),
                       (dict(top_p=[1.0, 1.5]), "invalid sampling parameters"),
                       (dict(top_k=[-1, 0]), "invalid sampling parameters"),
                       (dict(draft_token_ids=[[1, 11], [3, 4]]), "draft id 11 outside"),
                       (dict(draft_token_ids=[[1, -1], [3, 4]]), "draft id -1 outside"),
                       (dict(draft_token_ids=[[1], [3, 4]]), "must hold 2 lists of 2 ids"),
                       (dict(temperature=[1.0]), "expected batch sampling parameters"),
                       (dict(uniforms=[0.5] * 5), "expected batch sampling parameters"),
                       (dict(draft_probs=torch.rand(2, 3, 11)), "draft_probs has shape"),
                       (dict(logits=logits.double()), "logits has dtype"),
                       (dict(logits=logits[0]), "logits must have 3 dimensions")]:
        with pytest.raises(ValueError, match=match):
            call(**bad)


def test_bench_tool_times_both_routes_with_equal_outputs(tmp_path, monkeypatch):
    """``tools/bench_sampled_verification.py`` on the packaged models: the engine's sampled
    outputs through the native call and through the distributions tensor are equal (the
    tool exits where they differ), a row per scheme and batch size."""
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["bench_sampled_verification", "--model", "default", "--rounds", "2",
                                      "--max-tokens", "8", "--mtp-ks", "2", "--batch-sizes", "1", "3",
                                      "--json", str(out)])
    import_tool("bench_sampled_verification").main()
    rows = json.loads(out.read_text())["rows"]
    assert [(r["scheme"], r["batch_size"]) for r in rows] == [("plain", 1), ("plain", 3), ("mtp K=2", 1),
                                                              ("mtp K=2", 3)]
    assert all(r["native_tok_s"] > 0 and r["probs_tensor_tok_s"] > 0 and len(r["native_rounds"]) == 2 for r in rows)
