/* The optimizer pipeline's NVMe walks (sched_nvme.c): the norm-first one
 * and the speculative step's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"

/* The fp32 moments (8-bit moments' small tensors, in RAM) of unit u's
 * blocks: with `save` copied aside before it speculates, else put back
 * when its speculative update is void, so that its step again starts from
 * the moments its first NVMe copy goes with. */
static void spec_f32(zn_trainer *tr, int u, bool save)
{
    if (!tr->mv32_first)
        return;
    const zn_unit *un = &tr->units[u];
    uint64_t b0 = un->off / ZN_Q8_BLOCK, b1 = (un->off + un->n + ZN_Q8_BLOCK - 1) / ZN_Q8_BLOCK;
    float *first_v = tr->mv32_first + tr->f32_slots * ZN_Q8_BLOCK;
    for (size_t r = 0; r < tr->n_f32_runs; r++) {
        const zn_q8_f32_run *fr = &tr->f32_runs[r];
        uint64_t a = fr->block > b0 ? fr->block : b0;
        uint64_t e = fr->block + fr->n < b1 ? fr->block + fr->n : b1;
        if (a >= e)
            continue;
        size_t at = (size_t)(fr->slot + (a - fr->block)) * ZN_Q8_BLOCK;
        size_t len = (size_t)(e - a) * ZN_Q8_BLOCK * sizeof(float);
        if (save) {
            memcpy(tr->mv32_first + at, tr->m32 + at, len);
            memcpy(first_v + at, tr->v32 + at, len);
        } else {
            memcpy(tr->m32 + at, tr->mv32_first + at, len);
            memcpy(tr->v32 + at, first_v + at, len);
        }
    }
}

/* A speculative update stands: its states' copy becomes current and its
 * parameters are published (now, or when they land). */
static void spec_commit(zn_trainer *tr, zn_unit *un)
{
    pthread_mutex_lock(&tr->opt.land_lock);
    bool landed = un->spec_landed;
    un->spec = un->spec_landed = false;
    pthread_mutex_unlock(&tr->opt.land_lock);
    un->cur ^= 1;
    atomic_store(&un->mv_zero, false);
    atomic_fetch_add(&tr->opt.spec_commits, 1);
    zn_pcache_spec_commit(tr, un);
    if (landed)
        zn_sched_publish(un);
}

/* A speculative update is void: waits until every copy of it landed (its
 * NVMe writes are done before the unit's parameters are written again),
 * then the unit is an ordinary one. */
static int spec_void(zn_trainer *tr, zn_unit *un)
{
    pthread_mutex_lock(&tr->opt.land_lock);
    while (!un->spec_landed && !atomic_load(&tr->err))
        pthread_cond_wait(&tr->opt.land_cv, &tr->opt.land_lock);
    un->spec = un->spec_landed = false;
    pthread_mutex_unlock(&tr->opt.land_lock);
    zn_pcache_spec_void(tr, un);
    spec_f32(tr, (int)(un - tr->units), false);
    return atomic_load(&tr->err);
}

/* Steps unit u, whose states (and gradients) slot s read, with g_scale:
 * waits for the reads, runs Adam, then writes behind: the working params
 * first (the next step's fetches wait for them), then the states, to the
 * unit's current extents, or with `next` to the other copy (the
 * speculative step's). */
