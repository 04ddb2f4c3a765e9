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
  ft-qwen3  qwen3 (per-head q/k RMSNorm, trained), 2 layers, hidden 32, GQA
            4/2 heads of head_dim 16 (q wider than hidden), untied, bf16
  ft-phi3   phi3 (qkv_proj and gate_up_proj fused, trained as one tensor
            each), 2 layers, hidden 32, GQA 4/2, untied, bf16
  ft-olmo2  olmo2 (post-norms, full-width q/k norm, all trained), 2 layers,
            hidden 32, GQA 4/2, untied, pad id 1, bf16
  ft-gemma  gemma ((1 + w) norms, GeGLU, the embedding times sqrt(hidden)),
            2 layers, hidden 32, MQA 4/1 of head_dim 16, tied, pad id 0, fp32
  ft-mistral  mistral with sliding_window 5 over the 12-token sequences: the
            window's mask trained through, 2 layers, hidden 32, GQA 4/2, bf16
  ft-gemma2 gemma2 (four norms, query_pre_attn_scalar 24 against head_dim
            16, the scores capped at 4 and the logits at 2, a 5-key window
            on layers 0 and 2 of 3 over the 12-token sequences), hidden 32,
            GQA 4/2, tied, pad id 0, bf16
  ft-gemma3 gemma3_text (gemma2's norms with the per-head (1 + w) q/k norm,
            no caps, a 5-key window and rope_local_base_freq 100 on layers 0
            and 1 of 3 (sliding_window_pattern 3), rope_theta 10000 scaled
            linearly by 2 on layer 2), hidden 32, GQA 4/2 of head_dim 16,
            tied, pad id 0, bf16
  ft-olmo3  olmo3 (olmo2's block, layer_types sliding, sliding, full: a
            5-key window on layers 0 and 1, YaRN on layer 2 with factor 2
            over 16 original positions and attention_factor 1.1 given),
            hidden 32, GQA 4/2, untied, pad id 1, bf16
  ft-qwen3moe qwen3_moe (8 experts of width 16, 2 a token, renormalized;
            the router and every expert trained), 2 layers of which layer 1
            is dense (mlp_only_layers), hidden 32, GQA 4/2 of head_dim 16,
            untied, bf16, the published per-expert tensor names
  ft-qwen3moeaux  the same shape with output_router_logits true and
            router_aux_loss_coef 0.05: each micro-batch's loss is its
            cross-entropy (over the step's targets) plus 0.05 times its
            load-balancing loss (transformers' load_balancing_loss_func, no
            attention mask), added in full per micro-batch as the HF
            Trainer's loss-kwargs path does; "aux_loss" per step is its mean
            over the micro-batches, with its own noise and bound
  ft-mixtral  mixtral (4 experts of width 24, 2 a token, renormalized, fp32
            routing weights; Mistral's attention with sliding_window 5 over
            the 12-token sequences), 2 layers, hidden 32, GQA 4/2, untied,
            bf16, the published block_sparse_moe.experts.E.w1/w2/w3 names
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

Bounds (tests/README.md): the same training runs again in float32 in
three other summation orders (run_variants) and in float64, from the same
stored values on the same batches. How far the float32 runs land from the
float64 one is the reference's own rounding noise (the largest over the
orders; per tensor, the largest of its kind over the layers). train-reference.json
holds the float64 run's losses and gradient norms ("float64"), the noise
("noise") and BOUND_FACTOR times it ("bounds"); update64.safetensors holds
the float64 run's update w_final - w_init (rounded once to float32, 6e-8 of
itself). tests/test_train_hf.c measures zinc against the float64 run and
allows it BOUND_FACTOR times PyTorch float32's own distance from it:
  loss, grad_norm  the largest relative difference over the steps
  update           the trained change w_final - w_init by relative L2
                   (||u - u64|| / ||u64||), over the whole model and per
                   tensor (each against its own noise)
