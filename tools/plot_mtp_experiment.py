#!/usr/bin/env python
"""Validation-loss curves and engine-measured acceptance of the MTP layout experiment.

    python tools/plot_mtp_experiment.py runs/mtp --png docs/bench/mtp_layouts.png --json docs/bench/mtp_layouts.json
"""
from __future__ import annotations

import argparse
import json
import os


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", help="the directory given to tools/train_mtp_heads.sh")
    ap.add_argument("--png", required=True)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    summary = {}
    for layout in ("rmsnorm", "eagle1"):
        hist_path = os.path.join(args.work, "work", f"train-{layout}", "history.json")
        info_path = os.path.join(args.work, layout, "training.json")
        if not (os.path.isfile(hist_path) and os.path.isfile(info_path)):
            raise SystemExit(f"{layout}: training has not finished ({hist_path}, {info_path})")
        with open(hist_path) as fh:
            hist = json.load(fh)
        with open(info_path) as fh:
            info = json.load(fh)
        summary[layout] = {"val": hist["val"], "engine_validation": info.get("engine_validation"),
                           "num_params": info["num_params"], "train": info["train"]}
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for layout, s in summary.items():
        steps = [v["step"] for v in s["val"]]
        axes[0].plot(steps, [v["loss"] for v in s["val"]], marker="o", label=layout)
        axes[1].plot(steps, [v["top1"][0] for v in s["val"]], marker="o", label=f"{layout} step 1")
        axes[1].plot(steps, [v["top1"][-1] for v in s["val"]], linestyle="--", label=f"{layout} step {len(s['val'][0]['top1'])}")
    axes[0].set(title="MTP head validation loss", xlabel="step", ylabel="loss")
    axes[1].set(title="top-1 agreement with the target", xlabel="step", ylabel="accuracy")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)
    with open(args.json, "w") as fh:
        json.dump(summary, fh, indent=1)
    for layout, s in summary.items():
        ev, last = s["engine_validation"], s["val"][-1]
        print(f"{layout:8s} val loss {last['loss']:.4f}  top-1 {' '.join(f'{a:.3f}' for a in last['top1'])}  "
              f"engine acceptance {' '.join(f'{a:.3f}' for a in ev['accepted_per_position'])}  tau {ev['tau']:.3f}")


if __name__ == "__main__":
    main()
