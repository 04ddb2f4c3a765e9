/* Locates tests/fixtures/ from a test binary: $ZN_FIXTURES if set, else the
 * source tree found from __FILE__ (meson compiles with paths relative to the
 * build root, and runs tests in <build>/tests). */
#ifndef ZN_TEST_MODEL_FIXTURES_H
#define ZN_TEST_MODEL_FIXTURES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static inline const char *zt_fixtures_dir(void)
{
    static char buf[4096];
    const char *env = getenv("ZN_FIXTURES");
    if (env && *env)
        return env;
    const char *f = __FILE__;
    const char *slash = strrchr(f, '/');
    int dirlen = slash ? (int)(slash - f) : 0;
    if (f[0] == '/')
        snprintf(buf, sizeof buf, "%.*s/fixtures", dirlen, f);
    else if (dirlen)
        snprintf(buf, sizeof buf, "../%.*s/fixtures", dirlen, f);
    else
        snprintf(buf, sizeof buf, "../../tests/fixtures");
    return buf;
}

/* dir/name into a static rotating buffer (4 slots). */
static inline const char *zt_fixture(const char *name)
{
    static char bufs[4][4096];
    static int k;
    char *b = bufs[k++ & 3];
    if (snprintf(b, 4096, "%s/%s", zt_fixtures_dir(), name) >= 4096)
        b[0] = '\0';
    return b;
}

#endif
