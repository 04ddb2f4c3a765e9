/* Integrity: a byte corrupted in the swap file behind the engine's back is
 * caught on read (ZN_ECORRUPT naming the tensor, the file and the offset),
 * other tensors still read fine, a rewrite heals it, and with crc off the
 * same corruption goes unnoticed (so the check is what catches it). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_nvme_common.h"

#define BS (64 * 1024)

static void corrupt(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    if (fd < 0)
        ZT_SETUP_FAIL("open %s", path);
    unsigned char b;
    if (pread(fd, &b, 1, (off_t)off) != 1)
        ZT_SETUP_FAIL("pread");
    b ^= 0x01;
    if (pwrite(fd, &b, 1, (off_t)off) != 1 || fsync(fd) < 0)
        ZT_SETUP_FAIL("pwrite");
    close(fd);
}

static void run(int force_threads, int force_buffered, int crc, const char *dir)
{
    zn_aio_config c = zn_aio_config_default();
    c.block_size = BS;
    c.crc = crc;
    c.force_threads = force_threads;
    c.force_buffered = force_buffered;
    zn_aio *a;
    if (zn_aio_create(&a, &c))
        ZT_SETUP_FAIL("zn_aio_create: %s", zn_last_error());
    zn_swap *s = tn_swap(a, dir, 4u << 20);
    size_t n = 3 * BS + 1000;
    zn_extent e, other;
    ZT_EQ_INT(zn_swap_alloc(s, n, "layers.3.self_attn.o_proj.weight", &e), 0);
    ZT_EQ_INT(zn_swap_alloc(s, n, "other", &other), 0);
    unsigned char *buf = tn_alloc(n);
    zn_aio_handle h;
    tn_fill(buf, n, 5, 0);
    ZT_EQ_INT(zn_aio_submit_write(a, &e, buf, n, &h), 0);
    ZT_EQ_INT(zn_aio_wait(a, h), 0);
    tn_fill(buf, n, 6, 0);
    ZT_EQ_INT(zn_aio_submit_write(a, &other, buf, n, &h), 0);
    ZT_EQ_INT(zn_aio_wait(a, h), 0);

    /* Flip a bit in the second block, and one in the padded last block. */
    for (int which = 0; which < 2; which++) {
        uint64_t block_off = e.offset + (which == 0 ? BS : 3 * BS);
        corrupt(zn_swap_file_path(s, 0), block_off + (which == 0 ? 17 : 999));
        memset(buf, 0, n);
        ZT_EQ_INT(zn_aio_submit_read(a, &e, buf, n, &h), 0);
        int rc = zn_aio_wait(a, h);
        if (crc) {
            ZT_EQ_INT(rc, ZN_ECORRUPT);
            ZT_CONTAINS(zn_last_error(), "layers.3.self_attn.o_proj.weight");
            ZT_CONTAINS(zn_last_error(), zn_swap_file_path(s, 0));
            char want[64];
            snprintf(want, sizeof want, "offset %" PRIu64, block_off);
            ZT_CONTAINS(zn_last_error(), want);
            ZT_CONTAINS(zn_last_error(), "crc32c mismatch");
        } else {
            ZT_EQ_INT(rc, 0);
            ZT_CHECK(tn_wrong(buf, n, 5, 0) == 1); /* the flipped byte slipped through */
        }
        /* The engine goes on: the other tensor reads fine. */
        ZT_EQ_INT(zn_aio_submit_read(a, &other, buf, n, &h), 0);
        ZT_EQ_INT(zn_aio_wait(a, h), 0);
        ZT_EQ_U64(tn_wrong(buf, n, 6, 0), 0);
        /* A rewrite heals the tensor. */
        tn_fill(buf, n, 5, 0);
        ZT_EQ_INT(zn_aio_submit_write(a, &e, buf, n, &h), 0);
        ZT_EQ_INT(zn_aio_wait(a, h), 0);
        memset(buf, 0, n);
        ZT_EQ_INT(zn_aio_submit_read(a, &e, buf, n, &h), 0);
        ZT_EQ_INT(zn_aio_wait(a, h), 0);
        ZT_EQ_U64(tn_wrong(buf, n, 5, 0), 0);
    }
    zn_aio_stats st;
    zn_aio_get_stats(a, &st);
    ZT_EQ_U64(st.crc_mismatches, crc ? 2 : 0);
    free(buf);
    zn_swap_destroy(s);
    zn_aio_destroy(a);
}

int main(void)
{
    const char *dir = tn_tmpdir("crc");
    run(0, 0, 1, dir);
    run(1, 0, 1, dir);
    run(0, 1, 1, dir);
    run(0, 0, 0, dir);
    return zt_done();
}
