/*
 * fuzz_kv_params.c -- libFuzzer target for pdl_kv_params_from_json on arbitrary JSON text (jansson
 * parses; pdlink type-checks). Round-trip property: parsed params → pdl_kv_params_to_json → parsed again
 * keep every field the prefill return carries.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wire/params_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (j == NULL)
        return 0;
    pdl_kv_params_t p, q;
    pdl_error_t err;
    if (pdl_kv_params_from_json(j, &p, &err) == PDL_OK) {
        json_t *o = pdl_kv_params_to_json(&p);
        if (o == NULL)
            abort();
        if (pdl_kv_params_from_json(o, &q, &err) != PDL_OK)
            abort();
        if (!q.do_remote_prefill || q.do_remote_decode || q.num_remote_blocks != p.num_remote_blocks ||
            (p.num_remote_blocks > 0 &&
             memcmp(p.remote_block_ids, q.remote_block_ids, p.num_remote_blocks * sizeof(uint32_t)) != 0) ||
            strcmp(p.transfer_id, q.transfer_id) != 0 || strcmp(p.remote_engine_id, q.remote_engine_id) != 0 ||
            strcmp(p.remote_host, q.remote_host) != 0 || p.remote_handshake_port != q.remote_handshake_port ||
            p.remote_notify_port != q.remote_notify_port || p.remote_dp_size != q.remote_dp_size ||
            p.remote_dp_rank != q.remote_dp_rank || p.tp_size != q.tp_size || q.remote_tp_size != 0)
            abort();
        bool dis;
        (void)pdl_kv_params_peer_tp(&p, 1, &dis);
        pdl_kv_params_clear(&q);
        json_decref(o);
    }
    pdl_kv_params_clear(&p);
    json_decref(j);
    return 0;
}
