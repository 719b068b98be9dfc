/*
 * curve.h -- ZeroMQ CURVE for authenticated mode: socket options from the cluster key pair and the ZAP
 * handler that admits only cluster members (docs/security.md, "Authenticated mode").
 *
 * Layer: connector (the layer that uses libzmq), internal: its sockets and contexts are libzmq's `void *`,
 * so it is not part of the installed API; pdlink-router uses it for its discovery ROUTER and its release
 * DEALERs. Every member shares ONE CURVE key pair derived from the cluster secret
 * (pdlink/auth.h): servers (ROUTERs) use it as their server key pair, clients (DEALERs) as their client
 * key pair and as the server's public key. A client without the secret cannot complete the CURVE
 * handshake (it cannot make the server's box), and one that knows the public key but not the secret
 * half cannot prove the client key; the ZAP handler refuses every other client key and every other
 * mechanism, so a NULL-mechanism peer (an upstream MoRIIO, a tool without the key) gets nothing.
 */
#ifndef PDL_CONNECTOR_CURVE_H
#define PDL_CONNECTOR_CURVE_H

#include <stdint.h>

#include "pdlink/auth.h"
#include "pdlink/status.h"

/*
 * Make `sock` (not yet bound / connected) a CURVE server or client under the cluster key pair; with
 * `auth` NULL nothing changes (compatible mode). `zap_domain` (server; may be NULL) is passed to the ZAP
 * handler with each connection, to say which socket refused it. PDL_ERR_UNSUPPORTED when libzmq has no
 * CURVE (zmq_has("curve") false), PDL_ERR_SYSTEM when libzmq refuses an option.
 */
pdl_status_t pdl_curve_server(void *sock, const pdl_auth_t *auth, const char *zap_domain, pdl_error_t *err);
pdl_status_t pdl_curve_client(void *sock, const pdl_auth_t *auth, pdl_error_t *err);

/*
 * The ZAP handler of a ZeroMQ context: a thread answering libzmq's authentication requests for every
 * CURVE server socket of `zctx` (it binds inproc://zeromq.zap.01, so start it before those sockets
 * accept anything, and one per context). It admits CURVE clients that present the cluster public key
 * and refuses everything else; each refusal is counted and passed to `on_refused` (may be NULL; it
 * runs on the handler's thread with the socket's ZAP domain and the peer's address) and logged once
 * per peer address (then rate-limited). PDL_ERR_SYSTEM when the bind or the thread fails, PDL_ERR_NOMEM.
 * pdl_curve_zap_stop joins the thread and closes its socket; call it before zmq_ctx_term. NULL is fine.
 */
typedef struct pdl_zap pdl_zap_t;
typedef void (*pdl_zap_refused_fn)(void *arg, const char *domain, const char *address);
pdl_status_t pdl_curve_zap_start(void *zctx, const pdl_auth_t *auth, const char *who, pdl_zap_refused_fn on_refused,
                                 void *arg, pdl_zap_t **out, pdl_error_t *err);
/* Connections refused so far (any thread). */
uint64_t pdl_curve_zap_refused(const pdl_zap_t *zap);
void pdl_curve_zap_stop(pdl_zap_t *zap);

#endif /* PDL_CONNECTOR_CURVE_H */
