/* `zinc bench train --config FILE`: the flags and the report of a few
 * training steps after a warm-up, the step time against the busiest
 * resource's busy time measured in the same run (src/bench/train.c
 * measures), nccl-tests style, --csv for files. */
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "cli/cli.h"
#include "zinc/bench.h"
#include "zinc/run.h"
#include "zinc/nvme.h"
#include "zinc/topo.h"
#include "zinc/train.h"
#include "zinc/zinc.h"
#include "zn_build_config.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: zinc bench train --config FILE [--set KEY=VALUE]... [--steps N] [--warmup N]\n"
        "                        [--csv FILE] [--trace FILE]\n"
        "\n"
        "Runs --warmup steps (default 1), then --steps (default 4) training steps and\n"
        "prints the mean step time, each resource's busy time and the ratio of the step\n"
        "time to the busiest one (target <= 1.15).\n");
}

int zn_cli_bench_train(int argc, char **argv)
{
    const char *sets[64];
    int n_sets;
    argc = zn_cli_take_sets(argc, argv, sets, 64, &n_sets);
    if (argc < 0)
        return 2;
    const char *path = NULL, *csv = NULL, *trace = NULL;
    long steps = 4, warmup = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            path = argv[++i];
        } else if (!strcmp(argv[i], "--csv") && i + 1 < argc) {
            csv = argv[++i];
        } else if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
            trace = argv[++i];
        } else if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            steps = strtol(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
            warmup = strtol(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "zinc: error: bench train: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (steps < 1 || warmup < 0) {
        fprintf(stderr, "zinc: error: bench train: --steps >= 1 and --warmup >= 0\n");
        return 2;
    }
    zn_config cfg;
    int rc = path ? zn_config_load(&cfg, path, sets, n_sets)
                  : zn_config_parse(&cfg, zn_cli_default_config(),
                                    "(embedded examples/tiny.json)", sets, n_sets);
    if (rc)
        return zn_cli_fail(rc, NULL);
    cfg.train.steps = warmup + steps;
    zn_run ts;
    if ((rc = zn_run_open(&ts, &cfg, trace ? ZN_RUN_TRACE : 0, stdout))) {
        zn_cli_fail(rc, NULL);
        zn_cli_end_job(zn_run_abort(&ts, 1), 1);
        zn_run_close(&ts);
        return 1;
    }

    zn_topo topo;
    memset(&topo, 0, sizeof topo);
    zn_topo_discover(&topo);
    struct utsname un;
    uname(&un);
    zn_train_report r;
    zn_train_get_report(ts.tr, &r);
    printf("# zinc bench train: %s\n", path ? path : "(embedded examples/tiny.json)");
    printf("# machine: %s, %d cores / %d threads, %.1f GiB RAM; %s %s\n", topo.cpu_model,
           topo.cores, topo.pus, (double)topo.mem_total / (1 << 30), un.sysname, un.release);
    printf("# zinc %s; device %s (params %s); Adam %s; %s\n", ZN_VERSION, r.backend,
           r.param_dtype, zn_adam_isa_name(),
           zn_train_aio(ts.tr) ? zn_aio_backend_desc(zn_train_aio(ts.tr)) : "no NVMe state");
    const zn_plan *plan = zn_train_get_plan(ts.tr);
    printf("# model %.2fM params, micro-batch %lld x seq %lld x accumulation %lld; params -> %s "
           "(%s of them on NVMe), optimizer -> %s, grads -> %s; %d param slots, %d optimizer "
           "units of %llu (%d in flight), %s\n",
           (double)ts.params / 1e6, (long long)cfg.train_micro_batch_size_per_gpu,
           (long long)cfg.data.seq_len, (long long)cfg.gradient_accumulation_steps,
           zn_offload_device_name(cfg.zero.offload_param.device),
           plan->bytes[ZN_STATE_PARAMS][ZN_TIER_NVME] ? "some or all" : "none",
           zn_offload_device_name(cfg.zero.offload_optimizer.device),
           zn_tier_name(plan->grads_tier), r.param_slots,
           r.opt_units, (unsigned long long)r.opt_unit, r.opt_inflight,
           cfg.gradient_clipping > 0 || cfg.fp16.enabled
               ? "step after the global norm, under the next forward"
               : "step overlapped with backward and the next forward");
    printf("# path measured: one optimizer step = fwd + bwd over all micro-batches + %s Adam "
           "by sub-group, all offload traffic included; %ld warm-up step(s) not counted\n",
           cfg.zero.offload_optimizer.device == ZN_OFFLOAD_NONE ? "device" : "CPU", warmup);
    printf("# ceiling: the busiest resource's busy time in the same steps (each resource is "
           "one stream or thread); ratio = step / busiest (target <= 1.15)\n");
    printf("# #wrong: non-finite losses or gradient norms, and non-finite master weights "
           "read back after the run\n");

    zn_bench_train_result res;
    if ((rc = zn_bench_train_steps(&ts, warmup, steps, &res))) {
        zn_cli_fail(rc, NULL);
        zn_run_close(&ts);
        return 1;
    }
    r = res.report;
    uint64_t wrong = res.wrong;
    int busiest = res.busiest;
    double step_s = res.step_s, busy = res.busy_s, ratio = res.ratio;
    printf("# loss %.4f -> %.4f over the run\n", res.loss_first, res.loss_last);
    if (r.param_cache_entries)
        printf("# param cache: %d buffers served %.1f block fetches per step (%.1f MB) "
               "instead of NVMe\n", r.param_cache_entries,
               (double)r.param_cache_hits / (double)r.steps,
               (double)r.param_cache_bytes / (double)r.steps * 1e-6);
    if (r.speculative)
        printf("# speculative step: %.1f units per step stepped before the global norm, %.1f "
               "committed as they were, %.1f stepped again (clipping); %.1f param cache blocks "
               "a step filled by them\n",
               (double)r.spec_units / (double)r.steps, (double)r.spec_commits / (double)r.steps,
               (double)r.spec_redos / (double)r.steps, (double)r.spec_cache_fills / (double)r.steps);
    else
        printf("# speculative step: off\n");
    printf("#\n");
    printf("# %-6s %10s %-18s %10s %7s", "steps", "step ms", "busiest", "busy ms", "ratio");
    for (int i = 0; i < ZN_RES_COUNT; i++) {
        char h[16];
        snprintf(h, sizeof h, "%.9s ms", zn_train_resource_name((zn_train_resource)i));
        printf(" %12s", h);
    }
    printf(" %10s %7s\n", "tok/s", "#wrong");
    printf("  %-6lld %10.1f %-18s %10.1f %7.2f", (long long)r.steps, step_s * 1e3,
           zn_train_resource_name((zn_train_resource)busiest), busy * 1e3, ratio);
    for (int i = 0; i < ZN_RES_COUNT; i++)
        printf(" %12.1f", r.busy_s[i] / (double)r.steps * 1e3);
    printf(" %10.0f %7llu\n", res.tokens_s, (unsigned long long)wrong);
    if (csv) {
        FILE *f = fopen(csv, "a");
        if (!f) {
            rc = zn_cli_fail(-1, "csv");
        } else {
            fseek(f, 0, SEEK_END);
            if (ftell(f) == 0) {
                fprintf(f, "config,params_dev,params_nvme_MB,opt_dev,grads,gradient_clipping,steps,"
                           "step_ms,busiest,busiest_ms,ratio");
                /* columns in the order they were added (older files keep
                 * their header; rows of a new column are empty before it) */
                for (int i = 0; i < ZN_RES_NVME; i++)
                    fprintf(f, ",busy_%d_ms", i);
                fprintf(f, ",param_wait_ms,tok_s,h2d_GBs,d2h_GBs,nvme_read_GBs,nvme_write_GBs,"
                           "wrong,param_cache,param_cache_hits_per_step,nvme_rw_busy_ms\n");
            }
            fprintf(f, "%s,%s,%.3f,%s,%s,%g,%lld,%.3f,%s,%.3f,%.4f", path ? path : "(embedded)",
                    zn_offload_device_name(cfg.zero.offload_param.device),
                    (double)plan->bytes[ZN_STATE_PARAMS][ZN_TIER_NVME] * 1e-6,
                    zn_offload_device_name(cfg.zero.offload_optimizer.device),
                    zn_tier_name(plan->grads_tier), cfg.gradient_clipping,
                    (long long)r.steps, step_s * 1e3,
                    zn_train_resource_name((zn_train_resource)busiest), busy * 1e3, ratio);
            for (int i = 0; i < ZN_RES_NVME; i++)
                fprintf(f, ",%.3f", r.busy_s[i] / (double)r.steps * 1e3);
            fprintf(f, ",%.3f,%.0f,%.3f,%.3f,%.3f,%.3f,%llu,%d,%.2f,%.3f\n",
                    r.param_wait_s / (double)r.steps * 1e3, (double)r.tokens / r.step_s,
                    (double)r.h2d_bytes / r.step_s * 1e-9, (double)r.d2h_bytes / r.step_s * 1e-9,
                    (double)r.nvme_read_bytes / r.step_s * 1e-9,
                    (double)r.nvme_write_bytes / r.step_s * 1e-9, (unsigned long long)wrong,
                    r.param_cache_entries, (double)r.param_cache_hits / (double)r.steps,
                    r.busy_s[ZN_RES_NVME] / (double)r.steps * 1e3);
            fclose(f);
        }
    }
    /* the cost model against this run: its traffic per step, then time */
    const __typeof__(plan->step) *ps = &plan->step;
    double ns = (double)r.steps;
    printf("# traffic per step, planned / measured: h2d %.2f / %.2f MB, d2h %.2f / %.2f MB, "
           "nvme read %.2f / %.2f MB, nvme write %.2f / %.2f MB\n", (double)ps->h2d * 1e-6,
           (double)r.h2d_bytes / ns * 1e-6, (double)ps->d2h * 1e-6,
           (double)r.d2h_bytes / ns * 1e-6, (double)ps->nvme_read * 1e-6,
           (double)r.nvme_read_bytes / ns * 1e-6, (double)ps->nvme_write * 1e-6,
           (double)r.nvme_write_bytes / ns * 1e-6);
    if (trace && (rc = zn_train_write_trace(ts.tr, trace)))
        zn_cli_fail(rc, "trace");
    zn_cost pred;
    int predicted;
    int prc = zn_bench_train_predict(&ts, &cfg, &pred, stdout, &predicted);
    if (predicted && (prc == 0 || prc == ZN_EARG))
        zn_run_cost_print_vs(&pred, &r, ts.world, stdout);
    if (prc)
        fprintf(stderr, "zinc: warning: no prediction: %s\n", zn_last_error());
    zn_run_close(&ts);
    return rc || wrong ? 1 : 0;
}
