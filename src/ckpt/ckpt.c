/* Checkpoints: save a trainer's state crash-safely (temporary folder, every
 * file fsynced, manifest with sizes and crc32c last, rename, fsync of the
 * parent, then `latest`), open and verify one, and load it into a trainer
 * of any placement. State is read and written only through the rank's
 * local flat space (zn_train_block_share) and the optimizer units, so the
 * same code serves the sharded case. */
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
#include "offload/train-impl.h"
#include "zinc/comm.h"

#define PATHN ZN_CKPT_PATH

static const char *const state_file[3] = { "master.bin", "m.bin", "v.bin" };
static const char *const state_prefix[3] = { "master", "m", "v" };

zn_ckpt_save_options zn_ckpt_save_options_default(void)
{
    zn_ckpt_save_options o;
    memset(&o, 0, sizeof o);
    o.keep_last = 2;
    o.chunk_bytes = 64u << 20;
    return o;
}

/* ---- small file helpers -------------------------------------------------------*/
int zn_ckpt__fsync_path(const char *path, int is_dir)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
    if (fd < 0)
        return zn_set_error(-errno, "checkpoint: opening %s to fsync it: %s", path,
                            strerror(errno));
    if (fsync(fd) < 0) {
        int e = errno;
        close(fd);
        return zn_set_error(-e, "checkpoint: fsync %s: %s", path, strerror(e));
    }
    if (close(fd) < 0)
        return zn_set_error(-errno, "checkpoint: closing %s: %s", path, strerror(errno));
    return 0;
}

int zn_ckpt__mkdir_p(const char *path)
{
    char p[PATHN];
    if ((size_t)snprintf(p, sizeof p, "%s", path) >= sizeof p)
        return zn_set_error(-ENAMETOOLONG, "checkpoint: path too long: %s", path);
    for (char *c = p + 1;; c++) {
        if (*c != '/' && *c)
            continue;
        char keep = *c;
        *c = '\0';
        if (mkdir(p, 0755) < 0 && errno != EEXIST)
            return zn_set_error(-errno, "checkpoint: creating folder %s: %s", p, strerror(errno));
        *c = keep;
        if (!keep)
            break;
    }
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))
        return zn_set_error(-ENOTDIR, "checkpoint: %s is not a folder", path);
    return 0;
}

int zn_ckpt__pread(int fd, const char *path, uint64_t off, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t n = pread(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return zn_set_error(-errno, "checkpoint: reading %s at offset %" PRIu64 ": %s", path,
                                off, strerror(errno));
        if (n == 0)
            return zn_set_error(ZN_ECORRUPT, "checkpoint: %s ends at offset %" PRIu64
                                " (truncated)", path, off);
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

/* Writes a small file whole and fsyncs it. */
static int write_small(const char *path, const char *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return zn_set_error(-errno, "checkpoint: creating %s: %s", path, strerror(errno));
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, data + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            return zn_set_error(-e, "checkpoint: writing %s: %s", path, strerror(e));
        }
        done += (size_t)n;
    }
    if (fsync(fd) < 0) {
        int e = errno;
        close(fd);
        return zn_set_error(-e, "checkpoint: fsync %s: %s", path, strerror(e));
    }
    if (close(fd) < 0)
        return zn_set_error(-errno, "checkpoint: closing %s: %s", path, strerror(errno));
    return 0;
}

/* Size and crc32c of a whole file. */
static int file_crc(const char *path, uint64_t *bytes, uint32_t *crc)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zn_set_error(-errno, "checkpoint: opening %s: %s", path, strerror(errno));
    size_t cap = 1u << 20;
    char *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return zn_set_error(-ENOMEM, "checkpoint: out of memory");
    }
    uint32_t c = 0;
    uint64_t total = 0;
    int rc = 0;
    for (;;) {
        ssize_t n = read(fd, buf, cap);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = zn_set_error(-errno, "checkpoint: reading %s: %s", path, strerror(errno));
            break;
        }
        if (n == 0)
            break;
        c = zn_crc32c(c, buf, (size_t)n);
        total += (uint64_t)n;
    }
    free(buf);
    close(fd);
    *bytes = total;
    *crc = c;
    return rc;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)f;
    if ((flag == FTW_DP ? rmdir(p) : unlink(p)) < 0 && errno != ENOENT)
        zn_warn("checkpoint: removing %s: %s", p, strerror(errno));
    return 0;
}

static void rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return;
    nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static void point(const zn_ckpt_save_options *o, const char *where)
{
    if (o->point)
        o->point(o->point_user, where);
}

/* ---- one state file written through the I/O engine ---------------------------
 * The file is a one-path swap space in the rank's folder (preallocated, so a
 * full disk shows before any data is written) whose extents are allocated
 * back to back: every chunk but the last is a multiple of the engine's block,
 * so extent k starts where extent k-1 ended and the swap file is the state's
 * bytes in order. At the end it is cut to size, fsynced and renamed. */
