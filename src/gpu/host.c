/* The host backend: a "GPU" in host memory with the same semantics as CUDA.
 * Each stream is a worker thread draining a bounded in-order queue; copies
 * are memcpy on that thread, kernels the C reference (host_kernels.c), GEMM
 * OpenBLAS. Events carry a generation counter, so a stream that waits on an
 * event blocks its worker until the recording stream has passed the record.
 * The arena is one mmap capped at the GPU budget, like HBM. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#include <pthread.h>
#include <hwloc.h>
#include <omp.h>

#include "gpu/gpu-impl.h"

/* ---- the device guard (ZINC_DEVICE_GUARD=1) ---------------------------------
 * On a GPU, CPU code that reads or writes device memory faults; in the host
 * backend's arena it would silently work. With the guard on, every arena is
 * tagged with one memory-protection key (pkey_mprotect) that only the
 * stream workers, running device ops, may use: a CPU-side access (from the
 * trainer's threads, or a host function) faults with SEGV_PKUERR, and the
 * handler names it. Threads inherit the key's rights from their creator and
 * start without them, so only the workers (and the OpenMP threads they
 * start for an op) are let in. Host code that stands in for a device
 * engine (the host backend's collectives) opens the key for its own thread
 * with zn_host_guard_allow. Off by default: tests turn it on. */
static int guard_key = -1;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;

static void guard_segv(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    if (si->si_code == SEGV_PKUERR) {
        char msg[160] = "zinc: device guard: CPU code touched device memory at 0x";
        size_t n = strlen(msg);
        uintptr_t a = (uintptr_t)si->si_addr;
        for (int sh = (int)sizeof a * 8 - 4; sh >= 0; sh -= 4)
            msg[n++] = "0123456789abcdef"[(a >> sh) & 15];
        const char *tail = " (a host-backend arena address; on a GPU this access would fault)\n";
        for (size_t i = 0; tail[i] && n < sizeof msg - 1; i++)
            msg[n++] = tail[i];
        if (write(2, msg, n) < 0) {
            /* nothing more can be done from here */
        }
    }
    signal(sig, SIG_DFL); /* the access repeats and ends the process */
}

