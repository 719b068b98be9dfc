/*
 * resolve.h -- the peer resolver (internal): from what a request names (its kv_transfer_params, else
 * its request id) to the vetted address of the remote instance it transfers with, for every role and
 * direction -- a READ decode's producer (pulls, abandons), a READ prefill's consumer (holds), a WRITE
 * prefill's consumer (pushes, abandons), a WRITE decode's producer (receives, abandons).
 *
 * Vetting is here once, before anything is dialled or sent: a request must not make an instance
 * connect wherever it says. The address must exist, its TP must fit ours (pdl_topo_map_rank), every
 * rank's handshake and notify port must exist, and its host must be in trusted_hosts (refused with
 * PDL_ERR_DENIED and counted in untrusted_refused). Its numeric form is kept: control messages that
 * the transfer later receives are bound to it (pdl__sent_by).
 */
#ifndef PDL_CONNECTOR_RESOLVE_H
#define PDL_CONNECTOR_RESOLVE_H

#include <stdbool.h>
#include <stddef.h>

#include "pdlink/connector.h"
#include "pdlink/params.h"
#include "pdlink/wire.h"

/* Where a remote instance listens and what it is: the far end of a transfer. */
typedef struct pdl_peer_addr {
    /* Cache key: always "host:handshake base", what is dialled and verified. Never the params'
     * remote_engine_id, which a client chooses: one request naming the real prefill's id with another
     * host would plant that host under the real id for every later request. */
    char engine_id[PDL_WIRE_ID_MAX + 1];
    char claimed_id[PDL_WIRE_ID_MAX + 1]; /* the params' remote_engine_id ("" = none): checked, never trusted */
    char host[PDL_WIRE_HOST_MAX + 1];
    char ip[64];              /* host's numeric form ("" for a name: what a name resolves to can change) */
    int hs_base, notify_base; /* port bases; a rank listens on base + dp * tp + rank */
    int dp;                   /* the remote instance's DP rank */
    int tp;                   /* the remote instance's TP size */
    pdl_role_t role;          /* what the remote instance is: producer or consumer */
} pdl_peer_addr_t;

/*
 * The remote instance of role `peer_role` that `params` (or `request_id`, may be NULL) names for
 * instance inst: host and port bases from params' remote_host / remote_handshake_port /
 * remote_notify_port when all are set, else from the request id's ___prefill_addr_ (peer_role
 * PDL_ROLE_PRODUCER) or ___decode_addr_ part (PDL_ROLE_CONSUMER); TP from pdl_kv_params_peer_tp; DP
 * rank from remote_dp_rank. Errors name `what` ("pull", "push", "abandon", ...) and the transfer:
 * PDL_ERR_INVALID (no address, a TP that does not fit ours, ports past 65535), PDL_ERR_DENIED (host
 * not in trusted_hosts).
 */
pdl_status_t pdl__resolve_peer(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               pdl_role_t peer_role, const char *what, pdl_peer_addr_t *out, pdl_error_t *err);
/* The consumer a READ hold is made for, from its request id's ___decode_addr_: "host:handshake port"
 * into consumer[cap] ("" with PDL_OK when request_id is NULL or names none), vetted against
 * trusted_hosts like every other peer (PDL_ERR_DENIED naming `transfer_id`). */
pdl_status_t pdl__resolve_hold_consumer(pdl_instance_t *inst, const char *transfer_id, const char *request_id,
                                        char *consumer, size_t cap, pdl_error_t *err);
/* May this instance dial `host` at all (trusted_hosts)? PDL_ERR_DENIED naming what, the transfer and
 * the host, counted in untrusted_refused. */
pdl_status_t pdl__resolve_vet_host(pdl_instance_t *inst, const char *host, const char *what, const char *transfer_id,
                                   pdl_role_t peer_role, pdl_error_t *err);
/* The numeric form of `host` ("" for a name), as libzmq reports a sender's Peer-Address. */
void pdl__numeric_host(const char *host, char out[64]);
/* The numeric host of a peer name "host:port" / "[v6]:port" ("" when host is a name). */
void pdl__numeric_host_of_name(const char *name, char out[64]);
/* A peer's name, "host:port" of its handshake port ("[v6]:port" for an IPv6 address): how held
 * transfers name their consumer, the watch its peers, and what libzmq-free logs print. */
void pdl__peer_name(char *buf, size_t cap, const char *host, int port);
/* Did a message come from `expected` (numeric)? Unknown on either side ("" / NULL) is accepted: a host
 * name cannot be compared without resolving it, and libzmq may not report the peer. */
bool pdl__sent_by(const char *sender, const char *expected);
/* "producer" / "consumer". */
const char *pdl__role_name(pdl_role_t role);

#endif /* PDL_CONNECTOR_RESOLVE_H */
