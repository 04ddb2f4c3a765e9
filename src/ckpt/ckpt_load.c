/* A checkpoint loaded into a trainer of any placement and any number of
 * ranks: geometry checked, the master and Adam moments read into the
 * optimizer units, the 16-bit parameters regenerated from the master, the
 * loss scaler restored. Saved by the same number of ranks, each rank reads
 * its own files; saved by another number, each rank gathers its new shares
 * from the old ranks' files (each old share names the elements of a block
 * it holds), after the whole checkpoint verified. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt-impl.h"
#include "train/train-state.h"
#include "zinc/comm.h"


#define PATHN ZN_CKPT_PATH


/* ---- load ---------------------------------------------------------------------------*/
static int check_geometry(const zn_ckpt *ck, zn_trainer *tr, const zn_train_state_info *in,
                          bool *reshard)
{
    int world = zn_train_world(tr), rank = zn_train_rank(tr);
    *reshard = ck->world != world;
    if (ck->nblocks != in->nblocks) {
        uint64_t a = 0, b2 = 0;
        for (int b = 0; b < ck->nblocks; b++)
            a += ck->blocks[b];
        for (int b = 0; b < in->nblocks; b++) {
            zn_block_share s;
            zn_train_block_share(tr, b, &s);
            b2 += s.n;
        }
        if (a == b2)
            return zn_set_error(ZN_ECONFIG, "checkpoint %s holds this model cut into %d blocks; "
                                "this zinc streams it in %d (the vocabulary in parts): resume "
                                "is not possible, but `zinc export` of the checkpoint gives a "
                                "model folder to start from (model.path)", ck->path,
                                ck->nblocks, in->nblocks);
        return zn_set_error(ZN_ECONFIG, "checkpoint %s is of another model: %d blocks, this "
                            "model has %d", ck->path, ck->nblocks, in->nblocks);
    }
    for (int b = 0; b < in->nblocks; b++) {
        zn_block_share s;
        zn_train_block_share(tr, b, &s);
        if (ck->blocks[b] != s.n)
            return zn_set_error(ZN_ECONFIG, "checkpoint %s is of another model: block %d has "
                                "%" PRIu64 " parameters, this model's has %" PRIu64, ck->path, b,
                                ck->blocks[b], s.n);
        if (*reshard)
            continue;   /* the new shares are gathered from the old ones */
        const zn_ckpt_share *c = &ck->ranks[rank].sh[b];
        if (c->shard_off != s.shard_off || c->len != s.len || c->local_off != s.local_off)
            return zn_set_error(ZN_ECONFIG, "checkpoint %s: rank %d's share of block %d differs "
                                "from this run's (sharding changed)", ck->path, rank, b);
    }
    if (!*reshard && ck->ranks[rank].local_params != in->local_params)
        return zn_set_error(ZN_ECONFIG, "checkpoint %s: rank %d holds %" PRIu64 " parameters, "
                            "this run %" PRIu64, ck->path, rank, ck->ranks[rank].local_params,
                            in->local_params);
    return 0;
}

/* Where the state comes from: this rank's own three files, or (reshard)
 * every old rank's, read through the old shares. With `deq`, Adam's moments
 * stored compressed (bf16, 8-bit) are presented as fp32: another world size
 * cuts them into other shares (8-bit blocks then straddle them), and a run
 * that keeps its moments otherwise (fp32 on NVMe or the device, another
 * compressed format) converts them from fp32 as it loads. */
typedef struct {
    const zn_ckpt *ck;
    zn_trainer *tr;
    int nblocks, rank;
    bool reshard, deq;
    zn_ckpt_rd *rd;    /* reshard: [old world][3]; else 3 */
    /* each file's crc32c as the trainer reads it, in order (a read out of
     * order: the files were verified before); a file may also be read as
     * two runs, its tail first (8-bit moments on NVMe, train-state.h):
     * [tail, end) summed apart and combined at the end */
    bool sum;
    /* an old rank's fp32 blocks (8-bit moments), read whole at first use:
     * [old rank][2] (m, v) */
    float **side;
    uint32_t crc[3];
    uint64_t next[3];
    uint32_t tail_crc[3];
    uint64_t tail[3], tail_next[3];  /* tail_next 0: no tail run */
} ld_src;

