/*
 * push.c -- WRITE mode, producer (docs/protocol.md#write-flow): pdl_instance_push and the rank's writer
 * lanes. The consumer that expects the push is push_recv.c; what both use (the park, the reaper's and
 * abandon's entry points) is push_park.c and push.h.
 *
 * pdl_instance_push registers the transfer's blocks as held (freed when every rank resolved it, like a
 * READ hold) and a pdl_push_t with one state per rank: WAITING for the consumer's remote_blocks,
 * STARTED, DONE, or EXPIRED. A rank's service thread hands a remote_blocks message to the push; when the
 * push does not exist yet the message is parked under "rank|transfer id" (bounded in count, dropped
 * after defer_timeout) and picked up by pdl_instance_push. A started rank queues a job for its writer
 * thread (pdl_xfer_side_t), which hands the pieces of its pdl_topo_write_plan to the transfer executor
 * (xfer.c: handshakes with the consumer ranks -- cached peers, the consumer's engine id being "host:
 * handshake base" --, one batched WRITE per layer per target, the wait within transfer_timeout), sends
 * write_done (status, producer_tp_size/rank) to every consumer rank of its notify set -- written to or
 * not, so each consumer rank counts exactly expected_write_done(P, D) -- and resolves its rank. A rank
 * still WAITING after defer_timeout is reaped by its service thread (counted expired).
 *
 * Layer by layer: pdl_instance_push_start makes the same push with no layer final yet, and
 * pdl_instance_push_layers says how many leading layers are (pdl_instance_push is both at once, every
 * layer final from the start). A started rank then handshakes at once and passes the executor a gate
 * (wait_layers) that lets the final layers through and waits on inst->push_cv for more, until
 * transfer_timeout from the job's start -- the consumer's receive gives up at its own transfer_timeout,
 * so waiting longer could not help -- or until the consumer is found gone, abandons the push, or the
 * instance stops; the rank's write then fails like any failed write. A job that starts when every layer
 * is already final gets no gate: its write is a whole push's.
 *
 * The pushes, the tombstones and every push's layer count and flags are guarded by inst->push_mu
 * (push.h); push_layers reaches a push only through the map, so never one that left it (freed or
 * entombed).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "connector/notify.h"
#include "connector/push.h"
#include "common/clock.h"

/* One rank's share of a push, started when the consumer's block list is known. */
typedef struct push_job {
    pdl_workq_item_t item; /* first: the queue hands the item back as the job */
    struct pdl_push *push;
    uint32_t *blocks; /* the consumer's block ids (owned) */
    size_t n;
    int decode_dp;
    int consumer_tp; /* from remote_blocks' consumer_tp_size, else the push's params */
} push_job_t;

enum { RS_WAITING = 0, RS_STARTED = 1, RS_DONE = 2, RS_EXPIRED = 3 };

typedef struct pdl_push {
    char transfer_id[PDL_WIRE_ID_MAX + 1];
    char engine_id[PDL_WIRE_ID_MAX + 1]; /* the consumer's, as peers are cached */
    char host[PDL_WIRE_HOST_MAX + 1];
    char host_ip[64]; /* host when numeric: where its remote_blocks must come from ("" = not checked) */
    int hs_base, notify_base;
    int consumer_tp;
    uint32_t *ids;
    size_t n;
    uint64_t created_ns;
    uint8_t *state; /* per producer rank, RS_* */
    bool consumer_gone; /* the watch (watch.c) found the consumer gone: a share not begun fails at once */
    int layers_final;   /* layers 0..layers_final-1 hold final KV (num_layers from pdl_instance_push) */
    bool *abandoned;    /* per producer rank: a failed release came while it was STARTED (it stops waiting
                         * for layers) */
} pdl_push_t;

static void push_free(pdl_push_t *p)
{
    if (p == NULL)
        return;
    free(p->ids);
    free(p->state);
    free(p->abandoned);
    free(p);
}

static bool push_all_final(const pdl_push_t *p, int tp)
{
    for (int i = 0; i < tp; i++)
        if (p->state[i] < RS_DONE)
            return false;
    return true;
}

/*
 * Tombstones. A push a rank of which was given up without writing (reaped after defer_timeout,
 * abandoned, its consumer found gone) is kept, without its block list, in a ring of the last
 * PDL_PUSH_TOMBS such pushes once it left the map. A remote_blocks that comes later for such a rank
 * is answered at once with a failed write_done, so the decode fails now instead of waiting out
 * transfer_timeout: parked or dropped, the list would get no answer at all. Under push_mu.
 */
static void entomb(pdl_instance_t *inst, pdl_push_t *p)
{
    free(p->ids);
    p->ids = NULL;
    unsigned slot = inst->tomb_next++ % PDL_PUSH_TOMBS;
    push_free(inst->tombs[slot]);
    inst->tombs[slot] = p;
}

static pdl_push_t *tomb_find(pdl_instance_t *inst, const char *tid)
{
    for (unsigned i = 0; i < PDL_PUSH_TOMBS; i++)
        if (inst->tombs[i] != NULL && strcmp(inst->tombs[i]->transfer_id, tid) == 0)
            return inst->tombs[i];
    return NULL;
}

/* Under push_mu: mark rank final; removes and returns the push when every rank is final, unless a rank
 * of it was given up: then it becomes a tombstone (NULL is returned). */
static pdl_push_t *push_rank_final(pdl_instance_t *inst, pdl_push_t *p, int rank, int state)
{
    p->state[rank] = (uint8_t)state;
    if (!push_all_final(p, inst->tp))
        return NULL;
    pdl__strmap_remove(&inst->pushes, p->transfer_id);
    for (int i = 0; i < inst->tp; i++) {
        if (p->state[i] == RS_EXPIRED) {
            entomb(inst, p);
            return NULL;
        }
    }
    return p;
}

/* ---- producer: the writer lanes --------------------------------------------------------------- */

/* The consumer instance as this job dials it: its engine id is "host:handshake base". */
static void consumer_addr(const pdl_push_t *p, const push_job_t *j, pdl_peer_addr_t *a)
{
    memset(a, 0, sizeof(*a));
    snprintf(a->engine_id, sizeof(a->engine_id), "%s", p->engine_id);
    snprintf(a->host, sizeof(a->host), "%s", p->host);
    a->hs_base = p->hs_base;
    a->notify_base = p->notify_base;
    a->dp = j->decode_dp;
    a->tp = j->consumer_tp;
    a->role = PDL_ROLE_CONSUMER;
}

/* Queue a rank's share on its WRITE lane for the consumer instance (xfer.c: one thread per remote
 * instance, so a dead consumer delays only the pushes to it). Without a lane (shutting down, out of
 * memory) the share is dropped like one queued at shutdown: instance destroy frees its blocks. */
