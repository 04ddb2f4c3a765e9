#!/usr/bin/env bash
# Scale (suite slow): a Qwen2.5-shaped model of 1.78B parameters (vocab
# 151936, untied) whose training state, 33 GiB, is larger than this
# machine's RAM trains 2 steps with params and optimizer on NVMe inside the
# budgets its plan chose: exit 0, and every tier's high-water mark is the
# plan's figure (the report's "100.0% of plan"). Skips (77) where the state
# would fit in RAM (it would prove nothing) or the disk has under 40 GiB free.
set -u
zinc=$(realpath "$1")
src=$(realpath "$2")
work=$(realpath "$(mktemp -d scale-XXXXXX)")
trap 'rm -rf "$work"' EXIT
cd "$work"
ram_kib=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
state_kib=$((33 * 1024 * 1024 + 100 * 1024))
if [ "$ram_kib" -gt "$state_kib" ]; then
    echo "SKIP: this machine's RAM ($((ram_kib / 1048576)) GiB) holds the 33 GiB state: nothing to prove"
    exit 77
fi
if [ "$free_kib" -lt $((40 * 1024 * 1024)) ]; then
    echo "SKIP: $((free_kib / 1048576)) GiB free here; the run needs 40 GiB of swap space"
    exit 77
fi
mkdir zinc-swap   # the config's swap folder: zinc creates none unless told to
"$zinc" train "$src/tests/fixtures/scale/qwen2.5-1.8b-nvme.json" > out.txt 2>&1
rc=$?
cat out.txt | sed -n '/^zinc train/,$p'
if [ $rc -ne 0 ]; then
    echo "FAIL: the scale run exited $rc"
    exit 1
fi
fail=0
for t in gpu cpu nvme; do
    line=$(grep "^  $t " out.txt)
    echo "$line" | grep -q "100.0% of plan at peak" || { echo "FAIL: $t: $line"; fail=1; }
done
grep -q "step     2/2" out.txt || { echo "FAIL: no step 2"; fail=1; }
[ $fail -eq 0 ] && echo "scale: ok"
exit $fail
