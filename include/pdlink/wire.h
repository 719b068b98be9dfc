/*
 * wire.h -- codecs of everything pdlink says on the control plane (SPEC §4). No sockets.
 *
 * Encoders produce exactly the bytes msgpack-python's `msgpack.dumps(dict)` produces for the same map
 * (str keys as str, ints in their smallest form, bytes as bin), so an upstream Python peer reads them.
 * Decoders take hostile input: they are bounds-checked, type-checked, ignore unknown keys, never depend
 * on key order, and fail with PDL_ERR_PARSE and a message naming the key and what was wrong.
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
/* pdlink additions: further bounds the decoders enforce. */
#define PDL_WIRE_MAX_TP 65536              /* any TP size or rank carried on the wire */
#define PDL_WIRE_MAX_LAYERS 4096           /* layers in one layer map */
#define PDL_WIRE_MAX_LAYER_DESCS 16        /* descriptors per layer */
#define PDL_WIRE_MAX_DESC_BYTES 65536      /* one packed descriptor; also agent_metadata */
#define PDL_WIRE_MAX_BASE_ADDRS 65536      /* entries of kv_caches_base_addr */
#define PDL_WIRE_RID_MAX 4096              /* request ids (bytes, without NUL) */

/* ---- notify channel ------------------------------------------------------------------------- */

typedef enum pdl_msg_type {
    PDL_MSG_RELEASE = 1,
    PDL_MSG_REMOTE_BLOCKS = 2,
    PDL_MSG_WRITE_DONE = 3,
    PDL_MSG_KEEPALIVE = 4, /* pdlink-only: extends a lease; sent only to peers that speak pdlink */
    PDL_MSG_LEGACY = 5,    /* a plain UTF-8 transfer id (not a msgpack map) */
} pdl_msg_type_t;

typedef enum pdl_release_status {
    PDL_RELEASE_ABSENT = 0, /* key not present: an upstream peer; means ok */
    PDL_RELEASE_OK = 1,
    PDL_RELEASE_FAILED = 2,
} pdl_release_status_t;

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
    /* remote_blocks also carries consumer_tp_size/rank (pdlink addition, additive keys upstream
     * ignores): encoded only when consumer_tp_rank != -1, decoded when present */
    uint32_t *block_ids;       /* owned */
    size_t num_blocks;
} pdl_msg_t;

/* Zero a message with every optional field "absent". */
void pdl_msg_init(pdl_msg_t *m, pdl_msg_type_t type);
void pdl_msg_clear(pdl_msg_t *m);

/* Encode a typed message (LEGACY encodes the raw transfer id bytes). Only keys that are present are written. */
pdl_status_t pdl_wire_encode_msg(const pdl_msg_t *m, pdl_bytes_t *out, pdl_error_t *err);

/*
 * Decode one notify frame. A frame that decodes as exactly one msgpack map (consuming the whole frame)
 * is typed; a map without `type` but with `req_id` is an untyped remote_blocks; anything else that is
 * valid UTF-8 without NUL (and non-empty, <= PDL_WIRE_ID_MAX) is LEGACY. Everything else → PDL_ERR_PARSE.
 * Details (pdlink): keys and str values may arrive as bin holding UTF-8 (upstream S2 normalises them);
 * a known key given twice is refused; keys of other message types are ignored; remote_blocks needs
 * req_id and a non-empty block_notify_list, its transfer_id is optional ("" when absent, older senders);
 * write_done may carry status and producer_tp_size/rank. `out` is always initialised (pdl_msg_init) and
 * owns block_ids only on success; call pdl_msg_clear after a successful decode.
 * Encoding: release/keepalive always write consumer_tp_size; optional keys only when set; an invalid
 * field (e.g. consumer_tp_size < 1, empty block list) → PDL_ERR_INVALID.
 */
pdl_status_t pdl_wire_decode_msg(const void *buf, size_t len, pdl_msg_t *out, pdl_error_t *err);

const char *pdl_msg_type_name(pdl_msg_type_t t);
/* pdlink addition: "absent", "ok", "failed". */
const char *pdl_release_status_name(pdl_release_status_t s);
/* pdlink addition: true when two decoded messages carry the same information (fields of their type). */
bool pdl_msg_equal(const pdl_msg_t *a, const pdl_msg_t *b);

/* ---- handshake ------------------------------------------------------------------------------ */

#define PDL_WIRE_GET_META "get_meta_msg"
#define PDL_WIRE_POP_DONE_RECV "pop_done_recv"

/* First reply payload: MoRIIO's agent metadata map plus pdlink's compatibility keys. */
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
    char layout[16]; /* "hnd" / "nhd" */
    bool is_mla;
} pdl_agent_meta_t;

