/* zinc communicator: collectives between the ranks of a data-parallel /
 * ZeRO job, the launch environment (mpirun, srun, torchrun-style variables),
 * per-rank GPU choice and NUMA binding, and the shard arithmetic of flat
 * buffers. zinc moves bytes with existing transports: NCCL between GPUs,
 * MPI or plain TCP between hosts.
 *
 * Backends (one communicator = a host part + an optional device part)
 *   host part, for host buffers (loss, grad norm, flags, host-tier shards):
 *     "single"  world size 1: collectives are copies. Always built.
 *     "mpi"     Open MPI nonblocking collectives (MPI_Iallreduce, ...), when
 *               launched by mpirun / srun and built with MPI.
 *     "tcp"     zinc's own ring collectives over TCP sockets, for the
 *               torchrun-style environment without MPI; rank 0 listens on
 *               MASTER_ADDR:MASTER_PORT and is the rendezvous point.
 *   device part, for the *_on functions (device buffers on a zn_stream):
 *     NCCL      when the device is CUDA and zinc is built with NCCL; the
 *               host part shares NCCL's unique id (bootstrap).
 *     host fn   on the host device backend: the host collective runs on the
 *               stream's worker thread when the stream reaches it.
 *   "auto" picks: world 1 -> single; launched by mpirun/srun with MPI built
 *   -> mpi; torchrun variables (or srun without MPI but with MASTER_ADDR)
 *   -> tcp; and NCCL as the device part when cfg.dev is a CUDA device.
 *
 * Ordering. Collectives are matched by issue order: every rank must issue
 * the same collectives in the same order (blocking, i*, and *_on ones
 * together). Each issued collective gets a sequence number (#1, #2, ...)
 * that errors quote.
 *
 * Failures. A collective that does not complete within cfg.timeout_s, or
 * a rank that dies (its sockets close), fails on every surviving rank with
 * an error that names the rank and the operation, e.g.
 *   "allreduce #17 (4096 x f32, sum) on rank 2/3: rank 1 did not join
 *    within 5.0 s"
 * Rank 0 collects the reports of the other ranks for a short grace period
 * (cfg.grace_s) and sends them one verdict; so a failure reaches the caller
 * within timeout_s + 2 * grace_s + 0.5 s (a dead rank whose sockets close:
 * at once). Codes: ZN_ETIMEOUT (a collective did not
 * finish in time), -ECONNRESET (a rank's connection closed: it died), and
 * ZN_EMPI / ZN_ENCCL / -errno for transport errors. After a failure the
 * communicator is broken: every later call returns the same error. The
 * process should then end; zn_comm_abort() tells the other ranks (with
 * MPI it returns 1: the application then calls MPI_Abort, the only way to
 * stop ranks that are stuck inside MPI; the library never ends the
 * process).
 *
 * Conventions: functions return 0 or a negative zinc status (util.h) with
 * the detail in zn_last_error(). Counts are elements of `dt` (ZN_DTYPE_F32
 * or ZN_DTYPE_BF16), broadcast counts bytes. bf16 sums are rounded to bf16
 * after every addition (as NCCL does); results are bit-identical on all
 * ranks. A communicator may be used from several threads (calls are
 * serialised), but the issue order must match across ranks. */
#ifndef ZINC_COMM_H
#define ZINC_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "zinc/util.h"
#include "zinc/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- launch environment ----------------------------------------------------*/
typedef enum {
    ZN_LAUNCH_NONE = 0,     /* plain process: world size 1 */
    ZN_LAUNCH_MPI = 1,      /* mpirun / mpiexec (OMPI_COMM_WORLD_*, PMI_*) */
    ZN_LAUNCH_SLURM = 2,    /* srun (SLURM_PROCID inside a job step) */
    ZN_LAUNCH_TORCHRUN = 3, /* RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT */
} zn_launcher;

typedef struct zn_launch_info {
    zn_launcher launcher;
    int rank;               /* 0 .. world_size-1 */
    int world_size;         /* >= 1 */
    int local_rank;         /* rank among the processes on this host */
    int local_size;         /* processes on this host (>= 1) */
    char master_addr[256];  /* MASTER_ADDR, "" when unset */
    int master_port;        /* MASTER_PORT, 0 when unset */
} zn_launch_info;

