/* Private side of the trainer: the tier manager (allocators with budgets, the
 * tensor registry, link counters), the NVMe completion queues, the flat
 * parameter space cut into blocks, optimizer units and their pieces, and the
 * trainer object shared by the schedule (train.c) and the optimizer
 * pipeline (sched_optim.c). */
#ifndef ZN_TRAIN_IMPL_H
#define ZN_TRAIN_IMPL_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "zinc/comm.h"

#include "zinc/device.h"
#include "zinc/nvme.h"
#include "zinc/optim.h"
#include "zinc/plan.h"
#include "zinc/trace.h"
#include "zinc/train.h"
#include "train/train-state.h"

/* ---- tier manager ----------------------------------------------------------*/
typedef struct {
    char name[48];
    zn_state_class cls;
    zn_tier home;
    uint64_t bytes;
    void *ptr;       /* GPU (arena) or CPU (pinned) */
    zn_extent ext;   /* NVMe */
    unsigned valid;  /* bit t: tier t holds a valid copy */
} zn_tier_tensor;

typedef struct {
    zn_dev *dev;
    zn_aio *aio;
    zn_swap *swap;
    uint64_t budget[ZN_TIER_COUNT];
    zn_tier_tensor *t;
    int n, cap;
    pthread_mutex_t lock;
    _Atomic uint64_t h2d, d2h, nvme_read, nvme_write;  /* bytes moved */
} zn_tier_mgr;

int zn_tier_init(zn_tier_mgr *m, zn_dev *dev, const zn_plan_budgets *b);
/* Creates the NVMe engine and a swap space of `bytes` over the config's
 * paths (tiers.nvme, else the offload nvme_path directories, created when
 * missing). Fails with ZN_EBUDGET when bytes exceed the NVMe budget. */
int zn_tier_open_nvme(zn_tier_mgr *m, const zn_spec *sp, uint64_t bytes,
                      zn_aio_fault_fn hook, void *hook_user);
/* Allocates `bytes` in `tier` and registers it; returns the tensor id
 * (>= 0) or a negative status (ZN_EBUDGET names the tensor). */
int zn_tier_alloc(zn_tier_mgr *m, zn_tier tier, zn_state_class cls, uint64_t bytes,
                  const char *name, int *id);
static inline zn_tier_tensor *zn_tier_get(zn_tier_mgr *m, int id)
{
    return &m->t[id];
}
void zn_tier_set_valid(zn_tier_mgr *m, int id, zn_tier t, bool valid);
/* Frees every tensor, the swap space and the engine (not the device). */
void zn_tier_fini(zn_tier_mgr *m);
void zn_tier_usage(zn_tier_mgr *m, uint64_t used[ZN_TIER_COUNT], uint64_t peak[ZN_TIER_COUNT]);

/* ---- NVMe completion queues: one thread waits on each direction's
 * requests in submission order, so that a request's completion time (and
 * its status and error text) is known without the consumer polling, and
 * NVMe busy time is the union of [submit, completion]. -------------------*/
typedef struct zn_io_req {
    zn_aio_handle h;
    int is_write;
    _Atomic int done;
    int status;
    uint64_t bytes;
    uint64_t t_submit, t_done;
    char what[48];
    char msg[320];
    /* called on the queue's thread once the request completed (status set,
     * done not yet), for completions nobody waits on synchronously */
    void (*on_done)(struct zn_io_req *r);
    void *on_done_arg;
    struct zn_io_req *next;
} zn_io_req;

typedef struct {
    zn_aio *aio;
    zn_trace *trace;
    int track;
    pthread_t thr;
    bool started, stop;
    pthread_mutex_t lock;
    pthread_cond_t cv_in, cv_done;
    zn_io_req *head, *tail;
    uint64_t n_queued, n_completed;  /* under lock; requests complete in order */
    _Atomic uint64_t *bytes_counter;
} zn_ioq;

int zn_ioq_start(zn_ioq *q, zn_aio *aio, zn_trace *tr, int track, _Atomic uint64_t *counter);
void zn_ioq_stop(zn_ioq *q);
/* Submits a read or write of [0, len) of `e` and queues it. On a submit
 * failure returns the status (req->done is set, req->status holds it). */
int zn_ioq_submit(zn_ioq *q, zn_io_req *r, int is_write, const zn_extent *e, void *buf,
                  size_t len, const char *what);
/* zn_ioq_submit with a completion callback (never called when the submit
 * itself fails). */
int zn_ioq_submit_cb(zn_ioq *q, zn_io_req *r, int is_write, const zn_extent *e, void *buf,
                     size_t len, const char *what, void (*on_done)(zn_io_req *), void *arg);
/* Waits until r completed; returns its status with zn_last_error set. A
 * request never submitted (h == 0 and done) returns its status. */
int zn_ioq_wait(zn_ioq *q, zn_io_req *r);
/* Waits until every request queued before the call has completed (those
 * queued after it, by another thread, are not waited for). The requests'
 * owners still wait on them for their status. */
void zn_ioq_fence(zn_ioq *q);

