/* The CUDA backend: cudart streams and events, one cudaMalloc arena capped
 * at the GPU budget, pinned memory bound to the GPU's NUMA node, cuBLAS
 * GemmEx (fp32 compute) for GEMM and the kernels of cuda_*.cu. Every
 * CUDA and cuBLAS call goes through ZN_CUDA_TRY / ZN_CUBLAS_TRY, which
 * record the call, file:line and the library's error text. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda.h>              /* driver types only: entry points come through cudart */
#include <cuda_runtime.h>

#include "gpu/gpu-impl.h"

/* A failed runtime call also leaves its error as the thread's "last error",
 * which the next kernel launch's cudaGetLastError would report as its own
 * (seen on an H200: an expected cudaEventElapsedTime refusal came back as
 * k_fill's failure). Reported here once, it is cleared; a sticky error (a
 * broken context) stays and every later call reports it anyway. */
static int cuda_fail(cudaError_t e, const char *call, const char *file, int line)
{
    (void)cudaGetLastError();
    return zn_set_error(ZN_ECUDA, "%s failed at %s:%d: %s (%s)", call, file, line,
                        cudaGetErrorString(e), cudaGetErrorName(e));
}

static int cublas_fail(cublasStatus_t s, const char *call, const char *file, int line)
{
    return zn_set_error(ZN_ECUBLAS, "%s failed at %s:%d: %s (%s)", call, file, line,
                        cublasGetStatusString(s), cublasGetStatusName(s));
}

/* Return on failure (functions without cleanup). */
#define ZN_CUDA_TRY(call)                                                        \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        if (e_ != cudaSuccess)                                                   \
            return cuda_fail(e_, #call, __FILE__, __LINE__);                     \
    } while (0)

#define ZN_CUBLAS_TRY(call)                                                      \
    do {                                                                         \
        cublasStatus_t s_ = (call);                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                         \
            return cublas_fail(s_, #call, __FILE__, __LINE__);                   \
    } while (0)

/* Set rc and jump to `fail` (functions with cleanup). */
#define ZN_CUDA_TRY_GOTO(call)                                                   \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        if (e_ != cudaSuccess) {                                                 \
            rc = cuda_fail(e_, #call, __FILE__, __LINE__);                       \
            goto fail;                                                           \
        }                                                                        \
    } while (0)

#define ZN_CUBLAS_TRY_GOTO(call)                                                 \
    do {                                                                         \
        cublasStatus_t s_ = (call);                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                       \
            rc = cublas_fail(s_, #call, __FILE__, __LINE__);                     \
            goto fail;                                                           \
        }                                                                        \
    } while (0)

/* Log-and-continue for teardown paths that have no one to report to. */
#define ZN_CUDA_WARN(call)                                                       \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        if (e_ != cudaSuccess)                                                   \
            zn_warn("%s failed at %s:%d: %s", #call, __FILE__, __LINE__,         \
                    cudaGetErrorString(e_));                                     \
    } while (0)

/* A host function and its argument, run by host_tramp_run on CUDA's
 * callback thread. */
typedef struct {
    void (*fn)(void *);
    void *arg;
} host_tramp;

static void CUDART_CB host_tramp_run(void *p)
{
    host_tramp t = *(host_tramp *)p;
    free(p);
    zn_tls_in_host_fn = 1;
    t.fn(t.arg);
    zn_tls_in_host_fn = 0;
}

typedef struct cdev {
    int ordinal;
    int bound_host;        /* pinned memory = hwloc-bound pages + cudaHostRegister */
} cdev;

typedef struct cstream {
    cudaStream_t st;
    cublasHandle_t blas;
    float *scratch;        /* ZN_CUDA_SCRATCH floats, outside the arena */
    void *blas_ws;         /* its cuBLAS workspace, outside the arena */
} cstream;

void *zn_cuda_stream_native(zn_stream *s)
{
    if (!s || !s->impl || zn_dev_get_kind(s->dev) != ZN_DEV_CUDA)
        return NULL;
    return ((cstream *)s->impl)->st;
}

/* The runtime's current device is per thread: set it on whichever thread
 * calls in (cheap when it is already current). */
