#!/usr/bin/env bash
# test_faults.sh BUILD_DIR SOURCE_DIR: swin_train when its files cannot be written, and when
# another run holds its directory. Faults are injected for real:
#   - a file size limit (ulimit -f: EFBIG) hit by a checkpoint, then by metrics.jsonl;
#   - a full disk (ENOSPC): a 1 MB tmpfs, mounted in a private mount namespace (unshare);
#   - a read-only run_dir: a read-only tmpfs at start (EROFS), and a directory made read-only
#     in the middle of a run (EACCES; the run is started as an unprivileged user when the test
#     runs as root, since root may write anyway);
#   - a second swin_train on a run_dir in use, and a holder killed with SIGKILL.
# Every failed write must stop the run with exit code 1 and a message that names the file and
# the cause, and leave the checkpoints already written intact (they still load, checksum
# included) with no temp file behind. A fault that this machine cannot inject (no unshare, no
# unprivileged user) is reported as SKIP, and the rest still runs.
set -u
build=$(cd "$1" && pwd)
bin=$build/swin_train
fashion=/usr/share/datasets/fashion-mnist
if [ ! -d "$fashion" ]; then
  echo "SKIP: $fashion not found (apt-get install dataset-fashion-mnist)"
  exit 77
fi
tmp=$(mktemp -d)
chmod 755 "$tmp"  # an unprivileged user runs swin_train in here too
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0 skipped=0
check() {  # check NAME CONDITION-EXIT-STATUS [DETAIL]
  if [ "$2" -eq 0 ]; then
    echo "ok   $1"
    passed=$((passed + 1))
  else
    echo "FAIL $1${3:+: $3}"
    failed=$((failed + 1))
  fi
}
skip() {
  echo "SKIP $1"
  skipped=$((skipped + 1))
}

# The tiny model of the shell tests (a checkpoint is 443,624 bytes), copied where the
# unprivileged user can read it.
cp "$2/tests/tiny_fashion.ini" "$tmp/tiny.ini"

# Checkpoints in a run_dir load (checksum and all) and no temp file is left: "intact".
intact() {
  local dir=$1 f
  compgen -G "$dir/*.tmp" >/dev/null && return 1
  for f in "$dir"/ckpt-*.safetensors; do
    [ -e "$f" ] || return 1
    "$build/swin_export" "$f" "$tmp/verify.safetensors" >/dev/null 2>&1 || return 1
  done
  return 0
}

# expect_failure NAME OUT PATTERN...: the run's output names every pattern (grep -E).
expect_message() {
  local name=$1 out=$2 missing=""
  shift 2
  for p in "$@"; do grep -qE -- "$p" "$out" || missing="$missing /$p/"; done
  check "$name" $([ -z "$missing" ] && echo 0 || echo 1) "output lacks$missing: $(grep error "$out" | head -3)"
}

# ---- file size limit (EFBIG) ----
run=$tmp/efbig
"$bin" "$tmp/tiny.ini" run_dir="$run" >"$tmp/efbig-1.txt" 2>&1
check "a normal run writes ckpt 2 and 4" $([ -e "$run/ckpt-00000004.safetensors" ] && echo 0 || echo 1)
cp "$run/ckpt-00000004.safetensors" "$tmp/ckpt4.copy"
# 200 KiB: room for the lock and metrics, not for a 433 KiB checkpoint.
(ulimit -f 200 && exec "$bin" "$tmp/tiny.ini" run_dir="$run" resume=auto train.max_steps=8) \
  >"$tmp/efbig-2.txt" 2>&1
rc=$?
check "EFBIG on a checkpoint: exit 1" $([ $rc -eq 1 ] && echo 0 || echo 1) "exit $rc"
expect_message "EFBIG on a checkpoint: the message names the file, the cause and a fix" \
  "$tmp/efbig-2.txt" "ckpt-00000006\.safetensors" "File too large" "HINT: .*size limit" \
  "earlier checkpoints in run_dir are untouched"
