/* The global gradient norm: the sum of squares over many spans of mixed
 * dtypes against a long-double reference; the same bits for 1, 2 and 3
 * threads and for every SIMD path; NaN and Inf found wherever they sit;
 * argument errors. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/optim.h"
#include "optim/optim-impl.h"
#include "zt.h"

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Spans of every dtype, sizes around the chunk and vector boundaries, and
 * magnitudes over many binades (as gradients have). */
#define NSPANS 9
static const size_t span_n[NSPANS] = { 0, 1, 15, 17, ZN_NORM_CHUNK - 1, ZN_NORM_CHUNK + 1,
                                       1000003, 3 * ZN_NORM_CHUNK, 250001 };

typedef struct {
    zn_grad_span s[NSPANS];
    void *buf[NSPANS];
} spans;

static void make_spans(spans *sp, uint64_t seed)
{
    for (size_t k = 0; k < NSPANS; k++) {
        zn_dtype t = (zn_dtype)(k % 3);
        size_t n = span_n[k];
        /* odd offset: unaligned data */
        char *b = malloc(n * 4 + 64);
        if (!b)
            ZT_SETUP_FAIL("out of memory");
        sp->buf[k] = b;
        void *d = b + (k & 1 ? zn_dtype_size(t) : 0);
        for (size_t i = 0; i < n; i++) {
            uint64_t h = mix(seed * 131 + k * 1000003 + i);
            double x = ((double)(h >> 40) / (double)(1 << 24) - 0.5) * ldexp(1, (int)(h % 24) - 12);
            if (t == ZN_DTYPE_F32)
                ((float *)d)[i] = (float)x;
            else if (t == ZN_DTYPE_BF16)
                ((uint16_t *)d)[i] = zn_f32_to_bf16((float)x);
            else
                ((uint16_t *)d)[i] = zn_f32_to_f16((float)x);
        }
        sp->s[k] = (zn_grad_span){ d, n, t };
    }
}

static void free_spans(spans *sp)
{
    for (size_t k = 0; k < NSPANS; k++)
        free(sp->buf[k]);
}

static long double reference(const spans *sp)
{
    long double s = 0;
    for (size_t k = 0; k < NSPANS; k++)
        for (size_t i = 0; i < sp->s[k].n; i++) {
            long double x = zn_load_elem(sp->s[k].data, sp->s[k].dtype, i);
            s += x * x;
        }
    return s;
}

/* The canonical order of optim-impl.h, written out here: the chunk
 * functions of every path must give exactly these bits. Whole-tensor sums
 * hide a changed order (a chunk's last bit vanishes in the total), so the
 * chunks are checked one by one. */
static double canonical_chunk(const void *x, zn_dtype t, size_t n)
{
    double acc[16] = { 0 };
    for (size_t i = 0; i < n; i++) {
        double d = zn_load_elem(x, t, i);
        acc[i % 16] += d * d;
    }
    for (size_t s = 8; s >= 1; s /= 2)
        for (size_t j = 0; j < s; j++)
            acc[j] += acc[j + s];
    return acc[0];
}

static void check_chunks(const zn_isa *isas)
{
    float *x = malloc(ZN_NORM_CHUNK * 4 + 64);
    if (!x)
        ZT_SETUP_FAIL("out of memory");
    size_t bad[4] = { 0 }, differs_from_seq = 0;
    for (int r = 0; r < 300; r++) {
        zn_dtype t = (zn_dtype)(r % 3);
        size_t n = r < 40 ? (size_t)r + 1 : 1 + (size_t)(mix((uint64_t)r) % ZN_NORM_CHUNK);
        void *d = (char *)x + (r & 1 ? 2 : 0);
        for (size_t i = 0; i < n; i++) {
            uint64_t h = mix(((uint64_t)r << 32) + i);
            /* magnitudes over 2^-20 .. 2^20: the order of additions shows */
            float v = (float)(((double)(h >> 40) / (double)(1 << 24)) * ldexp(1, (int)(h % 40) - 20));
            if (t == ZN_DTYPE_F32)
                memcpy((char *)d + i * 4, &v, 4);
            else {
                uint16_t hb = t == ZN_DTYPE_BF16 ? zn_f32_to_bf16(v) : zn_f32_to_f16(v);
                memcpy((char *)d + i * 2, &hb, 2);
            }
        }
        double want = canonical_chunk(d, t, n), seq = 0;
        for (size_t i = 0; i < n; i++) {
            double e = zn_load_elem(d, t, i);
            seq += e * e;
        }
        differs_from_seq += seq != want;
        for (size_t ii = 0; ii < 3; ii++) {
            const zn_optim_ops *ops = zn_optim_get_ops(isas[ii]);
            if (!ops)
                continue;
            double got = ops->norm_chunk(d, t, n);
            bad[isas[ii]] += memcmp(&got, &want, sizeof got) != 0;
        }
    }
    for (size_t ii = 0; ii < 3; ii++)
        ZT_CHECK_MSG(bad[isas[ii]] == 0, "%s: %zu of 300 chunk sums differ from the canonical "
                     "order", zn_isa_name(isas[ii]), bad[isas[ii]]);
    /* the data must be able to tell orders apart, or the check means nothing */
    ZT_CHECK_MSG(differs_from_seq > 30, "only %zu of 300 chunks tell the canonical order from "
                 "a sequential sum", differs_from_seq);
    free(x);
}

