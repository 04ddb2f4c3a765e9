#!/usr/bin/env bash
# The bf16 master with stochastic rounding through `zinc train`
# (train.master_weights bf16_sr), on the embedded tiny model with the
# optimizer in the cpu tier:
#  - it trains: the loss falls over 30 steps, alone and with 8-bit moments;
#  - the same losses bit for bit with ZINC_SIMD avx512, avx2 and scalar
#    (the rounding bits are a hash of the seed, the step and the element,
#    not a stream a path or thread draws from);
#  - `zinc plan` names the master's format and counts it at 2 bytes;
#  - a checkpoint stores the bf16 master (2 bytes per parameter, "master":
#    "bf16" in the manifest) and resuming reproduces the uninterrupted
#    run's losses bit for bit;
#  - an fp32-master checkpoint resumes into a bf16_sr run (rounded to
#    nearest, said so) and a bf16_sr one into an fp32 run (widened, said
#    so), and `zinc export` reads a bf16 master (a model, and LoRA adapters
#    as PEFT);
#  - with the optimizer on NVMe (units swapped with a 2-byte master): the
#    cpu tier's losses and checkpoint files bit for bit, fewer bytes
#    written per step, resume and conversions at load;
#  - with the optimizer on the device: the same, against the cpu tier;
#  - on 2 ranks, full (stages 3 and 2) and LoRA: one rank's losses with
#    the same global batch bit for bit, and the 2-rank checkpoint's master
#    exported as the one-rank checkpoint's, byte for byte
#    (test_train_ranks.sh and test_train_elastic.sh cover 3 ranks and
#    resumes across world sizes);
#  - refusals: a value not allowed.
set -u
zinc=$(realpath "$1")
. "$(dirname "$(realpath "$0")")/ranks.sh"   # free_port, run2
fail=0
work=$(realpath "$(mktemp -d master-sr-cli-XXXXXX)")
trap 'rm -rf "$work"' EXIT
cd "$work"
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
cpu=(--set zero_optimization.offload_optimizer.device=cpu --set train.log_every=100)
sr=(--set train.master_weights=bf16_sr)
hexes() { sed 's/.*"step": \([0-9]*\),.*"loss_hex": "\([^"]*\)".*/\1 \2/' "$1"; }
loss_at() { sed -n "s/.*\"step\": $2,.*\"loss\": \([0-9.e+-]*\).*/\1/p" "$1"; }
# mean loss of steps [a, b]
mean_loss() {
    sed 's/.*"step": \([0-9]*\),.*"loss": \([0-9.e+-]*\).*/\1 \2/' "$1" |
        awk -v a="$2" -v b="$3" '$1 >= a && $1 <= b { s += $2; n++ } END { printf "%.6f", s / n }'
}

# it trains: the mean loss of steps 26-30 is below that of steps 1-5 (the
# fp32 master's run falls from 5.82 to about 5.16 on this data; a master
# that stopped moving, as round to nearest would make it for updates under
# half a bf16 ulp, would leave it near 5.8)
# (under a sanitizer, ZINC_TEST_SANITIZED=1, the runs are 8 steps and
# whether they train is the plain builds' check: the sanitizer looks for
# memory errors, which 8 steps reach on every code path of the 30)
long=30
[ "${ZINC_TEST_SANITIZED:-0}" = 1 ] && long=8
"$zinc" train "${cpu[@]}" --steps $long --json-log f32.jsonl > f32.out 2>&1
check "[ $? -eq 0 ]" "fp32 master run: $(tail -3 f32.out)"
for o in adamw_torch adamw_bnb_8bit; do
    "$zinc" train "${cpu[@]}" "${sr[@]}" --set train.optim=$o --steps $long --json-log sr-$o.jsonl \
        > sr-$o.out 2>&1
    check "[ $? -eq 0 ]" "bf16_sr with $o: $(tail -3 sr-$o.out)"
    [ $long -eq 30 ] || { echo "bf16_sr with $o: $long steps (whether it trains: the plain builds')"; continue; }
    a=$(mean_loss sr-$o.jsonl 1 5) b=$(mean_loss sr-$o.jsonl 26 30)
    check "awk -v a=$a -v b=$b 'BEGIN { exit !(b < a - 0.3) }'" \
        "bf16_sr with $o: mean loss $a over steps 1-5, $b over 26-30: it does not train"
    echo "bf16_sr with $o: loss $(loss_at sr-$o.jsonl 30) at step 30 (fp32 master:" \
         "$(loss_at f32.jsonl 30)); mean of steps 1-5 $a, of 26-30 $b"
