/* Size strings, status codes and the per-thread error message; the
 * file-system helpers (util/fs-impl.h): mkdir -p, exclusive creation, and
 * the durable replace with every one of its system calls failed in turn
 * (the target is the old file or the whole new one, no temporary is left,
 * no descriptor leaks, the message names the file). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fs-impl.h"
#include "zinc/util.h"
#include "zt.h"

static void test_sizes(void)
{
    static const struct { const char *s; uint64_t v; } good[] = {
        { "0", 0 }, { "123", 123 }, { "24GiB", 24ull << 30 }, { "24G", 24ull << 30 },
        { "512MB", 512000000ull }, { "1.5TiB", 3ull << 39 }, { "4k", 4096 },
        { "4 KiB", 4096 }, { "1e9", 1000000000ull }, { "2gb", 2000000000ull },
        { "7B", 7 }, { " 1MiB ", 1ull << 20 }, { "0.5KiB", 512 },
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t v = 0;
        int rc = zn_parse_size(good[i].s, &v);
        ZT_CHECK_MSG(rc == 0, "parse '%s' failed: %s", good[i].s, zn_last_error());
        ZT_EQ_U64(v, good[i].v);
    }
    static const char *bad[] = { "", "GiB", "-1", "12XB", "1.3", "1e30", "abc", "5 GiBs" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 99;
        int rc = zn_parse_size(bad[i], &v);
        ZT_EQ_INT(rc, ZN_ECONFIG);
        if (bad[i][0])
            ZT_CONTAINS(zn_last_error(), bad[i]);
        ZT_EQ_U64(v, 99);
    }
    char buf[32];
    ZT_EQ_STR(zn_format_size(1536, buf, sizeof buf), "1.50 KiB");
    ZT_EQ_STR(zn_format_size(100, buf, sizeof buf), "100 B");
    ZT_EQ_STR(zn_format_size(24ull << 30, buf, sizeof buf), "24.00 GiB");
}

static void *other_thread(void *arg)
{
    (void)arg;
    zn_set_error(ZN_ECORRUPT, "thread-local message");
    return NULL;
}

static void test_errors(void)
{
    ZT_EQ_INT(zn_set_error(ZN_ECONFIG, "key %s", "a.b"), ZN_ECONFIG);
    ZT_EQ_STR(zn_last_error(), "key a.b");
    pthread_t t;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, NULL);
    ZT_EQ_STR(zn_last_error(), "key a.b");
    ZT_EQ_INT(zn_error_prefix(ZN_ECONFIG, "loading %s", "x.json"), ZN_ECONFIG);
    ZT_EQ_STR(zn_last_error(), "loading x.json: key a.b");
    ZT_EQ_STR(zn_strerror(-ENOENT), "No such file or directory");
    ZT_EQ_STR(zn_strerror(ZN_ECONFIG), "configuration error");
    ZT_CONTAINS(zn_strerror(-20000), "unknown");
    zn_clear_error();
    ZT_EQ_STR(zn_last_error(), "");
    zn_log_level l;
    ZT_EQ_INT(zn_log_parse_level("warn", &l), 0);
    ZT_EQ_INT(l, ZN_LOG_WARN);
    ZT_EQ_INT(zn_log_parse_level("loud", &l), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "loud");
}

/* ---- file-system helpers ---------------------------------------------------*/
static char fs_root[4096];

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)f;
    if (flag == FTW_DP)
        rmdir(p);
    else
        unlink(p);
    return 0;
}

