/* The optimizer pipeline: one thread steps the optimizer unit by unit (a
 * unit is a sub-group of the flat parameter space). Without clipping or
 * fp16 it walks units from the highest offsets down, so that a unit starts
 * as soon as backward has produced all of its gradients; with them it waits
 * for the global norm ("go") and then walks upwards, so that block 0's
 * parameters, which the next step's forward needs first, are final first.
 * With optimizer states on NVMe, a unit's master/m/v (and its gradients,
 * once final) are read ahead into one of n_oslots staging slots and written
 * behind; a slot is reused only after every write from it completed. m and
 * v move at their own size (fp32, bf16, or 8-bit codes with their blocks'
 * absmax: one request each, crc32c-checked by the engine like the rest). The
 * updated working parameters go to each block's home (device, pinned,
 * NVMe) first, and each unit records when they have all landed there: the
 * step returns before the job ends and the next step's fetches wait per
 * unit (zn_unit.pdone), not for the whole job. The NVMe walks, the
 * speculative step's among them, are in sched_nvme.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"

const char *const zn_sched_state_name[3] = { "master", "adam m", "adam v" };

/* olock held */
bool zn_sched_unit_final(zn_trainer *tr, int u)
{
    return tr->opt.job.all_ready || atomic_load(&tr->units[u].pieces_done) >= tr->units[u].np;
}

bool zn_sched_job_live(zn_trainer *tr)
{
    return !tr->opt.cancel && !tr->opt.quit;
}

/* Whether unit u's gradients are final (they may be read ahead). */
bool zn_sched_grads_final(zn_trainer *tr, int u)
{
    pthread_mutex_lock(&tr->opt.lock);
    bool r = zn_sched_unit_final(tr, u);
    pthread_mutex_unlock(&tr->opt.lock);
    return r;
}

/* Waits until unit u may step: its gradients are final and, with need_go,
 * the go was given. Returns 0, the sticky error, or -ECANCELED. */
int zn_sched_wait_ready(zn_trainer *tr, int u)
{
    pthread_mutex_lock(&tr->opt.lock);
    while (!((!tr->opt.job.need_go || tr->opt.job.go) && zn_sched_unit_final(tr, u)) && !atomic_load(&tr->err) &&
           zn_sched_job_live(tr))
        pthread_cond_wait(&tr->opt.cv, &tr->opt.lock);
    int rc = atomic_load(&tr->err) ? atomic_load(&tr->err) : !zn_sched_job_live(tr) ? -ECANCELED : 0;
    if (!rc)
        tr->opt.stepped = true;  /* from here on the job changes the state */
    pthread_mutex_unlock(&tr->opt.lock);
    return rc;
}

/* The i-th unit the job steps. */
int zn_sched_unit_at(zn_trainer *tr, int i)
{
    return tr->opt.job.asc ? i : tr->n_units - 1 - i;
}

void zn_optsched_notify_params(zn_trainer *tr)
{
    pthread_mutex_lock(&tr->opt.land_lock);
    pthread_cond_broadcast(&tr->opt.land_cv);
    pthread_mutex_unlock(&tr->opt.land_lock);
}

void zn_sched_publish(zn_unit *un)
{
    atomic_store(&un->pdone, un->pseq);
    zn_optsched_notify_params(un->tr);
}

/* One copy of a unit's update reached its home; the last one lands it: the
 * next step's uses may take it, unless it is a speculative update not yet
 * committed (then the commit publishes it). */
static void land(zn_unit *un)
{
    if (atomic_fetch_sub(&un->plive, 1) != 1)
        return;
    zn_trainer *tr = un->tr;
    pthread_mutex_lock(&tr->opt.land_lock);
    bool held = un->spec;
    if (held) {
        un->spec_landed = true;
        pthread_cond_broadcast(&tr->opt.land_cv);
    }
    pthread_mutex_unlock(&tr->opt.land_lock);
    if (!held)
        zn_sched_publish(un);
}

/* NVMe queue thread: a parameter write completed. */
static void param_write_done(zn_io_req *r)
{
    zn_unit *un = r->on_done_arg;
    if (r->status) {
        zn_train_fail(un->tr, r->status, "NVMe write of %s failed: %s", r->what,
                      r->msg[0] ? r->msg : zn_strerror(r->status));
        return;
    }
    land(un);
}

/* Host functions around a unit's device step: its span on the adam track
 * (device time, as the stream saw it). */
static void adam_begin_fn(void *arg)
{
    ((zn_unit *)arg)->dev_t0 = zn_now_ns();
}

static void adam_end_fn(void *arg)
{
    zn_unit *un = arg;
    char name[ZN_TRACE_NAME_LEN];
    snprintf(name, sizeof name, "adam u%d", (int)(un - un->tr->units));
    zn_trace_span(un->tr->trace, un->tr->track[ZN_RES_ADAM], name, un->dev_t0, zn_now_ns());
}

