/* zinc's cluster launcher (src/run/): DeepSpeed's hostfile (`HOST slots=N`)
 * and its --include / --exclude / --num_nodes / --num_gpus selection
 * resolved to one place per rank; a check that every host answers over ssh
 * before anything starts; and the run of one rank per slot over OpenSSH
 * (or pdsh), each rank's output prefixed with [host:rank], SIGINT/SIGTERM
 * forwarded to every rank, the worst rank's status returned. */
#ifndef ZINC_LAUNCH_H
#define ZINC_LAUNCH_H

#include <stddef.h>

#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the hostfile ------------------------------------------------------------
 * DeepSpeed's format: one `HOST slots=N` line per host, `#` comments (whole
 * lines, or after slots=N), blank lines; the ranks are numbered in file
 * order. A host name is what ssh takes, a name or an IPv4 address:
 * letters, digits, '.', '_' and '-', not first; ':' and '@' are the
 * filters' separators (a user name goes in ~/.ssh/config). */
#define ZN_HOST_NAME_MAX 256
#define ZN_HOST_SLOTS_MAX 1024      /* slots one host may offer */

typedef struct zn_host {
    char name[ZN_HOST_NAME_MAX];
    int line;             /* its line in the hostfile; 0 when not from a file */
    int file_slots;       /* slots=N */
    int n_slots;          /* slots selected (all of them until zn_hostfile_select) */
    int *slots;           /* the selected slot indices, ascending */
} zn_host;

typedef struct zn_hostfile {
    char path[ZN_PATH_MAX];   /* the file read ("" for zn_hostfile_local) */
    zn_host *hosts;           /* file order; only hosts with a selected slot */
    int n_hosts;
} zn_hostfile;

/* Reads a hostfile. Returns 0, -errno (named), or ZN_ECONFIG naming the
 * file and the line: a line that is not `HOST slots=N` (N in 1 ..
 * ZN_HOST_SLOTS_MAX), a host named twice (both lines), a bad host name, a
 * file with no host. *out is NULL on failure; zn_hostfile_destroy frees. */
ZN_API int zn_hostfile_read(const char *path, zn_hostfile **out);
/* The same from text in memory; `name` names it in the messages. */
ZN_API int zn_hostfile_parse(const char *text, size_t len, const char *name,
                             zn_hostfile **out);
/* One host, "localhost", with `slots` slots (what runs without a
 * hostfile). Returns 0, ZN_EARG (slots outside 1 .. ZN_HOST_SLOTS_MAX) or
 * -ENOMEM. */
ZN_API int zn_hostfile_local(int slots, zn_hostfile **out);
/* Accepts NULL. */
ZN_API void zn_hostfile_destroy(zn_hostfile *h);

/* Which hosts and slots run, DeepSpeed's flags: include or exclude
 * `NAME[:SLOT[,SLOT...]][@NAME...]` (a name alone is all its slots);
 * num_nodes: the first N hosts; num_gpus: slots 0 .. N-1 of each. include
 * and exclude exclude each other and num_nodes / num_gpus. */
typedef struct zn_host_select {
    const char *include;      /* NULL or "": none */
    const char *exclude;
    int num_nodes;            /* < 0: all */
    int num_gpus;             /* < 0: all */
} zn_host_select;

ZN_API zn_host_select zn_host_select_default(void);

/* Applies a selection in place; hosts left with no slot are dropped, the
 * others keep their file order. Returns 0, or ZN_EARG naming the flag:
 * include with exclude, either with num_nodes/num_gpus, a host that is not
 * in the file, a slot it does not have, a malformed filter, num_nodes
 * above the hosts there are, num_gpus above a host's slots, nothing left.
 * On failure h is unchanged. */
ZN_API int zn_hostfile_select(zn_hostfile *h, const zn_host_select *s);

/* ---- the ranks -------------------------------------------------------------*/
typedef struct zn_rank_place {
    int rank, world_size;     /* RANK, WORLD_SIZE */
    int host;                 /* index in hosts[] (CROSS_RANK) */
    int local_rank;           /* LOCAL_RANK: its index among its host's slots */
    int local_size;           /* LOCAL_SIZE: its host's selected slots */
    int slot;                 /* the slot itself (its GPU on that host) */
} zn_rank_place;

/* Ranks in all: the selected slots of every host. */
ZN_API int zn_hostfile_world(const zn_hostfile *h);
/* Where rank `rank` runs: ranks go host by host in file order, each host's
 * selected slots ascending, so LOCAL_RANK is right whatever the slot counts
 * (never rank mod a local size). Returns 0 or ZN_EARG (rank outside the
 * world). */
ZN_API int zn_hostfile_place(const zn_hostfile *h, int rank, zn_rank_place *out);
/* A host's CUDA_VISIBLE_DEVICES: its selected slots, "0,1" (as DeepSpeed
 * sets it; LOCAL_RANK indexes into this list). Returns 0 or ZN_EARG (host
 * out of range, buffer too small). */
