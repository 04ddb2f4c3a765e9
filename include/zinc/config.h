/* zinc's configuration: a JSON file with DeepSpeed's keys (ds_config.json)
 * plus zinc's own sections `tiers`, `model`, `data` and `train`. Parsing is
 * strict: syntax errors give file:line:column, unknown keys are errors with
 * the closest known key suggested, DeepSpeed keys that zinc does not
 * implement are accepted only where they cannot change what is computed, and
 * every value is range-checked. All problems of one file are reported at
 * once. "auto" is resolved as the HF Trainer integration resolves it, and
 * every key remembers where its value came from. The full key list is
 * docs/config.md. */
#ifndef ZINC_CONFIG_H
#define ZINC_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "zinc/optim.h"
#include "zinc/plan.h"
#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZN_MAX_NVME_PATHS 16

/* Where a piece of state lives: DeepSpeed's offload "device" strings. */
typedef enum { ZN_OFFLOAD_NONE = 0, ZN_OFFLOAD_CPU, ZN_OFFLOAD_NVME } zn_offload_device;

typedef struct {
    zn_offload_device device;
    char nvme_path[ZN_PATH_MAX];
    bool pin_memory;
    int64_t buffer_count;
    int64_t buffer_size;  /* elements */
    int64_t max_in_cpu;   /* elements kept in pinned RAM when device = nvme */
} zn_config_offload_param;

typedef struct {
    zn_offload_device device;
    char nvme_path[ZN_PATH_MAX];
    bool pin_memory;
    int64_t buffer_count;
    double ratio;
    bool pipeline_read;
    bool pipeline_write;
} zn_config_offload_optimizer;

typedef struct {
    int stage;
    zn_config_offload_param offload_param;
    zn_config_offload_optimizer offload_optimizer;
    int64_t sub_group_size;                     /* elements */
    int64_t stage3_prefetch_bucket_size;        /* elements */
    int64_t stage3_max_live_parameters;         /* elements */
    int64_t stage3_max_reuse_distance;          /* elements */
    int64_t stage3_param_persistence_threshold; /* elements */
    int64_t reduce_bucket_size;                 /* elements */
    int64_t allgather_bucket_size;              /* elements */
    bool overlap_comm;
    bool contiguous_gradients;
    /* DeepSpeed's deprecated spellings (cpu_offload, cpu_offload_param,
     * cpu_offload_use_pin_memory), mapped onto the offload sections when
     * the config is loaded */
    bool legacy_cpu_offload, legacy_cpu_offload_param, legacy_pin_memory;
} zn_config_zero;

typedef struct {
    int64_t block_size;  /* bytes per request */
    int64_t queue_depth; /* requests in flight per thread */
    int64_t intra_op_parallelism;
    bool single_submit;
    bool overlap_events;
} zn_config_aio;

typedef enum { ZN_OPT_ADAM = 0, ZN_OPT_ADAMW } zn_optimizer_type;

/* train.optim: the HF Trainer's `optim` names zinc takes. adamw_torch and
 * adamw_torch_fused keep fp32 moments; adamw_bnb_8bit, adamw_8bit and
 * paged_adamw_8bit bitsandbytes' 8-bit blockwise moments (paging is
 * bitsandbytes' GPU-memory device; zinc's states live in its own tiers);
 * adamw_torch_8bit torchao's AdamW8bit, the same 8-bit storage quantized
 * by torchao's rules (ZN_Q8_TORCHAO); adamw_bf16 (zinc's name) bf16
 * moments. The master stays fp32. */
#define ZN_OPTIM_NAMES                                                                        \
    "adamw_torch|adamw_torch_fused|adamw_bnb_8bit|adamw_8bit|paged_adamw_8bit|adamw_bf16|" \
    "adamw_torch_8bit"
/* train.master_weights: "fp32" (the default: an fp32 master copy beside
 * the 16-bit working params) or "bf16_sr" (torchao's bf16 stochastic
 * rounding: the master is bf16, 2 bytes per parameter, updated by
 * zn_adam_step_sr). An explicit choice, never taken by "auto". */
