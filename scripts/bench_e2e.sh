#!/usr/bin/env bash
# swin.c against PyTorch end to end on real JPEGs, in one command: for each dataset (the
# ImageFolder ROOT; the tar shards SHARDS_ROOT when given) and each decoder, `swin_train
# configs/swin_tiny.ini bench=e2e` (bf16, batch 128, the whole recipe, 10 classes), and once per
# dataset scripts/bench_e2e_torch.py (timm, the same recipe, torch.compile with CUDA graphs); then
# one table: img/s, data wait, swin.c's end to end / resident step and swin.c / PyTorch, and
# swin.c's loader time per image by stage. A missing ROOT is generated (scripts/make_jpegs.py,
# 4000 training images) and a missing SHARDS_ROOT cut from it (scripts/make_shards.py).
# Usage (repo root): bash scripts/bench_e2e.sh ROOT [SHARDS_ROOT]
#   SWIN_TRAIN=path/to/swin_train (default build/swin_train), STEPS (500), TORCH_STEPS (STEPS),
#   WORKERS (unset: swin.c's own default, PyTorch `nproc`), DECODERS ("nvjpeg stb");
#   logs go to $OUT (or /tmp/swin_e2e).
set -uo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { sed -n '9,12p' "$0" >&2; exit 2; }
root=$(realpath -m "$1")
shards=$([ $# -eq 2 ] && realpath -m "$2")
cd "$(dirname "$0")/.."
bin=${SWIN_TRAIN:-build/swin_train}
out=${OUT:-/tmp/swin_e2e}
steps=${STEPS:-500}
torch_steps=${TORCH_STEPS:-$steps}
decoders=${DECODERS:-nvjpeg stb}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# Generated into NAME.part and renamed when complete, so an interrupted run is not reused.
if [ ! -d "$root" ]; then
  python3 scripts/make_jpegs.py "$root.part" --train 4000 --val 200 --classes 10 || exit 1
  mv "$root.part" "$root"
fi
if [ -n "$shards" ] && [ ! -d "$shards" ]; then
  python3 scripts/make_shards.py "$root" "$shards.part" || exit 1
  mv "$shards.part" "$shards"
fi
kinds=(imagefolder) paths=("$root")
[ -n "$shards" ] && kinds+=(shards) paths+=("$shards")
for i in "${!kinds[@]}"; do
  kind=${kinds[$i]} path=${paths[$i]}
  for dec in $decoders; do
    log="$out/swinc_${kind}_$dec.log"
    "$bin" configs/swin_tiny.ini bench=e2e device=cuda precision=bf16 data.dataset="$kind" \
      data.path="$path" data.decoder="$dec" model.num_classes=10 train.batch_size=128 \
      bench.steps="$steps" ${WORKERS:+data.workers=$WORKERS} > "$log" 2>&1 ||
      echo "swin_train bench=e2e failed for $kind $dec (see $log)"
    grep -A6 '^bench e2e:' "$log"
  done
  log="$out/torch_$kind.log"
  python3 scripts/bench_e2e_torch.py "$path" --dataset "$kind" --steps "$torch_steps" \
    --workers "${WORKERS:-$(nproc)}" --num-classes 10 --batch 128 > "$log" 2>&1 ||
    echo "bench_e2e_torch.py failed for $kind (see $log)"
  grep '^{' "$log"
done
python3 - "$out" "$decoders" "${kinds[@]}" <<'PY'
import json, os, sys
out, decoders, kinds = sys.argv[1], sys.argv[2].split(), sys.argv[3:]

def result(name, bench):
    path = os.path.join(out, name)
    lines = open(path).read().splitlines() if os.path.exists(path) else []
    rows = [json.loads(l) for l in lines if l.startswith('{"bench": "%s"' % bench)]
    return (rows[-1] if rows else None), path

rows, failed = [], False  # (who, dataset, swin.c result or None, PyTorch result, log)
for kind in kinds:
    torch_r, torch_log = result(f"torch_{kind}.log", "e2e_torch")
    for dec in decoders:
        rows.append((f"swin.c {dec}", kind, *result(f"swinc_{kind}_{dec}.log", "e2e"), torch_r))
    rows.append(("PyTorch", kind, torch_r, torch_log, None))
print("\n== end to end on JPEG files: swin_tiny, bf16, batch 128, the Swin recipe, same GPU")
print(f"{'who':14s} {'dataset':12s} {'workers':>7s} {'img/s':>9s} {'data wait':>9s} "
      f"{'e2e/synth':>9s} {'vs PyTorch':>10s}")
for who, kind, r, log, torch_r in rows:
    if r is None:
        failed = True
        print(f"{who:14s} {kind:12s} failed, see {log}")
        continue
    synth = f"{r['img_s'] / r['synthetic_img_s']:.3f}" if "synthetic_img_s" in r else "-"
    vs = f"{r['img_s'] / torch_r['img_s']:.2f}x" if who != "PyTorch" and torch_r else "-"
    print(f"{who:14s} {kind:12s} {r['workers']:7d} {r['img_s']:9.1f} "
          f"{100 * r['data_wait']:8.1f}% {synth:>9s} {vs:>10s}")
ours = [(who, kind, r) for who, kind, r, _, _ in rows if who != "PyTorch" and r]
if ours:
    stages = list(ours[0][2]["stages_ms"])
    print("\n== swin.c's loader, ms per image by stage (summed over workers)")
    print(f"{'who':14s} {'dataset':12s}" + "".join(f" {s:>9s}" for s in stages))
    for who, kind, r in ours:
        print(f"{who:14s} {kind:12s}" +
              "".join(f" {r['stages_ms'].get(s, float('nan')):9.3f}" for s in stages))
sys.exit(1 if failed else 0)
PY
