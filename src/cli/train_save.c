/* zinc train's checkpoints: the saves the step loop asks for, in the
 * background where the state allows (the cpu tier: zn_ckpt_save_start,
 * its files written while the next step runs, completed between steps) or
 * at once (zn_ckpt_save), what each records beside the trainer, and the
 * test hooks of the environment. cmd_train.c runs the loop. */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "zinc/ckpt.h"
#include "zinc/run.h"
#include "zinc/tokens.h"

struct zn_cli_hooks {
    char point[32];
    long nth, seen;
    int sig;
    long fault_nth;
    int fault_res;
    _Atomic long fault_seen;
};

/* ---- test hooks (environment): ZINC_CKPT_KILL=POINT[:N[:SIG]] sends SIGKILL
 * (or SIG: TERM, INT or USR1, a stop signal arriving in the middle of a
 * save) to this process at the N-th time a save reaches POINT
 * (zn_ckpt_point_fn);
 * ZINC_CKPT_FAULT=N[:ENOSPC|EIO] fails the N-th block write of the
 * checkpoint engine(s) of this process. ---------------------------------------*/

static void hook_point(void *user, const char *where)
{
    struct zn_cli_hooks *h = user;
    if (h->point[0] && !strcmp(where, h->point) && ++h->seen == h->nth) {
        fflush(NULL);
        raise(h->sig);
    }
}

static int hook_fault(void *user, const zn_aio_fault_site *site)
{
    struct zn_cli_hooks *h = user;
    if (!site->is_write)
        return site->res;
    return atomic_fetch_add(&h->fault_seen, 1) + 1 == h->fault_nth ? h->fault_res : site->res;
}

static void hooks_from_env(struct zn_cli_hooks *h, zn_ckpt_save_options *so)
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


void zn_cli_saver_init(zn_cli_saver *sv, zn_run *ts, const zn_config *cfg, const char *cfg_text,
                       int64_t start)
{
    memset(sv, 0, sizeof *sv);
    sv->ts = ts;
    sv->cfg = cfg;
    sv->cfg_text = cfg_text;
    sv->so = zn_ckpt_save_options_default();
    sv->so.dir = cfg->train.checkpoint.dir;
    sv->so.keep_last = (int)cfg->train.checkpoint.keep_last;
    sv->so.config_text = cfg_text;
    sv->so.dims = &ts->dims;
    sv->hooks = calloc(1, sizeof *sv->hooks);
    if (sv->hooks)
        hooks_from_env(sv->hooks, &sv->so);
    sv->saved_at = start;
    sv->background = cfg->train.checkpoint.background && zn_ckpt_save_background(ts->tr);
    const zn_config_checkpoint *cc = &cfg->train.checkpoint;
    /* (every rank: the ranks agree) */
    sv->commit = cc->dir[0] && cc->commit && cc->in_place &&
                 zn_ckpt_commit_agree(ts->tr, cc->dir);
}

/* A failed save: returns 0 with continue_on_error (said), else the
 * failure, reported. */
static int save_failed(zn_cli_saver *sv, int rc, int64_t step)
{
    if (sv->cfg->train.checkpoint.continue_on_error) {
        fprintf(stderr, "zinc: warning: checkpoint at step %lld failed, training goes on "
                "(train.checkpoint.continue_on_error); the previous checkpoint is intact: %s\n",
                (long long)step, zn_last_error());
        return 0;
    }
    zn_cli_fail(rc, "checkpoint (the previous one is intact; set "
                "train.checkpoint.continue_on_error to train on)");
    return rc;
}

