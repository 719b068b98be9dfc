/*
 * engine.h -- the transfer engine: registered memory, remote engines, sessions, batched one-sided
 * READ and WRITE (docs/engine.md). MoRI-IO's shape, with backends behind one table of operations.
 *
 * Layer: engine, above wire; it owns threads (a worker pool, and for tcp a server) and sockets, and
 * logs rarely (warnings on misuse, rate-limited notes on refused or malformed peer requests). Error
 * convention: pdl_status_t plus an optional `err`; output pointers (`*_out`) are set only on success.
 * Handles are opaque and come in create/destroy pairs; the destroy functions accept NULL and cannot
 * fail.
 *
 * Lifecycle:
 *   pdl_engine_create → pdl_engine_alloc_mem / pdl_engine_register_mem → pdl_mem_pack (send to peer)
 *   pdl_engine_pack (send to peer) ... peer: pdl_engine_add_remote(desc)
 *   pdl_session_open(local mem, remote mem desc) → pdl_session_post(READ|WRITE, descs) → pdl_batch_wait
 *   pdl_batch_free → pdl_session_close → pdl_engine_remove_remote → pdl_engine_deregister_mem → destroy.
 * The order of the teardown matters: a batch refers to its session and a session to its local
 * registration, so free the batches, then close the sessions, then deregister. A remote engine may be
 * removed while sessions to it are open (they break, and keep its state alive until they close).
 *
 * Checks: every descriptor is checked at post time against the local registration and against the
 * remote region's size from its descriptor. tcp: the owner checks every request again against the
 * registration it names (an unknown or deregistered id, a range outside the region, an overflowing
 * sum) and refuses it, counting it in requests_refused. shm: the owner never sees the accesses, so the
 * initiator also checks the owner's live-registration table and that the owner process is alive.
 * ucx: the owner's side is UCX's (rkeys; not a bound check on every transport), so the initiator also
 * reads the region's slot of the owner's live table (ucp_get) before every batch.
 *
 * Threads: all functions are thread-safe (several threads may post on one session and wait on
 * different batches) except that a batch is used by one thread at a time and an object must not be
 * destroyed while another thread uses it. Destroying an engine requires that its sessions are closed.
 */
#ifndef PDLINK_ENGINE_H
#define PDLINK_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/auth.h"
#include "pdlink/status.h"
#include "pdlink/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Bumped whenever the packed engine or memory descriptor changes; a peer with another version is
 * refused with PDL_ERR_MISMATCH by pdl_engine_add_remote and pdl_session_open.
 */
#define PDL_ENGINE_DESC_VERSION 1

/*
 * Opaque handles. An engine is one endpoint; a mem one registered region of it; a session a path from
 * one local region to one remote region; a batch one posted list of copies on a session.
 */
typedef struct pdl_engine pdl_engine_t;
typedef struct pdl_mem pdl_mem_t;
typedef struct pdl_session pdl_session_t;
typedef struct pdl_batch pdl_batch_t;

typedef enum pdl_backend_kind {
    PDL_BACKEND_SHM = 1, /* peers on one host: shared memfd mappings + process_vm_readv */
    PDL_BACKEND_TCP = 2, /* any two hosts: the owner serves reads/writes of its memory over TCP */
    PDL_BACKEND_UCX = 3, /* UCX's UCP: one-sided get/put over whatever transport UCX selects (UCX_TLS) */
    /* GPUs of one host: CUDA IPC handles and copies on the GPU, the CUDA driver loaded at run time
     * (docs/gpu.md); registers CUDA memory only. */
    PDL_BACKEND_CUDA = 4,
} pdl_backend_kind_t;

/* "shm" / "tcp" / "ucx" / "cuda", or "unknown" for any other value; static, never NULL. */
const char *pdl_backend_name(pdl_backend_kind_t kind);
/*
 * "shm" | "tcp" | "ucx" | "cuda" (case-sensitive) → PDL_BACKEND_SHM | PDL_BACKEND_TCP | PDL_BACKEND_UCX |
 * PDL_BACKEND_CUDA; -1 if unknown or NULL ("rdma" is resolved by pdl_backend_pick_rdma, not here).
 */
