/* zinc bench load's measuring half: how fast the trainer's initial-weight
 * path reads an HF model folder, beside the ceiling of the same disk
 * measured in the same run: one thread reading every shard front to back
 * in 16 MiB preads. Both passes start cold (each shard's page cache
 * dropped with posix_fadvise), both count the tensors' bytes, and both are
 * verified: each tensor's crc32c over its stored bytes (plain pass) must
 * equal the crc32c of the values the loader produced, narrowed back to the
 * stored dtype (exact for a widening). The zinc pass is exactly what
 * zn_train_create does: the model's init_params over each block in the
 * trainer's chunk size. */
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zinc/bench.h"
#include "zinc/model.h"
#include "zinc/optim.h"
#include "zinc/safetensors.h"
#include "zinc/train.h"
#include "zinc/util.h"

#define PLAIN_CHUNK ((size_t)16 << 20)
#define LOAD_CHUNK ((uint64_t)8 << 20)   /* = train.c's INIT_CHUNK */

static int drop_cache(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zn_set_error(-errno, "%s: %s", path, strerror(errno));
    int rc = 0;
    if (fdatasync(fd) && errno != EINVAL && errno != EROFS)
        rc = zn_set_error(-errno, "%s: fdatasync: %s", path, strerror(errno));
    int e = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (!rc && e)
        rc = zn_set_error(-e, "%s: posix_fadvise: %s", path, strerror(e));
    close(fd);
    return rc;
}

static zn_dtype stored_dtype(zn_st_dtype t)
{
    return t == ZN_ST_BF16 ? ZN_DTYPE_BF16 : t == ZN_ST_F16 ? ZN_DTYPE_F16 : ZN_DTYPE_F32;
}

/* Plain pass: every shard front to back; crc[i] over tensor i's bytes. */
static int plain_pass(zn_st *st, uint32_t *crc, double *secs, uint64_t *bytes)
{
    size_t nt = zn_st_count(st);
    unsigned char *buf = malloc(PLAIN_CHUNK);
    if (!buf)
        return zn_set_error(-ENOMEM, "out of memory");
    memset(crc, 0, nt * sizeof *crc);
    *secs = 0;
    *bytes = 0;
    int rc = 0;
    for (int sh = 0; sh < zn_st_num_shards(st) && !rc; sh++) {
        const char *path = zn_st_shard_path(st, sh);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            rc = zn_set_error(-errno, "%s: %s", path, strerror(errno));
            break;
        }
        struct stat sb;
        if (fstat(fd, &sb)) {
            rc = zn_set_error(-errno, "%s: %s", path, strerror(errno));
            close(fd);
            break;
        }
        uint64_t size = (uint64_t)sb.st_size;
        for (uint64_t off = 0; off < size && !rc; off += PLAIN_CHUNK) {
            size_t want = size - off < PLAIN_CHUNK ? (size_t)(size - off) : PLAIN_CHUNK;
            double t0 = zn_now_s();
            size_t got = 0;
            while (got < want) {
                ssize_t r = pread(fd, buf + got, want - got, (off_t)(off + got));
                if (r <= 0) {
                    rc = zn_set_error(r < 0 ? -errno : -EIO, "%s: read at %llu: %s", path,
                                      (unsigned long long)(off + got),
                                      r < 0 ? strerror(errno) : "short file");
                    break;
                }
                got += (size_t)r;
            }
            *secs += zn_now_s() - t0;
            /* each tensor's bytes in this chunk, in order */
            for (size_t i = 0; i < nt && !rc; i++) {
                const zn_st_tensor *t = zn_st_tensor_at(st, i);
                if (t->shard != sh)
                    continue;
                uint64_t a = t->offset > off ? t->offset : off;
                uint64_t e = t->offset + t->nbytes < off + want ? t->offset + t->nbytes
                                                                : off + want;
                if (a < e) {
                    crc[i] = zn_crc32c(crc[i], buf + (a - off), (size_t)(e - a));
                    *bytes += e - a;
                }
            }
        }
        close(fd);
    }
    free(buf);
    return rc;
}

typedef struct {
    uint64_t start, n;       /* elements of the model's flat order (blocks back to back) */
    size_t st_index;         /* the tensor in the checkpoint */
    zn_dtype dt;
} span;

/* zinc pass: the trainer's loop over init_params; crc[i] over the values
 * narrowed back to the stored dtype. */
