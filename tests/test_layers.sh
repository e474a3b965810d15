#!/usr/bin/env bash
# test_layers.sh BUILD_DIR SOURCE_DIR: the include graph runs one way (README.md, "Map of the
# code"): src/base <- kernels, optim, data, dist <- src/model <- src/io <- src/app. Each rule
# lists the folders a layer's files may include from the repository; a quoted include of any
# other folder fails, naming the file and line.
set -u
src=$(cd "$2" && pwd)
cd "$src" || exit 1
failed=0
# check FOLDERS... -- ALLOWED...: every "dir/.../x.h" include in FOLDERS starts with one of ALLOWED.
check() {
  local dirs=() allowed=()
  while [ "$1" != "--" ]; do dirs+=("$1"); shift; done
  shift
  allowed=("$@")
  local n=0
  while IFS=: read -r file line text; do
    local inc=${text#*\"}
    inc=${inc%%\"*}
    case "$inc" in */*) ;; *) continue ;; esac  # a file beside it
    local ok=0
    for a in "${allowed[@]}"; do
      case "$inc" in "$a"/*) ok=1 ;; esac
    done
    if [ $ok -eq 0 ]; then
      echo "FAIL $file:$line includes \"$inc\" (${dirs[*]} may include only ${allowed[*]})"
      failed=1
    fi
    n=$((n + 1))
  done < <(grep -rn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "${dirs[@]}" \
             --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh')
  echo "ok   ${dirs[*]}: $n includes, each from ${allowed[*]}"
}
check src/base -- src/base
check kernels optim data dist -- src/base kernels optim data dist
check src/model -- src/base kernels optim data dist src/model
check src/io -- src/base kernels optim data dist src/model src/io
check src/app -- src/base kernels optim data dist src/model src/io src/app
# Nothing lies in src/ itself: every file belongs to a layer.
loose=$(find src -maxdepth 1 -type f | sort)
if [ -n "$loose" ]; then
  echo "FAIL files in src/ outside a layer folder: $loose"
  failed=1
fi
exit $failed
