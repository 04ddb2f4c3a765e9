/* The launcher's run: one ssh (or pdsh, or local sh) per rank, their
 * output copied line by line with a [host:rank] prefix, signals forwarded
 * through each rank's watcher (launch_cmd.c), a failed rank's peers given a
 * grace before they are stopped, every child reaped; and the process
 * helpers the check (launch_check.c) shares; each rank's variables and the
 * job's secret go down its channel first. posix_spawn and poll(); the
 * signals are read from a signalfd, so no handler runs. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "run/launch-impl.h"

extern char **environ;

#define LINE_BYTES 65536            /* a longer line is passed on in pieces */
#define DRAIN_S ZN_CLUSTER_DRAIN_S

/* ---- spawning -------------------------------------------------------------------------*/
/* Starts argv with fds in/out/err as its 0/1/2, default signal actions and
 * an empty mask; own_group: in a process group of its own, so that a
 * terminal's Ctrl-C reaches the launcher alone (which forwards it). */
int zn_cluster_take_signals(sigset_t *take, sigset_t *old, int *sfd)
{
    *sfd = -1;
    sigemptyset(take);
    int sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE };
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
        sigaddset(take, sigs[i]);
    int rc = pthread_sigmask(SIG_BLOCK, take, old);
    if (rc)
        return zn_set_error(-rc, "launch: pthread_sigmask: %s", strerror(rc));
    if ((*sfd = signalfd(-1, take, SFD_CLOEXEC | SFD_NONBLOCK)) < 0) {
        rc = zn_set_error(-errno, "launch: signalfd: %s", strerror(errno));
        pthread_sigmask(SIG_SETMASK, old, NULL);
        return rc;
    }
    return 0;
}

void zn_cluster_give_signals(const sigset_t *take, const sigset_t *old, int *sfd)
{
    if (*sfd >= 0)
        close(*sfd);
    *sfd = -1;
    /* what was taken stays taken: a pending SIGPIPE or SIGCHLD must not
     * be delivered (SIGPIPE's default ends the process) */
    struct timespec zero = { 0, 0 };
    while (sigtimedwait(take, NULL, &zero) > 0)
        ;
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

int zn_cluster_spawn(char *const *argv, int in, int out, int err, int own_group, pid_t *pid)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    int e;
    if ((e = posix_spawn_file_actions_init(&fa)))
        return zn_set_error(-e, "launch: posix_spawn_file_actions_init: %s", strerror(e));
    if ((e = posix_spawnattr_init(&at))) {
        posix_spawn_file_actions_destroy(&fa);
        return zn_set_error(-e, "launch: posix_spawnattr_init: %s", strerror(e));
    }
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    int sigs[] = { SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD, SIGQUIT };
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
        sigaddset(&dfl, sigs[i]);
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                  (own_group ? POSIX_SPAWN_SETPGROUP : 0);
    if ((e = posix_spawn_file_actions_adddup2(&fa, in, 0)) ||
        (e = posix_spawn_file_actions_adddup2(&fa, out, 1)) ||
        (e = posix_spawn_file_actions_adddup2(&fa, err, 2)) ||
        (e = posix_spawnattr_setsigmask(&at, &none)) ||
        (e = posix_spawnattr_setsigdefault(&at, &dfl)) ||
        (own_group && (e = posix_spawnattr_setpgroup(&at, 0))) ||
        (e = posix_spawnattr_setflags(&at, flags))) {
        posix_spawnattr_destroy(&at);
        posix_spawn_file_actions_destroy(&fa);
        return zn_set_error(-e, "launch: setting up posix_spawn: %s", strerror(e));
    }
    e = posix_spawnp(pid, argv[0], &fa, &at, argv, environ);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    if (e)
        return zn_set_error(-e, "launch: cannot start %s: %s", argv[0], strerror(e));
    return 0;
}

