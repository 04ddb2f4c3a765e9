/* The weights a generator owns (zn_gen_open): each block placed at its home
 * (the device, pinned memory or an NVMe swap space), loaded from safetensors,
 * and the layers that do not fit the device streamed through a ring of device
 * slots, a use at a time. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/device.h"
#include "zinc/nvme.h"
#include "zinc/generate.h"
#include "zinc/optim.h"
#include "model/model-impl.h"
#include "util/try-impl.h"

/* ---- owned weights: placement ------------------------------------------------------- */

static uint64_t align_up(uint64_t x)
{
    return (x + ZN_DEV_ALIGN - 1) / ZN_DEV_ALIGN * ZN_DEV_ALIGN;
}

/* Block b's layout: offsets of its own tensors; a tied lm_head has none. */
static int layout_blocks(zn_gen *g)
{
    const zn_model_dims *d = zn_model_get_dims(g->m);
    g->nb = zn_model_num_blocks(d);
    g->np = calloc((size_t)g->nb, sizeof *g->np);
    g->off = calloc((size_t)g->nb, sizeof *g->off);
    g->bytes = calloc((size_t)g->nb, sizeof *g->bytes);
    g->home = calloc((size_t)g->nb, sizeof *g->home);
    g->on_dev = calloc((size_t)g->nb, sizeof *g->on_dev);
    g->ptr = calloc((size_t)g->nb, sizeof *g->ptr);
    if (!g->np || !g->off || !g->bytes || !g->home || !g->on_dev || !g->ptr)
        return zn_set_error(-ENOMEM, "out of memory");
    for (int b = 0; b < g->nb; b++) {
        g->np[b] = zn_model_block_nparams(d, b);
        g->off[b] = calloc((size_t)g->np[b] + 1, sizeof **g->off);
        g->ptr[b] = calloc((size_t)g->np[b] + 1, sizeof **g->ptr);
        if (!g->off[b] || !g->ptr[b])
            return zn_set_error(-ENOMEM, "out of memory");
        uint64_t o = 0;
        for (int i = 0; i < g->np[b]; i++) {
            zn_param_info pi;
            ZN_TRY(zn_model_block_param(d, b, i, &pi));
            g->off[b][i] = o;
            if (pi.owner_block < 0)
                o += align_up((uint64_t)pi.numel * g->esz);
        }
        g->bytes[b] = o;
        if (b >= 1 && b <= g->L) {
            g->lmax = o > g->lmax ? o : g->lmax;
            g->npmax = g->np[b] > g->npmax ? g->np[b] : g->npmax;
        }
    }
    return 0;
}

/* The tensors' addresses in block b's buffer `base`. */
static void bind(zn_gen *g, int b, void *base, void **ptr)
{
    const zn_model_dims *d = zn_model_get_dims(g->m);
    for (int i = 0; i < g->np[b]; i++) {
        zn_param_info pi;
        zn_model_block_param(d, b, i, &pi);
        ptr[i] = pi.owner_block >= 0 ? NULL : (unsigned char *)base + g->off[b][i];
    }
}

/* Block b's buffer as one extent of the swap space, laid out as its
 * device slot is (off): a use is one read. */
static int nvme_alloc(zn_gen *g, int b)
{
    char what[64];
    snprintf(what, sizeof what, "weights: layer %d", b - 1);
    ZN_TRY(zn_swap_alloc(g->swap, g->bytes[b], what, &g->ext[b]));
    g->on_nvme[b] = 1;
    return 0;
}

/* Allocates block b's home on the device (on_dev) or in pinned memory. */
static int home_alloc(zn_gen *g, int b, int on_dev)
{
    char what[64];
    int L = (int)g->L;
    if (b == 0)
        snprintf(what, sizeof what, "weights: embedding");
    else if (b == L + 1)
        snprintf(what, sizeof what, "weights: head");
    else
        snprintf(what, sizeof what, "weights: layer %d", b - 1);
    if (!g->bytes[b])
        return 0;
    int rc = on_dev ? zn_dev_alloc(g->dev, g->bytes[b], what, &g->home[b])
                    : zn_dev_host_alloc(g->dev, g->bytes[b], what, &g->home[b]);
    if (!rc) {
        g->on_dev[b] = on_dev;
        bind(g, b, g->home[b], g->ptr[b]);
    }
    return rc;
}

