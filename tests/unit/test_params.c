/*
 * test_params.c -- kv_transfer_params JSON: parsing (types, nulls, limits, messages naming
 * kv_transfer_params.<key>), the READ-mode prefill return, the public text forms (pdlink/params.h), and
 * the peer-TP rule.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "wire/params_json.h"

static json_t *parse(const char *s)
{
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    assert_non_null(j);
    return j;
}

static void decode_leg_from_router(void **state)
{
    (void)state;
    json_t *j = parse("{\"do_remote_prefill\":true,\"do_remote_decode\":false,\"transfer_id\":\"tx-1\","
                      "\"remote_engine_id\":\"10.0.0.1:6301\",\"remote_block_ids\":[0,1,4294967295],"
                      "\"remote_host\":\"10.0.0.1\",\"remote_handshake_port\":6301,\"remote_notify_port\":61005,"
                      "\"remote_dp_size\":2,\"remote_dp_rank\":1,\"remote_tp_size\":4,\"tp_size\":4,"
                      "\"unknown\":{\"x\":[1]}}");
    pdl_kv_params_t p;
    pdl_error_t err = {0};
    assert_int_equal(pdl_kv_params_from_json(j, &p, &err), PDL_OK);
    assert_true(p.do_remote_prefill);
    assert_false(p.do_remote_decode);
    assert_string_equal(p.transfer_id, "tx-1");
    assert_true(p.has_remote_block_ids);
    assert_int_equal(p.num_remote_blocks, 3);
    assert_int_equal(p.remote_block_ids[2], 4294967295u);
    assert_string_equal(p.remote_engine_id, "10.0.0.1:6301");
    assert_string_equal(p.remote_host, "10.0.0.1");
    assert_int_equal(p.remote_handshake_port, 6301);
    assert_int_equal(p.remote_notify_port, 61005);
    assert_int_equal(p.remote_dp_size, 2);
    assert_int_equal(p.remote_dp_rank, 1);
    assert_int_equal(p.remote_tp_size, 4);
    assert_int_equal(p.tp_size, 4);
    pdl_kv_params_clear(&p);
    json_decref(j);
}

static void nulls_and_absent(void **state)
{
    (void)state;
    json_t *j = parse("{\"do_remote_decode\":true,\"do_remote_prefill\":false,\"remote_engine_id\":null,"
                      "\"remote_block_ids\":null,\"remote_host\":null,\"remote_port\":null,\"transfer_id\":\"tx-2\"}");
    pdl_kv_params_t p;
    pdl_error_t err = {0};
    assert_int_equal(pdl_kv_params_from_json(j, &p, &err), PDL_OK);
    assert_true(p.do_remote_decode);
    assert_false(p.has_remote_block_ids);
    assert_null(p.remote_block_ids);
    assert_string_equal(p.remote_engine_id, "");
    assert_int_equal(p.remote_dp_size, 1);
    assert_int_equal(p.remote_dp_rank, -1);
    assert_int_equal(p.remote_tp_size, 0);
    assert_int_equal(p.tp_size, 0);
    assert_int_equal(p.remote_handshake_port, 0);
    json_decref(j);
    assert_int_equal(pdl_kv_params_from_json(NULL, &p, &err), PDL_OK);
    assert_false(p.do_remote_prefill);
    j = json_null();
    assert_int_equal(pdl_kv_params_from_json(j, &p, &err), PDL_OK);
    json_decref(j);
    j = json_array();
    assert_int_equal(pdl_kv_params_from_json(j, &p, &err), PDL_ERR_PARSE);
    assert_string_equal(err.msg, "kv_transfer_params: expected an object, got array");
    json_decref(j);
}

static void wrong_types_name_the_key(void **state)
{
    (void)state;
    struct {
        const char *json;
        const char *msg;
    } cases[] = {
        {"{\"remote_block_ids\":[1,2,3,\"4\"]}",
         "kv_transfer_params.remote_block_ids[3]: expected a non-negative integer, got string"},
        {"{\"remote_block_ids\":[1,-2]}", "kv_transfer_params.remote_block_ids[1]: must be in 0..4294967295, got -2"},
        {"{\"remote_block_ids\":[4294967296]}",
         "kv_transfer_params.remote_block_ids[0]: must be in 0..4294967295, got 4294967296"},
        {"{\"remote_block_ids\":{}}", "kv_transfer_params.remote_block_ids: expected an array of block ids, got object"},
        {"{\"remote_handshake_port\":\"6301\"}", "kv_transfer_params.remote_handshake_port: expected an integer, got string"},
        {"{\"remote_notify_port\":0}", "kv_transfer_params.remote_notify_port: must be in 1..65535, got 0"},
        {"{\"remote_notify_port\":61005.0}", "kv_transfer_params.remote_notify_port: expected an integer, got real"},
        {"{\"tp_size\":0}", "kv_transfer_params.tp_size: must be in 1..65536, got 0"},
        {"{\"remote_tp_size\":-4}", "kv_transfer_params.remote_tp_size: must be in 1..65536, got -4"},
        {"{\"remote_dp_size\":true}", "kv_transfer_params.remote_dp_size: expected an integer, got boolean"},
        {"{\"remote_dp_rank\":-1}", "kv_transfer_params.remote_dp_rank: must be in 0..65535, got -1"},
        {"{\"do_remote_prefill\":\"true\"}", "kv_transfer_params.do_remote_prefill: expected a boolean, got string"},
        {"{\"do_remote_decode\":1}", "kv_transfer_params.do_remote_decode: expected a boolean, got integer"},
        {"{\"transfer_id\":7}", "kv_transfer_params.transfer_id: expected a string, got integer"},
        {"{\"remote_engine_id\":[]}", "kv_transfer_params.remote_engine_id: expected a string, got array"},
        {"{\"remote_host\":\"a\\u0000b\"}", "kv_transfer_params.remote_host: contains a NUL character"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_error_t je;
        json_t *j = json_loads(cases[i].json, JSON_ALLOW_NUL, &je);
        assert_non_null(j);
        pdl_kv_params_t p;
        pdl_error_t err = {0};
        assert_int_equal(pdl_kv_params_from_json(j, &p, &err), PDL_ERR_PARSE);
        assert_string_equal(err.msg, cases[i].msg);
        assert_null(p.remote_block_ids); /* nothing leaks on failure */
        json_decref(j);
    }
    /* a transfer id over the limit */
    char *big = malloc(PDL_WIRE_ID_MAX + 100);
    strcpy(big, "{\"transfer_id\":\"");
    size_t k = strlen(big);
    memset(big + k, 'x', PDL_WIRE_ID_MAX + 1);
    strcpy(big + k + PDL_WIRE_ID_MAX + 1, "\"}");
    json_t *j = parse(big);
    pdl_kv_params_t p;
    pdl_error_t err = {0};
    assert_int_equal(pdl_kv_params_from_json(j, &p, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "kv_transfer_params.transfer_id"));
    json_decref(j);
    free(big);
}

