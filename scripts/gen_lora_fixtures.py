#!/usr/bin/env python3
"""Generates the LoRA fixtures in tests/fixtures/lora-*: PEFT training LoRA
adapters on a frozen transformers model for 10 AdamW steps, which zinc must
reproduce from the same base folder and the same initial adapter
(tests/test_train_hf.c).

  lora-llama  base ../ft-llama (bf16 on disk), r 4, alpha 8, all-linear
              (peft expands it to q, k, v, o, gate, up, down; never lm_head:
              checked here), scaling alpha / r = 2
  lora-qwen2  base ../ft-qwen2 (fp16, two shards, q/k/v bias), r 2,
              alpha 5, rslora (scaling alpha / sqrt(r) = 3.5355),
              q_proj + v_proj + down_proj
  lora-qwen3  base ../ft-qwen3 (bf16, per-head q/k norm), r 4, alpha 8,
              the seven projections by name: the q and k adapters feed
              the q/k norm
  lora-mistral  base ../ft-mistral (sliding_window 5 over 12 tokens), r 4,
              alpha 8, the seven projections
  lora-gemma2  base ../ft-gemma2 (four norms, soft-capped scores and logits,
              a 5-key window on alternate layers), r 4, alpha 8, the seven
              projections: o's and down's adapters before the post-norms
  lora-gemma3  base ../ft-gemma3 (per-head q/k norm, two RoPE bases, the
              window on 2 of 3 layers), r 4, alpha 8, the seven projections:
              q's and k's adapters before the q/k norm
  lora-olmo3  base ../ft-olmo3 (the window on 2 of 3 layers, YaRN on the
              third), r 4, alpha 8, the seven projections
  lora-qwen3moe  base ../ft-qwen3moe (8 experts, 2 a token, a dense layer),
              r 4, alpha 8, q_proj + k_proj + v_proj + o_proj (zinc builds no
              adapters on the experts yet), under the routing
  lora-phi3   base ../ft-phi3 (bf16, fused qkv_proj and gate_up_proj), r 4,
              alpha 8, qkv_proj + o_proj + gate_up_proj + down_proj: the
              adapters of the fused projections span q | k | v and gate | up
  lora-dropout base ../ft-llama, r 4, alpha 16, q/k/o/up/down, lora_dropout
              0.2 with zinc's masks: torch's dropout RNG cannot be
              reproduced in C, so each LoRA module's nn.Dropout is replaced
              by ZincDropout, which draws zinc's counter-based mask
              (zinc_keep, from lora.seed 7, the micro-batch, the layer and
              the target) and scales by 1/(1-p) in fp32 as torch does;
Both start from init_lora_weights=False (lora_B random, not PEFT's zeros:
nn.Linear's default init, uniform within 1/sqrt(fan_in), for A and B), so
that the gradients of both adapter matrices matter from the first step.
Each folder holds adapter-init/ (PEFT's save_pretrained before training),
train-config.json (the zinc config: DeepSpeed keys, model.path of the base,
the lora section with lora.adapter = adapter-init), train-reference.json
(every step's ids, targets, loss, lr, gradient norm before clipping; the
schema of the ft-* fixtures, plus peft's version and eval_step1_final,
PEFT's eval-mode loss of step 1's batch with final-adapter/) and final-adapter/ (after
the 10 steps). The adapters are PEFT's own files: adapter_model.safetensors
(fp32, names like base_model.model.model.layers.0.self_attn.q_proj.lora_A
.weight, A [r, in], B [out, r]) and adapter_config.json, in which
base_model_name_or_path is rewritten to ../ft-* (the base relative to the
fixture folder, as model.path; peft writes the absolute path it was given,
which zinc does not read) and target_modules is sorted (peft keeps a set,
whose order changes run to run).

PyTorch runs in fp32 on the CPU with eager attention on the base's stored
values widened to fp32, dropout 0; the optimizer, schedule, clipping and
accumulation are gen_train_fixtures.py's (its train()), over the adapters
only. Afterwards both adapter folders are loaded back with
peft.PeftModel.from_pretrained and compared with the trained tensors.

  --check-export DIR --fixture NAME  loads the fixture's base with the PEFT
      adapter in DIR (zinc export's output) through
      peft.PeftModel.from_pretrained, prints step 1's loss under PEFT (mean
      over its targets) and each adapter tensor's largest difference from
      final-adapter/. The differences are small only for an adapter zinc
      trained on the reference's batches (as tests/test_train_hf.c does);
      after `zinc train` on other data this checks that peft loads the
      export and that the tensor names and shapes are PEFT's.

Usage: python3 scripts/gen_lora_fixtures.py [--out tests/fixtures]
       python3 scripts/gen_lora_fixtures.py --check-export DIR --fixture llama
Needs torch, transformers and peft 0.21.2 (the fixtures were made with
torch 2.15, transformers 5.23, peft 0.21.2). CI never runs this.
"""
import argparse
import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import ensure_torch  # noqa: E402
from gen_train_fixtures import (ACCUM, MICRO, SEQ, noise_and_bounds,  # noqa: E402
                                run_variants, train, zinc_config)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TARGETS_ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FIXTURES = {
    "llama": dict(base="ft-llama", r=4, alpha=8, targets="all-linear", rslora=False, seed=31,
                  data_seed=41),
    "qwen2": dict(base="ft-qwen2", r=2, alpha=5, targets=["q_proj", "v_proj", "down_proj"],
                  rslora=True, seed=32, data_seed=42),
    # PEFT's dropout with zinc's masks (ZincDropout): inputs of width
    # hidden (q, k, up), heads x head_dim (o) and intermediate (down)
    "dropout": dict(base="ft-llama", r=4, alpha=16,
                    targets=["q_proj", "k_proj", "o_proj", "up_proj", "down_proj"],
                    rslora=False, seed=33, data_seed=43, dropout=0.2, lora_seed=7),
    # qwen3: every projection, so the q and k adapters feed the per-head q/k
    # norm (named: peft 0.21 expands all-linear on Qwen3 to per-layer module
    # paths, which lora-llama's all-linear already covers in its own form)
    "qwen3": dict(base="ft-qwen3", r=4, alpha=8, targets=TARGETS_ALL, rslora=False, seed=34,
                  data_seed=44),
    # phi3: its four projections, two of them fused (what LLaMA-Factory's
    # lora_target all gives it)
    # olmo2: the q and k adapters feed the full-width q/k norm, o's and
    # down's the post-norms
    "olmo2": dict(base="ft-olmo2", r=4, alpha=8, targets=TARGETS_ALL, rslora=False, seed=36,
                  data_seed=46),
    # mistral: its windowed attention under every projection's adapter
    # gemma2: the adapters under the caps, the window and the four norms
    "gemma2": dict(base="ft-gemma2", r=4, alpha=8, targets=TARGETS_ALL, rslora=False,
                   seed=38, data_seed=48),
    "mistral": dict(base="ft-mistral", r=4, alpha=8, targets=TARGETS_ALL, rslora=False,
                    seed=37, data_seed=47),
    # gemma3: the q and k adapters under the per-head (1 + w) norm, the two
    # RoPE bases; olmo3: the window and YaRN under every adapter
    "gemma3": dict(base="ft-gemma3", r=4, alpha=8, targets=TARGETS_ALL, rslora=False,
                   seed=39, data_seed=49),
    "olmo3": dict(base="ft-olmo3", r=4, alpha=8, targets=TARGETS_ALL, rslora=False,
                  seed=40, data_seed=50),
    # qwen3moe: the attention's four projections (adapters on the experts are
    # not built), q and k feeding the per-head norm, beside the routing
    "qwen3moe": dict(base="ft-qwen3moe", r=4, alpha=8,
                     targets=["q_proj", "k_proj", "v_proj", "o_proj"], rslora=False, seed=39,
                     data_seed=49),
    "phi3": dict(base="ft-phi3", r=4, alpha=8,
                 targets=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], rslora=False,
                 seed=35, data_seed=45),
}
TARGET_ORDER = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                "qkv_proj", "gate_up_proj"]  # zinc's target bits, in order
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z, np=None):
    """splitmix64's finalizer (src/util/hash-impl.h zn_mix64) on a Python
    int, or on a numpy uint64 array (wrapping arithmetic) when np is given."""
    if np is None:
        z &= M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def zinc_keep(lora_seed, micro_index, layer, target, n, p):
    """zinc's LoRA dropout mask, as a bool array of n elements: the stream
    of lora.seed (train_llama.c ll_set_dropout), the micro-batch
    ((step * world + rank) * accumulation + micro, steps from 0), the layer
    and target (model.c lora_key), then element i of the [tokens][in]
    input kept when the top 24 bits of mix64(key + (i + 1) golden) are
    >= round(p 2^24) (zn_dev_dropout)."""
    import numpy as np
    k = mix64(lora_seed ^ 0x6C6F72612D64726F)
    k = mix64(k ^ mix64(micro_index + 1))
    k = mix64(k + (layer * 7 + TARGET_ORDER.index(target) + 1) * GOLDEN)
    i = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = mix64(np.uint64(k) + i * np.uint64(GOLDEN), np)
    return (h >> np.uint64(40)) >= np.uint64(int(p * 16777216.0 + 0.5))


