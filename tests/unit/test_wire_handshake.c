/*
 * test_wire_handshake.c -- the handshake payloads: agent metadata (upstream keys + pdlink keys) and the
 * layer map. Golden bytes from msgpack-python, round trips, bounds, wrong types, truncation.
 */
#include "wire_testutil.h"

/* {"engine_id":"10.0.0.1:6301","agent_metadata":b"\x01\x02\x03","kv_caches_base_addr":[140737488355328,4096],
 *  "num_blocks":1024,"block_len":65536,"attn_backend_name":"TRITON_ATTN"} */
#define GOLD_META                                                                                      \
    "86a9656e67696e655f6964ad31302e302e302e313a36333031ae6167656e745f6d65746164617461c403010203b36b765f" \
    "6361636865735f626173655f6164647292cf0000800000000000cd1000aa6e756d5f626c6f636b73cd0400a9626c6f636b" \
    "5f6c656ece00010000b16174746e5f6261636b656e645f6e616d65ab545249544f4e5f4154544e"
/* the same plus pdlink_version "0.1.0", tp_size 4, tp_rank 2, dp_rank 0, num_layers 32,
 * total_num_kv_heads 8, head_dim 128, kv_elem_size 2, block_size 16, layout "hnd", is_mla False */
#define GOLD_META_PDL                                                                                  \
    "de0011a9656e67696e655f6964ad31302e302e302e313a36333031ae6167656e745f6d65746164617461c403010203b36b" \
    "765f6361636865735f626173655f6164647292cf0000800000000000cd1000aa6e756d5f626c6f636b73cd0400a9626c6f" \
    "636b5f6c656ece00010000b16174746e5f6261636b656e645f6e616d65ab545249544f4e5f4154544eae70646c696e6b5f" \
    "76657273696f6ea5302e312e30a774705f73697a6504a774705f72616e6b02a764705f72616e6b00aa6e756d5f6c617965" \
    "727320b2746f74616c5f6e756d5f6b765f686561647308a8686561645f64696dcc80ac6b765f656c656d5f73697a6502aa" \
    "626c6f636b5f73697a6510a66c61796f7574a3686e64a669735f6d6c61c2"
/* {"model.layers.0.self_attn.attn":[b"\xaa\xbb"],"model.layers.1.self_attn.attn":[b"\xcc", b""]} */
#define GOLD_LMAP                                                                                      \
    "82bd6d6f64656c2e6c61796572732e302e73656c665f6174746e2e6174746e91c402aabbbd6d6f64656c2e6c6179657273" \
    "2e312e73656c665f6174746e2e6174746e92c401ccc400"

static pdl_status_t try_meta(const void *buf, size_t len, pdl_error_t *err)
{
    pdl_agent_meta_t m;
    pdl_status_t st = pdl_wire_decode_agent_meta(buf, len, &m, err);
    pdl_agent_meta_clear(&m);
    return st;
}

static pdl_status_t try_lmap(const void *buf, size_t len, pdl_error_t *err)
{
    pdl_layer_map_t m;
    pdl_status_t st = pdl_wire_decode_layer_map(buf, len, &m, err);
    pdl_layer_map_clear(&m);
    return st;
}

static void fill_meta(pdl_agent_meta_t *m, uint64_t *addrs, uint8_t *md, bool pdlink)
{
    pdl_agent_meta_init(m);
    strcpy(m->engine_id, "10.0.0.1:6301");
    md[0] = 1, md[1] = 2, md[2] = 3;
    m->agent_metadata = (pdl_bytes_t){md, 3};
    addrs[0] = 140737488355328ull, addrs[1] = 4096;
    m->kv_caches_base_addr = addrs;
    m->num_base_addr = 2;
    m->num_blocks = 1024;
    m->block_len = 65536;
    strcpy(m->attn_backend_name, "TRITON_ATTN");
    if (pdlink) {
        m->has_pdlink = true;
        strcpy(m->pdlink_version, "0.1.0");
        m->tp_size = 4, m->tp_rank = 2, m->dp_rank = 0, m->num_layers = 32, m->total_num_kv_heads = 8;
        m->head_dim = 128, m->kv_elem_size = 2, m->block_size = 16;
        strcpy(m->layout, "hnd");
        m->is_mla = false;
    }
}

