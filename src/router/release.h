/*
 * release.h -- the router frees a prefill's held KV blocks when the decode leg of a READ-mode request
 * fails, instead of leaving them to the producer's defer_timeout reaper (60 s). In WRITE mode the same
 * releases tell a pdlink prefill to drop a push that still waits for the decode's remote_blocks.
 *
 * A decode that answers with an error, refuses the connection or dies has not pulled the blocks (or will
 * not finish pulling them), and a decode that is not pdlink, or is dead, will never send the releases the
 * producer waits for. The router knows everything a consumer would put in them: the prefill's
 * kv_transfer_params name its host, notify port, TP size, DP rank and the transfer id. So it sends, to
 * every producer rank's notify port (MoRIIO: base + pdl_topo_port_offset(dp, tp, rank)), the release a
 * TP-1 consumer would send, with status "failed": each rank then counts the one release it expects from a
 * TP-1 consumer and frees its blocks. A release that arrives after the decode's own (it did pull after
 * all) is counted late by the producer and does nothing.
 *
 * Sockets: one short-lived ZeroMQ DEALER per producer rank and release (a failure path, so no pool), with
 * a bounded linger so a message to a dead prefill does not hold up shutdown. Thread-safe: ZeroMQ contexts
 * are, and each socket lives within one call.
 */
#ifndef PDL_ROUTER_RELEASE_H
#define PDL_ROUTER_RELEASE_H

#include <jansson.h>

#include "pdlink/auth.h"
#include "pdlink/status.h"

typedef struct pdl_rt_release pdl_rt_release_t;

/* `auth` (borrowed, may be NULL): authenticated mode, the releases go over CURVE (connector/curve.h). */
pdl_status_t pdl_rt_release_create(const pdl_auth_t *auth, pdl_rt_release_t **rel_p, pdl_error_t *err);
/* Waits at most the linger (1 s) for releases still queued to unreachable prefills. Accepts NULL. */
void pdl_rt_release_destroy(pdl_rt_release_t *rel);

/*
 * Send failed-status releases for the transfer described by kv_params (the prefill leg's
 * kv_transfer_params). When they lack remote_host/remote_notify_port, the prefill's registered
 * zmq_address ("host:H,handshake:P,notify:P") supplies them. Returns the number of producer ranks a
 * release was queued for (0 when the params name no transfer); logs what it could not send, naming the
 * prefill, the rank and the transfer.
 */
int pdl_rt_release_send(pdl_rt_release_t *rel, const json_t *kv_params, const char *zmq_address,
                        const char *request_id);

#endif /* PDL_ROUTER_RELEASE_H */
