/* zinc generate: text generation with a KV cache over the model's blocks
 * (include/zinc/model.h), decoding as transformers' generate() does:
 * greedy, or sampling with temperature, top-k, top-p, and a repetition
 * penalty, stopping at an end-of-sequence id or after max_new_tokens.
 *
 * Prompts are token ids (the CLI tokenizes); many prompts decode together,
 * one step for the whole batch, so the weights are read once per step
 * however many sequences there are. Each prompt is prefilled on its own
 * (its own slot of the cache) and then decoded with the others; a batch of
 * prompts of different lengths gives each the ids it gets alone. */
#ifndef ZINC_GENERATE_H
#define ZINC_GENERATE_H

#include <stdint.h>

#include "zinc/model.h"
#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZN_GEN_MAX_EOS 8

typedef struct {
    int64_t max_new_tokens; /* > 0 */
    int do_sample;          /* 0: greedy (argmax; the lowest id of equal maxima) */
    double temperature;     /* sampling: logits / temperature (> 0) */
    int64_t top_k;          /* sampling: keep the k highest logits (ties kept); 0: all */
    double top_p;           /* sampling: the smallest set of the most likely ids whose
                               probability reaches top_p; 1: all */
    double repetition_penalty; /* > 0; 1: none. An id already in the sequence (prompt
                                  included) has its logit divided by it (multiplied when
                                  negative), as transformers does, greedy or not */
    uint64_t seed;          /* sampling: the same seed, prompts and settings give the
                               same ids */
    int n_eos;              /* stop ids (0..ZN_GEN_MAX_EOS); the one met is emitted */
    int32_t eos[ZN_GEN_MAX_EOS];
} zn_gen_params;

/* transformers' GenerationConfig defaults: greedy, temperature 1, top_k 50,
 * top_p 1, no penalty, max_new_tokens 256 (transformers' own default is a
 * total length of 20), no eos. */
ZN_API zn_gen_params zn_gen_params_default(void);
/* Checks the ranges; 0 or ZN_ECONFIG naming the setting. */
ZN_API int zn_gen_params_check(const zn_gen_params *p);

typedef struct zn_gen zn_gen;

/* A generator over a loaded model state (every weight resident; st and its
 * model must outlive the generator): a KV cache of `max_batch` sequences of
 * up to the model's max_seq tokens each (prompt and generated), two
 * activations and the logits, allocated from the model's device arena. The
 * model must use the GEMM attention. Returns 0, ZN_EARG, ZN_EBUDGET, or a
 * device error. */
ZN_API int zn_gen_create(zn_gen **out, zn_model_state *st, int64_t max_batch);
ZN_API void zn_gen_destroy(zn_gen *g); /* accepts NULL */

/* ---- a generator that owns its weights and streams what does not fit ---------
 * zn_gen_open allocates the cache, activations and logits, then places the
 * 16-bit (or fp32) weights: everything on the device when it fits the
 * arena; otherwise the head (final norm and lm_head, and a tied embedding)
 * on the device, an untied embedding in pinned host memory (a step
 * gathers its ids' rows on the host), a ring of `ring` device slots of one
 * decoder layer each, then as many layers resident as the arena still
 * holds, the rest homed in pinned host memory. A streamed layer is copied
 * into its slot on a copy stream while the layers before it compute, the
 * next step's first ones during the current step's last layers and head,
 * so each step moves every streamed layer across the link once whatever
 * the batch. Every byte is allocated here (zn_gen_get_placement reports
 * it); zn_gen_load fills it. */
typedef struct {
    int64_t max_batch;       /* sequences decoded together (default 1) */
    int ring;                /* device slots for streamed layers (default 2, 1..8) */
    int max_resident_layers; /* -1 (default): as many as fit; n: at most n */
    /* NULL (default): streamed layers are homed in pinned memory. A folder:
     * they are homed on NVMe there instead (a swap file, removed at
     * destroy; io_uring reads into one pinned stage per slot, K uses
     * ahead, each stage then copied to its device slot one use ahead), for
     * a model larger than the host's RAM. */
    const char *nvme_dir;
    /* Where the KV cache lives. ZN_GEN_KV_AUTO (default): on the device
     * when it fits beside the least the weights need there (the head, a
     * tied embedding, the ring), else homed in pinned host memory.
     * ZN_GEN_KV_DEVICE / ZN_GEN_KV_PINNED: there, or refused. Homed in
     * pinned memory, each layer's cache passes through one of two device
     * slots of one layer each: a layer's cached rows are copied in on a
     * copy stream while the layer before it computes, and the rows the
     * layer adds are copied back out on another once it has run. The
     * arithmetic is the device cache's (same kernels on the same values). */
    int kv_home;
} zn_gen_config;

enum { ZN_GEN_KV_AUTO = 0, ZN_GEN_KV_DEVICE = 1, ZN_GEN_KV_PINNED = 2 };

ZN_API zn_gen_config zn_gen_config_default(void);
/* Returns 0, ZN_EARG, ZN_EBUDGET (the head, the ring or a layer does not fit
 * the device, or the pinned homes cpu_budget: named; a KV cache that fits
 * neither the device nor pinned memory: its size and both budgets), or a
 * device error. */
ZN_API int zn_gen_open(zn_gen **out, zn_model *m, const zn_gen_config *c);
/* Reads the weights into their homes: a Hugging Face folder or file, and
 * with adapter_dir (the model made with its LoRA dims) the PEFT adapter,
 * unmerged. Checks as zn_model_state_load / _load_peft do. */
