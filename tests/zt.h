/* zinc's tiny test harness: each test is one executable; exit 0 pass,
 * 1 fail, 77 skip (with a one-line reason), 99 setup error (meson's codes).
 * Checks print what was expected and what came, then the test goes on so
 * that one run shows every failure. */
#ifndef ZT_H
#define ZT_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int zt_failures;
static int zt_checks;

#define ZT_FAIL_AT(...)                                                     \
    do {                                                                    \
        zt_failures++;                                                      \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
        fprintf(stderr, __VA_ARGS__);                                       \
        fputc('\n', stderr);                                                \
    } while (0)

#define ZT_CHECK(cond)                                                      \
    do {                                                                    \
        zt_checks++;                                                        \
        if (!(cond))                                                        \
            ZT_FAIL_AT("expected %s", #cond);                               \
    } while (0)

#define ZT_CHECK_MSG(cond, ...)                                             \
    do {                                                                    \
        zt_checks++;                                                        \
        if (!(cond))                                                        \
            ZT_FAIL_AT(__VA_ARGS__);                                        \
    } while (0)

#define ZT_EQ_INT(a, b)                                                     \
    do {                                                                    \
        long long zt_a = (long long)(a), zt_b = (long long)(b);             \
        zt_checks++;                                                        \
        if (zt_a != zt_b)                                                   \
            ZT_FAIL_AT("%s == %s: expected %lld, got %lld", #a, #b, zt_b, zt_a); \
    } while (0)

#define ZT_EQ_U64(a, b)                                                     \
    do {                                                                    \
        uint64_t zt_a = (uint64_t)(a), zt_b = (uint64_t)(b);                \
        zt_checks++;                                                        \
        if (zt_a != zt_b)                                                   \
            ZT_FAIL_AT("%s == %s: expected %" PRIu64 ", got %" PRIu64,      \
                       #a, #b, zt_b, zt_a);                                 \
    } while (0)

#define ZT_EQ_STR(a, b)                                                     \
    do {                                                                    \
        const char *zt_a = (a), *zt_b = (b);                                \
        zt_checks++;                                                        \
        if (!zt_a || !zt_b || strcmp(zt_a, zt_b) != 0)                      \
            ZT_FAIL_AT("%s == %s: expected \"%s\", got \"%s\"", #a, #b,     \
                       zt_b ? zt_b : "(null)", zt_a ? zt_a : "(null)");     \
    } while (0)

/* Substring check, for error messages. */
#define ZT_CONTAINS(hay, needle)                                            \
    do {                                                                    \
        const char *zt_h = (hay), *zt_n = (needle);                         \
        zt_checks++;                                                        \
        if (!zt_h || !strstr(zt_h, zt_n))                                   \
            ZT_FAIL_AT("expected \"%s\" to contain \"%s\"",                 \
                       zt_h ? zt_h : "(null)", zt_n);                       \
    } while (0)

#define ZT_SKIP(...)                                                        \
    do {                                                                    \
        printf("SKIP: ");                                                   \
        printf(__VA_ARGS__);                                                \
        printf("\n");                                                       \
        exit(77);                                                           \
    } while (0)

#define ZT_SETUP_FAIL(...)                                                  \
    do {                                                                    \
        fprintf(stderr, "SETUP ERROR %s:%d: ", __FILE__, __LINE__);         \
        fprintf(stderr, __VA_ARGS__);                                       \
        fputc('\n', stderr);                                                \
        exit(99);                                                           \
    } while (0)

/* Ends a test: a test that checked nothing is a setup error, never a pass. */
static inline int zt_done(void)
{
    if (zt_checks == 0) {
        fprintf(stderr, "SETUP ERROR: the test made no checks\n");
        return 99;
    }
    printf("%d checks, %d failed\n", zt_checks, zt_failures);
    return zt_failures ? 1 : 0;
}

#endif
