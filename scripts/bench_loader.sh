#!/usr/bin/env bash
# bench_loader.sh: the loader benchmark in one command: swin.c's loader (decode + RandomResizedCrop
# + flip + RandAugment, uint8 batches) and PyTorch's DataLoader with timm's transform for the same
# recipe, at the same worker counts, on synthetic ImageNet-like JPEGs (scripts/make_jpegs.py).
#
#   bash scripts/bench_loader.sh [DATA_DIR=/tmp/bench_jpegs] [WORKERS="1 2 4 8 16"] [BATCHES=40]
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
lib=${BUILD:-build}/libswincore.a
for tool in bench_loader profile_loader; do
  gcc -std=c11 -O3 -march=native -fopenmp -I. -I"$stb" scripts/$tool.c "$lib" -lm -lpthread \
    -o /tmp/$tool
done
/tmp/profile_loader "$data" 300
echo "# $(nproc) cores, $(find "$data/train" -name "*.jpg" | wc -l) training JPEGs in $data"
for w in $workers; do
  /tmp/bench_loader "$data" imagefolder "$w" "$batches" full
  "$py" scripts/bench_loader_torch.py "$data" "$w" --batches "$batches"
done
last=${workers##* }
/tmp/bench_loader "$data-shards" shards "$last" "$batches" full