static void meta_golden_and_round_trip(void **state)
{
    (void)state;
    for (int pdlink = 0; pdlink < 2; pdlink++) {
        uint64_t addrs[2];
        uint8_t md[3];
        pdl_agent_meta_t m;
        fill_meta(&m, addrs, md, pdlink);
        pdl_bytes_t b;
        pdl_error_t err = {0};
        assert_int_equal(pdl_wire_encode_agent_meta(&m, &b, &err), PDL_OK);
        assert_bytes_hex(&b, pdlink ? GOLD_META_PDL : GOLD_META);
        pdl_agent_meta_t d;
        assert_int_equal(pdl_wire_decode_agent_meta(b.data, b.len, &d, &err), PDL_OK);
        assert_true(pdl_agent_meta_equal(&m, &d));
        assert_int_equal(d.has_pdlink, pdlink);
        assert_int_equal(d.kv_caches_base_addr[0], 140737488355328ull);
        if (!pdlink)
            assert_int_equal(d.tp_size, -1);
        check_prefixes_and_trailing(b.data, b.len, try_meta);
        pdl_agent_meta_clear(&d);
        pdl_bytes_free(&b);
    }
}

/* Every layout string pdl_layout_name makes survives the wire unchanged (the peer compares it verbatim),
 * and two metas that differ only in it are not equal. */
static void meta_layout_strings(void **state)
{
    (void)state;
    static const char *names[] = {"hnd", "nhd-blockfirst", "hnd-blockfirst", "hnd-fused", "nhd-fused"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        uint64_t addrs[2];
        uint8_t md[3];
        pdl_agent_meta_t m, d;
        fill_meta(&m, addrs, md, true);
        snprintf(m.layout, sizeof(m.layout), "%s", names[i]);
        pdl_bytes_t b;
        pdl_error_t err = {0};
        assert_int_equal(pdl_wire_encode_agent_meta(&m, &b, &err), PDL_OK);
        assert_int_equal(pdl_wire_decode_agent_meta(b.data, b.len, &d, &err), PDL_OK);
        assert_string_equal(d.layout, names[i]);
        assert_true(pdl_agent_meta_equal(&m, &d));
        strcpy(d.layout, "hnd-fused");
        assert_int_equal(pdl_agent_meta_equal(&m, &d), strcmp(names[i], "hnd-fused") == 0);
        pdl_agent_meta_clear(&d);
        pdl_bytes_free(&b);
    }
}

static void meta_wrong_types_and_missing(void **state)
{
    (void)state;
    uint64_t addrs[] = {4096, 8192};
    tfield_t f[] = {
        {.key = "engine_id", .kind = V_STR, .s = "h:1"},
        {.key = "agent_metadata", .kind = V_BIN, .s = "desc"},
        {.key = "kv_caches_base_addr", .kind = V_ARRAY_INTS, .arr = addrs, .n = 2},
        {.key = "num_blocks", .kind = V_INT, .i = 10},
        {.key = "block_len", .kind = V_INT, .i = 4096},
        {.key = "attn_backend_name", .kind = V_STR, .s = "X"},
        {.key = "pdlink_version", .kind = V_STR, .s = "0.1.0"},
        {.key = "tp_size", .kind = V_INT, .i = 2},
        {.key = "tp_rank", .kind = V_INT, .i = 1},
        {.key = "dp_rank", .kind = V_INT, .i = 0},
        {.key = "num_layers", .kind = V_INT, .i = 2},
        {.key = "total_num_kv_heads", .kind = V_INT, .i = 8},
        {.key = "head_dim", .kind = V_INT, .i = 128},
        {.key = "kv_elem_size", .kind = V_INT, .i = 2},
        {.key = "block_size", .kind = V_INT, .i = 16},
        {.key = "layout", .kind = V_STR, .s = "hnd"},
        {.key = "is_mla", .kind = V_BOOL, .i = 1},
    };
    size_t n = sizeof(f) / sizeof(f[0]);
    msgpack_sbuffer sb;
    pack_fields(f, n, -1, V_NIL, &sb);
    pdl_agent_meta_t m;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_decode_agent_meta(sb.data, sb.size, &m, &err), PDL_OK);
    assert_true(m.is_mla);
    assert_int_equal(m.tp_rank, 1);
    pdl_agent_meta_clear(&m);
    msgpack_sbuffer_destroy(&sb);
    /* attn_backend_name and layout may be empty, so an empty str is not "wrong" for them; every other swap is. */
    assert_true(check_wrong_types(f, n, try_meta, NULL) > 100);
    const char *req[] = {"engine_id", "agent_metadata", "kv_caches_base_addr", "num_blocks", "block_len",
                         "attn_backend_name", NULL};
    check_missing(f, n, req, try_meta);

    /* tp_rank beyond tp_size */
    f[8].i = 2;
    pack_fields(f, n, -1, V_NIL, &sb);
    assert_int_equal(pdl_wire_decode_agent_meta(sb.data, sb.size, &m, &err), PDL_ERR_PARSE);
    assert_string_equal(err.msg, "agent_meta: tp_rank must be <= 1, got 2");
    msgpack_sbuffer_destroy(&sb);
    /* Without pdlink_version the pdlink keys are not read at all (even malformed ones). */
    f[6].key = "other";
    f[7].kind = V_STR;
    pack_fields(f, n, -1, V_NIL, &sb);
    assert_int_equal(pdl_wire_decode_agent_meta(sb.data, sb.size, &m, &err), PDL_OK);
    assert_false(m.has_pdlink);
    assert_int_equal(m.tp_size, -1);
    pdl_agent_meta_clear(&m);
    msgpack_sbuffer_destroy(&sb);
}

