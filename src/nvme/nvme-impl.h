/* Private interfaces of src/nvme: the extent allocator, the engine's file
 * table (used by swap.c) and shared probing helpers. */
#ifndef ZN_NVME_IMPL_H
#define ZN_NVME_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "zinc/nvme.h"

/* ---- extent allocator (extent.c) ------------------------------------------
 * Best fit over a sorted array of free ranges, coalesced on free. Extents of
 * at least `stripe` bytes start on a stripe boundary; smaller ones never
 * cross one, so that every block of an extent is one contiguous piece of
 * one file. Not thread-safe (the swap space locks around it). */
typedef struct {
    uint64_t start, len;
} zn_range;

typedef struct {
    uint64_t capacity, unit, stripe;
    zn_range *free;
    size_t nfree, cap;
    uint64_t used, peak;
} zn_extalloc;

/* unit and stripe are powers of two, unit <= stripe, capacity a multiple of
 * stripe. Returns 0 or -ENOMEM / -EINVAL. */
int zn_extalloc_init(zn_extalloc *x, uint64_t capacity, uint64_t unit, uint64_t stripe);
void zn_extalloc_fini(zn_extalloc *x);
/* Rounds bytes up to unit; returns 0 with *off and *got, -ENOSPC, -EINVAL
 * (0 bytes), or -ENOMEM. Sets no error message. */
int zn_extalloc_alloc(zn_extalloc *x, uint64_t bytes, uint64_t *off, uint64_t *got);
/* Returns 0, or -EINVAL when [off, off+bytes) is not wholly allocated. */
int zn_extalloc_free(zn_extalloc *x, uint64_t off, uint64_t bytes);
uint64_t zn_extalloc_largest(const zn_extalloc *x);

/* ---- swap extent records (swap.c) ---------------------------------------- */
typedef struct {
    char *name;          /* tensor name */
    uint64_t offset, bytes;
    uint32_t gen;
    int live;
    uint64_t written;    /* length of the last successful write, 0 none */
    uint32_t nunits;     /* blocks (stripe units) in the extent */
    uint32_t *crc;       /* crc32c of each block as last written */
    atomic_int inflight; /* requests using the extent */
} zn_ext_rec;

#define ZN_AIO_MAX_FILES 64

struct zn_swap {
    zn_aio *aio;
    int npaths;
    int fd[ZN_SWAP_MAX_PATHS];
    int slot[ZN_SWAP_MAX_PATHS];   /* engine file-table index, -1 none */
    char *path[ZN_SWAP_MAX_PATHS];
    int owned[ZN_SWAP_MAX_PATHS];  /* entries of the signal-safe table, or -1 */
    int direct;                    /* all files O_DIRECT */
    uint64_t per_file;             /* bytes per file */
    uint64_t stripe;               /* block_size */
    uint32_t align, mem_align;     /* direct I/O alignment (1 when buffered) */
    int keep;
    pthread_mutex_t lock;
    zn_extalloc alloc;
    zn_ext_rec **recs;
    uint32_t nrecs, caprecs;
    uint32_t *free_ids;
    uint32_t nfree_ids;
};

/* Resolves a caller's extent to its record; -EINVAL with a message when it
 * is stale or foreign. Takes s->lock. */
int zn_swap__lookup(zn_swap *s, const zn_extent *e, zn_ext_rec **out);

/* ---- engine file table (engine.c) ---------------------------------------- */
/* Adds an open file to the engine (and to every ring's fixed-file table).
 * Returns the slot >= 0 or a negative code with a message. */
int zn_aio__add_file(zn_aio *a, int fd, const char *path);
void zn_aio__remove_file(zn_aio *a, int slot);

/* ---- helpers shared by swap.c and probe.c (probe.c) --------------------- */
/* ZINC_AIO_FORCE=threads|buffered|threads,buffered. Warns once about an
 * unknown word. */
void zn_nvme__env_force(int *threads, int *buffered);
/* Direct-I/O alignment of an open file: statx(STATX_DIOALIGN), else the
 * backing device's logical block size from /sys, else 4096. */
void zn_nvme__dio_align(int fd, uint32_t *off_align, uint32_t *mem_align);
/* Tries to set O_DIRECT on fd and do one aligned write+read at offset 0.
 * Returns 0 when O_DIRECT works (the flag is left set), else -errno with
 * the flag cleared and a reason in why. */
int zn_nvme__try_direct(int fd, uint32_t align, char *why, size_t whylen);
/* Sets up and tears down a small ring. 0 or -errno with a reason. */
int zn_nvme__try_uring(char *why, size_t whylen);

#endif
