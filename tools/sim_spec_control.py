#!/usr/bin/env python
"""The adaptive speculation control (``engine/spec_control.py``) on simulated machines with
noisy step times (``sonarspec_ext.testing.noisy_steps``): per machine, run length and
noise, the controller's throughput over that of the best fixed draft length on the same
random draws - median and 10th percentile over seeds. No model runs: this measures the
controller's choices alone, where a real run's noise would hide them.

    python tools/sim_spec_control.py [--seeds 200] [--steps 150 1000] [--stall-rates 0 0.2] [--json PATH]

The machines are ``noisy_steps.MACHINES`` (seconds per step: fixed + per verified row + per
drafted token; acceptance per draft): SmolLM2 Q4_1 on a 2-core AMD Zen 4 VM as
`tools/profile_spec.py` measured it (K = 2 best, 1.33x plain), the same with lookup drafts in
a fifth of the drafting steps, one where rows are nearly free (K = 4 best) and one where
they cost most of a step (plain decoding best). Each runs twice: ``pooled`` True is the
control as the engine runs it (acceptance per position pooled over the modes, lookup steps
measured apart), False takes each mode's steps as measured, lookup steps included.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

from sonarspec_ext.bench import write_json
from sonarspec_ext.testing.noisy_steps import MACHINES, MODES, relative_throughputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--steps", type=int, nargs="+", default=[150, 1000])
    ap.add_argument("--stall-rates", type=float, nargs="+", default=[0.0, 0.2],
                    help="share of steps stretched 1.5-3x by the machine's other work")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print(f"{'machine':14s} {'best K':>6s} {'steps':>5s} {'stalls':>6s} {'pooled':>6s} {'median':>7s} {'p10':>6s}")
    for name, base in MACHINES.items():
        for stall_rate in args.stall_rates:
            machine = dataclasses.replace(base, stall_rate=stall_rate)
            for steps in args.steps:
                for pooled in (True, False):
                    r = relative_throughputs(machine, args.seeds, steps, MODES, pool_acceptance=pooled)
                    row = {"machine": name, "best_length": machine.best_length(MODES),
                           "expected_rates": {k: round(machine.expected_rate(k), 1) for k in MODES},
                           "steps": steps, "stall_rate": stall_rate, "pooled_acceptance": pooled,
                           "median": round(statistics.median(r), 4), "p10": round(r[len(r) // 10], 4)}
                    rows.append(row)
                    print(f"{name:14s} {row['best_length']:6d} {steps:5d} {stall_rate:6.2f} {str(pooled):>6s} "
                          f"{row['median']:7.3f} {row['p10']:6.3f}")
    if args.json:
        write_json({"seeds": args.seeds, "modes": list(MODES),
                    "machines": {k: dataclasses.asdict(m) for k, m in MACHINES.items()}, "results": rows}, args.json)


if __name__ == "__main__":
    main()
