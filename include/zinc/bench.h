/* zinc benchmarks: the measuring half of every `zinc bench <what>`. Each
 * sets up its buffers, runs its timed loops, verifies the data it moved and
 * computes its rates and ratios against a ceiling measured in the same run;
 * the CLI parses the flags and prints what these functions return (rows
 * come through a callback or a struct, never printed here).
 *
 * Errors: every function returning int returns 0 or a negative code
 * (-errno, ZN_E*) with zn_last_error() set; where a bench has several
 * stages the message starts with the stage that failed ("device: ...",
 * "setup: ..."). Nothing here exits. Handles come from *_create / *_open
 * and go with *_destroy / *_close, which accept NULL. */
#ifndef ZINC_BENCH_H
#define ZINC_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "zinc/comm.h"
#include "zinc/cost.h"
#include "zinc/device.h"
#include "zinc/gensession.h"
#include "zinc/model.h"
#include "zinc/nvme.h"
#include "zinc/optim.h"
#include "zinc/run.h"
#include "zinc/train.h"
#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- adam: the fused CPU Adam step against its read-modify-write roofline ---- */

#define ZN_BENCH_ADAM_MAX_ITERS 200     /* timed passes per row at most */
#define ZN_BENCH_ADAM_SAMPLES 4096      /* elements each pass verifies */
#define ZN_BENCH_ADAM_TOL 1e-6          /* relative bound against the double step */
#define ZN_BENCH_ADAM_SR_SEED 0x5eedull /* the sr rows' rounding seed (fixed) */
#define ZN_BENCH_ADAM_ISAS 3            /* SIMD paths it knows, widest first */

typedef struct {
    size_t params;        /* parameters per step (256M) */
    int threads;          /* OpenMP threads (omp_get_max_threads()) */
    zn_dtype grad;        /* gradient dtype (fp32) */
    int copy;             /* write a 16-bit copy (0) */
    zn_dtype copy_dtype;  /* its dtype (bf16) */
    int iters;            /* timed passes per row, 1..ZN_BENCH_ADAM_MAX_ITERS (5) */
    unsigned states;      /* a bit per zn_mom_fmt; fp32 always timed (fp32 alone) */
    int master_sr;        /* also the bf16-master rows (zn_adam_step_sr) (0) */
    int nt_copy;          /* streaming stores for the copy: 0, 1; -1 (default): as is */
} zn_bench_adam_config;

ZN_API zn_bench_adam_config zn_bench_adam_config_default(void);

typedef struct zn_bench_adam zn_bench_adam;

/* What the header says of the run before it starts. */
typedef struct {
    size_t slab_bytes;                  /* the one mapping all arrays live in */
    char thp[32];                       /* transparent huge pages' mode, "?" unknown */
    zn_isa isas[ZN_BENCH_ADAM_ISAS];    /* the SIMD paths, widest first */
    int n_isas;
    int vbmi;                           /* the CPU has the AVX-512 VBMI table */
    int vbmi_on;                        /* the step's 8-bit pieces use it */
    const char *ceiling_path;           /* the table the ceilings run on */
    int nt_copy;                        /* streaming stores for the copy */
} zn_bench_adam_info;

/* One row of the table, after zn_bench_adam_run. */
typedef struct {
    char name[24];          /* "rmw", "triad", "adam avx2", "adam sr int8 avx512", "plain" */
    int is_auto;            /* the path the step picks (ZINC_SIMD / auto) */
    zn_mom_fmt fmt;
    int sr;                 /* a bf16-master row */
    double mparams_s, gbs;  /* best pass; the triad: the params/s its bandwidth carries */
    double roof_gbs;        /* the roofline of the row's own bytes (NaN: none) */
    double ratio;           /* gbs / roof_gbs */
    double median_ratio;    /* median over passes of the ratio within one pass */
    double vs_fp32;         /* params/s over the fp32 row of the same path (NaN: none) */
    double best_ms, mean_ms;
    uint64_t wrong;         /* sampled elements off the double step (+ the copy check) */
} zn_bench_adam_row;