/* The swap space for the streamed layers in nvme_dir, and a pinned stage
 * per slot. A layer's extent (at least a swap block) starts on a block
 * boundary (zn_swap_alloc), so n layers take exactly n times the layer
 * rounded up to the block: the weights plus less than a block per layer.
 * What placement reports is the space the swap file got. */
static int nvme_open(zn_gen *g, const char *dir)
{
    zn_aio_config ac = zn_aio_config_default();
    uint64_t blk = ac.block_size;
    uint64_t need = 0;
    for (int j = 0; j < g->n; j++)
        need += (g->bytes[1 + g->r + j] + blk - 1) / blk * blk;
    g->on_nvme = calloc((size_t)g->nb, 1);
    g->ext = calloc((size_t)g->nb, sizeof *g->ext);
    if (!g->on_nvme || !g->ext)
        return zn_set_error(-ENOMEM, "out of memory");
    g->asm_block = -1;
    ZN_TRY(zn_aio_create(&g->aio, &ac));
    zn_swap_config sc = zn_swap_config_default();
    sc.npaths = 1;
    sc.paths[0] = dir;
    sc.bytes = need;
    sc.file_prefix = "zinc-gen";
    sc.run_dir = 1;
    ZN_TRY(zn_swap_create(&g->swap, g->aio, &sc));
    zn_swap_stats ss;
    zn_swap_get_stats(g->swap, &ss);
    g->nvme_bytes = ss.capacity;
    for (int k = 0; k < g->K; k++)
        ZN_TRY(zn_dev_host_alloc(g->dev, g->lmax, "streamed layer stage", &g->stage[k]));
    return 0;
}

/* The device bytes still free for weights. */
static uint64_t dev_room(const zn_gen *g)
{
    zn_dev_mem ms;
    zn_dev_mem_stats(g->dev, &ms);
    return ms.budget > ms.used ? ms.budget - ms.used : 0;
}

