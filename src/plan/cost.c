/* The cost model of one optimizer step (zinc/cost.h).
 *
 * Each resource's busy time is its work (the plan's per-step traffic, the
 * probed compute, the optimizer's elements) over its ceiling. They combine
 * by the schedule's overlap rules:
 *   - on a GPU the streams run beside each other: the step is the longest
 *     of compute, the link each way and the disk (reads and writes are one
 *     disk), plus what of the optimizer chain the compute has to wait for:
 *     the chain (CPU Adam, or the NVMe traffic of its states, whichever is
 *     longer) hides under the next step's first forward, and without
 *     clipping also under the last micro-batch's backward (each unit steps
 *     as soon as its gradients are final); with clipping it starts only
 *     when the last micro-batch's gradients have been copied and summed on
 *     the host, so what of that outlasts the backward's compute comes first;
 *     ranks whose optimizer does not pipeline (world > 1 below stage 3)
 *     wait for all of it;
 *   - on the host backend the "device" is the CPU itself: compute, the
 *     copies, the accumulation and Adam take the same cores, so their
 *     times add, with the disk engine's own CPU time per byte (crc32c,
 *     submission and completion, measured with the disk); the disk runs
 *     beside them, except the optimizer chain's states, which hide only
 *     under the same window as on a GPU;
 *   - the optimizer's states on NVMe are read and written at once (a
 *     unit's read beside the write of the one before): the disk's mixed
 *     rate, where measured, sets the chain's disk time;
 *   - before the first block computes, its fetch has to land (the fill);
 *   - every block use (one block's forward or backward in one micro-batch)
 *     costs the schedule a fixed time beside its compute: its ops handed to
 *     the stream threads, events and marks, the fetch handoff, the
 *     gradient's D2H and host function. On the host backend the same cores
 *     do that work, so it adds; on a GPU it is the host issuing work ahead
 *     of the device and hides under compute, except where a block computes
 *     for less than it costs to issue (small models, short sequences).
 * Busy times are per step; tokens/s and the SSD's TB/day follow. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "zinc/cost.h"
#include "zinc/optim.h"

static double div0(double a, double b)
{
    return b > 0 ? a / b : 0;
}

/* Figures for targets, with their sources (shared/reference/
 * offload-systems.md quotes each with its link):
 * - A10: 125 TF dense bf16 on the datasheet; no public cuBLAS figure for
 *   the A10 itself, the A10G (same GA102, power-capped) measures 62.5-69.5
 *   TF in PyTorch's bf16 GEMM benchmark (torch-performance-test-data #126,
 *   #185): 66 TF. A whole layer reaches ~0.8 of it (llm.c on an A10: ~54 TF
 *   end to end, PR #621). PCIe Gen4 x16: 19.7 GB/s H2D measured on an A10
 *   (drkennetz/cuda_examples PR #1), D2H taken equal. Host: the reference
 *   box of offload-systems.md 4.1 (one socket, 8-channel DDR4): Adam at 80%
 *   of STREAM, ~4 G params/s fp32 states; one Gen4 datacenter NVMe
 *   (Samsung PM9A3: 6.5 / 3.5 GB/s rated).
 * - H100 (SXM, PCIe Gen5): 989.5 TF dense bf16, ~0.67 of it in cuBLAS at
 *   large shapes (660 TF); H2D 35 GB/s and D2H 52.8 GB/s (nvbandwidth #24);
 *   a 2-socket host, Adam ~8 G params/s; 4x Gen4 NVMe in RAID0: 10 / 5
 *   GB/s (DeepNVMe, 08-2024). H200: the same compute and link, 141 GB.
 * - CPU Adam with bf16 and 8-bit moments: a share of the fp32 step's rate
 *   measured by this project, not the ratio of the bytes moved, since those
 *   steps are bound by their arithmetic (widening, quantizing), not by
 *   memory (bench/results/adam-states.md). On the AVX2 path, which auto
 *   takes on Intel CPUs and on AMD ones before Zen 4, `zinc bench adam`
 *   measured the 8-bit step at 0.25x (0.22-0.41, 6 runs) the fp32 step of
 *   the same run, on the project's 2-core Zen 4 guest. The bf16-moment
 *   step, fused since 2026-11-28 (one pass, widening and rounding in
 *   registers), measured 0.85-1.39x in 6 runs there: 1.37-1.39x (its
 *   roofline, by bytes 1.4x) where the guest's memory gave 27 GB/s per
 *   core, 0.85-0.93x (bound by the Adam arithmetic, as the fp32 step
 *   nearly is) where it gave 50; 1.0x here, between the two. The only
 *   8-bit figure from a GPU host: 2.9 Gparam/s in the Qwen2.5-7B run on
 *   the H200's 16-core Xeon (bench/results/train-7b-h200.md), where the
 *   h200 target's 0.25 x 8 gives 2.0. (Until 2026-11-28 these were 1.5x
 *   and 2x the fp32 rate, by bytes: 5.5x what that run reached.)
 * - The schedule's cost per block use on all three is an estimate, not a
 *   measurement (no such GPU has been lent to the project yet; the
 *   calibration measures it on the machine itself): a block use makes
 *   about 8 CUDA runtime calls besides its kernels (the forward 4: the
 *   slot's wait, the mark's two event records, the fence; the backward
 *   about 12: waits, the gradient memset, marks, the D2H, its events,
 *   cudaLaunchHostFunc), at an assumed 2.5 us of host time each (the
 *   order of a CUDA runtime call's host cost on a current server CPU; not
 *   measured by this project): 8 x 2.5 us = 20 us. A 7B layer computes for
 *   milliseconds, so the figure matters only for small models; replace it
 *   with the calibration's figure from such a machine when one is lent. */
