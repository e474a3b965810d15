#!/usr/bin/env bash
# swin.c against PyTorch on the same GPU, in one command: for each model, `swin_train bench=1`
# (bf16, batch $BATCH or 128, resident synthetic data) and scripts/bench_pytorch.py's modes
# (timm, same batch and precision, fused AdamW), then one table with swin.c's figures and the
# ratio to each PyTorch mode. Logs go to $OUT (or /tmp/swin_bench).
# Usage (repo root): bash scripts/bench.sh [MODEL ...]   (default: swin_tiny swin_base)
#   SWIN_TRAIN=path/to/swin_train (default build/swin_train), MODES="eager eager_fused ...",
#   BATCH=64 (e.g. for swin_base_384: Swin-B at 384 / window 12)
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${SWIN_TRAIN:-build/swin_train}
out=${OUT:-/tmp/swin_bench}
modes=${MODES:-eager eager_fused compile_flex compile_fused compile_fused_ro}
batch=${BATCH:-128}
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(swin_tiny swin_base)
mkdir -p "$out"
export PYTHONUNBUFFERED=1
for m in "${models[@]}"; do
  "$bin" "configs/$m.ini" bench=1 device=cuda precision=bf16 train.batch_size="$batch" \
    > "$out/swinc_$m.log" 2>&1 || echo "swin_train bench failed for $m (see $out/swinc_$m.log)"
  grep -A14 '^bench:' "$out/swinc_$m.log"
  python3 scripts/bench_pytorch.py "$m" "$batch" $modes > "$out/pytorch_$m.log" 2>&1
  grep '^{' "$out/pytorch_$m.log"
done
python3 - "$out" "$batch" "${models[@]}" <<'PY'
import json, sys
out, batch, models = sys.argv[1], sys.argv[2], sys.argv[3:]
print(f"\n== swin.c vs PyTorch (bf16, batch {batch}, same GPU)")
print(f"{'model':11s} {'who':26s} {'img/s':>9s} {'ms/step':>8s} {'GiB':>6s} {'swin.c x':>9s}")
for m in models:
    ours = next((json.loads(l) for l in open(f"{out}/swinc_{m}.log") if l.startswith('{"bench"')), None)
    theirs = [json.loads(l) for l in open(f"{out}/pytorch_{m}.log") if l.startswith('{"bench"')]
    if ours:
        print(f"{m:11s} {'swin.c':26s} {ours['img_s']:9.1f} {ours['ms_per_step']:8.2f} "
              f"{ours['memory_gib']:6.2f} {'':>9s}")
    for r in theirs:
        ratio = f"{ours['img_s'] / r['img_s']:.2f}x" if ours else "-"
        print(f"{m:11s} {'pytorch ' + r['mode']:26s} {r['img_s']:9.1f} {r['ms_per_step']:8.2f} "
              f"{r['peak_gib']:6.2f} {ratio:>9s}")
PY
