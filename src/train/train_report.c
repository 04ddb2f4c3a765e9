/* Reading a trainer's state back (the master, its accessors) and what it
 * reports: counters, the per-tier report, the step-time breakdown, the
 * trace. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"
#include "util/try-impl.h"
#include "zn_build_config.h"

/* The resources a step's time is compared with: NVMe reads and writes
 * share one disk, so their union stands for both. */
static bool res_counts_for_busiest(int r)
{
    return r != ZN_RES_NVME_READ && r != ZN_RES_NVME_WRITE;
}

/* ---- reading state back ---------------------------------------------------------*/
/* This rank's master weights (local flat space, P floats) into out. */
static int read_local_master(zn_trainer *tr, float *out)
{
    if (tr->opt_on_device) {
        /* a bf16 master lands in out's upper half and is widened
         * (exactly) in ascending order: element i's write ends where
         * element i + 1's read starts, or before */
        uint64_t eb = zn_tr_master_elem(tr);
        void *at = (char *)out + tr->P * (4 - eb);
        int rc = tr->P ? zn_dev_copy_d2h(tr->dev, tr->s_h2d, at, tr->master, tr->P * eb) : 0;
        if (!rc)
            rc = zn_dev_stream_sync(tr->dev, tr->s_h2d);
        if (!rc && tr->master_bf16)
            for (uint64_t i = 0; i < tr->P; i++)
                out[i] = zn_bf16_to_f32(((const uint16_t *)at)[i]);
        return rc;
    }
    if (tr->master_bf16 && tr->opt_home != ZN_TIER_NVME)   /* widened: exact */
        return zn_convert(out, ZN_DTYPE_F32, tr->master, ZN_DTYPE_BF16, tr->P);
    if (tr->opt_home != ZN_TIER_NVME) {
        memcpy(out, tr->master, tr->P * 4);
        return 0;
    }
    zn_opt_slot *s = &tr->opt.slot[0];
    for (int u = 0; u < tr->n_units; u++) {
        zn_unit *un = &tr->units[u];
        zn_io_req r;
        int rc = zn_ioq_submit(&tr->rq, &r, 0, &zn_tier_get(&tr->tm, zn_tr_unit_sid(un, 0))->ext,
                               s->master, un->n * zn_tr_master_elem(tr), "master (read back)");
        int r2 = zn_ioq_wait(&tr->rq, &r);
        if (rc || r2)
            return rc ? rc : r2;
        if (tr->master_bf16)
            rc = zn_convert(out + un->off, ZN_DTYPE_F32, s->master, ZN_DTYPE_BF16, un->n);
        else
            memcpy(out + un->off, s->master, un->n * 4);
        if (rc)
            return rc;
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
    r->step_s = tr->stats.step_s;
    r->param_wait_s = tr->stats.param_wait_s;
    r->param_cache_hits = atomic_load(&tr->opt.pcache_hits);
    r->param_cache_bytes = atomic_load(&tr->opt.pcache_bytes);
    r->param_cache_entries = tr->opt.n_pcache;
    r->spec_units = atomic_load(&tr->opt.spec_units);
    r->spec_commits = atomic_load(&tr->opt.spec_commits);
    r->spec_redos = atomic_load(&tr->opt.spec_redos);
    r->spec_cache_fills = atomic_load(&tr->opt.spec_cache_fills);
    r->speculative = tr->plan.spec_shadow > 0;
    r->steps = tr->stats.steps_run;
    r->tokens = tr->stats.tokens;
    r->flops = tr->stats.flops;
    r->param_slots = tr->fetch.n_slots;
    for (int b = 0; b < tr->L; b++)
        r->persistent_blocks += tr->blocks[b].persistent;
    r->opt_unit = tr->U;
    r->opt_units = tr->n_units;
    r->opt_inflight = tr->opt_home == ZN_TIER_NVME ? tr->opt.n_slots : 1;
    r->overlap_step = tr->opt.overlap_step;
    if (tr->opt.started) {
        pthread_mutex_lock(&tr->opt.lock);
        r->opt_job_max_s = tr->opt.job_max_s;
        pthread_mutex_unlock(&tr->opt.lock);
    }
    r->param_dtype = zn_dtype_name(tr->param_dt);
    zn_dev_info di;
    zn_dev_get_info(tr->dev, &di);
    static __thread char devname[128];
    snprintf(devname, sizeof devname, "%s", di.name);
    r->backend = devname;
}

void zn_train_reset_counters(zn_trainer *tr)
{
    zn_train_sync(tr);  /* the last step's tail belongs to the steps before */
    tr->stats.param_wait_s = 0;
    atomic_store(&tr->opt.pcache_hits, 0);
    atomic_store(&tr->opt.pcache_bytes, 0);
    atomic_store(&tr->opt.spec_units, 0);
    atomic_store(&tr->opt.spec_commits, 0);
    atomic_store(&tr->opt.spec_redos, 0);
    atomic_store(&tr->opt.spec_cache_fills, 0);
    zn_trace_reset_busy(tr->trace);
    atomic_store(&tr->tm.h2d, 0);
    atomic_store(&tr->tm.d2h, 0);
    atomic_store(&tr->tm.nvme_read, 0);
    atomic_store(&tr->tm.nvme_write, 0);
    tr->stats.step_s = 0;
    tr->stats.steps_run = 0;
    tr->stats.tokens = 0;
    tr->stats.flops = 0;
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
    if (!r.steps || !(r.step_s > 0)) {
        /* the counters hold only the setup's traffic (initial state written
         * home): rates over no step time would be noise (a resumed run with
         * no step left counts the checkpoint's steps, none of them here) */
        fprintf(f, "no steps run (setup wrote %s to nvme, %s to the device)\n",
                zn_format_size(tr->stats.setup_nvme_write, a, sizeof a),
                zn_format_size(tr->stats.setup_h2d, b, sizeof b));
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
        fprintf(f, "  %-18s %9.3f s  %5.1f%% of step time\n", zn_train_resource_name((zn_train_resource)i), r.busy_s[i],
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
    if (r.speculative)
        fprintf(f, "  %-18s %9llu units (stepped before the global norm; %llu committed as "
                "they were, %llu stepped again for clipping or an overflow; %llu param cache "
                "blocks filled by them)\n", "speculative",
                (unsigned long long)r.spec_units, (unsigned long long)r.spec_commits,
                (unsigned long long)r.spec_redos, (unsigned long long)r.spec_cache_fills);
    if (r.busy_s[busiest] > 0)
        fprintf(f, "  step time / busiest resource (%s) = %.2f  (1.00 = perfectly overlapped)\n",
                zn_train_resource_name((zn_train_resource)busiest), r.step_s / r.busy_s[busiest]);
}

int zn_train_write_trace(zn_trainer *tr, const char *path)
{
    return zn_trace_write(tr->trace, path);
}
