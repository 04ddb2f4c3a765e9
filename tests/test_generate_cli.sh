#!/usr/bin/env bash
# zinc generate end to end with text (tests/test_generate_cli.py) through the
# project's .venv (scripts/setup.sh venv, which make test runs): the model's
# tokenizer and chat template. Skips (77) only where the venv could not be made.
set -u
zinc=$(realpath "$1")
src=$(realpath "$2")
py="$src/.venv/bin/python"
if [ ! -x "$py" ]; then
    echo "SKIP: no $src/.venv (scripts/setup.sh venv could not make it)"
    exit 77
fi
work=$(realpath "$(mktemp -d generate-XXXXXX)")
trap 'rm -rf "$work"' EXIT
"$py" "$src/tests/test_generate_cli.py" "$zinc" "$src" "$work"
