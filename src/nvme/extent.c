/* The swap-space extent allocator: best fit over sorted, coalesced free
 * ranges. Best fit rather than first fit keeps large holes whole when
 * optimizer states of many sizes come and go. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "nvme/nvme-impl.h"

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

int zn_extalloc_init(zn_extalloc *x, uint64_t capacity, uint64_t unit, uint64_t stripe)
{
    memset(x, 0, sizeof *x);
    if (!unit || (unit & (unit - 1)) || !stripe || (stripe & (stripe - 1)) ||
        unit > stripe || capacity % stripe)
        return -EINVAL;
    x->capacity = capacity;
    x->unit = unit;
    x->stripe = stripe;
    x->cap = 16;
    x->free = malloc(x->cap * sizeof *x->free);
    if (!x->free)
        return -ENOMEM;
    if (capacity) {
        x->free[0] = (zn_range){ 0, capacity };
        x->nfree = 1;
    }
    return 0;
}

void zn_extalloc_fini(zn_extalloc *x)
{
    free(x->free);
    memset(x, 0, sizeof *x);
}

static int reserve(zn_extalloc *x, size_t n)
{
    if (n <= x->cap)
        return 0;
    size_t nc = x->cap * 2;
    while (nc < n)
        nc *= 2;
    zn_range *f = realloc(x->free, nc * sizeof *f);
    if (!f)
        return -ENOMEM;
    x->free = f;
    x->cap = nc;
    return 0;
}

/* Where an extent of `size` could start inside [s, e), or UINT64_MAX. */
static uint64_t place(const zn_extalloc *x, uint64_t s, uint64_t e, uint64_t size)
{
    uint64_t c;
    if (size >= x->stripe) {
        c = round_up(s, x->stripe);
    } else {
        c = s;
        if (c / x->stripe != (c + size - 1) / x->stripe)
            c = round_up(s, x->stripe);
    }
    return c + size <= e ? c : UINT64_MAX;
}

int zn_extalloc_alloc(zn_extalloc *x, uint64_t bytes, uint64_t *off, uint64_t *got)
{
    if (!bytes)
        return -EINVAL;
    if (bytes > x->capacity)
        return -ENOSPC;
    uint64_t size = round_up(bytes, x->unit);
    size_t best = SIZE_MAX;
    uint64_t best_at = 0;
    for (size_t i = 0; i < x->nfree; i++) {
        const zn_range *r = &x->free[i];
        if (r->len < size)
            continue;
        uint64_t c = place(x, r->start, r->start + r->len, size);
        if (c == UINT64_MAX)
            continue;
        if (best == SIZE_MAX || r->len < x->free[best].len) {
            best = i;
            best_at = c;
            if (r->len == size)
                break;
        }
    }
    if (best == SIZE_MAX)
        return -ENOSPC;
    /* Split [s, e) into [s, c) and [c + size, e). */
    zn_range r = x->free[best];
    uint64_t lo_len = best_at - r.start;
    uint64_t hi_start = best_at + size, hi_len = r.start + r.len - hi_start;
    if (lo_len && hi_len) {
        if (reserve(x, x->nfree + 1))
            return -ENOMEM;
        memmove(&x->free[best + 2], &x->free[best + 1],
                (x->nfree - best - 1) * sizeof *x->free);
        x->free[best] = (zn_range){ r.start, lo_len };
        x->free[best + 1] = (zn_range){ hi_start, hi_len };
        x->nfree++;
    } else if (lo_len) {
        x->free[best].len = lo_len;
    } else if (hi_len) {
        x->free[best] = (zn_range){ hi_start, hi_len };
    } else {
        memmove(&x->free[best], &x->free[best + 1],
                (x->nfree - best - 1) * sizeof *x->free);
        x->nfree--;
    }
    x->used += size;
    if (x->used > x->peak)
        x->peak = x->used;
    *off = best_at;
    *got = size;
    return 0;
}

int zn_extalloc_free(zn_extalloc *x, uint64_t off, uint64_t bytes)
{
    uint64_t size = round_up(bytes, x->unit);
    if (!bytes || off % x->unit || off + size > x->capacity || off + size < off)
        return -EINVAL;
    /* First free range starting after off. */
    size_t lo = 0, hi = x->nfree;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (x->free[mid].start <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t i = lo;
    zn_range *prev = i > 0 ? &x->free[i - 1] : NULL;
    zn_range *next = i < x->nfree ? &x->free[i] : NULL;
    if (prev && prev->start + prev->len > off)
        return -EINVAL; /* overlaps free space: double free or bad extent */
    if (next && off + size > next->start)
        return -EINVAL;
    int join_prev = prev && prev->start + prev->len == off;
    int join_next = next && off + size == next->start;
    if (join_prev && join_next) {
        prev->len += size + next->len;
        memmove(&x->free[i], &x->free[i + 1], (x->nfree - i - 1) * sizeof *x->free);
        x->nfree--;
    } else if (join_prev) {
        prev->len += size;
    } else if (join_next) {
        next->start = off;
        next->len += size;
    } else {
        if (reserve(x, x->nfree + 1))
            return -ENOMEM;
        memmove(&x->free[i + 1], &x->free[i], (x->nfree - i) * sizeof *x->free);
        x->free[i] = (zn_range){ off, size };
        x->nfree++;
    }
    x->used -= size;
    return 0;
}

uint64_t zn_extalloc_largest(const zn_extalloc *x)
{
    uint64_t best = 0, S = x->stripe;
    for (size_t i = 0; i < x->nfree; i++) {
        uint64_t s = x->free[i].start, e = s + x->free[i].len;
        /* An extent of >= one stripe starts on a stripe boundary ... */
        uint64_t c = round_up(s, S);
        uint64_t v = c < e ? e - c : 0;
        if (v < S) {
            /* ... a smaller one sits between two boundaries. */
            uint64_t first = (s / S + 1) * S < e ? (s / S + 1) * S - s : e - s;
            uint64_t last = e - e / S * S;
            v = first > last ? first : last;
        }
        if (v > best)
            best = v;
    }
    return best;
}
