/* `zinc export`: a checkpoint's fp32 master weights as a Hugging Face folder
 * (config.json, model-0000K-of-0000N.safetensors, the index), or, for a LoRA
 * run, its adapters as a PEFT adapter folder (adapter_config.json,
 * adapter_model.safetensors with PEFT's "base_model.model." names). Each tensor is
 * read from every rank's part of its block in element order, in bounded
 * chunks, and each rank's master.bin is checked against its crc32c as it
 * is read (the reads of one rank's file are front to back). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "offload/ckpt-impl.h"
#include "zinc/safetensors.h"

#define CHUNK_ELEMS (4u << 20) /* 16 MiB of fp32 */

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[2];
    uint64_t numel, block_off; /* element offset inside its block */
    int block;
    int file;
} ex_tensor;

typedef struct {
    int fd;
    char path[ZN_CKPT_PATH + 64];
    const zn_ckpt_file *f;
    uint64_t next;   /* next byte expected, for the running crc */
    uint32_t crc;
} ex_rank;

/* Copies elements [pos, pos + n) of block b into dst, from the ranks'
 * parts. */
static int read_block_range(const zn_ckpt *ck, ex_rank *rk, int b, uint64_t pos, uint64_t n,
                            float *dst)
{
    while (n) {
        int r = 0;
        const zn_ckpt_share *s = NULL;
        for (r = 0; r < ck->world; r++) {
            s = &ck->ranks[r].sh[b];
            if (s->len && pos >= s->shard_off && pos < s->shard_off + s->len)
                break;
        }
        if (r == ck->world)
            return zn_set_error(ZN_ECORRUPT, "checkpoint %s: no rank holds element %" PRIu64
                                " of block %d", ck->path, pos, b);
        uint64_t take = s->shard_off + s->len - pos;
        if (take > n)
            take = n;
        uint64_t off = (s->local_off + (pos - s->shard_off)) * 4;
        int rc = zn_ckpt__pread(rk[r].fd, rk[r].path, off, dst, take * 4);
        if (rc)
            return rc;
        if (off == rk[r].next) {
            rk[r].crc = zn_crc32c(rk[r].crc, dst, take * 4);
            rk[r].next += take * 4;
        } else {
            rk[r].next = UINT64_MAX; /* out of order: crc not checkable (never expected) */
        }
        dst += take;
        pos += take;
        n -= take;
    }
    return 0;
}

