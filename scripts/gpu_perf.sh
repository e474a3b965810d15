#!/usr/bin/env bash
# gpu_perf.sh: one call on the GPU machine for the speed work (kernels/PERF.md): build, the
# benchmark mode on Swin-T (and Swin-B), the GPU time per kernel (scripts/profile_step.sh, ncu),
# the gpu-labelled tests, and optionally PyTorch in the same command (scripts/bench.sh). Prints a
# short table last; full logs go to $OUT (or /tmp/gpu_perf). bench runs Swin-T with and without
# CUDA graphs (train.cuda_graphs=on where supported, and off).
# Carry .deps (stb headers in .deps/stb; Fashion-MNIST's four .gz files in .deps/fashion-mnist,
# which the dataset tests read from /usr/share/datasets/fashion-mnist).
# Usage (repo root): bash scripts/gpu_perf.sh [bench] [dist] [profile] [tests] [pytorch] [base] [memory]
#   [detail] (no argument: bench profile tests); dist: the benchmark of Swin-T's data-parallel step
#   (the all-reduce rows) under mpirun -np 1 (NCCL on one GPU), with CUDA graphs and without, and
#   with two GPUs -np 2 (128 images per GPU); detail: Nsight Compute's full sections for the kernels
#   matching NCU_KERNELS (a regex; NCU_SKIP launches skipped, NCU_COUNT profiled) of Swin-T's step.
#   memory: Swin-T's device memory per batch size (BATCHES, default 64 128 256 512 1024 2048) and
#   the largest of BIG_BATCHES (default 3072 3584 4096 4608) that still runs.
#   TESTS: a ctest -R regex to run only some gpu tests.
#   gemm: scripts/bench_gemm.cu, our GEMM kernels (small-K, Hopper) against cuBLASLt (kernels/PERF.md).
#   jpeg: the JPEG path's real run, Fashion-MNIST written as 112x112 JPEGs (fashion_mnist_jpegs.py)
#   and trained with configs/fashion_mnist_jpeg.ini (full recipe, data.decoder=auto) on the GPU;
#   JPEG_EPOCHS overrides its 30 epochs.
#   e2e: scripts/bench_e2e.sh, swin.c and PyTorch end to end on generated JPEGs (/tmp/e2e_jpegs)
#   and their shards (/tmp/e2e_shards; E2E_SHARDS=0 leaves them out); STEPS, TORCH_STEPS and
#   DECODERS pass through.
set -uo pipefail
out=${OUT:-/tmp/gpu_perf}
mkdir -p "$out"
want=" ${*:-bench profile tests} "
has() { [[ "$want" == *" $1 "* ]]; }
summary=()
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to $out/NAME.log
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$((SECONDS - t0))s")
  else summary+=("$name|FAIL rc=$? (see $name.log)|$((SECONDS - t0))s"); fi
}
if [ -d .deps/fashion-mnist ] && [ ! -d /usr/share/datasets/fashion-mnist ]; then
  mkdir -p /usr/share/datasets && cp -r .deps/fashion-mnist /usr/share/datasets/
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
step build 300 bash -c "cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS=-I$PWD/.deps/stb && cmake --build build-gpu"
bench_args=(bench=1 device=cuda precision=bf16 train.batch_size=128)
if has bench; then
  step bench_tiny 120 build-gpu/swin_train configs/swin_tiny.ini "${bench_args[@]}"
  # The same step launched kernel by kernel: what the CUDA graph saves (train.cuda_graphs).
  step bench_tiny_nograph 120 build-gpu/swin_train configs/swin_tiny.ini "${bench_args[@]}" \
    train.cuda_graphs=off
  has base && step bench_base 180 build-gpu/swin_train configs/swin_base.ini "${bench_args[@]}"
fi
if has dist; then
  mpirun_args=(mpirun --allow-run-as-root --bind-to none)
  step bench_dist1 180 "${mpirun_args[@]}" -np 1 build-gpu/swin_train configs/swin_tiny.ini "${bench_args[@]}"
  # The data-parallel step launched kernel by kernel (its all-reduces outside any graph).
  step bench_dist1_nograph 180 "${mpirun_args[@]}" -np 1 build-gpu/swin_train configs/swin_tiny.ini \
    "${bench_args[@]}" train.cuda_graphs=off
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    step bench_dist2 180 "${mpirun_args[@]}" -np 2 build-gpu/swin_train configs/swin_tiny.ini \
      bench=1 device=cuda precision=bf16 train.batch_size=256
  fi
