#!/usr/bin/env bash
# Two TCP ranks in two network namespaces joined by a veth pair, so that the
# traffic crosses a real network interface (10.231.0.1 <-> 10.231.0.2, a
# private range that exists only inside these namespaces). First every
# collective is checked across the link; then the ranks all-reduce in a
# loop and the link is cut (once by `ip link set down`, once by deleting
# the veth): both ranks must end with an error naming the operation within
# the timeout (+ grace), not hang. Last, with a job secret (ZINC_JOB_SECRET,
# as zinc launch sets it), strangers in the other namespace connect to the
# rendezvous port while rank 0 waits there: one says nothing and leaves,
# one sends garbage, one stalls mid-handshake, one is a zinc rank with
# another secret; each is refused and logged by address, and the real
# ranks' collectives pass their checks after it (about 5 s more).
# Namespaces are removed on every exit.
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
# 3. The job secret: strangers at the rendezvous port are refused and
# logged, and the run goes on. Rank 0 waits in A; the strangers come from B.
# (The link was deleted above: made again.)
if ! setup_link 2>"$tmp/err"; then
    echo "setup: cannot make the veth pair again: $(cat "$tmp/err")"
    exit 99
fi
secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
other=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
port=$((port + 1))
# rank R SECRET -> starts one check rank in its namespace, pid in pids[]
start_rank() {
    local r=$1 key=$2 ns=$nsA
    [ "$r" != 0 ] && ns=$nsB
    ip netns exec "$ns" env RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
        MASTER_ADDR=10.231.0.1 MASTER_PORT=$port ZINC_COMM_BACKEND=tcp \
        ZINC_COMM_TIMEOUT=20 ZINC_COMM_CONNECT_TIMEOUT=40 ZINC_JOB_SECRET="$key" \
        ZINC_JOB_ID=netns-test ZINC_LOG=warn OMP_NUM_THREADS=1 \
        timeout 90 "$exe" --worker check >>"$tmp/out$r" 2>&1 &
    pids+=($!)
}
# stranger MODE: one connection from B to the rendezvous port
stranger() {
    ip netns exec "$nsB" python3 - "$1" 10.231.0.1 $port <<'PY'
import socket, sys, time
mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
for _ in range(300):
    try:
        s = socket.create_connection((host, port), timeout=2)
        break
    except OSError:
        time.sleep(0.1)
else:
    sys.exit(99)
if mode == "garbage":          # a web client, say: 100 bytes of anything
    s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 4)
    time.sleep(0.5)
elif mode == "stall":          # reads the challenge, starts an answer, stops
    s.recv(40)
    s.sendall(b"\x31\x41\x4e\x5a\x01\x00\x00\x00")
    time.sleep(4.5)
s.close()
PY
}
: > "$tmp/out0"; : > "$tmp/out1"; : > "$tmp/outx"
pids=()
start_rank 0 "$secret"
t0=$(date +%s.%N)
sok=1
for m in silent garbage stall; do stranger $m || sok=0; done
# a zinc rank with another secret: refused too (it ends with an error)
ip netns exec "$nsB" env RANK=1 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
    MASTER_ADDR=10.231.0.1 MASTER_PORT=$port ZINC_COMM_BACKEND=tcp ZINC_COMM_CONNECT_TIMEOUT=10 \
    ZINC_JOB_SECRET="$other" ZINC_LOG=warn OMP_NUM_THREADS=1 \
    timeout 30 "$exe" --worker check >"$tmp/outx" 2>&1
xrc=$?
start_rank 1 "$secret"
wait_pair 90
el=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}")
refused() { grep -c "warn: comm/tcp: refused a connection from 10.231.0.2 to MASTER_PORT $port: $1" "$tmp/out0"; }
n_silent=$(refused "it closed the connection before its answer")
n_garbage=$(refused "it sent 72 bytes that are not a zinc handshake")
n_stall=$(refused "it sent no complete answer within 3.0 s (stalled mid-handshake)")
n_wrong=$(refused "its answer (as rank 1) does not prove the job's secret")
if [ "$sok" = 1 ] && [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] && [ "$xrc" -ne 0 ] &&
   [ "$n_silent" = 1 ] && [ "$n_garbage" = 1 ] && [ "$n_stall" = 1 ] && [ "$n_wrong" = 1 ] &&
   grep -q "ZINC_JOB_SECRET" "$tmp/outx" && grep -q " 0 failed" "$tmp/out0" &&
   grep -q " 0 failed" "$tmp/out1"; then
    echo "ok: with a job secret, 4 strangers at the rendezvous port were refused and logged, then every collective passed (${el}s):"
    grep -h "refused\|checks" "$tmp/out0" "$tmp/out1" | sed 's/^/    /'
    echo "    the rank with another secret: $(grep -m1 zn_comm_create "$tmp/outx")"
else
    echo "FAIL: the job secret: strangers ok $sok, exits $rc0 $rc1 (want 0 0), wrong-secret rank $xrc (want != 0), refusals silent $n_silent garbage $n_garbage stall $n_stall wrong $n_wrong (want 1 each), ${el}s:"
    cat "$tmp/out0" "$tmp/out1" "$tmp/outx"
    fail=1
fi
exit $fail
