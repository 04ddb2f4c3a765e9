/* zinc device layer: one interface over a CUDA GPU and a host-emulated GPU.
 * A device owns a capped memory arena (the GPU tier), pinned host memory
 * (counted against the CPU tier), in-order streams, events, copies, GEMM and
 * the element-wise kernels and reductions of a Llama-family decoder.
 *
 * Backends
 *   "cuda", "cuda:N"  cudart + cuBLAS; own kernels (src/gpu/cuda_*.cu).
 *   "host"            a device in host memory: every stream is a worker
 *                     thread that runs its queue in order; copies are memcpy
 *                     on that thread; GEMM is OpenBLAS (OpenMP build), the
 *                     other kernels are the plain C reference kernels
 *                     (single-threaded per stream). bf16 is stored as uint16
 *                     and computed in fp32.
 *   "auto"            CUDA when a GPU answers, else host (with an info line).
 *
 * Conventions
 *   - Every function returns 0 or a negative zinc status (util.h) with the
 *     detail in zn_last_error(), unless its comment says otherwise.
 *   - "device pointer" = memory from zn_dev_alloc (or an offset into it).
 *     Kernels and copies read/write device pointers only, except the host
 *     side of zn_dev_copy_h2d / _d2h.
 *   - Every operation that takes a stream is asynchronous: it is queued on
 *     the stream and returns at once; the arguments are checked at the call
 *     (bad arguments fail then, nothing is queued). Failures that happen
 *     while the work runs (a CUDA fault) are sticky on the stream and are
 *     returned by the next zn_dev_stream_sync / zn_dev_event_sync.
 *     Host buffers passed to copies must stay valid until the copy is done.
 *   - stream == NULL means the device's default stream (an ordinary stream
 *     created with the device; it does NOT synchronise with other streams,
 *     unlike CUDA's legacy stream 0).
 *   - Element counts and leading dimensions are in elements, not bytes.
 *   - Tensors are a device pointer + a zn_dtype. Math is fp32 (fp32
 *     accumulation in GEMM and reductions) whatever the storage type.
 *   - Where an output may alias an input it says so; otherwise it must not.
 *   - Thread safety: a device, its streams and events may be used from
 *     several threads; calls that queue on the same stream are serialised in
 *     the order they take the stream's lock.
 *   - Results are deterministic (same backend, same inputs, same order of
 *     calls => same bits): no kernel uses floating-point atomics. */
#ifndef ZINC_DEVICE_H
#define ZINC_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "zinc/optim.h"
#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zn_dev zn_dev;
typedef struct zn_stream zn_stream;
typedef struct zn_event zn_event;

/* Element types: zn_dtype from util.h. Only ZN_DTYPE_F32 and ZN_DTYPE_BF16
 * are accepted here (ZN_DTYPE_F16 -> ZN_EUNSUPPORTED). bf16 is the top half
 * of an fp32 (round to nearest even, NaN kept), as in torch; host-side
 * conversion: zn_f32_to_bf16 / zn_bf16_to_f32 in optim.h. */

/* ---- creation ----------------------------------------------------------------*/
typedef enum { ZN_DEV_HOST = 0, ZN_DEV_CUDA = 1 } zn_dev_kind;

typedef struct zn_dev_config {
    /* "auto" (default), "host", "cuda" (= "cuda:0") or "cuda:N". */
    const char *name;
    /* Size of the device arena = the GPU tier budget (tiers.gpu), bytes.
     * 0 = auto: on CUDA the free memory minus gpu_margin; on host a quarter
     * of physical RAM. The whole arena is reserved at creation (one
     * cudaMalloc; on host an mmap that is committed as pages are touched). */
    uint64_t gpu_budget;
    /* With gpu_budget = 0 on CUDA: memory left to the CUDA context, cuBLAS
     * workspaces and other processes. Default 1 GiB. */
    uint64_t gpu_margin;
    /* Cap on pinned host memory from zn_dev_host_alloc/_register (tiers.cpu),
     * bytes; 0 = no cap. */
    uint64_t cpu_budget;
    /* NUMA node for pinned host memory: -1 (default) = the node nearest the
     * GPU (CUDA: sysfs numa_node of its PCI device; host backend: the node
     * of the CPU that creates the device). */
    int numa_node;
    /* 1: no arena at creation; the caller makes its streams (each with its
     * cuBLAS workspace) and its NCCL communicator first, then reserves the
     * arena with zn_dev_arena_reserve out of what they left free. */
    int defer_arena;
    /* Host backend: OpenMP threads that OpenBLAS may use for one GEMM on
     * one stream's worker thread (omp_set_num_threads on that worker).
     * 0 (default) = the OpenMP default (OMP_NUM_THREADS or all cores).
     * Several streams running GEMMs at once each get their own team. */
    int host_blas_threads;
} zn_dev_config;

ZN_API zn_dev_config zn_dev_config_default(void);

/* Creates a device. Returns 0, ZN_ENODEV (no such device / no GPU / built
 * without CUDA; the message carries the CUDA error text), ZN_EBUDGET (the
 * budget is larger than the device's free memory), ZN_ECONFIG (bad name),
 * ZN_ECUDA / ZN_ECUBLAS, or -errno. *out is NULL on failure. */
ZN_API int zn_dev_create(zn_dev **out, const zn_dev_config *cfg);

/* Drains and destroys every stream still alive, frees events, the arena
 * and pinned memory still held (with a warning naming what leaked).
 * Accepts NULL. */
ZN_API void zn_dev_destroy(zn_dev *d);

