/* A real small file system (a loop-mounted 64 MiB ext4 image): a swap space
 * that does not fit is refused at creation, naming the path, the bytes
 * needed and the bytes free, and leaves no file behind; one that fits has
 * its space reserved up front (the free space drops) and works with
 * O_DIRECT through the loop device. Skipped (77) where mkfs.ext4 or loop
 * mounts are unavailable. The mount and the image are removed in all cases. */
#include <errno.h>
#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_nvme_common.h"

static char img[4300], mnt[4300];
static int mounted;

static void cleanup(void)
{
    if (mounted) {
        if (umount2(mnt, 0) < 0 && umount2(mnt, MNT_DETACH) < 0)
            fprintf(stderr, "umount %s: %s\n", mnt, strerror(errno));
        mounted = 0;
    }
    if (mnt[0])
        rmdir(mnt);
    if (img[0])
        unlink(img);
}

static void on_signal(int sig)
{
    cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

static int run_cmd(const char *cmd)
{
    int rc = system(cmd);
    return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strncmp(e->d_name, "zinc-swap", 9) == 0;
    if (d)
        closedir(d);
    return n;
}

int main(void)
{
    if (geteuid() != 0)
        ZT_SKIP("needs root to loop-mount a file system");
    const char *dir = tn_tmpdir("enospc");
    snprintf(img, sizeof img, "%s/fs.img", dir);
    snprintf(mnt, sizeof mnt, "%s/mnt", dir);
    atexit(cleanup); /* runs before tn_rmdir (registered earlier) */
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    if (mkdir(mnt, 0700) < 0)
        ZT_SETUP_FAIL("mkdir %s", mnt);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "truncate -s 64M '%s' && mkfs.ext4 -q -F -m 0 '%s' >/dev/null 2>&1",
             img, img);
    if (run_cmd(cmd) != 0)
        ZT_SKIP("mkfs.ext4 unavailable or failed");
    snprintf(cmd, sizeof cmd, "mount -o loop '%s' '%s' 2>/dev/null", img, mnt);
    if (run_cmd(cmd) != 0)
        ZT_SKIP("cannot loop-mount an ext4 image here (mount -o loop failed)");
    mounted = 1;

    struct statvfs sv;
    ZT_EQ_INT(statvfs(mnt, &sv), 0);
    uint64_t free0 = (uint64_t)sv.f_bavail * sv.f_frsize;
    printf("# loop ext4 at %s: %" PRIu64 " bytes free\n", mnt, free0);

    zn_aio_config c = zn_aio_config_default();
    c.block_size = 1 << 20;
    zn_aio *a;
    if (zn_aio_create(&a, &c))
        ZT_SETUP_FAIL("zn_aio_create: %s", zn_last_error());
    zn_swap_config sc = zn_swap_config_default();
    sc.npaths = 1;
    sc.paths[0] = mnt;

    /* Too big: refused before anything is written. */
    sc.bytes = 200u << 20;
    zn_swap *s = NULL;
    ZT_EQ_INT(zn_swap_create(&s, a, &sc), -ENOSPC);
    ZT_CHECK(s == NULL);
    ZT_CONTAINS(zn_last_error(), mnt);
    ZT_CONTAINS(zn_last_error(), "209715200 bytes");
    ZT_CONTAINS(zn_last_error(), "free");
    ZT_EQ_INT(count_files(mnt), 0);
    printf("# %s\n", zn_last_error());

    /* Fits: space reserved at creation. */
    sc.bytes = 32u << 20;
    ZT_EQ_INT(zn_swap_create(&s, a, &sc), 0);
    ZT_EQ_INT(statvfs(mnt, &sv), 0);
    uint64_t free1 = (uint64_t)sv.f_bavail * sv.f_frsize;
    ZT_CHECK_MSG(free0 - free1 >= (32u << 20), "fallocate reserved only %" PRIu64 " bytes",
                 free0 - free1);
    /* A second one no longer fits. */
    zn_swap *s2 = NULL;
    ZT_EQ_INT(zn_swap_create(&s2, a, &sc), -ENOSPC);
    ZT_CONTAINS(zn_last_error(), "33554432 bytes");
    ZT_EQ_INT(count_files(mnt), 1);
    /* Exactly the free space (rounded down to a block): either fallocate
     * finds room for its metadata or it fails naming the file. */
    sc.bytes = (free1 >> 20) << 20;
    if (sc.bytes) {
        int rc = zn_swap_create(&s2, a, &sc);
        if (rc) {
            ZT_EQ_INT(rc, -ENOSPC);
            ZT_CONTAINS(zn_last_error(), mnt);
            ZT_EQ_INT(count_files(mnt), 1);
            printf("# %s\n", zn_last_error());
        } else {
            zn_swap_destroy(s2);
        }
    }
    /* The swap space on the small file system works, with O_DIRECT. */
    if (s) {
        zn_swap_stats ss;
        zn_swap_get_stats(s, &ss);
        printf("# direct I/O on the loop device: %d (align %u)\n", ss.direct, ss.align);
        zn_extent e;
        size_t n = (30u << 20) + 12345;
        ZT_EQ_INT(zn_swap_alloc(s, n, "fills.most", &e), 0);
        zn_extent e2;
        ZT_EQ_INT(zn_swap_alloc(s, 4u << 20, "one.too.many", &e2), -ENOSPC);
        ZT_CONTAINS(zn_last_error(), "one.too.many");
        unsigned char *buf = tn_alloc(n);
        tn_fill(buf, n, 11, 0);
        zn_aio_handle h;
        ZT_EQ_INT(zn_aio_submit_write(a, &e, buf, n, &h), 0);
        ZT_EQ_INT(zn_aio_wait(a, h), 0);
        memset(buf, 0, n);
        ZT_EQ_INT(zn_aio_submit_read(a, &e, buf, n, &h), 0);
        ZT_EQ_INT(zn_aio_wait(a, h), 0);
        ZT_EQ_U64(tn_wrong(buf, n, 11, 0), 0);
        free(buf);
        zn_swap_destroy(s);
    }
    ZT_EQ_INT(count_files(mnt), 0);
    zn_aio_destroy(a);
    cleanup();
    return zt_done();
}