ZN_API int zn_hostfile_devices(const zn_hostfile *h, int host, char *buf, size_t len);

/* ---- starting the ranks -------------------------------------------------------
 * Each rank is started as `ssh -T -o BatchMode=yes -o ConnectTimeout=T
 * -o ServerAliveInterval=10 -o ServerAliveCountMax=6 [launcher_args] --
 * HOST CMD` (a host silent for 60 s ends its ssh), where CMD (for the remote login shell, every word single-quoted)
 * is `cd CWD && exec env VAR=... sh -c WATCH zinc-rank ARGV...`: the
 * variables passed are those of this process starting NCCL, PYTHON, UCX,
 * MLFLOW, MV2, ZINC_ or OMP_, then those of a .deepspeed_env file in $HOME
 * and in CWD (KEY=VALUE lines), then the rank's own: RANK, LOCAL_RANK,
 * WORLD_SIZE, LOCAL_SIZE, LOCAL_WORLD_SIZE, CROSS_RANK, CROSS_SIZE,
 * MASTER_ADDR, MASTER_PORT, CUDA_VISIBLE_DEVICES, ZINC_LAUNCH_HOST (the
 * host as the hostfile names it) and ZINC_COMM_BACKEND=tcp (unless this
 * process sets ZINC_COMM_BACKEND). WATCH is a small sh
 * script that runs ARGV in its place (exec, so the rank's status is ssh's)
 * and a watcher beside it reading the rank's stdin, which is the ssh
 * channel: a line "INT" or "TERM" sends the rank that signal, and end of
 * file (the launcher or its ssh gone) sends SIGTERM. So signals reach the
 * rank without a terminal (ssh -tt), and no rank outlives its launcher.
 * The rank runs with SIGPIPE ignored (as Python ranks do), so that output
 * to a closed channel does not kill it before that SIGTERM stops it.
 * A host named "localhost" or "127.0.0.1" runs CMD with /bin/sh here,
 * without ssh (and with this process's whole environment). pdsh (-R ssh,
 * one per rank) forwards no stdin: its ranks print their pid first and a
 * signal is forwarded by `pdsh -w HOST kill -s SIG PID`; a launcher killed
 * with -9 leaves pdsh ranks running, as under DeepSpeed.
 * zn_cluster_run itself (ssh and local hosts) keeps the variables off the
 * command line: the watcher reads them first from its stdin, KEY=VALUE
 * lines up to an empty one, the job's ZINC_JOB_SECRET among them, and
 * CMD is `cd CWD && exec env sh -c WATCH' zinc-rank ARGV...` (a value
 * with a line break alone stays on the command line). */
/* ZN_REMOTE_MPIRUN: Open MPI's mpirun starts the ranks (its own ssh and
 * daemons; ZINC_COMM_BACKEND=mpi); zinc checks the hosts first, rewrites
 * mpirun's tagged output as [host:rank] and forwards signals to it. */
typedef enum { ZN_REMOTE_SSH = 0, ZN_REMOTE_PDSH = 1, ZN_REMOTE_MPIRUN = 2 } zn_remote;

/* A note from the launcher while it runs (a rank that ended badly, a
 * signal forwarded), for the caller to print. */
typedef void (*zn_cluster_note_fn)(void *arg, const char *msg);

/* A folder the run writes on every host (its swap or checkpoint folder),
 * for zn_cluster_check to try there. */
typedef struct zn_cluster_path {
    const char *path;         /* relative: to the ranks' folder (cwd) */
    const char *what;         /* "the swap folder (tiers.nvme)", for the message */
    int must_exist;           /* 1: a missing folder fails (the run may not create it);
                                 2: a checkpoint to read (manifest.json or latest
                                 in it), not written */
} zn_cluster_path;

/* The folders `zinc train ...` (argv, as given to the launcher) writes:
 * the swap folders (zn_config_nvme_paths; must exist unless
 * tiers.create_nvme_path) and train.checkpoint.dir, from its CONFIG (or
 * recipe) under its --sets, or default_json (zinc train's embedded
 * default) without one, or the config a `--resume DIR` recorded (read
 * from this host's DIR) without CONFIG; and the checkpoint --resume reads
 * (must_exist 2). Returns 0 with out->n folders, or with none and
 * out->note saying why (not zinc train, CONFIG or the --resume folder's
 * config not readable here); ZN_ECONFIG naming what is
 * wrong in the config, -ENOMEM. */
