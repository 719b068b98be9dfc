/*
 * push_recv.c -- WRITE mode, consumer (docs/protocol.md#write-flow): pdl_instance_expect_push and the
 * receive it returns (pdl_recv_t). The producer that pushes is push.c; what both use (the park, the
 * reaper's and abandon's entry points) is push_park.c and push.h.
 *
 * pdl_instance_expect_push registers a pdl_recv_t under the transfer id, then each consumer rank d sends
 * remote_blocks to each producer rank p of its group whose first consumer is d: every producer rank
 * learns the block list once (block ids are the same on every consumer rank). A rank's service thread
 * counts write_done for it (one per producer rank of its group; duplicates and ranks outside the group
 * are not counted); a rank finishes when it counted them all, or at transfer_timeout (checked by its
 * service thread), or when the watch finds a producer rank of its group gone. The receive completes when
 * every rank finished, so a failure never lets the caller free blocks another producer rank may still be
 * writing.
 *
 * The receives are guarded by inst->push_mu (push.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connector/notify.h"
#include "connector/push.h"
#include "common/clock.h"

struct pdl_recv {
    pdl_instance_t *inst;
    pthread_cond_t cv;
    char transfer_id[PDL_WIRE_ID_MAX + 1];
    int producer_tp, expected, pending;
    /* The producer instance, for the watch (watch.c): host, handshake base, DP rank */
    char phost[PDL_WIRE_HOST_MAX + 1];
    char phost_ip[64]; /* phost when numeric: where its write_done must come from ("" = not checked) */
    int phs_base, pdp;
    bool producer_gone; /* the watch failed it (counted once in producer_gone_failed) */
    bool in_map;
    uint64_t deadline_ns;
    int *count;        /* per consumer rank */
    bool *done;        /* per consumer rank */
    bool *failed;      /* per consumer rank: a write_done said failed */
    int rank_failed_by;
    uint64_t (*seen)[PDL_TOPO_MAX_TP / 64]; /* per consumer rank: producer ranks counted */
    pdl_status_t status;
    char msg[PDL_ERR_MSG_LEN];
};

static void recv_free_parts(pdl_recv_t *rv)
{
    free(rv->count);
    free(rv->done);
    free(rv->failed);
    free(rv->seen);
    pthread_cond_destroy(&rv->cv);
    free(rv);
}

/* Under push_mu: consumer rank `rank` finished; wakes the waiter when every rank did. */
static void recv_rank_finish(pdl_recv_t *rv, int rank, pdl_status_t st, const char *msg)
{
    if (rv->done[rank])
        return;
    rv->done[rank] = true;
    if (st != PDL_OK && rv->status == PDL_OK) {
        rv->status = st;
        /* msg may fill a whole error buffer: keep what fits after the prefix (at most 27 bytes). */
        snprintf(rv->msg, sizeof(rv->msg), "consumer rank %d: %.*s", rank, (int)sizeof(rv->msg) - 28, msg);
    }
    /* No producer rank of its group writes into this rank's blocks any more. */
    pdl__rank_revoke(rv->inst, rv->transfer_id, rank);
    if (--rv->pending == 0) {
        pdl__strmap_remove(&rv->inst->recvs, rv->transfer_id);
        rv->in_map = false;
        pthread_cond_broadcast(&rv->cv);
    }
}

/*
 * Under push_mu, consumer: a failed write_done for a transfer not expected (yet). Before its receive
 * starts, no producer rank has the block list, so it can only be a producer's abandon (the prefill
 * refused the request; the router sends both WRITE legs at once, so this can come first). Parked under
 * "0|transfer id" (rank 0's reaper drops it after defer_timeout; at most half the park), it fails the
 * receive at once when pdl_instance_expect_push comes.
 */
