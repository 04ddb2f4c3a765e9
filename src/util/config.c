/* The JSON configuration: DeepSpeed's keys plus zinc's sections, parsed with
 * jansson against one schema table. The table is the single source of truth
 * for key names, types, ranges, defaults-as-accepted and the config dump. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "zinc/config.h"

typedef enum {
    K_OBJ,       /* a section: value must be an object */
    K_BOOL,
    K_INT,       /* int64; an integral JSON real (5e8) is accepted */
    K_INT32,     /* int */
    K_NUM,       /* double */
    K_SIZE,      /* bytes: integer or size string ("24GiB"); "auto" if aux set */
    K_STR,       /* char[ZN_PATH_MAX or cap]; null = "" */
    K_ENUM,      /* string from `choices` ('|'-separated), stored as int index + base */
    K_BATCH,     /* int64 >= 1, or "auto" = 0 (derived) */
    K_BETAS,     /* [beta1, beta2] */
    K_NVME,      /* tiers.nvme: [{path, size}] or a single path string */
    K_TARGETS,   /* lora.target_modules: a list of module names or "all-linear" */
    K_FIXED,     /* DeepSpeed key zinc accepts only at the value in `fixed` */
    K_ACCEPT,    /* DeepSpeed key whose every value matches zinc's behaviour */
    K_UNSUPP,    /* DeepSpeed key zinc does not implement */
    K_OFFSEC,    /* DeepSpeed section accepted only switched off ("enabled" not
                    true, "disable" not false, anywhere inside it) */
} key_kind;

/* What "auto" resolves to (the HF Trainer integration's rules, from
 * transformers' HfTrainerDeepSpeedConfig.trainer_config_process and
 * trainer_config_finalize); A_NONE: "auto" is refused. */
typedef enum {
    A_NONE = 0, A_CLIP, A_BF16, A_FP16, A_LR, A_BETAS, A_EPS, A_WD, A_WMIN, A_WMAX,
    A_WSTEPS, A_TOTAL, A_HSQ, A_HSQ09, A_H10, A_DSDEFAULT,
} auto_rule;

typedef struct {
    const char *path;
    key_kind kind;
    size_t off;       /* offset in zn_config (leaf keys) */
    double min, max;  /* K_INT, K_INT32, K_NUM */
    const char *choices; /* K_ENUM choices; K_FIXED JSON value; K_ACCEPT JSON type */
    int aux;          /* K_ENUM base; K_SIZE: offset+1 of the "auto" bool; K_STR cap */
    const char *note; /* why a K_ACCEPT/K_UNSUPP key is what it is */
    int autorule;     /* auto_rule; omitted (0) in most entries */
} key_spec;

#define OFF(f) offsetof(zn_config, f)
#define I64MAX 9.2e18
#define AUTO(f) ((int)(OFF(f) + 1))

