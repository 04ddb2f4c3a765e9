#!/usr/bin/env bash
# The communicator under mpirun: every collective against a serial reference
# with 2 and 3 ranks (3 oversubscribes this 2-core machine), then a rank
# that never joins: the other two must fail with ZN_ETIMEOUT naming rank 1
# and the operation, within the timeout plus the grace period, and the job
# must end (MPI_Abort) instead of hanging.
# usage: test_comm_mpi.sh PATH/TO/test_comm HAVE_MPI(0|1)
set -u
exe=$1
have_mpi=${2:-1}
if [ "$have_mpi" != 1 ]; then
    echo "SKIP: zinc is built without MPI (-Dmpi=disabled or no MPI found)"
    exit 77
fi
if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP: mpirun is not installed"
    exit 77
fi
# As root, Open MPI refuses to start without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export ZINC_LOG=${ZINC_LOG:-warn} OMP_NUM_THREADS=1
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT ZINC_COMM_BACKEND
fail=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

for np in 2 3; do
    timeout 120 mpirun -np "$np" --oversubscribe "$exe" --worker check >"$out" 2>&1
    rc=$?
    ok=$(grep -c "(mpi, .* 0 failed$" "$out")
    if [ "$rc" -ne 0 ] || [ "$ok" -ne "$np" ]; then
        echo "FAIL: mpirun -np $np check: exit $rc, $ok of $np ranks passed"
        cat "$out"
        fail=1
    else
        echo "ok: mpirun -np $np: every collective matches the serial reference"
        grep "checks" "$out"
    fi
done

# Stall: rank 1 sleeps instead of joining an all-reduce; timeout 2 s.
start=$(date +%s.%N)
timeout 60 mpirun -np 3 --oversubscribe -x ZINC_COMM_TIMEOUT=2 -x ZT_STALL_RANK=1 \
    -x ZT_STALL_S=40 "$exe" --worker stall >"$out" 2>&1
rc=$?
end=$(date +%s.%N)
el=$(awk "BEGIN{printf \"%.1f\", $end - $start}")
pass=$(grep -c "^PASS rank [02]:.*rank 1 did not join" "$out")
if [ "$rc" -eq 124 ] || [ "$pass" -ne 2 ] || awk "BEGIN{exit !($el > 30)}"; then
    echo "FAIL: stalled rank under mpirun: exit $rc, $pass of 2 ranks named rank 1, ${el}s"
    cat "$out"
    fail=1
else
    echo "ok: stalled rank 1 -> ranks 0 and 2 failed naming it; the job ended (exit $rc) in ${el}s"
    grep "^PASS" "$out"
fi
exit $fail
