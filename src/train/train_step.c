/* The step: each micro-batch's forward and backward over the blocks with
 * the fetch schedule, gradients D2H to the accumulation worker, the
 * ranks' losses and norms combined, clipping and the loss scale, then the
 * optimizer pipeline started; zn_train_eval through the same schedule. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"
#include "util/try-impl.h"
#include "zn_build_config.h"

/* Queues one micro-batch's forward and backward. `fe` is the step's fetch
 * list over ring blocks, *next_fetch the next entry to issue, *use the
 * running use index. */
/* run_micro_batch's return when the stop flag ended the step (its job
 * abandoned, nothing of the state changed) */
#define STEP_STOPPED 1

/* Whether the step ends here for the stop flag: only while its optimizer
 * job `job` has not begun changing the state (then it is abandoned: the
 * state stays the previous step's); after that the step goes on to its
 * end. */
static bool stop_here(zn_trainer *tr, int64_t job, bool *past)
{
    if (!tr->stop_flag || !*tr->stop_flag || *past)
        return false;
    if (zn_optsched_abandon(tr, job))
        return true;
    *past = true;
    return false;
}

static int run_micro_batch(zn_trainer *tr, int mb, const zn_fetch_ent *fe, int nfe,
                           int *next_fetch, int *use, const int *fetch_of_use,
                           uint64_t *nvme_fetches, int64_t job, bool *past)
{
    zn_dev *d = tr->dev;
    const zn_train_model *md = tr->model;
    int L = tr->L, rc;
    char name[ZN_TRACE_NAME_LEN];

    for (int k = 0; k < 2 * L; k++) {
        bool bwd = k >= L;
        int b = bwd ? 2 * L - 1 - k : k;
        int i = (*use)++;
        zn_block *bl = &tr->blocks[b];
        /* with a stop flag: the use n_stop_ev - 1 before this one done
         * first, then the flag looked at */
        if (tr->stop_flag && tr->n_stop_ev && i >= tr->n_stop_ev - 1 &&
            (rc = zn_dev_event_sync(d, tr->stop_ev[(i - (tr->n_stop_ev - 1)) % tr->n_stop_ev])))
            return rc;
        if (stop_here(tr, job, past))
            return STEP_STOPPED;
        if ((rc = zn_tr_issue_fetches(tr, fe, nfe, next_fetch, i, nvme_fetches)))
            return rc;
        void *params = bl->dev_params;
        int f = fetch_of_use[i];
        int slot = f >= 0 ? f % tr->fetch.n_slots : -1;
        if (slot >= 0) {
            if ((rc = zn_dev_stream_wait_event(d, tr->s_comp, tr->fetch.ev_ready[slot])))
                return rc;
            params = tr->fetch.slot[slot];
        } else if ((rc = zn_tr_wait_params(tr, b))) {
            return rc;  /* resident on the device: the update's H2D must have landed */
        }
        const void *in = bl->gfirst > 0 ? tr->ckpt[bl->gfirst] : NULL;
        snprintf(name, sizeof name, "%s b%d", bwd ? "bwd" : "fwd", b);
        if (!bwd) {
            if (b == bl->gfirst && (rc = zn_tr_ck_before_write(tr, bl->glast + 1)))
                return rc;
            zn_mark *mk = zn_train_mark_begin(tr, tr->s_comp, ZN_RES_COMPUTE, name);
            void *o = bl->glast < L - 1 ? tr->ckpt[bl->glast + 1] : NULL;
            if ((rc = md->forward(md->ctx, tr->s_comp, b, params, in, o)))
                return zn_error_prefix(rc, "forward of block %d", b);
            zn_train_mark_end(tr, tr->s_comp, mk);
            if (b == bl->glast && (rc = zn_tr_ck_save(tr, bl->glast + 1)))
                return rc;
        } else {
            if (b == bl->glast && (rc = zn_tr_ck_enter_backward(tr, bl)))
                return rc;
            int g = (L - 1 - b) & 1;
            const void *dout = bl->glast < L - 1 ? tr->dact[(bl->group + 1) & 1] : NULL;
            void *din = bl->gfirst > 0 ? tr->dact[bl->group & 1] : NULL;
            bool grads = bl->gpad > 0;  /* else wholly frozen: only din */
            if (grads && ((rc = zn_dev_stream_wait_event(d, tr->s_comp, tr->ev_gfree[g])) ||
                          (rc = zn_dev_memset(d, tr->s_comp, tr->gdev[g], 0, bl->gpad * 4))))
                return rc;
            zn_mark *mk = zn_train_mark_begin(tr, tr->s_comp, ZN_RES_COMPUTE, name);
            if ((grads || din) &&
                (rc = md->backward(md->ctx, tr->s_comp, b, params, in, dout, din,
                                   grads ? tr->gdev[g] : NULL)))
                return zn_error_prefix(rc, "backward of block %d", b);
            zn_train_mark_end(tr, tr->s_comp, mk);
            if (!grads)
                goto consumed;
            if ((rc = zn_dev_event_record(d, tr->ev_gready[g], tr->s_comp)))
                return rc;
            /* grads: with N > 1 ranks, reduce-scatter in place (each rank
             * keeps the sum of its shard), then D2H of this rank's part into
             * pinned staging, then accumulate */
            zn_event *gdone = tr->ev_gready[g];
            float *gsrc = (float *)tr->gdev[g] + (bl->soff - bl->frozen);
            if (tr->world > 1) {
                if ((rc = zn_dev_stream_wait_event(d, tr->s_comm, tr->ev_gready[g])))
                    return rc;
                snprintf(name, sizeof name, "reduce-scatter b%d", b);
                zn_mark *m3 = zn_train_mark_begin(tr, tr->s_comm, ZN_RES_COMM, name);
                if ((rc = zn_comm_reduce_scatter_on(tr->comm, tr->s_comm, tr->gdev[g], gsrc,
                                                    bl->shard, ZN_DTYPE_F32, ZN_REDUCE_SUM)))
                    return rc;
                zn_train_mark_end(tr, tr->s_comm, m3);
                if ((rc = zn_dev_event_record(d, tr->ev_rs[g], tr->s_comm)))
                    return rc;
                gdone = tr->ev_rs[g];
            }
            if ((rc = zn_dev_stream_wait_event(d, tr->s_d2h, gdone)))
                return rc;
            if (tr->opt_on_device) {
                if ((rc = zn_tr_accum_on_device(tr, mb, b, g, gsrc)))
                    return rc;
                goto consumed;
            }
            /* staging buffer g is free once its last accumulation ended:
             * the stream waits for the worker's count, no host function */
            if ((rc = zn_dev_stream_wait_value(d, tr->s_d2h, zn_tr_accum_flag(tr, g),
                                               tr->acc.posted[g])))
                return rc;
            snprintf(name, sizeof name, "d2h b%d", b);
            zn_mark *m2 = zn_train_mark_begin(tr, tr->s_d2h, ZN_RES_D2H, name);
            uint64_t gbytes = bl->len * zn_dtype_size(tr->grad_dt);
            const int32_t *rows = NULL;
            int64_t nrows = -1;
            if (bl->srow0 >= 0) {
                /* the rows of this micro-batch's tokens only: gathered (and
                 * cast) on the D2H stream, gdev[g] then free */
                int64_t ntok = tr->spec.plan.micro_batch * tr->spec.plan.seq_len;
                int64_t W = md->row_width, nr = (int64_t)(bl->len / (uint64_t)W);
                const int32_t *u = tr->fetch.rows + (size_t)mb * (size_t)ntok;
                int64_t lo = zn_tr_lower_bound_i32(u, tr->fetch.n_rows[mb], bl->srow0);
                int64_t hi = zn_tr_lower_bound_i32(u, tr->fetch.n_rows[mb], bl->srow0 + nr);
                rows = u + lo;
                nrows = hi - lo;
                gbytes = (uint64_t)(nrows * W) * zn_dtype_size(tr->grad_dt);
                if (nrows &&
                    (rc = zn_dev_embedding_rows_fwd(d, tr->s_d2h,
                                                    tr->fetch.rows_dev + (size_t)mb * (size_t)ntok + lo,
                                                    nrows, gsrc, ZN_DTYPE_F32, bl->srow0, nr, W,
                                                    tr->gcast, tr->grad_dt)))
                    return rc;
                if ((rc = zn_dev_event_record(d, tr->ev_gfree[g], tr->s_d2h)) ||
                    (nrows && (rc = zn_dev_copy_d2h(d, tr->s_d2h, tr->gstage[g], tr->gcast,
                                                    gbytes))))
                    return rc;
            } else if (tr->grad_dt != ZN_DTYPE_F32 && bl->len) {
                /* cast the shard, free gdev[g] for the next block, then
                 * move half the bytes */
                if ((rc = zn_dev_cast(d, tr->s_d2h, gsrc, ZN_DTYPE_F32, tr->gcast, tr->grad_dt,
                                      bl->len)) ||
                    (rc = zn_dev_event_record(d, tr->ev_gfree[g], tr->s_d2h)) ||
                    (rc = zn_dev_copy_d2h(d, tr->s_d2h, tr->gstage[g], tr->gcast, gbytes)))
                    return rc;
            } else {
                if (bl->len &&
                    (rc = zn_dev_copy_d2h(d, tr->s_d2h, tr->gstage[g], gsrc, gbytes)))
                    return rc;
                if ((rc = zn_dev_event_record(d, tr->ev_gfree[g], tr->s_d2h)))
                    return rc;
            }
            zn_train_mark_end(tr, tr->s_d2h, m2);
            atomic_fetch_add(&tr->tm.d2h, gbytes);
            zn_accum_arg *aa = &tr->fetch.accum_args[mb * L + b];
            aa->tr = tr;
            aa->block = b;
            aa->gbuf = g;
            aa->mb = mb;
            aa->rows = rows;
            aa->nrows = nrows;
            if ((rc = zn_dev_launch_host_fn(d, tr->s_d2h, zn_accum_post_fn, aa)))
                return rc;
            tr->acc.posted[g]++;  /* the job the D2H stream waits on before refilling g */
        }
    consumed:
        if (tr->stop_flag && tr->n_stop_ev &&
            (rc = zn_dev_event_record(d, tr->stop_ev[i % tr->n_stop_ev], tr->s_comp)))
            return rc;
        if (slot >= 0 && fe[f].last_use == i &&
            (rc = zn_dev_event_record(d, tr->fetch.ev_consumed[slot], tr->s_comp)))
            return rc;
        if (atomic_load(&tr->err))
            return atomic_load(&tr->err);
    }
    /* the next micro-batch's fetches whose slots are now spoken for */
    return zn_tr_issue_fetches(tr, fe, nfe, next_fetch, *use, nvme_fetches);
}

