/* Levelled logging to stderr. The level comes from ZINC_LOG once, at the
 * first message, unless zn_log_set_level was called. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "zinc/util.h"

static atomic_int cur_level = -1;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

int zn_log_parse_level(const char *s, zn_log_level *out)
{
    static const char *names[] = { "debug", "info", "warn", "error", "off" };
    for (int i = 0; i < 5; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (zn_log_level)i;
            return 0;
        }
    }
    if (strcmp(s, "warning") == 0) {
        *out = ZN_LOG_WARN;
        return 0;
    }
    return zn_set_error(ZN_ECONFIG,
        "ZINC_LOG: unknown level '%s' (expected debug, info, warn, error or off)", s);
}

zn_log_level zn_log_get_level(void)
{
    int l = atomic_load(&cur_level);
    if (l < 0) {
        zn_log_level parsed = ZN_LOG_INFO;
        const char *env = getenv("ZINC_LOG");
        if (env && *env && zn_log_parse_level(env, &parsed) != 0) {
            fprintf(stderr, "zinc: warn: ZINC_LOG=%s is not a level "
                    "(debug|info|warn|error|off); using info\n", env);
            parsed = ZN_LOG_INFO;
        }
        int expected = -1;
        atomic_compare_exchange_strong(&cur_level, &expected, (int)parsed);
        l = atomic_load(&cur_level);
    }
    return (zn_log_level)l;
}

void zn_log_set_level(zn_log_level lvl)
{
    atomic_store(&cur_level, (int)lvl);
}

static void vlog(zn_log_level lvl, const char *fmt, va_list ap)
{
    static const char *tags[] = { "debug", "info", "warn", "error" };
    if (lvl < zn_log_get_level() || lvl >= ZN_LOG_OFF)
        return;
    char line[4096];
    vsnprintf(line, sizeof line, fmt, ap);
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "zinc: %s: %s\n", tags[lvl], line);
    pthread_mutex_unlock(&log_lock);
}

void zn_log(zn_log_level lvl, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(lvl, fmt, ap);
    va_end(ap);
}

void zn_warn_once(int *flag, const char *fmt, ...)
{
    if (__atomic_exchange_n(flag, 1, __ATOMIC_ACQ_REL))
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(ZN_LOG_WARN, fmt, ap);
    va_end(ap);
}
