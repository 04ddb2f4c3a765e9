/* Token data: the file format (round trip, every header error), the loader
 * (targets = inputs shifted by one, each epoch a permutation of the windows,
 * same seed => same batches, ranks' slices tile the global batch, vocab
 * checks) and the synthetic chain (deterministic, its measured conditional
 * entropy matches the stated one). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zinc/tokens.h"
#include "zt.h"

static char dir[64];

static const char *tpath(const char *name)
{
    static char bufs[4][256];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, 256, "%s/%s", dir, name);
    return b;
}

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void write_bytes(const char *name, const void *buf, size_t n)
{
    FILE *f = fopen(tpath(name), "wb");
    if (!f || fwrite(buf, 1, n, f) != n)
        ZT_SETUP_FAIL("write %s", name);
    fclose(f);
}

static void test_format(void)
{
    uint32_t ids[100];
    for (int i = 0; i < 100; i++)
        ids[i] = (uint32_t)(i * 613) % 1000;
    zn_tokens *t;
    for (int width = 2; width <= 4; width += 2) {
        ZT_EQ_INT(zn_tokens_write(tpath("a.tok"), ids, 100, width, 1000), 0);
        ZT_EQ_INT(zn_tokens_open(&t, tpath("a.tok")), 0);
        if (!t)
            continue;
        ZT_EQ_U64(zn_tokens_count(t), 100);
        ZT_EQ_INT(zn_tokens_vocab(t), 1000);
        ZT_EQ_INT(zn_tokens_width(t), width);
        int same = 1;
        for (int i = 0; i < 100; i++)
            same &= zn_tokens_get(t, (uint64_t)i) == ids[i];
        ZT_CHECK(same);
        zn_tokens_close(t);
    }
    /* The bytes on disk are the documented layout. */
    FILE *f = fopen(tpath("a.tok"), "rb");
    unsigned char h[40];
    ZT_CHECK(f && fread(h, 1, 40, f) == 40);
    if (f)
        fclose(f);
    ZT_CHECK(memcmp(h, "ZNTOKENS", 8) == 0);
    ZT_EQ_INT(h[8], 1);
    ZT_EQ_INT(h[12], 4);
    ZT_EQ_INT(h[16], 100);
    ZT_EQ_INT(h[24] | h[25] << 8, 1000);
    ZT_EQ_INT(h[32 + 4] | h[33 + 4] << 8, 613); /* ids[1], little-endian */

    ZT_EQ_INT(zn_tokens_write(tpath("b.tok"), ids, 100, 3, 0), ZN_EARG);
    ZT_EQ_INT(zn_tokens_write(tpath("b.tok"), ids, 100, 2, 500), ZN_EARG);
    ZT_CONTAINS(zn_last_error(), "token 1 ");
    uint32_t big = 70000;
    ZT_EQ_INT(zn_tokens_write(tpath("b.tok"), &big, 1, 2, 0), ZN_EARG);
    ZT_CHECK(access(tpath("b.tok"), F_OK) != 0);

    /* Header errors, each named. */
    unsigned char good[32 + 8] = { 0 };
    memcpy(good, "ZNTOKENS", 8);
    put32(good + 8, 1);
    put32(good + 12, 2);
    good[16] = 4;
    struct {
        const char *name;
        int off;
        uint32_t val;
        size_t len;
        const char *needle;
    } bad[] = {
        { "magic.tok", 0, 0x4b4f545a, 40, "magic" },
        { "version.tok", 8, 3, 40, "version 3" },
        { "width.tok", 12, 3, 40, "width 3" },
        { "count.tok", 16, 5, 40, "file size" },
        { "count_huge.tok", 20, 0x80000000u, 40, "file size" },
        { "truncated.tok", 28, 0, 39, "file size" },
        { "short.tok", 28, 0, 20, "too short" },
        { "vocab16.tok", 24, 70000, 40, "16-bit" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        unsigned char b[40];
        memcpy(b, good, 40);
        put32(b + bad[i].off, bad[i].val);
        write_bytes(bad[i].name, b, bad[i].len);
        t = (zn_tokens *)1;
        int rc = zn_tokens_open(&t, tpath(bad[i].name));
        ZT_CHECK_MSG(rc == ZN_ECORRUPT, "%s: rc %d (%s)", bad[i].name, rc, zn_last_error());
        ZT_CHECK(t == NULL);
        ZT_CONTAINS(zn_last_error(), bad[i].name);
        ZT_CONTAINS(zn_last_error(), bad[i].needle);
    }
    write_bytes("good.tok", good, 40);
    ZT_EQ_INT(zn_tokens_open(&t, tpath("good.tok")), 0);
    zn_tokens_close(t);
    ZT_EQ_INT(zn_tokens_open(&t, tpath("nope.tok")), -ENOENT);
    ZT_CONTAINS(zn_last_error(), "nope.tok");
}

