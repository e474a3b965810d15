#!/usr/bin/env bash
# test_cli.sh BUILD_DIR SOURCE_DIR: swin_train, swin_export and swin_predict as a user meets
# them: exit codes and messages for bad configs and arguments, and --dry-run's model table and
# parameter count; and test_parity's option errors.
set -u
build=$1
src=$2
bin=$build/swin_train
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

# expect NAME CODE PATTERN -- COMMAND...: the command exits with CODE and its output (stdout and
# stderr) contains PATTERN (grep -E).
expect() {
  local name=$1 code=$2 pattern=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -eq "$code" ] && grep -qE -- "$pattern" <<<"$out"; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name: exit $rc (want $code), output lacks /$pattern/:"
    sed 's/^/     | /' <<<"$out" | head -20
    failed=$((failed + 1))
  fi
}

expect "dry-run swin_tiny counts 28,288,354 parameters" 0 "parameters: 28,288,354" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini"
expect "dry-run prints the stage table" 0 "layers\.3 +7x7 +768 +2 +24 +7x7" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini"
expect "dry-run prints the resolved config" 0 "model\.embed_dim" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini"
expect "swin_base_384.ini: Swin-B at 384 / window 12" 0 "parameters: 87,903,584" -- \
  "$bin" --dry-run "$src/configs/swin_base_384.ini"
expect "swin_large_384.ini: Swin-L at 384 / window 12" 0 "parameters: 196,735,516" -- \
  "$bin" --dry-run "$src/configs/swin_large_384.ini"
expect "dry-run of the default config" 0 "parameters:" -- \
  "$bin" --dry-run "$src/configs/fashion_mnist.ini"
expect "override changes the model" 0 "model: Swin, image 224x224x3, patch 4, embed 64" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini" model.embed_dim=64 model.num_heads=2,4,8,16
expect "--keys lists every key" 0 "train\.lr" -- "$bin" --keys
expect "no arguments prints usage" 2 "usage: swin_train" -- "$bin"
expect "unknown option" 2 "unknown option '--frobnicate'" -- "$bin" --frobnicate x.ini
expect "missing config file" 1 "nope\.ini" -- "$bin" --dry-run "$tmp/nope.ini"

printf '[model]\nembd_dim = 96\n' >"$tmp/typo.ini"
expect "unknown key names file:line and suggests" 1 "typo\.ini:2: unknown key 'model\.embd_dim'.*" -- \
  "$bin" --dry-run "$tmp/typo.ini"
expect "unknown key hint" 1 "did you mean 'model\.embed_dim'" -- "$bin" --dry-run "$tmp/typo.ini"
printf '[train]\nlr = fast\n' >"$tmp/badval.ini"
expect "bad value names key and line" 1 "badval\.ini:2: bad value 'fast' for key 'train\.lr'" -- \
  "$bin" --dry-run "$tmp/badval.ini"
expect "bad override names the command line" 1 "command line.*model\.depths" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini" model.depths=2,x
expect "override without =" 1 "key=value" -- "$bin" --dry-run "$src/configs/swin_tiny.ini" train.lr
expect "a batch that does not split into train.accum_steps micro-batches" 1 \
  "train\.batch_size = 1024 does not divide into train\.accum_steps = 3 micro-batches" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini" train.accum_steps=3
expect "gradient accumulation: the start-up line says the split" 0 \
  "batch: 16 images a step = 4 micro-batches x 4 \(train\.accum_steps = 4" -- \
  "$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic device=cpu train.accum_steps=4 \
  train.max_steps=2 run_dir="$tmp/accum"
expect "gradient accumulation: each progress line says it too" 0 "^2 lines$" -- \
  bash -c 'echo "$("$1" "$2" data.dataset=synthetic device=cpu train.accum_steps=4 train.max_steps=2 run_dir="$3" | grep -c "step [12]/2 .*  batch 16 = 4 x 4") lines"' \
  _ "$bin" "$src/tests/tiny_fashion.ini" "$tmp/accum_progress"
expect "heads must divide the width" 1 "num_heads\[1\]" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini" model.num_heads=3,5,12,24
expect "image must tile into patches" 1 "patch_size" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini" model.img_size=226
expect "stage maps must tile into windows" 1 "window" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini" model.window_size=6
expect "bf16 on the CPU is rejected" 1 "precision=bf16 needs the CUDA backend" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini" device=cpu precision=bf16
expect "train.layer_decay must be in (0, 1]" 1 "bad value '1\.5' for key 'train\.layer_decay'" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini" train.layer_decay=1.5
expect "train.ema_decay must be below 1" 1 "bad value '1' for key 'train\.ema_decay'" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini" train.ema_decay=1
expect "train.ema_warmup without an EMA" 1 "train\.ema_warmup = true .* but train\.ema_decay = 0 keeps none" -- \
  "$bin" --dry-run "$src/configs/swin_tiny.ini" train.ema_warmup=true
