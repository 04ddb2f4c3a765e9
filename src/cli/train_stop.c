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
 * SIGTERM (a spot instance's notice), SIGINT (Ctrl-C) and SIGUSR1: one
 * rank ends the step in progress before its optimizer update begins
 * (zn_train_set_stop; once the update has begun the step runs to its end);
 * ranks finish it and agree to stop after the same step. A checkpoint of
 * the state is completed when train.checkpoint.dir is set (the one being
 * written in the background, or a save), the swap files go, and zinc exits with 128 + the signal's number
 * (143 for SIGTERM, 130 for SIGINT, 138 for SIGUSR1). A second signal ends
 * the run at once: the swap files are unlinked in the handler, then the
 * signal is raised again with its default action. */
static volatile sig_atomic_t g_stop_sig;
static struct timespec g_stop_ts;
/* what the handler says (zn_cli_stop_mode): one rank stops inside the step
 * (zn_train_set_stop), ranks after it */
static const char msg_after_step[] = "\nzinc: signal received: finishing the step in progress, "
                                     "then saving and cleaning up (a second signal stops at "
                                     "once)\n";
static const char msg_in_step[] = "\nzinc: signal received: stopping the step in progress "
                                  "before its update (the state stays the last step's), then "
                                  "saving and cleaning up (a second signal stops at once)\n";
static const char *volatile g_stop_msg = msg_after_step;

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
    const char *msg = g_stop_msg;
    ssize_t w = write(2, msg, strlen(msg));
    (void)w;
}

