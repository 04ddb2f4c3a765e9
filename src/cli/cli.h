/* The `zinc` command: one function per subcommand, each taking the argv that
 * follows its name (argv[0] is the subcommand's name). A subcommand returns
 * the process exit code: 0 success, 1 failure (the error already printed),
 * 2 bad usage. */
#ifndef ZN_CLI_H
#define ZN_CLI_H

#include <stdio.h>

#include "zinc/config.h"
#include "zinc/model.h"
#include "zinc/plan.h"
#include "zinc/topo.h"
#include "zinc/train.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} zn_cli_cmd;

/* Prints "zinc: error: <what>: <zn_last_error() or zn_strerror(rc)>" and
 * returns 1. */
int zn_cli_fail(int rc, const char *what);

/* Top-level commands. */
int zn_cmd_info(int argc, char **argv);
int zn_cmd_plan(int argc, char **argv);
int zn_cmd_bench(int argc, char **argv);
int zn_cmd_train(int argc, char **argv);
int zn_cmd_eval(int argc, char **argv);
int zn_cmd_export(int argc, char **argv);
int zn_cmd_prepare(int argc, char **argv);

/* `zinc bench <what>` subcommands (bench.c holds the table). */
int zn_bench_pcie(int argc, char **argv);
int zn_bench_nvme(int argc, char **argv);
int zn_bench_adam(int argc, char **argv);
int zn_bench_model(int argc, char **argv);
int zn_bench_train(int argc, char **argv);
int zn_bench_comm(int argc, char **argv);
int zn_bench_load(int argc, char **argv);

/* cli_model.c: the model a config describes (model.path or dimensions). */
int zn_cli_model_dims(const zn_config *cfg, zn_model_dims *d);
uint64_t zn_cli_persistent_params(const zn_model_dims *d, uint64_t threshold);
uint64_t zn_cli_gpu_free(const zn_config *cfg);
int zn_cli_budgets(const zn_config *cfg, const zn_topo *topo, uint64_t gpu_free,
                   zn_plan_budgets *b);
/* Checks explicit budgets against this machine: tiers.cpu against its RAM,
 * explicit tiers.nvme sizes (summed per file system) against each file
 * system's free space; RLIMIT_MEMLOCK below the cpu budget is a warning.
 * strict (a run): a problem is ZN_ECONFIG naming what the machine has; else
 * (a plan, perhaps for another machine) a warning. */
/* --model DIR of train and plan: appends "model.path=DIR" to sets (after
 * the other --sets). Returns 0, or 2 after printing the usage error. */
int zn_cli_model_set(const char *dir, const char **sets, int max_sets, int *n_sets);
/* Whether the config's train.device is a CUDA GPU that answers here. */
int zn_cli_has_cuda(const zn_config *cfg);
int zn_cli_check_budgets(const zn_config *cfg, const zn_topo *topo, const zn_plan_budgets *b,
                         int strict);
void zn_cli_plan_input(const zn_config *cfg, const zn_model_dims *d, int world,
                       uint64_t *blocks, zn_plan_input *in);

/* effective.c: resolves the config's "auto" values against its model and
 * the device, then the batch keys against `world`, and prints the values
 * that decide the training (optimizer, schedule, clipping, precision, batch,
 * ZeRO, buckets), each with where it came from, to `out` (NULL: silent).
 * Returns 0 or the failing call's code with zn_last_error() set. */
int zn_cli_effective(zn_config *cfg, int world, FILE *out);
/* A config that keeps the optimizer on the GPU (offload_optimizer.device
 * "none", as the HF Trainer's and LLaMA-Factory's ZeRO configs without
 * offload do) on a run that computes on a GPU (on_gpu): zinc's Adam runs
 * on the CPU, so the states go to pinned RAM ("cpu"), and plan and run
 * both say so. Returns 1 when it changed the config, else 0. */
int zn_cli_fit_optimizer(zn_config *cfg, const zn_train_options *o, int world, FILE *note);
void zn_cli_effective_print(const zn_config *cfg, int world, FILE *out);

/* Parses the options every config-taking command shares: --set KEY=VALUE
 * (repeatable). Other arguments are left in place, compacted to the front
 * of argv; returns the new argc, or -1 after printing a usage error. The
 * override strings point into argv. */
int zn_cli_take_sets(int argc, char **argv, const char **sets, int max_sets, int *n_sets);

#endif