typedef struct {
    double fill_s;          /* first touch of the arrays */
    int steps;              /* Adam steps taken over all rows */
    uint64_t copy_wrong;    /* copy elements not the rounding of p after the last step */
    size_t copy_elems;      /* elements that check saw (0 without a copy) */
} zn_bench_adam_result;

/* Maps and advises the slab (-ENOMEM, naming what is free, when it would
 * not fit) and plans the rows. */
ZN_API int zn_bench_adam_create(zn_bench_adam **out, const zn_bench_adam_config *cfg);
ZN_API void zn_bench_adam_get_info(const zn_bench_adam *b, zn_bench_adam_info *out);
/* Fills the arrays, times the triad, then every row's passes interleaved,
 * each verified. Returns 0 or the first failed step's code. */
ZN_API int zn_bench_adam_run(zn_bench_adam *b, zn_bench_adam_result *out);
ZN_API int zn_bench_adam_num_rows(const zn_bench_adam *b);
/* Row i (0 <= i < zn_bench_adam_num_rows) with its figures. */
ZN_API void zn_bench_adam_get_row(const zn_bench_adam *b, int i, zn_bench_adam_row *out);
/* Bytes one step moves per parameter with moments f and master sr. */
ZN_API double zn_bench_adam_bytes_per_param(const zn_bench_adam_config *cfg, zn_mom_fmt f,
                                            int sr);
ZN_API void zn_bench_adam_destroy(zn_bench_adam *b);

/* ---- pcie: host<->device copies against a plain copy loop and the link ---- */

typedef struct {
    const char *device;   /* zn_dev_config.name ("auto") */
    uint64_t lo, hi;      /* copy sizes in x4 steps (64K; hi 0: 1G on CUDA, 64M on host) */
    double min_bytes;     /* bytes per measurement at least (0: 1 GiB CUDA, 256 MiB host) */
} zn_bench_pcie_config;

ZN_API zn_bench_pcie_config zn_bench_pcie_config_default(void);

typedef struct zn_bench_pcie zn_bench_pcie;

typedef struct {
    int is_cuda;
    zn_dev_info dev;
    int host_locked;              /* the pinned buffers are page-locked */
    double ceil_h2d, ceil_d2h;    /* GB/s of the plain loop, this run */
    const char *ceiling;          /* what that loop is */
    uint64_t lo, hi;              /* the sizes it will time */
} zn_bench_pcie_info;

typedef struct {
    size_t bytes;
    int pinned;
    const char *dir;      /* "h2d", "d2h", "both" */
    int iters;
    double gbs, ceil_gbs, ratio;
    double link_gbs;      /* the PCIe peak (both ways for "both"); 0: no link */
    double link_pct;      /* 100 gbs / link_gbs; < 0: no link */
    uint64_t wrong;       /* 8-byte words not delivered intact */
} zn_bench_pcie_row;

/* A row as it is measured; a non-zero return stops the run with it. */
typedef int (*zn_bench_pcie_row_fn)(void *ctx, const zn_bench_pcie_row *r);

/* The device, its streams, events and buffers, filled, and the ceilings
 * (stages "device", "setup", "plain cudaMemcpyAsync loop"). */
ZN_API int zn_bench_pcie_create(zn_bench_pcie **out, const zn_bench_pcie_config *cfg);
ZN_API void zn_bench_pcie_get_info(const zn_bench_pcie *b, zn_bench_pcie_info *out);
/* Every size, pinned then pageable, each direction and both at once, each
 * verified; *total_wrong sums #wrong (a non-zero sum is not an error). */
ZN_API int zn_bench_pcie_run(zn_bench_pcie *b, zn_bench_pcie_row_fn fn, void *ctx,
                             uint64_t *total_wrong);