typedef struct zn_dev_info {
    zn_dev_kind kind;
    int ordinal;               /* CUDA device ordinal; 0 for host */
    char name[128];            /* "NVIDIA A10" / "host (emulated GPU)" */
    char pci_bus_id[32];       /* "0000:17:00.0"; "" on host */
    int numa_node;             /* node of pinned memory; -1 unknown */
    uint64_t total_mem;        /* physical memory of the device, bytes */
    uint64_t free_mem;         /* free at creation (before streams and arena) */
    int cc_major, cc_minor;    /* compute capability; 0 on host */
    int sm_count;              /* SMs; host: CPU cores */
    int pcie_gen;              /* current link generation, 0 unknown */
    int pcie_width;            /* current link width (lanes), 0 unknown */
    double pcie_peak_gbs;      /* one direction, GB/s (1e9), 0 unknown */
    char driver[64];           /* "CUDA runtime 13.0, driver 13.0" / BLAS */
} zn_dev_info;

ZN_API void zn_dev_get_info(const zn_dev *d, zn_dev_info *out);

/* Reserves the arena of a device made with defer_arena: `bytes` (0 = the
 * free memory less cfg.gpu_margin). On CUDA it is measured against what is
 * free now, after the context, the streams' cuBLAS workspaces and scratch
 * and any NCCL communicator; a refusal says how much those hold. ZN_EARG if
 * the arena exists already, ZN_EBUDGET if it does not fit. */
ZN_API int zn_dev_arena_reserve(zn_dev *d, uint64_t bytes);
/* Device memory this process holds outside the arena: on CUDA, the free
 * memory at creation less the free memory when the arena was reserved (the
 * streams' cuBLAS workspaces and scratch, NCCL's buffers, modules loaded
 * since; another process's allocations in between count too); 0 on host. */
ZN_API uint64_t zn_dev_outside_arena(const zn_dev *d);
/* The device memory one stream takes outside the arena on CUDA (its cuBLAS
 * handle and workspace, sized for compute capability `cc_major`, 0 = the
 * largest, and its reduction scratch; a copy stream's scratch alone), for
 * plans made before any device exists. */
ZN_API uint64_t zn_dev_stream_outside_bytes(int cc_major, int copy_only);
/* The host backend's GEMM library and the kernel family it runs on this
 * CPU, e.g. "OpenBLAS 0.3.21, Cooperlake kernels" (OPENBLAS_CORETYPE forces
 * another family). A static string. */
ZN_API const char *zn_dev_host_blas(void);
/* The GPU architectures this build's CUDA kernels were compiled for
 * (meson's gpu_arch, e.g. "8.0 8.6 8.9 9.0+PTX"; "" without CUDA), and how
 * a GPU of compute capability major.minor gets them: 2 = compiled for it,
 * 1 = through the PTX of an older architecture (JIT-compiled by the driver
 * at first use), 0 = not at all (its first kernel fails). */
ZN_API const char *zn_dev_kernel_archs(void);
ZN_API int zn_dev_arch_covered(int major, int minor);
/* The host backend's device guard (ZINC_DEVICE_GUARD=1: the arena is under
 * a memory-protection key that only device ops hold): code that runs as a
 * device op outside the backend's own workers (a communicator's host
 * reduction on a stream) opens it with 1 and closes it with 0, on the
 * calling thread. A no-op when the guard is off or the device is a GPU. */
ZN_API void zn_dev_host_guard_allow(int allow);
ZN_API zn_dev_kind zn_dev_get_kind(const zn_dev *d);

/* ---- device memory (the arena) ---------------------------------------------
 * Best-fit allocation with coalescing inside the arena; every block is
 * aligned to ZN_DEV_ALIGN bytes. */
#define ZN_DEV_ALIGN 256

typedef struct zn_dev_mem {
    uint64_t budget;           /* arena size */
    uint64_t used;             /* live bytes (rounded to ZN_DEV_ALIGN) */
    uint64_t peak;             /* high-water mark of used */
    uint64_t largest_free;     /* largest block that can be allocated now */
    uint64_t n_allocs;         /* live allocations */
    uint64_t host_budget;      /* cpu_budget (0 = no cap) */
    uint64_t host_used;        /* pinned bytes live */
    uint64_t host_peak;        /* high-water mark of host_used */
    int host_locked;           /* 1: pinned memory is page-locked; 0: the
                                  OS refused (RLIMIT_MEMLOCK) -- pageable */
} zn_dev_mem;

/* Allocates `bytes` (> 0) of device memory. `what` names the request in
 * errors ("layer 3 wq"); may be NULL. Returns 0, or ZN_EBUDGET with a message
 * naming the request, the budget, the live bytes and the largest free block
 * (fragmentation), or ZN_EARG. Contents are undefined. */
ZN_API int zn_dev_alloc(zn_dev *d, size_t bytes, const char *what, void **out);
/* Frees at once: no work queued on any stream may still use the block.
 * Accepts NULL. A pointer not from this arena is reported (zn_error) and
 * ignored. */
ZN_API void zn_dev_free(zn_dev *d, void *p);
/* Stream-ordered free: the block returns to the arena when `s` reaches this
 * point (after all work queued on `s` before it). Returns 0 or ZN_EARG. */
ZN_API int zn_dev_free_on(zn_dev *d, zn_stream *s, void *p);

ZN_API void zn_dev_mem_stats(const zn_dev *d, zn_dev_mem *out);
/* Sets peak = used and host_peak = host_used. */
ZN_API void zn_dev_reset_peak(zn_dev *d);