int pdl_backend_parse(const char *s);
/*
 * What `backend: "rdma"` means on this machine: PDL_BACKEND_UCX when UCX offers an RDMA transport (one
 * of its rc, dc or ud verbs transports; UCX_TLS and the other UCX_* variables are honoured), else
 * PDL_BACKEND_TCP. Fills why[0..why_cap) (may be NULL) with the reason, naming the RDMA transports
 * found or saying that none was. Opens and closes UCX's transport components: call it once, at
 * configuration time. Cannot fail (a UCX error means "no RDMA transport", and `why` says so).
 */
pdl_backend_kind_t pdl_backend_pick_rdma(char *why, size_t why_cap);

/*
 * Where registered memory lives. Host memory works with shm, tcp and ucx; CUDA memory with cuda (GPUs of
 * one host, through CUDA IPC), with tcp where the CUDA driver loads (libcuda.so.1, opened at run time:
 * the bytes move through pinned host staging windows, copied by the GPU, pipelined with the socket;
 * docs/engine.md) and with ucx where UCX reports support for that memory type (built with CUDA / ROCm
 * and a device present): pdl_engine_register_mem_type refuses it otherwise. Device memory is never read
 * or written by the CPU inside pdlink: only the GPU's copy engines and kernels, or the UCX transport
 * told the memory type, touch it.
 */
typedef enum pdl_mem_type {
    PDL_MEM_TYPE_HOST = 0,
    PDL_MEM_TYPE_CUDA = 1,
    PDL_MEM_TYPE_ROCM = 2,
} pdl_mem_type_t;

/*
 * What pdl_engine_create needs; read during the call only (strings are copied). Start from
 * pdl_engine_config_defaults and set fields by name: the struct grows by the rule in pdlink/pdlink.h.
 * Ranges are checked:
 * `key` 1..255 bytes; `host` at most 255 bytes, NULL meaning "127.0.0.1" (shm only carries it in the
 * descriptor); `port` and `tcp_congestion` are ignored by shm; `qp_per_transfer` 1..64 (tcp only);
 * `num_workers` 1..64; `tcp_congestion` at most 15 bytes.
 */
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
    /*
     * tcp: false (default) = listen on `host` only, the address peers are told; true = listen on every
     * address of host's family (0.0.0.0 or ::) and still advertise `host`. Binding only the advertised
     * address keeps the data port off interfaces nobody was meant to reach it on (docs/security.md).
     */
    bool bind_all;
    /*
     * tcp: NULL or "" = serve any peer; else comma-separated numeric addresses/CIDRs ("10.0.0.0/8,
     * 127.0.0.1"): a data connection from any other address is closed at accept, before it sends a
     * byte, and counted in connections_refused_untrusted. A malformed list fails create (INVALID).
     */
    const char *trusted_hosts;
    /*
     * tcp: NULL = compatible mode; else authenticated mode (docs/security.md): every data connection,
     * both ways, proves the cluster key before anything is served -- the initiator sends a nonce with
     * its HELLO, the owner answers with its nonce and a MAC over both nonces and its engine key, the
     * initiator checks it and answers with its own MAC. An owner closes a connection that skips or fails
     * this (counted in connections_refused_auth and per peer, logged once per peer host); an initiator
     * fails the session with PDL_ERR_DENIED when the owner cannot prove the key. Borrowed: it must
     * outlive the engine. Bulk data is not encrypted. Ignored by shm (the kernel checks its peers).
     */
    const pdl_auth_t *auth;
} pdl_engine_config_t;

/* Zero cfg and set backend tcp, qp_per_transfer 1 and num_workers 1; the caller sets key (and host, port
 * for a reachable tcp engine). Fields added later get the value that keeps the earlier behaviour. Cannot
 * fail. */
void pdl_engine_config_defaults(pdl_engine_config_t *cfg);

/*
 * Create an engine: start num_workers worker threads and, for tcp, bind and listen on host:port and
 * start the server threads. On success *engine_out owns all of it until pdl_engine_destroy.
 * PDL_ERR_INVALID for cfg or engine_out NULL, a value outside the ranges above, an unknown backend,
 * a tcp_congestion that cannot be set, or (tcp) a host that does not resolve; PDL_ERR_NOMEM;
 * PDL_ERR_SYSTEM when a system call fails (shm: memfd_create/mmap of the registration table; tcp:
 * bind/listen, epoll; pthread_create); PDL_ERR_UNSUPPORTED (cuda) when the CUDA driver cannot be loaded
 * (no libcuda.so.1) or reports no device, the message saying which. On failure nothing is left behind.
 */
