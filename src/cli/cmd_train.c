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

/* A resume from a killed run's commit: that run's swap folder is removed
 * (what dead runs left, as the nvme tier would remove it) and the commit's
 * state.swp, then the file's only name, punched to what it refers to,
 * before this run sizes its nvme tier and takes its space. Otherwise the
 * whole old swap file (parameters, gradients, the other copy) would still
 * hold its blocks while the new one is allocated. Rank 0; a failure is only
 * said (the run's own reclaim and the punch after the load come later). */
static void punch_dead_commit(const zn_config *cfg, zn_ckpt *ck)
{
    const char *paths[ZN_SWAP_MAX_PATHS];
    int n = zn_config_nvme_paths(cfg, paths, ZN_SWAP_MAX_PATHS);
    for (int i = 0; i < n; i++) {
        uint64_t bytes = 0;
        int files = 0;
        struct stat st;
        if (stat(paths[i], &st) == 0 && S_ISDIR(st.st_mode) &&
            zn_swap_clean_stale(paths[i], "zinc-train", &bytes, &files))
            zn_warn("swap: looking for dead runs' files in %s: %s", paths[i], zn_last_error());
    }
    if (zn_ckpt_punch_unlinked(zn_ckpt_path(ck)))
        zn_warn("--resume: %s (the checkpoint stays whole)", zn_last_error());
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

static void monitor_dir(char *out, size_t n, const char *output_path, const char *job)
{
    if (output_path[0])
        snprintf(out, n, "%s/%s", output_path, job);
    else
        snprintf(out, n, "%s", job);
}

/* ---- the command ------------------------------------------------------------
 * The setup helpers return TRAIN_GO_ON when the command goes on, anything
 * else being its exit code (0 for --help, 2 for bad usage, 1 after the
 * error is printed). */
#define TRAIN_GO_ON (-1)

/* What the command line asks for. */
typedef struct {
    const char *sets[64];   /* the --sets, then those --steps, --model, --data make */
    int n_sets;
    const char *path, *trace_path, *json_path, *resume_arg;
    int resuming;
    long long steps_opt;   /* -1: train.steps */
} train_args;

static int parse_args(int argc, char **argv, train_args *a)
{
    memset(a, 0, sizeof *a);
    a->steps_opt = -1;
    argc = zn_cli_take_sets(argc, argv, a->sets, 64, &a->n_sets);
    if (argc < 0)
        return 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--print-default")) {
            fputs(zn_tiny_json, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            char *end;
            a->steps_opt = strtoll(argv[++i], &end, 10);
            /* a --set, so that the effective config says where it came from */
            static char steps_set[48];
            snprintf(steps_set, sizeof steps_set, "train.steps=%lld", a->steps_opt);
            if (a->n_sets < 64 && !*end && a->steps_opt >= 0)
                a->sets[a->n_sets++] = steps_set;
            if (*end || a->steps_opt < 0) {
                fprintf(stderr, "zinc: error: --steps %s: expected a step count >= 0\n", argv[i]);
                return 2;
            }
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            if (zn_cli_model_set(argv[++i], a->sets, 64, &a->n_sets))
                return 2;
        } else if (!strcmp(argv[i], "--data") && i + 1 < argc) {
            if (zn_cli_data_set(argv[++i], a->sets, 64, &a->n_sets))
                return 2;
        } else if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
            a->trace_path = argv[++i];
        } else if (!strcmp(argv[i], "--json-log") && i + 1 < argc) {
            a->json_path = argv[++i];
        } else if (!strcmp(argv[i], "--resume")) {
            a->resuming = 1;
            /* an optional value: "latest" or a folder (a file is CONFIG) */
            struct stat st;
            if (i + 1 < argc && (!strcmp(argv[i + 1], "latest") ||
                                 (stat(argv[i + 1], &st) == 0 && S_ISDIR(st.st_mode))))
                a->resume_arg = argv[++i];
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "zinc: error: train: unknown option or missing value '%s'\n",
                    argv[i]);
            usage(stderr);
            return 2;
        } else if (!a->path) {
            a->path = argv[i];
        } else {
            fprintf(stderr, "zinc: error: train: one CONFIG only ('%s' is extra)\n", argv[i]);
            return 2;
        }
    }
    return TRAIN_GO_ON;
}

/* What the run is made from. The caller holds recipe, ck and cfg_text once
 * load_config succeeded. */
