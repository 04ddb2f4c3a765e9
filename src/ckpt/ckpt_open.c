/* A checkpoint opened (its manifest read and checked against the files'
 * sizes) and verified (every file's crc32c), and what it records. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt-impl.h"
#include "train/train-state.h"
#include "zinc/comm.h"


#define PATHN ZN_CKPT_PATH


/* ---- open and verify -----------------------------------------------------------------*/
int zn_ckpt_resolve(const char *path, char *out, size_t out_len)
{
    char p[PATHN];
    struct stat st;
    snprintf(p, sizeof p, "%s/manifest.json", path);
    if (stat(p, &st) == 0) {
        snprintf(out, out_len, "%s", path);
        return 0;
    }
    snprintf(p, sizeof p, "%s/latest", path);
    FILE *f = fopen(p, "r");
    if (!f) {
        if (stat(path, &st) < 0)
            return zn_set_error(-errno, "checkpoint %s: %s", path, strerror(errno));
        return zn_set_error(-ENOENT, "checkpoint %s: neither a checkpoint (no manifest.json) "
                            "nor a checkpoint folder with a complete one (no 'latest')", path);
    }
    char name[256] = "";
    if (!fgets(name, sizeof name, f))
        name[0] = '\0';
    fclose(f);
    name[strcspn(name, "\r\n")] = '\0';
    long long s;
    if (!zn_ckpt__step_of(name, &s))
        return zn_set_error(ZN_ECORRUPT, "checkpoint %s: 'latest' holds '%s', not a step folder "
                            "name", p, name);
    snprintf(out, out_len, "%s/%s", path, name);
    return 0;
}

const zn_ckpt_file *zn_ckpt__file(const zn_ckpt *ck, const char *name)
{
    for (int i = 0; i < ck->nfiles; i++)
        if (!strcmp(ck->files[i].name, name))
            return &ck->files[i];
    return NULL;
}

void zn_ckpt_close(zn_ckpt *ck)
{
    if (!ck)
        return;
    if (ck->ranks)
        for (int r = 0; r < ck->world; r++) {
            free(ck->ranks[r].sh);
            free(ck->ranks[r].f32);
        }
    free(ck->ranks);
    for (int i = 0; i < ck->nfiles; i++) {
        free(ck->files[i].name);
        for (int j = 0; j < ck->files[i].nref; j++)
            free(ck->files[i].ref[j]);
        free(ck->files[i].pc);
    }
    free(ck->files);
    free(ck->blocks);
    json_decref(ck->man);
    free(ck);
}

static int get_u64(json_t *o, const char *key, uint64_t *v)
{
    json_t *x = json_object_get(o, key);
    if (!json_is_integer(x) || json_integer_value(x) < 0)
        return -1;
    *v = (uint64_t)json_integer_value(x);
    return 0;
}

/* A state file kept by reference (a final save on NVMe): its entry's
 * "ref" is {"files": [names in the entry's folder], "pieces": [[src, off,
 * len], ...]}, src indexing files or -1 for zeros. Checks that the pieces
 * make the entry's bytes and that the files hold them. */
