/* The file-system helpers (util/fs-impl.h): mkdir -p, exclusive creation,
 * fsync by name and the durable replace, so that every file zinc writes in
 * place is either the old one or the whole new one after a crash, and its
 * rename is on disk when the call returns. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fs-impl.h"

/* A target's name is cut to this many bytes in its temporary's, so that
 * ".NAME.tmp-PID.SEQ" stays within NAME_MAX (255) for any NAME. */
#define TMP_BASE_MAX 200
/* Temporaries of the same name tried before giving up: only a dead
 * process of the same pid leaves one in the way. */
#define TMP_TRIES 64

static _Atomic(zn_fs_fault_fn) fault_hook;
static void *_Atomic fault_user;
static atomic_uint tmp_seq;

void zn_fs_set_fault(zn_fs_fault_fn hook, void *user)
{
    atomic_store(&fault_user, user);
    atomic_store(&fault_hook, hook);
}

/* The hook's verdict on the next call: 0 to make it, < 0 its failure. */
static int fault(const char *call, const char *path)
{
    zn_fs_fault_fn f = atomic_load_explicit(&fault_hook, memory_order_relaxed);
    return f ? f(atomic_load(&fault_user), call, path) : 0;
}

static int sys_fail(const char *call, const char *path, int e)
{
    return zn_set_error(-e, "%s %s: %s", call, path, strerror(e));
}

/* One component: made, or already a folder. */
static int mkdir_one(const char *p, mode_t mode)
{
    int r = fault("mkdir", p);
    if (r == 0 && mkdir(p, mode) == 0)
        return 0;
    int e = r < 0 ? -r : errno;
    struct stat st;
    if (stat(p, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return 0;
        return zn_set_error(-ENOTDIR, "mkdir %s: it exists and is not a folder", p);
    }
    return sys_fail("mkdir", p, e);
}

int zn_fs_mkdir_p(const char *path, mode_t mode)
{
    if (!path || !path[0])
        return zn_set_error(-ENOENT, "mkdir: empty folder name");
    size_t n = strlen(path);
    char *p = malloc(n + 1);
    if (!p)
        return zn_set_error(-ENOMEM, "mkdir %s: out of memory", path);
    memcpy(p, path, n + 1);
    int rc = 0;
    /* each prefix that ends a component; a leading '/', repeated and
     * trailing slashes end none */
    for (size_t i = 1; i <= n && !rc; i++) {
        if ((p[i] != '/' && p[i] != '\0') || p[i - 1] == '/')
            continue;
        char keep = p[i];
        p[i] = '\0';
        rc = mkdir_one(p, mode);
        p[i] = keep;
    }
    free(p);
    return rc;
}

int zn_fs_create_excl(const char *path, mode_t mode)
{
    int r = fault("open", path);
    int fd = r < 0 ? r : open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
        return zn_set_error(r < 0 ? r : -errno, "creating %s (open, exclusive): %s", path,
                            strerror(r < 0 ? -r : errno));
    return fd;
}

int zn_fs_write_full(int fd, const void *buf, size_t len, const char *path)
{
    const char *p = buf;
    size_t done = 0;
    while (done < len) {
        size_t want = len - done > (1u << 30) ? (1u << 30) : len - done;
        int r = fault("write", path);
        if (r < 0)
            return zn_set_error(r, "write %s at byte %zu: %s", path, done, strerror(-r));
        if (r > 0 && (size_t)r < want)
            want = (size_t)r;
        ssize_t k = write(fd, p + done, want);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            int e = k < 0 ? errno : EIO;
            return zn_set_error(-e, "write %s at byte %zu: %s", path, done, strerror(e));
        }
        done += (size_t)k;
    }
    return 0;
}

static int fsync_fd(int fd, const char *path)
{
    int r = fault("fsync", path);
    if (r < 0 || fsync(fd) < 0)
        return sys_fail("fsync", path, r < 0 ? -r : errno);
    return 0;
}

/* Closes fd whatever happens; its error (an NFS write-back, say) is the
 * result. */
static int close_fd(int fd, const char *path)
{
    int r = fault("close", path);
    if (close(fd) < 0 && r == 0)
        r = -errno;
    return r < 0 ? sys_fail("close", path, -r) : 0;
}

int zn_fs_fsync_path(const char *path, int is_dir)
{
    int r = fault("open", path);
    int fd = r < 0 ? r : open(path, O_RDONLY | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
    if (fd < 0)
        return zn_set_error(r < 0 ? r : -errno, "opening %s to fsync it: %s", path,
                            strerror(r < 0 ? -r : errno));
    int rc = fsync_fd(fd, path);
    if (rc) {
        close(fd);
        return rc;
    }
    return close_fd(fd, path);
}

int zn_fs_fsync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return zn_fs_fsync_path(".", 1);
    if (slash == path)
        return zn_fs_fsync_path("/", 1);
    size_t n = (size_t)(slash - path);
    char *dir = malloc(n + 1);
    if (!dir)
        return zn_set_error(-ENOMEM, "fsync of %s's folder: out of memory", path);
    memcpy(dir, path, n);
    dir[n] = '\0';
    int rc = zn_fs_fsync_path(dir, 1);
    free(dir);
    return rc;
}

