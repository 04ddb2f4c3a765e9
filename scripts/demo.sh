#!/usr/bin/env bash
# The main job on its embedded default: the machine report, then the plan for
# the tiny example model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
ninja -C build >/dev/null
./build/zinc info
echo
./build/zinc plan examples/tiny.json
