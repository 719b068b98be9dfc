/*
 * backend.h -- internal structures of the transfer engine and the table of operations every backend
 * fills (UCX uct_iface_ops_t style). Only src/engine/ sources include this file.
 *
 * How a batch runs: pdl_session_post (engine.c) checks every descriptor against the local region and
 * against the remote region's size from its descriptor, merges descriptors adjacent on both sides,
 * asks the backend how many chunks to cut the batch into (ops->plan), cuts the descriptor list at
 * byte boundaries into that many chunks and queues them on the engine's worker pool. A worker runs
 * ops->run_chunk for one chunk; the last chunk to finish sets the batch's final status and wakes
 * waiters. The first error of any chunk is the batch's error.
 *
 * Object lifetimes: a pdl_mem_t is referenced by the engine's registration table (one reference) and
 * by every server request in flight (tcp); deregistration marks it dead, kicks connections that use it
 * and waits for the references to drain before freeing. A remote engine is referenced by the table and
 * by every session opened on it.
 */
#ifndef PDL_ENGINE_BACKEND_H
#define PDL_ENGINE_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/workq.h"
#include "common/cidr.h"
#include "engine/grant.h"
#include "pdlink/engine.h"
#include "common/log.h"

#define PDL_KEY_MAX 256      /* engine keys, hosts, hostnames (bytes incl. NUL) */
#define PDL_SHM_SLOTS 4096   /* live-registration table entries shared with shm and ucx peers */
/* Packed UCX blobs carried in descriptors. A worker address with tcp on two devices and the shared
 * memory transports packs to ~300 bytes here and an rkey to < 100; the caps leave room for more
 * devices and transports (verbs adds a few dozen bytes per device) and bound what a peer can send. */
#define PDL_UCX_ADDR_MAX 4096
#define PDL_UCX_RKEY_MAX 1024
#define PDL_CUDA_IPC_HANDLE 64 /* bytes of a CUipcMemHandle */
#define PDL_DEAD_IDS 256     /* deregistered ids remembered for the error message */
/* The shared control memfd of shm engines: the live-registration table, then the published grants
 * (grant.h), page-aligned. */
#define PDL_CTL_LIVE_BYTES ((size_t)PDL_SHM_SLOTS * sizeof(uint64_t))
#define PDL_CTL_BYTES ((PDL_CTL_LIVE_BYTES + sizeof(pdl_grant_pub_t) + 4095) & ~(size_t)4095)

typedef enum pdl_mem_kind {
    PDL_MEM_MEMFD = 1, /* pdlink allocated it (memfd, MAP_SHARED): shm peers map it */
    PDL_MEM_USER = 2,  /* the caller's memory: shm peers use process_vm_readv/writev */
    PDL_MEM_BACKEND = 3, /* the backend allocated it in mem_init and frees it in mem_fini (ucx) */
} pdl_mem_kind_t;

struct pdl_mem {
    pdl_engine_t *engine;
    uint64_t id;
    void *ptr;
    size_t size;
    pdl_mem_kind_t kind;
    int memfd;          /* -1 for PDL_MEM_USER */
    int slot;           /* index in the live table (shm, ucx; -1 without one) */
    pdl_mem_type_t type;
    void *bk;           /* backend state (ucx: the ucp_mem_map handle and the packed rkey) */
    _Atomic int refs;   /* in-flight server requests (tcp); the table's own reference is not counted */
    _Atomic bool dead;  /* deregistered: refuse new requests */
    _Atomic bool guarded; /* tcp: serve only requests a grant covers (pdl_mem_guard) */
};

/* A memory descriptor received from a peer (unpacked pdl_mem_pack bytes). */
typedef struct pdl_rmem {
    char engine_key[PDL_KEY_MAX];
    uint64_t id;
    uint64_t size;
    pdl_mem_kind_t kind;
    uint64_t addr; /* address in the owner's process (user memory, shm) */
    int64_t fd;    /* memfd number in the owner's process (memfd, shm) */
    int64_t pid;
    int64_t slot;
    uint32_t rkey_len; /* ucx: the packed rkey of the region (0 for other backends) */
    uint8_t rkey[PDL_UCX_RKEY_MAX];
    pdl_mem_type_t type; /* where the region lives in its owner (host unless the descriptor says) */
    /* cuda: the IPC handle of the allocation holding the region and the region's offset inside it */
    uint32_t ipc_len;
    uint8_t ipc[PDL_CUDA_IPC_HANDLE];
    uint64_t ipc_off;
} pdl_rmem_t;