The update, not the weights, is compared: an error in a step counts
against what the steps changed, not against the weights' size, so a 1e-3
error in one step's update moves the update by about 1e-4 and shows.
"""
import argparse
import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_fixtures import ensure_torch, published  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 10
MICRO = 2
ACCUM = 2
SEQ = 12
LR, BETAS, EPS, WD, CLIP = 2e-3, (0.9, 0.95), 1e-8, 0.1, 1.0
WARMUP = 3
# The bounds: zinc's distance from the float64 run may be this many times
# PyTorch float32's. Two float32 computations of the same sums in different
# orders carry errors of the same size; 4 leaves room for the spread of one
# measured noise (a tensor of 8 elements is a small sample) and for sums
# that round differently (blocked GEMMs, online softmax), and still puts a
# 1e-3 error in one step's update (about 1e-4 of the update) well outside
# the per-tensor bounds (4 x 1e-6..1e-5 for the weight matrices).
BOUND_FACTOR = 4


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
    if kind == "mistral":
        return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                    max_position_embeddings=64, hidden_act="silu")
    if kind == "gemma2":
        return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                    max_position_embeddings=64, hidden_activation="gelu_pytorch_tanh")
    if kind == "gemma3":
        return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                    max_position_embeddings=64, hidden_activation="gelu_pytorch_tanh")
    if kind == "olmo3":
        return dict(hidden_size=32, intermediate_size=56, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                    max_position_embeddings=64, hidden_act="silu")
    if kind == "gemma":
        return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=128,
                    max_position_embeddings=64, hidden_act="gelu_pytorch_tanh")
    if kind == "olmo2":
        return dict(hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                    max_position_embeddings=64, hidden_act="silu")
    if kind == "phi3":
        return dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                    max_position_embeddings=64, hidden_act="silu")
    if kind == "qwen3":
        return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                    max_position_embeddings=64, hidden_act="silu")
    if kind == "mixtral":
        return dict(hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                    max_position_embeddings=64, hidden_act="silu")
    if kind in ("qwen3moe", "qwen3moeaux"):
        return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
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
                if model.config.model_type in ("gemma", "gemma2", "gemma3_text"):
                    std = 0.1  # its rows enter the layers times sqrt(hidden)
                v = std * torch.randn(p.shape, generator=gen)
            else:
                v = torch.randn(p.shape, generator=gen) * (1.0 / p.shape[-1] ** 0.5)
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


def train(model, params, V, dgen, label, torch, before_micro=None, reverse=False, flip=False):
    """STEPS AdamW steps of `params` (the ones that train) on random windows
    drawn from dgen, with a few ignored targets; returns each step's ids,
    targets, loss, lr and gradient norm before clipping. before_micro(step,
    a), if given, runs before micro-batch a of step (1-based) is computed.
    reverse: the step's micro-batches summed last to first; flip: each
    micro-batch's rows in reverse order (the same values, other orders of
    the gradient sums over micro-batches and over tokens)."""
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    steps = []
    model.train()
    # a mixture of experts' load-balancing loss, when its config asks for it
    aux_coef = (model.config.router_aux_loss_coef
                if getattr(model.config, "output_router_logits", False) else 0.0)
    for step in range(1, STEPS + 1):
        ids = torch.randint(0, V, (ACCUM, MICRO, SEQ + 1), generator=dgen)
        x, y = ids[..., :-1].clone(), ids[..., 1:].clone()
        # a few ignored targets (HF's -100), as an SFT mask makes them
        y[0, 0, 2] = -100
        y[ACCUM - 1, MICRO - 1, SEQ - 1] = -100
        n_tgt = int((y >= 0).sum())
        opt.zero_grad(set_to_none=True)
        loss_sum = aux_sum = 0.0
        for a in (reversed(range(ACCUM)) if reverse else range(ACCUM)):
            if before_micro:
                before_micro(step, a)
            xa, ya = (x[a].flip(0), y[a].flip(0)) if flip else (x[a], y[a])
            out = model(input_ids=xa)
            logits = out.logits
            l = torch.nn.functional.cross_entropy(logits.reshape(-1, V), ya.reshape(-1),
                                                  ignore_index=-100, reduction="sum")
            if aux_coef:
                (l / n_tgt + aux_coef * out.aux_loss).backward()
                aux_sum += out.aux_loss.item()
            else:
                (l / n_tgt).backward()
            loss_sum += l.item()
        norm = torch.nn.utils.clip_grad_norm_(params, CLIP).item()
        lr = lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        steps.append({"step": step, "ids": x.reshape(-1).tolist(), "targets": y.reshape(-1).tolist(),
                      "loss": loss_sum / n_tgt + aux_coef * aux_sum, "lr": lr, "grad_norm": norm})
        if aux_coef:
            steps[-1]["aux_loss"] = aux_sum / ACCUM
        if not label.startswith("-"):
            print("%s step %2d loss %.6f lr %.2e norm %.4f" % (label, step, loss_sum / n_tgt, lr,
                                                             norm))
    return steps


def rel(a, b):
    return abs(a - b) / abs(b)


def run_variants(torch, run):
    """The float32 run in the orders the noise is measured over: as made,
    its micro-batches summed in reverse, each micro-batch's rows reversed,
    and on 3 threads (other GEMM splits). run(reverse, flip) trains a fresh
    copy and returns (named final tensors, steps)."""
    out = [run(False, False), run(True, False), run(False, True)]
    n = torch.get_num_threads()
    torch.set_num_threads(3)
    out.append(run(False, False))
    torch.set_num_threads(n)
    return out


def kind_of(name):
    """A tensor's kind: its name without the layer index."""
    import re
    return re.sub(r"\.layers\.\d+\.", ".layers.*.", name)


