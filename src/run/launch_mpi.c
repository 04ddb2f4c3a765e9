/* zinc launch --launcher openmpi: Open MPI's mpirun starts the ranks (its
 * own ssh to each host, its own daemons, ranks numbered host by host in the
 * hostfile's order as zinc numbers them) with the MPI communicator
 * (ZINC_COMM_BACKEND=mpi); the launcher makes its command line from the
 * selected slots, passes the environment the ssh launcher passes (-x), runs
 * it, rewrites its tagged output lines ("[1,R]<stdout>:") as "[host:R] ",
 * turns SIGINT / SIGTERM / SIGHUP into SIGUSR1 to it (which mpirun sends
 * on to every rank, as it does not SIGTERM) and returns its status. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "run/launch-impl.h"
#include "zinc/util.h"

#define MPI_WORDS_MAX 512

int zn_cluster_mpirun_argv(const zn_cluster_config *c, char ***argv)
{
    *argv = NULL;
    if (!c || !c->hosts || !c->argv || c->argc < 1)
        return zn_set_error(ZN_EARG, "zn_cluster_mpirun_argv: no hosts or no command");
    int world = zn_hostfile_world(c->hosts);
    char cwd_buf[ZN_PATH_MAX];
    const char *cwd;
    int rc = zn_cluster_cwd(c, cwd_buf, sizeof cwd_buf, &cwd);
    if (rc)
        return rc;
    char **env = NULL;
    int n_env = 0;
    if ((rc = zn_cluster_env_list(c, cwd, &env, &n_env)))
        return rc;
    zn_sbuf hosts = { 0 }, rsh = { 0 };
    for (int h = 0; h < c->hosts->n_hosts; h++)
        zn_sbuf_addf(&hosts, "%s%s:%d", h ? "," : "", c->hosts->hosts[h].name,
                     c->hosts->hosts[h].n_slots);
    /* the daemons' ssh: never a password prompt, and the user's options */
    double t = c->check_timeout_s > 0 ? c->check_timeout_s : 10;
    zn_sbuf_addf(&rsh, "-o BatchMode=yes -o ConnectTimeout=%d%s%s", (int)(t + 0.999),
                 c->launcher_args && *c->launcher_args ? " " : "",
                 c->launcher_args ? c->launcher_args : "");
    char np[16];
    snprintf(np, sizeof np, "%d", world);
    const char *w[MPI_WORDS_MAX];
    int n = 0;
    w[n++] = c->mpirun && *c->mpirun ? c->mpirun : "mpirun";
    w[n++] = "-n";
    w[n++] = np;
    w[n++] = "--host";
    w[n++] = hosts.s ? hosts.s : "";
    w[n++] = "--wdir";
    w[n++] = cwd;
    w[n++] = "--tag-output";
    /* zinc's threads (OpenMP Adam, the I/O engine) use the host's cores:
     * no rank pinned to one */
    w[n++] = "--bind-to";
    w[n++] = "none";
    w[n++] = "--mca";
    w[n++] = "plm_rsh_agent";
    w[n++] = c->ssh && *c->ssh ? c->ssh : "ssh";
    w[n++] = "--mca";
    w[n++] = "plm_rsh_args";
    w[n++] = rsh.s ? rsh.s : "";
    w[n++] = "-x";
    w[n++] = "ZINC_COMM_BACKEND=mpi";
    for (int i = 0; i < n_env && n < MPI_WORDS_MAX - c->argc - 4; i++) {
        if (!strncmp(env[i], "ZINC_COMM_BACKEND=", 18))
            continue;
        w[n++] = "-x";
        w[n++] = env[i];
    }
    if (n >= MPI_WORDS_MAX - c->argc - 4) {
        rc = zn_set_error(ZN_EARG, "launch: too many variables for mpirun's command line");
    } else if (hosts.oom || rsh.oom) {
        rc = zn_set_error(-ENOMEM, "launch: out of memory");
    } else {
        for (int i = 0; i < c->argc; i++)
            w[n++] = c->argv[i];
        rc = zn_cluster_pack_argv(w, n, argv);
    }
    free(hosts.s);
    free(rsh.s);
    zn_cluster_env_free(env, n_env);
    return rc;
}

/* ---- running it --------------------------------------------------------------*/
typedef struct {
    int fd, out_fd, is_err;
    char buf[65536];
    size_t n;
} mpi_stream;

/* "[J,R]<stdout>:text" -> "[host:R] text"; other lines (mpirun's own) as
 * "[mpirun] text". */
static void emit_line(const zn_cluster_config *c, mpi_stream *s, const char *l, size_t n)
{
    char pre[320];
    const char *text = l;
    size_t tn = n;
    int rank = -1;
    const char *close = n > 1 && l[0] == '[' ? memchr(l, ']', n) : NULL;
    const char *colon = close ? memchr(close, ':', n - (size_t)(close - l)) : NULL;
    if (close && colon) {
        const char *comma = memchr(l, ',', (size_t)(close - l));
        if (comma)
            rank = atoi(comma + 1);
        text = colon + 1;
        tn = n - (size_t)(text - l);
    }
    zn_rank_place pl;
    if (rank >= 0 && rank < zn_hostfile_world(c->hosts) && !zn_hostfile_place(c->hosts, rank, &pl))
        snprintf(pre, sizeof pre, "[%s:%d] ", c->hosts->hosts[pl.host].name, rank);
    else
        snprintf(pre, sizeof pre, "[mpirun] ");
    zn_sbuf b = { 0 };
    zn_sbuf_adds(&b, pre);
    zn_sbuf_add(&b, text, tn);
    zn_sbuf_add(&b, "\n", 1);
    for (size_t o = 0; !b.oom && o < b.n;) {
        ssize_t k = write(s->out_fd, b.s + o, b.n - o);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        o += (size_t)k;
    }
    free(b.s);
}