int zn_cli_save(zn_cli_saver *sv, int64_t step)
{
    int rc = zn_cli_save_settle(sv);
    if (rc || sv->stopped)
        return rc;
    if (sv->saved_at == step && sv->saved_commit && sv->so.final_save) {
        /* the step's commit is the final checkpoint: no step follows, so
         * what it does not refer to goes, as a final save's would */
        double t0 = zn_now_s();
        sv->saved_commit = false;
        if ((rc = zn_ckpt_commit_seal(sv->ts->tr, sv->last_path, false, NULL, NULL, 0)))
            fprintf(stderr, "zinc: warning: %s\n", zn_last_error());
        printf("checkpoint %s (step %lld's commit, kept as the final checkpoint: %.2f s)\n",
               sv->last_path, (long long)step, zn_now_s() - t0);
        fflush(stdout);
        return 0;
    }
    if (sv->saved_at == step)
        return 0;
    char *client = client_state(sv->ts, sv->cfg, step);
    sv->so.client_json = client;
    char where[4200];
    double t0 = zn_now_s();
    /* a rank whose final save keeps its NVMe state in place: a stop
     * signal cancels this copy (on every rank: the ranks agree at its end),
     * and the run's final save of the same step takes seconds */
    sv->so.cancel = !sv->so.final_save && sv->cfg->train.checkpoint.in_place &&
                    zn_ckpt_save_keeps_nvme(sv->ts->tr, sv->so.dir) ? zn_cli_stop_flag() : NULL;
    rc = client ? zn_ckpt_save(sv->ts->tr, &sv->so, where, sizeof where)
                : zn_set_error(-ENOMEM, "out of memory");
    free(client);
    sv->so.client_json = NULL;
    sv->so.cancel = NULL;
    /* (a rank the signal did not reach learns of the stop from the step's
     * stop all-reduce right after this) */
    if (rc == -ECANCELED && (zn_cli_stop_signal() || sv->ts->world > 1)) {
        printf("checkpoint of step %lld cancelled by %s after %.2f s: the stop saves it in "
               "place\n", (long long)step, zn_cli_stop_signal() ? "the stop signal"
               : "a stop on another rank", zn_now_s() - t0);
        fflush(stdout);
        return 0;
    }
    if (rc)
        return save_failed(sv, rc, step);
    printf("checkpoint %s (%.2f s)\n", where, zn_now_s() - t0);
    fflush(stdout);
    sv->saved_at = step;
    sv->saved_commit = false;
    return 0;
}

/* Begins this step's save in the background (or, with commit, its commit
 * by reference), completed by the next settle. */
static int start_bg(zn_cli_saver *sv, int64_t step, double pace_s, bool commit)
{
    int rc = zn_cli_save_settle(sv);
    /* (a fresh run's commit of step 0 has saved_at 0 and nothing saved) */
    if (rc || (sv->saved_at == step && (step > 0 || !commit)) ||
        (commit && (sv->stopped || !sv->commit)))
        return rc;
    char *client = client_state(sv->ts, sv->cfg, step);
    sv->so.client_json = client;
    rc = !client ? zn_set_error(-ENOMEM, "out of memory")
         : commit ? zn_ckpt_commit_start(sv->ts->tr, &sv->so, &sv->bg)
                  : zn_ckpt_save_start(sv->ts->tr, &sv->so, pace_s, &sv->bg);
    free(client);
    sv->so.client_json = NULL;
    if (rc)
        return save_failed(sv, rc, step);
    sv->bg_step = step;
    sv->bg_commit = commit;
    return 0;
}

int zn_cli_commit_begin(zn_cli_saver *sv, int64_t step)
{
    return start_bg(sv, step, 0, true);
}

int zn_cli_commit_stop(zn_cli_saver *sv, int64_t *steps)
{
    if (!sv->commit || sv->stopped)
        return 0;
    bool pending = sv->bg && sv->bg_commit;
    /* a save that is not a commit in progress, or nothing to fall back on
     * (no commit yet, no checkpoint resumed from): the stop goes the usual
     * way (the commit in progress settles) */
    bool fallback = !sv->saved_commit && sv->resumed[0] && sv->saved_at == sv->bg_step - 1;
    if ((sv->bg && !sv->bg_commit) || (!sv->saved_commit && !(pending && fallback)))
        return 0;
    double t0 = zn_now_s();
    char where[sizeof sv->last_path];
    bool had = sv->saved_commit;
    sv->saved_commit = false;
    sv->stopped = true;   /* the trainer is done: no more saves */
    if (zn_ckpt_commit_seal(sv->ts->tr, had ? sv->last_path : NULL, true,
                            pending ? &sv->bg : NULL, where, sizeof where))
        fprintf(stderr, "zinc: warning: %s\n", zn_last_error());
    if (pending && where[0] && strcmp(where, sv->last_path))
        sv->saved_at = sv->bg_step;   /* that commit completed first */
    if (!where[0]) {
        /* none of this run's: the checkpoint it resumed from stands */
        snprintf(where, sizeof where, "%s", sv->resumed);
    }
    sv->bg = NULL;
    sv->bg_commit = false;
    snprintf(sv->last_path, sizeof sv->last_path, "%s", where);
    printf("on the stop the update in flight was dropped (%.2f s): %s is the checkpoint (step "
           "%lld's %s)\n", zn_now_s() - t0, where, (long long)sv->saved_at,
           strcmp(where, sv->resumed) ? "commit" : "checkpoint, the one this run resumed from");
    fflush(stdout);
    *steps = sv->saved_at;
    return 1;
}

int zn_cli_save_begin(zn_cli_saver *sv, int64_t step, double pace_s)
{
    return sv->background ? start_bg(sv, step, pace_s, false) : zn_cli_save(sv, step);
}

