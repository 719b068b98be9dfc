/*
 * pull.c -- READ mode on the consumer (docs/protocol.md#read-flow, steps 2-3): pdl_instance_pull and the per-rank reader.
 *
 * A pull is one job per consumer rank, queued on that rank's READ lane for the producer instance
 * (xfer.c: one thread per remote instance, so a dead producer delays only the pulls from it). The lane
 * takes its jobs in order and, for one job: looks up its read plan (computed once per producer TP and cached: the
 * consumer's D, H and geometry are fixed for the instance), hands the plan's pieces to the transfer
 * executor (xfer.c: handshakes, one batched READ per layer per producer rank, the wait within
 * transfer_timeout), and then sends a
 * `release` to EVERY producer rank of its group -- read from or not, so P>D topologies free all
 * producer ranks (docs/topology.md#release-rule) -- with consumer_tp_size = D, consumer_tp_rank and status
 * "ok" or "failed". A failed or timed-out read makes the pull fail (a load error), never succeed.
 *
 * Peer addresses: remote_host / remote_handshake_port / remote_notify_port from the params when all
 * three are present, else the prefill address embedded in the request id (MoRIIO's two sources,
 * docs/protocol.md#peer-addresses). Dialed ports are base + remote_dp * P + producer rank
 * (docs/topology.md#ports).
 * Prefix caching: when the consumer passes fewer local blocks than the producer held, the LAST n
 * remote blocks are read (as upstream MoRIIO does: the decode's prefix-cache hit covers the
 * first blocks, so the remote list is trimmed from the front, never the local one).
 *
 * Lifetime: a pull is reference counted (the caller + one per rank job), so pdl_pull_free never waits
 * for the readers and a reader never touches freed memory. A hooked pull (pull_hook.h) runs the
 * caller's function on each rank after its reads and releases, and frees the caller's argument with
 * the pull.
 *
 * Failed releases go only to a verified producer: one whose handshake (get_meta_msg, answered as the
 * instance the params name) succeeded from this lane. Sent wherever a request's params pointed, ~1,100
 * invalid requests naming new notify endpoints would make ~1,100 DEALERs and exhaust the ZeroMQ
 * context. pdl_instance_abandon therefore runs on the lanes too: it handshakes
 * first (cached after the first time) and releases only a producer that answered.
 *
 * Timing: with debug logging each rank job logs where its time went (queued behind other pulls on this
 * rank, handshakes, descriptor building, posting -- which for shm includes the copy itself --, waiting,
 * releases, the hook).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "connector/digest.h"
#include "connector/internal.h"
#include "connector/notify.h"
#include "pdlink/pull_hook.h"
#include "common/clock.h"

static void pull_unref(pdl_pull_t *p)
{
    pthread_mutex_lock(&p->mu);
    int left = --p->refs;
    pthread_mutex_unlock(&p->mu);
    if (left > 0)
        return;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    if (p->rank_arg_free != NULL)
        p->rank_arg_free(p->rank_arg);
    free(p->release_sent_ns);
    free(p->local_blocks);
    free(p->remote_blocks);
    free(p);
}

static void pull_rank_done(pdl_pull_t *p, int rank, pdl_status_t st, const char *msg, uint64_t bytes, uint64_t descs)
{
    pthread_mutex_lock(&p->mu);
    p->bytes += bytes;
    p->descs += descs;
    if (st != PDL_OK && p->status == PDL_OK) {
        p->status = st;
        snprintf(p->msg, sizeof(p->msg), "consumer rank %d: %.280s", rank, msg);
    }
    if (--p->pending == 0) {
        p->end_ns = pdl__clock_now_ns();
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
}

static const pdl_read_plan_t *plan_get(pdl_rank_t *r, pdl_xfer_side_t *side, int P, pdl_error_t *err)
{
    for (int i = 0; i < side->nplans; i++)
        if (side->plans[i]->prefill_tp == P)
            return side->plans[i];
    pdl_read_plan_t *plan = malloc(sizeof(*plan));
    if (plan == NULL) {
        pdl_error_set(err, PDL_ERR_NOMEM, "read plan: out of memory");
        return NULL;
    }
    const pdl_model_geometry_t *g = &r->inst->cfg.model;
    if (pdl_topo_read_plan(P, r->inst->tp, g->total_kv_heads, g->is_mla, r->rank, plan, err) != PDL_OK) {
        free(plan);
        return NULL;
    }
    if (side->nplans == (int)(sizeof(side->plans) / sizeof(side->plans[0]))) {
        free(side->plans[0]); /* bounded cache: drop the oldest */
        memmove(side->plans, side->plans + 1, sizeof(side->plans[0]) * (size_t)(side->nplans - 1));
        side->nplans--;
    }
    side->plans[side->nplans++] = plan;
    return plan;
}