/* ---- pinned host memory ------------------------------------------------------
 * Page-locked host memory on the device's NUMA node, the fast path for
 * copies: CUDA = hwloc-bound pages + cudaHostRegister (cudaHostAlloc when the
 * node is unknown); host = hwloc_alloc_membind + mlock (warned once and
 * reported in zn_dev_mem.host_locked when the OS refuses mlock). Counted
 * against cpu_budget. Page aligned. Returns 0, ZN_EBUDGET (message names the
 * request, the budget and the use), -ENOMEM, ZN_ECUDA. */
ZN_API int zn_dev_host_alloc(zn_dev *d, size_t bytes, const char *what, void **out);
/* Accepts NULL; the device must be idle with respect to this buffer. */
ZN_API void zn_dev_host_free(zn_dev *d, void *p);
/* Page-locks memory the caller allocated (page-aligned start and length
 * recommended), counted against cpu_budget like zn_dev_host_alloc. */
ZN_API int zn_dev_host_register(zn_dev *d, void *p, size_t bytes, const char *what);
ZN_API void zn_dev_host_unregister(zn_dev *d, void *p);

/* ---- streams and events ------------------------------------------------------*/
/* Creates an in-order stream. `name` (may be NULL) shows in errors and logs.
 * Returns 0, ZN_ECUDA, ZN_ECUBLAS or -errno. */
ZN_API int zn_dev_stream_create(zn_dev *d, const char *name, zn_stream **out);
/* A stream for copies and kernels but no GEMM: on CUDA it has no cuBLAS
 * handle or workspace (about 100 MiB on Hopper: see
 * zn_dev_stream_outside_bytes), only its reduction scratch. A GEMM queued
 * on it is refused (ZN_EARG) on every backend, so host tests catch one. */
ZN_API int zn_dev_stream_create_copy(zn_dev *d, const char *name, zn_stream **out);
/* Waits for the work queued on the stream, then destroys it. Accepts NULL
 * (the default stream cannot be destroyed; passing it is a no-op). */
ZN_API void zn_dev_stream_destroy(zn_dev *d, zn_stream *s);
/* Blocks until the stream is idle. Returns 0 or the first failure of the
 * stream's work since the last sync (then cleared). */
ZN_API int zn_dev_stream_sync(zn_dev *d, zn_stream *s);
/* zn_dev_stream_sync on every stream of the device. */
ZN_API int zn_dev_sync(zn_dev *d);
/* Runs fn(arg) on the device's callback thread when the stream reaches this
 * point; the stream waits for fn to return. As with cudaLaunchHostFunc,
 * one thread runs the host functions of every stream, in the order the
 * streams reach them: a host function that blocks holds up every stream
 * that reaches one after it. So fn only signals (sets a flag, bumps a
 * counter, records a time); it must not wait, queue work or synchronise:
 * zinc's own waits return ZN_EINTERNAL inside one (zn_dev_in_host_fn). */
ZN_API int zn_dev_launch_host_fn(zn_dev *d, zn_stream *s, void (*fn)(void *arg), void *arg);
/* Whether the calling thread is running a host function (then it must not
 * block: zinc's waits check this and refuse). */
ZN_API int zn_dev_in_host_fn(void);
/* Waits, in stream order, until the 32-bit flag reaches `value`
 * ((int32_t)(*flag - value) >= 0, so counters may wrap), without a host
 * function: the stream's own wait (cuStreamWaitValue32 on CUDA), so other
 * streams and host functions go on meanwhile. `flag` must be 4-byte aligned
 * in pinned host memory (zn_dev_host_alloc or _register); a host thread
 * raises it with a release store. Returns 0, ZN_EARG, ZN_EUNSUPPORTED. */
ZN_API int zn_dev_stream_wait_value(zn_dev *d, zn_stream *s, const uint32_t *flag,
                                    uint32_t value);
/* Host backend only: fn(arg) runs on the stream's own worker as a device
 * op (a kernel's stand-in, such as the host collectives), in stream order,
 * not on the callback thread. ZN_EUNSUPPORTED on other backends. */
ZN_API int zn_dev_host_stream_fn(zn_dev *d, zn_stream *s, void (*fn)(void *arg), void *arg);

/* An event for ordering and waiting only: it records no timestamp (CUDA's
 * cudaEventDisableTiming, the cheap kind), so zn_dev_event_elapsed_ms
 * refuses it. */
ZN_API int zn_dev_event_create(zn_dev *d, zn_event **out);
/* An event that also records when its work completed, for
 * zn_dev_event_elapsed_ms (benchmarks, the trainer's marks). */
ZN_API int zn_dev_event_create_timed(zn_dev *d, zn_event **out);
/* May be called while streams still wait on the event (resources are
 * released when the waits are done). Accepts NULL. */
ZN_API void zn_dev_event_destroy(zn_dev *d, zn_event *e);
/* Captures the work queued on `s` so far; a later record replaces it. */
ZN_API int zn_dev_event_record(zn_dev *d, zn_event *e, zn_stream *s);
/* Work queued on `s` after this call waits until the event's latest record
 * (as of this call) has completed. An event never recorded: no wait. */
ZN_API int zn_dev_stream_wait_event(zn_dev *d, zn_stream *s, zn_event *e);
/* Blocks until the event's latest record has completed. Returns 0 or the
 * sticky failure of the stream it was recorded on. */
ZN_API int zn_dev_event_sync(zn_dev *d, zn_event *e);
/* 1 = completed (or never recorded), 0 = pending, < 0 = error. */
ZN_API int zn_dev_event_query(zn_dev *d, zn_event *e);
/* Milliseconds between two completed records of timed events (negative
 * when `end` completed first). ZN_EARG if either was made without timing,
 * has not been recorded or has not completed. */
ZN_API int zn_dev_event_elapsed_ms(zn_dev *d, zn_event *start, zn_event *end, float *ms);