static void fs_cleanup(void)
{
    if (fs_root[0])
        nftw(fs_root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *fs_path(const char *rel)
{
    static char buf[4][4200];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", fs_root, rel);
    return buf[k];
}

/* The file's contents ("" when it cannot be read: a test's content is
 * never empty). fs_path's results last four calls: copy those kept. */
static const char *slurp(const char *path)
{
    static char buf[256];
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f)
        return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void spit(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f || fputs(text, f) < 0 || fclose(f))
        ZT_SETUP_FAIL("writing %s: %s", path, strerror(errno));
}

/* Entries of a folder besides . and .. */
static int entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static int open_fds(void)
{
    return entries("/proc/self/fd");
}

static void test_mkdir_p(void)
{
    ZT_EQ_INT(zn_fs_mkdir_p(fs_path("m/a/b/c"), 0755), 0);
    struct stat st;
    ZT_CHECK(stat(fs_path("m/a/b/c"), &st) == 0 && S_ISDIR(st.st_mode));
    ZT_EQ_INT(zn_fs_mkdir_p(fs_path("m/a/b/c"), 0755), 0);        /* there already */
    ZT_EQ_INT(zn_fs_mkdir_p(fs_path("m//a/./b//d/"), 0755), 0);   /* odd slashes */
    ZT_CHECK(stat(fs_path("m/a/b/d"), &st) == 0 && S_ISDIR(st.st_mode));
    ZT_EQ_INT(zn_fs_mkdir_p("/", 0755), 0);
    ZT_EQ_INT(zn_fs_mkdir_p("", 0755), -ENOENT);
    /* a link to a folder is a folder, as for mkdir -p */
    ZT_EQ_INT(symlink(fs_path("m/a"), fs_path("m/link")), 0);
    ZT_EQ_INT(zn_fs_mkdir_p(fs_path("m/link/e"), 0755), 0);
    ZT_CHECK(stat(fs_path("m/a/e"), &st) == 0 && S_ISDIR(st.st_mode));
    /* a file in the way: the message names that component */
    spit(fs_path("m/file"), "x");
    ZT_EQ_INT(zn_fs_mkdir_p(fs_path("m/file/x/y"), 0755), -ENOTDIR);
    ZT_CONTAINS(zn_last_error(), fs_path("m/file"));
    ZT_CHECK_MSG(!strstr(zn_last_error(), "file/x"), "names a later component: %s",
                 zn_last_error());
    /* a component that cannot be made: named, and the later ones not tried */
    ZT_EQ_INT(mkdir(fs_path("m/ro"), 0500), 0);
    if (geteuid() != 0) {
        ZT_EQ_INT(zn_fs_mkdir_p(fs_path("m/ro/x/y"), 0755), -EACCES);
        ZT_CONTAINS(zn_last_error(), fs_path("m/ro/x"));
        ZT_CONTAINS(zn_last_error(), "mkdir");
    }
    chmod(fs_path("m/ro"), 0700);
}

static void test_create_excl(void)
{
    int fd = zn_fs_create_excl(fs_path("c-new"), 0600);
    ZT_CHECK_MSG(fd >= 0, "create: %d %s", fd, zn_last_error());
    struct stat st;
    ZT_CHECK(fd >= 0 && fstat(fd, &st) == 0 && (st.st_mode & 0777) == 0600);
    ZT_CHECK(fd >= 0 && write(fd, "rw", 2) == 2 && pread(fd, (char[2]){ 0 }, 2, 0) == 2);
    if (fd >= 0)
        close(fd);
    ZT_EQ_INT(zn_fs_create_excl(fs_path("c-new"), 0600), -EEXIST);
    ZT_CONTAINS(zn_last_error(), fs_path("c-new"));
    ZT_CONTAINS(zn_last_error(), "open");
    /* a planted link: refused, its target untouched */
    spit(fs_path("c-victim"), "keep");
    ZT_EQ_INT(symlink(fs_path("c-victim"), fs_path("c-link")), 0);
    ZT_EQ_INT(zn_fs_create_excl(fs_path("c-link"), 0600), -EEXIST);
    ZT_EQ_STR(slurp(fs_path("c-victim")), "keep");
    /* a dangling one too (O_NOFOLLOW | O_EXCL): nothing made at its target */
    ZT_EQ_INT(symlink(fs_path("c-nowhere"), fs_path("c-dangling")), 0);
    ZT_EQ_INT(zn_fs_create_excl(fs_path("c-dangling"), 0600), -EEXIST);
    ZT_CHECK(access(fs_path("c-nowhere"), F_OK) != 0);
    /* write_new: whole and fsynced, or nothing left */
    ZT_EQ_INT(zn_fs_write_new(fs_path("c-small"), "small", 5, 0644), 0);
    ZT_EQ_STR(slurp(fs_path("c-small")), "small");
    ZT_EQ_INT(zn_fs_write_new(fs_path("c-small"), "again", 5, 0644), -EEXIST);
    ZT_EQ_STR(slurp(fs_path("c-small")), "small");
}

static void test_replace(void)
{
    ZT_EQ_INT(zn_fs_mkdir_p(fs_path("r"), 0755), 0);
    char t[4200];
    snprintf(t, sizeof t, "%s", fs_path("r/target.json"));
    ZT_EQ_INT(zn_fs_write_atomic(t, "one", 3), 0);
    ZT_EQ_STR(slurp(t), "one");
    ZT_EQ_INT(zn_fs_write_atomic(t, "two!", 4), 0);
    ZT_EQ_STR(slurp(t), "two!");
    ZT_EQ_INT(entries(fs_path("r")), 1);
    struct stat st;
    mode_t um = umask(0);
    umask(um);
    ZT_CHECK(stat(t, &st) == 0 && (st.st_mode & 0777) == (0644 & ~um));
    /* a bare name: the temporary and the fsync are in "." */
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd) || chdir(fs_path("r")))
        ZT_SETUP_FAIL("chdir %s", fs_path("r"));
    ZT_EQ_INT(zn_fs_write_atomic("bare", "b", 1), 0);
    if (chdir(cwd))
        ZT_SETUP_FAIL("chdir %s", cwd);
    ZT_EQ_STR(slurp(fs_path("r/bare")), "b");
    unlink(fs_path("r/bare"));

    /* a link at the target is replaced, its target left alone */
    spit(fs_path("r-victim"), "keep");
    ZT_EQ_INT(symlink(fs_path("r-victim"), fs_path("r/linked")), 0);
    ZT_EQ_INT(zn_fs_write_atomic(fs_path("r/linked"), "new", 3), 0);
    ZT_EQ_STR(slurp(fs_path("r-victim")), "keep");
    ZT_CHECK(lstat(fs_path("r/linked"), &st) == 0 && S_ISREG(st.st_mode));
    unlink(fs_path("r/linked"));

    /* streamed, aborted: target as it was, nothing left */
    zn_fs_tmp h;
    ZT_EQ_INT(zn_fs_tmp_fopen(&h, t, 0644), 0);
    ZT_CHECK(h.f != NULL && h.fd >= 0 && h.tmp && strstr(h.tmp, "target.json"));
    fprintf(h.f, "half a fi");
    ZT_EQ_INT(entries(fs_path("r")), 2);
    zn_fs_tmp_abort(&h);
    zn_fs_tmp_abort(&h);                     /* twice: a no-op */
    ZT_EQ_STR(slurp(t), "two!");
    ZT_EQ_INT(entries(fs_path("r")), 1);
    /* streamed, committed */
    ZT_EQ_INT(zn_fs_tmp_fopen(&h, t, 0644), 0);
    fprintf(h.f, "streamed %d", 3);
    ZT_EQ_INT(zn_fs_tmp_commit(&h), 0);
    ZT_EQ_STR(slurp(t), "streamed 3");
    ZT_CHECK(h.tmp == NULL && h.fd == -1 && h.f == NULL);
    zn_fs_tmp_abort(&h);                     /* after a commit: a no-op */
    ZT_EQ_STR(slurp(t), "streamed 3");
    ZT_EQ_INT(zn_fs_tmp_commit(&h), -EINVAL);
    /* through the fd (pwrite, as the safetensors writer does) */
    ZT_EQ_INT(zn_fs_tmp_open(&h, t, 0), 0);
    ZT_CHECK(h.f == NULL && pwrite(h.fd, "fd", 2, 4) == 2 && pwrite(h.fd, "via-", 4, 0) == 4);
    ZT_EQ_INT(zn_fs_tmp_commit(&h), 0);
    ZT_EQ_STR(slurp(t), "via-fd");
    ZT_EQ_INT(entries(fs_path("r")), 1);
    /* a stale temporary of this pid (a dead process's) is stepped over */
    zn_fs_tmp a, b;
    ZT_EQ_INT(zn_fs_tmp_open(&a, t, 0), 0);
    ZT_EQ_INT(zn_fs_tmp_open(&b, t, 0), 0);
    ZT_CHECK(a.tmp && b.tmp && strcmp(a.tmp, b.tmp) != 0);
    zn_fs_tmp_abort(&a);
    zn_fs_tmp_abort(&b);
    /* the target a folder: the rename fails, the temporary goes */
    ZT_EQ_INT(zn_fs_mkdir_p(fs_path("r/dir/sub"), 0755), 0);
    int rc = zn_fs_write_atomic(fs_path("r/dir"), "x", 1);
    ZT_CHECK_MSG(rc == -EISDIR || rc == -ENOTEMPTY || rc == -EEXIST, "rename over a folder: %d",
                 rc);
    ZT_CONTAINS(zn_last_error(), "rename");
    ZT_CONTAINS(zn_last_error(), fs_path("r/dir"));
    ZT_EQ_INT(entries(fs_path("r")), 2);
    /* the folder missing: nothing made */
    ZT_EQ_INT(zn_fs_write_atomic(fs_path("r/none/x"), "x", 1), -ENOENT);
    ZT_CONTAINS(zn_last_error(), fs_path("r/none/x"));
    ZT_EQ_INT(zn_fs_tmp_open(&h, fs_path("r/"), 0), -EISDIR);
}

