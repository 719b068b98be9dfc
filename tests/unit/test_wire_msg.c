/*
 * test_wire_msg.c -- notify-channel codec: golden bytes (from msgpack-python), round trips, legacy
 * text ids, and every way a hostile frame can be wrong.
 */
#include "wire_testutil.h"

/* Golden vectors: /usr/bin/python3 -c 'import msgpack; print(msgpack.dumps({...}).hex())' */
#define GOLD_RELEASE                                                                                   \
    "83a474797065a772656c65617365ab7472616e736665725f6964a474782d31b0636f6e73756d65725f74705f73697a6508"
/* transfer_id "tx-0123456789abcdef0123456789abcdef0123" (39 bytes: str8 d9 27) */
#define GOLD_RELEASE39                                                                                 \
    "83a474797065a772656c65617365ab7472616e736665725f6964d92774782d30313233343536373839616263646566"    \
    "3031323334353637383961626364656630313233b0636f6e73756d65725f74705f73697a6508"
/* + consumer_tp_rank 3, status "failed", producer_tp_size 4, producer_tp_rank 1 */
#define GOLD_RELEASE_FULL                                                                              \
    "87a474797065a772656c65617365ab7472616e736665725f6964a474782d31b0636f6e73756d65725f74705f73697a65" \
    "08b0636f6e73756d65725f74705f72616e6b03a6737461747573a66661696c6564b070726f64756365725f74705f7369" \
    "7a6504b070726f64756365725f74705f72616e6b01"
/* {"req_id":"cmpl-abc-0","transfer_id":"tx-1","block_notify_list":[1,2,300,70000],"decode_rank":1,
 *  "type":"remote_blocks"} -- upstream's literal dict order */
#define GOLD_REMOTE_BLOCKS                                                                             \
    "85a67265715f6964aa636d706c2d6162632d30ab7472616e736665725f6964a474782d31b1626c6f636b5f6e6f746966" \
    "795f6c697374940102cd012cce00011170ab6465636f64655f72616e6b01a474797065ad72656d6f74655f626c6f636b73"
#define GOLD_WRITE_DONE "82a474797065aa77726974655f646f6e65ab7472616e736665725f6964a474782d31"

static pdl_status_t try_msg(const void *buf, size_t len, pdl_error_t *err)
{
    pdl_msg_t m;
    pdl_status_t st = pdl_wire_decode_msg(buf, len, &m, err);
    pdl_msg_clear(&m);
    return st;
}

static void encode_expect(const pdl_msg_t *m, const char *hex)
{
    pdl_bytes_t b;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_encode_msg(m, &b, &err), PDL_OK);
    assert_bytes_hex(&b, hex);
    /* and back */
    pdl_msg_t d;
    assert_int_equal(pdl_wire_decode_msg(b.data, b.len, &d, &err), PDL_OK);
    assert_true(pdl_msg_equal(m, &d));
    pdl_msg_clear(&d);
    pdl_bytes_free(&b);
}

/* m encodes, and what it encodes to decodes to a message equal to m. */
static void assert_round_trips(const pdl_msg_t *m)
{
    pdl_bytes_t b;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_encode_msg(m, &b, &err), PDL_OK);
    pdl_msg_t d;
    assert_int_equal(pdl_wire_decode_msg(b.data, b.len, &d, &err), PDL_OK);
    assert_int_equal(d.type, m->type);
    assert_true(pdl_msg_equal(m, &d));
    pdl_msg_clear(&d);
    pdl_bytes_free(&b);
}

static void golden_release(void **state)
{
    (void)state;
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_RELEASE);
    strcpy(m.transfer_id, "tx-1");
    m.consumer_tp_size = 8;
    encode_expect(&m, GOLD_RELEASE);
    strcpy(m.transfer_id, "tx-0123456789abcdef0123456789abcdef0123");
    encode_expect(&m, GOLD_RELEASE39);
    strcpy(m.transfer_id, "tx-1");
    m.consumer_tp_rank = 3;
    m.status = PDL_RELEASE_FAILED;
    m.producer_tp_size = 4;
    m.producer_tp_rank = 1;
    encode_expect(&m, GOLD_RELEASE_FULL);
}