/* A remote engine (unpacked pdl_engine_pack bytes) and what the backend keeps for it. */
typedef struct pdl_remote {
    char key[PDL_KEY_MAX];
    char host[PDL_KEY_MAX];
    char hostname[PDL_KEY_MAX];
    char boot_id[64];
    pdl_backend_kind_t backend;
    uint16_t port;
    int64_t pid;
    uint64_t pid_start; /* its start time (liveness.h), 0 if the sender did not say */
    int64_t ctl_fd;
    /* ucx: the worker address, and where the live table is in the owner with its packed rkey */
    uint64_t ctl_addr;
    uint32_t ucx_addr_len, ctl_rkey_len;
    uint8_t ucx_addr[PDL_UCX_ADDR_MAX];
    uint8_t ctl_rkey[PDL_UCX_RKEY_MAX];
    int refs;      /* table + sessions; protected by the engine's lock */
    bool removed;  /* pdl_engine_remove_remote was called */
    void *bk;      /* backend state (shm: pidfd and the mapped live table) */
    struct pdl_remote *next;
} pdl_remote_t;

struct pdl_session {
    pdl_engine_t *engine;
    pdl_mem_t *local;
    pdl_rmem_t rmem;
    pdl_remote_t *remote;
    /* Sticky failure: once a connection is lost every later post fails with this status. */
    _Atomic int broken;
    pthread_mutex_t mu;     /* protects broken_msg */
    char broken_msg[PDL_ERR_MSG_LEN];
    void *bk;               /* backend state (tcp: connections; shm: the mapping) */
    struct pdl_session *next;
    _Atomic(struct pdl_batch *) spare; /* the last freed batch's allocation, for the next post (engine.c) */
};

typedef struct pdl_chunk {
    size_t first, count; /* range in batch->d */
    uint64_t bytes;
} pdl_chunk_t;

struct pdl_batch {
    pdl_session_t *session;
    pdl_op_t op;
    pdl_desc_t *d;   /* merged and cut descriptors */
    size_t n;
    size_t n_merged; /* descriptors after merge, before cutting into chunks */
    uint64_t bytes;
    pdl_chunk_t *chunks;
    int nchunks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int pending;     /* chunks not finished */
    _Atomic bool done; /* set under mu; read without it where a stale false only costs a pass */
    pdl_status_t status;
    pdl_error_t err;
    _Atomic bool cancel;
    void *priv;      /* ops->chunk_priv bytes per chunk, in the same allocation (backend state) */
    char grant[PDL_GRANT_NAME_MAX + 1]; /* tcp: the grant every request names; "" = none */
    size_t alloc;    /* bytes of the allocation holding the batch and its arrays */
};

/* Properties of a backend that the generic engine acts on. */
enum {
    /* A running batch can be abandoned only by tearing down its session's transport (tcp: shutting
     * the sockets down; ucx: force-closing the endpoint): pdl_batch_free breaks the session first. */
    PDL_BACKEND_CAP_ABORT_BREAKS = 1u << 1,
    /* The engine keeps a live-registration table that peers read (shm: mapped; ucx: ucp_get). */
    PDL_BACKEND_CAP_LIVE_TABLE = 1u << 2,
    /* pdl_engine_alloc_mem lets mem_init allocate (PDL_MEM_BACKEND) instead of making a memfd. */
    PDL_BACKEND_CAP_ALLOC = 1u << 3,
};

/*
 * The table of operations. pdl__backend_check refuses a table, and pdl_engine_create an engine of it,
 * unless these are filled (PDL_ERR_INVALID naming the backend and the entry):
 *   name, remote_add, session_open, session_close, session_check, and how chunks run: run_chunk, or
 *   submit with drive_chunk (never both run_chunk and submit);
 *   session_kill when caps has PDL_BACKEND_CAP_ABORT_BREAKS, mem_init when it has PDL_BACKEND_CAP_ALLOC.
 * Every other entry is optional and NULL where the backend has nothing to do there; what NULL means is
 * written at each one. Backends leave them NULL rather than point them at functions that do nothing,
 * and every caller in src/engine checks them first.
 */
