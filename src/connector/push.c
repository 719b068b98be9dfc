/*
 * push.c -- WRITE mode with heterogeneous TP (docs/protocol.md#write-flow): producer pushes, consumer waits.
 *
 * Producer. pdl_instance_push registers the transfer's blocks as held (freed when every rank
 * resolved it, like a READ hold) and a pdl_push_t with one state per rank: WAITING for the consumer's
 * remote_blocks, STARTED, DONE, or EXPIRED. A rank's service thread hands a remote_blocks message to
 * the push; when the push does not exist yet the message is parked under "rank|transfer id" (bounded
 * in count, dropped after defer_timeout) and picked up by pdl_instance_push. A started rank queues a
 * job for its writer thread (pdl_xfer_side_t), which hands the pieces of its pdl_topo_write_plan to
 * the transfer executor (xfer.c: handshakes with the consumer ranks -- cached peers, the consumer's
 * engine id being "host:handshake base" --, one batched WRITE per layer per target, the wait within
 * transfer_timeout), sends
 * write_done (status, producer_tp_size/rank) to every consumer rank of its notify set -- written to or
 * not, so each consumer rank counts exactly expected_write_done(P, D) -- and resolves its rank. A
 * rank still WAITING after defer_timeout is reaped by its service thread (counted expired).
 *
 * Consumer. pdl_instance_expect_push registers a pdl_recv_t under the transfer id, then each consumer
 * rank d sends remote_blocks to each producer rank p of its group whose first consumer is d: every
 * producer rank learns the block list once (block ids are the same on every consumer rank). A rank's
 * service thread counts write_done for it (one per producer rank of its group; duplicates and ranks
 * outside the group are not counted); a rank finishes when it counted them all, or at
 * transfer_timeout (checked by its service thread). The receive completes when every rank finished,
 * so a failure never lets the caller free blocks another producer rank may still be writing.
 *
 * All the WRITE-mode maps and the receive states are guarded by inst->push_mu, which is never held
 * while calling into the held-transfer aggregation (held_mu) or sending.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "connector/internal.h"
#include "common/clock.h"

/* WRITE mode, producer: one rank's share of a push, started when the consumer's block list is known. */
typedef struct push_job {
    pdl_workq_item_t item; /* first: the queue hands the item back as the job */
    struct pdl_push *push;
    uint32_t *blocks; /* the consumer's block ids (owned) */
    size_t n;
    int decode_dp;
    int consumer_tp; /* from remote_blocks' consumer_tp_size, else the push's params */
} push_job_t;

enum { RS_WAITING = 0, RS_STARTED = 1, RS_DONE = 2, RS_EXPIRED = 3 };

/* Bounds on parked remote_blocks per instance: a flood of unknown transfer ids cannot grow memory.
 * Entries, and bytes of block ids: each list holds at most num_blocks ids (a push never holds more), and
 * all of them together at most PUSH_PARK_MAX_BYTES. Without the byte bound, 1,024 lists of up to 1,048,576 ids
 * each could be parked (~4 GiB; 150 made-up ones would grow a prefill from 12 MB to 631 MB). */
#define PUSH_MAX_PARKED 1024
#define PUSH_PARK_MAX_BYTES (4u << 20)

/* The numeric form of `host` ("" for a name: what a name resolves to can change), as libzmq reports a
 * sender's Peer-Address. */
static void numeric_of(const char *host, char out[64])
{
    if (pdl__host_numeric(host, false, out, 64) != 0)
        out[0] = '\0';
}

/* Did a message come from `expected` (numeric)? Unknown on either side ("" / NULL) is accepted: a host
 * name cannot be compared without resolving it, and libzmq may not report the peer. */
static bool sent_by(const char *sender, const char *expected)
{
    return sender == NULL || sender[0] == '\0' || expected[0] == '\0' || strcmp(sender, expected) == 0;
}

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
} pdl_push_t;

typedef struct parked_rb {
    uint32_t *blocks; /* NULL when abandoned */
    bool abandoned;   /* the consumer said it will not take the push (a failed release came first) */
    char sender[64];  /* the host it came from (Peer-Address; "" = unknown): an abandon's is checked when the
                       * push is made, a remote_blocks' binds an abandon that would replace it */
    size_t n;
    int decode_dp;
    int said_tp; /* consumer_tp_size from the message, 0 when absent */
    int rank;
    uint64_t at_ns;
} parked_rb_t;

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

static void push_free(pdl_push_t *p)
{
    if (p == NULL)
        return;
    free(p->ids);
    free(p->state);
    free(p);
}

static void parked_free(parked_rb_t *k)
{
    if (k) {
        free(k->blocks);
        free(k);
    }
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
 * transfer_timeout (before, it was parked or dropped in silence). Under push_mu.
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

/* Writes of one rank through the executor: the pieces of its write plan, one per consumer rank. */
static pdl_status_t rank_write(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_push_t *p, const push_job_t *j, uint64_t *bytes_out,
                               uint64_t *descs_out, bool *verified, pdl_error_t *err)
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
        pdl_xfer_times_t xt = {0};
        st = pdl__xfer_run(r, side, &x, bytes_out, descs_out, &xt, verified, err);
    }
    free(pieces);
    free(plan);
    return st;
}