/* autorule is left out of most entries (zero: "auto" refused) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const key_spec schema[] = {
    /* ---- DeepSpeed: batch, clipping, precision ---- */
    { "train_batch_size", K_BATCH, OFF(train_batch_size), 0, 0, NULL, 0, NULL },
    { "train_micro_batch_size_per_gpu", K_BATCH, OFF(train_micro_batch_size_per_gpu), 0, 0, NULL, 0, NULL },
    { "gradient_accumulation_steps", K_BATCH, OFF(gradient_accumulation_steps), 0, 0, NULL, 0, NULL },
    { "gradient_clipping", K_NUM, OFF(gradient_clipping), 0, 1e30, NULL, 0, NULL, A_CLIP },
    { "steps_per_print", K_INT, OFF(train.log_every), 1, I64MAX, NULL, 0, NULL },
    { "wall_clock_breakdown", K_ACCEPT, 0, 0, 0, "bool", 0,
      "zinc always reports each resource's busy time at the end of a run" },
    { "memory_breakdown", K_ACCEPT, 0, 0, 0, "bool", 0,
      "zinc always reports each tier's high-water mark at the end of a run" },
    { "zero_allow_untested_optimizer", K_ACCEPT, 0, 0, 0, "bool", 0,
      "zinc runs only its own CPU Adam/AdamW" },
    { "zero_force_ds_cpu_optimizer", K_ACCEPT, 0, 0, 0, "bool", 0,
      "zinc runs only its own CPU Adam/AdamW" },
    { "prescale_gradients", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "gradient_predivide_factor", K_FIXED, 0, 0, 0, "1.0", 0, NULL },
    { "sparse_gradients", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "dump_state", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "communication_data_type", K_FIXED, 0, 0, 0, "null|\"fp32\"", 0, NULL },
    { "seq_parallel_communication_data_type", K_UNSUPP, 0, 0, 0, NULL, 0, NULL },
    { "amp", K_OFFSEC, 0, 0, 0, NULL, 0, "use bf16.enabled or fp16.enabled" },
    { "zenflow", K_UNSUPP, 0, 0, 0, NULL, 0, NULL },
    { "flops_profiler", K_OFFSEC, 0, 0, 0, NULL, 0, "zinc train prints achieved TFLOP/s" },
    { "tensorboard", K_OFFSEC, 0, 0, 0, NULL, 0, "use zinc train --json-log" },
    { "wandb", K_OFFSEC, 0, 0, 0, NULL, 0, "use zinc train --json-log" },
    { "csv_monitor", K_OFFSEC, 0, 0, 0, NULL, 0, "use zinc train --json-log" },
    { "monitor_config", K_OFFSEC, 0, 0, 0, NULL, 0, "use zinc train --json-log" },
    { "comms_logger", K_OFFSEC, 0, 0, 0, NULL, 0, NULL },
    { "comms_config", K_ACCEPT, 0, 0, 0, "any", 0,
      "communication logging and verbosity; zinc's collectives are its own" },
    { "hybrid_engine", K_OFFSEC, 0, 0, 0, NULL, 0, "zinc has no RLHF generation engine" },
    { "compile", K_OFFSEC, 0, 0, 0, NULL, 0, "zinc runs no torch.compile" },
    { "data_types", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "data_types.grad_accum_dtype", K_FIXED, 0, 0, 0, "null|\"fp32\"", 0,
      "zinc accumulates gradients in fp32" },
    { "tensor_parallel", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "tensor_parallel.autotp_size", K_FIXED, 0, 0, 0, "0|1", 0, "zinc has no tensor parallelism" },
    { "tensor_parallel.tp_size", K_FIXED, 0, 0, 0, "0|1", 0, "zinc has no tensor parallelism" },
    { "compression_training", K_UNSUPP, 0, 0, 0, NULL, 0, NULL },
    { "data_efficiency", K_UNSUPP, 0, 0, 0, NULL, 0, NULL },
    { "pipeline", K_UNSUPP, 0, 0, 0, NULL, 0, "zinc has no pipeline parallelism" },
    { "checkpoint", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "checkpoint.load_universal", K_FIXED, 0, 0, 0, "false", 0,
      "zinc resumes its own checkpoints: train.checkpoint, zinc train --resume" },
    { "checkpoint.tag_validation", K_ACCEPT, 0, 0, 0, "any", 0,
      "zinc checks every checkpoint's manifest and checksums" },
    { "checkpoint.use_node_local_storage", K_ACCEPT, 0, 0, 0, "bool", 0,
      "where DeepSpeed writes; zinc writes to train.checkpoint.dir" },

    { "bf16", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "bf16.enabled", K_BOOL, OFF(bf16), 0, 0, NULL, 0, NULL, A_BF16 },
    { "bf16.immediate_grad_update", K_UNSUPP, 0, 0, 0, NULL, 0, NULL },
    { "bfloat16", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "bfloat16.enabled", K_BOOL, OFF(bf16), 0, 0, NULL, 0, NULL, A_BF16 },
    { "fp16", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "fp16.enabled", K_BOOL, OFF(fp16.enabled), 0, 0, NULL, 0, NULL, A_FP16 },
    { "fp16.loss_scale", K_NUM, OFF(fp16.loss_scale), 0, 1e30, NULL, 0, NULL },
    { "fp16.initial_scale_power", K_INT32, OFF(fp16.initial_scale_power), 0, 127, NULL, 0, NULL },
    { "fp16.loss_scale_window", K_INT, OFF(fp16.loss_scale_window), 1, I64MAX, NULL, 0, NULL },
    { "fp16.hysteresis", K_INT32, OFF(fp16.hysteresis), 1, 1e9, NULL, 0, NULL },
    { "fp16.min_loss_scale", K_NUM, OFF(fp16.min_loss_scale), 0, 1e30, NULL, 0, NULL },
    { "fp16.consecutive_hysteresis", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "fp16.auto_cast", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "fp16.fp16_master_weights_and_grads", K_FIXED, 0, 0, 0, "false", 0, NULL },

    /* ---- DeepSpeed: optimizer and scheduler ---- */
    { "optimizer", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "optimizer.type", K_ENUM, OFF(optimizer.type), 0, 0, "Adam|AdamW", 0, NULL },
    { "optimizer.params", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "optimizer.params.lr", K_NUM, OFF(optimizer.lr), 0, 1e3, NULL, 0, NULL, A_LR },
    { "optimizer.params.betas", K_BETAS, OFF(optimizer.beta1), 0, 0, NULL, 0, NULL, A_BETAS },
    { "optimizer.params.eps", K_NUM, OFF(optimizer.eps), 0, 1, NULL, 0, NULL, A_EPS },
    { "optimizer.params.weight_decay", K_NUM, OFF(optimizer.weight_decay), 0, 1e3, NULL, 0, NULL, A_WD },
    { "optimizer.params.bias_correction", K_BOOL, OFF(optimizer.bias_correction), 0, 0, NULL, 0, NULL },
    { "optimizer.params.adam_w_mode", K_BOOL, OFF(optimizer.adam_w_mode), 0, 0, NULL, 0, NULL },
    { "optimizer.params.torch_adam", K_ACCEPT, 0, 0, 0, "bool", 0,
      "torch's AdamW and zinc's compute the same update" },
    { "optimizer.params.amsgrad", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "optimizer.params.fused", K_ACCEPT, 0, 0, 0, "bool", 0, "zinc's CPU Adam is always fused" },

    { "scheduler", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "scheduler.type", K_ENUM, OFF(scheduler.type), 0, 0,
      "WarmupLR|WarmupDecayLR|WarmupCosineLR|linear|cosine|constant_with_warmup", 1, NULL },
    { "scheduler.params", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "scheduler.params.warmup_min_lr", K_NUM, OFF(scheduler.warmup_min_lr), 0, 1e3, NULL, 0, NULL, A_WMIN },
    { "scheduler.params.warmup_max_lr", K_NUM, OFF(scheduler.warmup_max_lr), 0, 1e3, NULL, 0, NULL, A_WMAX },
    { "scheduler.params.warmup_num_steps", K_INT, OFF(scheduler.warmup_num_steps), 0, I64MAX, NULL, 0, NULL, A_WSTEPS },
    { "scheduler.params.total_num_steps", K_INT, OFF(scheduler.total_num_steps), 1, I64MAX, NULL, 0, NULL, A_TOTAL },
    { "scheduler.params.warmup_type", K_ENUM, OFF(scheduler.warmup_type), 0, 0, "log|linear", 0, NULL },
    { "scheduler.params.warmup_min_ratio", K_NUM, OFF(scheduler.warmup_min_ratio), 0, 1, NULL, 0, NULL },
    { "scheduler.params.cos_min_ratio", K_NUM, OFF(scheduler.cos_min_ratio), 0, 1, NULL, 0, NULL },
    { "scheduler.params.last_batch_iteration", K_FIXED, 0, 0, 0, "-1", 0, NULL },

    /* ---- DeepSpeed: ZeRO ---- */
    { "zero_optimization", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "zero_optimization.stage", K_INT32, OFF(zero.stage), 0, 3, NULL, 0, NULL },
    /* sub_group_size 0 is DeepSpeed's "a sub-group per tensor"; it only
     * sizes the optimizer's staging, so zinc takes it as its default. */
    { "zero_optimization.sub_group_size", K_INT, OFF(zero.sub_group_size), 0, I64MAX, NULL, 0, NULL, A_DSDEFAULT },
    { "zero_optimization.stage3_prefetch_bucket_size", K_INT, OFF(zero.stage3_prefetch_bucket_size), 0, I64MAX, NULL, 0, NULL, A_HSQ09 },
    { "zero_optimization.prefetch_bucket_size", K_INT, OFF(zero.stage3_prefetch_bucket_size), 0, I64MAX, NULL, 0, NULL, A_HSQ09 },
    { "zero_optimization.stage3_max_live_parameters", K_INT, OFF(zero.stage3_max_live_parameters), 0, I64MAX, NULL, 0, NULL },
    { "zero_optimization.max_live_parameters", K_INT, OFF(zero.stage3_max_live_parameters), 0, I64MAX, NULL, 0, NULL },
    { "zero_optimization.stage3_max_reuse_distance", K_INT, OFF(zero.stage3_max_reuse_distance), 0, I64MAX, NULL, 0, NULL },
    { "zero_optimization.max_reuse_distance", K_INT, OFF(zero.stage3_max_reuse_distance), 0, I64MAX, NULL, 0, NULL },
    { "zero_optimization.stage3_param_persistence_threshold", K_INT, OFF(zero.stage3_param_persistence_threshold), 0, I64MAX, NULL, 0, NULL, A_H10 },
    { "zero_optimization.param_persistence_threshold", K_INT, OFF(zero.stage3_param_persistence_threshold), 0, I64MAX, NULL, 0, NULL, A_H10 },
    { "zero_optimization.reduce_bucket_size", K_INT, OFF(zero.reduce_bucket_size), 1, I64MAX, NULL, 0, NULL, A_HSQ },
    { "zero_optimization.allgather_bucket_size", K_INT, OFF(zero.allgather_bucket_size), 1, I64MAX, NULL, 0, NULL },
    { "zero_optimization.overlap_comm", K_BOOL, OFF(zero.overlap_comm), 0, 0, NULL, 0, NULL },
    { "zero_optimization.contiguous_gradients", K_BOOL, OFF(zero.contiguous_gradients), 0, 0, NULL, 0, NULL },
    { "zero_optimization.reduce_scatter", K_FIXED, 0, 0, 0, "true", 0, NULL },
    { "zero_optimization.allgather_partitions", K_FIXED, 0, 0, 0, "true", 0, NULL },
    { "zero_optimization.use_multi_rank_bucket_allreduce", K_FIXED, 0, 0, 0, "true", 0, NULL },
    { "zero_optimization.load_from_fp32_weights", K_FIXED, 0, 0, 0, "true", 0, NULL },
    { "zero_optimization.elastic_checkpoint", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "zero_optimization.round_robin_gradients", K_ACCEPT, 0, 0, 0, "bool", 0,
      "orders the gradient copies of stages 1-2 with CPU offload; the sums are the same" },
    { "zero_optimization.ignore_unused_parameters", K_FIXED, 0, 0, 0, "true", 0, NULL },
    { "zero_optimization.legacy_stage1", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "zero_optimization.memory_efficient_linear", K_ACCEPT, 0, 0, 0, "bool", 0,
      "DeepSpeed's memory-saving linear autograd function; the same product" },
    { "zero_optimization.zero_hpz_partition_size", K_FIXED, 0, 0, 0, "1", 0, NULL },
    { "zero_optimization.zero_quantized_weights", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "zero_optimization.zero_quantized_nontrainable_weights", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "zero_optimization.zero_quantized_gradients", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "zero_optimization.mics_shard_size", K_FIXED, 0, 0, 0, "-1", 0, NULL },
    { "zero_optimization.mics_hierarchical_params_gather", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "zero_optimization.stage3_use_all_reduce_for_fetch_params", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "zero_optimization.stage3_module_granularity_threshold", K_FIXED, 0, 0, 0, "0", 0, NULL },
    { "zero_optimization.pipeline_loading_checkpoint", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "zero_optimization.override_module_apply", K_FIXED, 0, 0, 0, "true", 0, NULL },
    { "zero_optimization.stage3_gather_16bit_weights_on_model_save", K_ACCEPT, 0, 0, 0, "bool", 0,
      "zinc export always gathers full 16-bit weights" },
    { "zero_optimization.stage3_gather_fp16_weights_on_model_save", K_ACCEPT, 0, 0, 0, "bool", 0,
      "zinc export always gathers full 16-bit weights" },
    { "zero_optimization.gather_16bit_weights_on_model_save", K_ACCEPT, 0, 0, 0, "bool", 0,
      "zinc export always gathers full 16-bit weights" },
    { "zero_optimization.stage3_model_persistence_threshold", K_UNSUPP, 0, 0, 0, NULL, 0, NULL },
    /* DeepSpeed's deprecated spellings, mapped as DeepSpeed maps them
     * (legacy_offload) */
    { "zero_optimization.cpu_offload", K_BOOL, OFF(zero.legacy_cpu_offload), 0, 0, NULL, 0, NULL },
    { "zero_optimization.cpu_offload_param", K_BOOL, OFF(zero.legacy_cpu_offload_param), 0, 0, NULL, 0, NULL },
    { "zero_optimization.cpu_offload_use_pin_memory", K_BOOL, OFF(zero.legacy_pin_memory), 0, 0, NULL, 0, NULL },
    { "zero_optimization.zenflow", K_UNSUPP, 0, 0, 0, NULL, 0, NULL },
    { "zero_optimization.zeropp_loco_param", K_UNSUPP, 0, 0, 0, NULL, 0, NULL },

    { "zero_optimization.offload_param", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "zero_optimization.offload_param.device", K_ENUM, OFF(zero.offload_param.device), 0, 0, "none|cpu|nvme", 0, NULL },
    { "zero_optimization.offload_param.nvme_path", K_STR, OFF(zero.offload_param.nvme_path), 0, 0, NULL, ZN_PATH_MAX, NULL },
    { "zero_optimization.offload_param.pin_memory", K_BOOL, OFF(zero.offload_param.pin_memory), 0, 0, NULL, 0, NULL },
    { "zero_optimization.offload_param.buffer_count", K_INT, OFF(zero.offload_param.buffer_count), 1, 1024, NULL, 0, NULL },
    { "zero_optimization.offload_param.buffer_size", K_INT, OFF(zero.offload_param.buffer_size), 1, I64MAX, NULL, 0, NULL },
    { "zero_optimization.offload_param.max_in_cpu", K_INT, OFF(zero.offload_param.max_in_cpu), 0, I64MAX, NULL, 0, NULL },

    { "zero_optimization.offload_optimizer", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "zero_optimization.offload_optimizer.device", K_ENUM, OFF(zero.offload_optimizer.device), 0, 0, "none|cpu|nvme", 0, NULL },
    { "zero_optimization.offload_optimizer.nvme_path", K_STR, OFF(zero.offload_optimizer.nvme_path), 0, 0, NULL, ZN_PATH_MAX, NULL },
    { "zero_optimization.offload_optimizer.pin_memory", K_BOOL, OFF(zero.offload_optimizer.pin_memory), 0, 0, NULL, 0, NULL },
    { "zero_optimization.offload_optimizer.buffer_count", K_INT, OFF(zero.offload_optimizer.buffer_count), 1, 1024, NULL, 0, NULL },
    { "zero_optimization.offload_optimizer.ratio", K_NUM, OFF(zero.offload_optimizer.ratio), 0, 1, NULL, 0, NULL },
    { "zero_optimization.offload_optimizer.pipeline_read", K_BOOL, OFF(zero.offload_optimizer.pipeline_read), 0, 0, NULL, 0, NULL },
    { "zero_optimization.offload_optimizer.pipeline_write", K_BOOL, OFF(zero.offload_optimizer.pipeline_write), 0, 0, NULL, 0, NULL },
    { "zero_optimization.offload_optimizer.pipeline", K_BOOL, OFF(zero.offload_optimizer.pipeline_read), 0, 0, NULL, 0, NULL },
    { "zero_optimization.offload_optimizer.fast_init", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "zero_optimization.offload_optimizer.super_offload", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "zero_optimization.offload_optimizer.cpuadam_cores_perc", K_UNSUPP, 0, 0, 0, NULL, 0,
      "use train.threads" },

    /* ---- DeepSpeed: async I/O ---- */
    { "aio", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "aio.block_size", K_INT, OFF(aio.block_size), 4096, 1073741824.0, NULL, 0, NULL },
    { "aio.queue_depth", K_INT, OFF(aio.queue_depth), 1, 4096, NULL, 0, NULL },
    { "aio.intra_op_parallelism", K_INT, OFF(aio.intra_op_parallelism), 1, 256, NULL, 0, NULL },
    { "aio.thread_count", K_INT, OFF(aio.intra_op_parallelism), 1, 256, NULL, 0, NULL },
    { "aio.single_submit", K_BOOL, OFF(aio.single_submit), 0, 0, NULL, 0, NULL },
    { "aio.overlap_events", K_BOOL, OFF(aio.overlap_events), 0, 0, NULL, 0, NULL },
    { "aio.use_gds", K_FIXED, 0, 0, 0, "false", 0, NULL },

    /* ---- DeepSpeed: activation checkpointing ---- */
    { "activation_checkpointing", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "activation_checkpointing.cpu_checkpointing", K_BOOL, OFF(activation_checkpointing.cpu_checkpointing), 0, 0, NULL, 0, NULL },
    { "activation_checkpointing.contiguous_memory_optimization", K_BOOL, OFF(activation_checkpointing.contiguous_memory_optimization), 0, 0, NULL, 0, NULL },
    { "activation_checkpointing.partition_activations", K_ACCEPT, 0, 0, 0, "bool", 0,
      "it splits checkpoints over model-parallel ranks; zinc has no model parallelism (a "
      "group of one), so each rank keeps its own whole, as DeepSpeed does at model-parallel "
      "size 1" },
    { "activation_checkpointing.synchronize_checkpoint_boundary", K_BOOL, OFF(activation_checkpointing.synchronize_checkpoint_boundary), 0, 0, NULL, 0, NULL },
    { "activation_checkpointing.profile", K_BOOL, OFF(activation_checkpointing.profile), 0, 0, NULL, 0, NULL },
    { "activation_checkpointing.number_checkpoints", K_ACCEPT, 0, 0, 0, "int", 0,
      "zinc checkpoints at every decoder layer" },

    /* ---- zinc: tiers ---- */
    { "tiers", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "tiers.gpu", K_SIZE, OFF(tiers.gpu), 0, 0, NULL, AUTO(tiers.gpu_auto), NULL },
    { "tiers.cpu", K_SIZE, OFF(tiers.cpu), 0, 0, NULL, AUTO(tiers.cpu_auto), NULL },
    { "tiers.nvme", K_NVME, OFF(tiers), 0, 0, NULL, 0, NULL },
    { "tiers.keep_swap", K_BOOL, OFF(tiers.keep_swap), 0, 0, NULL, 0, NULL },
    { "tiers.grads", K_ENUM, OFF(tiers.grads), 0, 0, "auto|cpu|nvme", 0, NULL },
    { "tiers.param_cache", K_INT32, OFF(tiers.param_cache), 0, 64, NULL, 0, NULL },

    /* ---- zinc: model (HF config.json names) ---- */
    { "model", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "model.path", K_STR, OFF(model.path), 0, 0, NULL, ZN_PATH_MAX, NULL },
    { "model.model_type", K_ENUM, OFF(model.arch), 0, 0, "llama|qwen2", 0, NULL },
    { "model.hidden_size", K_INT, OFF(model.hidden_size), 1, 1 << 20, NULL, 0, NULL },
    { "model.num_hidden_layers", K_INT, OFF(model.num_hidden_layers), 1, 4096, NULL, 0, NULL },
    { "model.num_attention_heads", K_INT, OFF(model.num_attention_heads), 1, 4096, NULL, 0, NULL },
    { "model.num_key_value_heads", K_INT, OFF(model.num_key_value_heads), 1, 4096, NULL, 0, NULL },
    { "model.intermediate_size", K_INT, OFF(model.intermediate_size), 1, 1 << 22, NULL, 0, NULL },
    { "model.vocab_size", K_INT, OFF(model.vocab_size), 2, 1 << 24, NULL, 0, NULL },
    { "model.head_dim", K_INT, OFF(model.head_dim), 0, 4096, NULL, 0, NULL },
    { "model.max_position_embeddings", K_INT, OFF(model.max_position_embeddings), 1, 1 << 24, NULL, 0, NULL },
    { "model.rope_theta", K_NUM, OFF(model.rope_theta), 1, 1e12, NULL, 0, NULL },
    { "model.rms_norm_eps", K_NUM, OFF(model.rms_norm_eps), 0, 1, NULL, 0, NULL },
    { "model.tie_word_embeddings", K_BOOL, OFF(model.tie_word_embeddings), 0, 0, NULL, 0, NULL },
    { "model.attention_bias", K_BOOL, OFF(model.attention_bias), 0, 0, NULL, 0, NULL },
    { "model.init_std", K_NUM, OFF(model.init_std), 0, 10, NULL, 0, NULL },
    { "model.seed", K_INT, OFF(model.seed), 0, I64MAX, NULL, 0, NULL },
    { "model.init", K_ENUM, OFF(model.init), 0, 0, "weights|random", 0, NULL },

    /* ---- zinc: LoRA (PEFT's LoraConfig names and meanings) ---- */
    { "lora", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "lora.r", K_INT, OFF(lora.r), 0, 65536, NULL, 0, NULL },
    { "lora.lora_alpha", K_NUM, OFF(lora.lora_alpha), -1e6, 1e6, NULL, 0, NULL },
    { "lora.lora_dropout", K_NUM, OFF(lora.lora_dropout), 0, 0.999, NULL, 0, NULL },
    { "lora.target_modules", K_TARGETS, OFF(lora.targets), 0, 0, NULL, 0, NULL },
    { "lora.bias", K_FIXED, 0, 0, 0, "\"none\"", 0,
      "zinc trains the adapters only; biases stay frozen" },
    { "lora.use_rslora", K_BOOL, OFF(lora.use_rslora), 0, 0, NULL, 0, NULL },
    { "lora.init_lora_weights", K_BOOL, OFF(lora.init_lora_weights), 0, 0, NULL, 0, NULL },
    { "lora.seed", K_INT, OFF(lora.seed), 0, I64MAX, NULL, 0, NULL },
    { "lora.adapter", K_STR, OFF(lora.adapter), 0, 0, NULL, ZN_PATH_MAX, NULL },
    { "lora.task_type", K_FIXED, 0, 0, 0, "\"CAUSAL_LM\"", 0, NULL },
    { "lora.fan_in_fan_out", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "lora.use_dora", K_FIXED, 0, 0, 0, "false", 0, "DoRA is not implemented" },
    { "lora.modules_to_save", K_FIXED, 0, 0, 0, "null", 0,
      "zinc trains no full modules beside the adapters" },
    { "lora.layers_to_transform", K_FIXED, 0, 0, 0, "null", 0, "adapters go on every layer" },

    /* ---- zinc: data ---- */
    { "data", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "data.path", K_STR, OFF(data.path), 0, 0, NULL, ZN_PATH_MAX, NULL },
    { "data.seq_len", K_INT, OFF(data.seq_len), 2, 1 << 22, NULL, 0, NULL },
    { "data.seed", K_INT, OFF(data.seed), 0, I64MAX, NULL, 0, NULL },
    { "data.eval_path", K_STR, OFF(data.eval_path), 0, 0, NULL, ZN_PATH_MAX, NULL },
    { "data.packing", K_BOOL, OFF(data.packing), 0, 0, NULL, 0, NULL },


    /* ---- zinc: train ---- */
    { "train", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "train.steps", K_INT, OFF(train.steps), 0, I64MAX, NULL, 0, NULL },
    { "train.eval_every", K_INT, OFF(train.eval_every), 0, I64MAX, NULL, 0, NULL },
    { "train.eval_batches", K_INT, OFF(train.eval_batches), 0, I64MAX, NULL, 0, NULL },
    { "train.grad_transfer", K_ENUM, OFF(train.grad_transfer), 0, 0, "auto|fp32|bf16", 0, NULL },
    { "train.attention", K_ENUM, OFF(train.attention), 0, 0, "auto|gemm|fused", 0, NULL },
    { "train.log_every", K_INT, OFF(train.log_every), 1, I64MAX, NULL, 0, NULL },
    { "train.seed", K_INT, OFF(train.seed), 0, I64MAX, NULL, 0, NULL },
    { "train.device", K_STR, OFF(train.device), 0, 0, NULL, 32, NULL },
    { "train.threads", K_INT, OFF(train.threads), 0, 4096, NULL, 0, NULL },
    { "train.activation_checkpointing", K_BOOL, OFF(train.activation_checkpointing), 0, 0, NULL, 0, NULL },
    { "train.checkpoint", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "train.checkpoint.dir", K_STR, OFF(train.checkpoint.dir), 0, 0, NULL, ZN_PATH_MAX, NULL },
    { "train.checkpoint.every", K_INT, OFF(train.checkpoint.every), 0, I64MAX, NULL, 0, NULL },
    { "train.checkpoint.keep_last", K_INT, OFF(train.checkpoint.keep_last), 1, 1 << 20, NULL, 0, NULL },
    { "train.checkpoint.continue_on_error", K_BOOL, OFF(train.checkpoint.continue_on_error), 0, 0, NULL, 0, NULL },
    /* the HF Trainer's TrainingArguments names and defaults: what "auto"
     * and a missing optimizer / scheduler section take */
    { "train.per_device_train_batch_size", K_INT, OFF(train.per_device_train_batch_size), 0, 1 << 20, NULL, 0, NULL },
    { "train.gradient_accumulation_steps", K_INT, OFF(train.gradient_accumulation_steps), 0, 1 << 20, NULL, 0, NULL },
    { "train.learning_rate", K_NUM, OFF(train.learning_rate), 0, 1e3, NULL, 0, NULL },
    { "train.adam_beta1", K_NUM, OFF(train.adam_beta1), 0, 0.999999, NULL, 0, NULL },
    { "train.adam_beta2", K_NUM, OFF(train.adam_beta2), 0, 0.999999, NULL, 0, NULL },
    { "train.adam_epsilon", K_NUM, OFF(train.adam_epsilon), 0, 1, NULL, 0, NULL },
    { "train.weight_decay", K_NUM, OFF(train.weight_decay), 0, 1e3, NULL, 0, NULL },
    { "train.max_grad_norm", K_NUM, OFF(train.max_grad_norm), 0, 1e30, NULL, 0, NULL },
    { "train.lr_scheduler_type", K_ENUM, OFF(train.lr_scheduler_type), 0, 0,
      "linear|cosine|constant|constant_with_warmup", 0, NULL },
    { "train.warmup_steps", K_INT, OFF(train.warmup_steps), 0, I64MAX, NULL, 0, NULL },
};
#pragma GCC diagnostic pop

