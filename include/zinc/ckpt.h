/* zinc checkpoints: the whole training state of a trainer (fp32 master
 * weights, Adam m and v, optimizer step, loss scaler; the caller adds its
 * own state such as the data-loader position) saved crash-safely, verified
 * by crc32c, loaded back into a trainer with any placement, and exported
 * as a Hugging Face folder. docs/checkpoints.md describes the layout.
 *
 * Layout of a checkpoint root DIR:
 *   DIR/step-00000010/manifest.json     written last: format, step, world
 *                                       size, block geometry, every file's
 *                                       size and crc32c, model, config
 *   DIR/step-00000010/config.json       the model (HF config), when known
 *   DIR/step-00000010/rank-K/{master,m,v}.bin
 *                                       rank K's local flat fp32 space
 *   DIR/step-00000010/rank-K/rank.json  rank K's geometry and file list
 *   DIR/latest                          "step-00000010\n": the newest
 *                                       complete checkpoint
 * A save writes DIR/.step-NNNNNNNN.tmp-PID/, fsyncs every file, writes the
 * manifest, renames the folder into place, fsyncs DIR, then replaces
 * `latest` (tmp + fsync + rename + fsync) and prunes to keep_last. A crash
 * at any moment leaves `latest` naming a complete checkpoint (or absent). */
#ifndef ZINC_CKPT_H
#define ZINC_CKPT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinc/model.h"
#include "zinc/nvme.h"
#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZN_CKPT_FORMAT "zinc-checkpoint"
#define ZN_CKPT_VERSION 1

typedef struct zn_trainer zn_trainer; /* include/zinc/train.h */

/* Test hook: called at named points of a save ("begin", "tmpdir",
 * "rank-dir", "data", "fsync", "rank", "manifest", "rename", "latest",
 * "prune"), e.g. to kill the process there. */
typedef void (*zn_ckpt_point_fn)(void *user, const char *point);

typedef struct {
    const char *dir;            /* the checkpoint root (created when missing) */
    int keep_last;              /* complete checkpoints kept after a save; 0 = all */
    const zn_model_dims *dims;  /* the decoder's shape, recorded as config.json
                                   (needed by export); NULL: not recorded */
    const char *config_text;    /* the training config it was made with, recorded
                                   as a string; NULL: none */
    const char *client_json;    /* the caller's state as a JSON object (e.g.
                                   {"data_step": 10, "data_seed": 1}); NULL: {} */
    size_t chunk_bytes;         /* largest write of in-memory state (default
                                   64 MiB); states on NVMe move one optimizer
                                   unit at a time through the trainer's own
                                   staging slot, so a save allocates no state-
                                   sized buffer */
    zn_aio_fault_fn fault_hook; /* passed to the save's I/O engine (tests) */
    void *fault_user;
    zn_ckpt_point_fn point;     /* tests */
    void *point_user;
    /* The trainer takes no further step (the end of a run, a stop): a rank
     * whose optimizer state lives on the NVMe tier (one swap path, on the
     * checkpoint's file system) links its swap file into the checkpoint
     * instead of reading the state back and writing it again; its files
     * then refer to pieces of that file (zn_ckpt_verify, load and export
     * read through them) and the file's other ranges are punched out. The
     * trainer cannot step after it, whether the save succeeds or not.
     * Where the link cannot be made the state is copied as usual. */
    bool final_save;
    /* A save at once (zn_ckpt_save) that finds *cancel set between two of
     * its writes stops with -ECANCELED, its temporary folder removed, the
     * trainer untouched: a stop signal, when the final save that follows
     * keeps the state in place and costs seconds. With ranks, one rank's
     * cancel drops the save on all of them: each returns -ECANCELED once the
     * others have reached the end of their part. NULL: none. */
    const volatile sig_atomic_t *cancel;
} zn_ckpt_save_options;

ZN_API zn_ckpt_save_options zn_ckpt_save_options_default(void);

/* Saves the trainer's state as DIR/step-NNNNNNNN (NNNNNNNN = optimizer
 * steps taken). Call between steps. Every rank of a sharded trainer calls
 * it with the same options (DIR on a file system all ranks see); it
 * returns the same status on every rank. On failure nothing under DIR that
 * existed before is changed and the temporary folder is removed; the
 * trainer is untouched and can keep training. `out_path` (may be NULL)
 * receives the checkpoint's folder. Returns 0; -ENOSPC, -EIO or another
 * -errno naming the file; ZN_ECORRUPT (the trainer failed earlier: its
 * state is not saved); ZN_EARG. */