done
check "grep -q 'master bf16 with stochastic rounding' sr-adamw_torch.out" \
    "the run does not say its master format: $(grep -m1 moments sr-adamw_torch.out)"

# the same bits on every SIMD path (at the suite's OMP_NUM_THREADS: the
# host backend's gradients depend on the thread count whatever the master;
# the step's independence of it is test_adam_sr's)
for path in avx512 avx2 scalar; do
    ZINC_SIMD=$path "$zinc" train "${cpu[@]}" "${sr[@]}" --steps 8 \
        --json-log p-$path.jsonl > p-$path.out 2>&1
    check "[ $? -eq 0 ]" "bf16_sr with ZINC_SIMD=$path: $(tail -3 p-$path.out)"
    if grep -q "ZINC_SIMD=$path: this" p-$path.out; then
        echo "note: $path not on this CPU: its run took another path"
    fi
    check "diff <(hexes sr-adamw_torch.jsonl | head -8) <(hexes p-$path.jsonl) > /dev/null" \
        "bf16_sr with ZINC_SIMD=$path: losses differ from the first run's"
done

# the plan names the master and counts 2 bytes
"$zinc" train --print-default > tiny.json
"$zinc" plan tiny.json "${cpu[@]}" "${sr[@]}" > plan.out 2>&1
check "[ $? -eq 0 ]" "plan with bf16_sr: $(tail -3 plan.out)"
check "grep -q 'master (bf16 sr)' plan.out && grep -q 'master 2 B (bf16, stochastic rounding' plan.out" \
    "the plan does not report the bf16 master: $(grep -i master plan.out)"
"$zinc" plan tiny.json "${cpu[@]}" > plan32.out 2>&1
# the master row's size (the cpu column: the gpu one is "-" here)
m16=$(grep '^master (bf16 sr)' plan.out | grep -o '[0-9.]* [KMG]iB' | head -1)
m32=$(grep '^master (fp32)' plan32.out | grep -o '[0-9.]* [KMG]iB' | head -1)
check "[ -n '$m16' ] && [ -n '$m32' ]" "no master row in the plans: '$m16' '$m32'"
check "awk -v a='${m16% *}' -v b='${m32% *}' 'BEGIN { exit !(a * 2 > b * 0.99 && a * 2 < b * 1.01) }'" \
    "the plan's bf16 master ($m16) is not half the fp32 one ($m32)"
echo "plan: master in the cpu tier $m16 with bf16_sr, $m32 with fp32"

state_sum() { python3 "$(dirname "$(realpath "$0")")/ckpt_state.py" sum "$1" "$2"; }
# resume: bit for bit; the checkpoint holds 2 bytes per parameter
ck=(--set train.checkpoint.dir=cksr --set train.checkpoint.every=5)
"$zinc" train "${cpu[@]}" "${sr[@]}" --steps 12 --json-log ref.jsonl > ref.out 2>&1
"$zinc" train "${cpu[@]}" "${sr[@]}" "${ck[@]}" --steps 5 > s1.out 2>&1
check "[ $? -eq 0 ]" "bf16_sr run with a checkpoint: $(tail -3 s1.out)"
c5=cksr/step-00000005
check "grep -q '\"master\": \"bf16\"' $c5/manifest.json" "the manifest does not say bf16"
mb=$(stat -c %s $c5/rank-0/master.bin) gb=$(stat -c %s $c5/rank-0/m.bin)
check "[ $((mb * 2)) -eq $gb ]" "master.bin has $mb bytes, m.bin (fp32) $gb: not 2 bytes per parameter"
cp -r $c5 sr5
"$zinc" train "${cpu[@]}" "${sr[@]}" "${ck[@]}" --resume cksr --steps 12 --json-log res.jsonl \
    > r1.out 2>&1
