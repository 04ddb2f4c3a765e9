#!/usr/bin/env bash
# The main job on its embedded default: the machine report, then `zinc train`
# with no arguments (examples/tiny.json, built into the binary: a 3.1M-param
# Llama trained on the built-in synthetic data with params in pinned RAM and
# Adam state in ./zinc-swap), then the plan of the same config.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
# zinc prepare's tokenizer environment, so that the README's fine-tuning
# path works after this command (a note, not a failure, without PyPI)
bash scripts/setup.sh venv || echo "demo: no .venv: zinc prepare will say how to make it"
ninja -C build >/dev/null
./build/zinc info
echo
./build/zinc train
echo
./build/zinc plan examples/tiny.json