ZN_API int zn_ckpt_save(zn_trainer *tr, const zn_ckpt_save_options *o, char *out_path,
                        size_t out_len);
/* Whether a final save (final_save) of this rank into `dir` (or the folder
 * it would be made in) keeps the optimizer state where it is on NVMe: the
 * state all on the NVMe tier, one swap path, on dir's file system. */
ZN_API bool zn_ckpt_save_keeps_nvme(zn_trainer *tr, const char *dir);

/* ---- a save written while the training goes on --------------------------------
 * zn_ckpt_save_start (between steps, every rank, like zn_ckpt_save) begins
 * the save of the state the last step left: the temporary folder is made
 * now, and this rank's files are written by a thread of its own while the
 * next steps run; their optimizer updates wait to begin until the files
 * are written (their forward and backward do not), so the state saved is
 * exactly that step's. pace_s > 0 spreads the writes over about that many
 * seconds (the step's time, so that the disk is shared with the step's
 * own traffic); 0 writes as fast as the disk takes them. The options and
 * their strings are copied. zn_ckpt_save_written says whether the files
 * are written; zn_ckpt_save_end (between steps, every rank) waits for them
 * and completes the checkpoint as zn_ckpt_save does (same results and
 * guarantees: until then `latest` names the previous one); st (may be
 * NULL) gets the bytes, the writer's time and the time end waited.
 * zn_ckpt_save_drop abandons it (its writes stop, the temporary folder
 * goes, no rank completes it; a commit of several ranks also drops the
 * next update and fails the trainer, whose other copy the commit before
 * refers to). end and drop free `bg`; one of them must be
 * called before the trainer is destroyed. One at a time: a start while
 * another is in progress is refused (-EBUSY). Only where
 * zn_ckpt_save_background(tr): the optimizer state flat in host memory
 * (the cpu tier); on the device or on NVMe, zn_ckpt_save. */
typedef struct zn_ckpt_bg zn_ckpt_bg;
typedef struct {
    uint64_t bytes;    /* this rank's state files */
    double write_s;    /* from the start until they were written */
    double busy_s;     /* of it, writing: without the wait for the step's own update
                          and the pacing's sleeps (bytes / busy_s: the disk's rate) */
    double wait_s;     /* what zn_ckpt_save_end waited for them */
} zn_ckpt_bg_stats;
ZN_API bool zn_ckpt_save_background(const zn_trainer *tr);
ZN_API int zn_ckpt_save_start(zn_trainer *tr, const zn_ckpt_save_options *o, double pace_s,
                              zn_ckpt_bg **out);
ZN_API bool zn_ckpt_save_written(zn_ckpt_bg *bg);
ZN_API int64_t zn_ckpt_save_step(const zn_ckpt_bg *bg);   /* the step it saves */
ZN_API int zn_ckpt_save_end(zn_ckpt_bg *bg, char *out_path, size_t out_len,
                            zn_ckpt_bg_stats *st);
ZN_API void zn_ckpt_save_drop(zn_ckpt_bg *bg);
/* Its remaining writes unpaced (a stop is waiting for them). */
ZN_API void zn_ckpt_save_hurry(zn_ckpt_bg *bg);
/* This rank's state bytes not yet written (0 once written). */
ZN_API uint64_t zn_ckpt_save_left(zn_ckpt_bg *bg);

/* ---- every step committed by reference -------------------------------------------
 * With the optimizer state on the NVMe tier in two copies (each update
 * writes the copy the last step did not, train.speculative_step's second
 * copy), the last step's states are whole on disk while the next step
 * runs: zn_ckpt_commit_start (between steps) makes them the newest
 * checkpoint without copying them. A thread waits for the step's update to
 * land, links the swap file into the checkpoint (its files refer to pieces
 * of it, as a final save's do, nothing punched), completes it (manifest,
 * rename, `latest`) and removes this run's earlier commits, whose copy the
 * next update overwrites; that update waits to begin until then (the
 * forward and backward do not). A kill at any moment then leaves `latest`
 * naming the last committed step, whole. zn_ckpt_save_end (or _drop) ends
 * it as for a background save; a failure has removed this run's commits.
 * With several ranks each rank's thread links its own part and the commit
 * is completed by zn_ckpt_save_end between steps, on every rank (the ranks
 * agree, rank 0 writes the manifest and `latest`, they agree again); the
 * next update waits for that. zn_ckpt_commit_possible: this rank's state on
 * NVMe in two copies, one swap path, on dir's file system;
 * zn_ckpt_commit_agree: on every rank (collective). */
