/* zinc training: the tier manager (every tensor of the training state, its
 * home tier, hard budgets and high-water marks), the overlapped schedule
 * (parameters prefetched NVMe -> pinned -> device ahead of use, gradients
 * D2H into fp32 accumulators, CPU Adam by sub-group with optimizer states
 * read ahead / written behind on NVMe), learning-rate schedules and
 * dynamic loss scaling. `zinc train` is a thin driver over this header.
 *
 * The trainer is generic over a model made of blocks run in order (the
 * Llama decoder's embedding, layers and head; tests use small blocks of
 * their own): zn_train_model, include/zinc/train_model.h. */
#ifndef ZINC_TRAIN_H
#define ZINC_TRAIN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "zinc/cost.h"
#include "zinc/device.h"
#include "zinc/model.h"
#include "zinc/nvme.h"
#include "zinc/plan.h"
#include "zinc/trace.h"
#include "zinc/train_model.h"
#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the trainer ----------------------------------------------------------*/
typedef struct zn_trainer zn_trainer;


typedef struct {
    const zn_spec *spec;          /* copied (include/zinc/plan.h) */
    const zn_train_model *model;  /* must outlive the trainer */
    int record_trace;             /* keep spans for zn_train_write_trace */
    zn_aio_fault_fn fault_hook;   /* passed to the NVMe engine (tests) */
    void *fault_user;
    /* Fault injection (tests): each step's learning rate passes through it
     * (step from 1) before the optimizer uses it, so a test can put a known
     * error into one step's update and see its bounds catch it. NULL: none. */
    double (*lr_fault)(void *user, int64_t step, double lr);
    void *lr_fault_user;
    /* Tests: with the speculative step, each step gives the optimizer its
     * go only once the job has stepped every unit it may before the norm,
     * so that commits and second steps happen whatever the threads'
     * timing. */
    int spec_settle;
    /* The ranks of a ZeRO job (include/zinc/comm.h); NULL = one rank. With
     * world size N > 1 every block's parameters, gradients and optimizer
     * states are sharded N ways (ZeRO stage 3). Must outlive the trainer;
     * every rank creates its trainer with the same spec. */
    struct zn_comm *comm;
} zn_train_options;

ZN_API zn_train_options zn_train_options_default(void);

/* The plan the run allocates from: zn_plan_compute's placement, then the
 * trainer's own layout and allocation code run without allocating (for
 * rank 0 of `world` ranks, parameters of param_bytes from plan_in), each
 * allocation recorded in plan->items and the class table rebuilt from them
 * (zn_plan_use_items). zn_train_create makes the same plan and refuses to
 * start when it does not fit. Returns 0, ZN_ENOFIT (plan->why says what is
 * short), ZN_ECONFIG, ZN_EUNSUPPORTED, -ENOMEM. */
ZN_API int zn_train_plan(zn_plan *plan, const zn_train_options *o, int world);

/* Plans (zn_plan_compute), then creates the device, the NVMe engine and swap
 * space, allocates every tier once and initialises the parameters and
 * optimizer states in their home tiers. An infeasible plan fails before any
 * allocation with ZN_ENOFIT and the planner's explanation. Returns 0,
 * ZN_ENOFIT, ZN_EBUDGET (an allocation beyond a tier's budget, named),
 * ZN_EUNSUPPORTED (e.g. the optimizer on a CUDA device: use the cpu),
 * ZN_ECONFIG, ZN_ENODEV, -errno. */
ZN_API int zn_train_create(zn_trainer **out, const zn_train_options *o);
ZN_API void zn_train_destroy(zn_trainer *tr); /* accepts NULL */

typedef struct {
    int64_t step;            /* 1-based optimizer step just taken (or skipped) */
    double loss;             /* mean per-token loss over the step's micro-batches */
    double lr;               /* learning rate used */
    double grad_norm;        /* global L2 norm of the (unscaled) gradients */
    double loss_scale;       /* scale used (1 without fp16) */
    int skipped;             /* fp16 overflow: the update was skipped */
    double seconds;          /* wall time of the step */
    uint64_t tokens;         /* tokens processed */
    int has_aux;             /* the model adds a load-balancing loss (read_aux_loss) */
    double aux_loss;         /* its mean over the step's micro-batches, unweighted (in
                                `loss` with its coefficient) */
} zn_train_step_info;

/* One optimizer step over spec.accumulation micro-batches.
 * ids / targets / pos: host int32, accumulation x micro_batch x seq_len
 * each; pos may be NULL (each sequence one document; else each token's
 * position in its packed document, see zn_model_set_batch).
 * The step returns once its loss and gradient norm are known and its
 * optimizer job has what it needs (with clipping or fp16: the global norm);
 * the CPU optimizer and its NVMe traffic finish under the next step's
 * forward, whose uses of each block wait only for that block's updated
 * parameters. (ZeRO stages 1/2 on several ranks wait for the whole job.)
 * Returns 0, or the first error of any stream or thread, including the
 * previous step's optimizer (an NVMe error names the tensor, the file and
 * the offset). After an error the trainer's state is marked bad: later
 * calls return ZN_ECORRUPT and nothing it holds is presented as a valid
 * model. */
ZN_API int zn_train_step(zn_trainer *tr, const int32_t *ids, const int32_t *targets,
                         const int32_t *pos, zn_train_step_info *info);