static void guard_init(void)
{
    const char *e = getenv("ZINC_DEVICE_GUARD");
    if (!e || !*e || !strcmp(e, "0"))
        return;
    int k = pkey_alloc(0, PKEY_DISABLE_ACCESS);
    if (k < 0) {
        zn_warn("ZINC_DEVICE_GUARD: this machine has no memory protection keys (%s); the "
                "host arena is not guarded", strerror(errno));
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = guard_segv;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
    guard_key = k;
    /* OpenBLAS built on pthreads keeps its own pool, made at load by a
     * thread without the key's rights, and nothing can give them to it (an
     * OpenMP build's threads are started by the stream worker and inherit
     * them). Its GEMMs run on the worker alone then: a test's device guard
     * must not fault on the library that stands in for cuBLAS (seen on a
     * Xeon with protection keys and Ubuntu's pthreads OpenBLAS). */
    if (openblas_get_parallel() == 1) {
        openblas_set_num_threads(1);
        zn_info("ZINC_DEVICE_GUARD: OpenBLAS runs its own threads (a pthreads build), which "
                "cannot enter the guarded arena: its GEMMs run on one thread");
    }
}

int zn_host_guard_on(void)
{
    pthread_once(&guard_once, guard_init);
    return guard_key >= 0;
}

/* (A thread may open the key before any arena exists: the key is made
 * first, so that it is the one the arenas get later.) */
void zn_host_guard_allow(int allow)
{
    if (zn_host_guard_on())
        pkey_set(guard_key, allow ? 0 : PKEY_DISABLE_ACCESS);
}

/* Ops a stream holds before a producer blocks (CUDA's queue is bounded too). */
enum { HQ_CAP = 1024 };

/* ---- the callback thread ------------------------------------------------------
 * CUDA runs the host functions of all of a context's streams on one thread,
 * in the order the streams reach them, and a stream does not pass a host
 * function that has not run. The host backend does the same, so that a host
 * function that blocks stalls the other streams here as it would on a GPU,
 * where the tests can see it. A stream worker that reaches a host function
 * queues it here and waits for it to have run. */
typedef struct hcb_item {
    void (*fn)(void *);
    void *arg;
    int done;                      /* under the stream's mutex */
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    struct hcb_item *next;
} hcb_item;

typedef struct hcb {
    pthread_t th;
    int started, quit;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    hcb_item *head, *tail;
} hcb;

static void *cb_main(void *arg)
{
    hcb *cb = arg;
    zn_host_guard_allow(0);        /* CPU code: the arena is not its */
    pthread_mutex_lock(&cb->mu);
    for (;;) {
        while (!cb->head && !cb->quit)
            pthread_cond_wait(&cb->cv, &cb->mu);
        hcb_item *it = cb->head;
        if (!it)
            break;                 /* quit, nothing queued */
        cb->head = it->next;
        if (!cb->head)
            cb->tail = NULL;
        pthread_mutex_unlock(&cb->mu);
        zn_tls_in_host_fn = 1;
        it->fn(it->arg);
        zn_tls_in_host_fn = 0;
        pthread_mutex_lock(it->mu);
        it->done = 1;
        pthread_cond_broadcast(it->cv);
        pthread_mutex_unlock(it->mu);
        pthread_mutex_lock(&cb->mu);
    }
    pthread_mutex_unlock(&cb->mu);
    return NULL;
}

static int cb_start(hcb *cb)
{
    pthread_mutex_init(&cb->mu, NULL);
    pthread_cond_init(&cb->cv, NULL);
    int rc = pthread_create(&cb->th, NULL, cb_main, cb);
    if (rc) {
        pthread_mutex_destroy(&cb->mu);
        pthread_cond_destroy(&cb->cv);
        return zn_set_error(-rc, "host device: callback thread: pthread_create: %s",
                            strerror(rc));
    }
    pthread_setname_np(cb->th, "zn:callbacks");
    cb->started = 1;
    return 0;
}

static void cb_stop(hcb *cb)
{
    if (!cb || !cb->started)
        return;
    pthread_mutex_lock(&cb->mu);
    cb->quit = 1;
    pthread_cond_broadcast(&cb->cv);
    pthread_mutex_unlock(&cb->mu);
    pthread_join(cb->th, NULL);
    pthread_mutex_destroy(&cb->mu);
    pthread_cond_destroy(&cb->cv);
    cb->started = 0;
}

/* A stream's wait for a flag in pinned memory (cuStreamWaitValue32's GEQ):
 * polled, as a GPU's front end polls it, backing off to 200 us. */
static void wait_value(const uint32_t *flag, uint32_t value)
{
    long ns = 1000;
    while ((int32_t)(__atomic_load_n(flag, __ATOMIC_ACQUIRE) - value) < 0) {
        struct timespec ts = { 0, ns };
        nanosleep(&ts, NULL);
        if (ns < 200000)
            ns *= 2;
    }
}

typedef struct hevent {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t rec_gen, done_gen;   /* latest record queued / completed */
    uint64_t t_ns;                /* when done_gen completed */
    int err;                      /* sticky error of the recording stream then */
    int refs;                     /* owner + queued records and waits */
} hevent;

typedef struct hstream {
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_idle, cv_space, cv_cb;
    hcb *cb;                       /* the device's callback thread */
    zn_op q[HQ_CAP];
    size_t head, count;
    int busy, quit;
    int err;
    char errmsg[512];
    float *scratch;
    size_t slen;
    int blas_threads;
    char name[48];
} hstream;

static void ev_unref(hevent *e)
{
    if (__atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        free(e);
    }
}

static void exec_op(hstream *hs, const zn_op *op)
{
    int rc = 0;
    switch (op->kind) {
    case ZN_OPK_COPY:
        memcpy(op->u.copy.dst, op->u.copy.src, op->u.copy.bytes);
        break;
    case ZN_OPK_HOST_FN: {
        /* to the callback thread, and wait until it has run */
        hcb_item it = { op->u.host_fn.fn, op->u.host_fn.arg, 0, &hs->mu, &hs->cv_cb, NULL };
        hcb *cb = hs->cb;
        pthread_mutex_lock(&cb->mu);
        if (cb->tail)
            cb->tail->next = &it;
        else
            cb->head = &it;
        cb->tail = &it;
        pthread_cond_signal(&cb->cv);
        pthread_mutex_unlock(&cb->mu);
        pthread_mutex_lock(&hs->mu);
        while (!it.done)
            pthread_cond_wait(&hs->cv_cb, &hs->mu);
        pthread_mutex_unlock(&hs->mu);
        break;
    }
    case ZN_OPK_STREAM_FN:
        op->u.host_fn.fn(op->u.host_fn.arg);   /* a device op: the arena is open */
        break;
    case ZN_OPK_WAIT_VALUE:
        wait_value(op->u.wait.flag, op->u.wait.value);
        break;
    case ZN_OPK_EV_RECORD: {
        hevent *e = op->u.ev.ev;
        pthread_mutex_lock(&hs->mu);
        int err = hs->err;
        pthread_mutex_unlock(&hs->mu);
        pthread_mutex_lock(&e->mu);
        if (op->u.ev.gen > e->done_gen) {
            e->done_gen = op->u.ev.gen;
            e->t_ns = zn_now_ns();
            e->err = err;
        }
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        ev_unref(e);
        break;
    }
    case ZN_OPK_EV_WAIT: {
        hevent *e = op->u.ev.ev;
        pthread_mutex_lock(&e->mu);
        while (e->done_gen < op->u.ev.gen)
            pthread_cond_wait(&e->cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
        ev_unref(e);
        break;
    }
    default:
        rc = zn_host_run_op(op, &hs->scratch, &hs->slen);
        break;
    }
    if (rc) {
        pthread_mutex_lock(&hs->mu);
        if (!hs->err) {
            hs->err = rc;
            snprintf(hs->errmsg, sizeof hs->errmsg, "%s", zn_last_error());
        }
        pthread_mutex_unlock(&hs->mu);
    }
}

static void *worker(void *arg)
{
    hstream *hs = arg;
    zn_host_guard_allow(1);  /* device ops: the arena is theirs */
    if (hs->blas_threads > 0)
        omp_set_num_threads(hs->blas_threads);
    pthread_mutex_lock(&hs->mu);
    for (;;) {
        while (hs->count == 0 && !hs->quit)
            pthread_cond_wait(&hs->cv_work, &hs->mu);
        if (hs->count == 0)
            break;                      /* quit, and the queue is drained */
        zn_op op = hs->q[hs->head];
        hs->head = (hs->head + 1) % HQ_CAP;
        hs->count--;
        hs->busy = 1;
        pthread_cond_signal(&hs->cv_space);
        pthread_mutex_unlock(&hs->mu);
        exec_op(hs, &op);
        pthread_mutex_lock(&hs->mu);
        hs->busy = 0;
        if (hs->count == 0)
            pthread_cond_broadcast(&hs->cv_idle);
    }
    pthread_mutex_unlock(&hs->mu);
    return NULL;
}

static int push(hstream *hs, const zn_op *op)
{
    pthread_mutex_lock(&hs->mu);
    while (hs->count == HQ_CAP)
        pthread_cond_wait(&hs->cv_space, &hs->mu);
    hs->q[(hs->head + hs->count) % HQ_CAP] = *op;
    hs->count++;
    pthread_cond_signal(&hs->cv_work);
    pthread_mutex_unlock(&hs->mu);
    return 0;
}

/* ---- streams -------------------------------------------------------------*/
static int h_stream_create(zn_dev *d, zn_stream *s)
{
    hstream *hs = calloc(1, sizeof *hs);
    if (!hs)
        return zn_set_error(-ENOMEM, "host stream: out of memory");
    pthread_mutex_init(&hs->mu, NULL);
    pthread_cond_init(&hs->cv_work, NULL);
    pthread_cond_init(&hs->cv_idle, NULL);
    pthread_cond_init(&hs->cv_space, NULL);
    pthread_cond_init(&hs->cv_cb, NULL);
    hs->cb = d->impl;
    hs->blas_threads = d->cfg.host_blas_threads;
    snprintf(hs->name, sizeof hs->name, "%s", s->name);
    int rc = pthread_create(&hs->th, NULL, worker, hs);
    if (rc) {
        pthread_mutex_destroy(&hs->mu);
        pthread_cond_destroy(&hs->cv_work);
        pthread_cond_destroy(&hs->cv_idle);
        pthread_cond_destroy(&hs->cv_space);
        pthread_cond_destroy(&hs->cv_cb);
        free(hs);
        return zn_set_error(-rc, "host stream: pthread_create: %s", strerror(rc));
    }
    char tn[16];
    snprintf(tn, sizeof tn, "zn:%.12s", s->name);
    pthread_setname_np(hs->th, tn);    /* cosmetic; failure is harmless */
    hs->started = 1;
    s->impl = hs;
    return 0;
}

static void h_stream_destroy(zn_dev *d, zn_stream *s)
{
    hstream *hs = s->impl;
    if (!hs)
        return;
    pthread_mutex_lock(&hs->mu);
    hs->quit = 1;
    pthread_cond_signal(&hs->cv_work);
    pthread_mutex_unlock(&hs->mu);
    if (hs->started)
        pthread_join(hs->th, NULL);
    if (hs->err)
        zn_warn("host stream '%s' destroyed with an unreported failure: %s", hs->name,
                hs->errmsg);
    free(hs->scratch);
    pthread_mutex_destroy(&hs->mu);
    pthread_cond_destroy(&hs->cv_work);
    pthread_cond_destroy(&hs->cv_idle);
    pthread_cond_destroy(&hs->cv_space);
    pthread_cond_destroy(&hs->cv_cb);
    free(hs);
    s->impl = NULL;
}

static int h_stream_sync(zn_dev *d, zn_stream *s)
{
    hstream *hs = s->impl;
    pthread_mutex_lock(&hs->mu);
    while (hs->count || hs->busy)
        pthread_cond_wait(&hs->cv_idle, &hs->mu);
    int rc = hs->err;
    if (rc) {
        zn_set_error(rc, "%s", hs->errmsg);
        hs->err = 0;
        hs->errmsg[0] = '\0';
    }
    pthread_mutex_unlock(&hs->mu);
    return rc;
}

static int h_submit(zn_dev *d, zn_stream *s, const zn_op *op)
{
    return push(s->impl, op);
}

/* ---- events -----------------------------------------------------------*/
static int h_event_create(zn_dev *d, zn_event *e)
{
    hevent *he = calloc(1, sizeof *he);
    if (!he)
        return zn_set_error(-ENOMEM, "host event: out of memory");
    pthread_mutex_init(&he->mu, NULL);
    pthread_cond_init(&he->cv, NULL);
    he->refs = 1;
    e->impl = he;
    return 0;
}

static void h_event_destroy(zn_dev *d, zn_event *e)
{
    if (e->impl)
        ev_unref(e->impl);
    e->impl = NULL;
}

static int h_event_record(zn_dev *d, zn_event *e, zn_stream *s)
{
    hevent *he = e->impl;
    zn_op op = { .kind = ZN_OPK_EV_RECORD };
    /* Take the generation and queue the record under the stream's order:
     * two records racing from two threads each get their own generation. */
    pthread_mutex_lock(&he->mu);
    op.u.ev.gen = ++he->rec_gen;
    pthread_mutex_unlock(&he->mu);
    __atomic_add_fetch(&he->refs, 1, __ATOMIC_ACQ_REL);
    op.u.ev.ev = he;
    return push(s->impl, &op);
}

static int h_stream_wait_event(zn_dev *d, zn_stream *s, zn_event *e)
{
    hevent *he = e->impl;
    zn_op op = { .kind = ZN_OPK_EV_WAIT };
    pthread_mutex_lock(&he->mu);
    op.u.ev.gen = he->rec_gen;
    int done = he->done_gen >= he->rec_gen;
    pthread_mutex_unlock(&he->mu);
    if (done)
        return 0;      /* nothing pending: no need to queue a wait */
    __atomic_add_fetch(&he->refs, 1, __ATOMIC_ACQ_REL);
    op.u.ev.ev = he;
    return push(s->impl, &op);
}

static int h_event_sync(zn_dev *d, zn_event *e)
{
    hevent *he = e->impl;
    pthread_mutex_lock(&he->mu);
    uint64_t target = he->rec_gen;
    while (he->done_gen < target)
        pthread_cond_wait(&he->cv, &he->mu);
    int err = he->err;
    pthread_mutex_unlock(&he->mu);
    if (err)
        return zn_set_error(err, "event: the stream it was recorded on had failed "
                            "(zn_dev_stream_sync on that stream has the detail)");
    return 0;
}

static int h_event_query(zn_dev *d, zn_event *e)
{
    hevent *he = e->impl;
    pthread_mutex_lock(&he->mu);
    int done = he->done_gen >= he->rec_gen;
    pthread_mutex_unlock(&he->mu);
    return done;
}

static int h_event_elapsed(zn_dev *d, zn_event *a, zn_event *b, float *ms)
{
    hevent *ea = a->impl, *eb = b->impl;
    uint64_t ta = 0, tb = 0;
    int ok = 1;
    pthread_mutex_lock(&ea->mu);
    ok &= ea->rec_gen > 0 && ea->done_gen >= ea->rec_gen;
    ta = ea->t_ns;
    pthread_mutex_unlock(&ea->mu);
    pthread_mutex_lock(&eb->mu);
    ok &= eb->rec_gen > 0 && eb->done_gen >= eb->rec_gen;
    tb = eb->t_ns;
    pthread_mutex_unlock(&eb->mu);
    if (!ok)
        return zn_set_error(ZN_EARG, "event elapsed: an event has not been recorded or "
                            "has not completed");
    *ms = (float)(((double)tb - (double)ta) / 1e6);
    return 0;
}

/* ---- memory --------------------------------------------------------------*/
static void h_arena_release(zn_dev *d, void *base, uint64_t bytes)
{
    if (munmap(base, bytes))
        zn_warn("host arena: munmap: %s", strerror(errno));
}

static int lock_pages(void *p, size_t bytes, int *locked)
{
    static int warned;
    if (mlock(p, bytes) == 0) {
        *locked = 1;
        return 0;
    }
    int e = errno;
    struct rlimit rl = { 0, 0 };
    getrlimit(RLIMIT_MEMLOCK, &rl);
    char lim[32];
    if (rl.rlim_cur == RLIM_INFINITY)
        snprintf(lim, sizeof lim, "unlimited");
    else
        zn_format_size((uint64_t)rl.rlim_cur, lim, sizeof lim);
    zn_warn_once(&warned, "pinned memory: mlock refused (%s; RLIMIT_MEMLOCK = %s): "
                 "pinned buffers stay pageable", strerror(e), lim);
    *locked = 0;
    return 0;
}

/* The kernel zeroes a page in the thread that first touches it, and mlock
 * faults every page in from one thread: for a large buffer (the pinned
 * tier of a 1B+ model is many GiB) touch the pages from every core first,
 * so that mlock finds them present. On the 2-core VM this took a 9 GiB
 * pinned tier from about 7 s of page clearing in one thread to half. */
static void touch_pages(void *p, size_t bytes)
{
    const size_t page = 4096;
    size_t n = bytes / page;
    volatile char *c = p;
    if (bytes < ((size_t)64 << 20))
        return;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        c[i * page] = 0;
}

static int h_host_alloc(zn_dev *d, size_t bytes, void **out, int *locked)
{
    int rc = zn_gpu_numa_alloc(d, bytes, out);
    if (rc)
        return rc;
    touch_pages(*out, bytes);
    return lock_pages(*out, bytes, locked);
}

static void h_host_free(zn_dev *d, void *p, size_t bytes)
{
    munlock(p, bytes);   /* fails harmlessly when mlock had been refused */
    zn_gpu_numa_free(d, p, bytes);
}

static int h_host_register(zn_dev *d, void *p, size_t bytes, int *locked)
{
    return lock_pages(p, bytes, locked);
}

static void h_host_unregister(zn_dev *d, void *p, size_t bytes)
{
    munlock(p, bytes);
}

static void h_destroy(zn_dev *d)
{
    cb_stop(d->impl);   /* the streams are gone: nothing waits on it */
    free(d->impl);
    d->impl = NULL;
}

static int h_arena_reserve(zn_dev *d, uint64_t want);

static const zn_dev_ops host_ops = {
    .name = "host",
    .destroy = h_destroy,
    .arena_release = h_arena_release,
    .arena_reserve = h_arena_reserve,
    .host_alloc = h_host_alloc,
    .host_free = h_host_free,
    .host_register = h_host_register,
    .host_unregister = h_host_unregister,
    .stream_create = h_stream_create,
    .stream_destroy = h_stream_destroy,
    .stream_sync = h_stream_sync,
    .event_create = h_event_create,
    .event_destroy = h_event_destroy,
    .event_record = h_event_record,
    .stream_wait_event = h_stream_wait_event,
    .event_sync = h_event_sync,
    .event_query = h_event_query,
    .event_elapsed_ms = h_event_elapsed,
    .submit = h_submit,
};

/* NUMA node of the CPU this thread last ran on; -1 if unknown. */
static int current_node(zn_dev *d)
{
    hwloc_topology_t t = d->topo;
    if (!t)
        return -1;
    int node = -1;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (set && hwloc_get_last_cpu_location(t, set, HWLOC_CPUBIND_THREAD) == 0) {
        hwloc_obj_t n = NULL;
        while ((n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, n)))
            if (hwloc_bitmap_intersects(n->cpuset, set)) {
                node = (int)n->os_index;
                break;
            }
    }
    if (node < 0) {
        hwloc_obj_t n = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, NULL);
        node = n ? (int)n->os_index : -1;
    }
    hwloc_bitmap_free(set);
    return node;
}

