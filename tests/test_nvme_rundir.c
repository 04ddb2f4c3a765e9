/* Run directories (issue 32): a swap space with run_dir puts each path's file
 * in a new 0700 directory of its own, locked for its life, with a lock file
 * naming host, PID and start, and removes all of it at destroy (keep_files:
 * keeps it, marked) or from a signal handler (zn_swap_remove_all_now). The
 * stale scan removes a dead run's directory with its size reported (its PID
 * gone, or given to a process that started at another time) and the old
 * flat files of dead runs, and leaves a live run's, a kept one, another
 * host's (with a warning) and anything that is not a run directory. The
 * count-only scan (zn_swap_scan_stale) finds the same dead runs' bytes as a
 * removal frees, names what stays (live, kept, another host's) with its
 * size, and removes and says nothing. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_nvme_common.h"

/* ---- helpers ------------------------------------------------------------- */
static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}

/* tn_rmdir removes one level; a failed check can leave run directories */
static void rm_tree(void)
{
    if (tn_dir[0])
        nftw(tn_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}


static int exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

static void write_file(const char *p, size_t bytes)
{
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        ZT_SETUP_FAIL("creating %s: %s", p, strerror(errno));
    char buf[4096];
    memset(buf, 0x5a, sizeof buf);
    for (size_t o = 0; o < bytes; o += sizeof buf)
        if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf)
            ZT_SETUP_FAIL("writing %s: %s", p, strerror(errno));
    close(fd);
}

static char *read_text(const char *p, char *buf, size_t n)
{
    buf[0] = '\0';
    FILE *f = fopen(p, "r");
    if (f) {
        size_t k = fread(buf, 1, n - 1, f);
        buf[k] = '\0';
        fclose(f);
    }
    return buf;
}

/* The scan's warnings, caught from stderr. */
static char caught[16384];
static int saved_err = -1;
static char cap_path[4400];

static void capture_begin(void)
{
    snprintf(cap_path, sizeof cap_path, "%s/../rundir-capture.%ld", tn_dir, (long)getpid());
    fflush(stderr);
    saved_err = dup(2);
    int fd = open(cap_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || saved_err < 0)
        ZT_SETUP_FAIL("capturing stderr: %s", strerror(errno));
    dup2(fd, 2);
    close(fd);
}

static const char *capture_end(void)
{
    fflush(stderr);
    dup2(saved_err, 2);
    close(saved_err);
    read_text(cap_path, caught, sizeof caught);
    unlink(cap_path);
    fputs(caught, stderr);  /* shown in the test log too */
    return caught;
}

/* A PID that no process has: a child that has exited and been reaped. */
static long dead_pid(void)
{
    pid_t p = fork();
    if (p < 0)
        ZT_SETUP_FAIL("fork: %s", strerror(errno));
    if (p == 0)
        _exit(0);
    waitpid(p, NULL, 0);
    return (long)p;
}

/* The entry of a scan that names `path`, or NULL. */
static const void *named_in(const zn_swap_scan *sc, const char *path, zn_swap_held_why why,
                            uint64_t min_bytes)
{
    for (int i = 0; i < sc->n_named; i++)
        if (!strcmp(sc->named[i].path, path) && sc->named[i].why == why &&
            sc->named[i].bytes >= min_bytes)
            return &sc->named[i];
    return NULL;
}

/* A fake run directory: name, lock file (not held) with `lock_text`, and a
 * swap file of `bytes`. */