/* Host function on the optimizer's H2D stream after a unit's copies. */
static void h2d_landed_fn(void *arg)
{
    land(arg);
}

void zn_optsched_notify(zn_trainer *tr)
{
    pthread_mutex_lock(&tr->opt.lock);
    pthread_cond_broadcast(&tr->opt.cv);
    pthread_mutex_unlock(&tr->opt.lock);
}

/* Waits for every write from slot s and its H2D parameter copies. */
int zn_sched_slot_drain(zn_trainer *tr, zn_opt_slot *s)
{
    int rc = 0, r;
    if (s->writes_pending) {
        for (int i = 0; i < 3; i++)
            if ((r = zn_ioq_wait(&tr->wq, &s->wr[i])) && !rc)
                rc = r;
        for (int i = 0; i < s->n_pwr; i++)
            if ((r = zn_ioq_wait(&tr->wq, &s->pwr[i])) && !rc)
                rc = r;
        s->n_pwr = 0;
        s->writes_pending = false;
    }
    if (s->h2d_pending) {
        if ((r = zn_dev_event_sync(tr->dev, s->h2d_done)) && !rc)
            rc = r;
        s->h2d_pending = false;
    }
    return rc;
}

/* Bytes of state k (0 master, 1 m, 2 v) of unit u: one request each. */
size_t zn_sched_state_bytes(const zn_trainer *tr, int u, int k)
{
    return k ? zn_tr_unit_mom_bytes(tr, tr->units[u].n)
             : tr->units[u].n * zn_tr_master_elem(tr);
}

int zn_sched_slot_read_states(zn_trainer *tr, zn_opt_slot *s, int u)
{
    zn_unit *un = &tr->units[u];
    void *dst[3] = { s->master, s->m, s->v };
    int ids[3] = { zn_tr_unit_sid(un, 0), zn_tr_unit_sid(un, 1), zn_tr_unit_sid(un, 2) };
    s->unit = u;
    s->reads_issued = true;
    s->grads_issued = false;
    s->n_grd = 0;
    bool zero = atomic_load(&un->mv_zero);
    for (int i = 0; i < 3; i++) {
        if (i > 0 && zero) {
            /* never written: the initial zeros (m = v = 0 in every
             * format, 8-bit absmax included), no read */
            memset(dst[i], 0, zn_sched_state_bytes(tr, u, i));
            s->rd[i].h = 0;
            s->rd[i].status = 0;
            atomic_store(&s->rd[i].done, 1);
            continue;
        }
        char what[48];
        snprintf(what, sizeof what, "%s u%d", zn_sched_state_name[i], u);
        int rc = zn_ioq_submit(&tr->rq, &s->rd[i], 0, &zn_tier_get(&tr->tm, ids[i])->ext, dst[i],
                               zn_sched_state_bytes(tr, u, i), what);
        if (rc)
            return zn_ioq_wait(&tr->rq, &s->rd[i]);
    }
    return 0;
}

int zn_sched_slot_read_grads(zn_trainer *tr, zn_opt_slot *s, int u)
{
    zn_unit *un = &tr->units[u];
    s->grads_issued = true;
    for (int k = 0; k < un->np; k++) {
        zn_piece *p = &tr->pieces[un->p0 + k];
        char what[48];
        snprintf(what, sizeof what, "grads b%d u%d", p->block, u);
        float *dst = s->grad + (p->start - un->off);
        int rc = 0;
        if (p->gram_off >= 0) {
            /* kept in pinned RAM (tiers.grads auto's room) */
            memcpy(dst, tr->gram + p->gram_off, p->n * 4);
            s->grd[k].status = 0;
            atomic_store(&s->grd[k].done, 1);
        } else {
            rc = zn_ioq_submit(&tr->rq, &s->grd[k], 0, &zn_tier_get(&tr->tm, p->grad_id)->ext,
                               dst, p->n * 4, what);
        }
        s->n_grd = k + 1;
        if (rc)
            return zn_ioq_wait(&tr->rq, &s->grd[k]);
    }
    return 0;
}

/* ---- the param cache (see train-impl.h) ------------------------------------*/
bool zn_pcache_ready_locked(zn_trainer *tr, int b, int64_t seq)
{
    for (int e = 0; e < tr->opt.n_pcache; e++)
        if (tr->opt.pcache[e].block == b && tr->opt.pcache[e].seq == seq && tr->opt.pcache[e].state == ZN_PC_READY)
            return true;
    return false;
}

int zn_pcache_take(zn_trainer *tr, int b, int64_t seq)
{
    int r = -1;
    pthread_mutex_lock(&tr->opt.land_lock);
    for (int e = 0; e < tr->opt.n_pcache && r < 0; e++) {
        zn_pcache_ent *c = &tr->opt.pcache[e];
        if (c->block == b && c->seq == seq && c->state == ZN_PC_READY) {
            c->state = ZN_PC_READING;
            r = e;
        }
    }
    pthread_mutex_unlock(&tr->opt.land_lock);
    return r;
}

