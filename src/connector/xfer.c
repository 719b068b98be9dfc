/*
 * xfer.c -- the transfer executor: one rank's share of a READ (pull.c) or a WRITE (push.c).
 *
 * A transfer is a direction, the remote instance's address and a list of pieces (head ranges of
 * remote ranks). The executor handshakes with every remote rank the pieces name (cached peers of the
 * calling side), posts batched ops per remote rank -- whole layers per batch, as many as fit in
 * XFER_BATCH_BYTES (descriptors from pdl_layout_build_descs, merged) -- and waits for everything it
 * posted within transfer_timeout -- also after a failure, because a posted batch still uses our blocks.
 * Every peer whose post or batch failed as gone (PDL_ERR_PEER_GONE / PDL_ERR_TRANSPORT), or whose
 * session the engine reports broken after the attempt whatever code broke it (pdl_session_broken: a
 * batch freed while it ran, at transfer_timeout, breaks a tcp or ucx session with PDL_ERR_BAD_STATE), is
 * evicted, and with it the other cached ranks of the same remote instance: they live and die with it,
 * and a stale one would otherwise fail every later transfer too. The wall time goes to read_ns or
 * write_ns by direction.
 *
 * Layer gate: a WRITE of a push started before its KV was final (pdl_instance_push_start, push.c) has
 * one. The executor handshakes first, then posts the layers the gate lets through to every remote rank
 * (each range ends a batch), asks the gate for more, and so on until every layer is posted: the writes
 * of early layers overlap the forward that computes the later ones. The time spent at the gate is not
 * write time. Without a gate (reads, whole pushes) every layer is posted in one round.
 *
 * Stale sessions: when a transfer fails as gone, or its post finds the session already broken, on peers
 * that were cached before it started (the remote restarted at the same address with a new engine, or
 * its connections broke while idle), the executor evicts them and runs the transfer ONCE more,
 * handshaking afresh; so the first request after a peer's restart succeeds. Peers it handshook itself are not retried: their failure is real news.
 *
 * Lanes: a side (pdl_xfer_side_t) is one pdl_workq_t thread with the peer and DEALER caches it alone
 * uses, serving the transfers with ONE remote instance. A rank keeps a lane per remote instance
 * (pdl_xfer_lanes_t, created on first use), so a handshake or transfer that hangs on one dead peer
 * delays only the transfers that need that peer: with one thread serving every peer in order, a
 * kill -9 of one of two prefills would make every pull -- also from the healthy one -- wait out the
 * dead one's handshake timeout. A lane's peer health (peerhealth.h) makes the transfers queued
 * behind a failed handshake fail at once with its reason instead of timing out one after another.
 *
 * A lane's thread asks the scheduler for a long slice (lane_long_slice): lanes are where the copies run
 * (shm batches under 4 MiB run inline in the post), and a release crosses three threads that sleep
 * between short bursts -- libzmq's I/O thread on each side and the producer's service thread. Under
 * EEVDF (Linux 6.6+; a fair thread's slice request since 6.12) a woken thread whose virtual deadline is
 * later than the running one's waits for that slice to end, so with the default slice a release waits
 * behind whichever rank is still copying. A long slice puts the lane's deadline far out: the woken
 * threads run first, the lane keeps its share of the CPU (its weight is unchanged) and is preempted less
 * while copying. The release latency with and without it, from `pdlink bench --connector`:
 * docs/benchmarks.md#pdlink-bench---connector. Kernels that do not know the request keep the default,
 * which is only slower.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "connector/internal.h"
#include "common/clock.h"

/* Layers share a batch up to this many bytes. A batch costs ~1 us to post and check whatever its size,
 * and a short prompt's or a split head's layer is a few KiB (llama-3.1-8b, 16 tokens, one head: 8 KiB
 * per layer), so one batch per layer spent more on batches than on copying; above this size a batch is
 * long enough for that not to matter, and keeping batches this small keeps shm's copies inline on the
 * posting thread (its inline limit is 4 MiB) and lets tcp pipeline one batch behind another. */
#define XFER_BATCH_BYTES (2u << 20)

typedef struct posted {
    pdl_batch_t *batch;
    pdl_peer_t *peer;
    int remote_rank;
} posted_t;

