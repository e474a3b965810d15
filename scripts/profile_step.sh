#!/usr/bin/env bash
# profile_step.sh: GPU time per kernel of the training step, measured by Nsight Compute (ncu)
# around the benchmark mode: every kernel of `swin_train CONFIG bench=1` (warm-up, timed and
# profiled rounds) is timed alone (gpu__time_duration, clocks left as they are), then the times
# are summed per kernel name and divided by the number of steps. ncu serializes the kernels, so
# the sum is the step's GPU time without overlap; it complements the benchmark's per-family table
# (events around each op) with the kernels inside each family.
# Usage (repo root, on the GPU machine): bash scripts/profile_step.sh BUILD_DIR CONFIG [key=value ...]
# e.g. bash scripts/profile_step.sh build-gpu configs/swin_tiny.ini precision=bf16 train.batch_size=128
set -euo pipefail
build=${1:?usage: profile_step.sh BUILD_DIR CONFIG [key=value ...]}
config=${2:?usage: profile_step.sh BUILD_DIR CONFIG [key=value ...]}
shift 2
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1 || true)
if [ -z "$ncu_bin" ]; then
  echo "profile_step.sh: ncu (Nsight Compute) not found" >&2
  exit 1
fi
# Few steps: the benchmark runs warm-up + timed + profiled rounds, each `steps` long when steps < 10.
warmup=${PROFILE_WARMUP:-2} steps=${PROFILE_STEPS:-2}
csv=${PROFILE_CSV:-$(mktemp /tmp/profile_step.XXXXXX.csv)}  # PROFILE_CSV= keeps the raw table
"$ncu_bin" --clock-control none --metrics gpu__time_duration.sum --csv --print-kernel-base function \
  "$build/swin_train" "$config" bench=1 device=cuda bench.warmup=$warmup bench.steps=$steps "$@" \
  >"$csv"
# warm-up + the timed round + the profiled round, each step the same kernels
python3 - "$csv" $((warmup + 2 * steps)) <<'PY'
import csv, sys
path, steps = sys.argv[1], int(sys.argv[2])
scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
         "second": 1e3, "s": 1e3}
rows = [l for l in open(path) if l.startswith('"')]
total, count, seq = {}, {}, []
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"]
    ms = float(r["Metric Value"].replace(",", "")) * scale[r["Metric Unit"]]
    total[name] = total.get(name, 0.0) + ms
    count[name] = count.get(name, 0) + 1
    seq.append((name, ms, r.get("Grid Size", ""), r.get("Block Size", "")))
# The last step's kernels in launch order (a step starts with its drop-path draw, or without
# drop path with the patch-embedding input), to PROFILE_SEQ when set.
import os
if os.environ.get("PROFILE_SEQ") and seq:
    marks = [i for i, r in enumerate(seq) if "drop_path" in r[0]] or \
            [i for i, r in enumerate(seq) if "patch_embed" in r[0]]
    with open(os.environ["PROFILE_SEQ"], "w") as f:
        for name, ms, grid, block in seq[marks[-1] if marks else 0:]:
            f.write(f"{ms * 1e3:9.1f} us  grid {grid:>16s} block {block:>12s}  {name[:150]}\n")
step_ms = sum(total.values()) / steps
print(f"GPU time per kernel, ms per step (sum over {steps} steps / {steps}); step total {step_ms:.2f} ms")
print(f"{'kernel':60s} {'ms/step':>8s} {'share':>6s} {'calls/step':>10s}")
for name, ms in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"{name[:60]:60s} {ms / steps:8.3f} {100 * ms / steps / step_ms:5.1f}% {count[name] / steps:10.1f}")
PY