check "[ $? -eq 0 ]" "bf16_sr resume: $(tail -3 r1.out)"
check "diff <(hexes ref.jsonl | tail -7) <(hexes res.jsonl) > /dev/null" \
    "bf16_sr resume: losses differ from the uninterrupted run"

# fp32 master checkpoint -> bf16_sr run (rounded), and back (widened)
"$zinc" train "${cpu[@]}" --set train.checkpoint.dir=ck32 --steps 5 > s2.out 2>&1
cp -r ck32/step-00000005 f5
"$zinc" train "${cpu[@]}" "${sr[@]}" --resume ck32 --steps 8 --json-log r2.jsonl > r2.out 2>&1
check "[ $? -eq 0 ] && grep -q 'rounded to nearest even at load' r2.out" \
    "fp32 master checkpoint into bf16_sr: $(tail -3 r2.out)"
# (explicit: a resumed run takes the checkpoint's recorded config otherwise)
"$zinc" train "${cpu[@]}" --set train.master_weights=fp32 --resume sr5 --steps 8 \
    --json-log r3.jsonl > r3.out 2>&1
check "[ $? -eq 0 ] && grep -q 'widened (exact) at load' r3.out" \
    "bf16 master checkpoint into an fp32 run: $(tail -3 r3.out)"
# the widened master is the bf16 one: step 6 of the fp32 run resumed from
# it and of the bf16_sr run resumed from it see the same weights
check "[ \"\$(hexes r3.jsonl | head -1)\" = \"\$(hexes res.jsonl | head -1)\" ]" \
    "step 6 after widening the bf16 master differs from the bf16_sr resume's"
"$zinc" export sr5 --out exported --dtype fp32 > ex.out 2>&1
check "[ $? -eq 0 ]" "export of a bf16 master: $(tail -3 ex.out)"
# LoRA adapters on a frozen base with a bf16 master, exported as PEFT
"$zinc" train "${cpu[@]}" "${sr[@]}" --set train.checkpoint.dir=lck --steps 3 \
    --set 'lora={"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}' > lora.out 2>&1
check "[ $? -eq 0 ]" "bf16_sr with LoRA adapters: $(tail -3 lora.out)"
"$zinc" export lck --out lex > lex.out 2>&1
check "[ $? -eq 0 ] && [ -s lex/adapter_model.safetensors ]" \
    "PEFT export of a bf16 master: $(tail -3 lex.out)"