typedef struct {
    zn_aio *aio;
    zn_swap *swap;
    int k;
    uint64_t total, done, bs;
    uint32_t crc;
    char dir[PATHN + 32];
} sfile;

static int sfile_open(sfile *f, zn_aio *aio, const char *dir, int k, uint64_t total)
{
    memset(f, 0, sizeof *f);
    f->aio = aio;
    f->k = k;
    f->total = total;
    f->bs = zn_aio_get_config(aio)->block_size;
    snprintf(f->dir, sizeof f->dir, "%s", dir);
    if (!total)
        return 0;
    zn_swap_config sc = zn_swap_config_default();
    sc.npaths = 1;
    sc.paths[0] = dir;
    sc.bytes = total;
    sc.keep_files = 1;
    sc.file_prefix = state_prefix[k];
    int rc = zn_swap_create(&f->swap, aio, &sc);
    if (rc)
        return zn_error_prefix(rc, "checkpoint: %s/%s (%s)", dir, state_file[k],
                               zn_strerror(rc));
    return 0;
}

static int sfile_write(sfile *f, const void *buf, uint64_t len)
{
    if (!len)
        return 0;
    if (f->done + len > f->total || (f->done + len < f->total && len % f->bs))
        return zn_set_error(ZN_EINTERNAL, "checkpoint: chunk of %" PRIu64 " bytes at %" PRIu64
                            " of %s (block %" PRIu64 ")", len, f->done, state_file[f->k], f->bs);
    char name[64];
    snprintf(name, sizeof name, "%s @%" PRIu64, state_file[f->k], f->done);
    zn_extent e;
    int rc = zn_swap_alloc(f->swap, len, name, &e);
    if (rc)
        return zn_error_prefix(rc, "checkpoint: %s/%s", f->dir, state_file[f->k]);
    if (e.offset != f->done)
        return zn_set_error(ZN_EINTERNAL, "checkpoint: %s chunk placed at %" PRIu64 ", not %" PRIu64,
                            state_file[f->k], e.offset, f->done);
    zn_aio_handle h;
    if ((rc = zn_aio_submit_write(f->aio, &e, buf, len, &h)))
        return zn_error_prefix(rc, "checkpoint: %s/%s", f->dir, state_file[f->k]);
    f->crc = zn_crc32c(f->crc, buf, len); /* while the write is in flight */
    if ((rc = zn_aio_wait(f->aio, h)))
        return zn_error_prefix(rc, "checkpoint: writing %s/%s at offset %" PRIu64 "", f->dir,
                               state_file[f->k], f->done);
    f->done += len;
    return 0;
}

static int sfile_finish(sfile *f)
{
    char final[PATHN + 64], swp[PATHN + 64];
    snprintf(final, sizeof final, "%s/%s", f->dir, state_file[f->k]);
    if (f->done != f->total)
        return zn_set_error(ZN_EINTERNAL, "checkpoint: %s: %" PRIu64 " of %" PRIu64 " bytes",
                            final, f->done, f->total);
    if (!f->swap)
        return write_small(final, "", 0);
    snprintf(swp, sizeof swp, "%s", zn_swap_file_path(f->swap, 0));
    zn_swap_destroy(f->swap);
    f->swap = NULL;
    if (truncate(swp, (off_t)f->total) < 0)
        return zn_set_error(-errno, "checkpoint: truncating %s: %s", swp, strerror(errno));
    if (rename(swp, final) < 0)
        return zn_set_error(-errno, "checkpoint: renaming %s to %s: %s", swp, final,
                            strerror(errno));
    return zn_ckpt__fsync_path(final, 0);
}

static void sfile_abort(sfile *f)
{
    zn_swap_destroy(f->swap); /* the file goes with the temporary folder */
    f->swap = NULL;
}

/* ---- ranks agree ---------------------------------------------------------------*/
/* Every rank's status: a local failure stays as it is; a rank that
 * succeeded learns that another failed. */
static int agree(zn_trainer *tr, int rc)
{
    struct zn_comm *c = zn_train_comm(tr);
    if (!c || zn_train_world(tr) <= 1)
        return rc;
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", zn_last_error());
    float f = rc ? 1.0f : 0.0f, g = 0;
    int r2 = zn_comm_allreduce(c, &f, &g, 1, ZN_DTYPE_F32, ZN_REDUCE_MAX);
    if (rc)
        return zn_set_error(rc, "%s", keep);
    if (r2)
        return zn_error_prefix(r2, "checkpoint: ranks agreeing");
    if (g > 0)
        return zn_set_error(-EIO, "checkpoint: another rank failed to save its part");
    return 0;
}

