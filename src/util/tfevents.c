/* TensorBoard's event files, written directly: TFRecord framing (length,
 * masked crc32c of the length, the record, masked crc32c of the record)
 * around tensorflow.Event protocol buffers, each encoded here field by
 * field (wall_time 1 double, step 2 int64, file_version 3 string, summary
 * 5 message; Summary.value 1; Value.tag 1 string, simple_value 2 float),
 * so TensorBoard reads zinc's scalars with nothing of TensorFlow's linked. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zinc/util.h"
#include "util/fs-impl.h"

struct zn_tb {
    FILE *f;
    char path[4200];
};

/* TFRecord's masked crc32c */
static uint32_t masked_crc(const void *p, size_t n)
{
    uint32_t c = zn_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- a protocol buffer, field by field ------------------------------------ */
typedef struct {
    unsigned char b[512];
    size_t n;
} pb;

static void pb_varint(pb *m, uint64_t v)
{
    while (v >= 0x80 && m->n < sizeof m->b) {
        m->b[m->n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    if (m->n < sizeof m->b)
        m->b[m->n++] = (unsigned char)v;
}

static void pb_key(pb *m, int field, int wire)
{
    pb_varint(m, (uint64_t)field << 3 | (uint64_t)wire);
}

static void pb_bytes(pb *m, int field, const void *p, size_t n)
{
    pb_key(m, field, 2);
    pb_varint(m, n);
    if (m->n + n <= sizeof m->b) {
        memcpy(m->b + m->n, p, n);
        m->n += n;
    }
}

static void pb_fixed(pb *m, int field, const void *le, int bytes)
{
    pb_key(m, field, bytes == 8 ? 1 : 5);
    if (m->n + (size_t)bytes <= sizeof m->b) {
        memcpy(m->b + m->n, le, (size_t)bytes);  /* x86-64 and aarch64: little-endian */
        m->n += (size_t)bytes;
    }
}

static int write_record(zn_tb *t, const pb *m)
{
    uint64_t len = m->n;
    uint32_t lc = masked_crc(&len, 8), dc = masked_crc(m->b, m->n);
    if (fwrite(&len, 8, 1, t->f) != 1 || fwrite(&lc, 4, 1, t->f) != 1 ||
        fwrite(m->b, 1, m->n, t->f) != m->n || fwrite(&dc, 4, 1, t->f) != 1 || fflush(t->f))
        return zn_set_error(-EIO, "tensorboard: writing %s: %s", t->path, strerror(errno));
    return 0;
}

static void event_head(pb *m, double wall, int64_t step)
{
    pb_fixed(m, 1, &wall, 8);
    pb_key(m, 2, 0);
    pb_varint(m, (uint64_t)step);
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int zn_tb_open(zn_tb **out, const char *dir)
{
    *out = NULL;
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    zn_tb *t = calloc(1, sizeof *t);
    if (!t)
        return zn_set_error(-ENOMEM, "tensorboard: out of memory");
    int rc = zn_fs_mkdir_p(dir, 0755);
    if (rc) {
        free(t);
        return zn_error_prefix(rc, "tensorboard");
    }
    snprintf(t->path, sizeof t->path, "%s/events.out.tfevents.%lld.%s.%ld", dir,
             (long long)time(NULL), host, (long)getpid());
    t->f = fopen(t->path, "wbx");
    if (!t->f) {
        int e = errno;
        zn_set_error(-e, "tensorboard: creating %s: %s", t->path, strerror(e));
        free(t);
        return -e;
    }
    pb m = { .n = 0 };
    event_head(&m, wall_now(), 0);
    pb_bytes(&m, 3, "brain.Event:2", 13);
    rc = write_record(t, &m);
    if (rc) {
        zn_tb_close(t);
        return rc;
    }
    *out = t;
    return 0;
}

int zn_tb_scalar(zn_tb *t, const char *tag, int64_t step, float value)
{
    if (!t)
        return 0;
    pb v = { .n = 0 }, s = { .n = 0 }, e = { .n = 0 };
    pb_bytes(&v, 1, tag, strlen(tag));
    pb_fixed(&v, 2, &value, 4);
    pb_bytes(&s, 1, v.b, v.n);
    event_head(&e, wall_now(), step);
    pb_bytes(&e, 5, s.b, s.n);
    return write_record(t, &e);
}

const char *zn_tb_path(const zn_tb *t)
{
    return t ? t->path : "";
}

void zn_tb_close(zn_tb *t)
{
    if (!t)
        return;
    if (t->f)
        fclose(t->f);
    free(t);
}
