/* Helpers shared by the NVMe tests: a temporary directory removed at exit,
 * seeded data that is a function of (seed, offset), aligned buffers. */
#ifndef TEST_NVME_COMMON_H
#define TEST_NVME_COMMON_H

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zinc/nvme.h"
#include "zt.h"

static char tn_dir[4096];

static inline void tn_rmdir(void)
{
    if (!tn_dir[0])
        return;
    DIR *d = opendir(tn_dir);
    if (d) {
        struct dirent *e;
        char p[8192];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            snprintf(p, sizeof p, "%s/%s", tn_dir, e->d_name);
            if (unlink(p) < 0 && errno == EISDIR)
                rmdir(p);
        }
        closedir(d);
    }
    rmdir(tn_dir);
    tn_dir[0] = '\0';
}

/* Entries of `dir` whose names start with `prefix` ("" = all but . and ..);
 * -1 if it cannot be opened. */
static inline int tn_dir_count(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
             !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

/* A fresh directory under the test's working directory (the build dir),
 * removed at exit; a test that asks for another (one per configuration)
 * has the previous one removed first, so none is left behind. */
static inline const char *tn_tmpdir(const char *tag)
{
    static int registered;
    if (tn_dir[0])
        tn_rmdir();
    snprintf(tn_dir, sizeof tn_dir, "nvme-%s-XXXXXX", tag);
    if (!mkdtemp(tn_dir))
        ZT_SETUP_FAIL("mkdtemp %s: %s", tn_dir, strerror(errno));
    char *abs = realpath(tn_dir, NULL);
    if (abs) {
        snprintf(tn_dir, sizeof tn_dir, "%s", abs);
        free(abs);
    }
    if (!registered++)
        atexit(tn_rmdir);
    return tn_dir;
}

/* A second directory inside the first (for striping tests). */
static inline void tn_subdir(const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", tn_dir, name);
    if (mkdir(out, 0700) < 0)
        ZT_SETUP_FAIL("mkdir %s: %s", out, strerror(errno));
}

static inline uint64_t tn_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Byte at `off` of stream `seed`. */
static inline unsigned char tn_byte(uint64_t seed, uint64_t off)
{
    return (unsigned char)(tn_mix(seed * 0x100000001B3ull + (off >> 3)) >> ((off & 7) * 8));
}

static inline void tn_fill(void *buf, size_t len, uint64_t seed, uint64_t off)
{
    unsigned char *p = buf;
    for (size_t i = 0; i < len; i++)
        p[i] = tn_byte(seed, off + i);
}

/* Number of bytes that differ from the stream. */
static inline size_t tn_wrong(const void *buf, size_t len, uint64_t seed, uint64_t off)
{
    const unsigned char *p = buf;
    size_t bad = 0;
    for (size_t i = 0; i < len; i++)
        bad += p[i] != tn_byte(seed, off + i);
    return bad;
}

static inline void *tn_alloc(size_t len)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, len ? len : 1))
        ZT_SETUP_FAIL("posix_memalign(%zu) failed", len);
    return p;
}

static inline zn_swap *tn_swap(zn_aio *a, const char *dir, uint64_t bytes)
{
    zn_swap_config sc = zn_swap_config_default();
    sc.npaths = 1;
    sc.paths[0] = dir;
    sc.bytes = bytes;
    zn_swap *s = NULL;
    int rc = zn_swap_create(&s, a, &sc);
    if (rc)
        ZT_SETUP_FAIL("zn_swap_create: %s", zn_last_error());
    return s;
}

#endif