/* ---- save: this rank's files ----------------------------------------------------*/
static int make_engine(zn_trainer *tr, const zn_ckpt_save_options *o, uint64_t bs, zn_aio **out)
{
    zn_aio_config ac = zn_aio_config_default();
    ac.block_size = (size_t)bs;
    ac.queue_depth = (int)tr->cfg.aio.queue_depth;
    ac.intra_op_parallelism = (int)tr->cfg.aio.intra_op_parallelism;
    ac.single_submit = tr->cfg.aio.single_submit;
    ac.overlap_events = tr->cfg.aio.overlap_events;
    ac.crc = 0; /* the checkpoint keeps its own crc32c per file */
    ac.fault_hook = o->fault_hook;
    ac.fault_user = o->fault_user;
    int rc = zn_aio_create(out, &ac);
    return rc ? zn_error_prefix(rc, "checkpoint: I/O engine") : 0;
}

/* States in memory: written straight from the trainer's arrays; on the
 * device, through the pinned state staging (chunk <= its size). */
static int save_flat(zn_trainer *tr, zn_aio *aio, const char *rdir, uint64_t chunk,
                     uint32_t crc[3])
{
    float *arr[3] = { tr->master, tr->mom, tr->var };
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) {
        sfile f;
        uint64_t total = tr->P * 4;
        if ((rc = sfile_open(&f, aio, rdir, k, total)))
            return rc;
        void *reg_buf = tr->dopt ? tr->ostage : (void *)arr[k];
        uint64_t reg_len = tr->dopt ? (total < chunk ? total : chunk) : total;
        int reg = total ? zn_aio_register_buffer(aio, reg_buf, reg_len) : -1;
        for (uint64_t off = 0; off < total && !rc; off += chunk) {
            uint64_t len = total - off < chunk ? total - off : chunk;
            const char *src = (const char *)arr[k] + off;
            if (tr->dopt) {
                if ((rc = zn_dev_copy_d2h(tr->dev, tr->s_h2d, tr->ostage, src, len)) ||
                    (rc = zn_dev_stream_sync(tr->dev, tr->s_h2d)))
                    break;
                src = tr->ostage;
            }
            rc = sfile_write(&f, src, len);
        }
        if (reg >= 0)
            zn_aio_unregister_buffer(aio, reg);
        if (rc) {
            sfile_abort(&f);
            return rc;
        }
        if ((rc = sfile_finish(&f)))
            return rc;
        crc[k] = f.crc;
    }
    return 0;
}

/* States on NVMe: unit by unit into the first optimizer slot's staging
 * (16 U bytes), written out in chunks of C <= 8 U bytes; what is left over
 * moves to the front. */
static int save_nvme(zn_trainer *tr, zn_aio *aio, const char *rdir, uint32_t crc[3])
{
    zn_opt_slot *sl = &tr->oslot[0];
    char *B = (char *)sl->master;
    uint64_t bs = zn_aio_get_config(aio)->block_size;
    uint64_t C = 8 * tr->U / bs * bs;
    int reg = zn_aio_register_buffer(aio, B, tr->U * 16);
    int rc = 0;
    sl->unit = -1;
    for (int k = 0; k < 3 && !rc; k++) {
        sfile f;
        if ((rc = sfile_open(&f, aio, rdir, k, tr->P * 4)))
            break;
        uint64_t fill = 0;
        for (int u = 0; u < tr->n_units && !rc; u++) {
            zn_unit *un = &tr->units[u];
            int id = k == 0 ? un->master_id : k == 1 ? un->m_id : un->v_id;
            if (k > 0 && atomic_load(&un->mv_zero)) {
                memset(B + fill, 0, un->n * 4);  /* never written: the initial zeros */
            } else {
                zn_io_req r;
                rc = zn_ioq_submit(&tr->rq, &r, 0, &zn_tier_get(&tr->tm, id)->ext, B + fill,
                                   un->n * 4, "checkpoint read");
                int r2 = zn_ioq_wait(&tr->rq, &r);
                if (!rc)
                    rc = r2;
            }
            fill += un->n * 4;
            while (!rc && fill >= C) {
                rc = sfile_write(&f, B, C);
                memmove(B, B + C, fill - C);
                fill -= C;
            }
        }
        if (!rc && fill)
            rc = sfile_write(&f, B, fill);
        if (rc) {
            sfile_abort(&f);
            break;
        }
        if ((rc = sfile_finish(&f)))
            break;
        crc[k] = f.crc;
    }
    if (reg >= 0)
        zn_aio_unregister_buffer(aio, reg);
    return rc;
}

static json_t *shares_json(const zn_trainer *tr)
{
    json_t *a = json_array();
    for (int b = 0; a && b < tr->L; b++) {
        zn_block_share s;
        zn_train_block_share(tr, b, &s);
        json_array_append_new(a, json_pack("[III]", (json_int_t)s.shard_off, (json_int_t)s.len,
                                           (json_int_t)s.local_off));
    }
    return a;
}

