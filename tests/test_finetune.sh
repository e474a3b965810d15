#!/usr/bin/env bash
# test_finetune.sh BUILD_DIR SOURCE_DIR [DEVICE [VERSION [GEOMETRY]]]: fine-tuning at another
# window and image size, as a user does it, on DEVICE (cpu, the default, or cuda:
# tests/test_gpu_finetune.sh) with Swin VERSION (1, the default, or 2: tests/test_finetune_v2.sh).
# GEOMETRY 4to6 (the default): the tiny model (tests/tiny_fashion.ini) trains on Fashion-MNIST at
# 16 px / window 4; init_from loads it at 24 px / window 6 (V1: each relative_position_bias_table
# resized bicubically; V2: nothing to resize, the position-bias MLP takes the new window's
# coordinates, normalized by the source's windows through model.pretrained_window_sizes=4, and
# without that key init_from says which value keeps them). GEOMETRY 8to16 (V2 only,
# tests/test_finetune_v2_w16.sh): the window doubles as in V2's recipes (8 -> 16): patch 1, 16 px,
# the source in windows of 8 (shifted by 4 in stage 0; stage 1's 8x8 map is one window), the
# fine-tune in one window of 16 in stage 0 (stage 1 stays 8, clamped to its map), so the MLP
# sees relative offsets up to 15 it never saw in training (normalized by 8 - 1). Then:
#   - eval=1 of the source at its own geometry gives L_src, clearly below chance (ln 10), and the
#     source run's own last evaluation to the digit;
#   - eval=1 of the resized model gives L_ft, with a notice per resized table, and L_ft keeps at
#     least a quarter of the source's gain over chance;
#   - the fine-tune starts where the interpolated model puts it: its evaluation after a first
#     step at learning rate 0 is L_ft to the digit, its first training loss is L_ft within
#     sampling noise, and the same run without init_from starts near chance instead;
#   - the fine-tune trains: its val loss after 8 steps is below its start.
# Every image is seen at its native scale (28 px items cut, never resized: 16x16 crops for the
# source, 24x24 for the fine-tune), so the larger image shows more of each item at the same
# pixel scale and the resized tables are what carries over. Resizing 28 -> 16 and 28 -> 24
# instead changes the pixel scale 1.5x under 2x2 patches; measured over seeds, L_ft then kept
# 6-62% of the source's gain, native crops 44-86%.
# The dataset comes from SWIN_FASHION_DIR or /usr/share/datasets/fashion-mnist.
set -u
build=$1
src=$2
device=${3:-cpu}
version=${4:-1}
geometry=${5:-4to6}
case "$version/$geometry" in
  1/4to6 | 2/4to6 | 2/8to16) ;;
  *) echo "FAIL test_finetune.sh: no geometry $geometry for version $version (4to6; 8to16 for V2)"
     exit 1 ;;
esac
bin=$build/swin_train
fashion=${SWIN_FASHION_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -e "$fashion/train-images-idx3-ubyte.gz" ] && [ ! -e "$fashion/train-images-idx3-ubyte" ]
then
  echo "SKIP: Fashion-MNIST not found in $fashion (apt-get install dataset-fashion-mnist)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

