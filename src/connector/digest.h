/*
 * digest.h -- KV integrity in the connector (internal; docs/integrity.md): the producer's digests of
 * held transfers, served on the handshake port, and the consumer's check of what landed.
 */
#ifndef PDL_CONNECTOR_DIGEST_H
#define PDL_CONNECTOR_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"
#include "pdlink/topo.h"
#include "connector/resolve.h"
#include "pdlink/wire.h"

typedef struct pdl_rank pdl_rank_t;
typedef struct pdl_xfer_side pdl_xfer_side_t;
typedef struct pdl_digests pdl_digests_t;

/* The store of an instance (its own lock); NULL (no memory) makes every take a no-op. Destroy accepts
 * NULL. */
pdl_digests_t *pdl__digests_create(void);
void pdl__digests_destroy(pdl_digests_t *d);
/* Producer, after rank r's payloads were built: advertise PDL_WIRE_DIGEST_XXH3 in its handshake
 * metadata when kv_integrity is on and the KV is in host memory. Failures leave the payload as it was
 * (no digests advertised: consumers then do not ask). */
void pdl__digests_advertise(pdl_rank_t *r);
/* Producer: digest the KV of blocks ids[0..n) of transfer_id on every local rank, now (the KV is final:
 * the caller is about to hand out the params). Replaces an earlier entry of that id; entries older than
 * twice defer_timeout, and the oldest beyond the store's bounds, are dropped. Best effort. */
void pdl__digests_take(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n);
/* Producer's service thread: the reply to a digest request frame (*reply owned by the caller).
 * PDL_ERR_PARSE for a malformed request (not answered). */
pdl_status_t pdl__digests_serve(pdl_rank_t *r, const void *req, size_t len, pdl_bytes_t *reply, pdl_error_t *err);
/* Consumer rank r, after its reads of a pull completed: fetch the digests of every producer rank of the
 * plan that advertises them and compare them with digests of the landed bytes. PDL_OK also when the
 * producer has none (counted kv_digest_unverified); PDL_ERR_MISMATCH naming the transfer, layer, block,
 * head, ranks and peer on a mismatch (counted kv_digest_mismatches). */
pdl_status_t pdl__digests_check(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_peer_addr_t *producer,
                                const char *transfer_id, const pdl_read_plan_t *plan, const uint32_t *local_blocks,
                                size_t n, pdl_error_t *err);

#endif /* PDL_CONNECTOR_DIGEST_H */
