# Shared by the shell tests that start torchrun-style ranks of `zinc train`
# (sourced; $zinc is the binary under test).

# A free TCP port on the loopback for MASTER_PORT (a random one if python3
# is missing).
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
        echo $((20000 + RANDOM % 20000))
}

# run2 TAG ARGS...: `zinc train ARGS` on two ranks of this host (RANK,
# WORLD_SIZE, LOCAL_RANK, ... as torchrun sets them), each bounded at 120 s;
# rank 0 logs TAG.jsonl, rank r's output goes to TAG.rR.out. Fails when
# either rank fails.
run2() {
    local tag=$1 p r bad=0 pids=()
    shift
    p=$(free_port)
    for r in 0 1; do
        local log=()
        [ $r -eq 0 ] && log=(--json-log "$tag.jsonl")
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$p timeout 120 "$zinc" train "$@" "${log[@]}" > "$tag.r$r.out" 2>&1 &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || bad=1; done
    return $bad
}
