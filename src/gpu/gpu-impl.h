/* Private side of the device layer: the backend vtable (ggml-backend style),
 * the operation descriptors that streams carry, the arena allocator and the
 * helpers shared by the host and CUDA backends. */
#ifndef ZN_GPU_IMPL_H
#define ZN_GPU_IMPL_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "util/try-impl.h"
#include "zinc/device.h"
#include "zn_build_config.h"

#ifdef __cplusplus
extern "C" {
#endif


/* ---- the arena: best fit over an address-ordered block list -------------*/
typedef struct zn_arena_blk zn_arena_blk;
typedef struct zn_arena {
    uintptr_t base;
    uint64_t size;
    uint64_t used, peak, n_live;
    zn_arena_blk *head;       /* all blocks by address */
    zn_arena_blk *free_list;  /* free blocks, unordered */
    zn_arena_blk **buckets;   /* live blocks by address (chained hash) */
    size_t n_buckets;
} zn_arena;

int zn_arena_init(zn_arena *a, void *base, uint64_t size);
void zn_arena_fini(zn_arena *a);
/* Returns the offset-aligned block or NULL (no block large enough). */
void *zn_arena_alloc(zn_arena *a, uint64_t bytes);
/* Returns the size of the freed block, or 0 if p is not a live block. */
uint64_t zn_arena_free(zn_arena *a, void *p);
uint64_t zn_arena_largest_free(const zn_arena *a);
/* Number of blocks in the list and free blocks (tests check coalescing). */
void zn_arena_counts(const zn_arena *a, size_t *blocks, size_t *free_blocks);

/* ---- operations carried by streams ------------------------------------*/
typedef enum {
    ZN_OPK_COPY = 1,
    ZN_OPK_MEMSET,
    ZN_OPK_FILL,
    ZN_OPK_HOST_FN,
    ZN_OPK_GEMM,
    ZN_OPK_EMB_FWD,
    ZN_OPK_EMB_BWD,
    ZN_OPK_RMS_FWD,
    ZN_OPK_RMS_BWD,
    ZN_OPK_ROPE,
    ZN_OPK_SOFTMAX_FWD,
    ZN_OPK_SOFTMAX_BWD,
    ZN_OPK_SWIGLU_FWD,
    ZN_OPK_SWIGLU_BWD,
    ZN_OPK_ADD,
    ZN_OPK_AXPY,
    ZN_OPK_SCALE,
    ZN_OPK_BIAS_ADD,
    ZN_OPK_BIAS_GRAD,
    ZN_OPK_CAST,
    ZN_OPK_XENT_FWD,
    ZN_OPK_XENT_FINISH,
    ZN_OPK_XENT_BWD,
    ZN_OPK_REDUCE,
    ZN_OPK_DROPOUT,
    ZN_OPK_ADAM,
    ZN_OPK_ADAM_MOM,
    ZN_OPK_ADAM_SR,
    ZN_OPK_NORM_CHUNKS,
    ZN_OPK_FLASH_FWD,
    ZN_OPK_FLASH_BWD,
    ZN_OPK_SOFTCAP_FWD,
    ZN_OPK_SOFTCAP_BWD,
    ZN_OPK_ROWS,           /* mixture of experts: gather, weighted scatter-add, row dots */
    /* host backend only: stream bookkeeping */
    ZN_OPK_WAIT_VALUE,     /* the stream waits until a 32-bit flag reaches a value */
    ZN_OPK_STREAM_FN,      /* host backend: a function run on the stream's worker */
    ZN_OPK_EV_RECORD,
    ZN_OPK_EV_WAIT,
} zn_op_kind;

typedef enum { ZN_COPY_H2D = 0, ZN_COPY_D2H, ZN_COPY_D2D } zn_copy_dir;

typedef struct zn_op {
    zn_op_kind kind;
    union {
        struct { void *dst; const void *src; size_t bytes; zn_copy_dir dir; } copy;
        struct { void *dst; int value; size_t bytes; } memset;
        struct { void *x; zn_dtype dt; int64_t n; float value; } fill;
        struct { void (*fn)(void *); void *arg; } host_fn;
        struct { const uint32_t *flag; uint32_t value; } wait;
        struct {
            zn_trans ta, tb;
            int64_t m, n, k, lda, ldb, ldc, sa, sb, sc, batch;
            float alpha, beta;
            const void *A, *B; void *C;
            zn_dtype adt, bdt, cdt;
        } gemm;
        struct {
            const int32_t *ids; int64_t n_tokens, vocab, dim;
            int64_t row0; int skip;  /* rows [row0, row0 + vocab); skip: leave other rows */
            const void *table; zn_dtype table_dt; void *out; zn_dtype out_dt;
            const void *dout; zn_dtype dout_dt; float *dtable;
            float scale;   /* out = table row x scale; dtable += dout x scale */
        } emb;
        struct {
            const void *x; zn_dtype x_dt; const void *w; zn_dtype w_dt;
            void *y; zn_dtype y_dt; float *rstd; int64_t rows, dim; float eps;
            /* each of the rows holds `heads` groups of dim (heads >= 1), group
             * h of row r at r * ldx + h * dim in x (ldy in y); rstd has
             * rows * heads entries, group (r, h) at r * heads + h */
            int64_t heads, ldx, ldy;
            float w_off;   /* y = (w + w_off) x rstd: 0, or Gemma's 1 */
        } rms_fwd;
        struct {
            const void *x; zn_dtype x_dt; const void *w; zn_dtype w_dt;
            const float *rstd; const void *dy; zn_dtype dy_dt; void *dx; zn_dtype dx_dt;
            float *dw; int64_t rows, dim;
            int64_t heads, ldx, ldd; /* as rms_fwd's; ldd: dy's and dx's */
            float w_off;
        } rms_bwd;
        struct {
            void *x; zn_dtype dt; int64_t tokens, n_heads, head_dim, ld;
            const int32_t *pos; const float *inv_freq; int inverse;
        } rope;
        struct {
            const void *S; zn_dtype S_dt; void *P; zn_dtype P_dt;
            const void *dP; zn_dtype dP_dt; const void *Pin; zn_dtype Pin_dt;
            int64_t batch, rows, cols, q_offset; const int32_t *key_start; float scale;
        } softmax;
        struct {
            const void *gate, *up, *dout; void *out, *dgate, *dup;
            zn_dtype dt; int64_t n;
            int act;   /* the gate's activation: 0 silu (SwiGLU), 1 tanh GELU (GeGLU) */
        } swiglu;
        struct {   /* add: y = a + b; axpy: y += alpha x; scale: x *= alpha */
            const void *a, *b; void *y; zn_dtype a_dt, y_dt; int64_t n; float alpha;
        } ew;
        struct {
            void *y; const void *dy; zn_dtype y_dt; int64_t ld;
            const void *bias; zn_dtype bias_dt; float *dbias; int64_t rows, cols;
        } bias;
        struct { const void *x; zn_dtype x_dt; void *y; zn_dtype y_dt; int64_t n; } cast;
        struct {   /* forward: y = cap tanh(scale x / cap); backward: x is the
                    * forward's y, y = scale dy (1 - (x / cap)^2) */
            const void *x; zn_dtype x_dt; const void *dy; zn_dtype dy_dt;
            void *y; zn_dtype y_dt; int64_t n; float scale, cap;
        } softcap;
        struct {   /* mode 0 gather: y[r] = w[r] x[idx[r]]; 1 scatter: y32[idx[r]] +=
                    * w[r] x[r]; 2 dot: out[r] = sum_c a[idx[r]][c] x[r][c] (w NULL: 1) */
            int mode; const int32_t *idx; int64_t n, dim, rows; const float *w;
            const void *x; zn_dtype x_dt; void *y; zn_dtype y_dt; float *y32;
            const void *a; zn_dtype a_dt; float *out;
        } rows;
        struct {
            const void *logits; zn_dtype dt; int64_t rows, cols, ld, v0;
            const int32_t *targets; float *run_max, *run_sum, *tgt; int first;
            const float *lse; float *lse_out, *loss; float grad_scale;
            const float *cmax, *csum, *ctgt;
            void *dlogits; zn_dtype d_dt; int64_t ld_d;
            float softcap;  /* backward: the logits capped (0: not) */
        } xent;
        struct { const void *x; zn_dtype dt; int64_t n; float *out; int accumulate, square; } reduce;
        struct {
            const void *x; zn_dtype x_dt; void *y; zn_dtype y_dt; int64_t ldx, ldy, rows, cols;
            uint64_t key; uint32_t thresh; float scale; int accumulate;
        } drop;
        struct {
            float *p, *m, *v; const float *g; void *c; zn_dtype c_dt; int64_t n;
            zn_adam_params hp; float g_scale;        /* the host runs zn_adam_step */
            /* zn_adam_prepare's constants, for the CUDA kernel */
            float b1, omb1, b2, omb2, step, eps, l2, decay; int use_l2, use_decay;
            zn_moments mv;   /* ZN_OPK_ADAM_MOM, _SR: the moments (m, v unused) */
            /* ZN_OPK_ADAM_SR: the bf16 master (p unused), the draw's seed
             * and the elements' indices (device memory) */
            uint16_t *p16; uint64_t sr_seed; const zn_sr_span *sr_spans; int64_t sr_nspans;
        } adam;
        struct { const float *x; int64_t n; double *out; } normc;
        struct {
            const void *qkv; zn_dtype dt; int64_t ld, batch, seq, nh, nkv, hd;
            const int32_t *key_start; float scale;
            float softcap;  /* the scaled scores capped (0: not) */
            void *out; const void *dout; int64_t ldo; float *lse, *delta;
            void *dqkv; int64_t ldd;
        } flash;
        struct { void *ev; uint64_t gen; } ev;
    } u;
} zn_op;

/* ---- the vtable ---------------------------------------------------------
 * Common code (device.c) checks arguments, keeps the arena and the pinned
 * accounting, and builds zn_op descriptors; a backend moves bytes and runs
 * ops. Stream/event objects are common with a backend `impl`. */
typedef struct zn_dev_ops {
    const char *name;
    void (*destroy)(zn_dev *d);                    /* backend part only */
    void (*arena_release)(zn_dev *d, void *base, uint64_t bytes);
    int (*host_alloc)(zn_dev *d, size_t bytes, void **out, int *locked);
    void (*host_free)(zn_dev *d, void *p, size_t bytes);
    int (*host_register)(zn_dev *d, void *p, size_t bytes, int *locked);
    void (*host_unregister)(zn_dev *d, void *p, size_t bytes);
    int (*stream_create)(zn_dev *d, zn_stream *s);
    void (*stream_destroy)(zn_dev *d, zn_stream *s);   /* drains first */
    int (*stream_sync)(zn_dev *d, zn_stream *s);
    int (*event_create)(zn_dev *d, zn_event *e);
    void (*event_destroy)(zn_dev *d, zn_event *e);
    int (*event_record)(zn_dev *d, zn_event *e, zn_stream *s);
    int (*stream_wait_event)(zn_dev *d, zn_stream *s, zn_event *e);
    int (*event_sync)(zn_dev *d, zn_event *e);
    int (*event_query)(zn_dev *d, zn_event *e);
    int (*event_elapsed_ms)(zn_dev *d, zn_event *a, zn_event *b, float *ms);
    int (*submit)(zn_dev *d, zn_stream *s, const zn_op *op);
    /* fills d->arena_base/_bytes with `bytes` (0 = auto) of device memory */
    int (*arena_reserve)(zn_dev *d, uint64_t bytes);
} zn_dev_ops;

struct zn_stream {
    zn_dev *dev;
    zn_stream *next;          /* device's list, under dev->lock */
    char name[48];
    void *impl;
    int copy_only;            /* zn_dev_stream_create_copy: no GEMM, no cuBLAS */
};

struct zn_event {
    zn_dev *dev;
    void *impl;
    int timed;      /* records completion times (zn_dev_event_create_timed) */
};

typedef struct zn_host_buf {
    void *p;
    size_t bytes;
    int registered;           /* from zn_dev_host_register */
    char what[40];
} zn_host_buf;

struct zn_dev {
    const zn_dev_ops *ops;
    zn_dev_config cfg;
    zn_dev_info info;
    pthread_mutex_t lock;     /* arena, host buffers, stream list */
    zn_arena arena;
    void *arena_base;
    uint64_t arena_bytes;
    uint64_t outside_arena;   /* zn_dev_outside_arena, set at reserve */
    zn_host_buf *host_bufs;
    size_t n_host_bufs, cap_host_bufs;
    uint64_t host_used, host_peak;
    int host_locked;
    void *topo;               /* hwloc_topology_t */
    zn_stream *streams;
    zn_stream *default_stream;
    void *impl;               /* backend */
};

/* Backends. Each fills d->ops, d->info, d->impl; the arena comes from
 * ops->arena_reserve (at creation, or later with defer_arena). */
int zn_host_backend_create(zn_dev *d);
#if defined(ZN_HAVE_CUDA) && ZN_HAVE_CUDA
int zn_cuda_backend_create(zn_dev *d, int ordinal);
#endif

/* The host backend's device guard (host.c, ZINC_DEVICE_GUARD=1): whether it
 * is on, and opening (1) or closing (0) the arena to the calling thread. A
 * thread that stands in for a device engine (the host collectives' worker)
 * opens it; no-ops when the guard is off. */
int zn_host_guard_on(void);
void zn_host_guard_allow(int allow);

/* Set on the thread that runs a host function, while it runs (both
 * backends): zn_dev_in_host_fn. */
extern __thread int zn_tls_in_host_fn;   /* __thread: C and the C++ of nvcc */

/* Pinned host memory on the host backend and the NUMA binding both use. */
int zn_gpu_numa_alloc(zn_dev *d, size_t bytes, void **out);
void zn_gpu_numa_free(zn_dev *d, void *p, size_t bytes);

/* The plain C reference of every op except copies, host functions and
 * events: runs `op` synchronously on the calling thread. GEMM uses OpenBLAS;
 * bf16 GEMM converts tiles into `*scratch` (grown with realloc, owned by the
 * caller, freed with free()). Returns 0 or -ENOMEM. */
int zn_host_run_op(const zn_op *op, float **scratch, size_t *scratch_len);

/* PCIe link of a PCI device from sysfs ("0000:17:00.0"): generation, width
 * and one-direction peak GB/s. Returns 0 or -errno. */
int zn_gpu_pcie_link(const char *bus_id, int *gen, int *width, double *peak_gbs);
/* sysfs numa_node of a PCI device, -1 if unknown. */
int zn_gpu_pci_numa_node(const char *bus_id);

/* Per CUDA stream, outside the arena: the reduction scratch (floats, see
 * zn_cuda_run_kernel) and the cuBLAS workspace it sets (cublasSetWorkspace)
 * when it is made, so that cuBLAS never allocates one lazily at the first
 * GEMM, after the arena has taken the memory: NVIDIA's recommended sizes,
 * 32 MiB on Hopper and newer, 4 MiB before (cc_major 0: unknown, the
 * larger). */
#define ZN_CUDA_SCRATCH (1u << 20)
#define ZN_CUBLAS_WORKSPACE(cc_major) ((cc_major) >= 9 || (cc_major) == 0 ? (32u << 20) : (4u << 20))
/* What cublasCreate itself takes per handle, beside the workspace set
 * after it: measured 64 MiB for each of a run's five handles on an H200
 * (cuBLAS of CUDA 13.0, driver 580; gpu-check 2026-11-28), where the plan
 * had counted only workspace and scratch and the run held 502 MiB outside
 * the arena against 180 planned. Not yet measured before Hopper: the same
 * figure is counted there, an upper bound if the handle scales with the
 * workspace (ZINC_LOG=debug prints each handle's share). A copy stream
 * (zn_dev_stream_create_copy) has neither, only its scratch. */
#define ZN_CUBLAS_HANDLE_BYTES(cc_major) ((void)(cc_major), (64u << 20))

#if defined(ZN_HAVE_CUDA) && ZN_HAVE_CUDA
/* The ceiling for `zinc bench pcie`: a plain cudaMemcpyAsync loop on one
 * stream, `block` bytes per copy, `iters` copies, between a cudaHostAlloc
 * buffer and a cudaMalloc buffer outside the arena. dir 0 = H2D, 1 = D2H.
 * Returns 0 and GB/s in *gbs, or ZN_ECUDA. */
int zn_cuda_plain_copy_gbs(zn_dev *d, int dir, size_t block, int iters, double *gbs);

/* The cudaStream_t behind a zinc stream of a CUDA device (for NCCL, which
 * enqueues on it); NULL for other streams. */
void *zn_cuda_stream_native(zn_stream *s);

/* cuda_kernels.cu (with cuda_nn.cu and cuda_flash.cu): launches the
 * kernel(s) of `op` (any kind that zn_host_run_op handles except GEMM) on
 * `stream` (a cudaStream_t).
 * `scratch` is a per-stream device buffer of ZN_CUDA_SCRATCH floats for the
 * two-phase deterministic reductions. Returns a cudaError_t (0 = launched);
 * *what names the kernel that failed. */
int zn_cuda_run_kernel(const zn_op *op, void *stream, float *scratch, const char **what);
#endif

#ifdef __cplusplus
}
#endif

