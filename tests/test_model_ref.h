/* Shared by test_model_ref.c (host) and test_model_gpu.c (CUDA): load a
 * PyTorch fixture (tests/fixtures/tiny-*) through zinc's own loader, run
 * forward + backward through the device, and compare the loss, a slice of
 * logits and every parameter's gradient norm with the float64 reference that
 * scripts/gen_fixtures.py recorded, within the fixture's bounds for the
 * precision (4 x PyTorch's own distance from float64 in it: "bounds" in
 * reference.json, tests/README.md), times a slack the caller states. */
#ifndef ZN_TEST_MODEL_REF_H
#define ZN_TEST_MODEL_REF_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "zinc/tokens.h"
#include "zt.h"
#include "test_model_fixtures.h"

typedef struct {
    double loss, logits, grad; /* worst relative errors seen */
    float loss_value;
} ref_result;

/* Runs fixture `name` on dev with dtype and checkpointing as given; checks
 * against the fixture's bounds for dt times slack (1 on the host). Returns
 * the worst errors in *res. grads_out (optional) receives a malloc'd copy of
 * all gradients concatenated, for comparing two runs bit for bit. */
/* Attention query rows per block for the runs (0: the model's default,
 * one block at these lengths); tests set it to cut the sequences into
 * several blocks, the last one partial. */
static int64_t ref_attn_block;
/* zn_model_config.attention for the runs (ZN_ATTN_AUTO: fused for bf16). */
static int ref_attention;