/* Old rank r's elements [e0, e0 + n) of moment k (1 m, 2 v), stored as
 * ck->moments in r's layout (zn_mom_layout_at: the elements, then an 8-bit
 * block's absmax each), as fp32 into dst; a piece at a time, from the
 * start of the 8-bit block that holds its first element. */
static int ld_read_deq(const ld_src *s, int k, int r, uint64_t e0, uint64_t n, float *dst)
{
    const zn_ckpt *ck = s->ck;
    const zn_mom_fmt fmt = ck->moments;
    const uint64_t P = ck->ranks[r].local_params, E = (uint64_t)1 << 20;
    const size_t eb = fmt == ZN_MOM_BF16 ? 2 : 1;
    const int i = s->reshard ? r * 3 + k : k;
    if (e0 + n > P)
        return zn_set_error(ZN_ECORRUPT, "checkpoint %s: rank %d's moments hold %" PRIu64
                            " elements, not %" PRIu64, ck->path, r, P, e0 + n);
    const uint64_t cap = (n < E ? n : E) + ZN_Q8_BLOCK;  /* a piece and its block's head */
    char *raw = malloc(cap * eb);
    float *out[2] = { malloc(cap * 4), malloc(cap * 4) };
    float *absmax = malloc((cap / ZN_Q8_BLOCK + 2) * 4);
    int rc = 0;
    if (!raw || !out[0] || !out[1] || !absmax)
        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory converting the moments");
    for (uint64_t done = 0; done < n && !rc;) {
        uint64_t a = e0 + done, take = n - done < E ? n - done : E;
        uint64_t from = fmt == ZN_MOM_Q8 ? a / ZN_Q8_BLOCK * ZN_Q8_BLOCK : a;
        uint64_t len = a + take - from;
        if ((rc = zn_ckpt__rd_read(&s->rd[i], from * eb, raw, len * eb)))
            break;
        if (fmt == ZN_MOM_Q8 &&
            (rc = zn_ckpt__rd_read(&s->rd[i],
                                   zn_mom_layout_absmax_at(fmt, P) + from / ZN_Q8_BLOCK * 4,
                                   absmax, zn_q8_blocks(len) * 4)))
            break;
        /* one stream: it stands for both moments, and the one asked for
         * (m's signed map or v's unsigned one) is kept */
        /* (both schemes read alike) */
        zn_moments src = zn_moments_of(fmt, raw, raw, absmax, absmax, ZN_Q8_BNB);
        const zn_ckpt_rank *cr = &ck->ranks[r];
        if (fmt == ZN_MOM_Q8 && cr->n_f32) {
            /* the rank's fp32 blocks, after its layout in the file */
            float **side = &s->side[r * 2 + (k == ZN_TS_M ? 0 : 1)];
            uint64_t sb = cr->f32_slots * ZN_Q8_BLOCK * 4;
            if (!*side) {
                if (!(*side = malloc(sb))) {
                    rc = zn_set_error(-ENOMEM, "checkpoint: out of memory for fp32 blocks");
                    break;
                }
                if ((rc = zn_ckpt__rd_read(&s->rd[i], zn_mom_layout_bytes(fmt, P),
                                         *side, sb))) {
                    free(*side);
                    *side = NULL;
                    break;
                }
            }
            src.f32 = cr->f32;
            src.n_f32 = cr->n_f32;
            src.f32_base = from / ZN_Q8_BLOCK;
            src.m_f32 = src.v_f32 = *side;
        }
        zn_moments f32 = zn_moments_of(ZN_MOM_F32, out[0], out[1], NULL, NULL, ZN_Q8_BNB);
        if ((rc = zn_mom_convert(&f32, &src, len)))
            break;
        memcpy(dst + done, out[k == ZN_TS_M ? 0 : 1] + (a - from), take * 4);
        done += take;
    }
    free(raw);
    free(out[0]);
    free(out[1]);
    free(absmax);
    return rc;
}