typedef struct {
    zn_config cfg;
    zn_recipe *recipe;         /* a LLaMA-Factory recipe in place of CONFIG */
    char recipe_log[4300];     /* its trainer_log.jsonl, --json-log's default */
    zn_ckpt *ck;               /* the checkpoint to resume, verified */
    char *cfg_text;            /* the resolved config, recorded by each save */
} train_setup;

/* The config's source, under the command line's --sets: the recipe's
 * settings (the command line's win), CONFIG, the config the checkpoint
 * recorded, or the embedded default. */
static int parse_config(zn_config *cfg, const train_args *a, const zn_recipe *recipe,
                        const zn_ckpt *ck)
{
    if (recipe) {
        const char *all[ZN_RECIPE_MAX_SETS + 64];
        int na = 0;
        for (int i = 0; i < recipe->n_sets; i++)
            all[na++] = recipe->sets[i];
        for (int i = 0; i < a->n_sets; i++)
            all[na++] = a->sets[i];
        return recipe->ds_config[0] ? zn_config_load(cfg, recipe->ds_config, all, na)
                                    : zn_config_parse(cfg, "{}", recipe->path, all, na);
    }
    if (a->path)
        return zn_config_load(cfg, a->path, a->sets, a->n_sets);
    if (ck) {
        const char *text = zn_ckpt_config_text(ck);
        char name[4300];
        snprintf(name, sizeof name, "(config recorded in %s)", zn_ckpt_path(ck));
        return text ? zn_config_parse(cfg, text, name, a->sets, a->n_sets)
                    : zn_set_error(ZN_ECONFIG, "checkpoint %s records no config: give CONFIG",
                                   zn_ckpt_path(ck));
    }
    return zn_config_parse(cfg, zn_tiny_json, "(embedded examples/tiny.json)", a->sets,
                           a->n_sets);
}

/* The config, the recipe it came from (its data prepared first) and the
 * checkpoint to resume, then the config resolved for this launch. Returns
 * TRAIN_GO_ON with su filled, or the exit code with nothing held. */
static int load_config(train_args *a, train_setup *su)
{
    su->recipe = NULL;
    su->ck = NULL;
    su->cfg_text = NULL;
    int rc;
    const char *what = NULL;   /* the failure's context for zn_cli_fail */
    if (a->path && zn_recipe_is_path(a->path)) {
        if ((rc = zn_cli_recipe_open(a->path, &su->recipe, su->recipe_log,
                                     sizeof su->recipe_log)))
            return rc;
        if (!a->json_path)
            a->json_path = su->recipe_log;
    }
    /* a checkpoint is verified before it is loaded; a damaged latest falls
     * back to the newest one that verifies, saying so */
    char fallback[2048] = "";
    if (a->resuming && a->resume_arg && strcmp(a->resume_arg, "latest") &&
        (rc = zn_ckpt_open_good(&su->ck, a->resume_arg, fallback, sizeof fallback))) {
        what = "--resume";
        goto fail;
    }
    if ((rc = parse_config(&su->cfg, a, su->recipe, su->ck)))
        goto fail;
    if (a->steps_opt >= 0)
        su->cfg.train.steps = a->steps_opt;
    if (a->resuming && !su->ck) {
        if (!su->cfg.train.checkpoint.dir[0]) {
            fprintf(stderr, "zinc: error: --resume without a folder needs "
                            "train.checkpoint.dir\n");
            goto fail;   /* rc is 0: a usage error */
        }
        if ((rc = zn_ckpt_open_good(&su->ck, su->cfg.train.checkpoint.dir, fallback,
                                    sizeof fallback))) {
            what = "--resume";
            goto fail;
        }
    }
    if (fallback[0])
        fprintf(stderr, "zinc: warning: %s\n", fallback);
    /* the config resolved once for this run (the resumed checkpoint's
     * batch, "auto", the batch keys), the effective settings printed */
    zn_launch_info li;
    if (!(rc = zn_launch_detect(&li)))
        rc = zn_run_resolve(&su->cfg, su->ck, li.world_size, li.rank == 0 ? stdout : NULL);
    if (rc)
        goto fail;
    if (!(su->cfg_text = zn_config_dump(&su->cfg))) {
        rc = -ENOMEM;
        what = "config";
        goto fail;
    }
    if (su->ck && li.rank == 0)
        punch_dead_commit(&su->cfg, su->ck);
    return TRAIN_GO_ON;
fail:
    zn_ckpt_close(su->ck);
    su->ck = NULL;
    free(su->recipe);
    su->recipe = NULL;
    return rc ? zn_cli_fail(rc, what) : 2;
}

