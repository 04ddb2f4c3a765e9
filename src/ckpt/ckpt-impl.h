/* Private side of the checkpoints: the parsed manifest shared by the loader
 * (ckpt.c) and the exporter (ckpt_export.c), and the small file helpers
 * both use (fsync, mkdir -p and the durable replace: util/fs-impl.h). */
#ifndef ZN_CKPT_IMPL_H
#define ZN_CKPT_IMPL_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>

#include "zinc/ckpt.h"
#include "zinc/optim.h"
#include "train/train-state.h"
#include "util/fs-impl.h"

#define ZN_CKPT_PATH 4096

typedef struct {
    uint64_t shard_off, len, local_off;
} zn_ckpt_share;

typedef struct {
    uint64_t local_params;
    zn_ckpt_share *sh;  /* [nblocks] */
    /* 8-bit moments: the blocks kept in fp32 (zn_moments.f32) and the
     * slots their floats take after the layout in m.bin and v.bin */
    zn_q8_f32_run *f32;
    size_t n_f32;
    uint64_t f32_slots;
} zn_ckpt_rank;

/* A piece of a state file kept by reference: `len` bytes of the entry's
 * reference file `src` from `off` (src -1: zeros); `at` is where it starts
 * in the file's bytes. */
typedef struct {
    int src;
    uint64_t off, len, at;
} zn_ckpt_piece;

#define ZN_CKPT_MAX_REFS 2

typedef struct {
    char *name;         /* relative to the checkpoint folder */
    uint64_t bytes;
    uint32_t crc;
    /* by reference (a final save of a rank whose optimizer state is on
     * the NVMe tier: the run's swap file linked into the rank's folder):
     * the bytes are these pieces of these files, relative to the checkpoint
     * folder; nref 0: the file itself */
    char *ref[ZN_CKPT_MAX_REFS];
    int nref;
    zn_ckpt_piece *pc;
    size_t npc;
} zn_ckpt_file;

struct zn_ckpt {
    char path[ZN_CKPT_PATH];
    json_t *man;
    int64_t step, steps_run;
    int world;
    int nblocks;
    uint64_t *blocks;
    uint64_t total;
    zn_ckpt_rank *ranks;
    zn_ckpt_file *files;
    int nfiles;
    const char *config_text;  /* in man, or NULL */
    const char *client_json;  /* in man */
    int has_dims;
    zn_model_dims dims;
    zn_mom_fmt moments;       /* how m.bin and v.bin hold them ("moments") */
    zn_dtype master;          /* how master.bin holds it ("master": fp32, or bf16
                                 from train.master_weights bf16_sr) */
};

/* The file entry of `name` ("rank-0/master.bin"), or NULL. */
const zn_ckpt_file *zn_ckpt__file(const zn_ckpt *ck, const char *name);
/* Reads [off, off + len) of an open file; a short read is ZN_ECORRUPT
 * naming `path` (truncated). */
int zn_ckpt__pread(int fd, const char *path, uint64_t off, void *buf, size_t len);

/* A checkpoint file open for reading, itself or through its references. */
typedef struct {
    const zn_ckpt_file *f;
    char path[ZN_CKPT_PATH + 512];  /* the file's, for messages */
    char rpath[ZN_CKPT_MAX_REFS][ZN_CKPT_PATH + 512];
    int fd[ZN_CKPT_MAX_REFS];       /* fd[0]: the file itself when f->nref is 0 */
    int nfd;                        /* open in fd[] */
} zn_ckpt_rd;
/* Opens file entry f of ck (posix_fadvise `advice` on what it reads);
 * a missing file is ZN_ECORRUPT naming it. */
int zn_ckpt__rd_open(zn_ckpt_rd *r, const zn_ckpt *ck, const zn_ckpt_file *f, int advice);
/* Bytes [off, off + len) of the file, as zn_ckpt__pread. */
int zn_ckpt__rd_read(zn_ckpt_rd *r, uint64_t off, void *buf, size_t len);
/* Accepts a zeroed, failed or closed one. */
void zn_ckpt__rd_close(zn_ckpt_rd *r);

