/* The engine's workers. Requests are cut into blocks of block_size (one
 * stripe unit of one swap file each) and queued; worker threads take
 * blocks from the one locked queue: an io_uring worker keeps up to
 * queue_depth of them in flight on its own ring, a pool worker does one
 * pread/pwrite at a time. Completion (crc check, short-count resume, error
 * text) runs on the worker; waiters sleep on a condition variable. */
#include <errno.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nvme/nvme-impl.h"
#include "zinc/util.h"

#define TAG_EVENTFD UINT64_MAX
#define MAX_NOPROGRESS 16 /* resubmits without progress before giving up */

/* ---- completion --------------------------------------------------------- */

static const char *tensor_name(const zn_req *r)
{
    return r->rec && r->rec->name ? r->rec->name : "?";
}

/* Under a->lock. */
void zn_aio__finish_req(zn_aio *a, zn_req *r)
{
    r->done = 1;
    a->running--;
    if (r->status == 0) {
        if (r->is_write) {
            r->rec->written = r->len;
            a->st.writes++;
            a->st.bytes_written += r->len;
        } else {
            a->st.reads++;
            a->st.bytes_read += r->len;
        }
    } else {
        if (r->is_write)
            r->rec->written = 0; /* what is on disk is not what was asked */
        a->st.errors++;
    }
    if (r->rec)
        atomic_fetch_sub(&r->rec->inflight, 1);
    pthread_cond_broadcast(&a->done_cv);
}

static void dequeue(zn_aio *a, zn_req *r)
{
    zn_req **pp = &a->qhead, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = r->next;
    if (a->qtail == r)
        a->qtail = prev;
    r->next = NULL;
}

/* A block finished with status (0 or negative) and, on failure, a message.
 * Under a->lock. */
static void complete_block(zn_aio *a, zn_blk *b, int status, const char *msg)
{
    zn_req *r = b->req;
    a->st.blocks++;
    if (a->cfg.collect_latency) {
        uint64_t dt = zn_now_ns() - b->t0;
        a->hist[zn_aio__hist_idx(dt)]++;
        a->hist_n++;
    }
    if (status == ZN_ECORRUPT)
        a->st.crc_mismatches++;
    if (status && !r->status) {
        r->status = status;
        free(r->errmsg);
        r->errmsg = strdup(msg ? msg : zn_strerror(status));
        /* Stop handing out its remaining blocks; the ones in flight end. */
        if (r->next_off < r->len) {
            r->next_off = r->len;
            dequeue(a, r);
        }
    }
    r->inflight--;
    if (r->inflight == 0 && r->next_off >= r->len)
        zn_aio__finish_req(a, r);
    b->busy = 0;
    b->req = NULL;
}

static void block_error(const zn_blk *b, int res, char *msg, size_t n)
{
    const zn_req *r = b->req;
    snprintf(msg, n, "%s tensor '%s' (%u bytes at byte %zu of the tensor) %s file %s "
             "at offset %" PRIu64 ": %s",
             r->is_write ? "writing" : "reading", tensor_name(r), b->len, b->roff,
             r->is_write ? "to" : "from", r->swap->path[b->file], b->foff + b->done,
             zn_strerror(res));
}

/* Applies fault injection to one raw result. */
static int fault(zn_aio *a, const zn_blk *b, int res)
{
    uint64_t seq = atomic_fetch_add(&a->seq, 1) + 1;
    uint32_t want = b->io_len - b->done;
    uint64_t nth = __atomic_load_n(&a->fault_nth, __ATOMIC_ACQUIRE);
    if (nth && seq == nth) {
        int fr = __atomic_load_n(&a->fault_res, __ATOMIC_ACQUIRE);
        if (fr > 0)
            res = (uint32_t)fr < want ? fr : (int)(want / 2);
        else if (fr < 0)
            res = fr;
    }
    if (a->cfg.fault_hook) {
        zn_aio_fault_site site = {
            .seq = seq,
            .is_write = b->req->is_write,
            .path = b->req->swap->path[b->file],
            .offset = b->foff + b->done,
            .len = want,
            .res = res,
        };
        res = a->cfg.fault_hook(a->cfg.fault_user, &site);
    }
    return res;
}

/* Interprets a raw result. Returns 1 when the block is complete, 0 when the
 * rest must be resubmitted, or a negative status (message in msg). */
