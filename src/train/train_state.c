/* The trainer's optimizer state read and written as three byte streams
 * (train-state.h), for checkpoints: flat in host memory (the cpu tier),
 * on the device through the pinned state staging, or unit by unit on
 * NVMe through the first optimizer slot. Loading ends by making the
 * working parameters again from the master, at every home. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "train/train-impl.h"

void zn_train_state_get_info(const zn_trainer *tr, zn_train_state_info *out)
{
    memset(out, 0, sizeof *out);
    out->aio = tr->spec.aio;
    out->nblocks = tr->L;
    for (int b = 0; b < tr->L; b++)
        out->total_params += tr->blocks[b].n;
    out->local_params = tr->P;
    out->moments = tr->mom_fmt;
    out->f32_runs = tr->f32_runs;
    out->n_f32_runs = tr->n_f32_runs;
    out->f32_slots = tr->f32_slots;
    out->param_dtype = tr->param_dt;
    out->master_dtype = tr->master_bf16 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    out->bytes[ZN_TS_MASTER] = tr->P * zn_tr_master_elem(tr);
    out->bytes[ZN_TS_M] = out->bytes[ZN_TS_V] = tr->mom_bytes;
    out->flat = !tr->opt_on_device && tr->opt_home != ZN_TIER_NVME;
    out->from_f32 = out->flat || tr->opt_home == ZN_TIER_NVME;
    /* NVMe: the chunks gather in the first slot's master, m and v areas
     * while each unit is read into its gradient area after them */
    out->max_chunk = tr->opt_on_device ? tr->ostage_bytes
                     : out->flat       ? 0
                                       : 4 * tr->U + 2 * tr->slot_mom_bytes;
    out->step = tr->step;
    out->steps_run = tr->stats.steps_run;
    out->scaler = tr->scaler;
    out->failed = tr->bad;
}

int zn_train_state_hold(zn_trainer *tr)
{
    return zn_optsched_hold(tr);
}

int zn_train_state_wait_held(zn_trainer *tr)
{
    return zn_optsched_wait_held(tr);
}

void zn_train_state_release(zn_trainer *tr)
{
    zn_optsched_release(tr);
}

bool zn_train_state_background(const zn_trainer *tr)
{
    return !tr->opt_on_device && tr->opt_home != ZN_TIER_NVME;
}

void zn_train_state_fail(zn_trainer *tr)
{
    tr->bad = true;
}

void zn_train_state_drop_update(zn_trainer *tr)
{
    pthread_mutex_lock(&tr->opt.lock);
    tr->opt.pending = false;
    if (tr->opt.running)
        tr->opt.cancel = true;   /* it leaves at its next unit, its writes waited */
    pthread_cond_broadcast(&tr->opt.cv);
    pthread_mutex_unlock(&tr->opt.lock);
    zn_optsched_wait(tr);
    tr->opt.inflight = false;
}

void zn_train_state_set_progress(zn_trainer *tr, int64_t step, int64_t steps_run,
                                 const zn_loss_scaler *scaler)
{
    tr->step = step;
    tr->stats.steps_run = steps_run;
    tr->scaler = *scaler;
}

static void *stream_base(zn_trainer *tr, int k)
{
    return k == ZN_TS_MASTER ? (void *)tr->master : k == ZN_TS_M ? tr->mom : tr->var;
}

/* ---- save ----------------------------------------------------------------------*/
/* In memory: straight from the arrays; on the device, through the state
 * staging (chunk <= its size). */
