/* zinc token data: a flat file of token ids (format below, documented in
 * docs/tokens.md), memory-mapped; a loader that cuts it into fixed-length
 * sequences, shuffles them deterministically from a seed, and gives each
 * data-parallel rank its own slice of every global batch; and a built-in
 * synthetic dataset (a fixed random Markov chain) that a model can learn.
 *
 * File format (all little-endian), version 1:
 *   offset 0   8 bytes  magic "ZNTOKENS"
 *          8   u32      version = 1
 *         12   u32      width: bytes per token id, 2 (uint16) or 4 (uint32)
 *         16   u64      count: number of token ids
 *         24   u32      vocab: every id is < vocab; 0 = not recorded
 *         28   u32      reserved, 0
 *         32   count x width bytes of ids
 * The file size must be exactly 32 + count * width. */
#ifndef ZINC_TOKENS_H
#define ZINC_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZN_TOKENS_MAGIC "ZNTOKENS"
#define ZN_TOKENS_VERSION 1     /* ids only */
#define ZN_TOKENS_VERSION2 2    /* ids, a loss mask, document ends (docs/tokens.md) */
#define ZN_TOKENS_HAS_MASK 1u   /* version 2 flags (header offset 28) */
#define ZN_TOKENS_HAS_DOCS 2u
#define ZN_TOKENS_HEADER 32

typedef struct zn_tokens zn_tokens;

/* Maps a token file read-only. Returns 0; -errno (message names the file);
 * ZN_ECORRUPT for a bad magic, version, width or a size that does not match
 * the header (message names the file and the field). */
ZN_API int zn_tokens_open(zn_tokens **out, const char *path);

/* The built-in synthetic dataset: `count` ids below `vocab` (>= 8) drawn from
 * a Markov chain fixed by `seed`: each token has 4 distinct successors with
 * probabilities 0.6, 0.2, 0.15, 0.05, so a model can push its loss from
 * ln(vocab) down to the chain's entropy (zn_tokens_synthetic_entropy()).
 * Same (count, vocab, seed) => same ids on every machine. Held in memory
 * (4 bytes per token). Returns 0, ZN_EARG or -ENOMEM. */
ZN_API int zn_tokens_synthetic(zn_tokens **out, uint64_t count, uint32_t vocab, uint64_t seed);
/* Entropy rate of the synthetic chain in nats per token (~1.06): the lowest
 * mean cross-entropy a model can reach on it. */
ZN_API double zn_tokens_synthetic_entropy(void);

ZN_API void zn_tokens_close(zn_tokens *t); /* accepts NULL */

ZN_API uint64_t zn_tokens_count(const zn_tokens *t);
/* The header's vocab (0 = not recorded); for synthetic data its vocab. */
ZN_API uint32_t zn_tokens_vocab(const zn_tokens *t);
/* Width in bytes (2 or 4). */
ZN_API int zn_tokens_width(const zn_tokens *t);
/* The file path, or "synthetic". */
ZN_API const char *zn_tokens_name(const zn_tokens *t);
/* Token i (i < count). */
ZN_API uint32_t zn_tokens_get(const zn_tokens *t, uint64_t i);
/* Version 2: whether token i is a target (its loss counts when it is
 * predicted): the mask bit, 1 without a mask (version 1, synthetic). */
ZN_API int zn_tokens_is_target(const zn_tokens *t, uint64_t i);
/* Whether token i begins a document after another one (i > 0 and a
 * document ended at i). 0 without document ends. */
ZN_API int zn_tokens_doc_start(const zn_tokens *t, uint64_t i);
/* Documents recorded (0: none, version 1). */
ZN_API uint64_t zn_tokens_num_docs(const zn_tokens *t);
/* Whether the data carries a loss mask. */
ZN_API int zn_tokens_has_mask(const zn_tokens *t);

/* Writes ids[0..n) as a token file with the given width (2 or 4) and vocab
 * (0 = not recorded). Atomic (a private temporary, fsync, rename). Returns 0; ZN_EARG
 * for a bad width or an id that does not fit the width or is >= vocab
 * (message gives its index); -errno. */
