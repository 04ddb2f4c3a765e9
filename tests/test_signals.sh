#!/usr/bin/env bash
# A run stopped by its machine (issue 32): SIGTERM finishes the step in
# progress, saves a checkpoint, removes the swap files and exits 143, and the
# run resumes from that checkpoint; a second SIGINT stops at once and still
# leaves no swap file, nor does SIGTERM to zinc bench train; the run directory of a run killed with -9 is found and
# removed by the next run, never that of a run that is alive (nor one whose
# lock is held, nor another host's); a damaged
# latest checkpoint falls back to the newest that verifies.
# Usage: test_signals.sh ZINC
set -u
. "$(dirname "$(realpath "$0")")/common.sh"   # check, wait_for
zinc=$(readlink -f "$1")
work=$(mktemp -d "${TMPDIR:-/tmp}/zn_signals.XXXXXX")
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cd "$work" || exit 99
fail=0
swaps() { find "$1" -name 'zinc-train.*.swp' 2>/dev/null | wc -l; }
# run directories in FOLDER: zinc-run.<host>.<pid>.<start>.<k>
rundirs() { find "$1" -mindepth 1 -maxdepth 1 -name 'zinc-run.*' 2>/dev/null | wc -l; }
# the run directory of PID in FOLDER
rundir_of() { find "$1" -mindepth 1 -maxdepth 1 -name "zinc-run.*.$2.*" 2>/dev/null; }

# 1. SIGTERM mid-run: the step finishes, a checkpoint, no swap file, 143
mkdir a && cd a || exit 99
"$zinc" train --steps 100000 --set train.checkpoint.dir=\"ck\" > out.txt 2> err.txt &
pid=$!
wait_for out.txt '^step ' || { echo "run 1 did not start"; cat err.txt; exit 1; }
[ "$(swaps zinc-swap)" -eq 1 ] && [ "$(rundirs zinc-swap)" -eq 1 ]
check $? "a running run has its swap file, in its run directory"
rd=$(rundir_of zinc-swap $pid)
[ -n "$rd" ] && [ "$(stat -c %a "$rd")" = 700 ] && [ -f "$rd/lock" ] &&
    grep -q "^pid $pid\$" "$rd/lock" && grep -q "^host " "$rd/lock" && grep -q "^start " "$rd/lock"
check $? "the run directory is 0700, with a lock file naming host, PID and start: $(cat "$rd/lock" 2>/dev/null)"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ]
check $? "SIGTERM: exit 143 (got $rc)"
[ "$(swaps zinc-swap)" -eq 0 ] && [ -z "$(ls -A zinc-swap)" ]
check $? "SIGTERM: no swap file or run directory left ($(ls -A zinc-swap))"
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
[ "$(swaps zinc-swap)" -eq 0 ] && [ -z "$(ls -A zinc-swap)" ]
check $? "two SIGINTs: no swap file or run directory left ($(ls -A zinc-swap))"
cd ..

# 2b. the other commands that swap to disk (here zinc bench train, which
# has no step to finish): SIGTERM removes their swap files and run
# directory, then ends them by the signal
mkdir bt && cd bt || exit 99
"$zinc" bench train --steps 100000 --warmup 1 > out.txt 2> err.txt &
pid=$!
for _ in $(seq 600); do [ "$(swaps zinc-swap)" -ge 1 ] && break; sleep 0.05; done
[ "$(swaps zinc-swap)" -eq 1 ]
check $? "zinc bench train runs with its swap file"
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 143 ]
check $? "zinc bench train on SIGTERM: ended by the signal (exit $rc)"
[ "$(swaps zinc-swap)" -eq 0 ] && [ -z "$(ls -A zinc-swap)" ]
check $? "zinc bench train on SIGTERM: no swap file or run directory left ($(ls -A zinc-swap))"
cd ..

# 3. kill -9 leaves a run directory; the next run removes it, but never the
# directory of a run that is alive in the same folder, nor one whose lock
# another process holds, nor another host's; and an old-layout file
# (zinc-train.PID.n.i.swp in the folder itself) of a dead run goes too
mkdir c && cd c || exit 99
"$zinc" train --steps 100000 > dead.txt 2>&1 &
dead=$!
wait_for dead.txt '^step ' || { echo "run 3 did not start"; exit 1; }
kill -9 $dead
wait $dead 2>/dev/null
[ "$(swaps zinc-swap)" -eq 1 ] && [ -n "$(rundir_of zinc-swap $dead)" ]
check $? "kill -9 leaves its run directory"
deaddir=$(rundir_of zinc-swap $dead)
# beside it: a dead run's directory whose lock a live process holds (the
# PID in its name is gone), one of another host, and an old-layout file of
# a dead run (PID $dead's)
host=$(uname -n | tr -c 'A-Za-z0-9._\n-' '_')
held="zinc-swap/zinc-run.$host.$dead.1700000000.7"
other="zinc-swap/zinc-run.elsewhere.example.$dead.1700000000.0"
mkdir -m 700 "$held" "$other" && touch "$held/lock" "$other/lock" &&
    head -c 1048576 /dev/zero > "$other/zinc-train.0.swp" &&
    head -c 1048576 /dev/zero > "zinc-swap/zinc-train.$dead.0.0.swp" || exit 99
