/* Gradient accumulation off the device's callback thread.
 *
 * A block's gradients reach pinned staging (gstage[g], two buffers) on the
 * D2H stream; a host function there only queues the block's job and
 * returns, so the stream (and, on CUDA, the driver thread that runs every
 * stream's host functions) never waits on host arithmetic or disk. One
 * worker thread runs the jobs in order:
 *   - grads in RAM: the first micro-batch copies, later ones add, over all
 *     cores (OpenMP, tr->threads);
 *   - grads on NVMe: every piece's read-back is in flight at once, each
 *     piece is added as its read lands and written back at once (the first
 *     micro-batch only writes);
 *   - after the last micro-batch: the block's sum of squares, the pieces'
 *     readiness for the optimizer;
 *   - optimizer on the device (tr->opt_on_device): the sums stay there, and the only
 *     job, after the last micro-batch, combines the block's chunk sums of
 *     squares (copied out by the D2H stream) into its norm.
 * Before the D2H stream overwrites staging buffer g it waits (a host
 * function) until the jobs reading g are done: the only place a callback
 * blocks, and only when the worker is behind, which is the back-pressure
 * that bounds the staging to two blocks. Element-wise adds in a fixed order
 * per element: the sums are bit-identical for any thread count. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"

/* dst = a + b (a may be dst) over n elements, on `threads` threads. */
static void add_f32(float *dst, const float *a, const float *b, uint64_t n, int threads)
{
    int64_t m = (int64_t)n;
#pragma omp parallel for num_threads(threads) schedule(static) if (m >= (1 << 16))
    for (int64_t i = 0; i < m; i++)
        dst[i] = a[i] + b[i];
}

static void copy_f32(float *dst, const float *src, uint64_t n, int threads)
{
    int64_t m = (int64_t)n, chunk = 1 << 16, nc = (m + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
        int64_t s = c * chunk, e = s + chunk < m ? s + chunk : m;
        memcpy(dst + s, src + s, (size_t)(e - s) * 4);
    }
}

/* bf16 gradients (train.grad_transfer): widened exactly (zn_bf16_widen, a
 * shift), copied or added in fp32. Plain loops the compiler vectorizes. */

static void add_bf16(float *dst, const float *a, const uint16_t *b, uint64_t n, int threads)
{
    int64_t m = (int64_t)n;
#pragma omp parallel for num_threads(threads) schedule(static) if (m >= (1 << 16))
    for (int64_t i = 0; i < m; i++)
        dst[i] = a[i] + zn_bf16_widen(b[i]);
}

static void copy_bf16(float *dst, const uint16_t *src, uint64_t n, int threads)
{
    int64_t m = (int64_t)n;
#pragma omp parallel for num_threads(threads) schedule(static) if (m >= (1 << 16))
    for (int64_t i = 0; i < m; i++)
        dst[i] = zn_bf16_widen(src[i]);
}

/* Row-sparse gradients: the staged rows (ids rows[0..n), distinct, of W
 * elements each) added into the block's accumulators, which the first
 * micro-batch zeroes first. Untouched rows would add zeros: the sums are
 * those of the dense path. */
static void accum_rows(zn_trainer *tr, const zn_accum_arg *a, float *sum, const void *staged)
{
    const zn_block *bl = &tr->blocks[a->block];
    int64_t W = tr->model->row_width, n = a->nrows;
    if (a->mb == 0) {
        int64_t m = (int64_t)bl->len, chunk = 1 << 16, nc = (m + chunk - 1) / chunk;
#pragma omp parallel for num_threads(tr->threads) schedule(static) if (nc > 1)
        for (int64_t c = 0; c < nc; c++) {
            int64_t s = c * chunk, e = s + chunk < m ? s + chunk : m;
            memset(sum + s, 0, (size_t)(e - s) * 4);
        }
    }
    bool f32 = tr->grad_dt == ZN_DTYPE_F32;
#pragma omp parallel for num_threads(tr->threads) schedule(static) if (n * W >= (1 << 16))
    for (int64_t i = 0; i < n; i++) {
        float *dst = sum + (a->rows[i] - bl->srow0) * W;
        if (f32) {
            const float *src = (const float *)staged + i * W;
            for (int64_t j = 0; j < W; j++)
                dst[j] += src[j];
        } else {
            const uint16_t *src = (const uint16_t *)staged + i * W;
            for (int64_t j = 0; j < W; j++)
                dst[j] += zn_bf16_widen(src[j]);
        }
    }
}

/* A piece of the NVMe gradient accumulators: read or written through the
 * queue, or, for a piece kept in pinned RAM (gram_off), copied at once and
 * its request marked done, so that the code around treats both alike. */
