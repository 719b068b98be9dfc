/*
 * ucx.c -- transfer backend on UCX's UCP: one-sided ucp_get_nbx / ucp_put_nbx over whatever transport
 * UCX selects (rc/dc/ud verbs on an RDMA NIC, its tcp, its shared-memory transports; UCX_TLS and the
 * other UCX_* variables pass through, read by ucp_config_read).
 *
 * Objects: one UCP context per engine and UCX_LANES workers ("lanes": posting contexts); one endpoint
 * per remote engine per lane, each created from the worker address carried in the remote's engine
 * descriptor (field "ucx_addr": lane 0's worker, which serves the peers) with peer error handling, so a
 * dead peer fails the endpoint instead of hanging it; every registration is ucp_mem_map'ed and its
 * packed rkey travels in the memory descriptor ("rkey"); a session unpacks the remote region's rkey on
 * each lane's endpoint once.
 *
 * Why lanes: over UCX's shared-memory transports a get is one synchronous memcpy inside ucp_get_nbx,
 * in the thread that posts it (uct_sm_ep_get_bcopy), so one worker moves a batch at one core's copy
 * speed. A batch of at least UCX_SPLIT_MIN_BYTES to a remote reached over shared memory is cut by
 * bytes into one chunk per lane: chunk 0 is posted on lane 0 by the posting thread, chunk i > 0 on lane
 * i by a pool thread (drive_chunk), so the copies run side by side, as shm's memcpy workers do. Where
 * UCX maps the remote region and live table here (ucp_rkey_ptr), a chunk skips ucp_get_nbx and copies
 * through those mappings with the shm engine's copy (pdl__chunk_copy_mapped, engine.c).
 *
 * Locking: a lane's worker and the endpoints and rkeys made on it are used only under that lane's mu
 * (the workers are UCS_THREAD_MODE_SERIALIZED: these locks serialise them); calls on the context
 * (ucp_mem_map, ucp_rkey_pack, ...) are made under lane 0's mu, and the context is created with
 * mt_workers_shared since its workers run on different threads. Lane locks are never nested. Lock order:
 * engine->mu → a lane's mu → batch->mu / session->mu; the completion callbacks run inside
 * ucp_worker_progress, under their lane's mu, and take only the latter two.
 *
 * Progress: a chunk is posted from the thread that starts it (its gets/puts, then one ucp_ep_flush_nbx
 * whose completion is the chunk's: one request per chunk, not one per descriptor). The waiting thread
 * progresses the batch's lanes itself for up to UCX_SPIN_NS (UCX completes shared-memory gets within
 * that, like ucx_perftest's busy polling), then sleeps on the batch's condition variable while the
 * engine's progress thread, asleep on the workers' event fds (UCP_FEATURE_WAKEUP), progresses them.
 * The progress thread is also what serves peers: UCX's tcp transport has no one-sided get, and UCX
 * emulates it with messages the owner's worker answers.
 *
 * Checks, on the requesting side only (UCX does the owner's side: an rkey covers its region, but UCX
 * does not bound-check every access on every transport, and its software-emulated RMA over tcp checks
 * nothing): every range against the size in the memory descriptor (engine.c), and the registration's
 * liveness against the owner's live table (the same table shm maps), which the owner ucp_mem_maps and
 * whose address and rkey are in its engine descriptor ("ctl_addr", "ctl_rkey"). Every chunk reads its
 * region's slot first, on its own lane, and posts its gets or puts only once the slot says the region
 * is live: a batch posted after the owner's pdl_engine_deregister_mem returned fails with NOT_FOUND and
 * never touches the region. That costs one small get per chunk, and it has to come first: over UCX's
 * tcp the owner's worker serves a get or put at whatever address it names, so an access to a region
 * the owner has unmapped would fault in the owner. A deregistration racing a batch already past its check is not
 * caught (the window is one round trip); real RDMA NICs refuse that access, UCX's tcp does not.
 *
 * Chunk states (ucx_op_t.phase; a batch is done when its last chunk is):
 *   chunk_start posts the slot get + flush → CHECK --flush done, slot == id--> posts the gets or puts +
 *   flush → XFER --flush done--> OK.  CHECK with slot != id → NOT_FOUND (nothing moved); a flush
 *   failing → the endpoint's error (below) or the post error.
 * Endpoint states (ucx_remote_t): live --(UCX error callback: peer died, connection reset, keepalive
 * timeout, on any of its lanes)--> dead (sticky: every session to that remote breaks, PDL_ERR_PEER_GONE
 * or, for UCX timeouts, PDL_ERR_TIMEOUT) ; live --(pdl_engine_remove_remote, a running batch freed)-->
 * closed (force-close of every lane's endpoint: requests in flight complete with UCS_ERR_CANCELED;
 * sessions break). The endpoints are shared by every session to that remote engine, so freeing one
 * running batch breaks all of them; remove and re-add the remote engine to get new endpoints.
 *
 * Peers on this host: UCX notices a dead peer through its transports (a reset tcp connection) or its
 * keepalive, which over shared memory runs every UCX_KEEPALIVE_INTERVAL (20 s by default) and takes a
 * zombie for alive; meanwhile a get that needs the dead owner's worker (UCX's software RMA) waits. So a
 * remote whose descriptor names a process on this host (same boot id, its start time proved:
 * liveness.h) is watched through a pidfd in the progress thread's epoll set: when it becomes readable
 * the remote turns dead (PEER_GONE, "exited") and its endpoints are force-closed, which fails every
 * request in flight at once.
 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "common/clock.h"
#include "engine/backend.h"
#include "engine/liveness.h"

/* The waiting thread progresses the worker itself this long before handing over to the progress
 * thread: shared-memory gets of up to a few MiB complete within it, so they cost no wake-up, while a
 * get over UCX tcp (~1 ms here, docs/benchmarks.md#this-machine) does not burn a whole core of the two. */
#define UCX_SPIN_NS 200000ull

/* Posting contexts per engine: one for the posting thread, one for a pool thread (this VM has two
 * cores; the memcpy ceiling and shm copy with two threads by default as well). */
#define UCX_LANES 2
/* A batch of fewer bytes stays on lane 0: handing a chunk to a pool thread costs a wake-up (tens of
 * µs under load here) that a smaller copy does not win back. Measured with the mapped copy (posix,cma,
 * pdlink bench, GB/s, three alternating runs): 64K x16 unsplit 16.6-18.0 against 12.0-13.3 split,
 * 1M x1 14.8-17.8 against 12.6-13.7; 1M x16 8.0-8.7 either way; 2M and 4M x1 even. */
#define UCX_SPLIT_MIN_BYTES (2u << 20)
/* UCX's shared-memory transports as ucp_ep_print_info names them ("0:posix/memory.0 md[0] ..."): over
 * these a get or put is a copy made by the posting thread, so more posting threads copy faster. Over
 * UCX's tcp the owner's one worker serves every get and two lanes measured no faster (1M x16:
 * 0.86-0.87 GB/s split, 0.92-1.19 not); over verbs the NIC copies (not measured here). */
static const char *const sm_transports[] = {":posix/", ":sysv/", ":cma/", ":xpmem/", ":knem/"};

