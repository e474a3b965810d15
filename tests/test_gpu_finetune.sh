#!/usr/bin/env bash
# test_gpu_finetune.sh BUILD_DIR SOURCE_DIR: tests/test_finetune.sh with device=cuda (fp32): the
# same runs and checks on the GPU, skipped (exit 77) when no GPU is usable.
exec bash "$(dirname "$0")/test_finetune.sh" "$1" "$2" cuda
