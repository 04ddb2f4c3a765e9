#!/usr/bin/env bash
# Checkpoints written in the background (issue 55), through the CLI, with
# the optimizer state in the cpu tier and a checkpoint every step:
#  1. the checkpoint files of a run that saves in the background equal, byte
#     for byte, those of the same run saving at once
#     (train.checkpoint.background=false);
#  2. SIGTERM at random moments (mid-step, mid-write): exit 143 within 10 s,
#     the newest checkpoint is the last step the run finished ("stopped
#     after step N", latest = step-N: no step lost), it verifies, and the
#     run resumed from it gives the uninterrupted run's losses bit for bit
#     (the hex loss of every later step);
#  3. kill -9 at random moments: latest always verifies, names a step no
#     older than the newest checkpoint the run said it completed, and the
#     run resumed from it gives the uninterrupted run's losses; the dead
#     run's temporary folder goes with the next save.
# Usage: test_ckpt_background.sh ZINC
set -u
. "$(dirname "$(realpath "$0")")/common.sh"   # check, wait_for
zinc=$(readlink -f "$1")
work=$(mktemp -d "${TMPDIR:-/tmp}/zn_ckbg.XXXXXX")
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cd "$work" || exit 99
fail=0
STEPS=6
# the demo model with its Adam state in the cpu tier, steps of a few tenths
# of a second on 2 cores
A=(--set train.log_every=1 --set zero_optimization.offload_optimizer.device=cpu
   --set data.seq_len=96 --set train_micro_batch_size_per_gpu=8 --set tiers.cpu=1GiB)
# the hex losses of steps FROM.. of a json log
losses() { python3 -c "
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d['step'] >= int(sys.argv[2]): print(d['step'], d['loss_hex'], d['grad_norm'])
" "$1" "$2"; }

"$zinc" train --steps $STEPS "${A[@]}" --json-log ref.jsonl > ref.out 2>&1
check $? "the uninterrupted run"

# 1. the same files either way
"$zinc" train --steps 4 "${A[@]}" --set train.checkpoint.dir=bg --set train.checkpoint.every=1 \
    > bg.out 2>&1 &&
"$zinc" train --steps 4 "${A[@]}" --set train.checkpoint.dir=now --set train.checkpoint.every=1 \
    --set train.checkpoint.background=false > now.out 2>&1
check $? "4 steps saving every step, in the background and at once"
grep -q "written in the background" bg.out && ! grep -q "written in the background" now.out
check $? "the background run said its saves were written in the background"
same=0
for s in 3 4; do
    for f in master.bin m.bin v.bin; do
        cmp -s "bg/step-0000000$s/rank-0/$f" "now/step-0000000$s/rank-0/$f" || same=1
    done
done
check $same "steps 3 and 4: master.bin, m.bin and v.bin the same byte for byte"

# start_run DIR: a long run saving every step into DIR, in the background
# ($pid), once it has completed a checkpoint, then a random wait of up to
# one second
start_run() {
    "$zinc" train --steps 100 "${A[@]}" --set train.checkpoint.dir=$1 \
        --set train.checkpoint.every=1 > $1.out 2> $1.err &
    pid=$!
    wait_for $1.out '^checkpoint ' || { echo "run $1 made no checkpoint"; cat $1.err; exit 1; }
    sleep "0.$(( RANDOM % 10 ))$(( RANDOM % 10 ))"
}
# resumed DIR STEP: the run resumed from DIR's latest (step STEP) to $STEPS,
# saving every step, gives the uninterrupted run's later losses
resumed() {
    "$zinc" train --steps $STEPS "${A[@]}" --set train.checkpoint.dir=$1 --resume \
        --set train.checkpoint.every=1 --json-log $1.jsonl > $1.res 2>&1 &&
        [ "$(losses $1.jsonl 1)" = "$(losses ref.jsonl $(($2 + 1)))" ]
}

# 2. SIGTERM at random moments
for i in 1 2 3; do
    d=term$i
    start_run $d
    t0=$(date +%s.%N)
    kill -TERM $pid
    wait $pid
    rc=$?
    dt=$(python3 -c "import sys; print('%.1f' % ($(date +%s.%N) - $t0))")
    step=$(sed -n 's/.*stopped after step \([0-9]*\).*/\1/p' $d.err)
    [ $rc -eq 143 ] && python3 -c "import sys; sys.exit(not $dt < 10)"
    check $? "$d: exit $rc, ${dt} s after SIGTERM (at most 10 s)"
    [ -n "$step" ] && [ "$(cat $d/latest)" = "$(printf 'step-%08d' "$step")" ]
    check $? "$d: latest is the step the run stopped after (${step:-?}): $(cat $d/latest 2>/dev/null)"
    "$zinc" export $d --verify > /dev/null 2>&1
    check $? "$d: the checkpoint verifies"
    if [ "${step:-99}" -lt $STEPS ]; then
        resumed $d $step
        check $? "$d: resumed at step $step, steps $((step + 1))-$STEPS equal the uninterrupted run's"
    fi
done

# 3. kill -9 at random moments
for i in 1 2 3 4; do
    d=kill$i
    start_run $d
    kill -9 $pid
    wait $pid 2>/dev/null
    said=$(sed -n 's/^checkpoint [^ ]*step-0*\([0-9]*\) .*/\1/p' $d.out | tail -1)
    got=$(sed -n 's/^step-0*\([0-9]*\)$/\1/p' $d/latest)
    "$zinc" export $d --verify > /dev/null 2>&1 && [ -n "$got" ] && [ "$got" -ge "$said" ]
    check $? "$d: latest (step ${got:-?}) verifies, not older than the last completed ($said)"
    if [ $i -le 2 ] && [ -n "$got" ] && [ "$got" -lt $STEPS ]; then
        resumed $d $got
        check $? "$d: resumed at step $got, the uninterrupted run's losses"
        [ -z "$(ls -A $d | grep '^\.step-')" ]
        check $? "$d: the dead run's temporary folder is gone after the next save ($(ls -A $d))"
    fi
done
exit $fail
