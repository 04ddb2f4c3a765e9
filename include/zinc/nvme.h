/* zinc NVMe tier: an asynchronous I/O engine (io_uring, O_DIRECT, fixed
 * buffers and files) and swap spaces of preallocated files with an extent
 * allocator, striping and crc32c integrity. The rest of zinc sees only this
 * header; whether io_uring or a thread pool, O_DIRECT or buffered I/O is in
 * use is reported (zn_aio_backend_desc, zn_nvme_probe) but never matters to
 * callers.
 *
 * Thread safety: every function in this header may be called from several
 * threads at once on the same engine / swap space, except *_destroy (call it
 * once, when no other call on that object is running). Submission goes
 * through one locked queue per engine; worker threads (one per ring, or the
 * pool) take blocks from it. A handle may be waited on by one thread only.
 *
 * Environment: ZINC_AIO_FORCE=threads forces the pread/pwrite thread pool
 * instead of io_uring; ZINC_AIO_FORCE=buffered forces buffered I/O instead
 * of O_DIRECT; "threads,buffered" forces both. Each forced or automatic
 * fallback prints one warning. */
#ifndef ZINC_NVME_H
#define ZINC_NVME_H

#include <stddef.h>
#include <stdint.h>

#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zn_aio zn_aio;
typedef struct zn_swap zn_swap;

/* A request in flight. 0 is never a valid handle. */
typedef uint64_t zn_aio_handle;

typedef enum {
    ZN_AIO_BACKEND_URING = 0,  /* io_uring rings, one worker thread each */
    ZN_AIO_BACKEND_THREADS,    /* a pool of threads doing pread/pwrite */
} zn_aio_backend;

/* What the fault hook sees for each completed block (tests inject failures
 * through it, like SQLite's test VFS). */
typedef struct {
    uint64_t seq;         /* 1-based ordinal of this completion on the engine */
    int is_write;
    const char *path;     /* the swap file */
    uint64_t offset;      /* file offset of the block */
    uint32_t len;         /* bytes asked for */
    int res;              /* what the kernel (or pread/pwrite) returned */
} zn_aio_fault_site;

/* Returns the result to deliver instead of site->res: site->res for no
 * fault, a negative errno (-EIO, -ENOSPC, ...), or a short count 0 < r < len
 * (the engine then resumes the rest, as it does for a real short count).
 * Called on worker threads; must be thread-safe. */
typedef int (*zn_aio_fault_fn)(void *user, const zn_aio_fault_site *site);

typedef struct {
    size_t block_size;        /* bytes per I/O and stripe unit (1 MiB); a power
                                 of two >= 4096 */
    int queue_depth;          /* blocks in flight per ring / pool size (8) */
    int intra_op_parallelism; /* io_uring rings, each with a worker thread (1) */
    int threads;              /* thread-pool workers when io_uring is not used;
                                 0 = queue_depth * intra_op_parallelism */
    int single_submit;        /* one io_uring_submit per block (0 = batched) */
    int overlap_events;       /* 1: refill as blocks complete; 0: submit a
                                 batch of queue_depth, wait for all of it (1) */
    int force_threads;        /* never use io_uring (also ZINC_AIO_FORCE) */
    int force_buffered;       /* never use O_DIRECT (also ZINC_AIO_FORCE) */
    int register_buffers;     /* register staging and caller buffers as fixed
                                 buffers (1); failure to register only warns */
    int staging_buffers;      /* block_size bounce buffers per worker, used
                                 for unaligned buffers and padded tails (2) */
    int crc;                  /* record crc32c per block on write, verify on
                                 read (1) */
    int collect_latency;      /* keep a per-block latency histogram (0) */
    /* Fault injection: when fault_nth > 0 the fault_nth-th completion after
     * creation (or after zn_aio_inject_fault) returns fault_res instead. */
    uint64_t fault_nth;
    int fault_res;
    zn_aio_fault_fn fault_hook; /* called for every completion when set */
    void *fault_user;
} zn_aio_config;

/* DeepSpeed's `aio` defaults: block 1 MiB, QD 8, 1 ring, overlap on, crc on. */
ZN_API zn_aio_config zn_aio_config_default(void);

/* Creates an engine. Uses io_uring unless it is refused (ENOSYS, EPERM,
 * io_uring_disabled) or forced off, then a thread pool, with one warning.
 * Returns 0, -EINVAL (bad config, message names the field), -ENOMEM, or
 * another -errno from ring or thread setup. */
ZN_API int zn_aio_create(zn_aio **out, const zn_aio_config *cfg);

/* Waits for every request still in flight, then frees the engine. Swap
 * spaces created on it must be destroyed first. Accepts NULL. */
ZN_API void zn_aio_destroy(zn_aio *a);

