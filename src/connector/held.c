/*
 * held.c -- held transfers of a producer instance and the events they raise (SPEC §5).
 *
 * A held transfer (a READ hold, or a WRITE push) is recorded once per instance: its block ids and the
 * set of ranks that resolved it. vLLM frees a producer request only when every TP worker reported it
 * finished (KVOutputAggregator, reference §4.5): each rank resolves a transfer once -- its fan-in
 * reported (READ), its push finished (WRITE), or it expired after defer_timeout -- and the last one
 * frees the blocks. A rank that resolves twice (cannot happen by construction) is ignored.
 *
 * The per-rank release counting itself lives in each rank's fan-in (fanin.c), keyed by the same id:
 * it is that rank's state machine, not a second record of the blocks.
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

/* The host part of "host:port" / "[v6]:port" when it is a numeric address (no DNS: a name could
 * resolve to anything later), normalised as getnameinfo prints it; else "". */
static void numeric_host_of(const char *hostport, char *out, size_t cap)
{
    out[0] = '\0';
    char host[PDL_WIRE_HOST_MAX + 16];
    snprintf(host, sizeof(host), "%s", hostport[0] == '[' ? hostport + 1 : hostport);
    char *end = hostport[0] == '[' ? strchr(host, ']') : strrchr(host, ':');
    if (end)
        *end = '\0';
    pdl__host_numeric(host, false, out, cap);
}

bool pdl__held_release_allowed(pdl_rank_t *r, const char *transfer_id, const char *sender, char *expected, size_t cap)
{
    pdl_instance_t *inst = r->inst;
    expected[0] = '\0';
    if (sender == NULL || sender[0] == '\0')
        return true;
    if (inst->cfg.conn.read_mode)
        pdl_engine_grant_peer(r->mem.engine, transfer_id, expected, cap, NULL);
    if (expected[0] == '\0') {
        pthread_mutex_lock(&inst->held_mu);
        const pdl_held_t *h = pdl__strmap_get(&inst->held, transfer_id);
        if (h)
            snprintf(expected, cap, "%s", h->consumer_ip);
        pthread_mutex_unlock(&inst->held_mu);
    }
    return pdl__held_sender_is_consumer(inst, sender, expected);
}

bool pdl__held_sender_is_consumer(const pdl_instance_t *inst, const char *sender, const char *consumer)
{
    if (sender == NULL || sender[0] == '\0' || consumer[0] == '\0' || strcmp(sender, consumer) == 0)
        return true;
    /* The router sends failed releases for a decode leg that failed (src/router/release.c). */
    char proxy[64];
    return pdl__host_numeric(inst->cfg.conn.proxy_ip, false, proxy, sizeof(proxy)) == 0 && strcmp(sender, proxy) == 0;
}

void pdl__held_consumer_name(char *buf, size_t cap, const char *host, int hs_port)
{
    snprintf(buf, cap, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, hs_port);
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
    numeric_host_of(h->consumer, h->consumer_ip, sizeof(h->consumer_ip));
    memcpy(h->ids, ids, n * sizeof(uint32_t));
    h->n = n;
    pthread_mutex_lock(&inst->held_mu);
    int rc = pdl__strmap_put(&inst->held, transfer_id, h);
    if (rc == 0)
        inst->held_blocks += n;
    pthread_mutex_unlock(&inst->held_mu);
    if (rc == 0)
        return PDL_OK;
    free(h->ids);
    free(h);
    return rc > 0 ? pdl_error_set(err, PDL_ERR_BAD_STATE, "transfer %s is already held", transfer_id)
                  : pdl_error_set(err, PDL_ERR_NOMEM, "%s: out of memory", transfer_id);
}

/* READ mode only: a WRITE push's blocks are read by nobody but this process (rank.c grants). */
static void revoke(pdl_instance_t *inst, const char *transfer_id, int rank)
{
    if (inst->cfg.conn.read_mode)
        pdl__rank_revoke(inst, transfer_id, rank);
}

