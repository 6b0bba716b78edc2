"""Paged prefill and decoding logits of a model, step by step, for parity checks."""
import torch

from sonarspec_ext import _C
from sonarspec_ext.runtime.kv_cache import KVCache
from sonarspec_ext.runtime.metadata import build_metadata
from sonarspec_ext.runtime.runner import ModelRunner


def paged_logits(model, prompts, continuations, page_size, num_pages=256, native=False):
    """Prefills every prompt in one batch, then decodes the continuation tokens one per
    step for the whole batch; returns per sequence the logits at every position."""
    cfg = model.config
    cache = KVCache(cfg, num_pages, page_size, torch.float32, "cpu")
    runner = ModelRunner(model, cache)
    pc = _C.PlannerConfig()
    pc.num_pages, pc.page_size, pc.max_num_seqs, pc.max_num_batched_tokens, pc.max_model_len = (
        num_pages, page_size, 16, 4096, 256)
    planner = _C.Planner(pc)
    seqs = [list(p) for p in prompts]
    for i, p in enumerate(prompts):
        planner.add_request(i, len(p))
    out = [[] for _ in prompts]
    for step in range(len(continuations[0]) + 1):
        scheduled, preempted, _ = planner.schedule(0)
        assert not preempted
        ids, rows, all_idx = [], [], []
        for sid, start, n in scheduled:
            ids.extend(seqs[sid][start:start + n])
            rows.append((start, n, planner.page_table(sid)))
            all_idx.append((sid, list(range(len(ids) - n, len(ids)))))
        meta, pos = build_metadata(rows, page_size, "cpu", cfg.sliding_window, native_attention=native)
        idx = torch.tensor([i for _, r in all_idx for i in r])
        logits = runner.forward(torch.tensor(ids), pos, meta, idx)
        k = 0
        for sid, r in all_idx:
            out[sid].append(logits[k:k + len(r)])
            k += len(r)
        if step < len(continuations[0]):
            for sid in range(len(prompts)):
                seqs[sid].append(continuations[sid][step])
                planner.append_tokens(sid, 1)
    return [torch.cat(o) for o in out]
