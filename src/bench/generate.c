/* zinc bench generate's measuring half: prefill and decode tokens/s of an
 * HF model folder for a batch of prompts, with the weights and the KV
 * cache placed as `zinc generate` places them for the same settings (the
 * same function, zn_gen_place_model), against the two ceilings of a
 * decoding step measured in the same run: the link (the step's streamed
 * layers copied alone) and the compute (the same batch with every weight
 * and the cache resident, when the device holds them), and against the
 * bound `zinc generate --plan` states. The data are checked: the streamed
 * run's ids must be the resident run's, and the bytes its decoding steps
 * moved the plan's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/bench.h"
#include "zinc/cost.h"
#include "zinc/device.h"
#include "zinc/generate.h"
#include "zinc/gensession.h"
#include "zinc/model.h"

typedef struct {
    const zn_gen *g;
    int64_t b, firsts;
    double t_prefilled;
    zn_gen_placement at_prefilled; /* the byte counters as decoding starts */
} timing;

static int on_token(void *ctx, int64_t seq, int32_t id, int last)
{
    timing *t = ctx;
    (void)seq;
    (void)id;
    (void)last;
    if (t->firsts < t->b && ++t->firsts == t->b) {
        t->t_prefilled = zn_now_s();
        zn_gen_get_placement(t->g, &t->at_prefilled);
    }
    return 0;
}

typedef struct {
    zn_model *m;
    zn_gen *g;
} runner;

static void runner_close(runner *r)
{
    zn_gen_destroy(r->g);
    zn_model_destroy(r->m);
    r->g = NULL;
    r->m = NULL;
}

/* The resident run: the same sizing as the placed one (zn_gen_place_model)
 * with every weight and the cache on the device, on the same device. */
static int runner_open(runner *r, zn_dev *dev, const zn_model_dims *d, zn_dtype dt,
                       const zn_gen_place *o, const char *dir)
{
    int rc = zn_gen_place_model(dev, d, dt, o, &r->m, &r->g);
    if (!rc)
        rc = zn_gen_load(r->g, dir, NULL);
    if (rc)
        runner_close(r);
    return rc;
}

static void free_out(int32_t **o, int64_t b)
{
    for (int64_t i = 0; i < b; i++) {
        free(o[i]);
        o[i] = NULL;
    }
}

/* One batch: seconds of the prefills and of the decoding steps, and (when
 * moved is not NULL) the bytes the decoding steps moved. */
static int run_batch(zn_gen *g, int64_t b, int32_t **ids, const int64_t *lens, int64_t new_tokens,
                     int32_t **out, int64_t *out_n, double *prefill_s, double *decode_s,
                     zn_gen_bytes *moved)
{
    zn_gen_params p = zn_gen_params_default();
    p.max_new_tokens = new_tokens;
    timing t;
    memset(&t, 0, sizeof t);
    t.g = g;
    t.b = b;
    double t0 = zn_now_s();
    int rc = zn_gen_run(g, b, (const int32_t *const *)ids, lens, &p, out, out_n, on_token, &t);
    double t1 = zn_now_s();
    *prefill_s = t.t_prefilled - t0;
    *decode_s = t1 - t.t_prefilled;
    if (moved && !rc) {
        zn_gen_placement e, *s = &t.at_prefilled;
        zn_gen_get_placement(g, &e);
        moved->h2d = (e.streamed_bytes - s->streamed_bytes) + (e.kv_in_bytes - s->kv_in_bytes) +
                     (e.embed_in_bytes - s->embed_in_bytes);
        moved->d2h = (e.kv_out_bytes - s->kv_out_bytes) +
                     (e.logits_out_bytes - s->logits_out_bytes);
        moved->nvme = e.nvme_read - s->nvme_read;
    }
    return rc;
}

/* What a run holds: the placed model and the resident one, the prompts and
 * the two runs' outputs, the link's figures. */
struct zn_bench_gen {
    zn_bench_gen_config cfg;
    zn_model_dims d;
    int64_t maxb;
    zn_gen_engine st;
    zn_gen_placement pl;
    runner res;
    int have_res;
    zn_ceilings fig;
    zn_dev_info di;
    int32_t **ids, **o1, **o2;
    int64_t *lens, *n1, *n2;
};

void zn_bench_gen_destroy(zn_bench_gen *B)
{
    if (!B)
        return;
    for (int64_t i = 0; i < B->maxb; i++) {
        if (B->ids)
            free(B->ids[i]);
        if (B->o1)
            free(B->o1[i]);
        if (B->o2)
            free(B->o2[i]);
    }
    free(B->ids);
    free(B->o1);
    free(B->o2);
    free(B->lens);
    free(B->n1);
    free(B->n2);
    runner_close(&B->res);
    zn_gen_engine_close(&B->st);
    free(B);
}