static int account(zn_aio *a, zn_blk *b, int res, char *msg, size_t n)
{
    uint32_t want = b->io_len - b->done;
    if (res == -EAGAIN || res == -EINTR) {
        if (++b->noprogress > MAX_NOPROGRESS) {
            block_error(b, res, msg, n);
            return res;
        }
        return 0;
    }
    if (res < 0) {
        block_error(b, res, msg, n);
        return res;
    }
    if ((uint32_t)res >= want) {
        b->done = b->io_len;
        return 1;
    }
    if (res == 0) {
        block_error(b, -EIO, msg, n);
        size_t l = strlen(msg);
        snprintf(msg + l, n - l, " (%s returned 0 bytes)", b->req->is_write ? "write" : "read");
        return -EIO;
    }
    /* Short count: resume from the last aligned byte (O_DIRECT needs it). */
    uint32_t align = b->req->swap->align;
    uint32_t got = (uint32_t)res / align * align;
    if (got == 0 && ++b->noprogress > MAX_NOPROGRESS) {
        block_error(b, -EIO, msg, n);
        return -EIO;
    }
    if (got)
        b->noprogress = 0;
    b->done += got;
    return 0;
}

/* After the last byte of a block: bounce-copy and crc check of reads.
 * Returns 0 or ZN_ECORRUPT with a message. Outside the lock. */
static int block_done_data(zn_aio *a, zn_blk *b, char *msg, size_t n)
{
    zn_req *r = b->req;
    if (r->is_write)
        return 0;
    unsigned char *dst = r->buf + b->roff;
    if (b->staging >= 0)
        memcpy(dst, b->iobuf, b->len);
    if (!a->cfg.crc)
        return 0;
    zn_ext_rec *rec = r->rec;
    uint64_t bs = r->swap->stripe;
    uint32_t u = (uint32_t)(b->roff / bs);
    /* The stored crc covers [u*bs, min((u+1)*bs, written)); check it when
     * this block covers exactly that. */
    uint64_t wend = rec->written < (uint64_t)(u + 1) * bs ? rec->written : (uint64_t)(u + 1) * bs;
    if (b->roff + b->len != wend || u >= rec->nunits)
        return 0;
    uint32_t c = zn_crc32c(0, dst, b->len);
    if (c != rec->crc[u]) {
        snprintf(msg, n, "crc32c mismatch reading tensor '%s' (%u bytes at byte %zu of the "
                 "tensor) from file %s at offset %" PRIu64 ": stored 0x%08x, read 0x%08x",
                 tensor_name(r), b->len, b->roff, r->swap->path[b->file], b->foff,
                 rec->crc[u], c);
        return ZN_ECORRUPT;
    }
    return 0;
}

/* ---- taking blocks off the queue ---------------------------------------- */

static int find_fixed(zn_aio *a, const unsigned char *p, size_t len)
{
    if (!a->fixed_bufs)
        return -1;
    for (int i = 0; i < ZN_AIO_MAX_REGS; i++) {
        const zn_reg *g = &a->regs[i];
        if (!g->used || p < g->base || p + len > g->base + g->len)
            continue;
        size_t o = (size_t)(p - g->base), piece = o / ZN_AIO_REG_PIECE;
        if ((o + len - 1) / ZN_AIO_REG_PIECE != piece)
            return -1;
        return g->first_slot + (int)piece;
    }
    return -1;
}

/* Hands the next block of the queue head to worker w (blk b). Returns 1,
 * or 0 when there is nothing to take (or no staging buffer for it).
 * Under a->lock. */
static int take_block(zn_aio *a, zn_worker *w, zn_blk *b)
{
    zn_req *r = a->qhead;
    if (!r)
        return 0;
    zn_swap *s = r->swap;
    uint64_t bs = s->stripe;
    uint64_t pos = r->rec->offset + r->next_off;
    size_t len = bs - pos % bs;
    if (len > r->len - r->next_off)
        len = r->len - r->next_off;
    unsigned char *p = r->buf + r->next_off;
    uint32_t io_len = (uint32_t)((len + s->align - 1) / s->align * s->align);
    int bounce = s->direct && (((uintptr_t)p % s->mem_align) || io_len != len);
    int st = -1;
    if (bounce) {
        if (!w->nstaging_free)
            return 0;
        st = w->staging_free[--w->nstaging_free];
    }
    uint64_t unit = pos / bs;
    b->req = r;
    b->roff = r->next_off;
    b->len = (uint32_t)len;
    b->io_len = io_len;
    b->done = 0;
    b->file = (int)(unit % (uint64_t)s->npaths);
    b->fd = s->fd[b->file];
    b->fixed_file = a->fixed_files ? s->slot[b->file] : -1;
    b->foff = unit / (uint64_t)s->npaths * bs + pos % bs;
    b->staging = st;
    b->iobuf = st >= 0 ? w->staging[st] : p;
    b->fixed_buf = st >= 0 ? (a->fixed_bufs ? w->idx * a->nstaging + st : -1)
                           : find_fixed(a, p, io_len);
    b->noprogress = 0;
    b->busy = 1;
    if (st >= 0)
        a->st.bounced++;
    r->next_off += len;
    r->inflight++;
    if (r->next_off >= r->len)
        dequeue(a, r);
    return 1;
}

