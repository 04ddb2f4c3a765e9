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

#include <cblas.h>
#include <jansson.h>

#include "ckpt/ckpt-impl.h"
#include "zinc/safetensors.h"

#define CHUNK_ELEMS (4u << 20) /* 16 MiB of fp32 */

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[2];
    uint64_t numel;
    uint64_t flat;  /* its first element in the checkpoint's flat order (every
                       block's trainable elements, back to back) */
    int file;
} ex_tensor;

typedef struct {
    zn_ckpt_rd rd;
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
        /* master.bin holds fp32, or bf16 (train.master_weights bf16_sr):
         * read into dst's first half and widened from the top down (element
         * i's 4 bytes cover halves 2i and 2i + 1, already read) */
        uint64_t eb = zn_dtype_size(ck->master);
        uint64_t off = (s->local_off + (pos - s->shard_off)) * eb;
        int rc = zn_ckpt__rd_read(&rk[r].rd, off, dst, take * eb);
        if (rc)
            return rc;
        if (off == rk[r].next) {
            rk[r].crc = zn_crc32c(rk[r].crc, dst, take * eb);
            rk[r].next += take * eb;
        } else {
            rk[r].next = UINT64_MAX; /* out of order: crc not checkable (never expected) */
        }
        if (eb == 2)
            for (uint64_t i = take; i-- > 0;) {
                uint16_t h;   /* memcpy: the bytes alias, both ways */
                memcpy(&h, (char *)dst + 2 * i, 2);
                float f = zn_bf16_to_f32(h);
                memcpy((char *)dst + 4 * i, &f, 4);
            }
        dst += take;
        pos += take;
        n -= take;
    }
    return 0;
}

/* The same for elements [pos, pos + n) of the flat order, whichever blocks
 * (the model's blocks, or their parts) the checkpoint cut it into. */
static int read_flat_range(const zn_ckpt *ck, ex_rank *rk, uint64_t pos, uint64_t n, float *dst)
{
    uint64_t b0 = 0;
    for (int b = 0; b < ck->nblocks && n; b0 += ck->blocks[b], b++) {
        if (pos >= b0 + ck->blocks[b])
            continue;
        uint64_t take = b0 + ck->blocks[b] - pos < n ? b0 + ck->blocks[b] - pos : n;
        int rc = read_block_range(ck, rk, b, pos - b0, take, dst);
        if (rc)
            return rc;
        dst += take;
        pos += take;
        n -= take;
    }
    return n ? zn_set_error(ZN_ECORRUPT, "checkpoint %s: element %" PRIu64 " is past its "
                            "blocks", ck->path, pos) : 0;
}

/* Checks the checkpoint's blocks against the model its config.json
 * describes: cut as the trainer cuts them (zn_model_part), or whole blocks
 * (a checkpoint from before the vocabulary was split in parts). */
static int check_blocks(const zn_ckpt *ck, const zn_model_dims *d)
{
    int np = zn_model_num_parts(d), nb = zn_model_num_blocks(d);
    bool lora = d->lora.r > 0;
    if (ck->nblocks != np && ck->nblocks != nb)
        return zn_set_error(ZN_ECORRUPT, "checkpoint %s: %d blocks, its config.json describes "
                            "%d", ck->path, ck->nblocks, np);
    for (int b = 0; b < ck->nblocks; b++) {
        uint64_t want;
        if (ck->nblocks == np && np != nb) {
            zn_model_part_info pt;
            zn_model_part(d, b, &pt);
            want = pt.nparts > 1 ? (lora ? 0 : pt.n)
                                 : zn_model_block_param_count(d, pt.block) -
                                       zn_model_block_frozen_count(d, pt.block);
        } else {
            want = zn_model_block_param_count(d, b) - zn_model_block_frozen_count(d, b);
        }
        if (want != ck->blocks[b])
            return zn_set_error(ZN_ECORRUPT, "checkpoint %s: block %d holds %" PRIu64
                                " parameters, its config.json%s says %" PRIu64, ck->path, b,
                                ck->blocks[b], lora ? " and lora_config.json" : "", want);
    }
    return 0;
}

