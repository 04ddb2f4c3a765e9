/* CPU features __builtin_cpu_supports does not name in every compiler
 * (clang 14 has no "f16c"): read from cpuid directly. */
#ifndef ZN_UTIL_CPU_IMPL_H
#define ZN_UTIL_CPU_IMPL_H

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>

/* F16C: cpuid leaf 1, ECX bit 29 */
static inline int zn_cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
}
#else
static inline int zn_cpu_has_f16c(void)
{
    return 0;
}
#endif

#endif
