/* The check before anything starts (zn_cluster_check, launch.h): every
 * host at once over ssh (pdsh, or sh for a local host) runs `cd FOLDER`,
 * looks the command up, tries the folders the run writes (its swap and
 * checkpoint folders) and, for zinc, compares its version; each host that
 * fails is named with ssh's own words. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "run/launch-impl.h"
#include "zn_build_config.h"

#define CHECK_KEEP 2048             /* bytes of a check's output kept for its message */
#define DRAIN_S ZN_CLUSTER_DRAIN_S

typedef struct {
    pid_t pid;
    int out, err, status, timed_out;
    uint64_t reaped_ns;
    char obuf[CHECK_KEEP], ebuf[CHECK_KEEP];
    size_t on, en;
} check_proc;

static int argv0_is_zinc(const char *a)
{
    const char *b = strrchr(a, '/');
    return !strcmp(b ? b + 1 : a, "zinc");
}

/* The last non-empty line of a check's output, for its message. */
static const char *last_line(char *buf, size_t n)
{
    buf[n < CHECK_KEEP ? n : CHECK_KEEP - 1] = 0;
    char *e = buf + strlen(buf);
    while (e > buf && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' '))
        *--e = 0;
    char *s = strrchr(buf, '\n');
    return s ? s + 1 : buf;
}

static void keep(char *buf, size_t *n, const char *src, size_t len)
{
    size_t room = CHECK_KEEP - 1 - *n;
    if (len > room) {
        /* keep the newest bytes: ssh's reason comes last */
        size_t total = *n + len, drop = total - (CHECK_KEEP - 1);
        if (drop >= *n) {
            memcpy(buf, src + (len - (CHECK_KEEP - 1)), CHECK_KEEP - 1);
            *n = CHECK_KEEP - 1;
            return;
        }
        memmove(buf, buf + drop, *n - drop);
        *n -= drop;
    }
    memcpy(buf + *n, src, len);
    *n += len;
}

/* A folder the run writes, tried where it runs: the folder itself or, when
 * it is not there yet, the nearest folder above it that is (the run makes
 * the rest), gets a file made and removed. A swap folder the run may not
 * create must be there. A checkpoint to resume (r) must hold manifest.json
 * or latest, and is not written. On failure the host prints
 * `zinc-check-path I WHY FOLDER[: REASON]` and exits 92. */
static const char path_fn[] =
    "zn_p() { if [ \"$2\" = r ]; then [ -r \"$1/manifest.json\" ] || [ -r \"$1/latest\" ] || "
    "{ echo \"zinc-check-path $3 nockpt $1\"; exit 92; }; return 0; fi; p=$1; "
    "while [ ! -e \"$p\" ]; do [ \"$2\" = m ] && { echo \"zinc-check-path $3 missing $1\"; "
    "exit 92; }; p=$(dirname -- \"$p\"); done; [ -d \"$p\" ] || { echo "
    "\"zinc-check-path $3 notdir $p\"; exit 92; }; f=$p/.zinc-check-$$; if e=$( (: > \"$f\") "
    "2>&1 ); then rm -f -- \"$f\"; else echo \"zinc-check-path $3 ro $p: ${e##*: }\"; exit 92; "
    "fi; }; ";

static void check_command(const zn_cluster_config *c, const char *cwd, int zinc, zn_sbuf *cmd)
{
    zn_sbuf_adds(cmd, "cd ");
    zn_sbuf_addq(cmd, cwd);
    zn_sbuf_adds(cmd, " || exit 90; command -v ");
    zn_sbuf_addq(cmd, c->argv[0]);
    zn_sbuf_adds(cmd, " >/dev/null 2>&1 || exit 91; ");
    if (c->n_paths > 0)
        zn_sbuf_adds(cmd, path_fn);
    for (int i = 0; i < c->n_paths; i++) {
        zn_sbuf_adds(cmd, "zn_p ");
        zn_sbuf_addq(cmd, c->paths[i].path);
        zn_sbuf_addf(cmd, " %s %d; ", c->paths[i].must_exist == 2 ? "r"
                                      : c->paths[i].must_exist ? "m" : "c", i);
    }
    if (zinc) {
        zn_sbuf_adds(cmd, "exec ");
        zn_sbuf_addq(cmd, c->argv[0]);
        zn_sbuf_adds(cmd, " --version");
    } else {
        zn_sbuf_adds(cmd, "exit 0");
    }
}

