/* The routers' top-k against torch.topk on rows full of ties
 * (tests/fixtures/topk-ties.json, scripts/gen_topk_ties.py): the same
 * experts in the same order, where "the lower index first" would differ
 * (a zero-initialized router ties them all). */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "model/model-impl.h"
#include "zt.h"
#include "test_model_fixtures.h"

int main(void)
{
    json_error_t je;
    json_t *j = json_load_file(zt_fixture("topk-ties.json"), 0, &je);
    if (!j)
        ZT_SETUP_FAIL("%s: %s", zt_fixture("topk-ties.json"), je.text);
    json_t *rows = json_object_get(j, "rows");
    size_t differ_lowest = 0;
    for (size_t r = 0; r < json_array_size(rows); r++) {
        json_t *row = json_array_get(rows, r);
        json_t *vals = json_object_get(row, "values"), *want = json_object_get(row, "indices");
        int64_t n = (int64_t)json_array_size(vals), k = json_integer_value(json_object_get(row, "k"));
        float *p = malloc((size_t)n * sizeof *p), *v = malloc((size_t)k * sizeof *v);
        zn_m_topk_el *q = malloc((size_t)n * sizeof *q);
        int32_t *sel = malloc((size_t)k * sizeof *sel);
        for (int64_t e = 0; e < n; e++)
            p[e] = (float)json_real_value(json_array_get(vals, (size_t)e));
        zn_m_topk(p, n, k, q, sel, v);
        int same = 1, lowest = 1;
        for (int64_t i = 0; i < k; i++) {
            int32_t w = (int32_t)json_integer_value(json_array_get(want, (size_t)i));
            same &= sel[i] == w;
            ZT_CHECK_MSG(v[i] == p[w], "row %zu: value %d", r, (int)i);
        }
        /* what a stable "larger first, then lower index" order would pick */
        for (int64_t i = 0; i < k && lowest; i++) {
            int32_t w = (int32_t)json_integer_value(json_array_get(want, (size_t)i));
            for (int64_t e = 0; e < w; e++)
                if (p[e] == p[w]) {
                    int used = 0;
                    for (int64_t t = 0; t < i; t++)
                        used |= json_integer_value(json_array_get(want, (size_t)t)) == e;
                    lowest &= used;
                }
        }
        differ_lowest += !lowest;
        ZT_CHECK_MSG(same, "row %zu (n %lld, k %lld): zinc's top-k is not torch's", r,
                     (long long)n, (long long)k);
        free(p), free(v), free(q), free(sel);
    }
    /* the fixture exercises the order: torch's picks are often not the
     * lowest-index ones */
    ZT_CHECK_MSG(differ_lowest > json_array_size(rows) / 4, "only %zu of %zu rows tie-break "
                 "away from the lowest index", differ_lowest, json_array_size(rows));
    printf("%zu rows equal torch.topk (%zu of them not lowest-index first)\n",
           json_array_size(rows), differ_lowest);
    json_decref(j);
    return zt_done();
}
