/* Allocation and the plan: every allocation of every tier made once, from
 * the list the dry run (the same code, allocating nothing) itemizes as the
 * plan; zn_train_plan. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"
#include "util/try-impl.h"
#include "zn_build_config.h"

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
            bytes = zn_tr_round_up(bytes, ZN_DEV_ALIGN);
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
        plan_item(tr, ZN_TIER_NVME, cls, zn_tr_round_up(bytes, 4096), name);
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
uint64_t zn_tr_piece_stage_off(const zn_block *bl, const zn_piece *p)
{
    return (bl->replicated ? bl->soff : bl->fshard) + (p->start - bl->off);
}

/* The updated master is itself the working parameters' dtype (a bf16 master
 * with bf16 params, an fp32 one with fp32 params): no staging to convert. */
static bool master_is_params(const zn_trainer *tr)
{
    return tr->master_bf16 ? tr->param_dt == ZN_DTYPE_BF16 : tr->param_dt == ZN_DTYPE_F32;
}

/* The model's scratch first: the activation size may depend on the dtype. */
static int alloc_scratch(zn_trainer *tr, size_t *act_out)
{
    int rc = 0;
    zn_tier gpu = ZN_TIER_GPU;
    size_t act = tr->model->act_bytes;
    if (tr->dry) {
        uint64_t outside = zn_tr_gpu_outside(tr);
        uint64_t libs = zn_tr_streams_outside(tr);
        tr->plan.gpu_outside = outside;
        tr->plan.gpu_outside_nccl = outside > libs ? outside - libs : 0;
        if (outside) {
            tr->dry_gpu += outside;
            plan_item(tr, gpu, ZN_STATE_WORK, libs,
                      "cuBLAS handles, workspaces, scratch (outside the arena)");
            if (tr->plan.gpu_outside_nccl)
                plan_item(tr, gpu, ZN_STATE_WORK, tr->plan.gpu_outside_nccl,
                          "NCCL buffers (outside the arena)");
        }
        uint64_t ws = 0;
        if (tr->model->plan_prepare) {
            ZN_TRY_GOTO(tr->model->plan_prepare(tr->model->ctx, tr->param_dt, &ws, &act));
            if (ws) {
                tr->dry_gpu += ws;
                plan_item(tr, gpu, ZN_STATE_WORK, ws, "model workspace");
            }
        }
    } else if (tr->model->prepare) {
        ZN_TRY_GOTO(tr->model->prepare(tr->model->ctx, tr->dev, tr->s_comp, tr->param_dt));
        act = tr->model->act_bytes;
    }
    *act_out = act;
    return 0;
fail:
    return rc;
}

/* The device's working set: resident params, activations and their
 * checkpoints, block gradients, the sparse rows' buffers. */
