/* `zinc plot RUN.jsonl`: a run's JSON lines (zinc train --json-log, or a
 * recipe's trainer_log.jsonl) as one SVG picture that any browser opens:
 * the training and eval loss, the learning rate and tokens/s against the
 * step, each in its own panel. A resumed run's log repeats the steps after
 * its checkpoint: the last line of a step wins. SVG needs no library and
 * stays sharp at any size. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"

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

static void polyline(FILE *o, const series *s, int k, double x0, double x1, double y0,
                     double y1, double top)
{
    size_t have = 0;
    for (size_t i = 0; i < s->n; i++)
        have += !isnan(s->p[i].v[k]);
    size_t stride = have > MAX_VERTS ? (have + MAX_VERTS - 1) / MAX_VERTS : 1;
    fprintf(o, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" class=\"%s\" "
            "points=\"", color[k], k == S_LOSS ? "loss" : k == S_EVAL ? "eval" : k == S_LR ? "lr"
                                                                                   : "tps");
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

/* One panel of the series in ks[0..nk), sharing its y axis. */
static void panel(FILE *o, const series *s, const int *ks, int nk, double top, const char *title)
{
    double x0 = s->p[0].step, x1 = s->p[s->n - 1].step, y0 = INFINITY, y1 = -INFINITY;
    for (int j = 0; j < nk; j++)
        for (size_t i = 0; i < s->n; i++) {
            double v = s->p[i].v[ks[j]];
            if (!isnan(v) && isfinite(v)) {
                y0 = v < y0 ? v : y0;
                y1 = v > y1 ? v : y1;
            }
        }
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
    for (int j = 0; j < nk; j++) {
        polyline(o, s, ks[j], x0, x1, y0, y1, top);
        fprintf(o, "<text x=\"%g\" y=\"%g\" fill=\"%s\">%s</text>\n", W - MR - 90,
                top + MT + 14 + 16 * j, color[ks[j]], label[ks[j]]);
    }
}

static bool has(const series *s, int k)
{
    for (size_t i = 0; i < s->n; i++)
        if (!isnan(s->p[i].v[k]))
            return true;
    return false;
}

int zn_cli_plot(const char *jsonl, const char *svg, const char *title)
{
    series s = { 0 };
    int rc = read_log(jsonl, &s);
    FILE *o = NULL;
    if (rc)
        goto out;
    if (!s.n) {
        rc = s.bad ? zn_set_error(-ENODATA, "%s: no line with a step and a loss (%zu other "
                                  "lines, the first at line %zu)", jsonl, s.bad, s.first_bad)
                   : zn_set_error(-ENODATA, "%s: no line with a step and a loss", jsonl);
        goto out;
    }
    if (s.bad)
        fprintf(stderr, "zinc: warning: %s: %zu line(s) without a step and a loss skipped, the "
                "first at line %zu\n", jsonl, s.bad, s.first_bad);
    last_per_step(&s);
    int loss[2] = { S_LOSS, S_EVAL }, lr = S_LR, tps = S_TPS;
    int panels = 1 + has(&s, S_LR) + has(&s, S_TPS);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", svg);
    if (!(o = fopen(tmp, "w"))) {
        rc = zn_set_error(-errno, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    fprintf(o, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n", W, PANEL_H * panels);
    fprintf(o, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    char t[512];
    snprintf(t, sizeof t, "%s: loss, %zu steps", title, s.n);
    panel(o, &s, loss, has(&s, S_EVAL) ? 2 : 1, 0, t);
    double top = PANEL_H;
    if (has(&s, S_LR)) {
        panel(o, &s, &lr, 1, top, "learning rate");
        top += PANEL_H;
    }
    if (has(&s, S_TPS))
        panel(o, &s, &tps, 1, top, "tokens/s (each step's tokens over its seconds)");
    fprintf(o, "</svg>\n");
    if (ferror(o) | fclose(o)) {
        rc = zn_set_error(-EIO, "%s: write error", tmp);
        remove(tmp);
        goto out;
    }
    if (rename(tmp, svg) < 0) {
        rc = zn_set_error(-errno, "%s: %s", svg, strerror(errno));
        remove(tmp);
    }
out:
    free(s.p);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: zinc plot RUN.jsonl [-o FILE.svg] [--title TEXT]\n"
        "  Draws a run's JSON lines (zinc train --json-log FILE, or a recipe's\n"
        "  trainer_log.jsonl) as an SVG picture: train and eval loss, learning\n"
        "  rate and tokens/s against the step. A resumed run's repeated steps\n"
        "  take their last line.\n"
        "  -o FILE.svg     where to write it (default: RUN.jsonl with .svg)\n"
        "  --title TEXT    the picture's title (default: the file's name)\n");
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
    if (optind != argc - 1) {
        fprintf(stderr, "zinc: error: plot takes one RUN.jsonl\n");
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
    if (!title) {
        const char *sl = strrchr(in, '/');
        title = sl ? sl + 1 : in;
    }
    int rc = zn_cli_plot(in, out, title);
    if (rc)
        return zn_cli_fail(rc, "plot");
    printf("%s\n", out);
    return 0;
}