/* ---- the flat parameter space ----------------------------------------------*/
typedef struct {
    int block, unit;
    uint64_t start, n;      /* flat range */
    int grad_id;            /* NVMe grad accumulator piece (-1 otherwise) */
    int64_t gram_off;       /* grads on NVMe but this piece's in pinned RAM (the
                               room tiers.grads=auto found): its offset in
                               tr->gram (elements); -1 otherwise */
    int param_id;           /* NVMe param piece (-1 otherwise) */
    /* optimizer thread: the param cache entry (index + 1; 0: none) a
     * speculative update of this piece went into, for job pc_seq; held
     * there until the update commits (sched_optim.c) */
    int pc_ent1;
    int64_t pc_seq;
} zn_piece;

typedef enum { ZN_PHOME_DEVICE = 0, ZN_PHOME_CPU, ZN_PHOME_NVME } zn_param_home;

/* A block's parameters: n elements in the model. With world size N > 1 the
 * block is padded to npad = N * shard elements (zn_comm_shard) and this rank
 * owns [soff, soff + len); the optimizer side (master, m, v, gradient
 * accumulators, pieces) holds only those len elements, at `off` in the
 * rank's local flat space. The working params at their home are the whole
 * block (npad; replicated: world 1, or ZeRO stages 1/2) or only the rank's
 * shard (shard elements, padding zero: stage 3 with N > 1), which every use
 * all-gathers into a device slot. */
typedef struct {
    uint64_t off, n;
    /* frozen: the block's first `frozen` elements never train (a LoRA
     * base): the optimizer side (master, m, v, gradients, pieces, the
     * device gradient buffer) covers only [frozen, n), sharded on its own
     * (gpad = N x shard elements of gradient buffer; soff counts from the
     * block's start), and an NVMe home keeps the frozen part in one extent
     * of its own that is written once, at setup. */
    uint64_t frozen, gpad;
    /* ZeRO stage 3 across ranks with a frozen part: the frozen part is
     * sharded on its own too, fshard elements per rank (padded), this
     * rank's at block element foff. The home holds [frozen shard | trainable
     * shard] (fshard + shard elements), and a fetch all-gathers both into
     * the slot: the frozen part to element 0, the trainable part to
     * `frozen` (after, so that it overwrites the frozen gather's padding).
     * fshard is 0 in every other case. */
    uint64_t fshard, foff;
    int frozen_id;          /* NVMe home: the frozen part's extent (-1 none) */
    uint64_t npad, shard, soff, len;
    bool replicated;        /* home holds the whole block */
    zn_param_home home;
    bool persistent;        /* whole block resident on the device: no fetch */
    int gfirst, glast;      /* the blocks of its layer (zn_train_model.block_joins) */
    int group;              /* that layer's index */
    int param_id;           /* device or cpu buffer (home DEVICE / CPU) */
    void *dev_params;       /* home DEVICE: the device buffer */
    void *cpu_params;       /* home CPU: pinned */
    int p0, np;             /* pieces */
    int64_t nc_off;         /* device optimizer: its first chunk sum (normc) */
    double grad_sq;         /* sum of squares of the block's final grads */
    int grad_nonfinite;
    bool pc_ok;             /* home NVMe and this rank's pieces cover the
                               whole home: the param cache may hold it */
    int64_t pc_skip;        /* job whose update found no free cache entry */
    int64_t srow0;          /* row-sparse gradients (zn_train_model.block_sparse_row0):
                               the first row; -1: dense */
} zn_block;

typedef struct zn_trainer zn_trainer;

/* A unit (sub-group) of the optimizer. Its updated working parameters
 * "land" when every copy of them reached its home (pinned memcpy done, NVMe
 * writes complete, device H2D complete); pdone then holds the job that
 * produced them, and the next step's fetches wait on it. */
typedef struct {
    uint64_t off, n;
    int p0, np;
    /* NVMe: the unit's extents of master, m and v (that order), two
     * copies: sid[cur] holds the state, and a step writes sid[cur ^ 1],
     * which becomes current when the unit commits. Without the speculative
     * step's second copy both rows name the same extents. */
    int sid[2][3];
    int cur;
    /* stepped before the global norm by the running job and not committed:
     * its states are in sid[cur ^ 1], its parameters' landing is not
     * published (spec_landed records it, under opt.land_lock) */
    bool spec, spec_landed;
    _Atomic int pieces_done;
    zn_trainer *tr;
    _Atomic int plive;          /* copies of the update in flight (+1 while issuing) */
    int64_t pseq;               /* the job whose update is in flight */
    uint64_t dev_t0;            /* device optimizer: when its step began (trace) */
    _Atomic int64_t pdone;      /* the last job whose update landed (0: none) */
    /* Adam m and v are still the initial zeros and were never written to
     * their NVMe extents: a read fills zeros instead, the first write-back
     * (the optimizer's or a checkpoint load's) clears it. Saves 8 of the 12
     * bytes per parameter the setup wrote, and the first step's reads. */
    _Atomic bool mv_zero;
} zn_unit;

/* Extent of the unit's current state k (0 master, 1 m, 2 v) / the one a
 * step writes. */
static inline int zn_tr_unit_sid(const zn_unit *un, int k)
{
    return un->sid[un->cur][k];
}

static inline int zn_tr_unit_sid_next(const zn_unit *un, int k)
{
    return un->sid[un->cur ^ 1][k];
}