int zn_gen_open(zn_gen **out, zn_model *m, const zn_gen_config *c)
{
    if (c->nvme_dir) {
        /* a killed run's swap files go first (never a live one's), whether
         * or not this run streams from there */
        uint64_t stale_bytes;
        int stale_files;
        ZN_TRY(zn_swap_clean_stale(c->nvme_dir, "zinc-gen", &stale_bytes, &stale_files));
    }
    ZN_TRY(zn_m_gen_common(out, m, c->max_batch));
    zn_gen *g = *out;
    const zn_model_dims *d = zn_model_get_dims(m);
    int L = (int)g->L, head = L + 1, rc;
    if ((rc = layout_blocks(g)))
        goto fail;
    /* the head (and a tied embedding, its lm_head) stays on the device:
     * every step reads all of it */
    uint64_t lb = g->lmax, need_all = 0;
    for (int b = 0; b < g->nb; b++)
        need_all += g->bytes[b];
    /* the cache first, on the device when it fits beside the least the
     * weights need there (the head, a tied embedding, the ring): a step
     * reads all of it, as it reads the head */
    {
        int K = c->ring < 1 ? 1 : c->ring > ZN_M_GEN_MAX_RING ? ZN_M_GEN_MAX_RING : c->ring;
        uint64_t least = align_up(g->bytes[head]) + (d->tie_embeddings ? align_up(g->bytes[0]) : 0) +
                         (uint64_t)(K < L ? K : L) * align_up(lb);
        if ((rc = zn_m_gen_kv_place(g, c->kv_home, least)))
            goto fail;
    }
    int want_r = c->max_resident_layers < 0 || c->max_resident_layers > L ? L
                                                                           : c->max_resident_layers;
    if (want_r == L && need_all + (uint64_t)g->nb * ZN_DEV_ALIGN <= dev_room(g)) {
        for (int b = 0; b < g->nb && !rc; b++)
            rc = home_alloc(g, b, 1);
        g->r = L;
    } else {
        int K = c->ring < 1 ? 1 : c->ring > ZN_M_GEN_MAX_RING ? ZN_M_GEN_MAX_RING : c->ring;
        if ((rc = home_alloc(g, head, 1)) || (rc = home_alloc(g, 0, d->tie_embeddings)))
            goto fail;
        if (!d->tie_embeddings &&
            (rc = zn_dev_host_alloc(g->dev, (size_t)(zn_model_act_bytes(m)), "embedding rows",
                                    &g->hx)))
            goto fail;
        /* the ring first, then as many layers resident as fit */
        uint64_t room = dev_room(g);
        int64_t fit = room >= lb * (uint64_t)K ? (int64_t)((room - lb * (uint64_t)K) /
                                                          (lb + ZN_DEV_ALIGN)) : 0;
        g->r = (int)(fit < want_r ? fit : want_r);
        if (g->r > L - 1)
            g->r = L - 1; /* not everything fits: at least one layer streams */
        g->n = L - g->r;
        g->K = K < g->n ? K : g->n;
        g->fixed = g->n <= g->K;
        for (int k = 0; k < g->K && !rc; k++) {
            char what[64];
            snprintf(what, sizeof what, "weights: streamed layer slot %d", k);
            rc = zn_dev_alloc(g->dev, lb, what, &g->ring[k]);
            /* bound to a layer at each use (zn_m_gen_bind_slot) */
            if (!rc && !(g->ring_ptr[k] = calloc((size_t)g->npmax + 1, sizeof(void *))))
                rc = zn_set_error(-ENOMEM, "out of memory");
            if (!rc)
                rc = zn_dev_event_create(g->dev, &g->ready[k]);
            if (!rc)
                rc = zn_dev_event_create(g->dev, &g->freed[k]);
        }
        if (!rc && c->nvme_dir && !g->fixed)
            rc = nvme_open(g, c->nvme_dir);
        for (int l = 0; l < L && !rc; l++)
            rc = l < g->r || !g->aio ? home_alloc(g, l + 1, l < g->r) : nvme_alloc(g, l + 1);
        if (!rc)
            rc = zn_dev_stream_create_copy(g->dev, "generate-h2d", &g->copy);
    }
    if (rc)
        goto fail;
    /* a tied head's lm_head is the embedding */
    for (int i = 0; i < g->np[head]; i++) {
        zn_param_info pi;
        zn_model_block_param(d, head, i, &pi);
        if (pi.owner_block == 0)
            g->ptr[head][i] = g->ptr[0][0];
    }
    return 0;
fail:
    zn_gen_destroy(g);
    *out = NULL;
    return rc;
}

