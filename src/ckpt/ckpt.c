/* Checkpoints: save a trainer's state crash-safely (temporary folder, every
 * file fsynced, manifest with sizes and crc32c last, rename, fsync of the
 * parent, then `latest`). State is read only through the rank's local
 * flat space (zn_train_block_share) and the optimizer units, so the same
 * code serves the sharded case. ckpt_open.c opens and verifies one,
 * ckpt_load.c loads it into a trainer of any placement, ckpt_fs.c holds
 * the file helpers, ckpt_export.c writes HF and PEFT folders. */
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

const char *const zn_ckpt__state_file[3] = { "master.bin", "m.bin", "v.bin" };
const char *const zn_ckpt__state_prefix[3] = { "master", "m", "v" };

zn_ckpt_save_options zn_ckpt_save_options_default(void)
{
    zn_ckpt_save_options o;
    memset(&o, 0, sizeof o);
    o.keep_last = 2;
    o.chunk_bytes = 64u << 20;
    return o;
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
    zn_ckpt__pace *pace;   /* a background save's pacing, or NULL */
    const volatile sig_atomic_t *cancel;   /* zn_ckpt_save_options.cancel */
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
    sc.file_prefix = zn_ckpt__state_prefix[k];
    int rc = zn_swap_create(&f->swap, aio, &sc);
    if (rc)
        return zn_error_prefix(rc, "checkpoint: %s/%s (%s)", dir, zn_ckpt__state_file[k],
                               zn_strerror(rc));
    return 0;
}

static int sfile_write(sfile *f, const void *buf, uint64_t len)
{
    if (!len)
        return 0;
    if (f->done + len > f->total || (f->done + len < f->total && len % f->bs))
        return zn_set_error(ZN_EINTERNAL, "checkpoint: chunk of %" PRIu64 " bytes at %" PRIu64
                            " of %s (block %" PRIu64 ")", len, f->done, zn_ckpt__state_file[f->k], f->bs);
    /* a stop's cancel, seen before each write (a file of one chunk too) */
    if (f->cancel && *f->cancel)
        return zn_set_error(-ECANCELED, "checkpoint: %s/%s: cancelled by a stop", f->dir,
                            zn_ckpt__state_file[f->k]);
    char name[64];
    snprintf(name, sizeof name, "%s @%" PRIu64, zn_ckpt__state_file[f->k], f->done);
    zn_extent e;
    int rc = zn_swap_alloc(f->swap, len, name, &e);
    if (rc)
        return zn_error_prefix(rc, "checkpoint: %s/%s", f->dir, zn_ckpt__state_file[f->k]);
    if (e.offset != f->done)
        return zn_set_error(ZN_EINTERNAL, "checkpoint: %s chunk placed at %" PRIu64 ", not %" PRIu64,
                            zn_ckpt__state_file[f->k], e.offset, f->done);
    zn_aio_handle h;
    if ((rc = zn_aio_submit_write(f->aio, &e, buf, len, &h)))
        return zn_error_prefix(rc, "checkpoint: %s/%s", f->dir, zn_ckpt__state_file[f->k]);
    f->crc = zn_crc32c(f->crc, buf, len); /* while the write is in flight */
    if ((rc = zn_aio_wait(f->aio, h)))
        return zn_error_prefix(rc, "checkpoint: writing %s/%s at offset %" PRIu64 "", f->dir,
                               zn_ckpt__state_file[f->k], f->done);
    f->done += len;
    return f->pace ? zn_ckpt__pace_after(f->pace, len) : 0;
}

static int sfile_finish(sfile *f)
{
    char final[PATHN + 64], swp[PATHN + 64];
    snprintf(final, sizeof final, "%s/%s", f->dir, zn_ckpt__state_file[f->k]);
    if (f->done != f->total)
        return zn_set_error(ZN_EINTERNAL, "checkpoint: %s: %" PRIu64 " of %" PRIu64 " bytes",
                            final, f->done, f->total);
    if (!f->swap)
        return zn_ckpt__write_small(final, "", 0);
    snprintf(swp, sizeof swp, "%s", zn_swap_file_path(f->swap, 0));
    zn_swap_destroy(f->swap);
    f->swap = NULL;
    if (truncate(swp, (off_t)f->total) < 0)
        return zn_set_error(-errno, "checkpoint: truncating %s: %s", swp, strerror(errno));
    if (rename(swp, final) < 0)
        return zn_set_error(-errno, "checkpoint: renaming %s to %s: %s", swp, final,
                            strerror(errno));
    return zn_fs_fsync_path(final, 0);
}

