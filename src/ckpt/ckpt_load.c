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
#include "offload/train-impl.h"
#include "zinc/comm.h"


#define PATHN ZN_CKPT_PATH


/* ---- load ---------------------------------------------------------------------------*/
static int check_geometry(const zn_ckpt *ck, zn_trainer *tr, bool *reshard)
{
    int world = zn_train_world(tr), rank = zn_train_rank(tr);
    *reshard = ck->world != world;
    if (ck->nblocks != tr->L) {
        uint64_t a = 0, b2 = 0;
        for (int b = 0; b < ck->nblocks; b++)
            a += ck->blocks[b];
        for (int b = 0; b < tr->L; b++) {
            zn_block_share s;
            zn_train_block_share(tr, b, &s);
            b2 += s.n;
        }
        if (a == b2)
            return zn_set_error(ZN_ECONFIG, "checkpoint %s holds this model cut into %d blocks; "
                                "this zinc streams it in %d (the vocabulary in parts): resume "
                                "is not possible, but `zinc export` of the checkpoint gives a "
                                "model folder to start from (model.path)", ck->path,
                                ck->nblocks, tr->L);
        return zn_set_error(ZN_ECONFIG, "checkpoint %s is of another model: %d blocks, this "
                            "model has %d", ck->path, ck->nblocks, tr->L);
    }
    for (int b = 0; b < tr->L; b++) {
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
    if (!*reshard && ck->ranks[rank].local_params != tr->P)
        return zn_set_error(ZN_ECONFIG, "checkpoint %s: rank %d holds %" PRIu64 " parameters, "
                            "this run %" PRIu64, ck->path, rank, ck->ranks[rank].local_params,
                            tr->P);
    return 0;
}

/* Where the state comes from: this rank's own three files, or (reshard)
 * every old rank's, read through the old shares. */
typedef struct {
    const zn_ckpt *ck;
    zn_trainer *tr;
    bool reshard;
    int *fds;          /* reshard: [old world][3]; else 3 */
    char (*paths)[PATHN + 64];
} ld_src;

/* Bytes [off, off + n) of state k (0 master, 1 m, 2 v) in this rank's
 * local flat space into dst. */
static int ld_read(const ld_src *s, int k, uint64_t off, void *dst, size_t n)
{
    if (!s->reshard)
        return zn_ckpt__pread(s->fds[k], s->paths[k], off, dst, n);
    const zn_ckpt *ck = s->ck;
    uint64_t lo = off / 4, hi = (off + n) / 4;  /* elements, local */
    uint64_t done = 0;
    for (int b = 0; b < s->tr->L; b++) {
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
            char *d = (char *)dst + ((a + (g0 - (ns.shard_off + (a - ns.local_off)))) - lo) * 4;
            int rc = zn_ckpt__pread(s->fds[r * 3 + k], s->paths[r * 3 + k],
                                    (c->local_off + (g0 - c->shard_off)) * 4, d, take * 4);
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

/* Sends unit u's working parameters (from fp32 master values) to their
 * homes and waits until they are there. */
static int regen_params(zn_trainer *tr, int u, const float *master, void *p16)
{
    zn_unit *un = &tr->units[u];
    zn_opt_slot *s = &tr->oslot[0];
    const void *src = master;
    int rc;
    if (tr->pdt != ZN_DTYPE_F32) {
        if ((rc = zn_convert(p16, tr->pdt, master, ZN_DTYPE_F32, un->n)))
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

/* The checkpoint's moments (format `from`, this rank's own files) into
 * the trainer's flat moments in its format, piece by piece: each piece's
 * elements are read in the file's format and converted (zn_mom_convert).
 * crc[1], crc[2] cover the files in their byte order. */
static int load_convert(const ld_src *src, zn_trainer *tr, zn_mom_fmt from, uint32_t crc[3])
{
    const size_t E = (size_t)1 << 22;   /* elements per piece: whole 8-bit blocks */
    size_t P = tr->P, eb = from == ZN_MOM_F32 ? 4 : from == ZN_MOM_BF16 ? 2 : 1;
    size_t data = zn_mom_layout_absmax_at(from, P), total = zn_mom_layout_bytes(from, P);
    size_t nabs = total - data;
    char *buf[2] = { malloc(E * eb), malloc(E * eb) };
    float *abs[2] = { malloc(nabs ? nabs : 1), malloc(nabs ? nabs : 1) };
    int rc = 0;
    if (!buf[0] || !buf[1] || !abs[0] || !abs[1])
        rc = zn_set_error(-ENOMEM, "checkpoint: out of memory converting the moments");
    for (int k = 0; k < 2 && !rc && nabs; k++)
        rc = ld_read(src, k + 1, data, abs[k], nabs);
    for (size_t e0 = 0; e0 < P && !rc; e0 += E) {
        size_t n = P - e0 < E ? P - e0 : E;
        for (int k = 0; k < 2 && !rc; k++)
            if (!(rc = ld_read(src, k + 1, e0 * eb, buf[k], n * eb)))
                crc[k + 1] = zn_crc32c(crc[k + 1], buf[k], n * eb);
        if (rc)
            break;
        zn_moments s = { from, buf[0], buf[1], abs[0] + e0 / ZN_Q8_BLOCK,
                         abs[1] + e0 / ZN_Q8_BLOCK };
        zn_moments d = zn_tr_moments(tr, e0);
        rc = zn_mom_convert(&d, &s, n);
    }
    /* the padding before the absmax, then the absmax: the files' last bytes */
    for (int k = 0; k < 2 && !rc; k++) {
        char pad[64];
        if (data > P * eb && !(rc = ld_read(src, k + 1, P * eb, pad, data - P * eb)))
            crc[k + 1] = zn_crc32c(crc[k + 1], pad, data - P * eb);
        if (!rc && nabs)
            crc[k + 1] = zn_crc32c(crc[k + 1], abs[k], nabs);
    }
    free(buf[0]);
    free(buf[1]);
    free(abs[0]);
    free(abs[1]);
    return rc;
}

int zn_ckpt_load(zn_ckpt *ck, zn_trainer *tr)
{
    if (tr->bad)
        return zn_set_error(ZN_ECORRUPT, "checkpoint: the trainer failed earlier");
    int rc = zn_train_sync(tr), rank = zn_train_rank(tr);
    bool reshard = false;
    if (!rc)
        rc = check_geometry(ck, tr, &reshard);
    /* Adam's moments: another format than this run's is converted at load
     * (the cpu tier, no resharding, so far) */
    bool convert = ck->moments != tr->mfmt;
    if (!rc && (reshard || tr->dopt || tr->oopt == ZN_OFFLOAD_NVME) &&
        (convert || ck->moments != ZN_MOM_F32))
        rc = zn_set_error(ZN_EUNSUPPORTED, "checkpoint %s keeps Adam's moments as %s and this "
                          "run as %s%s: %s is implemented for the cpu optimizer tier without "
                          "resharding so far; resume with train.optim %s and the checkpoint's "
                          "world size and tiers", ck->path, zn_mom_fmt_name(ck->moments),
                          zn_mom_fmt_name(tr->mfmt), reshard ? ", with another world size" : "",
                          convert ? "converting them" : "reading compressed moments",
                          ck->moments == ZN_MOM_F32 ? "adamw_torch"
                          : ck->moments == ZN_MOM_Q8 ? "adamw_bnb_8bit" : "adamw_bf16");
    /* resharded reads take parts of files, whose crc32c cannot be checked
     * on the way: every file is checked first */
    if (!rc && reshard)
        rc = zn_ckpt_verify(ck->path);
    if (rc)
        return rc;
    int nsrc = reshard ? ck->world : 1;
    int *fd = malloc((size_t)nsrc * 3 * sizeof *fd);
    char (*path)[PATHN + 64] = malloc((size_t)nsrc * 3 * sizeof *path);
    const zn_ckpt_file *f[3] = { NULL, NULL, NULL };
    uint32_t crc[3] = { 0, 0, 0 };
    if (!fd || !path) {
        free(fd);
        free(path);
        return zn_set_error(-ENOMEM, "checkpoint: out of memory");
    }
    for (int i = 0; i < nsrc * 3; i++)
        fd[i] = -1;
    for (int i = 0; i < nsrc * 3; i++) {
        int r = reshard ? i / 3 : rank, k = i % 3;
        char rel[64];
        snprintf(rel, sizeof rel, "rank-%d/%s", r, zn_ckpt__state_file[k]);
        if (!reshard)
            f[k] = zn_ckpt__file(ck, rel);
        snprintf(path[i], sizeof path[i], "%s/%s", ck->path, rel);
        fd[i] = open(path[i], O_RDONLY | O_CLOEXEC);
        if (fd[i] < 0) {
            rc = zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s: %s", ck->path, rel,
                              strerror(errno));
            goto out;
        }
        posix_fadvise(fd[i], 0, 0, reshard ? POSIX_FADV_NORMAL : POSIX_FADV_SEQUENTIAL);
    }
    ld_src src = { ck, tr, reshard, fd, path };
    uint64_t t0 = zn_now_ns();
    /* From here on the trainer's state is being replaced. */
    if (tr->dopt) {
        float *arr[3] = { tr->master, tr->mom, tr->var };
        const uint64_t chunk = tr->ostage_bytes;
        for (int k = 0; k < 3 && !rc; k++)
            for (uint64_t off = 0; off < tr->P * 4 && !rc; off += chunk) {
                size_t n = (size_t)(tr->P * 4 - off < chunk ? tr->P * 4 - off : chunk);
                if (!(rc = ld_read(&src, k, off, tr->ostage, n)) &&
                    !(rc = zn_dev_copy_h2d(tr->dev, tr->s_h2d, (char *)arr[k] + off, tr->ostage,
                                           n)) &&
                    !(rc = zn_dev_stream_sync(tr->dev, tr->s_h2d)))
                    crc[k] = zn_crc32c(crc[k], tr->ostage, n);
            }
        for (int u = 0; u < tr->n_units && !rc; u++)
            rc = zn_optsched_dev_regen(tr, u);
    } else if (tr->oopt != ZN_OFFLOAD_NVME) {
        float *arr[3] = { tr->master, tr->mom, tr->var };
        const uint64_t chunk = 64u << 20;
        for (int k = 0; k < (convert ? 1 : 3) && !rc; k++) {
            uint64_t total = k ? tr->mbytes : tr->P * 4;   /* the same format: as stored */
            for (uint64_t off = 0; off < total && !rc; off += chunk) {
                size_t n = (size_t)(total - off < chunk ? total - off : chunk);
                if (!(rc = ld_read(&src, k, off, (char *)arr[k] + off, n)))
                    crc[k] = zn_crc32c(crc[k], (char *)arr[k] + off, n);
            }
        }
        if (!rc && convert && !(rc = load_convert(&src, tr, ck->moments, crc)))
            zn_warn("checkpoint: %s holds Adam's moments as %s; this run keeps them as %s: "
                    "converted at load%s", ck->path, zn_mom_fmt_name(ck->moments),
                    zn_mom_fmt_name(tr->mfmt),
                    tr->mfmt == ZN_MOM_Q8 ? " (quantized blockwise, as a step would)" : "");
        for (int u = 0; u < tr->n_units && !rc; u++)
            rc = regen_params(tr, u, tr->master + tr->units[u].off, tr->pout_flat);
    } else {
        zn_opt_slot *s = &tr->oslot[0];
        float *dst[3] = { s->master, s->m, s->v };
        s->unit = -1;
        for (int u = 0; u < tr->n_units && !rc; u++) {
            zn_unit *un = &tr->units[u];
            int ids[3] = { un->master_id, un->m_id, un->v_id };
            zn_io_req w[3];
            int nw = 0;
            for (int k = 0; k < 3 && !rc; k++) {
                rc = ld_read(&src, k, un->off * 4, dst[k], un->n * 4);
                if (rc)
                    break;
                crc[k] = zn_crc32c(crc[k], dst[k], un->n * 4);
                rc = zn_ioq_submit(&tr->wq, &w[k], 1, &zn_tier_get(&tr->tm, ids[k])->ext,
                                   dst[k], un->n * 4, "checkpoint load");
                nw = k + 1;
            }
            for (int k = 0; k < nw; k++) {
                int r2 = zn_ioq_wait(&tr->wq, &w[k]);
                if (!rc)
                    rc = r2;
            }
            if (!rc)
                atomic_store(&un->mv_zero, false);  /* the checkpoint's m and v are home */
            if (!rc)
                rc = regen_params(tr, u, s->master, s->pout);
        }
    }
    for (int k = 0; k < 3 && !rc && !reshard; k++)
        if (crc[k] != f[k]->crc)
            rc = zn_set_error(ZN_ECORRUPT, "checkpoint %s: file %s: crc32c 0x%08x, the manifest "
                              "says 0x%08x (corrupted)", ck->path, f[k]->name, crc[k], f[k]->crc);
    if (rc) {
        tr->bad = true; /* partly replaced: nothing it holds is valid now */
        goto out;
    }
    tr->step = ck->step;
    tr->steps_run = ck->steps_run;
    restore_scaler(json_object_get(ck->man, "scaler"), &tr->scaler);
    zn_debug("checkpoint: %s loaded in %.3f s", ck->path, (double)(zn_now_ns() - t0) * 1e-9);
    if (reshard)
        zn_info("checkpoint: %s, saved by %d rank(s), resharded for %d", ck->path, ck->world,
                zn_train_world(tr));
out:
    for (int i = 0; i < nsrc * 3; i++)
        if (fd[i] >= 0)
            close(fd[i]);
    free(fd);
    free(path);
    return rc;
}
