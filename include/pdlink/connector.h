/*
 * connector.h -- the MoRIIO-compatible connector runtime (docs/protocol.md, docs/connector.md).
 *
 * An *instance* is one serving instance (one `vllm serve`): `tp_size` TP ranks, each with its own
 * transfer engine, KV region (all layers of that rank), handshake ROUTER and notify ROUTER on
 * `base + dp_rank*tp_size + tp_rank`, and the instance-wide paged block allocator (block ids are the
 * same on every rank, as in vLLM). Rank 0 sends the discovery ping when `proxy_ip` is set.
 * One rank per process (`local_rank`, as vLLM runs one worker process per TP rank): the instance object
 * runs one rank only and everything below applies to that rank's share; the other ranks run in other
 * processes, each its own instance with the same config and another local_rank.
 * Caller-owned block ids (`external_blocks`, as vLLM's scheduler owns them): no allocator; holds and
 * transfers take any id below num_blocks, and the caller learns from PDL_EVENT_FREED when a held
 * transfer is over.
 *
 * READ mode (the seed's flow):
 *   producer: pdl_instance_hold(transfer_id, blocks) after the prefill; each rank counts releases up
 *             to expected(P, D); the blocks are freed when every rank has reported, or reaped after
 *             defer_timeout (counted as expired).
 *   consumer: pdl_instance_pull(params, local blocks) -> every rank handshakes (cached), reads its read
 *             plan per layer, releases every producer rank of its group; pdl_pull_wait gives the result.
 * WRITE mode: see pdl_instance_push below.
 *
 * Errors: a function returning pdl_status_t returns PDL_OK or one of the PDL_ERR_* codes named in its
 * comment, and fills `err` (which may be NULL) with a message naming the transfer, rank, key or value
 * at fault. On failure nothing changes hands: arguments stay the caller's.
 * Threads: every function is thread-safe; each rank runs its own threads. No function may be called
 * on an instance after (or while) pdl_instance_destroy runs.
 */
#ifndef PDLINK_CONNECTOR_H
#define PDLINK_CONNECTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/engine.h"
#include "pdlink/layout.h"
#include "pdlink/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a host name or address, without the NUL (the wire's limit, checked where they meet). */
#define PDL_CONNECTOR_HOST_MAX 256
#define PDL_CONNECTOR_TRUSTED_MAX 1023 /* bytes of trusted_hosts as text */
#define PDL_CONNECTOR_PREWARM_MAX 16    /* remote instances in prewarm_peers */

/* A remote instance connected at start-up (prewarm_peers): a producer of a READ decode, a consumer
 * (decode) of a WRITE prefill. */
typedef struct pdl_prewarm_peer {
    char host[PDL_CONNECTOR_HOST_MAX + 1];
    int handshake_port; /* its base handshake port (rank r of DP rank dp listens on base + dp * tp + r) */
    int tp;             /* its TP size; 0 = the same as ours */
    int dp;             /* its DP rank (0) */
} pdl_prewarm_peer_t;

/* kv_transfer_params (pdlink/params.h); the connector only takes and fills them. */
typedef struct pdl_kv_params pdl_kv_params_t;

typedef enum pdl_role {
    PDL_ROLE_PRODUCER = 1, /* kv_producer: prefill */
    PDL_ROLE_CONSUMER = 2, /* kv_consumer: decode */
} pdl_role_t;

/* kv_integrity: which pieces of a transfer the consumer checks against the producer's digests. */
typedef enum pdl_kv_integrity {
    PDL_KV_INTEGRITY_OFF = 0,    /* none; the producer answers digest requests with "off" */
    PDL_KV_INTEGRITY_SAMPLE = 1, /* one (layer, block) in PDL_DIGEST_SAMPLE_STRIDE */
    PDL_KV_INTEGRITY_FULL = 2,   /* every (layer, block, head) */
} pdl_kv_integrity_t;
/* "off", "sample", "full" ("invalid" otherwise); static. */
const char *pdl_kv_integrity_name(pdl_kv_integrity_t m);

/* kv_connector_extra_config, with MoRIIO's key names and defaults (docs/protocol.md#configuration). Start
 * from pdl_connector_config_defaults (or a parse function, which calls it): the struct grows by the rule
 * in pdlink/pdlink.h. */
typedef struct pdl_connector_config {
    pdl_role_t role;
    char host_ip[PDL_CONNECTOR_HOST_MAX + 1];  /* default 127.0.0.1 when absent */
    char proxy_ip[PDL_CONNECTOR_HOST_MAX + 1]; /* "" = no discovery ping */
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
    /* pdlink's keys (upstream has none of these): */
    double peer_backoff_s;          /* 2: a failed peer is refused at once for this long, then retried */
    double peer_backoff_max_s;      /* 30: the backoff doubles per consecutive failure up to this */
    double consumer_gone_timeout_s; /* 5: a producer frees the holds of a consumer unreachable this long */
    bool bind_all; /* false: handshake, notify and data ports listen on host_ip only; true: on every address */
    /* Comma-separated addresses/CIDRs a decode may dial and a producer serves; "" = everyone. */
    char trusted_hosts[PDL_CONNECTOR_TRUSTED_MAX + 1];
    /* READ-mode decode: producers, WRITE-mode prefill: consumers, to handshake with and map at
     * start-up, in the background, retried with peer_backoff until reachable (prewarm.c); more are
     * learnt from requests. */
    pdl_prewarm_peer_t prewarm_peers[PDL_CONNECTOR_PREWARM_MAX];
    int num_prewarm_peers;
    /* Authenticated mode (docs/security.md): the cluster key file; "" = compatible mode. With it, the
     * handshake and notify ROUTERs and every DEALER (discovery ping, releases, handshakes) use CURVE
     * under the cluster key pair, and every tcp data connection proves the key before it is served. */
    char auth_key_file[PDL_CONNECTOR_HOST_MAX + 1];
    /* Zero a block's bytes on every rank (every layer, K and V) before it goes back to the allocator,
     * so freed blocks do not keep earlier prompts' KV (docs/security.md). Costs a memset per free. */
    bool scrub_freed_blocks;
    /* KV digests (docs/integrity.md): the consumer checks what landed against the producer's digests. */
    pdl_kv_integrity_t kv_integrity; /* PDL_KV_INTEGRITY_OFF until the digest fetch is cheap (docs/integrity.md) */
} pdl_connector_config_t;

