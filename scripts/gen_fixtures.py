#!/usr/bin/env python3
"""Generates zinc's PyTorch reference fixtures in tests/fixtures/.

Two tiny random decoders, built and run by Hugging Face transformers:
  tiny-llama  llama, GQA 4/2 heads, llama3 rope_scaling, untied lm_head,
              weights stored as bf16 (one model.safetensors)
  tiny-qwen2  qwen2, GQA 4/2 heads, q/k/v bias, tied embeddings, weights
              stored as fp32 in two shards + model.safetensors.index.json
  tiny-mistral mistral (the Llama block under its own model_type), GQA 4/2,
              sliding_window null, untied, weights as fp32 (one file)
  tiny-qwen3  qwen3 (per-head q/k RMSNorm before RoPE), GQA 4/2, head_dim 24
              (heads x head_dim 96 wider than hidden 64), tied embeddings,
              weights as bf16 (one file); some targets -100
  tiny-phi3   phi3 (qkv_proj and gate_up_proj stored fused), GQA 4/2,
              untied, weights as fp32 (one file)
  tiny-mistral-window  mistral with sliding_window 5 against sequences of
              16: each query sees its last 5 keys (transformers' sliding
              mask), otherwise tiny-mistral's shape, fp32
  tiny-gemma  gemma ((1 + w) RMSNorm, GeGLU with tanh GELU, the embedding
              times sqrt(hidden)), MQA 4/1, head_dim 24, tied, pad id 0, fp32
  tiny-gemma2 gemma2 (gemma's pieces, four norms a layer, scores scaled by
              query_pre_attn_scalar 32 (head_dim 24), attention logits capped
              at 8 (|scores| 6.5 on average), final logits at 3 (|logits| 1.3),
              a 5-key window on layers 0 and 2 of 4
              over 16-token sequences), GQA 4/2, tied, pad id 0, fp32
  tiny-olmo2  olmo2 (norms after attention and the MLP, none before; RMSNorm
              over the whole q and k projections), GQA 4/2, untied, pad id 1,
              weights as bf16 (one file)
  tiny-gemma3 gemma3_text (gemma2's four norms, (1 + w) per-head q/k norm,
              no soft-caps, query_pre_attn_scalar 32 (head_dim 24), a 5-key
              window on layers 0, 1 and 3 of 4 (sliding_window_pattern 3)
              rotating with rope_local_base_freq 100, layer 2 full with
              rope_theta 10000 and linear scaling by 4), GQA 4/2, tied, pad
              id 0, fp32
  tiny-olmo3  olmo3 (olmo2's block, a 5-key window on layers 0-2 of 4,
              layer 3 full with YaRN: factor 4 over 32 original positions,
              the default attention_factor 0.1 ln 4 + 1), GQA 4/2, untied,
              pad id 1, fp32
  tiny-qwen3moe qwen3_moe (qwen3's attention, mixture-of-experts MLPs: 8
              experts of width 24, 2 a token, renormalized), 3 layers, the
              middle one dense (mlp_only_layers), GQA 4/2, head_dim 24,
              untied, weights as bf16 (one file, the published per-expert
              names); each router is solved so that on this batch every
              token's second expert leads its third by 1.5 logits (no
              precision flips a routing decision); some targets -100
  tiny-mixtral mixtral (Mistral's attention, every MLP 4 experts of width 32,
              2 a token, always renormalized, the routing weights kept fp32),
              2 layers, GQA 4/2, untied, bf16, the published
              block_sparse_moe.experts.E.w1/w2/w3 names; routers solved as
              tiny-qwen3moe's
For each: config.json (as transformers writes it), the weights, and
reference.json with the batch (inputs, targets; some targets -100 for
qwen2), the mean cross-entropy, a slice of logits and the L2 norm of every
parameter's gradient. The reference runs in float64 on the very values
stored on disk, so it is the exact answer that zinc's fp32 must approach.

Bounds (tests/README.md): the same pass runs in float32 (as given, and
with the batch's rows in reverse order: other sums) and in bfloat16
(weights and activations, the logits upcast for the loss as transformers
does). reference.json's "noise" holds, per precision, the largest distance
of those passes from float64: "loss" (the loss and the eval loss, relative),
"logits" (relative L2 of each recorded row), "grad_norm" (relative, over
every parameter); "bounds" holds BOUND_FACTOR times each, what
tests/test_model_ref.h allows zinc's pass in that precision.
tokens.tok (ZNTOKENS format, docs/tokens.md) holds the shared token stream:
its (count-1)/seq_len windows are exactly the batch rows.

With --check-export ZINC (the zinc binary) it instead checks `zinc export`:
it trains the embedded tiny model 3 steps with a checkpoint, exports it as
fp32, loads the folder with transformers (float64), and compares the mean
cross-entropy of its logits on token windows with `zinc eval` on the same
folder and ids (zinc's forward), and the exported embedding with the
checkpoint's fp32 master bytes.

Usage: python3 scripts/gen_fixtures.py [--out tests/fixtures] [--kinds llama,qwen2,mistral]
       (--kinds mistral makes only that fixture, against the committed
       tokens.tok, and leaves the others as they are)
       python3 scripts/gen_fixtures.py --check-export build/zinc
Without torch importable, it makes .venv-fixtures/ beside the repository's
top folder, installs scripts/requirements-fixtures.txt there with pip and
re-runs itself inside it. Only PyPI is needed. CI never runs this.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-fixtures")


def ensure_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import safetensors  # noqa: F401
        return
    except ImportError:
        pass
    py = os.path.join(VENV, "bin", "python")
    if os.path.abspath(sys.executable) == os.path.abspath(py):
        sys.exit("gen_fixtures: torch/transformers still missing inside " + VENV)
    if not os.path.exists(py):
        print("gen_fixtures: creating", VENV, flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
    req = os.path.join(ROOT, "scripts", "requirements-fixtures.txt")
    subprocess.check_call([py, "-m", "pip", "install", "-q", "-r", req])
    os.execv(py, [py] + sys.argv)


VOCAB = 320
# zinc may be this many times as far from float64 as PyTorch is in the same
# precision (the rule of tests/README.md, as in gen_train_fixtures.py)
BOUND_FACTOR = 4
SEQ = 16
BATCH = 2


def write_tokens(path, ids, vocab):
    with open(path, "wb") as f:
        f.write(b"ZNTOKENS")
        f.write(struct.pack("<IIQII", 1, 2, len(ids), vocab, 0))
        f.write(struct.pack("<%dH" % len(ids), *ids))


def randomize(model, torch, gen):
    """Weights large enough that every op matters (HF's 0.02 init makes the
    logits nearly uniform, which would make a loss comparison weak)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            elif "embed_tokens" in name:
                # Tied: the same matrix makes the logits, keep them O(1)
                # (Gemma's rows enter the layers times sqrt(hidden): less).
                std = 0.3 if model.config.tie_word_embeddings else 1.0
                if model.config.model_type in ("gemma", "gemma2", "gemma3_text"):
                    std = 0.1
                p.copy_(std * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * (1.5 / fan_in ** 0.5))


