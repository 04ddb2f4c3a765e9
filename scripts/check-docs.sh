#!/usr/bin/env bash
# check-docs.sh: keep the reference pages scannable.
#
# Fails (exit 1) when a markdown table cell is longer than 400 characters,
# naming file:line and the length, or when README.md is over 10240 bytes.
# Exit 0 otherwise. Usage:
#
#   scripts/check-docs.sh              # docs/*.md and README.md
#   scripts/check-docs.sh FILE...      # just these files
#
# A file named README.md (any directory) gets the size limit as well.
# Lines inside ``` or ~~~ fences are not table rows. Cells are split on
# unescaped '|', as GitHub splits them (a '|' inside a code span splits too).
set -euo pipefail

MAX_CELL=${MAX_CELL:-400}
MAX_README=${MAX_README:-10240}

if [ "$#" -eq 0 ]; then
    # the defaults are the repository's, wherever this is run from
    cd "$(dirname "$0")/.."
    set -- docs/*.md README.md
fi

exec python3 - "$MAX_CELL" "$MAX_README" "$@" <<'PY'
import os
import re
import sys

max_cell = int(sys.argv[1])
max_readme = int(sys.argv[2])
files = sys.argv[3:]
fence = re.compile(r"^\s{0,3}(```|~~~)")
problems = 0
longest = (0, None)

def cells(row):
    row = row.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    return [c.strip() for c in re.split(r"(?<!\\)\|", row)]

for path in files:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError as e:
        print(f"{path}: cannot read: {e.strerror}")
        problems += 1
        continue
    in_fence = None
    for n, line in enumerate(lines, 1):
        m = fence.match(line)
        if m:
            if in_fence is None:
                in_fence = m.group(1)
            elif m.group(1) == in_fence:
                in_fence = None
            continue
        if in_fence is not None or not line.lstrip().startswith("|"):
            continue
        for i, c in enumerate(cells(line), 1):
            if len(c) > longest[0]:
                longest = (len(c), f"{path}:{n}")
            if len(c) > max_cell:
                print(f"{path}:{n}: table cell {i} is {len(c)} characters "
                      f"(limit {max_cell}): {c[:60]}...")
                problems += 1
    if os.path.basename(path) == "README.md":
        size = os.path.getsize(path)
        if size > max_readme:
            print(f"{path}: {size} bytes (limit {max_readme})")
            problems += 1

where = f" ({longest[1]})" if longest[1] else ""
if problems:
    print(f"check-docs: {problems} problem(s); longest table cell "
          f"{longest[0]} characters{where}")
    sys.exit(1)
print(f"check-docs: ok, {len(files)} file(s); longest table cell "
      f"{longest[0]} characters{where}")
PY
