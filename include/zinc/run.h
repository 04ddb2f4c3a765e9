/* A training run set up from a config (src/run/): config plus machine in, a
 * ready trainer out. The model a config describes, the tier budgets on this
 * machine, the planner's input, the optimizer's placement, then the ranks
 * joined, the weights loaded, the trainer created and the data opened.
 * `zinc train`, `zinc plan`, `zinc bench train` and the tests all use it,
 * so each makes the same decisions. Ownership: a zn_run owns everything it
 * points to; zn_run_close frees it. */
#ifndef ZN_RUN_H
#define ZN_RUN_H

#include <stdint.h>
#include <stdio.h>

#include "zinc/ckpt.h"
#include "zinc/comm.h"
#include "zinc/config.h"
#include "zinc/cost.h"
#include "zinc/model.h"
#include "zinc/plan.h"
#include "zinc/tokens.h"
#include "zinc/topo.h"
#include "zinc/train.h"
#include "zinc/util.h"

/* ---- decisions a config leaves to the machine --------------------------- */

/* The model a config describes: from an HF folder (model.path) or from the
 * dimensions of its `model` section, with its lora section (and
 * lora.adapter's adapter_config.json). Returns 0, ZN_ECONFIG (named),
 * -errno, ZN_ECORRUPT. */
ZN_API int zn_run_model_dims(const zn_config *cfg, zn_model_dims *d);

/* Elements of the parameter tensors smaller than `threshold`: those stay
 * on the GPU (DeepSpeed's stage3_param_persistence_threshold). */
ZN_API uint64_t zn_run_persistent_params(const zn_model_dims *d, uint64_t threshold);

/* Whether the config's train.device is a CUDA GPU that answers here, and
 * its free memory for an "auto" GPU budget (0: host backend or no GPU). */
ZN_API int zn_run_has_cuda(const zn_config *cfg);
ZN_API uint64_t zn_run_gpu_free(const zn_config *cfg);

/* The three tier budgets of a config; "auto" becomes: GPU, the device's
 * free memory less 1 GiB (host backend: a quarter of RAM, as its arena);
 * CPU, 90% of MemAvailable; NVMe, the free space of each path's file
 * system (the offload sections' nvme_path directories count when tiers.nvme
 * does not list them). Returns 0 or -errno naming the path. */
ZN_API int zn_run_budgets(const zn_config *cfg, const zn_topo *topo, uint64_t gpu_free,
                          zn_plan_budgets *b);

/* Checks explicit budgets against this machine: tiers.cpu against its RAM,
 * explicit tiers.nvme sizes (summed per file system) against each file
 * system's free space; RLIMIT_MEMLOCK below the cpu budget is a warning.
 * strict (a run): a problem is ZN_ECONFIG naming what the machine has; else
 * (a plan, perhaps for another machine) a warning. Where the explicit NVMe
 * sizes are short, what dead runs left in the swap folders counts as free:
 * a run removes it first (zn_swap_clean_stale), a plan says how much it
 * found; a shortfall left names the swap zinc may not remove (a live
 * run's) and the checkpoint folder on the same file system. */
ZN_API int zn_run_check_budgets(const zn_config *cfg, const zn_topo *topo,
                                const zn_plan_budgets *b, int strict);

/* The data a run of cfg on model d reads, checked as the run checks it,
 * without reading it all: a model from model.path needs data.path (or
 * "synthetic", said on purpose), and each token file (data.path,
 * data.eval_path) must open and have a vocabulary within the model's.
 * A file that cannot be opened is an error when strict (a run), a warning
 * otherwise (a plan, perhaps made where the data is not). Returns 0,
 * ZN_ECONFIG or the token file's error, named. */
ZN_API int zn_run_check_data(const zn_config *cfg, const zn_model_dims *d, int strict);

/* The weights a run of cfg would load, checked as the run checks them
 * before it allocates (every shard's header read, every tensor present
 * with its shape and a dtype zinc trains from, no file truncated, the PEFT
 * adapter of lora.adapter): so a plan that fits is a run that starts.
 * Reads no tensor data. Returns 0, 1 when model.path is a folder with no
 * weights at all (a plan is made from its config.json's shapes alone, as
 * a user plans before downloading; `zinc train` refuses it), or the run's
 * error. */