static int alloc_device(zn_trainer *tr, size_t act)
{
    int rc = 0;
    char name[64];
    const zn_spec *sp = &tr->spec;
    zn_tier gpu = ZN_TIER_GPU, cpu = ZN_TIER_CPU;
    /* device: resident params, activations, grads, batch */
    for (int b = 0; b < tr->L; b++) {
        zn_block *bl = &tr->blocks[b];
        snprintf(name, sizeof name, "params b%d", b);
        if (bl->home == ZN_PHOME_DEVICE)
            ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_PARAMS, home_elems(bl) * tr->param_bytes, name,
                          &bl->dev_params));
    }
    tr->ckpt = calloc((size_t)tr->L, sizeof *tr->ckpt);
    tr->act.host = calloc((size_t)tr->L, sizeof *tr->act.host);
    tr->act.ordinal = calloc((size_t)tr->L, sizeof *tr->act.ordinal);
    if (!tr->ckpt || !tr->act.host || !tr->act.ordinal)
        return zn_set_error(-ENOMEM, "train: out of memory");
    tr->act.bytes = act;
    if (tr->act.on)
        for (int i = 0; i < ZN_CK_RING; i++) {
            snprintf(name, sizeof name, "activation ckpt ring %d", i);
            ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, act, name, &tr->act.ring[i]));
            tr->act.res[i] = -1;
        }
    for (int b = 1, k = 0; b < tr->L; b++) {
        if (tr->blocks[b].gfirst != b)
            continue; /* a further part of a layer reads its first part's input */
        snprintf(name, sizeof name, "activation ckpt b%d", b);
        tr->act.ordinal[b] = k;
        if (tr->act.on) {
            ZN_TRY_GOTO(alloc_ptr(tr, ZN_TIER_CPU, ZN_STATE_ACT_CKPT, act, name, &tr->act.host[b]));
            tr->ckpt[b] = tr->act.ring[k % ZN_CK_RING];
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
    int64_t A = sp->accumulation > 0 ? sp->accumulation : 1;
    int64_t ntok = sp->plan.micro_batch * sp->plan.seq_len;
    uint64_t cast_elems = tr->grad_dt != ZN_DTYPE_F32 ? tr->largest_local : 0;
    tr->any_sparse = false;
    for (int b = 0; b < tr->L; b++) {
        zn_block *bl = &tr->blocks[b];
        bl->srow0 = -1;
        if (md->block_sparse_row0 && md->block_sparse_row0[b] >= 0 && md->row_width > 0 &&
            tr->world == 1 && !tr->grads_on_nvme && !tr->opt_on_device && !bl->frozen && bl->len == bl->n &&
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
        ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, cast_elems * zn_dtype_size(tr->grad_dt),
                      "block grads (transfer)", &tr->gcast));
    if (tr->any_sparse) {
        tr->fetch.rows_cap = A * ntok;
        ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, (uint64_t)tr->fetch.rows_cap * 4, "token rows",
                      (void **)&tr->fetch.rows_dev));
        /* pinned: an upload from pageable memory would wait for the D2H
         * stream's earlier work (CUDA stages it synchronously) */
        ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, (uint64_t)tr->fetch.rows_cap * 4, "token rows (host)",
                      (void **)&tr->fetch.rows));
        if (!tr->dry && !(tr->fetch.n_rows = calloc((size_t)A, sizeof *tr->fetch.n_rows)))
            return zn_set_error(-ENOMEM, "train: out of memory");
    }

    return 0;
fail:
    return rc;
}

/* The optimizer states where they live in memory (device or pinned RAM),
 * their staging, and the fp32 blocks of 8-bit moments on NVMe. */
