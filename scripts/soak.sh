#!/usr/bin/env bash
# Soak: a long CPU run of a tiny model with a checkpoint every 100 steps and an evaluation every
# 1000, sampling the trainer's resident memory, open file descriptors and threads, to show that
# none of them grows with the number of steps, checkpoints or evaluations.
#   bash scripts/soak.sh [BUILD_DIR] [STEPS] [OUT_DIR]     (defaults: build 20000 a temp dir)
# Writes OUT_DIR/soak.tsv (elapsed_s step rss_kb fds threads) and prints a summary. Fails when,
# after the first 10% of the steps (allocations settle), resident memory grows by more than
# 4 MiB, the descriptor count moves by more than the 2 a checkpoint write holds for a moment, the
# run fails, or run_dir holds anything but the newest ckpt.keep (3) checkpoints at the end.
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
steps=${2:-20000}
out=${3:-$(mktemp -d)}
mkdir -p "$out"
fashion=/usr/share/datasets/fashion-mnist
[ -d "$fashion" ] || { echo "soak: $fashion not found (apt-get install dataset-fashion-mnist)"; exit 2; }
run=$out/run
rm -rf "$run"
tiny=("$(cd "$(dirname "$0")/.." && pwd)/tests/tiny_fashion.ini" run_dir="$run"
  train.max_steps="$steps" train.warmup_epochs=1 train.log_every=100 train.eval_every=1000
  ckpt.every=100)

"$build/swin_train" "${tiny[@]}" >"$out/train.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null' EXIT
set +e  # sampling races with the run (files appear, the process ends): a missed sample is fine
start_ns=$(date +%s%N)
printf 'elapsed_s\tstep\trss_kb\tfds\tthreads\n' >"$out/soak.tsv"
while kill -0 "$pid" 2>/dev/null; do
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  threads=$(awk '/^Threads:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
  fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
  step=$(tail -n 1 "$run/metrics.jsonl" 2>/dev/null | sed -n 's/^{"step": \([0-9]*\).*/\1/p')
  [ -n "$rss" ] && printf '%d\t%s\t%s\t%s\t%s\n' $((($(date +%s%N) - start_ns) / 1000000000)) \
    "${step:-0}" "$rss" "$fds" "$threads" >>"$out/soak.tsv"
  sleep 1
done
wait "$pid"
rc=$?
trap - EXIT
set -e
elapsed=$((($(date +%s%N) - start_ns) / 1000000000))

# After the first 10% of the steps: first, last, lowest and highest samples.
summary=$(awk -v warm=$((steps / 10)) 'NR > 1 && $2 >= warm {
    if (!n++) { rss0 = $3; fd_lo = fd_hi = $4; th_lo = th_hi = $5; rss_hi = $3 }
    rss1 = $3; if ($3 > rss_hi) rss_hi = $3
    if ($4 < fd_lo) fd_lo = $4; if ($4 > fd_hi) fd_hi = $4
    if ($5 < th_lo) th_lo = $5; if ($5 > th_hi) th_hi = $5 }
  END { print n + 0, rss0 + 0, rss1 + 0, rss_hi + 0, fd_lo + 0, fd_hi + 0, th_lo + 0, th_hi + 0 }' \
  "$out/soak.tsv")
read -r samples rss_first rss_last rss_max fd_lo fd_hi th_lo th_hi <<<"$summary"
left=$(cd "$run" && ls ckpt-*.safetensors 2>/dev/null | tr '\n' ' ')
want=$(for s in $((steps - 200)) $((steps - 100)) "$steps"; do printf 'ckpt-%08d.safetensors ' "$s"; done)
echo "soak: $steps steps, exit $rc, $elapsed s, $samples samples after step $((steps / 10))"
echo "soak: resident memory ${rss_first} kB at the first sample, ${rss_last} kB at the last, ${rss_max} kB at most"
echo "soak: open descriptors ${fd_lo}..${fd_hi}, threads ${th_lo}..${th_hi}"
echo "soak: checkpoints left: $left"
echo "soak: samples in $out/soak.tsv, log in $out/train.log"
ok=1
[ "$rc" -eq 0 ] || { echo "soak: FAIL swin_train exited $rc: $(tail -2 "$out/train.log")"; ok=0; }
[ "$samples" -ge 2 ] || { echo "soak: FAIL too few samples"; ok=0; }
[ $((rss_max - rss_first)) -le 4096 ] || { echo "soak: FAIL resident memory grew by $((rss_max - rss_first)) kB"; ok=0; }
[ $((fd_hi - fd_lo)) -le 2 ] || { echo "soak: FAIL open descriptors moved between $fd_lo and $fd_hi"; ok=0; }
[ "$left" = "$want" ] || { echo "soak: FAIL run_dir holds '$left', want '$want'"; ok=0; }
[ $ok -eq 1 ] && echo "soak: ok"
[ $ok -eq 1 ]