static void enqueue_job(pdl_rank_t *r, push_job_t *j)
{
    pdl_peer_addr_t a;
    consumer_addr(j->push, j, &a);
    pdl_error_t e;
    pdl_xfer_side_t *lane = pdl__xfer_lane(r, &r->writers, &a, &e);
    if (lane != NULL) {
        pdl__workq_push(&lane->q, &j->item);
        return;
    }
    pdl_warn("rank %d: push of %s not started: %s", r->rank, j->push->transfer_id, e.msg);
    free(j->blocks);
    free(j);
}

/*
 * One rank's WRITE, retried while a consumer rank refuses it for want of a grant. A consumer whose ranks
 * run in separate processes (vLLM: one per TP rank) grants its blocks rank by rank, while the first
 * rank of a group announces them (remote_blocks) for every rank of it: the write can reach a rank
 * that has not granted yet. The engine refuses such a write before a byte lands (PDL_ERR_DENIED), so
 * it is run again, with a backoff, until the grant is there or transfer_timeout passes; a refusal that
 * lasts (a consumer that never grants, or grants other blocks) still fails the push then.
 */
static pdl_status_t write_until_granted(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_push_t *p, const pdl_xfer_t *x,
                                        uint64_t *bytes_out, uint64_t *descs_out, bool *verified, pdl_error_t *err)
{
    uint64_t deadline = pdl__clock_now_ns() + (uint64_t)(r->inst->cfg.conn.transfer_timeout_s * 1e9);
    for (int delay_ms = 1;; delay_ms = delay_ms < 64 ? 2 * delay_ms : 64) {
        pdl_xfer_times_t xt = {0};
        pdl_status_t st = pdl__xfer_run(r, side, x, bytes_out, descs_out, &xt, verified, err);
        if (st != PDL_ERR_DENIED || pdl__clock_now_ns() + (uint64_t)delay_ms * 1000000u >= deadline)
            return st;
        pthread_mutex_lock(&r->inst->push_mu);
        bool gone = p->consumer_gone;
        pthread_mutex_unlock(&r->inst->push_mu);
        if (gone)
            return st;
        pdl_debug("rank %d: push of %s refused (%s); again in %d ms", r->rank, p->transfer_id, err->msg, delay_ms);
        struct timespec ts = {.tv_sec = delay_ms / 1000, .tv_nsec = (long)(delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* The executor's gate of a rank writing a push whose layers are not all final yet (pdl_xfer_t.gate). */
typedef struct layer_gate {
    pdl_rank_t *r;
    pdl_push_t *p; /* lives while this rank is STARTED, i.e. while its writer runs the job */
    uint64_t deadline_ns;
    bool late; /* the layers did not come in time: the consumer is not known to be gone */
} layer_gate_t;

static pdl_status_t wait_layers(void *arg, int have, int *ready_p, pdl_error_t *err)
{
    layer_gate_t *g = arg;
    pdl_instance_t *inst = g->r->inst;
    pdl_push_t *p = g->p;
    int rank = g->r->rank;
    bool waited = false, in_time = true;
    pthread_mutex_lock(&inst->push_mu);
    while (p->layers_final <= have && !p->consumer_gone && !p->abandoned[rank] && !atomic_load(&inst->stopping) &&
           in_time) {
        if (!waited) /* counted as the wait begins, so whoever sees the count finds the writer waiting */
            PDL_CTR_ADD(g->r, push_layer_waits, 1);
        waited = true;
        in_time = pdl__clock_cond_wait(&inst->push_cv, &inst->push_mu, g->deadline_ns);
    }
    int ready = p->layers_final;
    bool gone = p->consumer_gone, abandoned = p->abandoned[rank];
    pthread_mutex_unlock(&inst->push_mu);
    if (ready > have) {
        *ready_p = ready;
        return PDL_OK;
    }
    int L = inst->cfg.model.num_layers;
    if (gone)
        return pdl_error_set(err, PDL_ERR_PEER_GONE, "push %s: consumer %s is gone (%d of %d layers were final)",
                             p->transfer_id, p->engine_id, ready, L);
    if (abandoned)
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "push %s: abandoned by its consumer (%d of %d layers were final)",
                             p->transfer_id, ready, L);
    if (atomic_load(&inst->stopping))
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "push %s: instance is shutting down (%d of %d layers were final)",
                             p->transfer_id, ready, L);
    g->late = true;
    return pdl_error_set(err, PDL_ERR_TIMEOUT,
                         "push %s: %d of %d layers final within transfer_timeout %.1f s (pdl_instance_push_layers "
                         "said no more)", p->transfer_id, ready, L, inst->cfg.conn.transfer_timeout_s);
}

/* Writes of one rank through the executor: the pieces of its write plan, one per consumer rank; through
 * `gate` when the push's layers are not all final yet. */
static pdl_status_t rank_write(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_push_t *p, const push_job_t *j,
                               layer_gate_t *gate, uint64_t *bytes_out, uint64_t *descs_out, bool *verified,
                               pdl_error_t *err)
{
    pdl_instance_t *inst = r->inst;
    const pdl_model_geometry_t *g = &inst->cfg.model;
    if (j->n > p->n)
        return pdl_error_set(err, PDL_ERR_INVALID, "consumer sent %zu block ids but the push holds %zu", j->n, p->n);
    pdl_write_plan_t *plan = malloc(sizeof(*plan));
    pdl_xfer_piece_t *pieces = malloc(sizeof(pdl_xfer_piece_t) * PDL_TOPO_MAX_TP);
    pdl_status_t st = plan == NULL || pieces == NULL
                          ? pdl_error_set(err, PDL_ERR_NOMEM, "write plan: out of memory")
                          : pdl_topo_write_plan(inst->tp, j->consumer_tp, g->total_kv_heads, g->is_mla, r->rank, plan,
                                                err);
    if (st == PDL_OK) {
        for (int t = 0; t < plan->num_targets; t++)
            pieces[t] = (pdl_xfer_piece_t){.remote_rank = plan->targets[t].consumer_rank,
                                           .piece = plan->targets[t].piece};
        pdl_peer_addr_t addr;
        consumer_addr(p, j, &addr);
        /* Prefix caching: the consumer may need fewer blocks; the last ones hold the new tokens. */
        pdl_xfer_t x = {.dir = PDL_DIR_WRITE,
                        .peer = &addr,
                        .pieces = pieces,
                        .npieces = plan->num_targets,
                        .local_blocks = p->ids + (p->n - j->n),
                        .remote_blocks = j->blocks,
                        .n = j->n,
                        .grant = p->transfer_id};
        pthread_mutex_lock(&inst->push_mu);
        bool all_final = p->layers_final >= g->num_layers;
        pthread_mutex_unlock(&inst->push_mu);
        if (!all_final) {
            x.gate = wait_layers;
            x.gate_arg = gate;
        }
        st = write_until_granted(r, side, p, &x, bytes_out, descs_out, verified, err);
    }
    free(pieces);
    free(plan);
    return st;
}

/* To every consumer rank of the rank's notify set; `verified`: the consumer answered our handshakes
 * (its DEALERs are in the verified share of the socket budget, sender.c). */
static void send_write_done(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_push_t *p, const push_job_t *j, bool ok,
                            bool verified)
{
    pdl_peer_addr_t a;
    consumer_addr(p, j, &a);
    pdl_notify_t n = {.note = PDL_NOTE_WRITE_DONE,
                      .transfer_id = p->transfer_id,
                      .ok = ok,
                      .to = &a,
                      .set = PDL_NOTIFY_CONSUMERS,
                      .dealers = &side->dealers,
                      .verified = verified};
    pdl_error_t e;
    if (pdl__notify(r, &n, NULL, &e) != PDL_OK)
        pdl_warn("rank %d: no write_done sent: %s", r->rank, e.msg);
}

static void run_push_job(pdl_rank_t *r, pdl_xfer_side_t *side, push_job_t *j)
{
    pdl_instance_t *inst = r->inst;
    pdl_push_t *p = j->push;
    pdl_error_t err;
    pdl_error_clear(&err);
    uint64_t bytes = 0, descs = 0;
    bool verified = false;
    layer_gate_t gate = {.r = r, .p = p,
                         .deadline_ns = pdl__clock_now_ns() + (uint64_t)(inst->cfg.conn.transfer_timeout_s * 1e9)};
    /* A share queued behind others on the lane of a consumer found gone: no handshake, no write. Read
     * under push_mu: the watch sets it from the service thread (p lives while this rank is STARTED). */
    pthread_mutex_lock(&inst->push_mu);
    bool gone_before = p->consumer_gone;
    pthread_mutex_unlock(&inst->push_mu);
    pdl_status_t st = gone_before ? pdl_error_set(&err, PDL_ERR_PEER_GONE, "consumer %s is gone (its handshake "
                                                  "port is watched); nothing written", p->engine_id)
                                  : rank_write(r, side, p, j, &gate, &bytes, &descs, &verified, &err);
    uint64_t sup = 0;
    if (st != PDL_OK && pdl_ratelimit_allow(&r->ctr.fail_rl, &sup))
        pdl_warn("rank %d: push of %.100s failed (write_done says failed): %s%s", r->rank, p->transfer_id, err.msg,
                 sup ? " (more failures suppressed)" : "");
    send_write_done(r, side, p, j, st == PDL_OK, verified);
    /* The consumer looks gone: stop reconnecting to it once write_done left (sender.c). Layers that never
     * came say nothing of the consumer. */
    if ((st == PDL_ERR_PEER_GONE || st == PDL_ERR_TIMEOUT || st == PDL_ERR_TRANSPORT) && !gate.late)
        pdl__dealers_sweep(&side->dealers, 0, 0);
    pthread_mutex_lock(&r->ctr.mu);
    if (st == PDL_OK) {
        r->ctr.v.transfers++;
        r->ctr.v.bytes += bytes;
        r->ctr.v.descriptors += descs;
    } else {
        r->ctr.v.write_failures++;
    }
    pthread_mutex_unlock(&r->ctr.mu);
    char tid[PDL_WIRE_ID_MAX + 1];
    snprintf(tid, sizeof(tid), "%s", p->transfer_id);
    pthread_mutex_lock(&inst->push_mu);
    pdl_push_t *gone = push_rank_final(inst, p, r->rank, RS_DONE);
    pthread_mutex_unlock(&inst->push_mu);
    push_free(gone); /* p is not touched after this */
    pdl__held_rank_resolved(inst, tid, r->rank, false);
}

/* The writer's job. At shutdown a queued share is dropped unrun: its push and held blocks are freed
 * by instance destroy (pdl__push_free_all, pdl__held_free_all). */
static void writer_run(pdl_xfer_side_t *side, pdl_workq_item_t *item, bool stopping)
{
    push_job_t *j = (push_job_t *)item;
    if (!stopping)
        run_push_job(side->rank, side, j);
    free(j->blocks);
    free(j);
}

void pdl__writer_start(pdl_rank_t *r) { pdl__xfer_lanes_init(&r->writers, writer_run, "writer"); }

void pdl__writer_stop(pdl_rank_t *r) { pdl__xfer_lanes_stop(r, &r->writers); }

/* ---- producer: messages and API --------------------------------------------------------------- */

/* The consumer's TP as the job uses it: what the consumer said in remote_blocks (a pdlink consumer
 * knows its own TP; a router before vllm-router PR #192 sent remote_tp_size 1), else the params'. */
static push_job_t *job_new(pdl_push_t *p, uint32_t *blocks, size_t n, int decode_dp, int said_tp)
{
    push_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return NULL;
    j->consumer_tp = said_tp > 0 ? said_tp : p->consumer_tp;
    j->push = p;
    j->blocks = blocks;
    j->n = n;
    j->decode_dp = decode_dp;
    return j;
}

/* Queue on rank r's service thread a failed write_done of `tid` to every consumer rank of r's notify set
 * (consumer TP consumer_tp, DP rank dp, the notify ports of `host` from notify_base), each counted in
 * write_done_sent: what a rank that will not write sends, so the decode's receive fails now. Stops at the
 * first failure (PDL_ERR_INVALID for the TPs or the port, PDL_ERR_NOMEM), naming the consumer rank. */
static pdl_status_t queue_failed_write_done(pdl_rank_t *r, const char *tid, const char *host, int notify_base,
                                            int consumer_tp, int dp, pdl_error_t *err)
{
    pdl_peer_addr_t a = {.notify_base = notify_base, .dp = dp, .tp = consumer_tp, .role = PDL_ROLE_CONSUMER};
    snprintf(a.host, sizeof(a.host), "%s", host);
    pdl_notify_t n = {.note = PDL_NOTE_WRITE_DONE,
                      .transfer_id = tid,
                      .to = &a,
                      .set = PDL_NOTIFY_CONSUMERS,
                      .stop_at_error = true};
    return pdl__notify(r, &n, NULL, err);
}

/* Where the failed write_done for a given-up rank goes: the push's consumer (never the sender's word). */
typedef struct given_up {
    char host[PDL_WIRE_HOST_MAX + 1];
    int notify_base, consumer_tp;
} given_up_t;

/* Service thread: a remote_blocks for a rank of a push that was given up. Each consumer rank of this
 * rank's notify set gets a failed write_done, as if the share had failed, so the receive fails now. */
static void answer_given_up(pdl_rank_t *r, const pdl_msg_t *msg, const given_up_t *gu)
{
    pdl_error_t e;
    if (queue_failed_write_done(r, msg->transfer_id, gu->host, gu->notify_base, gu->consumer_tp,
                                (int)msg->decode_rank, &e) != PDL_OK)
        pdl_debug("rank %d: failed write_done of given-up push %.100s: %s", r->rank, msg->transfer_id, e.msg);
    PDL_CTR_ADD(r, remote_blocks_given_up, 1);
    uint64_t sup = 0;
    if (pdl_ratelimit_allow(&r->ctr.expired_rl, &sup))
        pdl_warn("rank %d: remote_blocks for push %.100s came after this rank gave it up (reaped after "
                 "defer_timeout, abandoned, or its consumer looked gone); answered with a failed write_done so "
                 "the decode fails now%s",
                 r->rank, msg->transfer_id, sup ? " (more suppressed)" : "");
}

/*
 * Room in the park table, under push_mu. Parked lists are from senders nobody verified yet (the push
 * that names the consumer does not exist), so a full table does not simply refuse the newcomer -- a
 * flood from one host would then keep every real decode's remote_blocks out -- nor evict the oldest --
 * the flood would evict them one by one: it evicts the oldest entries of the host that holds most of the
 * table (bytes, then entries), unless that is the sender itself, whose list is then refused. So a real
 * decode's parked remote_blocks are lost only while its own host holds more of the table than any other.
 * Returns the number of entries evicted (>= 0), or -1 when there is no room for `bytes` from `sender`.
 */
typedef struct park_tally {
    char host[64];
    size_t bytes, n;
    uint64_t oldest_ns;
    char oldest_key[PDL_WIRE_ID_MAX + 16];
} park_tally_t;

typedef struct park_scan {
    park_tally_t *t;
    size_t nt, count, bytes;
    pdl_strmap_t index; /* host -> 1 + its index in t */
} park_scan_t;

static void park_tally_one(void *arg, const char *key, void *value)
{
    park_scan_t *c = arg;
    const pdl_parked_t *k = value;
    size_t b = k->n * sizeof(uint32_t);
    c->count++;
    c->bytes += b;
    uintptr_t at = (uintptr_t)pdl__strmap_get(&c->index, k->sender);
    if (at == 0) {
        if (c->t == NULL || pdl__strmap_put(&c->index, k->sender, (void *)(uintptr_t)(c->nt + 1)) != 0)
            return;
        at = ++c->nt;
        snprintf(c->t[at - 1].host, sizeof(c->t[at - 1].host), "%s", k->sender);
    }
    park_tally_t *t = &c->t[at - 1];
    t->bytes += b;
    if (t->n++ == 0 || k->at_ns < t->oldest_ns) {
        t->oldest_ns = k->at_ns;
        snprintf(t->oldest_key, sizeof(t->oldest_key), "%s", key);
    }
}

static int park_make_room(pdl_instance_t *inst, const char *sender, size_t bytes)
{
    int evicted = 0;
    for (int round = 0; round < 64; round++) {
        park_scan_t c = {.t = calloc(inst->parked.count + 1, sizeof(park_tally_t))};
        pdl__strmap_foreach(&inst->parked, park_tally_one, &c);
        pdl__strmap_free(&c.index);
        if (c.count < PDL_PARK_MAX && c.bytes + bytes <= PDL_PARK_MAX_BYTES) {
            free(c.t);
            return evicted;
        }
        park_tally_t *top = NULL;
        for (size_t i = 0; i < c.nt; i++)
            if (top == NULL || c.t[i].bytes > top->bytes || (c.t[i].bytes == top->bytes && c.t[i].n > top->n))
                top = &c.t[i];
        if (top == NULL || strcmp(top->host, sender) == 0) {
            free(c.t);
            return -1;
        }
        pdl__parked_free(pdl__strmap_remove(&inst->parked, top->oldest_key));
        free(c.t);
        evicted++;
    }
    return -1;
}

/* A remote_blocks fit to act on: for a producer, a transfer id, a decode DP rank, no more ids than
 * num_blocks, a consumer TP that fits ours (*said_tp, 0 when absent). Else counted and false. */
static bool remote_blocks_vet(pdl_rank_t *r, const pdl_msg_t *msg, const char *sender, int *said_tp)
{
    pdl_instance_t *inst = r->inst;
    if (inst->cfg.conn.role != PDL_ROLE_PRODUCER || msg->transfer_id[0] == '\0' || msg->decode_rank < 0 ||
        msg->decode_rank > 65535) {
        pdl__ctr_drop(r, PDL_DROP_NOTIFY_UNSUPPORTED, "remote_blocks for transfer '%s' (req %s): %s",
                      msg->transfer_id, msg->req_id,
                      inst->cfg.conn.role != PDL_ROLE_PRODUCER ? "this instance is a consumer"
                      : msg->transfer_id[0] == '\0'            ? "no transfer_id"
                                                               : "decode_rank out of range");
        return false;
    }
    if (msg->num_blocks > inst->cfg.num_blocks) {
        /* No push holds more blocks than the instance has; the ids themselves are the consumer's, checked
         * against its num_blocks (from its handshake) before anything is written (layout.c). */
        PDL_CTR_REFUSED(r, remote_blocks_refused,
                        "refused remote_blocks for transfer %.100s from %s: %zu block ids, more than num_blocks %u",
                        msg->transfer_id, sender ? sender : "an unknown address", msg->num_blocks,
                        inst->cfg.num_blocks);
        return false;
    }
    PDL_CTR_ADD(r, remote_blocks_received, 1);
    *said_tp = 0;
    if (msg->consumer_tp_rank >= 0) {
        int dummy;
        if (msg->consumer_tp_size > PDL_TOPO_MAX_TP ||
            pdl_topo_map_rank(0, inst->tp, (int)msg->consumer_tp_size, &dummy, NULL) != PDL_OK) {
            pdl__ctr_drop(r, PDL_DROP_NOTIFY_FANIN, "remote_blocks for %s: consumer_tp_size %" PRId64
                          " does not fit producer TP %d", msg->transfer_id, msg->consumer_tp_size, inst->tp);
            return false;
        }
        *said_tp = (int)msg->consumer_tp_size;
    }
    return true;
}

/* What a remote_blocks comes to, decided under push_mu and acted on after it. */
typedef enum { RB_DROPPED, RB_REFUSED, RB_WRITE, RB_GIVEN_UP, RB_PARKED } rb_kind_t;

typedef struct rb_verdict {
    rb_kind_t kind;
    push_job_t *job;     /* RB_WRITE: the share to queue (owns the blocks) */
    given_up_t gu;       /* RB_GIVEN_UP: where the failed write_done goes */
    char expected[64];   /* RB_REFUSED: the push's consumer host */
    int evicted;         /* parked entries evicted to make room */
} rb_verdict_t;

/* Park blocks[n] under key until the push comes; false when the park has no room for it. */
static bool park_remote_blocks(pdl_instance_t *inst, pdl_rank_t *r, const pdl_msg_t *msg, const char *sender,
                               const char *key, uint32_t *blocks, int said_tp, rb_verdict_t *v)
{
    if (pdl__strmap_get(&inst->parked, key) != NULL ||
        (v->evicted = park_make_room(inst, sender ? sender : "", msg->num_blocks * sizeof(uint32_t))) < 0)
        return false;
    pdl_parked_t *k = calloc(1, sizeof(*k));
    if (k == NULL)
        return false;
    *k = (pdl_parked_t){.blocks = blocks, .n = msg->num_blocks, .decode_dp = (int)msg->decode_rank,
                        .said_tp = said_tp, .rank = r->rank, .at_ns = pdl__clock_now_ns()};
    snprintf(k->sender, sizeof(k->sender), "%s", sender ? sender : "");
    if (pdl__strmap_put(&inst->parked, key, k) == 0)
        return true;
    free(k);
    return false;
}

/* Under push_mu: the verdict on rank r's remote_blocks (blocks: a copy of its ids, taken by a job or
 * the park). */
static void remote_blocks_decide(pdl_rank_t *r, const pdl_msg_t *msg, const char *sender, uint32_t *blocks,
                                 int said_tp, rb_verdict_t *v)
{
    pdl_instance_t *inst = r->inst;
    char key[PDL_PARK_KEY_MAX];
    pdl__park_key(key, r->rank, msg->transfer_id);
    pdl_push_t *p = pdl__strmap_get(&inst->pushes, msg->transfer_id);
    pdl_push_t *given = p != NULL ? p : tomb_find(inst, msg->transfer_id);
    v->kind = RB_DROPPED;
    if (given != NULL && !pdl__sent_by(sender, given->host_ip)) {
        /* The push names its consumer: a list from another host would make us write the KV into blocks
         * the consumer never offered, and send it write_done for them. */
        v->kind = RB_REFUSED;
        snprintf(v->expected, sizeof(v->expected), "%s", given->host_ip);
    } else if (given != NULL && given->state[r->rank] == RS_EXPIRED) {
        v->kind = RB_GIVEN_UP;
        snprintf(v->gu.host, sizeof(v->gu.host), "%s", given->host);
        v->gu.notify_base = given->notify_base;
        v->gu.consumer_tp = said_tp > 0 ? said_tp : given->consumer_tp;
    } else if (p != NULL && p->state[r->rank] == RS_WAITING) {
        v->job = job_new(p, blocks, msg->num_blocks, (int)msg->decode_rank, said_tp);
        if (v->job != NULL) {
            p->state[r->rank] = RS_STARTED;
            v->kind = RB_WRITE;
        }
    } else if (given == NULL && park_remote_blocks(inst, r, msg, sender, key, blocks, said_tp, v)) {
        v->kind = RB_PARKED; /* else: a duplicate for a rank that wrote, or the park is full */
    }
}

void pdl__push_on_remote_blocks(pdl_rank_t *r, const pdl_msg_t *msg, const char *sender)
{
    pdl_instance_t *inst = r->inst;
    int said_tp = 0;
    if (!remote_blocks_vet(r, msg, sender, &said_tp))
        return;
    uint32_t *blocks = malloc(msg->num_blocks * sizeof(uint32_t));
    if (blocks == NULL)
        return;
    memcpy(blocks, msg->block_ids, msg->num_blocks * sizeof(uint32_t));
    rb_verdict_t v = {.kind = RB_DROPPED};
    pthread_mutex_lock(&inst->push_mu);
    remote_blocks_decide(r, msg, sender, blocks, said_tp, &v);
    pthread_mutex_unlock(&inst->push_mu);
    if (v.evicted > 0) {
        PDL_CTR_ADD(r, remote_blocks_evicted, (uint64_t)v.evicted);
        pdl_debug("rank %d: park table full: %d parked entries of the host holding most of it evicted", r->rank,
                  v.evicted);
    }
    if (v.kind != RB_WRITE && v.kind != RB_PARKED)
        free(blocks);
    switch (v.kind) {
    case RB_REFUSED:
        PDL_CTR_REFUSED(r, remote_blocks_refused, "refused remote_blocks for push %.100s from %s: its consumer is %s",
                        msg->transfer_id, sender, v.expected);
        break;
    case RB_WRITE: enqueue_job(r, v.job); break;
    case RB_GIVEN_UP: answer_given_up(r, msg, &v.gu); break;
    case RB_PARKED:
        PDL_CTR_ADD(r, remote_blocks_parked, 1);
        pdl_debug("rank %d: remote_blocks for %s parked until its push", r->rank, msg->transfer_id);
        break;
    case RB_DROPPED:
        PDL_CTR_ADD(r, remote_blocks_dropped, 1);
        pdl_debug("rank %d: remote_blocks for %s dropped (duplicate or park full)", r->rank, msg->transfer_id);
        break;
    }
}

/*
 * A failed release on a WRITE producer: the consumer will not take this push (its request was rejected
 * or failed; pdl_instance_abandon on the decode, or the router when the decode leg failed). A rank
 * still WAITING for remote_blocks is done at once and its blocks are freed with the push's last rank;
 * a rank already writing finishes (its write_done follows). Before the push exists the abandon is
 * parked like an early remote_blocks (and replaces one parked for the same rank), so a decode that
 * gives up before the prefill finished frees the push as soon as it is made.
 */
void pdl__push_on_abandon(pdl_rank_t *r, const pdl_msg_t *msg, const char *sender)
{
    pdl_instance_t *inst = r->inst;
    if (inst->cfg.conn.role != PDL_ROLE_PRODUCER || msg->transfer_id[0] == '\0') {
        pdl__ctr_drop(r, PDL_DROP_NOTIFY_UNSUPPORTED, "failed release for transfer '%s' in WRITE mode: %s",
                      msg->transfer_id,
                      inst->cfg.conn.role != PDL_ROLE_PRODUCER ? "this instance is a consumer" : "no transfer_id");
        return;
    }
    char key[PDL_PARK_KEY_MAX];
    pdl__park_key(key, r->rank, msg->transfer_id);
    bool resolved = false, parked = false, refused = false, stopped = false;
    char expected[64] = "";
    pdl_push_t *gone = NULL;
    pthread_mutex_lock(&inst->push_mu);
    pdl_push_t *p = pdl__strmap_get(&inst->pushes, msg->transfer_id);
    pdl_parked_t *rb = p == NULL ? pdl__strmap_get(&inst->parked, key) : NULL;
    if (rb != NULL && !rb->abandoned && !pdl__held_sender_is_consumer(inst, sender, rb->sender)) {
        /* The consumer's block list is parked: an abandon from another host must not discard it. */
        refused = true;
        snprintf(expected, sizeof(expected), "%s", rb->sender);
    } else if (p != NULL) {
        if (p->state[r->rank] == RS_WAITING) {
            gone = push_rank_final(inst, p, r->rank, RS_EXPIRED);
            resolved = true;
        } else if (p->state[r->rank] == RS_STARTED && p->layers_final < inst->cfg.model.num_layers &&
                   !p->abandoned[r->rank]) {
            /* A rank writing layer by layer would wait for layers nobody will take (wait_layers). Counted
             * before the writer wakes, so whoever sees the push fail sees the count. */
            p->abandoned[r->rank] = true;
            stopped = true;
            PDL_CTR_ADD(r, pushes_abandoned, 1);
            pthread_cond_broadcast(&inst->push_cv);
        }
    } else {
        pdl_parked_t *k = rb;
        /* Abandons may name pushes that already finished (the router's and the decode's both come after a
         * failed decode leg): they take at most half the park, so early remote_blocks keep room. */
        if (k == NULL && inst->parked.count < PDL_PARK_MAX / 2 && (k = calloc(1, sizeof(*k))) != NULL) {
            k->rank = r->rank;
            if (pdl__strmap_put(&inst->parked, key, k) != 0) {
                free(k);
                k = NULL;
            }
        }
        if (k != NULL) {
            free(k->blocks);
            k->blocks = NULL;
            k->n = 0;
            k->abandoned = true;
            snprintf(k->sender, sizeof(k->sender), "%s", sender ? sender : "");
            k->at_ns = pdl__clock_now_ns();
            parked = true;
        }
    }
    pthread_mutex_unlock(&inst->push_mu);
    push_free(gone);
    if (refused)
        PDL_CTR_REFUSED(r, releases_refused,
                        "refused an abandon of push %.100s from %s: its remote_blocks came from %s",
                        msg->transfer_id, sender, expected);
    if (resolved || parked)
        PDL_CTR_ADD(r, pushes_abandoned, 1);
    if (resolved) {
        pdl_debug("rank %d: push %s abandoned by its consumer; blocks freed with the last rank", r->rank,
                  msg->transfer_id);
        pdl__held_rank_resolved(inst, msg->transfer_id, r->rank, true);
    } else if (parked) {
        pdl_debug("rank %d: abandon of %s parked until its push", r->rank, msg->transfer_id);
    } else if (stopped) {
        pdl_debug("rank %d: push %s abandoned by its consumer while its layers were not all final; a writer "
                  "waiting for them fails its write", r->rank, msg->transfer_id);
    }
}

bool pdl__push_consumer_gone(pdl_rank_t *r0, const char *transfer_id)
{
    pdl_instance_t *inst = r0->inst;
    bool *waiting = calloc((size_t)inst->tp, sizeof(*waiting));
    if (waiting == NULL)
        return false; /* left to defer_timeout */
    pdl_push_t *gone = NULL;
    pthread_mutex_lock(&inst->push_mu);
    pdl_push_t *p = pdl__strmap_get(&inst->pushes, transfer_id);
    bool first = p != NULL && !p->consumer_gone;
    if (first) {
        p->consumer_gone = true;
        pthread_cond_broadcast(&inst->push_cv); /* a rank waiting for layers stops (wait_layers) */
        for (int i = 0; i < inst->tp; i++) {
            if (p->state[i] != RS_WAITING)
                continue;
            waiting[i] = true;
            pdl_push_t *last = push_rank_final(inst, p, i, RS_EXPIRED);
            if (last != NULL)
                gone = last;
        }
    }
    pthread_mutex_unlock(&inst->push_mu);
    push_free(gone); /* every rank was waiting: the push left the map; p is not used after this */
    if (first)
        PDL_CTR_ADD(r0, consumer_gone_freed, 1); /* before its events: whoever sees FREED sees the count */
    for (int i = 0; i < inst->tp; i++)
        if (waiting[i])
            pdl__held_rank_resolved(inst, transfer_id, i, true);
    free(waiting);
    return first;
}

/*
 * Abandons parked before their push came were accepted from any host (nothing named the consumer yet):
 * now that the held transfer does, each is put to the check a later one meets (pdl__held_release_allowed,
 * the READ releases' too), outside push_mu as that check takes held_mu. Returns per rank the refused
 * sender ("" = none refused; counted in releases_refused); NULL when out of memory. The caller drops a
 * parked abandon only if it still names that sender (another may have replaced it meanwhile).
 */
typedef char sender_t[64];
static sender_t *parked_abandons_forged(pdl_instance_t *inst, const char *tid)
{
    sender_t *from = calloc((size_t)inst->tp, sizeof(*from));
    if (from == NULL)
        return NULL;
    pthread_mutex_lock(&inst->push_mu);
    for (int i = 0; i < inst->tp; i++) {
        char key[PDL_PARK_KEY_MAX];
        pdl__park_key(key, i, tid);
        const pdl_parked_t *k = pdl__strmap_get(&inst->parked, key);
        if (k != NULL && k->abandoned)
            memcpy(from[i], k->sender, sizeof(from[i]));
    }
    pthread_mutex_unlock(&inst->push_mu);
    for (int i = 0; i < inst->tp; i++) {
        char expected[64];
        if (from[i][0] == '\0' ||
            pdl__held_release_allowed(&inst->ranks[i], tid, from[i], expected, sizeof(expected))) {
            from[i][0] = '\0';
            continue;
        }
        PDL_CTR_REFUSED(&inst->ranks[i], releases_refused,
                        "refused an abandon of push %.100s from %s (parked before the push): its consumer is %s", tid,
                        from[i], expected);
    }
    return from;
}

/* Make the push of ids[n] with `layers_final` layers final: its consumer (params, else the request id),
 * trusted, with a consumer TP that fits ours. Ranks other processes run are DONE from the start. */
static pdl_status_t push_new(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                             const uint32_t *ids, size_t n, int layers_final, pdl_push_t **out, pdl_error_t *err)
{
    const char *tid = params->transfer_id;
    pdl_push_t *p = calloc(1, sizeof(*p));
    if (p == NULL || (p->ids = malloc(n * sizeof(uint32_t))) == NULL ||
        (p->state = calloc((size_t)inst->tp, 1)) == NULL ||
        (p->abandoned = calloc((size_t)inst->tp, sizeof(bool))) == NULL) {
        push_free(p);
        return pdl_error_set(err, PDL_ERR_NOMEM, "push %s: out of memory", tid);
    }
    snprintf(p->transfer_id, sizeof(p->transfer_id), "%s", tid);
    for (int i = 0; i < inst->tp; i++) /* other processes push the ranks this one does not run */
        if (!pdl__is_local(inst, i))
            p->state[i] = RS_DONE;
    pdl_peer_addr_t ca;
    pdl_status_t st = pdl__resolve_peer(inst, params, request_id, PDL_ROLE_CONSUMER, "push", &ca, err);
    if (st != PDL_OK)
        goto fail;
    snprintf(p->engine_id, sizeof(p->engine_id), "%s", ca.engine_id);
    snprintf(p->host, sizeof(p->host), "%s", ca.host);
    memcpy(p->host_ip, ca.ip, sizeof(p->host_ip));
    p->hs_base = ca.hs_base;
    p->notify_base = ca.notify_base;
    p->consumer_tp = ca.tp;
    memcpy(p->ids, ids, n * sizeof(uint32_t));
    p->n = n;
    p->layers_final = layers_final;
    p->created_ns = pdl__clock_now_ns();
    *out = p;
    return PDL_OK;
fail:
    push_free(p);
    return st;
}

/* What a new push found parked for it, per rank (each array inst->tp long). */
typedef struct push_claim {
    push_job_t **jobs; /* shares whose remote_blocks came first: queued once push_mu is released */
    bool *abandoned;   /* ranks whose consumer gave up before the push: resolved at once */
    bool *foreign;     /* ranks whose parked list came from another host than the consumer: refused */
    sender_t *forged;  /* per rank, the sender of a parked abandon refused (parked_abandons_forged) */
    pdl_push_t *all_abandoned; /* every rank abandoned: the push left the map and is freed by the caller */
} push_claim_t;

static void push_claim_free(push_claim_t *c)
{
    free(c->jobs);
    free(c->abandoned);
    free(c->foreign);
    free(c->forged);
}

/* Under push_mu, p just put in the map: each rank of p takes what was parked for it. */
static void push_claim_parked(pdl_instance_t *inst, pdl_push_t *p, push_claim_t *c)
{
    for (int i = 0; i < inst->tp; i++) {
        char key[PDL_PARK_KEY_MAX];
        pdl__park_key(key, i, p->transfer_id);
        pdl_parked_t *k = pdl__strmap_get(&inst->parked, key);
        if (k == NULL)
            continue;
        if (k->abandoned && c->forged[i][0] != '\0' && strcmp(k->sender, c->forged[i]) == 0) {
            pdl__parked_free(pdl__strmap_remove(&inst->parked, key)); /* refused and counted: the rank waits */
            continue;
        }
        if (k->abandoned) {
            /* The consumer gave up before the prefill finished: this rank is done at once. */
            pdl__parked_free(pdl__strmap_remove(&inst->parked, key));
            c->abandoned[i] = true;
            pdl_push_t *gone = push_rank_final(inst, p, i, RS_EXPIRED);
            if (gone != NULL)
                c->all_abandoned = gone;
            continue;
        }
        if (!pdl__sent_by(k->sender, p->host_ip)) {
            /* Parked before anything named the consumer: now that the push does, a list from
             * another host is refused (counted by the caller) and the rank waits for the consumer's own. */
            pdl__parked_free(pdl__strmap_remove(&inst->parked, key));
            c->foreign[i] = true;
            continue;
        }
        c->jobs[i] = job_new(p, k->blocks, k->n, k->decode_dp, k->said_tp);
        if (c->jobs[i] == NULL)
            continue; /* stays parked; the rank is reaped after defer_timeout */
        pdl__strmap_remove(&inst->parked, key);
        k->blocks = NULL;
        pdl__parked_free(k);
        p->state[i] = RS_STARTED;
    }
}

/* pdl_instance_push_start with `layers_final` layers final from the start: pdl_instance_push is this with
 * every layer, so no writer can start between the push and its layers and take a gate it does not need. */
static pdl_status_t push_begin(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               const uint32_t *ids, size_t n, int layers_final, pdl_error_t *err)
{
    if (inst == NULL || params == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "push: missing argument");
    if (inst->cfg.conn.read_mode || inst->cfg.conn.role != PDL_ROLE_PRODUCER)
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "push: needs a producer instance in WRITE mode (read_mode false)");
    if (atomic_load(&inst->stopping))
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "push: instance is shutting down");
    const char *tid = params->transfer_id;
    if (tid[0] == '\0')
        return pdl_error_set(err, PDL_ERR_INVALID, "push: kv_transfer_params.transfer_id is missing");
    if (n == 0 || ids == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "push %s: no blocks", tid);
    pdl_status_t st = pdl__blocks_check(inst, ids, n, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "push %s", tid);
    pdl_push_t *p = NULL;
    st = push_new(inst, params, request_id, ids, n, layers_final, &p, err);
    if (st != PDL_OK)
        return st;

    /* The consumer reads nothing; our own writer threads read the blocks after a queue hand-off, and
     * the tcp backend's threads through the engine: publish to both. */
    PDL_FOR_LOCAL(inst, i)
        pdl_engine_publish(inst->ranks[i].mem.engine);

    /* Named for the consumer-gone watch (watch.c) and the host check of failed releases (held.c). */
    char consumer[PDL_WIRE_HOST_MAX + 16];
    pdl__peer_name(consumer, sizeof(consumer), p->host, p->hs_base);
    st = pdl__held_add(inst, tid, ids, n, consumer, err);
    if (st != PDL_OK) {
        push_free(p);
        return pdl_error_prefix(err, st, "push");
    }
    push_claim_t c = {.jobs = calloc((size_t)inst->tp, sizeof(*c.jobs)),
                      .abandoned = calloc((size_t)inst->tp, sizeof(*c.abandoned)),
                      .foreign = calloc((size_t)inst->tp, sizeof(*c.foreign)),
                      .forged = parked_abandons_forged(inst, tid)};
    char consumer_ip[64]; /* p may be freed by another thread once push_mu is released */
    memcpy(consumer_ip, p->host_ip, sizeof(consumer_ip));
    pthread_mutex_lock(&inst->push_mu);
    int rc = c.jobs == NULL || c.abandoned == NULL || c.forged == NULL || c.foreign == NULL
                 ? -1
                 : pdl__strmap_put(&inst->pushes, tid, p);
    if (rc == 0)
        push_claim_parked(inst, p, &c);
    pthread_mutex_unlock(&inst->push_mu);
    for (int i = 0; c.foreign != NULL && i < inst->tp; i++)
        if (c.foreign[i])
            PDL_CTR_REFUSED(&inst->ranks[i], remote_blocks_refused,
                            "refused remote_blocks for push %.100s parked before it: not sent by its consumer %s", tid,
                            consumer_ip);
    if (rc != 0) {
        push_claim_free(&c);
        pdl__held_cancel(inst, tid);
        push_free(p);
        return rc > 0 ? pdl_error_set(err, PDL_ERR_BAD_STATE, "push: transfer %s is already being pushed", tid)
                      : pdl_error_set(err, PDL_ERR_NOMEM, "push %s: out of memory", tid);
    }
    for (int i = 0; i < inst->tp; i++)
        if (c.jobs[i] != NULL)
            enqueue_job(&inst->ranks[i], c.jobs[i]);
    for (int i = 0; i < inst->tp; i++)
        if (c.abandoned[i])
            pdl__held_rank_resolved(inst, tid, i, true);
    push_free(c.all_abandoned); /* every rank abandoned: the push left the map; p is not used after this */
    push_claim_free(&c);
    return PDL_OK;
}