typedef struct ucx_lane {
    pthread_mutex_t mu; /* every call on this worker and the endpoints / rkeys made on it */
    ucp_worker_h worker;
    int efd;
} ucx_lane_t;

typedef struct ucx_engine {
    ucp_context_h ctx; /* calls on it under lanes[0].mu */
    ucx_lane_t lanes[UCX_LANES];
    int nlanes; /* workers created so far (engine_release) */
    void *addr; /* packed address of lane 0's worker (ucp_worker_get_address): what peers connect to */
    size_t addr_len;
    ucp_mem_h ctl_memh; /* the live table, readable by peers */
    void *ctl_rkey;
    size_t ctl_rkey_len;
    int stop_fd, epfd;
    /* Remotes on this host whose process is watched (see "Peers on this host"). Taken before a lane's
     * mu, never under one. */
    pthread_mutex_t watch_mu;
    struct ucx_remote *watched;
    uint64_t watch_ids; /* the last id given: an epoll event names its remote by id, never by pointer */
    pthread_t thread;
    bool thread_started;
    _Atomic bool stopping;
    unsigned ucx_types; /* device types UCX itself supports (1u << pdl_mem_type_t): e->mem_types may claim more
                         * under the test hook */
} ucx_engine_t;

typedef struct ucx_mem {
    ucp_mem_h memh;
    void *rkey;
    size_t rkey_len;
} ucx_mem_t;

typedef struct ucx_rlane { /* a remote engine as seen from one lane; under that lane's mu */
    ucp_ep_h ep;         /* NULL once closed */
    ucp_rkey_h ctl_rkey; /* the remote's live table */
    _Atomic uint64_t *ctl_map; /* that table mapped here by UCX (ucp_rkey_ptr), or NULL */
} ucx_rlane_t;

typedef struct ucx_remote {
    ucx_rlane_t lane[UCX_LANES];
    int pidfd;            /* the peer process when watched, else -1; under the engine's watch_mu */
    uint64_t watch_id;
    int64_t pid;
    struct ucx_remote *watch_next;
    pthread_mutex_t fail_mu; /* setting dead: lanes fail on different threads (taken under a lane's mu) */
    _Atomic int dead;        /* 0, or the pdl_status_t every session to it breaks with */
    char dead_msg[PDL_ERR_MSG_LEN]; /* written once, under fail_mu, before dead is set */
    char key[PDL_KEY_MAX];
    const char *local_key;
    bool split; /* batches to it are cut over the lanes (copies_in_caller) */
} ucx_remote_t;

typedef struct ucx_session {
    ucp_rkey_h rkey[UCX_LANES]; /* the remote region's rkey, unpacked on each lane's endpoint */
    uint8_t *map[UCX_LANES];    /* the whole region mapped here by UCX through that rkey, or NULL */
} ucx_session_t;

enum { PHASE_CHECK = 1, PHASE_XFER = 2 };

typedef struct ucx_op { /* b->priv: one per chunk; chunk i runs on lane i */
    pdl_batch_t *b;
    int idx;
    int phase;
    uint64_t slot;       /* the owner's live-table slot, read by ucp_get */
    pdl_status_t post_st; /* first error posting an operation */
    pdl_error_t post_err;
} ucx_op_t;

/* Chunk i's state: engine.c lays b->priv out in steps of chunk_priv rounded up to 16 bytes. */
static ucx_op_t *op_at(pdl_batch_t *b, int i)
{
    return (ucx_op_t *)((uint8_t *)b->priv + (size_t)i * ((sizeof(ucx_op_t) + 15) & ~(size_t)15));
}

/* ---------------------------------------------------------------- status mapping */

/* A UCX failure as a pdlink status: endpoint errors mean the peer is gone, UCX timeouts are timeouts,
 * a cancellation is our own force-close (a freed batch, a removed remote). */
static pdl_status_t map_status(ucs_status_t st)
{
    switch (st) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_ENDPOINT_TIMEOUT: /* keepalive found the peer dead */
        return PDL_ERR_PEER_GONE;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_EXCEEDS_LIMIT:
        return PDL_ERR_TIMEOUT;
    case UCS_ERR_CANCELED:
        return PDL_ERR_BAD_STATE;
    case UCS_ERR_NO_MEMORY:
        return PDL_ERR_NOMEM;
    default:
        return PDL_ERR_TRANSPORT;
    }
}

/* ---------------------------------------------------------------- peers on this host */

static void remote_close(ucx_engine_t *ux, ucx_remote_t *ur);

/* Stop watching ur's process; the engine's watch_mu held. */
static void watch_drop_locked(ucx_engine_t *ux, ucx_remote_t *ur)
{
    for (ucx_remote_t **pp = &ux->watched; *pp; pp = &(*pp)->watch_next)
        if (*pp == ur) {
            *pp = ur->watch_next;
            break;
        }
    epoll_ctl(ux->epfd, EPOLL_CTL_DEL, ur->pidfd, NULL);
    close(ur->pidfd);
    ur->pidfd = -1;
}

/* Watch the process behind remote r when it runs on this host and is proved to be the one that sent
 * the descriptor; otherwise leave the remote to UCX's own error handling. */
static bool watch_start(pdl_engine_t *e, ucx_engine_t *ux, ucx_remote_t *ur, const pdl_remote_t *r)
{
    if (r->pid_start == 0 || r->boot_id[0] == '\0' || strcmp(r->boot_id, e->boot_id) != 0)
        return false;
    int fd = pdl__proc_pidfd(r->pid, r->pid_start);
    if (fd < 0) { /* another pid namespace (its pid names another process here), or gone already */
        pdl_debug("engine %s: remote engine %s (pid %" PRId64 ") on this host is not watched: %s", e->key, r->key,
                  r->pid, errno == ESTALE ? "that pid names another process here" : strerror(errno));
        return false;
    }
    bool watched = false;
    pthread_mutex_lock(&ux->watch_mu);
    ur->watch_id = ++ux->watch_ids;
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = ur->watch_id};
    if (epoll_ctl(ux->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        pdl_warn("engine %s: watching remote engine %s (pid %" PRId64 "): epoll_ctl: %s; a dead peer is found by "
                 "UCX alone",
                 e->key, r->key, r->pid, strerror(errno));
        close(fd);
    } else {
        ur->pidfd = fd;
        ur->pid = r->pid;
        ur->watch_next = ux->watched;
        ux->watched = ur;
        watched = true;
    }
    pthread_mutex_unlock(&ux->watch_mu);
    return watched;
}

static void watch_stop(ucx_engine_t *ux, ucx_remote_t *ur)
{
    pthread_mutex_lock(&ux->watch_mu);
    if (ur->pidfd >= 0)
        watch_drop_locked(ux, ur);
    pthread_mutex_unlock(&ux->watch_mu);
}

/* The progress thread saw watch `id`'s pidfd readable: that peer exited. By id, because the remote
 * may have been removed between epoll_wait and here. */