/* A host's answer `zinc-check-path I WHY REST` (exit 92) as words. */
static void path_failure(const zn_cluster_config *c, const char *h, const char *line,
                         zn_sbuf *why)
{
    int i = -1, n = 0;
    char kind[16] = "";
    if (sscanf(line, "zinc-check-path %d %15s %n", &i, kind, &n) < 2 || i < 0 ||
        i >= c->n_paths || !n) {
        zn_sbuf_addf(why, "host %s: a folder check answered \"%.200s\"", h, line);
        return;
    }
    const zn_cluster_path *p = &c->paths[i];
    const char *rest = line + n;
    if (!strcmp(kind, "nockpt")) {
        zn_sbuf_addf(why, "host %s cannot read %s %.300s: neither manifest.json nor latest is "
                     "there", h, p->what ? p->what : "the checkpoint", p->path);
        return;
    }
    zn_sbuf_addf(why, "host %s cannot write %s %.300s: ", h, p->what ? p->what : "the folder",
                 p->path);
    if (!strcmp(kind, "missing"))
        zn_sbuf_addf(why, "it is not there (and the run may not create it)");
    else if (!strcmp(kind, "notdir"))
        zn_sbuf_addf(why, "%.300s is not a folder", rest);
    else
        zn_sbuf_addf(why, "no file can be made in %.400s", rest);
}