pdl_status_t pdl_engine_create(const pdl_engine_config_t *cfg, pdl_engine_t **engine_out, pdl_error_t *err);
/*
 * Stop serving, join every thread and free the engine, every registration still registered (memory
 * from pdl_engine_alloc_mem is unmapped; the caller's own memory is left alone) and every remote
 * engine. Close every session first: destroying with sessions open only logs a warning and leaves them
 * pointing at freed memory. No other call on the engine may run concurrently or follow. NULL is ignored.
 */
void pdl_engine_destroy(pdl_engine_t *engine);

/*
 * Accessors; `engine` must not be NULL, and returned strings are borrowed from it (valid until
 * pdl_engine_destroy). pdl_engine_key is the configured key.
 */
const char *pdl_engine_key(const pdl_engine_t *engine);
pdl_backend_kind_t pdl_engine_backend(const pdl_engine_t *engine);
/* The tcp port actually bound (the chosen one when the config said 0); 0 for shm and ucx. */
uint16_t pdl_engine_port(const pdl_engine_t *engine);
/*
 * tcp: the congestion control set on the data sockets ("" = the system default, and always for shm).
 * With a NULL or "" config value this is "cubic", else "reno", else "" when neither may be set.
 */
const char *pdl_engine_tcp_congestion(const pdl_engine_t *engine);

/*
 * Pack this engine's descriptor (versioned msgpack: key, backend, host, port, pid, hostname, boot id)
 * for a peer's pdl_engine_add_remote. On success the caller owns *out (pdl_bytes_free).
 * PDL_ERR_INVALID for a NULL argument, PDL_ERR_NOMEM.
 */
pdl_status_t pdl_engine_pack(pdl_engine_t *engine, pdl_bytes_t *out, pdl_error_t *err);

/*
 * Register a remote engine from its packed descriptor (`desc` is only read). Idempotent for the same
 * key and descriptor; two threads adding the same key both succeed and one entry remains. The remote's
 * key is copied into key_out (truncated to key_cap - 1 bytes) once the descriptor decoded with a
 * matching backend, even if a later step fails; key_out may be NULL. Returns PDL_OK, or:
 *   PDL_ERR_INVALID     engine NULL; desc NULL or empty.
 *   PDL_ERR_PARSE       a malformed descriptor or one without the fields its backend needs.
 *   PDL_ERR_MISMATCH    another PDL_ENGINE_DESC_VERSION, an unknown backend, or another backend than
 *                       this engine's.
 *   PDL_ERR_BAD_STATE   the key was added before with a different descriptor (a restarted peer?):
 *                       remove it first.
 *   PDL_ERR_UNSUPPORTED shm: the remote engine runs on another host (or boot); ucx: no UCX transport
 *                       reaches it (compare UCX_TLS on both sides).
 *   PDL_ERR_PEER_GONE   shm: the remote process is gone.
 *   PDL_ERR_TRANSPORT   ucx: ucp_ep_create or the unpacking of the live table's rkey failed.
 *   PDL_ERR_SYSTEM      shm: pidfd_open, opening or mapping its registration table failed (the message
 *                       says when shm needs the same uid or root).
 *   PDL_ERR_NOMEM.
 */
pdl_status_t pdl_engine_add_remote(pdl_engine_t *engine, const void *desc, size_t len, char *key_out,
                                   size_t key_cap, pdl_error_t *err);
/*
 * Forget a remote engine. Every session open to it breaks (sticky PDL_ERR_PEER_GONE for every later
 * post); tcp batches in flight fail, usually with PDL_ERR_PEER_GONE, while a shm batch already running
 * completes. The sessions must still be closed, and the remote's state is freed when the last closes.
 * PDL_ERR_INVALID for a NULL argument, PDL_ERR_NOT_FOUND when no remote engine has that key.
 */
pdl_status_t pdl_engine_remove_remote(pdl_engine_t *engine, const char *key, pdl_error_t *err);

