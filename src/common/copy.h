/*
 * copy.h -- a streaming (non-temporal) bulk copy for copies far larger than the caches (internal).
 *
 * Two users need the same routine: the shm backend copies large chunks with it, and `pdlink bench`'s
 * memcpy ceiling (bench/ceiling.c) must be able to copy at least as fast as the engine does, or the
 * ceiling would sit below what the engine reaches. It depends on nothing above libc, so it lives in
 * the common layer that every layer and program may use, not among the engine's private headers.
 */
#ifndef PDL_COMMON_COPY_H
#define PDL_COMMON_COPY_H

#include <stdbool.h>
#include <stddef.h>

/* Below this a chunk's copies stay in glibc memcpy (its data may still be in cache afterwards). */
#define PDL_COPY_STREAM_MIN_CHUNK (8u << 20)

/* True when pdl__copy_stream can use its vector path on this CPU. */
bool pdl__copy_stream_ok(void);
/*
 * Copy n bytes with non-temporal stores, reading four pages side by side, then 256-byte runs; memcpy
 * for copies under 4 KiB, the last bytes, and when the CPU lacks AVX2.
 */
void pdl__copy_stream(void *dst, const void *src, size_t n);

#endif
