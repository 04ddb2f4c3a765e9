/* The asynchronous I/O engine's lifetime and tables: the configuration,
 * create (backend choice, workers, rings, fixed file and buffer tables) and
 * destroy, the swap files' slots and the caller's registered buffers. */
#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nvme/nvme-impl.h"
#include "zinc/util.h"

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

/* ---- create / destroy ------------------------------------------------------ */

static int setup_worker(zn_aio *a, zn_worker *w, int idx)
{
    w->a = a;
    w->idx = idx;
    w->efd = -1;
    w->nblks = a->backend == ZN_AIO_BACKEND_URING ? a->cfg.queue_depth : 1;
    w->blks = calloc((size_t)w->nblks, sizeof *w->blks);
    w->staging = calloc((size_t)a->nstaging, sizeof *w->staging);
    w->staging_free = calloc((size_t)a->nstaging, sizeof *w->staging_free);
    if (a->backend == ZN_AIO_BACKEND_URING) {
        w->taken = malloc(sizeof *w->taken * (size_t)a->cfg.queue_depth);
        w->cqes = malloc(sizeof *w->cqes * (size_t)(a->cfg.queue_depth + 2) * 2);
        if (!w->taken || !w->cqes)
            return zn_set_error(-ENOMEM, "aio: out of memory for worker %d", idx);
    }
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
    a->buf_table = a->nworkers * a->nstaging + ZN_AIO_MAX_REG_SLOTS;
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
        rc = pthread_create(&w->th, NULL, a->backend == ZN_AIO_BACKEND_URING ? zn_aio__uring_main : zn_aio__pool_main,
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
            zn_aio__wake_workers(a);
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
        free(w->taken);
        free(w->cqes);
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
    int npieces = (int)((len + ZN_AIO_REG_PIECE - 1) / ZN_AIO_REG_PIECE);
    pthread_mutex_lock(&a->lock);
    int id = -1;
    for (int i = 0; i < ZN_AIO_MAX_REGS; i++)
        if (!a->regs[i].used) {
            id = i;
            break;
        }
    int first = -1;
    for (int i = 0; id >= 0 && i + npieces <= ZN_AIO_MAX_REG_SLOTS; i++) {
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
                            ZN_AIO_MAX_REGS, ZN_AIO_MAX_REG_SLOTS);
    }
    int base_slot = a->nworkers * a->nstaging + first;
    int rc = 0;
    for (int i = 0; a->fixed_bufs && i < a->nworkers && rc == 0; i++) {
        for (int j = 0; j < npieces; j++) {
            size_t o = (size_t)j * ZN_AIO_REG_PIECE;
            struct iovec iov = { (char *)buf + o, len - o < ZN_AIO_REG_PIECE ? len - o : ZN_AIO_REG_PIECE };
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
    if (id < 0 || id >= ZN_AIO_MAX_REGS)
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