static bool is_gone(pdl_status_t st) { return st == PDL_ERR_PEER_GONE || st == PDL_ERR_TRANSPORT; }

/* Is any of the peer's sessions (one, or one per layer) broken? Then every later post on it fails. */
static bool peer_broken(pdl_peer_t *p)
{
    for (int i = 0; i < p->nsessions; i++)
        if (pdl_session_broken(p->sessions[i]))
            return true;
    return false;
}

static void add_gone(pdl_peer_t **gone, int *ngone, pdl_peer_t *p)
{
    for (int g = 0; g < *ngone; g++)
        if (gone[g] == p)
            return;
    gone[(*ngone)++] = p;
}

typedef struct sibling_ctx {
    const char *prefix; /* "engine_id|dp|" */
    size_t len;
    pdl_peer_t *found[PDL_TOPO_MAX_TP];
    int n;
} sibling_ctx_t;

static void collect_sibling(void *arg, const char *key, void *value)
{
    sibling_ctx_t *c = arg;
    if (c->n < PDL_TOPO_MAX_TP && strncmp(key, c->prefix, c->len) == 0)
        c->found[c->n++] = value;
}

/* Evict the gone peers and every other cached rank of their remote instance. */
static void evict_gone(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_xfer_t *x, pdl_peer_t **gone, int ngone)
{
    const char *what = x->dir == PDL_DIR_READ ? "read" : "write";
    for (int g = 0; g < ngone; g++)
        pdl_warn("rank %d: evicting peer %s after a failed %s", r->rank, gone[g]->key, what);
    if (ngone == 0)
        return;
    char prefix[PDL_WIRE_ID_MAX + 32];
    sibling_ctx_t c = {.prefix = prefix};
    c.len = (size_t)snprintf(prefix, sizeof(prefix), "%s|%d|", x->peer->engine_id, x->peer->dp);
    pdl__strmap_foreach(&side->peers, collect_sibling, &c); /* the gone peers are among them */
    for (int i = 0; i < c.n; i++)
        pdl__peer_evict(r, &side->peers, c.found[i]);
}

/* One attempt at a transfer: its remote ranks with their peers, what it posted and which peers failed. */
typedef struct xfer_try {
    pdl_rank_t *r;
    pdl_xfer_side_t *side;
    const pdl_xfer_t *x;
    const char *remote_role; /* "producer" or "consumer", for messages */
    int rranks[PDL_TOPO_MAX_TP], nr;
    pdl_peer_t *peers[PDL_TOPO_MAX_TP];
    bool fresh[PDL_TOPO_MAX_TP]; /* handshaked by this attempt (not from the cache) */
    posted_t *posted;
    size_t nposted;
    pdl_peer_t *gone[PDL_TOPO_MAX_TP];
    int ngone;
    bool post_broken; /* a post failed because its session was broken before it */
    uint64_t *bytes, *descs;
    pdl_xfer_times_t *times;
} xfer_try_t;

/* The remote ranks of the pieces in first-seen order, and a peer for each (cached, or a handshake).
 * Every remote rank answering its handshake as the instance named (or one answering but incompatible,
 * PDL_ERR_MISMATCH) sets *verified. */
static pdl_status_t try_peers(xfer_try_t *t, bool *verified, pdl_error_t *err)
{
    const pdl_xfer_t *x = t->x;
    uint64_t tp0 = pdl__clock_now_ns();
    /* Pieces of one remote rank are adjacent in head order, but nothing here relies on it. */
    for (int i = 0; i < x->npieces; i++) {
        bool seen = false;
        for (int k = 0; k < t->nr; k++)
            seen |= t->rranks[k] == x->pieces[i].remote_rank;
        if (!seen)
            t->rranks[t->nr++] = x->pieces[i].remote_rank;
    }
    for (int k = 0; k < t->nr; k++) {
        pdl_status_t st = pdl__peer_get(t->r, t->side, x->peer, t->rranks[k], &t->peers[k], &t->fresh[k], err);
        if (st != PDL_OK) {
            /* An incompatible peer answered its handshake all the same: it is a MoRIIO peer at that
             * address, and its hold is freed by the failed release. */
            if (st == PDL_ERR_MISMATCH)
                *verified = true;
            return st;
        }
    }
    /* Every remote rank answered its handshake as the instance the transfer names: its endpoints are
     * verified from now on (the lane's key is that instance unless the lane is shared by hash). */
    *verified = true;
    char key[sizeof(t->side->key)];
    snprintf(key, sizeof(key), "%s|%d", x->peer->engine_id, x->peer->dp);
    if (strcmp(key, t->side->key) == 0)
        atomic_store(&t->side->verified, true);
    t->times->peers += pdl__clock_now_ns() - tp0;
    return PDL_OK;
}

