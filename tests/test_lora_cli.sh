#!/usr/bin/env bash
# LoRA from the command line: `zinc train` with a lora section on a
# transformers-saved base (the header's PEFT-style trainable line), a
# checkpoint, `zinc export` of it as a PEFT adapter folder whose tensors
# equal the checkpoint's adapters, `--merge` into a full model that zinc
# eval loads, resume, `zinc plan` counting only the adapters' optimizer
# state, dropout's masks (reproducible from lora.seed, another seed draws
# others), and what is refused (an lm_head target, an adapter folder that
# disagrees with the section, a malformed adapter_config.json, a merge onto
# another model), each naming the key or file.
set -u
zinc=$(realpath "$1")
src=$(realpath "$2")
fx="$src/tests/fixtures"
fail=0
work=$(realpath "$(mktemp -d lora-cli-XXXXXX)")
trap 'rm -rf "$work"' EXIT
cd "$work"

check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
cfg="$fx/lora-llama/train-config.json"
base=(--model "$fx/ft-llama" --data synthetic --set "lora.adapter=\"$fx/lora-llama/adapter-init\""
      --set 'zero_optimization.offload_param.device="nvme"'
      --set 'zero_optimization.offload_optimizer.device="nvme"'
      --set 'zero_optimization.stage3_param_persistence_threshold=0'
      --set 'tiers.nvme="swap"' --set tiers.create_nvme_path=true)

"$zinc" train "$cfg" "${base[@]}" --steps 3 --set train.checkpoint.dir=\"ck\" > t.out 2> t.err
rc=$?; check "[ \$rc -eq 0 ]" "LoRA training failed: $(cat t.err)"
check "grep -q 'lora     r 4, alpha 8, q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj; trainable params: 8448 || all params: 77136' t.out" \
      "header: $(grep lora t.out)"
check "grep -q 'adapters 42 adapter tensors from' t.out" "adapter source: $(grep lora t.out)"
# a step folder records its adapters' shape (lora_config.json) but is no
# PEFT adapter: no adapter_config.json that PeftModel.from_pretrained would
# take for one and then miss adapter_model.safetensors (`zinc export` makes it)
stepdir=$(ls -d ck/step-* 2>/dev/null | tail -1)
check "[ -n '$stepdir' ] && [ -f '$stepdir/lora_config.json' ] && [ ! -e '$stepdir/adapter_config.json' ]" \
      "step folder $stepdir: $(ls "$stepdir" 2>&1 | tr '\n' ' ')"

"$zinc" export ck --out adapter > e.out 2>&1
rc=$?; check "[ \$rc -eq 0 ] && [ -f adapter/adapter_config.json ] && [ -f adapter/adapter_model.safetensors ]" \
      "export: $(cat e.out)"
check "grep -q '\"peft_type\": \"LORA\"' adapter/adapter_config.json && grep -q '\"r\": 4' adapter/adapter_config.json" \
      "adapter_config.json: $(cat adapter/adapter_config.json)"
check "grep -q 'base_model.model.model.layers.2.mlp.down_proj.lora_B.weight' adapter/adapter_model.safetensors" \
      "PEFT tensor names missing"
check "! grep -q 'model.layers.0.mlp.down_proj.weight\"' adapter/adapter_model.safetensors" \
      "the frozen base leaked into the adapter"
# --merge: a full HF folder (the base's config and types) that zinc eval loads
"$zinc" export ck --merge --out merged > m.out 2>&1
rc=$?; check "[ \$rc -eq 0 ] && [ -f merged/config.json ] && [ -f merged/model.safetensors.index.json ]" \
      "export --merge: $(cat m.out)"