static const zn_ceilings targets[] = {
    { .name = "a10", .source = "NVIDIA A10 24 GB on PCIe Gen4 x16: GEMM 66 TF (A10G measured, "
      "datasheet 125), layer 0.8 of it (llm.c), H2D/D2H 19.7 GB/s (measured on an A10); host: "
      "1 socket 8-channel DDR4, Adam 4 Gparam/s (fp32 moments; bf16 1.0x, 8-bit 0.25x as "
      "measured on the AVX2 path), NVMe 6.5/3.5 GB/s (PM9A3 rated); schedule 20 us per block "
      "use (an estimate, not measured)",
      .cuda = true, .gemm_flops = 66e12, .model_eff = 0.8, .h2d_bps = 19.7e9,
      .d2h_bps = 19.7e9, .mem_bps = 100e9, .nvme_read_bps = 6.5e9, .nvme_write_bps = 3.5e9,
      .adam_pps = { 4e9, 1.0 * 4e9, 0.25 * 4e9 }, .dev_adam_pps = 600e9 / 16,
      .gpu_bytes = 24ull << 30,
      .block_use_s = 20e-6 },
    { .name = "h100", .source = "NVIDIA H100 SXM 80 GB on PCIe Gen5: GEMM 660 TF (0.67 of the "
      "989.5 dense datasheet), H2D 35 / D2H 52.8 GB/s (nvbandwidth #24); host: 2 sockets, Adam "
      "8 Gparam/s (fp32 moments; bf16 1.0x, 8-bit 0.25x as measured on the AVX2 path), 4x Gen4 "
      "NVMe RAID0 10/5 GB/s (DeepNVMe); schedule 20 us per block use (an estimate, not "
      "measured)",
      .cuda = true, .gemm_flops = 660e12, .model_eff = 0.6, .h2d_bps = 35e9, .d2h_bps = 52.8e9,
      .mem_bps = 200e9, .nvme_read_bps = 10e9, .nvme_write_bps = 5e9,
      .adam_pps = { 8e9, 1.0 * 8e9, 0.25 * 8e9 }, .dev_adam_pps = 3.35e12 / 16,
      .gpu_bytes = 80ull << 30,
      .block_use_s = 20e-6 },
    { .name = "h200", .source = "NVIDIA H200 SXM 141 GB: as h100 (same compute and link), "
      "HBM3e 4.8 TB/s; schedule 20 us per block use (an estimate, not measured)",
      .cuda = true, .gemm_flops = 660e12, .model_eff = 0.6, .h2d_bps = 35e9, .d2h_bps = 52.8e9,
      .mem_bps = 200e9, .nvme_read_bps = 10e9, .nvme_write_bps = 5e9,
      .adam_pps = { 8e9, 1.0 * 8e9, 0.25 * 8e9 }, .dev_adam_pps = 4.8e12 / 16,
      .gpu_bytes = 141ull << 30,
      .block_use_s = 20e-6 },
};

const zn_ceilings *zn_cost_target(const char *name)
{
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
        if (!strcmp(targets[i].name, name))
            return &targets[i];
    return NULL;
}

const char *zn_cost_target_names(void)
{
    return "a10, h100, h200";
}

