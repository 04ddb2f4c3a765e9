/* What a run owns on its swap paths: a new directory per swap space and path
 * (zinc-run.<host>.<pid>.<start>.<k>), locked for the run's life, that holds
 * its files; the table a signal handler removes them from; and the scan that
 * finds what dead runs left (kill -9, a reclaimed spot machine) and removes
 * it, never what a live run holds. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nvme/nvme-impl.h"
#include "zinc/util.h"
#include "util/fs-impl.h"

#define RUN_DIR_PREFIX "zinc-run."
#define RUN_LOCK "lock"

/* ---- the files a process owns, for a signal handler --------------------------
 * Every swap file, lock file and run directory this process created and will
 * remove, so that zn_swap_remove_all_now can remove them from a signal
 * handler with unlink and rmdir (both async-signal-safe). The table is fixed;
 * an entry's path and kind are written before it is published and it is
 * unpublished before they change. Three entries per path of a swap space. */
#define OWNED_MAX 512
static struct {
    _Atomic int live;   /* 0 free, 2 being written, 1 published */
    int is_dir;
    char path[4096];
} owned[OWNED_MAX];

int zn_swap__own(const char *path, int is_dir)
{
    for (int i = 0; i < OWNED_MAX; i++) {
        int expect = 0;
        if (atomic_compare_exchange_strong(&owned[i].live, &expect, 2)) {
            snprintf(owned[i].path, sizeof owned[i].path, "%s", path);
            owned[i].is_dir = is_dir;
            atomic_store(&owned[i].live, 1);
            return i;
        }
    }
    return -1;  /* the table is full: a signal leaves this one */
}

void zn_swap__disown(int i)
{
    if (i >= 0)
        atomic_store(&owned[i].live, 0);
}

int zn_swap_remove_all_now(void)
{
    int n = 0;
    /* the files first: rmdir takes only an empty directory */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < OWNED_MAX; i++)
            if (atomic_load(&owned[i].live) == 1 && owned[i].is_dir == pass &&
                (pass ? rmdir(owned[i].path) : unlink(owned[i].path)) == 0)
                n++;
    return n;
}

/* ---- who a run is: host, PID, start -------------------------------------------*/
/* A process's start in seconds since the epoch (the boot time in /proc/stat
 * plus its start in clock ticks after boot), 0 when /proc cannot say. With
 * the PID it names one process: a PID given out again later (a restarted
 * container hands out the same small PIDs) has another start. */
static int64_t proc_start(long pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* field 2, the command, is in parentheses and may hold spaces */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    unsigned long long ticks = 0;
    /* after ") ": field 3 (state) ... field 22 (starttime) */
    if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
                      "%*d %*d %llu", &ticks) != 1)
        return 0;
    f = fopen("/proc/stat", "re");
    if (!f)
        return 0;
    long long btime = 0;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "btime %lld", &btime) == 1)
            break;
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    if (btime <= 0 || hz <= 0)
        return 0;
    return (int64_t)btime + (int64_t)(ticks / (unsigned long long)hz);
}

static pthread_once_t self_once = PTHREAD_ONCE_INIT;
static int64_t self_start_s;
static char self_host[256];

/* The host name as it goes into a directory's name: letters, digits, '-',
 * '_' and '.' kept, anything else '_'. */
static void init_self(void)
{
    self_start_s = proc_start((long)getpid());
    if (!self_start_s)
        self_start_s = (int64_t)time(NULL);
    char h[256] = "";
    if (gethostname(h, sizeof h - 1) < 0 || !h[0])
        snprintf(h, sizeof h, "localhost");
    h[sizeof h - 1] = '\0';
    for (char *c = h; *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_' && *c != '.')
            *c = '_';
    snprintf(self_host, sizeof self_host, "%s", h);
}

/* A run that still goes: its PID exists and, when /proc says when it
 * started, it started when the directory's name says (within 2 s: the boot
 * time /proc/stat gives moves with the wall clock). */
static bool run_alive(long pid, int64_t start)
{
    if (pid <= 0 || (kill((pid_t)pid, 0) < 0 && errno == ESRCH))
        return false;
    int64_t s = proc_start(pid);
    return !s || (s - start <= 2 && start - s <= 2);
}

static void format_start(int64_t start, char *out, size_t n)
{
    time_t t = (time_t)start;
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(out, n, "%Y-%m-%d %H:%M:%S UTC", &tm))
        snprintf(out, n, "%" PRId64, start);
}