/* ---- the param cache --------------------------------------------------------
 * A few pinned buffers, each holding one NVMe-home block's parameters as the
 * optimizer just produced them, kept until a fetch has copied them to the
 * device: the next forward, which chases the optimizer block by block, then
 * needs neither the NVMe write to land nor a read back of the same bytes.
 * The NVMe write still goes out (the home stays the copy of record). An
 * entry is filled by the optimizer thread (FILLING -> READY once every piece
 * of the block is in and every speculative update among them committed: a
 * speculative piece is held, zn_pcache_spec_commit / _spec_void), taken by one fetch (READY -> READING) and freed by a
 * host function after that fetch's H2D copy. The optimizer reclaims FREE
 * entries and READY/FILLING ones of an older job (stale: the step that
 * could use them has fetched all its blocks), else evicts its own entry of
 * a later block (the forward needs lower blocks first); it never waits for
 * an entry (none: that block goes the NVMe way). An entry may thus vanish
 * between a fetch's "ready" check and its take: the fetch then waits for
 * the block's NVMe write to land. opt.land_lock guards the states. */
typedef enum { ZN_PC_FREE = 0, ZN_PC_FILLING, ZN_PC_READY, ZN_PC_READING } zn_pc_state;

typedef struct {
    zn_trainer *tr;
    void *buf;
    int block;
    int64_t seq;            /* the optimizer job whose update it holds */
    int left;               /* pieces still to copy */
    int held;               /* pieces in from speculative updates not yet
                               committed: READY waits for them too */
    zn_pc_state state;
} zn_pcache_ent;

/* opt.land_lock held: whether block b's update by job seq is READY in the cache. */
bool zn_pcache_ready_locked(zn_trainer *tr, int b, int64_t seq);
/* Takes block b's READY entry of job seq for a fetch (-> READING); returns
 * its index or -1. */
int zn_pcache_take(zn_trainer *tr, int b, int64_t seq);
/* Optimizer thread: unit un's speculative update stands: its pieces' cache
 * entries stop waiting for it. */
void zn_pcache_spec_commit(zn_trainer *tr, zn_unit *un);
/* Optimizer thread: unit un's speculative update is void: the entries its
 * pieces went into are dropped (their block goes the NVMe way). */
void zn_pcache_spec_void(zn_trainer *tr, zn_unit *un);
/* Host function after the fetch's H2D copy from an entry: frees it. */
void zn_pcache_release_fn(void *arg);

/* ---- the optimizer pipeline (sched_optim.c) --------------------------------*/
typedef struct {
    /* A unit's states in flight: master and grad U floats each, m and v
     * the unit's moments in the run's format (zn_tr_slot_mom_bytes each;
     * for a unit of n elements laid out as zn_mom_layout_at(fmt, m, v, n,
     * 0): the elements, then an 8-bit block's absmax each) */
    float *master, *grad;
    void *m, *v;
    void *pout;                    /* U * param bytes (16-bit params) */
    int unit;                      /* unit held, -1 none */
    bool reads_issued, grads_issued;
    zn_io_req rd[3];
    zn_io_req *grd;                /* one per piece of the unit (max pieces) */
    int n_grd;
    zn_io_req wr[3];
    zn_io_req *pwr;                /* param piece writes */
    int n_pwr;
    bool writes_pending;
    zn_event *h2d_done;            /* device-home param update copied */
    bool h2d_pending;
} zn_opt_slot;

/* One optimizer step (a job). The thread runs one job at a time; the next
 * step may post its job while the previous one still runs (it waits as
 * "pending"). */
typedef struct {
    zn_adam_params hp;
    float g_scale;
    bool need_go;      /* clipping/fp16: read ahead, but step only after go */
    bool go;           /* the global norm is known, g_scale final */
    bool all_ready;    /* every unit's gradients are final */
    bool asc;          /* walk units in ascending order (after go: the next
                          forward needs block 0 first) */
    /* The speculative step (NVMe states with their second copy, need_go):
     * before the go, units whose gradients are final step from the top
     * down with spec_scale (the scale when nothing is clipped), until the
     * final blocks' sum of squares passes sq_limit (clipping is certain)
     * or, with stop_nonfinite (fp16), one is not finite. */
    bool spec;
    float spec_scale;
    double sq_limit;   /* 0: none */
    bool stop_nonfinite;
    int64_t seq;
} zn_opt_job;

/* What begin tells a job about speculation (NULL: none). */
typedef struct {
    double sq_limit;
    bool stop_nonfinite;
} zn_opt_spec;

int zn_optsched_init(zn_trainer *tr);
void zn_optsched_fini(zn_trainer *tr);
/* Posts this step's optimizer job and returns its sequence number. Without
 * need_go, a unit steps as soon as its grads are final (descending order,
 * the order backward finishes them); with need_go the thread reads ahead
 * and steps after zn_optsched_go, in ascending order. If a job is already
 * pending (the one before still running), waits until the thread took it. */
int64_t zn_optsched_begin(zn_trainer *tr, const zn_adam_params *hp, float g_scale,
                          bool need_go, const zn_opt_spec *spec);
/* Inside the pipeline (sched_optim.c, sched_nvme.c): the job's state under
 * opt.lock (unit_final, job_live: olock held), the slots' I/O, a unit's
 * Adam with an explicit scale, its parameters sent home (params_out, as
 * zn_optsched_params_out with tracking: the unit lands when every copy
 * did), publishing a landed unit, and the NVMe walks. */
