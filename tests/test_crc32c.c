/* crc32c: both implementations (SSE4.2 three-stream and the table) against
 * published check values and a bit-at-a-time reference, over lengths and
 * alignments that cross every interleaving boundary. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/crc32c-impl.h"
#include "zinc/util.h"
#include "zt.h"

/* Bit-at-a-time reference, the definition of the checksum. */
static uint32_t ref_crc(uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++)
            crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static void known_vectors(crc_fn f, const char *name)
{
    unsigned char buf[48];
    ZT_CHECK_MSG(f(0, "123456789", 9) == 0xE3069283u, "%s(\"123456789\") = 0x%08x", name,
                 f(0, "123456789", 9));
    ZT_EQ_U64(f(0, "", 0), 0);
    /* RFC 3720 (iSCSI) B.4 test patterns. */
    memset(buf, 0, 32);
    ZT_CHECK_MSG(f(0, buf, 32) == 0x8A9136AAu, "%s(32 zeros)", name);
    memset(buf, 0xff, 32);
    ZT_CHECK_MSG(f(0, buf, 32) == 0x62A8AB43u, "%s(32 x 0xff)", name);
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)i;
    ZT_CHECK_MSG(f(0, buf, 32) == 0x46DD794Eu, "%s(0..31)", name);
    for (int i = 0; i < 32; i++)
        buf[i] = (unsigned char)(31 - i);
    ZT_CHECK_MSG(f(0, buf, 32) == 0x113FDB5Cu, "%s(31..0)", name);
}

int main(void)
{
    known_vectors(zn_crc32c_sw, "sw");
    known_vectors(zn_crc32c_hw, "hw");
    known_vectors(zn_crc32c, "dispatch");
    printf("# SSE4.2 crc32: %s\n", zn_crc32c_have_hw() ? "yes" : "no (hw path = table)");

    /* Random data: lengths around 3 x 8192 and 3 x 256 (the interleaving
     * steps), odd alignments, and continuation from a previous crc. */
    size_t max = 3 * 8192 * 2 + 4096;
    unsigned char *buf = malloc(max + 16);
    if (!buf)
        ZT_SETUP_FAIL("malloc");
    uint64_t x = 12345;
    for (size_t i = 0; i < max + 16; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        buf[i] = (unsigned char)(x >> 56);
    }
    static const size_t lens[] = { 0, 1, 7, 8, 9, 255, 256, 767, 768, 769, 1000, 4096,
                                   24575, 24576, 24577, 24576 + 768, 3 * 8192 * 2 + 5, 40000 };
    int bad = 0;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int a = 0; a < 9; a++) {
            size_t n = lens[li];
            if (a + n > max + 16)
                continue;
            uint32_t want = ref_crc(0, buf + a, n);
            uint32_t s = zn_crc32c_sw(0, buf + a, n), h = zn_crc32c_hw(0, buf + a, n);
            uint32_t d = zn_crc32c(0, buf + a, n);
            if (s != want || h != want || d != want) {
                if (bad++ < 5)
                    ZT_FAIL_AT("len %zu align %d: ref 0x%08x sw 0x%08x hw 0x%08x", n, a, want,
                               s, h);
            }
            zt_checks++;
            /* continuation */
            size_t cut = n / 3;
            uint32_t c = zn_crc32c(zn_crc32c(0, buf + a, cut), buf + a + cut, n - cut);
            ZT_CHECK_MSG(c == want, "continuation at %zu of %zu", cut, n);
            uint32_t c2 = zn_crc32c_hw(zn_crc32c_sw(0, buf + a, cut), buf + a + cut, n - cut);
            ZT_CHECK_MSG(c2 == want, "sw then hw continuation at %zu of %zu", cut, n);
            /* the pieces checksummed apart, combined */
            uint32_t cb = zn_crc32c_combine(zn_crc32c(0, buf + a, cut),
                                            zn_crc32c(0, buf + a + cut, n - cut), n - cut);
            ZT_CHECK_MSG(cb == want, "combined at %zu of %zu: 0x%08x, want 0x%08x", cut, n, cb,
                         want);
        }
    /* Combining over a long second piece (the 8-bit absmax of a
     * checkpoint's moments: megabytes): every shift table and the bytes */
    {
        size_t big = (5u << 20) + 777;
        unsigned char *b = malloc(big);
        if (!b)
            ZT_SETUP_FAIL("malloc");
        for (size_t i = 0; i < big; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            b[i] = (unsigned char)(x >> 56);
        }
        uint32_t want = zn_crc32c(0, b, big);
        static const size_t cuts[] = { 0, 1, 4097, 1u << 20, (5u << 20) + 700, (5u << 20) + 777 };
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            size_t k = cuts[c];
            uint32_t got = zn_crc32c_combine(zn_crc32c(0, b, k), zn_crc32c(0, b + k, big - k),
                                             big - k);
            ZT_CHECK_MSG(got == want, "combined at %zu of %zu: 0x%08x, want 0x%08x", k, big, got,
                         want);
        }
        free(b);
    }
    /* A single flipped bit changes the crc. */
    uint32_t before = zn_crc32c(0, buf, 40000);
    buf[20000] ^= 0x10;
    ZT_CHECK(zn_crc32c(0, buf, 40000) != before);
    free(buf);
    return zt_done();
}