/*
 * Allocate `size` (> 0) bytes that pdlink owns (memfd-backed, shareable with shm peers; ucx: allocated
 * by UCX, ucp_mem_map ALLOCATE, so that its shared-memory transports can map it in a peer), zeroed,
 * every page touched, and registered. The memory stays valid, at pdl_mem_ptr, until pdl_engine_deregister_mem
 * or pdl_engine_destroy frees it. PDL_ERR_INVALID for a NULL argument or size 0; PDL_ERR_SYSTEM when
 * memfd_create, ftruncate or mmap fails; PDL_ERR_NOMEM, also (shm, ucx) beyond 4096 live registrations;
 * PDL_ERR_TRANSPORT (ucx) when ucp_mem_map or ucp_rkey_pack fails.
 */
pdl_status_t pdl_engine_alloc_mem(pdl_engine_t *engine, size_t size, pdl_mem_t **mem_out, pdl_error_t *err);
/*
 * Register memory the caller owns (shm peers read and write it with process_vm_readv/writev, which
 * needs ptrace permission over this process). pdlink neither copies nor frees it: keep [ptr, ptr+size)
 * valid until pdl_engine_deregister_mem returns. PDL_ERR_INVALID for a NULL argument or size 0;
 * PDL_ERR_NOMEM, also (shm, ucx) beyond 4096 live registrations;
 * (ucx) PDL_ERR_TRANSPORT when ucp_mem_map or ucp_rkey_pack fails.
 */
pdl_status_t pdl_engine_register_mem(pdl_engine_t *engine, void *ptr, size_t size, pdl_mem_t **mem_out,
                                     pdl_error_t *err);
/*
 * pdl_engine_register_mem for memory of a given type (pdl_engine_register_mem is this with
 * PDL_MEM_TYPE_HOST). Same ownership rule: [ptr, ptr+size) stays the caller's and must stay valid
 * until pdl_engine_deregister_mem returns. Device memory is never touched by pdlink itself, only by
 * the backend's transport. PDL_ERR_UNSUPPORTED for a device type the engine cannot register (shm, tcp
 * without the CUDA driver, or a UCX without support for it: pdl_engine_mem_types says which it can, and
 * tcp also when the driver sees no device); otherwise as pdl_engine_register_mem, plus (ucx)
 * PDL_ERR_TRANSPORT when ucp_mem_map or ucp_rkey_pack fails, and (cuda, tcp) PDL_ERR_INVALID when the
 * range is not inside one allocation of the engine's CUDA context (cuMemGetAddressRange). tcp chooses
 * its CUDA context at the first CUDA registration: the one current on the calling thread, else device
 * 0's primary context.
 */
pdl_status_t pdl_engine_register_mem_type(pdl_engine_t *engine, void *ptr, size_t size, pdl_mem_type_t type,
                                          pdl_mem_t **mem_out, pdl_error_t *err);
/* The memory types this engine registers, as bits (1u << pdl_mem_type_t): the host bit for every backend
 * but cuda, whose engines register CUDA memory only (pdl_engine_alloc_mem and host registrations of a
 * cuda engine fail with PDL_ERR_UNSUPPORTED); the CUDA bit for cuda, for tcp where libcuda.so.1 loads,
 * and for ucx where UCX supports it. */
unsigned pdl_engine_mem_types(const pdl_engine_t *engine);
/*
 * After this, peers' requests naming this registration are refused (tcp: NOT_FOUND; shm: the next
 * session_open or post fails with NOT_FOUND). Blocks until the requests being served on it finish:
 * after 100 ms it shuts down the connections still using it. Then frees `mem` and, for alloc_mem,
 * the memory. Close every local session opened on `mem` first (they keep a pointer to it). NULL
 * arguments are ignored; an unknown `mem` is only logged.
 */
void pdl_engine_deregister_mem(pdl_engine_t *engine, pdl_mem_t *mem);

/*
 * Publish the caller's writes to registered memory: every remote access this engine serves after the
 * call returns sees them. Call it after filling memory and before telling a peer it may read (the
 * peer's request arrives through a socket, which orders nothing for the engine's own threads). It
 * matters for tcp, whose server threads copy the memory; for shm it costs a lock round trip and no
 * more. `engine` must not be NULL. Cannot fail.
 */
void pdl_engine_publish(pdl_engine_t *engine);

