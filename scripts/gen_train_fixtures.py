#!/usr/bin/env python3
"""Generates the fine-tuning fixtures in tests/fixtures/ft-*: PyTorch training
a transformers-saved model for 10 AdamW steps, which zinc must reproduce
starting from the same folder (tests/test_train_hf.c).

Two small decoders with shapes unlike the other fixtures:
  ft-llama  llama, 3 layers, hidden 48, GQA 6/2 heads, untied, weights
            stored as bf16 in one model.safetensors
  ft-qwen2  qwen2 (q/k/v bias), 2 layers, hidden 40, GQA 5/1 heads,
            untied, weights stored as fp16 in two shards with an index
  ft-tied   llama with tied embeddings (as Llama-3.2 and Qwen2.5 <= 3B),
            2 layers, hidden 32, GQA 4/2 heads, weights stored as fp32
            (transformers saves the shared table once, as embed_tokens)
  ft-vocab  qwen2, 2 layers, hidden 32, a 1000-token vocabulary against
            9k-parameter layers, untied, fp32: zinc streams its embedding
            and lm_head in four row parts (zn_model_part)
  ft-tiedvocab  the same shape as a tied llama: the resident embedding in
            four parts that the head reads as its lm_head
For each folder: config.json (transformers' own), the weights,
train-config.json (the zinc config the test trains with: DeepSpeed's
optimizer / scheduler / clipping keys and the batch shape), and
train-reference.json with every step's ids and targets (micro-batches of
the step back to back), the loss of each step (mean over the step's
targets), the learning rate used and the gradient norm before clipping.
final.safetensors holds every parameter after the 10 steps (fp32).

PyTorch runs in fp32 on the CPU with eager attention, on the values stored
on disk widened to fp32 (what zinc's master starts from). The step is
torch.optim.AdamW with the lr DeepSpeed's WarmupLR gives zinc's step k
(iteration k - 1), after torch.nn.utils.clip_grad_norm_, the loss of a
micro-batch being sum(xent) / (targets of the whole step) as the HF
Trainer accumulates it.

Usage: python3 scripts/gen_train_fixtures.py [--out tests/fixtures]
Needs torch and transformers (scripts/requirements-fixtures.txt); without
them it makes .venv-fixtures/ like scripts/gen_fixtures.py. CI never runs
this.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import ensure_torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 10
MICRO = 2
ACCUM = 2
SEQ = 12
LR, BETAS, EPS, WD, CLIP = 2e-3, (0.9, 0.95), 1e-8, 0.1, 1.0
WARMUP = 3


def lr_at(step):
    """DeepSpeed WarmupLR (linear, min 0) at zinc's step `step` (1-based)."""
    it = step - 1
    w = max(2, WARMUP)
    return LR * (it / w if it < w else 1.0)


def shapes(kind):
    if kind == "tied":
        return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                    max_position_embeddings=64, hidden_act="silu")
    if kind in ("vocab", "tiedvocab"):
        return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                    max_position_embeddings=64, hidden_act="silu")
    if kind == "llama":
        return dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                    num_attention_heads=6, num_key_value_heads=2, vocab_size=160,
                    max_position_embeddings=64, hidden_act="silu")
    return dict(hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                num_attention_heads=5, num_key_value_heads=1, vocab_size=150,
                max_position_embeddings=64, hidden_act="silu")


