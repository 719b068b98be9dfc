/*
 * tcp_wire.h -- the frames of the tcp backend's data socket (see docs/engine.md, "Wire format").
 *
 * Every integer is little-endian. A connection starts with a HELLO request naming the engine the
 * initiator expects; then READ and WRITE requests follow, one response each, in order.
 *
 *   request  (40 bytes): magic "PDLD" u32 | version u16 | op u16 | nseg u32 | grant_len u32
 *                        | reg_id u64 | total_len u64 | tag u64
 *            then nseg × { offset u64, length u64 }, then grant_len (0..512) bytes naming the grant
 *            the request is made under (version 2; docs/security.md), then for WRITE total_len payload
 *            bytes, for HELLO total_len bytes of the expected engine key (nseg = 0, grant_len = 0).
 *   response (32 bytes): magic "PDLR" u32 | version u16 | reserved u16 | status i32 | msg_len u32
 *                        | tag u64 | payload_len u64
 *            then msg_len bytes of error text (status != 0), then for a successful READ payload_len
 *            bytes: the segments' bytes in request order.
 *
 * Authenticated mode (an engine created with a key; docs/security.md) replaces HELLO with two steps
 * that must come first on the connection:
 *   HELLO_AUTH request: nseg = 0, grant_len = 0, total_len = key length + 32: the expected engine key,
 *            then the initiator's nonce Nc. Response: status 0 and payload_len 64: the owner's nonce Ns,
 *            then MAC("data-server", key, Nc, Ns) -- or an error status (wrong key, not in
 *            authenticated mode).
 *   AUTH request: nseg = 0, grant_len = 0, total_len = 32: MAC("data-client", key, Nc, Ns). Response:
 *            status 0; or PDL_ERR_DENIED, and the owner closes the connection.
 * MAC = pdl_auth_mac (HMAC-SHA-256 under the data key derived from the cluster secret). Any other
 * request before a good AUTH is answered PDL_ERR_DENIED and the connection closed; an owner without a
 * key answers HELLO_AUTH with PDL_ERR_MISMATCH. Nonces are fresh per connection, so a recorded
 * exchange cannot be replayed, and the labels differ, so the owner's MAC cannot stand for the client's.
 *
 * Limits, checked by the owner before anything is served: nseg <= PDL_TCP_MAX_SEGS, total_len <=
 * PDL_TCP_MAX_REQ_BYTES and equal to the sum of the segment lengths. A frame breaking these is hostile
 * and closes the connection; a well-formed request naming an unknown registration or a range outside
 * it gets an error response (the connection stays usable).
 */
#ifndef PDL_ENGINE_TCP_WIRE_H
#define PDL_ENGINE_TCP_WIRE_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

#define PDL_TCP_REQ_MAGIC 0x444c4450u  /* "PDLD" as little-endian bytes */
#define PDL_TCP_RESP_MAGIC 0x524c4450u /* "PDLR" */
/* 2: the reserved u32 became grant_len. A version-1 peer sends 0 there and would be understood, but it
 * would not understand a version-2 request that names a grant, so the versions are kept apart. */
#define PDL_TCP_VERSION 2
#define PDL_TCP_REQ_HDR 40
#define PDL_TCP_RESP_HDR 32
#define PDL_TCP_SEG 16
/* 4096 segments = a 64 KiB segment table; enough for a whole batch of small blocks in one request. */
#define PDL_TCP_MAX_SEGS 4096
/* A request moves at most 256 MiB: large enough that per-request overhead vanishes, small enough that
 * a refused WRITE can be drained. */
#define PDL_TCP_MAX_REQ_BYTES (256ull << 20)
#define PDL_TCP_MAX_MSG 512
#define PDL_TCP_MAX_KEY 255

enum { PDL_TCP_OP_READ = 1, PDL_TCP_OP_WRITE = 2, PDL_TCP_OP_HELLO = 3, PDL_TCP_OP_HELLO_AUTH = 4, PDL_TCP_OP_AUTH = 5 };
#define PDL_TCP_AUTH_LEN 32 /* a nonce, a MAC (PDL_AUTH_KEY_LEN) */
#define PDL_TCP_LABEL_SERVER "data-server"
#define PDL_TCP_LABEL_CLIENT "data-client"

typedef struct pdl_tcp_req {
    uint32_t magic;
    uint16_t version, op;
    uint32_t nseg, grant_len;
    uint64_t reg_id, total_len, tag;
} pdl_tcp_req_t;

typedef struct pdl_tcp_resp {
    uint32_t magic;
    uint16_t version, reserved;
    int32_t status;
    uint32_t msg_len;
    uint64_t tag, payload_len;
} pdl_tcp_resp_t;

static inline void pdl_tcp_put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}
static inline void pdl_tcp_put16(uint8_t *p, uint16_t v)
{
    v = htole16(v);
    memcpy(p, &v, 2);
}
static inline void pdl_tcp_put64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}
static inline uint32_t pdl_tcp_get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}
static inline uint16_t pdl_tcp_get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return le16toh(v);
}
static inline uint64_t pdl_tcp_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

static inline void pdl_tcp_req_encode(uint8_t *b, const pdl_tcp_req_t *r)
{
    pdl_tcp_put32(b, r->magic);
    pdl_tcp_put16(b + 4, r->version);
    pdl_tcp_put16(b + 6, r->op);
    pdl_tcp_put32(b + 8, r->nseg);
    pdl_tcp_put32(b + 12, r->grant_len);
    pdl_tcp_put64(b + 16, r->reg_id);
    pdl_tcp_put64(b + 24, r->total_len);
    pdl_tcp_put64(b + 32, r->tag);
}

static inline void pdl_tcp_req_decode(const uint8_t *b, pdl_tcp_req_t *r)
{
    r->magic = pdl_tcp_get32(b);
    r->version = pdl_tcp_get16(b + 4);
    r->op = pdl_tcp_get16(b + 6);
    r->nseg = pdl_tcp_get32(b + 8);
    r->grant_len = pdl_tcp_get32(b + 12);
    r->reg_id = pdl_tcp_get64(b + 16);
    r->total_len = pdl_tcp_get64(b + 24);
    r->tag = pdl_tcp_get64(b + 32);
}

static inline void pdl_tcp_resp_encode(uint8_t *b, const pdl_tcp_resp_t *r)
{
    pdl_tcp_put32(b, r->magic);
    pdl_tcp_put16(b + 4, r->version);
    pdl_tcp_put16(b + 6, r->reserved);
    pdl_tcp_put32(b + 8, (uint32_t)r->status);
    pdl_tcp_put32(b + 12, r->msg_len);
    pdl_tcp_put64(b + 16, r->tag);
    pdl_tcp_put64(b + 24, r->payload_len);
}

static inline void pdl_tcp_resp_decode(const uint8_t *b, pdl_tcp_resp_t *r)
{
    r->magic = pdl_tcp_get32(b);
    r->version = pdl_tcp_get16(b + 4);
    r->reserved = pdl_tcp_get16(b + 6);
    r->status = (int32_t)pdl_tcp_get32(b + 8);
    r->msg_len = pdl_tcp_get32(b + 12);
    r->tag = pdl_tcp_get64(b + 16);
    r->payload_len = pdl_tcp_get64(b + 24);
}

#endif /* PDL_ENGINE_TCP_WIRE_H */
