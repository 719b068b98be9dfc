/*
 * test_engine_desc.c -- engine and memory descriptors: round trips, version mismatch, hostile bytes,
 * backend mismatch, and the argument checks of the public API.
 */
#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <msgpack.h>

#include "engine/backend.h"
#include "engine/liveness.h"
#include "pdlink/engine.h"
#include "common/log.h"

static pdl_engine_t *mk(const char *key, pdl_backend_kind_t b)
{
    pdl_engine_config_t cfg = {key, "127.0.0.1", 0, b, 1, 1, NULL, false, NULL, NULL};
    pdl_engine_t *e = NULL;
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&cfg, &e, &err), PDL_OK);
    return e;
}

static void test_engine_roundtrip(void **state)
{
    (void)state;
    pdl_engine_t *e = mk("producer:tp1", PDL_BACKEND_TCP);
    assert_true(pdl_engine_port(e) > 0);
    pdl_bytes_t b = {0};
    assert_int_equal(pdl_engine_pack(e, &b, NULL), PDL_OK);
    pdl_remote_t r;
    pdl_error_t err;
    assert_int_equal(pdl__engine_desc_unpack(b.data, b.len, &r, &err), PDL_OK);
    assert_string_equal(r.key, "producer:tp1");
    assert_string_equal(r.host, "127.0.0.1");
    assert_int_equal(r.port, pdl_engine_port(e));
    assert_int_equal(r.backend, PDL_BACKEND_TCP);
    assert_int_equal(r.pid, getpid());
    assert_true(r.pid_start != 0); /* what peers' liveness checks prove the pid with */
    assert_true(r.pid_start == pdl__proc_start_time(getpid()));
    /* Every truncation of a valid descriptor is refused, never crashes. */
    for (size_t n = 0; n < b.len; n++)
        assert_int_not_equal(pdl__engine_desc_unpack(b.data, n, &r, &err), PDL_OK);
    pdl_bytes_free(&b);
    pdl_engine_destroy(e);
}

static void test_mem_roundtrip(void **state)
{
    (void)state;
    pdl_engine_t *e = mk("producer:tp1", PDL_BACKEND_SHM);
    pdl_mem_t *m = NULL;
    pdl_error_t err;
    assert_int_equal(pdl_engine_alloc_mem(e, 65536, &m, &err), PDL_OK);
    assert_int_equal(pdl_mem_size(m), 65536);
    const uint8_t *p = pdl_mem_ptr(m);
    for (size_t i = 0; i < 65536; i++)
        assert_int_equal(p[i], 0); /* zeroed */
    pdl_bytes_t b = {0};
    assert_int_equal(pdl_mem_pack(m, &b, &err), PDL_OK);
    pdl_rmem_t rm;
    assert_int_equal(pdl__mem_desc_unpack(b.data, b.len, &rm, &err), PDL_OK);
    assert_string_equal(rm.engine_key, "producer:tp1");
    assert_int_equal(rm.id, pdl_mem_id(m));
    assert_int_equal(rm.size, 65536);
    assert_int_equal(rm.kind, PDL_MEM_MEMFD);
    assert_int_equal(rm.addr, (uint64_t)(uintptr_t)pdl_mem_ptr(m));
    assert_true(rm.fd >= 0);
    assert_int_equal(rm.pid, getpid());
    pdl_bytes_free(&b);

    static uint8_t user[8192];
    pdl_mem_t *u = NULL;
    assert_int_equal(pdl_engine_register_mem(e, user, sizeof(user), &u, &err), PDL_OK);
    assert_int_not_equal(pdl_mem_id(u), pdl_mem_id(m));
    assert_int_equal(pdl_mem_pack(u, &b, &err), PDL_OK);
    assert_int_equal(pdl__mem_desc_unpack(b.data, b.len, &rm, &err), PDL_OK);
    assert_int_equal(rm.kind, PDL_MEM_USER);
    assert_int_equal(rm.fd, -1);
    pdl_bytes_free(&b);
    pdl_engine_deregister_mem(e, u);
    pdl_engine_deregister_mem(e, m);
    pdl_engine_destroy(e);
}

