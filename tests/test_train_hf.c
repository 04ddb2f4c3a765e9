/* Fine-tuning a transformers-saved model: zinc loads the folder's weights
 * (bf16 single file, fp16 sharded, fp32 with tied embeddings, fp32 with a
 * vocabulary streamed in row parts) and trains 10
 * AdamW steps (WarmupLR, clipping, accumulation, ignored targets) on the
 * batches PyTorch trained
 * on (tests/fixtures/ft-*, made by scripts/gen_train_fixtures.py). Checks:
 *  - the fp32 master starts as the exact widening of the stored values;
 *  - against the same PyTorch run in float64, every step's loss and
 *    gradient norm and the trained update (w_final - w_init; the whole
 *    model and each tensor, relative L2) within the fixture's bounds:
 *    BOUND_FACTOR times PyTorch float32's own distance from float64,
 *    written by the generator (tests/README.md, "Bounds");
 *  - the bounds are not blind: a 1e-3 error put into one step's update
 *    (the learning rate of the last step, through zn_train_options.lr_fault)
 *    breaks them in every fixture;
 *  - the placements (all on the device, params + optimizer in pinned RAM,
 *    params + optimizer on NVMe, with a small optimizer unit) give
 *    bit-identical losses and weights. */
#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/stat.h>

#include "zinc/run.h"
#include "zinc/ckpt.h"
#include "zinc/config.h"
#include "zinc/device.h"
#include "zinc/model.h"
#include "zinc/safetensors.h"
#include "zinc/train.h"
#include "zinc/util.h"
#include "test_nvme_common.h"
#include "zt.h"

#define MAX_STEPS 16

/* "host" (suite unit), or "cuda" (suite gpu: the same fine-tune on the GPU,
 * fp32, the optimizer on the CPU; tolerances for cuBLAS's summation order,
 * and placements compared by tolerance since atomics make the GPU's sums
 * order-dependent) */
static const char *device = "host";
static int on_gpu;

typedef struct {
    int steps;
    int64_t tokens_per_step;
    int32_t *ids[MAX_STEPS], *tgts[MAX_STEPS];
    double loss[MAX_STEPS], lr[MAX_STEPS], norm[MAX_STEPS];
    double eval_final; /* > 0: PEFT's eval-mode loss of step 1's batch after training */
    /* the same PyTorch run in float64, and the bounds against it */
    double loss64[MAX_STEPS], norm64[MAX_STEPS], eval64;
    double b_loss, b_norm, b_update, b_eval;
    /* a mixture of experts' load-balancing loss (float64 "aux_loss"): each
     * step's mean over its micro-batches, and its bound; has_aux 0: none */
    int has_aux;
    double aux64[MAX_STEPS], b_aux;
    json_t *b_tensors; /* tensor name -> bound on its update's relative L2 */
} reference;

/* On the GPU (fp32 cuBLAS, atomics in the reductions) the host's bounds are
 * widened by this much: not derived yet, as no GPU run has measured
 * cuBLAS's spread against the float64 run (issue 37). */
#define GPU_SLACK 10.0

typedef struct {
    double loss[MAX_STEPS], lr[MAX_STEPS], norm[MAX_STEPS];
    double aux[MAX_STEPS]; /* the step's load-balancing loss (has_aux) */
    int has_aux;
    float *master0;  /* before training */
    float *master;   /* after */
    uint64_t P;
    double eval_sum; /* zn_train_eval of step 1's batch after training */
    uint64_t eval_n;
    const char *ckdir; /* in: save a checkpoint here after training (NULL: none) */
    int fault_step;    /* in: > 0: this step's learning rate is 1e-3 off */
    uint64_t d2h;      /* gradient bytes the run moved device -> host */
    int64_t accum;     /* its config's gradient_accumulation_steps */
} run_out;

static int load_reference(const char *dir, reference *r)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/train-reference.json", dir);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) {
        fprintf(stderr, "%s: %s\n", p, je.text);
        return -1;
    }
    json_t *steps = json_object_get(j, "steps");
    r->steps = (int)json_array_size(steps);
    if (r->steps < 1 || r->steps > MAX_STEPS) {
        json_decref(j);
        return -1;
    }
    for (int s = 0; s < r->steps; s++) {
        json_t *st = json_array_get(steps, (size_t)s);
        json_t *ids = json_object_get(st, "ids"), *tg = json_object_get(st, "targets");
        size_t n = json_array_size(ids);
        r->tokens_per_step = (int64_t)n;
        r->ids[s] = malloc(n * sizeof(int32_t));
        r->tgts[s] = malloc(n * sizeof(int32_t));
        for (size_t i = 0; i < n; i++) {
            r->ids[s][i] = (int32_t)json_integer_value(json_array_get(ids, i));
            r->tgts[s][i] = (int32_t)json_integer_value(json_array_get(tg, i));
        }
        r->loss[s] = json_number_value(json_object_get(st, "loss"));
        r->lr[s] = json_number_value(json_object_get(st, "lr"));
        r->norm[s] = json_number_value(json_object_get(st, "grad_norm"));
    }
    r->eval_final = json_number_value(json_object_get(j, "eval_step1_final"));
    json_t *f64 = json_object_get(j, "float64"), *b = json_object_get(j, "bounds");
    json_t *l64 = json_object_get(f64, "loss"), *n64 = json_object_get(f64, "grad_norm");
    if (json_array_size(l64) != (size_t)r->steps || json_array_size(n64) != (size_t)r->steps ||
        !json_is_object(json_object_get(b, "update_tensors"))) {
        fprintf(stderr, "%s: no float64 run or bounds (scripts/gen_train_fixtures.py)\n", p);
        json_decref(j);
        return -1;
    }
    for (int s = 0; s < r->steps; s++) {
        r->loss64[s] = json_number_value(json_array_get(l64, (size_t)s));
        r->norm64[s] = json_number_value(json_array_get(n64, (size_t)s));
    }
    r->eval64 = json_number_value(json_object_get(f64, "eval_step1_final"));
    json_t *a64 = json_object_get(f64, "aux_loss");
    r->has_aux = json_array_size(a64) == (size_t)r->steps;
    for (int s = 0; s < r->steps && r->has_aux; s++)
        r->aux64[s] = json_number_value(json_array_get(a64, (size_t)s));
    r->b_aux = json_number_value(json_object_get(b, "aux_loss")) * (on_gpu ? GPU_SLACK : 1.0);
    r->b_loss = json_number_value(json_object_get(b, "loss"));
    r->b_norm = json_number_value(json_object_get(b, "grad_norm"));
    r->b_update = json_number_value(json_object_get(b, "update"));
    r->b_eval = json_number_value(json_object_get(b, "eval_step1_final"));
    r->b_tensors = json_incref(json_object_get(b, "update_tensors"));
    double slack = on_gpu ? GPU_SLACK : 1.0;
    r->b_loss *= slack, r->b_norm *= slack, r->b_update *= slack, r->b_eval *= slack;
    json_decref(j);
    return 0;
}

