/*
 * params.h -- vLLM's `kv_transfer_params` (the JSON object a request carries between P and D) ↔ C.
 *
 * Layer: wire (src/wire/params.c). Pure functions: no I/O, no logging, no global state; thread-safe on
 * distinct structs. The JSON crosses this API as text (pdl_kv_params_parse, pdl_kv_params_format), so
 * a program needs no JSON library to use it.
 *
 * Field names and meanings follow vLLM's MoRIIO connector (docs/protocol.md#kv_transfer_params). A
 * wrong type gets PDL_ERR_PARSE naming the key ("kv_transfer_params.remote_block_ids[3]: expected a
 * non-negative integer, got string"). Values are never coerced: a port sent as "6301" or 6301.0 is an
 * error, not a guess. JSON null counts as absent for every key (routers send `remote_block_ids: null` on
 * the first leg), and unknown keys are ignored.
 */
#ifndef PDLINK_PARAMS_H
#define PDLINK_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"
#include "pdlink/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The parsed params. Booleans are false and strings "" when absent. `remote_block_ids` is malloc'ed
 * and owned by the struct (free it with pdl_kv_params_clear); `has_remote_block_ids` is true when the
 * key was present and not null, even for an empty list. The remote_* fields describe the peer a
 * request transfers with (for a decode: the prefill that holds its KV cache); `remote_tp_size` is that
 * peer's TP size as the router states it, `tp_size` the TP size of whoever wrote the params (a prefill
 * writes its own), and pdl_kv_params_peer_tp picks between them.
 */
typedef struct pdl_kv_params {
    bool do_remote_prefill;
    bool do_remote_decode;
    char transfer_id[PDL_WIRE_ID_MAX + 1];   /* "" when absent */
    uint32_t *remote_block_ids;              /* owned; NULL when absent */
    size_t num_remote_blocks;
    bool has_remote_block_ids;
    char remote_engine_id[PDL_WIRE_ID_MAX + 1];
    char remote_host[PDL_WIRE_HOST_MAX + 1];
    int remote_handshake_port;               /* 0 when absent */
    int remote_notify_port;                  /* 0 when absent */
    int remote_dp_size;                      /* 1 when absent */
    int remote_dp_rank;                      /* -1 when absent */
    int remote_tp_size;                      /* 0 when absent */
    int tp_size;                             /* 0 when absent */
} pdl_kv_params_t;

/* Set every field to "absent" (see the struct). `p` must not be NULL; nothing is freed. */
void pdl_kv_params_init(pdl_kv_params_t *p);
/*
 * Free remote_block_ids and mark the block list absent; the other fields are kept. A NULL p is
 * ignored.
 */
void pdl_kv_params_clear(pdl_kv_params_t *p);

/*
 * Parse kv_transfer_params given as JSON text (NUL-terminated) into *out (initialised first; NULL, ""
 * or the text "null" leaves every field absent). `json_text` is borrowed: strings and the block list
 * are copied. *out is overwritten without being freed, so it must not own a block list on entry; on
 * success free it with pdl_kv_params_clear, on failure it is re-initialised and owns nothing.
 * Returns PDL_OK, or PDL_ERR_INVALID (out NULL), PDL_ERR_PARSE (not JSON; not an object; a key of the
 * wrong type; a port outside 1..65535; remote_dp_size, remote_tp_size or tp_size outside
 * 1..PDL_WIRE_MAX_TP; remote_dp_rank outside 0..PDL_WIRE_MAX_TP - 1; a string with a NUL or longer
 * than its field; more than PDL_WIRE_MAX_BLOCKS block ids or one outside 0..UINT32_MAX), PDL_ERR_NOMEM.
 */
pdl_status_t pdl_kv_params_parse(const char *json_text, pdl_kv_params_t *out, pdl_error_t *err);

/*
 * The params a prefill returns for READ mode, built from `p`, as compact JSON text:
 * do_remote_prefill true, do_remote_decode false (whatever p says), remote_block_ids (always an
 * array), remote_engine_id, remote_host, the two ports and tp_size (null when absent), remote_dp_size
 * (1 when <= 0), and transfer_id and remote_dp_rank only when set. remote_tp_size is never written: the
 * router forwards these params to the decode, which reads remote_tp_size first, and a value copied from
 * the request the prefill received (the decode's own TP) would break the rank mapping. Returns a
 * malloc'ed NUL-terminated string the caller frees with free(), or NULL when p is NULL, memory runs out
 * or a string is not UTF-8.
 */
char *pdl_kv_params_format(const pdl_kv_params_t *p);

/*
 * The peer's TP size as upstream MoRIIO takes it: tp_size, else remote_tp_size, else 1 (local_tp is
 * ignored; kept for source compatibility). *disagree (may be NULL) is set when both keys are present
 * with different values (log a warning; pdlink-node warns once per process and normalises).
 * `p` must not be NULL. Cannot fail.
 */
int pdl_kv_params_peer_tp(const pdl_kv_params_t *p, int local_tp, bool *disagree);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_PARAMS_H */