static int save_flat(zn_trainer *tr, int k, uint64_t chunk, zn_aio *aio,
                     zn_train_state_sink sink, void *user)
{
    uint64_t total = k ? tr->mom_bytes : tr->P * zn_tr_master_elem(tr);
    const char *base = stream_base(tr, k);
    void *reg_buf = tr->opt_on_device ? tr->ostage : (void *)base;
    uint64_t reg_len = tr->opt_on_device ? (total < chunk ? total : chunk) : total;
    int reg = aio && total ? zn_aio_register_buffer(aio, reg_buf, reg_len) : -1;
    int rc = 0;
    for (uint64_t off = 0; off < total && !rc; off += chunk) {
        uint64_t len = total - off < chunk ? total - off : chunk;
        const char *src = base + off;
        if (tr->opt_on_device) {
            if ((rc = zn_dev_copy_d2h(tr->dev, tr->s_h2d, tr->ostage, src, len)) ||
                (rc = zn_dev_stream_sync(tr->dev, tr->s_h2d)))
                break;
            src = tr->ostage;
        }
        rc = sink(user, src, len);
    }
    if (reg >= 0)
        zn_aio_unregister_buffer(aio, reg);
    return rc;
}

/* Bytes pushed to a sink in chunks of exactly `chunk` (the last one
 * shorter), gathered at B. */
typedef struct {
    char *B;
    uint64_t fill, chunk;
    zn_train_state_sink sink;
    void *user;
} chunker;

static int chunk_put(chunker *c, const void *src, uint64_t len)
{
    const char *p = src;
    int rc = 0;
    while (len && !rc) {
        uint64_t take = c->chunk - c->fill < len ? c->chunk - c->fill : len;
        memcpy(c->B + c->fill, p, take);
        c->fill += take;
        len -= take;
        p += take;
        if (c->fill == c->chunk) {
            rc = c->sink(c->user, c->B, c->chunk);
            c->fill = 0;
        }
    }
    return rc;
}

/* On NVMe: unit by unit through the first optimizer slot, each unit read
 * into its gradient area and passed on from the areas before it (master,
 * m, v) in chunks of `chunk` <= their size. The stream is the flat layout
 * of the rank's P elements (zn_mom_layout_bytes: every element, then every
 * 8-bit block's absmax), each unit's extent its own layout of its n
 * elements: the elements (with the last unit's padding, which is the
 * stream's; the others have none, being whole blocks) go out as the units
 * are read, the 8-bit absmax (P / 64 bytes) are gathered and go out last.
 * Moments never written are the initial zeros. */
static int save_nvme(zn_trainer *tr, int k, uint64_t chunk, zn_aio *aio,
                     zn_train_state_sink sink, void *user)
{
    zn_opt_slot *sl = &tr->opt.slot[0];
    const bool q8 = k != ZN_TS_MASTER && tr->mom_fmt == ZN_MOM_Q8;
    chunker c = { (char *)sl->master, 0, chunk, sink, user };
    char *rd = (char *)sl->grad;
    float *absmax = NULL;
    if (q8 && !(absmax = malloc(zn_q8_blocks(tr->P) * 4)))
        return zn_set_error(-ENOMEM, "state save: out of memory for the 8-bit absmax");
    int reg = aio ? zn_aio_register_buffer(aio, c.B, chunk) : -1;
    int rc = 0;
    sl->unit = -1;
    for (int u = 0; u < tr->n_units && !rc; u++) {
        zn_unit *un = &tr->units[u];
        int id = zn_tr_unit_sid(un, k == ZN_TS_MASTER ? 0 : k == ZN_TS_M ? 1 : 2);
        uint64_t bytes = k == ZN_TS_MASTER ? un->n * zn_tr_master_elem(tr)
                                           : zn_tr_unit_mom_bytes(tr, un->n);
        uint64_t data = k == ZN_TS_MASTER ? bytes : zn_mom_layout_absmax_at(tr->mom_fmt, un->n);
        bool zero = k != ZN_TS_MASTER && atomic_load(&un->mv_zero);
        if (zero) {
            memset(rd, 0, bytes);
        } else {
            zn_io_req r;
            rc = zn_ioq_submit(&tr->rq, &r, 0, &zn_tier_get(&tr->tm, id)->ext, rd, bytes,
                               "checkpoint read");
            int r2 = zn_ioq_wait(&tr->rq, &r);
            if (!rc)
                rc = r2;
        }
        if (!rc)
            rc = chunk_put(&c, rd, data);
        if (!rc && q8)
            memcpy(absmax + un->off / ZN_Q8_BLOCK, rd + data, bytes - data);
    }
    if (!rc && q8)
        rc = chunk_put(&c, absmax, zn_q8_blocks(tr->P) * 4);
    /* the fp32 blocks' moments (pinned: never swapped) */
    if (!rc && q8 && tr->f32_slots)
        rc = chunk_put(&c, k == ZN_TS_M ? tr->m32 : tr->v32,
                       tr->f32_slots * ZN_Q8_BLOCK * 4);
    if (!rc && c.fill)
        rc = sink(user, c.B, c.fill);
    if (reg >= 0)
        zn_aio_unregister_buffer(aio, reg);
    free(absmax);
    return rc;
}

