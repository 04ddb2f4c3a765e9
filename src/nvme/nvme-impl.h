/* Private interfaces of src/nvme: the extent allocator, the engine's object
 * shared by its three files, its file table (used by swap.c) and shared
 * probing helpers. */
#ifndef ZN_NVME_IMPL_H
#define ZN_NVME_IMPL_H

#include <liburing.h>
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

/* ---- what a run owns on disk (rundir.c) -----------------------------------
 * A swap space's files go in a new directory per path,
 * <path>/zinc-run.<host>.<pid>.<start>.<k> (mode 0700), with a lock file
 * that names the run and is flock'ed for its life. Every file and directory
 * made is entered in a fixed table that zn_swap_remove_all_now empties from
 * a signal handler. */
typedef struct {
    char *dir;          /* NULL: none made */
    char *lock;         /* dir/lock */
    int lock_fd;        /* flock'ed, -1 none */
    int owned_dir, owned_lock;  /* entries of the signal-safe table, -1 none */
} zn_rundir;

/* Makes the run directory under `path` (it must be new) and its lock file,
 * whose text names the host, the PID, the start time and `made_by`.
 * Returns 0 or -errno with a message naming the path; on failure what was
 * made is in *r for zn_rundir__close. */
int zn_rundir__create(zn_rundir *r, const char *path, const char *made_by);
/* Removes the lock file and the directory (which must hold nothing else by
 * then), or with `keep` marks the lock file as kept and leaves both; then
 * releases the lock. Accepts a zeroed or half-made *r. */
void zn_rundir__close(zn_rundir *r, int keep);
/* Enters a file (is_dir 0) or directory in the signal-safe table; the entry
 * index, or -1 when the table is full. */
int zn_swap__own(const char *path, int is_dir);
void zn_swap__disown(int i);

#define ZN_AIO_MAX_FILES 64

struct zn_swap {
    zn_aio *aio;
    int npaths;
    int fd[ZN_SWAP_MAX_PATHS];
    int slot[ZN_SWAP_MAX_PATHS];   /* engine file-table index, -1 none */
    char *path[ZN_SWAP_MAX_PATHS];
    int owned[ZN_SWAP_MAX_PATHS];  /* entries of the signal-safe table, or -1 */
    zn_rundir run[ZN_SWAP_MAX_PATHS]; /* the run directories (run_dir), else unused */
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

/* ---- engine internals (engine.c, engine_worker.c, engine_request.c) --------
 * The engine object and its requests, blocks and workers: engine.c creates
 * and destroys them, engine_worker.c moves the blocks, engine_request.c
 * hands out and releases the requests. */
#define ZN_AIO_MAX_REGS 32
#define ZN_AIO_REG_PIECE (1ull << 30) /* io_uring caps one fixed buffer at 1 GiB */
#define ZN_AIO_MAX_REG_SLOTS 256

typedef struct zn_req zn_req;
struct zn_req {
    zn_aio_handle handle;
    uint64_t seq;            /* submission order, for wait_all's "first" */
    int is_write;
    unsigned char *buf;
    size_t len;
    zn_swap *swap;
    zn_ext_rec *rec;
    size_t next_off;         /* first byte not yet handed to a worker */
    uint32_t inflight;       /* blocks handed out and not completed */
    int status;
    char *errmsg;
    int done;
    int waiters;             /* threads inside zn_aio_wait on it: they
                                release it, never wait_all */
    zn_req *next;            /* pending-queue link */
};

typedef struct {
    zn_req *req;
    size_t roff;             /* offset in the request */
    uint32_t len;            /* caller bytes in this block */
    uint32_t io_len;         /* bytes to transfer (padded to the alignment) */
    uint32_t done;           /* bytes transferred so far */
    int file;                /* index in the swap's paths */
    int fd, fixed_file;      /* raw fd; engine file slot or -1 */
    uint64_t foff;           /* file offset of the block */
    unsigned char *iobuf;    /* where the kernel reads/writes */
    int staging;             /* staging index in the worker, -1 none */
    int fixed_buf;           /* fixed-buffer index, -1 none */
    int noprogress;
    uint64_t t0;
    int busy;
} zn_blk;

typedef struct {
    zn_aio *a;
    int idx;
    pthread_t th;
    int started;
    int has_ring;
    struct io_uring ring;
    int efd;
    uint64_t efd_val;
    int sleeping;            /* waiting for work (eventfd armed); under a->lock */
    zn_blk *blks;
    int nblks;
    int inflight;
    /* io_uring worker's scratch, allocated at create so that the worker
     * itself cannot fail: blocks taken per round, completions peeked */
    int *taken;
    struct io_uring_cqe **cqes;
    unsigned char **staging;
    int *staging_free;
    int nstaging_free;
} zn_worker;

typedef struct {
    unsigned char *base;
    size_t len;
    int first_slot, nslots;
    int used;
} zn_reg;

#define ZN_AIO_HIST_SUB 8
#define ZN_AIO_HIST_N (64 * ZN_AIO_HIST_SUB)

struct zn_aio {
    zn_aio_config cfg;
    zn_aio_backend backend;
    char desc[320];
    int nworkers;
    zn_worker *w;
    int fixed_files, fixed_bufs;
    int nstaging;            /* per worker */
    pthread_mutex_t lock;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    int lock_init;
    zn_req *qhead, *qtail;
    zn_req **slots;
    uint32_t *gens;
    uint32_t nslots;
    uint32_t *free_slots;
    uint32_t nfree_slots;
    uint64_t live;           /* requests not yet released */
    uint64_t running;        /* requests not yet done */
    uint64_t submit_seq;
    int stop;
    struct {
        int fd;
        char *path;
        int used;
    } files[ZN_AIO_MAX_FILES];
    zn_reg regs[ZN_AIO_MAX_REGS];
    int reg_slot_used[ZN_AIO_MAX_REG_SLOTS];
    int buf_table;           /* fixed-buffer table size per ring */
    atomic_uint_fast64_t seq;
    atomic_uint_fast64_t resubmits;
    uint64_t fault_nth;      /* absolute completion ordinal to fail, 0 none */
    int fault_res;
    zn_aio_stats st;
    uint64_t hist[ZN_AIO_HIST_N];
    uint64_t hist_n;
};

/* Latency histogram bucket of a value in ns, and the bucket's middle value:
 * the workers count into it, zn_aio_get_stats reads percentiles out. */
static inline int zn_aio__hist_idx(uint64_t v)
{
    if (v < ZN_AIO_HIST_SUB)
        return (int)v;
    int e = 63 - __builtin_clzll(v);
    int sub = (int)((v >> (e - 3)) & (ZN_AIO_HIST_SUB - 1));
    return (e - 2) * ZN_AIO_HIST_SUB + sub;
}

static inline double zn_aio__hist_val(int i)
{
    if (i < ZN_AIO_HIST_SUB)
        return i;
    int e = i / ZN_AIO_HIST_SUB + 2, sub = i % ZN_AIO_HIST_SUB;
    double lo = (double)((1ull << e) + ((uint64_t)sub << (e - 3)));
    return lo + (double)(1ull << (e - 3)) / 2;
}

/* Marks a request done, counts it and wakes its waiters. Under a->lock. */
void zn_aio__finish_req(zn_aio *a, zn_req *r);
/* Tells the workers that there is work (or that the engine stops). Under
 * a->lock. */
void zn_aio__wake_workers(zn_aio *a);
/* Worker thread bodies: one io_uring ring each, or one pread/pwrite at a
 * time (arg: the zn_worker). */
void *zn_aio__uring_main(void *arg);
void *zn_aio__pool_main(void *arg);

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