cmp -s "$run/ckpt-00000004.safetensors" "$tmp/ckpt4.copy"
check "EFBIG: the previous checkpoint is byte-identical" $?
intact "$run"
check "EFBIG: checkpoints load, no temp file is left" $?
"$bin" "$tmp/tiny.ini" run_dir="$run" resume=auto train.max_steps=6 >"$tmp/efbig-3.txt" 2>&1
rc=$?
grep -q "resumed from $run/ckpt-00000004.safetensors" "$tmp/efbig-3.txt"
check "EFBIG: without the limit the run resumes from step 4" $(($? + rc))

# metrics.jsonl over the limit: a limit 1 KiB above its size, no checkpoint before the end.
# The output goes through a pipe, which the limit does not apply to (a log file would be cut).
size_kb=$(($(stat -c %s "$run/metrics.jsonl") / 1024 + 1))
(ulimit -f "$size_kb" && exec "$bin" "$tmp/tiny.ini" run_dir="$run" resume=auto \
  train.max_steps=200 ckpt.every=1000) 2>&1 | cat >"$tmp/efbig-4.txt"
rc=${PIPESTATUS[0]}
check "EFBIG on metrics.jsonl: exit 1" $([ $rc -eq 1 ] && echo 0 || echo 1) "exit $rc"
expect_message "EFBIG on metrics.jsonl: the message names the file and the cause" \
  "$tmp/efbig-4.txt" "cannot write to '$run/metrics.jsonl'" "File too large"
intact "$run"
check "EFBIG on metrics: checkpoints intact" $?

# ---- a second run on the same run_dir, and a killed holder ----
run=$tmp/lock
"$bin" "$tmp/tiny.ini" run_dir="$run" train.max_steps=100000 >"$tmp/lock-1.txt" 2>&1 &
holder=$!
for ((i = 0; i < 300; i++)); do
  grep -qx "$holder" "$run/.lock" 2>/dev/null && break
  sleep 0.1
done
start=$(date +%s%N)
"$bin" "$tmp/tiny.ini" run_dir="$run" >"$tmp/lock-2.txt" 2>&1
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
check "a second run on a run_dir in use: exit 1" $([ $rc -eq 1 ] && echo 0 || echo 1) "exit $rc"
expect_message "... the message names the directory and the holder's pid" "$tmp/lock-2.txt" \
  "run_dir '$run' is in use by another process \(pid $holder\)" "HINT"
grep -q '^data:' "$tmp/lock-2.txt"
check "... and it fails at once, before reading data (${ms} ms)" $((1 - $?))
kill -9 "$holder"
wait "$holder" 2>/dev/null
"$bin" "$tmp/tiny.ini" run_dir="$run" resume=auto train.max_steps=2 >"$tmp/lock-3.txt" 2>&1
check "after SIGKILL of the holder the lock is free at once" $?