static void test_loader(void)
{
    /* ids = position, so a window is identified by its first id. */
    enum { N = 1001, L = 10 };
    uint32_t *ids = malloc(N * sizeof *ids);
    for (uint32_t i = 0; i < N; i++)
        ids[i] = i;
    ZT_EQ_INT(zn_tokens_write(tpath("pos.tok"), ids, N, 2, 0), 0);
    zn_tokens *t;
    ZT_EQ_INT(zn_tokens_open(&t, tpath("pos.tok")), 0);
    if (!t)
        return;

    zn_loader_config c = zn_loader_config_default();
    c.seq_len = L;
    c.batch = 3;
    zn_loader *l, *l2;
    ZT_EQ_INT(zn_loader_create(&l, t, &c), 0);
    ZT_EQ_U64(zn_loader_num_windows(l), 100);
    ZT_EQ_U64(zn_loader_steps_per_epoch(l), 33);
    int32_t in[3 * L], tg[3 * L], in2[3 * L], tg2[3 * L];
    int seen[100] = { 0 }, shifted = 1, aligned = 1, in_order = 1;
    for (uint64_t s = 0; s < 33; s++) {
        ZT_EQ_INT(zn_loader_get(l, s, in, tg, NULL), 0);
        for (int b = 0; b < 3; b++) {
            aligned &= in[b * L] % L == 0;
            seen[in[b * L] / L]++;
            in_order &= in[b * L] == (int32_t)((s * 3 + (uint64_t)b) * L);
            for (int i = 0; i < L; i++)
                shifted &= tg[b * L + i] == in[b * L + i] + 1;
        }
    }
    ZT_CHECK(shifted);
    ZT_CHECK(aligned);
    ZT_CHECK(!in_order); /* shuffled */
    int dup = 0, visited = 0;
    for (int w = 0; w < 100; w++) {
        dup |= seen[w] > 1;
        visited += seen[w] > 0;
    }
    ZT_CHECK(!dup);
    ZT_EQ_INT(visited, 99); /* one window left over: 100 mod 3 */

    /* Same seed => same batches (also after visiting another epoch);
     * another seed or epoch => different ones. */
    ZT_EQ_INT(zn_loader_create(&l2, t, &c), 0);
    ZT_EQ_INT(zn_loader_get(l, 5, in, tg, NULL), 0);
    ZT_EQ_INT(zn_loader_get(l2, 40, in2, tg2, NULL), 0);
    ZT_EQ_INT(zn_loader_get(l2, 5, in2, tg2, NULL), 0);
    ZT_CHECK(memcmp(in, in2, sizeof in) == 0 && memcmp(tg, tg2, sizeof tg) == 0);
    ZT_EQ_INT(zn_loader_get(l2, 5 + 33, in2, tg2, NULL), 0);
    ZT_CHECK(memcmp(in, in2, sizeof in) != 0);
    zn_loader_destroy(l2);
    c.seed = 99;
    ZT_EQ_INT(zn_loader_create(&l2, t, &c), 0);
    ZT_EQ_INT(zn_loader_get(l2, 5, in2, tg2, NULL), 0);
    ZT_CHECK(memcmp(in, in2, sizeof in) != 0);
    zn_loader_destroy(l2);

    /* Unshuffled: file order. */
    c.shuffle = 0;
    ZT_EQ_INT(zn_loader_create(&l2, t, &c), 0);
    ZT_EQ_INT(zn_loader_get(l2, 2, in2, tg2, NULL), 0);
    ZT_EQ_INT(in2[0], 6 * L);
    ZT_EQ_INT(in2[2 * L + L - 1], 8 * L + L - 1);
    zn_loader_destroy(l2);
    zn_loader_destroy(l);

    /* Data parallel: ranks 0..1 of 2 with batch 2 tile world 1 batch 4. */
    c = zn_loader_config_default();
    c.seq_len = L;
    c.batch = 4;
    ZT_EQ_INT(zn_loader_create(&l, t, &c), 0);
    int32_t all[4 * L], allt[4 * L], r0[2 * L], r1[2 * L], rt[2 * L];
    c.batch = 2;
    c.world = 2;
    zn_loader *lr0, *lr1;
    c.rank = 0;
    ZT_EQ_INT(zn_loader_create(&lr0, t, &c), 0);
    c.rank = 1;
    ZT_EQ_INT(zn_loader_create(&lr1, t, &c), 0);
    int tiles = 1;
    for (uint64_t s = 0; s < 30; s++) {
        ZT_EQ_INT(zn_loader_get(l, s, all, allt, NULL), 0);
        ZT_EQ_INT(zn_loader_get(lr0, s, r0, rt, NULL), 0);
        ZT_EQ_INT(zn_loader_get(lr1, s, r1, rt, NULL), 0);
        tiles &= !memcmp(all, r0, sizeof r0) && !memcmp(all + 2 * L, r1, sizeof r1);
    }
    ZT_CHECK(tiles);
    zn_loader_destroy(l);
    zn_loader_destroy(lr0);
    zn_loader_destroy(lr1);
    c.rank = 2;
    ZT_EQ_INT(zn_loader_create(&l, t, &c), ZN_EARG);

    /* Too little data for one global batch. */
    c = zn_loader_config_default();
    c.seq_len = 500;
    c.batch = 4;
    ZT_EQ_INT(zn_loader_create(&l, t, &c), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "pos.tok");
    /* ... unless partial (evaluation): one batch, filled up with windows of
     * no target past the data */
    c.partial = 1;
    c.shuffle = 0;
    if (zn_loader_create(&l, t, &c) == 0) {
        uint64_t nw = zn_loader_num_windows(l);
        ZT_CHECK_MSG(nw >= 1 && nw < 4 && zn_loader_steps_per_epoch(l) == 1,
                     "partial: %llu windows, %llu steps", (unsigned long long)nw,
                     (unsigned long long)zn_loader_steps_per_epoch(l));
        int32_t *pin = malloc(4 * 500 * 4), *ptg = malloc(4 * 500 * 4);
        ZT_EQ_INT(zn_loader_get(l, 0, pin, ptg, NULL), 0);
        int real = 0, pad = 0;
        for (int64_t i = 0; i < 4 * 500; i++) {
            if (i < (int64_t)nw * 500)
                real += ptg[i] >= 0;
            else
                pad += ptg[i] >= 0;
        }
        ZT_CHECK_MSG(real > 0 && pad == 0, "partial batch: %d targets in the data, %d past it",
                     real, pad);
        free(pin);
        free(ptg);
        zn_loader_destroy(l);
    } else {
        ZT_CHECK_MSG(0, "partial loader refused: %s", zn_last_error());
    }

    /* Ids beyond the model's vocab. */
    c = zn_loader_config_default();
    c.seq_len = L;
    c.batch = 1;
    c.shuffle = 0;
    c.vocab = 500;
    ZT_EQ_INT(zn_loader_create(&l, t, &c), 0);
    ZT_EQ_INT(zn_loader_get(l, 10, in, tg, NULL), 0);
    ZT_EQ_INT(zn_loader_get(l, 50, in, tg, NULL), ZN_ECORRUPT);
    ZT_CONTAINS(zn_last_error(), "token 500");
    zn_loader_destroy(l);
    zn_tokens_close(t);
    ZT_EQ_INT(zn_tokens_write(tpath("v.tok"), ids, 100, 2, 1000), 0);
    ZT_EQ_INT(zn_tokens_open(&t, tpath("v.tok")), 0);
    c.vocab = 320;
    ZT_EQ_INT(zn_loader_create(&l, t, &c), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "320");
    zn_tokens_close(t);
    free(ids);
}

