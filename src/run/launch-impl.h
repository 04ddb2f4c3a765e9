/* Shared by the launcher's files: launch_cmd.c makes the command lines
 * (the rank's environment, quoting for the remote shell, ssh / pdsh / sh
 * argv), launch_check.c checks the hosts, launch_ssh.c runs the ranks
 * (their output and signals) and holds the process helpers. Private to
 * src/run. */
#ifndef ZN_RUN_LAUNCH_IMPL_H
#define ZN_RUN_LAUNCH_IMPL_H

#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

#include "zinc/launch.h"

/* A growing string; after an allocation failure `oom` is set and further
 * appends do nothing, so a builder checks once at the end. */
typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} zn_sbuf;

void zn_sbuf_add(zn_sbuf *b, const char *s, size_t n);
void zn_sbuf_adds(zn_sbuf *b, const char *s);
void zn_sbuf_addf(zn_sbuf *b, const char *fmt, ...) ZN_PRINTF(2, 3);
/* s as one word for a POSIX shell: '...' with each ' as '\'' */
void zn_sbuf_addq(zn_sbuf *b, const char *s);

/* Hosts run without ssh: "localhost" and "127.0.0.1" (docs/launch.md). */
int zn_cluster_host_is_local(const char *host);
/* The folder the ranks start in: c->cwd, or this process's (into buf). */
int zn_cluster_cwd(const zn_cluster_config *c, char *buf, size_t n, const char **cwd);

/* The program's argv that runs the shell command `cmd` on `host`: /bin/sh
 * -c CMD for a local host, else ssh (check: with ConnectTimeout) or pdsh.
 * One allocation holding the pointers and the strings; free() it. */
int zn_cluster_transport_argv(const zn_cluster_config *c, const char *host, const char *cmd,
                              int check, char ***argv);

/* zn_cluster_rank_command's work. With block non-NULL and a transport that
 * carries stdin (ssh, a local sh; not pdsh), the variables go into *block
 * instead of the command line, as KEY=VALUE lines ending with an empty
 * line, which the rank's watcher reads first from its stdin (one with a
 * line break in its value stays on the command line), together with
 * ZINC_JOB_SECRET=secret and ZINC_JOB_ID=job_id when given; *block stays
 * NULL otherwise. The launcher's own ZINC_JOB_SECRET / ZINC_JOB_ID are
 * never passed on. Free *block with zn_cluster_free_secret_block. */
int zn_cluster_rank_launch(const zn_cluster_config *c, int rank, const char *secret,
                           const char *job_id, char ***argv, char **cmd, char **block);
/* The variables every rank gets from the launcher's environment and the
 * .deepspeed_env files (home's, then cwd's), as KEY=VALUE strings; free
 * with zn_cluster_env_free. The launcher's ZINC_JOB_SECRET / ZINC_JOB_ID
 * are never among them. */
int zn_cluster_env_list(const zn_cluster_config *c, const char *cwd, char ***kv, int *n);
void zn_cluster_env_free(char **kv, int n);
/* argv of n words (copied) in one allocation, NULL-terminated. */
int zn_cluster_pack_argv(const char *const *words, int n, char ***out);
/* --launcher openmpi (launch_mpi.c): mpirun's command line for the job, and
 * zn_cluster_run's work for it. */
int zn_cluster_mpirun_argv(const zn_cluster_config *c, char ***argv);
int zn_cluster_run_mpirun(const zn_cluster_config *c, zn_cluster_result *res);
/* Wipes and frees; accepts NULL. */
void zn_cluster_free_secret_block(char *block);
/* The job's secret as 64 hex digits (32 bytes of getrandom) and a job id
 * (16 hex digits): 0 or -errno named. */
#define ZN_JOB_SECRET_HEX 64
int zn_cluster_make_secret(char secret[ZN_JOB_SECRET_HEX + 1], char job_id[17]);

/* ---- processes (launch_ssh.c) ----
 * posix_spawnp of argv with fds in/out/err as its 0/1/2, default signal
 * actions and an empty mask; own_group: a process group of its own (a
 * terminal's Ctrl-C then reaches the launcher alone). 0 or -errno named. */
int zn_cluster_spawn(char *const *argv, int in, int out, int err, int own_group, pid_t *pid);
/* Blocks SIGINT, SIGTERM, SIGHUP, SIGCHLD and SIGPIPE (the old mask in
 * *old) and takes them on a signalfd (*sfd); 0 or a negative code named.
 * give_signals closes it, drops what is pending and restores the mask. */
int zn_cluster_take_signals(sigset_t *take, sigset_t *old, int *sfd);
void zn_cluster_give_signals(const sigset_t *take, const sigset_t *old, int *sfd);
/* pipe2(O_CLOEXEC), end nonblock_end (0, 1; -1 none) nonblocking. */
int zn_cluster_pipe(int fds[2], int nonblock_end);
/* close(*fd) once; *fd = -1. */
void zn_cluster_close_fd(int *fd);
/* A waitpid status as an exit code: the code, 128 + a signal, or 255. */
int zn_cluster_wait_status(int st);
/* Raises the soft RLIMIT_NOFILE toward children * per_child + 64. */
void zn_cluster_raise_fd_limit(int children, int per_child);
/* Seconds a child's output may stay open after it ended (something it
 * left, a ControlPersist master, holding it). */
#define ZN_CLUSTER_DRAIN_S 2.0

/* The rank's stdin lines the watcher of zn_cluster_rank_command obeys. */
#define ZN_WATCH_INT "INT\n"
#define ZN_WATCH_TERM "TERM\n"
/* Under pdsh, the first line a rank prints: its pid, for kill. */
#define ZN_PDSH_PID_TAG "@zinc-launch-pid "

#endif