static void prefill_return_json(void **state)
{
    (void)state;
    pdl_kv_params_t p;
    pdl_kv_params_init(&p);
    strcpy(p.transfer_id, "tx-9");
    uint32_t ids[] = {3, 4, 5};
    p.remote_block_ids = ids;
    p.num_remote_blocks = 3;
    p.has_remote_block_ids = true;
    strcpy(p.remote_engine_id, "10.0.0.1:6301");
    strcpy(p.remote_host, "10.0.0.1");
    p.remote_handshake_port = 6301;
    p.remote_notify_port = 61005;
    p.remote_dp_size = 1;
    p.tp_size = 4;
    p.remote_tp_size = 8; /* the decode's TP from the incoming request: must not leak into the return */
    json_t *j = pdl_kv_params_to_json(&p);
    assert_non_null(j);
    char *s = json_dumps(j, JSON_COMPACT);
    assert_string_equal(s, "{\"do_remote_prefill\":true,\"do_remote_decode\":false,\"remote_block_ids\":[3,4,5],"
                           "\"remote_engine_id\":\"10.0.0.1:6301\",\"remote_host\":\"10.0.0.1\","
                           "\"remote_handshake_port\":6301,\"remote_notify_port\":61005,\"remote_dp_size\":1,"
                           "\"tp_size\":4,\"transfer_id\":\"tx-9\"}");
    free(s);
    /* and the decode side reads it back */
    pdl_kv_params_t d;
    pdl_error_t err = {0};
    assert_int_equal(pdl_kv_params_from_json(j, &d, &err), PDL_OK);
    assert_true(d.do_remote_prefill);
    assert_int_equal(d.num_remote_blocks, 3);
    assert_int_equal(pdl_kv_params_peer_tp(&d, 8, NULL), 4);
    pdl_kv_params_clear(&d);
    json_decref(j);
}