static void test_synthetic(void)
{
    enum { V = 64, N = 400000 };
    zn_tokens *a, *b, *c, *d;
    ZT_EQ_INT(zn_tokens_synthetic(&a, N, V, 7), 0);
    ZT_EQ_INT(zn_tokens_synthetic(&b, N, V, 7), 0);
    ZT_EQ_INT(zn_tokens_synthetic(&c, N, V, 8), 0);
    ZT_EQ_INT(zn_tokens_synthetic(&d, N, 4, 8), ZN_EARG);
    if (!a || !b || !c)
        return;
    ZT_EQ_INT(zn_tokens_vocab(a), V);
    ZT_EQ_STR(zn_tokens_name(a), "synthetic");
    int same = 1, inrange = 1, differs = 0;
    static uint32_t counts[V][V];
    for (uint64_t i = 0; i < N; i++) {
        uint32_t x = zn_tokens_get(a, i);
        same &= x == zn_tokens_get(b, i);
        differs |= x != zn_tokens_get(c, i);
        inrange &= x < V;
        if (i + 1 < N && x < V && zn_tokens_get(a, i + 1) < V)
            counts[x][zn_tokens_get(a, i + 1)]++;
    }
    ZT_CHECK(same);
    ZT_CHECK(differs);
    ZT_CHECK(inrange);
    /* Empirical conditional entropy H(next | cur) ~ the stated entropy. */
    double h = 0;
    int max_succ = 0;
    for (int x = 0; x < V; x++) {
        double row = 0;
        int succ = 0;
        for (int y = 0; y < V; y++) {
            row += counts[x][y];
            succ += counts[x][y] > 0;
        }
        if (succ > max_succ)
            max_succ = succ;
        for (int y = 0; y < V; y++)
            if (counts[x][y])
                h -= counts[x][y] / (double)(N - 1) * log(counts[x][y] / row);
    }
    ZT_EQ_INT(max_succ, 4);
    ZT_CHECK_MSG(fabs(h - zn_tokens_synthetic_entropy()) < 0.02, "entropy %f vs %f", h,
                 zn_tokens_synthetic_entropy());
    ZT_CHECK(fabs(zn_tokens_synthetic_entropy() - 1.0634) < 1e-3);
    /* A loader works on synthetic data. */
    zn_loader_config cfg = zn_loader_config_default();
    cfg.vocab = V;
    zn_loader *l;
    ZT_EQ_INT(zn_loader_create(&l, a, &cfg), 0);
    int32_t in[4 * 256], tg[4 * 256];
    ZT_EQ_INT(zn_loader_get(l, 3, in, tg, NULL), 0);
    zn_loader_destroy(l);
    zn_tokens_close(a);
    zn_tokens_close(b);
    zn_tokens_close(c);
}

