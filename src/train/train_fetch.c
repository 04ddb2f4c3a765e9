/* The fetch schedule: parameters fetched ahead of use into the ring of
 * device slots (NVMe -> pinned staging -> H2D, or pinned -> H2D), waits
 * for the optimizer's updates to land, an untied embedding's rows staged,
 * gradients accumulated on the device. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"
#include "util/try-impl.h"
#include "zn_build_config.h"

/* ---- the step ------------------------------------------------------------------*/
/* Whether the previous step's optimizer job has landed its updates of block
 * b's parameters at their homes (every unit holding a piece of b). */
static bool params_landed(zn_trainer *tr, int b)
{
    zn_block *bl = &tr->blocks[b];
    for (int k = 0; k < bl->np; k++)
        if (atomic_load(&tr->units[tr->pieces[bl->p0 + k].unit].pdone) < tr->opt.land_need)
            return false;
    return true;
}

/* opt.land_lock held: block b may be fetched: its update landed at home, or sits
 * whole in the param cache. */
static bool params_ready_locked(zn_trainer *tr, int b)
{
    return params_landed(tr, b) ||
           (tr->blocks[b].pc_ok && zn_pcache_ready_locked(tr, b, tr->opt.land_need));
}

static bool params_ready(zn_trainer *tr, int b)
{
    if (params_landed(tr, b))
        return true;
    if (!tr->blocks[b].pc_ok)
        return false;
    pthread_mutex_lock(&tr->opt.land_lock);
    bool r = zn_pcache_ready_locked(tr, b, tr->opt.land_need);
    pthread_mutex_unlock(&tr->opt.land_lock);
    return r;
}

/* Waits until block b's parameters are ready (or, with `landed`, landed at
 * home); the optimizer thread, the NVMe queue and the optimizer's H2D
 * stream get there without this thread's help. */
static int wait_for(zn_trainer *tr, int b, bool landed)
{
    if (landed ? params_landed(tr, b) : params_ready(tr, b))
        return 0;
    if (zn_dev_in_host_fn())
        return zn_set_error(ZN_EINTERNAL, "waiting for block %d's parameters inside a device "
                            "host function: it would stall every stream", b);
    uint64_t t0 = zn_now_ns();
    pthread_mutex_lock(&tr->opt.land_lock);
    while (!(landed ? params_landed(tr, b) : params_ready_locked(tr, b)) &&
           !atomic_load(&tr->err))
        pthread_cond_wait(&tr->opt.land_cv, &tr->opt.land_lock);
    pthread_mutex_unlock(&tr->opt.land_lock);
    tr->stats.param_wait_s += (double)(zn_now_ns() - t0) * 1e-9;
    return atomic_load(&tr->err);
}

int zn_tr_wait_params(zn_trainer *tr, int b)
{
    return wait_for(tr, b, false);
}

static int wait_landed(zn_trainer *tr, int b)
{
    return wait_for(tr, b, true);
}

/* On the NVMe queue's thread, as each read of a fetch completes: the last
 * one raises the staging buffer's flag, which the H2D stream waits for
 * before its copy. A failed read fails the step and still raises it (the
 * stream must not wait forever; the step reports the failure). */
