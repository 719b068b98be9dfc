/*
 * prewarm.c -- sessions before the first request: a background thread per instance that
 * handshakes with remote ranks, opens their engine sessions and faults in their mappings ahead of
 * need, then hands each peer to the lane (xfer.c) whose first transfer asks for it (peer.c). A
 * READ-mode decode connects the producers it reads from; a WRITE-mode prefill the decodes it writes to.
 *
 * Why: without it the first pull from a producer pays the handshake (queued behind the other ranks'
 * handshakes), the remote engine's set-up and the session open with a MAP_POPULATE of the producer's
 * whole region, which makes pull p99 several times p50 (docs/benchmarks.md#sessions-and-pulls-connectormd);
 * a WRITE prefill pays the same on its first push to each decode.
 *
 * Targets are (local rank, remote rank) pairs, each with the peer cache key of that remote rank
 * ("engine_id|dp|rank"), grouped by remote instance. They come from prewarm_peers at start-up (retried
 * with peer_backoff, doubling up to peer_backoff_max, until reachable: start-up never waits; the lanes'
 * peer health, peerhealth.h, keeps the backoff) and from lanes: a lane's cache miss for a remote
 * instance not known yet queues every pair this instance will use with it (the read plan of each
 * local rank, or its write plan), as upstream MoRIIO's eager handshake connects every remote rank
 * before the forward; a lane that evicted a peer as gone queues it again, so a restarted peer is
 * connected anew. A pair is connected by whoever moves it out of PENDING under mu (the thread, or a
 * lane that needs it first), never twice: two peers of one pair would share, and on free remove, one
 * remote engine. States: PENDING (to connect at next_ns) -> CONNECTING (the thread is on it; a lane
 * that needs it waits rather than handshaking twice) -> WARM (a peer waits in `peer`) -> TAKEN (a lane
 * owns the peer, or connects it itself); FAILED: an incompatible peer, not retried; FREE: an evicted
 * slot, reused.
 *
 * The table is bounded (PREWARM_MAX_TARGETS) and a request can name any address, so learnt instances
 * are evicted by prewarm_policy.c's rule (failed for a while, or the least useful when a new one does
 * not fit; never a configured one or one in use). An evicted target's slot is marked FREE, never moved,
 * so an index stays valid across the unlocked connect.
 *
 * One thread per instance, one target at a time: handshakes run in the background, where their
 * latency does not matter, and a 2-core machine gains nothing from running them in parallel.
 * Lock order: mu is a leaf except for the counters' mutex (PDL_CTR_ADD).
 */
#include <stdlib.h>
#include <string.h>

#include "connector/internal.h"
#include "common/clock.h"

/* Remote instances x local ranks x remote ranks per rank; requests cannot grow it past this. */
#define PREWARM_MAX_TARGETS 4096

enum { T_FREE, T_PENDING, T_CONNECTING, T_WARM, T_TAKEN, T_FAILED };

typedef struct target {
    pdl_peer_addr_t addr;
    int rank, rrank; /* local rank, remote rank */
    int remote;      /* index in remotes[] */
    char key[PDL_WIRE_ID_MAX + 64];
    int state;
    pdl_peer_t *peer; /* WARM: waiting for its lane */
    uint64_t next_ns; /* PENDING: not before (the backoff of `health`) */
    bool lane;        /* a lane holds this pair's peer, or is connecting it itself: never evicted */
    uint64_t failed_ns;               /* failing since (ours or the lane's attempts); 0: the last one did not */
    pdl_status_t last_st;             /* the last attempt's outcome, for a lane that waited for it */
    char last_msg[PDL_ERR_MSG_LEN];
} target_t;

/* A remote instance with targets in the table. */
typedef struct remote {
    char engine_id[PDL_WIRE_ID_MAX + 1];
    int dp;
    bool configured; /* from prewarm_peers: retried until reachable, never evicted; a learnt one is tried once */
    uint64_t learnt_ns;
} remote_t;

struct pdl_prewarm {
    pdl_instance_t *inst;
    pdl_role_t remote_role; /* producers (READ decode) or consumers (WRITE prefill) */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* work or stop for the thread; a connect finished for waiting lanes */
    pthread_t thread;
    bool stop;
    target_t *v;
    size_t n, cap, live; /* slots used (some FREE), allocated, not FREE */
    remote_t *remotes;
    size_t nremotes, remotes_cap;
    uint64_t ttl_ns; /* a learnt instance that failed this long ago is forgotten */
    pdl_peerhealth_t health; /* "rank|key" -> backoff of an unreachable pair, as the lanes keep it */
};

