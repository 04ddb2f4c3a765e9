/* The trace writer: per-track busy time for the step-time breakdown, and
 * span records written as Chrome trace JSON for Perfetto / chrome://tracing.
 * One mutex: spans arrive a few hundred times per step, far below where a
 * lock would show. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/trace.h"
#include "util/fs-impl.h"

typedef struct {
    uint64_t t0, t1;
    int track;  /* -1: counter sample (value in t1 as a double's bits) */
    char name[ZN_TRACE_NAME_LEN];
} span_rec;

typedef struct {
    char name[ZN_TRACE_NAME_LEN];
    /* A track's spans are kept as intervals, since they arrive out of start
     * order (from several threads, and a step's stream marks all at once
     * when it ends); busy = the length of their union, computed when asked.
     * A union track (zn_trace_add_union) takes the spans of tracks of[0]
     * and of[1]. */
    int of[2];
    uint64_t (*iv)[2];
    size_t niv, cap;
    uint64_t base_ns;      /* union length of intervals already folded */
} track_rec;

struct zn_trace {
    pthread_mutex_t lock;
    int record;
    uint64_t origin;
    track_rec tracks[ZN_TRACE_MAX_TRACKS];
    int n_tracks;
    span_rec *spans;
    uint64_t n_spans, cap, max_spans, dropped;
};

int zn_trace_create(zn_trace **out, int record, uint64_t max_spans)
{
    *out = NULL;
    zn_trace *t = calloc(1, sizeof *t);
    if (!t)
        return zn_set_error(-ENOMEM, "trace: out of memory");
    if (pthread_mutex_init(&t->lock, NULL)) {
        free(t);
        return zn_set_error(-ENOMEM, "trace: mutex init failed");
    }
    t->record = record;
    t->max_spans = max_spans ? max_spans : (4u << 20);
    t->origin = zn_now_ns();
    *out = t;
    return 0;
}

void zn_trace_destroy(zn_trace *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n_tracks; i++)
        free(t->tracks[i].iv);
    pthread_mutex_destroy(&t->lock);
    free(t->spans);
    free(t);
}

int zn_trace_add_track(zn_trace *t, const char *name)
{
    pthread_mutex_lock(&t->lock);
    if (t->n_tracks >= ZN_TRACE_MAX_TRACKS) {
        pthread_mutex_unlock(&t->lock);
        return zn_set_error(ZN_EARG, "trace: more than %d tracks", ZN_TRACE_MAX_TRACKS);
    }
    int id = t->n_tracks++;
    snprintf(t->tracks[id].name, sizeof t->tracks[id].name, "%s", name ? name : "?");
    t->tracks[id].of[0] = t->tracks[id].of[1] = -1;
    pthread_mutex_unlock(&t->lock);
    return id;
}

int zn_trace_add_union(zn_trace *t, const char *name, int a, int b)
{
    if (a < 0 || b < 0 || a >= t->n_tracks || b >= t->n_tracks)
        return zn_set_error(ZN_EARG, "trace: union of unknown tracks %d and %d", a, b);
    int id = zn_trace_add_track(t, name);
    if (id < 0)
        return id;
    pthread_mutex_lock(&t->lock);
    t->tracks[id].of[0] = a;
    t->tracks[id].of[1] = b;
    pthread_mutex_unlock(&t->lock);
    return id;
}

static int cmp_iv(const void *x, const void *y)
{
    const uint64_t *a = x, *b = y;
    return a[0] < b[0] ? -1 : a[0] > b[0];
}

/* Sorts and merges a union track's intervals in place; returns the length
 * of their union. */
static uint64_t merge_iv(track_rec *k)
{
    if (!k->niv)
        return 0;
    qsort(k->iv, k->niv, sizeof *k->iv, cmp_iv);
    size_t o = 0;
    for (size_t i = 1; i < k->niv; i++) {
        if (k->iv[i][0] <= k->iv[o][1]) {
            if (k->iv[i][1] > k->iv[o][1])
                k->iv[o][1] = k->iv[i][1];
        } else {
            k->iv[++o][0] = k->iv[i][0];
            k->iv[o][1] = k->iv[i][1];
        }
    }
    k->niv = o + 1;
    uint64_t len = 0;
    for (size_t i = 0; i < k->niv; i++)
        len += k->iv[i][1] - k->iv[i][0];
    return len;
}

/* lock held: adds [t0, t1] to track k. At 64 Ki intervals it merges them
 * and folds all but the latest 16 Ki into base_ns: a span arrives at most
 * one step late (the marks, harvested when the step ends), and a step gives
 * a track far fewer than 16 Ki disjoint spans (one per block use at most). */
static void union_add(track_rec *k, uint64_t t0, uint64_t t1)
{
    if (k->niv == k->cap) {
        if (k->cap >= ((size_t)64 << 10)) {
            merge_iv(k);
            if (k->niv > ((size_t)16 << 10)) {
                size_t keep = (size_t)16 << 10, drop = k->niv - keep;
                for (size_t i = 0; i < drop; i++)
                    k->base_ns += k->iv[i][1] - k->iv[i][0];
                memmove(k->iv, k->iv + drop, keep * sizeof *k->iv);
                k->niv = keep;
            }
        }
        if (k->niv == k->cap) {
            size_t nc = k->cap ? k->cap * 2 : 1024;
            uint64_t (*n)[2] = realloc(k->iv, nc * sizeof *n);
            if (!n)
                return;  /* the busy figure undercounts; nothing else breaks */
            k->iv = n;
            k->cap = nc;
        }
    }
    k->iv[k->niv][0] = t0;
    k->iv[k->niv][1] = t1;
    k->niv++;
}

