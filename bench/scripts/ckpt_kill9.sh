#!/bin/bash
# kill -9 at random moments of a run that checkpoints every step in the
# background (issue 55), with bench/scripts/ckpt_background_0.5b.json (494M
# parameters, everything in the cpu tier, 5.52 GiB a checkpoint): NKILL
# runs, each killed 0-12 s after its first completed checkpoint. After each:
# latest verifies (zinc export --verify) and is no older than the newest
# checkpoint the run said it completed; for the first NRES, the run resumed
# from it for one step gives the uninterrupted run's loss at that step bit
# for bit (its hex float). Usage, from the repository root with a build in
# build/: bash bench/scripts/ckpt_kill9.sh (results on stdout;
# bench/results/ckpt-background.md).
set -u
z=$PWD/build/zinc
cfg=$PWD/bench/scripts/ckpt_background_0.5b.json
NKILL=${NKILL:-20} NRES=${NRES:-5} REF=${REF:-8}
work=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cd "$work" || exit 1
grep -m1 "model name" /proc/cpuinfo; nproc
hexloss() { python3 -c "
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d['step'] == int(sys.argv[2]): print(d['loss_hex'])" "$1" "$2"; }
"$z" train "$cfg" --steps $REF --json-log ref.jsonl > ref.out 2>&1 || { cat ref.out; exit 1; }
bad=0
for i in $(seq $NKILL); do
    d=k$i
    "$z" train "$cfg" --steps 100 --set train.checkpoint.dir=$d --set train.checkpoint.every=1 \
        > $d.out 2> $d.err &
    pid=$!
    until grep -q '^checkpoint ' $d.out 2>/dev/null; do
        kill -0 $pid 2>/dev/null || { echo "run $i ended"; cat $d.err; exit 1; }
        sleep 0.2
    done
    sleep "$(python3 -c "import random; print('%.2f' % random.uniform(0, 12))")"
    kill -9 $pid
    wait $pid 2>/dev/null
    said=$(sed -n 's/^checkpoint [^ ]*step-0*\([0-9]*\) .*/\1/p' $d.out | tail -1)
    got=$(sed -n 's/^step-0*\([0-9]*\)$/\1/p' $d/latest)
    tmp=$(ls -A $d | grep -c '^\.step-')
    if "$z" export $d --verify > /dev/null 2>&1 && [ -n "$got" ] && [ "$got" -ge "$said" ]; then
        v="latest step $got verifies, the run had said $said complete ($tmp temporary folder(s) left)"
    else
        v="FAILED: latest ${got:-none} (said $said)"; bad=1
    fi
    if [ $i -le $NRES ] && [ -n "$got" ] && [ "$got" -lt $REF ]; then
        n=$((got + 1))
        if "$z" train "$cfg" --steps $n --set train.checkpoint.dir=$d --resume \
               --json-log $d.jsonl > $d.res 2>&1 &&
           [ "$(hexloss $d.jsonl $n)" = "$(hexloss ref.jsonl $n)" ] &&
           [ "$(ls -A $d | grep -c '^\.step-')" -eq 0 ]; then
            v="$v; resumed: step $n's loss $(hexloss $d.jsonl $n) = the uninterrupted run's, no temporary folder left"
        else
            v="$v; RESUME FAILED (step $n: $(hexloss $d.jsonl $n) vs $(hexloss ref.jsonl $n))"; bad=1
        fi
    fi
    echo "kill -9 $i: $v"
    rm -rf $d
done
echo "bad=$bad"
exit $bad