void pdl__held_cancel(pdl_instance_t *inst, const char *transfer_id)
{
    PDL_FOR_LOCAL(inst, i)
        revoke(inst, transfer_id, i);
    pthread_mutex_lock(&inst->held_mu);
    pdl_held_t *h = pdl__strmap_remove(&inst->held, transfer_id);
    if (h != NULL)
        inst->held_blocks -= h->n;
    pthread_mutex_unlock(&inst->held_mu);
    if (h != NULL) {
        free(h->ids);
        free(h);
    }
}

void pdl__held_rank_resolved(pdl_instance_t *inst, const char *transfer_id, int rank, bool expired)
{
    emit(inst, expired ? PDL_EVENT_RANK_EXPIRED : PDL_EVENT_RANK_REPORTED, transfer_id, rank);
    pdl_held_t *freed = NULL;
    pthread_mutex_lock(&inst->held_mu);
    pdl_held_t *h = pdl__strmap_get(&inst->held, transfer_id);
    if (h && !((h->rank_done[rank / 64] >> (rank % 64)) & 1u)) {
        h->rank_done[rank / 64] |= 1ull << (rank % 64);
        /* This rank's consumers released (or the lease ended): nobody may read its blocks any more. */
        revoke(inst, transfer_id, rank);
        /* One rank per process (local_rank): the other ranks' processes hold and count their own. */
        if (++h->resolved == inst->hi - inst->lo) {
            pdl__strmap_remove(&inst->held, transfer_id);
            inst->freeing++;
            freed = h;
        }
    }
    pthread_mutex_unlock(&inst->held_mu);
    if (freed) {
        if (inst->blocks != NULL) /* external_blocks: the caller frees them on PDL_EVENT_FREED */
            pdl__blockalloc_free(inst->blocks, freed->ids, freed->n);
        emit(inst, PDL_EVENT_FREED, transfer_id, -1);
        pthread_mutex_lock(&inst->held_mu);
        inst->held_blocks -= freed->n;
        inst->freeing--;
        pthread_mutex_unlock(&inst->held_mu);
        free(freed->ids);
        free(freed);
    }
}

static void free_held_v(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    pdl_held_t *h = value;
    free(h->ids);
    free(h);
}

void pdl__held_free_all(pdl_instance_t *inst)
{
    pdl__strmap_foreach(&inst->held, free_held_v, NULL);
    pdl__strmap_free(&inst->held);
}

/* ---- READ mode: holds ------------------------------------------------------------------------- */

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
    char consumer[PDL_WIRE_HOST_MAX + 16] = "";
    pdl_zmq_addr_t da;
    if (request_id != NULL && pdl_wire_parse_request_id(request_id, NULL, &da, NULL) == PDL_OK)
        pdl__held_consumer_name(consumer, sizeof(consumer), da.host, da.handshake_port);
    st = pdl__held_add(inst, transfer_id, ids, n, consumer, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "hold");
    st = inst->cfg.conn.read_mode ? pdl__rank_grant(inst, transfer_id, PDL_GRANT_READ, ids, n, err) : PDL_OK;
    if (st != PDL_OK) {
        pdl__held_cancel(inst, transfer_id);
        return st;
    }
    uint64_t now = pdl__clock_now_ns();
    PDL_FOR_LOCAL(inst, i) {
        pdl_rank_t *r = &inst->ranks[i];
        /* The peer's read request reaches the engine through a socket, which orders nothing for the
         * engine's serving threads; publish the caller's KV writes to them before the params go out. */
        pdl_engine_publish(r->mem.engine);
        bool reported = false;
        pthread_mutex_lock(&r->fan.mu);
        pdl_error_t e;
        pdl_status_t hst = pdl__fanin_hold(r->fan.fanin, transfer_id, now, &reported, &e);
        pthread_mutex_unlock(&r->fan.mu);
        if (hst != PDL_OK) {
            /* Cannot happen while the instance map refuses duplicates; resolve the rank so the blocks
             * are not stuck forever. */
            pdl_warn("rank %d: %s", i, e.msg);
            reported = true;
        }
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
    size_t n = inst->held.count + inst->freeing;
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