int zn_train_state_save(zn_trainer *tr, int k, uint64_t chunk, zn_aio *aio,
                        zn_train_state_sink sink, void *user)
{
    zn_train_state_info in;
    zn_train_state_get_info(tr, &in);
    if (k < 0 || k >= ZN_TS_COUNT || !chunk || (in.max_chunk && chunk > in.max_chunk))
        return zn_set_error(ZN_EINTERNAL, "state save: stream %d in chunks of %llu bytes "
                            "(at most %llu)", k, (unsigned long long)chunk,
                            (unsigned long long)in.max_chunk);
    if (tr->bad)
        return zn_set_error(ZN_ECORRUPT, "state save: the trainer failed earlier");
    return tr->opt_home == ZN_TIER_NVME && !tr->opt_on_device ? save_nvme(tr, k, chunk, aio, sink, user)
                                                    : save_flat(tr, k, chunk, aio, sink, user);
}

/* ---- a final save by reference ------------------------------------------------*/
static const char *swap_file_of(zn_trainer *tr)
{
    if (tr->opt_home != ZN_TIER_NVME || tr->opt_on_device || !tr->tm.swap)
        return NULL;
    zn_swap_stats st;
    zn_swap_get_stats(tr->tm.swap, &st);
    return st.npaths == 1 ? zn_swap_file_path(tr->tm.swap, 0) : NULL;
}

const char *zn_train_state_swap_file(zn_trainer *tr)
{
    return tr->bad ? NULL : swap_file_of(tr);
}

const char *zn_train_state_swap_path(zn_trainer *tr)
{
    return swap_file_of(tr);
}

bool zn_train_state_two_copies(const zn_trainer *tr)
{
    return tr->opt_home == ZN_TIER_NVME && !tr->opt_on_device && tr->plan.spec_shadow > 0 &&
           tr->n_units > 0 && tr->units[0].sid[0][0] != tr->units[0].sid[1][0];
}

void zn_ts_ref_free(zn_ts_ref *r)
{
    free(r->pc);
    memset(r, 0, sizeof *r);
}

static uint32_t zeros_crc(uint64_t len)
{
    static const char z[1 << 16];
    uint32_t c = 0;
    for (; len; len -= len < sizeof z ? len : sizeof z)
        c = zn_crc32c(c, z, len < sizeof z ? (size_t)len : sizeof z);
    return c;
}

/* Appends a piece (merged with the last one where it continues it) and
 * its crc32c. */
static int ref_add(zn_ts_ref *r, size_t *cap, int src, uint64_t off, uint64_t len, uint32_t crc)
{
    if (!len)
        return 0;
    r->crc = zn_crc32c_combine(r->crc, crc, len);
    r->bytes += len;
    zn_ts_piece *l = r->npc ? &r->pc[r->npc - 1] : NULL;
    if (l && l->src == src && (src < 0 || l->off + l->len == off)) {
        l->len += len;
        return 0;
    }
    if (r->npc == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        zn_ts_piece *p = realloc(r->pc, nc * sizeof *p);
        if (!p)
            return zn_set_error(-ENOMEM, "state save: out of memory");
        r->pc = p;
        *cap = nc;
    }
    r->pc[r->npc++] = (zn_ts_piece){ src, off, len };
    return 0;
}