/* The step's figures over all ranks, identical on every rank: each rank's
 * loss sum, overflow flag and per-block sums of squares are all-gathered
 * (as raw doubles) and added in rank order, blocks in block order. */
static int combine_ranks(zn_trainer *tr, double *loss_sum, double *sq, int *nonfinite)
{
    int L = tr->L, W = tr->world, K = L + 2;
    double *all = malloc((size_t)K * (size_t)(W + 1) * sizeof *all);
    if (!all)
        return zn_set_error(-ENOMEM, "train: out of memory");
    double *mine = all + (size_t)K * (size_t)W;
    mine[0] = *loss_sum;
    mine[1] = 0;
    for (int b = 0; b < L; b++) {
        mine[2 + b] = tr->blocks[b].grad_sq;
        if (tr->blocks[b].grad_nonfinite)
            mine[1] = 1;
    }
    if (W > 1) {
        /* doubles travel as pairs of f32 words: a copy, no arithmetic */
        int rc = zn_comm_allgather(tr->comm, mine, all, (size_t)K * 2, ZN_DTYPE_F32);
        if (rc) {
            free(all);
            return zn_error_prefix(rc, "step statistics");
        }
    } else {
        memcpy(all, mine, (size_t)K * sizeof *all);
    }
    double ls = 0, s = 0;
    int nf = 0;
    for (int r = 0; r < W; r++) {
        ls += all[(size_t)r * K];
        nf |= all[(size_t)r * K + 1] != 0;
    }
    for (int b = 0; b < L; b++)
        for (int r = 0; r < W; r++)
            s += all[(size_t)r * K + 2 + b];
    *loss_sum = ls;
    *sq = s;
    *nonfinite = nf;
    free(all);
    return 0;
}

