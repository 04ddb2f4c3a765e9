#!/usr/bin/env python3
"""Reference generations for `zinc generate` (tests/test_generate.c), made
by transformers' own generate() on the committed fixture models:

  tiny-llama            llama, llama3 rope scaling, untied, bf16 on disk
  tiny-qwen2            qwen2, q/k/v bias, tied embeddings, two shards
  tiny-mistral          mistral, untied, fp32 on disk
  tiny-qwen3            qwen3, per-head q/k norm, tied, bf16 on disk
  tiny-phi3             phi3, fused qkv_proj and gate_up_proj, fp32 on disk
  tiny-olmo2            olmo2, post-norms, full-width q/k norm, bf16 on disk
  tiny-mistral-window   mistral, sliding_window 5: the cache's keys beyond it masked
  tiny-gemma            gemma, (1 + w) norms, GeGLU, scaled embedding, tied, fp32
  tiny-gemma2           gemma2, four norms, soft-capped scores and logits, a 5-key
                        window on alternate layers over the cache, tied, fp32
  tiny-gemma3           gemma3_text, per-head q/k norm, the window and the local
                        RoPE base on 3 of 4 layers, linear-scaled global RoPE
  tiny-olmo3            olmo3, the window on 3 of 4 layers, YaRN on the full one
  tiny-qwen3moe         qwen3_moe, 8 experts, 2 a token, a dense middle layer, the
                        published per-expert tensors (transformers 5 fuses them at
                        load), bf16 on disk
  tiny-mixtral          mixtral, 4 experts, 2 a token, fp32 routing weights, the
                        published block_sparse_moe names, bf16 on disk
  lora-llama            ft-llama plus the PEFT adapter final-adapter,
                        loaded by peft (unmerged)

For each: a few prompts of different lengths (seeded random ids), the
greedy continuation of GEN_TOKENS ids (do_sample=False, the config's
eos_token_id), generated in float64 on the very values stored on disk, the
raw logits of the prefill's last row and of the last step, and per step
the gap between the two largest logits. One more greedy case uses
repetition_penalty 1.3, and one row of logits records which ids survive
transformers' sampling warpers (temperature 0.7, top_k 20, top_p 0.8).

Bounds (tests/README.md): the same generation in float32 gives the noise,
the largest distance of its logits from float64's over every step's row
("noise"); "bound" is BOUND_FACTOR times it. zinc's fp32 logits must be
within the bound of float64's, and its ids must equal transformers' up to
the first step whose top-2 gap is within the bound (there float32 itself
may pick either; "tie_step" records it, -1 when there is none).

Run with the fixtures' virtual environment (scripts/requirements-fixtures.txt):
  .venv-fixtures/bin/python scripts/gen_generate_fixtures.py [NAME...]
(NAMEs: only those fixtures, e.g. tiny-mistral)
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

FIX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
GEN_TOKENS = 32
BOUND_FACTOR = 4
PROMPT_LENS = [5, 12, 20]


def load(name, dtype):
    if name == "lora-llama":
        import peft
        base = AutoModelForCausalLM.from_pretrained(os.path.join(FIX, "ft-llama"), dtype=dtype)
        m = peft.PeftModel.from_pretrained(base, os.path.join(FIX, "lora-llama", "final-adapter"))
    else:
        # the experts as transformers' own loop runs them (grouped_mm takes
        # no float64)
        kw = ({"experts_implementation": "eager"} if "moe" in name or "mixtral" in name
              else {})
        m = AutoModelForCausalLM.from_pretrained(os.path.join(FIX, name), dtype=dtype, **kw)
    return m.eval()


def generate(m, ids, eos, **kw):
    with torch.no_grad():
        out = m.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                                                        dtype=torch.long),
                         max_new_tokens=GEN_TOKENS, do_sample=False, eos_token_id=eos,
                         pad_token_id=0, output_logits=True, return_dict_in_generate=True,
                         **kw)
    new = out.sequences[0, len(ids):].tolist()
    return new, [l[0].to(torch.float64) for l in out.logits]


def case(name):
    m64, m32 = load(name, torch.float64), load(name, torch.float32)
    cfg = (m64.base_model.model if name == "lora-llama" else m64).config
    eos = cfg.eos_token_id
    vocab = cfg.vocab_size
    g = torch.Generator().manual_seed(1234)
    prompts, noise = [], 0.0
    for n in PROMPT_LENS:
        ids = torch.randint(3, vocab, (n,), generator=g).tolist()
        new, logits = generate(m64, ids, eos)
        new32, logits32 = generate(m32, ids, eos)
        # the float32 pass, step by step on float64's ids where they agree
        k = 0
        while k < min(len(new), len(new32)) and new[k] == new32[k]:
            noise = max(noise, float((logits32[k] - logits[k]).abs().max()))
            k += 1
        gaps = [float(l.topk(2).values[0] - l.topk(2).values[1]) for l in logits]
        prompts.append({"ids": ids, "new": new, "gaps": gaps,
                        "prefill_logits": logits[0].tolist(),
                        "last_logits": logits[-1].tolist()})
    bound = BOUND_FACTOR * noise
    for p in prompts:
        p["tie_step"] = next((i for i, gap in enumerate(p["gaps"]) if gap <= bound), -1)
    ref = {"model": name, "eos": eos, "vocab": vocab, "gen_tokens": GEN_TOKENS,
           "noise": noise, "bound": bound, "prompts": prompts}
    # repetition penalty, greedy
    ids = prompts[1]["ids"]
    new, logits = generate(m64, ids, eos, repetition_penalty=1.3)
    ref["penalty"] = {"repetition_penalty": 1.3, "ids": ids, "new": new,
                      "gaps": [float(l.topk(2).values[0] - l.topk(2).values[1])
                               for l in logits]}
    # the sampling warpers on one row, as transformers applies them
    row = torch.tensor([prompts[0]["prefill_logits"]], dtype=torch.float64)
    for w in (transformers.TemperatureLogitsWarper(0.7), transformers.TopKLogitsWarper(20),
              transformers.TopPLogitsWarper(0.8)):
        row = w(None, row)
    ref["warp"] = {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "row": 0,
                   "kept": [i for i, v in enumerate(row[0].tolist()) if v != float("-inf")]}
    ref["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    return ref


def main():
    names = sys.argv[1:] or ["tiny-llama", "tiny-qwen2", "tiny-mistral", "tiny-qwen3",
                             "tiny-phi3", "tiny-olmo2", "tiny-mistral-window",
                             "tiny-gemma", "tiny-gemma2", "tiny-gemma3", "tiny-olmo3",
                             "tiny-qwen3moe", "tiny-mixtral", "lora-llama"]
    for name in names:
        ref = case(name)
        path = os.path.join(FIX, name, "generate.json")
        with open(path, "w") as f:
            json.dump(ref, f)
        ties = [p["tie_step"] for p in ref["prompts"]]
        print("%s: noise %.3g bound %.3g, new ids %s, tie steps %s, penalty %d ids" % (
            name, ref["noise"], ref["bound"], [len(p["new"]) for p in ref["prompts"]], ties,
            len(ref["penalty"]["new"])))


if __name__ == "__main__":
    main()
