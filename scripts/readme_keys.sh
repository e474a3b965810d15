#!/usr/bin/env bash
# Rewrites the README's config key reference (between <!-- keys:begin --> and <!-- keys:end -->)
# from `swin_train --keys`, so the table and the program stay the same (test_cli checks it).
# Usage (repo root): bash scripts/readme_keys.sh [BUILD_DIR]
set -euo pipefail
bin=${1:-build}/swin_train
keys=$("$bin" --keys)
python3 - "$keys" <<'PY'
import sys
readme = open("README.md").read()
begin, end = "<!-- keys:begin -->\n", "<!-- keys:end -->"
i, j = readme.index(begin) + len(begin), readme.index(end)
open("README.md", "w").write(readme[:i] + sys.argv[1] + "\n" + readme[j:])
PY
