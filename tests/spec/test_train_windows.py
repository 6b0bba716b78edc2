"""Training windows packed from whole documents: the layout, the feature pass running each
segment as its own sequence, and the unrolled head attending within a segment only."""
import json

import numpy as np
import pytest
import torch

from helpers.mtp_fixtures import random_head
from sonarspec_ext.models.loader import load_model
from sonarspec_ext.train.data import read_corpus
from sonarspec_ext.train.features import FeatureSet, compute_features
from sonarspec_ext.train.mtp_train import head_loss, unrolled_features
from sonarspec_ext.train.unroll import WindowLayout, valid_rows
from sonarspec_ext.train.windows import PackedWindows, pack_documents, segment_prompts

QUIET = dict(log=lambda *_: None)


def _doc(n, start, num_prompt=0):
    return np.arange(start, start + n, dtype=np.int32), num_prompt


def test_packing_small_case():
    # lengths 6, 3, 2, 9 (split 8 + 1: the 1-token tail holds no pair), 1 (dropped); windows of 8
    docs = [_doc(6, 10, num_prompt=2), _doc(3, 20), _doc(2, 30), _doc(9, 40), _doc(1, 50)]
    w = pack_documents(docs, 8)
    assert len(w) == 3
    # prompts: a segment's tokens up to its first drafted prediction (a prompt), else its first 32
    got = segment_prompts(w.tokens, w.segments, w.drafted, 10)
    assert sorted(got) == [[10, 11], list(range(20, 23)), list(range(30, 32)), list(range(40, 48))]
    rows = {tuple(r[s >= 0].tolist()) for r, s in zip(w.tokens, w.segments)}
    # best fit, longest first: [8], [6 + 2], [3]
    assert rows == {tuple(range(40, 48)), tuple(range(10, 16)) + (30, 31), (20, 21, 22)}
    i = [tuple(r[:2]) for r in w.tokens.tolist()].index((10, 11))
    assert w.segments[i].tolist() == [0] * 6 + [1] * 2
    assert w.positions[i].tolist() == [0, 1, 2, 3, 4, 5, 0, 1]
    # the prediction after the last prompt token (index 1) is the first drafted one
    assert w.drafted[i].tolist() == [False] + [True] * 7
    assert w.segment_spans(i) == [(0, 6), (6, 8)]
    assert len(pack_documents(docs, 8, limit=2)) == 2
    with pytest.raises(ValueError, match="no document of two or more tokens"):
        pack_documents([_doc(1, 0)], 8)


def test_a_chat_record_marks_its_prompt(tmp_path):
    f = tmp_path / "c.jsonl"
    recs = [{"text": "<s>user: hi\nbot: hello there<e>", "reply": "hello there", "split": "train"},
            {"text": "plain text", "split": "train"}, {"text": "held out", "split": "val"}]
    f.write_text("\n".join(json.dumps(r) for r in recs))
    train, val = read_corpus([str(f)])
    assert train[0].text[:train[0].prompt_chars] == "<s>user: hi\nbot: " and not train[0].end_token
    assert train[1].prompt_chars == 0 and train[1].end_token and val[0].text == "held out"


def _packed(target_dir):
    g = torch.Generator().manual_seed(3)
    docs = [(torch.randint(0, 256, (n,), generator=g).numpy().astype(np.int32), p)
            for n, p in ((11, 4), (7, 0), (5, 2), (14, 3), (9, 0))]
    return docs, pack_documents(docs, 16)


def test_features_run_each_segment_as_its_own_sequence(llama_dir, tmp_path):
    """Oracle: each document's features from a pass over that document alone."""
    docs, w = _packed(llama_dir)
    target = load_model(llama_dir)
    compute_features(target, w, str(tmp_path / "f"), "fp", "tok", "float32", batch_windows=2, **QUIET)
    fs = FeatureSet(str(tmp_path / "f"))
    assert torch.equal(fs.tokens, torch.from_numpy(w.tokens).long())
    lay = fs.layout(torch.arange(len(fs)))
    assert torch.equal(lay.segments, torch.from_numpy(w.segments).long())
    checked = 0
    for ids, _ in docs:
        compute_features(target, ids[None], str(tmp_path / f"d{checked}"), "fp", "tok", "float32", **QUIET)
        alone = FeatureSet(str(tmp_path / f"d{checked}")).hidden[0]
        for i in range(len(w)):
            for s, e in w.segment_spans(i):
                if np.array_equal(w.tokens[i, s:e], ids):
                    torch.testing.assert_close(fs.hidden[i, s:e], alone, rtol=1e-5, atol=1e-5)
                    checked += 1
                    break
        assert (fs.hidden[lay.segments < 0] == 0).all()
    assert checked == len(docs)


def test_unrolled_head_attends_within_its_segment(llama_dir):
    """Oracle: the unrolled pass over each segment alone (one segment per window); rows of
    other segments, padding and prompts are left out of the loss."""
    docs, w = _packed(llama_dir)
    head = random_head(llama_dir)
    H = head.config.hidden_size
    tokens = torch.from_numpy(w.tokens).long()
    hidden = torch.randn(*tokens.shape, H, generator=torch.Generator().manual_seed(5))
    lay = WindowLayout(torch.from_numpy(w.positions).long(), torch.from_numpy(w.segments).long(),
                       torch.from_numpy(w.drafted))
    with torch.no_grad():
        outs = unrolled_features(head, tokens, hidden, 3, layout=lay)
        for i in range(len(w)):
            for s, e in w.segment_spans(i):
                alone = unrolled_features(head, tokens[i:i + 1, s:e], hidden[i:i + 1, s:e], 3)
                for k in range(3):
                    rows = valid_rows(k + 1, WindowLayout.uniform(1, e - s))[0]
                    torch.testing.assert_close(outs[k][i, s:e - 1][rows], alone[k][0][rows], rtol=1e-4, atol=1e-4)
    ok = valid_rows(2, lay)
    for i in range(len(w)):
        for r in range(tokens.shape[1] - 1):
            seg, nxt = w.segments[i, r], w.segments[i, r + 1]
            expect = seg >= 0 and nxt == seg and w.positions[i, r] >= 1 and w.drafted[i, r + 1]
            assert bool(ok[i, r]) == bool(expect)
    head.bind(load_model(llama_dir))
    loss, parts = head_loss(head, tokens, hidden, 2, 1.0, layout=lay)
    assert torch.isfinite(loss) and all(np.isfinite(p).all() for p in parts)


def test_token_arrays_pack_as_one_segment_each():
    w = PackedWindows.uniform(np.arange(12).reshape(2, 6))
    assert w.segment_spans(1) == [(0, 6)] and w.drafted.all() and w.positions[1].tolist() == list(range(6))


def test_dense_attention_within_segments():
    """Oracle: plain causal attention over each segment alone."""
    from sonarspec_ext.layers.attention import DenseCausalAttention
    g = torch.Generator().manual_seed(1)
    seg = torch.tensor([[0, 0, 0, 1, 1, -1], [0, 0, 0, 0, 0, 0]])
    q, k, v = (torch.randn(12, h, 8, generator=g) for h in (4, 2, 2))
    out = DenseCausalAttention(2, 6, seg).attend(0, q, k, v).view(2, 6, -1)
    for b, spans in ((0, [(0, 3), (3, 5)]), (1, [(0, 6)])):
        for s, e in spans:
            rows = slice(b * 6 + s, b * 6 + e)
            alone = DenseCausalAttention(1, e - s).attend(0, q[rows], k[rows], v[rows])
            torch.testing.assert_close(out[b, s:e], alone, rtol=1e-5, atol=1e-5)