ZN_API int zn_run_check_weights(const zn_config *cfg, const zn_model_dims *d);

/* The planner's input for a model and a config on `world` ranks. `blocks`
 * must hold zn_model_num_parts(d) entries (the blocks as the trainer
 * streams them, the vocabulary in parts); in points into it. The micro
 * batch, sequence length and precision come from cfg alone: zn_train_create
 * refuses an input that disagrees with its config. */
ZN_API void zn_run_plan_input(const zn_config *cfg, const zn_model_dims *d, int world,
                              uint64_t *blocks, zn_plan_input *in);

/* A config that keeps the optimizer on the GPU (offload_optimizer.device
 * "none", as the HF Trainer's and LLaMA-Factory's ZeRO configs without
 * offload do): zinc steps it there when the plan fits; when it does not,
 * and would with the states in pinned RAM and the CPU Adam, they move there
 * (spec and cfg are changed) and `note` (may be NULL) says so. Plan and train both
 * call this with the same options, so both take the same placement.
 * Returns 1 when it moved them, 0 when not, or a negative error of a dry
 * plan. */
ZN_API int zn_run_fit_optimizer(zn_config *cfg, zn_spec *spec, const zn_train_options *o,
                                int world, FILE *note);

/* Resolves the config's "auto" values against its model and the device,
 * then the batch keys against `world`, and prints the values that decide
 * the training (optimizer, schedule, clipping, precision, batch, ZeRO,
 * buckets), each with where it came from, to `out` (NULL: silent). Returns
 * 0 or the failing call's code with zn_last_error() set. */
/* The cost model's cache directory (ZINC_CACHE_DIR, XDG_CACHE_HOME/zinc or
 * ~/.cache/zinc) into out. */
ZN_API int zn_run_cache_path(char *out, size_t n);

enum { ZN_CEIL_RECALIBRATE = 1, ZN_CEIL_CACHED = 2 };
/* This machine's ceilings (zinc/cost.h) for cfg's device and NVMe path, and
 * with d the compute of one micro-batch at cfg's shape: from the cache, or
 * measured now and cached (ZN_CEIL_RECALIBRATE: measured again;
 * ZN_CEIL_CACHED: nothing measured, what the cache lacks stays 0). What is
 * measured is announced on `note` (NULL: silent). */
ZN_API int zn_run_ceilings(const zn_config *cfg, const zn_model_dims *d, int flags,
                           zn_ceilings *c, zn_cost_compute *comp, FILE *note);
/* The cost model's prediction of one step of `plan` (zn_train_plan's, for
 * cfg and d) on this machine: zn_run_ceilings, then zn_cost_predict. */
ZN_API int zn_run_predict(const zn_config *cfg, const zn_model_dims *d, const zn_plan *plan,
                          int flags, zn_cost *out, FILE *note);
/* What stopping on a signal costs this run, and how old the checkpoint it
 * leaves can be. One rank stops inside the step in progress, before its
 * update; ranks finish it (step_s, the caller's measured step time; 0 in a
 * plan). Either way the last finished step's update, which the optimizer
 * runs under the next step's forward, must land first: update_s, the
 * cost model's optimizer chain (zn_cost.opt_s; 0: not known). Then: with the optimizer state in the cpu tier, saves in the
 * background (train.checkpoint.background) and one every step, the save of
 * the last step, written while the next runs, completes when what is left
 * of it fits half the notice (train.checkpoint.notice_s), else it is
 * dropped and the one before it stays (one step old); otherwise the ranks
 * on this machine (local_ranks) save the last finished step's master and
 * moments (read back from NVMe where they live there) through the
 * checkpoint folder's disk, except what the final save keeps in place:
 * the NVMe tier's state when it is on one path on the checkpoint folder's
 * file system (a periodic save in progress is cancelled for it where the
 * signal arrives; ranks the signal did not reach finish their part first,
 * which save_s bounds). The disks are measured as the cost model
 * measures the NVMe path, once per file system, and cached with its
 * figures (measure false: the cached figures, or 1 GB/s assumed, said by
 * `assumed`); no device is opened. Returns 0, or the measurement's
 * failure. */
