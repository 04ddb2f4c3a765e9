#!/usr/bin/env bash
# The first thing to run on a machine with an NVIDIA GPU: builds zinc for the
# GPU present, runs the gpu test suite, compares zinc's CUDA forward and a
# short fine-tune with PyTorch on the same GPU (where torch imports), runs
# bench pcie / model / train (three placements) / comm (world 1, NCCL), and
# checks determinism (two runs bit for bit) and a checkpoint resumed on the
# GPU, runs the kernels under compute-sanitizer and the train bench at full
# memory, tries two NCCL ranks on the one GPU, and
# writes one results file, bench/results/gpu-check-DATE-GPU.md, naming the
# GPU, the driver and the CUDA toolkit, with every step's outcome and
# figures. A failing step is recorded and the next one runs. Without a GPU
# it says so and exits 77. Exit 0 when every step passed, else 1.
# Usage: scripts/gpu-check.sh [BUILD_DIR]   (default build-gpu)   | make gpu-check
# Environment:
#   GPU_CHECK_PREBUILT=1   BUILD_DIR is already built for this GPU (a bundle
#                          from scripts/gpu-bundle.sh): no setup, no build
#   GPU_CHECK_BUDGET_S=N   stop starting steps N seconds after the start; a
#                          step's limit is cut to what is left, and the steps
#                          not run are listed as such (a lent GPU by the minute)
#   GPU_CHECK_LOGS=DIR     keep every step's whole output there (NN-name.txt)
#   GPU_CHECK_ONLY=REGEX   run only the steps whose names match (grep -E);
#                          the build always runs
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bdir=${1:-build-gpu}
export PATH="/usr/local/cuda/bin:$PATH"

if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu-check: no GPU here (nvidia-smi not found): nothing to check"
    exit 77
fi
if ! q=$(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total \
                    --format=csv,noheader 2>&1) || [ -z "$q" ]; then
    echo "gpu-check: no GPU here (nvidia-smi: ${q:-no device})"
    exit 77
fi
gpu=$(echo "$q" | head -1 | cut -d, -f1 | sed 's/^ *//; s/ *$//')
driver=$(echo "$q" | head -1 | cut -d, -f2 | tr -d ' ')
cc=$(echo "$q" | head -1 | cut -d, -f3 | tr -d ' ')
mem=$(echo "$q" | head -1 | cut -d, -f4 | sed 's/^ *//')
cuda=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
slug=$(echo "$gpu" | tr -c 'A-Za-z0-9\n' '-' | sed 's/--*/-/g; s/-$//')
out="bench/results/gpu-check-$(date +%Y-%m-%d)-$slug.md"
log=$(mktemp -d gpu-check-XXXXXX --tmpdir)
# the steps' CSVs (tune_check's, bench generate's) kept with the logs
trap '[ -z "${GPU_CHECK_LOGS:-}" ] || cp "$log"/*.csv "$GPU_CHECK_LOGS"/ 2>/dev/null; rm -rf "$log"' EXIT
fails=0
nstep=0
t_start=$(date +%s)
budget=${GPU_CHECK_BUDGET_S:-0}
keep=${GPU_CHECK_LOGS:-}
[ -z "$keep" ] || mkdir -p "$keep"

{
    echo "# gpu-check: $gpu"
    echo
    echo "- GPU: $gpu, compute capability $cc, $mem; driver $driver; CUDA toolkit ${cuda:-?}"
    echo "- host: $(nproc) cores, $(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -sr)"
    echo "- zinc: $(git rev-parse --short HEAD 2>/dev/null || echo '?'), build $bdir"
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
} > "$out"