/* A LoRA fixture (tests/fixtures/lora-*, scripts/gen_lora_fixtures.py):
 * its base model folder (train-config.json's model.path, relative to the
 * fixture) into base; 0 for a full fine-tune fixture. */
static int lora_base(const char *dir, char *base, size_t n)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/adapter-init", dir);
    struct stat sb;
    if (stat(p, &sb))
        return 0;
    snprintf(p, sizeof p, "%s/train-config.json", dir);
    json_t *j = json_load_file(p, 0, NULL);
    const char *mp = json_string_value(json_object_get(json_object_get(j, "model"), "path"));
    snprintf(base, n, "%s/%s", dir, mp ? mp : "?");
    json_decref(j);
    return 1;
}

/* zn_train_options.lr_fault: step *user's update 1e-3 too large. */
static double lr_fault(void *user, int64_t step, double lr)
{
    return step == *(int *)user ? lr * (1 + 1e-3) : lr;
}

/* Trains the fixture in `dir` with extra --set style overrides. */
static int run(const char *dir, const reference *ref, const char **sets, int nsets, run_out *o)
{
    char cfgpath[4300], mp[4400], nv[4500], base[4300], ad[4400];
    snprintf(cfgpath, sizeof cfgpath, "%s/train-config.json", dir);
    int lora = lora_base(dir, base, sizeof base);
    if (!lora)
        snprintf(base, sizeof base, "%s", dir);
    snprintf(mp, sizeof mp, "model.path=\"%s\"", base);
    snprintf(ad, sizeof ad, "lora.adapter=\"%s/adapter-init\"", dir);
    snprintf(nv, sizeof nv, "tiers.nvme=[{\"path\": \"%s\", \"size\": \"64MiB\"}]",
             tn_tmpdir("train-hf"));
    char dv[64];
    snprintf(dv, sizeof dv, "train.device=\"%s\"", device);
    /* on a GPU the run also holds its streams' cuBLAS handles and scratch
     * outside the arena (212 MiB, which the plan counts) */
    const char *all[32] = { mp, nv, "tiers.cpu=\"256MiB\"",
                            strcmp(device, "host") ? "tiers.gpu=\"320MiB\"" : "tiers.gpu=\"64MiB\"",
                            dv };
    int n = 5;
    for (int i = 0; i < nsets; i++)
        all[n++] = sets[i];
    if (lora)
        all[n++] = ad;
    zn_config cfg;
    zn_model_dims d;
    zn_train_llama *l = NULL;
    zn_trainer *tr = NULL;
    uint64_t blocks[256]; /* zn_model_num_parts: at most 32 + layers + 32 */
    int rc = zn_config_load(&cfg, cfgpath, all, n);
    if (!rc)
        rc = zn_config_resolve_batch(&cfg, 1);
    if (!rc)
        rc = zn_run_model_dims(&cfg, &d);
    if (rc)
        return rc;
    zn_plan_input in;
    zn_run_plan_input(&cfg, &d, 1, blocks, &in);
    char summary[4600];
    if ((rc = zn_train_llama_create(&l, &d, cfg.train_micro_batch_size_per_gpu, cfg.data.seq_len,
                                    0.02, 1)) ||
        (rc = zn_train_llama_load(l, base, summary, sizeof summary)))
        goto out;
    zn_train_llama_set_attention(l, cfg.train.attention);
    if (lora) {
        zn_train_llama_set_lora_seed(l, cfg.lora.seed); /* the dropout masks' stream */
        snprintf(ad, sizeof ad, "%s/adapter-init", dir);
        if ((rc = zn_train_llama_load_adapter(l, ad, summary, sizeof summary)))
            goto out;
    }
    zn_train_options to = zn_train_options_default();
    zn_spec to_spec;
    ZT_EQ_INT(zn_run_spec(&cfg, &in, NULL, &to_spec), 0);
    to.spec = &to_spec;
    to.model = zn_train_llama_model(l);
    to_spec.budgets.bytes[ZN_TIER_GPU] = cfg.tiers.gpu;
    to_spec.budgets.bytes[ZN_TIER_CPU] = cfg.tiers.cpu;
    to_spec.budgets.bytes[ZN_TIER_NVME] = 64u << 20;
    to_spec.threads = 2;
    if (o->fault_step > 0) {
        to.lr_fault = lr_fault;
        to.lr_fault_user = &o->fault_step;
    }
    if ((rc = zn_train_create(&tr, &to)))
        goto out;
    o->P = zn_train_num_params(tr);
    o->master0 = malloc(o->P * 4);
    o->master = malloc(o->P * 4);
    if ((rc = zn_train_read_master(tr, o->master0, o->P)))
        goto out;
    for (int s = 0; s < ref->steps; s++) {
        zn_train_step_info info;
        if ((rc = zn_train_step(tr, ref->ids[s], ref->tgts[s], NULL, &info)))
            goto out;
        o->loss[s] = info.loss;
        o->aux[s] = info.aux_loss;
        o->has_aux = info.has_aux;
        o->lr[s] = info.lr;
        o->norm[s] = info.grad_norm;
    }
    /* the trained model's loss on step 1's batch through the schedule */
    if (!rc)
        rc = zn_train_eval(tr, ref->ids[0], ref->tgts[0], NULL, cfg.gradient_accumulation_steps > 0
                                   ? (int)cfg.gradient_accumulation_steps : 1,
                           &o->eval_sum, &o->eval_n);
    if (!rc)
        rc = zn_train_read_master(tr, o->master, o->P);
    if (!rc) {
        zn_train_report rep;
        zn_train_get_report(tr, &rep);
        o->d2h = rep.d2h_bytes;
        o->accum = cfg.gradient_accumulation_steps > 0 ? cfg.gradient_accumulation_steps : 1;
    }
    if (!rc && o->ckdir) {
        zn_ckpt_save_options so = zn_ckpt_save_options_default();
        so.dir = o->ckdir;
        so.dims = &d;
        rc = zn_ckpt_save(tr, &so, NULL, 0);
    }
out:
    zn_train_destroy(tr);
    zn_train_llama_destroy(l);
    tn_rmdir(); /* this run's NVMe folder */
    return rc;
}

