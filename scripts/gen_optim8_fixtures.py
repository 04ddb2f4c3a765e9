#!/usr/bin/env python3
"""Generates tests/fixtures/optim8/: bitsandbytes' 8-bit blockwise AdamW on
the CPU, step by step, for tests/test_adam_q8.c.

One parameter of N elements (N not a multiple of the 256-element block, so
the last block is partial) is trained by bitsandbytes.optim.AdamW8bit
(min_8bit_size=1: 8-bit states for it) for STEPS steps. Gradients span six
decades inside every block, so that the second moment uses the whole
dynamic map. Before each step the fixture records what goes in (p, g, the
uint8 states and their absmax), after it what came out; besides, for every
step, the fp32 moments bitsandbytes computed before it quantized them
(the same torch operations its CPU kernel runs, replayed here and checked
to give its codes back), and the code of the nearest map entry for each
(ties to the lower entry), which is zinc's rounding. Both dynamic maps
(F.create_dynamic_map, signed for m, unsigned for v) are stored too.

bitsandbytes 0.50's CPU quantizer does not round to the nearest map entry:
it looks the scaled value up in a 65536-bin table over [-1, 1]. The codes
it stores therefore differ from the nearest entry where a bin straddles a
midpoint of the map and for scaled values below one bin (about 1.5e-5),
where the finer entries of the dynamic map are out of its reach. This
script reproduces that table, checks it gives bitsandbytes' codes
exactly, and stores per step the mask of elements where the table and the
nearest entry disagree: the test allows zinc's codes to differ from
bitsandbytes' there and nowhere else.

Usage: .venv-fixtures/bin/python scripts/gen_optim8_fixtures.py
       [--out tests/fixtures/optim8]. Needs torch and bitsandbytes
(scripts/requirements-fixtures.txt); CI never runs it.
"""
import argparse
import json
import math
import os

import numpy as np
import torch
import bitsandbytes as bnb
import bitsandbytes.functional as F
from safetensors.numpy import save_file

N = 256 * 40 + 77
STEPS = 4
BLOCK = 256
HP = dict(lr=2e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)


def lut_codes(x, code):
    """bitsandbytes 0.50's CPU rounding of scaled values x (float32 in
    [-1, 1]): a 65536-bin table of the nearest entry of each bin's centre
    (ties to the lower entry)."""
    code = code.astype(np.float32)
    mids = (np.float32(0.5) * (code[:-1] + code[1:])).astype(np.float32)
    size = 65536
    i = np.arange(size, dtype=np.float32)
    centres = (np.float32(-1.0) + (np.float32(2.0) * i) / np.float32(size - 1)).astype(np.float32)
    table = np.searchsorted(mids, centres, side="left").astype(np.uint8)
    x = np.clip(x.astype(np.float32), -1.0, 1.0)
    idx = ((x + np.float32(1.0)) * np.float32(0.5) * np.float32(size - 1) + np.float32(0.5))
    idx = idx.astype(np.float32).astype(np.int64)  # truncation, as the C cast
    return table[idx]


def nearest_codes(x, code):
    """Index of the map entry nearest to x (float64 distances; ties to the
    lower entry) and whether x is within one float32 ulp of a tie."""
    code64 = code.astype(np.float64)
    x64 = x.astype(np.float64)
    d = np.abs(x64[:, None] - code64[None, :])
    c = np.argmin(d, axis=1)
    srt = np.sort(d, axis=1)
    tie = (srt[:, 1] - srt[:, 0]) <= np.abs(x64) * 2.0**-23 + 1e-45
    return c.astype(np.uint8), tie


