#!/usr/bin/env bash
# Adam's moments in fewer bytes through `zinc train` (train.optim), on the
# embedded tiny model with the optimizer in the cpu tier:
#  - adamw_bnb_8bit, adamw_torch_8bit and adamw_bf16 train; after 30 steps
#    the loss is within 2% of the fp32-moment run's (8-bit moments err by up
#    to half a map step, about 1% of a block's absmax; this bound is the
#    issue's); torchao's scheme is not bitsandbytes' under another name
#    (its float32 bias corrections alone move the losses from step 2);
#  - `zinc plan` shows the moments at their size (int8: a quarter of fp32
#    plus the absmax) and the run allocates that (the plan contract);
#  - a checkpoint keeps the 8-bit moments with their absmax: resuming
#    reproduces the uninterrupted run's losses bit for bit;
#  - a checkpoint with fp32 moments resumes into 8-bit ones (converted at
#    load, said so) and one with 8-bit moments into fp32 ones; bitsandbytes'
#    8-bit moments resume into torchao's scheme as they are (the same
#    storage: nothing converted);
#  - with the optimizer on NVMe (the demo's placement) 8-bit and bf16
#    moments are swapped at their size: the losses equal the cpu tier's bit
#    for bit, and the NVMe bytes per step fall; checkpoints of NVMe-homed
#    8-bit moments resume bit for bit on NVMe and in the cpu tier (and a
#    cpu-tier one on NVMe: the same files), and fp32 <-> 8-bit conversions
#    at load work into an NVMe home;
#  - with the optimizer on the device, 8-bit and bf16 moments give the cpu
#    tier's losses bit for bit and its checkpoint files;
#  - an unknown optim name is refused with the names zinc takes.
set -u
zinc=$(realpath "$1")
fail=0
work=$(realpath "$(mktemp -d optim8-cli-XXXXXX)")
trap 'rm -rf "$work"' EXIT
cd "$work"
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
cpu=(--set zero_optimization.offload_optimizer.device=cpu --set train.log_every=100)
last_loss() { tail -1 "$1" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/'; }
# same_state A B WHAT: checkpoint folders A and B hold the same master, m
# and v files
# (the same length and crc32c, each folder verified against its manifest:
# a final save with the optimizer on NVMe keeps the bytes in the swap file
# it links into the folder, tests/ckpt_state.py)
state_sum() { python3 "$(dirname "$(realpath "$0")")/ckpt_state.py" sum "$1" "$2"; }
same_state() {
    local f
    check "'$zinc' export --verify $1 > /dev/null && '$zinc' export --verify $2 > /dev/null" \
        "$3: $1 or $2 does not verify"
    for f in master m v; do
        check "[ \"\$(state_sum $1/rank-0 $f.bin)\" = \"\$(state_sum $2/rank-0 $f.bin)\" ]" \
            "$3: $f.bin differs ($1, $2)"
    done
}
hexes() { sed 's/.*"step": \([0-9]*\),.*"loss_hex": "\([^"]*\)".*/\1 \2/' "$1"; }

# Under a sanitizer (ZINC_TEST_SANITIZED=1, tests/meson.build) these runs
# are 8 steps and the 2% bound, which holds after 30, is left to the plain
# builds: the sanitizer looks for memory errors, which 8 steps reach on
# every code path of the 30 (under ASan the 30-step runs were a third of
# this test's 199 s in stop 66's fresh clone).
long=30
[ "${ZINC_TEST_SANITIZED:-0}" = 1 ] && long=8
"$zinc" train "${cpu[@]}" --steps $long --json-log f32.jsonl > f32.out 2>&1
check "[ $? -eq 0 ]" "fp32 run: $(tail -3 f32.out)"
for o in adamw_bnb_8bit adamw_torch_8bit adamw_bf16; do
    "$zinc" train "${cpu[@]}" --set train.optim=$o --steps $long --json-log $o.jsonl > $o.out 2>&1
    check "[ $? -eq 0 ]" "$o run: $(tail -3 $o.out)"
    a=$(last_loss f32.jsonl) b=$(last_loss $o.jsonl)
    if [ $long -eq 30 ]; then
        check "awk -v a=$a -v b=$b 'BEGIN { d = (b - a) / a; exit !(d < 0.02 && d > -0.02) }'" \
            "$o: loss $b after 30 steps, fp32 moments $a: more than 2% apart"
        echo "$o: loss $b after 30 steps (fp32 moments: $a)"
    else
        echo "$o: loss $b after $long steps (fp32 moments: $a; the 2% bound after 30 is the plain builds')"
    fi
done
check "! diff <(hexes adamw_bnb_8bit.jsonl) <(hexes adamw_torch_8bit.jsonl) > /dev/null" \
    "adamw_torch_8bit trains exactly as adamw_bnb_8bit: torchao's scheme is not in use"
# The tensors bitsandbytes keeps in fp32 (under 4096 elements: the tiny
# model's 9 norms of 256) keep fp32 moments here too, as the run says: the
# checkpoint lists their blocks (f32_runs) and keeps their floats after
# the 8-bit layout, and after one step from zero those floats are the
# fp32-moment run's m and v of the same elements bit for bit (the same
# gradient, the same fp32 step); fp32 moments say nothing of it.
check "grep -q 'int8: 9 of 39 trained tensors (2304 parameters) are under 4096 elements; bitsandbytes and zinc keep their states in fp32' adamw_bnb_8bit.out && ! grep -q 'trained tensors' f32.out adamw_bf16.out" \
    "the small tensors are not reported: $(grep 'trained tensors' adamw_bnb_8bit.out f32.out)"
for o in adamw_bnb_8bit adamw_torch; do
    "$zinc" train "${cpu[@]}" --set train.optim=$o --steps 1 --set train.checkpoint.dir=one-$o \
        --set train.checkpoint.every=1 > one-$o.out 2>&1
    check "[ $? -eq 0 ]" "one step with $o and a checkpoint: $(tail -3 one-$o.out)"
done
python3 - one-adamw_bnb_8bit/step-00000001 one-adamw_torch/step-00000001 > f32blocks.out 2>&1 <<'PY'
import json, sys
q8, f32 = sys.argv[1], sys.argv[2]
man = json.load(open(q8 + "/manifest.json"))
rank = man["ranks"][0]
P, runs = rank["local_params"], rank.get("f32_runs", [])
layout = (P + 63) // 64 * 64 + 4 * ((P + 255) // 256)
bad = 0
for name in ("m", "v"):
    a = open(f"{q8}/rank-0/{name}.bin", "rb").read()
    b = open(f"{f32}/rank-0/{name}.bin", "rb").read()
    for block, n, slot in runs:
        for j in range(n):
            e0 = (block + j) * 256
            ln = min(256, P - e0) * 4
            side = a[layout + (slot + j) * 1024:][:ln]
            bad += side != b[e0 * 4:e0 * 4 + ln]
blocks = sum(n for _, n, _ in runs)
print(f"{len(runs)} runs, {blocks} blocks kept in fp32; {bad} differ from the fp32 run's")
sys.exit(0 if runs and blocks == 9 and not bad else 1)
PY
check "[ $? -eq 0 ]" "the fp32 blocks of 8-bit moments: $(cat f32blocks.out)"
echo "8-bit moments: $(cat f32blocks.out)"

# the plan: int8 moments at a quarter of fp32 plus 4 bytes per 256
"$zinc" train --print-default > tiny.json
"$zinc" plan tiny.json "${cpu[@]}" --set train.optim=adamw_bnb_8bit --detail > plan8.out 2>&1
check "[ $? -eq 0 ]" "plan with int8 moments: $(tail -3 plan8.out)"
check "grep -q 'adam m (int8)' plan8.out" "the plan does not show int8 moments: $(grep adam plan8.out)"

# resume with 8-bit moments: bit for bit
ck=(--set train.checkpoint.dir=ck8 --set train.checkpoint.every=5)
"$zinc" train "${cpu[@]}" --set train.optim=adamw_bnb_8bit --steps 12 --json-log ref8.jsonl \
    > ref8.out 2>&1
"$zinc" train "${cpu[@]}" --set train.optim=adamw_bnb_8bit "${ck[@]}" --steps 5 > s1.out 2>&1
check "[ $? -eq 0 ]" "8-bit run with a checkpoint: $(tail -3 s1.out)"
check "grep -q '\"moments\": \"int8\"' ck8/\$(cat ck8/latest)/manifest.json" "the manifest does not say int8"
"$zinc" train "${cpu[@]}" --set train.optim=adamw_bnb_8bit "${ck[@]}" --resume ck8 --steps 12 \
    --json-log res8.jsonl > r1.out 2>&1
check "[ $? -eq 0 ]" "8-bit resume: $(tail -3 r1.out)"
check "diff <(hexes ref8.jsonl | tail -7) <(hexes res8.jsonl) > /dev/null" \
    "8-bit resume: losses differ from the uninterrupted run"

# fp32 checkpoint -> 8-bit run, and back
"$zinc" train "${cpu[@]}" --set train.checkpoint.dir=ck32 --steps 5 > s2.out 2>&1
"$zinc" train "${cpu[@]}" --set train.optim=adamw_bnb_8bit --resume ck32 --steps 8 > r2.out 2>&1
check "[ $? -eq 0 ]" "fp32 checkpoint into 8-bit moments: $(tail -3 r2.out)"
check "grep -q 'converted at load' r2.out" "the conversion is not said: $(grep -i moment r2.out)"
"$zinc" train "${cpu[@]}" --resume ck8 --steps 8 > r3.out 2>&1
check "[ $? -eq 0 ]" "8-bit checkpoint into fp32 moments: $(tail -3 r3.out)"
"$zinc" train "${cpu[@]}" --set train.optim=adamw_torch_8bit --resume ck8 --steps 8 > r4.out 2>&1
check "[ $? -eq 0 ] && ! grep -q 'converted at load' r4.out" \
    "bitsandbytes' 8-bit checkpoint into torchao's scheme: $(tail -3 r4.out)"

# the optimizer on NVMe (the demo's default placement): the same losses
# as the cpu tier's, fewer NVMe bytes per step (wear: the end report's
# "written per step"), the same checkpoints
nv=(--set train.log_every=100)
wear() { sed -n 's/^nvme wear: \([0-9.]*\) MiB written per step.*/\1/p' "$1"; }
"$zinc" train "${nv[@]}" --steps 12 > nf32.out 2>&1
check "[ $? -eq 0 ]" "fp32 moments on NVMe: $(tail -3 nf32.out)"
for o in adamw_8bit adamw_bf16; do
    "$zinc" train "${nv[@]}" --set train.optim=$o --steps 12 --json-log n$o.jsonl > n$o.out 2>&1
    check "[ $? -eq 0 ]" "$o on NVMe: $(tail -3 n$o.out)"
    "$zinc" train "${cpu[@]}" --set train.optim=$o --steps 12 --json-log c$o.jsonl > c$o.out 2>&1
    check "diff <(hexes n$o.jsonl) <(hexes c$o.jsonl) > /dev/null" \
        "$o: NVMe-homed moments train otherwise than in the cpu tier"
    a=$(wear nf32.out) b=$(wear n$o.out)
    check "[ -n '$a' ] && [ -n '$b' ] && awk -v a='$a' -v b='$b' 'BEGIN { exit !(b < 0.75 * a) }'" \
        "$o on NVMe writes $b MiB per step, fp32 moments $a MiB"
    echo "$o on NVMe: $b MiB written per step (fp32 moments: $a MiB)"
done
# checkpoints at step 5 (named: later runs add their own to the folders)
"$zinc" train "${nv[@]}" --set train.optim=adamw_8bit --steps 12 --json-log nref8.jsonl > nref8.out 2>&1
"$zinc" train "${nv[@]}" --set train.optim=adamw_8bit --set train.checkpoint.dir=nck8 --steps 5 \
    > ns1.out 2>&1
check "[ $? -eq 0 ]" "8-bit moments on NVMe with a checkpoint: $(tail -3 ns1.out)"
"$zinc" train "${cpu[@]}" --set train.optim=adamw_8bit --set train.checkpoint.dir=cck8 --steps 5 \
    > cs1.out 2>&1
# (copies: a resumed run saves into its checkpoint's folder and keeps the
# newest there)
cp -r nck8/step-00000005 n5 && cp -r cck8/step-00000005 c5 && cp -r ck32/step-00000005 f5
n5=n5 c5=c5 f5=f5
same_state $n5 $c5 "8-bit moments at step 5: the NVMe run's checkpoint is not the cpu tier run's"
"$zinc" train "${nv[@]}" --set train.optim=adamw_8bit --resume $n5 --steps 12 \
    --json-log nres8.jsonl > nr1.out 2>&1
check "[ $? -eq 0 ]" "8-bit resume on NVMe: $(tail -3 nr1.out)"
check "diff <(hexes nref8.jsonl | tail -7) <(hexes nres8.jsonl) > /dev/null" \
    "8-bit resume on NVMe: losses differ from the uninterrupted run"
# the cpu tier's checkpoint on NVMe and the NVMe one in the cpu tier: as is
"$zinc" train "${nv[@]}" --set train.optim=adamw_8bit --resume $c5 --steps 12 \
    --json-log nres8c.jsonl > nr2.out 2>&1
check "[ $? -eq 0 ] && diff <(hexes nref8.jsonl | tail -7) <(hexes nres8c.jsonl) > /dev/null" \
    "a cpu-tier 8-bit checkpoint resumed on NVMe: $(tail -2 nr2.out)"
"$zinc" train "${cpu[@]}" --set train.optim=adamw_8bit --resume $n5 --steps 12 \
    --json-log cres8n.jsonl > nr3.out 2>&1
check "[ $? -eq 0 ] && diff <(hexes nref8.jsonl | tail -7) <(hexes cres8n.jsonl) > /dev/null" \
    "an NVMe 8-bit checkpoint resumed in the cpu tier: $(tail -2 nr3.out)"
# conversions at load into an NVMe home: as into the cpu tier (fp32 into
# 8-bit, 8-bit into fp32, 8-bit into bf16)
for conv in "$f5 adamw_8bit 32to8" "$n5 adamw_torch 8to32" "$n5 adamw_bf16 8to16"; do
    read -r ck o tag <<< "$conv"
    "$zinc" train "${nv[@]}" --set train.optim=$o --resume "$ck" --steps 8 \
        --json-log n$tag.jsonl > n$tag.out 2>&1
    check "[ $? -eq 0 ] && grep -q 'converted at load' n$tag.out" \
        "checkpoint into $o moments on NVMe ($tag): $(tail -3 n$tag.out)"
    "$zinc" train "${cpu[@]}" --set train.optim=$o --resume "$ck" --steps 8 \
        --json-log c$tag.jsonl > c$tag.out 2>&1
    check "diff <(hexes n$tag.jsonl) <(hexes c$tag.jsonl) > /dev/null" \
        "checkpoint into $o moments ($tag): NVMe and the cpu tier differ"
done

# bf16 moments on NVMe with a sub-group that is no whole number of 256
# (30001) and the buffers to make it the unit (buffer_count 9): units are
# rounded to 256 elements, so the checkpoint's moments, the units' halves
# back to back, are the cpu tier run's files
"$zinc" train "${nv[@]}" --set train.optim=adamw_bf16 --set zero_optimization.sub_group_size=30001 \
    --set zero_optimization.offload_optimizer.buffer_count=9 --set train.checkpoint.dir=nck16 \
    --steps 5 > n16.out 2>&1
check "[ $? -eq 0 ]" "bf16 moments on NVMe in units of a sub-group of 30001: $(tail -3 n16.out)"
"$zinc" train "${cpu[@]}" --set train.optim=adamw_bf16 --set train.checkpoint.dir=cck16 --steps 5 \
    > c16.out 2>&1
same_state nck16/step-00000005 cck16/step-00000005 \
    "bf16 moments at step 5: the NVMe run's checkpoint is not the cpu tier run's"

# the optimizer on the device (zn_dev_adam_mom, a unit at a time): the
# cpu tier's losses bit for bit, and its checkpoint files
dev=(--set zero_optimization.offload_optimizer.device=none --set train.log_every=100)
for o in adamw_bnb_8bit adamw_bf16; do
    "$zinc" train "${dev[@]}" --set train.optim=$o --steps $long --json-log dev-$o.jsonl > dev-$o.out 2>&1
    check "[ $? -eq 0 ] && diff <(hexes $o.jsonl) <(hexes dev-$o.jsonl) > /dev/null" \
        "$o moments with the optimizer on the device: not the cpu tier's losses: $(tail -3 dev-$o.out)"
done
"$zinc" train "${dev[@]}" --set train.optim=adamw_8bit --set train.checkpoint.dir=dck8 --steps 5 \
    > d8.out 2>&1
check "[ $? -eq 0 ]" "8-bit moments on the device with a checkpoint: $(tail -3 d8.out)"
same_state dck8/step-00000005 $c5 \
    "8-bit moments at step 5: the device run's checkpoint is not the cpu tier run's"

# refusals
"$zinc" train "${cpu[@]}" --set train.optim=adafactor --steps 2 > u.out 2>&1
check "[ $? -ne 0 ] && grep -q 'adamw_bnb_8bit' u.out" "an unknown optim: $(tail -2 u.out)"
[ $fail -eq 0 ] && echo "optim8_cli: ok"
exit $fail
