/* Token data: the ZNTOKENS file (mmap), the synthetic Markov-chain dataset,
 * and the loader (windows, per-epoch seeded shuffle, data-parallel slices).
 * Everything is a pure function of (data, seed, step, rank), so a restarted
 * or re-sharded run sees the same sequences. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zinc/tokens.h"
#include "util/fs-impl.h"

struct zn_tokens {
    char *name;
    const unsigned char *ids; /* mapped ids (after the header) or heap */
    void *map;                /* whole mapping, or NULL */
    size_t map_len;
    uint32_t *owned;          /* synthetic data */
    uint64_t count;
    uint32_t vocab;
    int width;
    const unsigned char *mask; /* version 2: bit i = token i is a target, or NULL */
    const unsigned char *ends; /* version 2: ndocs little-endian u64, or NULL */
    uint64_t ndocs;
};

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__extension__ typedef unsigned __int128 u128;

/* Uniform in [0, n) without modulo bias (Lemire's method). */
static uint64_t rand_below(uint64_t *s, uint64_t n)
{
    u128 m = (u128)splitmix64(s) * n;
    uint64_t lo = (uint64_t)m;
    if (lo < n) {
        uint64_t t = -n % n;
        while (lo < t) {
            m = (u128)splitmix64(s) * n;
            lo = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

static uint32_t rd_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd_u64(const unsigned char *p)
{
    return (uint64_t)rd_u32(p) | (uint64_t)rd_u32(p + 4) << 32;
}

void zn_tokens_close(zn_tokens *t)
{
    if (!t)
        return;
    if (t->map)
        munmap(t->map, t->map_len);
    free(t->owned);
    free(t->name);
    free(t);
}

int zn_tokens_open(zn_tokens **out, const char *path)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zn_set_error(-errno, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return zn_set_error(-e, "%s: fstat: %s", path, strerror(e));
    }
    uint64_t size = (uint64_t)st.st_size;
    unsigned char h[ZN_TOKENS_HEADER];
    if (size < ZN_TOKENS_HEADER || pread(fd, h, sizeof h, 0) != (ssize_t)sizeof h) {
        close(fd);
        return zn_set_error(ZN_ECORRUPT, "%s: %llu bytes is too short for a token file header",
                            path, (unsigned long long)size);
    }
    uint32_t version = rd_u32(h + 8), width = rd_u32(h + 12), vocab = rd_u32(h + 24);
    uint32_t flags = rd_u32(h + 28);
    uint64_t count = rd_u64(h + 16);
    const char *bad = NULL;
    char msg[200];
    /* version 2 sections after the ids: the mask (ceil(count / 8) bytes),
     * then u64 ndocs and ndocs u64 ends */
    uint64_t ids_end = 0, mask_bytes = 0, ndocs = 0, want = 0;
    if (memcmp(h, ZN_TOKENS_MAGIC, 8))
        bad = "bad magic (not a zinc token file)";
    else if (version != ZN_TOKENS_VERSION && version != ZN_TOKENS_VERSION2)
        snprintf(msg, sizeof msg, "version %u (zinc reads 1 and 2)", version), bad = msg;
    else if (version == 1 && flags)
        snprintf(msg, sizeof msg, "reserved field at offset 28 is %u (must be 0 in version 1)",
                 flags), bad = msg;
    else if (flags & ~(ZN_TOKENS_HAS_MASK | ZN_TOKENS_HAS_DOCS))
        snprintf(msg, sizeof msg, "unknown flags 0x%x at offset 28", flags), bad = msg;
    else if (width != 2 && width != 4)
        snprintf(msg, sizeof msg, "width %u (must be 2 or 4)", width), bad = msg;
    else if (count > (size - ZN_TOKENS_HEADER) / width)
        snprintf(msg, sizeof msg, "count %llu x width %u + %d header bytes is beyond the file "
                 "size %llu", (unsigned long long)count, width, ZN_TOKENS_HEADER,
                 (unsigned long long)size), bad = msg;
    else if (width == 2 && vocab > 65536)
        snprintf(msg, sizeof msg, "vocab %u does not fit 16-bit ids", vocab), bad = msg;
    if (!bad) {
        ids_end = ZN_TOKENS_HEADER + count * width;
        mask_bytes = flags & ZN_TOKENS_HAS_MASK ? (count + 7) / 8 : 0;
        want = ids_end + mask_bytes;
        if (flags & ZN_TOKENS_HAS_DOCS) {
            unsigned char nb[8];
            if (want + 8 > size || pread(fd, nb, 8, (off_t)want) != 8) {
                snprintf(msg, sizeof msg, "the document count at offset %llu is past the end "
                         "of the file (%llu bytes)", (unsigned long long)want,
                         (unsigned long long)size), bad = msg;
            } else {
                ndocs = rd_u64(nb);
                if (ndocs > (size - want - 8) / 8)
                    snprintf(msg, sizeof msg, "%llu document ends at offset %llu do not fit "
                             "the file (%llu bytes)", (unsigned long long)ndocs,
                             (unsigned long long)(want + 8), (unsigned long long)size),
                        bad = msg;
                want += 8 + ndocs * 8;
            }
        }
        if (!bad && want != size)
            snprintf(msg, sizeof msg, "the file is %llu bytes; the header (version %u, count "
                     "%llu x width %u%s%s) says %llu", (unsigned long long)size, version,
                     (unsigned long long)count, width, mask_bytes ? ", a mask" : "",
                     ndocs ? ", document ends" : "", (unsigned long long)want), bad = msg;
    }
    if (bad) {
        close(fd);
        return zn_set_error(ZN_ECORRUPT, "%s: %s", path, bad);
    }
    zn_tokens *t = calloc(1, sizeof *t);
    if (!t || !(t->name = strdup(path))) {
        free(t);
        close(fd);
        return zn_set_error(-ENOMEM, "out of memory");
    }
    t->map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (t->map == MAP_FAILED) {
        t->map = NULL;
        zn_tokens_close(t);
        return zn_set_error(-e, "%s: mmap: %s", path, strerror(e));
    }
    t->map_len = size;
    t->ids = (const unsigned char *)t->map + ZN_TOKENS_HEADER;
    t->count = count;
    t->vocab = vocab;
    t->width = (int)width;
    if (mask_bytes)
        t->mask = (const unsigned char *)t->map + ids_end;
    if (flags & ZN_TOKENS_HAS_DOCS) {
        t->ends = (const unsigned char *)t->map + ids_end + mask_bytes + 8;
        t->ndocs = ndocs;
        /* ends strictly increasing, the last one the count */
        uint64_t prev = 0;
        for (uint64_t k = 0; k < ndocs; k++) {
            uint64_t end = rd_u64(t->ends + 8 * k);
            if (end <= prev || end > count || (k == ndocs - 1 && end != count)) {
                zn_tokens_close(t);
                return zn_set_error(ZN_ECORRUPT, "%s: document %llu ends at %llu (after %llu, "
                                    "of %llu tokens): ends must increase and the last must be "
                                    "the token count", path, (unsigned long long)k,
                                    (unsigned long long)end, (unsigned long long)prev,
                                    (unsigned long long)count);
            }
            prev = end;
        }
    }
    *out = t;
    return 0;
}

int zn_tokens_is_target(const zn_tokens *t, uint64_t i)
{
    return !t->mask || ((t->mask[i >> 3] >> (i & 7)) & 1);
}

int zn_tokens_doc_start(const zn_tokens *t, uint64_t i)
{
    if (!t->ndocs || i == 0)
        return 0;
    /* is i one of the ends (binary search)? */
    uint64_t lo = 0, hi = t->ndocs;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2, e = rd_u64(t->ends + 8 * mid);
        if (e == i)
            return 1;
        if (e < i)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

uint64_t zn_tokens_num_docs(const zn_tokens *t)
{
    return t->ndocs;
}

int zn_tokens_has_mask(const zn_tokens *t)
{
    return t->mask != NULL;
}

/* The synthetic chain's successor probabilities (sum 1). */
static const double syn_p[4] = { 0.6, 0.2, 0.15, 0.05 };

double zn_tokens_synthetic_entropy(void)
{
    double h = 0;
    for (int k = 0; k < 4; k++)
        h -= syn_p[k] * log(syn_p[k]);
    return h;
}

int zn_tokens_synthetic(zn_tokens **out, uint64_t count, uint32_t vocab, uint64_t seed)
{
    *out = NULL;
    if (vocab < 8)
        return zn_set_error(ZN_EARG, "synthetic data: vocab %u must be >= 8", vocab);
    if (count == 0 || count > ((uint64_t)1 << 34))
        return zn_set_error(ZN_EARG, "synthetic data: count %llu must be in 1..2^34",
                            (unsigned long long)count);
    zn_tokens *t = calloc(1, sizeof *t);
    uint32_t *succ = malloc((size_t)vocab * 4 * sizeof *succ);
    if (!t || !succ || !(t->name = strdup("synthetic")) ||
        !(t->owned = malloc(count * sizeof *t->owned))) {
        free(succ);
        zn_tokens_close(t);
        return zn_set_error(-ENOMEM, "synthetic data: out of memory for %llu tokens",
                            (unsigned long long)count);
    }
    /* Each token's 4 distinct successors, drawn from its own stream. */
    for (uint32_t v = 0; v < vocab; v++) {
        uint64_t s = seed * 0x2545f4914f6cdd1dull ^ ((uint64_t)v << 32 | 0x5eed);
        for (int k = 0; k < 4; k++) {
            uint32_t c;
            int dup;
            do {
                c = (uint32_t)rand_below(&s, vocab);
                dup = 0;
                for (int j = 0; j < k; j++)
                    dup |= succ[v * 4 + j] == c;
            } while (dup);
            succ[v * 4 + k] = c;
        }
    }
    uint64_t s = seed ^ 0x6a09e667f3bcc909ull;
    uint32_t cur = (uint32_t)rand_below(&s, vocab);
    for (uint64_t i = 0; i < count; i++) {
        t->owned[i] = cur;
        double u = (double)(splitmix64(&s) >> 11) * 0x1.0p-53, acc = 0;
        int k = 3;
        for (int j = 0; j < 4; j++) {
            acc += syn_p[j];
            if (u < acc) {
                k = j;
                break;
            }
        }
        cur = succ[cur * 4 + k];
    }
    free(succ);
    t->ids = (const unsigned char *)t->owned;
    t->count = count;
    t->vocab = vocab;
    t->width = 4;
    *out = t;
    return 0;
}

uint64_t zn_tokens_count(const zn_tokens *t)
{
    return t->count;
}

uint32_t zn_tokens_vocab(const zn_tokens *t)
{
    return t->vocab;
}

int zn_tokens_width(const zn_tokens *t)
{
    return t->width;
}

const char *zn_tokens_name(const zn_tokens *t)
{
    return t->name;
}

uint32_t zn_tokens_get(const zn_tokens *t, uint64_t i)
{
    const unsigned char *p = t->ids + i * (uint64_t)t->width;
    return t->width == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : rd_u32(p);
}

int zn_tokens_write(const char *path, const uint32_t *ids, uint64_t n, int width, uint32_t vocab)
{
    return zn_tokens_write2(path, ids, n, width, vocab, NULL, NULL, 0);
}

int zn_tokens_write2(const char *path, const uint32_t *ids, uint64_t n, int width,
                     uint32_t vocab, const uint8_t *mask, const uint64_t *doc_ends, uint64_t ndocs)
{
    for (uint64_t k = 0; k < ndocs; k++)
        if ((k ? doc_ends[k] <= doc_ends[k - 1] : doc_ends[k] == 0) || doc_ends[k] > n ||
            (k == ndocs - 1 && doc_ends[k] != n))
            return zn_set_error(ZN_EARG, "%s: document %llu ends at %llu: ends must increase "
                                "and the last must be the count %llu", path,
                                (unsigned long long)k, (unsigned long long)doc_ends[k],
                                (unsigned long long)n);
    int v2 = mask || ndocs;
    uint32_t flags = (mask ? ZN_TOKENS_HAS_MASK : 0) | (ndocs ? ZN_TOKENS_HAS_DOCS : 0);
    if (width != 2 && width != 4)
        return zn_set_error(ZN_EARG, "%s: width %d must be 2 or 4", path, width);
    for (uint64_t i = 0; i < n; i++)
        if ((width == 2 && ids[i] > 0xffff) || (vocab && ids[i] >= vocab))
            return zn_set_error(ZN_EARG, "%s: token %llu = %u does not fit %s", path,
                                (unsigned long long)i, ids[i],
                                vocab && ids[i] >= vocab ? "the vocab" : "16 bits");
    zn_fs_tmp tf;
    int rc = zn_fs_tmp_fopen(&tf, path, 0644);
    if (rc)
        return rc;
    FILE *f = tf.f;
    unsigned char h[ZN_TOKENS_HEADER] = { 0 };
    memcpy(h, ZN_TOKENS_MAGIC, 8);
    uint32_t version = v2 ? ZN_TOKENS_VERSION2 : ZN_TOKENS_VERSION;
    for (int i = 0; i < 4; i++) {
        h[8 + i] = (unsigned char)(version >> (8 * i));
        h[12 + i] = (unsigned char)((uint32_t)width >> (8 * i));
        h[24 + i] = (unsigned char)(vocab >> (8 * i));
        h[28 + i] = (unsigned char)(flags >> (8 * i));
    }
    for (int i = 0; i < 8; i++)
        h[16 + i] = (unsigned char)(n >> (8 * i));
    int ok = fwrite(h, 1, sizeof h, f) == sizeof h;
    unsigned char buf[4096];
    size_t fill = 0;
    for (uint64_t i = 0; i < n && ok; i++) {
        for (int b = 0; b < width; b++)
            buf[fill++] = (unsigned char)(ids[i] >> (8 * b));
        if (fill + 4 > sizeof buf) {
            ok = fwrite(buf, 1, fill, f) == fill;
            fill = 0;
        }
    }
    if (ok && fill)
        ok = fwrite(buf, 1, fill, f) == fill;
    fill = 0;
    for (uint64_t i = 0; mask && i < n && ok; i += 8) {
        unsigned char byte = 0;
        for (uint64_t b = 0; b < 8 && i + b < n; b++)
            byte |= (unsigned char)((mask[i + b] ? 1u : 0u) << b);
        buf[fill++] = byte;
        if (fill == sizeof buf) {
            ok = fwrite(buf, 1, fill, f) == fill;
            fill = 0;
        }
    }
    if (ok && fill)
        ok = fwrite(buf, 1, fill, f) == fill;
    for (uint64_t k = 0; ndocs && k <= ndocs && ok; k++) {
        uint64_t v = k ? doc_ends[k - 1] : ndocs;
        unsigned char le[8];
        for (int b = 0; b < 8; b++)
            le[b] = (unsigned char)(v >> (8 * b));
        ok = fwrite(le, 1, 8, f) == 8;
    }
    if (!ok) {
        int e = errno ? errno : EIO;
        zn_set_error(-e, "%s: writing %s: %s", path, tf.tmp, strerror(e));
        zn_fs_tmp_abort(&tf);
        return -e;
    }
    return zn_fs_tmp_commit(&tf);
}

/* ---- loader ---------------------------------------------------------------- */

struct zn_loader {
    const zn_tokens *t;
    zn_loader_config cfg;
    uint64_t n_windows, steps_per_epoch;
    uint64_t *perm;
    uint64_t perm_epoch;
    int have_perm;
    /* padding: window w's inputs are ids [start[w], start[w] + len[w]) and
     * its targets the ids one further */
    uint64_t *start;
    uint32_t *len;
};

zn_loader_config zn_loader_config_default(void)
{
    zn_loader_config c = { .seq_len = 256, .batch = 4, .rank = 0, .world = 1, .seed = 1234,
                           .shuffle = 1, .vocab = 0, .packing = 1 };
    return c;
}

/* Padding: the pieces of every document; counts them when l->start is NULL. */
static uint64_t pad_windows(zn_loader *l)
{
    const zn_tokens *t = l->t;
    uint64_t L = (uint64_t)l->cfg.seq_len, n = 0, nd = t->ndocs ? t->ndocs : 1, s = 0;
    for (uint64_t k = 0; k < nd; k++) {
        uint64_t e = t->ndocs ? rd_u64(t->ends + 8 * k) : t->count;
        /* inputs s .. e-2, each with its target the next id */
        for (uint64_t i = s; i + 1 < e; i += L, n++)
            if (l->start) {
                l->start[n] = i;
                l->len[n] = (uint32_t)(e - 1 - i < L ? e - 1 - i : L);
            }
        s = e;
    }
    return n;
}

int zn_loader_create(zn_loader **out, const zn_tokens *t, const zn_loader_config *cfg)
{
    *out = NULL;
    if (cfg->seq_len <= 0 || cfg->seq_len > INT32_MAX || cfg->batch <= 0 || cfg->world <= 0 ||
        cfg->rank < 0 || cfg->rank >= cfg->world || cfg->vocab < 0)
        return zn_set_error(ZN_EARG, "loader: bad seq_len %lld / batch %lld / rank %d of %d",
                            (long long)cfg->seq_len, (long long)cfg->batch, cfg->rank,
                            cfg->world);
    if (cfg->vocab && t->vocab > (uint64_t)cfg->vocab)
        return zn_set_error(ZN_ECONFIG, "%s: token ids go up to vocab %u but the model's vocab is "
                                        "%lld", t->name, t->vocab, (long long)cfg->vocab);
    zn_loader *l = calloc(1, sizeof *l);
    if (!l)
        return zn_set_error(-ENOMEM, "loader: out of memory");
    l->t = t;
    l->cfg = *cfg;
    uint64_t n = cfg->packing ? (t->count > 0 ? (t->count - 1) / (uint64_t)cfg->seq_len : 0)
                              : pad_windows(l);
    uint64_t g = (uint64_t)cfg->world * (uint64_t)cfg->batch;
    if (n < g && !(cfg->partial && n > 0)) {
        free(l);
        return zn_set_error(ZN_ECONFIG, "%s: %llu tokens make %llu sequences of %lld%s, fewer "
                                        "than one global batch (%llu = %d ranks x %lld)",
                            t->name, (unsigned long long)t->count, (unsigned long long)n,
                            (long long)cfg->seq_len,
                            cfg->packing ? "" : " (one document or piece each, padded)",
                            (unsigned long long)g, cfg->world, (long long)cfg->batch);
    }
    if (!(l->perm = malloc(n * sizeof *l->perm)) ||
        (!cfg->packing && (!(l->start = malloc(n * sizeof *l->start)) ||
                           !(l->len = malloc(n * sizeof *l->len))))) {
        zn_loader_destroy(l);
        return zn_set_error(-ENOMEM, "loader: out of memory for %llu sequences",
                            (unsigned long long)n);
    }
    if (!cfg->packing)
        pad_windows(l);
    l->n_windows = n;
    l->steps_per_epoch = cfg->partial ? (n + g - 1) / g : n / g;
    *out = l;
    return 0;
}

void zn_loader_destroy(zn_loader *l)
{
    if (!l)
        return;
    free(l->perm);
    free(l->start);
    free(l->len);
    free(l);
}

uint64_t zn_loader_num_windows(const zn_loader *l)
{
    return l->n_windows;
}

uint64_t zn_loader_steps_per_epoch(const zn_loader *l)
{
    return l->steps_per_epoch;
}

static void make_perm(zn_loader *l, uint64_t epoch)
{
    uint64_t n = l->n_windows;
    for (uint64_t i = 0; i < n; i++)
        l->perm[i] = i;
    if (l->cfg.shuffle) {
        uint64_t s = l->cfg.seed ^ (epoch + 1) * 0xd1b54a32d192ed03ull;
        for (uint64_t i = n - 1; i > 0; i--) {
            uint64_t j = rand_below(&s, i + 1), x = l->perm[i];
            l->perm[i] = l->perm[j];
            l->perm[j] = x;
        }
    }
    l->perm_epoch = epoch;
    l->have_perm = 1;
}

int zn_loader_get(zn_loader *l, uint64_t step, int32_t *inputs, int32_t *targets, int32_t *pos)
{
    uint64_t epoch = step / l->steps_per_epoch, s = step % l->steps_per_epoch;
    if (!l->have_perm || l->perm_epoch != epoch)
        make_perm(l, epoch);
    int64_t L = l->cfg.seq_len, B = l->cfg.batch;
    uint64_t base = s * (uint64_t)l->cfg.world * (uint64_t)B + (uint64_t)l->cfg.rank * (uint64_t)B;
    for (int64_t b = 0; b < B; b++) {
        if (base + (uint64_t)b >= l->n_windows) {
            /* past the last window of a partial batch: no target */
            for (int64_t i = 0; i < L; i++) {
                inputs[b * L + i] = 0;
                targets[b * L + i] = -1;
                if (pos)
                    pos[b * L + i] = (int32_t)i;
            }
            continue;
        }
        uint64_t w = l->perm[base + (uint64_t)b];
        uint64_t first = l->start ? l->start[w] : w * (uint64_t)L;
        int64_t len = l->len ? (int64_t)l->len[w] : L; /* inputs before the padding */
        int32_t *in = inputs + b * L, *tg = targets + b * L, *ps = pos ? pos + b * L : NULL;
        for (int64_t i = 0; i <= len; i++) {
            uint64_t j = first + (uint64_t)i;
            uint32_t id = zn_tokens_get(l->t, j);
            if (l->cfg.vocab && id >= (uint64_t)l->cfg.vocab)
                return zn_set_error(ZN_ECORRUPT, "%s: token %llu is %u, outside the model's vocab "
                                                 "(%lld)", l->t->name, (unsigned long long)j, id,
                                    (long long)l->cfg.vocab);
            int start = zn_tokens_doc_start(l->t, j);
            if (i < len) {
                in[i] = (int32_t)id;
                if (ps)
                    ps[i] = i == 0 || start ? 0 : ps[i - 1] + 1;
            }
            if (i > 0)
                tg[i - 1] = zn_tokens_is_target(l->t, j) && !start ? (int32_t)id : -1;
        }
        /* padding: the last input again (any valid id; causal attention
         * keeps it from the real tokens), positions counting on, no target */
        for (int64_t i = len; i < L; i++) {
            in[i] = in[len - 1];
            tg[i] = -1;
            if (ps)
                ps[i] = ps[i - 1] + 1;
        }
    }
    return 0;
}