static int parse_ref(const zn_ckpt *ck, const char *fname, json_t *ref, zn_ckpt_file *f)
{
    json_t *fl = json_object_get(ref, "files"), *pcs = json_object_get(ref, "pieces");
    size_t nf = json_array_size(fl), np = json_array_size(pcs);
    if (!json_is_array(fl) || !nf || nf > ZN_CKPT_MAX_REFS || !json_is_array(pcs) || !np)
        return zn_set_error(ZN_ECORRUPT, "checkpoint %s: manifest.json: the reference of file "
                            "'%s'", ck->path, fname);
    const char *slash = strrchr(fname, '/');
    int dl = slash ? (int)(slash - fname + 1) : 0;
    for (size_t i = 0; i < nf; i++) {
        const char *n = json_string_value(json_array_get(fl, i));
        if (!n || !n[0] || strchr(n, '/') || !strcmp(n, ".") || !strcmp(n, ".."))
            return zn_set_error(ZN_ECORRUPT, "checkpoint %s: manifest.json: file '%s' refers "
                                "to a bad name", ck->path, fname);
        size_t len = (size_t)dl + strlen(n) + 1;
        if (!(f->ref[i] = malloc(len)))
            return zn_set_error(-ENOMEM, "checkpoint: out of memory");
        snprintf(f->ref[i], len, "%.*s%s", dl, fname, n);
        f->nref++;
    }
    if (!(f->pc = calloc(np, sizeof *f->pc)))
        return zn_set_error(-ENOMEM, "checkpoint: out of memory");
    uint64_t at = 0, need[ZN_CKPT_MAX_REFS] = { 0 };
    for (size_t i = 0; i < np; i++) {
        json_t *e = json_array_get(pcs, i);
        json_int_t src = json_integer_value(json_array_get(e, 0)),
                   off = json_integer_value(json_array_get(e, 1)),
                   len = json_integer_value(json_array_get(e, 2));
        if (!json_is_array(e) || json_array_size(e) != 3 ||
            !json_is_integer(json_array_get(e, 0)) || !json_is_integer(json_array_get(e, 1)) ||
            src < -1 || src >= (json_int_t)nf ||
            off < 0 || len <= 0 || at + (uint64_t)len < at ||
            (uint64_t)off + (uint64_t)len < (uint64_t)off)
            return zn_set_error(ZN_ECORRUPT, "checkpoint %s: manifest.json: piece %zu of file "
                                "'%s'", ck->path, i, fname);
        f->pc[i] = (zn_ckpt_piece){ (int)src, (uint64_t)off, (uint64_t)len, at };
        f->npc++;
        at += (uint64_t)len;
        if (src >= 0 && need[src] < (uint64_t)(off + len))
            need[src] = (uint64_t)(off + len);
    }
    if (at != f->bytes)
        return zn_set_error(ZN_ECORRUPT, "checkpoint %s: manifest.json: the pieces of file '%s' "
                            "make %" PRIu64 " bytes, not %" PRIu64, ck->path, fname, at,
                            f->bytes);
    for (int i = 0; i < f->nref; i++) {
        char fp[ZN_CKPT_PATH + 512];
        snprintf(fp, sizeof fp, "%s/%s", ck->path, f->ref[i]);
        struct stat st;
        if (stat(fp, &st) < 0)
            return zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s (which %s refers to) is "
                                "missing", ck->path, f->ref[i], fname);
        if ((uint64_t)st.st_size < need[i])
            return zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s has %lld bytes, %s refers "
                                "to %" PRIu64 " (truncated)", ck->path, f->ref[i],
                                (long long)st.st_size, fname, need[i]);
    }
    return 0;
}

int zn_ckpt_open(zn_ckpt **out, const char *path)
{
    *out = NULL;
    zn_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck)
        return zn_set_error(-ENOMEM, "checkpoint: out of memory");
    int rc = zn_ckpt_resolve(path, ck->path, sizeof ck->path);
    if (rc) {
        free(ck);
        return rc;
    }
    char mp[PATHN + 32];
    snprintf(mp, sizeof mp, "%s/manifest.json", ck->path);
    json_error_t je;
    ck->man = json_load_file(mp, 0, &je);