/* The step loop's state, and what the end of the run reports. */
typedef struct {
    zn_run *ts;
    zn_config *cfg;
    const char *cfg_text;
    zn_cli_saver sv;             /* the checkpoints (train_save.c) */
    bool dropped;                /* a stop dropped the last step's update (its commit sealed) */
    char resumed[ZN_PATH_MAX + 64];  /* the checkpoint the run resumed from ("" none) */
    FILE *jf;                    /* --json-log */
    zn_tb *tb;
    zn_csvmon *cm;
    int64_t start, steps, every;
    double t0, t_last, first_loss, last_loss, last_eval;
    uint64_t last_eval_n;
    zn_train_report prev;        /* at the last progress line */
    int stop_sig;
} train_loop;

/* Opens the run, its trainer and data; rank 0 alone keeps stdout and the
 * files of --json-log and --trace. Returns 0, or 1 with the error printed
 * and the other ranks told (the caller closes the run). */
static int open_run(train_loop *L, train_args *a, bool resuming)
{
    zn_run *ts = L->ts;
    /* a resumed run's state comes from its checkpoint: no weights read */
    int rc = zn_run_open(ts, L->cfg, (a->trace_path ? ZN_RUN_TRACE : 0) |
                                         (resuming ? ZN_RUN_NO_WEIGHTS : 0), stdout);
    if (rc) {
        zn_cli_fail(rc, NULL);
        goto fail;
    }
    /* rank 0 speaks for the job; the others print only their errors */
    if (ts->rank > 0) {
        fflush(stdout);
        if (!freopen("/dev/null", "w", stdout))
            zn_warn("rank %d: cannot silence stdout: %s", ts->rank, strerror(errno));
        a->json_path = NULL;
        a->trace_path = NULL;
    }
    if (a->json_path && !(L->jf = fopen(a->json_path, "w"))) {
        fprintf(stderr, "zinc: error: --json-log %s: %s\n", a->json_path, strerror(errno));
        goto fail;
    }
    return 0;
fail:
    zn_cli_end_job(zn_run_abort(ts, 1), 1);
    return 1;
}

/* Loads the checkpoint into the run and closes it (*ck NULL after, either
 * way); the step to go on from in L->start. Returns 0, or 1 with the error
 * printed and the other ranks told. */
static int load_resume(train_loop *L, zn_ckpt **ck)
{
    double t_load = zn_now_s();
    int rc = resume(L->ts, *ck, L->cfg);
    if (rc) {
        zn_cli_fail(rc, "--resume");
        zn_cli_end_job(zn_run_abort(L->ts, 1), 1);
    } else {
        L->start = zn_ckpt_steps_run(*ck);
        snprintf(L->resumed, sizeof L->resumed, "%s", zn_ckpt_path(*ck));
        /* a killed run's commit holds its whole swap file (the params,
         * gradients, the other copy): now that the reclaim has unlinked
         * that run's name for it, what the checkpoint does not refer to goes */
        if (L->ts->rank == 0 && zn_ckpt_punch_unlinked(zn_ckpt_path(*ck)))
            zn_warn("%s (the checkpoint is whole)", zn_last_error());
        printf("resumed from %s: step %lld (%.2f s)\n", zn_ckpt_path(*ck), (long long)L->start,
               zn_now_s() - t_load);
    }
    zn_ckpt_close(*ck);
    *ck = NULL;
    return rc ? 1 : 0;
}

/* The run's header: what trains, on what data, where its state lives,
 * the schedule, the tiers' budgets and where checkpoints go. */