/* ucx: the worker address, the live table's address and rkey, and each region's rkey travel in the
 * descriptors and come back byte for byte; device memory is refused where UCX has no support for it. */
static void test_ucx_descriptors(void **state)
{
    (void)state;
    pdl_engine_t *e = mk("producer:tp2", PDL_BACKEND_UCX);
    pdl_bytes_t b = {0};
    pdl_error_t err;
    assert_int_equal(pdl_engine_pack(e, &b, &err), PDL_OK);
    pdl_remote_t *r = malloc(sizeof(*r));
    assert_int_equal(pdl__engine_desc_unpack(b.data, b.len, r, &err), PDL_OK);
    assert_int_equal(r->backend, PDL_BACKEND_UCX);
    assert_true(r->ucx_addr_len > 0 && r->ctl_rkey_len > 0 && r->ctl_addr != 0);
    assert_int_equal(pdl_engine_port(e), 0);
    for (size_t n = 0; n < b.len; n++)
        assert_int_not_equal(pdl__engine_desc_unpack(b.data, n, r, &err), PDL_OK);
    pdl_bytes_free(&b);
    free(r);

    pdl_mem_t *m = NULL;
    assert_int_equal(pdl_engine_alloc_mem(e, 65536, &m, &err), PDL_OK);
    const uint8_t *p = pdl_mem_ptr(m);
    for (size_t i = 0; i < 65536; i++)
        assert_int_equal(p[i], 0);
    assert_int_equal(pdl_mem_pack(m, &b, &err), PDL_OK);
    pdl_rmem_t *rm = malloc(sizeof(*rm));
    assert_int_equal(pdl__mem_desc_unpack(b.data, b.len, rm, &err), PDL_OK);
    assert_true(rm->rkey_len > 0);
    assert_int_equal(rm->addr, (uint64_t)(uintptr_t)pdl_mem_ptr(m));
    assert_true(rm->slot >= 0);
    pdl_bytes_free(&b);
    free(rm);

    /* Host memory is always registrable; device memory only where UCX reports it (not on this VM). */
    unsigned types = pdl_engine_mem_types(e);
    assert_true(types & (1u << PDL_MEM_TYPE_HOST));
    static uint8_t buf[4096];
    pdl_mem_t *g = NULL;
    pdl_status_t st = pdl_engine_register_mem_type(e, buf, sizeof(buf), PDL_MEM_TYPE_CUDA, &g, &err);
    if (!(types & (1u << PDL_MEM_TYPE_CUDA)))
        assert_int_equal(st, PDL_ERR_UNSUPPORTED);
    else if (st == PDL_OK) /* a CUDA build of UCX: what it does with a host pointer is not this test's */
        pdl_engine_deregister_mem(e, g);
    assert_int_equal(pdl_engine_register_mem_type(e, buf, sizeof(buf), (pdl_mem_type_t)9, &g, &err), PDL_ERR_INVALID);
    pdl_engine_deregister_mem(e, m);
    pdl_engine_destroy(e);

    /* tcp registers host memory, and CUDA memory only where the CUDA driver loads; never ROCm memory. */
    pdl_engine_t *t = mk("producer:tp3", PDL_BACKEND_TCP);
    assert_int_equal(pdl_engine_mem_types(t) & ~(1u << PDL_MEM_TYPE_CUDA), 1u << PDL_MEM_TYPE_HOST);
    assert_int_equal(pdl_engine_register_mem_type(t, buf, sizeof(buf), PDL_MEM_TYPE_ROCM, &g, &err),
                     PDL_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "only the ucx and cuda backends"));
    pdl_engine_destroy(t);
}