/* A flag (a signal handler's) that ends a step early: while *flag is
 * nonzero, zn_train_step stops before its next block as long as its
 * optimizer update has not begun (without clipping or fp16 a unit steps
 * as soon as its gradients are final, late in the backward; after that the
 * step runs to its end), drops its update and returns -ECANCELED; the
 * trainer is then valid and holds the previous step's state (the previous
 * step's own update, finishing under this step's forward, goes on:
 * zn_train_sync), so it may be saved. NULL: off (the default). One rank
 * only (ZN_EARG with ranks: the others would wait in the step's
 * collectives). */
ZN_API int zn_train_set_stop(zn_trainer *tr, const volatile sig_atomic_t *flag);

/* Evaluation: the forward of n_micro micro-batches (ids / targets / pos like
 * zn_train_step's) through the same schedule, without gradients or an
 * optimizer step, on the parameters of the last step (each block waits for
 * its update). *loss_sum is the sum of the targets' cross-entropy and
 * *n_targets their count (targets >= 0), over every rank: every rank calls
 * it at the same point with its own slice. Returns 0 or an error (the
 * trainer is then bad, as after a failed step). */
ZN_API int zn_train_eval(zn_trainer *tr, const int32_t *ids, const int32_t *targets,
                         const int32_t *pos, int n_micro, double *loss_sum,
                         uint64_t *n_targets);

/* Waits for the optimizer work the last step left running; returns its
 * error (the trainer is then bad). Checkpoints, zn_train_read_master and
 * zn_train_reset_counters call it themselves; call it before reading a
 * report at the end of training. The wait counts as step time. */
ZN_API int zn_train_sync(zn_trainer *tr);

/* Copies the fp32 master weights (flat, all blocks in order: n = the
 * trainable parameters, zn_train_num_params; with a frozen base, each
 * block's trainable tail) into out, from wherever they live. Returns 0, ZN_EARG (n
 * wrong), ZN_ECORRUPT (the trainer failed earlier), or an I/O error. */
ZN_API int zn_train_read_master(zn_trainer *tr, float *out, uint64_t n);

/* Parameters that train (all, or with a frozen base the trainable tails). */
ZN_API uint64_t zn_train_num_params(const zn_trainer *tr);
ZN_API const zn_plan *zn_train_get_plan(const zn_trainer *tr);
ZN_API zn_dev *zn_train_device(zn_trainer *tr);
/* The NVMe engine (NULL when nothing lives on NVMe); tests arm
 * zn_aio_inject_fault on it. */
ZN_API zn_aio *zn_train_aio(zn_trainer *tr);


typedef struct {
    uint64_t budget[ZN_TIER_COUNT];
    uint64_t plan[ZN_TIER_COUNT];   /* what the plan (zn_train_plan) said the run
                                       allocates */
    uint64_t used[ZN_TIER_COUNT];   /* live now */
    uint64_t peak[ZN_TIER_COUNT];   /* high-water mark */
    /* bytes moved, per link and direction */
    uint64_t h2d_bytes, d2h_bytes, nvme_read_bytes, nvme_write_bytes;
    double busy_s[ZN_RES_COUNT];    /* summed over the steps run */
    double step_s;                  /* summed wall time of the steps (and syncs) */
    double param_wait_s;            /* the schedule waited for the previous
                                       step's optimizer to land parameters */
    uint64_t param_cache_hits;      /* block fetches served from the param
                                       cache (the optimizer's pinned copy)
                                       instead of NVMe */
    uint64_t param_cache_bytes;     /* bytes those fetches did not read */
    int param_cache_entries;        /* its buffers (0: off) */
    /* the speculative step (train.speculative_step): optimizer units stepped
     * before the global norm was known; of them, those committed as they
     * were and those stepped again because clipping or an fp16 overflow
     * changed the step */
    uint64_t spec_units, spec_commits, spec_redos;
    /* param cache entries whose block a speculative update filled, ready
     * (for the next forward) once the update committed */
    uint64_t spec_cache_fills;
    int speculative;                /* 1: the NVMe states have the second copy */
    int64_t steps;
    uint64_t tokens;
    double flops;                   /* model FLOPs of the steps run */
    int param_slots;                /* device parameter slots in the ring */
    int persistent_blocks;          /* blocks resident on the device */
    uint64_t opt_unit;              /* optimizer unit (elements) */
    int opt_units;                  /* units (sub-groups) per step */
    int opt_inflight;               /* units in flight on NVMe */
    int overlap_step;               /* 1: optimizer overlapped with backward */
    double opt_job_max_s;           /* the longest optimizer job so far, from its
                                       start to its end (a step's update; the
                                       next step's compute runs beside it): what
                                       a stop waits for at most when it comes as
                                       one begins. Not cleared by
                                       zn_train_reset_counters */
    const char *param_dtype;        /* "f32" / "bf16" */
    const char *backend;            /* device name */
} zn_train_report;

ZN_API void zn_train_get_report(zn_trainer *tr, zn_train_report *r);
/* Clears busy times, step time and byte counters (after warm-up steps). */
ZN_API void zn_train_reset_counters(zn_trainer *tr);
/* Per-tier table and step-time breakdown, for people. */
ZN_API void zn_train_print_report(zn_trainer *tr, FILE *f);
/* Writes the Chrome trace (record_trace must have been set). */
ZN_API int zn_train_write_trace(zn_trainer *tr, const char *path);

#ifdef __cplusplus
}
#endif
#endif