typedef struct pdl_backend_ops {
    const char *name;
    /* Non-NULL: this build lacks the backend (ucx without UCX). Its name still parses and prints, and
     * pdl_engine_create refuses it with PDL_ERR_UNSUPPORTED and this text; no entry is read. */
    const char *unavailable;
    unsigned caps;
    /* A batch planned as one chunk of at most this many bytes runs inside pdl_session_post, on the
     * caller's thread (0 = never): only for backends whose copy is bounded CPU work that no peer can
     * stall, where a worker hand-off would cost more than the copy (UCX completes shm gets inline too). */
    uint64_t inline_max;
    /* Optional (NULL: nothing beyond the generic engine): engine set-up after the generic part (tcp
     * binds and starts its server threads), and its undoing before the generic teardown. */
    pdl_status_t (*engine_init)(pdl_engine_t *e, pdl_error_t *err);
    void (*engine_fini)(pdl_engine_t *e);
    /* Required: the descriptor's generic fields are decoded (engine.c); this checks the remote engine
     * can be reached with this backend and may keep state in r->bk. remote_free is optional (NULL:
     * remote_add keeps nothing) and accepts r->bk == NULL. */
    pdl_status_t (*remote_add)(pdl_engine_t *e, pdl_remote_t *r, pdl_error_t *err);
    void (*remote_free)(pdl_engine_t *e, pdl_remote_t *r);
    /* Optional (NULL: no connection holds a registration's reference that could be cut): called after
     * deregistration is visible, when references have not drained in 100 ms. */
    void (*mem_kick)(pdl_engine_t *e, pdl_mem_t *m);
    /* Optional (NULL: a registration needs no backend work): make a new registration usable by peers
     * (ucx: ucp_mem_map, ucp_rkey_pack) before it is entered in the table; mem_fini (NULL: nothing to
     * undo) undoes it once no request uses it any more and accepts m->bk == NULL. */
    pdl_status_t (*mem_init)(pdl_engine_t *e, pdl_mem_t *m, pdl_error_t *err);
    void (*mem_fini)(pdl_engine_t *e, pdl_mem_t *m);
    /* Optional (NULL: the descriptor carries the generic fields only): fill the backend's fields of
     * this engine's descriptor / of a registration's descriptor. */
    void (*engine_desc_fill)(const pdl_engine_t *e, pdl_remote_t *r);
    void (*mem_desc_fill)(const pdl_mem_t *m, pdl_rmem_t *rm);
    /* Required: set up a session's transport state in s->bk, and release it (accepts s->bk == NULL). */
    pdl_status_t (*session_open)(pdl_session_t *s, pdl_error_t *err);
    void (*session_close)(pdl_session_t *s);
    /* Optional (NULL: nothing to do): fault in what the session maps, so that no post pays for it
     * (shm: the remote memfd mapping). Runs on the caller's thread, which is never a request's. */
    pdl_status_t (*session_prefault)(pdl_session_t *s, pdl_error_t *err);
    /* Optional (NULL: no I/O of the session can be cut short; running chunks still see the batch's
     * cancel flag): abort I/O in flight on the session (remove_remote, freeing a running batch). */
    void (*session_kill)(pdl_session_t *s);
    /* Required: check at post time that the peer can still be used (shm: pid alive, region still live;
     * every backend: the remote was not removed). */
    pdl_status_t (*session_check)(pdl_session_t *s, pdl_error_t *err);
    /* Optional (NULL: one chunk): how many chunks to cut a batch of `bytes` into. */
    int (*plan)(pdl_session_t *s, pdl_op_t op, uint64_t bytes, size_t n);
    /* Run chunk `idx` of a batch on a worker thread; fills err on failure. Required unless submit is
     * set, and NULL when it is. */
    pdl_status_t (*run_chunk)(pdl_session_t *s, pdl_batch_t *b, int idx, pdl_error_t *err);

    /*
     * Backends that progress batches themselves (tcp) fill the entries below instead of run_chunk.
     * submit starts a freshly cut batch (tcp: sends its requests from the posting thread) and hands any
     * chunk it wants run in the background to pdl__engine_pool_drive; each chunk ends with exactly one
     * pdl__batch_chunk_done, from whichever thread completes it. drive_chunk (required with submit) is
     * what a worker runs for a chunk handed to the pool: drive it until it is done. progress (optional;
     * NULL: waiters sleep until another thread completes the batch) drives the batch's own chunks from
     * the calling thread (pdl_batch_poll: deadline 0 = one non-blocking pass; pdl_batch_wait: until
     * done or the CLOCK_MONOTONIC deadline in ns, UINT64_MAX = none; a running batch's pdl_batch_free
     * after session_kill).
     */
    size_t chunk_priv; /* bytes of backend state per chunk (b->priv) */
    void (*submit)(pdl_session_t *s, pdl_batch_t *b);
    void (*progress)(pdl_batch_t *b, uint64_t deadline_ns);
    void (*drive_chunk)(pdl_batch_t *b, int idx);

    /* Optional (NULL: device memory cannot be zeroed): zero ranges of a device registration on the
     * device (pdl_mem_zero; host memory is zeroed by engine.c). Ranges are checked already. */
    pdl_status_t (*mem_zero)(pdl_mem_t *m, const pdl_range_t *r, size_t n, pdl_error_t *err);
} pdl_backend_ops_t;