#define ZN_MASTER_NAMES "fp32|bf16_sr"
enum { ZN_MASTER_FP32 = 0, ZN_MASTER_BF16_SR = 1 };
static inline int zn_config_master_bytes(int master_weights)
{
    return master_weights == ZN_MASTER_BF16_SR ? 2 : 4;
}
/* Bytes of each moment per element: 4 (fp32), 2 (bf16), 1 (8-bit, plus a
 * 4-byte absmax per 256). */
static inline int zn_config_moment_bytes(int optim)
{
    return (optim >= 2 && optim <= 4) || optim == 6 ? 1 : optim == 5 ? 2 : 4;
}
/* Whose rules quantize the 8-bit moments: 1 torchao's (adamw_torch_8bit,
 * zn_q8_scheme ZN_Q8_TORCHAO), else 0 bitsandbytes'. */
static inline int zn_config_q8_scheme(int optim)
{
    return optim == 6;
}

typedef struct {
    zn_optimizer_type type;
    double lr, beta1, beta2, eps, weight_decay;
    bool bias_correction;
    bool adam_w_mode; /* decoupled weight decay (always true for AdamW) */
} zn_config_optimizer;

/* The lr schedule and fp16 loss scaling are the optimizer layer's types
 * (include/zinc/optim.h); the config fills them. */
typedef zn_lr_sched zn_config_scheduler;
typedef zn_loss_scale_config zn_config_fp16;

typedef struct {
    bool cpu_checkpointing;  /* keep checkpointed activations in pinned RAM */
    bool contiguous_memory_optimization;
    bool partition_activations;
    bool synchronize_checkpoint_boundary;
    bool profile;
} zn_config_act_ckpt;

typedef struct {
    char path[ZN_PATH_MAX];
    uint64_t size;   /* bytes; 0 with size_auto = free space of the file system */
    bool size_auto;
} zn_config_nvme_path;

typedef struct {
    uint64_t gpu;  bool gpu_auto;  /* bytes of HBM zinc may use */
    uint64_t cpu;  bool cpu_auto;  /* bytes of pinned host RAM zinc may use */
    int n_nvme;
    zn_config_nvme_path nvme[ZN_MAX_NVME_PATHS];
    bool keep_swap;                /* keep swap files after a clean exit */
    bool create_nvme_path;         /* create a missing NVMe path (0700, with
                                      its parents) rather than refuse it */
    int grads;                     /* zn_grads_tier: where fp32 gradient
                                      accumulators live when the optimizer
                                      states are on NVMe */
    int param_cache;               /* pinned buffers, one block each, that
                                      hand NVMe-home parameters from the
                                      optimizer to the next forward (0: off) */
} zn_config_tiers;


/* The model: an HF folder (path) or dimensions with HF config.json's names. */
typedef struct {
    char path[ZN_PATH_MAX];      /* "" = built from the dimensions below */
    int arch;                    /* 0 "llama", 1 "qwen2", 2 "mistral", 3 "qwen3", 4 "phi3",
                                    5 "olmo2", 6 "gemma", 7 "gemma2", 8 "gemma3_text",
                                    9 "olmo3", 10 "qwen3_moe", 11 "mixtral" (HF model_type) */
    int64_t hidden_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t num_key_value_heads;
    int64_t intermediate_size;
    int64_t vocab_size;
    int64_t head_dim;            /* 0 = hidden_size / num_attention_heads */
    int64_t max_position_embeddings;
    double rope_theta;
    double rms_norm_eps;
    bool tie_word_embeddings;
    bool attention_bias;         /* q/k/v bias (Qwen2 always has it) */
    /* the windowed families' (gemma2, gemma3_text, olmo3) and the experts'
     * (qwen3_moe, mixtral) keys, HF config.json's names; a key not set
     * takes the family's HF default (zn_config_get_origin tells) */
    int64_t sliding_window;
    int64_t sliding_window_pattern; /* gemma3_text */
    double query_pre_attn_scalar;   /* gemma2, gemma3_text */
    double attn_logit_softcapping;  /* gemma2, gemma3_text; 0: none (null) */
    double final_logit_softcapping;
    double rope_local_base_freq;    /* gemma3_text's sliding layers' RoPE base */
    int64_t num_experts;            /* mixtral's num_local_experts */
    int64_t num_experts_per_tok;
    int64_t moe_intermediate_size;  /* qwen3_moe */
    int64_t decoder_sparse_step;    /* qwen3_moe */
    bool norm_topk_prob;            /* qwen3_moe */
    bool output_router_logits;
    double router_aux_loss_coef;
    double init_std;
    uint64_t seed;
    int init;                    /* model.init: 0 "weights" (path's safetensors, an
                                    error when it has none), 1 "random" (seeded,
                                    the shape from path or the dimensions) */
} zn_config_model;