static void park_early_failure(pdl_instance_t *inst, const char *transfer_id, const char *sender)
{
    char key[PDL_PARK_KEY_MAX];
    pdl__park_key(key, 0, transfer_id);
    if (inst->parked.count >= PDL_PARK_MAX / 2 || pdl__strmap_get(&inst->parked, key) != NULL)
        return;
    pdl_parked_t *k = calloc(1, sizeof(*k));
    if (k == NULL)
        return;
    k->rank = inst->lo; /* reaped by the first local rank (rank 0 may run in another process) */
    k->abandoned = true;
    snprintf(k->sender, sizeof(k->sender), "%s", sender ? sender : ""); /* checked when the receive starts */
    k->at_ns = pdl__clock_now_ns();
    if (pdl__strmap_put(&inst->parked, key, k) != 0)
        free(k);
}

void pdl__push_on_write_done(pdl_rank_t *r, const pdl_msg_t *msg, const char *sender)
{
    pdl_instance_t *inst = r->inst;
    int counted = 0; /* 1 counted, 0 late */
    bool failed = msg->status == PDL_RELEASE_FAILED;
    pthread_mutex_lock(&inst->push_mu);
    pdl_recv_t *rv = pdl__strmap_get(&inst->recvs, msg->transfer_id);
    if (rv != NULL && !pdl__sent_by(sender, rv->phost_ip)) {
        /* The receive names its producer: a write_done from anyone else would end the wait before the
         * producer wrote -- the decode would then go on from whatever its blocks hold. */
        char expected[64];
        snprintf(expected, sizeof(expected), "%s", rv->phost_ip);
        pthread_mutex_unlock(&inst->push_mu);
        PDL_CTR_REFUSED(r, write_done_refused, "refused a write_done of transfer %.100s from %s: its producer is %s",
                        msg->transfer_id, sender, expected);
        return;
    }
    if (rv == NULL && failed && msg->transfer_id[0] != '\0')
        park_early_failure(inst, msg->transfer_id, sender);
    if (rv != NULL && !rv->done[r->rank]) {
        int first = 0, count = 0;
        bool ok_rank = true;
        if (msg->producer_tp_rank >= 0) {
            ok_rank = pdl_topo_group(rv->producer_tp, inst->tp, r->rank, &first, &count, NULL) == PDL_OK &&
                      msg->producer_tp_rank >= first && msg->producer_tp_rank < first + count &&
                      (msg->producer_tp_size < 0 || msg->producer_tp_size == rv->producer_tp);
            if (ok_rank) {
                int pr = (int)msg->producer_tp_rank;
                uint64_t bit = 1ull << (pr % 64);
                if (rv->seen[r->rank][pr / 64] & bit)
                    ok_rank = false; /* duplicate */
                else
                    rv->seen[r->rank][pr / 64] |= bit;
            }
        }
        if (ok_rank) {
            counted = 1;
            rv->count[r->rank]++;
            /* A failed one still counts: the rank finishes only when no producer rank of its group
             * can be writing into its blocks any more. */
            if (failed && rv->rank_failed_by < 0)
                rv->rank_failed_by = (int)msg->producer_tp_rank;
            if (failed)
                rv->failed[r->rank] = true;
            if (rv->count[r->rank] >= rv->expected)
                recv_rank_finish(rv, r->rank, rv->failed[r->rank] ? PDL_ERR_TRANSPORT : PDL_OK,
                                 "a producer rank reported its write failed (write_done status failed)");
        }
    }
    /* Counted before the receive can be seen finished (ctr_mu is a leaf), so a waiter reads them. */
    pthread_mutex_lock(&r->ctr.mu);
    if (counted)
        r->ctr.v.write_done_received++;
    else
        r->ctr.v.write_done_late++;
    if (failed)
        r->ctr.v.write_done_failed_status++;
    pthread_mutex_unlock(&r->ctr.mu);
    pthread_mutex_unlock(&inst->push_mu);
    if (!counted)
        pdl_debug("rank %d: write_done for %s from producer rank %" PRId64 " not counted (late, duplicate or outside "
                  "the group)",
                  r->rank, msg->transfer_id, msg->producer_tp_rank);
}

