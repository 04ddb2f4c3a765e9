#!/bin/bash
# Background checkpoints (issue 55) on the host backend, with a Qwen2.5-0.5B-
# shaped model (494M parameters) whose parameters and Adam state are in the
# cpu tier (bench/scripts/ckpt_background_0.5b.json): in one run of this
# script, STEPS steps without checkpoints, with one every step written in
# the background, and with one every step written at once; then SIGTERM at
# NSIG random moments of a run checkpointing every step: the seconds from
# the signal to the exit against the "about T s at most" the run printed,
# whether latest is the step it stopped after and verifies. Every
# checkpoint is verified (zinc export --verify). Usage, from the repository
# root with a build in build/: bash bench/scripts/ckpt_background.sh;
# results on stdout (bench/results/ckpt-background.md).
set -u
z=$PWD/build/zinc
cfg=$PWD/bench/scripts/ckpt_background_0.5b.json
STEPS=${STEPS:-6} NSIG=${NSIG:-3}
work=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cd "$work" || exit 1
grep -m1 "model name" /proc/cpuinfo; nproc; free -g | head -2
# mean seconds of steps 2.. of a json log (the first includes the warm-up)
mean() { python3 -c "
import json, sys
s = [json.loads(l)['seconds'] for l in open(sys.argv[1])][1:]
print('%.3f' % (sum(s) / len(s)))" "$1"; }
# the run's wall time, saves included ("trained N steps in X s")
wall() { sed -n 's/^trained [0-9]* steps in \([0-9.]*\) s.*/\1/p' "$1"; }
run() {  # NAME ARGS...: STEPS steps: the steps' own mean time and the run's wall time
    local n=$1; shift
    "$z" train "$cfg" --steps $STEPS --json-log $n.jsonl "$@" > $n.out 2>&1 || { cat $n.out; exit 1; }
    echo "$n: $(mean $n.jsonl) s a step (steps 2-$STEPS, the step alone); $(wall $n.out) s for the $STEPS steps with their saves"
}
run none
run background --set train.checkpoint.dir=bg --set train.checkpoint.every=1
grep "written in the background" background.out | tail -3
"$z" export bg --verify || exit 1
rm -rf bg   # 2 x 5.5 GiB each: the disk holds few
run at-once --set train.checkpoint.dir=now --set train.checkpoint.every=1 \
    --set train.checkpoint.background=false
grep "^checkpoint " at-once.out | tail -3
"$z" export now --verify || exit 1
rm -rf now
python3 -c "
import sys
n, b, a = (float(x) for x in sys.argv[1:4])
print('a checkpoint every step costs, against the run without: background %.1f%%, at once %.1f%% (wall time of the %s steps)' % (100 * (b / n - 1), 100 * (a / n - 1), sys.argv[4]))
" "$(wall none.out)" "$(wall background.out)" "$(wall at-once.out)" $STEPS
for i in $(seq $NSIG); do
    d=sig$i
    "$z" train "$cfg" --steps 100 --set train.checkpoint.dir=$d --set train.checkpoint.every=1 \
        > $d.out 2> $d.err &
    pid=$!
    until grep -q '^on SIGTERM now' $d.out 2>/dev/null; do sleep 0.2; done
    sleep "$(python3 -c "import random; print('%.2f' % random.uniform(0, 10))")"
    t0=$(date +%s.%N)
    kill -TERM $pid
    wait $pid
    rc=$?
    t1=$(date +%s.%N)
    # the estimate: after the first save, from the rate that save went at
    est=$(sed -n 's/^on SIGTERM now: .* at most \([0-9.]*\) s.*/\1/p' $d.out | tail -1)
    [ -n "$est" ] || est=$(sed -n 's/.*about \([0-9.]*\) s at most.*/\1/p' $d.out | head -1)
    step=$(sed -n 's/.*stopped after step \([0-9]*\).*/\1/p' $d.err)
    "$z" export $d --verify > /dev/null 2>&1 && v=verifies || v="DOES NOT VERIFY"
    echo "SIGTERM $i: exit $rc, $(python3 -c "print('%.2f' % ($t1 - $t0))") s to the exit (printed: at most ${est:-?} s); stopped after step $step, latest $(cat $d/latest), $v"
    grep -E "dropped|stopped after|error" $d.err | sed 's/^/    /'
    rm -rf $d
done
