/* zinc utilities: status codes and per-thread error detail, logging, size
 * strings and clocks. Every other zinc header builds on this one. */
#ifndef ZINC_UTIL_H
#define ZINC_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdarg.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ZN_BUILDING_LIB) && defined(__GNUC__)
#define ZN_API __attribute__((visibility("default")))
#else
#define ZN_API
#endif

#if defined(__GNUC__)
#define ZN_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define ZN_PRINTF(f, a)
#endif

/* Longest path zinc keeps in a fixed buffer (config values, swap folders). */
#define ZN_PATH_MAX 1024

/* ---- status codes --------------------------------------------------------
 * Functions return 0 on success or a negative code: -errno for OS and
 * io_uring errors, or one of zinc's own codes below (all below -4095, outside
 * errno's range). zn_strerror() names any of them. */
enum {
    ZN_OK = 0,
    ZN_ECONFIG = -10001,   /* bad configuration value, key or file */
    ZN_ECUDA = -10002,     /* CUDA runtime call failed */
    ZN_ECUBLAS = -10003,   /* cuBLAS call failed */
    ZN_ENCCL = -10004,     /* NCCL call failed */
    ZN_EMPI = -10005,      /* MPI call failed */
    ZN_ECORRUPT = -10006,  /* checksum mismatch or malformed file */
    ZN_ENODEV = -10007,    /* requested device not present */
    ZN_EBUDGET = -10008,   /* a tier budget would be exceeded */
    ZN_ENOFIT = -10009,    /* the plan does not fit the tiers */
    ZN_EUNSUPPORTED = -10010, /* valid request that zinc does not implement */
    ZN_EARG = -10011,      /* bad command-line argument */
    ZN_ETIMEOUT = -10012,  /* a collective or peer did not answer in time */
    ZN_EINTERNAL = -10013, /* an impossible state: a bug in zinc */
};

/* Short name of a status code ("configuration error", strerror(-code), ...).
 * Never NULL; the string is static. */
ZN_API const char *zn_strerror(int code);

/* The detail message of the last failure on this thread: which key, file,
 * offset or call failed. Empty string when nothing was recorded. The string
 * is thread-local and valid until the next zn_set_error on this thread. */
ZN_API const char *zn_last_error(void);

/* Records a detail message for the calling thread and returns `code`, so that
 * callers can write `return zn_set_error(-EINVAL, "...")`. */
ZN_API int zn_set_error(int code, const char *fmt, ...) ZN_PRINTF(2, 3);
ZN_API int zn_set_errorv(int code, const char *fmt, va_list ap);

/* Prefixes the current detail message with more context ("loading x: ")
 * and returns `code`. */
ZN_API int zn_error_prefix(int code, const char *fmt, ...) ZN_PRINTF(2, 3);

ZN_API void zn_clear_error(void);

/* ---- logging -------------------------------------------------------------
 * Level from ZINC_LOG=debug|info|warn|error (default info); messages go to
 * stderr as "zinc: <level>: text". zn_log_set_level overrides the variable. */
typedef enum { ZN_LOG_DEBUG = 0, ZN_LOG_INFO, ZN_LOG_WARN, ZN_LOG_ERROR, ZN_LOG_OFF } zn_log_level;

ZN_API void zn_log(zn_log_level lvl, const char *fmt, ...) ZN_PRINTF(2, 3);
ZN_API void zn_log_set_level(zn_log_level lvl);
ZN_API zn_log_level zn_log_get_level(void);
/* Parses "debug", "info", "warn", "error", "off". Returns 0 or ZN_ECONFIG. */
ZN_API int zn_log_parse_level(const char *s, zn_log_level *out);

#define zn_debug(...) zn_log(ZN_LOG_DEBUG, __VA_ARGS__)
#define zn_info(...)  zn_log(ZN_LOG_INFO, __VA_ARGS__)
#define zn_warn(...)  zn_log(ZN_LOG_WARN, __VA_ARGS__)
#define zn_error(...) zn_log(ZN_LOG_ERROR, __VA_ARGS__)

/* Warns once per `flag` (a static int the caller owns); thread-safe. */
ZN_API void zn_warn_once(int *flag, const char *fmt, ...) ZN_PRINTF(2, 3);

/* ---- sizes ---------------------------------------------------------------
 * Parses "24GiB", "512MB", "1.5TiB", "4k", "1e9", "123". Binary units (KiB,
 * MiB, GiB, TiB, and the single letters K, M, G, T) are powers of 1024;
 * decimal units (kB, MB, GB, TB) powers of 1000. The result must be a whole
 * number of bytes that fits in uint64. Returns 0, or ZN_ECONFIG with a
 * message naming the string. */
ZN_API int zn_parse_size(const char *s, uint64_t *out);

/* Formats bytes as "1.50 GiB" into buf (>= 16 bytes); returns buf. */
ZN_API char *zn_format_size(uint64_t bytes, char *buf, size_t len);

/* ---- clocks --------------------------------------------------------------*/
/* Monotonic time in nanoseconds and in seconds. */
ZN_API uint64_t zn_now_ns(void);
ZN_API double zn_now_s(void);

