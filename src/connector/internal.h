/*
 * internal.h -- the connector runtime's private structures and the functions its files offer each
 * other (internal). docs/connector.md draws the same picture with the threads and queues.
 *
 * Files and what each one owns; an arrow is "calls into", and there is no arrow back:
 *
 *   instance.c  creates and destroys an instance: starts and stops every part below; accessors
 *     ├─> rank.c      a rank's memory: engine, KV region, geometry, handshake payloads (pdl_rank_mem_t);
 *     │               binds the rank's ROUTERs (service.c) before the engine picks its data port
 *     ├─> service.c   the service thread: handshake/notify ROUTERs, ping, reapers (pdl_rank_svc_t)
 *     │     ├─> push.c, push_recv.c  WRITE messages: remote_blocks / write_done
 *     │     ├─> roles.c              the WRITE reaper
 *     │     └─> held.c, watch.c
 *     └─> roles.c     WRITE destroy
 *   the four roles, thin modules on the core below:
 *     held.c       READ producer: holds (the only door to the held-transfer table, fanin.c: per
 *                  transfer id one record with its blocks and every rank's fan-in and lease), events
 *     pull.c       READ consumer: pdl_instance_pull and the reader (pdl_xfer_side_t)
 *     push.c       WRITE producer: pdl_instance_push and the writer; its pushes are held transfers (held.c)
 *     push_recv.c  WRITE consumer: pdl_instance_expect_push and its wait (pdl_recv_t)
 *   roles.c ─> pull.c, push.c, push_recv.c, push_park.c  which role serves pdl_instance_abandon, the WRITE
 *                       reaper and destroy (a table by mode x role)
 *   push.c, push_recv.c ─> push_park.c  the park of WRITE messages that came before their push or receive
 *   the core every role uses, one way:
 *     resolve.c   params / request id -> a vetted peer address (pdl_peer_addr_t; resolve.h)
 *     notify.c    one control message to a rank group's notify ports (notify.h) ─> sender.c
 *     xfer.c      ONE transfer executor for both directions ─> peer.c (the per-side peer cache)
 *                   ─> prewarm.c ─> handshake.c; and peer.c ─> handshake.c (the handshake client)
 *     budget.c    every socket toward a peer, by share (budget.h): sender.c, handshake.c, watch.c
 *   everyone ─> sender.c  DEALER caches, "tcp://" endpoints, the service thread's outbound queue
 *   everyone ─> counters.c per-rank counters and the rate-limited drop log (pdl_rank_ctr_t)
 *   prewarm.c   background handshakes of a READ decode or a WRITE prefill (pdl_prewarm_t) ─> handshake.c;
 *               peer.c takes its peers for the lanes and tells it what they connected and evicted;
 *               its eviction rule is prewarm_policy.c (pure)
 *   fanin.c (pure), blockalloc.c, config.c, strmap.c: leaves
 *
 * Threads per rank: the service thread (service.c) owns the ROUTERs and the outbound DEALER cache;
 * the reader (pull.c, READ consumer) and the writer (push.c, WRITE producer) are each one pdl_workq_t
 * thread that owns its peer cache and its DEALER cache. Nothing else touches those caches.
 *
 * Locks: inst->held_mu guards the held-transfer table for every rank of the instance (held.c takes it;
 * counters.c to read the fan-in counters); engine grants are revoked under it. Counters' mu and the
 * sender queue's mu are leaves. inst->push_mu is never held while taking held_mu.
 */
#ifndef PDL_CONNECTOR_INTERNAL_H
#define PDL_CONNECTOR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "common/cidr.h"
#include "common/workq.h"
#include "connector/blockalloc.h"
#include "connector/curve.h"
#include "connector/fanin.h"
#include "connector/peerhealth.h"
#include "connector/budget.h"
#include "connector/resolve.h"
#include "connector/strmap.h"
#include "connector/watch.h"
#include "pdlink/auth.h"
#include "pdlink/connector.h"
#include "common/log.h"
#include "pdlink/topo.h"
#include "pdlink/wire.h"
#include "wire/params_json.h"

typedef struct pdl_rank pdl_rank_t;
typedef struct pdl_peer pdl_peer_t;

/* ---- counters.c: per-rank counters and the drop log ------------------------------------------ */

/* Kinds of dropped input, each logged through its own rate limiter. */
typedef enum pdl_drop_kind {
    PDL_DROP_NOTIFY_PARSE = 0,   /* not msgpack map / UTF-8, wrong types, unknown type, bad values */
    PDL_DROP_NOTIFY_FRAMES,      /* multi-frame junk on the notify port */
    PDL_DROP_NOTIFY_UNSUPPORTED, /* a WRITE-mode message (remote_blocks/write_done) in READ mode */
    PDL_DROP_NOTIFY_FANIN,       /* a release whose consumer_tp_size/rank does not fit this P */
    PDL_DROP_HANDSHAKE,          /* any handshake request other than get_meta_msg / pop_done_recv / identity */
    PDL_DROP_KINDS
} pdl_drop_kind_t;

/* The fields of pdl_rank_counters_t not kept by the fan-in, under their own leaf mutex, and the
 * rate limiters of the rank's log lines (each used by one thread, except drop_rl: see counters.c). */
typedef struct pdl_rank_ctr {
    pthread_mutex_t mu;
    pdl_rank_counters_t v;
    pdl_ratelimit_t drop_rl[PDL_DROP_KINDS];
    pdl_ratelimit_t late_rl, expired_rl, ping_rl, send_rl, refused_rl, listen_rl;
    /* failed pulls and pushes: a client can make every request fail (a made-up prefill), and each
     * line was ~1.4 kB; shared by the rank's lanes (the limiter is atomic) */
    pdl_ratelimit_t fail_rl;
} pdl_rank_ctr_t;

