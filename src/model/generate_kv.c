/* The generator's KV cache and where it lives: on the device when it fits,
 * else homed in pinned host memory, each layer's cache passing through one
 * of two device slots around that layer's attention.
 *
 * Why stream the cache rather than attend on the host (FlexGen's "CPU
 * delegation"): the device's own attention kernels then run on the same
 * values, so a pinned cache gives the device cache's logits bit for bit,
 * the CPU keeps its cores for the NVMe reads and the embedding gathers,
 * and the cost is plain and bounded: per decoding step and sequence at
 * context c, c x kv_token_bytes in and one token's rows out, which the plan
 * states. With GQA a token's keys and values are small (Qwen2.5-7B: 56 KiB
 * over 28 layers against 15 GB of weights), so at the batch and contexts
 * where weights stream, their bytes dominate a step; host attention is the
 * better trade only when batch x context moves more than the weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/generate.h"
#include "model/model-impl.h"
#include "util/try-impl.h"

static uint64_t align_up(uint64_t x)
{
    return (x + ZN_DEV_ALIGN - 1) / ZN_DEV_ALIGN * ZN_DEV_ALIGN;
}

/* The cache on the device, one buffer per layer. */
static int place_device(zn_gen *g)
{
    for (int64_t l = 0; l < g->L; l++)
        ZN_TRY(zn_dev_alloc(g->dev, g->kv_layer, "KV cache", &g->kv[l]));
    return 0;
}

/* The cache homed in pinned memory, its device slots and their streams:
 * refused when the slots leave the device too little for the weights'
 * least (least_weights). */
static int place_pinned(zn_gen *g, uint64_t room, uint64_t least_weights)
{
    char a[32], b[32], c[32], u[32];
    zn_dev_mem ms;
    g->kv_pinned = 1;
    g->kv_K = g->L < 2 ? 1 : 2;
    int rc = zn_dev_host_alloc(g->dev, (size_t)(g->kv_layer * (uint64_t)g->L), "KV cache (pinned)",
                               &g->kv_host);
    if (rc == ZN_EBUDGET) {
        zn_dev_mem_stats(g->dev, &ms);
        return zn_set_error(ZN_EBUDGET, "generate: the KV cache of %lld sequences of %lld tokens "
                            "(%s) fits neither the device (%s free beside the weights' least) "
                            "nor pinned memory (%s budget, %s in use): fewer sequences "
                            "(--batch-size) or a shorter context", (long long)g->max_batch,
                            (long long)g->max_t,
                            zn_format_size(g->kv_layer * (uint64_t)g->L, a, sizeof a),
                            zn_format_size(room, b, sizeof b),
                            zn_format_size(ms.host_budget, c, sizeof c),
                            zn_format_size(ms.host_used, u, sizeof u));
    }
    if (rc)
        return rc;
    if (least_weights > room)
        return zn_set_error(ZN_EBUDGET, "generate: the device (%s free) cannot hold the least "
                            "the weights need there (%s: the head and the streamed layers' "
                            "slots), whatever the KV cache: a larger --gpu-mem",
                            zn_format_size(room, b, sizeof b),
                            zn_format_size(least_weights, c, sizeof c));
    if (align_up(g->kv_layer) * (uint64_t)g->kv_K + least_weights > room)
        return zn_set_error(ZN_EBUDGET, "generate: the KV cache is homed in pinned memory, "
                            "but its %d device slots of one layer (%s each, %lld sequences of "
                            "%lld tokens) and the least the weights need there (%s: the head "
                            "and the streamed layers' slots) do not fit the device (%s free): "
                            "fewer sequences (--batch-size) or a shorter context", g->kv_K,
                            zn_format_size(g->kv_layer, a, sizeof a), (long long)g->max_batch,
                            (long long)g->max_t, zn_format_size(least_weights, c, sizeof c),
                            zn_format_size(room, b, sizeof b));
    for (int k = 0; k < g->kv_K; k++) {
        ZN_TRY(zn_dev_alloc(g->dev, g->kv_layer, "KV cache slot", &g->kv_slot[k]));
        ZN_TRY(zn_dev_event_create(g->dev, &g->kv_ready[k]));
        ZN_TRY(zn_dev_event_create(g->dev, &g->kv_used[k]));
        ZN_TRY(zn_dev_event_create(g->dev, &g->kv_saved[k]));
    }
    ZN_TRY(zn_dev_stream_create_copy(g->dev, "generate-kv-h2d", &g->kv_in));
    return zn_dev_stream_create_copy(g->dev, "generate-kv-d2h", &g->kv_out);
}

int zn_m_gen_kv_place(zn_gen *g, int kv_home, uint64_t least_weights)
{
    g->kv_layer = zn_model_kv_bytes(g->m, g->max_batch);
    zn_dev_mem ms;
    zn_dev_mem_stats(g->dev, &ms);
    uint64_t room = ms.budget > ms.used ? ms.budget - ms.used : 0;
    if (kv_home == ZN_GEN_KV_AUTO) {
        uint64_t whole = align_up(g->kv_layer) * (uint64_t)g->L;
        kv_home = whole + least_weights <= room ? ZN_GEN_KV_DEVICE : ZN_GEN_KV_PINNED;
    }
    if (kv_home == ZN_GEN_KV_DEVICE)
        return place_device(g);
    if (kv_home != ZN_GEN_KV_PINNED)
        return zn_set_error(ZN_EARG, "generate: kv_home %d (auto 0, device 1, pinned 2)",
                            kv_home);
    return place_pinned(g, room, least_weights);
}