/* Post layers [l0, l1) of remote rank k's pieces, whole layers per batch up to XFER_BATCH_BYTES (see the
 * top of the file), the last batch ending at l1. dv is the caller's scratch list. A post failing as gone
 * marks the peer gone. */
static pdl_status_t try_post_rank(xfer_try_t *t, int k, int l0, int l1, pdl_descv_t *dv, pdl_error_t *err)
{
    const pdl_xfer_t *x = t->x;
    pdl_rank_t *r = t->r;
    pdl_peer_t *peer = t->peers[k];
    pdl_op_t op = x->dir == PDL_DIR_READ ? PDL_OP_READ : PDL_OP_WRITE;
    pdl_plan_piece_t pieces[PDL_TOPO_MAX_TP];
    int np = 0;
    for (int i = 0; i < x->npieces; i++)
        if (x->pieces[i].remote_rank == t->rranks[k])
            pieces[np++] = x->pieces[i].piece;
    pdl_descv_reset(dv);
    int first_layer = l0;
    uint64_t nbytes = 0;
    for (int l = l0; l < l1; l++) {
        size_t n0 = dv->n;
        uint64_t tb = pdl__clock_now_ns();
        pdl_status_t st = pdl_layout_build_descs(&r->mem.geo, &peer->geo, x->dir, pieces, np, x->local_blocks,
                                                 x->remote_blocks, x->n, pdl__layer_off(&r->mem, l),
                                                 peer->remote_layered ? 0 : (uint64_t)l * peer->layer_len, dv, err);
        t->times->build += pdl__clock_now_ns() - tb;
        if (st != PDL_OK)
            return pdl_error_prefix(err, st, "layer %d, %s rank %d", l, t->remote_role, t->rranks[k]);
        /* A layer with a session of its own (per-layer registrations) is a batch of its own, under its
         * own grant name when the remote registered it alone (pdl__grant_name). */
        for (size_t i = n0; i < dv->n; i++)
            nbytes += dv->v[i].len;
        if (l + 1 < l1 && nbytes < XFER_BATCH_BYTES && peer->nsessions == 1)
            continue;
        pdl_batch_t *b = NULL;
        char grant[PDL_GRANT_NAME_MAX + 1];
        const char *gname = x->grant;
        if (x->grant != NULL && x->grant[0] != '\0' && peer->remote_layered) {
            pdl__grant_name(grant, sizeof(grant), x->grant, true, l);
            gname = grant;
        }
        uint64_t tpost = pdl__clock_now_ns();
        st = pdl_session_post_granted(pdl__peer_session(peer, l), op, gname, dv->v, dv->n, &b, err);
        t->times->post += pdl__clock_now_ns() - tpost;
        if (st != PDL_OK) {
            bool broken = peer_broken(peer);
            if (is_gone(st) || broken)
                add_gone(t->gone, &t->ngone, peer);
            t->post_broken |= broken;
            return pdl_error_prefix(err, st, "layers %d-%d, %s rank %d: post", first_layer, l, t->remote_role,
                                    t->rranks[k]);
        }
        t->posted[t->nposted++] = (posted_t){.batch = b, .peer = peer, .remote_rank = t->rranks[k]};
        *t->descs += dv->n;
        *t->bytes += nbytes;
        pdl_descv_reset(dv);
        nbytes = 0;
        first_layer = l + 1;
    }
    return PDL_OK;
}

/* Wait for every posted batch within transfer_timeout from t0 -- also after a failure (st), because a
 * posted batch still uses our blocks -- and free it. Returns st, or the first wait's failure. */
