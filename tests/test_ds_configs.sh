#!/usr/bin/env bash
# Real DeepSpeed configs, kept byte for byte in tests/fixtures/ds-configs/
# (sources in the README there), plan unchanged with only zinc's own sections
# added (the model, by --set); one with a typo is refused with the suggestion,
# and every problem of a file is reported in one run.
set -u
zinc=$1
src=$2
dir=$src/tests/fixtures/ds-configs
model=$src/tests/fixtures/tiny-qwen2
pass=0 fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

n=0
for f in "$dir"/*.json; do
    n=$((n + 1))
    out=$("$zinc" plan "$f" --set model.path="$model" --data synthetic 2>&1)
    rc=$?
    if [ "$rc" -ne 0 ] || ! grep -q "^fits\.$" <<<"$out" || ! grep -q "effective config" <<<"$out"; then
        echo "FAIL: $(basename "$f"): exit $rc"; echo "$out" | grep -v "warn:" | head -8
        fail=$((fail + 1))
    else
        pass=$((pass + 1))
    fi
done
if [ "$n" -lt 15 ]; then
    echo "FAIL: only $n configs under $dir (want >= 15)"; fail=$((fail + 1))
fi

# A real typo stays refused, with the suggestion; both typos in one run.
sed -e 's/"stage3_prefetch_bucket_size"/"stage3_prefetch_bucket_sise"/' \
    -e 's/"overlap_comm"/"overlap_com"/' \
    "$dir/llamafactory-ds_z3_offload_config.json" > "$tmp/typo.json"
out=$("$zinc" plan "$tmp/typo.json" --set model.path="$model" --data synthetic 2>&1)
rc=$?
if [ "$rc" -ne 1 ] ||
   ! grep -q "2 errors" <<<"$out" ||
   ! grep -q "zero_optimization.stage3_prefetch_bucket_sise: unknown key (did you mean 'stage3_prefetch_bucket_size'?)" <<<"$out" ||
   ! grep -q "zero_optimization.overlap_com: unknown key (did you mean 'overlap_comm'?)" <<<"$out"; then
    echo "FAIL: typo config: exit $rc"; echo "$out" | head -8; fail=$((fail + 1))
else
    pass=$((pass + 1))
fi

# A key that would change what is computed stays an error.
out=$("$zinc" plan "$dir/axolotl-zero1.json" --set model.path="$model" --data synthetic \
      --set compile.enabled=true 2>&1)
if [ $? -ne 1 ] || ! grep -q "compile: DeepSpeed's compile is not implemented" <<<"$out"; then
    echo "FAIL: compile enabled accepted"; echo "$out" | head -5; fail=$((fail + 1))
else
    pass=$((pass + 1))
fi

# Diagnostics and tuning keys plan with one note each, saying what zinc does
# instead: LLaMA-Factory's partial offload with the flops profiler on, and
# its hparam sweep's ZeRO-3 module grouping (16).
out=$("$zinc" plan "$dir/llamafactory-ca7359c-ds_z3_partial_offload_config.json" \
      --set model.path="$model" --data synthetic 2>&1)
rc=$?
if [ "$rc" -ne 0 ] || ! grep -q "^fits\.$" <<<"$out" ||
   [ "$(grep -c "flops_profiler: switched on (enabled) is accepted (it changes no number of the training): DeepSpeed's flops profiler is not run; zinc train prints the achieved TFLOP/s" <<<"$out")" -ne 1 ] ||
   [ "$(grep -c "is accepted" <<<"$out")" -ne 1 ]; then
    echo "FAIL: flops_profiler on: exit $rc"; grep -v "^  " <<<"$out" | head -8; fail=$((fail + 1))
else
    pass=$((pass + 1))
fi
out=$("$zinc" plan "$dir/llamafactory-5851f9f-ds_z3_e6_modgran_16.json" \
      --set model.path="$model" --data synthetic 2>&1)
rc=$?
if [ "$rc" -ne 0 ] || ! grep -q "^fits\.$" <<<"$out" ||
   [ "$(grep -c "zero_optimization.stage3_module_granularity_threshold: 16 is accepted (it changes no number of the training)" <<<"$out")" -ne 1 ]; then
    echo "FAIL: stage3_module_granularity_threshold 16: exit $rc"; grep -v "^  " <<<"$out" | head -8
    fail=$((fail + 1))
else
    pass=$((pass + 1))
fi
# ... while a key that changes the numbers stays an error, in the same file
out=$("$zinc" plan "$dir/llamafactory-5851f9f-ds_z3_e6_modgran_16.json" \
      --set model.path="$model" --data synthetic \
      --set zero_optimization.zero_quantized_gradients=true 2>&1)
if [ $? -ne 1 ] ||
   ! grep -q "zero_optimization.zero_quantized_gradients: DeepSpeed's zero_quantized_gradients is not implemented by zinc" <<<"$out"; then
    echo "FAIL: zero_quantized_gradients accepted"; echo "$out" | head -5; fail=$((fail + 1))
else
    pass=$((pass + 1))
fi

# Provenance: "auto" and --set are told apart, train.* feeds "auto".
out=$("$zinc" plan "$dir/transformers-ds_config_zero2.json" --set model.path="$model" --data synthetic \
      --set train.learning_rate=2e-5 --set zero_optimization.reduce_bucket_size=1000 2>&1)
if ! grep -qE "lr 2e-05 \[auto: train.learning_rate\]" <<<"$out" ||
   ! grep -qE "reduce 1000 \[--set\]" <<<"$out" ||
   ! grep -qE "warmup 0 steps \(log\) \[auto: train.warmup_steps\]" <<<"$out"; then
    echo "FAIL: provenance"; echo "$out" | head -12; fail=$((fail + 1))
else
    pass=$((pass + 1))
fi

# --print-config: the resolved JSON alone on stdout, no "auto" left in
# DeepSpeed's keys (zinc's own tiers keep theirs: resolved at run time).
out=$("$zinc" plan "$dir/qwen2.5-sft-ds_config_zero3.json" --set model.path="$model" --data synthetic \
      --print-config 2>/dev/null | sed -n '/^{/,/^}/p')
if ! python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); [d.pop(k) for k in ("tiers", "train", "model", "data")]; assert "auto" not in json.dumps(d); assert d["zero_optimization"]["reduce_bucket_size"] == 64*64; assert d["optimizer"]["params"]["lr"] == 5e-5' <<<"$out"; then
    echo "FAIL: --print-config not resolved JSON"; echo "$out" | head -5; fail=$((fail + 1))
else
    pass=$((pass + 1))
fi

# planned here for a GPU run (a login node, a laptop): bf16 "auto" resolves
# for the CUDA device the config names, not for this machine (issue 36)
out=$("$zinc" plan "$dir/qwen2.5-sft-ds_config_zero3.json" --set model.path="$model" --data synthetic \
      --set train.device=\"cuda\" 2>&1)
if ! grep -q "precision  bf16 params" <<<"$out"; then
    echo "FAIL: planned for cuda, precision: $(grep precision <<<"$out")"; fail=$((fail + 1))
else
    pass=$((pass + 1))
fi

echo "ds-configs: $pass passed, $fail failed ($n configs)"
[ "$fail" -eq 0 ]
