/* The launcher's command lines: the environment a rank gets (DeepSpeed's
 * forwarded prefixes, .deepspeed_env, the rank's own variables, the job's
 * secret), the shell command that runs it on its host, every word quoted
 * for the remote shell, the lines its watcher reads first (the variables,
 * kept off every command line), and the ssh / pdsh / sh argv that carries
 * it there. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "run/launch-impl.h"

extern char **environ;

/* Variables of the launcher's environment passed to every rank: DeepSpeed's
 * EXPORT_ENVS (launcher/constants.py) and zinc's own settings. */
static const char *const forward_prefixes[] = { "NCCL", "PYTHON", "UCX", "MLFLOW", "MV2",
                                                "ZINC_", "OMP_" };

/* The watcher of each rank (launch.h): the rank runs in the shell's place
 * (exec keeps the pid, $$), so its status is ssh's and a signal to $$
 * reaches it; the watcher reads the ssh channel (fd 3), and end of file,
 * which is the launcher or its ssh going, stops the rank. The rank runs
 * with SIGPIPE ignored (as every Python rank under DeepSpeed does): when
 * the launcher dies its ssh goes, and a rank writing a line then would die
 * of SIGPIPE mid-step, leaving its swap files, before the watcher's
 * SIGTERM could stop it cleanly. */
static const char watch_ssh[] =
    "trap '' PIPE\n"
    "exec 3<&0 </dev/null\n"
    "(while read -r s <&3; do case $s in INT|TERM) kill -s \"$s\" $$;; esac; done;"
    " kill -s TERM $$) >/dev/null 2>&1 &\n"
    "exec \"$@\" 3<&-\n";
/* The same, first reading the rank's variables from the channel (zn_cluster_run
 * writes them there): KEY=VALUE lines up to an empty one. The channel
 * closing before that line ends the rank before it starts: it never runs
 * without its RANK or its secret. */
static const char watch_ssh_env[] =
    "trap '' PIPE\n"
    "while :; do IFS= read -r zn_kv || { echo \"zinc-rank: the launcher's channel closed "
    "before this rank's environment arrived\" >&2; exit 1; }\n"
    " [ -z \"$zn_kv\" ] && break; export \"$zn_kv\"; done; unset zn_kv\n"
    "exec 3<&0 </dev/null\n"
    "(while read -r s <&3; do case $s in INT|TERM) kill -s \"$s\" $$;; esac; done;"
    " kill -s TERM $$) >/dev/null 2>&1 &\n"
    "exec \"$@\" 3<&-\n";
/* pdsh forwards no stdin (its remote stdin never ends): the rank says its
 * pid, and the launcher signals it with a second pdsh. */
static const char watch_pdsh[] =
    "trap '' PIPE; echo \"" ZN_PDSH_PID_TAG "$$\"; exec \"$@\" </dev/null\n";

zn_cluster_config zn_cluster_config_default(void)
{
    zn_cluster_config c;
    memset(&c, 0, sizeof c);
    c.master_port = 29500;
    c.remote = ZN_REMOTE_SSH;
    c.check_timeout_s = 10;
    c.fail_grace_s = 60;
    c.out_fd = 1;
    c.err_fd = 2;
    c.ssh = "ssh";
    c.pdsh = "pdsh";
    c.mpirun = "mpirun";
    c.job_secret = 1;
    return c;
}

/* memset that the compiler may not drop (the secret's copies) */
static void wipe(char *s, size_t n)
{
    volatile char *v = s;
    while (n--)
        *v++ = 0;
}

static int random_bytes(unsigned char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return zn_set_error(-errno, "launch: getrandom (the job's secret): %s",
                                strerror(errno));
        got += (size_t)r;
    }
    return 0;
}

int zn_cluster_make_secret(char secret[ZN_JOB_SECRET_HEX + 1], char job_id[17])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char key[ZN_JOB_SECRET_HEX / 2 + 8];
    int rc = random_bytes(key, sizeof key);
    if (rc)
        return rc;
    for (size_t i = 0; i < ZN_JOB_SECRET_HEX / 2; i++) {
        secret[2 * i] = hex[key[i] >> 4];
        secret[2 * i + 1] = hex[key[i] & 15];
    }
    secret[ZN_JOB_SECRET_HEX] = 0;
    for (size_t i = 0; i < 8; i++) {
        job_id[2 * i] = hex[key[ZN_JOB_SECRET_HEX / 2 + i] >> 4];
        job_id[2 * i + 1] = hex[key[ZN_JOB_SECRET_HEX / 2 + i] & 15];
    }
    job_id[16] = 0;
    wipe((char *)key, sizeof key);
    return 0;
}

