#!/usr/bin/env bash
# `zinc train --model DIR` from the command line: a transformers-saved folder
# trains from its weights (the header says so), `zinc plan --model` plans it,
# and hostile folders (a missing shard, a truncated shard, an index naming a
# file that is not there, a tensor of the wrong shape, a missing tensor, an
# unexpected tensor, a folder without weights) are each refused with the
# tensor or file named, exit 1, before the swap space is even created.
set -u
zinc=$(realpath "$1")
src=$(realpath "$2")
fx="$src/tests/fixtures"
fail=0
work=$(realpath "$(mktemp -d train-hf-cli-XXXXXX)")
trap 'rm -rf "$work"' EXIT
cd "$work"

check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }
nvme=(--set 'zero_optimization.offload_param.device="nvme"'
      --set 'zero_optimization.offload_optimizer.device="nvme"'
      --set 'zero_optimization.stage3_param_persistence_threshold=0'
      --set 'tiers.nvme="swap"' --set tiers.create_nvme_path=true)

# a model folder without data is refused by train and plan alike (it would
# train the user's model on synthetic tokens), naming how to ask for them
"$zinc" train "$fx/ft-llama/train-config.json" --model "$fx/ft-llama" "${nvme[@]}" --steps 1 \
    > nodata.out 2>&1
rc=$?; check "[ \$rc -eq 1 ] && grep -q 'data.path is not set' nodata.out && grep -q -- '--data synthetic' nodata.out" \
      "train without data: exit $rc, $(tail -1 nodata.out)"
"$zinc" plan "$fx/ft-llama/train-config.json" --model "$fx/ft-llama" > nodata-plan.out 2>&1
rc=$?; check "[ \$rc -eq 1 ] && grep -q 'data.path is not set' nodata-plan.out" \
      "plan without data: exit $rc, $(tail -1 nodata-plan.out)"
# a truncated safetensors file: plan refuses it as train does, before "fits."
cp -r "$fx/ft-llama" trunc
truncate -s -1000 trunc/model.safetensors
"$zinc" plan "$fx/ft-llama/train-config.json" --model trunc --data synthetic > trunc.out 2>&1
rc=$?; check "[ \$rc -eq 1 ] && grep -q 'file truncated' trunc.out && ! grep -q 'fits' trunc.out" \
      "plan of a truncated safetensors: exit $rc, $(tail -1 trunc.out)"
# a token file of a bigger vocabulary than the model's
printf 'ZNTOKENS' > big.tok
python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<IIQII', 1, 2, 4, 50000, 0) + struct.pack('<4H', 1, 2, 3, 4))" >> big.tok
"$zinc" plan "$fx/ft-llama/train-config.json" --model "$fx/ft-llama" --data big.tok > big.out 2>&1
rc=$?; check "[ \$rc -eq 1 ] && grep -q '50000-token vocabulary' big.out" \
      "plan with another vocabulary's tokens: exit $rc, $(tail -1 big.out)"
"$zinc" train "$fx/ft-llama/train-config.json" --model "$fx/ft-llama" --data synthetic "${nvme[@]}" --steps 2 \
    > ok.out 2> ok.err
rc=$?; check "[ \$rc -eq 0 ]" "training ft-llama failed: $(cat ok.err)"
check "grep -q '^  swap     swap\$' ok.out" "header does not name the swap folder: $(grep swap ok.out)"
# a swap folder reached through a symbolic link: followed, and the header says so
mkdir -p realswap && ln -s realswap swaplink
"$zinc" train "$fx/ft-llama/train-config.json" --model "$fx/ft-llama" --data synthetic "${nvme[@]}" \
    --set 'tiers.nvme="swaplink"' --steps 1 > link.out 2> link.err
rc=$?; check "[ \$rc -eq 0 ] && grep -q '^  swap     swaplink -> $work/realswap (a symbolic link)' link.out" \
      "swap through a symlink: exit $rc, $(grep swap link.out) $(tail -1 link.err)"
