#!/usr/bin/env bash
# ab_step.sh: a change against its baseline on one GPU, in one command: builds the working tree
# and a baseline source tree side by side, then runs `swin_train CONFIG bench=1` (resident
# synthetic data: an upper bound) with each build in turn, PAIRS times, and prints one table of
# img/s and device memory with the mean ratio. Alternating runs on one machine are the only
# comparison kernels/PERF.md accepts: two machines of one kind differ by ~1% (version 22's record).
# The baseline is a plain source tree, since the GPU machine gets a copy of the working tree and
# no git history: made here with e.g. `rm -rf .deps/base && mkdir -p .deps/base && git archive main
# | tar -x -C .deps/base` and carried with the call (.deps is ignored).
# Usage (repo root): bash scripts/ab_step.sh BASE_SRC [CONFIG [key=value ...]]
#   (default CONFIG configs/swin_tiny.ini; bench=1 device=cuda precision=bf16
#   train.batch_size=128 are always passed, keys after CONFIG override them); PAIRS (default 3);
#   STB (default .deps/stb: the stb headers' folder when libstb-dev is not installed);
#   OUT (default /tmp/ab_step) for the build and run logs.
set -uo pipefail
cd "$(dirname "$0")/.."
base_src=${1:?usage: ab_step.sh BASE_SRC [CONFIG [key=value ...]]}
config=${2:-configs/swin_tiny.ini}
shift $(($# > 1 ? 2 : 1))
pairs=${PAIRS:-3}
out=${OUT:-/tmp/ab_step}
stb=$(realpath -m "${STB:-.deps/stb}")
mkdir -p "$out"
flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release)
[ -d "$stb" ] && flags+=("-DSTB_INCLUDE_DIR=$stb" "-DCMAKE_C_FLAGS=-I$stb")
# Both builds at once; `wait PID`, not a bare `wait`, which would also wait for any process
# substitution of the caller (a `tee` of its output never ends).
(cmake -S "$base_src" -B build-ab-base "${flags[@]}" && ninja -C build-ab-base swin_train) \
  >"$out/build-base.log" 2>&1 &
base_pid=$!
(cmake -S . -B build-ab-new "${flags[@]}" && ninja -C build-ab-new swin_train) \
  >"$out/build-new.log" 2>&1
new_rc=$?
wait "$base_pid"
base_rc=$?
if [ $new_rc -ne 0 ] || [ $base_rc -ne 0 ]; then
  echo "ab_step: a build failed (base rc $base_rc, new rc $new_rc; see $out/build-*.log)" >&2
  grep -h -m5 -E "error" "$out/build-base.log" "$out/build-new.log" >&2
  exit 1
fi
run() {  # run SIDE I [key=value ...]: one benchmark; prints "SIDE IMG_S GIB"
  local side=$1 log="$out/bench-$1-$2.log"
  shift 2
  "build-ab-$side/swin_train" "$config" bench=1 device=cuda precision=bf16 train.batch_size=128 \
    "$@" >"$log" 2>&1 || echo "ab_step: $side run failed (see $log)" >&2
  echo "$side $(awk '/img\/s \(median/ {print $NF}' "$log") $(awk '/device memory/ {print $4}' "$log")"
}
results=()
for i in $(seq 1 "$pairs"); do
  results+=("$(run base "$i" "$@")" "$(run new "$i" "$@")")
done
printf '%s\n' "${results[@]}" | awk -v cfg="$config" '
  { img[$1] = img[$1] sprintf(" %9.1f", $2); sum[$1] += $2; n[$1]++; gib[$1] = $3 }
  END {
    printf "== ab_step: %s, alternating base/new, %d pairs\n", cfg, n["new"]
    printf "%-5s %s   %9s  %s\n", "build", "img/s each run", "mean", "GiB"
    split("base new", sides, " ")
    for (k = 1; k <= 2; k++) {
      s = sides[k]
      if (n[s]) printf "%-5s%s   %9.1f  %s\n", s, img[s], sum[s] / n[s], gib[s]
    }
    if (n["base"] && sum["base"] > 0)
      printf "new / base: %.4f\n", (sum["new"] / n["new"]) / (sum["base"] / n["base"])
  }'