#define BAD(...)                                                        \
    do {                                                                \
        rc = zn_set_error(ZN_ECORRUPT, __VA_ARGS__);                    \
        goto fail;                                                      \
    } while (0)
    if (!ck->man) {
        if (access(mp, F_OK) < 0)
            BAD("checkpoint %s: manifest.json is missing (not a complete checkpoint)", ck->path);
        BAD("checkpoint %s: manifest.json is not valid JSON (line %d: %s)", ck->path, je.line,
            je.text);
    }
    json_t *m = ck->man;
    /* the manifest's own checksum */
    json_t *mc = json_object_get(m, "manifest_crc32c");
    if (!json_is_integer(mc))
        BAD("checkpoint %s: manifest.json has no manifest_crc32c", ck->path);
    json_int_t want = json_integer_value(mc);
    json_incref(mc);
    json_object_del(m, "manifest_crc32c");
    char *body = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
    uint32_t got = body ? zn_crc32c(0, body, strlen(body)) : 0;
    free(body);
    json_object_set_new(m, "manifest_crc32c", mc);
    if ((json_int_t)got != want)
        BAD("checkpoint %s: manifest.json: crc32c 0x%08x, the manifest says 0x%08x (corrupted)",
            ck->path, got, (unsigned)want);
    const char *fmt = json_string_value(json_object_get(m, "format"));
    if (!fmt || strcmp(fmt, ZN_CKPT_FORMAT))
        BAD("checkpoint %s: manifest.json: format is not '%s'", ck->path, ZN_CKPT_FORMAT);
    json_int_t ver = json_integer_value(json_object_get(m, "version"));
    if (ver != ZN_CKPT_VERSION)
        BAD("checkpoint %s: format version %lld, this zinc reads version %d", ck->path,
            (long long)ver, ZN_CKPT_VERSION);
    uint64_t u;
    if (get_u64(m, "step", &u))
        BAD("checkpoint %s: manifest.json: bad 'step'", ck->path);
    ck->step = (int64_t)u;
    if (get_u64(m, "steps_run", &u))
        BAD("checkpoint %s: manifest.json: bad 'steps_run'", ck->path);
    ck->steps_run = (int64_t)u;
    if (get_u64(m, "world_size", &u) || u < 1 || u > 1u << 20)
        BAD("checkpoint %s: manifest.json: bad 'world_size'", ck->path);
    ck->world = (int)u;
    {
        json_t *mj = json_object_get(m, "moments");   /* absent: fp32 (before issue 35) */
        int mf = mj ? zn_mom_fmt_parse(json_string_value(mj)) : ZN_MOM_F32;
        if (mf < 0)
            BAD("checkpoint %s: manifest.json: moments %s is not fp32, bf16 or int8", ck->path,
                json_is_string(mj) ? json_string_value(mj) : "(not a string)");
        ck->moments = (zn_mom_fmt)mf;
        json_t *ms = json_object_get(m, "master");   /* absent: fp32 (before bf16_sr) */
        const char *msn = ms ? json_string_value(ms) : "fp32";
        if (!msn || (strcmp(msn, "fp32") && strcmp(msn, "bf16")))
            BAD("checkpoint %s: manifest.json: master %s is not fp32 or bf16", ck->path,
                msn ? msn : "(not a string)");
        ck->master = !strcmp(msn, "bf16") ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    }
    json_t *bl = json_object_get(m, "blocks");
    if (!json_is_array(bl) || !json_array_size(bl) || json_array_size(bl) > 1u << 20)
        BAD("checkpoint %s: manifest.json: bad 'blocks'", ck->path);
    ck->nblocks = (int)json_array_size(bl);
    ck->blocks = calloc((size_t)ck->nblocks, sizeof *ck->blocks);
    ck->ranks = calloc((size_t)ck->world, sizeof *ck->ranks);
    if (!ck->blocks || !ck->ranks) {
        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory");
        goto fail;
    }
    for (int b = 0; b < ck->nblocks; b++) {
        json_t *x = json_array_get(bl, (size_t)b);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            BAD("checkpoint %s: manifest.json: block %d's size", ck->path, b);
        ck->blocks[b] = (uint64_t)json_integer_value(x);
        ck->total += ck->blocks[b];
    }
    json_t *ra = json_object_get(m, "ranks");
    if (!json_is_array(ra) || json_array_size(ra) != (size_t)ck->world)
        BAD("checkpoint %s: manifest.json: 'ranks' does not list %d ranks", ck->path, ck->world);
    for (int r = 0; r < ck->world; r++) {
        json_t *rj = json_array_get(ra, (size_t)r), *sh = json_object_get(rj, "shares");
        zn_ckpt_rank *cr = &ck->ranks[r];
        if (get_u64(rj, "local_params", &cr->local_params) || !json_is_array(sh) ||
            json_array_size(sh) != (size_t)ck->nblocks)
            BAD("checkpoint %s: manifest.json: rank %d's geometry", ck->path, r);
        cr->sh = calloc((size_t)ck->nblocks, sizeof *cr->sh);
        if (!cr->sh) {
            rc = zn_set_error(-ENOMEM, "checkpoint: out of memory");
            goto fail;
        }
        for (int b = 0; b < ck->nblocks; b++) {
            json_int_t so, len, lo;
            json_t *e = json_array_get(sh, (size_t)b);
            if (json_unpack(e, "[III]", &so, &len, &lo))
                BAD("checkpoint %s: manifest.json: rank %d's share of block %d is not [shard "
                    "offset, length, local offset]", ck->path, r, b);
            /* an empty share may start past the block's end: a block smaller
             * than the ranks' 128-element shards leaves the last ranks none */
            if (so < 0 || len < 0 || lo < 0 ||
                (len > 0 && (uint64_t)so + (uint64_t)len > ck->blocks[b]) ||
                (uint64_t)lo + (uint64_t)len > cr->local_params)
                BAD("checkpoint %s: manifest.json: rank %d's share of block %d, [%lld, %lld, "
                    "%lld] (shard offset, length, local offset), lies outside the block's "
                    "%" PRIu64 " elements or the rank's %" PRIu64 " (corrupted)", ck->path, r,
                    b, (long long)so, (long long)len, (long long)lo, ck->blocks[b],
                    cr->local_params);
            cr->sh[b] = (zn_ckpt_share){ (uint64_t)so, (uint64_t)len, (uint64_t)lo };
        }
        /* absent: none (every block 8-bit, and checkpoints before them) */
        json_t *fr = json_object_get(rj, "f32_runs");
        if (fr && (!json_is_array(fr) || !json_array_size(fr)))
            BAD("checkpoint %s: manifest.json: rank %d's f32_runs is not a list of runs",
                ck->path, r);
        cr->n_f32 = fr ? json_array_size(fr) : 0;
        if (cr->n_f32 && !(cr->f32 = calloc(cr->n_f32, sizeof *cr->f32))) {
            rc = zn_set_error(-ENOMEM, "checkpoint: out of memory");
            goto fail;
        }
        for (size_t i = 0; i < cr->n_f32; i++) {
            json_int_t b0, n, sl;
            if (json_unpack(json_array_get(fr, i), "[III]", &b0, &n, &sl) || b0 < 0 || n <= 0 ||
                sl != (json_int_t)cr->f32_slots ||
                (uint64_t)(b0 + n) > zn_q8_blocks(cr->local_params) ||
                (i && (uint64_t)b0 < cr->f32[i - 1].block + cr->f32[i - 1].n))
                BAD("checkpoint %s: manifest.json: rank %d's fp32 block run %zu is not [block, "
                    "count, slot] in order within its %" PRIu64 " elements (corrupted)",
                    ck->path, r, i, cr->local_params);
            cr->f32[i] = (zn_q8_f32_run){ (uint64_t)b0, (uint64_t)n, (uint64_t)sl };
            cr->f32_slots += (uint64_t)n;
        }
    }
    json_t *fo = json_object_get(m, "files");
    if (!json_is_object(fo))
        BAD("checkpoint %s: manifest.json: no 'files'", ck->path);
    ck->files = calloc(json_object_size(fo) + 1, sizeof *ck->files);
    if (!ck->files) {
        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory");
        goto fail;
    }
    const char *fname;
    json_t *fv;
    json_object_foreach(fo, fname, fv)
    {
        zn_ckpt_file *f = &ck->files[ck->nfiles];
        uint64_t c;
        if (strstr(fname, "..") || fname[0] == '/' || get_u64(fv, "bytes", &f->bytes) ||
            get_u64(fv, "crc32c", &c) || c > UINT32_MAX)
            BAD("checkpoint %s: manifest.json: entry of file '%s'", ck->path, fname);
        f->crc = (uint32_t)c;
        if (!(f->name = strdup(fname))) {
            rc = zn_set_error(-ENOMEM, "checkpoint: out of memory");
            goto fail;
        }
        ck->nfiles++;
        json_t *ref = json_object_get(fv, "ref");
        if (ref) {
            if ((rc = parse_ref(ck, fname, ref, f)))
                goto fail;
            continue;
        }
        char fp[PATHN + 512];
        snprintf(fp, sizeof fp, "%s/%s", ck->path, fname);
        struct stat st;
        if (stat(fp, &st) < 0)
            BAD("checkpoint %s: file %s is missing", ck->path, fname);
        if ((uint64_t)st.st_size != f->bytes)
            BAD("checkpoint %s: file %s has %lld bytes, the manifest says %" PRIu64
                " (truncated or overwritten)", ck->path, fname, (long long)st.st_size, f->bytes);
    }
    for (int r = 0; r < ck->world; r++)
        for (int k = 0; k < 3; k++) {
            char rel[64];
            snprintf(rel, sizeof rel, "rank-%d/%s", r, zn_ckpt__state_file[k]);
            const zn_ckpt_file *f = zn_ckpt__file(ck, rel);
            if (!f)
                BAD("checkpoint %s: manifest.json does not list %s", ck->path, rel);
            uint64_t fbytes = k ? zn_mom_layout_bytes(ck->moments, ck->ranks[r].local_params) +
                                      ck->ranks[r].f32_slots * ZN_Q8_BLOCK * 4
                              : ck->ranks[r].local_params * zn_dtype_size(ck->master);
            if (f->bytes != fbytes)
                BAD("checkpoint %s: %s holds %" PRIu64 " bytes for %" PRIu64 " parameters",
                    ck->path, rel, f->bytes, ck->ranks[r].local_params);
        }
    json_t *cfg = json_object_get(m, "config");
    ck->config_text = json_is_string(cfg) ? json_string_value(cfg) : NULL;
    ck->client_json = json_string_value(json_object_get(m, "client"));
    if (!ck->client_json)
        ck->client_json = "{}";
    if (zn_ckpt__file(ck, "config.json")) {
        snprintf(mp, sizeof mp, "%s/config.json", ck->path);
        if ((rc = zn_model_dims_from_hf(&ck->dims, mp)))
            goto fail;
        /* lora_config.json; checkpoints before 2026-12 named it
         * adapter_config.json */
        const char *lname = zn_ckpt__file(ck, "lora_config.json") ? "lora_config.json"
                            : zn_ckpt__file(ck, "adapter_config.json") ? "adapter_config.json"
                                                                       : NULL;
        if (lname) {
            snprintf(mp, sizeof mp, "%s/%s", ck->path, lname);
            if ((rc = zn_lora_read_peft_file(mp, &ck->dims.lora)))
                goto fail;
            zn_lora_fit_family(&ck->dims);
        }
        ck->has_dims = 1;
    }
    *out = ck;
    return 0;
