/*
 * wire.h -- codecs of everything pdlink says on the control plane (docs/protocol.md, docs/wire.md). No sockets.
 *
 * Layer: wire, above layout (includes status.h and types.h). Pure functions: no I/O, no logging, no
 * global state, so every function is thread-safe on distinct structs.
 *
 * Encoders produce exactly the bytes msgpack-python's `msgpack.dumps(dict)` produces for the same map
 * (str keys as str, ints in their smallest form, bytes as bin), so an upstream Python peer reads them.
 * Decoders take hostile input: they are bounds-checked, type-checked, ignore unknown keys, never depend
 * on key order, and fail with PDL_ERR_PARSE and a message naming the key and what was wrong.
 *
 * Error convention (every codec, unless its comment says otherwise):
 *   encode: PDL_ERR_INVALID for a NULL argument or a field it may not send (empty or over-long text,
 *           invalid UTF-8, a value out of range); PDL_ERR_NOMEM when the output cannot be allocated.
 *           On success the caller owns out->data and frees it with pdl_bytes_free; on failure out holds
 *           nothing (it is reset to {NULL, 0} once the pointers were checked).
 *   decode: PDL_ERR_INVALID for buf NULL with len > 0; PDL_ERR_PARSE for anything malformed (empty
 *           frame, over PDL_WIRE_MAX_FRAME, not exactly one msgpack object, wrong types, missing keys,
 *           a known key given twice, bounds exceeded); PDL_ERR_NOMEM when a copy cannot be allocated.
 *           `out` must not be NULL and is overwritten without being freed, so it must not own heap
 *           parts on entry. On failure `out` owns nothing. `buf` is only read during the call.
 * Decoded structs own their heap parts; release them with the matching *_clear function.
 */
#ifndef PDLINK_WIRE_H
#define PDLINK_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"
#include "pdlink/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds that decoders enforce; a longer field is refused, never truncated. */
#define PDL_WIRE_ID_MAX 512         /* transfer_id, req_id, engine_id (bytes, without NUL) */
#define PDL_WIRE_HOST_MAX 256       /* host names and addresses */
#define PDL_WIRE_MAX_BLOCKS 1048576 /* block ids in one remote_blocks */
#define PDL_WIRE_MAX_FRAME (16u << 20)
/* Not in upstream MoRIIO, which has no limits: the bounds below keep hostile input cheap to refuse. */
#define PDL_WIRE_MAX_TP 65536              /* any TP size or rank carried on the wire */
#define PDL_WIRE_MAX_LAYERS 4096           /* layers in one layer map */
#define PDL_WIRE_MAX_LAYER_DESCS 16        /* descriptors per layer */
#define PDL_WIRE_MAX_DESC_BYTES 65536      /* one packed descriptor; also agent_metadata */
#define PDL_WIRE_MAX_BASE_ADDRS 65536      /* entries of kv_caches_base_addr */
#define PDL_WIRE_RID_MAX 4096              /* request ids (bytes, without NUL) */

/* ---- notify channel ------------------------------------------------------------------------- */

/*
 * A notify-channel message: what a consumer sends a producer (release, remote_blocks, keepalive) or a
 * producer a consumer (write_done), plus the bare transfer id older senders use (LEGACY).
 */
typedef enum pdl_msg_type {
    PDL_MSG_RELEASE = 1,
    PDL_MSG_REMOTE_BLOCKS = 2,
    PDL_MSG_WRITE_DONE = 3,
    PDL_MSG_KEEPALIVE = 4, /* pdlink-only: extends a lease; sent only to peers that speak pdlink */
    PDL_MSG_LEGACY = 5,    /* a plain UTF-8 transfer id (not a msgpack map) */
} pdl_msg_type_t;

/* The optional `status` of release and write_done ("ok" / "failed"). */
typedef enum pdl_release_status {
    PDL_RELEASE_ABSENT = 0, /* key not present: an upstream peer; means ok */
    PDL_RELEASE_OK = 1,
    PDL_RELEASE_FAILED = 2,
} pdl_release_status_t;