static void sfile_abort(sfile *f)
{
    zn_swap_destroy(f->swap); /* the file goes with the temporary folder */
    f->swap = NULL;
}

/* ---- ranks agree ---------------------------------------------------------------*/
/* Every rank's status: a local failure stays as it is; a rank that
 * succeeded learns that another failed, or that another cancelled its part
 * for a stop (-ECANCELED: the save is dropped on every rank, none failed). */
static int agree(zn_trainer *tr, int rc)
{
    struct zn_comm *c = zn_train_comm(tr);
    if (!c || zn_train_world(tr) <= 1)
        return rc;
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", zn_last_error());
    float f = rc == -ECANCELED ? 1.0f : rc ? 2.0f : 0.0f, g = 0;
    int r2 = zn_comm_allreduce(c, &f, &g, 1, ZN_DTYPE_F32, ZN_REDUCE_MAX);
    if (rc)
        return zn_set_error(rc, "%s", keep);
    if (r2)
        return zn_error_prefix(r2, "checkpoint: ranks agreeing");
    if (g > 1)
        return zn_set_error(-EIO, "checkpoint: another rank failed to save its part");
    if (g > 0)
        return zn_set_error(-ECANCELED, "checkpoint: cancelled by a stop on another rank");
    return 0;
}

/* ---- save: this rank's files ----------------------------------------------------*/
static int make_engine(const zn_aio_config *run, const zn_ckpt_save_options *o, uint64_t bs,
                       zn_aio **out)
{
    zn_aio_config ac = zn_aio_config_default();
    ac.block_size = (size_t)bs;
    ac.queue_depth = run->queue_depth;
    ac.intra_op_parallelism = run->intra_op_parallelism;
    ac.single_submit = run->single_submit;
    ac.overlap_events = run->overlap_events;
    ac.crc = 0; /* the checkpoint keeps its own crc32c per file */
    ac.fault_hook = o->fault_hook;
    ac.fault_user = o->fault_user;
    int rc = zn_aio_create(out, &ac);
    return rc ? zn_error_prefix(rc, "checkpoint: I/O engine") : 0;
}

/* The sink of a state stream: the next chunk of its file. */
static int sfile_sink(void *user, const void *buf, uint64_t len)
{
    return sfile_write(user, buf, len);
}

static int save_stream(zn_trainer *tr, zn_aio *aio, const char *rdir, int k, uint64_t total,
                       uint64_t chunk, zn_ckpt__pace *pace,
                       const volatile sig_atomic_t *cancel, uint32_t *crc)
{
    sfile f;
    int rc = sfile_open(&f, aio, rdir, k, total);
    if (rc)
        return rc;
    f.pace = pace;
    f.cancel = cancel;
    if ((rc = zn_train_state_save(tr, k, chunk, aio, sfile_sink, &f))) {
        sfile_abort(&f);
        return rc;
    }
    if ((rc = sfile_finish(&f)))
        return rc;
    *crc = f.crc;
    return 0;
}

/* ---- a save by reference -------------------------------------------------------*/
typedef struct {
    uint64_t off, len;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Punches out of a linked swap file every range outside `keep` (the
 * parameters, gradients, the other copy of the optimizer states), inward
 * to whole pages, so that the checkpoint holds about what a copy would. A
 * file system that cannot punch keeps the whole file (said). */
static int punch_outside(const char *path, span *keep, size_t n)
{
    qsort(keep, n, sizeof *keep, cmp_span);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return zn_set_error(-e, "checkpoint: opening %s: %s", path, strerror(e));
    }
    const uint64_t pg = 4096, size = (uint64_t)st.st_size;
    uint64_t at = 0, punched = 0;
    int rc = 0;
    static int warned;
    for (size_t i = 0; i <= n && !rc; i++) {
        uint64_t end = i < n ? keep[i].off : size;
        uint64_t a = (at + pg - 1) / pg * pg, z = end / pg * pg;
        if (z > a) {
            if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a,
                          (off_t)(z - a)) < 0) {
                if (errno == EOPNOTSUPP || errno == ENOSYS) {
                    char sz[32];
                    zn_warn_once(&warned, "checkpoint: the file system of %s cannot punch "
                                 "holes: the checkpoint keeps the whole swap file (%s)", path,
                                 zn_format_size(size, sz, sizeof sz));
                    break;
                }
                rc = zn_set_error(-errno, "checkpoint: punching the unused ranges out of %s: "
                                  "%s", path, strerror(errno));
            }
            punched += z - a;
        }
        if (i < n && keep[i].off + keep[i].len > at)
            at = keep[i].off + keep[i].len;
    }
    if (!rc && fdatasync(fd) < 0)
        rc = zn_set_error(-errno, "checkpoint: fdatasync of %s: %s", path, strerror(errno));
    close(fd);
    if (!rc)
        zn_debug("checkpoint: %" PRIu64 " of the %" PRIu64 " bytes of %s punched out", punched,
                 size, path);
    return rc;
}