/* ---- copies --------------------------------------------------------------------
 * Asynchronous on `s`. Host memory from zn_dev_host_alloc gives the DMA
 * path on CUDA; pageable host memory works but is staged by the driver.
 * The host buffer must stay valid until the stream passes the copy. */
ZN_API int zn_dev_copy_h2d(zn_dev *d, zn_stream *s, void *dst, const void *src, size_t bytes);
ZN_API int zn_dev_copy_d2h(zn_dev *d, zn_stream *s, void *dst, const void *src, size_t bytes);
ZN_API int zn_dev_copy_d2d(zn_dev *d, zn_stream *s, void *dst, const void *src, size_t bytes);
/* Sets `bytes` bytes of device memory to (unsigned char)value. */
ZN_API int zn_dev_memset(zn_dev *d, zn_stream *s, void *dst, int value, size_t bytes);
/* x[0..n) = value (converted to dt). */
ZN_API int zn_dev_fill(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t n, float value);

/* ---- GEMM ------------------------------------------------------------------------
 * ROW-MAJOR, like C arrays and torch tensors:
 *     C[m x n] = alpha * op(A)[m x k] . op(B)[k x n] + beta * C
 * op(X) = X (ZN_NOTRANS) or X^T (ZN_TRANS). lda is the distance in elements
 * between consecutive rows of A *as stored*: A stored m x k (lda >= k) when
 * not transposed, k x m (lda >= m) when transposed; same for B (stored
 * k x n, ldb >= n, or n x k, ldb >= k) and C (m x n, ldc >= n).
 * Example, a torch Linear y = x W^T with W[out][in], x[tokens][in]:
 *     zn_dev_gemm(d, s, ZN_NOTRANS, ZN_TRANS, tokens, out, in,
 *                 1, x, dt, in, W, dt, in, 0, y, dt, out);
 * Types (A and B must have the same type; fp32 accumulation always):
 *     A,B f32  -> C f32;   A,B bf16 -> C f32 or C bf16.
 * beta == 0: C is not read (NaN/garbage in C does not propagate).
 * m, n or k == 0 is allowed (k == 0: C = beta * C).
 * Returns 0, ZN_EARG (bad sizes or leading dimensions),
 * ZN_EUNSUPPORTED (type combination; on CUDA a size over INT32_MAX). */
typedef enum { ZN_NOTRANS = 0, ZN_TRANS = 1 } zn_trans;

ZN_API int zn_dev_gemm(zn_dev *d, zn_stream *s, zn_trans transA, zn_trans transB,
                       int64_t m, int64_t n, int64_t k, float alpha,
                       const void *A, zn_dtype A_dtype, int64_t lda,
                       const void *B, zn_dtype B_dtype, int64_t ldb,
                       float beta, void *C, zn_dtype C_dtype, int64_t ldc);

/* `batch` independent GEMMs; matrix i uses A + i*strideA, B + i*strideB,
 * C + i*strideC (strides in elements; a stride of 0 reuses one matrix, which
 * is how GQA shares one K/V head among a group of query heads). C strides
 * must not make two outputs overlap. */
ZN_API int zn_dev_gemm_strided_batched(zn_dev *d, zn_stream *s,
                                       zn_trans transA, zn_trans transB,
                                       int64_t m, int64_t n, int64_t k, float alpha,
                                       const void *A, zn_dtype A_dtype, int64_t lda,
                                       int64_t strideA,
                                       const void *B, zn_dtype B_dtype, int64_t ldb,
                                       int64_t strideB,
                                       float beta, void *C, zn_dtype C_dtype, int64_t ldc,
                                       int64_t strideC, int64_t batch);

/* ---- element-wise kernels and reductions (Llama decoder) ----------------------
 * All asynchronous on `s`; plain C reference = the host backend; CUDA kernels
 * in cuda_kernels.cu, cuda_nn.cu and cuda_flash.cu. "rows x dim" tensors are
 * contiguous row-major unless a leading dimension is given. Outputs marked "+=" accumulate; the others
 * overwrite. */

/* Embedding. out[t][:] = table[ids[t]][:] for t < n_tokens.
 * ids: device int32[n_tokens]; table: [vocab][dim]; out: [n_tokens][dim].
 * An id outside [0, vocab) gives a row of zeros (token data is validated by
 * the loader, not here). */
ZN_API int zn_dev_embedding_fwd(zn_dev *d, zn_stream *s, const int32_t *ids,
                                int64_t n_tokens, const void *table, zn_dtype table_dt,
                                int64_t vocab, int64_t dim, void *out, zn_dtype out_dt);
/* Scatter-add: dtable[ids[t]][:] += dout[t][:] (dtable must be F32; ids
 * outside [0, vocab) are skipped). Deterministic (no atomics). */
ZN_API int zn_dev_embedding_bwd(zn_dev *d, zn_stream *s, const int32_t *ids,
                                int64_t n_tokens, const void *dout, zn_dtype dout_dt,
                                int64_t vocab, int64_t dim, float *dtable);
/* The same on rows [row0, row0 + rows) of a larger table (a vocabulary
 * split into parts): `table` / `dtable` hold those rows only; a token whose
 * id falls outside them is skipped, its out row left as it is (forward) and
 * nothing added (backward), so calls over disjoint row ranges together
 * give the whole lookup. */
ZN_API int zn_dev_embedding_rows_fwd(zn_dev *d, zn_stream *s, const int32_t *ids,
                                     int64_t n_tokens, const void *table, zn_dtype table_dt,
                                     int64_t row0, int64_t rows, int64_t dim, void *out,
                                     zn_dtype out_dt);
