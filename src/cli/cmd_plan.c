/* `zinc plan CONFIG`: the model's training state by class and tier, against
 * the config's budgets. Exit 0 when it fits, 1 when it does not (with what
 * is short and the setting that would fix it), 2 on bad usage. */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/cli.h"
#include "zinc/train.h"
#include "zinc/zinc.h"

int zn_cli_take_sets(int argc, char **argv, const char **sets, int max_sets, int *n_sets)
{
    int out = 1;
    *n_sets = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--set")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "zinc: error: --set needs KEY=VALUE\n");
                return -1;
            }
            v = argv[++i];
        } else if (!strncmp(argv[i], "--set=", 6)) {
            v = argv[i] + 6;
        }
        if (v) {
            if (*n_sets >= max_sets) {
                fprintf(stderr, "zinc: error: more than %d --set options\n", max_sets);
                return -1;
            }
            sets[(*n_sets)++] = v;
            continue;
        }
        argv[out++] = argv[i];
    }
    return out;
}

/* The swap folders, each with the folder it resolves to when that is not
 * the path as written: a symbolic link (the path's own, or one of its
 * parents') is followed, and said, so that a swap that is not where the user
 * thinks shows before anything is written there. */
void zn_cli_print_swap_paths(FILE *f, const zn_config *cfg, const char *label)
{
    const char *p[ZN_MAX_NVME_PATHS + 2];
    int n = zn_config_nvme_paths(cfg, p, ZN_MAX_NVME_PATHS + 2);
    char cwd[ZN_PATH_MAX] = "";
    if (!getcwd(cwd, sizeof cwd))
        cwd[0] = '\0';
    fprintf(f, "%s", label);
    for (int i = 0; i < n; i++) {
        char real[PATH_MAX], abs[2 * ZN_PATH_MAX + 2];
        struct stat st;
        snprintf(abs, sizeof abs, "%s%s%s", p[i][0] == '/' ? "" : cwd,
                 p[i][0] == '/' ? "" : "/", p[i]);
        fprintf(f, "%s %s", i ? "," : "", p[i]);
        if (!lstat(p[i], &st) && S_ISLNK(st.st_mode) && realpath(p[i], real))
            fprintf(f, " -> %s (a symbolic link)", real);
        else if (realpath(p[i], real) && strcmp(real, abs))
            fprintf(f, " (%s, through a symbolic link)", real);
        else if (stat(p[i], &st) && errno == ENOENT)
            fprintf(f, " (missing: the run creates it, tiers.create_nvme_path)");
    }
    fprintf(f, "\n");
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: zinc plan CONFIG [--model DIR] [--data FILE] [--set KEY=VALUE]... [--world N] [--print-config]\n"
        "                 [--detail] [--tune [--write FILE]] [--target NAME] [--recalibrate]\n"
        "\n"
        "Places the model's training state (16-bit params, fp32 master, Adam m and v,\n"
        "gradients, checkpointed activations, working buffers) into the tiers of\n"
        "CONFIG (a DeepSpeed-style JSON file) and prints bytes per class and tier.\n"
        "Exits 1 when it does not fit, naming what is short and the fix.\n"
        "  --model DIR       an HF model folder (config.json) = --set model.path=DIR\n"
        "  --data FILE       its token file (= --set data.path=FILE), checked as a run\n"
        "                    checks it; \"synthetic\": the built-in set\n"
        "  --set KEY=VALUE   override a config key (e.g. tiers.gpu=24GiB)\n"
        "  --world N         ranks sharing the state (ZeRO); default 1\n"
        "  --print-config    print the fully resolved config as JSON (\"auto\" and\n"
        "                    defaults filled in)\n"
        "  --detail          list every allocation the run makes (what, tier, count)\n"
        "  --tune            rank the placements that fit (params, optimizer and gradients\n"
        "                    on gpu/cpu/nvme, micro-batch against accumulation at the same\n"
        "                    global batch, cpu checkpointing) by the predicted step time\n"
        "  --write FILE      with --tune: write the fastest as a config (JSON), each\n"
        "                    chosen value's origin under \"_tune\"\n"
        "  --target NAME     predict for another machine (a10, h100, h200: figures from\n"
        "                    datasheets and public measurements, cited) instead of this\n"
        "                    one; \"auto\" precision and tiers.gpu resolve as there\n"
        "  --recalibrate     measure this machine's ceilings again (else they come from\n"
        "                    the cache zinc keeps: ZINC_CACHE_DIR, XDG_CACHE_HOME/zinc or\n"
        "                    ~/.cache/zinc)\n");
}

