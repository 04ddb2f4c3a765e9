/* The asynchronous I/O engine. Requests are cut into blocks of block_size
 * (one stripe unit of one swap file each) and queued; worker threads take
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
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nvme/nvme-impl.h"
#include "zinc/util.h"

#define TAG_EVENTFD UINT64_MAX
#define MAX_REGS 32
#define REG_PIECE (1ull << 30) /* io_uring caps one fixed buffer at 1 GiB */
#define MAX_REG_SLOTS 256
#define MAX_NOPROGRESS 16 /* resubmits without progress before giving up */

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

#define HIST_SUB 8
#define HIST_N (64 * HIST_SUB)

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
    zn_reg regs[MAX_REGS];
    int reg_slot_used[MAX_REG_SLOTS];
    int buf_table;           /* fixed-buffer table size per ring */
    atomic_uint_fast64_t seq;
    atomic_uint_fast64_t resubmits;
    uint64_t fault_nth;      /* absolute completion ordinal to fail, 0 none */
    int fault_res;
    zn_aio_stats st;
    uint64_t hist[HIST_N];
    uint64_t hist_n;
};

static int hist_idx(uint64_t v)
{
    if (v < HIST_SUB)
        return (int)v;
    int e = 63 - __builtin_clzll(v);
    int sub = (int)((v >> (e - 3)) & (HIST_SUB - 1));
    return (e - 2) * HIST_SUB + sub;
}

static double hist_val(int i)
{
    if (i < HIST_SUB)
        return i;
    int e = i / HIST_SUB + 2, sub = i % HIST_SUB;
    double lo = (double)((1ull << e) + ((uint64_t)sub << (e - 3)));
    return lo + (double)(1ull << (e - 3)) / 2;
}

zn_aio_config zn_aio_config_default(void)
{
    zn_aio_config c;
    memset(&c, 0, sizeof c);
    c.block_size = 1u << 20;
    c.queue_depth = 8;
    c.intra_op_parallelism = 1;
    c.threads = 0;
    c.single_submit = 0;
    c.overlap_events = 1;
    c.register_buffers = 1;
    c.staging_buffers = 2;
    c.crc = 1;
    return c;
}

/* ---- completion --------------------------------------------------------- */

static const char *tensor_name(const zn_req *r)
{
    return r->rec && r->rec->name ? r->rec->name : "?";
}

