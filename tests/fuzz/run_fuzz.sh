#!/usr/bin/env bash
# Runs one libFuzzer harness for SECONDS from the seeds in SEEDS... (files
# copied into a fresh corpus, so the source tree is never written).
# A harness.py is an atheris (libFuzzer for Python) harness, run with
# $ZN_FUZZ_PYTHON (the .venv-fuzz python; skipped, 77, where it is missing).
# Usage: run_fuzz.sh HARNESS SECONDS SEED...
set -u
harness=$1 secs=$2
shift 2
run=("$harness")
if [ "${harness%.py}" != "$harness" ]; then
    py=${ZN_FUZZ_PYTHON:-}
    if [ -z "$py" ] || [ ! -x "$py" ]; then
        echo "SKIP: no python with atheris (${py:-ZN_FUZZ_PYTHON unset}; scripts/setup.sh venv-fuzz makes it)"
        exit 77
    fi
    run=("$py" "$harness")
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/zn_fuzzrun.XXXXXX")
trap 'rm -rf "$work"' EXIT
corpus=$work/corpus
mkdir "$corpus"
export TMPDIR=$work   # the harness's own files go here too
for s in "$@"; do
    [ -f "$s" ] && cp "$s" "$corpus/$(echo "$s" | tr '/' '_')"
done
# a finding exits 1: libFuzzer's own default (77) is meson's "skipped"; the
# input that found it is kept where the test runs (crash-*, timeout-*, oom-*)
"${run[@]}" "$corpus" -max_total_time="$secs" -seed=1 -rss_limit_mb=2048 -max_len=65536 \
    -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 2>&1 | tail -n 12
rc=${PIPESTATUS[0]}
exit "$rc"