/* The master's tensors in flat order: tensor k of the model (block order)
 * that the master holds, its size and its name in the fixture's files (PEFT's
 * for LoRA adapters). 0 at the end. */
static int master_tensor(const zn_model_dims *d, int *b, int *i, zn_param_info *pi, char *name,
                         size_t len)
{
    for (; *b < zn_model_num_blocks(d); (*b)++, *i = 0)
        for (; *i < zn_model_block_nparams(d, *b); (*i)++) {
            zn_model_block_param(d, *b, *i, pi);
            if (pi->owner_block >= 0)
                continue;  /* a tied view: stored once, with its owner */
            if (d->lora.r > 0 && !pi->lora)
                continue;  /* LoRA: the master holds the adapters, named as PEFT does */
            snprintf(name, len, "%s%s", d->lora.r > 0 ? "base_model.model." : "", pi->name);
            (*i)++;
            return 1;
        }
    return 0;
}

/* The flat master (block order, zn_model_block_param order) equals the
 * tensors of a safetensors file widened to fp32, bit for bit. */
static void compare_master(const char *what, const zn_model_dims *d, const float *m,
                           const char *path)
{
    zn_st *st;
    int rc = zn_st_open(&st, path);
    ZT_CHECK_MSG(rc == 0, "%s: %s", path, zn_last_error());
    if (rc)
        return;
    uint64_t flat = 0;
    int bad = 0;
    zn_param_info pi;
    char name[sizeof pi.name + 32];
    for (int b = 0, i = 0; master_tensor(d, &b, &i, &pi, name, sizeof name);) {
            const zn_st_tensor *t = zn_st_find(st, name);
            ZT_CHECK_MSG(t && t->numel == (uint64_t)pi.numel, "%s: %s missing", what, name);
            if (!t || t->numel != (uint64_t)pi.numel)
                break;
            float *v = malloc((size_t)pi.numel * 4);
            ZT_EQ_INT(zn_st_read(st, t, ZN_DTYPE_F32, v, (size_t)pi.numel * 4), 0);
            bad += memcmp(v, m + flat, (size_t)pi.numel * 4) != 0;
            flat += (uint64_t)pi.numel;
            free(v);
        }
    zn_st_close(st);
    ZT_CHECK_MSG(!bad, "%s: %d tensors differ from %s", what, bad, path);
}

/* The trained update (m1 - m0, flat, block order) against the float64
 * run's (update64.safetensors) by relative L2, over the whole model and per
 * tensor, each against its bound (ref->b_update, ref->b_tensors; GPU_SLACK
 * on the GPU). Returns how many bounds it breaks; *worst receives the
 * largest error / bound. */
