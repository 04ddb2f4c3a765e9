/* A checkpoint written while the training goes on (include/zinc/ckpt.h,
 * zn_ckpt_save_start): the folder is made between steps, this rank's files
 * are written by a thread of their own from the state the last step left,
 * and the checkpoint is completed (manifest, rename, latest) between later
 * steps. The trainer holds the state meanwhile (zn_train_state_hold): the
 * later steps' forward and backward run, their optimizer updates wait until
 * the files are written. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt/ckpt-impl.h"
#include "zinc/comm.h"

struct zn_ckpt_bg {
    zn_trainer *tr;
    zn_ckpt_save_options o;
    char *dir, *config_text, *client_json;   /* the options' strings, copied */
    zn_ckpt__job job;
    zn_ckpt__pace pace;
    pthread_t thread;
    bool started;
    pthread_mutex_t lock;
    pthread_cond_t cv;
    bool written;           /* the thread ended (wrc its status) */
    int wrc;
    char wmsg[1024];        /* its message */
    double write_s;         /* from the start to the files written */
    double busy_s;          /* of it, writing (no wait for the step, no pacing) */
    uint64_t bytes;
    bool commit;            /* zn_ckpt_commit_start: by reference, completed by the thread */
    bool ranks;             /* ... of several ranks: completed between steps (zn_ckpt_save_end,
                             * a collective), which ends the hold */
    char final[ZN_CKPT_PATH];
};

int zn_ckpt__pace_after(zn_ckpt__pace *p, uint64_t len)
{
    if (atomic_load(&p->quit))
        return zn_set_error(-ECANCELED, "checkpoint: the background save was abandoned");
    uint64_t done = atomic_fetch_add(&p->done, len) + len;
    if (p->seconds <= 0 || !p->bytes || atomic_load(&p->hurry))
        return 0;
    double due = p->seconds * (double)done / (double)p->bytes;
    double now = (double)(zn_now_ns() - p->t0) * 1e-9;
    /* in slices of at most 50 ms, so that an abandon is seen soon */
    while (due > now && !atomic_load(&p->quit) && !atomic_load(&p->hurry)) {
        double d = due - now < 0.05 ? due - now : 0.05;
        struct timespec ts = { 0, (long)(d * 1e9) };
        nanosleep(&ts, NULL);
        double then = now;
        now = (double)(zn_now_ns() - p->t0) * 1e-9;
        p->slept_s += now - then;
    }
    return atomic_load(&p->quit) ? zn_set_error(-ECANCELED, "checkpoint: the background save "
                                                "was abandoned") : 0;
}

