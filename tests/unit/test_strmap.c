/*
 * test_strmap.c -- the connector's string map: SipHash-2-4 against the paper's test vector, insert /
 * find / remove / grow, a key per map, and a flood of ids that all share one bucket under the old
 * unkeyed FNV-1a hash, which must spread over the buckets now.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/siphash.h"
#include "connector/strmap.h"

/* SipHash paper, appendix A: key 00 01 .. 0f, message 00 01 .. 0e (15 bytes). */
static void test_siphash_paper_vector(void **state)
{
    (void)state;
    uint8_t key[16], msg[15];
    for (int i = 0; i < 16; i++)
        key[i] = (uint8_t)i;
    for (int i = 0; i < 15; i++)
        msg[i] = (uint8_t)i;
    assert_int_equal(pdl__siphash24(key, msg, sizeof(msg)), 0xa129ca6149be45e5ull);
    /* The length is part of the hash: a trailing zero byte changes it, and so does the key. */
    uint8_t msg16[16] = {0};
    memcpy(msg16, msg, 15);
    assert_int_not_equal(pdl__siphash24(key, msg16, 16), 0xa129ca6149be45e5ull);
    key[0] ^= 1;
    assert_int_not_equal(pdl__siphash24(key, msg, sizeof(msg)), 0xa129ca6149be45e5ull);
}

static void test_insert_find_remove_grow(void **state)
{
    (void)state;
    pdl_strmap_t m = {0};
    assert_null(pdl__strmap_get(&m, "absent")); /* a zeroed map is empty */
    assert_null(pdl__strmap_remove(&m, "absent"));
    enum { N = 10000 };
    static int vals[N];
    char k[32];
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof(k), "xfer-%d", i);
        assert_int_equal(pdl__strmap_put(&m, k, &vals[i]), 0);
    }
    assert_int_equal(m.count, N);
    assert_true(m.nbuckets >= N / 2); /* grew: load stays at most 2 */
    assert_int_equal(m.nbuckets & (m.nbuckets - 1), 0);
    snprintf(k, sizeof(k), "xfer-%d", 17);
    assert_int_equal(pdl__strmap_put(&m, k, &vals[0]), 1); /* present: unchanged */
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof(k), "xfer-%d", i);
        assert_ptr_equal(pdl__strmap_get(&m, k), &vals[i]);
    }
    assert_null(pdl__strmap_get(&m, "xfer-"));
    assert_null(pdl__strmap_get(&m, ""));
    for (int i = 0; i < N; i += 2) {
        snprintf(k, sizeof(k), "xfer-%d", i);
        assert_ptr_equal(pdl__strmap_remove(&m, k), &vals[i]);
        assert_null(pdl__strmap_remove(&m, k));
    }
    assert_int_equal(m.count, N / 2);
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof(k), "xfer-%d", i);
        if (i % 2)
            assert_ptr_equal(pdl__strmap_get(&m, k), &vals[i]);
        else
            assert_null(pdl__strmap_get(&m, k));
    }
    /* The empty string is a key like any other. */
    assert_int_equal(pdl__strmap_put(&m, "", &vals[1]), 0);
    assert_ptr_equal(pdl__strmap_get(&m, ""), &vals[1]);
    pdl__strmap_free(&m);
    assert_int_equal(m.count, 0);
    assert_null(pdl__strmap_get(&m, "xfer-1"));
    assert_int_equal(pdl__strmap_put(&m, "again", &vals[2]), 0); /* usable after free */
    assert_ptr_equal(pdl__strmap_get(&m, "again"), &vals[2]);
    pdl__strmap_free(&m);
}

static void count_entry(void *arg, const char *key, void *value)
{
    (void)key;
    (void)value;
    (*(size_t *)arg)++;
}

/* Two maps draw their own keys (equal by chance with probability 2^-128). */
static void test_key_per_map(void **state)
{
    (void)state;
    pdl_strmap_t a = {0}, b = {0};
    int v;
    assert_int_equal(pdl__strmap_put(&a, "x", &v), 0);
    assert_int_equal(pdl__strmap_put(&b, "x", &v), 0);
    assert_memory_not_equal(a.key, b.key, sizeof(a.key));
    size_t n = 0;
    pdl__strmap_foreach(&a, count_entry, &n);
    assert_int_equal(n, 1);
    pdl__strmap_free(&a);
    pdl__strmap_free(&b);
}

/* The hash strmap.c used before: 64-bit FNV-1a. */
static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