static int update_errors(const zn_model_dims *d, const float *m0, const float *m1,
                         const char *path, const reference *ref, double *worst,
                         char *worst_name, size_t wn_len)
{
    zn_st *st;
    if (zn_st_open(&st, path)) {
        ZT_CHECK_MSG(0, "%s: %s", path, zn_last_error());
        return 1;
    }
    uint64_t flat = 0;
    int bad = 0;
    double num = 0, den = 0, slack = on_gpu ? GPU_SLACK : 1.0;
    *worst = 0;
    snprintf(worst_name, wn_len, "-");
    zn_param_info pi;
    char name[sizeof pi.name + 32];
    for (int b = 0, i = 0; master_tensor(d, &b, &i, &pi, name, sizeof name);) {
            const zn_st_tensor *t = zn_st_find(st, name);
            double bound = json_number_value(json_object_get(ref->b_tensors, name)) * slack;
            if (!t || t->numel != (uint64_t)pi.numel || !(bound > 0)) {
                ZT_CHECK_MSG(0, "%s: %s missing, misshapen or without a bound", path, name);
                bad++;
                break;
            }
            float *u = malloc((size_t)pi.numel * 4);
            ZT_EQ_INT(zn_st_read(st, t, ZN_DTYPE_F32, u, (size_t)pi.numel * 4), 0);
            double tn = 0, td = 0;
            for (int64_t e = 0; e < pi.numel; e++) {
                uint64_t k = flat + (uint64_t)e;
                double df = ((double)m1[k] - m0[k]) - u[e];
                tn += df * df;
                td += (double)u[e] * u[e];
            }
            free(u);
            num += tn;
            den += td;
            double r = sqrt(tn / (td > 0 ? td : 1)) / bound;
            if (r > *worst) {
                *worst = r;
                snprintf(worst_name, wn_len, "%s", name);
            }
            bad += r > 1;
            flat += (uint64_t)pi.numel;
        }
    zn_st_close(st);
    double whole = sqrt(num / (den > 0 ? den : 1)) / ref->b_update;
    if (whole > *worst) {
        *worst = whole;
        snprintf(worst_name, wn_len, "(whole model)");
    }
    return bad + (whole > 1);
}

/* zn_train_eval against the all-resident model (zn_model_state) holding
 * the trained master: the same batch's summed loss and target count. */
/* The loss sum and target count of step 1's batch (2 micro-batches) under a
 * resident host model holding either the flat master `m` (block order) or
 * the HF folder `path`. */
static int resident_eval(const zn_model_dims *d, const reference *ref, const float *m,
                         const char *path, double *sum, uint64_t *n)
{
    zn_dev_config dc = zn_dev_config_default();
    dc.name = "host";
    dc.gpu_budget = 64u << 20;
    zn_dev *dev = NULL;
    zn_model *md = NULL;
    zn_model_state *st = NULL;
    int rc = zn_dev_create(&dev, &dc);
    zn_model_config mc = zn_model_config_default(dev);
    int64_t B = 2, T = ref->tokens_per_step / 2 / B;  /* accumulation 2 x micro 2 */
    mc.max_batch = B;
    mc.max_seq = T;
    if (!rc)
        rc = zn_model_create(&md, dev, d, &mc);
    if (!rc)
        rc = zn_model_state_create(&st, md, 0);
    if (!rc && path)
        rc = zn_model_state_load(st, path);
    uint64_t flat = 0;
    for (int b = 0; !rc && m && b < zn_model_num_blocks(d); b++)
        for (int i = 0; !rc && i < zn_model_block_nparams(d, b); i++) {
            zn_param_info pi;
            zn_model_block_param(d, b, i, &pi);
            if (pi.owner_block >= 0)
                continue;
            rc = zn_dev_copy_h2d(dev, NULL, zn_model_state_params(st, b)[i], m + flat,
                                 (size_t)pi.numel * 4);
            flat += (uint64_t)pi.numel;
        }
    *sum = 0;
    *n = 0;
    for (int mb = 0; !rc && mb < 2; mb++) {
        const int32_t *in = ref->ids[0] + mb * B * T, *tg = ref->tgts[0] + mb * B * T;
        float loss = 0;
        if (!(rc = zn_model_set_batch(md, NULL, B, T, in, tg, NULL)) &&
            !(rc = zn_model_state_forward(st, NULL, &loss))) {
            *sum += (double)loss * (double)zn_model_batch_tokens(md);
            *n += (uint64_t)zn_model_batch_tokens(md);
        }
    }
    zn_model_state_destroy(st);
    zn_model_destroy(md);
    zn_dev_destroy(dev);
    return rc;
}