def zinc_dropout(pm, spec, torch, flip=False):
    """Replaces every LoRA module's dropout by zinc's masks, so that the
    run is reproducible in C (torch's RNG is not). Returns before_micro for
    train(), which tells the modules which micro-batch runs. flip: the
    micro-batch's rows arrive reversed (train(flip=True)); each row keeps
    its own mask."""
    import numpy as np
    state = {"micro": 0}
    p = spec["dropout"]
    scale = torch.tensor(np.float32(1.0 / (1.0 - p)))  # fp32, as zinc rounds it

    class ZincDropout(torch.nn.Module):
        def __init__(self, layer, target):
            super().__init__()
            self.layer, self.target = layer, target

        def forward(self, x):
            if not self.training:
                return x
            keep = zinc_keep(spec["lora_seed"], state["micro"], self.layer, self.target,
                             x.numel(), p)
            keep = torch.from_numpy(keep.astype(np.float32)).reshape(x.shape)
            return x * (keep.flip(0) if flip else keep) * scale

    n = 0
    for name, mod in pm.named_modules():
        drop = getattr(mod, "lora_dropout", None)
        if drop is None or "default" not in drop:
            continue
        parts = name.split(".")
        layer = int(parts[parts.index("layers") + 1])
        assert isinstance(drop["default"], torch.nn.Dropout) and drop["default"].p == p
        drop["default"] = ZincDropout(layer, parts[-1])
        n += 1
    assert n > 0

    def before_micro(step, a):
        state["micro"] = (step - 1) * ACCUM + a  # world 1, rank 0
    return before_micro
