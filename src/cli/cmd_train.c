/* `zinc train [CONFIG]`: trains the decoder a config describes on its token
 * data (or the built-in synthetic set) with the offload schedule, printing a
 * progress line per log_every steps (and at least once a second), then the
 * per-tier report and the step-time breakdown. Without CONFIG it runs the
 * embedded default, examples/tiny.json (built into the binary). */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "zinc/run.h"
#include "cli/tiny_json.h"
#include "zinc/ckpt.h"
#include "zinc/nvme.h"
#include "zinc/tokens.h"
#include "zinc/train.h"
#include "zinc/zinc.h"

const char *zn_cli_default_config(void)
{
    return zn_tiny_json;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: zinc train [CONFIG] [--model DIR] [--data FILE] [--set KEY=VALUE]... [--steps N] [--trace FILE]\n"
        "                  [--json-log FILE] [--resume [DIR|latest]] [--print-default]\n"
        "\n"
        "Trains the model of CONFIG (a DeepSpeed-style JSON file) with its training state\n"
        "placed in GPU / pinned CPU / NVMe tiers as the config says. Without CONFIG it\n"
        "runs the embedded default (examples/tiny.json: a 3.1M-parameter Llama on the\n"
        "built-in synthetic data, Adam state in ./zinc-swap).\n"
        "  --model DIR       the HF model folder to fine-tune (= --set model.path=DIR):\n"
        "                    its config.json and its safetensors weights, loaded into\n"
        "                    the tiers (model.init=random: its shape, seeded weights)\n"
        "  --data FILE       the token file to train on (= --set data.path=FILE, made by\n"
        "                    zinc prepare); \"synthetic\": the built-in set, which a\n"
        "                    model from --model only trains on when asked to\n"
        "  --set KEY=VALUE   override a config key (e.g. tiers.gpu=24GiB)\n"
        "  --steps N         optimizer steps in all (default: train.steps); a resumed\n"
        "                    run continues up to N\n"
        "  --trace FILE      write a Chrome/Perfetto trace (one track per resource)\n"
        "  --json-log FILE   one JSON line per step\n"
        "  --resume [DIR|latest]\n"
        "                    continue from a checkpoint: a step folder, a checkpoint\n"
        "                    folder (its 'latest'), or 'latest' / nothing for\n"
        "                    train.checkpoint.dir's latest. Without CONFIG the config\n"
        "                    recorded in the checkpoint is used. The placement (tiers,\n"
        "                    offload devices) may differ from the saving run's.\n"
        "  --print-default   print the embedded default config and exit\n"
        "Checkpoints: train.checkpoint.dir (saved every train.checkpoint.every steps and\n"
        "at the end), keep_last, continue_on_error (docs/checkpoints.md).\n");
}