ZN_API bool zn_ckpt_commit_possible(zn_trainer *tr, const char *dir);
ZN_API bool zn_ckpt_commit_agree(zn_trainer *tr, const char *dir);
ZN_API int zn_ckpt_commit_start(zn_trainer *tr, const zn_ckpt_save_options *o,
                                zn_ckpt_bg **out);
/* The run takes no further step and the commit PATH (the newest
 * complete one) is its final checkpoint: with drop_update the update in
 * flight is abandoned at its next unit (it writes the other copy; the step
 * it had is lost), and the trainer is marked failed either way. *pending
 * (may be NULL), a commit begun and not ended, is ended too: it is dropped
 * with the update it waits for, unless it completed first, and then it is
 * the one kept. PATH may be NULL (no commit of this run complete: a
 * resumed run's stop falls back on the checkpoint it resumed from); out
 * then gets "" unless the pending one completed. The kept one's folder goes
 * to out; the ranges of the swap file it does not refer to are punched
 * out, as a final save's are.
 * Returns 0, or the punch's failure (the checkpoint stays whole). */
ZN_API int zn_ckpt_commit_seal(zn_trainer *tr, const char *path, bool drop_update,
                               zn_ckpt_bg **pending, char *out, size_t out_len);
/* Punches out of every rank's state.swp in checkpoint PATH the ranges
 * its files do not refer to (a commit's swap file once no run writes it).
 * Returns 0 or -errno / ZN_ECORRUPT. */
ZN_API int zn_ckpt_punch(const char *path);
/* zn_ckpt_punch for the ranks whose state.swp has no other name (no run's
 * swap file: a killed run's commit once its swap folder was reclaimed).
 * Safe beside readers: what the checkpoint holds does not change. */
ZN_API int zn_ckpt_punch_unlinked(const char *path);

/* Resolves PATH to a checkpoint folder: a folder holding manifest.json is
 * itself; a root holding `latest` resolves to the folder it names. Returns
 * 0 or -ENOENT / ZN_ECORRUPT with a message. */
ZN_API int zn_ckpt_resolve(const char *path, char *out, size_t out_len);

/* ---- reading ---------------------------------------------------------------*/
typedef struct zn_ckpt zn_ckpt;

/* Opens a checkpoint (PATH as for zn_ckpt_resolve) and checks its
 * manifest: format and version, every listed file present with its size
 * (not yet its crc32c: zn_ckpt_verify reads everything, zn_ckpt_load checks
 * each file as it reads it). Returns 0; ZN_ECORRUPT naming the file (bad
 * manifest, missing or truncated file); -errno. */
ZN_API int zn_ckpt_open(zn_ckpt **out, const char *path);
ZN_API void zn_ckpt_close(zn_ckpt *ck); /* accepts NULL */

ZN_API const char *zn_ckpt_path(const zn_ckpt *ck);
ZN_API int64_t zn_ckpt_step(const zn_ckpt *ck);      /* optimizer steps taken */
ZN_API int64_t zn_ckpt_steps_run(const zn_ckpt *ck); /* steps run (incl. skipped) */
ZN_API int zn_ckpt_world(const zn_ckpt *ck);
ZN_API uint64_t zn_ckpt_num_params(const zn_ckpt *ck);
/* The recorded config text, or NULL. */
ZN_API const char *zn_ckpt_config_text(const zn_ckpt *ck);
/* The caller's JSON object as saved (text, never NULL). */
ZN_API const char *zn_ckpt_client_json(const zn_ckpt *ck);
/* The recorded model shape. Returns 0, or -ENOENT when none was recorded. */
ZN_API int zn_ckpt_dims(const zn_ckpt *ck, zn_model_dims *out);
/* 0 when `d` is the recorded model; ZN_ECONFIG naming the first differing
 * field otherwise (or when none was recorded). */
ZN_API int zn_ckpt_check_dims(const zn_ckpt *ck, const zn_model_dims *d);

