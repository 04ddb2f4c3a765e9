#!/usr/bin/env bash
# The `zinc` command's exit codes and error texts: 0 success, 1 failure with
# "zinc: error: ...", 2 bad usage.
set -u
zinc=$1
src=$2
pass=0 fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# expect CODE PATTERN -- ARGS...: runs zinc ARGS, checks the exit code and
# that stdout+stderr matches PATTERN (grep -E).
expect() {
    local want=$1 pat=$2
    shift 3
    local out rc
    out=$("$zinc" "$@" 2>&1)
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "FAIL: zinc $*: exit $rc, expected $want"; echo "$out" | head -5
        fail=$((fail + 1)); return
    fi
    if ! grep -qE -- "$pat" <<<"$out"; then
        echo "FAIL: zinc $*: output does not match /$pat/:"; echo "$out" | head -5
        fail=$((fail + 1)); return
    fi
    pass=$((pass + 1))
}

expect 2 "usage: zinc" --
expect 0 "commands:" -- --help
expect 0 "^zinc [0-9]" -- --version
expect 2 "unknown command 'frob'" -- frob
expect 0 "cores" -- info
expect 0 '"cores": [0-9]+' -- info --json
expect 2 "unknown argument" -- info --bogus
# bench adam verifies every pass (exit 1 on a wrong result): every moment
# format on a small array, a partial 8-bit block at the end
expect 0 "adam int8 .*[0-9]+ *$" -- bench adam --params 70001 --states all --copy bf16 \
    --grad bf16 --iters 2
expect 2 "--states wants" -- bench adam --states int4
# the bf16 master with stochastic rounding beside the fp32 one, every moment
# format: each pass's bf16 params must be a bf16 neighbour of the step
expect 0 "adam sr int8 .*[0-9]+ *$" -- bench adam --params 70001 --states all --master all \
    --iters 2
expect 2 "--master wants" -- bench adam --master fp16
expect 0 "fits" -- plan "$src/examples/tiny.json"
# planned for the A10 machine: its swap folder (/mnt/nvme0/zinc) is not
# here, which the plan refuses unless the run may create it
if [ ! -e /mnt/nvme0/zinc ]; then
    expect 1 "tiers.nvme\\[0\\].path /mnt/nvme0/zinc does not exist" -- \
        plan "$src/examples/a10-qwen2.5-14b-nvme.json"
fi
nv14=(--set tiers.create_nvme_path=true)
expect 0 "14.77B parameters" -- plan "$src/examples/a10-qwen2.5-14b-nvme.json" "${nv14[@]}"
# its stop on SIGTERM: every step is committed in place (the example takes
# the states' second copy), so the stop drops the update in flight: a
# unit's reads and writes, far less than the 165.07 GiB update itself at
# the printed rate
stop=$("$zinc" plan "$src/examples/a10-qwen2.5-14b-nvme.json" "${nv14[@]}" 2>&1 | grep '^on SIGTERM')
d=$(sed -n 's/.*: about \([0-9.]*\) s at most (the reads and writes in flight, of offload_optimizer.buffer_count units, at \([0-9.]*\) GB\/s.*/\1/p' <<<"$stop")
r=$(sed -n 's/.*: about \([0-9.]*\) s at most (the reads and writes in flight, of offload_optimizer.buffer_count units, at \([0-9.]*\) GB\/s.*/\2/p' <<<"$stop")
if [ -n "$d" ] && [ -n "$r" ] && grep -q "every step is committed in place (165.07 GiB on NVMe" <<<"$stop" &&
   grep -q "at most one step old" <<<"$stop" &&
   awk -v d="$d" -v r="$r" 'BEGIN { exit !(d * r * 1e9 < 165.07 * 2^30 / 10) }'; then
    pass=$((pass + 1))
else
    echo "FAIL: the 14B NVMe plan's stop on SIGTERM with every step committed (drain '$d' s at '$r' GB/s): $stop"
    fail=$((fail + 1))
fi
# without the commits (train.checkpoint.commit false) the last finished
# step's update, still running under the next step, lands first (it reads
# and writes the 165.07 GiB of state on NVMe: at least their write at the
# disk's rate), then the save keeps that state in place; the total is no
# less than the update
stop=$("$zinc" plan "$src/examples/a10-qwen2.5-14b-nvme.json" "${nv14[@]}" \
       --set train.checkpoint.commit=false 2>&1 | grep '^on SIGTERM')
