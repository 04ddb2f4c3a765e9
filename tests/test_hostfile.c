/* The launcher's hostfile and rank places (include/zinc/launch.h): DeepSpeed's
 * format read and refused with the file and line, --include / --exclude /
 * --num_nodes / --num_gpus as DeepSpeed applies them, RANK / LOCAL_RANK /
 * LOCAL_SIZE with unequal slot counts, and the rank's command line, run
 * through a real sh to see that every word and value arrives intact; the
 * folders a launched zinc train writes (for the check before the start),
 * and the cluster check's verdict on its links. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zinc/bench.h"
#include "zinc/launch.h"
#include "zt.h"

static zn_hostfile *parse(const char *text, int *rc)
{
    zn_hostfile *h = NULL;
    *rc = zn_hostfile_parse(text, strlen(text), "hf", &h);
    return h;
}

static void expect_bad(const char *text, const char *msg)
{
    int rc;
    zn_hostfile *h = parse(text, &rc);
    ZT_EQ_INT(rc, ZN_ECONFIG);
    ZT_CHECK(h == NULL);
    ZT_CONTAINS(zn_last_error(), msg);
    zn_hostfile_destroy(h);
}

static void test_parse(void)
{
    int rc;
    zn_hostfile *h = parse("# the cluster\n\nworker-0 slots=2\n  worker-1   slots=1  # one A10\n"
                           "\t10.0.0.3 slots=4\r\n", &rc);
    ZT_EQ_INT(rc, 0);
    if (!h)
        return;
    ZT_EQ_INT(h->n_hosts, 3);
    ZT_EQ_STR(h->hosts[0].name, "worker-0");
    ZT_EQ_INT(h->hosts[0].line, 3);
    ZT_EQ_INT(h->hosts[0].file_slots, 2);
    ZT_EQ_STR(h->hosts[1].name, "worker-1");
    ZT_EQ_INT(h->hosts[1].line, 4);
    ZT_EQ_INT(h->hosts[1].n_slots, 1);
    ZT_EQ_STR(h->hosts[2].name, "10.0.0.3");
    ZT_EQ_INT(h->hosts[2].line, 5);
    ZT_EQ_INT(zn_hostfile_world(h), 7);
    zn_hostfile_destroy(h);

    /* every malformed line named with its number */
    expect_bad("a slots=1\nb slots=2\na slots=3\n", "hf:3: host a is already on line 1");
    expect_bad("a slots=1\n\nb\n", "hf:3: expected \"b slots=N\"");
    expect_bad("a slots=1\nb slots=x\n", "hf:2: slots=x is not a whole number");
    expect_bad("a slots=0\n", "hf:1: slots=0 for a");
    expect_bad("a slots=1\n# x\nb slots=99999\n", "hf:3: slots=99999");
    expect_bad("a slots=2 max_slots=4\n", "hf:1: unexpected \"max_slots=4\"");
    expect_bad("a slots = 2\n", "hf:1: expected \"a slots=N\"");
    expect_bad("a slots=1\n-oProxyCommand=x slots=1\n", "hf:2: \"-oProxyCommand=x\" is not a host");
    expect_bad("user@a slots=1\n", "hf:1: \"user@a\" is not a host");
    expect_bad("a;rm slots=1\n", "hf:1:");
    expect_bad("# nothing\n\n", "hf: no host in it");
    expect_bad("", "hf: no host in it");
    static const char nul[] = "a slots=1\nb sl\0ts=1\n";
    ZT_EQ_INT(zn_hostfile_parse(nul, sizeof nul - 1, "hf", &h), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "hf:2: a NUL byte");

    /* from a file, and a file that is not there */
    char path[] = "/tmp/zn-hostfile-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        ZT_SETUP_FAIL("mkstemp: %s", strerror(errno));
    const char *text = "n1 slots=1\nn2 slots=1\nn2 slots=1\n";
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        ZT_SETUP_FAIL("write %s", path);
    close(fd);
    ZT_EQ_INT(zn_hostfile_read(path, &h), ZN_ECONFIG);
    char want[128];
    snprintf(want, sizeof want, "%s:3: host n2 is already on line 2", path);
    ZT_CONTAINS(zn_last_error(), want);
    unlink(path);
    ZT_EQ_INT(zn_hostfile_read(path, &h), -ENOENT);
    ZT_CONTAINS(zn_last_error(), path);
}