int zn_cluster_pipe(int fds[2], int nonblock_end)
{
    if (pipe2(fds, O_CLOEXEC) < 0)
        return zn_set_error(-errno, "launch: pipe: %s", strerror(errno));
    if (nonblock_end >= 0) {
        int fl = fcntl(fds[nonblock_end], F_GETFL);
        if (fl < 0 || fcntl(fds[nonblock_end], F_SETFL, fl | O_NONBLOCK) < 0) {
            int e = errno;
            close(fds[0]);
            close(fds[1]);
            return zn_set_error(-e, "launch: fcntl(O_NONBLOCK): %s", strerror(e));
        }
    }
    return 0;
}

void zn_cluster_close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

int zn_cluster_wait_status(int st)
{
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return 255;
}

static void note(const zn_cluster_config *c, const char *fmt, ...) ZN_PRINTF(2, 3);
static void note(const zn_cluster_config *c, const char *fmt, ...)
{
    if (!c->note)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->note(c->note_arg, msg);
}

/* The launcher holds 2-3 pipe ends per child: past a few hundred ranks
 * that is more than the usual soft limit of 1024 descriptors, so the soft
 * limit is raised toward the hard one (a shortfall left is an EMFILE that
 * names the rank that could not start). */
void zn_cluster_raise_fd_limit(int children, int per_child)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)children * (rlim_t)per_child + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
        zn_debug("launch: setrlimit(RLIMIT_NOFILE, %llu): %s", (unsigned long long)rl.rlim_cur,
                 strerror(errno));
}

/* ---- the run --------------------------------------------------------------------------*/
typedef struct {
    int fd;
    int is_err;
    char *buf;
    size_t n;
} stream;

typedef struct {
    const char *host;
    pid_t pid;              /* > 0 while running */
    int in;                 /* the watcher's stdin; -1 closed */
    stream out, err;
    int status;             /* -1 until reaped */
    long remote_pid;        /* pdsh: the rank's pid on its host; 0 unknown */
    char prefix[ZN_HOST_NAME_MAX + 24];
    size_t prefix_len;
    uint64_t reaped_ns;
} rank_proc;

typedef struct {
    const zn_cluster_config *c;
    rank_proc *r;
    int world;
    char *line;             /* prefix + LINE_BYTES + '\n' */
    int out_broken, err_broken;
    pid_t helpers[64];      /* pdsh kill commands in flight */
    int n_helpers;
} run_state;

/* Writes all of buf to fd (a terminal, pipe or file of the caller's);
 * a reader gone (EPIPE) stops that output, not the run. */
static void write_all(int fd, const char *buf, size_t n, int *broken)
{
    while (n && !*broken) {
        ssize_t w = write(fd, buf, n);
        if (w > 0) {
            buf += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && errno == EAGAIN) {
            struct pollfd p = { fd, POLLOUT, 0 };
            if (poll(&p, 1, 1000) <= 0)
                *broken = 1;   /* a reader that stopped reading: drop, not hang */
        } else {
            *broken = 1;
        }
    }
}

static void emit(run_state *s, rank_proc *r, stream *st, const char *text, size_t n)
{
    /* pdsh: the rank's pid, its first line (after what a login script may
     * print), is the launcher's, not the user's */
    size_t tl = strlen(ZN_PDSH_PID_TAG);
    if (!st->is_err && !r->remote_pid && s->c->remote == ZN_REMOTE_PDSH &&
        !zn_cluster_host_is_local(r->host) && n > tl && !memcmp(text, ZN_PDSH_PID_TAG, tl)) {
        r->remote_pid = strtol(text + tl, NULL, 10);
        return;
    }
    memcpy(s->line, r->prefix, r->prefix_len);
    memcpy(s->line + r->prefix_len, text, n);
    s->line[r->prefix_len + n] = '\n';
    write_all(st->is_err ? s->c->err_fd : s->c->out_fd, s->line, r->prefix_len + n + 1,
              st->is_err ? &s->err_broken : &s->out_broken);
}