static pdl_status_t encode_write_done(const pdl_rank_t *r, const char *transfer_id, bool ok, pdl_bytes_t *b,
                                      pdl_error_t *err)
{
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_WRITE_DONE);
    snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", transfer_id);
    m.status = ok ? PDL_RELEASE_OK : PDL_RELEASE_FAILED;
    m.producer_tp_size = r->inst->tp;
    m.producer_tp_rank = r->rank;
    pdl_status_t st = pdl_wire_encode_msg(&m, b, err);
    pdl_msg_clear(&m);
    return st;
}

/* To every consumer rank of the rank's notify set; `verified`: the consumer answered our handshakes
 * (its DEALERs are in the verified share of the socket cap, sender.c). */
static void send_write_done(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_push_t *p, const push_job_t *j, bool ok,
                            bool verified)
{
    pdl_instance_t *inst = r->inst;
    int first = 0, count = 0, decode_dp = j->decode_dp;
    if (pdl_topo_consumers_of(inst->tp, j->consumer_tp, r->rank, &first, &count, NULL) != PDL_OK)
        return;
    for (int c = first; c < first + count; c++) {
        pdl_bytes_t b = {0};
        pdl_error_t e;
        char ep[PDL_WIRE_HOST_MAX + 32];
        int off = pdl_topo_port_offset(decode_dp, j->consumer_tp, c);
        if (encode_write_done(r, p->transfer_id, ok, &b, &e) != PDL_OK)
            pdl_warn("rank %d: write_done of %s not encoded: %s", r->rank, p->transfer_id, e.msg);
        else if (off < 0 || pdl__endpoint(ep, sizeof(ep), p->host, p->notify_base + off) < 0)
            pdl_warn("rank %d: write_done of %s: no endpoint for consumer rank %d", r->rank, p->transfer_id, c);
        else if (pdl__dealer_send(r, &side->dealers, ep, PDL_OUT_OTHER | (verified ? PDL_OUT_VERIFIED : 0), &b))
            PDL_CTR_ADD(r, write_done_sent, 1);
        pdl_bytes_free(&b);
    }
}

static void run_push_job(pdl_rank_t *r, pdl_xfer_side_t *side, push_job_t *j)
{
    pdl_instance_t *inst = r->inst;
    pdl_push_t *p = j->push;
    pdl_error_t err;
    pdl_error_clear(&err);
    uint64_t bytes = 0, descs = 0;
    bool verified = false;
    /* A share queued behind others on the lane of a consumer found gone: no handshake, no write. Read
     * under push_mu: the watch sets it from the service thread (p lives while this rank is STARTED). */
    pthread_mutex_lock(&inst->push_mu);
    bool gone_before = p->consumer_gone;
    pthread_mutex_unlock(&inst->push_mu);
    pdl_status_t st = gone_before ? pdl_error_set(&err, PDL_ERR_PEER_GONE, "consumer %s is gone (its handshake "
                                                  "port is watched); nothing written", p->engine_id)
                                  : rank_write(r, side, p, j, &bytes, &descs, &verified, &err);
    if (st != PDL_OK)
        pdl_warn("rank %d: push of %s failed (write_done says failed): %s", r->rank, p->transfer_id, err.msg);
    send_write_done(r, side, p, j, st == PDL_OK, verified);
    /* The consumer looks gone: stop reconnecting to it once write_done left (sender.c). */
    if (st == PDL_ERR_PEER_GONE || st == PDL_ERR_TIMEOUT || st == PDL_ERR_TRANSPORT)
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
    int first = 0, count = 0;
    pdl_status_t st = pdl_topo_consumers_of(r->inst->tp, consumer_tp, r->rank, &first, &count, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "consumer TP %d with producer TP %d", consumer_tp, r->inst->tp);
    for (int c = first; st == PDL_OK && c < first + count; c++) {
        pdl_bytes_t b = {0};
        int off = pdl_topo_port_offset(dp, consumer_tp, c);
        st = off < 0 ? pdl_error_set(err, PDL_ERR_INVALID, "no notify port for DP rank %d", dp)
                     : encode_write_done(r, tid, false, &b, err);
        if (st == PDL_OK)
            st = pdl__outq_send(r, host, notify_base + off, PDL_OUT_OTHER, &b, err);
        pdl_bytes_free(&b);
        if (st == PDL_OK)
            PDL_CTR_ADD(r, write_done_sent, 1);
        else
            pdl_error_prefix(err, st, "write_done to consumer rank %d", c);
    }
    return st;
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
    const parked_rb_t *k = value;
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
        if (c.count < PUSH_MAX_PARKED && c.bytes + bytes <= PUSH_PARK_MAX_BYTES) {
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
        parked_free(pdl__strmap_remove(&inst->parked, top->oldest_key));
        free(c.t);
        evicted++;
    }
    return -1;
}

