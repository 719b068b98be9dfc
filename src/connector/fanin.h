/*
 * fanin.h -- the held transfers of one producer instance: ONE record per transfer id, holding the release
 * fan-in and lease state machine of each of the instance's ranks (docs/protocol.md#leases).
 *
 * Pure: no sockets, no threads, no clock of its own (every call takes `now_ns`), no logging. The owner
 * (held.c) guards the whole table with one mutex and turns the results into events, grants revoked and
 * blocks freed; a record carries the owner's `data` (its blocks) and gives it back when it leaves.
 *
 * The fan-in decides, the owner resolves: a rank's fan-in finishing (reported, expired) is a result the
 * owner reports first and then resolves with pdl__fanin_resolve; the owner may also resolve a rank
 * whose fan-in never finished (a WRITE push that ended, a consumer that is gone). A record lives until
 * every rank is resolved, so whoever sees it gone also sees every rank's report made before. States of
 * one rank of a transfer id, and the function that moves it (a release, keepalive or reap names one
 * rank; ranks are independent):
 *
 *   (no record) --add--> OPEN            pdl__fanin_add: the transfer is recorded for every rank; a rank
 *                                        not holding yet parks its releases like an unknown id's.
 *   (unknown)/OPEN --release--> PARKED   pdl__fanin_release: an early release (the consumer raced ahead
 *                                        of the hold). Bounded per rank: at most max_parked releases and
 *                                        max_park_age_ns old; the oldest is dropped first
 *                                        (counted in parked_dropped).
 *   OPEN --hold--> HELD                  pdl__fanin_hold: lease until now + defer_timeout; the rank's
 *                                        parked releases for the id are applied in arrival order (those
 *                                        from a sender the hold accepts: pdl__fanin_hold_from).
 *   HELD --release--> HELD | REPORTED    counted; REPORTED once count >= expected(P, consumer_tp_size).
 *   HELD --keepalive--> HELD             deadline = now + defer_timeout (nothing counted).
 *   HELD --reap--> EXPIRED               pdl__fanin_reap: the deadline passed with too few releases.
 *   OPEN/HELD --resolve--> DROPPED       pdl__fanin_resolve before the fan-in finished; the rank forgets
 *                                        the id, so its later releases park like an unknown id's.
 *   REPORTED/EXPIRED = finished          the rank's consumer ranks seen stay with the record, so a later
 *                                        release to that rank is a duplicate (that consumer rank already
 *                                        counted) or late (anything else) -- also after the record left:
 *                                        it is remembered (bounded LRU of max_terminal ids) while any
 *                                        rank finished this way.
 *
 * Resolving the last rank takes the record out of the table: pdl_fanin_outcome_t says so, with the
 * record's data. pdl__fanin_cancel takes a record out at once.
 *
 * Duplicates: a release carrying consumer_tp_rank is counted once per consumer rank (a resend of the
 * same rank's release is a duplicate); releases of distinct ranks all count. A release without
 * consumer_tp_rank (upstream vLLM, or a legacy plain-string completion with consumer_tp_size 1) is
 * always counted, as upstream's `resolve_moriio_transfer_ack` does. A release with status "failed"
 * counts like "ok" (the blocks are freed anyway) and is also counted in failed_status. Every count
 * above is the named rank's (pdl__fanin_get_counters).
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
    int first_rank, ranks;    /* the producer ranks counted here: [first_rank, first_rank + ranks) */
    uint64_t defer_timeout_ns;/* lease of a held transfer */
    size_t max_parked;        /* early releases kept per rank (default 1024 when 0) */
    uint64_t max_park_age_ns; /* age after which a parked release is dropped (default defer_timeout) */
    size_t max_terminal;      /* finished ids remembered for late/duplicate classification (default 4096) */
} pdl_fanin_config_t;

typedef struct pdl_fanin_release {
    const char *transfer_id;
    int64_t consumer_tp_size; /* >= 1 */
    int64_t consumer_tp_rank; /* -1 = absent */
    bool failed;              /* status "failed" */
    const char *sender;       /* the sender's numeric host (NULL or "" = unknown): kept with a parked release */
} pdl_fanin_release_t;

typedef enum pdl_fanin_result {
    PDL_FANIN_COUNTED = 0,   /* counted, more releases expected */
    PDL_FANIN_REPORTED = 1,  /* counted and the rank's fan-in is complete: report it (exactly once) */
    PDL_FANIN_DUPLICATE = 2, /* the same consumer rank again: not counted */
    PDL_FANIN_LATE = 3,      /* the rank already finished or expired the transfer */
    PDL_FANIN_PARKED = 4,    /* the rank does not hold the transfer: kept until it does (or too old) */
    PDL_FANIN_INVALID = 5,   /* consumer_tp_size/rank unusable with this P (or a rank not counted here) */
} pdl_fanin_result_t;

/* What resolving a rank did to its record. */
typedef struct pdl_fanin_outcome {
    bool last;  /* the rank was the record's last unresolved one: the record left the table */
    void *data; /* then: the data given to pdl__fanin_add, the caller's again */
} pdl_fanin_outcome_t;

typedef struct pdl_fanin_counters {
    uint64_t received;       /* every valid release handed in (including parked, duplicate, late) */
    uint64_t counted;        /* releases that advanced a count */
    uint64_t duplicate;
    uint64_t late;
    uint64_t parked;         /* releases parked (cumulative) */
    uint64_t parked_dropped; /* parked releases dropped: too old, or evicted when the park was full */
    uint64_t parked_refused; /* parked releases the hold's sender check refused (pdl__fanin_hold_from) */
    uint64_t failed_status;
    uint64_t invalid;
    uint64_t reported;       /* transfers reported */
    uint64_t expired;        /* transfers reaped */
    uint64_t keepalives;     /* keepalives that extended a lease */
} pdl_fanin_counters_t;

