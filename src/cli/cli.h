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
#include "zinc/run.h"
#include "zinc/train.h"
#include "zinc/ckpt.h"

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} zn_cli_cmd;

/* Prints "zinc: error: <what>: <zn_last_error() or zn_strerror(rc)>" and
 * returns 1. */
int zn_cli_fail(int rc, const char *what);

/* After zn_comm_abort / zn_run_abort returned 1 (MPI): ends the whole job
 * with MPI_Abort(code), which does not return. Only the CLI ends the
 * process; the library reports. */
void zn_cli_end_job(int launcher_must_end, int code);

/* One line: `label`, then the swap folders of cfg (zn_config_nvme_paths),
 * each followed by where it resolves to when a symbolic link leads there,
 * or by a note when it does not exist yet (the run creates it). For the
 * headers of zinc plan and zinc train (cmd_plan.c). */
void zn_cli_print_swap_paths(FILE *f, const zn_config *cfg, const char *label);

/* Top-level commands. */
int zn_cmd_info(int argc, char **argv);
int zn_cmd_plan(int argc, char **argv);
int zn_cmd_bench(int argc, char **argv);
int zn_cmd_train(int argc, char **argv);
int zn_cmd_eval(int argc, char **argv);
int zn_cmd_export(int argc, char **argv);
int zn_cmd_prepare(int argc, char **argv);
int zn_cmd_generate(int argc, char **argv);
int zn_cmd_chat(int argc, char **argv);
int zn_cmd_plot(int argc, char **argv);
int zn_cmd_launch(int argc, char **argv);

/* A run's JSON lines as an SVG picture (cmd_plot.c): loss (and eval loss),
 * lr and tokens/s against the step. 0 or a negative code with the reason
 * in zn_last_error(); the picture appears whole or not at all. */
int zn_cli_plot(const char *jsonl, const char *svg, const char *title);
/* Several runs' logs compared in one picture: their train losses, and each
 * later run's loss relative to the first run's at the steps both have.
 * n == 1 is zn_cli_plot. */
#define ZN_PLOT_MAX_RUNS 8
int zn_cli_plot_runs(const char *const *jsonl, int n, const char *svg, const char *title);

/* Runs scripts/zinc_prepare.py with these arguments (the project's .venv or
 * ZINC_PYTHON) and returns its exit status (1 after printing why it could
 * not run). */
int zn_cli_run_prepare(const char *const *args, int n);

/* `zinc train RECIPE.yaml` (cmd_recipe.c): reads the recipe, makes
 * output_dir, tokenizes its datasets there and returns the recipe with every
 * setting (0), or 1/2 after printing an error; log_path receives
 * output_dir/trainer_log.jsonl. After a successful run, _finish writes the
 * last checkpoint's adapter or model into output_dir and, with plot_loss,
 * the loss picture (rank 0). */
int zn_cli_recipe_open(const char *path, zn_recipe **out, char *log_path, size_t log_len);
int zn_cli_recipe_finish(const zn_recipe *r, const char *log_path, int bf16);

/* `zinc bench <what>` subcommands (bench.c holds the table and what the
 * drivers share); each parses its flags and prints what src/bench/
 * (include/zinc/bench.h) measured. */
/* Opens `path` to append rows, writing `header` (without the newline)
 * first when the file is new. NULL with errno and zn_last_error() set. */
FILE *zn_cli_bench_csv_open(const char *path, const char *header);
/* The end of a bench's getopt switch: -h ('h') prints the usage to stdout
 * and returns 0, anything else prints it to stderr and returns 2 (the
 * exit codes of a bench that stops there). */
int zn_cli_bench_usage_exit(int c, void (*print_usage)(FILE *f));
int zn_cli_bench_pcie(int argc, char **argv);
int zn_cli_bench_nvme(int argc, char **argv);
int zn_cli_bench_adam(int argc, char **argv);
int zn_cli_bench_model(int argc, char **argv);
int zn_cli_bench_train(int argc, char **argv);
int zn_cli_bench_comm(int argc, char **argv);
int zn_cli_bench_cluster(int argc, char **argv);
int zn_cli_bench_load(int argc, char **argv);
int zn_cli_bench_generate(int argc, char **argv);

/* --model DIR of train and plan: appends "model.path=DIR" to sets (after
 * the other --sets). Returns 0, or 2 after printing the usage error. */
int zn_cli_model_set(const char *dir, const char **sets, int max_sets, int *n_sets);
/* --data FILE of train and plan: appends data.path="FILE" ("synthetic": the
 * built-in token set, on purpose). Returns 0, or 2 after the usage error. */
int zn_cli_data_set(const char *file, const char **sets, int max_sets, int *n_sets);

/* The embedded default config (examples/tiny.json's text). */
const char *zn_cli_default_config(void);

/* Parses the options every config-taking command shares: --set KEY=VALUE
 * (repeatable). Other arguments are left in place, compacted to the front
 * of argv; returns the new argc, or -1 after printing a usage error. The
 * override strings point into argv. */