static int save_rank(zn_trainer *tr, const zn_ckpt_save_options *o, const char *tmp)
{
    int rank = zn_train_rank(tr), rc;
    char rdir[PATHN + 32], path[PATHN + 64];
    snprintf(rdir, sizeof rdir, "%s/rank-%d", tmp, rank);
    if (mkdir(rdir, 0755) < 0)
        return zn_set_error(-errno, "checkpoint: creating %s: %s", rdir, strerror(errno));
    bool nvme = tr->oopt == ZN_OFFLOAD_NVME;
    uint64_t bs = (uint64_t)tr->cfg.aio.block_size;
    if (nvme)
        while (bs > 4096 && bs > 8 * tr->U)
            bs /= 2;
    if (tr->dopt)  /* chunks go through the state staging */
        while (bs > 4096 && bs > tr->ostage_bytes)
            bs /= 2;
    uint64_t chunk = o->chunk_bytes ? o->chunk_bytes : 64u << 20;
    if (tr->dopt && chunk > tr->ostage_bytes)
        chunk = tr->ostage_bytes;
    chunk = chunk < bs ? bs : chunk / bs * bs;
    zn_aio *aio = NULL;
    if ((rc = make_engine(tr, o, bs, &aio)))
        return rc;
    uint32_t crc[3] = { 0, 0, 0 };
    uint64_t t0 = zn_now_ns();
    rc = nvme ? save_nvme(tr, aio, rdir, crc) : save_flat(tr, aio, rdir, chunk, crc);
    zn_aio_destroy(aio);
    if (rc)
        return rc;
    zn_debug("checkpoint: rank %d wrote %" PRIu64 " bytes in %.3f s", rank, tr->P * 12,
             (double)(zn_now_ns() - t0) * 1e-9);
    point(o, "data");
    json_t *files = json_object();
    for (int k = 0; k < 3; k++)
        json_object_set_new(files, state_file[k], json_pack("{sIsI}", "bytes",
                            (json_int_t)(tr->P * 4), "crc32c", (json_int_t)crc[k]));
    json_t *rj = json_pack("{sisisIsoso}", "rank", rank, "world", zn_train_world(tr),
                           "local_params", (json_int_t)tr->P, "shares", shares_json(tr),
                           "files", files);
    char *text = rj ? json_dumps(rj, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
    json_decref(rj);
    if (!text)
        return zn_set_error(-ENOMEM, "checkpoint: out of memory");
    snprintf(path, sizeof path, "%s/rank.json", rdir);
    rc = write_small(path, text, strlen(text));
    free(text);
    if (!rc)
        rc = zn_ckpt__fsync_path(rdir, 1);
    if (!rc)
        point(o, "rank");
    return rc;
}

/* ---- save: rank 0 completes the checkpoint ----------------------------------------*/
static json_t *scaler_json(const zn_loss_scaler *s)
{
    char sc[64], fa[64], mn[64];
    /* hex floats: exact, and no reals in the manifest (its crc is over
     * jansson's serialisation, which must be stable) */
    snprintf(sc, sizeof sc, "%a", s->scale);
    snprintf(fa, sizeof fa, "%a", s->factor);
    snprintf(mn, sizeof mn, "%a", s->min_scale);
    return json_pack("{sssisssIsisisssIsIsI}", "scale", sc, "dynamic", s->dynamic, "factor", fa,
                     "window", (json_int_t)s->window, "hysteresis", s->hysteresis,
                     "cur_hysteresis", s->cur_hysteresis, "min_scale", mn,
                     "iter", (json_int_t)s->iter, "last_overflow_iter",
                     (json_int_t)s->last_overflow_iter, "overflows", (json_int_t)s->overflows);
}

static int add_file(json_t *files, const char *dir, const char *rel)
{
    char path[PATHN];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    uint64_t bytes = 0;
    uint32_t crc = 0;
    int rc = file_crc(path, &bytes, &crc);
    if (rc)
        return rc;
    json_object_set_new(files, rel, json_pack("{sIsI}", "bytes", (json_int_t)bytes, "crc32c",
                                             (json_int_t)crc));
    return 0;
}

/* Dumps a manifest with its own crc32c (over the compact, key-sorted
 * serialisation of everything else) added. */
static char *manifest_text(json_t *m)
{
    char *body = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
    if (!body)
        return NULL;
    uint32_t crc = zn_crc32c(0, body, strlen(body));
    free(body);
    json_object_set_new(m, "manifest_crc32c", json_integer((json_int_t)crc));
    return json_dumps(m, JSON_INDENT(1) | JSON_SORT_KEYS);
}

static int write_latest(const char *dir, const char *name)
{
    char tmp[PATHN + 64], fin[PATHN + 16], text[80];
    snprintf(tmp, sizeof tmp, "%s/.latest.tmp-%ld", dir, (long)getpid());
    snprintf(fin, sizeof fin, "%s/latest", dir);
    snprintf(text, sizeof text, "%s\n", name);
    int rc = write_small(tmp, text, strlen(text));
    if (!rc && rename(tmp, fin) < 0)
        rc = zn_set_error(-errno, "checkpoint: renaming %s to %s: %s", tmp, fin, strerror(errno));
    if (rc)
        unlink(tmp);
    return rc ? rc : zn_ckpt__fsync_path(dir, 1);
}

static int step_of(const char *name, long long *step)
{
    if (strncmp(name, "step-", 5) || strlen(name) < 13)
        return 0;
    char *end;
    *step = strtoll(name + 5, &end, 10);
    return !*end && *step >= 0;
}

static int cmp_desc(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Removes complete checkpoints beyond the newest keep_last (never `keep`),
 * and temporary folders of saves whose process is gone. */
static void prune(const char *dir, int keep_last, const char *keep)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    long long steps[4096];
    int n = 0;
    char path[PATHN];
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        const char *t = strstr(e->d_name, ".tmp-");
        if ((!strncmp(e->d_name, ".step-", 6) || !strncmp(e->d_name, ".latest", 7)) && t) {
            long pid = strtol(t + 5, NULL, 10);
            if (pid > 0 && pid != (long)getpid() && kill((pid_t)pid, 0) < 0 && errno == ESRCH) {
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                zn_debug("checkpoint: removing %s (left by a save that did not finish)", path);
                rm_rf(path);
            }
        } else if (step_of(e->d_name, &s) && n < 4096) {
            steps[n++] = s;
        }
    }
    closedir(d);
    if (keep_last <= 0)
        return;
    qsort(steps, (size_t)n, sizeof *steps, cmp_desc);
    for (int i = keep_last; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "step-%08lld", steps[i]);
        if (!strcmp(name, keep))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, name);
        rm_rf(path);
    }
}

