/* `zinc plot RUN.jsonl`: a run's JSON lines (zinc train --json-log, or a
 * recipe's trainer_log.jsonl) as one SVG picture that any browser opens:
 * the training and eval loss, the learning rate and tokens/s against the
 * step, each in its own panel. A resumed run's log repeats the steps after
 * its checkpoint: the last line of a step wins. Several runs are compared:
 * their losses in one panel and each one's relative distance from the first
 * in another (two curves a hair apart look like one). SVG needs no library
 * and stays sharp at any size. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "util/fs-impl.h"

enum { S_LOSS, S_EVAL, S_LR, S_TPS, S_COUNT };

typedef struct {
    double step;
    double v[S_COUNT];     /* NAN: not in that line */
    size_t line;
} point;

typedef struct {
    point *p;
    size_t n, cap;
    size_t bad;            /* lines that are not a step's JSON object */
    size_t first_bad;
} series;

static double num(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static int read_log(const char *path, series *s)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return zn_set_error(-errno, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t lcap = 0, ln = 0;
    int rc = 0;
    while (getline(&line, &lcap, f) >= 0) {
        ln++;
        if (strspn(line, " \t\r\n") == strlen(line))
            continue;
        json_t *o = json_loads(line, 0, NULL);
        double st = num(o, "step"), loss = num(o, "loss");
        if (!json_is_object(o) || isnan(st) || isnan(loss)) {
            if (!s->bad++)
                s->first_bad = ln;
            json_decref(o);
            continue;
        }
        if (s->n == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 1024;
            point *p = realloc(s->p, cap * sizeof *p);
            if (!p) {
                json_decref(o);
                rc = zn_set_error(-ENOMEM, "%s: out of memory at line %zu", path, ln);
                break;
            }
            s->p = p;
            s->cap = cap;
        }
        point *p = &s->p[s->n++];
        double tok = num(o, "tokens"), sec = num(o, "seconds");
        p->step = st;
        p->line = ln;
        p->v[S_LOSS] = loss;
        p->v[S_EVAL] = num(o, "eval_loss");
        p->v[S_LR] = num(o, "lr");
        p->v[S_TPS] = tok >= 0 && sec > 0 ? tok / sec : NAN;
        json_decref(o);
    }
    if (!rc && ferror(f))
        rc = zn_set_error(-EIO, "%s: read error", path);
    free(line);
    fclose(f);
    return rc;
}

static int by_step_then_line(const void *a, const void *b)
{
    const point *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

/* Sorted by step, the last line of each step kept (a resumed run). */
static void last_per_step(series *s)
{
    qsort(s->p, s->n, sizeof *s->p, by_step_then_line);
    size_t k = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (k && s->p[k - 1].step == s->p[i].step)
            k--;
        s->p[k++] = s->p[i];
    }
    s->n = k;
}

/* ---- the picture ---------------------------------------------------------------*/
#define W 720.0
#define PANEL_H 220.0
#define ML 70.0
#define MR 20.0
#define MT 34.0
#define MB 40.0

static const char *const color[S_COUNT] = { "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd" };
static const char *const label[S_COUNT] = { "train loss", "eval loss", "learning rate",
                                            "tokens/s" };

/* At most this many vertices a line: more steps are averaged in buckets. */
#define MAX_VERTS 2000

static void xml_text(FILE *o, const char *s)
{
    for (; *s; s++)
        switch (*s) {
        case '&': fputs("&amp;", o); break;
        case '<': fputs("&lt;", o); break;
        case '>': fputs("&gt;", o); break;
        case '"': fputs("&quot;", o); break;
        default: fputc(*s, o);
        }
}

/* One curve of a panel: series s's values v[k]. */
typedef struct {
    const series *s;
    int k;
    const char *color, *cls, *label;
} curve;

static void polyline(FILE *o, const curve *c, double x0, double x1, double y0, double y1,
                     double top)
{
    const series *s = c->s;
    int k = c->k;
    size_t have = 0;
    for (size_t i = 0; i < s->n; i++)
        have += !isnan(s->p[i].v[k]);
    size_t stride = have > MAX_VERTS ? (have + MAX_VERTS - 1) / MAX_VERTS : 1;
    fprintf(o, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" class=\"%s\" "
            "points=\"", c->color, c->cls);
    double sx = 0, sy = 0;
    size_t m = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (isnan(s->p[i].v[k]))
            continue;
        sx += s->p[i].step;
        sy += s->p[i].v[k];
        if (++m == stride) {
            double x = sx / (double)m, y = sy / (double)m;
            fprintf(o, "%.2f,%.2f ", ML + (x - x0) / (x1 - x0) * (W - ML - MR),
                    top + MT + (y1 - y) / (y1 - y0) * (PANEL_H - MT - MB));
            sx = sy = 0;
            m = 0;
        }
    }
    if (m) {
        double x = sx / (double)m, y = sy / (double)m;
        fprintf(o, "%.2f,%.2f ", ML + (x - x0) / (x1 - x0) * (W - ML - MR),
                top + MT + (y1 - y) / (y1 - y0) * (PANEL_H - MT - MB));
    }
    fprintf(o, "\"/>\n");
}