void pdl__push_on_remote_blocks(pdl_rank_t *r, const pdl_msg_t *msg, const char *sender)
{
    pdl_instance_t *inst = r->inst;
    if (inst->cfg.conn.role != PDL_ROLE_PRODUCER || msg->transfer_id[0] == '\0' || msg->decode_rank < 0 ||
        msg->decode_rank > 65535) {
        pdl__ctr_drop(r, PDL_DROP_NOTIFY_UNSUPPORTED, "remote_blocks for transfer '%s' (req %s): %s",
                             msg->transfer_id, msg->req_id,
                             inst->cfg.conn.role != PDL_ROLE_PRODUCER ? "this instance is a consumer"
                             : msg->transfer_id[0] == '\0'            ? "no transfer_id"
                                                                      : "decode_rank out of range");
        return;
    }
    if (msg->num_blocks > inst->cfg.num_blocks) {
        /* No push holds more blocks than the instance has; the ids themselves are the consumer's, checked
         * against its num_blocks (from its handshake) before anything is written (layout.c). */
        PDL_CTR_REFUSED(r, remote_blocks_refused,
                        "refused remote_blocks for transfer %.100s from %s: %zu block ids, more than num_blocks %u",
                        msg->transfer_id, sender ? sender : "an unknown address", msg->num_blocks,
                        inst->cfg.num_blocks);
        return;
    }
    PDL_CTR_ADD(r, remote_blocks_received, 1);
    int said_tp = 0;
    if (msg->consumer_tp_rank >= 0) {
        int dummy;
        if (msg->consumer_tp_size > PDL_TOPO_MAX_TP ||
            pdl_topo_map_rank(0, inst->tp, (int)msg->consumer_tp_size, &dummy, NULL) != PDL_OK) {
            pdl__ctr_drop(r, PDL_DROP_NOTIFY_FANIN, "remote_blocks for %s: consumer_tp_size %" PRId64
                                 " does not fit producer TP %d", msg->transfer_id, msg->consumer_tp_size, inst->tp);
            return;
        }
        said_tp = (int)msg->consumer_tp_size;
    }
    uint32_t *blocks = malloc(msg->num_blocks * sizeof(uint32_t));
    if (blocks == NULL)
        return;
    memcpy(blocks, msg->block_ids, msg->num_blocks * sizeof(uint32_t));
    push_job_t *job = NULL;
    bool dropped = false, parked = false;
    char key[PDL_WIRE_ID_MAX + 16];
    snprintf(key, sizeof(key), "%d|%s", r->rank, msg->transfer_id);
    given_up_t gu = {.consumer_tp = 0};
    char expected[64] = "";
    int evicted = 0;
    pthread_mutex_lock(&inst->push_mu);
    pdl_push_t *p = pdl__strmap_get(&inst->pushes, msg->transfer_id);
    pdl_push_t *given = p != NULL ? p : tomb_find(inst, msg->transfer_id);
    if (given != NULL && !sent_by(sender, given->host_ip)) {
        /* The push names its consumer: a list from another host would make us write the KV into blocks
         * the consumer never offered, and send it write_done for them. */
        snprintf(expected, sizeof(expected), "%s", given->host_ip);
    } else if (given != NULL && given->state[r->rank] == RS_EXPIRED) {
        snprintf(gu.host, sizeof(gu.host), "%s", given->host);
        gu.notify_base = given->notify_base;
        gu.consumer_tp = said_tp > 0 ? said_tp : given->consumer_tp;
    } else if (p != NULL) {
        if (p->state[r->rank] == RS_WAITING) {
            job = job_new(p, blocks, msg->num_blocks, (int)msg->decode_rank, said_tp);
            if (job != NULL)
                p->state[r->rank] = RS_STARTED;
        }
        dropped = job == NULL;
    } else if (given != NULL) {
        dropped = true; /* a duplicate for a rank that wrote */
    } else if (pdl__strmap_get(&inst->parked, key) == NULL &&
               (evicted = park_make_room(inst, sender ? sender : "", msg->num_blocks * sizeof(uint32_t))) >= 0) {
        parked_rb_t *k = calloc(1, sizeof(*k));
        if (k != NULL) {
            k->blocks = blocks;
            k->n = msg->num_blocks;
            k->decode_dp = (int)msg->decode_rank;
            k->said_tp = said_tp;
            snprintf(k->sender, sizeof(k->sender), "%s", sender ? sender : "");
            k->rank = r->rank;
            k->at_ns = pdl__clock_now_ns();
            if (pdl__strmap_put(&inst->parked, key, k) == 0)
                parked = true;
            else
                free(k);
        }
        dropped = !parked;
    } else {
        dropped = true;
    }
    pthread_mutex_unlock(&inst->push_mu);
    if (evicted > 0) {
        PDL_CTR_ADD(r, remote_blocks_evicted, (uint64_t)evicted);
        pdl_debug("rank %d: park table full: %d parked entries of the host holding most of it evicted", r->rank,
                  evicted);
    }
    if (expected[0] != '\0') {
        free(blocks);
        PDL_CTR_REFUSED(r, remote_blocks_refused,
                        "refused remote_blocks for push %.100s from %s: its consumer is %s", msg->transfer_id,
                        sender, expected);
        return;
    }
    if (job != NULL) {
        enqueue_job(r, job);
        return;
    }
    if (gu.consumer_tp > 0) {
        free(blocks);
        answer_given_up(r, msg, &gu);
        return;
    }
    if (parked) {
        PDL_CTR_ADD(r, remote_blocks_parked, 1);
        pdl_debug("rank %d: remote_blocks for %s parked until its push", r->rank, msg->transfer_id);
        return;
    }
    free(blocks);
    if (dropped) {
        PDL_CTR_ADD(r, remote_blocks_dropped, 1);
        pdl_debug("rank %d: remote_blocks for %s dropped (duplicate or park full)", r->rank, msg->transfer_id);
    }
}

