/* safetensors reader: a file, a folder or a sharded index opened. The header
 * is untrusted input: its length, every tensor's dtype, shape and offsets are
 * checked (no overflow, inside the data section, no overlap, names unique
 * across shards) before any data is read (safetensors_read.c); the writer is
 * safetensors_write.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "zinc/safetensors.h"
#include "model/model-impl.h"

/* An index.json larger than this is refused (real ones are < 100 KiB). */
#define INDEX_MAX (64u << 20)

static const struct {
    const char *name;
    size_t size;
} dtypes[ZN_ST_NDTYPES] = {
    [ZN_ST_BOOL] = { "BOOL", 1 },    [ZN_ST_U8] = { "U8", 1 },
    [ZN_ST_I8] = { "I8", 1 },        [ZN_ST_F8_E4M3] = { "F8_E4M3", 1 },
    [ZN_ST_F8_E5M2] = { "F8_E5M2", 1 }, [ZN_ST_I16] = { "I16", 2 },
    [ZN_ST_U16] = { "U16", 2 },      [ZN_ST_F16] = { "F16", 2 },
    [ZN_ST_BF16] = { "BF16", 2 },    [ZN_ST_I32] = { "I32", 4 },
    [ZN_ST_U32] = { "U32", 4 },      [ZN_ST_F32] = { "F32", 4 },
    [ZN_ST_I64] = { "I64", 8 },      [ZN_ST_U64] = { "U64", 8 },
    [ZN_ST_F64] = { "F64", 8 },
};

size_t zn_st_dtype_size(zn_st_dtype t)
{
    return (unsigned)t < ZN_ST_NDTYPES ? dtypes[t].size : 0;
}

const char *zn_st_dtype_name(zn_st_dtype t)
{
    return (unsigned)t < ZN_ST_NDTYPES ? dtypes[t].name : "?";
}

zn_st_dtype zn_st_dtype_from(zn_dtype t)
{
    return t == ZN_DTYPE_BF16 ? ZN_ST_BF16 : t == ZN_DTYPE_F16 ? ZN_ST_F16 : ZN_ST_F32;
}

static int dtype_parse(const char *s, zn_st_dtype *out)
{
    for (int i = 0; i < ZN_ST_NDTYPES; i++)
        if (!strcmp(s, dtypes[i].name)) {
            *out = (zn_st_dtype)i;
            return 0;
        }
    return -1;
}

/* ---- reader ----------------------------------------------------------------- */

void zn_st_close(zn_st *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->nshards; i++) {
        if (s->shards[i].fd >= 0)
            close(s->shards[i].fd);
        free(s->shards[i].path);
    }
    free(s->shards);
    for (size_t i = 0; i < s->n; i++)
        free((char *)s->t[i].name);
    free(s->t);
    free(s->by_name);
    json_decref(s->meta);
    free(s);
}

static int add_shard(zn_st *s, const char *path)
{
    zn_m_st_shard *ns = realloc(s->shards, (size_t)(s->nshards + 1) * sizeof *ns);
    if (!ns)
        return zn_set_error(-ENOMEM, "out of memory");
    s->shards = ns;
    zn_m_st_shard *sh = &s->shards[s->nshards];
    sh->fd = -1;
    sh->path = strdup(path);
    if (!sh->path)
        return zn_set_error(-ENOMEM, "out of memory");
    s->nshards++;
    sh->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (sh->fd < 0) {
        int e = errno;
        return zn_set_error(-e, "%s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(sh->fd, &st)) {
        int e = errno;
        return zn_set_error(-e, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode))
        return zn_set_error(ZN_ECORRUPT, "%s: not a regular file", path);
    sh->size = (uint64_t)st.st_size;
    return 0;
}

static int push_tensor(zn_st *s, const zn_st_tensor *t)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? 2 * s->cap : 64;
        zn_st_tensor *nt = realloc(s->t, nc * sizeof *nt);
        if (!nt)
            return zn_set_error(-ENOMEM, "out of memory");
        s->t = nt;
        s->cap = nc;
    }
    s->t[s->n++] = *t;
    return 0;
}

/* Parses one tensor entry of shard `si`'s header. data_start/data_len
 * locate the data section in the file. */