const char *pdl__fanin_result_name(pdl_fanin_result_t r);

/* PDL_ERR_INVALID for a P or rank range outside [1, PDL_TOPO_MAX_TP]; PDL_ERR_NOMEM. */
pdl_status_t pdl__fanin_create(const pdl_fanin_config_t *cfg, pdl_fanin_t **out, pdl_error_t *err);
/* Frees every record, not their data (take it with pdl__fanin_foreach first). NULL is fine. */
void pdl__fanin_destroy(pdl_fanin_t *f);

/*
 * Record transfer_id with every rank OPEN, carrying `data` (not owned: returned by the outcome of its
 * last rank, or by pdl__fanin_cancel). A finished id may be recorded again (it leaves the terminal set).
 * Errors: an empty id (PDL_ERR_INVALID), an id already recorded (PDL_ERR_BAD_STATE), PDL_ERR_NOMEM.
 */
pdl_status_t pdl__fanin_add(pdl_fanin_t *f, const char *transfer_id, void *data, pdl_error_t *err);

/*
 * Rank `rank` holds transfer_id from now on. Its parked releases for the id are applied now;
 * *reported_out is set when they completed its fan-in (the caller reports it). Errors: no such record,
 * or the rank is not OPEN -- it holds already or was resolved meanwhile -- (PDL_ERR_BAD_STATE), a rank
 * not counted here (PDL_ERR_INVALID).
 */
pdl_status_t pdl__fanin_hold(pdl_fanin_t *f, const char *transfer_id, int rank, uint64_t now_ns, bool *reported_out,
                             pdl_error_t *err);
/*
 * pdl__fanin_hold, applying only the parked releases whose sender `allowed` accepts (called with the
 * sender each was parked with, "" when unknown; must not call into the table; NULL = all). A release
 * parked before its hold existed was taken from anyone -- nothing named the transfer's consumer yet --
 * so the hold, which does name it, puts each to that check now; the refused ones are dropped and
 * counted in parked_refused.
 */
pdl_status_t pdl__fanin_hold_from(pdl_fanin_t *f, const char *transfer_id, int rank, uint64_t now_ns,
                                  bool (*allowed)(void *arg, const char *sender), void *arg, bool *reported_out,
                                  pdl_error_t *err);

/* Hand one release to rank `rank`. On PDL_FANIN_INVALID `err` says why (names the value). */
pdl_fanin_result_t pdl__fanin_release(pdl_fanin_t *f, int rank, const pdl_fanin_release_t *rel, uint64_t now_ns,
                                      pdl_error_t *err);

/* Extend rank `rank`'s lease of transfer_id; false if that rank does not hold it. */
bool pdl__fanin_keepalive(pdl_fanin_t *f, const char *transfer_id, int rank, uint64_t now_ns);

/*
 * Rank `rank`: drop its parked releases older than max_park_age_ns, and expire at most `max` of the
 * transfers it holds whose deadline passed, calling expired_fn for each (transfer_id is valid during the
 * call only; expired_fn must not call into the table). Returns the number expired: when it is `max`,
 * more may be due (call again).
 */
size_t pdl__fanin_reap(pdl_fanin_t *f, int rank, uint64_t now_ns, size_t max,
                       void (*expired_fn)(void *arg, const char *transfer_id), void *arg);

/* Earliest deadline among rank `rank`'s held transfers and parked releases (UINT64_MAX when none). */
uint64_t pdl__fanin_next_deadline(const pdl_fanin_t *f, int rank);

/* The owner is done with rank `rank` of transfer_id: after reporting its finished fan-in (the state
 * stays, for late/duplicate releases), or before it finished (OPEN/HELD -> DROPPED; nothing is counted).
 * `out` says whether that was the record's last rank. False when there is no record or that rank was
 * resolved already. */
bool pdl__fanin_resolve(pdl_fanin_t *f, const char *transfer_id, int rank, pdl_fanin_outcome_t *out);

/* Take transfer_id's record out of the table whatever its ranks' states (nothing is remembered);
 * *data_out gets its data. False if there is no record. */
bool pdl__fanin_cancel(pdl_fanin_t *f, const char *transfer_id, void **data_out);

/* The data of transfer_id's record (NULL if none). Valid until the record leaves. */
void *pdl__fanin_data(const pdl_fanin_t *f, const char *transfer_id);
/* Calls fn for every record; fn may not call into the table. */
void pdl__fanin_foreach(const pdl_fanin_t *f, void (*fn)(void *arg, const char *transfer_id, void *data), void *arg);

/* Records in the table (transfers some rank has not resolved). */
size_t pdl__fanin_count(const pdl_fanin_t *f);
/* Does rank `rank` hold transfer_id (HELD)? */
bool pdl__fanin_is_held(const pdl_fanin_t *f, const char *transfer_id, int rank);
size_t pdl__fanin_parked_count(const pdl_fanin_t *f, int rank);
/* Releases rank `rank` counted so far for transfer_id (-1 if that rank does not hold it). */
int pdl__fanin_count_of(const pdl_fanin_t *f, const char *transfer_id, int rank);
/* Rank `rank`'s counters (zeros for a rank not counted here). */
void pdl__fanin_get_counters(const pdl_fanin_t *f, int rank, pdl_fanin_counters_t *out);

#endif /* PDL_CONNECTOR_FANIN_H */
