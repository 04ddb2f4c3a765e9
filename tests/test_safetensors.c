/* safetensors: write/read round trips with bf16/fp16/fp32 conversion, ranged
 * reads, sharded checkpoints, and hostile files: each malformed header (huge
 * lengths, offsets past EOF, overlaps, bad dtype, shape overflow, truncation,
 * path traversal in an index) gets a clear error, and random byte flips in a
 * valid header never crash or over-read (run under ASan in CI). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zinc/safetensors.h"
#include "zt.h"

static char dir[64];

static const char *tpath(const char *name)
{
    static char bufs[4][256];
    static int k;
    char *b = bufs[k++ & 3];
    snprintf(b, 256, "%s/%s", dir, name);
    return b;
}

/* Writes [u64 hlen][header][data_len bytes of 0xAB] to name. hlen_override
 * != 0 replaces the true header length. */
static void write_raw(const char *name, const char *header, uint64_t hlen_override,
                      size_t data_len)
{
    FILE *f = fopen(tpath(name), "wb");
    if (!f)
        ZT_SETUP_FAIL("fopen %s", tpath(name));
    uint64_t hl = hlen_override ? hlen_override : strlen(header);
    unsigned char lb[8];
    for (int i = 0; i < 8; i++)
        lb[i] = (unsigned char)(hl >> (8 * i));
    fwrite(lb, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_len; i++)
        fputc(0xAB, f);
    fclose(f);
}

static void expect_corrupt(const char *name, const char *header, uint64_t hlen, size_t data_len,
                           const char *needle)
{
    zn_st *s = (zn_st *)1;
    write_raw(name, header, hlen, data_len);
    zn_clear_error();
    int rc = zn_st_open(&s, tpath(name));
    ZT_CHECK_MSG(rc == ZN_ECORRUPT, "%s: expected ZN_ECORRUPT, got %d (%s)", name, rc,
                 zn_last_error());
    ZT_CHECK(s == NULL);
    ZT_CONTAINS(zn_last_error(), name); /* the file is named */
    if (needle)
        ZT_CONTAINS(zn_last_error(), needle);
    if (!rc)
        zn_st_close(s);
}

