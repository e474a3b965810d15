#!/usr/bin/env bash
# The test suite, as CI runs it (.ci/run), after setup (scripts/setup.sh):
#   1. the release build (with CUDA when nvcc is there) and ctest: the CPU tests; tests labelled
#      gpu skip, visibly, without a GPU;
#   2. a CPU build with AddressSanitizer and UndefinedBehaviorSanitizer (build-asan) and its CPU
#      tests: the first finding fails the test that met it;
#   3. a clang build with libFuzzer (build-fuzz) and a bounded run of every fuzz harness,
#      SWIN_FUZZ_SECONDS each (default 60), from the committed corpus (scripts/fuzz.sh);
#   4. a 2,000-step soak of the release build (scripts/soak.sh): memory and descriptors flat.
# `bash scripts/test.sh quick` stops after step 1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build
ctest --test-dir build --output-on-failure -j2
[ "${1:-}" = quick ] && exit 0

echo "== sanitizers: AddressSanitizer + UndefinedBehaviorSanitizer, CPU tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWIN_CUDA=OFF \
  -DSWIN_SANITIZE=address,undefined
cmake --build build-asan
UBSAN_OPTIONS=print_stacktrace=1 ctest --test-dir build-asan --output-on-failure -j2 -L cpu

echo "== fuzzing: libFuzzer, ${SWIN_FUZZ_SECONDS:-60} s per harness"
CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSWIN_CUDA=OFF \
  -DSWIN_FUZZ=ON -DSWIN_SANITIZE=address,undefined
cmake --build build-fuzz
bash scripts/fuzz.sh build-fuzz "${SWIN_FUZZ_SECONDS:-60}"

echo "== soak: 2,000 steps"
bash scripts/soak.sh build 2000 build/soak
