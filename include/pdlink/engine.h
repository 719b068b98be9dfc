/*
 * engine.h -- the transfer engine: registered memory, remote engines, sessions, batched one-sided
 * READ and WRITE (SPEC §6). MoRI-IO's shape, with backends behind one table of operations.
 *
 * Lifecycle:
 *   pdl_engine_create → pdl_engine_alloc_mem / pdl_engine_register_mem → pdl_mem_pack (send to peer)
 *   pdl_engine_pack (send to peer) ... peer: pdl_engine_add_remote(desc)
 *   pdl_session_open(local mem, remote mem desc) → pdl_session_post(READ|WRITE, descs) → pdl_batch_wait
 *   pdl_batch_free → pdl_session_close → pdl_engine_remove_remote → pdl_engine_deregister_mem → destroy.
 * Every remote access is checked by the side that owns the memory against the registration it names:
 * an unknown id, a range outside the region or an overflowing sum is refused and counted.
 *
 * Threads: all functions are thread-safe except that a batch is used by one thread at a time and an
 * object must not be destroyed while another thread uses it. Destroying an engine requires that its
 * sessions are closed.
 */
#ifndef PDLINK_ENGINE_H
#define PDLINK_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"
#include "pdlink/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever the packed engine or memory descriptor changes; a mismatch is PDL_ERR_MISMATCH. */
#define PDL_ENGINE_DESC_VERSION 1

typedef struct pdl_engine pdl_engine_t;
typedef struct pdl_mem pdl_mem_t;
typedef struct pdl_session pdl_session_t;
typedef struct pdl_batch pdl_batch_t;

typedef enum pdl_backend_kind {
    PDL_BACKEND_SHM = 1, /* peers on one host: shared memfd mappings + process_vm_readv */
    PDL_BACKEND_TCP = 2, /* any two hosts: the owner serves reads/writes of its memory over TCP */
} pdl_backend_kind_t;

/* "shm" / "tcp" */
const char *pdl_backend_name(pdl_backend_kind_t kind);
/* "shm" | "tcp"; -1 if unknown ("rdma" is mapped by the connector, not here). */
int pdl_backend_parse(const char *s);

typedef struct pdl_engine_config {
    const char *key;          /* unique engine name, e.g. "consumer:10.0.0.1:6301:tp0:dp0" */
    const char *host;         /* address peers reach this engine on (tcp listens here) */
    uint16_t port;            /* tcp listen port; 0 = pick a free one */
    pdl_backend_kind_t backend;
    int qp_per_transfer;      /* connections per session (tcp); >= 1 */
    int num_workers;          /* worker threads that execute batches; >= 1 */
    /*
     * tcp: congestion control of the data sockets. NULL or "" = the engine's choice: "cubic", else
     * "reno" (loss-based; BBR keeps a small window across the gaps between request/response bursts
     * and halved multi-MiB READs here, docs/engine.md); "system" = leave the system default; any other
     * name must be settable (tcp_allowed_congestion_control, or CAP_NET_ADMIN) or create fails.
     */
    const char *tcp_congestion;
} pdl_engine_config_t;

pdl_status_t pdl_engine_create(const pdl_engine_config_t *cfg, pdl_engine_t **engine_out, pdl_error_t *err);
void pdl_engine_destroy(pdl_engine_t *engine);

const char *pdl_engine_key(const pdl_engine_t *engine);
pdl_backend_kind_t pdl_engine_backend(const pdl_engine_t *engine);
/* The tcp port actually bound (0 for shm). */
uint16_t pdl_engine_port(const pdl_engine_t *engine);
/* tcp: the congestion control set on the data sockets ("" = the system default, and always for shm). */
const char *pdl_engine_tcp_congestion(const pdl_engine_t *engine);

/* Pack this engine's descriptor (versioned msgpack) for a peer. */
pdl_status_t pdl_engine_pack(pdl_engine_t *engine, pdl_bytes_t *out, pdl_error_t *err);

/* Register a remote engine from its packed descriptor; idempotent for the same key. key_out may be NULL. */
pdl_status_t pdl_engine_add_remote(pdl_engine_t *engine, const void *desc, size_t len, char *key_out,
                                   size_t key_cap, pdl_error_t *err);
