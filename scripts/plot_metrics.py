#!/usr/bin/env python3
"""Draws a swin.c run's curves from RUN_DIR/metrics.jsonl into a PNG.

Usage: python3 scripts/plot_metrics.py RUN_DIR/metrics.jsonl [OUT.png]
Left: training loss (per logged window) against step; right: eval top-1 / top-5 (%) against step,
and the top-1 of the weights' moving average when the run keeps one (train.ema_decay).
Needs matplotlib (Debian: apt-get install python3-matplotlib, or pip install matplotlib).
A resumed run appends to the same file; when a step appears twice the later record wins.
"""
import json
import sys


def read(path):
    train, evals = {}, {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not JSON ({e})")
            if "loss" in r:
                train[r["step"]] = r
            if "eval_top1" in r:
                evals[r["step"]] = r
    return [train[k] for k in sorted(train)], [evals[k] for k in sorted(evals)]


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__.strip())
    path = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else path.rsplit(".", 1)[0] + ".png"
    train, evals = read(path)
    if not train and not evals:
        sys.exit(f"{path}: no train or eval records")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("matplotlib is missing. HINT: apt-get install python3-matplotlib (or pip install matplotlib)")
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1)
    ax_loss.set(xlabel="step", ylabel="training loss", title="loss")
    ax_loss.grid(alpha=0.3)
    if evals:
        steps = [r["step"] for r in evals]
        ax_acc.plot(steps, [r["eval_top1"] for r in evals], "o-", label="top-1")
        ax_acc.plot(steps, [r["eval_top5"] for r in evals], "s--", label="top-5")
        ema = [r for r in evals if "eval_top1_ema" in r]
        if ema:
            ax_acc.plot([r["step"] for r in ema], [r["eval_top1_ema"] for r in ema], "^:",
                        label="top-1 (EMA)")
        best = max(evals, key=lambda r: r["eval_top1"])
        ax_acc.annotate(f'{best["eval_top1"]:.2f}%', (best["step"], best["eval_top1"]),
                        textcoords="offset points", xytext=(0, -14), ha="center")
        ax_acc.legend()
    ax_acc.set(xlabel="step", ylabel="accuracy (%)", title="eval accuracy")
    ax_acc.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out} ({len(train)} train records, {len(evals)} eval records)")


if __name__ == "__main__":
    main()