ZN_API zn_aio_backend zn_aio_get_backend(const zn_aio *a);
/* One line: backend, rings/threads, QD, block size, fixed buffers/files and
 * why a fallback was taken. Static per engine; valid until destroy. */
ZN_API const char *zn_aio_backend_desc(const zn_aio *a);
/* The engine's effective configuration (after defaults and overrides). */
ZN_API const zn_aio_config *zn_aio_get_config(const zn_aio *a);

/* Allocates an I/O buffer: 2 MiB aligned and backed by transparent huge
 * pages where the kernel allows. Physically contiguous 2 MiB pages matter:
 * a 1 MiB O_DIRECT request over scattered 4 KiB pages needs 256 segments,
 * more than many devices take in one command (virtio-blk here: 254), so the
 * kernel splits it; measured on this project's VM, reads went from ~1.4 to
 * ~2.1 GB/s at QD 16. Pinned slabs meant for NVMe I/O should be made the
 * same way before they are pinned. Returns NULL (message set) on failure;
 * free with zn_aio_buffer_free. */
ZN_API void *zn_aio_buffer_alloc(size_t len);
ZN_API void zn_aio_buffer_free(void *buf);

/* Registers [buf, buf+len) as fixed buffers with every ring (split into
 * pieces of at most 1 GiB), so that requests whose data lies inside it skip
 * the kernel's per-I/O page pinning. The memory stays owned by the caller
 * and must outlive the registration. Returns an id >= 0, or -EINVAL,
 * -ENOSPC (too many registrations), or the -errno of the register call;
 * with the thread pool it only records the range and returns an id. */
ZN_API int zn_aio_register_buffer(zn_aio *a, void *buf, size_t len);
/* Removes a registration. No request using it may be in flight.
 * Returns 0 or -ENOENT. */
ZN_API int zn_aio_unregister_buffer(zn_aio *a, int id);

/* ---- swap space --------------------------------------------------------- */

#define ZN_SWAP_MAX_PATHS 16

typedef struct {
    int npaths;
    const char *paths[ZN_SWAP_MAX_PATHS]; /* directories, one file each */
    /* Capacity. When path_bytes[i] are all 0, `bytes` is split evenly over
     * the paths; otherwise each path gets path_bytes[i] and, because
     * tensors are striped over all paths, the usable capacity is npaths x
     * the smallest (a warning says so when they differ). Rounded up to
     * block_size per path. */
    uint64_t bytes;
    uint64_t path_bytes[ZN_SWAP_MAX_PATHS];
    int keep_files;          /* leave the files in place at destroy */
    const char *file_prefix; /* file name prefix (default "zinc-swap") */
    /* 1: each path's file goes in a new directory of this run's,
     * <path>/zinc-run.<host>.<pid>.<start>.<k> (mode 0700; <start> is the
     * process's start in seconds since the epoch, <k> counts the process's
     * run directories), holding a lock file ("lock": host, PID, start and
     * file_prefix, flock'ed while the space lives) and the file
     * <prefix>.<i>.swp; destroy removes the three (keep_files: keeps them and
     * marks the lock file as kept). 0 (the default): the file goes in the
     * path itself as <prefix>.<pid>.<n>.<i>.swp, flock'ed. */
    int run_dir;
} zn_swap_config;

ZN_API zn_swap_config zn_swap_config_default(void);

/* Creates one file per path (in a run directory with run_dir; see
 * zn_swap_config), with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, preallocated
 * with fallocate to its full size, and registers the files with the engine.
 * A path whose file system refuses O_DIRECT uses buffered I/O (one warning).
 * Returns 0, -ENOSPC (message: path, bytes needed, bytes free), -EEXIST (a
 * file or run directory already there), -EINVAL, -EOPNOTSUPP (no
 * fallocate), or another -errno naming the path. On failure nothing made is
 * left behind. */
ZN_API int zn_swap_create(zn_swap **out, zn_aio *a, const zn_swap_config *cfg);

/* Removes the files and run directories (unless keep_files) and frees the
 * swap space. No request on its extents may be in flight. Accepts NULL. */
ZN_API void zn_swap_destroy(zn_swap *s);
/* Async-signal-safe (unlink and rmdir only): removes every swap file, lock
 * file and run directory this process created and would remove at destroy
 * (a second SIGTERM / SIGINT ends a run at once, and its files must not stay
 * behind). Returns how many files and directories it removed. */
