/* safetensors writer: tensors declared, then written in element order in
 * pieces (converted on the way), the header first and the file renamed into
 * place once complete; and the index.json of a sharded checkpoint. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "zinc/safetensors.h"
#include "model/model-impl.h"
#include "util/fs-impl.h"

static int pwrite_full(int fd, const void *buf, size_t len, uint64_t off, const char *path)
{
    const unsigned char *p = buf;
    while (len) {
        ssize_t r = pwrite(fd, p, len > (1u << 30) ? (1u << 30) : len, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            return zn_set_error(-e, "%s: write at offset %llu: %s", path, (unsigned long long)off,
                                strerror(e));
        }
        if (r == 0)
            return zn_set_error(-EIO, "%s: write at offset %llu wrote nothing", path,
                                (unsigned long long)off);
        p += r;
        len -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

/* ---- writer ----------------------------------------------------------------- */

typedef struct {
    char *name;
    zn_st_dtype dtype;
    int ndim;
    int64_t shape[ZN_ST_MAX_DIMS];
    uint64_t numel, nbytes, begin, written;
} wt_tensor;

struct zn_st_writer {
    char *path;
    zn_fs_tmp out;  /* the temporary the file is written in, until finish */
    wt_tensor *t;
    size_t n, cap;
    json_t *meta;
    int header_done;
    uint64_t data_start;
};

int zn_st_writer_create(zn_st_writer **out, const char *path)
{
    *out = NULL;
    zn_st_writer *w = calloc(1, sizeof *w);
    if (!w)
        return zn_set_error(-ENOMEM, "out of memory");
    w->out.fd = -1;
    w->path = strdup(path);
    w->meta = json_object();
    if (!w->path || !w->meta) {
        zn_st_writer_destroy(w);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    int rc = zn_fs_tmp_open(&w->out, path, 0644);
    if (rc) {
        zn_st_writer_destroy(w);
        return rc;
    }
    *out = w;
    return 0;
}

void zn_st_writer_destroy(zn_st_writer *w)
{
    if (!w)
        return;
    zn_fs_tmp_abort(&w->out); /* unfinished: no file under the final name */
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    json_decref(w->meta);
    free(w->path);
    free(w);
}

int zn_st_writer_add(zn_st_writer *w, const char *name, zn_st_dtype dtype, int ndim,
                     const int64_t *shape)
{
    if (w->header_done)
        return zn_set_error(ZN_EARG, "%s: tensor '%s' added after the first write", w->path,
                            name);
    if (!name || !*name || strlen(name) > ZN_M_ST_NAME_MAX || !strcmp(name, "__metadata__"))
        return zn_set_error(ZN_EARG, "%s: bad tensor name", w->path);
    if ((unsigned)dtype >= ZN_ST_NDTYPES)
        return zn_set_error(ZN_EARG, "%s: tensor '%s': bad dtype %d", w->path, name, (int)dtype);
    if (ndim < 0 || ndim > ZN_ST_MAX_DIMS)
        return zn_set_error(ZN_EARG, "%s: tensor '%s': %d dimensions", w->path, name, ndim);
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->t[i].name, name))
            return zn_set_error(ZN_EARG, "%s: tensor '%s' added twice", w->path, name);
    wt_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dtype;
    t.ndim = ndim;
    t.numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(t.numel, (uint64_t)shape[i], &t.numel))
            return zn_set_error(ZN_EARG, "%s: tensor '%s': bad shape", w->path, name);
        t.shape[i] = shape[i];
    }
    if (__builtin_mul_overflow(t.numel, (uint64_t)zn_st_dtype_size(dtype), &t.nbytes))
        return zn_set_error(ZN_EARG, "%s: tensor '%s': too large", w->path, name);
    t.begin = w->n ? w->t[w->n - 1].begin + w->t[w->n - 1].nbytes : 0;
    if (w->n == w->cap) {
        size_t nc = w->cap ? 2 * w->cap : 64;
        wt_tensor *nt = realloc(w->t, nc * sizeof *nt);
        if (!nt)
            return zn_set_error(-ENOMEM, "out of memory");
        w->t = nt;
        w->cap = nc;
    }
    t.name = strdup(name);
    if (!t.name)
        return zn_set_error(-ENOMEM, "out of memory");
    w->t[w->n++] = t;
    return 0;
}

int zn_st_writer_set_metadata(zn_st_writer *w, const char *key, const char *value)
{
    if (w->header_done)
        return zn_set_error(ZN_EARG, "%s: metadata set after the first write", w->path);
    json_t *v = json_string(value);
    if (!v || json_object_set_new(w->meta, key, v))
        return zn_set_error(ZN_EARG, "%s: bad metadata '%s' (not UTF-8?)", w->path, key);
    return 0;
}