def noise_and_bounds(torch, init, variants, final64, steps64, extra=None):
    """train-reference.json's "float64", "noise" and "bounds" sections and
    the float64 update (name -> float32 tensor) for update64.safetensors
    (see the module's docstring). init, final64: name -> tensor (the
    trained tensors only); variants: run_variants()'s list of (final32,
    steps32), the first being the fixture's own run; steps64: train()'s
    list; extra: more scalar losses (name -> ([float32 value per variant],
    float64 value)), bounded like the step losses. Each noise is the
    largest over the variants: one order's distance from float64 is one
    sample, and where a gradient cancels (a k_proj bias: RoPE makes it
    nearly zero) samples spread by 10x."""
    tensors, update64, model, kinds = {}, {}, 0.0, {}
    for n in sorted(init):
        u64 = final64[n].double() - init[n].double()
        update64[n] = u64.float().contiguous()
        u = u64.norm().item()
        tensors[n] = max((f[n].double() - final64[n].double()).norm().item() / u if u > 0 else 0.0
                         for f, _ in variants)
        kinds[kind_of(n)] = max(kinds.get(kind_of(n), 0.0), tensors[n])
    for f, _ in variants:
        num = sum((f[n].double() - final64[n].double()).norm().item() ** 2 for n in init)
        den = sum((final64[n].double() - init[n].double()).norm().item() ** 2 for n in init)
        model = max(model, (num / den) ** 0.5)
    f64 = {"loss": [s["loss"] for s in steps64], "grad_norm": [s["grad_norm"] for s in steps64]}
    noise = {
        "rule": "largest distance of the float32 reference, summed in 3 orders, from the same "
                "run in float64 (scripts/gen_train_fixtures.py, tests/README.md)",
        "loss": max(rel(a["loss"], b["loss"]) for _, st in variants for a, b in zip(st, steps64)),
        "grad_norm": max(rel(a["grad_norm"], b["grad_norm"])
                         for _, st in variants for a, b in zip(st, steps64)),
        "update": model,
        "update_tensors": tensors,
    }
    bounds = {"factor": BOUND_FACTOR,
              "loss": BOUND_FACTOR * noise["loss"],
              "grad_norm": BOUND_FACTOR * noise["grad_norm"],
              "update": BOUND_FACTOR * model,
              # each tensor against the largest noise of its kind over the
              # layers: the layers' k_proj biases are alike, and one small
              # tensor's noise is a sample too few
              "update_tensors": {n: BOUND_FACTOR * kinds[kind_of(n)] for n in tensors}}
    # a loss zinc reports from float32 sums is half an ulp from any other
    # at best: no loss noise below float32's unit roundoff
    noise["loss"] = max(noise["loss"], 2.0 ** -24)
    for k, (a, b) in (extra or {}).items():
        f64[k] = b
        noise[k] = max(max(rel(x, b) for x in a), 2.0 ** -24)
        # one forward, as each step's loss: never bounded tighter than those
        bounds[k] = BOUND_FACTOR * max(noise[k], noise["loss"])
    print("noise: loss %.1e, grad norm %.1e, update %.1e (tensors %.1e .. %.1e)" %
          (noise["loss"], noise["grad_norm"], model, min(tensors.values()),
           max(tensors.values())))
    return f64, noise, bounds, update64