static int use(zn_dev *d)
{
    cdev *c = d->impl;
    int cur = -1;
    ZN_CUDA_TRY(cudaGetDevice(&cur));
    if (cur != c->ordinal)
        ZN_CUDA_TRY(cudaSetDevice(c->ordinal));
    return 0;
}

/* ---- memory ---------------------------------------------------------------*/
static void c_arena_release(zn_dev *d, void *base, uint64_t bytes)
{
    if (use(d) == 0)
        ZN_CUDA_WARN(cudaFree(base));
}

static int c_host_alloc(zn_dev *d, size_t bytes, void **out, int *locked)
{
    cdev *c = d->impl;
    int rc;
    *locked = 1;
    if ((rc = use(d)))
        return rc;
    if (c->bound_host) {
        void *p;
        if ((rc = zn_gpu_numa_alloc(d, bytes, &p)))
            return rc;
        cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
        if (e != cudaSuccess) {
            zn_gpu_numa_free(d, p, bytes);
            return cuda_fail(e, "cudaHostRegister(p, bytes, cudaHostRegisterDefault)",
                             __FILE__, __LINE__);
        }
        *out = p;
        return 0;
    }
    ZN_CUDA_TRY(cudaHostAlloc(out, bytes, cudaHostAllocDefault));
    return 0;
}

static void c_host_free(zn_dev *d, void *p, size_t bytes)
{
    cdev *c = d->impl;
    if (use(d))
        return;
    if (c->bound_host) {
        ZN_CUDA_WARN(cudaHostUnregister(p));
        zn_gpu_numa_free(d, p, bytes);
    } else {
        ZN_CUDA_WARN(cudaFreeHost(p));
    }
}

static int c_host_register(zn_dev *d, void *p, size_t bytes, int *locked)
{
    int rc;
    *locked = 1;
    if ((rc = use(d)))
        return rc;
    ZN_CUDA_TRY(cudaHostRegister(p, bytes, cudaHostRegisterDefault));
    return 0;
}

static void c_host_unregister(zn_dev *d, void *p, size_t bytes)
{
    if (use(d) == 0)
        ZN_CUDA_WARN(cudaHostUnregister(p));
}

/* ---- streams and events ------------------------------------------------*/
static int c_stream_create(zn_dev *d, zn_stream *s)
{
    int rc;
    cstream *cs = calloc(1, sizeof *cs);
    if (!cs)
        return zn_set_error(-ENOMEM, "cuda stream: out of memory");
    if ((rc = use(d)))
        goto fail;
    ZN_CUDA_TRY_GOTO(cudaStreamCreateWithFlags(&cs->st, cudaStreamNonBlocking));
    ZN_CUDA_TRY_GOTO(cudaMalloc((void **)&cs->scratch, ZN_CUDA_SCRATCH * sizeof(float)));
    if (s->copy_only) {   /* no GEMM will run here: no cuBLAS */
        s->impl = cs;
        return 0;
    }
    size_t f0 = 0, f1 = 0, tot = 0;
    ZN_CUDA_TRY_GOTO(cudaMemGetInfo(&f0, &tot));
    ZN_CUBLAS_TRY_GOTO(cublasCreate(&cs->blas));
    ZN_CUDA_TRY_GOTO(cudaMemGetInfo(&f1, &tot));
    /* what the handle itself took (its modules on the first one), beside
     * the workspace and scratch below that the plan counts per stream */
    zn_debug("cuda:%d stream '%s': cublasCreate took %llu KiB of device memory",
             d->info.ordinal, s->name, (unsigned long long)(f0 > f1 ? (f0 - f1) >> 10 : 0));
    ZN_CUBLAS_TRY_GOTO(cublasSetStream(cs->blas, cs->st));
    /* Plain fp32 (no TF32) unless a compute type asks otherwise. */
    ZN_CUBLAS_TRY_GOTO(cublasSetMathMode(cs->blas, CUBLAS_DEFAULT_MATH));
    /* the workspace now, not lazily inside the first GEMM when the arena
     * may have taken the memory */
    size_t ws = ZN_CUBLAS_WORKSPACE(d->info.cc_major);
    ZN_CUDA_TRY_GOTO(cudaMalloc(&cs->blas_ws, ws));
    ZN_CUBLAS_TRY_GOTO(cublasSetWorkspace(cs->blas, cs->blas_ws, ws));
    s->impl = cs;
    return 0;

fail:
    if (cs->blas_ws)
        ZN_CUDA_WARN(cudaFree(cs->blas_ws));
    if (cs->scratch)
        ZN_CUDA_WARN(cudaFree(cs->scratch));
    if (cs->blas && cublasDestroy(cs->blas) != CUBLAS_STATUS_SUCCESS)
        zn_warn("cublasDestroy failed while cleaning up a stream");
    if (cs->st)
        ZN_CUDA_WARN(cudaStreamDestroy(cs->st));
    free(cs);
    return rc;
}

