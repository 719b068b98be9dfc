/*
 * msg.c -- the notify-channel messages (docs/protocol.md#notify-messages): release, remote_blocks,
 * write_done, keepalive and the legacy plain-text completion id.
 *
 * Decoding a frame follows upstream MoRIIO's `_handle_message`:
 *   1. If the frame is exactly one msgpack object spanning every byte and that object is a map, it is a
 *      typed message: `type` picks release / remote_blocks / write_done / keepalive; a map without
 *      `type` but with `req_id` is an untyped remote_blocks (older senders); anything else is an error.
 *      Errors inside a map never fall back to the text path.
 *   2. Otherwise (not msgpack, trailing bytes as in "tx-1" = fixint 0x74 + "x-1", or a msgpack scalar as
 *      in "7") the frame is a legacy completion: strict UTF-8, no NUL, 1..PDL_WIRE_ID_MAX bytes.
 *   3. Anything else is PDL_ERR_PARSE; the connector drops, counts and logs it.
 * Keys are matched as str, or as bin holding UTF-8 (upstream S2 normalises bytes keys and values to
 * str); other keys are ignored, as are keys that do not belong to the message's type. A known key that
 * appears twice is refused, since its meaning would depend on which copy a reader keeps.
 *
 * Encoding writes the keys in upstream's order, so the bytes equal msgpack-python's `dumps` of the same
 * dict: `type, transfer_id, <fields>` for send_notify() messages, and upstream's literal dict order
 * `req_id, transfer_id, block_notify_list, decode_rank, type` for remote_blocks. pdlink's optional keys
 * follow, written only when set.
 */
#include "pdlink/wire.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "wire/mp.h"

/* The element budget of a notify frame: the largest block list plus a generous number of keys. */
#define NOTIFY_MAX_ITEMS (PDL_WIRE_MAX_BLOCKS + 4096)

void pdl_msg_init(pdl_msg_t *m, pdl_msg_type_t type)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->consumer_tp_size = 1;
    m->consumer_tp_rank = -1;
    m->status = PDL_RELEASE_ABSENT;
    m->producer_tp_size = -1;
    m->producer_tp_rank = -1;
    m->decode_rank = 0;
}

void pdl_msg_clear(pdl_msg_t *m)
{
    if (m == NULL)
        return;
    free(m->block_ids);
    m->block_ids = NULL;
    m->num_blocks = 0;
}

const char *pdl_msg_type_name(pdl_msg_type_t t)
{
    switch (t) {
    case PDL_MSG_RELEASE: return "release";
    case PDL_MSG_REMOTE_BLOCKS: return "remote_blocks";
    case PDL_MSG_WRITE_DONE: return "write_done";
    case PDL_MSG_KEEPALIVE: return "keepalive";
    case PDL_MSG_LEGACY: return "legacy";
    }
    return "unknown";
}

const char *pdl_release_status_name(pdl_release_status_t s)
{
    switch (s) {
    case PDL_RELEASE_ABSENT: return "absent";
    case PDL_RELEASE_OK: return "ok";
    case PDL_RELEASE_FAILED: return "failed";
    }
    return "unknown";
}

bool pdl_msg_equal(const pdl_msg_t *a, const pdl_msg_t *b)
{
    if (a->type != b->type || strcmp(a->transfer_id, b->transfer_id) != 0)
        return false;
    switch (a->type) {
    case PDL_MSG_LEGACY:
        return true;
    case PDL_MSG_REMOTE_BLOCKS:
        return strcmp(a->req_id, b->req_id) == 0 && a->decode_rank == b->decode_rank &&
               a->num_blocks == b->num_blocks &&
               (a->num_blocks == 0 || memcmp(a->block_ids, b->block_ids, a->num_blocks * sizeof(uint32_t)) == 0);
    case PDL_MSG_RELEASE:
    case PDL_MSG_KEEPALIVE:
    case PDL_MSG_WRITE_DONE: {
        bool consumer_same = a->type == PDL_MSG_WRITE_DONE ||
                             (a->consumer_tp_size == b->consumer_tp_size && a->consumer_tp_rank == b->consumer_tp_rank);
        return consumer_same && a->status == b->status && a->producer_tp_size == b->producer_tp_size &&
               a->producer_tp_rank == b->producer_tp_rank;
    }
    }
    return false;
}