typedef struct {
    char path[ZN_PATH_MAX];  /* token file; "" = built-in synthetic set */
    int64_t seq_len;
    uint64_t seed;
    char eval_path[ZN_PATH_MAX]; /* held-out token file ("" = no evaluation) */
    int packing;             /* 1 (default): documents packed into each window,
                                attending only within themselves; 0: one
                                document per window, padded (zn_loader_config) */
} zn_config_data;
/* data.path "" or "synthetic": the built-in synthetic token set. */
#define ZN_DATA_SYNTHETIC(d) (!(d)->path[0] || !strcmp((d)->path, "synthetic"))

/* LoRA (PEFT's LoraConfig names): r 0 = full fine-tuning. */
typedef struct {
    int64_t r;
    double lora_alpha;           /* default 8, as PEFT */
    double lora_dropout;
    unsigned targets;            /* zn_lora_target bits (include/zinc/model.h) */
    bool use_rslora;
    bool init_lora_weights;      /* true: PEFT's init (A Kaiming-uniform, B 0) */
    uint64_t seed;               /* the adapters' init */
    char adapter[ZN_PATH_MAX];   /* a PEFT adapter folder to start from ("" none) */
} zn_config_lora;

typedef struct {
    char dir[ZN_PATH_MAX];   /* "" = no checkpoints */
    int64_t every;           /* steps; 0 = only at the end */
    int64_t keep_last;
    bool continue_on_error;  /* a failed save warns and training goes on */
    bool background;         /* saves written while the next step runs (the cpu tier) */
    bool in_place;           /* the final save keeps NVMe state in place (linked) */
    bool commit;             /* every step committed by reference (NVMe state, two copies) */
    double notice_s;         /* the spot notice a stop should fit (warned when it does not) */
} zn_config_checkpoint;

typedef struct {
    int64_t steps;
    int64_t log_every;
    uint64_t seed;
    char device[32];         /* "auto", "host", "cuda", "cuda:N" */
    int64_t threads;         /* CPU threads; 0 = OMP_NUM_THREADS or all cores */
    bool activation_checkpointing;
    int64_t eval_every;      /* evaluate data.eval_path every N steps (0: at the end) */
    int64_t eval_batches;    /* global batches per evaluation (0: the whole file) */
    int grad_transfer;       /* gradients' dtype device -> host: 0 auto (the params'
                                dtype), 1 fp32, 2 bf16 */
    int attention;           /* 0 auto, 1 gemm, 2 fused (zn_model_config.attention) */
    int optim;               /* the HF Trainer's optim name, as its index in
                                ZN_OPTIM_NAMES: how Adam's moments are kept
                                (zn_config_moments) */
    int master_weights;      /* ZN_MASTER_NAMES index: 0 fp32 master (4 bytes
                                per parameter), 1 bf16 master with stochastic
                                rounding (2 bytes, zn_adam_step_sr) */
    /* optimizer states on NVMe: 0 auto, 1 true, 2 false. Each unit steps
     * as soon as its gradients are final, before the global norm is known,
     * writing its states to a second copy on NVMe that becomes the current
     * one when the norm says no clipping applied (else the unit is stepped
     * again from the first copy): the step bit for bit the same, twice the
     * states' bytes on NVMe. auto: when the second copy fits the tier. */
    int speculative_step;
    zn_config_checkpoint checkpoint;
    /* zinc's training defaults, named and valued as the HF Trainer's
     * TrainingArguments: what "auto" and a missing optimizer / scheduler
     * section resolve to. */
    int64_t per_device_train_batch_size;  /* 0 = unset */
    int64_t gradient_accumulation_steps;  /* 0 = unset */
    double learning_rate, adam_beta1, adam_beta2, adam_epsilon, weight_decay;
    double max_grad_norm;
    int lr_scheduler_type;  /* 0 linear, 1 cosine, 2 constant, 3 constant_with_warmup */
    int64_t warmup_steps;
    double warmup_ratio;    /* > 0: warmup_steps = ceil(ratio x steps) unless given */
    double num_train_epochs;/* > 0: steps from the token file's windows, unless given */
} zn_config_train;