/*
 * Accessors of a registration (`mem` must not be NULL): its address and size in this process, and its
 * id: a random non-zero 64-bit number drawn with getrandom, unique among this engine's live and
 * recently deregistered registrations, so a peer that was not given a memory descriptor cannot guess it.
 */
void *pdl_mem_ptr(const pdl_mem_t *mem);
size_t pdl_mem_size(const pdl_mem_t *mem);
uint64_t pdl_mem_id(const pdl_mem_t *mem);
/*
 * Pack the registration's descriptor (versioned msgpack: engine key, id, size, kind, and the address,
 * memfd number, pid and table slot that shm peers use) for a peer's pdl_session_open. On success the
 * caller owns *out (pdl_bytes_free). PDL_ERR_INVALID for a NULL argument, PDL_ERR_NOMEM.
 */
pdl_status_t pdl_mem_pack(const pdl_mem_t *mem, pdl_bytes_t *out, pdl_error_t *err);

/*
 * Open a session from local memory to a remote memory descriptor (its engine must have been added).
 * `local` must be a live registration of `engine`; `remote_mem_desc` is only read. tcp opens
 * qp_per_transfer connections, one after the other, and may block up to 5 s for each connect and 5 s
 * for each HELLO; shm maps the remote memfd (user memory needs no mapping). On success *session_out is
 * owned by the caller until pdl_session_close. Returns PDL_OK, or:
 *   PDL_ERR_INVALID   a NULL argument; `local` not (or no longer) registered here; an empty descriptor;
 *                     tcp: the remote engine has no port.
 *   PDL_ERR_PARSE     a malformed descriptor (shm: also a bad size or fd in it).
 *   PDL_ERR_MISMATCH  another descriptor version; shm: the descriptor's pid or memfd size does not
 *                     match its engine; tcp: the remote refused the HELLO (not the engine expected,
 *                     or another protocol version).
 *   PDL_ERR_NOT_FOUND the remote engine was not added (pdl_engine_add_remote); shm: the region is no
 *                     longer registered.
 *   PDL_ERR_PEER_GONE shm: the remote process exited; tcp: connection refused, or closed during the
 *                     HELLO.
 *   PDL_ERR_TIMEOUT   tcp: connect or HELLO took longer than 5 s.
 *   PDL_ERR_TRANSPORT tcp: the host does not resolve, or another connection error.
 *   PDL_ERR_SYSTEM    shm: opening or mapping the remote memfd failed.
 * ucx unpacks the region's rkey on the remote engine's endpoint (no I/O): PDL_ERR_PARSE for a
 * descriptor without rkey, address or slot, or an rkey UCX refuses; the endpoint's sticky status
 * (PDL_ERR_PEER_GONE, PDL_ERR_TIMEOUT, PDL_ERR_BAD_STATE) once it failed or was closed.
 *   PDL_ERR_NOMEM.
 */
pdl_status_t pdl_session_open(pdl_engine_t *engine, pdl_mem_t *local, const void *remote_mem_desc, size_t len,
                              pdl_session_t **session_out, pdl_error_t *err);
/*
 * Fault in what the session maps of the remote region (shm: its memfd mapping, which pdl_session_open
 * does not populate, so that opening on a request's path pays only for the pages that request touches),
 * so that no later post pays for a page fault. Takes as long as touching the whole region (~0.1 s for
 * 128 MiB here): call it on a background thread, after opening ahead of need. A no-op for tcp, ucx and
 * shm sessions to caller-registered memory. Returns PDL_OK, PDL_ERR_INVALID (NULL session) or
 * PDL_ERR_SYSTEM (madvise failed: the session still works, faulting pages on first use).
 */
pdl_status_t pdl_session_prefault(pdl_session_t *session, pdl_error_t *err);
/*
 * Close the connections (tcp) or unmap the remote memory (shm) and free the session. Free every batch
 * posted on it first (pdl_batch_free): a batch refers to its session. NULL is ignored.
 */
void pdl_session_close(pdl_session_t *session);
/*
 * Whether the session is broken: sticky, every later post fails with the status that broke it (a lost
 * connection, a running batch freed, the remote removed), whatever that status is. The caller closes it
 * and opens a new one. False for NULL.
 */
bool pdl_session_broken(pdl_session_t *session);