/* rank r's place, checked field by field */
static void expect_place(const zn_hostfile *h, int rank, int host, int lr, int ls, int slot)
{
    zn_rank_place p;
    ZT_EQ_INT(zn_hostfile_place(h, rank, &p), 0);
    ZT_EQ_INT(p.rank, rank);
    ZT_EQ_INT(p.world_size, zn_hostfile_world(h));
    ZT_EQ_INT(p.host, host);
    ZT_EQ_INT(p.local_rank, lr);
    ZT_EQ_INT(p.local_size, ls);
    ZT_EQ_INT(p.slot, slot);
}

static void test_places(void)
{
    int rc;
    /* unequal slots (DeepSpeed #3408: LOCAL_RANK as rank mod local size is
     * wrong here): 2, 1, 3 */
    zn_hostfile *h = parse("a slots=2\nb slots=1\nc slots=3\n", &rc);
    if (!h)
        ZT_SETUP_FAIL("parse: %s", zn_last_error());
    ZT_EQ_INT(zn_hostfile_world(h), 6);
    expect_place(h, 0, 0, 0, 2, 0);
    expect_place(h, 1, 0, 1, 2, 1);
    expect_place(h, 2, 1, 0, 1, 0);
    expect_place(h, 3, 2, 0, 3, 0);
    expect_place(h, 4, 2, 1, 3, 1);
    expect_place(h, 5, 2, 2, 3, 2);
    zn_rank_place p;
    ZT_EQ_INT(zn_hostfile_place(h, 6, &p), ZN_EARG);
    ZT_EQ_INT(zn_hostfile_place(h, -1, &p), ZN_EARG);
    char devs[64];
    ZT_EQ_INT(zn_hostfile_devices(h, 2, devs, sizeof devs), 0);
    ZT_EQ_STR(devs, "0,1,2");
    ZT_EQ_INT(zn_hostfile_devices(h, 2, devs, 3), ZN_EARG);
    zn_hostfile_destroy(h);

    ZT_EQ_INT(zn_hostfile_local(3, &h), 0);
    if (h) {
        ZT_EQ_STR(h->hosts[0].name, "localhost");
        expect_place(h, 2, 0, 2, 3, 2);
        zn_hostfile_destroy(h);
    }
    ZT_EQ_INT(zn_hostfile_local(0, &h), ZN_EARG);
}

static zn_hostfile *selected(const char *text, const char *inc, const char *exc, int nodes,
                             int gpus, int *rc)
{
    zn_hostfile *h = parse(text, rc);
    if (!h)
        ZT_SETUP_FAIL("parse: %s", zn_last_error());
    zn_host_select s = zn_host_select_default();
    s.include = inc;
    s.exclude = exc;
    s.num_nodes = nodes;
    s.num_gpus = gpus;
    *rc = zn_hostfile_select(h, &s);
    return h;
}