static void watch_fired(pdl_engine_t *e, ucx_engine_t *ux, uint64_t id)
{
    pthread_mutex_lock(&ux->watch_mu);
    ucx_remote_t *ur = ux->watched;
    while (ur && ur->watch_id != id)
        ur = ur->watch_next;
    if (ur != NULL && pdl__proc_exited(ur->pidfd)) {
        int64_t pid = ur->pid;
        watch_drop_locked(ux, ur);
        pthread_mutex_lock(&ur->fail_mu);
        if (atomic_load(&ur->dead) == 0) {
            snprintf(ur->dead_msg, sizeof(ur->dead_msg), "peer gone: engine %.120s: remote engine %.120s (pid %" PRId64
                     ") exited", e->key, ur->key, pid);
            atomic_store(&ur->dead, (int)PDL_ERR_PEER_GONE);
            pdl_debug("%s", ur->dead_msg);
        }
        pthread_mutex_unlock(&ur->fail_mu);
        remote_close(ux, ur); /* requests in flight fail now, with the reason above */
    }
    pthread_mutex_unlock(&ux->watch_mu);
}

/* ---------------------------------------------------------------- progress thread */

static void *progress_main(void *arg)
{
    pdl_engine_t *e = arg;
    ucx_engine_t *ux = e->bk;
    while (!atomic_load(&ux->stopping)) {
        /* One progress call per lock hold, so posting threads are not starved while peers are served. */
        unsigned n;
        do {
            n = 0;
            for (int l = 0; l < UCX_LANES; l++) {
                pthread_mutex_lock(&ux->lanes[l].mu);
                n += ucp_worker_progress(ux->lanes[l].worker);
                pthread_mutex_unlock(&ux->lanes[l].mu);
            }
        } while (n > 0 && !atomic_load(&ux->stopping));
        bool busy = false;
        for (int l = 0; l < UCX_LANES && !busy; l++) {
            pthread_mutex_lock(&ux->lanes[l].mu);
            busy = ucp_worker_arm(ux->lanes[l].worker) == UCS_ERR_BUSY;
            pthread_mutex_unlock(&ux->lanes[l].mu);
        }
        if (busy) /* events arrived meanwhile: progress again */
            continue;
        struct epoll_event ev[UCX_LANES + 8];
        /* The timeout only bounds a wake-up UCX might not signal (none seen); events wake it at once. */
        int r = epoll_wait(ux->epfd, ev, UCX_LANES + 8, 100);
        if (r < 0 && errno != EINTR) {
            pdl_error("engine %s: ucx progress thread: epoll_wait: %s", e->key, strerror(errno));
            usleep(1000);
        }
        for (int i = 0; i < r; i++)
            if (ev[i].data.u64 != 0) /* a watched peer's pidfd; the workers' and stop fds carry 0 */
                watch_fired(e, ux, ev[i].data.u64);
    }
    return NULL;
}

/* ---------------------------------------------------------------- engine */

/*
 * Endpoints ask for peer-failure handling (a dead peer fails them instead of hanging them). UCX 1.13's
 * posix and sysv transports offer it only when UCX_POSIX_ERROR_HANDLING / UCX_SYSV_ERROR_HANDLING say
 * so (keepalive), and without it UCX leaves them out of such endpoints: two engines on one host then
 * fall back to UCX's tcp (~1 GB/s here instead of memory bandwidth). These are transport settings that
 * ucp_config_modify does not reach ("invalid configurations"), so they are defaulted in the
 * environment, once, before the first ucp_config_read, and never over a value the user set.
 */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void env_defaults(void)
{
    /* With a UCX_TLS that leaves posix and sysv out, UCX warns once that these went unused. */
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
}

static void remote_destroy(ucx_engine_t *ux, ucx_remote_t *ur);
static void ucx_mem_fini(pdl_engine_t *e, pdl_mem_t *m);

static void engine_release(pdl_engine_t *e)
{
    ucx_engine_t *ux = e->bk;
    if (ux->ctl_rkey)
        ucp_rkey_buffer_release(ux->ctl_rkey);
    if (ux->ctl_memh) {
        ucp_mem_unmap(ux->ctx, ux->ctl_memh);
        e->ctl = NULL; /* UCX's memory: engine.c must not munmap it */
    }
    if (ux->addr)
        ucp_worker_release_address(ux->lanes[0].worker, ux->addr);
    for (int l = 0; l < ux->nlanes; l++)
        ucp_worker_destroy(ux->lanes[l].worker);
    if (ux->ctx)
        ucp_cleanup(ux->ctx);
    if (ux->epfd >= 0)
        close(ux->epfd);
    if (ux->stop_fd >= 0)
        close(ux->stop_fd);
    for (int l = 0; l < UCX_LANES; l++)
        pthread_mutex_destroy(&ux->lanes[l].mu);
    pthread_mutex_destroy(&ux->watch_mu);
    free(ux);
    e->bk = NULL;
}

/* The UCP context (UCX_* environment variables pass through) and the memory types it can move. */
static pdl_status_t ucx_context_init(pdl_engine_t *e, ucx_engine_t *ux, pdl_error_t *err)
{
    pthread_once(&env_once, env_defaults);
    ucp_config_t *cfg = NULL;
    ucs_status_t us = ucp_config_read(NULL, NULL, &cfg);
    if (us != UCS_OK)
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: ucp_config_read: %s (check the UCX_* variables)",
                             e->key, ucs_status_string(us));
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 1, /* the lanes' workers run on different threads */
    };
    us = ucp_init(&params, cfg, &ux->ctx);
    ucp_config_release(cfg);
    if (us != UCS_OK) {
        ux->ctx = NULL;
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: ucp_init: %s (UCX_TLS=%s)", e->key,
                             ucs_status_string(us), getenv("UCX_TLS") ? getenv("UCX_TLS") : "(unset)");
    }
    ucp_context_attr_t ca = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (ucp_context_query(ux->ctx, &ca) == UCS_OK) {
        if (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA))
            e->mem_types |= 1u << PDL_MEM_TYPE_CUDA;
        if (ca.memory_types & UCS_BIT(UCS_MEMORY_TYPE_ROCM))
            e->mem_types |= 1u << PDL_MEM_TYPE_ROCM;
    }
    ux->ucx_types = e->mem_types;
    /* Test hook (tests/integration/test_engine_devmem.c): claim CUDA without UCX support for it, so a
     * test can register memory the CPU must not touch (PROT_NONE) as device memory on a host without a
     * GPU and prove that no pdlink path dereferences it. */
    const char *claim = getenv("PDLINK_TEST_UCX_CLAIM_CUDA");
    if (claim != NULL && strcmp(claim, "1") == 0)
        e->mem_types |= 1u << PDL_MEM_TYPE_CUDA;
    return PDL_OK;
}

/* One worker per lane, and lane 0's address: what a descriptor carries. */
static pdl_status_t ucx_workers_init(pdl_engine_t *e, ucx_engine_t *ux, pdl_error_t *err)
{
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SERIALIZED};
    ucs_status_t us;
    for (; ux->nlanes < UCX_LANES; ux->nlanes++) {
        us = ucp_worker_create(ux->ctx, &wp, &ux->lanes[ux->nlanes].worker);
        if (us != UCS_OK)
            return pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: ucp_worker_create (lane %d): %s", e->key,
                                 ux->nlanes, ucs_status_string(us));
    }
    ucp_address_t *addr = NULL;
    us = ucp_worker_get_address(ux->lanes[0].worker, &addr, &ux->addr_len);
    if (us != UCS_OK)
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: ucp_worker_get_address: %s", e->key,
                             ucs_status_string(us));
    ux->addr = addr;
    if (ux->addr_len > PDL_UCX_ADDR_MAX)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "engine %s: the UCX worker address is %zu bytes, more than the %d a descriptor carries; "
                             "narrow UCX_TLS or UCX_NET_DEVICES",
                             e->key, ux->addr_len, PDL_UCX_ADDR_MAX);
    return PDL_OK;
}

