/*
 * internal.h -- the connector runtime's private structures, shared by its files (internal).
 *
 *   instance.c  instance create/destroy, block allocator front, holds and the aggregation of per-rank
 *               fan-in reports (a transfer is freed when EVERY producer rank reported or expired)
 *   service.c   the per-rank service thread: handshake ROUTER, notify ROUTER, outbound DEALER cache,
 *               discovery ping, lease reaper. It is the only thread that touches those sockets;
 *               other threads hand it messages through a mutex-guarded queue and an eventfd.
 *               The worker (pull.c) sends its releases on its OWN DEALER cache: one thread hop less
 *               on the release path (measured: the hop cost ~100 us under load on 2 cores).
 *   peer.c      consumer side: handshake client, compatibility check, remote peer cache
 *   pull.c      consumer side: the per-rank worker thread that executes READ pulls
 *   push.c      WRITE mode: producer pushes (per-rank pusher thread, parked remote_blocks, reaper) and
 *               the consumer's wait for write_done (pdl_recv_t)
 *
 * Lock order (never the other way round): rank->fan_mu, then inst->held_mu; rank->ctr_mu and
 * rank->out_mu are leaves. inst->push_mu is never held while taking held_mu or fan_mu.
 */
#ifndef PDL_CONNECTOR_INTERNAL_H
#define PDL_CONNECTOR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "connector/blockalloc.h"
#include "connector/fanin.h"
#include "connector/strmap.h"
#include "pdlink/connector.h"
#include "pdlink/log.h"
#include "pdlink/topo.h"

/* Kinds of dropped input, each logged through its own rate limiter. */
typedef enum pdl_drop_kind {
    PDL_DROP_NOTIFY_PARSE = 0,   /* not msgpack map / UTF-8, wrong types, unknown type, bad values */
    PDL_DROP_NOTIFY_FRAMES,      /* multi-frame junk on the notify port */
    PDL_DROP_NOTIFY_UNSUPPORTED, /* a WRITE-mode message (remote_blocks/write_done) in READ mode */
    PDL_DROP_NOTIFY_FANIN,       /* a release whose consumer_tp_size/rank does not fit this P */
    PDL_DROP_HANDSHAKE,          /* any handshake request other than get_meta_msg / pop_done_recv */
    PDL_DROP_KINDS
} pdl_drop_kind_t;

enum { PDL_OUT_OTHER = 0, PDL_OUT_RELEASE = 1, PDL_OUT_KEEPALIVE = 2 };

/* A message queued for the service thread to send on a cached DEALER. */
typedef struct pdl_outmsg {
    struct pdl_outmsg *next;
    char endpoint[PDL_WIRE_HOST_MAX + 32]; /* "tcp://host:port" */
    int kind;                              /* PDL_OUT_*: which counter a successful send bumps */
    pdl_bytes_t payload;
} pdl_outmsg_t;

typedef struct pdl_pull_job {
    struct pdl_pull_job *next;
    pdl_pull_t *pull;
    uint64_t queued_ns;
} pdl_pull_job_t;

typedef struct pdl_push pdl_push_t;

/* WRITE mode, producer: one rank's share of a push, started when the consumer's block list is known. */
typedef struct pdl_push_job {
    struct pdl_push_job *next;
    pdl_push_t *push;
    uint32_t *blocks; /* the consumer's block ids (owned) */
    size_t n;
    int decode_dp;
    int consumer_tp; /* from remote_blocks' consumer_tp_size, else the push's params */
} pdl_push_job_t;

typedef struct pdl_rank {
    pdl_instance_t *inst;
    int rank;
    int port_offset;
    int hs_port, notify_port;
    char engine_key[PDL_WIRE_HOST_MAX + 64];

    pdl_engine_t *engine;
    pdl_mem_t *kv;
    uint8_t *kv_ptr;
    pdl_kv_geometry_t geo;
    uint64_t layer_len; /* bytes of one layer's region; layer l starts at l * layer_len */
    pdl_bytes_t meta_payload, layermap_payload;

    /* service thread; sockets below are touched by it alone */
    pthread_t service;
    bool service_started;
    void *hs_sock, *notify_sock, *ping_sock;
    pdl_strmap_t dealers; /* endpoint → zmq DEALER */
    uint64_t next_ping_ms;
    char followup_identity[256]; /* pop_done_recv: upstream sends one more frame; swallow it */
    size_t followup_len;
    int wake_fd;
    atomic_bool svc_stop;
    pdl_bytes_t ping_payload;
    uint64_t ping_failures;
    pthread_mutex_t out_mu;
    pdl_outmsg_t *out_head, *out_tail;

    /* producer fan-in */
    pthread_mutex_t fan_mu;
    pdl_fanin_t *fanin;

    /* consumer worker; peers and plans are touched by the worker alone */
    pthread_t worker;
    bool worker_started;
    pthread_mutex_t job_mu;
    pthread_cond_t job_cv;
    pdl_pull_job_t *job_head, *job_tail;
    bool job_stop;
    pdl_strmap_t peers;        /* "engine_id|dp|tp" → pdl_peer_t* */
    pdl_strmap_t worker_dealers; /* endpoint → DEALER for the releases this worker sends */
    pdl_read_plan_t *plans[8]; /* cached read plans, one per producer TP seen */
    int nplans;

    /* WRITE-mode producer: the pusher thread and its queue; it alone uses push_dealers (and, on a
     * producer instance, which makes no pulls, the peer cache) */
    pthread_t pusher;
    bool pusher_started;
    pthread_mutex_t push_job_mu;
    pthread_cond_t push_job_cv;
    pdl_push_job_t *push_head, *push_tail;
    bool push_stop;
    pdl_strmap_t push_dealers;

    pthread_mutex_t ctr_mu;
    pdl_rank_counters_t ctr; /* the fields not kept by the fan-in */
    pdl_ratelimit_t drop_rl[PDL_DROP_KINDS];
    pdl_ratelimit_t late_rl, expired_rl, ping_rl, send_rl;
} pdl_rank_t;

