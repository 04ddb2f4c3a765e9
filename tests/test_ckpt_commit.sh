#!/usr/bin/env bash
# Every step committed in place (train.checkpoint.commit, issue 55), through
# `zinc train` on the embedded tiny model (Adam state on NVMe swap, in two
# copies: each update writes the copy the last one did not):
#  - a run with checkpoints and no periodic save commits its initial state
#    and each step as the newest checkpoint by reference and ends with one
#    checkpoint, its swap file's unused ranges punched out; killed at its
#    first commit it resumes from step 0; a resumed run stopped before its
#    own first commit leaves the checkpoint it resumed from;
#  - kill -9 at random moments (after the first commit): `latest` always
#    verifies, lacks at most the steps since the last commit (the last
#    logged step and the one before), and `--resume` from it reproduces the
#    uninterrupted run's losses bit for bit (loss_hex), with 8-bit moments
#    (their fp32 blocks in RAM, written beside each commit) too;
#  - SIGTERM at random moments: exit 143 within 10 s, the update in flight
#    dropped or the commit kept as the final checkpoint, which verifies,
#    is punched and resumes bit for bit;
#  - train.checkpoint.commit false: no commits, the final save as before;
#  - 2 ranks: both commit every step; kill -9 of one or both, SIGTERM to
#    both: latest verifies and resumes on 2 ranks bit for bit.
# The delays are random and printed (a failure names its moment); "quick"
# mode kills at five moments instead of twenty.
set -u
here=$(dirname "$(realpath "$0")")
zinc=$(realpath "$1")
mode=${2:-full}
fail=0
work=$(realpath "$(mktemp -d ckpt-commit-XXXXXX)")
trap 'rm -rf "$work"' EXIT
cd "$work"
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
S=10
base=(--steps $S --set train.log_every=1)

# ref.jsonl holds the uninterrupted run of $1 (extra settings after it)
reference() {
    rm -rf zinc-swap
    "$zinc" train "${base[@]}" "$@" --json-log ref.jsonl > ref.out 2>&1
    local rc=$?
    check "[ $rc -eq 0 ]" "reference run failed: $(tail -3 ref.out)"
}

# same_as_ref JSONL: every step against ref.jsonl, bit for bit
. "$here/loss_ref.sh"