# Another optimizer home against the cpu tier: the losses, the checkpoint
# files bit for bit, resume, and the conversions at load as there.
# like_cpu_tier TAG WHERE ARGS... (files TAG*)
like_cpu_tier() {
    local t=$1 where=$2 f
    shift 2
    "$zinc" train "$@" "${sr[@]}" --steps 12 --json-log ${t}ref.jsonl > ${t}ref.out 2>&1
    check "[ $? -eq 0 ] && diff <(hexes ref.jsonl) <(hexes ${t}ref.jsonl) > /dev/null" \
        "bf16_sr $where: not the cpu tier's losses: $(tail -3 ${t}ref.out)"
    "$zinc" train "$@" "${sr[@]}" --set train.checkpoint.dir=${t}ck --steps 5 > ${t}s1.out 2>&1
    check "[ $? -eq 0 ]" "bf16_sr $where with a checkpoint: $(tail -3 ${t}s1.out)"
    # (the same length and crc32c, the folder verified: a final save with
    # the optimizer on NVMe keeps the bytes in place, tests/ckpt_state.py)
    check "'$zinc' export --verify ${t}ck/step-00000005 > /dev/null" \
        "bf16_sr at step 5 $where: the checkpoint does not verify"
    for f in master m v; do
        check "[ \"\$(state_sum ${t}ck/step-00000005/rank-0 $f.bin)\" = \"\$(state_sum sr5/rank-0 $f.bin)\" ]" \
            "bf16_sr at step 5 $where: $f.bin is not the cpu tier run's"
    done
    "$zinc" train "$@" "${sr[@]}" --resume sr5 --steps 12 --json-log ${t}res.jsonl \
        > ${t}r1.out 2>&1
    check "[ $? -eq 0 ] && diff <(hexes ref.jsonl | tail -7) <(hexes ${t}res.jsonl) > /dev/null" \
        "bf16_sr resumed $where: losses differ from the uninterrupted run: $(tail -2 ${t}r1.out)"
    "$zinc" train "$@" "${sr[@]}" --resume f5 --steps 8 --json-log ${t}r2.jsonl > ${t}r2.out 2>&1
    check "[ $? -eq 0 ] && grep -q 'rounded to nearest even at load' ${t}r2.out && \
           diff <(hexes r2.jsonl) <(hexes ${t}r2.jsonl) > /dev/null" \
        "fp32 master checkpoint into bf16_sr $where: not as in the cpu tier: $(tail -2 ${t}r2.out)"
    "$zinc" train "$@" --set train.master_weights=fp32 --resume sr5 --steps 8 \
        --json-log ${t}r3.jsonl > ${t}r3.out 2>&1
    check "[ $? -eq 0 ] && grep -q 'widened (exact) at load' ${t}r3.out && \
           diff <(hexes r3.jsonl) <(hexes ${t}r3.jsonl) > /dev/null" \
        "bf16 master checkpoint into an fp32 master $where: not as in the cpu tier: $(tail -2 ${t}r3.out)"
}

# the optimizer on NVMe (the demo's placement): each unit's bf16 master
# swapped at 2 bytes per element, fewer bytes written per step
nv=(--set train.log_every=100)
wear() { sed -n 's/^nvme wear: \([0-9.]*\) MiB written per step.*/\1/p' "$1"; }
"$zinc" train "${nv[@]}" --steps 3 > nf32.out 2>&1
like_cpu_tier n "on NVMe" "${nv[@]}"
a=$(wear nf32.out) b=$(wear nref.out)
check "[ -n '$a' ] && [ -n '$b' ] && awk -v a='$a' -v b='$b' 'BEGIN { exit !(b < a) }'" \
    "bf16_sr on NVMe writes $b MiB per step, the fp32 master $a MiB"
echo "bf16_sr on NVMe: $b MiB written per step (fp32 master: $a MiB)"

# the optimizer on the device (zn_dev_adam_sr; the host backend runs the
# CPU's step, a GPU its kernel, checked against it by gpu-check), with
# 8-bit moments too, and the plan puts the master there
# (a gpu tier room for the fp32 master the last conversion loads, and on a
# GPU for the streams' 212 MiB outside the arena, which the plan counts)
dv=(--set zero_optimization.offload_optimizer.device=none --set tiers.gpu=320MiB
    --set train.log_every=100)
like_cpu_tier d "with the optimizer on the device" "${dv[@]}"
"$zinc" train "${dv[@]}" "${sr[@]}" --set train.optim=adamw_bnb_8bit --steps 8 \
    --json-log d8.jsonl > d8.out 2>&1
check "[ $? -eq 0 ] && diff <(hexes sr-adamw_bnb_8bit.jsonl | head -8) <(hexes d8.jsonl) > /dev/null" \
    "bf16_sr and 8-bit moments on the device: not the cpu tier's losses: $(tail -3 d8.out)"
