/* The file-system helpers every layer writes files with, written once:
 * mkdir -p, exclusive no-follow creation, fsync by name, and the durable
 * replace (a private temporary beside the target, fsynced, renamed over
 * it, the directory fsynced), whole-buffer or streamed. Private to zinc:
 * used across src/, not public API. All return 0 (or an fd) or -errno,
 * with zn_last_error() naming the file and the call that failed. */
#ifndef ZN_UTIL_FS_IMPL_H
#define ZN_UTIL_FS_IMPL_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "zinc/util.h"

/* mkdir -p: every missing component of path made with mode (umask
 * applies); components that are already folders (or links to folders)
 * are fine. -ENOTDIR when one is something else; the message names the
 * component that failed. */
int zn_fs_mkdir_p(const char *path, mode_t mode);

/* A new file at path, never through what is there: O_RDWR | O_CREAT |
 * O_EXCL | O_NOFOLLOW | O_CLOEXEC, so an existing file or a planted link
 * is -EEXIST (the link's target untouched). Returns the fd or -errno. */
int zn_fs_create_excl(const char *path, mode_t mode);

/* Writes all of buf at the fd's position (EINTR and short writes
 * retried; a write of nothing is -EIO). path only names the file in the
 * message. */
int zn_fs_write_full(int fd, const void *buf, size_t len, const char *path);

/* fsync of a file (is_dir 0) or a folder (is_dir 1) by name. */
int zn_fs_fsync_path(const char *path, int is_dir);

/* fsync of the folder that holds path ("." for a bare name): what makes a
 * rename or a creation in it durable. */
int zn_fs_fsync_parent(const char *path);

/* A new file written whole and fsynced (zn_fs_create_excl, so never over
 * what is at path); on failure the part written is removed. */
int zn_fs_write_new(const char *path, const void *buf, size_t len, mode_t mode);

/* ---- durable replace -------------------------------------------------------
 * The temporary is DIR/.NAME.tmp-PID.SEQ beside the target DIR/NAME (the
 * same file system, so the rename is atomic; hidden, and a dead writer's
 * left-over says whose it was), created exclusively (zn_fs_create_excl).
 * Commit: flush, fsync, close, rename over the target, fsync DIR. On any
 * failure up to the rename the temporary is removed and the target is as
 * it was (a crash leaves at most the temporary); a failure of the last
 * fsync is reported with the new file already in place. */
typedef struct {
    int fd;        /* the temporary, open read-write; -1 when none */
    FILE *f;       /* a stdio stream on fd (zn_fs_tmp_fopen), or NULL */
    char *path;    /* the target */
    char *tmp;     /* the temporary's name */
} zn_fs_tmp;

/* Opens a temporary for path, writable through h->fd (mode: 0644 when
 * 0). h is all set up or, on failure, empty (zn_fs_tmp_abort is a no-op). */
int zn_fs_tmp_open(zn_fs_tmp *h, const char *path, mode_t mode);
/* The same with a stdio stream h->f on the fd, for writers that print. */
int zn_fs_tmp_fopen(zn_fs_tmp *h, const char *path, mode_t mode);
/* Puts the temporary in place of the target durably; h is empty after,
 * whatever the result. A stream's earlier write errors (ferror) fail the
 * commit with -EIO. */
int zn_fs_tmp_commit(zn_fs_tmp *h);
/* Closes and removes the temporary; the target is untouched. Accepts an
 * empty (zeroed, or failed to open) or already committed/aborted handle. */
void zn_fs_tmp_abort(zn_fs_tmp *h);

/* The durable replace of path by len bytes of buf (mode 0644). */
int zn_fs_write_atomic(const char *path, const void *buf, size_t len);

/* ---- fault injection (tests), like SQLite's test VFS ------------------------
 * Before each system call of this module, hook(user, call, path) is asked,
 * call being "mkdir", "open", "write", "fsync", "close" or "rename" (path:
 * the file or folder it acts on; for rename, the source). A negative
 * return is that call's failure as -errno (the call is not made); for
 * "write" a positive return k makes that write a short one of at most k
 * bytes; 0 lets the call run. NULL removes the hook. Process-wide: set it
 * only while no other thread uses this module. */
typedef int (*zn_fs_fault_fn)(void *user, const char *call, const char *path);
void zn_fs_set_fault(zn_fs_fault_fn hook, void *user);

#endif