/* Fill cfg with MoRIIO's defaults (role consumer, as upstream takes any kv_role but kv_producer); the
 * defaults of the extra config keys are those pdl_connector_config_key lists. Fields added later get the
 * value that keeps the earlier behaviour. Cannot fail. */
void pdl_connector_config_defaults(pdl_connector_config_t *cfg);

/*
 * One key of kv_connector_extra_config, as the parser reads it (pdlink-node --help-config prints them;
 * docs/connector.md lists the same). The strings are static; range is a copy.
 */
typedef struct pdl_connector_config_key {
    const char *name; /* the JSON key, e.g. "read_mode" */
    const char *type; /* string, port, integer, seconds, bool, backend, hosts or peers */
    const char *def;  /* the default as text; "" = empty */
    char range[192];  /* the values accepted, worded as a wrong value's error message words them */
    const char *doc;  /* what it means; pdlink's own keys (upstream has none of them) start "pdlink: " */
} pdl_connector_config_key_t;

/* Fill *key with row i of the key table (0, 1, ... in a fixed order). Returns false, leaving *key
 * untouched, when i is past the last row or key is NULL. Cannot fail otherwise. */
bool pdl_connector_config_key(size_t i, pdl_connector_config_key_t *key);

/*
 * Parse a whole --kv-transfer-config JSON text, after resetting cfg to the defaults
 * ({"kv_connector": "MoRIIOConnector", "kv_role": "kv_producer"|"kv_consumer"|"kv_both",
 * "kv_connector_extra_config": {...}}). Unknown keys are logged as warnings.
 * Fails with PDL_ERR_PARSE (not JSON) or PDL_ERR_INVALID (a wrong value: the message names the key and
 * the value); cfg is then partly filled and must not be used.
 */
pdl_status_t pdl_connector_config_parse(const char *json_text, pdl_connector_config_t *cfg, pdl_error_t *err);
/* Same, but an unknown kv_connector_extra_config key (one that is neither in pdl_connector_config_key's
 * table nor accepted-and-ignored) is an error, PDL_ERR_INVALID, naming the key and the nearest known one
 * ("did you mean"). What a process runs before it starts anything (vLLM's scheduler, pdlink check-config). */
pdl_status_t pdl_connector_config_check(const char *json_text, pdl_connector_config_t *cfg, pdl_error_t *err);
/* Same, for the kv_connector_extra_config object alone, given as JSON text; cfg is NOT reset first and
 * cfg->role is left as is. Fails like pdl_connector_config_parse. */
pdl_status_t pdl_connector_config_from_extra(const char *extra_json, pdl_connector_config_t *cfg, pdl_error_t *err);

/*
 * Add one prewarm_peers entry, "HOST:PORT[:TP[:DP]]" (an IPv6 host in brackets: "[::1]:7000:8"): the
 * remote instance's (a producer; in WRITE mode a consumer) host, base handshake port, TP size (omitted or 0: ours) and DP rank (0). An entry
 * already listed is not added twice. Fails with PDL_ERR_INVALID naming the entry (empty or too long
 * host, a port outside 1-65535, a TP outside 0-PDL_TOPO_MAX_TP, a DP outside 0-1023, junk after the
 * fields, more than PDL_CONNECTOR_PREWARM_MAX entries); cfg is then unchanged.
 */
pdl_status_t pdl_connector_config_add_prewarm(pdl_connector_config_t *cfg, const char *spec, pdl_error_t *err);

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
    /* vLLM's CPU cache: one half per block, each head's row of a token is K then V (2 * head_dim
     * elements; layout.h). Handshakes carry it in `layout` ("hnd-fused"), so a fused and a non-fused
     * peer refuse each other (PDL_ERR_MISMATCH) instead of mixing bytes. */
    bool kv_fused;
} pdl_model_geometry_t;

/* What pdl_instance_create needs. Start from pdl_instance_config_defaults and set fields by name: the
 * struct grows by the rule in pdlink/pdlink.h. */