static void ref_run(zn_dev *dev, const char *name, zn_dtype dt, int checkpoint, double slack,
                    ref_result *res, float **grads_out, size_t *ngrads_out)
{
    char dir[4200], refpath[4300];
    snprintf(dir, sizeof dir, "%s", zt_fixture(name));
    snprintf(refpath, sizeof refpath, "%s/reference.json", dir);
    memset(res, 0, sizeof *res);

    json_error_t jerr;
    json_t *ref = json_load_file(refpath, 0, &jerr);
    if (!ref)
        ZT_SETUP_FAIL("%s: %s", refpath, jerr.text);
    json_t *bnd = json_object_get(json_object_get(ref, "bounds"),
                                  dt == ZN_DTYPE_F32 ? "float32" : "bfloat16");
    double tol_l = json_number_value(json_object_get(bnd, "loss")) * slack;
    double tol_lg = json_number_value(json_object_get(bnd, "logits")) * slack;
    double tol_g = json_number_value(json_object_get(bnd, "grad_norm")) * slack;
    if (!(tol_l > 0 && tol_lg > 0 && tol_g > 0))
        ZT_SETUP_FAIL("%s: no %s bounds (scripts/gen_fixtures.py)", refpath, zn_dtype_name(dt));
    zn_model_dims d;
    int rc = zn_model_dims_from_hf(&d, dir);
    ZT_CHECK_MSG(rc == 0, "%s: %s", dir, zn_last_error());
    if (rc)
        return;
    int64_t B = json_integer_value(json_object_get(ref, "batch"));
    int64_t T = json_integer_value(json_object_get(ref, "seq_len"));
    zn_model_config cfg = zn_model_config_default(dev);
    cfg.dtype = dt;
    cfg.max_batch = B;
    cfg.max_seq = T;
    cfg.checkpoint = checkpoint;
    cfg.xent_chunk = 96; /* several chunks, the last one partial (320 = 3 x 96 + 32) */
    cfg.attn_block = ref_attn_block;
    cfg.attention = ref_attention;
    zn_model *m;
    zn_model_state *st;
    rc = zn_model_create(&m, dev, &d, &cfg);
    ZT_CHECK_MSG(rc == 0, "create: %s", zn_last_error());
    if (rc)
        return;
    rc = zn_model_state_create(&st, m, 1);
    ZT_CHECK_MSG(rc == 0, "state: %s", zn_last_error());
    if (rc)
        return;
    rc = zn_model_state_load(st, dir);
    ZT_CHECK_MSG(rc == 0, "load: %s", zn_last_error());

    int32_t *ids = malloc((size_t)(B * T) * 4), *tg = malloc((size_t)(B * T) * 4);
    for (int64_t i = 0; i < B * T; i++) {
        ids[i] = (int32_t)json_integer_value(json_array_get(json_object_get(ref, "inputs"), i));
        tg[i] = (int32_t)json_integer_value(json_array_get(json_object_get(ref, "targets"), i));
    }
    ZT_EQ_INT(zn_model_set_batch(m, NULL, B, T, ids, tg, NULL), 0);
    float loss = NAN;
    rc = zn_model_state_forward_backward(st, NULL, &loss);
    ZT_CHECK_MSG(rc == 0, "forward_backward: %s", zn_last_error());
    double want = json_real_value(json_object_get(ref, "loss"));
    res->loss = fabs(loss - want) / fabs(want);
    res->loss_value = loss;
    ZT_CHECK_MSG(res->loss <= tol_l, "%s %s: loss %.8f vs torch %.8f (rel %.2e > %.1e)", name,
                 zn_dtype_name(dt), loss, want, res->loss, tol_l);

    /* Logits slice. */
    json_t *lg = json_object_get(ref, "logits");
    json_t *posl = json_object_get(lg, "positions"), *vals = json_object_get(lg, "values");
    float *row = malloc((size_t)d.vocab * 4);
    for (size_t k = 0; k < json_array_size(posl); k++) {
        int64_t b = json_integer_value(json_array_get(json_array_get(posl, k), 0));
        int64_t t = json_integer_value(json_array_get(json_array_get(posl, k), 1));
        rc = zn_model_state_logits(st, NULL, b * T + t, 1, row);
        ZT_CHECK_MSG(rc == 0, "logits: %s", zn_last_error());
        double num = 0, den = 0;
        for (int64_t v = 0; v < d.vocab; v++) {
            double r = json_real_value(json_array_get(json_array_get(vals, k), (size_t)v));
            num += (row[v] - r) * (row[v] - r);
            den += r * r;
        }
        double e = sqrt(num / den);
        if (e > res->logits)
            res->logits = e;
    }
    ZT_CHECK_MSG(res->logits <= tol_lg, "%s %s: logits rel err %.2e > %.1e", name,
                 zn_dtype_name(dt), res->logits, tol_lg);

    /* Gradient norms of every parameter. */
    json_t *gn = json_object_get(ref, "grad_norms");
    size_t nref = json_object_size(gn), nseen = 0, total = 0;
    float *all = NULL;
    for (int b = 0; b < zn_model_num_blocks(&d); b++)
        for (int i = 0; i < zn_model_block_nparams(&d, b); i++) {
            zn_param_info pi;
            zn_model_block_param(&d, b, i, &pi);
            if (pi.owner_block >= 0)
                continue;
            float *g = malloc((size_t)pi.numel * 4);
            zn_dev_copy_d2h(dev, NULL, g, zn_model_state_grads(st, b)[i], (size_t)pi.numel * 4);
            zn_dev_stream_sync(dev, NULL);
            double s2 = 0;
            for (int64_t k = 0; k < pi.numel; k++)
                s2 += (double)g[k] * g[k];
            json_t *r = json_object_get(gn, pi.name);
            ZT_CHECK_MSG(r != NULL, "%s: no reference for %s", name, pi.name);
            if (r) {
                nseen++;
                double e = fabs(sqrt(s2) - json_real_value(r)) / json_real_value(r);
                if (e > res->grad)
                    res->grad = e;
                ZT_CHECK_MSG(e <= tol_g, "%s %s: grad norm of %s %.8f vs torch %.8f (rel %.2e)",
                             name, zn_dtype_name(dt), pi.name, sqrt(s2), json_real_value(r), e);
            }
            if (grads_out) {
                all = realloc(all, (total + (size_t)pi.numel) * 4);
                memcpy(all + total, g, (size_t)pi.numel * 4);
            }
            total += (size_t)pi.numel;
            free(g);
        }
    ZT_EQ_U64(nseen, nref);
    if (grads_out) {
        *grads_out = all;
        *ngrads_out = total;
    }
    /* The eval path: the fixture's token file read by the loader in order
     * gives the same rows; no target is ignored there. */
    zn_tokens *tok;
    double ev = NAN;
    int64_t ntok = 0, nbat = 0;
    rc = zn_tokens_open(&tok, zt_fixture("tokens.tok"));
    ZT_CHECK_MSG(rc == 0, "tokens: %s", zn_last_error());
    if (!rc) {
        rc = zn_model_state_eval(st, NULL, tok, B, T, 0, &ev, &ntok, &nbat);
        ZT_CHECK_MSG(rc == 0, "eval: %s", zn_last_error());
        double want_ev = json_real_value(json_object_get(ref, "eval_loss"));
        ZT_CHECK_MSG(fabs(ev - want_ev) / want_ev <= tol_l, "%s %s: eval loss %.8f vs %.8f",
                     name, zn_dtype_name(dt), ev, want_ev);
        ZT_EQ_INT(ntok, B * T);
        ZT_EQ_INT(nbat, 1);
        zn_tokens_close(tok);
    }
    printf("%-10s %-4s ckpt=%d  loss %.7f (rel %.1e of %.1e)  logits rel %.1e of %.1e  worst "
           "grad-norm rel %.1e of %.1e\n", name, zn_dtype_name(dt), checkpoint, loss, res->loss,
           tol_l, res->logits, tol_lg, res->grad, tol_g);
    free(row);
    free(ids);
    free(tg);
    zn_model_state_destroy(st);
    zn_model_destroy(m);
    json_decref(ref);
}

#endif