/* The live table peers check before every batch. UCX allocates it (PDL_BACKEND_CAP_ALLOC: see
 * ucx_mem_init) so that a peer on this host reads a slot with a plain load from the mapped segment
 * instead of a message round trip through this engine's progress thread (~20 us per batch). */
static pdl_status_t ucx_ctl_map(pdl_engine_t *e, ucx_engine_t *ux, pdl_error_t *err)
{
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS,
                               .length = PDL_SHM_SLOTS * sizeof(uint64_t),
                               .flags = UCP_MEM_MAP_ALLOCATE};
    ucs_status_t us = ucp_mem_map(ux->ctx, &mp, &ux->ctl_memh);
    if (us == UCS_OK) {
        ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
        us = ucp_mem_query(ux->ctl_memh, &ma);
        if (us == UCS_OK) {
            e->ctl = ma.address;
            memset(ma.address, 0, PDL_SHM_SLOTS * sizeof(uint64_t));
        }
    }
    if (us == UCS_OK)
        us = ucp_rkey_pack(ux->ctx, ux->ctl_memh, &ux->ctl_rkey, &ux->ctl_rkey_len);
    if (us != UCS_OK || ux->ctl_rkey_len > PDL_UCX_RKEY_MAX)
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: registering the live table with UCX: %s", e->key,
                             us != UCS_OK ? ucs_status_string(us) : "packed rkey too large");
    return PDL_OK;
}

/* The progress thread, woken by any lane's worker event fd or by stop_fd. */
static pdl_status_t ucx_progress_start(pdl_engine_t *e, ucx_engine_t *ux, pdl_error_t *err)
{
    for (int l = 0; l < UCX_LANES; l++) {
        ucs_status_t us = ucp_worker_get_efd(ux->lanes[l].worker, &ux->lanes[l].efd);
        if (us != UCS_OK)
            return pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: ucp_worker_get_efd: %s", e->key,
                                 ucs_status_string(us));
    }
    ux->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ux->epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    bool polled = ux->stop_fd >= 0 && ux->epfd >= 0 && epoll_ctl(ux->epfd, EPOLL_CTL_ADD, ux->stop_fd, &ev) == 0;
    for (int l = 0; l < UCX_LANES && polled; l++)
        polled = epoll_ctl(ux->epfd, EPOLL_CTL_ADD, ux->lanes[l].efd, &ev) == 0;
    if (!polled)
        return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: eventfd/epoll for the ucx progress thread: %s", e->key,
                             strerror(errno));
    int rc = pthread_create(&ux->thread, NULL, progress_main, e);
    if (rc != 0)
        return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: pthread_create (ucx progress): %s", e->key,
                             strerror(rc));
    ux->thread_started = true;
    return PDL_OK;
}

/* Each step leaves what it made in ux; on a failure engine_release undoes whatever exists. */
static pdl_status_t ucx_engine_init(pdl_engine_t *e, pdl_error_t *err)
{
    ucx_engine_t *ux = calloc(1, sizeof(*ux));
    if (ux == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    ux->stop_fd = ux->epfd = -1;
    for (int l = 0; l < UCX_LANES; l++)
        pthread_mutex_init(&ux->lanes[l].mu, NULL);
    pthread_mutex_init(&ux->watch_mu, NULL);
    e->bk = ux;
    pdl_status_t st = ucx_context_init(e, ux, err);
    if (st == PDL_OK)
        st = ucx_workers_init(e, ux, err);
    if (st == PDL_OK)
        st = ucx_ctl_map(e, ux, err);
    if (st == PDL_OK)
        st = ucx_progress_start(e, ux, err);
    if (st != PDL_OK) {
        engine_release(e);
        return st;
    }
    e->port = 0;
    return PDL_OK;
}

static void ucx_engine_fini(pdl_engine_t *e)
{
    ucx_engine_t *ux = e->bk;
    if (ux == NULL)
        return;
    if (ux->thread_started) {
        atomic_store(&ux->stopping, true);
        uint64_t one = 1;
        if (write(ux->stop_fd, &one, sizeof(one)) != sizeof(one))
            pdl_warn("engine %s: waking the ucx progress thread: %s", e->key, strerror(errno));
        pthread_join(ux->thread, NULL);
    }
    /* engine.c frees the remotes and registrations after this; their UCX objects must go before the
     * worker and the context do, so release them here and leave engine.c the plain memory. */
    pthread_mutex_lock(&e->mu);
    for (pdl_remote_t *r = e->remotes; r; r = r->next) {
        ucx_remote_t *ur = r->bk;
        if (ur == NULL)
            continue;
        remote_destroy(ux, ur);
        r->bk = NULL;
    }
    for (size_t i = 0; i < e->nmems; i++)
        ucx_mem_fini(e, e->mems[i]);
    pthread_mutex_unlock(&e->mu);
    engine_release(e);
}

static void ucx_engine_desc_fill(const pdl_engine_t *e, pdl_remote_t *r)
{
    const ucx_engine_t *ux = e->bk;
    memcpy(r->ucx_addr, ux->addr, ux->addr_len);
    r->ucx_addr_len = (uint32_t)ux->addr_len;
    memcpy(r->ctl_rkey, ux->ctl_rkey, ux->ctl_rkey_len);
    r->ctl_rkey_len = (uint32_t)ux->ctl_rkey_len;
    r->ctl_addr = (uint64_t)(uintptr_t)e->ctl;
}

/* ---------------------------------------------------------------- registrations */

static ucs_memory_type_t ucs_type(pdl_mem_type_t t)
{
    return t == PDL_MEM_TYPE_CUDA ? UCS_MEMORY_TYPE_CUDA
           : t == PDL_MEM_TYPE_ROCM ? UCS_MEMORY_TYPE_ROCM
                                    : UCS_MEMORY_TYPE_HOST;
}

static pdl_status_t ucx_mem_init(pdl_engine_t *e, pdl_mem_t *m, pdl_error_t *err)
{
    ucx_engine_t *ux = e->bk;
    ucx_mem_t *um = calloc(1, sizeof(*um));
    if (um == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = m->ptr,
        .length = m->size,
        .memory_type = ucs_type(m->type),
    };
    /* pdl_engine_alloc_mem: UCX allocates. Its posix/sysv transports can then map the region in a peer
     * on this host and copy with memcpy; memory UCX did not allocate they cannot map, and UCX serves
     * gets of it with messages the owner's worker answers (~0.3-1 GB/s here instead of ~15). */
    if (m->kind == PDL_MEM_BACKEND) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        mp.flags = UCP_MEM_MAP_ALLOCATE;
    }
    pthread_mutex_lock(&ux->lanes[0].mu);
    ucs_status_t us = ucp_mem_map(ux->ctx, &mp, &um->memh);
    if (us == UCS_OK && m->kind == PDL_MEM_BACKEND) {
        ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
        us = ucp_mem_query(um->memh, &ma);
        if (us == UCS_OK && ma.length < m->size)
            us = UCS_ERR_NO_MEMORY;
        if (us == UCS_OK)
            m->ptr = ma.address;
        else
            ucp_mem_unmap(ux->ctx, um->memh);
    }
    if (us == UCS_OK) {
        us = ucp_rkey_pack(ux->ctx, um->memh, &um->rkey, &um->rkey_len);
        if (us != UCS_OK)
            ucp_mem_unmap(ux->ctx, um->memh);
    }
    if (us == UCS_OK && um->rkey_len > PDL_UCX_RKEY_MAX) {
        ucp_rkey_buffer_release(um->rkey);
        ucp_mem_unmap(ux->ctx, um->memh);
        us = UCS_ERR_EXCEEDS_LIMIT;
    }
    pthread_mutex_unlock(&ux->lanes[0].mu);
    if (us != UCS_OK) {
        free(um);
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: ucp_mem_map/ucp_rkey_pack of %zu bytes at %p: %s",
                             e->key, m->size, m->ptr, ucs_status_string(us));
    }
    m->bk = um;
    return PDL_OK;
}