/* "rdma" on this machine (no RDMA device): tcp, with a reason that says why. */
static void test_rdma_pick(void **state)
{
    (void)state;
    char why[256];
    pdl_backend_kind_t k = pdl_backend_pick_rdma(why, sizeof(why));
    if (k == PDL_BACKEND_UCX)
        assert_non_null(strstr(why, "RDMA transports ("));
    else
        assert_non_null(strstr(why, "no RDMA transport"));
    assert_int_equal(pdl_backend_pick_rdma(NULL, 0), k);
}

/* A descriptor from a newer pdlink: same shape, "v" = 2. */
static void pack_engine_v(msgpack_sbuffer *sb, uint64_t v, const char *backend)
{
    msgpack_packer pk;
    msgpack_sbuffer_init(sb);
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    const char *keys[] = {"magic", "key", "backend", "host", "hostname"};
    const char *vals[] = {"pdlink-engine", "producer:tp9", backend, "127.0.0.1", "h"};
    msgpack_pack_map(&pk, 8);
    for (int i = 0; i < 5; i++) {
        msgpack_pack_str_with_body(&pk, keys[i], strlen(keys[i]));
        msgpack_pack_str_with_body(&pk, vals[i], strlen(vals[i]));
    }
    msgpack_pack_str_with_body(&pk, "v", 1);
    msgpack_pack_uint64(&pk, v);
    msgpack_pack_str_with_body(&pk, "port", 4);
    msgpack_pack_uint64(&pk, 4242);
    msgpack_pack_str_with_body(&pk, "pid", 3);
    msgpack_pack_uint64(&pk, 1);
}

static void test_version_mismatch(void **state)
{
    (void)state;
    pdl_engine_t *e = mk("consumer:tp0", PDL_BACKEND_TCP);
    msgpack_sbuffer sb;
    pack_engine_v(&sb, 2, "tcp");
    pdl_error_t err;
    assert_int_equal(pdl_engine_add_remote(e, sb.data, sb.size, NULL, 0, &err), PDL_ERR_MISMATCH);
    assert_non_null(strstr(err.msg, "version 2"));
    assert_non_null(strstr(err.msg, "consumer:tp0"));
    msgpack_sbuffer_destroy(&sb);
    /* The same descriptor with v = 1 is accepted, without "pid_start" (engines that predate it). */
    pack_engine_v(&sb, PDL_ENGINE_DESC_VERSION, "tcp");
    pdl_remote_t r;
    assert_int_equal(pdl__engine_desc_unpack(sb.data, sb.size, &r, &err), PDL_OK);
    assert_true(r.pid_start == 0);
    char key[64];
    assert_int_equal(pdl_engine_add_remote(e, sb.data, sb.size, key, sizeof(key), &err), PDL_OK);
    assert_string_equal(key, "producer:tp9");
    assert_int_equal(pdl_engine_remove_remote(e, "producer:tp9", &err), PDL_OK);
    assert_int_equal(pdl_engine_remove_remote(e, "producer:tp9", &err), PDL_ERR_NOT_FOUND);
    msgpack_sbuffer_destroy(&sb);
    /* A shm engine descriptor offered to a tcp engine. */
    pack_engine_v(&sb, PDL_ENGINE_DESC_VERSION, "shm");
    assert_int_equal(pdl_engine_add_remote(e, sb.data, sb.size, NULL, 0, &err), PDL_ERR_MISMATCH);
    assert_non_null(strstr(err.msg, "backend"));
    msgpack_sbuffer_destroy(&sb);
    pdl_engine_destroy(e);
}

