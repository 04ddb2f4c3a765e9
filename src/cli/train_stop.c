/* zinc train's stop on a signal: the handlers, the ranks agreeing to stop
 * after the same step, and the notice at start of what a stop costs.
 * cmd_train.c runs the loop; this file owns the signal state. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "zinc/nvme.h"
#include "zinc/run.h"
#include "zinc/train.h"

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

void zn_cli_stop_install(void)
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
void zn_cli_stop_notice(zn_run *ts, const zn_config *cfg, const zn_plan *plan, double step_s)
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

double zn_cli_stop_since_s(void)
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
int zn_cli_ranks_stop(zn_run *ts)
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

int zn_cli_stop_signal(void)
{
    return (int)g_stop_sig;
}

bool zn_cli_stop_by_peer(void)
{
    return g_stop_by_peer;
}