int zn_fs_write_new(const char *path, const void *buf, size_t len, mode_t mode)
{
    int fd = zn_fs_create_excl(path, mode);
    if (fd < 0)
        return fd;
    int rc = zn_fs_write_full(fd, buf, len, path);
    if (!rc)
        rc = fsync_fd(fd, path);
    if (rc)
        close(fd);
    else
        rc = close_fd(fd, path);
    if (rc)
        unlink(path);
    return rc;
}

/* ---- durable replace --------------------------------------------------------*/
static void tmp_clear(zn_fs_tmp *h)
{
    free(h->path);
    free(h->tmp);
    memset(h, 0, sizeof *h);
    h->fd = -1;
}

int zn_fs_tmp_open(zn_fs_tmp *h, const char *path, mode_t mode)
{
    memset(h, 0, sizeof *h);
    h->fd = -1;
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) + 1 : 0, blen = strlen(path + dlen);
    if (!blen)
        return zn_set_error(-EISDIR, "replacing %s: not a file name", path);
    if (blen > TMP_BASE_MAX)
        blen = TMP_BASE_MAX;
    size_t cap = dlen + blen + 64;
    h->path = strdup(path);
    h->tmp = malloc(cap);
    if (!h->path || !h->tmp) {
        tmp_clear(h);
        return zn_set_error(-ENOMEM, "replacing %s: out of memory", path);
    }
    int fd = -EEXIST;
    for (int t = 0; t < TMP_TRIES && fd == -EEXIST; t++) {
        snprintf(h->tmp, cap, "%.*s.%.*s.tmp-%ld.%u", (int)dlen, path, (int)blen, path + dlen,
                 (long)getpid(), atomic_fetch_add(&tmp_seq, 1));
        fd = zn_fs_create_excl(h->tmp, mode ? mode : 0644);
    }
    if (fd < 0) {
        zn_error_prefix(fd, "replacing %s", path);
        tmp_clear(h); /* nothing was made: nothing to remove */
        return fd;
    }
    h->fd = fd;
    return 0;
}

int zn_fs_tmp_fopen(zn_fs_tmp *h, const char *path, mode_t mode)
{
    int rc = zn_fs_tmp_open(h, path, mode);
    if (rc)
        return rc;
    if (!(h->f = fdopen(h->fd, "w"))) {
        rc = zn_set_error(-errno, "replacing %s: fdopen %s: %s", path, h->tmp, strerror(errno));
        zn_fs_tmp_abort(h);
    }
    return rc;
}

int zn_fs_tmp_commit(zn_fs_tmp *h)
{
    if (!h->tmp)
        return zn_set_error(-EINVAL, "replacing a file: no temporary open");
    int rc = 0;
    if (h->f) {
        /* what stdio still holds goes out now; an earlier failed write
         * (ferror) fails the whole file */
        int r = fault("write", h->tmp);
        if (r == 0 && fflush(h->f) != 0)
            r = -errno;
        if (r == 0 && ferror(h->f))
            r = -EIO;
        if (r < 0)
            rc = sys_fail("write", h->tmp, -r);
    }
    if (!rc)
        rc = fsync_fd(h->fd, h->tmp);
    if (h->f) {
        int r = fault("close", h->tmp);
        if ((fclose(h->f) != 0 || r < 0) && !rc)
            rc = sys_fail("close", h->tmp, r < 0 ? -r : errno);
    } else if (rc) {
        close(h->fd);
    } else {
        rc = close_fd(h->fd, h->tmp);
    }
    h->f = NULL;
    h->fd = -1;
    if (!rc) {
        int r = fault("rename", h->tmp);
        if (r < 0 || rename(h->tmp, h->path) < 0) {
            int e = r < 0 ? -r : errno;
            rc = zn_set_error(-e, "rename %s to %s: %s", h->tmp, h->path, strerror(e));
        }
    }
    if (rc) {
        unlink(h->tmp);
        zn_error_prefix(rc, "replacing %s", h->path);
    } else if ((rc = zn_fs_fsync_parent(h->path))) {
        /* in place, but the rename may not survive a crash */
        zn_error_prefix(rc, "replacing %s", h->path);
    }
    tmp_clear(h);
    return rc;
}

void zn_fs_tmp_abort(zn_fs_tmp *h)
{
    if (!h->tmp)
        return; /* empty: never opened, or committed or aborted already */
    if (h->f)
        fclose(h->f);
    else if (h->fd >= 0)
        close(h->fd);
    unlink(h->tmp);
    tmp_clear(h);
}

int zn_fs_write_atomic(const char *path, const void *buf, size_t len)
{
    zn_fs_tmp h;
    int rc = zn_fs_tmp_open(&h, path, 0644);
    if (rc)
        return rc;
    if ((rc = zn_fs_write_full(h.fd, buf, len, h.tmp))) {
        zn_error_prefix(rc, "replacing %s", path);
        zn_fs_tmp_abort(&h);
        return rc;
    }
    return zn_fs_tmp_commit(&h);
}