_Static_assert(sizeof schema / sizeof schema[0] <= ZN_CONFIG_MAX_KEYS,
               "zn_config.origin is too small for the schema");

#define N_SCHEMA (sizeof schema / sizeof schema[0])

void zn_config_default(zn_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->source, sizeof c->source, "(defaults)");
    c->gradient_accumulation_steps = 0;
    c->train_micro_batch_size_per_gpu = 0;
    c->train_batch_size = 0;
    c->gradient_clipping = 0.0;

    c->optimizer.type = ZN_OPT_ADAM;
    c->optimizer.lr = 1e-3;
    c->optimizer.beta1 = 0.9;
    c->optimizer.beta2 = 0.999;
    c->optimizer.eps = 1e-8;
    c->optimizer.weight_decay = 0.0;
    c->optimizer.bias_correction = true;
    c->optimizer.adam_w_mode = true; /* DeepSpeed's CPU Adam default */

    c->scheduler.type = ZN_SCHED_NONE;
    c->scheduler.warmup_min_lr = 0.0;
    c->scheduler.warmup_max_lr = 1e-3;
    c->scheduler.warmup_num_steps = 1000;
    c->scheduler.total_num_steps = 0;
    c->scheduler.warmup_type = 0;
    c->scheduler.warmup_min_ratio = 0.0;
    c->scheduler.cos_min_ratio = 1e-4;

    c->bf16 = false;
    c->fp16.enabled = false;
    c->fp16.loss_scale = 0.0;
    c->fp16.initial_scale_power = 16;
    c->fp16.loss_scale_window = 1000;
    c->fp16.hysteresis = 2;
    c->fp16.min_loss_scale = 1.0;

    c->zero.stage = 0;
    c->zero.offload_param.device = ZN_OFFLOAD_NONE;
    c->zero.offload_param.pin_memory = true;
    c->zero.offload_param.buffer_count = 5;
    c->zero.offload_param.buffer_size = 100000000;
    c->zero.offload_param.max_in_cpu = 1000000000;
    c->zero.offload_optimizer.device = ZN_OFFLOAD_NONE;
    c->zero.offload_optimizer.pin_memory = true;
    c->zero.offload_optimizer.buffer_count = 4;
    c->zero.offload_optimizer.ratio = 1.0;
    c->zero.sub_group_size = 1000000000;
    c->zero.stage3_prefetch_bucket_size = 50000000;
    c->zero.stage3_max_live_parameters = 1000000000;
    c->zero.stage3_max_reuse_distance = 1000000000;
    c->zero.stage3_param_persistence_threshold = 100000;
    c->zero.reduce_bucket_size = 500000000;
    c->zero.allgather_bucket_size = 500000000;
    c->zero.overlap_comm = true;
    c->zero.contiguous_gradients = true;

    c->aio.block_size = 1048576;
    c->aio.queue_depth = 8;
    c->aio.intra_op_parallelism = 1;
    c->aio.single_submit = false;
    c->aio.overlap_events = true;

    c->tiers.gpu_auto = true;
    c->tiers.cpu_auto = true;
    c->tiers.param_cache = 4;

    c->model.arch = 0;
    c->model.rope_theta = 10000.0;
    c->model.rms_norm_eps = 1e-6;
    c->model.max_position_embeddings = 4096;
    c->model.init_std = 0.02;
    c->lora.lora_alpha = 8;
    c->lora.init_lora_weights = true;
    c->lora.targets = 1u | 4u; /* PEFT's default for llama / qwen2: q_proj, v_proj */
    c->model.seed = 1234;

    c->data.seq_len = 512;
    c->data.seed = 1234;
    c->data.packing = 1;

    c->train.steps = 100;
    c->train.log_every = 10;
    c->train.seed = 1234;
    snprintf(c->train.device, sizeof c->train.device, "auto");
    c->train.activation_checkpointing = true;
    c->train.checkpoint.keep_last = 2;
    /* transformers TrainingArguments' defaults */
    c->train.learning_rate = 5e-5;
    c->train.adam_beta1 = 0.9;
    c->train.adam_beta2 = 0.999;
    c->train.adam_epsilon = 1e-8;
    c->train.weight_decay = 0.0;
    c->train.max_grad_norm = 1.0;
    c->train.lr_scheduler_type = 0;
    c->train.warmup_steps = 0;
}