void zn_gen_get_placement(const zn_gen *g, zn_gen_placement *p)
{
    memset(p, 0, sizeof *p);
    const zn_model_dims *d = zn_model_get_dims(g->m);
    p->layers = (int)g->L;
    p->kv_bytes_per_seq = zn_model_kv_bytes(g->m, 1) * (uint64_t)g->L;
    p->kv_bytes = zn_model_kv_bytes(g->m, g->max_batch) * (uint64_t)g->L;
    p->kv_token_bytes = zn_model_kv_bytes(g->m, 1) / (uint64_t)g->max_t * (uint64_t)g->L;
    p->kv_pinned = g->kv_pinned;
    p->kv_device_bytes = g->kv_pinned ? (uint64_t)g->kv_K * g->kv_layer : p->kv_bytes;
    p->kv_in_bytes = g->kv_in_bytes;
    p->kv_out_bytes = g->kv_out_bytes;
    p->logits_row_bytes = (uint64_t)g->V * 4;
    p->embed_in_bytes = g->embed_in_bytes;
    p->logits_out_bytes = g->logits_out_bytes;
    if (g->st) {
        p->resident_layers = (int)g->L;
        p->embed_resident = 1;
        return;
    }
    p->resident_layers = g->r;
    p->streamed_layers = g->n;
    p->ring = g->K;
    p->layer_bytes = g->lmax;
    p->embed_resident = g->on_dev[0] || d->tie_embeddings;
    /* generate.c's embed() gathers on the host exactly when this holds */
    p->embed_row_bytes = !g->on_dev[0] && g->hx ? (uint64_t)g->H * g->esz : 0;
    for (int b = 0; b < g->nb; b++) {
        if (g->on_dev[b])
            p->device_weight_bytes += g->bytes[b];
        else if (!(g->on_nvme && g->on_nvme[b]))
            p->pinned_bytes += g->bytes[b];
    }
    p->device_weight_bytes += (uint64_t)g->K * g->lmax;
    for (int k = 0; k < g->K; k++)
        p->pinned_bytes += g->stage[k] ? g->lmax : 0;
    p->nvme_bytes = g->nvme_bytes;
    p->nvme_read = g->nvme_read;
    p->streamed_bytes_per_step = 0;
    for (int j = 0; j < g->n && !g->fixed; j++)
        p->streamed_bytes_per_step += g->bytes[1 + g->r + j];
    p->streamed_bytes = g->streamed;
}

/* ---- owned weights: loading ---------------------------------------------------------- */

/* The layer being filled, written whole to its extent; nothing when no
 * piece came since the last write. */
static int nvme_flush(zn_gen *g)
{
    if (!g->asm_dirty)
        return 0;
    int b = g->asm_block;
    zn_aio_handle hd;
    ZN_TRY(zn_aio_submit_write(g->aio, &g->ext[b], g->asm_buf, g->bytes[b], &hd));
    ZN_TRY(zn_aio_wait(g->aio, hd));
    g->asm_dirty = 0;
    g->on_nvme[b] = 2;
    return 0;
}

/* Loading ended with rc: when it succeeded, the last layer written; its
 * buffer given back either way. Returns rc, else the write's status. */
static int nvme_load_done(zn_gen *g, int rc)
{
    if (!g->aio)
        return rc;
    if (!rc)
        rc = nvme_flush(g);
    zn_aio_buffer_free(g->asm_buf);
    g->asm_buf = NULL;
    g->asm_block = -1;
    g->asm_dirty = 0;
    return rc;
}

/* An NVMe-homed tensor's piece: into its layer's buffer, written whole
 * when a piece of another layer comes (zn_m_load_tensors goes layer by
 * layer) or before a read. A layer already written is read back first:
 * the adapters of a LoRA model come after the base. */
static int put_nvme(zn_gen *g, int b, int i, uint64_t off, const void *h, size_t bytes)
{
    if (g->asm_block != b) {
        ZN_TRY(nvme_flush(g));
        if (!g->asm_buf && !(g->asm_buf = zn_aio_buffer_alloc(g->lmax)))
            return zn_set_error(-ENOMEM, "generate: no buffer of %llu bytes to load layer %d "
                                "onto NVMe", (unsigned long long)g->lmax, b - 1);
        g->asm_block = -1;
        if (g->on_nvme[b] == 2) {
            zn_aio_handle hd;
            ZN_TRY(zn_aio_submit_read(g->aio, &g->ext[b], g->asm_buf, g->bytes[b], &hd));
            ZN_TRY(zn_aio_wait(g->aio, hd));
        } else {
            memset(g->asm_buf, 0, g->bytes[b]);
        }
        g->asm_block = b;
    }
    memcpy((unsigned char *)g->asm_buf + g->off[b][i] + off, h, bytes);
    g->asm_dirty = 1;
    return 0;
}

