#!/usr/bin/env python3
"""Generates tests/fixtures/optim8/: bitsandbytes' 8-bit blockwise AdamW on
the CPU, step by step, for tests/test_adam_q8.c (adamw8bit.safetensors),
and torchao's AdamW8bit, for tests/test_adam_q8ao.c
(adamw8bit-torchao.safetensors; see gen_torchao below).

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
       [--out tests/fixtures/optim8] [--only bnb|tensors|torchao]. Needs torch,
bitsandbytes and torchao (scripts/requirements-fixtures.txt) and, for
torchao's torch.compile'd step, a C++ compiler; CI never runs it.
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


def gen_bnb(args):
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


# ---- bitsandbytes, several tensors -----------------------------------------
#
# bitsandbytes keeps the states of a parameter of fewer than min_8bit_size
# (4096) elements in fp32, and starts the 8-bit blocks of each parameter at
# its first element. The fixture: AdamW8bit with its default min_8bit_size
# over TENSORS (a 4096-element one: 8-bit, the threshold itself; a 3584 and
# a 512: fp32, as a Qwen2.5-7B norm and k/v bias are; the last not whole
# blocks), each parameter's state laid out as zinc lays the flat buffer out:
# codes per element (0 for the fp32 tensors), an absmax per 256-block of
# the concatenation (0 for the fp32 tensors' blocks), and the fp32
# tensors' moments in slots of 256, in order. Every tensor but the last is
# whole blocks, so the concatenation's blocks are the tensors' own.

TENSORS = [4352, 3584, 4096, 512, 1101]


def gen_bnb_tensors(args):
    gen = torch.Generator().manual_seed(4321)
    ps = [torch.nn.Parameter((torch.randn(n, generator=gen) * 0.05).float()) for n in TENSORS]
    opt = bnb.optim.AdamW8bit(ps, lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]),
                              eps=HP["eps"], weight_decay=HP["weight_decay"])
    map_s = F.create_dynamic_map(signed=True).numpy()
    map_u = F.create_dynamic_map(signed=False).numpy()
    small = [n < 4096 for n in TENSORS]
    N = sum(TENSORS)
    NB = (N + BLOCK - 1) // BLOCK
    runs, slot, at = [], 0, 0
    for n, sm in zip(TENSORS, small):
        assert at % BLOCK == 0
        if sm:
            runs.append([at // BLOCK, (n + BLOCK - 1) // BLOCK, slot])
            slot += (n + BLOCK - 1) // BLOCK
        at += n
    meta = {"n": N, "steps": STEPS, "block": BLOCK, **HP, "tensors": TENSORS,
            "f32_runs": runs, "f32_slots": slot,
            "bitsandbytes": bnb.__version__, "torch": torch.__version__}

    def flat_state(states):
        """The optimizer's states (None before the first step) in zinc's
        flat layout: codes, absmax per block, fp32 slots."""
        codes = [np.zeros(N, np.uint8), np.zeros(N, np.uint8)]
        absmax = [np.zeros(NB, np.float32), np.zeros(NB, np.float32)]
        f32 = [np.zeros(slot * BLOCK, np.float32), np.zeros(slot * BLOCK, np.float32)]
        at, sl = 0, 0
        for p, n, sm in zip(ps, TENSORS, small):
            st = states.get(p) if states else None
            for k in range(2):
                if sm:
                    if st:
                        f32[k][sl * BLOCK:sl * BLOCK + n] = st["state%d" % (k + 1)].numpy()
                elif st:
                    codes[k][at:at + n] = st["state%d" % (k + 1)].numpy()
                    a = st["absmax%d" % (k + 1)].numpy()
                    absmax[k][at // BLOCK:at // BLOCK + a.shape[0]] = a
            if sm:
                sl += (n + BLOCK - 1) // BLOCK
            at += n
        return codes, absmax, f32

    t = {}
    for k in range(1, STEPS + 1):
        gs = []
        for n in TENSORS:
            mag = torch.pow(10.0, -torch.rand(n, generator=gen) * 6.0)
            gs.append((torch.randn(n, generator=gen) * mag).float())
        codes, absmax, f32 = flat_state(opt.state)
        t[f"s{k}.p"] = np.concatenate([p.detach().numpy() for p in ps])
        t[f"s{k}.g"] = np.concatenate([g.numpy() for g in gs])
        for j, nm in enumerate("mv"):
            t[f"s{k}.{nm}_codes"] = codes[j]
            t[f"s{k}.{nm}_absmax"] = absmax[j]
            t[f"s{k}.{nm}_f32"] = f32[j]
        # the 8-bit tensors' moments before quantization (as gen_bnb)
        pre = []
        for p, g, n, sm in zip(ps, gs, TENSORS, small):
            if sm:
                pre.append(None)
                continue
            st = opt.state[p] if p in opt.state else None
            nb = (n + BLOCK - 1) // BLOCK
            s1 = st["state1"] if st else torch.zeros(n, dtype=torch.uint8)
            s2 = st["state2"] if st else torch.zeros(n, dtype=torch.uint8)
            a1 = st["absmax1"] if st else torch.zeros(nb)
            a2 = st["absmax2"] if st else torch.zeros(nb)
            m = torch.from_numpy(map_s)[s1.long()] * a1.repeat_interleave(BLOCK)[:n]
            v = torch.from_numpy(map_u)[s2.long()] * a2.repeat_interleave(BLOCK)[:n]
            m.mul_(HP["beta1"]).add_(g, alpha=1.0 - HP["beta1"])
            v.mul_(HP["beta2"]).addcmul_(g, g, value=1.0 - HP["beta2"])
            pre.append((m.numpy(), v.numpy()))
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()
        for p, n, sm in zip(ps, TENSORS, small):
            st = opt.state[p]
            assert (st["state1"].dtype == torch.float32) == sm, "min_8bit_size not as assumed"
        codes, absmax, f32 = flat_state(opt.state)
        t[f"s{k}.out.p"] = np.concatenate([p.detach().numpy() for p in ps])
        near = [np.zeros(N, np.uint8), np.zeros(N, np.uint8)]
        at = 0
        for p, n, sm, pr in zip(ps, TENSORS, small, pre):
            if not sm:
                st = opt.state[p]
                for j, (mp, c) in enumerate(((map_s, "1"), (map_u, "2"))):
                    x = scaled(pr[j], st["absmax" + c].numpy())
                    assert np.array_equal(lut_codes(x, mp), st["state" + c].numpy()), \
                        "the table reproduction does not give bitsandbytes' codes"
                    near[j][at:at + n] = nearest_codes(x, mp)[0]
            at += n
        for j, nm in enumerate("mv"):
            t[f"s{k}.out.{nm}_codes"] = codes[j]
            t[f"s{k}.out.{nm}_absmax"] = absmax[j]
            t[f"s{k}.out.{nm}_f32"] = f32[j]
            t[f"s{k}.out.{nm}_nearest"] = near[j]
            # the 8-bit tensors' unquantized moments, flat (0 elsewhere)
            pm = np.zeros(N, np.float32)
            at = 0
            for n, pr in zip(TENSORS, pre):
                if pr is not None:
                    pm[at:at + n] = pr[j]
                at += n
            t[f"s{k}.out.{nm}_pre"] = pm
    save_file({k: np.ascontiguousarray(v) for k, v in t.items()},
              os.path.join(args.out, "adamw8bit-tensors.safetensors"),
              metadata={"zinc": json.dumps(meta)})
    print("optim8 tensors:", json.dumps(meta))


# ---- torchao ---------------------------------------------------------------
#
# torchao's AdamW8bit (torchao/optim/adam.py, subclass_8bit.py,
# quant_utils.py; what the HF Trainer's optim="adamw_torch_8bit" builds)
# keeps bitsandbytes' storage: blocks of 256 with a float32 scale each, the
# same two dynamic maps (its create_dynamic_map is bitsandbytes', checked
# below), signed for exp_avg and unsigned for exp_avg_sq, and the update
# from the unquantized new moments. It differs in how it quantizes and in
# the step's constants:
#  - the scale is max(absmax, 1e-12) (scale_tensor's clip), so a block of
#    zeros stores scale 1e-12 and the code of 0, and a block whose moments
#    are all below 1e-12 is quantized against 1e-12, not its own absmax;
#  - the scaled value is x / scale (bitsandbytes: x * (1 / absmax));
#  - the code is the nearest entry with ties going up, decided in float32
#    as x - map[lo] >= (map[lo + 1] - map[lo]) * 0.5 after a binary search
#    for lo (bitsandbytes 0.50's CPU kernel: a 65536-bin table; its CUDA
#    kernel and zinc's bnb rule: nearest, ties down);
#  - the bias corrections 1 - beta^step are float32 powers of the float32
#    betas (step is a float32 tensor), so 1 - beta2 at step 1 is
#    1 - 0.999f = 0.00099998713, 1.3e-5 off 0.001, and the step at step 1
#    is 6.4e-6 larger than torch.optim.AdamW's;
#  - moments by lerp, decay as p - lr * wd * p; the step torch.compile'd;
#  - only tensors of >= 4096 elements that are whole blocks get 8-bit
#    states (bitsandbytes: >= 4096), others fp32.
#
# The fixture: one parameter of AO_N elements (whole blocks, >= 4096, so
# torchao quantizes it) for AO_STEPS steps, gradients spanning six decades
# except block 0 (|g| ~ 1e-12: m and v below the 1e-12 floor) and block 1
# (|g| ~ 1e-7: v below it). Stored: the first step's p; each step's g and
# what came out (p, codes, scales), and the moments torchao quantized,
# replayed in eager float32 (they give its codes back, checked; the
# compiled step may differ from eager by an ulp, so scales are not asserted
# equal). The reference's own noise: torchao's step run eagerly against the
# compiled one, p in units of tests/test_adam_q8ao.c's bound (2 ulps of p
# plus 1e-6 of the step) and scales relative (metadata
# noise_eager_vs_compiled): the test's bounds must cover it. Besides, a
# probe of the quantizer alone (scale_tensor + quantize_8bit_with_qmap, as
# OptimState8bit.copy_ runs them): blocks of
# exact midpoints, values one ulp around each rounding threshold, tiny
# blocks, a zero block, random ones; their codes and scales.
AO_N = 256 * 16
AO_STEPS = 3


def gen_torchao(args):
    import torchao
    from torchao.optim import AdamW8bit
    from torchao.optim.quant_utils import (create_dynamic_map as ao_map, scale_tensor,
                                           quantize_8bit_with_qmap)
    map_s = np.array(ao_map(signed=True), dtype=np.float32)
    map_u = np.array(ao_map(signed=False), dtype=np.float32)
    assert np.array_equal(map_s, F.create_dynamic_map(signed=True).numpy()) and \
        np.array_equal(map_u, F.create_dynamic_map(signed=False).numpy()), \
        "torchao's maps are not bitsandbytes'"
    gen = torch.Generator().manual_seed(7)
    p = torch.nn.Parameter((torch.randn(AO_N, generator=gen) * 0.05).float())
    opt = AdamW8bit([p], lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]), eps=HP["eps"],
                    weight_decay=HP["weight_decay"])
    t = {"map_signed": map_s, "map_unsigned": map_u, "p0": p.detach().clone().numpy()}
    meta = {"n": AO_N, "steps": AO_STEPS, "block": BLOCK, **HP, "torchao": torchao.__version__,
            "torch": torch.__version__}

    def quant(x, qmap):
        sx, sc = scale_tensor(torch.from_numpy(x), BLOCK)
        return quantize_8bit_with_qmap(sx, torch.from_numpy(qmap)).numpy(), sc.numpy()

    from torchao.optim.adam import single_param_adam
    from torchao.optim.subclass_8bit import OptimState8bit

    def eager_step(k, g):
        """torchao's step run eagerly on copies of its state: the
        reference's own noise is how far that lands from the compiled step"""
        pc = p.detach().clone()
        st = opt.state.get(p)
        if st:
            ms = [OptimState8bit(x.codes.clone(), x.scale.clone(), x.qmap, x.signed)
                  for x in (st["exp_avg"], st["exp_avg_sq"])]
        else:
            ms = [OptimState8bit.zeros(pc.shape, sg, BLOCK) for sg in (True, False)]
        single_param_adam(pc, g, torch.tensor(float(k)), ms[0], ms[1], None,
                          torch.tensor(HP["lr"]), HP["beta1"], HP["beta2"], HP["weight_decay"],
                          HP["eps"], True, False)
        return pc.numpy(), ms[0].scale.numpy(), ms[1].scale.numpy()

    def p_vs_bound(pe, pc, p_in):
        """the largest |pe - pc| in units of tests/test_adam_q8ao.c's bound:
        2 ulps of p plus 1e-6 of the step"""
        allow = 2.0 * np.spacing(np.abs(pc)).astype(np.float64) + \
            1e-6 * np.abs(pc.astype(np.float64) - p_in)
        return float(np.max(np.abs(pe.astype(np.float64) - pc) / allow))

    def rel(a, b):
        return float(np.max(np.abs(a.astype(np.float64) - b) / np.abs(b)))

    replay_differs = []
    noise = {"p_vs_bound": 0.0, "scale_rel": 0.0}
    for k in range(1, AO_STEPS + 1):
        mag = torch.pow(10.0, -torch.rand(AO_N, generator=gen) * 6.0)
        mag[:BLOCK] = 1e-12
        mag[BLOCK:2 * BLOCK] = 1e-7
        g = (torch.randn(AO_N, generator=gen) * mag).float()
        st = opt.state.get(p)
        if st:
            m0 = st["exp_avg"].dequantize().numpy()
            v0 = st["exp_avg_sq"].dequantize().numpy()
        else:
            m0 = np.zeros(AO_N, np.float32)
            v0 = np.zeros(AO_N, np.float32)
        pe, mse, vse = eager_step(k, g)
        p_in = p.detach().clone().numpy()
        p.grad = g.clone()
        opt.step()
        st = opt.state[p]
        em, ev = st["exp_avg"], st["exp_avg_sq"]
        noise["p_vs_bound"] = max(noise["p_vs_bound"],
                                  p_vs_bound(pe, p.detach().numpy(), p_in))
        noise["scale_rel"] = max(noise["scale_rel"], rel(mse, em.scale.numpy()),
                                 rel(vse, ev.scale.numpy()))
        assert em.codes.dtype == torch.uint8 and em.block_size == BLOCK, "not 8-bit states"
        mf = torch.from_numpy(m0).lerp(g, 1 - HP["beta1"]).numpy()
        vf = torch.from_numpy(v0).lerp(g.square(), 1 - HP["beta2"]).numpy()
        rm, _ = quant(mf, map_s)
        rv, _ = quant(vf, map_u)
        differ = int((rm != em.codes.numpy()).sum() + (rv != ev.codes.numpy()).sum())
        assert differ <= 4, "eager replay gives %d other codes than the compiled step" % differ
        replay_differs.append(differ)
        t[f"s{k}.g"] = g.numpy()
        t[f"s{k}.p"] = p.detach().clone().numpy()
        t[f"s{k}.m_codes"] = em.codes.numpy().copy()
        t[f"s{k}.v_codes"] = ev.codes.numpy().copy()
        t[f"s{k}.m_scale"] = em.scale.numpy().copy()
        t[f"s{k}.v_scale"] = ev.scale.numpy().copy()
        t[f"s{k}.m_f32"] = mf
        t[f"s{k}.v_f32"] = vf
    meta["replay_codes_differ"] = replay_differs
    meta["noise_eager_vs_compiled"] = noise
    assert t["s1.m_scale"][0] == np.float32(1e-12) and t["s1.v_scale"][1] == np.float32(1e-12), \
        "blocks 0 and 1 are not on the 1e-12 floor"

    # the quantizer alone
    rng = np.random.default_rng(5)
    blocks = []
    for qmap in (map_s, map_u):
        lo, hi = qmap[:-1], qmap[1:]
        mids = (lo.astype(np.float64) + hi) / 2
        exact = mids[mids.astype(np.float32).astype(np.float64) == mids].astype(np.float32)
        # torchao's own threshold for each gap, and one ulp either side
        thr = []
        for a, b in zip(lo, hi):
            h = np.float32((b - a) * np.float32(0.5))
            cand = np.float32(a + h)
            for x in (np.nextafter(cand, np.float32(-2)), cand, np.nextafter(cand, np.float32(2))):
                thr.append(x)
        vals = np.concatenate([exact, np.array(thr, np.float32)])
        for i in range(0, len(vals), BLOCK - 1):
            b = np.zeros(BLOCK, np.float32)
            chunk = vals[i:i + BLOCK - 1]
            b[:len(chunk)] = chunk
            b[-1] = 1.0          # the scale is 1: the values are the scaled values
            blocks.append(b)
    blocks.append(np.zeros(BLOCK, np.float32))
    blocks.append((rng.standard_normal(BLOCK) * 3e-13).astype(np.float32))
    blocks.append((rng.standard_normal(BLOCK) * 10.0 ** rng.uniform(-22, -12, BLOCK))
                  .astype(np.float32))
    for e in (-9, -3, 0, 2):
        blocks.append((rng.standard_normal(BLOCK) * 10.0 ** rng.uniform(e - 6, e, BLOCK))
                      .astype(np.float32))
    x = np.concatenate(blocks)
    t["q.x"] = x
    t["q.m_codes"], t["q.m_scale"] = quant(x, map_s)
    t["q.v_codes"], t["q.v_scale"] = quant(np.abs(x), map_u)
    meta["probe_blocks"] = len(blocks)
    save_file({k: np.ascontiguousarray(v) for k, v in t.items()},
              os.path.join(args.out, "adamw8bit-torchao.safetensors"),
              metadata={"zinc": json.dumps(meta)})
    print("optim8 torchao:", json.dumps(meta))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests",
                                                    "fixtures", "optim8"))
    ap.add_argument("--only", choices=["bnb", "tensors", "torchao"])
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.only in (None, "bnb"):
        gen_bnb(args)
    if args.only in (None, "tensors"):
        gen_bnb_tensors(args)
    if args.only in (None, "torchao"):
        gen_torchao(args)


if __name__ == "__main__":
    main()
