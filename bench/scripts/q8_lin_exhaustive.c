/* Every float y with |y| <= 1 (and the one above 1), both signs, through
 * the 8-bit quantize's linear estimate (zn_q8_code_lin), against the
 * definition (zn_q8_code of y clamped to [-1, 1]), for the four built-in
 * tables: how many the estimate leaves to the search and how many it gets
 * wrong (must be 0). test_adam_q8 probes every 16-bit range of floats and
 * every midpoint's neighbours; this covers all 2^31 in about 25 s, too long
 * for the suite. Build and run from the repository root, after a build:
 *
 *   gcc -O2 -march=native -Isrc -Iinclude bench/scripts/q8_lin_exhaustive.c \
 *       build-nocuda/libzinc.a -lm -fopenmp -lpthread -o /tmp/q8_lin && /tmp/q8_lin
 *
 * Exit 1 when any code is wrong or a table refused its estimate. */
#include <stdio.h>

#include "optim/optim-impl.h"

int main(void)
{
    int fail = 0;
    for (int sc = ZN_Q8_BNB; sc <= ZN_Q8_TORCHAO; sc++) {
        for (int s = 0; s < 2; s++) {
            const zn_q8_table *t = zn_q8_table_get((zn_q8_scheme)sc, s);
            const char *name = sc == ZN_Q8_BNB ? "bitsandbytes" : "torchao";
            if (!t || !t->lin_ok) {
                printf("%s %s: no linear estimate\n", name, s ? "signed" : "unsigned");
                fail = 1;
                continue;
            }
            unsigned long long undecided = 0, wrong = 0, n = 0;
            uint32_t top = zn_f32_bits(nextafterf(1.0f, 2.0f));
            for (uint32_t neg = 0; neg < 2; neg++) {
                for (uint32_t a = 0; a <= top; a++) {
                    float y = zn_bits_f32(a | neg << 31);
                    float yc = y < -1.0f ? -1.0f : y > 1.0f ? 1.0f : y;
                    uint8_t c;
                    n++;
                    if (!zn_q8_code_lin(t, y, &c))
                        undecided++;
                    else if (c != zn_q8_code(t, yc) && wrong++ < 5)
                        printf("  y %a: estimate %d, definition %d\n", (double)y, c,
                               zn_q8_code(t, yc));
                }
            }
            printf("%s %s (two group boundary tables: %d): %llu floats, %llu left to the search "
                   "(%.4f%%), %llu wrong\n", name, s ? "signed" : "unsigned", t->lin_two_b, n,
                   undecided, 100.0 * (double)undecided / (double)n, wrong);
            fail |= wrong != 0;
        }
    }
    return fail;
}
