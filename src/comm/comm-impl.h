/* Private side of the communicator: the operation descriptor, the host
 * backend vtable (single, mpi, tcp), the control messages of the failure
 * protocol (reports to rank 0, one verdict back), the TCP backend's state
 * shared by its two files, and the NCCL device part. */
#ifndef ZN_COMM_IMPL_H
#define ZN_COMM_IMPL_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "zinc/comm.h"
#include "zn_build_config.h"

typedef enum {
    ZN_COP_ALLREDUCE = 0,
    ZN_COP_ALLGATHER,
    ZN_COP_REDUCE_SCATTER,
    ZN_COP_BROADCAST,
    ZN_COP_BARRIER,
    /* bench ceiling: send `count` bytes of `send` to the right neighbour and
     * receive `count` bytes from the left one into `recv`, at once. */
    ZN_COP_RING,
    /* cluster check: one link of the ring alone: rank `root` sends `count`
     * bytes of `send` to its right neighbour, which receives them into
     * `recv`; every other rank takes part only in the numbering. */
    ZN_COP_LINK,
} zn_cop_kind;

typedef struct zn_comm_op {
    zn_cop_kind kind;
    const void *send;
    void *recv;
    size_t count;        /* elements (broadcast, ring: bytes) */
    zn_dtype dt;
    zn_reduce_op red;
    int root;
    uint64_t seq;        /* issue number, same on every rank */
    char desc[96];       /* "allreduce #17 (4096 x f32, sum)" */
} zn_comm_op;

/* What a rank saw when a collective failed. */
enum {
    ZN_FAIL_TIMEOUT = 1, /* the deadline passed */
    ZN_FAIL_CLOSED = 2,  /* a peer's connection closed (it died) */
    ZN_FAIL_IO = 3,      /* a transport call failed */
    ZN_FAIL_REMOTE = 4,  /* a control message arrived (report / verdict) */
};

/* Control messages: fixed 512 bytes, on the control channel (TCP: a star of
 * sockets to rank 0; MPI: a duplicated communicator). Only sent on failure
 * and at a clean shutdown. */
#define ZN_CTL_MAGIC 0x5a4e4331u /* "ZNC1" */
enum { ZN_CTL_REPORT = 1, ZN_CTL_VERDICT = 2, ZN_CTL_BYE = 3 };

typedef struct zn_ctl_msg {
    uint32_t magic;
    int32_t type;
    int32_t rank;        /* sender */
    int32_t peer;        /* report: the rank it waited for, -1 unknown */
    int32_t kind;        /* ZN_FAIL_* */
    int32_t code;        /* verdict: the status every rank returns */
    uint64_t seq;
    char text[480];
} zn_ctl_msg;

struct zn_comm_req {
    zn_comm_op op;
    int state;           /* 0 queued, 1 running, 2 done */
    int rc;
    char msg[1024];
    uint64_t deadline_ns;
    zn_comm_req *next;
    int native;          /* started on the backend (start/test) */
    void *tmp;           /* backend scratch freed with the request */
    unsigned char impl[64] __attribute__((aligned(16)));  /* backend handles */
};

typedef struct zn_comm_host_ops {
    const char *name;
    /* healthy = 0 after a failure: free only what cannot hang. */
    void (*destroy)(zn_comm *c, int healthy);
    /* Runs `op` to completion by `deadline_ns`; a failure goes through
     * zn_comm_fail (which returns the status). NULL for native backends. */
    int (*run)(zn_comm *c, zn_comm_op *op, uint64_t deadline_ns);
    /* Native asynchronous backends (NULL otherwise): start, and test ->
     * 1 done, 0 pending, < 0 failed (already through zn_comm_fail). */
    int (*start)(zn_comm *c, zn_comm_req *r);
    int (*test)(zn_comm *c, zn_comm_req *r);
    /* tells the peers the job is over; 1 when only the launcher can end
     * them (MPI: the caller's MPI_Abort), else 0 */
    int (*abort)(zn_comm *c, int code);
    /* Control channel. send: best effort by the deadline, 0 or < 0.
     * recv: 1 = message, 0 = deadline, 2 = rank *closed's channel closed
     * without a BYE (it died), < 0 = error / nothing more can arrive. */
    int (*ctl_send)(zn_comm *c, int to, const zn_ctl_msg *m, uint64_t deadline_ns);
    int (*ctl_recv)(zn_comm *c, zn_ctl_msg *m, int *closed, uint64_t deadline_ns);
    /* Optional: completes control sends still in flight, by the deadline
     * (MPI: ctl_send only posts, so that one stuck rank does not hold up
     * the verdict to the others). */
    void (*ctl_flush)(zn_comm *c, uint64_t deadline_ns);
    /* Optional: rank r's host address for the messages, NULL unknown. */
    const char *(*peer_addr)(zn_comm *c, int r);
} zn_comm_host_ops;