/* Targets >= 0 among this rank's n, summed over the ranks (a copy of each
 * rank's count travels as two f32 words, like combine_ranks' doubles). */
static int count_targets(zn_trainer *tr, const int32_t *targets, uint64_t n, uint64_t *out)
{
    uint64_t mine = 0;
    for (uint64_t i = 0; i < n; i++)
        mine += targets[i] >= 0;
    *out = mine;
    if (tr->world == 1)
        return 0;
    uint64_t *all = malloc((size_t)tr->world * sizeof *all);
    if (!all)
        return zn_set_error(-ENOMEM, "train: out of memory");
    int rc = zn_comm_allgather(tr->comm, &mine, all, 2, ZN_DTYPE_F32);
    if (rc) {
        free(all);
        return zn_error_prefix(rc, "step target count");
    }
    *out = 0;
    for (int r = 0; r < tr->world; r++)
        *out += all[r];
    free(all);
    return 0;
}

/* ZeRO stages 1/2 with N > 1 ranks: every rank updated its shard of the
 * replicated parameters; all-gather them in place so that every rank holds
 * the whole updated block again. */
int zn_tr_gather_replicated(zn_trainer *tr)
{
    if (tr->world == 1)
        return 0;
    int rc = 0;
    for (int b = 0; b < tr->L && !rc; b++) {
        zn_block *bl = &tr->blocks[b];
        if (!bl->replicated || bl->home != ZN_PHOME_DEVICE || !bl->shard)
            continue;
        /* the trainable part only: a frozen base never changes */
        rc = zn_comm_allgather_on(tr->comm, tr->s_comm,
                                  (char *)bl->dev_params + bl->soff * tr->param_bytes,
                                  (char *)bl->dev_params + bl->frozen * tr->param_bytes, bl->shard,
                                  tr->param_dt);
    }
    int r2 = zn_comm_sync_on(tr->comm, tr->s_comm);
    return rc ? rc : r2;
}

