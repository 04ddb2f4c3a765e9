/* Private side of the checkpoints: the parsed manifest shared by the loader
 * (ckpt.c) and the exporter (ckpt_export.c), and the small file helpers
 * both use (fsync, mkdir -p and the durable replace: util/fs-impl.h). */
#ifndef ZN_CKPT_IMPL_H
#define ZN_CKPT_IMPL_H

#include <jansson.h>
#include <stdint.h>

#include "zinc/ckpt.h"
#include "zinc/optim.h"
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

typedef struct {
    char *name;         /* relative to the checkpoint folder */
    uint64_t bytes;
    uint32_t crc;
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

#endif
