/* Striping over two directories: each block_size stripe of a tensor lands in
 * the file and at the offset the layout says (read back from the raw files),
 * small tensors stay inside one stripe, files are 0600, preallocated, and
 * removed at destroy unless kept. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_nvme_common.h"

#define BS (64 * 1024)

int main(void)
{
    tn_tmpdir("stripe");
    char d0[4200], d1[4200];
    tn_subdir("a", d0, sizeof d0);
    tn_subdir("b", d1, sizeof d1);
    zn_aio_config c = zn_aio_config_default();
    c.block_size = BS;
    zn_aio *a;
    if (zn_aio_create(&a, &c))
        ZT_SETUP_FAIL("zn_aio_create: %s", zn_last_error());
    zn_swap_config sc = zn_swap_config_default();
    sc.npaths = 2;
    sc.paths[0] = d0;
    sc.paths[1] = d1;
    sc.bytes = 8u << 20;
    zn_swap *s;
    if (zn_swap_create(&s, a, &sc))
        ZT_SETUP_FAIL("zn_swap_create: %s", zn_last_error());
    const char *f[2] = { zn_swap_file_path(s, 0), zn_swap_file_path(s, 1) };
    ZT_CHECK(f[0] && !strncmp(f[0], d0, strlen(d0)));
    ZT_CHECK(f[1] && !strncmp(f[1], d1, strlen(d1)));
    for (int i = 0; i < 2; i++) {
        struct stat st;
        ZT_EQ_INT(stat(f[i], &st), 0);
        ZT_EQ_INT(st.st_mode & 0777, 0600);
        ZT_EQ_U64(st.st_size, 4u << 20);
        /* preallocated: blocks cover the size */
        ZT_CHECK_MSG((uint64_t)st.st_blocks * 512 >= 4u << 20, "%s: %lld blocks", f[i],
                     (long long)st.st_blocks);
    }
    zn_swap_stats ss;
    zn_swap_get_stats(s, &ss);
    ZT_EQ_U64(ss.capacity, 8u << 20);
    ZT_EQ_INT(ss.npaths, 2);

    /* A small tensor first, so the big one does not start at stripe 0. */
    zn_extent small, big, first;
    ZT_EQ_INT(zn_swap_alloc(s, 3000, "first", &first), 0);
    ZT_EQ_INT(zn_swap_alloc(s, 5000, "small", &small), 0);
    ZT_CHECK(small.offset % BS != 0); /* inside a stripe, not at its start */
    size_t n = 9 * BS + 100;
    ZT_EQ_INT(zn_swap_alloc(s, n, "big", &big), 0);
    ZT_EQ_U64(big.offset % BS, 0);
    ZT_EQ_U64(small.offset / BS, (small.offset + small.bytes - 1) / BS);
    unsigned char *buf = tn_alloc(n), *raw = tn_alloc(BS);
    tn_fill(buf, n, 99, 0);
    zn_aio_handle h;
    ZT_EQ_INT(zn_aio_submit_write(a, &big, buf, n, &h), 0);
    ZT_EQ_INT(zn_aio_wait(a, h), 0);
    tn_fill(buf, 5000, 98, 0);
    ZT_EQ_INT(zn_aio_submit_write(a, &small, buf, 5000, &h), 0);
    ZT_EQ_INT(zn_aio_wait(a, h), 0);

    int fd[2] = { open(f[0], O_RDONLY), open(f[1], O_RDONLY) };
    ZT_CHECK(fd[0] >= 0 && fd[1] >= 0);
    int used[2] = { 0, 0 };
    for (size_t k = 0; k * BS < n; k++) {
        uint64_t unit = big.offset / BS + k;
        int file = (int)(unit % 2);
        off_t off = (off_t)(unit / 2 * BS);
        size_t len = n - k * BS < BS ? n - k * BS : BS;
        ssize_t got = pread(fd[file], raw, len, off);
        ZT_EQ_INT(got, (long long)len);
        ZT_CHECK_MSG(tn_wrong(raw, len, 99, k * BS) == 0, "stripe %zu not in file %d at %lld", k,
                     file, (long long)off);
        used[file]++;
    }
    ZT_CHECK(used[0] >= 4 && used[1] >= 4);
    {
        uint64_t unit = small.offset / BS;
        ssize_t got = pread(fd[unit % 2], raw, 5000, (off_t)(unit / 2 * BS + small.offset % BS));
        ZT_EQ_INT(got, 5000);
        ZT_EQ_U64(tn_wrong(raw, 5000, 98, 0), 0);
    }
    close(fd[0]);
    close(fd[1]);
    /* Round trip through the engine too. */
    memset(buf, 0, n);
    ZT_EQ_INT(zn_aio_submit_read(a, &big, buf, n, &h), 0);
    ZT_EQ_INT(zn_aio_wait(a, h), 0);
    ZT_EQ_U64(tn_wrong(buf, n, 99, 0), 0);
    char keep0[4300];
    snprintf(keep0, sizeof keep0, "%s", f[0]);
    char keep1[4300];
    snprintf(keep1, sizeof keep1, "%s", f[1]);
    zn_swap_destroy(s);
    ZT_CHECK(access(keep0, F_OK) != 0 && access(keep1, F_OK) != 0);

    /* Uneven sizes: capacity is 2 x the smaller; keep_files keeps them. */
    sc.bytes = 0;
    sc.path_bytes[0] = 2u << 20;
    sc.path_bytes[1] = 3u << 20;
    sc.keep_files = 1;
    ZT_EQ_INT(zn_swap_create(&s, a, &sc), 0);
    zn_swap_get_stats(s, &ss);
    ZT_EQ_U64(ss.capacity, 4u << 20);
    snprintf(keep0, sizeof keep0, "%s", zn_swap_file_path(s, 0));
    snprintf(keep1, sizeof keep1, "%s", zn_swap_file_path(s, 1));
    zn_swap_destroy(s);
    ZT_EQ_INT(access(keep0, F_OK), 0);
    ZT_EQ_INT(access(keep1, F_OK), 0);
    unlink(keep0);
    unlink(keep1);
    /* A path that is not a directory, and a missing one. */
    sc.path_bytes[0] = sc.path_bytes[1] = 0;
    sc.bytes = 1 << 20;
    sc.paths[1] = "/nonexistent/zinc";
    ZT_EQ_INT(zn_swap_create(&s, a, &sc), -ENOENT);
    ZT_CONTAINS(zn_last_error(), "/nonexistent/zinc");
    free(buf);
    free(raw);
    zn_aio_destroy(a);
    return zt_done();
}
