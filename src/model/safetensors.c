/* safetensors reader and writer. The header is untrusted input: its length,
 * every tensor's dtype, shape and offsets are checked (no overflow, inside
 * the data section, no overlap, names unique across shards) before any data
 * is read, and data is read with pread into the caller's buffer in bounded
 * chunks, never mapped. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "zinc/safetensors.h"
#include "model/model-impl.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "zinc's safetensors code assumes a little-endian host"
#endif

/* Bytes converted per pread when the on-disk type differs from the target. */
#define CONVERT_CHUNK (1u << 20)
/* An index.json larger than this is refused (real ones are < 100 KiB). */
#define INDEX_MAX (64u << 20)
#define NAME_MAX_LEN 1024

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

static int is_float_io(zn_st_dtype t)
{
    return t == ZN_ST_F32 || t == ZN_ST_F16 || t == ZN_ST_BF16;
}

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
        return zn_m_bf16_to_f32(h);
    }
    case ZN_ST_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return zn_m_f16_to_f32(h);
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
        h = zn_m_f32_to_bf16(f);
        memcpy(p + 2 * i, &h, 2);
        break;
    case ZN_ST_F16:
        h = zn_m_f32_to_f16(f);
        memcpy(p + 2 * i, &h, 2);
        break;
    default:
        break;
    }
}

/* bf16 -> fp32 is the top half of the word: one shift, a loop the compiler
 * vectorises (the loading of a model is bound by it once the disk is fast). */
static void bf16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    uint32_t *d = (uint32_t *)dst;
    for (size_t i = 0; i < n; i++)
        d[i] = (uint32_t)src[i] << 16;
}