static int nvme_step(zn_trainer *tr, zn_opt_slot *s, int u, float g_scale, bool next)
{
    bool p16 = tr->param_dt != ZN_DTYPE_F32;
    int rc = 0;
    if (tr->grads_on_nvme && !s->grads_issued && (rc = zn_sched_slot_read_grads(tr, s, u)))
        return rc;
    for (int k = 0; k < 3 && !rc; k++)
        rc = zn_ioq_wait(&tr->rq, &s->rd[k]);
    for (int k = 0; k < s->n_grd && !rc; k++)
        rc = zn_ioq_wait(&tr->rq, &s->grd[k]);
    if (rc)
        return rc;
    /* gradients: read into the slot (NVMe) or in place (pinned RAM) */
    const float *g = tr->grads_on_nvme ? s->grad : tr->grad_acc + tr->units[u].off;
    zn_moments mv = zn_tr_slot_moments(tr, s, u);
    const void *pout;
    if (tr->master_bf16) {
        /* as run_flat: the bf16 master is the bf16 working copy, and is
         * widened for fp32 params */
        uint16_t *m16 = (uint16_t *)(void *)s->master;
        rc = zn_sched_adam_sr_unit(tr, u, m16, &mv, g, g_scale);
        if (!rc && !p16)
            rc = zn_convert(s->pout, ZN_DTYPE_F32, m16, ZN_DTYPE_BF16, tr->units[u].n);
        pout = p16 ? (const void *)m16 : s->pout;
    } else {
        rc = zn_sched_adam_unit(tr, u, s->master, &mv, g, p16 ? s->pout : NULL, g_scale);
        pout = p16 ? s->pout : (void *)s->master;
    }
    if (rc)
        return rc;
    zn_unit *un = &tr->units[u];
    void *srcs[3] = { s->master, s->m, s->v };
    s->writes_pending = true;
    s->n_pwr = 0;
    for (int k = 0; k < 3; k++)
        atomic_store(&s->wr[k].done, 1), s->wr[k].status = 0;
    if ((rc = zn_sched_params_out(tr, u, pout, s->pwr, &s->n_pwr, s->h2d_done, &s->h2d_pending, true,
                         false)))
        return rc;
    for (int k = 0; k < 3 && !rc; k++) {
        char what[48];
        snprintf(what, sizeof what, "%s u%d", zn_sched_state_name[k], u);
        int id = next ? zn_tr_unit_sid_next(un, k) : zn_tr_unit_sid(un, k);
        rc = zn_ioq_submit(&tr->wq, &s->wr[k], 1, &zn_tier_get(&tr->tm, id)->ext, srcs[k],
                           zn_sched_state_bytes(tr, u, k), what);
    }
    if (rc)
        return rc;
    s->unit = -1 - u - 1; /* consumed: never matches a unit again */
    return 0;
}

/* Waits for everything of slot s in flight: writes, reads, H2D copies. */
static int slot_quiesce(zn_trainer *tr, zn_opt_slot *s)
{
    int rc = zn_sched_slot_drain(tr, s);
    if (s->reads_issued) {
        /* (a failed read of a unit that never stepped loses nothing) */
        for (int k = 0; k < 3; k++)
            zn_ioq_wait(&tr->rq, &s->rd[k]);
        for (int k = 0; k < s->n_grd; k++)
            zn_ioq_wait(&tr->rq, &s->grd[k]);
        s->reads_issued = false;
        s->n_grd = 0;
    }
    return rc;
}

/* Optimizer states on NVMe: read ahead, step, write behind. */
int zn_sched_run_nvme(zn_trainer *tr)
{
    int S = tr->opt.n_slots, nu = tr->n_units, rc = 0;
    for (int j = 0; j < S; j++)
        tr->opt.slot[j].unit = -1;
    for (int i = 0; i < nu && !rc; i++) {
        int u = zn_sched_unit_at(tr, i);
        zn_opt_slot *s = &tr->opt.slot[i % S];
        /* this unit and the read-ahead window: states, and the gradients of
         * units whose gradients are final (even before the go) */
        for (int j = i; j < i + S && j < nu && !rc; j++) {
            zn_opt_slot *sj = &tr->opt.slot[j % S];
            int uj = zn_sched_unit_at(tr, j);
            if (sj->unit != uj) {
                if ((rc = zn_sched_slot_drain(tr, sj)))
                    break;
                if ((rc = zn_sched_slot_read_states(tr, sj, uj)))
                    break;
            }
            if (tr->grads_on_nvme && !sj->grads_issued && zn_sched_grads_final(tr, uj))
                rc = zn_sched_slot_read_grads(tr, sj, uj);
        }
        if (rc || (rc = zn_sched_wait_ready(tr, u)))
            break;
        /* with the second copy the states go to it and it becomes
         * current at once (nothing reads the unit before this job's writes
         * are done): a step never overwrites the only copy of the last
         * step's states, so that a checkpoint of them by reference
         * (zn_ckpt_commit_start) stays whole while the next step runs.
         * Without it both rows name the same extents. */
        if ((rc = nvme_step(tr, s, u, tr->opt.job.g_scale, true)))
            break;
        tr->units[u].cur ^= 1;
        /* m and v have their own bytes on NVMe now (the job waits for these
         * writes before any later read of the unit) */
        atomic_store(&tr->units[u].mv_zero, false);
    }
    /* Write behind ends here: nothing is reused or presented before every
     * write completed successfully. Reads still in flight are waited too. */
    for (int j = 0; j < S; j++) {
        int r = slot_quiesce(tr, &tr->opt.slot[j]);
        if (r && !rc)
            rc = r;
    }
    return rc;
}