/* ---- what the device files share (device*.c) -------------------------- */

static inline int dt_ok(zn_dtype dt)
{
    return dt == ZN_DTYPE_F32 || dt == ZN_DTYPE_BF16;
}

static inline zn_stream *pick(zn_dev *d, zn_stream *s)
{
    return s ? s : d->default_stream;
}

/* ---- the op builders' checks (device_ops.c, device_nn.c) ---------------
 * Every zn_dev_* op builder has one shape: its dtypes (CHK_DTYPES) and
 * sizes (CHK), a return when there is nothing to do, the zn_op filled in,
 * then submit_checked with its device pointers and the bytes the op
 * touches from each, as a list (DEV_PTRS). The list is checked in order,
 * so the message names the first bad pointer by its parameter's name. A
 * builder with a check that needs valid pointers first (aliasing, overlap)
 * calls check_ptrs, then that check, then submit. The forward and backward
 * of one op (SwiGLU, RoPE, softmax, the fused attention) share one such
 * function, the public builders only filling in the zn_op or its
 * arguments. */

/* Device pointers must lie in the arena: a host pointer handed to a kernel
 * is caught here on both backends instead of faulting on the GPU. */
static inline int in_arena(zn_dev *d, const void *p, uint64_t bytes)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)d->arena_base;
    return p && a >= b && bytes <= d->arena_bytes && a - b <= d->arena_bytes - bytes;
}