/*
 * One decoded or to-be-encoded notify message; which fields count depends on `type` (the comments
 * group them). Integer fields use the values noted as "absent" when the key is not on the wire.
 * `block_ids` (remote_blocks only, `num_blocks` entries) is malloc'ed and owned by the struct: free
 * it with pdl_msg_clear. For an encode the caller may point it at its own array and not call
 * pdl_msg_clear.
 */
typedef struct pdl_msg {
    pdl_msg_type_t type;
    char transfer_id[PDL_WIRE_ID_MAX + 1];
    /* release / keepalive */
    int64_t consumer_tp_size;  /* >= 1; 1 when absent */
    int64_t consumer_tp_rank;  /* -1 when absent */
    pdl_release_status_t status;
    int64_t producer_tp_size;  /* -1 when absent */
    int64_t producer_tp_rank;  /* -1 when absent */
    /* remote_blocks */
    char req_id[PDL_WIRE_ID_MAX + 1];
    int64_t decode_rank;       /* decode DP rank; 0 when absent */
    /* remote_blocks also carries consumer_tp_size/rank (not in upstream MoRIIO, which ignores the
     * extra keys): encoded only when consumer_tp_rank != -1, decoded when present */
    uint32_t *block_ids;       /* owned */
    size_t num_blocks;
} pdl_msg_t;

/*
 * Zero a message of `type` with every optional field "absent" (consumer_tp_size 1, the ranks and
 * producer_tp_size -1, status ABSENT, decode_rank 0). `m` must not be NULL; nothing is freed, so call
 * it on a fresh struct or after pdl_msg_clear.
 */
void pdl_msg_init(pdl_msg_t *m, pdl_msg_type_t type);
/* Free block_ids and set num_blocks to 0; the other fields are kept. A NULL m is ignored. */
void pdl_msg_clear(pdl_msg_t *m);

/*
 * Encode a typed message into *out (LEGACY encodes the raw transfer id bytes, not msgpack). Only keys
 * that are present are written: release/keepalive always write consumer_tp_size, then
 * consumer_tp_rank, status, producer_tp_size/rank when set; write_done writes status and
 * producer_tp_size/rank when set; remote_blocks writes req_id, transfer_id (when non-empty),
 * block_notify_list, decode_rank, consumer_tp_size/rank (when consumer_tp_rank != -1), type, in
 * upstream's order. PDL_ERR_INVALID also for an unknown type, an empty transfer_id (req_id for
 * remote_blocks), consumer_tp_size outside [1, PDL_WIRE_MAX_TP], a rank outside its size, an empty or
 * over-long block list, or a negative decode_rank. Ownership and other errors: see the top of the file.
 */
pdl_status_t pdl_wire_encode_msg(const pdl_msg_t *m, pdl_bytes_t *out, pdl_error_t *err);

/*
 * Decode one notify frame. A frame that decodes as exactly one msgpack map (consuming the whole frame)
 * is typed; a map without `type` but with `req_id` is an untyped remote_blocks; anything else that is
 * valid UTF-8 without NUL (and non-empty, <= PDL_WIRE_ID_MAX) is LEGACY. Everything else → PDL_ERR_PARSE.
 * Keys and str values may also arrive as bin holding UTF-8 (upstream S2 normalises them to str);
 * a known key given twice is refused; keys of other message types are ignored; remote_blocks needs
 * req_id and a non-empty block_notify_list, its transfer_id is optional ("" when absent, older senders);
 * write_done may carry status and producer_tp_size/rank. `out` is always initialised (pdl_msg_init,
 * type LEGACY) and owns block_ids only on success; call pdl_msg_clear after a successful decode (it is
 * harmless after a failed one). A map never falls back to LEGACY: an error inside a map is reported.
 * Errors: see the top of the file.
 */
pdl_status_t pdl_wire_decode_msg(const void *buf, size_t len, pdl_msg_t *out, pdl_error_t *err);

/* "release", "remote_blocks", "write_done", "keepalive", "legacy", or "unknown"; static, never NULL. */
const char *pdl_msg_type_name(pdl_msg_type_t t);
/* "absent", "ok", "failed", or "unknown"; static, never NULL. */
const char *pdl_release_status_name(pdl_release_status_t s);
/*
 * True when two messages carry the same information: type, transfer_id and the fields their type
 * puts on the wire (consumer_tp_* is not compared for remote_blocks and write_done). Neither may be
 * NULL. For tests and fuzzers that round-trip a message.
 */