/* ---- the speculative step ---------------------------------------------------
 * A job with `spec` (NVMe states with their second copy; clipping or fp16
 * asked for the go): before the go, each unit whose gradients are final
 * steps at once, from the top down, with the scale of an unclipped step,
 * writing its states to the second copy and its parameters home unpublished.
 * At the go the units below step upwards, as in run_nvme, and the speculated
 * ones commit when the final scale is the one they used (the same floats,
 * bit for bit), else step again from their first copy; with an fp16
 * overflow (the job cancelled) their parameters are written back from the
 * first copy's master. Speculation stops early once the final blocks' sum
 * of squares makes clipping certain (sq_limit) or an fp16 gradient is not
 * finite. */
typedef struct {
    int nu;
    int hi;               /* units [hi, nu) were stepped speculatively */
    int lo;               /* after the go: the next unit of [0, hi) */
    int rlo;              /* after the go, with redo: the next of [hi, nu) */
    bool go, redo, stop;
    double sq;            /* the final blocks' sum of squares counted so far */
    bool nonfinite;
    unsigned char *seen;  /* blocks counted in sq */
    int *want;            /* n_slots: the units to read ahead */
} spec_walk;

/* The k-th unit after the one being stepped, in the walk's order (-1: none
 * known yet). */
static int walk_next(const spec_walk *w, int k)
{
    if (w->go || w->stop) {
        if (w->lo + k < w->hi)
            return w->lo + k;
        k -= w->hi - w->lo;
        return w->go && w->redo && w->rlo + k < w->nu ? w->rlo + k : -1;
    }
    return w->hi - 1 - k >= 0 ? w->hi - 1 - k : -1;
}

static zn_opt_slot *slot_of(zn_trainer *tr, int u)
{
    for (int j = 0; j < tr->opt.n_slots; j++)
        if (tr->opt.slot[j].unit == u)
            return &tr->opt.slot[j];
    return NULL;
}

/* Reads ahead: unit `first` (>= 0: the one about to step) and the walk's
 * next ones into the slots, a slot whose unit is not wanted reused once
 * its I/O is done; then the gradients of wanted units already final. */
static int walk_fill(zn_trainer *tr, spec_walk *w, int first)
{
    int S = tr->opt.n_slots, n = 0, rc = 0;
    if (first >= 0)
        w->want[n++] = first;
    for (int k = 0; n < S; k++) {
        int u = walk_next(w, k);
        if (u < 0)
            break;
        w->want[n++] = u;
    }
    for (int i = 0; i < n && !rc; i++) {
        int u = w->want[i];
        zn_opt_slot *s = slot_of(tr, u);
        if (!s) {
            for (int j = 0; j < S && !s; j++) {
                zn_opt_slot *c = &tr->opt.slot[j];
                bool wanted = false;
                for (int q = 0; q < n && !wanted; q++)
                    wanted = c->unit == w->want[q];
                if (!wanted)
                    s = c;
            }
            if ((rc = slot_quiesce(tr, s)))
                break;
            if ((rc = zn_sched_slot_read_states(tr, s, u)))
                break;
        }
        if (tr->grads_on_nvme && !s->grads_issued && zn_sched_grads_final(tr, u))
            rc = zn_sched_slot_read_grads(tr, s, u);
    }
    return rc;
}

