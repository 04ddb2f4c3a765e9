/* Size strings, status codes and the per-thread error message. */
#include <errno.h>
#include <pthread.h>

#include "zinc/util.h"
#include "zt.h"

static void test_sizes(void)
{
    static const struct { const char *s; uint64_t v; } good[] = {
        { "0", 0 }, { "123", 123 }, { "24GiB", 24ull << 30 }, { "24G", 24ull << 30 },
        { "512MB", 512000000ull }, { "1.5TiB", 3ull << 39 }, { "4k", 4096 },
        { "4 KiB", 4096 }, { "1e9", 1000000000ull }, { "2gb", 2000000000ull },
        { "7B", 7 }, { " 1MiB ", 1ull << 20 }, { "0.5KiB", 512 },
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t v = 0;
        int rc = zn_parse_size(good[i].s, &v);
        ZT_CHECK_MSG(rc == 0, "parse '%s' failed: %s", good[i].s, zn_last_error());
        ZT_EQ_U64(v, good[i].v);
    }
    static const char *bad[] = { "", "GiB", "-1", "12XB", "1.3", "1e30", "abc", "5 GiBs" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 99;
        int rc = zn_parse_size(bad[i], &v);
        ZT_EQ_INT(rc, ZN_ECONFIG);
        if (bad[i][0])
            ZT_CONTAINS(zn_last_error(), bad[i]);
        ZT_EQ_U64(v, 99);
    }
    char buf[32];
    ZT_EQ_STR(zn_format_size(1536, buf, sizeof buf), "1.50 KiB");
    ZT_EQ_STR(zn_format_size(100, buf, sizeof buf), "100 B");
    ZT_EQ_STR(zn_format_size(24ull << 30, buf, sizeof buf), "24.00 GiB");
}

static void *other_thread(void *arg)
{
    (void)arg;
    zn_set_error(ZN_ECORRUPT, "thread-local message");
    return NULL;
}

static void test_errors(void)
{
    ZT_EQ_INT(zn_set_error(ZN_ECONFIG, "key %s", "a.b"), ZN_ECONFIG);
    ZT_EQ_STR(zn_last_error(), "key a.b");
    pthread_t t;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, NULL);
    ZT_EQ_STR(zn_last_error(), "key a.b");
    ZT_EQ_INT(zn_error_prefix(ZN_ECONFIG, "loading %s", "x.json"), ZN_ECONFIG);
    ZT_EQ_STR(zn_last_error(), "loading x.json: key a.b");
    ZT_EQ_STR(zn_strerror(-ENOENT), "No such file or directory");
    ZT_EQ_STR(zn_strerror(ZN_ECONFIG), "configuration error");
    ZT_CONTAINS(zn_strerror(-20000), "unknown");
    zn_clear_error();
    ZT_EQ_STR(zn_last_error(), "");
    zn_log_level l;
    ZT_EQ_INT(zn_log_parse_level("warn", &l), 0);
    ZT_EQ_INT(l, ZN_LOG_WARN);
    ZT_EQ_INT(zn_log_parse_level("loud", &l), ZN_ECONFIG);
    ZT_CONTAINS(zn_last_error(), "loud");
}

int main(void)
{
    test_sizes();
    test_errors();
    return zt_done();
}
