/* test_strbuf.c -- the growable printf buffer: appends across many reallocations keep every byte. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "common/strbuf.h"

static void test_appends_grow_and_keep_text(void **state)
{
    (void)state;
    pdl_strbuf_t b = {0};
    char expect[64];
    size_t total = 0;
    for (int i = 0; i < 5000; i++) {
        pdl_strbuf_printf(&b, "line %d\n", i);
        total += (size_t)snprintf(expect, sizeof(expect), "line %d\n", i);
    }
    assert_false(b.failed);
    assert_int_equal(b.len, total);
    assert_int_equal(strlen(b.p), total);
    assert_memory_equal(b.p, "line 0\nline 1\n", 14);
    assert_non_null(strstr(b.p, "line 4999\n"));
    pdl_strbuf_free(&b);
    assert_null(b.p);
    assert_int_equal(b.len, 0);
}

static void test_one_large_append(void **state)
{
    (void)state;
    pdl_strbuf_t b = {0};
    static char big[100000];
    memset(big, 'x', sizeof(big) - 1);
    pdl_strbuf_printf(&b, "[%s]", big);
    assert_int_equal(b.len, sizeof(big) + 1);
    assert_int_equal(b.p[0], '[');
    assert_int_equal(b.p[b.len - 1], ']');
    pdl_strbuf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_appends_grow_and_keep_text),
        cmocka_unit_test(test_one_large_append),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
