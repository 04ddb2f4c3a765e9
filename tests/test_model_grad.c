/* Backward of every block against central finite differences of a plain
 * double-precision reference forward written here (rmsnorm, projections with
 * q/k/v and o bias, RoPE, GQA causal softmax attention, SwiGLU, residuals,
 * chunked cross-entropy with ignored targets, embedding with repeated ids).
 * The device (host backend, fp32) must match the reference forward to 1e-5
 * and the finite-difference gradients of every input and parameter to 1e-4
 * (relative, per tensor), with checkpointing on and off. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/model.h"
#include "zt.h"

enum { B = 2, T = 5, H = 8, NH = 4, NKV = 2, HD = 4, QD = NH * HD, KVD = NKV * HD, I = 12,
       V = 24, N = B * T, LD = QD + 2 * KVD };
static const double EPS = 1e-5;

static zn_dev *dev;
static uint64_t rng = 12345;

static double urand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * 0x1.0p-53 * 2.0 - 1.0;
}

static float inv_freq[HD / 2];
static int32_t pos[N];

/* ---- double reference ------------------------------------------------------ */

static void rmsnorm(const double *x, const double *w, double *y, int rows, int dim)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int j = 0; j < dim; j++)
            s += x[r * dim + j] * x[r * dim + j];
        double rs = 1.0 / sqrt(s / dim + EPS);
        for (int j = 0; j < dim; j++)
            y[r * dim + j] = w[j] * x[r * dim + j] * rs;
    }
}

/* y[N][out] (+)= x[N][in] W^T + b */
static void linear(const double *x, int in, const double *W, const double *b, int out, double *y,
                   int ldy, int add)
{
    for (int r = 0; r < N; r++)
        for (int o = 0; o < out; o++) {
            double s = b ? b[o] : 0;
            for (int k = 0; k < in; k++)
                s += x[r * in + k] * W[o * in + k];
            y[r * ldy + o] = (add ? y[r * ldy + o] : 0) + s;
        }
}

static void rope(double *x, int heads)
{
    for (int t = 0; t < N; t++)
        for (int h = 0; h < heads; h++) {
            double *p = x + t * LD + h * HD;
            for (int i = 0; i < HD / 2; i++) {
                float a = (float)pos[t] * inv_freq[i];
                double c = cos((double)a), s = sin((double)a), x1 = p[i], x2 = p[i + HD / 2];
                p[i] = x1 * c - x2 * s;
                p[i + HD / 2] = x2 * c + x1 * s;
            }
        }
}

enum { S_IN, S_WQ, S_WK, S_WV, S_WO, S_POST, S_WG, S_WU, S_WD, S_BQ, S_BK, S_BV, S_BO, NS };
static const int slot_n[NS] = { H, QD * H, KVD * H, KVD * H, H * QD, H, I * H, I * H, H * I,
                                QD, KVD, KVD, H };

static void layer_ref(const double *x, double *const *p, double *out)
{
    static double h1[N * H], qkv[N * LD], att[N * QD], xm[N * H], h2[N * H], g[N * I], u[N * I];
    rmsnorm(x, p[S_IN], h1, N, H);
    linear(h1, H, p[S_WQ], p[S_BQ], QD, qkv, LD, 0);
    linear(h1, H, p[S_WK], p[S_BK], KVD, qkv + QD, LD, 0);
    linear(h1, H, p[S_WV], p[S_BV], KVD, qkv + QD + KVD, LD, 0);
    rope(qkv, NH);
    rope(qkv + QD, NKV);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int j = h / (NH / NKV);
            for (int t = 0; t < T; t++) {
                double sc[T], mx = -1e300, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double d = 0;
                    for (int k = 0; k < HD; k++)
                        d += qkv[(b * T + t) * LD + h * HD + k] *
                             qkv[(b * T + s) * LD + QD + j * HD + k];
                    sc[s] = d / sqrt((double)HD);
                    mx = sc[s] > mx ? sc[s] : mx;
                }
                for (int s = 0; s <= t; s++)
                    sum += (sc[s] = exp(sc[s] - mx));
                for (int k = 0; k < HD; k++) {
                    double o = 0;
                    for (int s = 0; s <= t; s++)
                        o += sc[s] / sum * qkv[(b * T + s) * LD + QD + KVD + j * HD + k];
                    att[(b * T + t) * QD + h * HD + k] = o;
                }
            }
        }
    memcpy(xm, x, sizeof xm);
    linear(att, QD, p[S_WO], p[S_BO], H, xm, H, 1);
    rmsnorm(xm, p[S_POST], h2, N, H);
    linear(h2, H, p[S_WG], NULL, I, g, I, 0);
    linear(h2, H, p[S_WU], NULL, I, u, I, 0);
    for (int k = 0; k < N * I; k++)
        g[k] = g[k] / (1 + exp(-g[k])) * u[k];
    memcpy(out, xm, sizeof xm);
    linear(g, I, p[S_WD], NULL, H, out, H, 1);
}

