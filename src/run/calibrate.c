/* This machine's ceilings for the cost model (zinc/cost.h), measured by the
 * same calls the run makes and kept in a cache file per user, so that a
 * plan does not measure again:
 *   - the host link: 64 MiB copies each way between pinned memory and the
 *     device (on the host backend, the memcpy its copy streams run);
 *   - host memory: the gradient accumulation's add over 64 MiB;
 *   - CPU Adam, per moment format, over 4M elements at the run's threads,
 *     on an fp32 master and on a bf16 one with stochastic rounding;
 *   - the disk under the config's NVMe path: 256 MiB written, read, and
 *     read and written at once, through zinc's engine (io_uring,
 *     O_DIRECT) at the config's aio settings, with the CPU time the
 *     engine spends per byte;
 *   - one micro-batch's compute at the config's shape: one layer's
 *     forward and backward and the head, on the run's device
 *     (zn_model_probe_blocks), cached by shape;
 *   - the schedule's fixed cost per block use: the trainer itself run for
 *     a few steps on a model whose compute is small (see measure_schedule).
 * Each figure is the best of three (a shared machine's noise is one-sided).
 * The cache is ZINC_CACHE_DIR, else XDG_CACHE_HOME/zinc, else
 * ~/.cache/zinc: ceilings.json, written to a temporary file and renamed. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "zinc/cost.h"
#include "zinc/device.h"
#include "zinc/model.h"
#include "zinc/nvme.h"
#include "zinc/optim.h"
#include "zinc/run.h"
#include "zinc/topo.h"
#include "util/fs-impl.h"
#include "zn_build_config.h"
#include "zn_vcs.h"

#define REPS 3
/* the schedule's rounds: its steps are milliseconds, so more of them */
#define SCHED_ROUNDS 5

static double now_s(void)
{
    return (double)zn_now_ns() * 1e-9;
}

int zn_run_cache_path(char *out, size_t n)
{
    const char *d = getenv("ZINC_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    int w;
    if (d && *d)
        w = snprintf(out, n, "%s", d);
    else if (x && *x)
        w = snprintf(out, n, "%s/zinc", x);
    else if (h && *h)
        w = snprintf(out, n, "%s/.cache/zinc", h);
    else
        return zn_set_error(ZN_ECONFIG, "cost model: no cache directory: set ZINC_CACHE_DIR, "
                            "XDG_CACHE_HOME or HOME");
    if (w < 0 || (size_t)w + 20 >= n)
        return zn_set_error(ZN_ECONFIG, "cost model: cache directory path too long");
    return 0;
}

/* The machine the figures belong to: CPU, cores, RAM, device, and the zinc
 * build (its version and commit: a changed Adam kernel or schedule is
 * measured again, not read from an older build's figures). */
static void machine_key(const char *devname, char *out, size_t n)
{
    char cpu[160];
    zn_cpu_model(cpu, sizeof cpu);
    snprintf(out, n, "%s | %ld cpus | %llu MiB | %s | zinc %s (%s)", cpu,
             sysconf(_SC_NPROCESSORS_ONLN),
             (unsigned long long)((uint64_t)sysconf(_SC_PHYS_PAGES) *
                                  (uint64_t)sysconf(_SC_PAGESIZE) >> 20),
             devname, ZN_VERSION, ZN_VCS);
}

static json_t *load_cache(const char *file)
{
    json_error_t e;
    json_t *j = json_load_file(file, 0, &e);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        j = json_object();
    }
    return j;
}

static int save_cache(json_t *j, const char *dir, const char *file)
{
    /* the directory chain and the file, private to the user */
    int rc = zn_fs_mkdir_p(dir, 0700);
    if (rc)
        return zn_error_prefix(rc, "cost model");
    zn_fs_tmp h;
    if ((rc = zn_fs_tmp_open(&h, file, 0600)))
        return zn_error_prefix(rc, "cost model");
    if (json_dumpfd(j, h.fd, JSON_INDENT(1) | JSON_SORT_KEYS) < 0) {
        zn_fs_tmp_abort(&h);
        return zn_set_error(-EIO, "cost model: writing %s failed", file);
    }
    if ((rc = zn_fs_tmp_commit(&h)))
        return zn_error_prefix(rc, "cost model");
    return 0;
}

static double jnum(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : 0;
}

/* ---- measurements --------------------------------------------------------*/
static int measure_link(zn_dev *dev, zn_ceilings *c)
{
    /* 64 MiB, or half of an arena smaller than 128 MiB (a run's small
     * tiers.gpu caps it: open_device); 4 MiB copies already reach 0.97 of
     * the link's rate (bench/results/gpu-h200.md) */
    zn_dev_mem ms;
    zn_dev_mem_stats(dev, &ms);
    size_t n = (size_t)64 << 20;
    if (n > ms.largest_free / 2)
        n = (size_t)(ms.largest_free / 2) & ~(((size_t)1 << 20) - 1);
    if (n < ((size_t)1 << 20))
        return zn_set_error(ZN_EBUDGET, "cost model: the link's measurement needs 2 MiB of the "
                            "GPU tier; %llu bytes are free in it",
                            (unsigned long long)ms.largest_free);
    void *h = NULL, *d = NULL;
    int rc = zn_dev_host_alloc(dev, n, "calibrate host", &h);
    if (!rc)
        rc = zn_dev_alloc(dev, n, "calibrate device", &d);
    if (!rc)
        memset(h, 1, n);
    for (int r = 0; r < REPS + 1 && !rc; r++) {
        double t0 = now_s();
        rc = zn_dev_copy_h2d(dev, NULL, d, h, n);
        if (!rc)
            rc = zn_dev_stream_sync(dev, NULL);
        double t1 = now_s();
        if (!rc)
            rc = zn_dev_copy_d2h(dev, NULL, h, d, n);
        if (!rc)
            rc = zn_dev_stream_sync(dev, NULL);
        double t2 = now_s();
        if (r)  /* the first pass touches the pages */
            c->h2d_bps = fmax(c->h2d_bps, (double)n / (t1 - t0)),
            c->d2h_bps = fmax(c->d2h_bps, (double)n / (t2 - t1));
    }
    zn_dev_free(dev, d);
    zn_dev_host_free(dev, h);
    return rc;
}