static uint64_t phys_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

/* The arena: an mmap committed as pages are touched. 0 = a quarter of RAM.
 * Nothing lives outside it on this backend. */
static int h_arena_reserve(zn_dev *d, uint64_t want)
{
    uint64_t budget = want ? want : phys_bytes() / 4;
    if (budget < 1u << 20)
        budget = 1u << 20;   /* a tiny budget still gets a usable arena */
    budget = (budget + 4095) & ~(uint64_t)4095;
    void *base = mmap(NULL, budget, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        char b[32];
        return zn_set_error(-errno, "host device: cannot reserve an arena of %s: %s",
                            zn_format_size(budget, b, sizeof b), strerror(errno));
    }
    if (zn_host_guard_on() &&
        pkey_mprotect(base, budget, PROT_READ | PROT_WRITE, guard_key) != 0)
        zn_warn("ZINC_DEVICE_GUARD: pkey_mprotect: %s; this arena is not guarded",
                strerror(errno));
    /* The arena is counted exactly: the allocator sees `want` bytes (rounded
     * down to ZN_DEV_ALIGN), not the page-rounded mapping. (arena_release
     * unmaps arena_bytes, which munmap rounds up to the same pages.) */
    d->arena_base = base;
    d->arena_bytes = want >= (1u << 20) ? want : budget;
    d->outside_arena = 0;
    return 0;
}