# ---- a full disk (ENOSPC) and a read-only file system (EROFS), on tmpfs ----
# in_namespace SCRIPT: runs bash SCRIPT in a private mount namespace (mounts vanish with it).
in_namespace() {
  if [ "$(id -u)" -eq 0 ]; then unshare -m bash -c "$1"; else unshare -rm bash -c "$1"; fi
}
if in_namespace "mount -t tmpfs -o size=64k tmpfs '$tmp' && true" 2>/dev/null; then
  mkdir "$tmp/mnt"
  # 1000 KiB: two checkpoints fit, the third does not. The exports that check them write a file:
  # a save renames its temp file over its target, which as root would replace /dev/null itself.
  in_namespace "mount -t tmpfs -o size=1000k tmpfs '$tmp/mnt' &&
    '$bin' '$tmp/tiny.ini' run_dir='$tmp/mnt/run' train.max_steps=20 >'$tmp/enospc.txt' 2>&1;
    echo \$? >'$tmp/enospc.rc';
    for f in '$tmp'/mnt/run/ckpt-*.safetensors; do
      '$build/swin_export' \"\$f\" '$tmp/enospc-verify.safetensors' >/dev/null 2>&1 ||
        echo \"\$f\" >>'$tmp/enospc.bad';
    done; ls '$tmp/mnt/run' >'$tmp/enospc.ls'"
  rc=$(cat "$tmp/enospc.rc")
  check "ENOSPC on a checkpoint: exit 1" $([ "$rc" -eq 1 ] && echo 0 || echo 1) "exit $rc"
  expect_message "ENOSPC: the message names the file, the cause and a fix" "$tmp/enospc.txt" \
    "ckpt-00000006\.safetensors" "No space left on device" "HINT: the disk is full"
  grep -q 'ckpt-00000004.safetensors' "$tmp/enospc.ls" && [ ! -e "$tmp/enospc.bad" ] &&
    ! grep -q '\.tmp$' "$tmp/enospc.ls"
  check "ENOSPC: checkpoints 2 and 4 still load, no temp file is left" $?

  in_namespace "mount -t tmpfs -o size=64k tmpfs '$tmp/mnt' && mkdir '$tmp/mnt/run' &&
    mount -o remount,ro '$tmp/mnt' &&
    '$bin' '$tmp/tiny.ini' run_dir='$tmp/mnt/run' >'$tmp/erofs.txt' 2>&1; echo \$? >'$tmp/erofs.rc'"
  rc=$(cat "$tmp/erofs.rc")
  check "read-only file system: exit 1" $([ "$rc" -eq 1 ] && echo 0 || echo 1) "exit $rc"
  expect_message "... the message names run_dir and the cause" "$tmp/erofs.txt" \
    "'$tmp/mnt/run/\.lock'" "Read-only file system" "HINT"
else
  skip "ENOSPC and EROFS: cannot mount a tmpfs in a private namespace (unshare -m)"
fi

# ---- run_dir made read-only mid-run (EACCES) ----
as_user=()
if [ "$(id -u)" -eq 0 ]; then
  if command -v setpriv >/dev/null && setpriv --reuid=65534 --regid=65534 --clear-groups true; then
    as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
  fi
fi
if [ "$(id -u)" -ne 0 ] || [ ${#as_user[@]} -gt 0 ]; then
  run=$tmp/readonly
  mkdir "$run"
  [ ${#as_user[@]} -gt 0 ] && chown 65534:65534 "$run"
  "${as_user[@]}" "$bin" "$tmp/tiny.ini" run_dir="$run" train.max_steps=100000 \
    >"$tmp/readonly.txt" 2>&1 &
  pid=$!
  for ((i = 0; i < 300; i++)); do
    [ -e "$run/ckpt-00000002.safetensors" ] && break
    sleep 0.1
  done
  chmod 555 "$run"
  wait "$pid"
  rc=$?
  chmod 755 "$run"
  check "run_dir made read-only mid-run: exit 1" $([ $rc -eq 1 ] && echo 0 || echo 1) "exit $rc"
  expect_message "... the message names the checkpoint, the cause and a fix" "$tmp/readonly.txt" \
    "cannot save '$run/ckpt-[0-9]+\.safetensors'" "Permission denied" "HINT: .*not writable"
  # A save caught by the chmod between its temp file and the rename leaves that temp file (the
  # directory refuses its removal as well): the next start removes it under the lock.
  "${as_user[@]}" "$bin" "$tmp/tiny.ini" run_dir="$run" resume=auto train.max_steps=2 \
    >"$tmp/readonly-2.txt" 2>&1
  check "... the next start in the writable run_dir succeeds" $?
  intact "$run"
  check "... the checkpoints written before still load, no temp file is left" $?
else
  skip "read-only run_dir mid-run: running as root without setpriv to drop privileges"
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