ZN_API void zn_bench_pcie_destroy(zn_bench_pcie *b);

/* ---- nvme: zinc's I/O engine against fio on the same file ---- */

typedef struct {
    const char *paths[ZN_SWAP_MAX_PATHS];  /* swap folders; several = striping */
    int npaths;
    uint64_t size;          /* bytes per run, the swap file's size (1 GiB) */
    int rw[2];              /* the directions in order, 1 write 0 read (write, read) */
    int nrw;
    int reps;               /* runs per row, zinc and fio interleaved (2) */
    int fio;                /* run fio beside zinc (1); clear it when prepare finds none */
    int crc;                /* the engine's crc32c (1) */
    int huge;               /* zinc's buffer on transparent huge pages (1) */
    FILE *diag;             /* warnings and a failed run's error as they happen (NULL: none) */
} zn_bench_nvme_config;

ZN_API zn_bench_nvme_config zn_bench_nvme_config_default(void);

typedef struct {
    char cpu[256];
    char kernel[65];        /* uname release */
    int have_fio;
    char fio_version[64];
    zn_nvme_probe_info probe;  /* of paths[0] */
} zn_bench_nvme_info;

/* Probes paths[0] (ZN_EARG, "probing --path"), finds fio, and removes what
 * killed benches left in the folders (a warning when it cannot). */
ZN_API int zn_bench_nvme_prepare(const zn_bench_nvme_config *cfg, zn_bench_nvme_info *out);

/* One block size x queue depth: its engine, swap file and buffer. */
typedef struct zn_bench_nvme_point zn_bench_nvme_point;

typedef struct {
    double gbs, iops, p50_us, p99_us;
    int ok;                 /* 0: the tool did not run (or failed) */
} zn_bench_nvme_figures;

typedef struct {
    int is_write;
    zn_bench_nvme_figures zinc, fio;  /* best of the reps */
    double ratio;           /* zinc GB/s / fio GB/s; 0 without fio */
    uint64_t wrong;         /* bytes off the seeded pattern in zinc's reads */
} zn_bench_nvme_row;

typedef struct {
    zn_bench_nvme_row rows[2];  /* in cfg->rw's order */
    int nrows;
    int failed;             /* a run failed (its error went to cfg->diag) */
} zn_bench_nvme_result;

/* Stages "creating the engine", "creating the swap file", "allocating". */
ZN_API int zn_bench_nvme_point_open(zn_bench_nvme_point **out, const zn_bench_nvme_config *cfg,
                                    uint64_t bs, int qd);
/* The engine's backend in words (zn_aio_backend_desc). */
ZN_API const char *zn_bench_nvme_point_engine(const zn_bench_nvme_point *p);
/* The untimed prefill, then the reps. A failed prefill returns its code
 * (its error went to cfg->diag) and no rows. */
ZN_API int zn_bench_nvme_point_run(zn_bench_nvme_point *p, zn_bench_nvme_result *out);
ZN_API void zn_bench_nvme_point_close(zn_bench_nvme_point *p);

/* ---- model: decoder blocks' TFLOP/s against the GEMM peak ---- */

typedef struct {
    zn_model_dims dims;
    zn_dev_config dev;
    int64_t batch, seq;
    int dtype;              /* ZN_DTYPE_F32 / _BF16; -1: the device's */
    int checkpoint;         /* recompute in the backward */
    int attention;          /* ZN_ATTN_* */
    int iters;              /* timed after one warm-up, best kept */
} zn_bench_model_config;

typedef struct {
    const char *name;       /* "layer fwd", "layer bwd", "head f+b", "model step" */
    double ms, model_tflops, hw_tflops;
    double ratio;           /* hw_tflops / the GEMM peak; 0 unknown */
} zn_bench_model_row;

