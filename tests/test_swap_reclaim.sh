#!/usr/bin/env bash
# The space a run killed with -9 left in its swap folder is the next run's:
# on a small file system of exact size (a tmpfs) a run whose tiers.nvme size
# fits only once the dead run's files are gone starts, says it removed them
# and trains; `zinc plan` on the same state says it fits and names the space
# a run reclaims, removing nothing; beside a live run instead, the second
# run is refused naming the live run's folder and size (and the checkpoint
# directory on that file system).
# Usage: test_swap_reclaim.sh ZINC SOURCE_ROOT
set -u
. "$(dirname "$(realpath "$0")")/common.sh"   # check, wait_for
zinc=$(readlink -f "$1")
tiny=$(readlink -f "$2")/examples/tiny.json
work=$(mktemp -d "${TMPDIR:-/tmp}/zn_reclaim.XXXXXX")
mnt=""
cleanup() {
    kill -9 $(jobs -p) 2>/dev/null
    wait 2>/dev/null
    [ -n "$mnt" ] && umount "$mnt" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
cd "$work" || exit 99
fail=0
rundir_of() { find "$1" -mindepth 1 -maxdepth 1 -name "zinc-run.*.$2.*" 2>/dev/null; }
mib() { echo $(( $(du -s -B1 "$1" | cut -f1) / 1048576 )); }  # disk use, MiB down
free_mib() { echo $(( $(df -B1 --output=avail "$1" | tail -1) / 1048576 )); }

# 64 MiB: the demo's Adam state (its swap file) takes more than half of it
mkdir fs || exit 99
if ! mount -t tmpfs -o size=64m tmpfs fs 2>/dev/null; then
    echo "SKIP: mounting a tmpfs is not permitted here"
    exit 77
fi
mnt="$work/fs"
mkdir fs/swap || exit 99
# the swap folder of the run, sized by SIZE (MiB), in the array sw
swapset() {
    sw=(--set "tiers.nvme=[{\"path\": \"$mnt/swap\", \"size\": \"$1MiB\"}]"
        --set "zero_optimization.offload_optimizer.nvme_path=\"$mnt/swap\"")
}

# 1. a run's swap file, to size the rest: what it takes and what is left
total=$(free_mib fs)
swapset "$total"
"$zinc" train --steps 100000 "${sw[@]}" > dead.txt 2>&1 &
dead=$!
wait_for dead.txt '^step ' || { echo "the first run did not start"; cat dead.txt; exit 99; }
deaddir=$(rundir_of "$mnt/swap" $dead)
[ -n "$deaddir" ] || { echo "no run directory of run $dead"; exit 99; }
used=$(mib "$deaddir")
left=$(free_mib fs)
# fits once the dead run's files are gone, not before
size=$((left + used / 2))
[ "$used" -gt 0 ] && [ $((used + 1)) -le "$size" ] && [ "$size" -le "$total" ] ||
    { echo "cannot size the test: the swap takes $used MiB of $total, $left left"; exit 99; }
echo "the run's swap takes $used MiB of $total MiB; $left MiB left; the second asks $size MiB"
kill -9 $dead
wait $dead 2>/dev/null
[ -d "$deaddir" ]
check $? "kill -9 leaves its run directory ($deaddir)"

# 2. zinc plan: it fits, counting the dead run's files, and removes nothing
swapset "$size"
"$zinc" plan "$tiny" "${sw[@]}" > plan.out 2> plan.err
rc=$?
check $(( rc != 0 )) "zinc plan exits 0 (rc $rc): $(cat plan.err)"
said="tiers.nvme: the file system of $mnt/swap holds [0-9.]* MiB of swap files that dead"
said+=" runs left (1, in its swap folders); a run removes them before it starts"
said+=".*with them gone tiers.nvme fits"
grep -q "$said" plan.err
check $? "zinc plan names the space a run reclaims and says it fits: $(grep 'dead runs' plan.err)"
! grep -q "cannot run this plan" plan.err
check $? "zinc plan does not say the machine cannot run it"
[ -d "$deaddir" ]
check $? "zinc plan removed nothing"

# an "auto" size (the folder alone) counts the dead run's files as free too
"$zinc" plan "$tiny" --set "tiers.nvme=\"$mnt/swap\"" \
    --set "zero_optimization.offload_optimizer.nvme_path=\"$mnt/swap\"" > auto.out 2> auto.err
auto=$(awk '/^budget/ { v = $(NF-1); u = $NF
                        m = u == "GiB" ? v * 1024 : u == "KiB" ? v / 1024 : u == "B" ? 0 : v
                        printf "%d", m }' auto.out)
[ -n "$auto" ] && [ "$auto" -ge $((left + used - 1)) ]
check $? "an auto tiers.nvme counts the dead run's $used MiB: budget ${auto:-?} MiB, $left MiB free"
[ -d "$deaddir" ]
check $? "the auto plan removed nothing"

# 3. the second run: removes the leftovers, then its space fits, and trains
"$zinc" train --steps 3 "${sw[@]}" > second.txt 2>&1
rc=$?
check $rc "the second run starts and trains (rc $rc): $(grep -iE 'error|short' second.txt)"
grep -q "removed $deaddir, left by run $dead .*which is gone ([0-9.]* MiB)" second.txt
check $? "it says it removed the dead run's directory: $(grep "left by run $dead" second.txt)"
grep -q "trained 3 steps" second.txt && [ ! -e "$deaddir" ] && [ -z "$(ls -A fs/swap)" ]
check $? "it trained 3 steps and left nothing ($(ls -A fs/swap))"

# 4. beside a live run the same ask is refused, naming the live run's
# folder and its size, and the checkpoint folder on that file system
mkdir fs/ck && head -c 1048576 /dev/zero > fs/ck/filler || exit 99
"$zinc" train --steps 100000 "${sw[@]}" > live.txt 2>&1 &
live=$!
wait_for live.txt '^step ' || { echo "the live run did not start"; cat live.txt; exit 1; }
livedir=$(rundir_of "$mnt/swap" $live)
"$zinc" train --steps 3 "${sw[@]}" --set "train.checkpoint.dir=\"$mnt/ck\"" \
    > refused.out 2> refused.err
rc=$?
check $(( rc != 1 )) "beside a live run: refused (rc $rc)"
asks="tiers.nvme asks $size.00 MiB on the file system of $mnt/swap, which has .* free"
grep -q "$asks (short by" refused.err
check $? "the refusal says what it asks and what is free: $(cat refused.err)"
grep -q "$livedir ([0-9.]* MiB, a live run's, run $live)" refused.err
check $? "the refusal names the live run's folder and its size"
grep -q "train.checkpoint.dir $mnt/ck is on it too and holds 1.00 MiB" refused.err
check $? "the refusal names the checkpoint folder on that file system"
[ -d "$livedir" ] && kill -0 $live
check $? "the live run and its folder are untouched"
"$zinc" plan "$tiny" "${sw[@]}" > /dev/null 2> liveplan.err
grep -q "short by .*$livedir ([0-9.]* MiB, a live run's" liveplan.err &&
    ! grep -q "dead runs left" liveplan.err
check $? "zinc plan beside the live run: short, naming it: $(cat liveplan.err)"
kill -TERM $live
wait $live
[ -z "$(ls -A fs/swap)" ]
check $? "the live run's folder goes when it ends ($(ls -A fs/swap))"

[ $fail -eq 0 ] && echo ok
exit $fail
