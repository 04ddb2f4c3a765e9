#!/usr/bin/env bash
# The cost model (issue 36): the traffic the plan counts for one step is the
# traffic the run moves, in every placement; `zinc train` prints the
# prediction beside the measured step; `zinc plan --tune` ranks candidates
# that all fit and writes a config `zinc plan` accepts; --target plans a
# public ZeRO-3 config with "auto" precision in bf16 for an A10 from a
# machine without a GPU; the schedule's cost per block use is among the
# ceilings and counted for every block use. No timing is asserted: times on a shared machine
# are the benchmark's business (bench/results/tune.md).
set -u
zinc=$(realpath "$1")
src=$2
pass=0 fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
mkdir -p swap
# a cache of the machine's ceilings of its own: measured by this build now
export ZINC_CACHE_DIR=$tmp/cache
ok() { pass=$((pass + 1)); }
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

# 1. Planned and measured bytes per step, per link. h2d, nvme read and
# write are counted from the layout and must agree to 1% (the reads differ
# only by O_DIRECT's padding of a unit's tail to the 4 KiB sector: < 1% at
# these unit sizes). d2h includes the embedding's row-sparse gradient, whose
# planned row count is the expectation for uniform ids: 176 of 320 rows for
# 256 tokens, with a standard deviation of sqrt(V e^-l (1 - (1 + l) e^-l))
# = 5.2 rows at l = 256/320; 4 sd of the embedding's share of d2h (< 40% of
# it) bounds d2h's error by 0.4 x 4 x 5.2 / 176 < 5%.
base=(--config "$src/examples/tiny.json" --steps 2 --warmup 1
      --set 'tiers.nvme=[{"path":"swap","size":"256MiB"}]' --set tiers.gpu=256MiB
      --set tiers.param_cache=0)
placements=(
  "zero_optimization.offload_param.device=cpu zero_optimization.offload_optimizer.device=cpu"
  "zero_optimization.offload_param.device=cpu zero_optimization.offload_optimizer.device=nvme"
  "zero_optimization.offload_param.device=nvme zero_optimization.offload_param.max_in_cpu=0 zero_optimization.offload_optimizer.device=nvme tiers.grads=nvme"
  "zero_optimization.offload_param.device=none zero_optimization.offload_optimizer.device=none"
  "zero_optimization.offload_param.device=cpu zero_optimization.offload_optimizer.device=cpu activation_checkpointing.cpu_checkpointing=true gradient_accumulation_steps=2"
)
for p in "${placements[@]}"; do
    sets=()
    for kv in $p; do sets+=(--set "$kv"); done
    out=$("$zinc" bench train "${base[@]}" "${sets[@]}" 2>&1)
    # the schedule's term counts every block's forward and backward in each
    # micro-batch: tiny.json streams 6 blocks (embedding, 4 layers, head),
    # micro-batches 1 (12 uses) or 2 (24 uses, the last placement)
    uses=12
    [[ $p == *gradient_accumulation_steps=2* ]] && uses=24
    if ! grep -qE "^  schedule overhead +[0-9.]+ ms +- \($uses block uses\)" <<<"$out"; then
        bad "bench train [$p]: no schedule overhead line of $uses block uses"
        grep -E "schedule|^predicted" <<<"$out"
    else
        ok
    fi
    line=$(grep "^# traffic per step" <<<"$out")
    if [ -z "$line" ]; then
        bad "bench train [$p]: no traffic line"; echo "$out" | tail -5; continue
    fi
    if ! python3 - "$line" <<'EOF'
import re, sys
pairs = re.findall(r"(h2d|d2h|nvme read|nvme write) ([0-9.]+) / ([0-9.]+) MB", sys.argv[1])
bound = {"h2d": 0.01, "d2h": 0.05, "nvme read": 0.01, "nvme write": 0.01}
bad = [f"{k}: planned {p} measured {m}" for k, p, m in pairs
       if abs(float(p) - float(m)) > bound[k] * max(float(m), 0.01)]
sys.exit(print("; ".join(bad)) or 1 if bad else 0)
EOF
    then
        bad "bench train [$p]: planned traffic is not the measured one: $line"
    else
        ok
    fi
done

# 2. zinc train prints the prediction beside the measured step.
out=$("$zinc" train "$src/examples/tiny.json" --data synthetic --set train.steps=3 \
      --set 'tiers.nvme=[{"path":"swap","size":"256MiB"}]' 2>&1)
if grep -qE "^predicted step time [0-9.]+ s \(bound: [a-z0-9 +]+\), measured [0-9.]+ s" <<<"$out"; then
    ok
else
    bad "train: no prediction line"; echo "$out" | tail -12
fi

# the disk's figures (the optimizer on NVMe, as tiny.json ships): each
# direction, the two at once, and the engine's CPU time per byte, which on
# the host backend's shared cores the step pays (a crc32c of every byte:
# never 0)
if grep -qE "^  disk on the cores +[0-9.]+ ms" <<<"$out" &&
   python3 - "$ZINC_CACHE_DIR/ceilings.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