/* The bytes of one element of state k as the source presents it: the
 * master as stored (fp32, or bf16: train.master_weights bf16_sr, which the
 * trainer converts if it keeps the other), Adam's moments as fp32 (as
 * stored, or dequantized: deq). Resharded reads only (as stored
 * otherwise). */
static uint64_t ld_elem(const ld_src *s, int k)
{
    return k == ZN_TS_MASTER ? zn_dtype_size(s->ck->master) : 4;
}

/* Old rank r's elements [e0, e0 + n) of state k into dst, as ld_elem says. */
static int ld_piece(const ld_src *s, int k, int r, uint64_t e0, uint64_t n, void *dst)
{
    if (s->deq && k != ZN_TS_MASTER)
        return ld_read_deq(s, k, r, e0, n, dst);
    int i = s->reshard ? r * 3 + k : k;
    uint64_t eb = ld_elem(s, k);
    return zn_ckpt__rd_read(&s->rd[i], e0 * eb, dst, n * eb);
}

/* Bytes [off, off + n) of state k (0 master, 1 m, 2 v) in this rank's
 * local flat space into dst: as stored, or (reshard or deq) as ld_elem
 * says. */
static int ld_read(const ld_src *s, int k, uint64_t off, void *dst, size_t n)
{
    if (!s->reshard && s->deq && k != ZN_TS_MASTER)
        return ld_read_deq(s, k, s->rank, off / 4, n / 4, dst);
    if (!s->reshard)
        return zn_ckpt__rd_read(&s->rd[k], off, dst, n);
    const zn_ckpt *ck = s->ck;
    const uint64_t eb = ld_elem(s, k);
    uint64_t lo = off / eb, hi = (off + n) / eb;  /* elements, local */
    uint64_t done = 0;
    for (int b = 0; b < s->nblocks; b++) {
        zn_block_share ns;
        zn_train_block_share(s->tr, b, &ns);
        uint64_t a = ns.local_off > lo ? ns.local_off : lo;
        uint64_t e = ns.local_off + ns.len < hi ? ns.local_off + ns.len : hi;
        if (a >= e)
            continue;
        /* block elements [g0, g1) of this share, from whichever old rank had them */
        uint64_t g0 = ns.shard_off + (a - ns.local_off), g1 = g0 + (e - a);
        for (int r = 0; r < ck->world && g0 < g1; r++) {
            const zn_ckpt_share *c = &ck->ranks[r].sh[b];
            if (g0 < c->shard_off || g0 >= c->shard_off + c->len)
                continue;
            uint64_t take = c->shard_off + c->len - g0;
            if (take > g1 - g0)
                take = g1 - g0;
            char *d = (char *)dst + ((a + (g0 - (ns.shard_off + (a - ns.local_off)))) - lo) * eb;
            int rc = ld_piece(s, k, r, c->local_off + (g0 - c->shard_off), take, d);
            if (rc)
                return rc;
            done += take;
            g0 += take;
            r = -1;   /* the next range may sit in any old rank */
        }
        if (g0 < g1)
            return zn_set_error(ZN_ECORRUPT, "checkpoint %s: elements %" PRIu64 "..%" PRIu64
                                " of block %d are in no rank's share", ck->path, g0, g1, b);
    }
    if (done != hi - lo)
        return zn_set_error(ZN_EINTERNAL, "checkpoint: resharding read %" PRIu64 " of %" PRIu64
                            " elements", done, hi - lo);
    return 0;
}

static void restore_scaler(json_t *j, zn_loss_scaler *s)
{
    const char *sc = json_string_value(json_object_get(j, "scale"));
    if (sc)
        s->scale = strtod(sc, NULL);
    s->cur_hysteresis = (int)json_integer_value(json_object_get(j, "cur_hysteresis"));
    s->iter = json_integer_value(json_object_get(j, "iter"));
    s->last_overflow_iter = json_integer_value(json_object_get(j, "last_overflow_iter"));
    s->overflows = (uint64_t)json_integer_value(json_object_get(j, "overflows"));
}