/* Where an effective value came from. */
typedef enum {
    ZN_ORIGIN_DEFAULT = 0, /* not in the file: zinc's default (DeepSpeed's, or train.*) */
    ZN_ORIGIN_CONFIG,      /* written in the file */
    ZN_ORIGIN_AUTO,        /* "auto" in the file, resolved by zinc */
    ZN_ORIGIN_SET,         /* --set on the command line */
} zn_config_origin;

#define ZN_CONFIG_MAX_KEYS 400

typedef struct zn_config {
    char source[ZN_PATH_MAX];  /* file it came from, or "(embedded)" */
    int resolved_world;        /* zn_run_resolve has resolved it for this many
                                  ranks (0: not yet) */

    /* DeepSpeed's top-level keys. 0 in a batch key means "derive it". */
    int64_t train_batch_size;
    int64_t train_micro_batch_size_per_gpu;
    int64_t gradient_accumulation_steps;
    double gradient_clipping;  /* 0 = off */
    zn_config_optimizer optimizer;
    zn_config_scheduler scheduler;
    bool bf16;
    zn_config_fp16 fp16;
    zn_config_zero zero;
    zn_config_aio aio;
    zn_config_act_ckpt activation_checkpointing;

    /* zinc's own sections. */
    zn_config_tiers tiers;
    zn_config_model model;
    zn_config_data data;
    /* DeepSpeed's tensorboard monitor: event files under
     * output_path/job_name (job_name alone when output_path is "") */
    struct {
        bool enabled;
        char output_path[ZN_PATH_MAX];
        char job_name[256];
    } tensorboard, csv_monitor;  /* csv_monitor: DeepSpeed's CSV files, the same keys */
    zn_config_train train;
    zn_config_lora lora;

    /* Book-keeping of the parser: where each key's value came from (by
     * schema index; read it with zn_config_get_origin), whether the
     * optimizer / scheduler sections were absent (then taken from train.*),
     * and how many warnings the parse printed. */
    unsigned char origin[ZN_CONFIG_MAX_KEYS];
    bool optimizer_from_train, scheduler_from_train;
    int n_warnings;
} zn_config;

/* Fills `cfg` with every default (DeepSpeed's for its keys). */
ZN_API void zn_config_default(zn_config *cfg);

/* Parses a config file. `overrides` is an array of n "key.path=value"
 * strings applied to the JSON before validation (value parsed as JSON, or
 * taken as a string when it is not JSON). Returns 0, -errno when the file
 * cannot be read, or ZN_ECONFIG with zn_last_error() naming the file, the
 * line:column or key path and what is wrong. Every problem of the file is
 * reported: one error gives one line, several give a first line
 * "FILE: N errors:" and one indented line per error. Warnings (a missing
 * optimizer section, an ignored key) go to the log as they are found.
 * "auto" values are resolved with what the file says (zn_config_resolve_auto
 * refines them once the model and the device are known). */
ZN_API int zn_config_load(zn_config *cfg, const char *path,
                          const char *const *overrides, int n_overrides);

/* The same from a string in memory; `name` labels error messages. */
ZN_API int zn_config_parse(zn_config *cfg, const char *json, const char *name,
                           const char *const *overrides, int n_overrides);

/* lora.target_modules' rules for a JSON value (a jansson json_t: a list of
 * module names or "all-linear") into zn_lora_target bits; `where` prefixes
 * the message. Returns 0 or ZN_ECONFIG. */
ZN_API int zn_config_lora_targets(const void *json_value, unsigned *out, const char *where);

/* Resolves the three batch keys against the world size the way DeepSpeed
 * does (any two give the third; all three must agree). */
ZN_API int zn_config_resolve_batch(zn_config *cfg, int world_size);

/* Resolves every "auto" of the file, and the sections taken from train.*,
 * from what is known now: hidden_size (0 = unknown: the bucket sizes keep
 * DeepSpeed's defaults), device_bf16 (1 = the device computes in bf16,
 * 0 = it does not, -1 = unknown: bf16 stays off) and train.steps. The rules
 * are the HF Trainer integration's: reduce_bucket_size = hidden^2,
 * stage3_prefetch_bucket_size = 0.9 hidden^2, stage3_param_persistence_
 * threshold = 10 hidden, optimizer / scheduler / clipping from train.*.
 * Idempotent; returns 0 or ZN_ECONFIG when a resolved value is invalid. */
