/* safetensors tensor data: read with pread into the caller's buffer in
 * bounded chunks, never mapped, and converted between the float types on the
 * way (the conversion serves the writer too). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zinc/safetensors.h"
#include "model/model-impl.h"

/* ---- element conversion -------------------------------------------------- */

static float load_elem(const void *src, zn_st_dtype t, size_t i)
{
    const unsigned char *p = src;
    switch (t) {
    case ZN_ST_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case ZN_ST_F64: {
        double x;
        memcpy(&x, p + 8 * i, 8);
        return (float)x;
    }
    case ZN_ST_BF16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return zn_bf16_widen(h);
    }
    case ZN_ST_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return zn_f16_widen(h);
    }
    default:
        return 0.0f;
    }
}

static void store_elem(void *dst, zn_st_dtype t, size_t i, float f)
{
    unsigned char *p = dst;
    uint16_t h;
    switch (t) {
    case ZN_ST_F32:
        memcpy(p + 4 * i, &f, 4);
        break;
    case ZN_ST_BF16:
        h = zn_bf16_round(f);
        memcpy(p + 2 * i, &h, 2);
        break;
    case ZN_ST_F16:
        h = zn_f16_round(f);
        memcpy(p + 2 * i, &h, 2);
        break;
    default:
        break;
    }
}

/* bf16 -> fp32 is the top half of the word: one shift, a loop the compiler
 * vectorises (the loading of a model is bound by it once the disk is fast).
 * Serial, not zn_convert: the reader runs inside the loader's own OpenMP
 * loop (model_train.c, read_pieces), one 1 MiB chunk at a time. */
static void bf16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = zn_bf16_widen(src[i]);
}

