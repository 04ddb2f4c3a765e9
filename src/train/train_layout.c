/* The layout: where each block's pieces (16-bit parameters, master, Adam
 * moments, gradients) live in their home tiers, and the NVMe space they
 * need. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"
#include "util/try-impl.h"
#include "zn_build_config.h"

/* ---- layout --------------------------------------------------------------------*/
/* Elements of a block's frozen part at its home (and in its NVMe extent):
 * all of it, or this rank's shard of it (fshard). */
uint64_t zn_tr_frozen_home(const zn_block *bl)
{
    return bl->fshard ? bl->fshard : bl->frozen;
}

/* The bf16 master's rounding bits are drawn for each element's index among
 * the model's trainable elements (every block's [frozen, n), back to back:
 * the order of a checkpoint's blocks and of `zinc export`), so that a run
 * on any number of ranks, and a resume on another, rounds an element as
 * one rank would. A piece is a run of those indices: its block's trainable
 * elements before this rank's share, plus its place in the share. With one
 * rank the index is the local flat offset (a block's share is all its
 * trainable elements, at `off`). One span per piece, relative to its
 * unit's first element, in the pieces' order. */
static int build_sr_spans(zn_trainer *tr)
{
    tr->sr_spans = calloc((size_t)tr->n_pieces, sizeof *tr->sr_spans);
    uint64_t *first = calloc((size_t)tr->L, sizeof *first);  /* block's first index */
    if (!tr->sr_spans || !first) {
        free(first);
        return zn_set_error(-ENOMEM, "train: out of memory");
    }
    for (int b = 1; b < tr->L; b++)
        first[b] = first[b - 1] + (tr->blocks[b - 1].n - tr->blocks[b - 1].frozen);
    for (int k = 0; k < tr->n_pieces; k++) {
        const zn_piece *p = &tr->pieces[k];
        const zn_block *bl = &tr->blocks[p->block];
        tr->sr_spans[k] = (zn_sr_span){
            .off = p->start - tr->units[p->unit].off,
            .n = p->n,
            .index = first[p->block] + (bl->soff - bl->frozen) + (p->start - bl->off),
        };
    }
    free(first);
    return 0;
}

/* 8-bit moments: the flat blocks holding elements of a tensor that
 * bitsandbytes (fewer than 4096 elements, its min_8bit_size) or torchao
 * (also one that is not whole blocks) keeps in fp32 states; their moments
 * stay fp32 here too. A block that holds such a tensor's elements and
 * another's (only where tensors are not whole blocks) is fp32 whole. */
static int build_f32_runs(zn_trainer *tr)
{
    const zn_train_model *md = tr->model;
    if (tr->mom_fmt != ZN_MOM_Q8 || !md->tensor_parts)
        return 0;
    enum { CAP = 2048 }; /* a block's tensors: a mixture-of-experts layer has 3 per expert */
    uint64_t off[CAP], numel[CAP];
    size_t cap = 0;
    for (int b = 0; b < tr->L; b++) {
        const zn_block *bl = &tr->blocks[b];
        if (!bl->len)
            continue;
        int np = md->tensor_parts(md->ctx, b, off, numel, CAP);
        if (np < 0)
            return np;
        for (int k = 0; k < np; k++) {
            if (!zn_q8_keeps_f32(numel[k], tr->q8_scheme))
                continue;
            uint64_t s0 = off[k], s1 = k + 1 < np ? off[k + 1] : bl->n;
            uint64_t a = s0 > bl->soff ? s0 : bl->soff;
            uint64_t e = s1 < bl->soff + bl->len ? s1 : bl->soff + bl->len;
            if (a >= e)
                continue;
            uint64_t fa = bl->off + (a - bl->soff), fe = fa + (e - a);
            uint64_t b0 = fa / ZN_Q8_BLOCK, b1 = (fe - 1) / ZN_Q8_BLOCK + 1;
            zn_q8_f32_run *last = tr->n_f32_runs ? &tr->f32_runs[tr->n_f32_runs - 1] : NULL;
            if (last && b0 <= last->block + last->n) {
                if (b1 > last->block + last->n)
                    last->n = b1 - last->block;
                continue;
            }
            if (tr->n_f32_runs == cap) {
                cap = cap ? 2 * cap : 64;
                zn_q8_f32_run *r = realloc(tr->f32_runs, cap * sizeof *r);
                if (!r)
                    return zn_set_error(-ENOMEM, "train: out of memory");
                tr->f32_runs = r;
            }
            tr->f32_runs[tr->n_f32_runs++] = (zn_q8_f32_run){ b0, b1 - b0, 0 };
        }
    }
    for (size_t r = 0; r < tr->n_f32_runs; r++) {
        tr->f32_runs[r].slot = tr->f32_slots;
        tr->f32_slots += tr->f32_runs[r].n;
    }
    return 0;
}