int zn_host_backend_create(zn_dev *d)
{
    uint64_t phys = phys_bytes();
    hcb *cb = calloc(1, sizeof *cb);
    int crc = cb ? cb_start(cb) : zn_set_error(-ENOMEM, "host device: out of memory");
    if (crc) {
        free(cb);
        return crc;
    }
    d->impl = cb;
    d->ops = &host_ops;

    zn_dev_info *in = &d->info;
    memset(in, 0, sizeof *in);
    in->kind = ZN_DEV_HOST;
    snprintf(in->name, sizeof in->name, "host (emulated GPU)");
    in->numa_node = d->cfg.numa_node >= 0 ? d->cfg.numa_node : current_node(d);
    in->total_mem = phys;
    in->free_mem = phys;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    in->sm_count = ncpu > 0 ? (int)ncpu : 1;
    snprintf(in->driver, sizeof in->driver, "%s", zn_dev_host_blas());
    return 0;
}

static char g_blas[96];

static void host_blas_fill(void)
{
    /* openblas_get_config() starts "OpenBLAS 0.3.21 ..." */
    char ver[32] = "";
    sscanf(openblas_get_config(), "OpenBLAS %31s", ver);
    snprintf(g_blas, sizeof g_blas, "OpenBLAS %s, %s kernels", ver, openblas_get_corename());
}

const char *zn_dev_host_blas(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, host_blas_fill);
    return g_blas;
}

void zn_dev_host_guard_allow(int allow)
{
    zn_host_guard_allow(allow);
}