typedef struct {
    uint64_t save_bytes;   /* written by the ranks on this machine */
    uint64_t read_bytes;   /* of them, read from NVMe first */
    uint64_t inplace_bytes;  /* of them, on NVMe and kept in place by the final
                                save (the swap file linked into the checkpoint:
                                the NVMe tier on one path, on the checkpoint
                                folder's file system) */
    double final_s;        /* the stop's own save: the rest written (and read) */
    double write_bps;      /* the checkpoint folder's disk */
    double read_bps;       /* the NVMe path's */
    double step_s, save_s, total_s;   /* total_s: stop_s */
    double update_s;       /* the last finished step's update, when it is still
                              running under the next step (the optimizer
                              pipelined after the step): the stop waits for
                              it, since the checkpoint is that step's state */
    bool background;       /* the saves written while the next step runs */
    bool cpu_state;        /* the optimizer state all in the cpu tier (it could be) */
    bool assumed;          /* no figure measured or cached: 1 GB/s assumed */
    double stop_s;         /* from the signal to the exit, at most */
    int64_t age_steps;     /* finished steps the checkpoint left may lack (0 or 1) */
    bool commit;           /* every step committed in place (train.checkpoint.commit: one
                              rank, the NVMe states in two copies, kept in place): a
                              stop drops the update in flight, drain_s */
    double drain_s;        /* that update's I/O in flight: the read and write of its
                              buffer_count units in flight */
    int world;
    char disk[ZN_PATH_MAX];  /* the folder measured */
} zn_stop_estimate;
ZN_API int zn_run_stop_estimate(const zn_config *cfg, const zn_plan *plan, int world,
                                int local_ranks, double step_s, double update_s, bool measure,
                                zn_stop_estimate *e, FILE *note);
/* The same estimate with the update taken as `update_s` (a run's measured
 * longest, zn_train_report.opt_job_max_s): stop_s and total_s again. */
ZN_API void zn_run_stop_set_update(zn_stop_estimate *e, const zn_config *cfg, double update_s);

/* Prints the cost model's prediction beside a run's measured report (per
 * step). */
ZN_API void zn_run_cost_print_vs(const zn_cost *pred, const zn_train_report *r, int world,
                                 FILE *f);

/* Resolves the config once for a run on `world` ranks: with `resume` (a
 * checkpoint saved by another world size, may be NULL) the global batch it
 * trained with is kept and the accumulation follows (said on `out`); every
 * "auto" against the model and the device; the batch keys against the
 * world. Then prints the effective settings to `out` (NULL: silent). A
 * config already resolved for `world` is left as it is (zn_run_open after
 * the CLI resolved it): the rules run once per run. Returns 0, ZN_ECONFIG
 * (named), ZN_EARG (resolved for another world). */
ZN_API int zn_run_resolve(zn_config *cfg, const zn_ckpt *resume, int world, FILE *out);
/* zn_run_resolve without a checkpoint. */
ZN_API int zn_run_effective(zn_config *cfg, int world, FILE *out);
ZN_API void zn_run_effective_print(const zn_config *cfg, int world, FILE *out);

/* ---- the door: the run spec ------------------------------------------------
 * The only translation of a config into what the planner and the trainer
 * take (zn_spec, include/zinc/plan.h): `in` is the planner's input
 * (zn_run_plan_input), `budgets` the resolved tier budgets (NULL: zeros,
 * for the caller to set). A swap folder the run could not use is kept in
 * spec->nvme_error and reported when a run opens its swap. Returns 0 or
 * ZN_EARG. */
ZN_API int zn_run_spec(const zn_config *cfg, const zn_plan_input *in,
                       const zn_plan_budgets *budgets, zn_spec *spec);
