#!/usr/bin/env bash
# test_finetune_v2.sh BUILD_DIR SOURCE_DIR: tests/test_finetune.sh with Swin V2 on the CPU: the
# window-4 source fine-tuned at window 6 through the continuous position bias, nothing resized.
exec bash "$(dirname "$0")/test_finetune.sh" "$1" "$2" cpu 2
