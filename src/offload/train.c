/* The training step: the forward/backward schedule over the model's blocks
 * with parameters fetched ahead of use into a ring of device slots (NVMe ->
 * pinned staging -> H2D, or pinned -> H2D), gradients D2H into pinned
 * staging and accumulated into fp32 accumulators by a worker thread
 * (accum.c) that a host function on the D2H stream hands each block to,
 * and the optimizer pipeline (sched_optim.c) started as soon as
 * it may. Also creation (plan, allocate every tier once, initialise), the
 * report and the trace. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "offload/train-impl.h"
#include "util/try-impl.h"
#include "zn_build_config.h"

static const char *res_names[ZN_RES_COUNT] = {
    "gpu compute", "h2d", "d2h + grad accum", "nvme read", "nvme write", "adam",
    "comm", "nvme read+write",
};

/* The resources a step's time is compared with: NVMe reads and writes
 * share one disk, so their union stands for both. */
static bool res_counts_for_busiest(int r)
{
    return r != ZN_RES_NVME_READ && r != ZN_RES_NVME_WRITE;
}

const char *zn_train_resource_name(zn_train_resource r)
{
    return (unsigned)r < ZN_RES_COUNT ? res_names[r] : "?";
}

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

/* ---- marks: stream-side timestamps for the trace -----------------------------*/
static void mark_begin_fn(void *arg)
{
    zn_mark *mk = arg;
    mk->t0 = zn_now_ns();
}

static void mark_end_fn(void *arg)
{
    zn_mark *mk = arg;
    zn_trace_span(mk->tr->trace, mk->track, mk->name, mk->t0, zn_now_ns());
}

zn_mark *zn_train_mark_begin(zn_trainer *tr, zn_stream *s, int res, const char *name)
{
    if (tr->next_mark >= tr->n_marks)
        return NULL;
    zn_mark *mk = &tr->marks[tr->next_mark++];
    mk->tr = tr;
    mk->track = tr->track[res];
    snprintf(mk->name, sizeof mk->name, "%s", name);
    if (zn_dev_launch_host_fn(tr->dev, s, mark_begin_fn, mk))
        return NULL;
    return mk;
}

void zn_train_mark_end(zn_trainer *tr, zn_stream *s, zn_mark *mk)
{
    if (mk)
        zn_dev_launch_host_fn(tr->dev, s, mark_end_fn, mk);
}

/* ---- layout --------------------------------------------------------------------*/
static uint64_t round_up(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b * b;
}

/* Elements of a block's frozen part at its home (and in its NVMe extent):
 * all of it, or this rank's shard of it (fshard). */
static uint64_t frozen_home(const zn_block *bl)
{
    return bl->fshard ? bl->fshard : bl->frozen;
}

static int build_layout(zn_trainer *tr)
{
    const zn_config *cfg = &tr->cfg;
    const zn_train_model *md = tr->model;
    tr->L = md->n_blocks;
    tr->blocks = calloc((size_t)tr->L, sizeof *tr->blocks);
    if (!tr->blocks)
        return zn_set_error(-ENOMEM, "train: out of memory");
    uint64_t off = 0, in_cpu = 0, full = 0;
    uint64_t thresh = (uint64_t)cfg->zero.stage3_param_persistence_threshold;
    /* the layers: runs of blocks joined to the one before */
    for (int b = 0, g = -1; b < tr->L; b++) {
        bool joins = b > 0 && md->block_joins && md->block_joins[b];
        zn_block *bl = &tr->blocks[b];
        if (!joins)
            g++;
        bl->group = g;
        bl->gfirst = joins ? tr->blocks[b - 1].gfirst : b;
    }
    for (int b = tr->L - 1; b >= 0; b--)
        tr->blocks[b].glast = b + 1 < tr->L && tr->blocks[b + 1].group == tr->blocks[b].group
                                  ? tr->blocks[b + 1].glast : b;
    for (int b = 0; b < tr->L; b++) {
        zn_block *bl = &tr->blocks[b];
        bl->n = md->block_params[b];
        if (!bl->n)
            return zn_set_error(ZN_ECONFIG, "train: block %d has no parameters", b);
        bl->frozen = md->block_frozen ? md->block_frozen[b] : 0;
        bl->frozen_id = -1;
        if (bl->frozen > bl->n)
            return zn_set_error(ZN_EINTERNAL, "train: block %d: %llu frozen of %llu", b,
                                (unsigned long long)bl->frozen, (unsigned long long)bl->n);
        uint64_t tn = bl->n - bl->frozen;  /* the elements that train */
        bool repl = tr->world == 1 || cfg->zero.stage < 3;
        zn_shard sh;
        int rc = zn_comm_shard(bl->n, tr->world, tr->rank, tr->world > 1 ? 128 : 1, &sh);
        if (rc)
            return rc;
        bl->npad = sh.padded;
        bl->shard = sh.shard;
        bl->soff = sh.offset;
        bl->len = sh.len;
        bl->gpad = sh.padded;
        if (bl->frozen) {
            /* the optimizer's share is of the trainable tail only */
            memset(&sh, 0, sizeof sh);
            if (tn && (rc = zn_comm_shard(tn, tr->world, tr->rank, tr->world > 1 ? 128 : 1,
                                          &sh)))
                return rc;
            bl->shard = sh.shard;
            bl->soff = bl->frozen + sh.offset;
            bl->len = sh.len;
            bl->gpad = sh.padded;
            if (bl->frozen + bl->gpad > bl->npad)
                bl->npad = bl->frozen + bl->gpad;  /* room for the in-place gather */
            if (!repl) {
                /* the frozen part sharded on its own (train-impl.h) */
                zn_shard fs;
                if ((rc = zn_comm_shard(bl->frozen, tr->world, tr->rank, 128, &fs)))
                    return rc;
                bl->fshard = fs.shard;
                bl->foff = fs.offset;
                /* the slot: both gathers, then room for this rank's
                 * trainable shard, the source of the second gather */
                bl->npad = (fs.padded > bl->frozen + bl->gpad ? fs.padded
                                                               : bl->frozen + bl->gpad) +
                           bl->shard;
            }
        }
        if (bl->gpad > tr->largest_grad)
            tr->largest_grad = bl->gpad;
        bl->off = off;
        off += bl->len;
        full += tn;
        /* stages 1/2 keep whole parameters on every rank (they are never
         * offloaded: offload_param needs stage 3) */
        bl->replicated = repl;
        if (bl->npad > tr->largest_block)
            tr->largest_block = bl->npad;
        if (bl->len > tr->largest_local)
            tr->largest_local = bl->len;
        /* a block other blocks read (a tied embedding) stays on the device */
        bool small = tr->popt == ZN_OFFLOAD_NONE || bl->n < thresh ||
                     (bl->group == 0 && md->keep_block0);
        if (bl->group == 0 && md->keep_block0 && !bl->replicated)
            return zn_set_error(ZN_EUNSUPPORTED, "%s: tied embeddings (tie_word_embeddings) with "
                                "ZeRO stage 3 across %d ranks are not supported yet: the "
                                "embedding must stay whole on every device; use "
                                "zero_optimization.stage 2 (or one rank)",
                                cfg->source, tr->world);
        if (small) {
            bl->home = ZN_PHOME_DEVICE;
        } else if (tr->popt == ZN_OFFLOAD_CPU) {
            bl->home = ZN_PHOME_CPU;
        } else if (in_cpu + (bl->replicated ? bl->n : bl->len) <=
                   (uint64_t)cfg->zero.offload_param.max_in_cpu) {
            bl->home = ZN_PHOME_CPU;
            in_cpu += bl->replicated ? bl->n : bl->len;
        } else {
            bl->home = ZN_PHOME_NVME;
        }
        /* a sharded block is all-gathered into a slot at every use */
        bl->persistent = bl->home == ZN_PHOME_DEVICE && bl->replicated;
        if (!bl->persistent && bl->npad > tr->largest_ring_block)
            tr->largest_ring_block = bl->npad;
    }
    tr->P = off;
    tr->P_full = full;
    if (!tr->P)
        return zn_set_error(ZN_ECONFIG, "train: with %d ranks, rank %d owns no parameters: "
                            "the model is too small for this world size", tr->world, tr->rank);

    /* Optimizer units. With states on NVMe, the staging pool is the plan's
     * buffer_count x sub_group fp32 buffers; a unit in flight needs four
     * (master, m, v, grads), and at least two units must be in flight for
     * reads, Adam and writes to overlap, so the unit may be smaller than the
     * sub-group. Adam is element-wise: the unit size never changes results. */
    uint64_t sg = tr->plan.sub_group ? tr->plan.sub_group : tr->P;
    if (sg > tr->P)
        sg = tr->P;
    tr->U = sg;
    tr->n_oslots = 1;
    if (tr->oopt == ZN_OFFLOAD_NVME) {
        int64_t bc = cfg->zero.offload_optimizer.buffer_count;
        int S = (int)(bc / 4);
        if (S < 2)
            S = 2;
        if (S > 16)
            S = 16;
        uint64_t pool = (uint64_t)bc * sg;
        uint64_t U = pool / (4 * (uint64_t)S);
        U = U / 1024 * 1024;
        if (U < 1024)
            U = 1024;
        if (U > sg)
            U = sg;
        tr->U = U;
        tr->n_oslots = S;
    }
    tr->n_units = (int)((tr->P + tr->U - 1) / tr->U);
    tr->units = calloc((size_t)tr->n_units, sizeof *tr->units);
    if (!tr->units)
        return zn_set_error(-ENOMEM, "train: out of memory");
    for (int u = 0; u < tr->n_units; u++) {
        tr->units[u].off = (uint64_t)u * tr->U;
        tr->units[u].n = tr->U;
        if (tr->units[u].off + tr->U > tr->P)
            tr->units[u].n = tr->P - tr->units[u].off;
        tr->units[u].master_id = tr->units[u].m_id = tr->units[u].v_id = -1;
        tr->units[u].tr = tr;
    }
    /* Pieces: blocks x units, in flat order. */
    int cap = tr->L + tr->n_units;
    tr->pieces = calloc((size_t)cap, sizeof *tr->pieces);
    if (!tr->pieces)
        return zn_set_error(-ENOMEM, "train: out of memory");
    int b = 0, u = 0, n = 0;
    uint64_t pos = 0;
    while (pos < tr->P) {
        while (!tr->blocks[b].len)
            b++;
        zn_block *bl = &tr->blocks[b];
        zn_unit *un = &tr->units[u];
        uint64_t bend = bl->off + bl->len;
        uint64_t end = bend < un->off + un->n ? bend : un->off + un->n;
        zn_piece *p = &tr->pieces[n];
        p->block = b;
        p->unit = u;
        p->start = pos;
        p->n = end - pos;
        p->grad_id = p->param_id = -1;
        if (!bl->np)
            bl->p0 = n;
        bl->np++;
        if (!un->np)
            un->p0 = n;
        un->np++;
        n++;
        pos = end;
        if (pos == bend)
            b++;
        if (pos == un->off + un->n)
            u++;
    }
    tr->n_pieces = n;
    for (int i = 0; i < tr->L; i++) {
        /* an NVMe home's frozen part (or shard of it) is one more request */
        int nr = tr->blocks[i].np + (tr->blocks[i].frozen ? 1 : 0);
        if (nr > tr->max_block_pieces)
            tr->max_block_pieces = nr;
    }
    for (int i = 0; i < tr->n_units; i++)
        if (tr->units[i].np > tr->max_unit_pieces)
            tr->max_unit_pieces = tr->units[i].np;
    return 0;
}

/* Bytes of swap space the NVMe-resident state needs, with each extent
 * rounded to the engine's block (extents of a block or more are striped). */
static uint64_t nvme_bytes_needed(zn_trainer *tr)
{
    uint64_t bs = (uint64_t)tr->cfg.aio.block_size, need = 0;
    if (tr->oopt == ZN_OFFLOAD_NVME)
        for (int u = 0; u < tr->n_units; u++)
            need += 3 * round_up(tr->units[u].n * 4, bs);
    if (tr->gnvme)
        for (int k = 0; k < tr->n_pieces; k++)
            if (tr->pieces[k].gram_off < 0)
                need += round_up(tr->pieces[k].n * 4, bs);
    for (int k = 0; k < tr->n_pieces; k++)
        if (tr->blocks[tr->pieces[k].block].home == ZN_PHOME_NVME)
            need += round_up(tr->pieces[k].n * tr->pbytes, bs);
    for (int b = 0; b < tr->L; b++)
        if (tr->blocks[b].home == ZN_PHOME_NVME && tr->blocks[b].frozen)
            need += round_up(frozen_home(&tr->blocks[b]) * tr->pbytes, bs);
    if (need)
        need += 2 * bs * (uint64_t)(tr->cfg.tiers.n_nvme > 0 ? tr->cfg.tiers.n_nvme : 1);
    return need;
}


/* The kind of an allocation, for the plan's rows: its name less the block,
 * unit or slot number ("params b3 u1" -> "params", "param slot 2" -> "param
 * slot"). */
static void item_kind(const char *name, char *out, size_t n)
{
    snprintf(out, n, "%s", name);
    for (char *c = out; *c; c++)
        if (c[0] == ' ' && ((c[1] >= '0' && c[1] <= '9') ||
                            ((c[1] == 'b' || c[1] == 'u') && c[2] >= '0' && c[2] <= '9'))) {
            *c = '\0';
            break;
        }
}

/* Records an allocation in the plan's items (dry run). */
static void plan_item(zn_trainer *tr, zn_tier tier, zn_state_class cls, uint64_t bytes,
                      const char *name)
{
    zn_plan *p = &tr->plan;
    char what[sizeof p->items[0].what];
    item_kind(name, what, sizeof what);
    int i = 0;
    while (i < p->n_items && (p->items[i].tier != tier || p->items[i].cls != cls ||
                              strcmp(p->items[i].what, what)))
        i++;
    if (i == p->n_items) {
        int cap = (int)(sizeof p->items / sizeof p->items[0]);
        if (i == cap) {
            i = cap - 1;  /* folded into the last row, still counted */
            snprintf(p->items[i].what, sizeof p->items[i].what, "other");
        } else {
            p->n_items++;
            snprintf(p->items[i].what, sizeof p->items[i].what, "%s", what);
            p->items[i].tier = tier;
            p->items[i].cls = cls;
            p->items[i].bytes = 0;
            p->items[i].count = 0;
        }
    }
    p->items[i].bytes += bytes;
    p->items[i].count++;
}

