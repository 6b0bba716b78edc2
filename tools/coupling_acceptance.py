"""First-draft acceptance of three sampled verification rules, computed exactly from each
step's target and drafter distributions (p, q) while an MTP head drafts for the model on
the benchmark's chat questions (unseeded requests: drafts drawn from q):

- rejection sampling (unseeded requests): sum over tokens of min(p, q);
- the inverse-CDF coupling (seeded requests, ``sampling.uniforms``): the probability that
  one uniform lands in the same token's interval of both CDFs over the token ids;
- a Gumbel-max coupling (one keyed exponential per vocabulary entry; not implemented in
  the engine): Monte Carlo with ``--gumbel-draws`` noise vectors per step;
- a head-and-tail race (not implemented in the engine either): the exponential race
  argmin E_x / r_x run exactly with keyed exponentials only for the tokens of probability
  >= ``--head-threshold`` and, for all the others together, one keyed Exp(1) divided by
  their total mass (the minimum of their race) and one inverse-CDF draw among them (its
  winner) - exact for any distribution, a few hundred random numbers per row; Monte Carlo
  with the same draws.

    python tools/coupling_acceptance.py --model smollm2 --k 2 --temperature 0.7
"""
from __future__ import annotations

import argparse
import collections
import statistics

import torch

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.bench.spec import bench_prompts
from sonarspec_ext.engine import generic_step
from sonarspec_ext.sampling.sampler import processed_probs


def head_tail_race(r: torch.Tensor, e: torch.Tensor, u_min: torch.Tensor, u_tail: torch.Tensor,
                   threshold: float) -> torch.Tensor:
    """Winners (draws,) of the head-and-tail race over r (vocab,) for each draw's
    exponentials ``e`` (draws, vocab) and tail uniforms ``u_min``, ``u_tail`` (draws,)."""
    head = r >= threshold
    head_time = torch.where(head, e / r, torch.full_like(e, float("inf")))
    best_head = head_time.min(-1)
    tail = torch.where(head, torch.zeros_like(r), r)
    mass = tail.sum()
    if mass <= 0:
        return best_head.indices
    tail_time = -torch.log1p(-u_min) / mass
    cum = tail.cumsum(0)
    tail_token = torch.searchsorted(cum, u_tail * mass, right=True).clamp_max(r.shape[0] - 1)
    return torch.where(best_head.values <= tail_time, best_head.indices, tail_token)


def rule_acceptance(p: torch.Tensor, q: torch.Tensor, gumbel_draws: int, threshold: float) -> dict:
    """The rules' acceptance of a draft drawn from q against the target p (float64 rows)."""
    cp, cq = p.cumsum(0) / p.sum(), q.cumsum(0) / q.sum()
    zero = p.new_zeros(1)
    low = torch.maximum(torch.cat([zero, cp[:-1]]), torch.cat([zero, cq[:-1]]))
    e = torch.empty(gumbel_draws, p.shape[0], dtype=torch.float64).exponential_()
    u = torch.rand(2, gumbel_draws, dtype=torch.float64)
    return {"rejection": torch.minimum(p, q).sum().item(),
            "inverse_cdf_coupling": (torch.minimum(cp, cq) - low).clamp_min(0).sum().item(),
            "gumbel_coupling": ((p / e).argmax(-1) == (q / e).argmax(-1)).double().mean().item(),
            "head_tail_race": (head_tail_race(p, e, u[0], u[1], threshold)
                               == head_tail_race(q, e, u[0], u[1], threshold)).double().mean().item()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--k", type=int, default=2, help="MTP chain length")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--gumbel-draws", type=int, default=256)
    ap.add_argument("--head-threshold", type=float, default=1 / 256)
    args = ap.parse_args()
    found = collections.defaultdict(list)   # rule -> first-draft acceptance per step (rule_acceptance's keys)
    verify = generic_step.verify_chains

    def measuring(items):
        for logits, draft, params, _ in items:
            if not params.greedy and draft.probs is not None and draft.token_ids:
                p = processed_probs(logits[:1], params)[0].double()
                for name, v in rule_acceptance(p, draft.probs[0].double(), args.gumbel_draws,
                                                 args.head_threshold).items():
                    found[name].append(v)
        return verify(items)

    generic_step.verify_chains = measuring
    llm = LLM(args.model, spec=SpecConfig(method="mtp", num_draft_tokens=args.k))
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, ignore_eos=True)
    llm.generate(bench_prompts(llm), params)
    steps = len(found["rejection"])
    print(f"{args.model}, MTP K = {args.k}, T = {args.temperature}: first-draft acceptance over {steps} steps")
    for name, values in found.items():
        print(f"  {name:22s} {statistics.mean(values):.3f}")


if __name__ == "__main__":
    main()
