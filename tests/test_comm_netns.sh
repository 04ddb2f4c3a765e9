#!/usr/bin/env bash
# Two TCP ranks in two network namespaces joined by a veth pair, so that the
# traffic crosses a real network interface (10.231.0.1 <-> 10.231.0.2, a
# private range that exists only inside these namespaces). First every
# collective is checked across the link; then the ranks all-reduce in a
# loop and the link is cut (once by `ip link set down`, once by deleting
# the veth): both ranks must end with an error naming the operation within
# the timeout (+ grace), not hang. Namespaces are removed on every exit.
# usage: test_comm_netns.sh PATH/TO/test_comm
set -u
exe=$1
if [ "$(id -u)" != 0 ]; then
    echo "SKIP: network namespaces need root"
    exit 77
fi
if ! command -v ip >/dev/null 2>&1; then
    echo "SKIP: iproute2 (ip) is not installed"
    exit 77
fi
tag=$$
nsA=zncA$tag nsB=zncB$tag vA=zvA$tag vB=zvB$tag
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait 2>/dev/null
    ip netns del "$nsA" 2>/dev/null
    ip netns del "$nsB" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
if ! ip netns add "$nsA" 2>"$tmp/err"; then
    echo "SKIP: ip netns add failed: $(cat "$tmp/err")"
    exit 77
fi
ip netns add "$nsB" || { echo "setup: ip netns add $nsB failed"; exit 99; }

setup_link() {
    ip link add "$vA" type veth peer name "$vB" &&
    ip link set "$vA" netns "$nsA" && ip link set "$vB" netns "$nsB" &&
    ip -n "$nsA" addr add 10.231.0.1/24 dev "$vA" &&
    ip -n "$nsB" addr add 10.231.0.2/24 dev "$vB" &&
    ip -n "$nsA" link set lo up && ip -n "$nsB" link set lo up &&
    ip -n "$nsA" link set "$vA" up && ip -n "$nsB" link set "$vB" up
}
if ! setup_link 2>"$tmp/err"; then
    echo "SKIP: cannot create the veth pair: $(cat "$tmp/err")"
    exit 77
fi

port=29531
# start_pair MODE TIMEOUT -> pids of rank 0 (in A) and rank 1 (in B)
start_pair() {
    local mode=$1 to=$2
    port=$((port + 1))
    pids=()
    for r in 0 1; do
        local ns=$nsA
        [ "$r" = 1 ] && ns=$nsB
        ip netns exec "$ns" env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
            MASTER_ADDR=10.231.0.1 MASTER_PORT=$port ZINC_COMM_BACKEND=tcp \
            ZINC_COMM_TIMEOUT="$to" ZINC_COMM_CONNECT_TIMEOUT=30 ZT_LOOP_S=60 \
            ZINC_LOG=warn OMP_NUM_THREADS=1 \
            timeout 90 "$exe" --worker "$mode" >"$tmp/out$r" 2>&1 &
        pids+=($!)
    done
}
# wait_pair SECONDS -> sets rc0 rc1; kills what is left at the deadline
wait_pair() {
    local limit=$1 t=0
    rc0=-1 rc1=-1
    while [ "$t" -lt $((limit * 10)) ]; do
        local alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
        t=$((t + 1))
    done
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    wait "${pids[0]}"; rc0=$?
    wait "${pids[1]}"; rc1=$?
    pids=()
}

fail=0
# 1. Every collective across the link.
start_pair check 20
wait_pair 90
if [ "$rc0" -ne 0 ] || [ "$rc1" -ne 0 ]; then
    echo "FAIL: check across the veth pair: exits $rc0 $rc1"
    cat "$tmp/out0" "$tmp/out1"
    fail=1
else
    echo "ok: every collective across the veth pair"
    grep -h "checks" "$tmp/out0" "$tmp/out1"
fi

# 2. Cut the link mid-run, two ways. Timeout 3 s -> grace 0.75 s; the
# ranks must end within timeout + 2*grace + 0.5 s of the cut (+ slack for
# this loaded 2-core machine).
for how in down delete; do
    start_pair loop 3
    ready=0
    for _ in $(seq 1 300); do
        if grep -q READY "$tmp/out0" 2>/dev/null && grep -q READY "$tmp/out1" 2>/dev/null; then
            ready=1
            break
        fi
        sleep 0.1
    done
    if [ "$ready" != 1 ]; then
        echo "FAIL: ranks did not start ($how)"
        cat "$tmp/out0" "$tmp/out1"
        fail=1
        wait_pair 1
        continue
    fi
    sleep 0.5
    t0=$(date +%s.%N)
    if [ "$how" = down ]; then
        ip -n "$nsA" link set "$vA" down
    else
        ip -n "$nsA" link del "$vA"
    fi
    wait_pair 20
    el=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}")
    e0=$(grep -c "^ERROR rank 0 .*allreduce #" "$tmp/out0")
    e1=$(grep -c "^ERROR rank 1 .*allreduce #" "$tmp/out1")
    if [ "$rc0" -ne 3 ] || [ "$rc1" -ne 3 ] || [ "$e0" -ne 1 ] || [ "$e1" -ne 1 ] ||
        awk "BEGIN{exit !($el > 9)}"; then
        echo "FAIL: link $how: exits $rc0 $rc1 (want 3 3), errors $e0 $e1, ${el}s after the cut"
        cat "$tmp/out0" "$tmp/out1"
        fail=1
    else
        echo "ok: link $how -> both ranks ended with an error ${el}s after the cut:"
        cat "$tmp/out0" "$tmp/out1" | grep "^ERROR"
    fi
    if [ "$how" = down ]; then
        ip -n "$nsA" link set "$vA" up
    fi
done
exit $fail