static int alloc_ptr(zn_trainer *tr, zn_tier tier, zn_state_class cls, uint64_t bytes,
                     const char *name, void **out)
{
    if (tr->dry) {
        /* the device arena rounds each block to ZN_DEV_ALIGN */
        if (tier == ZN_TIER_GPU) {
            bytes = round_up(bytes, ZN_DEV_ALIGN);
            tr->dry_gpu += bytes;
        } else if (tier == ZN_TIER_CPU) {
            tr->dry_cpu += bytes;
        }
        plan_item(tr, tier, cls, bytes, name);
        *out = NULL;
        return 0;
    }
    int id, rc = zn_tier_alloc(&tr->tm, tier, cls, bytes, name, &id);
    if (rc)
        return rc;
    *out = zn_tier_get(&tr->tm, id)->ptr;
    zn_tier_set_valid(&tr->tm, id, tier, true);
    return 0;
}

static int alloc_ext(zn_trainer *tr, zn_state_class cls, uint64_t bytes, const char *name,
                     int *id)
{
    if (tr->dry) {
        /* the swap space's allocation unit: the direct-I/O alignment, at
         * least a page (src/nvme/swap.c; 4 KiB on the devices seen) */
        plan_item(tr, ZN_TIER_NVME, cls, round_up(bytes, 4096), name);
        *id = -1;
        return 0;
    }
    return zn_tier_alloc(&tr->tm, ZN_TIER_NVME, cls, bytes, name, id);
}

/* Elements of a block's working params at its home: the whole block
 * (replicated), the rank's shard, or its frozen shard and trainable shard. */
static uint64_t home_elems(const zn_block *bl)
{
    return bl->replicated ? bl->npad : bl->fshard + bl->shard;
}

/* Offset (elements) of piece p (of the trainable tail) in its block's home
 * and in an NVMe home's staging buffer, which is laid out like the home. */
static uint64_t piece_stage_off(const zn_block *bl, const zn_piece *p)
{
    return (bl->replicated ? bl->soff : bl->fshard) + (p->start - bl->off);
}

static int allocate(zn_trainer *tr)
{
    int rc = 0;
    char name[64];
    const zn_config *cfg = &tr->cfg;
    zn_tier gpu = ZN_TIER_GPU, cpu = ZN_TIER_CPU;
    size_t act;

    /* model scratch first: the activation size may depend on the dtype */
    act = tr->model->act_bytes;
    if (tr->dry) {
        uint64_t ws = 0;
        if (tr->model->plan_prepare) {
            ZN_TRY_GOTO(tr->model->plan_prepare(tr->model->ctx, tr->pdt, &ws, &act));
            if (ws) {
                tr->dry_gpu += ws;
                plan_item(tr, gpu, ZN_STATE_WORK, ws, "model workspace");
            }
        }
    } else if (tr->model->prepare) {
        ZN_TRY_GOTO(tr->model->prepare(tr->model->ctx, tr->dev, tr->s_comp, tr->pdt));
        act = tr->model->act_bytes;
    }

    /* device: resident params, activations, grads, batch */
    for (int b = 0; b < tr->L; b++) {
        zn_block *bl = &tr->blocks[b];
        snprintf(name, sizeof name, "params b%d", b);
        if (bl->home == ZN_PHOME_DEVICE)
            ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_PARAMS, home_elems(bl) * tr->pbytes, name,
                          &bl->dev_params));
    }
    tr->ckpt = calloc((size_t)tr->L, sizeof *tr->ckpt);
    tr->ckhost = calloc((size_t)tr->L, sizeof *tr->ckhost);
    tr->ckord = calloc((size_t)tr->L, sizeof *tr->ckord);
    if (!tr->ckpt || !tr->ckhost || !tr->ckord)
        return zn_set_error(-ENOMEM, "train: out of memory");
    tr->ck_bytes = act;
    if (tr->ckcpu)
        for (int i = 0; i < ZN_CK_RING; i++) {
            snprintf(name, sizeof name, "activation ckpt ring %d", i);
            ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, act, name, &tr->ckring[i]));
            tr->ckres[i] = -1;
        }
    for (int b = 1, k = 0; b < tr->L; b++) {
        if (tr->blocks[b].gfirst != b)
            continue; /* a further part of a layer reads its first part's input */
        snprintf(name, sizeof name, "activation ckpt b%d", b);
        tr->ckord[b] = k;
        if (tr->ckcpu) {
            ZN_TRY_GOTO(alloc_ptr(tr, ZN_TIER_CPU, ZN_STATE_ACT_CKPT, act, name, &tr->ckhost[b]));
            tr->ckpt[b] = tr->ckring[k % ZN_CK_RING];
        } else {
            ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_ACT_CKPT, act, name, &tr->ckpt[b]));
        }
        k++;
    }
    for (int i = 0; i < 2; i++) {
        ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, act, "activation grad", &tr->dact[i]));
        if (tr->largest_grad)
            ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, tr->largest_grad * 4, "block grads",
                          &tr->gdev[i]));
    }
    /* Row-sparse gradients (an untied embedding's parts): with one rank and
     * the accumulators in RAM, only the rows of the micro-batch's tokens
     * leave the device and are added */
    const zn_train_model *md = tr->model;
    int64_t A = cfg->gradient_accumulation_steps > 0 ? cfg->gradient_accumulation_steps : 1;
    int64_t ntok = cfg->train_micro_batch_size_per_gpu * cfg->data.seq_len;
    uint64_t cast_elems = tr->gdt != ZN_DTYPE_F32 ? tr->largest_local : 0;
    tr->any_sparse = false;
    for (int b = 0; b < tr->L; b++) {
        zn_block *bl = &tr->blocks[b];
        bl->srow0 = -1;
        if (md->block_sparse_row0 && md->block_sparse_row0[b] >= 0 && md->row_width > 0 &&
            tr->world == 1 && !tr->gnvme && !tr->dopt && !bl->frozen && bl->len == bl->n &&
            bl->n % (uint64_t)md->row_width == 0 && ntok > 0) {
            bl->srow0 = md->block_sparse_row0[b];
            tr->any_sparse = true;
            uint64_t most = (uint64_t)ntok * (uint64_t)md->row_width;
            uint64_t e = bl->len < most ? bl->len : most;
            cast_elems = e > cast_elems ? e : cast_elems;
        }
    }
    /* one device buffer a block's shard (or its touched rows) is cast or
     * gathered into; that and its D2H are both on the D2H stream, so one
     * block's at a time */
    if (cast_elems)
        ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, cast_elems * zn_dtype_size(tr->gdt),
                      "block grads (transfer)", &tr->gcast));
    if (tr->any_sparse) {
        tr->urows_cap = A * ntok;
        ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, (uint64_t)tr->urows_cap * 4, "token rows",
                      (void **)&tr->urows_dev));
        /* pinned: an upload from pageable memory would wait for the D2H
         * stream's earlier work (CUDA stages it synchronously) */
        ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, (uint64_t)tr->urows_cap * 4, "token rows (host)",
                      (void **)&tr->urows));
        if (!tr->dry && !(tr->nurows = calloc((size_t)A, sizeof *tr->nurows)))
            return zn_set_error(-ENOMEM, "train: out of memory");
    }

    /* optimizer states in memory */
    if (tr->oopt != ZN_OFFLOAD_NVME) {
        zn_tier t = tr->oopt == ZN_OFFLOAD_NONE ? gpu : cpu;
        ZN_TRY_GOTO(alloc_ptr(tr, t, ZN_STATE_MASTER, tr->P * 4, "master (fp32)", (void **)&tr->master));
        ZN_TRY_GOTO(alloc_ptr(tr, t, ZN_STATE_ADAM_M, tr->P * 4, "adam m", (void **)&tr->mom));
        ZN_TRY_GOTO(alloc_ptr(tr, t, ZN_STATE_ADAM_V, tr->P * 4, "adam v", (void **)&tr->var));
        ZN_TRY_GOTO(alloc_ptr(tr, t, ZN_STATE_GRADS, tr->P * 4, "grads (fp32)", (void **)&tr->gacc));
        bool off_dev = false;  /* a trainable block homed off the device */
        for (int b = 0; b < tr->L; b++)
            off_dev |= tr->blocks[b].len > 0 && tr->blocks[b].home != ZN_PHOME_DEVICE;
        if (!tr->dopt && tr->pdt != ZN_DTYPE_F32)
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->U * tr->pbytes, "param update staging",
                          &tr->pout_flat));
        if (tr->dopt && off_dev) {
            if (tr->pdt != ZN_DTYPE_F32)
                ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, tr->U * tr->pbytes,
                              "param update staging (device)", &tr->pdev));
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->U * tr->pbytes, "param update staging",
                          &tr->pout_flat));
        }
        if (tr->dopt) {
            /* each block's chunk sums of squares, on the device and pinned */
            uint64_t nc = 0;
            for (int b = 0; b < tr->L; b++) {
                tr->blocks[b].nc_off = (int64_t)nc;
                nc += (tr->blocks[b].len + ZN_GRAD_NORM_CHUNK - 1) / ZN_GRAD_NORM_CHUNK;
            }
            ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, nc * 8 + 8, "grad norm chunks",
                          (void **)&tr->normc_dev));
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, nc * 8 + 8, "grad norm chunks (host)",
                          (void **)&tr->normc));
            /* states in and out of the device (initial master, checkpoints,
             * read-back): up to 16 MiB at a time */
            uint64_t sb = tr->P * 4 < (16u << 20) ? tr->P * 4 : (16u << 20);
            tr->ostage_bytes = (sb + 4095) / 4096 * 4096;
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->ostage_bytes, "optimizer state staging",
                          &tr->ostage));
        }
    } else if (!tr->gnvme) {
        /* states on NVMe, gradients in pinned RAM (tiers.grads) */
        ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_GRADS, tr->P * 4, "grads (fp32)", (void **)&tr->gacc));
    }

    /* pinned: params homed on the CPU, staging */
    for (int b = 0; b < tr->L; b++) {
        zn_block *bl = &tr->blocks[b];
        snprintf(name, sizeof name, "params b%d", b);
        if (bl->home == ZN_PHOME_CPU)
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_PARAMS, home_elems(bl) * tr->pbytes, name,
                          &bl->cpu_params));
    }
    for (int i = 0; i < 2; i++)
        ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->largest_local * 4, "grad staging",
                      (void **)&tr->gstage[i]));
    uint64_t largest_nvme = 0;
    for (int b = 0; b < tr->L; b++) {
        /* staging holds what the home holds: the whole block (one rank, a
         * frozen base), the rank's shard, or its frozen and trainable shards */
        const zn_block *bl = &tr->blocks[b];
        uint64_t h = bl->fshard ? bl->fshard + bl->shard : bl->frozen ? bl->n : bl->len;
        if (bl->home == ZN_PHOME_NVME && h > largest_nvme)
            largest_nvme = h;
    }
    if (largest_nvme) {
        int64_t bc = cfg->zero.offload_param.buffer_count;
        tr->n_pstage = (int)(bc < 2 ? 2 : bc > 64 ? 64 : bc);
        for (int i = 0; i < tr->n_pstage; i++)
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, largest_nvme * tr->pbytes, "param staging",
                          &tr->pstage[i]));
    }
    /* the param cache: only where the step is pipelined (a replicated block
     * on several ranks gets the other ranks' parts later, by all-gather) */
    uint64_t largest_pc = 0;
    bool pipelined = tr->world == 1 || cfg->zero.stage >= 3;
    for (int b = 0; b < tr->L; b++) {
        zn_block *bl = &tr->blocks[b];
        /* (a frozen base is never updated: nothing of it to cache) */
        bl->pc_ok = pipelined && bl->home == ZN_PHOME_NVME && !bl->frozen &&
                    (tr->world == 1 || !bl->replicated);
        uint64_t fetched = bl->replicated ? bl->n : bl->len;
        if (bl->pc_ok && fetched > largest_pc)
            largest_pc = fetched;
    }
    if (largest_pc && cfg->tiers.param_cache > 0 && tr->dry) {
        for (int e = 0; e < cfg->tiers.param_cache; e++)
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, largest_pc * tr->pbytes, "param cache",
                          (void **)&(void *){ NULL }));
    } else if (largest_pc && cfg->tiers.param_cache > 0) {
        tr->pc = calloc((size_t)cfg->tiers.param_cache, sizeof *tr->pc);
        if (!tr->pc)
            return zn_set_error(-ENOMEM, "train: out of memory");
        tr->n_pc = cfg->tiers.param_cache;
        for (int e = 0; e < tr->n_pc; e++) {
            tr->pc[e].tr = tr;
            tr->pc[e].block = -1;
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, largest_pc * tr->pbytes, "param cache",
                          &tr->pc[e].buf));
        }
    } else {
        for (int b = 0; b < tr->L; b++)
            tr->blocks[b].pc_ok = false;
    }
    if (tr->oopt == ZN_OFFLOAD_NVME) {
        for (int s = 0; s < tr->n_oslots; s++) {
            zn_opt_slot *sl = &tr->oslot[s];
            void *buf;
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->U * 16, "optimizer staging", &buf));
            if (!tr->dry) {
                sl->master = buf;
                sl->m = sl->master + tr->U;
                sl->v = sl->m + tr->U;
                sl->grad = sl->v + tr->U;
            }
            if (tr->pdt != ZN_DTYPE_F32)
                ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->U * tr->pbytes,
                              "param update staging", &sl->pout));
        }
        if (tr->gnvme && (cfg->gradient_accumulation_steps > 1 || tr->gdt != ZN_DTYPE_F32))
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->largest_local * 4, "grad readback",
                          (void **)&tr->gtmp));
    }

    /* Gradient accumulators on NVMe with tiers.grads auto: the pinned room
     * left after everything above (all but 5% of it) keeps as many pieces
     * as fit in RAM, which saves their write and read-back every
     * micro-batch. Computed from the allocations themselves, so the dry
     * run and the run choose the same pieces. */
    for (int k = 0; k < tr->n_pieces; k++)
        tr->pieces[k].gram_off = -1;
    tr->gram_elems = 0;
    if (tr->gnvme && cfg->tiers.grads == ZN_GRADS_AUTO) {
        uint64_t used = tr->dry_cpu;
        if (!tr->dry) {
            uint64_t u[ZN_TIER_COUNT], pk[ZN_TIER_COUNT];
            zn_tier_usage(&tr->tm, u, pk);
            used = u[ZN_TIER_CPU];
        }
        uint64_t budget = tr->tm.budget[ZN_TIER_CPU];
        uint64_t room = budget > used ? (budget - used) / 20 * 19 : 0, elems = 0;
        for (int k = 0; k < tr->n_pieces; k++)
            if ((elems + tr->pieces[k].n) * 4 <= room) {
                tr->pieces[k].gram_off = (int64_t)elems;
                elems += tr->pieces[k].n;
            }
        if (elems) {
            tr->gram_elems = elems;
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_GRADS, elems * 4, "grads (fp32)",
                          (void **)&tr->gram));
            if (tr->dry) {
                /* what a step writes: only the pieces left on NVMe */
                zn_plan *pl = &tr->plan;
                pl->nvme_write_step -= pl->nvme_write_part[2];
                pl->nvme_write_part[2] = (tr->P - elems) * 4 * (uint64_t)A;
                pl->nvme_write_step += pl->nvme_write_part[2];
            }
        }
    }

    /* NVMe extents */
    uint64_t need = nvme_bytes_needed(tr);
    if (need) {
        uint64_t bytes = need < tr->tm.budget[ZN_TIER_NVME] ? need : tr->tm.budget[ZN_TIER_NVME];
        if (!tr->dry)
            ZN_TRY_GOTO(zn_tier_open_nvme(&tr->tm, cfg, bytes, tr->fault_hook, tr->fault_user));
        if (tr->oopt == ZN_OFFLOAD_NVME) {
            for (int u = 0; u < tr->n_units; u++) {
                zn_unit *un = &tr->units[u];
                snprintf(name, sizeof name, "master u%d", u);
                ZN_TRY_GOTO(alloc_ext(tr, ZN_STATE_MASTER, un->n * 4, name, &un->master_id));
                snprintf(name, sizeof name, "adam m u%d", u);
                ZN_TRY_GOTO(alloc_ext(tr, ZN_STATE_ADAM_M, un->n * 4, name, &un->m_id));
                snprintf(name, sizeof name, "adam v u%d", u);
                ZN_TRY_GOTO(alloc_ext(tr, ZN_STATE_ADAM_V, un->n * 4, name, &un->v_id));
            }
            for (int k = 0; k < tr->n_pieces && tr->gnvme; k++) {
                zn_piece *p = &tr->pieces[k];
                if (p->gram_off >= 0)
                    continue; /* in pinned RAM */
                snprintf(name, sizeof name, "grads b%d u%d", p->block, p->unit);
                ZN_TRY_GOTO(alloc_ext(tr, ZN_STATE_GRADS, p->n * 4, name, &p->grad_id));
            }
        }
        for (int k = 0; k < tr->n_pieces; k++) {
            zn_piece *p = &tr->pieces[k];
            if (tr->blocks[p->block].home != ZN_PHOME_NVME)
                continue;
            snprintf(name, sizeof name, "params b%d u%d", p->block, p->unit);
            ZN_TRY_GOTO(alloc_ext(tr, ZN_STATE_PARAMS, p->n * tr->pbytes, name, &p->param_id));
        }
        for (int b = 0; b < tr->L; b++) {
            zn_block *bl = &tr->blocks[b];
            if (bl->home != ZN_PHOME_NVME || !bl->frozen)
                continue;
            snprintf(name, sizeof name, "frozen params b%d", b);
            ZN_TRY_GOTO(alloc_ext(tr, ZN_STATE_PARAMS, frozen_home(bl) * tr->pbytes, name,
                          &bl->frozen_id));
        }
    }

    /* the ring of device parameter slots, last: it takes what is left */
    if (tr->largest_ring_block) {
        uint64_t slot_bytes = round_up(tr->largest_ring_block * tr->pbytes, ZN_DEV_ALIGN);
        uint64_t want = tr->plan.live_window / tr->largest_ring_block;
        if (want < 2)
            want = 2;
        zn_dev_mem dm;
        if (tr->dry) {
            /* what is left of the budget: allocations so far, rounded */
            uint64_t b = tr->tm.budget[ZN_TIER_GPU];
            dm.largest_free = b > tr->dry_gpu ? b - tr->dry_gpu : 0;
        } else {
            zn_dev_mem_stats(tr->dev, &dm);
        }
        uint64_t fit = dm.largest_free / slot_bytes;
        int ring_blocks = 0;
        for (int b = 0; b < tr->L; b++)
            ring_blocks += !tr->blocks[b].persistent;
        if (want > (uint64_t)ring_blocks)
            want = ring_blocks < 2 ? 2 : (uint64_t)ring_blocks;
        if (want > fit)
            want = fit;
        if (want > 64)
            want = 64;
        if (want < 2) {
            char b1[32], b2[32];
            return zn_set_error(ZN_EBUDGET, "gpu tier: two parameter slots of %s do not fit "
                                "(largest free block %s after activations and buffers): raise "
                                "tiers.gpu%s or lower train_micro_batch_size_per_gpu",
                                zn_format_size(slot_bytes, b1, sizeof b1),
                                zn_format_size(dm.largest_free, b2, sizeof b2),
                                tr->ckcpu ? "" : ", set activation_checkpointing."
                                "cpu_checkpointing=true (the layers' checkpoints to pinned RAM)");
        }
        tr->nslots = (int)want;
        if (tr->dry) {
            for (int s = 0; s < tr->nslots; s++)
                ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, tr->largest_ring_block * tr->pbytes,
                              "param slot", (void **)&(void *){ NULL }));
            return 0;
        }
        tr->slot = calloc((size_t)tr->nslots, sizeof *tr->slot);
        tr->slot_block = calloc((size_t)tr->nslots, sizeof *tr->slot_block);
        if (!tr->slot || !tr->slot_block)
            return zn_set_error(-ENOMEM, "train: out of memory");
        for (int s = 0; s < tr->nslots; s++) {
            snprintf(name, sizeof name, "param slot %d", s);
            ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, tr->largest_ring_block * tr->pbytes, name,
                          &tr->slot[s]));
            tr->slot_block[s] = -1;
        }
    }
    return 0;
