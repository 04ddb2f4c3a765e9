/* The trainer's life: options, creation (plan, allocate every tier once,
 * initialise, then the workers) and destruction, failure, and the marks
 * the trace is made of. The other concerns have a file each: train_layout.c
 * (where each block's pieces live), train_alloc.c (allocation and the
 * plan), train_init.c (initial values written home), train_fetch.c (the
 * prefetch ring), train_actoff.c (activation checkpoints in pinned RAM),
 * train_step.c (the step and eval), train_report.c (reading state back,
 * the report, the trace), train_state.c (the state as checkpoints read and
 * write it, train-state.h); sched_optim.c and accum.c the optimizer
 * pipeline and the gradient accumulation. Each owns its sub-struct of
 * struct zn_trainer (train-impl.h). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"
#include "util/try-impl.h"
#include "zn_build_config.h"


zn_train_options zn_train_options_default(void)
{
    zn_train_options o;
    memset(&o, 0, sizeof o);
    return o;
}

void zn_train_fail(zn_trainer *tr, int rc, const char *fmt, ...)
{
    pthread_mutex_lock(&tr->elock);
    if (!atomic_load(&tr->err)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tr->errmsg, sizeof tr->errmsg, fmt, ap);
        va_end(ap);
        atomic_store(&tr->err, rc ? rc : ZN_EINTERNAL);
    }
    pthread_mutex_unlock(&tr->elock);
    zn_optsched_notify(tr);
    zn_optsched_notify_params(tr);
}

/* ---- marks: stream-side spans for the trace --------------------------------
 * A mark is a pair of timed events around work on a stream. Nothing runs on
 * the device's callback thread for it, so a mark can never be held behind
 * another stream's host function (CUDA runs them all on one thread). The
 * times are read after the step has synced: elapsed against one reference
 * event recorded then on an idle stream, whose completion the host clock
 * dates, so device spans and host spans (NVMe, Adam) share one time line. */
zn_mark *zn_train_mark_begin(zn_trainer *tr, zn_stream *s, int res, const char *name)
{
    if (tr->fetch.next_mark >= tr->fetch.n_marks)
        return NULL;
    zn_mark *mk = &tr->fetch.marks[tr->fetch.next_mark];
    for (int i = 0; i < 2; i++)
        if (!mk->ev[i] && zn_dev_event_create_timed(tr->dev, &mk->ev[i]))
            return NULL;  /* untimed; the error is not the step's */
    if (zn_dev_event_record(tr->dev, mk->ev[0], s))
        return NULL;
    tr->fetch.next_mark++;
    mk->track = tr->track[res];
    mk->ended = false;
    snprintf(mk->name, sizeof mk->name, "%s", name);
    return mk;
}

void zn_train_mark_end(zn_trainer *tr, zn_stream *s, zn_mark *mk)
{
    if (mk && zn_dev_event_record(tr->dev, mk->ev[1], s) == 0)
        mk->ended = true;
}

typedef struct {
    uint64_t t0, t1;
    int i;
} mark_span;

static int cmp_span(const void *a, const void *b)
{
    const mark_span *x = a, *y = b;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0 ? 1 : x->i - y->i;
}