static void ucx_mem_fini(pdl_engine_t *e, pdl_mem_t *m)
{
    ucx_engine_t *ux = e->bk;
    ucx_mem_t *um = m->bk;
    if (um == NULL || ux == NULL)
        return;
    pthread_mutex_lock(&ux->lanes[0].mu);
    ucp_rkey_buffer_release(um->rkey);
    ucs_status_t us = ucp_mem_unmap(ux->ctx, um->memh);
    pthread_mutex_unlock(&ux->lanes[0].mu);
    if (us != UCS_OK)
        pdl_warn("engine %s: ucp_mem_unmap of region %" PRIu64 ": %s", e->key, m->id, ucs_status_string(us));
    free(um);
    m->bk = NULL;
}

static void ucx_mem_desc_fill(const pdl_mem_t *m, pdl_rmem_t *rm)
{
    const ucx_mem_t *um = m->bk;
    memcpy(rm->rkey, um->rkey, um->rkey_len);
    rm->rkey_len = (uint32_t)um->rkey_len;
}

/* ---------------------------------------------------------------- remote engines */

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    ucx_remote_t *ur = arg;
    pdl_status_t st = map_status(status);
    pthread_mutex_lock(&ur->fail_mu);
    if (atomic_load(&ur->dead) == 0) { /* the first failure, of any lane, says why */
        snprintf(ur->dead_msg, sizeof(ur->dead_msg), "%sengine %.120s: ucx endpoint to engine %.120s failed: %s",
                 st == PDL_ERR_PEER_GONE ? "peer gone: " : "", ur->local_key, ur->key, ucs_status_string(status));
        atomic_store(&ur->dead, (int)st);
        pdl_debug("%s", ur->dead_msg);
    }
    pthread_mutex_unlock(&ur->fail_mu);
}

/* Force-close one lane's endpoint: requests in flight complete (UCS_ERR_CANCELED) inside this call.
 * That lane's mu held. */
static void rlane_close_locked(ucx_lane_t *ln, ucx_rlane_t *rl)
{
    if (rl->ctl_rkey) {
        rl->ctl_map = NULL;
        ucp_rkey_destroy(rl->ctl_rkey);
        rl->ctl_rkey = NULL;
    }
    if (rl->ep == NULL)
        return;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(rl->ep, &p);
    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS)
            ucp_worker_progress(ln->worker);
        ucp_request_free(req);
    }
    rl->ep = NULL;
}

/* Every lane's endpoint, one lane lock at a time. */
static void remote_close(ucx_engine_t *ux, ucx_remote_t *ur)
{
    for (int l = 0; l < UCX_LANES; l++) {
        pthread_mutex_lock(&ux->lanes[l].mu);
        rlane_close_locked(&ux->lanes[l], &ur->lane[l]);
        pthread_mutex_unlock(&ux->lanes[l].mu);
    }
}

static void remote_destroy(ucx_engine_t *ux, ucx_remote_t *ur)
{
    watch_stop(ux, ur);
    remote_close(ux, ur);
    pthread_mutex_destroy(&ur->fail_mu);
    free(ur);
}

/* Whether the endpoint's lanes are UCX shared-memory transports, from UCX's own description of it. */
static bool copies_in_caller(ucp_ep_h ep)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f == NULL)
        return false;
    ucp_ep_print_info(ep, f);
    fclose(f);
    bool sm = false;
    for (size_t i = 0; i < sizeof(sm_transports) / sizeof(sm_transports[0]) && !sm; i++)
        sm = strstr(text, sm_transports[i]) != NULL;
    free(text);
    return sm;
}

/* One lane's endpoint to the remote and its unpacked live-table rkey; that lane's mu held. Sets
 * *unhandled when no transport to the peer handles peer failure. */
static ucs_status_t rlane_open_locked(ucx_lane_t *ln, ucx_remote_t *ur, ucx_rlane_t *rl, const pdl_remote_t *r,
                                      bool *unhandled)
{
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)r->ucx_addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ep_err_cb, .arg = ur},
    };
    ucs_status_t us = ucp_ep_create(ln->worker, &ep, &rl->ep);
    if (us == UCS_ERR_UNREACHABLE) {
        /* No transport to this peer handles peer failure (e.g. UCX_TLS=sm with
         * UCX_POSIX_ERROR_HANDLING=n): go on without it; ucx_remote_add says what that costs. */
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        us = ucp_ep_create(ln->worker, &ep, &rl->ep);
        if (us == UCS_OK)
            *unhandled = true;
    }
    if (us != UCS_OK) {
        rl->ep = NULL;
        return us;
    }
    us = ucp_ep_rkey_unpack(rl->ep, r->ctl_rkey, &rl->ctl_rkey);
    if (us != UCS_OK) {
        rl->ctl_rkey = NULL;
        rlane_close_locked(ln, rl);
        return us;
    }
    void *p = NULL;
    rl->ctl_map = ucp_rkey_ptr(rl->ctl_rkey, r->ctl_addr, &p) == UCS_OK ? p : NULL;
    return UCS_OK;
}