const char *zn_trace_track_name(const zn_trace *t, int track)
{
    return (track >= 0 && track < t->n_tracks) ? t->tracks[track].name : "?";
}

int zn_trace_num_tracks(const zn_trace *t)
{
    return t->n_tracks;
}

static void push(zn_trace *t, const span_rec *r)
{
    if (!t->record)
        return;
    if (t->n_spans >= t->max_spans) {
        t->dropped++;
        return;
    }
    if (t->n_spans == t->cap) {
        uint64_t nc = t->cap ? t->cap * 2 : 4096;
        if (nc > t->max_spans)
            nc = t->max_spans;
        span_rec *ns = realloc(t->spans, nc * sizeof *ns);
        if (!ns) {
            t->dropped++;
            return;
        }
        t->spans = ns;
        t->cap = nc;
    }
    t->spans[t->n_spans++] = *r;
}

void zn_trace_span(zn_trace *t, int track, const char *name, uint64_t t0, uint64_t t1)
{
    if (!t || track < 0)
        return;
    if (t1 < t0)
        t1 = t0;
    pthread_mutex_lock(&t->lock);
    if (track < t->n_tracks) {
        union_add(&t->tracks[track], t0, t1);
        span_rec r = { .t0 = t0, .t1 = t1, .track = track };
        snprintf(r.name, sizeof r.name, "%s", name ? name : "");
        push(t, &r);
        for (int u = 0; u < t->n_tracks; u++)
            if (t->tracks[u].of[0] == track || t->tracks[u].of[1] == track)
                union_add(&t->tracks[u], t0, t1);
    }
    pthread_mutex_unlock(&t->lock);
}

void zn_trace_counter(zn_trace *t, const char *name, uint64_t ts, double value)
{
    if (!t || !t->record)
        return;
    span_rec r = { .t0 = ts, .track = -1 };
    memcpy(&r.t1, &value, sizeof value);
    snprintf(r.name, sizeof r.name, "%s", name ? name : "");
    pthread_mutex_lock(&t->lock);
    push(t, &r);
    pthread_mutex_unlock(&t->lock);
}

double zn_trace_busy_s(zn_trace *t, int track)
{
    if (!t || track < 0 || track >= t->n_tracks)
        return 0.0;
    pthread_mutex_lock(&t->lock);
    track_rec *k = &t->tracks[track];
    double s = (double)(k->base_ns + merge_iv(k)) * 1e-9;
    pthread_mutex_unlock(&t->lock);
    return s;
}

void zn_trace_reset_busy(zn_trace *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->lock);
    for (int i = 0; i < t->n_tracks; i++) {
        t->tracks[i].niv = 0;
        t->tracks[i].base_ns = 0;
    }
    pthread_mutex_unlock(&t->lock);
}

void zn_trace_counts(zn_trace *t, uint64_t *kept, uint64_t *dropped)
{
    pthread_mutex_lock(&t->lock);
    if (kept)
        *kept = t->n_spans;
    if (dropped)
        *dropped = t->dropped;
    pthread_mutex_unlock(&t->lock);
}

static void put_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

int zn_trace_write(zn_trace *t, const char *path)
{
    zn_fs_tmp h;
    int rc = zn_fs_tmp_fopen(&h, path, 0644);
    if (rc)
        return zn_error_prefix(rc, "trace");
    FILE *f = h.f;
    pthread_mutex_lock(&t->lock);
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,"
               "\"args\":{\"name\":\"zinc\"}}");
    for (int i = 0; i < t->n_tracks; i++) {
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"args\":{\"name\":",
                i + 1);
        put_json_str(f, t->tracks[i].name);
        fprintf(f, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":1,\"tid\":%d,"
                   "\"args\":{\"sort_index\":%d}}", i + 1, i + 1);
    }
    for (uint64_t i = 0; i < t->n_spans; i++) {
        const span_rec *r = &t->spans[i];
        double ts = (double)(r->t0 - (r->t0 >= t->origin ? t->origin : r->t0)) * 1e-3;
        fputs(",\n{\"name\":", f);
        put_json_str(f, r->name);
        if (r->track < 0) {
            double v;
            memcpy(&v, &r->t1, sizeof v);
            fprintf(f, ",\"ph\":\"C\",\"pid\":1,\"ts\":%.3f,\"args\":{\"value\":%.17g}}", ts, v);
        } else {
            fprintf(f, ",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}",
                    r->track + 1, ts, (double)(r->t1 - r->t0) * 1e-3);
        }
    }
    fprintf(f, "\n]}\n");
    pthread_mutex_unlock(&t->lock);
    rc = zn_fs_tmp_commit(&h);
    return rc ? zn_error_prefix(rc, "trace") : 0;
}