/* Reads the launch environment. Precedence: RANK+WORLD_SIZE (torchrun),
 * then OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE (mpirun), then
 * SLURM_PROCID/SLURM_NTASKS inside a job step (srun); LOCAL_RANK,
 * LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_*, MPI_LOCALRANKID/NRANKS,
 * SLURM_LOCALID and SLURM_STEP_TASKS_PER_NODE give the local rank. None of
 * them: ZN_LAUNCH_NONE, rank 0 of 1. Returns 0, or ZN_ECONFIG naming the
 * variable when a value is malformed or inconsistent (RANK >= WORLD_SIZE,
 * MASTER_PORT not in 1..65535, ...). */
ZN_API int zn_launch_detect(zn_launch_info *out);

/* "none", "mpirun", "srun", "torchrun". */
ZN_API const char *zn_launcher_name(zn_launcher l);

/* The device this rank should use, for zn_dev_config.name: "cuda:K" with
 * K = local_rank mod (number of visible GPUs), or "host" when no GPU
 * answers or zinc is built without CUDA. Warns when several local ranks
 * share one GPU. Returns 0 or ZN_EARG (buffer too small). */
ZN_API int zn_launch_device_name(const zn_launch_info *li, char *name, size_t len);

/* Binds the calling process (CPU set and memory policy, hwloc) to NUMA
 * node `node` (its OS index), the node nearest the rank's GPU
 * (zn_dev_info.numa_node). node < 0: the node with index local_rank mod
 * (number of nodes). *bound (may be NULL) receives the node. Returns 0,
 * ZN_EARG (no such node), or -errno from hwloc (the CPU binding; a refused
 * memory binding only warns, once). */
ZN_API int zn_launch_bind_numa(const zn_launch_info *li, int node, int *bound);

/* ---- shards of a flat buffer (ZeRO partitioning) -----------------------------
 * A flat buffer of n elements is padded to `padded` = n rounded up to a
 * multiple of world * align; rank r owns elements [offset, offset + shard)
 * of the padded buffer, of which `len` (<= shard) are real elements (the
 * rest is padding, which the owner keeps at zero). all-gather with
 * count = shard rebuilds the padded buffer; reduce-scatter of the padded
 * buffer with count = shard gives each rank its shard. */
typedef struct zn_shard {
    size_t padded;   /* n rounded up to a multiple of world * align */
    size_t shard;    /* padded / world: every rank's count */
    size_t offset;   /* rank * shard */
    size_t len;      /* real elements in this shard: min(shard, n - offset), or 0 */
} zn_shard;

/* align (elements) >= 1, e.g. 64 to keep every bf16 shard 128-byte aligned;
 * 0 means 1. Returns 0, or ZN_EARG (world < 1, rank outside [0, world),
 * size overflow). */
ZN_API int zn_comm_shard(size_t n, int world, int rank, size_t align, zn_shard *out);

/* ---- the communicator ---------------------------------------------------------*/
typedef struct zn_comm zn_comm;
typedef struct zn_comm_req zn_comm_req;

typedef enum { ZN_REDUCE_SUM = 0, ZN_REDUCE_MAX = 1 } zn_reduce_op;

typedef struct zn_comm_config {
    /* "auto" (default), "single", "mpi", "tcp", or "nccl" (= auto host part
     * + NCCL device part, required). Default: $ZINC_COMM_BACKEND or "auto". */
    const char *backend;
    /* Seconds one collective may take before it fails on every rank.
     * Default: $ZINC_COMM_TIMEOUT or 300. Must be > 0. */
    double timeout_s;
    /* Seconds the rendezvous (TCP connections, NCCL init) may take.
     * Default: $ZINC_COMM_CONNECT_TIMEOUT or 300. */
    double connect_timeout_s;
    /* Seconds rank 0 waits for the other ranks' failure reports before it
     * sends its verdict. Default: min(5, max(0.5, timeout_s / 4)) when 0. */
    double grace_s;
    /* Device for the *_on collectives and the dedicated comm stream; NULL =
     * host buffers only. The device must outlive the communicator. */
    zn_dev *dev;
    /* Launch environment; NULL = zn_launch_detect(). Copied. */
    const zn_launch_info *launch;
} zn_comm_config;