def scaled(state, absmax):
    s = state.reshape(-1)
    nb = absmax.shape[0]
    out = np.zeros_like(s, dtype=np.float32)
    for b in range(nb):
        lo, hi = b * BLOCK, min((b + 1) * BLOCK, s.shape[0])
        if absmax[b] != 0:
            inv = np.float32(1.0) / np.float32(absmax[b])
            out[lo:hi] = np.clip(s[lo:hi] * inv, -1.0, 1.0)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                    "fixtures", "optim8"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(1234)
    gen = torch.Generator().manual_seed(99)
    p = torch.nn.Parameter((torch.randn(N, generator=gen) * 0.05).float())
    opt = bnb.optim.AdamW8bit([p], lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]),
                              eps=HP["eps"], weight_decay=HP["weight_decay"], min_8bit_size=1)
    map_s = F.create_dynamic_map(signed=True).numpy()
    map_u = F.create_dynamic_map(signed=False).numpy()
    t = {"map_signed": map_s, "map_unsigned": map_u}
    meta = {"n": N, "steps": STEPS, "block": BLOCK, **HP,
            "bitsandbytes": bnb.__version__, "torch": torch.__version__}
    lut_vs_nearest = []
    for k in range(1, STEPS + 1):
        mag = torch.pow(10.0, -torch.rand(N, generator=gen) * 6.0)
        g = (torch.randn(N, generator=gen) * mag).float()
        st = opt.state[p] if p in opt.state else None
        if st:
            s1, s2 = st["state1"].clone(), st["state2"].clone()
            a1, a2 = st["absmax1"].clone(), st["absmax2"].clone()
        else:
            nb = (N + BLOCK - 1) // BLOCK
            s1 = torch.zeros(N, dtype=torch.uint8)
            s2 = torch.zeros(N, dtype=torch.uint8)
            a1 = torch.zeros(nb)
            a2 = torch.zeros(nb)
        t[f"s{k}.p"] = p.detach().clone().numpy()
        t[f"s{k}.g"] = g.numpy()
        t[f"s{k}.m_codes"] = s1.numpy()
        t[f"s{k}.v_codes"] = s2.numpy()
        t[f"s{k}.m_absmax"] = a1.numpy()
        t[f"s{k}.v_absmax"] = a2.numpy()
        # the moments before quantization, by the operations of
        # bitsandbytes' CPU step (backends/cpu/ops.py)
        m = torch.from_numpy(map_s)[s1.long()] * a1.repeat_interleave(BLOCK)[:N]
        v = torch.from_numpy(map_u)[s2.long()] * a2.repeat_interleave(BLOCK)[:N]
        m.mul_(HP["beta1"]).add_(g, alpha=1.0 - HP["beta1"])
        v.mul_(HP["beta2"]).addcmul_(g, g, value=1.0 - HP["beta2"])
        p.grad = g.clone()
        opt.step()
        st = opt.state[p]
        out_s1, out_s2 = st["state1"].numpy(), st["state2"].numpy()
        out_a1, out_a2 = st["absmax1"].numpy(), st["absmax2"].numpy()
        mf, vf = m.numpy(), v.numpy()
        # the absmax is the largest |moment| of the block
        ref_a1 = np.array([np.abs(mf[b * BLOCK:(b + 1) * BLOCK]).max()
                           for b in range(out_a1.shape[0])], dtype=np.float32)
        ref_a2 = np.array([np.abs(vf[b * BLOCK:(b + 1) * BLOCK]).max()
                           for b in range(out_a2.shape[0])], dtype=np.float32)
        assert np.array_equal(ref_a1, out_a1) and np.array_equal(ref_a2, out_a2), \
            "replayed moments do not give bitsandbytes' absmax"
        xm, xv = scaled(mf, out_a1), scaled(vf, out_a2)
        lm, lv = lut_codes(xm, map_s), lut_codes(xv, map_u)
        assert np.array_equal(lm, out_s1) and np.array_equal(lv, out_s2), \
            "the table reproduction does not give bitsandbytes' codes: %d, %d differ" % (
                int((lm != out_s1).sum()), int((lv != out_s2).sum()))
        nm, tie_m = nearest_codes(xm, map_s)
        nv, tie_v = nearest_codes(xv, map_u)
        t[f"s{k}.out.p"] = p.detach().clone().numpy()
        t[f"s{k}.out.m_codes"] = out_s1.copy()
        t[f"s{k}.out.v_codes"] = out_s2.copy()
        t[f"s{k}.out.m_absmax"] = out_a1.copy()
        t[f"s{k}.out.v_absmax"] = out_a2.copy()
        t[f"s{k}.out.m_f32"] = mf.copy()
        t[f"s{k}.out.v_f32"] = vf.copy()
        t[f"s{k}.out.m_nearest"] = nm
        t[f"s{k}.out.v_nearest"] = nv
        t[f"s{k}.out.m_tie"] = tie_m.astype(np.uint8)
        t[f"s{k}.out.v_tie"] = tie_v.astype(np.uint8)
        lut_vs_nearest.append([int((nm != out_s1).sum()), int((nv != out_s2).sum())])
    meta["table_vs_nearest_differ"] = lut_vs_nearest
    save_file({k: np.ascontiguousarray(v) for k, v in t.items()},
              os.path.join(args.out, "adamw8bit.safetensors"),
              metadata={"zinc": json.dumps(meta)})
    print("optim8:", json.dumps(meta))


if __name__ == "__main__":
    main()