static target_t *find(pdl_prewarm_t *pw, int rank, const char *key)
{
    for (size_t i = 0; i < pw->n; i++)
        if (pw->v[i].state != T_FREE && pw->v[i].rank == rank && strcmp(pw->v[i].key, key) == 0)
            return &pw->v[i];
    return NULL;
}

static long find_remote(const pdl_prewarm_t *pw, const pdl_peer_addr_t *addr)
{
    for (size_t i = 0; i < pw->nremotes; i++)
        if (pw->remotes[i].dp == addr->dp && strcmp(pw->remotes[i].engine_id, addr->engine_id) == 0)
            return (long)i;
    return -1;
}

/* Drop remote instance j and its targets (none in use: see prewarm_policy.c), counted per local rank;
 * the last remote takes its index (under mu). */
static void evict_remote(pdl_prewarm_t *pw, size_t j)
{
    size_t last = pw->nremotes - 1;
    size_t dropped = 0;
    for (size_t i = 0; i < pw->n; i++) {
        target_t *t = &pw->v[i];
        if (t->state == T_FREE)
            continue;
        if (t->remote == (int)j) {
            PDL_CTR_ADD(&pw->inst->ranks[t->rank], prewarm_evictions, 1);
            t->state = T_FREE;
            pw->live--;
            dropped++;
        } else if (t->remote == (int)last) {
            t->remote = (int)j;
        }
    }
    pdl_debug("prewarm: forgot %s (DP %d): %zu rank pairs, learnt from a request and failed or unused",
              pw->remotes[j].engine_id, pw->remotes[j].dp, dropped);
    pw->remotes[j] = pw->remotes[last];
    pw->nremotes--;
}

/* Evict by prewarm_policy.c until `need` more targets fit (need 0: only the expired ones); false when
 * they do not fit even so (under mu). */
static bool make_room(pdl_prewarm_t *pw, size_t need)
{
    if (pw->nremotes == 0)
        return pw->live + need <= PREWARM_MAX_TARGETS;
    pdl_prewarm_cand_t *c = calloc(pw->nremotes, sizeof(*c));
    if (c == NULL)
        return pw->live + need <= PREWARM_MAX_TARGETS;
    for (;;) {
        for (size_t j = 0; j < pw->nremotes; j++)
            c[j] = (pdl_prewarm_cand_t){.configured = pw->remotes[j].configured,
                                        .learnt_ns = pw->remotes[j].learnt_ns,
                                        .failed_ns = UINT64_MAX};
        for (size_t i = 0; i < pw->n; i++) {
            const target_t *t = &pw->v[i];
            if (t->state == T_FREE)
                continue;
            pdl_prewarm_cand_t *x = &c[t->remote];
            x->in_use |= t->lane || t->state == T_CONNECTING || t->state == T_WARM;
            /* "all failed": the latest failure among its pairs; one that did not fail clears it */
            if (t->failed_ns == 0 || x->failed_ns == 0)
                x->failed_ns = 0;
            else if (x->failed_ns == UINT64_MAX || t->failed_ns > x->failed_ns)
                x->failed_ns = t->failed_ns;
        }
        for (size_t j = 0; j < pw->nremotes; j++)
            if (c[j].failed_ns == UINT64_MAX)
                c[j].failed_ns = 0;
        bool full = pw->live + need > PREWARM_MAX_TARGETS;
        long v = pdl__prewarm_pick_victim(c, pw->nremotes, pdl__clock_now_ns(), pw->ttl_ns, full);
        if (v < 0)
            break;
        evict_remote(pw, (size_t)v);
    }
    free(c);
    return pw->live + need <= PREWARM_MAX_TARGETS;
}

/* A slot for a new target (a FREE one first); NULL when out of memory (under mu). */
static target_t *new_slot(pdl_prewarm_t *pw)
{
    for (size_t i = 0; i < pw->n; i++)
        if (pw->v[i].state == T_FREE)
            return &pw->v[i];
    if (pw->n == pw->cap) {
        size_t cap = pw->cap ? pw->cap * 2 : 32;
        target_t *v = realloc(pw->v, cap * sizeof(*v));
        if (v == NULL)
            return NULL;
        pw->v = v;
        pw->cap = cap;
    }
    return &pw->v[pw->n++];
}

