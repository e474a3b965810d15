#!/usr/bin/env bash
# Sets up, builds and runs the test suite (ctest). Tests labelled gpu skip, visibly, without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build
ctest --test-dir build --output-on-failure -j2