/* ---- a run's directory ----------------------------------------------------------*/
static atomic_uint run_dir_counter;

int zn_rundir__create(zn_rundir *r, const char *path, const char *made_by)
{
    r->dir = r->lock = NULL;
    r->lock_fd = -1;
    r->owned_dir = r->owned_lock = -1;
    pthread_once(&self_once, init_self);
    unsigned k = atomic_fetch_add(&run_dir_counter, 1);
    size_t len = strlen(path) + strlen(self_host) + 96;
    char *dir = malloc(len), *lock = malloc(len + sizeof RUN_LOCK);
    if (!dir || !lock) {
        free(dir);
        free(lock);
        return zn_set_error(-ENOMEM, "swap: out of memory");
    }
    snprintf(dir, len, "%s/" RUN_DIR_PREFIX "%s.%ld.%" PRId64 ".%u", path, self_host,
             (long)getpid(), self_start_s, k);
    snprintf(lock, len + sizeof RUN_LOCK, "%s/" RUN_LOCK, dir);
    /* new, or an error: a directory already there is not this run's */
    if (mkdir(dir, 0700) < 0) {
        int e = errno;
        zn_set_error(-e, "swap: creating the run directory %s: %s%s", dir, strerror(e),
                     e == EEXIST ? " (a run directory must be new)" : "");
        free(dir);
        free(lock);
        return -e;
    }
    r->dir = dir;
    r->lock = lock;
    r->owned_dir = zn_swap__own(dir, 1);
    int fd = zn_fs_create_excl(lock, 0600);
    if (fd < 0)
        return zn_error_prefix(fd, "swap");
    r->lock_fd = fd;
    r->owned_lock = zn_swap__own(lock, 0);
    /* held for the run's life: a later run tells a live run's directory
     * (locked) from a dead one's (zn_swap_clean_stale). Another run's scan
     * may hold it for a moment first, having found the directory before
     * this lock (it sees this run alive and lets go): up to 2 s for that. */
    int lr = -1;
    for (int t = 0; t < 100 && (lr = flock(fd, LOCK_EX | LOCK_NB)) < 0 && errno == EWOULDBLOCK; t++)
        usleep(20 * 1000);
    if (lr < 0)
        return zn_set_error(-errno, "swap: locking %s: %s", lock, strerror(errno));
    char when[64], text[1024];
    format_start(self_start_s, when, sizeof when);
    int n = snprintf(text, sizeof text,
                     "zinc run directory: removed when its run ends; a later zinc run on this "
                     "host removes it once its run is gone\n"
                     "host %s\npid %ld\nstart %" PRId64 " (%s)\nmade-by %s\n",
                     self_host, (long)getpid(), self_start_s, when, made_by);
    if (n < 0 || (size_t)n >= sizeof text)
        n = (int)strlen(text);
    if (write(fd, text, (size_t)n) != n)
        return zn_set_error(errno ? -errno : -EIO, "swap: writing %s: %s", lock,
                            strerror(errno ? errno : EIO));
    return 0;
}

void zn_rundir__close(zn_rundir *r, int keep)
{
    if (r->dir && keep && r->lock_fd >= 0) {
        /* the next run leaves a kept directory alone (zn_swap_clean_stale) */
        static const char kept[] = "kept (tiers.keep_swap)\n";
        if (lseek(r->lock_fd, 0, SEEK_END) < 0 ||
            write(r->lock_fd, kept, sizeof kept - 1) != (ssize_t)(sizeof kept - 1))
            zn_warn("swap: marking %s as kept: %s", r->lock, strerror(errno));
    } else if (r->dir) {
        if (r->lock_fd >= 0 && unlink(r->lock) < 0)
            zn_warn("swap: removing %s: %s", r->lock, strerror(errno));
        if (rmdir(r->dir) < 0)
            zn_warn("swap: removing the run directory %s: %s", r->dir, strerror(errno));
    }
    zn_swap__disown(r->owned_lock);
    zn_swap__disown(r->owned_dir);
    /* the lock goes last: until the directory is gone it is this run's */
    if (r->lock_fd >= 0)
        close(r->lock_fd);
    free(r->dir);
    free(r->lock);
    r->dir = r->lock = NULL;
    r->lock_fd = -1;
    r->owned_dir = r->owned_lock = -1;
}