def published(model):
    """(name, parameter, view) in the names published checkpoints use:
    transformers 5 keeps a layer's experts as 3-D tensors (experts.gate_up_proj
    [E][2I][H], experts.down_proj [E][H][I]), the checkpoints and zinc as
    experts.E.gate_proj / up_proj / down_proj.weight."""
    out = []
    # Mixtral's checkpoints: block_sparse_moe.gate, experts.E.w1 (gate),
    # w3 (up), w2 (down)
    mix = getattr(model.config, "model_type", "") == "mixtral"
    names = ("w1", "w3", "w2") if mix else ("gate_proj", "up_proj", "down_proj")
    for name, p in model.named_parameters():
        pub = name.replace(".mlp.", ".block_sparse_moe.") if mix else name
        if name.endswith("mlp.experts.gate_up_proj"):
            pre, half = pub[:-len("gate_up_proj")], p.shape[1] // 2
            for e in range(p.shape[0]):
                out.append((pre + "%d.%s.weight" % (e, names[0]), p,
                            lambda t, e=e: t[e, :half]))
                out.append((pre + "%d.%s.weight" % (e, names[1]), p,
                            lambda t, e=e: t[e, half:]))
        elif name.endswith("mlp.experts.down_proj"):
            pre = pub[:-len("down_proj")]
            for e in range(p.shape[0]):
                out.append((pre + "%d.%s.weight" % (e, names[2]), p, lambda t, e=e: t[e]))
        else:
            out.append((pub, p, lambda t: t))
    return out