static void test_select(void)
{
    const char *four = "w0 slots=4\nw1 slots=4\nw2 slots=2\n";
    int rc;
    char devs[64];
    /* DeepSpeed's docstring: include "worker-0@worker-1:0,2" */
    zn_hostfile *h = selected(four, "w0@w1:0,2", NULL, -1, -1, &rc);
    ZT_EQ_INT(rc, 0);
    ZT_EQ_INT(h->n_hosts, 2);
    ZT_EQ_INT(zn_hostfile_world(h), 6);
    zn_hostfile_devices(h, 1, devs, sizeof devs);
    ZT_EQ_STR(devs, "0,2");
    expect_place(h, 4, 1, 0, 2, 0);
    expect_place(h, 5, 1, 1, 2, 2);
    zn_hostfile_destroy(h);
    /* the file's order, whatever the filter's */
    h = selected(four, "w2@w0:3", NULL, -1, -1, &rc);
    ZT_EQ_INT(rc, 0);
    ZT_EQ_STR(h->hosts[0].name, "w0");
    ZT_EQ_INT(h->hosts[0].n_slots, 1);
    ZT_EQ_STR(h->hosts[1].name, "w2");
    expect_place(h, 0, 0, 0, 1, 3);
    zn_hostfile_destroy(h);
    /* exclude "worker-1:0": all but that slot; a whole host goes */
    h = selected(four, NULL, "w1:0@w2", -1, -1, &rc);
    ZT_EQ_INT(rc, 0);
    ZT_EQ_INT(h->n_hosts, 2);
    zn_hostfile_devices(h, 1, devs, sizeof devs);
    ZT_EQ_STR(devs, "1,2,3");
    ZT_EQ_INT(zn_hostfile_world(h), 7);
    expect_place(h, 4, 1, 0, 3, 1);
    zn_hostfile_destroy(h);
    /* num_nodes / num_gpus */
    h = selected(four, NULL, NULL, 2, 3, &rc);
    ZT_EQ_INT(rc, 0);
    ZT_EQ_INT(h->n_hosts, 2);
    ZT_EQ_INT(zn_hostfile_world(h), 6);
    expect_place(h, 3, 1, 0, 3, 0);
    zn_hostfile_destroy(h);

    /* refusals, each naming the flag or the host, the hostfile unchanged */
    struct { const char *inc, *exc; int nodes, gpus; const char *msg; } bad[] = {
        { "w0", "w1", -1, -1, "--include and --exclude exclude each other" },
        { "w0", NULL, 1, -1, "--include excludes --num_nodes" },
        { NULL, "w0", -1, 2, "--exclude excludes --num_gpus" },
        { "w9", NULL, -1, -1, "host \"w9\" is not in hf" },
        { "w2:2", NULL, -1, -1, "host w2 has no slot 2" },
        { "w1:", NULL, -1, -1, "no slot after \"w1:\"" },
        { "w1:0,", NULL, -1, -1, "a ',' with no slot after it" },
        { "w1:a", NULL, -1, -1, "\"a\" is not a slot number" },
        { "w0@@w1", NULL, -1, -1, "an empty host name" },
        { NULL, "w0@w1@w2", -1, -1, "leaves no slot to run on" },
        { NULL, NULL, 4, -1, "--num_nodes 4, but hf has 3 hosts" },
        { NULL, NULL, -1, 3, "--num_gpus 3, but host w2 has 2 slots" },
        { NULL, NULL, 0, -1, "--num_nodes 0" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        h = selected(four, bad[i].inc, bad[i].exc, bad[i].nodes, bad[i].gpus, &rc);
        ZT_EQ_INT(rc, ZN_EARG);
        ZT_CONTAINS(zn_last_error(), bad[i].msg);
        ZT_EQ_INT(h->n_hosts, 3);
        ZT_EQ_INT(zn_hostfile_world(h), 10);
        zn_hostfile_destroy(h);
    }
}

/* Runs a rank's command line through a real /bin/sh, as the remote login
 * shell would, with an environment of PATH alone (what the rank gets comes
 * from the command line), and returns its output. Its stdin is a pipe held
 * open until it ends: at end of file the watcher would stop the rank. */
static char *run_sh(const char *cmd)
{
    char path[] = "/tmp/zn-launch-out-XXXXXX";
    int fd = mkstemp(path), in[2];
    if (fd < 0 || pipe(in) < 0)
        ZT_SETUP_FAIL("mkstemp / pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0)
        ZT_SETUP_FAIL("fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(fd, 1);
        dup2(in[0], 0);
        close(in[1]);
        char *envp[] = { "PATH=/usr/bin:/bin", NULL };
        execle("/bin/sh", "sh", "-c", cmd, (char *)NULL, envp);
        _exit(127);
    }
    close(in[0]);
    int st;
    waitpid(pid, &st, 0);
    close(in[1]);
    ZT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    off_t n = lseek(fd, 0, SEEK_END);
    char *buf = calloc(1, (size_t)n + 1);
    if (!buf || pread(fd, buf, (size_t)n, 0) != n)
        ZT_SETUP_FAIL("read %s", path);
    close(fd);
    unlink(path);
    return buf;
}

static void test_command(void)
{
    int rc;
    zn_hostfile *h = parse("10.1.0.1 slots=2\n10.1.0.2 slots=1\n", &rc);
    if (!h)
        ZT_SETUP_FAIL("parse: %s", zn_last_error());
    /* a .deepspeed_env in a home of the test's own */
    char home[] = "/tmp/zn-launch-home-XXXXXX";
    if (!mkdtemp(home))
        ZT_SETUP_FAIL("mkdtemp: %s", strerror(errno));
    char envf[256];
    snprintf(envf, sizeof envf, "%s/.deepspeed_env", home);
    FILE *f = fopen(envf, "w");
    if (!f)
        ZT_SETUP_FAIL("%s: %s", envf, strerror(errno));
    fprintf(f, "# from the home\nNCCL_SOCKET_IFNAME=eth0\nMY_VAR=it's \"quoted\" $HOME `x`\n");
    fclose(f);
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("ZINC_LOG", "warn", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("UNRELATED_VAR", "no", 1);
    const char *argv[] = { "/bin/sh", "-c",
                           "printf '%s|' \"$RANK\" \"$LOCAL_RANK\" \"$WORLD_SIZE\" "
                           "\"$LOCAL_SIZE\" \"$LOCAL_WORLD_SIZE\" \"$CROSS_RANK\" \"$CROSS_SIZE\" "
                           "\"$MASTER_ADDR\" \"$MASTER_PORT\" \"$CUDA_VISIBLE_DEVICES\" "
                           "\"$ZINC_COMM_BACKEND\" \"$NCCL_DEBUG\" \"$NCCL_SOCKET_IFNAME\" "
                           "\"$MY_VAR\" \"${UNRELATED_VAR-unset}\" \"$ZINC_LOG\" \"$PWD\" \"$@\"",
                           "argv0", "a b", "it's", "$HOME", "", "--x=\"y\"" };
    zn_cluster_config c = zn_cluster_config_default();
    c.hosts = h;
    c.argv = argv;
    c.argc = (int)(sizeof argv / sizeof *argv);
    c.cwd = "/tmp";
    c.home = home;
    c.master_port = 29611;
    char **av = NULL, *cmd = NULL;
    ZT_EQ_INT(zn_cluster_rank_command(&c, 1, &av, &cmd), 0);
    if (av && cmd) {
        /* ssh -T -o BatchMode=yes -o ConnectTimeout=10 -- HOST CMD */
        ZT_EQ_STR(av[0], "ssh");
        int n = 0;
        while (av[n])
            n++;
        ZT_CHECK(n >= 4);
        ZT_EQ_STR(av[n - 3], "--");
        ZT_EQ_STR(av[n - 2], "10.1.0.1");
        ZT_EQ_STR(av[n - 1], cmd);
        int batch = 0;
        for (int i = 0; i + 1 < n; i++)
            batch |= !strcmp(av[i], "-o") && !strcmp(av[i + 1], "BatchMode=yes");
        ZT_CHECK(batch);
        int alive = 0;   /* a host that stops answering ends its rank's ssh */
        for (int i = 0; i + 1 < n; i++)
            alive |= !strcmp(av[i], "-o") && !strcmp(av[i + 1], "ServerAliveInterval=10");
        ZT_CHECK(alive);
        /* the remote shell, played by sh here, gets every word intact */
        char *out = run_sh(cmd);
        ZT_EQ_STR(out, "1|1|3|2|2|0|2|10.1.0.1|29611|0,1|tcp|INFO|eth0|it's \"quoted\" $HOME "
                       "`x`|unset|warn|/tmp|a b|it's|$HOME||--x=\"y\"|");
        free(out);
    }
    free(av);
    free(cmd);
    /* rank 2 on the second host; a master address given; ZINC_COMM_BACKEND
     * of the launcher's environment kept; launcher_args before the host */
    setenv("ZINC_COMM_BACKEND", "mpi", 1);
    c.master_addr = "10.1.0.9";
    c.launcher_args = "-F /tmp/cfg  -p 2222";
    ZT_EQ_INT(zn_cluster_rank_command(&c, 2, &av, &cmd), 0);
    if (av && cmd) {
        ZT_EQ_STR(av[4], "-o");
        ZT_EQ_STR(av[5], "ConnectTimeout=10");
        int n = 0;
        while (av[n])
            n++;
        ZT_EQ_STR(av[n - 7], "-F");
        ZT_EQ_STR(av[n - 6], "/tmp/cfg");
        ZT_EQ_STR(av[n - 5], "-p");
        ZT_EQ_STR(av[n - 4], "2222");
        ZT_EQ_STR(av[n - 2], "10.1.0.2");
        char *out = run_sh(cmd);
        ZT_CHECK(!strncmp(out, "2|0|3|1|1|1|2|10.1.0.9|29611|0|mpi|", 35));
        free(out);
    }
    free(av);
    free(cmd);
    unsetenv("ZINC_COMM_BACKEND");
    /* a local host runs under sh, without ssh */
    zn_hostfile *l = NULL;
    ZT_EQ_INT(zn_hostfile_local(2, &l), 0);
    c.hosts = l;
    c.master_addr = NULL;
    ZT_EQ_INT(zn_cluster_rank_command(&c, 1, &av, &cmd), 0);
    if (av && cmd) {
        ZT_EQ_STR(av[0], "/bin/sh");
        ZT_EQ_STR(av[1], "-c");
        ZT_CHECK(av[3] == NULL);
        char *out = run_sh(cmd);
        ZT_CHECK(!strncmp(out, "1|1|2|2|2|0|1|127.0.0.1|29611|0,1|tcp|", 38));
        free(out);
    }
    free(av);
    free(cmd);
    /* a bad .deepspeed_env line is named */
    f = fopen(envf, "a");
    fprintf(f, "not a pair\n");
    fclose(f);
    ZT_EQ_INT(zn_cluster_rank_command(&c, 0, &av, &cmd), ZN_ECONFIG);
    snprintf(envf + strlen(envf), sizeof envf - strlen(envf), ":4:");
    ZT_CONTAINS(zn_last_error(), envf);
    ZT_CHECK(av == NULL && cmd == NULL);
    envf[strlen(envf) - 3] = 0;
    unlink(envf);
    rmdir(home);
    zn_hostfile_destroy(l);
    zn_hostfile_destroy(h);
}

/* The swap and checkpoint folders of a zinc train line, read as zinc
 * train reads its config: CONFIG (here the default text) under --set. */
static void test_train_paths(void)
{
    static const char dflt[] = "{ \"tiers\": { \"nvme\": [ { \"path\": \"swap-a\", "
                               "\"size\": \"64MiB\" } ], \"create_nvme_path\": true } }";
    zn_cluster_paths p;
    const char *a1[] = { "/opt/zinc", "train", "--steps", "3", "--set",
                         "train.checkpoint.dir=ck/run1", "--json-log", "x.jsonl" };
    ZT_EQ_INT(zn_cluster_train_paths(a1, 8, dflt, &p), 0);
    ZT_EQ_INT(p.n, 2);
    if (p.n == 2) {
        ZT_EQ_STR(p.p[0].path, "swap-a");
        ZT_CONTAINS(p.p[0].what, "swap folder");
        ZT_EQ_INT(p.p[0].must_exist, 0);   /* create_nvme_path: the run makes it */
        ZT_EQ_STR(p.p[1].path, "ck/run1");
        ZT_CONTAINS(p.p[1].what, "train.checkpoint.dir");
    }
    /* without create_nvme_path a missing swap folder is an error there */
    const char *a2[] = { "zinc", "train", "--set=tiers.create_nvme_path=false" };
    ZT_EQ_INT(zn_cluster_train_paths(a2, 3, dflt, &p), 0);
    ZT_EQ_INT(p.n, 1);
    ZT_EQ_INT(p.n >= 1 && p.p[0].must_exist, 1);
    /* not zinc train: nothing, and why */
    const char *a3[] = { "sh", "-c", "true" };
    ZT_EQ_INT(zn_cluster_train_paths(a3, 3, dflt, &p), 0);
    ZT_EQ_INT(p.n, 0);
    ZT_CONTAINS(p.note, "not zinc train");
    /* a CONFIG that is not here: not checked, said */
    const char *a4[] = { "zinc", "train", "/nonexistent/ds_config.json" };
    ZT_EQ_INT(zn_cluster_train_paths(a4, 3, dflt, &p), 0);
    ZT_EQ_INT(p.n, 0);
    ZT_CONTAINS(p.note, "/nonexistent/ds_config.json");
    /* a bad key is refused, named */
    const char *a5[] = { "zinc", "train", "--set", "tiers.no_such_key=1" };
    ZT_CHECK(zn_cluster_train_paths(a5, 4, dflt, &p) != 0);
    ZT_CONTAINS(zn_last_error(), "no_such_key");
    /* --resume DIR: every host must have DIR to read (2); without CONFIG
     * the config is the one DIR recorded, read here: a folder with no
     * checkpoint in it says so and is still checked on the hosts */
    char dir[] = "/tmp/zn-train-paths-XXXXXX";
    if (!mkdtemp(dir))
        ZT_SETUP_FAIL("mkdtemp: %s", strerror(errno));
    const char *a6[] = { "zinc", "train", "--resume", dir };
    ZT_EQ_INT(zn_cluster_train_paths(a6, 4, dflt, &p), 0);
    ZT_EQ_INT(p.n, 1);
    if (p.n == 1) {
        ZT_EQ_STR(p.p[0].path, dir);
        ZT_EQ_INT(p.p[0].must_exist, 2);
        ZT_CONTAINS(p.p[0].what, "--resume");
    }
    ZT_CONTAINS(p.note, "without CONFIG");
    ZT_CONTAINS(p.note, dir);
    /* with CONFIG (here the default) its folders too */
    const char *a7[] = { "zinc", "train", "--resume", dir, "--set",
                         "train.checkpoint.dir=ck/run2" };
    ZT_EQ_INT(zn_cluster_train_paths(a7, 6, dflt, &p), 0);
    ZT_EQ_INT(p.n, 1);   /* no CONFIG: DIR's recorded config is what counts */
    rmdir(dir);
    /* --resume without a folder: train.checkpoint.dir is read (its latest)
     * and written */
    const char *a8[] = { "zinc", "train", "--resume", "--set", "train.checkpoint.dir=ck/run2" };
    ZT_EQ_INT(zn_cluster_train_paths(a8, 5, dflt, &p), 0);
    ZT_EQ_INT(p.n, 3);
    if (p.n == 3) {
        ZT_EQ_STR(p.p[1].path, "ck/run2");
        ZT_EQ_INT(p.p[1].must_exist, 0);
        ZT_EQ_STR(p.p[2].path, "ck/run2");
        ZT_EQ_INT(p.p[2].must_exist, 2);
    }
}

/* The cluster check's verdict: 4 ranks on hosts a, a, b, c; the ring's
 * links a:0->a:1 (local), a:1->b:2, b:2->c:3, c:3->a:0 (network). */
static void test_judge(void)
{
    zn_cluster_rank r[4];
    memset(r, 0, sizeof r);
    const char *host[4] = { "a", "a", "b", "c" };
    for (int i = 0; i < 4; i++) {
        r[i].rank = i;
        snprintf(r[i].host, sizeof r[i].host, "%s", host[i]);
        r[i].nic_mbps = i == 3 ? 0 : 10000;   /* c's speed unknown */
    }
    zn_bench_link_row l[4];
    double gbs[4] = { 9.0, 1.1, 1.0, 0.3 };   /* c:3 -> a:0 is slow */
    for (int i = 0; i < 4; i++)
        l[i] = (zn_bench_link_row){ .from = i, .to = (i + 1) % 4, .bytes = 1 << 20,
                                    .t = 1e-3f, .gbs = gbs[i] };
    zn_cluster_link_verdict v[4];
    int slow_host[4];
    ZT_EQ_INT(zn_bench_cluster_judge(r, l, 4, v, slow_host), 1);
    ZT_EQ_INT(v[0].network, 0);
    ZT_EQ_INT(v[0].slow, 0);   /* a local link is not judged against the network */
    ZT_EQ_INT(v[1].network && v[2].network && v[3].network, 1);
    ZT_CHECK(v[1].nic_gbs > 1.249 && v[1].nic_gbs < 1.251);   /* 10000 Mb/s */
    ZT_CHECK(v[3].nic_gbs == 0);                              /* unknown */
    ZT_CHECK(v[3].peers_gbs > 1.049 && v[3].peers_gbs < 1.051);   /* median of 1.1, 1.0 */
    ZT_EQ_INT(v[1].slow || v[2].slow, 0);
    ZT_EQ_INT(v[3].slow, 1);
    /* c has one link out slow and its link in fine: the link is named, not the host */
    for (int i = 0; i < 4; i++)
        ZT_EQ_INT(slow_host[i], 0);
    /* below a quarter of the NIC with no peers to compare: two ranks, two hosts */
    zn_bench_link_row l2[2] = { { .from = 0, .to = 1, .gbs = 0.2 }, { .from = 1, .to = 0,
                                                                       .gbs = 0.25 } };
    zn_cluster_rank r2[2];
    memset(r2, 0, sizeof r2);
    snprintf(r2[0].host, sizeof r2[0].host, "a");
    snprintf(r2[1].host, sizeof r2[1].host, "b");
    r2[0].nic_mbps = r2[1].nic_mbps = 10000;
    ZT_EQ_INT(zn_bench_cluster_judge(r2, l2, 2, v, slow_host), 2);
    ZT_EQ_INT(slow_host[0] && slow_host[1], 1);
}

int main(void)
{
    test_train_paths();
    test_judge();
    test_parse();
    test_places();
    test_select();
    test_command();
    return zt_done();
}
