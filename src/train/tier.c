/* The tier manager: every tensor of the training state with its home tier
 * and the tiers that hold a valid copy, allocated once from three budgeted
 * allocators (the device arena, pinned host memory, the NVMe swap space),
 * plus the bytes moved on each link. And the NVMe completion queues that
 * give each I/O direction its own thread. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/train-impl.h"
#include "util/fs-impl.h"

int zn_tier_init(zn_tier_mgr *m, zn_dev *dev, const zn_plan_budgets *b)
{
    memset(m, 0, sizeof *m);
    m->dev = dev;
    for (int t = 0; t < ZN_TIER_COUNT; t++)
        m->budget[t] = b->bytes[t];
    if (pthread_mutex_init(&m->lock, NULL))
        return zn_set_error(-ENOMEM, "tier manager: mutex init failed");
    return 0;
}

int zn_tier_open_nvme(zn_tier_mgr *m, const zn_spec *sp, uint64_t bytes,
                      zn_aio_fault_fn hook, void *hook_user)
{
    char b1[32], b2[32];
    if (bytes > m->budget[ZN_TIER_NVME])
        return zn_set_error(ZN_EBUDGET, "nvme tier: the swap space needs %s, its budget is %s",
                            zn_format_size(bytes, b1, sizeof b1),
                            zn_format_size(m->budget[ZN_TIER_NVME], b2, sizeof b2));
    if (sp->nvme_error[0])
        return zn_set_error(ZN_ECONFIG, "%s", sp->nvme_error);
    zn_aio_config ac = sp->aio;
    ac.fault_hook = hook;
    ac.fault_user = hook_user;
    int rc = zn_aio_create(&m->aio, &ac);
    if (rc)
        return zn_error_prefix(rc, "nvme tier");

    zn_swap_config sc = zn_swap_config_default();
    int np = sp->n_nvme;
    if (!np)
        return zn_set_error(ZN_ECONFIG, "%s: state is placed on nvme but no swap folder is "
                            "given", sp->source ? sp->source : "run");
    /* each folder there, or made when the spec says the run may, and used
     * as its real path: messages and the run directory name where the swap
     * really is when a symbolic link leads there */
    char *real[ZN_SWAP_MAX_PATHS] = { 0 };
    for (int i = 0; i < np && !rc; i++) {
        const char *path = sp->nvme_path[i];
        if (sp->nvme_create[i]) {
            if ((rc = zn_fs_mkdir_p(path, 0700))) {
                zn_error_prefix(rc, "nvme tier: creating the swap folder %s "
                                "(tiers.create_nvme_path)", path);
                break;
            }
            zn_info("nvme tier: created the swap folder %s (tiers.create_nvme_path)", path);
        }
        if (!(real[i] = realpath(path, NULL))) {
            rc = zn_set_error(-errno, "nvme tier: resolving the swap folder %s: %s", path,
                              strerror(errno));
            break;
        }
        sc.paths[i] = real[i];
    }
    if (rc) {
        for (int i = 0; i < np; i++)
            free(real[i]);
        return rc;
    }
    sc.npaths = np;
    sc.bytes = bytes;
    sc.keep_files = sp->keep_swap;
    sc.file_prefix = "zinc-train";
    sc.run_dir = 1;
    /* what dead runs left in these folders (kill -9, a reclaimed machine):
     * reported and removed before this run takes its space */
    for (int i = 0; i < sc.npaths; i++) {
        uint64_t stale = 0;
        int nstale = 0;
        if (zn_swap_clean_stale(sc.paths[i], sc.file_prefix, &stale, &nstale))
            zn_warn("swap: looking for dead runs' files in %s: %s", sc.paths[i], zn_last_error());
    }
    rc = zn_swap_create(&m->swap, m->aio, &sc);
    for (int i = 0; i < np; i++)
        free(real[i]);
    if (rc)
        return zn_error_prefix(rc, "nvme tier");
    return 0;
}