/* The remote ranks local rank k uses with instance addr (its read plan's producers, or its write
 * plan's consumers), into rr[]; their count, or -1 with e set when the topologies do not fit. */
static int remote_ranks(const pdl_prewarm_t *pw, const pdl_peer_addr_t *addr, int k, int *rr, pdl_error_t *e)
{
    const pdl_instance_t *inst = pw->inst;
    const pdl_model_geometry_t *g = &inst->cfg.model;
    int n = 0;
    if (pw->remote_role == PDL_ROLE_PRODUCER) {
        pdl_read_plan_t *plan = malloc(sizeof(*plan));
        if (plan == NULL || pdl_topo_read_plan(addr->tp, inst->tp, g->total_kv_heads, g->is_mla, k, plan, e) != PDL_OK)
            n = -1;
        for (int i = 0; n >= 0 && i < plan->num_pieces; i++)
            rr[n++] = plan->pieces[i].producer_rank;
        free(plan);
    } else {
        pdl_write_plan_t *plan = malloc(sizeof(*plan));
        if (plan == NULL || pdl_topo_write_plan(inst->tp, addr->tp, g->total_kv_heads, g->is_mla, k, plan, e) != PDL_OK)
            n = -1;
        for (int i = 0; n >= 0 && i < plan->num_targets; i++)
            rr[n++] = plan->targets[i].consumer_rank;
        free(plan);
    }
    if (n < 0 && e->msg[0] == '\0')
        pdl_error_set(e, PDL_ERR_NOMEM, "out of memory");
    return n;
}

/* Every (local rank, remote rank) pair this instance uses with remote instance addr, all or none
 * (under mu). A learnt one may evict others to fit (prewarm_policy.c). */
static void add_instance(pdl_prewarm_t *pw, const pdl_peer_addr_t *addr, bool configured)
{
    const pdl_instance_t *inst = pw->inst;
    const char *what = pw->remote_role == PDL_ROLE_PRODUCER ? "producer" : "consumer";
    int *rr = malloc(sizeof(int) * PDL_TOPO_MAX_TP * (size_t)inst->tp);
    int *cnt = calloc((size_t)inst->tp, sizeof(int));
    size_t need = 0;
    pdl_error_t e;
    pdl_error_clear(&e);
    if (rr == NULL || cnt == NULL) {
        pdl_warn("prewarm: %s %s: out of memory; left to its first request", what, addr->engine_id);
        goto out;
    }
    PDL_FOR_LOCAL(inst, k) {
        cnt[k] = remote_ranks(pw, addr, k, rr + (size_t)k * PDL_TOPO_MAX_TP, &e);
        if (cnt[k] < 0) {
            pdl_warn("prewarm: %s %s (TP %d) does not fit this TP %d instance: %s", what, addr->engine_id, addr->tp,
                     inst->tp, e.msg);
            goto out;
        }
        need += (size_t)cnt[k];
    }
    if (!make_room(pw, need)) {
        pdl_warn("prewarm: more than %d peers known and none to forget; %s is left to its first request",
                 PREWARM_MAX_TARGETS, addr->engine_id);
        goto out;
    }
    if (pw->nremotes == pw->remotes_cap) {
        size_t cap = pw->remotes_cap ? pw->remotes_cap * 2 : 8;
        remote_t *v = realloc(pw->remotes, cap * sizeof(*v));
        if (v == NULL)
            goto out;
        pw->remotes = v;
        pw->remotes_cap = cap;
    }
    remote_t *rm = &pw->remotes[pw->nremotes];
    memset(rm, 0, sizeof(*rm));
    snprintf(rm->engine_id, sizeof(rm->engine_id), "%s", addr->engine_id);
    rm->dp = addr->dp;
    rm->configured = configured;
    rm->learnt_ns = pdl__clock_now_ns();
    PDL_FOR_LOCAL(inst, k) {
        for (int i = 0; i < cnt[k]; i++) {
            int rrank = rr[(size_t)k * PDL_TOPO_MAX_TP + (size_t)i];
            char key[PDL_WIRE_ID_MAX + 64];
            pdl__peer_key(addr, rrank, key, sizeof(key));
            if (find(pw, k, key) != NULL)
                continue;
            target_t *t = new_slot(pw);
            if (t == NULL) {
                pdl_warn("prewarm: out of memory; some pairs of %s are left to their first request", addr->engine_id);
                break;
            }
            memset(t, 0, sizeof(*t));
            t->addr = *addr;
            t->rank = k;
            t->rrank = rrank;
            t->remote = (int)pw->nremotes;
            snprintf(t->key, sizeof(t->key), "%s", key);
            t->state = T_PENDING;
            t->last_st = PDL_OK;
            pw->live++;
        }
    }
    pw->nremotes++;
out:
    free(rr);
    free(cnt);
}