fail:
    return rc;
}

/* Elements of one pass of the initial values: the model fills at most this
 * many fp32 values at a time (from its seeded init or from a checkpoint),
 * into the two pinned gradient staging buffers (largest_local fp32 each,
 * idle until the first backward), so loading holds no host memory beyond
 * the tiers whatever the model's size: the cpu high-water of a run whose
 * state lives on NVMe is its plan's, during the load too. */
#define INIT_CHUNK ((uint64_t)8 << 20)

/* Streams the initial optimizer state of the rank's flat space, in order,
 * into NVMe units: master values fill the unit's staging slot; a full unit
 * goes out (master, m = 0, v = 0) while the next slot fills. */
typedef struct {
    zn_trainer *tr;
    int unit, slot;
    uint64_t filled;
} init_units;

static int init_unit_flush(init_units *iu)
{
    zn_trainer *tr = iu->tr;
    zn_unit *un = &tr->units[iu->unit];
    zn_opt_slot *s = &tr->oslot[iu->slot];
    /* the master goes home; m = v = 0 stay unwritten (mv_zero) */
    int rc = zn_ioq_submit(&tr->wq, &s->wr[0], 1, &zn_tier_get(&tr->tm, un->master_id)->ext,
                           s->master, un->n * 4, "initial optimizer state");
    atomic_store(&un->mv_zero, true);
    s->unit = iu->unit;
    iu->unit++;
    iu->slot = (iu->slot + 1) % tr->n_oslots;
    iu->filled = 0;
    return rc;
}

/* Waits for slot k's writes (if any) and marks what they saved valid. */
static int init_unit_wait(zn_trainer *tr, int k)
{
    zn_opt_slot *s = &tr->oslot[k];
    int rc = 0;
    for (int i = 0; i < 3; i++) {
        int r2 = zn_ioq_wait(&tr->wq, &s->wr[i]);
        if (!rc)
            rc = r2;
    }
    if (!rc && s->unit >= 0)
        zn_tier_set_valid(&tr->tm, tr->units[s->unit].master_id, ZN_TIER_NVME, true);
    s->unit = -1;
    return rc;
}

static int init_units_put(init_units *iu, const float *v, uint64_t n)
{
    zn_trainer *tr = iu->tr;
    int rc = 0;
    while (n && !rc) {
        if (iu->filled == 0 && (rc = init_unit_wait(tr, iu->slot)))
            return rc;
        zn_unit *un = &tr->units[iu->unit];
        uint64_t k = un->n - iu->filled < n ? un->n - iu->filled : n;
        memcpy(tr->oslot[iu->slot].master + iu->filled, v, k * 4);
        iu->filled += k;
        v += k;
        n -= k;
        if (iu->filled == un->n)
            rc = init_unit_flush(iu);
    }
    return rc;
}

/* Waits for block staging buffer t's NVMe writes (np pieces). */
static int init_pstage_wait(zn_trainer *tr, int t, int *np)
{
    int rc = 0;
    for (int k = 0; k < np[t]; k++) {
        int r2 = zn_ioq_wait(&tr->wq, &tr->pstage_req[t * tr->max_block_pieces + k]);
        if (!rc)
            rc = r2;
    }
    np[t] = 0;
    return rc;
}

/* Writes the initial parameters and optimizer states to their homes in one
 * pass over each block's home range, INIT_CHUNK elements at a time: the
 * model fills the fp32 values once (each rank asks only for the range its
 * home holds), and they go to the working copy (converted to the param
 * dtype: device, pinned RAM, or NVMe through a staging buffer written
 * behind) and, for the rank's own shard, to the fp32 master (in memory, or
 * streamed into NVMe units written behind). m = v = 0. */