def decisive_routers(model, inputs, torch, gen, margin=1.5):
    """Sets each sparse layer's router, first to last, so that on `inputs`
    its logits are chosen values: per token a random order of the experts,
    the first two at 2.5 + u and 1 + u (u in [0, 0.5)), the rest at most
    -0.5, solved as the least-norm W with h W^T = logits (32 tokens, hidden
    64: exact). A routing decision then moves only with a 1.5-logit error,
    which no precision here makes."""
    layers = model.model.layers
    for li, layer in enumerate(layers):
        if not hasattr(layer.mlp, "gate"):
            continue
        seen = {}
        hook = layer.post_attention_layernorm.register_forward_hook(
            lambda mod, a, out: seen.__setitem__("h", out.detach()))
        with torch.no_grad():
            model(input_ids=inputs)
        hook.remove()
        h = seen["h"].reshape(-1, seen["h"].shape[-1])
        E, k = layer.mlp.gate.weight.shape[0], model.config.num_experts_per_tok
        want = torch.empty(h.shape[0], E, dtype=torch.float64)
        for t in range(h.shape[0]):
            order = torch.randperm(E, generator=gen)
            u = 0.5 * torch.rand(1, generator=gen, dtype=torch.float64).item()
            vals = [2.5 + u, 1.0 + u] + [-0.5 - 0.5 * j for j in range(E - k)]
            for j, e in enumerate(order.tolist()):
                want[t, e] = vals[j]
        w = torch.linalg.lstsq(h, want).solution.T  # [E][H], h w^T = want
        with torch.no_grad():
            layer.mlp.gate.weight.copy_(w)


def route_margin(model, inputs, torch):
    """The smallest lead of a token's k-th router logit over its next, over
    every sparse layer (the stored weights' forward)."""
    got = []
    hooks = [l.mlp.gate.register_forward_hook(lambda mod, a, out: got.append(out[0].detach()))
             for l in model.model.layers if hasattr(l.mlp, "gate")]
    with torch.no_grad():
        model(input_ids=inputs)
    for hk in hooks:
        hk.remove()
    k = model.config.num_experts_per_tok
    return min((g.sort(dim=-1, descending=True).values[:, k - 1] -
                g.sort(dim=-1, descending=True).values[:, k]).min().item() for g in got)


def low_precision_pass(model64, dtype, inputs, targets, eval_targets, positions, torch,
                       flip=False):
    """The reference pass on a copy of model64 in dtype (flip: the batch's
    rows in reverse order). Returns (loss, eval_loss, logits rows, grad
    norms by name), all as Python floats."""
    import copy
    m = copy.deepcopy(model64).to(dtype)
    m.train()
    x, y, ey = inputs, targets, eval_targets
    if flip:
        x, y, ey = inputs.flip(0), targets.flip(0), eval_targets.flip(0)
    logits = m(input_ids=x).logits.float()  # transformers' loss upcasts too
    if flip:
        logits, y, ey = logits.flip(0), y.flip(0), ey.flip(0)
    ce = torch.nn.functional.cross_entropy
    loss = ce(logits.reshape(-1, VOCAB), y.reshape(-1), ignore_index=-100)
    loss.backward()
    with torch.no_grad():
        ev = ce(logits.reshape(-1, VOCAB), ey.reshape(-1)).item()
    rows = [logits[b, t].double() for b, t in positions]
    norms = {n: v(p.grad).double().norm().item() for n, p, v in published(m)}
    return loss.item(), ev, rows, norms