/* Bytes [a, b) of a unit's extent (zero: never written, the initial
 * zeros). */
static int ref_unit(zn_trainer *tr, zn_ts_ref *r, size_t *cap, int id, bool zero, uint64_t a,
                    uint64_t b)
{
    if (b <= a)
        return 0;
    if (zero)
        return ref_add(r, cap, -1, 0, b - a, zeros_crc(b - a));
    const zn_extent *e = &zn_tier_get(&tr->tm, id)->ext;
    uint32_t crc;
    int rc = zn_swap_extent_crc(tr->tm.swap, e, a, b - a, &crc);
    if (rc)
        return zn_error_prefix(rc, "state save by reference");
    return ref_add(r, cap, 0, e->offset + a, b - a, crc);
}

/* The layout is save_nvme's: each unit's elements in turn, then (8-bit)
 * every unit's absmax, then the fp32 blocks' moments. */
int zn_train_state_ref(zn_trainer *tr, int k, zn_ts_ref *out)
{
    memset(out, 0, sizeof *out);
    /* (the save has marked the trainer failed: it owns the file now) */
    if (k < 0 || k >= ZN_TS_COUNT || !swap_file_of(tr))
        return zn_set_error(ZN_EINTERNAL, "state save: stream %d cannot be given by reference",
                            k);
    const bool q8 = k != ZN_TS_MASTER && tr->mom_fmt == ZN_MOM_Q8;
    size_t cap = 0;
    int rc = 0;
    for (int pass = 0; pass < (q8 ? 2 : 1) && !rc; pass++)
        for (int u = 0; u < tr->n_units && !rc; u++) {
            zn_unit *un = &tr->units[u];
            int id = zn_tr_unit_sid(un, k);
            uint64_t bytes = k == ZN_TS_MASTER ? un->n * zn_tr_master_elem(tr)
                                               : zn_tr_unit_mom_bytes(tr, un->n);
            uint64_t data = k == ZN_TS_MASTER ? bytes
                                              : zn_mom_layout_absmax_at(tr->mom_fmt, un->n);
            bool zero = k != ZN_TS_MASTER && atomic_load(&un->mv_zero);
            rc = pass ? ref_unit(tr, out, &cap, id, zero, data, bytes)
                      : ref_unit(tr, out, &cap, id, zero, 0, data);
        }
    if (!rc && q8 && tr->f32_slots) {
        out->tail = k == ZN_TS_M ? tr->m32 : tr->v32;
        out->tail_len = tr->f32_slots * ZN_Q8_BLOCK * 4;
        rc = ref_add(out, &cap, 1, 0, out->tail_len, zn_crc32c(0, out->tail, out->tail_len));
    }
    zn_train_state_info in;
    zn_train_state_get_info(tr, &in);
    if (!rc && out->bytes != in.bytes[k])
        rc = zn_set_error(ZN_EINTERNAL, "state save: stream %d by reference has %llu bytes, "
                          "not %llu", k, (unsigned long long)out->bytes,
                          (unsigned long long)in.bytes[k]);
    if (rc)
        zn_ts_ref_free(out);
    return rc;
}

/* ---- load ----------------------------------------------------------------------*/
/* Sends unit u's working parameters (from fp32 master values) to their
 * homes and waits until they are there. */
static int regen_params(zn_trainer *tr, int u, const void *master, zn_dtype master_dt,
                        void *p16)
{
    zn_unit *un = &tr->units[u];
    zn_opt_slot *s = &tr->opt.slot[0];
    const void *src = master;
    int rc;
    if (tr->param_dt != master_dt) {
        if ((rc = zn_convert(p16, tr->param_dt, master, master_dt, un->n)))
            return rc;
        src = p16;
    }
    int npwr = 0;
    bool h2d = false;
    rc = zn_optsched_params_out(tr, u, src, s->pwr, &npwr, s->h2d_done, &h2d);
    for (int i = 0; i < npwr; i++) {
        int r2 = zn_ioq_wait(&tr->wq, &s->pwr[i]);
        if (!rc)
            rc = r2;
    }
    if (h2d) {
        int r2 = zn_dev_event_sync(tr->dev, s->h2d_done);
        if (!rc)
            rc = r2;
    }
    return rc;
}

