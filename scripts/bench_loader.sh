#!/usr/bin/env bash
# bench_loader.sh: the loader benchmark in one command: swin.c's loader (decode + RandomResizedCrop
# + flip + RandAugment, uint8 batches) and PyTorch's DataLoader with timm's transform for the same
# recipe, at the same worker counts, on synthetic ImageNet-like JPEGs (scripts/make_jpegs.py).
#
#   bash scripts/bench_loader.sh [DATA_DIR=/tmp/bench_jpegs] [WORKERS="1 2 4 8 16"] [BATCHES=40]
#
# DECODERS="stb nvjpeg" also times the loader with nvJPEG decoding on the GPU (data.decoder =
# nvjpeg) at every worker count: it needs BUILD= a build that found nvJPEG (it then has its own
# bench_loader); TORCH=0 leaves out PyTorch's half.
#
# Needs a built tree (cmake --build build; BUILD= names another build directory) and, for the
# PyTorch half and the JPEGs, python3 with torch, torchvision, timm, numpy and Pillow (PYTHON=
# picks the interpreter). First prints one thread's time per image by stage
# (scripts/profile_loader.c); last times the shards path (scripts/make_shards.py) at the largest
# worker count.
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-/tmp/bench_jpegs}
workers=${2:-"1 2 4 8 16"}
batches=${3:-40}
py=${PYTHON:-python3}
if [ ! -d "$data/train" ]; then
  "$py" scripts/make_jpegs.py "$data" --train 6000 --val 100 --classes 20
fi
if [ ! -d "$data-shards/train" ]; then
  "$py" scripts/make_shards.py "$data" "$data-shards" --samples-per-shard 500
fi
stb=$(dirname "$(find /usr/include .deps -name stb_image.h 2>/dev/null | head -1)")
build=${BUILD:-build}
lib=$build/libswincore.a
decoders=${DECODERS:-stb}
bench=/tmp/bench_loader
if [ -x "$build/bench_loader" ]; then
  # A build with nvJPEG links the benchmark itself (with the CUDA libraries).
  # profile_loader (one CPU thread's stages) is a CPU build's: a plain gcc line, as below.
  bench=$build/bench_loader
  tools=""
elif [ "$decoders" != stb ]; then
  echo "error: DECODERS=\"$decoders\" needs a build that found nvJPEG ($build has no bench_loader)" >&2
  echo "HINT: cmake -S . -B build-gpu -G Ninja -DSWIN_CUDA=ON && cmake --build build-gpu, then BUILD=build-gpu" >&2
  exit 1
else
  tools="bench_loader profile_loader"
fi
for tool in $tools; do
  gcc -std=c11 -O3 -march=native -fopenmp -I. -I"$stb" scripts/$tool.c "$lib" -lm -lpthread \
    -o /tmp/$tool
done
if [ -n "$tools" ]; then
  /tmp/profile_loader "$data" 300
fi
echo "# $(nproc) cores, $(find "$data/train" -name "*.jpg" | wc -l) training JPEGs in $data"
for w in $workers; do
  for d in $decoders; do
    "$bench" "$data" imagefolder "$w" "$batches" full 128 "$d"
  done
  if [ "${TORCH:-1}" != 0 ]; then
    "$py" scripts/bench_loader_torch.py "$data" "$w" --batches "$batches"
  fi
done
last=${workers##* }
for d in $decoders; do
  "$bench" "$data-shards" shards "$last" "$batches" full 128 "$d"
done