bool pdl_msg_equal(const pdl_msg_t *a, const pdl_msg_t *b);

/* ---- handshake ------------------------------------------------------------------------------ */

#define PDL_WIRE_GET_META "get_meta_msg"
#define PDL_WIRE_POP_DONE_RECV "pop_done_recv"
/* pdlink only (upstream MoRIIO does not know it): the peer answers ["", identity], a short text naming
 * its process ("pid=<pid> meta=<16 hex digits>": its pid and a fingerprint of its handshake metadata,
 * whose engine key is random per process). Callers only compare answers for equality; the text is not
 * decoded. Not a handshake: counted in identities_served, not in handshakes (connector watch.c). */
#define PDL_WIRE_GET_IDENTITY "pdlink_get_identity"

/*
 * First reply payload: MoRIIO's agent metadata map plus pdlink's compatibility keys.
 * Upstream fields, all required on the wire: `engine_id`; `agent_metadata`, the sender's packed engine
 * descriptor (pdl_engine_pack bytes, owned by the struct); `kv_caches_base_addr[num_base_addr]`, one
 * base address per layer region (malloc'ed, owned by the struct); `num_blocks`; `block_len` (bytes of
 * one block); `attn_backend_name` (may be "").
 * Not in upstream MoRIIO (which ignores unknown keys): `has_pdlink` is true when `pdlink_version` was
 * present; then tp_size .. block_size are the sender's TP/DP position and KV geometry, -1 when absent,
 * `layout` its pdl_layout_order_name ("" when absent; the decoder accepts any short text and leaves the
 * check to the caller) and `is_mla` false when absent. Without `pdlink_version` they are not read.
 */
typedef struct pdl_agent_meta {
    char engine_id[PDL_WIRE_ID_MAX + 1];
    pdl_bytes_t agent_metadata; /* bin: pdlink's packed engine descriptor */
    uint64_t *kv_caches_base_addr;
    size_t num_base_addr;
    int64_t num_blocks;
    int64_t block_len;
    char attn_backend_name[128];
    /* pdlink keys; has_pdlink is true when `pdlink_version` was present */
    bool has_pdlink;
    char pdlink_version[32];
    int64_t tp_size, tp_rank, dp_rank;
    int64_t num_layers, total_num_kv_heads, head_dim, kv_elem_size, block_size;
    char layout[16]; /* pdl_layout_name: "hnd", "nhd", + "-blockfirst" or "-fused" (compared verbatim) */
    bool is_mla;
    /* The KV digest this producer answers PDL_WIRE_GET_DIGESTS with ("xxh3-64"); "" (absent) = none, so
     * a consumer never asks (docs/integrity.md). Encoded only when non-empty. */
    char kv_digest[16];
} pdl_agent_meta_t;

/*
 * Zero everything and set the pdlink integers to -1 ("absent"); `m` must not be NULL and is not freed.
 * Call before filling one to encode. The encoder writes pdlink keys only when has_pdlink, each integer
 * only when != -1, layout when non-empty, is_mla always; the decoder reads them only when
 * pdlink_version is present.
 */
void pdl_agent_meta_init(pdl_agent_meta_t *m);
/* True when both carry the same fields (the pdlink ones only when has_pdlink). Neither may be NULL. */
bool pdl_agent_meta_equal(const pdl_agent_meta_t *a, const pdl_agent_meta_t *b);
/* Free agent_metadata and kv_caches_base_addr (the other fields are kept). A NULL m is ignored. */
void pdl_agent_meta_clear(pdl_agent_meta_t *m);
/*
 * Encode `m` in upstream's field order, then the pdlink keys. PDL_ERR_INVALID also for an empty
 * engine_id, agent_metadata over PDL_WIRE_MAX_DESC_BYTES, more than PDL_WIRE_MAX_BASE_ADDRS addresses,
 * a negative num_blocks/block_len, and (with has_pdlink) an empty pdlink_version or a pdlink integer
 * that is neither -1 nor in its range. `m` is only read. Ownership: see the top of the file.
 */