static void *writer(void *arg)
{
    zn_ckpt_bg *bg = arg;
    uint64_t t0 = zn_now_ns();
    /* the held step's own optimizer update first: it is the state saved */
    int rc = zn_train_state_wait_held(bg->tr);
    if (rc)
        rc = zn_set_error(rc, "checkpoint: the optimizer step %lld it saves failed",
                          (long long)bg->job.in.step);
    if (!rc && bg->commit && atomic_load(&bg->pace.quit)) {
        /* a stop dropped the update it waited for (zn_ckpt_commit_stop) */
        if (!bg->ranks)
            zn_ckpt__abandon(bg->tr, &bg->job, 0);
        rc = zn_set_error(-ECANCELED, "checkpoint: the commit of step %lld was dropped by a "
                          "stop", (long long)bg->job.in.step);
    } else if (!rc && bg->commit && bg->ranks) {
        /* this rank's part; the ranks complete it together between steps,
         * and only then may the next update write the other copy */
        bg->pace.t0 = zn_now_ns();
        rc = zn_ckpt__save_rank(bg->tr, &bg->o, bg->job.tmp, &bg->job.in, NULL, true);
        bg->busy_s = (double)(zn_now_ns() - bg->pace.t0) * 1e-9;
    } else if (!rc && bg->commit) {
        /* the step's commit: its files refer to the swap file, and the
         * checkpoint is completed here (one rank), before any later update
         * may write the other copy the previous commit refers to */
        bg->pace.t0 = zn_now_ns();
        rc = zn_ckpt__save_rank(bg->tr, &bg->o, bg->job.tmp, &bg->job.in, NULL, true);
        if (!rc)
            rc = zn_ckpt__finish(bg->tr, &bg->o, bg->job.tmp, bg->job.final, bg->job.name,
                                 &bg->job.in, true);
        bg->busy_s = (double)(zn_now_ns() - bg->pace.t0) * 1e-9;
        if (rc) {
            /* nothing of this run's may stay that the next update makes
             * wrong: this commit and the earlier ones go (`latest` may then
             * name a folder that is gone: a resume falls back past it) */
            char keep[128], msg[1024];
            snprintf(msg, sizeof msg, "%s", zn_last_error());
            zn_ckpt__abandon(bg->tr, &bg->job, rc);
            snprintf(keep, sizeof keep, "step-%08lld", (long long)bg->job.in.step + 1);
            zn_ckpt__prune_own(bg->tr, bg->o.dir, keep);
            zn_set_error(rc, "%s", msg);
        } else {
            snprintf(bg->final, sizeof bg->final, "%s", bg->job.final);
            bg->job.tmp[0] = '\0';
        }
    } else if (!rc) {
        bg->pace.t0 = zn_now_ns();
        rc = zn_ckpt__save_rank(bg->tr, &bg->o, bg->job.tmp, &bg->job.in, &bg->pace, false);
        bg->busy_s = (double)(zn_now_ns() - bg->pace.t0) * 1e-9 - bg->pace.slept_s;
    } else if (bg->commit && !bg->ranks) {
        zn_ckpt__abandon(bg->tr, &bg->job, rc);
    }
    /* later updates may change the state from here on (a commit of
     * several ranks: once it is complete, bg_complete) */
    if (!(bg->commit && bg->ranks))
        zn_train_state_release(bg->tr);
    pthread_mutex_lock(&bg->lock);
    bg->wrc = rc;
    snprintf(bg->wmsg, sizeof bg->wmsg, "%s", rc ? zn_last_error() : "");
    bg->write_s = (double)(zn_now_ns() - t0) * 1e-9;
    bg->written = true;
    pthread_cond_broadcast(&bg->cv);
    pthread_mutex_unlock(&bg->lock);
    return NULL;
}

bool zn_ckpt_save_background(const zn_trainer *tr)
{
    return tr && zn_train_state_background(tr);
}

static char *dup_or_null(const char *s, bool *oom)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = true;
    return d;
}

static void bg_free(zn_ckpt_bg *bg)
{
    if (!bg)
        return;
    pthread_cond_destroy(&bg->cv);
    pthread_mutex_destroy(&bg->lock);
    free(bg->dir);
    free(bg->config_text);
    free(bg->client_json);
    free(bg);
}

bool zn_ckpt_commit_possible(zn_trainer *tr, const char *dir)
{
    return tr && zn_train_state_two_copies(tr) && zn_ckpt_save_keeps_nvme(tr, dir);
}

bool zn_ckpt_commit_agree(zn_trainer *tr, const char *dir)
{
    bool mine = zn_ckpt_commit_possible(tr, dir);
    struct zn_comm *c = tr ? zn_train_comm(tr) : NULL;
    if (!c || zn_train_world(tr) <= 1)
        return mine;
    float no = mine ? 0.0f : 1.0f, any = 1.0f;
    if (zn_comm_allreduce(c, &no, &any, 1, ZN_DTYPE_F32, ZN_REDUCE_MAX))
        return false;   /* (the run's next collective says what failed) */
    return any == 0;
}

/* A commit of several ranks, its parts written (wrc: this rank's): the
 * ranks agree and rank 0 completes it. On a failure (a rank's part, or a
 * rank gone) the commit before stays latest, whole: the next update, which
 * would write the copy it refers to, is dropped and the trainer failed
 * (with `stop` the stop has done both). Then the hold ends. Every rank
 * (collective). */
static int bg_complete(zn_ckpt_bg *bg, int wrc, bool stop, char *out, size_t out_len)
{
    int rc = zn_ckpt__commit(bg->tr, &bg->o, &bg->job, wrc, true, out, out_len);
    if (rc && !stop) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zn_last_error());
        zn_train_state_drop_update(bg->tr);
        zn_train_state_fail(bg->tr);
        zn_set_error(rc, "%s", msg);
    }
    if (!rc)
        snprintf(bg->final, sizeof bg->final, "%s", bg->job.final);
    zn_train_state_release(bg->tr);
    return rc;
}

