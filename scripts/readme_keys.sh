#!/usr/bin/env bash
# Rewrites the config key reference in configs/README.md (between <!-- keys:begin --> and
# <!-- keys:end -->) from `swin_train --keys`, so the table and the program stay the same
# (test_cli checks it).
# Usage (repo root): bash scripts/readme_keys.sh [BUILD_DIR]
set -euo pipefail
bin=${1:-build}/swin_train
keys=$("$bin" --keys)
python3 - "$keys" <<'PY'
import sys
path = "configs/README.md"
readme = open(path).read()
begin, end = "<!-- keys:begin -->\n", "<!-- keys:end -->"
i, j = readme.index(begin) + len(begin), readme.index(end)
open(path, "w").write(readme[:i] + sys.argv[1] + "\n" + readme[j:])
PY
