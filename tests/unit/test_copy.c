/*
 * test_copy.c -- the streaming copy (src/common/copy.c; used by the shm backend and the memcpy
 * ceiling) copies exactly the bytes asked for, whatever the sizes and alignments, and nothing around
 * them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/copy.h"

static void test_copy_sizes_and_alignments(void **state)
{
    (void)state;
    const size_t cap = (1u << 20) + 8192;
    uint8_t *src = malloc(cap), *dst = malloc(cap);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < cap; i++)
        src[i] = (uint8_t)(i * 31 + 7);
    const size_t sizes[] = {0, 1, 63, 255, 256, 257, 4095, 4096, 4097, 8192, 16383, 16384, 16385, 65536 + 300,
                            (1u << 20)};
    const size_t offs[] = {0, 1, 17, 32, 63, 64, 4000};
    for (size_t a = 0; a < sizeof(sizes) / sizeof(sizes[0]); a++) {
        for (size_t so = 0; so < sizeof(offs) / sizeof(offs[0]); so++) {
            size_t doff = offs[(so + a) % (sizeof(offs) / sizeof(offs[0]))];
            size_t n = sizes[a];
            if (n + offs[so] > cap || n + doff + 1 > cap)
                continue;
            memset(dst, 0xA5, cap);
            pdl__copy_stream(dst + doff, src + offs[so], n);
            assert_memory_equal(dst + doff, src + offs[so], n);
            for (size_t i = 0; i < doff; i++)
                assert_int_equal(dst[i], 0xA5);
            assert_int_equal(dst[doff + n], 0xA5);
        }
    }
    free(src);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_sizes_and_alignments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