def make(kind, out, torch, transformers, save_file):
    gen = torch.Generator().manual_seed({"llama": 11, "qwen2": 12, "tied": 13, "vocab": 14,
                                     "tiedvocab": 15, "qwen3": 16, "phi3": 17,
                                     "olmo2": 18, "gemma": 19, "mistral": 20,
                                     "gemma2": 31, "gemma3": 33, "olmo3": 35,
                                     "qwen3moe": 33, "qwen3moeaux": 35, "mixtral": 37}[kind])
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
    elif kind == "qwen3":
        cfg = transformers.Qwen3Config(**shapes(kind), rms_norm_eps=1e-6, tie_word_embeddings=False,
                                       attention_bias=False, rope_theta=1000000.0,
                                       use_sliding_window=False)
        cls = transformers.Qwen3ForCausalLM
        disk = torch.bfloat16
    elif kind == "phi3":
        cfg = transformers.Phi3Config(**shapes(kind), rms_norm_eps=1e-5, tie_word_embeddings=False,
                                      rope_theta=250000.0, bos_token_id=1, eos_token_id=2,
                                      pad_token_id=0, sliding_window=None)
        cls = transformers.Phi3ForCausalLM
        disk = torch.bfloat16
    elif kind == "olmo2":
        cfg = transformers.Olmo2Config(**shapes(kind), rms_norm_eps=1e-6, tie_word_embeddings=False,
                                       rope_theta=500000.0, attention_bias=False,
                                       pad_token_id=1, bos_token_id=None, eos_token_id=2)
        cls = transformers.Olmo2ForCausalLM
        disk = torch.bfloat16
    elif kind == "gemma":
        cfg = transformers.GemmaConfig(**shapes(kind), rms_norm_eps=1e-6, tie_word_embeddings=True,
                                       rope_theta=10000.0, attention_bias=False, pad_token_id=0,
                                       bos_token_id=2, eos_token_id=1)
        cls = transformers.GemmaForCausalLM
        disk = torch.float32
    elif kind == "gemma2":
        cfg = transformers.Gemma2Config(**shapes(kind), rms_norm_eps=1e-6,
                                        tie_word_embeddings=True, rope_theta=10000.0,
                                        attention_bias=False, query_pre_attn_scalar=24,
                                        attn_logit_softcapping=4.0, final_logit_softcapping=2.0,
                                        sliding_window=5, pad_token_id=0, bos_token_id=2,
                                        eos_token_id=1)
        cls = transformers.Gemma2ForCausalLM
        disk = torch.bfloat16
    elif kind == "gemma3":
        cfg = transformers.Gemma3TextConfig(**shapes(kind), rms_norm_eps=1e-6,
                                            tie_word_embeddings=True, rope_theta=10000.0,
                                            rope_local_base_freq=100.0,
                                            rope_scaling={"rope_type": "linear", "factor": 2.0},
                                            attention_bias=False, query_pre_attn_scalar=24,
                                            sliding_window=5, sliding_window_pattern=3,
                                            pad_token_id=0, bos_token_id=2, eos_token_id=1)
        cls = transformers.Gemma3ForCausalLM
        disk = torch.bfloat16
    elif kind == "olmo3":
        rope = {"full_attention": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                   "original_max_position_embeddings": 16,
                                   "attention_factor": 1.1},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
        cfg = transformers.Olmo3Config(**shapes(kind), rms_norm_eps=1e-6,
                                       tie_word_embeddings=False, rope_parameters=rope,
                                       attention_bias=False, sliding_window=5,
                                       layer_types=["sliding_attention", "sliding_attention",
                                                    "full_attention"],
                                       pad_token_id=1, bos_token_id=None, eos_token_id=2)
        cls = transformers.Olmo3ForCausalLM
    elif kind in ("qwen3moe", "qwen3moeaux"):
        cfg = transformers.Qwen3MoeConfig(**shapes(kind), rms_norm_eps=1e-6,
                                          tie_word_embeddings=False, attention_bias=False,
                                          rope_theta=1000000.0, use_sliding_window=False,
                                          num_experts=8, num_experts_per_tok=2,
                                          moe_intermediate_size=16, norm_topk_prob=True,
                                          decoder_sparse_step=1, mlp_only_layers=[1],
                                          output_router_logits=kind == "qwen3moeaux",
                                          router_aux_loss_coef=0.05 if kind == "qwen3moeaux"
                                          else 0.001)
        cfg._experts_implementation = "eager"  # transformers' loop over the experts
        cls = transformers.Qwen3MoeForCausalLM
        disk = torch.bfloat16
    elif kind == "mixtral":
        cfg = transformers.MixtralConfig(**shapes(kind), rms_norm_eps=1e-5,
                                         tie_word_embeddings=False, rope_theta=1000000.0,
                                         sliding_window=5, num_local_experts=4,
                                         num_experts_per_tok=2, output_router_logits=False,
                                         router_jitter_noise=0.0)
        cfg._experts_implementation = "eager"
        cls = transformers.MixtralForCausalLM
        disk = torch.bfloat16
    elif kind == "mistral":
        cfg = transformers.MistralConfig(**shapes(kind), rms_norm_eps=1e-5,
                                         tie_word_embeddings=False, rope_theta=1000000.0,
                                         sliding_window=5)
        cls = transformers.MistralForCausalLM
        disk = torch.bfloat16
    else:
        cfg = transformers.Qwen2Config(**shapes(kind), rms_norm_eps=1e-6, tie_word_embeddings=False,
                                       rope_theta=1000000.0, use_sliding_window=False)
        cls = transformers.Qwen2ForCausalLM
        disk = torch.float32 if kind == "vocab" else torch.float16
    cfg._attn_implementation = "eager"
    model = cls(cfg).to(torch.float32)
    if kind in ("qwen3moe", "qwen3moeaux", "mixtral"):
        model.config._experts_implementation = "eager"  # float64 too (grouped_mm: no)
    randomize(model, torch, gen)
    if cfg.tie_word_embeddings:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tensors = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(p.to(disk).to(torch.float32))  # train from exactly what is on disk
        for name, p, view in published(model):
            tensors[name] = view(p.detach().to(disk)).contiguous()
    # the module's names -> the published ones (experts one by one)
    modname = {id(p): n for n, p in model.named_parameters()}
    pub = [(n, modname[id(p)], view) for n, p, view in published(model)]

    def as_published(named):
        return {n: view(named[mn]).contiguous() for n, mn, view in pub}

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

    dseed = {"llama": 21, "qwen2": 22, "tied": 23, "vocab": 24, "tiedvocab": 25, "qwen3": 26,
             "phi3": 27, "olmo2": 28, "gemma": 29, "mistral": 30, "gemma2": 32,
             "gemma3": 34, "olmo3": 36, "qwen3moe": 34, "qwen3moeaux": 36, "mixtral": 38}[kind]
    init = as_published({n: p.detach().clone() for n, p in model.named_parameters()})
    fresh = copy.deepcopy(model)  # the same values, ties kept

    def run(reverse, flip, dtype=torch.float32, m=None):
        m = m or copy.deepcopy(fresh).to(dtype)
        st = train(m, list(m.parameters()), cfg.vocab_size, torch.Generator().manual_seed(dseed),
                   kind if m is model else "-", torch, reverse=reverse, flip=flip)
        return as_published({n: p.detach() for n, p in m.named_parameters()}), st

    made = []

    def run32(reverse, flip):  # the first run trains `model` (saved below), the others copies
        made.append(reverse)
        return run(reverse, flip, m=model if len(made) == 1 else None)
    variants = run_variants(torch, run32)
    steps = variants[0][1]
    final64, steps64 = run(False, False, torch.float64)
    assert all(a["ids"] == b["ids"] for a, b in zip(steps, steps64))
    f64, noise, bounds, update64 = noise_and_bounds(torch, init, variants, final64, steps64)
    if "aux_loss" in steps64[0]:
        # the load-balancing loss apart: its own noise over the orders
        f64["aux_loss"] = [s["aux_loss"] for s in steps64]
        noise["aux_loss"] = max(max(rel(a["aux_loss"], b["aux_loss"]) for _, st in variants
                                    for a, b in zip(st, steps64)), 2.0 ** -24)
        bounds["aux_loss"] = BOUND_FACTOR * noise["aux_loss"]
    save_file(as_published({n: p.detach() for n, p in model.named_parameters()}),
              os.path.join(d, "final.safetensors"), metadata=meta)
    save_file(update64, os.path.join(d, "update64.safetensors"), metadata=meta)
    ref = {
        "generator": "scripts/gen_train_fixtures.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "precision": "float32, eager attention, CPU",
        "weights_dtype": {"llama": "bf16", "qwen2": "f16", "tied": "f32", "vocab": "f32",
                          "tiedvocab": "f32", "qwen3": "bf16", "phi3": "bf16",
                          "olmo2": "bf16", "gemma": "f32", "mistral": "bf16",
                          "gemma2": "bf16", "gemma3": "bf16", "olmo3": "bf16",
                          "qwen3moe": "bf16", "qwen3moeaux": "bf16", "mixtral": "bf16"}[kind],
        "micro_batch": MICRO, "accumulation": ACCUM, "seq_len": SEQ,
        "float64": f64,
        "noise": noise,
        "bounds": bounds,
        "steps": steps,
    }
    with open(os.path.join(d, "train-reference.json"), "w") as f:
        json.dump(ref, f, indent=1)