extern const char *const zn_sched_state_name[3];
bool zn_sched_unit_final(zn_trainer *tr, int u);
bool zn_sched_job_live(zn_trainer *tr);
bool zn_sched_grads_final(zn_trainer *tr, int u);
int zn_sched_wait_ready(zn_trainer *tr, int u);
int zn_sched_unit_at(zn_trainer *tr, int i);
void zn_sched_publish(zn_unit *un);
int zn_sched_slot_drain(zn_trainer *tr, zn_opt_slot *s);
size_t zn_sched_state_bytes(const zn_trainer *tr, int u, int k);
int zn_sched_slot_read_states(zn_trainer *tr, zn_opt_slot *s, int u);
int zn_sched_slot_read_grads(zn_trainer *tr, zn_opt_slot *s, int u);
void zn_sched_slot_params_issued(zn_opt_slot *s);
int zn_sched_params_out(zn_trainer *tr, int u, const void *src, zn_io_req *pwr, int *n_pwr,
                        zn_event *ev, bool *h2d_pending, bool track, bool host_only);
int zn_sched_adam_unit(zn_trainer *tr, int u, float *master, const zn_moments *mv,
                       const float *g, void *p16, float g_scale);
int zn_sched_adam_sr_unit(zn_trainer *tr, int u, uint16_t *master, const zn_moments *mv,
                          const float *g, float g_scale);
int zn_sched_run_nvme(zn_trainer *tr);
int zn_sched_run_nvme_spec(zn_trainer *tr);
/* Tests (spec_settle): waits until job seq, if it speculates, has stepped
 * every unit it may before its go. */
void zn_optsched_settle(zn_trainer *tr, int64_t seq);
/* The newest job: the gradient scale is final (global norm known), step. */
void zn_optsched_go(zn_trainer *tr, float g_scale);
/* The newest job: every unit's gradients are final (backward finished), so
 * the job no longer looks at pieces_done, which the next step resets. */
void zn_optsched_all_final(zn_trainer *tr);
/* Drops the newest job (fp16 overflow: no update); with all, every job
 * (a failure). */
void zn_optsched_cancel(zn_trainer *tr, bool all);
/* Waits until no job runs or waits; returns the first failure of the jobs
 * since the last call (0 when none; a cancelled job is not a failure). */
int zn_optsched_wait(zn_trainer *tr);
/* A background checkpoint's hold (train_state.c): hold marks the jobs
 * posted so far as the last to run until release; wait_held returns once
 * they have ended (the trainer's first error, if one failed). */
int zn_optsched_hold(zn_trainer *tr);
int zn_optsched_wait_held(zn_trainer *tr);
void zn_optsched_release(zn_trainer *tr);
/* Abandons job `seq` (a step stopped by its stop flag) when it has not
 * begun changing the state: a pending one is dropped, a running one that
 * waits for its first unit cancelled. Returns whether it did. */
bool zn_optsched_abandon(zn_trainer *tr, int64_t seq);
/* Wakes the threads that wait for parameters to land (after a failure). */
void zn_optsched_notify_params(zn_trainer *tr);
/* Wakes the thread when units become ready or an error is recorded. */
void zn_optsched_notify(zn_trainer *tr);
/* Sends unit u's working parameters (src: fp32 master values, or the
 * param-dtype copy when params are 16-bit; unit-relative) to every block's
 * home. NVMe writes are queued in pwr[0..*n_pwr) on tr->wq (the caller
 * waits them); device copies go on the optimizer's H2D stream followed by a
 * record of ev (*h2d_pending set; the caller syncs ev). Used by the
 * checkpoint loader (no landing is tracked). */
/* The optimizer on the device: unit u's working parameters made again from
 * its master (checkpoint load); waits until they are home. */
int zn_optsched_dev_regen(zn_trainer *tr, int u);
int zn_optsched_params_out(zn_trainer *tr, int u, const void *src, zn_io_req *pwr, int *n_pwr,
                           zn_event *ev, bool *h2d_pending);

/* ---- the trainer ----------------------------------------------------------*/
typedef struct zn_accum_arg {
    zn_trainer *tr;
    int block, gbuf, mb;
    const int32_t *rows;    /* row-sparse: the rows staged, in order (ids) */
    int64_t nrows;          /* -1: dense */
    uint64_t t0;
    struct zn_accum_arg *next; /* the worker's queue */
} zn_accum_arg;

typedef struct {
    zn_trainer *tr;
    int g;
} zn_accum_buf;

/* ---- gradient accumulation worker (accum.c) ---------------------------------*/
int zn_accum_start(zn_trainer *tr);
/* Finishes the queued jobs and ends the thread (after the streams are idle). */
void zn_accum_stop(zn_trainer *tr);
/* Host function on the D2H stream after a block's grads reached
 * gstage[a->gbuf]: queues its accumulation and returns. */
void zn_accum_post_fn(void *arg);
/* Waits until every queued job is done (after the D2H stream's sync). */
void zn_accum_drain(zn_trainer *tr);

/* A fetch of block `block` from NVMe into staging buffer t: its reads, and
 * the value its buffer's stream flag takes when the last one completed. */
