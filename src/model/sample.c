/* The next id from a row of logits, as transformers' generate() chooses it:
 * the repetition penalty, then greedy argmax, or temperature, top-k and
 * top-p before a draw from the seeded generator (include/zinc/generate.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/generate.h"
#include "util/hash-impl.h"

static double uniform(uint64_t *rng)
{
    *rng += ZN_GOLDEN64;
    return (double)(zn_mix64(*rng) >> 11) * 0x1.0p-53;
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

typedef struct {
    float v;
    int32_t id;
} scored;

static int cmp_scored_desc(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->v != y->v)
        return (x->v < y->v) - (x->v > y->v);
    return (x->id > y->id) - (x->id < y->id);
}

int32_t zn_gen_choose(const zn_gen_params *p, float *lg, int64_t V, const int32_t *seq,
                      int64_t seq_len, uint64_t *rng)
{
    if (p->repetition_penalty != 1.0) {
        /* once per distinct id: transformers gathers the ids' logits,
         * penalizes them and scatters them back */
        float pen = (float)p->repetition_penalty;
        unsigned char *seen = calloc((size_t)V, 1);
        for (int64_t i = 0; i < seq_len; i++) {
            int32_t t = seq[i];
            if (t < 0 || t >= V || (seen && seen[t]))
                continue;
            if (seen)
                seen[t] = 1;
            lg[t] = lg[t] < 0 ? lg[t] * pen : lg[t] / pen;
        }
        free(seen);
    }
    if (!p->do_sample) {
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (lg[v] > lg[best])
                best = v;
        return (int32_t)best;
    }
    float inv_t = (float)(1.0 / p->temperature);
    for (int64_t v = 0; v < V; v++)
        lg[v] *= inv_t;
    if (p->top_k > 0 && p->top_k < V) {
        float *c = malloc((size_t)V * sizeof *c);
        if (c) {
            memcpy(c, lg, (size_t)V * sizeof *c);
            qsort(c, (size_t)V, sizeof *c, cmp_desc);
            float kth = c[p->top_k - 1];
            for (int64_t v = 0; v < V; v++)
                if (lg[v] < kth)
                    lg[v] = -INFINITY;
            free(c);
        }
    }
    float mx = -INFINITY;
    for (int64_t v = 0; v < V; v++)
        mx = lg[v] > mx ? lg[v] : mx;
    scored *sc = malloc((size_t)V * sizeof *sc);
    if (!sc) {
        int64_t best = 0; /* out of memory: the most likely id */
        for (int64_t v = 1; v < V; v++)
            if (lg[v] > lg[best])
                best = v;
        return (int32_t)best;
    }
    double sum = 0;
    for (int64_t v = 0; v < V; v++) {
        sc[v].id = (int32_t)v;
        sc[v].v = lg[v] == -INFINITY ? 0.0f : expf(lg[v] - mx);
        sum += sc[v].v;
    }
    qsort(sc, (size_t)V, sizeof *sc, cmp_scored_desc);
    int64_t keep = V;
    if (p->top_p < 1.0) {
        /* transformers drops an id when the mass of the ids more likely than
         * it already reaches top_p (the most likely always stays) */
        double above = 0;
        for (int64_t r = 0; r < V; r++) {
            if (r > 0 && above >= p->top_p * sum) {
                keep = r;
                break;
            }
            above += sc[r].v;
        }
    }
    double kept = 0;
    for (int64_t r = 0; r < keep; r++)
        kept += sc[r].v;
    double u = uniform(rng) * kept, acc = 0;
    int32_t pick = sc[0].id;
    for (int64_t r = 0; r < keep; r++) {
        acc += sc[r].v;
        if (sc[r].v > 0 && u < acc) {
            pick = sc[r].id;
            break;
        }
    }
    free(sc);
    return pick;
}

