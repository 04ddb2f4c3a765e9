/* `zinc launch [flags] -- zinc train ...`: DeepSpeed's launcher flags in,
 * the hostfile read and selected, every host checked (with the train
 * command's swap and checkpoint folders), one rank per slot started over
 * ssh (src/run/launch_ssh.c does all of it); this file parses, prints and
 * returns the worst rank's status. `zinc launch --check` starts the
 * cluster check (`zinc bench cluster`) on every slot instead. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "zn_build_config.h"
#include "zinc/launch.h"

/* DeepSpeed's default hostfile (DLTS_HOSTFILE, deepspeed/launcher/runner.py) */
#define DEFAULT_HOSTFILE "/job/hostfile"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: zinc launch [--hostfile FILE] [--include S | --exclude S] [--num_nodes N]\n"
        "                   [--num_gpus N] [--master_addr A] [--master_port P]\n"
        "                   [--launcher ssh|pdsh|openmpi] [--launcher_args \"...\"]\n"
        "                   [--check_timeout S] [--fail_grace S] [--] COMMAND [ARGS...]\n"
        "       zinc launch --check [--check_args \"...\"] [same flags] [-- zinc train ...]\n"
        "\n"
        "Starts COMMAND (zinc train ...) once per slot of a DeepSpeed hostfile\n"
        "(`HOST slots=N` lines), over ssh, with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE,\n"
        "MASTER_ADDR, MASTER_PORT, CUDA_VISIBLE_DEVICES and ZINC_COMM_BACKEND=tcp set.\n"
        "Every host is checked first (ssh -o BatchMode=yes, the folder, the command).\n"
        "\n"
        "  -H, --hostfile FILE  the hosts (default %s; without it, localhost)\n"
        "  -i, --include S      only these hosts / slots: host1:0,1@host2\n"
        "  -e, --exclude S      all but these (excludes --include, --num_nodes, --num_gpus)\n"
        "  --num_nodes N        the first N hosts\n"
        "  --num_gpus N         slots 0..N-1 of each host (localhost: N slots)\n"
        "  --master_addr A      where rank 0 listens (default: the first host)\n"
        "  --master_port P      its port (default 29500)\n"
        "  --launcher L         how the ranks are started: ssh (default), pdsh, or openmpi\n"
        "                       (Open MPI's mpirun, its own ssh and daemons, the MPI\n"
        "                       communicator; mpirun also works)\n"
        "  --launcher_args S    options for ssh or pdsh, split on blanks (\"-F cfg\"); with\n"
        "                       openmpi, for the ssh mpirun starts its daemons with\n"
        "  --check_timeout S    ssh ConnectTimeout of the check and the ranks (default 10)\n"
        "  --fail_grace S       after a rank fails, seconds before the rest get SIGTERM\n"
        "                       (default 60)\n"
        "  --check              the cluster check instead of COMMAND: one rank per slot\n"
        "                       runs zinc bench cluster (every rank's place, a broadcast,\n"
        "                       each link alone, all-reduce busbw against the link), all\n"
        "                       data verified, slow links named; a zinc train COMMAND\n"
        "                       given too has its folders checked, and is not started\n"
        "  --check_args S       options for zinc bench cluster (\"--sizes 1M,64M\")\n"
        "\n"
        "Output lines come prefixed [host:rank]. SIGINT/SIGTERM are forwarded to every rank\n"
        "(a third one kills them). Exit status: the worst rank's. Hosts named localhost or\n"
        "127.0.0.1 run without ssh. docs/launch.md has the details.\n", DEFAULT_HOSTFILE);
}

static int parse_int(const char *flag, const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "zinc: error: %s %s: want a whole number from %d to %d\n", flag, s, lo,
                hi);
        return 2;
    }
    *out = (int)v;
    return 0;
}

static int parse_seconds(const char *flag, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v > 0) || v > 86400) {
        fprintf(stderr, "zinc: error: %s %s: want seconds, above 0\n", flag, s);
        return 2;
    }
    *out = v;
    return 0;
}

static void print_note(void *arg, const char *msg)
{
    (void)arg;
    fprintf(stderr, "zinc launch: %s\n", msg);
    fflush(stderr);
}

