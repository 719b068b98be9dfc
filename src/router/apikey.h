/*
 * apikey.h -- which workers pdlink-router hands its --api-key to (docs/security.md#the-routers---api-key).
 *
 * The router's --api-key is the nodes' own --api-key: whoever holds it can call a node's /v1 routes
 * directly. In compatible mode anyone who reaches the discovery port can register a worker, so sending
 * the key to every registered worker gives it to the first rogue that registers. A worker gets the
 * "Authorization: Bearer KEY" line only when the router verified it:
 *   - authenticated mode (--auth-key-file): every registration came over CURVE from a cluster key
 *     holder (discovery.c), so every worker is verified;
 *   - --api-key-hosts CIDR[,CIDR]: the operator's list of hosts trusted with the key; a worker is
 *     verified when the host its requests are sent to -- the host libcurl's URL parser finds in
 *     "http://<http_address>/", the URL the legs use -- is a numeric address in the list. A host name
 *     is never verified by the list: what it resolves to can change after the check.
 * Any other worker gets its legs without the line. The verdict is taken once per registration and
 * kept with the registry entry (pdl_worker_t.api_key), so the legs only read it.
 */
#ifndef PDL_ROUTER_APIKEY_H
#define PDL_ROUTER_APIKEY_H

#include <stdbool.h>
#include <stddef.h>

#include "common/cidr.h"
#include "pdlink/status.h"

typedef struct pdl_rt_apikey {
    char header[600];   /* "Authorization: Bearer <--api-key>"; "" = no --api-key */
    bool authenticated; /* --auth-key-file: registrations come only from cluster key holders */
    pdl_cidrs_t hosts;  /* --api-key-hosts, owned; n == 0 = no list */
} pdl_rt_apikey_t;

/*
 * Fill k from the router's --api-key (may be ""), --api-key-hosts text (may be "") and whether the
 * router runs in authenticated mode. PDL_ERR_INVALID naming the bad --api-key-hosts entry, PDL_ERR_NOMEM;
 * on error k owns nothing. Warns once when a key is given that no worker can be verified for.
 */
pdl_status_t pdl_rt_apikey_init(pdl_rt_apikey_t *k, const char *api_key, const char *hosts_text, bool authenticated,
                                pdl_error_t *err);
/*
 * Parse an --api-key-hosts list (common/cidr.h's form: numeric addresses and networks, comma- or
 * space-separated; "" gives an empty list) into *out, owned by the caller (pdl__cidrs_free).
 * PDL_ERR_INVALID with a message "--api-key-hosts: ..." naming the bad entry, PDL_ERR_NOMEM.
 */
pdl_status_t pdl_rt_apikey_parse_hosts(const char *text, pdl_cidrs_t *out, pdl_error_t *err);
/* Free what k owns. Accepts a zeroed k. */
void pdl_rt_apikey_free(pdl_rt_apikey_t *k);

/*
 * May the worker registered with this http_address get the key? Always true without --api-key (there is
 * nothing to hand out) and in authenticated mode. When false, why[cap] says why in a phrase naming the
 * address ("its host 10.0.0.9 is not in --api-key-hosts"); why may be NULL.
 */
bool pdl_rt_apikey_verify(const pdl_rt_apikey_t *k, const char *http_address, char *why, size_t cap);

/* The header line for a leg to a worker with that verdict, or NULL when the leg goes without one. */
const char *pdl_rt_apikey_header(const pdl_rt_apikey_t *k, bool verified);

#endif /* PDL_ROUTER_APIKEY_H */