/* ---- element types -------------------------------------------------------
 * The floating-point types that zinc stores and moves. The 16-bit ones are
 * raw bit patterns (uint16_t) in memory, converted below (scalars) and by
 * include/zinc/optim.h (arrays). */
typedef enum { ZN_DTYPE_F32 = 0, ZN_DTYPE_BF16 = 1, ZN_DTYPE_F16 = 2 } zn_dtype;

/* Bytes per element (4 or 2), or 0 for a value outside the enum. */
static inline size_t zn_dtype_size(zn_dtype t)
{
    return t == ZN_DTYPE_F32 ? 4 : (t == ZN_DTYPE_BF16 || t == ZN_DTYPE_F16) ? 2 : 0;
}

/* "f32", "bf16", "f16", or "?" for a value outside the enum. */
static inline const char *zn_dtype_name(zn_dtype t)
{
    return t == ZN_DTYPE_F32 ? "f32" : t == ZN_DTYPE_BF16 ? "bf16" : t == ZN_DTYPE_F16 ? "f16" : "?";
}

/* The scalar 16-bit float conversions on the host, the one home of them
 * (every layer includes this header; tests/test_half.c checks them against
 * value-based references and the CPU's own conversions). Out-of-line forms:
 * zn_f32_to_bf16 and friends in optim.h, with zn_convert for arrays; the
 * SIMD paths in src/optim/ match these bit for bit.
 *
 * bf16 <-> fp32: round to nearest even on the bits; a NaN keeps its sign
 * and top payload and gets the quiet bit. The same rounding as the CUDA
 * kernels and as torch. */
static inline uint16_t zn_bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float zn_bf16_widen(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* IEEE binary16 <-> fp32: round to nearest even, the same bits as x86's
 * vcvtps2ph with imm 0: past 65504 by half an ulp or
 * more is Inf, subnormal halves are kept (not flushed), a NaN keeps its
 * sign and top payload and gets the quiet bit. Widening is exact (NaN
 * made quiet, as vcvtph2ps does). */
static inline uint16_t zn_f16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)                       /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u)                      /* >= 65520 (a tie above 65504): Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {                    /* >= 2^-14: normal half */
        uint32_t r = a - 0x38000000u;          /* rebias the exponent: 127 - 15 = 112 */
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a <= 0x33000000u)                      /* <= 2^-25: 0 (2^-25 ties to even 0) */
        return (uint16_t)sign;
    /* subnormal half: count units of 2^-24 */
    uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e;                 /* 14 .. 24 */
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

static inline float zn_f16_widen(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (e == 0x1f) {          /* Inf, or NaN made quiet */
        u = sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);
    } else if (e) {
        u = sign | ((e + 112u) << 23) | (mant << 13);
    } else if (!mant) {
        u = sign;
    } else {                  /* subnormal: shift the leading 1 to the implicit bit */
        uint32_t s = 0;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            s++;
        }
        u = sign | ((113u - s) << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- checksums -----------------------------------------------------------
 * crc32c (Castagnoli). Start with crc = 0; pass the previous result to
 * continue over the next piece: zn_crc32c(zn_crc32c(0, a, n), b, m) equals
 * the crc of a followed by b. Uses the SSE4.2 crc32 instruction where the CPU
 * has it (chosen at run time), a table otherwise. Thread-safe. */
ZN_API uint32_t zn_crc32c(uint32_t crc, const void *buf, size_t len);
/* The crc of a followed by b from the crc of each and b's length:
 * zn_crc32c_combine(zn_crc32c(0, a, n), zn_crc32c(0, b, m), m) equals
 * zn_crc32c(0, a | b, n + m), so pieces checksummed apart (or in another
 * order) give the whole's. About len_b / 8192 table steps. */
ZN_API uint32_t zn_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* ---- TensorBoard event files (src/util/tfevents.c) ------------------------
 * The scalars DeepSpeed's tensorboard monitor writes, in the event format
 * TensorBoard reads: zn_tb_open makes DIR (as mkdir -p) and a new
 * events.out.tfevents.TIME.HOST.PID file in it; zn_tb_scalar appends one
 * scalar (flushed); NULL handles are no-ops. Return 0 or -errno named. */
typedef struct zn_tb zn_tb;
ZN_API int zn_tb_open(zn_tb **out, const char *dir);
ZN_API int zn_tb_scalar(zn_tb *t, const char *tag, int64_t step, float value);
ZN_API const char *zn_tb_path(const zn_tb *t);
ZN_API void zn_tb_close(zn_tb *t);

/* DeepSpeed's csv_monitor files (src/util/csvmon.c): under DIR (made as
 * mkdir -p), one NAME.csv per event ('/' and ' ' made '_'), "step,<last
 * part of NAME>" first, then "step,value" lines. NULL handles are no-ops.
 * Return 0 or -errno named. */
typedef struct zn_csvmon zn_csvmon;
ZN_API int zn_csvmon_open(zn_csvmon **out, const char *dir);
ZN_API int zn_csvmon_event(zn_csvmon *m, const char *name, int64_t step, double value);
ZN_API void zn_csvmon_close(zn_csvmon *m);

#ifdef __cplusplus
}
#endif
#endif