expect "missing dataset directory" 1 "data\.path" -- \
  "$bin" "$src/configs/fashion_mnist.ini" data.path="$tmp/none" run_dir="$tmp/run"

expect "swin_export usage" 2 "usage: swin_export" -- "$build/swin_export"
expect "swin_export refuses a missing checkpoint" 1 "missing\.safetensors" -- \
  "$build/swin_export" "$tmp/missing.safetensors" "$tmp/out.safetensors"
expect "swin_export refuses a bad dtype" 2 "dtype=bf16" -- \
  "$build/swin_export" a b dtype=f64
expect "swin_export usage names the ONNX form" 2 "OUT\.onnx \[dtype=f32\|f16\] \[batch=dynamic\|N\]" -- \
  "$build/swin_export"
expect "swin_export .onnx refuses bf16" 2 "HINT: dtype=f32 or dtype=f16 \(ONNX\)" -- \
  "$build/swin_export" a b.onnx dtype=bf16
expect "swin_export .onnx refuses a bad batch" 2 "bad argument 'batch=-3'" -- \
  "$build/swin_export" a b.onnx batch=-3
expect "swin_export batch= needs an ONNX output" 2 "applies only to ONNX output" -- \
  "$build/swin_export" a b.safetensors batch=4
expect "swin_export refuses a bad weights=" 2 "bad argument 'weights=average'" -- \
  "$build/swin_export" a b.safetensors weights=average
expect "swin_export usage names weights=" 2 "\[weights=model\|ema\]" -- "$build/swin_export"
expect "swin_export .onnx refuses a missing checkpoint" 1 "missing\.safetensors" -- \
  "$build/swin_export" "$tmp/missing.safetensors" "$tmp/out.onnx" dtype=f16 batch=2

fixture="$src/tests/fixtures/shifted_two_stages.safetensors"
expect "swin_predict usage" 2 "usage: swin_predict" -- "$build/swin_predict"
expect "swin_predict usage names the image form" 2 "swin_predict MODEL IMAGE\|DIR" -- "$build/swin_predict"
expect "swin_predict names a missing model file" 1 "nothing\.safetensors" -- \
  "$build/swin_predict" "$tmp/nothing.safetensors" "$fixture" "$tmp/out.safetensors"
expect "swin_predict refuses a file that is not a model, naming the tensor" 1 \
  "tensor 'input' does not exist in this model" -- \
  "$build/swin_predict" "$fixture" "$fixture" "$tmp/out.safetensors"
expect "swin_predict needs the input tensor" 1 "needs tensor 'input' F32 \(B, 32, 32, 3\)" -- \
  "$build/swin_predict" "$fixture" "$src/tests/fixtures/rect_three_stages.safetensors" \
  "$tmp/out.safetensors"
# key=value after OUT applies to a checkpoint's own config too (no CONFIG.ini).
"$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic train.max_steps=2 device=cpu \
  run_dir="$tmp/predict" >/dev/null 2>&1
ckpt="$tmp/predict/ckpt-00000002.safetensors"
expect "swin_predict applies key=value to a checkpoint's config" 1 "command line: unknown key 'no\.such_key'" -- \
  "$build/swin_predict" "$ckpt" "$fixture" "$tmp/out.safetensors" no.such_key=1
expect "swin_predict with device=cpu reads the checkpoint's geometry" 1 \
  "needs tensor 'input' F32 \(B, 16, 16, 1\)" -- \
  "$build/swin_predict" "$ckpt" "$fixture" "$tmp/out.safetensors" device=cpu

# bench=e2e: the configured data and loader, timed end to end beside the resident step; it
# writes nothing. Training says how the loader was sized and how long the device waited.
expect "bench=e2e prints its JSON line" 0 '^\{"bench": "e2e", "dataset": "synthetic".*"img_s": [0-9.]+, "synthetic_img_s": [0-9.]+, "ratio": [0-9.]+, "data_wait": [0-9.]+, "stages_ms": \{"read": ' -- \
  "$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic device=cpu bench=e2e \
  bench.steps=40 bench.warmup=2 run_dir="$tmp/e2e"
expect "bench=e2e crosses epochs and names the resident step an upper bound" 0 \
  "40 timed steps \(2 epochs of 32 steps\).*|resident batch .*upper bound" -- \
  "$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic device=cpu bench=e2e \
  bench.steps=40 bench.warmup=2 run_dir="$tmp/e2e"
expect "bench=e2e writes no run_dir" 0 "^absent$" -- \
  bash -c '[ -e "$1" ] && echo present || echo absent' _ "$tmp/e2e"
expect "bench refuses an unknown mode" 1 "bad value 'fast' for key 'bench'" -- \
  "$bin" --dry-run "$src/tests/tiny_fashion.ini" bench=fast