struct zn_comm {
    const zn_comm_host_ops *ops;
    void *host;                  /* backend state */
    zn_launch_info li;
    int rank, size;
    double timeout_s, connect_timeout_s, grace_s;
    zn_dev *dev;
    zn_stream *stream;
    char version[96];
    char dev_backend[16];

    pthread_mutex_t lock;        /* seq, queue, failure state */
    pthread_cond_t cv;
    uint64_t seq;
    /* worker thread for backends without start/test (tcp) */
    pthread_t worker;
    int worker_started, stop;
    zn_comm_req *q_head, *q_tail;

    /* failure state */
    int broken;                  /* 0 or the status every call returns */
    char broken_msg[1024];
    zn_ctl_msg *reports;         /* rank 0: reports by rank (type 0 = none) */
    uint8_t *dead;               /* rank 0: channel closed without BYE */
    uint8_t *departed;           /* BYE received */
    zn_ctl_msg verdict;          /* non-zero rank: verdict received */
    int have_verdict;

    void *nccl;                  /* device part (comm_nccl.c) */
    int want_nccl;               /* backend "nccl" asked for */
};

/* Fills op->desc and op->seq (under c->lock). */
void zn_comm_describe(zn_comm_op *op);

/* The failure protocol. Called by a backend when `op` failed locally
 * (kind, the peer it waited for or -1, the status, a local description), or
 * with ZN_FAIL_REMOTE after it stored an incoming report (zn_comm_note_*)
 * or verdict (c->verdict). Rank 0 gathers reports for grace_s and sends a
 * verdict; the others report and wait for it. Marks the communicator
 * broken and returns its status with the message set. */
int zn_comm_fail(zn_comm *c, const zn_comm_op *op, int kind, int peer, int code,
                 const char *fmt, ...) ZN_PRINTF(6, 7);
/* Rank 0 records a control message / a closed channel from rank `from`. */
void zn_comm_note_msg(zn_comm *c, int from, const zn_ctl_msg *m);
void zn_comm_note_dead(zn_comm *c, int from);
/* "rank R (ADDR)" when the backend knows R's address, else "rank R". */
const char *zn_comm_peer_name(zn_comm *c, int r, char *buf, size_t len);
/* The broken status with its message set, or 0. */
int zn_comm_check_broken(zn_comm *c);

/* out[i] = a[i] op b[i] for n elements; out may alias a or b. bf16 sums are
 * computed in fp32 and rounded to nearest even; max propagates NaN. */
void zn_comm_reduce(void *out, const void *a, const void *b, size_t n, zn_dtype dt,
                    zn_reduce_op op);

/* Backends. Each sets c->ops, c->host, c->rank/size (MPI: its own), and
 * c->version. */
int zn_comm_tcp_create(zn_comm *c);
#if ZN_HAVE_MPI
int zn_comm_mpi_create(zn_comm *c);
#endif

/* ---- TCP backend internals (comm_tcp.c, comm_tcp_ring.c) -------------------*/
#define ZN_TCP_SEG_BYTES (4u << 20)   /* ring pipeline segment per chunk */

/* The job-secret handshake (comm_tcp_auth.c), on when ZINC_JOB_SECRET is
 * set: 64 hex digits, one crypto_auth key; ZINC_JOB_ID (optional) is MACed
 * too. A listener gives a connector ZN_TCP_AUTH_S seconds to answer. */
#define ZN_TCP_KEY_BYTES 32
#define ZN_TCP_AUTH_S 3.0
enum { ZN_TCP_CH_RENDEZVOUS = 0, ZN_TCP_CH_RING = 1 };

typedef struct zn_tcp_auth {
    int on;
    unsigned char key[ZN_TCP_KEY_BYTES];
    char job_id[128];
} zn_tcp_auth;

/* Reads ZINC_JOB_SECRET / ZINC_JOB_ID: 0 (on or off) or ZN_ECONFIG naming
 * the variable. clear: wipes the key. */