void zn_pcache_release_fn(void *arg)
{
    zn_pcache_ent *c = arg;
    pthread_mutex_lock(&c->tr->opt.land_lock);
    c->state = ZN_PC_FREE;
    c->block = -1;
    pthread_mutex_unlock(&c->tr->opt.land_lock);
}

/* Optimizer thread: the entry that collects block b's update by the running
 * job (claimed on its first piece), or NULL when the block is not cached
 * this time. */
static zn_pcache_ent *pcache_entry(zn_trainer *tr, int b)
{
    zn_block *bl = &tr->blocks[b];
    int64_t seq = tr->opt.job.seq;
    zn_pcache_ent *r = NULL;
    if (!tr->opt.n_pcache || !bl->pc_ok)
        return NULL;
    pthread_mutex_lock(&tr->opt.land_lock);
    for (int e = 0; e < tr->opt.n_pcache && !r; e++)
        if (tr->opt.pcache[e].block == b && tr->opt.pcache[e].seq == seq && tr->opt.pcache[e].state == ZN_PC_FILLING)
            r = &tr->opt.pcache[e];
    if (!r && bl->pc_skip != seq) {
        /* a block's first piece of this job: claim a free or stale entry,
         * else evict this job's entry of the block the forward needs last
         * when that comes after b (walking units downwards, the cache ends
         * up with the lowest blocks); a later piece never starts one (it
         * would never be complete) */
        zn_pcache_ent *victim = NULL;
        for (int e = 0; e < tr->opt.n_pcache && !r; e++) {
            zn_pcache_ent *c = &tr->opt.pcache[e];
            if (c->state == ZN_PC_FREE || (c->state != ZN_PC_READING && c->seq < seq))
                r = c;
            else if (c->state != ZN_PC_READING && c->block > b &&
                     (!victim || c->block > victim->block))
                victim = c;
        }
        if (!r)
            r = victim;
        if (r) {
            r->block = b;
            r->seq = seq;
            r->left = bl->np;
            r->held = 0;
            r->state = ZN_PC_FILLING;
        }
        bl->pc_skip = seq;  /* claimed or not: no second claim this job */
    }
    pthread_mutex_unlock(&tr->opt.land_lock);
    return r;
}

/* Optimizer thread: piece p of the entry's block is in; a speculative
 * update's piece is held until it commits. */
static void pcache_piece_in(zn_trainer *tr, zn_pcache_ent *c, zn_piece *p, bool spec)
{
    pthread_mutex_lock(&tr->opt.land_lock);
    c->left--;
    if (spec) {
        c->held++;
        p->pc_ent1 = (int)(c - tr->opt.pcache) + 1;
        p->pc_seq = c->seq;
    }
    if (c->left == 0 && c->held == 0) {
        c->state = ZN_PC_READY;
        pthread_cond_broadcast(&tr->opt.land_cv);
    }
    pthread_mutex_unlock(&tr->opt.land_lock);
}

/* The entry piece p's speculative update went into, if it still collects
 * that block for that job (it may have been evicted and reused since).
 * opt.land_lock held. */
static zn_pcache_ent *pcache_held_of(zn_trainer *tr, zn_piece *p)
{
    zn_pcache_ent *c = p->pc_ent1 ? &tr->opt.pcache[p->pc_ent1 - 1] : NULL;
    p->pc_ent1 = 0;
    if (c && c->block == p->block && c->seq == p->pc_seq && c->state == ZN_PC_FILLING)
        return c;
    return NULL;
}

void zn_pcache_spec_commit(zn_trainer *tr, zn_unit *un)
{
    pthread_mutex_lock(&tr->opt.land_lock);
    for (int k = 0; k < un->np; k++) {
        zn_pcache_ent *c = pcache_held_of(tr, &tr->pieces[un->p0 + k]);
        if (c && --c->held == 0 && c->left == 0) {
            c->state = ZN_PC_READY;
            atomic_fetch_add(&tr->opt.spec_cache_fills, 1);
            pthread_cond_broadcast(&tr->opt.land_cv);
        }
    }
    pthread_mutex_unlock(&tr->opt.land_lock);
}

void zn_pcache_spec_void(zn_trainer *tr, zn_unit *un)
{
    pthread_mutex_lock(&tr->opt.land_lock);
    for (int k = 0; k < un->np; k++) {
        zn_pcache_ent *c = pcache_held_of(tr, &tr->pieces[un->p0 + k]);
        if (c) {  /* the block's later pieces find no entry and claim none */
            c->state = ZN_PC_FREE;
            c->block = -1;
        }
    }
    pthread_mutex_unlock(&tr->opt.land_lock);
}

/* Parameters rewritten behind the optimizer's back (checkpoint load): no
 * entry holds them. */
