/*
 * connector.h -- the MoRIIO-compatible connector runtime (SPEC §4, §5, §7).
 *
 * An *instance* is one serving instance (one `vllm serve`): `tp_size` TP ranks, each with its own
 * transfer engine, KV region (all layers of that rank), handshake ROUTER and notify ROUTER on
 * `base + dp_rank*tp_size + tp_rank`, and the instance-wide paged block allocator (block ids are the
 * same on every rank, as in vLLM). Rank 0 sends the discovery ping when `proxy_ip` is set.
 *
 * READ mode (the seed's flow):
 *   producer: pdl_instance_hold(transfer_id, blocks) after the prefill; each rank counts releases up
 *             to expected(P, D); the blocks are freed when every rank has reported, or reaped after
 *             defer_timeout (counted as expired).
 *   consumer: pdl_instance_pull(params, local blocks) → every rank handshakes (cached), reads its read
 *             plan per layer, releases every producer rank of its group; pdl_pull_wait gives the result.
 *
 * Threads: every function is thread-safe; each rank runs its own service thread.
 */
#ifndef PDLINK_CONNECTOR_H
#define PDLINK_CONNECTOR_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/engine.h"
#include "pdlink/layout.h"
#include "pdlink/params.h"
#include "pdlink/status.h"
#include "pdlink/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pdl_role {
    PDL_ROLE_PRODUCER = 1, /* kv_producer: prefill */
    PDL_ROLE_CONSUMER = 2, /* kv_consumer: decode */
} pdl_role_t;

/* kv_connector_extra_config, with MoRIIO's key names and defaults (SPEC §7). */
typedef struct pdl_connector_config {
    pdl_role_t role;
    char host_ip[PDL_WIRE_HOST_MAX + 1];   /* default 127.0.0.1 when absent */
    char proxy_ip[PDL_WIRE_HOST_MAX + 1];  /* "" = no discovery ping */
    int proxy_ping_port;
    int http_port;
    int handshake_port;                    /* base, default 6301 */
    int notify_port;                       /* base, default 61005 */
    bool read_mode;                        /* default false (WRITE) */
    pdl_backend_kind_t backend;            /* "rdma" maps to the best available one */
    bool backend_mapped_from_rdma;
    int qp_per_transfer;                   /* 1 */
    int num_workers;                       /* 1 */
    int post_batch_size;                   /* -1 */
    double transfer_timeout_s;             /* 30 */
    double defer_timeout_s;                /* 60 */
    double handshake_timeout_s;            /* 10 */
} pdl_connector_config_t;

void pdl_connector_config_defaults(pdl_connector_config_t *cfg);

/*
 * Parse a whole --kv-transfer-config JSON text, after resetting cfg to the defaults
 * ({"kv_connector": "MoRIIOConnector", "kv_role":
 * "kv_producer"|"kv_consumer"|"kv_both", "kv_connector_extra_config": {...}}). Unknown keys are logged
 * as warnings; a wrong value fails with an error naming the key and the value.
 */
pdl_status_t pdl_connector_config_parse(const char *json_text, pdl_connector_config_t *cfg, pdl_error_t *err);
/* Same, for an already parsed kv_connector_extra_config object (role is left as is). */
pdl_status_t pdl_connector_config_from_extra(const json_t *extra, pdl_connector_config_t *cfg, pdl_error_t *err);

/* The model's KV geometry as the whole instance sees it (per-rank heads derive from tp_size). */
typedef struct pdl_model_geometry {
    int num_layers;
    int total_kv_heads;
    int head_dim;
    int elem_size;
    int block_size;
    bool is_mla;
    pdl_kv_order_t order;
    bool kv_separate;
} pdl_model_geometry_t;

typedef struct pdl_instance_config {
    pdl_connector_config_t conn;
    pdl_model_geometry_t model;
    int tp_size;
    int dp_rank;
    int dp_size;
    uint32_t num_blocks;        /* KV blocks per rank (the same on every rank) */
    const char *attn_backend_name; /* advertised in the handshake; may be NULL */
    /* pdlink: accept read_mode false (WRITE mode). A program that serves WRITE mode (calls
     * pdl_instance_push / pdl_instance_expect_push for its requests, as pdlink-node does) sets this;
     * otherwise the instance refuses WRITE mode with PDL_ERR_UNSUPPORTED naming read_mode, so a
     * READ-only program never silently waits for pushes nobody sends. */
    bool allow_write_mode;
} pdl_instance_config_t;

typedef struct pdl_instance pdl_instance_t;