/* The state source the trainer reads from (zn_train_state_load). */
static int ld_source(void *user, int k, uint64_t off, void *dst, uint64_t n)
{
    ld_src *s = user;
    int rc = ld_read(s, k, off, dst, n);
    if (rc || !s->sum || !n)
        return rc;
    if (off == s->next[k] && (!s->tail_next[k] || off + n <= s->tail[k])) {
        s->crc[k] = zn_crc32c(s->crc[k], dst, n);
        s->next[k] = off + n;
    } else if (s->tail_next[k] ? off == s->tail_next[k] : off > s->next[k]) {
        if (!s->tail_next[k])
            s->tail[k] = off;
        s->tail_crc[k] = zn_crc32c(s->tail_crc[k], dst, n);
        s->tail_next[k] = off + n;
    } else {
        return zn_set_error(ZN_EINTERNAL, "checkpoint: state %d read at %" PRIu64 ", not in "
                            "order (%" PRIu64 ")", k, off, s->next[k]);
    }
    return 0;
}

/* File k's crc32c and the bytes read of it, once the trainer is done: the
 * head run and the tail run read apart must meet. */
static uint64_t ld_summed(const ld_src *s, int k, uint32_t *crc)
{
    *crc = s->crc[k];
    if (!s->tail_next[k])
        return s->next[k];
    if (s->next[k] != s->tail[k])
        return 0;   /* a gap or an overlap: not the file */
    *crc = zn_crc32c_combine(s->crc[k], s->tail_crc[k], s->tail_next[k] - s->tail[k]);
    return s->tail_next[k];
}

