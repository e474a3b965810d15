#!/usr/bin/env bash
# Installs what swin.c needs to build, test and run its default job, from Debian's packages:
# a C compiler, CMake, Ninja, stb_image (libstb-dev), Fashion-MNIST (dataset-fashion-mnist),
# Open MPI (openmpi-bin: mpirun; libopenmpi-dev: the headers and library) for distributed runs,
# and, for the fuzz build of scripts/test.sh, clang with its sanitizer and libFuzzer runtimes
# (libclang-rt-14-dev) and OpenMP (libomp-dev).
# The CUDA toolkit, when present in /usr/local/cuda, is picked up by the build; it is not installed here.
set -euo pipefail
packages=(gcc cmake ninja-build libstb-dev dataset-fashion-mnist python3 openmpi-bin libopenmpi-dev
  clang libclang-rt-14-dev libomp-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "setup: ok (${packages[*]})"
