#!/usr/bin/env bash
# parity_full_size.sh: swin.c against timm at full size. make_fixtures.py --full-size writes the
# fixtures of swinv2_tiny_window8_256's and swin_tiny_patch4_window7_224's shapes (batch 2, the
# random weights of the small fixtures' rule; float64 on the CPU; ~450 MB a file, so not in the
# repository), then test_parity checks each on swin.c's CPU backend in fp32 and, where a GPU is
# usable, on the CUDA backend in fp32 and bf16, with the small fixtures' tolerances for each
# precision: logits, loss, every parameter gradient, the weights after 1 and 5 AdamW steps.
# Needs torch and timm (the GPU machine has them).
# Usage (repo root): bash scripts/parity_full_size.sh BUILD_DIR [OUT_DIR] [MODEL ...]
set -uo pipefail
build=${1:?usage: parity_full_size.sh BUILD_DIR [OUT_DIR] [MODEL ...]}
out=${2:-/tmp/swin_full_size_fixtures}
shift $(($# >= 2 ? 2 : 1))
[ -x "$build/test_parity" ] || { echo "parity_full_size.sh: no $build/test_parity (build first)" >&2; exit 1; }
mkdir -p "$out" || exit 1
python3 scripts/make_fixtures.py --out "$out" --full-size "$@" || exit 1
files=()
if [ $# -gt 0 ]; then
  for m in "$@"; do files+=("$out/$m.safetensors"); done
else
  files=("$out"/*.safetensors)
fi
rc=0
"$build/test_parity" "${files[@]}" || rc=1
for precision in fp32 bf16; do
  "$build/test_parity" --device cuda --precision $precision "${files[@]}"
  r=$?
  if [ $r -eq 77 ]; then break; fi  # no GPU: the CPU run alone
  [ $r -eq 0 ] || rc=1
done
exit $rc