/* A rank's share of a pull, queued on its reader. */
typedef struct pull_job {
    pdl_workq_item_t item; /* first: the queue hands the item back as the job */
    pdl_pull_t *pull;
    uint64_t queued_ns;
} pull_job_t;

/* Reads of one rank through the executor: the plan's pieces, all from the pull's producer. */
static pdl_status_t rank_read(pdl_rank_t *r, pdl_xfer_side_t *side, pdl_pull_t *pull, const pdl_read_plan_t *plan, uint64_t *bytes_out,
                              uint64_t *descs_out, pdl_xfer_times_t *xt, bool *verified, pdl_error_t *err)
{
    pdl_xfer_piece_t pieces[PDL_TOPO_MAX_TP];
    for (int i = 0; i < plan->num_pieces; i++)
        pieces[i] = (pdl_xfer_piece_t){.remote_rank = plan->pieces[i].producer_rank, .piece = plan->pieces[i]};
    pdl_xfer_t x = {.dir = PDL_DIR_READ,
                    .peer = &pull->producer,
                    .pieces = pieces,
                    .npieces = plan->num_pieces,
                    .local_blocks = pull->local_blocks,
                    .remote_blocks = pull->remote_blocks,
                    .n = pull->n,
                    .grant = pull->transfer_id};
    return pdl__xfer_run(r, side, &x, bytes_out, descs_out, xt, verified, err);
}

/* Releases of one rank for a pull, on `dealers` (the lane's cache, or the service thread's). A failed
 * one only to a `verified` producer (see the top of the file); an ok one follows a read the producer
 * served under the transfer's grant, so its endpoint counts as verified for the socket cap. */
static void send_releases(pdl_rank_t *r, pdl_strmap_t *dealers, pdl_pull_t *pull, const pdl_read_plan_t *plan, bool ok,
                          bool verified)
{
    if (!ok && !verified) {
        PDL_CTR_REFUSED(r, releases_unverified,
                        "no failed release of %.100s sent to producer %.200s: no handshake with it succeeded here, so "
                        "its notify port is not known to be a MoRIIO peer's (a hold it has ends by its defer_timeout)",
                        pull->transfer_id, pull->producer.engine_id);
        return;
    }
    /* Stamped before the first release is queued, so a producer's report can never predate it. */
    pthread_mutex_lock(&pull->mu);
    pull->release_sent_ns[r->rank] = pdl__clock_now_ns();
    pthread_mutex_unlock(&pull->mu);
    pdl_notify_t n = {.note = PDL_NOTE_RELEASE,
                      .transfer_id = pull->transfer_id,
                      .ok = ok,
                      .to = &pull->producer,
                      .set = PDL_NOTIFY_GROUP,
                      .first = plan ? plan->group_first : 0,
                      .count = plan ? plan->group_count : 0,
                      .dealers = dealers,
                      /* ok: the producer served the read under the transfer's grant. A failed one goes to a
                       * producer whose handshake port answered, but to a notify port the params chose. */
                      .verified = ok};
    pdl_error_t e;
    if (pdl__notify(r, &n, NULL, &e) != PDL_OK)
        pdl_warn("rank %d: no release sent: %s", r->rank, e.msg);
}