static void meta_encoder_validates(void **state)
{
    (void)state;
    uint64_t addrs[2];
    uint8_t md[3];
    pdl_agent_meta_t m;
    fill_meta(&m, addrs, md, true);
    pdl_bytes_t b;
    pdl_error_t err = {0};
    m.tp_size = 0;
    assert_int_equal(pdl_wire_encode_agent_meta(&m, &b, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "tp_size"));
    fill_meta(&m, addrs, md, true);
    m.engine_id[0] = '\0';
    assert_int_equal(pdl_wire_encode_agent_meta(&m, &b, &err), PDL_ERR_INVALID);
    fill_meta(&m, addrs, md, true);
    m.tp_rank = 4;
    assert_int_equal(pdl_wire_encode_agent_meta(&m, &b, &err), PDL_ERR_INVALID);
    /* absent pdlink integers are simply not written */
    fill_meta(&m, addrs, md, true);
    m.head_dim = -1;
    m.layout[0] = '\0';
    assert_int_equal(pdl_wire_encode_agent_meta(&m, &b, &err), PDL_OK);
    pdl_agent_meta_t d;
    assert_int_equal(pdl_wire_decode_agent_meta(b.data, b.len, &d, &err), PDL_OK);
    assert_int_equal(d.head_dim, -1);
    assert_true(pdl_agent_meta_equal(&m, &d));
    pdl_agent_meta_clear(&d);
    pdl_bytes_free(&b);
}

static void lmap_golden_and_round_trip(void **state)
{
    (void)state;
    pdl_layer_map_t m = {0};
    pdl_error_t err = {0};
    assert_int_equal(pdl_layer_map_add(&m, "model.layers.0.self_attn.attn", "\xaa\xbb", 2, &err), PDL_OK);
    assert_int_equal(pdl_layer_map_add(&m, "model.layers.1.self_attn.attn", "\xcc", 1, &err), PDL_OK);
    assert_int_equal(pdl_layer_map_add(&m, "model.layers.1.self_attn.attn", NULL, 0, &err), PDL_OK);
    assert_int_equal(m.num_layers, 2);
    assert_non_null(pdl_layer_map_find(&m, "model.layers.1.self_attn.attn"));
    assert_null(pdl_layer_map_find(&m, "nope"));
    pdl_bytes_t b;
    assert_int_equal(pdl_wire_encode_layer_map(&m, &b, &err), PDL_OK);
    assert_bytes_hex(&b, GOLD_LMAP);
    pdl_layer_map_t d;
    assert_int_equal(pdl_wire_decode_layer_map(b.data, b.len, &d, &err), PDL_OK);
    assert_true(pdl_layer_map_equal(&m, &d));
    /* a decoded map can grow */
    assert_int_equal(pdl_layer_map_add(&d, "model.layers.2", "\x01", 1, &err), PDL_OK);
    assert_int_equal(d.num_layers, 3);
    check_prefixes_and_trailing(b.data, b.len, try_lmap);
    pdl_layer_map_clear(&d);
    pdl_layer_map_clear(&m);
    pdl_bytes_free(&b);
}

