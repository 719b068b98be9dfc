/*
 * budget.h -- the socket budget (internal): one count per instance of the sockets it opened toward
 * peers, by share (pdl_socket_share_t, connector.h). Every role draws from it: the DEALER caches
 * (sender.c), the handshake client (handshake.c), the peer watch (watch.c). Lock-free: any thread
 * takes and puts.
 *
 * Shares other than VERIFIED have their own caps; all of them together stay under PDL_SOCKETS_MAX, and
 * the small shares add up to well under it, so verified peers always have room.
 */
#ifndef PDL_CONNECTOR_BUDGET_H
#define PDL_CONNECTOR_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>

#include "pdlink/connector.h"

typedef struct pdl_budget {
    atomic_int total;
    atomic_int open[PDL_SOCKETS_SHARES];
    atomic_uint_least64_t refused[PDL_SOCKETS_SHARES];
} pdl_budget_t;

/* Room for one more socket of `share`: true and counted, or false (the caller may make room and try
 * again, or count the refusal). */
bool pdl__budget_take(pdl_budget_t *b, pdl_socket_share_t share);
/* The caller went without a socket of `share`. */
void pdl__budget_refused(pdl_budget_t *b, pdl_socket_share_t share);
/* A socket of `share` was closed. */
void pdl__budget_put(pdl_budget_t *b, pdl_socket_share_t share);
/* An open socket's peer was verified: it moves to the verified share (never refused: the total does not
 * change). */
void pdl__budget_promote(pdl_budget_t *b, pdl_socket_share_t from);
/* The share's cap. */
int pdl__budget_cap(pdl_socket_share_t share);
void pdl__budget_stats(pdl_budget_t *b, pdl_socket_stats_t out[PDL_SOCKETS_SHARES]);

#endif /* PDL_CONNECTOR_BUDGET_H */