/* A tick spacing of 1, 2 or 5 times a power of ten giving about `target`
 * intervals over `range`. */
static double nice_step(double range, int target)
{
    double raw = range / target, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

/* One panel of the curves c[0..nc), sharing its axes; with_zero: the y
 * axis reaches 0 (a difference). */
static void panel(FILE *o, const curve *c, int nc, bool with_zero, double top,
                  const char *title)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = with_zero ? 0 : INFINITY;
    double y1 = with_zero ? 0 : -INFINITY;
    for (int j = 0; j < nc; j++) {
        const series *s = c[j].s;
        if (!s->n)
            continue;
        x0 = s->p[0].step < x0 ? s->p[0].step : x0;
        x1 = s->p[s->n - 1].step > x1 ? s->p[s->n - 1].step : x1;
        for (size_t i = 0; i < s->n; i++) {
            double v = s->p[i].v[c[j].k];
            if (!isnan(v) && isfinite(v)) {
                y0 = v < y0 ? v : y0;
                y1 = v > y1 ? v : y1;
            }
        }
    }
    if (!isfinite(x0))
        x0 = x1 = 0;
    if (!isfinite(y0))
        y0 = y1 = 0;
    if (x1 <= x0)
        x1 = x0 + 1;
    if (y1 <= y0) {
        double pad = fabs(y0) > 0 ? fabs(y0) * 0.05 : 1;
        y0 -= pad;
        y1 += pad;
    }
    double bot = top + PANEL_H - MB;
    fprintf(o, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\" font-weight=\"bold\">", W / 2,
            top + 20);
    xml_text(o, title);
    fprintf(o, "</text>\n");
    fprintf(o, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", ML, bot,
            W - MR, bot);
    fprintf(o, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"black\"/>\n", ML, top + MT,
            ML, bot);
    double ys = nice_step(y1 - y0, 4), xs = nice_step(x1 - x0, 6);
    xs = xs < 1 ? 1 : xs;  /* steps are whole */
    for (double y = ceil(y0 / ys) * ys; y <= y1 + ys * 1e-9; y += ys) {
        double py = top + MT + (y1 - y) / (y1 - y0) * (PANEL_H - MT - MB);
        fprintf(o, "<line x1=\"%g\" y1=\"%.2f\" x2=\"%g\" y2=\"%.2f\" stroke=\"#ddd\"/>\n", ML,
                py, W - MR, py);
        fprintf(o, "<text x=\"%g\" y=\"%.2f\" text-anchor=\"end\">%.6g</text>\n", ML - 4, py + 4,
                fabs(y) < ys * 1e-9 ? 0.0 : y);
    }
    for (double x = ceil(x0 / xs) * xs; x <= x1 + xs * 1e-9; x += xs)
        fprintf(o, "<text x=\"%.2f\" y=\"%g\" text-anchor=\"middle\">%.0f</text>\n",
                ML + (x - x0) / (x1 - x0) * (W - ML - MR), bot + 16, x);
    fprintf(o, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">step</text>\n", W / 2, bot + 32);
    for (int j = 0; j < nc; j++)
        polyline(o, &c[j], x0, x1, y0, y1, top);
    /* the legend on a veil, so that curves under it do not hide it
     * (7 px a character at font-size 12 is a generous guess) */
    size_t longest = 0;
    for (int j = 0; j < nc; j++)
        longest = strlen(c[j].label) > longest ? strlen(c[j].label) : longest;
    fprintf(o, "<rect x=\"%.1f\" y=\"%g\" width=\"%.1f\" height=\"%d\" fill=\"white\" "
            "fill-opacity=\"0.8\"/>\n", W - MR - 10 - 7.0 * (double)longest, top + MT,
            8 + 7.0 * (double)longest, 16 * nc + 4);
    for (int j = 0; j < nc; j++) {
        fprintf(o, "<text x=\"%g\" y=\"%g\" text-anchor=\"end\" fill=\"%s\">", W - MR - 6,
                top + MT + 14 + 16 * j, c[j].color);
        xml_text(o, c[j].label);
        fprintf(o, "</text>\n");
    }
}