/* The machine's last-level caches, summed (hwloc; 0 when unknown). */
static uint64_t g_llc;
static pthread_once_t g_llc_once = PTHREAD_ONCE_INIT;

static void find_llc(void)
{
    zn_topo t;
    if (zn_topo_discover(&t) == 0)
        g_llc = t.llc_bytes;
    else
        zn_clear_error();
}

/* Elements for a bandwidth probe: at least `min_elems`, and enough that
 * the probe's arrays together (`elem_bytes` bytes an element across them)
 * are four times the machine's last-level caches, so that each pass
 * evicts the one before and the figure is the memory's, not the cache's
 * (STREAM asks four times for each array; a sweep over four times the
 * cache already finds nothing of the pass before); at most 4 GiB in all.
 * On the 2-core Zen 4 VM (32 MiB of L3) the old fixed sizes hold; a
 * server's L3 (over 100 MiB on a Xeon) held most of them, and the figures
 * overstated what a run's gigabytes of gradients and moments get. */
#define MEM_MIN ((size_t)16 << 20)   /* floats in each of its 2 arrays: 128 MiB in all */
#define ADAM_MIN ((size_t)4 << 20)   /* parameters */

static size_t probe_elems(size_t elem_bytes, size_t min_elems)
{
    pthread_once(&g_llc_once, find_llc);
    size_t n = (size_t)(4 * g_llc / elem_bytes);
    size_t cap = ((size_t)4 << 30) / elem_bytes;
    n = n < min_elems ? min_elems : n;
    return n > cap ? cap : n;
}

static int measure_mem(zn_ceilings *c)
{
    size_t n = probe_elems(8, MEM_MIN);
    float *x = malloc(n * 4), *y = malloc(n * 4);
    if (!x || !y) {
        free(x);
        free(y);
        return zn_set_error(-ENOMEM, "cost model: out of memory");
    }
    /* first touched by the threads that sum them (the same static split):
     * each thread's pages on its own NUMA node, as a run's are */
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        x[i] = 1.0f, y[i] = 0.5f;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_s();
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++)
            y[i] += x[i];
        double t = now_s() - t0;
        c->mem_bps = fmax(c->mem_bps, (double)n * 12 / t);
    }
    /* the sums are checked: an add that did not run is not a bandwidth */
    int rc = y[n / 2] == 0.5f + REPS ? 0 : zn_set_error(ZN_EINTERNAL, "cost model: memory "
                                                      "probe computed %g", (double)y[n / 2]);
    free(x);
    free(y);
    return rc;
}

static int measure_adam(const zn_config *cfg, zn_ceilings *c)
{
    /* p, g, m and v in fp32: 16 bytes an element */
    size_t n = probe_elems(16, ADAM_MIN);
    float *p = malloc(n * 4), *g = malloc(n * 4);
    void *m = malloc(zn_mom_layout_bytes(ZN_MOM_F32, n)), *v = malloc(zn_mom_layout_bytes(ZN_MOM_F32, n));
    int rc = p && g && m && v ? 0 : zn_set_error(-ENOMEM, "cost model: out of memory");
    for (size_t i = 0; i < n && !rc; i++)
        p[i] = 0.01f * (float)(i % 97), g[i] = 1e-3f * (float)(i % 13) - 5e-3f;
    zn_adam_params hp = zn_adam_params_default();
    hp.threads = (int)cfg->train.threads;
    /* and on the bf16 master with stochastic rounding (train.master_weights
     * bf16_sr): its own kernel, on 2-byte weights */
    uint16_t *pb = rc ? NULL : malloc(n * 2);
    if (!rc && !pb)
        rc = zn_set_error(-ENOMEM, "cost model: out of memory");
    for (size_t i = 0; i < n && !rc; i++)
        pb[i] = zn_f32_to_bf16(p[i]);
    for (int k = 0; k < 6 && !rc; k++) {
        int f = k % 3, sr = k / 3;
        double *pps = sr ? &c->adam_sr_pps[f] : &c->adam_pps[f];
        memset(m, 0, zn_mom_layout_bytes(ZN_MOM_F32, n));
        memset(v, 0, zn_mom_layout_bytes(ZN_MOM_F32, n));
        zn_moments mv = zn_mom_layout_at((zn_mom_fmt)f, m, v, n, 0);
        for (int r = 0; r < REPS + 1 && !rc; r++) {
            hp.step = r + 1;
            double t0 = now_s();
            rc = sr ? zn_adam_step_sr(&hp, pb, &mv, g, ZN_DTYPE_F32, 1.0f, 1, 0, n)
                    : zn_adam_step_mom(&hp, p, &mv, g, ZN_DTYPE_F32, 1.0f, NULL, ZN_DTYPE_F32, n);
            double t = now_s() - t0;
            if (r)
                *pps = fmax(*pps, (double)n / t);
        }
    }
    if (!rc && (!isfinite(p[n / 3]) || !isfinite(zn_bf16_to_f32(pb[n / 3]))))
        rc = zn_set_error(ZN_EINTERNAL, "cost model: the Adam probe produced %g, %g",
                          (double)p[n / 3], (double)zn_bf16_to_f32(pb[n / 3]));
    free(pb);
    free(p);
    free(g);
    free(m);
    free(v);
    return rc;
}

/* CPU seconds this process has used (all its threads, user and system:
 * the engine's worker and io_uring's kernel workers among them). */
