/* Size strings ("24GiB", "512MB", "1.5TiB", "1e9") and clocks. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "zinc/util.h"

int zn_parse_size(const char *s, uint64_t *out)
{
    static const struct { const char *suffix; double mult; } units[] = {
        { "", 1.0 }, { "b", 1.0 },
        { "k", 1024.0 }, { "kib", 1024.0 }, { "kb", 1e3 },
        { "m", 1048576.0 }, { "mib", 1048576.0 }, { "mb", 1e6 },
        { "g", 1073741824.0 }, { "gib", 1073741824.0 }, { "gb", 1e9 },
        { "t", 1099511627776.0 }, { "tib", 1099511627776.0 }, { "tb", 1e12 },
    };
    if (!s || !*s)
        return zn_set_error(ZN_ECONFIG, "empty size string");
    const char *p = s;
    while (isspace((unsigned char)*p))
        p++;
    if (*p == '-' || *p == '+')
        return zn_set_error(ZN_ECONFIG, "size '%s': a size has no sign", s);
    errno = 0;
    char *end;
    double v = strtod(p, &end);
    if (end == p || errno == ERANGE || !isfinite(v))
        return zn_set_error(ZN_ECONFIG, "size '%s': expected a number with an optional "
                            "unit (e.g. 24GiB, 512MB, 1.5TiB)", s);
    while (isspace((unsigned char)*end))
        end++;
    char unit[8];
    size_t n = strlen(end);
    while (n && isspace((unsigned char)end[n - 1]))
        n--;
    if (n >= sizeof unit)
        return zn_set_error(ZN_ECONFIG, "size '%s': unknown unit '%s'", s, end);
    for (size_t i = 0; i < n; i++)
        unit[i] = (char)tolower((unsigned char)end[i]);
    unit[n] = '\0';
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(unit, units[i].suffix) != 0)
            continue;
        double bytes = v * units[i].mult;
        if (bytes >= 18446744073709551616.0)
            return zn_set_error(ZN_ECONFIG, "size '%s' does not fit in 64 bits", s);
        if (bytes != floor(bytes))
            return zn_set_error(ZN_ECONFIG, "size '%s' is not a whole number of bytes", s);
        *out = (uint64_t)bytes;
        return 0;
    }
    return zn_set_error(ZN_ECONFIG, "size '%s': unknown unit '%.*s' (use B, KiB, MiB, GiB, "
                        "TiB, kB, MB, GB or TB)", s, (int)n, end);
}

char *zn_format_size(uint64_t bytes, char *buf, size_t len)
{
    static const char *names[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.2f %s", v, names[u]);
    return buf;
}

uint64_t zn_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double zn_now_s(void)
{
    return (double)zn_now_ns() * 1e-9;
}