/* Opens every rank's master.bin for read_block_range. */
static int ranks_open(const zn_ckpt *ck, ex_rank *rk)
{
    for (int r = 0; r < ck->world; r++) {
        char rel[64];
        snprintf(rel, sizeof rel, "rank-%d/master.bin", r);
        if (!(rk[r].f = zn_ckpt__file(ck, rel)))
            return zn_set_error(ZN_ECORRUPT, "checkpoint %s: manifest.json does not list %s",
                                ck->path, rel);
        int rc = zn_ckpt__rd_open(&rk[r].rd, ck, rk[r].f, POSIX_FADV_NORMAL);
        if (rc)
            return rc;
    }
    return 0;
}

/* After every byte was read in order: each rank's crc32c against the manifest. */
static int ranks_check(const zn_ckpt *ck, const ex_rank *rk)
{
    for (int r = 0; r < ck->world; r++) {
        if (rk[r].next != rk[r].f->bytes)
            return zn_set_error(ZN_EINTERNAL, "export: %s read out of order", rk[r].rd.path);
        if (rk[r].crc != rk[r].f->crc)
            return zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s: crc32c 0x%08x, the "
                                "manifest says 0x%08x (corrupted)", ck->path, rk[r].f->name,
                                rk[r].crc, rk[r].f->crc);
    }
    return 0;
}

static void ranks_close(const zn_ckpt *ck, ex_rank *rk)
{
    for (int r = 0; rk && r < ck->world; r++)
        zn_ckpt__rd_close(&rk[r].rd);
    free(rk);
}

static void free_names(char **names, char **files, int n)
{
    for (int i = 0; names && i < n; i++) {
        free(names[i]);
        free(files[i]);
    }
    free(names);
    free(files);
}

static int keep_base_files(const zn_ckpt *ck, const zn_model_dims *d, const char *out_dir,
                           zn_dtype dtype);
static int recorded_base(const zn_ckpt *ck, char *out, size_t n);

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
    if (!rk) {
        rc = zn_set_error(-ENOMEM, "export: out of memory");
        goto out;
    }
    zn_model_dims d;
    if ((rc = zn_ckpt_dims(ck, &d)))
        goto out;
    if ((rc = check_blocks(ck, &d)))
        goto out;
    /* LoRA: the checkpoint holds the adapters (each block's trainable
     * tail), written as a PEFT adapter folder */
    bool lora = d.lora.r > 0;
    int cap = 0;
    for (int b = 0; b < zn_model_num_blocks(&d); b++)
        cap += zn_model_block_nparams(&d, b);
    ts = calloc((size_t)cap, sizeof *ts);
    names = calloc((size_t)cap, sizeof *names);
    files = calloc((size_t)cap, sizeof *files);
    buf = malloc((size_t)CHUNK_ELEMS * 4);
    if (!ts || !names || !files || !buf) {
        rc = zn_set_error(-ENOMEM, "export: out of memory");
        goto out;
    }
    /* the tensors, in block order, and their files */
    uint64_t esz = zn_dtype_size(dtype), in_file = 0, total_bytes = 0, off = 0;
    for (int b = 0; b < zn_model_num_blocks(&d); b++) {
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
            t->flat = off;
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
    if ((rc = ranks_open(ck, rk)) || (rc = zn_fs_mkdir_p(out_dir, 0755)))
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
        if ((rc = zn_model_dims_write_hf_as(&d, p, dtype)) ||
            (rc = keep_base_files(ck, &d, out_dir, dtype)))
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
                rc = read_flat_range(ck, rk, t->flat + first, n, buf);
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
    if (!rc)
        rc = ranks_check(ck, rk);
    if (!rc && !lora) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", out_dir);
        rc = zn_st_write_index(p, (size_t)nt, (const char *const *)names,
                               (const char *const *)files, total_bytes);
    }
out:
    ranks_close(ck, rk);
    free_names(names, files, nt);
    free(ts);
    free(buf);
    zn_ckpt_close(ck);
    return rc;
}

/* ---- reading the weights in place (zinc generate --checkpoint) ------------------- */

