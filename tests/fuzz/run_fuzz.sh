#!/usr/bin/env bash
# Runs one libFuzzer harness for SECONDS from the seeds in SEEDS... (files
# copied into a fresh corpus, so the source tree is never written).
# Usage: run_fuzz.sh HARNESS SECONDS SEED...
set -u
harness=$1 secs=$2
shift 2
work=$(mktemp -d "${TMPDIR:-/tmp}/zn_fuzzrun.XXXXXX")
trap 'rm -rf "$work"' EXIT
corpus=$work/corpus
mkdir "$corpus"
export TMPDIR=$work   # the harness's own files go here too
for s in "$@"; do
    [ -f "$s" ] && cp "$s" "$corpus/$(echo "$s" | tr '/' '_')"
done
"$harness" "$corpus" -max_total_time="$secs" -seed=1 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 2>&1 | tail -n 12
rc=${PIPESTATUS[0]}
exit "$rc"