static pdl_status_t ucx_remote_add(pdl_engine_t *e, pdl_remote_t *r, pdl_error_t *err)
{
    ucx_engine_t *ux = e->bk;
    if (r->ucx_addr_len == 0 || r->ctl_rkey_len == 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "engine %s: remote engine %s has no ucx worker address", e->key,
                             r->key);
    ucx_remote_t *ur = calloc(1, sizeof(*ur));
    if (ur == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    snprintf(ur->key, sizeof(ur->key), "%s", r->key);
    ur->local_key = e->key;
    ur->pidfd = -1;
    pthread_mutex_init(&ur->fail_mu, NULL);
    ucs_status_t us = UCS_OK;
    bool unhandled = false;
    for (int l = 0; l < UCX_LANES && us == UCS_OK; l++) {
        pthread_mutex_lock(&ux->lanes[l].mu);
        us = rlane_open_locked(&ux->lanes[l], ur, &ur->lane[l], r, &unhandled);
        pthread_mutex_unlock(&ux->lanes[l].mu);
    }
    if (us == UCS_OK) {
        ur->split = copies_in_caller(ur->lane[0].ep);
        pdl_debug("engine %s: ucx endpoints to engine %s: %s", e->key, r->key,
                  ur->split ? "shared memory, batches of 2 MiB or more are split over the lanes"
                            : "not shared memory, every batch on one lane");
    }
    if (us != UCS_OK) {
        remote_destroy(ux, ur);
        return pdl_error_set(err, us == UCS_ERR_UNREACHABLE ? PDL_ERR_UNSUPPORTED : PDL_ERR_TRANSPORT,
                             "engine %s: ucx endpoint to engine %s: %s%s", e->key, r->key, ucs_status_string(us),
                             us == UCS_ERR_UNREACHABLE ? " (no common UCX transport: compare UCX_TLS on both sides)"
                                                       : "");
    }
    /* Without UCX's peer-failure handling only the watch finds a dead peer (a get from it may hang or
     * fail the process otherwise): say so once per remote when there is no watch either. */
    if (!watch_start(e, ux, ur, r) && unhandled)
        pdl_warn("engine %s: no UCX transport to engine %s handles peer failure (UCX_TLS=%s) and its process "
                 "cannot be watched from here: a dead peer will not be reported as gone; include tcp in UCX_TLS "
                 "for that",
                 e->key, r->key, getenv("UCX_TLS") ? getenv("UCX_TLS") : "(unset)");
    r->bk = ur;
    return PDL_OK;
}

static void ucx_remote_free(pdl_engine_t *e, pdl_remote_t *r)
{
    ucx_engine_t *ux = e->bk;
    ucx_remote_t *ur = r->bk;
    if (ur == NULL)
        return;
    remote_destroy(ux, ur);
    r->bk = NULL;
}

/* ---------------------------------------------------------------- sessions */

static pdl_status_t ucx_session_check(pdl_session_t *s, pdl_error_t *err)
{
    ucx_remote_t *ur = s->remote->bk;
    if (s->remote->removed)
        return pdl_error_set(err, PDL_ERR_PEER_GONE, "peer gone: engine %s: remote engine %s was removed",
                             s->engine->key, s->rmem.engine_key);
    int dead = atomic_load(&ur->dead);
    if (dead != 0) {
        pdl__session_break(s, (pdl_status_t)dead, ur->dead_msg);
        return pdl_error_set(err, (pdl_status_t)dead, "%s", ur->dead_msg);
    }
    return PDL_OK;
}

static void ucx_session_close(pdl_session_t *s);

/* Where UCX maps the whole remote region in this process (its shared-memory transports attach the
 * owner's segment when the rkey is unpacked), or NULL when it does not, or not in one piece. */
static uint8_t *region_map(ucp_rkey_h rkey, const pdl_rmem_t *rm)
{
    void *first = NULL, *last = NULL;
    if (rm->size == 0 || ucp_rkey_ptr(rkey, rm->addr, &first) != UCS_OK ||
        ucp_rkey_ptr(rkey, rm->addr + rm->size - 1, &last) != UCS_OK ||
        (uint8_t *)last != (uint8_t *)first + (rm->size - 1))
        return NULL;
    return first;
}

static pdl_status_t ucx_session_open(pdl_session_t *s, pdl_error_t *err)
{
    pdl_engine_t *e = s->engine;
    ucx_engine_t *ux = e->bk;
    ucx_remote_t *ur = s->remote->bk;
    if (s->rmem.rkey_len == 0 || s->rmem.addr == 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "engine %s: region %" PRIu64 " of engine %s has no ucx rkey or address",
                             e->key, s->rmem.id, s->rmem.engine_key);
    if (s->rmem.slot < 0 || s->rmem.slot >= PDL_SHM_SLOTS)
        return pdl_error_set(err, PDL_ERR_PARSE, "engine %s: region %" PRIu64 " of engine %s: live-table slot %" PRId64
                             " out of range",
                             e->key, s->rmem.id, s->rmem.engine_key, s->rmem.slot);
    pdl_status_t st = ucx_session_check(s, err);
    if (st != PDL_OK)
        return st;
    ucx_session_t *us = calloc(1, sizeof(*us));
    if (us == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    ucs_status_t u = UCS_OK;
    for (int l = 0; l < UCX_LANES && u == UCS_OK; l++) {
        pthread_mutex_lock(&ux->lanes[l].mu);
        ucp_ep_h ep = ur->lane[l].ep;
        u = ep ? ucp_ep_rkey_unpack(ep, s->rmem.rkey, &us->rkey[l]) : UCS_ERR_NOT_CONNECTED;
        if (u != UCS_OK)
            us->rkey[l] = NULL;
        else if (s->local->type == PDL_MEM_TYPE_HOST && s->rmem.type == PDL_MEM_TYPE_HOST)
            /* Only host memory on both sides is copied by the CPU through UCX's mapping: a device
             * region UCX maps (cuda_ipc's rkey_ptr) is a device address, and the CPU faults on it. */
            us->map[l] = region_map(us->rkey[l], &s->rmem);
        pthread_mutex_unlock(&ux->lanes[l].mu);
    }
    if (u != UCS_OK) {
        s->bk = us;
        ucx_session_close(s);
        return pdl_error_set(err, u == UCS_ERR_NOT_CONNECTED ? PDL_ERR_PEER_GONE : PDL_ERR_PARSE,
                             "engine %s: rkey of region %" PRIu64 " of engine %s: %s", e->key, s->rmem.id,
                             s->rmem.engine_key, ucs_status_string(u));
    }
    s->bk = us;
    return PDL_OK;
}

static void ucx_session_close(pdl_session_t *s)
{
    ucx_session_t *us = s->bk;
    if (us == NULL)
        return;
    ucx_engine_t *ux = s->engine->bk;
    for (int l = 0; l < UCX_LANES; l++) {
        if (us->rkey[l] == NULL)
            continue;
        pthread_mutex_lock(&ux->lanes[l].mu);
        ucp_rkey_destroy(us->rkey[l]);
        pthread_mutex_unlock(&ux->lanes[l].mu);
    }
    free(us);
    s->bk = NULL;
}

/* The endpoints are the only handle on requests in flight: closing them is how they are abandoned. */
static void ucx_session_kill(pdl_session_t *s)
{
    ucx_engine_t *ux = s->engine->bk;
    ucx_remote_t *ur = s->remote->bk;
    pthread_mutex_lock(&ur->fail_mu);
    if (atomic_load(&ur->dead) == 0) {
        snprintf(ur->dead_msg, sizeof(ur->dead_msg),
                 "engine %.100s: ucx endpoint to engine %.100s was closed (remote removed or a running batch freed)",
                 s->engine->key, ur->key);
        atomic_store(&ur->dead, (int)PDL_ERR_BAD_STATE);
    }
    pthread_mutex_unlock(&ur->fail_mu);
    remote_close(ux, ur);
}

/* A batch of UCX_SPLIT_MIN_BYTES or more to a remote reached over shared memory is cut by bytes into
 * one chunk per lane (see "Why lanes" above); UCX stripes and pipelines each chunk over its own
 * transport lanes itself. */
static int ucx_plan(pdl_session_t *s, pdl_op_t op, uint64_t bytes, size_t n)
{
    (void)op;
    (void)n;
    return ((ucx_remote_t *)s->remote->bk)->split && bytes >= UCX_SPLIT_MIN_BYTES ? UCX_LANES : 1;
}

/* ---------------------------------------------------------------- batches */

static void op_flushed(ucx_op_t *op, ucs_status_t status);

static void flush_cb(void *req, ucs_status_t status, void *user)
{
    ucp_request_free(req);
    op_flushed(user, status);
}

/* Post a flush of the chunk's endpoint: it completes once every operation posted before it has
 * (remotely) completed, or failed. The chunk's lane mu held. */
static void post_flush(ucp_ep_h ep, ucx_op_t *op)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = flush_cb,
                             .user_data = op};
    void *req = ucp_ep_flush_nbx(ep, &p);
    if (req == NULL)
        op_flushed(op, UCS_OK);
    else if (UCS_PTR_IS_ERR(req))
        op_flushed(op, UCS_PTR_STATUS(req));
}