pdl_status_t pdl_instance_push(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               const uint32_t *ids, size_t n, pdl_error_t *err)
{
    return push_begin(inst, params, request_id, ids, n, inst != NULL ? inst->cfg.model.num_layers : 0, err);
}

pdl_status_t pdl_instance_push_start(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                     const uint32_t *ids, size_t n, pdl_error_t *err)
{
    return push_begin(inst, params, request_id, ids, n, 0, err);
}

pdl_status_t pdl_instance_push_layers(pdl_instance_t *inst, const char *transfer_id, int layers, pdl_error_t *err)
{
    if (inst == NULL || transfer_id == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "push_layers: missing argument");
    if (inst->cfg.conn.read_mode || inst->cfg.conn.role != PDL_ROLE_PRODUCER)
        return pdl_error_set(err, PDL_ERR_BAD_STATE,
                             "push_layers %.100s: needs a producer instance in WRITE mode (read_mode false)",
                             transfer_id);
    int L = inst->cfg.model.num_layers;
    if (layers < 0 || layers > L)
        return pdl_error_set(err, PDL_ERR_INVALID, "push_layers %.100s: %d layers final, outside [0, %d] (num_layers)",
                             transfer_id, layers, L);
    /* The writers read the new layers through the engines (tcp's threads among them), as for a push. */
    PDL_FOR_LOCAL(inst, i)
        pdl_engine_publish(inst->ranks[i].mem.engine);
    pthread_mutex_lock(&inst->push_mu);
    pdl_push_t *p = pdl__strmap_get(&inst->pushes, transfer_id);
    bool given_up = p == NULL && tomb_find(inst, transfer_id) != NULL;
    if (p != NULL && layers > p->layers_final) {
        p->layers_final = layers;
        pthread_cond_broadcast(&inst->push_cv);
    }
    pthread_mutex_unlock(&inst->push_mu);
    if (p == NULL)
        return pdl_error_set(err, PDL_ERR_NOT_FOUND, "push_layers: no push of transfer %.100s on this instance (%s)",
                             transfer_id, given_up ? "it was given up: reaped, abandoned or its consumer gone"
                                                   : "never started, or every rank of it already finished");
    return PDL_OK;
}

