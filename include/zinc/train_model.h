/* The model as the trainer sees it (zn_train_model: blocks run in order,
 * each a flat parameter buffer), and the decoder families of
 * include/zinc/model.h adapted to it (src/model/model_train.c). The model
 * layer owns this interface; the trainer (include/zinc/train.h), the
 * planner's probes and the tests' toy models take it, and none of them
 * knows which family is behind it. */
#ifndef ZINC_TRAIN_MODEL_H
#define ZINC_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the model, as the trainer sees it -------------------------------------
 * Blocks run in order 0..n_blocks-1 in forward and in reverse in backward.
 * Each block's parameters are one flat buffer of block_params[b] elements
 * (its tensors are views by offset; the model decides the layout). Between
 * blocks flows one activation of act_bytes (hidden state of a micro-batch).
 * Block 0 reads the batch's token ids instead of an input; the last block
 * writes no output: its forward computes the loss. All calls queue work on
 * the stream they are given (asynchronous) unless said otherwise. */
typedef struct zn_train_model {
    void *ctx;
    int n_blocks;
    const uint64_t *block_params;  /* elements per block */
    /* NULL, or per block how many of its first elements are frozen (a LoRA
     * base): they get no master, optimizer state or gradient, are fetched
     * like the rest and never written back. The backward's dparams then
     * covers only elements [frozen, n) of the block (NULL when the block
     * has none that train), and a wholly frozen block 0 gets no backward. */
    const uint64_t *block_frozen;
    /* NULL, or per block 1 when block b is a further part of the layer
     * that block b - 1 belongs to (a vocabulary split in row ranges): the
     * parts of one layer run back to back and share its buffers, the same
     * `in` and `out` in the forward and the same `dout` and `din` in the
     * backward (which runs them in reverse); the model decides which part
     * writes what. */
    const unsigned char *block_joins;
    /* NULL, or per block: >= 0 when the block's gradient is row-sparse, the
     * first of its rows (of row_width elements each, its whole flat
     * buffer), of which a micro-batch's gradient touches only those its
     * input ids name (an untied embedding's part); -1 otherwise. The trainer
     * then moves and adds only those rows (one rank, gradients in RAM). */
    const int64_t *block_sparse_row0;
    int64_t row_width;
    /* Optional: the parameter tensors' parts in block b's flat elements, in
     * order: part k starts at element off[k] and belongs to a tensor of
     * numel[k] elements in all. At most cap parts; returns how many, or a
     * negative error. 8-bit moments keep the states of the tensors
     * bitsandbytes and torchao keep in fp32 (too small to quantize) in
     * fp32 too. NULL: every tensor is quantized. */
    int (*tensor_parts)(void *ctx, int block, uint64_t *off, uint64_t *numel, int cap);
    size_t act_bytes;              /* bytes of one inter-block activation */
    double flops_per_token;        /* model FLOPs per token (fwd + bwd), for TFLOP/s */
    /* Called once after the device exists: allocate scratch (counted in the
     * GPU budget), upload tables. Optional. */
    int (*prepare)(void *ctx, zn_dev *d, zn_stream *s, zn_dtype param_dtype);
    /* Frees what prepare allocated. Optional. */
    void (*release)(void *ctx, zn_dev *d);
    /* Initial fp32 values of elements [first, first + n) of block b's flat
     * parameters into host memory `out` (first + n <= block_params[b]). The
     * trainer asks for ranges (each rank only its own, in bounded chunks),
     * so a model loaded from disk reads only the bytes it needs and never
     * holds a whole block; it may call from one thread at a time, and the
     * callback may use OpenMP inside. */
    int (*init_params)(void *ctx, int block, uint64_t first, uint64_t n, float *out);
    /* Sets the micro-batch for the following calls: ids, targets and pos
     * are host int32 [batch * seq], usable again when this returns (it may
     * wait for s); pos (NULL: 0..seq-1 in every sequence) is each token's
     * position in its document, for packed documents (zn_model_set_batch).
     * The loss the last block computes is sum(per-token xent) * loss_scale,
     * and its backward seeds with the same scale. */
    int (*set_batch)(void *ctx, zn_stream *s, const int32_t *ids, const int32_t *targets,
                     const int32_t *pos, int64_t batch, int64_t seq, float loss_scale);
    /* Optional (models with dropout): training != 0 before each training
     * micro-batch, with its index over the whole run, (step * world + rank)
     * * accumulation + micro-batch, from which the model draws its masks
     * (so a resumed run and every placement draw the same ones); 0 before
     * evaluation. Called after set_batch. */
    void (*set_dropout)(void *ctx, int training, uint64_t micro_index);
    /* Waits for s and returns the loss of the last block's latest forward. */
    int (*read_loss)(void *ctx, zn_stream *s, float *loss);
    /* Queues block b's forward on s. params: device, flat, param_dtype. */
    int (*forward)(void *ctx, zn_stream *s, int block, void *params, const void *in, void *out);
    /* Queues block b's backward on s: recomputes what it needs from `in`,
     * writes din (NULL for block 0) from dout (NULL for the last block, which
     * seeds from the targets) and ADDS the parameter gradients (fp32, flat
     * like the parameters) to dparams. */
    int (*backward)(void *ctx, zn_stream *s, int block, void *params, const void *in,
                    const void *dout, void *din, float *dparams);
    /* 1: the first layer's blocks (block 0 and those joined to it) are read
     * by other blocks too (a tied embedding, which the head uses as its
     * output projection). The trainer then keeps them whole and resident on
     * the device for the run (their home is the device, never fetched),
     * calls bind_block0 with each one's device address after allocating it,
     * and refuses ZeRO stage 3 across ranks (whose blocks live sharded).
     * Other blocks' gradients for them are the model's to add into theirs
     * during their backward, which comes last. */
    int keep_block0;
    void (*bind_block0)(void *ctx, int block, void *dev_params);
    /* For the plan: the device bytes prepare() will allocate and the
     * act_bytes it will set, for param dtype dt, without a device.
     * Optional (without it the plan counts no model scratch). */
    int (*plan_prepare)(void *ctx, zn_dtype dt, uint64_t *device_bytes, size_t *act_bytes);
    /* Optional (a mixture of experts' load-balancing loss): after a
     * training micro-batch's forward, the term its backward added beyond
     * the scaled cross-entropy (coefficient x aux, not loss-scaled) and the
     * unweighted aux loss. The trainer adds the term to the step's loss and
     * reports the aux loss apart (its mean over the micro-batches). */
    int (*read_aux_loss)(void *ctx, double *weighted, double *aux);
} zn_train_model;

