#!/usr/bin/env bash
# test_gpu_finetune_v2.sh BUILD_DIR SOURCE_DIR: tests/test_finetune.sh with Swin V2 and
# device=cuda (fp32), skipped (exit 77) when no GPU is usable.
exec bash "$(dirname "$0")/test_finetune.sh" "$1" "$2" cuda 2