static void test_hostile_descriptors(void **state)
{
    (void)state;
    pdl_engine_t *e = mk("consumer:tp0", PDL_BACKEND_TCP);
    pdl_error_t err;
    const uint8_t junk[] = {0xc1, 0xff, 0x00};
    assert_int_equal(pdl_engine_add_remote(e, junk, sizeof(junk), NULL, 0, &err), PDL_ERR_PARSE);
    const uint8_t arr[] = {0x91, 0x01}; /* [1] */
    assert_int_equal(pdl_engine_add_remote(e, arr, sizeof(arr), NULL, 0, &err), PDL_ERR_PARSE);
    assert_int_equal(pdl_engine_add_remote(e, NULL, 0, NULL, 0, &err), PDL_ERR_INVALID);
    /* wrong types: key as an integer */
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str_with_body(&pk, "magic", 5);
    msgpack_pack_str_with_body(&pk, "pdlink-engine", 13);
    msgpack_pack_str_with_body(&pk, "v", 1);
    msgpack_pack_uint64(&pk, 1);
    msgpack_pack_str_with_body(&pk, "key", 3);
    msgpack_pack_uint64(&pk, 7);
    assert_int_equal(pdl_engine_add_remote(e, sb.data, sb.size, NULL, 0, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "key"));
    msgpack_sbuffer_destroy(&sb);
    /* a memory descriptor handed to add_remote (wrong magic) */
    pdl_mem_t *m = NULL;
    assert_int_equal(pdl_engine_alloc_mem(e, 4096, &m, &err), PDL_OK);
    pdl_bytes_t b;
    assert_int_equal(pdl_mem_pack(m, &b, &err), PDL_OK);
    assert_int_equal(pdl_engine_add_remote(e, b.data, b.len, NULL, 0, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "magic"));
    /* a session to an engine never added */
    pdl_session_t *s = NULL;
    assert_int_equal(pdl_session_open(e, m, b.data, b.len, &s, &err), PDL_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "consumer:tp0"));
    pdl_bytes_free(&b);
    pdl_engine_deregister_mem(e, m);
    pdl_engine_destroy(e);
}

/*
 * Largest single allocation seen while `watch_allocs` is set. Sanitizer builds (ASan, TSan) let a test
 * install malloc hooks; the hook has no context argument, hence the two statics. Plain builds lack the
 * hook and rely on the error text, which only the guarded door produces.
 */
extern int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                                     void (*free_hook)(const volatile void *)) __attribute__((weak));
static _Atomic size_t largest_alloc;
static _Atomic int watch_allocs;

static void alloc_hook(const volatile void *p, size_t n)
{
    (void)p;
    if (watch_allocs && n > largest_alloc)
        largest_alloc = n;
}

/* The sanitizers install hooks only in pairs. */
static void free_hook(const volatile void *p) { (void)p; }

/*
 * A few bytes announcing a huge map or array: msgpack-c would allocate the element table from the
 * header alone (`df ff ff ff ff` is a map of 2^32 - 1 pairs, 128 GiB of table). The descriptor decoders
 * must refuse them through the guarded door (too many elements for a descriptor, or more than the
 * bytes that follow could hold) before any table is allocated.
 */