ZN_API int zn_dev_embedding_rows_bwd(zn_dev *d, zn_stream *s, const int32_t *ids,
                                     int64_t n_tokens, const void *dout, zn_dtype dout_dt,
                                     int64_t row0, int64_t rows, int64_t dim, float *dtable);

/* RMSNorm (Llama/Qwen2): rstd[r] = 1/sqrt(mean_j x[r][j]^2 + eps),
 * y[r][j] = w[j] * x[r][j] * rstd[r]. fp32 reductions. rstd (device
 * float[rows]) is saved for the backward; may be NULL. y may alias x. */
ZN_API int zn_dev_rmsnorm_fwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt,
                              const void *w, zn_dtype w_dt, void *y, zn_dtype y_dt,
                              float *rstd, int64_t rows, int64_t dim, float eps);
/* dx = rstd * (w*dy - x * rstd^2 * mean_j(w_j dy_j x_j))   (overwrites dx)
 * dw[j] += sum_r dy[r][j] * x[r][j] * rstd[r]              (dw is F32, +=)
 * rstd from the forward. dx may alias dy. dw may be NULL (frozen weight). */
ZN_API int zn_dev_rmsnorm_bwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt,
                              const void *w, zn_dtype w_dt, const float *rstd,
                              const void *dy, zn_dtype dy_dt, void *dx, zn_dtype dx_dt,
                              float *dw, int64_t rows, int64_t dim);

/* The same norm on each of `heads` groups of head_dim in every token's row:
 * group h of token t is x[t * ldx + h * head_dim ...] (y: ldy), its rstd
 * rstd[t * heads + h], one weight w[head_dim] for all. Qwen3's and Gemma
 * 3's per-head q/k norm (heads = the projection's heads), OLMo 2's norm
 * over the whole projection (heads 1, head_dim its width); ldx and ldy
 * let q or k sit inside a fused qkv row. y may alias x (ldy == ldx). The
 * backward's dy and dx share ldd (dx may alias dy); dw sums over every
 * token and head. w_off is added to every weight (Gemma's RMSNorm scales
 * by 1 + w: w_off 1; else 0), in the forward and the backward's dx; dw is
 * the gradient of w itself. */
ZN_API int zn_dev_rmsnorm_heads_fwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt,
                                    int64_t ldx, const void *w, zn_dtype w_dt, void *y,
                                    zn_dtype y_dt, int64_t ldy, float *rstd, int64_t tokens,
                                    int64_t heads, int64_t head_dim, float eps, float w_off);
ZN_API int zn_dev_rmsnorm_heads_bwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt,
                                    int64_t ldx, const void *w, zn_dtype w_dt,
                                    const float *rstd, const void *dy, zn_dtype dy_dt, void *dx,
                                    zn_dtype dx_dt, int64_t ldd, float *dw, int64_t tokens,
                                    int64_t heads, int64_t head_dim, float w_off);

/* zn_dev_embedding_rows_fwd / _bwd with the rows scaled: out = row x scale,
 * dtable += dout x scale (Gemma's embedding times sqrt(hidden_size), in the
 * table's type as transformers casts it). */
ZN_API int zn_dev_embedding_scaled_fwd(zn_dev *d, zn_stream *s, const int32_t *ids,
                                       int64_t n_tokens, const void *table, zn_dtype table_dt,
                                       int64_t row0, int64_t rows, int64_t dim, void *out,
                                       zn_dtype out_dt, float scale);
ZN_API int zn_dev_embedding_scaled_bwd(zn_dev *d, zn_stream *s, const int32_t *ids,
                                       int64_t n_tokens, const void *dout, zn_dtype dout_dt,
                                       int64_t row0, int64_t rows, int64_t dim, float *dtable,
                                       float scale);

/* RoPE, rotate-half convention (HF Llama / Qwen2), IN PLACE on x:
 * x is [tokens][n_heads][head_dim] with rows ld elements apart (ld >=
 * n_heads*head_dim, so q or k inside a fused qkv row works). For each token
 * t, head h, i < head_dim/2, with a = (float)pos[t] * inv_freq[i] (fp32):
 *     x1 = x[i], x2 = x[i + head_dim/2]
 *     x[i]              = x1*cos(a) - x2*sin(a)
 *     x[i + head_dim/2] = x2*cos(a) + x1*sin(a)
 * pos: device int32[tokens]; inv_freq: device float[head_dim/2] (see
 * zn_rope_inv_freq, which also applies Llama-3 rope_scaling). head_dim even.
 * The backward applies the transposed rotation (angle -a) to dx in place. */
ZN_API int zn_dev_rope_fwd(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t tokens,
                           int64_t n_heads, int64_t head_dim, int64_t ld,
                           const int32_t *pos, const float *inv_freq);
ZN_API int zn_dev_rope_bwd(zn_dev *d, zn_stream *s, void *dx, zn_dtype dt, int64_t tokens,
                           int64_t n_heads, int64_t head_dim, int64_t ld,
                           const int32_t *pos, const float *inv_freq);

/* Llama-3 "rope_type": "llama3" parameters (HF config rope_scaling). */
typedef struct zn_rope_scaling {
    double factor;                 /* 8.0 for Llama 3.1 */
    double low_freq_factor;        /* 1.0 */
    double high_freq_factor;       /* 4.0 */
    double original_max_position;  /* original_max_position_embeddings, 8192 */
} zn_rope_scaling;

/* Host helper: inv_freq[i] = theta^(-2i/head_dim) for i < head_dim/2, then
 * the Llama-3 scaling when sc != NULL (HF _compute_llama3_parameters).
 * Upload the table with zn_dev_copy_h2d. */
ZN_API void zn_rope_inv_freq(float *inv_freq, int64_t head_dim, double theta,
                             const zn_rope_scaling *sc);

