#!/usr/bin/env bash
# gpu_check.sh: one run on the GPU machine (torch + timm + onnxruntime there, no registry):
# build swin.c, run ctest, regenerate the timm fixtures and compare them with the committed ones,
# check swin.c against timm at full size (scripts/parity_full_size.sh) and on held-out data after
# training (scripts/heldout_parity.py, Swin V2), run the export / ONNX checks, measure the loader
# against PyTorch's DataLoader (the loader bar: scripts/bench_loader.sh) and the PyTorch anchor.
# Prints a short table last.
# The stb headers travel in .deps/stb (made by: mkdir -p .deps/stb && cp /usr/include/stb/stb_image*.h .deps/stb/);
# Fashion-MNIST's four .gz files in .deps/fashion-mnist (the dataset tests and heldout_parity.py
# read /usr/share/datasets/fashion-mnist).
# Usage (repo root): bash scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
summary=()
step() {  # step NAME COMMAND...: run, log to $out/NAME.log, record pass/fail and seconds
  local name=$1
  shift
  local t0=$SECONDS
  if "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$((SECONDS - t0))s")
  else summary+=("$name|FAIL (see $name.log)|$((SECONDS - t0))s"); fi
  tail -5 "$out/$name.log"
}

if [ -d .deps/fashion-mnist ] && [ ! -d /usr/share/datasets/fashion-mnist ]; then
  mkdir -p /usr/share/datasets && cp -r .deps/fashion-mnist /usr/share/datasets/
fi
step build bash -c "cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS=-I$PWD/.deps/stb && cmake --build build-gpu"
step ctest ctest --test-dir build-gpu --output-on-failure -j8
step fixtures bash -c "python3 scripts/make_fixtures.py --out $out/fixtures && for f in tests/fixtures/*.safetensors; do cmp \$f $out/fixtures/\$(basename \$f) && echo \"same bytes: \$f\"; done"
step full_size bash scripts/parity_full_size.sh build-gpu /tmp/swin_full_size_fixtures
step heldout python3 scripts/heldout_parity.py --build build-gpu --version 2 --work /tmp/heldout_parity
step export python3 scripts/check_export.py --build build-gpu --work /tmp/check_export
step loader env BUILD=build-gpu bash scripts/bench_loader.sh /tmp/bench_jpegs "4 8 16" 40
step anchor python3 scripts/anchor_pytorch.py swin_tiny_patch4_window7_224 128 bf16 bf16c

echo
echo "== gpu_check summary =="
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
python3 - "$out/anchor.log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"anchor {r['mode']:6s} {r['img_s']:8.1f} img/s  {r['ms_per_step']:7.2f} ms/step  peak {r['peak_gib']} GiB")
PY
grep -E "tests passed|tests failed" "$out/ctest.log"
grep -E "img/s" "$out/loader.log"
printf '%s\n' "${summary[@]}" | awk -F'|' '{printf "%-10s %-28s %s\n", $1, $2, $3}'