static int step_failed(zn_trainer *tr, int rc, int64_t step)
{
    zn_optsched_cancel(tr, true);
    zn_dev_sync(tr->dev);
    zn_tr_marks_drop(tr);
    zn_accum_drain(tr);
    zn_optsched_wait(tr);
    tr->opt.inflight = false;
    zn_ioq_fence(&tr->rq);  /* the step's reads and writes; never the */
    zn_ioq_fence(&tr->wq);  /* engine's wait_all, which would free requests
                               the queues' threads wait on */
    tr->bad = true;
    char msg[1024];
    int e = atomic_load(&tr->err);
    if (e) {
        snprintf(msg, sizeof msg, "%s", tr->errmsg);
        rc = e;
    } else {
        snprintf(msg, sizeof msg, "%s", zn_last_error());
    }
    return zn_set_error(rc, "step %lld failed; the training state is not valid: %s",
                        (long long)step, msg[0] ? msg : zn_strerror(rc));
}

/* A step the stop flag ended: its queued work drained, its job dropped
 * (zn_optsched_abandon); the previous step's job, which the state is, goes
 * on to its end (zn_train_sync). The trainer stays valid. */
static int step_stopped(zn_trainer *tr, int64_t step)
{
    zn_dev_sync(tr->dev);
    zn_tr_marks_drop(tr);
    zn_accum_drain(tr);
    zn_ioq_fence(&tr->rq);  /* the step's reads and writes; never the */
    zn_ioq_fence(&tr->wq);  /* engine's wait_all, which would free requests
                               the queues' threads wait on */
    int e = atomic_load(&tr->err);
    if (e)
        return step_failed(tr, e, step);
    return zn_set_error(-ECANCELED, "step %lld stopped before its update (the stop flag); "
                        "the state is step %lld's", (long long)step, (long long)tr->step);
}