static void pcache_invalidate(zn_trainer *tr)
{
    pthread_mutex_lock(&tr->opt.land_lock);
    for (int e = 0; e < tr->opt.n_pcache; e++) {
        if (tr->opt.pcache[e].state != ZN_PC_READING) {
            tr->opt.pcache[e].state = ZN_PC_FREE;
            tr->opt.pcache[e].block = -1;
        }
    }
    pthread_mutex_unlock(&tr->opt.land_lock);
}

/* Where piece p's working parameters start in its block's home, in bytes:
 * the home holds the whole block (replicated) or this rank's shard. */
static size_t piece_home_byte(const zn_trainer *tr, const zn_piece *p)
{
    const zn_block *b = &tr->blocks[p->block];
    return (size_t)((b->replicated ? b->soff : b->fshard) + p->start - b->off) * tr->param_bytes;
}

/* Slot s's parameter writes were issued: its state writes count as done. */
void zn_sched_slot_params_issued(zn_opt_slot *s)
{
    s->writes_pending = s->n_pwr > 0;
    for (int j = 0; j < 3 && s->writes_pending; j++)
        atomic_store(&s->wr[j].done, 1), s->wr[j].status = 0;
}

/* Sends unit u's updated working parameters (src: fp32 master values or the
 * 16-bit copy, unit-relative) to each block's home; with host_only, to the
 * homes off the device only, the caller having set up the tracking. NVMe
 * writes are queued in pwr (waited by the caller), device copies go on the
 * optimizer's H2D stream and are followed by a record of `ev`. With
 * `track`, the unit's landing is counted (its pdone becomes the running
 * job's sequence number once every copy arrived). */
int zn_sched_params_out(zn_trainer *tr, int u, const void *src, zn_io_req *pwr, int *n_pwr,
                      zn_event *ev, bool *h2d_pending, bool track, bool host_only)
{
    zn_unit *un = &tr->units[u];
    const char *s8 = src;
    bool h2d = false;
    *n_pwr = 0;
    if (track && !host_only) {
        un->pseq = tr->opt.job.seq;
        atomic_store(&un->plive, 1);  /* held while issuing (host_only: by the caller) */
    }
    for (int k = 0; k < un->np; k++) {
        zn_piece *p = &tr->pieces[un->p0 + k];
        zn_block *b = &tr->blocks[p->block];
        if (host_only && b->home == ZN_PHOME_DEVICE)
            continue;
        const char *from = s8 + (p->start - un->off) * tr->param_bytes;
        size_t bytes = p->n * tr->param_bytes;
        size_t in_block = piece_home_byte(tr, p);
        if (b->home == ZN_PHOME_CPU) {
            memcpy((char *)b->cpu_params + in_block, from, bytes);
        } else if (b->home == ZN_PHOME_DEVICE) {
            int rc = zn_dev_copy_h2d(tr->dev, tr->opt.s_h2d, (char *)b->dev_params + in_block, from,
                                     bytes);
            if (rc)
                return rc;
            atomic_fetch_add(&tr->tm.h2d, bytes);
            h2d = true;
        } else {
            /* (a speculative update's piece is held in its entry until
             * the update commits: a fetch takes READY entries without
             * looking at the landing) */
            zn_pcache_ent *c = track ? pcache_entry(tr, p->block) : NULL;
            if (c) {
                memcpy((char *)c->buf + in_block, from, bytes);
                pcache_piece_in(tr, c, p, un->spec);
            }
            char what[48];
            snprintf(what, sizeof what, "params b%d u%d", p->block, u);
            if (track)
                atomic_fetch_add(&un->plive, 1);
            int rc = zn_ioq_submit_cb(&tr->wq, &pwr[*n_pwr], 1,
                                      &zn_tier_get(&tr->tm, p->param_id)->ext, (void *)from,
                                      bytes, what, track ? param_write_done : NULL, un);
            (*n_pwr)++;
            if (rc)
                return zn_ioq_wait(&tr->wq, &pwr[*n_pwr - 1]);
        }
    }
    if (h2d) {
        int rc = zn_dev_event_record(tr->dev, ev, tr->opt.s_h2d);
        if (rc)
            return rc;
        *h2d_pending = true;
        if (track) {
            atomic_fetch_add(&un->plive, 1);
            if ((rc = zn_dev_launch_host_fn(tr->dev, tr->opt.s_h2d, h2d_landed_fn, un)))
                return rc;
        }
    }
    if (track)
        land(un);
    return 0;
}

/* Adam on unit u: master and gradients fp32, the moments in the run's
 * format (mv; fp32 ones go to zn_adam_step itself). */