static void golden_remote_blocks_write_done(void **state)
{
    (void)state;
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_REMOTE_BLOCKS);
    strcpy(m.transfer_id, "tx-1");
    strcpy(m.req_id, "cmpl-abc-0");
    uint32_t ids[] = {1, 2, 300, 70000};
    m.block_ids = ids;
    m.num_blocks = 4;
    m.decode_rank = 1;
    encode_expect(&m, GOLD_REMOTE_BLOCKS);
    pdl_msg_init(&m, PDL_MSG_WRITE_DONE);
    strcpy(m.transfer_id, "tx-1");
    encode_expect(&m, GOLD_WRITE_DONE);
}

static void decode_golden_fields(void **state)
{
    (void)state;
    uint8_t buf[512];
    size_t n = unhex(GOLD_RELEASE_FULL, buf, sizeof(buf));
    pdl_msg_t m;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_decode_msg(buf, n, &m, &err), PDL_OK);
    assert_int_equal(m.type, PDL_MSG_RELEASE);
    assert_string_equal(m.transfer_id, "tx-1");
    assert_int_equal(m.consumer_tp_size, 8);
    assert_int_equal(m.consumer_tp_rank, 3);
    assert_int_equal(m.status, PDL_RELEASE_FAILED);
    assert_int_equal(m.producer_tp_size, 4);
    assert_int_equal(m.producer_tp_rank, 1);
    pdl_msg_clear(&m);

    n = unhex(GOLD_REMOTE_BLOCKS, buf, sizeof(buf));
    assert_int_equal(pdl_wire_decode_msg(buf, n, &m, &err), PDL_OK);
    assert_int_equal(m.type, PDL_MSG_REMOTE_BLOCKS);
    assert_string_equal(m.req_id, "cmpl-abc-0");
    assert_int_equal(m.num_blocks, 4);
    assert_int_equal(m.block_ids[3], 70000);
    assert_int_equal(m.decode_rank, 1);
    pdl_msg_clear(&m);
}

static void release_defaults_when_absent(void **state)
{
    (void)state;
    /* PR-era WRITE early release: {"type":"release","transfer_id":"xfer-7"} */
    tfield_t f[] = {{.key = "type", .kind = V_STR, .s = "release"},
                    {.key = "transfer_id", .kind = V_STR, .s = "xfer-7"}};
    msgpack_sbuffer sb;
    pack_fields(f, 2, -1, V_NIL, &sb);
    pdl_msg_t m;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_decode_msg(sb.data, sb.size, &m, &err), PDL_OK);
    assert_int_equal(m.consumer_tp_size, 1);
    assert_int_equal(m.consumer_tp_rank, -1);
    assert_int_equal(m.status, PDL_RELEASE_ABSENT);
    assert_int_equal(m.producer_tp_size, -1);
    msgpack_sbuffer_destroy(&sb);
}

static void key_order_and_unknown_keys(void **state)
{
    (void)state;
    /* Reversed order, an unknown key, keys of another type: all fine. */
    tfield_t f[] = {{.key = "future_key", .kind = V_MAP},
                    {.key = "consumer_tp_size", .kind = V_INT, .i = 2},
                    {.key = "block_notify_list", .kind = V_STR, .s = "ignored for release"},
                    {.key = "transfer_id", .kind = V_STR, .s = "tx-9"},
                    {.key = "type", .kind = V_STR, .s = "release"}};
    msgpack_sbuffer sb;
    pack_fields(f, 5, -1, V_NIL, &sb);
    pdl_msg_t m;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_decode_msg(sb.data, sb.size, &m, &err), PDL_OK);
    assert_int_equal(m.type, PDL_MSG_RELEASE);
    assert_int_equal(m.consumer_tp_size, 2);
    assert_string_equal(m.transfer_id, "tx-9");
    msgpack_sbuffer_destroy(&sb);
}

static void bin_keys_and_values_accepted(void **state)
{
    (void)state;
    /* {b"type": b"write_done", b"transfer_id": b"tx-2"} as an old use_bin_type sender might produce */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    const char *kv[] = {"type", "write_done", "transfer_id", "tx-2"};
    for (int i = 0; i < 4; i++) {
        msgpack_pack_bin(&pk, strlen(kv[i]));
        msgpack_pack_bin_body(&pk, kv[i], strlen(kv[i]));
    }
    pdl_msg_t m;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_decode_msg(sb.data, sb.size, &m, &err), PDL_OK);
    assert_int_equal(m.type, PDL_MSG_WRITE_DONE);
    assert_string_equal(m.transfer_id, "tx-2");
    msgpack_sbuffer_destroy(&sb);
}