void zn_cost_compute_analytic(const zn_ceilings *c, double layer_flops_fwd, double head_flops,
                              bool checkpoint, zn_cost_compute *out)
{
    double rate = c->gemm_flops * (c->model_eff > 0 ? c->model_eff : 1.0);
    out->layer_fwd_s = div0(layer_flops_fwd, rate);
    /* the backward is twice the forward, plus the forward again to recompute */
    out->layer_bwd_s = div0(layer_flops_fwd * (checkpoint ? 3 : 2), rate);
    out->head_s = div0(head_flops, rate);
}

int zn_cost_predict(const zn_plan *plan, const zn_ceilings *c, const zn_cost_compute *comp,
                    int64_t layers, uint64_t tokens, int mom_fmt, zn_cost *out)
{
    memset(out, 0, sizeof *out);
    const __typeof__(plan->step) *s = &plan->step;
    int A = s->micro_batches > 0 ? s->micro_batches : 1;
    size_t mo = 0;
#define NEED(cond, what)                                                                   \
    do {                                                                                   \
        if ((cond) && mo < sizeof out->missing)                                            \
            mo += (size_t)snprintf(out->missing + mo, sizeof out->missing - mo, "%s%s",   \
                                   mo ? ", " : "", what);                                  \
    } while (0)

    double fwd = (double)layers * comp->layer_fwd_s;
    double bwd = (double)layers * comp->layer_bwd_s + comp->head_s;
    double *b = out->busy_s;
    b[ZN_RES_COMPUTE] = (double)A * (fwd + bwd);
    NEED(b[ZN_RES_COMPUTE] <= 0, "compute");
    b[ZN_RES_H2D] = div0((double)s->h2d, c->h2d_bps);
    NEED(s->h2d && c->h2d_bps <= 0, "host link (h2d)");
    b[ZN_RES_D2H] = div0((double)s->d2h, c->d2h_bps) + div0((double)s->accum_bytes, c->mem_bps);
    NEED(s->d2h && c->d2h_bps <= 0, "host link (d2h)");
    NEED(s->accum_bytes && c->mem_bps <= 0, "host memory");
    /* the optimizer on the device sums the gradients there, on the D2H
     * stream: on the host backend that is host memory on the shared
     * cores; on a GPU it is HBM traffic beside the compute, left out */
    if (c->shared_cores) {
        b[ZN_RES_D2H] += div0((double)s->dev_accum_bytes, c->mem_bps);
        NEED(s->dev_accum_bytes && c->mem_bps <= 0, "host memory");
    }
    b[ZN_RES_NVME_READ] = div0((double)s->nvme_read, c->nvme_read_bps);
    b[ZN_RES_NVME_WRITE] = div0((double)s->nvme_write, c->nvme_write_bps);
    NEED(s->nvme_read && c->nvme_read_bps <= 0, "nvme read");
    NEED(s->nvme_write && c->nvme_write_bps <= 0, "nvme write");
    b[ZN_RES_NVME] = b[ZN_RES_NVME_READ] + b[ZN_RES_NVME_WRITE];
    if (s->opt_on_device) {
        b[ZN_RES_COMPUTE] += div0((double)s->adam_params, c->dev_adam_pps);
        NEED(s->adam_params && c->dev_adam_pps <= 0, "device adam");
    } else {
        int f = mom_fmt >= 0 && mom_fmt < 3 ? mom_fmt : 0;
        double pps = s->master_sr && c->adam_sr_pps[f] > 0 ? c->adam_sr_pps[f] : c->adam_pps[f];
        b[ZN_RES_ADAM] = div0((double)s->adam_params, pps);
        NEED(s->adam_params && pps <= 0, "cpu adam");
    }
    /* world > 1: collectives are not modelled yet (0 busy) */

    /* the fill: the first block's fetch, at most one unit of the link */
    if (s->fetches) {
        double per_fetch = div0(b[ZN_RES_H2D], (double)s->fetches);
        double per_read = s->nvme_fetches ? div0((double)s->nvme_read, c->nvme_read_bps) /
                                                (double)(s->nvme_fetches + (s->opt_on_nvme ? 3 : 0))
                                          : 0;
        out->fill_s = per_fetch + per_read;
    }
    out->compute_fwd1_s = fwd;
    /* the schedule's fixed cost: every block, forward and backward, in
     * every micro-batch (the uses zn_tr_build_fetches lists: A x 2 x L) */
    int nb = comp->blocks > 0 ? comp->blocks : (int)layers + 2;
    out->block_uses = (uint64_t)A * 2u * (uint64_t)nb;
    double o = c->block_use_s > 0 ? c->block_use_s : 0;
    if (c->shared_cores) {
        out->overhead_s = (double)out->block_uses * o;
    } else {
        /* the host issues a block's work while the GPU computes the one
         * before: the GPU waits only where a block computes for less than
         * its issue costs. The layers' uses by their probed times; the
         * other blocks' (embedding and head parts) share head_s. */
        int other = nb - (int)layers > 0 ? nb - (int)layers : 0;
        double per_mb = (double)layers * (fmax(0, o - comp->layer_fwd_s) +
                                          fmax(0, o - comp->layer_bwd_s)) +
                        fmax(0, 2.0 * other * o - comp->head_s);
        out->overhead_s = (double)A * per_mb;
    }
    /* the optimizer chain: CPU Adam, or its NVMe traffic when longer (the
     * states, the gradients it reads, the params it writes to an NVMe home
     * and the next first forward reads back: not the backward's fetches);
     * each unit's read goes on beside the write of the one before, at the
     * disk's mixed rate where it is measured and slower than the two
     * directions' times added */
    double opt_io = div0((double)s->chain_read, c->nvme_read_bps) +
                    div0((double)s->chain_write, c->nvme_write_bps);
    if (s->chain_read && s->chain_write && c->nvme_mixed_bps > 0)
        opt_io = fmax(opt_io, (double)(s->chain_read + s->chain_write) / c->nvme_mixed_bps);
    out->opt_s = fmax(b[ZN_RES_ADAM], opt_io);
    double window = !s->pipelined ? 0 : s->overlap_step ? fwd + bwd : fwd;
    int bound = ZN_RES_COMPUTE;
    double step;
    if (c->shared_cores) {
        /* one pool of cores: compute, copies, accumulation, Adam and the
         * engine's own CPU time per disk byte add; the disk runs beside
         * them, but the optimizer chain's share of it hides only under the
         * window, as on a GPU: the next forward waits for its blocks' units */
        out->io_cpu_s = (double)s->nvme_read * c->nvme_read_cpu +
                        (double)s->nvme_write * c->nvme_write_cpu;
        double cpu = b[ZN_RES_COMPUTE] + b[ZN_RES_H2D] + b[ZN_RES_D2H] + b[ZN_RES_ADAM] +
                     out->overhead_s + out->io_cpu_s;
        out->exposed_opt_s = fmax(0, opt_io - window);
        step = cpu + out->exposed_opt_s;
        if (out->exposed_opt_s > 0)
            bound = ZN_RES_NVME;
        if (b[ZN_RES_NVME] > step)
            step = b[ZN_RES_NVME], bound = ZN_RES_NVME;
        else if (!out->exposed_opt_s && b[ZN_RES_ADAM] > b[ZN_RES_COMPUTE])
            bound = ZN_RES_ADAM;
    } else {
        /* where the optimizer waits for the whole backward (clipping, fp16's
         * overflow check, ranks whose optimizer does not pipeline), it starts
         * once the last micro-batch's gradients are on the host and summed:
         * what of that micro-batch's D2H stream and accumulation outlasts
         * its backward's compute comes before the chain (the 7B run on the
         * H200: 1.54 s of it against 0.26 s of backward) */
        if (!s->pipelined || !s->overlap_step)
            out->accum_tail_s = fmax(0, b[ZN_RES_D2H] / A - bwd);
        out->exposed_opt_s = fmax(0, out->accum_tail_s + out->opt_s - window);
        step = b[ZN_RES_COMPUTE] + out->overhead_s + out->exposed_opt_s;
        if (out->exposed_opt_s > 0)
            bound = b[ZN_RES_ADAM] >= opt_io ? ZN_RES_ADAM : ZN_RES_NVME;
        const int others[] = { ZN_RES_H2D, ZN_RES_D2H, ZN_RES_NVME };
        for (size_t i = 0; i < 3; i++)
            if (b[others[i]] > step)
                step = b[others[i]], bound = others[i];
    }
    step += out->fill_s;
    out->step_s = step;
    out->bound = bound;
    out->tokens_per_s = div0((double)tokens, step);
    out->nvme_tb_per_day = div0((double)plan->nvme_write_step, step) * 86400.0 / 1e12;
#undef NEED
    return mo ? ZN_EARG : 0;
}

static const char *res_names[ZN_RES_COUNT] = {
    "gpu compute", "h2d", "d2h + grad accum", "nvme read", "nvme write", "adam",
    "comm", "nvme read+write",
};

const char *zn_train_resource_name(zn_train_resource r)
{
    return (unsigned)r < ZN_RES_COUNT ? res_names[r] : "?";
}