/* One device pointer of an op: checked (when `used`) to lie inside the
 * arena over `bytes`. */
typedef struct zn_dev_arg {
    const char *name;          /* the builder's parameter, for the message */
    const void *p;
    uint64_t bytes;
    int used;                  /* 0: this call of the op leaves it alone */
} zn_dev_arg;

#define DEV_PTR(p, bytes) { #p, (p), (bytes), 1 }
/* Checked only when `cond` holds (a copy's device side, the backward's
 * extra inputs). */
#define DEV_PTR_IF(cond, p, bytes) { #p, (p), (bytes), (cond) != 0 }
/* An optional pointer: NULL means the op does without it. */
#define DEV_PTR_OPT(p, bytes) DEV_PTR_IF((p) != NULL, p, bytes)

/* A list of values as the (array, count) pair of the functions below. */
#define ZN_LIST(type, ...)                                                     \
    (const type[]){ __VA_ARGS__ }, sizeof((const type[]){ __VA_ARGS__ }) / sizeof(type)
#define DEV_PTRS(...) ZN_LIST(zn_dev_arg, __VA_ARGS__)

#define CHK(cond, ...)                                                         \
    do {                                                                       \
        if (!(cond))                                                           \
            return zn_set_error(ZN_EARG, __VA_ARGS__);                         \
    } while (0)