#define ZN_CLUSTER_PATHS_MAX (16 + 1)
typedef struct zn_cluster_paths {
    zn_cluster_path p[ZN_CLUSTER_PATHS_MAX];
    int n;
    char path[ZN_CLUSTER_PATHS_MAX][ZN_PATH_MAX];
    char what[ZN_CLUSTER_PATHS_MAX][64];
    char note[512];
} zn_cluster_paths;
ZN_API int zn_cluster_train_paths(const char *const *argv, int argc, const char *default_json,
                                  zn_cluster_paths *out);

typedef struct zn_cluster_config {
    const zn_hostfile *hosts;       /* after zn_hostfile_select; not copied */
    const char *const *argv;        /* what every rank runs */
    int argc;
    const char *master_addr;        /* NULL: the first host (127.0.0.1 for localhost) */
    int master_port;                /* 29500 */
    zn_remote remote;               /* ZN_REMOTE_SSH */
    const char *launcher_args;      /* options for ssh / pdsh, split on blanks; NULL none */
    const char *cwd;                /* NULL: this process's */
    const char *home;               /* where the first .deepspeed_env is; NULL: $HOME */
    double check_timeout_s;         /* ssh ConnectTimeout of the check: 10 */
    /* after a rank ends with an error, the seconds the others have to end
     * on their own (the communicator names the dead rank) before they are
     * sent SIGTERM; as long again, then their ssh is killed: 60 */
    double fail_grace_s;
    int out_fd, err_fd;             /* where the ranks' stdout / stderr lines go: 1, 2 */
    const char *ssh, *pdsh;         /* the programs: "ssh", "pdsh" */
    const char *mpirun;             /* "mpirun" */
    zn_cluster_note_fn note;        /* NULL: none */
    void *note_arg;
    /* 1 (default): zn_cluster_run makes a secret for the job (32 bytes of
     * getrandom) and gives it to every rank over ssh as ZINC_JOB_SECRET
     * (with ZINC_JOB_ID), so that the TCP backend lets only the job's
     * ranks connect; 0: none. Not under pdsh (it carries no stdin). */
    int job_secret;
    /* folders zn_cluster_check tries to write on every host; NULL / 0: none */
    const zn_cluster_path *paths;
    int n_paths;
} zn_cluster_config;

ZN_API zn_cluster_config zn_cluster_config_default(void);

/* The command line rank `rank` runs on its host (CMD above) in *cmd, and
 * in *argv the program's arguments that carry it there (ssh ... -- HOST
 * CMD, pdsh ... -w HOST CMD, or /bin/sh -c CMD for a local host; NULL-
 * terminated, one allocation). The caller frees each with free(); either
 * pointer may be NULL when not wanted. Returns 0, ZN_EARG, ZN_ECONFIG (a
 * malformed .deepspeed_env line, named with its line), -errno. */
ZN_API int zn_cluster_rank_command(const zn_cluster_config *c, int rank, char ***argv,
                                   char **cmd);

/* Where rank 0 listens (MASTER_ADDR): master_addr, else the first host,
 * else 127.0.0.1 when every host is local. Returns 0, or ZN_EARG when the
 * first host is local and another is not (the others cannot reach rank 0
 * at 127.0.0.1: master_addr is needed). */
ZN_API int zn_cluster_master_addr(const zn_cluster_config *c, const char **addr);

/* Before anything starts: every host answers over ssh (ssh -o BatchMode=yes
 * -o ConnectTimeout=T, all hosts at once), has the folder CWD and the
 * command argv[0], can write each of paths[] (a file made and removed in
 * the folder, or in the nearest one above it that is there when the run
 * may create it), and, when the command is zinc, runs zinc of this version.
 * Returns 0, or ZN_ECONFIG naming each host that does not, with ssh's
 * own words (a host silent past T + 10 s is killed and named too);
 * -errno when ssh cannot be started. */
ZN_API int zn_cluster_check(const zn_cluster_config *c);

typedef struct zn_cluster_result {
    int exit_code;        /* the worst rank's status (0 .. 255; 128 + N: killed by N) */
    int worst_rank;       /* the first rank with that status; -1 when all ended 0 */
    int first_failed;     /* the rank that failed first (the likely cause); -1 none */
    int signal;           /* the signal the launcher received and forwarded, 0 none */
    int *status;          /* NULL, or world entries the caller owns: each rank's status */
} zn_cluster_result;

/* Starts every rank and waits for all of them, copying their output line
 * by line to out_fd / err_fd as "[host:rank] line". SIGINT, SIGTERM and
 * SIGHUP (HUP as TERM) are forwarded to every rank; a third one kills
 * the ranks' ssh (their watchers then send SIGTERM). The caller's thread
 * must be the process's only one (the signals are taken with signalfd
 * while it runs; the signal mask is restored after). Returns 0 when the
 * ranks ran, whatever their status (in *res), or a negative code when one
 * could not be started (the others already started are stopped first). */
ZN_API int zn_cluster_run(const zn_cluster_config *c, zn_cluster_result *res);

#ifdef __cplusplus
}
#endif

#endif