static double cpu_s(void)
{
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u))
        return 0;
    return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-6 * (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/* Two requests at once, each a read or a write of half the buffer; both
 * waited for (no handle left held), the first error returned. */
static int io_pair(zn_aio *a, const zn_extent e[2], char *buf, size_t h, bool read0, bool read1)
{
    zn_aio_handle x, y;
    int rc = read0 ? zn_aio_submit_read(a, &e[0], buf, h, &x)
                   : zn_aio_submit_write(a, &e[0], buf, h, &x);
    if (rc)
        return rc;
    int ry = read1 ? zn_aio_submit_read(a, &e[1], buf + h, h, &y)
                   : zn_aio_submit_write(a, &e[1], buf + h, h, &y);
    int rx = zn_aio_wait(a, x);
    if (!ry)
        ry = zn_aio_wait(a, y);
    return rx ? rx : ry;
}

/* The disk under `path` through zinc's engine, as the run uses it: two
 * extents of half the size, written together, read together (the engine
 * checks every block's crc32c), then one read while the other is written
 * (the optimizer's states on NVMe: each unit's read and the one before's
 * write at once; on a shared device the mix is slower than the two
 * directions' times added). Also the CPU time the process spends per byte
 * in each direction (crc32c, submission, completion): on the host backend
 * those cycles come out of the cores that compute. */
static int measure_nvme(const zn_config *cfg, const char *path, zn_ceilings *c)
{
    zn_aio_config ac = zn_run_aio_config(cfg);
    size_t n = (size_t)256 << 20, h = n / 2;
    zn_aio *a = NULL;
    zn_swap *s = NULL;
    zn_extent e[2];
    void *buf = NULL;
    /* what dead runs left there (a killed calibration among them) */
    uint64_t stale = 0;
    int nstale = 0;
    int rc = zn_swap_clean_stale(path, "zinc-calibrate", &stale, &nstale);
    if (!rc)
        rc = zn_aio_create(&a, &ac);
    if (!rc) {
        zn_swap_config sc = zn_swap_config_default();
        sc.npaths = 1;
        sc.paths[0] = path;
        sc.bytes = n;
        sc.file_prefix = "zinc-calibrate";
        /* in a run directory of its own, as the trainer's swap: a
         * calibration killed midway leaves what the next run removes */
        sc.run_dir = 1;
        rc = zn_swap_create(&s, a, &sc);
    }
    if (!rc)
        rc = zn_swap_alloc(s, h, "calibration a", &e[0]);
    if (!rc)
        rc = zn_swap_alloc(s, h, "calibration b", &e[1]);
    if (!rc && !(buf = zn_aio_buffer_alloc(n)))
        rc = -ENOMEM;
    int id = -1;
    if (!rc) {
        memset(buf, 0x5a, n);
        id = zn_aio_register_buffer(a, buf, n);
    }
    double best_w = INFINITY, best_r = INFINITY, best_m = INFINITY;
    for (int r = 0; r < REPS && !rc; r++) {
        double c0 = cpu_s(), t0 = now_s();
        rc = io_pair(a, e, buf, h, false, false);
        double c1 = cpu_s(), t1 = now_s();
        if (!rc)
            rc = io_pair(a, e, buf, h, true, true);
        double c2 = cpu_s(), t2 = now_s();
        if (!rc)
            rc = io_pair(a, e, buf, h, true, false);
        double t3 = now_s();
        if (rc)
            break;
        /* the fastest pass of each: the CPU time of that pass with it */
        if (t1 - t0 < best_w)
            best_w = t1 - t0, c->nvme_write_cpu = (c1 - c0) / (double)n;
        if (t2 - t1 < best_r)
            best_r = t2 - t1, c->nvme_read_cpu = (c2 - c1) / (double)n;
        best_m = fmin(best_m, t3 - t2);
    }
    if (!rc)
        c->nvme_write_bps = (double)n / best_w, c->nvme_read_bps = (double)n / best_r,
        c->nvme_mixed_bps = (double)n / best_m;
    if (id >= 0)
        zn_aio_unregister_buffer(a, id);
    zn_aio_buffer_free(buf);
    zn_swap_destroy(s);
    zn_aio_destroy(a);
    return rc ? zn_error_prefix(rc, "cost model: measuring the disk under %s", path) : 0;
}

/* The schedule's fixed cost per block use (zn_ceilings.block_use_s): what a
 * step costs beyond its compute, copies and optimizer, per block forward or
 * backward in each micro-batch. Measured by running the trainer as a run
 * uses it (zn_train_create, zn_train_step) on a model whose blocks compute
 * for little (hidden 32, 8 layers, 16 tokens, about 78k parameters), every
 * parameter resident on the device and the optimizer on the CPU as most
 * runs have it, two micro-batches per step; its step is then mostly the
 * schedule's own work (its Adam and copies are small: the model adds them
 * where they may have overlapped, which biases the figure low, not high).
 * The figure is the value at which the cost model (zn_cost_predict, with
 * this machine's other ceilings and this model's probed compute) predicts
 * the measured step exactly: on the host backend that is (measured -
 * predicted without it) / block uses; on a GPU the model counts only what
 * the device waits for, and the same search finds it. Best step of five
 * rounds of four, after two warm-up steps (about 0.2 s on a 2-core host). */
static const char schedule_model_json[] =
    "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": 2,"
    " \"gradient_clipping\": 0,"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}},"
    " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 1}},"
    " \"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"none\"},"
    "  \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true},"
    "  \"sub_group_size\": 1000000, \"stage3_param_persistence_threshold\": 0},"
    " \"tiers\": {\"gpu\": \"512MiB\", \"cpu\": \"512MiB\"},"
    " \"model\": {\"model_type\": \"llama\", \"hidden_size\": 32, \"num_hidden_layers\": 8,"
    "  \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"intermediate_size\": 64,"
    "  \"vocab_size\": 64, \"max_position_embeddings\": 64},"
    " \"data\": {\"seq_len\": 16, \"seed\": 1},"
    " \"train\": {\"steps\": 22, \"seed\": 1}}";

static int open_device(const zn_config *cfg, const zn_model_dims *d, bool cuda, zn_dev **dev);

