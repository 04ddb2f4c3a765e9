/* Shared by test_model_packed.c (host) and test_model_gpu.c (CUDA): packed
 * documents compute what the same documents compute one at a time. A batch
 * of two 24-token sequences packs five documents (7 + 10 + 7 and 5 + 19
 * tokens, positions restarting at 0 at each); the packed forward and
 * backward must give, within tol (gradients: or the fixture's own float32
 * or bfloat16 bound where that is wider), each token's logits, the loss (the mean
 * over every document's targets) and every gradient of the documents run
 * one by one as their own sequences (gradients added up, the loss scaled
 * by 1 / all targets). And the same batch without positions (every token
 * attending to all before it) must not: the check can fail. */
#ifndef ZN_TEST_MODEL_PACKED_H
#define ZN_TEST_MODEL_PACKED_H

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "zt.h"
#include "test_model_fixtures.h"

enum { PK_B = 2, PK_T = 24, PK_N = PK_B * PK_T, MAX_PK_TENSORS = 32 };

/* Attention query rows per block (0: one block of 24); 5 cuts every
 * sequence into blocks that start inside documents (and one partial). */
static int64_t pk_attn_block;
/* zn_model_config.attention (ZN_ATTN_AUTO: fused for bf16). */
static int pk_attention;

/* All gradients of the state, concatenated (malloc'd, *n elements). */
static float *pk_grads(zn_dev *dev, zn_model_state *st, const zn_model_dims *d, size_t *n)
{
    float *all = NULL;
    size_t total = 0;
    for (int b = 0; b < zn_model_num_blocks(d); b++)
        for (int i = 0; i < zn_model_block_nparams(d, b); i++) {
            zn_param_info pi;
            zn_model_block_param(d, b, i, &pi);
            if (pi.owner_block >= 0)
                continue;
            all = realloc(all, (total + (size_t)pi.numel) * 4);
            if (!all)
                ZT_SETUP_FAIL("out of memory");
            if (zn_dev_copy_d2h(dev, NULL, all + total, zn_model_state_grads(st, b)[i],
                                (size_t)pi.numel * 4) ||
                zn_dev_stream_sync(dev, NULL))
                ZT_SETUP_FAIL("grads: %s", zn_last_error());
            total += (size_t)pi.numel;
        }
    *n = total;
    return all;
}

static double pk_rel(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The fixture's own bound on gradients in dt (reference.json: 4 x how far
 * PyTorch's pass in that precision lands from float64's), 0 when absent:
 * two summation orders of zinc's may differ by as much. */
static double pk_grad_bound(const char *dir, zn_dtype dt)
{
    char p[4300];
    snprintf(p, sizeof p, "%s/reference.json", dir);
    json_t *r = json_load_file(p, 0, NULL);
    json_t *b = json_object_get(json_object_get(json_object_get(r, "bounds"),
                                                dt == ZN_DTYPE_BF16 ? "bfloat16" : "float32"),
                                "grad_norm");
    double v = json_is_number(b) ? json_number_value(b) : 0.0;
    json_decref(r);
    return v;
}