/* The prompts: seeded ids. */
static int make_prompts(zn_bench_gen *B)
{
    int64_t maxb = B->maxb, plen = B->cfg.prompt_len;
    B->ids = calloc((size_t)maxb, sizeof *B->ids);
    B->o1 = calloc((size_t)maxb, sizeof *B->o1);
    B->o2 = calloc((size_t)maxb, sizeof *B->o2);
    B->lens = calloc((size_t)maxb, sizeof *B->lens);
    B->n1 = calloc((size_t)maxb, 8);
    B->n2 = calloc((size_t)maxb, 8);
    if (!B->ids || !B->o1 || !B->o2 || !B->lens || !B->n1 || !B->n2)
        return zn_set_error(-ENOMEM, "out of memory");
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < maxb; i++) {
        B->lens[i] = plen;
        if (!(B->ids[i] = malloc((size_t)plen * sizeof **B->ids)))
            return zn_set_error(-ENOMEM, "out of memory");
        for (int64_t k = 0; k < plen; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            B->ids[i][k] = (int32_t)(x % (uint64_t)B->d.vocab);
        }
    }
    return 0;
}

int zn_bench_gen_create(zn_bench_gen **out, const zn_model_dims *d, const zn_bench_gen_config *cfg)
{
    *out = NULL;
    if (cfg->place.batch < 1 || cfg->prompt_len < 1 || cfg->new_tokens < 2)
        return zn_set_error(ZN_EARG, "%lld prompts of %lld ids, %lld new tokens",
                            (long long)cfg->place.batch, (long long)cfg->prompt_len,
                            (long long)cfg->new_tokens);
    zn_bench_gen *B = calloc(1, sizeof *B);
    if (!B)
        return zn_set_error(-ENOMEM, "out of memory");
    B->cfg = *cfg;
    B->d = *d;
    B->maxb = cfg->place.batch;
    int rc;
    if ((rc = make_prompts(B)))
        goto fail;
    /* the placed model: the device, the model and its generator exactly as
     * `zinc generate` opens them */
    if ((rc = zn_gen_engine_open(&B->st, &B->d, cfg->model, NULL, NULL, &cfg->place, 0)))
        goto fail;
    zn_gen_get_placement(B->st.g, &B->pl);
    /* the compute ceiling: every weight and the cache resident, when the
     * arena holds them beside the placed model */
    if (B->pl.streamed_layers || B->pl.kv_pinned) {
        zn_gen_place ro = cfg->place;
        ro.nvme = NULL;
        ro.resident = -1;
        ro.kv_home = ZN_GEN_KV_DEVICE;
        B->have_res = !runner_open(&B->res, B->st.dev, &B->d, B->st.dt, &ro, cfg->model);
        zn_gen_placement rp;
        if (B->have_res) {
            zn_gen_get_placement(B->res.g, &rp);
            B->have_res = !rp.streamed_layers && !rp.kv_pinned;
        }
        if (!B->have_res)
            runner_close(&B->res);
    }
    zn_dev_get_info(B->st.dev, &B->di);
    *out = B;
    return 0;
fail:
    zn_bench_gen_destroy(B);
    return rc;
}

int zn_bench_gen_ceilings(zn_bench_gen *B, const char *target, FILE *note)
{
    return zn_gen_link_figures(B->cfg.place.device, B->cfg.place.nvme, target, 0, &B->fig, note);
}

void zn_bench_gen_get_info(const zn_bench_gen *B, zn_bench_gen_info *out)
{
    memset(out, 0, sizeof *out);
    out->placement = B->pl;
    out->fig = B->fig;
    out->dev = B->di;
    out->dtype = B->st.dt;
}

/* Both timed runs of batch b: the placed one (*dec its decoding seconds,
 * *moved its bytes) and the resident one when there is one (*comp_ms its
 * step, -1 none), whose ids must be the placed run's. */