static int measure_schedule(const zn_config *user, const zn_ceilings *c,
                            double *block_use_s, double *step_s, double *base_s,
                            uint64_t *uses)
{
    char dset[sizeof user->train.device + 32], tset[64], bset[64];
    const char *sets[3] = { dset, tset, bset };
    /* the device the ceilings are keyed by (zn_run_ceilings: cuda or host) */
    snprintf(dset, sizeof dset, "train.device=\"%s\"",
             !c->cuda ? "host" : user->train.device[0] ? user->train.device : "auto");
    snprintf(tset, sizeof tset, "train.threads=%lld", (long long)user->train.threads);
    snprintf(bset, sizeof bset, "bf16.enabled=%s", user->bf16 && c->cuda ? "true" : "false");
    zn_config *cfg = malloc(sizeof *cfg);
    zn_plan *plan = malloc(sizeof *plan);
    uint64_t *blocks = NULL;
    zn_train_llama *ll = NULL;
    zn_trainer *tr = NULL;
    zn_spec *sp = NULL;
    zn_dev *dev = NULL;
    int32_t *ids = NULL, *tgts = NULL;
    zn_model_dims d;
    int rc = cfg && plan ? 0 : zn_set_error(-ENOMEM, "out of memory");
    if (!rc)
        rc = zn_config_parse(cfg, schedule_model_json, "(the schedule's calibration model)",
                             sets, 3);
    if (!rc && !(rc = zn_run_resolve(cfg, NULL, 1, NULL)))
        rc = zn_run_model_dims(cfg, &d);
    if (rc)
        goto out;
    int nb = zn_model_num_parts(&d);
    int64_t B = cfg->train_micro_batch_size_per_gpu, T = cfg->data.seq_len;
    int64_t A = cfg->gradient_accumulation_steps;
    size_t ntok = (size_t)(A * B * T);
    blocks = calloc((size_t)nb, sizeof *blocks);
    ids = malloc(ntok * sizeof *ids);
    tgts = malloc(ntok * sizeof *tgts);
    if (!blocks || !ids || !tgts) {
        rc = zn_set_error(-ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < ntok; i++)
        ids[i] = (int32_t)((i * 37 + 11) % (size_t)d.vocab),
        tgts[i] = (int32_t)((i * 53 + 7) % (size_t)d.vocab);
    zn_plan_input in;
    zn_run_plan_input(cfg, &d, 1, blocks, &in);
    if ((rc = zn_train_llama_create(&ll, &d, B, T, cfg->model.init_std, cfg->model.seed)))
        goto out;
    zn_train_llama_set_attention(ll, cfg->train.attention);
    zn_plan_budgets budgets = { .bytes = { cfg->tiers.gpu, cfg->tiers.cpu, 0 } };
    if (!(sp = calloc(1, sizeof *sp))) {
        rc = zn_set_error(-ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = zn_run_spec(cfg, &in, &budgets, sp)))
        goto out;
    zn_train_options o = zn_train_options_default();
    o.spec = sp;
    o.model = zn_train_llama_model(ll);
    if ((rc = zn_train_create(&tr, &o)))
        goto out;
    double best = INFINITY;
    for (int s = 0; s < 2 + SCHED_ROUNDS * 4 && !rc; s++) {
        zn_train_step_info info;
        if (s >= 2 && (s - 2) % 4 == 0)
            zn_train_reset_counters(tr);
        rc = zn_train_step(tr, ids, tgts, NULL, &info);
        if (!rc && !isfinite(info.loss))
            rc = zn_set_error(ZN_EINTERNAL, "the loss is %g", info.loss);
        if (!rc && s >= 2 && (s - 2) % 4 == 3 && !(rc = zn_train_sync(tr))) {
            zn_train_report r;
            zn_train_get_report(tr, &r);
            if (r.steps > 0)
                best = fmin(best, r.step_s / (double)r.steps);
        }
    }
    if (rc)
        goto out;
    *plan = *zn_train_get_plan(tr);
    zn_train_destroy(tr);
    tr = NULL;

    /* this model's compute, probed as a run's is, on a device opened only
     * now: one device at a time (after a run, its trainer still holds most
     * of the GPU) */
    if ((rc = open_device(user, NULL, c->cuda, &dev)))
        goto out;
    zn_model_probe_opts po = {
        .batch = B, .seq = T, .dtype = cfg->bf16 && c->cuda ? ZN_DTYPE_BF16 : ZN_DTYPE_F32,
        .checkpoint = cfg->train.activation_checkpointing, .attention = cfg->train.attention,
        .iters = 20,  /* microseconds each: more tries for the best */
    };
    zn_model_probe pr;
    if ((rc = zn_model_probe_blocks(dev, &d, &po, &pr)))
        goto out;
    zn_cost_compute comp = { .layer_fwd_s = pr.layer_fwd_s, .layer_bwd_s = pr.layer_bwd_s,
                             .head_s = pr.head_s, .blocks = nb };
    zn_ceilings cc = *c;
    zn_cost p;
    /* predict(o) grows with o: search the o that predicts the step */
    double lo = 0, hi = best;
    cc.block_use_s = 0;
    if ((rc = zn_cost_predict(plan, &cc, &comp, d.n_layers, ntok, ZN_MOM_F32, &p)))
        goto out;
    *base_s = p.step_s;
    *uses = p.block_uses;
    for (int it = 0; it < 60 && *base_s < best; it++) {
        cc.block_use_s = 0.5 * (lo + hi);
        if ((rc = zn_cost_predict(plan, &cc, &comp, d.n_layers, ntok, ZN_MOM_F32, &p)))
            goto out;
        if (p.step_s < best)
            lo = cc.block_use_s;
        else
            hi = cc.block_use_s;
    }
    *block_use_s = *base_s < best ? 0.5 * (lo + hi) : 0;
    *step_s = best;
out:
    if (rc)
        rc = zn_error_prefix(rc, "cost model: measuring the schedule's overhead");
    zn_train_destroy(tr);
    zn_train_llama_destroy(ll);
    zn_dev_destroy(dev);
    free(ids);
    free(tgts);
    free(blocks);
    free(sp);
    free(plan);
    free(cfg);
    return rc;
}

/* The nearest folder of `path` that exists (path itself when it does), for
 * measuring the disk a folder the run will make is going to be on. */
static void nearest_dir(const char *path, char *out, size_t n)
{
    struct stat st;
    snprintf(out, n, "%s", path);
    while (stat(out, &st) != 0) {
        char *slash = strrchr(out, '/');
        if (!slash) {
            snprintf(out, n, ".");
            return;
        }
        if (slash == out) {
            slash[1] = '\0';
            return;
        }
        *slash = '\0';
    }
}

/* The disk under `path` (its file system, by st_dev) from the cache entry
 * m, or (with `measure`) measured now into m (*dirty then set): its
 * nvme_* figures into t, 0 when it is not cached and not measured. */
static int disk_speed(const zn_config *cfg, json_t *m, const char *path, bool measure, FILE *note,
                      zn_ceilings *t, bool *dirty)
{
    struct stat st;
    t->nvme_read_bps = t->nvme_write_bps = t->nvme_mixed_bps = 0;
    t->nvme_read_cpu = t->nvme_write_cpu = 0;
    if (stat(path, &st))
        return zn_set_error(-errno, "cost model: %s: %s", path, strerror(errno));
    char dkey[64];
    snprintf(dkey, sizeof dkey, "disk %llu", (unsigned long long)st.st_dev);
    json_t *dk = json_object_get(m, dkey);
    if (!json_is_object(dk) && !measure)
        return 0;
    if (!json_is_object(dk)) {
        if (note)
            fprintf(note, "cost model: measuring the disk under %s (256 MiB written and "
                    "read back)\n", path);
        int rc = measure_nvme(cfg, path, t);
        if (rc)
            return rc;
        dk = json_pack("{s:f,s:f,s:f,s:f,s:f,s:s}", "read_bps", t->nvme_read_bps, "write_bps",
                       t->nvme_write_bps, "mixed_bps", t->nvme_mixed_bps, "read_cpu_s_per_byte",
                       t->nvme_read_cpu, "write_cpu_s_per_byte", t->nvme_write_cpu, "path", path);
        json_object_set_new(m, dkey, dk);
        *dirty = true;
    }
    t->nvme_read_bps = jnum(dk, "read_bps");
    t->nvme_write_bps = jnum(dk, "write_bps");
    t->nvme_mixed_bps = jnum(dk, "mixed_bps");
    t->nvme_read_cpu = jnum(dk, "read_cpu_s_per_byte");
    t->nvme_write_cpu = jnum(dk, "write_cpu_s_per_byte");
    return 0;
}

static void shape_key(const zn_model_dims *d, const zn_model_probe_opts *o, char *out, size_t n)
{
    snprintf(out, n, "%s h%lld i%lld a%lld/%lld d%lld v%lld%s | b%lld s%lld %s ck%d at%d",
             zn_model_arch_name(d->arch), (long long)d->hidden,
             (long long)d->intermediate, (long long)d->n_heads, (long long)d->n_kv_heads,
             (long long)d->head_dim, (long long)d->vocab, d->tie_embeddings ? " tied" : "",
             (long long)o->batch, (long long)o->seq, zn_dtype_name(o->dtype), o->checkpoint,
             o->attention);
}

/* The device the ceilings are measured on, its arena sized for what they
 * allocate: the link's buffer (64 MiB at most), and for the layer probe (d)
 * one layer with the embedding and the head resident (parameters of at
 * most 4 bytes and fp32 gradients: 8 bytes a parameter; their staging is
 * in host memory; a large vocabulary's embedding and head are most of it),
 * the model's workspace at the run's shape and the probe's activations;
 * 1 GiB of slack. Never more than the run's own numeric tiers.gpu: after a
 * run (zinc train's prediction) the measurements fit where the run did, or
 * do not run. On the first H200 a 7B run's probe, then sized at 16 bytes a
 * parameter, reserved 20.7 GiB beside the run's 5.4. The host backend's
 * arena is reserved address space, touched only as the probe uses it. */
static int open_device(const zn_config *cfg, const zn_model_dims *d, bool cuda, zn_dev **dev)
{
    zn_dev_config dc = zn_dev_config_default();
    dc.name = cfg->train.device[0] ? cfg->train.device : "auto";
    dc.gpu_budget = (uint64_t)1 << 30;
    if (d) {
        zn_model_dims one = *d;
        one.n_layers = 1;
        zn_model_config mc = zn_model_config_default(NULL);
        mc.dtype = cfg->bf16 && cuda ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
        mc.max_batch = cfg->train_micro_batch_size_per_gpu;
        mc.max_seq = cfg->data.seq_len;
        mc.checkpoint = cfg->train.activation_checkpointing;
        mc.attention = cfg->train.attention;
        uint64_t tokens = (uint64_t)(mc.max_batch * mc.max_seq);
        dc.gpu_budget += 8 * zn_model_param_count(&one) + zn_model_workspace_bytes(&one, &mc) +
                         8 * tokens * (uint64_t)d->hidden * 4;
    }
    if (!cfg->tiers.gpu_auto && cfg->tiers.gpu && dc.gpu_budget > cfg->tiers.gpu)
        dc.gpu_budget = cfg->tiers.gpu;
    return zn_dev_create(dev, &dc);
}

int zn_run_ceilings(const zn_config *cfg, const zn_model_dims *d, int flags, zn_ceilings *c,
                    zn_cost_compute *comp, FILE *note)
{
    memset(c, 0, sizeof *c);
    memset(comp, 0, sizeof *comp);
    char dir[ZN_PATH_MAX], file[ZN_PATH_MAX + 32], mkey[512];
    int rc = zn_run_cache_path(dir, sizeof dir);
    if (rc)
        return rc;
    snprintf(file, sizeof file, "%s/ceilings.json", dir);
    /* the device is opened only to measure; the figures are keyed by what
     * train.device resolves to here */
    zn_dev *dev = NULL;
    zn_dev_info di;
    memset(&di, 0, sizeof di);
    bool cuda = strcmp(cfg->train.device, "host") && zn_run_has_cuda(cfg);
    machine_key(cuda ? "cuda" : "host", mkey, sizeof mkey);
    c->shared_cores = !cuda;
    c->cuda = cuda;
    snprintf(c->name, sizeof c->name, "this machine");
    json_t *root = load_cache(file);
    json_t *m = json_object_get(root, mkey);
    bool fresh = (flags & ZN_CEIL_RECALIBRATE) || !json_is_object(m);
    if (fresh) {
        m = json_object();
        json_object_set_new(root, mkey, m);
    }
    bool dirty = false;
#define NEED_DEVICE()                                                          \
    do {                                                                       \
        if (!dev) {                                                            \
            if ((rc = open_device(cfg, d, cuda, &dev))) {                      \
                rc = zn_error_prefix(rc, "cost model: device");                \
                goto out;                                                      \
            }                                                                  \
            zn_dev_get_info(dev, &di);                                         \
        }                                                                      \
    } while (0)
    if (!json_is_object(json_object_get(m, "link")) && !(flags & ZN_CEIL_CACHED)) {
        NEED_DEVICE();
        if (note)
            fprintf(note, "cost model: measuring this machine's host link, memory and CPU Adam "
                    "(once; kept in %s)\n", file);
        zn_ceilings t;
        memset(&t, 0, sizeof t);
        if ((rc = measure_link(dev, &t)) || (rc = measure_mem(&t)) || (rc = measure_adam(cfg, &t)))
            goto out;
        json_object_set_new(m, "link", json_pack("{s:f,s:f,s:f,s:[f,f,f],s:[f,f,f],s:I,s:I}",
                                                 "h2d_bps", t.h2d_bps, "d2h_bps", t.d2h_bps,
                                                 "mem_bps", t.mem_bps, "adam_pps", t.adam_pps[0],
                                                 t.adam_pps[1], t.adam_pps[2], "adam_sr_pps",
                                                 t.adam_sr_pps[0], t.adam_sr_pps[1],
                                                 t.adam_sr_pps[2], "mem_probe_bytes",
                                                 (json_int_t)(probe_elems(8, MEM_MIN) * 8),
                                                 "adam_probe_params",
                                                 (json_int_t)probe_elems(16, ADAM_MIN)));
        dirty = true;
    }
    json_t *l = json_object_get(m, "link");
    c->h2d_bps = jnum(l, "h2d_bps");
    c->d2h_bps = jnum(l, "d2h_bps");
    c->mem_bps = jnum(l, "mem_bps");
    json_t *ap = json_object_get(l, "adam_pps");
    json_t *sp = json_object_get(l, "adam_sr_pps");
    for (int f = 0; f < 3; f++)
        c->adam_pps[f] = json_number_value(json_array_get(ap, (size_t)f)),
        c->adam_sr_pps[f] = json_number_value(json_array_get(sp, (size_t)f));
    /* optimizer on the device: the host backend runs the same CPU kernels */
    c->dev_adam_pps = c->shared_cores ? c->adam_pps[0] : 0;

    /* the schedule's cost per block use, with the figures above (which a
     * read-only look, ZN_CEIL_CACHED, may not have) */
    if (!json_is_object(json_object_get(m, "schedule")) && !(flags & ZN_CEIL_CACHED)) {
        zn_dev_destroy(dev);  /* the calibration's trainer opens its own */
        dev = NULL;
        if (note)
            fprintf(note, "cost model: measuring the schedule's overhead per block use (a "
                    "10-block model trained for %d steps; once, kept in %s)\n",
                    2 + SCHED_ROUNDS * 4, file);
        double o = 0, t = 0, base = 0;
        uint64_t uses = 0;
        if ((rc = measure_schedule(cfg, c, &o, &t, &base, &uses)))
            goto out;
        json_object_set_new(m, "schedule", json_pack("{s:f,s:f,s:f,s:I}", "block_use_s", o,
                                                     "step_s", t, "predicted_without_s", base,
                                                     "block_uses", (json_int_t)uses));
        dirty = true;
    }
    c->block_use_s = jnum(json_object_get(m, "schedule"), "block_use_s");

    /* the disk: by the file system the NVMe path is on (or will be on: a
     * path the run may create, tiers.create_nvme_path, is measured at its
     * nearest existing folder) */
    const char *paths[ZN_SWAP_MAX_PATHS];
    int np = zn_config_nvme_paths(cfg, paths, ZN_SWAP_MAX_PATHS);
    char nv[ZN_PATH_MAX];
    struct stat nst;
    if (np > 0 && (stat(paths[0], &nst) == 0 || cfg->tiers.create_nvme_path)) {
        nearest_dir(paths[0], nv, sizeof nv);
        zn_ceilings t;
        if ((rc = disk_speed(cfg, m, nv, !(flags & ZN_CEIL_CACHED), note, &t, &dirty)))
            goto out;
        c->nvme_read_bps = t.nvme_read_bps;
        c->nvme_write_bps = t.nvme_write_bps;
        c->nvme_mixed_bps = t.nvme_mixed_bps;
        c->nvme_read_cpu = t.nvme_read_cpu;
        c->nvme_write_cpu = t.nvme_write_cpu;
    }

    /* the compute of one micro-batch at this shape */
    if (d) {
        zn_model_probe_opts po = {
            .batch = cfg->train_micro_batch_size_per_gpu, .seq = cfg->data.seq_len,
            .dtype = cfg->bf16 && c->cuda ? ZN_DTYPE_BF16 : ZN_DTYPE_F32,
            .checkpoint = cfg->train.activation_checkpointing, .attention = cfg->train.attention,
            .iters = REPS,
        };
        char skey[256];
        shape_key(d, &po, skey, sizeof skey);
        json_t *probes = json_object_get(m, "compute");
        if (!json_is_object(probes)) {
            probes = json_object();
            json_object_set_new(m, "compute", probes);
        }
        json_t *pk = json_object_get(probes, skey);
        if (!json_is_object(pk) && !(flags & ZN_CEIL_CACHED)) {
            NEED_DEVICE();
            if (note)
                fprintf(note, "cost model: timing one layer at micro-batch %lld x %lld on %s\n",
                        (long long)po.batch, (long long)po.seq, di.name);
            zn_model_probe pr;
            if ((rc = zn_model_probe_blocks(dev, d, &po, &pr)))
                goto out;
            /* a timing, not a numeric check (bench model checks the loss
             * against ln(vocab)): only a result that did not compute fails */
            if (!isfinite(pr.loss) || !(pr.layer_fwd_s > 0) || !(pr.layer_bwd_s > 0)) {
                rc = zn_set_error(ZN_EINTERNAL, "cost model: the layer probe computed loss %g "
                                  "in %g + %g s", (double)pr.loss, pr.layer_fwd_s, pr.layer_bwd_s);
                goto out;
            }
            pk = json_pack("{s:f,s:f,s:f}", "layer_fwd_s", pr.layer_fwd_s, "layer_bwd_s",
                           pr.layer_bwd_s, "head_s", pr.head_s);
            json_object_set_new(probes, skey, pk);
            dirty = true;
        }
        comp->layer_fwd_s = jnum(pk, "layer_fwd_s");
        comp->layer_bwd_s = jnum(pk, "layer_bwd_s");
        comp->head_s = jnum(pk, "head_s");
        comp->blocks = zn_model_num_parts(d);
    }
    snprintf(c->source, sizeof c->source, "measured on this machine (%.200s; schedule %.0f us "
             "per block use), kept in %.200s", mkey, c->block_use_s * 1e6, file);
    if (dirty)
        rc = save_cache(root, dir, file);
out:
    json_decref(root);
    zn_dev_destroy(dev);
    return rc;
#undef NEED_DEVICE
}

int zn_run_predict(const zn_config *cfg, const zn_model_dims *d, const zn_plan *plan, int flags,
                   zn_cost *out, FILE *note)
{
    zn_ceilings c;
    zn_cost_compute comp;
    memset(out, 0, sizeof *out);
    int rc = zn_run_ceilings(cfg, d, flags, &c, &comp, note);
    if (rc)
        return rc;
    int mb = zn_config_moment_bytes(cfg->train.optim);
    int fmt = mb == 1 ? ZN_MOM_Q8 : mb == 2 ? ZN_MOM_BF16 : ZN_MOM_F32;
    uint64_t tokens = (uint64_t)(cfg->train_micro_batch_size_per_gpu * cfg->data.seq_len) *
                      (uint64_t)(cfg->gradient_accumulation_steps > 0
                                     ? cfg->gradient_accumulation_steps : 1);
    return zn_cost_predict(plan, &c, &comp, d->n_layers, tokens, fmt, out);
}

/* What a stop by signal costs (zn_run_stop_estimate): the step in progress
 * stopped (one rank) or finished (ranks), then the checkpoint: the
 * background save of the last step completed or dropped, or a save of
 * every rank on this machine's master and moments, those on NVMe read back
 * first. Only disks are measured here (no device: the run holds it). */
#define ZN_ASSUMED_DISK_BPS 1e9
/* The stop's total from its parts (e's step, update, saves). */
static void stop_total(zn_stop_estimate *e, const zn_config_checkpoint *cc)
{
    double half = cc->notice_s > 0 ? cc->notice_s / 2 : 1e30;
    if (e->commit) {
        /* the last finished step's commit stands; its update is dropped */
        e->stop_s = e->drain_s;
        e->age_steps = 1;
    } else if (e->background && cc->every == 1 && e->save_s > half) {
        e->stop_s = e->step_s + e->update_s + half;   /* the save in progress dropped at worst */
        e->age_steps = 1;
    } else {
        e->stop_s = e->step_s + e->update_s + e->final_s;
        /* a periodic save in progress is cancelled where the signal
         * arrives; ranks it did not reach finish their part first */
        if (e->inplace_bytes && e->world > 1 && cc->every > 0 &&
            e->save_s + e->final_s > e->stop_s)
            e->stop_s = e->save_s + e->final_s;
        e->age_steps = 0;
    }
    e->total_s = e->stop_s;
}

int zn_run_stop_estimate(const zn_config *cfg, const zn_plan *plan, int world, int local_ranks,
                         double step_s, double update_s, bool measure, zn_stop_estimate *e,
                         FILE *note)
{
    memset(e, 0, sizeof *e);
    static const zn_state_class saved[] = { ZN_STATE_MASTER, ZN_STATE_ADAM_M, ZN_STATE_ADAM_V };
    uint64_t off_cpu = 0;
    for (size_t k = 0; k < sizeof saved / sizeof saved[0]; k++)
        for (int t = 0; t < ZN_TIER_COUNT; t++) {
            e->save_bytes += plan->bytes[saved[k]][t];
            if (t == ZN_TIER_NVME)
                e->read_bytes += plan->bytes[saved[k]][t];
            if (t != ZN_TIER_CPU)
                off_cpu += plan->bytes[saved[k]][t];
        }
    uint64_t ranks = local_ranks > 0 ? (uint64_t)local_ranks : 1;
    e->save_bytes *= ranks;
    e->read_bytes *= ranks;
    const zn_config_checkpoint *cc = &cfg->train.checkpoint;
    e->cpu_state = !off_cpu;
    e->background = cc->background && cc->every > 0 && !off_cpu;

    e->step_s = world > 1 ? step_s : 0;   /* one rank stops inside the step */
    e->update_s = update_s > 0 ? update_s : 0;
    /* the NVMe path's disk (where the states are read back from) */
    const char *paths[ZN_SWAP_MAX_PATHS];
    char nvme[ZN_PATH_MAX] = "";
    if (e->read_bytes && zn_config_nvme_paths(cfg, paths, ZN_SWAP_MAX_PATHS) > 0)
        nearest_dir(paths[0], nvme, sizeof nvme);
    int rc;
    /* the checkpoint folder's disk (the run makes the folder) */
    char dir[ZN_PATH_MAX];
    nearest_dir(cc->dir[0] ? cc->dir : ".", dir, sizeof dir);
    snprintf(e->disk, sizeof e->disk, "%s", dir);
    char cdir[ZN_PATH_MAX], file[ZN_PATH_MAX + 32], mkey[512];
    if ((rc = zn_run_cache_path(cdir, sizeof cdir)))
        return rc;
    snprintf(file, sizeof file, "%s/ceilings.json", cdir);
    bool cuda = strcmp(cfg->train.device, "host") && zn_run_has_cuda(cfg);
    machine_key(cuda ? "cuda" : "host", mkey, sizeof mkey);
    json_t *root = load_cache(file);
    json_t *m = json_object_get(root, mkey);
    if (!json_is_object(m)) {
        m = json_object();
        json_object_set_new(root, mkey, m);
    }
    bool dirty = false;
    zn_ceilings ck, nv;
    memset(&nv, 0, sizeof nv);
    rc = disk_speed(cfg, m, dir, measure, note, &ck, &dirty);
    e->write_bps = ck.nvme_write_bps;
    if (!rc && nvme[0] && !(rc = disk_speed(cfg, m, nvme, measure, note, &nv, &dirty)))
        e->read_bps = nv.nvme_read_bps;
    if (!rc && dirty)
        rc = save_cache(root, cdir, file);
    json_decref(root);
    if (rc)
        return rc;
    if (!measure && (!(e->write_bps > 0) || (e->read_bytes && !(e->read_bps > 0)))) {
        e->assumed = true;
        e->write_bps = e->read_bps = ZN_ASSUMED_DISK_BPS;
    }
    if (!(e->write_bps > 0) || (e->read_bytes && !(e->read_bps > 0)))
        return zn_set_error(ZN_EINTERNAL, "cost model: no disk speed for %s", dir);
    /* the update in flight reads the NVMe-homed state and writes it back:
     * at the disk's own speed at least, whatever the cost model knows */
    if (e->read_bytes) {
        double w = nv.nvme_write_bps > 0 ? nv.nvme_write_bps : e->write_bps;
        double io = (double)e->read_bytes / e->read_bps + (double)e->read_bytes / w;
        if (io > e->update_s)
            e->update_s = io;
    }
    e->save_s = (double)e->save_bytes / e->write_bps +
                (e->read_bytes ? (double)e->read_bytes / e->read_bps : 0);
    /* the final save keeps the NVMe tier's state in place: the optimizer
     * all there, one path, the checkpoint folder's file system (as
     * zn_ckpt_save_keeps_nvme judges it in the run) */
    struct stat sn, sc;
    if (cc->in_place && e->read_bytes && off_cpu == e->read_bytes / ranks &&
        zn_config_nvme_paths(cfg, paths, ZN_SWAP_MAX_PATHS) == 1 && stat(nvme, &sn) == 0 &&
        stat(dir, &sc) == 0 && sn.st_dev == sc.st_dev)
        e->inplace_bytes = e->read_bytes;
    e->final_s = (double)(e->save_bytes - e->inplace_bytes) / e->write_bps +
                 (e->read_bytes > e->inplace_bytes
                      ? (double)(e->read_bytes - e->inplace_bytes) / e->read_bps : 0);
    e->world = world;
    /* every step committed by reference (as zn_ckpt_commit_possible and
     * zinc train judge it): the states kept in place, in two copies, on
     * every rank */
    if (cc->commit && cc->in_place && e->inplace_bytes && plan->spec_shadow) {
        int mb = plan->moment_bytes ? plan->moment_bytes : 4;
        int ms = plan->master_bytes ? plan->master_bytes : 4;
        /* the units in flight: the optimizer's read-ahead slots */
        int64_t slots = cfg->zero.offload_optimizer.buffer_count;
        double unit = (double)plan->sub_group * (double)(ms + 2 * mb) *
                      (double)(slots > 1 ? slots : 1);
        e->commit = true;
        e->drain_s = unit / e->read_bps + unit / (nv.nvme_write_bps > 0 ? nv.nvme_write_bps
                                                                         : e->write_bps);
    }
    stop_total(e, cc);
    return 0;
}

void zn_run_stop_set_update(zn_stop_estimate *e, const zn_config *cfg, double update_s)
{
    e->update_s = update_s > 0 ? update_s : 0;
    stop_total(e, &cfg->train.checkpoint);
}

/* The prediction beside the run's measured report, per step. */
void zn_run_cost_print_vs(const zn_cost *p, const zn_train_report *r, int world, FILE *f)
{
    if (!r->steps)
        return;
    double n = (double)r->steps, ms = r->step_s / n;
    fprintf(f, "cost model (per step)    predicted    measured\n");
    for (int i = 0; i < ZN_RES_COUNT; i++) {
        if (i == ZN_RES_COMM && world == 1)
            continue;
        if (p->busy_s[i] <= 0 && r->busy_s[i] / n < 1e-4)
            continue;
        fprintf(f, "  %-18s %9.1f ms %9.1f ms\n", zn_train_resource_name((zn_train_resource)i),
                p->busy_s[i] * 1e3, r->busy_s[i] / n * 1e3);
    }
    if (p->block_uses)
        fprintf(f, "  %-18s %9.1f ms %12s (%llu block uses)\n", "schedule overhead",
                p->overhead_s * 1e3, "-", (unsigned long long)p->block_uses);
    if (p->io_cpu_s > 0)
        fprintf(f, "  %-18s %9.1f ms %12s (the engine's CPU time per disk byte)\n",
                "disk on the cores", p->io_cpu_s * 1e3, "-");
    if (p->accum_tail_s > 0)
        fprintf(f, "  %-18s %9.1f ms %12s (the last backward's gradient copies and sums past "
                "its compute, before the optimizer)\n", "accumulation tail",
                p->accum_tail_s * 1e3, "-");
    if (p->exposed_opt_s > 0)
        fprintf(f, "  %-18s %9.1f ms %12s (the optimizer chain past the window)\n",
                "optimizer exposed", p->exposed_opt_s * 1e3, "-");
    fprintf(f, "predicted step time %.3f s (bound: %s), measured %.3f s (%+.0f%%)\n", p->step_s,
            zn_train_resource_name((zn_train_resource)p->bound), ms,
            p->step_s > 0 ? 100.0 * (p->step_s - ms) / ms : 0.0);
}