/* ---- leftovers of dead runs -----------------------------------------------------*/
static bool all_digits(const char *s, size_t n)
{
    if (!n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)s[i]))
            return false;
    return true;
}

/* "zinc-run.<host>.<pid>.<start>.<k>": the host may hold dots, so the
 * numbers are read from the right. */
static int parse_run_name(const char *name, char *host, size_t hn, long *pid, int64_t *start)
{
    size_t pl = strlen(RUN_DIR_PREFIX);
    if (strncmp(name, RUN_DIR_PREFIX, pl))
        return -1;
    const char *s = name + pl, *end = s + strlen(s);
    const char *dot[3];
    const char *p = end;
    for (int j = 0; j < 3; j++) {
        while (p > s && p[-1] != '.')
            p--;
        if (p == s)
            return -1;
        dot[j] = --p;   /* dot[0] before k, dot[1] before start, dot[2] before pid */
    }
    if (!all_digits(dot[0] + 1, (size_t)(end - dot[0] - 1)) ||
        !all_digits(dot[1] + 1, (size_t)(dot[0] - dot[1] - 1)) ||
        !all_digits(dot[2] + 1, (size_t)(dot[1] - dot[2] - 1)) || dot[2] == s ||
        (size_t)(dot[2] - s) >= hn)
        return -1;
    memcpy(host, s, (size_t)(dot[2] - s));
    host[dot[2] - s] = '\0';
    *pid = strtol(dot[2] + 1, NULL, 10);
    *start = strtoll(dot[1] + 1, NULL, 10);
    return 0;
}

/* Bytes the files of an open directory take on disk; with `freed` only
 * those of files with no other name, which removing them frees (a swap
 * file a checkpoint links as its state.swp keeps its blocks until that
 * checkpoint goes or is punched). */
static uint64_t dir_bytes_of(int dfd, bool freed)
{
    int fd = dup(dfd);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    rewinddir(d);  /* the position is shared with dfd */
    uint64_t sum = 0;
    struct dirent *e;
    struct stat sb;
    while ((e = readdir(d)))
        if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode) &&
            (!freed || sb.st_nlink <= 1))
            sum += (uint64_t)sb.st_blocks * 512;
    closedir(d);
    return sum;
}

static uint64_t dir_bytes(int dfd)
{
    return dir_bytes_of(dfd, false);
}

/* Unlinks every entry of an open directory; 0, or the -errno of the first
 * that would not go (a subdirectory: this is not a run's directory). */
static int empty_dir(int dfd)
{
    int fd = dup(dfd);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        int e = -errno;
        if (fd >= 0)
            close(fd);
        return e;
    }
    rewinddir(d);
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (unlinkat(dfd, e->d_name, 0) < 0 && errno != ENOENT && !rc)
            rc = -errno;
    }
    closedir(d);
    return rc;
}

/* Whether a lock file says its run kept its directory (tiers.keep_swap). */
static bool says_kept(int fd)
{
    char buf[2048];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    return strstr(buf, "\nkept") != NULL;
}

/* A walk over one swap folder: zn_swap_clean_stale removes what dead runs
 * left and warns each removal; zn_swap_scan_stale only counts it, quietly.
 * Both take every decision here, so a count is what a removal would free. */
typedef struct {
    const char *dir;
    int dfd;
    bool remove;
    zn_swap_scan *out;
} walk;

#define WARN(w, ...)              \
    do {                          \
        if ((w)->remove)          \
            zn_warn(__VA_ARGS__); \
    } while (0)

static void note_stale(walk *w, uint64_t used)
{
    w->out->stale_bytes += used;
    w->out->stale++;
}

/* Something the walk leaves in place, with its size: all summed, the
 * largest ZN_SWAP_SCAN_NAMED named. */
static void note_held(walk *w, const char *path, uint64_t used, long pid, zn_swap_held_why why)
{
    zn_swap_scan *o = w->out;
    o->held_bytes += used;
    o->held++;
    int k = o->n_named;
    if (k == ZN_SWAP_SCAN_NAMED) {
        k = 0;
        for (int j = 1; j < ZN_SWAP_SCAN_NAMED; j++)
            if (o->named[j].bytes < o->named[k].bytes)
                k = j;
        if (o->named[k].bytes >= used)
            return;
    } else {
        o->n_named++;
    }
    snprintf(o->named[k].path, sizeof o->named[k].path, "%s", path);
    o->named[k].bytes = used;
    o->named[k].pid = pid;
    o->named[k].why = why;
}