typedef struct {
    zn_dev_info dev;
    zn_dtype dtype;
    int fused;              /* fused attention kernels */
    float loss;
    double want_loss;
    uint64_t wrong;         /* the probe's failed checks + a wrong GEMM element */
    int64_t gemm_n;         /* the GEMM ceiling's n (n^3) */
    double peak_tflops;
    int64_t tokens;         /* batch x seq */
    zn_bench_model_row rows[4];
} zn_bench_model_result;

/* Stages "device", "model", "events". */
ZN_API int zn_bench_model_run(const zn_bench_model_config *cfg, zn_bench_model_result *out);

/* ---- train: step time against the busiest resource ---- */

typedef struct {
    uint64_t wrong;           /* non-finite losses, norms, master weights */
    double loss_first, loss_last;
    zn_train_report report;   /* the counters of the measured steps */
    int busiest;              /* zn_train_resource (one disk's reads and writes: one) */
    double step_s, busy_s;    /* per step */
    double ratio;             /* step_s / busy_s; 0 unknown */
    double tokens_s;
} zn_bench_train_result;

/* warmup steps, the counters reset, then steps more; the master read back
 * and checked. Returns 0 or the failed step's (or sync's) code. */
ZN_API int zn_bench_train_steps(zn_run *ts, long warmup, long steps, zn_bench_train_result *out);
/* The cost model's prediction of the run's plan, as zinc train makes it:
 * the trainer and its device freed first (the plan copied). *predicted
 * says whether it ran (rank 0 only); returns 0 or its code (ZN_EARG: *pred
 * still holds what was predicted). */
ZN_API int zn_bench_train_predict(zn_run *ts, const zn_config *cfg, zn_cost *pred, FILE *note,
                                  int *predicted);

/* ---- comm: collectives' algbw and busbw against a ring send/recv ---- */

/* broadcast: from rank 0, in place; nccl-tests' busbw = algbw */
enum { ZN_BENCH_ALLGATHER = 0, ZN_BENCH_REDUCESCATTER, ZN_BENCH_ALLREDUCE, ZN_BENCH_BROADCAST,
       ZN_BENCH_COMM_OPS };
#define ZN_BENCH_COMM_MAX_SIZES 64

typedef struct {
    uint64_t sizes[ZN_BENCH_COMM_MAX_SIZES];  /* nccl-tests' sizes, bytes */
    int n_sizes;
    int ops[ZN_BENCH_COMM_OPS];   /* which to time */
    zn_dtype dtype;
    int iters;                    /* 0: 20, fewer for big sizes */
    int warmup;
    const char *device;           /* device buffers of this device; NULL: host buffers */
    double timeout;               /* seconds */
    double connect_timeout;       /* the rendezvous' seconds; 0: the communicator's default */
    uint64_t link_bytes;          /* the largest zn_bench_comm_links transfer; 0: none */
} zn_bench_comm_config;

/* "allgather", "reducescatter", "allreduce", "broadcast" (NULL past them). */
ZN_API const char *zn_bench_comm_op_name(int op);

typedef struct zn_bench_comm zn_bench_comm;

typedef struct {
    int op;
    uint64_t used;          /* nccl-tests' size in bytes */
    size_t count;           /* elements of that size */
    float t;                /* the slowest rank's mean seconds */
    double algbw, busbw, link, ratio;  /* GB/s; ratio busbw / link */
    float wrong;            /* wrong elements over the ranks */
} zn_bench_comm_row;

typedef int (*zn_bench_comm_row_fn)(void *ctx, const zn_bench_comm_row *r);

/* The launch environment, the device and the communicator (stages "launch
 * environment", "device", "creating the device", "creating the
 * communicator"). */
ZN_API int zn_bench_comm_create(zn_bench_comm **out, const zn_bench_comm_config *cfg);
ZN_API void zn_bench_comm_get_info(const zn_bench_comm *b, zn_comm_info *out);
ZN_API zn_comm *zn_bench_comm_comm(const zn_bench_comm *b);
/* 1 when the collectives run on device buffers. */
ZN_API int zn_bench_comm_on_device(const zn_bench_comm *b);
/* Collective: every rank calls it. The buffers, then per size the ring's
 * ceiling and each op, verified; fn is called on every rank (stages
 * "allocating buffers", "ring send/recv", "staging data", the op's name). */