/* Creates engines, allocates and pre-faults KV memory, binds every rank's ports, starts threads. */
pdl_status_t pdl_instance_create(const pdl_instance_config_t *cfg, pdl_instance_t **inst_out, pdl_error_t *err);
void pdl_instance_destroy(pdl_instance_t *inst);

/* "host:handshake_base", the engine_id MoRIIO advertises. */
const char *pdl_instance_engine_id(const pdl_instance_t *inst);
/* "host:IP,handshake:PORT,notify:PORT" for discovery and request ids. */
const char *pdl_instance_zmq_address(const pdl_instance_t *inst);

/* KV memory of one rank: the geometry of each layer and a pointer to the layer's region. */
const pdl_kv_geometry_t *pdl_instance_geometry(const pdl_instance_t *inst, int tp_rank);
uint8_t *pdl_instance_kv_layer(pdl_instance_t *inst, int tp_rank, int layer);

/* Paged block allocator shared by all ranks. Fails with PDL_ERR_NOMEM naming free/needed counts. */
pdl_status_t pdl_instance_alloc_blocks(pdl_instance_t *inst, size_t n, uint32_t *ids_out, pdl_error_t *err);
void pdl_instance_free_blocks(pdl_instance_t *inst, const uint32_t *ids, size_t n);
size_t pdl_instance_free_block_count(pdl_instance_t *inst);

/*
 * Producer: hold `ids` under transfer_id until every rank reported the release fan-in (then they are
 * freed, whether the consumer reported ok or failed) or defer_timeout passes (freed, counted expired).
 * Ownership of the blocks passes to the instance. The KV in the blocks must be final before the call:
 * hold publishes it to the threads that serve remote reads.
 */
pdl_status_t pdl_instance_hold(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n,
                               pdl_error_t *err);
/* Transfers currently held (producer) and blocks they hold. */
size_t pdl_instance_held_transfers(pdl_instance_t *inst);
size_t pdl_instance_held_blocks(pdl_instance_t *inst);

/* The params a producer returns for a held transfer (READ mode); the caller owns the reference. */
json_t *pdl_instance_params_json(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n);

typedef struct pdl_pull pdl_pull_t;

/*
 * Consumer: read the KV of a producer's transfer into `local_blocks` on every rank (READ mode).
 * `params` are the producer's kv_transfer_params; `request_id` (may be NULL) supplies peer addresses
 * the way upstream does. Asynchronous: returns at once; wait with pdl_pull_wait.
 */
pdl_status_t pdl_instance_pull(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               const uint32_t *local_blocks, size_t n, pdl_pull_t **pull_out, pdl_error_t *err);
/* PDL_OK when every rank read its plan; otherwise the error (a load error: the blocks are invalid). */
pdl_status_t pdl_pull_wait(pdl_pull_t *pull, int timeout_ms, pdl_error_t *err);
/* Bytes read and descriptors posted by all ranks, available once finished. */
uint64_t pdl_pull_bytes(const pdl_pull_t *pull);
uint64_t pdl_pull_descriptors(const pdl_pull_t *pull);
void pdl_pull_free(pdl_pull_t *pull);

/* Counters per rank (SPEC §5). */
typedef struct pdl_rank_counters {
    uint64_t transfers;            /* completed (consumer: reads done; producer: fan-ins reported) */
    uint64_t bytes;                /* KV bytes read (consumer) */
    uint64_t descriptors;
    uint64_t read_ns;              /* total wall time of reads */
    uint64_t releases_sent;
    uint64_t releases_received;
    uint64_t releases_duplicate;
    uint64_t releases_late;
    uint64_t releases_parked;
    uint64_t releases_failed_status; /* releases that said status "failed" */
    uint64_t dropped_malformed;    /* notify + handshake frames dropped */
    uint64_t expired;              /* held transfers reaped after defer_timeout */
    uint64_t handshakes;
    uint64_t handshake_failures;
    uint64_t read_failures;
    /* added with the runtime (issue 5) */
    uint64_t releases_parked_dropped; /* parked releases dropped unused: too old, or the park was full */
    uint64_t keepalives_received;     /* keepalives that extended a lease */
    uint64_t keepalives_sent;
    uint64_t send_failures;           /* notify messages libzmq refused (the cached DEALER is evicted) */
    /* WRITE mode (push.c); `transfers`, `bytes`, `descriptors` count a producer rank's writes too, and
     * `expired` counts pushes reaped because their remote_blocks never came */
    uint64_t remote_blocks_sent;       /* consumer */
    uint64_t remote_blocks_received;   /* producer (including duplicates and parked ones) */
    uint64_t remote_blocks_parked;     /* producer: arrived before the push */
    uint64_t remote_blocks_dropped;    /* producer: duplicate, park full, or parked too long */
    uint64_t write_failures;           /* producer: a handshake or write of a push failed */
    uint64_t write_done_sent;          /* producer */
    uint64_t write_done_received;      /* consumer: counted toward a wait */
    uint64_t write_done_failed_status; /* consumer: write_done saying status "failed" */
    uint64_t write_done_late;          /* consumer: for no waiting transfer, or a duplicate */
} pdl_rank_counters_t;

