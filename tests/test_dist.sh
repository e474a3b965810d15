#!/usr/bin/env bash
# test_dist.sh BUILD_DIR SOURCE_DIR: the communicator as a job meets it under mpirun (CPU only):
# test_dist's checks with 2 and 3 processes; a rank that fails (comm_abort) or is killed ends the
# whole job within seconds, with a non-zero exit and a message naming the rank, instead of leaving
# the others waiting in a collective; a launcher whose process count MPI does not see is refused;
# sbatch's SLURM_PROCID alone does not make a job.
#
# CI runs as root, which Open MPI's mpirun refuses unless told (--allow-run-as-root, or
# OMPI_ALLOW_RUN_AS_ROOT=1 with OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1); --oversubscribe lets 3
# processes share the 2 cores. Every job runs under `timeout`, so a hang fails instead of waiting.
set -u
build=$1
bin=$build/test_dist
passed=0
failed=0
# A failing rank must end the job in seconds: it fails 0.2 s after the others block, and mpirun
# starts and tears down a local job in about 1 s here. 10 s leaves room for a loaded machine.
limit_s=10
mpirun_cmd=(mpirun --allow-run-as-root --oversubscribe)

if ! command -v mpirun >/dev/null; then
  echo "FAIL mpirun not found. HINT: bash scripts/setup.sh installs openmpi-bin"
  echo "0 passed, 1 failed"
  exit 1
fi

# expect NAME CODE PATTERNS -- COMMAND...: the command exits with CODE ('nonzero': any failure but
# timeout's 124) within limit_s seconds, and its output (stdout and stderr) matches each grep -E
# pattern in PATTERNS (patterns separated by ' && ').
expect() {
  local name=$1 code=$2 patterns=$3
  shift 4
  local out rc start_ns ms missing=""
  start_ns=$(date +%s%N)
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  ms=$((($(date +%s%N) - start_ns) / 1000000))
  local ok=1
  if [ "$code" = nonzero ]; then
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || ok=0
  else
    [ "$rc" -eq "$code" ] || ok=0
  fi
  local p
  while IFS= read -r p; do
    grep -qE -- "$p" <<<"$out" || { ok=0; missing+="     missing /$p/"$'\n'; }
  done < <(sed 's/ && /\n/g' <<<"$patterns")
  [ "$ms" -lt $((limit_s * 1000)) ] || ok=0
  local took="$((ms / 1000)).$(printf '%03d' $((ms % 1000))) s"
  if [ "$ok" -eq 1 ]; then
    echo "ok   $name (exit $rc, $took)"
    passed=$((passed + 1))
  else
    echo "FAIL $name: exit $rc (want $code), $took (limit $limit_s s), output:"
    printf '%s' "$missing"
    sed 's/^/     | /' <<<"$out" | tail -40
    failed=$((failed + 1))
  fi
}

expect "2 processes: every collective check" 0 "^-- 2 processes, launched by && ^[0-9]+ passed, 0 failed$" -- \
  "${mpirun_cmd[@]}" -np 2 "$bin"
expect "3 processes: every collective check" 0 "^-- 3 processes, launched by && ^[0-9]+ passed, 0 failed$" -- \
  "${mpirun_cmd[@]}" -np 3 "$bin"
expect "mpirun -np 2: both ranks see a job of 2" 0 "world 2 rank 0 mpi yes && world 2 rank 1 mpi yes" -- \
  "${mpirun_cmd[@]}" -np 2 "$bin" --init

abort_msg="rank 1: error: cannot decode 'train/n01440764/broken\.jpg' \(simulated failure\) && rank 1: HINT: remove or replace the file"
expect "a rank that fails ends the job (2 processes)" 1 "$abort_msg" -- \
  "${mpirun_cmd[@]}" -np 2 "$bin" --fail-rank 1
expect "a rank that fails ends the job (3 processes)" 1 "$abort_msg" -- \
  "${mpirun_cmd[@]}" -np 3 "$bin" --fail-rank 1
expect "rank 0 failing ends the job too" 1 "rank 0: error: cannot decode" -- \
  "${mpirun_cmd[@]}" -np 3 "$bin" --fail-rank 0
expect "a killed rank (SIGKILL) ends the job" nonzero "rank 1 .*(signal 9|Killed)" -- \
  "${mpirun_cmd[@]}" -np 2 "$bin" --kill-rank 1

expect "no launcher: one process without MPI" 0 "^world 1 rank 0 mpi no$" -- "$bin" --init
expect "sbatch's SLURM_PROCID alone is no launcher" 0 "^world 1 rank 0 mpi no$" -- \
  env SLURM_PROCID=0 "$bin" --init
expect "a launcher count MPI does not see is refused" 1 \
  "the launcher started 2 processes \(PMI_SIZE=2\) but MPI sees a job of 1 && HINT: swin_train is built with Open MPI" -- \
  env PMI_SIZE=2 "$bin" --init

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
