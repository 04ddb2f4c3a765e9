/* Swap spaces: one preallocated file per path, striped in block_size units,
 * and the table of extents (tensor name, crc32c per block) handed out by the
 * extent allocator. Space is reserved with fallocate at creation so that a
 * full disk is an error before training starts, not in the middle of it.
 * Where the files live and how they are cleaned up is rundir.c's. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "nvme/nvme-impl.h"
#include "zinc/util.h"
#include "util/fs-impl.h"

static atomic_uint swap_counter;

zn_swap_config zn_swap_config_default(void)
{
    zn_swap_config c;
    memset(&c, 0, sizeof c);
    c.file_prefix = "zinc-swap";
    return c;
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

/* Fails early, naming the path, when the file systems lack the space. Paths
 * on one file system are summed. */
static int check_space(const zn_swap_config *cfg, const uint64_t *need)
{
    struct statvfs sv[ZN_SWAP_MAX_PATHS];
    for (int i = 0; i < cfg->npaths; i++) {
        if (statvfs(cfg->paths[i], &sv[i]) < 0)
            return zn_set_error(-errno, "swap: %s: %s", cfg->paths[i], strerror(errno));
    }
    for (int i = 0; i < cfg->npaths; i++) {
        uint64_t sum = 0;
        for (int j = 0; j < cfg->npaths; j++)
            if (sv[j].f_fsid == sv[i].f_fsid)
                sum += need[j];
        uint64_t avail = (uint64_t)sv[i].f_bavail * sv[i].f_frsize;
        if (sum > avail) {
            char a[32], b[32];
            return zn_set_error(-ENOSPC, "swap: %s needs %" PRIu64 " bytes (%s) but its file "
                                "system has %" PRIu64 " bytes (%s) free",
                                cfg->paths[i], sum, zn_format_size(sum, a, sizeof a), avail,
                                zn_format_size(avail, b, sizeof b));
        }
    }
    return 0;
}