static int zinc_pass(const zn_train_model *md, zn_st *st, const span *sp, int nsp, uint32_t *crc,
                     double *secs)
{
    float *vals = malloc(LOAD_CHUNK * sizeof *vals);
    void *narrow = malloc(LOAD_CHUNK * 4);
    if (!vals || !narrow) {
        free(vals);
        free(narrow);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    memset(crc, 0, zn_st_count(st) * sizeof *crc);
    *secs = 0;
    int rc = 0;
    uint64_t g = 0; /* the trainer block's first element in the model's flat order */
    for (int b = 0; b < md->n_blocks && !rc; g += md->block_params[b], b++) {
        uint64_t n = md->block_params[b];
        for (uint64_t x = 0; x < n && !rc; x += LOAD_CHUNK) {
            uint64_t c = n - x < LOAD_CHUNK ? n - x : LOAD_CHUNK;
            double t0 = zn_now_s();
            rc = md->init_params(md->ctx, b, x, c, vals);
            *secs += zn_now_s() - t0;
            for (int k = 0; k < nsp && !rc; k++) {
                uint64_t a = sp[k].start > g + x ? sp[k].start : g + x;
                uint64_t e = sp[k].start + sp[k].n < g + x + c ? sp[k].start + sp[k].n
                                                                : g + x + c;
                if (a >= e)
                    continue;
                if ((rc = zn_convert(narrow, sp[k].dt, vals + (a - g - x), ZN_DTYPE_F32, e - a)))
                    break;
                crc[sp[k].st_index] = zn_crc32c(crc[sp[k].st_index], narrow,
                                                (size_t)(e - a) * zn_dtype_size(sp[k].dt));
            }
        }
    }
    free(vals);
    free(narrow);
    return rc;
}

struct zn_bench_load {
    zn_model_dims d;
    zn_train_llama *l;
    const zn_train_model *md;
    zn_st *st;
    span *sp;
    int nsp;
    uint32_t *c_plain, *c_zinc;
    zn_bench_load_info info;
};

/* The tensors the model uses, in its flat order, and their bytes. */
static int plan_spans(zn_bench_load *b)
{
    zn_st *st = b->st;
    int cap = 0;
    for (int i = 0; i < zn_model_num_blocks(&b->d); i++)
        cap += zn_model_block_nparams(&b->d, i);
    size_t nt = zn_st_count(st);
    b->sp = calloc((size_t)cap, sizeof *b->sp);
    b->c_plain = calloc(nt, sizeof *b->c_plain);
    b->c_zinc = calloc(nt, sizeof *b->c_zinc);
    if (!b->sp || !b->c_plain || !b->c_zinc)
        return zn_set_error(-ENOMEM, "out of memory");
    uint64_t off = 0;
    for (int blk = 0; blk < zn_model_num_blocks(&b->d); blk++) {
        for (int i = 0; i < zn_model_block_nparams(&b->d, blk); i++) {
            zn_param_info pi;
            zn_model_block_param(&b->d, blk, i, &pi);
            if (pi.owner_block >= 0)
                continue;
            const zn_st_tensor *t = zn_st_find(st, pi.name);
            b->sp[b->nsp++] = (span){ off, (uint64_t)pi.numel,
                                      (size_t)(t - zn_st_tensor_at(st, 0)),
                                      stored_dtype(t->dtype) };
            b->info.data_bytes += t->nbytes;
            off += (uint64_t)pi.numel;
        }
    }
    return 0;
}

int zn_bench_load_create(zn_bench_load **out, const char *dir)
{
    *out = NULL;
    zn_bench_load *b = calloc(1, sizeof *b);
    if (!b)
        return zn_set_error(-ENOMEM, "out of memory");
    int rc;
    if ((rc = zn_model_dims_from_hf(&b->d, dir)) ||
        (rc = zn_train_llama_create(&b->l, &b->d, 1, 2, 0.02, 1)) ||
        (rc = zn_train_llama_load(b->l, dir, b->info.summary, sizeof b->info.summary)) ||
        (rc = zn_st_open(&b->st, dir)) || (rc = plan_spans(b))) {
        zn_bench_load_destroy(b);
        return rc;
    }
    b->md = zn_train_llama_model(b->l);
    b->info.shards = zn_st_num_shards(b->st);
    b->info.threads = omp_get_max_threads();
    b->info.plain_chunk = PLAIN_CHUNK;
    *out = b;
    return 0;
}

void zn_bench_load_get_info(const zn_bench_load *b, zn_bench_load_info *out)
{
    *out = b->info;
}

/* Every shard out of the page cache (unless warm). */
static int drop_all(const zn_bench_load *b, int warm)
{
    int rc = 0;
    for (int s = 0; s < zn_st_num_shards(b->st) && !warm && !rc; s++)
        rc = drop_cache(zn_st_shard_path(b->st, s));
    return rc;
}

int zn_bench_load_run(zn_bench_load *b, int repeat, int warm, zn_bench_load_round_fn fn,
                      void *ctx, zn_bench_load_result *out)
{
    memset(out, 0, sizeof *out);
    double sum_ratio = 0;
    int rc;
    for (int r = 0; r < repeat; r++) {
        zn_bench_load_round rd = { .round = r + 1, .zinc_bytes = b->info.data_bytes };
        if ((rc = drop_all(b, warm)))
            return rc;
        if ((rc = plain_pass(b->st, b->c_plain, &rd.plain_s, &rd.plain_bytes)))
            return zn_error_prefix(rc, "plain pass");
        if ((rc = drop_all(b, warm)))
            return rc;
        if ((rc = zinc_pass(b->md, b->st, b->sp, b->nsp, b->c_zinc, &rd.zinc_s)))
            return zn_error_prefix(rc, "zinc pass");
        /* the plain pass's crc of every tensor the model uses is the truth */
        for (int k = 0; k < b->nsp; k++)
            rd.wrong += b->c_plain[b->sp[k].st_index] != b->c_zinc[b->sp[k].st_index];
        out->wrong += rd.wrong;
        rd.plain_gbs = (double)rd.plain_bytes / 1e9 / rd.plain_s;
        rd.zinc_gbs = (double)rd.zinc_bytes / 1e9 / rd.zinc_s;
        rd.ratio = rd.zinc_gbs / rd.plain_gbs;
        out->best_ratio = rd.ratio > out->best_ratio ? rd.ratio : out->best_ratio;
        sum_ratio += rd.ratio;
        if (fn && (rc = fn(ctx, &rd)))
            return rc;
    }
    out->mean_ratio = sum_ratio / repeat;
    return 0;
}

void zn_bench_load_destroy(zn_bench_load *b)
{
    if (!b)
        return;
    free(b->sp);
    free(b->c_plain);
    free(b->c_zinc);
    zn_st_close(b->st);
    zn_train_llama_destroy(b->l);
    free(b);
}