static void test_hostile_headers(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        uint8_t b[24];
        size_t n;
        const char *why;
    } cases[] = {
        {"map32 of 2^32-1 pairs", {0xdf, 0xff, 0xff, 0xff, 0xff}, 5, "more than 1024 msgpack elements"},
        {"array32 of 2^32-1", {0xdd, 0xff, 0xff, 0xff, 0xff}, 5, "more than 1024 msgpack elements"},
        {"map16 of 65535 pairs", {0xde, 0xff, 0xff}, 3, "more than 1024 msgpack elements"},
        {"map32 of 2^20 pairs", {0xdf, 0x00, 0x10, 0x00, 0x00}, 5, "more than 1024 msgpack elements"},
        {"array16 of 512, no elements", {0xdc, 0x02, 0x00}, 3, "truncated"},
        /* {"x": array32 of 2^32-1}, {"magic": {"x": map32 of 2^32-1}} */
        {"nested array32", {0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff}, 8, "more than 1024 msgpack elements"},
        {"nested map32",
         {0x81, 0xa5, 'm', 'a', 'g', 'i', 'c', 0x81, 0xa1, 'x', 0xdf, 0xff, 0xff, 0xff, 0xff},
         15,
         "more than 1024 msgpack elements"},
        {"nested array16 of 512", {0x81, 0xa1, 'x', 0xdc, 0x02, 0x00, 0xc0}, 7, "truncated"},
        /* an array in an array in ... 40 deep: msgpack-c's parser stack holds 32 */
        {"deep", {0}, 0, NULL},
    };
    uint8_t deep[41];
    memset(deep, 0x91, 40);
    deep[40] = 0xc0;
    /* Allocated before watching: the decoders' allocations are what is measured. */
    size_t big = 5 + 60000;
    uint8_t *many = malloc(big);
    assert_non_null(many);
    memcpy(many, (const uint8_t[]){0xdd, 0x00, 0x00, 0xea, 0x60}, 5);
    memset(many + 5, 0xc0, 60000);

    bool hooked = __sanitizer_install_malloc_and_free_hooks != NULL &&
                  __sanitizer_install_malloc_and_free_hooks(alloc_hook, free_hook) != 0;
    largest_alloc = 0;
    watch_allocs = 1;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const uint8_t *b = cases[i].n > 0 ? cases[i].b : deep;
        size_t n = cases[i].n > 0 ? cases[i].n : sizeof(deep);
        pdl_remote_t r;
        pdl_rmem_t rm;
        pdl_error_t err = {0};
        assert_int_equal(pdl__engine_desc_unpack(b, n, &r, &err), PDL_ERR_PARSE);
        print_message("%s: %s\n", cases[i].name, err.msg);
        assert_non_null(strstr(err.msg, "engine descriptor"));
        if (cases[i].why != NULL)
            assert_non_null(strstr(err.msg, cases[i].why));
        else
            assert_non_null(strstr(err.msg, "nested deeper"));
        assert_int_equal(pdl__mem_desc_unpack(b, n, &rm, &err), PDL_ERR_PARSE);
        assert_non_null(strstr(err.msg, "memory descriptor"));
    }
    /* A real-looking descriptor map with an unknown key whose value is the hostile header. */
    uint8_t desc[64];
    size_t n = 0;
    const uint8_t head[] = {0x82, 0xa5, 'm', 'a', 'g', 'i', 'c', 0xad};
    memcpy(desc + n, head, sizeof(head)), n += sizeof(head);
    memcpy(desc + n, "pdlink-engine", 13), n += 13;
    const uint8_t tail[] = {0xa5, 'e', 'x', 't', 'r', 'a', 0xdd, 0xff, 0xff, 0xff, 0xff};
    memcpy(desc + n, tail, sizeof(tail)), n += sizeof(tail);
    pdl_remote_t r;
    pdl_error_t err = {0};
    assert_int_equal(pdl__engine_desc_unpack(desc, n, &r, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "more than 1024 msgpack elements"));
    /* Within the bytes but past the element limit: an array of 60000 nils. */
    assert_int_equal(pdl__engine_desc_unpack(many, big, &r, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "more than"));
    watch_allocs = 0;
    free(many);
    if (hooked) {
        print_message("largest allocation while decoding: %zu bytes\n", (size_t)largest_alloc);
        assert_true(largest_alloc < 64 * 1024); /* msgpack-c's zone chunks; no element table */
    }
    else
        print_message("no sanitizer malloc hook in this build: checked by error text only\n");
}

/* A map entry for hand-made descriptors: 's' str, 'b' bin (n bytes of s), 'u' uint, 'i' int; 'K' a str
 * value under a bin key. */
typedef struct kv {
    const char *k;
    char t;
    const char *s;
    int64_t i;
    size_t n;
} kv_t;

/* A valid tcp engine descriptor with `over` replacing the entries of the same keys (an entry with t == 0
 * drops that key) and `dup` (if not NULL) appended although its key is there already. */