/* ---- decode ----------------------------------------------------------------------------------- */

enum {
    K_TYPE, K_TRANSFER_ID, K_CONSUMER_TP_SIZE, K_CONSUMER_TP_RANK, K_STATUS, K_PRODUCER_TP_SIZE,
    K_PRODUCER_TP_RANK, K_REQ_ID, K_BLOCK_NOTIFY_LIST, K_DECODE_RANK, K_COUNT
};
static const char *const key_names[K_COUNT] = {
    "type", "transfer_id", "consumer_tp_size", "consumer_tp_rank", "status", "producer_tp_size",
    "producer_tp_rank", "req_id", "block_notify_list", "decode_rank",
};

static pdl_status_t get_status(const msgpack_object *o, const char *ctx, pdl_release_status_t *out, pdl_error_t *err)
{
    const char *s;
    size_t n;
    if (!pdl__mp_token(o, &s, &n))
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: status is %s, expected \"ok\" or \"failed\"", ctx,
                             pdl__mp_kind(o));
    if (n == 2 && memcmp(s, "ok", 2) == 0)
        *out = PDL_RELEASE_OK;
    else if (n == 6 && memcmp(s, "failed", 6) == 0)
        *out = PDL_RELEASE_FAILED;
    else {
        char q[64];
        pdl__wire_quote(q, sizeof(q), s, n);
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: status must be \"ok\" or \"failed\", got \"%s\"", ctx, q);
    }
    return PDL_OK;
}

static pdl_status_t get_blocks(const msgpack_object *o, const char *ctx, pdl_msg_t *out, pdl_error_t *err)
{
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: block_notify_list is %s, expected an array of block ids",
                             ctx, pdl__mp_kind(o));
    size_t n = o->via.array.size;
    if (n == 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: block_notify_list is empty", ctx);
    if (n > PDL_WIRE_MAX_BLOCKS)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: block_notify_list has %zu entries, the limit is %d", ctx, n,
                             PDL_WIRE_MAX_BLOCKS);
    uint32_t *ids = malloc(n * sizeof(*ids));
    if (ids == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "%s: out of memory for %zu block ids", ctx, n);
    for (size_t i = 0; i < n; i++) {
        char key[48];
        snprintf(key, sizeof(key), "block_notify_list[%zu]", i);
        int64_t v;
        pdl_status_t st = pdl__mp_int(&o->via.array.ptr[i], ctx, key, 0, UINT32_MAX, &v, err);
        if (st != PDL_OK) {
            free(ids);
            return st;
        }
        ids[i] = (uint32_t)v;
    }
    out->block_ids = ids;
    out->num_blocks = n;
    return PDL_OK;
}

/* The fields release, keepalive and write_done share; `consumer` adds consumer_tp_size/rank. */
static pdl_status_t get_ack_fields(const msgpack_object *const *v, const char *ctx, bool consumer, pdl_msg_t *out,
                                   pdl_error_t *err)
{
    pdl_status_t st = PDL_OK;
    if (v[K_TRANSFER_ID] == NULL)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: transfer_id is missing", ctx);
    st = pdl__mp_str(v[K_TRANSFER_ID], ctx, "transfer_id", out->transfer_id, sizeof(out->transfer_id), false, err);
    if (st == PDL_OK && consumer && v[K_CONSUMER_TP_SIZE] != NULL)
        st = pdl__mp_int(v[K_CONSUMER_TP_SIZE], ctx, "consumer_tp_size", 1, PDL_WIRE_MAX_TP, &out->consumer_tp_size,
                         err);
    if (st == PDL_OK && consumer && v[K_CONSUMER_TP_RANK] != NULL)
        st = pdl__mp_int(v[K_CONSUMER_TP_RANK], ctx, "consumer_tp_rank", 0, out->consumer_tp_size - 1,
                         &out->consumer_tp_rank, err);
    if (st == PDL_OK && v[K_STATUS] != NULL)
        st = get_status(v[K_STATUS], ctx, &out->status, err);
    if (st == PDL_OK && v[K_PRODUCER_TP_SIZE] != NULL)
        st = pdl__mp_int(v[K_PRODUCER_TP_SIZE], ctx, "producer_tp_size", 1, PDL_WIRE_MAX_TP, &out->producer_tp_size,
                         err);
    if (st == PDL_OK && v[K_PRODUCER_TP_RANK] != NULL) {
        int64_t max = out->producer_tp_size > 0 ? out->producer_tp_size - 1 : PDL_WIRE_MAX_TP - 1;
        st = pdl__mp_int(v[K_PRODUCER_TP_RANK], ctx, "producer_tp_rank", 0, max, &out->producer_tp_rank, err);
    }
    return st;
}