/* ---- the Llama / Qwen2 decoder as a trainer model ---------------------------
 * Adapts include/zinc/model.h's block API: block b's flat buffer holds its
 * own tensors in zn_model_block_param order, back to back. Initial weights:
 * either a Hugging Face checkpoint (zn_train_llama_load), or normal(0,
 * init_std) for matrices, ones for norms, zeros for biases, a function of
 * (seed, block, tensor, element pair) only.
 * tie_word_embeddings: one parameter, embed_tokens, its parts kept resident
 * on the device (keep_block0); the head reads them as its lm_head. The
 * head's backward writes its weight gradient into an fp32 device buffer of
 * the embedding's size, whose rows each embedding part's backward adds to
 * its own: one gradient, one optimizer state. */
typedef struct zn_train_llama zn_train_llama;
/* dims: the decoder (copied). micro_batch x seq: the largest micro-batch.
 * Returns 0, ZN_ECONFIG, -ENOMEM. */
ZN_API int zn_train_llama_create(zn_train_llama **out, const zn_model_dims *dims,
                                 int64_t micro_batch, int64_t seq, double init_std,
                                 uint64_t seed);
ZN_API const zn_train_model *zn_train_llama_model(zn_train_llama *l);

/* Takes the initial weights from a Hugging Face checkpoint: `path` is a
 * model folder (model.safetensors or model.safetensors.index.json), an
 * index or a .safetensors file. Opens every shard and checks, before any
 * byte of data is read, that the tensors are exactly the model's: each
 * parameter present with its shape and a float dtype (F32, F16, BF16),
 * nothing unexpected (rotary inv_freq buffers and, for a tied model,
 * lm_head.weight excepted). The trainer then reads each range it places
 * with parallel preads, widening bf16/fp16 exactly to fp32. `summary`
 * (may be NULL) receives a line for people: "339 tensors from DIR, bf16".
 * Call before zn_train_create. Returns 0, -errno (a file that cannot be
 * read), ZN_ECORRUPT (a malformed or truncated file), ZN_ECONFIG (a
 * missing, unexpected or misshapen tensor: the message names it and its
 * file), ZN_EUNSUPPORTED (a dtype that does not convert). */
ZN_API int zn_train_llama_load(zn_train_llama *l, const char *path, char *summary,
                               size_t summary_len);
/* LoRA: the adapters start from a PEFT adapter (`dir` holds
 * adapter_model.safetensors, or is the file) instead of PEFT's initial
 * values (lora_A Kaiming-uniform from the seed, lora_B zero). Every adapter
 * tensor must be there ("base_model.model.<name>") with its shape, and
 * nothing else. Returns 0, -errno, ZN_ECORRUPT, ZN_ECONFIG (missing or
 * misshapen: named), ZN_EUNSUPPORTED (another tensor, a dtype). */
ZN_API int zn_train_llama_load_adapter(zn_train_llama *l, const char *dir, char *summary,
                                       size_t summary_len);
/* LoRA: the seed of PEFT's initial lora_A values (default 0). */
ZN_API void zn_train_llama_set_lora_seed(zn_train_llama *l, uint64_t seed);
/* The attention the model runs (ZN_ATTN_AUTO, default; GEMM; FUSED: see
 * zn_model_config.attention); the plan and the run both take it. */
ZN_API void zn_train_llama_set_attention(zn_train_llama *l, int attention);
/* Bytes of tensor data read from the checkpoint so far (for `zinc bench
 * load` and the load report); *total (may be NULL) receives the bytes of
 * every tensor the model takes from it. With ZeRO stage 3 across N ranks a
 * rank reads about total / N. */
ZN_API uint64_t zn_train_llama_bytes_read(const zn_train_llama *l, uint64_t *total);
ZN_API void zn_train_llama_destroy(zn_train_llama *l); /* accepts NULL */

#ifdef __cplusplus
}
#endif

#endif