ZN_API int zn_swap_remove_all_now(void);
/* Removes what dead runs left in `dir`:
 *  - run directories (zinc-run.<host>.<pid>.<start>.<k>, any prefix) of
 *    this host whose lock no process holds and whose run is gone (no such
 *    PID, or a process of that PID that started at another time), with
 *    everything in them; one a run kept (keep_files) is left, with a
 *    warning. Another host's are never touched (flock is not reliable on a
 *    shared file system): each is named in a warning with its size.
 *  - files of the layout before run directories, "<prefix>.<pid>.<n>.<i>.swp"
 *    in `dir` itself (prefix NULL: none), whose lock is free and PID gone.
 * A live run's files are never touched. Each removal is warned about with
 * its size; *bytes sums them and *files counts the directories and old
 * files removed. Returns 0 (a missing dir has nothing) or -errno. */
ZN_API int zn_swap_clean_stale(const char *dir, const char *prefix, uint64_t *bytes, int *files);

/* Why zn_swap_clean_stale leaves a run directory (or old-layout file). */
typedef enum {
    ZN_SWAP_HELD_LIVE,        /* its run still goes (or is making it) */
    ZN_SWAP_HELD_LOCKED,      /* its run is gone, its lock is still held */
    ZN_SWAP_HELD_KEPT,        /* its run kept it (tiers.keep_swap) */
    ZN_SWAP_HELD_OTHER_HOST,  /* another host's: judged on that host only */
    ZN_SWAP_HELD_UNREADABLE,  /* its lock would not open, or it would not go */
} zn_swap_held_why;

#define ZN_SWAP_SCAN_NAMED 8

/* What a swap folder holds of zinc's runs, by zn_swap_clean_stale's rules. */
typedef struct {
    uint64_t stale_bytes;  /* what it removes: dead runs' leftovers */
    int stale;             /* their run directories and old-layout files */
    uint64_t held_bytes;   /* what it leaves, all of it */
    int held;
    struct {
        char path[ZN_PATH_MAX + 320];
        uint64_t bytes;
        long pid;          /* the run's, as its name says */
        zn_swap_held_why why;
    } named[ZN_SWAP_SCAN_NAMED];  /* the largest of what it leaves */
    int n_named;
} zn_swap_scan;

/* Counts, without removing anything or warning, what zn_swap_clean_stale
 * would remove in `dir` (same rules, same code) and what it would leave.
 * Like it, may wait up to 2 s on a dead run's lock held past its exit.
 * Returns 0 (a missing dir holds nothing) or -errno. */
ZN_API int zn_swap_scan_stale(const char *dir, const char *prefix, zn_swap_scan *out);
/* The words for a zn_swap_held_why ("a live run's", ...). */
ZN_API const char *zn_swap_held_desc(zn_swap_held_why why);

/* A tensor's place in a swap space. A value the caller keeps; it owns
 * nothing. Extents of at least block_size bytes start on a stripe boundary
 * and are striped over all paths; smaller ones sit inside one stripe. */
typedef struct {
    zn_swap *swap;
    uint64_t offset;   /* in the striped address space */
    uint64_t bytes;    /* capacity, >= the bytes asked for, aligned */
    uint32_t id;       /* slot in the swap's extent table */
    uint32_t gen;      /* catches use after zn_swap_free */
} zn_extent;

/* Allocates `bytes` for tensor `tensor_name` (copied, for error messages).
 * Returns 0, -EINVAL, or -ENOSPC (message names the tensor, the bytes asked,
 * the bytes free and the largest free extent). Thread-safe. */
ZN_API int zn_swap_alloc(zn_swap *s, uint64_t bytes, const char *tensor_name,
                         zn_extent *out);
/* Returns the extent's space. Returns 0, -EINVAL (not a live extent of this
 * swap), or -EBUSY (a request on it is in flight). */
ZN_API int zn_swap_free(zn_swap *s, const zn_extent *e);

typedef struct {
    uint64_t capacity;        /* usable bytes */
    uint64_t used, peak_used; /* bytes in live extents, and their high-water mark */
    uint64_t largest_free;    /* the largest extent that can be allocated now */
    uint32_t extents;         /* live extents */
    uint32_t free_ranges;     /* fragments of free space */
    int npaths;
    int direct;               /* 1: every file uses O_DIRECT */
    uint32_t align;           /* offset/length alignment of direct I/O */
} zn_swap_stats;

ZN_API void zn_swap_get_stats(zn_swap *s, zn_swap_stats *out);
/* Path of the file on path i, or NULL. Valid until destroy. */
ZN_API const char *zn_swap_file_path(const zn_swap *s, int i);
/* The crc32c of bytes [off, off + len) of an extent as last written, for
 * a checkpoint that takes the swap file over instead of copying it: the
 * per-block crc32c the engine recorded where the range covers a block's
 * written bytes whole, the rest (all of it when the engine records none)
 * read from the file. One path only: the extent is then bytes
 * [e->offset, e->offset + e->bytes) of that file. Returns 0; -EINVAL for a
 * range beyond the extent or a stale extent; -ENOTSUP for a striped space;
 * -errno of a read (each with a message). */
