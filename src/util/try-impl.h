/* The two ways a function passes a failed call's status on (docs/style.md: one
 * macro, one meaning). ZN_TRY returns it at once, for functions that hold
 * nothing to undo; ZN_TRY_GOTO stores it in the caller's `rc` and jumps to
 * its `fail` label, which undoes in reverse order. */
#ifndef ZN_UTIL_TRY_IMPL_H
#define ZN_UTIL_TRY_IMPL_H

#define ZN_TRY(x)                                                              \
    do {                                                                       \
        int zn_try_rc_ = (x);                                                  \
        if (zn_try_rc_)                                                        \
            return zn_try_rc_;                                                 \
    } while (0)

#define ZN_TRY_GOTO(x)                                                         \
    do {                                                                       \
        rc = (x);                                                              \
        if (rc)                                                                \
            goto fail;                                                         \
    } while (0)

#endif