/* Moments in format `from` into the flat moments in the run's format,
 * piece by piece: each piece's elements are read in the stored format and
 * converted (zn_mom_convert); 8-bit blocks' absmax first. */
static int load_convert(zn_trainer *tr, zn_mom_fmt from, zn_train_state_source src, void *user)
{
    const size_t E = (size_t)1 << 22;   /* elements per piece: whole 8-bit blocks */
    size_t P = tr->P, eb = from == ZN_MOM_F32 ? 4 : from == ZN_MOM_BF16 ? 2 : 1;
    size_t data = zn_mom_layout_absmax_at(from, P), nabs = zn_mom_layout_bytes(from, P) - data;
    char *buf[2] = { malloc(E * eb), malloc(E * eb) };
    float *abs[2] = { malloc(nabs ? nabs : 1), malloc(nabs ? nabs : 1) };
    int rc = 0;
    if (!buf[0] || !buf[1] || !abs[0] || !abs[1])
        rc = zn_set_error(-ENOMEM, "state load: out of memory converting the moments");
    for (int k = 0; k < 2 && !rc && nabs; k++)
        rc = src(user, ZN_TS_M + k, data, abs[k], nabs);
    for (size_t e0 = 0; e0 < P && !rc; e0 += E) {
        size_t n = P - e0 < E ? P - e0 : E;
        for (int k = 0; k < 2 && !rc; k++)
            rc = src(user, ZN_TS_M + k, e0 * eb, buf[k], n * eb);
        if (rc)
            break;
        zn_moments s = zn_moments_of(from, buf[0], buf[1], abs[0] + e0 / ZN_Q8_BLOCK,
                         abs[1] + e0 / ZN_Q8_BLOCK, ZN_Q8_BNB);
        zn_moments d = zn_tr_moments(tr, e0);
        rc = zn_mom_convert(&d, &s, n);
    }
    free(buf[0]);
    free(buf[1]);
    free(abs[0]);
    free(abs[1]);
    return rc;
}

/* On the device: through the state staging, then each unit's working
 * parameters made again there. A master stored in the other format
 * (master_from) is converted on the way: fp32 rounded to nearest even
 * into a bf16 master, bf16 widened (exactly) into an fp32 one. */
static int load_device(zn_trainer *tr, zn_dtype master_from, zn_train_state_source src,
                       void *user)
{
    const uint64_t chunk = tr->ostage_bytes, eb = zn_tr_master_elem(tr);
    const uint64_t fb = zn_dtype_size(master_from);
    zn_dtype mdt = tr->master_bf16 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    bool conv = master_from != mdt;
    /* the stored master's chunks, when they are converted */
    char *buf = conv ? malloc(chunk) : NULL;
    int rc = conv && !buf ? zn_set_error(-ENOMEM, "state load: out of memory converting the "
                                                  "master") : 0;
    for (int k = 0; k < ZN_TS_COUNT && !rc; k++) {
        bool ck = conv && k == ZN_TS_MASTER;
        uint64_t total = k ? tr->mom_bytes : tr->P * eb;
        /* device bytes per chunk: as many elements as both formats fit */
        uint64_t step = ck ? chunk / (fb > eb ? fb : eb) * eb : chunk;
        for (uint64_t off = 0; off < total && !rc; off += step) {
            uint64_t n = total - off < step ? total - off : step;
            if (!ck)
                rc = src(user, k, off, tr->ostage, n);
            else if (!(rc = src(user, k, off / eb * fb, buf, n / eb * fb)))
                rc = zn_convert(tr->ostage, mdt, buf, master_from, n / eb);
            if (!rc && !(rc = zn_dev_copy_h2d(tr->dev, tr->s_h2d,
                                              (char *)stream_base(tr, k) + off, tr->ostage, n)))
                rc = zn_dev_stream_sync(tr->dev, tr->s_h2d);
        }
    }
    free(buf);
    for (int u = 0; u < tr->n_units && !rc; u++)
        rc = zn_optsched_dev_regen(tr, u);
    return rc;
}

