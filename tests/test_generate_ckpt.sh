#!/usr/bin/env bash
# zinc generate --checkpoint: a training checkpoint read in place gives the
# ids its export gives (fp32 export, fp32 generation: the same values), for
# a full fine-tune and for LoRA (the base from the folder the run recorded,
# the adapters from the checkpoint), streamed or resident; the model really
# changed (the base gives other ids); and what is refused: a --model of
# another shape, a missing checkpoint, a damaged master.bin (crc32c). Also
# `zinc bench generate`, whose streamed and resident runs must agree.
set -u
zinc=$(realpath "$1")
src=$(realpath "$2")
fx="$src/tests/fixtures"
fail=0
work=$(realpath "$(mktemp -d generate-ckpt-XXXXXX)")
trap 'rm -rf "$work"' EXIT
cd "$work"
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
gen() { "$zinc" generate --device host --ids 5,9,40,7 --max-new-tokens 16 --json "$@" 2>/dev/null; }

# a full fine-tune, 6 steps at a learning rate that moves the model
"$zinc" train "$fx/ft-llama/train-config.json" --model "$fx/ft-llama" --data synthetic --steps 6 \
    --set optimizer.params.lr=0.05 --set 'train.checkpoint.dir="ck"' > t.out 2>&1
check "[ $? -eq 0 ]" "training: $(tail -3 t.out)"
"$zinc" export ck --out exp --dtype f32 > e.out 2>&1
check "[ $? -eq 0 ]" "export: $(cat e.out)"
a=$(gen --checkpoint ck); b=$(gen --model exp); c=$(gen --model "$fx/ft-llama")
s=$(gen --checkpoint ck --gpu-mem 1MiB)
check "[ -n \"\$a\" ] && [ \"\$a\" = \"\$b\" ]" "--checkpoint ($a) and its export ($b) differ"
check "[ \"\$a\" != \"\$c\" ]" "the checkpoint generates as the base did: were its weights read?"
check "[ \"\$a\" = \"\$s\" ]" "--checkpoint with a 1 MiB arena ($s) differs from resident ($a)"
mkdir nv
s=$(gen --checkpoint ck --gpu-mem 1MiB --nvme nv)
check "[ \"\$a\" = \"\$s\" ] && [ -z \"\$(ls nv)\" ]" "--nvme: $s (resident: $a), left in nv: $(ls nv)"

# LoRA: the adapters from the checkpoint, the base from the recorded folder
"$zinc" train "$fx/lora-llama/train-config.json" --model "$fx/ft-llama" --data synthetic \
    --steps 6 --set optimizer.params.lr=0.05 --set "lora.adapter=\"$fx/lora-llama/adapter-init\"" \
    --set 'train.checkpoint.dir="lck"' > l.out 2>&1
check "[ $? -eq 0 ]" "LoRA training: $(tail -3 l.out)"
"$zinc" export lck --out lexp --dtype f32 > le.out 2>&1
check "[ $? -eq 0 ]" "LoRA export: $(cat le.out)"
a=$(gen --checkpoint lck); b=$(gen --model "$fx/ft-llama" --adapter lexp)
check "[ -n \"\$a\" ] && [ \"\$a\" = \"\$b\" ]" "LoRA --checkpoint ($a) and base + exported adapter ($b) differ"
check "[ \"\$a\" != \"\$c\" ]" "the LoRA checkpoint generates as the base: were its adapters read?"

# refusals
"$zinc" generate --checkpoint ck --model "$fx/tiny-llama" --ids 5 > r1.out 2>&1
check "[ $? -eq 1 ] && grep -q 'is of another model: hidden 48 in the checkpoint, 64' r1.out" \
      "--model of another shape: $(cat r1.out)"
"$zinc" generate --checkpoint nothing-here --ids 5 > r2.out 2>&1
check "[ $? -eq 1 ] && grep -q 'nothing-here' r2.out" "missing checkpoint: $(cat r2.out)"
m=$(ls ck/step-*/rank-0/master.bin | head -1)
printf '\x7f' | dd of="$m" bs=1 seek=100 conv=notrunc status=none
"$zinc" generate --checkpoint ck --ids 5 > r3.out 2>&1
check "[ $? -eq 1 ] && grep -q 'crc32c' r3.out" "damaged master.bin: $(cat r3.out)"
"$zinc" generate --checkpoint ck --adapter lexp --ids 5 > r4.out 2>&1
check "[ $? -eq 2 ] && grep -q 'a LoRA checkpoint holds its adapters' r4.out" \
      "--adapter with --checkpoint: $(cat r4.out)"
# zinc bench generate on the same machinery: every layer streamed through
# one slot and every weight resident side by side; the bench itself fails
# when their ids differ
"$zinc" bench generate --model "$fx/tiny-llama" --device host --resident 0 --ring 1 \
    --batches 1,3 --prompt-len 6 --new-tokens 8 --csv b.csv > b.out 2>&1
check "[ $? -eq 0 ] && [ \$(grep -c '^\"host' b.csv) -eq 2 ] && grep -q 'ratio' b.out" \
      "bench generate: $(cat b.out)"
# a signal in the middle of a generation whose layers stream from NVMe:
# the swap file goes with the process (8 layers of the embedded model, a
# 12 MiB arena: 7 of them streamed)
"$zinc" train --steps 1 --set model.num_hidden_layers=8 --set 'train.checkpoint.dir="dk"' \
    > dk.out 2>&1 && "$zinc" export dk --out m8 --dtype f32 > dke.out 2>&1
check "[ $? -eq 0 ]" "the 8-layer model: $(tail -2 dk.out) $(cat dke.out)"
for i in $(seq 0 63); do echo "{\"ids\": [$((5 + i)), 6, 7]}"; done > p.jsonl
mkdir sw
"$zinc" generate --model m8 --prompts p.jsonl --out o.jsonl --device host --gpu-mem 12MiB \
    --nvme sw --max-new-tokens 60 --batch-size 4 > sg.out 2>&1 &
pid=$!
for _ in $(seq 1 200); do ls sw | grep -q '^zinc-gen' && break; sleep 0.05; done
had=$(ls sw)
kill -TERM $pid; wait $pid; rc=$?
check "[ -n \"$had\" ] && [ $rc -eq 143 ] && [ -z \"\$(ls sw)\" ]" \
      "SIGTERM during NVMe streaming: exit $rc, swap before: '$had', after: '$(ls sw)' $(tail -2 sg.out)"
# kill -9 leaves the file; the next generate with that folder removes it
"$zinc" generate --model m8 --prompts p.jsonl --out o.jsonl --device host --gpu-mem 12MiB \
    --nvme sw --max-new-tokens 60 --batch-size 4 > sk.out 2>&1 &
pid=$!
for _ in $(seq 1 200); do ls sw | grep -q '^zinc-gen' && break; sleep 0.05; done
had=$(ls sw)
kill -9 $pid; wait $pid 2>/dev/null
"$zinc" generate --model m8 --ids 5,6,7 --device host --nvme sw --max-new-tokens 2 > sn.out 2>&1
check "[ -n \"$had\" ] && [ -z \"\$(ls sw)\" ] && grep -q 'which is gone' sn.out" \
      "after kill -9: swap before '$had', after the next run '$(ls sw)': $(cat sn.out)"
exit $fail