pdl_status_t pdl_wire_encode_agent_meta(const pdl_agent_meta_t *m, pdl_bytes_t *out, pdl_error_t *err);
/*
 * Decode into *out (initialised first with pdl_agent_meta_init). The six upstream keys are required,
 * the pdlink keys optional. On success call pdl_agent_meta_clear; on failure *out is re-initialised
 * and owns nothing. Errors: see the top of the file.
 */
pdl_status_t pdl_wire_decode_agent_meta(const void *buf, size_t len, pdl_agent_meta_t *out, pdl_error_t *err);

/*
 * Second reply payload: layer name → array of bin (packed memory descriptors, pdl_mem_pack bytes).
 * Every `name` and `descs` array and every descriptor's bytes are malloc'ed and owned by the map.
 * Zero-initialise a map before the first pdl_layer_map_add; free it with pdl_layer_map_clear.
 */
typedef struct pdl_layer_entry {
    char *name;          /* owned, NUL-terminated */
    pdl_bytes_t *descs;  /* owned array */
    size_t num_descs;
} pdl_layer_entry_t;

typedef struct pdl_layer_map {
    pdl_layer_entry_t *layers; /* owned, in the order they appeared */
    size_t num_layers;
    size_t layers_cap;         /* pdlink addition, internal: allocated entries (zero-initialise the map) */
} pdl_layer_map_t;

/* Free every layer and leave the map zeroed, ready for reuse. A NULL m is ignored. */
void pdl_layer_map_clear(pdl_layer_map_t *m);
/*
 * Append a copy of `name` and of `len` desc bytes (one desc per call; a repeated name adds to that
 * layer, a new name appends a layer at the end). PDL_ERR_INVALID for m or name NULL, desc NULL with
 * len > 0, a name that is empty, over PDL_WIRE_ID_MAX bytes or not UTF-8, len over
 * PDL_WIRE_MAX_DESC_BYTES, a 4097th layer or a 17th descriptor of one layer (PDL_WIRE_MAX_LAYERS,
 * PDL_WIRE_MAX_LAYER_DESCS); PDL_ERR_NOMEM. On failure the map keeps the layers and descriptors it
 * had. The caller keeps ownership of name and desc. A lookup per call, O(layers).
 */
pdl_status_t pdl_layer_map_add(pdl_layer_map_t *m, const char *name, const void *desc, size_t len,
                               pdl_error_t *err);
/*
 * The layer called `name`, or NULL (a linear search; m and name must not be NULL). The entry is
 * borrowed from the map: valid until the next pdl_layer_map_add (which may move it) or clear.
 */
const pdl_layer_entry_t *pdl_layer_map_find(const pdl_layer_map_t *m, const char *name);
/* Structural equality: same names in the same order with the same descriptor bytes. Neither NULL. */
bool pdl_layer_map_equal(const pdl_layer_map_t *a, const pdl_layer_map_t *b);
/*
 * Encode the layers in map order. PDL_ERR_INVALID also for a layer without a valid name, with 0 or
 * more than PDL_WIRE_MAX_LAYER_DESCS descriptors, or a descriptor over PDL_WIRE_MAX_DESC_BYTES; more
 * than PDL_WIRE_MAX_LAYERS layers. Ownership and other errors: see the top of the file.
 */
pdl_status_t pdl_wire_encode_layer_map(const pdl_layer_map_t *m, pdl_bytes_t *out, pdl_error_t *err);
/*
 * Decode into *out (zeroed first), keeping the sender's layer order. Every layer needs 1..
 * PDL_WIRE_MAX_LAYER_DESCS descriptors; a name that appears twice is refused. On success call
 * pdl_layer_map_clear; on failure *out is cleared. Errors: see the top of the file.
 */
pdl_status_t pdl_wire_decode_layer_map(const void *buf, size_t len, pdl_layer_map_t *out, pdl_error_t *err);

/* ---- discovery registration (rank 0 → router, every 3 s) ------------------------------------ */

/*
 * What an instance tells the router. `type` is 'P' (prefill) or 'D' (decode); `http_address` its
 * "host:port" for HTTP requests; `zmq_address` its "host:IP,handshake:PORT,notify:PORT"; `dp_size` and
 * `tp_size` in [1, PDL_WIRE_MAX_TP]. A value type: no heap parts, nothing to clear.
 */