static void print_header(const zn_run *ts, const zn_config *cfg, const char *path,
                         const zn_train_report *rep, double t_setup)
{
    const zn_plan *plan = zn_train_get_plan(ts->tr);
    const zn_config_checkpoint *cc = &cfg->train.checkpoint;
    char b1[32], b2[32], b3[32];
    printf("zinc train: %s\n", path ? path : cfg->source);
    printf("  model    %s, %.2fM parameters, %lld layers, hidden %lld, vocab %lld\n",
           zn_model_arch_name(ts->dims.arch), (double)ts->params / 1e6,
           (long long)ts->dims.n_layers, (long long)ts->dims.hidden, (long long)ts->dims.vocab);
    if (ts->load_bytes)
        printf("  weights  %s (%.2f GB in %.2f s, %.2f GB/s)\n", ts->weights,
               (double)ts->load_bytes / 1e9, ts->load_s,
               ts->load_s > 0 ? (double)ts->load_bytes / 1e9 / ts->load_s : 0.0);
    else
        printf("  weights  %s\n", ts->weights);
    if (ts->lora[0])
        printf("  lora     %s\n", ts->lora);
    say_small_tensors(&ts->dims, cfg);
    uint64_t ndocs = zn_tokens_num_docs(ts->data);
    char docs[96] = "";
    if (ndocs)
        snprintf(docs, sizeof docs, " (%llu documents, %s)", (unsigned long long)ndocs,
                 cfg->data.packing ? "packed, attending within each"
                                   : "one per window, padded");
    printf("  data     %s%s, micro-batch %lld x seq %lld, accumulation %lld, %llu windows\n",
           zn_tokens_name(ts->data), docs, (long long)cfg->train_micro_batch_size_per_gpu,
           (long long)cfg->data.seq_len, (long long)cfg->gradient_accumulation_steps,
           (unsigned long long)zn_loader_num_windows(ts->loader));
    if (ts->world > 1) {
        zn_comm_info ci;
        zn_comm_get_info(ts->comm, &ci);
        printf("  ranks    %d (%s, %s%s%s), ZeRO stage %d: each rank holds 1/%d of the state; "
               "figures below are rank 0's, tok/s counts all ranks\n", ts->world,
               zn_launcher_name(ci.launcher), ci.host_backend,
               strcmp(ci.dev_backend, "none") ? " + " : "",
               strcmp(ci.dev_backend, "none") ? ci.dev_backend : "", (int)cfg->zero.stage,
               ts->world);
    }
    printf("  device   %s, params %s; params -> %s, optimizer -> %s\n", rep->backend,
           rep->param_dtype, zn_offload_device_name(cfg->zero.offload_param.device),
           zn_offload_device_name(cfg->zero.offload_optimizer.device));
    printf("  schedule %d param slots on the device (%d blocks resident), optimizer %d units of "
           "%llu (%d in flight), %s; activation checkpoints %s\n", rep->param_slots,
           rep->persistent_blocks, rep->opt_units, (unsigned long long)rep->opt_unit,
           rep->opt_inflight,
           cfg->gradient_clipping > 0 || cfg->fp16.enabled
               ? "step after the global norm, under the next forward"
               : "step overlapped with backward and the next forward",
           cfg->activation_checkpointing.cpu_checkpointing
               ? "in pinned RAM (3 on the device)" : "on the device");
    printf("  budgets  gpu %s, cpu %s, nvme %s  (setup %.2f s)\n",
           zn_format_size(plan->budget[ZN_TIER_GPU], b1, sizeof b1),
           zn_format_size(plan->budget[ZN_TIER_CPU], b2, sizeof b2),
           zn_format_size(plan->budget[ZN_TIER_NVME], b3, sizeof b3), zn_now_s() - t_setup);
    if (plan->tier_total[ZN_TIER_NVME])
        zn_cli_print_swap_paths(stdout, cfg, "  swap    ");
    if (cc->dir[0] && cc->every > 0)
        printf("  checkpoints %s, every %lld steps and at the end, keep %lld\n", cc->dir,
               (long long)cc->every, (long long)cc->keep_last);
    else if (cc->dir[0])
        printf("  checkpoints %s, at the end, keep %lld\n", cc->dir, (long long)cc->keep_last);
    fflush(stdout);
}

/* DeepSpeed's csv and tensorboard monitors: rank 0 writes the scalars
 * their monitors write (x axis: samples seen) under output_path/job_name.
 * Returns 0, or 1 with the error printed, the log closed and the other
 * ranks told (the caller closes the run). */
static int open_monitors(train_loop *L)
{
    const zn_config *cfg = L->cfg;
    if (L->ts->rank != 0 || !(cfg->csv_monitor.enabled || cfg->tensorboard.enabled))
        return 0;
    char cdir[ZN_PATH_MAX + 300], tbdir[ZN_PATH_MAX + 300];
    monitor_dir(cdir, sizeof cdir, cfg->csv_monitor.output_path, cfg->csv_monitor.job_name);
    monitor_dir(tbdir, sizeof tbdir, cfg->tensorboard.output_path, cfg->tensorboard.job_name);
    int rc = 0;
    if (cfg->csv_monitor.enabled && !(rc = zn_csvmon_open(&L->cm, cdir)))
        printf("  csv_monitor %s\n", cdir);
    if (!rc && cfg->tensorboard.enabled && !(rc = zn_tb_open(&L->tb, tbdir)))
        printf("  tensorboard %s\n", zn_tb_path(L->tb));
    if (rc) {
        zn_cli_fail(rc, NULL);
        zn_csvmon_close(L->cm);
        L->cm = NULL;
        if (L->jf)
            fclose(L->jf);
        L->jf = NULL;
        zn_cli_end_job(zn_run_abort(L->ts, 1), 1);
        return 1;
    }
    return 0;
}