typedef struct {
    zn_trainer *tr;
    int t, block, np;
    uint32_t seq;
} zn_pread_arg;

/* A span of stream work for the trace and the busy times: two timed events
 * recorded around it (no host function: nothing waits on the callback
 * thread for a timestamp), read back when the step has synced
 * (zn_tr_marks_harvest). */
typedef struct {
    int track;
    bool ended;
    zn_event *ev[2];        /* begin, end; made on first use, kept */
    char name[ZN_TRACE_NAME_LEN];
} zn_mark;

#define ZN_CK_RING 3 /* device slots of the cpu-checkpointed activations */

/* The trainer's state, one sub-struct per file that changes it; the others
 * read it. The flat space and the placement (train_layout.c) and the
 * buffers (train_alloc.c) are set up once and read-only while training. */

/* The prefetch ring (train_fetch.c): device slots the blocks' parameters
 * are fetched into, NVMe staging, and the row-sparse gradients' rows. */
typedef struct {
    int n_slots;
    void **slot;            /* ring of device param slots */
    int *slot_block;        /* block held (-1 none) */
    zn_event **ev_ready, **ev_consumed;
    zn_event **ev_shard;    /* world > 1: a slot's own shard copied in */
    /* NVMe param staging (buffer_count pinned buffers) */
    void *stage[64];
    int n_stage;
    zn_event *ev_stage_free[64];
    zn_io_req *stage_req;   /* [n_stage][max_block_pieces] */
    zn_pread_arg stage_arg[64];
    uint32_t stage_seq[64];
    _Atomic int stage_left[64];
    /* row-sparse gradients: each micro-batch's sorted distinct ids (host,
     * [A][tokens]), the same on the device, how many per micro-batch, and
     * the tokens x micro-batches they hold */
    int32_t *rows, *rows_dev;
    int64_t *n_rows;
    int64_t rows_cap;
    zn_accum_arg *accum_args;  /* one per (micro-batch use) */
    int n_accum_args;
    zn_mark *marks;
    int n_marks, next_mark;
    zn_event *mark_ref;     /* recorded on an idle stream at harvest: the time base */
} zn_tr_fetch;

/* Activation checkpoints in pinned RAM (train_actoff.c,
 * activation_checkpointing.cpu_checkpointing): each group's input lives in
 * pinned RAM (host, by block) and passes through a ring of ZN_CK_RING
 * device slots (boundary ordinal k in slot k % ZN_CK_RING): saved D2H on
 * `stream` after the forward wrote it, loaded H2D one group ahead of its
 * backward. res: the block whose input a slot holds. */
typedef struct {
    bool on;
    void **host;
    int *ordinal;           /* [L] ordinal of a group-first block's input */
    void *ring[ZN_CK_RING];
    uint64_t bytes;         /* one group input */
    int res[ZN_CK_RING];
    bool saving[ZN_CK_RING], loading[ZN_CK_RING];
    /* written by the forward, saved to RAM, loaded back; compute done
     * with the slot's occupant */
    zn_event *ev_written[ZN_CK_RING], *ev_saved[ZN_CK_RING], *ev_loaded[ZN_CK_RING];
    zn_event *ev_compute;
    zn_stream *stream;
} zn_tr_actoff;

/* The gradient accumulation worker (accum.c). */
typedef struct {
    pthread_t thread;
    bool started, quit;
    pthread_mutex_t lock;
    pthread_cond_t cv;           /* a job queued or finished */
    zn_accum_arg *head, *tail;   /* queued jobs */
    int busy[2];                 /* jobs queued or running per gstage buffer */
    int pending;
    zn_accum_buf buf[2];
    uint32_t posted[2];          /* jobs posted per grad staging buffer */
} zn_tr_accum;

/* The optimizer pipeline (sched_optim.c): its thread, jobs, slots, the
 * param cache, and the landing of updated parameters. */
typedef struct {
    zn_opt_slot slot[16];
    int n_slots;
    void *pout_flat;        /* cpu/none optimizer: 16-bit param staging (U) */
    zn_stream *s_h2d;       /* the optimizer's parameter copies to the device */
    zn_pcache_ent *pcache;  /* the param cache (n_pcache entries; 0: off) */
    int n_pcache;
    _Atomic uint64_t pcache_hits;   /* fetches served from it */
    _Atomic uint64_t pcache_bytes;
    /* the speculative step: units stepped before the norm, of them
     * committed as they were and stepped again (clipping, fp16 overflow) */
    _Atomic uint64_t spec_units, spec_commits, spec_redos, spec_cache_fills;
    bool spec_clipped;      /* main thread: the last step clipped or overflowed */
    bool spec_settle;       /* tests: the go waits for spec_parked (zn_train_options) */
    int64_t spec_parked;    /* (lock) the speculative job that has nothing left to
                               step before its go */
    bool overlap_step;      /* no clipping/fp16: units step during backward */
    bool pipeline;          /* a step returns before its optimizer job ends */
    pthread_t thread;
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    zn_opt_job job;         /* the job the thread runs */
    zn_opt_job next_job;    /* the job posted while `job` runs */
    bool running, pending, cancel, quit;
    int status;             /* first failure since the last zn_optsched_wait */
    int64_t seq;            /* the last job posted */
    int64_t done_seq;       /* the last job that ended */
    double job_max_s;       /* the longest job that ended well, from its start
                               to its end (under lock): what a stop may wait
                               for when the last step's job still runs */
    bool stepped;           /* the running job has begun changing the state */
    /* a background checkpoint holds the state (zn_train_state_hold; one
     * at a time): jobs posted after hold_seq wait to begin */
    int hold;
    int64_t hold_seq;
    /* parameters landed (zn_unit.pdone) */
    pthread_mutex_t land_lock;
    pthread_cond_t land_cv;
    int64_t land_need;      /* main thread: the job whose updates uses wait for */
    bool inflight;          /* the last step returned with its job running */
    int64_t inflight_step;  /* the step (1-based) that job belongs to */
} zn_tr_opt;