typedef struct pdl_registration {
    char type;                        /* 'P' or 'D' */
    char http_address[PDL_WIRE_HOST_MAX + 16];
    char zmq_address[2 * PDL_WIRE_HOST_MAX];
    int64_t dp_size, tp_size;
    bool write_mode;                  /* transfer_mode "WRITE" (false: "READ") */
    bool is_g1;                       /* decoded from the old format: type "register"/"HELLO", role, ... */
} pdl_registration_t;

/*
 * Encode the current (G2) format: type, http_address, zmq_address, dp_size, tp_size, transfer_mode.
 * PDL_ERR_INVALID also for a type other than 'P'/'D', an http_address that is not host:port, a
 * zmq_address pdl_wire_parse_zmq_address refuses, or a size outside [1, PDL_WIRE_MAX_TP]. is_g1 is
 * ignored. Ownership and other errors: see the top of the file.
 */
pdl_status_t pdl_wire_encode_registration(const pdl_registration_t *r, pdl_bytes_t *out, pdl_error_t *err);
/*
 * Accepts the current (G2) format and the old G1 one (docs/wire.md#discovery-registration); anything else → PDL_ERR_PARSE.
 * G1's {type "HELLO"} keep-alive returns PDL_ERR_UNSUPPORTED (nothing to register; not malformed), so
 * a router skips it without counting it. zmq_address and http_address are validated; G1's
 * zmq_address is built from its fields and is_g1 set. *out is zeroed on failure. Errors: see the top
 * of the file.
 */
pdl_status_t pdl_wire_decode_registration(const void *buf, size_t len, pdl_registration_t *out, pdl_error_t *err);

/* ---- peer addressing -------------------------------------------------------------------------- */

/*
 * A parsed zmq_address: the host as written (a name, IPv4 or IPv6 literal; MoRIIO writes IPv6 without
 * brackets) and the handshake and notify ports, each in 1..65535. A value type: nothing to free.
 */
typedef struct pdl_zmq_addr {
    char host[PDL_WIRE_HOST_MAX + 1];
    int handshake_port;
    int notify_port;
} pdl_zmq_addr_t;

/* True when every field but is_g1 is equal, so a G1 and a G2 registration can compare equal. */
bool pdl_registration_equal(const pdl_registration_t *a, const pdl_registration_t *b);

/*
 * Parse "host:IP,handshake:PORT,notify:PORT": split on ',' then on the first ':' (IPv6 hosts work).
 * Ports are decimal 1..65535; unknown keys are ignored; a repeated key is refused. Stricter than
 * upstream MoRIIO where laxness would be unsafe: the host may hold only the characters of a host name
 * or an IP literal (it ends up inside a "tcp://host:port" endpoint). A bare IPv6 host ("::1") must be
 * bracketed by whoever builds a "tcp://" endpoint from it. PDL_ERR_INVALID for s or out NULL,
 * PDL_ERR_PARSE (naming the segment) for anything else wrong; *out is written only on success.
 */
pdl_status_t pdl_wire_parse_zmq_address(const char *s, pdl_zmq_addr_t *out, pdl_error_t *err);
/*
 * Write the canonical form "host:H,handshake:P,notify:P" and a NUL into buf[cap]; returns the length
 * without the NUL, or -1 (no message: the only causes are below) when a or buf is NULL, cap is 0, the
 * host is empty, unterminated or holds a character the parser refuses, a port is outside 1..65535, or
 * the text does not fit (buf is then "").
 */
int pdl_wire_format_zmq_address(const pdl_zmq_addr_t *a, char *buf, size_t cap);

/*
 * Request ids carrying both peers: "___prefill_addr_{zmq}___decode_addr_{zmq}_{32 hex}", possibly
 * wrapped by vLLM as "cmpl-<id>-<suffix>". The two addresses are found the way upstream's regexes find
 * them. Either output may be NULL: only the requested address is parsed (both are when both are NULL,
 * which validates the id). Outputs are written only on success. PDL_ERR_INVALID for rid NULL;
 * PDL_ERR_PARSE for an id longer than PDL_WIRE_RID_MAX or holding control characters, a missing
 * marker or hex suffix, or an embedded address that pdl_wire_parse_zmq_address would refuse.
 */