static int piece_io(zn_trainer *tr, zn_io_req *r, int is_write, const zn_piece *p, float *buf,
                    const char *what)
{
    if (p->gram_off >= 0) {
        float *ram = tr->gram + p->gram_off;
        if (is_write)
            memcpy(ram, buf, p->n * 4);
        else
            memcpy(buf, ram, p->n * 4);
        r->status = 0;
        atomic_store(&r->done, 1);
        return 0;
    }
    return zn_ioq_submit(is_write ? &tr->wq : &tr->rq, r, is_write,
                         &zn_tier_get(&tr->tm, p->grad_id)->ext, buf, p->n * 4, what);
}

/* Grads on NVMe: read back (after the first micro-batch), add, write. The
 * sum is formed in staging itself (fp32 transfer) or in the read-back
 * buffer (bf16 transfer); *sum_out says where. */
static int accum_nvme(zn_trainer *tr, const zn_accum_arg *a, void *staged, float **sum_out)
{
    bool f32 = tr->grad_dt == ZN_DTYPE_F32;
    float *src = f32 ? staged : tr->gtmp;
    *sum_out = src;
    const uint16_t *s16 = staged;
    zn_block *bl = &tr->blocks[a->block];
    int np = bl->np, rc = 0, nr = 0, nw = 0;
    zn_io_req *rd = calloc((size_t)np * 2, sizeof *rd), *wr = rd + np;
    if (!rd)
        return zn_set_error(-ENOMEM, "grad accumulation: out of memory");
    char what[48];
    if (a->mb > 0)
        for (; nr < np && !rc; nr++) {
            zn_piece *p = &tr->pieces[bl->p0 + nr];
            snprintf(what, sizeof what, "grads b%d u%d", p->block, p->unit);
            rc = piece_io(tr, &rd[nr], 0, p, tr->gtmp + (p->start - bl->off), what);
        }
    for (int k = 0; k < np && !rc; k++) {
        zn_piece *p = &tr->pieces[bl->p0 + k];
        float *g = src + (p->start - bl->off);
        const uint16_t *h = s16 + (p->start - bl->off);
        if (a->mb > 0) {
            if ((rc = zn_ioq_wait(&tr->rq, &rd[k])))
                break;
            if (f32)
                add_f32(g, tr->gtmp + (p->start - bl->off), g, p->n, tr->threads);
            else
                add_bf16(g, g, h, p->n, tr->threads); /* g is the read-back */
        } else if (!f32) {
            copy_bf16(g, h, p->n, tr->threads);
        }
        snprintf(what, sizeof what, "grads b%d u%d", p->block, p->unit);
        rc = piece_io(tr, &wr[k], 1, p, g, what);
        nw = k + 1;
    }
    /* every request submitted is waited for: staging and the read-back
     * buffer are reused once the job ends */
    for (int k = 0; k < nr; k++) {
        int r2 = zn_ioq_wait(&tr->rq, &rd[k]);
        if (!rc)
            rc = r2;
    }
    for (int k = 0; k < nw; k++) {
        int r2 = zn_ioq_wait(&tr->wq, &wr[k]);
        if (!rc)
            rc = r2;
    }
    free(rd);
    return rc;
}

static void accum_job(zn_accum_arg *a)
{
    zn_trainer *tr = a->tr;
    if (atomic_load(&tr->err))
        return;
    uint64_t t0 = zn_now_ns();
    zn_block *bl = &tr->blocks[a->block];
    if (tr->opt_on_device) {
        /* summed on the device; its chunk sums of squares are in */
        size_t nc = (bl->len + ZN_GRAD_NORM_CHUNK - 1) / ZN_GRAD_NORM_CHUNK;
        double sq = zn_grad_norm_combine(tr->normc + bl->nc_off, nc);
        bl->grad_sq = sq;
        bl->grad_nonfinite = !isfinite(sq);
        for (int k = 0; k < bl->np; k++)
            atomic_fetch_add(&tr->units[tr->pieces[bl->p0 + k].unit].pieces_done, 1);
        zn_optsched_notify(tr);
        return;
    }
    float *src = tr->gstage[a->gbuf], *sum = tr->grad_acc ? tr->grad_acc + bl->off : NULL;
    const uint16_t *s16 = (const uint16_t *)src;
    bool f32 = tr->grad_dt == ZN_DTYPE_F32;
    int rc = 0;
    if (a->nrows >= 0)
        accum_rows(tr, a, sum, src);
    else if (tr->grads_on_nvme)
        rc = accum_nvme(tr, a, src, &sum);
    else if (a->mb == 0 && f32)
        copy_f32(sum, src, bl->len, tr->threads);
    else if (a->mb == 0)
        copy_bf16(sum, s16, bl->len, tr->threads);
    else if (f32)
        add_f32(sum, sum, src, bl->len, tr->threads);
    else
        add_bf16(sum, sum, s16, bl->len, tr->threads);
    if (rc) {
        zn_train_fail(tr, rc, "gradients of block %d: %s", a->block, zn_last_error());
        return;
    }
    if (a->mb == tr->spec.accumulation - 1 ||
        tr->spec.accumulation < 1) {
        zn_grad_span sp = { sum, bl->len, ZN_DTYPE_F32 };
        double sq = 0;
        int nonfinite = 0;
        if ((rc = zn_grad_norm_sq(&sp, 1, tr->threads, &sq, &nonfinite))) {
            zn_train_fail(tr, rc, "grad norm of block %d: %s", a->block, zn_last_error());
            return;
        }
        bl->grad_sq = sq;
        bl->grad_nonfinite = nonfinite;
        for (int k = 0; k < bl->np; k++)
            atomic_fetch_add(&tr->units[tr->pieces[bl->p0 + k].unit].pieces_done, 1);
        zn_optsched_notify(tr);
    }
    char name[ZN_TRACE_NAME_LEN];
    snprintf(name, sizeof name, "accum b%d", a->block);
    zn_trace_span(tr->trace, tr->track[ZN_RES_D2H], name, t0, zn_now_ns());
}