/* A job that waited this long in the queue first extends the producer's lease (docs/protocol.md#leases). */
#define PULL_KEEPALIVE_AFTER_NS 1000000000ull

/* Keepalive to every producer rank of the group that is a cached pdlink peer. Upstream producers
 * treat an unknown message type as fatal for their notify listener, so they never get one. */
static bool not_pdlink(const pdl_rank_t *r, int g, const void *arg)
{
    (void)r;
    const pdl_xfer_side_t *side = ((const void *const *)arg)[0];
    const pdl_pull_t *pull = ((const void *const *)arg)[1];
    const pdl_peer_t *peer = pdl__peer_cached(side, &pull->producer, g);
    return peer == NULL || !peer->meta.has_pdlink;
}

static void send_keepalives(pdl_rank_t *r, pdl_xfer_side_t *side, pdl_pull_t *pull, const pdl_read_plan_t *plan)
{
    const void *both[2] = {side, pull};
    pdl_notify_t n = {.note = PDL_NOTE_KEEPALIVE,
                      .transfer_id = pull->transfer_id,
                      .to = &pull->producer,
                      .first = plan->group_first,
                      .count = plan->group_count,
                      .skip = not_pdlink,
                      .skip_arg = both,
                      .dealers = &side->dealers,
                      .verified = true};
    pdl_error_t e;
    if (pdl__notify(r, &n, NULL, &e) != PDL_OK)
        pdl_warn("rank %d: no keepalive sent: %s", r->rank, e.msg);
}

/* Is the lane's own instance the pull's producer, verified by an earlier handshake? */
static bool lane_verified(const pdl_xfer_side_t *side, const pdl_pull_t *pull)
{
    char key[sizeof(side->key)];
    snprintf(key, sizeof(key), "%s|%d", pull->producer.engine_id, pull->producer.dp);
    return strcmp(key, side->key) == 0 && atomic_load(&side->verified);
}

/* An abandon's share on rank r: verify every producer rank of the group (a handshake, or the cached
 * peer), then the failed releases -- to a producer that answered only. */
static void run_abandon(pdl_rank_t *r, pdl_xfer_side_t *side, pdl_pull_t *pull)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    const pdl_read_plan_t *plan = plan_get(r, side, pull->producer.tp, &err);
    bool verified = plan != NULL;
    for (int g = plan ? plan->group_first : 0; verified && g < plan->group_first + plan->group_count; g++) {
        pdl_peer_t *peer = NULL;
        pdl_status_t st = pdl__peer_get(r, side, &pull->producer, g, &peer, NULL, &err);
        verified = st == PDL_OK || st == PDL_ERR_MISMATCH; /* an incompatible peer answered all the same */
    }
    if (verified && lane_verified(side, pull) == false) {
        char key[sizeof(side->key)];
        snprintf(key, sizeof(key), "%s|%d", pull->producer.engine_id, pull->producer.dp);
        if (strcmp(key, side->key) == 0)
            atomic_store(&side->verified, true);
    }
    if (!verified)
        pdl_debug("rank %d: abandon of %s: producer %s not verified: %s", r->rank, pull->transfer_id,
                  pull->producer.engine_id, err.msg);
    send_releases(r, &side->dealers, pull, plan, false, verified);
    pull_rank_done(pull, r->rank, PDL_OK, "", 0, 0);
}