/* "--flag VALUE" or "--flag=VALUE"; returns the value (NULL: not this flag)
 * and advances *i; *missing when the value is absent. */
static const char *flag_value(int argc, char **argv, int *i, const char *lng, const char *shrt,
                              int *missing)
{
    const char *a = argv[*i];
    size_t l = strlen(lng);
    if (!strncmp(a, lng, l) && a[l] == '=')
        return a + l + 1;
    if (strcmp(a, lng) && (!shrt || strcmp(a, shrt)))
        return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

/* The folders of a zinc train command (swap, checkpoint) into cc for the
 * check. Returns 0 or the exit code (the config is wrong). */
static int train_folders(zn_cluster_config *cc, zn_cluster_paths *paths)
{
    int rc = zn_cluster_train_paths(cc->argv, cc->argc, zn_cli_default_config(), paths);
    if (rc)
        return zn_cli_fail(rc, NULL);
    if (paths->n) {
        cc->paths = paths->p;
        cc->n_paths = paths->n;
    } else if (cc->argc >= 2 && !strcmp(cc->argv[1], "train")) {
        fprintf(stderr, "zinc launch: the run's folders are not checked: %s\n", paths->note);
    }
    return 0;
}

/* The command every slot runs for --check: this zinc (the train command's
 * when one is given) `bench cluster` with --check_args split on blanks.
 * *words is one allocation; returns 0 or the exit code. */
static int check_argv(const zn_cluster_config *cc, const char *check_args, char ***words,
                      int *n)
{
    char self[4096];
    const char *zinc = "zinc";
    const char *b = cc->argc > 0 ? strrchr(cc->argv[0], '/') : NULL;
    if (cc->argc > 0 && !strcmp(b ? b + 1 : cc->argv[0], "zinc")) {
        zinc = cc->argv[0];
    } else {
        ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
        if (l > 0) {
            self[l] = 0;
            zinc = self;
        }
    }
    size_t len = strlen(zinc) + 1 + (check_args ? strlen(check_args) + 1 : 0);
    int max = 4 + (check_args ? (int)strlen(check_args) / 2 + 1 : 0);
    char **w = malloc(sizeof *w * (size_t)max + len);
    if (!w)
        return zn_cli_fail(-ENOMEM, "launch");
    char *s = (char *)(w + max);
    strcpy(s, zinc);
    int k = 0;
    w[k++] = s;
    w[k++] = "bench";
    w[k++] = "cluster";
    s += strlen(s) + 1;
    if (check_args) {
        strcpy(s, check_args);
        char *save = NULL;
        for (char *t = strtok_r(s, " \t\n", &save); t && k < max - 1;
             t = strtok_r(NULL, " \t\n", &save))
            w[k++] = t;
    }
    w[k] = NULL;
    *words = w;
    *n = k;
    return 0;
}

/* The check of every host, then every rank run (the command, or the
 * cluster check's); returns the exit code. */
static int run_ranks(const zn_cluster_config *cc, const zn_hostfile *hf, const char *hostfile,
                     int world, int check)
{
    int rc;
    const char *maddr;
    if ((rc = zn_cluster_master_addr(cc, &maddr))) {
        zn_cli_fail(rc, NULL);
        return 2;
    }

    fprintf(stderr, "zinc launch: %d rank%s on %d host%s (%s), rank 0 at %s:%d:\n", world,
            world == 1 ? "" : "s", hf->n_hosts, hf->n_hosts == 1 ? "" : "s",
            hostfile ? hostfile : "no hostfile: localhost", maddr, cc->master_port);
    for (int h = 0, r = 0; h < hf->n_hosts; h++) {
        char devs[4096];
        if (zn_hostfile_devices(hf, h, devs, sizeof devs))
            snprintf(devs, sizeof devs, "(%d slots)", hf->hosts[h].n_slots);
        fprintf(stderr, "  %-24s ranks %d-%d, CUDA_VISIBLE_DEVICES=%s%s\n", hf->hosts[h].name,
                r, r + hf->hosts[h].n_slots - 1, devs,
                !strcmp(hf->hosts[h].name, "localhost") || !strcmp(hf->hosts[h].name,
                                                                    "127.0.0.1")
                    ? " (here, without ssh)" : "");
        r += hf->hosts[h].n_slots;
    }
    fflush(stderr);

    double t0 = zn_now_s();
    if ((rc = zn_cluster_check(cc)))
        return zn_cli_fail(rc, NULL);
    fprintf(stderr, "zinc launch: every host answers (the folder, %s%s) in %.1f s; starting %d "
            "rank%s%s\n", cc->argv[0], cc->n_paths ? ", the run's folders writable" : "",
            zn_now_s() - t0, world, world == 1 ? "" : "s", check ? " of the cluster check" : "");
    fflush(stderr);
    int *status = calloc((size_t)world, sizeof *status);
    if (!status)
        return zn_cli_fail(-ENOMEM, "launch");
    zn_cluster_result res = { 0, -1, -1, 0, status };
    rc = zn_cluster_run(cc, &res);
    if (rc)
        zn_cli_fail(rc, "launch");
    int code = res.exit_code;
    if (code) {
        zn_rank_place pl;
        int failed = 0;
        for (int r = 0; r < world; r++)
            failed += status[r] != 0;
        if (res.worst_rank < 0)  /* mpirun: it knows the ranks' statuses, zinc does not */
            fprintf(stderr, "zinc launch: mpirun exited %d (a rank's status, or mpirun's own "
                            "failure: its lines above name the rank)\n", code);
        else if (zn_hostfile_place(hf, res.worst_rank, &pl) == 0)
            fprintf(stderr, "zinc launch: %d of %d rank%s failed; the worst, rank %d on %s, "
                            "exited %d%s\n", failed, world, world == 1 ? "" : "s",
                    res.worst_rank, hf->hosts[pl.host].name, code,
                    code == 255 ? " (ssh's own failure, or the rank killed by a signal "
                                  "there)" : "");
        if (res.first_failed >= 0 && res.first_failed != res.worst_rank && !res.signal &&
            zn_hostfile_place(hf, res.first_failed, &pl) == 0)
            fprintf(stderr, "zinc launch: the first to fail was rank %d on %s (exit %d)\n",
                    res.first_failed, hf->hosts[pl.host].name, status[res.first_failed]);
    } else if (rc) {
        code = 1;
    } else if (check) {
        fprintf(stderr, "zinc launch: the cluster check passed: %d rank%s on %d host%s "
                "answered, every collective and link verified\n", world, world == 1 ? "" : "s",
                hf->n_hosts, hf->n_hosts == 1 ? "" : "s");
    }
    free(status);
    return code;
}

int zn_cmd_launch(int argc, char **argv)
{
    const char *hostfile = NULL, *master_addr = NULL, *launcher = "ssh", *check_args = NULL;
    int check = 0;
    zn_host_select sel = zn_host_select_default();
    zn_cluster_config cc = zn_cluster_config_default();
    int i = 1, rc;
    for (; i < argc; i++) {
        const char *a = argv[i], *v;
        int missing = 0;
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (a[0] != '-')
            break;   /* the command starts here */
        if (!strcmp(a, "--check")) {
            check = 1;
            continue;
        }
        if ((v = flag_value(argc, argv, &i, "--hostfile", "-H", &missing)))
            hostfile = v;
        else if (!missing && (v = flag_value(argc, argv, &i, "--include", "-i", &missing)))
            sel.include = v;
        else if (!missing && (v = flag_value(argc, argv, &i, "--exclude", "-e", &missing)))
            sel.exclude = v;
        else if (!missing && (v = flag_value(argc, argv, &i, "--num_nodes", NULL, &missing))) {
            if ((rc = parse_int("--num_nodes", v, 1, 1 << 20, &sel.num_nodes)))
                return rc;
        } else if (!missing && (v = flag_value(argc, argv, &i, "--num_gpus", NULL, &missing))) {
            if ((rc = parse_int("--num_gpus", v, 1, ZN_HOST_SLOTS_MAX, &sel.num_gpus)))
                return rc;
        } else if (!missing && (v = flag_value(argc, argv, &i, "--master_addr", NULL, &missing)))
            master_addr = v;
        else if (!missing && (v = flag_value(argc, argv, &i, "--master_port", NULL, &missing))) {
            if ((rc = parse_int("--master_port", v, 1, 65535, &cc.master_port)))
                return rc;
        } else if (!missing && (v = flag_value(argc, argv, &i, "--launcher", NULL, &missing)))
            launcher = v;
        else if (!missing &&
                 (v = flag_value(argc, argv, &i, "--launcher_args", NULL, &missing)))
            cc.launcher_args = v;
        else if (!missing &&
                 (v = flag_value(argc, argv, &i, "--check_timeout", NULL, &missing))) {
            if ((rc = parse_seconds("--check_timeout", v, &cc.check_timeout_s)))
                return rc;
        } else if (!missing && (v = flag_value(argc, argv, &i, "--fail_grace", NULL, &missing))) {
            if ((rc = parse_seconds("--fail_grace", v, &cc.fail_grace_s)))
                return rc;
        } else if (!missing && (v = flag_value(argc, argv, &i, "--check_args", NULL, &missing))) {
            check_args = v;
        } else {
            if (missing)
                fprintf(stderr, "zinc: error: %s needs a value\n", a);
            else
                fprintf(stderr, "zinc: error: launch: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (check_args && !check) {
        fprintf(stderr, "zinc: error: --check_args goes with --check\n");
        return 2;
    }
    if (i >= argc && !check) {
        fprintf(stderr, "zinc: error: launch: no command to run (zinc launch [flags] -- zinc "
                        "train ...)\n");
        usage(stderr);
        return 2;
    }
    if (!strcmp(launcher, "ssh"))
        cc.remote = ZN_REMOTE_SSH;
    else if (!strcmp(launcher, "pdsh"))
        cc.remote = ZN_REMOTE_PDSH;
    else if (!strcmp(launcher, "openmpi") || !strcmp(launcher, "mpirun")) {
#if ZN_HAVE_MPI
        cc.remote = ZN_REMOTE_MPIRUN;
        cc.job_secret = 0;  /* no TCP rendezvous: mpirun's own channels */
#else
        fprintf(stderr, "zinc: error: --launcher %s: this zinc is built without MPI (Open "
                        "MPI's development files at build time: libopenmpi-dev)\n", launcher);
        return 2;
#endif
    } else {
        fprintf(stderr, "zinc: error: --launcher %s: zinc launches with ssh, pdsh or openmpi "
                        "(Open MPI's mpirun); DeepSpeed's mvapich, mpich, impi and slurm "
                        "launchers are not built\n", launcher);
        return 2;
    }

    zn_hostfile *hf = NULL;
    if (!hostfile && access(DEFAULT_HOSTFILE, F_OK) == 0)
        hostfile = DEFAULT_HOSTFILE;
    if (hostfile) {
        rc = zn_hostfile_read(hostfile, &hf);
    } else {
        if (sel.num_nodes > 1) {
            fprintf(stderr, "zinc: error: --num_nodes %d without a hostfile (only localhost "
                            "is known)\n", sel.num_nodes);
            return 2;
        }
        rc = zn_hostfile_local(sel.num_gpus > 0 ? sel.num_gpus : 1, &hf);
    }
    if (rc)
        return zn_cli_fail(rc, NULL);
    if ((rc = zn_hostfile_select(hf, &sel))) {
        zn_hostfile_destroy(hf);
        return rc == ZN_EARG ? (zn_cli_fail(rc, NULL), 2) : zn_cli_fail(rc, NULL);
    }
    int world = zn_hostfile_world(hf);
    cc.hosts = hf;
    cc.argv = (const char *const *)(argv + i);
    cc.argc = argc - i;
    cc.master_addr = master_addr;
    cc.note = print_note;
    zn_cluster_paths *paths = malloc(sizeof *paths);
    char **check_words = NULL;
    int n_words = 0;
    if (!paths) {
        zn_hostfile_destroy(hf);
        return zn_cli_fail(-ENOMEM, "launch");
    }
    if ((rc = train_folders(&cc, paths)) ||
        (check && (rc = check_argv(&cc, check_args, &check_words, &n_words)))) {
        free(paths);
        zn_hostfile_destroy(hf);
        return rc;
    }
    if (check) {
        /* the train command's folders are checked; the check runs in its place */
        cc.argv = (const char *const *)check_words;
        cc.argc = n_words;
    }
    rc = run_ranks(&cc, hf, hostfile, world, check);
    free(check_words);
    free(paths);
    zn_hostfile_destroy(hf);
    return rc;
}
