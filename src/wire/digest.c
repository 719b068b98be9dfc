/*
 * digest.c -- the KV digest exchange of READ mode (docs/integrity.md): a pdlink consumer rank asks a
 * producer rank for the digests it took of a held transfer, on the producer's handshake port.
 *
 * Request: one frame, a msgpack map {type: "pdlink_get_digests", transfer_id}. Sent only to a producer
 * whose handshake metadata carries `kv_digest` (pdl_agent_meta_t): upstream MoRIIO and older pdlink
 * never see it, since they drop unknown handshake requests without an answer.
 * Reply: one frame, a map {transfer_id, status: "ok" | "unknown" | "off", stride, num_layers,
 * num_blocks, num_heads, digests}; `digests` is num_layers x num_blocks x num_heads little-endian
 * uint64, layer-major, then the block's position in the producer's list of the transfer, then the
 * producer rank's own head index. With a stride above 1 only the (layer, block) pairs
 * pdl_layout_digest_sampled picks carry a digest (the others are 0 and never compared).
 * Everything is bounded (PDL_WIRE_MAX_FRAME) and checked like every frame from the network.
 */
#include "pdlink/wire.h"

#include <stdlib.h>
#include <string.h>

#include "wire/mp.h"

#define DG_CTX "kv digests"
#define DG_MAX_ITEMS 64

static const char *const dg_status_names[] = {"ok", "unknown", "off"};

const char *pdl_digest_status_name(pdl_digest_status_t s)
{
    return (unsigned)s < sizeof(dg_status_names) / sizeof(dg_status_names[0]) ? dg_status_names[s] : "invalid";
}

pdl_status_t pdl_wire_encode_digest_request(const char *transfer_id, pdl_bytes_t *out, pdl_error_t *err)
{
    pdl_status_t st = pdl__text_check(transfer_id, PDL_WIRE_ID_MAX + 1, false, DG_CTX, "transfer_id", err);
    if (st != PDL_OK)
        return st;
    pdl__mp_enc_t e;
    pdl__enc_init(&e);
    pdl__enc_map(&e, 2);
    pdl__enc_str(&e, "type");
    pdl__enc_str(&e, PDL_WIRE_GET_DIGESTS);
    pdl__enc_str(&e, "transfer_id");
    pdl__enc_str(&e, transfer_id);
    return pdl__enc_finish(&e, DG_CTX, out, err);
}

/* Find each of keys[0..n) in the map (duplicates refused); absent ones stay NULL. */
static pdl_status_t dg_keys(const msgpack_object *map, const char *const *keys, int n, const msgpack_object **v,
                            pdl_error_t *err)
{
    if (map->type != MSGPACK_OBJECT_MAP)
        return pdl_error_set(err, PDL_ERR_PARSE, DG_CTX ": payload is %s, expected a map", pdl__mp_kind(map));
    for (uint32_t i = 0; i < map->via.map.size; i++)
        for (int k = 0; k < n; k++) {
            if (!pdl__mp_key_is(&map->via.map.ptr[i].key, keys[k]))
                continue;
            if (v[k] != NULL)
                return pdl_error_set(err, PDL_ERR_PARSE, DG_CTX ": duplicate key %s", keys[k]);
            v[k] = &map->via.map.ptr[i].val;
        }
    for (int k = 0; k < n; k++)
        if (v[k] == NULL)
            return pdl_error_set(err, PDL_ERR_PARSE, DG_CTX ": %s is missing", keys[k]);
    return PDL_OK;
}

pdl_status_t pdl_wire_decode_digest_request(const void *buf, size_t len, char *transfer_id, size_t cap,
                                            pdl_error_t *err)
{
    static const char *const keys[] = {"type", "transfer_id"};
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    const msgpack_object *v[2] = {0};
    char type[32];
    pdl_status_t st = pdl__mp_unpack(buf, len, DG_MAX_ITEMS, DG_CTX, &u, err);
    if (st == PDL_OK)
        st = dg_keys(&u.data, keys, 2, v, err);
    if (st == PDL_OK)
        st = pdl__mp_str(v[0], DG_CTX, "type", type, sizeof(type), false, err);
    if (st == PDL_OK && strcmp(type, PDL_WIRE_GET_DIGESTS) != 0)
        st = pdl_error_set(err, PDL_ERR_PARSE, DG_CTX ": type is \"%s\", expected " PDL_WIRE_GET_DIGESTS, type);
    if (st == PDL_OK)
        st = pdl__mp_str(v[1], DG_CTX, "transfer_id", transfer_id, cap, false, err);
    msgpack_unpacked_destroy(&u);
    return st;
}

bool pdl_wire_is_digest_request(const void *buf, size_t len)
{
    /* The type string appears verbatim in every request; a cheap look before a decode. */
    size_t n = strlen(PDL_WIRE_GET_DIGESTS);
    for (size_t i = 0; len >= n && i <= len - n && i < 32; i++)
        if (memcmp((const char *)buf + i, PDL_WIRE_GET_DIGESTS, n) == 0)
            return true;
    return false;
}

/* The reply's bytes of digests for its counts, or 0 when they overflow the frame limit. */
static size_t dg_bytes(const pdl_digest_reply_t *r)
{
    uint64_t n = (uint64_t)r->num_layers * r->num_heads;
    if (r->num_blocks != 0 && n > PDL_WIRE_MAX_FRAME / 8 / r->num_blocks)
        return 0;
    return (size_t)(n * r->num_blocks * 8);
}