/* Causal softmax over attention scores S, [batch][rows][cols] contiguous;
 * row r is query position q_offset + r, column j is key position j, and its
 * valid keys are lo(r) <= j <= q_offset + r with lo(r) = key_start[r] (or 0
 * when key_start is NULL):
 *     P[b][r][j] = softmax_j(scale * S[b][r][j]) over the valid keys,
 *     P[b][r][j] = 0 elsewhere.
 * key_start: device int32[rows], shared by every batch entry, each in
 * [0, q_offset + r]: documents packed into one sequence attend only within
 * themselves (block-diagonal causal attention) when key_start[r] is the
 * first position of row r's document. fp32 math. P may alias S. (Training:
 * rows == cols, q_offset = 0.) */
ZN_API int zn_dev_softmax_causal_fwd(zn_dev *d, zn_stream *s, const void *S, zn_dtype S_dt,
                                     void *P, zn_dtype P_dt, int64_t batch, int64_t rows,
                                     int64_t cols, int64_t q_offset, const int32_t *key_start,
                                     float scale);
/* dS = scale * P * (dP - sum_j P*dP) over the valid keys (0 elsewhere). dS
 * may alias dP. */
ZN_API int zn_dev_softmax_causal_bwd(zn_dev *d, zn_stream *s, const void *P, zn_dtype P_dt,
                                     const void *dP, zn_dtype dP_dt, void *dS, zn_dtype dS_dt,
                                     int64_t batch, int64_t rows, int64_t cols,
                                     int64_t q_offset, const int32_t *key_start, float scale);

/* Fused causal attention (flash-attention style): no seq x seq matrix is
 * ever stored. `batch` sequences of `seq` tokens; row t of sequence b is
 * row b*seq + t of qkv (leading dimension ld, dtype dt): q of head h at
 * columns [h*hd, (h+1)*hd), k of kv head j at nh*hd + j*hd, v at
 * (nh + nkv)*hd + j*hd, the n_heads / n_kv_heads heads of a group sharing
 * their kv head (GQA). Query t sees keys lo(t) <= u <= t of its own
 * sequence, lo(t) = key_start[b*seq + t] (clamped to [0, t]; key_start NULL:
 * 0), as zn_dev_softmax_causal_fwd does.
 *   out[b*seq + t][h*hd + c] (leading dimension ldo) = softmax(scale q k^T) v,
 *   lse[(b*n_heads + h)*seq + t] = log sum exp of the scaled scores (fp32),
 * kept for the backward. Keys go in tiles with a running maximum and sum
 * (online softmax); the probabilities meet V rounded to dt, as a 16-bit
 * tensor-core product takes them. softcap > 0 (Gemma 2's
 * attn_logit_softcapping) makes each scaled score s softcap tanh(s /
 * softcap) before the mask and the softmax, in both directions (0: none).
 * head_dim <= 128. On CUDA: bf16 only
 * (tensor cores; f32 is refused: use the GEMM attention); on the host
 * backend f32 and bf16 (the C reference, tiles through OpenBLAS). */
ZN_API int zn_dev_flash_attn_fwd(zn_dev *d, zn_stream *s, const void *qkv, zn_dtype dt,
                                 int64_t ld, int64_t batch, int64_t seq, int64_t n_heads,
                                 int64_t n_kv_heads, int64_t head_dim, const int32_t *key_start,
                                 float scale, float softcap, void *out, int64_t ldo, float *lse);
/* Its backward: from out, dout (both leading dimension ldo) and lse of the
 * forward, writes dq, dk, dv into dqkv (qkv's layout, leading dimension
 * ldd, dtype dt; every q/k/v column of every row is written, nothing is
 * added). delta: fp32 scratch of batch x n_heads x seq (rowsum(dout*out)).
 * dk and dv sum over the heads of a group and over query tiles in fp32 and
 * are rounded once. Deterministic: each output element is summed by one
 * thread in a fixed order (no atomics). dqkv must not overlap qkv, out,
 * dout. */
ZN_API int zn_dev_flash_attn_bwd(zn_dev *d, zn_stream *s, const void *qkv, zn_dtype dt,
                                 int64_t ld, int64_t batch, int64_t seq, int64_t n_heads,
                                 int64_t n_kv_heads, int64_t head_dim, const int32_t *key_start,
                                 float scale, float softcap, const void *out, const void *dout,
                                 int64_t ldo, const float *lse, float *delta, void *dqkv,
                                 int64_t ldd);
/* The largest head_dim the fused attention takes. */
#define ZN_FLASH_MAX_HEAD_DIM 128

/* SwiGLU over n elements, all tensors of type dt: out = silu(gate) * up,
 * silu(g) = g / (1 + exp(-g)). out may alias gate or up. */
ZN_API int zn_dev_swiglu_fwd(zn_dev *d, zn_stream *s, const void *gate, const void *up,
                             void *out, zn_dtype dt, int64_t n);
/* dgate = dout * up * sig(g) * (1 + g*(1 - sig(g))), dup = dout * silu(g).
 * dgate / dup may alias gate / up (each its own input), not dout. */
ZN_API int zn_dev_swiglu_bwd(zn_dev *d, zn_stream *s, const void *gate, const void *up,
                             const void *dout, void *dgate, void *dup, zn_dtype dt,
                             int64_t n);

/* GeGLU (Gemma): out = gelu_tanh(gate) * up with transformers'
 * gelu_pytorch_tanh, gelu_tanh(g) = g/2 (1 + tanh(sqrt(2/pi) (g + 0.044715
 * g^3))); the backward as SwiGLU's with that activation's derivative. The
 * same aliasing rules. */
