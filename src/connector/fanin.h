/*
 * fanin.h -- the release fan-in and lease state machine of ONE producer rank (SPEC §5 steps 4-6).
 *
 * Pure: no sockets, no threads, no clock of its own (every call takes `now_ns`), no logging. The rank
 * that owns it guards it with a mutex and turns the results into log lines and instance events.
 *
 * States of a transfer id, and the function that moves it:
 *
 *   (unknown) --release--> PARKED        pdl__fanin_release: an early release (the consumer raced ahead
 *                                        of pdl__fanin_hold). Bounded: at most max_parked releases and
 *                                        max_park_age_ns old; the oldest is dropped first
 *                                        (counted in parked_dropped).
 *   (unknown)/PARKED --hold--> HELD      pdl__fanin_hold: registered with deadline now + defer_timeout;
 *                                        parked releases for it are applied in arrival order.
 *   HELD --release--> HELD | REPORTED    counted; REPORTED once count >= expected(P, consumer_tp_size).
 *   HELD --keepalive--> HELD             deadline = now + defer_timeout (nothing counted).
 *   HELD --reap--> EXPIRED               pdl__fanin_reap: the deadline passed with too few releases.
 *   REPORTED/EXPIRED = terminal          remembered (bounded LRU of max_terminal ids) with the set of
 *                                        consumer ranks seen, so a later release is classified as a
 *                                        duplicate (that rank already counted) or late (anything else).
 *
 * Duplicates: a release carrying consumer_tp_rank is counted once per rank (a resend of the same rank's
 * release is a duplicate); releases of distinct ranks all count. A release without consumer_tp_rank
 * (upstream vLLM, or a legacy plain-string completion with consumer_tp_size 1) is always counted, as
 * upstream's `resolve_moriio_transfer_ack` does. A release with status "failed" counts like "ok"
 * (the blocks are freed anyway) and is also counted in failed_status.
 */
#ifndef PDL_CONNECTOR_FANIN_H
#define PDL_CONNECTOR_FANIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"

typedef struct pdl_fanin pdl_fanin_t;

typedef struct pdl_fanin_config {
    int producer_tp;          /* P: this instance's TP size */
    uint64_t defer_timeout_ns;/* lease of a held transfer */
    size_t max_parked;        /* early releases kept (default 1024 when 0) */
    uint64_t max_park_age_ns; /* age after which a parked release is dropped (default defer_timeout) */
    size_t max_terminal;      /* finished ids remembered for late/duplicate classification (default 4096) */
} pdl_fanin_config_t;

typedef struct pdl_fanin_release {
    const char *transfer_id;
    int64_t consumer_tp_size; /* >= 1 */
    int64_t consumer_tp_rank; /* -1 = absent */
    bool failed;              /* status "failed" */
} pdl_fanin_release_t;

typedef enum pdl_fanin_result {
    PDL_FANIN_COUNTED = 0,   /* counted, more releases expected */
    PDL_FANIN_REPORTED = 1,  /* counted and the fan-in is complete: report the transfer (exactly once) */
    PDL_FANIN_DUPLICATE = 2, /* the same consumer rank again: not counted */
    PDL_FANIN_LATE = 3,      /* the transfer already finished or expired */
    PDL_FANIN_PARKED = 4,    /* unknown transfer: kept until it is held (or dropped when too old) */
    PDL_FANIN_INVALID = 5,   /* consumer_tp_size/rank unusable with this P: dropped */
} pdl_fanin_result_t;

typedef struct pdl_fanin_counters {
    uint64_t received;       /* every valid release handed in (including parked, duplicate, late) */
    uint64_t counted;        /* releases that advanced a count */
    uint64_t duplicate;
    uint64_t late;
    uint64_t parked;         /* releases parked (cumulative) */
    uint64_t parked_dropped; /* parked releases dropped: too old, or evicted when the park was full */
    uint64_t failed_status;
    uint64_t invalid;
    uint64_t reported;       /* transfers reported */
    uint64_t expired;        /* transfers reaped */
    uint64_t keepalives;     /* keepalives that extended a lease */
} pdl_fanin_counters_t;

const char *pdl__fanin_result_name(pdl_fanin_result_t r);

pdl_status_t pdl__fanin_create(const pdl_fanin_config_t *cfg, pdl_fanin_t **out, pdl_error_t *err);
void pdl__fanin_destroy(pdl_fanin_t *f);

/* Change the lease of transfers held from now on (tests use tiny values). */
void pdl__fanin_set_defer_timeout(pdl_fanin_t *f, uint64_t defer_timeout_ns);

/*
 * Register a held transfer. Parked releases for it are applied now; *reported_out is set when they
 * complete the fan-in (the caller reports it). Errors: an id already held (PDL_ERR_BAD_STATE).
 * A previously finished id may be held again (it leaves the terminal set).
 */
pdl_status_t pdl__fanin_hold(pdl_fanin_t *f, const char *transfer_id, uint64_t now_ns, bool *reported_out,
                             pdl_error_t *err);

/* Hand in one release. On PDL_FANIN_INVALID `err` says why (names the value). */
pdl_fanin_result_t pdl__fanin_release(pdl_fanin_t *f, const pdl_fanin_release_t *rel, uint64_t now_ns,
                                      pdl_error_t *err);

/* Extend the lease of a held transfer; false if it is not held. */
bool pdl__fanin_keepalive(pdl_fanin_t *f, const char *transfer_id, uint64_t now_ns);

/*
 * Expire held transfers whose deadline passed (calling expired_fn for each, then forgetting them into
 * the terminal set) and drop parked releases older than max_park_age_ns. Returns the number expired.
 */
size_t pdl__fanin_reap(pdl_fanin_t *f, uint64_t now_ns, void (*expired_fn)(void *arg, const char *transfer_id),
                       void *arg);

/* Earliest deadline among held transfers and parked releases (UINT64_MAX when none). */
uint64_t pdl__fanin_next_deadline(const pdl_fanin_t *f);

/* Drop a held transfer without reporting it (instance teardown); false if not held. */
bool pdl__fanin_cancel(pdl_fanin_t *f, const char *transfer_id);

bool pdl__fanin_is_held(const pdl_fanin_t *f, const char *transfer_id);
size_t pdl__fanin_held_count(const pdl_fanin_t *f);
size_t pdl__fanin_parked_count(const pdl_fanin_t *f);
/* Releases counted so far for a held transfer (-1 if not held). */
int pdl__fanin_count_of(const pdl_fanin_t *f, const char *transfer_id);
void pdl__fanin_get_counters(const pdl_fanin_t *f, pdl_fanin_counters_t *out);

#endif /* PDL_CONNECTOR_FANIN_H */