/* Evaluation on data.eval_path; its line (into `line`) is printed after
 * its step's. */
static int step_eval(train_loop *L, const zn_train_step_info *info, double *ev, uint64_t *ev_n,
                     char *line, size_t n)
{
    double te = zn_now_s();
    int rc = zn_run_eval(L->ts, L->cfg, ev, ev_n);
    if (rc)
        return rc;
    L->last_eval = *ev;
    L->last_eval_n = *ev_n;
    snprintf(line, n, "eval  %5lld/%lld  loss %7.4f  ppl %.3f  (%llu "
             "targets of %s, %.2f s)\n", (long long)info->step, (long long)L->steps, *ev,
             exp(*ev), (unsigned long long)*ev_n, L->cfg->data.eval_path, zn_now_s() - te);
    return 0;
}

/* The step's scalars to the monitors that are open; the first failure. */
static int step_monitors(train_loop *L, const zn_train_step_info *info, bool do_eval, double ev)
{
    int64_t samples = info->step * L->cfg->train_batch_size;
    int rc = 0;
    if (L->cm) {
        rc = zn_csvmon_event(L->cm, "Train/Samples/train_loss", samples, info->loss);
        if (!rc)
            rc = zn_csvmon_event(L->cm, "Train/Samples/lr", samples, info->lr);
        if (!rc && do_eval)
            rc = zn_csvmon_event(L->cm, "Train/Samples/eval_loss", samples, ev);
        if (rc)
            return rc;
    }
    if (L->tb) {
        rc = zn_tb_scalar(L->tb, "Train/Samples/train_loss", samples, (float)info->loss);
        if (!rc)
            rc = zn_tb_scalar(L->tb, "Train/Samples/lr", samples, (float)info->lr);
        if (!rc)
            rc = zn_tb_scalar(L->tb, "Train/Samples/grad_norm", samples, (float)info->grad_norm);
        if (!rc && L->cfg->fp16.enabled)
            rc = zn_tb_scalar(L->tb, "Train/Samples/loss_scale", samples,
                              (float)info->loss_scale);
        if (!rc && do_eval)
            rc = zn_tb_scalar(L->tb, "Train/Samples/eval_loss", samples, (float)ev);
    }
    return rc;
}

/* The step's line of --json-log. */
static void step_json(FILE *jf, const zn_train_step_info *info, bool do_eval, double ev,
                      uint64_t ev_n)
{
    fprintf(jf, "{\"step\": %lld, \"loss\": %.6f, \"loss_hex\": \"%a\", \"lr\": %.6g, "
                "\"grad_norm\": %.6g, \"loss_scale\": %g, \"skipped\": %s, "
                "\"seconds\": %.6f, \"tokens\": %llu", (long long)info->step,
            info->loss, info->loss, info->lr, info->grad_norm, info->loss_scale,
            info->skipped ? "true" : "false", info->seconds,
            (unsigned long long)info->tokens);
    if (info->has_aux)
        fprintf(jf, ", \"aux_loss\": %.6f", info->aux_loss);
    if (do_eval)
        fprintf(jf, ", \"eval_loss\": %.6f, \"eval_ppl\": %.6g, \"eval_targets\": %llu",
                ev, exp(ev), (unsigned long long)ev_n);
    fprintf(jf, "}\n");
    fflush(jf);
}

/* The progress line, every log_every steps, at the first and the last,
 * and at least once a second: the rates since the previous line. */