/*
 * Grants (docs/security.md). A guarded registration is served by the tcp backend only to requests that
 * name a live grant covering every byte they touch; every other request is refused (status
 * PDL_ERR_DENIED, counted in requests_denied) and no byte of it is read or written. A registration is
 * open (served to any request inside it) until pdl_mem_guard. The shm backend has no server: a shm
 * peer maps the memfd or uses process_vm_readv, which the kernel allows only to the same uid or root,
 * so the owner cannot refuse it. The owner instead publishes which grants are live in memory its shm
 * peers map, and a shm batch that names a grant checks it itself: PDL_ERR_DENIED when the grant is
 * not live (for that registration and op) before the copy, and when it was revoked during the copy
 * (the owner may have reused the bytes, so what was read is void). The published grants carry their
 * ranges, so a shm (and cuda) batch touching a byte outside them fails with PDL_ERR_DENIED before it
 * copies anything.
 *
 * pdl_mem_guard: guard `mem` from now on (requests already being served finish). Cannot fail; `mem`
 * must not be NULL.
 *
 * pdl_engine_grant: allow requests named `name` (1..PDL_GRANT_NAME_MAX bytes, e.g. a transfer id) to
 * do `ops` (PDL_GRANT_READ | PDL_GRANT_WRITE) inside the n ranges (offsets in `mem`, copied; they may
 * overlap and come in any order) until pdl_engine_revoke. A range outside the region is allowed but
 * useless (the region's bounds are checked first). PDL_ERR_INVALID (NULL argument, bad name or ops,
 * n == 0, an empty or wrapping range), PDL_ERR_BAD_STATE (a grant of that name exists), PDL_ERR_NOMEM.
 *
 * pdl_engine_revoke: forget the grant; requests arriving afterwards are refused, and it returns only
 * once no byte moves under the grant any more: a tcp request being served stops at its next step (a
 * WRITE's remaining payload is drained and refused, a READ's connection is cut once its header went
 * out), a shm copy under way fails. ucx is not fenced yet (docs/reliability.md). PDL_ERR_NOT_FOUND when
 * no grant has that name (not logged: the caller decides).
 */
/*
 * pdl_engine_grant_to: pdl_engine_grant for one host: the tcp backend serves the grant only to data
 * connections from `host` (a numeric address, compared as an address; NULL or "" = any host, which is
 * pdl_engine_grant), and refuses the others with PDL_ERR_DENIED. A WRITE grant names its producer this
 * way, so whoever else learns the grant's name (a transfer id) writes nothing under it. shm and cuda
 * peers share the owner's host, so the binding adds nothing there.
 *
 * pdl_engine_grant_peer: the numeric address of the host the grant was first served to ("" while
 * unused) into host (cap bytes) -- the peer that took part in the transfer, e.g. to check who may
 * release it. PDL_ERR_NOT_FOUND when no grant has that name, PDL_ERR_INVALID for a NULL argument.
 */
#define PDL_GRANT_NAME_MAX 528 /* a transfer id (PDL_WIRE_ID_MAX) and a per-layer "#<layer>" suffix fit */
enum { PDL_GRANT_READ = 1u, PDL_GRANT_WRITE = 2u };
typedef struct pdl_range {
    uint64_t off, len;
} pdl_range_t;
void pdl_mem_guard(pdl_mem_t *mem);
pdl_status_t pdl_engine_grant(pdl_engine_t *engine, pdl_mem_t *mem, const char *name, unsigned ops,
                              const pdl_range_t *ranges, size_t n, pdl_error_t *err);
pdl_status_t pdl_engine_grant_to(pdl_engine_t *engine, pdl_mem_t *mem, const char *name, unsigned ops,
                                 const pdl_range_t *ranges, size_t n, const char *host, pdl_error_t *err);
pdl_status_t pdl_engine_revoke(pdl_engine_t *engine, const char *name, pdl_error_t *err);
pdl_status_t pdl_engine_grant_peer(pdl_engine_t *engine, const char *name, char *host, size_t cap, pdl_error_t *err);

/*
 * Zero the n byte ranges (offsets in `mem`) of a registration: host memory with the CPU, device memory
 * on the device by the backend (never by the CPU). For the caller's own bookkeeping, e.g. the unused
 * rows of a block before it is granted to a peer. PDL_ERR_INVALID for a NULL argument or a range
 * outside the region (nothing is zeroed then); PDL_ERR_UNSUPPORTED for device memory of a backend
 * without a device path for it.
 */
