/* DeepSpeed's hostfile and its resource filters (deepspeed/launcher/
 * runner.py: _parse_hostfile, parse_resource_filter), and the place of
 * every rank: host by host in file order, each host's slots ascending. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinc/launch.h"

#define HOSTFILE_MAX_BYTES (16u << 20)   /* a hostfile is lines of text */

void zn_hostfile_destroy(zn_hostfile *h)
{
    if (!h)
        return;
    for (int i = 0; h->hosts && i < h->n_hosts; i++)
        free(h->hosts[i].slots);
    free(h->hosts);
    free(h);
}

/* Which name ssh may take from us as a host (never an option: no leading
 * '-'), and which the filters can name (no ':' or '@'). */
static int host_name_ok(const char *s, size_t n)
{
    if (n == 0 || n >= ZN_HOST_NAME_MAX || s[0] == '-' || s[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int add_host(zn_hostfile *h, int *cap, const char *name, size_t nlen, int slots,
                    int line)
{
    if (h->n_hosts == *cap) {
        int nc = *cap ? 2 * *cap : 16;
        zn_host *nh = realloc(h->hosts, sizeof *nh * (size_t)nc);
        if (!nh)
            return zn_set_error(-ENOMEM, "hostfile: out of memory");
        h->hosts = nh;
        *cap = nc;
    }
    zn_host *x = &h->hosts[h->n_hosts];
    memset(x, 0, sizeof *x);
    x->slots = malloc(sizeof *x->slots * (size_t)slots);
    if (!x->slots)
        return zn_set_error(-ENOMEM, "hostfile: out of memory");
    memcpy(x->name, name, nlen);
    x->name[nlen] = 0;
    x->line = line;
    x->file_slots = x->n_slots = slots;
    for (int i = 0; i < slots; i++)
        x->slots[i] = i;
    h->n_hosts++;
    return 0;
}

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

/* One line (without its newline): 0 with *host set (or none for a blank or
 * comment line), or ZN_ECONFIG naming the line. */
static int parse_line(const char *name, int ln, const char *s, size_t n, zn_hostfile *h,
                      int *cap)
{
    size_t i = 0;
    while (i < n && is_blank(s[i]))
        i++;
    if (i == n || s[i] == '#')
        return 0;
    size_t h0 = i;
    while (i < n && !is_blank(s[i]) && s[i] != '#')
        i++;
    size_t hlen = i - h0;
    while (i < n && is_blank(s[i]))
        i++;
    if (!host_name_ok(s + h0, hlen))
        return zn_set_error(ZN_ECONFIG, "%s:%d: \"%.*s\" is not a host name (letters, digits, "
                            "'.', '_', '-'; a line is HOST slots=N)", name, ln,
                            (int)(hlen > 80 ? 80 : hlen), s + h0);
    if (n - i < 6 || strncmp(s + i, "slots=", 6))
        return zn_set_error(ZN_ECONFIG, "%s:%d: expected \"%.*s slots=N\", found \"%.*s\"",
                            name, ln, (int)hlen, s + h0, (int)(n - h0 > 80 ? 80 : n - h0),
                            s + h0);
    i += 6;
    size_t d0 = i;
    long slots = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9' && i - d0 < 9)
        slots = slots * 10 + (s[i++] - '0');
    if (i == d0 || (i < n && !is_blank(s[i]) && s[i] != '#'))
        return zn_set_error(ZN_ECONFIG, "%s:%d: slots=%.*s is not a whole number", name, ln,
                            (int)(n - d0 > 40 ? 40 : n - d0), s + d0);
    while (i < n && is_blank(s[i]))
        i++;
    if (i < n && s[i] != '#')
        return zn_set_error(ZN_ECONFIG, "%s:%d: unexpected \"%.*s\" after slots=%ld (a line "
                            "is HOST slots=N, then at most a # comment)", name, ln,
                            (int)(n - i > 40 ? 40 : n - i), s + i, slots);
    if (slots < 1 || slots > ZN_HOST_SLOTS_MAX)
        return zn_set_error(ZN_ECONFIG, "%s:%d: slots=%ld for %.*s (want 1 to %d)", name, ln,
                            slots, (int)hlen, s + h0, ZN_HOST_SLOTS_MAX);
    for (int k = 0; k < h->n_hosts; k++)
        if (strlen(h->hosts[k].name) == hlen && !memcmp(h->hosts[k].name, s + h0, hlen))
            return zn_set_error(ZN_ECONFIG, "%s:%d: host %s is already on line %d (one line "
                                "per host)", name, ln, h->hosts[k].name, h->hosts[k].line);
    return add_host(h, cap, s + h0, hlen, (int)slots, ln);
}

int zn_hostfile_parse(const char *text, size_t len, const char *name, zn_hostfile **out)
{
    if (!out)
        return zn_set_error(ZN_EARG, "zn_hostfile_parse: NULL out");
    *out = NULL;
    if (!text && len)
        return zn_set_error(ZN_EARG, "zn_hostfile_parse: NULL text");
    if (!name)
        name = "hostfile";
    zn_hostfile *h = calloc(1, sizeof *h);
    if (!h)
        return zn_set_error(-ENOMEM, "hostfile: out of memory");
    snprintf(h->path, sizeof h->path, "%s", name);
    int cap = 0, rc = 0, ln = 0;
    for (size_t p = 0; p < len;) {
        const char *nl = memchr(text + p, '\n', len - p);
        size_t e = nl ? (size_t)(nl - text) : len;
        ln++;
        if (memchr(text + p, 0, e - p)) {
            rc = zn_set_error(ZN_ECONFIG, "%s:%d: a NUL byte (not a text file)", name, ln);
            goto fail;
        }
        if ((rc = parse_line(name, ln, text + p, e - p, h, &cap)))
            goto fail;
        p = e + 1;
    }
    if (h->n_hosts == 0) {
        rc = zn_set_error(ZN_ECONFIG, "%s: no host in it (%d line%s; a line is HOST slots=N)",
                          name, ln, ln == 1 ? "" : "s");
        goto fail;
    }
    *out = h;
    return 0;
fail:
    zn_hostfile_destroy(h);
    return rc;
}

int zn_hostfile_read(const char *path, zn_hostfile **out)
{
    if (!out || !path)
        return zn_set_error(ZN_EARG, "zn_hostfile_read: NULL argument");
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return zn_set_error(-errno, "hostfile %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    int rc = 0;
    if (!buf) {
        fclose(f);
        return zn_set_error(-ENOMEM, "hostfile %s: out of memory", path);
    }
    for (;;) {
        if (n == cap) {
            if (cap >= HOSTFILE_MAX_BYTES) {
                rc = zn_set_error(ZN_ECONFIG, "hostfile %s: larger than %u MiB (not a "
                                  "hostfile)", path, HOSTFILE_MAX_BYTES >> 20);
                goto out;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                rc = zn_set_error(-ENOMEM, "hostfile %s: out of memory", path);
                goto out;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f))
                rc = zn_set_error(-EIO, "hostfile %s: read error", path);
            break;
        }
    }
    if (!rc)
        rc = zn_hostfile_parse(buf, n, path, out);
out:
    free(buf);
    fclose(f);
    return rc;
}

int zn_hostfile_local(int slots, zn_hostfile **out)
{
    if (!out)
        return zn_set_error(ZN_EARG, "zn_hostfile_local: NULL out");
    *out = NULL;
    if (slots < 1 || slots > ZN_HOST_SLOTS_MAX)
        return zn_set_error(ZN_EARG, "%d slots on localhost (want 1 to %d)", slots,
                            ZN_HOST_SLOTS_MAX);
    zn_hostfile *h = calloc(1, sizeof *h);
    if (!h)
        return zn_set_error(-ENOMEM, "hostfile: out of memory");
    int cap = 0, rc = add_host(h, &cap, "localhost", 9, slots, 0);
    if (rc) {
        zn_hostfile_destroy(h);
        return rc;
    }
    *out = h;
    return 0;
}

zn_host_select zn_host_select_default(void)
{
    zn_host_select s = { NULL, NULL, -1, -1 };
    return s;
}

/* ---- selection ------------------------------------------------------------------
 * Worked on a copy: per host a mask of the file's slots, committed at the
 * end, so that a refusal leaves the hostfile as it was. */
static int find_host(const zn_hostfile *h, const char *name, size_t n)
{
    for (int i = 0; i < h->n_hosts; i++)
        if (strlen(h->hosts[i].name) == n && !memcmp(h->hosts[i].name, name, n))
            return i;
    return -1;
}

static int host_has_slot(const zn_host *x, int slot)
{
    for (int i = 0; i < x->n_slots; i++)
        if (x->slots[i] == slot)
            return 1;
    return 0;
}

/* Parses NAME[:SLOT[,SLOT...]][@...] into mask (hosts x ZN_HOST_SLOTS_MAX):
 * include sets the named slots, exclude clears them. */
static int apply_filter(const zn_hostfile *h, const char *flag, const char *spec, int include,
                        unsigned char *mask)
{
    const char *p = spec;
    for (;;) {
        const char *end = strchr(p, '@');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', n);
        size_t hn = colon ? (size_t)(colon - p) : n;
        if (hn == 0)
            return zn_set_error(ZN_EARG, "%s \"%s\": an empty host name (the form is "
                                "HOST[:SLOT,SLOT]@HOST...)", flag, spec);
        int k = find_host(h, p, hn);
        if (k < 0)
            return zn_set_error(ZN_EARG, "%s \"%s\": host \"%.*s\" is not in %s", flag, spec,
                                (int)hn, p, h->path[0] ? h->path : "the hostfile");
        const zn_host *x = &h->hosts[k];
        unsigned char *m = mask + (size_t)k * ZN_HOST_SLOTS_MAX;
        if (!colon) {
            for (int i = 0; i < x->n_slots; i++)
                m[x->slots[i]] = (unsigned char)include;
        } else {
            const char *q = colon + 1, *stop = p + n;
            if (q == stop)
                return zn_set_error(ZN_EARG, "%s \"%s\": no slot after \"%.*s:\"", flag, spec,
                                    (int)hn, p);
            while (q < stop) {
                long v = 0;
                const char *d0 = q;
                while (q < stop && *q >= '0' && *q <= '9' && q - d0 < 6)
                    v = v * 10 + (*q++ - '0');
                if (q == d0 || (q < stop && *q != ','))
                    return zn_set_error(ZN_EARG, "%s \"%s\": \"%.*s\" is not a slot number",
                                        flag, spec, (int)(stop - d0), d0);
                if (v >= ZN_HOST_SLOTS_MAX || !host_has_slot(x, (int)v))
                    return zn_set_error(ZN_EARG, "%s \"%s\": host %s has no slot %ld (it has "
                                        "%d, from 0)", flag, spec, x->name, v, x->file_slots);
                m[v] = (unsigned char)include;
                if (q < stop && ++q == stop)
                    return zn_set_error(ZN_EARG, "%s \"%s\": a ',' with no slot after it",
                                        flag, spec);
            }
        }
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}

int zn_hostfile_select(zn_hostfile *h, const zn_host_select *s)
{
    if (!h || !s || h->n_hosts < 1)
        return zn_set_error(ZN_EARG, "zn_hostfile_select: NULL argument or no host");
    const char *inc = s->include && *s->include ? s->include : NULL;
    const char *exc = s->exclude && *s->exclude ? s->exclude : NULL;
    if (inc && exc)
        return zn_set_error(ZN_EARG, "--include and --exclude exclude each other");
    if ((inc || exc) && (s->num_nodes >= 0 || s->num_gpus >= 0))
        return zn_set_error(ZN_EARG, "--%s excludes --%s (as under DeepSpeed)",
                            inc ? "include" : "exclude",
                            s->num_nodes >= 0 ? "num_nodes" : "num_gpus");
    if (s->num_nodes == 0 || s->num_gpus == 0)
        return zn_set_error(ZN_EARG, "--%s 0: want at least 1",
                            s->num_nodes == 0 ? "num_nodes" : "num_gpus");
    if (s->num_nodes > h->n_hosts)
        return zn_set_error(ZN_EARG, "--num_nodes %d, but %s has %d host%s", s->num_nodes,
                            h->path[0] ? h->path : "the hostfile", h->n_hosts,
                            h->n_hosts == 1 ? "" : "s");
    for (int k = 0; s->num_gpus > 0 && k < h->n_hosts && (s->num_nodes < 0 || k < s->num_nodes);
         k++)
        if (s->num_gpus > h->hosts[k].n_slots)
            return zn_set_error(ZN_EARG, "--num_gpus %d, but host %s has %d slot%s%s",
                                s->num_gpus, h->hosts[k].name, h->hosts[k].n_slots,
                                h->hosts[k].n_slots == 1 ? "" : "s",
                                h->hosts[k].line ? "" : " (no hostfile: localhost)");
    unsigned char *mask = calloc((size_t)h->n_hosts, ZN_HOST_SLOTS_MAX);
    if (!mask)
        return zn_set_error(-ENOMEM, "hostfile: out of memory");
    int rc = 0;
    for (int k = 0; k < h->n_hosts; k++) {
        const zn_host *x = &h->hosts[k];
        unsigned char *m = mask + (size_t)k * ZN_HOST_SLOTS_MAX;
        if (inc)
            continue;
        if (s->num_nodes > 0 && k >= s->num_nodes)
            continue;
        for (int i = 0; i < x->n_slots; i++)
            if (s->num_gpus < 0 || x->slots[i] < s->num_gpus)
                m[x->slots[i]] = 1;
    }
    if (inc)
        rc = apply_filter(h, "--include", inc, 1, mask);
    else if (exc)
        rc = apply_filter(h, "--exclude", exc, 0, mask);
    if (rc)
        goto out;
    int left = 0;
    for (size_t i = 0; i < (size_t)h->n_hosts * ZN_HOST_SLOTS_MAX; i++)
        left += mask[i];
    if (!left) {
        rc = zn_set_error(ZN_EARG, "the selection (%s) leaves no slot to run on",
                          inc ? "--include" : exc ? "--exclude" : "--num_nodes/--num_gpus");
        goto out;
    }
    /* commit: no allocation below, so nothing can fail half-way */
    int w = 0;
    for (int k = 0; k < h->n_hosts; k++) {
        zn_host x = h->hosts[k];
        const unsigned char *m = mask + (size_t)k * ZN_HOST_SLOTS_MAX;
        int n = 0;
        for (int sl = 0; sl < ZN_HOST_SLOTS_MAX; sl++)
            if (m[sl])
                x.slots[n++] = sl;   /* a subset of the old list: fits */
        x.n_slots = n;
        if (n == 0) {
            free(x.slots);
            continue;
        }
        h->hosts[w++] = x;
    }
    h->n_hosts = w;
out:
    free(mask);
    return rc;
}

/* ---- ranks -----------------------------------------------------------------------*/
int zn_hostfile_world(const zn_hostfile *h)
{
    int n = 0;
    for (int k = 0; h && k < h->n_hosts; k++)
        n += h->hosts[k].n_slots;
    return n;
}

int zn_hostfile_place(const zn_hostfile *h, int rank, zn_rank_place *out)
{
    int world = zn_hostfile_world(h);
    if (!out || rank < 0 || rank >= world)
        return zn_set_error(ZN_EARG, "zn_hostfile_place: rank %d outside the world of %d",
                            rank, world);
    int first = 0;
    for (int k = 0; k < h->n_hosts; k++) {
        const zn_host *x = &h->hosts[k];
        if (rank < first + x->n_slots) {
            out->rank = rank;
            out->world_size = world;
            out->host = k;
            out->local_rank = rank - first;
            out->local_size = x->n_slots;
            out->slot = x->slots[rank - first];
            return 0;
        }
        first += x->n_slots;
    }
    return zn_set_error(ZN_EINTERNAL, "zn_hostfile_place: rank %d not found", rank);
}

int zn_hostfile_devices(const zn_hostfile *h, int host, char *buf, size_t len)
{
    if (!h || host < 0 || host >= h->n_hosts || !buf || len == 0)
        return zn_set_error(ZN_EARG, "zn_hostfile_devices: host %d out of range or no buffer",
                            host);
    const zn_host *x = &h->hosts[host];
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < x->n_slots; i++) {
        int n = snprintf(buf + o, len - o, "%s%d", i ? "," : "", x->slots[i]);
        if (n < 0 || (size_t)n >= len - o)
            return zn_set_error(ZN_EARG, "zn_hostfile_devices: %d slots of %s do not fit in "
                                "%zu bytes", x->n_slots, x->name, len);
        o += (size_t)n;
    }
    return 0;
}
