/* zinc trace: spans on named tracks (one per resource: GPU compute, H2D,
 * D2H, NVMe reads, NVMe writes, CPU Adam, ...), their busy time, and a
 * Chrome / Perfetto trace file (JSON "traceEvents", one thread per track,
 * "X" complete events in microseconds). Busy time is always kept; span
 * records are kept only when the trace was created with recording on. */
#ifndef ZINC_TRACE_H
#define ZINC_TRACE_H

#include <stdint.h>

#include "zinc/util.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zn_trace zn_trace;

#define ZN_TRACE_MAX_TRACKS 32
#define ZN_TRACE_NAME_LEN 48

/* Creates a trace. record != 0 keeps every span for zn_trace_write (up to
 * max_spans, 0 = 4 Mi; later spans still count as busy time and are
 * counted as dropped). Returns 0 or -ENOMEM. */
ZN_API int zn_trace_create(zn_trace **out, int record, uint64_t max_spans);
ZN_API void zn_trace_destroy(zn_trace *t); /* accepts NULL */

/* Adds a track (name copied) and returns its id >= 0, or ZN_EARG when
 * ZN_TRACE_MAX_TRACKS are in use. */
ZN_API int zn_trace_add_track(zn_trace *t, const char *name);
/* Adds a track whose busy time is the union of tracks a's and b's spans,
 * overlaps counted once however the spans arrive (one disk's reads and
 * writes: one resource). It records no spans of its own. Returns its id or
 * ZN_EARG. */
ZN_API int zn_trace_add_union(zn_trace *t, const char *name, int a, int b);
ZN_API const char *zn_trace_track_name(const zn_trace *t, int track);
ZN_API int zn_trace_num_tracks(const zn_trace *t);

/* Records a span [t0_ns, t1_ns] (zn_now_ns clock) on a track. Thread-safe.
 * Busy time counts the union of a track's spans in any arrival order
 * (overlapping spans, e.g. concurrent NVMe requests, are not counted twice);
 * a span may arrive late by up to 16 Ki later-starting spans of its track.
 * t == NULL or track < 0: no-op. */
ZN_API void zn_trace_span(zn_trace *t, int track, const char *name, uint64_t t0_ns,
                          uint64_t t1_ns);

/* A counter sample (Chrome "C" event) such as bytes in use on a tier. */
ZN_API void zn_trace_counter(zn_trace *t, const char *name, uint64_t ts_ns, double value);

/* Busy seconds of a track since creation or the last reset. */
ZN_API double zn_trace_busy_s(zn_trace *t, int track);
ZN_API void zn_trace_reset_busy(zn_trace *t);
/* Spans kept and spans dropped (past max_spans). */
ZN_API void zn_trace_counts(zn_trace *t, uint64_t *kept, uint64_t *dropped);

/* Writes the Chrome trace JSON (atomically: a private temporary, then rename). Times
 * are relative to the trace's creation. Returns 0 or -errno (message names
 * the file). */
ZN_API int zn_trace_write(zn_trace *t, const char *path);

#ifdef __cplusplus
}
#endif
#endif