static void check_eval(const char *name, const zn_model_dims *d, const reference *ref,
                       const run_out *o)
{
    double sum = 0;
    uint64_t n = 0;
    int rc = resident_eval(d, ref, o->master, NULL, &sum, &n);
    ZT_CHECK_MSG(rc == 0, "%s: resident model: %s", name, zn_last_error());
    double rel = fabs(sum - o->eval_sum) / fabs(sum);
    printf("  %s eval: trainer %.9f over %llu targets, resident model %.9f over %llu (rel %.1e, "
           "bound %.1e)\n", name, o->eval_sum, (unsigned long long)o->eval_n, sum,
           (unsigned long long)n, rel, ref->b_loss);
    /* the streamed and the resident model: one forward's float32 sums in
     * two orders, bounded as a step's loss is */
    ZT_CHECK_MSG(n == o->eval_n && rel <= ref->b_loss, "%s: zn_train_eval %.9f/%llu, resident %.9f/%llu",
                 name, o->eval_sum, (unsigned long long)o->eval_n, sum, (unsigned long long)n);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* `zinc export --merge` of the trained adapters (a checkpoint of run 0):
 * the merged HF folder, loaded as a plain model, gives PEFT's eval-mode
 * loss with final-adapter/ and zinc's own LoRA eval; the default keeps the
 * base's tensor types and its untouched tensors byte for byte; a base of
 * another shape is refused. */
static void check_merge(const char *name, const char *ckdir, const char *base,
                        const reference *ref, const run_out *o)
{
    char out[4400], out2[4400], other[4300];
    snprintf(out, sizeof out, "%s/merged-fp32", ckdir);
    snprintf(out2, sizeof out2, "%s/merged", ckdir);
    int rc = zn_ckpt_export_merged(ckdir, out, base, 1, ZN_DTYPE_F32, 0);
    ZT_CHECK_MSG(rc == 0, "%s: export --merge: %s", name, zn_last_error());
    zn_model_dims md;
    if (rc || (rc = zn_model_dims_from_hf(&md, out))) {
        ZT_CHECK_MSG(0, "%s: merged config: %s", name, zn_last_error());
        return;
    }
    ZT_EQ_INT(md.lora.r, 0);
    double sum = 0;
    uint64_t n = 0;
    rc = resident_eval(&md, ref, NULL, out, &sum, &n);
    ZT_CHECK_MSG(rc == 0, "%s: merged model: %s", name, zn_last_error());
    double mine = sum / (double)n, lora = o->eval_sum / (double)o->eval_n;
    double rp = fabs(mine - ref->eval64) / ref->eval64, rl = fabs(mine - lora) / lora;
    printf("  %s merged: loss %.9f, peft float64 (adapter, eval mode) %.9f rel %.1e (bound "
           "%.1e), zinc LoRA eval %.9f rel %.1e\n", name, mine, ref->eval64, rp, ref->b_eval,
           lora, rl);
    /* the merged model against PyTorch's float64 and against zinc's
     * unmerged adapters: float32 sums in other orders, so within the bound
     * of one forward */
    ZT_CHECK_MSG(rp <= ref->b_eval && rl <= ref->b_eval, "%s: merged model's loss %.9f, peft float64 "
                 "%.9f (bound %.1e), zinc LoRA %.9f", name, mine, ref->eval64, ref->b_eval, lora);
    /* in the base's own types: untouched tensors are the base's bytes */
    ZT_CHECK_MSG(zn_ckpt_export_merged(ckdir, out2, base, 0, ZN_DTYPE_BF16, 0) == 0,
                 "%s: export --merge (base types): %s", name, zn_last_error());
    zn_st *a = NULL, *b = NULL;
    if (!zn_st_open(&a, base) && !zn_st_open(&b, out2)) {
        ZT_EQ_INT((int)zn_st_count(b), (int)zn_st_count(a));
        int same = 0, diff = 0;
        for (size_t i = 0; i < zn_st_count(a); i++) {
            const zn_st_tensor *ta = zn_st_tensor_at(a, i), *tb = zn_st_find(b, ta->name);
            ZT_CHECK_MSG(tb && tb->dtype == ta->dtype && tb->nbytes == ta->nbytes,
                         "%s: merged %s has another type or size", name, ta->name);
            if (!tb || tb->nbytes != ta->nbytes)
                continue;
            void *x = malloc(ta->nbytes), *y = malloc(ta->nbytes);
            ZT_EQ_INT(zn_st_read_raw(a, ta, x, ta->nbytes), 0);
            ZT_EQ_INT(zn_st_read_raw(b, tb, y, tb->nbytes), 0);
            int eq = !memcmp(x, y, ta->nbytes);
            same += eq;
            diff += !eq;
            int target = strstr(ta->name, "_proj.weight") != NULL;
            if (!target)
                ZT_CHECK_MSG(eq, "%s: merged %s differs from the base's", name, ta->name);
            free(x);
            free(y);
        }
        printf("  %s merged in the base's types: %d tensors changed, %d the base's bytes\n",
               name, diff, same);
        ZT_CHECK_MSG(diff > 0, "%s: merging changed no tensor", name);
    } else {
        ZT_CHECK_MSG(0, "%s: %s", name, zn_last_error());
    }
    zn_st_close(a);
    zn_st_close(b);
    /* a base of another shape */
    snprintf(other, sizeof other, "%s/tests/fixtures/%s", ZN_SOURCE_ROOT,
             strstr(base, "ft-llama") ? "ft-qwen2" : "ft-llama");
    rc = zn_ckpt_export_merged(ckdir, out2, other, 0, ZN_DTYPE_BF16, 0);
    ZT_CHECK_MSG(rc == ZN_ECONFIG && strstr(zn_last_error(), "is not the model the adapters"),
                 "%s: merge onto %s: %d %s", name, other, rc, zn_last_error());
}

static void fixture(const char *name)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", ZN_SOURCE_ROOT, name);
    reference ref;
    memset(&ref, 0, sizeof ref);
    if (load_reference(dir, &ref)) {
        ZT_CHECK_MSG(0, "%s: no reference", dir);
        return;
    }
    zn_model_dims d;
    char base[4300];
    int lora = lora_base(dir, base, sizeof base);
    ZT_EQ_INT(zn_model_dims_from_hf(&d, lora ? base : dir), 0);
    if (lora) {
        char ad[4400];
        snprintf(ad, sizeof ad, "%s/adapter-init", dir);
        ZT_EQ_INT(zn_lora_read_peft_config(ad, &d.lora), 0);
    }
    static const struct {
        const char *label;
        const char *sets[6];
    } place[] = {
        { "device", { "zero_optimization.offload_param.device=\"none\"",
                      "zero_optimization.offload_optimizer.device=\"none\"" } },
        { "device+cpu adam", { "zero_optimization.offload_param.device=\"none\"",
                               "zero_optimization.offload_optimizer.device=\"cpu\"" } },
        { "cpu", { "zero_optimization.offload_param.device=\"cpu\"",
                   "zero_optimization.offload_optimizer.device=\"cpu\"",
                   "zero_optimization.stage3_param_persistence_threshold=0" } },
        /* the layers' checkpoints in pinned RAM (a ring of three on the
         * device, loaded ahead of the backward) */
        { "cpu, cpu checkpoints", { "zero_optimization.offload_param.device=\"cpu\"",
                                    "zero_optimization.offload_optimizer.device=\"cpu\"",
                                    "zero_optimization.stage3_param_persistence_threshold=0",
                                    "activation_checkpointing.cpu_checkpointing=true" } },
        /* gradients on NVMe too: the dense gradient path (an untied
         * embedding's rows are sparse elsewhere), bit-identical */
        { "nvme", { "zero_optimization.offload_param.device=\"nvme\"",
                    "zero_optimization.offload_optimizer.device=\"nvme\"",
                    "tiers.grads=\"nvme\"",
                    "zero_optimization.stage3_param_persistence_threshold=0",
                    "zero_optimization.sub_group_size=5000",
                    "zero_optimization.offload_optimizer.buffer_count=8" } },
    };
    /* CUDA runs the optimizer on the CPU only: no all-on-device placement */
    int np = 5, p0 = on_gpu ? 1 : 0;
    run_out ro[5];
    memset(ro, 0, sizeof ro);
    char ckdir[64];
    snprintf(ckdir, sizeof ckdir, "merge-%s-XXXXXX", name);
    if (lora && !on_gpu && ref.eval_final > 0 && mkdtemp(ckdir))
        ro[p0].ckdir = ckdir;
    for (int p = p0; p < np; p++) {
        int ns = 0;
        while (ns < 6 && place[p].sets[ns])
            ns++;
        int rc = run(dir, &ref, (const char **)place[p].sets, ns, &ro[p]);
        ZT_CHECK_MSG(rc == 0, "%s, %s: %s", name, place[p].label, zn_last_error());
        if (rc)
            return;
    }
    if (p0)
        ro[0] = ro[p0];  /* the reference run below */
    char w0[4300], u64[4300], what[128], wn[160];
    snprintf(w0, sizeof w0, "%s", dir);
    snprintf(u64, sizeof u64, "%s/update64.safetensors", dir);
    if (lora)
        snprintf(w0, sizeof w0, "%s/adapter-init/adapter_model.safetensors", dir);
    /* the master starts as the stored values, widened exactly */
    snprintf(what, sizeof what, "%s initial master", name);
    compare_master(what, &d, ro[0].master0, w0);
    printf("%s: step  loss zinc    torch float64  rel      norm rel (bounds %.1e, %.1e)\n", name,
           ref.b_loss, ref.b_norm);
    for (int s = 0; s < ref.steps; s++) {
        double rl = fabs(ro[0].loss[s] - ref.loss64[s]) / fabs(ref.loss64[s]);
        double rn = fabs(ro[0].norm[s] - ref.norm64[s]) / fabs(ref.norm64[s]);
        printf("  %2d  %.9f  %.9f  %.1e  %.1e\n", s + 1, ro[0].loss[s], ref.loss64[s], rl, rn);
        ZT_CHECK_MSG(rl <= ref.b_loss, "%s step %d: loss %.9f, torch float64 %.9f (rel %.1e, "
                     "bound %.1e)", name, s + 1, ro[0].loss[s], ref.loss64[s], rl, ref.b_loss);
        ZT_CHECK_MSG(rn <= ref.b_norm, "%s step %d: grad norm %.9f, torch float64 %.9f (rel "
                     "%.1e, bound %.1e)", name, s + 1, ro[0].norm[s], ref.norm64[s], rn,
                     ref.b_norm);
        ZT_CHECK_MSG(fabs(ro[0].lr[s] - ref.lr[s]) <= 1e-12 * ref.lr[s] + 1e-15,
                     "%s step %d: lr %.9g, torch %.9g", name, s + 1, ro[0].lr[s], ref.lr[s]);
    }
    /* the load-balancing loss, reported apart (and in the loss above with
     * its coefficient) */
    ZT_CHECK_MSG(ro[0].has_aux == ref.has_aux, "%s: aux loss reported %d, the reference has "
                 "%d", name, ro[0].has_aux, ref.has_aux);
    for (int s = 0; s < ref.steps && ref.has_aux; s++) {
        double ra = fabs(ro[0].aux[s] - ref.aux64[s]) / fabs(ref.aux64[s]);
        ZT_CHECK_MSG(ra <= ref.b_aux, "%s step %d: aux loss %.9f, torch float64 %.9f (rel %.1e, "
                     "bound %.1e)", name, s + 1, ro[0].aux[s], ref.aux64[s], ra, ref.b_aux);
        if (s == ref.steps - 1)
            printf("  %s: aux loss of step %d %.9f, torch float64 %.9f (rel %.1e of %.1e)\n",
                   name, s + 1, ro[0].aux[s], ref.aux64[s], ra, ref.b_aux);
    }
    /* the run's bits, to compare across builds and refactors */
    printf("  %s: crc32c of the final master %08x, of the losses %08x\n", name,
           zn_crc32c(0, ro[0].master, ro[0].P * 4), zn_crc32c(0, ro[0].loss, sizeof ro[0].loss));
    double uw;
    int bad = update_errors(&d, ro[0].master0, ro[0].master, u64, &ref, &uw, wn, sizeof wn);
    printf("  %s after %d steps: update within %.2f of its bound at worst (%s)\n", name,
           ref.steps, uw, wn);
    ZT_CHECK_MSG(bad == 0, "%s after %d steps: %d updates beyond their bounds against torch "
                 "float64 (worst %s, %.2f x its bound)", name, ref.steps, bad, wn, uw);
    /* not blind: the last step's update 1e-3 too large breaks the bounds */
    if (!on_gpu) {
        run_out fo;
        memset(&fo, 0, sizeof fo);
        fo.fault_step = ref.steps;
        int rc = run(dir, &ref, (const char **)place[2].sets, 3, &fo);
        ZT_CHECK_MSG(rc == 0, "%s, injected error: %s", name, zn_last_error());
        if (!rc) {
            bad = update_errors(&d, fo.master0, fo.master, u64, &ref, &uw, wn, sizeof wn);
            printf("  %s with step %d's update 1e-3 off: %d bounds broken, worst %s %.2f x its "
                   "bound\n", name, ref.steps, bad, wn, uw);
            ZT_CHECK_MSG(bad > 0, "%s: a 1e-3 error in step %d's update stays within every "
                         "bound (worst %s, %.2f x)", name, ref.steps, wn, uw);
        }
        free(fo.master0);
        free(fo.master);
    }
    if (!on_gpu && !lora)
        check_eval(name, &d, &ref, &ro[0]);
    if (ro[0].ckdir) {
        check_merge(name, ro[0].ckdir, base, &ref, &ro[0]);
        nftw(ro[0].ckdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    if (ref.eval_final > 0) {
        double ev = ro[0].eval_sum / (double)ro[0].eval_n;
        double rel = fabs(ev - ref.eval64) / ref.eval64;
        printf("%s: eval of step 1's batch after training %.9f, peft float64 %.9f, rel %.1e "
               "(bound %.1e)\n", name, ev, ref.eval64, rel, ref.b_eval);
        ZT_CHECK_MSG(rel <= ref.b_eval, "%s: eval %.9f, peft float64 (eval mode) %.9f", name, ev,
                     ref.eval64);
    }
    /* every placement bit-identical to the first run (host), or within the
     * GPU's tolerance */
    for (int p = p0 + 1; p < np; p++) {
        bool same_loss = !memcmp(ro[p].loss, ro[0].loss, sizeof ro[0].loss);
        double worst = 0;
        for (int s = 0; s < ref.steps; s++) {
            double r = fabs(ro[p].loss[s] - ro[0].loss[s]) / fabs(ro[0].loss[s]);
            worst = r > worst ? r : worst;
        }
        ZT_CHECK_MSG(on_gpu ? worst <= ref.b_loss : same_loss,
                     "%s: %s losses differ from the first run's (worst %.1e)", name,
                     place[p].label, worst);
        ZT_CHECK_MSG(ro[p].P == ro[0].P && !memcmp(ro[p].master0, ro[0].master0, ro[0].P * 4),
                     "%s: %s initial master differs", name, place[p].label);
        ZT_CHECK_MSG(ro[p].eval_n == ro[0].eval_n &&
                         (on_gpu ? fabs(ro[p].eval_sum - ro[0].eval_sum) <=
                                       ref.b_loss * fabs(ro[0].eval_sum)
                                 : ro[p].eval_sum == ro[0].eval_sum),
                     "%s: %s eval %.9f differs from %.9f", name, place[p].label, ro[p].eval_sum,
                     ro[0].eval_sum);
        if (!on_gpu)
            ZT_CHECK_MSG(ro[p].P == ro[0].P && !memcmp(ro[p].master, ro[0].master, ro[0].P * 4),
                         "%s: %s final master differs", name, place[p].label);
    }
    /* the fused attention (the default in bf16; here its C reference in
     * fp32) trains to torch's losses, norms and weights within the same
     * bounds (not bit-identical: its sums run in another order) */
    if (!on_gpu) {
        static const char *fs[] = { "zero_optimization.offload_param.device=\"cpu\"",
                                    "zero_optimization.offload_optimizer.device=\"cpu\"",
                                    "train.attention=\"fused\"" };
        run_out fo;
        memset(&fo, 0, sizeof fo);
        int rc = run(dir, &ref, fs, 3, &fo);
        ZT_CHECK_MSG(rc == 0, "%s, fused attention: %s", name, zn_last_error());
        double worst = 0;
        for (int s = 0; !rc && s < ref.steps; s++) {
            double rl = fabs(fo.loss[s] - ref.loss64[s]) / fabs(ref.loss64[s]);
            double rn = fabs(fo.norm[s] - ref.norm64[s]) / fabs(ref.norm64[s]);
            worst = rl > worst ? rl : worst;
            ZT_CHECK_MSG(rl <= ref.b_loss && rn <= ref.b_norm, "%s, fused attention, step %d: "
                         "loss %.9f (torch float64 %.9f), grad norm %.9f (torch float64 %.9f)",
                         name, s + 1, fo.loss[s], ref.loss64[s], fo.norm[s], ref.norm64[s]);
        }
        /* and it is the fused attention that ran: its sums round apart
         * from the GEMM path's */
        ZT_CHECK_MSG(rc || memcmp(fo.loss, ro[0].loss, sizeof fo.loss) ||
                         memcmp(fo.norm, ro[0].norm, sizeof fo.norm) || fo.P != ro[0].P ||
                         memcmp(fo.master, ro[0].master, ro[0].P * 4),
                     "%s: train.attention \"fused\" gave the GEMM run's losses, norms and "
                     "weights bit for bit", name);
        if (!rc) {
            printf("%s: fused attention: losses within %.1e of torch float64's\n", name, worst);
            int nb = update_errors(&d, fo.master0, fo.master, u64, &ref, &worst, wn, sizeof wn);
            printf("  %s after %d steps, fused attention: update within %.2f of its bound at "
                   "worst (%s)\n", name, ref.steps, worst, wn);
            ZT_CHECK_MSG(nb == 0, "%s after %d steps, fused attention: %d updates beyond their "
                         "bounds (worst %s, %.2f x its bound)", name, ref.steps, nb, wn, worst);
        }
        free(fo.master0);
        free(fo.master);
    }
    /* an untied embedding's gradient leaves the device as the rows of the
     * micro-batch's tokens only (one rank, gradients in RAM); with
     * gradients on NVMe (the last placement) it is dense */
    if (!lora && !d.tie_embeddings && !on_gpu) {
        int64_t H = d.hidden, V = d.vocab, nt = ref.tokens_per_step / ro[0].accum;
        uint64_t nmb = (uint64_t)ref.steps * (uint64_t)ro[0].accum, P = ro[0].P;
        uint64_t dense = P * 4 * nmb, most = (P - (uint64_t)(V * H) + (uint64_t)(nt * H)) * 4 * nmb;
        ZT_CHECK_MSG(ro[np - 1].d2h == dense, "%s: nvme grads moved %llu B, dense is %llu B",
                     name, (unsigned long long)ro[np - 1].d2h, (unsigned long long)dense);
        ZT_CHECK_MSG(ro[0].d2h <= most && ro[0].d2h < dense,
                     "%s: %llu B of gradients moved, at most %llu B with the embedding's rows "
                     "(dense %llu B)", name, (unsigned long long)ro[0].d2h,
                     (unsigned long long)most, (unsigned long long)dense);
        printf("%s: gradients D2H %llu B (the embedding's touched rows), dense %llu B\n", name,
               (unsigned long long)ro[0].d2h, (unsigned long long)dense);
    }
    for (int p = p0; p < np; p++) {
        free(ro[p].master0);
        free(ro[p].master);
    }
    json_decref(ref.b_tensors);
    for (int s = 0; s < ref.steps; s++) {
        free(ref.ids[s]);
        free(ref.tgts[s]);
    }
}

/* The fixture's model is cut into the parts its test is about. */
static void check_parts(const char *name, int embed_parts, int head_parts)
{
    zn_model_dims d;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", ZN_SOURCE_ROOT, name);
    ZT_EQ_INT(zn_model_dims_from_hf(&d, dir), 0);
    int e = zn_model_block_parts(&d, 0), h = zn_model_block_parts(&d, (int)d.n_layers + 1);
    ZT_CHECK_MSG(e == embed_parts && h == head_parts, "%s: %d embedding and %d head parts, "
                 "want %d and %d", name, e, h, embed_parts, head_parts);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "cuda")) {
        device = "cuda";
        on_gpu = 1;
        zn_dev_config dc = zn_dev_config_default();
        dc.name = "cuda";
        dc.gpu_budget = 64u << 20;
        zn_dev *dev = NULL;
        if (zn_dev_create(&dev, &dc))
            ZT_SKIP("no CUDA device: %s", zn_last_error());
        zn_dev_destroy(dev);
    }
    fixture("ft-llama");
    fixture("ft-qwen2");
    fixture("ft-tied");
    /* a vocabulary the trainer streams in row parts (embedding and lm_head
     * each in four), against the same PyTorch run */
    check_parts("ft-vocab", 4, 4);
    fixture("ft-vocab");
    /* the same shape tied: the resident embedding in four parts that the
     * head reads as its lm_head */
    check_parts("ft-tiedvocab", 4, 1);
    fixture("ft-tiedvocab");
    /* qwen3: the per-head q/k norm's weights trained too, q wider than the
     * hidden size */
    fixture("ft-qwen3");
    /* phi3: qkv_proj and gate_up_proj trained as the fused tensors they are */
    fixture("ft-phi3");
    /* olmo2: the post-norms and the full-width q/k norm trained, pad id 1 */
    fixture("ft-olmo2");
    /* gemma: (1 + w) norms, GeGLU, the embedding times sqrt(hidden), tied */
    fixture("ft-gemma");
    /* mistral with a 5-key window over 12-token sequences: the mask trained
     * through */
    fixture("ft-mistral");
    /* gemma2: four norms, soft-capped scores and logits, the window on
     * layers 0 and 2 of 3 */
    fixture("ft-gemma2");
    /* gemma3_text: the per-head (1 + w) q/k norm trained, the window and
     * the local RoPE base on layers 0 and 1, linear-scaled RoPE on 2 */
    fixture("ft-gemma3");
    /* olmo3: the window on layers 0 and 1, YaRN (attention_factor 1.1) on 2 */
    fixture("ft-olmo3");
    /* qwen3_moe: the router and every expert trained through the top-k
     * routing, a dense layer beside the sparse one */
    fixture("ft-qwen3moe");
    /* with output_router_logits: the load-balancing loss (coefficient 0.05)
     * in every micro-batch's loss, its gradient through the routers */
    fixture("ft-qwen3moeaux");
    /* mixtral: block_sparse_moe's experts under the 5-key window, fp32
     * routing weights */
    fixture("ft-mixtral");
    /* LoRA on a frozen base (lora_B nonzero from the start, so both adapter
     * gradients count), every placement of the base */
    fixture("lora-llama");
    fixture("lora-qwen2");
    fixture("lora-qwen3"); /* the q and k adapters feed the per-head q/k norm */
    fixture("lora-phi3");  /* qkv_proj and gate_up_proj adapters on the fused tensors */
    fixture("lora-olmo2"); /* q/k adapters before the q/k norm, o/down before the post-norms */
    fixture("lora-mistral"); /* the windowed attention under every adapter */
    fixture("lora-gemma2");  /* under the caps, the alternating window, the four norms */
    fixture("lora-gemma3");  /* q/k adapters under the (1 + w) q/k norm, two RoPE bases */
    fixture("lora-olmo3");   /* the window and YaRN under every adapter */
    fixture("lora-qwen3moe"); /* the attention's adapters beside the routing */
    /* lora_dropout 0.2 with zinc's masks on PEFT's side; eval without */
    fixture("lora-dropout");
    tn_rmdir();
    return zt_done();
}
