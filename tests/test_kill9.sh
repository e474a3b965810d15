#!/usr/bin/env bash
# test_kill9.sh BUILD_DIR SOURCE_DIR: swin_train killed with SIGKILL over and over, resumed with
# resume=auto after each kill, must end exactly where an uninterrupted run ends.
#
# Half the kills come at random moments, half the moment a checkpoint's temp file appears (in
# the middle of a write). After every kill: every ckpt-*.safetensors in run_dir loads and
# verifies (swin_export reads it, checksum included), so no partial file ever has a final name;
# the next start removes the temp files and resumes from the newest checkpoint without skipping
# a broken one; metrics.jsonl holds whole JSON lines only. At the end the final checkpoint
# (weights, AdamW moments, step, data position) is byte-identical to the uninterrupted run's.
# SWIN_KILL9_KILLS sets the number of kills (default 30), SWIN_KILL9_SEED the random seed.
set -u
build=$(cd "$1" && pwd)
bin=$build/swin_train
fashion=/usr/share/datasets/fashion-mnist
if [ ! -d "$fashion" ]; then
  echo "SKIP: $fashion not found (apt-get install dataset-fashion-mnist)"
  exit 77
fi
kills=${SWIN_KILL9_KILLS:-30}
seed=${SWIN_KILL9_SEED:-$$}
RANDOM=$seed
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
  echo "FAIL $*"
  failures=$((failures + 1))
}

# A tiny model (a few ms per step on one thread), a checkpoint every 2 steps, an evaluation
# every 40: the run spends much of its time writing checkpoints. run_dir is relative, so both
# runs have the same config, byte for byte, in their checkpoints.
steps=1000
tiny=("$(cd "$2" && pwd)/tests/tiny_fashion.ini" run_dir=run model.drop_path_rate=0.1 train.max_steps=$steps
  train.log_every=5 train.eval_every=40)
final=$(printf 'ckpt-%08d.safetensors' "$steps")
mkdir "$tmp/ref" "$tmp/killed"
if ! (cd "$tmp/ref" && "$bin" "${tiny[@]}" resume=auto >out.txt 2>&1); then
  fail "the uninterrupted run failed:"
  tail -5 "$tmp/ref/out.txt"
  exit 1
fi

# Every final-named checkpoint in run_dir must load, checksum and all.
verify_checkpoints() {
  local f
  for f in "$tmp/killed/run"/ckpt-*.safetensors; do
    [ -e "$f" ] || continue
    if ! "$build/swin_export" "$f" "$tmp/verify.safetensors" >/dev/null 2>"$tmp/verify.err"; then
      fail "after kill $1: $(basename "$f") does not load: $(head -1 "$tmp/verify.err")"
    fi
  done
}

# Waits (busy, but only on bash builtins) until a checkpoint temp file exists or the process
# has exited.
wait_for_temp_file() {
  local pid=$1
  shopt -s nullglob
  while kill -0 "$pid" 2>/dev/null; do
    local temps=("$tmp/killed/run"/ckpt-*.safetensors.tmp)
    [ ${#temps[@]} -gt 0 ] && break
  done
  shopt -u nullglob
}

random_kills=0 write_kills=0 temps_left=0 resumes=0 finished_early=0
for ((k = 1; k <= kills; k++)); do
  had_checkpoint=0
  compgen -G "$tmp/killed/run/ckpt-*.safetensors" >/dev/null && had_checkpoint=1
  had_temp=0
  compgen -G "$tmp/killed/run/ckpt-*.safetensors.tmp" >/dev/null && had_temp=1
  out=$tmp/killed/run-$k.txt
  (cd "$tmp/killed" && exec "$bin" "${tiny[@]}" resume=auto) >"$out" 2>&1 &
  pid=$!
  if ((k % 2)); then
    # Random: between 0.3 s (start-up) and 1.2 s.
    sleep "$(printf '0.%03d' $((300 + RANDOM % 900)))"
    random_kills=$((random_kills + 1))
  else
    sleep 0.3
    wait_for_temp_file "$pid"
    write_kills=$((write_kills + 1))
  fi
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  status=$?
  if [ $status -eq 0 ]; then
    finished_early=1  # the run ended before the kill: nothing left to interrupt
    break
  fi
  [ $status -eq 137 ] || fail "kill $k: swin_train exited $status before the kill: $(tail -1 "$out")"
  compgen -G "$tmp/killed/run/ckpt-*.safetensors.tmp" >/dev/null && temps_left=$((temps_left + 1))
  grep -q "skipping checkpoint" "$out" && fail "kill $k: the start skipped a broken checkpoint"
  if grep -q '^schedule:' "$out"; then  # setup (and so the resume) completed
    if [ $had_checkpoint -eq 1 ]; then
      if grep -q '^resumed from ' "$out"; then
        resumes=$((resumes + 1))
      else
        fail "kill $k: run $k did not resume from the checkpoint in run_dir"
      fi
    fi
    if [ $had_temp -eq 1 ] && ! grep -q 'partial checkpoint file' "$out"; then
      fail "kill $k: run $k did not remove the temp file left by kill $((k - 1))"
    fi
  fi
  verify_checkpoints "$k"
done

if [ $finished_early -eq 0 ]; then
  out=$tmp/killed/run-final.txt
  if ! (cd "$tmp/killed" && "$bin" "${tiny[@]}" resume=auto >"$out" 2>&1); then
    fail "the final resumed run failed: $(tail -2 "$out")"
  fi
  grep -q '^resumed from ' "$out" && resumes=$((resumes + 1))
fi
compgen -G "$tmp/killed/run/*.tmp" >/dev/null && fail "temp files are left at the end"
if cmp -s "$tmp/ref/run/$final" "$tmp/killed/run/$final"; then
  echo "ok   after $((random_kills + write_kills)) SIGKILLs ($random_kills at random moments," \
    "$write_kills during checkpoint writes, $temps_left of them leaving a temp file) and" \
    "$resumes resumes, $final is byte-identical to the uninterrupted run's"
else
  fail "$final differs from the uninterrupted run's (or is missing)"
fi
bad_lines=$(grep -cv '^{.*}$' "$tmp/killed/run/metrics.jsonl")
[ "$bad_lines" -eq 0 ] || fail "metrics.jsonl has $bad_lines lines that are not whole JSON records"
echo "seed $seed (SWIN_KILL9_SEED reruns the same kill times)"
if [ $failures -eq 0 ]; then
  echo "1 passed, 0 failed"
else
  echo "0 passed, $failures failed"
fi
[ $failures -eq 0 ]
