/* Initialisation: the model's initial values (its init function or the
 * loaded weights) written to their home tiers in chunks, the master and
 * the 16-bit copy from one source, the optimizer states zeroed. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"
#include "util/try-impl.h"
#include "zn_build_config.h"

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
    zn_opt_slot *s = &tr->opt.slot[iu->slot];
    /* the master goes home; m = v = 0 stay unwritten (mv_zero) */
    int rc = zn_ioq_submit(&tr->wq, &s->wr[0], 1, &zn_tier_get(&tr->tm, zn_tr_unit_sid(un, 0))->ext,
                           s->master, un->n * zn_tr_master_elem(tr), "initial optimizer state");
    atomic_store(&un->mv_zero, true);
    s->unit = iu->unit;
    iu->unit++;
    iu->slot = (iu->slot + 1) % tr->opt.n_slots;
    iu->filled = 0;
    return rc;
}

/* Waits for slot k's writes (if any) and marks what they saved valid. */
static int init_unit_wait(zn_trainer *tr, int k)
{
    zn_opt_slot *s = &tr->opt.slot[k];
    int rc = 0;
    for (int i = 0; i < 3; i++) {
        int r2 = zn_ioq_wait(&tr->wq, &s->wr[i]);
        if (!rc)
            rc = r2;
    }
    if (!rc && s->unit >= 0)
        zn_tier_set_valid(&tr->tm, zn_tr_unit_sid(&tr->units[s->unit], 0), ZN_TIER_NVME, true);
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
        if (tr->master_bf16) {
            /* bf16 master: the values are bf16 already (rounded above) */
            uint16_t *m16 = (uint16_t *)(void *)tr->opt.slot[iu->slot].master;
            if ((rc = zn_convert(m16 + iu->filled, ZN_DTYPE_BF16, v, ZN_DTYPE_F32, k)))
                return rc;
        } else {
            memcpy(tr->opt.slot[iu->slot].master + iu->filled, v, k * 4);
        }
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
        int r2 = zn_ioq_wait(&tr->wq, &tr->fetch.stage_req[t * tr->max_block_pieces + k]);
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
int zn_tr_initialise(zn_trainer *tr)
{
    int rc = 0;
    const zn_train_model *md = tr->model;
    float *vals = tr->gstage[0];
    void *conv = tr->gstage[1];  /* largest_local x 4 >= chunk x param bytes */
    const uint64_t chunk = tr->largest_local < INIT_CHUNK ? tr->largest_local : INIT_CHUNK;
    int np_pending[64] = { 0 };
    int nvme_blocks = 0;
    init_units iu = { tr, 0, 0, 0 };
    bool opt_nvme = tr->opt_home == ZN_TIER_NVME;
    if (!vals || !conv || !chunk) {
        rc = zn_set_error(ZN_EINTERNAL, "train: no staging for the initial state");
        goto out;
    }
    for (int s = 0; s < 16; s++)
        tr->opt.slot[s].unit = -1;
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
            t = nvme_blocks++ % tr->fetch.n_stage;
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
            if (tr->master_bf16 && rg[g].train) {
                /* the bf16 master is the parameters: the trainable ones
                 * start as its values (round to nearest), in every home;
                 * a replicated block's other shards too (stages 1/2 on
                 * several ranks), which their owners round alike, so that
                 * every rank's first forward sees the same weights */
                uint64_t a = x > bl->frozen ? x : bl->frozen;
                uint64_t e = x + c < bl->n ? x + c : bl->n;
                for (uint64_t i = a; i < e; i++)
                    vals[i - x] = zn_bf16_to_f32(zn_f32_to_bf16(vals[i - x]));
            }
            /* the working copy at its home */
            if (bl->home == ZN_PHOME_DEVICE) {
                if ((rc = zn_convert(conv, tr->param_dt, vals, ZN_DTYPE_F32, c)) ||
                    (rc = zn_dev_copy_h2d(tr->dev, tr->s_h2d,
                                          (char *)bl->dev_params + ho * tr->param_bytes, conv,
                                          c * tr->param_bytes)) ||
                    (rc = zn_dev_stream_sync(tr->dev, tr->s_h2d)))
                    goto out;
            } else if (bl->home == ZN_PHOME_CPU) {
                if ((rc = zn_convert((char *)bl->cpu_params + ho * tr->param_bytes, tr->param_dt, vals,
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
                (rc = zn_convert((char *)tr->fetch.stage[t] + ho * tr->param_bytes, tr->param_dt, vals,
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
                (rc = zn_convert((char *)tr->fetch.stage[t] + (ho + (a - x)) * tr->param_bytes, tr->param_dt,
                                 vals + (a - x), ZN_DTYPE_F32, e - a)))
                goto out;
            if (tr->opt_on_device) {
                /* a bf16 master goes up as bf16 (conv holds c elements of
                 * the params' dtype, 2 bytes or more each) */
                uint64_t eb = zn_tr_master_elem(tr), at = bl->off + (a - bl->soff);
                const void *up = vals + (a - x);
                if (tr->master_bf16 &&
                    (rc = zn_convert(conv, ZN_DTYPE_BF16, vals + (a - x), ZN_DTYPE_F32, e - a)))
                    goto out;
                if (tr->master_bf16)
                    up = conv;
                if ((rc = zn_dev_copy_h2d(tr->dev, tr->s_h2d, (char *)tr->master + at * eb, up,
                                          (e - a) * eb)) ||
                    (rc = zn_dev_stream_sync(tr->dev, tr->s_h2d)))
                    goto out;
            } else if (!opt_nvme && tr->master_bf16) {
                if ((rc = zn_convert(zn_tr_master16(tr) + bl->off + (a - bl->soff),
                                     ZN_DTYPE_BF16, vals + (a - x), ZN_DTYPE_F32, e - a)))
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
                rc = zn_ioq_submit(&tr->wq, &tr->fetch.stage_req[t * tr->max_block_pieces + k], 1,
                                   &zn_tier_get(&tr->tm, p->param_id)->ext,
                                   (char *)tr->fetch.stage[t] + zn_tr_piece_stage_off(bl, p) * tr->param_bytes,
                                   p->n * tr->param_bytes, "initial params");
                np_pending[t] = k + 1;
            }
            if (bl->frozen && !rc) {
                /* the only write the frozen base ever gets */
                rc = zn_ioq_submit(&tr->wq, &tr->fetch.stage_req[t * tr->max_block_pieces + bl->np],
                                   1, &zn_tier_get(&tr->tm, bl->frozen_id)->ext, tr->fetch.stage[t],
                                   zn_tr_frozen_home(bl) * tr->param_bytes, "initial frozen params");
                np_pending[t] = bl->np + 1;
                if (!rc)
                    zn_tier_set_valid(&tr->tm, bl->frozen_id, ZN_TIER_NVME, true);
            }
        }
    }
    if (!rc && opt_nvme && iu.unit != tr->n_units)
        rc = zn_set_error(ZN_EINTERNAL, "train: initial state filled %d of %d optimizer units",
                          iu.unit, tr->n_units);
    if (!rc && tr->opt_on_device) {
        /* (the moments at their own size: fp32, bf16 or 8-bit) */
        void *z[3] = { tr->mom, tr->var, tr->grad_acc };
        uint64_t zb[3] = { tr->mom_bytes, tr->mom_bytes, tr->P * 4 };
        for (int k = 0; k < 3 && !rc; k++)
            rc = tr->P ? zn_dev_memset(tr->dev, tr->s_h2d, z[k], 0, zb[k]) : 0;
        if (!rc && tr->master_bf16)
            rc = zn_dev_copy_h2d(tr->dev, tr->s_h2d, tr->sr_spans_dev, tr->sr_spans,
                                 (uint64_t)tr->n_pieces * sizeof *tr->sr_spans);
        if (!rc && tr->n_f32_runs)
            rc = zn_dev_copy_h2d(tr->dev, tr->s_h2d, tr->f32_runs_dev, tr->f32_runs,
                                 (uint64_t)tr->n_f32_runs * sizeof *tr->f32_runs);
        if (!rc)
            rc = zn_dev_stream_sync(tr->dev, tr->s_h2d);
    } else if (!opt_nvme) {
        memset(tr->mom, 0, tr->mom_bytes);   /* zeros: m = v = 0 in every format */
        memset(tr->var, 0, tr->mom_bytes);
        memset(tr->grad_acc, 0, tr->P * 4);
    } else if (tr->f32_slots) {
        /* the fp32 blocks' moments beside the NVMe units */
        memset(tr->m32, 0, tr->f32_slots * ZN_Q8_BLOCK * 4);
        memset(tr->v32, 0, tr->f32_slots * ZN_Q8_BLOCK * 4);
    }
out:
    /* every write issued is waited for, also after a failure: its buffer
     * is freed with the trainer */
    for (int t = 0; t < tr->fetch.n_stage && t < 64; t++) {
        int r2 = init_pstage_wait(tr, t, np_pending);
        if (!rc)
            rc = r2;
    }
    if (opt_nvme)
        for (int s = 0; s < tr->opt.n_slots; s++) {
            int r2 = init_unit_wait(tr, s);
            if (!rc)
                rc = r2;
        }
    for (int s = 0; s < 16; s++)
        tr->opt.slot[s].unit = -1;
    return rc;
}