def check_export(zinc, torch, transformers, only=None):
    """Fine-tunes each ft-* folder with zinc (10 steps from its weights,
    checkpoint at the end), exports it as fp32 and bf16, loads each export in
    transformers with default arguments (the dtype must be the one written)
    and compares transformers' mean cross-entropy on fresh token windows with
    `zinc eval` on the same export and ids (only: that ft-* kind alone)."""
    import subprocess
    import tempfile
    from gen_fixtures import write_tokens
    fx = os.path.join(ROOT, "tests", "fixtures")
    bad = 0
    for kind in ("llama", "qwen2", "tied", "vocab", "tiedvocab", "qwen3", "phi3",
                 "olmo2", "gemma", "mistral", "gemma2", "gemma3", "olmo3", "qwen3moe",
                 "mixtral"):
        if only and kind != only:
            continue
        src = os.path.join(fx, "ft-" + kind)
        V = json.load(open(os.path.join(src, "config.json")))["vocab_size"]
        with tempfile.TemporaryDirectory() as tmp:
            def run(*args):
                r = subprocess.run([zinc] + list(args), cwd=tmp, capture_output=True, text=True)
                if r.returncode:
                    sys.exit("check-export: zinc %s failed:\n%s%s" % (" ".join(args), r.stdout, r.stderr))
                return r.stdout
            run("train", os.path.join(src, "train-config.json"), "--model", src, "--steps", "10",
                "--data", "synthetic", "--set", "train.checkpoint.dir=\"ck\"")
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
    ap.add_argument("--only", choices=("llama", "qwen2", "tied", "vocab", "tiedvocab", "qwen3", "phi3",
                 "olmo2", "gemma", "mistral", "gemma2", "gemma3", "olmo3", "qwen3moe",
                 "qwen3moeaux", "mixtral"),
                    help="make this fixture only")
    args = ap.parse_args()
    ensure_torch()
    if args.check_export:
        import torch
        import transformers
        check_export(os.path.abspath(args.check_export), torch, transformers, args.only)
        return
    import torch
    import transformers
    from safetensors.torch import save_file
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one summation order, run to run
    for kind in ("llama", "qwen2", "tied", "vocab", "tiedvocab", "qwen3", "phi3",
                 "olmo2", "gemma", "mistral", "gemma2", "gemma3", "olmo3", "qwen3moe",
                 "qwen3moeaux", "mixtral"):
        if not args.only or kind == args.only:
            make(kind, args.out, torch, transformers, save_file)


if __name__ == "__main__":
    main()
