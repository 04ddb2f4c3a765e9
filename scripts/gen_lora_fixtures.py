#!/usr/bin/env python3
"""Generates the LoRA fixtures in tests/fixtures/lora-*: PEFT training LoRA
adapters on a frozen transformers model for 10 AdamW steps, which zinc must
reproduce from the same base folder and the same initial adapter
(tests/test_train_hf.c).

  lora-llama  base ../ft-llama (bf16 on disk), r 4, alpha 8, all-linear
              (q, k, v, o, gate, up, down)
  lora-qwen2  base ../ft-qwen2 (fp16, two shards, q/k/v bias), r 2,
              alpha 5, rslora, q_proj + v_proj + down_proj
Both start from init_lora_weights=False (lora_B random, not PEFT's zeros),
so that the gradients of both adapter matrices matter from the first step.
Each folder holds adapter-init/ (PEFT's save_pretrained before training),
train-config.json (the zinc config: DeepSpeed keys, model.path of the base,
the lora section with lora.adapter = adapter-init), train-reference.json
(every step's ids, targets, loss, lr, gradient norm before clipping; the
schema of the ft-* fixtures) and final-adapter/ (after the 10 steps).

PyTorch runs in fp32 on the CPU with eager attention on the base's stored
values widened to fp32, dropout 0; the optimizer, schedule, clipping and
accumulation are gen_train_fixtures.py's, over the adapters only.

  --check-export DIR --fixture NAME  loads the fixture's base with the PEFT
      adapter in DIR (zinc export's output), prints step 1's loss under PEFT
      and each adapter tensor's largest difference from final-adapter/.

Usage: python3 scripts/gen_lora_fixtures.py [--out tests/fixtures]
Needs torch, transformers and peft (scripts/requirements-fixtures.txt). CI
never runs this.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import ensure_torch  # noqa: E402
from gen_train_fixtures import ACCUM, MICRO, SEQ, train, zinc_config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FIXTURES = {
    "llama": dict(base="ft-llama", r=4, alpha=8, targets="all-linear", rslora=False, seed=31,
                  data_seed=41),
    "qwen2": dict(base="ft-qwen2", r=2, alpha=5, targets=["q_proj", "v_proj", "down_proj"],
                  rslora=True, seed=32, data_seed=42),
}


def load_base(out, spec, torch, transformers):
    base = os.path.join(out, spec["base"])
    model = transformers.AutoModelForCausalLM.from_pretrained(
        base, dtype=torch.float32, attn_implementation="eager")
    return base, model


def make(kind, out, torch, transformers, peft):
    spec = FIXTURES[kind]
    base, model = load_base(out, spec, torch, transformers)
    torch.manual_seed(spec["seed"])
    lc = peft.LoraConfig(r=spec["r"], lora_alpha=spec["alpha"], lora_dropout=0.0,
                         target_modules=spec["targets"], bias="none",
                         use_rslora=spec["rslora"], init_lora_weights=False,
                         task_type="CAUSAL_LM")
    pm = peft.get_peft_model(model, lc)
    d = os.path.join(out, "lora-" + kind)
    os.makedirs(d, exist_ok=True)
    pm.save_pretrained(os.path.join(d, "adapter-init"))
    params = [p for p in pm.parameters() if p.requires_grad]
    assert all(p.dtype == torch.float32 for p in params)
    dgen = torch.Generator().manual_seed(spec["data_seed"])
    steps = train(pm, params, model.config.vocab_size, dgen, "lora-" + kind, torch)
    pm.save_pretrained(os.path.join(d, "final-adapter"))
    for sub in ("adapter-init", "final-adapter"):  # peft's model-card template
        readme = os.path.join(d, sub, "README.md")
        if os.path.exists(readme):
            os.remove(readme)
    zcfg = zinc_config("tests/test_train_hf.c trains LoRA adapters on model.path for 10 "
                       "steps with this; made by scripts/gen_lora_fixtures.py",
                       "../" + spec["base"])
    zcfg["lora"] = {"r": spec["r"], "lora_alpha": spec["alpha"], "lora_dropout": 0.0,
                    "target_modules": spec["targets"], "bias": "none",
                    "use_rslora": spec["rslora"], "adapter": "adapter-init"}
    with open(os.path.join(d, "train-config.json"), "w") as f:
        json.dump(zcfg, f, indent=2)
    ref = {
        "generator": "scripts/gen_lora_fixtures.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "precision": "float32, eager attention, CPU; adapters fp32, base frozen",
        "weights_dtype": {"llama": "bf16", "qwen2": "f16"}[kind],
        "micro_batch": MICRO, "accumulation": ACCUM, "seq_len": SEQ,
        "steps": steps,
    }
    with open(os.path.join(d, "train-reference.json"), "w") as f:
        json.dump(ref, f, indent=1)


def check_export(adapter, kind, out, torch, transformers, peft):
    from safetensors.torch import load_file
    spec = FIXTURES[kind]
    _, model = load_base(out, spec, torch, transformers)
    pm = peft.PeftModel.from_pretrained(model, adapter)
    d = os.path.join(out, "lora-" + kind)
    with open(os.path.join(d, "train-reference.json")) as f:
        st = json.load(f)["steps"][0]
    x = torch.tensor(st["ids"]).reshape(ACCUM * MICRO, SEQ)
    y = torch.tensor(st["targets"]).reshape(ACCUM * MICRO, SEQ)
    with torch.no_grad():
        logits = pm(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1), ignore_index=-100)
    print("peft loss of step 1's batch with %s: %.9f" % (adapter, loss.item()))
    mine = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    ref = load_file(os.path.join(d, "final-adapter", "adapter_model.safetensors"))
    assert set(mine) == set(ref), "tensor names differ: %s" % (set(mine) ^ set(ref))
    worst = max((mine[k].float() - ref[k].float()).abs().max().item() for k in ref)
    print("largest difference from final-adapter/: %.3e over %d tensors" % (worst, len(ref)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures"))
    ap.add_argument("--check-export", metavar="DIR")
    ap.add_argument("--fixture", choices=sorted(FIXTURES), default="llama")
    a = ap.parse_args()
    ensure_torch()
    import torch
    import peft
    import transformers
    if a.check_export:
        check_export(a.check_export, a.fixture, a.out, torch, transformers, peft)
        return
    for kind in FIXTURES:
        make(kind, a.out, torch, transformers, peft)


if __name__ == "__main__":
    main()