/* Reads what is there; passes on whole lines (and a line of LINE_BYTES
 * without its end); at EOF the rest, and closes. */
static void drain(run_state *s, rank_proc *r, stream *st, int eof_now)
{
    for (;;) {
        ssize_t got = eof_now ? 0 : read(st->fd, st->buf + st->n, LINE_BYTES - st->n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && errno == EAGAIN)
            return;
        if (got > 0) {
            size_t start = 0, end = st->n + (size_t)got;
            for (size_t i = st->n; i < end; i++)
                if (st->buf[i] == '\n') {
                    emit(s, r, st, st->buf + start, i - start);
                    start = i + 1;
                }
            memmove(st->buf, st->buf + start, end - start);
            st->n = end - start;
            if (st->n == LINE_BYTES) {
                emit(s, r, st, st->buf, st->n);
                st->n = 0;
            }
            continue;
        }
        /* EOF or a read error: what is left is the last line */
        if (st->n)
            emit(s, r, st, st->buf, st->n);
        st->n = 0;
        zn_cluster_close_fd(&st->fd);
        return;
    }
}

static void reap_helpers(run_state *s, int block)
{
    for (int i = 0; i < s->n_helpers;) {
        pid_t w;
        do
            w = waitpid(s->helpers[i], NULL, block ? 0 : WNOHANG);
        while (w < 0 && errno == EINTR);
        if (w == 0) {
            i++;
            continue;
        }
        s->helpers[i] = s->helpers[--s->n_helpers];
    }
}

/* A pdsh rank's signal: `pdsh -w HOST kill -s SIG PID`. */
static void pdsh_kill(run_state *s, rank_proc *r, const char *sig)
{
    if (!r->remote_pid) {
        /* it has not said its pid yet: stopping its pdsh is all there is */
        kill(r->pid, SIGTERM);
        return;
    }
    reap_helpers(s, 0);
    if (s->n_helpers == (int)(sizeof s->helpers / sizeof *s->helpers))
        reap_helpers(s, 1);
    char cmd[96], **argv = NULL;
    snprintf(cmd, sizeof cmd, "kill -s %s %ld", sig, r->remote_pid);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || zn_cluster_transport_argv(s->c, r->host, cmd, 0, &argv) ||
        zn_cluster_spawn(argv, null, null, s->c->err_fd, 0, &s->helpers[s->n_helpers]))
        note(s->c, "cannot send SIG%s to rank on %s: %s", sig, r->host,
             null < 0 ? strerror(errno) : zn_last_error());
    else
        s->n_helpers++;
    free(argv);
    if (null >= 0)
        close(null);
}

/* The rank's variables, the first lines its watcher reads (launch_cmd.c),
 * into the channel's nonblocking pipe: a few KiB, so the pipe takes them
 * at once; a stuck ssh gets 10 s. */
static int send_block(int fd, const char *block)
{
    size_t n = strlen(block), done = 0;
    uint64_t deadline = zn_now_ns() + 10000000000ull;
    while (done < n) {
        ssize_t w = write(fd, block + done, n - done);
        if (w > 0) {
            done += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN)
            return zn_set_error(-errno, "launch: sending the rank its environment (%zu bytes) "
                                "over its ssh channel: %s", n, strerror(errno));
        if (zn_now_ns() >= deadline)
            return zn_set_error(ZN_ETIMEOUT, "launch: sending the rank its environment: its "
                                "ssh took %zu of %zu bytes in 10 s", done, n);
        struct pollfd p = { fd, POLLOUT, 0 };
        poll(&p, 1, 100);
    }
    return 0;
}