static void step_progress(train_loop *L, const zn_train_step_info *info, int64_t s)
{
    double now = zn_now_s();
    if (!((s + 1) % L->every == 0 || s == L->start || s + 1 == L->steps ||
          now - L->t_last >= 1.0))
        return;
    zn_train_report r;
    zn_train_get_report(L->ts->tr, &r);
    const zn_train_report *prev = &L->prev;
    double dt = r.step_s - prev->step_s;
    double ds = (double)(r.steps - prev->steps);
    double tps = dt > 0 ? (double)(r.tokens - prev->tokens) / dt : 0;
    double tf = dt > 0 ? (r.flops - prev->flops) / dt * 1e-12 : 0;
    double g = dt > 0 ? 1e-9 / dt : 0;
    char eta[32];
    fmt_eta(ds > 0 ? dt / ds * (double)(L->steps - s - 1) : -1, eta, sizeof eta);
    char aux[48] = "";
    if (info->has_aux) /* the load-balancing loss, apart (`loss` holds it weighted) */
        snprintf(aux, sizeof aux, "  aux %.4f", info->aux_loss);
    printf("step %5lld/%lld  loss %7.4f%s  lr %.2e  %8.0f tok/s  %6.3f TFLOP/s  "
           "GB/s h2d %.2f d2h %.2f nvme r %.2f w %.2f  eta %s%s\n",
           (long long)info->step, (long long)L->steps, info->loss, aux, info->lr, tps, tf,
           (double)(r.h2d_bytes - prev->h2d_bytes) * g,
           (double)(r.d2h_bytes - prev->d2h_bytes) * g,
           (double)(r.nvme_read_bytes - prev->nvme_read_bytes) * g,
           (double)(r.nvme_write_bytes - prev->nvme_write_bytes) * g, eta,
           info->skipped ? "  (overflow: step skipped)" : "");
    fflush(stdout);
    L->prev = r;
    L->t_last = now;
}

/* The steps from L->start to L->steps, with the last step's optimizer job
 * waited for; a stop signal ends them after the step in progress
 * (L->stop_sig, L->steps the step reached). Returns 0 or the failure,
 * already printed: a failed save has said what it was (and the other ranks
 * go on to theirs); any other failure tells the other ranks. */
static int train_steps(train_loop *L)
{
    zn_run *ts = L->ts;
    const zn_config *cfg = L->cfg;
    const zn_config_checkpoint *cc = &cfg->train.checkpoint;
    int rc = 0;
    for (int64_t s = L->start; s < L->steps; s++) {
        zn_train_step_info info;
        double t_step = zn_now_s();
        if ((rc = zn_run_step(ts, (uint64_t)s, &info)) == -ECANCELED && zn_cli_stop_signal()) {
            /* stopped before its update (zn_train_set_stop): the state is
             * step s's, as a save of it or the one in the background keeps */
            L->stop_sig = zn_cli_stop_signal();
            L->steps = s;
            zn_cli_save_on_stop(&L->sv);
            if (zn_cli_commit_stop(&L->sv, &L->steps)) {
                L->dropped = true;
                return 0;
            }
            break;
        }
        if (rc)
            goto fail;
        if (s == L->start)
            L->first_loss = info.loss;
        L->last_loss = info.loss;
        /* evaluation on data.eval_path: every train.eval_every steps and at
         * the end */
        bool do_eval = ts->eval_loader &&
                       ((cfg->train.eval_every > 0 && (s + 1) % cfg->train.eval_every == 0) ||
                        s + 1 == L->steps);
        double ev = NAN;
        uint64_t ev_n = 0;
        char evline[ZN_PATH_MAX + 160] = "";
        if (do_eval && (rc = step_eval(L, &info, &ev, &ev_n, evline, sizeof evline)))
            goto fail;
        if ((rc = step_monitors(L, &info, do_eval, ev)))
            goto fail;
        if (L->jf)
            step_json(L->jf, &info, do_eval, ev, ev_n);
        step_progress(L, &info, s);
        if (evline[0]) {
            fputs(evline, stdout);
            fflush(stdout);
        }
        if (s == L->start && cc->dir[0] && ts->rank == 0 && !zn_cli_stop_signal())
            zn_cli_stop_notice(ts, cfg, zn_train_get_plan(ts->tr), zn_now_s() - t_step);
        else if (s > L->start && ts->rank == 0 && !zn_cli_stop_signal())
            zn_cli_stop_recheck(ts, cfg, zn_now_s() - t_step);
        /* the save begun after the previous step completes now (its files
         * were written while this step ran), then this step's begins */
        if ((rc = zn_cli_save_settle(&L->sv)))
            return rc;
        /* saves at once: a stop skips this step's, which the final save
         * makes (in place, where the state is on NVMe); with every step
         * committed, the update still running is dropped instead and the
         * last commit stays (one step older, at once) */
        if (!L->sv.background && (L->stop_sig = zn_cli_ranks_stop(ts))) {
            L->steps = s + 1;
            if (zn_cli_commit_stop(&L->sv, &L->steps)) {
                L->dropped = true;
                return 0;
            }
            L->steps = s + 1;
            break;
        }
        bool save = cc->dir[0] && cc->every > 0 && (s + 1) % cc->every == 0;
        if (save && (rc = zn_cli_save_begin(&L->sv, s + 1, 0.7 * (zn_now_s() - t_step))))
            return rc;
        /* the other steps (but the last: the final save follows) commit
         * by reference while the next one runs */
        if (!save && L->sv.commit && s + 1 < L->steps &&
            (rc = zn_cli_commit_begin(&L->sv, s + 1)))
            return rc;
        /* (a stop during a save at once is seen here too) */
        if ((L->sv.background || save) && (L->stop_sig = zn_cli_ranks_stop(ts))) {
            zn_cli_save_on_stop(&L->sv);
            L->steps = s + 1;  /* the end is here: save as at the end */
            break;
        }
    }
    /* the last step's optimizer job (pipelined under the next forward) */
    if ((rc = zn_train_sync(ts->tr)))
        goto fail;
    return 0;
fail:
    zn_cli_fail(rc, NULL);
    zn_cli_end_job(zn_run_abort(ts, 1), 1);
    return rc;
}