/* The three optimizer-state files of a rank and their manifest names
 * (ckpt.c). */
extern const char *const zn_ckpt__state_file[3];
extern const char *const zn_ckpt__state_prefix[3];

/* ckpt_fs.c and ckpt.c, for the other checkpoint files */
int zn_ckpt__write_small(const char *path, const char *data, size_t len);
int zn_ckpt__file_crc(const char *path, uint64_t *bytes, uint32_t *crc);
void zn_ckpt__rm_rf(const char *path);
void zn_ckpt__point(const zn_ckpt_save_options *o, const char *where);
int zn_ckpt__step_of(const char *name, long long *step);

/* ---- a save in parts (ckpt.c), for zn_ckpt_save and the background save
 * (ckpt_bg.c) ------------------------------------------------------------*/
typedef struct {
    char name[64];                 /* step-NNNNNNNN */
    char final[ZN_CKPT_PATH];      /* DIR/step-NNNNNNNN */
    char tmp[ZN_CKPT_PATH];        /* the temporary folder ("" once removed) */
    zn_train_state_info in;        /* the state as the save began */
    uint64_t t0;
} zn_ckpt__job;

/* A background save's pacing: after each chunk written, sleeps what the
 * chunk is ahead of `bytes` over `seconds` (0: no pacing) and answers
 * -ECANCELED once `quit` is set. */
typedef struct {
    uint64_t bytes;
    _Atomic uint64_t done;
    double seconds;
    uint64_t t0;
    _Atomic int quit;
    _Atomic int hurry;   /* no more pacing */
    double slept_s;      /* the pacing's sleeps (the writer's thread only) */
} zn_ckpt__pace;
int zn_ckpt__pace_after(zn_ckpt__pace *p, uint64_t len);

/* Every rank, between steps (collective): j filled, the temporary folder
 * made (rank 0) and its name shared; rc: an earlier failure to agree on. */
int zn_ckpt__prepare(zn_trainer *tr, const zn_ckpt_save_options *o, zn_ckpt__job *j, int rc);
/* This rank's files (any thread; pace may be NULL). live_ref: a step's
 * commit, its NVMe state by reference to the live swap file. */
int zn_ckpt__save_rank(zn_trainer *tr, const zn_ckpt_save_options *o, const char *tmp,
                       const zn_train_state_info *in, zn_ckpt__pace *pace, bool live_ref);
/* Rank 0: the manifest, the rename, `latest`, the pruning (the folders
 * of this run's earlier commits included; live: this is a commit, which
 * keep_last does not count). */
int zn_ckpt__finish(zn_trainer *tr, const zn_ckpt_save_options *o, const char *tmp,
                    const char *final, const char *name, const zn_train_state_info *in,
                    bool live);
/* Removes the step folders before `keep` (step-NNNNNNNN) whose
 * rank-R/state.swp is this rank's live swap file. */
int zn_ckpt__prune_own(zn_trainer *tr, const char *dir, const char *keep);
/* Punches out of rank `rank`'s state.swp in checkpoint `path` every range
 * its files do not refer to (nothing may write that file any more). */
int zn_ckpt__punch_rank(const char *path, int rank);
/* Every rank (collective): agree on wrc, rank 0 completes the checkpoint
 * (live: a commit by reference, zn_ckpt__finish's); on failure the
 * temporary folder goes. */
int zn_ckpt__commit(zn_trainer *tr, const zn_ckpt_save_options *o, zn_ckpt__job *j, int wrc,
                    bool live, char *out_path, size_t out_len);
/* Rank 0 removes the temporary folder (the message of rc kept). */
void zn_ckpt__abandon(zn_trainer *tr, zn_ckpt__job *j, int rc);

#endif