def make(kind, out, tokens, torch, transformers, save_file):
    gen = torch.Generator().manual_seed({"llama": 1, "qwen2": 2, "mistral": 3, "qwen3": 4,
                                       "phi3": 5, "olmo2": 6, "mistral-window": 7,
                                       "gemma": 8, "gemma2": 9, "gemma3": 10, "olmo3": 11,
                                       "qwen3moe": 10, "mixtral": 11}[kind])
    common = dict(hidden_size=64, intermediate_size=128 if kind == "llama" else 96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=VOCAB, max_position_embeddings=64, hidden_act="silu")
    if kind == "llama":
        cfg = transformers.LlamaConfig(
            **common, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
            rope_theta=10000.0)
        cls = transformers.LlamaForCausalLM
    elif kind in ("mistral", "mistral-window"):
        cfg = transformers.MistralConfig(**common, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                         rope_theta=1000000.0,
                                         sliding_window=5 if kind == "mistral-window" else None)
        cls = transformers.MistralForCausalLM
    elif kind == "qwen3":
        cfg = transformers.Qwen3Config(**common, head_dim=24, rms_norm_eps=1e-6,
                                       tie_word_embeddings=True, rope_theta=1000000.0,
                                       attention_bias=False, use_sliding_window=False)
        cls = transformers.Qwen3ForCausalLM
    elif kind == "phi3":
        # token ids inside the tiny vocabulary (Phi3Config's are 32000's)
        cfg = transformers.Phi3Config(**common, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                      rope_theta=250000.0, bos_token_id=1, eos_token_id=2,
                                      pad_token_id=0, sliding_window=None)
        cls = transformers.Phi3ForCausalLM
    elif kind == "olmo2":
        cfg = transformers.Olmo2Config(**common, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                       rope_theta=500000.0, attention_bias=False,
                                       pad_token_id=1, bos_token_id=None, eos_token_id=2)
        cls = transformers.Olmo2ForCausalLM
    elif kind == "gemma":
        g = dict(common, num_key_value_heads=1)
        cfg = transformers.GemmaConfig(**dict(g, hidden_act="gelu_pytorch_tanh"), head_dim=24,
                                       rms_norm_eps=1e-6, tie_word_embeddings=True,
                                       rope_theta=10000.0, attention_bias=False, pad_token_id=0,
                                       bos_token_id=2, eos_token_id=1)
        cls = transformers.GemmaForCausalLM
    elif kind == "gemma2":
        # every Gemma 2 piece biting: caps the scores and logits reach, a
        # scalar other than head_dim, windows shorter than the sequence on
        # alternate layers (Gemma2Config's default layer_types)
        g = dict(common, num_hidden_layers=4)
        cfg = transformers.Gemma2Config(**dict(g, hidden_act="gelu_pytorch_tanh"), head_dim=24,
                                        hidden_activation="gelu_pytorch_tanh",
                                        rms_norm_eps=1e-6, tie_word_embeddings=True,
                                        rope_theta=10000.0, attention_bias=False,
                                        query_pre_attn_scalar=32, attn_logit_softcapping=8.0,
                                        final_logit_softcapping=3.0, sliding_window=5,
                                        pad_token_id=0, bos_token_id=2, eos_token_id=1)
        cls = transformers.Gemma2ForCausalLM
    elif kind == "gemma3":
        # the two RoPE bases both biting (a local base far from the global
        # one, the global one scaled), windows shorter than the sequence on
        # the sliding layers, the pattern from sliding_window_pattern
        g = dict(common, num_hidden_layers=4)
        cfg = transformers.Gemma3TextConfig(**dict(g, hidden_act="gelu_pytorch_tanh"),
                                            head_dim=24, hidden_activation="gelu_pytorch_tanh",
                                            rms_norm_eps=1e-6, tie_word_embeddings=True,
                                            rope_theta=10000.0, rope_local_base_freq=100.0,
                                            rope_scaling={"rope_type": "linear", "factor": 4.0},
                                            attention_bias=False, query_pre_attn_scalar=32,
                                            sliding_window=5, sliding_window_pattern=3,
                                            pad_token_id=0, bos_token_id=2, eos_token_id=1)
        cls = transformers.Gemma3ForCausalLM
    elif kind == "olmo3":
        # YaRN's ramp inside the tiny head (dims 0-2 of 12 between the
        # unscaled and the / factor frequencies), given per layer type
        g = dict(common, num_hidden_layers=4, max_position_embeddings=128)
        rope = {"full_attention": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 32},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
        cfg = transformers.Olmo3Config(**g, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                       rope_parameters=rope, attention_bias=False,
                                       sliding_window=5, pad_token_id=1, bos_token_id=None,
                                       eos_token_id=2)
        cls = transformers.Olmo3ForCausalLM
    elif kind == "qwen3moe":
        # the experts as transformers' own loop computes them (its eager
        # path: one expert at a time over the rows routed to it)
        cfg = transformers.Qwen3MoeConfig(**dict(common, num_hidden_layers=3), head_dim=24,
                                          rms_norm_eps=1e-6, tie_word_embeddings=False,
                                          rope_theta=1000000.0, attention_bias=False,
                                          use_sliding_window=False, num_experts=8,
                                          num_experts_per_tok=2, moe_intermediate_size=24,
                                          norm_topk_prob=True, decoder_sparse_step=1,
                                          mlp_only_layers=[1], output_router_logits=False)
        cls = transformers.Qwen3MoeForCausalLM
    elif kind == "mixtral":
        cfg = transformers.MixtralConfig(**dict(common, intermediate_size=32), rms_norm_eps=1e-5,
                                         tie_word_embeddings=False, rope_theta=1000000.0,
                                         sliding_window=None, num_local_experts=4,
                                         num_experts_per_tok=2, output_router_logits=False,
                                         router_jitter_noise=0.0)
        cls = transformers.MixtralForCausalLM
    else:
        cfg = transformers.Qwen2Config(**common, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                       rope_theta=1000000.0, use_sliding_window=False)
        cls = transformers.Qwen2ForCausalLM
    cfg._attn_implementation = "eager"
    if kind in ("qwen3moe", "mixtral"):
        cfg._experts_implementation = "eager"
    model = cls(cfg).to(torch.float64)
    if kind in ("qwen3moe", "mixtral"):
        model.config._experts_implementation = "eager"  # float64 (grouped_mm takes none)
    randomize(model, torch, gen)
    if kind in ("qwen2", "qwen3", "gemma", "gemma2", "gemma3"):
        model.tie_weights()

    # What goes on disk, and the exact values the reference computes with.
    disk_dtype = (torch.bfloat16 if kind in ("llama", "qwen3", "olmo2", "qwen3moe", "mixtral")
                  else torch.float32)
    # The batch: rows are the loader's windows of tokens.tok.
    ids = torch.tensor(tokens, dtype=torch.long)
    inputs = torch.stack([ids[b * SEQ: b * SEQ + SEQ] for b in range(BATCH)])
    targets = torch.stack([ids[b * SEQ + 1: b * SEQ + SEQ + 1] for b in range(BATCH)])
    if kind in ("qwen3moe", "mixtral"):
        decisive_routers(model, inputs, torch, gen)
    tensors = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            q = p.to(disk_dtype)
            p.copy_(q.to(torch.float64))
        for name, p, view in published(model):
            tensors[name] = view(p.detach().to(disk_dtype)).contiguous()
    if kind in ("qwen3moe", "mixtral"):
        print("tiny-%s: smallest routing lead %.3f logits" % (kind, route_margin(model, inputs,
                                                                                torch)))
    if cfg.tie_word_embeddings:
        assert "lm_head.weight" not in tensors

    d = os.path.join(out, "tiny-" + kind)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    cfg.save_pretrained(d)
    meta = {"format": "pt"}
    if kind in ("llama", "mistral", "qwen3", "phi3", "olmo2", "mistral-window", "gemma",
                "gemma2", "gemma3", "olmo3", "qwen3moe", "mixtral"):
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata=meta)
    else:
        names = sorted(tensors)
        first = [n for n in names if n.startswith("model.embed_tokens") or n.startswith("model.layers.0.")]
        rest = [n for n in names if n not in first]
        files = {"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": rest}
        wm = {}
        total = 0
        for fname, group in files.items():
            save_file({n: tensors[n] for n in group}, os.path.join(d, fname), metadata=meta)
            for n in group:
                wm[n] = fname
                total += tensors[n].numel() * tensors[n].element_size()
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2, sort_keys=True)

    eval_targets = targets.clone()
    if kind in ("qwen2", "qwen3", "qwen3moe"):
        targets[0, 3] = -100
        targets[1, 0] = -100
        targets[1, 15] = -100

    model.train()
    model.zero_grad()
    logits = model(input_ids=inputs).logits  # [B, T, V] float64
    ce = torch.nn.functional.cross_entropy
    loss = ce(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=-100)
    loss.backward()
    with torch.no_grad():
        eval_loss = ce(logits.reshape(-1, VOCAB), eval_targets.reshape(-1)).item()
    positions = [[0, 0], [0, 7], [0, 15], [1, 5], [1, 15]]
    model_eval = model.training
    noise, bounds = {}, {}
    for label, dtype, flips in (("float32", torch.float32, (False, True)),
                                ("bfloat16", torch.bfloat16, (False, True))):
        nl = ng = nlg = 0.0
        for flip in flips:
            l, ev, rows, norms = low_precision_pass(model, dtype, inputs, targets, eval_targets,
                                                    positions, torch, flip)
            nl = max(nl, abs(l - loss.item()) / abs(loss.item()),
                     abs(ev - eval_loss) / abs(eval_loss))
            for r, (b, t) in zip(rows, positions):
                want = logits[b, t].detach()
                nlg = max(nlg, ((r - want).norm() / want.norm()).item())
            for n, p, v in published(model):
                g = v(p.grad).norm().item()
                ng = max(ng, abs(norms[n] - g) / g)
        # a loss zinc reports as a float32 is half an ulp from any other
        # at best: no noise below float32's unit roundoff
        nl = max(nl, 2.0 ** -24)
        noise[label] = {"loss": nl, "logits": nlg, "grad_norm": ng}
        bounds[label] = {k: BOUND_FACTOR * v for k, v in noise[label].items()}
        if dtype == torch.bfloat16:
            # the loss, a mean over 32 tokens of bf16 roundings, is one
            # sample too few to bound by: its noise was 1.6e-4 on
            # tiny-llama and 1.4e-3 on tiny-qwen2, 9x apart at the same
            # precision; it takes the logits' bound it is computed from
            bounds[label]["loss"] = BOUND_FACTOR * max(nl, nlg)
        print("tiny-%s %s noise: loss %.1e, logits %.1e, grad norms %.1e" % (kind, label, nl, nlg,
                                                                             ng))
    assert model_eval == model.training
    ref = {
        "generator": "scripts/gen_fixtures.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "precision": "float64 on the stored values",
        "weights_dtype": ("bf16" if kind in ("llama", "qwen3", "olmo2", "qwen3moe", "mixtral")
                          else "f32"),
        "model_type": cfg.model_type,
        "batch": BATCH,
        "seq_len": SEQ,
        "inputs": inputs.reshape(-1).tolist(),
        "targets": targets.reshape(-1).tolist(),
        "loss": loss.item(),
        "eval_loss": eval_loss,
        "logits": {"positions": positions,
                   "values": [logits[b, t].tolist() for b, t in positions]},
        "grad_norms": {n: v(p.grad).norm().item() for n, p, v in published(model)},
        "noise": dict(noise, rule="largest distance of PyTorch's pass in that precision from "
                      "this float64 one (scripts/gen_fixtures.py, tests/README.md)"),
        "bounds": dict(bounds, factor=BOUND_FACTOR),
    }
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print("%s: loss %.6f, eval_loss %.6f, %d parameters" %
          (d, ref["loss"], eval_loss, sum(p.numel() for p in model.parameters())))


