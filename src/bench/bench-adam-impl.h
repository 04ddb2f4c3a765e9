/* zinc bench adam's shared pieces: the options, the arrays under test, the
 * table's rows, and the verification of each timed pass (adam_verify.c)
 * against a double-precision Adam step. Private to the two files. */
#ifndef ZN_BENCH_ADAM_IMPL_H
#define ZN_BENCH_ADAM_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "zinc/bench.h"
#include "zinc/optim.h"
#include "optim/optim-impl.h"

#define NSAMPLE ZN_BENCH_ADAM_SAMPLES
#define MAX_ITERS ZN_BENCH_ADAM_MAX_ITERS
#define SLAB_ALIGN ((size_t)2 << 20)   /* 2 MiB: transparent huge pages */
#define ARRAY_STAGGER (SLAB_ALIGN + 4096)
/* the hash seed of the bf16-master rows' stochastic rounding: fixed, so a
 * run's bits are reproducible (the step is each pass's Adam step) */
#define SR_SEED ZN_BENCH_ADAM_SR_SEED

typedef struct {
    size_t n;
    int threads;
    zn_dtype gt;
    int copy;
    zn_dtype ct;
    int iters;
    unsigned fmts;               /* bit per zn_mom_fmt */
    int sr;                      /* the bf16-master rows too */
} opts;

typedef struct {
    void *map;                   /* the mapping, for munmap */
    size_t map_len;
    char *slab;                  /* map rounded up to SLAB_ALIGN */
    size_t slab_bytes;
    float *p, *m, *v;
    void *g;
    uint16_t *c;
    uint16_t *ps;                /* bf16 master weights (master_sr) */
    uint16_t *mh, *vh;           /* bf16 moments */
    uint8_t *mq, *vq;            /* 8-bit codes and their blocks' absmax */
    float *am, *av;
} arrays;

enum { ROW_RMW, ROW_TRIAD, ROW_ADAM, ROW_PLAIN };

typedef struct {
    int kind;
    zn_mom_fmt fmt;
    int sr;                      /* bf16 master (zn_adam_step_sr) and its roofline */
    char name[24];               /* "adam avx2" */
    const zn_optim_ops *ops;       /* ROW_ADAM: the path */
    int is_auto;
    double best_s, sum_s;
    int runs;
    double t[MAX_ITERS];           /* each pass's seconds, in pass order */
    uint64_t wrong;
} row;

#define TOL ZN_BENCH_ADAM_TOL

typedef struct {
    size_t idx[NSAMPLE];
    float before[NSAMPLE][3];    /* p, m, v before the pass */
} sample;

float zn_ba_grad_value(size_t i, zn_dtype gt);
void zn_ba_sample_init(sample *s, const opts *o);
void zn_ba_sample_snap(sample *s, const arrays *a, zn_mom_fmt f, int sr);
uint64_t zn_ba_sample_unchanged(const sample *s, const arrays *a, zn_mom_fmt f, int sr);
uint64_t zn_ba_sample_step(const sample *s, const opts *o, const arrays *a,
                            const zn_adam_params *hp, float g_scale, zn_mom_fmt f, int sr);
uint64_t zn_ba_full_copy_check(const opts *o, const arrays *a);

#endif