check "grep -q 'merged, the base' m.out" "export --merge: $(cat m.out)"
"$zinc" eval --model merged --data synthetic --seq-len 16 --batches 2 > me.out 2>&1
rc=$?; check "[ \$rc -eq 0 ] && grep -q perplexity me.out" "eval of the merged model: $(cat me.out)"
"$zinc" export ck --base "$fx/ft-llama" --out x > mb.out 2>&1
rc=$?; check "[ \$rc -eq 2 ] && grep -q -- '--base only goes with --merge' mb.out" "--base alone: $(cat mb.out)"
"$zinc" export ck --merge --base "$fx/ft-qwen2" --out y > mq.out 2>&1
rc=$?; check "[ \$rc -eq 1 ] && grep -q 'is not the model the adapters were trained on' mq.out" \
      "--merge onto another model: $(cat mq.out)"
# resume (the base read again from the folder), and a run from the exported adapter
"$zinc" train "$cfg" "${base[@]}" --steps 5 --set train.checkpoint.dir=\"ck\" --resume latest \
    > r.out 2> r.err
rc=$?; check "[ \$rc -eq 0 ] && grep -q 'resumed from' r.out && grep -q 'adapters from the checkpoint' r.out" \
      "resume: $(cat r.err) $(grep -E 'resumed|lora' r.out)"
"$zinc" train "$cfg" "${base[@]}" --steps 4 --set "lora.adapter=\"adapter\"" > a.out 2> a.err
rc=$?; check "[ \$rc -eq 0 ]" "training from the exported adapter: $(cat a.err)"
rm -rf swap

"$zinc" plan "$cfg" "${base[@]}" > p.out 2>&1
rc=$?; check "[ \$rc -eq 0 ] && grep -q 'lora         r 4, alpha 8: trainable 8448 of 77136' p.out" \
      "plan: $(grep -E 'lora|error' p.out)"

# dropout: the header says so; one seed gives one run (the masks are a
# function of lora.seed and the micro-batch), another seed another, and
# no dropout a third (step 1 is the same for all: PEFT's init has B = 0)
losses() { grep -o '"loss_hex": "[^"]*"' "$1" | tr '\n' ' '; }
for run in a:5:0.1 b:5:0.1 c:6:0.1 d:5:0; do
    IFS=: read -r n seed p <<< "$run"
    "$zinc" train "$cfg" --model "$fx/ft-llama" --data synthetic --steps 3 --set lora.adapter=\"\" \
        --set lora.seed=$seed --set lora.lora_dropout=$p --json-log "drop-$n.jsonl" \
        > "drop-$n.out" 2>&1
    rc=$?; check "[ \$rc -eq 0 ]" "dropout run $n: $(tail -3 drop-$n.out)"
done
check "grep -q 'lora     r 4, alpha 8, dropout 0.1, q_proj' drop-a.out" "dropout header: $(grep lora drop-a.out)"
check "[ \"\$(losses drop-a.jsonl)\" = \"\$(losses drop-b.jsonl)\" ]" "one seed, two runs: different losses"
check "[ \"\$(losses drop-a.jsonl)\" != \"\$(losses drop-c.jsonl)\" ]" "another lora.seed drew the same masks"
check "[ \"\$(losses drop-a.jsonl)\" != \"\$(losses drop-d.jsonl)\" ]" "dropout 0.1 trained as dropout 0"

# refused, with the key or file named
refuse() {
    local name=$1; shift
    local want=$1; shift
    "$zinc" train "$cfg" --model "$fx/ft-llama" --data synthetic --steps 1 "$@" > "$name.out" 2> "$name.err"
    local rc=$?
    check "[ $rc -eq 1 ] && grep -qF -- \"$want\" $name.err" \
          "$name: rc $rc, wanted '$want' in: $(cat "$name.err")"
}
refuse lm_head "lora.target_modules: [1] = " \
    --set lora.adapter=\"\" --set 'lora.target_modules=["q_proj","lm_head"]'
refuse disagree "lora.r is 8 but the adapter in" \
    --set "lora.adapter=\"$fx/lora-llama/adapter-init\"" --set lora.r=8
mkdir bad && echo '{"peft_type": "LORA", "r": "four"}' > bad/adapter_config.json
refuse badcfg "bad/adapter_config.json: r must be an integer" --set lora.adapter=\"bad\"
refuse noadapter "adapter_config.json: no such file" --set lora.adapter=\"$work\"
exit $fail
