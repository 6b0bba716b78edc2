#!/usr/bin/env python
"""Where an MTP head's drafts fall short, on held-out chat replies: each prompt of the
validation split of ``tools/chat_prompts.py`` is answered greedily by the engine with the
head drafting chains of 2 tokens (its acceptance per draft position, as ``LLM.stats``
reports it); then the head reads the same reply teacher-forced, on features computed as the
training feature pass computes them (``train.features.prefill_hidden``: a prefill, float32
KV), and gives, over the reply's tokens:

- the share whose first draft (from the target's state at i and token i + 1, predicting
  i + 2) is the reply's token - top-1, and within its top 2 and 4 (what a tree of that
  width at the first position could accept);
- the share where the first and the second draft of a chain (the head's own output fed
  back, as the engine chains it) are both right;
- the share of reply tokens inside the head's draft vocabulary (the ceiling of any draft);
- the engine's K = 2 chains replayed on these predictions, step by step: acceptance per
  draft position as the engine counts it (per step, not per token: a step in a region the
  head predicts badly advances fewer tokens, so such regions hold more steps).

The replay close to the engine's own acceptance says the training features match what the
engine serves; top-2/4 and the vocabulary share say what wider trees or a larger draft
vocabulary could add.

    python tools/head_agreement.py [--model smollm2] [--head default|DIR] [--prompts 40]
                                   [--max-tokens 128] [--json PATH]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chat_prompts import build_prompts  # noqa: E402
from sonarspec_ext import LLM, SamplingParams, SpecConfig  # noqa: E402
from sonarspec_ext.bench import cpu_info, write_json  # noqa: E402
from sonarspec_ext.runtime.kv_cache import KVCache  # noqa: E402
from sonarspec_ext.runtime.runner import ModelRunner  # noqa: E402
from sonarspec_ext.train.data import is_validation  # noqa: E402
from sonarspec_ext.train.features import prefill_hidden  # noqa: E402
from sonarspec_ext.train.mtp_train import unrolled_features  # noqa: E402

TOPS = (1, 2, 4)


def teacher_forced(target, head, seq, page_size: int = 16) -> dict:
    """Counts over the reply tokens of ``seq`` (prompt + reply; the prompt's length in
    ``seq["prompt"]``) for one sequence."""
    ids, P = seq["ids"], seq["prompt"]
    T = len(ids)
    kv = KVCache(target.config, -(-T // page_size), page_size, torch.float32, torch.device("cpu"))
    with torch.inference_mode():
        hidden = prefill_hidden(ModelRunner(target, kv), np.asarray([ids]), [[(0, T)]], page_size)
        tokens = torch.tensor([ids])
        step1, step2 = unrolled_features(head, tokens, hidden.float(), 2)
        top1 = head.compute_logits(step1[0]).topk(max(TOPS), dim=-1).indices   # row i predicts ids[i + 2]
        chained = head.compute_logits(step2[0]).argmax(-1)                      # second draft at row i
    rows = range(P - 1, T - 2)
    want = torch.tensor([ids[i + 2] for i in rows])
    top = top1[P - 1:T - 2]
    counts = {f"top{k}": int((top[:, :k] == want[:, None]).any(-1).sum()) for k in TOPS}
    first_ok = top[:, 0] == want
    # the chain's second draft at row i follows a right first draft at row i - 1
    pairs = [(first_ok[j - 1], chained[i] == ids[i + 2]) for j, i in enumerate(rows) if j > 0]
    counts["chain2"] = int(sum(bool(a and b) for a, b in pairs))
    counts["chain2_rows"] = len(pairs)
    vocab = head.draft_vocab
    counts["in_vocab"] = len(rows) if vocab is None else int(torch.isin(want, vocab.cpu()).sum())
    counts["rows"] = len(rows)
    # the engine's chains of 2 replayed on these predictions: a step drafts from the last
    # committed position i (as many as the token budget leaves room for beside the target's
    # own), commits its accepted drafts and the target's next token
    i, drafted, accepted = P - 1, [0, 0], [0, 0]
    while (room := min(2, T - i - 3)) >= 1:
        ok = [bool(first_ok[i - (P - 1)])]
        if room == 2:
            ok.append(ok[0] and int(chained[i + 1]) == ids[i + 3])
        for k, good in enumerate(ok):
            drafted[k] += 1
            accepted[k] += int(good)
        i += 1 + sum(ok)
    counts.update(drafted1=drafted[0], drafted2=drafted[1], accepted1=accepted[0], accepted2=accepted[1])
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--head", default="default", help="the MTP head: 'default' (the model's packaged one) or a dir")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    items = [p for p in build_prompts() if is_validation(p["id"])][:args.prompts]
    llm = LLM(args.model, spec=SpecConfig(method="mtp", draft=args.head, num_draft_tokens=2),
              adaptive_speculation=False, enable_prefix_caching=False)
    engine = llm.engine
    head = engine.proposer.head
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    totals: dict = {}
    for item in items:
        out = llm.chat([[{"role": "user", "content": item["prompt"]}]], params)[0]
        seq = {"ids": list(out.prompt_token_ids) + list(out.token_ids), "prompt": len(out.prompt_token_ids)}
        for key, n in teacher_forced(engine.model, head, seq).items():
            totals[key] = totals.get(key, 0) + n
    rows = totals["rows"]
    stats = llm.stats()
    result = {
        "model": args.model, "head": args.head, "prompts": len(items), "max_tokens": args.max_tokens,
        "reply_tokens": rows, "cpu": cpu_info(),
        "engine_accepted_per_position": stats["accepted_per_position"][:2],
        "replayed_accepted_per_position": [totals["accepted1"] / totals["drafted1"],
                                           totals["accepted2"] / max(1, totals["drafted2"])],
        "teacher_forced": {**{f"first_draft_top{k}": totals[f"top{k}"] / rows for k in TOPS},
                           "first_and_second_draft": totals["chain2"] / max(1, totals["chain2_rows"]),
                           "reply_tokens_in_draft_vocab": totals["in_vocab"] / rows},
    }
    tf = result["teacher_forced"]
    print(f"{len(items)} held-out chat prompts, {rows} reply tokens")
    per_position = lambda key: " / ".join(f"{a:.3f}" for a in result[key])  # noqa: E731
    print("engine, accepted per draft position: " + per_position("engine_accepted_per_position"))
    print("replayed on training features, per draft position: " + per_position("replayed_accepted_per_position"))
    print(f"teacher-forced, training features: first draft {tf['first_draft_top1']:.3f} (top 2 "
          f"{tf['first_draft_top2']:.3f}, top 4 {tf['first_draft_top4']:.3f}), first and second "
          f"{tf['first_and_second_draft']:.3f}; reply tokens in the draft vocabulary "
          f"{tf['reply_tokens_in_draft_vocab']:.3f}")
    if args.json:
        write_json(result, args.json)


if __name__ == "__main__":
    main()
