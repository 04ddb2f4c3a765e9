#!/usr/bin/env bash
# The cost model against measured steps (issue 36): `zinc bench train` on
# configurations spanning the knobs --tune explores (placements, gradients
# on NVMe, micro-batch against accumulation, cpu checkpointing, state
# format, clipping, model size), each printing its predicted and measured
# step; then the error's median and worst. Then --tune's choice: the five
# best candidates of `zinc plan --tune` each measured, and the chosen one's
# measured time against the fastest.
# Usage: bench/scripts/tune_check.sh [ZINC] [CSV]   (default build/zinc,
# bench/results/tune.csv). Run on a quiet machine: the ceilings are
# measured first (--recalibrate) and every row shares them. Each row is run
# TUNE_REPS times (default 2) and its fastest mean step kept: the ceilings
# are each the best of three, and a shared machine's noise only ever adds.
set -u
zinc=$(realpath "${1:-build/zinc}")
csv=$(realpath -m "${2:-bench/results/tune.csv}")
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
mkdir -p swap
export ZINC_LOG=warn
tiny=$src/examples/tiny.json
nv='tiers.nvme=[{"path":"swap","size":"2GiB"}]'
mid='model.hidden_size=768 model.num_hidden_layers=6 model.num_attention_heads=12 model.num_key_value_heads=4 model.intermediate_size=2048 model.vocab_size=8192'

# name | config | sets (space separated KEY=VALUE)
rows=(
  "cpu/cpu|$tiny|zero_optimization.offload_optimizer.device=cpu"
  "cpu/nvme (as shipped)|$tiny|"
  "nvme/nvme|$tiny|zero_optimization.offload_param.device=nvme zero_optimization.offload_param.max_in_cpu=0"
  "nvme/nvme grads nvme|$tiny|zero_optimization.offload_param.device=nvme zero_optimization.offload_param.max_in_cpu=0 tiers.grads=nvme"
  "gpu/gpu|$tiny|zero_optimization.offload_param.device=none zero_optimization.offload_optimizer.device=none tiers.gpu=512MiB"
  "gpu/cpu|$tiny|zero_optimization.offload_param.device=none zero_optimization.offload_optimizer.device=cpu tiers.gpu=512MiB"
  "micro 2 x acc 2|$tiny|train_micro_batch_size_per_gpu=2 gradient_accumulation_steps=2"
  "micro 1 x acc 4|$tiny|train_micro_batch_size_per_gpu=1 gradient_accumulation_steps=4"
  "cpu checkpointing|$tiny|activation_checkpointing.cpu_checkpointing=true"
  "no clipping|$tiny|gradient_clipping=0"
  "micro 8|$tiny|train_micro_batch_size_per_gpu=8"
  "seq 256|$tiny|data.seq_len=256"
  "int8 states cpu|$tiny|zero_optimization.offload_optimizer.device=cpu train.optim=adamw_bnb_8bit"
  "bf16 states cpu|$tiny|zero_optimization.offload_optimizer.device=cpu train.optim=adamw_bf16"
  "sub-group 250k|$tiny|zero_optimization.sub_group_size=250000"
  "mid cpu/cpu|$tiny|$mid zero_optimization.offload_optimizer.device=cpu tiers.cpu=8GiB"
  "mid cpu/nvme|$tiny|$mid tiers.cpu=8GiB"
  "mid nvme/nvme|$tiny|$mid zero_optimization.offload_param.device=nvme zero_optimization.offload_param.max_in_cpu=0 tiers.cpu=8GiB"
  "mid micro 1 x acc 4|$tiny|$mid train_micro_batch_size_per_gpu=1 gradient_accumulation_steps=4 tiers.cpu=8GiB"
  "mid int8 cpu|$tiny|$mid zero_optimization.offload_optimizer.device=cpu train.optim=adamw_bnb_8bit tiers.cpu=8GiB"
  "qwen2 fixture cpu/cpu|$tiny|model.path=$src/tests/fixtures/tiny-qwen2 data.path=synthetic zero_optimization.offload_optimizer.device=cpu"
)

reps=${TUNE_REPS:-2}
# best_run CONFIG ARGS...: the "predicted step time" line of the run with
# the fastest measured step of $reps (the last one's tail on stderr when
# none predicted)
best_run() {
    local cfg=$1 best="" bm=""
    shift
    for ((k = 0; k < reps; k++)); do
        out=$("$zinc" bench train --config "$cfg" --steps 4 --warmup 2 "$@" 2>&1)
        local l m
        l=$(grep "^predicted step time" <<<"$out") || continue
        m=$(sed -E 's/.*measured ([0-9.]+) s.*/\1/' <<<"$l")
        if [ -z "$bm" ] || python3 -c "import sys; sys.exit(0 if $m < $bm else 1)"; then
            best=$l bm=$m
        fi
    done
    [ -n "$best" ] || tail -3 <<<"$out" >&2
    echo "$best"
}

[ -f "$csv" ] || echo "name,predicted_s,measured_s,error,bound" >"$csv"
"$zinc" plan "$tiny" --recalibrate --set "$nv" >/dev/null 2>&1
errs=()
for r in "${rows[@]}"; do
    IFS='|' read -r name cfg sets <<<"$r"
    args=(--set "$nv" --set tiers.gpu=512MiB)
    for kv in $sets; do args+=(--set "$kv"); done
    line=$(best_run "$cfg" "${args[@]}")
    if [ -z "$line" ]; then
        echo "$name: no prediction"; continue
    fi
    p=$(sed -E 's/^predicted step time ([0-9.]+) s.*/\1/' <<<"$line")
    m=$(sed -E 's/.*measured ([0-9.]+) s.*/\1/' <<<"$line")
    b=$(sed -E 's/.*\(bound: ([^)]*)\).*/\1/' <<<"$line")
    e=$(python3 -c "print(f'{($p - $m) / $m:+.3f}')")
    printf "%-26s predicted %7.3f s  measured %7.3f s  error %s  (%s)\n" "$name" "$p" "$m" "$e" "$b"
    echo "\"$name\",$p,$m,$e,\"$b\"" >>"$csv"
    errs+=("$e")
done
python3 - "${errs[@]}" <<'EOF'
import statistics, sys
e = [abs(float(x)) for x in sys.argv[1:]]
if e:
    print(f"{len(e)} configurations: median |error| {statistics.median(e):.3f}, worst {max(e):.3f}")
EOF

# --tune's choice against its rivals, each measured
echo
out=$("$zinc" plan "$tiny" --tune --set "$nv" --set tiers.gpu=512MiB 2>&1)
echo "$out" | sed -n '/^tune:/,$p'
ZINC_TUNE_DEBUG=1 "$zinc" plan "$tiny" --tune --set "$nv" --set tiers.gpu=512MiB 2>/dev/null |
    awk '/^  [0-9] /{n=$1} /^        /{print n "|" $1}' >cands.txt
for i in 1 2 3 4 5; do
    args=(--set "$nv" --set tiers.gpu=512MiB)
    while IFS='|' read -r k kv; do [ "$k" = "$i" ] && args+=(--set "$kv"); done <cands.txt
    t=$(best_run "$tiny" "${args[@]}" | sed -E 's/.*measured ([0-9.]+) s.*/\1/')
    echo "candidate $i measured $t s"
done