/* The master stream stored as master_from (fp32 or bf16) into the run's
 * master of the other format, in order: fp32 rounded to nearest even into
 * a bf16 master, bf16 widened (exactly) into an fp32 one. */
static int load_master_convert(zn_trainer *tr, zn_dtype master_from, zn_train_state_source src,
                               void *user)
{
    const uint64_t E = (uint64_t)1 << 22;
    const uint64_t eb = zn_dtype_size(master_from);
    zn_dtype to = tr->master_bf16 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    char *buf = malloc(E * eb);
    int rc = buf ? 0 : zn_set_error(-ENOMEM, "state load: out of memory converting the master");
    for (uint64_t e0 = 0; e0 < tr->P && !rc; e0 += E) {
        uint64_t n = tr->P - e0 < E ? tr->P - e0 : E;
        if (!(rc = src(user, ZN_TS_MASTER, e0 * eb, buf, n * eb)))
            rc = zn_convert((char *)tr->master + e0 * zn_tr_master_elem(tr), to, buf,
                            master_from, n);
    }
    free(buf);
    return rc;
}

static int load_flat(zn_trainer *tr, zn_mom_fmt from, zn_dtype master_from,
                     zn_train_state_source src, void *user)
{
    const uint64_t chunk = 64u << 20;
    bool convert = from != tr->mom_fmt;
    zn_dtype mdt = tr->master_bf16 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32;
    int rc = 0;
    for (int k = 0; k < (convert ? 1 : ZN_TS_COUNT) && !rc; k++) {
        if (k == ZN_TS_MASTER && master_from != mdt) {
            rc = load_master_convert(tr, master_from, src, user);
            continue;
        }
        /* the same format: as stored */
        uint64_t total = k ? tr->mom_bytes : tr->P * zn_tr_master_elem(tr);
        char *base = stream_base(tr, k);
        for (uint64_t off = 0; off < total && !rc; off += chunk)
            rc = src(user, k, off, base + off, total - off < chunk ? total - off : chunk);
    }
    if (!rc && convert)
        rc = load_convert(tr, from, src, user);
    for (int u = 0; u < tr->n_units && !rc; u++)
        rc = regen_params(tr, u, (char *)tr->master + tr->units[u].off * zn_tr_master_elem(tr),
                          mdt, tr->opt.pout_flat);
    return rc;
}

/* Zeros the padding of unit u's moments in slot s past their elements
 * (the last unit's: the checkpoint stream's own padding). */
static void slot_pad_zero(zn_trainer *tr, zn_opt_slot *s, int u)
{
    uint64_t n = tr->units[u].n, eb = (uint64_t)tr->mom_elem;
    uint64_t at = zn_mom_layout_absmax_at(tr->mom_fmt, n);
    if (tr->mom_fmt == ZN_MOM_F32 || at == n * eb)
        return;
    memset((char *)s->m + n * eb, 0, at - n * eb);
    memset((char *)s->v + n * eb, 0, at - n * eb);
}

/* On NVMe: unit by unit through the first optimizer slot, written to the
 * unit's extents. The moments come in the run's format or (`from` fp32:
 * another format, or resharded) as fp32, read into the slot's gradient
 * area and converted as the flat load converts them (units start on 8-bit
 * blocks); the master is read last, its area holding the moment not being
 * converted meanwhile. 8-bit moments in the run's format read both
 * streams' absmax (P / 64 bytes each) first, then each unit's codes in
 * order. */
