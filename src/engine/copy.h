/*
 * copy.h -- the bulk copy the shm backend uses for large chunks.
 */
#ifndef PDL_ENGINE_COPY_H
#define PDL_ENGINE_COPY_H

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