int zn_tier_alloc(zn_tier_mgr *m, zn_tier tier, zn_state_class cls, uint64_t bytes,
                  const char *name, int *id)
{
    pthread_mutex_lock(&m->lock);
    if (m->n == m->cap) {
        int nc = m->cap ? m->cap * 2 : 64;
        zn_tier_tensor *nt = realloc(m->t, (size_t)nc * sizeof *nt);
        if (!nt) {
            pthread_mutex_unlock(&m->lock);
            return zn_set_error(-ENOMEM, "tier manager: out of memory");
        }
        m->t = nt;
        m->cap = nc;
    }
    zn_tier_tensor *t = &m->t[m->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->cls = cls;
    t->home = tier;
    t->bytes = bytes;
    int rc = 0;
    char b1[32], b2[32];
    if (tier == ZN_TIER_GPU) {
        rc = zn_dev_alloc(m->dev, bytes, t->name, &t->ptr);
    } else if (tier == ZN_TIER_CPU) {
        rc = zn_dev_host_alloc(m->dev, bytes, t->name, &t->ptr);
    } else if (!m->swap) {
        rc = zn_set_error(ZN_EINTERNAL, "tier manager: %s placed on nvme without a swap space",
                          t->name);
    } else {
        rc = zn_swap_alloc(m->swap, bytes, t->name, &t->ext);
        if (rc == -ENOSPC) {
            zn_swap_stats st;
            zn_swap_get_stats(m->swap, &st);
            rc = zn_set_error(ZN_EBUDGET, "nvme tier: %s needs %s, %s of the swap space's %s "
                              "are free", t->name, zn_format_size(bytes, b1, sizeof b1),
                              zn_format_size(st.capacity - st.used, b2, sizeof b2),
                              zn_format_size(st.capacity, (char[32]){0}, 32));
        }
    }
    if (rc) {
        pthread_mutex_unlock(&m->lock);
        return rc;
    }
    *id = m->n++;
    pthread_mutex_unlock(&m->lock);
    return 0;
}

void zn_tier_set_valid(zn_tier_mgr *m, int id, zn_tier t, bool valid)
{
    pthread_mutex_lock(&m->lock);
    if (valid)
        m->t[id].valid |= 1u << t;
    else
        m->t[id].valid &= ~(1u << t);
    pthread_mutex_unlock(&m->lock);
}

void zn_tier_fini(zn_tier_mgr *m)
{
    for (int i = m->n - 1; i >= 0; i--) {
        zn_tier_tensor *t = &m->t[i];
        if (t->home == ZN_TIER_GPU)
            zn_dev_free(m->dev, t->ptr);
        else if (t->home == ZN_TIER_CPU)
            zn_dev_host_free(m->dev, t->ptr);
        else if (m->swap)
            zn_swap_free(m->swap, &t->ext);
    }
    free(m->t);
    m->t = NULL;
    m->n = m->cap = 0;
    zn_swap_destroy(m->swap);
    m->swap = NULL;
    zn_aio_destroy(m->aio);
    m->aio = NULL;
    pthread_mutex_destroy(&m->lock);
}

void zn_tier_usage(zn_tier_mgr *m, uint64_t used[ZN_TIER_COUNT], uint64_t peak[ZN_TIER_COUNT])
{
    zn_dev_mem dm;
    zn_dev_mem_stats(m->dev, &dm);
    used[ZN_TIER_GPU] = dm.used;
    peak[ZN_TIER_GPU] = dm.peak;
    used[ZN_TIER_CPU] = dm.host_used;
    peak[ZN_TIER_CPU] = dm.host_peak;
    used[ZN_TIER_NVME] = peak[ZN_TIER_NVME] = 0;
    if (m->swap) {
        zn_swap_stats st;
        zn_swap_get_stats(m->swap, &st);
        used[ZN_TIER_NVME] = st.used;
        peak[ZN_TIER_NVME] = st.peak_used;
    }
}

/* ---- completion queues ------------------------------------------------------*/
static void *ioq_main(void *arg)
{
    zn_ioq *q = arg;
    pthread_mutex_lock(&q->lock);
    for (;;) {
        while (!q->head && !q->stop)
            pthread_cond_wait(&q->cv_in, &q->lock);
        if (!q->head && q->stop)
            break;
        zn_io_req *r = q->head;
        q->head = r->next;
        if (!q->head)
            q->tail = NULL;
        pthread_mutex_unlock(&q->lock);

        int rc = zn_aio_wait(q->aio, r->h);
        r->t_done = zn_now_ns();
        if (rc)
            snprintf(r->msg, sizeof r->msg, "%s", zn_last_error());
        else if (q->bytes_counter)
            atomic_fetch_add(q->bytes_counter, r->bytes);
        zn_trace_span(q->trace, q->track, r->what, r->t_submit, r->t_done);
        r->status = rc;
        if (r->on_done)
            r->on_done(r);  /* before done: the owner may reuse r after that */

        pthread_mutex_lock(&q->lock);
        atomic_store(&r->done, 1);
        q->n_completed++;
        pthread_cond_broadcast(&q->cv_done);
    }
    pthread_mutex_unlock(&q->lock);
    return NULL;
}

int zn_ioq_start(zn_ioq *q, zn_aio *aio, zn_trace *tr, int track, _Atomic uint64_t *counter)
{
    memset(q, 0, sizeof *q);
    q->aio = aio;
    q->trace = tr;
    q->track = track;
    q->bytes_counter = counter;
    if (pthread_mutex_init(&q->lock, NULL) || pthread_cond_init(&q->cv_in, NULL) ||
        pthread_cond_init(&q->cv_done, NULL))
        return zn_set_error(-ENOMEM, "nvme queue: pthread init failed");
    int rc = pthread_create(&q->thr, NULL, ioq_main, q);
    if (rc)
        return zn_set_error(-rc, "nvme queue: pthread_create: %s", strerror(rc));
    q->started = true;
    return 0;
}

void zn_ioq_stop(zn_ioq *q)
{
    if (!q->started)
        return;
    pthread_mutex_lock(&q->lock);
    q->stop = true;
    pthread_cond_broadcast(&q->cv_in);
    pthread_mutex_unlock(&q->lock);
    pthread_join(q->thr, NULL);
    q->started = false;
    pthread_cond_destroy(&q->cv_in);
    pthread_cond_destroy(&q->cv_done);
    pthread_mutex_destroy(&q->lock);
}

int zn_ioq_submit(zn_ioq *q, zn_io_req *r, int is_write, const zn_extent *e, void *buf,
                  size_t len, const char *what)
{
    return zn_ioq_submit_cb(q, r, is_write, e, buf, len, what, NULL, NULL);
}

int zn_ioq_submit_cb(zn_ioq *q, zn_io_req *r, int is_write, const zn_extent *e, void *buf,
                     size_t len, const char *what, void (*on_done)(zn_io_req *), void *arg)
{
    r->on_done = on_done;
    r->on_done_arg = arg;
    r->is_write = is_write;
    r->bytes = len;
    r->status = 0;
    r->msg[0] = '\0';
    r->next = NULL;
    r->h = 0;
    snprintf(r->what, sizeof r->what, "%s", what);
    atomic_store(&r->done, 0);
    r->t_submit = zn_now_ns();
    int rc = is_write ? zn_aio_submit_write(q->aio, e, buf, len, &r->h)
                      : zn_aio_submit_read(q->aio, e, buf, len, &r->h);
    if (rc) {
        snprintf(r->msg, sizeof r->msg, "%s", zn_last_error());
        r->status = rc;
        r->h = 0;
        atomic_store(&r->done, 1);
        return rc;
    }
    pthread_mutex_lock(&q->lock);
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->n_queued++;
    pthread_cond_signal(&q->cv_in);
    pthread_mutex_unlock(&q->lock);
    return 0;
}

void zn_ioq_fence(zn_ioq *q)
{
    if (!q->started)
        return;
    pthread_mutex_lock(&q->lock);
    uint64_t upto = q->n_queued;
    while (q->n_completed < upto)
        pthread_cond_wait(&q->cv_done, &q->lock);
    pthread_mutex_unlock(&q->lock);
}

int zn_ioq_wait(zn_ioq *q, zn_io_req *r)
{
    if (zn_dev_in_host_fn())
        return zn_set_error(ZN_EINTERNAL, "waiting for the NVMe %s of %s inside a device host "
                            "function: it would stall every stream (zn_dev_launch_host_fn)",
                            r->is_write ? "write" : "read", r->what);
    if (!atomic_load(&r->done)) {
        pthread_mutex_lock(&q->lock);
        while (!atomic_load(&r->done))
            pthread_cond_wait(&q->cv_done, &q->lock);
        pthread_mutex_unlock(&q->lock);
    }
    if (r->status)
        return zn_set_error(r->status, "NVMe %s of %s failed: %s", r->is_write ? "write" : "read",
                            r->what, r->msg[0] ? r->msg : zn_strerror(r->status));
    return 0;
}
