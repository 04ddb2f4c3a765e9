#!/usr/bin/env bash
# Checkpoints through `zinc train` / `zinc export` on the embedded tiny model
# (parameters in pinned RAM, Adam state on NVMe swap), checkpointing every
# step:
#  - kill -9 at each named point of the third save (ZINC_CKPT_KILL) and at
#    two wall-clock delays: `latest` always verifies, and `--resume` from it
#    reproduces the uninterrupted run's losses bit for bit (loss_hex in
#    --json-log) and cleans up the dead save's temporary folder;
#  - ENOSPC during a save, injected (ZINC_CKPT_FAULT) and real (a small
#    tmpfs, when mounting is permitted): with continue_on_error the run
#    warns and finishes, otherwise it stops with exit 1 and a clear error;
#    either way the previous checkpoint stays `latest` and intact and no
#    temporary folder remains;
#  - export writes an HF folder that `zinc eval` loads.
# The fast mode (suite unit) kills at three points and one delay; "slow"
# at every point and two delays.
set -u
here=$(dirname "$(realpath "$0")")
zinc=$(realpath "$1")
mode=${2:-fast}
fail=0
work=$(realpath "$(mktemp -d ckpt-cli-XXXXXX)")
mnt=""
cleanup() { [ -n "$mnt" ] && umount "$mnt" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
cd "$work"
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
S=8
common=(--steps $S --set train.log_every=100 --set train.checkpoint.every=1
        --set train.checkpoint.keep_last=2)

# the uninterrupted reference
"$zinc" train --steps $S --set train.log_every=100 --json-log ref.jsonl > ref.out 2>&1
rc=$?; check "[ \$rc -eq 0 ]" "reference run failed: $(tail -3 ref.out)"

# same_as_ref JSONL: every step against ref.jsonl, bit for bit
. "$here/loss_ref.sh"

resume_and_check() { # $1 label
    "$zinc" export ck --verify > verify.out 2>&1
    rc=$?; check "[ \$rc -eq 0 ]" "$1: latest does not verify: $(cat verify.out)"
    "$zinc" train --resume ck --steps $S --set train.log_every=100 --json-log res.jsonl \
        > res.out 2>&1
    local rc=$?
    check "[ $rc -eq 0 ]" "$1: resume exited $rc: $(tail -3 res.out)"
    local r; r=$(same_as_ref res.jsonl)
    rc=$?; check "[ \$rc -eq 0 ]" "$1: resumed losses differ: $r"
    check "[ -z \"\$(ls -a ck | grep '^\.step-')\" ]" "$1: temporary folders left: $(ls -a ck)"
    echo "$1: $(grep -o 'resumed from [^:]*' res.out), $r"
}

points="data manifest rename"
delays="0.3"
if [ "$mode" = slow ]; then
    points="begin tmpdir data rank manifest rename latest prune"
    delays="0.1 0.45"
fi
for point in $points; do
    rm -rf ck zinc-swap
    ZINC_CKPT_KILL=$point:3 "$zinc" train "${common[@]}" --set train.checkpoint.dir=ck \
        > kill.out 2>&1
    rc=$?
    check "[ $rc -eq 137 ]" "kill at $point: exit $rc, expected 137 (SIGKILL)"
    resume_and_check "kill -9 at '$point' of save 3"
done
for delay in $delays; do
    rm -rf ck zinc-swap
    "$zinc" train "${common[@]}" --set train.checkpoint.dir=ck > kill.out 2>&1 &
    pid=$!
    # once the first checkpoint exists, kill at a delay (mid-step or mid-save)
    for _ in $(seq 200); do [ -e ck/latest ] && break; sleep 0.1; done
    sleep $delay
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    if [ -e ck/latest ]; then
        resume_and_check "kill -9 ${delay}s after the first save"
    else
        echo "kill -9 ${delay}s after the first save: no checkpoint yet (machine slow), skipped"
    fi
done

# The final save keeps the state on NVMe in place (the swap file linked into
# the checkpoint, its unused ranges punched out): its files refer to the
# swap file, it verifies, and takes about the space of a copy; kill -9 at
# its points leaves a latest that verifies and resumes bit for bit, and the
# dead run's swap folder, reclaimed by the resume, takes nothing of the
# checkpoint with it.
fin=(--steps $S --set train.log_every=100 --set train.checkpoint.every=3
     --set train.checkpoint.keep_last=3)
rm -rf ck zinc-swap
"$zinc" train "${fin[@]}" --set train.checkpoint.dir=ck > fin.out 2>&1
rc=$?; check "[ \$rc -eq 0 ]" "a run with saves at steps 3, 6 and the end: $(tail -3 fin.out)"
f8=ck/step-0000000$S/rank-0
kind() { python3 "$(dirname "$(realpath "$0")")/ckpt_state.py" kind "$1" "$2"; }
kinds=""
for f in master.bin m.bin v.bin; do kinds+="$(kind $f8 $f) "; done
check "[ '$kinds' = 'ref ref ref ' ] && [ -f $f8/state.swp ] && [ ! -e $f8/m.bin ]" \
    "the final save did not keep the state in place: $kinds($(ls $f8))"
check "[ \"\$(kind ck/step-00000006/rank-0 m.bin)\" = copy ]" \
    "a periodic save (step 6) is not a copy"
"$zinc" export ck --verify > verify.out 2>&1
rc=$?; check "[ \$rc -eq 0 ]" "the in-place checkpoint does not verify: $(cat verify.out)"
state=$(( $(du -B1 -s ck/step-00000006/rank-0 | cut -f1) ))
kept=$(( $(du -B1 -s $f8 | cut -f1) ))
if grep -q "cannot punch holes" fin.out; then
    echo "in-place checkpoint: this file system cannot punch holes: $kept bytes kept (a copy: $state)"
else
    check "[ $kept -le $((state + state / 10 + (1 << 20))) ]" \
        "the in-place checkpoint takes $kept bytes on disk, a copy $state"
    echo "in-place checkpoint: $kept bytes on disk, a copy $state, the swap file $(stat -c %s $f8/state.swp)"
fi
for point in data manifest latest; do
    rm -rf ck zinc-swap
    ZINC_CKPT_KILL=$point:3 "$zinc" train "${fin[@]}" --set train.checkpoint.dir=ck \
        > kill.out 2>&1
    rc=$?
    check "[ $rc -eq 137 ]" "kill at $point of the final save: exit $rc, expected 137 (SIGKILL)"
    resume_and_check "kill -9 at '$point' of the final save (in place)"
    "$zinc" export ck --verify > verify.out 2>&1
    rc=$?; check "[ \$rc -eq 0 ]" "after the resume reclaimed the dead run's swap: $(cat verify.out)"
done

# ENOSPC injected into the 2nd save's writes (a save writes ~39 blocks of 1 MiB)
enospc() { # $1 dir, $2 continue(true/false), $3 latest expected, $4.. env
    local dir=$1 cont=$2 want=$3; shift 3
    rm -rf "$dir"/* zinc-swap
    env "$@" "$zinc" train --steps 3 --set train.log_every=100 --set train.checkpoint.every=1 \
        --set train.checkpoint.dir="$dir" --set train.checkpoint.continue_on_error=$cont \
        > enospc.out 2> enospc.err
    local rc=$?
    if [ "$cont" = true ]; then
        check "[ $rc -eq 0 ]" "ENOSPC ($dir, continue): exit $rc: $(cat enospc.err)"
        check "grep -q 'training goes on' enospc.err" "ENOSPC (continue): no warning"
    else
        check "[ $rc -eq 1 ]" "ENOSPC ($dir, stop): exit $rc, expected 1"
        check "grep -q 'previous one is intact' enospc.err" "ENOSPC (stop): unclear error: $(cat enospc.err)"
    fi
    check "grep -q 'No space left' enospc.err" "ENOSPC: error does not say so: $(cat enospc.err)"
    check "[ \"\$(cat $dir/latest)\" = $want ]" "ENOSPC: latest is $(cat $dir/latest 2>&1), expected $want"
    check "[ ! -e $dir/step-00000002 ]" "ENOSPC: the failed save's folder exists"
    check "\"$zinc\" export $dir --verify > /dev/null" "ENOSPC: the previous checkpoint does not verify"
    check "[ -z \"\$(ls -a $dir | grep '^\.step-')\" ]" "ENOSPC: temporary folder left: $(ls -a $dir)"
    echo "ENOSPC in $dir, continue_on_error=$cont: exit $rc: $(grep -o 'checkpoint.*' enospc.err | head -1 | cut -c1-150)"
}
mkdir -p inj
enospc inj true step-00000003 ZINC_CKPT_FAULT=45:ENOSPC
enospc inj false step-00000001 ZINC_CKPT_FAULT=45:ENOSPC
mkdir -p small
if mount -t tmpfs -o size=48m tmpfs small 2>/dev/null; then
    mnt="$work/small"
    enospc small true step-00000001 ZINC_LOG=warn
    enospc small false step-00000001 ZINC_LOG=warn
else
    echo "tmpfs mount not permitted: real-ENOSPC part skipped (injected part ran)"
fi

# export: an HF folder that zinc's own loader reads
"$zinc" export inj --out hf --dtype bf16 --shard-size 4MiB > export.out 2>&1
rc=$?; check "[ \$rc -eq 0 ]" "export failed: $(cat export.out)"
check "[ -f hf/config.json ] && [ -f hf/model.safetensors.index.json ] && [ -f hf/model-00002-of-00002.safetensors ]" \
      "export layout: $(ls hf)"
"$zinc" eval --model hf --data synthetic --seq-len 32 --batches 2 --device host > eval.out 2>&1
rc=$?; check "[ \$rc -eq 0 ]" "zinc eval on the export failed: $(cat eval.out)"
"$zinc" export nowhere --out x > /dev/null 2> bad.err
rc=$?
check "[ $rc -eq 1 ] && grep -q nowhere bad.err" "export of a missing checkpoint: $(cat bad.err)"

[ $fail -eq 0 ] && echo ok
exit $fail