/* Forget a remote engine; in-flight batches to it fail with PDL_ERR_PEER_GONE. */
pdl_status_t pdl_engine_remove_remote(pdl_engine_t *engine, const char *key, pdl_error_t *err);

/* Allocate `size` bytes that pdlink owns (memfd-backed, shareable with shm peers), zeroed and registered. */
pdl_status_t pdl_engine_alloc_mem(pdl_engine_t *engine, size_t size, pdl_mem_t **mem_out, pdl_error_t *err);
/* Register memory the caller owns (shm peers read it with process_vm_readv). */
pdl_status_t pdl_engine_register_mem(pdl_engine_t *engine, void *ptr, size_t size, pdl_mem_t **mem_out,
                                     pdl_error_t *err);
/* After this, peers' requests naming this registration are refused. Frees memory from alloc_mem. */
void pdl_engine_deregister_mem(pdl_engine_t *engine, pdl_mem_t *mem);

/*
 * Publish the caller's writes to registered memory: every remote access this engine serves after the
 * call returns sees them. Call it after filling memory and before telling a peer it may read (the
 * peer's request arrives through a socket, which orders nothing for the engine's own threads).
 */
void pdl_engine_publish(pdl_engine_t *engine);

void *pdl_mem_ptr(const pdl_mem_t *mem);
size_t pdl_mem_size(const pdl_mem_t *mem);
uint64_t pdl_mem_id(const pdl_mem_t *mem);
pdl_status_t pdl_mem_pack(const pdl_mem_t *mem, pdl_bytes_t *out, pdl_error_t *err);

/* Open a session from local memory to a remote memory descriptor (its engine must have been added). */
pdl_status_t pdl_session_open(pdl_engine_t *engine, pdl_mem_t *local, const void *remote_mem_desc, size_t len,
                              pdl_session_t **session_out, pdl_error_t *err);
void pdl_session_close(pdl_session_t *session);

typedef enum pdl_op {
    PDL_OP_READ = 1,  /* remote → local */
    PDL_OP_WRITE = 2, /* local → remote */
} pdl_op_t;

/*
 * Post a batch of copies. Every descriptor is checked against the local registration here and against
 * the remote one by its owner. The descriptor array is copied; the caller may free it at once.
 * Never blocks on a peer. shm: batches under 4 MiB are copied right here. tcp: the requests are sent
 * from the calling thread; the response is received by the thread that calls pdl_batch_wait (or, a
 * non-blocking step at a time, pdl_batch_poll), as UCX progresses its worker: a tcp batch nobody
 * waits on or polls moves only as far as the socket buffers take it. Any number of batches may be in
 * flight on one session; waiting for one completes the earlier ones on its connection on the way.
 */
pdl_status_t pdl_session_post(pdl_session_t *session, pdl_op_t op, const pdl_desc_t *descs, size_t n,
                              pdl_batch_t **batch_out, pdl_error_t *err);

/* PDL_INPROGRESS while running, then the final status (err filled on failure). Never blocks
 * (tcp: also moves whatever bytes of the batch the socket has ready). */
pdl_status_t pdl_batch_poll(pdl_batch_t *batch, pdl_error_t *err);
/* Wait up to timeout_ms (-1 = forever); PDL_ERR_TIMEOUT if still running (the batch stays valid and
 * a later wait resumes it). tcp: the calling thread receives the batch's bytes itself. */
pdl_status_t pdl_batch_wait(pdl_batch_t *batch, int timeout_ms, pdl_error_t *err);
/* Frees a batch; waits for a running batch to stop touching memory first. */
void pdl_batch_free(pdl_batch_t *batch);
uint64_t pdl_batch_bytes(const pdl_batch_t *batch);
/* Descriptors of the batch after merging runs adjacent on both sides (what the backend executes). */
size_t pdl_batch_num_descs(const pdl_batch_t *batch);

typedef struct pdl_engine_stats {
    uint64_t batches_ok, batches_failed;
    uint64_t bytes_read, bytes_written;        /* as initiator */
    uint64_t bytes_served;                     /* as owner (tcp) */
    uint64_t requests_refused;                 /* unknown id / out of range / overflow */
    uint64_t connections_dropped_malformed;    /* hostile bytes on the data socket */
} pdl_engine_stats_t;

void pdl_engine_get_stats(pdl_engine_t *engine, pdl_engine_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_ENGINE_H */
