#!/usr/bin/env bash
# test_gpu_finetune_v2_w16.sh BUILD_DIR SOURCE_DIR: tests/test_finetune.sh's V2 window 8 -> 16
# fine-tune (tests/test_finetune_v2_w16.sh) with device=cuda (fp32), skipped (exit 77) when no
# GPU is usable.
exec bash "$(dirname "$0")/test_finetune.sh" "$1" "$2" cuda 2 8to16