static int finish(zn_trainer *tr, const zn_ckpt_save_options *o, const char *tmp,
                  const char *final, const char *name)
{
    int rc = 0, world = zn_train_world(tr);
    char path[PATHN];
    json_t *files = json_object(), *ranks = json_array(), *blocks = json_array();
    json_t *m = NULL;
    char *text = NULL;
    if (!files || !ranks || !blocks) {
        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    if (o->dims) {
        snprintf(path, sizeof path, "%s/config.json", tmp);
        if ((rc = zn_model_dims_write_hf(o->dims, path)) ||
            (rc = zn_ckpt__fsync_path(path, 0)) || (rc = add_file(files, tmp, "config.json")))
            goto out;
        /* LoRA: the state is the adapters; say which (PEFT's file) */
        if (o->dims->lora.r > 0) {
            snprintf(path, sizeof path, "%s/adapter_config.json", tmp);
            if ((rc = zn_lora_write_peft_config(&o->dims->lora, path, NULL)) ||
                (rc = zn_ckpt__fsync_path(path, 0)) ||
                (rc = add_file(files, tmp, "adapter_config.json")))
                goto out;
        }
    }
    for (int r = 0; r < world; r++) {
        char rel[64];
        snprintf(rel, sizeof rel, "rank-%d/rank.json", r);
        snprintf(path, sizeof path, "%s/%s", tmp, rel);
        json_error_t je;
        json_t *rj = json_load_file(path, 0, &je);
        if (!rj) {
            rc = zn_set_error(ZN_ECORRUPT, "checkpoint: %s: %s", path, je.text);
            goto out;
        }
        json_array_append_new(ranks, rj);
        if ((rc = add_file(files, tmp, rel)))
            goto out;
        json_t *rf = json_object_get(rj, "files");
        const char *fname;
        json_t *fv;
        json_object_foreach(rf, fname, fv)
        {
            snprintf(rel, sizeof rel, "rank-%d/%s", r, fname);
            json_object_set(files, rel, fv);
        }
    }
    for (int b = 0; b < tr->L; b++)
        json_array_append_new(blocks,
                              json_integer((json_int_t)(tr->blocks[b].n - tr->blocks[b].frozen)));
    uint64_t total = 0;
    for (int b = 0; b < tr->L; b++)
        total += tr->blocks[b].n;
    /* "o": the manifest takes these references over (jansson steals them
     * even when packing fails) */
    m = json_pack("{sssisIsIsisIsosososo}", "format", ZN_CKPT_FORMAT, "version", ZN_CKPT_VERSION,
                  "step", (json_int_t)tr->step, "steps_run", (json_int_t)tr->steps_run,
                  "world_size", world, "total_params", (json_int_t)total, "blocks", blocks,
                  "ranks", ranks, "files", files, "scaler", scaler_json(&tr->scaler));
    files = ranks = blocks = NULL;
    if (!m) {
        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory building the manifest");
        goto out;
    }
    json_object_set_new(m, "config", o->config_text ? json_string(o->config_text) : json_null());
    json_object_set_new(m, "client", json_string(o->client_json ? o->client_json : "{}"));
    json_object_set_new(m, "lr_iteration", json_integer((json_int_t)tr->step));
    json_object_set_new(m, "param_dtype", json_string(zn_dtype_name(tr->pdt)));
    if (!(text = manifest_text(m))) {
        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory writing the manifest");
        goto out;
    }
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    if ((rc = write_small(path, text, strlen(text))))
        goto out;
    point(o, "manifest");
    if ((rc = zn_ckpt__fsync_path(tmp, 1)))
        goto out;
    /* into place: a folder of the same name (a re-save of a step, e.g. after
     * resuming) is swapped out atomically, never removed first */
    struct stat st;
    if (stat(final, &st) == 0) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) < 0) {
            rc = zn_set_error(-errno, "checkpoint: exchanging %s with %s: %s", tmp, final,
                              strerror(errno));
            goto out;
        }
        rm_rf(tmp); /* the old one */
    } else if (rename(tmp, final) < 0) {
        rc = zn_set_error(-errno, "checkpoint: renaming %s to %s: %s", tmp, final,
                          strerror(errno));
        goto out;
    }
    point(o, "rename");
    if ((rc = zn_ckpt__fsync_path(o->dir, 1)))
        goto out;
    if ((rc = write_latest(o->dir, name)))
        goto out;
    point(o, "latest");
    prune(o->dir, o->keep_last, name);
    point(o, "prune");
