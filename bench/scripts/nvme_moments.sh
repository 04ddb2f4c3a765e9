#!/usr/bin/env bash
# Issue 35: Adam's moments swapped through NVMe at their own size. The
# same run with the optimizer on NVMe and train.optim adamw_torch (fp32
# moments), adamw_bf16 and adamw_bnb_8bit; for each, NVMe bytes read and
# written per step in steady state (a run of 2N steps less a run of N, so
# the first step, which reads no moments, and the initial master write
# drop out) and the step time measured the same way (noisy on a shared
# machine: one sample each), and the plan's writes per step ("nvme wear").
#
# Model: examples/tiny.json's shape made larger (hidden 512, 8 layers,
# intermediate 1376, 8/4 heads: 23.5M parameters; vocab 320), micro-batch
# 4 x 64, host backend, 2 threads; two placements: params in pinned RAM
# and the optimizer on NVMe (the demo's), and both on NVMe (no params kept
# in RAM, gradients on NVMe).
#
# Usage: bench/scripts/nvme_moments.sh [ZINC] [SWAPDIR] [N]
#        (defaults build/zinc, ./nvme-moments-swap, 10). Prints a markdown
#        table. About 3 minutes on 2 cores.
set -euo pipefail
zinc=$(realpath "${1:-build/zinc}")
swap=$(realpath -m "${2:-nvme-moments-swap}")
n=${3:-10}
work=$(mktemp -d nvme-moments-XXXXXX)
trap 'rm -rf "$work" "$swap"' EXIT
model=(--set model.hidden_size=512 --set model.num_hidden_layers=8
       --set model.intermediate_size=1376 --set model.num_attention_heads=8
       --set model.num_key_value_heads=4 --set tiers.gpu=256MiB --set tiers.cpu=4GiB
       --set "tiers.nvme=[{\"path\": \"$swap\", \"size\": \"2GiB\"}]"
       --set tiers.create_nvme_path=true --set train.threads=2 --set train.log_every=1000)
declare -A place=(
    [cpu-nvme]=""
    [nvme-nvme]="--set zero_optimization.offload_param.device=\"nvme\" --set zero_optimization.offload_param.max_in_cpu=0 --set tiers.grads=\"nvme\"")
mib() { awk -v x="$1" -v u="$2" 'BEGIN { f = u == "GiB" ? 1024 : u == "KiB" ? 1 / 1024 : u == "B" ? 1 / 1048576 : 1; printf "%.3f", x * f }'; }
# moved LINE FILE: MiB on the report's link line
moved() { local l; l=$(grep -E "^  $1" "$2"); mib "$(awk '{print $(NF-2)}' <<<"$l")" "$(awk '{print $(NF-1)}' <<<"$l")"; }
stime() { sed -n 's/^  step time *\([0-9.]*\) s.*/\1/p' "$1"; }
wear() { sed -n 's/^nvme wear: \([0-9.]*\) \([KMG]iB\) written per step.*/\1 \2/p' "$1"; }
echo "# zinc $("$zinc" --version 2>/dev/null | head -1); $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $(. /etc/os-release; echo "$PRETTY_NAME")"
echo "# steady state: (run of $((2 * n)) steps) - (run of $n steps), per step"
echo
echo "| placement | train.optim | moments | read MiB/step | write MiB/step | read+write vs fp32 | plan's writes/step | step s |"
echo "|---|---|---|---|---|---|---|---|"
for p in cpu-nvme nvme-nvme; do
    eval "pl=(${place[$p]})"
    base=
    for o in adamw_torch adamw_bf16 adamw_bnb_8bit; do
        for s in $n $((2 * n)); do
            "$zinc" train "${model[@]}" ${pl[@]+"${pl[@]}"} --set train.optim=$o --steps $s \
                > "$work/$p-$o-$s.out" 2>&1 || { echo "FAIL: $p $o $s: $(tail -3 "$work/$p-$o-$s.out")"; exit 1; }
        done
        a=$work/$p-$o-$n.out b=$work/$p-$o-$((2 * n)).out
        r=$(awk -v x="$(moved 'nvme->cpu' "$b")" -v y="$(moved 'nvme->cpu' "$a")" -v n=$n 'BEGIN { printf "%.2f", (x - y) / n }')
        w=$(awk -v x="$(moved 'cpu->nvme' "$b")" -v y="$(moved 'cpu->nvme' "$a")" -v n=$n 'BEGIN { printf "%.2f", (x - y) / n }')
        t=$(awk -v x="$(stime "$b")" -v y="$(stime "$a")" -v n=$n 'BEGIN { printf "%.3f", (x - y) / n }')
        rw=$(awk -v r=$r -v w=$w 'BEGIN { print r + w }')
        [ -n "$base" ] || base=$rw
        case $o in adamw_torch) mom="fp32 (8 B)" ;; adamw_bf16) mom="bf16 (4 B)" ;; *) mom="int8 + absmax (2.03 B)" ;; esac
        echo "| $p | $o | $mom | $r | $w | $(awk -v a=$rw -v b=$base 'BEGIN { printf "%.3f", a / b }') | $(wear "$b") | $t |"
    done
done