/* What the report adds up (train_step.c, train_report.c). */
typedef struct {
    double step_s;
    double param_wait_s;    /* the schedule waited for landed parameters */
    int64_t steps_run;
    uint64_t tokens;
    double flops;
    uint64_t setup_nvme_write, setup_h2d;  /* bytes the setup moved (initial state) */
} zn_tr_stats;

struct zn_trainer {
    zn_spec spec;                  /* the run spec, as created (const after) */
    /* dry: the layout and allocation code runs without allocating, recording
     * each allocation into plan.items (the plan the run then allocates) */
    bool dry;
    uint64_t dry_gpu;      /* device bytes recorded so far (arena rounding) */
    uint64_t dry_cpu;      /* pinned bytes recorded so far */
    struct zn_comm *comm;  /* NULL: one rank */
    bool comm_attached;    /* the trainer attached its device to comm */
    int rank, world;
    const zn_train_model *model;
    zn_plan plan;
    zn_dev *dev;
    zn_tier_mgr tm;
    zn_trace *trace;
    int track[ZN_RES_COUNT];
    zn_stream *s_comp, *s_h2d, *s_d2h;
    zn_stream *s_comm;     /* world > 1: collectives (the comm's stream) */
    zn_ioq rq, wq;         /* NVMe reads and writes */
    int threads;

    /* placement (train.c, from the config) */
    zn_dtype param_dt;     /* working param dtype on the device */
    size_t param_bytes;    /* its size */
    bool plan_cuda;        /* a dry plan of a CUDA run (zn_plan_input.cuda) */
    zn_dtype grad_dt;      /* gradients device -> host (train.grad_transfer) */
    zn_tier param_home, opt_home;
    bool grads_on_nvme;    /* fp32 gradient accumulators on NVMe (pieces'
                              grad_id); else flat in memory (grad_acc) */
    /* The optimizer on the device (the spec's opt_home GPU): master, m, v
     * and the gradient sums live in the arena; gradients are summed there,
     * their norm is taken there by chunks (normc_dev, copied to the pinned
     * normc), and zn_dev_adam steps on opt.s_h2d. A block homed off the
     * device gets its update through pdev (16-bit) and opt.pout_flat. */
    bool opt_on_device;
    bool any_sparse;       /* some block takes row-sparse gradients */

    /* the flat parameter space (train_layout.c) */
    int L;                 /* blocks */
    uint64_t P;            /* parameters this rank owns (local flat space) */
    uint64_t P_full;       /* parameters of the model */
    zn_block *blocks;
    zn_unit *units;
    int n_units;
    uint64_t U;            /* unit size */
    zn_piece *pieces;
    int n_pieces, max_unit_pieces, max_block_pieces;
    /* master_bf16: each piece's elements' indices in the model (the
     * rounding's counter; unit u's are sr_spans[units[u].p0, + np)) */
    zn_sr_span *sr_spans;
    /* 8-bit moments: the flat blocks kept in fp32 (the tensors bitsandbytes
     * and torchao keep so; zn_tr_build_layout), f32_slots of them, and
     * their moments, ZN_Q8_BLOCK floats per slot: after the layout in mom
     * and var (the cpu tier, the device), or pinned beside NVMe units */
    zn_q8_f32_run *f32_runs;
    size_t n_f32_runs;
    uint64_t f32_slots;
    float *m32, *v32;
    /* ... and, with the speculative step on NVMe, the speculated units'
     * first copy of them (m then v, f32_slots blocks each): they live
     * outside the units' two NVMe copies, so a unit stepped again starts
     * from these (zn_sched_spec_f32) */
    float *mv32_first;
    zn_q8_f32_run *f32_runs_dev;   /* the runs' copy on the device (the optimizer there) */
    zn_sr_span *sr_spans_dev;   /* their copy on the device (the optimizer there) */
    uint64_t largest_block;       /* npad */
    uint64_t largest_grad;        /* gpad: the device gradient buffers */
    uint64_t largest_local;       /* len */
    uint64_t largest_ring_block;  /* npad of fetched blocks */