static inline int check_dtypes(const char *fn, const zn_dtype *dts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!dt_ok(dts[i]))
            return zn_set_error(ZN_EUNSUPPORTED, "%s: dtype %s (%d) not supported "
                                "(f32 and bf16 only)", fn, zn_dtype_name(dts[i]), (int)dts[i]);
    return 0;
}

/* Returns from the builder unless every dtype is one the kernels take. */
#define CHK_DTYPES(fn, ...) ZN_TRY(check_dtypes(fn, ZN_LIST(zn_dtype, __VA_ARGS__)))

/* The size check of the ops over n elements. */
static inline int check_count(const char *fn, int64_t n)
{
    CHK(n >= 0, "%s: n = %lld", fn, (long long)n);
    return 0;
}

static inline int check_ptrs(zn_dev *d, const char *fn, const zn_dev_arg *args, size_t n)
{
    for (const zn_dev_arg *a = args; a < args + n; a++)
        if (a->used && !in_arena(d, a->p, a->bytes))
            return zn_set_error(ZN_EARG, "%s: %s (%p, %llu bytes) is not inside the device "
                                "arena", fn, a->name, a->p, (unsigned long long)a->bytes);
    return 0;
}

/* Bytes spanned by a rows x cols matrix with leading dimension ld. */
static inline uint64_t span(int64_t rows, int64_t cols, int64_t ld, zn_dtype dt)
{
    if (rows <= 0 || cols <= 0)
        return 0;
    return ((uint64_t)(rows - 1) * (uint64_t)ld + (uint64_t)cols) * zn_dtype_size(dt);
}

static inline uint64_t nbytes(int64_t n, zn_dtype dt)
{
    return n > 0 ? (uint64_t)n * zn_dtype_size(dt) : 0;
}

static inline int submit(zn_dev *d, zn_stream *s, const zn_op *op)
{
    return d->ops->submit(d, pick(d, s), op);
}

/* check_ptrs, then submit: the last line of most op builders. */
static inline int submit_checked(zn_dev *d, zn_stream *s, const char *fn, const zn_op *op,
                                 const zn_dev_arg *args, size_t n)
{
    int rc = check_ptrs(d, fn, args, n);
    return rc ? rc : submit(d, s, op);
}

#endif