void zn_cli_stop_mode(bool in_step)
{
    g_stop_msg = in_step ? msg_in_step : msg_after_step;
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

/* The optimizer chain of one step (the cost model's, from the figures
 * cached for this machine: nothing is measured with the trainer open), which
 * a stop waits for when it runs under the next step; 0 when the cache lacks
 * what it needs. */
double zn_cli_stop_update_s(const zn_config *cfg, const zn_model_dims *d, const zn_plan *plan)
{
    zn_cost c;
    int rc = zn_run_predict(cfg, d, plan, ZN_CEIL_CACHED, &c, NULL);
    return (rc == 0 || rc == ZN_EARG) && c.opt_s > 0 && c.opt_s < 1e9 ? c.opt_s : 0;
}

/* What a signal would cost this run, said after its first step: the stop
 * (the step in progress stopped or, with ranks, finished; the checkpoint's
 * writes) and how old the checkpoint it leaves can be, from
 * zn_run_stop_estimate; with saves in the background also what one costs
 * against the step. A save of under 1 GiB takes seconds on any disk, so
 * only larger ones are measured (the disks, once per file system, cached
 * with the cost model's figures). The estimate is kept for the stop
 * (zn_cli_stop_finish_s). */
static zn_stop_estimate g_est;
static bool g_have_est;
static double g_step_s;      /* the step time the commit line counted (several ranks) */

void zn_cli_stop_notice(zn_run *ts, const zn_config *cfg, const zn_plan *plan, double step_s)
{
    uint64_t per_rank = 0;
    for (int t = 0; t < ZN_TIER_COUNT; t++)
        per_rank += plan->bytes[ZN_STATE_MASTER][t] + plan->bytes[ZN_STATE_ADAM_M][t] +
                    plan->bytes[ZN_STATE_ADAM_V][t];
    if (per_rank * (uint64_t)(ts->local_size > 0 ? ts->local_size : 1) < ((uint64_t)1 << 30))
        return;
    zn_stop_estimate e;
    int rc = zn_run_stop_estimate(cfg, plan, ts->world, ts->local_size, step_s,
                                  zn_cli_stop_update_s(cfg, &ts->dims, plan), true, &e, stdout);
    if (rc) {
        fprintf(stderr, "zinc: warning: no estimate of the time a stop on SIGTERM takes: %s\n",
                zn_last_error());
        return;
    }
    g_est = e;
    g_have_est = true;
    g_step_s = step_s;
    const zn_config_checkpoint *cc = &cfg->train.checkpoint;
    zn_cli_stop_print(&e, cfg, ts->world, step_s, stdout);
    fflush(stdout);
    if (e.stop_s > cc->notice_s)
        fprintf(stderr, "zinc: warning: a stop on SIGTERM takes about %.0f s, longer than the "
                "%.0f s spot notice of train.checkpoint.notice_s: if the machine goes first, the "
                "run resumes from the last complete checkpoint%s\n", e.stop_s, cc->notice_s,
                e.background ? "" : cc->every > 0
                ? " (optimizer state in the cpu tier with train.checkpoint.every 1 saves in the "
                  "background and stops in seconds)"
                : "; none is set: set train.checkpoint.every");
}

/* After a later step (step_s its time): the longest update measured so
 * far. Where it moves the update's figure by a fifth (and a second) or
 * more from the one said last, the stop's figure is said again with it,
 * and kept for the stop. With every step committed on several ranks the
 * step's own time is what the figure waits for: a step longer by a fifth
 * (and a second) than the one said is said the same way. */
void zn_cli_stop_recheck(zn_run *ts, const zn_config *cfg, double step_s)
{
    if (g_have_est && g_est.commit && ts->world > 1) {
        /* several ranks: the step in progress ends first, and a later step
         * can be longer than the first one the figure took */
        if (!(step_s > g_step_s + 1.0 && step_s > 1.2 * g_step_s))
            return;
        printf("on SIGTERM now: the step in progress ends first (the longest so far %.1f s, "
               "against %.1f s said), then the update still running is dropped: about %.1f s "
               "at most\n", step_s, g_step_s, step_s + g_est.drain_s);
        fflush(stdout);
        g_step_s = step_s;
        return;
    }
    if (!g_have_est || g_est.commit)   /* a commit's stop waits for no update */
        return;
    zn_train_report r;
    zn_train_get_report(ts->tr, &r);
    double u = r.opt_job_max_s, was = g_est.update_s;
    if (!(u > 0) || fabs(u - was) < 1.0 || fabs(u - was) < 0.2 * was)
        return;
    zn_run_stop_set_update(&g_est, cfg, u);
    printf("on SIGTERM now: the last finished step's update, measured here (the longest so "
           "far: %.1f s against %.0f s predicted), lands first; a stop takes about %.0f s at "
           "most\n", u, was, g_est.stop_s);
    fflush(stdout);
}

/* The lines zinc train (after its first step) and zinc plan print. */
void zn_cli_stop_print(const zn_stop_estimate *e, const zn_config *cfg, int world, double step_s,
                       FILE *f)
{
    const zn_config_checkpoint *cc = &cfg->train.checkpoint;
    char b1[32], b2[32];
    if (e->commit) {
        /* several ranks: the step in progress ends first (no rank leaves
         * its collectives), then its update is dropped */
        char ends[96] = "the step in progress ends";
        double at_most = e->drain_s;
        if (world > 1 && step_s > 0) {
            snprintf(ends, sizeof ends, "the step in progress ends (about %.1f s, the first "
                     "step's time)", step_s);
            at_most += step_s;
        }
        fprintf(f, "on SIGTERM %s and the update still running is dropped: every step is "
                "committed in place (%s on NVMe, linked, none of it copied; a resumed run has "
                "its checkpoint until its first commit), so the checkpoint left is the last "
                "committed step, at most one step old: about %.1f s at most (%sthe reads and "
                "writes in flight, of offload_optimizer.buffer_count units, at %.2f GB/s, "
                "%s); a kill at any moment loses at most the steps since the last commit\n",
                world > 1 ? ends : "the step in progress stops before its update",
                zn_format_size(e->inplace_bytes, b2, sizeof b2), at_most,
                world > 1 && step_s > 0 ? "that step, then " : "", e->read_bps / 1e9,
                e->assumed ? "assumed" : "measured");
        if (cc->every > 0)
            fprintf(f, "  (the periodic saves of train.checkpoint.every still copy the state, "
                    "about %.0f s each; with every step committed they only keep older "
                    "steps)\n", e->save_s);
        return;
    }
    fprintf(f, "on SIGTERM %s, then ", world > 1 ? "the step in progress ends" :
            "the step in progress stops before its update");
    if (e->update_s >= 0.5)
        fprintf(f, "the last finished step's update still running lands (about %.0f s), then ",
                e->update_s);
    fprintf(f, "%s (%s", e->background && cc->every == 1
                             ? "the background save of the last step completes"
                             : "the last finished step is saved",
            zn_format_size(e->save_bytes, b1, sizeof b1));
    if (e->inplace_bytes)
        fprintf(f, ", %s of it on NVMe kept in place: the swap file linked into the checkpoint",
                zn_format_size(e->inplace_bytes, b2, sizeof b2));
    else if (e->read_bytes)
        fprintf(f, ", %s read from NVMe at %.2f GB/s", zn_format_size(e->read_bytes, b2, sizeof b2),
                e->read_bps / 1e9);
    fprintf(f, ", written at %.2f GB/s under %s, %s): about %.0f s at most", e->write_bps / 1e9,
            e->disk, e->assumed ? "assumed: not measured yet" : "measured", e->stop_s);
    if (e->age_steps)
        fprintf(f, " (a save with more than half of the %.0f s notice left is dropped: the "
                "checkpoint left is then one step old)", cc->notice_s);
    else
        fprintf(f, "; the checkpoint left is the last finished step");
    fprintf(f, "\n");
    double half = cc->notice_s / 2;
    if (e->background && step_s > 0)
        fprintf(f, "checkpoints in the background: %s written in about %.1f s a save, under the "
                "next step (%.1f s)%s\n", b1, e->save_s, step_s,
                e->save_s > step_s * (double)cc->every
                ? "; longer: the next update waits for the rest" : "");
    else if (e->cpu_state && cc->every != 1)
        fprintf(f, "  (with train.checkpoint.every 1 each step's save is written in the "
                "background, about %.0f s of writes under the next step, and a stop takes at "
                "most %.0f s, leaving a checkpoint at most one step old)\n", e->save_s,
                e->save_s < half ? e->save_s : half);
    else if (e->inplace_bytes && cc->every > 0 && world > 1)
        fprintf(f, "  (a periodic save copies the state, about %.0f s; a stop during one "
                "cancels it on the ranks the signal reaches, the others finish their part "
                "first, and the stop's own save keeps the state in place)\n", e->save_s);
    else if (e->inplace_bytes && cc->every > 0)
        fprintf(f, "  (a periodic save copies the state, about %.0f s; a stop during one "
                "cancels it and saves in place)\n", e->save_s);
    else if (e->read_bytes && !e->inplace_bytes)
        fprintf(f, "  (the state on NVMe is read back and copied: to keep it in place, put the "
                "checkpoint folder on the swap folder's file system, with one NVMe path)\n");
}

/* Whether the background save in progress (`left` bytes still to write)
 * should complete on a stop: what is left fits half the notice at `bps`
 * (the rate the last save went at; 0: the disk's measured one; neither: a
 * save under 1 GiB, which does). */
bool zn_cli_stop_finish_save(const zn_config *cfg, uint64_t left, double bps, double *secs)
{
    if (!(bps > 0))
        bps = g_have_est ? g_est.write_bps : 0;
    *secs = bps > 0 ? (double)left / bps : 0;
    return cfg->train.checkpoint.notice_s <= 0 || *secs <= cfg->train.checkpoint.notice_s / 2;
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

const volatile sig_atomic_t *zn_cli_stop_flag(void)
{
    return &g_stop_sig;
}

int zn_cli_stop_signal(void)
{
    return (int)g_stop_sig;
}

bool zn_cli_stop_by_peer(void)
{
    return g_stop_by_peer;
}