static int load_nvme(zn_trainer *tr, zn_mom_fmt from, zn_dtype master_from,
                     zn_train_state_source src, void *user)
{
    zn_opt_slot *s = &tr->opt.slot[0];
    const zn_mom_fmt fmt = tr->mom_fmt;
    const bool convert = from != fmt, q8 = !convert && fmt == ZN_MOM_Q8;
    const uint64_t nabs = q8 ? zn_q8_blocks(tr->P) * 4 : 0;
    float *absmax[2] = { NULL, NULL };
    int rc = 0;
    if (convert && from != ZN_MOM_F32)
        return zn_set_error(ZN_EINTERNAL, "state load: moments as %s into %s ones on NVMe",
                            zn_mom_fmt_name(from), zn_mom_fmt_name(fmt));
    /* converted 8-bit moments with fp32 blocks: the other moment's fp32
     * blocks land here, as its codes land in the master area */
    float *junk = NULL;
    if (convert && tr->f32_slots &&
        !(junk = malloc(tr->f32_slots * ZN_Q8_BLOCK * 4)))
        return zn_set_error(-ENOMEM, "state load: out of memory for fp32 blocks");
    for (int k = 0; k < 2 && q8 && !rc; k++) {
        if (!(absmax[k] = malloc(nabs)))
            rc = zn_set_error(-ENOMEM, "state load: out of memory for the 8-bit absmax");
        else
            rc = src(user, ZN_TS_M + k, zn_mom_layout_absmax_at(fmt, tr->P), absmax[k], nabs);
        /* the fp32 blocks' moments, after the layout, into their pinned
         * home */
        if (!rc && tr->f32_slots)
            rc = src(user, ZN_TS_M + k, zn_mom_layout_bytes(fmt, tr->P), k ? tr->v32 : tr->m32,
                     tr->f32_slots * ZN_Q8_BLOCK * 4);
    }
    s->unit = -1;
    for (int u = 0; u < tr->n_units && !rc; u++) {
        zn_unit *un = &tr->units[u];
        void *dst[3] = { s->master, s->m, s->v };
        int ids[3] = { zn_tr_unit_sid(un, 0), zn_tr_unit_sid(un, 1), zn_tr_unit_sid(un, 2) };
        uint64_t mb = zn_tr_unit_mom_bytes(tr, un->n);
        zn_moments mv = zn_tr_slot_moments(tr, s, u);
        for (int k = 0; k < 2 && !rc; k++) {
            if (convert) {
                /* fp32 in, the other moment's converted values into the
                 * master area (free until the master is read) */
                zn_moments f = zn_moments_of(ZN_MOM_F32, s->grad, s->grad, NULL, NULL, ZN_Q8_BNB);
                zn_moments d = zn_mom_layout_at(fmt, k ? s->master : s->m, k ? s->v : s->master,
                                                un->n, 0);
                d.scheme = tr->q8_scheme;
                zn_tr_f32_blocks(tr, &d, un->off);
                if (d.n_f32) {
                    /* the fp32 blocks' codes and absmax stay zero, as the
                     * cpu tier keeps them */
                    memset(dst[k + 1], 0, mb);
                    d.m_f32 = k ? junk : tr->m32;
                    d.v_f32 = k ? tr->v32 : junk;
                }
                if (!(rc = src(user, ZN_TS_M + k, un->off * 4, s->grad, un->n * 4)))
                    rc = zn_mom_convert(&d, &f, un->n);
            } else if (fmt == ZN_MOM_F32) {
                rc = src(user, ZN_TS_M + k, un->off * 4, dst[k + 1], un->n * 4);
            } else {
                /* the elements (and the stream's padding after the last) */
                uint64_t eb = (uint64_t)tr->mom_elem;
                rc = src(user, ZN_TS_M + k, un->off * eb, dst[k + 1],
                         zn_mom_layout_absmax_at(fmt, un->n));
                if (!rc && q8)
                    memcpy(k ? mv.v_absmax : mv.m_absmax, absmax[k] + un->off / ZN_Q8_BLOCK,
                           zn_q8_blocks(un->n) * 4);
            }
        }
        if (!rc && convert)
            slot_pad_zero(tr, s, u);
        if (!rc && tr->master_bf16 && master_from == ZN_DTYPE_BF16) {
            rc = src(user, ZN_TS_MASTER, un->off * 2, s->master, un->n * 2);
        } else if (!rc && tr->master_bf16) {
            /* an fp32 master rounded to nearest into the unit's bf16 one,
             * in place from the bottom up (half i's 2 bytes lie in element
             * i / 2's, read already) */
            char *a = (char *)s->master;
            if (!(rc = src(user, ZN_TS_MASTER, un->off * 4, a, un->n * 4)))
                for (uint64_t i = 0; i < un->n; i++) {
                    float f;   /* memcpy: the bytes alias, both ways */
                    memcpy(&f, a + 4 * i, 4);
                    uint16_t h = zn_f32_to_bf16(f);
                    memcpy(a + 2 * i, &h, 2);
                }
        } else if (!rc && master_from == ZN_DTYPE_BF16) {
            /* a bf16 master widened into the unit's fp32 one: read into
             * the area's first half, widened from the top down (element
             * i's 4 bytes cover halves 2i, 2i + 1, read already) */
            char *a = (char *)s->master;
            if (!(rc = src(user, ZN_TS_MASTER, un->off * 2, a, un->n * 2)))
                for (uint64_t i = un->n; i-- > 0;) {
                    uint16_t h;   /* memcpy: the bytes alias, both ways */
                    memcpy(&h, a + 2 * i, 2);
                    float f = zn_bf16_to_f32(h);
                    memcpy(a + 4 * i, &f, 4);
                }
        } else if (!rc) {
            rc = src(user, ZN_TS_MASTER, un->off * 4, s->master, un->n * 4);
        }
        zn_io_req w[3];
        int nw = 0;
        for (int k = 0; k < ZN_TS_COUNT && !rc; k++) {
            rc = zn_ioq_submit(&tr->wq, &w[k], 1, &zn_tier_get(&tr->tm, ids[k])->ext, dst[k],
                               k ? mb : un->n * zn_tr_master_elem(tr), "checkpoint load");
            nw = k + 1;
        }
        for (int k = 0; k < nw; k++) {
            int r2 = zn_ioq_wait(&tr->wq, &w[k]);
            if (!rc)
                rc = r2;
        }
        if (!rc)
            atomic_store(&un->mv_zero, false);  /* the loaded m and v are home */
        if (!rc)
            rc = regen_params(tr, u, s->master, tr->master_bf16 ? ZN_DTYPE_BF16 : ZN_DTYPE_F32,
                              s->pout);
    }
    free(absmax[0]);
    free(absmax[1]);
    free(junk);
    return rc;
}