/* The cost model against this run (rank 0; this machine's ceilings from
 * the cache, measured once when missing). The trainer and its device go
 * first: a probe measured now then has the GPU the run had, and the
 * process never holds more than its plan (on an H200 a 7B run's probe
 * beside its trainer held 26.2 GiB against the plan's 4.70). */
static void say_cost_vs_run(zn_run *ts, const zn_config *cfg)
{
    zn_plan *pl = malloc(sizeof *pl);
    if (!pl)
        return;
    zn_train_report trep;
    zn_train_get_report(ts->tr, &trep);
    *pl = *zn_train_get_plan(ts->tr);
    zn_run_free_trainer(ts);
    zn_cost pred;
    int prc = zn_run_predict(cfg, &ts->dims, pl, 0, &pred, stdout);
    if (prc == 0 || prc == ZN_EARG)
        zn_run_cost_print_vs(&pred, &trep, ts->world, stdout);
    else
        fprintf(stderr, "zinc: warning: no step-time prediction: %s\n", zn_last_error());
    free(pl);
}

/* The report of a run that ended well: the loss it went through, the
 * per-tier report, the trace, the cost model's prediction. Returns 0, or
 * 1 when the trace could not be written (said). */
static int print_result(train_loop *L, const char *trace_path)
{
    zn_run *ts = L->ts;
    const zn_config *cfg = L->cfg;
    int rc = 0;
    if (L->steps <= L->start)
        printf("\nno step to train: the run resumed at step %lld of %lld (train.steps, "
               "--steps)", (long long)L->start, (long long)L->steps);
    else
        printf("\ntrained %lld steps in %.1f s: loss %.4f -> %.4f",
               (long long)(L->steps - L->start), zn_now_s() - L->t0, L->first_loss,
               L->last_loss);
    if (ZN_DATA_SYNTHETIC(&cfg->data) && L->steps > L->start)
        printf(" (the synthetic chain's entropy, the lowest reachable, is %.2f)",
               zn_tokens_synthetic_entropy());
    if (L->last_eval_n)
        printf("\neval loss %.4f, perplexity %.3f, over %llu targets of %s", L->last_eval,
               exp(L->last_eval), (unsigned long long)L->last_eval_n, cfg->data.eval_path);
    printf("\n\n");
    zn_train_print_report(ts->tr, stdout);
    if (trace_path) {
        int r2 = zn_train_write_trace(ts->tr, trace_path);
        if (r2)
            rc = zn_cli_fail(r2, "trace");
        else
            printf("trace: %s (open in https://ui.perfetto.dev or chrome://tracing)\n",
                   trace_path);
    }
    if (ts->rank == 0 && !L->stop_sig && L->steps > L->start)
        say_cost_vs_run(ts, cfg);
    return rc;
}

/* After a stop signal: every rank removes its files and says so before
 * any rank exits: mpirun ends the whole job at the first non-zero exit,
 * and a rank killed by it then would leave its swap files and no word.
 * `saved`: whether the run ended without a failure (its checkpoint, with
 * train.checkpoint.dir, written). */
static void say_stopped(train_loop *L, bool saved)
{
    const zn_config_checkpoint *cc = &L->cfg->train.checkpoint;
    zn_run_free_trainer(L->ts);   /* the swap files go here */
    char ck[ZN_PATH_MAX + 64] = "";
    if (cc->dir[0] && saved)
        snprintf(ck, sizeof ck, ", checkpoint %s in %s",
                 L->sv.saved_at == L->steps ? "saved" : "of an earlier step kept", cc->dir);
    fprintf(stderr, "zinc: %s%s: stopped after step %lld%s%s, swap files removed, %.1f s "
            "after %s (exit %d)\n", strsignal(L->stop_sig),
            zn_cli_stop_by_peer() ? " on another rank" : "", (long long)L->steps, ck,
            cc->dir[0] ? "" : " (no train.checkpoint.dir: nothing saved)",
            zn_cli_stop_since_s(), zn_cli_stop_by_peer() ? "this rank learned of it" : "the signal",
            128 + L->stop_sig);
    fflush(stderr);
    int brc = zn_run_barrier(L->ts);
    if (brc)
        fprintf(stderr, "zinc: warning: the ranks did not meet before exiting (%s): a rank "
                "may have ended first\n", zn_last_error());
}

