/* The configuration's schema: every key zinc reads (DeepSpeed's and its
 * own), with its type, range, "auto" rule and the note for keys zinc accepts
 * or refuses; the defaults; key look-ups with spelling suggestions. The
 * table is the single source of truth for key names, types, ranges,
 * defaults-as-accepted and the config dump. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "config/config-impl.h"

/* autorule is left out of most entries (zero: "auto" refused) */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
const key_spec zn_cfg_schema[] = {
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
    /* diagnostics and speed knobs (K_TUNING): accepted at any value, with
     * a note where the value asks for something zinc does its own way */
    { "dump_state", K_TUNING, 0, 0, 0, "false", 0,
      "DeepSpeed's engine-state dump is not printed; zinc train prints its effective config "
      "at the start, zinc plan the memory plan" },
    { "communication_data_type", K_FIXED, 0, 0, 0, "null|\"fp32\"", 0, NULL },
    { "seq_parallel_communication_data_type", K_UNSUPP, 0, 0, 0, NULL, 0, NULL },
    { "amp", K_OFFSEC, 0, 0, 0, NULL, 0, "use bf16.enabled or fp16.enabled" },
    { "zenflow", K_UNSUPP, 0, 0, 0, NULL, 0, NULL },
    { "flops_profiler", K_TUNING, 0, 0, 0, NULL, 0,
      "DeepSpeed's flops profiler is not run; zinc train prints the achieved TFLOP/s on each "
      "log line" },
    { "tensorboard", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "tensorboard.enabled", K_BOOL, OFF(tensorboard.enabled), 0, 0, NULL, 0, NULL },
    { "tensorboard.output_path", K_STR, OFF(tensorboard.output_path), 0, 0, NULL, ZN_PATH_MAX, NULL },
    { "tensorboard.job_name", K_STR, OFF(tensorboard.job_name), 0, 0, NULL, 256, NULL },
    /* the services: zinc sends nothing over the network; the files it
     * writes are what they import */
    { "wandb", K_TUNING, 0, 0, 0, NULL, 0,
      "zinc sends no metrics to a service: enable the tensorboard section (W&B imports its "
      "event files with wandb sync DIR) or use zinc train --json-log" },
    { "comet", K_TUNING, 0, 0, 0, NULL, 0,
      "zinc sends no metrics to a service: the tensorboard and csv_monitor sections write "
      "files, zinc train --json-log writes JSON lines" },
    { "csv_monitor", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "csv_monitor.enabled", K_BOOL, OFF(csv_monitor.enabled), 0, 0, NULL, 0, NULL },
    { "csv_monitor.output_path", K_STR, OFF(csv_monitor.output_path), 0, 0, NULL, ZN_PATH_MAX, NULL },
    { "csv_monitor.job_name", K_STR, OFF(csv_monitor.job_name), 0, 0, NULL, 256, NULL },
    /* LLaMA-Factory's configs carry this; DeepSpeed itself reads only the
     * top-level tensorboard / wandb / csv_monitor / comet sections
     * (deepspeed/monitor/config.py get_monitor_config), so whatever it says
     * changes nothing there, nor here */
    { "monitor_config", K_ACCEPT, 0, 0, 0, "any", 0,
      "DeepSpeed does not read a top-level monitor_config (its monitors are the top-level "
      "tensorboard, wandb, csv_monitor and comet sections)" },
    { "comms_logger", K_TUNING, 0, 0, 0, NULL, 0,
      "DeepSpeed's communication logger is not run; zinc's collectives are its own, and the "
      "step-time breakdown at the end of zinc train gives their busy time (comm)" },
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
    /* a gather copies: an allgather or a series of broadcasts give the same
     * bits (a reduction's collective may not: reduce_scatter stays fixed) */
    { "zero_optimization.allgather_partitions", K_TUNING, 0, 0, 0, "true", 0,
      "an allgather or a series of broadcasts gather the same values; zinc gathers the "
      "updated parameters with its own collectives" },
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
    { "zero_optimization.stage3_module_granularity_threshold", K_TUNING, 0, 0, I64MAX, "0", 0,
      "ZeRO-3 fetches modules smaller than it together, to cut its hooks' overhead; zinc "
      "fetches each block (a decoder layer, a part of the embedding or the head) as one "
      "buffer, whatever the value" },
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
    { "zero_optimization.offload_optimizer.fast_init", K_TUNING, 0, 0, 0, "false", 0,
      "how DeepSpeed first writes the optimizer states to NVMe; zinc writes the initial master "
      "weights once and starts Adam's moments as zeros without reading them" },
    { "zero_optimization.offload_optimizer.super_offload", K_FIXED, 0, 0, 0, "false", 0, NULL },
    { "zero_optimization.offload_optimizer.cpuadam_cores_perc", K_TUNING, 0, 0, 1, "0.8", 0,
      "DeepSpeed reads it only with super_offload; zinc's CPU Adam runs train.threads "
      "threads" },

    /* ---- DeepSpeed: async I/O ---- */
    { "aio", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "aio.block_size", K_INT, OFF(aio.block_size), 4096, 1073741824.0, NULL, 0, NULL },
    { "aio.queue_depth", K_INT, OFF(aio.queue_depth), 1, 4096, NULL, 0, NULL },
    { "aio.intra_op_parallelism", K_INT, OFF(aio.intra_op_parallelism), 1, 256, NULL, 0, NULL },
    { "aio.thread_count", K_INT, OFF(aio.intra_op_parallelism), 1, 256, NULL, 0, NULL },
    { "aio.single_submit", K_BOOL, OFF(aio.single_submit), 0, 0, NULL, 0, NULL },
    { "aio.overlap_events", K_BOOL, OFF(aio.overlap_events), 0, 0, NULL, 0, NULL },
    { "aio.use_gds", K_TUNING, 0, 0, 0, "false", 0,
      "zinc moves NVMe data through pinned host buffers (io_uring, or a thread pool), not "
      "GPUDirect Storage" },

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
    { "tiers.create_nvme_path", K_BOOL, OFF(tiers.create_nvme_path), 0, 0, NULL, 0, NULL },
    { "tiers.grads", K_ENUM, OFF(tiers.grads), 0, 0, "auto|cpu|nvme", 0, NULL },
    { "tiers.param_cache", K_INT32, OFF(tiers.param_cache), 0, 64, NULL, 0, NULL },

    /* ---- zinc: model (HF config.json names) ---- */
    { "model", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "model.path", K_STR, OFF(model.path), 0, 0, NULL, ZN_PATH_MAX, NULL },
    { "model.model_type", K_ENUM, OFF(model.arch), 0, 0, "llama|qwen2|mistral|qwen3|phi3|olmo2|gemma|gemma2|gemma3_text|olmo3|qwen3_moe|mixtral", 0, NULL },
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
    /* the windowed and mixture-of-experts families' keys (src/run/setup.c:
     * unset, the family's HF default) */
    { "model.sliding_window", K_INT, OFF(model.sliding_window), 1, 1 << 24, NULL, 0, NULL },
    { "model.sliding_window_pattern", K_INT, OFF(model.sliding_window_pattern), 1, 4096, NULL, 0, NULL },
    { "model.query_pre_attn_scalar", K_NUM, OFF(model.query_pre_attn_scalar), 0, 1e12, NULL, 0, NULL },
    { "model.attn_logit_softcapping", K_NUM, OFF(model.attn_logit_softcapping), 0, 1e12, NULL, 0, NULL },
    { "model.final_logit_softcapping", K_NUM, OFF(model.final_logit_softcapping), 0, 1e12, NULL, 0, NULL },
    { "model.rope_local_base_freq", K_NUM, OFF(model.rope_local_base_freq), 1, 1e12, NULL, 0, NULL },
    { "model.num_experts", K_INT, OFF(model.num_experts), 1, 65536, NULL, 0, NULL },
    { "model.num_experts_per_tok", K_INT, OFF(model.num_experts_per_tok), 1, 65536, NULL, 0, NULL },
    { "model.moe_intermediate_size", K_INT, OFF(model.moe_intermediate_size), 1, 1 << 22, NULL, 0, NULL },
    { "model.decoder_sparse_step", K_INT, OFF(model.decoder_sparse_step), 1, 4096, NULL, 0, NULL },
    { "model.norm_topk_prob", K_BOOL, OFF(model.norm_topk_prob), 0, 0, NULL, 0, NULL },
    { "model.output_router_logits", K_BOOL, OFF(model.output_router_logits), 0, 0, NULL, 0, NULL },
    { "model.router_aux_loss_coef", K_NUM, OFF(model.router_aux_loss_coef), 0, 1e6, NULL, 0, NULL },
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
    { "train.optim", K_ENUM, OFF(train.optim), 0, 0, ZN_OPTIM_NAMES, 0, NULL },
    { "train.master_weights", K_ENUM, OFF(train.master_weights), 0, 0, ZN_MASTER_NAMES, 0, NULL },
    { "train.log_every", K_INT, OFF(train.log_every), 1, I64MAX, NULL, 0, NULL },
    { "train.seed", K_INT, OFF(train.seed), 0, I64MAX, NULL, 0, NULL },
    { "train.device", K_STR, OFF(train.device), 0, 0, NULL, 32, NULL },
    { "train.threads", K_INT, OFF(train.threads), 0, 4096, NULL, 0, NULL },
    { "train.speculative_step", K_ENUM, OFF(train.speculative_step), 0, 0, "auto|true|false", 0, NULL },
    { "train.activation_checkpointing", K_BOOL, OFF(train.activation_checkpointing), 0, 0, NULL, 0, NULL },
    { "train.checkpoint", K_OBJ, 0, 0, 0, NULL, 0, NULL },
    { "train.checkpoint.dir", K_STR, OFF(train.checkpoint.dir), 0, 0, NULL, ZN_PATH_MAX, NULL },
    { "train.checkpoint.every", K_INT, OFF(train.checkpoint.every), 0, I64MAX, NULL, 0, NULL },
    { "train.checkpoint.keep_last", K_INT, OFF(train.checkpoint.keep_last), 1, 1 << 20, NULL, 0, NULL },
    { "train.checkpoint.continue_on_error", K_BOOL, OFF(train.checkpoint.continue_on_error), 0, 0, NULL, 0, NULL },
    { "train.checkpoint.background", K_BOOL, OFF(train.checkpoint.background), 0, 0, NULL, 0, NULL },
    { "train.checkpoint.in_place", K_BOOL, OFF(train.checkpoint.in_place), 0, 0, NULL, 0, NULL },
    { "train.checkpoint.commit", K_BOOL, OFF(train.checkpoint.commit), 0, 0, NULL, 0, NULL },
    { "train.checkpoint.notice_s", K_NUM, OFF(train.checkpoint.notice_s), 0, 1e6, NULL, 0, NULL },
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
    { "train.warmup_ratio", K_NUM, OFF(train.warmup_ratio), 0, 1, NULL, 0, NULL },
    { "train.num_train_epochs", K_NUM, OFF(train.num_train_epochs), 0, 1e9, NULL, 0, NULL },
    /* the HF Trainer's TrainingArguments names for zinc's own keys */
    { "train.max_steps", K_INT, OFF(train.steps), 0, I64MAX, NULL, 0, NULL },
    { "train.logging_steps", K_INT, OFF(train.log_every), 1, I64MAX, NULL, 0, NULL },
    { "train.eval_steps", K_INT, OFF(train.eval_every), 0, I64MAX, NULL, 0, NULL },
    { "train.save_steps", K_INT, OFF(train.checkpoint.every), 0, I64MAX, NULL, 0, NULL },
    { "train.save_total_limit", K_INT, OFF(train.checkpoint.keep_last), 1, 1 << 20, NULL, 0, NULL },
    { "train.output_dir", K_STR, OFF(train.checkpoint.dir), 0, 0, NULL, ZN_PATH_MAX, NULL },
};
#pragma GCC diagnostic pop