/* Work done on a taken block before its first submission, outside the lock:
 * crc of written data, copy into the staging buffer with zero padding. */
static void prepare_block(zn_aio *a, zn_blk *b)
{
    zn_req *r = b->req;
    if (!r->is_write)
        return;
    const unsigned char *src = r->buf + b->roff;
    if (a->cfg.crc) {
        uint32_t u = (uint32_t)(b->roff / r->swap->stripe);
        if (u < r->rec->nunits)
            r->rec->crc[u] = zn_crc32c(0, src, b->len);
    }
    if (b->staging >= 0) {
        memcpy(b->iobuf, src, b->len);
        memset(b->iobuf + b->len, 0, b->io_len - b->len);
    }
}

static void release_staging(zn_worker *w, zn_blk *b)
{
    if (b->staging >= 0) {
        w->staging_free[w->nstaging_free++] = b->staging;
        b->staging = -1;
    }
}

/* ---- io_uring worker ----------------------------------------------------- */

static void arm_eventfd(zn_worker *w)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
    if (!sqe) {
        io_uring_submit(&w->ring);
        sqe = io_uring_get_sqe(&w->ring);
    }
    if (!sqe)
        return; /* cannot happen: the ring has room for QD + 2 */
    io_uring_prep_read(sqe, w->efd, &w->efd_val, sizeof w->efd_val, 0);
    io_uring_sqe_set_data64(sqe, TAG_EVENTFD);
}

/* Queues one SQE for the rest of block b. Returns 0 or -EBUSY (no SQE). */
static int queue_sqe(zn_aio *a, zn_worker *w, zn_blk *b)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
    if (!sqe) {
        io_uring_submit(&w->ring);
        sqe = io_uring_get_sqe(&w->ring);
        if (!sqe)
            return -EBUSY;
    }
    int fd = b->fixed_file >= 0 ? b->fixed_file : b->fd;
    unsigned char *p = b->iobuf + b->done;
    unsigned n = b->io_len - b->done;
    uint64_t off = b->foff + b->done;
    if (b->req->is_write) {
        if (b->fixed_buf >= 0)
            io_uring_prep_write_fixed(sqe, fd, p, n, off, b->fixed_buf);
        else
            io_uring_prep_write(sqe, fd, p, n, off);
    } else {
        if (b->fixed_buf >= 0)
            io_uring_prep_read_fixed(sqe, fd, p, n, off, b->fixed_buf);
        else
            io_uring_prep_read(sqe, fd, p, n, off);
    }
    if (b->fixed_file >= 0)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, (uint64_t)(b - w->blks));
    if (a->cfg.single_submit)
        io_uring_submit(&w->ring);
    return 0;
}