static void untyped_remote_blocks(void **state)
{
    (void)state;
    uint64_t ids[] = {5, 6};
    /* The oldest upstream form: no type, no transfer_id. */
    tfield_t f[] = {{.key = "req_id", .kind = V_STR, .s = "r1"},
                    {.key = "block_notify_list", .kind = V_ARRAY_INTS, .arr = ids, .n = 2},
                    {.key = "decode_rank", .kind = V_INT, .i = 0}};
    msgpack_sbuffer sb;
    pack_fields(f, 3, -1, V_NIL, &sb);
    pdl_msg_t m;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_decode_msg(sb.data, sb.size, &m, &err), PDL_OK);
    assert_int_equal(m.type, PDL_MSG_REMOTE_BLOCKS);
    assert_string_equal(m.transfer_id, "");
    assert_int_equal(m.num_blocks, 2);
    /* re-encoding keeps it without transfer_id and decodes the same */
    assert_round_trips(&m);
    pdl_msg_clear(&m);
    msgpack_sbuffer_destroy(&sb);
}

static void legacy_text_ids(void **state)
{
    (void)state;
    const char *ok[] = {"tx-1", "7", "tx-0123456789abcdef0123456789abcdef0123", "xfer-\xc3\xa9t\xc3\xa9", "a"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        pdl_msg_t m;
        pdl_error_t err = {0};
        assert_int_equal(pdl_wire_decode_msg(ok[i], strlen(ok[i]), &m, &err), PDL_OK);
        assert_int_equal(m.type, PDL_MSG_LEGACY);
        assert_string_equal(m.transfer_id, ok[i]);
        pdl_bytes_t b;
        assert_int_equal(pdl_wire_encode_msg(&m, &b, &err), PDL_OK);
        assert_int_equal(b.len, strlen(ok[i]));
        assert_memory_equal(b.data, ok[i], b.len);
        pdl_bytes_free(&b);
    }
    /* A msgpack str scalar whose bytes are not UTF-8 is neither a map nor text. */
    const struct {
        const char *buf;
        size_t len;
        const char *needle;
    } bad[] = {
        {"\xa3" "abc", 4, "UTF-8"},      /* msgpack str, invalid as text */
        {"tx\xff", 3, "UTF-8"},          /* invalid UTF-8 */
        {"\xed\xa0\x80", 3, "UTF-8"},    /* surrogate */
        {"\xc0\xaf", 2, "UTF-8"},        /* overlong */
        {"tx\0-1", 5, "NUL"},
        {"", 0, "empty"},
        {"\x80", 1, "UTF-8"},           /* empty fixmap: a map, but neither type nor req_id */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        pdl_msg_t m;
        pdl_error_t err = {0};
        pdl_status_t st = pdl_wire_decode_msg(bad[i].buf, bad[i].len, &m, &err);
        assert_int_equal(st, PDL_ERR_PARSE);
        if (i == 6)
            assert_non_null(strstr(err.msg, "neither type nor req_id"));
        else
            assert_non_null(strstr(err.msg, bad[i].needle));
    }
    /* Too long for an id */
    char big[PDL_WIRE_ID_MAX + 2];
    memset(big, 'a', sizeof(big));
    pdl_msg_t m;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_decode_msg(big, PDL_WIRE_ID_MAX, &m, &err), PDL_OK);
    assert_int_equal(pdl_wire_decode_msg(big, PDL_WIRE_ID_MAX + 1, &m, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "too long"));
}

