/* crc32c (Castagnoli, reflected polynomial 0x82F63B78), the checksum zinc
 * records for every block it swaps to NVMe. Two implementations chosen at
 * run time: the SSE4.2 crc32 instruction on three interleaved streams (the
 * instruction has a latency of 3 cycles and a throughput of 1, so three
 * independent streams keep it busy), and a portable slicing-by-8 table. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "util/crc32c-impl.h"
#include "zinc/util.h"

#define POLY 0x82F63B78u

/* Interleaved stream lengths: LONG per stream for big buffers, SHORT for the
 * rest. Each has its own "shift by n zero bytes" operator table. */
#define LONG_LEN 8192
#define SHORT_LEN 256

static uint32_t tab8[8][256];        /* slicing-by-8 */
static uint32_t shift_long[4][256];  /* crc -> crc advanced over LONG_LEN zeros */
static uint32_t shift_short[4][256]; /* ... over SHORT_LEN zeros */
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int have_hw;

/* Advances a raw crc register over n zero bytes, bit by bit. Only used to
 * build the shift tables at start-up (32 x (8192 + 256) bytes of work). */
static uint32_t zeros_slow(uint32_t crc, size_t n)
{
    for (size_t i = 0; i < n; i++)
        crc = (crc >> 8) ^ tab8[0][crc & 0xff];
    return crc;
}

/* The register update is linear over GF(2), so advancing over n zeros is a
 * 32x32 bit matrix; store it as four byte-indexed tables. */
static void build_shift(uint32_t t[4][256], size_t n)
{
    uint32_t col[32];
    for (int b = 0; b < 32; b++)
        col[b] = zeros_slow(1u << b, n);
    for (int k = 0; k < 4; k++)
        for (int v = 0; v < 256; v++) {
            uint32_t r = 0;
            for (int b = 0; b < 8; b++)
                if (v & (1 << b))
                    r ^= col[8 * k + b];
            t[k][v] = r;
        }
}

static inline uint32_t shift(uint32_t t[4][256], uint32_t crc)
{
    return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^
           t[3][crc >> 24];
}

static void init_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        tab8[0][i] = c;
    }
    for (int i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            tab8[k][i] = (tab8[k - 1][i] >> 8) ^ tab8[0][tab8[k - 1][i] & 0xff];
    build_shift(shift_long, LONG_LEN);
    build_shift(shift_short, SHORT_LEN);
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static void ensure_init(void)
{
    pthread_once(&init_once, init_tables);
}

/* Raw register (no pre/post inversion), portable. */
static uint32_t sw_raw(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ tab8[0][(crc ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;  /* little-endian: the low 4 bytes meet the register */
        crc = tab8[7][w & 0xff] ^ tab8[6][(w >> 8) & 0xff] ^ tab8[5][(w >> 16) & 0xff] ^
              tab8[4][(w >> 24) & 0xff] ^ tab8[3][(w >> 32) & 0xff] ^
              tab8[2][(w >> 40) & 0xff] ^ tab8[1][(w >> 48) & 0xff] ^ tab8[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ tab8[0][(crc ^ *p++) & 0xff];
    return crc;
}

uint32_t zn_crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    ensure_init();
    return ~sw_raw(~crc, buf, len);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>

__attribute__((target("sse4.2")))
static uint32_t hw_raw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c0 = crc;
    while (n && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        n--;
    }
    /* Three streams of LONG_LEN, then of SHORT_LEN: crc(s, A|B|C) =
     * shift(shift(crc(s,A)) ^ crc(0,B)) ^ crc(0,C). */
    static const size_t lens[2] = { LONG_LEN, SHORT_LEN };
    for (int pass = 0; pass < 2; pass++) {
        size_t L = lens[pass];
        uint32_t (*t)[256] = pass == 0 ? shift_long : shift_short;
        while (n >= 3 * L) {
            uint64_t c1 = 0, c2 = 0;
            const unsigned char *e = p + L;
            while (p < e) {
                uint64_t a, b, c;
                memcpy(&a, p, 8);
                memcpy(&b, p + L, 8);
                memcpy(&c, p + 2 * L, 8);
                c0 = _mm_crc32_u64(c0, a);
                c1 = _mm_crc32_u64(c1, b);
                c2 = _mm_crc32_u64(c2, c);
                p += 8;
            }
            c0 = shift(t, (uint32_t)c0) ^ (uint32_t)c1;
            c0 = shift(t, (uint32_t)c0) ^ (uint32_t)c2;
            p += 2 * L;
            n -= 3 * L;
        }
    }
    while (n >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c0 = _mm_crc32_u64(c0, a);
        p += 8;
        n -= 8;
    }
    while (n--)
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return (uint32_t)c0;
}

uint32_t zn_crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    ensure_init();
    if (!have_hw)
        return zn_crc32c_sw(crc, buf, len);
    return ~hw_raw(~crc, buf, len);
}
#else
uint32_t zn_crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    return zn_crc32c_sw(crc, buf, len);
}
#endif

int zn_crc32c_have_hw(void)
{
    ensure_init();
    return have_hw;
}

uint32_t zn_crc32c(uint32_t crc, const void *buf, size_t len)
{
    ensure_init();
    return have_hw ? zn_crc32c_hw(crc, buf, len) : ~sw_raw(~crc, buf, len);
}

/* The register is linear over GF(2) in its start value and the data, so
 * crc(A|B) = shift_len(B)(crc(A)) ^ crc(B) with the pre/post inversions
 * cancelling; the shift goes by the two tables, then byte by byte. */
uint32_t zn_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    ensure_init();
    uint32_t c = crc_a;
    for (; len_b >= LONG_LEN; len_b -= LONG_LEN)
        c = shift(shift_long, c);
    for (; len_b >= SHORT_LEN; len_b -= SHORT_LEN)
        c = shift(shift_short, c);
    return zeros_slow(c, (size_t)len_b) ^ crc_b;
}