int zn_sched_adam_unit(zn_trainer *tr, int u, float *master, const zn_moments *mv, const float *g,
                     void *p16, float g_scale)
{
    zn_unit *un = &tr->units[u];
    uint64_t t0 = zn_now_ns();
    int rc = mv->fmt == ZN_MOM_F32
                 ? zn_adam_step(&tr->opt.job.hp, master, mv->m, mv->v, g, ZN_DTYPE_F32,
                                g_scale, p16, tr->param_dt, un->n)
                 : zn_adam_step_mom(&tr->opt.job.hp, master, mv, g, ZN_DTYPE_F32,
                                    g_scale, p16, tr->param_dt, un->n);
    char name[ZN_TRACE_NAME_LEN];
    snprintf(name, sizeof name, "adam u%d", u);
    zn_trace_span(tr->trace, tr->track[ZN_RES_ADAM], name, t0, zn_now_ns());
    return rc;
}

/* Adam on unit u with the bf16 master (train.master_weights bf16_sr):
 * stepped in place with stochastic rounding, the random bits drawn from
 * (train.seed, step, the element's index in the model: its piece's span),
 * so that a resumed run, on any number of ranks, draws the ones the
 * uninterrupted run would. */
int zn_sched_adam_sr_unit(zn_trainer *tr, int u, uint16_t *master, const zn_moments *mv,
                        const float *g, float g_scale)
{
    zn_unit *un = &tr->units[u];
    uint64_t t0 = zn_now_ns();
    int rc = zn_adam_step_sr_spans(&tr->opt.job.hp, master, mv, g, ZN_DTYPE_F32,
                                   g_scale, tr->spec.seed,
                                   tr->sr_spans + un->p0, (size_t)un->np, un->n);
    char name[ZN_TRACE_NAME_LEN];
    snprintf(name, sizeof name, "adam u%d", u);
    zn_trace_span(tr->trace, tr->track[ZN_RES_ADAM], name, t0, zn_now_ns());
    return rc;
}

/* Optimizer states in memory (pinned, or the device arena on the host
 * backend): Adam in place. */
static int run_flat(zn_trainer *tr)
{
    int rc = 0;
    zn_io_req *pwr = tr->opt.slot[0].pwr;
    for (int i = 0; i < tr->n_units && !rc; i++) {
        int u = zn_sched_unit_at(tr, i);
        zn_unit *un = &tr->units[u];
        if ((rc = zn_sched_wait_ready(tr, u)))
            break;
        bool p16 = tr->param_dt != ZN_DTYPE_F32;
        /* the previous unit's param copies out of the 16-bit staging */
        zn_opt_slot *s = &tr->opt.slot[0];
        if ((rc = zn_sched_slot_drain(tr, s)))
            break;
        zn_moments mv = zn_tr_moments(tr, un->off);
        const void *out;
        if (tr->master_bf16) {
            /* the bf16 master is the bf16 working copy; fp32 params (the
             * host backend) get it widened, exactly */
            uint16_t *m16 = zn_tr_master16(tr) + un->off;
            rc = zn_sched_adam_sr_unit(tr, u, m16, &mv, tr->grad_acc + un->off, tr->opt.job.g_scale);
            if (!rc && !p16)
                rc = zn_convert(tr->opt.pout_flat, ZN_DTYPE_F32, m16, ZN_DTYPE_BF16, un->n);
            out = p16 ? (const void *)m16 : tr->opt.pout_flat;
        } else {
            rc = zn_sched_adam_unit(tr, u, tr->master + un->off, &mv, tr->grad_acc + un->off,
                           p16 ? tr->opt.pout_flat : NULL, tr->opt.job.g_scale);
            out = p16 ? tr->opt.pout_flat : (void *)(tr->master + un->off);
        }
        if (rc)
            break;
        rc = zn_sched_params_out(tr, u, out, pwr, &s->n_pwr, s->h2d_done, &s->h2d_pending, true, false);
        zn_sched_slot_params_issued(s);
    }
    int r = zn_sched_slot_drain(tr, &tr->opt.slot[0]);
    return rc ? rc : r;
}

/* The optimizer on the device, one unit on the optimizer's stream (opt.s_h2d):
 * with `adam` the step, else (a checkpoint load) only the working copy of
 * the master. A piece whose block lives on the device gets its 16-bit copy
 * written in place by the kernel; the others go through the device staging
 * (pdev) to pinned pout_flat and on to their home (params_out). With
 * `track`, the unit lands (pdone) once every copy has. Slot 0 carries the
 * NVMe writes and their pending state, as in run_flat. */