static pdl_status_t try_wait(xfer_try_t *t, uint64_t t0, pdl_status_t st, pdl_error_t *err)
{
    uint64_t tw = pdl__clock_now_ns();
    double timeout_s = t->r->inst->cfg.conn.transfer_timeout_s;
    uint64_t deadline = t0 + (uint64_t)(timeout_s * 1e9);
    for (size_t i = 0; i < t->nposted; i++) {
        uint64_t now = pdl__clock_now_ns();
        int left_ms = now >= deadline ? 0 : (int)((deadline - now) / 1000000);
        pdl_error_t e;
        pdl_status_t bst = pdl_batch_wait(t->posted[i].batch, left_ms, &e);
        if (bst != PDL_OK && st == PDL_OK) {
            st = bst;
            if (bst == PDL_INPROGRESS) {
                st = PDL_ERR_TIMEOUT; /* the wait was bounded by transfer_timeout: the transfer failed */
                pdl_error_set(err, PDL_ERR_TIMEOUT, "%s rank %d: %s not finished within transfer_timeout %.1f s (%s)",
                              t->remote_role, t->posted[i].remote_rank, t->x->dir == PDL_DIR_READ ? "read" : "write",
                              timeout_s, e.msg);
            } else if (err) {
                *err = e;
            }
        }
        if (is_gone(bst))
            add_gone(t->gone, &t->ngone, t->posted[i].peer);
        pdl_batch_free(t->posted[i].batch);
    }
    t->times->wait += pdl__clock_now_ns() - tw;
    return st;
}

static pdl_status_t xfer_once(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_xfer_t *x, uint64_t *bytes,
                              uint64_t *descs, pdl_xfer_times_t *times, bool *stale, bool *verified, pdl_error_t *err)
{
    xfer_try_t t = {.r = r, .side = side, .x = x, .bytes = bytes, .descs = descs, .times = times,
                    .remote_role = x->dir == PDL_DIR_READ ? "producer" : "consumer"};
    pdl_status_t st = try_peers(&t, verified, err);
    if (st != PDL_OK)
        return st;
    int L = r->inst->cfg.model.num_layers;
    t.posted = calloc((size_t)L * (size_t)(t.nr > 0 ? t.nr : 1), sizeof(*t.posted));
    if (t.posted == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "%s: out of memory", x->dir == PDL_DIR_READ ? "read" : "write");
    pdl_descv_t dv = {0};
    uint64_t t0 = pdl__clock_now_ns(), gated_ns = 0;
    /* One round per gate opening (a single round without a gate), each over every remote rank, so all
     * consumer ranks get the early layers early. A batch holds at least one layer: `posted` fits them. */
    for (int done = 0; done < L && st == PDL_OK;) {
        int ready = L;
        if (x->gate != NULL) {
            uint64_t tg = pdl__clock_now_ns();
            st = x->gate(x->gate_arg, done, &ready, err);
            gated_ns += pdl__clock_now_ns() - tg;
            if (st == PDL_OK && ready <= done)
                st = pdl_error_set(err, PDL_ERR_BAD_STATE, "%s: the layer gate let %d layers through after %d",
                                   x->dir == PDL_DIR_READ ? "read" : "write", ready, done);
            ready = ready < L ? ready : L;
        }
        for (int k = 0; k < t.nr && st == PDL_OK; k++)
            st = try_post_rank(&t, k, done, ready, &dv, err);
        done = ready;
    }
    pdl_descv_free(&dv);
    st = try_wait(&t, t0, st, err);
    free(t.posted);
    /* Whatever broke a session -- a lost connection, a batch freed while it ran -- it cannot move KV any
     * more: evicted like a gone peer, so the next transfer handshakes afresh. */
    for (int k = 0; k < t.nr; k++)
        if (t.peers[k] != NULL && peer_broken(t.peers[k]))
            add_gone(t.gone, &t.ngone, t.peers[k]);
    /* Worth one more attempt only when the failure was the cached session's, not this attempt's own
     * (a timeout that broke it is the transfer's failure). */
    bool cached_failed = is_gone(st) || t.post_broken;
    for (int g = 0; g < t.ngone && cached_failed; g++)
        for (int k = 0; k < t.nr; k++)
            if (t.gone[g] == t.peers[k] && !t.fresh[k])
                *stale = true;
    evict_gone(r, side, x, t.gone, t.ngone);
    /* Waiting for a forward to finish a layer is not time spent writing. */
    uint64_t wall = pdl__clock_now_ns() - t0 - gated_ns;
    if (x->dir == PDL_DIR_READ)
        PDL_CTR_ADD(r, read_ns, wall);
    else
        PDL_CTR_ADD(r, write_ns, wall);
    return st;
}