void zn_m_st_convert(void *dst, zn_st_dtype to, const void *src, zn_st_dtype from, size_t n)
{
    if (to == from) {
        memcpy(dst, src, n * zn_st_dtype_size(to));
        return;
    }
    if (from == ZN_ST_BF16 && to == ZN_ST_F32 && !((uintptr_t)src & 1) && !((uintptr_t)dst & 3)) {
        bf16_to_f32(dst, src, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        store_elem(dst, to, i, load_elem(src, from, i));
}

/* ---- I/O helpers ---------------------------------------------------------- */

int zn_m_st_pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path,
                       const char *what)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t r = pread(fd, p, len > (1u << 30) ? (1u << 30) : len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            return zn_set_error(-e, "%s: reading %s at offset %llu: %s", path, what,
                                (unsigned long long)off, strerror(e));
        }
        if (r == 0)
            return zn_set_error(-EIO, "%s: reading %s at offset %llu: unexpected end of file "
                                      "(%zu bytes missing; file truncated?)",
                                path, what, (unsigned long long)off, len);
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static int check_owned(const zn_st *s, const zn_st_tensor *t)
{
    if (!t || t < s->t || t >= s->t + s->n)
        return zn_set_error(ZN_EARG, "zn_st_read: tensor does not belong to this checkpoint");
    return 0;
}

int zn_st_read_range(zn_st *s, const zn_st_tensor *t, uint64_t first, uint64_t count, zn_dtype to,
                     void *dst, size_t dst_bytes)
{
    int rc = check_owned(s, t);
    if (rc)
        return rc;
    size_t tsz = zn_dtype_size(to);
    if (!tsz)
        return zn_set_error(ZN_EARG, "tensor '%s': bad target dtype %d", t->name, (int)to);
    if (first > t->numel || count > t->numel - first)
        return zn_set_error(ZN_EARG, "tensor '%s': elements [%llu, +%llu) outside its %llu",
                            t->name, (unsigned long long)first, (unsigned long long)count,
                            (unsigned long long)t->numel);
    if ((uint64_t)dst_bytes != count * tsz)
        return zn_set_error(ZN_EARG, "tensor '%s': %llu elements as %s need %llu bytes, the "
                                     "buffer has %zu",
                            t->name, (unsigned long long)count, zn_dtype_name(to),
                            (unsigned long long)(count * tsz), dst_bytes);
    const zn_m_st_shard *sh = &s->shards[t->shard];
    zn_st_dtype want = zn_st_dtype_from(to);
    size_t ssz = zn_st_dtype_size(t->dtype);
    uint64_t off = t->offset + first * ssz;
    char what[ZN_M_ST_NAME_MAX + 16];
    snprintf(what, sizeof what, "tensor '%s'", t->name);
    if (t->dtype == want)
        return zn_m_st_pread_full(sh->fd, dst, dst_bytes, off, sh->path, what);
    if (t->dtype == ZN_ST_BF16 && want == ZN_ST_F32 && !((uintptr_t)dst & 3)) {
        /* no bounce: read the bf16 into the upper half of dst and widen in
         * place front to back. Element i's write [4i, 4i+4) never reaches
         * the unread source at [2n + 2j, ...) for j > i (that would need
         * i > n - 1), also 8 at a time. */
        float *df = dst;
        const uint16_t *s16 = (const uint16_t *)((unsigned char *)dst + count * 2);
        if ((rc = zn_m_st_pread_full(sh->fd, (void *)s16, (size_t)count * 2, off, sh->path, what)))
            return rc;
        uint64_t i = 0;
        for (; i + 8 <= count; i += 8) {
            uint16_t v[8];
            memcpy(v, s16 + i, sizeof v);
            for (int k = 0; k < 8; k++)
                df[i + (uint64_t)k] = zn_bf16_widen(v[k]);
        }
        for (; i < count; i++) {
            uint16_t v;
            memcpy(&v, s16 + i, sizeof v);
            df[i] = zn_bf16_widen(v);
        }
        return 0;
    }
    if (!zn_m_st_is_float_io(t->dtype) && t->dtype != ZN_ST_F64)
        return zn_set_error(ZN_EUNSUPPORTED, "%s: tensor '%s' is %s, which does not convert to %s",
                            sh->path, t->name, zn_st_dtype_name(t->dtype), zn_dtype_name(to));
    size_t per = ZN_M_ST_CONVERT_CHUNK / ssz;
    void *bounce = malloc(ZN_M_ST_CONVERT_CHUNK);
    if (!bounce)
        return zn_set_error(-ENOMEM, "out of memory");
    unsigned char *d = dst;
    for (uint64_t done = 0; done < count;) {
        size_t m = count - done < per ? (size_t)(count - done) : per;
        if ((rc = zn_m_st_pread_full(sh->fd, bounce, m * ssz, off + done * ssz, sh->path, what)))
            break;
        zn_m_st_convert(d + done * tsz, want, bounce, t->dtype, m);
        done += m;
    }
    free(bounce);
    return rc;
}

int zn_st_read(zn_st *s, const zn_st_tensor *t, zn_dtype to, void *dst, size_t dst_bytes)
{
    int rc = check_owned(s, t);
    if (rc)
        return rc;
    return zn_st_read_range(s, t, 0, t->numel, to, dst, dst_bytes);
}

int zn_st_read_raw(zn_st *s, const zn_st_tensor *t, void *dst, size_t dst_bytes)
{
    int rc = check_owned(s, t);
    if (rc)
        return rc;
    if ((uint64_t)dst_bytes != t->nbytes)
        return zn_set_error(ZN_EARG, "tensor '%s': %llu bytes, the buffer has %zu", t->name,
                            (unsigned long long)t->nbytes, dst_bytes);
    const zn_m_st_shard *sh = &s->shards[t->shard];
    char what[ZN_M_ST_NAME_MAX + 16];
    snprintf(what, sizeof what, "tensor '%s'", t->name);
    return zn_m_st_pread_full(sh->fd, dst, dst_bytes, t->offset, sh->path, what);
}