static int initialise(zn_trainer *tr)
{
    int rc = 0;
    const zn_train_model *md = tr->model;
    float *vals = tr->gstage[0];
    void *conv = tr->gstage[1];  /* largest_local x 4 >= chunk x param bytes */
    const uint64_t chunk = tr->largest_local < INIT_CHUNK ? tr->largest_local : INIT_CHUNK;
    int np_pending[64] = { 0 };
    int nvme_blocks = 0;
    init_units iu = { tr, 0, 0, 0 };
    bool opt_nvme = tr->oopt == ZN_OFFLOAD_NVME;
    if (!vals || !conv || !chunk) {
        rc = zn_set_error(ZN_EINTERNAL, "train: no staging for the initial state");
        goto out;
    }
    for (int s = 0; s < 16; s++)
        tr->oslot[s].unit = -1;
    for (int b = 0; b < tr->L && !rc; b++) {
        zn_block *bl = &tr->blocks[b];
        /* the home's ranges of block elements: [x0, x0 + n) at home offset
         * `home`, real up to `end` (beyond: padding, zero); `train` marks
         * the range that holds this rank's trainable shard */
        struct {
            uint64_t x0, n, end, home;
            bool train;
        } rg[2];
        int nrg = 1;
        if (bl->replicated) {
            rg[0].x0 = 0, rg[0].n = bl->npad, rg[0].end = bl->n, rg[0].home = 0;
            rg[0].train = true;
        } else {
            rg[0].x0 = bl->foff, rg[0].n = bl->fshard, rg[0].end = bl->frozen, rg[0].home = 0;
            rg[0].train = false;
            rg[1].x0 = bl->soff, rg[1].n = bl->shard, rg[1].end = bl->n, rg[1].home = bl->fshard;
            rg[1].train = true;
            nrg = 2;
            if (!bl->fshard)
                rg[0] = rg[1], nrg = 1;
        }
        int t = -1;
        if (bl->home == ZN_PHOME_NVME) {
            t = nvme_blocks++ % tr->n_pstage;
            if ((rc = init_pstage_wait(tr, t, np_pending)))
                goto out;
        }
        for (int g = 0; g < nrg && !rc; g++) {
        for (uint64_t x = rg[g].x0; x < rg[g].x0 + rg[g].n && !rc; x += chunk) {
            uint64_t c = rg[g].x0 + rg[g].n - x < chunk ? rg[g].x0 + rg[g].n - x : chunk;
            uint64_t real = x < rg[g].end ? (rg[g].end - x < c ? rg[g].end - x : c) : 0;
            uint64_t ho = rg[g].home + (x - rg[g].x0); /* home offset of x */
            if (real && (rc = md->init_params(md->ctx, b, x, real, vals)))
                goto out;
            memset(vals + real, 0, (c - real) * 4);  /* padding of a sharded block */
            /* the working copy at its home */
            if (bl->home == ZN_PHOME_DEVICE) {
                if ((rc = zn_convert(conv, tr->pdt, vals, ZN_DTYPE_F32, c)) ||
                    (rc = zn_dev_copy_h2d(tr->dev, tr->s_h2d,
                                          (char *)bl->dev_params + ho * tr->pbytes, conv,
                                          c * tr->pbytes)) ||
                    (rc = zn_dev_stream_sync(tr->dev, tr->s_h2d)))
                    goto out;
            } else if (bl->home == ZN_PHOME_CPU) {
                if ((rc = zn_convert((char *)bl->cpu_params + ho * tr->pbytes, tr->pdt, vals,
                                     ZN_DTYPE_F32, c)))
                    goto out;
            }
            /* a frozen base homed on NVMe: staged (whole, or this rank's
             * shard of it) for its own extent */
            uint64_t fe = x; /* [x, fe): frozen elements to stage */
            if (!rg[g].train)
                fe = x + c;
            else if (x < bl->frozen)
                fe = x + c < bl->frozen ? x + c : bl->frozen;
            if (bl->home == ZN_PHOME_NVME && fe > x &&
                (rc = zn_convert((char *)tr->pstage[t] + ho * tr->pbytes, tr->pdt, vals,
                                 ZN_DTYPE_F32, fe - x)))
                goto out;
            if (!rg[g].train)
                continue;
            /* the rank's shard: NVMe-home params and the master */
            uint64_t a = x > bl->soff ? x : bl->soff;
            uint64_t e = x + c < bl->soff + bl->len ? x + c : bl->soff + bl->len;
            if (a >= e)
                continue;
            if (bl->home == ZN_PHOME_NVME &&
                (rc = zn_convert((char *)tr->pstage[t] + (ho + (a - x)) * tr->pbytes, tr->pdt,
                                 vals + (a - x), ZN_DTYPE_F32, e - a)))
                goto out;
            if (tr->dopt) {
                if ((rc = zn_dev_copy_h2d(tr->dev, tr->s_h2d,
                                          tr->master + bl->off + (a - bl->soff), vals + (a - x),
                                          (e - a) * 4)) ||
                    (rc = zn_dev_stream_sync(tr->dev, tr->s_h2d)))
                    goto out;
            } else if (!opt_nvme)
                memcpy(tr->master + bl->off + (a - bl->soff), vals + (a - x), (e - a) * 4);
            else if ((rc = init_units_put(&iu, vals + (a - x), e - a)))
                goto out;
        }
        }
        if (bl->home == ZN_PHOME_NVME) {
            for (int k = 0; k < bl->np && !rc; k++) {
                zn_piece *p = &tr->pieces[bl->p0 + k];
                rc = zn_ioq_submit(&tr->wq, &tr->pstage_req[t * tr->max_block_pieces + k], 1,
                                   &zn_tier_get(&tr->tm, p->param_id)->ext,
                                   (char *)tr->pstage[t] + piece_stage_off(bl, p) * tr->pbytes,
                                   p->n * tr->pbytes, "initial params");
                np_pending[t] = k + 1;
            }
            if (bl->frozen && !rc) {
                /* the only write the frozen base ever gets */
                rc = zn_ioq_submit(&tr->wq, &tr->pstage_req[t * tr->max_block_pieces + bl->np],
                                   1, &zn_tier_get(&tr->tm, bl->frozen_id)->ext, tr->pstage[t],
                                   frozen_home(bl) * tr->pbytes, "initial frozen params");
                np_pending[t] = bl->np + 1;
                if (!rc)
                    zn_tier_set_valid(&tr->tm, bl->frozen_id, ZN_TIER_NVME, true);
            }
        }
    }
    if (!rc && opt_nvme && iu.unit != tr->n_units)
        rc = zn_set_error(ZN_EINTERNAL, "train: initial state filled %d of %d optimizer units",
                          iu.unit, tr->n_units);
    if (!rc && tr->dopt) {
        float *z[3] = { tr->mom, tr->var, tr->gacc };
        for (int k = 0; k < 3 && !rc; k++)
            rc = tr->P ? zn_dev_memset(tr->dev, tr->s_h2d, z[k], 0, tr->P * 4) : 0;
        if (!rc)
            rc = zn_dev_stream_sync(tr->dev, tr->s_h2d);
    } else if (!opt_nvme) {
        memset(tr->mom, 0, tr->P * 4);
        memset(tr->var, 0, tr->P * 4);
        memset(tr->gacc, 0, tr->P * 4);
    }
out:
    /* every write issued is waited for, also after a failure: its buffer
     * is freed with the trainer */
    for (int t = 0; t < tr->n_pstage && t < 64; t++) {
        int r2 = init_pstage_wait(tr, t, np_pending);
        if (!rc)
            rc = r2;
    }
    if (opt_nvme)
        for (int s = 0; s < tr->n_oslots; s++) {
            int r2 = init_unit_wait(tr, s);
            if (!rc)
                rc = r2;
        }
    for (int s = 0; s < 16; s++)
        tr->oslot[s].unit = -1;
    return rc;
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
static zn_dtype grad_transfer_dtype(const zn_config *cfg, zn_dtype pdt)
{
    switch (cfg->train.grad_transfer) {
    case 1: return ZN_DTYPE_F32;
    case 2: return ZN_DTYPE_BF16;
    default: return pdt == ZN_DTYPE_BF16 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    }
}

static int dry_plan(zn_plan *out, const zn_train_options *o, const zn_config *cfg,
                    const zn_plan_input *in, int world, int rank)
{
    int rc = zn_plan_compute(out, cfg, in, &o->budgets);
    if (rc && rc != ZN_ENOFIT)
        return rc;
    zn_trainer *t = calloc(1, sizeof *t);
    if (!t)
        return zn_set_error(-ENOMEM, "train: out of memory");
    t->dry = true;
    t->cfg = *cfg;
    t->model = o->model;
    t->plan = *out;
    t->plan.n_items = 0;
    t->world = world > 0 ? world : 1;
    t->rank = rank;
    t->popt = cfg->zero.offload_param.device;
    t->oopt = cfg->zero.offload_optimizer.device;
    t->pdt = in->param_bytes == 2 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    t->pbytes = zn_dtype_size(t->pdt);
    for (int i = 0; i < ZN_TIER_COUNT; i++)
        t->tm.budget[i] = o->budgets.bytes[i];
    t->gnvme = t->oopt == ZN_OFFLOAD_NVME && t->plan.grads_tier == ZN_TIER_NVME;
    t->dopt = t->oopt == ZN_OFFLOAD_NONE;
    t->gdt = t->dopt ? ZN_DTYPE_F32 : grad_transfer_dtype(cfg, t->pdt);
    t->ckcpu = cfg->activation_checkpointing.cpu_checkpointing;
    rc = build_layout(t);
    if (!rc)
        rc = allocate(t);
    if (!rc) {
        char why[sizeof out->why];
        *out = t->plan;
        rc = zn_plan_use_items(out, cfg);
        snprintf(why, sizeof why, "%s", out->why);
        if (rc == ZN_ENOFIT)
            zn_set_error(rc, "%s", why);
    }
    free(t->blocks);
    free(t->units);
    free(t->pieces);
    free(t->ckpt);
    free(t->ckhost);
    free(t->ckord);
    free(t);
    return rc;
}

/* The device arena for a plan: its gpu total and 1 MiB for the arena's
 * start alignment, never beyond the budget. */
static uint64_t arena_bytes(const zn_plan *p, uint64_t budget)
{
    uint64_t want = p->tier_total[ZN_TIER_GPU] + ((uint64_t)1 << 20);
    return want < budget ? want : budget;
}

/* The plan input and the config must describe one run: each value has one
 * source (the config; zn_run_plan_input copies it), and a caller that
 * changed one without the other gets an error, not a plan of another run. */
static int check_plan_input(const zn_config *cfg, const zn_plan_input *in)
{
    if (in->micro_batch != cfg->train_micro_batch_size_per_gpu || in->seq_len != cfg->data.seq_len)
        return zn_set_error(ZN_EARG, "train: the plan input's micro-batch %lld x %lld tokens is "
                            "not the config's train_micro_batch_size_per_gpu %lld x data.seq_len "
                            "%lld", (long long)in->micro_batch, (long long)in->seq_len,
                            (long long)cfg->train_micro_batch_size_per_gpu,
                            (long long)cfg->data.seq_len);
    if (in->activation_checkpointing != cfg->train.activation_checkpointing)
        return zn_set_error(ZN_EARG, "train: the plan input's activation checkpointing (%d) is "
                            "not the config's (%d)", in->activation_checkpointing,
                            cfg->train.activation_checkpointing);
    return 0;
}

int zn_train_plan(zn_plan *plan, const zn_train_options *o, int world)
{
    if (!o || !o->cfg || !o->model || !o->plan_in || o->model->n_blocks < 1 ||
        !o->model->block_params)
        return zn_set_error(ZN_EARG, "train plan: incomplete options (config, model, plan input)");
    int rc = check_plan_input(o->cfg, o->plan_in);
    if (rc)
        return rc;
    zn_plan_input in = *o->plan_in;
    in.world_size = world > 0 ? world : 1;
    return dry_plan(plan, o, o->cfg, &in, in.world_size, 0);
}

static int pick_device(const zn_config *cfg, const zn_train_options *o, const char **name)
{
    *name = o->device ? o->device : cfg->train.device[0] ? cfg->train.device : "auto";
    return 0;
}

int zn_train_create(zn_trainer **out, const zn_train_options *o)
{
    *out = NULL;
    if (!o || !o->cfg || !o->model || !o->plan_in || o->model->n_blocks < 1 ||
        !o->model->block_params || !o->model->forward || !o->model->backward ||
        !o->model->init_params || !o->model->set_batch || !o->model->read_loss)
        return zn_set_error(ZN_EARG, "train: incomplete options (config, model, plan input)");
    const zn_config *cfg = o->cfg;
    if (check_plan_input(cfg, o->plan_in))
        return ZN_EARG;
    const char *devname;
    pick_device(cfg, o, &devname);
    bool maybe_cuda = ZN_HAVE_CUDA && strcmp(devname, "host") != 0;
    bool half = cfg->bf16 || cfg->fp16.enabled;

    /* Plan first: an infeasible config stops here, before any allocation. */
    zn_plan_input in = *o->plan_in;
    in.param_bytes = maybe_cuda && half ? 2 : 4;
    if (o->comm)
        in.world_size = zn_comm_size(o->comm);  /* budgets are per rank */
    zn_plan plan;
    int crank = o->comm ? zn_comm_rank(o->comm) : 0;
    int rc = dry_plan(&plan, o, cfg, &in, in.world_size, crank);
    if (rc == ZN_ENOFIT)
        return zn_set_error(ZN_ENOFIT, "does not fit: %s", plan.why);
    if (rc)
        return rc;

    zn_trainer *tr = calloc(1, sizeof *tr);
    if (!tr)
        return zn_set_error(-ENOMEM, "train: out of memory");
    tr->cfg = *cfg;
    tr->model = o->model;
    tr->comm = o->comm;
    tr->rank = 0;
    tr->world = 1;
    tr->plan = plan;
    tr->fault_hook = o->fault_hook;
    tr->fault_user = o->fault_user;
    tr->lr_fault = o->lr_fault;
    tr->lr_fault_user = o->lr_fault_user;
    pthread_mutex_init(&tr->elock, NULL);
    tr->popt = cfg->zero.offload_param.device;
    tr->oopt = cfg->zero.offload_optimizer.device;
    if (cfg->zero.stage < 3 && tr->popt != ZN_OFFLOAD_NONE) {
        rc = zn_set_error(ZN_ECONFIG, "%s: zero_optimization.offload_param needs stage 3 "
                          "(stage is %d)", cfg->source, cfg->zero.stage);
        goto fail;
    }
    tr->threads = o->threads ? o->threads : (int)cfg->train.threads;
    ZN_TRY_GOTO(zn_trace_create(&tr->trace, o->record_trace, 0));
    for (int r = 0; r < ZN_RES_COUNT; r++) {
        tr->track[r] = r == ZN_RES_NVME
                           ? zn_trace_add_union(tr->trace, res_names[r],
                                                tr->track[ZN_RES_NVME_READ],
                                                tr->track[ZN_RES_NVME_WRITE])
                           : zn_trace_add_track(tr->trace, res_names[r]);
        if (tr->track[r] < 0)
            ZN_TRY_GOTO(tr->track[r]);
    }

    /* The device arena takes what the plan allocates (plus the arena's own
     * alignment slack), not the whole gpu budget: what the budget leaves on
     * a real GPU stays free for cuBLAS workspaces, NCCL buffers and lazily
     * loaded kernels, which allocate outside the arena. */
    zn_dev_config dc = zn_dev_config_default();
    dc.name = devname;
    dc.gpu_budget = arena_bytes(&tr->plan, o->budgets.bytes[ZN_TIER_GPU]);
    dc.cpu_budget = o->budgets.bytes[ZN_TIER_CPU];
    ZN_TRY_GOTO(zn_dev_create(&tr->dev, &dc));
    bool cuda = zn_dev_get_kind(tr->dev) == ZN_DEV_CUDA;
    if (cuda && cfg->fp16.enabled) {
        rc = zn_set_error(ZN_EUNSUPPORTED, "%s: fp16 compute is not implemented on CUDA; use "
                          "\"bf16\": {\"enabled\": true}", cfg->source);
        goto fail;
    }
    tr->pdt = cuda && cfg->bf16 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    tr->pbytes = zn_dtype_size(tr->pdt);
    if ((int)tr->pbytes != in.param_bytes) {
        /* auto fell back to the host backend: re-plan with fp32 params */
        in.param_bytes = (int)tr->pbytes;
        rc = dry_plan(&tr->plan, o, cfg, &in, in.world_size, crank);
        if (rc == ZN_ENOFIT) {
            rc = zn_set_error(ZN_ENOFIT, "does not fit: %s", tr->plan.why);
            goto fail;
        }
        if (rc)
            goto fail;
        /* and an arena of that plan's size (nothing is allocated yet) */
        zn_dev_destroy(tr->dev);
        tr->dev = NULL;
        dc.name = "host";
        dc.gpu_budget = arena_bytes(&tr->plan, o->budgets.bytes[ZN_TIER_GPU]);
        ZN_TRY_GOTO(zn_dev_create(&tr->dev, &dc));
    }
    if (tr->comm && zn_comm_size(tr->comm) > 1) {
        tr->world = zn_comm_size(tr->comm);
        tr->rank = zn_comm_rank(tr->comm);
        /* the collectives run on the comm's own stream on this device */
        ZN_TRY_GOTO(zn_comm_attach_device(tr->comm, tr->dev));
        tr->comm_attached = true;
        tr->s_comm = zn_comm_stream(tr->comm);
    }
    ZN_TRY_GOTO(zn_tier_init(&tr->tm, tr->dev, &o->budgets));
    ZN_TRY_GOTO(zn_dev_stream_create(tr->dev, "compute", &tr->s_comp));
    ZN_TRY_GOTO(zn_dev_stream_create(tr->dev, "h2d", &tr->s_h2d));
    ZN_TRY_GOTO(zn_dev_stream_create(tr->dev, "d2h", &tr->s_d2h));
    ZN_TRY_GOTO(zn_dev_stream_create(tr->dev, "opt-h2d", &tr->s_oh2d));
    ZN_TRY_GOTO(zn_accum_start(tr));

    tr->gnvme = tr->oopt == ZN_OFFLOAD_NVME && tr->plan.grads_tier == ZN_TIER_NVME;
    tr->dopt = tr->oopt == ZN_OFFLOAD_NONE;
    tr->gdt = tr->dopt ? ZN_DTYPE_F32 : grad_transfer_dtype(cfg, tr->pdt);
    tr->ckcpu = cfg->activation_checkpointing.cpu_checkpointing;
    if (tr->ckcpu) {
        ZN_TRY_GOTO(zn_dev_stream_create(tr->dev, "activations", &tr->s_act));
        for (int i = 0; i < ZN_CK_RING; i++) {
            ZN_TRY_GOTO(make_event(tr, &tr->ev_ckw[i]));
            ZN_TRY_GOTO(make_event(tr, &tr->ev_cks[i]));
            ZN_TRY_GOTO(make_event(tr, &tr->ev_ckl[i]));
        }
        ZN_TRY_GOTO(make_event(tr, &tr->ev_ckc));
    }
    ZN_TRY_GOTO(build_layout(tr));
    ZN_TRY_GOTO(allocate(tr));
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
        zn_opt_slot *sl = &tr->oslot[s];
        sl->unit = -1;
        for (int i = 0; i < 3; i++) {
            atomic_store(&sl->rd[i].done, 1);
            atomic_store(&sl->wr[i].done, 1);
        }
        if (s >= tr->n_oslots)
            continue;
        sl->grd = calloc((size_t)tr->max_unit_pieces, sizeof *sl->grd);
        sl->pwr = calloc((size_t)tr->max_unit_pieces, sizeof *sl->pwr);
        if (!sl->grd || !sl->pwr) {
            rc = zn_set_error(-ENOMEM, "train: out of memory");
            goto fail;
        }
        ZN_TRY_GOTO(make_event(tr, &sl->h2d_done));
    }
    if (tr->n_pstage) {
        tr->pstage_req = calloc((size_t)tr->n_pstage * (size_t)tr->max_block_pieces,
                                sizeof *tr->pstage_req);
        if (!tr->pstage_req) {
            rc = zn_set_error(-ENOMEM, "train: out of memory");
            goto fail;
        }
        for (int i = 0; i < tr->n_pstage; i++)
            ZN_TRY_GOTO(make_event(tr, &tr->ev_pstage_free[i]));
    }
    if (tr->nslots) {
        tr->ev_ready = calloc((size_t)tr->nslots, sizeof *tr->ev_ready);
        tr->ev_consumed = calloc((size_t)tr->nslots, sizeof *tr->ev_consumed);
        if (!tr->ev_ready || !tr->ev_consumed) {
            rc = zn_set_error(-ENOMEM, "train: out of memory");
            goto fail;
        }
        tr->ev_shard = calloc((size_t)tr->nslots, sizeof *tr->ev_shard);
        if (!tr->ev_shard) {
            rc = zn_set_error(-ENOMEM, "train: out of memory");
            goto fail;
        }
        for (int s = 0; s < tr->nslots; s++) {
            ZN_TRY_GOTO(make_event(tr, &tr->ev_ready[s]));
            ZN_TRY_GOTO(make_event(tr, &tr->ev_consumed[s]));
            ZN_TRY_GOTO(make_event(tr, &tr->ev_shard[s]));
        }
    }
    for (int i = 0; i < 2; i++) {
        ZN_TRY_GOTO(make_event(tr, &tr->ev_gready[i]));
        ZN_TRY_GOTO(make_event(tr, &tr->ev_gfree[i]));
        ZN_TRY_GOTO(make_event(tr, &tr->ev_rs[i]));
    }

    ZN_TRY_GOTO(initialise(tr));
    /* the links' counters are the steps' traffic: the setup's is kept apart */
    tr->setup_nvme_write = atomic_exchange(&tr->tm.nvme_write, 0);
    tr->setup_h2d = atomic_exchange(&tr->tm.h2d, 0);
    ZN_TRY_GOTO(zn_optsched_init(tr));
    /* ZeRO stages 1/2 on several ranks all-gather the updated shards after
     * the optimizer (gather_replicated); everything else lets the step
     * return while its optimizer job still runs. */
    tr->pipeline = tr->world == 1 || cfg->zero.stage >= 3;
    zn_loss_scaler_init(&tr->scaler, &cfg->fp16);
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
    if (tr->othr_started)
        zn_optsched_wait(tr);  /* a pipelined job ends before anything is freed */
    zn_optsched_fini(tr);
    if (tr->dev)
        zn_dev_sync(tr->dev);
    zn_accum_stop(tr); /* its jobs use the NVMe queues */
    zn_ioq_stop(&tr->rq);
    zn_ioq_stop(&tr->wq);
    if (tr->dev) {
        for (int s = 0; s < tr->nslots; s++) {
            if (tr->ev_ready)
                zn_dev_event_destroy(tr->dev, tr->ev_ready[s]);
            if (tr->ev_consumed)
                zn_dev_event_destroy(tr->dev, tr->ev_consumed[s]);
            if (tr->ev_shard)
                zn_dev_event_destroy(tr->dev, tr->ev_shard[s]);
        }
        for (int i = 0; i < 2; i++) {
            zn_dev_event_destroy(tr->dev, tr->ev_gready[i]);
            zn_dev_event_destroy(tr->dev, tr->ev_gfree[i]);
            zn_dev_event_destroy(tr->dev, tr->ev_rs[i]);
        }
        for (int i = 0; i < tr->n_pstage; i++)
            zn_dev_event_destroy(tr->dev, tr->ev_pstage_free[i]);
        for (int s = 0; s < 16; s++)
            zn_dev_event_destroy(tr->dev, tr->oslot[s].h2d_done);
        if (tr->model && tr->model->release)
            tr->model->release(tr->model->ctx, tr->dev);
        zn_dev_stream_destroy(tr->dev, tr->s_comp);
        zn_dev_stream_destroy(tr->dev, tr->s_h2d);
        zn_dev_stream_destroy(tr->dev, tr->s_d2h);
        zn_dev_stream_destroy(tr->dev, tr->s_oh2d);
        for (int i = 0; i < ZN_CK_RING; i++) {
            zn_dev_event_destroy(tr->dev, tr->ev_ckw[i]);
            zn_dev_event_destroy(tr->dev, tr->ev_cks[i]);
            zn_dev_event_destroy(tr->dev, tr->ev_ckl[i]);
        }
        zn_dev_event_destroy(tr->dev, tr->ev_ckc);
        if (tr->s_act)
            zn_dev_stream_destroy(tr->dev, tr->s_act);
        if (tr->comm_attached)
            zn_comm_detach_device(tr->comm);
        zn_tier_fini(&tr->tm);
        zn_dev_destroy(tr->dev);
    }
    for (int s = 0; s < 16; s++) {
        free(tr->oslot[s].grd);
        free(tr->oslot[s].pwr);
    }
    free(tr->ev_ready);
    free(tr->ev_consumed);
    free(tr->ev_shard);
    free(tr->pstage_req);
    free(tr->pc);
    free(tr->slot);
    free(tr->slot_block);
    free(tr->ckpt);
    free(tr->ckhost);
    free(tr->ckord);
    free(tr->blocks);
    free(tr->units);
    free(tr->pieces);
    free(tr->accum_args);
    free(tr->nurows);
    free(tr->marks);
    zn_trace_destroy(tr->trace);
    pthread_mutex_destroy(&tr->elock);
    free(tr);
}