int zn_cli_save_settle(zn_cli_saver *sv)
{
    if (!sv->bg)
        return 0;
    /* a stop signal while this waits: the rest goes unpaced */
    while (!zn_ckpt_save_written(sv->bg)) {
        if (zn_cli_stop_signal()) {
            zn_ckpt_save_hurry(sv->bg);
            break;
        }
        struct timespec ts = { 0, 20 * 1000000L };
        nanosleep(&ts, NULL);
    }
    zn_ckpt_bg *bg = sv->bg;
    sv->bg = NULL;
    char where[4200];
    zn_ckpt_bg_stats st;
    int rc = zn_ckpt_save_end(bg, where, sizeof where, &st);
    bool commit = sv->bg_commit;
    sv->bg_commit = false;
    if (rc && commit && sv->ts->world > 1) {
        /* the ranks' commit: the trainer is failed, the commit before kept */
        char why[160];
        snprintf(why, sizeof why, "commit of step %lld (step %lld's is latest and whole)",
                 (long long)sv->bg_step, (long long)sv->saved_at);
        zn_cli_fail(rc, why);
        sv->commit = false;
        return rc;
    }
    if (rc) {
        if (commit)
            sv->commit = false;   /* its folders are gone: no more commits */
        return save_failed(sv, rc, sv->bg_step);
    }
    if (commit) {
        /* said once; every step's is in the report */
        if (!sv->commits++)
            printf("checkpoint %s: step %lld committed in place (%.2f s, none of the state "
                   "copied); from here on every step is, and a kill at any moment loses at "
                   "most the steps since the last commit\n", where, (long long)sv->bg_step,
                   st.write_s);
        if (st.write_s > sv->commit_s_max)
            sv->commit_s_max = st.write_s;
        if (st.busy_s > sv->commit_busy_max)
            sv->commit_busy_max = st.busy_s;
        snprintf(sv->last_path, sizeof sv->last_path, "%s", where);
        fflush(stdout);
        sv->saved_at = sv->bg_step;
        sv->saved_commit = true;
        return 0;
    }
    char sz[32];
    double bps = st.busy_s > 0 ? (double)st.bytes / st.busy_s : 0;
    printf("checkpoint %s (%s written in the background in %.2f s, %.2f s of it writing: "
           "%.2f GB/s; %.2f s waited for)\n", where, zn_format_size(st.bytes, sz, sizeof sz),
           st.write_s, st.busy_s, bps / 1e9, st.wait_s);
    /* the slowest rate the disk took a save at is what a stop's rest of
     * one is judged by: said at the first save and whenever it falls by
     * a fifth, with what a stop then takes */
    if (bps > 0 && (!(sv->write_bps > 0) || bps < 0.8 * sv->write_bps)) {
        double half = sv->cfg->train.checkpoint.notice_s / 2, all = (double)st.bytes / bps;
        printf("on SIGTERM now: the step in progress stops, then the rest of the save in "
               "progress is written at this rate, at most %.1f s%s\n", all < half ? all : half,
               all < half ? "" : " (beyond half of train.checkpoint.notice_s it is dropped: the "
               "checkpoint left is then one step old)");
        sv->write_bps = bps;
    }
    fflush(stdout);
    sv->saved_at = sv->bg_step;
    sv->saved_commit = false;
    return 0;
}

void zn_cli_save_on_stop(zn_cli_saver *sv)
{
    if (!sv->bg)
        return;
    if (sv->bg_commit) {
        /* the first commit (no earlier one to fall back on) costs
         * milliseconds once its step's update landed; a later one is
         * dropped with that update (zn_cli_commit_stop) */
        if (!sv->saved_commit && !sv->resumed[0] && zn_cli_save_settle(sv))
            sv->stopped = true;
        return;
    }
    uint64_t left = zn_ckpt_save_left(sv->bg);
    double secs;
    if (zn_cli_stop_finish_save(sv->cfg, left, sv->write_bps, &secs)) {
        zn_ckpt_save_hurry(sv->bg);
        return;
    }
    char sz[32];
    fprintf(stderr, "zinc: the background save of step %lld has %s left to write (about %.0f s, "
            "more than half of train.checkpoint.notice_s %.0f s): dropped; the newest "
            "checkpoint is step %lld's\n", (long long)sv->bg_step,
            zn_format_size(left, sz, sizeof sz), secs, sv->cfg->train.checkpoint.notice_s,
            (long long)sv->saved_at);
    zn_ckpt_save_drop(sv->bg);
    sv->bg = NULL;
    sv->stopped = true;
}

void zn_cli_saver_fini(zn_cli_saver *sv)
{
    zn_ckpt_save_drop(sv->bg);   /* a save not completed: its folder goes */
    sv->bg = NULL;
    free(sv->hooks);
    sv->hooks = NULL;
}