/* The next PENDING target due now (its index), or -1 with *wake_ns the earliest due time (0: none). */
static long next_due(const pdl_prewarm_t *pw, uint64_t now, uint64_t *wake_ns)
{
    *wake_ns = 0;
    for (size_t i = 0; i < pw->n; i++) {
        const target_t *t = &pw->v[i];
        if (t->state != T_PENDING)
            continue;
        if (t->next_ns <= now)
            return (long)i;
        if (*wake_ns == 0 || t->next_ns < *wake_ns)
            *wake_ns = t->next_ns;
    }
    return -1;
}

/* Connect target i (CONNECTING, mu not held) and record the outcome (mu held on return). */
static void connect_one(pdl_prewarm_t *pw, size_t i)
{
    target_t snap = pw->v[i];
    pthread_mutex_unlock(&pw->mu);
    pdl_rank_t *r = &pw->inst->ranks[snap.rank];
    pdl_peer_t *p = NULL;
    pdl_error_t err;
    pdl_error_clear(&err);
    uint64_t t0 = pdl__clock_now_ns();
    pdl_status_t st = pdl__peer_connect(r, &snap.addr, snap.rrank, &p, &err);
    uint64_t t1 = pdl__clock_now_ns();
    if (st == PDL_OK) {
        for (int s = 0; s < p->nsessions; s++) {
            pdl_error_t e2;
            if (pdl_session_prefault(p->sessions[s], &e2) != PDL_OK) {
                pdl_warn("rank %d: prewarm of %s: session %d of %d: %s (pages fault in on first use instead)",
                         snap.rank, snap.key, s, p->nsessions, e2.msg);
                break;
            }
        }
        PDL_CTR_ADD(r, prewarm_handshakes, 1);
        pdl_debug("rank %d: prewarmed %s: handshake + session %.3f ms, prefault %.3f ms", snap.rank, snap.key,
                  (t1 - t0) / 1e6, (pdl__clock_now_ns() - t1) / 1e6);
    }
    char hkey[sizeof(snap.key) + 16];
    snprintf(hkey, sizeof(hkey), "%d|%s", snap.rank, snap.key);
    pthread_mutex_lock(&pw->mu);
    target_t *t = &pw->v[i]; /* the vector may have moved meanwhile; indices do not */
    t->last_st = st;
    snprintf(t->last_msg, sizeof(t->last_msg), "%s", st == PDL_OK ? "" : err.msg);
    t->failed_ns = st == PDL_OK ? 0 : t->failed_ns ? t->failed_ns : pdl__clock_now_ns();
    if (st == PDL_OK) {
        t->state = T_WARM;
        t->peer = p;
        pdl__health_ok(&pw->health, hkey);
    } else if (!pw->remotes[t->remote].configured) {
        /* Learnt from a request: the lanes' own peer health takes it from here (a bogus address in a
         * request must not keep this thread dialling it). */
        t->state = T_TAKEN;
    } else if (pdl__peer_unreachable(st)) {
        uint64_t now = pdl__clock_now_ns(), retry_at = 0;
        int failures = 0;
        pdl__health_failed(&pw->health, hkey, now, st, err.msg);
        pdl__health_state(&pw->health, hkey, &failures, &retry_at);
        t->state = T_PENDING;
        t->next_ns = retry_at > now ? retry_at : now + pw->health.initial_ns;
        if (failures <= 1)
            pdl_info("rank %d: prewarm: %s (retried in the background)", snap.rank, err.msg);
    } else {
        t->state = T_FAILED;
        pdl_warn("rank %d: prewarm: %s; not retried (a request will try again)", snap.rank, err.msg);
    }
    pthread_cond_broadcast(&pw->cv);
}

static void *prewarm_main(void *arg)
{
    pdl_prewarm_t *pw = arg;
    pthread_mutex_lock(&pw->mu);
    while (!pw->stop) {
        uint64_t wake = 0;
        long i = next_due(pw, pdl__clock_now_ns(), &wake);
        if (i >= 0) {
            pw->v[i].state = T_CONNECTING;
            connect_one(pw, (size_t)i);
        } else if (wake == 0) {
            pthread_cond_wait(&pw->cv, &pw->mu);
        } else {
            pdl__clock_cond_wait(&pw->cv, &pw->mu, wake);
        }
    }
    pthread_mutex_unlock(&pw->mu);
    return NULL;
}