static void pstage_read_done(zn_io_req *r)
{
    zn_pread_arg *a = r->on_done_arg;
    zn_trainer *tr = a->tr;
    if (r->status)
        zn_train_fail(tr, r->status, "fetching params of block %d: NVMe read of %s failed: %s",
                      a->block, r->what, r->msg[0] ? r->msg : zn_strerror(r->status));
    if (atomic_fetch_sub(&tr->fetch.stage_left[a->t], 1) == 1)
        __atomic_store_n(zn_tr_pstage_flag(tr, a->t), a->seq, __ATOMIC_RELEASE);
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
    size_t bytes = (split ? bl->fshard + bl->shard : gather ? bl->len : bl->n) * tr->param_bytes;
    const size_t pb = tr->param_bytes;
    char *sl = tr->fetch.slot[slot];
    /* where the home's copy lands: the whole block at 0, the rank's shard
     * at its place for an in-place gather; split: the frozen shard at its
     * place, the trainable shard past both gathers' reach (train-impl.h) */
    char *dst = sl + (split ? bl->foff * pb : gather ? bl->soff * pb : 0);
    char *tdst = sl + (bl->npad - bl->shard) * pb;
    char name[ZN_TRACE_NAME_LEN];
    int rc;
    if (bl->home == ZN_PHOME_DEVICE) {
        /* sharded on the device: gather from the home shard into the slot */
        if ((rc = zn_dev_stream_wait_event(d, tr->s_comm, tr->fetch.ev_consumed[slot])))
            return rc;
        snprintf(name, sizeof name, "gather b%d", block);
        zn_mark *mk = zn_train_mark_begin(tr, tr->s_comm, ZN_RES_COMM, name);
        if (split && ((rc = zn_comm_allgather_on(tr->comm, tr->s_comm, bl->dev_params, sl,
                                                 bl->fshard, tr->param_dt)) ||
                      (bl->shard && (rc = zn_comm_allgather_on(tr->comm, tr->s_comm,
                                                 (char *)bl->dev_params + bl->fshard * pb,
                                                 sl + bl->frozen * pb, bl->shard, tr->param_dt)))))
            return rc;
        if (!split && (rc = zn_comm_allgather_on(tr->comm, tr->s_comm, bl->dev_params, sl,
                                                 bl->shard, tr->param_dt)))
            return rc;
        zn_train_mark_end(tr, tr->s_comm, mk);
        if ((rc = zn_dev_event_record(d, tr->fetch.ev_ready[slot], tr->s_comm)))
            return rc;
        tr->fetch.slot_block[slot] = block;
        return 0;
    }
    if ((rc = zn_dev_stream_wait_event(d, tr->s_h2d, tr->fetch.ev_consumed[slot])))
        return rc;
    const void *src = bl->cpu_params;
    int t = -1, pc = -1;
    if (bl->home == ZN_PHOME_NVME && bl->pc_ok &&
        (pc = zn_pcache_take(tr, block, tr->opt.land_need)) >= 0) {
        /* the optimizer's pinned copy of the update: no NVMe read */
        src = tr->opt.pcache[pc].buf;
        atomic_fetch_add(&tr->opt.pcache_hits, 1);
        atomic_fetch_add(&tr->opt.pcache_bytes, bytes);
    } else if (bl->home == ZN_PHOME_NVME) {
        /* the cache entry that made the block ready may have been evicted
         * since: read it only once its write landed */
        if ((rc = wait_landed(tr, block)))
            return rc;
        t = (int)(*nvme_fetches % (uint64_t)tr->fetch.n_stage);
        (*nvme_fetches)++;
        /* the staging buffer's previous copy must be done before it is refilled */
        if ((rc = zn_dev_event_sync(d, tr->fetch.ev_stage_free[t])))
            return rc;
        int nr = bl->np + (bl->frozen ? 1 : 0);
        zn_pread_arg *a = &tr->fetch.stage_arg[t];
        a->tr = tr;
        a->t = t;
        a->block = block;
        a->np = nr;
        a->seq = ++tr->fetch.stage_seq[t];
        atomic_store(&tr->fetch.stage_left[t], nr);
        snprintf(name, sizeof name, "params b%d", block);
        for (int k = 0; k < nr; k++) {
            zn_io_req *r = &tr->fetch.stage_req[t * tr->max_block_pieces + k];
            if (k < bl->np) {
                zn_piece *p = &tr->pieces[bl->p0 + k];
                rc = zn_ioq_submit_cb(&tr->rq, r, 0, &zn_tier_get(&tr->tm, p->param_id)->ext,
                                      (char *)tr->fetch.stage[t] +
                                          zn_tr_piece_stage_off(bl, p) * tr->param_bytes,
                                      p->n * tr->param_bytes, name, pstage_read_done, a);
            } else {
                rc = zn_ioq_submit_cb(&tr->rq, r, 0, &zn_tier_get(&tr->tm, bl->frozen_id)->ext,
                                      tr->fetch.stage[t], zn_tr_frozen_home(bl) * tr->param_bytes, name,
                                      pstage_read_done, a);
            }
            if (rc) {
                for (int j = 0; j <= k; j++)
                    zn_ioq_wait(&tr->rq, &tr->fetch.stage_req[t * tr->max_block_pieces + j]);
                return zn_ioq_wait(&tr->rq, r);
            }
        }
        /* the copy below waits in stream order for the reads: no host
         * function waits, so other streams' host functions go on */
        if ((rc = zn_dev_stream_wait_value(d, tr->s_h2d, zn_tr_pstage_flag(tr, t), a->seq)))
            return rc;
        src = tr->fetch.stage[t];
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
    if (t >= 0 && (rc = zn_dev_event_record(d, tr->fetch.ev_stage_free[t], tr->s_h2d)))
        return rc;
    if (pc >= 0 && (rc = zn_dev_launch_host_fn(d, tr->s_h2d, zn_pcache_release_fn, &tr->opt.pcache[pc])))
        return rc;
    if (gather) {
        if ((rc = zn_dev_event_record(d, tr->fetch.ev_shard[slot], tr->s_h2d)) ||
            (rc = zn_dev_stream_wait_event(d, tr->s_comm, tr->fetch.ev_shard[slot])))
            return rc;
        snprintf(name, sizeof name, "gather b%d", block);
        zn_mark *m2 = zn_train_mark_begin(tr, tr->s_comm, ZN_RES_COMM, name);
        if (split && ((rc = zn_comm_allgather_on(tr->comm, tr->s_comm, dst, sl, bl->fshard,
                                                 tr->param_dt)) ||
                      (bl->shard && (rc = zn_comm_allgather_on(tr->comm, tr->s_comm, tdst,
                                                               sl + bl->frozen * pb, bl->shard,
                                                               tr->param_dt)))))
            return rc;
        if (!split && (rc = zn_comm_allgather_on(tr->comm, tr->s_comm, dst, sl, bl->shard,
                                                 tr->param_dt)))
            return rc;
        zn_train_mark_end(tr, tr->s_comm, m2);
        if ((rc = zn_dev_event_record(d, tr->fetch.ev_ready[slot], tr->s_comm)))
            return rc;
    } else if ((rc = zn_dev_event_record(d, tr->fetch.ev_ready[slot], tr->s_h2d))) {
        return rc;
    }
    tr->fetch.slot_block[slot] = block;
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
int zn_tr_stage_rows(zn_trainer *tr, int mb, const int32_t *ids, int64_t ntok)
{
    if ((int64_t)(mb + 1) * ntok > tr->fetch.rows_cap)
        return zn_set_error(ZN_EINTERNAL, "train: token rows for micro-batch %d beyond %lld",
                            mb, (long long)tr->fetch.rows_cap);
    int32_t *u = tr->fetch.rows + (size_t)mb * (size_t)ntok;
    memcpy(u, ids, (size_t)ntok * 4);
    qsort(u, (size_t)ntok, 4, cmp_i32);
    int64_t n = 0;
    for (int64_t i = 0; i < ntok; i++)
        if (!n || u[i] != u[n - 1])
            u[n++] = u[i];
    tr->fetch.n_rows[mb] = n;
    return n ? zn_dev_copy_h2d(tr->dev, tr->s_d2h, tr->fetch.rows_dev + (size_t)mb * (size_t)ntok, u,
                               (size_t)n * 4)
             : 0;
}

/* First index of sorted u[0..n) with u[i] >= x. */
int64_t zn_tr_lower_bound_i32(const int32_t *u, int64_t n, int64_t x)
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

int zn_tr_ensure_capacity(zn_trainer *tr, int A)
{
    int need_args = A * tr->L;
    if (tr->fetch.n_accum_args < need_args) {
        free(tr->fetch.accum_args);
        tr->fetch.accum_args = calloc((size_t)need_args, sizeof *tr->fetch.accum_args);
        if (!tr->fetch.accum_args)
            return zn_set_error(-ENOMEM, "train: out of memory");
        tr->fetch.n_accum_args = need_args;
    }
    int need_marks = A * tr->L * 8 + 16; /* up to 8 per block use (cpu checkpoints: 2) */
    if (tr->fetch.n_marks < need_marks) {
        /* grown, the events made so far kept; the new ones are made on use */
        zn_mark *m = realloc(tr->fetch.marks, (size_t)need_marks * sizeof *m);
        if (!m)
            return zn_set_error(-ENOMEM, "train: out of memory");
        memset(m + tr->fetch.n_marks, 0, (size_t)(need_marks - tr->fetch.n_marks) * sizeof *m);
        tr->fetch.marks = m;
        tr->fetch.n_marks = need_marks;
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
int zn_tr_issue_fetches(zn_trainer *tr, const zn_fetch_ent *fe, int nfe, int *next_fetch,
                         int next_use, uint64_t *nvme_fetches)
{
    while (*next_fetch < nfe &&
           (*next_fetch < tr->fetch.n_slots || fe[*next_fetch - tr->fetch.n_slots].last_use < next_use)) {
        int j = *next_fetch, rc;
        if (!params_ready(tr, fe[j].block)) {
            if (tr->world == 1 && fe[j].first_use > next_use)
                break;
            if ((rc = zn_tr_wait_params(tr, fe[j].block)))
                return rc;
        }
        (*next_fetch)++;
        if ((rc = fetch(tr, fe[j].block, j % tr->fetch.n_slots, nvme_fetches)))
            return rc;
    }
    return 0;
}

/* The optimizer on the device: block b's reduced gradients (gsrc) are
 * summed into its accumulators on the D2H stream, which then frees gdev[g];
 * after the last micro-batch their sums of squares by chunk go to pinned
 * memory and the accumulation worker turns them into the block's norm and
 * releases its units to the optimizer. No gradient leaves the device. */
int zn_tr_accum_on_device(zn_trainer *tr, int mb, int b, int g, const float *gsrc)
{
    zn_dev *d = tr->dev;
    zn_block *bl = &tr->blocks[b];
    float *sum = tr->grad_acc + bl->off;
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
    int A = (int)tr->spec.accumulation;
    if (mb == (A > 1 ? A - 1 : 0)) {
        uint64_t nc = ((uint64_t)n + ZN_GRAD_NORM_CHUNK - 1) / ZN_GRAD_NORM_CHUNK;
        if (nc && ((rc = zn_dev_norm_sq_chunks(d, tr->s_d2h, sum, n,
                                               tr->normc_dev + bl->nc_off)) ||
                   (rc = zn_dev_copy_d2h(d, tr->s_d2h, tr->normc + bl->nc_off,
                                         tr->normc_dev + bl->nc_off, nc * 8))))
            return rc;
        atomic_fetch_add(&tr->tm.d2h, nc * 8);
        zn_accum_arg *aa = &tr->fetch.accum_args[mb * tr->L + b];
        aa->tr = tr;
        aa->block = b;
        aa->gbuf = g;
        aa->mb = mb;
        aa->rows = NULL;
        aa->nrows = -1;
        if ((rc = zn_dev_launch_host_fn(d, tr->s_d2h, zn_accum_post_fn, aa)))
            return rc;
        tr->acc.posted[g]++;  /* the job the D2H stream waits on before refilling g */
    }
    zn_train_mark_end(tr, tr->s_d2h, mk);
    return 0;
}

/* The fetch list over `nuse` uses (forward and backward of each micro-batch,
 * or forward only): consecutive uses of one ring block share a fetch, and
 * so do the forward and backward of the last (slots - 2) ring blocks. */
int zn_tr_build_fetches(zn_trainer *tr, int nuse, int L, bool with_bwd, zn_fetch_ent **fe_out,
                         int **fou_out, int *nfe_out)
{
    zn_fetch_ent *fe = calloc((size_t)nuse, sizeof *fe);
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
    int keep = with_bwd ? tr->fetch.n_slots - 2 : 0;
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
        for (int e = tr->fetch.n_slots; e < nfe && ok; e++)
            ok = fe[e - tr->fetch.n_slots].last_use < fe[e].first_use;
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