static void semantic_errors_name_the_key(void **state)
{
    (void)state;
    uint64_t ids[] = {1, 2, 3};
    struct {
        tfield_t f[4];
        size_t n;
        const char *msg;
    } cases[] = {
        {{{.key = "type", .kind = V_STR, .s = "release"}, {.key = "transfer_id", .kind = V_STR, .s = "t"},
          {.key = "consumer_tp_size", .kind = V_INT, .i = 0}},
         3, "release: consumer_tp_size must be >= 1, got 0"},
        {{{.key = "type", .kind = V_STR, .s = "release"}, {.key = "transfer_id", .kind = V_STR, .s = "t"},
          {.key = "consumer_tp_size", .kind = V_INT, .i = 4}, {.key = "consumer_tp_rank", .kind = V_INT, .i = 4}},
         4, "release: consumer_tp_rank must be <= 3, got 4"},
        {{{.key = "type", .kind = V_STR, .s = "release"}, {.key = "transfer_id", .kind = V_STR, .s = "t"},
          {.key = "status", .kind = V_STR, .s = "maybe"}},
         3, "release: status must be \"ok\" or \"failed\", got \"maybe\""},
        {{{.key = "type", .kind = V_STR, .s = "release"}, {.key = "transfer_id", .kind = V_STR, .s = ""}},
         2, "release: transfer_id is empty"},
        {{{.key = "type", .kind = V_STR, .s = "bogus"}, {.key = "transfer_id", .kind = V_STR, .s = "t"}},
         2, "notify: unknown message type \"bogus\""},
        {{{.key = "transfer_id", .kind = V_STR, .s = "t"}}, 1, "notify: map has neither type nor req_id"},
        {{{.key = "type", .kind = V_STR, .s = "remote_blocks"}, {.key = "transfer_id", .kind = V_STR, .s = "t"},
          {.key = "req_id", .kind = V_STR, .s = "r"}, {.key = "block_notify_list", .kind = V_ARRAY_INTS, .arr = ids, .n = 0}},
         4, "remote_blocks: block_notify_list is empty"},
        {{{.key = "type", .kind = V_STR, .s = "write_done"}, {.key = "transfer_id", .kind = V_STR, .s = "t"},
          {.key = "transfer_id", .kind = V_STR, .s = "u"}},
         3, "notify: duplicate key transfer_id"},
        {{{.key = "type", .kind = V_STR, .s = "release"}, {.key = "transfer_id", .kind = V_STR, .s = "t"},
          {.key = "consumer_tp_size", .kind = V_NEG}},
         3, "release: consumer_tp_size must be >= 1, got -5"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        msgpack_sbuffer sb;
        pack_fields(cases[i].f, cases[i].n, -1, V_NIL, &sb);
        pdl_msg_t m;
        pdl_error_t err = {0};
        assert_int_equal(pdl_wire_decode_msg(sb.data, sb.size, &m, &err), PDL_ERR_PARSE);
        assert_string_equal(err.msg, cases[i].msg);
        msgpack_sbuffer_destroy(&sb);
    }
}

static void block_list_element_message(void **state)
{
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str(&pk, 4), msgpack_pack_str_body(&pk, "type", 4);
    msgpack_pack_str(&pk, 13), msgpack_pack_str_body(&pk, "remote_blocks", 13);
    msgpack_pack_str(&pk, 6), msgpack_pack_str_body(&pk, "req_id", 6);
    msgpack_pack_str(&pk, 1), msgpack_pack_str_body(&pk, "r", 1);
    msgpack_pack_str(&pk, 17), msgpack_pack_str_body(&pk, "block_notify_list", 17);
    msgpack_pack_array(&pk, 3);
    msgpack_pack_int(&pk, 1), msgpack_pack_int(&pk, 2);
    msgpack_pack_str(&pk, 1), msgpack_pack_str_body(&pk, "x", 1);
    pdl_msg_t m;
    pdl_error_t err = {0};
    assert_int_equal(pdl_wire_decode_msg(sb.data, sb.size, &m, &err), PDL_ERR_PARSE);
    assert_string_equal(err.msg, "remote_blocks: block_notify_list[2] is a string, expected a non-negative integer");
    msgpack_sbuffer_destroy(&sb);
}

static void wrong_types_every_field(void **state)
{
    (void)state;
    uint64_t ids[] = {1, 2};
    tfield_t rel[] = {{.key = "type", .kind = V_STR, .s = "release"},
                      {.key = "transfer_id", .kind = V_STR, .s = "tx-1"},
                      {.key = "consumer_tp_size", .kind = V_INT, .i = 4},
                      {.key = "consumer_tp_rank", .kind = V_INT, .i = 1},
                      {.key = "status", .kind = V_STR, .s = "ok"},
                      {.key = "producer_tp_size", .kind = V_INT, .i = 2},
                      {.key = "producer_tp_rank", .kind = V_INT, .i = 0}};
    int n = check_wrong_types(rel, 7, try_msg, NULL);
    tfield_t rb[] = {{.key = "req_id", .kind = V_STR, .s = "r-1"},
                     {.key = "transfer_id", .kind = V_STR, .s = "tx-1"},
                     {.key = "block_notify_list", .kind = V_ARRAY_INTS, .arr = ids, .n = 2},
                     {.key = "decode_rank", .kind = V_INT, .i = 0},
                     {.key = "type", .kind = V_STR, .s = "remote_blocks"}};
    n += check_wrong_types(rb, 5, try_msg, NULL);
    tfield_t wd[] = {{.key = "type", .kind = V_STR, .s = "write_done"},
                     {.key = "transfer_id", .kind = V_STR, .s = "tx-1"},
                     {.key = "status", .kind = V_STR, .s = "ok"}};
    n += check_wrong_types(wd, 3, try_msg, NULL);
    assert_true(n > 100);
    const char *rel_req[] = {"transfer_id", NULL};
    check_missing(rel, 7, rel_req, try_msg);
    const char *rb_req[] = {"req_id", "block_notify_list", NULL};
    /* without req_id the map still has type remote_blocks, so the error names req_id */
    check_missing(rb, 5, rb_req, try_msg);
}

static void prefixes_and_trailing(void **state)
{
    (void)state;
    const char *golds[] = {GOLD_RELEASE, GOLD_RELEASE39, GOLD_RELEASE_FULL, GOLD_REMOTE_BLOCKS, GOLD_WRITE_DONE};
    for (size_t i = 0; i < sizeof(golds) / sizeof(golds[0]); i++) {
        uint8_t buf[512];
        size_t n = unhex(golds[i], buf, sizeof(buf));
        check_prefixes_and_trailing(buf, n, try_msg);
    }
}

static void hostile_sizes(void **state)
{
    (void)state;
    /* Headers announcing 4 G elements: refused before msgpack-c allocates for them. */
    const uint8_t arr32[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    const uint8_t map32[] = {0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'a'};
    pdl_error_t err = {0};
    assert_int_equal(try_msg(arr32, sizeof(arr32), &err), PDL_ERR_PARSE);
    assert_int_equal(try_msg(map32, sizeof(map32), &err), PDL_ERR_PARSE);
    /* 10 MB frames: garbage, a giant transfer id, and too many block ids */
    size_t big = 10u << 20;
    uint8_t *buf = malloc(big);
    assert_non_null(buf);
    memset(buf, 'a', big);
    assert_int_equal(try_msg(buf, big, &err), PDL_ERR_PARSE);
    memset(buf, 0xff, big);
    assert_int_equal(try_msg(buf, big, &err), PDL_ERR_PARSE);
    free(buf);

    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str(&pk, 4), msgpack_pack_str_body(&pk, "type", 4);
    msgpack_pack_str(&pk, 7), msgpack_pack_str_body(&pk, "release", 7);
    msgpack_pack_str(&pk, 11), msgpack_pack_str_body(&pk, "transfer_id", 11);
    char *id = malloc(big);
    memset(id, 'x', big);
    msgpack_pack_str(&pk, big), msgpack_pack_str_body(&pk, id, big);
    free(id);
    assert_int_equal(try_msg(sb.data, sb.size, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "transfer_id"));
    msgpack_sbuffer_destroy(&sb);

    msgpack_sbuffer_init(&sb);
    msgpack_pack_map(&pk, 3);
    msgpack_pack_str(&pk, 6), msgpack_pack_str_body(&pk, "req_id", 6);
    msgpack_pack_str(&pk, 1), msgpack_pack_str_body(&pk, "r", 1);
    msgpack_pack_str(&pk, 17), msgpack_pack_str_body(&pk, "block_notify_list", 17);
    size_t nblk = PDL_WIRE_MAX_BLOCKS + 1;
    msgpack_pack_array(&pk, nblk);
    for (size_t i = 0; i < nblk; i++)
        msgpack_pack_uint32(&pk, (uint32_t)i);
    msgpack_pack_str(&pk, 4), msgpack_pack_str_body(&pk, "type", 4);
    msgpack_pack_str(&pk, 13), msgpack_pack_str_body(&pk, "remote_blocks", 13);
    assert_int_equal(try_msg(sb.data, sb.size, &err), PDL_ERR_PARSE);
    msgpack_sbuffer_destroy(&sb);

    /* 17 MB: over the frame limit */
    big = PDL_WIRE_MAX_FRAME + 1;
    buf = calloc(1, big);
    assert_int_equal(try_msg(buf, big, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "limit"));
    free(buf);

    /* Nesting deeper than msgpack-c's parser stack, inside a map value */
    uint8_t deep[80];
    size_t k = 0;
    deep[k++] = 0x81, deep[k++] = 0xa1, deep[k++] = 'x';
    while (k < sizeof(deep) - 1)
        deep[k++] = 0x91;
    deep[k++] = 0x01;
    assert_int_equal(try_msg(deep, k, &err), PDL_ERR_PARSE);
}

static void max_block_list_round_trips(void **state)
{
    (void)state;
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_REMOTE_BLOCKS);
    strcpy(m.req_id, "r");
    strcpy(m.transfer_id, "t");
    m.num_blocks = PDL_WIRE_MAX_BLOCKS;
    m.block_ids = malloc(m.num_blocks * sizeof(uint32_t));
    for (size_t i = 0; i < m.num_blocks; i++)
        m.block_ids[i] = (uint32_t)(i * 4099u);
    assert_round_trips(&m);
    pdl_msg_clear(&m);
}

static void encoder_refuses_bad_fields(void **state)
{
    (void)state;
    pdl_msg_t m;
    pdl_bytes_t b;
    pdl_error_t err = {0};
    pdl_msg_init(&m, PDL_MSG_RELEASE);
    assert_int_equal(pdl_wire_encode_msg(&m, &b, &err), PDL_ERR_INVALID); /* no transfer id */
    strcpy(m.transfer_id, "t");
    m.consumer_tp_size = 0;
    assert_int_equal(pdl_wire_encode_msg(&m, &b, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "consumer_tp_size"));
    m.consumer_tp_size = 2;
    m.consumer_tp_rank = 2;
    assert_int_equal(pdl_wire_encode_msg(&m, &b, &err), PDL_ERR_INVALID);
    pdl_msg_init(&m, PDL_MSG_REMOTE_BLOCKS);
    strcpy(m.req_id, "r");
    assert_int_equal(pdl_wire_encode_msg(&m, &b, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "block_notify_list"));
    pdl_msg_init(&m, PDL_MSG_LEGACY);
    strcpy(m.transfer_id, "bad\xff");
    assert_int_equal(pdl_wire_encode_msg(&m, &b, &err), PDL_ERR_INVALID);
    m.type = (pdl_msg_type_t)99;
    assert_int_equal(pdl_wire_encode_msg(&m, &b, &err), PDL_ERR_INVALID);
}

static void keepalive_round_trip_and_names(void **state)
{
    (void)state;
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_KEEPALIVE);
    strcpy(m.transfer_id, "tx-k");
    m.consumer_tp_size = 4;
    m.consumer_tp_rank = 0;
    m.status = PDL_RELEASE_OK;
    assert_round_trips(&m);
    assert_string_equal(pdl_msg_type_name(PDL_MSG_KEEPALIVE), "keepalive");
    assert_string_equal(pdl_release_status_name(PDL_RELEASE_FAILED), "failed");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(golden_release),
        cmocka_unit_test(golden_remote_blocks_write_done),
        cmocka_unit_test(decode_golden_fields),
        cmocka_unit_test(release_defaults_when_absent),
        cmocka_unit_test(key_order_and_unknown_keys),
        cmocka_unit_test(bin_keys_and_values_accepted),
        cmocka_unit_test(untyped_remote_blocks),
        cmocka_unit_test(legacy_text_ids),
        cmocka_unit_test(semantic_errors_name_the_key),
        cmocka_unit_test(block_list_element_message),
        cmocka_unit_test(wrong_types_every_field),
        cmocka_unit_test(prefixes_and_trailing),
        cmocka_unit_test(hostile_sizes),
        cmocka_unit_test(max_block_list_round_trips),
        cmocka_unit_test(encoder_refuses_bad_fields),
        cmocka_unit_test(keepalive_round_trip_and_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