int zn_tr_build_layout(zn_trainer *tr)
{
    const zn_spec *sp = &tr->spec;
    const zn_train_model *md = tr->model;
    tr->L = md->n_blocks;
    tr->blocks = calloc((size_t)tr->L, sizeof *tr->blocks);
    if (!tr->blocks)
        return zn_set_error(-ENOMEM, "train: out of memory");
    uint64_t off = 0, in_cpu = 0, full = 0;
    uint64_t thresh = (uint64_t)sp->persistence_threshold;
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
        bool repl = tr->world == 1 || sp->zero_stage < 3;
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
         * offloaded: parameters off the GPU need stage 3) */
        bl->replicated = repl;
        if (bl->npad > tr->largest_block)
            tr->largest_block = bl->npad;
        if (bl->len > tr->largest_local)
            tr->largest_local = bl->len;
        /* a block other blocks read (a tied embedding) stays on the device */
        bool small = tr->param_home == ZN_TIER_GPU || bl->n < thresh ||
                     (bl->group == 0 && md->keep_block0);
        if (bl->group == 0 && md->keep_block0 && !bl->replicated)
            return zn_set_error(ZN_EUNSUPPORTED, "%s: tied embeddings (tie_word_embeddings) with "
                                "ZeRO stage 3 across %d ranks are not supported yet: the "
                                "embedding must stay whole on every device; use "
                                "%s 2 (or one rank)",
                                sp->source, tr->world, sp->key.zero_stage);
        if (small) {
            bl->home = ZN_PHOME_DEVICE;
        } else if (tr->param_home == ZN_TIER_CPU) {
            bl->home = ZN_PHOME_CPU;
        } else if (in_cpu + (bl->replicated ? bl->n : bl->len) <=
                   (uint64_t)sp->param_max_in_cpu) {
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
    /* Adam's moments (train.optim): fp32, bf16 or 8-bit in every home (the
     * cpu tier, units swapped in from NVMe at their compressed size, or the
     * device's Adam, zn_dev_adam_mom) */
    int mb = sp->moment_bytes;
    tr->mom_elem = mb;
    tr->mom_fmt = mb == 1 ? ZN_MOM_Q8 : mb == 2 ? ZN_MOM_BF16 : ZN_MOM_F32;
    tr->q8_scheme = sp->q8_scheme;
    tr->mom_bytes = zn_mom_layout_bytes(tr->mom_fmt, tr->P);
    int rc_f32 = build_f32_runs(tr);
    if (rc_f32)
        return rc_f32;
    /* the fp32 blocks' moments after the layout (in memory homes) */
    tr->mom_bytes += tr->f32_slots * ZN_Q8_BLOCK * 4;
    /* train.master_weights: the bf16 master is stepped in pinned RAM, in
     * units swapped from NVMe at 2 bytes per element, or on the device
     * (zn_dev_adam_sr). Each step draws its rounding bits for the model's
     * trainable elements (tr->sr_spans, below), whoever owns them, so it
     * runs on any number of ranks */
    tr->master_bf16 = sp->master_bf16_sr;
    /* 8-bit blocks never straddle two units (the NVMe units below are
     * multiples of 1024 elements, or this rounded sub-group); bf16 units
     * are rounded alike, so that on NVMe every unit's moments but the
     * last's end on a 64-byte boundary: a checkpoint stream is the units'
     * elements back to back, without the padding each extent has */
    if (tr->mom_fmt != ZN_MOM_F32 && sg < tr->P)
        sg = (sg + ZN_Q8_BLOCK - 1) / ZN_Q8_BLOCK * ZN_Q8_BLOCK;
    tr->U = sg;
    tr->opt.n_slots = 1;
    if (tr->opt_home == ZN_TIER_NVME) {
        int64_t bc = sp->opt_buffers;
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
        tr->opt.n_slots = S;
        /* The unit stays the fp32 one whatever the moments' format: the
         * staging and the I/O shrink with them, the geometry does not. */
        tr->slot_mom_bytes = tr->mom_fmt == ZN_MOM_F32
                                 ? U * 4 : zn_tr_round_up(zn_tr_unit_mom_bytes(tr, U), 4096);
    }
    if (tr->mom_fmt != ZN_MOM_F32 && tr->U < tr->P && tr->U % ZN_Q8_BLOCK)
        return zn_set_error(ZN_EINTERNAL, "train: optimizer units of %llu elements with %s "
                            "moments (not whole blocks of %d)", (unsigned long long)tr->U,
                            zn_mom_fmt_name(tr->mom_fmt), ZN_Q8_BLOCK);
    tr->n_units = (int)((tr->P + tr->U - 1) / tr->U);
    tr->units = calloc((size_t)tr->n_units, sizeof *tr->units);
    if (!tr->units)
        return zn_set_error(-ENOMEM, "train: out of memory");
    for (int u = 0; u < tr->n_units; u++) {
        tr->units[u].off = (uint64_t)u * tr->U;
        tr->units[u].n = tr->U;
        if (tr->units[u].off + tr->U > tr->P)
            tr->units[u].n = tr->P - tr->units[u].off;
        for (int c = 0; c < 2; c++)
            for (int k = 0; k < 3; k++)
                tr->units[u].sid[c][k] = -1;
        tr->units[u].cur = 0;
        tr->units[u].tr = tr;
    }
    /* Pieces: blocks x units, in flat order. */
    int cap = tr->L + tr->n_units;
    tr->pieces = calloc((size_t)cap, sizeof *tr->pieces);
    if (!tr->pieces)
        return zn_set_error(-ENOMEM, "train: out of memory");
    int b = 0, u = 0, n = 0, rc_sr;
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
    if (tr->master_bf16 && (rc_sr = build_sr_spans(tr)))
        return rc_sr;
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
uint64_t zn_tr_nvme_bytes_needed(zn_trainer *tr)
{
    uint64_t bs = (uint64_t)tr->spec.aio.block_size, need = 0;
    if (tr->opt_home == ZN_TIER_NVME)
        for (int u = 0; u < tr->n_units; u++)
            need += (tr->plan.spec_shadow ? 2 : 1) *
                    (zn_tr_round_up(tr->units[u].n * zn_tr_master_elem(tr), bs) +
                     2 * zn_tr_round_up(zn_tr_unit_mom_bytes(tr, tr->units[u].n), bs));
    if (tr->grads_on_nvme)
        for (int k = 0; k < tr->n_pieces; k++)
            if (tr->pieces[k].gram_off < 0)
                need += zn_tr_round_up(tr->pieces[k].n * 4, bs);
    for (int k = 0; k < tr->n_pieces; k++)
        if (tr->blocks[tr->pieces[k].block].home == ZN_PHOME_NVME)
            need += zn_tr_round_up(tr->pieces[k].n * tr->param_bytes, bs);
    for (int b = 0; b < tr->L; b++)
        if (tr->blocks[b].home == ZN_PHOME_NVME && tr->blocks[b].frozen)
            need += zn_tr_round_up(zn_tr_frozen_home(&tr->blocks[b]) * tr->param_bytes, bs);
    if (need)
        need += 2 * bs * (uint64_t)(tr->spec.stripe_paths > 0 ? tr->spec.stripe_paths : 1);
    return need;
}