int zn_ckpt_read_weights(const char *path, zn_ckpt_weights_fn fn, void *ctx)
{
    zn_ckpt *ck;
    int rc = zn_ckpt_open(&ck, path);
    if (rc)
        return rc;
    ex_rank *rk = calloc((size_t)ck->world, sizeof *rk);
    float *buf = malloc((size_t)CHUNK_ELEMS * 4);
    zn_model_dims d;
    if (!rk || !buf)
        rc = zn_set_error(-ENOMEM, "out of memory");
    if (!rc)
        rc = zn_ckpt_dims(ck, &d);
    if (!rc)
        rc = check_blocks(ck, &d);
    if (!rc)
        rc = ranks_open(ck, rk);
    /* the flat order: every block's trainable tensors (a LoRA run's
     * adapters only), a tied lm_head once with its owner */
    uint64_t flat = 0;
    for (int b = 0; b < zn_model_num_blocks(&d) && !rc; b++)
        for (int i = 0; i < zn_model_block_nparams(&d, b) && !rc; i++) {
            zn_param_info pi;
            if ((rc = zn_model_block_param(&d, b, i, &pi)))
                break;
            if (pi.owner_block >= 0 || (d.lora.r > 0 && !pi.lora))
                continue;
            for (uint64_t first = 0; first < (uint64_t)pi.numel && !rc; first += CHUNK_ELEMS) {
                uint64_t n = (uint64_t)pi.numel - first < CHUNK_ELEMS
                                 ? (uint64_t)pi.numel - first : CHUNK_ELEMS;
                rc = read_flat_range(ck, rk, flat + first, n, buf);
                if (!rc)
                    rc = fn(ctx, b, i, first, buf, n);
            }
            flat += (uint64_t)pi.numel;
        }
    if (!rc)
        rc = ranks_check(ck, rk);
    if (rk)
        ranks_close(ck, rk);
    free(buf);
    zn_ckpt_close(ck);
    return rc;
}

int zn_ckpt_model_path(const zn_ckpt *ck, char *out, size_t n)
{
    return recorded_base(ck, out, n) ? 0 : -ENOENT;
}

/* ---- --merge: the base with the adapters folded in ---------------------------- */

/* Small files of an HF folder that a merged model keeps (config.json is
 * rewritten, the weights are new). */
static const char *const hf_side_files[] = {
    "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model",
    "added_tokens.json", "chat_template.jinja", "chat_template.json",
};

/* 1 when `from` does not exist; else 0 or -errno. `to` is replaced
 * durably, whole or not at all. */
static int copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb");
    if (!in)
        return errno == ENOENT ? 1 : zn_set_error(-errno, "merge: %s: %s", from, strerror(errno));
    zn_fs_tmp out;
    int rc = zn_fs_tmp_open(&out, to, 0644);
    char buf[1 << 16];
    size_t n;
    while (!rc && (n = fread(buf, 1, sizeof buf, in)) > 0)
        rc = zn_fs_write_full(out.fd, buf, n, out.tmp);
    if (!rc && ferror(in))
        rc = zn_set_error(-EIO, "merge: reading %s failed", from);
    fclose(in);
    if (rc)
        zn_fs_tmp_abort(&out);
    else
        rc = zn_fs_tmp_commit(&out);
    return rc ? zn_error_prefix(rc, "merge") : 0;
}

/* The base's config.json, with torch_dtype (and transformers 5's dtype)
 * set when the weights change type. */