static void c_stream_destroy(zn_dev *d, zn_stream *s)
{
    cstream *cs = s->impl;
    if (!cs)
        return;
    if (use(d) == 0) {
        ZN_CUDA_WARN(cudaStreamSynchronize(cs->st));
        if (cs->blas) {
            cublasStatus_t st = cublasDestroy(cs->blas);
            if (st != CUBLAS_STATUS_SUCCESS)
                zn_warn("cublasDestroy: %s", cublasGetStatusString(st));
        }
        if (cs->scratch)
            ZN_CUDA_WARN(cudaFree(cs->scratch));
        if (cs->blas_ws)
            ZN_CUDA_WARN(cudaFree(cs->blas_ws));
        ZN_CUDA_WARN(cudaStreamDestroy(cs->st));
    }
    free(cs);
    s->impl = NULL;
}

static int c_stream_sync(zn_dev *d, zn_stream *s)
{
    cstream *cs = s->impl;
    int rc;
    if ((rc = use(d)))
        return rc;
    ZN_CUDA_TRY(cudaStreamSynchronize(cs->st));
    return 0;
}

static int c_event_create(zn_dev *d, zn_event *e)
{
    int rc;
    cudaEvent_t ev;
    if ((rc = use(d)))
        return rc;
    /* a host thread waiting on it sleeps instead of spinning a core the CPU
     * Adam needs; only the events asked to keep time take timestamps */
    unsigned flags = cudaEventBlockingSync | (e->timed ? 0u : cudaEventDisableTiming);
    ZN_CUDA_TRY(cudaEventCreateWithFlags(&ev, flags));
    e->impl = ev;
    return 0;
}

static void c_event_destroy(zn_dev *d, zn_event *e)
{
    if (e->impl && use(d) == 0)
        ZN_CUDA_WARN(cudaEventDestroy((cudaEvent_t)e->impl));
    e->impl = NULL;
}

static int c_event_record(zn_dev *d, zn_event *e, zn_stream *s)
{
    int rc;
    if ((rc = use(d)))
        return rc;
    ZN_CUDA_TRY(cudaEventRecord((cudaEvent_t)e->impl, ((cstream *)s->impl)->st));
    return 0;
}

static int c_stream_wait_event(zn_dev *d, zn_stream *s, zn_event *e)
{
    int rc;
    if ((rc = use(d)))
        return rc;
    ZN_CUDA_TRY(cudaStreamWaitEvent(((cstream *)s->impl)->st, (cudaEvent_t)e->impl, 0));
    return 0;
}

static int c_event_sync(zn_dev *d, zn_event *e)
{
    int rc;
    if ((rc = use(d)))
        return rc;
    ZN_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)e->impl));
    return 0;
}

static int c_event_query(zn_dev *d, zn_event *e)
{
    int rc;
    if ((rc = use(d)))
        return rc;
    cudaError_t r = cudaEventQuery((cudaEvent_t)e->impl);
    if (r == cudaSuccess)
        return 1;
    if (r == cudaErrorNotReady)
        return 0;
    return cuda_fail(r, "cudaEventQuery(e)", __FILE__, __LINE__);
}

static int c_event_elapsed(zn_dev *d, zn_event *a, zn_event *b, float *ms)
{
    int rc;
    if ((rc = use(d)))
        return rc;
    ZN_CUDA_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)a->impl, (cudaEvent_t)b->impl));
    return 0;
}