u=$(sed -n 's/.*update still running lands (about \([0-9]*\) s).*/\1/p' <<<"$stop")
t=$(sed -n 's/.*: about \([0-9]*\) s at most.*/\1/p' <<<"$stop")
w=$(sed -n 's/.*written at \([0-9.]*\) GB\/s.*/\1/p' <<<"$stop")
if [ -n "$u" ] && [ -n "$t" ] && [ -n "$w" ] && grep -q "165.07 GiB of it on NVMe kept in place" <<<"$stop" &&
   awk -v u="$u" -v t="$t" -v w="$w" 'BEGIN { exit !(t >= u && (u + 1) * w * 1e9 >= 165.07 * 2^30) }'; then
    pass=$((pass + 1))
else
    echo "FAIL: the 14B NVMe plan's stop on SIGTERM (update '$u' s, total '$t' s, disk '$w' GB/s): $stop"
    fail=$((fail + 1))
fi
expect 0 "7.62B parameters" -- plan "$src/examples/a10-qwen2.5-7b.json"
# a bf16 (CUDA) plan counts what lives outside the device arena: the 2 GEMM
# streams x (a 64 MiB cuBLAS handle, as measured on an H200, + a 32 MiB
# workspace + 4 MiB scratch) and 3 copy streams x 4 MiB scratch; with 2
# ranks a 4th copy stream and NCCL's planned 288 MiB (2 peers x 16 channels
# x 9 MiB)
expect 0 "holds 212.00 MiB outside the arena: the GEMM streams' cuBLAS handles and workspaces, every stream's scratch;" -- \
    plan "$src/examples/a10-qwen2.5-7b.json"
expect 0 "holds 504.00 MiB outside the arena: .*, NCCL's buffers" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --world 2 --set gradient_accumulation_steps=8
# an fp32 run on a CUDA device holds the same streams: the demo's config
# with train.device "cuda" counts them (and still fits its 256 MiB tier);
# on the host backend nothing is held outside the arena
expect 0 "holds 212.00 MiB outside the arena" -- plan "$src/examples/tiny.json" \
    --set 'train.device="cuda"'
if "$zinc" plan "$src/examples/tiny.json" --set 'train.device="host"' 2>&1 | grep -q "outside the arena"; then
    echo "FAIL: a host-backend plan counts memory outside the arena"; fail=$((fail + 1))
else
    pass=$((pass + 1))
fi
expect 1 "cpu tier needs .*offload_optimizer.device=nvme needs" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --set tiers.cpu=64GiB
# fp32 moments in a cpu tier that 8-bit ones would fit: said first, with the
# figure the 8-bit plan itself has; where they would not, after the NVMe fix
expect 1 "adamw_bnb_8bit .*alone fits \(the cpu tier then needs 87.26 GiB\); or zero_optimization.offload_optimizer.device=nvme" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --set tiers.cpu=100GiB
expect 0 "^total +[0-9.]+ GiB +87.26 GiB" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --set tiers.cpu=100GiB --set train.optim=adamw_bnb_8bit
expect 1 "tiers.nvme has 0 B; train.optim=adamw_bnb_8bit .*not enough alone \(short by 23.26 GiB even so\); both together need 71.15 GiB on nvme" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --set tiers.cpu=64GiB
# 8-bit moments on NVMe: an NVMe tier short with fp32 moments on it is told
# what they save; the wear line says what they would write
expect 1 "nvme tier needs .*adamw_bnb_8bit keeps Adam's m and v in 8 bits \(27.94 GiB instead of 110.05 GiB\), which saves 82.10 GiB and alone fits" -- \
    plan "$src/examples/a10-qwen2.5-14b-nvme.json" "${nv14[@]}" --set train.speculative_step=auto \
    --set 'tiers.nvme=[{"path": "/mnt/nvme0/zinc", "size": "150GiB"}]'
expect 0 "adamw_bnb_8bit keeps Adam's m and v in 8 bits, on NVMe too: 82.96 GiB of optimizer states per step instead of 165.07 GiB" -- \
    plan "$src/examples/a10-qwen2.5-14b-nvme.json" "${nv14[@]}"
# (its k and v biases, 1024 elements in each of 48 layers, keep fp32
# moments, as bitsandbytes keeps them: 384 blocks of 1 KiB, pinned)
expect 0 "^adam m \(int8\) +- +384.00 KiB +13.97 GiB" -- \
    plan "$src/examples/a10-qwen2.5-14b-nvme.json" "${nv14[@]}" --set train.optim=adamw_bnb_8bit