static int open_file(zn_swap *s, const zn_swap_config *cfg, int i, unsigned n, uint64_t size,
                     int force_buffered)
{
    static int warned_buffered, warned_prealloc;
    const char *dir = cfg->paths[i];
    const char *prefix = cfg->file_prefix ? cfg->file_prefix : "zinc-swap";
    int rc;
    if (cfg->run_dir && (rc = zn_rundir__create(&s->run[i], dir, prefix)) < 0)
        return rc;
    const char *in = cfg->run_dir ? s->run[i].dir : dir;
    size_t len = strlen(in) + strlen(prefix) + 64;
    s->path[i] = malloc(len);
    if (!s->path[i])
        return zn_set_error(-ENOMEM, "swap: out of memory");
    if (cfg->run_dir)
        snprintf(s->path[i], len, "%s/%s.%d.swp", in, prefix, i);
    else
        snprintf(s->path[i], len, "%s/%s.%ld.%u.%d.swp", in, prefix, (long)getpid(), n, i);
    int fd = zn_fs_create_excl(s->path[i], 0600);
    if (fd < 0)
        return zn_error_prefix(fd, "swap");
    s->fd[i] = fd;
    /* held for the run's life: a later run tells a live run's file (locked)
     * from a dead one's (zn_swap_clean_stale); in a run directory, its lock
     * file says it */
    if (!cfg->run_dir && flock(fd, LOCK_EX | LOCK_NB) < 0)
        return zn_set_error(-errno, "swap: locking %s: %s", s->path[i], strerror(errno));
    if (!cfg->keep_files)
        s->owned[i] = zn_swap__own(s->path[i], 0);
    rc = fallocate(fd, 0, 0, (off_t)size);
    if (rc < 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
        zn_warn_once(&warned_prealloc, "swap: %s: the file system cannot preallocate (%s); "
                     "running out of space would only show when writing", dir, strerror(errno));
        rc = ftruncate(fd, (off_t)size);
    }
    if (rc < 0) {
        int e = errno;
        struct statvfs sv;
        uint64_t avail = statvfs(dir, &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : 0;
        return zn_set_error(-e, "swap: preallocating %" PRIu64 " bytes for %s: %s (%" PRIu64
                            " bytes free)", size, s->path[i], strerror(e), avail);
    }
    uint32_t align = 4096, mem_align = 4096;
    zn_nvme__dio_align(fd, &align, &mem_align);
    char why[200];
    if (force_buffered) {
        s->direct = 0;
    } else if (zn_nvme__try_direct(fd, align, why, sizeof why) < 0) {
        zn_warn_once(&warned_buffered, "swap: %s refuses O_DIRECT (%s): using buffered I/O", dir,
                     why);
        s->direct = 0;
    }
    if (align > s->align)
        s->align = align;
    if (mem_align > s->mem_align)
        s->mem_align = mem_align;
    return 0;
}

int zn_swap_create(zn_swap **out, zn_aio *a, const zn_swap_config *cfg)
{
    static int warned_uneven;
    *out = NULL;
    if (!a || !cfg)
        return zn_set_error(-EINVAL, "swap: no engine or config");
    if (cfg->npaths < 1 || cfg->npaths > ZN_SWAP_MAX_PATHS)
        return zn_set_error(-EINVAL, "swap: %d paths (1..%d)", cfg->npaths, ZN_SWAP_MAX_PATHS);
    const zn_aio_config *ac = zn_aio_get_config(a);
    uint64_t bs = ac->block_size;
    uint64_t need[ZN_SWAP_MAX_PATHS];
    int per_path = 0;
    for (int i = 0; i < cfg->npaths; i++) {
        if (!cfg->paths[i] || !cfg->paths[i][0])
            return zn_set_error(-EINVAL, "swap: path %d is empty", i);
        per_path |= cfg->path_bytes[i] != 0;
    }
    uint64_t per_file;
    if (per_path) {
        uint64_t mn = UINT64_MAX, mx = 0;
        for (int i = 0; i < cfg->npaths; i++) {
            if (!cfg->path_bytes[i])
                return zn_set_error(-EINVAL, "swap: path_bytes set for some paths but not %s",
                                    cfg->paths[i]);
            mn = cfg->path_bytes[i] < mn ? cfg->path_bytes[i] : mn;
            mx = cfg->path_bytes[i] > mx ? cfg->path_bytes[i] : mx;
        }
        if (mn != mx)
            zn_warn_once(&warned_uneven, "swap: paths have different sizes; tensors are striped "
                         "over all of them, so each gets the smallest (%" PRIu64 " bytes)", mn);
        per_file = round_up(mn, bs);
    } else {
        if (!cfg->bytes)
            return zn_set_error(-EINVAL, "swap: capacity of 0 bytes");
        per_file = round_up((cfg->bytes + (uint64_t)cfg->npaths - 1) / (uint64_t)cfg->npaths, bs);
    }
    for (int i = 0; i < cfg->npaths; i++) {
        struct stat st;
        if (stat(cfg->paths[i], &st) < 0)
            return zn_set_error(-errno, "swap: %s: %s", cfg->paths[i], strerror(errno));
        if (!S_ISDIR(st.st_mode))
            return zn_set_error(-ENOTDIR, "swap: %s is not a directory", cfg->paths[i]);
        need[i] = per_file;
    }
    int rc = check_space(cfg, need);
    if (rc)
        return rc;

    zn_swap *s = calloc(1, sizeof *s);
    if (!s)
        return zn_set_error(-ENOMEM, "swap: out of memory");
    s->aio = a;
    s->npaths = cfg->npaths;
    s->stripe = bs;
    s->per_file = per_file;
    s->keep = cfg->keep_files;
    s->direct = 1;
    s->align = 1;
    s->mem_align = 1;
    for (int i = 0; i < ZN_SWAP_MAX_PATHS; i++) {
        s->fd[i] = -1;
        s->owned[i] = -1;
        s->slot[i] = -1;
        s->run[i] = (zn_rundir){ NULL, NULL, -1, -1, -1 };
    }
    if ((rc = pthread_mutex_init(&s->lock, NULL))) {
        free(s);
        return zn_set_error(-rc, "swap: pthread_mutex_init: %s", strerror(rc));
    }
    unsigned n = atomic_fetch_add(&swap_counter, 1);
    for (int i = 0; i < cfg->npaths; i++) {
        if ((rc = open_file(s, cfg, i, n, per_file, ac->force_buffered)) < 0)
            goto fail;
    }
    if (!s->direct) {
        /* One buffered file makes the whole space buffered: a tensor is
         * striped over every file and O_DIRECT must not be half on. */
        for (int i = 0; i < s->npaths; i++) {
            int fl = fcntl(s->fd[i], F_GETFL);
            if (fl >= 0 && (fl & O_DIRECT) && fcntl(s->fd[i], F_SETFL, fl & ~O_DIRECT) < 0) {
                rc = zn_set_error(-errno, "swap: clearing O_DIRECT on %s: %s", s->path[i],
                                  strerror(errno));
                goto fail;
            }
        }
        s->align = 1;
        s->mem_align = 1;
    }
    /* Allocation unit: the direct-I/O alignment, at least a page, so that a
     * padded tail never reaches into the next extent. */
    uint64_t unit = s->align > 4096 ? s->align : 4096;
    while (unit & (unit - 1))
        unit++;
    if (unit > bs) {
        rc = zn_set_error(-EINVAL, "swap: block_size %" PRIu64 " is smaller than the direct-I/O "
                          "alignment %u of %s", bs, s->align, s->path[0]);
        goto fail;
    }
    if ((rc = zn_extalloc_init(&s->alloc, per_file * (uint64_t)s->npaths, unit, bs)) < 0) {
        zn_set_error(rc, "swap: allocator: %s", zn_strerror(rc));
        goto fail;
    }
    for (int i = 0; i < s->npaths; i++) {
        rc = zn_aio__add_file(a, s->fd[i], s->path[i]);
        if (rc < 0)
            goto fail;
        s->slot[i] = rc;
    }
    zn_debug("swap: %d file(s) of %" PRIu64 " bytes, %s, align %u", s->npaths, per_file,
             s->direct ? "O_DIRECT" : "buffered", s->align);
    *out = s;
    return 0;
fail:
    s->keep = 0;  /* a half-made space is not kept */
    zn_swap_destroy(s);
    return rc;
}

void zn_swap_destroy(zn_swap *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->npaths; i++) {
        if (s->slot[i] >= 0)
            zn_aio__remove_file(s->aio, s->slot[i]);
        if (s->fd[i] >= 0 && close(s->fd[i]) < 0)
            zn_warn("swap: closing %s: %s", s->path[i], strerror(errno));
        if (s->path[i] && s->fd[i] >= 0 && !s->keep && unlink(s->path[i]) < 0)
            zn_warn("swap: removing %s: %s", s->path[i], strerror(errno));
        zn_swap__disown(s->owned[i]);
        free(s->path[i]);
        zn_rundir__close(&s->run[i], s->keep);
    }
    for (uint32_t i = 0; i < s->nrecs; i++)
        if (s->recs[i]) {
            free(s->recs[i]->name);
            free(s->recs[i]->crc);
            free(s->recs[i]);
        }
    free(s->recs);
    free(s->free_ids);
    zn_extalloc_fini(&s->alloc);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* Under s->lock: a free record id, growing the table. */
static int new_id(zn_swap *s, uint32_t *id)
{
    if (s->nfree_ids) {
        *id = s->free_ids[--s->nfree_ids];
        return 0;
    }
    if (s->nrecs == s->caprecs) {
        uint32_t nc = s->caprecs ? s->caprecs * 2 : 64;
        zn_ext_rec **r = realloc(s->recs, nc * sizeof *r);
        if (!r)
            return -ENOMEM;
        s->recs = r;
        uint32_t *f = realloc(s->free_ids, nc * sizeof *f);
        if (!f)
            return -ENOMEM;
        s->free_ids = f;
        s->caprecs = nc;
    }
    s->recs[s->nrecs] = NULL;
    *id = s->nrecs++;
    return 0;
}

int zn_swap_alloc(zn_swap *s, uint64_t bytes, const char *tensor_name, zn_extent *out)
{
    const char *name = tensor_name ? tensor_name : "(unnamed)";
    memset(out, 0, sizeof *out);
    if (!bytes)
        return zn_set_error(-EINVAL, "swap: tensor '%s' asks for 0 bytes", name);
    uint64_t nunits64 = (bytes + s->stripe - 1) / s->stripe;
    if (nunits64 > UINT32_MAX)
        return zn_set_error(-EINVAL, "swap: tensor '%s' is too large (%" PRIu64 " bytes)", name,
                            bytes);
    zn_ext_rec *rec = calloc(1, sizeof *rec);
    char *nm = strdup(name);
    uint32_t *crc = calloc((size_t)nunits64, sizeof *crc);
    if (!rec || !nm || !crc) {
        free(rec);
        free(nm);
        free(crc);
        return zn_set_error(-ENOMEM, "swap: out of memory");
    }
    pthread_mutex_lock(&s->lock);
    uint64_t off, got;
    int rc = zn_extalloc_alloc(&s->alloc, bytes, &off, &got);
    if (rc == -ENOSPC) {
        uint64_t freeb = s->alloc.capacity - s->alloc.used;
        uint64_t largest = zn_extalloc_largest(&s->alloc);
        char b1[32], b2[32], b3[32];
        rc = zn_set_error(-ENOSPC, "swap: no room for tensor '%s': it needs %" PRIu64 " bytes "
                          "(%s); %" PRIu64 " bytes (%s) are free in %s%s, the largest free "
                          "extent is %" PRIu64 " bytes (%s)",
                          name, bytes, zn_format_size(bytes, b1, sizeof b1), freeb,
                          zn_format_size(freeb, b2, sizeof b2), s->path[0],
                          s->npaths > 1 ? " and its stripe partners" : "", largest,
                          zn_format_size(largest, b3, sizeof b3));
    } else if (rc < 0) {
        rc = zn_set_error(rc, "swap: allocating %" PRIu64 " bytes for tensor '%s': %s", bytes,
                          name, zn_strerror(rc));
    }
    uint32_t id = 0;
    if (rc == 0 && (rc = new_id(s, &id)) < 0) {
        zn_extalloc_free(&s->alloc, off, got);
        rc = zn_set_error(-ENOMEM, "swap: out of memory");
    }
    if (rc < 0) {
        pthread_mutex_unlock(&s->lock);
        free(rec);
        free(nm);
        free(crc);
        return rc;
    }
    static atomic_uint gen_counter;
    rec->name = nm;
    rec->offset = off;
    rec->bytes = got;
    uint32_t g = atomic_fetch_add(&gen_counter, 1) + 1;
    rec->gen = g ? g : atomic_fetch_add(&gen_counter, 1) + 1;
    rec->live = 1;
    rec->nunits = (uint32_t)nunits64;
    rec->crc = crc;
    atomic_init(&rec->inflight, 0);
    s->recs[id] = rec;
    pthread_mutex_unlock(&s->lock);
    *out = (zn_extent){ s, off, got, id, rec->gen };
    return 0;
}

int zn_swap__lookup(zn_swap *s, const zn_extent *e, zn_ext_rec **out)
{
    pthread_mutex_lock(&s->lock);
    zn_ext_rec *rec = e->id < s->nrecs ? s->recs[e->id] : NULL;
    if (!rec || rec->gen != e->gen || rec->offset != e->offset || e->swap != s) {
        pthread_mutex_unlock(&s->lock);
        return zn_set_error(-EINVAL, "swap: extent %u (offset %" PRIu64 ") is not live in this "
                            "swap space (freed or foreign)", e->id, e->offset);
    }
    *out = rec;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int zn_swap_free(zn_swap *s, const zn_extent *e)
{
    if (!s || !e)
        return zn_set_error(-EINVAL, "swap: free without a swap space or extent");
    pthread_mutex_lock(&s->lock);
    zn_ext_rec *rec = e->id < s->nrecs ? s->recs[e->id] : NULL;
    if (!rec || rec->gen != e->gen || rec->offset != e->offset || e->swap != s) {
        pthread_mutex_unlock(&s->lock);
        return zn_set_error(-EINVAL, "swap: freeing extent %u (offset %" PRIu64 ") that is not "
                            "live (double free?)", e->id, e->offset);
    }
    if (atomic_load(&rec->inflight)) {
        pthread_mutex_unlock(&s->lock);
        return zn_set_error(-EBUSY, "swap: freeing tensor '%s' while a request on it is in "
                            "flight", rec->name);
    }
    int rc = zn_extalloc_free(&s->alloc, rec->offset, rec->bytes);
    if (rc < 0) {
        pthread_mutex_unlock(&s->lock);
        return zn_set_error(ZN_EINTERNAL, "swap: allocator refused to free tensor '%s'",
                            rec->name);
    }
    s->recs[e->id] = NULL;
    s->free_ids[s->nfree_ids++] = e->id;
    pthread_mutex_unlock(&s->lock);
    free(rec->name);
    free(rec->crc);
    free(rec);
    return 0;
}

void zn_swap_get_stats(zn_swap *s, zn_swap_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&s->lock);
    out->capacity = s->alloc.capacity;
    out->used = s->alloc.used;
    out->peak_used = s->alloc.peak;
    out->largest_free = zn_extalloc_largest(&s->alloc);
    out->extents = s->nrecs - s->nfree_ids;
    out->free_ranges = (uint32_t)s->alloc.nfree;
    out->npaths = s->npaths;
    out->direct = s->direct;
    out->align = s->align;
    pthread_mutex_unlock(&s->lock);
}

const char *zn_swap_file_path(const zn_swap *s, int i)
{
    return s && i >= 0 && i < s->npaths ? s->path[i] : NULL;
}

/* Reads [off, off + len) of fd into buf, crc32c'd on the way. */
static int crc_read(int fd, const char *path, uint64_t off, uint64_t len, uint32_t *crc)
{
    char buf[1 << 16];
    uint32_t c = 0;
    while (len) {
        size_t n = len < sizeof buf ? (size_t)len : sizeof buf;
        ssize_t got = pread(fd, buf, n, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return zn_set_error(-errno, "swap: reading %s at offset %" PRIu64 ": %s", path, off,
                                strerror(errno));
        if (got == 0)
            return zn_set_error(-EIO, "swap: %s ends at offset %" PRIu64, path, off);
        c = zn_crc32c(c, buf, (size_t)got);
        off += (uint64_t)got;
        len -= (uint64_t)got;
    }
    *crc = c;
    return 0;
}

int zn_swap_extent_crc(zn_swap *s, const zn_extent *e, uint64_t off, uint64_t len,
                       uint32_t *crc)
{
    *crc = 0;
    if (s->npaths != 1)
        return zn_set_error(-ENOTSUP, "swap: the crc32c of a range of a striped space");
    zn_ext_rec *rec;
    int rc = zn_swap__lookup(s, e, &rec);
    if (rc)
        return rc;
    if (off + len > rec->bytes || off + len < off)
        return zn_set_error(-EINVAL, "swap: bytes [%" PRIu64 ", +%" PRIu64 ") of tensor '%s' "
                            "(%" PRIu64 " bytes)", off, len, rec->name, rec->bytes);
    if (!len)
        return 0;
    const bool table = zn_aio_get_config(s->aio)->crc;
    /* a plain descriptor: the run's may be O_DIRECT, and the pieces read
     * here are any length */
    int fd = open(s->path[0], O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zn_set_error(-errno, "swap: opening %s: %s", s->path[0], strerror(errno));
    uint32_t c = 0;
    for (uint64_t u = off / s->stripe; !rc && u * s->stripe < off + len; u++) {
        /* block u of the last write: [u * stripe, min((u + 1) * stripe, written)) */
        uint64_t b0 = u * s->stripe, b1 = b0 + s->stripe;
        if (b1 > rec->written)
            b1 = rec->written;
        uint64_t a = off > b0 ? off : b0, z = off + len < b0 + s->stripe ? off + len
                                                                           : b0 + s->stripe;
        uint32_t part;
        if (table && a == b0 && z == b1 && u < rec->nunits)
            part = rec->crc[u];
        else
            rc = crc_read(fd, s->path[0], rec->offset + a, z - a, &part);
        if (!rc)
            c = zn_crc32c_combine(c, part, z - a);
    }
    close(fd);
    if (!rc)
        *crc = c;
    return rc;
}