typedef struct pdl_instance_config {
    pdl_connector_config_t conn;
    pdl_model_geometry_t model;
    int tp_size;
    int dp_rank;
    int dp_size;
    uint32_t num_blocks;           /* KV blocks per rank (the same on every rank) */
    const char *attn_backend_name; /* advertised in the handshake; may be NULL; copied */
    /* Accept read_mode false (WRITE mode). A program that serves WRITE mode (calls pdl_instance_push /
     * pdl_instance_expect_push for its requests, as pdlink-node does) sets this; otherwise the instance
     * refuses WRITE mode, so a READ-only program never silently waits for pushes nobody sends. */
    bool allow_write_mode;
    /* KV memory the caller owns (NULL: the instance allocates and pre-faults its own, the default).
     * When set, kv_regions[r] (r < tp_size) is rank r's region, all layers one after the other (layer l
     * at l * its layer length, the layout of pdl_instance_kv_layer), at least
     * pdl_instance_kv_region_len(cfg, r) bytes, given in kv_region_lens[r]. The instance registers each
     * region with its rank's engine and neither copies, clears nor frees it: keep every region valid
     * until pdl_instance_destroy returned. The two arrays are read during pdl_instance_create only.
     * This is how a host program (the Python package, a vLLM worker) makes pdlink move its own KV
     * cache tensors instead of copying them in and out of the instance's memory. */
    void *const *kv_regions;
    const size_t *kv_region_lens;
    /* Where kv_regions live: PDL_MEM_TYPE_HOST (0, what a zeroed config says) or PDL_MEM_TYPE_CUDA (a
     * torch CUDA tensor, cuMemAlloc'd memory). Device regions are registered with
     * pdl_engine_register_mem_type, so conn.backend must register that type: "cuda" (GPUs of one host),
     * "tcp" where the CUDA driver loads (staged through pinned host memory, any two hosts) or a "ucx"
     * built with CUDA. Refused with PDL_ERR_UNSUPPORTED, naming the keys: device memory on shm and ROCm
     * on tcp (before any engine), an engine that does not report the type in pdl_engine_mem_types (once
     * it exists, before any registration: tcp without the driver, ucx without support), backend "cuda"
     * with host regions or with no kv_regions (the instance allocates host memory only).
     * The CPU never reads or writes a device region: zeroing (pdl_instance_zero_tail,
     * scrub_freed_blocks) runs on the device through the engine, and pdl_instance_kv_layer then returns
     * a device pointer. Applies to kv_layer_regions the same way. */
    pdl_mem_type_t kv_mem_type;
    /* -1 (the default, and what a zeroed config must be set to: pdl_instance_config_defaults): every
     * rank runs in this instance. r in [0, tp_size): this instance runs rank r only -- its engine, KV
     * region (kv_regions[r]; other entries are ignored and may be NULL), ports (base + dp_rank*tp_size
     * + r), threads and counters; ranks of other processes are not contacted. A producer transfer is
     * held until THIS rank resolved it (the other ranks' processes count their own releases); a pull,
     * push, expect_push or abandon does this rank's share (a consumer rank reads its read plan and
     * releases every producer rank of its group, as always). Only local_rank 0 (or -1) sends the
     * discovery ping. Rank-indexed functions given another rank fail (PDL_ERR_INVALID, NULL, -1 or 0
     * as each documents). */
    int local_rank;
    /* Block ids belong to the caller (vLLM's scheduler, with prefix caching two requests may share
     * blocks): the instance has no allocator (pdl_instance_alloc_blocks fails with
     * PDL_ERR_UNSUPPORTED, free is a no-op, free_block_count is 0); hold, pull, push and expect_push
     * take any id below num_blocks, holds may overlap (the engine serves a block while any transfer
     * holding it is held, and still refuses reads outside every held block), and a resolved hold frees
     * nothing: PDL_EVENT_FREED (once per transfer, after the local rank(s) resolved it) tells the
     * caller it may reuse the blocks. */
    bool external_blocks;
    /* KV memory the caller owns, one region per layer (NULL: kv_regions or the instance's own), as
     * vLLM's GPU model runner allocates it: one tensor per layer at unrelated addresses (and a CUDA IPC
     * handle covers one allocation). kv_layer_regions[r][l] (r < tp_size, l < num_layers) is layer l of
     * rank r, at least one layer's length (pdl_instance_kv_region_len / num_layers) bytes, given in
     * kv_layer_region_lens[r][l]; entries of ranks other than local_rank are ignored and may be NULL.
     * Each layer is registered separately (kv_mem_type, never cleared nor freed: keep it valid until
     * pdl_instance_destroy returned) and advertised with its own memory descriptor; a peer opens a
     * session per layer. Exclusive with kv_regions (both set: PDL_ERR_INVALID). Read during
     * pdl_instance_create only. Peers of any pdlink version that speaks per-layer maps read and write
     * such an instance; an older pdlink peer, which assumes one registration, is refused by the engine
     * (its offsets past the first layer fall outside layer 0's registration). */
    void *const *const *kv_layer_regions;
    const size_t *const *kv_layer_region_lens;
} pdl_instance_config_t;

/* Zero cfg and set the defaults of every field that is not 0: conn (pdl_connector_config_defaults),
 * dp_size 1, local_rank -1. The caller sets model, tp_size and num_blocks. Cannot fail. */
void pdl_instance_config_defaults(pdl_instance_config_t *cfg);

/*
 * Bytes rank tp_rank's KV region holds for `cfg` (every layer): what pdl_instance_create allocates, and
 * the minimum of kv_region_lens[tp_rank] for caller-owned regions. Reads cfg->model, tp_size and
 * num_blocks only. Fails with PDL_ERR_INVALID (a bad rank or geometry, named); *len_out is set only on
 * success.
 */
pdl_status_t pdl_instance_kv_region_len(const pdl_instance_config_t *cfg, int tp_rank, uint64_t *len_out,
                                        pdl_error_t *err);

typedef struct pdl_instance pdl_instance_t;

/*
 * Create an instance: engines, pre-faulted KV memory, every rank's ports bound, threads started.
 * On success *inst_out is the caller's, to release with pdl_instance_destroy. Fails with
 * PDL_ERR_INVALID (a bad size, port range or geometry, named), PDL_ERR_UNSUPPORTED (WRITE mode without
 * allow_write_mode), PDL_ERR_TRANSPORT (a port cannot be bound: "bind failed: Address already in use"),
 * PDL_ERR_NOMEM or PDL_ERR_SYSTEM; nothing is left behind.
 */
pdl_status_t pdl_instance_create(const pdl_instance_config_t *cfg, pdl_instance_t **inst_out, pdl_error_t *err);
/* Stop every thread (queued pulls fail and release their producers), close every socket, free
 * everything the instance owns, held blocks included. Pulls and receives still held by the caller
 * must be freed before. NULL is ignored. */
void pdl_instance_destroy(pdl_instance_t *inst);

/* The rank this instance runs (local_rank), or -1 when it runs every rank. */
int pdl_instance_local_rank(const pdl_instance_t *inst);
/* "host:handshake_base", the engine_id MoRIIO advertises. Owned by the instance. */
const char *pdl_instance_engine_id(const pdl_instance_t *inst);
/* "host:IP,handshake:PORT,notify:PORT" for discovery and request ids. Owned by the instance. */
const char *pdl_instance_zmq_address(const pdl_instance_t *inst);
int pdl_instance_tp_size(const pdl_instance_t *inst);
/* Ports a rank actually listens on (base + dp_rank*tp_size + tp_rank); -1 for a bad or non-local rank. */
int pdl_instance_handshake_port(const pdl_instance_t *inst, int tp_rank);
int pdl_instance_notify_port(const pdl_instance_t *inst, int tp_rank);

/* KV memory of one rank, owned by the instance: the geometry of each layer and a pointer to the
 * layer's region (kv_layer_regions: that layer's own region). NULL for a bad or non-local rank, or a
 * bad layer. With kv_mem_type
 * PDL_MEM_TYPE_CUDA the pointer is a device address: the CPU must not dereference it. */
const pdl_kv_geometry_t *pdl_instance_geometry(const pdl_instance_t *inst, int tp_rank);
uint8_t *pdl_instance_kv_layer(pdl_instance_t *inst, int tp_rank, int layer);

/* Paged block allocator shared by all ranks. alloc writes n ids to ids_out (the caller owns the
 * blocks until it frees them or hands them over); fails with PDL_ERR_NOMEM naming free/needed counts,
 * allocating nothing. free takes back blocks the caller owns (ids not allocated are logged, ignored).
 * With external_blocks there is no allocator: alloc fails with PDL_ERR_UNSUPPORTED, free does nothing,
 * free_block_count is 0. */
