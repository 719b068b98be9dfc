/*
 * test_router_policy.c -- pdlink-router's selection policies as a unit, linked from pdl_router
 * (the router program's library): murmur64a against
 * its defining properties, furc_hash bounds, consistent_hash stability, balance and
 * minimal movement when a worker leaves, round_robin order, random coverage, hash-key precedence.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "router/policy.h"

static void murmur64a_matches_reference_vectors(void **state)
{
    (void)state;
    /* MurmurHash64A of the empty string with seed 0 is 0 (nothing is mixed in). */
    assert_int_equal(pdl_policy_murmur64a("", 0, 0), 0);
    assert_true(pdl_policy_murmur64a("a", 1, 0) != pdl_policy_murmur64a("b", 1, 0));
    /* Changing any byte, or the length, changes the hash; same input, same hash. */
    const char *k = "http://10.0.0.1:8100:17";
    uint64_t h = pdl_policy_murmur64a(k, strlen(k), PDL_POLICY_HASH_SEED);
    assert_true(h == pdl_policy_murmur64a(k, strlen(k), PDL_POLICY_HASH_SEED));
    assert_true(h != pdl_policy_murmur64a(k, strlen(k) - 1, PDL_POLICY_HASH_SEED));
    assert_true(h != pdl_policy_murmur64a(k, strlen(k), 0));
    /* Every tail length (1..7 bytes after the 8-byte blocks) is mixed in. */
    char buf[16] = "0123456789abcde";
    for (size_t n = 8; n < 16; n++) {
        uint64_t a = pdl_policy_murmur64a(buf, n, 1);
        buf[n - 1] ^= 1;
        assert_true(a != pdl_policy_murmur64a(buf, n, 1));
        buf[n - 1] ^= 1;
    }
}

static void furc_hash_stays_in_range(void **state)
{
    (void)state;
    uint32_t ms[] = {1, 2, 3, 7, 8, 100, 1000, (1u << 23) - 1};
    for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++)
        for (int k = 0; k < 500; k++) {
            char key[32];
            int n = snprintf(key, sizeof(key), "key-%d", k);
            uint32_t v = pdl_policy_furc_hash(key, (size_t)n, ms[i]);
            assert_true(ms[i] <= 1 ? v == 0 : v < ms[i]);
        }
}

static const char *const kUrls4[] = {"http://10.0.0.1:8100", "http://10.0.0.2:8100", "http://10.0.0.3:8100",
                                     "http://10.0.0.4:8100"};

static void consistent_hash_is_stable_balanced_and_minimal(void **state)
{
    (void)state;
    pdl_policy_t *p = NULL, *q = NULL;
    assert_int_equal(pdl_policy_create(PDL_POLICY_CONSISTENT_HASH, 1, &p), PDL_OK);
    assert_int_equal(pdl_policy_create(PDL_POLICY_CONSISTENT_HASH, 2, &q), PDL_OK);
    size_t count[4] = {0}, first[2000];
    for (int k = 0; k < 2000; k++) {
        char key[32];
        snprintf(key, sizeof(key), "user:%d", k);
        size_t a = pdl_policy_pick(p, kUrls4, 4, key);
        assert_true(a < 4);
        assert_int_equal(a, pdl_policy_pick(p, kUrls4, 4, key)); /* stable */
        assert_int_equal(a, pdl_policy_pick(q, kUrls4, 4, key)); /* independent of the object */
        first[k] = a;
        count[a]++;
    }
    for (int w = 0; w < 4; w++)
        assert_true(count[w] > 2000 / 4 / 3); /* 160 virtual nodes keep each share well above 1/12 */
    /* Worker 3 leaves: only its keys move. */
    int moved_other = 0;
    for (int k = 0; k < 2000; k++) {
        char key[32];
        snprintf(key, sizeof(key), "user:%d", k);
        size_t b = pdl_policy_pick(p, kUrls4, 3, key);
        assert_true(b < 3);
        if (first[k] != 3 && b != first[k])
            moved_other++;
    }
    assert_int_equal(moved_other, 0);
    pdl_policy_destroy(p);
    pdl_policy_destroy(q);
}

static void round_robin_cycles_and_random_covers(void **state)
{
    (void)state;
    pdl_policy_t *rr = NULL, *rnd = NULL;
    assert_int_equal(pdl_policy_create(PDL_POLICY_ROUND_ROBIN, 1, &rr), PDL_OK);
    assert_int_equal(pdl_policy_create(PDL_POLICY_RANDOM, 12345, &rnd), PDL_OK);
    for (int i = 0; i < 12; i++)
        assert_int_equal(pdl_policy_pick(rr, kUrls4, 4, NULL), (size_t)(i % 4));
    assert_int_equal(pdl_policy_pick(rr, kUrls4, 1, NULL), 0);
    size_t seen[4] = {0};
    for (int i = 0; i < 400; i++)
        seen[pdl_policy_pick(rnd, kUrls4, 4, NULL)]++;
    for (int w = 0; w < 4; w++)
        assert_true(seen[w] > 40);
    pdl_policy_destroy(rr);
    pdl_policy_destroy(rnd);
}

static void hash_key_follows_reference_precedence(void **state)
{
    (void)state;
    struct {
        const char *body, *want;
    } cases[] = {
        {"{\"session_params\":{\"session_id\":\"s1\"},\"user\":\"u\"}", "session:s1"},
        {"{\"user\":\"alice\",\"session_id\":\"s2\"}", "user:alice"},
        {"{\"session_id\":\"s2\",\"user_id\":7}", "session:s2"},
        {"{\"user_id\":7}", "user:7"},
        {"{\"prompt\":\"hi\"}", "request:{\"prompt\":\"hi\"}"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *j = json_loads(cases[i].body, 0, NULL);
        char *text = json_dumps(j, JSON_COMPACT);
        char *key = pdl_policy_hash_key(j, text, strlen(text));
        assert_string_equal(key, cases[i].want);
        free(key);
        free(text);
        json_decref(j);
    }
    char longtext[300];
    memset(longtext, 'x', sizeof(longtext) - 1);
    longtext[sizeof(longtext) - 1] = '\0';
    char *key = pdl_policy_hash_key(NULL, longtext, strlen(longtext));
    assert_int_equal(strncmp(key, "request_hash:", 13), 0);
    assert_int_equal(strlen(key), 13 + 16);
    free(key);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(murmur64a_matches_reference_vectors),
        cmocka_unit_test(furc_hash_stays_in_range),
        cmocka_unit_test(consistent_hash_is_stable_balanced_and_minimal),
        cmocka_unit_test(round_robin_cycles_and_random_covers),
        cmocka_unit_test(hash_key_follows_reference_precedence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