static pdl_status_t decode_map(const msgpack_object *map, pdl_msg_t *out, pdl_error_t *err)
{
    const msgpack_object *v[K_COUNT] = {0};
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        for (int k = 0; k < K_COUNT; k++) {
            if (!pdl__mp_key_is(&kv->key, key_names[k]))
                continue;
            if (v[k] != NULL)
                return pdl_error_set(err, PDL_ERR_PARSE, "notify: duplicate key %s", key_names[k]);
            v[k] = &kv->val;
            break;
        }
    }

    pdl_msg_type_t type;
    if (v[K_TYPE] != NULL) {
        const char *s;
        size_t n;
        if (!pdl__mp_token(v[K_TYPE], &s, &n))
            return pdl_error_set(err, PDL_ERR_PARSE, "notify: type is %s, expected a string",
                                 pdl__mp_kind(v[K_TYPE]));
        if (n == 7 && memcmp(s, "release", 7) == 0)
            type = PDL_MSG_RELEASE;
        else if (n == 13 && memcmp(s, "remote_blocks", 13) == 0)
            type = PDL_MSG_REMOTE_BLOCKS;
        else if (n == 10 && memcmp(s, "write_done", 10) == 0)
            type = PDL_MSG_WRITE_DONE;
        else if (n == 9 && memcmp(s, "keepalive", 9) == 0)
            type = PDL_MSG_KEEPALIVE;
        else {
            char q[64];
            pdl__wire_quote(q, sizeof(q), s, n);
            return pdl_error_set(err, PDL_ERR_PARSE, "notify: unknown message type \"%s\"", q);
        }
    } else if (v[K_REQ_ID] != NULL) {
        type = PDL_MSG_REMOTE_BLOCKS; /* older upstream senders leave `type` out of the allocation message */
    } else {
        return pdl_error_set(err, PDL_ERR_PARSE, "notify: map has neither type nor req_id");
    }
    out->type = type;
    const char *ctx = pdl_msg_type_name(type);

    switch (type) {
    case PDL_MSG_RELEASE:
    case PDL_MSG_KEEPALIVE:
        return get_ack_fields(v, ctx, true, out, err);
    case PDL_MSG_WRITE_DONE:
        return get_ack_fields(v, ctx, false, out, err);
    case PDL_MSG_REMOTE_BLOCKS: {
        pdl_status_t st = PDL_OK;
        if (v[K_REQ_ID] == NULL)
            return pdl_error_set(err, PDL_ERR_PARSE, "%s: req_id is missing", ctx);
        if (v[K_BLOCK_NOTIFY_LIST] == NULL)
            return pdl_error_set(err, PDL_ERR_PARSE, "%s: block_notify_list is missing", ctx);
        st = pdl__mp_str(v[K_REQ_ID], ctx, "req_id", out->req_id, sizeof(out->req_id), false, err);
        /* Senders before transfer ids existed key the allocation by req_id alone. */
        if (st == PDL_OK && v[K_TRANSFER_ID] != NULL)
            st = pdl__mp_str(v[K_TRANSFER_ID], ctx, "transfer_id", out->transfer_id, sizeof(out->transfer_id), false,
                             err);
        if (st == PDL_OK && v[K_DECODE_RANK] != NULL)
            st = pdl__mp_int(v[K_DECODE_RANK], ctx, "decode_rank", 0, INT32_MAX, &out->decode_rank, err);
        /* pdlink addition: the sending consumer rank and its TP size (upstream ignores them). */
        if (st == PDL_OK && v[K_CONSUMER_TP_SIZE] != NULL)
            st = pdl__mp_int(v[K_CONSUMER_TP_SIZE], ctx, "consumer_tp_size", 1, PDL_WIRE_MAX_TP,
                             &out->consumer_tp_size, err);
        if (st == PDL_OK && v[K_CONSUMER_TP_RANK] != NULL)
            st = pdl__mp_int(v[K_CONSUMER_TP_RANK], ctx, "consumer_tp_rank", 0, out->consumer_tp_size - 1,
                             &out->consumer_tp_rank, err);
        if (st == PDL_OK)
            st = get_blocks(v[K_BLOCK_NOTIFY_LIST], ctx, out, err);
        return st;
    }
    case PDL_MSG_LEGACY:
        break;
    }
    return pdl_error_set(err, PDL_ERR_PARSE, "notify: internal error: unexpected type");
}

