/*
 * test_engine_iov.c -- the tcp backend's iovec helpers (src/engine/iov.h), checked exhaustively over
 * every list of up to 4 iovecs of 0..3 bytes against definitions written a second way (prefix sums
 * instead of loops), plus the byte contents the list covers after each step.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engine/iov.h"

#define MAXN 4
#define MAXLEN 3

/* Lay out list number `code` (base MAXLEN + 1 digits = lengths) over buf; returns its total bytes. */
static size_t make_list(unsigned code, size_t n, uint8_t *buf, struct iovec *v)
{
    size_t off = 0;
    for (size_t j = 0; j < n; j++) {
        size_t len = code % (MAXLEN + 1);
        code /= MAXLEN + 1;
        v[j].iov_base = buf + off;
        v[j].iov_len = len;
        off += len;
    }
    return off;
}

static unsigned lists_of(size_t n)
{
    unsigned c = 1;
    for (size_t j = 0; j < n; j++)
        c *= MAXLEN + 1;
    return c;
}

static void test_iov_cap(void **state)
{
    (void)state;
    uint8_t buf[MAXN * MAXLEN];
    unsigned checked = 0;
    for (size_t n = 1; n <= MAXN; n++) {
        for (unsigned code = 0; code < lists_of(n); code++) {
            for (size_t max_iov = 1; max_iov <= MAXN + 1; max_iov++) {
                for (size_t max_bytes = 1; max_bytes <= MAXN * MAXLEN + 1; max_bytes++) {
                    struct iovec v[MAXN], orig[MAXN];
                    make_list(code, n, buf, v);
                    memcpy(orig, v, sizeof(v));
                    /* Reference: the first count at which the list ends, the entry limit is reached,
                     * or the prefix covers max_bytes. */
                    size_t want_k = 0, prefix = 0;
                    while (!(want_k == n || want_k == max_iov || prefix >= max_bytes))
                        prefix += orig[want_k++].iov_len;
                    size_t saved = 12345;
                    size_t k = pdl__iov_cap(v, n, max_iov, max_bytes, &saved);
                    assert_int_equal(k, want_k);
                    assert_true(k >= 1);
                    size_t covered = 0;
                    for (size_t j = 0; j < k; j++)
                        covered += v[j].iov_len;
                    assert_int_equal(covered, prefix < max_bytes ? prefix : max_bytes);
                    /* Only the last entry taken may be shortened, and then saved holds its length. */
                    for (size_t j = 0; j < n; j++) {
                        assert_ptr_equal(v[j].iov_base, orig[j].iov_base);
                        if (j != k - 1)
                            assert_int_equal(v[j].iov_len, orig[j].iov_len);
                    }
                    if (prefix > max_bytes) {
                        assert_int_equal(saved, orig[k - 1].iov_len);
                        assert_true(v[k - 1].iov_len < orig[k - 1].iov_len);
                    } else {
                        assert_int_equal(saved, 0);
                        assert_int_equal(v[k - 1].iov_len, orig[k - 1].iov_len);
                    }
                    pdl__iov_uncap(v, k, saved);
                    assert_memory_equal(v, orig, sizeof(v));
                    checked++;
                }
            }
        }
    }
    print_message("pdl__iov_cap: %u cases\n", checked);
}

static void test_iov_advance(void **state)
{
    (void)state;
    uint8_t buf[MAXN * MAXLEN];
    for (size_t b = 0; b < sizeof(buf); b++)
        buf[b] = (uint8_t)(b + 1); /* distinct bytes: the remaining list's contents identify the offset */
    unsigned checked = 0;
    for (size_t n = 1; n <= MAXN; n++) {
        for (unsigned code = 0; code < lists_of(n); code++) {
            for (size_t i0 = 0; i0 <= n; i0++) {
                struct iovec tmpl[MAXN];
                size_t total = make_list(code, n, buf, tmpl);
                for (size_t done = 0; done <= total + 2; done++) {
                    struct iovec v[MAXN];
                    memcpy(v, tmpl, sizeof(v));
                    size_t S[MAXN + 1]; /* S[j]: bytes of v[i0..j) */
                    S[i0] = 0;
                    for (size_t j = i0; j < n; j++)
                        S[j + 1] = S[j] + v[j].iov_len;
                    /* Reference: nothing moves for 0 bytes; else the first j with S[j] >= done ends the
                     * walk: at j when it matches exactly, inside v[j - 1] when it overshoots, and at n
                     * when done is more than the list holds. */
                    size_t want_i = i0, partial = 0;
                    if (done > 0) {
                        size_t j = i0 + 1;
                        while (j <= n && S[j] < done)
                            j++;
                        if (j > n)
                            want_i = n;
                        else if (S[j] == done)
                            want_i = j;
                        else
                            want_i = j - 1, partial = done - S[j - 1];
                    }
                    size_t i = i0;
                    pdl__iov_advance(v, &i, n, done);
                    assert_int_equal(i, want_i);
                    for (size_t j = 0; j < n; j++) {
                        if (j == i && partial > 0) {
                            assert_ptr_equal(v[j].iov_base, (uint8_t *)tmpl[j].iov_base + partial);
                            assert_int_equal(v[j].iov_len, tmpl[j].iov_len - partial);
                        } else {
                            assert_memory_equal(&v[j], &tmpl[j], sizeof(v[j]));
                        }
                    }
                    /* What is left is the list's bytes after `done` of them. */
                    uint8_t left[sizeof(buf)];
                    size_t nleft = 0;
                    for (size_t j = i; j < n; j++) {
                        memcpy(left + nleft, v[j].iov_base, v[j].iov_len);
                        nleft += v[j].iov_len;
                    }
                    size_t in_list = S[n];
                    size_t skip = done < in_list ? done : in_list;
                    assert_int_equal(nleft, in_list - skip);
                    if (nleft > 0)
                        assert_memory_equal(left, (uint8_t *)tmpl[i0].iov_base + skip, nleft);
                    checked++;
                }
            }
        }
    }
    print_message("pdl__iov_advance: %u cases\n", checked);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_iov_cap),
        cmocka_unit_test(test_iov_advance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
