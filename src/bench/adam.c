/* zinc bench adam's measuring half: the fused CPU Adam step in params/s and
 * GB/s beside two ceilings measured in the same run on the same memory: a
 * read-modify-write pass with Adam's exact pattern and no arithmetic (the
 * roofline), and the STREAM triad; rows for each SIMD path and a plain
 * scalar loop; every row verified against a double-precision step of
 * sampled elements (adam_verify.c). Moments kept as bf16 or 8-bit
 * blockwise, and bf16 master weights rounded stochastically
 * (zn_adam_step_sr), each against a roofline of its own bytes and against
 * the fp32 step. The table itself is printed by src/cli/bench_adam.c. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "zinc/bench.h"
#include "zinc/optim.h"
#include "optim/optim-impl.h"
#include "bench/bench-adam-impl.h"
#include "util/hash-impl.h"

/* ---- data: a function of the element index ------------------------------- */

/* Sign-coherent values away from zero (as in tests/test_adam.c), so that
 * the replay can use a plain relative error. */
static void init_elem(size_t i, float *p, float *m, float *v, float *g)
{
    uint64_t h = zn_splitmix64(i);
    double s = (h & 1) ? 1.0 : -1.0;
    double u1 = (double)((h >> 1) & 0xfffff) / 0x100000, u2 = (double)((h >> 21) & 0xfffff) /
                                                              0x100000;
    double u3 = (double)((h >> 41) & 0xfffff) / 0x100000;
    *p = (float)(s * (0.5 + u1));
    *m = (float)(s * (0.01 + 0.1 * u2));
    *v = (float)(1e-4 + 0.01 * u3);
    *g = (float)(s * (0.05 + u1 * u3));
}

float zn_ba_grad_value(size_t i, zn_dtype gt)
{
    float p, m, v, g;
    init_elem(i, &p, &m, &v, &g);
    if (gt == ZN_DTYPE_BF16)
        return zn_bf16_to_f32(zn_f32_to_bf16(g));
    if (gt == ZN_DTYPE_F16)
        return zn_f16_to_f32(zn_f32_to_f16(g));
    return g;
}

/* Thread t's whole 8-bit blocks of n elements, as zn_adam_step_mom and
 * zn_adam_step_sr split them. */
static void block_range(size_t n, int nt, int t, size_t *lo, size_t *hi)
{
    size_t nb = zn_q8_blocks(n);
    *lo = nb * (size_t)t / (size_t)nt * ZN_Q8_BLOCK;
    *hi = nb * (size_t)(t + 1) / (size_t)nt * ZN_Q8_BLOCK;
    *hi = *hi < n ? *hi : n;
}

/* Fills (and so first-touches) the arrays with the threads and split the
 * kernels use, so that each page lands on the NUMA node that updates it. */
