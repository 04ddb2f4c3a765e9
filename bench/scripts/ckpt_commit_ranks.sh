#!/bin/bash
# Every step committed in place on 2 ranks (issue 55), torchrun-style over
# TCP on this host, on the host backend, with the Qwen2.5-0.5B-shaped model
# of ckpt_background_0.5b.json with its embedding untied (a tied one is
# refused at stage 3 on several ranks: 630M parameters), parameters and
# Adam state on NVMe (each rank's swap file under ./zinc-swap, the
# checkpoint folder beside it). In
# one run of this script:
#  - STEPS steps with every step committed and with commits off
#    (train.checkpoint.commit false: the final save only, in place): rank
#    0's step times (the first step left out), the commits' longest time,
#    the losses of the two runs compared bit for bit;
#  - NSIG SIGTERMs to both ranks at random moments of committing runs: the
#    seconds from the signal to both exits, the step of `latest` against
#    the last step rank 0 logged, `latest` verified.
# Usage, from the repository root with a build in build/:
# bash bench/scripts/ckpt_commit_ranks.sh; results on stdout
# (bench/results/ckpt-commit.md).
set -u
z=$PWD/build/zinc
cfg=$PWD/bench/scripts/ckpt_background_0.5b.json
. "$PWD/tests/ranks.sh"   # free_port
STEPS=${STEPS:-5}
NSIG=${NSIG:-2}
work=$(mktemp -d -p "${WORK:-$PWD}" ckpt-commit-ranks-XXXXXX)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cd "$work" || exit 1
grep -m1 "model name" /proc/cpuinfo; nproc; free -g | head -2; df -h . | tail -1
nv=(--set model.tie_word_embeddings=false
    --set zero_optimization.offload_param.device=\"nvme\"
    --set zero_optimization.offload_param.nvme_path=\"zinc-swap\"
    --set zero_optimization.offload_optimizer.device=\"nvme\"
    --set zero_optimization.offload_optimizer.nvme_path=\"zinc-swap\"
    --set tiers.create_nvme_path=true --set train.log_every=1 --set train.threads=1)
# start TAG ARGS...: 2 ranks in the background (zinc's own pids in RP), rank
# 0 logging TAG.jsonl, rank r's output in TAG.rR.out
start() {
    local tag=$1 p r log
    shift
    p=$(free_port)
    RP=()
    for r in 0 1; do
        log=()
        [ $r -eq 0 ] && log=(--json-log "$tag.jsonl")
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$p OMP_NUM_THREADS=1 "$z" train "$cfg" "${nv[@]}" "$@" "${log[@]}" \
            > "$tag.r$r.out" 2>&1 &
        RP+=($!)
    done
}
wait_all() { RCS=(); for p in "${RP[@]}"; do wait "$p"; RCS+=($?); done; }
step_s() {
    python3 - "$1" <<'PY'
import json, sys
s = [json.loads(l)["seconds"] for l in open(sys.argv[1])][1:]
print("mean %.2f s, max %.2f s over steps 2..%d" % (sum(s) / len(s), max(s), len(s) + 1)
      if s else "no steps")
PY
}
for mode in true false; do
    rm -rf ck-$mode zinc-swap
    start c-$mode --steps $STEPS --set train.checkpoint.dir=\"ck-$mode\" \
        --set train.checkpoint.commit=$mode
    wait_all
    [ "${RCS[*]}" = "0 0" ] || { tail -n 5 c-$mode.r0.out c-$mode.r1.out; exit 1; }
    "$z" export ck-$mode --verify > /dev/null || { echo "ck-$mode does not verify"; exit 1; }
    echo "commit $mode: $(step_s c-$mode.jsonl); $(grep -o '^[0-9]* steps committed in place.*' c-$mode.r0.out)"
done
grep '^on SIGTERM' c-true.r0.out | head -1
python3 - c-false.jsonl c-true.jsonl <<'PY'
import json, sys
a, b = ([json.loads(l)["loss_hex"] for l in open(f)] for f in sys.argv[1:])
print("losses with commits against without: %s" % ("identical" if a == b else "DIFFER"))
PY
for i in $(seq "$NSIG"); do
    rm -rf ck zinc-swap
    start s --steps 1000 --set train.checkpoint.dir=\"ck\"
    for _ in $(seq 3000); do
        grep -q "committed in place" s.r0.out 2>/dev/null && break
        sleep 0.1
    done
    d=$(awk -v r=$RANDOM 'BEGIN { printf "%.1f", r / 32767 * 20 }')
    sleep "$d"
    t0=$(date +%s.%N)
    kill -TERM "${RP[@]}"
    wait_all
    took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    ok=verified
    "$z" export ck --verify > /dev/null 2>&1 || ok="DOES NOT VERIFY"
    echo "SIGTERM $i, +$d s after the first commit: exits ${RCS[*]} in $took s; latest" \
         "$(cat ck/latest), rank 0 logged step $(grep -o '^step *[0-9]*/' s.r0.out | tail -1 | tr -dc '0-9'), $ok;" \
         "$(grep -o 'on the stop the update in flight was dropped.*' s.r0.out)"
done