void pdl__push_stop_waits(pdl_instance_t *inst)
{
    pthread_mutex_lock(&inst->push_mu);
    pthread_cond_broadcast(&inst->push_cv);
    pthread_mutex_unlock(&inst->push_mu);
}

/* ---- abandon and reaping ---------------------------------------------------------------------- */

/* Producer: the failed write_done a failed push sends, from every rank to every consumer rank of its
 * notify set, so the decode's receive fails now instead of at transfer_timeout and frees its blocks;
 * remote_blocks parked for the transfer are dropped. */
pdl_status_t pdl__push_abandon_producer(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                        pdl_error_t *err)
{
    const char *tid = params->transfer_id;
    pdl_peer_addr_t ca;
    pdl_status_t st = pdl__resolve_peer(inst, params, request_id, PDL_ROLE_CONSUMER, "abandon", &ca, err);
    if (st != PDL_OK)
        return st;
    int D = ca.tp, dp = ca.dp;
    PDL_FOR_LOCAL(inst, r) {
        char key[PDL_PARK_KEY_MAX];
        pdl__park_key(key, r, tid);
        pthread_mutex_lock(&inst->push_mu);
        pdl_parked_t *k = pdl__strmap_remove(&inst->parked, key);
        pthread_mutex_unlock(&inst->push_mu);
        if (k != NULL) {
            /* The consumer's own word on its TP and DP rank beats the params'. */
            D = k->said_tp > 0 ? k->said_tp : D;
            dp = k->decode_dp;
            pdl__parked_free(k);
        }
    }
    for (int r = inst->lo; st == PDL_OK && r < inst->hi; r++) {
        st = queue_failed_write_done(&inst->ranks[r], tid, ca.host, ca.notify_base, D, dp, err);
        if (st != PDL_OK)
            pdl_error_prefix(err, st, "abandon %s", tid);
    }
    return st;
}