/* Remember the first error posting an operation; the chunk reports it once the flush is done. */
static void post_failed(ucx_op_t *op, ucs_status_t us, const char *what)
{
    if (op->post_st != PDL_OK)
        return;
    pdl_session_t *s = op->b->session;
    op->post_st = pdl_error_set(&op->post_err, map_status(us), "%sengine %s: ucp_%s to engine %s region %" PRIu64 ": %s",
                                map_status(us) == PDL_ERR_PEER_GONE ? "peer gone: " : "", s->engine->key, what,
                                s->rmem.engine_key, s->rmem.id, ucs_status_string(us));
}

/* `lmem` is the registration `local` lies in, or NULL for the live-table slot (host memory on the stack
 * of no registration). */
static void post_one(ucp_ep_h ep, ucx_op_t *op, bool get, const pdl_mem_t *lmem, void *local, size_t len,
                     uint64_t raddr, ucp_rkey_h rkey)
{
    /* No callback: the request is released as soon as it completes, and the flush reports the result.
     * The local buffer's memory type and handle go with every data request: without them UCX guesses
     * the type from its memtype cache, which misses memory allocated before ucp_init, and then treats
     * a GPU buffer as host memory (a get into cuMemAlloc'ed memory crashed in ucp_get_rep_handler). */
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE, .memory_type = UCS_MEMORY_TYPE_HOST};
    if (lmem != NULL) {
        p.memory_type = ucs_type(lmem->type);
        if (lmem->bk != NULL) {
            p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            p.memh = ((const ucx_mem_t *)lmem->bk)->memh;
        }
    }
    void *req = get ? ucp_get_nbx(ep, local, len, raddr, rkey, &p) : ucp_put_nbx(ep, local, len, raddr, rkey, &p);
    if (UCS_PTR_IS_ERR(req))
        post_failed(op, UCS_PTR_STATUS(req), get ? "get_nbx" : "put_nbx");
    else if (req != NULL)
        ucp_request_free(req);
}

static void post_slot_get(pdl_session_t *s, ucx_rlane_t *rl, ucx_op_t *op)
{
    post_one(rl->ep, op, true, NULL, &op->slot, sizeof(op->slot),
             s->remote->ctl_addr + (uint64_t)s->rmem.slot * sizeof(uint64_t), rl->ctl_rkey);
}

/* The chunk's descriptors, on its lane. */
static void post_data(pdl_session_t *s, ucx_rlane_t *rl, ucx_op_t *op)
{
    pdl_batch_t *b = op->b;
    const pdl_chunk_t *c = &b->chunks[op->idx];
    ucp_rkey_h rkey = ((ucx_session_t *)s->bk)->rkey[op->idx];
    uint8_t *local = s->local->ptr;
    if (!(((ucx_engine_t *)s->engine->bk)->ucx_types & (1u << s->local->type))) {
        /* Only under the test hook: UCX would take the buffer for host memory and its CPU copy fault. */
        op->post_st = pdl_error_set(&op->post_err, PDL_ERR_UNSUPPORTED,
                                    "engine %s: this UCX does not support the memory type of local region %" PRIu64,
                                    s->engine->key, s->local->id);
        return;
    }
    for (size_t i = c->first; i < c->first + c->count; i++)
        post_one(rl->ep, op, b->op == PDL_OP_READ, s->local, local + b->d[i].local_off, b->d[i].len,
                 s->rmem.addr + b->d[i].remote_off, rkey);
}

static pdl_status_t not_registered(pdl_session_t *s, pdl_error_t *err)
{
    return pdl_error_set(err, PDL_ERR_NOT_FOUND, "engine %s: region %" PRIu64 " of engine %s is not registered any more",
                         s->engine->key, s->rmem.id, s->rmem.engine_key);
}

/* The chunk's lane mu held (a flush callback, or the thread that started the chunk). The batch may be
 * freed by its waiter as soon as pdl__batch_chunk_done returns, so nothing touches `op` after it. */
static void op_flushed(ucx_op_t *op, ucs_status_t status)
{
    pdl_batch_t *b = op->b;
    pdl_session_t *s = b->session;
    ucx_remote_t *ur = s->remote->bk;
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_status_t st = PDL_OK;
    if (op->post_st != PDL_OK) {
        st = op->post_st;
        err = op->post_err;
    } else if (status != UCS_OK) {
        int dead = atomic_load(&ur->dead);
        if (dead != 0) /* the endpoint's own error says more than the request's */
            st = pdl_error_set(&err, (pdl_status_t)dead, "%s", ur->dead_msg);
        else
            st = pdl_error_set(&err, map_status(status), "%sengine %s: %s batch to engine %s region %" PRIu64 ": %s",
                               map_status(status) == PDL_ERR_PEER_GONE ? "peer gone: " : "", s->engine->key,
                               b->op == PDL_OP_READ ? "read" : "write", s->rmem.engine_key, s->rmem.id,
                               ucs_status_string(status));
    } else if (op->phase == PHASE_CHECK && op->slot != s->rmem.id) {
        st = not_registered(s, &err);
    } else if (op->phase == PHASE_CHECK) {
        /* The region is live: now the data. */
        ucx_rlane_t *rl = &ur->lane[op->idx];
        op->phase = PHASE_XFER;
        post_data(s, rl, op);
        post_flush(rl->ep, op);
        return;
    }
    if (st == PDL_ERR_PEER_GONE || st == PDL_ERR_TIMEOUT || st == PDL_ERR_TRANSPORT)
        pdl__session_break(s, st, err.msg);
    pdl__batch_chunk_done(b, st, &err);
}

/*
 * A chunk whose region and live table UCX maps here (its shared-memory transports: ucp_rkey_ptr) is a
 * plain copy through those mappings, the same access UCX's own get makes (uct_sm_ep_get_bcopy copies
 * out of the same mapped segment) but with the copy routine of pdlink's shm engine: glibc's memcpy
 * (UCX's) moves a chunk larger than the caches at a fraction of the streaming copy's speed here
 * (copy.c). `slot` is the region's live-table slot, read before any byte moves.
 */