/* olock held: counts unit u's blocks into the sum of squares; whether
 * clipping or an overflow is now certain. */
static bool walk_doomed(zn_trainer *tr, spec_walk *w, int u)
{
    zn_unit *un = &tr->units[u];
    for (int k = 0; k < un->np; k++) {
        int b = tr->pieces[un->p0 + k].block;
        if (w->seen[b])
            continue;
        w->seen[b] = 1;
        w->sq += tr->blocks[b].grad_sq;
        w->nonfinite |= tr->blocks[b].grad_nonfinite != 0;
    }
    const zn_opt_job *j = &tr->opt.job;
    return (j->sq_limit > 0 && w->sq > j->sq_limit) || (j->stop_nonfinite && w->nonfinite);
}

/* The fp16 overflow voided the speculated units [hi, nu): their states were
 * never current, their parameters get the first copy's master back. */
static int spec_restore(zn_trainer *tr, int hi, int nu)
{
    bool p16 = tr->param_dt != ZN_DTYPE_F32;
    zn_opt_slot *s = &tr->opt.slot[0];
    int rc = 0;
    for (int u = hi; u < nu && !rc; u++) {
        zn_unit *un = &tr->units[u];
        if ((rc = spec_void(tr, un)) || (rc = slot_quiesce(tr, s)))
            break;
        s->unit = -1;
        rc = zn_ioq_submit(&tr->rq, &s->rd[0], 0, &zn_tier_get(&tr->tm, zn_tr_unit_sid(un, 0))->ext,
                           s->master, zn_sched_state_bytes(tr, u, 0), "master (speculative step undone)");
        int r = zn_ioq_wait(&tr->rq, &s->rd[0]);
        if (rc || (rc = r))
            break;
        const void *pout = s->master;
        if (tr->master_bf16 && !p16)
            rc = zn_convert(s->pout, ZN_DTYPE_F32, s->master, ZN_DTYPE_BF16, un->n);
        else if (!tr->master_bf16 && p16)
            rc = zn_convert(s->pout, tr->param_dt, s->master, ZN_DTYPE_F32, un->n);
        if (tr->master_bf16 != p16)
            pout = s->pout;
        if (!rc)
            rc = zn_sched_params_out(tr, u, pout, s->pwr, &s->n_pwr, s->h2d_done, &s->h2d_pending, false,
                            false);
        zn_sched_slot_params_issued(s);
        int r2 = zn_sched_slot_drain(tr, s);
        if (!rc)
            rc = r2;
        atomic_fetch_add(&tr->opt.spec_redos, 1);
    }
    return rc;
}