"$zinc" plan tiny.json "${dv[@]}" "${sr[@]}" > dplan.out 2>&1
check "[ $? -eq 0 ] && grep -q '^master (bf16 sr) *[0-9.]* [KMG]iB' dplan.out" \
    "the plan does not put the bf16 master on the device: $(grep -i master dplan.out)"

# On 2 ranks (torchrun-style, TCP): each rank steps its shards, drawing an
# element's bits for its index in the model, so the run is one rank's that
# accumulates the same 2 micro-batches bit for bit (each gradient element
# the same two-term fp32 sum: a + b = b + a; test_train_ranks.sh derives
# why 3 ranks are not), in the cpu tier at stage 3 and at stage 2 (whose
# params every rank holds whole: each rounds the others' shards at the
# start as their owners do) and with LoRA adapters (whose indices skip the
# frozen base) on NVMe, and with the optimizer on the device (the indices
# in device memory for zn_dev_adam_sr); the checkpoints' bf16 masters,
# exported from 2 ranks' shares and from one rank's, are the same bytes.
lora=(--set 'lora={"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}')
# NCCL takes one GPU per rank: where a build with CUDA sees exactly one, two
# ranks would share it and NCCL refuses them ("Duplicate GPU detected"), so
# both sides of this comparison run on the host backend there (as in CI)
ngpu=$("$zinc" info --json 2>/dev/null | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["gpus"]))' 2>/dev/null || echo 0)
on=()
if [ "$ngpu" = 1 ]; then
    on=(--set train.device=\"host\")
    echo "2 ranks: on the host backend (this machine has one GPU; NCCL takes one per rank)"
fi
for kind in cpu s2 lora dev; do
    case $kind in
    cpu) k=("${cpu[@]}") out=model-00001-of-00001.safetensors ;;
    dev) k=("${dv[@]}") out=model-00001-of-00001.safetensors ;;
    s2) k=("${cpu[@]}" --set zero_optimization.stage=2
           --set 'zero_optimization.offload_param.device="none"')
        out=model-00001-of-00001.safetensors ;;
    lora) k=("${nv[@]}" "${lora[@]}") out=adapter_model.safetensors ;;
    esac
    k+=("${sr[@]}" --steps 6 --set train.threads=1 "${on[@]}")
    OMP_NUM_THREADS=1 "$zinc" train "${k[@]}" --set gradient_accumulation_steps=2 \
        --set train.checkpoint.dir=w1-$kind --json-log w1-$kind.jsonl > w1-$kind.out 2>&1
    check "[ $? -eq 0 ]" "bf16_sr ($kind) on one rank, accumulation 2: $(tail -3 w1-$kind.out)"
    OMP_NUM_THREADS=1 run2 w2-$kind "${k[@]}" --set train.checkpoint.dir=w2-$kind
    check "[ $? -eq 0 ]" "bf16_sr ($kind) on 2 ranks: $(grep -h error w2-$kind.r*.out | head -2)"
    check "[ -s w2-$kind.jsonl ] && diff <(hexes w1-$kind.jsonl) <(hexes w2-$kind.jsonl) > /dev/null" \
        "bf16_sr ($kind) on 2 ranks: not one rank's losses bit for bit"
    "$zinc" export w1-$kind --out x1-$kind > x1-$kind.out 2>&1 &&
        "$zinc" export w2-$kind --out x2-$kind > x2-$kind.out 2>&1
    check "[ $? -eq 0 ] && cmp -s x1-$kind/$out x2-$kind/$out" \
        "bf16_sr ($kind): the 2-rank checkpoint's export is not the one-rank one's: $(tail -2 x2-$kind.out)"
done

# refusals
"$zinc" train "${cpu[@]}" --set train.master_weights=bf16 --steps 2 > u.out 2>&1
check "[ $? -ne 0 ] && grep -q 'fp32|bf16_sr' u.out" "an unknown master format: $(tail -2 u.out)"
[ $fail -eq 0 ] && echo "master_sr_cli: ok"
exit $fail