static int write_merged_config(const char *base, const char *out_dir, int force, zn_dtype dt)
{
    char from[ZN_CKPT_PATH + 32], to[ZN_CKPT_PATH + 64];
    snprintf(from, sizeof from, "%s/config.json", base);
    snprintf(to, sizeof to, "%s/config.json", out_dir);
    json_error_t je;
    json_t *c = json_load_file(from, 0, &je);
    if (!c)
        return zn_set_error(ZN_ECONFIG, "merge: %s: %s", from, je.text);
    if (force) {
        const char *name = dt == ZN_DTYPE_F32 ? "float32" : "bfloat16";
        json_object_set_new(c, "torch_dtype", json_string(name));
        if (json_object_get(c, "dtype"))
            json_object_set_new(c, "dtype", json_string(name));
    }
    char *text = json_dumps(c, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(c);
    int rc = text ? zn_fs_write_atomic(to, text, strlen(text))
                  : zn_set_error(-ENOMEM, "out of memory");
    free(text);
    return rc ? zn_error_prefix(rc, "merge") : 0;
}

/* The model.path the run recorded, or NULL. */
static int recorded_base(const zn_ckpt *ck, char *out, size_t n)
{
    json_t *c = ck->config_text ? json_loads(ck->config_text, 0, NULL) : NULL;
    const char *mp = json_string_value(json_object_get(json_object_get(c, "model"), "path"));
    int ok = mp && mp[0];
    if (ok)
        snprintf(out, n, "%s", mp);
    json_decref(c);
    return ok;
}

/* A fine-tuned model from an HF folder keeps what makes that folder a model
 * a user can run: its config.json (the eos and pad ids, rope scaling and
 * the rest transformers reads; torch_dtype set to the export's), its
 * tokenizer and chat template, its generation_config.json. Only when the
 * folder the run recorded still describes the checkpoint's model; else
 * the config zinc wrote stays and a warning says why. */
static int keep_base_files(const zn_ckpt *ck, const zn_model_dims *d, const char *out_dir,
                           zn_dtype dtype)
{
    char base[ZN_CKPT_PATH], p[ZN_CKPT_PATH + 64], q[ZN_CKPT_PATH + 64];
    zn_model_dims bd;
    if (!recorded_base(ck, base, sizeof base))
        return 0;   /* trained from dimensions: nothing to keep */
    if (zn_model_dims_from_hf(&bd, base)) {
        zn_warn("export: the run's model.path %s is not readable now (%s): config.json is "
                "zinc's, without the tokenizer files", base, zn_last_error());
        return 0;
    }
    bd.lora = d->lora;
    if (zn_ckpt_check_dims(ck, &bd)) {
        zn_warn("export: %s no longer describes the checkpoint's model (%s): config.json is "
                "zinc's, without the tokenizer files", base, zn_last_error());
        return 0;
    }
    int rc = write_merged_config(base, out_dir, 1, dtype);
    for (size_t i = 0; i < sizeof hf_side_files / sizeof *hf_side_files && !rc; i++) {
        snprintf(p, sizeof p, "%s/%s", base, hf_side_files[i]);
        snprintf(q, sizeof q, "%s/%s", out_dir, hf_side_files[i]);
        if ((rc = copy_file(p, q)) == 1)
            rc = 0; /* the base has no such file */
    }
    return rc;
}

typedef struct {
    float *a, *b; /* lora_A [r][in], lora_B [out][r] (into the block's adapters) */
} merge_pair;

int zn_ckpt_export_merged(const char *path, const char *out_dir, const char *base_dir,
                          int force_dtype, zn_dtype dtype, uint64_t shard_bytes)
{
    if (force_dtype && dtype != ZN_DTYPE_F32 && dtype != ZN_DTYPE_BF16)
        return zn_set_error(ZN_EARG, "export: dtype must be fp32 or bf16");
    if (!shard_bytes)
        shard_bytes = 2ull << 30;
    zn_ckpt *ck;
    int rc = zn_ckpt_open(&ck, path);
    if (rc)
        return rc;
    zn_st *st = NULL;
    ex_rank *rk = calloc((size_t)ck->world, sizeof *rk);
    float *ad = NULL, *buf = NULL;
    char **names = NULL, **files = NULL;
    ex_tensor *ts = NULL;
    zn_st_dtype *tdt = NULL;
    merge_pair *pair = NULL;
    int nt = 0, nfiles = 0;
    zn_model_dims d, bd;
    char base[ZN_CKPT_PATH];
    if (!rk) {
        rc = zn_set_error(-ENOMEM, "export: out of memory");
        goto out;
    }
    if ((rc = zn_ckpt_dims(ck, &d)) || (rc = check_blocks(ck, &d)))
        goto out;
    if (d.lora.r <= 0) {
        rc = zn_set_error(ZN_EARG, "--merge: checkpoint %s holds a full model, not LoRA "
                          "adapters (export it without --merge)", ck->path);
        goto out;
    }
    if (base_dir)
        snprintf(base, sizeof base, "%s", base_dir);
    else if (!recorded_base(ck, base, sizeof base)) {
        rc = zn_set_error(ZN_EARG, "--merge: checkpoint %s records no model.path; name "
                          "the base model folder with --base DIR", ck->path);
        goto out;
    }
    if ((rc = zn_model_dims_from_hf(&bd, base))) {
        rc = zn_error_prefix(rc, "--merge: the base model%s", base_dir ? "" :
                             " (model.path recorded in the checkpoint; --base DIR names "
                             "another)");
        goto out;
    }
    if (bd.hidden != d.hidden || bd.n_layers != d.n_layers || bd.intermediate != d.intermediate ||
        bd.vocab != d.vocab || bd.n_heads != d.n_heads || bd.n_kv_heads != d.n_kv_heads ||
        bd.head_dim != d.head_dim || bd.tie_embeddings != d.tie_embeddings) {
        rc = zn_set_error(ZN_ECONFIG, "--merge: %s is not the model the adapters were "
                          "trained on (hidden %lld, %lld layers; the checkpoint's: hidden "
                          "%lld, %lld layers)", base, (long long)bd.hidden,
                          (long long)bd.n_layers, (long long)d.hidden, (long long)d.n_layers);
        goto out;
    }
    if ((rc = zn_st_open(&st, base)))
        goto out;
    /* every adapter in memory (small: r x (in + out) per target), read in
     * file order so that each rank's crc32c is checked */
    uint64_t total_ad = 0;
    for (int b = 0; b < ck->nblocks; b++)
        total_ad += ck->blocks[b];
    if ((rc = ranks_open(ck, rk)))
        goto out;
    int cap = 0;
    for (int b = 0; b < zn_model_num_blocks(&d); b++)
        cap += zn_model_block_nparams(&d, b);
    ad = malloc((size_t)(total_ad ? total_ad : 1) * 4);
    ts = calloc((size_t)cap, sizeof *ts);
    tdt = calloc((size_t)cap, sizeof *tdt);
    pair = calloc((size_t)cap, sizeof *pair);
    names = calloc((size_t)cap, sizeof *names);
    files = calloc((size_t)cap, sizeof *files);
    buf = malloc((size_t)CHUNK_ELEMS * 4);
    if (!ad || !ts || !tdt || !pair || !names || !files || !buf) {
        rc = zn_set_error(-ENOMEM, "--merge: out of memory (%" PRIu64 " adapter "
                          "elements)", total_ad);
        goto out;
    }
    for (int b = 0, at = 0; b < ck->nblocks && !rc; at += (int)ck->blocks[b], b++)
        if (ck->blocks[b])
            rc = read_block_range(ck, rk, b, 0, ck->blocks[b], ad + at);
    if (rc || (rc = ranks_check(ck, rk)))
        goto out;
    /* the base's tensors in model order, each with its adapter pair */
    uint64_t in_file = 0, total_bytes = 0, ad_at = 0;
    for (int b = 0; b < zn_model_num_blocks(&d); b++) {
        int first = nt;
        uint64_t off = 0, frozen = zn_model_block_frozen_count(&d, b);
        for (int i = 0; i < zn_model_block_nparams(&d, b); i++) {
            zn_param_info pi;
            if ((rc = zn_model_block_param(&d, b, i, &pi)))
                goto out;
            uint64_t at = off;
            off += (uint64_t)pi.numel;
            if (pi.owner_block >= 0)
                continue; /* tied: stored once, with its owner */
            if (pi.lora) {
                /* the base tensor this adapter belongs to, in this block */
                char suf[48];
                snprintf(suf, sizeof suf, ".%s.weight", zn_lora_target_name(pi.target));
                for (int k = first; k < nt; k++) {
                    size_t ln = strlen(ts[k].name), ls = strlen(suf);
                    if (ln > ls && !strcmp(ts[k].name + ln - ls, suf)) {
                        float *p = ad + ad_at + (at - frozen);
                        if (pi.lora == 1)
                            pair[k].a = p;
                        else
                            pair[k].b = p;
                    }
                }
                continue;
            }
            const zn_st_tensor *t = zn_st_find(st, pi.name);
            if (!t || t->numel != (uint64_t)pi.numel) {
                rc = zn_set_error(ZN_ECORRUPT, "--merge: %s: tensor %s %s", base, pi.name,
                                  t ? "has another shape" : "is missing");
                goto out;
            }
            ex_tensor *e = &ts[nt];
            snprintf(e->name, sizeof e->name, "%s", pi.name);
            e->ndim = pi.ndim;
            e->shape[0] = pi.shape[0];
            e->shape[1] = pi.shape[1];
            e->numel = (uint64_t)pi.numel;
            tdt[nt] = force_dtype ? zn_st_dtype_from(dtype)
                      : (t->dtype == ZN_ST_F16 || t->dtype == ZN_ST_BF16) ? t->dtype
                                                                           : ZN_ST_F32;
            uint64_t bytes = e->numel * zn_st_dtype_size(tdt[nt]);
            if (in_file && in_file + bytes > shard_bytes) {
                nfiles++;
                in_file = 0;
            }
            e->file = nfiles;
            in_file += bytes;
            total_bytes += bytes;
            nt++;
        }
        ad_at += zn_model_block_param_count(&d, b) - frozen;
    }
    nfiles++;
    for (int k = 0; k < nt; k++)
        if (!pair[k].a != !pair[k].b) {
            rc = zn_set_error(ZN_EINTERNAL, "--merge: %s has half an adapter", ts[k].name);
            goto out;
        }
    if ((rc = zn_fs_mkdir_p(out_dir, 0755)) || (rc = write_merged_config(base, out_dir,
                                                                       force_dtype, dtype)))
        goto out;
    char p[ZN_CKPT_PATH + 64], q[ZN_CKPT_PATH + 64];
    for (size_t i = 0; i < sizeof hf_side_files / sizeof *hf_side_files && !rc; i++) {
        snprintf(p, sizeof p, "%s/%s", base, hf_side_files[i]);
        snprintf(q, sizeof q, "%s/%s", out_dir, hf_side_files[i]);
        if ((rc = copy_file(p, q)) == 1)
            rc = 0; /* the base has no such file */
    }
    /* W' = W + scale B A, row chunk by row chunk, in fp32 */
    const float scale = (float)zn_lora_scale(&d.lora);
    const int64_t r = d.lora.r;
    int t0 = 0;
    for (int fi = 0; fi < nfiles && !rc; fi++) {
        char fname[64];
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
            rc = zn_st_writer_add(w, ts[i].name, tdt[i], ts[i].ndim, ts[i].shape);
        for (int i = t0; i < t1 && !rc; i++) {
            ex_tensor *e = &ts[i];
            const zn_st_tensor *t = zn_st_find(st, e->name);
            int64_t in = e->ndim == 2 ? e->shape[1] : (int64_t)e->numel;
            uint64_t rows_per = CHUNK_ELEMS / (uint64_t)in ? CHUNK_ELEMS / (uint64_t)in : 1;
            for (uint64_t row = 0; row * (uint64_t)in < e->numel && !rc; row += rows_per) {
                uint64_t first = row * (uint64_t)in, n = rows_per * (uint64_t)in;
                if (n > e->numel - first)
                    n = e->numel - first;
                if (n > CHUNK_ELEMS) {
                    rc = zn_set_error(ZN_EUNSUPPORTED, "--merge: %s: rows of %lld "
                                      "elements", e->name, (long long)in);
                    break;
                }
                rc = zn_st_read_range(st, t, first, n, ZN_DTYPE_F32, buf, n * 4);
                if (!rc && pair[i].a)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(n / (uint64_t)in),
                                (int)in, (int)r, scale, pair[i].b + row * (uint64_t)r, (int)r,
                                pair[i].a, (int)in, 1.0f, buf, (int)in);
                if (!rc)
                    rc = zn_st_writer_write(w, e->name, ZN_DTYPE_F32, buf, first, n);
            }
            if (!rc && (!(names[i] = strdup(e->name)) || !(files[i] = strdup(fname))))
                rc = zn_set_error(-ENOMEM, "export: out of memory");
        }
        if (!rc)
            rc = zn_st_writer_finish(w);
        zn_st_writer_destroy(w);
        t0 = t1;
    }
    if (!rc) {
        snprintf(p, sizeof p, "%s/model.safetensors.index.json", out_dir);
        rc = zn_st_write_index(p, (size_t)nt, (const char *const *)names,
                               (const char *const *)files, total_bytes);
    }
out:
    ranks_close(ck, rk);
    free_names(names, files, nt);
    free(ts);
    free(tdt);
    free(pair);
    free(ad);
    free(buf);
    zn_st_close(st);
    zn_ckpt_close(ck);
    return rc;
}