pdl_status_t pdl_instance_alloc_blocks(pdl_instance_t *inst, size_t n, uint32_t *ids_out, pdl_error_t *err);
void pdl_instance_free_blocks(pdl_instance_t *inst, const uint32_t *ids, size_t n);
size_t pdl_instance_free_block_count(pdl_instance_t *inst);

/*
 * Producer (READ mode): hold `ids` under transfer_id until every rank reported the release fan-in
 * (then they are freed, whether the consumer reported ok or failed) or defer_timeout passes (freed,
 * counted expired); with local_rank, "every rank" is that one rank. On success the blocks belong to
 * the instance. The KV in the blocks must be final
 * before the call: hold publishes it to the threads that serve remote reads.
 * Fails with PDL_ERR_INVALID (empty or too long id, no blocks, blocks not allocated -- with
 * external_blocks: an id not below num_blocks), PDL_ERR_BAD_STATE (transfer_id already held) or
 * PDL_ERR_NOMEM; the blocks stay the caller's. With external_blocks the blocks stay the caller's
 * anyway (nothing is freed: wait for PDL_EVENT_FREED before reusing them), and other holds may name
 * the same blocks.
 */
pdl_status_t pdl_instance_hold(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n,
                               pdl_error_t *err);
/*
 * The same, for the consumer named by `request_id` (MoRIIO's "___prefill_addr_..___decode_addr_.._hex";
 * may be NULL or carry no decode address: then it is pdl_instance_hold). The producer probes that
 * consumer's handshake port while it holds KV for it, and when the consumer is gone -- its port refuses
 * connections twice in a row, nothing answered for consumer_gone_timeout, or another process answers
 * there (its handshake metadata differs: restarted) -- frees its holds at once (counted in
 * consumer_gone_freed, events RANK_EXPIRED and FREED) instead of after defer_timeout.
 * Fails like pdl_instance_hold.
 */
pdl_status_t pdl_instance_hold_for(pdl_instance_t *inst, const char *transfer_id, const char *request_id,
                                   const uint32_t *ids, size_t n, pdl_error_t *err);
/*
 * Zero the rows of the last of the n blocks `ids` that lie past a prompt of num_tokens tokens, in
 * every layer and half, on every local rank (host memory with the CPU, device memory on the device).
 * Call it after the prefill and before pdl_instance_hold / _hold_for / _push: the consumer reads and
 * the producer pushes whole blocks, and a block's unused rows still hold whatever request used the
 * block before, which the consumer must never see. Costs at most one block's rows per layer.
 * PDL_ERR_INVALID when num_tokens does not need exactly n blocks ((n - 1) * block_size < num_tokens
 * <= n * block_size) or a block id is out of range; PDL_ERR_UNSUPPORTED as pdl_mem_zero.
 */
pdl_status_t pdl_instance_zero_tail(pdl_instance_t *inst, const uint32_t *ids, size_t n, uint64_t num_tokens,
                                    pdl_error_t *err);
/*
 * READ producer: end the hold of transfer_id now, whatever its releases: every local rank revokes its
 * grants (a read not yet served is refused; one being served finishes first, as when a release frees
 * the hold) and the record goes. With the instance's own allocator the blocks go back to it (scrubbed
 * when scrub_freed_blocks is set); with external_blocks they are the caller's again on return. No
 * PDL_EVENT_FREED follows: the caller asked for it. For a hold whose params will never reach a decode
 * (the request was aborted or preempted after the hold), so the record does not wait for defer_timeout.
 * Fails with PDL_ERR_NOT_FOUND (no such hold on this instance: never made, already freed or dropped),
 * PDL_ERR_UNSUPPORTED (a WRITE-mode instance: pdl_instance_abandon gives a push up) or PDL_ERR_INVALID
 * (NULL transfer_id).
 */
pdl_status_t pdl_instance_drop(pdl_instance_t *inst, const char *transfer_id, pdl_error_t *err);
/* Transfers currently held (producer) and blocks they hold (a block two overlapping holds name, with
 * external_blocks, counts twice). A transfer counts until its blocks are back
 * in the allocator and its PDL_EVENT_FREED has been delivered, so 0 means all of that happened. */
size_t pdl_instance_held_transfers(pdl_instance_t *inst);
size_t pdl_instance_held_blocks(pdl_instance_t *inst);
/* Peers (a local rank and a producer rank it reads from, or in WRITE mode a consumer rank it writes to)
 * the background prewarm still has to connect: prewarm_peers not yet reachable, peers just learnt from
 * a request, ones evicted after a failure. 0 means every known peer is handshaked and mapped, so no
 * pull or push pays for it (counter transfer_handshakes). 0 for NULL and for an instance that moves no KV itself (a READ-mode producer, a
 * WRITE-mode consumer). */
size_t pdl_instance_prewarm_pending(pdl_instance_t *inst);

/*
 * The kv_transfer_params a producer returns for a held transfer (READ mode): out is initialised and
 * filled (its block list is a copy); the caller releases it with pdl_kv_params_clear (params.h) and
 * turns it into JSON text with pdl_kv_params_format. Fails with PDL_ERR_NOMEM (out then holds nothing).
 */
pdl_status_t pdl_instance_params(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n,
                                 pdl_kv_params_t *out, pdl_error_t *err);

typedef struct pdl_pull pdl_pull_t;

/*
 * Consumer (READ mode): read the KV of a producer's transfer into `local_blocks` on every rank.
 * `params` are the producer's kv_transfer_params; `request_id` (may be NULL) supplies peer addresses
 * the way upstream does. Both are copied. Asynchronous: returns at once; wait with pdl_pull_wait and
 * release *pull_out with pdl_pull_free. The local blocks stay the caller's but must not be freed or
 * written before the pull finished. Fails with PDL_ERR_INVALID (missing transfer_id, block list, peer
 * address, or a TP/port combination that cannot work, named), PDL_ERR_BAD_STATE (shutting down) or
 * PDL_ERR_NOMEM.
 */