# step NAME LIMIT_S COMMAND...: runs it, records ok/FAIL, the time and the
# output's tail in the results file
step() {
    local name=$1 limit=$2; shift 2
    local t0 rc
    t0=$(date +%s)
    nstep=$((nstep + 1))
    if [ -n "${GPU_CHECK_ONLY:-}" ] && [ $nstep -gt 1 ] && ! echo "$name" | grep -qE "$GPU_CHECK_ONLY"; then
        { echo "## $name: not selected (GPU_CHECK_ONLY)"; echo; } >> "$out"
        return 0
    fi
    if [ "$budget" -gt 0 ]; then
        local left=$(( t_start + budget - t0 ))
        if [ $left -lt 20 ]; then
            echo "== $name: not run (the ${budget} s budget is spent)"
            { echo "## $name: not run (GPU_CHECK_BUDGET_S=$budget spent)"; echo; } >> "$out"
            return 1
        fi
        [ $left -ge "$limit" ] || limit=$left
    fi
    echo "== $name"
    # its own session, so that what it leaves running (a profiler's target
    # that outlived the profiler, say) is found and ended before the next
    # step, rather than holding the GPU's memory under it
    setsid timeout -k 10 "$limit" "$@" > "$log/step.txt" 2>&1 &
    local sid=$!
    wait $sid
    rc=$?
    local dt=$(( $(date +%s) - t0 ))
    local stray
    stray=$(pgrep -s "$sid" | tr '\n' ' ')
    if [ -n "$stray" ]; then
        echo "gpu-check: the step left processes running: $stray(killed)" >> "$log/step.txt"
        pkill -KILL -s "$sid"
        sleep 1
    fi
    tail -40 "$log/step.txt"
    [ -z "$keep" ] || cp "$log/step.txt" "$keep/$(printf %02d $nstep)-$(echo "$name" | tr -c 'A-Za-z0-9\n' '-' | cut -c1-60).txt"
    {
        if [ $rc -eq 0 ]; then
            echo "## $name: ok ($dt s)"
        elif [ $rc -eq 124 ]; then
            echo "## $name: FAIL (timed out after $limit s)"
        else
            echo "## $name: FAIL (exit $rc, $dt s)"
        fi
        echo
        echo '```'
        echo "\$ $*"
        tail -60 "$log/step.txt"
        echo '```'
        echo
    } >> "$out"
    [ $rc -eq 0 ] || fails=$((fails + 1))
    return $rc
}

arch=$(echo "$cc" | sed 's/^\([0-9]*\)\.\([0-9]*\)$/\1.\2/')
# (timeout runs programs, not shell functions: the build is one bash -c)
build="bash scripts/setup.sh build >/dev/null &&
       { [ -f '$bdir/build.ninja' ] || meson setup '$bdir' -Dcuda=enabled -Dgpu_arch='$arch'; } &&
       ninja -C '$bdir'"
if [ "${GPU_CHECK_PREBUILT:-0}" = 1 ]; then
    # built elsewhere for this GPU (scripts/gpu-bundle.sh); meson must not
    # rebuild here, where the toolchain and libraries may be missing
    build="[ -x '$bdir/zinc' ] && echo 'prebuilt:' && cat '$bdir/BUNDLE' 2>/dev/null"
    mtest_opts=(--no-rebuild)
else
    mtest_opts=()