static int put_home(void *ctx, int b, int i, uint64_t off, const void *h, size_t bytes)
{
    zn_gen *g = ctx;
    if (g->on_nvme && g->on_nvme[b])
        return put_nvme(g, b, i, off, h, bytes);
    unsigned char *dst = (unsigned char *)g->home[b] + g->off[b][i] + off;
    if (!g->on_dev[b]) {
        memcpy(dst, h, bytes);
        return 0;
    }
    ZN_TRY(zn_dev_copy_h2d(g->dev, NULL, dst, h, bytes));
    return zn_dev_stream_sync(g->dev, NULL);
}

/* Use u's layer from NVMe: its reads into the slot's stage, once the
 * stage's last copy is done; the copy is queued by zn_m_gen_complete(). */
static int read_stage(zn_gen *g, uint64_t u)
{
    int k = (int)(u % (uint64_t)g->K), b = 1 + g->r + (int)(u % (uint64_t)g->n);
    ZN_TRY(nvme_flush(g)); /* weights put since the last load (zn_gen_put) */
    ZN_TRY(zn_dev_event_sync(g->dev, g->ready[k]));
    ZN_TRY(zn_aio_submit_read(g->aio, &g->ext[b], g->stage[k], g->bytes[b], &g->rd[k]));
    g->pending[k] = 1;
    g->slot_block[k] = b;
    g->nvme_read += g->bytes[b];
    return 0;
}

/* The slot's reads waited for, then its copy queued (after the slot's last
 * use); nothing when no read is pending. */
int zn_m_gen_complete(zn_gen *g, int k)
{
    if (!g->pending[k])
        return 0;
    g->pending[k] = 0;
    ZN_TRY(zn_aio_wait(g->aio, g->rd[k]));
    ZN_TRY(zn_dev_stream_wait_event(g->dev, g->copy, g->freed[k]));
    int b = g->slot_block[k];
    ZN_TRY(zn_dev_copy_h2d(g->dev, g->copy, g->ring[k], g->stage[k], g->bytes[b]));
    g->streamed += g->bytes[b];
    return zn_dev_event_record(g->dev, g->ready[k], g->copy);
}

void zn_m_gen_bind_slot(zn_gen *g, int k, int64_t l)
{
    bind(g, (int)l + 1, g->ring[k], g->ring_ptr[k]);
}

/* Queues the move of use u's layer into its slot, after the slot's last
 * use: a copy from pinned memory, or NVMe reads into the slot's stage. */
int zn_m_gen_fetch(zn_gen *g, uint64_t u)
{
    int k = (int)(u % (uint64_t)g->K), b = 1 + g->r + (int)(u % (uint64_t)g->n);
    if (g->aio)
        return read_stage(g, u);
    ZN_TRY(zn_dev_stream_wait_event(g->dev, g->copy, g->freed[k]));
    ZN_TRY(zn_dev_copy_h2d(g->dev, g->copy, g->ring[k], g->home[b], g->bytes[b]));
    g->streamed += g->bytes[b];
    return zn_dev_event_record(g->dev, g->ready[k], g->copy);
}

int zn_gen_load(zn_gen *g, const char *base, const char *adapter_dir)
{
    if (g->st)
        return zn_set_error(ZN_EARG, "generate: this generator's weights are a model state's");
    const zn_model_dims *d = zn_model_get_dims(g->m);
    zn_dtype dt = zn_model_get_config(g->m)->dtype;
    if (adapter_dir && d->lora.r <= 0)
        return zn_set_error(ZN_EARG, "%s: the model was made without LoRA adapters",
                            adapter_dir);
    if (!adapter_dir && d->lora.r > 0)
        return zn_set_error(ZN_EARG, "generate: the model has LoRA adapters: give their folder");
    ZN_TRY(zn_gen_load_base(g, base));
    if (adapter_dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", adapter_dir);
        ZN_TRY(nvme_load_done(g, zn_m_load_tensors(d, dt, path, "base_model.model.",
                                                   ZN_M_LOAD_ADAPTERS, put_home, g)));
    }
    return 0;
}