/* --model DIR of train and plan: the same as --set model.path=DIR, after
 * the other --sets. Returns 0, or 2 after printing the usage error. */
int zn_cli_model_set(const char *dir, const char **sets, int max_sets, int *n_sets)
{
    static char model_set[ZN_PATH_MAX + 16];
    if (*n_sets >= max_sets ||
        (size_t)snprintf(model_set, sizeof model_set, "model.path=%s", dir) >= sizeof model_set) {
        fprintf(stderr, "zinc: error: --model %s: too long, or too many --set\n", dir);
        return 2;
    }
    sets[(*n_sets)++] = model_set;
    return 0;
}

/* --data FILE of train and plan: the same as --set data.path="FILE"
 * ("synthetic": the built-in set, on purpose). */
int zn_cli_data_set(const char *file, const char **sets, int max_sets, int *n_sets)
{
    static char data_set[ZN_PATH_MAX + 16];
    if (*n_sets >= max_sets || strchr(file, '"') || strchr(file, '\\') ||
        (size_t)snprintf(data_set, sizeof data_set, "data.path=\"%s\"", file) >= sizeof data_set) {
        fprintf(stderr, "zinc: error: --data %s: too long, quoted, or too many --set\n", file);
        return 2;
    }
    sets[(*n_sets)++] = data_set;
    return 0;
}

/* The plan `zinc plan` prints, for a config and --sets on `world` ranks:
 * loaded, "auto" resolved (printed on `note`; with print_cfg the resolved
 * config as JSON on stdout), the model, data and weights checked as a run
 * checks them, the budgets of this machine (gpu_free: a target's GPU memory
 * instead of this machine's, 0: this machine's), and the trainer's own
 * allocation run dry. Returns 0, ZN_ENOFIT (plan filled, plan->why says
 * what is short) or an error. */
int zn_cli_plan_config(const char *path, const char **sets, int n_sets, int world,
                       uint64_t gpu_free, FILE *note, bool print_cfg, zn_config *cfg,
                       zn_model_dims *d, zn_plan *plan, zn_plan_input *in)
{
    memset(plan, 0, sizeof *plan);
    int rc = zn_config_load(cfg, path, sets, n_sets);
    if (rc || (rc = zn_run_effective(cfg, world, note)))
        return rc;
    if (print_cfg) {
        char *s = zn_config_dump(cfg);
        if (s)
            printf("%s\n", s);
        free(s);
    }
    if ((rc = zn_run_model_dims(cfg, d)) || (rc = zn_run_check_data(cfg, d, 0)) ||
        (rc = zn_run_check_weights(cfg, d)) < 0)
        return rc;
    if (rc == 1 && note)
        fprintf(note, "  note       %s holds config.json and no weights: planned from its "
                "shapes alone (zinc train needs the weights, or model.init=random)\n",
                cfg->model.path);
    rc = 0;
    zn_topo topo;
    if ((rc = zn_topo_discover(&topo)))
        return zn_error_prefix(rc, "topology");
    zn_plan_budgets budgets;
    if ((rc = zn_run_budgets(cfg, &topo, gpu_free ? gpu_free : zn_run_gpu_free(cfg), &budgets)) ||
        (rc = zn_run_check_budgets(cfg, &topo, &budgets, 0)))
        return rc;
    int nb = zn_model_num_parts(d);
    uint64_t *blocks = calloc((size_t)nb, sizeof *blocks);
    if (!blocks)
        return zn_set_error(-12, "out of memory");
    zn_run_plan_input(cfg, d, world, blocks, in);
    /* the plan the run allocates from: the trainer's own allocation code,
     * run dry, for rank 0 of `world` */
    zn_train_llama *ll = NULL;
    rc = zn_train_llama_create(&ll, d, cfg->train_micro_batch_size_per_gpu, cfg->data.seq_len,
                               cfg->model.init_std, cfg->model.seed);
    if (!rc) {
        zn_train_llama_set_attention(ll, cfg->train.attention);
        zn_spec *sp = calloc(1, sizeof *sp);
        zn_train_options to = zn_train_options_default();
        to.spec = sp;
        to.model = zn_train_llama_model(ll);
        rc = sp ? zn_run_spec(cfg, in, &budgets, sp) : zn_set_error(-12, "out of memory");
        if (!rc)
            rc = zn_run_fit_optimizer(cfg, sp, &to, world, note);
        if (rc >= 0)
            rc = zn_train_plan(plan, &to, world);
        free(sp);
    }
    zn_train_llama_destroy(ll);
    free(blocks);
    /* the plan input points into blocks: callers use only its scalars */
    in->block_params = NULL;
    return rc;
}