static int start(zn_trainer *tr, const zn_ckpt_save_options *o, double pace_s, bool commit,
                 zn_ckpt_bg **out)
{
    *out = NULL;
    if (!tr || !o || !o->dir || !o->dir[0])
        return zn_set_error(ZN_EARG, "checkpoint: no trainer or no folder");
    if (commit && !zn_ckpt_commit_possible(tr, o->dir))
        return zn_set_error(ZN_EARG, "checkpoint: no commit by reference: it takes one rank "
                            "whose optimizer state is on the NVMe tier in two copies, one swap "
                            "path, on the file system of %s", o->dir);
    if (!commit && !zn_train_state_background(tr))
        return zn_set_error(ZN_EARG, "checkpoint: the optimizer state is on the device or "
                            "on NVMe, not written in the background (zn_ckpt_save)");
    zn_train_state_info in;
    zn_train_state_get_info(tr, &in);
    if (in.failed)
        return zn_set_error(ZN_ECORRUPT, "checkpoint: the trainer failed in an earlier step; "
                            "its state is not saved");
    zn_ckpt_bg *bg = calloc(1, sizeof *bg);
    if (!bg)
        return zn_set_error(-ENOMEM, "checkpoint: out of memory");
    bool oom = false;
    bg->tr = tr;
    bg->o = *o;
    bg->o.final_save = false;   /* the training goes on */
    bg->o.cancel = NULL;
    bg->commit = commit;
    bg->ranks = commit && zn_train_world(tr) > 1;
    bg->o.dir = bg->dir = dup_or_null(o->dir, &oom);
    bg->o.config_text = bg->config_text = dup_or_null(o->config_text, &oom);
    bg->o.client_json = bg->client_json = dup_or_null(o->client_json, &oom);
    pthread_mutex_init(&bg->lock, NULL);
    pthread_cond_init(&bg->cv, NULL);
    /* the hold (one background save at a time), then the folder: the
     * ranks agree on both */
    int hold = zn_train_state_hold(tr);
    int rc = hold ? zn_error_prefix(hold, "checkpoint")
             : oom ? zn_set_error(-ENOMEM, "checkpoint: out of memory") : 0;
    if ((rc = zn_ckpt__prepare(tr, &bg->o, &bg->job, rc))) {
        if (!hold)
            zn_train_state_release(tr);
        bg_free(bg);
        return rc;
    }
    for (int k = 0; k < ZN_TS_COUNT; k++)
        bg->bytes += bg->job.in.bytes[k];
    bg->pace.bytes = bg->bytes;
    bg->pace.seconds = pace_s;
    if ((rc = pthread_create(&bg->thread, NULL, writer, bg))) {
        zn_train_state_release(tr);
        rc = zn_set_error(-rc, "checkpoint: starting the writer: %s", strerror(rc));
        zn_ckpt__abandon(tr, &bg->job, rc);
        bg_free(bg);
        return rc;
    }
    bg->started = true;
    *out = bg;
    return 0;
}

int zn_ckpt_save_start(zn_trainer *tr, const zn_ckpt_save_options *o, double pace_s,
                       zn_ckpt_bg **out)
{
    return start(tr, o, pace_s, false, out);
}

int zn_ckpt_commit_start(zn_trainer *tr, const zn_ckpt_save_options *o, zn_ckpt_bg **out)
{
    return start(tr, o, 0, true, out);
}

bool zn_ckpt_save_written(zn_ckpt_bg *bg)
{
    pthread_mutex_lock(&bg->lock);
    bool w = bg->written;
    pthread_mutex_unlock(&bg->lock);
    return w;
}

int64_t zn_ckpt_save_step(const zn_ckpt_bg *bg)
{
    return bg->job.in.step;
}