int zn_train_state_load(zn_trainer *tr, zn_mom_fmt from, zn_dtype master_from,
                        zn_train_state_source src, void *user)
{
    if (tr->bad)
        return zn_set_error(ZN_ECORRUPT, "state load: the trainer failed earlier");
    if (master_from != ZN_DTYPE_F32 && master_from != ZN_DTYPE_BF16)
        return zn_set_error(ZN_EINTERNAL, "state load: a master of %s",
                            zn_dtype_name(master_from));
    bool nvme = tr->opt_home == ZN_TIER_NVME && !tr->opt_on_device;
    if (from != tr->mom_fmt && (tr->opt_on_device || (nvme && from != ZN_MOM_F32)))
        return zn_set_error(ZN_EUNSUPPORTED, "state load: moments as %s into a run keeping "
                            "them as %s on the %s", zn_mom_fmt_name(from),
                            zn_mom_fmt_name(tr->mom_fmt), tr->opt_on_device ? "device" : "NVMe tier");
    int rc = tr->opt_on_device ? load_device(tr, master_from, src, user)
             : nvme   ? load_nvme(tr, from, master_from, src, user)
                      : load_flat(tr, from, master_from, src, user);
    /* each rank made its own shard of the working parameters again; a
     * replicated block (stages 1/2 on several ranks) holds the others'
     * shards too, which are still the initial weights until gathered */
    if (!rc)
        rc = zn_tr_gather_replicated(tr);
    if (rc)
        tr->bad = true;  /* partly replaced: nothing it holds is valid now */
    return rc;
}