ZN_API int zn_tokens_write(const char *path, const uint32_t *ids, uint64_t n, int width,
                           uint32_t vocab);
/* Writes a version 2 file: mask (may be NULL: every token a target) holds
 * one byte per id, nonzero = target; doc_ends (may be NULL, ndocs 0) the
 * exclusive end of each document, increasing, the last == n. Returns 0;
 * ZN_EARG (bad width, an id that does not fit, bad document ends); -errno. */
ZN_API int zn_tokens_write2(const char *path, const uint32_t *ids, uint64_t n, int width,
                            uint32_t vocab, const uint8_t *mask, const uint64_t *doc_ends,
                            uint64_t ndocs);

/* ---- loader: fixed-length sequences, shuffled, sliced by rank ---------------
 * Packing (the default): the ids are cut into n = (count - 1) / seq_len
 * windows; window i holds ids [i*seq_len, i*seq_len + seq_len] (seq_len + 1
 * ids: inputs are the first seq_len, targets the last seq_len). The
 * documents in a window are packed: their positions restart at 0 at each
 * document start (and at the window's start), and the model attends only
 * within a document (zn_model_set_batch's pos).
 * Padding (packing = 0): every window is one document, or a seq_len piece
 * of a longer one (each piece starts again at position 0, without the
 * earlier piece's context); the rest of the window is padding, ignored as a
 * target. A file without document ends is one document. Each epoch visits the windows in
 * a permutation drawn from (seed, epoch) (or in order, shuffle = 0). Step s
 * of an epoch takes global batch positions [s*G, (s+1)*G), G = world*batch;
 * rank r gets positions [s*G + r*batch, s*G + (r+1)*batch). Windows left
 * over at the end of an epoch (n mod G) are skipped in that epoch. Steps
 * past the end of an epoch continue into the next one (a new permutation). */
typedef struct {
    int64_t seq_len;  /* tokens per sequence (default 256) */
    int64_t batch;    /* sequences per rank per step (default 4) */
    int rank, world;  /* data-parallel position (default 0 of 1) */
    uint64_t seed;    /* shuffle seed (default 1234) */
    int shuffle;      /* 1 (default): permute each epoch; 0: file order */
    int64_t vocab;    /* ids must be < vocab (the model's); 0 = no check */
    int packing;      /* 1 (default): pack documents; 0: one per window, padded */
    int partial;      /* 1: the last global batch of an epoch is filled up with
                         windows of no target instead of skipped, so fewer
                         windows than one batch still make one (evaluation,
                         as the HF Trainer evaluates a partial batch) */
} zn_loader_config;

ZN_API zn_loader_config zn_loader_config_default(void);

typedef struct zn_loader zn_loader;

/* The loader reads `t`, which must outlive it. Returns 0; ZN_EARG for bad
 * sizes or a rank outside the world; ZN_ECONFIG when the data holds fewer
 * windows than one global batch (the message gives both numbers) or the
 * file's recorded vocab exceeds cfg->vocab; -ENOMEM. */
ZN_API int zn_loader_create(zn_loader **out, const zn_tokens *t, const zn_loader_config *cfg);
ZN_API void zn_loader_destroy(zn_loader *l); /* accepts NULL */

ZN_API uint64_t zn_loader_num_windows(const zn_loader *l);
ZN_API uint64_t zn_loader_steps_per_epoch(const zn_loader *l);

/* Fills inputs, targets and pos (each batch x seq_len int32, row-major)
 * for this rank at global step `step`; pos (may be NULL, then documents
 * packed in a window would attend to each other) is each input's position
 * in its document, for zn_model_set_batch / zn_train_step. A target is -1
 * (ignored, like HF's -100) where the data's loss mask says the token is
 * not a target, where the token begins a document (the first token of a
 * document is not predicted from the previous document's), and in padding.
 * Not thread-safe (caches the epoch's permutation). Returns 0; ZN_ECORRUPT
 * when an id is >= cfg->vocab (the message names the data and the token's
 * index); -ENOMEM. */
ZN_API int zn_loader_get(zn_loader *l, uint64_t step, int32_t *inputs, int32_t *targets,
                         int32_t *pos);

#ifdef __cplusplus
}
#endif
#endif
