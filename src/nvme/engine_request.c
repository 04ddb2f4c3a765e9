/* The engine's requests as the caller sees them: handles (slot + generation),
 * submit, wait, poll and wait_all, and the counters, latency percentiles and
 * fault injection read and set through the engine. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvme/nvme-impl.h"
#include "zinc/util.h"

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
        zn_aio__finish_req(a, r);
    } else {
        if (a->qtail)
            a->qtail->next = r;
        else
            a->qhead = r;
        a->qtail = r;
        zn_aio__wake_workers(a);
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
    r->waiters++;
    while (!r->done)
        pthread_cond_wait(&a->done_cv, &a->lock);
    r->waiters--;
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
        if (a->slots[i] && !a->slots[i]->waiters)
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
        for (int i = 0; i < ZN_AIO_HIST_N; i++) {
            if (!a->hist[i])
                continue;
            c += a->hist[i];
            if (!have50 && c >= p50) {
                out->lat_p50_us = zn_aio__hist_val(i) / 1e3;
                have50 = 1;
            }
            if (!have99 && c >= p99) {
                out->lat_p99_us = zn_aio__hist_val(i) / 1e3;
                have99 = 1;
            }
            out->lat_max_us = zn_aio__hist_val(i) / 1e3;
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