static int alloc_optimizer(zn_trainer *tr)
{
    int rc = 0;
    zn_tier gpu = ZN_TIER_GPU, cpu = ZN_TIER_CPU;
    /* optimizer states in memory */
    if (tr->opt_home != ZN_TIER_NVME) {
        zn_tier t = tr->opt_home == ZN_TIER_GPU ? gpu : cpu;
        ZN_TRY_GOTO(alloc_ptr(tr, t, ZN_STATE_MASTER, tr->P * zn_tr_master_elem(tr),
                              tr->master_bf16 ? "master (bf16, stochastic rounding)"
                                              : "master (fp32)", (void **)&tr->master));
        /* (compressed moments: the codes or halves, then the blocks' absmax) */
        ZN_TRY_GOTO(alloc_ptr(tr, t, ZN_STATE_ADAM_M, tr->mom_bytes, "adam m", (void **)&tr->mom));
        ZN_TRY_GOTO(alloc_ptr(tr, t, ZN_STATE_ADAM_V, tr->mom_bytes, "adam v", (void **)&tr->var));
        /* (8-bit: the fp32 blocks' moments after the layout) */
        if (tr->f32_slots && !tr->dry) {
            uint64_t at = zn_mom_layout_bytes(tr->mom_fmt, tr->P);
            tr->m32 = (float *)(void *)((char *)tr->mom + at);
            tr->v32 = (float *)(void *)((char *)tr->var + at);
        }
        ZN_TRY_GOTO(alloc_ptr(tr, t, ZN_STATE_GRADS, tr->P * 4, "grads (fp32)", (void **)&tr->grad_acc));
        bool off_dev = false;  /* a trainable block homed off the device */
        for (int b = 0; b < tr->L; b++)
            off_dev |= tr->blocks[b].len > 0 && tr->blocks[b].home != ZN_PHOME_DEVICE;
        /* the updated params in their dtype, where the master's differs: a
         * bf16 master is the bf16 working copy itself (no staging), and
         * is widened here for fp32 params (the host backend) */
        bool master_is_param = master_is_params(tr);
        if (!tr->opt_on_device && !master_is_param)
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->U * tr->param_bytes, "param update staging",
                          &tr->opt.pout_flat));
        if (tr->opt_on_device && off_dev) {
            /* (a bf16 master goes out as it is to bf16 params) */
            if (!master_is_param)
                ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, tr->U * tr->param_bytes,
                              "param update staging (device)", &tr->pdev));
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->U * tr->param_bytes, "param update staging",
                          &tr->opt.pout_flat));
        }
        if (tr->opt_on_device) {
            /* each block's chunk sums of squares, on the device and pinned */
            uint64_t nc = 0;
            for (int b = 0; b < tr->L; b++) {
                tr->blocks[b].nc_off = (int64_t)nc;
                nc += (tr->blocks[b].len + ZN_GRAD_NORM_CHUNK - 1) / ZN_GRAD_NORM_CHUNK;
            }
            ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, nc * 8 + 8, "grad norm chunks",
                          (void **)&tr->normc_dev));
            /* the 8-bit moments' fp32 blocks, for the kernel */
            if (tr->n_f32_runs)
                ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK,
                                      (uint64_t)tr->n_f32_runs * sizeof *tr->f32_runs,
                                      "8-bit moments' fp32 blocks",
                                      (void **)&tr->f32_runs_dev));
            /* the bf16 master's rounding indices, for zn_dev_adam_sr */
            if (tr->master_bf16)
                ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK,
                                      (uint64_t)tr->n_pieces * sizeof *tr->sr_spans,
                                      "bf16 master's rounding indices",
                                      (void **)&tr->sr_spans_dev));
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, nc * 8 + 8, "grad norm chunks (host)",
                          (void **)&tr->normc));
            /* states in and out of the device (initial master, checkpoints,
             * read-back): up to 16 MiB at a time */
            uint64_t sb = tr->P * 4 < (16u << 20) ? tr->P * 4 : (16u << 20);
            tr->ostage_bytes = (sb + 4095) / 4096 * 4096;
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->ostage_bytes, "optimizer state staging",
                          &tr->ostage));
        }
    } else if (!tr->grads_on_nvme) {
        /* states on NVMe, gradients in pinned RAM (tiers.grads) */
        ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_GRADS, tr->P * 4, "grads (fp32)", (void **)&tr->grad_acc));
    }

    /* 8-bit moments on NVMe: the fp32 blocks' moments stay in pinned RAM
     * (a few KiB per small tensor), never swapped */
    if (tr->opt_home == ZN_TIER_NVME && tr->f32_slots) {
        uint64_t fb = tr->f32_slots * ZN_Q8_BLOCK * 4;
        ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_ADAM_M, fb, "adam m (fp32 blocks)",
                              (void **)&tr->m32));
        ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_ADAM_V, fb, "adam v (fp32 blocks)",
                              (void **)&tr->v32));
        if (tr->plan.spec_shadow)
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, 2 * fb,
                                  "adam m, v (fp32 blocks, speculated units' first copy)",
                                  (void **)&tr->mv32_first));
    }

    return 0;
fail:
    return rc;
}

/* Pinned RAM: params homed on the CPU, gradient and parameter staging, the
 * stream flags, the param cache and the NVMe optimizer's slots. */