#undef BAD
fail:
    zn_ckpt_close(ck);
    return rc;
}

const char *zn_ckpt_path(const zn_ckpt *ck)
{
    return ck->path;
}

int64_t zn_ckpt_step(const zn_ckpt *ck)
{
    return ck->step;
}

int64_t zn_ckpt_steps_run(const zn_ckpt *ck)
{
    return ck->steps_run;
}

int zn_ckpt_world(const zn_ckpt *ck)
{
    return ck->world;
}

uint64_t zn_ckpt_num_params(const zn_ckpt *ck)
{
    return ck->total;
}

const char *zn_ckpt_config_text(const zn_ckpt *ck)
{
    return ck->config_text;
}

const char *zn_ckpt_client_json(const zn_ckpt *ck)
{
    return ck->client_json;
}

int zn_ckpt_dims(const zn_ckpt *ck, zn_model_dims *out)
{
    if (!ck->has_dims)
        return zn_set_error(-ENOENT, "checkpoint %s records no model (config.json)", ck->path);
    *out = ck->dims;
    return 0;
}

int zn_ckpt_check_dims(const zn_ckpt *ck, const zn_model_dims *d)
{
    if (!ck->has_dims)
        return zn_set_error(ZN_ECONFIG, "checkpoint %s records no model to compare with",
                            ck->path);
    const zn_model_dims *c = &ck->dims;
#define SAME(f)                                                                              \
    if (c->f != d->f)                                                                        \
        return zn_set_error(ZN_ECONFIG, "checkpoint %s is of another model: " #f " %lld in " \
                            "the checkpoint, %lld in this config", ck->path, (long long)c->f,  \
                            (long long)d->f);
    SAME(arch) SAME(hidden) SAME(n_layers) SAME(n_heads) SAME(n_kv_heads) SAME(head_dim)
    SAME(intermediate) SAME(vocab) SAME(tie_embeddings) SAME(qkv_bias) SAME(o_bias)
    SAME(lora.r) SAME(lora.targets) SAME(lora.rslora)
#undef SAME
    return 0;
}