static int parse_entry(zn_st *s, int si, const char *name, json_t *e, uint64_t data_start,
                       uint64_t data_len)
{
    const char *path = s->shards[si].path;
    zn_st_tensor t;
    memset(&t, 0, sizeof t);

    size_t nl = strlen(name);
    if (nl == 0 || nl > ZN_M_ST_NAME_MAX)
        return zn_set_error(ZN_ECORRUPT, "%s: tensor name of %zu bytes (must be 1..%d)", path, nl,
                            ZN_M_ST_NAME_MAX);
    if (!json_is_object(e))
        return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': entry is not an object", path, name);
    const char *key;
    json_t *v;
    json_object_foreach(e, key, v) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': unknown key '%s'", path, name,
                                key);
    }
    json_t *jd = json_object_get(e, "dtype");
    if (!json_is_string(jd))
        return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': 'dtype' missing or not a string", path,
                            name);
    if (dtype_parse(json_string_value(jd), &t.dtype))
        return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': unknown dtype '%s'", path, name,
                            json_string_value(jd));

    json_t *js = json_object_get(e, "shape");
    if (!json_is_array(js))
        return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': 'shape' missing or not an array", path,
                            name);
    size_t nd = json_array_size(js);
    if (nd > ZN_ST_MAX_DIMS)
        return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': %zu dimensions (zinc reads at most %d)",
                            path, name, nd, ZN_ST_MAX_DIMS);
    t.ndim = (int)nd;
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *x = json_array_get(js, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': shape[%zu] is not a non-negative "
                                             "integer", path, name, i);
        t.shape[i] = (int64_t)json_integer_value(x);
        if (__builtin_mul_overflow(numel, (uint64_t)t.shape[i], &numel))
            return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': shape product overflows", path,
                                name);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(numel, (uint64_t)dtypes[t.dtype].size, &nbytes) ||
        nbytes > (uint64_t)INT64_MAX)
        return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': size in bytes overflows", path, name);
    t.numel = numel;
    t.nbytes = nbytes;

    json_t *jo = json_object_get(e, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !json_is_integer(json_array_get(jo, 0)) || !json_is_integer(json_array_get(jo, 1)))
        return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': 'data_offsets' must be [begin, end]",
                            path, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0));
    json_int_t en = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || en < b)
        return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': data_offsets [%lld, %lld] are not an "
                                         "ascending pair of non-negative numbers",
                            path, name, (long long)b, (long long)en);
    if ((uint64_t)en > data_len)
        return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': data_offsets [%lld, %lld] end past the "
                                         "data section (%llu bytes; file truncated?)",
                            path, name, (long long)b, (long long)en,
                            (unsigned long long)data_len);
    if ((uint64_t)(en - b) != nbytes)
        return zn_set_error(ZN_ECORRUPT, "%s: tensor '%s': data_offsets span %lld bytes but %s "
                                         "x %llu elements need %llu",
                            path, name, (long long)(en - b), dtypes[t.dtype].name,
                            (unsigned long long)numel, (unsigned long long)nbytes);
    t.offset = data_start + (uint64_t)b;
    t.shard = si;
    t.name = strdup(name);
    if (!t.name)
        return zn_set_error(-ENOMEM, "out of memory");
    int rc = push_tensor(s, &t);
    if (rc)
        free((char *)t.name);
    return rc;
}