const char *zn_offload_device_name(zn_offload_device d)
{
    switch (d) {
    case ZN_OFFLOAD_NONE: return "none";
    case ZN_OFFLOAD_CPU: return "cpu";
    case ZN_OFFLOAD_NVME: return "nvme";
    }
    return "?";
}

/* ---- schema look-ups ----------------------------------------------------- */

static const key_spec *find_key(const char *path)
{
    for (size_t i = 0; i < N_SCHEMA; i++)
        if (strcmp(schema[i].path, path) == 0)
            return &schema[i];
    return NULL;
}

static size_t levenshtein(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 64;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            size_t best = diag + cost;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            if (up + 1 < best)
                best = up + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static const char *leaf_of(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

/* Fills `out` with a hint for an unknown key: a sibling with a close name,
 * or the same name at another level. */
static void suggest(const char *prefix, const char *key, char *out, size_t len)
{
    size_t plen = strlen(prefix);
    size_t best = (size_t)-1;
    const char *best_leaf = NULL;
    out[0] = '\0';
    for (size_t i = 0; i < N_SCHEMA; i++) {
        const char *p = schema[i].path;
        if (plen) {
            if (strncmp(p, prefix, plen) != 0 || p[plen] != '.')
                continue;
            p += plen + 1;
        }
        if (strchr(p, '.'))
            continue;
        size_t d = levenshtein(key, p);
        if (d < best) {
            best = d;
            best_leaf = p;
        }
    }
    size_t klen = strlen(key);
    size_t limit = klen <= 4 ? 1 : klen <= 8 ? 2 : 3 + klen / 8;
    if (best_leaf && best <= limit) {
        snprintf(out, len, " (did you mean '%s'?)", best_leaf);
        return;
    }
    for (size_t i = 0; i < N_SCHEMA; i++) {
        if (strcmp(leaf_of(schema[i].path), key) == 0) {
            snprintf(out, len, " (it belongs at '%s')", schema[i].path);
            return;
        }
    }
}

/* ---- the parser ---------------------------------------------------------- */

/* The parser goes on after an error, so that one run reports every problem
 * of a file: each error is appended to `errs` (one line each, key path
 * first) and the parse fails at the end. */
typedef struct {
    zn_config *cfg;
    const char *file;
    char *errs;
    size_t errs_len, errs_cap;
    int n_err;
    const char *const *overrides; /* "key.path=value": leaves under a key are --set */
    int n_overrides;
} parse_ctx;

static void add_line(parse_ctx *ctx, const char *line)
{
    size_t n = strlen(line);
    if (ctx->errs_len + n + 2 > ctx->errs_cap) {
        size_t cap = (ctx->errs_len + n + 2) * 2;
        char *nb = realloc(ctx->errs, cap);
        if (!nb)
            return; /* the count still says how many there were */
        ctx->errs = nb;
        ctx->errs_cap = cap;
    }
    memcpy(ctx->errs + ctx->errs_len, line, n);
    ctx->errs_len += n;
    ctx->errs[ctx->errs_len++] = '\n';
    ctx->errs[ctx->errs_len] = '\0';
}

static int cfg_err(parse_ctx *ctx, const char *path, const char *fmt, ...) ZN_PRINTF(3, 4);
static int cfg_err(parse_ctx *ctx, const char *path, const char *fmt, ...)
{
    char msg[1024], line[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(line, sizeof line, "%s: %s", path, msg);
    add_line(ctx, line);
    ctx->n_err++;
    return ZN_ECONFIG;
}

static void cfg_warn(parse_ctx *ctx, const char *path, const char *fmt, ...) ZN_PRINTF(3, 4);
static void cfg_warn(parse_ctx *ctx, const char *path, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    zn_warn("%s: %s: %s", ctx->file, path, msg);
    ctx->cfg->n_warnings++;
}

/* The schema index a key's origin is kept under: an alias shares its key's. */
static size_t canon_index(const key_spec *k)
{
    for (const key_spec *p = schema; p < k; p++)
        if (p->kind == k->kind && p->off == k->off && p->off != 0 && p->kind != K_OBJ)
            return (size_t)(p - schema);
    return (size_t)(k - schema);
}

static void set_origin(parse_ctx *ctx, const key_spec *k, const char *path, bool is_auto)
{
    zn_config_origin o = ZN_ORIGIN_CONFIG;
    for (int i = 0; i < ctx->n_overrides; i++) {
        const char *ov = ctx->overrides[i];
        size_t n = strcspn(ov, "=");
        if (!strncmp(ov, path, n) && (path[n] == '\0' || path[n] == '.'))
            o = ZN_ORIGIN_SET;
    }
    if (is_auto)
        o = ZN_ORIGIN_AUTO;
    ctx->cfg->origin[canon_index(k)] = (unsigned char)o;
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* A JSON number that is a whole number (5e8 counts) as int64. */
/* DeepSpeed's pydantic models take numbers written as strings ("0", "1e9"). */
static bool num_string(const json_t *v, double *out)
{
    if (!json_is_string(v))
        return false;
    const char *s = json_string_value(v);
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(d))
        return false;
    *out = d;
    return true;
}

static int get_int(parse_ctx *ctx, const char *path, const json_t *v, int64_t *out)
{
    double sd;
    if (num_string(v, &sd)) {
        if (sd == floor(sd) && fabs(sd) < 9.2e18) {
            *out = (int64_t)sd;
            return 0;
        }
        return cfg_err(ctx, path, "expected an integer, got \"%s\"", json_string_value(v));
    }
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9.2e18) {
            *out = (int64_t)d;
            return 0;
        }
        return cfg_err(ctx, path, "expected an integer, got %g", d);
    }
    return cfg_err(ctx, path, "expected an integer, got %s", json_kind(v));
}

static int check_range(parse_ctx *ctx, const key_spec *k, const char *path, double v)
{
    if (v < k->min || v > k->max) {
        if (k->max >= 9e18)
            return cfg_err(ctx, path, "%g is out of range (must be >= %g)", v, k->min);
        return cfg_err(ctx, path, "%g is out of range [%g, %g]", v, k->min, k->max);
    }
    return 0;
}

static int parse_enum(parse_ctx *ctx, const key_spec *k, const char *path, const json_t *v, int *out)
{
    if (!json_is_string(v))
        return cfg_err(ctx, path, "expected one of %s, got %s", k->choices, json_kind(v));
    const char *s = json_string_value(v);
    const char *c = k->choices;
    int idx = 0;
    while (*c) {
        const char *bar = strchr(c, '|');
        size_t n = bar ? (size_t)(bar - c) : strlen(c);
        /* DeepSpeed matches optimizer and scheduler names case-insensitively. */
        if (strlen(s) == n && strncasecmp(s, c, n) == 0) {
            *out = idx + k->aux;
            return 0;
        }
        idx++;
        c += n + (bar ? 1 : 0);
    }
    return cfg_err(ctx, path, "'%s' is not one of %s", s, k->choices);
}

/* PEFT's target_modules for these decoders: module names (a full
 * "model.layers.3.self_attn.q_proj" counts by its last part) or
 * "all-linear" (every projection of the layers; not lm_head). Writes what is
 * wrong into msg and returns ZN_ECONFIG. */
static int targets_of(const json_t *v, unsigned *out, char *msg, size_t len)
{
    static const char *const names[] = { "q_proj", "k_proj", "v_proj", "o_proj",
                                          "gate_proj", "up_proj", "down_proj" };
    *out = 0;
    if (json_is_string(v) && !strcmp(json_string_value(v), "all-linear")) {
        *out = 127;
        return 0;
    }
    json_t *one = json_is_string(v) ? json_pack("[O]", v) : NULL;
    const json_t *arr = one ? one : v;
    if (!json_is_array(arr)) {
        snprintf(msg, len, "expected a list of module names (q_proj, k_proj, v_proj, o_proj, "
                 "gate_proj, up_proj, down_proj) or \"all-linear\", got %s", json_kind(v));
        return ZN_ECONFIG;
    }
    size_t i;
    json_t *e;
    int rc = 0;
    json_array_foreach(arr, i, e) {
        const char *n = json_is_string(e) ? json_string_value(e) : NULL;
        const char *leaf = n ? strrchr(n, '.') : NULL;
        leaf = leaf ? leaf + 1 : n;
        int k = 0;
        while (leaf && k < 7 && strcmp(leaf, names[k]))
            k++;
        if (!leaf || k == 7) {
            char *got = json_dumps(e, JSON_ENCODE_ANY | JSON_COMPACT);
            snprintf(msg, len, "[%zu] = %s is not a projection zinc adapts: one of q_proj, "
                     "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (lm_head and "
                     "embed_tokens adapters are not supported)", i, got ? got : "?");
            free(got);
            rc = ZN_ECONFIG;
            break;
        }
        *out |= 1u << k;
    }
    json_decref(one);
    if (!rc && !*out) {
        snprintf(msg, len, "names no module");
        rc = ZN_ECONFIG;
    }
    return rc;
}

int zn_config_lora_targets(const void *json_value, unsigned *out, const char *where)
{
    char msg[400];
    if (targets_of(json_value, out, msg, sizeof msg))
        return zn_set_error(ZN_ECONFIG, "%s: %s", where, msg);
    return 0;
}

static int parse_targets(parse_ctx *ctx, const char *path, const json_t *v, unsigned *out)
{
    char msg[400];
    if (targets_of(v, out, msg, sizeof msg))
        return cfg_err(ctx, path, "%s", msg);
    return 0;
}

static int parse_nvme(parse_ctx *ctx, const char *path, const json_t *v)
{
    zn_config_tiers *t = &ctx->cfg->tiers;
    t->n_nvme = 0;
    if (json_is_string(v)) {
        if (json_string_length(v) >= ZN_PATH_MAX || !json_string_length(v))
            return cfg_err(ctx, path, "expected a directory name shorter than %d bytes",
                           ZN_PATH_MAX);
        snprintf(t->nvme[0].path, ZN_PATH_MAX, "%s", json_string_value(v));
        t->nvme[0].size_auto = true;
        t->n_nvme = 1;
        return 0;
    }
    if (json_is_null(v))
        return 0;
    if (!json_is_array(v))
        return cfg_err(ctx, path, "expected a list of {\"path\": DIR, \"size\": SIZE} "
                       "or a path string, got %s", json_kind(v));
    if (json_array_size(v) > ZN_MAX_NVME_PATHS)
        return cfg_err(ctx, path, "%zu paths given; at most %d are supported",
                       json_array_size(v), ZN_MAX_NVME_PATHS);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        char ep[600];
        snprintf(ep, sizeof ep, "%s[%zu]", path, i);
        zn_config_nvme_path *np = &t->nvme[i];
        np->size_auto = true;
        if (json_is_string(e)) {
            if (json_string_length(e) >= ZN_PATH_MAX || !json_string_length(e))
                return cfg_err(ctx, ep, "expected a directory name shorter than %d bytes",
                               ZN_PATH_MAX);
            snprintf(np->path, ZN_PATH_MAX, "%s", json_string_value(e));
        } else if (json_is_object(e)) {
            const char *key;
            json_t *val;
            json_object_foreach(e, key, val) {
                if (!strcmp(key, "path")) {
                    if (!json_is_string(val) || !json_string_length(val))
                        return cfg_err(ctx, ep, "path: expected a directory name");
                    if (json_string_length(val) >= ZN_PATH_MAX)
                        return cfg_err(ctx, ep, "path: longer than %d bytes", ZN_PATH_MAX - 1);
                    snprintf(np->path, ZN_PATH_MAX, "%s", json_string_value(val));
                } else if (!strcmp(key, "size")) {
                    if (json_is_string(val) && !strcmp(json_string_value(val), "auto")) {
                        np->size_auto = true;
                    } else if (json_is_string(val)) {
                        if (zn_parse_size(json_string_value(val), &np->size))
                            return cfg_err(ctx, ep, "size: %s", zn_last_error());
                        np->size_auto = false;
                    } else {
                        int64_t n;
                        if (get_int(ctx, ep, val, &n))
                            return ZN_ECONFIG;
                        if (n < 0)
                            return cfg_err(ctx, ep, "size: must not be negative");
                        np->size = (uint64_t)n;
                        np->size_auto = false;
                    }
                } else {
                    return cfg_err(ctx, ep, "unknown key '%s' (expected 'path' and 'size')", key);
                }
            }
        } else {
            return cfg_err(ctx, ep, "expected {\"path\": DIR, \"size\": SIZE}, got %s", json_kind(e));
        }
        if (!np->path[0])
            return cfg_err(ctx, ep, "missing 'path'");
        t->n_nvme++;
    }
    return 0;
}