static bool has(const series *s, int k)
{
    for (size_t i = 0; i < s->n; i++)
        if (!isnan(s->p[i].v[k]))
            return true;
    return false;
}

/* Reads a run's log into *s, sorted, the last line of each step kept. */
static int load_run(const char *path, series *s)
{
    int rc = read_log(path, s);
    if (rc)
        return rc;
    if (!s->n)
        return s->bad ? zn_set_error(-ENODATA, "%s: no line with a step and a loss (%zu other "
                                     "lines, the first at line %zu)", path, s->bad, s->first_bad)
                      : zn_set_error(-ENODATA, "%s: no line with a step and a loss", path);
    if (s->bad)
        fprintf(stderr, "zinc: warning: %s: %zu line(s) without a step and a loss skipped, the "
                "first at line %zu\n", path, s->bad, s->first_bad);
    last_per_step(s);
    return 0;
}

/* out: b's loss relative to a's, (b - a) / a, at the steps both have. */
static int rel_diff(const series *a, const series *b, series *out)
{
    out->p = malloc((b->n ? b->n : 1) * sizeof *out->p);
    if (!out->p)
        return zn_set_error(-ENOMEM, "plot: out of memory");
    size_t i = 0, j = 0;
    while (i < a->n && j < b->n) {
        if (a->p[i].step < b->p[j].step) {
            i++;
        } else if (b->p[j].step < a->p[i].step) {
            j++;
        } else {
            point *q = &out->p[out->n++];
            *q = b->p[j];
            for (int k = 0; k < S_COUNT; k++)
                q->v[k] = NAN;
            double x = a->p[i].v[S_LOSS];
            q->v[S_LOSS] = x != 0 ? (b->p[j].v[S_LOSS] - x) / x : NAN;
            i++;
            j++;
        }
    }
    return 0;
}