pdl_status_t pdl_mem_zero(pdl_mem_t *mem, const pdl_range_t *ranges, size_t n, pdl_error_t *err);

typedef enum pdl_op {
    PDL_OP_READ = 1,  /* remote → local */
    PDL_OP_WRITE = 2, /* local → remote */
} pdl_op_t;

/*
 * Post a batch of copies. Every descriptor is checked against the local registration here and against
 * the remote one by its owner. The descriptor array is copied; the caller may free it at once.
 * Descriptors adjacent on both sides (in the order given) are merged, and large batches are cut into
 * chunks run in parallel (tcp: over the session's connections; shm: over the workers).
 * Never blocks on a peer. shm: batches under 4 MiB are copied right here. tcp: the requests are sent
 * from the calling thread; the response is received by the thread that calls pdl_batch_wait (or, a
 * non-blocking step at a time, pdl_batch_poll), as UCX progresses its worker: a tcp batch nobody
 * waits on or polls moves only as far as the socket buffers take it. Any number of batches may be in
 * flight on one session; waiting for one completes the earlier ones on its connection on the way.
 *
 * Returns PDL_OK with *batch_out set: the batch may already be done (a small shm batch), and its own
 * result, success or failure, comes from pdl_batch_poll/pdl_batch_wait. The caller owns the batch
 * and must pdl_batch_free it in every case. On failure nothing was posted and *batch_out is not set:
 *   PDL_ERR_INVALID   a NULL argument, an op other than READ/WRITE, n == 0, a descriptor of length 0
 *                     or outside the local or the remote region (the message names its index).
 *   (sticky)          the session broke earlier (connection lost, remote removed, a running batch
 *                     freed): the status and message it broke with, e.g. PDL_ERR_PEER_GONE,
 *                     PDL_ERR_TRANSPORT or PDL_ERR_BAD_STATE. Open a new session.
 *   PDL_ERR_BAD_STATE the local registration was deregistered.
 *   PDL_ERR_PEER_GONE the remote engine was removed, or (shm) its process exited.
 *   PDL_ERR_NOT_FOUND shm: the remote region is no longer registered.
 *   PDL_ERR_NOMEM.
 * A batch that was posted ends in PDL_OK or in: PDL_ERR_NOT_FOUND, PDL_ERR_INVALID or PDL_ERR_DENIED
 * (tcp: the owner refused a request; the session stays usable); PDL_ERR_PEER_GONE or PDL_ERR_TRANSPORT (tcp: the
 * connection was lost, and the session breaks; shm: process_vm_readv/writev found the owner gone or
 * its memory unmapped); PDL_ERR_SYSTEM (shm: another process_vm error); PDL_ERR_BAD_STATE (cancelled
 * by pdl_batch_free).
 */
pdl_status_t pdl_session_post(pdl_session_t *session, pdl_op_t op, const pdl_desc_t *descs, size_t n,
                              pdl_batch_t **batch_out, pdl_error_t *err);
/*
 * pdl_session_post for a guarded remote registration: every request of the batch names the grant
 * `grant` (1..PDL_GRANT_NAME_MAX bytes; NULL or "" = none, which is pdl_session_post). The owner refuses
 * the batch with PDL_ERR_DENIED unless that grant covers it; shm fails it with PDL_ERR_DENIED unless the
 * grant stays live for the whole copy (see pdl_mem_guard).
 * PDL_ERR_INVALID also for a name that is too long.
 */
pdl_status_t pdl_session_post_granted(pdl_session_t *session, pdl_op_t op, const char *grant, const pdl_desc_t *descs,
                                      size_t n, pdl_batch_t **batch_out, pdl_error_t *err);

/*
 * PDL_INPROGRESS while running, then the batch's final status, with err filled (a copy of the batch's
 * error record) on failure; it can be asked again and gives the same answer. Never blocks (tcp: also
 * moves whatever bytes of the batch the socket has ready). PDL_ERR_INVALID for a NULL batch.
 */
pdl_status_t pdl_batch_poll(pdl_batch_t *batch, pdl_error_t *err);
/*
 * Wait up to timeout_ms (any negative value = forever, 0 = check once without blocking); returns the
 * batch's final status with err filled on failure, or PDL_INPROGRESS if still running (err says so;
 * the batch stays valid and a later wait resumes it). tcp: the calling thread receives the batch's
 * bytes itself. PDL_ERR_INVALID for a NULL batch.
 */
