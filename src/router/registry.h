/*
 * registry.h -- the router's table of live prefill and decode instances (docs/vllm-router.md#discovery).
 *
 * Two tables, prefill and decode, keyed by http_address. A registration inserts or refreshes an entry
 * and sets its expiry to now + TTL (5 s in vllm-router); an entry is dropped once now >= its expiry.
 * The first accepted registration fixes the cluster transfer mode (READ or WRITE) for the life of the
 * process, as vllm-router's OnceLock does; a later registration with the other mode is refused.
 * Every function takes the registry's mutex, so the discovery thread and the HTTP threads share it.
 */
#ifndef PDL_ROUTER_REGISTRY_H
#define PDL_ROUTER_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"
#include "pdlink/wire.h"

/* Bound on entries per role, so a flood of distinct fake registrations cannot exhaust memory. */
#define PDL_REGISTRY_MAX_PER_ROLE 4096

typedef enum pdl_transfer_mode {
    PDL_MODE_UNKNOWN = -1,
    PDL_MODE_READ = 0,
    PDL_MODE_WRITE = 1,
} pdl_transfer_mode_t;

typedef struct pdl_worker {
    char role; /* 'P' or 'D' */
    char http_address[PDL_WIRE_HOST_MAX + 16];
    char zmq_address[2 * PDL_WIRE_HOST_MAX];
    int64_t dp_size, tp_size;
    bool is_g1;
    uint64_t first_seen_ms;
    uint64_t expires_ms;
    uint64_t registrations; /* messages received for this entry */
    char source[64];        /* the peer address its first registration came from ("" = unknown) */
    bool api_key;           /* its legs carry the router's --api-key (verified: apikey.h) */
} pdl_worker_t;

typedef struct pdl_registry pdl_registry_t;

pdl_status_t pdl_registry_create(uint32_t ttl_ms, pdl_registry_t **reg_p);
void pdl_registry_destroy(pdl_registry_t *r);

/*
 * Insert or refresh. `source` is the sender's address (libzmq's Peer-Address; NULL or "" = unknown);
 * `trusted` says the sender proved the cluster key (authenticated mode); `api_key` is the router's verdict
 * on the worker (apikey.h), kept with the entry for its legs. An existing entry is refreshed
 * or changed only from the source that registered it, or by a trusted sender: anyone else could
 * otherwise point a live worker's http_address at a zmq_address of its own choosing, and the router would
 * put that address in request ids and send releases there. Returns PDL_OK (*added_p true for a new
 * entry), PDL_ERR_DENIED for such a registration from another source, PDL_ERR_MISMATCH when the
 * registration's transfer mode differs from the cluster's, PDL_ERR_INVALID for an empty address or a
 * role other than P/D, PDL_ERR_NOMEM when the role's table is full. err names the instance.
 */
pdl_status_t pdl_registry_upsert(pdl_registry_t *r, const pdl_registration_t *reg, const char *source, bool trusted,
                                 bool api_key, uint64_t now_ms, bool *added_p, pdl_error_t *err);

/* Drop expired entries; returns how many were dropped. Their addresses are logged at info. */
size_t pdl_registry_sweep(pdl_registry_t *r, uint64_t now_ms);

/*
 * Copy the live entries of one role ('P' or 'D'), sorted by http_address so round robin and the
 * hash ring see a stable order. *out_p is malloc'ed (NULL when *n_p is 0); the caller frees it.
 */
pdl_status_t pdl_registry_snapshot(pdl_registry_t *r, char role, uint64_t now_ms, pdl_worker_t **out_p, size_t *n_p);

/* Live entries per role. */
void pdl_registry_counts(pdl_registry_t *r, uint64_t now_ms, size_t *n_prefill, size_t *n_decode);

pdl_transfer_mode_t pdl_registry_mode(pdl_registry_t *r);
const char *pdl_transfer_mode_name(pdl_transfer_mode_t m);

#endif /* PDL_ROUTER_REGISTRY_H */