/* Streams a file (or what it refers to) through crc32c in bounded reads,
 * comparing with its entry. */
static int verify_file(const zn_ckpt *ck, const zn_ckpt_file *f, char *buf, size_t cap)
{
    zn_ckpt_rd rd;
    int rc = zn_ckpt__rd_open(&rd, ck, f, POSIX_FADV_SEQUENTIAL);
    if (rc)
        return rc;
    uint32_t crc = 0;
    for (uint64_t off = 0; off < f->bytes && !rc; off += cap) {
        size_t n = f->bytes - off < cap ? (size_t)(f->bytes - off) : cap;
        if (!(rc = zn_ckpt__rd_read(&rd, off, buf, n)))
            crc = zn_crc32c(crc, buf, n);
    }
    zn_ckpt__rd_close(&rd);
    if (rc)
        return rc;
    if (crc != f->crc)
        return zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s: crc32c 0x%08x, the manifest "
                            "says 0x%08x (corrupted)", ck->path, f->name, crc, f->crc);
    return 0;
}

int zn_ckpt_verify(const char *path)
{
    zn_ckpt *ck;
    int rc = zn_ckpt_open(&ck, path);
    if (rc)
        return rc;
    size_t cap = 4u << 20;
    char *buf = malloc(cap);
    if (!buf) {
        zn_ckpt_close(ck);
        return zn_set_error(-ENOMEM, "checkpoint: out of memory");
    }
    for (int i = 0; i < ck->nfiles && !rc; i++)
        rc = verify_file(ck, &ck->files[i], buf, cap);
    free(buf);
    zn_ckpt_close(ck);
    return rc;
}

