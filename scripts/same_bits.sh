#!/usr/bin/env bash
# same_bits.sh OLD_BUILD NEW_BUILD CONFIG [key=value ...]: the check that a change left behaviour
# unchanged: trains CONFIG with the same seed and overrides with two builds' swin_train (e.g. the
# commit before a refactor and after it) into two run directories, then compares their
# metrics.jsonl (every loss, accuracy and learning rate; the timing fields dropped) and the bytes
# of their newest checkpoints (when the bytes differ, tensor by tensor: a newer build's metadata,
# the resolved config with its new keys, may differ while every number is the same). Prints
# "same bits" and exits 0, or shows the first differences and exits 1. Runs go under $OUT
# (default /tmp/same_bits), the run directory run_dir=$OUT/run.
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
  # The bytes differ: say whether any tensor does, or only the metadata (the resolved config gains
  # the keys a newer build knows, class_names, and swin.checksum, which covers the metadata too).
  if python3 - "$a" "$b" <<'PY'; then
import json, struct, sys
def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]
(ha, da), (hb, db) = read(sys.argv[1]), read(sys.argv[2])
meta_a, meta_b = ha.pop("__metadata__", {}), hb.pop("__metadata__", {})
bad = sorted(set(ha) ^ set(hb))
for k in sorted(set(ha) & set(hb)):
    ea, eb = ha[k], hb[k]
    if (ea["dtype"], ea["shape"]) != (eb["dtype"], eb["shape"]) or \
            da[slice(*ea["data_offsets"])] != db[slice(*eb["data_offsets"])]:
        bad.append(k)
if bad:
    print("FAIL: %d tensors differ, first: %s" % (len(bad), ", ".join(bad[:5])))
    sys.exit(1)
keys = sorted(k for k in set(meta_a) | set(meta_b) if meta_a.get(k) != meta_b.get(k))
print("checkpoint tensors identical (%d); metadata differs in: %s" % (len(ha), ", ".join(keys)))
PY
    metadata_only=1
  else
    status=1
  fi
fi
if [ $status -eq 0 ]; then
  what="checkpoint $(basename "$b") ($(stat -c %s "$b") bytes) identical"
  [ -n "${metadata_only:-}" ] && what="every tensor of checkpoint $(basename "$b") identical (metadata differs, above)"
  echo "same bits: $(wc -l <"$out/new/metrics.jsonl") metrics records and $what"
fi
exit $status