ZN_API int zn_bench_comm_run(zn_bench_comm *b, zn_bench_comm_row_fn fn, void *ctx,
                             uint64_t *total_wrong);
/* One link of the ring at a time (the cluster check's pair bandwidths):
 * for each rank r, r alone sends `bytes` of seeded data to rank r + 1
 * (mod world) while the others wait; timed at the receiver, which verifies
 * every byte. Collective; rows[world] on every rank, rows[r] the link from
 * r. bytes <= the config's link_bytes. Returns 0 or a negative code
 * (stage "link r -> r+1"). */
typedef struct {
    int from, to;           /* ranks */
    uint64_t bytes;
    float t;                /* the receiver's mean seconds per transfer */
    double gbs;             /* bytes / t / 1e9 */
    float wrong;            /* wrong bytes at the receiver */
} zn_bench_link_row;
ZN_API int zn_bench_comm_links(zn_bench_comm *b, uint64_t bytes, int iters,
                               zn_bench_link_row *rows);
ZN_API void zn_bench_comm_destroy(zn_bench_comm *b);
/* The device of the collectives; NULL for host buffers. */
ZN_API zn_dev *zn_bench_comm_device(const zn_bench_comm *b);

/* ---- cluster: what `zinc launch --check` runs on every rank ----
 * Each rank's place (its host as the launcher names it, the machine's
 * hostname, its device and NUMA node, the interface toward its right
 * neighbour and that interface's speed), gathered to every rank; then the
 * verdict on the ring's links measured by zn_bench_comm_links. */
#define ZN_CLUSTER_NAME 64
typedef struct {
    int rank, local_rank, local_size;
    int numa;                          /* the NUMA node it runs on (the GPU's); -1 unknown */
    int nic_mbps;                      /* the interface's speed (Mb/s), 0 unknown */
    char host[ZN_CLUSTER_NAME];        /* $ZINC_LAUNCH_HOST (zinc launch sets it), else hostname */
    char hostname[ZN_CLUSTER_NAME];    /* gethostname() */
    char device[ZN_CLUSTER_NAME];      /* "cuda:0 NVIDIA A10", "host" */
    char addr[ZN_CLUSTER_NAME];        /* its address toward its right neighbour, "" unknown */
    char nic[32];                      /* that interface ("eth0"), "" unknown */
    char pad[512 - 5 * 4 - 4 * ZN_CLUSTER_NAME - 32];   /* 512 bytes, one allgather row */
} zn_cluster_rank;

/* Collective: every rank's zn_cluster_rank into out[world]. 0 or a code. */
ZN_API int zn_bench_cluster_ranks(zn_bench_comm *b, zn_cluster_rank *out);

/* A link of the ring judged: network when its two ranks are on different
 * hosts; the ceiling is the slower NIC's speed where both are known (0:
 * unknown); slow when a network link moves less than half the median of
 * the other network links (a link unlike its peers), or less than a
 * quarter of its NIC's speed. */
#define ZN_CLUSTER_SLOW_PEERS 0.5
#define ZN_CLUSTER_SLOW_NIC 0.25
typedef struct {
    int network;
    double nic_gbs;          /* ceiling (GB/s), 0 unknown */
    double peers_gbs;        /* median of the other network links, 0 none */
    int slow;                /* 1: flagged */
} zn_cluster_link_verdict;

/* Judges every link (v[world]); *slow_host[n] (n = world, by rank: 1 when
 * that rank's host has every network link in and out of it slow, at least
 * two of them) may be NULL. Returns the number of slow links. */
ZN_API int zn_bench_cluster_judge(const zn_cluster_rank *ranks, const zn_bench_link_row *links,
                                  int world, zn_cluster_link_verdict *v, int *slow_host);