static void fake_run(const char *path, const char *lock_text, size_t bytes)
{
    char p[4600];
    if (mkdir(path, 0700) < 0)
        ZT_SETUP_FAIL("mkdir %s: %s", path, strerror(errno));
    snprintf(p, sizeof p, "%s/lock", path);
    FILE *f = fopen(p, "w");
    if (!f)
        ZT_SETUP_FAIL("creating %s", p);
    fputs(lock_text, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/zinc-train.0.swp", path);
    write_file(p, bytes);
}

int main(void)
{
    const char *dir = tn_tmpdir("rundir");
    atexit(rm_tree);  /* runs before tn_rmdir */
    uint64_t bytes;
    int files;
    char p[9400], text[4096];
    static zn_swap_scan scan;   /* 11 KiB */

    /* 1. a live run in another process: a child that holds a swap space
     * with run_dir (forked before this process starts engine threads) */
    int pfd[2], gofd[2];
    if (pipe(pfd) || pipe(gofd))
        ZT_SETUP_FAIL("pipe: %s", strerror(errno));
    pid_t child = fork();
    if (child < 0)
        ZT_SETUP_FAIL("fork: %s", strerror(errno));
    if (child == 0) {
        zn_aio *ca = NULL;
        zn_swap *cs = NULL;
        zn_swap_config sc = zn_swap_config_default();
        sc.npaths = 1;
        sc.paths[0] = dir;
        sc.bytes = 1 << 20;
        sc.run_dir = 1;
        sc.file_prefix = "zinc-train";
        char path[4096] = "";
        zn_aio_config ac = zn_aio_config_default();
        if (!zn_aio_create(&ca, &ac) && !zn_swap_create(&cs, ca, &sc))
            snprintf(path, sizeof path, "%s", zn_swap_file_path(cs, 0));
        if (write(pfd[1], path, sizeof path) != (ssize_t)sizeof path)
            _exit(1);
        char c;
        if (read(gofd[0], &c, 1) != 1)   /* killed meanwhile, or told to end */
            _exit(1);
        zn_swap_destroy(cs);
        zn_aio_destroy(ca);
        _exit(0);
    }
    char live_file[4096];
    if (read(pfd[0], live_file, sizeof live_file) != (ssize_t)sizeof live_file || !live_file[0])
        ZT_SETUP_FAIL("the child could not make its swap space");
    char live_dir[4096];
    snprintf(live_dir, sizeof live_dir, "%s", live_file);
    *strrchr(live_dir, '/') = '\0';
    const char *live_name = strrchr(live_dir, '/') + 1;
    ZT_CHECK_MSG(!strncmp(live_name, "zinc-run.", 9), "run directory %s", live_dir);
    /* the host as the name spells it: between "zinc-run." and ".<pid>." */
    char host[256] = "", mark[64];
    snprintf(mark, sizeof mark, ".%ld.", (long)child);
    const char *at = strstr(live_name + 9, mark);
    if (!at)
        ZT_SETUP_FAIL("no .%ld. in %s", (long)child, live_name);
    snprintf(host, sizeof host, "%.*s", (int)(at - live_name - 9), live_name + 9);
    long long child_start = atoll(at + strlen(mark));
    ZT_CHECK(child_start > 1000000000);

    /* the scan counts the live run's directory as held, with its size */
    capture_begin();
    ZT_EQ_INT(zn_swap_scan_stale(dir, "zinc-train", &scan), 0);
    capture_end();
    ZT_EQ_INT(scan.stale, 0);
    ZT_CHECK(scan.stale_bytes == 0);
    ZT_EQ_INT(scan.held, 1);
    ZT_EQ_INT(scan.n_named, 1);
    ZT_CHECK_MSG(named_in(&scan, live_dir, ZN_SWAP_HELD_LIVE, 1u << 20),
                 "the live run's %s is not named as held: %s", live_dir, scan.named[0].path);
    ZT_EQ_INT((int)scan.named[0].pid, (int)child);
    ZT_CHECK(scan.held_bytes >= (1u << 20));
    ZT_CHECK_MSG(!caught[0], "the scan warned: %s", caught);
    capture_begin();
    ZT_EQ_INT(zn_swap_clean_stale(dir, "zinc-train", &bytes, &files), 0);
    capture_end();
    ZT_CHECK_MSG(exists(live_file), "a live run's swap file was removed: %s", live_file);
    ZT_EQ_INT(files, 0);
    ZT_CHECK_MSG(!strstr(caught, live_name), "a live run's directory was warned about: %s",
                 caught);

    /* 2. the same run killed: its directory is a dead run's */
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    ZT_CHECK(exists(live_file));
    /* the scan counts it as a dead run's, removes nothing and says nothing */
    capture_begin();
    ZT_EQ_INT(zn_swap_scan_stale(dir, "zinc-train", &scan), 0);
    capture_end();
    ZT_EQ_INT(scan.stale, 1);
    ZT_CHECK_MSG(scan.stale_bytes >= (1u << 20), "%llu bytes counted",
                 (unsigned long long)scan.stale_bytes);
    ZT_EQ_INT(scan.held, 0);
    ZT_CHECK_MSG(exists(live_file), "the scan removed %s", live_file);
    ZT_CHECK_MSG(!caught[0], "the scan warned: %s", caught);
    uint64_t counted = scan.stale_bytes;
    capture_begin();
    ZT_EQ_INT(zn_swap_clean_stale(dir, "zinc-train", &bytes, &files), 0);
    capture_end();
    ZT_EQ_INT(files, 1);
    ZT_CHECK_MSG(bytes == counted, "removed %llu bytes, the scan counted %llu",
                 (unsigned long long)bytes, (unsigned long long)counted);
    ZT_CHECK_MSG(bytes >= (1u << 20), "%llu bytes freed", (unsigned long long)bytes);
    ZT_CHECK_MSG(!exists(live_dir), "a killed run's directory is still there: %s", live_dir);
    snprintf(mark, sizeof mark, "left by run %ld", (long)child);
    ZT_CONTAINS(caught, mark);
    ZT_CONTAINS(caught, "1.00 MiB");
    ZT_EQ_INT(tn_dir_count(dir, ""), 0);

    /* 3. this process's own swap space: a new 0700 directory with the lock
     * (held) naming host, PID and start, and the file; all gone at destroy */
    zn_aio_config ac = zn_aio_config_default();
    zn_aio *a;
    if (zn_aio_create(&a, &ac))
        ZT_SETUP_FAIL("zn_aio_create: %s", zn_last_error());
    zn_swap_config sc = zn_swap_config_default();
    sc.npaths = 2;
    sc.paths[0] = dir;
    sc.paths[1] = dir;  /* twice: two directories, no clash */
    sc.bytes = 2 << 20;
    sc.run_dir = 1;
    sc.file_prefix = "zinc-test";
    zn_swap *s;
    ZT_EQ_INT(zn_swap_create(&s, a, &sc), 0);
    ZT_EQ_INT(tn_dir_count(dir, ""), 2);
    char rd[4600], lock[4700];
    snprintf(rd, sizeof rd, "%s", zn_swap_file_path(s, 0));
    *strrchr(rd, '/') = '\0';
    snprintf(lock, sizeof lock, "%s/lock", rd);
    struct stat st;
    ZT_EQ_INT(stat(rd, &st), 0);
    ZT_CHECK(S_ISDIR(st.st_mode));
    ZT_EQ_INT(st.st_mode & 0777, 0700);
    ZT_CHECK(!strcmp(strrchr(zn_swap_file_path(s, 0), '/') + 1, "zinc-test.0.swp"));
    ZT_EQ_INT(tn_dir_count(rd, ""), 2);
    read_text(lock, text, sizeof text);
    snprintf(mark, sizeof mark, "\npid %ld\n", (long)getpid());
    ZT_CONTAINS(text, mark);
    ZT_CONTAINS(text, "\nhost ");
    ZT_CONTAINS(text, "\nstart ");
    ZT_CONTAINS(text, "\nmade-by zinc-test\n");
    int lfd = open(lock, O_RDONLY);
    ZT_CHECK(lfd >= 0 && flock(lfd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK);
    if (lfd >= 0)
        close(lfd);
    /* this process's own directories are live ones to the scan */
    ZT_EQ_INT(zn_swap_clean_stale(dir, "zinc-test", &bytes, &files), 0);
    ZT_EQ_INT(files, 0);
    ZT_EQ_INT(tn_dir_count(dir, ""), 2);
    zn_swap_destroy(s);
    ZT_EQ_INT(tn_dir_count(dir, ""), 0);

    /* 4. keep_files keeps the directory, marked; the scan leaves it */
    sc.npaths = 1;
    sc.keep_files = 1;
    ZT_EQ_INT(zn_swap_create(&s, a, &sc), 0);
    snprintf(rd, sizeof rd, "%s", zn_swap_file_path(s, 0));
    *strrchr(rd, '/') = '\0';
    zn_swap_destroy(s);
    ZT_EQ_INT(tn_dir_count(rd, ""), 2);
    snprintf(lock, sizeof lock, "%s/lock", rd);
    ZT_CONTAINS(read_text(lock, text, sizeof text), "\nkept");
    /* as if its run had ended long ago: another PID */
    long gone = dead_pid();
    char kept[4600];
    snprintf(kept, sizeof kept, "%s/zinc-run.%s.%ld.1700000000.0", dir, host, gone);
    ZT_EQ_INT(rename(rd, kept), 0);
    ZT_EQ_INT(zn_swap_scan_stale(dir, "zinc-test", &scan), 0);
    ZT_EQ_INT(scan.stale, 0);
    ZT_EQ_INT(scan.held, 1);
    ZT_CHECK_MSG(named_in(&scan, kept, ZN_SWAP_HELD_KEPT, 2u << 20), "the kept %s is not named",
                 kept);
    ZT_CONTAINS(zn_swap_held_desc(ZN_SWAP_HELD_KEPT), "keep_swap");
    capture_begin();
    ZT_EQ_INT(zn_swap_clean_stale(dir, "zinc-test", &bytes, &files), 0);
    capture_end();
    ZT_EQ_INT(files, 0);
    ZT_CHECK(exists(kept));
    ZT_CONTAINS(caught, "tiers.keep_swap");
    snprintf(p, sizeof p, "rm -rf '%s'", kept);
    ZT_EQ_INT(system(p), 0);
    sc.keep_files = 0;

    /* 5. the signal handler's removal: files, lock and directory */
    ZT_EQ_INT(zn_swap_create(&s, a, &sc), 0);
    snprintf(rd, sizeof rd, "%s", zn_swap_file_path(s, 0));
    *strrchr(rd, '/') = '\0';
    ZT_EQ_INT(zn_swap_remove_all_now(), 3);
    ZT_CHECK_MSG(!exists(rd), "%s survived zn_swap_remove_all_now", rd);
    ZT_EQ_INT(tn_dir_count(dir, ""), 0);
    capture_begin();  /* destroy warns that they are gone already */
    zn_swap_destroy(s);
    capture_end();
    zn_aio_destroy(a);

    /* 6. fakes: a dead PID's, a PID that runs again but started at another
     * time, another host's, a kept one's, an old flat file of a dead run and
     * of a live one, and things that are not run directories */
    long dead = dead_pid();
    char d_dead[4600], d_reused[4600], d_other[4600], d_bad[4600], d_link[4600], target[4600];
    snprintf(d_dead, sizeof d_dead, "%s/zinc-run.%s.%ld.1700000000.3", dir, host, dead);
    fake_run(d_dead, "zinc run directory\n", 2 << 20);
    snprintf(d_reused, sizeof d_reused, "%s/zinc-run.%s.%ld.1000000000.0", dir, host,
             (long)getppid());
    fake_run(d_reused, "zinc run directory\n", 1 << 20);
    snprintf(d_other, sizeof d_other, "%s/zinc-run.other-host.example.%ld.1700000000.0", dir,
             dead);
    fake_run(d_other, "zinc run directory\n", 1 << 20);
    snprintf(d_bad, sizeof d_bad, "%s/zinc-run.not-a-run", dir);
    ZT_EQ_INT(mkdir(d_bad, 0700), 0);
    /* a symbolic link named as a run directory is not followed */
    snprintf(target, sizeof target, "%s/target", dir);
    fake_run(target, "", 4096);
    snprintf(d_link, sizeof d_link, "%s/zinc-run.%s.%ld.1700000000.9", dir, host, dead);
    ZT_EQ_INT(symlink(target, d_link), 0);
    char flat_dead[4600], flat_live[4600];
    snprintf(flat_dead, sizeof flat_dead, "%s/zinc-train.%ld.0.0.swp", dir, dead);
    write_file(flat_dead, 1 << 20);
    snprintf(flat_live, sizeof flat_live, "%s/zinc-train.%ld.0.0.swp", dir, (long)getppid());
    write_file(flat_live, 4096);
    /* the scan: the three that go counted, the two that stay named, nothing
     * removed, nothing said */
    capture_begin();
    ZT_EQ_INT(zn_swap_scan_stale(dir, "zinc-train", &scan), 0);
    capture_end();
    ZT_CHECK_MSG(!caught[0], "the scan warned: %s", caught);
    ZT_EQ_INT(scan.stale, 3);
    ZT_CHECK_MSG(scan.stale_bytes >= (4u << 20), "%llu bytes counted",
                 (unsigned long long)scan.stale_bytes);
    ZT_EQ_INT(scan.held, 2);
    ZT_CHECK(named_in(&scan, d_other, ZN_SWAP_HELD_OTHER_HOST, 1u << 20));
    ZT_CHECK(named_in(&scan, flat_live, ZN_SWAP_HELD_LIVE, 4096));
    ZT_CHECK(scan.held_bytes >= (1u << 20) + 4096);
    ZT_CHECK(exists(d_dead) && exists(d_reused) && exists(flat_dead) && exists(d_other) &&
             exists(flat_live));
    counted = scan.stale_bytes;
    capture_begin();
    ZT_EQ_INT(zn_swap_clean_stale(dir, "zinc-train", &bytes, &files), 0);
    capture_end();
    ZT_EQ_INT(files, 3);
    ZT_CHECK_MSG(bytes == counted, "removed %llu bytes, the scan counted %llu",
                 (unsigned long long)bytes, (unsigned long long)counted);
    ZT_CHECK_MSG(!exists(d_dead), "a dead run's directory survived: %s", d_dead);
    ZT_CHECK_MSG(!exists(d_reused), "a reused PID's old directory survived: %s", d_reused);
    ZT_CHECK_MSG(!exists(flat_dead), "a dead run's old-layout file survived: %s", flat_dead);
    ZT_CHECK_MSG(bytes >= (4u << 20), "%llu bytes freed", (unsigned long long)bytes);
    snprintf(mark, sizeof mark, "left by run %ld", dead);
    ZT_CONTAINS(caught, mark);
    ZT_CONTAINS(caught, "2.00 MiB");
    ZT_CONTAINS(caught, "its PID is another process's now");
    ZT_CHECK(exists(d_other));
    ZT_CONTAINS(caught, "on host other-host.example");
    ZT_CONTAINS(caught, "Remove it by hand");
    ZT_CHECK(exists(d_bad));
    ZT_CHECK(exists(d_link));
    ZT_CONTAINS(caught, "is a symbolic link, not a run directory");
    snprintf(p, sizeof p, "%s/zinc-train.0.swp", target);
    ZT_CHECK_MSG(exists(p), "the scan followed a symbolic link into %s", target);
    ZT_CHECK(exists(flat_live));
    /* a missing folder has nothing to clean */
    snprintf(p, sizeof p, "%s/none", dir);
    ZT_EQ_INT(zn_swap_clean_stale(p, "zinc-train", &bytes, &files), 0);
    ZT_EQ_INT(files, 0);
    ZT_EQ_INT(zn_swap_scan_stale(p, "zinc-train", &scan), 0);
    ZT_EQ_INT(scan.stale + scan.held, 0);
    return zt_done();
}