/* Joins the writer; its status (with its message set again). */
static int join(zn_ckpt_bg *bg)
{
    if (bg->started)
        pthread_join(bg->thread, NULL);
    bg->started = false;
    if (bg->wrc)
        zn_set_error(bg->wrc, "%s", bg->wmsg);
    return bg->wrc;
}

int zn_ckpt_save_end(zn_ckpt_bg *bg, char *out_path, size_t out_len, zn_ckpt_bg_stats *st)
{
    uint64_t t0 = zn_now_ns();
    int wrc = join(bg);
    if (st) {
        st->bytes = bg->bytes;
        st->write_s = bg->write_s;
        st->busy_s = bg->busy_s;
        st->wait_s = (double)(zn_now_ns() - t0) * 1e-9;
    }
    int rc = wrc;
    if (bg->ranks) {
        rc = bg_complete(bg, wrc, false, out_path, out_len);
    } else if (bg->commit) {
        if (!rc && out_path && out_len)
            snprintf(out_path, out_len, "%s", bg->final);
    } else {
        rc = zn_ckpt__commit(bg->tr, &bg->o, &bg->job, wrc, false, out_path, out_len);
    }
    bg_free(bg);
    return rc;
}

void zn_ckpt_save_drop(zn_ckpt_bg *bg)
{
    if (!bg)
        return;
    atomic_store(&bg->pace.quit, 1);
    int rc = join(bg);
    /* (a commit of one rank completed itself, or removed what it made;
     * one of several is abandoned here, without the others) */
    if (!bg->commit || bg->ranks)
        zn_ckpt__abandon(bg->tr, &bg->job, rc);
    if (bg->ranks) {
        /* the commit before stays latest: nothing may write its copy */
        zn_train_state_drop_update(bg->tr);
        zn_train_state_fail(bg->tr);
        zn_train_state_release(bg->tr);
    }
    bg_free(bg);
}

void zn_ckpt_save_hurry(zn_ckpt_bg *bg)
{
    atomic_store(&bg->pace.hurry, 1);
}

uint64_t zn_ckpt_save_left(zn_ckpt_bg *bg)
{
    if (zn_ckpt_save_written(bg))
        return 0;
    uint64_t done = atomic_load(&bg->pace.done);
    return done < bg->bytes ? bg->bytes - done : 0;
}

int zn_ckpt_commit_seal(zn_trainer *tr, const char *path, bool drop_update,
                        zn_ckpt_bg **pending, char *out, size_t out_len)
{
    if (!tr || (!path && !(pending && *pending)))
        return zn_set_error(ZN_EARG, "checkpoint: no trainer or no checkpoint to seal");
    char keep[ZN_CKPT_PATH];
    snprintf(keep, sizeof keep, "%s", path ? path : "");
    zn_ckpt_bg *bg = pending ? *pending : NULL;
    if (bg && bg->commit)
        atomic_store(&bg->pace.quit, 1);   /* it links nothing once the update ends */
    if (drop_update || bg)
        zn_train_state_drop_update(tr);
    if (bg) {
        /* it may have completed before the drop, or be past its wait for
         * the update it commits (which then ran whole: the next one waits
         * for its hold): then it is the newest. The trainer is marked
         * failed only after it, or its reads of the state would fail and
         * take this run's commits with them. */
        int wrc = join(bg);
        /* several ranks: it completes if every rank's part is written
         * (every rank seals at the same step) */
        if (bg->ranks && !bg_complete(bg, wrc, true, NULL, 0))
            wrc = 0;
        else if (bg->ranks)
            wrc = -ECANCELED;
        if (!wrc && bg->commit && bg->final[0])
            snprintf(keep, sizeof keep, "%s", bg->final);
        else if (!bg->commit)
            zn_ckpt__abandon(bg->tr, &bg->job, wrc);
    }
    zn_train_state_fail(tr);   /* no step may write the file again */
    if (out && out_len)
        snprintf(out, out_len, "%s", keep);
    int rc = keep[0] ? zn_ckpt__punch_rank(keep, zn_train_rank(tr)) : 0;
    if (bg) {
        bg_free(bg);
        *pending = NULL;
    }
    return rc ? zn_error_prefix(rc, "checkpoint: sealing %s (it is whole, and keeps the swap "
                                "file's other ranges)", keep) : 0;
}