pdl_status_t pdl_wire_decode_msg(const void *buf, size_t len, pdl_msg_t *out, pdl_error_t *err)
{
    pdl_msg_init(out, PDL_MSG_LEGACY);
    if (buf == NULL && len > 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "notify: NULL buffer");
    if (len == 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "notify: empty frame");
    if (len > PDL_WIRE_MAX_FRAME)
        return pdl_error_set(err, PDL_ERR_PARSE, "notify: frame of %zu bytes exceeds the %u byte limit", len,
                             (unsigned)PDL_WIRE_MAX_FRAME);

    /* Through the guarded door; its error is not reported because a frame that is not one msgpack map
     * within limits may still be a legacy text id (below). */
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    if (pdl__mp_unpack(buf, len, NOTIFY_MAX_ITEMS, "notify", &u, NULL) == PDL_OK &&
        u.data.type == MSGPACK_OBJECT_MAP) {
        pdl_status_t st = decode_map(&u.data, out, err);
        msgpack_unpacked_destroy(&u);
        if (st != PDL_OK) {
            pdl_msg_clear(out);
            pdl_msg_init(out, PDL_MSG_LEGACY);
        }
        return st;
    }
    msgpack_unpacked_destroy(&u);
    /* A msgpack scalar such as the one-byte id "7" takes the text path, as upstream does; so does a
     * value msgpack-c refuses (nested deeper than its 32-level stack), which is then not UTF-8. The
     * scan again (cheap, no allocation) only to say why the frame is no map. */
    pdl__mp_scan_t scan = pdl__mp_scan(buf, len, NOTIFY_MAX_ITEMS, NULL);

    /* Legacy completion: the frame's text is a transfer id. */
    const char *why = scan == PDL__MP_ONE        ? "a msgpack value that is not a map"
                      : scan == PDL__MP_TRAILING ? "not one msgpack map (bytes follow the first object)"
                      : scan == PDL__MP_TOO_MANY ? "not a msgpack map within limits"
                                                 : "not a msgpack map";
    if (len > PDL_WIRE_ID_MAX)
        return pdl_error_set(err, PDL_ERR_PARSE,
                             "notify: frame of %zu bytes is %s, and too long for a legacy transfer id (limit %d)", len,
                             why, PDL_WIRE_ID_MAX);
    if (memchr(buf, '\0', len) != NULL)
        return pdl_error_set(err, PDL_ERR_PARSE, "notify: frame is %s, and contains a NUL byte so it is no transfer id",
                             why);
    if (!pdl__utf8_valid(buf, len))
        return pdl_error_set(err, PDL_ERR_PARSE, "notify: frame of %zu bytes is %s, nor valid UTF-8 text", len, why);
    memcpy(out->transfer_id, buf, len);
    out->transfer_id[len] = '\0';
    return PDL_OK;
}