ZN_API zn_comm_config zn_comm_config_default(void);

/* Creates the communicator of this rank; collective: every rank of the
 * job calls it. Returns 0, ZN_ECONFIG (bad backend name, environment or
 * timeout), ZN_EUNSUPPORTED (a backend that is not built, e.g. mpirun
 * launch without MPI and without MASTER_ADDR), ZN_ETIMEOUT (rendezvous),
 * ZN_EMPI, ZN_ENCCL, ZN_ECUDA or -errno. *out is NULL on failure. */
ZN_API int zn_comm_create(zn_comm **out, const zn_comm_config *cfg);

/* Destroys; not collective, but every rank should have finished its
 * collectives. Waits for outstanding requests of a healthy communicator.
 * MPI: frees the MPI communicators and calls MPI_Finalize if zinc called
 * MPI_Init and the communicator is healthy (MPI can be initialised once
 * per process: a later MPI communicator in the same process fails). Accepts
 * NULL and broken communicators. */
ZN_API void zn_comm_destroy(zn_comm *c);

/* After a failure: tells the peers the job is over (TCP: closes the
 * sockets, which they see at once; NCCL: ncclCommAbort). Returns 1 when
 * only the launcher can end them: with the MPI host backend the caller
 * ends the job with MPI_Abort(MPI_COMM_WORLD, code) (zinc's CLI does);
 * 0 otherwise. Meant for the application's error path; the library never
 * calls it on its own and never ends the process. Accepts NULL. */
ZN_API int zn_comm_abort(zn_comm *c, int code);

typedef struct zn_comm_info {
    int rank, size;            /* this rank, world size */
    int local_rank, local_size;
    zn_launcher launcher;
    char host_backend[16];     /* "single", "mpi", "tcp" */
    char dev_backend[16];      /* "nccl", "host-fn", "copy" (world 1), "none" */
    char version[96];          /* "Open MPI v4.1.4", "NCCL 2.28.9", ... */
    double timeout_s;
    int nccl;                  /* 1: *_on collectives run on NCCL */
    uint64_t n_ops;            /* collectives issued so far */
} zn_comm_info;

ZN_API void zn_comm_get_info(const zn_comm *c, zn_comm_info *out);
ZN_API int zn_comm_rank(const zn_comm *c);
ZN_API int zn_comm_size(const zn_comm *c);

/* ---- host-buffer collectives (blocking) ------------------------------------------
 * Block until done, for at most timeout_s (then fail as described above).
 * Buffers are host memory. */

/* recv[i] = op over ranks of send[i], i < count. In place when send == recv.
 * Returns 0, ZN_EARG (NULL buffer with count > 0, bad dtype or op), or a
 * failure code. */
ZN_API int zn_comm_allreduce(zn_comm *c, const void *send, void *recv, size_t count,
                             zn_dtype dt, zn_reduce_op op);

/* recv[r*count + i] = send of rank r [i]; recv holds size*count elements.
 * In place when send == recv + rank*count (elements). */
ZN_API int zn_comm_allgather(zn_comm *c, const void *send, void *recv, size_t count,
                             zn_dtype dt);

/* send holds size*count elements; recv[i] = op over ranks of
 * send[rank*count + i], i < count. In place when recv == send + rank*count. */
ZN_API int zn_comm_reduce_scatter(zn_comm *c, const void *send, void *recv, size_t count,
                                  zn_dtype dt, zn_reduce_op op);

/* buf[0..bytes) of rank `root` is copied to every rank's buf. */
ZN_API int zn_comm_broadcast(zn_comm *c, void *buf, size_t bytes, int root);

/* Returns when every rank has entered the barrier. */
ZN_API int zn_comm_barrier(zn_comm *c);

/* ---- asynchronous host-buffer collectives ------------------------------------------
 * Same arguments and semantics; they return at once with a request that
 * zn_comm_wait must complete (and which it frees). Buffers must stay valid
 * and untouched until then. MPI: MPI_I* collectives progressed by
 * zn_comm_test/zn_comm_wait; tcp: run in issue order on the communicator's
 * worker thread (so they overlap the caller's compute); single: completed
 * at issue. The timeout runs from the moment the collective starts. */