_Static_assert(sizeof zn_cfg_schema / sizeof zn_cfg_schema[0] <= ZN_CONFIG_MAX_KEYS,
               "zn_config.origin is too small for the schema");

const size_t zn_cfg_n_schema = sizeof zn_cfg_schema / sizeof zn_cfg_schema[0];

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
    c->model.router_aux_loss_coef = 0.001; /* Qwen3MoeConfig's, MixtralConfig's */
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
    c->train.checkpoint.background = true;
    c->train.checkpoint.in_place = true;
    c->train.checkpoint.commit = true;
    c->train.checkpoint.notice_s = 30;
    /* transformers TrainingArguments' defaults */
    c->train.learning_rate = 5e-5;
    c->train.adam_beta1 = 0.9;
    c->train.adam_beta2 = 0.999;
    c->train.adam_epsilon = 1e-8;
    c->train.weight_decay = 0.0;
    c->train.max_grad_norm = 1.0;
    c->train.lr_scheduler_type = 0;
    c->train.warmup_steps = 0;
    snprintf(c->tensorboard.job_name, sizeof c->tensorboard.job_name, "DeepSpeedJobName");
    snprintf(c->csv_monitor.job_name, sizeof c->csv_monitor.job_name, "DeepSpeedJobName");
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

/* ---- zn_cfg_schema look-ups ----------------------------------------------------- */

const key_spec *zn_cfg_find_key(const char *path)
{
    for (size_t i = 0; i < zn_cfg_n_schema; i++)
        if (strcmp(zn_cfg_schema[i].path, path) == 0)
            return &zn_cfg_schema[i];
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

const char *zn_cfg_leaf_of(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

/* Fills `out` with a hint for an unknown key: a sibling with a close name,
 * or the same name at another level. */
void zn_cfg_suggest(const char *prefix, const char *key, char *out, size_t len)
{
    size_t plen = strlen(prefix);
    size_t best = (size_t)-1;
    const char *best_leaf = NULL;
    out[0] = '\0';
    for (size_t i = 0; i < zn_cfg_n_schema; i++) {
        const char *p = zn_cfg_schema[i].path;
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
    for (size_t i = 0; i < zn_cfg_n_schema; i++) {
        if (strcmp(zn_cfg_leaf_of(zn_cfg_schema[i].path), key) == 0) {
            snprintf(out, len, " (it belongs at '%s')", zn_cfg_schema[i].path);
            return;
        }
    }
}