int zn_tr_marks_harvest(zn_trainer *tr)
{
    int n = tr->fetch.next_mark, rc = 0;
    tr->fetch.next_mark = 0;
    if (n == 0)
        return 0;
    zn_dev *d = tr->dev;
    if (!tr->fetch.mark_ref && (rc = zn_dev_event_create_timed(d, &tr->fetch.mark_ref)))
        return rc;
    if ((rc = zn_dev_event_record(d, tr->fetch.mark_ref, tr->s_comp)) ||
        (rc = zn_dev_event_sync(d, tr->fetch.mark_ref)))
        return rc;
    uint64_t t_ref = zn_now_ns();
    mark_span *sp = malloc((size_t)n * sizeof *sp);
    if (!sp)
        return zn_set_error(-ENOMEM, "train: out of memory for %d marks", n);
    int k = 0;
    for (int i = 0; i < n && !rc; i++) {
        zn_mark *mk = &tr->fetch.marks[i];
        float a, b;
        if (!mk->ended)
            continue;
        if ((rc = zn_dev_event_sync(d, mk->ev[1])) ||
            (rc = zn_dev_event_elapsed_ms(d, mk->ev[0], tr->fetch.mark_ref, &a)) ||
            (rc = zn_dev_event_elapsed_ms(d, mk->ev[1], tr->fetch.mark_ref, &b)))
            break;
        double ago0 = a > 0 ? (double)a * 1e6 : 0, ago1 = b > 0 ? (double)b * 1e6 : 0;
        sp[k].t0 = t_ref - (uint64_t)(ago0 < (double)t_ref ? ago0 : 0);
        sp[k].t1 = t_ref - (uint64_t)(ago1 < (double)t_ref ? ago1 : 0);
        sp[k].i = i;
        k++;
    }
    /* each track's busy time is the union of its spans: give them in start order */
    qsort(sp, (size_t)k, sizeof *sp, cmp_span);
    for (int j = 0; j < k && !rc; j++) {
        zn_mark *mk = &tr->fetch.marks[sp[j].i];
        zn_trace_span(tr->trace, mk->track, mk->name, sp[j].t0, sp[j].t1);
    }
    free(sp);
    return rc;
}

void zn_tr_marks_drop(zn_trainer *tr)
{
    tr->fetch.next_mark = 0;
}

void zn_tr_marks_free(zn_trainer *tr)
{
    for (int i = 0; i < tr->fetch.n_marks; i++)
        for (int e = 0; e < 2; e++)
            zn_dev_event_destroy(tr->dev, tr->fetch.marks[i].ev[e]);
    zn_dev_event_destroy(tr->dev, tr->fetch.mark_ref);
    free(tr->fetch.marks);
    tr->fetch.marks = NULL;
    tr->fetch.mark_ref = NULL;
    tr->fetch.n_marks = 0;
}

static int make_event(zn_trainer *tr, zn_event **e)
{
    return zn_dev_event_create(tr->dev, e);
}

/* The plan the run allocates from: the placement (zn_plan_compute), then
 * build_layout and allocate run dry for rank `rank` of `world`, recording
 * every allocation; the class table is rebuilt from the records. */
/* The dtype a block's gradients leave the device in: the params' (bf16
 * halves the D2H bytes; the host accumulates in fp32, as DeepSpeed's bf16
 * gradients are), or what train.grad_transfer says. */
zn_dtype zn_tr_grad_transfer_dtype(const zn_spec *sp, zn_dtype pdt)
{
    switch (sp->grad_transfer) {
    case 1: return ZN_DTYPE_F32;
    case 2: return ZN_DTYPE_BF16;
    default: return pdt == ZN_DTYPE_BF16 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    }
}