# what peft's "all-linear" must become on these decoders (not lm_head)
ALL_LINEAR = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]


def load_base(out, spec, torch, transformers):
    base = os.path.join(out, spec["base"])
    # the experts as transformers' own loop runs them (float64 too)
    kw = {"experts_implementation": "eager"} if "moe" in spec["base"] else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(
        base, dtype=torch.float32, attn_implementation="eager", **kw)
    return base, model


def save_adapter(pm, d, spec, torch, peft):
    """PEFT's save_pretrained, without its model-card README, with a
    base_model_name_or_path that does not name this machine's checkout and
    target_modules in a fixed order; checks the tensors are fp32."""
    from safetensors.torch import load_file
    pm.save_pretrained(d)
    readme = os.path.join(d, "README.md")
    if os.path.exists(readme):
        os.remove(readme)
    path = os.path.join(d, "adapter_config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg["base_model_name_or_path"] = "../" + spec["base"]
    cfg["target_modules"] = sorted(cfg["target_modules"])
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    tensors = load_file(os.path.join(d, "adapter_model.safetensors"))
    assert all(t.dtype == torch.float32 for t in tensors.values())
    live = peft.get_peft_model_state_dict(pm)  # the tensors being trained, as peft names them
    assert set(live) == set(tensors) and all(torch.equal(live[n], tensors[n]) for n in live)
    return tensors


def make(kind, out, torch, transformers, peft):
    from safetensors.torch import save_file
    spec = FIXTURES[kind]
    base, model = load_base(out, spec, torch, transformers)
    torch.manual_seed(spec["seed"])
    dropout = spec.get("dropout", 0.0)
    lc = peft.LoraConfig(r=spec["r"], lora_alpha=spec["alpha"], lora_dropout=dropout,
                         target_modules=spec["targets"], bias="none",
                         use_rslora=spec["rslora"], init_lora_weights=False,
                         task_type="CAUSAL_LM")
    pm = peft.get_peft_model(model, lc)
    got = sorted(pm.peft_config["default"].target_modules)
    want = ALL_LINEAR if spec["targets"] == "all-linear" else sorted(spec["targets"])
    assert got == want, "peft targets %s, expected %s" % (got, want)
    scaling = {m.scaling["default"] for m in pm.modules()
               if isinstance(getattr(m, "scaling", None), dict)}
    print("lora-%s: peft targets %s, scaling %s" % (kind, ",".join(got), sorted(scaling)))
    d = os.path.join(out, "lora-" + kind)
    os.makedirs(d, exist_ok=True)
    init = save_adapter(pm, os.path.join(d, "adapter-init"), spec, torch, peft)
    params = [p for p in pm.parameters() if p.requires_grad]
    assert all(p.dtype == torch.float32 for p in params)
    assert len(params) == len(init)
    # the run in float32 (three summation orders) and in float64 from the
    # same values: the bounds (see gen_train_fixtures.py)
    fresh = copy.deepcopy(pm)
    models = []

    def run(reverse, flip, dtype=torch.float32, m=None):
        m = m or copy.deepcopy(fresh).to(dtype)
        hook = zinc_dropout(m, spec, torch, flip) if dropout > 0 else None
        st = train(m, [p for p in m.parameters() if p.requires_grad], model.config.vocab_size,
                   torch.Generator().manual_seed(spec["data_seed"]),
                   "lora-" + kind if m is pm else "-", torch, hook, reverse=reverse, flip=flip)
        models.append(m)
        return {n: t.detach() for n, t in peft.get_peft_model_state_dict(m).items()}, st

    def run32(reverse, flip):  # the first run trains pm (saved below), the others copies
        return run(reverse, flip, m=pm if not models else None)
    variants = run_variants(torch, run32)
    steps = variants[0][1]
    final64, steps64 = run(False, False, torch.float64)
    assert all(a["ids"] == b["ids"] for a, b in zip(steps, steps64))
    final = save_adapter(pm, os.path.join(d, "final-adapter"), spec, torch, peft)
    zcfg = zinc_config("tests/test_train_hf.c trains LoRA adapters on model.path for 10 "
                       "steps with this; made by scripts/gen_lora_fixtures.py",
                       "../" + spec["base"])
    lora = {"r": spec["r"], "lora_alpha": spec["alpha"], "lora_dropout": dropout,
            "target_modules": spec["targets"], "bias": "none",
            "use_rslora": spec["rslora"], "adapter": "adapter-init"}
    if dropout > 0:
        lora["seed"] = spec["lora_seed"]
    items = list(zcfg.items())
    at = [k for k, _ in items].index("model") + 1
    zcfg = dict(items[:at] + [("lora", lora)] + items[at:])  # the lora section after model
    with open(os.path.join(d, "train-config.json"), "w") as f:
        json.dump(zcfg, f, indent=2)
    ref = {
        "generator": "scripts/gen_lora_fixtures.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "precision": "float32, eager attention, CPU; adapters fp32, base frozen",
        "weights_dtype": {"ft-llama": "bf16", "ft-qwen2": "f16", "ft-qwen3": "bf16",
                          "ft-phi3": "bf16", "ft-olmo2": "bf16",
                          "ft-mistral": "bf16", "ft-gemma2": "bf16", "ft-gemma3": "bf16",
                          "ft-olmo3": "bf16", "ft-qwen3moe": "bf16"}[spec["base"]],
        "micro_batch": MICRO, "accumulation": ACCUM, "seq_len": SEQ,
        "steps": steps,
    }
    with open(os.path.join(d, "train-reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    # PEFT's eval-mode (no dropout) loss of step 1's batch with the trained
    # adapter: what zinc's zn_train_eval and its merged export must give
    ref["eval_step1_final"] = verify(kind, out, init, final, steps, torch, transformers, peft)
    evals = [step1_loss(m.eval(), d, torch) for m in models]  # eval mode: no dropout
    f64, noise, bounds, update64 = noise_and_bounds(
        torch, init, variants, final64, steps64, {"eval_step1_final": (evals[:-1], evals[-1])})
    ref["float64"], ref["noise"], ref["bounds"] = f64, noise, bounds
    save_file(update64, os.path.join(d, "update64.safetensors"), metadata={"format": "pt"})
    if dropout > 0:
        ref["dropout_masks"] = ("zinc's (scripts/gen_lora_fixtures.py zinc_keep), lora.seed %d"
                                % spec["lora_seed"])
    with open(os.path.join(d, "train-reference.json"), "w") as f:
        json.dump(ref, f, indent=1)


def step1_loss(pm, d, torch):
    """Mean cross-entropy of pm over the targets of train-reference.json's
    step 1 (the loss that step reports)."""
    with open(os.path.join(d, "train-reference.json")) as f:
        st = json.load(f)["steps"][0]
    x = torch.tensor(st["ids"]).reshape(ACCUM * MICRO, SEQ)
    y = torch.tensor(st["targets"]).reshape(ACCUM * MICRO, SEQ)
    with torch.no_grad():
        logits = pm(input_ids=x).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1), ignore_index=-100).item()


def verify(kind, out, init, final, steps, torch, transformers, peft):
    """Loads both adapter folders back in peft and checks they hold the
    tensors trained here; prints layer 0's tensor names and shapes and step
    1's loss before and after training (each step's loss is on a new batch,
    so those need not fall step by step)."""
    spec = FIXTURES[kind]
    d = os.path.join(out, "lora-" + kind)
    loss = {}
    for sub, want in (("adapter-init", init), ("final-adapter", final)):
        _, model = load_base(out, spec, torch, transformers)
        pm = peft.PeftModel.from_pretrained(model, os.path.join(d, sub))
        got = {n.replace(".default", ""): p for n, p in pm.named_parameters() if "lora_" in n}
        assert set(got) == set(want), "names differ: %s" % (set(got) ^ set(want))
        assert all(torch.equal(got[n].detach(), want[n]) for n in want), sub + " differs"
        loss[sub] = step1_loss(pm, d, torch)
    if not spec.get("dropout"):  # eval mode has no dropout; training had
        assert abs(loss["adapter-init"] - steps[0]["loss"]) <= 1e-5 * steps[0]["loss"]
    for n in sorted(final):
        if ".layers.0." in n:
            print("  %-60s %s" % (n, list(final[n].shape)))
    print("lora-%s: %d fp32 tensors reload in peft; step 1's batch: loss %.6f before, %.6f after"
          % (kind, len(final), loss["adapter-init"], loss["final-adapter"]))
    return loss["final-adapter"]


def check_export(adapter, kind, out, torch, transformers, peft):
    from safetensors.torch import load_file
    spec = FIXTURES[kind]
    _, model = load_base(out, spec, torch, transformers)
    pm = peft.PeftModel.from_pretrained(model, adapter)
    d = os.path.join(out, "lora-" + kind)
    print("peft loss of step 1's batch with %s: %.9f" % (adapter, step1_loss(pm, d, torch)))
    mine = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    ref = load_file(os.path.join(d, "final-adapter", "adapter_model.safetensors"))
    assert set(mine) == set(ref), "tensor names differ: %s" % (set(mine) ^ set(ref))
    for k in sorted(ref):
        print("  %-60s %s %-8s max |diff| %.3e" % (k, str(mine[k].dtype)[6:], list(mine[k].shape),
                                                   (mine[k].float() - ref[k]).abs().max().item()))
    worst = max((mine[k].float() - ref[k]).abs().max().item() for k in ref)
    print("largest difference from final-adapter/: %.3e over %d tensors" % (worst, len(ref)))


def check_merge(merged, adapter, kind, out, torch, transformers, peft):
    """zinc export --merge's folder against peft's merge_and_unload of the
    adapter folder `adapter` on the fixture's base: every tensor, and the
    loss of step 1's batch through transformers."""
    spec = FIXTURES[kind]
    _, model = load_base(out, spec, torch, transformers)
    ref = peft.PeftModel.from_pretrained(model, adapter).merge_and_unload()
    kw = {"experts_implementation": "eager"} if "moe" in spec["base"] else {}
    mine = transformers.AutoModelForCausalLM.from_pretrained(
        merged, dtype=torch.float32, attn_implementation="eager", **kw)
    rs, ms = ref.state_dict(), mine.state_dict()
    assert set(rs) == set(ms), "tensor names differ: %s" % (set(rs) ^ set(ms))
    worst, wn = 0.0, ""
    for k in sorted(rs):
        dif = ((ms[k] - rs[k]).norm() / rs[k].norm().clamp_min(1e-30)).item()
        if dif > worst:
            worst, wn = dif, k
    d = os.path.join(out, "lora-" + kind)
    la, lb = step1_loss(ref, d, torch), step1_loss(mine, d, torch)
    print("merged %s vs peft merge_and_unload of %s: worst tensor %s rel L2 %.2e; step 1 loss "
          "%.9f vs %.9f" % (merged, adapter, wn, worst, lb, la))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures"))
    ap.add_argument("--check-export", metavar="DIR", help="a PEFT adapter folder (zinc export's "
                    "output) to load in peft and compare with the fixture's final-adapter/")
    ap.add_argument("--check-merge", nargs=2, metavar=("MERGED", "ADAPTER"),
                    help="zinc export --merge's folder and the PEFT adapter folder it merged")
    ap.add_argument("--fixture", choices=sorted(FIXTURES), default="llama")
    ap.add_argument("--only", choices=sorted(FIXTURES), help="make this fixture only")
    a = ap.parse_args()
    ensure_torch()
    try:
        import peft
    except ImportError:
        sys.exit("gen_lora_fixtures: needs peft (pip install peft==0.21.2)")
    import torch
    import transformers
    if a.check_merge:
        check_merge(a.check_merge[0], a.check_merge[1], a.fixture, a.out, torch, transformers,
                    peft)
        return
    if a.check_export:
        check_export(a.check_export, a.fixture, a.out, torch, transformers, peft)
        return
    torch.set_num_threads(1)  # one summation order, run to run
    for kind in FIXTURES:
        if not a.only or kind == a.only:
            make(kind, a.out, torch, transformers, peft)


if __name__ == "__main__":
    main()