/* A receive of transfer tid from producer pr, expecting `expected` write_done per local rank. */
static pdl_recv_t *recv_new(pdl_instance_t *inst, const char *tid, const pdl_peer_addr_t *pr, int expected)
{
    int D = inst->tp;
    pdl_recv_t *rv = calloc(1, sizeof(*rv));
    if (rv == NULL)
        return NULL;
    rv->count = calloc((size_t)D, sizeof(int));
    rv->done = calloc((size_t)D, sizeof(bool));
    rv->seen = calloc((size_t)D, sizeof(*rv->seen));
    rv->failed = calloc((size_t)D, sizeof(bool));
    rv->rank_failed_by = -1;
    pdl__clock_cond_init(&rv->cv);
    if (rv->count == NULL || rv->done == NULL || rv->seen == NULL || rv->failed == NULL) {
        recv_free_parts(rv);
        return NULL;
    }
    rv->inst = inst;
    snprintf(rv->transfer_id, sizeof(rv->transfer_id), "%s", tid);
    rv->producer_tp = pr->tp;
    snprintf(rv->phost, sizeof(rv->phost), "%s", pr->host);
    memcpy(rv->phost_ip, pr->ip, sizeof(rv->phost_ip));
    rv->phs_base = pr->hs_base;
    rv->pdp = pr->dp;
    rv->expected = expected;
    rv->pending = inst->hi - inst->lo;
    rv->status = PDL_OK;
    rv->deadline_ns = pdl__clock_now_ns() + (uint64_t)(inst->cfg.conn.transfer_timeout_s * 1e9);
    return rv;
}

/*
 * Put rv in the map of receives. A failed write_done parked before it (park_early_failure) from its
 * producer's host finishes every local rank at once: *abandoned_p is then true and nobody will push. One
 * from another host is refused (counted) and the receive goes ahead. Returns pdl__strmap_put's result:
 * 0, > 0 when the transfer is already expected, < 0 out of memory.
 */
static int recv_register(pdl_instance_t *inst, pdl_recv_t *rv, bool *abandoned_p)
{
    char early_key[PDL_PARK_KEY_MAX];
    pdl__park_key(early_key, 0, rv->transfer_id);
    pthread_mutex_lock(&inst->push_mu);
    int rc = pdl__strmap_put(&inst->recvs, rv->transfer_id, rv);
    rv->in_map = rc == 0;
    pdl_parked_t *early = rc == 0 ? pdl__strmap_remove(&inst->parked, early_key) : NULL;
    bool early_forged = early != NULL && !pdl__sent_by(early->sender, rv->phost_ip);
    char early_from[64] = "";
    if (early_forged) { /* not from the producer this receive names: ignored, the receive goes ahead */
        snprintf(early_from, sizeof(early_from), "%s", early->sender);
        pdl__parked_free(early);
        early = NULL;
    }
    if (early != NULL)
        PDL_FOR_LOCAL(inst, d)
            recv_rank_finish(rv, d, PDL_ERR_TRANSPORT,
                             "the producer abandoned the transfer (a failed write_done came before this receive)");
    pthread_mutex_unlock(&inst->push_mu);
    if (early_forged)
        PDL_CTR_REFUSED(pdl__rank_first(inst), write_done_refused,
                        "refused a failed write_done of transfer %.100s from %s (parked before the receive): its "
                        "producer is %s", rv->transfer_id, early_from, rv->phost_ip);
    *abandoned_p = early != NULL;
    pdl__parked_free(early);
    return rc;
}

/* remote_blocks: consumer rank d to each producer rank g of its group whose first consumer is d. A send
 * that fails is logged; the receive then ends at transfer_timeout or when the watch finds g gone. */
