/* What the NVMe tier would use on a path, and why: io_uring or the thread
 * pool, O_DIRECT or buffered, the alignment, the file system and the disk
 * under it. `zinc info` prints it; the engine and swap space share the
 * helpers that try io_uring and O_DIRECT for real. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "nvme/nvme-impl.h"
#include "zinc/util.h"

void zn_nvme__env_force(int *threads, int *buffered)
{
    static int warned;
    *threads = *buffered = 0;
    const char *e = getenv("ZINC_AIO_FORCE");
    if (!e || !*e)
        return;
    char buf[128];
    snprintf(buf, sizeof buf, "%s", e);
    char *save = NULL;
    for (char *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        if (!strcmp(t, "threads"))
            *threads = 1;
        else if (!strcmp(t, "buffered"))
            *buffered = 1;
        else
            zn_warn_once(&warned, "ZINC_AIO_FORCE: unknown word '%s' (threads, buffered)", t);
    }
}

/* Copies with truncation, always terminated (snprintf "%s" would make gcc
 * warn about every deliberate truncation). */
static void copy_str(char *dst, size_t n, const char *src)
{
    size_t l = strlen(src);
    if (l >= n)
        l = n - 1;
    memcpy(dst, src, l);
    dst[l] = '\0';
}

static int read_line(const char *path, char *out, size_t n)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -errno;
    int rc = fgets(out, (int)n, f) ? 0 : -EIO;
    fclose(f);
    if (rc == 0) {
        size_t l = strlen(out);
        while (l && (out[l - 1] == '\n' || out[l - 1] == ' '))
            out[--l] = '\0';
    }
    return rc;
}

/* /sys/dev/block/MAJ:MIN resolved to the disk (not the partition). */
static int sys_disk(dev_t dev, char *disk, size_t dn, char *part, size_t pn)
{
    char link[128], real[PATH_MAX];
    snprintf(link, sizeof link, "/sys/dev/block/%u:%u", major(dev), minor(dev));
    if (!realpath(link, real))
        return -errno;
    char probe[PATH_MAX + 16];
    snprintf(probe, sizeof probe, "%s/partition", real);
    const char *base = strrchr(real, '/');
    base = base ? base + 1 : real;
    if (access(probe, F_OK) == 0) {
        copy_str(part, pn, base);
        char *slash = strrchr(real, '/');
        if (slash)
            *slash = '\0';
        base = strrchr(real, '/');
        base = base ? base + 1 : real;
    } else {
        part[0] = '\0';
    }
    copy_str(disk, dn, base);
    return 0;
}

void zn_nvme__dio_align(int fd, uint32_t *off_align, uint32_t *mem_align)
{
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
        sx.stx_dio_offset_align) {
        *off_align = sx.stx_dio_offset_align;
        *mem_align = sx.stx_dio_mem_align ? sx.stx_dio_mem_align : sx.stx_dio_offset_align;
        return;
    }
#endif
    struct stat st;
    char disk[64], part[64], path[160], line[32];
    if (fstat(fd, &st) == 0 && major(st.st_dev) != 0 &&
        sys_disk(st.st_dev, disk, sizeof disk, part, sizeof part) == 0) {
        snprintf(path, sizeof path, "/sys/block/%s/queue/logical_block_size", disk);
        if (read_line(path, line, sizeof line) == 0) {
            long v = strtol(line, NULL, 10);
            if (v >= 512 && v <= 65536 && !(v & (v - 1))) {
                *off_align = *mem_align = (uint32_t)v;
                return;
            }
        }
    }
    /* Nothing to ask: 4096 satisfies every common device. */
    *off_align = *mem_align = 4096;
}

int zn_nvme__try_direct(int fd, uint32_t align, char *why, size_t whylen)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) {
        snprintf(why, whylen, "fcntl(F_GETFL): %s", strerror(errno));
        return -errno;
    }
    if (fcntl(fd, F_SETFL, fl | O_DIRECT) < 0) {
        int e = errno;
        snprintf(why, whylen, "fcntl(O_DIRECT): %s", strerror(e));
        return -e;
    }
    if (align < 512)
        align = 512;
    void *buf = NULL;
    int rc = posix_memalign(&buf, align > 4096 ? align : 4096, align);
    if (rc) {
        snprintf(why, whylen, "posix_memalign: %s", strerror(rc));
        fcntl(fd, F_SETFL, fl);
        return -rc;
    }
    memset(buf, 0x5a, align);
    ssize_t w = pwrite(fd, buf, align, 0);
    int e = w < 0 ? errno : 0;
    ssize_t r = w == (ssize_t)align ? pread(fd, buf, align, 0) : -1;
    if (w == (ssize_t)align && r < 0)
        e = errno;
    free(buf);
    if (w != (ssize_t)align || r != (ssize_t)align) {
        snprintf(why, whylen, "O_DIRECT %s of %u bytes: %s", w != (ssize_t)align ? "write" : "read",
                 align, e ? strerror(e) : "short count");
        if (fcntl(fd, F_SETFL, fl) < 0)
            return -errno;
        return e ? -e : -EIO;
    }
    return 0;
}