extern const pdl_backend_ops_t pdl__shm_ops;
extern const pdl_backend_ops_t pdl__tcp_ops;
extern const pdl_backend_ops_t pdl__ucx_ops;
extern const pdl_backend_ops_t pdl__cuda_ops;

/* shm's peer checks, shared with cuda (same host, same uid; shm.c): remote_add opens the owner's pidfd
 * and maps its live-registration table into r->bk; session_check refuses a removed or exited owner and
 * a region no longer registered. */
pdl_status_t pdl__shm_remote_add(pdl_engine_t *e, pdl_remote_t *r, pdl_error_t *err);
void pdl__shm_remote_free(pdl_engine_t *e, pdl_remote_t *r);
pdl_status_t pdl__shm_session_check(pdl_session_t *s, pdl_error_t *err);
/*
 * A same-host batch that names a grant runs only while the owner keeps it (shm.c; shm and cuda): enter
 * looks it up in the owner's published grants before the copy (PDL_ERR_DENIED when it is not live for
 * that region and op), leave checks after the copy that its slot did not change (PDL_ERR_DENIED: the
 * owner revoked it meanwhile and may have reused the bytes, so the copy is void). The owner revokes
 * before it frees, so a copy that passes leave touched only the transfer's bytes. No-ops without a grant.
 */
pdl_status_t pdl__shm_grant_enter(pdl_session_t *s, const pdl_batch_t *b, uint64_t *slot, uint64_t *seq, pdl_error_t *err);
pdl_status_t pdl__shm_grant_leave(pdl_session_t *s, const pdl_batch_t *b, uint64_t slot, uint64_t seq, pdl_error_t *err);

/* --- engine internals shared with the backends (engine.c) --- */
struct pdl_engine {
    char key[PDL_KEY_MAX];
    char host[PDL_KEY_MAX];
    char hostname[PDL_KEY_MAX];
    char boot_id[64];
    uint64_t pid_start; /* this process's start time, for peers' liveness checks (liveness.h) */
    uint16_t port;
    bool bind_all; /* tcp: listen on the wildcard address, advertise host */
    pdl_backend_kind_t backend;
    char tcp_cc[16]; /* congestion control set on tcp data sockets; "" = system default */
    int qp_per_transfer;
    int num_workers;
    unsigned mem_types; /* bits (1u << pdl_mem_type_t) this engine registers; the backend may add some */
    const pdl_backend_ops_t *ops;

    pthread_mutex_t mu; /* registrations, remotes, sessions */
    pdl_mem_t **mems;
    size_t nmems, capmems;
    /* Registration ids are random (pdl_mem_id); the last PDL_DEAD_IDS deregistered ones are kept so a
     * request naming one is told "deregistered" rather than "no such registration". */
    uint64_t dead_ids[PDL_DEAD_IDS];
    unsigned dead_next;
    pdl_grants_t grants; /* grant.h; its own lock */
    pdl_cidrs_t trusted; /* tcp: peers served; n == 0 = everyone (fixed after create) */
    const pdl_auth_t *auth; /* tcp: authenticated mode's key (borrowed); NULL = compatible mode */
    pthread_mutex_t peers_mu; /* peers, npeers */
    pdl_engine_peer_stats_t peers[PDL_ENGINE_MAX_PEERS + 1]; /* the last one is "other" */
    size_t npeers;
    pdl_remote_t *remotes;
    pdl_session_t *sessions;

    /* live table (shm, ucx): slot i holds the id of the live registration using it, or 0. */
    int ctl_fd;
    _Atomic uint64_t *ctl;

    /* worker pool: num_workers threads running chunks (engine.c) */
    pdl_workq_t pool;

