#!/usr/bin/env bash
# test_gpu_parity.sh BUILD_DIR SOURCE_DIR: the timm fixtures of tests/fixtures (test_parity) on the
# CUDA backend, in fp32 and in bf16 (fp32 master weights), each against timm's float64 values
# with test_parity's tolerances for that precision. Skipped (exit 77) without a usable GPU.
set -uo pipefail
build=$1
rc=0
for precision in fp32 bf16; do
  "$build/test_parity" --device cuda --precision "$precision"
  r=$?
  [ $r -eq 77 ] && exit 77
  [ $r -ne 0 ] && rc=1
done
exit $rc