static void convert(void *dst, zn_st_dtype to, const void *src, zn_st_dtype from, size_t n)
{
    if (to == from) {
        memcpy(dst, src, n * dtypes[to].size);
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

static int pread_full(int fd, void *buf, size_t len, uint64_t off, const char *path,
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

/* ---- reader ----------------------------------------------------------------- */

typedef struct {
    char *path;
    int fd;
    uint64_t size;
} st_shard;

struct zn_st {
    st_shard *shards;
    int nshards;
    zn_st_tensor *t;
    size_t n, cap;
    size_t *by_name; /* indices into t, sorted by name */
    json_t *meta;    /* first shard's __metadata__ (object) or NULL */
};

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
    st_shard *ns = realloc(s->shards, (size_t)(s->nshards + 1) * sizeof *ns);
    if (!ns)
        return zn_set_error(-ENOMEM, "out of memory");
    s->shards = ns;
    st_shard *sh = &s->shards[s->nshards];
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
    if (nl == 0 || nl > NAME_MAX_LEN)
        return zn_set_error(ZN_ECORRUPT, "%s: tensor name of %zu bytes (must be 1..%d)", path, nl,
                            NAME_MAX_LEN);
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
    st_shard *sh = &s->shards[si];
    unsigned char lenb[8];
    int rc;

    if (sh->size < 8)
        return zn_set_error(ZN_ECORRUPT, "%s: %llu bytes is too short for a safetensors file",
                            sh->path, (unsigned long long)sh->size);
    if ((rc = pread_full(sh->fd, lenb, 8, 0, sh->path, "header length")))
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
    if ((rc = pread_full(sh->fd, hdr, hlen, 8, sh->path, "header"))) {
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

static int valid_shard_name(const char *f)
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
        if (!json_is_string(v) || !valid_shard_name(json_string_value(v))) {
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
    const st_shard *sh = &s->shards[t->shard];
    zn_st_dtype want = zn_st_dtype_from(to);
    size_t ssz = dtypes[t->dtype].size;
    uint64_t off = t->offset + first * ssz;
    char what[NAME_MAX_LEN + 16];
    snprintf(what, sizeof what, "tensor '%s'", t->name);
    if (t->dtype == want)
        return pread_full(sh->fd, dst, dst_bytes, off, sh->path, what);
    if (t->dtype == ZN_ST_BF16 && want == ZN_ST_F32 && !((uintptr_t)dst & 3)) {
        /* no bounce: read the bf16 into the upper half of dst and widen in
         * place front to back. Element i's write [4i, 4i+4) never reaches
         * the unread source at [2n + 2j, ...) for j > i (that would need
         * i > n - 1), also 8 at a time. */
        uint32_t *d32 = dst;
        const uint16_t *s16 = (const uint16_t *)((unsigned char *)dst + count * 2);
        if ((rc = pread_full(sh->fd, (void *)s16, (size_t)count * 2, off, sh->path, what)))
            return rc;
        uint64_t i = 0;
        for (; i + 8 <= count; i += 8) {
            uint16_t v[8];
            memcpy(v, s16 + i, sizeof v);
            for (int k = 0; k < 8; k++)
                d32[i + (uint64_t)k] = (uint32_t)v[k] << 16;
        }
        for (; i < count; i++)
            d32[i] = (uint32_t)s16[i] << 16;
        return 0;
    }
    if (!is_float_io(t->dtype) && t->dtype != ZN_ST_F64)
        return zn_set_error(ZN_EUNSUPPORTED, "%s: tensor '%s' is %s, which does not convert to %s",
                            sh->path, t->name, dtypes[t->dtype].name, zn_dtype_name(to));
    size_t per = CONVERT_CHUNK / ssz;
    void *bounce = malloc(CONVERT_CHUNK);
    if (!bounce)
        return zn_set_error(-ENOMEM, "out of memory");
    unsigned char *d = dst;
    for (uint64_t done = 0; done < count;) {
        size_t m = count - done < per ? (size_t)(count - done) : per;
        if ((rc = pread_full(sh->fd, bounce, m * ssz, off + done * ssz, sh->path, what)))
            break;
        convert(d + done * tsz, want, bounce, t->dtype, m);
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
    const st_shard *sh = &s->shards[t->shard];
    char what[NAME_MAX_LEN + 16];
    snprintf(what, sizeof what, "tensor '%s'", t->name);
    return pread_full(sh->fd, dst, dst_bytes, t->offset, sh->path, what);
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
    char *path, *tmp;
    int fd;
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
    w->fd = -1;
    w->path = strdup(path);
    w->tmp = malloc(strlen(path) + 5);
    w->meta = json_object();
    if (!w->path || !w->tmp || !w->meta) {
        zn_st_writer_destroy(w);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    sprintf(w->tmp, "%s.tmp", path);
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        free(w->tmp);
        w->tmp = NULL; /* nothing to unlink */
        zn_st_writer_destroy(w);
        return zn_set_error(-e, "%s.tmp: %s", path, strerror(e));
    }
    *out = w;
    return 0;
}

void zn_st_writer_destroy(zn_st_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0) {
        close(w->fd);
        if (w->tmp)
            unlink(w->tmp);
    }
    for (size_t i = 0; i < w->n; i++)
        free(w->t[i].name);
    free(w->t);
    json_decref(w->meta);
    free(w->path);
    free(w->tmp);
    free(w);
}

int zn_st_writer_add(zn_st_writer *w, const char *name, zn_st_dtype dtype, int ndim,
                     const int64_t *shape)
{
    if (w->header_done)
        return zn_set_error(ZN_EARG, "%s: tensor '%s' added after the first write", w->path,
                            name);
    if (!name || !*name || strlen(name) > NAME_MAX_LEN || !strcmp(name, "__metadata__"))
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
    if (__builtin_mul_overflow(t.numel, (uint64_t)dtypes[dtype].size, &t.nbytes))
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
            bad |= json_object_set_new(e, "dtype", json_string(dtypes[t->dtype].name));
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
    int rc = pwrite_full(w->fd, buf, 8 + padded, 0, w->tmp);
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
    size_t esz = dtypes[t->dtype].size;
    uint64_t off = w->data_start + t->begin + first * esz;
    zn_st_dtype src_st = zn_st_dtype_from(from);
    if (!is_float_io(t->dtype) || src_st == t->dtype) {
        if ((rc = pwrite_full(w->fd, src, count * esz, off, w->tmp)))
            return rc;
    } else {
        size_t per = CONVERT_CHUNK / esz, fsz = zn_dtype_size(from);
        void *bounce = malloc(CONVERT_CHUNK);
        if (!bounce)
            return zn_set_error(-ENOMEM, "out of memory");
        const unsigned char *sp = src;
        for (uint64_t done = 0; done < count && !rc; done += per) {
            size_t m = count - done < per ? (size_t)(count - done) : per;
            convert(bounce, t->dtype, sp + done * fsz, src_st, m);
            rc = pwrite_full(w->fd, bounce, m * esz, off + done * esz, w->tmp);
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
    if (!w->header_done && (rc = write_header(w)))
        return rc;
    for (size_t i = 0; i < w->n; i++)
        if (w->t[i].written != w->t[i].numel)
            return zn_set_error(ZN_EARG, "%s: tensor '%s': %llu of %llu elements written",
                                w->path, w->t[i].name, (unsigned long long)w->t[i].written,
                                (unsigned long long)w->t[i].numel);
    uint64_t total = w->data_start + (w->n ? w->t[w->n - 1].begin + w->t[w->n - 1].nbytes : 0);
    if (ftruncate(w->fd, (off_t)total) || fsync(w->fd)) {
        int e = errno;
        return zn_set_error(-e, "%s: %s", w->tmp, strerror(e));
    }
    if (close(w->fd)) {
        int e = errno;
        w->fd = -1;
        unlink(w->tmp);
        return zn_set_error(-e, "%s: close: %s", w->tmp, strerror(e));
    }
    w->fd = -1;
    if (rename(w->tmp, w->path)) {
        int e = errno;
        unlink(w->tmp);
        return zn_set_error(-e, "%s: rename: %s", w->path, strerror(e));
    }
    return 0;
}

int zn_st_write_index(const char *path, size_t n, const char *const *names,
                      const char *const *files, uint64_t total_size)
{
    json_t *root = json_object(), *meta = json_object(), *wm = json_object();
    int bad = !root || !meta || !wm;
    for (size_t i = 0; i < n && !bad; i++) {
        if (!valid_shard_name(files[i])) {
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
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp) {
        json_decref(root);
        return zn_set_error(-ENAMETOOLONG, "%s: path too long", path);
    }
    int rc = json_dump_file(root, tmp, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (rc || rename(tmp, path)) {
        int e = errno ? errno : EIO;
        unlink(tmp);
        return zn_set_error(-e, "%s: %s", path, strerror(e));
    }
    return 0;
}