pdl_status_t pdl_wire_parse_request_id(const char *rid, pdl_zmq_addr_t *prefill, pdl_zmq_addr_t *decode,
                                       pdl_error_t *err);
/*
 * Build such an id from two zmq_address strings (copied as given) and 16 random bytes (written as 32
 * lowercase hex) into buf[cap]. Returns the length without the NUL, or -1 when an argument is NULL, cap
 * is 0, an address is invalid or contains an addressing marker, or the id does not fit in cap or in
 * PDL_WIRE_RID_MAX (buf is then "").
 */
int pdl_wire_format_request_id(const char *prefill_zmq, const char *decode_zmq, const uint8_t uuid[16],
                               char *buf, size_t cap);

/* ---- KV digests (docs/integrity.md) ------------------------------------------------------------ */

/* The handshake-port request of a consumer rank for a held transfer's digests (pdlink only), and the
 * digest a producer advertises in pdl_agent_meta_t.kv_digest. */
#define PDL_WIRE_GET_DIGESTS "pdlink_get_digests"
#define PDL_WIRE_DIGEST_XXH3 "xxh3-64"

typedef enum pdl_digest_status {
    PDL_DIGEST_OK = 0,      /* digests follow */
    PDL_DIGEST_UNKNOWN = 1, /* no digests of that transfer here (never taken, or expired) */
    PDL_DIGEST_OFF = 2,     /* this producer has kv_integrity off */
} pdl_digest_status_t;

/* A producer rank's answer: digests[(layer * num_blocks + pos) * num_heads + head] (8 bytes each, little
 * endian; pos = index in the producer's list of the transfer, head = the producer rank's own index). */
typedef struct pdl_digest_reply {
    char transfer_id[PDL_WIRE_ID_MAX + 1];
    pdl_digest_status_t status;
    uint32_t stride; /* 1 = every (layer, block); else pdl_layout_digest_sampled's pairs */
    uint32_t num_layers, num_heads;
    uint64_t num_blocks;
    pdl_bytes_t digests; /* owned; num_layers * num_blocks * num_heads * 8 bytes when status is ok */
} pdl_digest_reply_t;

/* "ok", "unknown", "off" ("invalid" otherwise); static. */
const char *pdl_digest_status_name(pdl_digest_status_t s);
/* Encode the request for transfer_id (non-empty, <= PDL_WIRE_ID_MAX bytes). Ownership: see the top. */
pdl_status_t pdl_wire_encode_digest_request(const char *transfer_id, pdl_bytes_t *out, pdl_error_t *err);
/* Decode a request into transfer_id[cap]. PDL_ERR_PARSE for anything but that map. */
pdl_status_t pdl_wire_decode_digest_request(const void *buf, size_t len, char *transfer_id, size_t cap,
                                            pdl_error_t *err);
/* Could this frame be a digest request (a cheap look before pdl_wire_decode_digest_request)? */
bool pdl_wire_is_digest_request(const void *buf, size_t len);
/* Encode a reply; PDL_ERR_INVALID when digests.len does not fit the counts (status ok) or is not 0. */
pdl_status_t pdl_wire_encode_digest_reply(const pdl_digest_reply_t *r, pdl_bytes_t *out, pdl_error_t *err);
/* Decode a reply (out owns digests on success; call pdl_digest_reply_clear). PDL_ERR_PARSE for a
 * malformed one, also one whose digest bytes do not match its counts. */
pdl_status_t pdl_wire_decode_digest_reply(const void *buf, size_t len, pdl_digest_reply_t *out, pdl_error_t *err);
void pdl_digest_reply_clear(pdl_digest_reply_t *r);
/* Digest (layer, pos, head) of a decoded ok reply; the indices must be inside its counts. */
uint64_t pdl_digest_reply_get(const pdl_digest_reply_t *r, uint32_t layer, uint64_t pos, uint32_t head);
/* Store `value` as entry `index` of a digests array (little endian), as the reply carries it. */
void pdl_digest_put(uint8_t *digests, uint64_t index, uint64_t value);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_WIRE_H */