/* ---- the fault sweep: the n-th call of the module fails ------------------*/
typedef struct {
    int n;          /* the call to fail, from 1; 0: none */
    int err;        /* with -err */
    int calls;      /* calls seen */
    int rename_at;  /* the index of the rename call, 0 until seen */
    int short_write;
    const char *fail_path;  /* else: fail the first call on this path */
    char what[64];
} fault_plan;

static int fault_fn(void *user, const char *call, const char *path)
{
    fault_plan *f = user;
    f->calls++;
    if (!strcmp(call, "rename"))
        f->rename_at = f->calls;
    if (f->calls == f->n || (f->fail_path && !strcmp(path, f->fail_path))) {
        f->fail_path = NULL;
        snprintf(f->what, sizeof f->what, "%s", call);
        return -f->err;
    }
    return !strcmp(call, "write") ? f->short_write : 0;
}

/* which: 0 whole-buffer, 1 streamed through stdio, 2 through the fd */
static int replace_with(int which, const char *t, const char *text)
{
    if (which == 0)
        return zn_fs_write_atomic(t, text, strlen(text));
    zn_fs_tmp h;
    int rc = which == 1 ? zn_fs_tmp_fopen(&h, t, 0644) : zn_fs_tmp_open(&h, t, 0644);
    if (rc)
        return rc;
    if (which == 1)
        fputs(text, h.f);
    else if ((rc = zn_fs_write_full(h.fd, text, strlen(text), h.tmp))) {
        zn_fs_tmp_abort(&h);
        return rc;
    }
    return zn_fs_tmp_commit(&h);
}