/* Reads every file of every rank and compares sizes and crc32c with the
 * manifest. Returns 0, or ZN_ECORRUPT naming the first bad file, or -errno. */
ZN_API int zn_ckpt_verify(const char *path);

/* For --resume: opens the checkpoint PATH names after verifying it. When
 * PATH is a checkpoint root (a folder with `latest`) and its latest is
 * damaged or missing, the newest step folder under it that verifies is
 * opened instead, and `note` (may be NULL) says what was wrong with the
 * newer ones and which steps the fallback loses; a step folder named
 * directly is not replaced. Returns 0; ZN_ECORRUPT (or -errno) naming the
 * damaged file when nothing verifies. */
ZN_API int zn_ckpt_open_good(zn_ckpt **out, const char *path, char *note, size_t note_len);

/* Loads this rank's master, m and v into the trainer's current homes
 * (whatever its placement: device, pinned CPU or NVMe), regenerates the
 * working parameters from the master, and restores the step count and the
 * loss scaler. The trainer must have the same world size and the same
 * model (block sizes and rank geometry), else ZN_ECONFIG with both sides
 * named and nothing changed. A file whose crc32c does not match is
 * ZN_ECORRUPT naming it; by then the trainer's state was partly replaced,
 * so it is marked failed (zn_train_step returns ZN_ECORRUPT). Uses the
 * trainer's staging buffers only. Call before the first step or between
 * steps. */
ZN_API int zn_ckpt_load(zn_ckpt *ck, zn_trainer *tr);

/* Writes an HF folder OUT_DIR (created when missing): config.json from the
 * recorded model, model-0000K-of-0000N.safetensors files of at most
 * shard_bytes each (0 = 2 GiB), model.safetensors.index.json. Tensors
 * carry HF names and shapes; values are the fp32 master rounded to `dtype`
 * (F32 or BF16); a sharded checkpoint's blocks are reassembled from every
 * rank's part. Verifies every crc32c on the way. A LoRA checkpoint (its
 * adapter_config.json) is written as a PEFT adapter folder instead:
 * adapter_config.json (base_model_name_or_path = the run's model.path) and
 * adapter_model.safetensors, tensors named "base_model.model.<name>" as
 * peft.PeftModel.from_pretrained loads them. Returns 0; -ENOENT (no model
 * recorded); ZN_ECORRUPT; -errno. */
ZN_API int zn_ckpt_export(const char *path, const char *out_dir, zn_dtype dtype,
                          uint64_t shard_bytes);
/* The weights of a checkpoint, in place: fn(ctx, block, tensor index,
 * first element, values, count) for every tensor it holds, in pieces of
 * fp32 master values, in zn_model_block_param order (a LoRA checkpoint:
 * the adapters only; a tied lm_head once, with the embedding). Every
 * rank's crc32c is checked once the last piece is read (a mismatch is
 * ZN_ECORRUPT after fn saw the values: a caller keeps nothing on error).
 * Returns 0, fn's error, ZN_ECORRUPT, -ENOENT (no model recorded), -errno. */
typedef int (*zn_ckpt_weights_fn)(void *ctx, int block, int i, uint64_t first,
                                  const float *v, uint64_t n);
ZN_API int zn_ckpt_read_weights(const char *path, zn_ckpt_weights_fn fn, void *ctx);
/* The model.path (the HF folder) the run recorded: 0, or -ENOENT. */
ZN_API int zn_ckpt_model_path(const zn_ckpt *ck, char *out, size_t n);

/* A LoRA checkpoint merged into its base: an HF folder like the base's
 * (its config.json, with torch_dtype changed only when force_dtype; its
 * tokenizer and generation files copied) whose weights are the base's with
 * W + scale B A folded into every target projection, computed in fp32 and
 * written in each base tensor's stored type (F16, BF16, else F32) or, with
 * force_dtype, in `dtype` (F32 or BF16). base_dir NULL: the model.path the
 * run recorded. Every tensor of the base is checked by name and size.
 * Returns 0; ZN_EARG (not a LoRA checkpoint, no base known);
 * ZN_ECONFIG (the base is another model); ZN_ECORRUPT; -errno. */
ZN_API int zn_ckpt_export_merged(const char *path, const char *out_dir, const char *base_dir,
                                 int force_dtype, zn_dtype dtype, uint64_t shard_bytes);

#ifdef __cplusplus
}
#endif
#endif