ZN_API int zn_config_resolve_auto(zn_config *cfg, int64_t hidden_size, int device_bf16);

/* Sets train.steps (train.num_train_epochs resolved against the data) and
 * what follows from it: warmup_steps from warmup_ratio when not given, and
 * the HF schedule's warmup and total steps where the schedule is the HF
 * Trainer's ("auto" or no scheduler section). */
ZN_API void zn_config_set_steps(zn_config *cfg, int64_t steps);

/* Where the value of `key` (a full path such as "optimizer.params.lr"; an
 * alias gives its key's) came from; ZN_ORIGIN_DEFAULT for an unknown key. */
ZN_API zn_config_origin zn_config_get_origin(const zn_config *cfg, const char *key);
ZN_API const char *zn_config_origin_name(zn_config_origin o); /* "config", "auto", ... */

ZN_API const char *zn_offload_device_name(zn_offload_device d);

/* The folders the NVMe swap space spreads over, in order: tiers.nvme's
 * paths, or else the nvme_path of each offload section placed on nvme
 * (one entry when both name the same folder). Fills at most `max` and
 * returns how many. */
ZN_API int zn_config_nvme_paths(const zn_config *cfg, const char **paths, int max);
/* Whether the i-th folder of zn_config_nvme_paths is there for a run: 0
 * when it is a directory, or when it does not exist and
 * tiers.create_nvme_path lets the run create it (*missing, when given, is
 * then 1). ZN_ECONFIG when it does not exist otherwise (the message names
 * the setting it came from and the path, and says how to allow it: mkdir
 * it, or --set tiers.create_nvme_path=true), when it is a symbolic link to
 * nothing, or when it is not a directory; -errno when it cannot be looked
 * at; -EINVAL for an i out of range. Looks only: creates nothing. */
ZN_API int zn_config_nvme_path_check(const zn_config *cfg, int i, int *missing);

/* Writes the effective configuration as JSON (every key, defaults
 * included); the caller frees the string with free(). NULL on OOM. */
ZN_API char *zn_config_dump(const zn_config *cfg);

/* ---- LLaMA-Factory recipes (src/config/recipe.c) ---------------------------
 * `zinc train RECIPE.yaml`: LLaMA-Factory's flat SFT YAML read with libyaml.
 * Every key is honoured (as a --set with the HF Trainer's name zinc
 * resolves, the DeepSpeed config it names, the data to prepare), accepted
 * as changing nothing zinc computes (listed in notes with the reason), or
 * refused naming the file, line, key and reason. */
#define ZN_RECIPE_MAX_SETS 48
typedef struct {
    char path[4096], dir[4096];   /* the recipe and its folder */
    char ds_config[4096];         /* deepspeed: the config file, "" without */
    char model[4096];             /* model_name_or_path (a local folder) */
    char dataset_dir[4096];       /* dataset_dir (default "data"): its dataset_info.json */
    char output_dir[4096];
    char datasets[1024], eval_datasets[1024]; /* comma lists of dataset_info.json names */
    char template_name[128], lora_target[512];
    int lora, lora_rank, rslora, plot_loss;
    int bf16;                     /* -1 not given, 0 false, 1 true */
    double lora_alpha, lora_dropout, val_size;
    int64_t cutoff_len, max_samples;
    char sets[ZN_RECIPE_MAX_SETS][4200]; /* "key=JSON value", for zn_config_load */
    int n_sets;
    char notes[2048];             /* keys accepted without effect, and why */
} zn_recipe;

/* Whether a CONFIG path names a recipe (.yaml or .yml). */
ZN_API int zn_recipe_is_path(const char *path);
/* Reads and translates a recipe. Returns 0, -errno, or ZN_ECONFIG. */
ZN_API int zn_recipe_read(const char *path, zn_recipe *r);
/* Adds the prepared token files as data.path and data.eval_path (eval may
 * be NULL). Returns 0 or ZN_ECONFIG (too many settings). */
ZN_API int zn_recipe_add_data(zn_recipe *r, const char *train, const char *eval);

#ifdef __cplusplus
}
#endif
#endif
