/*
 * held.c -- held transfers of a producer instance and the events they raise (docs/protocol.md#leases).
 *
 * A held transfer (a READ hold, or a WRITE push) is recorded once per instance, in the instance's
 * held-transfer table (fanin.c): one record per transfer id carrying its blocks and consumer
 * (pdl_held_t) and each rank's release fan-in and lease. vLLM frees a producer request only when every
 * TP worker reported it finished (its KVOutputAggregator; docs/protocol.md#release): each rank resolves a transfer
 * once -- its fan-in reported (READ), its push finished (WRITE), or it expired after defer_timeout --
 * and the last one frees the blocks. A rank that resolves twice (cannot happen by construction) is
 * ignored.
 *
 * This file is the table's only door: it holds inst->held_mu around every call into it (one mutex for
 * all the instance's ranks: the table is pure and each call is short), revokes a resolved rank's grant
 * under that lock (so no rank's grant outlives the blocks another rank frees), and delivers events and
 * frees blocks after releasing it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connector/internal.h"
#include "common/clock.h"

static void emit(pdl_instance_t *inst, pdl_instance_event_t ev, const char *transfer_id, int rank)
{
    pthread_mutex_lock(&inst->cb_mu);
    pdl_instance_event_fn fn = inst->event_fn;
    void *arg = inst->event_arg;
    pthread_mutex_unlock(&inst->cb_mu);
    if (fn)
        fn(arg, ev, transfer_id, rank);
}

void pdl_instance_set_event_fn(pdl_instance_t *inst, pdl_instance_event_fn fn, void *arg)
{
    pthread_mutex_lock(&inst->cb_mu);
    inst->event_fn = fn;
    inst->event_arg = arg;
    pthread_mutex_unlock(&inst->cb_mu);
}

bool pdl__held_release_allowed(pdl_rank_t *r, const char *transfer_id, const char *sender, char *expected, size_t cap)
{
    pdl_instance_t *inst = r->inst;
    expected[0] = '\0';
    if (sender == NULL || sender[0] == '\0')
        return true;
    /* The consumer the transfer was made for binds it: the decode its request id names (the router
     * chose it: pdl_instance_hold_for), or the host a push writes to. Only a hold that names none falls
     * back to the host its grant was first served to -- whoever read first, an attacker as well: were the first
     * reader always "the consumer", it would have the real decode's release refused and could pin the
     * blocks with its keepalives. */
    pthread_mutex_lock(&inst->held_mu);
    const pdl_held_t *h = pdl__fanin_data(inst->held, transfer_id);
    if (h)
        snprintf(expected, cap, "%s", h->consumer_ip);
    pthread_mutex_unlock(&inst->held_mu);
    /* Per-layer registrations have a grant per layer: the first served names the host. */
    for (int l = 0; expected[0] == '\0' && inst->cfg.conn.read_mode && l < (r->mem.layer_kv ? inst->cfg.model.num_layers : 1);
         l++) {
        char g[PDL_GRANT_NAME_MAX + 1];
        pdl__grant_name(g, sizeof(g), transfer_id, r->mem.layer_kv != NULL, l);
        pdl_engine_grant_peer(r->mem.engine, g, expected, cap, NULL);
    }
    return pdl__held_sender_is_consumer(inst, sender, expected);
}

bool pdl__held_sender_is_consumer(const pdl_instance_t *inst, const char *sender, const char *consumer)
{
    if (pdl__sent_by(sender, consumer))
        return true;
    /* The router sends failed releases for a decode leg that failed (src/router/release.c). */
    char proxy[64];
    pdl__numeric_host(inst->cfg.conn.proxy_ip, proxy);
    return proxy[0] != '\0' && strcmp(sender, proxy) == 0;
}

pdl_status_t pdl__held_add(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n,
                           const char *consumer, pdl_error_t *err)
{
    pdl_held_t *h = calloc(1, sizeof(*h));
    if (h == NULL || (h->ids = malloc(n * sizeof(uint32_t))) == NULL) {
        free(h);
        return pdl_error_set(err, PDL_ERR_NOMEM, "%s: out of memory", transfer_id);
    }
    snprintf(h->consumer, sizeof(h->consumer), "%s", consumer ? consumer : "");
    pdl__numeric_host_of_name(h->consumer, h->consumer_ip);
    memcpy(h->ids, ids, n * sizeof(uint32_t));
    h->n = n;
    pthread_mutex_lock(&inst->held_mu);
    pdl_status_t st = pdl__fanin_add(inst->held, transfer_id, h, err);
    if (st == PDL_OK)
        inst->held_blocks += n;
    pthread_mutex_unlock(&inst->held_mu);
    if (st != PDL_OK) {
        free(h->ids);
        free(h);
    }
    return st;
}