int zn_ckpt_export(const char *path, const char *out_dir, zn_dtype dtype, uint64_t shard_bytes)
{
    if (dtype != ZN_DTYPE_F32 && dtype != ZN_DTYPE_BF16)
        return zn_set_error(ZN_EARG, "export: dtype must be fp32 or bf16");
    if (!shard_bytes)
        shard_bytes = 2ull << 30;
    zn_ckpt *ck;
    int rc = zn_ckpt_open(&ck, path);
    if (rc)
        return rc;
    ex_rank *rk = calloc((size_t)ck->world, sizeof *rk);
    ex_tensor *ts = NULL;
    float *buf = NULL;
    char **names = NULL, **files = NULL;
    int nt = 0, nfiles = 0;
    for (int r = 0; rk && r < ck->world; r++)
        rk[r].fd = -1;
    if (!rk) {
        rc = zn_set_error(-ENOMEM, "export: out of memory");
        goto out;
    }
    zn_model_dims d;
    if ((rc = zn_ckpt_dims(ck, &d)))
        goto out;
    if (zn_model_num_blocks(&d) != ck->nblocks) {
        rc = zn_set_error(ZN_ECORRUPT, "checkpoint %s: %d blocks, its config.json describes %d",
                          ck->path, ck->nblocks, zn_model_num_blocks(&d));
        goto out;
    }
    /* LoRA: the checkpoint holds the adapters (each block's trainable
     * tail), written as a PEFT adapter folder */
    bool lora = d.lora.r > 0;
    int cap = 0;
    for (int b = 0; b < ck->nblocks; b++) {
        uint64_t want = zn_model_block_param_count(&d, b) - zn_model_block_frozen_count(&d, b);
        if (want != ck->blocks[b]) {
            rc = zn_set_error(ZN_ECORRUPT, "checkpoint %s: block %d holds %" PRIu64 " parameters"
                              ", its config.json%s says %" PRIu64, ck->path, b, ck->blocks[b],
                              lora ? " and adapter_config.json" : "", want);
            goto out;
        }
        cap += zn_model_block_nparams(&d, b);
    }
    ts = calloc((size_t)cap, sizeof *ts);
    names = calloc((size_t)cap, sizeof *names);
    files = calloc((size_t)cap, sizeof *files);
    buf = malloc((size_t)CHUNK_ELEMS * 4);
    if (!ts || !names || !files || !buf) {
        rc = zn_set_error(-ENOMEM, "export: out of memory");
        goto out;
    }
    /* the tensors, in block order, and their files */
    uint64_t esz = zn_dtype_size(dtype), in_file = 0, total_bytes = 0;
    for (int b = 0; b < ck->nblocks; b++) {
        uint64_t off = 0;
        for (int i = 0; i < zn_model_block_nparams(&d, b); i++) {
            zn_param_info pi;
            if ((rc = zn_model_block_param(&d, b, i, &pi)))
                goto out;
            uint64_t numel = (uint64_t)pi.numel;
            if (pi.owner_block >= 0)
                continue; /* tied: stored once, with its owner */
            if (lora && !pi.lora)
                continue; /* the frozen base is not in the checkpoint */
            ex_tensor *t = &ts[nt++];
            if (lora)
                snprintf(t->name, sizeof t->name, "base_model.model.%s", pi.name);
            else
                snprintf(t->name, sizeof t->name, "%s", pi.name);
            t->ndim = pi.ndim;
            t->shape[0] = pi.shape[0];
            t->shape[1] = pi.shape[1];
            t->numel = numel;
            t->block = b;
            t->block_off = off;
            off += numel;
            uint64_t bytes = numel * esz;
            if (in_file && in_file + bytes > shard_bytes && !lora) {
                nfiles++;
                in_file = 0;
            }
            t->file = nfiles;
            in_file += bytes;
            total_bytes += bytes;
        }
    }
    nfiles++;
    for (int r = 0; r < ck->world; r++) {
        char rel[64];
        snprintf(rel, sizeof rel, "rank-%d/master.bin", r);
        rk[r].f = zn_ckpt__file(ck, rel);
        snprintf(rk[r].path, sizeof rk[r].path, "%s/%s", ck->path, rel);
        if ((rk[r].fd = open(rk[r].path, O_RDONLY | O_CLOEXEC)) < 0) {
            rc = zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s: %s", ck->path, rel,
                              strerror(errno));
            goto out;
        }
    }
    if ((rc = zn_ckpt__mkdir_p(out_dir)))
        goto out;
    char p[ZN_CKPT_PATH + 64];
    if (lora) {
        /* PEFT's layout: adapter_config.json + one adapter_model.safetensors */
        char base[ZN_CKPT_PATH] = "";
        json_t *c = ck->config_text ? json_loads(ck->config_text, 0, NULL) : NULL;
        const char *mp = json_string_value(json_object_get(json_object_get(c, "model"),
                                                           "path"));
        if (mp)
            snprintf(base, sizeof base, "%s", mp);
        json_decref(c);
        snprintf(p, sizeof p, "%s/adapter_config.json", out_dir);
        if ((rc = zn_lora_write_peft_config(&d.lora, p, base[0] ? base : NULL)))
            goto out;
    } else {
        snprintf(p, sizeof p, "%s/config.json", out_dir);
        if ((rc = zn_model_dims_write_hf_as(&d, p, dtype)))
            goto out;
    }
    int t0 = 0;
    for (int fi = 0; fi < nfiles && !rc; fi++) {
        char fname[64];
        if (lora)
            snprintf(fname, sizeof fname, "adapter_model.safetensors");
        else
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", fi + 1, nfiles);
        snprintf(p, sizeof p, "%s/%s", out_dir, fname);
        zn_st_writer *w;
        if ((rc = zn_st_writer_create(&w, p)))
            break;
        int t1 = t0;
        while (t1 < nt && ts[t1].file == fi)
            t1++;
        rc = zn_st_writer_set_metadata(w, "format", "pt");
        for (int i = t0; i < t1 && !rc; i++)
            rc = zn_st_writer_add(w, ts[i].name, zn_st_dtype_from(dtype), ts[i].ndim,
                                  ts[i].shape);
        for (int i = t0; i < t1 && !rc; i++) {
            ex_tensor *t = &ts[i];
            for (uint64_t first = 0; first < t->numel && !rc; first += CHUNK_ELEMS) {
                uint64_t n = t->numel - first < CHUNK_ELEMS ? t->numel - first : CHUNK_ELEMS;
                rc = read_block_range(ck, rk, t->block, t->block_off + first, n, buf);
                if (!rc)
                    rc = zn_st_writer_write(w, t->name, ZN_DTYPE_F32, buf, first, n);
            }
            if (!(names[i] = strdup(t->name)) || !(files[i] = strdup(fname)))
                rc = zn_set_error(-ENOMEM, "export: out of memory");
        }
        if (!rc)
            rc = zn_st_writer_finish(w);
        zn_st_writer_destroy(w);
        t0 = t1;
    }
    for (int r = 0; r < ck->world && !rc; r++) {
        if (rk[r].next != rk[r].f->bytes)
            rc = zn_set_error(ZN_EINTERNAL, "export: %s read out of order", rk[r].path);
        else if (rk[r].crc != rk[r].f->crc)
            rc = zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s: crc32c 0x%08x, the manifest "
                              "says 0x%08x (corrupted)", ck->path, rk[r].f->name, rk[r].crc,
                              rk[r].f->crc);
    }
    if (!rc && !lora) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", out_dir);
        rc = zn_st_write_index(p, (size_t)nt, (const char *const *)names,
                               (const char *const *)files, total_bytes);
    }
out:
    for (int r = 0; rk && r < ck->world; r++)
        if (rk[r].fd >= 0)
            close(rk[r].fd);
    for (int i = 0; names && i < nt; i++) {
        free(names[i]);
        free(files[i]);
    }
    free(names);
    free(files);
    free(ts);
    free(buf);
    free(rk);
    zn_ckpt_close(ck);
    return rc;
}