static pdl_status_t unpack_kvs(const kv_t *over, size_t nover, const kv_t *dup, pdl_remote_t *r, pdl_error_t *err)
{
    const kv_t base[] = {
        {"magic", 's', "pdlink-engine", 0, 0}, {"v", 'u', NULL, 1, 0}, {"key", 's', "producer:tp3", 0, 0},
        {"backend", 's', "tcp", 0, 0}, {"host", 's', "127.0.0.1", 0, 0}, {"port", 'u', NULL, 4242, 0},
        {"pid", 'i', NULL, 77, 0}, {"hostname", 's', "h", 0, 0},
    };
    kv_t all[32];
    size_t n = 0;
    for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); i++) {
        const kv_t *e = &base[i];
        for (size_t j = 0; j < nover; j++)
            if (strcmp(over[j].k, base[i].k) == 0)
                e = &over[j];
        if (e->t != 0)
            all[n++] = *e;
    }
    for (size_t j = 0; j < nover; j++) {
        bool known = false;
        for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); i++)
            known = known || strcmp(over[j].k, base[i].k) == 0;
        if (!known)
            all[n++] = over[j];
    }
    if (dup != NULL)
        all[n++] = *dup;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, n);
    for (size_t i = 0; i < n; i++) {
        const kv_t *e = &all[i];
        if (e->t == 'K')
            msgpack_pack_bin_with_body(&pk, e->k, strlen(e->k));
        else
            msgpack_pack_str_with_body(&pk, e->k, strlen(e->k));
        if (e->t == 's' || e->t == 'K')
            msgpack_pack_str_with_body(&pk, e->s, strlen(e->s));
        else if (e->t == 'b')
            msgpack_pack_bin_with_body(&pk, e->s, e->n);
        else if (e->t == 'u')
            msgpack_pack_uint64(&pk, (uint64_t)e->i);
        else
            msgpack_pack_int64(&pk, e->i);
    }
    pdl_status_t st = pdl__engine_desc_unpack(sb.data, sb.size, r, err);
    msgpack_sbuffer_destroy(&sb);
    return st;
}

#define UNPACK(r, err, ...)                                                                                    \
    unpack_kvs((const kv_t[]){__VA_ARGS__}, sizeof((const kv_t[]){__VA_ARGS__}) / sizeof(kv_t), NULL, r, err)

/*
 * The descriptor parser reads with wire/mp.h's typed reads, as the wire codecs do. Where that differs from
 * the parser desc.c had before, the case says what the old one did; every other case is unchanged.
 */
