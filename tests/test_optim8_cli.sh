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
#  - train.optim with the optimizer on NVMe, and an unknown optim name, are
#    refused with the setting to change.
set -u
zinc=$(realpath "$1")
fail=0
work=$(realpath "$(mktemp -d optim8-cli-XXXXXX)")
trap 'rm -rf "$work"' EXIT
cd "$work"
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
cpu=(--set zero_optimization.offload_optimizer.device=cpu --set train.log_every=100)
last_loss() { tail -1 "$1" | sed 's/.*"loss": \([0-9.e+-]*\).*/\1/'; }
hexes() { sed 's/.*"step": \([0-9]*\),.*"loss_hex": "\([^"]*\)".*/\1 \2/' "$1"; }

"$zinc" train "${cpu[@]}" --steps 30 --json-log f32.jsonl > f32.out 2>&1
check "[ $? -eq 0 ]" "fp32 run: $(tail -3 f32.out)"
for o in adamw_bnb_8bit adamw_torch_8bit adamw_bf16; do
    "$zinc" train "${cpu[@]}" --set train.optim=$o --steps 30 --json-log $o.jsonl > $o.out 2>&1
    check "[ $? -eq 0 ]" "$o run: $(tail -3 $o.out)"
    a=$(last_loss f32.jsonl) b=$(last_loss $o.jsonl)
    check "awk -v a=$a -v b=$b 'BEGIN { d = (b - a) / a; exit !(d < 0.02 && d > -0.02) }'" \
        "$o: loss $b after 30 steps, fp32 moments $a: more than 2% apart"
    echo "$o: loss $b after 30 steps (fp32 moments: $a)"
done
check "! diff <(hexes adamw_bnb_8bit.jsonl) <(hexes adamw_torch_8bit.jsonl) > /dev/null" \
    "adamw_torch_8bit trains exactly as adamw_bnb_8bit: torchao's scheme is not in use"

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

# refusals
"$zinc" train --set train.optim=adamw_8bit --steps 2 > n.out 2>&1
check "[ $? -eq 1 ] && grep -q 'offload_optimizer.device' n.out" \
    "8-bit moments on NVMe not refused clearly: $(tail -2 n.out)"
"$zinc" train "${cpu[@]}" --set train.optim=adafactor --steps 2 > u.out 2>&1
check "[ $? -ne 0 ] && grep -q 'adamw_bnb_8bit' u.out" "an unknown optim: $(tail -2 u.out)"
[ $fail -eq 0 ] && echo "optim8_cli: ok"
exit $fail
