#!/usr/bin/env bash
# Bounded libFuzzer runs of every harness (tests/fuzz/fuzz_<name>.c) from its committed corpus.
#   bash scripts/fuzz.sh BUILD_DIR [SECONDS_EACH] [HARNESS...]
# BUILD_DIR is a SWIN_FUZZ=ON build (see scripts/test.sh). New inputs go to BUILD_DIR/fuzz-corpus/
# (the committed corpus is only read); a crash, leak, timeout or broken promise leaves its input
# in BUILD_DIR/fuzz-findings/ and fails the script. Copy such an input into
# tests/fuzz/corpus/fuzz_<name>/ once it is fixed: ctest replays it from then on.
# SWIN_FUZZ_SEED (default 1) fixes libFuzzer's random seed; the exploration still varies from
# run to run (tests/fuzz/README.md), so SWIN_FUZZ_SEED=0, a new seed per run, run long, is how
# to look for findings before CI does; commit the fixes and the inputs.
set -uo pipefail
build=$1
seconds=${2:-60}
shift $(($# >= 2 ? 2 : $#))
src=$(cd "$(dirname "$0")/.." && pwd)
harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for f in "$src"/tests/fuzz/fuzz_*.c; do harnesses+=("$(basename "$f" .c)"); done
fi
mkdir -p "$build/fuzz-findings"

# The image decoder (data/image.c and stb_image, no other code) under MemorySanitizer as well,
# which needs every line it runs instrumented: built here on its own, without OpenMP.
build_msan_decoder() {
  local stb
  stb=$(sed -n 's/^STB_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")
  clang -g -O1 -fsanitize=fuzzer,memory -fsanitize-memory-track-origins -std=c11 \
    -I"$src" -I"$stb" "$src/tests/fuzz/fuzz_decode.c" "$src/data/image.c" \
    -o "$build/fuzz_decode_msan_libfuzzer"
}

failed=0
for h in "${harnesses[@]}"; do
  if [ "$h" = fuzz_decode ]; then harnesses+=(fuzz_decode_msan); fi
done
for h in "${harnesses[@]}"; do
  bin=$build/${h}_libfuzzer
  if [ "$h" = fuzz_decode_msan ] && ! build_msan_decoder; then
    echo "fuzz: cannot build the MemorySanitizer decoder harness"
    failed=1
    continue
  fi
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin is missing (configure $build with CC=clang -DSWIN_FUZZ=ON)"
    exit 2
  fi
  corpus=${h%_msan}
  mkdir -p "$build/fuzz-corpus/$h"
  dict=()
  [ -f "$src/tests/fuzz/$corpus.dict" ] && dict=(-dict="$src/tests/fuzz/$corpus.dict")
  log=$build/fuzz-findings/$h.log
  # Findings besides crashes: one allocation over 512 MB or 2 GB resident (no input of these
  # small harnesses needs that much), and an input that runs over 10 s.
  "$bin" "$build/fuzz-corpus/$h" "$src/tests/fuzz/corpus/$corpus" "${dict[@]}" \
    -seed="${SWIN_FUZZ_SEED:-1}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=512 -max_len=65536 \
    -artifact_prefix="$build/fuzz-findings/$h-" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
  cov=$(grep -E '#[0-9]+[[:space:]]+DONE' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+')
  if [ $rc -eq 0 ]; then
    echo "fuzz: $h: ${runs:-?} runs in ${seconds}s, ${cov:-no coverage line}, no finding"
  else
    echo "fuzz: $h: FINDING (exit $rc) after ${runs:-?} runs; log $log:"
    grep -E 'ERROR|SUMMARY|broken promise|Test unit written' "$log" | head -10 | sed 's/^/  | /'
    failed=1
  fi
done
exit $failed
