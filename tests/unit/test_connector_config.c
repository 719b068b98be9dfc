/*
 * test_connector_config.c -- kv_connector_extra_config parsing (docs/connector.md#configuration) and the instance block
 * allocator (src/connector/blockalloc.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "connector/blockalloc.h"
#include "pdlink/connector.h"

static void config_defaults_match_moriio(void **state)
{
    (void)state;
    pdl_connector_config_t c;
    assert_int_equal(pdl_connector_config_parse("{}", &c, NULL), PDL_OK);
    assert_int_equal(c.handshake_port, 6301);
    assert_int_equal(c.notify_port, 61005);
    assert_false(c.read_mode);
    assert_int_equal(c.qp_per_transfer, 1);
    assert_int_equal(c.num_workers, 1);
    assert_int_equal(c.post_batch_size, -1);
    assert_true(c.transfer_timeout_s == 30.0);
    assert_true(c.defer_timeout_s == 60.0);
    assert_true(c.handshake_timeout_s == 10.0);
    assert_string_equal(c.proxy_ip, "");
    assert_string_equal(c.host_ip, "127.0.0.1");
    assert_int_equal(c.backend, PDL_BACKEND_TCP); /* upstream default "rdma" → tcp */
    assert_int_equal(c.role, PDL_ROLE_CONSUMER);
}

static void config_seed_json(void **state)
{
    (void)state;
    const char *j = "{\"kv_connector\":\"MoRIIOConnector\",\"kv_role\":\"kv_producer\","
                    "\"kv_connector_extra_config\":{\"proxy_ip\":\"10.0.0.5\",\"proxy_ping_port\":\"36367\","
                    "\"http_port\":8100,\"handshake_port\":\"7301\",\"notify_port\":62005,\"read_mode\":\"true\","
                    "\"backend\":\"shm\",\"qp_per_transfer\":4,\"num_workers\":\"2\",\"post_batch_size\":64,"
                    "\"transfer_timeout\":5,\"defer_timeout\":\"2.5\",\"handshake_timeout\":1.5,"
                    "\"host_ip\":\"10.0.0.7\"}}";
    pdl_connector_config_t c;
    pdl_error_t e;
    assert_int_equal(pdl_connector_config_parse(j, &c, &e), PDL_OK);
    assert_int_equal(c.role, PDL_ROLE_PRODUCER);
    assert_string_equal(c.proxy_ip, "10.0.0.5");
    assert_string_equal(c.host_ip, "10.0.0.7");
    assert_int_equal(c.proxy_ping_port, 36367);
    assert_int_equal(c.http_port, 8100);
    assert_int_equal(c.handshake_port, 7301);
    assert_int_equal(c.notify_port, 62005);
    assert_true(c.read_mode);
    assert_int_equal(c.backend, PDL_BACKEND_SHM);
    assert_false(c.backend_mapped_from_rdma);
    assert_int_equal(c.qp_per_transfer, 4);
    assert_int_equal(c.num_workers, 2);
    assert_int_equal(c.post_batch_size, 64);
    assert_true(c.transfer_timeout_s == 5.0);
    assert_true(c.defer_timeout_s == 2.5);
    assert_true(c.handshake_timeout_s == 1.5);
}

static void config_read_mode_forms(void **state)
{
    (void)state;
    const char *yes[] = {"true", "\"true\"", "\"TRUE \"", "\"1\"", "1"};
    const char *no[] = {"false", "\"false\"", "\"0\"", "0"};
    char buf[160];
    pdl_connector_config_t c;
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        snprintf(buf, sizeof(buf), "{\"kv_connector_extra_config\":{\"read_mode\":%s}}", yes[i]);
        assert_int_equal(pdl_connector_config_parse(buf, &c, NULL), PDL_OK);
        assert_true(c.read_mode);
    }
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        snprintf(buf, sizeof(buf), "{\"kv_connector_extra_config\":{\"read_mode\":%s}}", no[i]);
        assert_int_equal(pdl_connector_config_parse(buf, &c, NULL), PDL_OK);
        assert_false(c.read_mode);
    }
}