int main(void)
{
    static const zn_isa isas[] = { ZN_ISA_SCALAR, ZN_ISA_AVX2, ZN_ISA_AVX512 };
    check_chunks(isas);
    spans sp;
    make_spans(&sp, 7);
    long double ref = reference(&sp);

    /* every path, 1..3 threads: one result, bit for bit, close to the reference */
    double first = 0;
    int have_first = 0;
    for (size_t ii = 0; ii < 3; ii++) {
        if (!zn_adam_isa_available(isas[ii])) {
            printf("note: %s path skipped: not supported by this CPU\n", zn_isa_name(isas[ii]));
            continue;
        }
        ZT_EQ_INT(zn_adam_set_isa(isas[ii]), 0);
        for (int t = 1; t <= 3; t++) {
            double sq = -1;
            int bad = -1;
            ZT_EQ_INT(zn_grad_norm_sq(sp.s, NSPANS, t, &sq, &bad), 0);
            ZT_EQ_INT(bad, 0);
            if (!have_first) {
                first = sq;
                have_first = 1;
                double rel = (double)(fabsl((long double)sq - ref) / ref);
                printf("sum of squares %.17g, reference %.17Lg, rel err %.3g\n", sq, ref, rel);
                ZT_CHECK_MSG(rel < 1e-13, "relative error %.3g", rel);
            }
            ZT_CHECK_MSG(memcmp(&sq, &first, sizeof sq) == 0,
                         "%s, %d threads: %.17g differs from %.17g", zn_isa_name(isas[ii]), t,
                         sq, first);
        }
    }

    /* a span split in two on a chunk boundary gives the same chunk sums in
     * the same order: the same bits */
    zn_grad_span two[2] = { sp.s[6], sp.s[6] };
    two[0].n = 5 * ZN_NORM_CHUNK;
    two[1].data = (const float *)sp.s[6].data + two[0].n;
    two[1].n = sp.s[6].n - two[0].n;
    double whole, split;
    ZT_EQ_INT(zn_grad_norm_sq(&sp.s[6], 1, 2, &whole, NULL), 0);
    ZT_EQ_INT(zn_grad_norm_sq(two, 2, 2, &split, NULL), 0);
    ZT_CHECK(memcmp(&whole, &split, sizeof whole) == 0);

    /* NaN and Inf: in a tail, in a body, in each dtype; every path */
    for (size_t ii = 0; ii < 3; ii++) {
        if (!zn_adam_isa_available(isas[ii]))
            continue;
        ZT_EQ_INT(zn_adam_set_isa(isas[ii]), 0);
        for (size_t k = 1; k < NSPANS; k++) {
            size_t n = sp.s[k].n;
            size_t pos[2] = { n - 1, n / 2 };
            for (int w = 0; w < 2; w++) {
                for (int kind = 0; kind < 2; kind++) {
                    void *d = (void *)sp.s[k].data;
                    size_t es = zn_dtype_size(sp.s[k].dtype), i = pos[w];
                    uint32_t save = 0;
                    memcpy(&save, (char *)d + i * es, es);
                    uint32_t bits;
                    if (sp.s[k].dtype == ZN_DTYPE_F32)
                        bits = kind ? 0x7f800000u : 0x7fc00001u;
                    else if (sp.s[k].dtype == ZN_DTYPE_BF16)
                        bits = kind ? 0xff80u : 0x7fc1u;
                    else
                        bits = kind ? 0x7c00u : 0xfe01u;
                    memcpy((char *)d + i * es, &bits, es);
                    double sq = 0;
                    int bad = 0;
                    ZT_EQ_INT(zn_grad_norm_sq(sp.s, NSPANS, 2, &sq, &bad), 0);
                    ZT_CHECK_MSG(bad == 1 && (kind ? isinf(sq) : isnan(sq)),
                                 "%s: %s in span %zu (%s) at %zu: nonfinite %d, sum %g",
                                 zn_isa_name(isas[ii]), kind ? "Inf" : "NaN", k,
                                 zn_dtype_name(sp.s[k].dtype), i, bad, sq);
                    memcpy((char *)d + i * es, &save, es);
                }
            }
        }
    }
    ZT_EQ_INT(zn_adam_set_isa(ZN_ISA_AUTO), 0);

    /* fp16's largest values square far past fp32's range: no overflow in double */
    uint16_t big[40];
    for (int i = 0; i < 40; i++)
        big[i] = 0x7bff;   /* 65504 */
    zn_grad_span bs = { big, 40, ZN_DTYPE_F16 };
    double sq;
    int bad;
    ZT_EQ_INT(zn_grad_norm_sq(&bs, 1, 1, &sq, &bad), 0);
    ZT_CHECK(bad == 0 && sq == 40.0 * 65504.0 * 65504.0);

    /* arguments */
    ZT_EQ_INT(zn_grad_norm_sq(NULL, 0, 0, &sq, &bad), 0);
    ZT_CHECK(sq == 0 && bad == 0);
    ZT_EQ_INT(zn_grad_norm_sq(NULL, 2, 0, &sq, NULL), -EINVAL);
    ZT_EQ_INT(zn_grad_norm_sq(sp.s, NSPANS, 0, NULL, NULL), -EINVAL);
    zn_grad_span nul = { NULL, 5, ZN_DTYPE_F32 };
    ZT_EQ_INT(zn_grad_norm_sq(&nul, 1, 0, &sq, NULL), -EINVAL);
    ZT_CONTAINS(zn_last_error(), "span 0");
    zn_grad_span badt = { big, 5, (zn_dtype)4 };
    ZT_EQ_INT(zn_grad_norm_sq(&badt, 1, 0, &sq, NULL), -EINVAL);

    free_spans(&sp);
    return zt_done();
}