pdl_status_t pdl_batch_wait(pdl_batch_t *batch, int timeout_ms, pdl_error_t *err);
/*
 * Free a batch, finished or not. A running batch is cancelled first, and the call waits until it no
 * longer touches memory: shm stops at the next cancellation point; tcp shuts the session's connections
 * down, which breaks the session for good (sticky PDL_ERR_BAD_STATE), so wait for a batch before
 * freeing it unless the session is to be closed anyway; ucx force-closes the one endpoint to that
 * remote engine, which breaks every session to it (remove and re-add the remote engine to reconnect).
 * NULL is ignored.
 */
void pdl_batch_free(pdl_batch_t *batch);
/* Total bytes the batch copies (sum of the descriptor lengths); 0 for NULL. */
uint64_t pdl_batch_bytes(const pdl_batch_t *batch);
/*
 * Descriptors of the batch after merging runs adjacent on both sides (what the backend executes,
 * before cutting into chunks); 0 for NULL.
 */
size_t pdl_batch_num_descs(const pdl_batch_t *batch);

/*
 * Counters since pdl_engine_create, each read atomically (the set is not one snapshot). As initiator:
 * `batches_ok`/`batches_failed` count finished batches, `bytes_read`/`bytes_written` the bytes of the
 * successful READ/WRITE batches. As owner, tcp only (shm has no server): `bytes_served` the payload
 * bytes served to peers, `requests_refused` the requests refused (unknown or deregistered region,
 * range outside it, overflowing sum, no grant), `requests_denied` those of them refused for want of a
 * grant on a guarded region, `requests_served` the requests admitted, `connections_refused_untrusted`
 * the data connections closed at accept (trusted_hosts), `connections_dropped_malformed` the data
 * connections closed because a peer sent bytes that do not follow the protocol, `connections_shed` the data
 * connections accepted and closed at once because the process was out of file descriptors (EMFILE/ENFILE).
 */
typedef struct pdl_engine_stats {
    uint64_t batches_ok, batches_failed;
    uint64_t bytes_read, bytes_written;        /* as initiator */
    uint64_t bytes_served;                     /* as owner (tcp) */
    uint64_t requests_refused;                 /* unknown id / out of range / overflow / denied */
    uint64_t requests_denied;                  /* of those: no grant covered them (guarded region) */
    uint64_t requests_served;                  /* as owner (tcp): READ/WRITE requests served */
    uint64_t connections_refused_untrusted;    /* as owner (tcp): closed at accept, not in trusted_hosts */
    uint64_t connections_dropped_malformed;    /* hostile bytes on the data socket */
    uint64_t connections_shed;                 /* closed at once: out of descriptors */
    uint64_t connections_refused_auth;         /* as owner (tcp, auth): no or a wrong proof of the cluster key */
} pdl_engine_stats_t;

/* Copy the counters into *out; neither argument may be NULL. Thread-safe, cannot fail. */
void pdl_engine_get_stats(pdl_engine_t *engine, pdl_engine_stats_t *out);

/*
 * Remote accesses this engine served (tcp owner side), per peer host: the requests admitted (inside
 * their region and, for a guarded one, a grant) and their bytes, and (authenticated mode) the data
 * connections refused for want of the cluster key. The first PDL_ENGINE_MAX_PEERS hosts
 * get a row each; later ones are added to a row whose host is "other", so a peer cycling through
 * addresses cannot grow the table.
 */
#define PDL_ENGINE_MAX_PEERS 64
typedef struct pdl_engine_peer_stats {
    char host[64]; /* numeric address, or "other" */
    uint64_t requests, bytes;
    uint64_t auth_refused; /* data connections refused in authenticated mode (no or a wrong key) */
} pdl_engine_peer_stats_t;
/* Copy up to `cap` rows into out (in first-served order); returns how many rows exist (may be > cap).
 * `engine` must not be NULL; out may be NULL when cap is 0. Thread-safe, cannot fail. */
size_t pdl_engine_peer_stats(pdl_engine_t *engine, pdl_engine_peer_stats_t *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_ENGINE_H */
