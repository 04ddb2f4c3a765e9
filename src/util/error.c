/* Status codes and the per-thread error detail message. The message is set
 * where a failure happens (with the key, file, offset or call) and read by
 * whoever reports it, usually the CLI. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "zinc/util.h"

#define ZN_ERRMSG_MAX 16384 /* a config may report dozens of problems at once */

static _Thread_local char errmsg[ZN_ERRMSG_MAX];

const char *zn_strerror(int code)
{
    static _Thread_local char buf[64];

    switch (code) {
    case ZN_OK: return "success";
    case ZN_ECONFIG: return "configuration error";
    case ZN_ECUDA: return "CUDA error";
    case ZN_ECUBLAS: return "cuBLAS error";
    case ZN_ENCCL: return "NCCL error";
    case ZN_EMPI: return "MPI error";
    case ZN_ECORRUPT: return "data corruption or malformed file";
    case ZN_ENODEV: return "no such device";
    case ZN_EBUDGET: return "tier budget exceeded";
    case ZN_ENOFIT: return "training state does not fit the tiers";
    case ZN_EUNSUPPORTED: return "not supported by zinc";
    case ZN_EARG: return "bad argument";
    case ZN_ETIMEOUT: return "timed out";
    case ZN_EINTERNAL: return "internal error (a bug in zinc)";
    default: break;
    }
    if (code < 0 && code > -4096) {
        /* strerror_r (GNU) may return a static string or fill buf. */
        const char *s = strerror_r(-code, buf, sizeof buf);
        return s;
    }
    snprintf(buf, sizeof buf, "unknown zinc status %d", code);
    return buf;
}

const char *zn_last_error(void)
{
    return errmsg;
}

int zn_set_errorv(int code, const char *fmt, va_list ap)
{
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    return code;
}

int zn_set_error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    zn_set_errorv(code, fmt, ap);
    va_end(ap);
    return code;
}

int zn_error_prefix(int code, const char *fmt, ...)
{
    char prefix[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (!errmsg[0])
        snprintf(errmsg, sizeof errmsg, "%s", zn_strerror(code));
    /* Shift the old message right and put "prefix: " in front of it. */
    size_t pl = strlen(prefix), ol = strlen(errmsg);
    if (pl + 2 + ol >= sizeof errmsg)
        ol = sizeof errmsg - pl - 3;
    memmove(errmsg + pl + 2, errmsg, ol);
    errmsg[pl + 2 + ol] = '\0';
    memcpy(errmsg, prefix, pl);
    errmsg[pl] = ':';
    errmsg[pl + 1] = ' ';
    return code;
}

void zn_clear_error(void)
{
    errmsg[0] = '\0';
}