static void *accum_main(void *arg)
{
    zn_trainer *tr = arg;
    pthread_mutex_lock(&tr->acc.lock);
    for (;;) {
        while (!tr->acc.head && !tr->acc.quit)
            pthread_cond_wait(&tr->acc.cv, &tr->acc.lock);
        zn_accum_arg *a = tr->acc.head;
        if (!a)
            break; /* quit with nothing queued */
        tr->acc.head = a->next;
        if (!tr->acc.head)
            tr->acc.tail = NULL;
        pthread_mutex_unlock(&tr->acc.lock);
        int g = a->gbuf;
        accum_job(a);
        /* buffer g is free for the next D2H once this count reaches what
         * was posted (the D2H stream waits on it) */
        __atomic_fetch_add(zn_tr_accum_flag(tr, g), 1, __ATOMIC_RELEASE);
        pthread_mutex_lock(&tr->acc.lock);
        tr->acc.busy[g]--;
        tr->acc.pending--;
        pthread_cond_broadcast(&tr->acc.cv);
    }
    pthread_mutex_unlock(&tr->acc.lock);
    return NULL;
}

int zn_accum_start(zn_trainer *tr)
{
    if (pthread_mutex_init(&tr->acc.lock, NULL) || pthread_cond_init(&tr->acc.cv, NULL))
        return zn_set_error(-ENOMEM, "grad accumulation thread: pthread init failed");
    tr->acc.head = tr->acc.tail = NULL;
    tr->acc.busy[0] = tr->acc.busy[1] = tr->acc.pending = 0;
    tr->acc.quit = false;
    for (int g = 0; g < 2; g++) {
        tr->acc.buf[g].tr = tr;
        tr->acc.buf[g].g = g;
    }
    int rc = pthread_create(&tr->acc.thread, NULL, accum_main, tr);
    if (rc) {
        pthread_cond_destroy(&tr->acc.cv);
        pthread_mutex_destroy(&tr->acc.lock);
        return zn_set_error(-rc, "grad accumulation thread: pthread_create: %s", strerror(rc));
    }
    tr->acc.started = true;
    return 0;
}

void zn_accum_stop(zn_trainer *tr)
{
    if (!tr->acc.started)
        return;
    pthread_mutex_lock(&tr->acc.lock);
    tr->acc.quit = true; /* the worker finishes what is queued, then ends */
    pthread_cond_broadcast(&tr->acc.cv);
    pthread_mutex_unlock(&tr->acc.lock);
    pthread_join(tr->acc.thread, NULL);
    tr->acc.started = false;
    pthread_cond_destroy(&tr->acc.cv);
    pthread_mutex_destroy(&tr->acc.lock);
}

void zn_accum_post_fn(void *arg)
{
    zn_accum_arg *a = arg;
    zn_trainer *tr = a->tr;
    pthread_mutex_lock(&tr->acc.lock);
    a->next = NULL;
    if (tr->acc.tail)
        tr->acc.tail->next = a;
    else
        tr->acc.head = a;
    tr->acc.tail = a;
    tr->acc.busy[a->gbuf]++;
    tr->acc.pending++;
    pthread_cond_broadcast(&tr->acc.cv);
    pthread_mutex_unlock(&tr->acc.lock);
}

void zn_accum_drain(zn_trainer *tr)
{
    if (!tr->acc.started)
        return;
    pthread_mutex_lock(&tr->acc.lock);
    while (tr->acc.pending > 0)
        pthread_cond_wait(&tr->acc.cv, &tr->acc.lock);
    pthread_mutex_unlock(&tr->acc.lock);
}