# train.recompute: the start-up lines say what is rebuilt and what it saves; bench=1 runs with it.
expect "train.recompute=all: the memory table shows what it saved" 0 \
  "activations +[0-9.]+ MiB +\(recompute all: -[0-9.]+ MiB\)" -- \
  "$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic device=cpu train.recompute=all \
  train.max_steps=1 run_dir="$tmp/recompute"
expect "train.recompute=1: the start-up line names the blocks" 0 \
  "^recompute: the first 1 block of each stage, 2 of 4 \(train\.recompute=1\)" -- \
  "$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic device=cpu train.recompute=1 \
  train.max_steps=1 run_dir="$tmp/recompute1"
expect "bench=1 with train.recompute=all prints img/s and the activations it saved" 0 \
  "activations \(GiB\) +[0-9.]+ +\(train\.recompute: 4 of 4 blocks rebuilt in the backward" -- \
  "$bin" "$src/tests/tiny_fashion.ini" device=cpu bench=1 bench.steps=10 bench.warmup=1 \
  train.recompute=all
expect "bench=1's JSON counts the recomputed blocks" 0 '"img_s": [0-9.]+.*"recomputed_blocks": 4' -- \
  "$bin" "$src/tests/tiny_fashion.ini" device=cpu bench=1 bench.steps=10 bench.warmup=1 \
  train.recompute=all
expect "train.recompute refuses a bad value with both forms" 1 \
  "HINT: expected one of: none, all, or an integer at least 0" -- \
  "$bin" --dry-run "$src/tests/tiny_fashion.ini" train.recompute=some
expect "data.workers = 0 sizes the loader from the cores" 0 \
  "loader: [0-9]+ workers? \(auto: [0-9]+ cores? for this process.*a ring of [0-9]+ batches \(auto: workers \+ 2\)" -- \
  "$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic device=cpu data.workers=0 \
  train.max_steps=2 run_dir="$tmp/auto_workers"
expect "the progress line carries the data wait" 0 "step 2/2 .* img/s [0-9]+  data [0-9]+%" -- \
  "$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic device=cpu train.max_steps=2 \
  run_dir="$tmp/data_wait"
expect "metrics.jsonl carries the data wait" 0 '"data_wait": [0-9.]+' -- \
  cat "$tmp/data_wait/metrics.jsonl"

# Fine-tuning a checkpoint at another image and window size: its weights without the optimizer
# state, each bias table resized with a notice.
expect "init_from a checkpoint at window 6 resizes the bias tables" 0 \
  "layers\.1\.blocks\.1\.attn\.relative_position_bias_table resized from window 4x4 to 6x6.*a swin.c checkpoint's weights, without its optimizer state" -- \
  bash -c '"$@" 2>&1 | tr "\n" " "' _ "$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic device=cpu \
  train.max_steps=1 init_from="$ckpt" model.img_size=24 model.window_size=6 run_dir="$tmp/finetune"

# eval = true: the given weights on the val split, one metrics record, no step, no checkpoint.
expect "eval=1 evaluates a checkpoint and exits" 0 \
  "eval: top1 [0-9.]+%  top5 [0-9.]+%  loss [0-9.]+  \([0-9]+ images in .* img/s; weights resume=.*ckpt-00000002.safetensors, step 2\)" -- \
  "$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic device=cpu eval=1 resume="$ckpt" \
  run_dir="$tmp/eval"
expect "eval=1 writes one eval_only record and no checkpoint" 0 "^1 record, 0 checkpoints$" -- \
  bash -c 'echo "$(grep -c "\"eval_only\": true" "$1/metrics.jsonl") record, $(ls "$1" | grep -c "^ckpt-") checkpoints"' _ "$tmp/eval"
expect "eval=1 needs weights" 1 "eval = true evaluates given weights, but neither init_from nor resume is set" -- \
  "$bin" --dry-run "$src/tests/tiny_fashion.ini" eval=1
expect "eval=1 with resume=auto and no checkpoint" 1 "resume=auto found no checkpoint" -- \
  "$bin" "$src/tests/tiny_fashion.ini" data.dataset=synthetic device=cpu eval=1 resume=auto \
  run_dir="$tmp/eval_empty"

# configs/README.md's key reference is the program's own.
readme_keys=$(sed -n '/<!-- keys:begin -->/,/<!-- keys:end -->/p' "$src/configs/README.md" | sed '1d;$d')
expect "configs/README.md key reference matches swin_train --keys" 0 "^same$" -- \
  bash -c '[ "$1" = "$2" ] && echo same || diff <(echo "$1") <(echo "$2")' _ "$readme_keys" "$("$bin" --keys)"

# test_parity's own options (the timm fixtures on another device or precision).
expect "test_parity: an unknown option is refused" 2 "HINT: test_parity \[--device" -- \
  "$build/test_parity" --dev cuda
expect "test_parity: bf16 on the CPU is refused" 2 "HINT: cpu with fp32" -- \
  "$build/test_parity" --device cpu --precision bf16

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