static FILE *svg_begin(const char *svg, zn_fs_tmp *tmp, double height, int *rc)
{
    if ((*rc = zn_fs_tmp_fopen(tmp, svg, 0644)))
        return NULL;
    FILE *o = tmp->f;
    fprintf(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n", W, height);
    fprintf(o, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    return o;
}

/* Closes the picture and puts it in place durably: whole or not at all. */
static int svg_end(zn_fs_tmp *tmp)
{
    fprintf(tmp->f, "</svg>\n");
    return zn_fs_tmp_commit(tmp);
}

static const char *base_name(const char *path)
{
    const char *sl = strrchr(path, '/');
    return sl ? sl + 1 : path;
}

static int draw_one(const series *s, const char *svg, const char *title)
{
    int panels = 1 + has(s, S_LR) + has(s, S_TPS), rc = 0;
    zn_fs_tmp tmp;
    FILE *o = svg_begin(svg, &tmp, PANEL_H * panels, &rc);
    if (!o)
        return rc;
    curve c[S_COUNT];
    static const char *const cls[S_COUNT] = { "loss", "eval", "lr", "tps" };
    for (int k = 0; k < S_COUNT; k++)
        c[k] = (curve){ s, k, color[k], cls[k], label[k] };
    char t[512];
    snprintf(t, sizeof t, "%s: loss, %zu steps", title, s->n);
    panel(o, c, has(s, S_EVAL) ? 2 : 1, false, 0, t);
    double top = PANEL_H;
    if (has(s, S_LR)) {
        panel(o, &c[S_LR], 1, false, top, "learning rate");
        top += PANEL_H;
    }
    if (has(s, S_TPS))
        panel(o, &c[S_TPS], 1, false, top, "tokens/s (each step's tokens over its seconds)");
    return svg_end(&tmp);
}

static const char *const run_color[ZN_PLOT_MAX_RUNS] = {
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
};

/* Several runs: their training losses in one panel, each later run's loss
 * relative to the first run's in the second. */
static int draw_compare(const series *s, const series *d, const char *const *names, int n,
                        const char *svg, const char *title)
{
    int rc = 0;
    char cls[ZN_PLOT_MAX_RUNS][2][16];
    zn_fs_tmp tmp;
    FILE *o = svg_begin(svg, &tmp, 2 * PANEL_H, &rc);
    if (!o)
        return rc;
    curve loss[ZN_PLOT_MAX_RUNS], rel[ZN_PLOT_MAX_RUNS];
    for (int i = 0; i < n; i++) {
        snprintf(cls[i][0], sizeof cls[i][0], "loss-%d", i + 1);
        snprintf(cls[i][1], sizeof cls[i][1], "rel-%d", i + 1);
        loss[i] = (curve){ &s[i], S_LOSS, run_color[i], cls[i][0], base_name(names[i]) };
        rel[i] = (curve){ &d[i], S_LOSS, run_color[i], cls[i][1], base_name(names[i]) };
    }
    char t[512];
    snprintf(t, sizeof t, "%s: train loss", title);
    panel(o, loss, n, false, 0, t);
    snprintf(t, sizeof t, "loss relative to %s: (run - it) / it", base_name(names[0]));
    panel(o, rel + 1, n - 1, true, PANEL_H, t);
    return svg_end(&tmp);
}

int zn_cli_plot_runs(const char *const *jsonl, int n, const char *svg, const char *title)
{
    if (n < 1 || n > ZN_PLOT_MAX_RUNS)
        return zn_set_error(-EINVAL, "plot: %d runs; it draws 1 to %d", n, ZN_PLOT_MAX_RUNS);
    series s[ZN_PLOT_MAX_RUNS] = { { 0 } }, d[ZN_PLOT_MAX_RUNS] = { { 0 } };
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = load_run(jsonl[i], &s[i]);
    for (int i = 1; i < n && !rc; i++) {
        rc = rel_diff(&s[0], &s[i], &d[i]);
        if (!rc && !d[i].n)
            fprintf(stderr, "zinc: warning: %s has no step in common with %s\n", jsonl[i],
                    jsonl[0]);
    }
    if (!rc)
        rc = n == 1 ? draw_one(&s[0], svg, title) : draw_compare(s, d, jsonl, n, svg, title);
    for (int i = 0; i < n; i++) {
        free(s[i].p);
        free(d[i].p);
    }
    return rc;
}

int zn_cli_plot(const char *jsonl, const char *svg, const char *title)
{
    return zn_cli_plot_runs(&jsonl, 1, svg, title);
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: zinc plot RUN.jsonl [RUN2.jsonl ...] [-o FILE.svg] [--title TEXT]\n"
        "  Draws a run's JSON lines (zinc train --json-log FILE, or a recipe's\n"
        "  trainer_log.jsonl) as an SVG picture: train and eval loss, learning\n"
        "  rate and tokens/s against the step. A resumed run's repeated steps\n"
        "  take their last line. With several runs (up to %d): their train\n"
        "  losses, and each one's loss relative to the first run's.\n"
        "  -o FILE.svg     where to write it (default: RUN.jsonl with .svg)\n"
        "  --title TEXT    the picture's title (default: the first file's name)\n",
        ZN_PLOT_MAX_RUNS);
}

int zn_cmd_plot(int argc, char **argv)
{
    static const struct option lo[] = {
        { "output", required_argument, NULL, 'o' },
        { "title", required_argument, NULL, 't' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *out = NULL, *title = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:h", lo, NULL)) != -1) {
        if (c == 'o')
            out = optarg;
        else if (c == 't')
            title = optarg;
        else {
            usage(c == 'h' ? stdout : stderr);
            return c == 'h' ? 0 : 2;
        }
    }
    int nruns = argc - optind;
    if (nruns < 1 || nruns > ZN_PLOT_MAX_RUNS) {
        fprintf(stderr, "zinc: error: plot takes 1 to %d RUN.jsonl files (%d given)\n",
                ZN_PLOT_MAX_RUNS, nruns);
        usage(stderr);
        return 2;
    }
    const char *in = argv[optind];
    char def[4096];
    if (!out) {
        size_t n = strlen(in);
        const char *dot = n > 6 && !strcmp(in + n - 6, ".jsonl") ? in + n - 6 : in + n;
        snprintf(def, sizeof def, "%.*s.svg", (int)(dot - in), in);
        out = def;
    }
    if (!title)
        title = base_name(in);
    int rc = zn_cli_plot_runs((const char *const *)argv + optind, nruns, out, title);
    if (rc)
        return zn_cli_fail(rc, "plot");
    printf("%s\n", out);
    return 0;
}