static void fill(const opts *o, arrays *a)
{
    size_t n = o->n;
#pragma omp parallel num_threads(o->threads)
    {
        size_t lo, hi;
        zn_optim_range(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
        for (size_t i = lo; i < hi; i++) {
            float g;
            init_elem(i, &a->p[i], &a->m[i], &a->v[i], &g);
            if (o->gt == ZN_DTYPE_F32)
                ((float *)a->g)[i] = g;
            else if (o->gt == ZN_DTYPE_BF16)
                ((uint16_t *)a->g)[i] = zn_f32_to_bf16(g);
            else
                ((uint16_t *)a->g)[i] = zn_f32_to_f16(g);
            if (a->c)
                a->c[i] = 0;
        }
    }
    if (a->ps) {
        /* the bf16 master by whole 8-bit blocks, as zn_adam_step_sr splits */
#pragma omp parallel num_threads(o->threads)
        {
            size_t lo, hi;
            block_range(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
            for (size_t i = lo; i < hi; i++)
                a->ps[i] = zn_f32_to_bf16(a->p[i]);
        }
    }
    /* the compressed moments start from the same values */
    zn_moments f32 = zn_moments_of(ZN_MOM_F32, a->m, a->v, NULL, NULL, ZN_Q8_BNB);
    zn_moments h = zn_moments_of(ZN_MOM_BF16, a->mh, a->vh, NULL, NULL, ZN_Q8_BNB);
    zn_moments q = zn_moments_of(ZN_MOM_Q8, a->mq, a->vq, a->am, a->av, ZN_Q8_BNB);
    if (a->mh)
        zn_mom_convert(&h, &f32, n);
    if (a->mq)
        zn_mom_convert(&q, &f32, n);
}

static zn_moments moments_of(const arrays *a, zn_mom_fmt f)
{
    zn_moments r = zn_moments_of(f, a->m, a->v, NULL, NULL, ZN_Q8_BNB);
    if (f == ZN_MOM_BF16)
        r.m = a->mh, r.v = a->vh;
    else if (f == ZN_MOM_Q8)
        r.m = a->mq, r.v = a->vq, r.m_absmax = a->am, r.v_absmax = a->av;
    return r;
}

/* Bytes a step moves per parameter: p read and written, g read, both
 * moments read and written, each 8-bit block's two absmax read and
 * written, the copy written. A bf16 master (sr) is 2 bytes each way and
 * has no copy: it is the working copy. */
static double bytes_per_param(const opts *o, zn_mom_fmt f, int sr)
{
    double mom = f == ZN_MOM_F32 ? 4 : f == ZN_MOM_BF16 ? 2 : 1;
    double blk = f == ZN_MOM_Q8 ? 2.0 * 8 / ZN_Q8_BLOCK : 0;
    if (sr)
        return 4 + (double)zn_dtype_size(o->gt) + 4 * mom + blk;
    return 8 + (double)zn_dtype_size(o->gt) + 4 * mom + blk + (o->copy ? 2 : 0);
}

static size_t round_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static int alloc_arrays(const opts *o, arrays *a)
{
    /* Arrays whose starts lie a large power of two apart (1 GiB for 256M
     * params) ran about 3x slower here, kernel and roofline alike: every
     * stream then hits the same cache sets and DRAM banks. A stagger of
     * 2 MiB + 4 KiB between starts removes that. */
    size_t n = o->n, f = round_up(n * 4, SLAB_ALIGN) + ARRAY_STAGGER;
    size_t gb = round_up(n * zn_dtype_size(o->gt), SLAB_ALIGN) + ARRAY_STAGGER;
    size_t cb = o->copy ? round_up(n * 2, SLAB_ALIGN) + ARRAY_STAGGER : 0;
    size_t hb = round_up(n * 2, SLAB_ALIGN) + ARRAY_STAGGER;
    size_t qb = round_up(n, SLAB_ALIGN) + ARRAY_STAGGER;
    size_t ab = round_up(zn_q8_blocks(n) * 4, SLAB_ALIGN) + ARRAY_STAGGER;
    int bf = (o->fmts >> ZN_MOM_BF16) & 1, q8 = (o->fmts >> ZN_MOM_Q8) & 1;
    a->slab_bytes = 3 * f + gb + cb + (bf ? 2 * hb : 0) + (q8 ? 2 * qb + 2 * ab : 0) +
                    (o->sr ? hb : 0);
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0 && (double)a->slab_bytes > 0.85 * (double)pages * (double)psz) {
        char want[32], have[32];
        zn_format_size(a->slab_bytes, want, sizeof want);
        zn_format_size((uint64_t)pages * (uint64_t)psz, have, sizeof have);
        return zn_set_error(-ENOMEM, "%zu params need %s; %s of memory is free: use a "
                            "smaller --params", n, want, have);
    }
    void *s = mmap(NULL, a->slab_bytes + SLAB_ALIGN, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED)
        return zn_set_error(-errno, "mmap of %zu bytes: %s", a->slab_bytes, strerror(errno));
    a->map = s;
    a->map_len = a->slab_bytes + SLAB_ALIGN;
    a->slab = (char *)round_up((size_t)(uintptr_t)s, SLAB_ALIGN);
    if (madvise(a->slab, a->slab_bytes, MADV_HUGEPAGE) != 0) {
        static int warned;
        zn_warn_once(&warned, "madvise(MADV_HUGEPAGE): %s; timing with 4 KiB pages",
                     strerror(errno));
    }
    a->p = (float *)a->slab;
    a->m = (float *)(a->slab + f);
    a->v = (float *)(a->slab + 2 * f);
    a->g = a->slab + 3 * f;
    char *at = a->slab + 3 * f + gb;
    a->c = o->copy ? (uint16_t *)at : NULL;
    at += cb;
    if (bf) {
        a->mh = (uint16_t *)at;
        a->vh = (uint16_t *)(at + hb);
        at += 2 * hb;
    }
    if (q8) {
        a->mq = (uint8_t *)at;
        a->vq = (uint8_t *)(at + qb);
        a->am = (float *)(at + 2 * qb);
        a->av = (float *)(at + 2 * qb + ab);
        at += 2 * qb + 2 * ab;
    }
    if (o->sr)
        a->ps = (uint16_t *)at;
    return 0;
}

/* ---- the timed passes ---------------------------------------------------- */

static void run_rmw(const opts *o, const zn_optim_ops *ops, arrays *a, zn_mom_fmt f)
{
    size_t gs = zn_dtype_size(o->gt), n = o->n;
#pragma omp parallel num_threads(o->threads)
    {
        size_t lo, hi;
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        if (f == ZN_MOM_F32) {
            zn_optim_range(n, nt, t, &lo, &hi);
            if (hi > lo)
                ops->rmw(a->p + lo, a->m + lo, a->v + lo, (char *)a->g + lo * gs, o->gt,
                         a->c ? a->c + lo : NULL, hi - lo);
        } else {
            block_range(n, nt, t, &lo, &hi);
            zn_moments mv = moments_of(a, f);
            int mb = f == ZN_MOM_Q8 ? 1 : 2;
            if (hi > lo)
                ops->rmw_mom(a->p + lo, 4, (char *)mv.m + lo * (size_t)mb,
                             (char *)mv.v + lo * (size_t)mb, mb,
                             mv.m_absmax ? mv.m_absmax + lo / ZN_Q8_BLOCK : NULL,
                             mv.v_absmax ? mv.v_absmax + lo / ZN_Q8_BLOCK : NULL,
                             (char *)a->g + lo * gs, o->gt, a->c ? a->c + lo : NULL, hi - lo);
        }
    }
}

/* the bf16-master step's bytes: p 2, g and the moments of format f */
static void run_rmw_sr(const opts *o, const zn_optim_ops *ops, arrays *a, zn_mom_fmt f)
{
    size_t gs = zn_dtype_size(o->gt);
    zn_moments mv = moments_of(a, f);
    int mb = f == ZN_MOM_F32 ? 4 : f == ZN_MOM_BF16 ? 2 : 1;
#pragma omp parallel num_threads(o->threads)
    {
        size_t lo, hi;
        block_range(o->n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
        if (hi > lo)
            ops->rmw_mom(a->ps + lo, 2, (char *)mv.m + lo * (size_t)mb,
                         (char *)mv.v + lo * (size_t)mb, mb,
                         mv.m_absmax ? mv.m_absmax + lo / ZN_Q8_BLOCK : NULL,
                         mv.v_absmax ? mv.v_absmax + lo / ZN_Q8_BLOCK : NULL,
                         (char *)a->g + lo * gs, o->gt, NULL, hi - lo);
    }
}

/* a = b + s * c over the whole slab in three equal parts */
static size_t triad_len(const arrays *a)
{
    return a->slab_bytes / 12 / ZN_OPTIM_BLOCK * ZN_OPTIM_BLOCK;
}

static void run_triad(const opts *o, const zn_optim_ops *ops, arrays *a)
{
    size_t n = triad_len(a);
    float *x = (float *)a->slab, *y = x + n, *z = y + n;
#pragma omp parallel num_threads(o->threads)
    {
        size_t lo, hi;
        zn_optim_range(n, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
        if (hi > lo)
            ops->triad(x + lo, y + lo, z + lo, 3.0f, hi - lo);
    }
}

/* ---- figures ---------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* The median over passes of (roofline time / row time) in the same pass:
 * the two ran back to back, so a slow moment of the shared machine hits
 * both. The triad does not interleave: its median time against the
 * roofline's. */
static double median_ratio(const row *roof, const row *w, double w_bytes, double roof_bytes)
{
    double r[MAX_ITERS];
    int n = roof->runs < w->runs ? roof->runs : w->runs;
    if (w->kind == ROW_TRIAD) {
        double a[MAX_ITERS], b[MAX_ITERS];
        memcpy(a, roof->t, (size_t)roof->runs * sizeof *a);
        memcpy(b, w->t, (size_t)w->runs * sizeof *b);
        return (w_bytes / median(b, w->runs)) / (roof_bytes / median(a, roof->runs));
    }
    for (int i = 0; i < n; i++)
        r[i] = (w_bytes / w->t[i]) / (roof_bytes / roof->t[i]);
    return median(r, n);
}

static void thp_mode(char *buf, size_t len)
{
    snprintf(buf, len, "?");
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return;
    char line[128] = "";
    if (fgets(line, sizeof line, f)) {
        char *l = strchr(line, '['), *r = l ? strchr(l, ']') : NULL;
        if (l && r) {
            *r = 0;
            snprintf(buf, len, "%s", l + 1);
        }
    }
    fclose(f);
}

/* ---- the rows ------------------------------------------------------------------ */

/* the SIMD paths, widest first: the ceilings run on the first one there */
static const zn_isa isas[] = { ZN_ISA_AVX512, ZN_ISA_AVX2, ZN_ISA_SCALAR };
#define N_ISAS (sizeof isas / sizeof isas[0])
#define MAX_ROWS 32
_Static_assert(N_ISAS == ZN_BENCH_ADAM_ISAS, "zinc/bench.h counts the SIMD paths");

/* The op tables the rows name: the one ZINC_SIMD/auto picks for the step
 * (its rows marked *), and the widest one, which the ceilings run on. */
typedef struct {
    const zn_optim_ops *best;
    const zn_optim_ops *widest;
} paths;

static paths find_paths(void)
{
    paths ps = { .best = zn_optim_get_ops(ZN_ISA_AUTO), .widest = NULL };
    for (size_t i = 0; i < N_ISAS && !ps.widest; i++)
        ps.widest = zn_optim_get_ops(isas[i]);
    if (ps.widest && ps.widest->isa == ZN_ISA_AVX512)
        ps.widest = zn_optim_get_ops_novbmi();   /* the same ceilings, by their own name */
    return ps;
}

/* The step rows of format f and master sr (sr: the bf16 one): one per
 * SIMD path of this CPU, two for AVX-512 int8 with VBMI. Returns nrows. */
static int add_adam_rows(row *rows, int nrows, const paths *ps, zn_mom_fmt f, int sr)
{
    const char *fname = zn_mom_fmt_name(f), *ms = sr ? " sr" : "";
    for (size_t i = 0; i < N_ISAS; i++) {
        const zn_optim_ops *ops = zn_optim_get_ops(isas[i]), *chosen = ops;
        if (!ops)
            continue;
        /* The VBMI table differs from the AVX-512 one only in the
         * 8-bit pieces: fp32 and bf16 rows name the AVX-512 one;
         * int8 rows time both, so that one run compares them. */
        const zn_optim_ops *no_vbmi = zn_optim_get_ops_novbmi();
        int vbmi = isas[i] == ZN_ISA_AVX512 && ops != no_vbmi;
        if (vbmi && f != ZN_MOM_Q8)
            ops = no_vbmi;
        for (int twice = 0; twice < 1 + (vbmi && f == ZN_MOM_Q8); twice++) {
            const zn_optim_ops *x = twice ? no_vbmi : ops;
            row r = { .kind = ROW_ADAM, .fmt = f, .sr = sr, .ops = x,
                      .is_auto = chosen == ps->best && !twice };
            snprintf(r.name, sizeof r.name, f == ZN_MOM_F32 ? "adam%s %s" : "adam%s %s %s", ms,
                     f == ZN_MOM_F32 ? x->name : fname, x->name);
            rows[nrows++] = r;
        }
    }
    return nrows;
}

/* The rows: per state format its roofline and a row per SIMD path; the
 * triad once (first: rows[0]); the plain loop for fp32; with --master
 * bf16_sr the same per format for the bf16 master after the fp32-master
 * ones (at most 28: 13 per master, the plain loop and the triad). Returns
 * the number of rows. */
static int plan_rows(const opts *o, const paths *ps, row rows[MAX_ROWS])
{
    int nrows = 0;
    rows[nrows++] = (row){ .kind = ROW_TRIAD, .name = "triad", .ops = ps->widest };
    for (int f = ZN_MOM_F32; f <= ZN_MOM_Q8; f++) {
        if (!((o->fmts >> f) & 1))
            continue;
        const char *fname = zn_mom_fmt_name((zn_mom_fmt)f);
        for (int sr = 0; sr <= o->sr; sr++) {
            const char *ms = sr ? " sr" : "";
            row rr = { .kind = ROW_RMW, .fmt = (zn_mom_fmt)f, .sr = sr, .ops = ps->widest };
            snprintf(rr.name, sizeof rr.name, f == ZN_MOM_F32 ? "rmw%s" : "rmw%s %s", ms, fname);
            rows[nrows++] = rr;
            nrows = add_adam_rows(rows, nrows, ps, (zn_mom_fmt)f, sr);
            if (f == ZN_MOM_F32 && !sr)
                rows[nrows++] = (row){ .kind = ROW_PLAIN, .name = "plain" };
        }
    }
    return nrows;
}

/* ---- the timing ---------------------------------------------------------------- */

/* one timed pass of w took dt seconds */
static void record_pass(row *w, double dt)
{
    w->t[w->runs] = dt;
    w->best_s = fmin(w->best_s, dt);
    w->sum_s += dt;
    w->runs++;
}

/* The triad's passes, then a check of a sample of a = b + 3c (the last
 * pass wrote a from b, c). It overwrites the data: fill again after. */
static void time_triad(const opts *o, arrays *a, row *tr)
{
    tr->best_s = INFINITY;
    size_t tn = triad_len(a);
    for (int it = 0; it < o->iters; it++) {
        double s0 = zn_now_s();
        run_triad(o, tr->ops, a);
        record_pass(tr, zn_now_s() - s0);
    }
    const float *x = (float *)a->slab, *y = x + tn, *z = y + tn;
    for (size_t k = 0; k < NSAMPLE; k++) {
        size_t i = (size_t)(zn_splitmix64(k + 99) % tn);
        double want = (double)y[i] + 3.0 * (double)z[i];
        if (!(fabs((double)y[i]) < 1e30 && fabs((double)z[i]) < 1e30))
            continue;   /* 8-bit codes and bf16 pairs read as floats: NaN, Inf, huge */
        /* one rounding of the terms' magnitude (they may cancel) */
        double mag = fabs((double)y[i]) + 3.0 * fabs((double)z[i]);
        tr->wrong += !(fabs(x[i] - want) <= 1e-6 * mag + 1e-30);
    }
}

/* One pass of row w (not the triad): its roofline or its Adam step.
 * Returns 0 or the step's negative code. */
static int run_row(const opts *o, arrays *a, const row *w, const zn_adam_params *hp)
{
    if (w->kind == ROW_RMW && w->sr) {
        run_rmw_sr(o, w->ops, a, w->fmt);
        return 0;
    }
    if (w->kind == ROW_RMW) {
        run_rmw(o, w->ops, a, w->fmt);
        return 0;
    }
    if (w->sr) {
        zn_moments mv = moments_of(a, w->fmt);
        return zn_adam_step_sr_with(w->ops, hp, a->ps, &mv, a->g, o->gt, 1.0f, SR_SEED, 0,
                                    o->n);
    }
    if (w->fmt != ZN_MOM_F32) {
        zn_moments mv = moments_of(a, w->fmt);
        return zn_adam_step_mom_with(w->ops, hp, a->p, &mv, a->g, o->gt, 1.0f, a->c, o->ct,
                                     o->n);
    }
    zn_adam_kernel_fn k = w->kind == ROW_PLAIN ? zn_adam_plain_kernel : w->ops->adam;
    return zn_adam_step_with(k, hp, a->p, a->m, a->v, a->g, o->gt, 1.0f, a->c, o->ct, o->n);
}

/* The interleaved passes of every row after the triad, each verified on
 * the sampled elements; *hp is the step's hyperparameters, its step one
 * past the last step taken; *last_step the last row whose step wrote the
 * copy (-1: none). Returns 0 or a step's negative code. */
static int time_rows(const opts *o, arrays *a, row *rows, int nrows, zn_adam_params *hp,
                     int *last_step)
{
    sample smp;
    zn_ba_sample_init(&smp, o);
    *hp = zn_adam_params_default();
    hp->weight_decay = 0.01f;
    hp->threads = o->threads;
    hp->step = 1;
    for (int r = 1; r < nrows; r++)
        rows[r].best_s = INFINITY;
    *last_step = -1;
    for (int it = 0; it < o->iters; it++) {
        for (int r = 1; r < nrows; r++) {
            row *w = &rows[r];
            zn_ba_sample_snap(&smp, a, w->fmt, w->sr);
            double s0 = zn_now_s();
            int rc = run_row(o, a, w, hp);
            if (rc < 0)
                return rc;
            record_pass(w, zn_now_s() - s0);
            if (w->kind == ROW_RMW) {
                w->wrong += zn_ba_sample_unchanged(&smp, a, w->fmt, w->sr);
            } else {
                w->wrong += zn_ba_sample_step(&smp, o, a, hp, 1.0f, w->fmt, w->sr);
                hp->step++;
                if (!w->sr)
                    *last_step = r;   /* sr rows write no copy */
            }
        }
    }
    return 0;
}

/* a row's figures in the table */
typedef struct {
    double mps, gbs, roof_gbs, ratio, med, vs;
} row_figures;

static row_figures figures_of(const opts *o, const arrays *a, const row *rows, int nrows,
                              const row *w)
{
    /* this row's own roofline: the rmw row of its format and master
     * (the triad: the fp32 one) */
    const row *roof = NULL, *f32 = NULL;
    for (int q = 0; q < nrows; q++) {
        const row *x = &rows[q];
        if (x->kind == ROW_RMW && x->fmt == w->fmt && x->sr == w->sr && !roof)
            roof = x;
        /* the same path: the same table, or AVX-512 with or without VBMI */
        int same = x->ops == w->ops || (x->ops && w->ops && x->ops->isa == w->ops->isa);
        /* sr rows: the fp32-master row of the same table and format */
        int base = w->sr ? x->fmt == w->fmt && x->ops == w->ops
                         : x->fmt == ZN_MOM_F32 && same;
        if (x->kind == w->kind && !x->sr && base && !f32)
            f32 = x;
    }
    row_figures fg;
    size_t tn = triad_len(a);
    double bytes_pp = bytes_per_param(o, ZN_MOM_F32, 0);
    double bpp = bytes_per_param(o, w->fmt, w->sr);
    if (w->kind == ROW_TRIAD) {
        fg.gbs = 12.0 * (double)tn / w->best_s / 1e9;
        fg.mps = fg.gbs * 1e9 / bytes_pp / 1e6;   /* the params/s this bandwidth would give */
    } else {
        fg.mps = (double)o->n / w->best_s / 1e6;
        fg.gbs = bpp * (double)o->n / w->best_s / 1e9;
    }
    fg.roof_gbs = roof ? bpp * (double)o->n / roof->best_s / 1e9 : NAN;
    fg.ratio = fg.gbs / fg.roof_gbs;
    double w_bytes = w->kind == ROW_TRIAD ? 12.0 * (double)tn : bpp * (double)o->n;
    fg.med = roof ? median_ratio(roof, w, w_bytes, bpp * (double)o->n) : NAN;
    /* params/s over the fp32 row of the same kind and path */
    fg.vs = f32 && w->kind != ROW_TRIAD ? f32->best_s / w->best_s : NAN;
    return fg;
}

/* ---- the API ------------------------------------------------------------------ */

struct zn_bench_adam {
    opts o;
    arrays a;
    paths ps;
    row rows[MAX_ROWS];
    int nrows;
};

zn_bench_adam_config zn_bench_adam_config_default(void)
{
    return (zn_bench_adam_config){ .params = (size_t)256 << 20, .threads = omp_get_max_threads(),
                                   .grad = ZN_DTYPE_F32, .copy = 0, .copy_dtype = ZN_DTYPE_BF16,
                                   .iters = 5, .states = 1u << ZN_MOM_F32, .master_sr = 0,
                                   .nt_copy = -1 };
}

static opts opts_of(const zn_bench_adam_config *c)
{
    return (opts){ .n = c->params, .threads = c->threads, .gt = c->grad, .copy = c->copy,
                   .ct = c->copy_dtype, .iters = c->iters,
                   .fmts = c->states | 1u << ZN_MOM_F32, .sr = c->master_sr };
}

double zn_bench_adam_bytes_per_param(const zn_bench_adam_config *cfg, zn_mom_fmt f, int sr)
{
    opts o = opts_of(cfg);
    return bytes_per_param(&o, f, sr);
}

int zn_bench_adam_create(zn_bench_adam **out, const zn_bench_adam_config *cfg)
{
    *out = NULL;
    if (cfg->params < 1 || cfg->threads < 1 || cfg->iters < 1 || cfg->iters > MAX_ITERS)
        return zn_set_error(ZN_EARG, "%zu params, %d threads, %d passes: out of range", cfg->params,
                            cfg->threads, cfg->iters);
    zn_bench_adam *b = calloc(1, sizeof *b);
    if (!b)
        return zn_set_error(-ENOMEM, "out of memory");
    if (cfg->nt_copy >= 0)
        zn_optim_nt_copy = cfg->nt_copy != 0;
    b->o = opts_of(cfg);
    int rc = alloc_arrays(&b->o, &b->a);
    if (rc < 0) {
        free(b);
        return rc;
    }
    b->ps = find_paths();
    b->nrows = plan_rows(&b->o, &b->ps, b->rows);
    *out = b;
    return 0;
}

void zn_bench_adam_get_info(const zn_bench_adam *b, zn_bench_adam_info *out)
{
    memset(out, 0, sizeof *out);
    out->slab_bytes = b->a.slab_bytes;
    thp_mode(out->thp, sizeof out->thp);
    for (size_t i = 0; i < N_ISAS; i++)
        out->isas[out->n_isas++] = isas[i];
    out->vbmi = zn_optim_get_ops_vbmi() != NULL;
    out->vbmi_on = out->vbmi && b->ps.best == zn_optim_get_ops_vbmi();
    out->ceiling_path = b->ps.widest->name;
    out->nt_copy = zn_optim_nt_copy;
}

int zn_bench_adam_run(zn_bench_adam *b, zn_bench_adam_result *out)
{
    const opts *o = &b->o;
    arrays *a = &b->a;
    memset(out, 0, sizeof *out);
    double t0 = zn_now_s();
    fill(o, a);
    out->fill_s = zn_now_s() - t0;
    time_triad(o, a, &b->rows[0]);
    fill(o, a);

    zn_adam_params hp;
    int last_step;
    int rc = time_rows(o, a, b->rows, b->nrows, &hp, &last_step);
    if (rc < 0)
        return rc;
    uint64_t copy_bad = zn_ba_full_copy_check(o, a);
    if (last_step >= 0)
        b->rows[last_step].wrong += copy_bad;   /* the last step wrote every copy element */
    out->steps = (int)(hp.step - 1);
    out->copy_wrong = copy_bad;
    out->copy_elems = a->c ? o->n : 0;
    return 0;
}

int zn_bench_adam_num_rows(const zn_bench_adam *b)
{
    return b->nrows;
}

void zn_bench_adam_get_row(const zn_bench_adam *b, int i, zn_bench_adam_row *out)
{
    const row *w = &b->rows[i];
    row_figures fg = figures_of(&b->o, &b->a, b->rows, b->nrows, w);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", w->name);
    out->is_auto = w->is_auto;
    out->fmt = w->fmt;
    out->sr = w->sr;
    out->mparams_s = fg.mps;
    out->gbs = fg.gbs;
    out->roof_gbs = fg.roof_gbs;
    out->ratio = fg.ratio;
    out->median_ratio = fg.med;
    out->vs_fp32 = fg.vs;
    out->best_ms = w->best_s * 1e3;
    out->mean_ms = w->sum_s / w->runs * 1e3;
    out->wrong = w->wrong;
}

void zn_bench_adam_destroy(zn_bench_adam *b)
{
    if (!b)
        return;
    if (b->a.map)
        munmap(b->a.map, b->a.map_len);
    free(b);
}