static int cmp_desc_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)b, *(const char *const *)a);
}

int zn_ckpt_open_good(zn_ckpt **out, const char *path, char *note, size_t note_len)
{
    *out = NULL;
    if (note && note_len)
        note[0] = '\0';
    char latest[ZN_CKPT_PATH], first_err[1024] = "";
    int rc = zn_ckpt_resolve(path, latest, sizeof latest);
    if (!rc && !(rc = zn_ckpt_verify(latest)))
        return zn_ckpt_open(out, latest);
    snprintf(first_err, sizeof first_err, "%s", zn_last_error());
    int first_rc = rc;
    /* a step folder named directly is what the user asked for */
    char probe[ZN_CKPT_PATH + 16];
    snprintf(probe, sizeof probe, "%s/latest", path);
    struct stat sb;
    if (stat(probe, &sb) != 0)
        return zn_set_error(first_rc, "%s", first_err);
    DIR *d = opendir(path);
    if (!d)
        return zn_set_error(first_rc, "%s", first_err);
    char *names[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        long long st;
        if (zn_ckpt__step_of(e->d_name, &st) && (names[n] = strdup(e->d_name)))
            n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_desc_str);
    rc = first_rc;
    for (int i = 0; i < n; i++) {
        char dir[ZN_CKPT_PATH + 300];
        snprintf(dir, sizeof dir, "%s/%s", path, names[i]);
        if (!strcmp(dir, latest) || zn_ckpt_verify(dir))
            continue;   /* (a damaged older one is passed over too) */
        if ((rc = zn_ckpt_open(out, dir)))
            continue;
        if (note && note_len)
            snprintf(note, note_len, "the newest checkpoint in %s is damaged (%s); resuming "
                     "from %s instead: the steps after it are trained again", path, first_err,
                     names[i]);
        break;
    }
    for (int i = 0; i < n; i++)
        free(names[i]);
    if (!*out)
        return zn_set_error(first_rc, "%s (and no older checkpoint in %s verifies)", first_err,
                            path);
    return 0;
}