pdl_status_t pdl__prewarm_start(pdl_instance_t *inst, pdl_error_t *err)
{
    const pdl_connector_config_t *c = &inst->cfg.conn;
    inst->prewarm = NULL;
    /* Who moves the KV connects: a READ decode pulls from producers, a WRITE prefill pushes to decodes. */
    bool read_decode = c->role == PDL_ROLE_CONSUMER && c->read_mode;
    bool write_prefill = c->role == PDL_ROLE_PRODUCER && !c->read_mode;
    if (!read_decode && !write_prefill) {
        if (c->num_prewarm_peers > 0)
            pdl_warn("kv_connector_extra_config.prewarm_peers: only the side that moves the KV connects ahead (a "
                     "READ-mode decode, a WRITE-mode prefill); ignored");
        return PDL_OK;
    }
    pdl_prewarm_t *pw = calloc(1, sizeof(*pw));
    if (pw == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "prewarm: out of memory");
    pw->inst = inst;
    pw->remote_role = read_decode ? PDL_ROLE_PRODUCER : PDL_ROLE_CONSUMER;
    /* Twice the longest backoff: a lane's peer health has retried a failed peer at least once by then. */
    pw->ttl_ns = (uint64_t)(2 * c->peer_backoff_max_s * 1e9);
    pthread_mutex_init(&pw->mu, NULL);
    pdl__health_init(&pw->health, (uint64_t)(c->peer_backoff_s * 1e9), (uint64_t)(c->peer_backoff_max_s * 1e9),
                     PREWARM_MAX_TARGETS);
    pdl__clock_cond_init(&pw->cv);
    for (int i = 0; i < c->num_prewarm_peers; i++) {
        const pdl_prewarm_peer_t *pp = &c->prewarm_peers[i];
        pdl_peer_addr_t a;
        memset(&a, 0, sizeof(a));
        snprintf(a.host, sizeof(a.host), "%s", pp->host);
        a.hs_base = pp->handshake_port;
        a.tp = pp->tp > 0 ? pp->tp : inst->tp;
        a.dp = pp->dp;
        a.role = pw->remote_role;
        snprintf(a.engine_id, sizeof(a.engine_id), "%s:%d", a.host, a.hs_base); /* as pull.c and push.c key it */
        if (a.hs_base + pdl_topo_port_offset(a.dp, a.tp, a.tp - 1) > 65535) {
            pdl_warn("prewarm_peers: %s with TP %d, DP rank %d: ports beyond 65535; skipped", a.engine_id, a.tp, a.dp);
            continue;
        }
        if (!pdl__trust_host(&inst->trusted, a.host)) {
            pdl_warn("prewarm_peers: %s is not in trusted_hosts; skipped", a.host);
            continue;
        }
        add_instance(pw, &a, true);
    }
    int rc = pthread_create(&pw->thread, NULL, prewarm_main, pw);
    if (rc != 0) {
        pdl__health_fini(&pw->health);
        pthread_cond_destroy(&pw->cv);
        pthread_mutex_destroy(&pw->mu);
        free(pw->v);
        free(pw->remotes);
        free(pw);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "prewarm: cannot start its thread: %s", strerror(rc));
    }
    if (pw->live > 0)
        pdl_info("prewarm: connecting %zu rank pairs of %zu %s instance(s) in the background", pw->live, pw->nremotes,
                 read_decode ? "producer" : "consumer");
    inst->prewarm = pw;
    return PDL_OK;
}

void pdl__prewarm_stop(pdl_instance_t *inst)
{
    pdl_prewarm_t *pw = inst->prewarm;
    if (pw == NULL)
        return;
    pthread_mutex_lock(&pw->mu);
    pw->stop = true;
    pthread_cond_broadcast(&pw->cv);
    pthread_mutex_unlock(&pw->mu);
    pthread_join(pw->thread, NULL);
    /* Lanes may still ask (they stop after us): they take nothing from now on. */
    pthread_mutex_lock(&pw->mu);
    for (size_t i = 0; i < pw->n; i++) {
        if (pw->v[i].peer != NULL)
            pdl__peer_free(&inst->ranks[pw->v[i].rank], pw->v[i].peer);
        pw->v[i].peer = NULL;
    }
    pthread_mutex_unlock(&pw->mu);
}

