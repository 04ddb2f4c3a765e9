#!/bin/bash
# Qwen2.5-7B full fine-tune on a GPU machine with about 128 GiB of RAM:
# examples/a10-qwen2.5-7b.json (the A10's 22 GiB GPU tier) with 8-bit AdamW
# states, parameters and optimizer in pinned RAM, 4 steps on synthetic data.
# Writes to $OUT the plan, the run's output and step log, the process's RSS
# every 2 s and nvidia-smi's memory.used every 0.5 s: the plan against what
# the run held, from zinc and from outside it. Run from the repository root
# with a CUDA build in build-gpu (scripts/gpu-remote.sh with
# GPU_REMOTE_CMD='bash bench/scripts/gpu_7b.sh'). Results:
# bench/results/train-7b-h200.md.
set -u
: "${OUT:?set OUT to a folder for the results}"
z=$PWD/build-gpu/zinc
nproc; free -g | head -2; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
src=$PWD
work=$(mktemp -d)
smi= pid=
# on exit, Ctrl-C or SIGTERM: the run and the sampler end, the folder goes
trap 'kill $smi $pid 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
cd "$work" || exit 1
args=(examples/a10-qwen2.5-7b.json --set 'train.optim="adamw_bnb_8bit"' --set 'tiers.cpu="110GiB"'
      --set 'data.path="synthetic"' --set gradient_accumulation_steps=1 --set train_batch_size=1
      --set 'train.checkpoint.dir=""' --set train.checkpoint.every=0)
args[0]=$src/examples/a10-qwen2.5-7b.json
"$z" plan "${args[@]}" > $OUT/7b-plan.txt 2>&1; echo "plan exit $?" >> $OUT/7b-plan.txt
tail -22 $OUT/7b-plan.txt
nvidia-smi --query-gpu=timestamp,memory.used --format=csv -lms 500 > $OUT/7b-smi.csv 2>&1 &
smi=$!
ZINC_LOG=info timeout 250 "$z" train "${args[@]}" --steps 4 --json-log $OUT/7b-steps.jsonl > $OUT/7b-train.txt 2>&1 &
pid=$!
sleep 1; zp=$(pgrep -f "^$z train" | head -1)
while kill -0 $pid 2>/dev/null; do
    echo "$(date +%s) $(grep -E 'VmRSS|VmHWM' /proc/$zp/status 2>/dev/null | tr -s ' \n' ' ')" >> $OUT/7b-rss.txt
    sleep 2
done
wait $pid; echo "train exit $?" >> $OUT/7b-train.txt
kill $smi
tail -45 $OUT/7b-train.txt
sort -t, -k2 -n $OUT/7b-smi.csv | tail -1
tail -2 $OUT/7b-rss.txt