int zn_gen_load_base(zn_gen *g, const char *base)
{
    if (g->st)
        return zn_set_error(ZN_EARG, "generate: this generator's weights are a model state's");
    const zn_model_dims *d = zn_model_get_dims(g->m);
    return nvme_load_done(g, zn_m_load_tensors(d, zn_model_get_config(g->m)->dtype, base, "",
                                               d->lora.r > 0 ? ZN_M_LOAD_BASE : ZN_M_LOAD_ALL,
                                               put_home, g));
}

int zn_gen_put(zn_gen *g, int block, int i, uint64_t first, const float *v, uint64_t n)
{
    if (g->st || block < 0 || block >= g->nb || i < 0 || i >= g->np[block])
        return zn_set_error(ZN_EARG, "generate: no tensor %d of block %d to fill", i, block);
    zn_param_info pi;
    ZN_TRY(zn_model_block_param(zn_model_get_dims(g->m), block, i, &pi));
    if (pi.owner_block >= 0 || first + n > (uint64_t)pi.numel)
        return zn_set_error(ZN_EARG, "generate: elements [%llu, +%llu) of '%s' (%lld)",
                            (unsigned long long)first, (unsigned long long)n, pi.name,
                            (long long)pi.numel);
    if (g->esz == 4)
        return put_home(g, block, i, first * 4, v, (size_t)n * 4);
    uint16_t *h = malloc((size_t)n * 2);
    if (!h)
        return zn_set_error(-ENOMEM, "out of memory");
    int rc = zn_convert(h, ZN_DTYPE_BF16, v, ZN_DTYPE_F32, (size_t)n);
    if (!rc)
        rc = put_home(g, block, i, first * 2, h, (size_t)n * 2);
    free(h);
    return rc;
}

int zn_gen_time_link(zn_gen *g, double *seconds)
{
    *seconds = 0;
    if (g->st || !g->n)
        return 0;
    for (int k = 0; k < g->K; k++)
        ZN_TRY(zn_m_gen_complete(g, k)); /* what is in flight lands first */
    ZN_TRY(zn_dev_sync(g->dev));
    uint64_t keep = g->streamed, keep_rd = g->nvme_read;
    if (g->aio) {
        /* NVMe reads alone, then the copies alone: the pipeline overlaps
         * them, so the step's ceiling is the slower of the two */
        ZN_TRY(nvme_flush(g));
        double t0 = zn_now_s();
        for (int j = 0; j < g->n; j++) {
            zn_aio_handle h;
            ZN_TRY(zn_aio_submit_read(g->aio, &g->ext[1 + g->r + j], g->stage[0],
                                      g->bytes[1 + g->r + j], &h));
            ZN_TRY(zn_aio_wait(g->aio, h));
        }
        double t_read = zn_now_s() - t0;
        t0 = zn_now_s();
        for (int j = 0; j < g->n; j++)
            ZN_TRY(zn_dev_copy_h2d(g->dev, g->copy, g->ring[j % g->K], g->stage[0],
                                   g->bytes[1 + g->r + j]));
        ZN_TRY(zn_dev_stream_sync(g->dev, g->copy));
        double t_copy = zn_now_s() - t0;
        *seconds = t_read > t_copy ? t_read : t_copy;
    } else {
        double t0 = zn_now_s();
        for (int j = 0; j < g->n; j++) {
            int b = 1 + g->r + j;
            ZN_TRY(zn_dev_copy_h2d(g->dev, g->copy, g->ring[j % g->K], g->home[b],
                                   g->bytes[b]));
        }
        ZN_TRY(zn_dev_stream_sync(g->dev, g->copy));
        *seconds = zn_now_s() - t0;
    }
    /* the slots again hold what their next uses expect */
    for (int k = 0; k < g->K && g->primed; k++) {
        ZN_TRY(zn_m_gen_fetch(g, g->use + (uint64_t)k));
        ZN_TRY(zn_m_gen_complete(g, (int)((g->use + (uint64_t)k) % (uint64_t)g->K)));
    }
    ZN_TRY(zn_dev_stream_sync(g->dev, g->copy));
    g->streamed = keep;
    g->nvme_read = keep_rd;
    return 0;
}