/* Under a->lock. */
static void finish_req(zn_aio *a, zn_req *r)
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
        a->hist[hist_idx(dt)]++;
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
        finish_req(a, r);
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
    for (int i = 0; i < MAX_REGS; i++) {
        const zn_reg *g = &a->regs[i];
        if (!g->used || p < g->base || p + len > g->base + g->len)
            continue;
        size_t o = (size_t)(p - g->base), piece = o / REG_PIECE;
        if ((o + len - 1) / REG_PIECE != piece)
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

static void *uring_main(void *arg)
{
    zn_worker *w = arg;
    zn_aio *a = w->a;
    const int qd = a->cfg.queue_depth;
    int *taken = malloc(sizeof(int) * (size_t)qd);
    struct io_uring_cqe **cqes = malloc(sizeof(*cqes) * (size_t)(qd + 2) * 2);
    char msg[768];
    if (!taken || !cqes) {
        /* Without these the worker cannot run; the queue is served by no one
         * and waiters would hang, so fail everything it would take. */
        free(taken);
        free(cqes);
        zn_error("aio worker %d: out of memory", w->idx);
        return NULL;
    }
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
    free(taken);
    free(cqes);
    return NULL;
}

/* ---- thread-pool worker ------------------------------------------------- */

static void *pool_main(void *arg)
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

/* ---- create / destroy ------------------------------------------------------ */

static void wake_workers(zn_aio *a)
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

static int setup_worker(zn_aio *a, zn_worker *w, int idx)
{
    w->a = a;
    w->idx = idx;
    w->efd = -1;
    w->nblks = a->backend == ZN_AIO_BACKEND_URING ? a->cfg.queue_depth : 1;
    w->blks = calloc((size_t)w->nblks, sizeof *w->blks);
    w->staging = calloc((size_t)a->nstaging, sizeof *w->staging);
    w->staging_free = calloc((size_t)a->nstaging, sizeof *w->staging_free);
    if (!w->blks || !w->staging || !w->staging_free)
        return zn_set_error(-ENOMEM, "aio: out of memory for worker %d", idx);
    for (int i = 0; i < w->nblks; i++)
        w->blks[i].staging = -1;
    for (int i = 0; i < a->nstaging; i++) {
        void *p = zn_aio_buffer_alloc(a->cfg.block_size);
        if (!p)
            return -ENOMEM;
        w->staging[i] = p;
        w->staging_free[w->nstaging_free++] = a->nstaging - 1 - i;
    }
    if (a->backend != ZN_AIO_BACKEND_URING)
        return 0;
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int rc = io_uring_queue_init_params((unsigned)a->cfg.queue_depth + 2, &w->ring, &p);
    if (rc < 0)
        return zn_set_error(rc, "aio: io_uring_queue_init(%d): %s", a->cfg.queue_depth + 2,
                            zn_strerror(rc));
    w->has_ring = 1;
    w->efd = eventfd(0, EFD_CLOEXEC);
    if (w->efd < 0)
        return zn_set_error(-errno, "aio: eventfd: %s", strerror(errno));
    return 0;
}

/* Registers the sparse file and buffer tables with every ring. Failure only
 * turns the feature off, with a warning. */
static void setup_fixed(zn_aio *a)
{
    static int warned_files, warned_bufs;
    if (a->backend != ZN_AIO_BACKEND_URING)
        return;
    a->fixed_files = 1;
    for (int i = 0; i < a->nworkers; i++) {
        int rc = io_uring_register_files_sparse(&a->w[i].ring, ZN_AIO_MAX_FILES);
        if (rc < 0) {
            zn_warn_once(&warned_files, "aio: io_uring_register_files_sparse: %s; "
                         "files are not registered", zn_strerror(rc));
            a->fixed_files = 0;
            break;
        }
    }
    if (!a->cfg.register_buffers)
        return;
    a->buf_table = a->nworkers * a->nstaging + MAX_REG_SLOTS;
    a->fixed_bufs = 1;
    for (int i = 0; i < a->nworkers && a->fixed_bufs; i++) {
        zn_worker *w = &a->w[i];
        int rc = io_uring_register_buffers_sparse(&w->ring, (unsigned)a->buf_table);
        if (rc < 0) {
            zn_warn_once(&warned_bufs, "aio: io_uring_register_buffers_sparse: %s; "
                         "buffers are not registered", zn_strerror(rc));
            a->fixed_bufs = 0;
            break;
        }
        for (int j = 0; j < a->nworkers * a->nstaging; j++) {
            zn_worker *o = &a->w[j / a->nstaging];
            struct iovec iov = { o->staging[j % a->nstaging], a->cfg.block_size };
            __u64 tag = 0;
            rc = io_uring_register_buffers_update_tag(&w->ring, (unsigned)j, &iov, &tag, 1);
            if (rc < 0) {
                zn_warn_once(&warned_bufs, "aio: registering staging buffers: %s; "
                             "buffers are not registered", zn_strerror(rc));
                a->fixed_bufs = 0;
                break;
            }
        }
    }
}

int zn_aio_create(zn_aio **out, const zn_aio_config *cfg_in)
{
    static int warned_force, warned_uring;
    zn_aio_config cfg = cfg_in ? *cfg_in : zn_aio_config_default();
    *out = NULL;
    if (cfg.block_size < 4096 || (cfg.block_size & (cfg.block_size - 1)) ||
        cfg.block_size > (1u << 30))
        return zn_set_error(-EINVAL, "aio: block_size %zu must be a power of two "
                            "between 4 KiB and 1 GiB", cfg.block_size);
    if (cfg.queue_depth < 1 || cfg.queue_depth > 4096)
        return zn_set_error(-EINVAL, "aio: queue_depth %d must be in 1..4096", cfg.queue_depth);
    if (cfg.intra_op_parallelism < 1 || cfg.intra_op_parallelism > 64)
        return zn_set_error(-EINVAL, "aio: intra_op_parallelism %d must be in 1..64",
                            cfg.intra_op_parallelism);
    if (cfg.threads < 0 || cfg.threads > 1024)
        return zn_set_error(-EINVAL, "aio: threads %d must be in 0..1024", cfg.threads);
    if (cfg.staging_buffers < 1 || cfg.staging_buffers > 64)
        return zn_set_error(-EINVAL, "aio: staging_buffers %d must be in 1..64",
                            cfg.staging_buffers);
    int env_threads = 0, env_buffered = 0;
    zn_nvme__env_force(&env_threads, &env_buffered);
    if (env_threads || env_buffered)
        zn_warn_once(&warned_force, "ZINC_AIO_FORCE=%s: using %s%s%s", getenv("ZINC_AIO_FORCE"),
                     env_threads ? "the thread pool instead of io_uring" : "",
                     env_threads && env_buffered ? " and " : "",
                     env_buffered ? "buffered I/O instead of O_DIRECT" : "");
    cfg.force_threads |= env_threads;
    cfg.force_buffered |= env_buffered;

    zn_aio *a = calloc(1, sizeof *a);
    if (!a)
        return zn_set_error(-ENOMEM, "aio: out of memory");
    a->cfg = cfg;
    atomic_init(&a->seq, 0);
    atomic_init(&a->resubmits, 0);
    a->fault_nth = cfg.fault_nth;
    a->fault_res = cfg.fault_res;
    for (int i = 0; i < ZN_AIO_MAX_FILES; i++)
        a->files[i].fd = -1;
    int rc;
    if (pthread_mutex_init(&a->lock, NULL) || pthread_cond_init(&a->work_cv, NULL) ||
        pthread_cond_init(&a->done_cv, NULL)) {
        free(a);
        return zn_set_error(-ENOMEM, "aio: pthread init failed");
    }
    a->lock_init = 1;

    char why[200] = "";
    a->backend = ZN_AIO_BACKEND_URING;
    if (cfg.force_threads) {
        snprintf(why, sizeof why, "%s", env_threads ? "forced by ZINC_AIO_FORCE" : "forced by config");
        a->backend = ZN_AIO_BACKEND_THREADS;
    } else if (zn_nvme__try_uring(why, sizeof why) < 0) {
        zn_warn_once(&warned_uring, "io_uring unavailable (%s): using a pread/pwrite thread pool",
                     why);
        a->backend = ZN_AIO_BACKEND_THREADS;
    }
    a->nstaging = a->backend == ZN_AIO_BACKEND_URING ? cfg.staging_buffers : 1;
    a->nworkers = a->backend == ZN_AIO_BACKEND_URING
                      ? cfg.intra_op_parallelism
                      : (cfg.threads ? cfg.threads : cfg.queue_depth * cfg.intra_op_parallelism);
    a->w = calloc((size_t)a->nworkers, sizeof *a->w);
    if (!a->w) {
        rc = zn_set_error(-ENOMEM, "aio: out of memory");
        goto fail;
    }
    for (int i = 0; i < a->nworkers; i++)
        if ((rc = setup_worker(a, &a->w[i], i)) < 0)
            goto fail;
    setup_fixed(a);
    for (int i = 0; i < a->nworkers; i++) {
        zn_worker *w = &a->w[i];
        rc = pthread_create(&w->th, NULL, a->backend == ZN_AIO_BACKEND_URING ? uring_main : pool_main,
                            w);
        if (rc) {
            rc = zn_set_error(-rc, "aio: pthread_create: %s", strerror(rc));
            goto fail;
        }
        w->started = 1;
    }
    if (a->backend == ZN_AIO_BACKEND_URING)
        snprintf(a->desc, sizeof a->desc,
                 "io_uring: %d ring%s x QD %d, block %zu KiB, %s buffers, %s files%s%s",
                 a->nworkers, a->nworkers > 1 ? "s" : "", cfg.queue_depth, cfg.block_size >> 10,
                 a->fixed_bufs ? "fixed" : "unregistered", a->fixed_files ? "fixed" : "plain",
                 cfg.overlap_events ? "" : ", sequential batches",
                 cfg.single_submit ? ", single submit" : "");
    else
        snprintf(a->desc, sizeof a->desc, "thread pool: %d pread/pwrite threads, block %zu KiB (%s)",
                 a->nworkers, cfg.block_size >> 10, why);
    if (cfg.force_buffered) {
        size_t l = strlen(a->desc);
        snprintf(a->desc + l, sizeof a->desc - l, ", buffered I/O (%s)",
                 env_buffered ? "forced by ZINC_AIO_FORCE" : "forced by config");
    }
    *out = a;
    return 0;
fail:
    zn_aio_destroy(a);
    return rc;
}

void zn_aio_destroy(zn_aio *a)
{
    if (!a)
        return;
    if (a->lock_init) {
        pthread_mutex_lock(&a->lock);
        while (a->running)
            pthread_cond_wait(&a->done_cv, &a->lock);
        a->stop = 1;
        if (a->w)
            wake_workers(a);
        pthread_mutex_unlock(&a->lock);
    }
    for (int i = 0; a->w && i < a->nworkers; i++) {
        zn_worker *w = &a->w[i];
        if (w->started)
            pthread_join(w->th, NULL);
        if (w->has_ring)
            io_uring_queue_exit(&w->ring);
        if (w->efd >= 0)
            close(w->efd);
        for (int j = 0; w->staging && j < a->nstaging; j++)
            zn_aio_buffer_free(w->staging[j]);
        free(w->staging);
        free(w->staging_free);
        free(w->blks);
    }
    free(a->w);
    for (uint32_t i = 0; i < a->nslots; i++)
        if (a->slots[i]) {
            free(a->slots[i]->errmsg);
            free(a->slots[i]);
        }
    free(a->slots);
    free(a->gens);
    free(a->free_slots);
    for (int i = 0; i < ZN_AIO_MAX_FILES; i++)
        free(a->files[i].path);
    if (a->lock_init) {
        pthread_mutex_destroy(&a->lock);
        pthread_cond_destroy(&a->work_cv);
        pthread_cond_destroy(&a->done_cv);
    }
    free(a);
}

zn_aio_backend zn_aio_get_backend(const zn_aio *a)
{
    return a->backend;
}

const char *zn_aio_backend_desc(const zn_aio *a)
{
    return a->desc;
}

const zn_aio_config *zn_aio_get_config(const zn_aio *a)
{
    return &a->cfg;
}

/* ---- files and buffers ----------------------------------------------------- */

void *zn_aio_buffer_alloc(size_t len)
{
    static int warned;
    const size_t huge = 2u << 20;
    void *p = NULL;
    size_t n = (len + huge - 1) / huge * huge;
    int rc = posix_memalign(&p, huge, n ? n : huge);
    if (rc) {
        zn_set_error(-rc, "aio: allocating a buffer of %zu bytes: %s", len, strerror(rc));
        return NULL;
    }
    if (madvise(p, n, MADV_HUGEPAGE) < 0)
        zn_warn_once(&warned, "aio: madvise(MADV_HUGEPAGE): %s; I/O buffers use 4 KiB pages "
                     "and large requests may be split", strerror(errno));
    return p;
}

void zn_aio_buffer_free(void *buf)
{
    free(buf);
}

int zn_aio__add_file(zn_aio *a, int fd, const char *path)
{
    pthread_mutex_lock(&a->lock);
    int slot = -1;
    for (int i = 0; i < ZN_AIO_MAX_FILES; i++)
        if (!a->files[i].used) {
            slot = i;
            break;
        }
    if (slot < 0) {
        pthread_mutex_unlock(&a->lock);
        return zn_set_error(-EMFILE, "aio: more than %d swap files on one engine (%s)",
                            ZN_AIO_MAX_FILES, path);
    }
    char *cp = strdup(path);
    if (!cp) {
        pthread_mutex_unlock(&a->lock);
        return zn_set_error(-ENOMEM, "aio: out of memory");
    }
    a->files[slot].used = 1;
    a->files[slot].fd = fd;
    a->files[slot].path = cp;
    int rc = 0;
    for (int i = 0; a->fixed_files && i < a->nworkers; i++) {
        rc = io_uring_register_files_update(&a->w[i].ring, (unsigned)slot, &fd, 1);
        if (rc < 0) {
            rc = zn_set_error(rc, "aio: registering file %s with io_uring: %s", path,
                              zn_strerror(rc));
            int none = -1;
            for (int j = 0; j < i; j++)
                io_uring_register_files_update(&a->w[j].ring, (unsigned)slot, &none, 1);
            a->files[slot].used = 0;
            a->files[slot].fd = -1;
            free(a->files[slot].path);
            a->files[slot].path = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&a->lock);
    return rc < 0 ? rc : slot;
}

void zn_aio__remove_file(zn_aio *a, int slot)
{
    if (slot < 0 || slot >= ZN_AIO_MAX_FILES)
        return;
    pthread_mutex_lock(&a->lock);
    int none = -1;
    for (int i = 0; a->fixed_files && i < a->nworkers; i++) {
        int rc = io_uring_register_files_update(&a->w[i].ring, (unsigned)slot, &none, 1);
        if (rc < 0)
            zn_warn("aio: unregistering %s: %s", a->files[slot].path, zn_strerror(rc));
    }
    a->files[slot].used = 0;
    a->files[slot].fd = -1;
    free(a->files[slot].path);
    a->files[slot].path = NULL;
    pthread_mutex_unlock(&a->lock);
}

int zn_aio_register_buffer(zn_aio *a, void *buf, size_t len)
{
    if (!buf || !len)
        return zn_set_error(-EINVAL, "aio: registering an empty buffer");
    int npieces = (int)((len + REG_PIECE - 1) / REG_PIECE);
    pthread_mutex_lock(&a->lock);
    int id = -1;
    for (int i = 0; i < MAX_REGS; i++)
        if (!a->regs[i].used) {
            id = i;
            break;
        }
    int first = -1;
    for (int i = 0; id >= 0 && i + npieces <= MAX_REG_SLOTS; i++) {
        int ok = 1;
        for (int j = 0; j < npieces && ok; j++)
            ok = !a->reg_slot_used[i + j];
        if (ok) {
            first = i;
            break;
        }
    }
    if (id < 0 || first < 0) {
        pthread_mutex_unlock(&a->lock);
        return zn_set_error(-ENOSPC, "aio: too many registered buffers (%d at most, %d GiB pieces)",
                            MAX_REGS, MAX_REG_SLOTS);
    }
    int base_slot = a->nworkers * a->nstaging + first;
    int rc = 0;
    for (int i = 0; a->fixed_bufs && i < a->nworkers && rc == 0; i++) {
        for (int j = 0; j < npieces; j++) {
            size_t o = (size_t)j * REG_PIECE;
            struct iovec iov = { (char *)buf + o, len - o < REG_PIECE ? len - o : REG_PIECE };
            __u64 tag = 0;
            rc = io_uring_register_buffers_update_tag(&a->w[i].ring, (unsigned)(base_slot + j),
                                                      &iov, &tag, 1);
            if (rc < 0) {
                rc = zn_set_error(rc, "aio: registering a buffer of %zu bytes with io_uring: %s "
                                  "(RLIMIT_MEMLOCK?)", len, zn_strerror(rc));
                break;
            }
        }
    }
    if (rc < 0) {
        struct iovec none = { NULL, 0 };
        __u64 tag = 0;
        for (int i = 0; i < a->nworkers; i++)
            for (int j = 0; j < npieces; j++)
                io_uring_register_buffers_update_tag(&a->w[i].ring, (unsigned)(base_slot + j),
                                                     &none, &tag, 1);
        pthread_mutex_unlock(&a->lock);
        return rc;
    }
    for (int j = 0; j < npieces; j++)
        a->reg_slot_used[first + j] = 1;
    a->regs[id] = (zn_reg){ buf, len, base_slot, npieces, 1 };
    pthread_mutex_unlock(&a->lock);
    return id;
}

int zn_aio_unregister_buffer(zn_aio *a, int id)
{
    if (id < 0 || id >= MAX_REGS)
        return zn_set_error(-ENOENT, "aio: no registered buffer %d", id);
    pthread_mutex_lock(&a->lock);
    zn_reg *g = &a->regs[id];
    if (!g->used) {
        pthread_mutex_unlock(&a->lock);
        return zn_set_error(-ENOENT, "aio: no registered buffer %d", id);
    }
    struct iovec none = { NULL, 0 };
    __u64 tag = 0;
    for (int i = 0; a->fixed_bufs && i < a->nworkers; i++)
        for (int j = 0; j < g->nslots; j++) {
            int rc = io_uring_register_buffers_update_tag(&a->w[i].ring,
                                                          (unsigned)(g->first_slot + j), &none,
                                                          &tag, 1);
            if (rc < 0)
                zn_warn("aio: unregistering buffer %d: %s", id, zn_strerror(rc));
        }
    int first = g->first_slot - a->nworkers * a->nstaging;
    for (int j = 0; j < g->nslots; j++)
        a->reg_slot_used[first + j] = 0;
    memset(g, 0, sizeof *g);
    pthread_mutex_unlock(&a->lock);
    return 0;
}

/* ---- requests ------------------------------------------------------------ */

/* Under a->lock. */
static int new_slot(zn_aio *a, zn_req *r)
{
    if (!a->nfree_slots) {
        uint32_t n = a->nslots ? a->nslots * 2 : 64;
        zn_req **s = realloc(a->slots, n * sizeof *s);
        if (!s)
            return -ENOMEM;
        a->slots = s;
        uint32_t *g = realloc(a->gens, n * sizeof *g);
        if (!g)
            return -ENOMEM;
        a->gens = g;
        uint32_t *f = realloc(a->free_slots, n * sizeof *f);
        if (!f)
            return -ENOMEM;
        a->free_slots = f;
        for (uint32_t i = n; i > a->nslots; i--) {
            a->slots[i - 1] = NULL;
            a->gens[i - 1] = 1;
            a->free_slots[a->nfree_slots++] = i - 1;
        }
        a->nslots = n;
    }
    uint32_t i = a->free_slots[--a->nfree_slots];
    a->slots[i] = r;
    r->handle = ((uint64_t)a->gens[i] << 32) | i;
    return 0;
}

/* Under a->lock. */
static zn_req *lookup(zn_aio *a, zn_aio_handle h)
{
    uint32_t i = (uint32_t)h, gen = (uint32_t)(h >> 32);
    if (!h || i >= a->nslots || a->gens[i] != gen || !a->slots[i])
        return NULL;
    return a->slots[i];
}

/* Under a->lock: frees a done request and returns its status, setting the
 * calling thread's error message. */
static int release(zn_aio *a, zn_req *r)
{
    uint32_t i = (uint32_t)r->handle;
    int st = r->status;
    if (st)
        zn_set_error(st, "%s", r->errmsg ? r->errmsg : zn_strerror(st));
    a->slots[i] = NULL;
    a->gens[i]++;
    if (!a->gens[i])
        a->gens[i] = 1;
    a->free_slots[a->nfree_slots++] = i;
    a->live--;
    free(r->errmsg);
    free(r);
    return st;
}

static int submit(zn_aio *a, const zn_extent *e, void *buf, size_t len, int is_write,
                  zn_aio_handle *out)
{
    *out = 0;
    if (!e || !e->swap)
        return zn_set_error(-EINVAL, "aio: request without an extent");
    zn_swap *s = e->swap;
    if (s->aio != a)
        return zn_set_error(-EINVAL, "aio: the extent belongs to a swap space of another engine");
    if (len && !buf)
        return zn_set_error(-EINVAL, "aio: NULL buffer for %zu bytes", len);
    zn_ext_rec *rec;
    int rc = zn_swap__lookup(s, e, &rec);
    if (rc)
        return rc;
    if (len > rec->bytes)
        return zn_set_error(-EINVAL, "aio: %s of %zu bytes to tensor '%s' whose extent holds %" PRIu64,
                            is_write ? "write" : "read", len, rec->name, rec->bytes);
    if (!is_write && len > rec->written)
        return zn_set_error(-EINVAL, "aio: read of %zu bytes of tensor '%s' but only %" PRIu64
                            " were written", len, rec->name, rec->written);
    zn_req *r = calloc(1, sizeof *r);
    if (!r)
        return zn_set_error(-ENOMEM, "aio: out of memory");
    r->is_write = is_write;
    r->buf = buf;
    r->len = len;
    r->swap = s;
    r->rec = rec;
    atomic_fetch_add(&rec->inflight, 1);
    pthread_mutex_lock(&a->lock);
    if (a->stop) {
        pthread_mutex_unlock(&a->lock);
        atomic_fetch_sub(&rec->inflight, 1);
        free(r);
        return zn_set_error(-ESHUTDOWN, "aio: engine is shutting down");
    }
    if (new_slot(a, r)) {
        pthread_mutex_unlock(&a->lock);
        atomic_fetch_sub(&rec->inflight, 1);
        free(r);
        return zn_set_error(-ENOMEM, "aio: out of memory");
    }
    r->seq = ++a->submit_seq;
    a->live++;
    a->running++;
    if (len == 0) {
        if (is_write)
            rec->written = 0;
        r->next_off = 0;
        finish_req(a, r);
    } else {
        if (a->qtail)
            a->qtail->next = r;
        else
            a->qhead = r;
        a->qtail = r;
        wake_workers(a);
    }
    *out = r->handle;
    pthread_mutex_unlock(&a->lock);
    return 0;
}

int zn_aio_submit_write(zn_aio *a, const zn_extent *e, const void *buf, size_t len,
                        zn_aio_handle *out)
{
    return submit(a, e, (void *)buf, len, 1, out);
}

int zn_aio_submit_read(zn_aio *a, const zn_extent *e, void *buf, size_t len, zn_aio_handle *out)
{
    return submit(a, e, buf, len, 0, out);
}

int zn_aio_wait(zn_aio *a, zn_aio_handle h)
{
    pthread_mutex_lock(&a->lock);
    zn_req *r = lookup(a, h);
    if (!r) {
        pthread_mutex_unlock(&a->lock);
        return zn_set_error(-ENOENT, "aio: unknown or already released handle 0x%" PRIx64, h);
    }
    while (!r->done)
        pthread_cond_wait(&a->done_cv, &a->lock);
    int st = release(a, r);
    pthread_mutex_unlock(&a->lock);
    return st;
}

int zn_aio_poll(zn_aio *a, zn_aio_handle h)
{
    pthread_mutex_lock(&a->lock);
    zn_req *r = lookup(a, h);
    if (!r) {
        pthread_mutex_unlock(&a->lock);
        return zn_set_error(-ENOENT, "aio: unknown or already released handle 0x%" PRIx64, h);
    }
    int st = r->done ? release(a, r) : -EINPROGRESS;
    pthread_mutex_unlock(&a->lock);
    return st;
}

int zn_aio_wait_all(zn_aio *a)
{
    pthread_mutex_lock(&a->lock);
    while (a->running)
        pthread_cond_wait(&a->done_cv, &a->lock);
    zn_req *first = NULL;
    for (uint32_t i = 0; i < a->nslots; i++) {
        zn_req *r = a->slots[i];
        if (r && r->status && (!first || r->seq < first->seq))
            first = r;
    }
    int st = 0;
    if (first) {
        st = first->status;
        zn_set_error(st, "%s", first->errmsg ? first->errmsg : zn_strerror(st));
    }
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", st ? zn_last_error() : "");
    for (uint32_t i = 0; i < a->nslots; i++)
        if (a->slots[i])
            release(a, a->slots[i]);
    if (st)
        zn_set_error(st, "%s", keep);
    pthread_mutex_unlock(&a->lock);
    return st;
}

void zn_aio_inject_fault(zn_aio *a, uint64_t nth, int res)
{
    uint64_t now = atomic_load(&a->seq);
    __atomic_store_n(&a->fault_res, res, __ATOMIC_RELEASE);
    __atomic_store_n(&a->fault_nth, nth && res ? now + nth : 0, __ATOMIC_RELEASE);
}

void zn_aio_get_stats(zn_aio *a, zn_aio_stats *out)
{
    pthread_mutex_lock(&a->lock);
    *out = a->st;
    out->resubmits = atomic_load(&a->resubmits);
    if (a->hist_n) {
        uint64_t c = 0, p50 = (a->hist_n + 1) / 2, p99 = (a->hist_n * 99 + 99) / 100;
        int have50 = 0, have99 = 0;
        for (int i = 0; i < HIST_N; i++) {
            if (!a->hist[i])
                continue;
            c += a->hist[i];
            if (!have50 && c >= p50) {
                out->lat_p50_us = hist_val(i) / 1e3;
                have50 = 1;
            }
            if (!have99 && c >= p99) {
                out->lat_p99_us = hist_val(i) / 1e3;
                have99 = 1;
            }
            out->lat_max_us = hist_val(i) / 1e3;
        }
    }
    pthread_mutex_unlock(&a->lock);
}

void zn_aio_reset_stats(zn_aio *a)
{
    pthread_mutex_lock(&a->lock);
    memset(&a->st, 0, sizeof a->st);
    atomic_store(&a->resubmits, 0);
    memset(a->hist, 0, sizeof a->hist);
    a->hist_n = 0;
    pthread_mutex_unlock(&a->lock);
}