/* ---- encode ----------------------------------------------------------------------------------- */

static pdl_status_t check_ack_fields(const pdl_msg_t *m, const char *ctx, bool consumer, pdl_error_t *err)
{
    pdl_status_t st = pdl__text_check(m->transfer_id, sizeof(m->transfer_id), false, ctx, "transfer_id", err);
    if (st != PDL_OK)
        return st;
    if (consumer) {
        if (m->consumer_tp_size < 1 || m->consumer_tp_size > PDL_WIRE_MAX_TP)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s: consumer_tp_size must be in [1, %d], got %" PRId64, ctx,
                                 PDL_WIRE_MAX_TP, m->consumer_tp_size);
        if (m->consumer_tp_rank != -1 && (m->consumer_tp_rank < 0 || m->consumer_tp_rank >= m->consumer_tp_size))
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "%s: consumer_tp_rank must be -1 (absent) or in [0, %" PRId64 "), got %" PRId64, ctx,
                                 m->consumer_tp_size, m->consumer_tp_rank);
    }
    if (m->status != PDL_RELEASE_ABSENT && m->status != PDL_RELEASE_OK && m->status != PDL_RELEASE_FAILED)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: status %d is not a pdl_release_status_t", ctx, (int)m->status);
    if (m->producer_tp_size != -1 && (m->producer_tp_size < 1 || m->producer_tp_size > PDL_WIRE_MAX_TP))
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: producer_tp_size must be -1 (absent) or in [1, %d], got %" PRId64,
                             ctx, PDL_WIRE_MAX_TP, m->producer_tp_size);
    int64_t pmax = m->producer_tp_size > 0 ? m->producer_tp_size : PDL_WIRE_MAX_TP;
    if (m->producer_tp_rank != -1 && (m->producer_tp_rank < 0 || m->producer_tp_rank >= pmax))
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "%s: producer_tp_rank must be -1 (absent) or in [0, %" PRId64 "), got %" PRId64, ctx, pmax,
                             m->producer_tp_rank);
    return PDL_OK;
}

static void enc_ack_tail(pdl__mp_enc_t *e, const pdl_msg_t *m)
{
    if (m->status != PDL_RELEASE_ABSENT) {
        pdl__enc_str(e, "status");
        pdl__enc_str(e, m->status == PDL_RELEASE_OK ? "ok" : "failed");
    }
    if (m->producer_tp_size != -1) {
        pdl__enc_str(e, "producer_tp_size");
        pdl__enc_int(e, m->producer_tp_size);
    }
    if (m->producer_tp_rank != -1) {
        pdl__enc_str(e, "producer_tp_rank");
        pdl__enc_int(e, m->producer_tp_rank);
    }
}

static size_t ack_tail_count(const pdl_msg_t *m)
{
    return (m->status != PDL_RELEASE_ABSENT) + (m->producer_tp_size != -1) + (m->producer_tp_rank != -1);
}