/* One run directory in the folder: removed (or counted) when its run is gone. */
static void walk_run_dir(walk *w, const char *name)
{
    char host[256], size[32], when[64], path[4600];
    const char *dir = w->dir;
    int dfd = w->dfd;
    long pid;
    int64_t start;
    if (parse_run_name(name, host, sizeof host, &pid, &start) < 0)
        return;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat sb;
    if (fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
        return;
    if (!S_ISDIR(sb.st_mode)) {
        if (S_ISLNK(sb.st_mode))
            WARN(w, "swap: %s is a symbolic link, not a run directory; left in place", path);
        return;
    }
    int rfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (rfd < 0) {
        if (errno != ENOENT)
            WARN(w, "swap: %s: cannot look into it (%s); left in place", path, strerror(errno));
        return;
    }
    uint64_t used = dir_bytes(rfd);
    zn_format_size(used, size, sizeof size);
    format_start(start, when, sizeof when);
    /* flock does not reach across the hosts sharing a network file system:
     * another host's run can only be judged on that host */
    if (strcmp(host, self_host)) {
        WARN(w, "swap: %s (%s) belongs to run %ld on host %s, started %s; left in place: from "
                "%s zinc cannot tell whether that run still goes. Remove it by hand once it "
                "is over", path, size, pid, host, when, self_host);
        note_held(w, path, used, pid, ZN_SWAP_HELD_OTHER_HOST);
        close(rfd);
        return;
    }
    int lfd = openat(rfd, RUN_LOCK, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (lfd < 0 && errno != ENOENT) {
        WARN(w, "swap: %s: cannot open its lock (%s); left in place", path, strerror(errno));
        note_held(w, path, used, pid, ZN_SWAP_HELD_UNREADABLE);
        close(rfd);
        return;
    }
    /* no lock file: its run died between making the directory and the lock */
    bool locked = lfd >= 0 && flock(lfd, LOCK_EX | LOCK_NB) < 0;
    bool alive = run_alive(pid, start);
    if (locked && !alive) {
        /* A run killed a moment ago can hold its lock past its exit while
         * the kernel tears down what still references its files; two
         * seconds for that, then it is left. */
        for (int t = 0; t < 40 && locked; t++) {
            usleep(50 * 1000);
            locked = flock(lfd, LOCK_EX | LOCK_NB) < 0;
        }
        if (locked) {
            WARN(w, "swap: %s (%s): run %ld is gone but its directory is still locked; left "
                    "in place", path, size, pid);
            note_held(w, path, used, pid, ZN_SWAP_HELD_LOCKED);
        }
    }
    if (locked && alive) {
        note_held(w, path, used, pid, ZN_SWAP_HELD_LIVE);
    } else if (locked) {
        /* noted above */
    } else if (alive) {
        /* no lock file yet, or an empty one: the run is making its directory */
        struct stat lst;
        if (lfd >= 0 && fstat(lfd, &lst) == 0 && lst.st_size > 0)
            WARN(w, "swap: %s (%s): run %ld still runs but holds no lock on it; left in place",
                    path, size, pid);
        note_held(w, path, used, pid, ZN_SWAP_HELD_LIVE);
    } else if (lfd >= 0 && says_kept(lfd)) {
        WARN(w, "swap: %s holds the swap files run %ld kept (tiers.keep_swap, %s); left in "
                "place: remove it when done with them", path, pid, size);
        note_held(w, path, used, pid, ZN_SWAP_HELD_KEPT);
    } else if (!w->remove) {
        note_stale(w, dir_bytes_of(rfd, true));
    } else {
        uint64_t freed = dir_bytes_of(rfd, true);
        int rc = empty_dir(rfd);
        if (!rc && unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
            rc = -errno;
        if (rc) {
            zn_warn("swap: %s, left by run %ld which is gone: removing it: %s; the rest is "
                    "left in place", path, pid, strerror(-rc));
            note_held(w, path, dir_bytes(rfd), pid, ZN_SWAP_HELD_UNREADABLE);
        } else {
            note_stale(w, freed);
            char kept[96] = "";
            if (freed < used) {
                char ks[32];
                snprintf(kept, sizeof kept, "; %s of it stays a checkpoint's (its state.swp)",
                         zn_format_size(used - freed, ks, sizeof ks));
            }
            bool reused = kill((pid_t)pid, 0) == 0 || errno == EPERM;
            zn_warn("swap: removed %s, left by run %ld (started %s), which is gone%s (%s%s)",
                    path, pid, when,
                    reused ? ": its PID is another process's now, started at another time" : "",
                    size, kept);
        }
    }
    if (lfd >= 0)
        close(lfd);
    close(rfd);
}

/* One swap file of the layout before run directories,
 * "<prefix>.<pid>.<n>.<i>.swp" in the folder itself: removed (or counted)
 * when its run is gone (no lock on it, its PID gone), as it was then. */
static void walk_flat_file(walk *w, const char *prefix, const char *name)
{
    size_t pl = strlen(prefix);
    long pid;
    unsigned n;
    int k, end = 0;
    if (strncmp(name, prefix, pl) || name[pl] != '.' ||
        sscanf(name + pl + 1, "%ld.%u.%d.swp%n", &pid, &n, &k, &end) != 3 ||
        name[pl + 1 + end] != '\0')
        return;
    char path[4600];
    snprintf(path, sizeof path, "%s/%s", w->dir, name);
    struct stat sb;
    if (fstatat(w->dfd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(sb.st_mode))
        return;
    uint64_t used = (uint64_t)sb.st_blocks * 512;
    /* a PID that still runs (perhaps another program now) is left alone */
    if (pid == (long)getpid() || !(kill((pid_t)pid, 0) < 0 && errno == ESRCH)) {
        note_held(w, path, used, pid, ZN_SWAP_HELD_LIVE);
        return;
    }
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    /* as for a run directory: two seconds for a lock held past the exit */
    bool dead = false;
    for (int t = 0; t < 40 && !(dead = flock(fd, LOCK_EX | LOCK_NB) == 0); t++)
        usleep(50 * 1000);
    if (!dead) {
        WARN(w, "swap: %s: run %ld is gone but its file is still locked; left in place", path,
             pid);
        note_held(w, path, used, pid, ZN_SWAP_HELD_LOCKED);
    } else if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
        /* (what removing it frees: nothing while a checkpoint links it) */
        used = sb.st_nlink <= 1 ? (uint64_t)sb.st_blocks * 512 : 0;
        if (!w->remove) {
            note_stale(w, used);
        } else if (unlink(path) == 0) {
            char size[32];
            note_stale(w, used);
            zn_warn("swap: removed %s, left by run %ld, which is gone (%s)", path, pid,
                    zn_format_size(used, size, sizeof size));
        }
    }
    close(fd);
}

/* Walks `dir` (a missing one has nothing) into *out. */
static int walk_folder(const char *dir, const char *prefix, bool remove, zn_swap_scan *out)
{
    memset(out, 0, sizeof *out);
    pthread_once(&self_once, init_self);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return errno == ENOENT ? 0 : zn_set_error(-errno, "swap: reading %s: %s", dir,
                                                  strerror(errno));
    int fd = dup(dfd);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        close(dfd);
        return zn_set_error(-e, "swap: reading %s: %s", dir, strerror(e));
    }
    walk w = { dir, dfd, remove, out };
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strncmp(e->d_name, RUN_DIR_PREFIX, strlen(RUN_DIR_PREFIX)))
            walk_run_dir(&w, e->d_name);
        else if (prefix && prefix[0])
            walk_flat_file(&w, prefix, e->d_name);
    }
    closedir(d);
    close(dfd);
    return 0;
}
#undef WARN

int zn_swap_scan_stale(const char *dir, const char *prefix, zn_swap_scan *out)
{
    return walk_folder(dir, prefix, false, out);
}

int zn_swap_clean_stale(const char *dir, const char *prefix, uint64_t *bytes, int *files)
{
    zn_swap_scan s;
    int rc = walk_folder(dir, prefix, true, &s);
    *bytes = s.stale_bytes;
    *files = s.stale;
    return rc;
}

const char *zn_swap_held_desc(zn_swap_held_why why)
{
    switch (why) {
    case ZN_SWAP_HELD_LIVE: return "a live run's";
    case ZN_SWAP_HELD_LOCKED: return "a dead run's, its lock still held";
    case ZN_SWAP_HELD_KEPT: return "kept (tiers.keep_swap)";
    case ZN_SWAP_HELD_OTHER_HOST: return "another host's";
    case ZN_SWAP_HELD_UNREADABLE: return "not removable";
    }
    return "left";
}