/* Reads what is there; returns 0 at end of file. */
static int pump(const zn_cluster_config *c, mpi_stream *s)
{
    ssize_t k = read(s->fd, s->buf + s->n, sizeof s->buf - s->n);
    if (k < 0)
        return errno == EINTR || errno == EAGAIN;
    s->n += (size_t)k;
    size_t start = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->buf[i] == '\n') {
            emit_line(c, s, s->buf + start, i - start);
            start = i + 1;
        }
    if (start == 0 && s->n == sizeof s->buf) {  /* a line longer than the buffer */
        emit_line(c, s, s->buf, s->n);
        start = s->n;
    }
    memmove(s->buf, s->buf + start, s->n - start);
    s->n -= start;
    if (k == 0 && s->n) {
        emit_line(c, s, s->buf, s->n);
        s->n = 0;
    }
    return k > 0;
}

int zn_cluster_run_mpirun(const zn_cluster_config *c, zn_cluster_result *res)
{
    char **argv = NULL;
    int rc = zn_cluster_mpirun_argv(c, &argv);
    if (rc)
        return rc;
    int in[2] = { -1, -1 }, po[2] = { -1, -1 }, pe[2] = { -1, -1 }, sfd = -1;
    sigset_t take, old;
    int masked = 0;
    pid_t pid = 0;
    mpi_stream so = { .out_fd = c->out_fd }, se = { .out_fd = c->err_fd, .is_err = 1 };
    if ((rc = zn_cluster_take_signals(&take, &old, &sfd)))
        goto out;
    masked = 1;
    /* mpirun's stdin: nothing (it would forward it to rank 0) */
    if ((rc = zn_cluster_pipe(in, -1)) || (rc = zn_cluster_pipe(po, 0)) ||
        (rc = zn_cluster_pipe(pe, 0)))
        goto out;
    zn_cluster_close_fd(&in[1]);
    if ((rc = zn_cluster_spawn(argv, in[0], po[1], pe[1], 1, &pid))) {
        pid = 0;
        goto out;
    }
    zn_cluster_close_fd(&in[0]);
    zn_cluster_close_fd(&po[1]);
    zn_cluster_close_fd(&pe[1]);
    so.fd = po[0];  /* the streams own them now */
    se.fd = pe[0];
    po[0] = pe[0] = -1;
    int status = -1, sigs = 0;
    while (pid > 0 || so.fd >= 0 || se.fd >= 0) {
        struct pollfd pf[3] = { { sfd, POLLIN, 0 }, { so.fd, POLLIN, 0 }, { se.fd, POLLIN, 0 } };
        int pr = poll(pf, 3, pid > 0 ? 250 : (int)(ZN_CLUSTER_DRAIN_S * 1000));
        if (pr < 0 && errno != EINTR) {
            rc = zn_set_error(-errno, "launch: poll: %s", strerror(errno));
            break;
        }
        if (pr == 0 && pid <= 0)
            break;  /* something mpirun left holds its output open */
        if (pf[0].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                int sig = (int)si.ssi_signo;
                if (sig != SIGINT && sig != SIGTERM && sig != SIGHUP)
                    continue;
                if (!res->signal)
                    res->signal = sig;
                /* mpirun aborts the job on SIGTERM or SIGINT (its daemons
                 * go, and ranks stopping after their step would wait in
                 * its collectives), but passes SIGUSR1 on to every rank:
                 * zinc train stops after the step in progress on it, as
                 * on SIGTERM, saves and cleans up (exit 138). A second
                 * signal aborts the job, a third kills mpirun. */
                sigs++;
                int fw = sigs == 1 ? SIGUSR1 : sigs == 2 ? SIGTERM : SIGKILL;
                if (pid > 0)
                    kill(pid, fw);
                if (c->note) {
                    char msg[200];
                    snprintf(msg, sizeof msg, "%s: %s%s", strsignal(sig),
                             fw == SIGUSR1 ? "SIGUSR1 to mpirun, which sends it to every rank "
                                             "(each stops after its step and saves; a second "
                                             "signal aborts the job, a third kills mpirun)"
                             : fw == SIGTERM ? "SIGTERM to mpirun (it aborts the job)"
                                             : "killed mpirun", "");
                    c->note(c->note_arg, msg);
                }
            }
        }
        mpi_stream *st[2] = { &so, &se };
        for (int k = 0; k < 2; k++)
            if (st[k]->fd >= 0 && pf[1 + k].revents && !pump(c, st[k]))
                zn_cluster_close_fd(&st[k]->fd);
        int ws;
        if (pid > 0 && waitpid(pid, &ws, WNOHANG) == pid) {
            status = zn_cluster_wait_status(ws);
            pid = 0;
        }
    }
    if (pid > 0) {  /* a poll failure: mpirun must not outlive the launcher */
        kill(pid, SIGKILL);
        int ws;
        waitpid(pid, &ws, 0);
        status = zn_cluster_wait_status(ws);
        pid = 0;
    }
    res->exit_code = status < 0 ? 255 : status;
    res->worst_rank = -1;
    res->first_failed = -1;
out:
    zn_cluster_close_fd(&in[0]);
    zn_cluster_close_fd(&in[1]);
    zn_cluster_close_fd(&po[0]);
    zn_cluster_close_fd(&po[1]);
    zn_cluster_close_fd(&pe[0]);
    zn_cluster_close_fd(&pe[1]);
    zn_cluster_close_fd(&so.fd);
    zn_cluster_close_fd(&se.fd);
    if (masked)
        zn_cluster_give_signals(&take, &old, &sfd);
    free(argv);
    return rc;
}
