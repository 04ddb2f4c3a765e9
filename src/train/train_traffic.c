/* One optimizer step's traffic, counted from the layout with the rules the
 * schedule follows (train_step.c, train_fetch.c, accum.c, sched_optim.c,
 * train_actoff.c): what crosses the host link each way, what the NVMe
 * queues read and write, the host memory the gradient accumulation
 * touches, and the elements the optimizer steps. The dry plan fills
 * plan.step with it (zinc/cost.h turns it into time); a test compares it
 * with a run's counters (tests/test_cost.c).
 *
 * Two terms depend on the run rather than the layout and are expected
 * values: the distinct token rows of a row-sparse embedding gradient
 * (uniform ids) and the param cache's hits (the first forward's fetches of
 * NVMe-homed blocks, up to the cache's entries). */
#include <math.h>
#include <stdlib.h>

#include "train/train-impl.h"

/* Expected distinct rows among `tok` draws from `rows` (uniform). */
static uint64_t expected_rows(uint64_t rows, uint64_t tok)
{
    if (!rows)
        return 0;
    double r = (double)rows;
    return (uint64_t)llround(r * -expm1((double)tok * log1p(-1.0 / r)));
}

static uint64_t block_param_bytes(const zn_trainer *tr, const zn_block *bl)
{
    uint64_t e = 0;
    for (int k = 0; k < bl->np; k++)
        e += tr->pieces[bl->p0 + k].n;
    if (bl->frozen)
        e += zn_tr_frozen_home(bl);
    return e * tr->param_bytes;
}