/* The consumer a WRITE producer serves: params' remote_host/ports, else the request id's decode address. */
static pdl_status_t consumer_of(const pdl_kv_params_t *params, const char *request_id, const char *what,
                                char host[PDL_WIRE_HOST_MAX + 1], int *hs_base, int *notify_base, pdl_error_t *err)
{
    if (params->remote_host[0] && params->remote_handshake_port > 0 && params->remote_notify_port > 0) {
        snprintf(host, PDL_WIRE_HOST_MAX + 1, "%s", params->remote_host);
        *hs_base = params->remote_handshake_port;
        *notify_base = params->remote_notify_port;
        return PDL_OK;
    }
    pdl_zmq_addr_t da;
    pdl_error_t e;
    if (request_id == NULL || pdl_wire_parse_request_id(request_id, NULL, &da, &e) != PDL_OK)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "%s %s: no consumer address: kv_transfer_params lacks remote_host/"
                             "remote_handshake_port/remote_notify_port and the request id %s",
                             what, params->transfer_id, request_id ? e.msg : "is absent");
    snprintf(host, PDL_WIRE_HOST_MAX + 1, "%s", da.host);
    *hs_base = da.handshake_port;
    *notify_base = da.notify_port;
    return PDL_OK;
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
    char key[PDL_WIRE_ID_MAX + 16];
    snprintf(key, sizeof(key), "%d|%s", r->rank, msg->transfer_id);
    bool resolved = false, parked = false, refused = false;
    char expected[64] = "";
    pdl_push_t *gone = NULL;
    pthread_mutex_lock(&inst->push_mu);
    pdl_push_t *p = pdl__strmap_get(&inst->pushes, msg->transfer_id);
    parked_rb_t *rb = p == NULL ? pdl__strmap_get(&inst->parked, key) : NULL;
    if (rb != NULL && !rb->abandoned && !pdl__held_sender_is_consumer(inst, sender, rb->sender)) {
        /* The consumer's block list is parked: an abandon from another host must not discard it. */
        refused = true;
        snprintf(expected, sizeof(expected), "%s", rb->sender);
    } else if (p != NULL) {
        if (p->state[r->rank] == RS_WAITING) {
            gone = push_rank_final(inst, p, r->rank, RS_EXPIRED);
            resolved = true;
        }
    } else {
        parked_rb_t *k = rb;
        /* Abandons may name pushes that already finished (the router's and the decode's both come after a
         * failed decode leg): they take at most half the park, so early remote_blocks keep room. */
        if (k == NULL && inst->parked.count < PUSH_MAX_PARKED / 2 && (k = calloc(1, sizeof(*k))) != NULL) {
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
        char key[PDL_WIRE_ID_MAX + 16];
        snprintf(key, sizeof(key), "%d|%s", i, tid);
        const parked_rb_t *k = pdl__strmap_get(&inst->parked, key);
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

pdl_status_t pdl_instance_push(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               const uint32_t *ids, size_t n, pdl_error_t *err)
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
    pdl_push_t *p = calloc(1, sizeof(*p));
    if (p == NULL || (p->ids = malloc(n * sizeof(uint32_t))) == NULL ||
        (p->state = calloc((size_t)inst->tp, 1)) == NULL) {
        push_free(p);
        return pdl_error_set(err, PDL_ERR_NOMEM, "push %s: out of memory", tid);
    }
    snprintf(p->transfer_id, sizeof(p->transfer_id), "%s", tid);
    for (int i = 0; i < inst->tp; i++) /* other processes push the ranks this one does not run */
        if (!pdl__is_local(inst, i))
            p->state[i] = RS_DONE;
    st = consumer_of(params, request_id, "push", p->host, &p->hs_base, &p->notify_base, err);
    if (st != PDL_OK)
        goto fail;
    snprintf(p->engine_id, sizeof(p->engine_id), "%s:%d", p->host, p->hs_base);
    numeric_of(p->host, p->host_ip);
    if (!pdl__trust_host(&inst->trusted, p->host)) {
        PDL_CTR_ADD(pdl__rank_first(inst), untrusted_refused, 1);
        st = pdl_error_set(err, PDL_ERR_DENIED, "push %s: consumer host %.200s is not in trusted_hosts (%.200s)", tid,
                           p->host, inst->cfg.conn.trusted_hosts);
        goto fail;
    }
    bool disagree = false;
    p->consumer_tp = pdl_kv_params_peer_tp(params, inst->tp, &disagree);
    if (disagree)
        pdl_warn("push %s: kv_transfer_params remote_tp_size %d and tp_size %d disagree; using %d", tid,
                 params->remote_tp_size, params->tp_size, p->consumer_tp);
    int dummy;
    pdl_error_t e;
    if (p->consumer_tp < 1 || p->consumer_tp > PDL_TOPO_MAX_TP ||
        pdl_topo_map_rank(0, inst->tp, p->consumer_tp, &dummy, &e) != PDL_OK) {
        st = pdl_error_set(err, PDL_ERR_INVALID, "push %s: consumer TP %d with producer TP %d: %s", tid, p->consumer_tp,
                           inst->tp, p->consumer_tp < 1 ? "invalid size" : e.msg);
        goto fail;
    }
    memcpy(p->ids, ids, n * sizeof(uint32_t));
    p->n = n;
    p->created_ns = pdl__clock_now_ns();

    /* The consumer reads nothing; our own writer threads read the blocks after a queue hand-off, and
     * the tcp backend's threads through the engine: publish to both. */
    PDL_FOR_LOCAL(inst, i)
        pdl_engine_publish(inst->ranks[i].mem.engine);

    /* Named for the consumer-gone watch (watch.c) and the host check of failed releases (held.c). */
    char consumer[PDL_WIRE_HOST_MAX + 16];
    pdl__held_consumer_name(consumer, sizeof(consumer), p->host, p->hs_base);
    st = pdl__held_add(inst, tid, ids, n, consumer, err);
    if (st != PDL_OK) {
        pdl_error_prefix(err, st, "push");
        goto fail;
    }
    push_job_t **jobs = calloc((size_t)inst->tp, sizeof(*jobs));
    bool *abandoned = calloc((size_t)inst->tp, sizeof(*abandoned));
    sender_t *forged = parked_abandons_forged(inst, tid);
    pdl_push_t *all_abandoned = NULL;
    bool *foreign = calloc((size_t)inst->tp, sizeof(*foreign)); /* a rank's parked list came from elsewhere */
    char consumer_ip[64]; /* p may be freed by another thread once push_mu is released */
    memcpy(consumer_ip, p->host_ip, sizeof(consumer_ip));
    pthread_mutex_lock(&inst->push_mu);
    int rc = jobs == NULL || abandoned == NULL || forged == NULL || foreign == NULL
                 ? -1
                 : pdl__strmap_put(&inst->pushes, tid, p);
    if (rc == 0) {
        for (int i = 0; i < inst->tp; i++) {
            char key[PDL_WIRE_ID_MAX + 16];
            snprintf(key, sizeof(key), "%d|%s", i, tid);
            parked_rb_t *k = pdl__strmap_get(&inst->parked, key);
            if (k == NULL)
                continue;
            if (k->abandoned && forged[i][0] != '\0' && strcmp(k->sender, forged[i]) == 0) {
                parked_free(pdl__strmap_remove(&inst->parked, key)); /* refused and counted: the rank waits */
                continue;
            }
            if (k->abandoned) {
                /* The consumer gave up before the prefill finished: this rank is done at once. */
                parked_free(pdl__strmap_remove(&inst->parked, key));
                abandoned[i] = true;
                pdl_push_t *gone = push_rank_final(inst, p, i, RS_EXPIRED);
                if (gone != NULL)
                    all_abandoned = gone;
                continue;
            }
            if (!sent_by(k->sender, p->host_ip)) {
                /* Parked before anything named the consumer: now that the push does, a list from
                 * another host is refused (counted below) and the rank waits for the consumer's own. */
                parked_free(pdl__strmap_remove(&inst->parked, key));
                foreign[i] = true;
                continue;
            }
            jobs[i] = job_new(p, k->blocks, k->n, k->decode_dp, k->said_tp);
            if (jobs[i] == NULL)
                continue; /* stays parked; the rank is reaped after defer_timeout */
            pdl__strmap_remove(&inst->parked, key);
            k->blocks = NULL;
            parked_free(k);
            p->state[i] = RS_STARTED;
        }
    }
    pthread_mutex_unlock(&inst->push_mu);
    free(forged);
    for (int i = 0; foreign != NULL && i < inst->tp; i++)
        if (foreign[i])
            PDL_CTR_REFUSED(&inst->ranks[i], remote_blocks_refused,
                            "refused remote_blocks for push %.100s parked before it: not sent by its consumer %s", tid,
                            consumer_ip);
    free(foreign);
    if (rc != 0) {
        free(jobs);
        free(abandoned);
        pdl__held_cancel(inst, tid);
        st = rc > 0 ? pdl_error_set(err, PDL_ERR_BAD_STATE, "push: transfer %s is already being pushed", tid)
                    : pdl_error_set(err, PDL_ERR_NOMEM, "push %s: out of memory", tid);
        goto fail;
    }
    for (int i = 0; i < inst->tp; i++)
        if (jobs[i] != NULL)
            enqueue_job(&inst->ranks[i], jobs[i]);
    free(jobs);
    for (int i = 0; i < inst->tp; i++)
        if (abandoned[i])
            pdl__held_rank_resolved(inst, tid, i, true);
    free(abandoned);
    push_free(all_abandoned); /* every rank abandoned: the push left the map; p is not used after this */
    return PDL_OK;
fail:
    push_free(p);
    return st;
}

/* ---- consumer --------------------------------------------------------------------------------- */

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
    char key[PDL_WIRE_ID_MAX + 16];
    snprintf(key, sizeof(key), "0|%s", transfer_id);
    if (inst->parked.count >= PUSH_MAX_PARKED / 2 || pdl__strmap_get(&inst->parked, key) != NULL)
        return;
    parked_rb_t *k = calloc(1, sizeof(*k));
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
    if (rv != NULL && !sent_by(sender, rv->phost_ip)) {
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

/* The producer a WRITE consumer receives from: host and notify base (params, else the request id's
 * prefill address), its TP, and its DP rank. */
typedef struct producer_ref {
    char host[PDL_WIRE_HOST_MAX + 1];
    int hs_base, notify_base, tp, dp;
} producer_ref_t;

static pdl_status_t producer_of(const pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                const char *what, producer_ref_t *pr, pdl_error_t *err)
{
    const char *tid = params->transfer_id;
    if (params->remote_host[0] && params->remote_handshake_port > 0 && params->remote_notify_port > 0) {
        snprintf(pr->host, sizeof(pr->host), "%s", params->remote_host);
        pr->hs_base = params->remote_handshake_port;
        pr->notify_base = params->remote_notify_port;
    } else {
        pdl_zmq_addr_t pa;
        pdl_error_t e;
        if (request_id == NULL || pdl_wire_parse_request_id(request_id, &pa, NULL, &e) != PDL_OK)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "%s %s: no producer address: kv_transfer_params lacks remote_host/"
                                 "remote_handshake_port/remote_notify_port and the request id %s",
                                 what, tid, request_id ? e.msg : "is absent");
        snprintf(pr->host, sizeof(pr->host), "%s", pa.host);
        pr->hs_base = pa.handshake_port;
        pr->notify_base = pa.notify_port;
    }
    bool disagree = false;
    int P = pdl_kv_params_peer_tp(params, inst->tp, &disagree);
    int D = inst->tp, dummy;
    pdl_error_t e;
    if (P < 1 || P > PDL_TOPO_MAX_TP || pdl_topo_map_rank(0, D, P, &dummy, &e) != PDL_OK)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s %s: producer TP %d with consumer TP %d: %s", what, tid, P, D,
                             P < 1 || P > PDL_TOPO_MAX_TP ? "invalid size" : e.msg);
    pr->tp = P;
    pr->dp = params->remote_dp_rank >= 0 ? params->remote_dp_rank : 0;
    if (pr->notify_base + pr->dp * P + P > 65536)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s %s: producer notify port %d + %d ranks exceed 65535", what, tid,
                             pr->notify_base, pr->dp * P + P);
    return PDL_OK;
}