int zn_cluster_check(const zn_cluster_config *c)
{
    if (!c || !c->hosts || c->hosts->n_hosts < 1 || !c->argv || c->argc < 1 || !c->argv[0])
        return zn_set_error(ZN_EARG, "zn_cluster_check: no hosts or no command");
    int nh = c->hosts->n_hosts, rc = 0, devnull = -1;
    char cwd_buf[ZN_PATH_MAX];
    const char *cwd;
    if ((rc = zn_cluster_cwd(c, cwd_buf, sizeof cwd_buf, &cwd)))
        return rc;
    const char *maddr;
    if ((rc = zn_cluster_master_addr(c, &maddr)))
        return rc;
    int zinc = argv0_is_zinc(c->argv[0]);
    zn_sbuf cmd = { 0 };
    check_command(c, cwd, zinc, &cmd);
    check_proc *p = calloc((size_t)nh, sizeof *p);
    if (!p || cmd.oom) {
        free(p);
        free(cmd.s);
        return zn_set_error(-ENOMEM, "launch: out of memory");
    }
    for (int i = 0; i < nh; i++)
        p[i].out = p[i].err = -1;
    zn_cluster_raise_fd_limit(nh, 2);
    if ((devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
        rc = zn_set_error(-errno, "launch: /dev/null: %s", strerror(errno));
        goto out;
    }
    for (int i = 0; i < nh; i++) {
        char **argv = NULL;
        int po[2], pe[2];
        if ((rc = zn_cluster_transport_argv(c, c->hosts->hosts[i].name, cmd.s, 1, &argv)))
            goto out;
        if ((rc = zn_cluster_pipe(po, 0))) {
            free(argv);
            goto out;
        }
        if ((rc = zn_cluster_pipe(pe, 0))) {
            close(po[0]);
            close(po[1]);
            free(argv);
            goto out;
        }
        rc = zn_cluster_spawn(argv, devnull, po[1], pe[1], 0, &p[i].pid);
        free(argv);
        close(po[1]);
        close(pe[1]);
        p[i].out = po[0];
        p[i].err = pe[0];
        if (rc) {
            p[i].pid = 0;
            zn_error_prefix(rc, "checking host %s", c->hosts->hosts[i].name);
            goto out;
        }
    }
    double limit = (c->check_timeout_s > 0 ? c->check_timeout_s : 10) + 10;
    uint64_t deadline = zn_now_ns() + (uint64_t)(limit * 1e9);
    struct pollfd *pf = calloc((size_t)(2 * nh), sizeof *pf);
    int *map = calloc((size_t)(2 * nh), sizeof *map);
    if (!pf || !map) {
        free(pf);
        free(map);
        rc = zn_set_error(-ENOMEM, "launch: out of memory");
        goto out;
    }
    for (;;) {
        int n = 0, live = 0;
        for (int i = 0; i < nh; i++) {
            if (p[i].pid > 0) {
                int st;
                pid_t w = waitpid(p[i].pid, &st, WNOHANG);
                if (w == p[i].pid || (w < 0 && errno != EINTR)) {
                    p[i].status = w == p[i].pid ? zn_cluster_wait_status(st) : 255;
                    p[i].pid = 0;
                    p[i].reaped_ns = zn_now_ns();
                }
            }
            live += p[i].pid > 0;
            /* what ssh left behind (a ControlPersist master) may hold its
             * output open: DRAIN_S after it ended, stop listening */
            if (!p[i].pid && zn_now_ns() - p[i].reaped_ns > (uint64_t)(DRAIN_S * 1e9)) {
                zn_cluster_close_fd(&p[i].out);
                zn_cluster_close_fd(&p[i].err);
            }
            int *fds[2] = { &p[i].out, &p[i].err };
            for (int k = 0; k < 2; k++)
                if (*fds[k] >= 0) {
                    pf[n].fd = *fds[k];
                    pf[n].events = POLLIN;
                    map[n++] = 2 * i + k;
                }
        }
        if (!live && !n)
            break;
        if (zn_now_ns() >= deadline) {
            for (int i = 0; i < nh; i++)
                if (p[i].pid > 0) {
                    kill(p[i].pid, SIGKILL);
                    while (waitpid(p[i].pid, NULL, 0) < 0 && errno == EINTR)
                        ;
                    p[i].pid = 0;
                    p[i].timed_out = 1;
                    p[i].status = 255;
                }
            break;
        }
        int pr = poll(pf, (nfds_t)n, 100);
        if (pr < 0 && errno != EINTR) {
            rc = zn_set_error(-errno, "launch: poll: %s", strerror(errno));
            break;
        }
        for (int j = 0; pr > 0 && j < n; j++) {
            if (!pf[j].revents)
                continue;
            check_proc *q = &p[map[j] / 2];
            int is_err = map[j] % 2;
            char tmp[4096];
            ssize_t got = read(pf[j].fd, tmp, sizeof tmp);
            if (got > 0)
                keep(is_err ? q->ebuf : q->obuf, is_err ? &q->en : &q->on, tmp, (size_t)got);
            else if (got == 0 || (errno != EAGAIN && errno != EINTR))
                zn_cluster_close_fd(is_err ? &q->err : &q->out);
        }
    }
    free(pf);
    free(map);
    if (rc)
        goto out;
    /* the verdict, every host that failed named */
    zn_sbuf why = { 0 };
    int bad = 0;
    char want[64];
    snprintf(want, sizeof want, "zinc %s", ZN_VERSION);
    for (int i = 0; i < nh; i++) {
        check_proc *q = &p[i];
        const char *h = c->hosts->hosts[i].name;
        const char *err = last_line(q->ebuf, q->en), *out1 = last_line(q->obuf, q->on);
        if (q->timed_out)
            zn_sbuf_addf(&why, "%shost %s did not answer within %.0f s", bad++ ? "; " : "", h,
                         limit);
        else if (q->status == 90)
            zn_sbuf_addf(&why, "%shost %s has no folder %.300s (the launcher's, where every "
                         "rank starts)", bad++ ? "; " : "", h, cwd);
        else if (q->status == 91)
            zn_sbuf_addf(&why, "%shost %s cannot run \"%.200s\" (not found on the PATH of a "
                         "non-interactive ssh session there)", bad++ ? "; " : "", h,
                         c->argv[0]);
        else if (q->status == 92 && !strncmp(out1, "zinc-check-path ", 16)) {
            if (bad++)
                zn_sbuf_adds(&why, "; ");
            path_failure(c, h, out1, &why);
        } else if (q->status != 0)
            zn_sbuf_addf(&why, "%shost %s does not answer over %s (exit %d): %.600s",
                         bad++ ? "; " : "", h,
                         zn_cluster_host_is_local(h) ? "sh" :
                         c->remote == ZN_REMOTE_PDSH ? "pdsh" : "ssh", q->status,
                         *err ? err : "no message");
        else if (zinc && strcmp(out1, want))
            zn_sbuf_addf(&why, "%shost %s runs \"%.100s\", this launcher is %s",
                         bad++ ? "; " : "", h, *out1 ? out1 : "(nothing)", want);
    }
    if (why.oom)
        rc = zn_set_error(-ENOMEM, "launch: out of memory");
    else if (bad)
        rc = zn_set_error(ZN_ECONFIG, "the cluster check failed before any rank started "
                          "(%d of %d host%s): %s", bad, nh, nh == 1 ? "" : "s", why.s);
    free(why.s);
out:
    for (int i = 0; i < nh; i++) {
        if (p[i].pid > 0) {
            kill(p[i].pid, SIGKILL);
            while (waitpid(p[i].pid, NULL, 0) < 0 && errno == EINTR)
                ;
        }
        zn_cluster_close_fd(&p[i].out);
        zn_cluster_close_fd(&p[i].err);
    }
    if (devnull >= 0)
        close(devnull);
    free(p);
    free(cmd.s);
    return rc;
}