typedef struct pdl_held {
    uint32_t *ids;
    size_t n;
    int resolved;
    uint64_t rank_done[PDL_TOPO_MAX_TP / 64];
} pdl_held_t;

struct pdl_instance {
    pdl_instance_config_t cfg;
    char attn_backend[128];
    char engine_id[PDL_WIRE_HOST_MAX + 16];
    char zmq_address[2 * PDL_WIRE_HOST_MAX];
    void *zctx;
    pdl_blockalloc_t *blocks;
    int tp;
    pdl_rank_t *ranks; /* tp of them */
    atomic_bool stopping;

    pthread_mutex_t held_mu;
    pdl_strmap_t held; /* transfer id → pdl_held_t* */
    size_t held_blocks;

    /* WRITE mode (push.c): producer pushes by transfer id, parked remote_blocks by "rank|transfer id",
     * consumer receives by transfer id */
    pthread_mutex_t push_mu;
    pdl_strmap_t pushes, parked, recvs;

    pthread_mutex_t cb_mu;
    pdl_instance_event_fn event_fn;
    void *event_arg;
};

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
    char engine_id[PDL_WIRE_ID_MAX + 1];
    char host[PDL_WIRE_HOST_MAX + 1];
    int hs_base, notify_base;
    int remote_dp;
    int producer_tp;
    uint32_t *local_blocks, *remote_blocks;
    size_t n;

    /* pull_hook.h: per-rank work after a rank's reads; rank_arg is freed with the pull */
    void (*rank_fn)(void *arg, int tp_rank);
    void *rank_arg;
    void (*rank_arg_free)(void *arg);
};

/* instance.c */
void pdl__instance_rank_resolved(pdl_instance_t *inst, const char *transfer_id, int rank, bool expired);
void pdl__instance_emit(pdl_instance_t *inst, pdl_instance_event_t ev, const char *transfer_id, int rank);
void pdl__rank_count_drop(pdl_rank_t *r, pdl_drop_kind_t kind, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "tcp://host:port", brackets for IPv6; -1 if it does not fit. */
int pdl__endpoint(char *buf, size_t cap, const char *host, int port);

/* service.c */
pdl_status_t pdl__service_start(pdl_rank_t *r, pdl_error_t *err);
void pdl__service_stop(pdl_rank_t *r);
/* Send one frame on a DEALER from `cache` (created and connected on first use, evicted on error),
 * counting it; only the thread that owns `cache` may call this. */
bool pdl__dealer_send(pdl_rank_t *r, pdl_strmap_t *cache, const char *endpoint, int kind, const pdl_bytes_t *payload);
void pdl__dealers_close(pdl_strmap_t *cache);
/* Queue a message for the rank's service thread, for threads that own no DEALER cache (payload
 * ownership passes to the queue). */
pdl_status_t pdl__service_send(pdl_rank_t *r, const char *host, int port, int kind, pdl_bytes_t *payload,
                               pdl_error_t *err);

/* peer.c */
typedef struct pdl_peer pdl_peer_t;
struct pdl_peer {
    char key[PDL_WIRE_ID_MAX + 64];
    char remote_engine_key[PDL_WIRE_HOST_MAX + 64];
    pdl_agent_meta_t meta;
    pdl_session_t *session;
    pdl_kv_geometry_t geo;
    uint64_t layer_len;
};
/* The cached peer for producer rank `prank` of the pull's instance, handshaking if needed. */
pdl_status_t pdl__peer_get(pdl_rank_t *r, const pdl_pull_t *pull, int prank, pdl_peer_t **peer_out,
                           pdl_error_t *err);
/* Forget a peer after a failure that says it is gone (closes the session, removes the remote engine). */
void pdl__peer_evict(pdl_rank_t *r, pdl_peer_t *peer);
void pdl__peers_free(pdl_rank_t *r);

/* push.c */
pdl_status_t pdl__pusher_start(pdl_rank_t *r, pdl_error_t *err);
void pdl__pusher_stop(pdl_rank_t *r);
/* Service thread of rank r: a remote_blocks (producer) or write_done (consumer) message. */
void pdl__push_on_remote_blocks(pdl_rank_t *r, const pdl_msg_t *msg);
void pdl__push_on_write_done(pdl_rank_t *r, const pdl_msg_t *msg);
/* Service thread of rank r, every tick: reap pushes whose remote_blocks never came, stale parked
 * remote_blocks and consumer waits past transfer_timeout. */
void pdl__push_reap(pdl_rank_t *r);
/* instance destroy: free what the maps still hold (after every thread stopped). */
void pdl__push_free_all(pdl_instance_t *inst);

/* pull.c */
pdl_status_t pdl__worker_start(pdl_rank_t *r, pdl_error_t *err);
void pdl__worker_stop(pdl_rank_t *r);

#endif /* PDL_CONNECTOR_INTERNAL_H */