pdl_status_t pdl_wire_encode_msg(const pdl_msg_t *m, pdl_bytes_t *out, pdl_error_t *err)
{
    if (m == NULL || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "notify encode: NULL argument");
    out->data = NULL;
    out->len = 0;
    const char *ctx = pdl_msg_type_name(m->type);
    pdl_status_t st;
    pdl__mp_enc_t e;

    switch (m->type) {
    case PDL_MSG_LEGACY: {
        st = pdl__text_check(m->transfer_id, sizeof(m->transfer_id), false, ctx, "transfer_id", err);
        if (st != PDL_OK)
            return st;
        size_t n = strlen(m->transfer_id);
        out->data = malloc(n);
        if (out->data == NULL)
            return pdl_error_set(err, PDL_ERR_NOMEM, "legacy: out of memory");
        memcpy(out->data, m->transfer_id, n);
        out->len = n;
        return PDL_OK;
    }
    case PDL_MSG_RELEASE:
    case PDL_MSG_KEEPALIVE:
    case PDL_MSG_WRITE_DONE: {
        bool consumer = m->type != PDL_MSG_WRITE_DONE;
        st = check_ack_fields(m, ctx, consumer, err);
        if (st != PDL_OK)
            return st;
        pdl__enc_init(&e);
        pdl__enc_map(&e, 2 + (consumer ? 1 + (m->consumer_tp_rank != -1) : 0) + ack_tail_count(m));
        pdl__enc_str(&e, "type");
        pdl__enc_str(&e, ctx);
        pdl__enc_str(&e, "transfer_id");
        pdl__enc_str(&e, m->transfer_id);
        if (consumer) {
            pdl__enc_str(&e, "consumer_tp_size");
            pdl__enc_int(&e, m->consumer_tp_size);
            if (m->consumer_tp_rank != -1) {
                pdl__enc_str(&e, "consumer_tp_rank");
                pdl__enc_int(&e, m->consumer_tp_rank);
            }
        }
        enc_ack_tail(&e, m);
        return pdl__enc_finish(&e, ctx, out, err);
    }
    case PDL_MSG_REMOTE_BLOCKS: {
        st = pdl__text_check(m->req_id, sizeof(m->req_id), false, ctx, "req_id", err);
        if (st == PDL_OK)
            st = pdl__text_check(m->transfer_id, sizeof(m->transfer_id), true, ctx, "transfer_id", err);
        if (st != PDL_OK)
            return st;
        if (m->num_blocks == 0 || m->block_ids == NULL)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s: block_notify_list is empty", ctx);
        if (m->num_blocks > PDL_WIRE_MAX_BLOCKS)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s: %zu block ids exceed the limit of %d", ctx, m->num_blocks,
                                 PDL_WIRE_MAX_BLOCKS);
        if (m->decode_rank < 0 || m->decode_rank > INT32_MAX)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s: decode_rank must be >= 0, got %" PRId64, ctx,
                                 m->decode_rank);
        /* pdlink addition: consumer_tp_size/rank, written only when the rank is set (a pdlink sender). */
        bool has_consumer = m->consumer_tp_rank != -1;
        if (has_consumer && (m->consumer_tp_size < 1 || m->consumer_tp_size > PDL_WIRE_MAX_TP ||
                             m->consumer_tp_rank < 0 || m->consumer_tp_rank >= m->consumer_tp_size))
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "%s: consumer_tp_rank %" PRId64 " / consumer_tp_size %" PRId64 " out of range", ctx,
                                 m->consumer_tp_rank, m->consumer_tp_size);
        bool has_tid = m->transfer_id[0] != '\0';
        pdl__enc_init(&e);
        pdl__enc_map(&e, 4 + has_tid + 2 * has_consumer);
        pdl__enc_str(&e, "req_id");
        pdl__enc_str(&e, m->req_id);
        if (has_tid) {
            pdl__enc_str(&e, "transfer_id");
            pdl__enc_str(&e, m->transfer_id);
        }
        pdl__enc_str(&e, "block_notify_list");
        pdl__enc_array(&e, m->num_blocks);
        for (size_t i = 0; i < m->num_blocks; i++)
            pdl__enc_uint(&e, m->block_ids[i]);
        pdl__enc_str(&e, "decode_rank");
        pdl__enc_int(&e, m->decode_rank);
        if (has_consumer) {
            pdl__enc_str(&e, "consumer_tp_size");
            pdl__enc_int(&e, m->consumer_tp_size);
            pdl__enc_str(&e, "consumer_tp_rank");
            pdl__enc_int(&e, m->consumer_tp_rank);
        }
        pdl__enc_str(&e, "type");
        pdl__enc_str(&e, ctx);
        return pdl__enc_finish(&e, ctx, out, err);
    }
    }
    return pdl_error_set(err, PDL_ERR_INVALID, "notify encode: unknown message type %d", (int)m->type);
}