static int parse_object(parse_ctx *ctx, const char *prefix, json_t *obj);

/* Whether a JSON value matches one of a K_FIXED key's '|'-separated JSON values. */
static bool fixed_match(const char *choices, const json_t *v)
{
    char buf[128];
    const char *c = choices;
    if (json_is_null(v)) /* DeepSpeed's None: its default */
        return true;
    while (*c) {
        size_t n = strcspn(c, "|");
        snprintf(buf, sizeof buf, "%.*s", (int)n, c);
        json_t *want = json_loads(buf, JSON_DECODE_ANY, NULL);
        double sd;
        bool same = want && (json_equal(want, v) ||
                             (json_is_number(want) && json_is_number(v) &&
                              json_number_value(want) == json_number_value(v)) ||
                             (json_is_number(want) && num_string(v, &sd) &&
                              json_number_value(want) == sd));
        json_decref(want);
        if (same)
            return true;
        c += n + (c[n] == '|');
    }
    return false;
}

/* A section accepted only switched off: names the first "enabled": true or
 * "disable": false inside it, or returns NULL. */
static const char *switched_on(const json_t *v, char *where, size_t len)
{
    if (!json_is_object(v))
        return NULL;
    const char *key;
    json_t *e;
    json_object_foreach((json_t *)v, key, e) {
        if ((!strcmp(key, "enabled") && (json_is_true(e) || (json_is_string(e) &&
                                                             strcmp(json_string_value(e), "false")))) ||
            (!strcmp(key, "disable") && json_is_false(e))) {
            snprintf(where, len, "%s", key);
            return where;
        }
        if (json_is_object(e)) {
            char sub[256];
            if (switched_on(e, sub, sizeof sub)) {
                snprintf(where, len, "%s.%s", key, sub);
                return where;
            }
        }
    }
    return NULL;
}