int zn_sched_run_nvme_spec(zn_trainer *tr)
{
    int S = tr->opt.n_slots, nu = tr->n_units, rc = 0;
    spec_walk w = { .nu = nu, .hi = nu };
    w.seen = calloc((size_t)tr->L, 1);
    w.want = calloc((size_t)S, sizeof *w.want);
    if (!w.seen || !w.want) {
        free(w.seen);
        free(w.want);
        return zn_set_error(-ENOMEM, "optimizer: out of memory");
    }
    for (int j = 0; j < S; j++)
        tr->opt.slot[j].unit = -1;
    const float spec_scale = tr->opt.job.spec_scale;
    for (;;) {
        if ((rc = walk_fill(tr, &w, -1)))
            break;
        int u = -1;
        bool spec = false, commit = false, done = false;
        float gs = spec_scale;
        pthread_mutex_lock(&tr->opt.lock);
        rc = atomic_load(&tr->err) ? atomic_load(&tr->err) : !zn_sched_job_live(tr) ? -ECANCELED : 0;
        if (!rc && !w.go && tr->opt.job.go) {
            w.go = true;
            /* float equality: the unclipped scale again, bit for bit (a
             * NaN norm never commits) */
            w.redo = w.hi < nu && !(tr->opt.job.g_scale == spec_scale);
            commit = w.hi < nu && !w.redo;
            w.rlo = w.hi;
        }
        if (rc) {
        } else if (w.go) {
            gs = tr->opt.job.g_scale;
            if (w.lo < w.hi)
                u = w.lo++;
            else if (w.redo && w.rlo < nu)
                u = w.rlo++;
            else
                done = true;
        } else if (!w.stop && w.hi > 0 && zn_sched_unit_final(tr, w.hi - 1)) {
            if (walk_doomed(tr, &w, w.hi - 1)) {
                w.stop = true;
            } else {
                u = --w.hi;
                spec = true;
            }
        } else {
            if (w.stop || w.hi == 0) {
                tr->opt.spec_parked = tr->opt.job.seq;  /* nothing more before the go */
                pthread_cond_broadcast(&tr->opt.cv);
            }
            pthread_cond_wait(&tr->opt.cv, &tr->opt.lock);
        }
        if (u >= 0)
            tr->opt.stepped = true;  /* from here on the job changes the state */
        pthread_mutex_unlock(&tr->opt.lock);
        if (rc)
            break;
        for (int v = w.hi; commit && v < nu; v++)
            spec_commit(tr, &tr->units[v]);
        if (done)
            break;
        if (u < 0)
            continue;
        zn_unit *un = &tr->units[u];
        bool again = w.go && u >= w.hi;
        if (again) {
            /* its first copy is read again; its states and parameters are
             * written again once the speculative writes are done */
            for (int j = 0; j < S && u == w.hi && !rc; j++)
                rc = zn_sched_slot_drain(tr, &tr->opt.slot[j]);
            if (rc || (rc = spec_void(tr, un)))
                break;
            atomic_fetch_add(&tr->opt.spec_redos, 1);
        }
        if (spec) {
            pthread_mutex_lock(&tr->opt.land_lock);
            un->spec = true;
            un->spec_landed = false;
            pthread_mutex_unlock(&tr->opt.land_lock);
            atomic_fetch_add(&tr->opt.spec_units, 1);
        }
        if ((rc = walk_fill(tr, &w, u)))
            break;
        if (spec)
            spec_f32(tr, u, true);
        zn_opt_slot *s = slot_of(tr, u);
        /* every unit writes the other copy: a speculated one commits by
         * switching to it; the others switch at once (nothing reads the
         * unit before this job's writes are done) */
        if ((rc = nvme_step(tr, s, u, gs, true)))
            break;
        if (!spec) {
            un->cur ^= 1;
            atomic_store(&un->mv_zero, false);
        }
    }
    /* an fp16 overflow cancelled the job after speculation began: the
     * speculated units' parameters go back to the first copy's */
    if (rc == -ECANCELED && w.hi < nu && !w.go && !atomic_load(&tr->err)) {
        for (int j = 0; j < S; j++)
            slot_quiesce(tr, &tr->opt.slot[j]);
        int r = spec_restore(tr, w.hi, nu);
        if (r)
            rc = r;
    }
    for (int j = 0; j < S; j++) {
        int r = slot_quiesce(tr, &tr->opt.slot[j]);
        if (r && !rc)
            rc = r;
    }
    /* a failure left speculated units uncommitted: no later landing of
     * theirs may wait for a commit (the trainer is failed anyway) */
    for (int v = w.hi; v < nu && rc && rc != -ECANCELED; v++) {
        pthread_mutex_lock(&tr->opt.land_lock);
        tr->units[v].spec = tr->units[v].spec_landed = false;
        pthread_mutex_unlock(&tr->opt.land_lock);
        zn_pcache_spec_void(tr, &tr->units[v]);
    }
    free(w.seen);
    free(w.want);
    return rc;
}