pdl_status_t pdl_instance_pull(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               const uint32_t *local_blocks, size_t n, pdl_pull_t **pull_out, pdl_error_t *err);
/* Wait up to timeout_ms (< 0: forever). PDL_OK when every rank read its plan; PDL_INPROGRESS when
 * ranks are still reading (the wait ran out, not the pull: wait again or free it); otherwise the first rank's error
 * (a load error: the blocks hold garbage), e.g. PDL_ERR_TRANSPORT, PDL_ERR_MISMATCH, PDL_ERR_PEER_GONE. */
pdl_status_t pdl_pull_wait(pdl_pull_t *pull, int timeout_ms, pdl_error_t *err);
/* Bytes read and descriptors posted by all ranks, final once the pull finished. */
uint64_t pdl_pull_bytes(const pdl_pull_t *pull);
uint64_t pdl_pull_descriptors(const pdl_pull_t *pull);
/* CLOCK_MONOTONIC time in ns at which consumer rank `tp_rank` queued its releases; 0 if not yet. */
uint64_t pdl_pull_release_sent_ns(const pdl_pull_t *pull, int tp_rank);
/* Release the caller's reference; never waits (ranks still reading keep their own). NULL is ignored. */
void pdl_pull_free(pdl_pull_t *pull);

/*
 * This side will not take part in the transfer named by `params` (and `request_id`, as for a pull or a
 * push): the request was rejected or failed before its pull, receive or push. Tells the peer at once so
 * nothing stays pinned until a timeout:
 *   READ consumer  -- the releases a failed pull would send (status "failed"), from every rank: the
 *                     producer frees its blocks now instead of after its defer_timeout;
 *   WRITE consumer -- a failed-status release to every producer rank (once each): a pdlink producer
 *                     frees the push's blocks now (a rank already writing finishes first), or, before the
 *                     push exists, as soon as it is made (from the push's consumer host only, or the
 *                     router's: docs/security.md);
 *   WRITE producer -- the failed write_done a failed push sends, to every consumer rank: the decode's
 *                     receive fails now instead of at transfer_timeout, so it frees its blocks.
 * Asynchronous: the messages are queued on the ranks' service threads. Never call it for a transfer that
 * was pulled, received or pushed (its messages are already sent). Fails with PDL_ERR_INVALID (no
 * transfer_id or peer address, an impossible TP pair; named), PDL_ERR_UNSUPPORTED (a READ-mode
 * producer) or PDL_ERR_NOMEM; messages queued before a failure still leave.
 */
pdl_status_t pdl_instance_abandon(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                  pdl_error_t *err);

/*
 * Counters per rank, one table for the struct, the Prometheus names, types and help text:
 * X(field, metric name, kind, help). PDL_COUNTER_NS fields hold nanoseconds and are exported in
 * seconds. Releases and keepalives received come from the producer's fan-in.
 */
typedef enum pdl_counter_kind {
    PDL_COUNTER_COUNT = 0, /* a count, exported as is */
    PDL_COUNTER_NS = 1,    /* nanoseconds, exported as seconds */
} pdl_counter_kind_t;