/* ---- load: the trainer's weight load against a plain sequential read ---- */

typedef struct zn_bench_load zn_bench_load;

typedef struct {
    char summary[4400];     /* the loader's line on what it read */
    uint64_t data_bytes;    /* tensor bytes the model uses */
    int shards;
    int threads;            /* OpenMP */
    size_t plain_chunk;     /* the plain pass's pread size */
} zn_bench_load_info;

typedef struct {
    int round;              /* 1-based */
    uint64_t plain_bytes;
    double plain_s, plain_gbs;
    uint64_t zinc_bytes;
    double zinc_s, zinc_gbs, ratio;
    uint64_t wrong;         /* tensors whose crc32c differ */
} zn_bench_load_round;

typedef struct {
    double mean_ratio, best_ratio;
    uint64_t wrong;
} zn_bench_load_result;

typedef int (*zn_bench_load_round_fn)(void *ctx, const zn_bench_load_round *r);

ZN_API int zn_bench_load_create(zn_bench_load **out, const char *dir);
ZN_API void zn_bench_load_get_info(const zn_bench_load *b, zn_bench_load_info *out);
/* repeat rounds, each a plain pass and a zinc pass from a cold page cache
 * (warm: kept) (stages "plain pass", "zinc pass"). */
ZN_API int zn_bench_load_run(zn_bench_load *b, int repeat, int warm, zn_bench_load_round_fn fn,
                             void *ctx, zn_bench_load_result *out);
ZN_API void zn_bench_load_destroy(zn_bench_load *b);

/* ---- generate: prefill/decode tokens/s against a step's ceilings ---- */

typedef struct {
    const char *model;      /* the HF folder */
    zn_gen_place place;     /* as `zinc generate` places it; ctx and batch set */
    int64_t prompt_len, new_tokens;
} zn_bench_gen_config;

typedef struct zn_bench_gen zn_bench_gen;

typedef struct {
    zn_gen_placement placement;
    zn_ceilings fig;        /* after zn_bench_gen_ceilings */
    zn_dev_info dev;
    zn_dtype dtype;
} zn_bench_gen_info;

typedef struct {
    int64_t batch;
    double prefill_tps, decode_tps, step_ms, link_ms;
    double compute_ms;      /* < 0: not measured */
    double ratio;           /* the step's ceiling / the step; 0 unknown */
    double bound_tps;       /* the plan's bound; 0 unknown */
    double of_bound;        /* decode_tps / bound_tps; 0 unknown */
    double h2d_per_step, d2h_per_step;  /* bytes a decoding step moved */
    zn_gen_bytes moved, plan;           /* the decoding steps' bytes, run and plan */
    int wrong;              /* of moved's three counts, those not the plan's */
} zn_bench_gen_row;

/* Seeded prompts of cfg->place.batch sequences, the placed model (as
 * zn_gen_engine_open), and the resident one beside it when the device
 * holds every weight and the cache besides. */
ZN_API int zn_bench_gen_create(zn_bench_gen **out, const zn_model_dims *d,
                               const zn_bench_gen_config *cfg);
/* The figures a step is bounded by (zn_gen_link_figures). */
ZN_API int zn_bench_gen_ceilings(zn_bench_gen *b, const char *target, FILE *note);
ZN_API void zn_bench_gen_get_info(const zn_bench_gen *b, zn_bench_gen_info *out);
/* A warm-up and a timed run of `batch` prompts on the placed model (and the
 * resident one, whose ids it must give: ZN_ECORRUPT naming the prompt), the
 * link timed; stage "resident" for the resident run's failure. */
ZN_API int zn_bench_gen_batch(zn_bench_gen *b, int64_t batch, zn_bench_gen_row *out);
ZN_API void zn_bench_gen_destroy(zn_bench_gen *b);

#ifdef __cplusplus
}
#endif

#endif