check "[ -z \"\$(ls -A realswap)\" ]" "swap files left behind in the symlinked folder: $(ls realswap)"
rm -rf realswap swaplink
check "grep -q 'weights  30 tensors from $fx/ft-llama, bf16' ok.out" \
      "header does not say where the weights came from: $(grep weights ok.out)"
"$zinc" train "$fx/ft-llama/train-config.json" --model "$fx/ft-llama" --data synthetic --set model.init=\"random\" \
    --steps 1 > rnd.out 2>&1
check "grep -q 'weights  random init, seed' rnd.out" "model.init=random: $(grep weights rnd.out)"
"$zinc" plan "$fx/ft-llama/train-config.json" --model "$fx/ft-qwen2" --data synthetic > plan.out 2>&1
rc=$?; check "[ \$rc -eq 0 ] && grep -q 'qwen2' plan.out" "zinc plan --model: $(cat plan.out)"
rm -rf swap

# refused: refuse CASE DIR WANT...; every WANT must be in the error
refuse() {
    local name=$1 dir=$2; shift 2
    "$zinc" train "$fx/ft-llama/train-config.json" --model "$dir" --data synthetic "${nvme[@]}" --steps 1 \
        > "$name.out" 2> "$name.err"
    local rc=$?
    check "[ $rc -eq 1 ]" "$name: exit $rc, expected 1: $(cat "$name.err")"
    for w in "$@"; do
        check "grep -qF -- '$w' '$name.err'" "$name: error lacks '$w': $(cat "$name.err")"
    done
    check "[ ! -e swap ]" "$name: the swap space was created"
    rm -rf swap
}

cp -r "$fx/ft-qwen2" noshard && rm noshard/model-00002-of-00002.safetensors
refuse missing-shard noshard "model-00002-of-00002.safetensors" "No such file"

cp -r "$fx/ft-llama" trunc && truncate -s -1000 trunc/model.safetensors
refuse truncated trunc "trunc/model.safetensors" "truncated"

cp -r "$fx/ft-qwen2" badindex
sed -i '0,/model-00002-of-00002/s//model-00003-of-00002/' badindex/model.safetensors.index.json
refuse bad-index badindex "model-00003-of-00002.safetensors"

cp -r "$fx/ft-llama" shape && sed -i 's/"intermediate_size": 80/"intermediate_size": 96/' shape/config.json
refuse wrong-shape shape "model.layers.0.mlp.gate_proj.weight" "shape [80, 48]" "[96, 48]"

cp -r "$fx/ft-llama" more && sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 4/' more/config.json
refuse missing-tensor more "model.layers.3." "missing"

cp -r "$fx/ft-llama" fewer && sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 2/' fewer/config.json
refuse unexpected-tensor fewer "model.layers.2." "not a parameter"

mkdir nowt && cp "$fx/ft-llama/config.json" nowt/
refuse no-weights nowt "has no weights" "model.init=random"

# a vocabulary the trainer streams in row parts (ft-vocab: four parts each
# for the embedding and lm_head): a checkpoint written per part exports the
# model's tensors whole and in place. With lr 0 the export must be the
# folder's own weights: `zinc eval` gives the same loss to the last bit.
"$zinc" train "$fx/ft-vocab/train-config.json" --model "$fx/ft-vocab" --data synthetic --steps 2 \
    --set 'optimizer.params.lr=0' --set 'scheduler.params.warmup_max_lr=0' \
    --set 'train.checkpoint.dir="vck"' > vocab.out 2> vocab.err
rc=$?; check "[ \$rc -eq 0 ]" "training ft-vocab failed: $(cat vocab.err)"
"$zinc" export vck --out vhf --dtype fp32 > export.out 2>&1
rc=$?; check "[ \$rc -eq 0 ]" "export of the ft-vocab checkpoint failed: $(cat export.out)"
ev() { "$zinc" eval --model "$1" --data synthetic --seq-len 12 --batches 4 --device host --json \
       | sed -n 's/.*"loss": *\([-0-9.e+]*\).*/\1/p'; }
