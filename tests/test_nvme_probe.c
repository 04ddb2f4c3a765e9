/* zn_nvme_probe: what it reports on the build directory's file system, on
 * tmpfs, under ZINC_AIO_FORCE, and for bad paths; and that it agrees with
 * what the engine and a swap space really pick. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "test_nvme_common.h"

int main(void)
{
    const char *dir = tn_tmpdir("probe");
    unsetenv("ZINC_AIO_FORCE");
    zn_nvme_probe_info p;
    ZT_EQ_INT(zn_nvme_probe(dir, &p), 0);
    printf("# %s: fs %s, device %s%s%s model '%s' rotational %d, block %u/%u, free %llu, "
           "uring %d (%s), direct %d (%s), backend: %s\n",
           dir, p.fstype, p.device, p.partition[0] ? "/" : "", p.partition, p.model, p.rotational,
           p.logical_block, p.dio_mem_align, (unsigned long long)p.free_bytes, p.uring_ok,
           p.uring_reason, p.direct_ok, p.direct_reason, p.backend_reason);
    ZT_CHECK(p.fstype[0] != '\0');
    ZT_CHECK(p.logical_block >= 512 && (p.logical_block & (p.logical_block - 1)) == 0);
    ZT_CHECK(p.free_bytes > 0 && p.total_bytes >= p.free_bytes);
    ZT_CHECK(p.uring_ok ? p.uring_reason[0] == '\0' && p.uring_errno == 0
                        : p.uring_reason[0] != '\0' && p.uring_errno != 0);
    ZT_CHECK(p.direct_ok ? 1 : p.direct_reason[0] != '\0');
    ZT_CHECK(p.rotational >= -1 && p.rotational <= 1);
    ZT_CHECK(p.uring_disabled_sysctl >= -1 && p.uring_disabled_sysctl <= 2);
    ZT_CONTAINS(p.backend_reason, p.uring_ok ? "io_uring" : "thread pool");
    ZT_CONTAINS(p.backend_reason, p.direct_ok ? "O_DIRECT" : "buffered");
    /* No temp file left behind. */
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s')\"", dir);
    ZT_EQ_INT(system(cmd), 0);

    /* The engine and a swap space pick what the probe said. */
    zn_aio *a;
    ZT_EQ_INT(zn_aio_create(&a, NULL), 0);
    ZT_EQ_INT(zn_aio_get_backend(a), p.backend);
    zn_swap *s = tn_swap(a, dir, 1 << 20);
    zn_swap_stats ss;
    zn_swap_get_stats(s, &ss);
    ZT_EQ_INT(ss.direct, !p.buffered);
    zn_swap_destroy(s);
    zn_aio_destroy(a);

    /* The disk behind a block-device file system is found in /sys. */
    struct stat st;
    if (stat(dir, &st) == 0 && major(st.st_dev) != 0 && strcmp(p.fstype, "btrfs"))
        ZT_CHECK_MSG(p.device[0] != '\0', "no device for %s on %u:%u", dir, major(st.st_dev),
                     minor(st.st_dev));

    if (stat("/dev/shm", &st) == 0) {
        zn_nvme_probe_info t;
        ZT_EQ_INT(zn_nvme_probe("/dev/shm", &t), 0);
        ZT_EQ_STR(t.fstype, "tmpfs");
        ZT_EQ_STR(t.device, "");
        printf("# /dev/shm: direct %d (%s), backend: %s\n", t.direct_ok, t.direct_reason,
               t.backend_reason);
    }

    setenv("ZINC_AIO_FORCE", "threads,buffered", 1);
    ZT_EQ_INT(zn_nvme_probe(dir, &p), 0);
    ZT_EQ_INT(p.backend, ZN_AIO_BACKEND_THREADS);
    ZT_EQ_INT(p.buffered, 1);
    ZT_CONTAINS(p.backend_reason, "ZINC_AIO_FORCE");
    unsetenv("ZINC_AIO_FORCE");

    ZT_EQ_INT(zn_nvme_probe("/nonexistent/zinc", &p), -ENOENT);
    ZT_CONTAINS(zn_last_error(), "/nonexistent/zinc");
    ZT_EQ_INT(zn_nvme_probe("/etc/hostname", &p), -ENOTDIR);
    return zt_done();
}