ZN_API int zn_dev_geglu_fwd(zn_dev *d, zn_stream *s, const void *gate, const void *up,
                            void *out, zn_dtype dt, int64_t n);
ZN_API int zn_dev_geglu_bwd(zn_dev *d, zn_stream *s, const void *gate, const void *up,
                            const void *dout, void *dgate, void *dup, zn_dtype dt, int64_t n);

/* Rows of a mixture-of-experts layer: the tokens routed to one expert
 * (idx: device int32[n], each in [0, rows)), their routing weights w
 * (device float[n]; NULL: 1), rows of dim elements.
 * gather:      y[r][:] = w[r] x[idx[r]][:]       (x [rows][dim], y [n][dim])
 * scatter_add: y[idx[r]][:] += w[r] x[r][:]      (x [n][dim], y fp32 [rows][dim];
 *              each element sums its rows in r order, no atomics)
 * dot:         out[r] = sum_c a[idx[r]][c] x[r][c] (a [rows][dim], x [n][dim], fp32
 *              sums in c order)
 * Mixed types allowed. Returns 0 or ZN_EARG. */
ZN_API int zn_dev_rows_gather(zn_dev *d, zn_stream *s, const int32_t *idx, int64_t n,
                              const float *w, const void *x, zn_dtype x_dt, int64_t rows,
                              int64_t dim, void *y, zn_dtype y_dt);
ZN_API int zn_dev_rows_scatter_add(zn_dev *d, zn_stream *s, const int32_t *idx, int64_t n,
                                   const float *w, const void *x, zn_dtype x_dt, int64_t rows,
                                   int64_t dim, float *y);
ZN_API int zn_dev_rows_dot(zn_dev *d, zn_stream *s, const int32_t *idx, int64_t n,
                           const void *a, zn_dtype a_dt, int64_t rows, const void *x,
                           zn_dtype x_dt, int64_t dim, float *out);

/* y = a + b (all of type dt; y may alias a or b). */
ZN_API int zn_dev_add(zn_dev *d, zn_stream *s, const void *a, const void *b, void *y,
                      zn_dtype dt, int64_t n);
/* y += x (mixed types allowed, e.g. an F32 accumulator += a BF16 grad). */
ZN_API int zn_dev_add_inplace(zn_dev *d, zn_stream *s, void *y, zn_dtype y_dt,
                              const void *x, zn_dtype x_dt, int64_t n);
/* x *= alpha. */
ZN_API int zn_dev_scale(zn_dev *d, zn_stream *s, void *x, zn_dtype dt, int64_t n, float alpha);
/* y += alpha * x (mixed types allowed). */
ZN_API int zn_dev_axpy(zn_dev *d, zn_stream *s, float alpha, const void *x, zn_dtype x_dt,
                       void *y, zn_dtype y_dt, int64_t n);

/* Bias (Qwen2 q/k/v projections): y[r][c] += bias[c], y is [rows][cols]
 * with rows ld elements apart (ld >= cols). */
ZN_API int zn_dev_bias_add(zn_dev *d, zn_stream *s, void *y, zn_dtype y_dt, int64_t ld,
                           const void *bias, zn_dtype bias_dt, int64_t rows, int64_t cols);
/* dbias[c] += sum_r dy[r][c] (dbias F32, +=; column sum in fixed order). */
ZN_API int zn_dev_bias_grad(zn_dev *d, zn_stream *s, const void *dy, zn_dtype dy_dt,
                            int64_t ld, float *dbias, int64_t rows, int64_t cols);

/* y[i] = x[i] converted (f32 <-> bf16, or a copy for equal types). */
ZN_API int zn_dev_cast(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, void *y,
                       zn_dtype y_dt, int64_t n);

/* Dropout by a counter-based hash (no RNG state; the same key regenerates
 * the same mask, so backward needs no stored mask). Over a [rows][cols]
 * matrix, element (r, c) has index i = r * cols + c (independent of ld):
 *     y[r][c] (+)= keep(key, i) ? x[r][c] / (1 - p) : 0
 * keep(key, i): the top 24 bits of splitmix64(key + (i + 1) * golden) are
 * >= round(p * 2^24) (src/util/hash-impl.h). 1/(1-p) is rounded to fp32
 * and multiplied in fp32. accumulate != 0 adds into y, else overwrites.
 * 0 <= p < 1; mixed types allowed; y must not overlap x. */
ZN_API int zn_dev_dropout(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, int64_t ldx,
                          void *y, zn_dtype y_dt, int64_t ldy, int64_t rows, int64_t cols,
                          double p, uint64_t key, int accumulate);

/* y[r][c] = x[r][c] converted, over a [rows][cols] matrix with rows ldx and
 * ldy elements apart (e.g. an fp32 accumulator into columns of a 16-bit
 * buffer, rounded once). y must not overlap x. */
ZN_API int zn_dev_copy_2d(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, int64_t ldx,
                          void *y, zn_dtype y_dt, int64_t ldy, int64_t rows, int64_t cols);

/* Cross-entropy over a vocabulary produced chunk by chunk (the logits of
 * the whole vocabulary never exist at once). Rows are tokens; a chunk holds
 * the logits of vocabulary columns [v0, v0 + cols), rows ld elements apart.
 * targets: device int32[rows]; a target < 0 (HF's -100) ignores the row.
 * Per-row state in device float[rows] arrays (online logsumexp):
 *     run_max: max logit so far; run_sum: sum exp(logit - run_max);
 *     tgt: the target's logit (set by the chunk that holds it).
 * first != 0 starts the state from this chunk (no need to initialise). */