int zn_train_create(zn_trainer **out, const zn_train_options *o)
{
    *out = NULL;
    if (!o || !o->spec || !o->model || o->model->n_blocks < 1 ||
        !o->model->block_params || !o->model->forward || !o->model->backward ||
        !o->model->init_params || !o->model->set_batch || !o->model->read_loss)
        return zn_set_error(ZN_EARG, "train: incomplete options (spec, model)");
    /* the spec as this rank plans it: the planner's input completed with
     * what only the trainer learns (the device, the ranks) */
    zn_spec spl = *o->spec;
    zn_spec *sp = &spl;
    zn_plan_input *in = &spl.plan;
    const char *devname = sp->device[0] ? sp->device : "auto";
    bool maybe_cuda = ZN_HAVE_CUDA && strcmp(devname, "host") != 0;
    bool half = sp->bf16 || sp->fp16;

    /* Plan first: an infeasible config stops here, before any allocation. */
    in->param_bytes = maybe_cuda && half ? 2 : 4;
    /* a 16-bit run is planned as a GPU run; an fp32 one learns whether it
     * is one from its device (a CUDA build on a machine without a GPU runs
     * fp32 on the host backend, and must not be refused for the streams
     * a GPU would hold) and is re-planned below when it is */
    in->cuda = maybe_cuda && half;
    if (o->comm)
        in->world_size = zn_comm_size(o->comm);  /* budgets are per rank */
    zn_plan plan;
    int crank = o->comm ? zn_comm_rank(o->comm) : 0;
    int rc = zn_tr_dry_plan(&plan, o, sp, in->world_size, crank);
    if (rc == ZN_ENOFIT)
        return zn_set_error(ZN_ENOFIT, "does not fit: %s", plan.why);
    if (rc)
        return rc;

    zn_trainer *tr = calloc(1, sizeof *tr);
    if (!tr)
        return zn_set_error(-ENOMEM, "train: out of memory");
    tr->spec = *o->spec;
    tr->spec.plan.block_params = NULL;  /* the caller's; the model's are the record */
    tr->model = o->model;
    tr->comm = o->comm;
    tr->rank = 0;
    tr->world = 1;
    tr->plan = plan;
    tr->fault_hook = o->fault_hook;
    tr->fault_user = o->fault_user;
    tr->lr_fault = o->lr_fault;
    tr->lr_fault_user = o->lr_fault_user;
    tr->opt.spec_settle = o->spec_settle != 0;
    pthread_mutex_init(&tr->elock, NULL);
    tr->param_home = sp->param_home;
    tr->opt_home = sp->opt_home;
    if (sp->zero_stage < 3 && tr->param_home != ZN_TIER_GPU) {
        rc = zn_set_error(ZN_ECONFIG, "%s: %s needs stage 3 (stage is %d)", sp->source,
                          sp->key.param_home, sp->zero_stage);
        goto fail;
    }
    tr->threads = sp->threads;
    ZN_TRY_GOTO(zn_trace_create(&tr->trace, o->record_trace, 0));
    for (int r = 0; r < ZN_RES_COUNT; r++) {
        tr->track[r] = r == ZN_RES_NVME
                           ? zn_trace_add_union(tr->trace, zn_train_resource_name(r),
                                                tr->track[ZN_RES_NVME_READ],
                                                tr->track[ZN_RES_NVME_WRITE])
                           : zn_trace_add_track(tr->trace, zn_train_resource_name(r));
        if (tr->track[r] < 0)
            ZN_TRY_GOTO(tr->track[r]);
    }

    /* The device arena takes what the plan allocates (plus the arena's own
     * alignment slack), not the whole gpu budget: what the budget leaves on
     * a real GPU stays free for cuBLAS workspaces, NCCL buffers and lazily
     * loaded kernels, which allocate outside the arena. */
    zn_dev_config dc = zn_dev_config_default();
    dc.name = devname;
    dc.gpu_budget = zn_tr_arena_bytes(&tr->plan, sp->budgets.bytes[ZN_TIER_GPU]);
    dc.cpu_budget = sp->budgets.bytes[ZN_TIER_CPU];
    dc.defer_arena = 1;  /* reserved once the streams and NCCL have taken theirs */
    ZN_TRY_GOTO(zn_dev_create(&tr->dev, &dc));
    bool cuda = zn_dev_get_kind(tr->dev) == ZN_DEV_CUDA;
    if (cuda && sp->fp16) {
        rc = zn_set_error(ZN_EUNSUPPORTED, "%s: fp16 compute is not implemented on CUDA; use "
                          "\"bf16\": {\"enabled\": true}", sp->source);
        goto fail;
    }
    tr->param_dt = cuda && sp->bf16 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    tr->param_bytes = zn_dtype_size(tr->param_dt);
    if ((int)tr->param_bytes != in->param_bytes || in->cuda != cuda) {
        /* auto fell back to the host backend (re-planned with fp32 params
         * and nothing outside the arena), or an fp32 run found a GPU
         * (re-planned with its streams outside the arena) */
        in->param_bytes = (int)tr->param_bytes;
        in->cuda = cuda;
        rc = zn_tr_dry_plan(&tr->plan, o, sp, in->world_size, crank);
        if (rc == ZN_ENOFIT) {
            rc = zn_set_error(ZN_ENOFIT, "does not fit: %s", tr->plan.why);
            goto fail;
        }
        if (rc)
            goto fail;
        /* and an arena of that plan's size (nothing is allocated yet; on
         * CUDA the arena is reserved below, after the streams) */
        dc.gpu_budget = zn_tr_arena_bytes(&tr->plan, sp->budgets.bytes[ZN_TIER_GPU]);
        if (!cuda) {
            zn_dev_destroy(tr->dev);
            tr->dev = NULL;
            dc.name = "host";
            ZN_TRY_GOTO(zn_dev_create(&tr->dev, &dc));
        }
    }
    /* the load-balancing loss is added unscaled and per rank: with fp16's
     * loss scaling or several ranks its weight would be another */
    if (o->model->read_aux_loss && (sp->fp16 || (tr->comm && zn_comm_size(tr->comm) > 1)))
        ZN_TRY_GOTO(zn_set_error(ZN_EUNSUPPORTED, "train: the load-balancing loss "
                                 "(output_router_logits) trains on one rank without fp16 "
                                 "loss scaling only (this run: %s, %d ranks)",
                                 sp->fp16 ? "fp16" : "no fp16",
                                 tr->comm ? zn_comm_size(tr->comm) : 1));
    if (tr->comm && zn_comm_size(tr->comm) > 1) {
        tr->world = zn_comm_size(tr->comm);
        tr->rank = zn_comm_rank(tr->comm);
        /* the collectives run on the comm's own stream on this device */
        ZN_TRY_GOTO(zn_comm_attach_device(tr->comm, tr->dev));
        tr->comm_attached = true;
        tr->s_comm = zn_comm_stream(tr->comm);
    }
    ZN_TRY_GOTO(zn_tier_init(&tr->tm, tr->dev, &sp->budgets));
    ZN_TRY_GOTO(zn_dev_stream_create(tr->dev, "compute", &tr->s_comp));
    ZN_TRY_GOTO(zn_dev_stream_create_copy(tr->dev, "h2d", &tr->s_h2d));
    ZN_TRY_GOTO(zn_dev_stream_create_copy(tr->dev, "d2h", &tr->s_d2h));
    ZN_TRY_GOTO(zn_dev_stream_create_copy(tr->dev, "opt-h2d", &tr->opt.s_h2d));
    ZN_TRY_GOTO(zn_accum_start(tr));

    tr->grads_on_nvme = tr->opt_home == ZN_TIER_NVME && tr->plan.grads_tier == ZN_TIER_NVME;
    tr->opt_on_device = tr->opt_home == ZN_TIER_GPU;
    tr->grad_dt = tr->opt_on_device ? ZN_DTYPE_F32 : zn_tr_grad_transfer_dtype(sp, tr->param_dt);
    tr->act.on = sp->cpu_activations;
    if (tr->act.on) {
        ZN_TRY_GOTO(zn_dev_stream_create_copy(tr->dev, "activations", &tr->act.stream));
        for (int i = 0; i < ZN_CK_RING; i++) {
            ZN_TRY_GOTO(make_event(tr, &tr->act.ev_written[i]));
            ZN_TRY_GOTO(make_event(tr, &tr->act.ev_saved[i]));
            ZN_TRY_GOTO(make_event(tr, &tr->act.ev_loaded[i]));
        }
        ZN_TRY_GOTO(make_event(tr, &tr->act.ev_compute));
    }
    /* The arena last: NCCL's communicator (attached above) and every
     * stream's cuBLAS workspace and scratch exist now, so the arena is
     * checked against what they really left free, and a library that would
     * have allocated after it cannot find the GPU full. */
    ZN_TRY_GOTO(zn_dev_arena_reserve(tr->dev, dc.gpu_budget));
    if (cuda) {
        uint64_t got = zn_dev_outside_arena(tr->dev), want = tr->plan.gpu_outside;
        char b1[32], b2[32];
        zn_format_size(got, b1, sizeof b1);
        zn_format_size(want, b2, sizeof b2);
        if (got > want + (want >> 3) + (64u << 20))
            zn_warn("gpu: %s in use outside the arena (the context's modules, cuBLAS, NCCL; "
                    "other processes' allocations count too), more than the %s the plan "
                    "counts: leave more of the GPU free (a smaller tiers.gpu)", b1, b2);
        else
            zn_info("gpu: %s in use outside the arena; the plan counts %s", b1, b2);
    }
    ZN_TRY_GOTO(zn_tr_build_layout(tr));
    ZN_TRY_GOTO(zn_tr_allocate(tr));
    if (o->model->keep_block0 && o->model->bind_block0)
        for (int b = 0; b < tr->L && tr->blocks[b].group == 0; b++)
            o->model->bind_block0(o->model->ctx, b, tr->blocks[b].dev_params);
    if (tr->tm.aio) {
        ZN_TRY_GOTO(zn_ioq_start(&tr->rq, tr->tm.aio, tr->trace, tr->track[ZN_RES_NVME_READ],
                         &tr->tm.nvme_read));
        ZN_TRY_GOTO(zn_ioq_start(&tr->wq, tr->tm.aio, tr->trace, tr->track[ZN_RES_NVME_WRITE],
                         &tr->tm.nvme_write));
    }

    /* requests and events */
    for (int s = 0; s < 16; s++) {
        zn_opt_slot *sl = &tr->opt.slot[s];
        sl->unit = -1;
        for (int i = 0; i < 3; i++) {
            atomic_store(&sl->rd[i].done, 1);
            atomic_store(&sl->wr[i].done, 1);
        }
        if (s >= tr->opt.n_slots)
            continue;
        sl->grd = calloc((size_t)tr->max_unit_pieces, sizeof *sl->grd);
        sl->pwr = calloc((size_t)tr->max_unit_pieces, sizeof *sl->pwr);
        if (!sl->grd || !sl->pwr) {
            rc = zn_set_error(-ENOMEM, "train: out of memory");
            goto fail;
        }
        ZN_TRY_GOTO(make_event(tr, &sl->h2d_done));
    }
    if (tr->fetch.n_stage) {
        tr->fetch.stage_req = calloc((size_t)tr->fetch.n_stage * (size_t)tr->max_block_pieces,
                                sizeof *tr->fetch.stage_req);
        if (!tr->fetch.stage_req) {
            rc = zn_set_error(-ENOMEM, "train: out of memory");
            goto fail;
        }
        for (int i = 0; i < tr->fetch.n_stage; i++)
            ZN_TRY_GOTO(make_event(tr, &tr->fetch.ev_stage_free[i]));
    }
    if (tr->fetch.n_slots) {
        tr->fetch.ev_ready = calloc((size_t)tr->fetch.n_slots, sizeof *tr->fetch.ev_ready);
        tr->fetch.ev_consumed = calloc((size_t)tr->fetch.n_slots, sizeof *tr->fetch.ev_consumed);
        if (!tr->fetch.ev_ready || !tr->fetch.ev_consumed) {
            rc = zn_set_error(-ENOMEM, "train: out of memory");
            goto fail;
        }
        tr->fetch.ev_shard = calloc((size_t)tr->fetch.n_slots, sizeof *tr->fetch.ev_shard);
        if (!tr->fetch.ev_shard) {
            rc = zn_set_error(-ENOMEM, "train: out of memory");
            goto fail;
        }
        for (int s = 0; s < tr->fetch.n_slots; s++) {
            ZN_TRY_GOTO(make_event(tr, &tr->fetch.ev_ready[s]));
            ZN_TRY_GOTO(make_event(tr, &tr->fetch.ev_consumed[s]));
            ZN_TRY_GOTO(make_event(tr, &tr->fetch.ev_shard[s]));
        }
    }
    for (int i = 0; i < 2; i++) {
        ZN_TRY_GOTO(make_event(tr, &tr->ev_gready[i]));
        ZN_TRY_GOTO(make_event(tr, &tr->ev_gfree[i]));
        ZN_TRY_GOTO(make_event(tr, &tr->ev_rs[i]));
    }

    ZN_TRY_GOTO(zn_tr_initialise(tr));
    /* the links' counters are the steps' traffic: the setup's is kept apart */
    tr->stats.setup_nvme_write = atomic_exchange(&tr->tm.nvme_write, 0);
    tr->stats.setup_h2d = atomic_exchange(&tr->tm.h2d, 0);
    ZN_TRY_GOTO(zn_optsched_init(tr));
    /* ZeRO stages 1/2 on several ranks all-gather the updated shards after
     * the optimizer (gather_replicated); everything else lets the step
     * return while its optimizer job still runs. */
    tr->opt.pipeline = tr->world == 1 || sp->zero_stage >= 3;
    zn_loss_scaler_init(&tr->scaler, &sp->loss_scale);
    *out = tr;
    return 0;
fail:
    {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zn_last_error());
        zn_train_destroy(tr);
        return zn_set_error(rc, "%s", msg);
    }
}