pdl_status_t pdl__xfer_run(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_xfer_t *x, uint64_t *bytes,
                           uint64_t *descs, pdl_xfer_times_t *times, bool *verified, pdl_error_t *err)
{
    /* Bytes and descriptors of the attempt that counts (a retried one posted them again). */
    uint64_t b = 0, d = 0;
    bool stale = false, ok_peers = false;
    pdl_status_t st = xfer_once(r, side, x, &b, &d, times, &stale, &ok_peers, err);
    if (st != PDL_OK && stale) {
        pdl_info("rank %d: %s with %s failed on a cached session (%s); retrying once after a fresh handshake",
                 r->rank, x->dir == PDL_DIR_READ ? "read" : "write", x->peer->engine_id, err ? err->msg : "gone");
        PDL_CTR_ADD(r, stale_retries, 1);
        b = d = 0;
        stale = false;
        st = xfer_once(r, side, x, &b, &d, times, &stale, &ok_peers, err);
    }
    *bytes += b;
    *descs += d;
    if (verified != NULL)
        *verified = ok_peers;
    return st;
}

/* ---- lanes ------------------------------------------------------------------------------------ */

/* The slice a lane's thread asks for (see the top of the file); the kernel accepts 0.1-100 ms. */
#define XFER_LANE_SLICE_NS (20ull * 1000 * 1000)

/* The first fields of the kernel's struct sched_attr (SCHED_ATTR_SIZE_VER0); glibc has no wrapper and
 * <linux/sched/types.h> clashes with <sched.h>. */
typedef struct lane_sched_attr {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
} lane_sched_attr_t;

/* Ask for a long slice for the calling thread, keeping its policy and nice value. Best effort. */
static void lane_long_slice(pdl_xfer_side_t *side)
{
    side->slice_asked = true;
#if defined(SYS_sched_getattr) && defined(SYS_sched_setattr)
    lane_sched_attr_t a;
    memset(&a, 0, sizeof(a));
    if (syscall(SYS_sched_getattr, 0, &a, (unsigned)sizeof(a), 0) != 0 || a.policy != 0 /* SCHED_OTHER */)
        return;
    a.size = sizeof(a);
    a.runtime = XFER_LANE_SLICE_NS;
    if (syscall(SYS_sched_setattr, 0, &a, 0) != 0)
        pdl_debug("rank %d lane %s: no long scheduler slice (%s); releases may wait behind copies", side->rank->rank,
                  side->key, strerror(errno));
#endif
}

static void lane_run(void *arg, pdl_workq_item_t *item, bool stopping)
{
    pdl_xfer_side_t *side = arg;
    if (!side->slice_asked)
        lane_long_slice(side);
    if (item == &side->sweep) {
        atomic_store(&side->sweep_queued, false);
        if (!stopping)
            pdl__dealers_sweep(&side->dealers, pdl__clock_now_ns(), (uint64_t)PDL_DEALER_IDLE_MS * 1000000ull);
        return;
    }
    side->run(side, item, stopping);
}

/* The lane's sockets are its own: closed by its thread (linger: notifications just sent still leave). */
static void lane_exit(void *arg)
{
    pdl_xfer_side_t *side = arg;
    pdl__dealers_close(&side->dealers);
}

void pdl__xfer_lanes_init(pdl_xfer_lanes_t *l, pdl_xfer_run_fn run, const char *what)
{
    memset(l, 0, sizeof(*l));
    pthread_mutex_init(&l->mu, NULL);
    l->run = run;
    l->what = what;
}