# With device=cuda and no usable GPU (none, no driver, or a build without the CUDA backend),
# swin_train refuses with the backend's message, the one check gpu_test_require_device makes for
# the C tests: that skips. Any other failure of the probe is a failure.
if [ "$device" != cpu ]; then
  probe=$("$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic device="$device" \
    train.max_steps=1 run_dir="$tmp/probe" 2>&1)
  if [ $? -ne 0 ]; then
    if grep -qE "no CUDA GPU is usable|this build has no CUDA backend" <<<"$probe"; then
      echo "SKIP: no usable GPU: $(grep -m1 '^error:' <<<"$probe")"
      exit 77
    fi
    echo "FAIL swin_train device=$device does not start:"
    sed 's/^/     | /' <<<"$probe" | tail -20
    exit 1
  fi
fi

# train NAME ARGS...: swin_train with the shared arguments, output in $tmp/NAME.log, run_dir
# $tmp/NAME. A run that fails ends the test: every check after it reads its records.
train() {
  local name=$1
  shift
  if ! "$bin" "${common[@]}" run_dir="$tmp/$name" "$@" >"$tmp/$name.log" 2>&1; then
    echo "FAIL $name: swin_train exited non-zero:"
    sed 's/^/     | /' "$tmp/$name.log" | tail -20
    echo "$passed passed, $((failed + 1)) failed"
    exit 1
  fi
}

# record NAME STEP KEY: the number KEY of the metrics.jsonl record of STEP in $tmp/NAME that
# has KEY (a step has a training record and an evaluation record).
record() {
  grep "^{\"step\": $2," "$tmp/$1/metrics.jsonl" | grep -m1 "\"$3\"" |
    sed -E "s/.*\"$3\": ([-+.e0-9]+).*/\1/"
}

# check NAME CONDITION VALUES: the awk condition (on the numbers it names) holds.
check() {
  local name=$1 condition=$2 values=$3
  if awk "BEGIN { exit !($condition) }" 2>/dev/null; then
    echo "ok   $name ($values)"
    passed=$((passed + 1))
  else
    echo "FAIL $name: want $condition ($values)"
    failed=$((failed + 1))
  fi
}

# Shared by every run: 512 val images (the first 512 of the test split, in order: one fixed
# set, so the same weights give the same loss), no drop path (the training forward is then the
# evaluation's), square crops.
common=("$src/tests/tiny_fashion.ini" device="$device" data.path="$fashion" data.val_limit=512
  data.ratio=1,1 model.drop_path_rate=0 model.version="$version")
ln10=2.302585

# The source: 600 steps of 32 random 16x16 crops (scale 16^2/28^2), hflip; evaluated on the
# center 16x16 crop (crop_pct 16/28, just above so that floor(16 / crop_pct) = 28). One
# checkpoint, at the end.
src_geometry=(data.crop_pct=0.5714)
if [ "$geometry" = 8to16 ]; then
  common+=(model.patch_size=1)
  src_geometry+=(model.window_size=8)
fi
train source "${src_geometry[@]}" data.train_limit=8192 data.scale=0.3265,0.3265 \
  train.batch_size=32 train.max_steps=600 train.lr=5e-3 train.log_every=100 ckpt.every=1000000
ckpt=$tmp/source/ckpt-00000600.safetensors

# L_src: the checkpoint at its own geometry. Chance is ln 10 = 2.303; 600 steps reach 1.2-1.3
# (six seeds on the CPU), so 1.8 leaves half a nat of margin.
train eval_source "${src_geometry[@]}" eval=1 resume="$ckpt"
l_src=$(record eval_source 600 eval_loss)
check "the source learned: L_src well below ln 10" "$l_src < 1.8" "L_src $l_src"
# The same weights on the same images and device: the same loss, to the six printed digits.
last=$(record source 600 eval_loss)
check "eval=1 of the checkpoint is the source run's last evaluation" "$l_src == $last" \
  "$l_src, run $last"

# The fine-tune geometry: 24 px, window 6 (12x12 and 6x6 token maps), the center 24x24 crop,
# random crops of 24x24 (scale 24^2/28^2); or (8to16) the source's 16 px crops in window 16.
# V2 normalizes the position-bias coordinates by the source's windows (pretrained, in both
# stages).
if [ "$geometry" = 8to16 ]; then
  ft_geometry=(model.img_size=16 model.window_size=16 data.crop_pct=0.5714)
  ft_scale=0.3265
  pretrained=8
else
  ft_geometry=(model.img_size=24 model.window_size=6 data.crop_pct=0.8571)
  ft_scale=0.7347
  pretrained=4
fi
[ "$version" = 2 ] && ft_geometry+=(model.pretrained_window_sizes=$pretrained)

# L_ft: the source's weights at 24 px / window 6 (V1: four bias tables resized 4x4 -> 6x6).
train eval_ft "${ft_geometry[@]}" eval=1 init_from="$ckpt"
l_ft=$(record eval_ft 0 eval_loss)
if [ "$version" = 2 ]; then
  resized=$(grep -c "resized" "$tmp/eval_ft.log")
  check "V2: init_from resizes nothing (the position-bias MLP is continuous)" "$resized == 0" \
    "$resized resize notices"
  train eval_ft_own "${ft_geometry[@]::3}" eval=1 init_from="$ckpt"
  notices=$(grep -c \
    "^init_from: notice: .*set model.pretrained_window_sizes=$pretrained,$pretrained to keep" \
    "$tmp/eval_ft_own.log")
  check "V2 without model.pretrained_window_sizes: init_from names the value that keeps the \
source's coordinates" "$notices == 1" "$notices notices"
else
  table='layers\.[01]\.blocks\.[01]\.attn\.relative_position_bias_table'
  notices=$(grep -cE "^init_from: notice: $table resized from window 4x4 to 6x6" "$tmp/eval_ft.log")
  check "init_from resizes all four bias tables, a notice each" "$notices == 4" "$notices notices"
fi
# Far from chance. "Closer to L_src than to ln 10" (half the gain kept) is too near what was
# measured to hold on every device's trajectory: over twelve sources (six seeds each at 600 and
# 1000 steps) L_ft kept 44-86% of the gain. A quarter holds on all of them and still lies 0.2
# nats below a fresh model's start (the control below).
bar=$(awk "BEGIN { printf \"%.6f\", $ln10 - ($ln10 - $l_src) / 4 }")
check "the resized model keeps a quarter of the gain: L_ft < ln10 - (ln10 - L_src)/4" \
  "$l_ft < $bar" "L_ft $l_ft, bar $bar"

# The fine-tune: 8 steps of 128 random 24x24 crops, no flip, no label smoothing (the training
# loss is then the evaluation's cross-entropy on other images), an evaluation after every
# step. warmup_lr 0 with 2 warmup steps (0.0625 of 32 steps per epoch) makes the first step's
# rate exactly 0: AdamW then leaves every weight as it is (p * (1 - 0 * wd) - 0 * update), so
# the evaluation after step 1 is the starting model's.
ft_run=("${ft_geometry[@]}" data.train_limit=4096 data.scale=$ft_scale,$ft_scale data.hflip=0
  train.label_smoothing=0 train.batch_size=128 train.max_steps=8 train.lr=1e-3 train.warmup_lr=0
  train.warmup_epochs=0.0625 train.eval_every=1 ckpt.every=1000000)
train finetune "${ft_run[@]}" init_from="$ckpt"
start=$(record finetune 1 eval_loss)
first=$(record finetune 1 loss)
end=$(record finetune 8 eval_loss)
check "the fine-tune starts at L_ft: its eval after the lr-0 step equals eval=1's" \
  "$start == $l_ft" "start $start, L_ft $l_ft"
# Its first training loss is the starting model on 128 train-split crops instead of the 512
# val images: over 12 seeds it differed from L_ft by +0.047 on average, sd 0.065, at most 0.16.
check "the fine-tune's first training loss is L_ft within sampling noise (0.3)" \
  "$first - $l_ft < 0.3 && $l_ft - $first < 0.3" "first $first, L_ft $l_ft"
check "the fine-tune trains: val loss after 8 steps below its start" "$end < $start" \
  "start $start, end $end"

# The control: the same run without init_from (one step: only its start is read) starts near
# chance, above the bar the interpolated model is under. A fresh model starts at 2.29.
train fresh "${ft_run[@]}" train.max_steps=1
fresh_start=$(record fresh 1 eval_loss)
fresh_first=$(record fresh 1 loss)
check "without init_from the same fine-tune starts above the bar" \
  "$fresh_start > $bar && $fresh_first > $bar" \
  "eval $fresh_start, first loss $fresh_first, bar $bar"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