static void test_parser_rules(void **state)
{
    (void)state;
    pdl_remote_t *r = malloc(sizeof(*r));
    assert_non_null(r);
    pdl_error_t err;
    assert_int_equal(UNPACK(r, &err, {"pid_start", 'u', NULL, 5, 0}), PDL_OK);
    assert_string_equal(r->key, "producer:tp3");
    assert_int_equal(r->port, 4242);
    assert_int_equal(r->pid, 77);

    /* Changed: a key given twice is refused (the old parser took the last value). */
    kv_t dup = {"port", 'u', NULL, 4243, 0};
    assert_int_equal(unpack_kvs(NULL, 0, &dup, r, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "duplicate key 'port'"));
    dup = (kv_t){"magic", 's', "pdlink-engine", 0, 0};
    assert_int_equal(unpack_kvs(NULL, 0, &dup, r, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "duplicate key 'magic'"));
    /* Changed: a string as msgpack bin holding UTF-8 is read as the string (refused before). */
    assert_int_equal(UNPACK(r, &err, {"host", 'b', "10.0.0.7", 0, 8}), PDL_OK);
    assert_string_equal(r->host, "10.0.0.7");
    /* Changed: a key as UTF-8 bin names its field (such keys were skipped, so here the magic was missing). */
    assert_int_equal(UNPACK(r, &err, {"magic", 'K', "pdlink-engine", 0, 0}), PDL_OK);
    /* Changed: strings must be UTF-8 (the old parser copied any bytes but NUL). */
    assert_int_equal(UNPACK(r, &err, {"hostname", 's', "h\xff", 0, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "hostname is not valid UTF-8"));
    /* Changed: another version is PDL_ERR_MISMATCH even when a field is mistyped for this one (the old
     * parser read fields first and said PDL_ERR_PARSE). */
    assert_int_equal(UNPACK(r, &err, {"v", 'u', NULL, 2, 0}, {"port", 's', "http", 0, 0}), PDL_ERR_MISMATCH);
    assert_non_null(strstr(err.msg, "version 2"));
    /* Changed message, same status: a "v" that is no non-negative integer is named as such. */
    assert_int_equal(UNPACK(r, &err, {"v", 's', "1", 0, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "version field 'v' is a string"));

    /* Unchanged: a field of the wrong type, out of range, too long, empty where it may not be, or with a
     * NUL; a missing field; an empty blob; integer keys and unknown keys are skipped. */
    assert_int_equal(UNPACK(r, &err, {"port", 's', "4242", 0, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "engine descriptor: port is a string"));
    assert_int_equal(UNPACK(r, &err, {"port", 'i', NULL, -1, 0}), PDL_ERR_PARSE);
    assert_int_equal(UNPACK(r, &err, {"port", 'u', NULL, 65536, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "port 65536 out of range"));
    assert_int_equal(UNPACK(r, &err, {"pid", 'i', NULL, -5, 0}), PDL_OK);
    assert_int_equal(r->pid, -5);
    assert_int_equal(UNPACK(r, &err, {"pid", 'u', NULL, -1, 0}), PDL_ERR_PARSE); /* 2^64 - 1 */
    assert_int_equal(UNPACK(r, &err, {"key", 's', "", 0, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "key is empty"));
    assert_int_equal(UNPACK(r, &err, {"host", 's', "", 0, 0}), PDL_OK); /* tcp's remote_add refuses it */
    assert_int_equal(UNPACK(r, &err, {"host", 'b', "a\0b", 0, 3}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "host contains a NUL byte"));
    char longkey[300];
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';
    assert_int_equal(UNPACK(r, &err, {"key", 's', longkey, 0, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "the limit is 255"));
    assert_int_equal(UNPACK(r, &err, {"hostname", 0, NULL, 0, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "missing field 'hostname'"));
    assert_int_equal(UNPACK(r, &err, {"magic", 0, NULL, 0, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "missing or wrong magic"));
    assert_int_equal(UNPACK(r, &err, {"magic", 's', "pdlink-mem", 0, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "missing or wrong magic"));
    assert_int_equal(UNPACK(r, &err, {"v", 0, NULL, 0, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "missing version field 'v'"));
    assert_int_equal(UNPACK(r, &err, {"ucx_addr", 'b', "", 0, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "ucx_addr is empty binary"));
    assert_int_equal(UNPACK(r, &err, {"ctl_rkey", 's', "x", 0, 0}), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "ctl_rkey is a string, expected binary"));
    assert_int_equal(UNPACK(r, &err, {"future_field", 'u', NULL, 9, 0}), PDL_OK);
    free(r);

    /* An integer key is skipped, as before: the map below is the base map plus {7: "x"}. */
    msgpack_sbuffer sb;
    pack_engine_v(&sb, PDL_ENGINE_DESC_VERSION, "tcp");
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pdl_remote_t r2;
    assert_int_equal(pdl__engine_desc_unpack(sb.data, sb.size, &r2, &err), PDL_OK);
    sb.data[0] = (char)(0x80 | 9); /* 9 pairs: one more than pack_engine_v wrote */
    msgpack_pack_uint64(&pk, 7);
    msgpack_pack_str_with_body(&pk, "x", 1);
    assert_int_equal(pdl__engine_desc_unpack(sb.data, sb.size, &r2, &err), PDL_OK);
    assert_string_equal(r2.key, "producer:tp9");
    msgpack_sbuffer_destroy(&sb);
}

static void test_config_checks(void **state)
{
    (void)state;
    pdl_engine_t *e = NULL;
    pdl_error_t err;
    pdl_engine_config_t cfg = {"k", "127.0.0.1", 0, PDL_BACKEND_TCP, 0, 1, NULL, false, NULL, NULL};
    assert_int_equal(pdl_engine_create(&cfg, &e, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "qp_per_transfer"));
    cfg.qp_per_transfer = 1;
    cfg.num_workers = 0;
    assert_int_equal(pdl_engine_create(&cfg, &e, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "num_workers"));
    cfg.num_workers = 1;
    cfg.backend = (pdl_backend_kind_t)7;
    assert_int_equal(pdl_engine_create(&cfg, &e, &err), PDL_ERR_INVALID);
    cfg.backend = PDL_BACKEND_SHM;
    cfg.key = "";
    assert_int_equal(pdl_engine_create(&cfg, &e, &err), PDL_ERR_INVALID);
    assert_null(e);
    assert_int_equal(pdl_backend_parse("shm"), PDL_BACKEND_SHM);
    assert_int_equal(pdl_backend_parse("tcp"), PDL_BACKEND_TCP);
    assert_int_equal(pdl_backend_parse("ucx"), PDL_BACKEND_UCX);
    assert_int_equal(pdl_backend_parse("rdma"), -1);
    assert_string_equal(pdl_backend_name(PDL_BACKEND_TCP), "tcp");
}

/* tcp_congestion: the engine's choice, "system", a name that cannot be set, a name too long. */
static void test_tcp_congestion(void **state)
{
    (void)state;
    pdl_engine_t *e = NULL;
    pdl_error_t err;
    pdl_engine_config_t cfg = {"cc", "127.0.0.1", 0, PDL_BACKEND_TCP, 1, 1, NULL, false, NULL, NULL};
    assert_int_equal(pdl_engine_create(&cfg, &e, &err), PDL_OK);
    const char *cc = pdl_engine_tcp_congestion(e);
    /* cubic where it can be set, else reno (always permitted), else the system default. */
    assert_true(strcmp(cc, "cubic") == 0 || strcmp(cc, "reno") == 0 || cc[0] == '\0');
    pdl_engine_destroy(e);
    cfg.tcp_congestion = "system";
    assert_int_equal(pdl_engine_create(&cfg, &e, &err), PDL_OK);
    assert_string_equal(pdl_engine_tcp_congestion(e), "");
    pdl_engine_destroy(e);
    cfg.tcp_congestion = "no-such-cc";
    assert_int_equal(pdl_engine_create(&cfg, &e, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "no-such-cc"));
    cfg.tcp_congestion = "a-congestion-control-name-far-too-long";
    assert_int_equal(pdl_engine_create(&cfg, &e, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "too long"));
    /* shm has no tcp sockets. */
    cfg.backend = PDL_BACKEND_SHM;
    cfg.tcp_congestion = "reno";
    assert_int_equal(pdl_engine_create(&cfg, &e, &err), PDL_OK);
    assert_string_equal(pdl_engine_tcp_congestion(e), "");
    pdl_engine_destroy(e);
}

int main(void)
{
    pdl_log_set_level(PDL_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_roundtrip),    cmocka_unit_test(test_mem_roundtrip),
        cmocka_unit_test(test_version_mismatch),    cmocka_unit_test(test_hostile_descriptors),
        cmocka_unit_test(test_config_checks),       cmocka_unit_test(test_tcp_congestion),
        cmocka_unit_test(test_hostile_headers),     cmocka_unit_test(test_ucx_descriptors),
        cmocka_unit_test(test_rdma_pick),           cmocka_unit_test(test_parser_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