/* pdlink addition: zero everything, pdlink integers -1 ("absent"). Call before filling one to encode.
 * The encoder writes pdlink keys only when has_pdlink, each integer only when != -1, layout when
 * non-empty, is_mla always; the decoder reads them only when pdlink_version is present. */
void pdl_agent_meta_init(pdl_agent_meta_t *m);
bool pdl_agent_meta_equal(const pdl_agent_meta_t *a, const pdl_agent_meta_t *b);
void pdl_agent_meta_clear(pdl_agent_meta_t *m);
pdl_status_t pdl_wire_encode_agent_meta(const pdl_agent_meta_t *m, pdl_bytes_t *out, pdl_error_t *err);
pdl_status_t pdl_wire_decode_agent_meta(const void *buf, size_t len, pdl_agent_meta_t *out, pdl_error_t *err);

/* Second reply payload: layer name → array of bin (packed memory descriptors). */
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

void pdl_layer_map_clear(pdl_layer_map_t *m);
/* Appends a copy of name and desc bytes (one desc per call; a repeated name adds to that layer). */
pdl_status_t pdl_layer_map_add(pdl_layer_map_t *m, const char *name, const void *desc, size_t len,
                               pdl_error_t *err);
/* pdlink additions: the layer called `name`, or NULL; structural equality (names, order, bytes). */
const pdl_layer_entry_t *pdl_layer_map_find(const pdl_layer_map_t *m, const char *name);
bool pdl_layer_map_equal(const pdl_layer_map_t *a, const pdl_layer_map_t *b);
pdl_status_t pdl_wire_encode_layer_map(const pdl_layer_map_t *m, pdl_bytes_t *out, pdl_error_t *err);
pdl_status_t pdl_wire_decode_layer_map(const void *buf, size_t len, pdl_layer_map_t *out, pdl_error_t *err);

/* ---- discovery registration (rank 0 → router, every 3 s) ------------------------------------ */

typedef struct pdl_registration {
    char type;                        /* 'P' or 'D' */
    char http_address[PDL_WIRE_HOST_MAX + 16];
    char zmq_address[2 * PDL_WIRE_HOST_MAX];
    int64_t dp_size, tp_size;
    bool write_mode;                  /* transfer_mode "WRITE" (false: "READ") */
    bool is_g1;                       /* decoded from the old format: type "register"/"HELLO", role, ... */
} pdl_registration_t;

pdl_status_t pdl_wire_encode_registration(const pdl_registration_t *r, pdl_bytes_t *out, pdl_error_t *err);
/* Accepts the current (G2) format and the old G1 one (see router notes); anything else → PDL_ERR_PARSE.
 * G1's {type "HELLO"} keep-alive returns PDL_ERR_UNSUPPORTED (nothing to register; not malformed).
 * zmq_address and http_address are validated; G1's zmq_address is built from its fields. */
pdl_status_t pdl_wire_decode_registration(const void *buf, size_t len, pdl_registration_t *out, pdl_error_t *err);

/* ---- peer addressing -------------------------------------------------------------------------- */

typedef struct pdl_zmq_addr {
    char host[PDL_WIRE_HOST_MAX + 1];
    int handshake_port;
    int notify_port;
} pdl_zmq_addr_t;

/* pdlink addition: equal registrations, ignoring is_g1. */
bool pdl_registration_equal(const pdl_registration_t *a, const pdl_registration_t *b);

/* "host:IP,handshake:PORT,notify:PORT": split on ',' then on the first ':' (IPv6 hosts work).
 * Ports are decimal 1..65535; unknown keys are ignored; a repeated key is refused. A bare IPv6 host
 * ("::1") must be bracketed by whoever builds a "tcp://" endpoint from it. */
pdl_status_t pdl_wire_parse_zmq_address(const char *s, pdl_zmq_addr_t *out, pdl_error_t *err);
/* Writes the canonical form; returns the length, or -1 if it does not fit. */
int pdl_wire_format_zmq_address(const pdl_zmq_addr_t *a, char *buf, size_t cap);

/*
 * Request ids carrying both peers: "___prefill_addr_{zmq}___decode_addr_{zmq}_{32 hex}", possibly
 * wrapped by vLLM as "cmpl-<id>-<suffix>". Either output may be NULL: only the requested address is
 * parsed (both are when both are NULL). Ids longer than PDL_WIRE_RID_MAX or holding control characters
 * are refused.
 */
pdl_status_t pdl_wire_parse_request_id(const char *rid, pdl_zmq_addr_t *prefill, pdl_zmq_addr_t *decode,
                                       pdl_error_t *err);
/* Builds such an id from two zmq addresses and 16 random bytes (as 32 lowercase hex). Returns the length,
 * or -1 when it does not fit, an address is invalid or contains an addressing marker. */
int pdl_wire_format_request_id(const char *prefill_zmq, const char *decode_zmq, const uint8_t uuid[16],
                               char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_WIRE_H */