ZN_API int zn_gen_load(zn_gen *g, const char *base, const char *adapter_dir);

/* The same without the adapters of a LoRA model: the base only (its
 * adapters then come from zn_gen_put). */
ZN_API int zn_gen_load_base(zn_gen *g, const char *base);
/* Elements [first, first + n) of tensor i of block b (zn_model_block_param
 * order) from fp32 values, rounded to the model's dtype: for weights from
 * elsewhere, such as a training checkpoint (zn_ckpt_read_weights). Every
 * tensor must be filled before zn_gen_run. Returns 0 or ZN_EARG. */
ZN_API int zn_gen_put(zn_gen *g, int block, int i, uint64_t first, const float *v, uint64_t n);

typedef struct {
    int layers, resident_layers, streamed_layers, ring;
    int embed_resident;            /* the embedding on the device (else pinned, gathered) */
    uint64_t layer_bytes;          /* one decoder layer */
    uint64_t device_weight_bytes;  /* weights and ring slots on the device */
    uint64_t pinned_bytes;         /* weights homed in pinned host memory (and NVMe stages) */
    uint64_t nvme_bytes;           /* the swap file of NVMe-homed layers (its size): one
                                      extent per layer, each under a swap block more
                                      than the layer */
    uint64_t nvme_read;            /* bytes read from it so far */
    uint64_t streamed_bytes_per_step; /* host to device per decoding step */
    uint64_t streamed_bytes;       /* copied so far */
    uint64_t kv_bytes_per_seq;     /* the cache of one sequence of max_seq tokens */
    uint64_t kv_bytes;             /* the whole cache */
    int kv_pinned;                 /* the cache is homed in pinned memory (else the device) */
    uint64_t kv_device_bytes;      /* the cache's device bytes: the whole cache, or the two
                                      one-layer slots it passes through when pinned */
    uint64_t kv_token_bytes;       /* one token's keys and values over every layer: a
                                      pinned cache moves, per decoding step and sequence at
                                      context c, c x this in and 1 x this out */
    uint64_t kv_in_bytes, kv_out_bytes; /* pinned cache: bytes copied in and out so far */
    /* what crosses the link per token whatever the placement: an embedding
     * row gathered on the host (0 when the embedding is on the device) and a
     * row of fp32 logits back; and their bytes so far */
    uint64_t embed_row_bytes, logits_row_bytes;
    uint64_t embed_in_bytes, logits_out_bytes;
} zn_gen_placement;

ZN_API void zn_gen_get_placement(const zn_gen *g, zn_gen_placement *p);

/* For benchmarks: the seconds one step's streamed copies take on their own
 * (every streamed layer copied once into the ring, nothing computing: the
 * link's ceiling for a step); 0 when nothing streams. Leaves the ring as
 * the next step expects it. */
ZN_API int zn_gen_time_link(zn_gen *g, double *seconds);

/* Called for every generated id, as it is chosen: sequence `seq` (index
 * into the prompts), its id, and whether it is that sequence's last. A
 * nonzero return stops the generation with that value. */
typedef int (*zn_gen_token_fn)(void *ctx, int64_t seq, int32_t id, int last);

/* Generates for n prompts (ids, lens; each 1 .. max_seq - 1 ids), at most
 * max_batch at a time. out[i] (may be NULL) receives sequence i's generated
 * ids, malloc'd (free with free()), and out_len[i] their count. Returns 0,
 * ZN_EARG (an empty or too long prompt, an id outside the vocab: the
 * message names the prompt), ZN_ECONFIG (bad params), the callback's value,
 * or a device error. */
ZN_API int zn_gen_run(zn_gen *g, int64_t n, const int32_t *const *ids, const int64_t *lens,
                      const zn_gen_params *p, int32_t **out, int64_t *out_len,
                      zn_gen_token_fn cb, void *ctx);

/* Prefix reuse (off by default): each cache slot remembers the ids whose
 * keys and values it holds, and a prompt that starts with them (a chat's
 * history with its new turn) is prefilled only from where they differ.
 * The cached part was computed from the same ids at the same positions;
 * the rest runs as a shorter prefill (GEMMs of other shapes: the logits
 * may differ from a whole prefill's in the last bits). */
ZN_API void zn_gen_set_prefix_reuse(zn_gen *g, int on);

/* Tokens run through the model since the generator was made: prompt tokens
 * prefilled, prompt tokens whose cache was reused instead, decoding steps'
 * tokens (one per sequence and step). */
typedef struct {
    uint64_t prefilled, reused, decoded;
} zn_gen_stats;
ZN_API void zn_gen_get_stats(const zn_gen *g, zn_gen_stats *out);

/* For tests: the fp32 logits [vocab] the last step computed for sequence
 * `seq` of the current batch, NULL before a step. */
ZN_API const float *zn_gen_last_logits(const zn_gen *g, int64_t seq);

/* The next-token choice of zn_gen_run on one row of logits, for tests:
 * `logits` (changed in place: the processors are applied), the sequence so
 * far (for the penalty), and the sampler's state (seeded from p->seed). */
ZN_API int32_t zn_gen_choose(const zn_gen_params *p, float *logits, int64_t vocab,
                             const int32_t *seq, int64_t seq_len, uint64_t *rng);

#ifdef __cplusplus
}
#endif
#endif