/* The end of the steps: the final save, the files closed, the report and,
 * after a stop signal, its word. Returns the exit code: 128 + the signal,
 * 1 after a failure (printed), or 0. */
static int finish_run(train_loop *L, int rc, const char *trace_path)
{
    const zn_config_checkpoint *cc = &L->cfg->train.checkpoint;
    if (!rc && cc->dir[0] && L->steps > L->start && !L->dropped) {
        /* no step follows: a rank whose optimizer state is on NVMe links
         * its swap file into the checkpoint instead of copying it */
        L->sv.so.final_save = cc->in_place;
        rc = zn_cli_save(&L->sv, L->steps);   /* settles the one in the background first */
    }
    if (L->sv.commits)
        printf("%lld steps committed in place: the longest commit %.3f s from its start (its "
               "step's update landing included) to its end, the longest one's own work (link, "
               "references, manifest, fsyncs) %.3f s\n", (long long)L->sv.commits,
               L->sv.commit_s_max, L->sv.commit_busy_max);
    zn_cli_saver_fini(&L->sv);
    if (L->jf)
        fclose(L->jf);
    L->jf = NULL;
    zn_tb_close(L->tb);
    L->tb = NULL;
    zn_csvmon_close(L->cm);
    L->cm = NULL;
    if (!rc)
        rc = print_result(L, trace_path);
    if (!L->stop_sig)
        return rc ? 1 : 0;
    say_stopped(L, !rc);
    return 128 + L->stop_sig;
}

/* The run of su's config: opened, resumed, its header, the steps and the
 * end. Closes su->ck. Returns the exit code. */
static int run_job(train_args *a, train_setup *su)
{
    zn_run ts;
    train_loop L;
    memset(&L, 0, sizeof L);
    L.ts = &ts;
    L.cfg = &su->cfg;
    L.cfg_text = su->cfg_text;
    int code = 1;
    zn_cli_stop_install();
    double t_setup = zn_now_s();
    if (open_run(&L, a, su->ck != NULL))
        goto done;
    if (su->ck && load_resume(&L, &su->ck))
        goto done;
    zn_train_report rep;
    zn_train_get_report(ts.tr, &rep);
    print_header(&ts, L.cfg, a->path, &rep, t_setup);

    L.steps = L.cfg->train.steps;
    L.every = L.cfg->train.log_every > 0 ? L.cfg->train.log_every : 1;
    L.t0 = L.t_last = zn_now_s();
    L.first_loss = L.last_loss = L.last_eval = NAN;
    L.prev = rep;
    zn_cli_saver_init(&L.sv, &ts, L.cfg, L.cfg_text, L.start);
    snprintf(L.sv.resumed, sizeof L.sv.resumed, "%s", L.resumed);
    /* one rank: a stop signal ends the step in progress before its
     * update, whose state a checkpoint then keeps */
    if (ts.world == 1 && !zn_train_set_stop(ts.tr, zn_cli_stop_flag()))
        zn_cli_stop_mode(true);
    if (open_monitors(&L))
        goto done;
    code = finish_run(&L, train_steps(&L), a->trace_path);
done:
    zn_cli_saver_fini(&L.sv);   /* before the trainer goes */
    zn_run_close(&ts);   /* the swap files go here (on a stop, in say_stopped) */
    zn_ckpt_close(su->ck);
    su->ck = NULL;
    if (L.jf)
        fclose(L.jf);
    return code;
}

int zn_cmd_train(int argc, char **argv)
{
    train_args a;
    int code = parse_args(argc, argv, &a);
    if (code != TRAIN_GO_ON)
        return code;
    train_setup su;
    if ((code = load_config(&a, &su)) != TRAIN_GO_ON)
        return code;
    code = run_job(&a, &su);
    free(su.cfg_text);
    /* the recipe's outputs (its adapter or model, the loss picture), after
     * a run that ended well */
    if (su.recipe && code == 0 && zn_cli_recipe_finish(su.recipe, a.json_path, su.cfg.bf16))
        code = 1;
    free(su.recipe);
    return code;
}