# Qwen2.5-14B full fine-tune with nothing on NVMe: 8-bit moments, tiers.cpu
# 192 GiB; the NVMe example given that much RAM is told its params fit there
expect 0 "^total +[0-9.]+ GiB +167.74 GiB +0 B" -- plan "$src/examples/a10-qwen2.5-14b-8bit.json"
# and with the bf16 master (stochastic rounding) in what a 192 GB machine's
# tiers.cpu auto gives (about 158 GiB): 2 bytes per parameter less
expect 0 "^total +[0-9.]+ GiB +140.04 GiB +0 B" -- plan "$src/examples/a10-qwen2.5-14b-8bit.json" \
    --set train.master_weights=bf16_sr --set tiers.cpu=158GiB
expect 0 "the params on NVMe \(26.06 GiB\) would fit in the cpu tier's headroom" -- \
    plan "$src/examples/a10-qwen2.5-14b-nvme.json" "${nv14[@]}" --set tiers.cpu=192GiB \
    --set train.optim=adamw_bnb_8bit --set zero_optimization.offload_optimizer.device=cpu
expect 1 "offload_parm: unknown key \(did you mean 'offload_param'\?\)" -- \
    plan "$src/examples/tiny.json" --set zero_optimization.offload_parm.device=cpu
# auto: the GEMM attention up to 8192 tokens (5.2x faster than the fused
# kernels on the first GPU), the fused one beyond (its memory)
expect 0 "attention +GEMM .*\\[auto: GEMM up to 8192 tokens" -- plan "$src/examples/a10-qwen2.5-7b.json"
expect 0 "attention +fused .*\\[auto: GEMM up to 8192 tokens" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --set data.seq_len=16384 --set model.max_position_embeddings=16384
expect 0 "attention +GEMM .*\\[train.attention\\]" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --set train.attention=\"gemm\"
# the activation_checkpointing section of the public configs that offload
# checkpoints (partitioned over a model-parallel group of one)
expect 0 "activations \\(ckpt\\) +- +[0-9.]+ MiB" -- plan "$src/examples/tiny.json" \
    --set activation_checkpointing.partition_activations=true \
    --set activation_checkpointing.cpu_checkpointing=true
# 14B at 32k tokens: the checkpoints crowd the parameter slots out of the
# GPU; the error offers pinned-RAM checkpoints, and with them it fits
expect 1 "set activation_checkpointing.cpu_checkpointing=true" -- \
    plan "$src/examples/a10-qwen2.5-14b-nvme.json" "${nv14[@]}" --set data.seq_len=32768
expect 0 "^fits" -- plan "$src/examples/a10-qwen2.5-14b-nvme.json" "${nv14[@]}" --set data.seq_len=32768 \
    --set activation_checkpointing.cpu_checkpointing=true
# zinc train hands train.attention to the model it plans and runs
expect 1 "fused attention takes head_dim up to 128" -- \
    train "$src/examples/tiny.json" --set train.attention=\"fused\" --set model.head_dim=256 \
    --steps 1
expect 1 "train.attention: 'flash' is not one of auto[|]gemm[|]fused" -- \
    plan "$src/examples/tiny.json" --set train.attention=\"flash\"
expect 1 "fused attention takes head_dim up to 128" -- \
    plan "$src/examples/tiny.json" --set train.attention=\"fused\" --set model.head_dim=256
expect 1 "cannot open config" -- plan "$tmp/missing.json"
printf '{\n "train_batch_size": 4,\n "zero_optimization": {"stage": 3,}\n}\n' > "$tmp/bad.json"
expect 1 "bad.json:3:" -- plan "$tmp/bad.json"
expect 2 "--set needs KEY=VALUE" -- plan "$src/examples/tiny.json" --set
expect 2 "unknown option" -- plan "$src/examples/tiny.json" --frob
expect 2 "expected a rank count" -- plan "$src/examples/tiny.json" --world 0
expect 0 '"stage": 3' -- plan "$src/examples/tiny.json" --print-config
# a model folder holding only its config.json (a user planning before the
# download) plans from the shapes, saying so; training it needs weights
mkdir -p "$tmp/mistral"
cp "$src/tests/fixtures/model-configs/Mistral-7B-Instruct-v0.3.json" "$tmp/mistral/config.json"
expect 0 "holds config.json and no weights: planned from its shapes alone" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --model "$tmp/mistral" --data synthetic
expect 0 "model +mistral, 7.25B parameters" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --model "$tmp/mistral" --data synthetic
expect 1 "has no weights .*model.init=random" -- \
    train "$src/examples/tiny.json" --model "$tmp/mistral" --data synthetic --steps 1