#define PDL_RANK_COUNTERS(X)                                                                                        \
    X(transfers, "pdlink_transfers_total", PDL_COUNTER_COUNT,                                                       \
      "Transfers completed by this rank (consumer: reads done; producer: fan-ins reported, pushes written).")     \
    X(bytes, "pdlink_kv_bytes_total", PDL_COUNTER_COUNT, "KV bytes moved by reads or writes of this rank.")        \
    X(descriptors, "pdlink_descriptors_total", PDL_COUNTER_COUNT, "Transfer descriptors posted by this rank.")     \
    X(read_ns, "pdlink_read_seconds_total", PDL_COUNTER_NS, "Wall time of reads on this rank (READ mode).")        \
    X(write_ns, "pdlink_write_seconds_total", PDL_COUNTER_NS,                                                       \
      "Wall time of writes on this rank (WRITE mode), less the waits for a push's next layer.")                   \
    X(releases_sent, "pdlink_releases_sent_total", PDL_COUNTER_COUNT, "Release messages sent.")                   \
    X(releases_received, "pdlink_releases_received_total", PDL_COUNTER_COUNT, "Release messages received.")       \
    X(releases_duplicate, "pdlink_releases_duplicate_total", PDL_COUNTER_COUNT, "Duplicate releases received.")   \
    X(releases_late, "pdlink_releases_late_total", PDL_COUNTER_COUNT,                                               \
      "Releases for finished or expired transfers.")                                                              \
    X(releases_parked, "pdlink_releases_parked_total", PDL_COUNTER_COUNT,                                           \
      "Releases that arrived before the transfer was held.")                                                      \
    X(releases_failed_status, "pdlink_releases_failed_total", PDL_COUNTER_COUNT,                                    \
      "Releases that reported a failed read.")                                                                    \
    X(dropped_malformed, "pdlink_dropped_malformed_total", PDL_COUNTER_COUNT,                                       \
      "Malformed notify and handshake frames dropped.")                                                           \
    X(expired, "pdlink_expired_total", PDL_COUNTER_COUNT,                                                           \
      "Held transfers (and pushes without remote_blocks) reaped after defer_timeout.")                            \
    X(handshakes, "pdlink_handshakes_total", PDL_COUNTER_COUNT, "Handshakes completed (served or made).")         \
    X(handshake_failures, "pdlink_handshake_failures_total", PDL_COUNTER_COUNT, "Handshakes that failed.")        \
    X(read_failures, "pdlink_read_failures_total", PDL_COUNTER_COUNT, "Reads that failed.")                       \
    X(releases_parked_dropped, "pdlink_releases_parked_dropped_total", PDL_COUNTER_COUNT,                           \
      "Parked releases dropped unused: too old, or the park was full.")                                           \
    X(keepalives_received, "pdlink_keepalives_received_total", PDL_COUNTER_COUNT,                                   \
      "Keepalives that extended a lease (producer).")                                                             \
    X(keepalives_sent, "pdlink_keepalives_sent_total", PDL_COUNTER_COUNT, "Keepalives sent (consumer).")          \
    X(send_failures, "pdlink_send_failures_total", PDL_COUNTER_COUNT,                                               \
      "Notify messages libzmq refused (the cached socket is evicted).")                                           \
    X(remote_blocks_sent, "pdlink_remote_blocks_sent_total", PDL_COUNTER_COUNT,                                     \
      "WRITE mode: remote_blocks messages sent (decode).")                                                        \
    X(remote_blocks_received, "pdlink_remote_blocks_received_total", PDL_COUNTER_COUNT,                             \
      "WRITE mode: remote_blocks messages received (prefill).")                                                   \
    X(remote_blocks_parked, "pdlink_remote_blocks_parked_total", PDL_COUNTER_COUNT,                                 \
      "WRITE mode: remote_blocks that arrived before the push.")                                                  \
    X(remote_blocks_dropped, "pdlink_remote_blocks_dropped_total", PDL_COUNTER_COUNT,                               \
      "WRITE mode: remote_blocks dropped: duplicate, park full, or parked too long.")                             \
    X(write_failures, "pdlink_write_failures_total", PDL_COUNTER_COUNT,                                             \
      "WRITE mode: pushes whose handshake or write failed.")                                                      \
    X(write_done_sent, "pdlink_write_done_sent_total", PDL_COUNTER_COUNT,                                           \
      "WRITE mode: write_done messages sent (prefill).")                                                          \
    X(write_done_received, "pdlink_write_done_received_total", PDL_COUNTER_COUNT,                                   \
      "WRITE mode: write_done messages counted (decode).")                                                        \
    X(write_done_failed_status, "pdlink_write_done_failed_total", PDL_COUNTER_COUNT,                                \
      "WRITE mode: write_done messages saying failed.")                                                           \
    X(write_done_late, "pdlink_write_done_late_total", PDL_COUNTER_COUNT,                                           \
      "WRITE mode: write_done for no waiting transfer, or a duplicate (decode).")                                 \
    X(peer_backoff_refusals, "pdlink_peer_backoff_refusals_total", PDL_COUNTER_COUNT,                               \
      "Transfers failed at once because their peer failed recently (peer_backoff).")                             \
    X(stale_retries, "pdlink_stale_session_retries_total", PDL_COUNTER_COUNT,                                       \
      "Transfers retried once after a fresh handshake because a cached session was stale (peer restarted).")     \
    X(transfers_abandoned, "pdlink_transfers_abandoned_total", PDL_COUNTER_COUNT,                                   \
      "Transfers the consumer will not pull: failed releases sent at once (pdl_instance_abandon, decode).")      \
    X(consumer_gone_freed, "pdlink_consumer_gone_freed_total", PDL_COUNTER_COUNT,                                   \
      "Held transfers (READ holds, WRITE pushes) given up early: their consumer was gone (prefill rank 0).")     \
    X(watch_identities, "pdlink_watch_identities_total", PDL_COUNTER_COUNT,                                         \
      "Peer watch probes answered with the peer's process identity (rank 0; watch.c).")                         \
    X(watch_refused, "pdlink_watch_refused_total", PDL_COUNTER_COUNT,                                               \
      "Peer watch probes refused: nothing listened on the peer's handshake port (rank 0; watch.c).")            \
    X(identities_served, "pdlink_identities_served_total", PDL_COUNTER_COUNT,                                       \
      "Identity requests (pdlink_get_identity) answered on the handshake port; not handshakes.")                \
    X(peer_backoff_cleared, "pdlink_peer_backoff_cleared_total", PDL_COUNTER_COUNT,                                 \
      "Peers in backoff after a refusal let through early: their handshake port accepted a connect again.")     \
    X(producer_gone_failed, "pdlink_producer_gone_failed_total", PDL_COUNTER_COUNT,                                 \
      "Receives (WRITE decode) failed at once because a producer rank they wait on was gone (rank 0).")          \
    X(remote_blocks_given_up, "pdlink_remote_blocks_given_up_total", PDL_COUNTER_COUNT,                             \
      "remote_blocks for a push this rank had given up, answered with a failed write_done (WRITE prefill).")     \
    X(data_requests_served, "pdlink_data_requests_served_total", PDL_COUNTER_COUNT,                                 \
      "Remote READ/WRITE requests this rank's tcp engine served (inside a grant).")                              \
    X(data_requests_denied, "pdlink_data_requests_denied_total", PDL_COUNTER_COUNT,                                 \
      "Remote READ/WRITE requests refused for want of a grant: 0 bytes read or written (docs/security.md).")     \
    X(peer_identity_refused, "pdlink_peer_identity_refused_total", PDL_COUNTER_COUNT,                               \
      "Transfers refused: the engine id they claim is not the verified identity of the address (security.md).") \
    X(untrusted_refused, "pdlink_untrusted_refused_total", PDL_COUNTER_COUNT,                                       \
      "Transfers or data connections refused: the peer's host is not in trusted_hosts (docs/security.md).")      \
    X(releases_refused, "pdlink_releases_refused_total", PDL_COUNTER_COUNT,                                         \
      "Releases dropped (WRITE: abandons too): sent from another host than the transfer's consumer (security.md).") \
    X(data_connections_shed, "pdlink_data_connections_shed_total", PDL_COUNTER_COUNT,                               \
      "tcp engine: data connections accepted and closed at once because the process was out of descriptors.")    \
    X(pushes_abandoned, "pdlink_pushes_abandoned_total", PDL_COUNTER_COUNT,                                         \
      "WRITE mode: failed releases a prefill rank acted on: push freed now or when made, or its layer wait ended.") \
    X(listener_pauses, "pdlink_listener_pauses_total", PDL_COUNTER_COUNT,                                           \
      "Handshake/notify ROUTERs unbound for a while because the process was out of descriptors (libzmq spins).") \
    X(prewarm_handshakes, "pdlink_prewarm_handshakes_total", PDL_COUNTER_COUNT,                                     \
      "Peers handshaked, opened and mapped ahead of need by the background prewarm (READ decode, WRITE prefill).") \
    X(prewarm_evictions, "pdlink_prewarm_evictions_total", PDL_COUNTER_COUNT,                                       \
      "Rank pairs of learnt peers the prewarm forgot: failing for 2 x peer_backoff_max, or to make room.")         \
    X(transfer_handshakes, "pdlink_transfer_handshakes_total", PDL_COUNTER_COUNT,                                   \
      "Handshakes (with the session open and mapping) a transfer had to wait for: 0 when prewarm was in time.")  \
    X(auth_refused, "pdlink_auth_refused_total", PDL_COUNTER_COUNT,                                                 \
      "Authenticated mode: connections refused for want of the cluster key (ZeroMQ ZAP, tcp data challenge).")  \
    X(keepalives_refused, "pdlink_keepalives_refused_total", PDL_COUNTER_COUNT,                                     \
      "Keepalives dropped: sent from another host than the transfer's consumer (docs/security.md).")             \
    X(write_done_refused, "pdlink_write_done_refused_total", PDL_COUNTER_COUNT,                                     \
      "WRITE mode: write_done dropped: sent from another host than the producer the receive names (decode).")    \
    X(remote_blocks_refused, "pdlink_remote_blocks_refused_total", PDL_COUNTER_COUNT,                               \
      "WRITE mode: remote_blocks refused: another host than the push's consumer, or more ids than num_blocks.")  \
    X(remote_blocks_evicted, "pdlink_remote_blocks_evicted_total", PDL_COUNTER_COUNT,                               \
      "WRITE mode: parked remote_blocks evicted from the full park table (the host holding most of it loses).")  \
    X(releases_unverified, "pdlink_releases_unverified_total", PDL_COUNTER_COUNT,                                   \
      "Failed releases not sent: no handshake with that producer ever succeeded here (docs/security.md).")        \
    X(dealers_refused, "pdlink_dealers_refused_total", PDL_COUNTER_COUNT,                                           \
      "Notify messages not sent: the outbound socket cap was reached and nothing could be evicted (sender.c).")   \
    X(dealers_evicted, "pdlink_dealers_evicted_total", PDL_COUNTER_COUNT,                                           \
      "Outbound notify sockets closed early to stay under the socket cap (sender.c).")                            \
    X(push_layer_waits, "pdlink_push_layer_waits_total", PDL_COUNTER_COUNT,                                         \
      "WRITE mode: times a writer had written every final layer of a push and waited for more (push_start).")    \
    X(kv_digest_mismatches, "pdlink_kv_digest_mismatches_total", PDL_COUNTER_COUNT,                                 \
      "KV pieces whose digest over the landed bytes differed from the producer's (the transfer failed).")        \
    X(kv_digest_bytes, "pdlink_kv_digest_bytes_total", PDL_COUNTER_COUNT,                                           \
      "KV bytes digested by this rank (producer: at the hold's params; consumer: over what landed).")           \
    X(kv_digest_ns, "pdlink_kv_digest_ns_total", PDL_COUNTER_COUNT,                                                 \
      "Nanoseconds this rank spent computing and fetching KV digests.")                                          \
    X(kv_digest_unverified, "pdlink_kv_digest_unverified_total", PDL_COUNTER_COUNT,                                 \
      "Pulls from a digesting producer that had no digests of the transfer (unknown, off or no answer).")