static void chunk_copy(pdl_batch_t *b, int idx, uint64_t slot)
{
    pdl_session_t *s = b->session;
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_status_t st = slot != s->rmem.id
                          ? not_registered(s, &err)
                          : pdl__chunk_copy_mapped(s, b, &b->chunks[idx], ((ucx_session_t *)s->bk)->map[idx], &err);
    pdl__batch_chunk_done(b, st, &err);
}

/* Start chunk idx on its lane: the live-table check, whose completion posts the data (op_flushed), or
 * over UCX's mappings the check and the copy (chunk_copy). Over UCX's shared memory all of it
 * completes inside this call. */
static void chunk_start(pdl_batch_t *b, int idx)
{
    pdl_session_t *s = b->session;
    ucx_lane_t *ln = &((ucx_engine_t *)s->engine->bk)->lanes[idx];
    ucx_rlane_t *rl = &((ucx_remote_t *)s->remote->bk)->lane[idx];
    ucx_op_t *op = op_at(b, idx);
    pthread_mutex_lock(&ln->mu);
    if (rl->ep == NULL) { /* closed since session_check; ucx_session_kill set dead first */
        ucx_remote_t *ur = s->remote->bk;
        pdl_error_t err;
        pdl_status_t st = pdl_error_set(&err, (pdl_status_t)atomic_load(&ur->dead), "%s", ur->dead_msg);
        pthread_mutex_unlock(&ln->mu);
        pdl__batch_chunk_done(b, st, &err);
        return;
    }
    if (rl->ctl_map != NULL && ((ucx_session_t *)s->bk)->map[idx] != NULL) {
        /* The table's mapping lives with the endpoint (closed under this lock); the region's with the
         * session, which outlives its batches: the copy needs no lock. */
        uint64_t slot = atomic_load_explicit(&rl->ctl_map[s->rmem.slot], memory_order_acquire);
        pthread_mutex_unlock(&ln->mu);
        chunk_copy(b, idx, slot);
        return;
    }
    post_slot_get(s, rl, op);
    post_flush(rl->ep, op);
    pthread_mutex_unlock(&ln->mu);
}

static void ucx_submit(pdl_session_t *s, pdl_batch_t *b)
{
    (void)s;
    for (int i = 0; i < b->nchunks; i++)
        *op_at(b, i) = (ucx_op_t){.b = b, .idx = i, .phase = PHASE_CHECK, .post_st = PDL_OK};
    /* The other lanes' chunks first, so that their copies start while this thread does chunk 0's. */
    for (int i = 1; i < b->nchunks; i++)
        pdl__engine_pool_drive(b, i);
    chunk_start(b, 0);
}

static bool batch_done(pdl_batch_t *b)
{
    pthread_mutex_lock(&b->mu);
    bool done = b->done;
    pthread_mutex_unlock(&b->mu);
    return done;
}

static void ucx_progress(pdl_batch_t *b, uint64_t deadline)
{
    ucx_engine_t *ux = b->session->engine->bk;
    uint64_t until = pdl__clock_now_ns() + UCX_SPIN_NS;
    if (deadline < until)
        until = deadline;
    for (;;) {
        unsigned n = 0;
        for (int l = 0; l < b->nchunks; l++) {
            /* A lane whose lock is held is busy with a copy (a pool thread's chunk) or progressed by
             * the progress thread: skip it rather than sleep on it. */
            if (pthread_mutex_trylock(&ux->lanes[l].mu) != 0)
                continue;
            n += ucp_worker_progress(ux->lanes[l].worker);
            pthread_mutex_unlock(&ux->lanes[l].mu);
        }
        if (batch_done(b) || pdl__clock_now_ns() >= until)
            return;
        if (n == 0)
            sched_yield(); /* two vCPUs: let the owner, a pool thread or our progress thread run */
    }
}

/* Chunk idx > 0 on a pool thread: start it on its lane (over shared memory that is the whole copy);
 * what remains completes through progress (the waiter's or the progress thread's). */
static void ucx_drive_chunk(pdl_batch_t *b, int idx)
{
    chunk_start(b, idx);
}

/* ---------------------------------------------------------------- selection of "rdma" */

pdl_backend_kind_t pdl_backend_pick_rdma(char *why, size_t why_cap)
{
    char dummy[8];
    if (why == NULL || why_cap == 0) {
        why = dummy;
        why_cap = sizeof(dummy);
    }
    /* UCX's own resource list, with UCX_TLS / UCX_NET_DEVICES applied: what a ucx engine would use. */
    ucp_config_t *cfg = NULL;
    ucp_context_h ctx = NULL;
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
    ucs_status_t us = ucp_config_read(NULL, NULL, &cfg);
    if (us == UCS_OK) {
        us = ucp_init(&params, cfg, &ctx);
        ucp_config_release(cfg);
    }
    if (us != UCS_OK) {
        snprintf(why, why_cap, "UCX could not be initialised (%s): using pdlink's tcp engine", ucs_status_string(us));
        return PDL_BACKEND_TCP;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (f != NULL) {
        ucp_context_print_info(ctx, f);
        fclose(f);
    }
    ucp_cleanup(ctx);
    /* Resource lines end in "<transport>/<device>"; the verbs transports are rc_verbs, rc_mlx5,
     * dc_mlx5, ud_verbs and ud_mlx5. */
    char found[128] = "", *save = NULL;
    for (char *line = text ? strtok_r(text, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
        char *t = strstr(line, "-- ");
        if (t == NULL)
            continue;
        t += 3;
        if ((strncmp(t, "rc_", 3) == 0 || strncmp(t, "dc_", 3) == 0 || strncmp(t, "ud_", 3) == 0) &&
            strlen(found) + strlen(t) + 2 < sizeof(found)) {
            if (found[0])
                strcat(found, " ");
            strcat(found, t);
        }
    }
    free(text);
    if (found[0]) {
        snprintf(why, why_cap, "UCX offers RDMA transports (%s): using the ucx backend", found);
        return PDL_BACKEND_UCX;
    }
    snprintf(why, why_cap, "UCX offers no RDMA transport (rc, dc or ud verbs) here: using pdlink's tcp engine");
    return PDL_BACKEND_TCP;
}

const pdl_backend_ops_t pdl__ucx_ops = {
    .name = "ucx",
    .caps = PDL_BACKEND_CAP_ABORT_BREAKS | PDL_BACKEND_CAP_LIVE_TABLE | PDL_BACKEND_CAP_ALLOC,
    .engine_init = ucx_engine_init,
    .engine_fini = ucx_engine_fini,
    .remote_add = ucx_remote_add,
    .remote_free = ucx_remote_free,
    .mem_init = ucx_mem_init,
    .mem_fini = ucx_mem_fini,
    .engine_desc_fill = ucx_engine_desc_fill,
    .mem_desc_fill = ucx_mem_desc_fill,
    .session_open = ucx_session_open,
    .session_close = ucx_session_close,
    .session_kill = ucx_session_kill,
    .session_check = ucx_session_check,
    .plan = ucx_plan,
    .chunk_priv = sizeof(ucx_op_t),
    .submit = ucx_submit,
    .progress = ucx_progress,
    .drive_chunk = ucx_drive_chunk,
};