    /* buffers (train_alloc.c) */
    void *gcast;           /* grad_dt != F32 or row-sparse gradients: the device
                              buffer a block's shard (or its touched rows) is cast into */
    void *gdev[2];         /* device fp32 grad buffers */
    zn_event *ev_gready[2], *ev_gfree[2];
    zn_event *ev_rs[2];    /* world > 1: the grads' reduce-scatter done */
    void **ckpt;           /* block inputs, [1..L-1] (cpu checkpointing: ring slots) */
    void *dact[2];
    /* Flags the streams wait on in stream order (zn_dev_stream_wait_value),
     * one per 64-byte line of a pinned buffer: staging buffer t's is raised
     * to its fetch's seq when the fetch's NVMe reads completed (the H2D
     * stream waits for it before the copy); grad staging buffer g's counts
     * the accumulation jobs done with it (the D2H stream waits until it
     * reaches acc.posted[g] before refilling g). Host functions only signal. */
    uint32_t *sflags;
    float *gstage[2];      /* pinned grad staging for D2H */
    float *gtmp;           /* NVMe grads with accumulation or bf16 transfer: the fp32 sum */
    float *gram;           /* NVMe grads: the pieces kept in pinned RAM (gram_off) */
    uint64_t gram_elems;
    float *master, *mom, *var, *grad_acc;  /* flat (cpu/none optimizer) */
    /* How Adam's moments are kept (train.optim): fp32, or (cpu optimizer
     * tier) bf16 or 8-bit blockwise. mom and var hold mom_bytes each: fp32
     * P x 4; else P elements of `mom_elem` bytes padded to 64, and for 8-bit
     * the blocks' absmax after them (zn_tr_moments). */
    zn_mom_fmt mom_fmt;
    zn_q8_scheme q8_scheme;   /* 8-bit: bitsandbytes' or torchao's quantizer */
    /* train.master_weights bf16_sr: `master` holds P bf16 values (read it
     * through zn_tr_master16), stepped by zn_adam_step_sr_spans in the
     * cpu optimizer tier or on NVMe (any number of ranks), by
     * zn_dev_adam_sr on the device (one rank: checked by the layout) */
    bool master_bf16;
    int mom_elem;
    uint64_t mom_bytes;
    /* NVMe optimizer: one moment's area in a staging slot (room for a unit
     * of U elements, zn_tr_unit_mom_bytes(U), rounded so that the next
     * area stays aligned for direct I/O; fp32: exactly U x 4, as before) */
    uint64_t slot_mom_bytes;
    double *normc_dev, *normc;
    void *pdev;
    void *ostage;          /* pinned staging for state in and out (init, checkpoints) */
    uint64_t ostage_bytes;

    zn_tr_fetch fetch;
    zn_tr_actoff act;
    zn_tr_accum acc;
    zn_tr_opt opt;
    zn_tr_stats stats;

    zn_aio_fault_fn fault_hook;
    void *fault_user;
    double (*lr_fault)(void *user, int64_t step, double lr); /* tests: zn_train_options */
    void *lr_fault_user;

    /* state */
    int64_t step;
    zn_loss_scaler scaler;
    _Atomic int err;       /* first failure of any thread (sticky) */
    char errmsg[512];
    pthread_mutex_t elock;
    bool bad;              /* a failed step: state not valid */
    /* zn_train_set_stop: a step stops at its next block while *stop_flag
     * is nonzero and its update has not begun */
    const volatile sig_atomic_t *stop_flag;
    /* with a stop flag, the step queues at most n_stop_ev - 1 block uses
     * ahead of the compute (each use's end recorded in stop_ev), so that a
     * stop drains little */
    zn_event *stop_ev[8];
    int n_stop_ev;
};

/* Records the first failure (thread-safe) and wakes waiters. */
void zn_train_fail(zn_trainer *tr, int rc, const char *fmt, ...) ZN_PRINTF(3, 4);
/* Records a mark's begin / end event on a stream around the work between
 * (NULL when the step's marks are used up: the work goes untimed). */
zn_mark *zn_train_mark_begin(zn_trainer *tr, zn_stream *s, int res, const char *name);
void zn_train_mark_end(zn_trainer *tr, zn_stream *s, zn_mark *mk);
/* Once every stream that holds marks has synced: turns the marks recorded
 * since the last harvest into trace spans (host clock, in start order) and
 * frees them for reuse. */
int zn_tr_marks_harvest(zn_trainer *tr);
/* Drops the marks recorded since the last harvest (a failed step). */
void zn_tr_marks_drop(zn_trainer *tr);
void zn_tr_marks_free(zn_trainer *tr);

/* ---- the trainer's files and what each offers the others ---------------- */

#define ZN_SFLAG_STRIDE 16  /* uint32s: one flag per cache line */
#define ZN_SFLAG_BYTES ((64 + 2) * ZN_SFLAG_STRIDE * 4)
static inline uint32_t *zn_tr_pstage_flag(zn_trainer *tr, int t)
{
    return tr->sflags + t * ZN_SFLAG_STRIDE;
}
static inline uint32_t *zn_tr_accum_flag(zn_trainer *tr, int g)
{
    return tr->sflags + (64 + g) * ZN_SFLAG_STRIDE;
}

static inline uint64_t zn_tr_round_up(uint64_t a, uint64_t b)
{
    return (a + b - 1) / b * b;
}

/* A fetch of the schedule: block `block`, needed from use first_use to
 * last_use (uses count the blocks' forward and backward passes in order). */
typedef struct {
    int block;
    int first_use, last_use;
} zn_fetch_ent;