static void packed_run(zn_dev *dev, const char *name, zn_dtype dt, int checkpoint, double tol)
{
    /* document lengths per sequence, summing to PK_T */
    static const int docs[PK_B][4] = { { 7, 10, 7, 0 }, { 5, 19, 0, 0 } };
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", zt_fixture(name));
    zn_model_dims d;
    if (zn_model_dims_from_hf(&d, dir))
        ZT_SETUP_FAIL("%s: %s", dir, zn_last_error());
    zn_model_config cfg = zn_model_config_default(dev);
    cfg.dtype = dt;
    cfg.max_batch = PK_B;
    cfg.max_seq = PK_T;
    cfg.checkpoint = checkpoint;
    cfg.attn_block = pk_attn_block;
    cfg.attention = pk_attention;
    zn_model *m;
    zn_model_state *st;
    if (zn_model_create(&m, dev, &d, &cfg) || zn_model_state_create(&st, m, 1) ||
        zn_model_state_load(st, dir))
        ZT_SETUP_FAIL("%s: %s", name, zn_last_error());

    int32_t ids[PK_N], tg[PK_N], pos[PK_N];
    uint64_t r = 0x9e3779b97f4a7c15ull;
    int valid = 0;
    for (int b = 0; b < PK_B; b++)
        for (int k = 0, at = 0; docs[b][k]; at += docs[b][k++])
            for (int i = 0; i < docs[b][k]; i++) {
                int t = b * PK_T + at + i;
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                ids[t] = (int32_t)((r >> 33) % (uint64_t)d.vocab);
                pos[t] = i;
            }
    /* each token predicts the next of its document; the last of each has
     * none, and one inside is ignored too (a loss mask) */
    for (int b = 0; b < PK_B; b++)
        for (int k = 0, at = 0; docs[b][k]; at += docs[b][k++])
            for (int i = 0; i < docs[b][k]; i++) {
                int t = b * PK_T + at + i;
                tg[t] = i + 1 < docs[b][k] && i != 2 ? ids[t + 1] : -1;
                valid += tg[t] >= 0;
            }

    /* packed */
    float loss_p = NAN;
    ZT_EQ_INT(zn_model_set_batch(m, NULL, PK_B, PK_T, ids, tg, pos), 0);
    ZT_EQ_INT(zn_model_state_zero_grads(st, NULL), 0);
    ZT_EQ_INT(zn_model_state_forward_backward(st, NULL, &loss_p), 0);
    float *lg_p = malloc((size_t)PK_N * (size_t)d.vocab * 4);
    ZT_EQ_INT(zn_model_state_logits(st, NULL, 0, PK_N, lg_p), 0);
    size_t ng;
    float *g_p = pk_grads(dev, st, &d, &ng);

    /* one document at a time */
    float *lg_s = malloc((size_t)PK_N * (size_t)d.vocab * 4);
    double loss_s = 0;
    ZT_EQ_INT(zn_model_state_zero_grads(st, NULL), 0);
    for (int b = 0; b < PK_B; b++)
        for (int k = 0, at = 0; docs[b][k]; at += docs[b][k++]) {
            int t0 = b * PK_T + at, len = docs[b][k];
            float l = NAN;
            ZT_EQ_INT(zn_model_set_batch(m, NULL, 1, len, ids + t0, tg + t0, NULL), 0);
            zn_model_set_loss_scale(m, 1.0f / (float)valid);
            ZT_EQ_INT(zn_model_state_forward_backward(st, NULL, &l), 0);
            ZT_EQ_INT(zn_model_state_logits(st, NULL, 0, len, lg_s + (size_t)t0 * d.vocab), 0);
            loss_s += l;
        }
    size_t ng2;
    float *g_s = pk_grads(dev, st, &d, &ng2);
    ZT_EQ_U64(ng, ng2);

    double el = fabs(loss_p - loss_s) / fabs(loss_s);
    double eg = pk_rel(g_p, g_s, ng);
    double elg = pk_rel(lg_p, lg_s, (size_t)PK_N * (size_t)d.vocab);
    ZT_CHECK_MSG(el <= tol, "%s %s: packed loss %.8f vs one at a time %.8f (rel %.2e)", name,
                 zn_dtype_name(dt), loss_p, loss_s, el);
    ZT_CHECK_MSG(elg <= tol, "%s %s: packed logits rel %.2e", name, zn_dtype_name(dt), elg);
    double tol_g = pk_grad_bound(dir, dt) > tol ? pk_grad_bound(dir, dt) : tol;
    ZT_CHECK_MSG(eg <= tol_g, "%s %s: packed gradients rel %.2e (bound %.1e)", name,
                 zn_dtype_name(dt), eg, tol_g);

    /* without positions the documents see each other: far off */
    float loss_x = NAN;
    ZT_EQ_INT(zn_model_set_batch(m, NULL, PK_B, PK_T, ids, tg, NULL), 0);
    ZT_EQ_INT(zn_model_state_forward(st, NULL, &loss_x), 0);
    float *lg_x = malloc((size_t)PK_N * (size_t)d.vocab * 4);
    ZT_EQ_INT(zn_model_state_logits(st, NULL, 0, PK_N, lg_x), 0);
    double ex = pk_rel(lg_x, lg_s, (size_t)PK_N * (size_t)d.vocab);
    ZT_CHECK_MSG(ex > 0.1 && ex > 100 * elg, "%s %s: unpacked logits only %.2e from the "
                 "documents' own (packed %.2e)", name, zn_dtype_name(dt), ex, elg);

    /* positions that do not start at 0 or count up are refused */
    int32_t bad[PK_N];
    memcpy(bad, pos, sizeof bad);
    bad[3] = 7;
    ZT_EQ_INT(zn_model_set_batch(m, NULL, PK_B, PK_T, ids, tg, bad), ZN_EARG);
    bad[3] = pos[3];
    bad[PK_T] = 1; /* a sequence's first token */
    ZT_EQ_INT(zn_model_set_batch(m, NULL, PK_B, PK_T, ids, tg, bad), ZN_EARG);

    printf("%-10s %-4s ckpt=%d packed vs one at a time: loss rel %.1e, logits %.1e, grads %.1e"
           " (unpacked logits %.1e)\n", name, zn_dtype_name(dt), checkpoint, el, elg, eg, ex);
    free(lg_p), free(lg_s), free(lg_x), free(g_p), free(g_s);
    zn_model_state_destroy(st);
    zn_model_destroy(m);
}