static void test_roundtrip(void)
{
    const char *p = tpath("rt.safetensors");
    zn_st_writer *w;
    float a[6] = { 1.0f, -2.5f, 3.25f, 0.0f, -0.0f, 1e-3f };
    float b[4] = { 0.5f, 1.5f, -65504.0f, 6.1035156e-05f };
    float scalar = 42.0f;
    int64_t sa[2] = { 2, 3 }, sb[1] = { 4 }, sz[2] = { 0, 5 };

    ZT_EQ_INT(zn_st_writer_create(&w, p), 0);
    ZT_EQ_INT(zn_st_writer_add(w, "a.weight", ZN_ST_F32, 2, sa), 0);
    ZT_EQ_INT(zn_st_writer_add(w, "b.bf16", ZN_ST_BF16, 1, sb), 0);
    ZT_EQ_INT(zn_st_writer_add(w, "b.f16", ZN_ST_F16, 1, sb), 0);
    ZT_EQ_INT(zn_st_writer_add(w, "scalar", ZN_ST_F32, 0, NULL), 0);
    ZT_EQ_INT(zn_st_writer_add(w, "empty", ZN_ST_BF16, 2, sz), 0);
    ZT_EQ_INT(zn_st_writer_add(w, "a.weight", ZN_ST_F32, 2, sa), ZN_EARG); /* duplicate */
    ZT_EQ_INT(zn_st_writer_set_metadata(w, "format", "pt"), 0);
    /* a in two parts, out of order first (refused), then in order. */
    ZT_EQ_INT(zn_st_writer_write(w, "a.weight", ZN_DTYPE_F32, a + 3, 3, 3), ZN_EARG);
    ZT_EQ_INT(zn_st_writer_write(w, "a.weight", ZN_DTYPE_F32, a, 0, 3), 0);
    ZT_EQ_INT(zn_st_writer_add(w, "late", ZN_ST_F32, 1, sb), ZN_EARG); /* after a write */
    ZT_EQ_INT(zn_st_writer_write(w, "a.weight", ZN_DTYPE_F32, a + 3, 3, 3), 0);
    ZT_EQ_INT(zn_st_writer_write(w, "b.bf16", ZN_DTYPE_F32, b, 0, 4), 0);
    ZT_EQ_INT(zn_st_writer_write(w, "b.f16", ZN_DTYPE_F32, b, 0, 4), 0);
    /* Not yet complete: finish refuses and names the tensor. */
    ZT_EQ_INT(zn_st_writer_finish(w), ZN_EARG);
    ZT_CONTAINS(zn_last_error(), "scalar");
    ZT_EQ_INT(zn_st_writer_write(w, "scalar", ZN_DTYPE_F32, &scalar, 0, 1), 0);
    ZT_EQ_INT(zn_st_writer_finish(w), 0);
    zn_st_writer_destroy(w);

    /* The on-disk header is 8-byte aligned and starts with '{'. */
    FILE *f = fopen(p, "rb");
    unsigned char hb[9];
    ZT_CHECK(f && fread(hb, 1, 9, f) == 9);
    if (f)
        fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | hb[i];
    ZT_EQ_U64(hl % 8, 0);
    ZT_EQ_INT(hb[8], '{');

    zn_st *s;
    ZT_EQ_INT(zn_st_open(&s, p), 0);
    if (!s)
        return;
    ZT_EQ_U64(zn_st_count(s), 5);
    ZT_EQ_STR(zn_st_metadata(s, "format"), "pt");
    ZT_CHECK(zn_st_metadata(s, "nope") == NULL);
    ZT_CHECK(zn_st_find(s, "nope") == NULL);
    const zn_st_tensor *ta = zn_st_find(s, "a.weight");
    ZT_CHECK(ta && ta->ndim == 2 && ta->shape[0] == 2 && ta->shape[1] == 3 && ta->numel == 6);
    /* Storage order: offsets ascend. */
    for (size_t i = 1; i < zn_st_count(s); i++)
        ZT_CHECK(zn_st_tensor_at(s, i)->offset >= zn_st_tensor_at(s, i - 1)->offset);
    ZT_CHECK(zn_st_tensor_at(s, zn_st_count(s)) == NULL);

    float out[6];
    uint16_t h[6];
    ZT_EQ_INT(zn_st_read(s, ta, ZN_DTYPE_F32, out, sizeof out), 0);
    ZT_CHECK(memcmp(out, a, sizeof a) == 0);
    ZT_EQ_INT(zn_st_read(s, ta, ZN_DTYPE_F32, out, sizeof out - 4), ZN_EARG);
    ZT_EQ_INT(zn_st_read_range(s, ta, 2, 3, ZN_DTYPE_F32, out, 12), 0);
    ZT_CHECK(out[0] == a[2] && out[1] == a[3] && out[2] == a[4]);
    ZT_EQ_INT(zn_st_read_range(s, ta, 4, 3, ZN_DTYPE_F32, out, 12), ZN_EARG);
    /* f32 -> bf16 on load: 1.0 = 0x3f80, -2.5 = 0xc020. */
    ZT_EQ_INT(zn_st_read(s, ta, ZN_DTYPE_BF16, h, 12), 0);
    ZT_EQ_INT(h[0], 0x3f80);
    ZT_EQ_INT(h[1], 0xc020);

    const zn_st_tensor *tb = zn_st_find(s, "b.bf16"), *tf = zn_st_find(s, "b.f16");
    ZT_CHECK(tb && tb->dtype == ZN_ST_BF16 && tb->nbytes == 8);
    ZT_CHECK(tf && tf->dtype == ZN_ST_F16);
    ZT_EQ_INT(zn_st_read(s, tb, ZN_DTYPE_F32, out, 16), 0);
    ZT_CHECK(out[0] == 0.5f && out[1] == 1.5f && out[2] == -65536.0f); /* bf16 rounding */
    ZT_CHECK(fabsf(out[3] - b[3]) < 1e-6f);
    ZT_EQ_INT(zn_st_read(s, tf, ZN_DTYPE_F32, out, 16), 0);
    ZT_CHECK(out[0] == 0.5f && out[1] == 1.5f && out[2] == -65504.0f && out[3] == b[3]);
    ZT_EQ_INT(zn_st_read(s, tf, ZN_DTYPE_BF16, h, 8), 0); /* f16 -> bf16 */
    ZT_EQ_INT(h[0], 0x3f00);
    ZT_EQ_INT(zn_st_read_raw(s, tf, h, 8), 0);
    ZT_EQ_INT(h[0], 0x3800); /* 0.5 in fp16 */
    const zn_st_tensor *ts = zn_st_find(s, "scalar"), *te = zn_st_find(s, "empty");
    ZT_CHECK(ts && ts->ndim == 0 && ts->numel == 1);
    ZT_EQ_INT(zn_st_read(s, ts, ZN_DTYPE_F32, out, 4), 0);
    ZT_CHECK(out[0] == 42.0f);
    ZT_CHECK(te && te->numel == 0 && te->nbytes == 0);
    ZT_EQ_INT(zn_st_read(s, te, ZN_DTYPE_F32, out, 0), 0);
    zn_st_tensor fake = *ta;
    ZT_EQ_INT(zn_st_read(s, &fake, ZN_DTYPE_F32, out, 24), ZN_EARG); /* not from this file */
    zn_st_close(s);

    /* Truncated after open: the read fails with -EIO naming tensor and file. */
    ZT_EQ_INT(zn_st_open(&s, p), 0);
    struct stat st;
    ZT_EQ_INT(stat(p, &st), 0);
    ZT_EQ_INT(truncate(p, st.st_size - 2), 0);
    const zn_st_tensor *last = zn_st_find(s, "scalar"); /* the last one with bytes */
    float big[8];
    int rc = zn_st_read(s, last, ZN_DTYPE_F32, big, last->numel * 4);
    ZT_EQ_INT(rc, -EIO);
    ZT_CONTAINS(zn_last_error(), last->name);
    ZT_CONTAINS(zn_last_error(), "rt.safetensors");
    zn_st_close(s);
    /* And opened again, the header check catches it. */
    ZT_EQ_INT(zn_st_open(&s, p), ZN_ECORRUPT);
    ZT_CONTAINS(zn_last_error(), "past the data section");

    /* An unfinished writer leaves no file under the final name. */
    ZT_EQ_INT(zn_st_writer_create(&w, tpath("unfinished.safetensors")), 0);
    ZT_EQ_INT(zn_st_writer_add(w, "x", ZN_ST_F32, 1, sb), 0);
    zn_st_writer_destroy(w);
    ZT_CHECK(access(tpath("unfinished.safetensors"), F_OK) != 0);
    /* nor its temporary, under whatever name the writer gave it */
    DIR *dd = opendir(dir);
    ZT_CHECK(dd != NULL);
    for (struct dirent *e; dd && (e = readdir(dd));)
        ZT_CHECK_MSG(!strstr(e->d_name, "unfinished"), "left behind: %s", e->d_name);
    if (dd)
        closedir(dd);
}

