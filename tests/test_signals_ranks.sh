#!/usr/bin/env bash
# A 2-rank run stopped by its machine (issue 32), a full fine-tune
# (tests/fixtures/ft-llama) and LoRA on it (lora-llama): SIGTERM at random
# moments reaches both ranks, or only one (the other learns of it from the
# step's stop all-reduce and must not hang), or arrives while a checkpoint
# is being saved (the save test hook, ZINC_CKPT_KILL=POINT:N:TERM, raises it
# at a named point of the N-th save). Ranks torchrun-style over TCP, and
# under `mpirun -np 2` where zinc has MPI and mpirun is installed (SIGTERM
# to the rank processes, as a machine's shutdown sends it; mpirun itself
# answers SIGTERM by killing the ranks a second later: docs/checkpoints.md).
# Each time: both ranks exit 143 within 30 s of the signal (the shortest spot
# notice, issue 32; this model's last step and save take milliseconds), the
# newest checkpoint is of the last step both ranks finished and verifies, no
# swap file or run directory is left under the NVMe path, and the checkpoint
# resumed on 1 rank and on 3 ranks (the global batch kept) gives the
# uninterrupted 2-rank run's losses for the next 2 steps within the rank
# tests' relative 2e-4 (test_train_ranks.sh: fp32 sums in another order).
# The moments come from a seeded generator; the seed is printed, and
# ZINC_TEST_SEED=N repeats its choices (the delays, ranks and save points;
# where a delay lands depends on the machine's speed). 15-25 s on 2 cores.
# usage: test_signals_ranks.sh PATH/TO/zinc HAVE_MPI(0|1) SOURCE_ROOT
set -u
zinc=$(realpath "$1")
. "$(dirname "$(realpath "$0")")/ranks.sh"   # free_port, run2
have_mpi=${2:-0}
src=$(realpath "${3:-$(dirname "$0")/..}")
fx="$src/tests/fixtures"
[ -d "$fx/ft-llama" ] || { echo "no tests/fixtures/ft-llama under $src"; exit 99; }
fail=0
work=$(realpath "$(mktemp -d signals-ranks-XXXXXX)")
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cd "$work" || exit 99
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT ZINC_COMM_BACKEND
unset ZINC_CKPT_KILL ZINC_CKPT_FAULT
export OMP_NUM_THREADS=1 ZINC_LOG=${ZINC_LOG:-warn}
EXIT_S=30

seed=${ZINC_TEST_SEED:-$(( ($(date +%s) ^ $$) % 1000000 ))}
echo "seed $seed (ZINC_TEST_SEED=$seed repeats these moments)"
lcg=$seed
rnd() {  # rnd N: R = the generator's next number in [0, N)
    lcg=$(( (lcg * 1103515245 + 12345) % 2147483648 ))
    R=$(( (lcg >> 8) % $1 ))
}
fails() { echo "FAIL: $*"; fail=1; }

# ft-llama, a full fine-tune, and LoRA adapters on it (lora-llama), with
# Adam on NVMe; global batch 6 (micro-batch 1 x accumulation 3 x 2 ranks),
# which 1 rank (x 6) and 3 ranks (x 2) keep. `base` is the kind's ($kind).
common=(--data synthetic --set train.threads=1 --set train_micro_batch_size_per_gpu=1
        --set gradient_accumulation_steps=3 --set zero_optimization.stage3_param_persistence_threshold=0
        --set 'zero_optimization.offload_param.device="cpu"'
        --set 'zero_optimization.offload_optimizer.device="nvme"' --set tiers.create_nvme_path=true)
base_full=("$fx/ft-llama/train-config.json" --model "$fx/ft-llama" "${common[@]}")
base_lora=("$fx/lora-llama/train-config.json" --model "$fx/ft-llama"
           --set "lora.adapter=\"$fx/lora-llama/adapter-init\"" "${common[@]}")