int zn_cmd_plan(int argc, char **argv)
{
    const char *sets[64];
    int n_sets;
    argc = zn_cli_take_sets(argc, argv, sets, 64, &n_sets);
    if (argc < 0)
        return 2;
    const char *path = NULL;
    int world = 1;
    bool print_cfg = false, detail = false, tune = false, recal = false;
    const char *target = NULL, *write = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--world") && i + 1 < argc) {
            char *end;
            long w = strtol(argv[++i], &end, 10);
            if (*end || w < 1 || w > 65536) {
                fprintf(stderr, "zinc: error: --world %s: expected a rank count 1..65536\n",
                        argv[i]);
                return 2;
            }
            world = (int)w;
        } else if (!strcmp(argv[i], "--print-config")) {
            print_cfg = true;
        } else if (!strcmp(argv[i], "--detail")) {
            detail = true;
        } else if (!strcmp(argv[i], "--tune")) {
            tune = true;
        } else if (!strcmp(argv[i], "--recalibrate")) {
            recal = true;
        } else if (!strcmp(argv[i], "--target") && i + 1 < argc) {
            target = argv[++i];
        } else if (!strcmp(argv[i], "--write") && i + 1 < argc) {
            write = argv[++i];
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            if (zn_cli_model_set(argv[++i], sets, 64, &n_sets))
                return 2;
        } else if (!strcmp(argv[i], "--data") && i + 1 < argc) {
            if (zn_cli_data_set(argv[++i], sets, 64, &n_sets))
                return 2;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "zinc: error: plan: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (!path) {
            path = argv[i];
        } else {
            fprintf(stderr, "zinc: error: plan: one CONFIG only ('%s' is extra)\n", argv[i]);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }

    if (write && !tune) {
        fprintf(stderr, "zinc: error: plan: --write goes with --tune\n");
        return 2;
    }
    if (tune || target || recal)
        return zn_cli_tune(path, sets, n_sets, world, target, tune, recal, write);
    zn_config cfg;
    zn_model_dims d;
    zn_plan plan;
    zn_plan_input in;
    int rc = zn_cli_plan_config(path, sets, n_sets, world, 0, print_cfg ? stderr : stdout,
                                print_cfg, &cfg, &d, &plan, &in);
    if (rc && rc != ZN_ENOFIT)
        return zn_cli_fail(rc, NULL);

    char b1[32], b2[32], b3[32];
    printf("plan for %s\n", path);
    double pc = (double)plan.params_total;
    printf("  model        %s, %.2f%s parameters (%lld layers, hidden %lld, heads %lld/%lld, "
           "vocab %lld)\n", zn_model_arch_name(d.arch),
           pc >= 1e9 ? pc / 1e9 : pc / 1e6, pc >= 1e9 ? "B" : "M", (long long)d.n_layers, (long long)d.hidden,
           (long long)d.n_heads, (long long)d.n_kv_heads, (long long)d.vocab);
    int vparts = zn_model_block_parts(&d, 0);
    if (vparts > 1)
        printf("  streamed     the %s in %d row parts of at most one layer each (%d blocks in "
               "all)\n", d.tie_embeddings ? "embedding (tied: resident, read as lm_head)"
                                          : "embedding and the lm_head", vparts,
               zn_model_num_parts(&d));
    if (d.lora.r > 0) {
        uint64_t t = zn_model_trainable_count(&d);
        printf("  lora         r %d, alpha %g%s: trainable %llu of %llu parameters (%.4f%%); the "
               "base is frozen: no master, optimizer state or gradients\n", d.lora.r,
               d.lora.alpha, d.lora.rslora ? " (rslora)" : "", (unsigned long long)t,
               (unsigned long long)plan.params_total, 100.0 * (double)t / pc);
    }
    printf("  batch        micro %lld x seq %lld, accumulation %lld, world %d (global %lld)\n",
           (long long)cfg.train_micro_batch_size_per_gpu, (long long)cfg.data.seq_len,
           (long long)cfg.gradient_accumulation_steps, world, (long long)cfg.train_batch_size);
    {
        zn_model_config mc = zn_model_config_default(NULL);
        mc.dtype = cfg.bf16 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
        mc.max_seq = cfg.data.seq_len;
        mc.attention = cfg.train.attention;
        int fused = zn_model_attention_fused(&d, &mc);
        printf("  attention    %s", fused ? "fused (score tiles stay in the kernel)"
                                          : "GEMM (scores of 512 queries at a time)");
        if (cfg.train.attention)
            printf(" [train.attention]\n");
        else
            printf(" [auto: GEMM up to %d tokens a sequence, fused beyond]\n",
                   ZN_ATTN_AUTO_FUSED_SEQ);
    }
    printf("  offload      params -> %s, optimizer -> %s, ZeRO stage %d, %s\n",
           zn_offload_device_name(cfg.zero.offload_param.device),
           zn_offload_device_name(cfg.zero.offload_optimizer.device), cfg.zero.stage,
           in.param_bytes == 2 ? (cfg.bf16 ? "bf16" : "fp16") : "fp32");
    printf("  live window  %s of params on the GPU at once (largest block %s); "
           "optimizer sub-group %s\n",
           zn_format_size(plan.live_window * (uint64_t)in.param_bytes, b1, sizeof b1),
           zn_format_size(plan.largest_block * (uint64_t)in.param_bytes, b2, sizeof b2),
           zn_format_size(plan.sub_group * 4, b3, sizeof b3));
    if (plan.tier_total[ZN_TIER_NVME])
        zn_cli_print_swap_paths(stdout, &cfg, "  swap        ");
    printf("\n");
    zn_plan_print(&plan, stdout);
    if (detail) {
        printf("\n");
        zn_plan_print_items(&plan, stdout);
    }
    if (!plan.fits) {
        fprintf(stderr, "\nzinc: error: does not fit: %s\n", plan.why);
        return 1;
    }
    /* the run on this machine's GPU would refuse fp16 compute: so does
     * its plan (on a machine without one, the plan is the host backend's) */
    if (cfg.fp16.enabled && strcmp(cfg.train.device, "host") && zn_run_has_cuda(&cfg)) {
        fprintf(stderr, "\nzinc: error: does not run here: fp16.enabled: zinc computes fp16 on "
                "the host backend only; on this machine's GPU use \"bf16\": {\"enabled\": "
                "true} (or train.device=\"host\")\n");
        return 1;
    }
    /* what a stop on SIGTERM would cost, from the disk figures cached by
     * an earlier run or benchmark on this machine (none measured here) */
    if (cfg.train.checkpoint.dir[0]) {
        zn_stop_estimate se;
        if (!zn_run_stop_estimate(&cfg, &plan, world, 1, 0, zn_cli_stop_update_s(&cfg, &d, &plan),
                                  false, &se, NULL)) {
            printf("\n");
            zn_cli_stop_print(&se, &cfg, world, 0, stdout);
        }
    }
    printf("\nfits.\n");
    return 0;
}