def randomize(model, torch, gen):
    """Weights large enough that every op matters, small enough that AdamW's
    steps move the loss."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
            elif name.endswith(".bias"):
                v = 0.2 * torch.randn(p.shape, generator=gen)
            elif "embed_tokens" in name:
                # tied: the same table makes the logits, keep them O(1)
                std = 0.3 if model.config.tie_word_embeddings else 1.0
                v = std * torch.randn(p.shape, generator=gen)
            else:
                v = torch.randn(p.shape, generator=gen) * (1.0 / p.shape[1] ** 0.5)
            p.copy_(v)


def zinc_config(comment, model_path):
    """The zinc config the fixtures train with: DeepSpeed's optimizer,
    scheduler, clipping and batch keys as PyTorch runs them here."""
    return {
        "_comment": comment,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": ACCUM,
        "gradient_clipping": CLIP,
        "bf16": {"enabled": False},
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": list(BETAS), "eps": EPS,
                                                  "weight_decay": WD}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": LR,
                                                     "warmup_num_steps": WARMUP,
                                                     "warmup_type": "linear"}},
        "zero_optimization": {"stage": 3},
        "model": {"path": model_path},
        "data": {"seq_len": SEQ},
        "train": {"steps": STEPS, "device": "host"},
    }


def train(model, params, V, dgen, label, torch, before_micro=None):
    """STEPS AdamW steps of `params` (the ones that train) on random windows
    drawn from dgen, with a few ignored targets; returns each step's ids,
    targets, loss, lr and gradient norm before clipping. before_micro(step,
    a), if given, runs before micro-batch a of step (1-based) is computed."""
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    steps = []
    model.train()
    for step in range(1, STEPS + 1):
        ids = torch.randint(0, V, (ACCUM, MICRO, SEQ + 1), generator=dgen)
        x, y = ids[..., :-1].clone(), ids[..., 1:].clone()
        # a few ignored targets (HF's -100), as an SFT mask makes them
        y[0, 0, 2] = -100
        y[ACCUM - 1, MICRO - 1, SEQ - 1] = -100
        n_tgt = int((y >= 0).sum())
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for a in range(ACCUM):
            if before_micro:
                before_micro(step, a)
            logits = model(input_ids=x[a]).logits
            l = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y[a].reshape(-1),
                                                  ignore_index=-100, reduction="sum")
            (l / n_tgt).backward()
            loss_sum += l.item()
        norm = torch.nn.utils.clip_grad_norm_(params, CLIP).item()
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        steps.append({"step": step, "ids": x.reshape(-1).tolist(), "targets": y.reshape(-1).tolist(),
                      "loss": loss_sum / n_tgt, "lr": lr, "grad_norm": norm})
        print("%s step %2d loss %.6f lr %.2e norm %.4f" % (label, step, loss_sum / n_tgt, lr, norm))
    return steps


def make(kind, out, torch, transformers, save_file):
    gen = torch.Generator().manual_seed({"llama": 11, "qwen2": 12, "tied": 13, "vocab": 14,
                                     "tiedvocab": 15}[kind])
    if kind in ("tied", "tiedvocab"):
        cfg = transformers.LlamaConfig(**shapes(kind), rms_norm_eps=1e-5, tie_word_embeddings=True,
                                       attention_bias=False, rope_theta=500000.0)
        cls = transformers.LlamaForCausalLM
        disk = torch.float32
    elif kind == "llama":
        cfg = transformers.LlamaConfig(**shapes(kind), rms_norm_eps=1e-5, tie_word_embeddings=False,
                                       attention_bias=False, rope_theta=500000.0)
        cls = transformers.LlamaForCausalLM
        disk = torch.bfloat16
    else:
        cfg = transformers.Qwen2Config(**shapes(kind), rms_norm_eps=1e-6, tie_word_embeddings=False,
                                       rope_theta=1000000.0, use_sliding_window=False)
        cls = transformers.Qwen2ForCausalLM
        disk = torch.float32 if kind == "vocab" else torch.float16
    cfg._attn_implementation = "eager"
    model = cls(cfg).to(torch.float32)
    randomize(model, torch, gen)
    if cfg.tie_word_embeddings:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tensors = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            q = p.to(disk).contiguous()
            p.copy_(q.to(torch.float32))  # train from exactly what is on disk
            tensors[name] = q

    d = os.path.join(out, "ft-" + kind)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    cfg.save_pretrained(d)
    meta = {"format": "pt"}
    if kind != "qwen2":
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata=meta)
    else:
        names = list(tensors)
        half = len(names) // 2
        files = {"model-00001-of-00002.safetensors": names[:half],
                 "model-00002-of-00002.safetensors": names[half:]}
        wm, total = {}, 0
        for fname, group in files.items():
            save_file({n: tensors[n] for n in group}, os.path.join(d, fname), metadata=meta)
            for n in group:
                wm[n] = fname
                total += tensors[n].numel() * tensors[n].element_size()
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2)

    zcfg = zinc_config("tests/test_train_hf.c trains model.path for 10 steps with this; "
                       "made by scripts/gen_train_fixtures.py", ".")
    with open(os.path.join(d, "train-config.json"), "w") as f:
        json.dump(zcfg, f, indent=2)

    dgen = torch.Generator().manual_seed({"llama": 21, "qwen2": 22, "tied": 23, "vocab": 24,
                                      "tiedvocab": 25}[kind])
    steps = train(model, list(model.parameters()), cfg.vocab_size, dgen, kind, torch)
    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()},
              os.path.join(d, "final.safetensors"), metadata=meta)
    ref = {
        "generator": "scripts/gen_train_fixtures.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "precision": "float32, eager attention, CPU",
        "weights_dtype": {"llama": "bf16", "qwen2": "f16", "tied": "f32", "vocab": "f32",
                          "tiedvocab": "f32"}[kind],
        "micro_batch": MICRO, "accumulation": ACCUM, "seq_len": SEQ,
        "steps": steps,
    }
    with open(os.path.join(d, "train-reference.json"), "w") as f:
        json.dump(ref, f, indent=1)


def check_export(zinc, torch, transformers):
    """Fine-tunes each ft-* folder with zinc (10 steps from its weights,
    checkpoint at the end), exports it as fp32 and bf16, loads each export in
    transformers with default arguments (the dtype must be the one written)
    and compares transformers' mean cross-entropy on fresh token windows with
    `zinc eval` on the same export and ids."""
    import subprocess
    import tempfile
    from gen_fixtures import write_tokens
    fx = os.path.join(ROOT, "tests", "fixtures")
    bad = 0
    for kind in ("llama", "qwen2", "tied", "vocab", "tiedvocab"):
        src = os.path.join(fx, "ft-" + kind)
        V = json.load(open(os.path.join(src, "config.json")))["vocab_size"]
        with tempfile.TemporaryDirectory() as tmp:
            def run(*args):
                r = subprocess.run([zinc] + list(args), cwd=tmp, capture_output=True, text=True)
                if r.returncode:
                    sys.exit("check-export: zinc %s failed:\n%s%s" % (" ".join(args), r.stdout, r.stderr))
                return r.stdout
            run("train", os.path.join(src, "train-config.json"), "--model", src, "--steps", "10",
                "--set", "train.checkpoint.dir=\"ck\"")
            seq, windows = 12, 6
            g = torch.Generator().manual_seed(5)
            ids = torch.randint(0, V, (windows * seq + 1,), generator=g).tolist()
            write_tokens(os.path.join(tmp, "ids.tok"), ids, V)
            t = torch.tensor(ids, dtype=torch.long)
            x = torch.stack([t[w * seq: w * seq + seq] for w in range(windows)])
            y = torch.stack([t[w * seq + 1: w * seq + seq + 1] for w in range(windows)])
            for dt, tdt, tol in (("fp32", torch.float32, 1e-5), ("bf16", torch.bfloat16, 2e-2)):
                out = os.path.join(tmp, "hf-" + dt)
                run("export", "ck", "--out", out, "--dtype", dt)
                zl = json.loads(run("eval", "--model", out, "--data", "ids.tok", "--seq-len",
                                    str(seq), "--batch", "1", "--device", "host", "--json"))["loss"]
                model = transformers.AutoModelForCausalLM.from_pretrained(out)  # defaults
                model.eval()
                pdt = next(model.parameters()).dtype
                with torch.no_grad():
                    logits = model(input_ids=x).logits.float()
                tl = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1)).item()
                ok = pdt == tdt and abs(tl - zl) <= tol * abs(tl)
                bad += not ok
                print("check-export: ft-%-5s %s: transformers loads %s (want %s), loss %.6f, "
                      "zinc eval %.6f, rel %.1e: %s" % (kind, dt, pdt, tdt, tl, zl,
                                                        abs(tl - zl) / abs(tl), "ok" if ok else "FAILED"))
    if bad:
        sys.exit("check-export: %d FAILED" % bad)
    print("check-export: ok (transformers %s)" % transformers.__version__)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures"))
    ap.add_argument("--check-export", metavar="ZINC", help="check zinc's fine-tuned exports "
                    "in transformers (see check_export)")
    ap.add_argument("--only", choices=("llama", "qwen2", "tied", "vocab", "tiedvocab"),
                    help="make this fixture only")
    args = ap.parse_args()
    ensure_torch()
    if args.check_export:
        import torch
        import transformers
        check_export(os.path.abspath(args.check_export), torch, transformers)
        return
    import torch
    import transformers
    from safetensors.torch import save_file
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one summation order, run to run
    for kind in ("llama", "qwen2", "tied", "vocab", "tiedvocab"):
        if not args.only or kind == args.only:
            make(kind, args.out, torch, transformers, save_file)


if __name__ == "__main__":
    main()