static void send_remote_blocks(pdl_instance_t *inst, const char *tid, const char *request_id,
                               const uint32_t *local_blocks, size_t n, const pdl_peer_addr_t *pr)
{
    pdl_notify_t note = {.note = PDL_NOTE_REMOTE_BLOCKS,
                         .transfer_id = tid,
                         .request_id = request_id,
                         .blocks = local_blocks,
                         .nblocks = n,
                         .to = pr,
                         .set = PDL_NOTIFY_SPOKEN};
    PDL_FOR_LOCAL(inst, d) {
        pdl_error_t e;
        if (pdl__notify(&inst->ranks[d], &note, NULL, &e) != PDL_OK)
            pdl_warn("rank %d: no remote_blocks sent: %s", d, e.msg);
    }
}

pdl_status_t pdl_instance_expect_push(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                      const uint32_t *local_blocks, size_t n, pdl_recv_t **recv_out, pdl_error_t *err)
{
    if (inst == NULL || params == NULL || recv_out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "expect_push: missing argument");
    if (inst->cfg.conn.read_mode || inst->cfg.conn.role != PDL_ROLE_CONSUMER)
        return pdl_error_set(err, PDL_ERR_BAD_STATE,
                             "expect_push: needs a consumer instance in WRITE mode (read_mode false)");
    if (atomic_load(&inst->stopping))
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "expect_push: instance is shutting down");
    const char *tid = params->transfer_id;
    if (tid[0] == '\0')
        return pdl_error_set(err, PDL_ERR_INVALID, "expect_push: kv_transfer_params.transfer_id is missing");
    if (n == 0 || local_blocks == NULL || n > PDL_WIRE_MAX_BLOCKS)
        return pdl_error_set(err, PDL_ERR_INVALID, "expect_push %s: %zu local blocks", tid, n);
    pdl_status_t st = pdl__blocks_check(inst, local_blocks, n, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "expect_push %s: local blocks", tid);
    pdl_peer_addr_t pr;
    st = pdl__resolve_peer(inst, params, request_id, PDL_ROLE_PRODUCER, "expect_push", &pr, err);
    if (st != PDL_OK)
        return st;
    int expected = 0;
    pdl_error_t e;
    if (pdl_topo_expected_write_done(pr.tp, inst->tp, &expected, &e) != PDL_OK)
        return pdl_error_set(err, PDL_ERR_INVALID, "expect_push %s: producer TP %d with consumer TP %d: %s", tid,
                             pr.tp, inst->tp, e.msg);
    pdl_recv_t *rv = recv_new(inst, tid, &pr, expected);
    if (rv == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "expect_push: out of memory");
    bool abandoned = false;
    int rc = recv_register(inst, rv, &abandoned);
    if (rc != 0) {
        recv_free_parts(rv);
        return rc > 0 ? pdl_error_set(err, PDL_ERR_BAD_STATE, "expect_push: transfer %s is already expected", tid)
                      : pdl_error_set(err, PDL_ERR_NOMEM, "expect_push %s: out of memory", tid);
    }
    if (abandoned) {
        /* No remote_blocks: nobody will push. pdl_recv_wait reports the failure at once. */
        *recv_out = rv;
        return PDL_OK;
    }
    /* Before remote_blocks goes out: the producers' writes into these blocks name the transfer, and come
     * from the producer's host (pr.ip; "" for a host name: not checked, as its write_done is not), so
     * another host that learned the transfer id writes nothing into them (docs/security.md). */
    st = pdl__rank_grant_to(inst, tid, PDL_GRANT_WRITE, local_blocks, n, pr.ip, err);
    if (st != PDL_OK) {
        pdl_recv_free(rv);
        pdl_error_prefix(err, st, "expect_push");
        return st;
    }
    send_remote_blocks(inst, tid, request_id, local_blocks, n, &pr);
    *recv_out = rv;
    return PDL_OK;
}