/* READ mode only: a WRITE push's blocks are read by nobody but this process (rank.c grants). */
static void revoke(pdl_instance_t *inst, const char *transfer_id, int rank)
{
    if (inst->cfg.conn.read_mode)
        pdl__rank_revoke(inst, transfer_id, rank);
}

/* Revoke transfer_id's grants on every local rank, then take its record out of the table (revoked
 * first, as the release path does, so no peer reads blocks about to be reused). The record, or NULL
 * when there is none, is the caller's. */
static pdl_held_t *take(pdl_instance_t *inst, const char *transfer_id)
{
    PDL_FOR_LOCAL(inst, i)
        revoke(inst, transfer_id, i);
    void *data = NULL;
    pthread_mutex_lock(&inst->held_mu);
    pdl__fanin_cancel(inst->held, transfer_id, &data);
    pdl_held_t *h = data;
    if (h != NULL)
        inst->held_blocks -= h->n;
    pthread_mutex_unlock(&inst->held_mu);
    return h;
}

static void held_free(pdl_held_t *h)
{
    if (h != NULL) {
        free(h->ids);
        free(h);
    }
}

void pdl__held_cancel(pdl_instance_t *inst, const char *transfer_id) { held_free(take(inst, transfer_id)); }

pdl_status_t pdl_instance_drop(pdl_instance_t *inst, const char *transfer_id, pdl_error_t *err)
{
    if (inst == NULL || transfer_id == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "drop: no instance or transfer id");
    if (!inst->cfg.conn.read_mode)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "drop of %s: a WRITE-mode instance gives a push up with pdl_instance_abandon", transfer_id);
    pthread_mutex_lock(&inst->held_mu);
    bool found = pdl__fanin_data(inst->held, transfer_id) != NULL;
    pthread_mutex_unlock(&inst->held_mu);
    if (!found)
        return pdl_error_set(err, PDL_ERR_NOT_FOUND, "drop of %s: no such hold (never made, freed or dropped)",
                             transfer_id);
    pdl_held_t *h = take(inst, transfer_id);
    if (h == NULL) /* freed by its releases between the look-up and the take: nothing left to drop */
        return pdl_error_set(err, PDL_ERR_NOT_FOUND, "drop of %s: freed meanwhile", transfer_id);
    if (inst->blocks != NULL) {
        pdl__scrub_blocks(inst, h->ids, h->n);
        pdl__blockalloc_free(inst->blocks, h->ids, h->n);
    }
    pdl_debug("transfer %s dropped by its producer (%zu blocks)", transfer_id, h->n);
    held_free(h);
    return PDL_OK;
}

void pdl__held_rank_resolved(pdl_instance_t *inst, const char *transfer_id, int rank, bool expired)
{
    emit(inst, expired ? PDL_EVENT_RANK_EXPIRED : PDL_EVENT_RANK_REPORTED, transfer_id, rank);
    pdl_fanin_outcome_t o;
    pthread_mutex_lock(&inst->held_mu);
    /* One rank per process (local_rank): the table counts this process's ranks only, so the last of
     * them frees; the other ranks' processes hold and count their own. */
    if (pdl__fanin_resolve(inst->held, transfer_id, rank, &o)) {
        /* This rank's consumers released (or the lease ended): nobody may read its blocks any more. */
        revoke(inst, transfer_id, rank);
        if (o.last)
            inst->freeing++;
    }
    pthread_mutex_unlock(&inst->held_mu);
    pdl_held_t *freed = o.last ? o.data : NULL;
    if (freed == NULL)
        return;
    if (inst->blocks != NULL) { /* external_blocks: the caller frees them on PDL_EVENT_FREED */
        pdl__scrub_blocks(inst, freed->ids, freed->n);
        pdl__blockalloc_free(inst->blocks, freed->ids, freed->n);
    }
    emit(inst, PDL_EVENT_FREED, transfer_id, -1);
    pthread_mutex_lock(&inst->held_mu);
    inst->held_blocks -= freed->n;
    inst->freeing--;
    pthread_mutex_unlock(&inst->held_mu);
    held_free(freed);
}

