/* `zinc bench load`: how fast the trainer's initial-weight path reads an HF
 * model folder, beside the ceiling of the same disk measured in the same run:
 * one thread reading every shard front to back in 16 MiB preads. Both passes
 * start cold (each shard's page cache dropped with posix_fadvise), both
 * count the tensors' bytes, and both are verified: each tensor's crc32c over
 * its stored bytes (plain pass) must equal the crc32c of the values the
 * loader produced, narrowed back to the stored dtype (exact for a widening).
 * The zinc pass is exactly what zn_train_create does: the model's
 * init_params over each block in the trainer's chunk size. */
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "zinc/model.h"
#include "zinc/optim.h"
#include "zinc/safetensors.h"
#include "zinc/train.h"
#include "zinc/util.h"

#define PLAIN_CHUNK ((size_t)16 << 20)
#define LOAD_CHUNK ((uint64_t)8 << 20)   /* = train.c's INIT_CHUNK */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: zinc bench load --model DIR [--repeat N] [--csv FILE] [--warm]\n"
        "\n"
        "Reads the weights of an HF model folder the way `zinc train` loads them\n"
        "(parallel preads, widened to fp32, block by block in 8M-element chunks) and\n"
        "compares GB/s with a plain one-thread sequential read of the same files in\n"
        "the same run. Each pass starts with the files dropped from the page cache\n"
        "(--warm: not dropped). Every tensor is verified (crc32c) in every pass.\n"
        "scripts/make_bench_model.py writes a folder of any shape.\n");
}

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