static double dot(const double *a, const double *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* ---- device helpers ---------------------------------------------------------- */

static void *upload(const double *x, int n)
{
    void *p;
    float *f = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++)
        f[i] = (float)x[i];
    if (zn_dev_alloc(dev, (size_t)n * 4, "test", &p) ||
        zn_dev_copy_h2d(dev, NULL, p, f, (size_t)n * 4) || zn_dev_stream_sync(dev, NULL))
        ZT_SETUP_FAIL("upload: %s", zn_last_error());
    free(f);
    return p;
}

static void *zeros(int n)
{
    void *p;
    if (zn_dev_alloc(dev, (size_t)n * 4, "test", &p) || zn_dev_memset(dev, NULL, p, 0, (size_t)n * 4))
        ZT_SETUP_FAIL("alloc: %s", zn_last_error());
    return p;
}

static void download(double *x, const void *p, int n)
{
    float *f = malloc((size_t)n * 4);
    if (zn_dev_copy_d2h(dev, NULL, f, p, (size_t)n * 4) || zn_dev_stream_sync(dev, NULL))
        ZT_SETUP_FAIL("download: %s", zn_last_error());
    for (int i = 0; i < n; i++)
        x[i] = f[i];
    free(f);
}

/* Relative error of a against b in the 2-norm. */
static double rel(const double *a, const double *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

static zn_model *make_model(int checkpoint, int64_t chunk)
{
    zn_model_dims d;
    zn_model_dims_default(&d);
    d.hidden = H;
    d.n_layers = 1;
    d.n_heads = NH;
    d.n_kv_heads = NKV;
    d.head_dim = HD;
    d.intermediate = I;
    d.vocab = V;
    d.rms_eps = EPS;
    d.qkv_bias = d.o_bias = 1;
    d.rope_theta = 100.0; /* large angles even at these few positions */
    zn_model_config c = zn_model_config_default(dev);
    c.max_batch = B;
    c.max_seq = T;
    c.checkpoint = checkpoint;
    c.xent_chunk = chunk;
    zn_model *m;
    if (zn_model_create(&m, dev, &d, &c))
        ZT_SETUP_FAIL("model: %s", zn_last_error());
    zn_rope_inv_freq(inv_freq, HD, d.rope_theta, NULL);
    return m;
}

static void set_batch(zn_model *m, const int32_t *ids, const int32_t *tg)
{
    if (zn_model_set_batch(m, NULL, B, T, ids, tg, NULL))
        ZT_SETUP_FAIL("batch: %s", zn_last_error());
}

static void test_layer(int checkpoint)
{
    static const char *names[NS] = { "in_norm", "wq", "wk", "wv", "wo", "post_norm", "wg", "wu",
                                     "wd", "bq", "bk", "bv", "bo" };
    zn_model *m = make_model(checkpoint, 0);
    int32_t ids[N] = { 0 }, tg[N] = { 0 };
    set_batch(m, ids, tg);
    for (int t = 0; t < N; t++)
        pos[t] = t % T;

    double *p[NS], x[N * H], c[N * H], ref[N * H], got[N * H];
    void *dp[NS];
    float *dg[NS];
    for (int s = 0; s < NS; s++) {
        p[s] = malloc((size_t)slot_n[s] * sizeof(double));
        for (int i = 0; i < slot_n[s]; i++)
            p[s][i] = (s == S_IN || s == S_POST) ? 1.0 + 0.3 * urand() : 0.6 * urand();
        dp[s] = upload(p[s], slot_n[s]);
        dg[s] = zeros(slot_n[s]);
    }
    for (int i = 0; i < N * H; i++) {
        x[i] = urand();
        c[i] = urand();
    }
    void *dx_in = upload(x, N * H), *dy = upload(c, N * H), *dout = zeros(N * H),
         *ddx = zeros(N * H), *saved = NULL;
    if (!checkpoint && zn_dev_alloc(dev, zn_model_layer_saved_bytes(m), "saved", &saved))
        ZT_SETUP_FAIL("saved: %s", zn_last_error());
    ZT_EQ_INT(zn_model_layer_fwd(m, NULL, 0, dp, dx_in, dout, saved), 0);
    layer_ref(x, p, ref);
    download(got, dout, N * H);
    double ef = rel(got, ref, N * H);
    ZT_CHECK_MSG(ef < 1e-5, "layer forward rel err %.2e", ef);
    ZT_EQ_INT(zn_model_layer_bwd(m, NULL, 0, dp, dx_in, saved, dy, ddx, dg), 0);

    /* Finite differences of L = sum(c * layer(x)). */
    const double h = 1e-5;
    double worst = 0;
    for (int s = -1; s < NS; s++) {
        double *v = s < 0 ? x : p[s];
        int n = s < 0 ? N * H : slot_n[s];
        double *fd = malloc((size_t)n * sizeof(double)), *an = malloc((size_t)n * sizeof(double));
        for (int i = 0; i < n; i++) {
            double keep = v[i], lp, lm;
            v[i] = keep + h;
            layer_ref(x, p, ref);
            lp = dot(ref, c, N * H);
            v[i] = keep - h;
            layer_ref(x, p, ref);
            lm = dot(ref, c, N * H);
            v[i] = keep;
            fd[i] = (lp - lm) / (2 * h);
        }
        download(an, s < 0 ? ddx : (void *)dg[s], n);
        double e = rel(an, fd, n);
        worst = e > worst ? e : worst;
        ZT_CHECK_MSG(e < 1e-4, "layer (ckpt %d) d%s: rel err %.2e vs finite differences",
                     checkpoint, s < 0 ? "x" : names[s], e);
        free(fd);
        free(an);
    }
    printf("layer ckpt=%d: forward rel %.1e, worst gradient rel %.1e\n", checkpoint, ef, worst);
    for (int s = 0; s < NS; s++) {
        free(p[s]);
        zn_dev_free(dev, dp[s]);
        zn_dev_free(dev, dg[s]);
    }
    zn_dev_free(dev, dx_in);
    zn_dev_free(dev, dy);
    zn_dev_free(dev, dout);
    zn_dev_free(dev, ddx);
    zn_dev_free(dev, saved);
    zn_model_destroy(m);
}

static const int32_t head_tg[N] = { 3, 23, -1, 0, 7, 7, 15, -100, 22, 11 };

static double head_ref(const double *x, const double *w, const double *W)
{
    double hn[N * H], loss = 0;
    int valid = 0;
    rmsnorm(x, w, hn, N, H);
    for (int r = 0; r < N; r++) {
        if (head_tg[r] < 0)
            continue;
        double lg[V], mx = -1e300, s = 0;
        for (int v = 0; v < V; v++) {
            lg[v] = dot(hn + r * H, W + v * H, H);
            mx = lg[v] > mx ? lg[v] : mx;
        }
        for (int v = 0; v < V; v++)
            s += exp(lg[v] - mx);
        loss += mx + log(s) - lg[head_tg[r]];
        valid++;
    }
    return loss / valid;
}

static void test_head(void)
{
    zn_model *m = make_model(1, 10); /* 3 chunks: 10, 10, 4 */
    int32_t ids[N] = { 0 };
    set_batch(m, ids, head_tg);
    ZT_EQ_INT(zn_model_batch_tokens(m), 8);
    double x[N * H], w[H], W[V * H];
    for (int i = 0; i < N * H; i++)
        x[i] = urand();
    for (int i = 0; i < H; i++)
        w[i] = 1 + 0.3 * urand();
    for (int i = 0; i < V * H; i++)
        W[i] = urand();
    void *dx_in = upload(x, N * H), *dw = upload(w, H), *dW = upload(W, V * H);
    void *params[2] = { dw, dW };
    float *grads[2] = { zeros(H), zeros(V * H) };
    void *ddx = zeros(N * H);
    ZT_EQ_INT(zn_model_head_fwd(m, NULL, params, dx_in), 0);
    float loss;
    ZT_EQ_INT(zn_model_read_loss(m, NULL, &loss), 0);
    double want = head_ref(x, w, W);
    ZT_CHECK_MSG(fabs(loss - want) / want < 1e-6, "head loss %.8f vs %.8f", loss, want);
    ZT_EQ_INT(zn_model_head_bwd(m, NULL, params, dx_in, ddx, grads), 0);
    const double h = 1e-5;
    double *vs[3] = { x, w, W };
    int ns[3] = { N * H, H, V * H };
    void *an_src[3] = { ddx, grads[0], grads[1] };
    const char *nm[3] = { "dx", "dnorm", "dlm_head" };
    for (int k = 0; k < 3; k++) {
        double *fd = malloc((size_t)ns[k] * sizeof(double)), *an = malloc((size_t)ns[k] * sizeof(double));
        for (int i = 0; i < ns[k]; i++) {
            double keep = vs[k][i];
            vs[k][i] = keep + h;
            double lp = head_ref(x, w, W);
            vs[k][i] = keep - h;
            double lm = head_ref(x, w, W);
            vs[k][i] = keep;
            fd[i] = (lp - lm) / (2 * h);
        }
        download(an, an_src[k], ns[k]);
        double e = rel(an, fd, ns[k]);
        ZT_CHECK_MSG(e < 1e-4, "head %s: rel err %.2e vs finite differences", nm[k], e);
        printf("head %s: rel %.1e\n", nm[k], e);
        free(fd);
        free(an);
    }
    /* Logits of two rows through head_logits. */
    void *lg = zeros(2 * V);
    ZT_EQ_INT(zn_model_head_logits(m, NULL, params, dx_in, 3, 2, lg), 0);
    double got[2 * V], hn[N * H], exp_l[2 * V];
    download(got, lg, 2 * V);
    rmsnorm(x, w, hn, N, H);
    for (int r = 0; r < 2; r++)
        for (int v = 0; v < V; v++)
            exp_l[r * V + v] = dot(hn + (3 + r) * H, W + v * H, H);
    ZT_CHECK(rel(got, exp_l, 2 * V) < 1e-5);
    zn_dev_free(dev, lg);
    zn_dev_free(dev, dx_in);
    zn_dev_free(dev, dw);
    zn_dev_free(dev, dW);
    zn_dev_free(dev, grads[0]);
    zn_dev_free(dev, grads[1]);
    zn_dev_free(dev, ddx);
    zn_model_destroy(m);
}

static void test_embedding(void)
{
    zn_model *m = make_model(1, 0);
    int32_t ids[N] = { 5, 5, 0, 23, 5, 1, 2, 23, 9, 9 }, tg[N] = { 0 };
    set_batch(m, ids, tg);
    double E[V * H], c[N * H], out[N * H], g[V * H] = { 0 }, an[V * H];
    for (int i = 0; i < V * H; i++)
        E[i] = urand();
    for (int i = 0; i < N * H; i++)
        c[i] = urand();
    void *dE = upload(E, V * H), *dc = upload(c, N * H), *dout = zeros(N * H);
    float *dg = zeros(V * H);
    void *params[1] = { dE };
    ZT_EQ_INT(zn_model_embed_fwd(m, NULL, params, dout), 0);
    download(out, dout, N * H);
    int same = 1;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < H; j++) {
            same &= out[t * H + j] == (double)(float)E[ids[t] * H + j];
            g[ids[t] * H + j] += c[t * H + j]; /* d sum(c * E[ids]) / dE: exact */
        }
    ZT_CHECK(same);
    ZT_EQ_INT(zn_model_embed_bwd(m, NULL, params, dc, &dg), 0);
    download(an, dg, V * H);
    ZT_CHECK_MSG(rel(an, g, V * H) < 1e-6, "embedding grad rel err %.2e", rel(an, g, V * H));
    /* Out-of-vocab ids are refused at set_batch. */
    ids[3] = V;
    ZT_EQ_INT(zn_model_set_batch(m, NULL, B, T, ids, tg, NULL), ZN_EARG);
    ZT_CONTAINS(zn_last_error(), "vocab");
    ZT_EQ_INT(zn_model_set_batch(m, NULL, B, T + 1, ids, tg, NULL), ZN_EARG);
    zn_dev_free(dev, dE);
    zn_dev_free(dev, dc);
    zn_dev_free(dev, dout);
    zn_dev_free(dev, dg);
    zn_model_destroy(m);
}

int main(void)
{
    zn_dev_config dc = zn_dev_config_default();
    dc.name = "host";
    dc.gpu_budget = 64u << 20;
    if (zn_dev_create(&dev, &dc))
        ZT_SETUP_FAIL("host device: %s", zn_last_error());
    test_layer(1);
    test_layer(0);
    test_head();
    test_embedding();
    zn_dev_destroy(dev);
    return zt_done();
}