static void run_job(pdl_rank_t *r, pdl_xfer_side_t *side, pdl_pull_t *pull, uint64_t queued_ns)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    uint64_t bytes = 0, descs = 0;
    pdl_xfer_times_t xt = {0};
    uint64_t t0 = pdl__clock_now_ns();
    uint64_t queued = t0 - queued_ns;
    pdl_status_t st;
    bool verified = false;
    const pdl_read_plan_t *plan = plan_get(r, side, pull->producer.tp, &err);
    if (plan == NULL) {
        st = err.status != PDL_OK ? err.status : PDL_ERR_INVALID;
    } else {
        if (pdl__clock_now_ns() - queued_ns > PULL_KEEPALIVE_AFTER_NS)
            send_keepalives(r, side, pull, plan);
        st = rank_read(r, side, pull, plan, &bytes, &descs, &xt, &verified, &err);
        /* Every batch was waited for: the bytes are ours to digest (docs/integrity.md). */
        if (st == PDL_OK)
            st = pdl__digests_check(r, side, &pull->producer, pull->transfer_id, plan, pull->local_blocks, pull->n,
                                    &err);
    }
    uint64_t trel = pdl__clock_now_ns();
    send_releases(r, &side->dealers, pull, plan, st == PDL_OK, verified || lane_verified(side, pull));
    /* The producer looks gone: let the releases just sent leave (linger) and stop reconnecting to it
     * (sender.c: dead peers and self-connects). */
    if (st == PDL_ERR_PEER_GONE || st == PDL_ERR_TIMEOUT || st == PDL_ERR_TRANSPORT)
        pdl__dealers_sweep(&side->dealers, 0, 0);
    uint64_t thook = pdl__clock_now_ns();
    uint64_t release = thook - trel;
    /* The caller's per-rank work (pull_hook.h), after the releases so the producer never waits for it. */
    if (st == PDL_OK && pull->rank_fn != NULL)
        pull->rank_fn(pull->rank_arg, r->rank);
    uint64_t hook = pdl__clock_now_ns() - thook;
    pdl_debug("rank %d: pull %s: queued %.3f ms, peers %.3f, build %.3f, post %.3f, wait %.3f, release %.3f, "
              "hook %.3f, total %.3f ms; %llu bytes, %llu descs",
              r->rank, pull->transfer_id, queued / 1e6, xt.peers / 1e6, xt.build / 1e6, xt.post / 1e6, xt.wait / 1e6,
              release / 1e6, hook / 1e6, (pdl__clock_now_ns() - t0) / 1e6, (unsigned long long)bytes,
              (unsigned long long)descs);
    pthread_mutex_lock(&r->ctr.mu);
    if (st == PDL_OK) {
        r->ctr.v.transfers++;
        r->ctr.v.bytes += bytes;
        r->ctr.v.descriptors += descs;
    } else {
        r->ctr.v.read_failures++;
    }
    pthread_mutex_unlock(&r->ctr.mu);
    uint64_t sup = 0;
    if (st != PDL_OK && pdl_ratelimit_allow(&r->ctr.fail_rl, &sup))
        pdl_warn("rank %d: pull of %.100s failed (blocks reported as load errors): %s%s", r->rank, pull->transfer_id,
                 err.msg, sup ? " (more failures suppressed)" : "");
    pull_rank_done(pull, r->rank, st, err.msg, bytes, descs);
}

/* The reader's job: a rank's share of a pull. At shutdown the share fails at once, releasing the
 * producer ranks with status "failed" so they free their blocks without waiting for defer_timeout. */
static void reader_run(pdl_xfer_side_t *side, pdl_workq_item_t *item, bool stopping)
{
    pdl_rank_t *r = side->rank;
    pull_job_t *j = (pull_job_t *)item;
    if (stopping) {
        send_releases(r, &side->dealers, j->pull, NULL, false, lane_verified(side, j->pull));
        pull_rank_done(j->pull, r->rank, PDL_ERR_BAD_STATE, "instance shutting down", 0, 0);
    } else if (j->pull->abandon) {
        run_abandon(r, side, j->pull);
    } else {
        run_job(r, side, j->pull, j->queued_ns);
    }
    pull_unref(j->pull);
    free(j);
}

void pdl__reader_start(pdl_rank_t *r) { pdl__xfer_lanes_init(&r->readers, reader_run, "reader"); }

void pdl__reader_stop(pdl_rank_t *r) { pdl__xfer_lanes_stop(r, &r->readers); }

/* ---- public API ------------------------------------------------------------------------------- */

pdl_status_t pdl_instance_pull(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               const uint32_t *local_blocks, size_t n, pdl_pull_t **pull_out, pdl_error_t *err)
{
    return pdl_instance_pull_hooked(inst, params, request_id, local_blocks, n, NULL, NULL, NULL, pull_out, err);
}