/* ---- the step ------------------------------------------------------------------*/
typedef struct {
    int block;
    int first_use, last_use;
} fetch_ent;

/* Whether the previous step's optimizer job has landed its updates of block
 * b's parameters at their homes (every unit holding a piece of b). */
static bool params_landed(zn_trainer *tr, int b)
{
    zn_block *bl = &tr->blocks[b];
    for (int k = 0; k < bl->np; k++)
        if (atomic_load(&tr->units[tr->pieces[bl->p0 + k].unit].pdone) < tr->pseq_need)
            return false;
    return true;
}

/* plock held: block b may be fetched: its update landed at home, or sits
 * whole in the param cache. */
static bool params_ready_locked(zn_trainer *tr, int b)
{
    return params_landed(tr, b) ||
           (tr->blocks[b].pc_ok && zn_pcache_ready_locked(tr, b, tr->pseq_need));
}

static bool params_ready(zn_trainer *tr, int b)
{
    if (params_landed(tr, b))
        return true;
    if (!tr->blocks[b].pc_ok)
        return false;
    pthread_mutex_lock(&tr->plock);
    bool r = zn_pcache_ready_locked(tr, b, tr->pseq_need);
    pthread_mutex_unlock(&tr->plock);
    return r;
}

/* Waits until block b's parameters are ready (or, with `landed`, landed at
 * home); the optimizer thread, the NVMe queue and the optimizer's H2D
 * stream get there without this thread's help. */
static int wait_for(zn_trainer *tr, int b, bool landed)
{
    if (landed ? params_landed(tr, b) : params_ready(tr, b))
        return 0;
    uint64_t t0 = zn_now_ns();
    pthread_mutex_lock(&tr->plock);
    while (!(landed ? params_landed(tr, b) : params_ready_locked(tr, b)) &&
           !atomic_load(&tr->err))
        pthread_cond_wait(&tr->pcv, &tr->plock);
    pthread_mutex_unlock(&tr->plock);
    tr->param_wait_s += (double)(zn_now_ns() - t0) * 1e-9;
    return atomic_load(&tr->err);
}

static int wait_params(zn_trainer *tr, int b)
{
    return wait_for(tr, b, false);
}

static int wait_landed(zn_trainer *tr, int b)
{
    return wait_for(tr, b, true);
}

/* Host function on the H2D stream: the NVMe reads of a block into staging
 * must be complete before the copy that follows it. */
static void pread_wait_fn(void *arg)
{
    zn_pread_arg *a = arg;
    zn_trainer *tr = a->tr;
    for (int k = 0; k < a->np; k++) {
        zn_io_req *r = &tr->pstage_req[a->t * tr->max_block_pieces + k];
        int rc = zn_ioq_wait(&tr->rq, r);
        if (rc)
            zn_train_fail(tr, rc, "fetching params of block %d: %s", a->block, zn_last_error());
    }
}

/* Brings block `block`'s working params into device slot `slot`: from its
 * home (pinned, or NVMe through a pinned staging buffer) over H2D; with
 * world size N > 1 the home holds this rank's shard, which goes to its
 * place in the slot and is then all-gathered there on the comm stream (a
 * device-homed shard is gathered straight from the device). ev_ready[slot]
 * is recorded on the stream that finishes the slot. */