static int cmp_offset(const void *a, const void *b)
{
    const zn_st_tensor *x = a, *y = b;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

static int parse_shard_header(zn_st *s, int si)
{
    zn_m_st_shard *sh = &s->shards[si];
    unsigned char lenb[8];
    int rc;

    if (sh->size < 8)
        return zn_set_error(ZN_ECORRUPT, "%s: %llu bytes is too short for a safetensors file",
                            sh->path, (unsigned long long)sh->size);
    if ((rc = zn_m_st_pread_full(sh->fd, lenb, 8, 0, sh->path, "header length")))
        return rc;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | lenb[i];
    if (hlen < 2 || hlen > ZN_ST_HEADER_MAX)
        return zn_set_error(ZN_ECORRUPT, "%s: header length %llu is outside 2..%u (not a "
                                         "safetensors file?)",
                            sh->path, (unsigned long long)hlen, ZN_ST_HEADER_MAX);
    if (hlen > sh->size - 8)
        return zn_set_error(ZN_ECORRUPT, "%s: header length %llu runs past the end of the file "
                                         "(%llu bytes)",
                            sh->path, (unsigned long long)hlen, (unsigned long long)sh->size);
    char *hdr = malloc(hlen);
    if (!hdr)
        return zn_set_error(-ENOMEM, "%s: out of memory for a %llu-byte header", sh->path,
                            (unsigned long long)hlen);
    if ((rc = zn_m_st_pread_full(sh->fd, hdr, hlen, 8, sh->path, "header"))) {
        free(hdr);
        return rc;
    }
    if (hdr[0] != '{') {
        free(hdr);
        return zn_set_error(ZN_ECORRUPT, "%s: header does not start with '{'", sh->path);
    }
    json_error_t jerr;
    json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
    free(hdr);
    if (!root)
        return zn_set_error(ZN_ECORRUPT, "%s: header JSON, byte %d: %s", sh->path,
                            jerr.position, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return zn_set_error(ZN_ECORRUPT, "%s: header is not a JSON object", sh->path);
    }
    uint64_t data_start = 8 + hlen, data_len = sh->size - data_start;
    size_t first = s->n;
    const char *key;
    json_t *v;
    rc = 0;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) {
                rc = zn_set_error(ZN_ECORRUPT, "%s: __metadata__ is not an object", sh->path);
                break;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    rc = zn_set_error(ZN_ECORRUPT, "%s: __metadata__ value '%s' is not a string",
                                      sh->path, mk);
                    break;
                }
            }
            if (rc)
                break;
            if (si == 0 && !s->meta)
                s->meta = json_incref(v);
            continue;
        }
        if ((rc = parse_entry(s, si, key, v, data_start, data_len)))
            break;
    }
    json_decref(root);
    if (rc)
        return rc;

    /* No two tensors of this file may share bytes. */
    if (s->n > first)  /* a header of no tensors ("{}") has nothing to sort */
        qsort(s->t + first, s->n - first, sizeof *s->t, cmp_offset);
    for (size_t i = first + 1; i < s->n; i++) {
        const zn_st_tensor *a = &s->t[i - 1], *b = &s->t[i];
        if (b->offset < a->offset + a->nbytes)
            return zn_set_error(ZN_ECORRUPT, "%s: tensors '%s' and '%s' overlap (data_offsets "
                                             "[%llu, %llu) and [%llu, %llu))",
                                sh->path, a->name, b->name,
                                (unsigned long long)(a->offset - data_start),
                                (unsigned long long)(a->offset - data_start + a->nbytes),
                                (unsigned long long)(b->offset - data_start),
                                (unsigned long long)(b->offset - data_start + b->nbytes));
    }
    return 0;
}

static int build_name_index(zn_st *s)
{
    s->by_name = malloc((s->n ? s->n : 1) * sizeof *s->by_name);
    if (!s->by_name)
        return zn_set_error(-ENOMEM, "out of memory");
    for (size_t i = 0; i < s->n; i++)
        s->by_name[i] = i;
    /* Merge sort of indices by name (qsort has no context argument). */
    size_t n = s->n;
    size_t *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!tmp)
        return zn_set_error(-ENOMEM, "out of memory");
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = strcmp(s->t[s->by_name[i]].name, s->t[s->by_name[j]].name) <= 0
                               ? s->by_name[i++] : s->by_name[j++];
            while (i < mid)
                tmp[k++] = s->by_name[i++];
            while (j < hi)
                tmp[k++] = s->by_name[j++];
        }
        memcpy(s->by_name, tmp, n * sizeof *tmp);
    }
    free(tmp);
    for (size_t i = 1; i < n; i++) {
        const zn_st_tensor *a = &s->t[s->by_name[i - 1]], *b = &s->t[s->by_name[i]];
        if (!strcmp(a->name, b->name))
            return zn_set_error(ZN_ECORRUPT, "tensor '%s' appears twice: in %s and in %s",
                                a->name, s->shards[a->shard].path, s->shards[b->shard].path);
    }
    return 0;
}

