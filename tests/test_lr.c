/* Learning-rate schedules against DeepSpeed's lr_schedules.py formulas
 * (values worked out by hand), the dynamic loss scaler's state machine, and
 * the trace writer (busy-time union, Chrome JSON that parses). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "zinc/optim.h"
#include "zinc/trace.h"
#include "zt.h"

#define NEAR(a, b) ZT_CHECK_MSG(fabs((a) - (b)) <= 1e-12 + 1e-9 * fabs(b), \
                                "%s = %.12g, expected %.12g", #a, (double)(a), (double)(b))

static void test_lr(void)
{
    zn_lr_sched s;
    memset(&s, 0, sizeof s);
    s.type = ZN_SCHED_NONE;
    NEAR(zn_lr_schedule(&s, 0.5, 7), 0.5);

    s.type = ZN_SCHED_WARMUP_LR;
    s.warmup_min_lr = 0.0;
    s.warmup_max_lr = 0.01;
    s.warmup_num_steps = 5;
    s.warmup_type = 1; /* linear: gamma = it / W */
    NEAR(zn_lr_schedule(&s, 1, -1), 0.0);
    NEAR(zn_lr_schedule(&s, 1, 0), 0.0);
    NEAR(zn_lr_schedule(&s, 1, 2), 0.004);
    NEAR(zn_lr_schedule(&s, 1, 5), 0.01);
    NEAR(zn_lr_schedule(&s, 1, 1000), 0.01);
    s.warmup_type = 0; /* log: gamma = ln(it + 1) / ln(W) */
    s.warmup_num_steps = 10;
    s.warmup_min_lr = 0.001;
    NEAR(zn_lr_schedule(&s, 1, 0), 0.001);
    NEAR(zn_lr_schedule(&s, 1, 4), 0.001 + 0.009 * log(5.0) / log(10.0));
    NEAR(zn_lr_schedule(&s, 1, 9), 0.01);
    s.warmup_num_steps = 0; /* W = max(2, W) */
    NEAR(zn_lr_schedule(&s, 1, 1), 0.001 + 0.009 * log(2.0) / log(2.0));

    s.type = ZN_SCHED_WARMUP_DECAY_LR;
    s.warmup_type = 1;
    s.warmup_min_lr = 0.0;
    s.warmup_num_steps = 5;
    s.total_num_steps = 20;
    NEAR(zn_lr_schedule(&s, 1, 3), 0.006);
    NEAR(zn_lr_schedule(&s, 1, 5), 0.01);
    NEAR(zn_lr_schedule(&s, 1, 10), 0.01 * 10.0 / 15.0);
    NEAR(zn_lr_schedule(&s, 1, 20), 0.0);
    NEAR(zn_lr_schedule(&s, 1, 25), 0.0);

    s.type = ZN_SCHED_WARMUP_COSINE_LR;
    s.total_num_steps = 60;
    s.warmup_min_ratio = 0.1;
    s.cos_min_ratio = 1e-4;
    double base = 0.003;
    NEAR(zn_lr_schedule(&s, base, -1), 0.0);
    NEAR(zn_lr_schedule(&s, base, 0), base * 0.1);
    NEAR(zn_lr_schedule(&s, base, 2), base * (0.1 + 0.4 * 0.9));
    NEAR(zn_lr_schedule(&s, base, 5),
         base * (1e-4 + (1 - 1e-4) * (1 + cos(M_PI * 1.0 / 55.0)) / 2));
    NEAR(zn_lr_schedule(&s, base, 59), base * 1e-4);
}

static void test_scaler(void)
{
    zn_loss_scale_config f;
    memset(&f, 0, sizeof f);
    zn_loss_scaler ls;
    zn_loss_scaler_init(&ls, &f);
    ZT_CHECK(ls.scale == 1.0 && !ls.dynamic);

    f.enabled = true;
    f.initial_scale_power = 4;
    f.loss_scale_window = 3;
    f.hysteresis = 2;
    f.min_loss_scale = 1;
    zn_loss_scaler_init(&ls, &f);
    ZT_CHECK(ls.scale == 16.0 && ls.dynamic);
    int seq[] = { 0, 0, 0, 1, 1, 0, 0, 0 };
    double want[] = { 16, 16, 32, 32, 16, 16, 16, 32 };
    for (int i = 0; i < 8; i++) {
        ZT_EQ_INT(zn_loss_scaler_update(&ls, seq[i]), 0);
        ZT_CHECK_MSG(ls.scale == want[i], "after update %d: scale %g, expected %g", i, ls.scale,
                     want[i]);
    }
    ZT_EQ_U64(ls.overflows, 2);

    /* at the minimum an overflow is fatal (as in DeepSpeed) */
    f.initial_scale_power = 1;
    f.min_loss_scale = 2;
    f.hysteresis = 1;
    zn_loss_scaler_init(&ls, &f);
    ZT_EQ_INT(zn_loss_scaler_update(&ls, 1), 1);
    ZT_CHECK(ls.scale == 2.0);

    /* a static scale never moves */
    f.loss_scale = 128;
    zn_loss_scaler_init(&ls, &f);
    ZT_EQ_INT(zn_loss_scaler_update(&ls, 1), 0);
    ZT_CHECK(ls.scale == 128.0 && !ls.dynamic);
}

