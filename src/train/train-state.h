/* The trainer's state as checkpoints see it, whatever tier holds it: the
 * geometry of this rank's share (ZeRO), three byte streams in the rank's
 * local flat order (the fp32 master, Adam's m and v in the run's moment
 * format) and the scalars around them. ckpt/ includes this header only;
 * the placement cases (flat in RAM, on the device, per unit on NVMe) stay
 * in train/train_state.c. */
#ifndef ZN_TRAIN_STATE_H
#define ZN_TRAIN_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "zinc/nvme.h"
#include "zinc/optim.h"
#include "zinc/train.h"

/* ---- this rank's share of the state (ZeRO) --------------------------------------
 * Rank r owns elements [shard_off, shard_off + len) of block b's n
 * trainable parameters (the real elements of its zn_comm_shard range; len
 * may be 0). The rank's local flat space is those parts back to back in
 * block order (block b's part at local_off); master, m, v and the gradient
 * accumulators cover [0, local_params) of it. World size 1: shard_off 0,
 * len n, local_off = the block's offset. */
typedef struct {
    uint64_t n;          /* the block's trainable elements (whole model) */
    uint64_t shard_off;  /* first element this rank owns, within the block */
    uint64_t len;        /* elements this rank owns */
    uint64_t local_off;  /* where they start in the local flat space */
} zn_block_share;

void zn_train_block_share(const zn_trainer *tr, int b, zn_block_share *out);
/* The communicator (NULL: one rank), this rank and the world size. */
struct zn_comm *zn_train_comm(const zn_trainer *tr);
int zn_train_rank(const zn_trainer *tr);
int zn_train_world(const zn_trainer *tr);

/* ---- the state streams ------------------------------------------------------------*/
enum { ZN_TS_MASTER = 0, ZN_TS_M = 1, ZN_TS_V = 2, ZN_TS_COUNT = 3 };

typedef struct {
    zn_aio_config aio;         /* the run's NVMe engine settings (a save's engine too) */
    int nblocks;
    uint64_t total_params;     /* the model's, frozen parts included */
    uint64_t local_params;     /* this rank's local flat space */
    zn_mom_fmt moments;        /* how the m and v streams hold them */
    /* 8-bit moments: the blocks kept in fp32 (zn_moments.f32), whose
     * f32_slots x ZN_Q8_BLOCK floats follow the layout in the m and v
     * streams */
    const zn_q8_f32_run *f32_runs;
    size_t n_f32_runs;
    uint64_t f32_slots;
    zn_dtype param_dtype;      /* the working parameters' */
    zn_dtype master_dtype;     /* the master stream's: F32, or BF16 (train.master_weights
                                  bf16_sr) */
    uint64_t bytes[ZN_TS_COUNT];  /* each stream's length */
    /* The largest chunk the streams pass at once (0: any): the state goes
     * through a staging buffer when it is on the device or on NVMe. */
    uint64_t max_chunk;
    /* A checkpoint whose moments are in another format (or resharded)
     * loads: the state is flat in host memory (the cpu optimizer tier). */
    bool flat;
    /* Moments passed as fp32 load into the run's format, whatever it is
     * (flat, or per unit on NVMe): a checkpoint in another format, or
     * resharded, is read as fp32 (the device keeps fp32 moments only). */
    bool from_f32;
    int64_t step, steps_run;
    zn_loss_scaler scaler;
    bool failed;               /* an earlier failure: the state is not valid */
} zn_train_state_info;

void zn_train_state_get_info(const zn_trainer *tr, zn_train_state_info *out);

/* Receives the next `len` bytes of a stream; buf is valid during the call. */
typedef int (*zn_train_state_sink)(void *user, const void *buf, uint64_t len);
/* Passes stream k's bytes to sink in order, every chunk but the last
 * `chunk` bytes (chunk <= max_chunk when that is set). The staging memory
 * the chunks come from is registered with `aio` (may be NULL) meanwhile.
 * The trainer must be synced (zn_train_sync). */
int zn_train_state_save(zn_trainer *tr, int k, uint64_t chunk, zn_aio *aio,
                        zn_train_state_sink sink, void *user);

/* ---- a final save by reference ------------------------------------------------------
 * A rank whose optimizer state lives on the NVMe tier already has it on
 * disk, in the run's swap file. A save after which the trainer takes no
 * further step (the end of a run, a stop signal) links that file into the
 * checkpoint and describes each stream as pieces of it, instead of reading
 * it back and writing it again. */