/* The NVMe engine settings of a config's `aio` section. */
ZN_API zn_aio_config zn_run_aio_config(const zn_config *cfg);

/* ---- the run ------------------------------------------------------------ */

typedef struct {
    zn_train_llama *llama;
    zn_trainer *tr;
    zn_tokens *data;
    zn_loader *loader;
    int32_t *ids, *tgts, *pos;
    zn_model_dims dims;
    uint64_t params;
    /* the ranks (mpirun / srun / torchrun launch; world 1 otherwise) */
    zn_comm *comm;
    int rank, world;
    int local_size;            /* ranks on this machine */
    size_t rank_tokens;        /* ids of one rank's micro-batches per step */
    zn_tokens *eval_data;      /* data.eval_path, or NULL */
    zn_loader *eval_loader;    /* its windows in file order, the global batch */
    int32_t *eval_ids, *eval_tgts, *eval_pos;
    char weights[4400];        /* where the initial weights came from, for the header */
    char lora[4400];           /* LoRA: the adapters' line for the header ("" none) */
    double load_s;             /* seconds spent creating the trainer (weights written home) */
    uint64_t load_bytes;       /* checkpoint bytes read */
} zn_run;

/* zn_run_open flags */
#define ZN_RUN_TRACE 1       /* record a trace */
#define ZN_RUN_NO_WEIGHTS 2  /* a checkpoint will overwrite the state: do not
                                read model.path's weights (seeded init) */
#define ZN_RUN_SHAPES_ONLY 4 /* (zn_run_check_weights) a model folder with only
                                its config.json is planned from its shapes */

/* Joins the job's ranks (a communicator from the launch environment: world
 * 1 when not launched by mpirun / srun / torchrun), resolves batch keys,
 * dims, budgets ("auto" ones shared among the ranks of one host) and the
 * plan input, then creates the trainer (which refuses an infeasible plan
 * with its explanation) and the data (every rank reads the global batch
 * and trains on its slice). The initial weights are model.path's
 * safetensors (model.init "weights", the default with a path: a folder
 * without weights is an error) or the seeded init; r->weights says which.
 * Notes on decisions the run took for the user (the optimizer moved to
 * pinned RAM) go to `note` on rank 0 (NULL: none). Returns 0 or a status
 * with zn_last_error() set; on failure only the communicator is left:
 * report, then zn_run_abort and zn_run_close. */
ZN_API int zn_run_open(zn_run *r, zn_config *cfg, int flags, FILE *note);
/* Reopens the training data with the synthetic set's size fixed at
 * `count` ids (> 0; a resumed run must see the ids its checkpoint was
 * trained on), or its default size (0). */
ZN_API int zn_run_open_data(zn_run *r, const zn_config *cfg, uint64_t count);
/* The mean loss over data.eval_path's targets (train.eval_batches global
 * batches, 0 = the whole file) on the current parameters, all ranks
 * together; *n_targets what it averaged. */
ZN_API int zn_run_eval(zn_run *r, const zn_config *cfg, double *mean, uint64_t *n_targets);
/* One optimizer step on the loader's batch `step`. */
ZN_API int zn_run_step(zn_run *r, uint64_t step, zn_train_step_info *info);
/* Frees everything the run holds, the communicator too (accepts a zeroed
 * or half-opened run). */
ZN_API void zn_run_close(zn_run *r);
/* Frees the trainer alone (its swap files are removed; the communicator
 * stays), for a stop that must say its files are gone before the ranks
 * part. zn_run_close later frees the rest. */
ZN_API void zn_run_free_trainer(zn_run *r);
/* Returns when every rank of the run has called it (at once with one
 * rank); the communicator's failure (a dead rank, its timeout) otherwise. */
ZN_API int zn_run_barrier(zn_run *r);
/* After a failure in a job of several ranks: tells the other ranks
 * (zn_comm_abort); 1 when the caller must end the job with MPI_Abort.
 * 0 and nothing done for one rank. */
ZN_API int zn_run_abort(zn_run *r, int code);

#endif