out:
    free(text);
    json_decref(m);
    json_decref(files);
    json_decref(ranks);
    json_decref(blocks);
    return rc;
}

int zn_ckpt_save(zn_trainer *tr, const zn_ckpt_save_options *o, char *out_path, size_t out_len)
{
    if (!tr || !o || !o->dir || !o->dir[0])
        return zn_set_error(ZN_EARG, "checkpoint: no trainer or no folder");
    if (tr->bad)
        return zn_set_error(ZN_ECORRUPT, "checkpoint: the trainer failed in an earlier step; "
                            "its state is not saved");
    /* the last step's optimizer job first (it may still be writing state) */
    int rank = zn_train_rank(tr), world = zn_train_world(tr), rc = zn_train_sync(tr);
    char name[64], final[PATHN], tmp[PATHN] = "";
    snprintf(name, sizeof name, "step-%08lld", (long long)tr->step);
    if ((size_t)snprintf(final, sizeof final, "%s/%s", o->dir, name) >= sizeof final - 64)
        return zn_set_error(-ENAMETOOLONG, "checkpoint: folder name too long: %s", o->dir);
    uint64_t t0 = zn_now_ns();
    point(o, "begin");
    if (rank == 0 && !rc) {
        rc = zn_ckpt__mkdir_p(o->dir);
        snprintf(tmp, sizeof tmp, "%s/.%s.tmp-%ld", o->dir, name, (long)getpid());
        if (!rc && mkdir(tmp, 0755) < 0)
            rc = zn_set_error(-errno, "checkpoint: creating %s: %s", tmp, strerror(errno));
    }
    rc = agree(tr, rc);
    if (world > 1 && !rc) {
        int r2 = zn_comm_broadcast(zn_train_comm(tr), tmp, sizeof tmp, 0);
        if (r2)
            rc = zn_error_prefix(r2, "checkpoint: sharing the folder name");
    }
    if (!rc) {
        point(o, "tmpdir");
        rc = agree(tr, save_rank(tr, o, tmp));
    }
    if (!rc && rank == 0)
        rc = finish(tr, o, tmp, final, name);
    rc = agree(tr, rc);
    if (rc) {
        if (rank == 0 && tmp[0]) {
            char keep[1024];
            snprintf(keep, sizeof keep, "%s", zn_last_error());
            rm_rf(tmp);
            zn_set_error(rc, "%s", keep);
        }
        return rc;
    }
    zn_debug("checkpoint: %s saved in %.3f s", final, (double)(zn_now_ns() - t0) * 1e-9);
    if (out_path && out_len)
        snprintf(out_path, out_len, "%s", final);
    return 0;
}

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
    if (!step_of(name, &s))
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
        for (int r = 0; r < ck->world; r++)
            free(ck->ranks[r].sh);
    free(ck->ranks);
    for (int i = 0; i < ck->nfiles; i++)
        free(ck->files[i].name);
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
            if (json_unpack(json_array_get(sh, (size_t)b), "[III]", &so, &len, &lo) || so < 0 ||
                len < 0 || lo < 0 || (uint64_t)so + (uint64_t)len > ck->blocks[b] ||
                (uint64_t)lo + (uint64_t)len > cr->local_params)
                BAD("checkpoint %s: manifest.json: rank %d's share of block %d", ck->path, r, b);
            cr->sh[b] = (zn_ckpt_share){ (uint64_t)so, (uint64_t)len, (uint64_t)lo };
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
            snprintf(rel, sizeof rel, "rank-%d/%s", r, state_file[k]);
            const zn_ckpt_file *f = zn_ckpt__file(ck, rel);
            if (!f)
                BAD("checkpoint %s: manifest.json does not list %s", ck->path, rel);
            if (f->bytes != ck->ranks[r].local_params * 4)
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
        if (zn_ckpt__file(ck, "adapter_config.json") &&
            (rc = zn_lora_read_peft_config(ck->path, &ck->dims.lora)))
            goto fail;
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