/* train.c */
zn_dtype zn_tr_grad_transfer_dtype(const zn_spec *sp, zn_dtype pdt);

/* train_layout.c: where each block's pieces live */
uint64_t zn_tr_frozen_home(const zn_block *bl);
int zn_tr_build_layout(zn_trainer *tr);
uint64_t zn_tr_nvme_bytes_needed(zn_trainer *tr);

/* train_alloc.c: allocation and the plan */
uint64_t zn_tr_piece_stage_off(const zn_block *bl, const zn_piece *p);
int zn_tr_allocate(zn_trainer *tr);
/* Streams the run makes, and the GPU bytes it plans outside the arena. */
uint64_t zn_tr_streams_outside(const zn_trainer *tr);
uint64_t zn_tr_gpu_outside(const zn_trainer *tr);
int zn_tr_dry_plan(zn_plan *out, const zn_train_options *o, const zn_spec *sp, int world, int rank);
uint64_t zn_tr_arena_bytes(const zn_plan *p, uint64_t budget);

/* train_init.c */
int zn_tr_initialise(zn_trainer *tr);

/* train_fetch.c: the prefetch ring */
int zn_tr_wait_params(zn_trainer *tr, int b);
int zn_tr_accum_on_device(zn_trainer *tr, int mb, int b, int g, const float *gsrc);
int zn_tr_ensure_capacity(zn_trainer *tr, int A);
int zn_tr_issue_fetches(zn_trainer *tr, const zn_fetch_ent *fe, int nfe, int *next_fetch, int next_use, uint64_t *nvme_fetches);
int64_t zn_tr_lower_bound_i32(const int32_t *u, int64_t n, int64_t x);
int zn_tr_stage_rows(zn_trainer *tr, int mb, const int32_t *ids, int64_t ntok);
/* the schedule's fetch list over `nuse` block uses (the step, eval and the
 * dry run's traffic count all build it) */
int zn_tr_build_fetches(zn_trainer *tr, int nuse, int L, bool with_bwd, zn_fetch_ent **fe_out,
                        int **fou_out, int *nfe_out);

/* train_step.c: ZeRO stages 1/2 on N > 1 ranks: every rank's updated shard of the
 * replicated blocks all-gathered in place (after a step, and after a
 * checkpoint load, which makes only this rank's shard again). Collective. */
int zn_tr_gather_replicated(zn_trainer *tr);

/* train_traffic.c: one optimizer step's bytes on each link and the
 * optimizer's elements, from the layout (dry or live) into tr->plan.step */
int zn_tr_count_traffic(zn_trainer *tr);

/* train_actoff.c: activation checkpoints in pinned RAM */
int zn_tr_ck_before_write(zn_trainer *tr, int b);
int zn_tr_ck_enter_backward(zn_trainer *tr, const zn_block *bl);
int zn_tr_ck_save(zn_trainer *tr, int b);

/* The bf16 master (master_bf16) and its bytes per element. */
static inline uint16_t *zn_tr_master16(const zn_trainer *tr)
{
    return (uint16_t *)(void *)tr->master;
}

static inline uint64_t zn_tr_master_elem(const zn_trainer *tr)
{
    return tr->master_bf16 ? 2 : 4;
}

/* The fp32 blocks of 8-bit moments (tr->f32_runs) for a range whose first
 * element is flat element off (on a block boundary). */
static inline void zn_tr_f32_blocks(const zn_trainer *tr, zn_moments *r, uint64_t off)
{
    if (r->fmt != ZN_MOM_Q8 || !tr->n_f32_runs)
        return;
    r->f32 = tr->f32_runs;
    r->n_f32 = tr->n_f32_runs;
    r->f32_base = off / ZN_Q8_BLOCK;
    r->m_f32 = tr->m32;
    r->v_f32 = tr->v32;
}

/* The moments of elements [off, ...) of the flat optimizer state (off on
 * an 8-bit block boundary: units are multiples of ZN_Q8_BLOCK then). */
static inline zn_moments zn_tr_moments(const zn_trainer *tr, uint64_t off)
{
    zn_moments r = zn_mom_layout_at(tr->mom_fmt, tr->mom, tr->var, tr->P, off);
    r.scheme = tr->q8_scheme;
    zn_tr_f32_blocks(tr, &r, off);
    return r;
}

/* Bytes of one moment of a unit of n elements on NVMe (its extent's data,
 * one request): the unit laid out on its own (zn_mom_layout_bytes), so an
 * 8-bit unit carries its blocks' absmax with its codes and any unit can be
 * read, stepped and written without its neighbours. Units start on 8-bit
 * block boundaries (zn_tr_build_layout). */
static inline uint64_t zn_tr_unit_mom_bytes(const zn_trainer *tr, uint64_t n)
{
    return zn_mom_layout_bytes(tr->mom_fmt, n);
}

/* The moments of unit u in staging slot s (NVMe optimizer). */
static inline zn_moments zn_tr_slot_moments(const zn_trainer *tr, const zn_opt_slot *s, int u)
{
    zn_moments r = zn_mom_layout_at(tr->mom_fmt, s->m, s->v, tr->units[u].n, 0);
    r.scheme = tr->q8_scheme;
    zn_tr_f32_blocks(tr, &r, tr->units[u].off);
    return r;
}

#endif