int zn_nvme__try_uring(char *why, size_t whylen)
{
    struct io_uring ring;
    int rc = io_uring_queue_init(4, &ring, 0);
    if (rc == 0) {
        io_uring_queue_exit(&ring);
        why[0] = '\0';
        return 0;
    }
    int dis = -1;
    char line[16];
    if (read_line("/proc/sys/kernel/io_uring_disabled", line, sizeof line) == 0)
        dis = atoi(line);
    if (rc == -ENOSYS)
        snprintf(why, whylen, "io_uring_setup: ENOSYS (kernel without io_uring, or blocked by "
                 "seccomp)");
    else if (rc == -EPERM)
        snprintf(why, whylen, "io_uring_setup: EPERM (kernel.io_uring_disabled=%d%s)", dis,
                 dis == 1 ? ", this user is not in kernel.io_uring_group" :
                 dis == 2 ? ", disabled for everyone" : ", or a container/seccomp policy");
    else
        snprintf(why, whylen, "io_uring_setup: %s (kernel.io_uring_disabled=%d)", strerror(-rc),
                 dis);
    return rc;
}

/* The file system type from /proc/self/mountinfo: the entry with the same
 * device and the longest mount point that prefixes the path. */
static void fs_type(const char *real, dev_t dev, char *out, size_t n)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    out[0] = '\0';
    if (!f)
        return;
    char line[4096];
    size_t best = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned ma, mi;
        char mnt[2048];
        if (sscanf(line, "%*d %*d %u:%u %*s %2047s", &ma, &mi, mnt) != 3)
            continue;
        if (makedev(ma, mi) != dev)
            continue;
        size_t ml = strlen(mnt);
        if (strncmp(real, mnt, ml) || (real[ml] != '/' && real[ml] != '\0' && ml != 1))
            continue;
        const char *sep = strstr(line, " - ");
        char type[64];
        if (!sep || sscanf(sep + 3, "%63s", type) != 1)
            continue;
        if (ml >= best) {
            best = ml;
            copy_str(out, n, type);
        }
    }
    fclose(f);
}

int zn_nvme_probe(const char *path, zn_nvme_probe_info *out)
{
    memset(out, 0, sizeof *out);
    out->rotational = -1;
    out->uring_disabled_sysctl = -1;
    struct stat st;
    if (!path || stat(path, &st) < 0)
        return zn_set_error(path ? -errno : -EINVAL, "nvme probe: %s: %s", path ? path : "(null)",
                            path ? strerror(errno) : "no path");
    if (!S_ISDIR(st.st_mode))
        return zn_set_error(-ENOTDIR, "nvme probe: %s is not a directory", path);
    char line[32];
    if (read_line("/proc/sys/kernel/io_uring_disabled", line, sizeof line) == 0)
        out->uring_disabled_sysctl = atoi(line);
    int rc = zn_nvme__try_uring(out->uring_reason, sizeof out->uring_reason);
    out->uring_ok = rc == 0;
    out->uring_errno = rc < 0 ? -rc : 0;

    struct statvfs sv;
    if (statvfs(path, &sv) == 0) {
        out->free_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
        out->total_bytes = (uint64_t)sv.f_blocks * sv.f_frsize;
    }
    char real[PATH_MAX];
    if (realpath(path, real))
        fs_type(real, st.st_dev, out->fstype, sizeof out->fstype);
    if (!out->fstype[0]) {
        struct statfs sf;
        if (statfs(path, &sf) == 0)
            snprintf(out->fstype, sizeof out->fstype, "0x%lx", (unsigned long)sf.f_type);
    }
    if (major(st.st_dev) != 0 &&
        sys_disk(st.st_dev, out->device, sizeof out->device, out->partition,
                 sizeof out->partition) == 0) {
        char p[192], v[128];
        snprintf(p, sizeof p, "/sys/block/%s/device/model", out->device);
        if (read_line(p, v, sizeof v) == 0)
            snprintf(out->model, sizeof out->model, "%s", v);
        snprintf(p, sizeof p, "/sys/block/%s/queue/rotational", out->device);
        if (read_line(p, v, sizeof v) == 0)
            out->rotational = atoi(v);
    }

    /* O_DIRECT, for real, on a temp file. */
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/.zinc-probe.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        snprintf(out->direct_reason, sizeof out->direct_reason, "cannot create a file: %s",
                 strerror(errno));
    } else {
        uint32_t oa = 4096, ma = 4096;
        zn_nvme__dio_align(fd, &oa, &ma);
        out->logical_block = oa;
        out->dio_mem_align = ma;
        if (zn_nvme__try_direct(fd, oa, out->direct_reason, sizeof out->direct_reason) == 0)
            out->direct_ok = 1;
        close(fd);
        unlink(tmp);
    }

    int ft = 0, fb = 0;
    zn_nvme__env_force(&ft, &fb);
    out->backend = out->uring_ok && !ft ? ZN_AIO_BACKEND_URING : ZN_AIO_BACKEND_THREADS;
    out->buffered = !out->direct_ok || fb;
    char b1[200], b2[200];
    if (out->backend == ZN_AIO_BACKEND_URING)
        snprintf(b1, sizeof b1, "io_uring");
    else
        snprintf(b1, sizeof b1, "thread pool (%s)",
                 ft ? "forced by ZINC_AIO_FORCE" : out->uring_reason);
    if (!out->buffered)
        snprintf(b2, sizeof b2, "O_DIRECT");
    else
        snprintf(b2, sizeof b2, "buffered I/O (%s)",
                 fb ? "forced by ZINC_AIO_FORCE" : out->direct_reason);
    char b3[420];
    snprintf(b3, sizeof b3, "%s + %s", b1, b2);
    copy_str(out->backend_reason, sizeof out->backend_reason, b3);
    return 0;
}