/*
 * Make 2^STEPS ids whose FNV-1a hashes agree in their low 16 bits, i.e. that fall into one bucket of
 * any power-of-two table up to 65536 buckets. Bit i of an FNV-1a state depends only on bits 0..i of
 * the previous state and the input byte (XOR touches the low byte; a product mod 2^16 depends only on
 * the factors mod 2^16). So the low 16 bits evolve on their own, and two 3-character blocks that take
 * one low-16-bit state to the same next state are interchangeable. Among 62^3 blocks there are many
 * such pairs (2-character blocks are too few: the second character only reaches the low 7 bits before
 * the last multiply); choose one pair per step and every combination of choices collides.
 */
#define FLOOD_STEPS 12
#define FLOOD_IDS (1u << FLOOD_STEPS)
#define FLOOD_BLOCK 3
#define FLOOD_LEN (5 + FLOOD_BLOCK * FLOOD_STEPS + 1)

static void flood_ids(char (*ids)[FLOOD_LEN])
{
    static const char alnum[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    const uint64_t prime = 1099511628211ull;
    char pair[FLOOD_STEPS][2][FLOOD_BLOCK];
    uint64_t st = fnv1a("xfer-"); /* only the low 16 bits matter below */
    int *seen = malloc(65536 * sizeof(*seen));
    assert_non_null(seen);
    for (int step = 0; step < FLOOD_STEPS; step++) {
        for (int i = 0; i < 65536; i++)
            seen[i] = -1;
        bool found = false;
        for (int b = 0; b < 62 * 62 * 62 && !found; b++) {
            const char blk[FLOOD_BLOCK] = {alnum[b / (62 * 62)], alnum[b / 62 % 62], alnum[b % 62]};
            uint64_t h = st;
            for (int c = 0; c < FLOOD_BLOCK; c++)
                h = (h ^ (unsigned char)blk[c]) * prime;
            int low = (int)(h & 0xffff);
            if (seen[low] >= 0) {
                int a = seen[low];
                const char ablk[FLOOD_BLOCK] = {alnum[a / (62 * 62)], alnum[a / 62 % 62], alnum[a % 62]};
                memcpy(pair[step][0], ablk, FLOOD_BLOCK);
                memcpy(pair[step][1], blk, FLOOD_BLOCK);
                st = h;
                found = true;
            }
            seen[low] = b;
        }
        assert_true(found);
    }
    free(seen);
    for (unsigned id = 0; id < FLOOD_IDS; id++) {
        memcpy(ids[id], "xfer-", 5);
        for (int step = 0; step < FLOOD_STEPS; step++)
            memcpy(&ids[id][5 + FLOOD_BLOCK * step], pair[step][(id >> step) & 1], FLOOD_BLOCK);
        ids[id][FLOOD_LEN - 1] = '\0';
    }
}

static void test_fnv_collision_flood(void **state)
{
    (void)state;
    char(*ids)[FLOOD_LEN] = malloc(FLOOD_IDS * sizeof(*ids));
    assert_non_null(ids);
    flood_ids(ids);
    /* The generator is right: distinct ids, one low-16-bit FNV-1a value, so under the old hash the
     * whole flood was one chain of FLOOD_IDS entries. */
    uint64_t low = fnv1a(ids[0]) & 0xffff;
    for (unsigned i = 0; i < FLOOD_IDS; i++) {
        assert_int_equal(fnv1a(ids[i]) & 0xffff, low);
        if (i > 0)
            assert_string_not_equal(ids[i], ids[i - 1]);
    }

    pdl_strmap_t m = {0};
    for (unsigned i = 0; i < FLOOD_IDS; i++)
        assert_int_equal(pdl__strmap_put(&m, ids[i], &ids[i]), 0);
    assert_int_equal(m.count, FLOOD_IDS);
    size_t longest = 0, used = 0;
    for (size_t b = 0; b < m.nbuckets; b++) {
        size_t len = 0;
        for (pdl_strmap_entry_t *e = m.buckets[b]; e != NULL; e = e->next)
            len++;
        longest = len > longest ? len : longest;
        used += len > 0;
    }
    print_message("%u FNV-colliding ids in %zu buckets: longest chain %zu, %zu buckets used\n", FLOOD_IDS,
                  m.nbuckets, longest, used);
    /*
     * A random hash at load 2 leaves a bucket empty with probability e^-2 (so ~86% are used) and makes
     * a chain of 17 or more with probability ~1e-7 over the whole table: these bounds fail only if the
     * ids still collide.
     */
    assert_true(longest <= 16);
    assert_true(used * 2 >= m.nbuckets);
    for (unsigned i = 0; i < FLOOD_IDS; i++)
        assert_ptr_equal(pdl__strmap_get(&m, ids[i]), &ids[i]);
    pdl__strmap_free(&m);
    free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_siphash_paper_vector),
        cmocka_unit_test(test_insert_find_remove_grow),
        cmocka_unit_test(test_key_per_map),
        cmocka_unit_test(test_fnv_collision_flood),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