static int parse_value(parse_ctx *ctx, const key_spec *k, const char *path, json_t *v)
{
    char *base = (char *)ctx->cfg;

    /* null keeps the default, as DeepSpeed's None does. */
    if (json_is_null(v) && k->kind != K_FIXED && k->kind != K_UNSUPP)
        return 0;

    /* "auto": the HF integration's value, resolved once the parse is done
     * (zn_config_resolve_auto) from train.*, the model and the device. */
    if (json_is_string(v) && !strcmp(json_string_value(v), "auto") && k->autorule != A_NONE) {
        set_origin(ctx, k, path, true);
        return 0;
    }

    switch (k->kind) {
    case K_OBJ:
        if (!json_is_object(v))
            return cfg_err(ctx, path, "expected an object, got %s", json_kind(v));
        return parse_object(ctx, path, v);
    case K_BOOL:
        if (json_is_string(v) && (!strcmp(json_string_value(v), "true") ||
                                  !strcmp(json_string_value(v), "false"))) {
            *(bool *)(base + k->off) = !strcmp(json_string_value(v), "true");
            break;
        }
        if (!json_is_boolean(v))
            return cfg_err(ctx, path, "expected true or false, got %s", json_kind(v));
        *(bool *)(base + k->off) = json_is_true(v);
        break;
    case K_INT: {
        int64_t n;
        if (get_int(ctx, path, v, &n) || check_range(ctx, k, path, (double)n))
            return ZN_ECONFIG;
        *(int64_t *)(base + k->off) = n;
        break;
    }
    case K_INT32: {
        int64_t n;
        if (get_int(ctx, path, v, &n) || check_range(ctx, k, path, (double)n))
            return ZN_ECONFIG;
        *(int *)(base + k->off) = (int)n;
        break;
    }
    case K_NUM: {
        double d;
        if (num_string(v, &d))
            ;
        else if (json_is_number(v))
            d = json_number_value(v);
        else
            return cfg_err(ctx, path, "expected a number%s, got %s",
                           k->autorule ? " or \"auto\"" : "", json_kind(v));
        if (check_range(ctx, k, path, d))
            return ZN_ECONFIG;
        *(double *)(base + k->off) = d;
        break;
    }
    case K_BATCH: {
        int64_t n = 0;
        if (json_is_string(v) && !strcmp(json_string_value(v), "auto")) {
            n = 0;
            set_origin(ctx, k, path, true);
            *(int64_t *)(base + k->off) = 0;
            return 0;
        }
        if (get_int(ctx, path, v, &n))
            return ZN_ECONFIG;
        if (n < 1)
            return cfg_err(ctx, path, "%lld is out of range (must be >= 1, or \"auto\")",
                           (long long)n);
        *(int64_t *)(base + k->off) = n;
        break;
    }
    case K_SIZE: {
        bool *autof = k->aux ? (bool *)(base + k->aux - 1) : NULL;
        uint64_t bytes;
        if (json_is_string(v) && !strcmp(json_string_value(v), "auto") && autof) {
            *autof = true;
            break;
        }
        if (json_is_string(v)) {
            if (zn_parse_size(json_string_value(v), &bytes))
                return cfg_err(ctx, path, "%s", zn_last_error());
        } else if (json_is_number(v)) {
            int64_t n;
            if (get_int(ctx, path, v, &n))
                return ZN_ECONFIG;
            if (n < 0)
                return cfg_err(ctx, path, "a size must not be negative");
            bytes = (uint64_t)n;
        } else {
            return cfg_err(ctx, path, "expected a size (\"24GiB\", bytes%s), got %s",
                           autof ? " or \"auto\"" : "", json_kind(v));
        }
        *(uint64_t *)(base + k->off) = bytes;
        if (autof)
            *autof = false;
        break;
    }
    case K_STR: {
        if (!json_is_string(v))
            return cfg_err(ctx, path, "expected a string, got %s", json_kind(v));
        if (json_string_length(v) >= (size_t)k->aux)
            return cfg_err(ctx, path, "longer than %d bytes", k->aux - 1);
        snprintf(base + k->off, (size_t)k->aux, "%s", json_string_value(v));
        break;
    }
    case K_ENUM:
        if (parse_enum(ctx, k, path, v, (int *)(base + k->off)))
            return ZN_ECONFIG;
        break;
    case K_BETAS: {
        if (!json_is_array(v) || json_array_size(v) != 2 ||
            !json_is_number(json_array_get(v, 0)) || !json_is_number(json_array_get(v, 1)))
            return cfg_err(ctx, path, "expected [beta1, beta2], two numbers in [0, 1), "
                           "or \"auto\"");
        double b1 = json_number_value(json_array_get(v, 0));
        double b2 = json_number_value(json_array_get(v, 1));
        if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1))
            return cfg_err(ctx, path, "[%g, %g]: both betas must be in [0, 1)", b1, b2);
        ctx->cfg->optimizer.beta1 = b1;
        ctx->cfg->optimizer.beta2 = b2;
        break;
    }
    case K_NVME:
        if (parse_nvme(ctx, path, v))
            return ZN_ECONFIG;
        break;
    case K_TARGETS:
        if (parse_targets(ctx, path, v, (unsigned *)(base + k->off)))
            return ZN_ECONFIG;
        break;
    case K_FIXED: {
        if (fixed_match(k->choices, v))
            return 0;
        char *got = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
        char want[160];
        snprintf(want, sizeof want, "%s", k->choices);
        for (char *p = want; *p; p++)
            if (*p == '|')
                *p = '/';
        int rc = cfg_err(ctx, path, "DeepSpeed's %s is not implemented by zinc; only %s (%s) "
                         "is accepted, got %s%s%s", leaf_of(path),
                         strchr(want, '/') ? "what computes as zinc does" : "its default",
                         want, got ? got : "?", k->note ? "; " : "", k->note ? k->note : "");
        free(got);
        return rc;
    }
    case K_ACCEPT:
        if (json_is_string(v) && !strcmp(json_string_value(v), "auto"))
            ;
        else if ((!strcmp(k->choices, "bool") && !json_is_boolean(v)) ||
                 (!strcmp(k->choices, "int") && !json_is_integer(v)))
            return cfg_err(ctx, path, "expected %s, got %s",
                           !strcmp(k->choices, "bool") ? "true or false" : "an integer",
                           json_kind(v));
        zn_debug("%s: %s accepted and ignored: %s", ctx->file, path, k->note);
        return 0;
    case K_OFFSEC: {
        char where[300];
        if (json_is_boolean(v) || json_is_object(v)) {
            if (json_is_false(v) || (json_is_object(v) && !switched_on(v, where, sizeof where))) {
                zn_debug("%s: %s accepted: switched off", ctx->file, path);
                return 0;
            }
        }
        if (!json_is_object(v) && !json_is_true(v))
            return cfg_err(ctx, path, "expected an object, got %s", json_kind(v));
        return cfg_err(ctx, path, "DeepSpeed's %s is not implemented by zinc; it is accepted "
                       "only switched off (\"enabled\": false)%s%s", leaf_of(path),
                       k->note ? "; " : "", k->note ? k->note : "");
    }
    case K_UNSUPP:
        return cfg_err(ctx, path, "DeepSpeed's %s is not implemented by zinc%s%s",
                       leaf_of(path), k->note ? "; " : "", k->note ? k->note : "");
    default:
        return cfg_err(ctx, path, "internal: bad schema kind");
    }
    set_origin(ctx, k, path, false);
    return 0;
}

static int parse_object(parse_ctx *ctx, const char *prefix, json_t *obj)
{
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(obj, key, v) {
        char path[512];
        if (*prefix)
            snprintf(path, sizeof path, "%s.%s", prefix, key);
        else
            snprintf(path, sizeof path, "%s", key);
        /* Keys that start with '_' are comments (JSON has none). */
        if (key[0] == '_')
            continue;
        const key_spec *k = find_key(path);
        if (!k) {
            char hint[256];
            suggest(prefix, key, hint, sizeof hint);
            rc = cfg_err(ctx, path, "unknown key%s", hint);
            continue;
        }
        if (json_is_string(v) && !strcmp(json_string_value(v), "auto") &&
            k->autorule == A_NONE && (k->kind == K_BOOL || k->kind == K_INT ||
                                      k->kind == K_INT32 || k->kind == K_NUM)) {
            rc = cfg_err(ctx, path, "\"auto\" is not resolved for this key (HF's integration "
                         "does not fill it either); give a value");
            continue;
        }
        if (parse_value(ctx, k, path, v))
            rc = ZN_ECONFIG;
    }
    return rc;
}


/* ---- --set overrides ----------------------------------------------------- */

static int apply_override(parse_ctx *ctx, json_t *root, const char *ov)
{
    const char *eq = strchr(ov, '=');
    if (!eq || eq == ov)
        return cfg_err(ctx, "--set", "%s: expected key.path=value", ov);
    char path[512];
    size_t plen = (size_t)(eq - ov);
    if (plen >= sizeof path)
        return cfg_err(ctx, "--set", "%s: key path too long", ov);
    memcpy(path, ov, plen);
    path[plen] = '\0';
    const char *text = eq + 1;
    json_t *val = json_loads(text, JSON_DECODE_ANY, NULL);
    if (!val)
        val = json_string(text);
    if (!val)
        return zn_set_error(-ENOMEM, "--set %s: out of memory", ov);

    json_t *cur = root;
    char *save = NULL;
    char *seg = strtok_r(path, ".", &save);
    char walked[512] = "";
    while (seg) {
        char *next = strtok_r(NULL, ".", &save);
        if (walked[0])
            strncat(walked, ".", sizeof walked - strlen(walked) - 1);
        strncat(walked, seg, sizeof walked - strlen(walked) - 1);
        if (!next) {
            json_object_set_new(cur, seg, val);
            return 0;
        }
        json_t *child = json_object_get(cur, seg);
        if (!child) {
            child = json_object();
            json_object_set_new(cur, seg, child);
        } else if (!json_is_object(child)) {
            json_decref(val);
            return cfg_err(ctx, walked, "--set %s: not an object", ov);
        }
        cur = child;
        seg = next;
    }
    json_decref(val);
    return cfg_err(ctx, "--set", "%s: empty key path", ov);
}

/* ---- cross-key checks ---------------------------------------------------- */

static const key_spec *find_key(const char *path);
static zn_config_origin origin_at(const zn_config *c, const char *path);

/* A deprecated DeepSpeed spelling that says "offload to cpu" (old, when
 * given true): the modern key `dev_key` becomes "cpu", as DeepSpeed maps it,
 * unless the config gives that key another device. */
static void legacy_offload(parse_ctx *ctx, const char *old, bool on, const char *dev_key,
                           zn_offload_device *dev)
{
    zn_config *c = ctx->cfg;
    zn_config_origin o = origin_at(c, old);
    if (o == ZN_ORIGIN_DEFAULT || !on)
        return;
    if (origin_at(c, dev_key) != ZN_ORIGIN_DEFAULT && *dev != ZN_OFFLOAD_CPU) {
        cfg_err(ctx, old, "true is DeepSpeed's old spelling of %s = \"cpu\", and %s is \"%s\"; "
                "keep one of the two", dev_key, dev_key, zn_offload_device_name(*dev));
        return;
    }
    *dev = ZN_OFFLOAD_CPU;
    c->origin[canon_index(find_key(dev_key))] = (unsigned char)o;
}

/* cpu_offload_use_pin_memory: the pin_memory of both offload sections,
 * where the config does not give them. */
static void legacy_pin(parse_ctx *ctx)
{
    zn_config *c = ctx->cfg;
    const char *old = "zero_optimization.cpu_offload_use_pin_memory";
    zn_config_origin o = origin_at(c, old);
    if (o == ZN_ORIGIN_DEFAULT)
        return;
    static const char *const keys[2] = { "zero_optimization.offload_param.pin_memory",
                                         "zero_optimization.offload_optimizer.pin_memory" };
    bool *vals[2] = { &c->zero.offload_param.pin_memory, &c->zero.offload_optimizer.pin_memory };
    for (int i = 0; i < 2; i++)
        if (origin_at(c, keys[i]) == ZN_ORIGIN_DEFAULT) {
            *vals[i] = c->zero.legacy_pin_memory;
            c->origin[canon_index(find_key(keys[i]))] = (unsigned char)o;
        }
}