ZN_API int zn_dev_xent_fwd_chunk(zn_dev *d, zn_stream *s, const void *logits, zn_dtype dt,
                                 int64_t rows, int64_t cols, int64_t ld, int64_t v0,
                                 const int32_t *targets, float *run_max, float *run_sum,
                                 float *tgt, int first);
/* After the last chunk: lse[r] = run_max + log(run_sum); loss[r] = lse - tgt
 * (0 for ignored rows). loss may be NULL. lse is what the backward needs. */
ZN_API int zn_dev_xent_finish(zn_dev *d, zn_stream *s, const float *run_max,
                              const float *run_sum, const float *tgt,
                              const int32_t *targets, int64_t rows, float *lse,
                              float *loss);
/* dlogits = grad_scale * (exp(logit - lse) - onehot(target)) for the chunk
 * (0 for ignored rows); grad_scale is typically 1/(number of target tokens).
 * softcap > 0: `logits` are the raw ones whose capped values c = softcap
 * tanh(logit / softcap) (zn_dev_softcap_fwd, scale 1) the forward took,
 * and dlogits = grad_scale (exp(c - lse) - onehot) (1 - (c / softcap)^2),
 * the gradient of the raw logits (Gemma 2's final_logit_softcapping).
 * dlogits may alias logits (same dtype and ld). */
ZN_API int zn_dev_xent_bwd_chunk(zn_dev *d, zn_stream *s, const void *logits, zn_dtype dt,
                                 int64_t rows, int64_t cols, int64_t ld, int64_t v0,
                                 const int32_t *targets, const float *lse, float grad_scale,
                                 float softcap, void *dlogits, zn_dtype dlogits_dt, int64_t ld_d);

/* Soft-capping (Gemma 2's attention scores and final logits), elementwise
 * over n: y = cap tanh(scale x / cap) (scale x / cap rounded to fp32 as
 * transformers' (x * scale) / cap is), fp32 math, y may alias x (same
 * dtype). The backward takes the forward's y and its gradient dy: dx =
 * scale dy (1 - (y / cap)^2); dx may alias dy (same dtype). cap > 0. */
ZN_API int zn_dev_softcap_fwd(zn_dev *d, zn_stream *s, const void *x, zn_dtype x_dt, void *y,
                              zn_dtype y_dt, int64_t n, float scale, float cap);
ZN_API int zn_dev_softcap_bwd(zn_dev *d, zn_stream *s, const void *y, zn_dtype y_dt,
                              const void *dy, zn_dtype dy_dt, void *dx, zn_dtype dx_dt, int64_t n,
                              float scale, float cap);

/* Reductions into one device float: *out = sum x[i]^2 (sumsq) or sum x[i]
 * (sum); with accumulate != 0, *out += instead (e.g. a grad norm over many
 * tensors, or a loss over several micro-batches). Deterministic order. */
ZN_API int zn_dev_sumsq(zn_dev *d, zn_stream *s, const void *x, zn_dtype dt, int64_t n,
                        float *out, int accumulate);
ZN_API int zn_dev_sum(zn_dev *d, zn_stream *s, const void *x, zn_dtype dt, int64_t n,
                      float *out, int accumulate);

/* ---- the optimizer on the device ------------------------------------------
 * One Adam/AdamW step over device arrays, zn_adam_step's contract: p, m, v
 * (fp32) updated in place from g (fp32) times g_scale; c (optional, NULL)
 * receives the new p in bf16. Same formula and rounding as the CPU's FMA
 * paths (AVX2, AVX-512): with the same inputs the bits are the CPU's.
 * hp->threads matters to the host backend only. */
ZN_API int zn_dev_adam(zn_dev *d, zn_stream *s, const zn_adam_params *hp, float *p, float *m,
                       float *v, const float *g, float g_scale, void *c, zn_dtype c_dt,
                       int64_t n);

/* zn_dev_adam with the moments in fewer bytes (zn_adam_step_mom's
 * contract and bits): mv's m, v and (8-bit) absmax arrays are device
 * memory laid out as zn_moments says; p, g fp32; c (optional) the bf16
 * copy. For 8-bit moments each ZN_Q8_BLOCK elements are one block (its
 * scale found over the block, so the elements start on a block boundary).
 * Returns as zn_dev_adam; -EINVAL for what zn_adam_step_mom refuses. */
ZN_API int zn_dev_adam_mom(zn_dev *d, zn_stream *s, const zn_adam_params *hp, float *p,
                           const zn_moments *mv, const float *g, float g_scale, void *c,
                           zn_dtype c_dt, int64_t n);

/* zn_adam_step_sr_spans on the device (train.master_weights bf16_sr with
 * the optimizer there): p is the bf16 master, stepped in place and rounded
 * with the random bits of (seed, hp->step, each element's index: spans[0,
 * n_spans), device memory, tiling [0, n) in order; the host backend checks
 * that, a GPU trusts it), the CPU's bits; mv any moment format, laid out
 * as zn_dev_adam_mom's; g fp32. Returns as zn_dev_adam_mom. */
ZN_API int zn_dev_adam_sr(zn_dev *d, zn_stream *s, const zn_adam_params *hp, uint16_t *p,
                          const zn_moments *mv, const float *g, float g_scale, uint64_t seed,
                          const zn_sr_span *spans, int64_t n_spans, int64_t n);

/* Sums of squares of x[0, n) by chunks of ZN_GRAD_NORM_CHUNK elements into
 * out[0, ceil(n / chunk)) (device doubles), each in zn_grad_norm_sq's order:
 * zn_grad_norm_combine of them is zn_grad_norm_sq of x, to the bit. */
ZN_API int zn_dev_norm_sq_chunks(zn_dev *d, zn_stream *s, const float *x, int64_t n,
                                 double *out);

#ifdef __cplusplus
}
#endif
#endif