int zn_cli_take_sets(int argc, char **argv, const char **sets, int max_sets, int *n_sets);
/* cmd_plan.c: the plan of a config with --sets (zn_cmd_plan's pipeline) */
int zn_cli_plan_config(const char *path, const char **sets, int n_sets, int world,
                       uint64_t gpu_free, FILE *note, bool print_cfg, zn_config *cfg,
                       zn_model_dims *d, zn_plan *plan, zn_plan_input *in);
/* cmd_tune.c: `zinc plan --tune` / `--target` */
int zn_cli_tune(const char *path, const char **sets, int n_sets, int world, const char *target,
                bool tune, bool recalibrate, const char *write);

/* zinc train's stop on a signal (train_stop.c): installs the SIGTERM /
 * SIGINT / SIGUSR1 handlers; the signal received (0: none), whether the
 * stop came from another rank, the seconds since the signal; every rank's
 * vote to stop after this step (collective: the signal, or 0); and the
 * notice at start of what a stop would cost against a spot notice. */
void zn_cli_stop_install(void);
int zn_cli_stop_signal(void);
bool zn_cli_stop_by_peer(void);
double zn_cli_stop_since_s(void);
int zn_cli_ranks_stop(zn_run *ts);
void zn_cli_stop_notice(zn_run *ts, const zn_config *cfg, const zn_plan *plan, double step_s);
double zn_cli_stop_update_s(const zn_config *cfg, const zn_model_dims *d, const zn_plan *plan);
void zn_cli_stop_recheck(zn_run *ts, const zn_config *cfg, double step_s);
/* The flag the signal handler sets (zn_train_set_stop's), and what the
 * handler says: the step stops inside (one rank) or at its end. */
const volatile sig_atomic_t *zn_cli_stop_flag(void);
void zn_cli_stop_mode(bool in_step);
void zn_cli_stop_print(const zn_stop_estimate *e, const zn_config *cfg, int world, double step_s,
                       FILE *f);
bool zn_cli_stop_finish_save(const zn_config *cfg, uint64_t left, double bps, double *secs);

/* zinc train's saves (train_save.c): at once, or begun in the background
 * (where train.checkpoint.background and the state allow) and completed by
 * the next settle (between steps), which every save and the end call
 * first. Each returns 0, or the failure, reported (0 after a failure with
 * continue_on_error, said). saved_at: the step of the newest complete
 * checkpoint (the run's start before any). */
struct zn_cli_hooks;
typedef struct {
    zn_run *ts;
    const zn_config *cfg;
    const char *cfg_text;
    zn_ckpt_save_options so;
    struct zn_cli_hooks *hooks;   /* so's test hooks (ZINC_CKPT_KILL, ZINC_CKPT_FAULT) */
    bool background;
    struct zn_ckpt_bg *bg;        /* the save in the background, or NULL */
    int64_t bg_step, saved_at;
    bool stopped;                 /* a stop dropped the save in progress: no more saves */
    double write_bps;             /* the slowest rate a background save was written at */
    bool commit;                  /* every step committed by reference (zn_ckpt_commit_start) */
    bool bg_commit;               /* bg is such a commit */
    bool saved_commit;            /* saved_at's checkpoint is one (last_path) */
    int64_t commits;              /* made so far */
    double commit_s_max;          /* the longest, from its start to its end */
    double commit_busy_max;       /* the longest one's own work (after its step's update) */
    char last_path[4200];
    char resumed[ZN_PATH_MAX + 64];  /* the checkpoint the run resumed from ("" none) */
} zn_cli_saver;
void zn_cli_saver_init(zn_cli_saver *sv, zn_run *ts, const zn_config *cfg, const char *cfg_text,
                       int64_t start);
int zn_cli_save(zn_cli_saver *sv, int64_t step);
int zn_cli_save_begin(zn_cli_saver *sv, int64_t step, double pace_s);
int zn_cli_save_settle(zn_cli_saver *sv);
/* The step's commit by reference (sv->commit), completed by the next
 * settle. */
int zn_cli_commit_begin(zn_cli_saver *sv, int64_t step);
/* A stop with every step committed: the update in flight (and the
 * commit waiting for it) is dropped and the newest complete commit is the
 * run's last checkpoint (sealed); *steps gets its step. Returns 1 when
 * done so, 0 when it does not apply (no commit yet: the stop goes the
 * usual way). */
int zn_cli_commit_stop(zn_cli_saver *sv, int64_t *steps);
/* A stop: the save in progress completes unpaced when what is left fits
 * half of train.checkpoint.notice_s, else it is dropped (said) and no
 * later save is made: the newest complete checkpoint stays. */
void zn_cli_save_on_stop(zn_cli_saver *sv);
void zn_cli_saver_fini(zn_cli_saver *sv);   /* drops a save not completed */

#endif