static int validate(parse_ctx *ctx)
{
    zn_config *c = ctx->cfg;
    const zn_config_zero *z = &c->zero;

    legacy_offload(ctx, "zero_optimization.cpu_offload", z->legacy_cpu_offload,
                   "zero_optimization.offload_optimizer.device",
                   &c->zero.offload_optimizer.device);
    legacy_offload(ctx, "zero_optimization.cpu_offload_param", z->legacy_cpu_offload_param,
                   "zero_optimization.offload_param.device", &c->zero.offload_param.device);
    legacy_pin(ctx);

    if (c->bf16 && c->fp16.enabled)
        cfg_err(ctx, "bf16.enabled", "bf16.enabled and fp16.enabled are both true; choose one");
    if (z->offload_param.device != ZN_OFFLOAD_NONE && z->stage != 3)
        cfg_err(ctx, "zero_optimization.offload_param", "needs zero_optimization.stage = 3 "
                "(it is %d)", z->stage);
    if (z->offload_optimizer.device == ZN_OFFLOAD_NVME && z->stage != 3)
        cfg_err(ctx, "zero_optimization.offload_optimizer.device", "\"nvme\" needs "
                "zero_optimization.stage = 3 (it is %d)", z->stage);
    if (z->offload_optimizer.device != ZN_OFFLOAD_NONE && z->stage == 0)
        cfg_err(ctx, "zero_optimization.offload_optimizer", "needs zero_optimization.stage "
                ">= 1 (it is 0)");
    if (z->offload_optimizer.ratio < 1.0 && z->stage != 3)
        cfg_err(ctx, "zero_optimization.offload_optimizer.ratio", "< 1 needs stage 3");
    if (c->tiers.grads == ZN_GRADS_NVME && z->offload_optimizer.device != ZN_OFFLOAD_NVME)
        cfg_err(ctx, "tiers.grads", "\"nvme\" needs zero_optimization.offload_optimizer.device "
                "= \"nvme\" (gradients go to NVMe only with the optimizer states)");
    bool any_nvme_path = c->tiers.n_nvme > 0;
    if (z->offload_param.device == ZN_OFFLOAD_NVME && !z->offload_param.nvme_path[0] && !any_nvme_path)
        cfg_err(ctx, "zero_optimization.offload_param.device", "\"nvme\" needs "
                "offload_param.nvme_path or tiers.nvme");
    if (z->offload_optimizer.device == ZN_OFFLOAD_NVME && !z->offload_optimizer.nvme_path[0] &&
        !any_nvme_path)
        cfg_err(ctx, "zero_optimization.offload_optimizer.device", "\"nvme\" needs "
                "offload_optimizer.nvme_path or tiers.nvme");
    if (z->offload_param.buffer_size < z->stage3_param_persistence_threshold)
        zn_debug("%s: offload_param.buffer_size < stage3_param_persistence_threshold", ctx->file);
    if (c->aio.block_size % 4096)
        cfg_err(ctx, "aio.block_size", "%lld is not a multiple of 4096",
                (long long)c->aio.block_size);

    const zn_config_scheduler *s = &c->scheduler;
    if ((s->type == ZN_SCHED_WARMUP_DECAY_LR || s->type == ZN_SCHED_WARMUP_COSINE_LR) &&
        s->total_num_steps == 0)
        cfg_err(ctx, "scheduler.params.total_num_steps", "required for %s (or \"auto\": "
                "train.steps)", s->type == ZN_SCHED_WARMUP_DECAY_LR ? "WarmupDecayLR"
                                                                    : "WarmupCosineLR");
    if (s->type >= ZN_SCHED_WARMUP_LR && s->type <= ZN_SCHED_WARMUP_COSINE_LR &&
        s->total_num_steps && s->warmup_num_steps > s->total_num_steps)
        cfg_err(ctx, "scheduler.params.warmup_num_steps", "%lld exceeds total_num_steps (%lld)",
                (long long)s->warmup_num_steps, (long long)s->total_num_steps);
    if (s->type == ZN_SCHED_WARMUP_LR || s->type == ZN_SCHED_WARMUP_DECAY_LR) {
        if (s->warmup_min_lr > s->warmup_max_lr)
            cfg_err(ctx, "scheduler.params.warmup_min_lr", "%g exceeds warmup_max_lr (%g)",
                    s->warmup_min_lr, s->warmup_max_lr);
    }
    if (c->optimizer.type == ZN_OPT_ADAMW)
        c->optimizer.adam_w_mode = true;

    const zn_config_model *m = &c->model;
    if (!m->path[0] && m->hidden_size) {
        if (!m->num_hidden_layers || !m->num_attention_heads || !m->intermediate_size ||
            !m->vocab_size) {
            cfg_err(ctx, "model", "give either 'path' (an HF model folder) or all of "
                    "hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, "
                    "vocab_size");
        } else {
            int64_t kv = m->num_key_value_heads ? m->num_key_value_heads : m->num_attention_heads;
            if (!m->head_dim && m->hidden_size % m->num_attention_heads)
                cfg_err(ctx, "model.hidden_size", "%lld is not a multiple of "
                        "num_attention_heads (%lld); set model.head_dim",
                        (long long)m->hidden_size, (long long)m->num_attention_heads);
            if (m->num_attention_heads % kv)
                cfg_err(ctx, "model.num_attention_heads", "%lld is not a multiple of "
                        "num_key_value_heads (%lld)", (long long)m->num_attention_heads,
                        (long long)kv);
            int64_t hd = m->head_dim ? m->head_dim : m->hidden_size / m->num_attention_heads;
            if (hd % 2)
                cfg_err(ctx, "model", "head dimension %lld is odd; RoPE needs an even one",
                        (long long)hd);
        }
    } else if (!m->path[0] && (m->num_hidden_layers || m->vocab_size || m->intermediate_size)) {
        cfg_err(ctx, "model.hidden_size", "missing (or give model.path)");
    }
    if (c->model.num_key_value_heads == 0)
        c->model.num_key_value_heads = c->model.num_attention_heads;
    if (c->train.checkpoint.every && !c->train.checkpoint.dir[0])
        cfg_err(ctx, "train.checkpoint.every", "set, but train.checkpoint.dir is not");
    return ctx->n_err ? ZN_ECONFIG : 0;
}

/* ---- "auto" and the training defaults ------------------------------------ */

static const key_spec *find_key(const char *path);

static zn_config_origin origin_at(const zn_config *c, const char *path)
{
    const key_spec *k = find_key(path);
    return k ? (zn_config_origin)c->origin[canon_index(k)] : ZN_ORIGIN_DEFAULT;
}

zn_config_origin zn_config_get_origin(const zn_config *c, const char *key)
{
    return origin_at(c, key);
}

const char *zn_config_origin_name(zn_config_origin o)
{
    switch (o) {
    case ZN_ORIGIN_DEFAULT: return "default";
    case ZN_ORIGIN_CONFIG: return "config";
    case ZN_ORIGIN_AUTO: return "auto";
    case ZN_ORIGIN_SET: return "--set";
    }
    return "?";
}

int zn_config_resolve_auto(zn_config *c, int64_t hidden, int device_bf16)
{
    const zn_config_train *t = &c->train;
    bool fp16_given = origin_at(c, "fp16.enabled") != ZN_ORIGIN_AUTO && c->fp16.enabled;
    for (size_t i = 0; i < N_SCHEMA; i++) {
        const key_spec *k = &schema[i];
        if (!k->autorule || canon_index(k) != i || c->origin[i] != ZN_ORIGIN_AUTO)
            continue;
        switch ((auto_rule)k->autorule) {
        case A_NONE: break;
        case A_CLIP: c->gradient_clipping = t->max_grad_norm; break;
        /* HF takes precision from --bf16/--fp16; zinc from the device: bf16
         * where it computes in bf16, never fp16 unless asked for. */
        case A_BF16: c->bf16 = device_bf16 == 1 && !fp16_given; break;
        case A_FP16: c->fp16.enabled = false; break;
        case A_LR: c->optimizer.lr = t->learning_rate; break;
        case A_BETAS:
            c->optimizer.beta1 = t->adam_beta1;
            c->optimizer.beta2 = t->adam_beta2;
            break;
        case A_EPS: c->optimizer.eps = t->adam_epsilon; break;
        case A_WD: c->optimizer.weight_decay = t->weight_decay; break;
        case A_WMIN: c->scheduler.warmup_min_lr = 0.0; break;
        case A_WMAX: c->scheduler.warmup_max_lr = t->learning_rate; break;
        case A_WSTEPS: c->scheduler.warmup_num_steps = t->warmup_steps; break;
        case A_TOTAL: c->scheduler.total_num_steps = t->steps > 0 ? t->steps : 1; break;
        case A_HSQ:
            if (hidden > 0)
                c->zero.reduce_bucket_size = hidden * hidden;
            break;
        case A_HSQ09:
            if (hidden > 0)
                c->zero.stage3_prefetch_bucket_size = (int64_t)(0.9 * (double)hidden * (double)hidden);
            break;
        case A_H10:
            if (hidden > 0)
                c->zero.stage3_param_persistence_threshold = 10 * hidden;
            break;
        case A_DSDEFAULT: c->zero.sub_group_size = 1000000000; break;
        }
    }
    if (c->zero.sub_group_size == 0)
        c->zero.sub_group_size = 1000000000;
    if (c->optimizer_from_train) {
        c->optimizer.type = ZN_OPT_ADAMW;
        c->optimizer.adam_w_mode = true;
        c->optimizer.bias_correction = true;
        c->optimizer.lr = t->learning_rate;
        c->optimizer.beta1 = t->adam_beta1;
        c->optimizer.beta2 = t->adam_beta2;
        c->optimizer.eps = t->adam_epsilon;
        c->optimizer.weight_decay = t->weight_decay;
    }
    if (c->scheduler_from_train) {
        static const zn_scheduler_type hf[] = { ZN_SCHED_HF_LINEAR, ZN_SCHED_HF_COSINE,
                                                ZN_SCHED_NONE, ZN_SCHED_HF_CONSTANT_WARMUP };
        c->scheduler.type = hf[t->lr_scheduler_type & 3];
        c->scheduler.warmup_num_steps = t->warmup_steps;
        c->scheduler.total_num_steps = t->steps > 0 ? t->steps : 1;
        c->scheduler.warmup_min_lr = 0.0;
        c->scheduler.warmup_max_lr = c->optimizer.lr;
        c->scheduler.warmup_type = 1;
    }
    /* the batch keys: HF fills micro-batch and accumulation from its
     * arguments; zn_config_resolve_batch derives what is still open */
    if (!c->train_micro_batch_size_per_gpu && t->per_device_train_batch_size)
        c->train_micro_batch_size_per_gpu = t->per_device_train_batch_size;
    if (!c->gradient_accumulation_steps && t->gradient_accumulation_steps)
        c->gradient_accumulation_steps = t->gradient_accumulation_steps;
    return 0;
}