static void config_backend_mapping(void **state)
{
    (void)state;
    pdl_connector_config_t c;
    assert_int_equal(pdl_connector_config_parse("{\"kv_connector_extra_config\":{\"backend\":\"rdma\"}}", &c, NULL), PDL_OK);
    assert_int_equal(c.backend, PDL_BACKEND_TCP);
    assert_true(c.backend_mapped_from_rdma);
    assert_int_equal(pdl_connector_config_parse("{\"kv_connector_extra_config\":{\"backend\":\"tcp\"}}", &c, NULL), PDL_OK);
    assert_int_equal(c.backend, PDL_BACKEND_TCP);
    assert_false(c.backend_mapped_from_rdma);
    assert_int_equal(pdl_connector_config_parse("{\"kv_connector_extra_config\":{\"backend\":\"xgmi\"}}", &c, NULL), PDL_OK);
    assert_int_equal(c.backend, PDL_BACKEND_SHM);
}

static void config_zero_ports_mean_default(void **state)
{
    (void)state;
    pdl_connector_config_t c;
    assert_int_equal(pdl_connector_config_parse("{\"kv_connector_extra_config\":{\"handshake_port\":0,\"notify_port\":\"\"}}",
                                                &c, NULL),
                     PDL_OK);
    assert_int_equal(c.handshake_port, 6301);
    assert_int_equal(c.notify_port, 61005);
}

/* Every wrong value fails with a message naming the key and the value. */
static void config_wrong_values_name_the_key(void **state)
{
    (void)state;
    struct {
        const char *kv;
        const char *key;
        const char *val;
    } cases[] = {
        {"\"read_mode\":\"yes please\"", "read_mode", "yes please"},
        {"\"backend\":\"ib\"", "backend", "ib"},
        {"\"backend\":3", "backend", "3"},
        {"\"handshake_port\":70000", "handshake_port", "70000"},
        {"\"notify_port\":\"abc\"", "notify_port", "abc"},
        {"\"proxy_ping_port\":-1", "proxy_ping_port", "-1"},
        {"\"qp_per_transfer\":0", "qp_per_transfer", "0"},
        {"\"num_workers\":1.5", "num_workers", "1.5"},
        {"\"post_batch_size\":0", "post_batch_size", "0"},
        {"\"transfer_timeout\":-2", "transfer_timeout", "-2"},
        {"\"defer_timeout\":\"soon\"", "defer_timeout", "soon"},
        {"\"handshake_timeout\":[1]", "handshake_timeout", "[1]"},
        {"\"host_ip\":5", "host_ip", "5"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char buf[200];
        snprintf(buf, sizeof(buf), "{\"kv_connector_extra_config\":{%s}}", cases[i].kv);
        pdl_connector_config_t c;
        pdl_error_t e;
        assert_int_equal(pdl_connector_config_parse(buf, &c, &e), PDL_ERR_INVALID);
        assert_non_null(strstr(e.msg, cases[i].key));
        assert_non_null(strstr(e.msg, cases[i].val));
    }
}

static void config_unknown_keys_not_fatal(void **state)
{
    (void)state;
    pdl_connector_config_t c;
    assert_int_equal(pdl_connector_config_parse("{\"kv_buffer_device\":\"cuda\",\"surprise\":1,"
                                                "\"kv_connector_extra_config\":{\"frobnicate\":true,\"read_mode\":1}}",
                                                &c, NULL),
                     PDL_OK);
    assert_true(c.read_mode);
    pdl_error_t e;
    assert_int_equal(pdl_connector_config_parse("{\"kv_role\":\"kv_observer\"}", &c, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "kv_observer"));
    assert_int_equal(pdl_connector_config_parse("{not json", &c, &e), PDL_ERR_PARSE);
    assert_int_equal(pdl_connector_config_parse("[1]", &c, &e), PDL_ERR_INVALID);
    pdl_connector_config_defaults(&c);
    c.role = PDL_ROLE_PRODUCER;
    assert_int_equal(pdl_connector_config_from_extra("{\"read_mode\": \"1\"}", &c, NULL), PDL_OK);
    assert_true(c.read_mode);
    assert_int_equal(c.role, PDL_ROLE_PRODUCER);
    assert_int_equal(pdl_connector_config_from_extra("{not json", &c, &e), PDL_ERR_PARSE);
}

static void blockalloc_alloc_free_exhaust(void **state)
{
    (void)state;
    pdl_blockalloc_t *a = NULL;
    assert_int_equal(pdl__blockalloc_create(16, &a, NULL), PDL_OK);
    uint32_t ids[16];
    assert_int_equal(pdl__blockalloc_alloc(a, 10, ids, NULL), PDL_OK);
    for (int i = 0; i < 10; i++)
        assert_int_equal(ids[i], (uint32_t)i);
    assert_int_equal(pdl__blockalloc_free_count(a), 6);
    pdl_error_t e;
    uint32_t more[16];
    assert_int_equal(pdl__blockalloc_alloc(a, 7, more, &e), PDL_ERR_NOMEM);
    assert_non_null(strstr(e.msg, "7 blocks needed, 6 free of 16"));
    assert_int_equal(pdl__blockalloc_free_count(a), 6); /* all or nothing */
    assert_int_equal(pdl__blockalloc_check_owned(a, ids, 10, NULL), PDL_OK);
    uint32_t foreign[2] = {12, 99};
    assert_int_equal(pdl__blockalloc_check_owned(a, foreign, 1, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "12 is not allocated"));
    assert_int_equal(pdl__blockalloc_check_owned(a, foreign + 1, 1, &e), PDL_ERR_INVALID);
    /* check_ids: the allocator's rule when there is one, else (external_blocks) any id below num_blocks */
    assert_int_equal(pdl__blockalloc_check_ids(a, 16, foreign, 1, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "12 is not allocated"));
    assert_int_equal(pdl__blockalloc_check_ids(NULL, 16, (uint32_t[]){12, 15, 12}, 3, &e), PDL_OK);
    assert_int_equal(pdl__blockalloc_check_ids(NULL, 16, (uint32_t[]){3, 16}, 2, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "block id 16 at index 1 is not below num_blocks 16"));
    assert_int_equal(pdl__blockalloc_free(a, ids, 10), 0);
    assert_int_equal(pdl__blockalloc_free(a, ids, 2), 2); /* double free is caught */
    assert_int_equal(pdl__blockalloc_free(a, foreign, 2), 2);
    assert_int_equal(pdl__blockalloc_free_count(a), 16);
    assert_int_equal(pdl__blockalloc_total(a), 16);
    pdl__blockalloc_destroy(a);
    assert_int_equal(pdl__blockalloc_create(0, &a, NULL), PDL_ERR_INVALID);
}

/* The security keys. bind_all is the second boolean key: a bool parser that wrote read_mode whatever the
 * key would turn READ mode on for "bind_all": true and leave bind_all false. */
static void config_security_keys(void **state)
{
    (void)state;
    pdl_connector_config_t c;
    assert_int_equal(pdl_connector_config_from_extra("{\"bind_all\": true}", (pdl_connector_config_defaults(&c), &c),
                                                     NULL),
                     PDL_OK);
    assert_true(c.bind_all);
    assert_false(c.read_mode);
    assert_string_equal(c.trusted_hosts, "");
    assert_int_equal(pdl_connector_config_from_extra("{\"trusted_hosts\": [\"10.0.0.0/8\", \"::1\"]}", &c, NULL),
                     PDL_OK);
    assert_string_equal(c.trusted_hosts, "10.0.0.0/8,::1");
    assert_int_equal(pdl_connector_config_from_extra("{\"trusted_hosts\": \"127.0.0.1, 192.168.1.0/24\"}", &c, NULL),
                     PDL_OK);
    assert_string_equal(c.trusted_hosts, "127.0.0.1, 192.168.1.0/24");
    pdl_error_t e;
    assert_int_equal(pdl_connector_config_from_extra("{\"trusted_hosts\": [\"prefill-0.svc\"]}", &c, &e),
                     PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "kv_connector_extra_config: trusted_hosts: 'prefill-0.svc' is not a numeric"));
    assert_int_equal(pdl_connector_config_from_extra("{\"trusted_hosts\": \"10.0.0.0/33\"}", &c, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "prefix length must be 0..32"));
    assert_int_equal(pdl_connector_config_from_extra("{\"trusted_hosts\": [7]}", &c, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "kv_connector_extra_config.trusted_hosts: expected a list"));
}