ZN_API int zn_comm_iallreduce(zn_comm *c, const void *send, void *recv, size_t count,
                              zn_dtype dt, zn_reduce_op op, zn_comm_req **req);
ZN_API int zn_comm_iallgather(zn_comm *c, const void *send, void *recv, size_t count,
                              zn_dtype dt, zn_comm_req **req);
ZN_API int zn_comm_ireduce_scatter(zn_comm *c, const void *send, void *recv, size_t count,
                                   zn_dtype dt, zn_reduce_op op, zn_comm_req **req);
ZN_API int zn_comm_ibroadcast(zn_comm *c, void *buf, size_t bytes, int root,
                              zn_comm_req **req);
ZN_API int zn_comm_ibarrier(zn_comm *c, zn_comm_req **req);

/* 1 = complete, 0 = pending, < 0 = failed. Does not free the request. */
ZN_API int zn_comm_test(zn_comm *c, zn_comm_req *req);
/* Waits for completion (within the timeout), frees the request and returns
 * its status. Accepts NULL (returns 0). */
ZN_API int zn_comm_wait(zn_comm *c, zn_comm_req *req);

/* ---- device-buffer collectives on a stream ---------------------------------------
 * Queued on stream `s` of cfg.dev (NULL = the communicator's own stream,
 * zn_comm_stream) and executed when the stream reaches them; buffers are
 * device pointers. Order them against compute with zn_dev_event_record /
 * zn_dev_stream_wait_event. NCCL: ncclAllReduce / ncclAllGather /
 * ncclReduceScatter / ncclBroadcast on the stream's CUDA stream. Host device:
 * the host collective runs on the stream's worker thread. World size 1:
 * copies on the stream. Failures that happen while the stream runs break
 * the communicator and are returned by zn_comm_sync_on (and every later
 * call). Returns 0, ZN_EARG, ZN_EUNSUPPORTED (no device, or a CUDA device
 * without NCCL in a world > 1), or the communicator's failure. */
ZN_API int zn_comm_allreduce_on(zn_comm *c, zn_stream *s, const void *send, void *recv,
                                size_t count, zn_dtype dt, zn_reduce_op op);
ZN_API int zn_comm_allgather_on(zn_comm *c, zn_stream *s, const void *send, void *recv,
                                size_t count, zn_dtype dt);
ZN_API int zn_comm_reduce_scatter_on(zn_comm *c, zn_stream *s, const void *send, void *recv,
                                     size_t count, zn_dtype dt, zn_reduce_op op);
ZN_API int zn_comm_broadcast_on(zn_comm *c, zn_stream *s, void *buf, size_t bytes, int root);

/* Waits (within timeout_s) until stream `s` (NULL = the comm stream) has
 * finished its work, and returns the first collective failure (naming rank
 * and operation) or the stream's own error. NCCL: polls the stream and
 * ncclCommGetAsyncError; on timeout it aborts the NCCL communicator. */
ZN_API int zn_comm_sync_on(zn_comm *c, zn_stream *s);

/* Attaches a device after creation (for callers that create the device
 * later, like the trainer): the dedicated comm stream on it and, for a CUDA
 * device in a world > 1 (or backend "nccl"), the NCCL communicator, which
 * makes this call collective. Returns 0, ZN_EARG (a device is attached
 * already), ZN_EUNSUPPORTED, ZN_ENCCL or the stream's error. */
ZN_API int zn_comm_attach_device(zn_comm *c, zn_dev *dev);
/* Waits for the comm stream, destroys it and the NCCL communicator; the
 * host part stays usable. Call before destroying the device. Accepts NULL
 * and a communicator without a device. */
ZN_API void zn_comm_detach_device(zn_comm *c);

/* The communicator's dedicated stream on cfg.dev (created with it), or NULL
 * without a device. Owned by the communicator. */
ZN_API zn_stream *zn_comm_stream(zn_comm *c);

#ifdef __cplusplus
}
#endif
#endif