use() { kind=$1; eval "base=(\"\${base_$1[@]}\")"; }
# the stopped runs' own arguments in folder $1: 3000 steps, far more than a
# run lasts here, and few enough that the synthetic set has its smallest
# size, 2^18 tokens, as the shorter uninterrupted run's (src/run/session.c
# sizes it from train.steps); the saves every 2 steps and the stop's final
# save, not every step committed in place (train.checkpoint.commit: its
# ranks are test_ckpt_commit.sh's)
run_args() {
    echo --steps 3000 --set "tiers.nvme=\"$1/swap\"" --set "train.checkpoint.dir=\"$1/ck\"" \
        --set train.checkpoint.every=2 --set train.checkpoint.commit=false
}

# start_tcp DIR HOOK0 HOOK1: 2 ranks train in DIR (rank r with
# ZINC_CKPT_KILL=HOOKr when not empty); RPID[r] their processes
start_tcp() {
    local d=$1 p r hook
    p=$(free_port)
    RPID=()
    for r in 0 1; do
        hook=$2; [ $r -eq 1 ] && hook=$3
        local log=(); [ $r -eq 0 ] && log=(--json-log "$d/run.jsonl")
        # shellcheck disable=SC2046
        env ${hook:+ZINC_CKPT_KILL=$hook} RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 \
            MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "$zinc" train "${base[@]}" $(run_args "$d") \
            "${log[@]}" > "$d/r$r.out" 2> "$d/r$r.err" &
        RPID[$r]=$!
    done
    WAITPIDS=("${RPID[@]}")
}
# start_mpi DIR HOOK: the same under mpirun -np 2 (HOOK for both ranks);
# RPID[r] the rank processes, WAITPIDS mpirun. Each rank is a shell that
# writes its PID ($$, kept by exec) to DIR/pid.RANK and execs zinc: reading
# the ranks' environments from /proc raced with processes starting and ending.
start_mpi() {
    local d=$1 mp r
    # shellcheck disable=SC2046,SC2016
    mpirun -np 2 --oversubscribe ${2:+-x ZINC_CKPT_KILL=$2} \
        sh -c 'echo $$ > "$0/pid.$OMPI_COMM_WORLD_RANK.tmp" && mv "$0/pid.$OMPI_COMM_WORLD_RANK.tmp" "$0/pid.$OMPI_COMM_WORLD_RANK" && exec "$@"' \
        "$d" "$zinc" train "${base[@]}" $(run_args "$d") --json-log "$d/run.jsonl" \
        > "$d/r0.out" 2> "$d/r0.err" &
    mp=$!
    WAITPIDS=($mp)
    RPID=()
    for _ in $(seq 300); do
        for r in 0 1; do
            [ -s "$d/pid.$r" ] && RPID[$r]=$(cat "$d/pid.$r")
        done
        [ ${#RPID[@]} -eq 2 ] && return 0
        kill -0 $mp 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}
# waits (up to 60 s) until rank 0 logged a step: training has begun
started() {
    for _ in $(seq 600); do
        [ -s "$1/run.jsonl" ] && return 0
        sleep 0.1
    done
    return 1
}
# wait_exit SECONDS: WAITPIDS end within SECONDS (else killed, and 1);
# RCS their exit codes
wait_exit() {
    local t p alive
    for ((t = 0; t < $1 * 10; t++)); do
        alive=0
        for p in "${WAITPIDS[@]}"; do kill -0 $p 2>/dev/null && alive=1; done
        [ $alive -eq 0 ] && break
        sleep 0.1
    done
    RCS=()
    for p in "${WAITPIDS[@]}"; do
        kill -0 $p 2>/dev/null && kill -9 $p ${RPID[*]} 2>/dev/null
        wait $p; RCS+=($?)
    done
    [ $alive -eq 0 ]
}

# moment LAUNCHER TARGET HOOKPOINT: one stopped run; TARGET is the ranks
# sent SIGTERM ("0 1", "0", "1"), by `kill` after a random delay, or (with
# HOOKPOINT, POINT:N) raised by those ranks at POINT of their N-th save
declare -a M_DIR M_STEP M_LABEL M_KIND
nm=0
resume3=tcp
moment() {
    local launcher=$1 target=$2 hook=${3:-} d label k t0 s r fail0=$fail
    nm=$((nm + 1))
    d="$work/m$nm"
    mkdir -p "$d"
    if [ -n "$hook" ]; then
        # ranks past 0 reach only the first four points of a save
        [[ "${hook%%:*}" =~ ^(manifest|rename|latest|prune)$ ]] && target=0
        label="$kind, $launcher #$nm: SIGTERM to rank(s) $target at '${hook%%:*}' of save ${hook#*:}"
    else
        rnd 1000
        label="$kind, $launcher #$nm: SIGTERM to rank(s) $target $R ms into training"
    fi
    local h0="" h1=""
    [ -n "$hook" ] && [[ " $target " == *" 0 "* ]] && h0=$hook:TERM
    [ -n "$hook" ] && [[ " $target " == *" 1 "* ]] && h1=$hook:TERM
    if [ "$launcher" = mpirun ]; then
        start_mpi "$d" "$h0" || { fails "$label: the ranks did not start: $(tail -n 3 "$d/r0.err")"; wait_exit 1; return; }
    else
        start_tcp "$d" "$h0" "$h1"
    fi
    started "$d" || { fails "$label: no step in 60 s: $(tail -n 3 "$d"/r*.err)"; wait_exit 1; return; }
    k=0
    if [ -z "$hook" ]; then
        # each rank's swap file is there, in its run directory
        [ "$(find "$d/swap" -mindepth 1 -maxdepth 1 -name 'zinc-run.*' | wc -l)" -eq 2 ] &&
            [ "$(find "$d/swap" -name '*.swp' | wc -l)" -ge 2 ] ||
            fails "$label: the ranks' swap files are not under $d/swap: $(find "$d/swap")"
        sleep "$(awk -v ms=$R 'BEGIN { printf "%.3f", ms / 1000 }')"
        k=$(wc -l < "$d/run.jsonl")   # steps finished before the signal
        for r in $target; do kill -TERM ${RPID[$r]} 2>/dev/null; done
    fi
    t0=$(date +%s.%N)
    # with the hook, the signal comes at save N (step 2N, well within 60 s)
    if ! wait_exit $([ -n "$hook" ] && echo $((EXIT_S + 60)) || echo $EXIT_S); then
        fails "$label: still running $EXIT_S s after the signal (killed): $(tail -qn 2 "$d"/r*.err)"
        return
    fi
    local took; took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    for rc in "${RCS[@]}"; do
        [ "$rc" -eq 143 ] || { fails "$label: exit $rc, not 143: $(tail -qn 3 "$d"/r*.err)"; return; }
    done
    # both ranks stopped after the same step S, the last one rank 0 logged
    local stops; stops=$(cat "$d"/r*.err | sed -n 's/.*stopped after step \([0-9]*\),.*/\1/p' | sort -u)
    s=$(tail -n 1 "$d/run.jsonl" | sed 's/.*"step": \([0-9]*\),.*/\1/')
    [ "$(cat "$d"/r*.err | grep -c 'stopped after step')" -eq 2 ] && [ "$stops" = "$s" ] ||
        { fails "$label: the ranks stopped after steps '$stops', rank 0 logged $s"; return; }
    [ "$s" -ge "$k" ] || fails "$label: stopped after step $s, but step $k had finished"
    if [ -n "$hook" ]; then
        # the signal came during the save of step 2N: nothing after it
        [ "$s" -eq $((2 * ${hook#*:})) ] || fails "$label: stopped after step $s, not the saved one"
    fi
    # who was told: a rank without the signal says so
    if [ "$launcher" = tcp ]; then
        for r in 0 1; do
            if [[ " $target " == *" $r "* ]]; then
                grep -q "s after the signal" "$d/r$r.err" || fails "$label: rank $r: $(tail -n 1 "$d/r$r.err")"
            else
                grep -q "Terminated on another rank: .* after this rank learned of it" "$d/r$r.err" ||
                    fails "$label: rank $r does not say another rank's signal stopped it: $(tail -n 1 "$d/r$r.err")"
            fi
        done
    fi
    local secs; secs=$(cat "$d"/r*.err | sed -n 's/.*removed, \([0-9.]*\) s after.*/\1/p' | sort -n | tail -n 1)
    awk -v s="${secs:-99}" -v b=$EXIT_S 'BEGIN { exit !(s <= b) }' ||
        fails "$label: zinc says it took ${secs:-?} s after the signal"
    # the checkpoint of step S is latest, complete and verified
    [ "$(cat "$d/ck/latest" 2>/dev/null)" = "$(printf 'step-%08d' "$s")" ] ||
        fails "$label: latest is '$(cat "$d/ck/latest" 2>/dev/null)', not step $s"
    "$zinc" export "$d/ck" --verify > "$d/verify.out" 2>&1 ||
        fails "$label: the checkpoint does not verify: $(tail -n 2 "$d/verify.out")"
    [ -z "$(find "$d/ck" -maxdepth 1 -name '.step-*')" ] ||
        fails "$label: a temporary folder is left: $(ls -a "$d/ck")"
    # nothing under the NVMe path: no swap file, no run directory
    local left; left=$(find "$d/swap" -mindepth 1 2>/dev/null | head -n 3)
    [ -z "$left" ] || fails "$label: left under the NVMe path: $left"
    # resumed on 1 rank and on 3 ranks for 2 more steps (compared below)
    local ck; ck="$d/ck/$(printf 'step-%08d' "$s")" more=(--steps $((s + 2)) --set "tiers.nvme=\"$d/swap\"")
    timeout 120 "$zinc" train "${base[@]}" "${more[@]}" --resume "$ck" --json-log "$d/one.jsonl" \
        > "$d/one.out" 2>&1 || fails "$label: resume on 1 rank: $(grep -m 2 error "$d/one.out")"
    if [ "$launcher" = mpirun ] && [ "$resume3" = mpirun ]; then
        timeout 120 mpirun -np 3 --oversubscribe "$zinc" train "${base[@]}" "${more[@]}" \
            --resume "$ck" --json-log "$d/three.jsonl" > "$d/three.r0.out" 2>&1
    else
        local p pids=() log; p=$(free_port)
        for r in 0 1 2; do
            log=(); [ $r -eq 0 ] && log=(--json-log "$d/three.jsonl")
            RANK=$r WORLD_SIZE=3 LOCAL_RANK=$r LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 \
                MASTER_PORT=$p timeout 120 "$zinc" train "${base[@]}" "${more[@]}" --resume "$ck" \
                "${log[@]}" > "$d/three.r$r.out" 2>&1 &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait $p || true; done
    fi
    grep -q "saved by 2 rank(s), resumed on 3: global batch 6 kept" "$d/three.r0.out" ||
        fails "$label: resume on 3 ranks: $(grep -h -m 2 error "$d"/three.r*.out)"
    local when="step $k had finished at the signal"
    [ -n "$hook" ] && when="the signal came during its save"
    [ $fail -eq $fail0 ] && echo "ok: $label: exit 143 ($launcher: ${RCS[*]}) in $took s;" \
        "stopped after step $s ($when), its checkpoint is latest and verifies, nothing" \
        "under the NVMe path"
    M_DIR[$nm]=$d M_STEP[$nm]=$s M_LABEL[$nm]=$label M_KIND[$nm]=$kind
}

# the moments: both ranks, one, the other, and during a save (the hook's
# ranks, point and save drawn too)
hook_draw() {  # sets HT (target ranks) and HP (POINT:N)
    local all=(begin tmpdir data rank manifest rename latest prune) targets=("0 1" "0" "1")
    rnd 3; HT=${targets[$R]}
    if [ "$HT" = 1 ]; then rnd 4; else rnd 8; fi   # rank 1 passes the first 4 only
    HP=${all[$R]}
    rnd 3; HP=$HP:$((R + 1))
}
use full
moment tcp "0 1"
moment tcp "1"
moment tcp "0"
hook_draw; moment tcp "$HT" "$HP"
# a stop during a periodic save (which copies the NVMe state) on rank 1
# alone: the save is cancelled on both ranks, rank 1 for its signal, rank 0
# (which finishes its part first) for rank 1's stop, saying so (a rank past
# 0 prints nothing on stdout); the stop's own save of the same step keeps
# each rank's state in place
nb=$nm
moment tcp "1" "tmpdir:1"
if [ $nm -gt $nb ] && [ -n "${M_DIR[$nm]:-}" ]; then
    d=${M_DIR[$nm]}
    if grep -q "checkpoint of step 2 cancelled by a stop on another rank after" "$d/r0.out" &&
       [ -f "$d/ck/step-00000002/rank-0/state.swp" ] && [ -f "$d/ck/step-00000002/rank-1/state.swp" ]; then
        echo "ok: a periodic save cancelled on both ranks by rank 1's stop, the stop's save in place"
    else
        fails "a periodic save during rank 1's stop: $(grep -h '^checkpoint' "$d"/r0.out | head -3); $(ls "$d/ck/step-00000002"/rank-* 2>&1 | tr '\n' ' ')"
    fi
fi
use lora
rnd 3; moment tcp "$( [ $R -eq 2 ] && echo "0 1" || echo $R)"
hook_draw; moment tcp "$HT" "$HP"
# The mpirun moments (seen flaky in session 17's fresh-clone CI: mpirun
# ended the job at the first rank's exit 143 and killed the other before it
# removed its files and said so; the ranks now meet after cleaning up, and
# their PIDs come from files they write). ZINC_TEST_MPI_SIGNALS=0 leaves
# them out.
if [ "${ZINC_TEST_MPI_SIGNALS:-1}" = 0 ]; then
    echo "skip: the mpirun moments (ZINC_TEST_MPI_SIGNALS=0)"
elif [ "$have_mpi" = 1 ] && command -v mpirun > /dev/null 2>&1; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    use full
    resume3=mpirun   # once: mpirun -np 3 (else torchrun-style, a second less)
    moment mpirun "0 1"
    resume3=tcp
    hook_draw; moment mpirun "0 1" "$HP"
    use lora
    rnd 2; moment mpirun "$R"
else
    echo "skip: mpirun (zinc built without MPI, or mpirun missing)"
fi

# same REF LABEL GOT: GOT's 2 steps have REF's losses within 2e-4
same() {
    local w
    w=$(awk -v want=2 -f "$src/tests/loss_diff.awk" "$1" "$3" 2>/dev/null)
    if [ -n "$w" ] && [ "$w" != none ] && awk -v w="$w" 'BEGIN { exit !(w <= 2e-4) }'; then
        echo "ok: $2 (worst relative difference $w)"
    else
        local why="by ${w:-?} (> 2e-4)"
        [ "$w" = none ] && why="(a step is missing, or its loss is not a number)"
        fails "$2: losses differ from the uninterrupted 2-rank run's $why: $(cut -c 1-40 "$3" 2>/dev/null)"
    fi
}
# each kind's uninterrupted 2-rank run, as far as its last resume goes
for k in full lora; do
    use $k
    last=0
    for i in "${!M_STEP[@]}"; do
        [ "${M_KIND[$i]}" = $k ] && [ "${M_STEP[$i]}" -gt $last ] && last=${M_STEP[$i]}
    done
    [ $last -gt 0 ] || continue
    p=$(free_port)
    for r in 0 1; do
        log=(); [ $r -eq 0 ] && log=(--json-log ref-$k.jsonl)
        RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
            timeout 120 "$zinc" train "${base[@]}" --steps $((last + 2)) \
            --set "tiers.nvme=\"$work/refswap\"" "${log[@]}" > ref-$k.r$r.out 2>&1 &
    done
    wait
    [ "$(wc -l < ref-$k.jsonl)" -eq $((last + 2)) ] ||
        fails "$k: the uninterrupted run: $(grep -h error ref-$k.r*.out)"
    for i in "${!M_DIR[@]}"; do
        [ "${M_KIND[$i]}" = $k ] || continue
        s=${M_STEP[$i]}
        same ref-$k.jsonl "${M_LABEL[$i]}: stopped after step $s, resumed on 1 rank" "${M_DIR[$i]}/one.jsonl"
        same ref-$k.jsonl "${M_LABEL[$i]}: stopped after step $s, resumed on 3 ranks" "${M_DIR[$i]}/three.jsonl"
    done
done

[ $fail -eq 0 ] && echo "signals_ranks: all passed (seed $seed)" || echo "signals_ranks: FAILED (seed $seed)"
exit $fail