typedef struct pdl_rank_counters {
#define PDL__COUNTER_FIELD(field, name, kind, help) uint64_t field;
    PDL_RANK_COUNTERS(PDL__COUNTER_FIELD)
#undef PDL__COUNTER_FIELD
} pdl_rank_counters_t;

/* One row of the table, for exporters. */
typedef struct pdl_counter_info {
    const char *name; /* Prometheus metric name */
    const char *help;
    pdl_counter_kind_t kind;
    size_t offset; /* of the uint64_t field in pdl_rank_counters_t */
} pdl_counter_info_t;

/* The rows of PDL_RANK_COUNTERS in order (static storage; *n gets their number). Cannot fail. */
const pdl_counter_info_t *pdl_rank_counters_table(size_t *n);
/* Snapshot of rank tp_rank's counters into *out; PDL_ERR_INVALID for a bad or non-local rank (named)
 * or NULL out. */
pdl_status_t pdl_instance_counters(pdl_instance_t *inst, int tp_rank, pdl_rank_counters_t *out, pdl_error_t *err);
/*
 * The remote accesses rank tp_rank's engine served, per peer host (pdl_engine_peer_stats: up to `cap`
 * rows into out, the number of rows returned; 0 for a NULL inst or a rank outside [0, tp)).
 */
size_t pdl_instance_peer_stats(pdl_instance_t *inst, int tp_rank, pdl_engine_peer_stats_t *out, size_t cap);

/*
 * The socket budget (docs/connector.md#the-socket-budget): every socket an instance opens toward a peer
 * -- a cached notify DEALER, a handshake, a peer-watch probe -- is drawn from one budget of
 * PDL_SOCKETS_MAX per instance, in one of these shares. Peers nobody verified (no handshake with them
 * succeeded, no identity answered) get small shares, so a flood of requests naming made-up endpoints
 * can neither exhaust descriptors nor starve the verified peers, which keep the rest.
 */
typedef enum pdl_socket_share {
    PDL_SOCKETS_VERIFIED = 0,   /* notify DEALERs and watch probes of verified peers: the rest of the budget */
    PDL_SOCKETS_UNVERIFIED = 1, /* notify DEALERs to endpoints of peers never verified */
    PDL_SOCKETS_HANDSHAKE = 2,  /* handshakes in flight (a socket each while it lasts) */
    PDL_SOCKETS_PROBE = 3,      /* watch probes of peers that never answered one */
    PDL_SOCKETS_SHARES = 4
} pdl_socket_share_t;
#define PDL_SOCKETS_MAX 512

typedef struct pdl_socket_stats {
    const char *name; /* "verified", "unverified", "handshake", "probe" */
    int open;         /* sockets of this share open now */
    int cap;          /* most it may have open at once */
    uint64_t refused; /* sockets it could not open for want of room (the caller went without) */
} pdl_socket_stats_t;

/* The budget's shares now, out[PDL_SOCKETS_SHARES] indexed by pdl_socket_share_t; nothing for NULL. */
void pdl_instance_sockets(pdl_instance_t *inst, pdl_socket_stats_t out[PDL_SOCKETS_SHARES]);

/*
 * Events of held transfers, for programs that want to react (metrics, tests). RANK_REPORTED: a producer
 * rank's fan-in completed; RANK_EXPIRED: a rank reaped it after defer_timeout; FREED: every rank
 * resolved it and its blocks went back to the allocator. The function runs on a connector thread
 * (a rank's service thread or writer, or the caller of pdl_instance_hold) with no connector lock
 * held; it must be quick and must not call pdl_instance_destroy. transfer_id is valid during the call.
 */