static int dev_unit(zn_trainer *tr, int u, bool adam, bool track)
{
    zn_dev *d = tr->dev;
    zn_unit *un = &tr->units[u];
    zn_opt_slot *s = &tr->opt.slot[0];
    bool on_dev = false, off_dev = false, held = track;
    int rc = 0;
    if (track) {
        un->pseq = tr->opt.job.seq;
        atomic_store(&un->plive, 1);  /* held while issuing */
    }
    if (adam && (rc = zn_dev_launch_host_fn(d, tr->opt.s_h2d, adam_begin_fn, un)))
        return rc;
    /* Compressed moments step the whole unit at once (its 8-bit blocks
     * would straddle pieces), and so does the bf16 master; the pieces'
     * copies are then cast from the updated master as when no step runs.
     * fp32 ones step piece by piece, the kernel writing each piece's copy. */
    bool fused = adam && tr->mom_fmt == ZN_MOM_F32 && !tr->master_bf16;
    if (adam && !fused) {
        zn_moments mv = zn_tr_moments(tr, un->off);
        mv.f32_dev = tr->f32_runs_dev;
        rc = tr->master_bf16
                 ? zn_dev_adam_sr(d, tr->opt.s_h2d, &tr->opt.job.hp,
                                  zn_tr_master16(tr) + un->off, &mv, tr->grad_acc + un->off,
                                  tr->opt.job.g_scale, tr->spec.seed,
                                  tr->sr_spans_dev + un->p0, un->np, (int64_t)un->n)
                 : zn_dev_adam_mom(d, tr->opt.s_h2d, &tr->opt.job.hp, tr->master + un->off,
                                   &mv, tr->grad_acc + un->off, tr->opt.job.g_scale, NULL,
                                   ZN_DTYPE_BF16, (int64_t)un->n);
    }
    /* the master's values in the params' dtype already (an fp32 master
     * and fp32 params, the bf16 master and bf16 params): copied as they
     * are; else cast into the home or the device staging */
    zn_dtype mdt = tr->master_bf16 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    bool same = mdt == tr->param_dt;
    for (int k = 0; k < un->np && !rc; k++) {
        zn_piece *p = &tr->pieces[un->p0 + k];
        zn_block *b = &tr->blocks[p->block];
        uint64_t o = p->start, rel = p->start - un->off;
        const void *msrc = tr->master_bf16 ? (const void *)(zn_tr_master16(tr) + o)
                                           : (const void *)(tr->master + o);
        void *home =
            b->home == ZN_PHOME_DEVICE ? (char *)b->dev_params + piece_home_byte(tr, p) : NULL;
        void *c = same ? NULL : home ? home : (char *)tr->pdev + rel * tr->param_bytes;
        if (fused)
            rc = zn_dev_adam(d, tr->opt.s_h2d, &tr->opt.job.hp, tr->master + o, tr->mom + o, tr->var + o,
                             tr->grad_acc + o, tr->opt.job.g_scale, c, tr->param_dt, (int64_t)p->n);
        else if (c)
            rc = zn_dev_cast(d, tr->opt.s_h2d, msrc, mdt, c, tr->param_dt, (int64_t)p->n);
        if (!rc && same && home)
            rc = zn_dev_copy_d2d(d, tr->opt.s_h2d, home, msrc, p->n * tr->param_bytes);
        if (rc)
            break;
        if (home) {
            on_dev = true;
            continue;
        }
        if (!off_dev && (rc = zn_sched_slot_drain(tr, s)))  /* pout_flat's previous writes */
            break;
        off_dev = true;
        rc = zn_dev_copy_d2h(d, tr->opt.s_h2d, (char *)tr->opt.pout_flat + rel * tr->param_bytes,
                             same ? msrc : c, p->n * tr->param_bytes);
        if (!rc)
            atomic_fetch_add(&tr->tm.d2h, p->n * tr->param_bytes);
    }
    if (!rc && adam)
        rc = zn_dev_launch_host_fn(d, tr->opt.s_h2d, adam_end_fn, un);
    if (!rc && on_dev && track) {
        atomic_fetch_add(&un->plive, 1);
        rc = zn_dev_launch_host_fn(d, tr->opt.s_h2d, h2d_landed_fn, un);
    }
    if (!rc && off_dev && !(rc = zn_dev_stream_sync(d, tr->opt.s_h2d))) {
        held = false; /* params_out releases the hold */
        rc = zn_sched_params_out(tr, u, tr->opt.pout_flat, s->pwr, &s->n_pwr, s->h2d_done, &s->h2d_pending,
                        track, true);
        zn_sched_slot_params_issued(s);
    }
    if (!rc && held)
        land(un);
    return rc;
}

/* Optimizer states on the device. */
static int run_dev(zn_trainer *tr)
{
    int rc = 0;
    for (int i = 0; i < tr->n_units && !rc; i++) {
        int u = zn_sched_unit_at(tr, i);
        if (!(rc = zn_sched_wait_ready(tr, u)))
            rc = dev_unit(tr, u, true, true);
    }
    int r = zn_sched_slot_drain(tr, &tr->opt.slot[0]);
    if (!rc && !(rc = r))
        rc = zn_dev_stream_sync(tr->dev, tr->opt.s_h2d);
    return rc;
}