disks = [v for k in m for kk, v in m[k].items() if kk.startswith("disk ")]
need = ("read_bps", "write_bps", "mixed_bps", "read_cpu_s_per_byte", "write_cpu_s_per_byte")
sys.exit(0 if disks and all(d.get(k, 0) > 0 for d in disks for k in need) else 1)
EOF
then
    ok
else
    bad "train: the disk's mixed rate or CPU time per byte is not measured"
    grep -E "^  disk|^predicted" <<<"$out"
fi

# the memory and Adam probes measure memory, not the cache: their arrays
# together are at least four times the last-level cache `zinc info`
# reports (the Adam probe's p, g, m and v: 16 bytes an element)
llc=$("$zinc" info --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["cpu"]["last_level_cache"])')
if python3 - "$ZINC_CACHE_DIR/ceilings.json" "$llc" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
llc = int(sys.argv[2])
links = [v["link"] for v in m.values() if isinstance(v, dict) and "link" in v]
ok = links and llc > 0 and all(l["mem_probe_bytes"] >= min(4 * llc, 4 << 30) and
                               l["adam_probe_params"] * 16 >= min(4 * llc, 4 << 30) for l in links)
sys.exit(0 if ok else 1)
EOF
then
    ok
else
    bad "the memory probes are not 4x the last-level cache ($llc bytes): $(grep -oE '"(mem_probe_bytes|adam_probe_params)[^,]*' "$ZINC_CACHE_DIR/ceilings.json")"
fi

# 3. --tune: every candidate shown fits; the written config plans and fits,
# and says where each chosen value came from.
out=$("$zinc" plan "$src/examples/tiny.json" --tune --write chosen.json \
      --set 'tiers.nvme=[{"path":"swap","size":"256MiB"}]' 2>&1)
rc=$?
if [ "$rc" -ne 0 ] || ! grep -qE "^  1 +[0-9.]+ s" <<<"$out" || ! grep -q "^wrote chosen.json" <<<"$out"; then
    bad "plan --tune: exit $rc"; echo "$out" | tail -12
elif ! "$zinc" plan chosen.json --set 'tiers.nvme=[{"path":"swap","size":"256MiB"}]' 2>&1 | grep -q "^fits\.$"; then
    bad "the config --tune wrote does not fit"
elif ! python3 -c 'import json; d = json.load(open("chosen.json")); t = d["_tune"]; assert t["predicted_step_s"] > 0 and t["by"] == "zinc plan --tune"'; then
    bad "chosen.json has no _tune provenance"
else
    ok
fi
# the ranking is by predicted step: the rows' times never decrease
if python3 - "$out" <<'EOF'
import re, sys
t = [float(x) for x in re.findall(r"^  \d+ +([0-9.]+) s", sys.argv[1], re.M)]
sys.exit(0 if t and t == sorted(t) else 1)
EOF
then ok; else bad "plan --tune rows not sorted by step time"; fi
# the machine's figures include the schedule's cost per block use, measured
# by the calibration (kept with the others, refreshed with them)
if grep -qE "^cost model: measured on this machine \(.*; schedule [0-9]+ us per block use\)" <<<"$out"; then
    ok
else
    bad "plan --tune: the schedule's per-block-use figure is not among the ceilings"
fi
# --write without --tune, an unknown target: usage errors
"$zinc" plan "$src/examples/tiny.json" --write x.json >/dev/null 2>&1
[ $? -eq 2 ] && ok || bad "--write without --tune not refused"
"$zinc" plan "$src/examples/tiny.json" --target a100x >/dev/null 2>err.txt
if [ $? -eq 2 ] && grep -q "a10, h100, h200" err.txt; then ok; else bad "unknown --target"; fi

# 4. A public ZeRO-3 config with "auto" precision, planned for an A10 from
# this machine (no GPU): bf16, the A10's 24 GB, a predicted step.
cfgs=$src/tests/fixtures/ds-configs
mkdir -p q7 && cp "$src/tests/fixtures/configs/qwen2.5-7b.json" q7/config.json
out=$("$zinc" plan "$cfgs/qwen2.5-sft-ds_config_zero3.json" --target a10 \
      --set model.path=q7 --set model.init=random --data synthetic \
      --set tiers.cpu=128GiB --set 'tiers.nvme=[{"path":"swap","size":"2TiB"}]' 2>&1)
if grep -q "precision  bf16 params" <<<"$out" && grep -qE "^  1 +[0-9.]+ s" <<<"$out" &&
   grep -q "schedule 20 us per block use (an estimate" <<<"$out"; then
    ok
else
    bad "--target a10: not bf16 or no prediction"; echo "$out" | grep -E "precision|error|^  1" | head
fi

echo "tune: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
