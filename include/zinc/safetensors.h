/* zinc safetensors: read and write Hugging Face .safetensors checkpoints,
 * single-file or sharded (model.safetensors.index.json). The header is a
 * security boundary: every length, offset, shape and name is checked before
 * use, and a malformed file is refused with a message naming the file, the
 * tensor and the offset. Reading streams tensor by tensor with pread into a
 * caller's buffer; the file is never mapped or held whole in memory.
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
 *  "__metadata__": {"k": "v"}}, then the data section; offsets are relative
 * to the start of the data section (byte 8 + N). */
#ifndef ZINC_SAFETENSORS_H
#define ZINC_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of the format. Only F32, F16, BF16 (and F64 when reading)
 * convert to zn_dtype; the others can be read raw. */
typedef enum {
    ZN_ST_BOOL, ZN_ST_U8, ZN_ST_I8, ZN_ST_F8_E4M3, ZN_ST_F8_E5M2,
    ZN_ST_I16, ZN_ST_U16, ZN_ST_F16, ZN_ST_BF16,
    ZN_ST_I32, ZN_ST_U32, ZN_ST_F32,
    ZN_ST_I64, ZN_ST_U64, ZN_ST_F64,
    ZN_ST_NDTYPES
} zn_st_dtype;

#define ZN_ST_MAX_DIMS 8
/* Largest header accepted (the reference implementation's limit too). */
#define ZN_ST_HEADER_MAX 100000000u

ZN_API size_t zn_st_dtype_size(zn_st_dtype t);      /* 0 for an invalid value */
ZN_API const char *zn_st_dtype_name(zn_st_dtype t); /* "BF16", ...; "?" if invalid */
/* The safetensors type holding a zn_dtype (F32, BF16, F16). */
ZN_API zn_st_dtype zn_st_dtype_from(zn_dtype t);

typedef struct {
    const char *name;   /* owned by the zn_st */
    zn_st_dtype dtype;
    int ndim;
    int64_t shape[ZN_ST_MAX_DIMS];
    uint64_t numel;     /* product of shape (1 for a scalar) */
    uint64_t nbytes;    /* numel * element size */
    uint64_t offset;    /* absolute byte offset in its file */
    int shard;          /* which file: index for zn_st_shard_path */
} zn_st_tensor;

/* An open checkpoint: one .safetensors file or a set of shards. */
typedef struct zn_st zn_st;

/* Opens `path`: a .safetensors file, a model.safetensors.index.json, or a
 * folder holding either (the index wins). Every shard's header is read and
 * validated now; no tensor data is read. Returns 0; -errno (the message
 * names the file); ZN_ECORRUPT for a malformed or hostile file (names the
 * file, the tensor and the offending value); -ENOMEM. */
ZN_API int zn_st_open(zn_st **out, const char *path);
ZN_API void zn_st_close(zn_st *s); /* accepts NULL */

ZN_API size_t zn_st_count(const zn_st *s);
/* Tensors in storage order (shard, then offset): reading them in this order
 * reads each file front to back. NULL when i is out of range. */
ZN_API const zn_st_tensor *zn_st_tensor_at(const zn_st *s, size_t i);
/* NULL when there is no tensor of that name. */
ZN_API const zn_st_tensor *zn_st_find(const zn_st *s, const char *name);
ZN_API int zn_st_num_shards(const zn_st *s);
ZN_API const char *zn_st_shard_path(const zn_st *s, int shard);
/* A string from the first shard's "__metadata__", or NULL. */
ZN_API const char *zn_st_metadata(const zn_st *s, const char *key);

/* Reads tensor `t` (from this zn_st) into dst as `to`, converting F32, F16,
 * BF16 or F64 on the way (round to nearest even; NaN stays NaN).
 * dst_bytes must be t->numel * zn_dtype_size(to). Safe to call from several
 * threads at once. Returns 0; -errno or -EIO for a short read (names the
 * file, tensor and offset); ZN_EARG for a size mismatch; ZN_EUNSUPPORTED
 * for a dtype that does not convert. */
ZN_API int zn_st_read(zn_st *s, const zn_st_tensor *t, zn_dtype to, void *dst, size_t dst_bytes);
/* Reads elements [first, first + count) of `t` (flattened, row-major), for
 * loading a slice of a large tensor. */
ZN_API int zn_st_read_range(zn_st *s, const zn_st_tensor *t, uint64_t first, uint64_t count,
                            zn_dtype to, void *dst, size_t dst_bytes);
/* Reads the bytes as stored, any dtype; dst_bytes must be t->nbytes. */
ZN_API int zn_st_read_raw(zn_st *s, const zn_st_tensor *t, void *dst, size_t dst_bytes);

/* ---- writing -------------------------------------------------------------
 * Declare every tensor with zn_st_writer_add (this fixes the header), then
 * write each one's data with zn_st_writer_write, in whole or in consecutive
 * parts, in any order across tensors; zn_st_writer_finish checks that every
 * tensor was written in full, fsyncs and renames its private temporary to
 * path, so a crash never leaves a half-written file under the final name. The file
 * lays tensors out back to back in the order added, as the reference
 * implementation requires. */
typedef struct zn_st_writer zn_st_writer;

ZN_API int zn_st_writer_create(zn_st_writer **out, const char *path);
/* Drops an unfinished file (its private temporary); accepts NULL. */
ZN_API void zn_st_writer_destroy(zn_st_writer *w);
/* Returns 0; ZN_EARG for a duplicate or empty name, a bad dtype or shape,
 * or a call after the first write. */
ZN_API int zn_st_writer_add(zn_st_writer *w, const char *name, zn_st_dtype dtype, int ndim,
                            const int64_t *shape);
ZN_API int zn_st_writer_set_metadata(zn_st_writer *w, const char *key, const char *value);
/* Writes elements [first, first + count) of tensor `name` from src, which
 * holds them as `from` (converted to the tensor's dtype when it is F32, F16
 * or BF16; otherwise from is ignored and the bytes are copied). Parts of a
 * tensor must come in order (first == elements already written). */
ZN_API int zn_st_writer_write(zn_st_writer *w, const char *name, zn_dtype from, const void *src,
                              uint64_t first, uint64_t count);
ZN_API int zn_st_writer_finish(zn_st_writer *w);

/* Writes a model.safetensors.index.json mapping names[i] to files[i] (bare
 * file names in the same folder), with metadata.total_size. Atomic. */
ZN_API int zn_st_write_index(const char *path, size_t n, const char *const *names,
                             const char *const *files, uint64_t total_size);

#ifdef __cplusplus
}
#endif
#endif