fi
step "build for compute capability $arch" 900 bash -c "$build" || {
    echo "gpu-check: the build failed; see $out"
    exit 1
}
zinc="$root/$bdir/zinc"
step "zinc info" 60 "$zinc" info
# nvidia-smi sees a GPU; zinc must too (driver against runtime), or every
# gpu test would skip and look green
step "zinc sees the GPU" 60 bash -c "'$zinc' info --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
print(\"gpus:\", d[\"gpus\"], \"absent reason:\", d.get(\"gpu_absent_reason\"))
sys.exit(0 if d[\"gpus\"] else 1)'"
step "gpu test suite" 600 bash -c "meson test -C '$bdir' ${mtest_opts[*]} --suite gpu --print-errorlogs &&
    ! grep -q '\"result\": \"SKIP\"' '$bdir/meson-logs/testlog.json'"
# the bf16 master's step as the CUDA kernel (zn_dev_adam_sr) inside the
# trainer: the device run's losses and checkpoint files against the cpu
# tier's, bit for bit, with the same GPU computing both
step "bf16 master on the device (master_sr_cli)" 300 meson test -C "$bdir" "${mtest_opts[@]}" master_sr_cli --print-errorlogs
if python3 -c "import torch, transformers; assert torch.cuda.is_available()" 2>/dev/null; then
    step "zinc vs PyTorch on this GPU" 600 python3 scripts/gpu_vs_torch.py "$zinc"
else
    echo "## zinc vs PyTorch: skipped (torch with CUDA, or transformers, does not import)" >> "$out"
    echo >> "$out"
fi
P=zero_optimization.offload_param
O=zero_optimization.offload_optimizer
swap="$log/swap"
common=(--config examples/tiny.json --set train.device=\"cuda\" --set bf16.enabled=true
        --set tiers.gpu=2GiB --set "tiers.nvme=[{\"path\": \"$swap\", \"size\": \"2GiB\"}]"
        --steps 8 --warmup 2)
step "bench train: params and optimizer on the GPU side (optimizer cpu)" 300 "$zinc" bench train \
    "${common[@]}" --set "$P.device=\"none\"" --set "$O.device=\"cpu\""
# the optimizer on the GPU too (zn_dev_adam; no gradient crosses PCIe)
step "bench train: everything on the GPU (optimizer on the GPU)" 300 "$zinc" bench train \
    "${common[@]}" --set "$P.device=\"none\"" --set "$O.device=\"none\""
# LoRA: the frozen base streamed from pinned RAM, the adapters' optimizer on the GPU
step "bench train: LoRA, base in pinned RAM, optimizer on the GPU" 300 "$zinc" bench train \
    "${common[@]}" --set "$P.device=\"cpu\"" --set "$O.device=\"none\"" \
    --set 'lora={"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}'
step "bench train: params and optimizer in pinned RAM" 300 "$zinc" bench train "${common[@]}" \
    --set "$P.device=\"cpu\"" --set "$O.device=\"cpu\""
# the layers' checkpoints in pinned RAM too (their own stream, a ring of 3 on the GPU)
step "bench train: params, optimizer and activation checkpoints in pinned RAM" 300 \
    "$zinc" bench train "${common[@]}" --set "$P.device=\"cpu\"" --set "$O.device=\"cpu\"" \
    --set activation_checkpointing.cpu_checkpointing=true
# the same with fp32 gradients over PCIe (the default above sends bf16)
step "bench train: params and optimizer in pinned RAM, fp32 gradient transfer" 300 \
    "$zinc" bench train "${common[@]}" --set "$P.device=\"cpu\"" --set "$O.device=\"cpu\"" \
    --set train.grad_transfer=\"fp32\"
step "bench train: params and optimizer on NVMe" 300 "$zinc" bench train "${common[@]}" \
    --set "$P.device=\"nvme\"" --set "$P.max_in_cpu=0" --set "$O.device=\"nvme\"" \
    --set zero_optimization.stage=3 --set zero_optimization.stage3_param_persistence_threshold=0 \
    --trace "$log/nvme-trace.json"
# from that run's trace: no compute held behind a pending NVMe read that its
# own data did not need (the marks are events; host functions only signal)
step "trace: no compute stall behind NVMe reads" 60 python3 bench/scripts/trace_stalls.py \
    "$log/nvme-trace.json" --slack-ms 1
step "bench comm: world 1 on the GPU (NCCL)" 300 "$zinc" bench comm --device cuda:0 \
    --sizes 1M..256M
# the arena sized as a user's run sizes it: tiers.gpu "auto" (the GPU's free
# memory after NCCL, cuBLAS and the modules, less the margin)
# (ZINC_LOG=debug: the run logs what it found outside the arena beside what
# the plan counts, and what each stream's cublasCreate took)
step "bench train: params and optimizer in pinned RAM, tiers.gpu auto (full memory)" 300 \
    env ZINC_LOG=debug "$zinc" bench train "${common[@]}" --set tiers.gpu=\"auto\" --set "$P.device=\"cpu\"" \
    --set "$O.device=\"cpu\""
# determinism: the same run twice gives the same losses, bit for bit (the
# kernels and the schedule fix every sum's order)
tcfg=("$root/examples/tiny.json" --set train.device=\"cuda\" --set bf16.enabled=true --set tiers.gpu=2GiB
      --set "tiers.nvme=[{\"path\": \"$swap\", \"size\": \"2GiB\"}]" --set "$P.device=\"cpu\""
      --set "$O.device=\"cpu\"")
step "determinism: two runs, the same losses bit for bit" 600 bash -c "
    cd '$log' && '$zinc' train ${tcfg[*]@Q} --steps 12 --json-log a.jsonl >/dev/null &&
    '$zinc' train ${tcfg[*]@Q} --steps 12 --json-log b.jsonl >/dev/null &&
    python3 -c 'import json; l = lambda f: [json.loads(x)[\"loss_hex\"] for x in open(f)]; a, b = l(\"a.jsonl\"), l(\"b.jsonl\"); print(a); print(b); raise SystemExit(a != b or len(a) != 12)'"
# a checkpoint saved and resumed on the GPU continues as the run that was
# not interrupted (steps 7-12, bit for bit)
step "checkpoint: save at step 6, resume, the same losses as one run" 600 bash -c "
    cd '$log' && rm -rf ck && '$zinc' train ${tcfg[*]@Q} --steps 6 \
        --set train.checkpoint.dir=\\\"ck\\\" >/dev/null &&
    '$zinc' train ${tcfg[*]@Q} --steps 12 --set train.checkpoint.dir=\\\"ck\\\" --resume \
        --json-log r.jsonl >/dev/null &&
    python3 -c 'import json; l = lambda f: [(json.loads(x)[\"step\"], json.loads(x)[\"loss_hex\"]) for x in open(f)]; a = [x for x in l(\"a.jsonl\") if x[0] > 6]; r = l(\"r.jsonl\"); print(a); print(r); raise SystemExit(a != r or not r)'"
# the kernels under compute-sanitizer: out-of-bounds and misaligned
# accesses, shared-memory races, barrier misuse
if command -v compute-sanitizer >/dev/null 2>&1; then
    # (each test from its own folder, as meson runs it: the fixtures'
    # paths are relative to it; timeout runs programs, hence bash -c)
    san="cd '$bdir/tests' && exec compute-sanitizer --error-exitcode 1 --tool"
    for tool in memcheck racecheck synccheck; do
        step "compute-sanitizer $tool: device kernels" 900 \
            bash -c "$san $tool ./test_device_kernels"
    done
    step "compute-sanitizer memcheck: the decoder against PyTorch's fixtures" 900 \
        bash -c "$san memcheck ./test_model_gpu"
    step "compute-sanitizer memcheck: streams, events, flag waits" 120 \
        bash -c "$san memcheck ./test_device"
else
    echo "## compute-sanitizer: not found (it ships with the CUDA toolkit)" >> "$out"
    echo >> "$out"
fi
step "bench pcie" 300 "$zinc" bench pcie --device cuda
# the host's CPU Adam with 8-bit moments on every SIMD path it has: auto
# takes AVX2 on Intel (chosen for the fp32 step, which is memory-bound);
# the 8-bit step is bound by its arithmetic, and on AMD Zen 4 the VBMI path
# ran it 1.6-2.2x the AVX2 one (bench/results/adam-states.md). Whether
# Intel's VBMI path beats its AVX2 gathers decides auto's choice there.
step "bench adam: 8-bit moments on every SIMD path of this host" 300 "$zinc" bench adam \
    --params 256M --states int8 --grad bf16 --copy bf16 --iters 5 --csv "$log/adam-states-host.csv"
# both attentions at the lengths around auto's threshold (GEMM up to 8192
# tokens, the fused kernels beyond): where the fused kernels become the
# faster (or the only affordable) one on this GPU
for seq in 1024 4096 8192 16384; do
    for attn in gemm fused; do
        step "bench model (Qwen2.5-0.5B shape, bf16, seq $seq, $attn attention)" 300 \
            "$zinc" bench model --model tests/fixtures/configs/qwen2.5-0.5b.json \
            --device cuda --batch 1 --seq $seq --iters 3 --attention $attn
    done
done
# the fused attention's kernels under Nsight Compute (its backward was 6x
# the GEMM path's on the first GPU): one layer's step at seq 4096, the
# flash kernels only, the clocks as they are; the arena kept to 16 GiB, as
# ncu saves and restores the memory a kernel may write between its passes
# (with the arena sized to the whole free memory it could not profile)
if command -v ncu >/dev/null 2>&1; then
    step "ncu: the fused attention kernels (seq 4096)" 600 \
        ncu --clock-control none --kernel-name regex:flash --launch-count 6 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        "$zinc" bench model --model tests/fixtures/configs/qwen2.5-0.5b.json \
        --device cuda --batch 1 --seq 4096 --iters 1 --attention fused --gpu-mem 16GiB
fi
# the cost model against measured steps on this GPU (issue 36): the rows
# of bench/scripts/tune_check.sh, each predicted from this machine's
# ceilings (measured first) beside its measured step, and --tune's choice
step "cost model: predicted against measured steps (tune_check)" 900 \
    env TUNE_REPS=1 bash bench/scripts/tune_check.sh "$zinc" "$log/tune-gpu.csv"
# offloaded decoding (issue 33): a Qwen2.5-0.5B-shaped folder (seeded bf16
# values) with every layer streamed from pinned RAM, the KV cache on the
# GPU and then in pinned RAM, against the plan's bound
step "bench generate: 0.5B shape, layers streamed from pinned RAM" 900 bash -c "
    python3 scripts/make_bench_model.py --config tests/fixtures/configs/qwen2.5-0.5b.json \
        --out '$log/gen-0.5b' --dtype bf16 >/dev/null &&
    '$zinc' generate --model '$log/gen-0.5b' --plan --recalibrate --ids 1,2,3 >/dev/null &&
    for kv in device pinned; do
        '$zinc' bench generate --model '$log/gen-0.5b' --dtype bf16 --resident 0 \
            --batches 1,8,32,64 --kv-cache \$kv --csv '$log/generate-gpu.csv' || exit 1
    done"
# two ranks on one GPU through NCCL (torchrun-style variables, two
# processes); NCCL may refuse two ranks on one device: recorded, not failed
if [ -n "${GPU_CHECK_ONLY:-}" ] && ! echo "two NCCL ranks" | grep -qE "$GPU_CHECK_ONLY"; then
    { echo "## two NCCL ranks on one GPU: not selected (GPU_CHECK_ONLY)"; echo; } >> "$out"
elif [ "$budget" -gt 0 ] && [ $(( t_start + budget - $(date +%s) )) -lt 60 ]; then
    { echo "## two NCCL ranks on one GPU: not run (GPU_CHECK_BUDGET_S=$budget spent)"; echo; } >> "$out"
else
{
    echo "## two NCCL ranks on one GPU (informative)"
    echo
    echo '```'
    for r in 0 1; do
        ( cd "$log" && RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 \
          MASTER_ADDR=127.0.0.1 MASTER_PORT=29561 timeout 300 "$zinc" train "${tcfg[@]}" \
          --steps 4 --set "tiers.nvme=[{\"path\": \"$swap.$r\", \"size\": \"2GiB\"}]" \
          > "rank$r.txt" 2>&1; echo "rank $r exit $?" >> "rank$r.txt" ) &
    done
    wait
    tail -n 5 "$log/rank0.txt" "$log/rank1.txt"
    echo '```'
    echo
} >> "$out" 2>&1
fi

{
    echo "---"
    echo "$fails step(s) failed."
} >> "$out"
echo "gpu-check: $fails step(s) failed; results in $out"
[ $fails -eq 0 ]