const zn_st_tensor *zn_st_find(const zn_st *s, const char *name)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(s->t[s->by_name[mid]].name, name);
        if (c == 0)
            return &s->t[s->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int zn_m_st_valid_shard_name(const char *f)
{
    size_t l = strlen(f);
    return l > 0 && l < 256 && !strchr(f, '/') && strcmp(f, ".") && strcmp(f, "..");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int open_index(zn_st *s, const char *index_path)
{
    struct stat st;
    json_error_t jerr;
    int rc = 0;
    const char **files = NULL;
    size_t nfiles = 0;

    if (stat(index_path, &st))
        return zn_set_error(-errno, "%s: %s", index_path, strerror(errno));
    if ((uint64_t)st.st_size > INDEX_MAX)
        return zn_set_error(ZN_ECORRUPT, "%s: %lld bytes is too large for an index", index_path,
                            (long long)st.st_size);
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return zn_set_error(ZN_ECORRUPT, "%s: line %d: %s", index_path, jerr.line, jerr.text);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        rc = zn_set_error(ZN_ECORRUPT, "%s: missing object 'weight_map'", index_path);
        goto out;
    }
    size_t nmap = json_object_size(wm);
    files = calloc(nmap ? nmap : 1, sizeof *files);
    if (!files) {
        rc = zn_set_error(-ENOMEM, "out of memory");
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        if (!json_is_string(v) || !zn_m_st_valid_shard_name(json_string_value(v))) {
            rc = zn_set_error(ZN_ECORRUPT, "%s: weight_map['%s'] must be a file name in the same "
                                           "folder (no '/')", index_path, key);
            goto out;
        }
        files[nfiles++] = json_string_value(v);
    }
    if (nfiles)
        qsort(files, nfiles, sizeof *files, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < nfiles; i++)
        if (!u || strcmp(files[u - 1], files[i]))
            files[u++] = files[i];

    /* The shards live beside the index. */
    char dir[4096];
    const char *slash = strrchr(index_path, '/');
    int dl = slash ? (int)(slash - index_path) : 1;
    snprintf(dir, sizeof dir, "%.*s", dl, slash ? index_path : ".");
    for (size_t i = 0; i < u; i++) {
        char p[4096 + 260];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if ((rc = add_shard(s, p)) || (rc = parse_shard_header(s, s->nshards - 1)))
            goto out;
    }
    if ((rc = build_name_index(s)))
        goto out;
    /* The index and the shards must agree, name by name. */
    json_object_foreach(wm, key, v) {
        const zn_st_tensor *t = zn_st_find(s, key);
        const char *want = json_string_value(v);
        if (!t) {
            rc = zn_set_error(ZN_ECORRUPT, "%s: tensor '%s' is mapped to %s but that file does "
                                           "not hold it", index_path, key, want);
            goto out;
        }
        const char *have = strrchr(s->shards[t->shard].path, '/');
        have = have ? have + 1 : s->shards[t->shard].path;
        if (strcmp(have, want)) {
            rc = zn_set_error(ZN_ECORRUPT, "%s: tensor '%s' is mapped to %s but found in %s",
                              index_path, key, want, have);
            goto out;
        }
    }
    if (s->n != nmap) {
        for (size_t i = 0; i < s->n; i++)
            if (!json_object_get(wm, s->t[i].name)) {
                rc = zn_set_error(ZN_ECORRUPT, "%s: tensor '%s' is in %s but not in the index",
                                  index_path, s->t[i].name, s->shards[s->t[i].shard].path);
                goto out;
            }
    }
out:
    free(files);
    json_decref(root);
    return rc;
}

int zn_st_open(zn_st **out, const char *path)
{
    struct stat st;
    char buf[4096 + 64];
    int rc;

    *out = NULL;
    zn_st *s = calloc(1, sizeof *s);
    if (!s)
        return zn_set_error(-ENOMEM, "out of memory");
    if (stat(path, &st)) {
        rc = zn_set_error(-errno, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path);
        if (!access(buf, F_OK)) {
            rc = open_index(s, buf);
        } else {
            snprintf(buf, sizeof buf, "%s/model.safetensors", path);
            if (access(buf, F_OK)) {
                rc = zn_set_error(-ENOENT, "%s: no model.safetensors.index.json or "
                                           "model.safetensors in this folder", path);
                goto fail;
            }
            rc = add_shard(s, buf);
            if (!rc)
                rc = parse_shard_header(s, 0);
            if (!rc)
                rc = build_name_index(s);
        }
    } else {
        size_t l = strlen(path);
        if (l >= 5 && !strcmp(path + l - 5, ".json")) {
            rc = open_index(s, path);
        } else {
            rc = add_shard(s, path);
            if (!rc)
                rc = parse_shard_header(s, 0);
            if (!rc)
                rc = build_name_index(s);
        }
    }
    if (rc)
        goto fail;
    *out = s;
    return 0;
fail:
    zn_st_close(s);
    return rc;
}

size_t zn_st_count(const zn_st *s)
{
    return s->n;
}

const zn_st_tensor *zn_st_tensor_at(const zn_st *s, size_t i)
{
    return i < s->n ? &s->t[i] : NULL;
}

int zn_st_num_shards(const zn_st *s)
{
    return s->nshards;
}

const char *zn_st_shard_path(const zn_st *s, int shard)
{
    return shard >= 0 && shard < s->nshards ? s->shards[shard].path : NULL;
}

const char *zn_st_metadata(const zn_st *s, const char *key)
{
    json_t *v = s->meta ? json_object_get(s->meta, key) : NULL;
    return v ? json_string_value(v) : NULL;
}
