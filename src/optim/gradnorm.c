/* Global gradient norm over many tensors, for clipping and the fp16
 * overflow check. Every tensor is cut into fixed chunks of ZN_NORM_CHUNK
 * elements whatever the thread count; each chunk is summed in the canonical
 * 16-lane order (optim-impl.h) and the chunk sums are added pairwise in
 * index order, so the result has the same bits for any thread count and
 * any SIMD path. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "optim/optim-impl.h"

/* Pairwise sum of x[0, n) in a fixed tree (the error grows with log n). */
static double pairwise(const double *x, size_t n)
{
    if (n <= 8) {
        double s = 0;
        for (size_t i = 0; i < n; i++)
            s += x[i];
        return s;
    }
    size_t h = n / 2;
    return pairwise(x, h) + pairwise(x + h, n - h);
}

int zn_grad_norm_sq(const zn_grad_span *spans, size_t nspans, int threads, double *out_sq,
                    int *out_nonfinite)
{
    if (!out_sq)
        return zn_set_error(-EINVAL, "grad norm: NULL result pointer");
    if (nspans > 0 && !spans)
        return zn_set_error(-EINVAL, "grad norm: NULL span list for %zu spans", nspans);
    size_t nchunks = 0, total = 0;
    for (size_t s = 0; s < nspans; s++) {
        if (spans[s].n > 0 && !spans[s].data)
            return zn_set_error(-EINVAL, "grad norm: span %zu has NULL data for %zu elements",
                                s, spans[s].n);
        if (spans[s].dtype != ZN_DTYPE_F32 && spans[s].dtype != ZN_DTYPE_BF16 &&
            spans[s].dtype != ZN_DTYPE_F16)
            return zn_set_error(-EINVAL, "grad norm: span %zu has dtype %d, not f32, bf16 "
                                "or f16", s, (int)spans[s].dtype);
        nchunks += (spans[s].n + ZN_NORM_CHUNK - 1) / ZN_NORM_CHUNK;
        total += spans[s].n;
    }
    *out_sq = 0;
    if (out_nonfinite)
        *out_nonfinite = 0;
    if (nchunks == 0)
        return 0;

    /* first[s]: index of span s's first chunk */
    double *part = malloc(nchunks * sizeof *part);
    size_t *first = malloc((nspans + 1) * sizeof *first);
    if (!part || !first) {
        free(part);
        free(first);
        return zn_set_error(-ENOMEM, "grad norm: %zu chunk sums", nchunks);
    }
    first[0] = 0;
    for (size_t s = 0; s < nspans; s++)
        first[s + 1] = first[s] + (spans[s].n + ZN_NORM_CHUNK - 1) / ZN_NORM_CHUNK;

    zn_norm_chunk_fn chunk = zn_optim_get_ops(ZN_ISA_AUTO)->norm_chunk;
    int nt = zn_optim_threads(threads, total);
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), team = omp_get_num_threads();
        size_t c0 = nchunks * (size_t)t / (size_t)team;
        size_t c1 = nchunks * (size_t)(t + 1) / (size_t)team;
        /* the span of chunk c0 (binary search), then walk forward */
        size_t lo = 0, hi = nspans;
        while (hi - lo > 1) {
            size_t mid = (lo + hi) / 2;
            if (first[mid] <= c0)
                lo = mid;
            else
                hi = mid;
        }
        size_t s = lo;
        for (size_t c = c0; c < c1; c++) {
            while (c >= first[s + 1])
                s++;
            size_t off = (c - first[s]) * ZN_NORM_CHUNK;
            size_t len = spans[s].n - off < ZN_NORM_CHUNK ? spans[s].n - off : ZN_NORM_CHUNK;
            part[c] = chunk((const char *)spans[s].data + off * zn_dtype_size(spans[s].dtype),
                            spans[s].dtype, len);
        }
    }
    double sum = pairwise(part, nchunks);
    free(part);
    free(first);
    *out_sq = sum;
    if (out_nonfinite)
        *out_nonfinite = !isfinite(sum);
    return 0;
}

double zn_grad_norm_combine(const double *chunk_sums, size_t n)
{
    return n ? pairwise(chunk_sums, n) : 0.0;
}

double zn_grad_norm_chunk(const float *x, size_t n)
{
    return n ? zn_optim_get_ops(ZN_ISA_AUTO)->norm_chunk(x, ZN_DTYPE_F32, n) : 0.0;
}