/* ---- the vocabulary in parts ------------------------------------------------
 * A model whose vocabulary is split in row parts (zn_model_part: here 1000
 * rows against a 9k-parameter layer, four parts) run block by block with
 * the part calls (embedding parts into a poisoned activation, head parts
 * forward in order and backward in reverse, as the offload trainer runs
 * them) gives the loss and every gradient of the whole-block calls. */
static void parts_run(zn_dev *dev, zn_dtype dt, double tol)
{
    zn_model_dims d;
    zn_model_dims_default(&d);
    d.hidden = 32;
    d.n_layers = 2;
    d.n_heads = 4;
    d.n_kv_heads = 2;
    d.head_dim = 8;
    d.intermediate = 64;
    d.vocab = 1000;
    d.tie_embeddings = 0;
    if (zn_model_dims_validate(&d))
        ZT_SETUP_FAIL("parts dims: %s", zn_last_error());
    const int L = (int)d.n_layers, E = zn_model_block_parts(&d, 0);
    const int K = zn_model_block_parts(&d, L + 1);
    ZT_CHECK_MSG(E >= 3 && K == E, "parts: %d embedding and %d head parts", E, K);
    zn_model_config cfg = zn_model_config_default(dev);
    cfg.dtype = dt;
    cfg.max_batch = PK_B;
    cfg.max_seq = PK_T;
    cfg.xent_chunk = 96; /* chunks that straddle the parts' row ranges */
    zn_model *m;
    zn_model_state *st;
    if (zn_model_create(&m, dev, &d, &cfg) || zn_model_state_create(&st, m, 1) ||
        zn_model_state_init_random(st, 7))
        ZT_SETUP_FAIL("parts model: %s", zn_last_error());
    int32_t ids[PK_N], tg[PK_N];
    for (int t = 0; t < PK_N; t++) {
        ids[t] = (int32_t)((t * 7919 + 13) % d.vocab);
        tg[t] = t % 5 == 4 ? -1 : (int32_t)((t * 6007 + 5) % d.vocab);
    }
    ZT_EQ_INT(zn_model_set_batch(m, NULL, PK_B, PK_T, ids, tg, NULL), 0);

    /* whole blocks */
    float loss_w = NAN;
    ZT_EQ_INT(zn_model_state_zero_grads(st, NULL), 0);
    ZT_EQ_INT(zn_model_state_forward_backward(st, NULL, &loss_w), 0);
    size_t ng;
    float *g_w = pk_grads(dev, st, &d, &ng);

    /* parts: every gradient into its own zeroed fp32 buffer, in the
     * order of pk_grads */
    size_t esz = zn_dtype_size(dt), ab = (size_t)zn_model_act_bytes(m);
    float *gall = NULL;
    void *x[8] = { 0 }, *dx[2] = { 0 };
    if (L + 1 > 8 || zn_dev_alloc(dev, ng * 4, "parts grads", (void **)&gall) ||
        zn_dev_memset(dev, NULL, gall, 0, ng * 4))
        ZT_SETUP_FAIL("parts: %s", zn_last_error());
    for (int i = 0; i <= L; i++)
        if (zn_dev_alloc(dev, ab, "parts x", &x[i]))
            ZT_SETUP_FAIL("parts: %s", zn_last_error());
    for (int i = 0; i < 2; i++)
        if (zn_dev_alloc(dev, ab, "parts dx", &dx[i]))
            ZT_SETUP_FAIL("parts: %s", zn_last_error());
    float *gb[8][MAX_PK_TENSORS];
    size_t at = 0;
    for (int b = 0; b <= L + 1; b++)
        for (int i = 0; i < zn_model_block_nparams(&d, b); i++) {
            zn_param_info pi;
            zn_model_block_param(&d, b, i, &pi);
            gb[b][i] = gall + at;
            at += (size_t)pi.numel;
        }
    int64_t H = d.hidden;
    void *const *pe = zn_model_state_params(st, 0), *const *ph = zn_model_state_params(st, L + 1);
    ZT_EQ_INT(zn_dev_memset(dev, NULL, x[0], 0xff, ab), 0); /* NaN: a row no part wrote */
    for (int p = 0; p < E; p++) {
        zn_model_part_info pt;
        zn_model_part(&d, p, &pt);
        ZT_EQ_INT(zn_model_embed_fwd_part(m, NULL, p, (char *)pe[0] + pt.row0 * H * esz, x[0]),
                  0);
    }
    for (int l = 0; l < L; l++)
        ZT_EQ_INT(zn_model_layer_fwd(m, NULL, l, zn_model_state_params(st, l + 1), x[l],
                                     x[l + 1], NULL), 0);
    int first_head = E + L;
    for (int p = 0; p < K; p++) {
        zn_model_part_info pt;
        zn_model_part(&d, first_head + p, &pt);
        ZT_EQ_INT(zn_model_head_fwd_part(m, NULL, p, p ? NULL : ph[0],
                                         (char *)ph[1] + pt.row0 * H * esz, x[L]), 0);
    }
    float loss_p = NAN;
    ZT_EQ_INT(zn_model_read_loss(m, NULL, &loss_p), 0);
    for (int p = K - 1; p >= 0; p--) {
        zn_model_part_info pt;
        zn_model_part(&d, first_head + p, &pt);
        ZT_EQ_INT(zn_model_head_bwd_part(m, NULL, p, p ? NULL : ph[0],
                                         (char *)ph[1] + pt.row0 * H * esz, x[L], dx[L & 1],
                                         p ? NULL : gb[L + 1][0], gb[L + 1][1] + pt.row0 * H),
                  0);
    }
    for (int l = L - 1; l >= 0; l--)
        ZT_EQ_INT(zn_model_layer_bwd(m, NULL, l, zn_model_state_params(st, l + 1), x[l], NULL,
                                     dx[(l + 1) & 1], dx[l & 1], gb[l + 1]), 0);
    for (int p = 0; p < E; p++) {
        zn_model_part_info pt;
        zn_model_part(&d, p, &pt);
        ZT_EQ_INT(zn_model_embed_bwd_part(m, NULL, p, dx[0], gb[0][0] + pt.row0 * H), 0);
    }
    float *g_p = malloc(ng * 4);
    if (!g_p || zn_dev_copy_d2h(dev, NULL, g_p, gall, ng * 4) || zn_dev_stream_sync(dev, NULL))
        ZT_SETUP_FAIL("parts: %s", zn_last_error());
    double el = fabs((double)loss_p - loss_w) / fabs((double)loss_w);
    double eg = pk_rel(g_p, g_w, ng);
    ZT_CHECK_MSG(el <= tol, "parts %s: loss %.8f vs whole blocks %.8f (rel %.2e)",
                 zn_dtype_name(dt), loss_p, loss_w, el);
    ZT_CHECK_MSG(eg <= tol, "parts %s: gradients rel %.2e", zn_dtype_name(dt), eg);
    printf("vocab in %d parts %-4s vs whole blocks: loss rel %.1e, grads %.1e\n", E,
           zn_dtype_name(dt), el, eg);
    free(g_w), free(g_p);
    for (int i = 0; i <= L; i++)
        zn_dev_free(dev, x[i]);
    zn_dev_free(dev, dx[0]), zn_dev_free(dev, dx[1]), zn_dev_free(dev, gall);
    zn_model_state_destroy(st);
    zn_model_destroy(m);
}

#endif