def check_export(zinc, torch, transformers):
    """Exports a freshly trained checkpoint and compares transformers' loss
    (from its logits) with zinc's forward on the same ids."""
    import tempfile
    import numpy as np
    seq, windows = 32, 4
    with tempfile.TemporaryDirectory() as tmp:
        def run(*args):
            r = subprocess.run([zinc] + list(args), cwd=tmp, capture_output=True, text=True)
            if r.returncode:
                sys.exit("check-export: zinc %s failed:\n%s%s" % (" ".join(args), r.stdout, r.stderr))
            return r.stdout
        run("train", "--steps", "3", "--set", "train.device=host", "--set", "train.checkpoint.dir=ck")
        run("export", "ck", "--out", "hf", "--dtype", "fp32", "--shard-size", "4MiB")
        g = torch.Generator().manual_seed(99)
        ids = torch.randint(0, VOCAB, (windows * seq + 1,), generator=g).tolist()
        write_tokens(os.path.join(tmp, "ids.tok"), ids, VOCAB)
        out = run("eval", "--model", "hf", "--data", "ids.tok", "--seq-len", str(seq),
                  "--batch", "1", "--device", "host", "--json")
        zinc_loss = json.loads(out)["loss"]
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.join(tmp, "hf"), dtype=torch.float64)
        model.eval()
        t = torch.tensor(ids, dtype=torch.long)
        x = torch.stack([t[w * seq: w * seq + seq] for w in range(windows)])
        y = torch.stack([t[w * seq + 1: w * seq + seq + 1] for w in range(windows)])
        with torch.no_grad():
            logits = model(input_ids=x).logits
        ref = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                y.reshape(-1)).item()
        # the exported embedding is the checkpoint's fp32 master, byte for byte
        step = open(os.path.join(tmp, "ck", "latest")).read().strip()
        master = np.fromfile(os.path.join(tmp, "ck", step, "rank-0", "master.bin"), dtype="<f4")
        emb = model.model.embed_tokens.weight.detach().to(torch.float32).numpy().reshape(-1)
        same = np.array_equal(master[:emb.size], emb)
        print("check-export: transformers %s loads the export; mean xent over %d x %d tokens: "
              "transformers %.6f, zinc %.6f (|diff| %.2e); embedding == master bytes: %s"
              % (transformers.__version__, windows, seq, ref, zinc_loss, abs(ref - zinc_loss), same))
        if abs(ref - zinc_loss) > 1e-4 * max(1.0, abs(ref)) or not same:
            sys.exit("check-export: FAILED")
        print("check-export: ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures"))
    ap.add_argument("--check-export", metavar="ZINC", help="check `zinc export` (see above)")
    ap.add_argument("--kinds", default="llama,qwen2",
                    help="fixtures to make: llama, qwen2, mistral, qwen3, phi3, olmo2, "
                         "mistral-window, gemma, gemma2, gemma3, olmo3, qwen3moe, mixtral "
                         "(comma-separated)")
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
    g = torch.Generator().manual_seed(1234)
    tokens = torch.randint(0, VOCAB, (BATCH * SEQ + 1,), generator=g).tolist()
    os.makedirs(args.out, exist_ok=True)
    kinds = args.kinds.split(",")
    tok = os.path.join(args.out, "tokens.tok")
    if {"llama", "qwen2"} & set(kinds) or not os.path.exists(tok):
        write_tokens(tok, tokens, VOCAB)
    else:
        # a new fixture beside the committed ones: the same token stream
        with open(tok, "rb") as f:
            raw = f.read()
        probe = os.path.join(args.out, ".tokens-probe.tok")
        write_tokens(probe, tokens, VOCAB)
        with open(probe, "rb") as f:
            same = f.read() == raw
        os.remove(probe)
        if not same:
            sys.exit("gen_fixtures: this torch draws another token stream than the committed "
                     "tokens.tok; regenerate every fixture (--kinds llama,qwen2,mistral,qwen3)")
    for kind in kinds:
        make(kind, args.out, tokens, torch, transformers, save_file)


if __name__ == "__main__":
    main()