static int alloc_pinned(zn_trainer *tr)
{
    int rc = 0;
    char name[64];
    const zn_spec *sp = &tr->spec;
    zn_tier cpu = ZN_TIER_CPU;
    /* pinned: params homed on the CPU, staging */
    for (int b = 0; b < tr->L; b++) {
        zn_block *bl = &tr->blocks[b];
        snprintf(name, sizeof name, "params b%d", b);
        if (bl->home == ZN_PHOME_CPU)
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_PARAMS, home_elems(bl) * tr->param_bytes, name,
                          &bl->cpu_params));
    }
    for (int i = 0; i < 2; i++)
        ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->largest_local * 4, "grad staging",
                      (void **)&tr->gstage[i]));
    /* the flags the H2D and D2H streams wait on (train-impl.h) */
    ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, ZN_SFLAG_BYTES, "stream flags",
                          (void **)&tr->sflags));
    if (!tr->dry)
        memset(tr->sflags, 0, ZN_SFLAG_BYTES);
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
        int64_t bc = sp->param_buffers;
        tr->fetch.n_stage = (int)(bc < 2 ? 2 : bc > 64 ? 64 : bc);
        for (int i = 0; i < tr->fetch.n_stage; i++)
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, largest_nvme * tr->param_bytes, "param staging",
                          &tr->fetch.stage[i]));
    }
    /* the param cache: only where the step is pipelined (a replicated block
     * on several ranks gets the other ranks' parts later, by all-gather) */
    uint64_t largest_pc = 0;
    bool pipelined = tr->world == 1 || sp->zero_stage >= 3;
    for (int b = 0; b < tr->L; b++) {
        zn_block *bl = &tr->blocks[b];
        /* (a frozen base is never updated: nothing of it to cache) */
        bl->pc_ok = pipelined && bl->home == ZN_PHOME_NVME && !bl->frozen &&
                    (tr->world == 1 || !bl->replicated);
        uint64_t fetched = bl->replicated ? bl->n : bl->len;
        if (bl->pc_ok && fetched > largest_pc)
            largest_pc = fetched;
    }
    if (largest_pc && sp->param_cache > 0 && tr->dry) {
        for (int e = 0; e < sp->param_cache; e++)
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, largest_pc * tr->param_bytes, "param cache",
                          (void **)&(void *){ NULL }));
    } else if (largest_pc && sp->param_cache > 0) {
        tr->opt.pcache = calloc((size_t)sp->param_cache, sizeof *tr->opt.pcache);
        if (!tr->opt.pcache)
            return zn_set_error(-ENOMEM, "train: out of memory");
        tr->opt.n_pcache = sp->param_cache;
        for (int e = 0; e < tr->opt.n_pcache; e++) {
            tr->opt.pcache[e].tr = tr;
            tr->opt.pcache[e].block = -1;
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, largest_pc * tr->param_bytes, "param cache",
                          &tr->opt.pcache[e].buf));
        }
    } else {
        for (int b = 0; b < tr->L; b++)
            tr->blocks[b].pc_ok = false;
    }
    if (tr->opt_home == ZN_TIER_NVME) {
        for (int s = 0; s < tr->opt.n_slots; s++) {
            zn_opt_slot *sl = &tr->opt.slot[s];
            void *buf;
            /* master | m | v | grad: the moments at their own size */
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->U * 8 + 2 * tr->slot_mom_bytes,
                                  "optimizer staging", &buf));
            if (!tr->dry) {
                sl->master = buf;
                sl->m = sl->master + tr->U;
                sl->v = (char *)sl->m + tr->slot_mom_bytes;
                sl->grad = (float *)((char *)sl->v + tr->slot_mom_bytes);
            }
            /* (the master area stays U x 4: a bf16 master uses half of it,
             * and a checkpoint load converts fp32 masters in it) */
            bool master_is_param = master_is_params(tr);
            if (!master_is_param)
                ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->U * tr->param_bytes,
                              "param update staging", &sl->pout));
        }
        if (tr->grads_on_nvme && (sp->accumulation > 1 || tr->grad_dt != ZN_DTYPE_F32))
            ZN_TRY_GOTO(alloc_ptr(tr, cpu, ZN_STATE_WORK, tr->largest_local * 4, "grad readback",
                          (void **)&tr->gtmp));
    }

    return 0;
fail:
    return rc;
}

