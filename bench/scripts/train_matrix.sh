#!/usr/bin/env bash
# `zinc bench train` over the placements of examples/tiny.json, with and
# without gradient clipping; appends one row per run to CSV (default
# bench/results/train.csv). Usage: bench/scripts/train_matrix.sh [ZINC] [CSV]
# The GPU budget is raised so every placement gets the same slot ring.
set -euo pipefail
zinc=${1:-build/zinc}
csv=${2:-bench/results/train.csv}
common=(--config examples/tiny.json --set tiers.gpu=256MiB --steps 8 --warmup 2 --csv "$csv")
P=zero_optimization.offload_param
O=zero_optimization.offload_optimizer
placements=(
  "$P.device=\"none\" $O.device=\"none\""
  "$P.device=\"cpu\" $O.device=\"cpu\""
  "$P.device=\"cpu\" $O.device=\"nvme\""
  "$P.device=\"nvme\" $P.max_in_cpu=0 $O.device=\"nvme\""
  "$P.device=\"nvme\" $P.max_in_cpu=0 $O.device=\"nvme\" tiers.grads=\"nvme\""
)
for clip in 0 1.0; do
  for pl in "${placements[@]}"; do
    sets=(--set "gradient_clipping=$clip")
    for kv in $pl; do sets+=(--set "$kv"); done
    echo "== clipping $clip; $pl"
    "$zinc" bench train "${common[@]}" "${sets[@]}" | tail -1
  done
done