int zn_comm_tcp_auth_init(zn_tcp_auth *a);
void zn_comm_tcp_auth_clear(zn_tcp_auth *a);
/* The listener's side on an accepted socket: a challenge, the connector's
 * answer within ZN_TCP_AUTH_S (or by deadline, the sooner), its proof
 * checked for a rank of [1, world) (expect < 0) or rank `expect`, this
 * rank's own proof sent. 0 with *rank, or < 0 with the reason in `why`
 * (for the caller's warning naming the address; no error is set). */
int zn_comm_tcp_auth_accept(const zn_tcp_auth *a, int fd, int channel, int self, int world,
                            int expect, uint64_t deadline, int *rank, char *why, size_t wlen);
/* The connector's side, to rank `peer` (named `who` in errors): answers
 * its challenge and checks its proof, by the deadline. 0, or < 0 with the
 * error set. */
int zn_comm_tcp_auth_connect(const zn_tcp_auth *a, int fd, int channel, int self, int world,
                             int peer, uint64_t deadline, const char *who);

typedef struct zn_tcp {
    int left, right;        /* data sockets of the ring */
    int *ctl;               /* rank 0: ctl[r] for r >= 1; others: ctl[0] */
    uint8_t *ctl_gone;      /* BYE or EOF read on that channel */
    unsigned char *scratch; /* 2 segments */
    char (*addr)[64];       /* every rank's numeric address, for the messages */
    zn_tcp_auth auth;
} zn_tcp;

/* comm_tcp.c: milliseconds to wait in one poll() (at most cap_ms, 0 once the
 * deadline passed), and exactly len bytes sent (wr) or received by the
 * deadline: 0, ZN_ETIMEOUT, -ECONNRESET (EOF) or -errno. */
int zn_comm_tcp_poll_ms(uint64_t deadline, int cap_ms);
int zn_comm_tcp_io_all(int fd, void *buf, size_t len, int wr, uint64_t deadline);
/* comm_tcp_ring.c: the control channel (the host ops' ctl_send / ctl_recv)
 * and one collective over the ring (the host ops' run). */
int zn_comm_tcp_ctl_send(zn_comm *c, int to, const zn_ctl_msg *m, uint64_t deadline);
int zn_comm_tcp_ctl_recv(zn_comm *c, zn_ctl_msg *m, int *closed, uint64_t deadline);
int zn_comm_tcp_run(zn_comm *c, zn_comm_op *op, uint64_t deadline);

/* Runs an issued op and waits for it (blocking path used by everything). */
int zn_comm_run_op(zn_comm *c, zn_comm_op *op);
/* The thread that runs queued requests in issue order for backends without
 * start/test (tcp); zn_comm_create starts it with the communicator as arg. */
void *zn_comm_worker_main(void *arg);
/* Bench: the ring send/recv ceiling (count bytes each way). */
int zn_comm_ring_xfer(zn_comm *c, const void *send, void *recv, size_t bytes);
/* Bench: the same on device buffers on a stream (NCCL send/recv), 0 or
 * ZN_EUNSUPPORTED. */
int zn_comm_ring_xfer_on(zn_comm *c, zn_stream *s, const void *send, void *recv,
                         size_t bytes);
/* Cluster check: the ring's link from rank `from` to its right neighbour
 * alone (ZN_COP_LINK); every rank calls it, in the same order. */
int zn_comm_link_xfer(zn_comm *c, const void *send, void *recv, size_t bytes, int from);
int zn_comm_link_xfer_on(zn_comm *c, zn_stream *s, const void *send, void *recv,
                         size_t bytes, int from);

/* ---- NCCL device part (comm_nccl.c, only with ZN_HAVE_NCCL) ----------------*/
#if ZN_HAVE_NCCL
int zn_nccl_init(zn_comm *c);
void zn_nccl_destroy(zn_comm *c, int healthy);
void zn_nccl_abort(zn_comm *c);
int zn_nccl_enqueue(zn_comm *c, zn_stream *s, zn_comm_op *op);
int zn_nccl_sync(zn_comm *c, zn_stream *s);
#endif
#if ZN_HAVE_CUDA
/* Number of visible CUDA devices, 0 when none answers. */
int zn_comm_cuda_device_count(void);
#endif

/* The CUDA stream under a zn_stream of a CUDA device. Provided by the
 * device layer (src/gpu/cuda.c); weak so that the communicator links before
 * the device layer exports it. NULL when absent. */
void *zn_cuda_stream_native(zn_stream *s) __attribute__((weak));


#endif