static int alloc_grads_in_ram(zn_trainer *tr)
{
    int rc = 0;
    const zn_spec *sp = &tr->spec;
    zn_tier cpu = ZN_TIER_CPU;
    int64_t A = sp->accumulation > 0 ? sp->accumulation : 1;
    /* Gradient accumulators on NVMe with tiers.grads auto: the pinned room
     * left after everything above (all but 5% of it) keeps as many pieces
     * as fit in RAM, which saves their write and read-back every
     * micro-batch. Computed from the allocations themselves, so the dry
     * run and the run choose the same pieces. */
    for (int k = 0; k < tr->n_pieces; k++)
        tr->pieces[k].gram_off = -1;
    tr->gram_elems = 0;
    if (tr->grads_on_nvme && sp->grads == ZN_GRADS_AUTO) {
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

    return 0;
fail:
    return rc;
}

/* The NVMe extents: per optimizer unit, per gradient and parameter piece,
 * and each frozen part. */
static int alloc_nvme(zn_trainer *tr)
{
    int rc = 0;
    char name[64];
    const zn_spec *sp = &tr->spec;
    uint64_t need = zn_tr_nvme_bytes_needed(tr);
    if (need) {
        uint64_t bytes = need < tr->tm.budget[ZN_TIER_NVME] ? need : tr->tm.budget[ZN_TIER_NVME];
        if (!tr->dry)
            ZN_TRY_GOTO(zn_tier_open_nvme(&tr->tm, sp, bytes, tr->fault_hook, tr->fault_user));
        if (tr->opt_home == ZN_TIER_NVME) {
            for (int u = 0; u < tr->n_units; u++) {
                zn_unit *un = &tr->units[u];
                /* the unit's moments at their compressed size, 8-bit
                 * absmax included (zn_tr_unit_mom_bytes); with the
                 * speculative step a second copy of all three (nvme work) */
                uint64_t mb = zn_tr_unit_mom_bytes(tr, un->n);
                uint64_t by[3] = { un->n * zn_tr_master_elem(tr), mb, mb };
                static const char *const what[3] = { "master", "adam m", "adam v" };
                static const zn_state_class cls[3] = { ZN_STATE_MASTER, ZN_STATE_ADAM_M,
                                                       ZN_STATE_ADAM_V };
                for (int c = 0; c < (tr->plan.spec_shadow ? 2 : 1); c++)
                    for (int k = 0; k < 3; k++) {
                        snprintf(name, sizeof name, "%s u%d%s", what[k], u,
                                 c ? " (second copy)" : "");
                        ZN_TRY_GOTO(alloc_ext(tr, c ? ZN_STATE_WORK : cls[k], by[k], name,
                                              &un->sid[c][k]));
                    }
                if (!tr->plan.spec_shadow)
                    memcpy(un->sid[1], un->sid[0], sizeof un->sid[0]);
                un->cur = 0;
            }
            for (int k = 0; k < tr->n_pieces && tr->grads_on_nvme; k++) {
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
            ZN_TRY_GOTO(alloc_ext(tr, ZN_STATE_PARAMS, p->n * tr->param_bytes, name, &p->param_id));
        }
        for (int b = 0; b < tr->L; b++) {
            zn_block *bl = &tr->blocks[b];
            if (bl->home != ZN_PHOME_NVME || !bl->frozen)
                continue;
            snprintf(name, sizeof name, "frozen params b%d", b);
            ZN_TRY_GOTO(alloc_ext(tr, ZN_STATE_PARAMS, zn_tr_frozen_home(bl) * tr->param_bytes, name,
                          &bl->frozen_id));
        }
    }

    return 0;
fail:
    return rc;
}

/* The ring of device parameter slots, last: it takes what is left. */
static int alloc_param_ring(zn_trainer *tr)
{
    int rc = 0;
    char name[64];
    zn_tier gpu = ZN_TIER_GPU;
    if (tr->largest_ring_block) {
        uint64_t slot_bytes = zn_tr_round_up(tr->largest_ring_block * tr->param_bytes, ZN_DEV_ALIGN);
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
                                "tiers.gpu%s or lower %s",
                                zn_format_size(slot_bytes, b1, sizeof b1),
                                zn_format_size(dm.largest_free, b2, sizeof b2),
                                tr->act.on ? "" : ", set activation_checkpointing."
                                "cpu_checkpointing=true (the layers' checkpoints to pinned RAM)",
                                tr->spec.key.micro_batch);
        }
        tr->fetch.n_slots = (int)want;
        if (tr->dry) {
            for (int s = 0; s < tr->fetch.n_slots; s++)
                ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, tr->largest_ring_block * tr->param_bytes,
                              "param slot", (void **)&(void *){ NULL }));
            return 0;
        }
        tr->fetch.slot = calloc((size_t)tr->fetch.n_slots, sizeof *tr->fetch.slot);
        tr->fetch.slot_block = calloc((size_t)tr->fetch.n_slots, sizeof *tr->fetch.slot_block);
        if (!tr->fetch.slot || !tr->fetch.slot_block)
            return zn_set_error(-ENOMEM, "train: out of memory");
        for (int s = 0; s < tr->fetch.n_slots; s++) {
            snprintf(name, sizeof name, "param slot %d", s);
            ZN_TRY_GOTO(alloc_ptr(tr, gpu, ZN_STATE_WORK, tr->largest_ring_block * tr->param_bytes, name,
                          &tr->fetch.slot[s]));
            tr->fetch.slot_block[s] = -1;
        }
    }
    return 0;
fail:
    return rc;
}

int zn_tr_allocate(zn_trainer *tr)
{
    size_t act;
    ZN_TRY(alloc_scratch(tr, &act));
    ZN_TRY(alloc_device(tr, act));
    ZN_TRY(alloc_optimizer(tr));
    ZN_TRY(alloc_pinned(tr));
    ZN_TRY(alloc_grads_in_ram(tr));
    ZN_TRY(alloc_nvme(tr));
    return alloc_param_ring(tr);
}