pdl_status_t pdl_instance_pull_hooked(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                      const uint32_t *local_blocks, size_t n, pdl_pull_rank_fn fn, void *arg,
                                      void (*free_fn)(void *arg), pdl_pull_t **pull_out, pdl_error_t *err)
{
    if (inst == NULL || params == NULL || pull_out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pull: missing argument");
    if (atomic_load(&inst->stopping))
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "pull: instance is shutting down");
    if (params->transfer_id[0] == '\0')
        return pdl_error_set(err, PDL_ERR_INVALID, "pull: kv_transfer_params.transfer_id is missing");
    if (!params->has_remote_block_ids || params->num_remote_blocks == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "pull %s: kv_transfer_params.remote_block_ids is missing or empty",
                             params->transfer_id);
    if (n == 0 || local_blocks == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pull %s: no local blocks", params->transfer_id);
    if (n > params->num_remote_blocks)
        return pdl_error_set(err, PDL_ERR_INVALID, "pull %s: %zu local blocks but the producer holds only %zu",
                             params->transfer_id, n, params->num_remote_blocks);
    pdl_status_t st = pdl__blocks_check(inst, local_blocks, n, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "pull %s: local blocks", params->transfer_id);

    pdl_pull_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "pull: out of memory");
    p->inst = inst;
    snprintf(p->transfer_id, sizeof(p->transfer_id), "%s", params->transfer_id);
    st = pdl__resolve_peer(inst, params, request_id, PDL_ROLE_PRODUCER, "pull", &p->producer, err);
    if (st != PDL_OK) {
        free(p);
        return st;
    }
    p->n = n;
    p->local_blocks = malloc(n * sizeof(uint32_t));
    p->remote_blocks = malloc(n * sizeof(uint32_t));
    p->release_sent_ns = calloc((size_t)inst->tp, sizeof(uint64_t));
    if (p->local_blocks == NULL || p->remote_blocks == NULL || p->release_sent_ns == NULL) {
        free(p->local_blocks);
        free(p->remote_blocks);
        free(p->release_sent_ns);
        free(p);
        return pdl_error_set(err, PDL_ERR_NOMEM, "pull: out of memory");
    }
    memcpy(p->local_blocks, local_blocks, n * sizeof(uint32_t));
    memcpy(p->remote_blocks, params->remote_block_ids + (params->num_remote_blocks - n), n * sizeof(uint32_t));
    pthread_mutex_init(&p->mu, NULL);
    pdl__clock_cond_init(&p->cv);
    p->rank_fn = fn;
    p->rank_arg = arg;
    p->rank_arg_free = free_fn; /* set last: every failure above leaves arg with the caller */
    p->status = PDL_OK;
    p->pending = inst->hi - inst->lo;
    p->refs = 1 + p->pending;
    p->start_ns = pdl__clock_now_ns();
    PDL_FOR_LOCAL(inst, i) {
        pdl_rank_t *r = &inst->ranks[i];
        pdl_error_t le;
        pdl_xfer_side_t *lane = pdl__xfer_lane(r, &r->readers, &p->producer, &le);
        pull_job_t *j = lane ? calloc(1, sizeof(*j)) : NULL;
        if (j == NULL) {
            pull_rank_done(p, i, lane ? PDL_ERR_NOMEM : le.status, lane ? "out of memory" : le.msg, 0, 0);
            pull_unref(p);
            continue;
        }
        j->pull = p;
        j->queued_ns = p->start_ns;
        pdl__workq_push(&lane->q, &j->item);
    }
    *pull_out = p;
    return PDL_OK;
}