/* ---- strings ---------------------------------------------------------------------*/
void zn_sbuf_add(zn_sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

void zn_sbuf_adds(zn_sbuf *b, const char *s)
{
    zn_sbuf_add(b, s, strlen(s));
}

void zn_sbuf_addf(zn_sbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) {
        b->oom = 1;   /* only short items go through here */
        return;
    }
    zn_sbuf_add(b, tmp, (size_t)n);
}

void zn_sbuf_addq(zn_sbuf *b, const char *s)
{
    zn_sbuf_add(b, "'", 1);
    for (const char *p = s; *p;) {
        const char *q = strchr(p, '\'');
        if (!q) {
            zn_sbuf_adds(b, p);
            break;
        }
        zn_sbuf_add(b, p, (size_t)(q - p));
        zn_sbuf_add(b, "'\\''", 4);
        p = q + 1;
    }
    zn_sbuf_add(b, "'", 1);
}

int zn_cluster_cwd(const zn_cluster_config *c, char *buf, size_t n, const char **cwd)
{
    *cwd = c->cwd;
    if (*cwd)
        return 0;
    if (!getcwd(buf, n))
        return zn_set_error(-errno, "launch: getcwd: %s", strerror(errno));
    *cwd = buf;
    return 0;
}

int zn_cluster_host_is_local(const char *host)
{
    return !strcmp(host, "localhost") || !strcmp(host, "127.0.0.1");
}

/* ---- the rank's environment ----------------------------------------------------------*/
typedef struct {
    char **kv;     /* "KEY=VALUE", each malloc'd; a later KEY replaces the earlier */
    int n, cap;
} envlist;

static void env_free(envlist *e)
{
    for (int i = 0; i < e->n; i++)
        free(e->kv[i]);
    free(e->kv);
}

static int name_ok(const char *k, size_t n)
{
    if (n == 0 || !((k[0] >= 'A' && k[0] <= 'Z') || (k[0] >= 'a' && k[0] <= 'z') ||
                    k[0] == '_'))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!((k[i] >= 'A' && k[i] <= 'Z') || (k[i] >= 'a' && k[i] <= 'z') ||
              (k[i] >= '0' && k[i] <= '9') || k[i] == '_'))
            return 0;
    return 1;
}

static int env_put(envlist *e, const char *key, size_t kn, const char *val, size_t vn)
{
    char *kv = malloc(kn + vn + 2);
    if (!kv)
        return zn_set_error(-ENOMEM, "launch: out of memory");
    memcpy(kv, key, kn);
    kv[kn] = '=';
    memcpy(kv + kn + 1, val, vn);
    kv[kn + 1 + vn] = 0;
    for (int i = 0; i < e->n; i++)
        if (!strncmp(e->kv[i], key, kn) && e->kv[i][kn] == '=') {
            free(e->kv[i]);
            e->kv[i] = kv;
            return 0;
        }
    if (e->n == e->cap) {
        int nc = e->cap ? 2 * e->cap : 32;
        char **nk = realloc(e->kv, sizeof *nk * (size_t)nc);
        if (!nk) {
            free(kv);
            return zn_set_error(-ENOMEM, "launch: out of memory");
        }
        e->kv = nk;
        e->cap = nc;
    }
    e->kv[e->n++] = kv;
    return 0;
}

static int env_has(const envlist *e, const char *key)
{
    size_t kn = strlen(key);
    for (int i = 0; i < e->n; i++)
        if (!strncmp(e->kv[i], key, kn) && e->kv[i][kn] == '=')
            return 1;
    return 0;
}

/* DIR/.deepspeed_env: KEY=VALUE lines (blank lines and # comments skipped;
 * the value verbatim, as DeepSpeed quotes it). A missing file is fine. */