fi
if has memory; then
  : >"$out/memory.txt"
  for b in ${BATCHES:-64 128 256 512 1024 2048} ${BIG_BATCHES:-3072 3584 4096 4608}; do
    if timeout 120 build-gpu/swin_train configs/swin_tiny.ini bench=1 device=cuda precision=bf16 \
      train.batch_size=$b bench.warmup=1 bench.steps=2 >"$out/memory_$b.tmp" 2>&1; then
      echo "batch $b: $(grep -E 'device memory|img/s \(median' "$out/memory_$b.tmp" | tr -s ' ' | tr '\n' ';')" \
        >>"$out/memory.txt"
    else
      echo "batch $b: does not run ($(grep -m1 -E 'error' "$out/memory_$b.tmp"))" >>"$out/memory.txt"
      break
    fi
  done
  rm -f "$out"/memory_*.tmp
fi
if has profile; then
  PROFILE_CSV=$out/ncu_tiny.csv PROFILE_SEQ=$out/ncu_tiny_step.txt step profile_tiny 300 bash scripts/profile_step.sh build-gpu \
    configs/swin_tiny.ini precision=bf16 train.batch_size=128
fi
if has detail; then
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
  step detail 300 "$ncu_bin" --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    -k "regex:${NCU_KERNELS:-layernorm}" --launch-skip "${NCU_SKIP:-0}" --launch-count "${NCU_COUNT:-8}" \
    build-gpu/swin_train configs/swin_tiny.ini "${bench_args[@]}" bench.warmup=1 bench.steps=1
fi
if has jpeg; then
  step jpeg_data 120 python3 scripts/fashion_mnist_jpegs.py /tmp/fashion_mnist_jpeg
  step jpeg_train 540 build-gpu/swin_train configs/fashion_mnist_jpeg.ini device=cuda \
    data.path=/tmp/fashion_mnist_jpeg run_dir=/tmp/gpu_perf_jpeg_run train.epochs=${JPEG_EPOCHS:-30}
fi
if has e2e; then
  e2e_roots=(/tmp/e2e_jpegs)
  [ "${E2E_SHARDS:-1}" = 1 ] && e2e_roots+=(/tmp/e2e_shards)
  OUT=$out/e2e SWIN_TRAIN=build-gpu/swin_train step e2e 560 bash scripts/bench_e2e.sh "${e2e_roots[@]}"
fi
if has gemm; then
  step gemm 180 build-gpu/bench_gemm
fi
if has tests; then
  step ctest 420 ctest --test-dir build-gpu -L gpu --output-on-failure -j3 ${TESTS:+-R "$TESTS"}
fi
if has pytorch; then
  models=(swin_tiny)
  has base && models+=(swin_base)
  OUT=$out/bench SWIN_TRAIN=build-gpu/swin_train step pytorch 560 bash scripts/bench.sh "${models[@]}"
fi

echo "== gpu_perf"
for f in "$out"/bench_*.log; do
  [ -f "$f" ] && { echo "-- $(basename "$f")"; grep -A22 '^bench:' "$f" | grep -v '^{'; }
done
[ -f "$out/gemm.log" ] && cat "$out/gemm.log"
[ -f "$out/profile_tiny.log" ] && head -45 "$out/profile_tiny.log"
[ -f "$out/memory.txt" ] && cat "$out/memory.txt"
[ -f "$out/jpeg_train.log" ] && grep -E '^(decoder|eval|done)' "$out/jpeg_train.log" | tail -4
[ -f "$out/e2e.log" ] && sed -n '/== end to end/,$p' "$out/e2e.log"
[ -f "$out/ctest.log" ] && grep -E "tests passed|tests failed|\*\*\*|Failed|Skipped" "$out/ctest.log"
[ -f "$out/pytorch.log" ] && sed -n '/== swin.c vs PyTorch/,$p' "$out/pytorch.log"
printf '%s\n' "${summary[@]}" | awk -F'|' '{printf "%-14s %-32s %s\n", $1, $2, $3}'