void pdl__ctr_init(pdl_rank_ctr_t *c);
void pdl__ctr_fini(pdl_rank_ctr_t *c);
/* Add v to the counter at `offset` in pdl_rank_counters_t (use PDL_CTR_ADD). */
void pdl__ctr_add(pdl_rank_ctr_t *c, size_t offset, uint64_t v);
#define PDL_CTR_ADD(r, field, v) pdl__ctr_add(&(r)->ctr, offsetof(pdl_rank_counters_t, field), (v))
/* Count a refused peer in the counter at `offset` (releases_refused, untrusted_refused: use
 * PDL_CTR_REFUSED) and log it through the rank's refusal rate limiter (docs/security.md). */
void pdl__ctr_refused(pdl_rank_t *r, size_t offset, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define PDL_CTR_REFUSED(r, field, ...) pdl__ctr_refused((r), offsetof(pdl_rank_counters_t, field), __VA_ARGS__)
/* Count a dropped frame in dropped_malformed and log it through the kind's rate limiter. */
void pdl__ctr_drop(pdl_rank_t *r, pdl_drop_kind_t kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- config.c: trusted_hosts -------------------------------------------------------------------- */

/* May we dial `host` (a name or an address; every address it resolves to must be trusted), may we
 * serve the peer at `numeric` (libzmq's Peer-Address; NULL = unknown, refused when a list is set)?
 * Always true with an empty trusted_hosts. */
bool pdl__trust_host(const pdl_cidrs_t *trusted, const char *host);
bool pdl__trust_addr(const pdl_cidrs_t *trusted, const char *numeric);

/* ---- sender.c: DEALER caches, endpoints, the outbound queue ---------------------------------- */

enum { PDL_OUT_OTHER = 0, PDL_OUT_RELEASE = 1, PDL_OUT_KEEPALIVE = 2 };
/* Or'ed into a kind: the endpoint belongs to a peer this instance verified (a handshake with it
 * succeeded, or it is the producer of a transfer just pulled from it). Without it a new DEALER counts
 * in the small unverified share of the socket cap (sender.c). */
#define PDL_OUT_VERIFIED 0x100
#define PDL_OUT_KIND(k) ((k) & 0xff)
/* DEALERs in one owner thread's cache, on top of the instance's socket budget (budget.h). */
#define PDL_DEALERS_PER_CACHE 128

/* A message queued for the service thread to send on its DEALER cache. */
typedef struct pdl_outmsg {
    struct pdl_outmsg *next;
    char endpoint[PDL_WIRE_HOST_MAX + 32]; /* "tcp://host:port" */
    int kind;                              /* PDL_OUT_*: which counter a successful send bumps */
    pdl_bytes_t payload;
} pdl_outmsg_t;

/* Messages other threads hand to the service thread, which alone may use its DEALER cache. */
typedef struct pdl_outq {
    pthread_mutex_t mu;
    pdl_outmsg_t *head, *tail;
    int wake_fd; /* eventfd the service thread polls; -1 until service.c created it */
} pdl_outq_t;

/* "tcp://host:port", brackets for IPv6; -1 if it does not fit. */
int pdl__endpoint(char *buf, size_t cap, const char *host, int port);
/* Send one frame on a DEALER from `cache` (created and connected on first use, evicted on error),
 * counting it by `kind` (PDL_OUT_*, | PDL_OUT_VERIFIED); only the thread that owns `cache` may call
 * this. A new DEALER beyond the cap evicts this cache's least recently used one of the same share, or,
 * with none, the message is not sent (dealers_refused). False when not sent. */
bool pdl__dealer_send(pdl_rank_t *r, pdl_strmap_t *cache, const char *endpoint, int kind, const pdl_bytes_t *payload);
void pdl__dealers_close(pdl_strmap_t *cache);
/* A DEALER for one request/reply with a peer's handshake port (a handshake, an identity or digest
 * request): linger 0, frames bounded by PDL_WIRE_MAX_FRAME, IPv6 when `host` is, CURVE in authenticated
 * mode; not connected. The caller draws it from the socket budget and closes it. NULL with err set. */
void *pdl__request_dealer(pdl_instance_t *inst, const char *host, pdl_error_t *err);
/* Close the DEALERs of `cache` unused for idle_ns (all of them when idle_ns is 0): a DEALER to a peer
 * that died reconnects forever otherwise (see sender.c). Only the cache's thread may call this. */
void pdl__dealers_sweep(pdl_strmap_t *cache, uint64_t now_ns, uint64_t idle_ns);
/* How long a cached DEALER may stay unused: long enough that a busy peer's socket is never churned,
 * short enough that one to a dead peer makes only a few (backed-off) connect attempts. */
#define PDL_DEALER_IDLE_MS 30000
/* Queue a message for rank r's service thread (any thread). Takes the payload (left empty) on
 * success; PDL_ERR_NOMEM, or PDL_ERR_INVALID when host:port makes no endpoint. */
pdl_status_t pdl__outq_send(pdl_rank_t *r, const char *host, int port, int kind, pdl_bytes_t *payload,
                            pdl_error_t *err);
/* Service thread: take every queued message and send it on `cache`. */
void pdl__outq_flush(pdl_rank_t *r, pdl_strmap_t *cache);
void pdl__outq_init(pdl_outq_t *q);
void pdl__outq_fini(pdl_outq_t *q);

/* ---- peer.c: a lane's peer cache; handshake.c: the handshake client --------------------------- */

struct pdl_peer {
    char key[PDL_WIRE_ID_MAX + 64]; /* "engine_id|dp|rank" */
    char remote_engine_key[PDL_WIRE_HOST_MAX + 64];
    pdl_agent_meta_t meta;
    /* One session per local/remote registration pair: a single one when both sides register every
     * layer in one region, else one per layer (sessions[l] moves layer l). */
    pdl_session_t **sessions;
    int nsessions;
    /* The remote registered each layer separately (its layer map has a descriptor per layer): its
     * layer l starts at offset 0 of its own region, and its grants are per layer (pdl__grant_name). */
    bool remote_layered;
    pdl_kv_geometry_t geo;
    uint64_t layer_len;
};
static inline pdl_session_t *pdl__peer_session(const pdl_peer_t *p, int layer)
{
    return p->sessions[p->nsessions > 1 ? layer : 0];
}

typedef struct pdl_xfer_side pdl_xfer_side_t;

/* The peer for rank `remote_rank` of `addr` from the side's cache (keyed by the dialled address),
 * handshaking (and caching it) if needed; *handshaked (may be NULL) says whether it did. A request
 * whose addr->claimed_id is not the engine id the address answered with fails with PDL_ERR_DENIED
 * naming both (the peer stays cached). A peer that failed recently is refused at once
 * from the side's peer health (peerhealth.h) with the remembered status and reason, instead of paying
 * the handshake timeout again. Fails with the handshake's status (PDL_ERR_TIMEOUT, _PEER_GONE (nothing
 * listens: refused at once), _TRANSPORT, _PARSE, _MISMATCH, _NOMEM) and a message naming the peer as
 * "<role> tp rank N"; a failure is not cached. Only the side's thread may call this. */
pdl_status_t pdl__peer_get(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_peer_addr_t *addr, int remote_rank,
                           pdl_peer_t **peer_out, bool *handshaked, pdl_error_t *err);
/* The side's cached peer of rank `remote_rank` of addr, or NULL: no handshake, no prewarm. */
const pdl_peer_t *pdl__peer_cached(const pdl_xfer_side_t *side, const pdl_peer_addr_t *addr, int remote_rank);
/* Forget a peer after a failure that says it is gone (closes the session, removes the remote engine). */
void pdl__peer_evict(pdl_rank_t *r, pdl_strmap_t *cache, pdl_peer_t *peer);
void pdl__peers_free(pdl_rank_t *r, pdl_strmap_t *cache);
/* handshake.c: handshake with rank `remote_rank` of `addr` and open its session for rank r, with no
 * cache, no peer health and no identity check (peer.c, prewarm.c: from any thread); fails like
 * pdl__peer_get. The peer is the caller's: pdl__peer_free, or handed to a lane through pdl__prewarm_take. */
pdl_status_t pdl__peer_connect(pdl_rank_t *r, const pdl_peer_addr_t *addr, int remote_rank, pdl_peer_t **peer_out,
                               pdl_error_t *err);
void pdl__peer_free(pdl_rank_t *r, pdl_peer_t *peer);
/* The peer cache key of rank `remote_rank` of addr ("engine_id|dp|rank"), into key[cap]. */
void pdl__peer_key(const pdl_peer_addr_t *addr, int remote_rank, char *key, size_t cap);
/* Does a handshake's status say the peer cannot be reached (timeout, refused, transport), as opposed
 * to a mismatch or a local failure? Those are retried after a backoff; the others are not. */
bool pdl__peer_unreachable(pdl_status_t st);
/* handshake.c: does anything listen on the handshake port of rank `remote_rank` of addr? The same
 * connect probe as a handshake's first step, within timeout_ms: PDL_OK, PDL_ERR_PEER_GONE (refused),
 * PDL_ERR_TIMEOUT or PDL_ERR_TRANSPORT. A peer in backoff after a refusal that listens again is tried
 * at once (peer.c). */
pdl_status_t pdl__peer_listening(const pdl_peer_addr_t *addr, int remote_rank, int timeout_ms);
/* "host:port (producer tp rank N)": how messages name rank `remote_rank` of addr, into who[cap]. */
void pdl__peer_who(const pdl_peer_addr_t *addr, int remote_rank, char *who, size_t cap);

/* ---- prewarm.c: sessions before the first request -------------------------------------------- */

typedef struct pdl_prewarm pdl_prewarm_t;
/* Start the background thread of a READ-mode consumer or a WRITE-mode producer with the config's
 * prewarm_peers (producers; consumers in WRITE mode). inst->prewarm stays NULL for other instances,
 * and every function below then does nothing. PDL_ERR_NOMEM or PDL_ERR_SYSTEM (no thread); an unusable prewarm_peers entry is logged and skipped, never fatal. */
pdl_status_t pdl__prewarm_start(pdl_instance_t *inst, pdl_error_t *err);
/* Stop the thread (waits for a handshake in progress, at most handshake_timeout) and free the peers
 * nobody took; lanes still running get nothing from it after this. Before the ranks' engines and the
 * ZeroMQ context go. Free it once the lanes stopped. */
void pdl__prewarm_stop(pdl_instance_t *inst);
void pdl__prewarm_free(pdl_instance_t *inst);
/* A lane's cache miss for `key` (rank of addr) on rank r: the prewarmed peer (now the caller's), after
 * waiting for one being connected right now; NULL when there is none, and the prewarm then leaves that
 * key to the lane -- with *st_out (and err) the failure of the attempt the lane waited for, if it
 * failed, which the lane takes as its own. A remote instance not known yet gets every (local rank,
 * remote rank) pair this instance will read from it (READ) or write to (WRITE) queued for the
 * background thread (tried once; only prewarm_peers are retried until reachable). When the lane is left
 * to connect itself (NULL, PDL_OK) it reports the outcome with pdl__prewarm_lane_done. */
pdl_peer_t *pdl__prewarm_take(pdl_rank_t *r, const pdl_peer_addr_t *addr, const char *key, pdl_status_t *st_out,
                              pdl_error_t *err);
/* A lane evicted `key` (its peer looked gone): connect it again in the background. */
void pdl__prewarm_again(pdl_rank_t *r, const char *key);
/* A lane that pdl__prewarm_take left to connect `key` itself tells how that went (st: PDL_OK, it holds
 * the peer now; anything else, it does not): a pair a lane holds is never evicted, a failed one may be. */
void pdl__prewarm_lane_done(pdl_rank_t *r, const char *key, pdl_status_t st);

/* ---- prewarm_policy.c: which learnt remote instance the prewarm forgets (pure) ---------------- */

/* One remote instance of the prewarm's table, as the eviction rule sees it. */
typedef struct pdl_prewarm_cand {
    bool configured;    /* named by prewarm_peers: never dropped */
    bool in_use;        /* a pair connecting or warm, or a lane holds (or is connecting) its peer */
    uint64_t failed_ns; /* every pair's last attempt failed, the latest at this time; 0: not all failed */
    uint64_t learnt_ns; /* when a request named it first */
} pdl_prewarm_cand_t;
/* The index in c[0..n) of the instance to drop now, or -1 for none. Never a configured or in-use one.
 * A failed one (failed_ns != 0) is dropped once now_ns >= failed_ns + ttl_ns, the longest failed first;
 * with need_room (a new instance does not fit) the longest failed at once, or if none failed, the one
 * learnt first. Cannot fail. */
long pdl__prewarm_pick_victim(const pdl_prewarm_cand_t *c, size_t n, uint64_t now_ns, uint64_t ttl_ns, bool need_room);

/* ---- xfer.c: the transfer executor ----------------------------------------------------------- */

/* One lane of transfers in one direction: one pdl_workq_t thread serving every transfer with ONE
 * remote instance, with the caches only that thread touches. A rank has a lane per remote instance
 * (pdl_xfer_lanes_t), so a peer that hangs (handshake timeout, transfer timeout) holds up only the
 * transfers that need it. pull.c runs a rank's READ lanes, push.c its WRITE lanes. */
typedef void (*pdl_xfer_run_fn)(pdl_xfer_side_t *side, pdl_workq_item_t *job, bool stopping);
struct pdl_xfer_side {
    pdl_rank_t *rank;
    pdl_xfer_run_fn run;
    char key[PDL_WIRE_ID_MAX + 16]; /* "engine_id|dp" of the remote instance */
    pdl_workq_t q;
    bool started;
    bool slice_asked;         /* the lane's thread asked for its long scheduler slice (xfer.c) */
    pdl_strmap_t peers;       /* "engine_id|dp|rank" -> pdl_peer_t* */
    pdl_strmap_t dealers;     /* endpoint -> DEALER (sender.c) for the notifications this lane sends */
    pdl_peerhealth_t health;  /* remote ranks that failed recently (peerhealth.h) */
    pdl_workq_item_t sweep;   /* queued by the service thread: close idle DEALERs (sender.c) */
    atomic_bool sweep_queued;
    pdl_read_plan_t *plans[8]; /* pull.c: cached read plans, one per producer TP seen */
    int nplans;
    /* A handshake with the lane's own remote instance (key) succeeded once: its endpoints are verified
     * (sender.c's cap; failed releases go only to verified producers). Set by the lane's thread, read by
     * pdl_instance_abandon's. */
    atomic_bool verified;
};

/* A rank's lanes in one direction, created on first use and stopped with the rank. */
#define PDL_XFER_MAX_LANES 64
typedef struct pdl_xfer_lanes {
    pthread_mutex_t mu;
    pdl_strmap_t map; /* "engine_id|dp" -> pdl_xfer_side_t* */
    pdl_xfer_side_t *all[PDL_XFER_MAX_LANES];
    int n;
    bool stopped;
    pdl_xfer_run_fn run;
    const char *what; /* "reader" / "writer", for thread names and logs */
} pdl_xfer_lanes_t;

/* One piece of a transfer: a head range moved between us and one rank of the remote instance. */
typedef struct pdl_xfer_piece {
    int remote_rank;        /* the producer rank for a read, the consumer rank for a write */
    pdl_plan_piece_t piece; /* heads, as the read/write plan gives them */
} pdl_xfer_piece_t;

/* A transfer of one rank: a direction, the remote instance and the pieces, over n block pairs. */
typedef struct pdl_xfer {
    pdl_dir_t dir;               /* PDL_DIR_READ: remote -> local; PDL_DIR_WRITE: local -> remote */
    const pdl_peer_addr_t *peer; /* the remote instance */
    const pdl_xfer_piece_t *pieces;
    int npieces;
    const uint32_t *local_blocks, *remote_blocks;
    size_t n;
    const char *grant; /* READ: the transfer id, the grant the producer's engine serves it under; else NULL */
    /* A WRITE of a push started before its KV was final (pdl_instance_push_start): PDL_OK with *ready_p,
     * the number of leading layers that may be written, once it is above `have` (waiting for that);
     * otherwise the status that ends the transfer, err naming why. NULL (reads, whole pushes): every
     * layer is final. */
    pdl_status_t (*gate)(void *gate_arg, int have, int *ready_p, pdl_error_t *err);
    void *gate_arg;
} pdl_xfer_t;

/* Where an executed transfer spent its time (debug log lines). */
typedef struct pdl_xfer_times {
    uint64_t peers, build, post, wait;
} pdl_xfer_times_t;

/* Run x on rank r from the side's thread: handshake the remote ranks the pieces name (cached; with every
 * one of them handshaked -- or one answering but incompatible, PDL_ERR_MISMATCH -- *verified is set (may
 * be NULL) and, with all handshaked, for the lane's own instance side->verified), post batched ops per
 * remote rank (whole layers, several per batch when they are small; with x->gate, the layers it lets
 * through to every remote rank, then ask it for more), wait for all of them within transfer_timeout (even
 * after a failure: the batches use our blocks), evict every peer that failed as gone, add the wall time
 * less the time at the gate to read_ns or write_ns. Adds bytes/descriptors posted to *bytes and *descs.
 * Returns PDL_OK, or the first failure with err naming the layer and remote rank (PDL_ERR_TIMEOUT past
 * transfer_timeout), or the gate's. */
pdl_status_t pdl__xfer_run(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_xfer_t *x, uint64_t *bytes,
                           uint64_t *descs, pdl_xfer_times_t *times, bool *verified, pdl_error_t *err);
/* Lanes: init (no thread yet) / the lane for remote instance `addr`, started on first use (beyond
 * PDL_XFER_MAX_LANES remote instances, lanes are shared by hash) -- NULL with err set when its thread
 * cannot start or the rank is stopping / queue the service thread's idle-DEALER sweep on every lane /
 * stop every lane (queued jobs run with stopping = true) and free their caches. */
void pdl__xfer_lanes_init(pdl_xfer_lanes_t *l, pdl_xfer_run_fn run, const char *what);
pdl_xfer_side_t *pdl__xfer_lane(pdl_rank_t *r, pdl_xfer_lanes_t *l, const pdl_peer_addr_t *addr, pdl_error_t *err);
void pdl__xfer_lanes_sweep(pdl_xfer_lanes_t *l);
void pdl__xfer_lanes_stop(pdl_rank_t *r, pdl_xfer_lanes_t *l);
/* After every thread that may call pdl__xfer_lanes_sweep (the service thread) stopped. */
void pdl__xfer_lanes_fini(pdl_xfer_lanes_t *l);

/* ---- the rank ---------------------------------------------------------------------------------- */

/* rank.c: one rank's engine and memory, fixed after create. */
typedef struct pdl_rank_mem {
    char engine_key[PDL_WIRE_HOST_MAX + 64];
    pdl_engine_t *engine;
    pdl_mem_t *kv;      /* every layer in one registration; NULL with layer_kv */
    pdl_mem_t **layer_kv; /* kv_layer_regions: one registration per layer (num_layers); else NULL */
    uint8_t *kv_ptr;
    pdl_kv_geometry_t geo;
    uint64_t layer_len; /* bytes of one layer's region; in kv, layer l starts at l * layer_len */
    pdl_bytes_t meta_payload, layermap_payload;
} pdl_rank_mem_t;

/* The registration holding layer l, and where the layer starts in it. */
static inline pdl_mem_t *pdl__layer_mem(const pdl_rank_mem_t *m, int l) { return m->layer_kv ? m->layer_kv[l] : m->kv; }
static inline uint64_t pdl__layer_off(const pdl_rank_mem_t *m, int l)
{
    return m->layer_kv ? 0 : (uint64_t)l * m->layer_len;
}
/* The whole-block ranges (every half) of blocks ids[0..n) in layers [l0, l1) of m, in layer order, into
 * out (room for (l1 - l0) * n * halves); ids past num_blocks are skipped. Returns how many it wrote. */
size_t pdl__rank_block_ranges(const pdl_rank_mem_t *m, int l0, int l1, const uint32_t *ids, size_t n,
                              pdl_range_t *out);
/* "host", "CUDA" or "ROCm", as messages name a memory type. */
const char *pdl__mem_type_name(pdl_mem_type_t t);
/* Zero k ranges of m given in layer order, the same number for each of its `layers` layers, through the
 * engine (device memory on the device): one call for a rank-wide registration, one per layer's
 * otherwise; a layer that fails does not stop the others, and the first error names its layer. */
pdl_status_t pdl__rank_zero(const pdl_rank_mem_t *m, int layers, const pdl_range_t *rg, size_t k, pdl_error_t *err);
/* The engine grant a transfer `name` has on layer l of a rank registered per layer ("<name>#<l>",
 * layered) or on a single registration (`name` itself): the owner grants it (pdl__rank_grant) and its
 * peer names it in every request (xfer.c), each deriving it from how the owner registered. */
static inline void pdl__grant_name(char *buf, size_t cap, const char *name, bool layered, int l)
{
    if (layered)
        snprintf(buf, cap, "%s#%d", name, l);
    else
        snprintf(buf, cap, "%s", name);
}

/* service.c: the service thread and the sockets only it touches. */
/* listen.c: one ROUTER's accept monitor and pause state (service thread only). */
typedef struct pdl_listen {
    void *router, *mon; /* mon: PAIR connected to the ROUTER's monitor; NULL if none */
    const char *what;   /* "handshake" / "notify" */
    char endpoint[128]; /* as bound (ZMQ_LAST_ENDPOINT), for unbind and bind again */
    bool paused;
    uint64_t resume_ms;
    uint64_t live, cap; /* connections accepted and not yet gone (monitor events); the most kept */
} pdl_listen_t;

typedef struct pdl_rank_svc {
    pthread_t thread;
    bool started;
    atomic_bool stop;
    void *hs_sock, *notify_sock, *ping_sock;
    pdl_listen_t hs_listen, notify_listen; /* listen.c */
    pdl_strmap_t dealers; /* endpoint -> DEALER for what other threads queue in pdl_rank_t.out */
    uint64_t next_ping_ms;
    uint64_t next_sweep_ms; /* idle DEALERs: this thread's and its rank's lanes' (sender.c) */
    pdl_strmap_t watch;     /* rank 0 of a producer: consumer "host:port" -> probe state (watch.c) */
    uint64_t next_watch_ns;
    uint64_t bound_ns; /* when the handshake ROUTER was bound: the epoch the identity answers (watch.c) */
    char followup_identity[256]; /* pop_done_recv: upstream sends one more frame; swallow it */
    size_t followup_len;
    pdl_bytes_t ping_payload;
    uint64_t ping_failures;
} pdl_rank_svc_t;

struct pdl_rank {
    pdl_instance_t *inst;
    int rank;
    int hs_port, notify_port;
    pdl_rank_mem_t mem;     /* rank.c */
    pdl_rank_ctr_t ctr;     /* counters.c */
    pdl_outq_t out;         /* sender.c */
    pdl_rank_svc_t svc;     /* service.c */
    pdl_xfer_lanes_t readers; /* pull.c: READ lanes, one per producer instance */
    pdl_xfer_lanes_t writers; /* push.c: WRITE lanes, one per consumer instance */
};

/* rank.c */
/* Ports, locks, geometry (no I/O); then, once the rank's ROUTERs are bound (pdl__service_bind), the
 * engine, the KV memory and the handshake payloads. Fails with the statuses of the geometry,
 * pdl_engine_create and the memory calls; destroy tears down a rank in any of these states. */
pdl_status_t pdl__rank_init(pdl_instance_t *inst, pdl_rank_t *r, int rank, pdl_error_t *err);
pdl_status_t pdl__rank_open(pdl_instance_t *inst, pdl_rank_t *r, pdl_error_t *err);
/* Locks and queues only: for ranks after the one whose init failed, so destroy can treat all alike. */
void pdl__rank_init_locks(pdl_rank_t *r);
void pdl__rank_fini(pdl_rank_t *r);
/* Let every rank's engine serve `ops` (PDL_GRANT_READ: a READ hold; PDL_GRANT_WRITE: a WRITE receive)
 * on blocks `ids` -- every layer, both halves, the rank's heads -- to requests naming `name` (the
 * transfer id); statuses of pdl_engine_grant, with no grant left behind on failure (docs/security.md).
 * pdl__rank_revoke: forget rank `rank`'s grant of `name` (-1: every rank's); none is fine. */
pdl_status_t pdl__rank_grant(pdl_instance_t *inst, const char *name, unsigned ops, const uint32_t *ids, size_t n,
                             pdl_error_t *err);
/* pdl__rank_grant served only to data connections from `host` (numeric; "" or NULL = any host): a WRITE
 * receive binds its grant to the producer's host (pdl_engine_grant_to). */
pdl_status_t pdl__rank_grant_to(pdl_instance_t *inst, const char *name, unsigned ops, const uint32_t *ids, size_t n,
                                const char *host, pdl_error_t *err);
void pdl__rank_revoke(pdl_instance_t *inst, const char *name, int rank);

/* ---- held.c: held transfers ------------------------------------------------------------------ */

/* A producer transfer whose blocks wait for every rank to resolve it (READ hold or WRITE push): the
 * data of its record in the held-transfer table, which tracks the ranks (fanin.h). */
typedef struct pdl_held {
    uint32_t *ids;
    size_t n;
    char consumer[PDL_WIRE_HOST_MAX + 16]; /* "host:port" of the consumer's handshake port; "" = unknown */
    char consumer_ip[64]; /* that host when it is a numeric address; "" = unknown or a name */
} pdl_held_t;

/* The instance's held-transfer table (instance create; PDL_ERR_NOMEM) / free it with every record's
 * blocks list (instance destroy, after every thread stopped; the blocks themselves stay allocated). */
pdl_status_t pdl__held_init(pdl_instance_t *inst, pdl_error_t *err);

/* Record `ids` under transfer_id (copied), for the consumer at "host:port" (may be NULL: unknown);
 * PDL_ERR_BAD_STATE when already held, PDL_ERR_NOMEM. A held transfer's blocks may be read by whoever
 * names it (READ mode: pdl__held_grant), until the rank resolves it or the hold is cancelled. */
pdl_status_t pdl__held_add(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n,
                           const char *consumer, pdl_error_t *err);
/*
 * May a release (or a keepalive) of transfer_id reach rank r from host `sender` (numeric, as libzmq
 * reports the connection's peer; NULL = unknown)? The consumer is the host the transfer was made for
 * (the request id's decode address given to pdl_instance_hold_for; a push's consumer), else -- a hold
 * that names none -- the host the rank's engine first served the transfer's grant to; a release from
 * another host, other than the router's (proxy_ip), is refused, with the expected host in `expected`.
 * Without a known consumer (an upstream peer reads over its own transport, no request id, a name
 * instead of an address, a transfer not held yet) every release is accepted, as upstream does.
 */
bool pdl__held_release_allowed(pdl_rank_t *r, const char *transfer_id, const char *sender, char *expected, size_t cap);
/* Its last step, for a consumer host already known (numeric; "" = unknown: anyone): is `sender` (NULL =
 * unknown: accepted) that host or the router's (proxy_ip)? */
bool pdl__held_sender_is_consumer(const pdl_instance_t *inst, const char *sender, const char *consumer);
/* Undo pdl__held_add and its grants (the blocks stay with the caller). */
void pdl__held_cancel(pdl_instance_t *inst, const char *transfer_id);
/* Rank `rank` is done with transfer_id (push.c: its share was written, or given up; watch.c: its
 * consumer is gone): its grant is revoked; the last rank frees the blocks. Event RANK_REPORTED or, with
 * `expired`, RANK_EXPIRED (also for a rank that was resolved already), then FREED with the last. */
void pdl__held_rank_resolved(pdl_instance_t *inst, const char *transfer_id, int rank, bool expired);
/* Service thread of rank r, READ producer: hand a release (already allowed) / a keepalive to the rank's
 * fan-in. A release that completes it resolves the rank as pdl__held_rank_resolved does (RANK_REPORTED).
 * PDL_FANIN_INVALID fills `err`. The keepalive is false when the rank does not hold the transfer. */
pdl_fanin_result_t pdl__held_release(pdl_rank_t *r, const pdl_fanin_release_t *rel, pdl_error_t *err);
bool pdl__held_keepalive(pdl_rank_t *r, const char *transfer_id);
/* Service thread of rank r, every tick: drop its stale parked releases and resolve its holds whose
 * lease ended (RANK_EXPIRED, logged through the rank's expiry rate limiter). */
void pdl__held_reap(pdl_rank_t *r);
/* Whether transfer_id is held now (its record may leave right after: a hint, e.g. for the watch). */
bool pdl__held_exists(pdl_instance_t *inst, const char *transfer_id);
/* Call fn for every held transfer (`held` is its pdl_held_t) under held_mu: fn takes no connector lock. */
void pdl__held_foreach(pdl_instance_t *inst, void (*fn)(void *arg, const char *transfer_id, void *held), void *arg);
void pdl__held_free_all(pdl_instance_t *inst);

/* ---- listen.c: ROUTERs out of file descriptors ---------------------------------------------- */

/* Monitor `router` (bound) for failed accepts; without a monitor it only warns. Service thread. */
void pdl__listen_watch(pdl_rank_t *r, pdl_listen_t *l, void *router, const char *what);
/* The monitor is readable: unbind the ROUTER for a pause if an accept failed for want of descriptors. */
void pdl__listen_on_event(pdl_rank_t *r, pdl_listen_t *l, uint64_t now_ms);
/* Bind a paused ROUTER again once its pause is over. */
void pdl__listen_tick(pdl_rank_t *r, pdl_listen_t *l, uint64_t now_ms);
/* Stop the monitor (before the ROUTER is closed). */
void pdl__listen_fini(pdl_listen_t *l);

/* ---- authmode.c: authenticated mode ------------------------------------------------------------ */

/* With auth_key_file set: load the key (its errors name the path) and refuse a backend that cannot
 * authenticate its data connections / start the context's ZAP handler (before any ROUTER is bound). */
pdl_status_t pdl__authmode_load(pdl_instance_t *inst, pdl_error_t *err);
pdl_status_t pdl__authmode_start(pdl_instance_t *inst, pdl_error_t *err);
/* Stop the ZAP handler (before zmq_ctx_term) / free the key (after the engines are gone). */
void pdl__authmode_stop(pdl_instance_t *inst);
void pdl__authmode_free(pdl_instance_t *inst);
/* The ZAP domain of rank r's `what` ROUTER ("rank 3 notify"): the handler's refusals count on r. */
void pdl__authmode_domain(const pdl_rank_t *r, const char *what, char *buf, size_t cap);

/* ---- scrub.c: scrub_freed_blocks ------------------------------------------------------------- */

/* With scrub_freed_blocks: zero blocks `ids` on every rank (every layer, every half). Call it right
 * before the blocks go back to the allocator. No-op otherwise. */
void pdl__scrub_blocks(pdl_instance_t *inst, const uint32_t *ids, size_t n);

/* ---- watch.c: consumers of held transfers that are gone ---------------------------------------- */

/* Service thread of rank 0 of a producer, every tick: probe the consumers named by held transfers
 * (READ holds, WRITE pushes) and free the transfers of those gone (consumer_gone_timeout). */
void pdl__watch_tick(pdl_rank_t *r, uint64_t now_ns);
/* Service thread at exit: close the probes. */
void pdl__watch_fini(pdl_rank_t *r);
/* The answer to PDL_WIRE_GET_IDENTITY on rank r: "pid=<pid> meta=<fingerprint>" into buf[cap]
 * (cap >= 48); returns its length. */
size_t pdl__watch_identity(const pdl_rank_t *r, char *buf, size_t cap);

/* ---- service.c / pull.c / push.c lifecycles ---------------------------------------------------- */

/* Bind the rank's handshake and notify ROUTERs (rank init, before the engine picks its data port) /
 * start the service thread on them. */
pdl_status_t pdl__service_bind(pdl_rank_t *r, pdl_error_t *err);
pdl_status_t pdl__service_start(pdl_rank_t *r, pdl_error_t *err);
void pdl__service_stop(pdl_rank_t *r);
/* Initialise the rank's READ / WRITE lanes (no thread yet; cannot fail) / stop them. */
void pdl__reader_start(pdl_rank_t *r);
void pdl__reader_stop(pdl_rank_t *r);
void pdl__writer_start(pdl_rank_t *r);
void pdl__writer_stop(pdl_rank_t *r);
/* pdl_instance_abandon of a READ consumer (pull.c; roles.c dispatches): the failed releases a failed
 * pull sends, on the ranks' READ lanes for the producer the params name, once it answered a handshake. */
pdl_status_t pdl__pull_abandon(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               pdl_error_t *err);
/* Service thread of rank r: a remote_blocks (producer, push.c) or write_done (consumer, push_recv.c)
 * message; `sender` is its Peer-Address (NULL = unknown: accepted). A remote_blocks counts only from
 * the push's consumer host (one parked before its push is checked when the push is made), a write_done
 * only from the host of the producer the receive names (a failed one parked before its receive, when
 * the receive starts); refusals are counted in remote_blocks_refused / write_done_refused. */
void pdl__push_on_remote_blocks(pdl_rank_t *r, const pdl_msg_t *msg, const char *sender);
void pdl__push_on_write_done(pdl_rank_t *r, const pdl_msg_t *msg, const char *sender);
/* Service thread, WRITE producer (push.c): a failed release, i.e. the consumer will not take the push;
 * `sender` (Peer-Address, NULL = unknown) already passed pdl__held_release_allowed, and is kept with an
 * abandon parked before its push so that pdl_instance_push checks it again against the push's consumer.
 * An abandon replaces a parked remote_blocks only from that message's host (or the router's). */
void pdl__push_on_abandon(pdl_rank_t *r, const pdl_msg_t *msg, const char *sender);
/* The watch (watch.c, on rank r0), WRITE producer (push.c): the consumer of push transfer_id is gone. Its ranks
 * still waiting for remote_blocks are resolved as expired at once (RANK_EXPIRED; FREED with the last
 * rank); shares queued on a writer lane fail without writing; a share being written fails by itself
 * (its peer is dead) and resolves its rank. True the first time for a push (counted in r0's
 * consumer_gone_freed before any event), false when no such push exists or it was given up before (a
 * share still being written keeps it held, and the watch finds it again). Takes push_mu and held_mu,
 * never both at once. */
bool pdl__push_consumer_gone(pdl_rank_t *r0, const char *transfer_id);
/* The watch (watch.c), WRITE consumer (push_recv.c): call fn(arg, peer, item) for each producer rank an unfinished
 * receive waits on: peer "host:port" of that rank's handshake port, item "producer rank|transfer id".
 * Takes push_mu: fn must not call back into push_recv.c. */
typedef void (*pdl_watch_item_fn)(void *arg, const char *peer, const char *item);
void pdl__push_watch_producers(pdl_instance_t *inst, pdl_watch_item_fn fn, void *arg);
/* The watch, WRITE consumer (push_recv.c): producer rank `prank` (at `peer`) of receive transfer_id is gone (`why`):
 * the consumer ranks still waiting on it finish at once with PDL_ERR_PEER_GONE naming peer and rank
 * (their grants revoked: nothing more is written into their blocks). Counted once per receive in r0's
 * producer_gone_failed, before the waiter can see the receive end. True when a rank was failed now. */
bool pdl__push_producer_gone(pdl_rank_t *r0, const char *transfer_id, int prank, const char *peer, const char *why);
/* Service thread of rank r, every tick (roles.c): reap pushes whose remote_blocks never came, stale
 * parked remote_blocks and consumer waits past transfer_timeout. */
void pdl__push_reap(pdl_rank_t *r);
/* instance destroy, once `stopping` is set (push.c): wake every writer waiting for a push's layers
 * (pdl_instance_push_start), so its write fails now instead of at transfer_timeout. */
void pdl__push_stop_waits(pdl_instance_t *inst);
/* instance destroy: free what the WRITE-mode maps still hold (after every thread stopped; roles.c). */
void pdl__push_free_all(pdl_instance_t *inst);

/* ---- the instance ---------------------------------------------------------------------------- */

#define PDL_PUSH_TOMBS 256

struct pdl_instance {
    pdl_instance_config_t cfg;
    /* The ranks this process runs, [lo, hi): [0, tp) or [local_rank, local_rank + 1). Every loop over
     * ranks is over these (PDL_FOR_LOCAL); ranks[] has tp entries, the others stay zero. */
    int lo, hi;
    char attn_backend[128];
    char engine_id[PDL_WIRE_HOST_MAX + 16];
    char zmq_address[2 * PDL_WIRE_HOST_MAX];
    void *zctx;
    pdl_blockalloc_t *blocks;
    pdl_cidrs_t trusted; /* trusted_hosts, parsed once (config.c: pdl__trust_*); n == 0 = everyone */
    int tp;
    pdl_rank_t *ranks; /* tp of them */
    atomic_bool stopping;
    /* budget.c: the sockets open toward peers (DEALER caches, handshakes, watch probes), by share */
    pdl_budget_t sockets;
    /* watch.c: the connect its probes make (watch.h; NULL: connect(2)) */
    _Atomic(pdl_watch_connect_fn) watch_connect;

    /* held.c */
    pthread_mutex_t held_mu;
    pdl_fanin_t *held; /* the held-transfer table: one record per transfer id (data: pdl_held_t) */
    size_t held_blocks;
    /* Transfers resolved but still being freed (blocks back to the allocator, FREED delivered): they
     * still count in pdl_instance_held_transfers/_blocks, so a caller that sees 0 also sees their
     * blocks free and their events delivered. */
    size_t freeing;
    pthread_mutex_t cb_mu;
    pdl_instance_event_fn event_fn;
    void *event_arg;

    /* push.c: producer pushes by transfer id; push_park.c: the park, by "rank|transfer id"; push_recv.c:
     * consumer receives by transfer id */
    pthread_mutex_t push_mu;
    pdl_strmap_t pushes, parked, recvs;
    /* push.c: signalled (under push_mu) when a push's final layers grow, its consumer is found gone or
     * abandons it, or the instance stops: what a writer waiting for layers waits on (CLOCK_MONOTONIC) */
    pthread_cond_t push_cv;
    /* digest.c: the KV digests of held transfers (READ producer), served on the handshake ports */
    struct pdl_digests *digests;
    /* push.c: the last pushes a rank of which was given up without writing (a ring), so a late
     * remote_blocks is answered with a failed write_done */
    struct pdl_push *tombs[PDL_PUSH_TOMBS];
    unsigned tomb_next;

    pdl_prewarm_t *prewarm; /* prewarm.c; NULL unless a READ-mode consumer or a WRITE-mode producer */

    /* authmode.c: authenticated mode; both NULL in compatible mode (no auth_key_file) */
    pdl_auth_t *auth;
    pdl_zap_t *zap;
    /* ZAP refusals per rank (tp of them), counted on the handler's thread and added to the rank's
     * auth_refused by pdl_instance_counters: allocated before that thread starts, so it needs no other
     * ordering with the ranks' initialisation. */
    _Atomic uint64_t *zap_refused;
};

#define PDL_FOR_LOCAL(inst, i) for (int i = (inst)->lo; i < (inst)->hi; i++)
static inline bool pdl__is_local(const pdl_instance_t *inst, int rank) { return rank >= inst->lo && rank < inst->hi; }
/* The first local rank: where per-instance counters (transfers_abandoned, untrusted_refused) and the
 * consumer-gone watch live, "rank 0" of the instance as this process sees it. */
static inline pdl_rank_t *pdl__rank_first(pdl_instance_t *inst) { return &inst->ranks[inst->lo]; }
/* May a transfer name these blocks? Allocated ones, or with external_blocks any id below num_blocks
 * (blockalloc.c). PDL_ERR_INVALID naming the first id that is not. */
static inline pdl_status_t pdl__blocks_check(pdl_instance_t *inst, const uint32_t *ids, size_t n, pdl_error_t *err)
{
    return pdl__blockalloc_check_ids(inst->blocks, inst->cfg.num_blocks, ids, n, err);
}
/* PDL_ERR_INVALID naming tp_rank when it is outside [0, tp) or not run by this instance; `what` names
 * the caller ("counters"). Inline, like the helpers above: every file asks, and a function in
 * instance.c would be called back by the files it starts. */
static inline pdl_status_t pdl__rank_check(const pdl_instance_t *inst, int tp_rank, const char *what, pdl_error_t *err)
{
    if (tp_rank < 0 || tp_rank >= inst->tp)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: rank %d outside [0, %d)", what, tp_rank, inst->tp);
    if (!pdl__is_local(inst, tp_rank))
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "%s: rank %d is not run by this instance (local_rank %d: its process has it)", what,
                             tp_rank, inst->cfg.local_rank);
    return PDL_OK;
}

struct pdl_pull {
    pdl_instance_t *inst;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    int pending; /* ranks not finished */
    pdl_status_t status;
    char msg[PDL_ERR_MSG_LEN];
    uint64_t bytes, descs;
    uint64_t start_ns, end_ns;
    uint64_t *release_sent_ns; /* per rank: when its releases were queued */

    /* the request, immutable after pdl_instance_pull */
    char transfer_id[PDL_WIRE_ID_MAX + 1];
    pdl_peer_addr_t producer;
    uint32_t *local_blocks, *remote_blocks;
    size_t n;

    /* pdl_instance_abandon: no reads; each rank job only verifies the producer (handshakes, cached) and
     * then sends its failed releases */
    bool abandon;

    /* pull_hook.h: per-rank work after a rank's reads; rank_arg is freed with the pull */
    void (*rank_fn)(void *arg, int tp_rank);
    void *rank_arg;
    void (*rank_arg_free)(void *arg);
};

#endif /* PDL_CONNECTOR_INTERNAL_H */
