/* The cost model: one optimizer step's time from the plan's traffic
 * (zn_plan.step, counted by the trainer's schedule run dry) and a machine's
 * ceilings, measured by zinc's own benchmarks on this machine (cached) or
 * taken from a named target's profile. `zinc plan --tune` ranks the
 * placements that fit with it; `zinc train` prints its prediction beside
 * the measured step. */
#ifndef ZINC_COST_H
#define ZINC_COST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "zinc/plan.h"
#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The resources of a step, each on its own stream or thread: what the cost
 * model predicts and the trainer measures. */
typedef enum {
    ZN_RES_COMPUTE = 0,  /* device compute stream */
    ZN_RES_H2D,          /* host -> device copies */
    ZN_RES_D2H,          /* device -> host copies + gradient accumulation */
    ZN_RES_NVME_READ,    /* NVMe reads (params and optimizer states) */
    ZN_RES_NVME_WRITE,   /* NVMe writes */
    ZN_RES_ADAM,         /* CPU Adam thread */
    ZN_RES_COMM,         /* collectives between ranks (world size > 1) */
    ZN_RES_NVME,         /* NVMe reads and writes together (their union): one
                            disk is one resource, the honest ceiling */
    ZN_RES_COUNT
} zn_train_resource;

ZN_API const char *zn_train_resource_name(zn_train_resource r);

/* One micro-batch's compute at one shape: one layer's forward and backward
 * (with the recompute when checkpointing) and the head's forward +
 * backward, in seconds (zn_model_probe_blocks, or the analytic model). */
typedef struct {
    double layer_fwd_s, layer_bwd_s, head_s;
    int blocks;  /* blocks the trainer streams per pass (zn_model_num_parts:
                    the embedding's and the head's parts and the layers);
                    0 = layers + 2 */
} zn_cost_compute;

/* What a machine moves and computes per second. 0 = not known: a step
 * that needs it cannot be predicted (zn_cost_predict says which). */
typedef struct {
    char name[64];            /* "this machine" or the target's name */
    char source[512];         /* where the figures come from */
    bool shared_cores;        /* the "device" is the host's CPU (host backend):
                                 compute, copies and the CPU optimizer share
                                 the cores, so their times add */
    bool cuda;                /* the target computes on an NVIDIA GPU (bf16) */
    double gemm_flops;        /* dense GEMM, the model's dtype, FLOP/s */
    double model_eff;         /* a whole layer's FLOP/s / gemm_flops, for the
                                 analytic compute (no probe) */
    double h2d_bps, d2h_bps;  /* the host link, each way alone */
    double mem_bps;           /* host memory, streaming read + write */
    double nvme_read_bps, nvme_write_bps;
    double nvme_mixed_bps;    /* reads and writes at once (both directions'
                                 bytes / s): the optimizer's states on NVMe
                                 move that way; 0 = take the two added */
    double nvme_read_cpu, nvme_write_cpu;  /* CPU seconds per byte the engine
                                 spends (crc32c, submission, completion):
                                 on shared cores they add to the step */
    double adam_pps[3];       /* CPU Adam params/s by moment format (zn_mom_fmt) */
    double adam_sr_pps[3];    /* the same on a bf16 master with stochastic
                                 rounding (0: taken as adam_pps) */
    double dev_adam_pps;      /* Adam on the device, params/s */
    double gpu_bytes, host_bytes;  /* memory of the target (0: this machine's) */
    double block_use_s;       /* the schedule's fixed cost per block use (one
                                 block's forward or backward in one
                                 micro-batch): submitting its ops to the
                                 streams, events and marks, the fetch
                                 handoff, the gradient's host function */
} zn_ceilings;

/* Figures for a named target (a10, h100, h200) with their sources: the
 * datasheets' and public measurements' numbers (shared/reference). NULL
 * when the name is unknown; zn_cost_target_names lists them. */
ZN_API const zn_ceilings *zn_cost_target(const char *name);
ZN_API const char *zn_cost_target_names(void);

typedef struct {
    double busy_s[ZN_RES_COUNT];  /* each resource's busy time per step */
    double compute_fwd1_s;        /* the first micro-batch's forward */
    double opt_s;                 /* the optimizer chain (CPU Adam and its NVMe) */
    double exposed_opt_s;         /* of it, what the compute waits for */
    double fill_s;                /* the first fetch before compute starts */
    double overhead_s;            /* the schedule's fixed costs: block uses x
                                     block_use_s (host backend), or what of it
                                     the GPU waits for (CUDA) */
    uint64_t block_uses;          /* per step: micro-batches x 2 x blocks */
    double io_cpu_s;              /* shared cores: the disk engine's CPU time */
    double step_s;                /* predicted step time */
    int bound;                    /* the resource that sets it (ZN_RES_*) */
    double tokens_per_s;
    double nvme_tb_per_day;
    char missing[128];            /* a ceiling the prediction needed and lacked */
    double accum_tail_s;          /* CUDA, optimizer after the backward (clipping):
                                     the last micro-batch's D2H and accumulation
                                     past its backward's compute, which the
                                     optimizer chain starts after */
} zn_cost;

/* Predicts one optimizer step of `plan` (with plan->step filled, i.e. from
 * zn_train_plan) at `tokens` tokens per step on this rank, with `comp` the
 * compute of one micro-batch, `layers` decoder layers and the moment format
 * `mom_fmt`. A block_use_s of 0 leaves the schedule's overhead out (the
 * calibration predicts that way to measure it). Returns 0, or ZN_EARG when
 * a needed ceiling is 0 (out->missing names it; the other figures are
 * still filled). */
ZN_API int zn_cost_predict(const zn_plan *plan, const zn_ceilings *c, const zn_cost_compute *comp,
                           int64_t layers, uint64_t tokens, int mom_fmt, zn_cost *out);

/* The analytic compute of one micro-batch (no probe): FLOPs per block at
 * the target's GEMM rate times its whole-layer efficiency. */
ZN_API void zn_cost_compute_analytic(const zn_ceilings *c, double layer_flops_fwd,
                                     double head_flops, bool checkpoint, zn_cost_compute *out);


#ifdef __cplusplus
}
#endif
#endif