typedef enum pdl_instance_event {
    PDL_EVENT_RANK_REPORTED = 1,
    PDL_EVENT_RANK_EXPIRED = 2,
    PDL_EVENT_FREED = 3,
} pdl_instance_event_t;
typedef void (*pdl_instance_event_fn)(void *arg, pdl_instance_event_t ev, const char *transfer_id, int tp_rank);
/* Install fn (NULL: none); arg is passed through, never freed. */
void pdl_instance_set_event_fn(pdl_instance_t *inst, pdl_instance_event_fn fn, void *arg);

/*
 * WRITE mode (docs/protocol.md#write-flow; heterogeneous TP, which upstream MoRIIO lacks).
 *
 * Producer: pdl_instance_push(params, request_id, ids) after the prefill (the KV must be final: push
 * publishes it). `params` are the prefill leg's kv_transfer_params: transfer_id, and the consumer's
 * TP size in remote_tp_size (else tp_size, else ours). The consumer's address comes from
 * remote_host/remote_handshake_port/remote_notify_port when all are present, else from the request
 * id's ___decode_addr_ part. Each producer rank waits for the consumer's remote_blocks (parked when
 * they come first), handshakes with the consumer ranks of its write plan, writes its pieces with one
 * batched WRITE per layer per target, and sends write_done (status ok/failed) to every consumer rank
 * of its notify set. The blocks are freed when every rank finished, or after defer_timeout for ranks
 * whose remote_blocks never came (counted expired). Like pdl_instance_hold_for, the producer probes the
 * consumer's handshake port while the push is held; when the consumer is gone its ranks still waiting
 * for remote_blocks resolve as expired at once (events RANK_EXPIRED, FREED with the last rank; counted
 * once per push in consumer_gone_freed), shares queued behind others on its writer lane fail without
 * writing, and a share being written fails against the dead peer. A failed release (the consumer's
 * abandon) is accepted only from the consumer's host or proxy_ip, as READ releases are (releases_refused).
 * On success the blocks belong to the instance. Fails with PDL_ERR_BAD_STATE (not a WRITE-mode
 * producer, shutting down, or transfer_id already held), PDL_ERR_INVALID (no transfer_id, no blocks, no
 * consumer address, an impossible TP pair) or PDL_ERR_NOMEM; the blocks then stay the caller's.
 * pdl_instance_push is pdl_instance_push_start with every layer final from the start.
 *
 * Producer, layer by layer (as MoRIIO's WRITE mode pushes from vLLM's save_kv_layer):
 * pdl_instance_push_start(params, request_id, ids) before or during the forward registers the push as
 * pdl_instance_push does (same checks, failures and ownership), with no layer final yet;
 * pdl_instance_push_layers(transfer_id, k) then says layers 0..k-1 hold their final KV (the caller's
 * writes to them happen before the call: it publishes them like push does). A producer rank whose
 * remote_blocks came handshakes with its consumer ranks at once, writes the final layers to every
 * consumer rank of its write plan, and waits for more (counted in push_layer_waits each time), so its
 * write overlaps the forward; its write_done follows the last layer. A rank whose remote_blocks come
 * after every layer was said final writes the whole transfer as pdl_instance_push does. A rank waits
 * for layers at most until transfer_timeout after its write began (the consumer's receive gives up at
 * its own transfer_timeout anyway), and less when the consumer is found gone, abandons the push (a
 * failed release; counted in pushes_abandoned) or the instance is destroyed: its write then fails as
 * any failed write does (write_done failed, write_failures, the blocks freed with the last rank), the
 * error naming the transfer, how many layers were final and the timeout. A push whose remote_blocks
 * never come is reaped after defer_timeout as always, whatever its layers.
 *
 * Consumer: pdl_instance_expect_push(params, request_id, local blocks) with the decode leg's params
 * (transfer_id, producer TP in remote_tp_size/tp_size, producer address as for a pull). Each consumer
 * rank d sends remote_blocks to the producer ranks p of its group for which d is the first consumer
 * whose group holds p -- so every producer rank gets the block list exactly once -- and counts
 * write_done up to pdl_topo_expected_write_done(P, D). Fails like pdl_instance_push (BAD_STATE: not a
 * WRITE-mode consumer, or the transfer is already expected). On success *recv_out is the caller's, to
 * release with pdl_recv_free; the local blocks stay the caller's.
 */
typedef struct pdl_recv pdl_recv_t;
pdl_status_t pdl_instance_push(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               const uint32_t *ids, size_t n, pdl_error_t *err);
pdl_status_t pdl_instance_push_start(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                     const uint32_t *ids, size_t n, pdl_error_t *err);
/* Layers 0..layers-1 of push transfer_id are final. Monotonic: a count not above one already said is
 * ignored (PDL_OK); num_layers makes the push a whole one. Fails with PDL_ERR_INVALID (NULL arguments,
 * layers outside [0, num_layers], naming the value), PDL_ERR_BAD_STATE (not a WRITE-mode producer) or
 * PDL_ERR_NOT_FOUND naming the transfer (no push of it here: never started, or over -- every local rank
 * wrote, or was given up: reaped, abandoned, its consumer gone). Never waits for a writer. */
pdl_status_t pdl_instance_push_layers(pdl_instance_t *inst, const char *transfer_id, int layers, pdl_error_t *err);
pdl_status_t pdl_instance_expect_push(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                      const uint32_t *local_blocks, size_t n, pdl_recv_t **recv_out, pdl_error_t *err);
/* Wait up to timeout_ms (< 0: forever). PDL_OK when every rank counted all its write_done with status
 * ok; PDL_INPROGRESS when ranks still wait (the wait ran out: call again); otherwise a load error (the caller frees the
 * blocks): PDL_ERR_TRANSPORT (a producer rank said failed) or PDL_ERR_TIMEOUT past transfer_timeout. */
pdl_status_t pdl_recv_wait(pdl_recv_t *rv, int timeout_ms, pdl_error_t *err);
/* write_done messages consumer rank `tp_rank` counted (ok or failed); -1 for a bad rank. */
int pdl_recv_write_done(pdl_recv_t *rv, int tp_rank);
/* Frees a receive; write_done arriving later are counted late. Call after pdl_recv_wait returned and
 * before pdl_instance_destroy. NULL is ignored. */
void pdl_recv_free(pdl_recv_t *rv);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_CONNECTOR_H */