static void test_fault_sweep(void)
{
    static const char *const form[] = { "whole", "stdio", "fd" };
    char t[4200];
    snprintf(t, sizeof t, "%s", fs_path("f/target"));
    char big[20000];
    for (size_t i = 0; i < sizeof big - 1; i++)
        big[i] = (char)('a' + i % 26);
    big[sizeof big - 1] = '\0';
    ZT_EQ_INT(zn_fs_mkdir_p(fs_path("f"), 0755), 0);
    int fds = open_fds();
    for (int which = 0; which < 3; which++) {
        int done = 0, failed = 0, after_rename = 0;
        for (int n = 1; !done && n < 100; n++) {
            spit(t, "old");
            fault_plan fp = { .n = n, .err = n % 2 ? EIO : ENOSPC };
            zn_clear_error();
            zn_fs_set_fault(fault_fn, &fp);
            int rc = replace_with(which, t, big);
            zn_fs_set_fault(NULL, NULL);
            const char *now = slurp(t);
            if (fp.calls < n) {        /* every call ran: the sweep is over */
                ZT_CHECK_MSG(rc == 0, "%s: no fault, rc %d (%s)", form[which], rc,
                             zn_last_error());
                ZT_CHECK_MSG(!strncmp(now, big, 200), "%s: the new file is not in place",
                             form[which]);
                done = 1;
            } else {
                failed++;
                ZT_CHECK_MSG(rc == -fp.err, "%s: %s failed (call %d): rc %d, want %d (%s)",
                             form[which], fp.what, n, rc, -fp.err, zn_last_error());
                ZT_CHECK_MSG(strstr(zn_last_error(), "target") != NULL,
                             "%s: %s failed: the message names no file: '%s'", form[which],
                             fp.what, zn_last_error());
                if (fp.rename_at && n > fp.rename_at) {
                    /* only the folder's fsync is left: in place, said to be at risk */
                    after_rename++;
                    ZT_CHECK_MSG(!strncmp(now, big, 200), "%s: after the rename, %s failed: "
                                 "target '%.10s'", form[which], fp.what, now);
                } else {
                    ZT_CHECK_MSG(!strcmp(now, "old"), "%s: %s failed (call %d): target "
                                 "'%.10s', not the old one", form[which], fp.what, n, now);
                }
            }
            ZT_CHECK_MSG(entries(fs_path("f")) == 1, "%s: call %d (%s) failed: %d entries "
                         "left in the folder", form[which], n, fp.what, entries(fs_path("f")));
        }
        ZT_CHECK_MSG(done && failed >= 6 && after_rename >= 1,
                     "%s: the sweep covered %d failures (%d after the rename)", form[which],
                     failed, after_rename);
    }
    ZT_EQ_INT(open_fds(), fds);
    /* short writes all the way: the whole buffer still goes out */
    fault_plan fp = { .short_write = 1 };
    zn_fs_set_fault(fault_fn, &fp);
    ZT_EQ_INT(replace_with(0, t, "short writes"), 0);
    zn_fs_set_fault(NULL, NULL);
    ZT_EQ_STR(slurp(t), "short writes");
    ZT_CHECK(fp.calls > 12);
    /* mkdir -p: a failed component named, the earlier ones made */
    fault_plan mp = { .err = EIO, .fail_path = fs_path("f/x/y") };
    zn_fs_set_fault(fault_fn, &mp);
    ZT_EQ_INT(zn_fs_mkdir_p(fs_path("f/x/y/z"), 0755), -EIO);
    zn_fs_set_fault(NULL, NULL);
    ZT_CONTAINS(zn_last_error(), fs_path("f/x/y"));
    ZT_CHECK(access(fs_path("f/x"), F_OK) == 0 && access(fs_path("f/x/y"), F_OK) != 0);
    /* write_new: a failed write leaves no part of the file */
    fault_plan wp = { .n = 2, .err = ENOSPC };
    zn_fs_set_fault(fault_fn, &wp);
    ZT_EQ_INT(zn_fs_write_new(fs_path("f/new"), "abc", 3, 0644), -ENOSPC);
    zn_fs_set_fault(NULL, NULL);
    ZT_CHECK(access(fs_path("f/new"), F_OK) != 0);
    ZT_EQ_INT(open_fds(), fds);
}

int main(void)
{
    test_sizes();
    test_errors();
    snprintf(fs_root, sizeof fs_root, "fs-XXXXXX");
    if (!mkdtemp(fs_root))
        ZT_SETUP_FAIL("mkdtemp: %s", strerror(errno));
    char *abs = realpath(fs_root, NULL);
    if (abs) {
        snprintf(fs_root, sizeof fs_root, "%s", abs);
        free(abs);
    }
    atexit(fs_cleanup);
    test_mkdir_p();
    test_create_excl();
    test_replace();
    test_fault_sweep();
    return zt_done();
}