pdl_fanin_result_t pdl__held_release(pdl_rank_t *r, const pdl_fanin_release_t *rel, pdl_error_t *err)
{
    pthread_mutex_lock(&r->inst->held_mu);
    pdl_fanin_result_t res = pdl__fanin_release(r->inst->held, r->rank, rel, pdl__clock_now_ns(), err);
    pthread_mutex_unlock(&r->inst->held_mu);
    if (res == PDL_FANIN_REPORTED)
        pdl__held_rank_resolved(r->inst, rel->transfer_id, r->rank, false);
    return res;
}

bool pdl__held_keepalive(pdl_rank_t *r, const char *transfer_id)
{
    pthread_mutex_lock(&r->inst->held_mu);
    bool ok = pdl__fanin_keepalive(r->inst->held, transfer_id, r->rank, pdl__clock_now_ns());
    pthread_mutex_unlock(&r->inst->held_mu);
    return ok;
}

/* Expired transfers are taken from the table in batches this size, their ids copied here under held_mu
 * and resolved after it: nothing to allocate, so nothing can fail between the two. */
#define HELD_REAP_BATCH 32

typedef struct reap_batch {
    size_t n;
    char ids[HELD_REAP_BATCH][PDL_WIRE_ID_MAX + 1];
} reap_batch_t;

static void take_expired(void *arg, const char *transfer_id)
{
    reap_batch_t *b = arg;
    snprintf(b->ids[b->n++], sizeof(b->ids[0]), "%s", transfer_id);
}

void pdl__held_reap(pdl_rank_t *r)
{
    pdl_instance_t *inst = r->inst;
    reap_batch_t b;
    do {
        b.n = 0;
        pthread_mutex_lock(&inst->held_mu);
        pdl__fanin_reap(inst->held, r->rank, pdl__clock_now_ns(), HELD_REAP_BATCH, take_expired, &b);
        pthread_mutex_unlock(&inst->held_mu);
        for (size_t i = 0; i < b.n; i++) {
            uint64_t sup = 0;
            if (pdl_ratelimit_allow(&r->ctr.expired_rl, &sup))
                pdl_warn("rank %d: transfer %s reaped after defer_timeout %.1f s without its releases; blocks freed%s",
                         r->rank, b.ids[i], inst->cfg.conn.defer_timeout_s, sup ? " (more expiries suppressed)" : "");
            pdl__held_rank_resolved(inst, b.ids[i], r->rank, true);
        }
    } while (b.n == HELD_REAP_BATCH);
}

bool pdl__held_exists(pdl_instance_t *inst, const char *transfer_id)
{
    pthread_mutex_lock(&inst->held_mu);
    bool held = pdl__fanin_data(inst->held, transfer_id) != NULL;
    pthread_mutex_unlock(&inst->held_mu);
    return held;
}

void pdl__held_foreach(pdl_instance_t *inst, void (*fn)(void *arg, const char *transfer_id, void *held), void *arg)
{
    pthread_mutex_lock(&inst->held_mu);
    pdl__fanin_foreach(inst->held, fn, arg);
    pthread_mutex_unlock(&inst->held_mu);
}

pdl_status_t pdl__held_init(pdl_instance_t *inst, pdl_error_t *err)
{
    pdl_fanin_config_t fc = {.producer_tp = inst->tp,
                             .first_rank = inst->lo,
                             .ranks = inst->hi - inst->lo,
                             .defer_timeout_ns = (uint64_t)(inst->cfg.conn.defer_timeout_s * 1e9),
                             .max_parked = 1024,
                             .max_park_age_ns = 0,
                             .max_terminal = 4096};
    return pdl__fanin_create(&fc, &inst->held, err);
}

static void free_held_v(void *arg, const char *transfer_id, void *data)
{
    (void)arg;
    (void)transfer_id;
    pdl_held_t *h = data;
    free(h->ids);
    free(h);
}

void pdl__held_free_all(pdl_instance_t *inst)
{
    if (inst->held == NULL)
        return;
    pdl__fanin_foreach(inst->held, free_held_v, NULL);
    pdl__fanin_destroy(inst->held);
    inst->held = NULL;
}

/* ---- READ mode: holds ------------------------------------------------------------------------- */