/* Sends every rank still running the signal through its watcher. */
static int forward(run_state *s, const char *sig)
{
    int n = 0;
    char line[16];
    snprintf(line, sizeof line, "%s\n", sig);
    for (int i = 0; i < s->world; i++) {
        rank_proc *r = &s->r[i];
        if (r->pid <= 0)
            continue;
        n++;
        if (s->c->remote == ZN_REMOTE_PDSH && !zn_cluster_host_is_local(r->host)) {
            pdsh_kill(s, r, sig);
        } else if (r->in >= 0) {
            ssize_t w;
            do
                w = write(r->in, line, strlen(line));
            while (w < 0 && errno == EINTR);
            if (w < 0)   /* its ssh is gone (EPIPE) or stuck: end the ssh */
                kill(r->pid, SIGTERM);
        }
    }
    return n;
}

static void kill_all(run_state *s)
{
    for (int i = 0; i < s->world; i++)
        if (s->r[i].pid > 0)
            kill(s->r[i].pid, SIGKILL);
}

static void reap(run_state *s, const zn_cluster_config *c, int *first_fail)
{
    for (int i = 0; i < s->world; i++) {
        rank_proc *r = &s->r[i];
        if (r->pid <= 0)
            continue;
        int st;
        pid_t w = waitpid(r->pid, &st, WNOHANG);
        if (w == 0 || (w < 0 && errno == EINTR))
            continue;
        r->status = w == r->pid ? zn_cluster_wait_status(st) : 255;
        r->pid = 0;
        r->reaped_ns = zn_now_ns();
        zn_cluster_close_fd(&r->in);
        if (r->status && *first_fail < 0)
            *first_fail = i;
        if (r->status)
            note(c, "rank %d on %s ended with status %d", i, r->host, r->status);
    }
}