int zn_ckpt_load(zn_ckpt *ck, zn_trainer *tr)
{
    zn_train_state_info in;
    zn_train_state_get_info(tr, &in);
    if (in.failed)
        return zn_set_error(ZN_ECORRUPT, "checkpoint: the trainer failed earlier");
    int rc = zn_train_sync(tr), rank = zn_train_rank(tr);
    bool reshard = false;
    if (!rc)
        rc = check_geometry(ck, tr, &in, &reshard);
    /* Adam's moments: another format than this run's is converted at load;
     * compressed ones that cannot be read as they are (another format or
     * other shares) are read as fp32, and the run converts them from fp32
     * (8-bit ones quantized again, in this run's blocks) */
    bool convert = ck->moments != in.moments;
    /* 8-bit moments whose fp32 blocks are not this run's (a checkpoint
     * from before them, or another model's tensors) are read as fp32 too */
    bool runs_differ = false;
    if (!reshard && ck->moments == ZN_MOM_Q8 && in.moments == ZN_MOM_Q8) {
        const zn_ckpt_rank *cr = &ck->ranks[rank];
        runs_differ = cr->n_f32 != in.n_f32_runs ||
                      (cr->n_f32 && memcmp(cr->f32, in.f32_runs, cr->n_f32 * sizeof *cr->f32));
    }
    bool deq = ck->moments != ZN_MOM_F32 && (reshard || convert || runs_differ);
    zn_mom_fmt from = deq ? ZN_MOM_F32 : ck->moments;
    if (!rc && !in.flat && from != in.moments && !(in.from_f32 && from == ZN_MOM_F32))
        rc = zn_set_error(ZN_EINTERNAL, "checkpoint %s: moments as %s into a run keeping them "
                          "as %s on the %s", ck->path, zn_mom_fmt_name(from),
                          zn_mom_fmt_name(in.moments), in.from_f32 ? "NVMe tier" : "device");
    /* resharded or converted reads take parts of files out of order, whose
     * crc32c cannot be checked on the way: every file is checked first */
    /* the master: fp32 or bf16 (train.master_weights bf16_sr), converted at
     * load when the run keeps the other; resharded, its elements are
     * gathered at their stored size (a bf16 one copied exactly) */
    bool mconvert = ck->master != in.master_dtype;
    if (!rc && (reshard || convert || runs_differ))
        rc = zn_ckpt_verify(ck->path);
    if (rc)
        return rc;
    int nsrc = reshard ? ck->world : 1;
    zn_ckpt_rd *rd = calloc((size_t)nsrc * 3, sizeof *rd);
    float **side = NULL;
    const zn_ckpt_file *f[3] = { NULL, NULL, NULL };
    if (!rd)
        return zn_set_error(-ENOMEM, "checkpoint: out of memory");
    for (int i = 0; i < nsrc * 3; i++) {
        int r = reshard ? i / 3 : rank, k = i % 3;
        char rel[64];
        snprintf(rel, sizeof rel, "rank-%d/%s", r, zn_ckpt__state_file[k]);
        const zn_ckpt_file *fe = zn_ckpt__file(ck, rel);
        if (!reshard)
            f[k] = fe;
        if (!fe) {
            rc = zn_set_error(ZN_ECORRUPT, "checkpoint %s: manifest.json does not list %s",
                              ck->path, rel);
            goto out;
        }
        if ((rc = zn_ckpt__rd_open(&rd[i], ck, fe,
                                   reshard ? POSIX_FADV_NORMAL : POSIX_FADV_SEQUENTIAL)))
            goto out;
    }
    side = calloc((size_t)ck->world * 2, sizeof *side);
    if (!side) {
        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory");
        goto out;
    }
    ld_src src = { .ck = ck, .tr = tr, .nblocks = in.nblocks, .rank = rank,
                   .reshard = reshard, .deq = deq, .rd = rd,
                   .sum = !reshard && !convert && !runs_differ, .side = side };
    uint64_t t0 = zn_now_ns();
    /* From here on the trainer's state is being replaced. */
    rc = zn_train_state_load(tr, from, ck->master, ld_source, &src);
    if (!rc && mconvert)
        zn_warn("checkpoint: %s holds the master weights as %s; this run keeps them as %s "
                "(train.master_weights): %s at load", ck->path, zn_dtype_name(ck->master),
                zn_dtype_name(in.master_dtype),
                in.master_dtype == ZN_DTYPE_BF16 ? "rounded to nearest even" : "widened (exact)");
    if (!rc && convert)
        zn_warn("checkpoint: %s holds Adam's moments as %s; this run keeps them as %s: "
                "converted at load%s", ck->path, zn_mom_fmt_name(ck->moments),
                zn_mom_fmt_name(in.moments),
                in.moments == ZN_MOM_Q8 ? " (quantized blockwise, as a step would)" : "");
    else if (!rc && deq && ck->moments == ZN_MOM_Q8 && !reshard)
        zn_warn("checkpoint: %s keeps %zu run(s) of 8-bit moment blocks in fp32, this run "
                "%zu (the tensors too small to quantize): its moments are read as fp32 and "
                "quantized again where this run quantizes them (within a quantization step "
                "of the saved values)", ck->path, ck->ranks[rank].n_f32, in.n_f32_runs);
    else if (!rc && deq && ck->moments == ZN_MOM_Q8)
        zn_warn("checkpoint: %s holds 8-bit Adam moments in the blocks of %d rank(s)' shares; "
                "on %d they are quantized again in this run's blocks (as a step would: "
                "within a quantization step of the saved values)", ck->path, ck->world,
                zn_train_world(tr));
    for (int k = 0; k < 3 && !rc && src.sum; k++) {
        uint32_t crc;
        if (ld_summed(&src, k, &crc) != f[k]->bytes || crc != f[k]->crc)
            rc = zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s: crc32c 0x%08x, the manifest "
                              "says 0x%08x (corrupted)", ck->path, f[k]->name, crc,
                              f[k]->crc);
    }
    if (rc) {
        zn_train_state_fail(tr);  /* partly replaced: nothing it holds is valid now */
        goto out;
    }
    zn_loss_scaler sc = in.scaler;
    restore_scaler(json_object_get(ck->man, "scaler"), &sc);
    zn_train_state_set_progress(tr, ck->step, ck->steps_run, &sc);
    zn_debug("checkpoint: %s loaded in %.3f s", ck->path, (double)(zn_now_ns() - t0) * 1e-9);
    if (reshard)
        zn_info("checkpoint: %s, saved by %d rank(s), resharded for %d", ck->path, ck->world,
                zn_train_world(tr));
out:
    for (int i = 0; i < nsrc * 3; i++)
        zn_ckpt__rd_close(&rd[i]);
    for (int i = 0; side && i < ck->world * 2; i++)
        free(side[i]);
    free(side);
    free(rd);
    return rc;
}
