/* The file helpers checkpoints are made with beyond util/fs-impl.h's:
 * pread of a whole range, small files written new and fsynced, a file's
 * crc32c, recursive removal. */
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


/* ---- small file helpers (fsync, mkdir -p and the durable replace are
 * util/fs-impl.h's) ------------------------------------------------------*/
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

int zn_ckpt__rd_open(zn_ckpt_rd *r, const zn_ckpt *ck, const zn_ckpt_file *f, int advice)
{
    memset(r, 0, sizeof *r);
    r->f = f;
    snprintf(r->path, sizeof r->path, "%s/%s", ck->path, f->name);
    int n = f->nref ? f->nref : 1;
    for (int i = 0; i < n; i++) {
        snprintf(r->rpath[i], sizeof r->rpath[i], "%s/%s", ck->path,
                 f->nref ? f->ref[i] : f->name);
        if ((r->fd[i] = open(r->rpath[i], O_RDONLY | O_CLOEXEC)) < 0) {
            int e = errno;
            r->fd[i] = 0;
            zn_ckpt__rd_close(r);
            return zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s: %s", ck->path,
                                f->nref ? f->ref[i] : f->name, strerror(e));
        }
        r->nfd++;
        posix_fadvise(r->fd[i], 0, 0, advice);
    }
    return 0;
}

int zn_ckpt__rd_read(zn_ckpt_rd *r, uint64_t off, void *buf, size_t len)
{
    const zn_ckpt_file *f = r->f;
    if (!f->nref)
        return zn_ckpt__pread(r->fd[0], r->path, off, buf, len);
    if (off + len > f->bytes)
        return zn_set_error(ZN_ECORRUPT, "checkpoint: %s ends at offset %" PRIu64 " (truncated)",
                            r->path, f->bytes);
    /* the piece holding off: the last with at <= off */
    size_t lo = 0, hi = f->npc;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (f->pc[mid].at <= off)
            lo = mid;
        else
            hi = mid;
    }
    char *p = buf;
    for (size_t i = lo; len && i < f->npc; i++) {
        const zn_ckpt_piece *pc = &f->pc[i];
        uint64_t in = off - pc->at, take = pc->len - in < len ? pc->len - in : len;
        int rc = 0;
        if (pc->src < 0)
            memset(p, 0, take);
        else if ((rc = zn_ckpt__pread(r->fd[pc->src], r->rpath[pc->src], pc->off + in, p, take)))
            return zn_error_prefix(rc, "%s", r->path);
        p += take;
        off += take;
        len -= take;
    }
    return 0;
}

void zn_ckpt__rd_close(zn_ckpt_rd *r)
{
    for (int i = 0; i < r->nfd; i++)
        close(r->fd[i]);
    r->nfd = 0;
}

/* Writes a small file whole and fsyncs it. */
int zn_ckpt__write_small(const char *path, const char *data, size_t len)
{
    /* A new file, never through what is at the name: a stale temporary of
     * a dead run, or a link planted there, is removed (the link itself,
     * not its target) and the file created exclusively. */
    if (unlink(path) < 0 && errno != ENOENT)
        return zn_set_error(-errno, "checkpoint: removing the stale %s: %s", path,
                            strerror(errno));
    int rc = zn_fs_write_new(path, data, len, 0644);
    return rc ? zn_error_prefix(rc, "checkpoint") : 0;
}

/* Size and crc32c of a whole file. */
int zn_ckpt__file_crc(const char *path, uint64_t *bytes, uint32_t *crc)
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

void zn_ckpt__rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return;
    nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

void zn_ckpt__point(const zn_ckpt_save_options *o, const char *where)
{
    if (o->point)
        o->point(o->point_user, where);
}