static int fetch(zn_trainer *tr, int block, int slot, uint64_t *nvme_fetches)
{
    zn_block *bl = &tr->blocks[block];
    zn_dev *d = tr->dev;
    bool gather = !bl->replicated, split = bl->fshard > 0;
    size_t bytes = (split ? bl->fshard + bl->shard : gather ? bl->len : bl->n) * tr->pbytes;
    const size_t pb = tr->pbytes;
    char *sl = tr->slot[slot];
    /* where the home's copy lands: the whole block at 0, the rank's shard
     * at its place for an in-place gather; split: the frozen shard at its
     * place, the trainable shard past both gathers' reach (train-impl.h) */
    char *dst = sl + (split ? bl->foff * pb : gather ? bl->soff * pb : 0);
    char *tdst = sl + (bl->npad - bl->shard) * pb;
    char name[ZN_TRACE_NAME_LEN];
    int rc;
    if (bl->home == ZN_PHOME_DEVICE) {
        /* sharded on the device: gather from the home shard into the slot */
        if ((rc = zn_dev_stream_wait_event(d, tr->s_comm, tr->ev_consumed[slot])))
            return rc;
        snprintf(name, sizeof name, "gather b%d", block);
        zn_mark *mk = zn_train_mark_begin(tr, tr->s_comm, ZN_RES_COMM, name);
        if (split && ((rc = zn_comm_allgather_on(tr->comm, tr->s_comm, bl->dev_params, sl,
                                                 bl->fshard, tr->pdt)) ||
                      (bl->shard && (rc = zn_comm_allgather_on(tr->comm, tr->s_comm,
                                                 (char *)bl->dev_params + bl->fshard * pb,
                                                 sl + bl->frozen * pb, bl->shard, tr->pdt)))))
            return rc;
        if (!split && (rc = zn_comm_allgather_on(tr->comm, tr->s_comm, bl->dev_params, sl,
                                                 bl->shard, tr->pdt)))
            return rc;
        zn_train_mark_end(tr, tr->s_comm, mk);
        if ((rc = zn_dev_event_record(d, tr->ev_ready[slot], tr->s_comm)))
            return rc;
        tr->slot_block[slot] = block;
        return 0;
    }
    if ((rc = zn_dev_stream_wait_event(d, tr->s_h2d, tr->ev_consumed[slot])))
        return rc;
    const void *src = bl->cpu_params;
    int t = -1, pc = -1;
    if (bl->home == ZN_PHOME_NVME && bl->pc_ok &&
        (pc = zn_pcache_take(tr, block, tr->pseq_need)) >= 0) {
        /* the optimizer's pinned copy of the update: no NVMe read */
        src = tr->pc[pc].buf;
        atomic_fetch_add(&tr->pc_hits, 1);
        atomic_fetch_add(&tr->pc_bytes, bytes);
    } else if (bl->home == ZN_PHOME_NVME) {
        /* the cache entry that made the block ready may have been evicted
         * since: read it only once its write landed */
        if ((rc = wait_landed(tr, block)))
            return rc;
        t = (int)(*nvme_fetches % (uint64_t)tr->n_pstage);
        (*nvme_fetches)++;
        /* the staging buffer's previous copy must be done before it is refilled */
        if ((rc = zn_dev_event_sync(d, tr->ev_pstage_free[t])))
            return rc;
        int nr = bl->np + (bl->frozen ? 1 : 0);
        snprintf(name, sizeof name, "params b%d", block);
        for (int k = 0; k < nr; k++) {
            zn_io_req *r = &tr->pstage_req[t * tr->max_block_pieces + k];
            if (k < bl->np) {
                zn_piece *p = &tr->pieces[bl->p0 + k];
                rc = zn_ioq_submit(&tr->rq, r, 0, &zn_tier_get(&tr->tm, p->param_id)->ext,
                                   (char *)tr->pstage[t] + piece_stage_off(bl, p) * tr->pbytes,
                                   p->n * tr->pbytes, name);
            } else {
                rc = zn_ioq_submit(&tr->rq, r, 0, &zn_tier_get(&tr->tm, bl->frozen_id)->ext,
                                   tr->pstage[t], frozen_home(bl) * tr->pbytes, name);
            }
            if (rc) {
                for (int j = 0; j <= k; j++)
                    zn_ioq_wait(&tr->rq, &tr->pstage_req[t * tr->max_block_pieces + j]);
                return zn_ioq_wait(&tr->rq, r);
            }
        }
        zn_pread_arg *a = &tr->pstage_arg[t];
        a->tr = tr;
        a->t = t;
        a->block = block;
        a->np = nr;
        if ((rc = zn_dev_launch_host_fn(d, tr->s_h2d, pread_wait_fn, a)))
            return rc;
        src = tr->pstage[t];
    }
    snprintf(name, sizeof name, "h2d b%d", block);
    zn_mark *mk = zn_train_mark_begin(tr, tr->s_h2d, ZN_RES_H2D, name);
    if (split) {
        if ((rc = zn_dev_copy_h2d(d, tr->s_h2d, dst, src, bl->fshard * pb)) ||
            (bl->shard && (rc = zn_dev_copy_h2d(d, tr->s_h2d, tdst,
                                                (const char *)src + bl->fshard * pb,
                                                bl->shard * pb))))
            return rc;
    } else if (bytes && (rc = zn_dev_copy_h2d(d, tr->s_h2d, dst, src, bytes))) {
        return rc;
    }
    zn_train_mark_end(tr, tr->s_h2d, mk);
    atomic_fetch_add(&tr->tm.h2d, bytes);
    if (t >= 0 && (rc = zn_dev_event_record(d, tr->ev_pstage_free[t], tr->s_h2d)))
        return rc;
    if (pc >= 0 && (rc = zn_dev_launch_host_fn(d, tr->s_h2d, zn_pcache_release_fn, &tr->pc[pc])))
        return rc;
    if (gather) {
        if ((rc = zn_dev_event_record(d, tr->ev_shard[slot], tr->s_h2d)) ||
            (rc = zn_dev_stream_wait_event(d, tr->s_comm, tr->ev_shard[slot])))
            return rc;
        snprintf(name, sizeof name, "gather b%d", block);
        zn_mark *m2 = zn_train_mark_begin(tr, tr->s_comm, ZN_RES_COMM, name);
        if (split && ((rc = zn_comm_allgather_on(tr->comm, tr->s_comm, dst, sl, bl->fshard,
                                                 tr->pdt)) ||
                      (bl->shard && (rc = zn_comm_allgather_on(tr->comm, tr->s_comm, tdst,
                                                               sl + bl->frozen * pb, bl->shard,
                                                               tr->pdt)))))
            return rc;
        if (!split && (rc = zn_comm_allgather_on(tr->comm, tr->s_comm, dst, sl, bl->shard,
                                                 tr->pdt)))
            return rc;
        zn_train_mark_end(tr, tr->s_comm, m2);
        if ((rc = zn_dev_event_record(d, tr->ev_ready[slot], tr->s_comm)))
            return rc;
    } else if ((rc = zn_dev_event_record(d, tr->ev_ready[slot], tr->s_h2d))) {
        return rc;
    }
    tr->slot_block[slot] = block;
    return 0;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Row-sparse gradients: micro-batch mb's distinct ids, sorted, on the host
 * and (queued on the D2H stream, ahead of the gathers that read them) on
 * the device. Both stay until the step's D2H work is done. */
static int stage_rows(zn_trainer *tr, int mb, const int32_t *ids, int64_t ntok)
{
    if ((int64_t)(mb + 1) * ntok > tr->urows_cap)
        return zn_set_error(ZN_EINTERNAL, "train: token rows for micro-batch %d beyond %lld",
                            mb, (long long)tr->urows_cap);
    int32_t *u = tr->urows + (size_t)mb * (size_t)ntok;
    memcpy(u, ids, (size_t)ntok * 4);
    qsort(u, (size_t)ntok, 4, cmp_i32);
    int64_t n = 0;
    for (int64_t i = 0; i < ntok; i++)
        if (!n || u[i] != u[n - 1])
            u[n++] = u[i];
    tr->nurows[mb] = n;
    return n ? zn_dev_copy_h2d(tr->dev, tr->s_d2h, tr->urows_dev + (size_t)mb * (size_t)ntok, u,
                               (size_t)n * 4)
             : 0;
}

/* First index of sorted u[0..n) with u[i] >= x. */
static int64_t lower_bound_i32(const int32_t *u, int64_t n, int64_t x)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (u[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int ensure_capacity(zn_trainer *tr, int A)
{
    int need_args = A * tr->L;
    if (tr->n_accum_args < need_args) {
        free(tr->accum_args);
        tr->accum_args = calloc((size_t)need_args, sizeof *tr->accum_args);
        if (!tr->accum_args)
            return zn_set_error(-ENOMEM, "train: out of memory");
        tr->n_accum_args = need_args;
    }
    int need_marks = A * tr->L * 8 + 16; /* up to 8 per block use (cpu checkpoints: 2) */
    if (tr->n_marks < need_marks) {
        free(tr->marks);
        tr->marks = calloc((size_t)need_marks, sizeof *tr->marks);
        if (!tr->marks)
            return zn_set_error(-ENOMEM, "train: out of memory");
        tr->n_marks = need_marks;
    }
    return 0;
}

/* Issues, in order, every fetch whose slot's previous user (use index <
 * next_use) has been queued and whose block's parameters have landed; a
 * fetch needed by use next_use itself waits for them. A fetch not issued
 * here is tried again at the next use. With several ranks a fetch is never
 * put off for readiness: which fetches are issued before a use then depends
 * only on the slots, the same on every rank, so every rank issues its
 * all-gathers at the same place among its collectives whatever its NVMe or
 * param-cache state (collectives paired out of order hang NCCL). */
static int issue_fetches(zn_trainer *tr, const fetch_ent *fe, int nfe, int *next_fetch,
                         int next_use, uint64_t *nvme_fetches)
{
    while (*next_fetch < nfe &&
           (*next_fetch < tr->nslots || fe[*next_fetch - tr->nslots].last_use < next_use)) {
        int j = *next_fetch, rc;
        if (!params_ready(tr, fe[j].block)) {
            if (tr->world == 1 && fe[j].first_use > next_use)
                break;
            if ((rc = wait_params(tr, fe[j].block)))
                return rc;
        }
        (*next_fetch)++;
        if ((rc = fetch(tr, fe[j].block, j % tr->nslots, nvme_fetches)))
            return rc;
    }
    return 0;
}

/* The optimizer on the device: block b's reduced gradients (gsrc) are
 * summed into its accumulators on the D2H stream, which then frees gdev[g];
 * after the last micro-batch their sums of squares by chunk go to pinned
 * memory and the accumulation worker turns them into the block's norm and
 * releases its units to the optimizer. No gradient leaves the device. */
static int accum_on_device(zn_trainer *tr, int mb, int b, int g, const float *gsrc)
{
    zn_dev *d = tr->dev;
    zn_block *bl = &tr->blocks[b];
    float *sum = tr->gacc + bl->off;
    int64_t n = (int64_t)bl->len;
    int rc;
    char name[ZN_TRACE_NAME_LEN];
    snprintf(name, sizeof name, "accum b%d", b);
    zn_mark *mk = zn_train_mark_begin(tr, tr->s_d2h, ZN_RES_D2H, name);
    if (n && (rc = mb == 0 ? zn_dev_copy_d2d(d, tr->s_d2h, sum, gsrc, (size_t)n * 4)
                           : zn_dev_axpy(d, tr->s_d2h, 1.0f, gsrc, ZN_DTYPE_F32, sum,
                                         ZN_DTYPE_F32, n)))
        return rc;
    if ((rc = zn_dev_event_record(d, tr->ev_gfree[g], tr->s_d2h)))
        return rc;
    int A = (int)tr->cfg.gradient_accumulation_steps;
    if (mb == (A > 1 ? A - 1 : 0)) {
        uint64_t nc = ((uint64_t)n + ZN_GRAD_NORM_CHUNK - 1) / ZN_GRAD_NORM_CHUNK;
        if (nc && ((rc = zn_dev_norm_sq_chunks(d, tr->s_d2h, sum, n,
                                               tr->normc_dev + bl->nc_off)) ||
                   (rc = zn_dev_copy_d2h(d, tr->s_d2h, tr->normc + bl->nc_off,
                                         tr->normc_dev + bl->nc_off, nc * 8))))
            return rc;
        atomic_fetch_add(&tr->tm.d2h, nc * 8);
        zn_accum_arg *aa = &tr->accum_args[mb * tr->L + b];
        aa->tr = tr;
        aa->block = b;
        aa->gbuf = g;
        aa->mb = mb;
        aa->rows = NULL;
        aa->nrows = -1;
        if ((rc = zn_dev_launch_host_fn(d, tr->s_d2h, zn_accum_post_fn, aa)))
            return rc;
    }
    zn_train_mark_end(tr, tr->s_d2h, mk);
    return 0;
}

/* ---- cpu checkpointing (activation_checkpointing.cpu_checkpointing) ------
 * Group inputs live in pinned RAM; the device holds ZN_CK_RING of them.
 * Ordinal k (tr->ckord) uses slot k % ZN_CK_RING: the forward writes input
 * k + 1 while it reads k, and saves each one D2H on s_act as soon as it is
 * written; the backward of a group loads the previous group's input H2D on
 * s_act while it runs. An input still in its slot (the last forward's, the
 * head's neighbours) is not loaded again. The copies share the link: their
 * spans go on the H2D / D2H tracks beside the parameters' and gradients'. */
#define CK(x)                  \
    do {                       \
        int rc_ = (x);         \
        if (rc_)               \
            return rc_;        \
    } while (0)

static int ck_slot(const zn_trainer *tr, int b)
{
    return tr->ckord[b] % ZN_CK_RING;
}

/* Before a forward writes block b's input (b a group's first block). */
static int ck_before_write(zn_trainer *tr, int b)
{
    if (!tr->ckcpu || b <= 0 || b >= tr->L)
        return 0;
    int s = ck_slot(tr, b);
    if (tr->ck_saving[s]) {   /* the slot's last save has left it */
        CK(zn_dev_stream_wait_event(tr->dev, tr->s_comp, tr->ev_cks[s]));
        tr->ck_saving[s] = false;
    }
    if (tr->ck_loading[s]) {  /* an unused load (a failed step) has landed */
        CK(zn_dev_stream_wait_event(tr->dev, tr->s_comp, tr->ev_ckl[s]));
        tr->ck_loading[s] = false;
    }
    tr->ckres[s] = b;
    return 0;
}

/* After the forward wrote block b's input: its copy to pinned RAM. */
static int ck_save(zn_trainer *tr, int b)
{
    if (!tr->ckcpu || b <= 0 || b >= tr->L)
        return 0;
    int s = ck_slot(tr, b);
    CK(zn_dev_event_record(tr->dev, tr->ev_ckw[s], tr->s_comp));
    CK(zn_dev_stream_wait_event(tr->dev, tr->s_act, tr->ev_ckw[s]));
    char name[ZN_TRACE_NAME_LEN];
    snprintf(name, sizeof name, "ckpt d2h b%d", b);
    zn_mark *mk = zn_train_mark_begin(tr, tr->s_act, ZN_RES_D2H, name);
    CK(zn_dev_copy_d2h(tr->dev, tr->s_act, tr->ckhost[b], tr->ckring[s], tr->ck_bytes));
    zn_train_mark_end(tr, tr->s_act, mk);
    CK(zn_dev_event_record(tr->dev, tr->ev_cks[s], tr->s_act));
    tr->ck_saving[s] = true;
    atomic_fetch_add(&tr->tm.d2h, tr->ck_bytes);
    return 0;
}

/* Block b's input back into its slot unless the slot still holds it. The
 * slot's occupant may be read by anything the compute stream has queued. */
static int ck_load(zn_trainer *tr, int b)
{
    if (!tr->ckcpu || b <= 0)
        return 0;
    int s = ck_slot(tr, b);
    if (tr->ckres[s] == b)
        return 0;
    CK(zn_dev_event_record(tr->dev, tr->ev_ckc, tr->s_comp));
    CK(zn_dev_stream_wait_event(tr->dev, tr->s_act, tr->ev_ckc));
    char name[ZN_TRACE_NAME_LEN];
    snprintf(name, sizeof name, "ckpt h2d b%d", b);
    zn_mark *mk = zn_train_mark_begin(tr, tr->s_act, ZN_RES_H2D, name);
    CK(zn_dev_copy_h2d(tr->dev, tr->s_act, tr->ckring[s], tr->ckhost[b], tr->ck_bytes));
    zn_train_mark_end(tr, tr->s_act, mk);
    CK(zn_dev_event_record(tr->dev, tr->ev_ckl[s], tr->s_act));
    tr->ck_loading[s] = true;
    tr->ckres[s] = b;
    atomic_fetch_add(&tr->tm.h2d, tr->ck_bytes);
    return 0;
}

/* Entering the backward of the group of block b (at its last block): its
 * input on the device, and the previous group's loading behind it. */
static int ck_enter_backward(zn_trainer *tr, const zn_block *bl)
{
    if (!tr->ckcpu || bl->gfirst <= 0)
        return 0;
    int s = ck_slot(tr, bl->gfirst);
    CK(ck_load(tr, bl->gfirst));
    if (tr->ck_loading[s]) {
        CK(zn_dev_stream_wait_event(tr->dev, tr->s_comp, tr->ev_ckl[s]));
        tr->ck_loading[s] = false;
    }
    int prev = tr->blocks[bl->gfirst - 1].gfirst;
    return prev > 0 ? ck_load(tr, prev) : 0;
}
#undef CK

/* Queues one micro-batch's forward and backward. `fe` is the step's fetch
 * list over ring blocks, *next_fetch the next entry to issue, *use the
 * running use index. */
static int run_micro_batch(zn_trainer *tr, int mb, const fetch_ent *fe, int nfe,
                           int *next_fetch, int *use, const int *fetch_of_use,
                           uint64_t *nvme_fetches)
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
        if ((rc = issue_fetches(tr, fe, nfe, next_fetch, i, nvme_fetches)))
            return rc;
        void *params = bl->dev_params;
        int f = fetch_of_use[i];
        int slot = f >= 0 ? f % tr->nslots : -1;
        if (slot >= 0) {
            if ((rc = zn_dev_stream_wait_event(d, tr->s_comp, tr->ev_ready[slot])))
                return rc;
            params = tr->slot[slot];
        } else if ((rc = wait_params(tr, b))) {
            return rc;  /* resident on the device: the update's H2D must have landed */
        }
        const void *in = bl->gfirst > 0 ? tr->ckpt[bl->gfirst] : NULL;
        snprintf(name, sizeof name, "%s b%d", bwd ? "bwd" : "fwd", b);
        if (!bwd) {
            if (b == bl->gfirst && (rc = ck_before_write(tr, bl->glast + 1)))
                return rc;
            zn_mark *mk = zn_train_mark_begin(tr, tr->s_comp, ZN_RES_COMPUTE, name);
            void *o = bl->glast < L - 1 ? tr->ckpt[bl->glast + 1] : NULL;
            if ((rc = md->forward(md->ctx, tr->s_comp, b, params, in, o)))
                return zn_error_prefix(rc, "forward of block %d", b);
            zn_train_mark_end(tr, tr->s_comp, mk);
            if (b == bl->glast && (rc = ck_save(tr, bl->glast + 1)))
                return rc;
        } else {
            if (b == bl->glast && (rc = ck_enter_backward(tr, bl)))
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
            if (tr->dopt) {
                if ((rc = accum_on_device(tr, mb, b, g, gsrc)))
                    return rc;
                goto consumed;
            }
            /* staging buffer g is free once its last accumulation ended */
            if ((rc = zn_dev_launch_host_fn(d, tr->s_d2h, zn_accum_wait_buf_fn, &tr->abuf[g])))
                return rc;
            snprintf(name, sizeof name, "d2h b%d", b);
            zn_mark *m2 = zn_train_mark_begin(tr, tr->s_d2h, ZN_RES_D2H, name);
            uint64_t gbytes = bl->len * zn_dtype_size(tr->gdt);
            const int32_t *rows = NULL;
            int64_t nrows = -1;
            if (bl->srow0 >= 0) {
                /* the rows of this micro-batch's tokens only: gathered (and
                 * cast) on the D2H stream, gdev[g] then free */
                int64_t ntok = tr->cfg.train_micro_batch_size_per_gpu * tr->cfg.data.seq_len;
                int64_t W = md->row_width, nr = (int64_t)(bl->len / (uint64_t)W);
                const int32_t *u = tr->urows + (size_t)mb * (size_t)ntok;
                int64_t lo = lower_bound_i32(u, tr->nurows[mb], bl->srow0);
                int64_t hi = lower_bound_i32(u, tr->nurows[mb], bl->srow0 + nr);
                rows = u + lo;
                nrows = hi - lo;
                gbytes = (uint64_t)(nrows * W) * zn_dtype_size(tr->gdt);
                if (nrows &&
                    (rc = zn_dev_embedding_rows_fwd(d, tr->s_d2h,
                                                    tr->urows_dev + (size_t)mb * (size_t)ntok + lo,
                                                    nrows, gsrc, ZN_DTYPE_F32, bl->srow0, nr, W,
                                                    tr->gcast, tr->gdt)))
                    return rc;
                if ((rc = zn_dev_event_record(d, tr->ev_gfree[g], tr->s_d2h)) ||
                    (nrows && (rc = zn_dev_copy_d2h(d, tr->s_d2h, tr->gstage[g], tr->gcast,
                                                    gbytes))))
                    return rc;
            } else if (tr->gdt != ZN_DTYPE_F32 && bl->len) {
                /* cast the shard, free gdev[g] for the next block, then
                 * move half the bytes */
                if ((rc = zn_dev_cast(d, tr->s_d2h, gsrc, ZN_DTYPE_F32, tr->gcast, tr->gdt,
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
            zn_accum_arg *aa = &tr->accum_args[mb * L + b];
            aa->tr = tr;
            aa->block = b;
            aa->gbuf = g;
            aa->mb = mb;
            aa->rows = rows;
            aa->nrows = nrows;
            if ((rc = zn_dev_launch_host_fn(d, tr->s_d2h, zn_accum_post_fn, aa)))
                return rc;
        }
    consumed:
        if (slot >= 0 && fe[f].last_use == i &&
            (rc = zn_dev_event_record(d, tr->ev_consumed[slot], tr->s_comp)))
            return rc;
        if (atomic_load(&tr->err))
            return atomic_load(&tr->err);
    }
    /* the next micro-batch's fetches whose slots are now spoken for */
    return issue_fetches(tr, fe, nfe, next_fetch, *use, nvme_fetches);
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
static int gather_replicated(zn_trainer *tr)
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
                                  (char *)bl->dev_params + bl->soff * tr->pbytes,
                                  (char *)bl->dev_params + bl->frozen * tr->pbytes, bl->shard,
                                  tr->pdt);
    }
    int r2 = zn_comm_sync_on(tr->comm, tr->s_comm);
    return rc ? rc : r2;
}

static int step_failed(zn_trainer *tr, int rc, int64_t step)
{
    zn_optsched_cancel(tr, true);
    zn_dev_sync(tr->dev);
    zn_accum_drain(tr);
    zn_optsched_wait(tr);
    tr->opt_inflight = false;
    if (tr->tm.aio)
        zn_aio_wait_all(tr->tm.aio);
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

/* The fetch list over `nuse` uses (forward and backward of each micro-batch,
 * or forward only): consecutive uses of one ring block share a fetch, and
 * so do the forward and backward of the last (slots - 2) ring blocks. */
static int build_fetches(zn_trainer *tr, int nuse, int L, bool with_bwd, fetch_ent **fe_out,
                         int **fou_out, int *nfe_out)
{
    fetch_ent *fe = calloc((size_t)nuse, sizeof *fe);
    int *fetch_of_use = malloc((size_t)nuse * sizeof *fetch_of_use);
    int *held = malloc((size_t)L * sizeof *held);
    if (!fe || !fetch_of_use || !held) {
        free(fe);
        free(fetch_of_use);
        free(held);
        return zn_set_error(-ENOMEM, "train: out of memory");
    }
    /* Keep from forward to backward: the last K ring blocks of the model
     * hold their slot from their forward to their backward in the same
     * micro-batch instead of being fetched twice. K = slots - 2 leaves two
     * slots for the ring (its prefetch) while all K are held at the turn;
     * the check below proves every fetch still finds its slot free. */
    int keep = with_bwd ? tr->nslots - 2 : 0;
    for (int b = L - 1; b >= 0; b--) {
        held[b] = -1;
        if (!tr->blocks[b].persistent && keep > 0) {
            held[b] = -2; /* eligible */
            keep--;
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        int nfe = 0, per = with_bwd ? 2 * L : L;
        for (int i = 0; i < nuse; i++) {
            int k = i % per;
            int b = k >= L ? 2 * L - 1 - k : k;
            fetch_of_use[i] = -1;
            if (tr->blocks[b].persistent)
                continue;
            bool merge = nfe && fe[nfe - 1].block == b && fe[nfe - 1].last_use == i - 1;
            if (!merge && pass == 0 && k >= L && held[b] >= 0) {
                fe[held[b]].last_use = i; /* kept since its forward */
                fetch_of_use[i] = held[b];
                held[b] = -2;
                continue;
            }
            if (merge) {
                fe[nfe - 1].last_use = i;
            } else {
                fe[nfe].block = b;
                fe[nfe].first_use = fe[nfe].last_use = i;
                nfe++;
            }
            fetch_of_use[i] = nfe - 1;
            if (pass == 0 && k < L && held[b] == -2)
                held[b] = nfe - 1;
        }
        /* the ring's rule: fetch j reuses fetch (j - slots)'s slot, which
         * must be past its last use when fetch j's first use comes */
        bool ok = true;
        for (int e = tr->nslots; e < nfe && ok; e++)
            ok = fe[e - tr->nslots].last_use < fe[e].first_use;
        *nfe_out = nfe;
        if (ok || pass == 1)
            break;
        for (int b = 0; b < L; b++)
            held[b] = -1; /* no keeping: the plain ring */
        memset(fe, 0, (size_t)nuse * sizeof *fe);
    }
    free(held);
    *fe_out = fe;
    *fou_out = fetch_of_use;
    return 0;
}

int zn_train_step(zn_trainer *tr, const int32_t *ids, const int32_t *targets,
                  const int32_t *pos, zn_train_step_info *info)
{
    if (tr->bad)
        return zn_set_error(ZN_ECORRUPT, "the trainer failed in an earlier step; its state "
                            "is not valid");
    const zn_config *cfg = &tr->cfg;
    int L = tr->L, A = (int)cfg->gradient_accumulation_steps, rc;
    if (A < 1)
        A = 1;
    int64_t B = cfg->train_micro_batch_size_per_gpu, T = cfg->data.seq_len;
    uint64_t ntok = (uint64_t)(B * T);
    uint64_t t_start = zn_now_ns();
    if ((rc = ensure_capacity(tr, A)))
        return rc;
    /* the previous step's optimizer job may still run (pipeline): its
     * failure fails this step */
    if (atomic_load(&tr->err))
        return step_failed(tr, atomic_load(&tr->err), tr->steps_run + 1);
    tr->next_mark = 0;

    bool clip = cfg->gradient_clipping > 0, fp16 = cfg->fp16.enabled;
    double scale = tr->scaler.scale;
    double lr = zn_lr_schedule(&cfg->scheduler, cfg->optimizer.lr, tr->step);
    if (tr->lr_fault)
        lr = tr->lr_fault(tr->lr_fault_user, tr->step + 1, lr);
    zn_adam_params hp = zn_adam_params_default();
    hp.lr = (float)lr;
    hp.beta1 = (float)cfg->optimizer.beta1;
    hp.beta2 = (float)cfg->optimizer.beta2;
    hp.eps = (float)cfg->optimizer.eps;
    hp.weight_decay = (float)cfg->optimizer.weight_decay;
    hp.adamw_mode = cfg->optimizer.type == ZN_OPT_ADAMW || cfg->optimizer.adam_w_mode;
    hp.bias_correction = cfg->optimizer.bias_correction;
    hp.step = tr->step + 1;
    hp.threads = tr->threads;

    for (int u = 0; u < tr->n_units; u++)
        atomic_store(&tr->units[u].pieces_done, 0);
    for (int b = 0; b < L; b++) {
        tr->blocks[b].grad_sq = 0;
        tr->blocks[b].grad_nonfinite = 0;
    }
    tr->overlap_step = !clip && !fp16;
    /* Without clipping or overflow checks each unit steps as soon as its
     * grads are final; otherwise the job starts now too, but only reads
     * optimizer states ahead until the global norm gives the go. */
    int64_t job = zn_optsched_begin(tr, &hp, (float)(1.0 / scale), !tr->overlap_step);

    /* the step's fetch list: consecutive uses of one ring block share a fetch */
    fetch_ent *fe;
    int *fetch_of_use, nfe;
    if ((rc = build_fetches(tr, A * 2 * L, L, true, &fe, &fetch_of_use, &nfe)))
        return step_failed(tr, rc, tr->steps_run + 1);
    int next_fetch = 0, use = 0;
    uint64_t nvme_fetches = 0;
    /* the mean over the targets of the global batch (every micro-batch of
     * every rank; an ignored target, < 0, counts nowhere), as the HF
     * Trainer computes it */
    uint64_t ntgt = 0;
    if ((rc = count_targets(tr, targets, ntok * (uint64_t)A, &ntgt)))
        return step_failed(tr, rc, tr->steps_run + 1);
    float loss_scale = (float)(scale / (double)(ntgt ? ntgt : 1));
    double loss_sum = 0;
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
        if (tr->any_sparse && (rc = stage_rows(tr, mb, ids + (size_t)mb * ntok, (int64_t)ntok)))
            break;
        rc = run_micro_batch(tr, mb, fe, nfe, &next_fetch, &use, fetch_of_use, &nvme_fetches);
        float l = 0;
        if (!rc && !(rc = tr->model->read_loss(tr->model->ctx, tr->s_comp, &l)))
            loss_sum += (double)l;
    }
    free(fe);
    free(fetch_of_use);
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
    if (rc)
        return step_failed(tr, rc, tr->steps_run + 1);

    /* global norm from the blocks' sums, in block order (placement-independent) */
    double sq = 0;
    int nonfinite = 0;
    if ((rc = combine_ranks(tr, &loss_sum, &sq, &nonfinite)))
        return step_failed(tr, rc, tr->steps_run + 1);
    double norm = sqrt(sq) / scale;
    bool overflow = fp16 && (nonfinite || !isfinite(norm));
    if (!tr->overlap_step && !overflow) {
        double coef = 1.0;
        if (clip && norm + 1e-6 > 0) {
            double c = cfg->gradient_clipping / (norm + 1e-6);
            if (c < 1.0)
                coef = c;
        }
        zn_optsched_go(tr, (float)(coef / scale));
    } else if (overflow) {
        zn_optsched_cancel(tr, false);
    } else {
        zn_optsched_all_final(tr);
    }
    if (!overflow)
        tr->pseq_need = job;  /* the next step's uses wait for this job's updates */
    if (tr->pipeline) {
        /* the job finishes under the next step's forward: each use waits
         * only for its own block's parameters (wait_params) */
        tr->opt_inflight = true;
        tr->opt_step = tr->steps_run + 1;
    } else {
        rc = zn_optsched_wait(tr);
        if (!rc)
            rc = zn_dev_stream_sync(tr->dev, tr->s_oh2d);
        if (!rc && !overflow)
            rc = gather_replicated(tr);
        if (!rc && atomic_load(&tr->err))
            rc = atomic_load(&tr->err);
        if (rc)
            return step_failed(tr, rc, tr->steps_run + 1);
    }

    if (fp16 && zn_loss_scaler_update(&tr->scaler, overflow)) {
        tr->bad = true;
        return zn_set_error(ZN_ECONFIG, "step %lld: gradient overflow with the loss scale "
                            "already at fp16.min_loss_scale (%g): training diverged",
                            (long long)tr->steps_run + 1, tr->scaler.min_scale);
    }
    if (!overflow)
        tr->step++;
    tr->steps_run++;
    double secs = (double)(zn_now_ns() - t_start) * 1e-9;
    tr->step_s += secs;
    tr->tokens += ntok * (uint64_t)A * (uint64_t)tr->world;
    tr->flops += tr->model->flops_per_token * (double)(ntok * (uint64_t)A);
    if (info) {
        info->step = tr->steps_run;
        info->loss = loss_sum / scale;
        info->lr = lr;
        info->grad_norm = norm;
        info->loss_scale = scale;
        info->skipped = overflow;
        info->seconds = secs;
        info->tokens = ntok * (uint64_t)A * (uint64_t)tr->world;  /* all ranks */
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
        return step_failed(tr, atomic_load(&tr->err), tr->steps_run);
    const zn_config *cfg = &tr->cfg;
    const zn_train_model *md = tr->model;
    int L = tr->L, rc;
    int64_t B = cfg->train_micro_batch_size_per_gpu, T = cfg->data.seq_len;
    uint64_t ntok = (uint64_t)(B * T);
    if ((rc = ensure_capacity(tr, n_micro)))
        return rc;
    tr->next_mark = 0;
    fetch_ent *fe;
    int *fetch_of_use, nfe;
    if ((rc = build_fetches(tr, n_micro * L, L, false, &fe, &fetch_of_use, &nfe)))
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
            if ((rc = issue_fetches(tr, fe, nfe, &next_fetch, i, &nvme_fetches)))
                break;
            void *params = bl->dev_params;
            int f = fetch_of_use[i];
            int slot = f >= 0 ? f % tr->nslots : -1;
            if (slot >= 0) {
                if ((rc = zn_dev_stream_wait_event(tr->dev, tr->s_comp, tr->ev_ready[slot])))
                    break;
                params = tr->slot[slot];
            } else if ((rc = wait_params(tr, b))) {
                break;
            }
            snprintf(name, sizeof name, "eval b%d", b);
            if (b == bl->gfirst && (rc = ck_before_write(tr, bl->glast + 1)))
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
                (rc = zn_dev_event_record(tr->dev, tr->ev_consumed[slot], tr->s_comp)))
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
        return step_failed(tr, rc, tr->steps_run);
    *loss_sum = sum;
    *n_targets = tgt;
    return 0;
}

int zn_train_sync(zn_trainer *tr)
{
    if (tr->bad)
        return zn_set_error(ZN_ECORRUPT, "the trainer failed in an earlier step; its state "
                            "is not valid");
    if (!tr->opt_inflight)
        return 0;
    uint64_t t0 = zn_now_ns();
    int rc = zn_optsched_wait(tr);
    if (!rc)
        rc = zn_dev_stream_sync(tr->dev, tr->s_oh2d);
    if (!rc && atomic_load(&tr->err))
        rc = atomic_load(&tr->err);
    tr->opt_inflight = false;
    tr->step_s += (double)(zn_now_ns() - t0) * 1e-9;  /* the step's tail */
    if (rc)
        return step_failed(tr, rc, tr->opt_step);
    return 0;
}

/* ---- reading state back ---------------------------------------------------------*/
/* This rank's master weights (local flat space, P floats) into out. */
static int read_local_master(zn_trainer *tr, float *out)
{
    if (tr->dopt) {
        int rc = tr->P ? zn_dev_copy_d2h(tr->dev, tr->s_h2d, out, tr->master, tr->P * 4) : 0;
        return rc ? rc : zn_dev_stream_sync(tr->dev, tr->s_h2d);
    }
    if (tr->oopt != ZN_OFFLOAD_NVME) {
        memcpy(out, tr->master, tr->P * 4);
        return 0;
    }
    zn_opt_slot *s = &tr->oslot[0];
    for (int u = 0; u < tr->n_units; u++) {
        zn_unit *un = &tr->units[u];
        zn_io_req r;
        int rc = zn_ioq_submit(&tr->rq, &r, 0, &zn_tier_get(&tr->tm, un->master_id)->ext,
                               s->master, un->n * 4, "master (read back)");
        int r2 = zn_ioq_wait(&tr->rq, &r);
        if (rc || r2)
            return rc ? rc : r2;
        memcpy(out + un->off, s->master, un->n * 4);
    }
    s->unit = -1;
    return 0;
}

int zn_train_read_master(zn_trainer *tr, float *out, uint64_t n)
{
    if (tr->bad)
        return zn_set_error(ZN_ECORRUPT, "the trainer failed in an earlier step; its weights "
                            "are not valid");
    if (n != tr->P_full)
        return zn_set_error(ZN_EARG, "read_master: %llu elements asked, the model has %llu",
                            (unsigned long long)n, (unsigned long long)tr->P_full);
    int src = zn_train_sync(tr);
    if (src)
        return src;
    if (tr->world == 1)
        return read_local_master(tr, out);
    /* every rank's shards, block by block */
    float *local = malloc(tr->P * 4);
    float *shard = malloc((tr->largest_grad / (uint64_t)tr->world) * 4 + 4);
    float *whole = malloc(tr->largest_grad * 4 + 4);
    int rc = local && shard && whole ? 0 : zn_set_error(-ENOMEM, "train: out of memory");
    if (!rc)
        rc = read_local_master(tr, local);
    uint64_t at = 0;
    for (int b = 0; b < tr->L && !rc; b++) {
        zn_block *bl = &tr->blocks[b];
        memset(shard, 0, bl->shard * 4);
        memcpy(shard, local + bl->off, bl->len * 4);
        if (!bl->shard)
            continue;  /* wholly frozen */
        rc = zn_comm_allgather(tr->comm, shard, whole, bl->shard, ZN_DTYPE_F32);
        if (!rc)
            memcpy(out + at, whole, (bl->n - bl->frozen) * 4);
        at += bl->n - bl->frozen;
    }
    free(local);
    free(shard);
    free(whole);
    return rc;
}

void zn_train_block_share(const zn_trainer *tr, int b, zn_block_share *out)
{
    const zn_block *bl = &tr->blocks[b];
    out->n = bl->n - bl->frozen;
    out->shard_off = bl->soff - bl->frozen;
    out->len = bl->len;
    out->local_off = bl->off;
}

struct zn_comm *zn_train_comm(const zn_trainer *tr)
{
    return tr->comm;
}

int zn_train_rank(const zn_trainer *tr)
{
    return tr->rank;
}

int zn_train_world(const zn_trainer *tr)
{
    return tr->world;
}

uint64_t zn_train_num_params(const zn_trainer *tr)
{
    return tr->P_full;
}

const zn_plan *zn_train_get_plan(const zn_trainer *tr)
{
    return &tr->plan;
}

zn_dev *zn_train_device(zn_trainer *tr)
{
    return tr->dev;
}

zn_aio *zn_train_aio(zn_trainer *tr)
{
    return tr->tm.aio;
}

/* ---- report ------------------------------------------------------------------------*/
void zn_train_get_report(zn_trainer *tr, zn_train_report *r)
{
    memset(r, 0, sizeof *r);
    for (int t = 0; t < ZN_TIER_COUNT; t++)
        r->budget[t] = tr->tm.budget[t], r->plan[t] = tr->plan.tier_total[t];
    zn_tier_usage(&tr->tm, r->used, r->peak);
    r->h2d_bytes = atomic_load(&tr->tm.h2d);
    r->d2h_bytes = atomic_load(&tr->tm.d2h);
    r->nvme_read_bytes = atomic_load(&tr->tm.nvme_read);
    r->nvme_write_bytes = atomic_load(&tr->tm.nvme_write);
    for (int i = 0; i < ZN_RES_COUNT; i++)
        r->busy_s[i] = zn_trace_busy_s(tr->trace, tr->track[i]);
    r->step_s = tr->step_s;
    r->param_wait_s = tr->param_wait_s;
    r->param_cache_hits = atomic_load(&tr->pc_hits);
    r->param_cache_bytes = atomic_load(&tr->pc_bytes);
    r->param_cache_entries = tr->n_pc;
    r->steps = tr->steps_run;
    r->tokens = tr->tokens;
    r->flops = tr->flops;
    r->param_slots = tr->nslots;
    for (int b = 0; b < tr->L; b++)
        r->persistent_blocks += tr->blocks[b].persistent;
    r->opt_unit = tr->U;
    r->opt_units = tr->n_units;
    r->opt_inflight = tr->oopt == ZN_OFFLOAD_NVME ? tr->n_oslots : 1;
    r->overlap_step = tr->overlap_step;
    r->param_dtype = zn_dtype_name(tr->pdt);
    zn_dev_info di;
    zn_dev_get_info(tr->dev, &di);
    static __thread char devname[128];
    snprintf(devname, sizeof devname, "%s", di.name);
    r->backend = devname;
}

void zn_train_reset_counters(zn_trainer *tr)
{
    zn_train_sync(tr);  /* the last step's tail belongs to the steps before */
    tr->param_wait_s = 0;
    atomic_store(&tr->pc_hits, 0);
    atomic_store(&tr->pc_bytes, 0);
    zn_trace_reset_busy(tr->trace);
    atomic_store(&tr->tm.h2d, 0);
    atomic_store(&tr->tm.d2h, 0);
    atomic_store(&tr->tm.nvme_read, 0);
    atomic_store(&tr->tm.nvme_write, 0);
    tr->step_s = 0;
    tr->steps_run = 0;
    tr->tokens = 0;
    tr->flops = 0;
}

void zn_train_print_report(zn_trainer *tr, FILE *f)
{
    zn_train_report r;
    zn_train_get_report(tr, &r);
    char a[32], b[32], c[32];
    char d[32];
    fprintf(f, "tiers            budget           plan     high-water         now\n");
    for (int t = 0; t < ZN_TIER_COUNT; t++) {
        if (!r.budget[t] && !r.peak[t])
            continue;
        fprintf(f, "  %-6s %14s %14s %14s %11s  (%4.1f%% of budget, %5.1f%% of plan at peak)\n",
                zn_tier_name((zn_tier)t), zn_format_size(r.budget[t], a, sizeof a),
                zn_format_size(r.plan[t], d, sizeof d), zn_format_size(r.peak[t], b, sizeof b),
                zn_format_size(r.used[t], c, sizeof c),
                r.budget[t] ? 100.0 * (double)r.peak[t] / (double)r.budget[t] : 0.0,
                r.plan[t] ? 100.0 * (double)r.peak[t] / (double)r.plan[t] : 0.0);
    }
    if (!r.steps) {
        /* the counters hold only the setup's traffic (initial state written
         * home): rates over no step time would be noise */
        fprintf(f, "no steps run (setup wrote %s to nvme, %s to the device)\n",
                zn_format_size(tr->setup_nvme_write, a, sizeof a),
                zn_format_size(tr->setup_h2d, b, sizeof b));
        return;
    }
    double T = r.step_s > 0 ? r.step_s : 1e-9;
    fprintf(f, "links (%lld steps)       moved        GB/s\n", (long long)r.steps);
    struct { const char *n; uint64_t v; } L[] = {
        { "cpu->gpu (h2d)", r.h2d_bytes }, { "gpu->cpu (d2h)", r.d2h_bytes },
        { "nvme->cpu (read)", r.nvme_read_bytes }, { "cpu->nvme (write)", r.nvme_write_bytes },
    };
    for (size_t i = 0; i < sizeof L / sizeof L[0]; i++)
        fprintf(f, "  %-18s %11s %10.2f\n", L[i].n, zn_format_size(L[i].v, a, sizeof a),
                (double)L[i].v / T * 1e-9);
    if (r.nvme_write_bytes) {
        /* SSD wear, measured over the steps since the last reset */
        double per = (double)r.nvme_write_bytes / (double)r.steps;
        fprintf(f, "nvme wear: %s written per step (the plan: %s), %.2f TB/day at this step "
                "time\n", zn_format_size((uint64_t)per, a, sizeof a),
                zn_format_size(tr->plan.nvme_write_step, b, sizeof b),
                (double)r.nvme_write_bytes / T * 86400.0 / 1e12);
    }
    fprintf(f, "step-time breakdown (busy time per resource, summed over the steps)\n");
    int busiest = 0;
    for (int i = 0; i < ZN_RES_COUNT; i++) {
        if (res_counts_for_busiest(i) && r.busy_s[i] > r.busy_s[busiest])
            busiest = i;
        if (i == ZN_RES_COMM && tr->world == 1)
            continue;  /* one rank: no collectives */
        fprintf(f, "  %-18s %9.3f s  %5.1f%% of step time\n", res_names[i], r.busy_s[i],
                100.0 * r.busy_s[i] / T);
    }
    fprintf(f, "  %-18s %9.3f s  (%.3f s per step)\n", "step time", r.step_s,
            r.steps ? r.step_s / (double)r.steps : 0.0);
    if (r.param_wait_s > 0)
        fprintf(f, "  %-18s %9.3f s  (the schedule waited for the previous step's optimizer "
                "to land parameters)\n", "param wait", r.param_wait_s);
    if (r.param_cache_entries)
        fprintf(f, "  %-18s %9llu blocks (%s from the optimizer's pinned copy, not NVMe; "
                "%d buffers)\n", "param cache", (unsigned long long)r.param_cache_hits,
                zn_format_size(r.param_cache_bytes, a, sizeof a), r.param_cache_entries);
    if (r.busy_s[busiest] > 0)
        fprintf(f, "  step time / busiest resource (%s) = %.2f  (1.00 = perfectly overlapped)\n",
                res_names[busiest], r.step_s / r.busy_s[busiest]);
}

int zn_train_write_trace(zn_trainer *tr, const char *path)
{
    return zn_trace_write(tr->trace, path);
}
