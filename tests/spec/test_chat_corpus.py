"""tools/make_chat_corpus.py: replies from the engine, resumable after a torn write, the
held-out split by prompt."""
import json
import os
import sys

import pytest

pytest.importorskip("gguf")


def test_corpus_resumes_and_splits_by_prompt(tmp_path, monkeypatch):
    from helpers.models import make_hf_model
    from helpers.gguf_fixtures import write_gguf
    from helpers.models import CHATML
    from helpers.tools import import_tool
    mcc = import_tool("make_chat_corpus")
    hf = str(tmp_path / "hf")
    make_hf_model(hf, "llama", seed=9)
    model = write_gguf(hf, str(tmp_path / "chat.gguf"), chat_template=CHATML)
    prompts = [{"id": f"{i:016x}", "source": "test", "prompt": f"question {i}"} for i in range(6)]
    monkeypatch.setattr(mcc, "build_prompts", lambda seed, limit: prompts[:limit] if limit else prompts)
    out = tmp_path / "corpus"
    argv = ["make_chat_corpus.py", "--out", str(out), "--model", model, "--max-tokens", "5", "--batch-size", "2"]
    monkeypatch.setattr(sys, "argv", argv + ["--limit", "3"])
    mcc.main()
    path = out / "corpus.jsonl"
    assert len(path.read_text().splitlines()) == 6            # 3 prompts x (greedy, sampled)
    with open(path, "a") as fh:                               # a write torn by an interruption
        fh.write('{"id": "00000000000000')
    monkeypatch.setattr(sys, "argv", argv)
    mcc.main()
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted((r["id"], r["mode"]) for r in recs) == sorted((p["id"], m) for p in prompts
                                                                for m in ("greedy", "sampled"))
    split = {}
    for r in recs:
        assert split.setdefault(r["id"], r["split"]) == r["split"]   # both modes of a prompt in one split
        assert r["text"].startswith("<|im_start|>user\n" + r["messages"][0]["content"])
        assert r["text"].endswith(r["reply"]) or r["finish_reason"] == "stop"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["total_replies"] == 12


def test_the_corpus_kept_in_the_repository_reads_for_training(tmp_path):
    """data/smollm2_chat_corpus.jsonl.xz: whole JSON lines, every prompt answered greedily and
    sampled, the split the prompt id gives, and train-mtp's reader takes it as it is."""
    import lzma
    from sonarspec_ext.train.data import is_validation, read_corpus
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data", "smollm2_chat_corpus.jsonl.xz")
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(lzma.decompress(open(src, "rb").read()))
    modes = {}
    with open(path) as fh:
        for line in fh:
            rec = json.loads(line)
            assert rec["split"] == ("val" if is_validation(rec["id"]) else "train")
            assert rec["reply"] in rec["text"] and rec["messages"][-1]["content"] in rec["text"]
            modes.setdefault(rec["id"], set()).add(rec["mode"])
    assert len(modes) > 5000 and all(m == {"greedy", "sampled"} for m in modes.values())
    train, val = read_corpus([str(path)])
    assert len(train) + len(val) == 2 * len(modes) and 0.03 < len(val) / (len(train) + len(val)) < 0.07