/* Version 2: a loss mask and document ends. The bytes on disk are the
 * documented layout; the loader turns masked targets and the first token of
 * each document (after the first) into -1; corrupt sections are refused
 * naming the file and what is wrong. */
static void test_v2(void)
{
    enum { N = 41, L = 8 };
    uint32_t ids[N];
    uint8_t mask[N];
    for (int i = 0; i < N; i++) {
        ids[i] = (uint32_t)(i * 7 + 3) % 50;
        mask[i] = (uint8_t)(i % 5 != 0);   /* every fifth token not a target */
    }
    uint64_t ends[3] = { 10, 23, N };
    ZT_EQ_INT(zn_tokens_write2(tpath("v2.tok"), ids, N, 2, 50, mask, ends, 3), 0);
    zn_tokens *t;
    ZT_EQ_INT(zn_tokens_open(&t, tpath("v2.tok")), 0);
    if (!t)
        return;
    ZT_CHECK(zn_tokens_has_mask(t));
    ZT_EQ_U64(zn_tokens_num_docs(t), 3);
    int ok = 1;
    for (int i = 0; i < N; i++) {
        ok &= zn_tokens_get(t, (uint64_t)i) == ids[i];
        ok &= zn_tokens_is_target(t, (uint64_t)i) == (mask[i] != 0);
        ok &= zn_tokens_doc_start(t, (uint64_t)i) == (i == 10 || i == 23);
    }
    ZT_CHECK(ok);
    /* the loader: file order, window w = ids [w*L, w*L + L] */
    zn_loader_config lc = zn_loader_config_default();
    lc.seq_len = L;
    lc.batch = 5;
    lc.shuffle = 0;
    zn_loader *l;
    ZT_EQ_INT(zn_loader_create(&l, t, &lc), 0);
    int32_t in[5 * L], tg[5 * L], ps[5 * L];
    ZT_EQ_INT(zn_loader_get(l, 0, in, tg, ps), 0);
    int bad = 0, badp = 0;
    for (int w = 0; w < 5; w++)
        for (int k = 0; k < L; k++) {
            int j = w * L + k + 1;  /* the token this target predicts */
            int32_t want = (j % 5 != 0 && j != 10 && j != 23) ? (int32_t)ids[j] : -1;
            bad += tg[w * L + k] != want || in[w * L + k] != (int32_t)ids[j - 1];
            /* packed: the position in the document, from 0 at each start
             * and at the window's start */
            int doc0 = j - 1 >= 23 ? 23 : j - 1 >= 10 ? 10 : 0, w0 = w * L;
            badp += ps[w * L + k] != j - 1 - (doc0 > w0 ? doc0 : w0);
        }
    ZT_CHECK_MSG(!bad, "%d inputs/targets differ from the mask and document ends", bad);
    ZT_CHECK_MSG(!badp, "%d positions differ from the packed documents'", badp);
    zn_loader_destroy(l);
    /* padding: one window per document piece; documents of 10, 13 and 18
     * tokens have 9, 12 and 17 inputs: pieces 8+1, 8+4, 8+8+1 = 7 windows */
    lc.packing = 0;
    lc.batch = 7;
    ZT_EQ_INT(zn_loader_create(&l, t, &lc), 0);
    ZT_EQ_U64(zn_loader_num_windows(l), 7);
    int32_t pin[7 * L], ptg[7 * L], pps[7 * L];
    ZT_EQ_INT(zn_loader_get(l, 0, pin, ptg, pps), 0);
    static const int wstart[7] = { 0, 8, 10, 18, 23, 31, 39 };
    static const int wlen[7] = { 8, 1, 8, 4, 8, 8, 1 };
    bad = 0;
    for (int w = 0; w < 7; w++)
        for (int k = 0; k < L; k++) {
            int j = wstart[w] + k + 1, real = k < wlen[w], at = w * L + k;
            int32_t want = real && j % 5 != 0 ? (int32_t)ids[j] : -1;
            bad += ptg[at] != want || pps[at] != k ||
                   pin[at] != (int32_t)ids[wstart[w] + (real ? k : wlen[w] - 1)];
        }
    ZT_CHECK_MSG(!bad, "%d padded inputs/targets/positions differ", bad);
    zn_loader_destroy(l);
    lc.batch = 8; /* more than the 7 windows padding makes */
    ZT_EQ_INT(zn_loader_create(&l, t, &lc), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "padded");
    zn_tokens_close(t);
    /* on disk: version 2, flags 3, then ids, ceil(41 / 8) = 6 mask bytes,
     * u64 3, the three ends */
    FILE *f = fopen(tpath("v2.tok"), "rb");
    unsigned char b[32 + 2 * N + 6 + 8 + 24];
    ZT_CHECK(f && fread(b, 1, sizeof b, f) == sizeof b && fgetc(f) == EOF);
    if (f)
        fclose(f);
    ZT_EQ_INT(b[8], 2);
    ZT_EQ_INT(b[28], 3);
    ZT_EQ_INT(b[32 + 2 * N], 0xde);           /* tokens 0-7: 0 and 5 not targets */
    ZT_EQ_INT(b[32 + 2 * N + 6], 3);           /* ndocs */
    ZT_EQ_INT(b[32 + 2 * N + 6 + 8], 10);      /* the first end */
    /* corrupt: an end out of order, a truncated section, unknown flags */
    unsigned char c[sizeof b];
    memcpy(c, b, sizeof c);
    c[32 + 2 * N + 6 + 16] = 5;                /* second end 5 < 10 */
    write_bytes("v2bad1.tok", c, sizeof c);
    ZT_EQ_INT(zn_tokens_open(&t, tpath("v2bad1.tok")), ZN_ECORRUPT);
    ZT_CONTAINS(zn_last_error(), "document 1 ends at 5");
    write_bytes("v2bad2.tok", b, sizeof b - 4);
    ZT_EQ_INT(zn_tokens_open(&t, tpath("v2bad2.tok")), ZN_ECORRUPT);
    ZT_CONTAINS(zn_last_error(), "v2bad2.tok");
    memcpy(c, b, sizeof c);
    c[28] = 9;
    write_bytes("v2bad3.tok", c, sizeof c);
    ZT_EQ_INT(zn_tokens_open(&t, tpath("v2bad3.tok")), ZN_ECORRUPT);
    ZT_CONTAINS(zn_last_error(), "unknown flags");
    uint64_t badends[2] = { 10, 40 };
    ZT_EQ_INT(zn_tokens_write2(tpath("x.tok"), ids, N, 2, 50, NULL, badends, 2), ZN_EARG);
    /* a version 1 file keeps reading, every token a target */
    ZT_EQ_INT(zn_tokens_write(tpath("v1.tok"), ids, N, 2, 50), 0);
    ZT_EQ_INT(zn_tokens_open(&t, tpath("v1.tok")), 0);
    if (t) {
        ZT_CHECK(!zn_tokens_has_mask(t) && zn_tokens_is_target(t, 5) &&
                 !zn_tokens_doc_start(t, 10));
        zn_tokens_close(t);
    }
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/zn_tok_XXXXXX");
    if (!mkdtemp(dir))
        ZT_SETUP_FAIL("mkdtemp");
    test_format();
    test_loader();
    test_synthetic();
    test_v2();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return zt_done();
}