int zn_ckpt__punch_rank(const char *path, int rank)
{
    zn_ckpt *ck;
    int rc = zn_ckpt_open(&ck, path);
    if (rc)
        return rc;
    char swp[64], prefix[32];
    snprintf(swp, sizeof swp, "rank-%d/state.swp", rank);
    snprintf(prefix, sizeof prefix, "rank-%d/", rank);
    size_t n = 0, cap = 0;
    span *keep = NULL;
    bool any = false;
    for (int i = 0; i < ck->nfiles && !rc; i++) {
        const zn_ckpt_file *f = &ck->files[i];
        if (strncmp(f->name, prefix, strlen(prefix)))
            continue;
        for (int r = 0; r < f->nref; r++) {
            if (strcmp(f->ref[r], swp))
                continue;
            any = true;
            for (size_t k = 0; k < f->npc && !rc; k++) {
                if (f->pc[k].src != r)
                    continue;
                if (n == cap) {
                    size_t nc = cap ? 2 * cap : 64;
                    span *t = realloc(keep, nc * sizeof *t);
                    if (!t) {
                        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory");
                        break;
                    }
                    keep = t;
                    cap = nc;
                }
                keep[n++] = (span){ f->pc[k].off, f->pc[k].len };
            }
        }
    }
    if (!rc && any) {
        char fp[PATHN + 64];
        snprintf(fp, sizeof fp, "%s/%s", ck->path, swp);
        rc = punch_outside(fp, keep, n);
    }
    free(keep);
    zn_ckpt_close(ck);
    return rc;
}

/* Whether NAME in a checkpoint root is a temporary (.step-... or
 * .latest...) of a process that is gone: a save that did not finish. */
static bool stale_tmp(const char *name)
{
    const char *t = strstr(name, ".tmp-");
    if (!t || (strncmp(name, ".step-", 6) && strncmp(name, ".latest", 7)))
        return false;
    long pid = strtol(t + 5, NULL, 10);
    return pid > 0 && pid != (long)getpid() && kill((pid_t)pid, 0) < 0 && errno == ESRCH;
}