typedef struct {
    int src;            /* 0: the swap file; 1: `tail`; -1: zeros */
    uint64_t off, len;  /* in the source */
} zn_ts_piece;

typedef struct {
    zn_ts_piece *pc;
    size_t npc;
    uint64_t bytes;     /* the stream's length: the pieces' sum */
    uint32_t crc;       /* the stream's crc32c */
    const void *tail;   /* memory the stream ends with (8-bit moments' fp32
                           blocks, never swapped), or NULL */
    uint64_t tail_len;
} zn_ts_ref;

/* The swap file holding this rank's whole optimizer state (NVMe tier, one
 * swap path), or NULL when a save must copy. */
const char *zn_train_state_swap_file(zn_trainer *tr);
/* The same file whatever the trainer's state (a final save has marked it
 * failed): which checkpoint folders refer to it. */
const char *zn_train_state_swap_path(zn_trainer *tr);
/* Whether every update writes the other of two copies of the NVMe
 * states (the speculative step's second copy): the last step's states
 * then stay whole while the next step runs. */
bool zn_train_state_two_copies(const zn_trainer *tr);
/* Stream k as pieces of that file, the same bytes zn_train_state_save
 * passes; its crc32c from the I/O engine's per-block crc32c of the last
 * writes (the bytes they do not cover read from the file). The trainer must
 * be synced. Free with zn_ts_ref_free. */
int zn_train_state_ref(zn_trainer *tr, int k, zn_ts_ref *out);
void zn_ts_ref_free(zn_ts_ref *r);

/* Fills dst with bytes [off, off + len) of stream k as saved. */
typedef int (*zn_train_state_source)(void *user, int k, uint64_t off, void *dst, uint64_t len);
/* Replaces the optimizer state from `src` and makes the working parameters
 * again from the master. The m and v streams are in format `from`: the
 * run's own format is asked for stream by stream (unit by unit on NVMe),
 * each stream in increasing offsets without gaps, so a caller may checksum
 * on the way; with one exception: 8-bit moments on NVMe ask for each
 * moment stream's tail (its absmax, from zn_mom_layout_absmax_at of the
 * local elements to the end) first, in order, then the rest from 0 in
 * order (each unit's extent holds its blocks' absmax beside its codes).
 * Another format is read out of order and converted (zn_mom_convert): any
 * format in the flat state, fp32 on NVMe (info.from_f32). The master
 * stream is stored as master_from (F32, or BF16 from a bf16_sr run): a
 * format other than the run's is converted (rounded to nearest, or
 * widened), into the flat state or NVMe units; not into the device. On
 * failure the
 * trainer is marked failed: its state is partly replaced. */
int zn_train_state_load(zn_trainer *tr, zn_mom_fmt from, zn_dtype master_from,
                        zn_train_state_source src, void *user);
/* Marks the state not valid (a load found the checkpoint damaged after
 * replacing it): saves and steps are refused from here on. */
void zn_train_state_fail(zn_trainer *tr);
/* The update in flight is abandoned at its next unit (the writes it
 * issued are waited for): its units are partly stepped, so the caller
 * marks the trainer failed (zn_train_state_fail) once a commit of the
 * step before, which stays whole with two copies
 * (zn_train_state_two_copies), is done reading it. */
void zn_train_state_drop_update(zn_trainer *tr);
/* ---- a save on another thread while the steps go on ---------------------------------
 * zn_train_state_hold, called between steps on the thread that steps,
 * holds the state at the last step: the optimizer jobs of later steps wait
 * to begin (their steps' forward and backward run meanwhile) until
 * zn_train_state_release. zn_train_state_wait_held, on any thread, returns
 * once the held step's own job has ended: master, m and v are then that
 * step's and stay so until the release (its return is the trainer's first
 * error, if a job failed). zn_train_state_background says whether
 * zn_train_state_save may run on another thread meanwhile: the state flat
 * in host memory, not on the device (whose copies would share the step's
 * streams) nor on NVMe (whose reads go through the optimizer's slot). */
int zn_train_state_hold(zn_trainer *tr);   /* -EBUSY: a save holds it already */
int zn_train_state_wait_held(zn_trainer *tr);
void zn_train_state_release(zn_trainer *tr);
bool zn_train_state_background(const zn_trainer *tr);

/* The step counters and the loss scaler a checkpoint carries. */
void zn_train_state_set_progress(zn_trainer *tr, int64_t step, int64_t steps_run,
                                 const zn_loss_scaler *scaler);

#endif
