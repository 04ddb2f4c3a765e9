/* Internal entry points of crc32c.c, so that tests can run both
 * implementations on the same input. zn_crc32c() (util.h) picks one. */
#ifndef ZN_UTIL_CRC32C_IMPL_H
#define ZN_UTIL_CRC32C_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* Portable slicing-by-8 table version. */
uint32_t zn_crc32c_sw(uint32_t crc, const void *buf, size_t len);
/* SSE4.2 three-stream version; falls back to the table where the CPU lacks
 * SSE4.2 (zn_crc32c_have_hw() says which). */
uint32_t zn_crc32c_hw(uint32_t crc, const void *buf, size_t len);
int zn_crc32c_have_hw(void);

#endif
