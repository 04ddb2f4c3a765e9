#!/usr/bin/env bash
# The speculative step against the schedule before it, in one sitting:
# `zinc bench train` on the tiny example, a mid-size model (tiny.json's
# schedule, 768 wide, 8 layers, 35M parameters) and, with --big, the
# 1.78B Qwen2.5-shaped NVMe configuration of the scale test, each at
# gradient accumulation 1 and 4, with train.speculative_step false (the
# old schedule: every unit waits for the global norm) and true, the two
# runs of a pair back to back. The clip is set high enough that no step
# clips (the case speculation is for; a clipped step costs the old
# schedule's time plus what it speculated, see test_train's counts).
# Usage: bench/scripts/spec_step.sh [ZINC] [CSV] [--big]
set -euo pipefail
zinc=${1:-build/zinc}
csv=${2:-bench/results/spec-step.csv}
big=${3:-}
mid=(--set model.hidden_size=768 --set model.num_hidden_layers=8 --set model.intermediate_size=2048
     --set model.num_attention_heads=12 --set model.num_key_value_heads=4 --set model.vocab_size=8192
     --set 'tiers.nvme=[{"path": "zinc-swap", "size": "4GiB"}]' --set tiers.cpu=4GiB
     --set tiers.gpu=2GiB)
run() {  # label, accumulation, speculative, then config args
    local label=$1 acc=$2 spec=$3; shift 3
    echo "== $label, accumulation $acc, speculative_step $spec"
    "$zinc" bench train "$@" --set gradient_accumulation_steps="$acc" \
        --set train.speculative_step="$spec" --set gradient_clipping=1000 --csv "$csv" |
        grep -E "^# (speculative|param cache|steps)|^  [0-9]"
}
for acc in 1 4; do
    for spec in false true; do
        run tiny "$acc" "$spec" --config examples/tiny.json --steps 6 --warmup 2
    done
    for spec in false true; do
        run mid "$acc" "$spec" --config examples/tiny.json "${mid[@]}" --steps 4 --warmup 1
    done
    if [ "$big" = --big ]; then
        for spec in false true; do
            run 1.78B "$acc" "$spec" --config tests/fixtures/scale/qwen2.5-1.8b-nvme.json \
                --steps 2 --warmup 1
        done
    fi
done
