#!/usr/bin/env bash
# Elastic resume (issue 32): a checkpoint saved by 2 ranks (torchrun-style,
# the TCP communicator) resumes on 1 and on 3 ranks, at another ZeRO stage
# and at another placement, and continues as the uninterrupted 2-rank run,
# for a full fine-tune (tests/fixtures/ft-llama) and for LoRA on it
# (tests/fixtures/lora-llama): the saved state is each block's elements in
# order whatever held them, resharded at load, the working parameters made
# again at their new homes (a replicated block, stage 2 on several ranks,
# gathered from every rank's shard).
# The placements: stage 3 with parameters and Adam state on NVMe, stage 2
# with the parameters on the device and Adam state in pinned RAM, and
# (resumed into only) stage 2 with everything on the device.
# The global batch (6: micro-batch 1 x accumulation 3 x 2 ranks) is kept
# on 1 and 3 ranks by recomputing the accumulation (6 and 2).
# Losses of steps 4-6 must equal the uninterrupted 2-rank run's within the
# rank tests' relative 2e-4 (test_train_ranks.sh: another number of ranks
# sums the same fp32 gradients in another order; a resume at the same
# world size is bit-exact in fact).
# Then Adam's moments kept as bf16 or 8-bit across ranks and tiers, the
# bf16 master (bf16_sr) saved by 2 ranks and resumed on 1, 2 and 3, and a
# model with tied embeddings (a block smaller than a rank's share; stage 3
# on 2 ranks refused by name). 15-35 s on 2 cores.
# usage: test_train_elastic.sh PATH/TO/zinc SOURCE_ROOT
set -u
zinc=$(realpath "$1")
. "$(dirname "$(realpath "$0")")/ranks.sh"   # free_port, run2
src=$(realpath "${2:-$(dirname "$0")/..}")
fx="$src/tests/fixtures"
fail=0
work=$(realpath "$(mktemp -d train-elastic-XXXXXX)")
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cd "$work" || exit 99
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT ZINC_COMM_BACKEND
export OMP_NUM_THREADS=1 ZINC_LOG=${ZINC_LOG:-warn}
[ -d "$fx/ft-llama" ] && [ -d "$fx/lora-llama" ] || { echo "no fixtures under $fx"; exit 99; }

# ranks N TAG ARGS...: `zinc train ARGS` on N ranks (N > 1: torchrun-style
# over TCP), rank 0 logging TAG.jsonl; output in TAG.rK.out
ranks() {
    local n=$1 tag=$2; shift 2
    if [ "$n" -eq 1 ]; then
        timeout 120 "$zinc" train "$@" --json-log "$tag.jsonl" > "$tag.r0.out" 2>&1
        return
    fi
    local p r bad=0 pids=()
    p=$(free_port)
    for ((r = 0; r < n; r++)); do
        local log=()
        [ $r -eq 0 ] && log=(--json-log "$tag.jsonl")
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$p timeout 120 "$zinc" train "$@" "${log[@]}" > "$tag.r$r.out" 2>&1 &
        pids+=($!)
    done
    for r in "${pids[@]}"; do wait "$r" || bad=1; done
    return $bad
}
# same LABEL REF GOT [TOL]: GOT's steps (each of them) have REF's losses
# within TOL (2e-4)
same() {
    local w tol=${4:-2e-4}
    w=$(awk -v want=3 -f "$src/tests/loss_diff.awk" "$2" "$3" 2>/dev/null)
    if [ -n "$w" ] && [ "$w" != none ] && awk -v w="$w" -v t="$tol" 'BEGIN { exit !(w <= t) }'; then
        echo "ok: $1 (worst relative difference $w)"
    else
        local why="by ${w:-?} (> $tol)"
        [ "$w" = none ] && why="(a step is missing, or its loss is not a number)"
        echo "FAIL: $1: losses of steps 4-6 differ from the uninterrupted run $why"
        paste <(tail -n 3 "$2") "$3" 2>/dev/null | sed 's/, "loss_hex[^}]*//g'
        fail=1
    fi
}
errors() { grep -h "error" "$@" 2>/dev/null | sort -u | head -3; }
declare -A place=(
    [s3nvme]="--set zero_optimization.stage=3 --set zero_optimization.offload_param.device=\"nvme\" --set zero_optimization.offload_param.max_in_cpu=0 --set zero_optimization.offload_optimizer.device=\"nvme\" --set zero_optimization.stage3_param_persistence_threshold=0"
    [s2cpu]="--set zero_optimization.stage=2 --set zero_optimization.offload_param.device=\"none\" --set zero_optimization.offload_optimizer.device=\"cpu\""
    [s2dev]="--set zero_optimization.stage=2 --set zero_optimization.offload_param.device=\"none\" --set zero_optimization.offload_optimizer.device=\"none\"")
