/* The device arena: one reserved range carved into blocks, best fit with
 * coalescing of free neighbours, every block aligned to ZN_DEV_ALIGN. Pure
 * bookkeeping (never touches the memory), so it serves CUDA memory and host
 * memory alike; the caller holds the device lock. */
#include <errno.h>
#include <stdlib.h>

#include "gpu/gpu-impl.h"

struct zn_arena_blk {
    uintptr_t addr;
    uint64_t size;
    int is_free;
    zn_arena_blk *prev, *next;           /* address order */
    zn_arena_blk *fprev, *fnext;         /* free list (free blocks) */
    zn_arena_blk *hnext;                 /* hash chain (live blocks) */
};

static size_t hash_addr(uintptr_t a, size_t n)
{
    uint64_t h = (uint64_t)(a / ZN_DEV_ALIGN) * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 20) & (n - 1);
}

static void free_list_push(zn_arena *a, zn_arena_blk *b)
{
    b->is_free = 1;
    b->fprev = NULL;
    b->fnext = a->free_list;
    if (a->free_list)
        a->free_list->fprev = b;
    a->free_list = b;
}

static void free_list_remove(zn_arena *a, zn_arena_blk *b)
{
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else
        a->free_list = b->fnext;
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    b->fprev = b->fnext = NULL;
    b->is_free = 0;
}

static int hash_grow(zn_arena *a)
{
    size_t n = a->n_buckets ? a->n_buckets * 2 : 256;
    zn_arena_blk **nb = calloc(n, sizeof *nb);
    if (!nb)
        return -ENOMEM;
    for (size_t i = 0; i < a->n_buckets; i++) {
        zn_arena_blk *b = a->buckets[i];
        while (b) {
            zn_arena_blk *nx = b->hnext;
            size_t h = hash_addr(b->addr, n);
            b->hnext = nb[h];
            nb[h] = b;
            b = nx;
        }
    }
    free(a->buckets);
    a->buckets = nb;
    a->n_buckets = n;
    return 0;
}

int zn_arena_init(zn_arena *a, void *base, uint64_t size)
{
    memset(a, 0, sizeof *a);
    uintptr_t b = (uintptr_t)base;
    uintptr_t ab = (b + ZN_DEV_ALIGN - 1) & ~(uintptr_t)(ZN_DEV_ALIGN - 1);
    if (size < ab - b + ZN_DEV_ALIGN)
        return -EINVAL;
    a->base = ab;
    a->size = (size - (ab - b)) & ~(uint64_t)(ZN_DEV_ALIGN - 1);
    if (hash_grow(a))
        return -ENOMEM;
    zn_arena_blk *blk = calloc(1, sizeof *blk);
    if (!blk) {
        free(a->buckets);
        a->buckets = NULL;
        return -ENOMEM;
    }
    blk->addr = a->base;
    blk->size = a->size;
    a->head = blk;
    free_list_push(a, blk);
    return 0;
}

void zn_arena_fini(zn_arena *a)
{
    zn_arena_blk *b = a->head;
    while (b) {
        zn_arena_blk *nx = b->next;
        free(b);
        b = nx;
    }
    free(a->buckets);
    memset(a, 0, sizeof *a);
}

void *zn_arena_alloc(zn_arena *a, uint64_t bytes)
{
    if (bytes == 0 || bytes > a->size)
        return NULL;
    uint64_t need = (bytes + ZN_DEV_ALIGN - 1) & ~(uint64_t)(ZN_DEV_ALIGN - 1);
    zn_arena_blk *best = NULL;
    for (zn_arena_blk *b = a->free_list; b; b = b->fnext)
        if (b->size >= need && (!best || b->size < best->size ||
                                (b->size == best->size && b->addr < best->addr))) {
            best = b;
            if (b->size == need)
                break;
        }
    if (!best)
        return NULL;
    if (a->n_live + 1 > a->n_buckets * 2 && hash_grow(a))
        return NULL;
    if (best->size > need) {
        /* Split: the tail stays free. */
        zn_arena_blk *t = calloc(1, sizeof *t);
        if (!t)
            return NULL;
        t->addr = best->addr + need;
        t->size = best->size - need;
        t->prev = best;
        t->next = best->next;
        if (best->next)
            best->next->prev = t;
        best->next = t;
        best->size = need;
        free_list_push(a, t);
    }
    free_list_remove(a, best);
    size_t h = hash_addr(best->addr, a->n_buckets);
    best->hnext = a->buckets[h];
    a->buckets[h] = best;
    a->used += best->size;
    a->n_live++;
    if (a->used > a->peak)
        a->peak = a->used;
    return (void *)best->addr;
}

/* Merges b's right neighbour into b (both free); frees the neighbour. */
static void merge_next(zn_arena *a, zn_arena_blk *b)
{
    zn_arena_blk *n = b->next;
    free_list_remove(a, n);
    b->size += n->size;
    b->next = n->next;
    if (n->next)
        n->next->prev = b;
    free(n);
}

uint64_t zn_arena_free(zn_arena *a, void *p)
{
    uintptr_t addr = (uintptr_t)p;
    if (!a->n_buckets)
        return 0;
    size_t h = hash_addr(addr, a->n_buckets);
    zn_arena_blk **pp = &a->buckets[h], *b;
    while ((b = *pp) && b->addr != addr)
        pp = &b->hnext;
    if (!b)
        return 0;
    *pp = b->hnext;
    b->hnext = NULL;
    uint64_t sz = b->size;
    a->used -= sz;
    a->n_live--;
    free_list_push(a, b);
    if (b->next && b->next->is_free)
        merge_next(a, b);
    if (b->prev && b->prev->is_free) {
        zn_arena_blk *pv = b->prev;
        merge_next(a, pv);
    }
    return sz;
}

uint64_t zn_arena_largest_free(const zn_arena *a)
{
    uint64_t m = 0;
    for (const zn_arena_blk *b = a->free_list; b; b = b->fnext)
        if (b->size > m)
            m = b->size;
    return m;
}

void zn_arena_counts(const zn_arena *a, size_t *blocks, size_t *free_blocks)
{
    size_t n = 0, f = 0;
    for (const zn_arena_blk *b = a->head; b; b = b->next) {
        n++;
        f += b->is_free != 0;
    }
    *blocks = n;
    *free_blocks = f;
}