static void test_hostile(void)
{
    zn_st *s;
    /* Too short to hold a length. */
    FILE *f = fopen(tpath("short.st"), "wb");
    fputs("abc", f);
    fclose(f);
    ZT_EQ_INT(zn_st_open(&s, tpath("short.st")), ZN_ECORRUPT);
    ZT_CONTAINS(zn_last_error(), "too short");

    const char *ok = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    write_raw("ok.st", ok, 0, 8);
    ZT_EQ_INT(zn_st_open(&s, tpath("ok.st")), 0);
    zn_st_close(s);

    expect_corrupt("huge_len.st", ok, UINT64_MAX, 8, "header length");
    expect_corrupt("over_max.st", ok, (uint64_t)ZN_ST_HEADER_MAX + 1, 8, "header length");
    expect_corrupt("len_past_eof.st", ok, strlen(ok) + 100, 8, "past the end");
    expect_corrupt("zero_len.st", ok, 1, 8, "header length");
    expect_corrupt("not_brace.st", "[\"t\"]   ", 0, 8, "'{'");
    expect_corrupt("bad_json.st", "{\"t\":{\"dtype\":", 0, 8, "JSON");
    expect_corrupt("past_eof.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 4,
                   "past the data section");
    expect_corrupt("far_past_eof.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":"
                   "[9223372036854775000,9223372036854775008]}}", 0, 8, "past the data section");
    expect_corrupt("overlap.st",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 12,
                   "overlap");
    expect_corrupt("same_range.st",
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8,
                   "overlap");
    expect_corrupt("bad_dtype.st",
                   "{\"t\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8,
                   "unknown dtype");
    expect_corrupt("dtype_num.st",
                   "{\"t\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8, "dtype");
    expect_corrupt("shape_overflow.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                   "\"data_offsets\":[0,8]}}", 0, 8, "overflow");
    expect_corrupt("bytes_overflow.st",
                   "{\"t\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
                   "\"data_offsets\":[0,8]}}", 0, 8, "overflow");
    expect_corrupt("neg_shape.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, 8,
                   "shape[0]");
    expect_corrupt("float_shape.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 0, 8,
                   "shape[0]");
    expect_corrupt("many_dims.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],"
                   "\"data_offsets\":[0,8]}}", 0, 8, "dimensions");
    expect_corrupt("span_mismatch.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 16,
                   "need 12");
    expect_corrupt("reversed.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 0, 8,
                   "ascending");
    expect_corrupt("neg_offset.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 0, 8,
                   "ascending");
    expect_corrupt("three_offsets.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,16]}}", 0, 16,
                   "data_offsets");
    expect_corrupt("no_offsets.st", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 0, 8,
                   "data_offsets");
    expect_corrupt("extra_key.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 0,
                   8, "unknown key");
    expect_corrupt("dup_name.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, 8,
                   "duplicate");
    expect_corrupt("meta_num.st",
                   "{\"__metadata__\":{\"k\":1},"
                   "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8,
                   "__metadata__");
    expect_corrupt("entry_array.st", "{\"t\":[1,2]}", 0, 8, "not an object");
    expect_corrupt("empty_name.st",
                   "{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8,
                   "name");
    expect_corrupt("trailing.st",
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} x", 0, 8,
                   "JSON");
    /* A NUL byte inside the JSON. */
    {
        char hdr[] = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
        size_t hl = strlen(hdr);
        hdr[3] = '\0';
        FILE *g = fopen(tpath("nul.st"), "wb");
        unsigned char lb[8] = { (unsigned char)hl };
        fwrite(lb, 1, 8, g);
        fwrite(hdr, 1, hl, g);
        for (int i = 0; i < 8; i++)
            fputc(0, g);
        fclose(g);
        ZT_EQ_INT(zn_st_open(&s, tpath("nul.st")), ZN_ECORRUPT);
    }
    /* A folder without a checkpoint and a missing file are OS errors. */
    ZT_EQ_INT(zn_st_open(&s, dir), -ENOENT);
    ZT_EQ_INT(zn_st_open(&s, tpath("missing.safetensors")), -ENOENT);
    ZT_CONTAINS(zn_last_error(), "missing.safetensors");
    /* A non-float tensor reads raw but does not convert. */
    write_raw("ints.st", "{\"t\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 8);
    ZT_EQ_INT(zn_st_open(&s, tpath("ints.st")), 0);
    if (s) {
        float o[2];
        int32_t iv[2];
        ZT_EQ_INT(zn_st_read(s, zn_st_tensor_at(s, 0), ZN_DTYPE_F32, o, 8), ZN_EUNSUPPORTED);
        ZT_EQ_INT(zn_st_read_raw(s, zn_st_tensor_at(s, 0), iv, 8), 0);
        ZT_EQ_INT((uint32_t)iv[0], 0xABABABABu);
        zn_st_close(s);
    }
}

/* Random byte flips and length changes of a valid file: open must either
 * fail cleanly or give tensors that are fully inside the file, and reading
 * every tensor must then succeed. ASan turns any over-read into a failure. */
static void test_fuzz(void)
{
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[12,28]},"
                      "\"c\":{\"dtype\":\"F16\",\"shape\":[1,1,2],\"data_offsets\":[28,32]}}";
    size_t hl = strlen(hdr), total = 8 + hl + 32;
    unsigned char *base = malloc(total), *buf = malloc(total);
    for (int i = 0; i < 8; i++)
        base[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(base + 8, hdr, hl);
    for (size_t i = 0; i < 32; i++)
        base[8 + hl + i] = (unsigned char)(i * 37);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int opened = 0, refused = 0, bad = 0;
    const char *p = tpath("fuzz.st");
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(buf, base, total);
        size_t len = total;
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(rng >> 33) % total;
            unsigned char val = (unsigned char)(rng >> 20);
            if (iter % 5 == 0) /* digits and structure characters matter most */
                val = (unsigned char)"0123456789{}[],:\"-e9"[(rng >> 24) % 20];
            buf[pos] = val;
        }
        if (iter % 7 == 0)
            len = (size_t)(rng >> 40) % total; /* truncated */
        int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, buf, len) != (ssize_t)len)
            ZT_SETUP_FAIL("write fuzz file");
        close(fd);
        zn_st *s = NULL;
        int rc = zn_st_open(&s, p);
        if (rc) {
            refused++;
            if (rc != ZN_ECORRUPT)
                bad++;
            if (!*zn_last_error())
                bad++;
            continue;
        }
        opened++;
        for (size_t i = 0; i < zn_st_count(s); i++) {
            const zn_st_tensor *t = zn_st_tensor_at(s, i);
            if (t->offset + t->nbytes > len)
                bad++;
            if (t->nbytes > 4096)
                continue; /* cannot be inside this small file */
            void *o = malloc(t->nbytes + 1);
            if (zn_st_read_raw(s, t, o, t->nbytes))
                bad++;
            free(o);
        }
        zn_st_close(s);
    }
    ZT_EQ_INT(bad, 0);
    ZT_CHECK(opened > 0 && refused > 0);
    printf("fuzz: %d opened, %d refused\n", opened, refused);
    free(base);
    free(buf);
}

