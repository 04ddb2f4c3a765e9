#!/usr/bin/env bash
# zinc train RECIPE.yaml with LLaMA-Factory's own published recipes
# (tests/test_recipe.py) through the project's .venv (scripts/setup.sh venv,
# which make test runs). Skips (77) only where the venv could not be made.
set -u
zinc=$(realpath "$1")
src=$(realpath "$2")
py="$src/.venv/bin/python"
if [ ! -x "$py" ]; then
    echo "SKIP: no $src/.venv (scripts/setup.sh venv could not make it)"
    exit 77
fi
work=$(realpath "$(mktemp -d recipe-XXXXXX)")
trap 'rm -rf "$work"' EXIT
"$py" "$src/tests/test_recipe.py" "$zinc" "$src" "$work"
