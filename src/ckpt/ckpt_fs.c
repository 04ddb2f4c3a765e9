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
