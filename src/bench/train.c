/* zinc bench train's measuring half: a few training steps after a warm-up,
 * the counters of the measured steps, the busiest resource's busy time in
 * them and the step time against it (the overlap efficiency: 1.00 means
 * the step takes exactly as long as its slowest resource); and the cost
 * model's prediction of the same plan, made as zinc train makes it. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/bench.h"
#include "zinc/run.h"
#include "zinc/train.h"

int zn_bench_train_steps(zn_run *ts, long warmup, long steps, zn_bench_train_result *out)
{
    memset(out, 0, sizeof *out);
    out->loss_first = out->loss_last = NAN;
    int rc = 0;
    for (long s = 0; s < warmup + steps && !rc; s++) {
        zn_train_step_info info;
        if ((rc = zn_run_step(ts, (uint64_t)s, &info)))
            break;
        out->wrong += !isfinite(info.loss) || !isfinite(info.grad_norm);
        if (s == 0)
            out->loss_first = info.loss;
        out->loss_last = info.loss;
        if (s + 1 == warmup && !(rc = zn_train_sync(ts->tr)))
            zn_train_reset_counters(ts->tr);
    }
    /* the last step's pipelined optimizer tail counts as step time */
    if (!rc)
        rc = zn_train_sync(ts->tr);
    if (rc)
        return rc;
    /* the counters of the measured steps, before the check below reads
     * the master back (from NVMe, when it lives there) */
    zn_train_report *r = &out->report;
    zn_train_get_report(ts->tr, r);
    uint64_t n = zn_train_num_params(ts->tr);
    float *w = malloc(n * sizeof *w);
    if (w && !zn_train_read_master(ts->tr, w, n))
        for (uint64_t i = 0; i < n; i++)
            out->wrong += !isfinite(w[i]);
    else
        out->wrong++;
    free(w);
    int busiest = 0;
    /* one disk's reads and writes are one resource: their union (ZN_RES_NVME)
     * stands for both */
    for (int i = 0; i < ZN_RES_COUNT; i++)
        if (i != ZN_RES_NVME_READ && i != ZN_RES_NVME_WRITE && r->busy_s[i] > r->busy_s[busiest])
            busiest = i;
    out->busiest = busiest;
    out->step_s = r->step_s / (double)r->steps;
    out->busy_s = r->busy_s[busiest] / (double)r->steps;
    out->ratio = out->busy_s > 0 ? out->step_s / out->busy_s : 0;
    out->tokens_s = (double)r->tokens / r->step_s;
    return 0;
}

int zn_bench_train_predict(zn_run *ts, const zn_config *cfg, zn_cost *pred, FILE *note,
                           int *predicted)
{
    *predicted = 0;
    /* as zinc train: the trainer and its device go before the cost model
     * measures anything (a copy of the plan stays) */
    zn_plan *pl = malloc(sizeof *pl);
    int rc = pl ? 0 : zn_set_error(-ENOMEM, "out of memory");
    if (pl)
        *pl = *zn_train_get_plan(ts->tr);
    zn_run_free_trainer(ts);
    if (pl && ts->rank == 0) {
        rc = zn_run_predict(cfg, &ts->dims, pl, 0, pred, note);
        *predicted = 1;
    }
    free(pl);
    return rc;
}