/*
 * The sender check of a release parked before its hold (pdl__fanin_hold_from): the one a release that
 * arrives after the hold meets (pdl__held_release_allowed), against the consumer the hold names --
 * taken from anyone, a forged release parked first would complete the hold the moment it was made and
 * free the blocks before the real decode read them. A hold that names no consumer accepts every
 * sender, as its later releases' fallback (the host its grant is first served to) names nobody yet.
 */
typedef struct parked_check {
    const pdl_instance_t *inst;
    char consumer_ip[64];
    int refused;
    char first[64]; /* the first refused sender, for the log */
} parked_check_t;

static bool parked_from_consumer(void *arg, const char *sender)
{
    parked_check_t *pc = arg;
    if (pdl__held_sender_is_consumer(pc->inst, sender, pc->consumer_ip))
        return true;
    if (pc->refused++ == 0)
        snprintf(pc->first, sizeof(pc->first), "%s", sender);
    return false;
}

pdl_status_t pdl_instance_hold(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n,
                               pdl_error_t *err)
{
    return pdl_instance_hold_for(inst, transfer_id, NULL, ids, n, err);
}

pdl_status_t pdl_instance_hold_for(pdl_instance_t *inst, const char *transfer_id, const char *request_id,
                                   const uint32_t *ids, size_t n, pdl_error_t *err)
{
    if (transfer_id == NULL || transfer_id[0] == '\0' || strlen(transfer_id) > PDL_WIRE_ID_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID, "hold: transfer id empty or longer than %d bytes", PDL_WIRE_ID_MAX);
    if (n == 0 || ids == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "hold %s: no blocks", transfer_id);
    pdl_status_t st = pdl__blocks_check(inst, ids, n, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "hold %s", transfer_id);
    /* The consumer, when the request id names it (MoRIIO's "___decode_addr_"): watched by watch.c. */
    char consumer[PDL_WIRE_HOST_MAX + 16];
    st = pdl__resolve_hold_consumer(inst, transfer_id, request_id, consumer, sizeof(consumer), err);
    if (st != PDL_OK)
        return st;
    st = pdl__held_add(inst, transfer_id, ids, n, consumer, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "hold");
    st = inst->cfg.conn.read_mode ? pdl__rank_grant(inst, transfer_id, PDL_GRANT_READ, ids, n, err) : PDL_OK;
    if (st != PDL_OK) {
        pdl__held_cancel(inst, transfer_id);
        return st;
    }
    uint64_t now = pdl__clock_now_ns();
    parked_check_t pc = {.inst = inst};
    pdl__numeric_host_of_name(consumer, pc.consumer_ip);
    PDL_FOR_LOCAL(inst, i) {
        /* The peer's read request reaches the engine through a socket, which orders nothing for the
         * engine's serving threads; publish the caller's KV writes to them before the params go out. */
        pdl_engine_publish(inst->ranks[i].mem.engine);
        bool reported = false;
        pdl_error_t e;
        pc.refused = 0;
        pthread_mutex_lock(&inst->held_mu);
        pdl_status_t hst =
            pdl__fanin_hold_from(inst->held, transfer_id, i, now, parked_from_consumer, &pc, &reported, &e);
        pthread_mutex_unlock(&inst->held_mu);
        if (hst != PDL_OK) /* the rank was resolved meanwhile (its consumer is gone): nothing to hold */
            pdl_debug("rank %d: %s", i, e.msg);
        if (pc.refused > 0)
            PDL_CTR_REFUSED(&inst->ranks[i], releases_refused,
                            "refused %d release(s) of transfer %.100s parked before its hold, from %s: its "
                            "consumer is %s", pc.refused, transfer_id, pc.first, pc.consumer_ip);
        if (reported) {
            pdl_debug("rank %d: transfer %s completed by parked releases at hold", i, transfer_id);
            pdl__held_rank_resolved(inst, transfer_id, i, false);
        }
    }
    return PDL_OK;
}

size_t pdl_instance_held_transfers(pdl_instance_t *inst)
{
    pthread_mutex_lock(&inst->held_mu);
    size_t n = pdl__fanin_count(inst->held) + inst->freeing;
    pthread_mutex_unlock(&inst->held_mu);
    return n;
}

size_t pdl_instance_held_blocks(pdl_instance_t *inst)
{
    pthread_mutex_lock(&inst->held_mu);
    size_t n = inst->held_blocks;
    pthread_mutex_unlock(&inst->held_mu);
    return n;
}

