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

#include "zinc/nvme.h"
#include "zinc/optim.h"
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

/* Where fp32 gradient accumulators live when the optimizer states are on
 * NVMe (tiers.grads). */
typedef enum {
    ZN_GRADS_AUTO = 0,  /* pinned RAM when the cpu tier has room, else NVMe */
    ZN_GRADS_CPU,
    ZN_GRADS_NVME,      /* with the states (DeepSpeed's behaviour) */
} zn_grads_tier;

/* How the user's config names the settings a message may ask to change.
 * The door fills it (a DeepSpeed config's keys), so that a plan's fix or a
 * trainer's refusal says what to edit in the user's own words while the
 * planner and the trainer know no key. String literals: they outlive
 * every spec and plan that points to them. */
typedef struct {
    const char *opt_home;          /* where the optimizer states live */
    const char *param_home;        /* where the parameters live */
    const char *param_max_in_cpu;  /* parameters kept in RAM when their home is NVMe */
    const char *micro_batch;       /* sequences per micro-batch */
    const char *opt_unit;          /* elements per optimizer unit */
    const char *zero_stage;        /* the ZeRO stage */
} zn_spec_keys;

/* ---- the run spec: everything the planner and the trainer are told ---------
 * Resolved once per run by src/run/ (zn_run_spec_*, from the user's config,
 * the command line, the checkpoint being resumed and the fitting rules)
 * and copied by the trainer; the planner and the trainer read nothing
 * else: no config struct and no config key reaches src/plan or src/train.
 * Each field is a decision already taken; they only check what they alone
 * can know (the device the run got, what fits). */
typedef struct zn_spec {
    const char *source;           /* the config's name, for messages */
    zn_spec_keys key;             /* the user's names of the settings */
    zn_plan_input plan;           /* the model's shape, the micro-batch, the
                                     sequence, precision and world: the one copy */
    zn_plan_budgets budgets;      /* tier budgets, "auto" already resolved */
    /* the step */
    int64_t accumulation;         /* micro-batches per optimizer step (>= 1) */
    uint64_t seed;                /* dropout masks, stochastic rounding, LoRA init */
    double clip;                  /* global-norm clipping threshold (0: none) */
    double lr;                    /* the schedule's base */
    zn_lr_sched sched;
    double beta1, beta2, eps, weight_decay;
    bool adamw;                   /* decoupled weight decay */
    bool bias_correction;
    /* precision */
    bool bf16;                    /* 16-bit working parameters: bf16 */
    bool fp16;                    /* ... fp16, with loss scaling */
    zn_loss_scale_config loss_scale;
    int grad_transfer;            /* gradients leave the device in: 0 the
                                     params' dtype, 1 fp32, 2 bf16 */
    int moment_bytes;             /* Adam moments: 4 fp32, 2 bf16, 1 8-bit */
    zn_q8_scheme q8_scheme;       /* 8-bit moments: whose quantization */
    bool master_bf16_sr;          /* bf16 master with stochastic rounding */
    int speculate;                /* train.speculative_step: 0 auto, 1 on, 2 off */
    bool commit_only;             /* every step committed by reference and no periodic
                                     save copies the states (train.checkpoint.commit,
                                     every 0): auto's second copy needs no
                                     room for a copy of the states beside it */
    /* placement (ZeRO) */
    int zero_stage;               /* 1, 2 or 3 */
    zn_tier param_home;           /* where the working parameters live */
    zn_tier opt_home;             /* where master, moments (and gradients) live */
    uint64_t persistence_threshold; /* tensors smaller than this stay on the GPU */
    uint64_t param_max_in_cpu;    /* parameter home in RAM: at most this many
                                     elements (0: no limit) */
    int64_t param_buffers;        /* NVMe parameter staging buffers (>= 1) */
    int64_t opt_buffers;          /* NVMe optimizer units in flight (>= 1) */
    uint64_t param_buffer_size;   /* elements of one NVMe parameter staging buffer */
    uint64_t opt_unit;            /* elements per optimizer unit (sub-group) */
    double opt_ratio;             /* share of the optimizer stepped at opt_home
                                     (the rest on the GPU) */
    uint64_t prefetch_bucket;     /* parameter elements fetched ahead */
    uint64_t max_live_params;     /* parameter elements live on the GPU at once */
    int param_cache;              /* pinned buffers handing NVMe-home parameters
                                     from the optimizer to the next forward */
    zn_grads_tier grads;          /* optimizer on NVMe: where the gradient
                                     accumulators go */
    bool cpu_activations;         /* checkpointed layer inputs in pinned RAM */
    /* the machine */
    char device[64];              /* "auto", "host", "cuda:N" */
    int threads;                  /* CPU threads for Adam and norms (0: OpenMP's) */
    /* NVMe swap */
    zn_aio_config aio;            /* the engine (fault hooks: zn_train_options) */
    int n_nvme;                   /* swap folders, striped */
    int stripe_paths;             /* staging buffers are per striped path: the
                                     folders the user listed (>= 1) */
    char nvme_path[ZN_SWAP_MAX_PATHS][ZN_PATH_MAX];
    bool nvme_create[ZN_SWAP_MAX_PATHS]; /* missing, and the run may create it */
    char nvme_error[ZN_PATH_MAX + 512]; /* a swap folder the run may not use: why
                                     (reported when the run opens its swap) */
    bool keep_swap;               /* keep the swap files after a clean exit */
} zn_spec;

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
    uint64_t spec_shadow;                           /* the speculative step's second
                                                       copy of the NVMe optimizer
                                                       states (in nvme work; 0: off) */
    uint64_t spec_declined;                         /* auto left that copy out for
                                                       want of room (its bytes) */
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
    zn_spec_keys key; /* the spec's, for the fixes zn_plan_print suggests */
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
ZN_API int zn_plan_compute(zn_plan *plan, const zn_spec *spec);

/* Replaces the class table with the itemized allocations (plan->items) and
 * decides again whether it fits, with the same explanation and fix as
 * zn_plan_compute. Returns 0 or ZN_ENOFIT. */
ZN_API int zn_plan_use_items(zn_plan *plan, const zn_spec *spec);

/* Prints the class x tier table with budgets and headroom. */
ZN_API void zn_plan_print(const zn_plan *plan, FILE *f);
/* Prints the itemized allocations (what, tier, count, bytes). */
ZN_API void zn_plan_print_items(const zn_plan *plan, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