void pdl__prewarm_free(pdl_instance_t *inst)
{
    pdl_prewarm_t *pw = inst->prewarm;
    if (pw == NULL)
        return;
    pdl__health_fini(&pw->health);
    pthread_cond_destroy(&pw->cv);
    pthread_mutex_destroy(&pw->mu);
    free(pw->v);
    free(pw->remotes);
    free(pw);
    inst->prewarm = NULL;
}

pdl_peer_t *pdl__prewarm_take(pdl_rank_t *r, const pdl_peer_addr_t *addr, const char *key, pdl_status_t *st_out,
                              pdl_error_t *err)
{
    *st_out = PDL_OK;
    pdl_prewarm_t *pw = r->inst->prewarm;
    if (pw == NULL)
        return NULL;
    pdl_peer_t *p = NULL;
    bool waited = false;
    pthread_mutex_lock(&pw->mu);
    if (pw->stop) {
        pthread_mutex_unlock(&pw->mu);
        return NULL;
    }
    /* A remote instance first seen: queue its other pairs now, before this lane connects its own, so
     * that every pair is connected by exactly one party (whoever moves it out of PENDING under mu). */
    if (addr->role == pw->remote_role && find_remote(pw, addr) < 0) {
        add_instance(pw, addr, false);
        pthread_cond_broadcast(&pw->cv);
    }
    for (;;) {
        target_t *t = find(pw, r->rank, key);
        if (t == NULL)
            break;
        /* Bounded by the thread's handshake_timeout; stop wakes us too. */
        if (t->state == T_CONNECTING && !pw->stop) {
            waited = true;
            pthread_cond_wait(&pw->cv, &pw->mu);
            continue;
        }
        t->lane = true; /* it takes the peer, or connects it itself and says how that went (lane_done) */
        if (t->state == T_WARM) {
            p = t->peer;
            t->peer = NULL;
        } else if (t->last_st != PDL_OK && (waited || !pw->remotes[t->remote].configured)) {
            /* The attempt this lane waited for, or the one made for it when its producer was learnt
             * (moments ago, by the same pull's first rank), failed: that is this lane's handshake
             * failing, not a reason to pay it a second time. A configured pair's failure may be old
             * (the producer was not up yet): the lane tries itself. */
            *st_out = pdl_error_set(err, t->last_st, "%s", t->last_msg);
            t->last_st = PDL_OK;
            t->lane = false;
        }
        t->state = T_TAKEN;
        break;
    }
    pthread_mutex_unlock(&pw->mu);
    return p;
}

void pdl__prewarm_again(pdl_rank_t *r, const char *key)
{
    pdl_prewarm_t *pw = r->inst->prewarm;
    if (pw == NULL)
        return;
    pthread_mutex_lock(&pw->mu);
    target_t *t = find(pw, r->rank, key);
    pdl_peer_t *old = NULL;
    if (t != NULL && (t->state == T_TAKEN || t->state == T_WARM)) {
        /* A pooled peer of a producer that just failed is as stale as the evicted one. */
        old = t->peer;
        t->peer = NULL;
        t->state = T_PENDING;
        t->next_ns = 0;
        t->lane = false;
        pthread_cond_broadcast(&pw->cv);
    }
    pthread_mutex_unlock(&pw->mu);
    if (old != NULL)
        pdl__peer_free(r, old);
}

void pdl__prewarm_lane_done(pdl_rank_t *r, const char *key, pdl_status_t st)
{
    pdl_prewarm_t *pw = r->inst->prewarm;
    if (pw == NULL)
        return;
    pthread_mutex_lock(&pw->mu);
    target_t *t = find(pw, r->rank, key);
    if (t != NULL) {
        t->lane = st == PDL_OK;
        t->failed_ns = st == PDL_OK ? 0 : t->failed_ns ? t->failed_ns : pdl__clock_now_ns();
    }
    pthread_mutex_unlock(&pw->mu);
}

size_t pdl_instance_prewarm_pending(pdl_instance_t *inst)
{
    pdl_prewarm_t *pw = inst ? inst->prewarm : NULL;
    if (pw == NULL)
        return 0;
    size_t n = 0;
    pthread_mutex_lock(&pw->mu);
    for (size_t i = 0; i < pw->n; i++)
        n += pw->v[i].state == T_PENDING || pw->v[i].state == T_CONNECTING;
    pthread_mutex_unlock(&pw->mu);
    return n;
}