static void remove_stale(const char *dir, const char *name)
{
    char path[PATHN + 256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    zn_debug("checkpoint: removing %s (left by a save that did not finish)", path);
    zn_ckpt__rm_rf(path);
}

int zn_ckpt_punch_unlinked(const char *path)
{
    zn_ckpt *ck;
    int rc = zn_ckpt_open(&ck, path);
    if (rc)
        return rc;
    int world = ck->world;
    char p[PATHN], swp[PATHN + 64], root[PATHN];
    snprintf(p, sizeof p, "%s", ck->path);
    zn_ckpt_close(ck);
    /* a killed run's save in progress may link the same file: its
     * temporary folder goes first (as the next save's pruning would) */
    snprintf(root, sizeof root, "%s", p);
    char *sl = strrchr(root, '/');
    if (sl && sl != root)
        *sl = '\0';
    else
        snprintf(root, sizeof root, "%s", sl ? "/" : ".");
    DIR *d = opendir(root);
    for (struct dirent *e; d && (e = readdir(d));)
        if (stale_tmp(e->d_name))
            remove_stale(root, e->d_name);
    if (d)
        closedir(d);
    for (int r = 0; r < world && !rc; r++) {
        struct stat st;
        snprintf(swp, sizeof swp, "%s/rank-%d/state.swp", p, r);
        /* one name: no run's swap file is this inode any more */
        if (stat(swp, &st) == 0 && st.st_nlink == 1)
            rc = zn_ckpt__punch_rank(p, r);
    }
    return rc;
}

int zn_ckpt_punch(const char *path)
{
    zn_ckpt *ck;
    int rc = zn_ckpt_open(&ck, path);
    if (rc)
        return rc;
    int world = ck->world;
    char p[PATHN];
    snprintf(p, sizeof p, "%s", ck->path);
    zn_ckpt_close(ck);
    for (int r = 0; r < world && !rc; r++)
        rc = zn_ckpt__punch_rank(p, r);
    return rc;
}

static json_t *ref_json(const zn_ts_ref *r, const char *tail_name)
{
    json_t *pcs = json_array();
    for (size_t i = 0; pcs && i < r->npc; i++)
        json_array_append_new(pcs, json_pack("[iII]", r->pc[i].src, (json_int_t)r->pc[i].off,
                                             (json_int_t)r->pc[i].len));
    json_t *names = tail_name ? json_pack("[ss]", "state.swp", tail_name)
                              : json_pack("[s]", "state.swp");
    return json_pack("{sIsIs{soso}}", "bytes", (json_int_t)r->bytes, "crc32c",
                     (json_int_t)r->crc, "ref", "files", names, "pieces", pcs);
}

bool zn_ckpt_save_keeps_nvme(zn_trainer *tr, const char *dir)
{
    const char *swp = tr && dir && dir[0] ? zn_train_state_swap_file(tr) : NULL;
    struct stat a, b;
    if (!swp || stat(swp, &a) < 0)
        return false;
    /* the folder, or the nearest one above it that exists */
    char p[PATHN];
    snprintf(p, sizeof p, "%s", dir);
    while (stat(p, &b) < 0) {
        char *sl = strrchr(p, '/');
        if (!sl || sl == p) {
            snprintf(p, sizeof p, "%s", sl == p ? "/" : ".");
            if (stat(p, &b) < 0)
                return false;
            break;
        }
        *sl = '\0';
    }
    return a.st_dev == b.st_dev;
}

/* A save by reference of a rank whose optimizer state is on the NVMe
 * tier: the swap file, flushed, is linked into the rank's folder as
 * state.swp, each stream becomes pieces of it (an 8-bit moment's fp32
 * blocks, in memory, a small file beside it). A final save marks the
 * trainer failed (the file is the checkpoint's from here on) and the
 * ranges nothing refers to are punched out once the checkpoint is in place
 * (zn_ckpt__punch_rank); a live one (a step's commit) leaves both: the
 * steps go on writing the file's other ranges. Returns 1 with files[] set,
 * 0 when the state must be copied instead (no such state, or the link
 * cannot be made: another file system), or <0. */
static int save_by_ref(zn_trainer *tr, const char *rdir, json_t *files, bool live)
{
    const char *swp = zn_train_state_swap_file(tr);
    if (!swp)
        return 0;
    char link_path[PATHN + 64];
    snprintf(link_path, sizeof link_path, "%s/state.swp", rdir);
    int fd = open(swp, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zn_set_error(-errno, "checkpoint: opening %s: %s", swp, strerror(errno));
    int rc = fdatasync(fd) < 0 ? zn_set_error(-errno, "checkpoint: fdatasync of %s: %s", swp,
                                              strerror(errno)) : 0;
    close(fd);
    if (rc)
        return rc;
    if (link(swp, link_path) < 0) {
        if (errno == EXDEV || errno == EPERM || errno == EMLINK || errno == ENOTSUP) {
            zn_info("checkpoint: the swap file %s cannot be linked into %s (%s): the state on "
                    "NVMe is copied", swp, rdir, strerror(errno));
            return 0;
        }
        return zn_set_error(-errno, "checkpoint: linking %s as %s: %s", swp, link_path,
                            strerror(errno));
    }
    /* a final save: from here on the checkpoint's file is the trainer's
     * swap, no step may write it again */
    if (!live)
        zn_train_state_fail(tr);
    zn_ts_ref ref[3];
    memset(ref, 0, sizeof ref);
    for (int k = 0; k < 3 && !rc; k++) {
        rc = zn_train_state_ref(tr, k, &ref[k]);
        char tail[32], path[PATHN + 64];
        snprintf(tail, sizeof tail, "%s.f32.bin", zn_ckpt__state_prefix[k]);
        snprintf(path, sizeof path, "%s/%s", rdir, tail);
        if (!rc && ref[k].tail_len)
            rc = zn_ckpt__write_small(path, ref[k].tail, ref[k].tail_len);
        json_t *e = rc ? NULL : ref_json(&ref[k], ref[k].tail_len ? tail : NULL);
        if (!rc && (!e || json_object_set_new(files, zn_ckpt__state_file[k], e)))
            rc = zn_set_error(-ENOMEM, "checkpoint: out of memory");
    }
    if (!rc && live) {
        zn_debug("checkpoint: rank %d's optimizer state committed by reference (%s)",
                 zn_train_rank(tr), link_path);
    } else if (!rc) {
        char sz[32];
        zn_info("checkpoint: rank %d's optimizer state (%s) kept where it is on NVMe: %s "
                "linked into the checkpoint, not copied", zn_train_rank(tr),
                zn_format_size(ref[0].bytes + ref[1].bytes + ref[2].bytes, sz, sizeof sz),
                swp);
    }
    for (int k = 0; k < 3; k++)
        zn_ts_ref_free(&ref[k]);
    return rc ? rc : 1;
}

static json_t *shares_json(const zn_trainer *tr, int nblocks)
{
    json_t *a = json_array();
    for (int b = 0; a && b < nblocks; b++) {
        zn_block_share s;
        zn_train_block_share(tr, b, &s);
        json_array_append_new(a, json_pack("[III]", (json_int_t)s.shard_off, (json_int_t)s.len,
                                           (json_int_t)s.local_off));
    }
    return a;
}

/* This rank's files: its state streams and rank.json (in: the state as
 * the save began; pace: a background save's, or NULL). */
int zn_ckpt__save_rank(zn_trainer *tr, const zn_ckpt_save_options *o, const char *tmp,
                       const zn_train_state_info *inp, zn_ckpt__pace *pace, bool live_ref)
{
    int rank = zn_train_rank(tr), rc;
    char rdir[PATHN + 32], path[PATHN + 64];
    snprintf(rdir, sizeof rdir, "%s/rank-%d", tmp, rank);
    if (mkdir(rdir, 0755) < 0)
        return zn_set_error(-errno, "checkpoint: creating %s: %s", rdir, strerror(errno));
    zn_ckpt__point(o, "rank-dir");
    zn_train_state_info in = *inp;
    /* chunks of the state staging, when it goes through one, are whole
     * blocks of the engine */
    uint64_t bs = (uint64_t)in.aio.block_size;
    while (in.max_chunk && bs > 4096 && bs > in.max_chunk)
        bs /= 2;
    uint64_t chunk = o->chunk_bytes ? o->chunk_bytes : 64u << 20;
    if (in.max_chunk && chunk > in.max_chunk)
        chunk = in.max_chunk;
    chunk = chunk < bs ? bs : chunk / bs * bs;
    json_t *files = json_object();
    if (!files)
        return zn_set_error(-ENOMEM, "checkpoint: out of memory");
    uint64_t t0 = zn_now_ns();
    rc = (o->final_save || live_ref) && !pace ? save_by_ref(tr, rdir, files, live_ref) : 0;
    if (rc == 0 && live_ref) {
        zn_set_error(ZN_EINTERNAL, "checkpoint: a commit by reference found no state to link");
        rc = ZN_EINTERNAL;
    }
    if (rc == 0) {
        zn_aio *aio = NULL;
        uint32_t crc[3] = { 0, 0, 0 };
        rc = make_engine(&in.aio, o, bs, &aio);
        for (int k = 0; k < ZN_TS_COUNT && !rc; k++)
            rc = save_stream(tr, aio, rdir, k, in.bytes[k], chunk, pace,
                             pace ? NULL : o->cancel, &crc[k]);
        zn_aio_destroy(aio);
        for (int k = 0; k < 3 && !rc; k++)
            json_object_set_new(files, zn_ckpt__state_file[k], json_pack("{sIsI}", "bytes",
                                (json_int_t)in.bytes[k], "crc32c", (json_int_t)crc[k]));
        if (!rc)
            zn_debug("checkpoint: rank %d wrote %" PRIu64 " bytes in %.3f s", rank,
                     in.bytes[0] + in.bytes[1] + in.bytes[2],
                     (double)(zn_now_ns() - t0) * 1e-9);
    }
    if (rc < 0) {
        json_decref(files);
        return rc;
    }
    zn_ckpt__point(o, "data");
    json_t *rj = json_pack("{sisisIsoso}", "rank", rank, "world", zn_train_world(tr),
                           "local_params", (json_int_t)in.local_params,
                           "shares", shares_json(tr, in.nblocks),
                           "files", files);
    /* 8-bit moments: the blocks m.bin and v.bin keep in fp32, [block, n,
     * slot] each, their floats after the layout */
    if (rj && in.n_f32_runs) {
        json_t *runs = json_array();
        for (size_t r = 0; r < in.n_f32_runs && runs; r++)
            json_array_append_new(runs, json_pack("[III]", (json_int_t)in.f32_runs[r].block,
                                                  (json_int_t)in.f32_runs[r].n,
                                                  (json_int_t)in.f32_runs[r].slot));
        if (!runs || json_object_set_new(rj, "f32_runs", runs)) {
            json_decref(rj);
            rj = NULL;
        }
    }
    char *text = rj ? json_dumps(rj, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
    json_decref(rj);
    if (!text)
        return zn_set_error(-ENOMEM, "checkpoint: out of memory");
    snprintf(path, sizeof path, "%s/rank.json", rdir);
    rc = zn_ckpt__write_small(path, text, strlen(text));
    free(text);
    if (!rc)
        rc = zn_fs_fsync_path(rdir, 1);
    if (!rc)
        zn_ckpt__point(o, "rank");
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
    int rc = zn_ckpt__file_crc(path, &bytes, &crc);
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

/* `latest` replaced durably; its temporary, .latest.tmp-PID.SEQ, is one
 * prune() knows to remove when its process died before the rename. */
static int write_latest(const char *dir, const char *name)
{
    char fin[PATHN + 16], text[80];
    snprintf(fin, sizeof fin, "%s/latest", dir);
    snprintf(text, sizeof text, "%s\n", name);
    int rc = zn_fs_write_atomic(fin, text, strlen(text));
    return rc ? zn_error_prefix(rc, "checkpoint") : 0;
}

int zn_ckpt__step_of(const char *name, long long *step)
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
        if (stale_tmp(e->d_name)) {
            remove_stale(dir, e->d_name);
        } else if (zn_ckpt__step_of(e->d_name, &s) && n < 4096) {
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
        zn_ckpt__rm_rf(path);
    }
}

/* The step folders before `keep` that refer to this rank's live swap
 * file (a step's commit by reference, zn_ckpt_commit_start) go: the next
 * step writes the other copy of the states, which they hold. Returns 0 or
 * the first failure to remove one (-errno). */
int zn_ckpt__prune_own(zn_trainer *tr, const char *dir, const char *keep)
{
    const char *swp = zn_train_state_swap_path(tr);
    struct stat own, st;
    long long ks;
    if (!swp || stat(swp, &own) < 0 || !zn_ckpt__step_of(keep, &ks))
        return 0;
    DIR *d = opendir(dir);
    if (!d)
        return zn_set_error(-errno, "checkpoint: opening %s: %s", dir, strerror(errno));
    int rc = 0;
    char path[PATHN + 64];
    struct dirent *e;
    while ((e = readdir(d)) && !rc) {
        long long s;
        if (!zn_ckpt__step_of(e->d_name, &s) || s >= ks)
            continue;
        snprintf(path, sizeof path, "%s/%s/rank-%d/state.swp", dir, e->d_name,
                 zn_train_rank(tr));
        if (stat(path, &st) < 0 || st.st_dev != own.st_dev || st.st_ino != own.st_ino)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        zn_debug("checkpoint: removing %s (a commit the next step overwrites)", path);
        zn_ckpt__rm_rf(path);
        if (access(path, F_OK) == 0)
            rc = zn_set_error(-EIO, "checkpoint: could not remove %s, which refers to the run's "
                              "swap file", path);
    }
    closedir(d);
    return rc;
}

int zn_ckpt__finish(zn_trainer *tr, const zn_ckpt_save_options *o, const char *tmp,
                    const char *final, const char *name, const zn_train_state_info *inp,
                    bool live)
{
    int rc = 0, world = zn_train_world(tr);
    char path[PATHN];
    zn_train_state_info in = *inp;
    json_t *files = json_object(), *ranks = json_array(), *blocks = json_array();
    json_t *m = NULL;
    char *text = NULL;
    if (!files || !ranks || !blocks) {
        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    if (o->dims) {
        /* both writers fsync the file and the folder (zn_fs_write_atomic) */
        snprintf(path, sizeof path, "%s/config.json", tmp);
        if ((rc = zn_model_dims_write_hf(o->dims, path)) ||
            (rc = add_file(files, tmp, "config.json")))
            goto out;
        /* LoRA: the state is the adapters; say which, in PEFT's format
         * but not under PEFT's name: a folder with adapter_config.json is
         * taken for a PEFT adapter (PeftModel.from_pretrained), and this
         * one holds zinc's state, not adapter_model.safetensors (`zinc
         * export` makes the adapter) */
        if (o->dims->lora.r > 0) {
            snprintf(path, sizeof path, "%s/lora_config.json", tmp);
            if ((rc = zn_lora_write_peft_config(&o->dims->lora, path, NULL)) ||
                (rc = add_file(files, tmp, "lora_config.json")))
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
    for (int b = 0; b < in.nblocks; b++) {
        zn_block_share sh;
        zn_train_block_share(tr, b, &sh);
        json_array_append_new(blocks, json_integer((json_int_t)sh.n));
    }
    /* "o": the manifest takes these references over (jansson steals them
     * even when packing fails) */
    m = json_pack("{sssisIsIsisIsosososo}", "format", ZN_CKPT_FORMAT, "version", ZN_CKPT_VERSION,
                  "step", (json_int_t)in.step, "steps_run", (json_int_t)in.steps_run,
                  "world_size", world, "total_params", (json_int_t)in.total_params, "blocks", blocks,
                  "ranks", ranks, "files", files, "scaler", scaler_json(&in.scaler));
    files = ranks = blocks = NULL;
    if (!m) {
        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory building the manifest");
        goto out;
    }
    json_object_set_new(m, "config", o->config_text ? json_string(o->config_text) : json_null());
    /* how m.bin and v.bin hold Adam's moments (zn_mom_layout_bytes) */
    json_object_set_new(m, "moments", json_string(zn_mom_fmt_name(in.moments)));
    /* how master.bin holds the master: fp32, or bf16 (stochastic rounding) */
    json_object_set_new(m, "master", json_string(in.master_dtype == ZN_DTYPE_BF16 ? "bf16"
                                                                                 : "fp32"));
    json_object_set_new(m, "client", json_string(o->client_json ? o->client_json : "{}"));
    json_object_set_new(m, "lr_iteration", json_integer((json_int_t)in.step));
    json_object_set_new(m, "param_dtype", json_string(zn_dtype_name(in.param_dtype)));
    if (!(text = manifest_text(m))) {
        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory writing the manifest");
        goto out;
    }
    snprintf(path, sizeof path, "%s/manifest.json", tmp);
    if ((rc = zn_ckpt__write_small(path, text, strlen(text))))
        goto out;
    zn_ckpt__point(o, "manifest");
    if ((rc = zn_fs_fsync_path(tmp, 1)))
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
        zn_ckpt__rm_rf(tmp); /* the old one */
    } else if (rename(tmp, final) < 0) {
        rc = zn_set_error(-errno, "checkpoint: renaming %s to %s: %s", tmp, final,
                          strerror(errno));
        goto out;
    }
    zn_ckpt__point(o, "rename");
    if ((rc = zn_fs_fsync_path(o->dir, 1)))
        goto out;
    if ((rc = write_latest(o->dir, name)))
        goto out;
    zn_ckpt__point(o, "latest");
    /* this run's earlier commits first (the next update overwrites what
     * they hold); a commit itself does not count in keep_last: the next
     * step's replaces it */
    if ((rc = zn_ckpt__prune_own(tr, o->dir, name)))
        goto out;
    prune(o->dir, o->keep_last > 0 && live ? o->keep_last + 1 : o->keep_last, name);
    zn_ckpt__point(o, "prune");
out:
    free(text);
    json_decref(m);
    json_decref(files);
    json_decref(ranks);
    json_decref(blocks);
    return rc;
}

/* Every rank: the folder names, the state as it is now (in) and, on rank
 * 0, the temporary folder, shared with the others. */
int zn_ckpt__prepare(zn_trainer *tr, const zn_ckpt_save_options *o, zn_ckpt__job *j, int rc)
{
    memset(j, 0, sizeof *j);
    zn_train_state_get_info(tr, &j->in);
    int rank = zn_train_rank(tr), world = zn_train_world(tr);
    snprintf(j->name, sizeof j->name, "step-%08lld", (long long)j->in.step);
    if ((size_t)snprintf(j->final, sizeof j->final, "%s/%s", o->dir, j->name) >=
        sizeof j->final - 64)
        return zn_set_error(-ENAMETOOLONG, "checkpoint: folder name too long: %s", o->dir);
    j->t0 = zn_now_ns();
    zn_ckpt__point(o, "begin");
    if (rank == 0 && !rc) {
        if ((rc = zn_fs_mkdir_p(o->dir, 0755)))
            zn_error_prefix(rc, "checkpoint");
        snprintf(j->tmp, sizeof j->tmp, "%s/.%s.tmp-%ld", o->dir, j->name, (long)getpid());
        if (!rc && mkdir(j->tmp, 0755) < 0)
            rc = zn_set_error(-errno, "checkpoint: creating %s: %s", j->tmp, strerror(errno));
    }
    rc = agree(tr, rc);
    if (world > 1 && !rc) {
        int r2 = zn_comm_broadcast(zn_train_comm(tr), j->tmp, sizeof j->tmp, 0);
        if (r2)
            rc = zn_error_prefix(r2, "checkpoint: sharing the folder name");
    }
    if (!rc)
        zn_ckpt__point(o, "tmpdir");
    else
        zn_ckpt__abandon(tr, j, rc);
    return rc;
}

/* Every rank, after its files (wrc: how they went): the ranks agree, rank 0
 * completes the checkpoint, they agree again; a failure removes the
 * temporary folder. */
int zn_ckpt__commit(zn_trainer *tr, const zn_ckpt_save_options *o, zn_ckpt__job *j, int wrc,
                    bool live, char *out_path, size_t out_len)
{
    int rc = agree(tr, wrc);
    if (!rc && zn_train_rank(tr) == 0)
        rc = zn_ckpt__finish(tr, o, j->tmp, j->final, j->name, &j->in, live);
    rc = agree(tr, rc);
    if (rc) {
        zn_ckpt__abandon(tr, j, rc);
        return rc;
    }
    zn_debug("checkpoint: %s saved in %.3f s", j->final, (double)(zn_now_ns() - j->t0) * 1e-9);
    if (out_path && out_len)
        snprintf(out_path, out_len, "%s", j->final);
    return 0;
}

/* Rank 0 removes the temporary folder, keeping the error message. */
void zn_ckpt__abandon(zn_trainer *tr, zn_ckpt__job *j, int rc)
{
    if (zn_train_rank(tr) != 0 || !j->tmp[0])
        return;
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", zn_last_error());
    zn_ckpt__rm_rf(j->tmp);
    j->tmp[0] = '\0';
    if (rc)
        zn_set_error(rc, "%s", keep);
}

int zn_ckpt_save(zn_trainer *tr, const zn_ckpt_save_options *o, char *out_path, size_t out_len)
{
    if (!tr || !o || !o->dir || !o->dir[0])
        return zn_set_error(ZN_EARG, "checkpoint: no trainer or no folder");
    zn_train_state_info in;
    zn_train_state_get_info(tr, &in);
    if (in.failed)
        return zn_set_error(ZN_ECORRUPT, "checkpoint: the trainer failed in an earlier step; "
                            "its state is not saved");
    /* the last step's optimizer job first (it may still be writing state) */
    int rc = zn_train_sync(tr);
    zn_ckpt__job j;
    if ((rc = zn_ckpt__prepare(tr, o, &j, rc)))
        return rc;
    rc = zn_ckpt__save_rank(tr, o, j.tmp, &j.in, NULL, false);
    if ((rc = zn_ckpt__commit(tr, o, &j, rc, false, out_path, out_len)))
        return rc;
    /* a final save by reference: what nothing refers to goes, now that
     * the checkpoint is in place (a crash before leaves it whole, and
     * larger) */
    if (o->final_save) {
        char rs[PATHN + 64];
        snprintf(rs, sizeof rs, "%s/rank-%d/state.swp", j.final, zn_train_rank(tr));
        if (access(rs, F_OK) == 0 && (rc = zn_ckpt__punch_rank(j.final, zn_train_rank(tr)))) {
            zn_warn("%s (the checkpoint %s is whole; it keeps the swap file's other ranges)",
                    zn_last_error(), j.final);
            rc = 0;
        }
    }
    return 0;
}
