#!/usr/bin/env bash
# test_finetune_v2_w16.sh BUILD_DIR SOURCE_DIR: tests/test_finetune.sh with Swin V2 on the CPU at
# V2's fine-tuning step of window 8 -> 16 (patch 1, 16 px): the position-bias MLP trained on
# offsets up to 7 gives the bias of offsets up to 15, nothing resized.
exec bash "$(dirname "$0")/test_finetune.sh" "$1" "$2" cpu 2 8to16