void zn_m_gen_kv_release(zn_gen *g)
{
    if (g->kv_in)
        zn_dev_stream_destroy(g->dev, g->kv_in);
    if (g->kv_out)
        zn_dev_stream_destroy(g->dev, g->kv_out);
    g->kv_in = g->kv_out = NULL;
    for (int k = 0; k < 2; k++) {
        zn_dev_free(g->dev, g->kv_slot[k]);
        zn_dev_event_destroy(g->dev, g->kv_ready[k]);
        zn_dev_event_destroy(g->dev, g->kv_used[k]);
        zn_dev_event_destroy(g->dev, g->kv_saved[k]);
        g->kv_slot[k] = NULL;
        g->kv_ready[k] = g->kv_used[k] = g->kv_saved[k] = NULL;
    }
    zn_dev_host_free(g->dev, g->kv_host);
    g->kv_host = NULL;
    for (int64_t l = 0; g->kv && l < g->L; l++) {
        zn_dev_free(g->dev, g->kv[l]);
        g->kv[l] = NULL;
    }
}

/* Bytes of `rows` cached tokens, and the offset of row `t` of cache slot
 * `s`, in a layer's cache ([slot][max_t][k | v]). */
static uint64_t rows_bytes(const zn_gen *g, int64_t rows)
{
    return (uint64_t)rows * (g->kv_layer / (uint64_t)(g->max_batch * g->max_t));
}

static uint64_t row_off(const zn_gen *g, int64_t s, int64_t t)
{
    return rows_bytes(g, s * g->max_t + t);
}

/* Queues layer l's cached rows (each sequence's [0, pos0)) into the slot of
 * its use, once the slot's last use ran and its new rows are out. Waiting
 * for both slots' last copy out also orders this read of the home after
 * every earlier write to it (kv_out runs in order). */
static int fetch(zn_gen *g, int64_t l)
{
    int k = (int)((g->kv_use + (uint64_t)l) % (uint64_t)g->kv_K);
    for (int j = 0; j < g->kv_K; j++)
        ZN_TRY(zn_dev_stream_wait_event(g->dev, g->kv_in, g->kv_saved[j]));
    const unsigned char *home = (const unsigned char *)g->kv_host + (uint64_t)l * g->kv_layer;
    for (int64_t i = 0; i < g->cur_nb; i++) {
        if (!g->cur_pos0[i])
            continue;
        uint64_t o = row_off(g, g->cur_slot[i], 0), n = rows_bytes(g, g->cur_pos0[i]);
        ZN_TRY(zn_dev_copy_h2d(g->dev, g->kv_in, (unsigned char *)g->kv_slot[k] + o, home + o,
                               (size_t)n));
        g->kv_in_bytes += n;
    }
    return zn_dev_event_record(g->dev, g->kv_ready[k], g->kv_in);
}

int zn_m_gen_kv_begin(zn_gen *g)
{
    return g->kv_pinned ? fetch(g, 0) : 0;
}

int zn_m_gen_kv_enter(zn_gen *g, int64_t l, void **kv)
{
    if (!g->kv_pinned) {
        *kv = g->kv[l];
        return 0;
    }
    /* one layer ahead: the next layer's rows cross while this one computes */
    if (l + 1 < g->L)
        ZN_TRY(fetch(g, l + 1));
    int k = (int)((g->kv_use + (uint64_t)l) % (uint64_t)g->kv_K);
    ZN_TRY(zn_dev_stream_wait_event(g->dev, NULL, g->kv_ready[k]));
    *kv = g->kv_slot[k];
    return 0;
}

int zn_m_gen_kv_leave(zn_gen *g, int64_t l)
{
    if (!g->kv_pinned)
        return 0;
    int k = (int)((g->kv_use + (uint64_t)l) % (uint64_t)g->kv_K);
    ZN_TRY(zn_dev_event_record(g->dev, g->kv_used[k], NULL));
    ZN_TRY(zn_dev_stream_wait_event(g->dev, g->kv_out, g->kv_used[k]));
    unsigned char *home = (unsigned char *)g->kv_host + (uint64_t)l * g->kv_layer;
    for (int64_t i = 0; i < g->cur_nb; i++) {
        uint64_t o = row_off(g, g->cur_slot[i], g->cur_pos0[i]), n = rows_bytes(g, g->cur_T);
        ZN_TRY(zn_dev_copy_d2h(g->dev, g->kv_out, home + o,
                               (const unsigned char *)g->kv_slot[k] + o, (size_t)n));
        g->kv_out_bytes += n;
    }
    ZN_TRY(zn_dev_event_record(g->dev, g->kv_saved[k], g->kv_out));
    if (l == g->L - 1)
        g->kv_use += (uint64_t)g->L;
    return 0;
}