lz=$(ev vhf); lt=$(ev "$fx/ft-vocab")
check "[ -n '$lz' ] && [ '$lz' = '$lt' ]" "ft-vocab export at lr 0: eval loss $lz, the folder's $lt"
echo "ft-vocab: exported checkpoint eval $lz, the folder's own weights $lt"
# the plain export of a model from an HF folder keeps what makes the folder a
# runnable model: its config.json's own keys (eos ids, rope settings) with the
# export's dtype, its tokenizer and chat template, its generation_config.json
cp -r "$fx/ft-vocab" withtok
python3 - <<'PY'
import json
c = json.load(open("withtok/config.json"))
c["eos_token_id"] = 7
c["bos_token_id"] = 5
json.dump(c, open("withtok/config.json", "w"), indent=2)
json.dump({"eos_token_id": 7, "bos_token_id": 5, "max_new_tokens": 32},
          open("withtok/generation_config.json", "w"))
json.dump({"version": "1.0", "model": {"type": "BPE"}}, open("withtok/tokenizer.json", "w"))
json.dump({"chat_template": "{{ messages }}", "eos_token": "<eos>"},
          open("withtok/tokenizer_config.json", "w"))
PY
"$zinc" train "$fx/ft-vocab/train-config.json" --model withtok --data synthetic --steps 1 \
    --set 'train.checkpoint.dir="tck"' > tok.out 2>&1
rc=$?; check "[ \$rc -eq 0 ]" "training withtok failed: $(tail -3 tok.out)"
"$zinc" export tck --out thf --dtype bf16 > texport.out 2>&1
rc=$?; check "[ \$rc -eq 0 ]" "export of withtok failed: $(cat texport.out)"
check "cmp -s withtok/tokenizer.json thf/tokenizer.json && cmp -s withtok/tokenizer_config.json thf/tokenizer_config.json && cmp -s withtok/generation_config.json thf/generation_config.json" \
      "the plain export lacks the folder's tokenizer or generation_config: $(ls thf)"
check "python3 -c \"import json,sys; c = json.load(open('thf/config.json')); sys.exit(not (c['eos_token_id'] == 7 and c['torch_dtype'] == 'bfloat16'))\"" \
      "the export's config.json: $(cat thf/config.json | head -c 300)"
# and a run resumed from a checkpoint of its parts continues bit for bit
vt=("$fx/ft-vocab/train-config.json" --model "$fx/ft-vocab" --data synthetic "${nvme[@]}")
"$zinc" train "${vt[@]}" --steps 4 --json-log v4.jsonl > v4.out 2>&1
rc=$?; check "[ \$rc -eq 0 ]" "ft-vocab 4 steps failed: $(tail -3 v4.out)"
rm -rf swap
"$zinc" train "${vt[@]}" --steps 2 --set 'train.checkpoint.dir="vck2"' > v2.out 2>&1
rc=$?; check "[ \$rc -eq 0 ]" "ft-vocab 2 steps failed: $(tail -3 v2.out)"
rm -rf swap
"$zinc" train "${vt[@]}" --resume vck2 --steps 4 --json-log vr.jsonl > vr.out 2>&1
rc=$?; check "[ \$rc -eq 0 ]" "ft-vocab resume failed: $(tail -3 vr.out)"
hex() { grep "\"step\": $2," "$1" | sed 's/.*"loss_hex": "\([^"]*\)".*/\1/'; }
for st in 3 4; do
    a=$(hex v4.jsonl $st); b=$(hex vr.jsonl $st)
    check "[ -n '$a' ] && [ '$a' = '$b' ]" "ft-vocab resumed step $st: loss $b, uninterrupted $a"
done

if [ $fail -ne 0 ]; then
    echo "train_hf_cli: FAILED"
    exit 1
fi
echo "train_hf_cli: ok"