pdl_xfer_side_t *pdl__xfer_lane(pdl_rank_t *r, pdl_xfer_lanes_t *l, const pdl_peer_addr_t *addr, pdl_error_t *err)
{
    char key[sizeof(((pdl_xfer_side_t *)0)->key)];
    snprintf(key, sizeof(key), "%s|%d", addr->engine_id, addr->dp);
    pthread_mutex_lock(&l->mu);
    pdl_xfer_side_t *side = l->stopped ? NULL : pdl__strmap_get(&l->map, key);
    if (side != NULL || l->stopped) {
        pthread_mutex_unlock(&l->mu);
        if (side == NULL)
            pdl_error_set(err, PDL_ERR_BAD_STATE, "rank %d: instance is shutting down", r->rank);
        return side;
    }
    if (l->n == PDL_XFER_MAX_LANES) {
        /* More remote instances than lanes: share one by hash (rare; isolation degrades gracefully). */
        uint64_t h = 1469598103934665603ull;
        for (const char *c = key; *c; c++)
            h = (h ^ (uint8_t)*c) * 1099511628211ull;
        side = l->all[h % PDL_XFER_MAX_LANES];
        pthread_mutex_unlock(&l->mu);
        return side;
    }
    side = calloc(1, sizeof(*side));
    if (side == NULL) {
        pthread_mutex_unlock(&l->mu);
        pdl_error_set(err, PDL_ERR_NOMEM, "rank %d: out of memory for a %s lane", r->rank, l->what);
        return NULL;
    }
    side->rank = r;
    side->run = l->run;
    snprintf(side->key, sizeof(side->key), "%s", key);
    const pdl_connector_config_t *c = &r->inst->cfg.conn;
    pdl__health_init(&side->health, (uint64_t)(c->peer_backoff_s * 1e9), (uint64_t)(c->peer_backoff_max_s * 1e9), 1024);
    char who[PDL_WIRE_ID_MAX + 64];
    snprintf(who, sizeof(who), "rank %d %s for %s", r->rank, l->what, key);
    pdl_status_t st = pdl__workq_start(&side->q, 1, lane_run, lane_exit, side, who, err);
    if (st == PDL_OK && pdl__strmap_put(&l->map, key, side) != 0) {
        pdl__workq_stop(&side->q);
        st = pdl_error_set(err, PDL_ERR_NOMEM, "rank %d: out of memory for a %s lane", r->rank, l->what);
    }
    if (st != PDL_OK) {
        pthread_mutex_unlock(&l->mu);
        pdl__health_fini(&side->health);
        free(side);
        return NULL;
    }
    side->started = true;
    l->all[l->n++] = side;
    pthread_mutex_unlock(&l->mu);
    pdl_debug("rank %d: %s lane for %s started", r->rank, l->what, key);
    return side;
}

void pdl__xfer_lanes_sweep(pdl_xfer_lanes_t *l)
{
    pthread_mutex_lock(&l->mu);
    for (int i = 0; !l->stopped && i < l->n; i++)
        if (!atomic_exchange(&l->all[i]->sweep_queued, true))
            pdl__workq_push(&l->all[i]->q, &l->all[i]->sweep);
    pthread_mutex_unlock(&l->mu);
}

void pdl__xfer_lanes_stop(pdl_rank_t *r, pdl_xfer_lanes_t *l)
{
    /* Take the lanes out under the lock: the service thread may still sweep until it stops. */
    pdl_xfer_side_t *all[PDL_XFER_MAX_LANES];
    pthread_mutex_lock(&l->mu);
    l->stopped = true;
    int n = l->n;
    memcpy(all, l->all, sizeof(all[0]) * (size_t)n);
    l->n = 0;
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < n; i++) {
        pdl_xfer_side_t *side = all[i];
        if (side->started)
            pdl__workq_stop(&side->q);
        pdl__peers_free(r, &side->peers);
        pdl__dealers_close(&side->dealers); /* normally closed by the thread at exit; idempotent */
        pdl__health_fini(&side->health);
        for (int k = 0; k < side->nplans; k++)
            free(side->plans[k]);
        free(side);
    }
    pdl__strmap_free(&l->map); /* only pdl__xfer_lane uses it, and it sees `stopped` */
}

void pdl__xfer_lanes_fini(pdl_xfer_lanes_t *l) { pthread_mutex_destroy(&l->mu); }