/* ---- ops -----------------------------------------------------------------*/
static cudaDataType_t cuda_type(zn_dtype dt)
{
    return dt == ZN_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
}

static int fits_int(int64_t v)
{
    return v >= 0 && v <= 0x7fffffff;
}

/* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: hand
 * cuBLAS B as the first operand and swap m and n. */
static int c_gemm(cstream *cs, const zn_op *op)
{
    const int64_t m = op->u.gemm.m, n = op->u.gemm.n, k = op->u.gemm.k;
    if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(op->u.gemm.lda) ||
        !fits_int(op->u.gemm.ldb) || !fits_int(op->u.gemm.ldc) || !fits_int(op->u.gemm.batch))
        return zn_set_error(ZN_EUNSUPPORTED, "gemm on CUDA: a size or leading dimension "
                            "exceeds INT32_MAX (m %lld n %lld k %lld)", (long long)m,
                            (long long)n, (long long)k);
    const cublasOperation_t opA = op->u.gemm.ta == ZN_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opB = op->u.gemm.tb == ZN_TRANS ? CUBLAS_OP_T : CUBLAS_OP_N;
    const float alpha = op->u.gemm.alpha, beta = op->u.gemm.beta;
    const cudaDataType_t at = cuda_type(op->u.gemm.adt), ct = cuda_type(op->u.gemm.cdt);

    if (op->u.gemm.batch == 1)
        ZN_CUBLAS_TRY(cublasGemmEx(cs->blas, opB, opA, (int)n, (int)m, (int)k, &alpha,
                                   op->u.gemm.B, at, (int)op->u.gemm.ldb, op->u.gemm.A, at,
                                   (int)op->u.gemm.lda, &beta, op->u.gemm.C, ct,
                                   (int)op->u.gemm.ldc, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    else
        ZN_CUBLAS_TRY(cublasGemmStridedBatchedEx(
            cs->blas, opB, opA, (int)n, (int)m, (int)k, &alpha, op->u.gemm.B, at,
            (int)op->u.gemm.ldb, (long long)op->u.gemm.sb, op->u.gemm.A, at,
            (int)op->u.gemm.lda, (long long)op->u.gemm.sa, &beta, op->u.gemm.C, ct,
            (int)op->u.gemm.ldc, (long long)op->u.gemm.sc, (int)op->u.gemm.batch,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* ---- waits on a flag in pinned memory ---------------------------------------
 * cuStreamWaitValue32 is a driver call; cudart hands out its entry point, so
 * zinc links no libcuda of its own. The flag's device address is that of
 * the pinned buffer it lies in. */
typedef CUresult (*wait_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

static wait_value_fn wait_value_entry(void)
{
    static wait_value_fn fn;
    static int tried;
    if (!__atomic_load_n(&tried, __ATOMIC_ACQUIRE)) {
        void *p = NULL;
        enum cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            p = NULL;
        wait_value_fn f = NULL;
        memcpy(&f, &p, sizeof f);      /* ISO C: no cast between object and function */
        __atomic_store_n(&fn, f, __ATOMIC_RELEASE);
        __atomic_store_n(&tried, 1, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&fn, __ATOMIC_ACQUIRE);
}

static int c_wait_value(cstream *cs, const zn_op *op)
{
    wait_value_fn fn = wait_value_entry();
    if (!fn)
        return zn_set_error(ZN_EUNSUPPORTED, "cuStreamWaitValue32 is not available from this "
                            "driver (cudaGetDriverEntryPointByVersion)");
    void *dp = NULL;
    ZN_CUDA_TRY(cudaHostGetDevicePointer(&dp, (void *)op->u.wait.flag, 0));
    CUresult r = fn((CUstream)cs->st, (CUdeviceptr)(uintptr_t)dp, op->u.wait.value,
                    CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS)
        return zn_set_error(ZN_ECUDA, "cuStreamWaitValue32 failed: CUresult %d", (int)r);
    return 0;
}

static int c_submit(zn_dev *d, zn_stream *s, const zn_op *op)
{
    cstream *cs = s->impl;
    int rc;
    if ((rc = use(d)))
        return rc;
    switch (op->kind) {
    case ZN_OPK_COPY: {
        static const enum cudaMemcpyKind kinds[] = { cudaMemcpyHostToDevice,
                                                     cudaMemcpyDeviceToHost,
                                                     cudaMemcpyDeviceToDevice };
        ZN_CUDA_TRY(cudaMemcpyAsync(op->u.copy.dst, op->u.copy.src, op->u.copy.bytes,
                                    kinds[op->u.copy.dir], cs->st));
        return 0;
    }
    case ZN_OPK_MEMSET:
        ZN_CUDA_TRY(cudaMemsetAsync(op->u.memset.dst, op->u.memset.value, op->u.memset.bytes,
                                    cs->st));
        return 0;
    case ZN_OPK_HOST_FN: {
        /* through a trampoline that marks the callback thread as such
         * (zn_dev_in_host_fn), so zinc's waits refuse to block there */
        host_tramp *t = malloc(sizeof *t);
        if (!t)
            return zn_set_error(-ENOMEM, "cuda: host function: out of memory");
        t->fn = op->u.host_fn.fn;
        t->arg = op->u.host_fn.arg;
        cudaError_t e = cudaLaunchHostFunc(cs->st, host_tramp_run, t);
        if (e != cudaSuccess) {
            free(t);
            return cuda_fail(e, "cudaLaunchHostFunc", __FILE__, __LINE__);
        }
        return 0;
    }
    case ZN_OPK_WAIT_VALUE:
        return c_wait_value(cs, op);
    case ZN_OPK_GEMM:
        if (op->u.gemm.k > 0 && op->u.gemm.alpha != 0.0f)
            return c_gemm(cs, op);
        break;   /* C = beta * C: a kernel (beta == 0 writes zeros) */
    default:
        break;
    }
    const char *what = "?";
    cudaError_t e = (cudaError_t)zn_cuda_run_kernel(op, cs->st, cs->scratch, &what);
    if (e != cudaSuccess)
        return cuda_fail(e, what, __FILE__, __LINE__);
    return 0;
}

static void c_destroy(zn_dev *d)
{
    free(d->impl);
    d->impl = NULL;
}

/* The arena out of what is free now: after the context, the streams'
 * workspaces and scratch, and NCCL when the caller deferred the arena
 * until its communicator existed. */
static int c_arena_reserve(zn_dev *d, uint64_t budget)
{
    int rc;
    void *base = NULL;
    if ((rc = use(d)))
        return rc;
    size_t fr = 0, tot = 0;
    ZN_CUDA_TRY(cudaMemGetInfo(&fr, &tot));
    zn_dev_info *in = &d->info;
    d->outside_arena = in->free_mem > fr ? in->free_mem - fr : 0;
    char b1[32], b2[32], b3[32];
    zn_format_size(d->outside_arena, b3, sizeof b3);
    if (budget == 0) {
        if (fr <= d->cfg.gpu_margin + (64u << 20))
            return zn_set_error(ZN_EBUDGET, "cuda:%d (%s): %zu bytes free (%s outside the arena: "
                                "cuBLAS workspaces, stream scratch, NCCL), not more than the "
                                "margin of %llu bytes", in->ordinal, in->name, fr, b3,
                                (unsigned long long)d->cfg.gpu_margin);
        budget = fr - d->cfg.gpu_margin;
    } else if (budget > fr) {
        return zn_set_error(ZN_EBUDGET, "cuda:%d (%s): the arena of %llu bytes (%s) exceeds the "
                            "free memory %zu bytes (%s); this process holds %s outside it "
                            "(cuBLAS workspaces, stream scratch, NCCL's buffers, modules) and "
                            "other processes may hold more", in->ordinal, in->name,
                            (unsigned long long)budget, zn_format_size(budget, b1, sizeof b1), fr,
                            zn_format_size(fr, b2, sizeof b2), b3);
    }
    ZN_CUDA_TRY(cudaMalloc(&base, budget));
    d->arena_base = base;
    d->arena_bytes = budget;
    return 0;
}

static const zn_dev_ops cuda_ops = {
    .name = "cuda",
    .destroy = c_destroy,
    .arena_release = c_arena_release,
    .arena_reserve = c_arena_reserve,
    .host_alloc = c_host_alloc,
    .host_free = c_host_free,
    .host_register = c_host_register,
    .host_unregister = c_host_unregister,
    .stream_create = c_stream_create,
    .stream_destroy = c_stream_destroy,
    .stream_sync = c_stream_sync,
    .event_create = c_event_create,
    .event_destroy = c_event_destroy,
    .event_record = c_event_record,
    .stream_wait_event = c_stream_wait_event,
    .event_sync = c_event_sync,
    .event_query = c_event_query,
    .event_elapsed_ms = c_event_elapsed,
    .submit = c_submit,
};

int zn_cuda_backend_create(zn_dev *d, int ordinal)
{
    int n = 0, rc = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();   /* clear the sticky error for later calls */
        int drv = 0, rtv = 0;
        (void)cudaDriverGetVersion(&drv);   /* 0: no driver installed */
        (void)cudaRuntimeGetVersion(&rtv);
        if (e == cudaErrorInsufficientDriver && drv > 0) {
            /* a GPU and a driver are there, too old for this build: say so
             * loudly (a silent fallback to the host backend would train at
             * a hundredth of the speed) */
            static int warned;
            if (!warned++)
                zn_warn("cuda:%d: the NVIDIA driver supports CUDA %d.%d, older than the CUDA "
                        "runtime %d.%d zinc was built with: update the driver, or build zinc "
                        "against the toolkit the driver supports (meson setup BUILD "
                        "-Dcudatk=/usr/local/cuda-%d.%d)", ordinal, drv / 1000,
                        (drv % 1000) / 10, rtv / 1000, (rtv % 1000) / 10, drv / 1000,
                        (drv % 1000) / 10);
            return zn_set_error(ZN_ENODEV, "cuda:%d: the driver (CUDA %d.%d) is older than the "
                                "runtime zinc was built with (CUDA %d.%d)", ordinal, drv / 1000,
                                (drv % 1000) / 10, rtv / 1000, (rtv % 1000) / 10);
        }
        return zn_set_error(ZN_ENODEV, "cuda:%d: no usable GPU: cudaGetDeviceCount: %s (%s; "
                            "driver %s, runtime CUDA %d.%d)", ordinal, cudaGetErrorString(e),
                            cudaGetErrorName(e), drv ? "present" : "not installed",
                            rtv / 1000, (rtv % 1000) / 10);
    }
    if (n == 0)
        return zn_set_error(ZN_ENODEV, "cuda:%d: no CUDA device present", ordinal);
    if (ordinal >= n)
        return zn_set_error(ZN_ENODEV, "cuda:%d: only %d CUDA device%s present", ordinal, n,
                            n == 1 ? "" : "s");

    cdev *c = calloc(1, sizeof *c);
    if (!c)
        return zn_set_error(-ENOMEM, "cuda device: out of memory");
    c->ordinal = ordinal;
    d->impl = c;
    d->ops = &cuda_ops;

    /* waits on the device block (yield the core) rather than spin: the
     * CPU Adam and the gradient accumulation need every core. Flags can be
     * set only before the device's context exists; a second zinc device in
     * the same process inherits the first one's. */
    ZN_CUDA_TRY_GOTO(cudaSetDevice(ordinal));
    e = cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync);
    if (e == cudaErrorSetOnActiveProcess) {
        (void)cudaGetLastError();
        zn_debug("cuda:%d: context already active: its scheduling flags stay", ordinal);
    } else if (e != cudaSuccess) {
        rc = cuda_fail(e, "cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync)", __FILE__,
                       __LINE__);
        goto fail;
    }
    struct cudaDeviceProp prop;
    ZN_CUDA_TRY_GOTO(cudaGetDeviceProperties(&prop, ordinal));
    zn_dev_info *in = &d->info;
    memset(in, 0, sizeof *in);
    in->kind = ZN_DEV_CUDA;
    in->ordinal = ordinal;
    snprintf(in->name, sizeof in->name, "%.127s", prop.name);
    in->cc_major = prop.major;
    in->cc_minor = prop.minor;
    if (!zn_dev_arch_covered(prop.major, prop.minor)) {
        rc = zn_set_error(ZN_EUNSUPPORTED, "cuda:%d (%s) has compute capability %d.%d; this "
                          "zinc has kernels for %s only: rebuild with -Dgpu_arch='%d.%d'",
                          ordinal, prop.name, prop.major, prop.minor, zn_dev_kernel_archs(),
                          prop.major, prop.minor);
        goto fail;
    }
    in->sm_count = prop.multiProcessorCount;
    ZN_CUDA_TRY_GOTO(cudaDeviceGetPCIBusId(in->pci_bus_id, (int)sizeof in->pci_bus_id, ordinal));
    if (zn_gpu_pcie_link(in->pci_bus_id, &in->pcie_gen, &in->pcie_width, &in->pcie_peak_gbs))
        zn_debug("cuda:%d: PCIe link of %s unknown (sysfs)", ordinal, in->pci_bus_id);
    in->numa_node = d->cfg.numa_node >= 0 ? d->cfg.numa_node : zn_gpu_pci_numa_node(in->pci_bus_id);
    c->bound_host = in->numa_node >= 0 && d->topo != NULL;
    int rtv = 0, drv = 0;
    ZN_CUDA_TRY_GOTO(cudaRuntimeGetVersion(&rtv));
    ZN_CUDA_TRY_GOTO(cudaDriverGetVersion(&drv));
    snprintf(in->driver, sizeof in->driver, "CUDA runtime %d.%d, driver %d.%d", rtv / 1000,
             (rtv % 1000) / 10, drv / 1000, (drv % 1000) / 10);

    size_t fr = 0, tot = 0;
    ZN_CUDA_TRY_GOTO(cudaMemGetInfo(&fr, &tot));
    in->total_mem = tot;
    in->free_mem = fr;
    return 0;

fail:
    free(c);
    d->impl = NULL;
    d->ops = NULL;
    return rc;
}

/* ---- the plain copy loop: the ceiling for `zinc bench pcie` -------------*/
int zn_cuda_plain_copy_gbs(zn_dev *d, int dir, size_t block, int iters, double *gbs)
{
    int rc;
    void *h = NULL, *dv = NULL;
    cudaStream_t st = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    *gbs = 0;
    if ((rc = use(d)))
        return rc;
    ZN_CUDA_TRY_GOTO(cudaHostAlloc(&h, block, cudaHostAllocDefault));
    ZN_CUDA_TRY_GOTO(cudaMalloc(&dv, block));
    ZN_CUDA_TRY_GOTO(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    ZN_CUDA_TRY_GOTO(cudaEventCreate(&e0));
    ZN_CUDA_TRY_GOTO(cudaEventCreate(&e1));
    memset(h, 1, block);
    enum cudaMemcpyKind kind = dir == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    void *dst = dir == 0 ? dv : h;
    const void *src = dir == 0 ? h : dv;
    /* one warm-up copy, then the timed loop */
    ZN_CUDA_TRY_GOTO(cudaMemcpyAsync(dst, src, block, kind, st));
    ZN_CUDA_TRY_GOTO(cudaEventRecord(e0, st));
    for (int i = 0; i < iters; i++)
        ZN_CUDA_TRY_GOTO(cudaMemcpyAsync(dst, src, block, kind, st));
    ZN_CUDA_TRY_GOTO(cudaEventRecord(e1, st));
    ZN_CUDA_TRY_GOTO(cudaEventSynchronize(e1));
    float ms = 0;
    ZN_CUDA_TRY_GOTO(cudaEventElapsedTime(&ms, e0, e1));
    *gbs = ms > 0 ? (double)block * iters / (ms * 1e-3) / 1e9 : 0;
    rc = 0;

fail:
    if (e1)
        ZN_CUDA_WARN(cudaEventDestroy(e1));
    if (e0)
        ZN_CUDA_WARN(cudaEventDestroy(e0));
    if (st)
        ZN_CUDA_WARN(cudaStreamDestroy(st));
    if (dv)
        ZN_CUDA_WARN(cudaFree(dv));
    if (h)
        ZN_CUDA_WARN(cudaFreeHost(h));
    return rc;
}