/* Streams a file through crc32c in bounded reads, comparing with its entry. */
static int verify_file(const zn_ckpt *ck, const zn_ckpt_file *f, char *buf, size_t cap)
{
    char p[PATHN + 512];
    snprintf(p, sizeof p, "%s/%s", ck->path, f->name);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s: %s", ck->path, f->name,
                            strerror(errno));
    uint32_t crc = 0;
    int rc = 0;
    for (uint64_t off = 0; off < f->bytes && !rc; off += cap) {
        size_t n = f->bytes - off < cap ? (size_t)(f->bytes - off) : cap;
        if (!(rc = zn_ckpt__pread(fd, p, off, buf, n)))
            crc = zn_crc32c(crc, buf, n);
    }
    close(fd);
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

/* ---- load ---------------------------------------------------------------------------*/
static int check_geometry(const zn_ckpt *ck, zn_trainer *tr)
{
    int world = zn_train_world(tr), rank = zn_train_rank(tr);
    if (ck->world != world)
        return zn_set_error(ZN_ECONFIG, "checkpoint %s was saved by %d rank(s); this run has %d: "
                            "resuming with a different world size is not supported", ck->path,
                            ck->world, world);
    if (ck->nblocks != tr->L) {
        uint64_t a = 0, b2 = 0;
        for (int b = 0; b < ck->nblocks; b++)
            a += ck->blocks[b];
        for (int b = 0; b < tr->L; b++) {
            zn_block_share s;
            zn_train_block_share(tr, b, &s);
            b2 += s.n;
        }
        if (a == b2)
            return zn_set_error(ZN_ECONFIG, "checkpoint %s holds this model cut into %d blocks; "
                                "this zinc streams it in %d (the vocabulary in parts): resume "
                                "is not possible, but `zinc export` of the checkpoint gives a "
                                "model folder to start from (model.path)", ck->path,
                                ck->nblocks, tr->L);
        return zn_set_error(ZN_ECONFIG, "checkpoint %s is of another model: %d blocks, this "
                            "model has %d", ck->path, ck->nblocks, tr->L);
    }
    for (int b = 0; b < tr->L; b++) {
        zn_block_share s;
        zn_train_block_share(tr, b, &s);
        if (ck->blocks[b] != s.n)
            return zn_set_error(ZN_ECONFIG, "checkpoint %s is of another model: block %d has "
                                "%" PRIu64 " parameters, this model's has %" PRIu64, ck->path, b,
                                ck->blocks[b], s.n);
        const zn_ckpt_share *c = &ck->ranks[rank].sh[b];
        if (c->shard_off != s.shard_off || c->len != s.len || c->local_off != s.local_off)
            return zn_set_error(ZN_ECONFIG, "checkpoint %s: rank %d's share of block %d differs "
                                "from this run's (sharding changed)", ck->path, rank, b);
    }
    if (ck->ranks[rank].local_params != tr->P)
        return zn_set_error(ZN_ECONFIG, "checkpoint %s: rank %d holds %" PRIu64 " parameters, "
                            "this run %" PRIu64, ck->path, rank, ck->ranks[rank].local_params,
                            tr->P);
    return 0;
}

/* Sends unit u's working parameters (from fp32 master values) to their
 * homes and waits until they are there. */
static int regen_params(zn_trainer *tr, int u, const float *master, void *p16)
{
    zn_unit *un = &tr->units[u];
    zn_opt_slot *s = &tr->oslot[0];
    const void *src = master;
    int rc;
    if (tr->pdt != ZN_DTYPE_F32) {
        if ((rc = zn_convert(p16, tr->pdt, master, ZN_DTYPE_F32, un->n)))
            return rc;
        src = p16;
    }
    int npwr = 0;
    bool h2d = false;
    rc = zn_optsched_params_out(tr, u, src, s->pwr, &npwr, s->h2d_done, &h2d);
    for (int i = 0; i < npwr; i++) {
        int r2 = zn_ioq_wait(&tr->wq, &s->pwr[i]);
        if (!rc)
            rc = r2;
    }
    if (h2d) {
        int r2 = zn_dev_event_sync(tr->dev, s->h2d_done);
        if (!rc)
            rc = r2;
    }
    return rc;
}

static void restore_scaler(json_t *j, zn_loss_scaler *s)
{
    const char *sc = json_string_value(json_object_get(j, "scale"));
    if (sc)
        s->scale = strtod(sc, NULL);
    s->cur_hysteresis = (int)json_integer_value(json_object_get(j, "cur_hysteresis"));
    s->iter = json_integer_value(json_object_get(j, "iter"));
    s->last_overflow_iter = json_integer_value(json_object_get(j, "last_overflow_iter"));
    s->overflows = (uint64_t)json_integer_value(json_object_get(j, "overflows"));
}