static void write_shard(const char *name, const char *t1, const char *t2, float base)
{
    zn_st_writer *w;
    int64_t shape[1] = { 3 };
    float v[3] = { base, base + 1, base + 2 };
    if (zn_st_writer_create(&w, tpath(name)) || zn_st_writer_add(w, t1, ZN_ST_F32, 1, shape) ||
        (t2 && zn_st_writer_add(w, t2, ZN_ST_BF16, 1, shape)) ||
        zn_st_writer_write(w, t1, ZN_DTYPE_F32, v, 0, 3) ||
        (t2 && zn_st_writer_write(w, t2, ZN_DTYPE_F32, v, 0, 3)) || zn_st_writer_finish(w))
        ZT_SETUP_FAIL("write shard %s: %s", name, zn_last_error());
    zn_st_writer_destroy(w);
}

static void write_index_json(const char *text)
{
    FILE *f = fopen(tpath("model.safetensors.index.json"), "w");
    fputs(text, f);
    fclose(f);
}

static void test_sharded(void)
{
    write_shard("model-00001-of-00002.safetensors", "x", "y", 1.0f);
    write_shard("model-00002-of-00002.safetensors", "z", NULL, 10.0f);
    const char *names[] = { "x", "y", "z" };
    const char *files[] = { "model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors",
                            "model-00002-of-00002.safetensors" };
    ZT_EQ_INT(zn_st_write_index(tpath("model.safetensors.index.json"), 3, names, files, 30), 0);
    zn_st *s;
    ZT_EQ_INT(zn_st_open(&s, dir), 0); /* the folder: the index wins */
    if (s) {
        ZT_EQ_U64(zn_st_count(s), 3);
        ZT_EQ_INT(zn_st_num_shards(s), 2);
        const zn_st_tensor *z = zn_st_find(s, "z"), *y = zn_st_find(s, "y");
        ZT_CHECK(z && z->shard == 1 && y && y->shard == 0);
        float o[3];
        ZT_EQ_INT(zn_st_read(s, z, ZN_DTYPE_F32, o, 12), 0);
        ZT_CHECK(o[0] == 10.0f && o[2] == 12.0f);
        ZT_EQ_INT(zn_st_read(s, y, ZN_DTYPE_F32, o, 12), 0);
        ZT_CHECK(o[0] == 1.0f && o[2] == 3.0f);
        ZT_CONTAINS(zn_st_shard_path(s, 1), "00002");
        zn_st_close(s);
    }
    ZT_EQ_INT(zn_st_write_index(tpath("bad.json"), 1, names, (const char *[]){ "../x" }, 0),
              ZN_EARG);

    const char *idx = tpath("model.safetensors.index.json");
    struct {
        const char *json, *needle;
    } bad[] = {
        { "{\"weight_map\":{\"x\":\"../etc/passwd\"}}", "file name" },
        { "{\"weight_map\":{\"x\":\"/etc/passwd\"}}", "file name" },
        { "{\"weight_map\":{\"x\":\"..\"}}", "file name" },
        { "{\"weight_map\":{\"x\":3}}", "file name" },
        { "{\"metadata\":{}}", "weight_map" },
        { "{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\","
          "\"y\":\"model-00002-of-00002.safetensors\","
          "\"z\":\"model-00002-of-00002.safetensors\"}}", "found in" },
        { "{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\","
          "\"z\":\"model-00002-of-00002.safetensors\"}}", "not in the index" },
        { "{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\","
          "\"y\":\"model-00001-of-00002.safetensors\","
          "\"w\":\"model-00002-of-00002.safetensors\","
          "\"z\":\"model-00002-of-00002.safetensors\"}}", "does not hold" },
        { "{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\"", "line" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_index_json(bad[i].json);
        int rc = zn_st_open(&s, idx);
        ZT_CHECK_MSG(rc == ZN_ECORRUPT, "index case %zu: rc %d (%s)", i, rc, zn_last_error());
        ZT_CONTAINS(zn_last_error(), bad[i].needle);
    }
    /* The same tensor name in two shards. */
    write_shard("model-00002-of-00002.safetensors", "x", NULL, 10.0f);
    write_index_json("{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\","
                     "\"y\":\"model-00001-of-00002.safetensors\"}}");
    ZT_EQ_INT(zn_st_open(&s, idx), 0); /* only shard 1 is listed: fine */
    zn_st_close(s);
    write_index_json("{\"weight_map\":{\"x\":\"model-00001-of-00002.safetensors\","
                     "\"y\":\"model-00002-of-00002.safetensors\"}}");
    ZT_EQ_INT(zn_st_open(&s, idx), ZN_ECORRUPT);
    ZT_CONTAINS(zn_last_error(), "appears twice");
    /* A shard that is missing. */
    write_index_json("{\"weight_map\":{\"x\":\"model-00009-of-00009.safetensors\"}}");
    ZT_EQ_INT(zn_st_open(&s, idx), -ENOENT);
    ZT_CONTAINS(zn_last_error(), "model-00009-of-00009.safetensors");
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/zn_st_XXXXXX");
    if (!mkdtemp(dir))
        ZT_SETUP_FAIL("mkdtemp");
    test_roundtrip();
    test_hostile();
    test_fuzz();
    test_sharded();
    /* a header of no tensors: an empty file of tensors, not undefined
     * behaviour (found by fuzzing: qsort on a NULL array under UBSan) */
    write_raw("empty.st", "{}", 0, 0);
    zn_st *st = NULL;
    int erc = zn_st_open(&st, tpath("empty.st"));
    ZT_CHECK_MSG(erc == 0 || erc == ZN_ECORRUPT, "header {}: %d %s", erc, zn_last_error());
    if (!erc)
        ZT_EQ_U64(zn_st_count(st), 0);
    zn_st_close(st);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return zt_done();
}