int zn_optsched_dev_regen(zn_trainer *tr, int u)
{
    pcache_invalidate(tr);
    int rc = dev_unit(tr, u, false, false);
    int r = zn_sched_slot_drain(tr, &tr->opt.slot[0]);
    if (!rc && !(rc = r))
        rc = zn_dev_stream_sync(tr->dev, tr->opt.s_h2d);
    return rc;
}

static void *opt_main(void *arg)
{
    zn_trainer *tr = arg;
    pthread_mutex_lock(&tr->opt.lock);
    for (;;) {
        /* a job posted after a background checkpoint's hold waits for
         * its release */
        while (!tr->opt.quit &&
               (!tr->opt.pending || (tr->opt.hold > 0 && tr->opt.next_job.seq > tr->opt.hold_seq)))
            pthread_cond_wait(&tr->opt.cv, &tr->opt.lock);
        if (tr->opt.quit)
            break;
        tr->opt.job = tr->opt.next_job;
        tr->opt.pending = false;
        tr->opt.running = true;
        tr->opt.cancel = false;
        tr->opt.stepped = false;
        pthread_cond_broadcast(&tr->opt.cv);
        pthread_mutex_unlock(&tr->opt.lock);
        double t0 = zn_now_s();
        int rc = tr->opt_home == ZN_TIER_NVME ? (tr->opt.job.spec ? zn_sched_run_nvme_spec(tr) : zn_sched_run_nvme(tr))
                 : tr->opt_on_device ? run_dev(tr)
                                     : run_flat(tr);
        double job_s = zn_now_s() - t0;
        if (rc && rc != -ECANCELED)
            zn_train_fail(tr, rc, "optimizer step %lld: %s", (long long)tr->opt.job.hp.step,
                          zn_last_error());
        pthread_mutex_lock(&tr->opt.lock);
        tr->opt.running = false;
        tr->opt.done_seq = tr->opt.job.seq;
        if (!rc && job_s > tr->opt.job_max_s)
            tr->opt.job_max_s = job_s;
        if (rc && rc != -ECANCELED && !tr->opt.status)
            tr->opt.status = rc;
        pthread_cond_broadcast(&tr->opt.cv);
    }
    pthread_mutex_unlock(&tr->opt.lock);
    return NULL;
}

int zn_optsched_init(zn_trainer *tr)
{
    if (pthread_mutex_init(&tr->opt.lock, NULL) || pthread_cond_init(&tr->opt.cv, NULL) ||
        pthread_mutex_init(&tr->opt.land_lock, NULL) || pthread_cond_init(&tr->opt.land_cv, NULL))
        return zn_set_error(-ENOMEM, "optimizer thread: pthread init failed");
    tr->opt.running = tr->opt.pending = tr->opt.cancel = tr->opt.quit = false;
    tr->opt.stepped = false;
    tr->opt.hold = 0;
    tr->opt.status = 0;
    tr->opt.done_seq = tr->opt.hold_seq = 0;
    tr->opt.job_max_s = 0;
    int rc = pthread_create(&tr->opt.thread, NULL, opt_main, tr);
    if (rc)
        return zn_set_error(-rc, "optimizer thread: pthread_create: %s", strerror(rc));
    tr->opt.started = true;
    return 0;
}

void zn_optsched_fini(zn_trainer *tr)
{
    if (!tr->opt.started)
        return;
    pthread_mutex_lock(&tr->opt.lock);
    tr->opt.quit = true;
    pthread_cond_broadcast(&tr->opt.cv);
    pthread_mutex_unlock(&tr->opt.lock);
    pthread_join(tr->opt.thread, NULL);
    tr->opt.started = false;
    pthread_cond_destroy(&tr->opt.cv);
    pthread_mutex_destroy(&tr->opt.lock);
    pthread_cond_destroy(&tr->opt.land_cv);
    pthread_mutex_destroy(&tr->opt.land_lock);
}

int64_t zn_optsched_begin(zn_trainer *tr, const zn_adam_params *hp, float g_scale,
                          bool need_go, const zn_opt_spec *spec)
{
    pthread_mutex_lock(&tr->opt.lock);
    while (tr->opt.pending && !tr->opt.quit)
        pthread_cond_wait(&tr->opt.cv, &tr->opt.lock);
    zn_opt_job *j = &tr->opt.next_job;
    j->hp = *hp;
    j->g_scale = g_scale;
    j->need_go = need_go;
    j->go = false;
    j->all_ready = false;
    j->asc = need_go;
    j->spec = spec && need_go && tr->opt_home == ZN_TIER_NVME && tr->plan.spec_shadow;
    j->spec_scale = g_scale;
    j->sq_limit = spec ? spec->sq_limit : 0;
    j->stop_nonfinite = spec && spec->stop_nonfinite;
    j->seq = ++tr->opt.seq;
    tr->opt.pending = true;
    pthread_cond_broadcast(&tr->opt.cv);
    pthread_mutex_unlock(&tr->opt.lock);
    return j->seq;
}

