#!/usr/bin/env bash
# Runs a Python test (tests/SCRIPT) with the project's .venv python
# (scripts/setup.sh venv, which make test runs: the HF tokenizers library
# and jinja2) as SCRIPT ZINC SOURCE_ROOT WORKDIR, in a fresh work folder
# removed afterwards. Skips (77) only where the venv could not be made.
set -u
script=$1
zinc=$(realpath "$2")
src=$(realpath "$3")
py="$src/.venv/bin/python"
if [ ! -x "$py" ]; then
    echo "SKIP: no $src/.venv (scripts/setup.sh venv could not make it)"
    exit 77
fi
work=$(realpath "$(mktemp -d "${script%.py}-XXXXXX")")
trap 'rm -rf "$work"' EXIT
"$py" "$src/tests/$script" "$zinc" "$src" "$work"
