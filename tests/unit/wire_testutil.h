/*
 * wire_testutil.h -- shared by the test_wire_*.c programs: hex golden vectors, a tiny description of a
 * msgpack map that can be encoded with one value swapped for a wrong type, and the generic checks
 * (every prefix fails, every wrong type fails naming the key, trailing bytes fail).
 * Header-only (static functions) so it is not linked into other engineers' tests.
 */
#ifndef PDL_WIRE_TESTUTIL_H
#define PDL_WIRE_TESTUTIL_H

#include <msgpack.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "pdlink/wire.h"

static inline size_t unhex(const char *hex, uint8_t *out, size_t cap)
{
    size_t n = strlen(hex) / 2;
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (uint8_t)v;
    }
    return n;
}

static inline void assert_bytes_hex(const pdl_bytes_t *b, const char *hex)
{
    char *got = malloc(2 * b->len + 1);
    assert_non_null(got);
    for (size_t i = 0; i < b->len; i++)
        snprintf(got + 2 * i, 3, "%02x", b->data[i]);
    got[2 * b->len] = '\0';
    assert_string_equal(got, hex);
    free(got);
}

/* Value kinds a test map can hold. */
typedef enum vkind {
    V_STR, V_BIN, V_INT, V_NEG, V_FLOAT, V_NIL, V_BOOL, V_ARRAY_INTS, V_MAP, V_BIGU, V_BADUTF8, V_ARRAY_BINS,
    V_KIND_COUNT
} vkind_t;

typedef struct tfield {
    const char *key;
    vkind_t kind;
    const char *s;        /* V_STR, V_BIN (s, strlen) */
    int64_t i;            /* V_INT, V_NEG, V_BOOL */
    const uint64_t *arr;  /* V_ARRAY_INTS */
    size_t n;
} tfield_t;

static inline void pack_value(msgpack_packer *pk, const tfield_t *f)
{
    const char *s = f->s ? f->s : "\x01wrong"; /* a swapped-in str/bin that no field accepts as a value */
    switch (f->kind) {
    case V_STR: msgpack_pack_str(pk, strlen(s)); msgpack_pack_str_body(pk, s, strlen(s)); break;
    case V_BIN: msgpack_pack_bin(pk, strlen(s)); msgpack_pack_bin_body(pk, s, strlen(s)); break;
    case V_INT: msgpack_pack_int64(pk, f->i); break;
    case V_NEG: msgpack_pack_int64(pk, -5); break;
    case V_FLOAT: msgpack_pack_double(pk, 1.5); break;
    case V_NIL: msgpack_pack_nil(pk); break;
    case V_BOOL: if (f->i) msgpack_pack_true(pk); else msgpack_pack_false(pk); break;
    case V_ARRAY_INTS:
        msgpack_pack_array(pk, f->n);
        for (size_t k = 0; k < f->n; k++)
            msgpack_pack_uint64(pk, f->arr[k]);
        break;
    case V_MAP: msgpack_pack_map(pk, 1); msgpack_pack_str(pk, 1); msgpack_pack_str_body(pk, "x", 1);
        msgpack_pack_int64(pk, 1); break;
    case V_BIGU: msgpack_pack_uint64(pk, UINT64_MAX); break;
    case V_BADUTF8: msgpack_pack_str(pk, 2); msgpack_pack_str_body(pk, "\xff\xfe", 2); break;
    case V_ARRAY_BINS: msgpack_pack_array(pk, 1); msgpack_pack_bin(pk, 1); msgpack_pack_bin_body(pk, "z", 1); break;
    case V_KIND_COUNT: break;
    }
}

/* Encode fields as a map; field `swap` (if >= 0) is packed as kind `as` instead. */
static inline void pack_fields(const tfield_t *f, size_t n, int swap, vkind_t as, msgpack_sbuffer *sb)
{
    msgpack_sbuffer_init(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, n);
    for (size_t k = 0; k < n; k++) {
        msgpack_pack_str(&pk, strlen(f[k].key));
        msgpack_pack_str_body(&pk, f[k].key, strlen(f[k].key));
        tfield_t v = f[k];
        if ((int)k == swap)
            v.kind = as;
        pack_value(&pk, &v);
    }
}

/* A decoder under test: returns its status, frees whatever it decoded. */
typedef pdl_status_t (*try_decode_fn)(const void *buf, size_t len, pdl_error_t *err);

static inline bool kind_wrong_for(vkind_t expected, vkind_t as)
{
    if (as == expected)
        return false;
    if (expected == V_STR && as == V_BIN) /* bin holding UTF-8 is accepted for text */
        return false;
    if (expected == V_INT && as == V_NEG)
        return true;
    return true;
}

/* For every field and every other kind: the decoder fails with PDL_ERR_PARSE and names the key. */
static inline int check_wrong_types(const tfield_t *f, size_t n, try_decode_fn dec, const char *const *skip_keys)
{
    int checked = 0;
    for (size_t k = 0; k < n; k++) {
        bool skip = false;
        for (size_t s = 0; skip_keys && skip_keys[s]; s++)
            skip = skip || strcmp(skip_keys[s], f[k].key) == 0;
        if (skip)
            continue;
        for (int as = 0; as < V_KIND_COUNT; as++) {
            if (!kind_wrong_for(f[k].kind, (vkind_t)as))
                continue;
            msgpack_sbuffer sb;
            pack_fields(f, n, (int)k, (vkind_t)as, &sb);
            pdl_error_t err = {0};
            pdl_status_t st = dec(sb.data, sb.size, &err);
            if (st != PDL_ERR_PARSE || strstr(err.msg, f[k].key) == NULL) {
                print_error("key %s as kind %d: status %d, message \"%s\"\n", f[k].key, as, st, err.msg);
                fail();
            }
            msgpack_sbuffer_destroy(&sb);
            checked++;
        }
    }
    return checked;
}

/* Every strict prefix of a valid frame fails; so does the frame plus one trailing byte. */
static inline void check_prefixes_and_trailing(const uint8_t *buf, size_t len, try_decode_fn dec)
{
    for (size_t k = 0; k < len; k++) {
        pdl_error_t err = {0};
        if (dec(buf, k, &err) == PDL_OK) {
            print_error("prefix of %zu/%zu bytes decoded\n", k, len);
            fail();
        }
    }
    uint8_t *more = malloc(len + 1);
    assert_non_null(more);
    memcpy(more, buf, len);
    more[len] = 0xc0;
    pdl_error_t err = {0};
    assert_int_equal(dec(more, len + 1, &err), PDL_ERR_PARSE);
    free(more);
}

/* Without each required key in turn, the decoder fails naming it. */
static inline void check_missing(const tfield_t *f, size_t n, const char *const *required, try_decode_fn dec)
{
    for (size_t r = 0; required[r]; r++) {
        tfield_t *g = malloc(n * sizeof(*g));
        size_t m = 0;
        for (size_t k = 0; k < n; k++)
            if (strcmp(f[k].key, required[r]) != 0)
                g[m++] = f[k];
        msgpack_sbuffer sb;
        pack_fields(g, m, -1, V_NIL, &sb);
        pdl_error_t err = {0};
        pdl_status_t st = dec(sb.data, sb.size, &err);
        if (st != PDL_ERR_PARSE || strstr(err.msg, required[r]) == NULL) {
            print_error("without %s: status %d, message \"%s\"\n", required[r], st, err.msg);
            fail();
        }
        msgpack_sbuffer_destroy(&sb);
        free(g);
    }
}

#endif /* PDL_WIRE_TESTUTIL_H */