static int write_header(zn_st_writer *w)
{
    json_t *root = json_object();
    int bad = !root;
    if (!bad && json_object_size(w->meta))
        bad |= json_object_set(root, "__metadata__", w->meta);
    for (size_t i = 0; i < w->n && !bad; i++) {
        wt_tensor *t = &w->t[i];
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        bad |= !e || !shape || !offs;
        for (int d = 0; d < t->ndim && !bad; d++)
            bad |= json_array_append_new(shape, json_integer(t->shape[d]));
        if (!bad) {
            bad |= json_array_append_new(offs, json_integer((json_int_t)t->begin));
            bad |= json_array_append_new(offs, json_integer((json_int_t)(t->begin + t->nbytes)));
            bad |= json_object_set_new(e, "dtype", json_string(zn_st_dtype_name(t->dtype)));
            bad |= json_object_set_new(e, "shape", shape);
            bad |= json_object_set_new(e, "data_offsets", offs);
            shape = offs = NULL;
            bad |= json_object_set_new(root, t->name, e);
            e = NULL;
        }
        json_decref(e);
        json_decref(shape);
        json_decref(offs);
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text)
        return zn_set_error(ZN_EARG, "%s: cannot encode the header (names not UTF-8?)", w->path);
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    unsigned char *buf = malloc(8 + padded);
    if (!buf) {
        free(text);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, text, len);
    memset(buf + 8 + len, ' ', padded - len);
    free(text);
    int rc = pwrite_full(w->out.fd, buf, 8 + padded, 0, w->out.tmp);
    free(buf);
    if (rc)
        return rc;
    w->data_start = 8 + padded;
    w->header_done = 1;
    return 0;
}

int zn_st_writer_write(zn_st_writer *w, const char *name, zn_dtype from, const void *src,
                       uint64_t first, uint64_t count)
{
    int rc;
    wt_tensor *t = NULL;
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->t[i].name, name)) {
            t = &w->t[i];
            break;
        }
    if (!t)
        return zn_set_error(ZN_EARG, "%s: tensor '%s' was not added", w->path, name);
    if (first != t->written || count > t->numel - t->written)
        return zn_set_error(ZN_EARG, "%s: tensor '%s': write of [%llu, +%llu) out of order (%llu "
                                     "of %llu written)",
                            w->path, name, (unsigned long long)first, (unsigned long long)count,
                            (unsigned long long)t->written, (unsigned long long)t->numel);
    if (!w->header_done && (rc = write_header(w)))
        return rc;
    size_t esz = zn_st_dtype_size(t->dtype);
    uint64_t off = w->data_start + t->begin + first * esz;
    zn_st_dtype src_st = zn_st_dtype_from(from);
    if (!zn_m_st_is_float_io(t->dtype) || src_st == t->dtype) {
        if ((rc = pwrite_full(w->out.fd, src, count * esz, off, w->out.tmp)))
            return rc;
    } else {
        size_t per = ZN_M_ST_CONVERT_CHUNK / esz, fsz = zn_dtype_size(from);
        void *bounce = malloc(ZN_M_ST_CONVERT_CHUNK);
        if (!bounce)
            return zn_set_error(-ENOMEM, "out of memory");
        const unsigned char *sp = src;
        for (uint64_t done = 0; done < count && !rc; done += per) {
            size_t m = count - done < per ? (size_t)(count - done) : per;
            zn_m_st_convert(bounce, t->dtype, sp + done * fsz, src_st, m);
            rc = pwrite_full(w->out.fd, bounce, m * esz, off + done * esz, w->out.tmp);
        }
        free(bounce);
        if (rc)
            return rc;
    }
    t->written += count;
    return 0;
}

int zn_st_writer_finish(zn_st_writer *w)
{
    int rc;
    if (!w->out.tmp)
        return zn_set_error(ZN_EARG, "%s: finished already, or its file failed", w->path);
    if (!w->header_done && (rc = write_header(w)))
        return rc;
    for (size_t i = 0; i < w->n; i++)
        if (w->t[i].written != w->t[i].numel)
            return zn_set_error(ZN_EARG, "%s: tensor '%s': %llu of %llu elements written",
                                w->path, w->t[i].name, (unsigned long long)w->t[i].written,
                                (unsigned long long)w->t[i].numel);
    uint64_t total = w->data_start + (w->n ? w->t[w->n - 1].begin + w->t[w->n - 1].nbytes : 0);
    if (ftruncate(w->out.fd, (off_t)total)) {
        int e = errno;
        return zn_set_error(-e, "%s: ftruncate %s: %s", w->path, w->out.tmp, strerror(e));
    }
    return zn_fs_tmp_commit(&w->out);
}

int zn_st_write_index(const char *path, size_t n, const char *const *names,
                      const char *const *files, uint64_t total_size)
{
    json_t *root = json_object(), *meta = json_object(), *wm = json_object();
    int bad = !root || !meta || !wm;
    for (size_t i = 0; i < n && !bad; i++) {
        if (!zn_m_st_valid_shard_name(files[i])) {
            json_decref(root);
            json_decref(meta);
            json_decref(wm);
            return zn_set_error(ZN_EARG, "%s: '%s' is not a bare file name", path, files[i]);
        }
        bad |= json_object_set_new(wm, names[i], json_string(files[i]));
    }
    if (!bad) {
        bad |= json_object_set_new(meta, "total_size", json_integer((json_int_t)total_size));
        bad |= json_object_set_new(root, "metadata", meta);
        meta = NULL;
        bad |= json_object_set_new(root, "weight_map", wm);
        wm = NULL;
    }
    json_decref(meta);
    json_decref(wm);
    if (bad) {
        json_decref(root);
        return zn_set_error(ZN_EARG, "%s: cannot build the index (names not UTF-8?)", path);
    }
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (!text)
        return zn_set_error(-ENOMEM, "%s: out of memory writing the index", path);
    int rc = zn_fs_write_atomic(path, text, strlen(text));
    free(text);
    return rc;
}