void *zn_aio__uring_main(void *arg)
{
    zn_worker *w = arg;
    zn_aio *a = w->a;
    const int qd = a->cfg.queue_depth;
    int *taken = w->taken;
    struct io_uring_cqe **cqes = w->cqes;
    char msg[768];
    arm_eventfd(w);
    io_uring_submit(&w->ring);
    for (;;) {
        int ntaken = 0;
        pthread_mutex_lock(&a->lock);
        if (a->stop && !a->qhead && w->inflight == 0) {
            pthread_mutex_unlock(&a->lock);
            break;
        }
        if (a->cfg.overlap_events || w->inflight == 0) {
            while (w->inflight + ntaken < qd) {
                int bi = -1;
                for (int i = 0; i < w->nblks; i++)
                    if (!w->blks[i].busy) {
                        bi = i;
                        break;
                    }
                if (bi < 0 || !take_block(a, w, &w->blks[bi]))
                    break;
                taken[ntaken++] = bi;
            }
        }
        w->sleeping = (w->inflight + ntaken < qd) ? 1 : 0;
        pthread_mutex_unlock(&a->lock);

        for (int i = 0; i < ntaken; i++) {
            zn_blk *b = &w->blks[taken[i]];
            prepare_block(a, b);
            b->t0 = zn_now_ns();
            if (queue_sqe(a, w, b)) {
                snprintf(msg, sizeof msg, "io_uring submission queue full");
                pthread_mutex_lock(&a->lock);
                release_staging(w, b);
                complete_block(a, b, ZN_EINTERNAL, msg);
                pthread_mutex_unlock(&a->lock);
                continue;
            }
            w->inflight++;
        }
        int rc;
        do {
            rc = io_uring_submit_and_wait(&w->ring, 1);
        } while (rc == -EINTR);
        if (rc < 0 && rc != -EBUSY && rc != -EAGAIN) {
            /* The ring is broken: fail what is in flight so no one hangs. */
            zn_error("aio worker %d: io_uring_submit_and_wait: %s", w->idx, zn_strerror(rc));
            pthread_mutex_lock(&a->lock);
            for (int i = 0; i < w->nblks; i++)
                if (w->blks[i].busy) {
                    snprintf(msg, sizeof msg, "io_uring_submit_and_wait: %s", zn_strerror(rc));
                    release_staging(w, &w->blks[i]);
                    complete_block(a, &w->blks[i], rc, msg);
                }
            w->inflight = 0;
            pthread_mutex_unlock(&a->lock);
            continue;
        }
        unsigned n = io_uring_peek_batch_cqe(&w->ring, cqes, (unsigned)(qd + 2) * 2);
        /* Results first, then one lock for the bookkeeping. */
        int resubmit = 0;
        for (unsigned i = 0; i < n; i++) {
            uint64_t tag = io_uring_cqe_get_data64(cqes[i]);
            int res = cqes[i]->res;
            if (tag == TAG_EVENTFD) {
                arm_eventfd(w);
                resubmit = 1;
                continue;
            }
            zn_blk *b = &w->blks[tag];
            res = fault(a, b, res);
            int st = account(a, b, res, msg, sizeof msg);
            if (st == 0) {
                atomic_fetch_add(&a->resubmits, 1);
                if (queue_sqe(a, w, b) == 0) {
                    resubmit = 1;
                    continue;
                }
                st = ZN_EINTERNAL;
                snprintf(msg, sizeof msg, "io_uring submission queue full");
            }
            if (st == 1)
                st = block_done_data(a, b, msg, sizeof msg);
            pthread_mutex_lock(&a->lock);
            release_staging(w, b);
            complete_block(a, b, st, msg);
            pthread_mutex_unlock(&a->lock);
            w->inflight--;
        }
        io_uring_cq_advance(&w->ring, n);
        if (resubmit)
            io_uring_submit(&w->ring);
    }
    return NULL;
}

/* ---- thread-pool worker ------------------------------------------------- */

void *zn_aio__pool_main(void *arg)
{
    zn_worker *w = arg;
    zn_aio *a = w->a;
    zn_blk *b = &w->blks[0];
    char msg[768];
    pthread_mutex_lock(&a->lock);
    for (;;) {
        while (!a->stop && !a->qhead)
            pthread_cond_wait(&a->work_cv, &a->lock);
        if (!a->qhead && a->stop)
            break;
        if (!take_block(a, w, b)) {
            pthread_cond_wait(&a->work_cv, &a->lock); /* cannot happen: own staging */
            continue;
        }
        pthread_mutex_unlock(&a->lock);
        prepare_block(a, b);
        b->t0 = zn_now_ns();
        int st;
        for (;;) {
            ssize_t res;
            unsigned char *p = b->iobuf + b->done;
            size_t n = b->io_len - b->done;
            off_t off = (off_t)(b->foff + b->done);
            res = b->req->is_write ? pwrite(b->fd, p, n, off) : pread(b->fd, p, n, off);
            st = account(a, b, fault(a, b, res < 0 ? -errno : (int)res), msg, sizeof msg);
            if (st != 0)
                break;
            atomic_fetch_add(&a->resubmits, 1);
        }
        if (st == 1)
            st = block_done_data(a, b, msg, sizeof msg);
        pthread_mutex_lock(&a->lock);
        release_staging(w, b);
        complete_block(a, b, st, msg);
    }
    pthread_mutex_unlock(&a->lock);
    return NULL;
}

/* ---- waking the workers ------------------------------------------------- */

void zn_aio__wake_workers(zn_aio *a)
{
    if (a->backend == ZN_AIO_BACKEND_THREADS) {
        pthread_cond_broadcast(&a->work_cv);
        return;
    }
    for (int i = 0; i < a->nworkers; i++) {
        zn_worker *w = &a->w[i];
        if (w->sleeping || a->stop) {
            w->sleeping = 0;
            uint64_t one = 1;
            if (write(w->efd, &one, sizeof one) != sizeof one)
                zn_warn("aio: waking worker %d: %s", i, strerror(errno));
        }
    }
}