desc() {
    case $1 in
    s3nvme) echo "stage 3, params + Adam on nvme" ;;
    s2cpu) echo "stage 2, Adam in cpu" ;;
    s2dev) echo "stage 2, all on the device" ;;
    esac
}

# base_for KIND SWAP: the runs' common arguments into base[], for the full
# fine-tune or LoRA on it, swapping under SWAP
base_for() {
    if [ "$1" = full ]; then
        base=("$fx/ft-llama/train-config.json" --model "$fx/ft-llama")
    else
        base=("$fx/lora-llama/train-config.json" --model "$fx/ft-llama"
              --set "lora.adapter=\"$fx/lora-llama/adapter-init\"")
    fi
    base+=(--data synthetic --set train.threads=1 --set train_micro_batch_size_per_gpu=1
           --set gradient_accumulation_steps=3 --set tiers.create_nvme_path=true
           --set tiers.nvme=\"$2\")
}

for kind in full lora; do
    base_for $kind "$work/swap-$kind"
    # the uninterrupted runs, saving at steps 3 and 6, one per placement
    for p in s3nvme s2cpu; do
        eval "pl=(${place[$p]})"
        if ! ranks 2 $kind-$p "${base[@]}" "${pl[@]}" --steps 6 \
            --set train.checkpoint.dir=\"$work/ck-$kind-$p\" --set train.checkpoint.every=3; then
            echo "FAIL: $kind, 2 ranks, $(desc $p): $(errors $kind-$p.r*.out)"; fail=1; continue
        fi
        grep -q "ZeRO       stage ${p:1:1}.*$( [ $p = s2cpu ] && echo 'optimizer -> cpu' || echo 'params -> nvme.*optimizer -> nvme')" \
            $kind-$p.r0.out || { echo "FAIL: $kind: the run is not at $(desc $p): $(grep ZeRO $kind-$p.r0.out)"; fail=1; }
    done
    # both placements train alike (placement never changes numerics)
    same "$kind: 2 ranks at $(desc s2cpu) train as at $(desc s3nvme)" $kind-s3nvme.jsonl \
        <(tail -n 3 $kind-s2cpu.jsonl)
    # resume at step 3: FROM (the saving run's placement), ranks, placement
    while read -r from n to; do
        ck="$work/ck-$kind-$from/step-00000003"
        [ -d "$ck" ] || { echo "FAIL: $kind: no $ck"; fail=1; continue; }
        eval "pl=(${place[$to]})"
        tag=$kind-$from-$n-$to
        label="$kind: saved by 2 ranks at $(desc $from), resumed on $n at $(desc $to)"
        if ranks $n $tag "${base[@]}" "${pl[@]}" --steps 6 --resume "$ck"; then
            same "$label" $kind-s3nvme.jsonl $tag.jsonl
            [ "$n" -eq 2 ] || grep -q "saved by 2 rank(s), resumed on $n: global batch 6 kept" \
                $tag.r0.out || { echo "FAIL: $label: the global batch kept is not said"; fail=1; }
        else
            echo "FAIL: $label: $(errors $tag.r*.out)"; fail=1
        fi
    done <<'EOF'
s3nvme 1 s3nvme
s3nvme 3 s3nvme
s3nvme 2 s2cpu
s3nvme 3 s2cpu
s3nvme 3 s2dev
s2cpu 2 s3nvme
s2cpu 1 s3nvme
s2cpu 3 s3nvme
EOF
    # one door: the resumed run resolves its config once, and the spec the
    # trainer takes holds the accumulation the resume kept (global batch 6 of
    # 2 ranks x 3 micro-batches: 6 micro-batches on one rank)
    if [ $kind = full ]; then
        eval "pl=(${place[s3nvme]})"
        if ZINC_LOG=debug ranks 1 once "${base[@]}" "${pl[@]}" --steps 4 \
            --resume "$work/ck-full-s3nvme/step-00000003"; then
            nres=$(grep -c 'train-config.json resolved for 1 rank(s): micro-batch 1 x accumulation 6$' once.r0.out)
            nall=$(grep -c 'train-config.json resolved for ' once.r0.out)
            nspec=$(grep -c 'run spec: micro-batch 1 x accumulation 6, .*train-config.json$' once.r0.out)
            if [ "$nres" = 1 ] && [ "$nall" = 1 ] && [ "$nspec" = 1 ]; then
                echo "ok: a 2-rank checkpoint resumed on 1: resolved once, spec accumulation 6"
            else
                echo "FAIL: resolved $nall time(s) ($nres with accumulation 6), spec with 6: $nspec"
                grep -E 'resolved for|run spec:' once.r0.out | head -5
                fail=1
            fi
        else
            echo "FAIL: the debug resume: $(errors once.r*.out)"; fail=1
        fi
    fi
    # nothing left behind on the NVMe path
    left=$(find "$work/swap-$kind" -mindepth 1 2>/dev/null | head -3)
    [ -z "$left" ] || { echo "FAIL: $kind: left under the NVMe path: $left"; fail=1; }
done

# Adam's moments kept compressed (train.optim, in the cpu tier or swapped
# through NVMe): an 8-bit or bf16 checkpoint of 2 ranks resumes on other
# numbers of ranks and in other tiers, each old rank's moments read as fp32
# from its own layout (and quantized again per unit on NVMe), an fp32 one
# resumes into 8-bit moments on another number of ranks and on NVMe, and
# one saved from NVMe resumes in the cpu tier as it is.
# Within 2e-4 where the moments arrive exactly (bf16 widened, and rounded
# again to bf16; 8-bit dequantized into fp32 moments) or are quantized once
# from exact values as a step would (fp32 into 8-bit): what 8-bit runs on
# 1, 2 and 3 ranks differ by, each quantizing in its own shares' blocks
# (6e-6 here). 8-bit moments quantized again in the blocks of 3 ranks'
# shares carry a second rounding of up to a map step (about 1% of a
# block's absmax, test_optim8_cli.sh) into steps 5 and 6: within 1e-3
# (measured 6e-5 on this model).
mom=("$fx/ft-llama/train-config.json" --model "$fx/ft-llama" --data synthetic
     --set train.threads=1 --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=3
     --set tiers.create_nvme_path=true --set tiers.nvme=\"$work/swap-mom\")
eval "cpu=(${place[s2cpu]})"
for optim in adamw_bnb_8bit adamw_bf16; do
    ranks 2 mom-$optim "${mom[@]}" "${cpu[@]}" --set train.optim=$optim --steps 6 \
        --set train.checkpoint.dir=\"$work/ck-$optim\" --set train.checkpoint.every=3 ||
        { echo "FAIL: 2 ranks with train.optim $optim: $(errors mom-$optim.r*.out)"; fail=1; }
done
# the same 8-bit run with params and Adam on NVMe (the moments swapped per
# unit at their size): as in the cpu tier
eval "nvme=(${place[s3nvme]})"
ranks 2 mom-nvme8 "${mom[@]}" "${nvme[@]}" --set train.optim=adamw_bnb_8bit --steps 6 \
    --set train.checkpoint.dir=\"$work/ck-nvme8\" --set train.checkpoint.every=3 &&
    same "8-bit moments, 2 ranks at $(desc s3nvme) train as at $(desc s2cpu)" \
        mom-adamw_bnb_8bit.jsonl <(tail -n 3 mom-nvme8.jsonl) ||
    { echo "FAIL: 2 ranks with 8-bit moments on NVMe: $(errors mom-nvme8.r*.out)"; fail=1; }
# SAVED (the saving run's train.optim; adamw_torch: the full run's stage 2
# checkpoint above; nvme8: the 8-bit run on NVMe), ranks, placement,
# train.optim, tolerance, what is said
while read -r saved n to optim tol said; do
    if [ $saved = adamw_torch ]; then
        ck=$work/ck-full-s2cpu/step-00000003 ref=full-s3nvme.jsonl
    elif [ $saved = nvme8 ]; then
        ck=$work/ck-nvme8/step-00000003 ref=mom-adamw_bnb_8bit.jsonl
    else
        ck=$work/ck-$saved/step-00000003 ref=mom-$saved.jsonl
    fi
    eval "pl=(${place[$to]})"
    tag=mom-$saved-$n-$optim
    label="a $saved checkpoint of 2 ranks resumed on $n at $(desc $to) with $optim"
    if ranks $n $tag "${mom[@]}" "${pl[@]}" --set train.optim=$optim --steps 6 --resume "$ck"; then
        same "$label" $ref $tag.jsonl $tol
        [ "$said" = - ] || grep -q "$said" $tag.r0.out ||
            { echo "FAIL: $label: it does not say '$said'"; fail=1; }
    else
        echo "FAIL: $label: $(errors $tag.r*.out)"; fail=1
    fi
done <<'EOF'
adamw_bnb_8bit 1 s3nvme adamw_torch 2e-4 converted.at.load
adamw_bnb_8bit 3 s2cpu adamw_bnb_8bit 1e-3 quantized.again
adamw_bnb_8bit 1 s3nvme adamw_bnb_8bit 1e-3 quantized.again
adamw_bf16 3 s2cpu adamw_bf16 2e-4 -
adamw_bf16 3 s3nvme adamw_bf16 2e-4 -
adamw_bf16 1 s3nvme adamw_torch 2e-4 converted.at.load
adamw_torch 3 s2cpu adamw_bnb_8bit 2e-4 converted.at.load
adamw_torch 1 s3nvme adamw_bnb_8bit 2e-4 converted.at.load
nvme8 2 s2cpu adamw_bnb_8bit 2e-4 -
nvme8 3 s3nvme adamw_bnb_8bit 1e-3 quantized.again
EOF
left=$(find "$work/swap-mom" -mindepth 1 2>/dev/null | head -3)
[ -z "$left" ] || { echo "FAIL: left under the NVMe path: $left"; fail=1; }

# The bf16 master with stochastic rounding (train.master_weights bf16_sr,
# full and LoRA) saved by 2 ranks at both placements: resumed on 2 ranks,
# the uninterrupted run bit for bit; on 1 and 3 ranks and at the other
# placement, its bf16 values land exactly in the new shares (no rounding:
# bf16 either way), so the first resumed step sees the saved weights, and
# its loss differs from the uninterrupted run's only by the order in which
# the 6 micro-batches' losses are summed in double: within the 2e-4 above
# by far. Steps 5 and 6 are not compared: the 6-term gradient sums differ
# by one fp32 rounding, which the stochastic rounding turns into whole-ulp
# flips of a few weights that then multiply (test_train_ranks.sh derives
# it): nothing below unrelated draws is derivable for them; they must be
# there and finite. A bf16 checkpoint of 2 ranks also resumes into an fp32
# master on 3 (widened: the same first loss) and an fp32 one of 2 ranks
# into bf16_sr on 1 (rounded to nearest, said).
hexes() { sed 's/.*"step": \([0-9]*\),.*"loss_hex": "\([^"]*\)".*/\1 \2/' "$1"; }
# first LABEL REF GOT: GOT has 3 finite losses, the first REF's within 2e-4
first() {
    local w1 w3
    w1=$(awk -v want=1 -f "$src/tests/loss_diff.awk" "$2" <(head -n 1 "$3") 2>/dev/null)
    w3=$(awk -v want=3 -f "$src/tests/loss_diff.awk" "$2" "$3" 2>/dev/null)
    if [ -n "$w3" ] && [ "$w3" != none ] && [ -n "$w1" ] && [ "$w1" != none ] &&
        awk -v w="$w1" 'BEGIN { exit !(w <= 2e-4) }'; then
        echo "ok: $1 (first loss within $w1, steps 5-6 within $w3)"
    else
        echo "FAIL: $1: first loss off by ${w1:-?} (> 2e-4), or a step missing or not a number"
        paste <(tail -n 3 "$2") "$3" 2>/dev/null | sed 's/, "loss_hex[^}]*//g'
        fail=1
    fi
}
sr=(--set train.master_weights=bf16_sr)
for kind in full lora; do
    base_for $kind "$work/swap-sr"
    for p in s3nvme s2cpu; do
        eval "pl=(${place[$p]})"
        ranks 2 sr-$kind-$p "${base[@]}" "${pl[@]}" "${sr[@]}" --steps 6 \
            --set train.checkpoint.dir=\"$work/ck-sr-$kind-$p\" --set train.checkpoint.every=3 ||
            { echo "FAIL: bf16_sr, $kind, 2 ranks, $(desc $p): $(errors sr-$kind-$p.r*.out)"; fail=1; }
    done
    while read -r from n to; do
        ck="$work/ck-sr-$kind-$from/step-00000003"
        [ -d "$ck" ] || { echo "FAIL: bf16_sr, $kind: no $ck"; fail=1; continue; }
        eval "pl=(${place[$to]})"
        tag=sr-$kind-$from-$n-$to
        label="bf16_sr, $kind: saved by 2 ranks at $(desc $from), resumed on $n at $(desc $to)"
        if ! ranks $n $tag "${base[@]}" "${pl[@]}" "${sr[@]}" --steps 6 --resume "$ck"; then
            echo "FAIL: $label: $(errors $tag.r*.out)"; fail=1
        elif [ "$n" -eq 2 ] && [ $from = $to ]; then
            if diff <(hexes sr-$kind-$from.jsonl | tail -n 3) <(hexes $tag.jsonl) > /dev/null; then
                echo "ok: $label: bit for bit"
            else
                echo "FAIL: $label: not the uninterrupted run bit for bit"; fail=1
            fi
        else
            first "$label" sr-$kind-$from.jsonl $tag.jsonl
        fi
    done <<'EOF'
s3nvme 2 s3nvme
s3nvme 1 s3nvme
s3nvme 3 s2cpu
s2cpu 2 s2cpu
s2cpu 1 s3nvme
s2cpu 3 s3nvme
EOF
    left=$(find "$work/swap-sr" -mindepth 1 2>/dev/null | head -3)
    [ -z "$left" ] || { echo "FAIL: bf16_sr, $kind: left under the NVMe path: $left"; fail=1; }
done
# the master's format converted across world sizes
eval "pl=(${place[s2cpu]})"
if ranks 3 sr-widen "${mom[@]}" "${pl[@]}" --set train.master_weights=fp32 --steps 6 \
        --resume "$work/ck-sr-full-s3nvme/step-00000003" &&
    grep -q "widened (exact) at load" sr-widen.r0.out; then
    first "a bf16_sr checkpoint of 2 ranks resumed into an fp32 master on 3 (widened)" \
        sr-full-s3nvme.jsonl sr-widen.jsonl
else
    echo "FAIL: a bf16_sr checkpoint of 2 ranks into an fp32 master on 3: $(errors sr-widen.r*.out)"; fail=1
fi
eval "pl=(${place[s3nvme]})"
if ranks 1 sr-round "${mom[@]}" "${pl[@]}" "${sr[@]}" --steps 6 \
        --resume "$work/ck-full-s3nvme/step-00000003" &&
    grep -q "rounded to nearest even at load" sr-round.r0.out &&
    [ "$(awk -v want=3 -f "$src/tests/loss_diff.awk" full-s3nvme.jsonl sr-round.jsonl)" != none ]; then
    echo "ok: an fp32 checkpoint of 2 ranks resumed into bf16_sr on 1 (rounded at load)"
else
    echo "FAIL: an fp32 checkpoint of 2 ranks into bf16_sr on 1: $(errors sr-round.r*.out)"; fail=1
fi

# A model with tied embeddings (tests/fixtures/ft-tied: its final norm, 32
# elements, is a block of its own, which leaves rank 1 an empty share past
# the block's end): its 2-rank stage 2 checkpoint resumes on 3 ranks and on
# 1 rank at stage 3; at stage 3 on 2 ranks it is refused, naming the
# setting (the embedding must stay whole on every device so far).
tied=("$fx/ft-tied/train-config.json" --model "$fx/ft-tied" --data synthetic
      --set train.threads=1 --set train_micro_batch_size_per_gpu=1 --set gradient_accumulation_steps=3)
if ranks 2 tied "${tied[@]}" "${cpu[@]}" --steps 6 --set train.checkpoint.dir=\"$work/ck-tied\" \
    --set train.checkpoint.every=3; then
    ck=$work/ck-tied/step-00000003
    ranks 3 tied-3 "${tied[@]}" "${cpu[@]}" --steps 6 --resume "$ck" &&
        same "tied embeddings: saved by 2 ranks at stage 2, resumed on 3" tied.jsonl tied-3.jsonl ||
        { echo "FAIL: tied embeddings, 2 -> 3 ranks: $(errors tied-3.r*.out)"; fail=1; }
    ranks 1 tied-1 "${tied[@]}" --set zero_optimization.stage=3 --steps 6 --resume "$ck" &&
        same "tied embeddings: saved by 2 ranks at stage 2, resumed on 1 at stage 3" tied.jsonl \
            tied-1.jsonl || { echo "FAIL: tied embeddings, 2 -> 1 rank: $(errors tied-1.r*.out)"; fail=1; }
    if ranks 2 tied-s3 "${tied[@]}" --set zero_optimization.stage=3 --steps 6 --resume "$ck"; then
        echo "FAIL: tied embeddings at stage 3 on 2 ranks: not refused"; fail=1
    elif grep -q "tie_word_embeddings.*ZeRO stage 3 across 2 ranks.*zero_optimization.stage 2" \
            tied-s3.r0.out; then
        echo "ok: tied embeddings at stage 3 on 2 ranks: refused: $(errors tied-s3.r0.out)"
    else
        echo "FAIL: tied embeddings at stage 3 on 2 ranks: $(errors tied-s3.r*.out)"; fail=1
    fi
else
    echo "FAIL: tied embeddings, 2 ranks with checkpoints: $(errors tied.r*.out)"; fail=1
fi

[ $fail -eq 0 ] && echo "train_elastic: ok"
exit $fail
