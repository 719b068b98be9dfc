/*
 * copy.c -- a streaming copy for large shm transfers and the memcpy ceiling (see copy.h).
 *
 * Why: on these VMs glibc's memcpy moves a 64 MiB call at ~10 GB/s with two threads, but a 128 MiB
 * call at ~17 GB/s (it switches to a page-interleaved non-temporal loop only above a size threshold
 * derived from the cache size, which the VM does not report). A batch of 4 MiB blocks therefore ran at
 * 0.6x the memcpy ceiling of the same bytes. This routine does what that fast path does for every
 * descriptor of a large chunk: it reads four 4 KiB pages side by side (four DRAM streams in flight)
 * and writes with non-temporal stores (no read-for-ownership of the destination, no cache pollution
 * by data that will not be reused from cache anyway). Measured: 16-17 GB/s with two threads on 64 MiB
 * pieces, against 9.4-10.5 GB/s for memcpy (bench/compare notes in docs/engine.md).
 */
#include "common/copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

bool pdl__copy_stream_ok(void) { return __builtin_cpu_supports("avx2"); }

__attribute__((target("avx2"))) static void copy_avx2(uint8_t *d, const uint8_t *s, size_t n)
{
    /* Non-temporal stores want an aligned destination: copy the head up to a cache line boundary. */
    size_t head = (64 - ((uintptr_t)d & 63)) & 63;
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    const size_t pg = 4096, group = 4 * pg;
    while (n >= group) {
        for (size_t o = 0; o < pg; o += 64) {
            for (size_t p = 0; p < 4; p++) {
                const __m256i *sp = (const __m256i *)(const void *)(s + p * pg + o);
                __m256i a = _mm256_loadu_si256(sp), b = _mm256_loadu_si256(sp + 1);
                _mm256_stream_si256((__m256i *)(void *)(d + p * pg + o), a);
                _mm256_stream_si256((__m256i *)(void *)(d + p * pg + o + 32), b);
            }
        }
        d += group;
        s += group;
        n -= group;
    }
    /* Whole 256-byte runs that are left (KV head slices are often 4 or 8 KiB): still streamed. */
    while (n >= 256) {
        for (size_t o = 0; o < 256; o += 64) {
            const __m256i *sp = (const __m256i *)(const void *)(s + o);
            __m256i a = _mm256_loadu_si256(sp), b = _mm256_loadu_si256(sp + 1);
            _mm256_stream_si256((__m256i *)(void *)(d + o), a);
            _mm256_stream_si256((__m256i *)(void *)(d + o + 32), b);
        }
        d += 256;
        s += 256;
        n -= 256;
    }
    _mm_sfence(); /* order the streaming stores before anyone is told the batch is done */
    memcpy(d, s, n);
}

void pdl__copy_stream(void *dst, const void *src, size_t n)
{
    if (n >= 4096 && pdl__copy_stream_ok())
        copy_avx2(dst, src, n);
    else
        memcpy(dst, src, n);
}
#else
bool pdl__copy_stream_ok(void) { return false; }
void pdl__copy_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
#endif