/* prewarm_peers: the forms it takes, and what it refuses (the key reaches the decode from
 * whoever writes its config; it decides what the decode dials). */
static void config_prewarm_peers(void **state)
{
    (void)state;
    pdl_connector_config_t c;
    pdl_error_t e;
    pdl_connector_config_defaults(&c);
    assert_int_equal(c.num_prewarm_peers, 0);
    assert_int_equal(pdl_connector_config_from_extra(
                         "{\"prewarm_peers\": [\"10.0.0.1:7000:4\", \"[::1]:7100\", \"p0.svc:7200:8:1\"]}", &c, &e),
                     PDL_OK);
    assert_int_equal(c.num_prewarm_peers, 3);
    assert_string_equal(c.prewarm_peers[0].host, "10.0.0.1");
    assert_int_equal(c.prewarm_peers[0].handshake_port, 7000);
    assert_int_equal(c.prewarm_peers[0].tp, 4);
    assert_int_equal(c.prewarm_peers[0].dp, 0);
    assert_string_equal(c.prewarm_peers[1].host, "::1");
    assert_int_equal(c.prewarm_peers[1].handshake_port, 7100);
    assert_int_equal(c.prewarm_peers[1].tp, 0);
    assert_int_equal(c.prewarm_peers[2].dp, 1);
    /* One comma-separated string; a repeated entry is listed once. */
    pdl_connector_config_defaults(&c);
    assert_int_equal(pdl_connector_config_from_extra("{\"prewarm_peers\": \"h:1, h:1 ,h:2:2\"}", &c, &e), PDL_OK);
    assert_int_equal(c.num_prewarm_peers, 2);
    static const char *const bad[] = {
        "{\"prewarm_peers\": [\"h\"]}",           "{\"prewarm_peers\": [\":7000\"]}",
        "{\"prewarm_peers\": [\"h:0\"]}",         "{\"prewarm_peers\": [\"h:65536\"]}",
        "{\"prewarm_peers\": [\"h:-1\"]}",        "{\"prewarm_peers\": [\"h:7000:257\"]}",
        "{\"prewarm_peers\": [\"h:7000:4:1024\"]}", "{\"prewarm_peers\": [\"h:7000:4:0:9\"]}",
        "{\"prewarm_peers\": [\"h:70x0\"]}",      "{\"prewarm_peers\": [\"h/../x:7000\"]}",
        "{\"prewarm_peers\": [\"[::1:7000\"]}",   "{\"prewarm_peers\": [7000]}",
        "{\"prewarm_peers\": [\"h:7000:\"]}",     "{\"prewarm_peers\": {\"h\": 1}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        pdl_connector_config_defaults(&c);
        pdl_error_clear(&e);
        assert_int_equal(pdl_connector_config_from_extra(bad[i], &c, &e), PDL_ERR_INVALID);
        assert_non_null(strstr(e.msg, "prewarm"));
        assert_int_equal(c.num_prewarm_peers, 0);
    }
    /* A host longer than the wire allows, and more producers than the table holds. */
    char big[600];
    memset(big, 'a', sizeof(big));
    memcpy(big + 500, ":7000", 6);
    pdl_connector_config_defaults(&c);
    assert_int_equal(pdl_connector_config_add_prewarm(&c, big, &e), PDL_ERR_INVALID);
    for (int i = 0; i < PDL_CONNECTOR_PREWARM_MAX; i++) {
        char spec[32];
        snprintf(spec, sizeof(spec), "h:%d", 1000 + i);
        assert_int_equal(pdl_connector_config_add_prewarm(&c, spec, &e), PDL_OK);
    }
    assert_int_equal(pdl_connector_config_add_prewarm(&c, "h:999", &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "more than"));
    assert_int_equal(c.num_prewarm_peers, PDL_CONNECTOR_PREWARM_MAX);
}