( exec 9<> "$held/lock" && flock 9 && exec sleep 60 ) &   # the sleep holds the lock
holder=$!
for _ in $(seq 50); do flock -n "$held/lock" true || break; sleep 0.1; done
"$zinc" train --steps 100000 > live.txt 2>&1 &
live=$!
wait_for live.txt '^step ' || { echo "run 4 did not start"; exit 1; }
grep -q "removed .*zinc-run\.$host\.$dead\..*left by run $dead .*which is gone ([0-9.]* [KMG]iB)" live.txt
check $? "the next run reports the dead run's directory with its size: $(grep "run $dead" live.txt)"
[ ! -e "$deaddir" ] && [ -n "$(rundir_of zinc-swap $live)" ]
check $? "the next run removed it (its own directory is there)"
grep -q "removed .*/zinc-swap/zinc-train.$dead.0.0.swp, left by run $dead" live.txt &&
    [ ! -e "zinc-swap/zinc-train.$dead.0.0.swp" ]
check $? "an old-layout file of a dead run is removed too"
[ -d "$held" ] && grep -q "$held.*still locked; left in place" live.txt
check $? "a directory whose lock is held is left: $(grep "$held" live.txt)"
[ -f "$other/zinc-train.0.swp" ] &&
    grep -q "$other (1.00 MiB) belongs to run $dead on host elsewhere.example.*left in place" live.txt
check $? "another host's directory is left, and named: $(grep elsewhere live.txt)"
kill $holder; wait $holder 2>/dev/null
"$zinc" train --steps 3 > third.txt 2>&1
check $? "a third run beside the live one trains"
! grep -q "left by run $live" third.txt && [ -n "$(rundir_of zinc-swap $live)" ] &&
    [ "$(swaps "$(rundir_of zinc-swap $live)")" -eq 1 ]
check $? "the live run's directory is untouched"
[ ! -e "$held" ] && grep -q "removed .*/$held" third.txt
check $? "the held directory goes once its lock is free"
kill -TERM $live
wait $live
rm -rf "$other"
[ "$(swaps zinc-swap)" -eq 0 ] && [ -z "$(ls -A zinc-swap)" ]
check $? "everything is gone once the live run stopped ($(ls -A zinc-swap))"
cd ..

# 4. a damaged latest: --resume verifies, names the damage and falls back to
# the newest checkpoint that verifies; with none left, it refuses
mkdir d && cd d || exit 99
"$zinc" train --steps 6 --set train.checkpoint.dir=\"ck\" --set train.checkpoint.every=2 \
    --set train.checkpoint.keep_last=3 > t.out 2>&1
check $? "a run with checkpoints at steps 2, 4 and 6"
# flip RANKDIR FILE: one byte in the middle of FILE's bytes, in the file or
# (a final save on NVMe keeps the state in place) in the swap file linked
# into the folder
flip() { python3 "$(dirname "$(realpath "$0")")/ckpt_state.py" flip "$1" "$2"; }
flip ck/step-00000006/rank-0 m.bin
"$zinc" train --steps 8 --set train.checkpoint.dir=\"ck\" --resume > r.out 2> r.err
check $? "a damaged latest: the run resumes"
grep -q "damaged.*m.bin.*resuming from step-00000004" r.err
check $? "it names the damaged file and the step it resumes from: $(grep damaged r.err)"
grep -q "trained 4 steps" r.out
check $? "it trained steps 5-8 again"
# (step 8 is the resumed run's final save: in place)
ckpt_kind=$(python3 "$(dirname "$(realpath "$0")")/ckpt_state.py" kind ck/step-00000008/rank-0 v.bin)
for s in 2 4 6 8; do [ -d ck/step-0000000$s ] && flip ck/step-0000000$s/rank-0 v.bin; done
"$zinc" train --steps 10 --set train.checkpoint.dir=\"ck\" --resume > n.out 2> n.err
rc=$?
[ $rc -eq 1 ] && grep -q "v.bin" n.err && grep -q "no older checkpoint" n.err
check $? "nothing verifies (the newest kept in place: $ckpt_kind): refused (exit $rc) naming the file: $(tail -1 n.err)"
[ "$ckpt_kind" = ref ]
check $? "the final save of a run with its optimizer on NVMe keeps it in place ($ckpt_kind)"
cd ..

[ $fail -eq 0 ] && echo "signals: all passed" || echo "signals: FAILED"
exit $fail