/* The pushes whose share on rank `rank` waited for remote_blocks longer than defer_timeout. */
typedef struct push_reap {
    int rank;
    uint64_t now, defer_ns;
    char **ids;
    size_t n, cap;
} push_reap_t;

static void reap_push(void *arg, const char *key, void *value)
{
    push_reap_t *c = arg;
    pdl_push_t *p = value;
    if (p->state[c->rank] != RS_WAITING || pdl__clock_since(c->now, p->created_ns) < c->defer_ns)
        return;
    if (c->n == c->cap) {
        size_t nc = c->cap ? 2 * c->cap : 8;
        char **nv = realloc(c->ids, nc * sizeof(*nv));
        if (nv == NULL)
            return;
        c->ids = nv;
        c->cap = nc;
    }
    char *d = strdup(key);
    if (d)
        c->ids[c->n++] = d;
}

void pdl__push_reap_shares(pdl_rank_t *r)
{
    pdl_instance_t *inst = r->inst;
    push_reap_t c = {.rank = r->rank, .defer_ns = (uint64_t)(inst->cfg.conn.defer_timeout_s * 1e9)};
    pdl_push_t **freed = NULL;
    size_t nfreed = 0;
    pthread_mutex_lock(&inst->push_mu);
    c.now = pdl__clock_now_ns(); /* read under the lock: every push in the map is older */
    if (inst->pushes.count > 0)
        pdl__strmap_foreach(&inst->pushes, reap_push, &c);
    if (c.n > 0)
        freed = calloc(c.n, sizeof(*freed));
    for (size_t i = 0; i < c.n; i++) {
        pdl_push_t *p = pdl__strmap_get(&inst->pushes, c.ids[i]);
        pdl_push_t *gone = p ? push_rank_final(inst, p, r->rank, RS_EXPIRED) : NULL;
        if (gone != NULL && freed != NULL)
            freed[nfreed++] = gone;
        else if (gone != NULL)
            push_free(gone);
    }
    pthread_mutex_unlock(&inst->push_mu);
    for (size_t i = 0; i < nfreed; i++)
        push_free(freed[i]);
    free(freed);
    for (size_t i = 0; i < c.n; i++) {
        uint64_t sup = 0;
        if (pdl_ratelimit_allow(&r->ctr.expired_rl, &sup))
            pdl_warn("rank %d: push %s reaped after defer_timeout %.1f s without remote_blocks; blocks freed%s",
                     r->rank, c.ids[i], inst->cfg.conn.defer_timeout_s, sup ? " (more expiries suppressed)" : "");
        PDL_CTR_ADD(r, expired, 1);
        pdl__held_rank_resolved(inst, c.ids[i], r->rank, true);
        free(c.ids[i]);
    }
    free(c.ids);
}

static void free_push_v(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    push_free(value);
}

void pdl__push_free_pushes(pdl_instance_t *inst)
{
    for (unsigned i = 0; i < PDL_PUSH_TOMBS; i++)
        push_free(inst->tombs[i]);
    pdl__strmap_foreach(&inst->pushes, free_push_v, NULL);
    pdl__strmap_free(&inst->pushes);
}