int zn_ckpt_load(zn_ckpt *ck, zn_trainer *tr)
{
    if (tr->bad)
        return zn_set_error(ZN_ECORRUPT, "checkpoint: the trainer failed earlier");
    int rc = zn_train_sync(tr), rank = zn_train_rank(tr);
    if (!rc)
        rc = check_geometry(ck, tr);
    if (rc)
        return rc;
    int fd[3] = { -1, -1, -1 };
    char path[3][PATHN + 64];
    const zn_ckpt_file *f[3];
    uint32_t crc[3] = { 0, 0, 0 };
    for (int k = 0; k < 3; k++) {
        char rel[64];
        snprintf(rel, sizeof rel, "rank-%d/%s", rank, state_file[k]);
        f[k] = zn_ckpt__file(ck, rel);
        snprintf(path[k], sizeof path[k], "%s/%s", ck->path, rel);
        fd[k] = open(path[k], O_RDONLY | O_CLOEXEC);
        if (fd[k] < 0) {
            rc = zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s: %s", ck->path, rel,
                              strerror(errno));
            goto out;
        }
        posix_fadvise(fd[k], 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    uint64_t t0 = zn_now_ns();
    /* From here on the trainer's state is being replaced. */
    if (tr->dopt) {
        float *arr[3] = { tr->master, tr->mom, tr->var };
        const uint64_t chunk = tr->ostage_bytes;
        for (int k = 0; k < 3 && !rc; k++)
            for (uint64_t off = 0; off < tr->P * 4 && !rc; off += chunk) {
                size_t n = (size_t)(tr->P * 4 - off < chunk ? tr->P * 4 - off : chunk);
                if (!(rc = zn_ckpt__pread(fd[k], path[k], off, tr->ostage, n)) &&
                    !(rc = zn_dev_copy_h2d(tr->dev, tr->s_h2d, (char *)arr[k] + off, tr->ostage,
                                           n)) &&
                    !(rc = zn_dev_stream_sync(tr->dev, tr->s_h2d)))
                    crc[k] = zn_crc32c(crc[k], tr->ostage, n);
            }
        for (int u = 0; u < tr->n_units && !rc; u++)
            rc = zn_optsched_dev_regen(tr, u);
    } else if (tr->oopt != ZN_OFFLOAD_NVME) {
        float *arr[3] = { tr->master, tr->mom, tr->var };
        const uint64_t chunk = 64u << 20;
        for (int k = 0; k < 3 && !rc; k++)
            for (uint64_t off = 0; off < tr->P * 4 && !rc; off += chunk) {
                size_t n = (size_t)(tr->P * 4 - off < chunk ? tr->P * 4 - off : chunk);
                if (!(rc = zn_ckpt__pread(fd[k], path[k], off, (char *)arr[k] + off, n)))
                    crc[k] = zn_crc32c(crc[k], (char *)arr[k] + off, n);
            }
        for (int u = 0; u < tr->n_units && !rc; u++)
            rc = regen_params(tr, u, tr->master + tr->units[u].off, tr->pout_flat);
    } else {
        zn_opt_slot *s = &tr->oslot[0];
        float *dst[3] = { s->master, s->m, s->v };
        s->unit = -1;
        for (int u = 0; u < tr->n_units && !rc; u++) {
            zn_unit *un = &tr->units[u];
            int ids[3] = { un->master_id, un->m_id, un->v_id };
            zn_io_req w[3];
            int nw = 0;
            for (int k = 0; k < 3 && !rc; k++) {
                rc = zn_ckpt__pread(fd[k], path[k], un->off * 4, dst[k], un->n * 4);
                if (rc)
                    break;
                crc[k] = zn_crc32c(crc[k], dst[k], un->n * 4);
                rc = zn_ioq_submit(&tr->wq, &w[k], 1, &zn_tier_get(&tr->tm, ids[k])->ext,
                                   dst[k], un->n * 4, "checkpoint load");
                nw = k + 1;
            }
            for (int k = 0; k < nw; k++) {
                int r2 = zn_ioq_wait(&tr->wq, &w[k]);
                if (!rc)
                    rc = r2;
            }
            if (!rc)
                atomic_store(&un->mv_zero, false);  /* the checkpoint's m and v are home */
            if (!rc)
                rc = regen_params(tr, u, s->master, s->pout);
        }
    }
    for (int k = 0; k < 3 && !rc; k++)
        if (crc[k] != f[k]->crc)
            rc = zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s: crc32c 0x%08x, the manifest "
                              "says 0x%08x (corrupted)", ck->path, f[k]->name, crc[k], f[k]->crc);
    if (rc) {
        tr->bad = true; /* partly replaced: nothing it holds is valid now */
        goto out;
    }
    tr->step = ck->step;
    tr->steps_run = ck->steps_run;
    restore_scaler(json_object_get(ck->man, "scaler"), &tr->scaler);
    zn_debug("checkpoint: %s loaded in %.3f s", ck->path, (double)(zn_now_ns() - t0) * 1e-9);
out:
    for (int k = 0; k < 3; k++)
        if (fd[k] >= 0)
            close(fd[k]);
    return rc;
}
