#!/usr/bin/env bash
# same_bits.sh OLD_BUILD NEW_BUILD CONFIG [key=value ...]: the check that a change left behaviour
# unchanged: trains CONFIG with the same seed and overrides with two builds' swin_train (e.g. the
# commit before a refactor and after it) into two run directories, then compares their
# metrics.jsonl (every loss, accuracy and learning rate; the timing fields dropped) and the bytes
# of their newest checkpoints. Prints "same bits" and exits 0, or shows the first differences and
# exits 1. Runs go under $OUT (default /tmp/same_bits), the run directory run_dir=$OUT/run.
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: same_bits.sh OLD_BUILD NEW_BUILD CONFIG [key=value ...]" >&2
  exit 2
fi
old=$1 new=$2 config=$3
shift 3
out=${OUT:-/tmp/same_bits}
for side in old new; do
  build=$old
  [ $side = new ] && build=$new
  # One run directory for both (a checkpoint stores its config, run_dir included), moved aside.
  rm -rf "$out/$side" "$out/run"
  mkdir -p "$out"
  if ! "$build/swin_train" "$config" "$@" run_dir="$out/run" >"$out/$side.log" 2>&1; then
    echo "FAIL: $side build's run failed (see $out/$side.log)"
    tail -5 "$out/$side.log"
    exit 1
  fi
  mv "$out/run" "$out/$side"
done
# Keep the fields that depend on the numbers only (no times, throughputs or waits).
strip() {
  sed -E 's/"(img_per_s|step_ms|time_s|elapsed_s|data_wait|wall_s|[a-z_]*_ms|[a-z_]*_s)": *[-0-9.eE+]+,? *//g' "$1"
}
status=0
if ! diff <(strip "$out/old/metrics.jsonl") <(strip "$out/new/metrics.jsonl") >"$out/metrics.diff"; then
  echo "FAIL: metrics differ:"
  head -6 "$out/metrics.diff"
  status=1
fi
newest() { ls -1 "$1"/ckpt-*.safetensors 2>/dev/null | sort | tail -1; }
a=$(newest "$out/old") b=$(newest "$out/new")
if [ -z "$a" ] || [ -z "$b" ]; then
  echo "FAIL: no checkpoint in $out/old or $out/new"
  status=1
elif ! cmp -s "$a" "$b"; then
  echo "FAIL: checkpoints $(basename "$a") and $(basename "$b") differ"
  status=1
fi
if [ $status -eq 0 ]; then
  echo "same bits: $(wc -l <"$out/new/metrics.jsonl") metrics records and checkpoint $(basename "$b") ($(stat -c %s "$b") bytes) identical"
fi
exit $status