int zn_tr_count_traffic(zn_trainer *tr)
{
    const zn_spec *sp = &tr->spec;
    int L = tr->L, A = (int)(sp->accumulation > 0 ? sp->accumulation : 1);
    uint64_t ntok = (uint64_t)(sp->plan.micro_batch * sp->plan.seq_len);
    __typeof__(tr->plan.step) *s = &tr->plan.step;
    memset(s, 0, sizeof *s);
    s->micro_batches = A;
    s->opt_on_device = tr->opt_on_device;
    s->opt_on_nvme = tr->opt_home == ZN_TIER_NVME;
    /* the optimizer under the backward: without clipping or fp16, or with
     * the speculative step (the NVMe states' second copy), for the steps
     * that do not clip (one that clips steps its speculated units again
     * after the norm) */
    s->overlap_step = (!(sp->clip > 0) && !sp->fp16) ||
                      (tr->opt_home == ZN_TIER_NVME && tr->plan.spec_shadow);
    s->pipelined = tr->world == 1 || sp->zero_stage >= 3;
    const uint64_t pb = (uint64_t)tr->param_bytes, gb = zn_dtype_size(tr->grad_dt);

    /* parameter fetches: the step's fetch list */
    zn_fetch_ent *fe = NULL;
    int *fou = NULL, nfe = 0;
    int rc = zn_tr_build_fetches(tr, A * 2 * L, L, true, &fe, &fou, &nfe);
    if (rc)
        return rc;
    uint32_t cache_left = (uint32_t)(tr->opt.n_pcache > 0 ? tr->opt.n_pcache : 0);
    for (int j = 0; j < nfe; j++) {
        const zn_block *bl = &tr->blocks[fe[j].block];
        bool gather = !bl->replicated, split = bl->fshard > 0;
        s->fetches++;
        if (bl->home == ZN_PHOME_DEVICE) {
            s->gather_bytes += bl->npad * pb;
            continue;
        }
        s->h2d += (split ? bl->fshard + bl->shard : gather ? bl->len : bl->n) * pb;
        if (gather)
            s->gather_bytes += bl->npad * pb;
        if (bl->home != ZN_PHOME_NVME)
            continue;
        /* the first forward's fetches find the optimizer's pinned copy */
        if (bl->pc_ok && cache_left && fe[j].first_use < L) {
            cache_left--;
            s->cache_fetches++;
            continue;
        }
        s->nvme_fetches++;
        s->nvme_read += block_param_bytes(tr, bl);
        if (fe[j].first_use < L)
            s->chain_read += block_param_bytes(tr, bl);
    }
    free(fe);
    free(fou);

    /* activation checkpoints in pinned RAM: every layer boundary saved in
     * the forward; the backward loads all but the ring's last residents */
    if (tr->act.on) {
        uint64_t k = 0;
        for (int b = 1; b < L; b++)
            k += tr->blocks[b].gfirst == b;
        uint64_t loads = k > ZN_CK_RING ? k - ZN_CK_RING : 0;
        s->d2h += (uint64_t)A * k * tr->act.bytes;
        s->h2d += (uint64_t)A * loads * tr->act.bytes;
    }

    /* gradients: each micro-batch's block gradients to the host and into
     * the fp32 accumulators (or summed on the device) */
    for (int b = 0; b < L; b++) {
        const zn_block *bl = &tr->blocks[b];
        if (!bl->len)
            continue;
        if (tr->world > 1)
            s->reduce_bytes += (uint64_t)A * bl->gpad * 4;
        if (tr->opt_on_device) {
            s->d2h += (bl->len + ZN_GRAD_NORM_CHUNK - 1) / ZN_GRAD_NORM_CHUNK * 8;
            /* zn_tr_accum_on_device: the first micro-batch copies (read,
             * write), each later one adds (two reads, a write), and the
             * last's sums are read once more for the norm */
            s->dev_accum_bytes += bl->len * 4 * (2 + 3 * (uint64_t)(A - 1) + 1);
            continue;
        }
        uint64_t n = bl->len;
        if (bl->srow0 >= 0 && tr->model->row_width > 0) {
            uint64_t W = (uint64_t)tr->model->row_width;
            n = expected_rows(bl->len / W, ntok) * W;
        }
        s->d2h += (uint64_t)A * n * gb;
        /* the first micro-batch writes the sums, each later one reads the
         * staged gradients and the sums and writes the sums */
        s->accum_bytes += n * (gb + 4) + (uint64_t)(A - 1) * n * (gb + 8);
        if (tr->grads_on_nvme) {
            for (int k = 0; k < bl->np; k++) {
                const zn_piece *p = &tr->pieces[bl->p0 + k];
                if (p->gram_off >= 0)
                    continue;
                s->nvme_write += (uint64_t)A * p->n * 4;
                s->nvme_read += (uint64_t)(A - 1) * p->n * 4;
                s->nvme_read += p->n * 4;  /* the optimizer's read */
                s->chain_read += p->n * 4;
            }
        }
    }

    /* the optimizer: every element this rank owns; its states through the
     * NVMe slots; the updated parameters to each block's home */
    s->master_sr = tr->spec.master_bf16_sr;
    for (int u = 0; u < tr->n_units; u++) {
        const zn_unit *un = &tr->units[u];
        s->adam_params += un->n;
        if (s->opt_on_nvme) {
            /* m and v too (past the first step), at their own size */
            uint64_t st = un->n * zn_tr_master_elem(tr) + 2 * zn_tr_unit_mom_bytes(tr, un->n);
            s->nvme_read += st;
            s->nvme_write += st;
            s->chain_read += st;
            s->chain_write += st;
        }
        for (int k = 0; k < un->np; k++) {
            const zn_piece *p = &tr->pieces[un->p0 + k];
            const zn_block *bl = &tr->blocks[p->block];
            if (bl->home == ZN_PHOME_DEVICE && !tr->opt_on_device)
                s->h2d += p->n * pb;
            else if (bl->home != ZN_PHOME_DEVICE && tr->opt_on_device)
                s->d2h += p->n * pb;
            if (bl->home == ZN_PHOME_NVME)
                s->nvme_write += p->n * pb, s->chain_write += p->n * pb;
        }
    }
    return 0;
}