static void fmt_eta(double s, char *buf, size_t n)
{
    if (!(s >= 0) || s > 1e7) {
        snprintf(buf, n, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

/* ---- test hooks (environment): ZINC_CKPT_KILL=POINT[:N[:SIG]] sends SIGKILL
 * (or SIG: TERM, INT or USR1, a stop signal arriving in the middle of a
 * save) to this process at the N-th time a save reaches POINT
 * (zn_ckpt_point_fn);
 * ZINC_CKPT_FAULT=N[:ENOSPC|EIO] fails the N-th block write of the
 * checkpoint engine(s) of this process. ---------------------------------------*/
typedef struct {
    char point[32];
    long nth, seen;
    int sig;
    long fault_nth;
    int fault_res;
    _Atomic long fault_seen;
} ckpt_hooks;

static void hook_point(void *user, const char *where)
{
    ckpt_hooks *h = user;
    if (h->point[0] && !strcmp(where, h->point) && ++h->seen == h->nth) {
        fflush(NULL);
        raise(h->sig);
    }
}

static int hook_fault(void *user, const zn_aio_fault_site *site)
{
    ckpt_hooks *h = user;
    if (!site->is_write)
        return site->res;
    return atomic_fetch_add(&h->fault_seen, 1) + 1 == h->fault_nth ? h->fault_res : site->res;
}

static void hooks_from_env(ckpt_hooks *h, zn_ckpt_save_options *so)
{
    memset(h, 0, sizeof *h);
    const char *k = getenv("ZINC_CKPT_KILL"), *f = getenv("ZINC_CKPT_FAULT");
    if (k && *k) {
        snprintf(h->point, sizeof h->point, "%s", k);
        char *c = strchr(h->point, ':');
        h->nth = 1;
        h->sig = SIGKILL;
        if (c) {
            *c = '\0';
            h->nth = strtol(c + 1, &c, 10);
            if (*c == ':')
                h->sig = !strcmp(c + 1, "TERM") ? SIGTERM : !strcmp(c + 1, "INT") ? SIGINT
                         : !strcmp(c + 1, "USR1") ? SIGUSR1 : SIGKILL;
        }
        so->point = hook_point;
        so->point_user = h;
    }
    if (f && *f) {
        char *end;
        h->fault_nth = strtol(f, &end, 10);
        h->fault_res = *end == ':' && !strcmp(end + 1, "EIO") ? -EIO : -ENOSPC;
        so->fault_hook = hook_fault;
        so->fault_user = h;
    }
}

/* What the checkpoint records beside the trainer: where the data loader is
 * (its step index; the shuffle is a function of (seed, epoch)) and what
 * data it reads. */
/* 8-bit moments: the trained tensors bitsandbytes (under 4096 elements)
 * or torchao (also those not whole blocks of 256) keep in fp32 states, as
 * zinc does (the trainer's fp32 blocks, zn_moments.f32): said, with what
 * they hold. */
static void say_small_tensors(const zn_model_dims *d, const zn_config *cfg)
{
    if (zn_config_moment_bytes(cfg->train.optim) != 1)
        return;
    bool ao = zn_config_q8_scheme(cfg->train.optim) != 0;
    uint64_t tensors = 0, small = 0, elems = 0;
    for (int b = 0; b <= d->n_layers + 1; b++)
        for (int i = 0; i < zn_model_block_nparams(d, b); i++) {
            zn_param_info pi;
            if (zn_model_block_param(d, b, i, &pi) || pi.owner_block >= 0 ||
                (d->lora.r > 0 && !pi.lora))
                continue;   /* a tied head (the embedding's), a frozen base */
            tensors++;
            if (zn_q8_keeps_f32((uint64_t)pi.numel, ao ? ZN_Q8_TORCHAO : ZN_Q8_BNB)) {
                small++;
                elems += (uint64_t)pi.numel;
            }
        }
    if (small)
        printf("  moments  int8: %llu of %llu trained tensors (%llu parameters) are under %s; "
               "%s and zinc keep their states in fp32\n",
               (unsigned long long)small, (unsigned long long)tensors,
               (unsigned long long)elems,
               ao ? "4096 elements or not whole blocks of 256" : "4096 elements",
               ao ? "torchao" : "bitsandbytes");
}

static char *client_state(const zn_run *ts, const zn_config *cfg, int64_t step)
{
    json_t *j = json_pack("{sIsIsssIsI}", "data_step", (json_int_t)step,
                          "data_seed", (json_int_t)cfg->data.seed, "data",
                          zn_tokens_name(ts->data), "data_tokens",
                          (json_int_t)zn_tokens_count(ts->data), "model_seed",
                          (json_int_t)cfg->model.seed);
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return s;
}

/* Saves; returns 0, or the failure (already reported) when the run must
 * stop. With continue_on_error a failure only warns. */
static int save(zn_run *ts, const zn_config *cfg, const char *cfg_text,
                zn_ckpt_save_options *so, int64_t step)
{
    char *client = client_state(ts, cfg, step);
    so->client_json = client;
    so->config_text = cfg_text;
    so->dims = &ts->dims;
    char where[4200];
    double t0 = zn_now_s();
    int rc = client ? zn_ckpt_save(ts->tr, so, where, sizeof where)
                    : zn_set_error(-ENOMEM, "out of memory");
    free(client);
    so->client_json = NULL;
    if (!rc) {
        printf("checkpoint %s (%.2f s)\n", where, zn_now_s() - t0);
        fflush(stdout);
        return 0;
    }
    if (cfg->train.checkpoint.continue_on_error) {
        fprintf(stderr, "zinc: warning: checkpoint at step %lld failed, training goes on "
                "(train.checkpoint.continue_on_error); the previous checkpoint is intact: %s\n",
                (long long)step, zn_last_error());
        return 0;
    }
    zn_cli_fail(rc, "checkpoint (the previous one is intact; set "
                "train.checkpoint.continue_on_error to train on)");
    return rc;
}

static int resume(zn_run *ts, zn_ckpt *ck, const zn_config *cfg)
{
    int rc = zn_ckpt_check_dims(ck, &ts->dims);
    if (rc)
        return rc;
    json_error_t je;
    json_t *c = json_loads(zn_ckpt_client_json(ck), 0, &je);
    json_int_t tokens = 0, seed = -1;
    const char *data = NULL;
    if (!c || json_unpack(c, "{sIss}", "data_tokens", &tokens, "data", &data) ||
        json_unpack(c, "{sI}", "data_seed", &seed)) {
        json_decref(c);
        return zn_set_error(ZN_ECORRUPT, "checkpoint %s: no data-loader state", zn_ckpt_path(ck));
    }
    if (ZN_DATA_SYNTHETIC(&cfg->data) && !strcmp(data, "synthetic") &&
        (uint64_t)tokens != zn_tokens_count(ts->data))
        rc = zn_run_open_data(ts, cfg, (uint64_t)tokens);
    else if (strcmp(data, zn_tokens_name(ts->data)) || (uint64_t)tokens != zn_tokens_count(ts->data))
        zn_warn("resuming on other data (%s, %lld tokens; the checkpoint was trained on %s, "
                "%lld tokens)", zn_tokens_name(ts->data), (long long)zn_tokens_count(ts->data),
                data, (long long)tokens);
    if (!rc && (uint64_t)seed != cfg->data.seed)
        zn_warn("resuming with data.seed %llu (the checkpoint used %lld): another shuffle",
                (unsigned long long)cfg->data.seed, (long long)seed);
    json_decref(c);
    if (!rc)
        rc = zn_ckpt_load(ck, ts->tr);
    return rc;
}

/* ---- stopping on a signal ---------------------------------------------------
 * SIGTERM (a spot instance's notice), SIGINT (Ctrl-C) and SIGUSR1: the
 * step in progress finishes (a step cannot be abandoned halfway without
 * losing its optimizer update's consistency), the ranks agree to stop
 * after the same step, a checkpoint is written when train.checkpoint.dir
 * is set, the swap files go, and zinc exits with 128 + the signal's number
 * (143 for SIGTERM, 130 for SIGINT, 138 for SIGUSR1). A second signal ends
 * the run at once: the swap files are unlinked in the handler, then the
 * signal is raised again with its default action. */
static volatile sig_atomic_t g_stop_sig;
static struct timespec g_stop_ts;

static void on_stop_signal(int sig)
{
    if (g_stop_sig) {
        int saved = errno;
        zn_swap_remove_all_now();
        signal(sig, SIG_DFL);
        raise(sig);
        errno = saved;
        return;
    }
    g_stop_sig = sig;
    clock_gettime(CLOCK_MONOTONIC, &g_stop_ts);
    static const char msg[] = "\nzinc: signal received: finishing the step in progress, then "
                              "saving and cleaning up (a second signal stops at once)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
}

static void install_stop_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
}

/* What a signal would cost this run, said after its first step: that
 * step's time (the step in progress ends first), then the checkpoint's
 * write. A save of under 1 GiB takes seconds on any disk, so only larger
 * ones are measured (the disks, once per file system, cached with the cost
 * model's figures). */
#define ZN_STOP_NOTICE_S 30.0   /* the shortest spot notice (120 s on some clouds) */
static void stop_notice(zn_run *ts, const zn_config *cfg, const zn_plan *plan, double step_s)
{
    uint64_t per_rank = 0;
    for (int t = 0; t < ZN_TIER_COUNT; t++)
        per_rank += plan->bytes[ZN_STATE_MASTER][t] + plan->bytes[ZN_STATE_ADAM_M][t] +
                    plan->bytes[ZN_STATE_ADAM_V][t];
    if (per_rank * (uint64_t)(ts->local_size > 0 ? ts->local_size : 1) < ((uint64_t)1 << 30))
        return;
    zn_stop_estimate e;
    int rc = zn_run_stop_estimate(cfg, plan, ts->local_size, step_s, &e, stdout);
    if (rc) {
        fprintf(stderr, "zinc: warning: no estimate of the time a stop on SIGTERM takes: %s\n",
                zn_last_error());
        return;
    }
    char b1[32], b2[32];
    printf("on SIGTERM the step in progress ends (the first took %.1f s), then %s is saved (", e.step_s,
           zn_format_size(e.save_bytes, b1, sizeof b1));
    if (e.read_bytes)
        printf("%s read from NVMe at %.2f GB/s, ", zn_format_size(e.read_bytes, b2, sizeof b2),
               e.read_bps / 1e9);
    printf("written at %.2f GB/s under %s, measured): about %.0f s in all\n", e.write_bps / 1e9,
           e.disk, e.total_s);
    fflush(stdout);
    if (e.total_s > ZN_STOP_NOTICE_S)
        fprintf(stderr, "zinc: warning: a stop on SIGTERM takes about %.0f s, longer than a %.0f s "
                "spot notice (some clouds give 120 s): if the machine goes first, the run resumes "
                "from the last periodic save%s\n", e.total_s, ZN_STOP_NOTICE_S,
                cfg->train.checkpoint.every > 0 ? " (train.checkpoint.every)"
                : "; none is set: set train.checkpoint.every");
}

/* DeepSpeed's monitor folder: output_path/job_name, or job_name. */
static void monitor_dir(char *out, size_t n, const char *output_path, const char *job)
{
    if (output_path[0])
        snprintf(out, n, "%s/%s", output_path, job);
    else
        snprintf(out, n, "%s", job);
}

static double since_signal_s(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - g_stop_ts.tv_sec) + (double)(now.tv_nsec - g_stop_ts.tv_nsec) * 1e-9;
}

/* Set when this rank stops for another rank's signal: its own clock of the
 * stop starts when it learns of it (g_stop_ts is unset without a signal). */
static bool g_stop_by_peer;

/* Whether every rank stops after this step: a rank that saw the signal
 * tells the others (one float's all-reduce per step, only with ranks). */
static int ranks_stop(zn_run *ts)
{
    float mine = (float)g_stop_sig, all = mine;
    if (ts->world > 1 && zn_comm_allreduce(ts->comm, &mine, &all, 1, ZN_DTYPE_F32, ZN_REDUCE_MAX))
        return g_stop_sig;
    if (all && !mine && !g_stop_sig) {
        g_stop_by_peer = true;
        clock_gettime(CLOCK_MONOTONIC, &g_stop_ts);
    }
    return (int)all;
}

int zn_cmd_train(int argc, char **argv)
{
    const char *sets[64];
    int n_sets;
    argc = zn_cli_take_sets(argc, argv, sets, 64, &n_sets);
    if (argc < 0)
        return 2;
    const char *path = NULL, *trace_path = NULL, *json_path = NULL, *resume_arg = NULL;
    int resuming = 0;
    long long steps_opt = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--print-default")) {
            fputs(zn_tiny_json, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            char *end;
            steps_opt = strtoll(argv[++i], &end, 10);
            /* a --set, so that the effective config says where it came from */
            static char steps_set[48];
            snprintf(steps_set, sizeof steps_set, "train.steps=%lld", steps_opt);
            if (n_sets < 64 && !*end && steps_opt >= 0)
                sets[n_sets++] = steps_set;
            if (*end || steps_opt < 0) {
                fprintf(stderr, "zinc: error: --steps %s: expected a step count >= 0\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            if (zn_cli_model_set(argv[++i], sets, 64, &n_sets))
                return 2;
        } else if (!strcmp(argv[i], "--data") && i + 1 < argc) {
            if (zn_cli_data_set(argv[++i], sets, 64, &n_sets))
                return 2;
        } else if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
            trace_path = argv[++i];
        } else if (!strcmp(argv[i], "--json-log") && i + 1 < argc) {
            json_path = argv[++i];
        } else if (!strcmp(argv[i], "--resume")) {
            resuming = 1;
            /* an optional value: "latest" or a folder (a file is CONFIG) */
            struct stat st;
            if (i + 1 < argc && (!strcmp(argv[i + 1], "latest") ||
                                 (stat(argv[i + 1], &st) == 0 && S_ISDIR(st.st_mode))))
                resume_arg = argv[++i];
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "zinc: error: train: unknown option or missing value '%s'\n",
                    argv[i]);
            usage(stderr);
            return 2;
        } else if (!path) {
            path = argv[i];
        } else {
            fprintf(stderr, "zinc: error: train: one CONFIG only ('%s' is extra)\n", argv[i]);
            return 2;
        }
    }

    zn_config cfg;
    int rc;
    zn_ckpt *ck = NULL;
    /* a LLaMA-Factory recipe in place of CONFIG: its data prepared first */
    zn_recipe *recipe = NULL;
    char recipe_log[4300];
    if (path && zn_recipe_is_path(path)) {
        if ((rc = zn_cli_recipe_open(path, &recipe, recipe_log, sizeof recipe_log)))
            return rc;
        if (!json_path)
            json_path = recipe_log;
    }
    /* a checkpoint is verified before it is loaded; a damaged latest falls
     * back to the newest one that verifies, saying so */
    char fallback[2048] = "";
    if (resuming && resume_arg && strcmp(resume_arg, "latest") &&
        (rc = zn_ckpt_open_good(&ck, resume_arg, fallback, sizeof fallback))) {
        free(recipe);
        return zn_cli_fail(rc, "--resume");
    }
    if (recipe) {
        /* the recipe's settings, then the command line's (which win) */
        const char *all[ZN_RECIPE_MAX_SETS + 64];
        int na = 0;
        for (int i = 0; i < recipe->n_sets; i++)
            all[na++] = recipe->sets[i];
        for (int i = 0; i < n_sets; i++)
            all[na++] = sets[i];
        rc = recipe->ds_config[0] ? zn_config_load(&cfg, recipe->ds_config, all, na)
                                  : zn_config_parse(&cfg, "{}", recipe->path, all, na);
    } else if (path) {
        rc = zn_config_load(&cfg, path, sets, n_sets);
    } else if (ck) {
        const char *text = zn_ckpt_config_text(ck);
        char name[4300];
        snprintf(name, sizeof name, "(config recorded in %s)", zn_ckpt_path(ck));
        rc = text ? zn_config_parse(&cfg, text, name, sets, n_sets)
                  : zn_set_error(ZN_ECONFIG, "checkpoint %s records no config: give CONFIG",
                                 zn_ckpt_path(ck));
    } else {
        rc = zn_config_parse(&cfg, zn_tiny_json, "(embedded examples/tiny.json)", sets, n_sets);
    }
    if (rc) {
        zn_ckpt_close(ck);
        free(recipe);
        return zn_cli_fail(rc, NULL);
    }
    if (steps_opt >= 0)
        cfg.train.steps = steps_opt;
    const zn_config_checkpoint *cc = &cfg.train.checkpoint;
    if (resuming && !ck) {
        if (!cc->dir[0]) {
            fprintf(stderr, "zinc: error: --resume without a folder needs "
                            "train.checkpoint.dir\n");
            free(recipe);
            return 2;
        }
        if ((rc = zn_ckpt_open_good(&ck, cc->dir, fallback, sizeof fallback))) {
            free(recipe);
            return zn_cli_fail(rc, "--resume");
        }
    }
    if (fallback[0])
        fprintf(stderr, "zinc: warning: %s\n", fallback);
    /* recorded resolved, so that it parses back as it is */
    zn_launch_info li;
    if (!(rc = zn_launch_detect(&li)) && ck && zn_ckpt_world(ck) != li.world_size &&
        !cfg.train_batch_size) {
        /* the global batch the checkpoint trained with, as its run resolved it */
        json_t *rec = zn_ckpt_config_text(ck) ? json_loads(zn_ckpt_config_text(ck), 0, NULL) : NULL;
        json_t *tb = json_object_get(rec, "train_batch_size");
        if (json_is_integer(tb))
            cfg.train_batch_size = (int64_t)json_integer_value(tb);
        json_t *mb = json_object_get(rec, "train_micro_batch_size_per_gpu");
        if (!cfg.train_micro_batch_size_per_gpu && json_is_integer(mb))
            cfg.train_micro_batch_size_per_gpu = (int64_t)json_integer_value(mb);
        json_decref(rec);
    }
    if (!rc && ck && zn_ckpt_world(ck) != li.world_size &&
        cfg.train_batch_size > 0 && cfg.train_micro_batch_size_per_gpu > 0) {
        /* resumed on another number of ranks: the global batch stays, the
         * accumulation follows (an error when it cannot be kept exactly) */
        if (cfg.train_batch_size % (cfg.train_micro_batch_size_per_gpu * li.world_size))
            rc = zn_set_error(ZN_ECONFIG, "--resume: the checkpoint's global batch %lld "
                              "(saved by %d rank(s)) is not micro-batch %lld x accumulation x %d "
                              "ranks for any accumulation: set train_batch_size or "
                              "train_micro_batch_size_per_gpu for this world size",
                              (long long)cfg.train_batch_size, zn_ckpt_world(ck),
                              (long long)cfg.train_micro_batch_size_per_gpu, li.world_size);
        else if (li.rank == 0)
            printf("resume     saved by %d rank(s), resumed on %d: global batch %lld kept "
                   "(micro-batch %lld x gradient_accumulation_steps %lld x %d ranks)\n",
                   zn_ckpt_world(ck), li.world_size, (long long)cfg.train_batch_size,
                   (long long)cfg.train_micro_batch_size_per_gpu,
                   (long long)(cfg.train_batch_size /
                               (cfg.train_micro_batch_size_per_gpu * li.world_size)),
                   li.world_size);
        cfg.gradient_accumulation_steps = 0;  /* derived from the global batch */
    }
    if (rc || (rc = zn_config_resolve_batch(&cfg, li.world_size)) || (rc = zn_run_effective(&cfg, li.world_size, li.rank == 0 ? stdout : NULL))) {
        zn_ckpt_close(ck);
        free(recipe);
        return zn_cli_fail(rc, NULL);
    }
    char *cfg_text = zn_config_dump(&cfg);
    if (!cfg_text) {
        zn_ckpt_close(ck);
        free(recipe);
        return zn_cli_fail(-ENOMEM, "config");
    }
    FILE *jf = NULL;
    install_stop_signals();
    zn_run ts;
    double t_setup = zn_now_s();
    if ((rc = zn_run_open(&ts, &cfg, (trace_path ? ZN_RUN_TRACE : 0) |
                                         (ck ? ZN_RUN_NO_WEIGHTS : 0), stdout))) {
        zn_cli_fail(rc, NULL);
        zn_cli_end_job(zn_run_abort(&ts, 1), 1);
        zn_run_close(&ts);
        zn_ckpt_close(ck);
        free(cfg_text);
        free(recipe);
        return 1;
    }
    /* rank 0 speaks for the job; the others print only their errors */
    if (ts.rank > 0) {
        fflush(stdout);
        if (!freopen("/dev/null", "w", stdout))
            zn_warn("rank %d: cannot silence stdout: %s", ts.rank, strerror(errno));
        json_path = NULL;
        trace_path = NULL;
    }
    if (json_path && !(jf = fopen(json_path, "w"))) {
        fprintf(stderr, "zinc: error: --json-log %s: %s\n", json_path, strerror(errno));
        zn_cli_end_job(zn_run_abort(&ts, 1), 1);
        zn_run_close(&ts);
        zn_ckpt_close(ck);
        free(cfg_text);
        free(recipe);
        return 1;
    }
    int64_t start = 0;
    if (ck) {
        double t_load = zn_now_s();
        rc = resume(&ts, ck, &cfg);
        if (rc) {
            zn_cli_fail(rc, "--resume");
            zn_cli_end_job(zn_run_abort(&ts, 1), 1);
            zn_ckpt_close(ck);
            zn_run_close(&ts);
            if (jf)
                fclose(jf);
            free(cfg_text);
            free(recipe);
            return 1;
        }
        start = zn_ckpt_steps_run(ck);
        printf("resumed from %s: step %lld (%.2f s)\n", zn_ckpt_path(ck), (long long)start,
               zn_now_s() - t_load);
        zn_ckpt_close(ck);
        ck = NULL;
    }
    const zn_plan *plan = zn_train_get_plan(ts.tr);
    zn_train_report rep;
    zn_train_get_report(ts.tr, &rep);
    char b1[32], b2[32], b3[32];
    printf("zinc train: %s\n", path ? path : cfg.source);
    printf("  model    %s, %.2fM parameters, %lld layers, hidden %lld, vocab %lld\n",
           ts.dims.arch == ZN_ARCH_QWEN2 ? "qwen2" : "llama", (double)ts.params / 1e6,
           (long long)ts.dims.n_layers, (long long)ts.dims.hidden, (long long)ts.dims.vocab);
    if (ts.load_bytes)
        printf("  weights  %s (%.2f GB in %.2f s, %.2f GB/s)\n", ts.weights,
               (double)ts.load_bytes / 1e9, ts.load_s,
               ts.load_s > 0 ? (double)ts.load_bytes / 1e9 / ts.load_s : 0.0);
    else
        printf("  weights  %s\n", ts.weights);
    if (ts.lora[0])
        printf("  lora     %s\n", ts.lora);
    say_small_tensors(&ts.dims, &cfg);
    uint64_t ndocs = zn_tokens_num_docs(ts.data);
    char docs[96] = "";
    if (ndocs)
        snprintf(docs, sizeof docs, " (%llu documents, %s)", (unsigned long long)ndocs,
                 cfg.data.packing ? "packed, attending within each"
                                  : "one per window, padded");
    printf("  data     %s%s, micro-batch %lld x seq %lld, accumulation %lld, %llu windows\n",
           zn_tokens_name(ts.data), docs, (long long)cfg.train_micro_batch_size_per_gpu,
           (long long)cfg.data.seq_len, (long long)cfg.gradient_accumulation_steps,
           (unsigned long long)zn_loader_num_windows(ts.loader));
    if (ts.world > 1) {
        zn_comm_info ci;
        zn_comm_get_info(ts.comm, &ci);
        printf("  ranks    %d (%s, %s%s%s), ZeRO stage %d: each rank holds 1/%d of the state; "
               "figures below are rank 0's, tok/s counts all ranks\n", ts.world,
               zn_launcher_name(ci.launcher), ci.host_backend,
               strcmp(ci.dev_backend, "none") ? " + " : "",
               strcmp(ci.dev_backend, "none") ? ci.dev_backend : "", (int)cfg.zero.stage,
               ts.world);
    }
    printf("  device   %s, params %s; params -> %s, optimizer -> %s\n", rep.backend,
           rep.param_dtype, zn_offload_device_name(cfg.zero.offload_param.device),
           zn_offload_device_name(cfg.zero.offload_optimizer.device));
    printf("  schedule %d param slots on the device (%d blocks resident), optimizer %d units of "
           "%llu (%d in flight), %s; activation checkpoints %s\n", rep.param_slots,
           rep.persistent_blocks, rep.opt_units, (unsigned long long)rep.opt_unit,
           rep.opt_inflight,
           cfg.gradient_clipping > 0 || cfg.fp16.enabled
               ? "step after the global norm, under the next forward"
               : "step overlapped with backward and the next forward",
           cfg.activation_checkpointing.cpu_checkpointing
               ? "in pinned RAM (3 on the device)" : "on the device");
    printf("  budgets  gpu %s, cpu %s, nvme %s  (setup %.2f s)\n",
           zn_format_size(plan->budget[ZN_TIER_GPU], b1, sizeof b1),
           zn_format_size(plan->budget[ZN_TIER_CPU], b2, sizeof b2),
           zn_format_size(plan->budget[ZN_TIER_NVME], b3, sizeof b3), zn_now_s() - t_setup);
    if (plan->tier_total[ZN_TIER_NVME])
        zn_cli_print_swap_paths(stdout, &cfg, "  swap    ");
    if (cc->dir[0] && cc->every > 0)
        printf("  checkpoints %s, every %lld steps and at the end, keep %lld\n", cc->dir,
               (long long)cc->every, (long long)cc->keep_last);
    else if (cc->dir[0])
        printf("  checkpoints %s, at the end, keep %lld\n", cc->dir, (long long)cc->keep_last);
    fflush(stdout);

    zn_ckpt_save_options so = zn_ckpt_save_options_default();
    ckpt_hooks hooks;
    so.dir = cc->dir;
    so.keep_last = (int)cc->keep_last;
    hooks_from_env(&hooks, &so);

    int64_t steps = cfg.train.steps, every = cfg.train.log_every > 0 ? cfg.train.log_every : 1;
    double t0 = zn_now_s(), t_last = t0, first_loss = NAN, last_loss = NAN, last_eval = NAN;
    uint64_t last_eval_n = 0;
    zn_train_report prev = rep;
    int64_t saved_at = start;
    int stop_sig = 0;
    /* DeepSpeed's tensorboard monitor: rank 0 writes the scalars its
     * monitor writes (x axis: samples seen) under output_path/job_name */
    zn_tb *tb = NULL;
    zn_csvmon *cm = NULL;
    if (ts.rank == 0 && (cfg.csv_monitor.enabled || cfg.tensorboard.enabled)) {
        char cdir[ZN_PATH_MAX + 300], tbdir[ZN_PATH_MAX + 300];
        monitor_dir(cdir, sizeof cdir, cfg.csv_monitor.output_path, cfg.csv_monitor.job_name);
        monitor_dir(tbdir, sizeof tbdir, cfg.tensorboard.output_path, cfg.tensorboard.job_name);
        rc = 0;
        if (cfg.csv_monitor.enabled && !(rc = zn_csvmon_open(&cm, cdir)))
            printf("  csv_monitor %s\n", cdir);
        if (!rc && cfg.tensorboard.enabled && !(rc = zn_tb_open(&tb, tbdir)))
            printf("  tensorboard %s\n", zn_tb_path(tb));
        if (rc) {
            zn_cli_fail(rc, NULL);
            zn_csvmon_close(cm);
            if (jf)
                fclose(jf);
            zn_cli_end_job(zn_run_abort(&ts, 1), 1);
            zn_run_close(&ts);
            free(cfg_text);
            free(recipe);
            return 1;
        }
    }
    for (int64_t s = start; s < steps; s++) {
        zn_train_step_info info;
        double t_step = zn_now_s();
        if ((rc = zn_run_step(&ts, (uint64_t)s, &info))) {
            zn_cli_fail(rc, NULL);
            zn_cli_end_job(zn_run_abort(&ts, 1), 1);
            break;
        }
        if (s == start)
            first_loss = info.loss;
        last_loss = info.loss;
        /* evaluation on data.eval_path: every train.eval_every steps and at
         * the end */
        bool do_eval = ts.eval_loader &&
                       ((cfg.train.eval_every > 0 && (s + 1) % cfg.train.eval_every == 0) ||
                        s + 1 == steps);
        double ev = NAN;
        uint64_t ev_n = 0;
        char evline[ZN_PATH_MAX + 160] = "";
        if (do_eval) {
            double te = zn_now_s();
            if ((rc = zn_run_eval(&ts, &cfg, &ev, &ev_n))) {
                zn_cli_fail(rc, NULL);
                zn_cli_end_job(zn_run_abort(&ts, 1), 1);
                break;
            }
            last_eval = ev;
            last_eval_n = ev_n;
            /* printed after its step's line */
            snprintf(evline, sizeof evline, "eval  %5lld/%lld  loss %7.4f  ppl %.3f  (%llu "
                     "targets of %s, %.2f s)\n", (long long)info.step, (long long)steps, ev,
                     exp(ev), (unsigned long long)ev_n, cfg.data.eval_path, zn_now_s() - te);
        }
        if (cm) {
            int64_t samples = info.step * cfg.train_batch_size;
            int r2 = zn_csvmon_event(cm, "Train/Samples/train_loss", samples, info.loss);
            if (!r2)
                r2 = zn_csvmon_event(cm, "Train/Samples/lr", samples, info.lr);
            if (!r2 && do_eval)
                r2 = zn_csvmon_event(cm, "Train/Samples/eval_loss", samples, ev);
            if (r2) {
                rc = zn_cli_fail(r2, NULL);
                zn_cli_end_job(zn_run_abort(&ts, 1), 1);
                break;
            }
        }
        if (tb) {
            int64_t samples = info.step * cfg.train_batch_size;
            int r2 = zn_tb_scalar(tb, "Train/Samples/train_loss", samples, (float)info.loss);
            if (!r2)
                r2 = zn_tb_scalar(tb, "Train/Samples/lr", samples, (float)info.lr);
            if (!r2)
                r2 = zn_tb_scalar(tb, "Train/Samples/grad_norm", samples, (float)info.grad_norm);
            if (!r2 && cfg.fp16.enabled)
                r2 = zn_tb_scalar(tb, "Train/Samples/loss_scale", samples, (float)info.loss_scale);
            if (!r2 && do_eval)
                r2 = zn_tb_scalar(tb, "Train/Samples/eval_loss", samples, (float)ev);
            if (r2) {
                rc = zn_cli_fail(r2, NULL);
                zn_cli_end_job(zn_run_abort(&ts, 1), 1);
                break;
            }
        }
        if (jf) {
            fprintf(jf, "{\"step\": %lld, \"loss\": %.6f, \"loss_hex\": \"%a\", \"lr\": %.6g, "
                        "\"grad_norm\": %.6g, \"loss_scale\": %g, \"skipped\": %s, "
                        "\"seconds\": %.6f, \"tokens\": %llu", (long long)info.step,
                    info.loss, info.loss, info.lr, info.grad_norm, info.loss_scale,
                    info.skipped ? "true" : "false", info.seconds,
                    (unsigned long long)info.tokens);
            if (do_eval)
                fprintf(jf, ", \"eval_loss\": %.6f, \"eval_ppl\": %.6g, \"eval_targets\": %llu",
                        ev, exp(ev), (unsigned long long)ev_n);
            fprintf(jf, "}\n");
            fflush(jf);
        }
        double now = zn_now_s();
        if ((s + 1) % every == 0 || s == start || s + 1 == steps || now - t_last >= 1.0) {
            zn_train_report r;
            zn_train_get_report(ts.tr, &r);
            double dt = r.step_s - prev.step_s;
            double ds = (double)(r.steps - prev.steps);
            double tps = dt > 0 ? (double)(r.tokens - prev.tokens) / dt : 0;
            double tf = dt > 0 ? (r.flops - prev.flops) / dt * 1e-12 : 0;
            double g = dt > 0 ? 1e-9 / dt : 0;
            char eta[32];
            fmt_eta(ds > 0 ? dt / ds * (double)(steps - s - 1) : -1, eta, sizeof eta);
            printf("step %5lld/%lld  loss %7.4f  lr %.2e  %8.0f tok/s  %6.3f TFLOP/s  "
                   "GB/s h2d %.2f d2h %.2f nvme r %.2f w %.2f  eta %s%s\n",
                   (long long)info.step, (long long)steps, info.loss, info.lr, tps, tf,
                   (double)(r.h2d_bytes - prev.h2d_bytes) * g,
                   (double)(r.d2h_bytes - prev.d2h_bytes) * g,
                   (double)(r.nvme_read_bytes - prev.nvme_read_bytes) * g,
                   (double)(r.nvme_write_bytes - prev.nvme_write_bytes) * g, eta,
                   info.skipped ? "  (overflow: step skipped)" : "");
            fflush(stdout);
            prev = r;
            t_last = now;
        }
        if (evline[0]) {
            fputs(evline, stdout);
            fflush(stdout);
        }
        if (s == start && cc->dir[0] && ts.rank == 0 && !g_stop_sig)
            stop_notice(&ts, &cfg, zn_train_get_plan(ts.tr), zn_now_s() - t_step);
        if (cc->dir[0] && cc->every > 0 && (s + 1) % cc->every == 0) {
            if ((rc = save(&ts, &cfg, cfg_text, &so, s + 1)))
                break;
            saved_at = s + 1;
        }
        if ((stop_sig = ranks_stop(&ts))) {
            steps = s + 1;  /* the end is here: save as at the end */
            break;
        }
    }
    /* the last step's optimizer job (pipelined under the next forward) */
    if (!rc && (rc = zn_train_sync(ts.tr))) {
        zn_cli_fail(rc, NULL);
        zn_cli_end_job(zn_run_abort(&ts, 1), 1);
    }
    if (!rc && cc->dir[0] && saved_at != steps && steps > start)
        rc = save(&ts, &cfg, cfg_text, &so, steps);
    if (jf)
        fclose(jf);
    zn_tb_close(tb);
    zn_csvmon_close(cm);
    if (!rc) {
        printf("\ntrained %lld steps in %.1f s: loss %.4f -> %.4f", (long long)(steps - start),
               zn_now_s() - t0, first_loss, last_loss);
        if (ZN_DATA_SYNTHETIC(&cfg.data))
            printf(" (the synthetic chain's entropy, the lowest reachable, is %.2f)",
                   zn_tokens_synthetic_entropy());
        if (last_eval_n)
            printf("\neval loss %.4f, perplexity %.3f, over %llu targets of %s", last_eval,
                   exp(last_eval), (unsigned long long)last_eval_n, cfg.data.eval_path);
        printf("\n\n");
        zn_train_print_report(ts.tr, stdout);
        if (trace_path) {
            int r2 = zn_train_write_trace(ts.tr, trace_path);
            if (r2)
                rc = zn_cli_fail(r2, "trace");
            else
                printf("trace: %s (open in https://ui.perfetto.dev or chrome://tracing)\n",
                       trace_path);
        }
        /* the cost model against this run (rank 0; this machine's ceilings
         * from the cache, measured once when missing). The trainer and its
         * device go first: a probe measured now then has the GPU the run
         * had, and the process never holds more than its plan (on an H200 a
         * 7B run's probe beside its trainer held 26.2 GiB against the plan's
         * 4.70). */
        zn_plan *pl = ts.rank == 0 && !stop_sig ? malloc(sizeof *pl) : NULL;
        if (pl) {
            zn_train_report trep;
            zn_train_get_report(ts.tr, &trep);
            *pl = *zn_train_get_plan(ts.tr);
            zn_run_free_trainer(&ts);
            zn_cost pred;
            int prc = zn_run_predict(&cfg, &ts.dims, pl, 0, &pred, stdout);
            if (prc == 0 || prc == ZN_EARG)
                zn_cost_print_vs(&pred, &trep, ts.world, stdout);
            else
                fprintf(stderr, "zinc: warning: no step-time prediction: %s\n", zn_last_error());
            free(pl);
        }
    }
    if (stop_sig) {
        /* Every rank removes its files and says so before any rank exits:
         * mpirun ends the whole job at the first non-zero exit, and a rank
         * killed by it then would leave its swap files and no word. */
        zn_run_free_trainer(&ts);   /* the swap files go here */
        fprintf(stderr, "zinc: %s%s: stopped after step %lld%s%s%s, swap files removed, %.1f s "
                "after %s (exit %d)\n", strsignal(stop_sig),
                g_stop_by_peer ? " on another rank" : "", (long long)steps,
                cc->dir[0] && !rc ? ", checkpoint saved in " : "",
                cc->dir[0] && !rc ? cc->dir : "",
                cc->dir[0] ? "" : " (no train.checkpoint.dir: nothing saved)",
                since_signal_s(), g_stop_by_peer ? "this rank learned of it" : "the signal",
                128 + stop_sig);
        fflush(stderr);
        int brc = zn_run_barrier(&ts);
        if (brc)
            fprintf(stderr, "zinc: warning: the ranks did not meet before exiting (%s): a rank "
                    "may have ended first\n", zn_last_error());
    }
    zn_run_close(&ts);   /* the swap files go here (on a stop, above) */
    free(cfg_text);
    if (recipe && !rc && !stop_sig && zn_cli_recipe_finish(recipe, json_path, cfg.bf16))
        rc = 1;
    free(recipe);
    if (stop_sig)
        return 128 + stop_sig;
    return rc ? 1 : 0;
}