int zn_bench_load(int argc, char **argv)
{
    const char *dir = NULL, *csv = NULL;
    int repeat = 3, warm = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            dir = argv[++i];
        } else if (!strcmp(argv[i], "--csv") && i + 1 < argc) {
            csv = argv[++i];
        } else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) {
            char *end;
            long r = strtol(argv[++i], &end, 10);
            if (*end || r < 1 || r > 100) {
                fprintf(stderr, "zinc: error: --repeat %s: expected 1..100\n", argv[i]);
                return 2;
            }
            repeat = (int)r;
        } else if (!strcmp(argv[i], "--warm")) {
            warm = 1;
        } else {
            fprintf(stderr, "zinc: error: bench load: unknown option or missing value '%s'\n",
                    argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!dir) {
        usage(stderr);
        return 2;
    }
    zn_model_dims d;
    zn_train_llama *l = NULL;
    zn_st *st = NULL;
    span *sp = NULL;
    uint32_t *c_plain = NULL, *c_zinc = NULL;
    FILE *cf = NULL;
    int ret = 1, rc;
    char summary[4400];
    if ((rc = zn_model_dims_from_hf(&d, dir)) ||
        (rc = zn_train_llama_create(&l, &d, 1, 2, 0.02, 1)) ||
        (rc = zn_train_llama_load(l, dir, summary, sizeof summary)) ||
        (rc = zn_st_open(&st, dir))) {
        zn_cli_fail(rc, "bench load");
        goto out;
    }
    const zn_train_model *md = zn_train_llama_model(l);
    size_t nt = zn_st_count(st);
    int cap = 0, nsp = 0;
    for (int b = 0; b < zn_model_num_blocks(&d); b++)
        cap += zn_model_block_nparams(&d, b);
    sp = calloc((size_t)cap, sizeof *sp);
    c_plain = calloc(nt, sizeof *c_plain);
    c_zinc = calloc(nt, sizeof *c_zinc);
    if (!sp || !c_plain || !c_zinc) {
        zn_cli_fail(-ENOMEM, "bench load");
        goto out;
    }
    uint64_t data_bytes = 0;
    uint64_t off = 0;
    for (int b = 0; b < zn_model_num_blocks(&d); b++) {
        for (int i = 0; i < zn_model_block_nparams(&d, b); i++) {
            zn_param_info pi;
            zn_model_block_param(&d, b, i, &pi);
            if (pi.owner_block >= 0)
                continue;
            const zn_st_tensor *t = zn_st_find(st, pi.name);
            sp[nsp++] = (span){ off, (uint64_t)pi.numel, (size_t)(t - zn_st_tensor_at(st, 0)),
                                stored_dtype(t->dtype) };
            data_bytes += t->nbytes;
            off += (uint64_t)pi.numel;
        }
    }
    if (csv && !(cf = fopen(csv, "a"))) {
        fprintf(stderr, "zinc: error: --csv %s: %s\n", csv, strerror(errno));
        goto out;
    }
    printf("# zinc bench load: %s\n", summary);
    printf("#   %.3f GB of tensor data in %d file(s); %s; %d OpenMP threads\n",
           (double)data_bytes / 1e9, zn_st_num_shards(st),
           warm ? "page cache kept (--warm)" : "page cache dropped before each pass",
           omp_get_max_threads());
    printf("#   plain: one thread, sequential %zu MiB preads of every file; zinc: the\n"
           "#   trainer's init_params over every block (what zn_train_create runs)\n",
           PLAIN_CHUNK >> 20);
    printf("# %5s  %-6s %14s %10s %9s %8s %7s\n", "round", "path", "bytes", "seconds", "GB/s",
           "ratio", "#wrong");
    double best_ratio = 0, sum_ratio = 0;
    uint64_t wrong_total = 0;
    for (int r = 0; r < repeat; r++) {
        double tp = 0, tz = 0;
        uint64_t bp = 0;
        for (int s = 0; s < zn_st_num_shards(st) && !warm; s++)
            if ((rc = drop_cache(zn_st_shard_path(st, s)))) {
                zn_cli_fail(rc, "bench load");
                goto out;
            }
        if ((rc = plain_pass(st, c_plain, &tp, &bp))) {
            zn_cli_fail(rc, "bench load: plain pass");
            goto out;
        }
        for (int s = 0; s < zn_st_num_shards(st) && !warm; s++)
            if ((rc = drop_cache(zn_st_shard_path(st, s)))) {
                zn_cli_fail(rc, "bench load");
                goto out;
            }
        if ((rc = zinc_pass(md, st, sp, nsp, c_zinc, &tz))) {
            zn_cli_fail(rc, "bench load: zinc pass");
            goto out;
        }
        /* the plain pass's crc of every tensor the model uses is the truth */
        uint64_t wrong = 0;
        for (int k = 0; k < nsp; k++)
            wrong += c_plain[sp[k].st_index] != c_zinc[sp[k].st_index];
        wrong_total += wrong;
        double gp = (double)bp / 1e9 / tp, gz = (double)data_bytes / 1e9 / tz;
        double ratio = gz / gp;
        best_ratio = ratio > best_ratio ? ratio : best_ratio;
        sum_ratio += ratio;
        printf("  %5d  %-6s %14llu %10.3f %9.3f %8s %7d\n", r + 1, "plain",
               (unsigned long long)bp, tp, gp, "1.000", 0);
        printf("  %5d  %-6s %14llu %10.3f %9.3f %8.3f %7llu\n", r + 1, "zinc",
               (unsigned long long)data_bytes, tz, gz, ratio, (unsigned long long)wrong);
        if (cf)
            fprintf(cf, "%s,%d,%d,%llu,%.6f,%.6f,%.6f,%.6f,%.4f,%llu\n", dir, warm, r + 1,
                    (unsigned long long)data_bytes, tp, gp, tz, gz, ratio,
                    (unsigned long long)wrong);
    }
    printf("# zinc / plain: mean %.3f, best %.3f over %d rounds; %llu tensors wrong\n",
           sum_ratio / repeat, best_ratio, repeat, (unsigned long long)wrong_total);
    ret = wrong_total ? 1 : 0;
    if (wrong_total)
        fprintf(stderr, "zinc: error: bench load: %llu tensors read wrong\n",
                (unsigned long long)wrong_total);
out:
    if (cf)
        fclose(cf);
    free(sp);
    free(c_plain);
    free(c_zinc);
    zn_st_close(st);
    zn_train_llama_destroy(l);
    return ret;
}