int zn_cluster_run(const zn_cluster_config *c, zn_cluster_result *res)
{
    if (!c || !c->hosts || !c->argv || c->argc < 1 || !res)
        return zn_set_error(ZN_EARG, "zn_cluster_run: no hosts, command or result");
    int world = zn_hostfile_world(c->hosts);
    if (world < 1)
        return zn_set_error(ZN_EARG, "zn_cluster_run: no slot selected");
    if (c->remote == ZN_REMOTE_MPIRUN)
        return zn_cluster_run_mpirun(c, res);
    res->exit_code = 0;
    res->worst_rank = -1;
    res->first_failed = -1;
    res->signal = 0;
    run_state s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.world = world;
    s.r = calloc((size_t)world, sizeof *s.r);
    s.line = malloc(ZN_HOST_NAME_MAX + 24 + LINE_BYTES + 1);
    int rc = 0, start_rc = 0, sfd = -1, masked = 0;
    sigset_t take, old;
    char secret[ZN_JOB_SECRET_HEX + 1], job_id[17];
    secret[0] = job_id[0] = 0;
    if (!s.r || !s.line) {
        rc = zn_set_error(-ENOMEM, "launch: out of memory");
        goto out;
    }
    for (int i = 0; i < world; i++) {
        rank_proc *r = &s.r[i];
        r->in = r->out.fd = r->err.fd = -1;
        r->status = -1;
        r->err.is_err = 1;
        zn_rank_place pl;
        if ((rc = zn_hostfile_place(c->hosts, i, &pl)))
            goto out;
        r->host = c->hosts->hosts[pl.host].name;
        snprintf(r->prefix, sizeof r->prefix, "[%s:%d] ", r->host, i);
        r->prefix_len = strlen(r->prefix);
        if (!(r->out.buf = malloc(LINE_BYTES)) || !(r->err.buf = malloc(LINE_BYTES))) {
            rc = zn_set_error(-ENOMEM, "launch: out of memory");
            goto out;
        }
    }
    zn_cluster_raise_fd_limit(world, 3);
    if (c->job_secret && (rc = zn_cluster_make_secret(secret, job_id)))
        goto out;
    if (c->job_secret && c->remote == ZN_REMOTE_PDSH)
        for (int i = 0; i < world; i++)
            if (!zn_cluster_host_is_local(s.r[i].host)) {
                note(c, "--launcher pdsh carries no stdin: the ranks get no job secret, so "
                     "their TCP ports take a connection from anyone (use ssh for that)");
                break;
            }
    if ((rc = zn_cluster_take_signals(&take, &old, &sfd)))
        goto out;
    masked = 1;

    /* start every rank; one that cannot start stops the ones before it */
    for (int i = 0; i < world && !start_rc; i++) {
        rank_proc *r = &s.r[i];
        char **argv = NULL, *block = NULL;
        int pi[2] = { -1, -1 }, po[2] = { -1, -1 }, pe[2] = { -1, -1 };
        if ((start_rc = zn_cluster_rank_launch(c, i, c->job_secret ? secret : NULL,
                                               c->job_secret ? job_id : NULL, &argv, NULL,
                                               &block)) ||
            (start_rc = zn_cluster_pipe(pi, 1)) || (start_rc = zn_cluster_pipe(po, 0)) ||
            (start_rc = zn_cluster_pipe(pe, 0)) ||
            (start_rc = zn_cluster_spawn(argv, pi[0], po[1], pe[1], 1, &r->pid))) {
            zn_error_prefix(start_rc, "starting rank %d on %s", i, r->host);
            r->pid = 0;
        } else if (block && (start_rc = send_block(pi[1], block))) {
            /* started, but it cannot run without its environment (its
             * watcher ends it at the channel's end): stopped below */
            zn_error_prefix(start_rc, "starting rank %d on %s", i, r->host);
        }
        free(argv);
        zn_cluster_free_secret_block(block);
        int *ends[] = { &pi[0], &po[1], &pe[1] };
        for (int k = 0; k < 3; k++)
            zn_cluster_close_fd(ends[k]);
        r->in = pi[1];
        r->out.fd = po[0];
        r->err.fd = pe[0];
        if (start_rc) {
            zn_cluster_close_fd(&r->in);
            zn_cluster_close_fd(&r->out.fd);
            zn_cluster_close_fd(&r->err.fd);
            r->status = 255;
        }
    }
    int user_sigs = 0, first_fail = -1;
    double grace = c->fail_grace_s > 0 ? c->fail_grace_s : 60;
    uint64_t fail_ns = 0, term_ns = 0, killed = 0;
    if (start_rc) {
        /* a rank waiting for the one that never came may not see SIGTERM
         * before its rendezvous times out: killed after the grace */
        int n = forward(&s, "TERM");
        term_ns = zn_now_ns();
        note(c, "%s; stopping the %d rank%s started (SIGTERM, then kill after %.0f s)",
             zn_last_error(), n, n == 1 ? "" : "s", grace);
    }
    struct pollfd *pf = calloc((size_t)(2 * world + 1), sizeof *pf);
    stream **pmap = calloc((size_t)(2 * world + 1), sizeof *pmap);
    int *rmap = calloc((size_t)(2 * world + 1), sizeof *rmap);
    if (!pf || !pmap || !rmap) {
        free(pf);
        free(pmap);
        free(rmap);
        kill_all(&s);
        rc = zn_set_error(-ENOMEM, "launch: out of memory");
        goto out;
    }
    for (;;) {
        reap(&s, c, &first_fail);
        uint64_t now = zn_now_ns();
        int live = 0, n = 0;
        pf[n].fd = sfd;
        pf[n++].events = POLLIN;
        for (int i = 0; i < world; i++) {
            rank_proc *r = &s.r[i];
            live += r->pid > 0;
            stream *sts[2] = { &r->out, &r->err };
            for (int k = 0; k < 2; k++) {
                if (sts[k]->fd < 0)
                    continue;
                /* a rank's ssh is gone but something it left holds its
                 * output open: give it DRAIN_S, then stop listening */
                if (r->pid <= 0 && r->reaped_ns && now - r->reaped_ns > (uint64_t)(DRAIN_S * 1e9)) {
                    drain(&s, r, sts[k], 1);
                    continue;
                }
                pf[n].fd = sts[k]->fd;
                pf[n].events = POLLIN;
                pmap[n] = sts[k];
                rmap[n++] = i;
            }
        }
        if (!live && n == 1)
            break;
        /* a failed rank: the others get the grace to stop on their own
         * (the communicator names the dead rank), then SIGTERM, then kill */
        if (first_fail >= 0 && !fail_ns && !user_sigs && !start_rc && live) {
            fail_ns = now;
            note(c, "%d other rank%s still running: %.0f s to stop on their own, then "
                 "SIGTERM", live, live == 1 ? "" : "s", grace);
        }
        if (fail_ns && !term_ns && live && now - fail_ns > (uint64_t)(grace * 1e9)) {
            term_ns = now;
            note(c, "%d rank%s still running %.0f s after rank %d failed: sending SIGTERM", live,
                 live == 1 ? "" : "s", grace, first_fail);
            forward(&s, "TERM");
        }
        if (term_ns && !killed && live && now - term_ns > (uint64_t)(grace * 1e9)) {
            killed = now;
            note(c, "%d rank%s still running %.0f s after SIGTERM: killing their %s (a "
                 "local rank itself)", live, live == 1 ? "" : "s", grace,
                 c->remote == ZN_REMOTE_PDSH ? "pdsh" : "ssh");
            kill_all(&s);
        }
        int pr = poll(pf, (nfds_t)n, 250);
        if (pr < 0 && errno != EINTR) {
            rc = zn_set_error(-errno, "launch: poll: %s", strerror(errno));
            kill_all(&s);
            break;
        }
        if (pr <= 0)
            continue;
        if (pf[0].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                int sig = (int)si.ssi_signo;
                if (sig != SIGINT && sig != SIGTERM && sig != SIGHUP)
                    continue;   /* SIGCHLD: reaped above; SIGPIPE: a write's EPIPE */
                if (!res->signal)
                    res->signal = sig;
                user_sigs++;
                if (user_sigs <= 2) {
                    const char *fw = sig == SIGINT ? "INT" : "TERM";
                    int k = forward(&s, fw);
                    note(c, "%s: forwarded SIG%s to %d rank%s%s", strsignal(sig), fw, k,
                         k == 1 ? "" : "s",
                         user_sigs == 1 ? " (a second signal is forwarded too, a third kills "
                                          "them)" : "");
                } else {
                    note(c, "%s again: killing the ranks' %s (a local rank itself)",
                         strsignal(sig), c->remote == ZN_REMOTE_PDSH ? "pdsh" : "ssh");
                    kill_all(&s);
                }
            }
        }
        for (int j = 1; j < n; j++)
            if (pf[j].revents)
                drain(&s, &s.r[rmap[j]], pmap[j], 0);
    }
    free(pf);
    free(pmap);
    free(rmap);
    reap_helpers(&s, 1);
    for (int i = 0; i < world; i++) {
        int st = s.r[i].status;
        if (res->status)
            res->status[i] = st < 0 ? 255 : st;
        if (st > res->exit_code) {
            res->exit_code = st;
            res->worst_rank = i;
        }
    }
    res->first_failed = first_fail;
    if (!rc)
        rc = start_rc;
out:
    for (int i = 0; s.r && i < world; i++) {
        rank_proc *r = &s.r[i];
        if (r->pid > 0) {   /* only on an error path: nothing may outlive the run */
            kill(r->pid, SIGKILL);
            while (waitpid(r->pid, NULL, 0) < 0 && errno == EINTR)
                ;
        }
        zn_cluster_close_fd(&r->in);
        zn_cluster_close_fd(&r->out.fd);
        zn_cluster_close_fd(&r->err.fd);
        free(r->out.buf);
        free(r->err.buf);
    }
    if (masked)  /* (sfd is -1 when the signals were never taken) */
        zn_cluster_give_signals(&take, &old, &sfd);
    free(s.r);
    free(s.line);
    for (volatile char *v = secret; v < secret + sizeof secret; v++)
        *v = 0;
    return rc;
}
