/*
 * params.h -- vLLM's `kv_transfer_params` (the JSON object a request carries between P and D) ↔ C.
 *
 * Field names and meanings follow vLLM's MoRIIO connector (SPEC §4). The JSON values are jansson
 * objects; a wrong type gets PDL_ERR_PARSE naming the key ("kv_transfer_params.remote_block_ids[3]:
 * expected a non-negative integer, got string").
 */
#ifndef PDLINK_PARAMS_H
#define PDLINK_PARAMS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "pdlink/status.h"
#include "pdlink/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

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

void pdl_kv_params_init(pdl_kv_params_t *p);
void pdl_kv_params_clear(pdl_kv_params_t *p);

/* Parse a kv_transfer_params object (null → all absent). Unknown keys are ignored. */
pdl_status_t pdl_kv_params_from_json(const json_t *obj, pdl_kv_params_t *out, pdl_error_t *err);

/* The params a prefill returns for READ mode (SPEC §4); the caller owns the new reference. */
json_t *pdl_kv_params_to_json(const pdl_kv_params_t *p);

/*
 * The peer's TP size as upstream MoRIIO takes it: tp_size, else remote_tp_size, else 1 (local_tp is
 * ignored; kept for source compatibility). *disagree (may be NULL) is set when both keys are present
 * with different values (log a warning; pdlink-node warns once per process and normalises).
 */
int pdl_kv_params_peer_tp(const pdl_kv_params_t *p, int local_tp, bool *disagree);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_PARAMS_H */