int zn_train_set_stop(zn_trainer *tr, const volatile sig_atomic_t *flag)
{
    if (flag && tr->world > 1)
        return zn_set_error(ZN_EARG, "train: a step cannot stop halfway on one of %d ranks "
                            "(the others would wait in its collectives)", tr->world);
    /* as far ahead as the parameter slots let the fetches run, and two
     * block uses at least */
    int want = tr->fetch.n_slots + 1 > 3 ? tr->fetch.n_slots + 1 : 3;
    if (want > (int)(sizeof tr->stop_ev / sizeof tr->stop_ev[0]))
        want = (int)(sizeof tr->stop_ev / sizeof tr->stop_ev[0]);
    while (flag && tr->n_stop_ev < want) {
        int rc = zn_dev_event_create(tr->dev, &tr->stop_ev[tr->n_stop_ev]);
        if (rc)
            return zn_error_prefix(rc, "train: the stop flag's events");
        tr->n_stop_ev++;
    }
    tr->stop_flag = flag;
    return 0;
}

int zn_train_step(zn_trainer *tr, const int32_t *ids, const int32_t *targets,
                  const int32_t *pos, zn_train_step_info *info)
{
    if (tr->bad)
        return zn_set_error(ZN_ECORRUPT, "the trainer failed in an earlier step; its state "
                            "is not valid");
    const zn_spec *sp = &tr->spec;
    int L = tr->L, A = (int)sp->accumulation, rc;
    if (A < 1)
        A = 1;
    int64_t B = sp->plan.micro_batch, T = sp->plan.seq_len;
    uint64_t ntok = (uint64_t)(B * T);
    uint64_t t_start = zn_now_ns();
    if ((rc = zn_tr_ensure_capacity(tr, A)))
        return rc;
    /* the previous step's optimizer job may still run (pipeline): its
     * failure fails this step */
    if (atomic_load(&tr->err))
        return step_failed(tr, atomic_load(&tr->err), tr->stats.steps_run + 1);
    zn_tr_marks_drop(tr);

    bool clip = sp->clip > 0, fp16 = sp->fp16;
    double scale = tr->scaler.scale;
    double lr = zn_lr_schedule(&sp->sched, sp->lr, tr->step);
    if (tr->lr_fault)
        lr = tr->lr_fault(tr->lr_fault_user, tr->step + 1, lr);
    zn_adam_params hp = zn_adam_params_default();
    hp.lr = (float)lr;
    hp.beta1 = sp->beta1;
    hp.beta2 = sp->beta2;
    hp.eps = (float)sp->eps;
    hp.weight_decay = (float)sp->weight_decay;
    hp.adamw_mode = sp->adamw;
    hp.bias_correction = sp->bias_correction;
    hp.step = tr->step + 1;
    hp.threads = tr->threads;

    for (int u = 0; u < tr->n_units; u++)
        atomic_store(&tr->units[u].pieces_done, 0);
    for (int b = 0; b < L; b++) {
        tr->blocks[b].grad_sq = 0;
        tr->blocks[b].grad_nonfinite = 0;
    }
    tr->opt.overlap_step = !clip && !fp16;
    /* Without clipping or overflow checks each unit steps as soon as its
     * grads are final; otherwise the job starts now too, but only reads
     * optimizer states ahead until the global norm gives the go. */
    /* With the NVMe states' second copy the job speculates (steps units
     * before the norm, unclipped) unless the last step clipped or
     * overflowed; it stops once clipping is certain: the final blocks'
     * norm alone above train's clip (the test below, in squares of the
     * scaled gradients). */
    zn_opt_spec spec = { 0, fp16 };
    if (clip && sp->clip > 1e-6)
        spec.sq_limit = ((sp->clip - 1e-6) * scale) * ((sp->clip - 1e-6) * scale);
    int64_t job = zn_optsched_begin(tr, &hp, (float)(1.0 / scale), !tr->opt.overlap_step,
                                    tr->opt.spec_clipped ? NULL : &spec);

    /* the step's fetch list: consecutive uses of one ring block share a fetch */
    zn_fetch_ent *fe;
    int *fetch_of_use, nfe;
    if ((rc = zn_tr_build_fetches(tr, A * 2 * L, L, true, &fe, &fetch_of_use, &nfe)))
        return step_failed(tr, rc, tr->stats.steps_run + 1);
    int next_fetch = 0, use = 0;
    uint64_t nvme_fetches = 0;
    bool past_stop = false;
    /* the mean over the targets of the global batch (every micro-batch of
     * every rank; an ignored target, < 0, counts nowhere), as the HF
     * Trainer computes it */
    uint64_t ntgt = 0;
    if ((rc = count_targets(tr, targets, ntok * (uint64_t)A, &ntgt)))
        return step_failed(tr, rc, tr->stats.steps_run + 1);
    float loss_scale = (float)(scale / (double)(ntgt ? ntgt : 1));
    double loss_sum = 0, aux_sum = 0;
    rc = 0;
    for (int mb = 0; mb < A && !rc; mb++) {
        rc = tr->model->set_batch(tr->model->ctx, tr->s_comp, ids + (size_t)mb * ntok,
                                  targets + (size_t)mb * ntok,
                                  pos ? pos + (size_t)mb * ntok : NULL, B, T, loss_scale);
        if (rc) {
            rc = zn_error_prefix(rc, "micro-batch %d", mb);
            break;
        }
        if (tr->model->set_dropout)
            tr->model->set_dropout(tr->model->ctx, 1,
                                   ((uint64_t)tr->step * (uint64_t)tr->world + (uint64_t)tr->rank) *
                                           (uint64_t)A + (uint64_t)mb);
        if (tr->any_sparse && (rc = zn_tr_stage_rows(tr, mb, ids + (size_t)mb * ntok, (int64_t)ntok)))
            break;
        rc = run_micro_batch(tr, mb, fe, nfe, &next_fetch, &use, fetch_of_use, &nvme_fetches,
                             job, &past_stop);
        if (rc == STEP_STOPPED)
            break;
        float l = 0;
        if (!rc && !(rc = tr->model->read_loss(tr->model->ctx, tr->s_comp, &l)))
            loss_sum += (double)l;
        double aux_w = 0, aux = 0;
        if (!rc && tr->model->read_aux_loss &&
            !(rc = tr->model->read_aux_loss(tr->model->ctx, &aux_w, &aux))) {
            loss_sum += aux_w * scale; /* 1: fp16 scaling is refused with it (train.c) */
            aux_sum += aux;
        }
    }
    free(fe);
    free(fetch_of_use);
    if (rc == STEP_STOPPED)
        return step_stopped(tr, tr->stats.steps_run + 1);
    if (!rc)
        rc = zn_dev_stream_sync(tr->dev, tr->s_comp);
    if (!rc)
        rc = zn_dev_stream_sync(tr->dev, tr->s_d2h);
    zn_accum_drain(tr); /* the blocks' sums of squares are in */
    if (!rc)
        rc = zn_dev_stream_sync(tr->dev, tr->s_h2d);
    if (!rc && tr->world > 1)
        rc = zn_comm_sync_on(tr->comm, tr->s_comm);
    if (!rc && atomic_load(&tr->err))
        rc = atomic_load(&tr->err);
    if (!rc)
        rc = zn_tr_marks_harvest(tr);  /* every stream with marks has synced */
    if (rc)
        return step_failed(tr, rc, tr->stats.steps_run + 1);

    /* global norm from the blocks' sums, in block order (placement-independent) */
    double sq = 0;
    int nonfinite = 0;
    if ((rc = combine_ranks(tr, &loss_sum, &sq, &nonfinite)))
        return step_failed(tr, rc, tr->stats.steps_run + 1);
    double norm = sqrt(sq) / scale;
    bool overflow = fp16 && (nonfinite || !isfinite(norm));
    tr->opt.spec_clipped = overflow;
    if (tr->opt.spec_settle)
        zn_optsched_settle(tr, job);
    if (!tr->opt.overlap_step && !overflow) {
        double coef = 1.0;
        if (clip && norm + 1e-6 > 0) {
            double c = sp->clip / (norm + 1e-6);
            if (c < 1.0)
                coef = c;
        }
        tr->opt.spec_clipped = coef < 1.0;
        zn_optsched_go(tr, (float)(coef / scale));
    } else if (overflow) {
        zn_optsched_cancel(tr, false);
        /* a speculative job puts the parameters it rewrote back before the
         * next step may fetch them (its uses wait for no newer job) */
        if ((rc = zn_optsched_wait(tr)) || (rc = atomic_load(&tr->err)))
            return step_failed(tr, rc, tr->stats.steps_run + 1);
    } else {
        zn_optsched_all_final(tr);
    }
    if (!overflow)
        tr->opt.land_need = job;  /* the next step's uses wait for this job's updates */
    if (tr->opt.pipeline) {
        /* the job finishes under the next step's forward: each use waits
         * only for its own block's parameters (wait_params) */
        tr->opt.inflight = true;
        tr->opt.inflight_step = tr->stats.steps_run + 1;
    } else {
        rc = zn_optsched_wait(tr);
        if (!rc)
            rc = zn_dev_stream_sync(tr->dev, tr->opt.s_h2d);
        if (!rc && !overflow)
            rc = zn_tr_gather_replicated(tr);
        if (!rc && atomic_load(&tr->err))
            rc = atomic_load(&tr->err);
        if (rc)
            return step_failed(tr, rc, tr->stats.steps_run + 1);
    }

    if (fp16 && zn_loss_scaler_update(&tr->scaler, overflow)) {
        tr->bad = true;
        return zn_set_error(ZN_ECONFIG, "step %lld: gradient overflow with the loss scale "
                            "already at fp16.min_loss_scale (%g): training diverged",
                            (long long)tr->stats.steps_run + 1, tr->scaler.min_scale);
    }
    if (!overflow)
        tr->step++;
    tr->stats.steps_run++;
    double secs = (double)(zn_now_ns() - t_start) * 1e-9;
    tr->stats.step_s += secs;
    tr->stats.tokens += ntok * (uint64_t)A * (uint64_t)tr->world;
    tr->stats.flops += tr->model->flops_per_token * (double)(ntok * (uint64_t)A);
    if (info) {
        info->step = tr->stats.steps_run;
        info->loss = loss_sum / scale;
        info->lr = lr;
        info->grad_norm = norm;
        info->loss_scale = scale;
        info->skipped = overflow;
        info->seconds = secs;
        info->tokens = ntok * (uint64_t)A * (uint64_t)tr->world;  /* all ranks */
        info->has_aux = tr->model->read_aux_loss != NULL;
        info->aux_loss = aux_sum / (double)A;
    }
    return 0;
}