/* Consumer rank d tells producer rank g (each g once: by the first consumer rank of its group), as
 * remote_blocks and abandons are sent. */
static bool consumer_speaks_for(int P, int D, int d, int g)
{
    int cfirst = 0, ccount = 0;
    return pdl_topo_consumers_of(P, D, g, &cfirst, &ccount, NULL) == PDL_OK && cfirst == d;
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
    producer_ref_t pr;
    st = producer_of(inst, params, request_id, "expect_push", &pr, err);
    if (st != PDL_OK)
        return st;
    const char *host = pr.host;
    int notify_base = pr.notify_base, P = pr.tp, D = inst->tp, remote_dp = pr.dp;
    int expected = 0;
    pdl_error_t e;
    if (pdl_topo_expected_write_done(P, D, &expected, &e) != PDL_OK)
        return pdl_error_set(err, PDL_ERR_INVALID, "expect_push %s: producer TP %d with consumer TP %d: %s", tid, P, D,
                             e.msg);
    pdl_recv_t *rv = calloc(1, sizeof(*rv));
    if (rv == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "expect_push: out of memory");
    rv->count = calloc((size_t)D, sizeof(int));
    rv->done = calloc((size_t)D, sizeof(bool));
    rv->seen = calloc((size_t)D, sizeof(*rv->seen));
    rv->failed = calloc((size_t)D, sizeof(bool));
    rv->rank_failed_by = -1;
    pdl__clock_cond_init(&rv->cv);
    if (rv->count == NULL || rv->done == NULL || rv->seen == NULL || rv->failed == NULL) {
        recv_free_parts(rv);
        return pdl_error_set(err, PDL_ERR_NOMEM, "expect_push: out of memory");
    }
    rv->inst = inst;
    snprintf(rv->transfer_id, sizeof(rv->transfer_id), "%s", tid);
    rv->producer_tp = P;
    snprintf(rv->phost, sizeof(rv->phost), "%s", pr.host);
    numeric_of(pr.host, rv->phost_ip);
    rv->phs_base = pr.hs_base;
    rv->pdp = remote_dp;
    rv->expected = expected;
    rv->pending = inst->hi - inst->lo;
    rv->status = PDL_OK;
    rv->deadline_ns = pdl__clock_now_ns() + (uint64_t)(inst->cfg.conn.transfer_timeout_s * 1e9);
    char early_key[PDL_WIRE_ID_MAX + 16];
    snprintf(early_key, sizeof(early_key), "0|%s", tid);
    pthread_mutex_lock(&inst->push_mu);
    int rc = pdl__strmap_put(&inst->recvs, tid, rv);
    rv->in_map = rc == 0;
    parked_rb_t *early = rc == 0 ? pdl__strmap_remove(&inst->parked, early_key) : NULL;
    bool early_forged = early != NULL && !sent_by(early->sender, rv->phost_ip);
    char early_from[64] = "";
    if (early_forged) { /* not from the producer this receive names: ignored, the receive goes ahead */
        snprintf(early_from, sizeof(early_from), "%s", early->sender);
        parked_free(early);
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
                        "producer is %s", tid, early_from, rv->phost_ip);
    if (rc != 0) {
        recv_free_parts(rv);
        return rc > 0 ? pdl_error_set(err, PDL_ERR_BAD_STATE, "expect_push: transfer %s is already expected", tid)
                      : pdl_error_set(err, PDL_ERR_NOMEM, "expect_push %s: out of memory", tid);
    }
    if (early != NULL) {
        /* No remote_blocks: nobody will push. pdl_recv_wait reports the failure at once. */
        parked_free(early);
        *recv_out = rv;
        return PDL_OK;
    }
    /* Before remote_blocks goes out: the producers' writes into these blocks name the transfer. */
    st = pdl__rank_grant(inst, tid, PDL_GRANT_WRITE, local_blocks, n, err);
    if (st != PDL_OK) {
        pdl_recv_free(rv);
        pdl_error_prefix(err, st, "expect_push");
        return st;
    }
    /* remote_blocks: consumer rank d to each producer rank g of its group whose first consumer is d. */
    PDL_FOR_LOCAL(inst, d) {
        pdl_rank_t *r = &inst->ranks[d];
        int gfirst = 0, gcount = 0;
        pdl_topo_group(P, D, d, &gfirst, &gcount, NULL);
        for (int g = gfirst; g < gfirst + gcount; g++) {
            if (!consumer_speaks_for(P, D, d, g))
                continue;
            pdl_msg_t m;
            pdl_msg_init(&m, PDL_MSG_REMOTE_BLOCKS);
            snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
            snprintf(m.req_id, sizeof(m.req_id), "%.*s", PDL_WIRE_ID_MAX,
                     request_id && request_id[0] ? request_id : tid);
            m.decode_rank = inst->cfg.dp_rank;
            m.consumer_tp_size = D;
            m.consumer_tp_rank = d;
            m.block_ids = (uint32_t *)local_blocks; /* borrowed for the encode */
            m.num_blocks = n;
            pdl_bytes_t b = {0};
            pdl_error_t se;
            st = pdl_wire_encode_msg(&m, &b, &se);
            if (st == PDL_OK)
                st = pdl__outq_send(r, host, notify_base + pdl_topo_port_offset(remote_dp, P, g), PDL_OUT_OTHER, &b,
                                       &se);
            pdl_bytes_free(&b);
            if (st == PDL_OK)
                PDL_CTR_ADD(r, remote_blocks_sent, 1);
            else
                pdl_warn("rank %d: remote_blocks of %s to producer rank %d not sent: %s", d, tid, g, se.msg);
        }
    }
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
        st = pdl_error_set(err, PDL_ERR_TIMEOUT, "receive %s: %d ranks still waiting for write_done after %d ms",
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
            pdl__held_consumer_name(peer, sizeof(peer), rv->phost, rv->phs_base + off);
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

/* ---- abandon (pdl_instance_abandon in WRITE mode) ---------------------------------------------- */

/* Consumer: a failed release to every producer rank, each once (pdl__push_on_abandon frees it there). */
static pdl_status_t abandon_as_consumer(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                        pdl_error_t *err)
{
    producer_ref_t pr;
    pdl_status_t st = producer_of(inst, params, request_id, "abandon", &pr, err);
    for (int d = inst->lo; st == PDL_OK && d < inst->hi; d++) {
        int gfirst = 0, gcount = 0;
        pdl_topo_group(pr.tp, inst->tp, d, &gfirst, &gcount, NULL);
        for (int g = gfirst; st == PDL_OK && g < gfirst + gcount; g++) {
            if (!consumer_speaks_for(pr.tp, inst->tp, d, g))
                continue;
            pdl_bytes_t b = {0};
            st = pdl__release_encode(params->transfer_id, inst->tp, d, pr.tp, g, false, &b, err);
            if (st == PDL_OK)
                st = pdl__outq_send(&inst->ranks[d], pr.host, pr.notify_base + pdl_topo_port_offset(pr.dp, pr.tp, g),
                                    PDL_OUT_RELEASE, &b, err);
            pdl_bytes_free(&b);
            if (st != PDL_OK)
                pdl_error_prefix(err, st, "abandon %s: release to producer rank %d", params->transfer_id, g);
        }
    }
    return st;
}

/* Producer: the failed write_done a failed push sends, from every rank to every consumer rank of its
 * notify set, so the decode's receive fails now instead of at transfer_timeout and frees its blocks;
 * remote_blocks parked for the transfer are dropped. */
static pdl_status_t abandon_as_producer(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                        pdl_error_t *err)
{
    const char *tid = params->transfer_id;
    char host[PDL_WIRE_HOST_MAX + 1];
    int hs_base = 0, notify_base = 0;
    pdl_status_t st = consumer_of(params, request_id, "abandon", host, &hs_base, &notify_base, err);
    if (st != PDL_OK)
        return st;
    bool disagree = false;
    int D = pdl_kv_params_peer_tp(params, inst->tp, &disagree);
    int dp = params->remote_dp_rank >= 0 ? params->remote_dp_rank : 0;
    PDL_FOR_LOCAL(inst, r) {
        char key[PDL_WIRE_ID_MAX + 16];
        snprintf(key, sizeof(key), "%d|%s", r, tid);
        pthread_mutex_lock(&inst->push_mu);
        parked_rb_t *k = pdl__strmap_remove(&inst->parked, key);
        pthread_mutex_unlock(&inst->push_mu);
        if (k != NULL) {
            /* The consumer's own word on its TP and DP rank beats the params'. */
            D = k->said_tp > 0 ? k->said_tp : D;
            dp = k->decode_dp;
            parked_free(k);
        }
    }
    for (int r = inst->lo; st == PDL_OK && r < inst->hi; r++) {
        st = queue_failed_write_done(&inst->ranks[r], tid, host, notify_base, D, dp, err);
        if (st != PDL_OK)
            pdl_error_prefix(err, st, "abandon %s", tid);
    }
    return st;
}

pdl_status_t pdl__push_abandon(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               pdl_error_t *err)
{
    pdl_status_t st = inst->cfg.conn.role == PDL_ROLE_CONSUMER ? abandon_as_consumer(inst, params, request_id, err)
                                                               : abandon_as_producer(inst, params, request_id, err);
    if (st == PDL_OK) {
        PDL_CTR_ADD(pdl__rank_first(inst), transfers_abandoned, 1);
        pdl_debug("abandon %s (WRITE mode): failed %s queued", params->transfer_id,
                  inst->cfg.conn.role == PDL_ROLE_CONSUMER ? "releases" : "write_done");
    }
    return st;
}

/* ---- reaping ---------------------------------------------------------------------------------- */

typedef struct reap_ctx {
    pdl_instance_t *inst;
    int rank;
    uint64_t now, defer_ns;
    char **ids; /* pushes this rank expired */
    size_t n, cap;
    char **parked_keys;
    size_t np, pcap;
    pdl_recv_t **late; /* receives this rank timed out */
    size_t nl, lcap;
} reap_ctx_t;

static bool grow(void **v, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return true;
    size_t nc = *cap ? 2 * *cap : 8;
    void *nv = realloc(*v, nc * elem);
    if (nv == NULL)
        return false;
    *v = nv;
    *cap = nc;
    return true;
}

static void reap_push(void *arg, const char *key, void *value)
{
    reap_ctx_t *c = arg;
    pdl_push_t *p = value;
    if (p->state[c->rank] != RS_WAITING || pdl__clock_since(c->now, p->created_ns) < c->defer_ns)
        return;
    if (!grow((void **)&c->ids, &c->cap, c->n, sizeof(char *)))
        return;
    char *d = strdup(key);
    if (d)
        c->ids[c->n++] = d;
}

static void reap_parked(void *arg, const char *key, void *value)
{
    reap_ctx_t *c = arg;
    parked_rb_t *k = value;
    if (k->rank != c->rank || pdl__clock_since(c->now, k->at_ns) < c->defer_ns)
        return;
    if (!grow((void **)&c->parked_keys, &c->pcap, c->np, sizeof(char *)))
        return;
    char *d = strdup(key);
    if (d)
        c->parked_keys[c->np++] = d;
}

static void reap_recv(void *arg, const char *key, void *value)
{
    (void)key;
    reap_ctx_t *c = arg;
    pdl_recv_t *rv = value;
    if (rv->done[c->rank] || c->now < rv->deadline_ns)
        return;
    if (grow((void **)&c->late, &c->lcap, c->nl, sizeof(pdl_recv_t *)))
        c->late[c->nl++] = rv;
}

void pdl__push_reap(pdl_rank_t *r)
{
    pdl_instance_t *inst = r->inst;
    if (inst->cfg.conn.read_mode)
        return;
    reap_ctx_t c = {.inst = inst, .rank = r->rank};
    c.defer_ns = (uint64_t)(inst->cfg.conn.defer_timeout_s * 1e9);
    pdl_push_t **freed = NULL;
    size_t nfreed = 0;
    pthread_mutex_lock(&inst->push_mu);
    c.now = pdl__clock_now_ns(); /* read under the lock: every push and park in the maps is older */
    if (inst->pushes.count == 0 && inst->parked.count == 0 && inst->recvs.count == 0) {
        pthread_mutex_unlock(&inst->push_mu);
        return;
    }
    pdl__strmap_foreach(&inst->pushes, reap_push, &c);
    pdl__strmap_foreach(&inst->parked, reap_parked, &c);
    pdl__strmap_foreach(&inst->recvs, reap_recv, &c);
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
    size_t dropped_rb = 0; /* parked abandons expire uncounted: they were acted on when they came */
    for (size_t i = 0; i < c.np; i++) {
        parked_rb_t *k = pdl__strmap_remove(&inst->parked, c.parked_keys[i]);
        dropped_rb += k != NULL && !k->abandoned;
        parked_free(k);
        free(c.parked_keys[i]);
    }
    char tmsg[128];
    snprintf(tmsg, sizeof(tmsg), "write_done not all received within transfer_timeout %.1f s",
             inst->cfg.conn.transfer_timeout_s);
    for (size_t i = 0; i < c.nl; i++)
        recv_rank_finish(c.late[i], r->rank, PDL_ERR_TIMEOUT, tmsg);
    pthread_mutex_unlock(&inst->push_mu);
    for (size_t i = 0; i < nfreed; i++)
        push_free(freed[i]);
    free(freed);
    if (dropped_rb > 0) {
        PDL_CTR_ADD(r, remote_blocks_dropped, dropped_rb);
        pdl_debug("rank %d: %zu parked remote_blocks dropped after defer_timeout", r->rank, dropped_rb);
    }
    free(c.parked_keys);
    free(c.late);
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

static void free_parked_v(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    parked_free(value);
}

static void orphan_recv(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    ((pdl_recv_t *)value)->in_map = false; /* the caller still frees it */
}

void pdl__push_free_all(pdl_instance_t *inst)
{
    for (unsigned i = 0; i < PDL_PUSH_TOMBS; i++)
        push_free(inst->tombs[i]);
    pdl__strmap_foreach(&inst->pushes, free_push_v, NULL);
    pdl__strmap_free(&inst->pushes);
    pdl__strmap_foreach(&inst->parked, free_parked_v, NULL);
    pdl__strmap_free(&inst->parked);
    pdl__strmap_foreach(&inst->recvs, orphan_recv, NULL);
    pdl__strmap_free(&inst->recvs);
    pthread_mutex_destroy(&inst->push_mu);
}
