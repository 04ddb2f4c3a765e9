#!/usr/bin/env bash
# Scale (suite slow): a Qwen2.5-shaped model of 1.78B parameters (vocab
# 151936, untied) whose training state, 33 GiB, is larger than this
# machine's RAM trains 2 steps with params and optimizer on NVMe inside the
# budgets its plan chose: exit 0, and every tier's high-water mark is the
# plan's figure (the report's "100.0% of plan"); with 62 GiB free it is
# stopped by SIGTERM in step 2 and must save and clean up. Skips (77) where the state
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
# With room for a checkpoint too (its master and moments, 19.9 GiB), the run
# is stopped as a spot machine stops it (issue 32): SIGTERM once step 1 is
# logged and the run has said what a stop costs (step 1's time and the
# disks measured); step 2 ends, the checkpoint is saved, exit 143. Both
# figures are printed for bench/results/scale.md, neither is
# asserted (a speed is no test). The checkpoint is then verified.
stop=0
[ "$free_kib" -ge $((62 * 1024 * 1024)) ] && stop=1
if [ $stop -eq 1 ]; then
    "$zinc" train "$src/tests/fixtures/scale/qwen2.5-1.8b-nvme.json" --steps 3 \
        --set 'train.checkpoint.dir="ck"' > out.txt 2>&1 &
    pid=$!
    for _ in $(seq 1800); do
        grep -q -E "^on SIGTERM|no estimate of the time" out.txt 2>/dev/null && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.5
    done
    t0=$(date +%s.%N)
    kill -TERM $pid 2>/dev/null
    wait $pid
    rc=$?
    took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
else
    "$zinc" train "$src/tests/fixtures/scale/qwen2.5-1.8b-nvme.json" > out.txt 2>&1
    rc=$?
fi
cat out.txt | sed -n '/^zinc train/,$p'
want=0
[ $stop -eq 1 ] && want=143
if [ $rc -ne $want ]; then
    echo "FAIL: the scale run exited $rc, not $want"
    exit 1
fi
fail=0
for t in gpu cpu nvme; do
    line=$(grep "^  $t " out.txt)
    echo "$line" | grep -q "100.0% of plan at peak" || { echo "FAIL: $t: $line"; fail=1; }
done
if [ $stop -eq 1 ]; then
    # the signal comes just after step 1 has said what a stop costs: the
    # run stops after step 1 or, when step 2 had begun, before step 2's
    # update (its state is step 1's) or after it
    # (one rank: "the step in progress stops before its update"; ranks:
    # "... ends")
    est=$(grep -E "^on SIGTERM the step in progress (stops before its update|ends)" out.txt)
    [ -n "$est" ] || { echo "FAIL: the run does not say what a stop costs after its first step"; fail=1; }
    # (with every step committed, the update still running is dropped and
    # the last commit stays: step 0's, the run's initial state, when step
    # 1's has not landed)
    s=$(sed -n 's/.*Terminated: stopped after step \([012]\), checkpoint saved in ck, swap files removed.*/\1/p' out.txt)
    [ -n "$s" ] || { echo "FAIL: not stopped after step 0, 1 or 2 with a checkpoint: $(tail -n 2 out.txt)"; fail=1; }
    [ "$(cat ck/latest 2>/dev/null)" = "step-0000000${s:-?}" ] || { echo "FAIL: latest is not step ${s:-?}"; fail=1; }
    "$zinc" export ck --verify > verify.txt 2>&1 || { echo "FAIL: $(tail -n 2 verify.txt)"; fail=1; }
    left=$(find zinc-swap -mindepth 1 | head -n 3)
    [ -z "$left" ] || { echo "FAIL: left in the swap folder: $left"; fail=1; }
    echo "scale: stop on SIGTERM after step ${s:-?}: predicted $(echo "$est" | sed -n 's/.*: about \([0-9.]*\) s at most.*/\1/p') s ($est)"
    echo "scale: stop on SIGTERM: measured $took s from the signal to the exit"
else
    grep -q "step     2/2" out.txt || { echo "FAIL: no step 2"; fail=1; }
fi
[ $fail -eq 0 ] && echo "scale: ok"
exit $fail