void zn_train_destroy(zn_trainer *tr)
{
    if (!tr)
        return;
    if (tr->opt.started)
        zn_optsched_wait(tr);  /* a pipelined job ends before anything is freed */
    zn_optsched_fini(tr);
    for (int i = 0; tr->dev && i < tr->n_stop_ev; i++)
        zn_dev_event_destroy(tr->dev, tr->stop_ev[i]);
    if (tr->dev)
        zn_dev_sync(tr->dev);
    zn_accum_stop(tr); /* its jobs use the NVMe queues */
    zn_ioq_stop(&tr->rq);
    zn_ioq_stop(&tr->wq);
    if (tr->dev) {
        for (int s = 0; s < tr->fetch.n_slots; s++) {
            if (tr->fetch.ev_ready)
                zn_dev_event_destroy(tr->dev, tr->fetch.ev_ready[s]);
            if (tr->fetch.ev_consumed)
                zn_dev_event_destroy(tr->dev, tr->fetch.ev_consumed[s]);
            if (tr->fetch.ev_shard)
                zn_dev_event_destroy(tr->dev, tr->fetch.ev_shard[s]);
        }
        for (int i = 0; i < 2; i++) {
            zn_dev_event_destroy(tr->dev, tr->ev_gready[i]);
            zn_dev_event_destroy(tr->dev, tr->ev_gfree[i]);
            zn_dev_event_destroy(tr->dev, tr->ev_rs[i]);
        }
        for (int i = 0; i < tr->fetch.n_stage; i++)
            zn_dev_event_destroy(tr->dev, tr->fetch.ev_stage_free[i]);
        for (int s = 0; s < 16; s++)
            zn_dev_event_destroy(tr->dev, tr->opt.slot[s].h2d_done);
        if (tr->model && tr->model->release)
            tr->model->release(tr->model->ctx, tr->dev);
        zn_dev_stream_destroy(tr->dev, tr->s_comp);
        zn_dev_stream_destroy(tr->dev, tr->s_h2d);
        zn_dev_stream_destroy(tr->dev, tr->s_d2h);
        zn_dev_stream_destroy(tr->dev, tr->opt.s_h2d);
        for (int i = 0; i < ZN_CK_RING; i++) {
            zn_dev_event_destroy(tr->dev, tr->act.ev_written[i]);
            zn_dev_event_destroy(tr->dev, tr->act.ev_saved[i]);
            zn_dev_event_destroy(tr->dev, tr->act.ev_loaded[i]);
        }
        zn_dev_event_destroy(tr->dev, tr->act.ev_compute);
        zn_tr_marks_free(tr);
        if (tr->act.stream)
            zn_dev_stream_destroy(tr->dev, tr->act.stream);
        if (tr->comm_attached)
            zn_comm_detach_device(tr->comm);
        zn_tier_fini(&tr->tm);
        zn_dev_destroy(tr->dev);
    }
    for (int s = 0; s < 16; s++) {
        free(tr->opt.slot[s].grd);
        free(tr->opt.slot[s].pwr);
    }
    free(tr->fetch.ev_ready);
    free(tr->fetch.ev_consumed);
    free(tr->fetch.ev_shard);
    free(tr->fetch.stage_req);
    free(tr->opt.pcache);
    free(tr->fetch.slot);
    free(tr->fetch.slot_block);
    free(tr->ckpt);
    free(tr->act.host);
    free(tr->act.ordinal);
    free(tr->blocks);
    free(tr->units);
    free(tr->pieces);
    free(tr->sr_spans);
    free(tr->f32_runs);
    free(tr->fetch.accum_args);
    free(tr->fetch.n_rows);
    free(tr->fetch.marks);  /* no device: no events in it */
    zn_trace_destroy(tr->trace);
    pthread_mutex_destroy(&tr->elock);
    free(tr);
}