pdl_status_t pdl_pull_wait(pdl_pull_t *pull, int timeout_ms, pdl_error_t *err)
{
    if (pull == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pull_wait: no pull");
    uint64_t deadline = pdl__clock_deadline_ms(timeout_ms);
    pthread_mutex_lock(&pull->mu);
    while (pull->pending > 0 && pdl__clock_cond_wait(&pull->cv, &pull->mu, deadline))
        ;
    pdl_status_t st;
    if (pull->pending > 0)
        st = pdl_error_set(err, PDL_INPROGRESS, "pull %s: %d ranks still reading after %d ms", pull->transfer_id,
                           pull->pending, timeout_ms);
    else if (pull->status != PDL_OK)
        st = pdl_error_set(err, pull->status, "pull %s: %s", pull->transfer_id, pull->msg);
    else
        st = PDL_OK;
    pthread_mutex_unlock(&pull->mu);
    return st;
}

uint64_t pdl_pull_bytes(const pdl_pull_t *pull)
{
    pdl_pull_t *p = (pdl_pull_t *)pull;
    pthread_mutex_lock(&p->mu);
    uint64_t v = p->bytes;
    pthread_mutex_unlock(&p->mu);
    return v;
}

uint64_t pdl_pull_descriptors(const pdl_pull_t *pull)
{
    pdl_pull_t *p = (pdl_pull_t *)pull;
    pthread_mutex_lock(&p->mu);
    uint64_t v = p->descs;
    pthread_mutex_unlock(&p->mu);
    return v;
}

uint64_t pdl_pull_release_sent_ns(const pdl_pull_t *pull, int tp_rank)
{
    pdl_pull_t *p = (pdl_pull_t *)pull;
    if (tp_rank < 0 || tp_rank >= p->inst->tp)
        return 0;
    pthread_mutex_lock(&p->mu);
    uint64_t v = p->release_sent_ns[tp_rank];
    pthread_mutex_unlock(&p->mu);
    return v;
}

void pdl_pull_free(pdl_pull_t *pull)
{
    if (pull)
        pull_unref(pull);
}

/* ---- abandon: a transfer the consumer will not pull (roles.c dispatches) --------------------------- */

pdl_status_t pdl__pull_abandon(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               pdl_error_t *err)
{
    pdl_pull_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "abandon: out of memory");
    pdl_status_t st = pdl__resolve_peer(inst, params, request_id, PDL_ROLE_PRODUCER, "abandon", &p->producer, err);
    if (st == PDL_OK && (p->release_sent_ns = calloc((size_t)inst->tp, sizeof(uint64_t))) == NULL)
        st = pdl_error_set(err, PDL_ERR_NOMEM, "abandon: out of memory");
    if (st != PDL_OK) {
        free(p);
        return st;
    }
    /* Exactly the releases a failed pull sends: every consumer rank to every producer rank of its group,
     * status failed, so each producer rank's fan-in completes and the blocks are freed now instead of
     * after defer_timeout -- once the producer answered a handshake (see the top of the file). On the
     * ranks' READ lanes for that producer: the caller (an HTTP thread) never blocks, and only the
     * transfers with that producer wait behind a handshake that hangs. */
    p->inst = inst;
    p->abandon = true;
    snprintf(p->transfer_id, sizeof(p->transfer_id), "%s", params->transfer_id);
    pthread_mutex_init(&p->mu, NULL);
    pdl__clock_cond_init(&p->cv);
    p->status = PDL_OK;
    p->pending = inst->hi - inst->lo;
    p->refs = 1 + p->pending;
    p->start_ns = pdl__clock_now_ns();
    PDL_FOR_LOCAL(inst, d) {
        pdl_rank_t *r = &inst->ranks[d];
        pdl_error_t le;
        pdl_xfer_side_t *lane = pdl__xfer_lane(r, &r->readers, &p->producer, &le);
        pull_job_t *j = lane ? calloc(1, sizeof(*j)) : NULL;
        if (j == NULL) {
            pdl_warn("rank %d: abandon of %s not sent: %s", d, p->transfer_id, lane ? "out of memory" : le.msg);
            pull_rank_done(p, d, PDL_ERR_NOMEM, "", 0, 0);
            pull_unref(p);
            continue;
        }
        j->pull = p;
        j->queued_ns = p->start_ns;
        pdl__workq_push(&lane->q, &j->item);
    }
    pull_unref(p);
    return PDL_OK;
}