pdl_status_t pdl_wire_encode_digest_reply(const pdl_digest_reply_t *r, pdl_bytes_t *out, pdl_error_t *err)
{
    pdl_status_t st = pdl__text_check(r->transfer_id, sizeof(r->transfer_id), false, DG_CTX, "transfer_id", err);
    if (st != PDL_OK)
        return st;
    size_t want = r->status == PDL_DIGEST_OK ? dg_bytes(r) : 0;
    if ((unsigned)r->status > PDL_DIGEST_OFF || r->digests.len != want || (want == 0 && r->status == PDL_DIGEST_OK &&
                                                                            r->num_blocks && r->num_layers))
        return pdl_error_set(err, PDL_ERR_INVALID, DG_CTX ": %zu digest bytes for %u layers x %llu blocks x %u heads "
                             "(status %s)", r->digests.len, r->num_layers, (unsigned long long)r->num_blocks,
                             r->num_heads, pdl_digest_status_name(r->status));
    pdl__mp_enc_t e;
    pdl__enc_init(&e);
    pdl__enc_map(&e, 7);
    pdl__enc_str(&e, "transfer_id");
    pdl__enc_str(&e, r->transfer_id);
    pdl__enc_str(&e, "status");
    pdl__enc_str(&e, pdl_digest_status_name(r->status));
    pdl__enc_str(&e, "stride");
    pdl__enc_uint(&e, r->stride);
    pdl__enc_str(&e, "num_layers");
    pdl__enc_uint(&e, r->num_layers);
    pdl__enc_str(&e, "num_blocks");
    pdl__enc_uint(&e, r->num_blocks);
    pdl__enc_str(&e, "num_heads");
    pdl__enc_uint(&e, r->num_heads);
    pdl__enc_str(&e, "digests");
    pdl__enc_bin(&e, r->digests.data, r->digests.len);
    return pdl__enc_finish(&e, DG_CTX, out, err);
}

static pdl_status_t dg_reply_fields(const msgpack_object *map, pdl_digest_reply_t *out, pdl_error_t *err)
{
    static const char *const keys[] = {"transfer_id", "status", "stride", "num_layers", "num_blocks", "num_heads",
                                       "digests"};
    const msgpack_object *v[7] = {0};
    char status[16];
    int64_t stride = 0, layers = 0, blocks = 0, heads = 0;
    pdl_status_t st = dg_keys(map, keys, 7, v, err);
    if (st == PDL_OK)
        st = pdl__mp_str(v[0], DG_CTX, "transfer_id", out->transfer_id, sizeof(out->transfer_id), false, err);
    if (st == PDL_OK)
        st = pdl__mp_str(v[1], DG_CTX, "status", status, sizeof(status), false, err);
    if (st == PDL_OK)
        st = pdl__mp_int(v[2], DG_CTX, "stride", 1, 1 << 20, &stride, err);
    if (st == PDL_OK)
        st = pdl__mp_int(v[3], DG_CTX, "num_layers", 0, 1 << 20, &layers, err);
    if (st == PDL_OK)
        st = pdl__mp_int(v[4], DG_CTX, "num_blocks", 0, 1 << 30, &blocks, err);
    if (st == PDL_OK)
        st = pdl__mp_int(v[5], DG_CTX, "num_heads", 0, 1 << 16, &heads, err);
    if (st == PDL_OK)
        st = pdl__mp_bin(v[6], DG_CTX, "digests", PDL_WIRE_MAX_FRAME, &out->digests, err);
    if (st != PDL_OK)
        return st;
    int s = -1;
    for (int i = 0; i <= PDL_DIGEST_OFF; i++)
        if (strcmp(status, dg_status_names[i]) == 0)
            s = i;
    if (s < 0)
        return pdl_error_set(err, PDL_ERR_PARSE, DG_CTX ": status \"%s\" is not ok, unknown or off", status);
    out->status = (pdl_digest_status_t)s;
    out->stride = (uint32_t)stride;
    out->num_layers = (uint32_t)layers;
    out->num_blocks = (uint64_t)blocks;
    out->num_heads = (uint32_t)heads;
    size_t want = out->status == PDL_DIGEST_OK ? dg_bytes(out) : 0;
    if (out->digests.len != want)
        return pdl_error_set(err, PDL_ERR_PARSE, DG_CTX ": %zu digest bytes, expected %zu (%u layers x %llu blocks x "
                             "%u heads x 8)", out->digests.len, want, out->num_layers,
                             (unsigned long long)out->num_blocks, out->num_heads);
    return PDL_OK;
}

pdl_status_t pdl_wire_decode_digest_reply(const void *buf, size_t len, pdl_digest_reply_t *out, pdl_error_t *err)
{
    memset(out, 0, sizeof(*out));
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    pdl_status_t st = pdl__mp_unpack(buf, len, DG_MAX_ITEMS, DG_CTX, &u, err);
    if (st == PDL_OK)
        st = dg_reply_fields(&u.data, out, err);
    msgpack_unpacked_destroy(&u);
    if (st != PDL_OK)
        pdl_digest_reply_clear(out);
    return st;
}

void pdl_digest_reply_clear(pdl_digest_reply_t *r)
{
    if (r != NULL)
        pdl_bytes_free(&r->digests);
}

uint64_t pdl_digest_reply_get(const pdl_digest_reply_t *r, uint32_t layer, uint64_t pos, uint32_t head)
{
    uint64_t i = ((uint64_t)layer * r->num_blocks + pos) * r->num_heads + head;
    const uint8_t *p = r->digests.data + i * 8;
    uint64_t v = 0;
    for (int b = 7; b >= 0; b--)
        v = (v << 8) | p[b];
    return v;
}

void pdl_digest_put(uint8_t *digests, uint64_t index, uint64_t value)
{
    for (int b = 0; b < 8; b++)
        digests[index * 8 + (uint64_t)b] = (uint8_t)(value >> (8 * b));
}