/* The installed API's text forms give what the jansson forms give, and name bad JSON. */
static void text_forms(void **state)
{
    (void)state;
    pdl_kv_params_t p;
    pdl_error_t err = {0};
    assert_int_equal(pdl_kv_params_parse("{\"transfer_id\":\"tx-3\",\"remote_block_ids\":[7,8],\"tp_size\":2,"
                                         "\"remote_host\":\"10.0.0.2\",\"remote_handshake_port\":6301}",
                                         &p, &err),
                     PDL_OK);
    assert_string_equal(p.transfer_id, "tx-3");
    assert_int_equal(p.num_remote_blocks, 2);
    assert_int_equal(p.remote_block_ids[1], 8);
    char *s = pdl_kv_params_format(&p);
    assert_non_null(s);
    json_t *j = pdl_kv_params_to_json(&p);
    char *want = json_dumps(j, JSON_COMPACT);
    assert_string_equal(s, want);
    free(want);
    json_decref(j);
    free(s);
    pdl_kv_params_clear(&p);

    const char *absent[] = {NULL, "", "null"};
    for (size_t i = 0; i < sizeof(absent) / sizeof(absent[0]); i++) {
        assert_int_equal(pdl_kv_params_parse(absent[i], &p, &err), PDL_OK);
        assert_false(p.has_remote_block_ids);
        assert_int_equal(p.remote_dp_rank, -1);
    }
    assert_int_equal(pdl_kv_params_parse("{\"tp_size\":", &p, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "kv_transfer_params: invalid JSON"));
    assert_int_equal(pdl_kv_params_parse("{\"tp_size\":\"4\"}", &p, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "kv_transfer_params.tp_size"));
    assert_int_equal(pdl_kv_params_parse("[1]", &p, &err), PDL_ERR_PARSE);
    assert_null(pdl_kv_params_format(NULL));
}

static void peer_tp_rule(void **state)
{
    (void)state;
    pdl_kv_params_t p;
    pdl_kv_params_init(&p);
    bool dis = true;
    /* Neither key: upstream's 1, whatever our own TP is. */
    assert_int_equal(pdl_kv_params_peer_tp(&p, 8, &dis), 1);
    assert_false(dis);
    p.tp_size = 4;
    assert_int_equal(pdl_kv_params_peer_tp(&p, 8, &dis), 4);
    assert_false(dis);
    /* Both and different: tp_size (what the prefill reported) wins, and the caller is told. */
    p.remote_tp_size = 8;
    assert_int_equal(pdl_kv_params_peer_tp(&p, 8, &dis), 4);
    assert_true(dis);
    p.tp_size = 8;
    assert_int_equal(pdl_kv_params_peer_tp(&p, 8, &dis), 8);
    assert_false(dis);
    /* remote_tp_size alone (WRITE-mode legs from vllm-router carry only it). */
    p.tp_size = 0;
    p.remote_tp_size = 2;
    assert_int_equal(pdl_kv_params_peer_tp(&p, 8, NULL), 2);
}

/* The decode leg exactly as vllm-router 0.1.17 forwarded it in READ mode (captured from a run against
 * pdlink-nodes), plus the stale remote_tp_size of a router that copies the decode's own TP: the peer TP
 * must be the prefill's tp_size, as upstream MoRIIO reads it. */
static void peer_tp_real_router_leg(void **state)
{
    (void)state;
    const char *leg = "{\"do_remote_prefill\":true,\"do_remote_decode\":false,\"remote_block_ids\":[1,2,3],"
                      "\"remote_engine_id\":\"127.0.0.1:23301\",\"remote_host\":\"127.0.0.1\","
                      "\"remote_handshake_port\":23301,\"remote_notify_port\":23401,\"remote_dp_size\":1,"
                      "\"tp_size\":4,\"transfer_id\":\"tx-3fb7dfc6f32448a6b34df6f4ba6ed42f\","
                      "\"remote_tp_size\":8}";
    json_t *j = json_loads(leg, 0, NULL);
    assert_non_null(j);
    pdl_kv_params_t d;
    pdl_error_t err = {0};
    assert_int_equal(pdl_kv_params_from_json(j, &d, &err), PDL_OK);
    bool dis = false;
    assert_int_equal(pdl_kv_params_peer_tp(&d, 8, &dis), 4);
    assert_true(dis);
    pdl_kv_params_clear(&d);
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(decode_leg_from_router),
        cmocka_unit_test(nulls_and_absent),
        cmocka_unit_test(wrong_types_name_the_key),
        cmocka_unit_test(prefill_return_json),
        cmocka_unit_test(text_forms),
        cmocka_unit_test(peer_tp_rule),
        cmocka_unit_test(peer_tp_real_router_leg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
