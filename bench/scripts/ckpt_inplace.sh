#!/bin/bash
# The NVMe tier kept in place by the final save (issue 55), on the host
# backend, with the Qwen2.5-0.5B-shaped model of ckpt_background_0.5b.json
# (494M parameters) but its parameters and Adam state on NVMe (./zinc-swap,
# the checkpoint folder beside it on the same file system). In one run of
# this script: the final save of a 2-step run copying the state
# (train.checkpoint.in_place false) and keeping it in place (the default),
# each checkpoint verified, their manifests' sizes and crc32c compared, and
# their space on disk; then NSIG SIGTERMs at random moments of runs with a
# periodic save every 2 steps, each way: the seconds from the signal to the
# exit against the "about T s at most" the run printed, latest verified.
# Usage, from the repository root with a build in build/:
# bash bench/scripts/ckpt_inplace.sh; results on stdout
# (bench/results/ckpt-inplace.md).
set -u
z=$PWD/build/zinc
cfg=$PWD/bench/scripts/ckpt_background_0.5b.json
NSIG=${NSIG:-3}
work=$(mktemp -d -p "${WORK:-$PWD}" ckpt-inplace-XXXXXX)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cd "$work" || exit 1
grep -m1 "model name" /proc/cpuinfo; nproc; free -g | head -2; df -h . | tail -1
nv=(--set zero_optimization.offload_param.device=\"nvme\"
    --set zero_optimization.offload_param.nvme_path=\"zinc-swap\"
    --set zero_optimization.offload_optimizer.device=\"nvme\"
    --set zero_optimization.offload_optimizer.nvme_path=\"zinc-swap\"
    --set tiers.create_nvme_path=true --set train.log_every=1)
# the checkpoint line's seconds ("checkpoint DIR (X s)")
save_s() { sed -n 's/^checkpoint .* (\([0-9.]*\) s)$/\1/p' "$1" | tail -1; }
for mode in false true; do
    d=final-$mode
    "$z" train "$cfg" "${nv[@]}" --steps 2 --set train.checkpoint.dir=$d \
        --set train.checkpoint.in_place=$mode > $d.out 2>&1 || { tail -5 $d.out; exit 1; }
    "$z" export $d --verify > /dev/null || exit 1
    echo "final save, in_place $mode: $(save_s $d.out) s; $(du -sh $d | cut -f1) on disk" \
         "($(ls $(ls -d $d/step-*)/rank-0 | tr '\n' ' '))"
done
python3 - final-false final-true <<'PY'
import glob, json, sys
a, b = (json.load(open(glob.glob(d + "/step-*/manifest.json")[0]))["files"] for d in sys.argv[1:])
for k in ("rank-0/master.bin", "rank-0/m.bin", "rank-0/v.bin"):
    same = a[k]["bytes"] == b[k]["bytes"] and a[k]["crc32c"] == b[k]["crc32c"]
    print("  %s: %d bytes, crc32c %08x copied, %08x in place: %s" % (
        k, a[k]["bytes"], a[k]["crc32c"], b[k]["crc32c"], "the same" if same else "DIFFERENT"))
PY
rm -rf final-false final-true
for mode in false true; do
    for i in $(seq $NSIG); do
        d=sig-$mode-$i
        "$z" train "$cfg" "${nv[@]}" --steps 100 --set train.checkpoint.dir=$d \
            --set train.checkpoint.every=2 --set train.checkpoint.in_place=$mode \
            > $d.out 2> $d.err &
        pid=$!
        until grep -q '^step *2/' $d.out 2>/dev/null || ! kill -0 $pid 2>/dev/null; do sleep 0.2; done
        sleep "$(python3 -c "import random; print('%.2f' % random.uniform(0, 30))")"
        t0=$(date +%s.%N)
        kill -TERM $pid
        wait $pid
        rc=$?
        t1=$(date +%s.%N)
        est=$(sed -n 's/.*about \([0-9.]*\) s at most.*/\1/p' $d.out | head -1)
        step=$(sed -n 's/.*stopped after step \([0-9]*\).*/\1/p' $d.err)
        "$z" export $d --verify > /dev/null 2>&1 && v=verifies || v="DOES NOT VERIFY"
        echo "in_place $mode, SIGTERM $i: exit $rc, $(python3 -c "print('%.2f' % ($t1 - $t0))") s" \
             "to the exit (printed: at most ${est:-?} s); stopped after step $step, latest" \
             "$(cat $d/latest 2>/dev/null), $v"
        grep -E "cancelled" $d.out | sed 's/^/    /'
        grep -E "error" $d.err | sed 's/^/    /'
        rm -rf $d
    done
done