int zn_config_parse(zn_config *cfg, const char *json, const char *name,
                    const char *const *overrides, int n_overrides)
{
    json_error_t jerr;
    zn_config_default(cfg);
    snprintf(cfg->source, sizeof cfg->source, "%s", name);
    json_t *root = json_loads(json, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return zn_set_error(ZN_ECONFIG, "%s:%d:%d: %s", name, jerr.line, jerr.column, jerr.text);
    int rc = 0;
    parse_ctx ctx = { .cfg = cfg, .file = name, .overrides = overrides,
                      .n_overrides = n_overrides };
    if (!json_is_object(root)) {
        rc = zn_set_error(ZN_ECONFIG, "%s: the top level must be an object, got %s",
                          name, json_kind(root));
        goto out;
    }
    for (int i = 0; i < n_overrides; i++)
        apply_override(&ctx, root, overrides[i]);
    parse_object(&ctx, "", root);

    /* What the HF Trainer does when the DeepSpeed config leaves them out. */
    const zn_config_train *t = &cfg->train;
    json_t *opt = json_object_get(root, "optimizer");
    if (!opt || json_is_null(opt)) {
        cfg->optimizer_from_train = true;
        cfg_warn(&ctx, "optimizer", "no optimizer section: AdamW with zinc's training defaults "
                 "(train.learning_rate %g, betas [%g, %g], eps %g, weight_decay %g), as the HF "
                 "Trainer does", t->learning_rate, t->adam_beta1, t->adam_beta2, t->adam_epsilon,
                 t->weight_decay);
    }
    json_t *sch = json_object_get(root, "scheduler");
    if (!sch || json_is_null(sch)) {
        static const char *names[] = { "linear", "cosine", "constant", "constant_with_warmup" };
        cfg->scheduler_from_train = true;
        cfg_warn(&ctx, "scheduler", "no scheduler section: train.lr_scheduler_type '%s' with "
                 "train.warmup_steps %lld over train.steps %lld, as the HF Trainer does",
                 names[t->lr_scheduler_type & 3], (long long)t->warmup_steps,
                 (long long)t->steps);
    }
    if (cfg->origin[canon_index(find_key("zero_optimization.sub_group_size"))] !=
            ZN_ORIGIN_AUTO && cfg->zero.sub_group_size == 0)
        cfg_warn(&ctx, "zero_optimization.sub_group_size", "0 (DeepSpeed: a sub-group per "
                 "tensor) only sizes the optimizer's staging; zinc uses its default 1e9");
    zn_config_resolve_auto(cfg, cfg->model.hidden_size, -1);
    validate(&ctx);

    if (ctx.n_err == 1) {
        rc = zn_set_error(ZN_ECONFIG, "%s: %.*s", name, (int)(ctx.errs_len - 1), ctx.errs);
    } else if (ctx.n_err > 1) {
        /* one line per error, indented under a count */
        char *list = ctx.errs ? ctx.errs : "";
        size_t len = ctx.errs_len ? ctx.errs_len - 1 : 0;
        char *ind = malloc(len * 2 + ctx.n_err * 2 + 16);
        if (ind) {
            size_t o = 0;
            ind[o++] = ' ';
            ind[o++] = ' ';
            for (size_t i = 0; i < len; i++) {
                ind[o++] = list[i];
                if (list[i] == '\n') {
                    ind[o++] = ' ';
                    ind[o++] = ' ';
                }
            }
            ind[o] = '\0';
        }
        rc = zn_set_error(ZN_ECONFIG, "%s: %d errors:\n%s", name, ctx.n_err, ind ? ind : list);
        free(ind);
    }
out:
    free(ctx.errs);
    json_decref(root);
    return rc;
}

int zn_config_load(zn_config *cfg, const char *path,
                   const char *const *overrides, int n_overrides)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return zn_set_error(-errno, "%s: cannot open config: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 16384;
            if (cap > (64u << 20)) {
                free(buf);
                fclose(f);
                return zn_set_error(ZN_ECONFIG, "%s: larger than 64 MiB; not a config file", path);
            }
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return zn_set_error(-ENOMEM, "%s: out of memory", path);
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return zn_set_error(-EIO, "%s: read error", path);
    }
    buf[len] = '\0';
    if (strlen(buf) != len) {
        free(buf);
        return zn_set_error(ZN_ECONFIG, "%s: contains a NUL byte; not a JSON file", path);
    }
    int rc = zn_config_parse(cfg, buf, path, overrides, n_overrides);
    free(buf);
    return rc;
}

int zn_config_resolve_batch(zn_config *c, int world)
{
    int64_t tb = c->train_batch_size, mb = c->train_micro_batch_size_per_gpu,
            ga = c->gradient_accumulation_steps;
    if (world < 1)
        return zn_set_error(ZN_ECONFIG, "world size %d must be >= 1", world);
    if (tb && mb && ga) {
        if (tb != mb * ga * world)
            return zn_set_error(ZN_ECONFIG, "%s: train_batch_size (%lld) != "
                                "train_micro_batch_size_per_gpu (%lld) * "
                                "gradient_accumulation_steps (%lld) * world size (%d)",
                                c->source, (long long)tb, (long long)mb, (long long)ga, world);
    } else if (tb && mb) {
        if (tb % (mb * world))
            return zn_set_error(ZN_ECONFIG, "%s: train_batch_size (%lld) is not divisible by "
                                "train_micro_batch_size_per_gpu (%lld) * world size (%d)",
                                c->source, (long long)tb, (long long)mb, world);
        ga = tb / (mb * world);
    } else if (tb && ga) {
        if (tb % (ga * world))
            return zn_set_error(ZN_ECONFIG, "%s: train_batch_size (%lld) is not divisible by "
                                "gradient_accumulation_steps (%lld) * world size (%d)",
                                c->source, (long long)tb, (long long)ga, world);
        mb = tb / (ga * world);
    } else if (tb) {
        if (tb % world)
            return zn_set_error(ZN_ECONFIG, "%s: train_batch_size (%lld) is not divisible by "
                                "the world size (%d)", c->source, (long long)tb, world);
        ga = 1;
        mb = tb / world;
    } else {
        if (!mb)
            mb = 1;
        if (!ga)
            ga = 1;
    }
    tb = mb * ga * world;
    c->train_batch_size = tb;
    c->train_micro_batch_size_per_gpu = mb;
    c->gradient_accumulation_steps = ga;
    return 0;
}

/* ---- dump ---------------------------------------------------------------- */

static json_t *obj_at(json_t *root, const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    char *dot = strrchr(buf, '.');
    if (!dot)
        return root;
    *dot = '\0';
    json_t *cur = root;
    char *save = NULL;
    for (char *seg = strtok_r(buf, ".", &save); seg; seg = strtok_r(NULL, ".", &save)) {
        json_t *child = json_object_get(cur, seg);
        if (!child) {
            child = json_object();
            json_object_set_new(cur, seg, child);
        }
        cur = child;
    }
    return cur;
}

static bool is_alias(const key_spec *k)
{
    for (const key_spec *p = schema; p < k; p++)
        if (p->kind == k->kind && p->off == k->off && p->kind != K_OBJ &&
            p->kind != K_FIXED && p->kind != K_ACCEPT && p->kind != K_UNSUPP)
            return true;
    return false;
}

char *zn_config_dump(const zn_config *c)
{
    json_t *root = json_object();
    const char *base = (const char *)c;
    for (size_t i = 0; i < N_SCHEMA; i++) {
        const key_spec *k = &schema[i];
        if (k->kind == K_OBJ || k->kind == K_FIXED || k->kind == K_ACCEPT ||
            k->kind == K_UNSUPP || is_alias(k))
            continue;
        /* steps_per_print is DeepSpeed's name for train.log_every: dump the latter;
         * the deprecated offload spellings are dumped as the keys they set */
        if (!strcmp(k->path, "steps_per_print") ||
            !strncmp(k->path, "zero_optimization.cpu_offload", 29))
            continue;
        json_t *o = obj_at(root, k->path);
        const char *leaf = leaf_of(k->path);
        json_t *v = NULL;
        switch (k->kind) {
        case K_BOOL: v = json_boolean(*(const bool *)(base + k->off)); break;
        case K_INT: {
            /* A value outside the key's range is "unset" (model dimensions
             * when model.path is used): leave it out. */
            int64_t n = *(const int64_t *)(base + k->off);
            if ((double)n >= k->min && (double)n <= k->max)
                v = json_integer(n);
            break;
        }
        case K_BATCH: v = json_integer(*(const int64_t *)(base + k->off)); break;
        case K_INT32: v = json_integer(*(const int *)(base + k->off)); break;
        case K_NUM: v = json_real(*(const double *)(base + k->off)); break;
        case K_STR: v = json_string(base + k->off); break;
        case K_SIZE:
            if (k->aux && *(const bool *)(base + k->aux - 1))
                v = json_string("auto");
            else
                v = json_integer((json_int_t)*(const uint64_t *)(base + k->off));
            break;
        case K_ENUM: {
            int idx = *(const int *)(base + k->off) - k->aux;
            if (idx < 0) {
                v = json_null();
                break;
            }
            const char *ch = k->choices;
            for (int j = 0; j < idx && ch; j++) {
                ch = strchr(ch, '|');
                if (ch)
                    ch++;
            }
            if (!ch) {
                v = json_null();
                break;
            }
            size_t n = strcspn(ch, "|");
            v = json_stringn(ch, n);
            break;
        }
        case K_BETAS:
            v = json_pack("[ff]", c->optimizer.beta1, c->optimizer.beta2);
            break;
        case K_TARGETS: {
            static const char *const names[] = { "q_proj", "k_proj", "v_proj", "o_proj",
                                                 "gate_proj", "up_proj", "down_proj" };
            v = json_array();
            for (int j = 0; j < 7; j++)
                if (c->lora.targets & (1u << j))
                    json_array_append_new(v, json_string(names[j]));
            break;
        }
        case K_NVME: {
            v = json_array();
            for (int j = 0; j < c->tiers.n_nvme; j++) {
                const zn_config_nvme_path *np = &c->tiers.nvme[j];
                json_t *e = json_pack("{ss}", "path", np->path);
                json_object_set_new(e, "size", np->size_auto ? json_string("auto")
                                                              : json_integer((json_int_t)np->size));
                json_array_append_new(v, e);
            }
            break;
        }
        default: break;
        }
        if (v)
            json_object_set_new(o, leaf, v);
    }
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    return s;
}