# Qwen3-8B's config.json (no head_dim: Qwen3Config's 128) plans with
# transformers' parameter count, the q/k norm weights included
mkdir -p "$tmp/qwen3"
cp "$src/tests/fixtures/model-configs/Qwen3-8B.json" "$tmp/qwen3/config.json"
expect 0 "model +qwen3, 8.19B parameters \(36 layers, hidden 4096, heads 32/8" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --model "$tmp/qwen3" --data synthetic
# phi-4's (phi3: qkv_proj and gate_up_proj fused) likewise; 14.7B does not
# fit the 7B example's RAM, and the plan says so with the count
mkdir -p "$tmp/phi4"
cp "$src/tests/fixtures/model-configs/phi-4.json" "$tmp/phi4/config.json"
expect 1 "model +phi3, 14.66B parameters \(40 layers, hidden 5120, heads 40/10" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --model "$tmp/phi4" --data synthetic
# gemma-2-9b-it's (gemma2: four norms a layer, the tied 256000-row table
# in row parts) with transformers' count
mkdir -p "$tmp/gemma2"
cp "$src/tests/fixtures/model-configs/gemma-2-9b-it.json" "$tmp/gemma2/config.json"
expect 0 "model +gemma2, 9.24B parameters \(42 layers, hidden 3584, heads 16/8, vocab 256000" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --model "$tmp/gemma2" --data synthetic
# Qwen3-30B-A3B's (qwen3_moe: 128 experts of 768 a layer, inside the
# layer's block) with transformers' 30,532,122,624: full fine-tuning is
# 517 GiB of RAM state (the plan says what is short), LoRA on the
# attention (all-linear: transformers 5 keeps the experts as 3-D tensors,
# no nn.Linear for PEFT) fits the 7B example's RAM
mkdir -p "$tmp/qwen3moe"
cp "$src/tests/fixtures/model-configs/Qwen3-30B-A3B.json" "$tmp/qwen3moe/config.json"
expect 1 "model +qwen3_moe, 30.53B parameters \(48 layers, hidden 2048, heads 32/4" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --model "$tmp/qwen3moe" --data synthetic
expect 0 "trainable 13369344 of 30545491968 parameters" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --model "$tmp/qwen3moe" --data synthetic \
    --set lora.r=16 --set lora.target_modules=all-linear
expect 1 "experts' projections\) are not built" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --model "$tmp/qwen3moe" --data synthetic \
    --set lora.r=16 --set 'lora.target_modules=["q_proj","down_proj"]'
# the load-balancing loss (output_router_logits) is reported apart from
# the loss that holds it weighted: the step line and the JSON log
expect 0 "loss +[0-9.]+  aux [0-9.]+  lr" -- \
    train "$src/tests/fixtures/ft-qwen3moeaux/train-config.json" \
    --model "$src/tests/fixtures/ft-qwen3moeaux" --steps 2 --data synthetic \
    --json-log "$tmp/aux.jsonl"
if grep -qE '"aux_loss": [0-9]' "$tmp/aux.jsonl" 2>/dev/null; then
    pass=$((pass + 1))
else
    echo "FAIL: --json-log of a run with the load-balancing loss has no aux_loss"
    fail=$((fail + 1))
fi
# OLMo 3.1 32B's (olmo3: sliding-window layers, YaRN on the full ones)
# with transformers' count; 32B does not fit the 7B example's RAM
mkdir -p "$tmp/olmo3"
cp "$src/tests/fixtures/model-configs/Olmo-3.1-32B-Instruct.json" "$tmp/olmo3/config.json"
expect 1 "model +olmo3, 32.23B parameters \(64 layers, hidden 5120, heads 40/8, vocab 100278" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --model "$tmp/olmo3" --data synthetic
# a family not built yet is refused naming what it needs
mkdir -p "$tmp/qwen3_5"
cp "$src/tests/fixtures/model-configs/Qwen3.5-9B.json" "$tmp/qwen3_5/config.json"
expect 1 "model_type 'qwen3_5' is not built yet: it needs linear-attention" -- \
    plan "$src/examples/a10-qwen2.5-7b.json" --model "$tmp/qwen3_5" --data synthetic

echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