pdl_status_t pdl_recv_wait(pdl_recv_t *rv, int timeout_ms, pdl_error_t *err)
{
    if (rv == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "recv_wait: no receive");
    pdl_instance_t *inst = rv->inst;
    uint64_t deadline = pdl__clock_deadline_ms(timeout_ms);
    pthread_mutex_lock(&inst->push_mu);
    while (rv->pending > 0 && pdl__clock_cond_wait(&rv->cv, &inst->push_mu, deadline))
        ;
    pdl_status_t st;
    if (rv->pending > 0)
        st = pdl_error_set(err, PDL_INPROGRESS, "receive %s: %d ranks still waiting for write_done after %d ms",
                           rv->transfer_id, rv->pending, timeout_ms);
    else if (rv->status != PDL_OK)
        st = pdl_error_set(err, rv->status, "receive %s: %s", rv->transfer_id, rv->msg);
    else
        st = PDL_OK;
    pthread_mutex_unlock(&inst->push_mu);
    /* The producer's writes reached our memory through its threads or our engine's; the write_done
     * that finished the wait came after them. Take the engine locks so this thread's reads are
     * ordered after what those threads did under them. */
    if (st == PDL_OK)
        PDL_FOR_LOCAL(inst, i)
            pdl_engine_publish(inst->ranks[i].mem.engine);
    return st;
}

int pdl_recv_write_done(pdl_recv_t *rv, int tp_rank)
{
    if (rv == NULL || !pdl__is_local(rv->inst, tp_rank))
        return -1;
    pthread_mutex_lock(&rv->inst->push_mu);
    int v = rv->count[tp_rank];
    pthread_mutex_unlock(&rv->inst->push_mu);
    return v;
}

void pdl_recv_free(pdl_recv_t *rv)
{
    if (rv == NULL)
        return;
    pdl_instance_t *inst = rv->inst;
    pthread_mutex_lock(&inst->push_mu);
    if (rv->in_map) {
        pdl__strmap_remove(&inst->recvs, rv->transfer_id);
        pdl__rank_revoke(inst, rv->transfer_id, -1); /* abandoned before every rank finished */
    }
    pthread_mutex_unlock(&inst->push_mu);
    recv_free_parts(rv);
}

/* ---- consumer: producers that are gone (the watch, watch.c) ------------------------------------ */

typedef struct watch_walk {
    pdl_instance_t *inst;
    pdl_watch_item_fn fn;
    void *arg;
} watch_walk_t;

static void watch_recv(void *arg, const char *key, void *value)
{
    (void)key;
    watch_walk_t *w = arg;
    pdl_recv_t *rv = value;
    int P = rv->producer_tp, D = w->inst->tp;
    uint64_t named[PDL_TOPO_MAX_TP / 64] = {0};
    PDL_FOR_LOCAL(w->inst, d) {
        int gfirst = 0, gcount = 0;
        if (rv->done[d] || pdl_topo_group(P, D, d, &gfirst, &gcount, NULL) != PDL_OK)
            continue;
        for (int g = gfirst; g < gfirst + gcount; g++) {
            if (named[g / 64] & (1ull << (g % 64)))
                continue;
            named[g / 64] |= 1ull << (g % 64);
            int off = pdl_topo_port_offset(rv->pdp, P, g);
            if (off < 0 || rv->phs_base + off > 65535)
                continue;
            char peer[PDL_WIRE_HOST_MAX + 16], item[PDL_WIRE_ID_MAX + 16];
            pdl__peer_name(peer, sizeof(peer), rv->phost, rv->phs_base + off);
            snprintf(item, sizeof(item), "%d|%s", g, rv->transfer_id);
            w->fn(w->arg, peer, item);
        }
    }
}

void pdl__push_watch_producers(pdl_instance_t *inst, pdl_watch_item_fn fn, void *arg)
{
    watch_walk_t w = {.inst = inst, .fn = fn, .arg = arg};
    pthread_mutex_lock(&inst->push_mu);
    pdl__strmap_foreach(&inst->recvs, watch_recv, &w);
    pthread_mutex_unlock(&inst->push_mu);
}

