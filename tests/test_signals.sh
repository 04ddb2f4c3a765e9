#!/usr/bin/env bash
# A run stopped by its machine (issue 32): SIGTERM finishes the step in
# progress, saves a checkpoint, removes the swap files and exits 143, and the
# run resumes from that checkpoint; a second SIGINT stops at once and still
# leaves no swap file; the swap files of a run killed with -9 are found and
# removed by the next run, never those of a run that is alive; a damaged
# latest checkpoint falls back to the newest that verifies.
# Usage: test_signals.sh ZINC
set -u
zinc=$(readlink -f "$1")
work=$(mktemp -d "${TMPDIR:-/tmp}/zn_signals.XXXXXX")
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cd "$work" || exit 99
fail=0
check() {  # check CONDITION-EXIT-CODE MESSAGE
    if [ "$1" -ne 0 ]; then
        echo "FAIL: $2"
        fail=1
    else
        echo "ok: $2"
    fi
}
# waits (up to 60 s) until FILE has a line matching PATTERN
wait_for() {
    for _ in $(seq 600); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}
swaps() { find "$1" -name 'zinc-train.*.swp' 2>/dev/null | wc -l; }

# 1. SIGTERM mid-run: the step finishes, a checkpoint, no swap file, 143
mkdir a && cd a || exit 99
"$zinc" train --steps 100000 --set train.checkpoint.dir=\"ck\" > out.txt 2> err.txt &
pid=$!
wait_for out.txt '^step ' || { echo "run 1 did not start"; cat err.txt; exit 1; }
[ "$(swaps zinc-swap)" -eq 1 ]
check $? "a running run has its swap file"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ]
check $? "SIGTERM: exit 143 (got $rc)"
[ "$(swaps zinc-swap)" -eq 0 ]
check $? "SIGTERM: no swap file left"
step=$(sed -n 's/.*stopped after step \([0-9]*\).*/\1/p' err.txt)
[ -n "$step" ] && [ "$(cat ck/latest)" = "$(printf 'step-%08d' "$step")" ]
check $? "SIGTERM: the checkpoint of step ${step:-?} is ck/latest ($(cat ck/latest 2>/dev/null))"
grep -q "s after the signal" err.txt
check $? "SIGTERM: the time from signal to exit is printed"
"$zinc" export ck --verify > /dev/null 2>&1
check $? "SIGTERM: the checkpoint verifies"
"$zinc" train --steps $((step + 2)) --set train.checkpoint.dir=\"ck\" --resume > r.txt 2>&1
check $? "the stopped run resumes from step $step"
grep -q "trained 2 steps" r.txt
check $? "the resumed run trained the 2 steps left"
cd ..

# 2. two SIGINTs: at once, and still no swap file
mkdir b && cd b || exit 99
"$zinc" train --steps 100000 > out.txt 2> err.txt &
pid=$!
wait_for out.txt '^step ' || { echo "run 2 did not start"; exit 1; }
kill -INT $pid
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ]
check $? "two SIGINTs: ended by the signal (exit $rc)"
[ "$(swaps zinc-swap)" -eq 0 ]
check $? "two SIGINTs: no swap file left"
cd ..

# 3. kill -9 leaves a swap file; the next run removes it, but never the file
# of a run that is alive in the same folder
mkdir c && cd c || exit 99
"$zinc" train --steps 100000 > dead.txt 2>&1 &
dead=$!
wait_for dead.txt '^step ' || { echo "run 3 did not start"; exit 1; }
kill -9 $dead
wait $dead 2>/dev/null
[ "$(swaps zinc-swap)" -eq 1 ]
check $? "kill -9 leaves its swap file"
"$zinc" train --steps 100000 > live.txt 2>&1 &
live=$!
wait_for live.txt '^step ' || { echo "run 4 did not start"; exit 1; }
grep -q "zinc-train.$dead.*left by run $dead, which is gone" live.txt
check $? "the next run reports the dead run's file"
[ "$(swaps zinc-swap)" -eq 1 ] && [ -n "$(find zinc-swap -name "zinc-train.$live.*")" ]
check $? "the next run removed it (its own file is the one left)"
"$zinc" train --steps 3 > third.txt 2>&1
check $? "a third run beside the live one trains"
! grep -q "left by run $live" third.txt && [ -n "$(find zinc-swap -name "zinc-train.$live.*")" ]
check $? "the live run's file is untouched"
kill -TERM $live
wait $live
[ "$(swaps zinc-swap)" -eq 0 ]
check $? "everything is gone once the live run stopped"
cd ..

# 4. a damaged latest: --resume verifies, names the damage and falls back to
# the newest checkpoint that verifies; with none left, it refuses
mkdir d && cd d || exit 99
"$zinc" train --steps 6 --set train.checkpoint.dir=\"ck\" --set train.checkpoint.every=2 \
    --set train.checkpoint.keep_last=3 > t.out 2>&1
check $? "a run with checkpoints at steps 2, 4 and 6"
flip() {  # flips one byte in the middle of FILE
    local f=$1 size
    size=$(stat -c %s "$f")
    printf '\x5a' | dd of="$f" bs=1 seek=$((size / 2)) conv=notrunc status=none
}
flip ck/step-00000006/rank-0/m.bin
"$zinc" train --steps 8 --set train.checkpoint.dir=\"ck\" --resume > r.out 2> r.err
check $? "a damaged latest: the run resumes"
grep -q "damaged.*m.bin.*resuming from step-00000004" r.err
check $? "it names the damaged file and the step it resumes from: $(grep damaged r.err)"
grep -q "trained 4 steps" r.out
check $? "it trained steps 5-8 again"
for s in 2 4 6 8; do [ -d ck/step-0000000$s ] && flip ck/step-0000000$s/rank-0/v.bin; done
"$zinc" train --steps 10 --set train.checkpoint.dir=\"ck\" --resume > n.out 2> n.err
rc=$?
[ $rc -eq 1 ] && grep -q "v.bin" n.err && grep -q "no older checkpoint" n.err
check $? "nothing verifies: refused (exit $rc) naming the file: $(tail -1 n.err)"
cd ..

[ $fail -eq 0 ] && echo "signals: all passed" || echo "signals: FAILED"
exit $fail