latest_step() { sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' ck/latest 2>/dev/null; }
last_logged() { grep -o '^step *[0-9]*/' "$1" | tail -1 | tr -dc '0-9'; }

# its allocated bytes are under 3/4 of its size: the ranges the commit does
# not refer to (params, gradients, the other copy) were punched out
punched() {
    local f; f=$(ls ck/"$(cat ck/latest)"/rank-0/state.swp 2>/dev/null) || return 1
    local alloc size
    alloc=$(($(stat -c %b "$f") * $(stat -c %B "$f")))
    size=$(stat -c %s "$f")
    [ $((alloc * 4)) -lt $((size * 3)) ]
}

# verify, the age bound, resume bit for bit. $1 label, $2 last logged step,
# extra settings after
check_resume() {
    local label=$1 logged=$2
    shift 2
    "$zinc" export ck --verify > verify.out 2>&1
    local rc=$?
    check "[ $rc -eq 0 ]" "$label: latest does not verify: $(cat verify.out)"
    local ls; ls=$(latest_step)
    check "[ -n '$ls' ] && [ '${ls:-0}' -ge $((${logged:-0} - 2)) ]" \
          "$label: latest is step '${ls}', the run had logged step '${logged}'"
    if [ "${ls:-0}" -ge $S ]; then   # killed after the final save
        echo "$label: latest step $ls, the run's end: nothing to resume"
        return
    fi
    rm -f res.jsonl
    "$zinc" train --resume ck "${base[@]}" "$@" --json-log res.jsonl > res.out 2>&1
    rc=$?
    check "[ $rc -eq 0 ]" "$label: resume exited $rc: $(tail -3 res.out)"
    local r; r=$(same_as_ref res.jsonl)
    rc=$?
    [ -s res.jsonl ] || { r="no steps"; rc=1; }
    check "[ $rc -eq 0 ]" "$label: resumed losses differ: $r"
    check "[ -z \"\$(ls -a ck | grep '^\.step-')\" ]" "$label: temporary folders left: $(ls -a ck)"
    echo "$label: latest step $ls (logged $logged), $r"
}

# starts a committing run, waits for its first commit, then sleeps $1 and
# sends $2; leaves its exit code in krc and the signal-to-exit time in ktook
kill_run() {
    local delay=$1 sig=$2
    shift 2
    rm -rf ck zinc-swap
    : > kill.out   # (emptied here: the loop below must not read the last run's)
    "$zinc" train "${base[@]}" --set train.checkpoint.dir=ck "$@" > kill.out 2>&1 &
    local pid=$!
    for _ in $(seq 600); do
        grep -q "step [0-9]* committed in place" kill.out 2>/dev/null && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.05
    done
    sleep "$delay"
    local t0; t0=$(date +%s.%N)
    kill -"$sig" $pid 2>/dev/null
    wait $pid 2>/dev/null
    krc=$?
    ktook=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
}

rnd_delay() { awk -v r=$RANDOM 'BEGIN { printf "%.2f", r / 32767 * 1.2 }'; }

reference

# an uninterrupted run: every step committed, one checkpoint at the end
rm -rf ck zinc-swap
"$zinc" train "${base[@]}" --set train.checkpoint.dir=ck > run.out 2>&1
rc=$?
check "[ $rc -eq 0 ]" "committing run exited $rc: $(tail -3 run.out)"
check "grep -q 'step 1 committed in place' run.out" "no commit said: $(grep -i checkp run.out)"
check "[ \"\$(ls ck)\" = \"latest
step-0000000$S\" ] || [ \"\$(ls ck)\" = \"latest
step-000000$S\" ]" "the run left $(ls ck | tr '\n' ' ')"
check "punched" "the final checkpoint's swap file was not punched: $(du -h ck/*/rank-0/state.swp)"
check "[ -z \"\$(ls zinc-swap 2>/dev/null)\" ]" "swap files left: $(ls zinc-swap)"
"$zinc" export ck --verify > verify.out 2>&1
check "[ $? -eq 0 ]" "the final checkpoint does not verify: $(cat verify.out)"

# periodic copies among the commits: keep_last counts the copies and the
# final save, not the running run's commit (two commits after the copy of
# step 3 must not prune it)
rm -rf ck zinc-swap
"$zinc" train --steps 6 --set train.log_every=1 --set train.checkpoint.dir=ck \
    --set train.checkpoint.every=3 --set train.checkpoint.keep_last=2 > keep.out 2>&1
rc=$?
check "[ $rc -eq 0 ]" "every 3 with commits exited $rc: $(tail -3 keep.out)"
check "[ \"\$(ls ck | tr '\n' ' ')\" = 'latest step-00000003 step-00000006 ' ]" \
      "every 3, keep 2: the run left $(ls ck | tr '\n' ' ')"

n=20
[ "$mode" = quick ] && n=5
punch_checked=0
for i in $(seq $n); do
    d=$(rnd_delay)
    kill_run "$d" KILL
    if [ $krc -ne 137 ]; then
        # the run ended first: its end is no kill
        check "[ $krc -eq 0 ]" "kill -9 $i (+${d} s): exit $krc: $(tail -3 kill.out)"
        continue
    fi
    killed=$(cat ck/latest 2>/dev/null)
    check_resume "kill -9 $i at +${d} s" "$(last_logged kill.out)"
    # the resume punched the killed run's commit (its swap folder reclaimed,
    # the commit's state.swp had no other name); keep_last kept it
    f=ck/$killed/rank-0/state.swp
    if [ $punch_checked -eq 0 ] && [ -e "$f" ] && [ "$killed" != step-00000000 ]; then
        punch_checked=1
        check "[ \$((\$(stat -c %b $f) * \$(stat -c %B $f) * 4)) -lt \$((\$(stat -c %s $f) * 3)) ]" \
              "the killed run's commit $killed was not punched at the resume: $(du -h $f)"
        # ... before the resumed run sized its nvme tier: the dead run's
        # folder went first, its swap file said to stay the commit's
        a=$(grep -n "stays a checkpoint's (its state.swp)" res.out | head -1 | cut -d: -f1)
        b=$(grep -n '^  budgets' res.out | head -1 | cut -d: -f1)
        check "[ -n '$a' ] && [ -n '$b' ] && [ '${a:-0}' -lt '${b:-0}' ]" \
              "the resume did not reclaim the killed run's folder before sizing its tiers: $(grep -n -E 'swap:|budgets' res.out)"
    fi
done
check "[ $punch_checked -eq 1 ]" "no killed run's commit was left to check the resume's punch on"

for i in 1 2 3; do
    d=$(rnd_delay)
    kill_run "$d" TERM
    [ $krc -eq 0 ] && continue   # the run ended first
    check "[ $krc -eq 143 ]" "SIGTERM $i (+${d} s): exit $krc, expected 143: $(tail -3 kill.out)"
    check "awk -v t=$ktook 'BEGIN { exit !(t < 10) }'" "SIGTERM $i: $ktook s to exit"
    check "grep -q -E 'update in flight was dropped|kept as the final checkpoint' kill.out" \
          "SIGTERM $i: neither dropped nor kept: $(grep -i -E 'checkp|stop' kill.out)"
    check "punched" "SIGTERM $i: the checkpoint's swap file was not punched"
    check_resume "SIGTERM $i at +${d} s (exit in $ktook s)" "$(last_logged kill.out)"
done

# a fresh run commits its initial state: killed as soon as `latest` names
# it (before any step's commit), it resumes from step 0 bit for bit
rm -rf ck zinc-swap
"$zinc" train "${base[@]}" --set train.checkpoint.dir=ck > kill.out 2>&1 &
pid=$!
for _ in $(seq 1000); do [ -e ck/latest ] && break; sleep 0.01; done
kill -KILL $pid 2>/dev/null
wait $pid 2>/dev/null
check "[ \"\$(cat ck/latest 2>/dev/null)\" = step-00000000 ] || [ \"\$(cat ck/latest 2>/dev/null)\" = step-00000001 ]" \
      "the first commit is not step 0's: latest '$(cat ck/latest 2>/dev/null)'"
check_resume "kill -9 at the first commit" ""

# a resumed run falls back on the checkpoint it resumed from: SIGTERM once
# its first step is logged (that step's commit waits for its update) exits
# at once, leaving that checkpoint or the commit if it landed first
rm -rf ck zinc-swap
"$zinc" train --steps 3 --set train.log_every=1 --set train.checkpoint.dir=ck > first.out 2>&1
: > kill.out
"$zinc" train --resume ck "${base[@]}" > kill.out 2>&1 &
pid=$!
for _ in $(seq 1000); do grep -q '^step *4/' kill.out 2>/dev/null && break; sleep 0.005; done
t0=$(date +%s.%N)
kill -TERM $pid 2>/dev/null
wait $pid 2>/dev/null
krc=$?
ktook=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
if [ $krc -ne 0 ]; then
    check "[ $krc -eq 143 ]" "resumed run, SIGTERM at step 4: exit $krc: $(tail -3 kill.out)"
    check "awk -v t=$ktook 'BEGIN { exit !(t < 10) }'" "resumed run, SIGTERM: $ktook s to exit"
    check "[ \"\$(latest_step)\" -ge 3 ]" "resumed run, SIGTERM: latest $(latest_step)"
    echo "resumed run, SIGTERM at step 4: $(grep -o -E 'is the checkpoint \(.*\)|kept as the final checkpoint' kill.out) in $ktook s"
    check_resume "resumed run, SIGTERM at step 4" "$(last_logged kill.out)"
fi

# 8-bit moments: their fp32 blocks stay in RAM and go beside each commit
reference --set train.optim=adamw_bnb_8bit
d=$(rnd_delay)
kill_run "$d" KILL --set train.optim=adamw_bnb_8bit
if [ $krc -eq 137 ]; then
    check_resume "8-bit moments, kill -9 at +${d} s" "$(last_logged kill.out)" \
        --set train.optim=adamw_bnb_8bit
fi

# off: no commits; the stop's final save keeps the state in place as before
reference
rm -rf ck zinc-swap
"$zinc" train "${base[@]}" --set train.checkpoint.dir=ck --set train.checkpoint.commit=false \
    > off.out 2>&1
rc=$?
check "[ $rc -eq 0 ]" "commit=false run exited $rc"
check "! grep -q 'committed in place' off.out" "commit=false still committed"
check "[ -e ck/\"\$(cat ck/latest)\"/rank-0/state.swp ]" "commit=false: the final save not in place: $(ls ck/*/rank-0)"

# Two ranks (torchrun-style over TCP, a swap file each): both commit every
# step, completed between steps (the ranks agree, rank 0 writes `latest`).
# kill -9 of one rank or both at random moments: the survivor stops on the
# dead peer, latest verifies, lacks at most the steps since the last
# commit, and resumes on 2 ranks bit for bit; SIGTERM to both: exit 143
# within 10 s, the update in flight dropped or the commit kept.
. "$here/ranks.sh"
# (zinc's own pids, no timeout in between: a signal to timeout is passed on
# to its process group as well, and zinc takes the second one as "stop at
# once"; with --foreground a kill -9 of timeout leaves zinc running; the
# test's own timeout bounds a hang)
start2() {  # start2 TAG ARGS...: 2 ranks in the background, pids in RP
    local tag=$1 p r
    shift
    p=$(free_port)
    RP=()
    for r in 0 1; do
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$p "$zinc" train "$@" > "$tag.r$r.out" 2>&1 &
        RP+=($!)
    done
}
rm -rf ck zinc-swap
run2 ref2 "${base[@]}" > /dev/null 2>&1
check "[ $? -eq 0 ] && [ -s ref2.jsonl ]" "2 ranks: the reference run failed: $(tail -3 ref2.r0.out)"
cp ref2.jsonl ref.jsonl
run2 c2 "${base[@]}" --set train.checkpoint.dir=ck > /dev/null 2>&1
check "[ $? -eq 0 ]" "2 ranks committing: $(tail -n 3 c2.r0.out c2.r1.out)"
check "grep -q 'committed in place' c2.r0.out" "2 ranks: no commit said: $(grep -i checkp c2.r0.out)"
r=$(same_as_ref c2.jsonl)
check "[ $? -eq 0 ]" "2 ranks: committing changed the losses: $r"
n2=6
[ "$mode" = quick ] && n2=3
for i in $(seq $n2); do
    for sig in KILL TERM; do
        [ $sig = TERM ] && [ $i -gt 2 ] && continue
        rm -rf ck zinc-swap
        : > k2.r0.out
        start2 k2 "${base[@]}" --set train.checkpoint.dir=ck
        for _ in $(seq 600); do
            grep -q "committed in place" k2.r0.out 2>/dev/null && break
            kill -0 ${RP[0]} 2>/dev/null || break
            sleep 0.05
        done
        d=$(rnd_delay)
        sleep "$d"
        who="0 1"
        [ $sig = KILL ] && who=$((RANDOM % 3)) && [ "$who" = 2 ] && who="0 1"
        t0=$(date +%s.%N)
        for r in $who; do kill -$sig ${RP[$r]} 2>/dev/null; done
        rcs=()
        for r in 0 1; do wait ${RP[$r]} 2>/dev/null; rcs+=($?); done
        took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
        label="2 ranks, $sig to rank(s) $who at +$d s (exits ${rcs[*]} in $took s)"
        if [ "${rcs[0]}" -eq 0 ] && [ "${rcs[1]}" -eq 0 ]; then continue; fi  # ended first
        if [ $sig = TERM ]; then
            check "[ ${rcs[0]} -eq 143 ] && [ ${rcs[1]} -eq 143 ]" "$label: not 143: $(tail -2 k2.r0.out)"
            check "awk -v t=$took 'BEGIN { exit !(t < 10) }'" "$label: too slow"
        fi
        check "[ -z \"\$(ls -a ck | grep '^\.step-.*-[0-9]*$' | grep -v tmp)\" ]" "$label: $(ls -a ck)"
        "$zinc" export ck --verify > verify.out 2>&1
        check "[ $? -eq 0 ]" "$label: latest does not verify: $(cat verify.out)"
        ls=$(latest_step) logged=$(last_logged k2.r0.out)
        check "[ -n '$ls' ] && [ '${ls:-0}' -ge $((${logged:-0} - 2)) ]" \
              "$label: latest is step '$ls', rank 0 had logged step '$logged'"
        [ "${ls:-0}" -ge $S ] && continue
        rm -f res2.jsonl
        run2 res2 --resume ck "${base[@]}" > /dev/null 2>&1
        check "[ $? -eq 0 ]" "$label: resume on 2 ranks: $(tail -2 res2.r0.out)"
        r=$(same_as_ref res2.jsonl)
        rc=$?
        [ -s res2.jsonl ] || { r="no steps"; rc=1; }
        check "[ $rc -eq 0 ]" "$label: resumed losses differ: $r"
        echo "$label: latest step $ls (logged $logged), $r"
    done
done

[ $fail -eq 0 ] && echo "ckpt commit: all checks passed"
exit $fail