void zn_optsched_settle(zn_trainer *tr, int64_t seq)
{
    pthread_mutex_lock(&tr->opt.lock);
    for (;;) {
        const zn_opt_job *j = tr->opt.pending && tr->opt.next_job.seq == seq ? &tr->opt.next_job
                              : tr->opt.running && tr->opt.job.seq == seq ? &tr->opt.job : NULL;
        if (!j || !j->spec || tr->opt.spec_parked >= seq || atomic_load(&tr->err) || tr->opt.quit)
            break;
        pthread_cond_wait(&tr->opt.cv, &tr->opt.lock);
    }
    pthread_mutex_unlock(&tr->opt.lock);
}

/* olock held: the job posted last */
static zn_opt_job *newest(zn_trainer *tr)
{
    return tr->opt.pending ? &tr->opt.next_job : &tr->opt.job;
}

void zn_optsched_go(zn_trainer *tr, float g_scale)
{
    pthread_mutex_lock(&tr->opt.lock);
    zn_opt_job *j = newest(tr);
    j->g_scale = g_scale;
    j->all_ready = true;
    j->go = true;
    pthread_cond_broadcast(&tr->opt.cv);
    pthread_mutex_unlock(&tr->opt.lock);
}

void zn_optsched_all_final(zn_trainer *tr)
{
    pthread_mutex_lock(&tr->opt.lock);
    newest(tr)->all_ready = true;
    pthread_cond_broadcast(&tr->opt.cv);
    pthread_mutex_unlock(&tr->opt.lock);
}

void zn_optsched_cancel(zn_trainer *tr, bool all)
{
    pthread_mutex_lock(&tr->opt.lock);
    bool dropped = tr->opt.pending;
    tr->opt.pending = false;
    if (tr->opt.running && (all || !dropped))
        tr->opt.cancel = true;
    pthread_cond_broadcast(&tr->opt.cv);
    pthread_mutex_unlock(&tr->opt.lock);
}

int zn_optsched_wait(zn_trainer *tr)
{
    pthread_mutex_lock(&tr->opt.lock);
    while ((tr->opt.pending || tr->opt.running) && !tr->opt.quit)
        pthread_cond_wait(&tr->opt.cv, &tr->opt.lock);
    int rc = tr->opt.status;
    tr->opt.status = 0;
    pthread_mutex_unlock(&tr->opt.lock);
    return rc;
}

int zn_optsched_hold(zn_trainer *tr)
{
    pthread_mutex_lock(&tr->opt.lock);
    bool busy = tr->opt.hold > 0;   /* one save at a time: its step bounds the jobs */
    if (!busy) {
        tr->opt.hold = 1;
        tr->opt.hold_seq = tr->opt.seq;
    }
    pthread_mutex_unlock(&tr->opt.lock);
    return busy ? zn_set_error(-EBUSY, "train: another background save holds the state") : 0;
}

int zn_optsched_wait_held(zn_trainer *tr)
{
    pthread_mutex_lock(&tr->opt.lock);
    while (!tr->opt.quit && !atomic_load(&tr->err) &&
           ((tr->opt.running && tr->opt.job.seq <= tr->opt.hold_seq) ||
            (tr->opt.pending && tr->opt.next_job.seq <= tr->opt.hold_seq)))
        pthread_cond_wait(&tr->opt.cv, &tr->opt.lock);
    int rc = atomic_load(&tr->err);
    pthread_mutex_unlock(&tr->opt.lock);
    return rc;
}

void zn_optsched_release(zn_trainer *tr)
{
    pthread_mutex_lock(&tr->opt.lock);
    tr->opt.hold = 0;
    pthread_cond_broadcast(&tr->opt.cv);
    pthread_mutex_unlock(&tr->opt.lock);
}

bool zn_optsched_abandon(zn_trainer *tr, int64_t seq)
{
    bool done = false;
    pthread_mutex_lock(&tr->opt.lock);
    if (tr->opt.pending && tr->opt.next_job.seq == seq) {
        tr->opt.pending = false;
        done = true;
    } else if (tr->opt.running && tr->opt.job.seq == seq && !tr->opt.stepped) {
        tr->opt.cancel = true;   /* it leaves at its first wait_ready */
        done = true;
    }
    pthread_cond_broadcast(&tr->opt.cv);
    pthread_mutex_unlock(&tr->opt.lock);
    return done;
}

/* params_out for the checkpoint loader (ckpt.c), which regenerates the
 * working parameters from a loaded master unit by unit. */
int zn_optsched_params_out(zn_trainer *tr, int u, const void *src, zn_io_req *pwr, int *n_pwr,
                           zn_event *ev, bool *h2d_pending)
{
    pcache_invalidate(tr);
    return zn_sched_params_out(tr, u, src, pwr, n_pwr, ev, h2d_pending, false, false);
}