    /* stats */
    _Atomic uint64_t st_batches_ok, st_batches_failed, st_bytes_read, st_bytes_written, st_bytes_served,
        st_requests_refused, st_requests_denied, st_requests_served, st_conn_malformed, st_conn_untrusted,
        st_conn_shed, st_conn_auth;

    pdl_ratelimit_t rl_malformed;
    pdl_ratelimit_t rl_refused;
    pdl_ratelimit_t rl_shed;

    void *bk; /* backend state (tcp: listener and server threads) */
};

/* The tcp server admitted a request of `bytes` from numeric `host` (pdl_engine_peer_stats). */
void pdl__engine_peer_served(pdl_engine_t *e, const char *host, uint64_t bytes);
/* The tcp server refused a data connection from `host` in authenticated mode: counted in the engine and
 * the peer's row; true the first time for that row (log it once). */
bool pdl__engine_peer_auth_refused(pdl_engine_t *e, const char *host);
/* Look up a live registration by id and take a reference (tcp server); NULL if unknown or dead. */
pdl_mem_t *pdl__engine_mem_get(pdl_engine_t *e, uint64_t id, bool *was_dead);
void pdl__engine_mem_put(pdl_mem_t *m);

/* A chunk of b finished with st (err filled when st != PDL_OK); the last one completes the batch. */
void pdl__batch_chunk_done(pdl_batch_t *b, pdl_status_t st, const pdl_error_t *err);
/* Copy chunk c of b between the session's local region and `map`, the remote region mapped into this
 * process (shm's mapping, UCX's ucp_rkey_ptr): a chunk larger than the caches with the streaming copy
 * (common/copy.c says why), the cancel flag checked every 64 MiB (PDL_ERR_BAD_STATE). A CPU copy: it
 * refuses (PDL_ERR_UNSUPPORTED, nothing touched) when either side is not host memory. */
pdl_status_t pdl__chunk_copy_mapped(pdl_session_t *s, pdl_batch_t *b, const pdl_chunk_t *c, uint8_t *map,
                                    pdl_error_t *err);
/* Queue chunk idx of b on the worker pool; the worker calls ops->drive_chunk(b, idx). */
void pdl__engine_pool_drive(pdl_batch_t *b, int idx);

/* Mark a session broken (sticky) with a status and message; first call wins. */
void pdl__session_break(pdl_session_t *s, pdl_status_t st, const char *msg);

/*
 * Descriptor codecs (desc.c). pack describes a live engine or registration (this process's pid);
 * encode writes a descriptor from its decoded form; unpack decodes bytes from a peer (PDL_ERR_INVALID
 * for an empty buffer, PDL_ERR_MISMATCH for another version or an unknown backend, PDL_ERR_PARSE for
 * anything malformed; `*r` / `*rm` is meaningful only on PDL_OK). Encoded bytes are malloc'd and
 * handed to `out` (pdl_bytes_free); encoding fails only with PDL_ERR_NOMEM.
 */
pdl_status_t pdl__engine_desc_pack(const pdl_engine_t *e, pdl_bytes_t *out, pdl_error_t *err);
pdl_status_t pdl__engine_desc_encode(const pdl_remote_t *r, pdl_bytes_t *out, pdl_error_t *err);
pdl_status_t pdl__engine_desc_unpack(const void *buf, size_t len, pdl_remote_t *r, pdl_error_t *err);
pdl_status_t pdl__mem_desc_pack(const pdl_mem_t *m, pdl_bytes_t *out, pdl_error_t *err);
pdl_status_t pdl__mem_desc_encode(const pdl_rmem_t *rm, pdl_bytes_t *out, pdl_error_t *err);
pdl_status_t pdl__mem_desc_unpack(const void *buf, size_t len, pdl_rmem_t *rm, pdl_error_t *err);

/* The backend behind a kind (backends.c, the one table of backends and their names); NULL if unknown. */
const pdl_backend_ops_t *pdl__backend_ops(pdl_backend_kind_t kind);
/* Whether an engine can be made of ops (backends.c): PDL_OK, PDL_ERR_UNSUPPORTED with ops->unavailable,
 * or PDL_ERR_INVALID naming the backend and the first required entry that is NULL (the table above). */
pdl_status_t pdl__backend_check(const pdl_backend_ops_t *ops, pdl_error_t *err);

#endif /* PDL_ENGINE_BACKEND_H */
