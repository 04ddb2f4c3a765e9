/* The placement planner: how many bytes of each class of training state a
 * model needs, and in which tier (GPU HBM, pinned CPU RAM, NVMe) each class
 * lives under a config's offload settings. `zinc plan` prints it; `zinc
 * train` refuses to start when it does not fit. The planner knows nothing
 * about models: the caller passes per-block parameter counts and the
 * activation shape. */
#ifndef ZINC_PLAN_H
#define ZINC_PLAN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "zinc/config.h"
#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ZN_TIER_GPU = 0, ZN_TIER_CPU, ZN_TIER_NVME, ZN_TIER_COUNT } zn_tier;

typedef enum {
    ZN_STATE_PARAMS = 0,   /* 16-bit working parameters (fp32 on the host backend) */
    ZN_STATE_MASTER,       /* fp32 master parameters */
    ZN_STATE_ADAM_M,       /* Adam first moment, fp32 */
    ZN_STATE_ADAM_V,       /* Adam second moment, fp32 */
    ZN_STATE_GRADS,        /* fp32 gradient accumulators */
    ZN_STATE_ACT_CKPT,     /* checkpointed layer inputs, all layers */
    ZN_STATE_WORK,         /* working buffers: live parameter window, layer
                              activations, swap/staging buffers */
    ZN_STATE_COUNT
} zn_state_class;

/* What the planner needs to know about the model and the run. */
typedef struct {
    int n_blocks;                   /* blocks in execution order */
    const uint64_t *block_params;   /* parameters (elements) per block */
    uint64_t trainable_params;      /* of them, those that train (LoRA: the
                                       adapters); 0 = all */
    uint64_t persistent_params;     /* elements small enough to stay on the GPU
                                       (stage3_param_persistence_threshold), and
                                       a tied embedding */
    uint64_t tied_params;           /* elements of a tied embedding (0: none): the
                                       run also keeps an fp32 gradient buffer of
                                       this size on the GPU */
    /* activation shape */
    int64_t n_layers, hidden, n_heads, n_kv_heads, head_dim, intermediate, vocab;
    int64_t micro_batch, seq_len;
    int param_bytes;                /* 2 (bf16/fp16 on a GPU) or 4 (fp32) */
    bool cuda;                      /* on a CUDA device: the plan counts what its
                                       streams (cuBLAS handles, workspaces,
                                       scratch) and NCCL hold outside the arena */
    int world_size;
    bool activation_checkpointing;
} zn_plan_input;

/* Budgets in bytes, "auto" already resolved by the caller. */
typedef struct {
    uint64_t bytes[ZN_TIER_COUNT];
} zn_plan_budgets;

typedef struct {
    uint64_t params_total;                          /* elements, whole model */
    uint64_t params_trainable;  /* of them, those that train (LoRA: the adapters) */
    uint64_t bytes[ZN_STATE_COUNT][ZN_TIER_COUNT];  /* this rank's bytes */
    uint64_t tier_total[ZN_TIER_COUNT];
    uint64_t budget[ZN_TIER_COUNT];
    /* of tier_total[GPU], what a CUDA run holds outside its arena: each
     * stream's cuBLAS workspace and scratch, NCCL's buffers with several
     * ranks (a 16-bit plan is a CUDA plan; the host backend trains fp32) */
    uint64_t gpu_outside;
    uint64_t gpu_outside_nccl;                      /* of it, NCCL's */
    uint64_t largest_block;                         /* elements */
    uint64_t live_window;                           /* elements on the GPU at once */
    uint64_t sub_group;                             /* optimizer sub-group, elements */
    int moment_bytes;                               /* bytes per Adam moment element:
                                                       4 fp32, 2 bf16, 1 int8 (train.optim) */
    int master_bytes;                               /* bytes per master element: 4
                                                       fp32, 2 bf16 with stochastic
                                                       rounding (train.master_weights) */
    zn_tier grads_tier;                             /* fp32 gradient accumulators */
    uint64_t nvme_write_step;                       /* bytes written to NVMe per
                                                       optimizer step (this rank) */
    uint64_t nvme_write_part[3];                    /* of which: optimizer states,
                                                       params, gradient accumulators */
    bool opt_fits_cpu;                              /* the states asked on NVMe
                                                       would fit in the cpu tier */
    bool params_fit_cpu;                            /* so would the params asked
                                                       on NVMe (their staging
                                                       still counted) */
    /* One optimizer step's work on this rank, counted by the trainer's own
     * schedule run dry (zn_train_plan; zeros from zn_plan_compute alone):
     * what the cost model (zinc/cost.h) turns into time. */
    struct {
        uint64_t h2d, d2h;            /* bytes over the host link */
        uint64_t nvme_read, nvme_write;
        uint64_t accum_bytes;         /* host memory touched accumulating gradients */
        uint64_t dev_accum_bytes;     /* device memory touched summing them there
                                         (the optimizer on the device) */
        uint64_t adam_params;         /* elements the optimizer steps */
        uint64_t chain_read, chain_write;  /* of the NVMe bytes, the optimizer
                                         chain's: the states read and written,
                                         the gradients read for it, updated
                                         params written to an NVMe home and
                                         read back by the next first forward
                                         (which waits for them) */
        uint64_t gather_bytes;        /* parameter all-gathers (world > 1) */
        uint64_t reduce_bytes;        /* gradient reduce-scatters (world > 1) */
        uint32_t fetches, nvme_fetches, cache_fetches;  /* block fetches */
        int micro_batches;
        bool opt_on_device, opt_on_nvme, overlap_step, pipelined;
        bool master_sr;               /* the bf16 master (train.master_weights
                                         bf16_sr): Adam's rate is that step's */
    } step;
    bool fits;
    char why[2048];   /* when it does not fit: what is short, by how much, and the fix */
    /* The allocations the run makes, item by item (zn_train_plan: the
     * trainer's own allocation code run without allocating); n_items 0 when
     * the plan is the class estimate of zn_plan_compute alone. Items of one
     * kind (every layer's checkpoint, every slot) are one row with a count. */
    struct {
        char what[40];
        zn_tier tier;
        zn_state_class cls;
        uint64_t bytes;    /* all of them */
        uint32_t count;
    } items[48];
    int n_items;
} zn_plan;

ZN_API const char *zn_tier_name(zn_tier t);
ZN_API const char *zn_state_name(zn_state_class c);

/* Computes the plan. Returns 0 when it fits, ZN_ENOFIT when it does not
 * (plan->why and zn_last_error() say what is short and which setting would
 * fix it), ZN_ECONFIG for inconsistent input. The plan is filled in both
 * of the first two cases. */
ZN_API int zn_plan_compute(zn_plan *plan, const zn_config *cfg, const zn_plan_input *in,
                           const zn_plan_budgets *budgets);

/* Replaces the class table with the itemized allocations (plan->items) and
 * decides again whether it fits, with the same explanation and fix as
 * zn_plan_compute. Returns 0 or ZN_ENOFIT. */
ZN_API int zn_plan_use_items(zn_plan *plan, const zn_config *cfg);

/* Prints the class x tier table with budgets and headroom. */
ZN_API void zn_plan_print(const zn_plan *plan, FILE *f);
/* Prints the itemized allocations (what, tier, count, bytes). */
ZN_API void zn_plan_print_items(const zn_plan *plan, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