static void lmap_many_layers_and_limits(void **state)
{
    (void)state;
    pdl_layer_map_t m = {0};
    pdl_error_t err = {0};
    char name[64];
    for (int i = 0; i < PDL_WIRE_MAX_LAYERS; i++) {
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.attn", i);
        assert_int_equal(pdl_layer_map_add(&m, name, name, strlen(name), &err), PDL_OK);
    }
    assert_int_equal(pdl_layer_map_add(&m, "one.more", "x", 1, &err), PDL_ERR_INVALID);
    for (int d = 1; d < PDL_WIRE_MAX_LAYER_DESCS; d++)
        assert_int_equal(pdl_layer_map_add(&m, "model.layers.0.self_attn.attn", "y", 1, &err), PDL_OK);
    assert_int_equal(pdl_layer_map_add(&m, "model.layers.0.self_attn.attn", "y", 1, &err), PDL_ERR_INVALID);
    static uint8_t huge[PDL_WIRE_MAX_DESC_BYTES + 1];
    assert_int_equal(pdl_layer_map_add(&m, "model.layers.0.self_attn.attn", huge, sizeof(huge), &err), PDL_ERR_INVALID);
    pdl_bytes_t b;
    assert_int_equal(pdl_wire_encode_layer_map(&m, &b, &err), PDL_OK);
    pdl_layer_map_t d;
    assert_int_equal(pdl_wire_decode_layer_map(b.data, b.len, &d, &err), PDL_OK);
    assert_true(pdl_layer_map_equal(&m, &d));
    pdl_layer_map_clear(&d);
    pdl_bytes_free(&b);
    pdl_layer_map_clear(&m);

    /* 4097 layers on the wire */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, PDL_WIRE_MAX_LAYERS + 1);
    for (int i = 0; i <= PDL_WIRE_MAX_LAYERS; i++) {
        int n = snprintf(name, sizeof(name), "l%d", i);
        msgpack_pack_str(&pk, n), msgpack_pack_str_body(&pk, name, n);
        msgpack_pack_array(&pk, 1), msgpack_pack_bin(&pk, 1), msgpack_pack_bin_body(&pk, "x", 1);
    }
    assert_int_equal(try_lmap(sb.data, sb.size, &err), PDL_ERR_PARSE);
    msgpack_sbuffer_destroy(&sb);
}

static void lmap_hostile(void **state)
{
    (void)state;
    pdl_error_t err = {0};
    struct {
        const char *hex;
        const char *needle;
    } cases[] = {
        {"81a16191a178", "descriptor[0] is a string, expected binary"}, /* {"a": ["x"]} */
        {"81a16190", "has 0 descriptors"},                              /* {"a": []} */
        {"81a161c401ff", "is binary, expected an array"},               /* {"a": b"\xff"} */
        {"8101" "91c40100", "layer name [0] is an integer"},           /* {1: [b"\0"]} */
        {"82a16191c40100a16191c40100", "appears twice"},                /* duplicate layer */
        {"91c40100", "expected a map"},
        {"81a061" "91c40100", "layer name [0] is empty"}, /* ""... actually fixstr 0 then junk */
        {"dfffffffff", "msgpack elements"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint8_t buf[64];
        size_t n = unhex(cases[i].hex, buf, sizeof(buf));
        pdl_status_t st = try_lmap(buf, n, &err);
        assert_int_equal(st, PDL_ERR_PARSE);
        if (i != 6 && strstr(err.msg, cases[i].needle) == NULL) {
            print_error("case %zu: %s\n", i, err.msg);
            fail();
        }
    }
    /* 17 descriptors in one layer */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_str(&pk, 1), msgpack_pack_str_body(&pk, "a", 1);
    msgpack_pack_array(&pk, PDL_WIRE_MAX_LAYER_DESCS + 1);
    for (int i = 0; i <= PDL_WIRE_MAX_LAYER_DESCS; i++)
        msgpack_pack_bin(&pk, 1), msgpack_pack_bin_body(&pk, "x", 1);
    assert_int_equal(try_lmap(sb.data, sb.size, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "17 descriptors"));
    msgpack_sbuffer_destroy(&sb);
    /* a descriptor over 64 KiB */
    msgpack_sbuffer_init(&sb);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_str(&pk, 1), msgpack_pack_str_body(&pk, "a", 1);
    msgpack_pack_array(&pk, 1);
    static char big[PDL_WIRE_MAX_DESC_BYTES + 1];
    msgpack_pack_bin(&pk, sizeof(big)), msgpack_pack_bin_body(&pk, big, sizeof(big));
    assert_int_equal(try_lmap(sb.data, sb.size, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "limit"));
    msgpack_sbuffer_destroy(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(meta_golden_and_round_trip),
        cmocka_unit_test(meta_layout_strings),
        cmocka_unit_test(meta_wrong_types_and_missing),
        cmocka_unit_test(meta_encoder_validates),
        cmocka_unit_test(lmap_golden_and_round_trip),
        cmocka_unit_test(lmap_many_layers_and_limits),
        cmocka_unit_test(lmap_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