bool pdl__push_producer_gone(pdl_rank_t *r0, const char *transfer_id, int prank, const char *peer, const char *why)
{
    pdl_instance_t *inst = r0->inst;
    bool failed = false;
    pthread_mutex_lock(&inst->push_mu);
    pdl_recv_t *rv = pdl__strmap_get(&inst->recvs, transfer_id);
    if (rv != NULL && prank >= 0 && prank < rv->producer_tp) {
        char msg[PDL_ERR_MSG_LEN];
        int len = snprintf(msg, sizeof(msg), "producer %.200s (producer tp rank %d) is gone (", peer, prank);
        snprintf(msg + len, sizeof(msg) - (size_t)len,
                 "%.100s): its write_done will not come; failed at once instead of after transfer_timeout", why);
        bool first = !rv->producer_gone;
        rv->producer_gone = true;
        if (first) /* before the waiter can wake (push_mu is held): it sees the count */
            PDL_CTR_ADD(r0, producer_gone_failed, 1);
        PDL_FOR_LOCAL(inst, d) {
            int gfirst = 0, gcount = 0;
            if (rv->done[d] || pdl_topo_group(rv->producer_tp, inst->tp, d, &gfirst, &gcount, NULL) != PDL_OK ||
                prank < gfirst || prank >= gfirst + gcount)
                continue;
            recv_rank_finish(rv, d, PDL_ERR_PEER_GONE, msg);
            failed = true;
        }
    }
    pthread_mutex_unlock(&inst->push_mu);
    return failed;
}

/* ---- abandon and reaping ---------------------------------------------------------------------- */

/* Consumer: a failed release to every producer rank, each once (pdl__push_on_abandon frees it there). */
pdl_status_t pdl__recv_abandon(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               pdl_error_t *err)
{
    pdl_peer_addr_t pr;
    pdl_status_t st = pdl__resolve_peer(inst, params, request_id, PDL_ROLE_PRODUCER, "abandon", &pr, err);
    pdl_notify_t n = {.note = PDL_NOTE_RELEASE,
                      .transfer_id = params->transfer_id,
                      .to = &pr,
                      .set = PDL_NOTIFY_SPOKEN,
                      .stop_at_error = true};
    for (int d = inst->lo; st == PDL_OK && d < inst->hi; d++)
        st = pdl__notify(&inst->ranks[d], &n, NULL, err);
    return st;
}

/* The receives rank `rank` timed out, collected under push_mu and finished after the walk. */
typedef struct recv_reap {
    int rank;
    uint64_t now;
    pdl_recv_t **late;
    size_t n, cap;
} recv_reap_t;

static void reap_recv(void *arg, const char *key, void *value)
{
    (void)key;
    recv_reap_t *c = arg;
    pdl_recv_t *rv = value;
    if (rv->done[c->rank] || c->now < rv->deadline_ns)
        return;
    if (c->n == c->cap) {
        size_t nc = c->cap ? 2 * c->cap : 8;
        pdl_recv_t **nv = realloc(c->late, nc * sizeof(*nv));
        if (nv == NULL)
            return;
        c->late = nv;
        c->cap = nc;
    }
    c->late[c->n++] = rv;
}

void pdl__recv_reap(pdl_rank_t *r)
{
    pdl_instance_t *inst = r->inst;
    recv_reap_t c = {.rank = r->rank};
    char tmsg[128];
    snprintf(tmsg, sizeof(tmsg), "write_done not all received within transfer_timeout %.1f s",
             inst->cfg.conn.transfer_timeout_s);
    pthread_mutex_lock(&inst->push_mu);
    c.now = pdl__clock_now_ns();
    if (inst->recvs.count > 0)
        pdl__strmap_foreach(&inst->recvs, reap_recv, &c);
    for (size_t i = 0; i < c.n; i++)
        recv_rank_finish(c.late[i], r->rank, PDL_ERR_TIMEOUT, tmsg);
    pthread_mutex_unlock(&inst->push_mu);
    free(c.late);
}

static void orphan_recv(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    ((pdl_recv_t *)value)->in_map = false; /* the caller still frees it */
}

void pdl__recv_orphan_all(pdl_instance_t *inst)
{
    pdl__strmap_foreach(&inst->recvs, orphan_recv, NULL);
    pdl__strmap_free(&inst->recvs);
}
