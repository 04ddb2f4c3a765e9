#!/usr/bin/env python3
"""Writes a model folder for `zinc bench load` and scale runs: an HF
config.json (copied from --config) and safetensors shards holding every
tensor zinc's Llama/Qwen2 decoder expects for that config, filled with
seeded pseudo-random finite bf16/fp16/fp32 values (normal-ish, std 0.02).

Only the standard library: no torch. The values are not a trained model;
they are bytes that load exactly like a transformers checkpoint of that
shape (same names, shapes, dtypes, header layout, sharded index).

Usage: python3 scripts/make_bench_model.py --config tests/fixtures/configs/qwen2.5-0.5b.json \
           --out /tmp/qwen-0.5b [--dtype bf16] [--shard-size 2GiB] [--layers N]
"""
import argparse
import json
import os
import random
import struct


def tensors(cfg):
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or H // nh
    inter = cfg["intermediate_size"]
    V = cfg["vocab_size"]
    qwen = cfg["model_type"] == "qwen2"
    bias = qwen or cfg.get("attention_bias", False)
    out = [("model.embed_tokens.weight", [V, H])]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", [H]),
                (p + "self_attn.q_proj.weight", [nh * hd, H]),
                (p + "self_attn.k_proj.weight", [nkv * hd, H]),
                (p + "self_attn.v_proj.weight", [nkv * hd, H]),
                (p + "self_attn.o_proj.weight", [H, nh * hd])]
        if bias:
            out += [(p + "self_attn.q_proj.bias", [nh * hd]),
                    (p + "self_attn.k_proj.bias", [nkv * hd]),
                    (p + "self_attn.v_proj.bias", [nkv * hd])]
        if not qwen and cfg.get("attention_bias", False):
            out += [(p + "self_attn.o_proj.bias", [H])]
        out += [(p + "post_attention_layernorm.weight", [H]),
                (p + "mlp.gate_proj.weight", [inter, H]),
                (p + "mlp.up_proj.weight", [inter, H]),
                (p + "mlp.down_proj.weight", [H, inter])]
    out += [("model.norm.weight", [H])]
    if not cfg.get("tie_word_embeddings", False):
        out += [("lm_head.weight", [V, H])]
    return out


def pattern(dtype, nbytes, seed):
    """A block of finite values of about std 0.02 (random exponents 117-122
    for bf16/fp32, 11-16 for fp16), repeated to fill each tensor."""
    rnd = random.Random(seed)
    n = nbytes // (4 if dtype == "F32" else 2)
    if dtype == "BF16":
        vals = [(rnd.getrandbits(1) << 15) | (rnd.randint(117, 122) << 7) | rnd.getrandbits(7)
                for _ in range(n)]
        return struct.pack("<%dH" % n, *vals)
    if dtype == "F16":
        vals = [(rnd.getrandbits(1) << 15) | (rnd.randint(11, 16) << 10) | rnd.getrandbits(10)
                for _ in range(n)]
        return struct.pack("<%dH" % n, *vals)
    vals = [(rnd.getrandbits(1) << 31) | (rnd.randint(117, 122) << 23) | rnd.getrandbits(23)
            for _ in range(n)]
    return struct.pack("<%dI" % n, *vals)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--shard-size", default="2GiB")
    ap.add_argument("--layers", type=int, help="override num_hidden_layers")
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    if a.layers:
        cfg["num_hidden_layers"] = a.layers
    dt = {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}[a.dtype]
    es = 4 if dt == "F32" else 2
    cfg["torch_dtype"] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[a.dtype]
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    shard = int(a.shard_size[:-3]) * units[a.shard_size[-3:]] if a.shard_size[-3:] in units \
        else int(a.shard_size)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    ts = tensors(cfg)
    groups, cur, size = [], [], 0
    for name, shape in ts:
        nb = es
        for s in shape:
            nb *= s
        if cur and size + nb > shard:
            groups.append(cur)
            cur, size = [], 0
        cur.append((name, shape, nb))
        size += nb
    groups.append(cur)
    block = pattern(dt, 1 << 20, 1)
    wm, total = {}, 0
    for gi, g in enumerate(groups):
        fname = "model-%05d-of-%05d.safetensors" % (gi + 1, len(groups)) if len(groups) > 1 \
            else "model.safetensors"
        hdr, off = {"__metadata__": {"format": "pt"}}, 0
        for name, shape, nb in g:
            hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
            off += nb
            wm[name] = fname
        h = json.dumps(hdr, separators=(",", ":")).encode()
        h += b" " * ((8 - len(h) % 8) % 8)
        with open(os.path.join(a.out, fname), "wb") as f:
            f.write(struct.pack("<Q", len(h)))
            f.write(h)
            for k, (name, shape, nb) in enumerate(g):
                # each tensor starts at another place in the pattern
                rot = (k * 4099 * es) % len(block)
                rb = block[rot:] + block[:rot]
                left = nb
                while left:
                    w = rb[:min(left, len(rb))]
                    f.write(w)
                    left -= len(w)
        total += off
        print("%s: %d tensors, %.2f GB" % (fname, len(g), off / 1e9))
    if len(groups) > 1:
        with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=1)
    print("%s: %d tensors, %.2f GB of %s" % (a.out, len(ts), total / 1e9, a.dtype))


if __name__ == "__main__":
    main()