int zn_train_eval(zn_trainer *tr, const int32_t *ids, const int32_t *targets,
                  const int32_t *pos, int n_micro, double *loss_sum, uint64_t *n_targets)
{
    if (tr->bad)
        return zn_set_error(ZN_ECORRUPT, "the trainer failed in an earlier step; its state "
                            "is not valid");
    if (n_micro < 1 || !ids || !targets)
        return zn_set_error(ZN_EARG, "train eval: %d micro-batches", n_micro);
    if (atomic_load(&tr->err))
        return step_failed(tr, atomic_load(&tr->err), tr->stats.steps_run);
    const zn_spec *sp = &tr->spec;
    const zn_train_model *md = tr->model;
    int L = tr->L, rc;
    int64_t B = sp->plan.micro_batch, T = sp->plan.seq_len;
    uint64_t ntok = (uint64_t)(B * T);
    if ((rc = zn_tr_ensure_capacity(tr, n_micro)))
        return rc;
    zn_tr_marks_drop(tr);
    zn_fetch_ent *fe;
    int *fetch_of_use, nfe;
    if ((rc = zn_tr_build_fetches(tr, n_micro * L, L, false, &fe, &fetch_of_use, &nfe)))
        return rc;
    int next_fetch = 0, use = 0;
    uint64_t nvme_fetches = 0, tgt = 0;
    double sum = 0;
    char name[ZN_TRACE_NAME_LEN];
    for (int mb = 0; mb < n_micro && !rc; mb++) {
        const int32_t *mi = ids + (size_t)mb * ntok, *mt = targets + (size_t)mb * ntok;
        const int32_t *mp = pos ? pos + (size_t)mb * ntok : NULL;
        for (uint64_t i = 0; i < ntok; i++)
            tgt += mt[i] >= 0;
        /* the loss the last block computes is the sum of its targets' xent */
        if ((rc = md->set_batch(md->ctx, tr->s_comp, mi, mt, mp, B, T, 1.0f))) {
            rc = zn_error_prefix(rc, "eval micro-batch %d", mb);
            break;
        }
        if (md->set_dropout)
            md->set_dropout(md->ctx, 0, 0);
        for (int b = 0; b < L && !rc; b++) {
            int i = use++;
            zn_block *bl = &tr->blocks[b];
            if ((rc = zn_tr_issue_fetches(tr, fe, nfe, &next_fetch, i, &nvme_fetches)))
                break;
            void *params = bl->dev_params;
            int f = fetch_of_use[i];
            int slot = f >= 0 ? f % tr->fetch.n_slots : -1;
            if (slot >= 0) {
                if ((rc = zn_dev_stream_wait_event(tr->dev, tr->s_comp, tr->fetch.ev_ready[slot])))
                    break;
                params = tr->fetch.slot[slot];
            } else if ((rc = zn_tr_wait_params(tr, b))) {
                break;
            }
            snprintf(name, sizeof name, "eval b%d", b);
            if (b == bl->gfirst && (rc = zn_tr_ck_before_write(tr, bl->glast + 1)))
                break;
            zn_mark *mk = zn_train_mark_begin(tr, tr->s_comp, ZN_RES_COMPUTE, name);
            if ((rc = md->forward(md->ctx, tr->s_comp, b, params,
                                  bl->gfirst > 0 ? tr->ckpt[bl->gfirst] : NULL,
                                  bl->glast < L - 1 ? tr->ckpt[bl->glast + 1] : NULL))) {
                rc = zn_error_prefix(rc, "eval forward of block %d", b);
                break;
            }
            zn_train_mark_end(tr, tr->s_comp, mk);
            if (slot >= 0 && fe[f].last_use == i &&
                (rc = zn_dev_event_record(tr->dev, tr->fetch.ev_consumed[slot], tr->s_comp)))
                break;
        }
        float l = 0;
        if (!rc && !(rc = md->read_loss(md->ctx, tr->s_comp, &l)))
            sum += (double)l;
    }
    free(fe);
    free(fetch_of_use);
    if (!rc)
        rc = zn_dev_stream_sync(tr->dev, tr->s_comp);
    if (!rc)
        rc = zn_dev_stream_sync(tr->dev, tr->s_h2d);
    if (!rc && tr->world > 1)
        rc = zn_comm_sync_on(tr->comm, tr->s_comm);
    if (!rc)
        rc = zn_tr_marks_harvest(tr);
    if (!rc && tr->world > 1) {
        /* every rank's (sum, count), added in rank order */
        double mine[2] = { sum, (double)tgt }, *all = malloc((size_t)tr->world * sizeof mine);
        if (!all)
            rc = zn_set_error(-ENOMEM, "train: out of memory");
        else if (!(rc = zn_comm_allgather(tr->comm, mine, all, 4, ZN_DTYPE_F32))) {
            sum = 0;
            tgt = 0;
            for (int r = 0; r < tr->world; r++) {
                sum += all[2 * r];
                tgt += (uint64_t)all[2 * r + 1];
            }
        }
        free(all);
    }
    if (rc)
        return step_failed(tr, rc, tr->stats.steps_run);
    *loss_sum = sum;
    *n_targets = tgt;
    return 0;
}

int zn_train_sync(zn_trainer *tr)
{
    if (tr->bad)
        return zn_set_error(ZN_ECORRUPT, "the trainer failed in an earlier step; its state "
                            "is not valid");
    if (!tr->opt.inflight)
        return 0;
    uint64_t t0 = zn_now_ns();
    int rc = zn_optsched_wait(tr);
    if (!rc)
        rc = zn_dev_stream_sync(tr->dev, tr->opt.s_h2d);
    if (!rc && atomic_load(&tr->err))
        rc = atomic_load(&tr->err);
    tr->opt.inflight = false;
    tr->stats.step_s += (double)(zn_now_ns() - t0) * 1e-9;  /* the step's tail */
    if (rc)
        return step_failed(tr, rc, tr->opt.inflight_step);
    return 0;
}
