/*
 * peerhealth.h -- remembers which remote peers failed, and until when a new attempt is pointless
 * (internal, pure).
 *
 * Why: a handshake with a peer that is gone costs up to handshake_timeout (10 s by default). Without
 * memory, every request naming that peer pays it again, one after another. With it, the first failure
 * is remembered under the peer's key with its reason, and requests in the backoff window fail at once
 * with that reason ("handshake with ...: no reply within 3000 ms, 3.1 s ago; retry in 4.0 s").
 *
 * Pure: no sockets, no threads, no logging, no clock of its own (every call takes `now_ns`). One owner
 * (a transfer lane, xfer.c) uses it from one thread.
 *
 * States of one key, and the function that moves it:
 *
 *   HEALTHY (no entry) --failed--> BACKOFF    pdl__health_failed: failures = 1, retry at now + initial.
 *   BACKOFF --admit before retry_at--> BACKOFF pdl__health_admit returns false and the reason (fail fast).
 *   BACKOFF --admit at/after retry_at--> PROBING
 *                                             the caller is let through to try once; further admits
 *                                             while it tries are refused (one probe per backoff period).
 *   PROBING --failed--> BACKOFF               failures + 1, retry at now + min(initial * 2^(failures-1), max).
 *   PROBING/BACKOFF --ok--> HEALTHY           pdl__health_ok: the entry is removed.
 *   BACKOFF --recheck due, caller saw the peer listen again--> PROBING
 *                                             pdl__health_recheck_due / pdl__health_readmit: a peer that
 *                                             refused (nothing listened) and listens again was restarted
 *                                             (or its listener resumed): it is tried at once instead of
 *                                             after the backoff (otherwise the first request after a
 *                                             prefill restart is refused for peer_backoff).
 *
 * A peer that never fails costs one hash lookup per admit. At most `max_entries` keys are remembered;
 * a failure beyond that is not recorded (the peer is then simply tried again), so a flood of bogus peer
 * addresses cannot grow memory without bound.
 */
#ifndef PDL_CONNECTOR_PEERHEALTH_H
#define PDL_CONNECTOR_PEERHEALTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "connector/strmap.h"
#include "pdlink/status.h"

#define PDL_HEALTH_REASON_MAX 240

typedef struct pdl_peerhealth {
    pdl_strmap_t map; /* key -> pdl_health_entry_t* */
    uint64_t initial_ns, max_ns;
    size_t max_entries;
} pdl_peerhealth_t;

typedef enum pdl_health_state {
    PDL_HEALTH_HEALTHY = 0,
    PDL_HEALTH_BACKOFF = 1,
    PDL_HEALTH_PROBING = 2,
} pdl_health_state_t;

/* Backoff starts at initial_ns and doubles per consecutive failure up to max_ns (>= initial_ns). */
void pdl__health_init(pdl_peerhealth_t *h, uint64_t initial_ns, uint64_t max_ns, size_t max_entries);
void pdl__health_fini(pdl_peerhealth_t *h);

/*
 * May the caller try `key` now? True for a healthy key, and once per backoff period after it passed
 * (the key is then PROBING until pdl__health_ok/failed). False while it backs off: *st_out gets the
 * status of the failure that is remembered and why[cap] "<reason>, 3.1 s ago; retry in 4.0 s".
 */
bool pdl__health_admit(pdl_peerhealth_t *h, const char *key, uint64_t now_ns, pdl_status_t *st_out, char *why,
                       size_t cap);
/* The attempt failed with st and reason (copied, truncated): back off. */
void pdl__health_failed(pdl_peerhealth_t *h, const char *key, uint64_t now_ns, pdl_status_t st, const char *reason);
/* Is `key` backing off after a refusal (PDL_ERR_PEER_GONE), with no recheck since the failure or the
 * last one at least every_ns ago? Then true, and the recheck is recorded as made now: the caller looks
 * once whether the peer listens again (at most once per every_ns per key; the first at once, since a
 * restart can follow the refusal within milliseconds) and calls pdl__health_readmit if it does. */
bool pdl__health_recheck_due(pdl_peerhealth_t *h, const char *key, uint64_t now_ns, uint64_t every_ns);
/* The peer of a BACKOFF key listens again: PROBING, as if its backoff had passed (the caller tries it
 * once; ok or failed as after an admit). No-op for another state. */
void pdl__health_readmit(pdl_peerhealth_t *h, const char *key);
/* The attempt succeeded: forget the key. */
void pdl__health_ok(pdl_peerhealth_t *h, const char *key);
/* For tests and metrics: the key's state, consecutive failures and next retry time (0 when healthy). */
pdl_health_state_t pdl__health_state(const pdl_peerhealth_t *h, const char *key, int *failures, uint64_t *retry_at_ns);
size_t pdl__health_count(const pdl_peerhealth_t *h);

#endif /* PDL_CONNECTOR_PEERHEALTH_H */