static int env_file(envlist *e, const char *dir)
{
    char path[ZN_PATH_MAX + 32];
    if (snprintf(path, sizeof path, "%s/.deepspeed_env", dir) >= (int)sizeof path)
        return zn_set_error(ZN_EARG, "launch: the folder %s is too long a path", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? 0 : zn_set_error(-errno, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int ln = 0, rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        ln++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        size_t i = strspn(line, " \t");
        if (line[i] == 0 || line[i] == '#')
            continue;
        char *eq = strchr(line, '=');
        if (!eq || !name_ok(line, (size_t)(eq - line))) {
            rc = zn_set_error(ZN_ECONFIG, "%s:%d: expected KEY=VALUE (KEY a variable name), "
                              "found \"%.60s\"", path, ln, line);
            break;
        }
        if (memchr(line, 0, (size_t)len)) {
            rc = zn_set_error(ZN_ECONFIG, "%s:%d: a NUL byte", path, ln);
            break;
        }
        if ((rc = env_put(e, line, (size_t)(eq - line), eq + 1, strlen(eq + 1))))
            break;
    }
    if (!rc && ferror(f))
        rc = zn_set_error(-EIO, "%s: read error", path);
    free(line);
    fclose(f);
    return rc;
}

static int env_forwarded(envlist *e, const char *home, const char *cwd)
{
    int rc;
    for (char **p = environ; p && *p; p++) {
        const char *eq = strchr(*p, '=');
        if (!eq || !name_ok(*p, (size_t)(eq - *p)))
            continue;
        for (size_t k = 0; k < sizeof forward_prefixes / sizeof *forward_prefixes; k++)
            if (!strncmp(*p, forward_prefixes[k], strlen(forward_prefixes[k]))) {
                if ((rc = env_put(e, *p, (size_t)(eq - *p), eq + 1, strlen(eq + 1))))
                    return rc;
                break;
            }
    }
    if (home && *home && (rc = env_file(e, home)))
        return rc;
    if (!home || strcmp(home, cwd))
        if ((rc = env_file(e, cwd)))
            return rc;
    return 0;
}

/* The launcher's own ZINC_JOB_SECRET / ZINC_JOB_ID are never passed on. */
static void env_drop_secret(envlist *e)
{
    for (int i = 0; i < e->n; i++)
        if (!strncmp(e->kv[i], "ZINC_JOB_SECRET=", 16) || !strncmp(e->kv[i], "ZINC_JOB_ID=", 12)) {
            free(e->kv[i]);
            e->kv[i--] = e->kv[--e->n];
        }
}

int zn_cluster_env_list(const zn_cluster_config *c, const char *cwd, char ***kv, int *n)
{
    envlist e = { 0 };
    *kv = NULL;
    *n = 0;
    int rc = env_forwarded(&e, c->home ? c->home : getenv("HOME"), cwd);
    if (rc) {
        env_free(&e);
        return rc;
    }
    env_drop_secret(&e);
    *kv = e.kv;
    *n = e.n;
    return 0;
}

void zn_cluster_env_free(char **kv, int n)
{
    envlist e = { kv, n, n };
    env_free(&e);
}

int zn_cluster_master_addr(const zn_cluster_config *c, const char **addr)
{
    if (!c || !c->hosts || c->hosts->n_hosts < 1 || !addr)
        return zn_set_error(ZN_EARG, "zn_cluster_master_addr: no hosts");
    if (c->master_addr && *c->master_addr) {
        *addr = c->master_addr;
        return 0;
    }
    const char *first = c->hosts->hosts[0].name;
    if (!zn_cluster_host_is_local(first)) {
        *addr = first;
        return 0;
    }
    for (int k = 1; k < c->hosts->n_hosts; k++)
        if (!zn_cluster_host_is_local(c->hosts->hosts[k].name))
            return zn_set_error(ZN_EARG, "the first host is %s but %s is another machine: "
                                "--master_addr must say where that machine reaches rank 0",
                                first, c->hosts->hosts[k].name);
    *addr = "127.0.0.1";
    return 0;
}

/* ---- argv -------------------------------------------------------------------------------*/
/* words[0..n) copied into one allocation: the pointer array, NULL, then the
 * strings. */
int zn_cluster_pack_argv(const char *const *words, int n, char ***out)
{
    size_t bytes = sizeof(char *) * (size_t)(n + 1);
    for (int i = 0; i < n; i++)
        bytes += strlen(words[i]) + 1;
    char **v = malloc(bytes);
    if (!v)
        return zn_set_error(-ENOMEM, "launch: out of memory");
    char *s = (char *)(v + n + 1);
    for (int i = 0; i < n; i++) {
        size_t l = strlen(words[i]) + 1;
        memcpy(s, words[i], l);
        v[i] = s;
        s += l;
    }
    v[n] = NULL;
    *out = v;
    return 0;
}

#define MAX_WORDS 96

int zn_cluster_transport_argv(const zn_cluster_config *c, const char *host, const char *cmd,
                              int check, char ***argv)
{
    const char *w[MAX_WORDS];
    int n = 0;
    char timeout[64], *args = NULL;
    int rc;
    if (zn_cluster_host_is_local(host)) {
        w[n++] = "/bin/sh";
        w[n++] = "-c";
        w[n++] = cmd;
        return zn_cluster_pack_argv(w, n, argv);
    }
    double t = c->check_timeout_s > 0 ? c->check_timeout_s : 10;
    if (c->remote == ZN_REMOTE_PDSH) {
        w[n++] = c->pdsh && *c->pdsh ? c->pdsh : "pdsh";
        w[n++] = "-S";
        w[n++] = "-N";
        w[n++] = "-R";
        w[n++] = "ssh";
        if (check) {
            snprintf(timeout, sizeof timeout, "%d", (int)(t + 0.999));
            w[n++] = "-t";
            w[n++] = timeout;
        }
    } else {
        w[n++] = c->ssh && *c->ssh ? c->ssh : "ssh";
        w[n++] = "-T";
        w[n++] = "-o";
        w[n++] = "BatchMode=yes";
        snprintf(timeout, sizeof timeout, "ConnectTimeout=%d", (int)(t + 0.999));
        w[n++] = "-o";
        w[n++] = timeout;
        if (!check) {
            /* a host that stops answering ends its ssh in 60 s (and so its
             * rank's place in the run) instead of never */
            w[n++] = "-o";
            w[n++] = "ServerAliveInterval=10";
            w[n++] = "-o";
            w[n++] = "ServerAliveCountMax=6";
        }
    }
    if (c->launcher_args && *c->launcher_args) {
        if (!(args = strdup(c->launcher_args)))
            return zn_set_error(-ENOMEM, "launch: out of memory");
        char *save = NULL;
        for (char *tok = strtok_r(args, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save)) {
            if (n >= MAX_WORDS - 4) {
                free(args);
                return zn_set_error(ZN_EARG, "--launcher_args: more than %d words",
                                    MAX_WORDS - 16);
            }
            w[n++] = tok;
        }
    }
    if (c->remote == ZN_REMOTE_PDSH) {
        w[n++] = "-w";
    } else {
        w[n++] = "--";   /* the host is never taken for an option */
    }
    w[n++] = host;
    w[n++] = cmd;
    rc = zn_cluster_pack_argv(w, n, argv);
    free(args);
    return rc;
}

int zn_cluster_rank_command(const zn_cluster_config *c, int rank, char ***argv, char **cmd)
{
    return zn_cluster_rank_launch(c, rank, NULL, NULL, argv, cmd, NULL);
}

void zn_cluster_free_secret_block(char *block)
{
    if (block)
        wipe(block, strlen(block));
    free(block);
}

int zn_cluster_rank_launch(const zn_cluster_config *c, int rank, const char *secret,
                           const char *job_id, char ***argv, char **cmd, char **block)
{
    if (argv)
        *argv = NULL;
    if (cmd)
        *cmd = NULL;
    if (block)
        *block = NULL;
    if (!c || !c->hosts || !c->argv || c->argc < 1)
        return zn_set_error(ZN_EARG, "zn_cluster_rank_command: no hosts or no command");
    zn_rank_place pl;
    int rc = zn_hostfile_place(c->hosts, rank, &pl);
    if (rc)
        return rc;
    if (c->master_port < 1 || c->master_port > 65535)
        return zn_set_error(ZN_EARG, "--master_port %d: want 1 to 65535", c->master_port);
    const char *host = c->hosts->hosts[pl.host].name;
    char cwd_buf[ZN_PATH_MAX];
    const char *cwd;
    if ((rc = zn_cluster_cwd(c, cwd_buf, sizeof cwd_buf, &cwd)))
        return rc;
    const char *home = c->home ? c->home : getenv("HOME");
    const char *maddr;
    if ((rc = zn_cluster_master_addr(c, &maddr)))
        return rc;
    char devs[8 * ZN_HOST_SLOTS_MAX], num[32];
    if ((rc = zn_hostfile_devices(c->hosts, pl.host, devs, sizeof devs)))
        return rc;

    envlist e = { 0 };
    zn_sbuf lines = { 0 };
    /* the watcher reads the variables from the channel: ssh and a local sh
     * carry stdin, pdsh does not */
    int by_channel = block && !(c->remote == ZN_REMOTE_PDSH && !zn_cluster_host_is_local(host));
    if ((rc = env_forwarded(&e, home, cwd)))
        goto out;
    /* a secret of the launcher's own environment is never passed on: it
     * would be on a command line, and the job's is made afresh */
    env_drop_secret(&e);
    if (by_channel && secret &&
        ((rc = env_put(&e, "ZINC_JOB_SECRET", 15, secret, strlen(secret))) ||
         (job_id && (rc = env_put(&e, "ZINC_JOB_ID", 11, job_id, strlen(job_id))))))
        goto out;
    struct { const char *k; int v; } ints[] = {
        { "RANK", pl.rank }, { "LOCAL_RANK", pl.local_rank }, { "WORLD_SIZE", pl.world_size },
        { "LOCAL_SIZE", pl.local_size }, { "LOCAL_WORLD_SIZE", pl.local_size },
        { "CROSS_RANK", pl.host }, { "CROSS_SIZE", c->hosts->n_hosts },
        { "MASTER_PORT", c->master_port },
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        snprintf(num, sizeof num, "%d", ints[i].v);
        if ((rc = env_put(&e, ints[i].k, strlen(ints[i].k), num, strlen(num))))
            goto out;
    }
    if ((rc = env_put(&e, "MASTER_ADDR", 11, maddr, strlen(maddr))) ||
        (rc = env_put(&e, "ZINC_LAUNCH_HOST", 16, host, strlen(host))) ||
        (rc = env_put(&e, "CUDA_VISIBLE_DEVICES", 20, devs, strlen(devs))))
        goto out;
    if (!env_has(&e, "ZINC_COMM_BACKEND") &&
        (rc = env_put(&e, "ZINC_COMM_BACKEND", 17, "tcp", 3)))
        goto out;

    zn_sbuf b = { 0 };
    zn_sbuf_adds(&b, "cd ");
    zn_sbuf_addq(&b, cwd);
    zn_sbuf_adds(&b, " && exec env");
    for (int i = 0; i < e.n; i++) {
        /* a value with a line break cannot be one line of the channel: it
         * alone stays on the command line */
        if (by_channel && !strchr(e.kv[i], '\n')) {
            zn_sbuf_adds(&lines, e.kv[i]);
            zn_sbuf_add(&lines, "\n", 1);
            continue;
        }
        zn_sbuf_add(&b, " ", 1);
        zn_sbuf_addq(&b, e.kv[i]);
    }
    zn_sbuf_add(&lines, "\n", 1);
    zn_sbuf_adds(&b, " sh -c ");
    zn_sbuf_addq(&b, by_channel ? watch_ssh_env
                 : c->remote == ZN_REMOTE_PDSH && !zn_cluster_host_is_local(host) ? watch_pdsh
                 : watch_ssh);
    zn_sbuf_adds(&b, " zinc-rank");
    for (int i = 0; i < c->argc; i++) {
        if (!c->argv[i]) {
            free(b.s);
            rc = zn_set_error(ZN_EARG, "zn_cluster_rank_command: argv[%d] is NULL", i);
            goto out;
        }
        zn_sbuf_add(&b, " ", 1);
        zn_sbuf_addq(&b, c->argv[i]);
    }
    if (b.oom || lines.oom) {
        free(b.s);
        rc = zn_set_error(-ENOMEM, "launch: out of memory");
        goto out;
    }
    if (argv && (rc = zn_cluster_transport_argv(c, host, b.s, 0, argv))) {
        free(b.s);
        goto out;
    }
    if (cmd)
        *cmd = b.s;
    else
        free(b.s);
    if (by_channel) {
        *block = lines.s;
        lines.s = NULL;
    }
out:
    for (int i = 0; i < e.n; i++)
        wipe(e.kv[i], strlen(e.kv[i]));
    env_free(&e);
    zn_cluster_free_secret_block(lines.s);
    return rc;
}