int zn_tr_dry_plan(zn_plan *out, const zn_train_options *o, const zn_spec *sp, int world,
                   int rank)
{
    const zn_plan_input *in = &sp->plan;
    int rc = zn_plan_compute(out, sp);
    if (rc && rc != ZN_ENOFIT)
        return rc;
    zn_trainer *tr = calloc(1, sizeof *tr);
    if (!tr)
        return zn_set_error(-ENOMEM, "train: out of memory");
    tr->dry = true;
    tr->spec = *sp;
    tr->model = o->model;
    tr->plan = *out;
    tr->plan.n_items = 0;
    tr->world = world > 0 ? world : 1;
    tr->rank = rank;
    tr->param_home = sp->param_home;
    tr->opt_home = sp->opt_home;
    tr->param_dt = in->param_bytes == 2 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    tr->param_bytes = zn_dtype_size(tr->param_dt);
    tr->plan_cuda = in->cuda;
    for (int i = 0; i < ZN_TIER_COUNT; i++)
        tr->tm.budget[i] = sp->budgets.bytes[i];
    tr->grads_on_nvme = tr->opt_home == ZN_TIER_NVME && tr->plan.grads_tier == ZN_TIER_NVME;
    tr->opt_on_device = tr->opt_home == ZN_TIER_GPU;
    tr->grad_dt = tr->opt_on_device ? ZN_DTYPE_F32 : zn_tr_grad_transfer_dtype(sp, tr->param_dt);
    tr->act.on = sp->cpu_activations;
    rc = zn_tr_build_layout(tr);
    if (!rc)
        rc = zn_tr_allocate(tr);
    if (!rc)
        rc = zn_tr_count_traffic(tr);
    if (!rc) {
        char why[sizeof out->why];
        *out = tr->plan;
        rc = zn_plan_use_items(out, sp);
        snprintf(why, sizeof why, "%s", out->why);
        if (rc == ZN_ENOFIT)
            zn_set_error(rc, "%s", why);
    }
    free(tr->blocks);
    free(tr->units);
    free(tr->pieces);
    free(tr->sr_spans);
    free(tr->f32_runs);
    free(tr->ckpt);
    free(tr->act.host);
    free(tr->act.ordinal);
    free(tr);
    return rc;
}

/* The device arena for a plan: its gpu total and 1 MiB for the arena's
 * start alignment, never beyond the budget. */
/* The streams a run makes on its device: the device's default, compute,
 * h2d, d2h and the optimizer's h2d; the activations' with cpu
 * checkpointing; the communicator's with several ranks. */
/* The trainer's CUDA streams outside the arena: the device's default
 * stream and compute run GEMMs (a cuBLAS handle and workspace each); h2d,
 * d2h, opt-h2d, the activations' stream and the communicator's are copy
 * streams (their scratch only). */
uint64_t zn_tr_streams_outside(const zn_trainer *tr)
{
    int copies = 3 + (tr->act.on ? 1 : 0) + (tr->world > 1 ? 1 : 0);
    return 2 * zn_dev_stream_outside_bytes(0, 0) +
           (uint64_t)copies * zn_dev_stream_outside_bytes(0, 1);
}

/* NCCL's buffers for one rank, planned: a ring's two peers x 16 channels x
 * the three protocols' buffers (NCCL_BUFFSIZE's 4 MiB for Simple, about
 * 4.5 MiB for LL128, 0.5 MiB for LL). What the communicator really took is
 * measured when the arena is reserved and printed beside this. */
#define ZN_NCCL_PLANNED_BYTES ((uint64_t)2 * 16 * (9u << 20))

uint64_t zn_tr_gpu_outside(const zn_trainer *tr)
{
    if (!tr->plan_cuda)
        return 0;  /* the host backend: nothing outside its arena */
    return zn_tr_streams_outside(tr) +
           (tr->world > 1 ? ZN_NCCL_PLANNED_BYTES : 0);
}

/* The device arena: the plan's GPU total less what lives outside the arena,
 * plus the arena's own alignment slack. */
uint64_t zn_tr_arena_bytes(const zn_plan *p, uint64_t budget)
{
    uint64_t want = p->tier_total[ZN_TIER_GPU] - p->gpu_outside + ((uint64_t)1 << 20);
    return want < budget ? want : budget;
}

int zn_train_plan(zn_plan *plan, const zn_train_options *o, int world)
{
    if (!o || !o->spec || !o->model || o->model->n_blocks < 1 || !o->model->block_params)
        return zn_set_error(ZN_EARG, "train plan: incomplete options (spec, model)");
    zn_spec sp = *o->spec;
    sp.plan.world_size = world > 0 ? world : 1;
    return zn_tr_dry_plan(plan, o, &sp, sp.plan.world_size, 0);
}