static void test_trace(void)
{
    zn_trace *t;
    ZT_EQ_INT(zn_trace_create(&t, 1, 0), 0);
    int a = zn_trace_add_track(t, "nvme \"read\"");
    int b = zn_trace_add_track(t, "adam");
    ZT_EQ_INT(a, 0);
    ZT_EQ_INT(b, 1);
    uint64_t o = zn_now_ns();
    zn_trace_span(t, a, "u1", o, o + 10000);
    zn_trace_span(t, a, "u2", o + 5000, o + 20000);   /* overlaps: counted once */
    zn_trace_span(t, a, "u3", o + 30000, o + 31000);
    zn_trace_span(t, b, "adam u1", o + 100, o + 200);
    zn_trace_counter(t, "gpu bytes", o, 42.0);
    NEAR(zn_trace_busy_s(t, a), 21000e-9);
    NEAR(zn_trace_busy_s(t, b), 100e-9);
    char path[] = "trace-test-XXXXXX.json";
    int fd = mkstemps(path, 5);
    ZT_CHECK(fd >= 0);
    close(fd);
    ZT_EQ_INT(zn_trace_write(t, path), 0);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    ZT_CHECK_MSG(root != NULL, "trace JSON does not parse: %s line %d", err.text, err.line);
    int spans = 0, names = 0, counters = 0;
    json_t *ev = json_object_get(root, "traceEvents");
    for (size_t i = 0; ev && i < json_array_size(ev); i++) {
        json_t *e = json_array_get(ev, i);
        const char *ph = json_string_value(json_object_get(e, "ph"));
        const char *nm = json_string_value(json_object_get(e, "name"));
        if (ph && !strcmp(ph, "X"))
            spans++;
        if (ph && !strcmp(ph, "C"))
            counters++;
        if (ph && !strcmp(ph, "M") && nm && !strcmp(nm, "thread_name")) {
            const char *tn = json_string_value(json_object_get(json_object_get(e, "args"), "name"));
            names += tn && (!strcmp(tn, "nvme \"read\"") || !strcmp(tn, "adam"));
        }
    }
    ZT_EQ_INT(spans, 4);
    ZT_EQ_INT(names, 2);
    ZT_EQ_INT(counters, 1);
    json_decref(root);
    remove(path);
    zn_trace_reset_busy(t);
    ZT_CHECK(zn_trace_busy_s(t, a) == 0.0);
    zn_trace_destroy(t);
}

/* A union track: spans of two tracks arriving out of start order (two
 * threads), overlaps counted once, across a fold of old intervals too. */
static void test_trace_union(void)
{
    zn_trace *t;
    ZT_EQ_INT(zn_trace_create(&t, 0, 0), 0);
    int r = zn_trace_add_track(t, "nvme read");
    int w = zn_trace_add_track(t, "nvme write");
    int u = zn_trace_add_union(t, "nvme read+write", r, w);
    ZT_CHECK(u == 2);
    ZT_EQ_INT(zn_trace_add_union(t, "bad", r, 9), ZN_EARG);
    uint64_t o = 1000000;
    zn_trace_span(t, w, "w1", o + 20, o + 30);    /* arrives first, starts later */
    zn_trace_span(t, r, "r1", o + 10, o + 50);    /* covers w1 */
    zn_trace_span(t, w, "w2", o + 45, o + 70);    /* overlaps r1's end */
    zn_trace_span(t, r, "r2", o + 100, o + 110);  /* apart */
    /* union [10, 70] + [100, 110] = 70 ns; the tracks alone 40 + 10, 10 + 25 */
    NEAR(zn_trace_busy_s(t, u), 70e-9);
    NEAR(zn_trace_busy_s(t, r), 50e-9);
    NEAR(zn_trace_busy_s(t, w), 35e-9);
    /* 200 Ki disjoint pairs of overlapping spans: the intervals fold, the
     * sum stays exact */
    zn_trace_reset_busy(t);
    ZT_CHECK(zn_trace_busy_s(t, u) == 0.0);
    for (uint64_t i = 0; i < (200u << 10); i++) {
        uint64_t b = o + i * 100;
        zn_trace_span(t, r, "r", b, b + 30);
        zn_trace_span(t, w, "w", b + 20, b + 40);
    }
    NEAR(zn_trace_busy_s(t, u), (double)(200u << 10) * 40e-9);
    zn_trace_destroy(t);
}

int main(void)
{
    test_lr();
    test_scaler();
    test_trace();
    test_trace_union();
    return zt_done();
}