ZN_API int zn_swap_extent_crc(zn_swap *s, const zn_extent *e, uint64_t off, uint64_t len,
                              uint32_t *crc);

/* ---- requests ------------------------------------------------------------
 * A request moves [0, len) of an extent from or to `buf` (len <= e->bytes).
 * Any address and length work; data in registered buffers aligned to the
 * file's direct-I/O alignment take the fast path, the rest (and a length
 * that is not a multiple of the alignment: its last block is padded) goes
 * through the engine's staging buffers. The buffer must stay untouched until
 * the request is waited on; a write's buffer may be reused once its wait
 * returned 0. Each write records a crc32c per block and the written length;
 * a read may not ask for more than the last write wrote (-EINVAL). */
ZN_API int zn_aio_submit_write(zn_aio *a, const zn_extent *e, const void *buf,
                               size_t len, zn_aio_handle *out);
ZN_API int zn_aio_submit_read(zn_aio *a, const zn_extent *e, void *buf,
                              size_t len, zn_aio_handle *out);

/* Blocks until the request completes, releases the handle and returns its
 * status: 0; -errno of a failed block (-EIO, -ENOSPC, ...); or ZN_ECORRUPT
 * for a crc mismatch. On failure zn_last_error() names the tensor, the file
 * and the file offset. Other requests are unaffected. -ENOENT for a handle
 * that is unknown or already released. */
ZN_API int zn_aio_wait(zn_aio *a, zn_aio_handle h);
/* Like zn_aio_wait, but returns -EINPROGRESS at once (keeping the handle)
 * while the request is still running. */
ZN_API int zn_aio_poll(zn_aio *a, zn_aio_handle h);
/* Waits for every request submitted so far and releases their handles
 * (handles held elsewhere become invalid), except those another thread is
 * blocked on in zn_aio_wait: that thread releases its own. Returns 0 or the
 * status of the first failed one, with its message. */
ZN_API int zn_aio_wait_all(zn_aio *a);

/* Arms fault injection: the nth completion from now returns `res` (a
 * negative errno or a short count; 0 disarms). For tests. */
ZN_API void zn_aio_inject_fault(zn_aio *a, uint64_t nth, int res);

typedef struct {
    uint64_t reads, writes;           /* requests completed */
    uint64_t bytes_read, bytes_written;
    uint64_t blocks;                  /* block I/Os completed */
    uint64_t resubmits;               /* short counts resumed, EAGAIN retries */
    uint64_t errors;                  /* requests that failed */
    uint64_t crc_mismatches;
    uint64_t bounced;                 /* blocks through staging buffers */
    /* Per-block latency from submission to completion (collect_latency). */
    double lat_p50_us, lat_p99_us, lat_max_us;
} zn_aio_stats;

ZN_API void zn_aio_get_stats(zn_aio *a, zn_aio_stats *out);
ZN_API void zn_aio_reset_stats(zn_aio *a);

/* ---- probe (for `zinc info`) -------------------------------------------- */

typedef struct {
    int uring_ok;               /* a ring was really set up and torn down */
    int uring_errno;            /* errno when refused, else 0 */
    int uring_disabled_sysctl;  /* /proc/sys/kernel/io_uring_disabled, -1 unknown */
    char uring_reason[160];     /* why refused (empty when ok) */
    int direct_ok;              /* an O_DIRECT write+read worked on a temp file */
    char direct_reason[160];
    uint32_t logical_block;     /* direct-I/O offset alignment (statx or /sys) */
    uint32_t dio_mem_align;     /* direct-I/O buffer alignment, 0 unknown */
    char fstype[32];            /* "ext4", "xfs", "tmpfs", ... */
    char device[64];            /* backing disk, e.g. "nvme0n1", "vda"; "" unknown */
    char partition[64];         /* e.g. "nvme0n1p2"; "" when the fs is on the disk */
    char model[128];            /* /sys/block/<dev>/device/model, "" unknown */
    int rotational;             /* 1, 0, or -1 unknown */
    uint64_t free_bytes;        /* available to this user */
    uint64_t total_bytes;
    zn_aio_backend backend;     /* what zn_aio_create + zn_swap_create would use */
    int buffered;               /* 1: buffered I/O would be used on this path */
    char backend_reason[256];   /* e.g. "io_uring + O_DIRECT" or why not */
} zn_nvme_probe_info;

/* Probes a directory: creates and removes a temp file in it, sets up and
 * tears down an io_uring ring, reads /sys and /proc. Honours
 * ZINC_AIO_FORCE. Returns 0 (the fields say what works), or -errno when
 * the path itself is unusable (message names it). */
ZN_API int zn_nvme_probe(const char *path, zn_nvme_probe_info *out);

#ifdef __cplusplus
}
#endif
#endif