pdl_status_t pdl_instance_counters(pdl_instance_t *inst, int tp_rank, pdl_rank_counters_t *out, pdl_error_t *err);
int pdl_instance_tp_size(const pdl_instance_t *inst);

/*
 * Events of held transfers, for programs that want to react (metrics, tests). RANK_REPORTED: a producer
 * rank's fan-in completed; RANK_EXPIRED: a rank reaped it after defer_timeout; FREED: every rank
 * resolved it and its blocks went back to the allocator. The function runs on a connector thread
 * (a rank's service thread, or the caller of pdl_instance_hold) with no connector lock held; it must
 * be quick and must not call pdl_instance_destroy.
 */
typedef enum pdl_instance_event {
    PDL_EVENT_RANK_REPORTED = 1,
    PDL_EVENT_RANK_EXPIRED = 2,
    PDL_EVENT_FREED = 3,
} pdl_instance_event_t;
typedef void (*pdl_instance_event_fn)(void *arg, pdl_instance_event_t ev, const char *transfer_id, int tp_rank);
void pdl_instance_set_event_fn(pdl_instance_t *inst, pdl_instance_event_fn fn, void *arg);

/*
 * WRITE mode (SPEC §5; heterogeneous TP, which upstream MoRIIO lacks).
 *
 * Producer: pdl_instance_push(params, request_id, ids) after the prefill (the KV must be final: push
 * publishes it). `params` are the prefill leg's kv_transfer_params: transfer_id, and the consumer's
 * TP size in remote_tp_size (else tp_size, else ours). The consumer's address comes from
 * remote_host/remote_handshake_port/remote_notify_port when all are present, else from the request
 * id's ___decode_addr_ part. Each producer rank waits for the consumer's remote_blocks (parked when
 * they come first), handshakes with the consumer ranks of its write plan, writes its pieces with one
 * batched WRITE per layer per target, and sends write_done (status ok/failed) to every consumer rank
 * of its notify set. The blocks are freed when every rank finished, or after defer_timeout for ranks
 * whose remote_blocks never came (counted expired); ownership passes to the instance.
 *
 * Consumer: pdl_instance_expect_push(params, request_id, local blocks) with the decode leg's params
 * (transfer_id, producer TP in remote_tp_size/tp_size, producer address as for a pull). Each consumer
 * rank d sends remote_blocks to the producer ranks p of its group for which d is the first consumer
 * whose group holds p -- so every producer rank gets the block list exactly once -- and counts
 * write_done up to pdl_topo_expected_write_done(P, D). pdl_recv_wait returns PDL_OK when every rank
 * counted them all with status ok; a failed status or transfer_timeout is an error (a load error: the
 * caller frees the blocks).
 */
typedef struct pdl_recv pdl_recv_t;
pdl_status_t pdl_instance_push(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               const uint32_t *ids, size_t n, pdl_error_t *err);
pdl_status_t pdl_instance_expect_push(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                      const uint32_t *local_blocks, size_t n, pdl_recv_t **recv_out, pdl_error_t *err);
pdl_status_t pdl_recv_wait(pdl_recv_t *rv, int timeout_ms, pdl_error_t *err);
/* write_done messages consumer rank `tp_rank` counted (ok or failed); -1 for a bad rank. */
int pdl_recv_write_done(pdl_recv_t *rv, int tp_rank);
/* Frees a receive; write_done arriving later are counted late. Call after pdl_recv_wait returned and
 * before pdl_instance_destroy. */
void pdl_recv_free(pdl_recv_t *rv);

/* Ports a rank actually listens on (base + dp_rank*tp_size + tp_rank). */
int pdl_instance_handshake_port(const pdl_instance_t *inst, int tp_rank);
int pdl_instance_notify_port(const pdl_instance_t *inst, int tp_rank);

/* CLOCK_MONOTONIC time in ns at which consumer rank `tp_rank` queued its releases; 0 if not yet. */
uint64_t pdl_pull_release_sent_ns(const pdl_pull_t *pull, int tp_rank);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_CONNECTOR_H */