static int time_runs(zn_bench_gen *B, int64_t b, double *pre, double *dec, double *link,
                     double *comp_ms, zn_gen_bytes *moved)
{
    const zn_gen_placement *pl = &B->pl;
    int64_t new_tokens = B->cfg.new_tokens;
    double rpre = 0, rdec = 0;
    int rc;
    /* a warm-up batch, then the timed one */
    if ((rc = run_batch(B->st.g, b, B->ids, B->lens, 2, B->o1, B->n1, pre, dec, NULL)) ||
        (free_out(B->o1, b),
         rc = run_batch(B->st.g, b, B->ids, B->lens, new_tokens, B->o1, B->n1, pre, dec,
                        moved)) ||
        (rc = zn_gen_time_link(B->st.g, link)))
        return rc;
    double steps = (double)(new_tokens - 1);
    *comp_ms = -1;
    if (B->have_res) {
        if ((rc = run_batch(B->res.g, b, B->ids, B->lens, 2, B->o2, B->n2, &rpre, &rdec,
                            NULL)) ||
            (free_out(B->o2, b),
             rc = run_batch(B->res.g, b, B->ids, B->lens, new_tokens, B->o2, B->n2, &rpre,
                            &rdec, NULL)))
            return zn_error_prefix(rc, "resident");
        *comp_ms = rdec / steps * 1e3;
        for (int64_t i = 0; i < b; i++)
            if (B->n1[i] != B->n2[i] || memcmp(B->o1[i], B->o2[i], (size_t)B->n1[i] * 4))
                return zn_set_error(ZN_ECORRUPT, "batch %lld, prompt %lld: the streamed "
                                    "run's ids differ from the resident run's", (long long)b,
                                    (long long)i);
    } else if (!pl->streamed_layers && !pl->kv_pinned) {
        *comp_ms = *dec / steps * 1e3; /* everything resident: the step is the compute */
    }
    for (int64_t i = 0; i < b; i++) {
        free(B->o1[i]);
        free(B->o2[i]);
        B->o1[i] = B->o2[i] = NULL;
        if (B->n1[i] != new_tokens)
            return zn_set_error(ZN_ECORRUPT, "prompt %lld gave %lld ids, not %lld", (long long)i,
                                (long long)B->n1[i], (long long)new_tokens);
    }
    return 0;
}

int zn_bench_gen_batch(zn_bench_gen *B, int64_t b, zn_bench_gen_row *r)
{
    const zn_gen_placement *pl = &B->pl;
    int64_t plen = B->cfg.prompt_len, new_tokens = B->cfg.new_tokens;
    memset(r, 0, sizeof *r);
    if (b < 1 || b > B->maxb)
        return zn_set_error(ZN_EARG, "batch %lld: the cache holds 1 to %lld sequences",
                            (long long)b, (long long)B->maxb);
    double pre, dec, link = 0, comp_ms;
    int rc = time_runs(B, b, &pre, &dec, &link, &comp_ms, &r->moved);
    if (rc)
        return rc;
    double steps = (double)(new_tokens - 1);
    double step_ms = dec / steps * 1e3, link_ms = link * 1e3;
    /* the plan's bytes for these steps: step j feeds the token at
     * position plen + j, with that many rows cached per sequence */
    for (int64_t j = 0; j + 1 < new_tokens; j++) {
        zn_gen_bytes sb;
        zn_gen_step_bytes(pl, b, plen + j, &sb);
        r->plan.h2d += sb.h2d;
        r->plan.d2h += sb.d2h;
        r->plan.nvme += sb.nvme;
    }
    r->wrong = (r->plan.h2d != r->moved.h2d) + (r->plan.d2h != r->moved.d2h) +
               (r->plan.nvme != r->moved.nvme);
    /* the run's own copies and compute: on shared cores they add */
    double ceil_ms = B->fig.shared_cores && comp_ms > 0 ? link_ms + comp_ms
                     : link_ms > comp_ms ? link_ms : comp_ms;
    r->batch = b;
    r->ratio = ceil_ms > 0 ? ceil_ms / step_ms : 0;
    r->prefill_tps = (double)(b * plen) / pre;
    r->decode_tps = (double)b * steps / dec;
    r->step_ms = step_ms;
    r->link_ms = link_ms;
    r->compute_ms = comp_ms;
    /* the plan's bound at the decoding steps' mean context (positions
     * plen .. plen + new_tokens - 2), with the compute measured here
     * (the busiest of the two; their sum on the host backend) */
    const char *by;
    double bound_ms = zn_gen_step_bound(pl, b, plen + (new_tokens - 2) / 2, &B->fig, &B->d,
                                        comp_ms >= 0 ? comp_ms * 1e-3 : -1, &by) * 1e3;
    r->bound_tps = bound_ms > 0 ? (double)b / bound_ms * 1e3 : 0;
    r->of_bound = r->bound_tps > 0 ? r->decode_tps / r->bound_tps : 0;
    r->h2d_per_step = (double)r->moved.h2d / steps;
    r->d2h_per_step = (double)r->moved.d2h / steps;
    return 0;
}