/* The key table as programs read it: every row complete, names unique, nothing past the end. */
static void config_key_table(void **state)
{
    (void)state;
    pdl_connector_config_key_t k, first;
    size_t n = 0;
    assert_true(pdl_connector_config_key(0, &first));
    while (pdl_connector_config_key(n, &k)) {
        assert_true(k.name[0] && k.type[0] && k.range[0] && k.doc[0]);
        for (size_t i = 0; i < n; i++) {
            pdl_connector_config_key_t o;
            assert_true(pdl_connector_config_key(i, &o));
            assert_string_not_equal(o.name, k.name);
        }
        n++;
    }
    assert_true(n >= 20);
    assert_false(pdl_connector_config_key(0, NULL));
    /* A wrong value's message says what the row accepts. */
    pdl_connector_config_t c;
    pdl_error_t e;
    assert_int_equal(pdl_connector_config_parse("{\"kv_connector_extra_config\":{\"host_ip\":5}}", &c, &e),
                     PDL_ERR_INVALID);
    assert_string_equal(first.name, "host_ip");
    assert_non_null(strstr(e.msg, first.range));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(config_defaults_match_moriio),
        cmocka_unit_test(config_key_table),
        cmocka_unit_test(config_prewarm_peers),
        cmocka_unit_test(config_security_keys),
        cmocka_unit_test(config_seed_json),
        cmocka_unit_test(config_read_mode_forms),
        cmocka_unit_test(config_backend_mapping),
        cmocka_unit_test(config_zero_ports_mean_default),
        cmocka_unit_test(config_wrong_values_name_the_key),
        cmocka_unit_test(config_unknown_keys_not_fatal),
        cmocka_unit_test(blockalloc_alloc_free_exhaust),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
