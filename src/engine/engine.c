/*
 * engine.c -- the generic part of the transfer engine (docs/engine.md): engines, the registration table,
 * remote engines, sessions, batches and the worker pool. Backends (shm.c, tcp.c) plug in through
 * pdl_backend_ops_t (backend.h).
 *
 * Batch states:   posted --(all chunks queued)--> running --(last chunk done)--> done(status)
 *   pdl_session_post   checks every range, merges, cuts into chunks, queues them     → PDL_INPROGRESS
 *                      (a one-chunk batch under ops->inline_max runs right here     → done)
 *   worker (pool_main) runs ops->run_chunk; the last chunk sets the final status   → OK or an error
 *   pdl_batch_poll / pdl_batch_wait read the state; pdl_batch_free waits for "done" (a running batch
 *   is aborted first: cancel flag, and for tcp its session's connections are shut down).
 * Backends with ops->submit (tcp) run their batches themselves instead: submit starts them from the
 * posting thread, and poll / wait / free call ops->progress so the calling thread moves the bytes
 * (no hand-off to a worker and back); chunks the backend hands to the pool run ops->drive_chunk.
 * Session states:  open --(connection lost / remote removed)--> broken (sticky: every later post
 *   returns the same status and message) --(pdl_session_close)--> closed.
 *
 * Locks: engine->mu protects registrations, remotes and sessions; the pool (common/workq.h) its own queue; each
 * batch has its own mutex. They are never nested except engine->mu → session->mu and a backend's
 * own locks → batch->mu (tcp completes batches under its connection mutex).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/copy.h"
#include "engine/backend.h"
#include "engine/liveness.h"

struct pdl_job {
    pdl_workq_item_t item; /* first: the pool hands the item back as the job */
    pdl_batch_t *batch;
    int idx;
    bool drive; /* ops->drive_chunk (the backend completes the chunk) instead of ops->run_chunk */
};

static const char *op_name(pdl_op_t op) { return op == PDL_OP_READ ? "read" : "write"; }

/* ---------------------------------------------------------------- mapped copy (shm, ucx) */

/* Cancellation is checked every this many bytes. */
#define COPY_CANCEL_STEP (64u << 20)

pdl_status_t pdl__chunk_copy_mapped(pdl_session_t *s, pdl_batch_t *b, const pdl_chunk_t *c, uint8_t *map,
                                    pdl_error_t *err)
{
    /* The CPU must never touch device memory (a fault at best, a wrong answer at worst): a backend that
     * could map such a region falls back to its transport, and this is the last line. */
    if (s->local->type != PDL_MEM_TYPE_HOST || s->rmem.type != PDL_MEM_TYPE_HOST)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "engine %s: CPU copy refused between local region %" PRIu64 " and region %" PRIu64
                             " of engine %s: one of them is device memory",
                             s->engine->key, s->local->id, s->rmem.id, s->rmem.engine_key);
    uint8_t *local = s->local->ptr;
    uint64_t since = 0;
    bool stream = c->bytes >= PDL_COPY_STREAM_MIN_CHUNK;
    for (size_t i = c->first; i < c->first + c->count; i++) {
        const pdl_desc_t *d = &b->d[i];
        uint8_t *dst = b->op == PDL_OP_READ ? local + d->local_off : map + d->remote_off;
        const uint8_t *src = b->op == PDL_OP_READ ? map + d->remote_off : local + d->local_off;
        if (stream)
            pdl__copy_stream(dst, src, d->len);
        else
            memcpy(dst, src, d->len);
        since += d->len;
        if (since >= COPY_CANCEL_STEP) {
            since = 0;
            if (atomic_load(&b->cancel))
                return pdl_error_set(err, PDL_ERR_BAD_STATE, "engine %s: batch cancelled", s->engine->key);
        }
    }
    return PDL_OK;
}

/* ---------------------------------------------------------------- worker pool */

void pdl__batch_chunk_done(pdl_batch_t *b, pdl_status_t st, const pdl_error_t *err)
{
    pdl_engine_t *e = b->session->engine;
    pthread_mutex_lock(&b->mu);
    if (st != PDL_OK && b->status == PDL_INPROGRESS) {
        b->status = st;
        b->err = *err;
        b->err.status = st;
    }
    if (--b->pending == 0) {
        if (b->status == PDL_INPROGRESS) {
            b->status = PDL_OK;
            if (b->op == PDL_OP_READ)
                atomic_fetch_add(&e->st_bytes_read, b->bytes);
            else
                atomic_fetch_add(&e->st_bytes_written, b->bytes);
            atomic_fetch_add(&e->st_batches_ok, 1);
        } else {
            atomic_fetch_add(&e->st_batches_failed, 1);
        }
        b->done = true;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
}

/* One chunk on a pool thread. Chunks queued when the engine stops still run (`stopping` is
 * ignored): their batches must reach "done" for pdl_batch_free to return. */
static void pool_run(void *arg, pdl_workq_item_t *item, bool stopping)
{
    (void)stopping;
    pdl_engine_t *e = arg;
    struct pdl_job *j = (struct pdl_job *)item;
    pdl_batch_t *b = j->batch;
    if (j->drive) {
        e->ops->drive_chunk(b, j->idx);
        return;
    }
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_status_t st;
    if (atomic_load(&b->cancel))
        st = pdl_error_set(&err, PDL_ERR_BAD_STATE, "engine %s: %s batch cancelled (freed while running)", e->key,
                           op_name(b->op));
    else
        st = e->ops->run_chunk(b->session, b, j->idx, &err);
    pdl__batch_chunk_done(b, st, &err);
}

static void pool_push(pdl_engine_t *e, struct pdl_job *jobs, int n)
{
    for (int i = 0; i + 1 < n; i++)
        jobs[i].item.next = &jobs[i + 1].item;
    pdl__workq_push_chain(&e->pool, &jobs[0].item, &jobs[n - 1].item, n);
}

void pdl__engine_pool_drive(pdl_batch_t *b, int idx)
{
    struct pdl_job *j = &((struct pdl_job *)(b + 1))[idx]; /* jobs follow the batch (pdl_session_post) */
    j->drive = true;
    pool_push(b->session->engine, j, 1);
}

/* ---------------------------------------------------------------- engine */

static void read_boot_id(char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f == NULL)
        return;
    if (fgets(out, (int)cap, f) == NULL)
        out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
}

/* Release what pdl_engine_create set up around the pool (the shm live table, the lock) and e itself;
 * the pool is stopped and the registrations and remotes are gone. */
static void engine_free(pdl_engine_t *e)
{
    if (e->ctl)
        munmap((void *)e->ctl, PDL_CTL_BYTES);
    if (e->ctl_fd >= 0)
        close(e->ctl_fd);
    pdl__grants_fini(&e->grants);
    pdl__cidrs_free(&e->trusted);
    pthread_mutex_destroy(&e->peers_mu);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

void pdl_engine_config_defaults(pdl_engine_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->backend = PDL_BACKEND_TCP;
    cfg->qp_per_transfer = 1;
    cfg->num_workers = 1;
}

/* Linux 5.1; older headers lack the name. */
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* The control memfd, once the owner mapped it writable: mode 0400 and sealed against writes, size changes
 * and more seals, so a peer that opens it through /proc reads it only. Cannot fail: an older kernel
 * without F_SEAL_FUTURE_WRITE gets the size seals and the mode alone. */
static void ctl_seal(int fd, const char *engine_key)
{
    /* memfds are created 0777. A peer reads the table through /proc/<pid>/fd (same uid or root, as the
     * kernel checks it), so it needs read access only: 0400 refuses a same-uid peer write access, and the
     * seal refuses root too. F_SEAL_FUTURE_WRITE (unlike F_SEAL_WRITE) leaves the owner's own writable
     * mapping, made before, working: the owner is the one writer of the table. */
    if (fchmod(fd, 0400) != 0)
        pdl_debug("engine %s: fchmod 0400 of the control memfd: %s", engine_key, strerror(errno));
    unsigned size = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    if (fcntl(fd, F_ADD_SEALS, size | F_SEAL_FUTURE_WRITE) != 0) {
        pdl_debug("engine %s: F_SEAL_FUTURE_WRITE on the control memfd: %s (sealing its size only)", engine_key,
                  strerror(errno));
        if (fcntl(fd, F_ADD_SEALS, size) != 0)
            pdl_debug("engine %s: sealing the control memfd: %s", engine_key, strerror(errno));
    }
}

pdl_status_t pdl_engine_create(const pdl_engine_config_t *cfg, pdl_engine_t **engine_out, pdl_error_t *err)
{
    if (cfg == NULL || engine_out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_engine_create: cfg and engine_out must not be NULL");
    if (cfg->key == NULL || cfg->key[0] == '\0' || strlen(cfg->key) >= PDL_KEY_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine key must be 1..%d bytes", PDL_KEY_MAX - 1);
    const char *host = cfg->host ? cfg->host : "127.0.0.1";
    if (strlen(host) >= PDL_KEY_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: host name too long", cfg->key);
    const pdl_backend_ops_t *ops = pdl__backend_ops(cfg->backend);
    if (ops == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: unknown backend %d (shm, tcp, ucx or cuda)", cfg->key,
                             (int)cfg->backend);
    pdl_status_t cst = pdl__backend_check(ops, err);
    if (cst != PDL_OK)
        return pdl_error_prefix(err, cst, "engine %s", cfg->key);
    if (cfg->qp_per_transfer < 1 || cfg->qp_per_transfer > 64)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: qp_per_transfer %d must be 1..64", cfg->key,
                             cfg->qp_per_transfer);
    if (cfg->num_workers < 1 || cfg->num_workers > 64)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: num_workers %d must be 1..64", cfg->key,
                             cfg->num_workers);
    if (cfg->tcp_congestion != NULL && strlen(cfg->tcp_congestion) >= sizeof(((pdl_engine_t *)0)->tcp_cc))
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: tcp_congestion '%.64s' is too long", cfg->key,
                             cfg->tcp_congestion);

    pdl_engine_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", cfg->key);
    pdl_status_t pst = pdl__cidrs_parse(cfg->trusted_hosts, &e->trusted, err);
    if (pst != PDL_OK) {
        free(e);
        pdl_error_prefix(err, pst, "engine %s", cfg->key);
        return pst;
    }
    snprintf(e->key, sizeof(e->key), "%s", cfg->key);
    snprintf(e->host, sizeof(e->host), "%s", host);
    if (gethostname(e->hostname, sizeof(e->hostname) - 1) != 0)
        snprintf(e->hostname, sizeof(e->hostname), "unknown");
    read_boot_id(e->boot_id, sizeof(e->boot_id));
    e->pid_start = pdl__proc_start_time(getpid());
    e->port = cfg->port;
    e->backend = cfg->backend;
    e->qp_per_transfer = cfg->qp_per_transfer;
    /* What the caller asked for; the tcp backend resolves it in engine_init (shm leaves it empty). */
    if (cfg->backend == PDL_BACKEND_TCP && cfg->tcp_congestion != NULL)
        snprintf(e->tcp_cc, sizeof(e->tcp_cc), "%s", cfg->tcp_congestion);
    e->num_workers = cfg->num_workers;
    e->bind_all = cfg->bind_all;
    e->auth = cfg->auth;
    e->ops = ops;
    e->mem_types = 1u << PDL_MEM_TYPE_HOST; /* a backend that registers device memory adds its types */
    e->ctl_fd = -1;
    pdl__grants_init(&e->grants);
    pthread_mutex_init(&e->peers_mu, NULL);
    pdl_ratelimit_init(&e->rl_malformed, 1000, 5);
    pdl_ratelimit_init(&e->rl_refused, 1000, 5);
    pdl_ratelimit_init(&e->rl_shed, 10000, 1);
    pthread_mutex_init(&e->mu, NULL);

    pdl_status_t st;
    /* The live-registration table is shared with peers that access memory without a server (shm maps
     * it, ucx reads it with ucp_get) so they can see a deregistration; tcp's server checks itself. A
     * backend that allocates its memory (ucx) allocates the table too, in engine_init. */
    if ((ops->caps & PDL_BACKEND_CAP_LIVE_TABLE) && !(ops->caps & PDL_BACKEND_CAP_ALLOC)) {
        size_t tbl = PDL_CTL_BYTES;
        e->ctl_fd = memfd_create("pdlink-ctl", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (e->ctl_fd < 0 || ftruncate(e->ctl_fd, (off_t)tbl) != 0) {
            st = pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: memfd_create for the registration table: %s",
                               e->key, strerror(errno));
            goto err_free;
        }
        void *p = mmap(NULL, tbl, PROT_READ | PROT_WRITE, MAP_SHARED, e->ctl_fd, 0);
        if (p == MAP_FAILED) {
            st = pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: mmap of the registration table: %s", e->key,
                               strerror(errno));
            goto err_free;
        }
        e->ctl = p;
        ctl_seal(e->ctl_fd, e->key);
        pdl__grants_publish(&e->grants, (pdl_grant_pub_t *)((uint8_t *)p + PDL_CTL_LIVE_BYTES));
    }

    char who[PDL_KEY_MAX + 32];
    snprintf(who, sizeof(who), "engine %s worker pool", e->key);
    st = pdl__workq_start(&e->pool, e->num_workers, pool_run, NULL, e, who, err);
    if (st != PDL_OK)
        goto err_free;
    st = e->ops->engine_init != NULL ? e->ops->engine_init(e, err) : PDL_OK;
    if (st != PDL_OK)
        goto err_stop;
    *engine_out = e;
    return PDL_OK;

err_stop:
    pdl__workq_stop(&e->pool);
err_free:
    engine_free(e);
    return st;
}

/* The backend's part of a registration, undone (mem_fini is optional). */
static void mem_fini(pdl_engine_t *e, pdl_mem_t *m)
{
    if (e->ops->mem_fini != NULL)
        e->ops->mem_fini(e, m);
}

static void mem_free(pdl_mem_t *m)
{
    mem_fini(m->engine, m);
    if (m->kind == PDL_MEM_MEMFD) {
        munmap(m->ptr, m->size);
        close(m->memfd);
    }
    free(m);
}

static void remote_unref_locked(pdl_engine_t *e, pdl_remote_t *r)
{
    if (--r->refs > 0)
        return;
    if (e->ops->remote_free != NULL)
        e->ops->remote_free(e, r);
    free(r);
}

void pdl_engine_destroy(pdl_engine_t *e)
{
    if (e == NULL)
        return;
    if (e->sessions != NULL)
        pdl_warn("engine %s: destroyed with sessions still open; close them first", e->key);
    /* Stop serving first: the server threads hold references on registrations. */
    if (e->ops->engine_fini != NULL)
        e->ops->engine_fini(e);

    pdl__workq_stop(&e->pool);

    for (size_t i = 0; i < e->nmems; i++)
        mem_free(e->mems[i]);
    free(e->mems);
    pthread_mutex_lock(&e->mu);
    while (e->remotes) {
        pdl_remote_t *r = e->remotes;
        e->remotes = r->next;
        remote_unref_locked(e, r);
    }
    pthread_mutex_unlock(&e->mu);
    engine_free(e);
}

const char *pdl_engine_key(const pdl_engine_t *e) { return e->key; }
pdl_backend_kind_t pdl_engine_backend(const pdl_engine_t *e) { return e->backend; }
uint16_t pdl_engine_port(const pdl_engine_t *e) { return e->backend == PDL_BACKEND_TCP ? e->port : 0; }
const char *pdl_engine_tcp_congestion(const pdl_engine_t *e) { return e->tcp_cc; }

pdl_status_t pdl_engine_pack(pdl_engine_t *e, pdl_bytes_t *out, pdl_error_t *err)
{
    if (e == NULL || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_engine_pack: engine and out must not be NULL");
    return pdl__engine_desc_pack(e, out, err);
}

void pdl_engine_get_stats(pdl_engine_t *e, pdl_engine_stats_t *out)
{
    out->batches_ok = atomic_load(&e->st_batches_ok);
    out->batches_failed = atomic_load(&e->st_batches_failed);
    out->bytes_read = atomic_load(&e->st_bytes_read);
    out->bytes_written = atomic_load(&e->st_bytes_written);
    out->bytes_served = atomic_load(&e->st_bytes_served);
    out->requests_refused = atomic_load(&e->st_requests_refused);
    out->requests_denied = atomic_load(&e->st_requests_denied);
    out->requests_served = atomic_load(&e->st_requests_served);
    out->connections_refused_untrusted = atomic_load(&e->st_conn_untrusted);
    out->connections_dropped_malformed = atomic_load(&e->st_conn_malformed);
    out->connections_shed = atomic_load(&e->st_conn_shed);
    out->connections_refused_auth = atomic_load(&e->st_conn_auth);
}

/* The row of `host` (a new one while there is room, else "other"); under peers_mu. */
static size_t peer_row_locked(pdl_engine_t *e, const char *host)
{
    size_t i = 0;
    while (i < e->npeers && i < PDL_ENGINE_MAX_PEERS && strcmp(e->peers[i].host, host) != 0)
        i++;
    if (i == e->npeers) { /* a new host: its own row while there is room, else "other" */
        if (e->npeers < PDL_ENGINE_MAX_PEERS)
            snprintf(e->peers[i].host, sizeof(e->peers[i].host), "%s", host);
        else
            snprintf(e->peers[i].host, sizeof(e->peers[i].host), "other");
        e->npeers++;
    }
    if (i >= PDL_ENGINE_MAX_PEERS) { /* rows are full: count under "other" */
        i = PDL_ENGINE_MAX_PEERS;
        e->npeers = PDL_ENGINE_MAX_PEERS + 1;
    }
    return i;
}

void pdl__engine_peer_served(pdl_engine_t *e, const char *host, uint64_t bytes)
{
    pthread_mutex_lock(&e->peers_mu);
    size_t i = peer_row_locked(e, host);
    e->peers[i].requests++;
    e->peers[i].bytes += bytes;
    pthread_mutex_unlock(&e->peers_mu);
}

bool pdl__engine_peer_auth_refused(pdl_engine_t *e, const char *host)
{
    atomic_fetch_add(&e->st_conn_auth, 1);
    pthread_mutex_lock(&e->peers_mu);
    size_t i = peer_row_locked(e, host);
    bool first = e->peers[i].auth_refused++ == 0;
    pthread_mutex_unlock(&e->peers_mu);
    return first;
}

size_t pdl_engine_peer_stats(pdl_engine_t *e, pdl_engine_peer_stats_t *out, size_t cap)
{
    pthread_mutex_lock(&e->peers_mu);
    size_t n = e->npeers;
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = e->peers[i];
    pthread_mutex_unlock(&e->peers_mu);
    return n;
}

/* ---------------------------------------------------------------- remote engines */

pdl_status_t pdl_engine_add_remote(pdl_engine_t *e, const void *desc, size_t len, char *key_out, size_t key_cap,
                                   pdl_error_t *err)
{
    if (e == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_engine_add_remote: engine is NULL");
    pdl_remote_t *r = malloc(sizeof(*r));
    if (r == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    pdl_status_t st = pdl__engine_desc_unpack(desc, len, r, err);
    if (st != PDL_OK) {
        free(r);
        return pdl_error_prefix(err, st, "engine %s", e->key);
    }
    if (r->backend != e->backend) {
        st = pdl_error_set(err, PDL_ERR_MISMATCH, "engine %s (backend %s): remote engine %s uses backend %s", e->key,
                           pdl_backend_name(e->backend), r->key, pdl_backend_name(r->backend));
        free(r);
        return st;
    }
    if (key_out != NULL && key_cap > 0)
        snprintf(key_out, key_cap, "%s", r->key);
    pthread_mutex_lock(&e->mu);
    for (pdl_remote_t *o = e->remotes; o; o = o->next) {
        if (strcmp(o->key, r->key) != 0)
            continue;
        bool same = o->pid == r->pid && o->pid_start == r->pid_start && o->port == r->port && strcmp(o->host, r->host) == 0 &&
                    strcmp(o->hostname, r->hostname) == 0;
        pthread_mutex_unlock(&e->mu);
        free(r);
        if (same)
            return PDL_OK;
        return pdl_error_set(err, PDL_ERR_BAD_STATE,
                             "engine %s: remote engine %s was already added with a different descriptor "
                             "(a restarted peer?); remove it first",
                             e->key, o->key);
    }
    pthread_mutex_unlock(&e->mu);
    /* Backend set-up (shm: pidfd and the peer's live table) happens outside the lock; it may block. */
    r->refs = 1;
    r->bk = NULL;
    st = e->ops->remote_add(e, r, err);
    if (st != PDL_OK) {
        free(r);
        return st;
    }
    pthread_mutex_lock(&e->mu);
    for (pdl_remote_t *o = e->remotes; o; o = o->next) {
        if (strcmp(o->key, r->key) == 0) { /* lost a race with another add of the same key */
            remote_unref_locked(e, r);
            pthread_mutex_unlock(&e->mu);
            return PDL_OK;
        }
    }
    r->next = e->remotes;
    e->remotes = r;
    pthread_mutex_unlock(&e->mu);
    pdl_debug("engine %s: added remote engine %s (%s, host %s port %u pid %" PRId64 ")", e->key, r->key,
              pdl_backend_name(r->backend), r->host, r->port, r->pid);
    return PDL_OK;
}

pdl_status_t pdl_engine_remove_remote(pdl_engine_t *e, const char *key, pdl_error_t *err)
{
    if (e == NULL || key == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_engine_remove_remote: engine and key must not be NULL");
    pthread_mutex_lock(&e->mu);
    pdl_remote_t **pp = &e->remotes;
    while (*pp && strcmp((*pp)->key, key) != 0)
        pp = &(*pp)->next;
    pdl_remote_t *r = *pp;
    if (r == NULL) {
        pthread_mutex_unlock(&e->mu);
        return pdl_error_set(err, PDL_ERR_NOT_FOUND, "engine %s: no remote engine '%s'", e->key, key);
    }
    *pp = r->next;
    r->removed = true;
    char msg[PDL_ERR_MSG_LEN];
    snprintf(msg, sizeof(msg), "peer gone: engine %.120s: remote engine %.120s was removed", e->key, key);
    for (pdl_session_t *s = e->sessions; s; s = s->next) {
        if (s->remote == r) {
            pdl__session_break(s, PDL_ERR_PEER_GONE, msg);
            if (e->ops->session_kill != NULL)
                e->ops->session_kill(s);
        }
    }
    remote_unref_locked(e, r);
    pthread_mutex_unlock(&e->mu);
    return PDL_OK;
}

void pdl_engine_publish(pdl_engine_t *e)
{
    /* The owner-side threads take e->mu for every request they serve (pdl__engine_mem_get), so a
     * lock/unlock pair here is a release that those acquisitions synchronise with. */
    pthread_mutex_lock(&e->mu);
    pthread_mutex_unlock(&e->mu);
}

/* ---------------------------------------------------------------- registrations */

/* Under e->mu: a random non-zero id no live or remembered registration has. A peer learns an id only
 * from a memory descriptor (pdl_mem_pack), so ids 1, 2, 3... would let anyone who reaches the data
 * port name every region; 64 random bits cannot be enumerated over a network. */
static uint64_t new_mem_id(pdl_engine_t *e)
{
    for (;;) {
        uint64_t id = 0;
        size_t got = 0;
        while (got < sizeof(id)) { /* blocks only until the kernel's pool is first seeded (at boot) */
            ssize_t r = getrandom((uint8_t *)&id + got, sizeof(id) - got, 0);
            if (r > 0)
                got += (size_t)r;
        }
        bool taken = id == 0;
        for (size_t i = 0; i < e->nmems && !taken; i++)
            taken = e->mems[i]->id == id;
        for (unsigned i = 0; i < PDL_DEAD_IDS && !taken; i++)
            taken = e->dead_ids[i] == id;
        if (!taken)
            return id;
    }
}

static pdl_status_t mem_add(pdl_engine_t *e, void *ptr, size_t size, pdl_mem_kind_t kind, pdl_mem_type_t type,
                            int memfd, pdl_mem_t **mem_out, pdl_error_t *err)
{
    pdl_mem_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory registering %zu bytes", e->key, size);
    m->engine = e;
    m->ptr = ptr;
    m->size = size;
    m->kind = kind;
    m->type = type;
    m->memfd = memfd;
    m->slot = -1;
    /* Backend registration (ucx: ucp_mem_map) before the region is visible in the table. */
    pdl_status_t st = e->ops->mem_init != NULL ? e->ops->mem_init(e, m, err) : PDL_OK;
    if (st != PDL_OK) {
        free(m);
        return st;
    }
    pthread_mutex_lock(&e->mu);
    if (e->nmems == e->capmems) {
        size_t cap = e->capmems ? e->capmems * 2 : 16;
        pdl_mem_t **v = realloc(e->mems, cap * sizeof(*v));
        if (v == NULL) {
            pthread_mutex_unlock(&e->mu);
            mem_fini(e, m);
            free(m);
            return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
        }
        e->mems = v;
        e->capmems = cap;
    }
    m->id = new_mem_id(e);
    if (e->ctl) {
        for (int i = 0; i < PDL_SHM_SLOTS; i++) {
            if (atomic_load_explicit(&e->ctl[i], memory_order_relaxed) == 0) {
                m->slot = i;
                atomic_store_explicit(&e->ctl[i], m->id, memory_order_release);
                break;
            }
        }
        if (m->slot < 0) {
            pthread_mutex_unlock(&e->mu);
            mem_fini(e, m);
            free(m);
            return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: more than %d registrations", e->key,
                                 PDL_SHM_SLOTS);
        }
    }
    e->mems[e->nmems++] = m;
    pthread_mutex_unlock(&e->mu);
    *mem_out = m;
    return PDL_OK;
}

pdl_status_t pdl_engine_alloc_mem(pdl_engine_t *e, size_t size, pdl_mem_t **mem_out, pdl_error_t *err)
{
    if (e == NULL || mem_out == NULL || size == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_engine_alloc_mem: engine, mem_out and a size > 0 needed");
    long pg = sysconf(_SC_PAGESIZE);
    if (!(e->mem_types & (1u << PDL_MEM_TYPE_HOST)))
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "engine %s: backend %s registers device memory only; allocate it on the GPU and "
                             "register it with pdl_engine_register_mem_type",
                             e->key, e->ops->name);
    if (e->ops->caps & PDL_BACKEND_CAP_ALLOC) {
        /* ucx: memory UCX allocates itself is what its shared-memory transports can map in the peer. */
        pdl_status_t st = mem_add(e, NULL, size, PDL_MEM_BACKEND, PDL_MEM_TYPE_HOST, -1, mem_out, err);
        if (st == PDL_OK)
            memset((*mem_out)->ptr, 0, size); /* zeroed, and every page touched (see below) */
        return st;
    }
    int fd = memfd_create("pdlink-mem", MFD_CLOEXEC);
    if (fd < 0)
        return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: memfd_create: %s", e->key, strerror(errno));
    if (ftruncate(fd, (off_t)size) != 0) {
        int en = errno;
        close(fd);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: ftruncate memfd to %zu bytes: %s", e->key, size,
                             strerror(en));
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        int en = errno;
        close(fd);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: mmap of %zu bytes: %s", e->key, size, strerror(en));
    }
    /* First touch of fresh memory is several times slower on these VMs (docs/benchmarks.md#this-machine);
     * write every page now so the first transfer does not pay for it. */
    for (size_t o = 0; o < size; o += (size_t)pg)
        ((volatile char *)p)[o] = 0;
    pdl_status_t st = mem_add(e, p, size, PDL_MEM_MEMFD, PDL_MEM_TYPE_HOST, fd, mem_out, err);
    if (st != PDL_OK) {
        munmap(p, size);
        close(fd);
    }
    return st;
}

pdl_status_t pdl_engine_register_mem(pdl_engine_t *e, void *ptr, size_t size, pdl_mem_t **mem_out,
                                     pdl_error_t *err)
{
    return pdl_engine_register_mem_type(e, ptr, size, PDL_MEM_TYPE_HOST, mem_out, err);
}

pdl_status_t pdl_engine_register_mem_type(pdl_engine_t *e, void *ptr, size_t size, pdl_mem_type_t type,
                                          pdl_mem_t **mem_out, pdl_error_t *err)
{
    if (e == NULL || ptr == NULL || size == 0 || mem_out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_engine_register_mem: engine, ptr, mem_out and a size > 0 "
                                                   "needed");
    if ((unsigned)type > PDL_MEM_TYPE_ROCM)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: unknown memory type %d", e->key, (int)type);
    if (!(e->mem_types & (1u << type)))
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "engine %s: backend %s cannot register %s memory here (%s)", e->key, e->ops->name,
                             type == PDL_MEM_TYPE_CUDA ? "CUDA" : type == PDL_MEM_TYPE_ROCM ? "ROCm" : "host",
                             e->backend == PDL_BACKEND_UCX    ? "UCX reports no support for it"
                             : e->backend == PDL_BACKEND_CUDA ? "the cuda backend moves CUDA memory only"
                             : e->backend == PDL_BACKEND_TCP && type == PDL_MEM_TYPE_CUDA
                                 ? "no CUDA driver here: tcp stages CUDA memory through host memory where libcuda.so.1 "
                                   "loads"
                                 : "only the ucx and cuda backends register device memory");
    return mem_add(e, ptr, size, PDL_MEM_USER, type, -1, mem_out, err);
}

unsigned pdl_engine_mem_types(const pdl_engine_t *e) { return e->mem_types; }

void pdl_engine_deregister_mem(pdl_engine_t *e, pdl_mem_t *m)
{
    if (e == NULL || m == NULL)
        return;
    pthread_mutex_lock(&e->mu);
    size_t i = 0;
    while (i < e->nmems && e->mems[i] != m)
        i++;
    if (i == e->nmems) {
        pthread_mutex_unlock(&e->mu);
        pdl_warn("engine %s: deregister of an unknown registration", e->key);
        return;
    }
    e->mems[i] = e->mems[--e->nmems];
    e->dead_ids[e->dead_next++ % PDL_DEAD_IDS] = m->id;
    atomic_store(&m->dead, true);
    if (e->ctl && m->slot >= 0)
        atomic_store_explicit(&e->ctl[m->slot], 0, memory_order_release);
    pthread_mutex_unlock(&e->mu);
    /* Requests being served hold references. A request that is just finishing drops its reference
     * within microseconds, so give those 100 ms before shutting down the connections still holding
     * one (a stalled or slow peer); killing a healthy connection that merely had not yet dropped its
     * reference would fail that peer's next batch for nothing. */
    for (int i = 0; i < 500 && atomic_load(&m->refs) > 0; i++)
        usleep(200);
    if (atomic_load(&m->refs) > 0 && e->ops->mem_kick != NULL)
        e->ops->mem_kick(e, m);
    while (atomic_load(&m->refs) > 0)
        usleep(200);
    mem_free(m);
}

pdl_mem_t *pdl__engine_mem_get(pdl_engine_t *e, uint64_t id, bool *was_dead)
{
    pdl_mem_t *found = NULL;
    *was_dead = false;
    pthread_mutex_lock(&e->mu);
    for (size_t i = 0; i < e->nmems; i++) {
        if (e->mems[i]->id == id) {
            found = e->mems[i];
            break;
        }
    }
    if (found)
        atomic_fetch_add(&found->refs, 1);
    else
        for (unsigned i = 0; i < PDL_DEAD_IDS && !*was_dead; i++)
            *was_dead = id != 0 && e->dead_ids[i] == id;
    pthread_mutex_unlock(&e->mu);
    return found;
}

void pdl__engine_mem_put(pdl_mem_t *m)
{
    if (m)
        atomic_fetch_sub(&m->refs, 1);
}

void *pdl_mem_ptr(const pdl_mem_t *m) { return m->ptr; }

pdl_status_t pdl_mem_zero(pdl_mem_t *m, const pdl_range_t *r, size_t n, pdl_error_t *err)
{
    if (m == NULL || (r == NULL && n > 0))
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_mem_zero: mem and ranges must not be NULL");
    for (size_t i = 0; i < n; i++)
        if (r[i].off > m->size || r[i].len > m->size - r[i].off)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "engine %s: zeroing [%" PRIu64 ", +%" PRIu64 ") of region %" PRIu64
                                 " (%zu bytes): outside it",
                                 m->engine->key, r[i].off, r[i].len, m->id, m->size);
    if (m->type != PDL_MEM_TYPE_HOST) {
        if (m->engine->ops->mem_zero == NULL)
            return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                                 "engine %s: backend %s cannot zero device memory (region %" PRIu64 ")",
                                 m->engine->key, m->engine->ops->name, m->id);
        return m->engine->ops->mem_zero(m, r, n, err);
    }
    for (size_t i = 0; i < n; i++)
        memset((uint8_t *)m->ptr + r[i].off, 0, r[i].len);
    return PDL_OK;
}
size_t pdl_mem_size(const pdl_mem_t *m) { return m->size; }
uint64_t pdl_mem_id(const pdl_mem_t *m) { return m->id; }

pdl_status_t pdl_engine_grant_peer(pdl_engine_t *e, const char *name, char *host, size_t cap, pdl_error_t *err)
{
    if (e == NULL || name == NULL || host == NULL || cap == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_engine_grant_peer: NULL argument");
    if (!pdl__grants_peer(&e->grants, name, host, cap))
        return pdl_error_set(err, PDL_ERR_NOT_FOUND, "engine %s: no grant %s", e->key, name);
    return PDL_OK;
}

void pdl_mem_guard(pdl_mem_t *m) { atomic_store(&m->guarded, true); }

pdl_status_t pdl_engine_grant(pdl_engine_t *e, pdl_mem_t *mem, const char *name, unsigned ops,
                              const pdl_range_t *ranges, size_t n, pdl_error_t *err)
{
    return pdl_engine_grant_to(e, mem, name, ops, ranges, n, NULL, err);
}

pdl_status_t pdl_engine_grant_to(pdl_engine_t *e, pdl_mem_t *mem, const char *name, unsigned ops,
                                 const pdl_range_t *ranges, size_t n, const char *host, pdl_error_t *err)
{
    if (e == NULL || mem == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_engine_grant: engine and mem must not be NULL");
    pdl_status_t st = pdl__grants_add_to(&e->grants, name, mem->id, ops, ranges, n, host, err);
    if (st != PDL_OK)
        pdl_error_prefix(err, st, "engine %s", e->key);
    return st;
}

pdl_status_t pdl_engine_revoke(pdl_engine_t *e, const char *name, pdl_error_t *err)
{
    if (e == NULL || name == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_engine_revoke: engine and name must not be NULL");
    if (!pdl__grants_revoke(&e->grants, name))
        return pdl_error_set(err, PDL_ERR_NOT_FOUND, "engine %s: no grant %s", e->key, name);
    return PDL_OK;
}

pdl_status_t pdl_mem_pack(const pdl_mem_t *m, pdl_bytes_t *out, pdl_error_t *err)
{
    if (m == NULL || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_mem_pack: mem and out must not be NULL");
    return pdl__mem_desc_pack(m, out, err);
}

/* ---------------------------------------------------------------- sessions */

void pdl__session_break(pdl_session_t *s, pdl_status_t st, const char *msg)
{
    pthread_mutex_lock(&s->mu);
    if (atomic_load(&s->broken) == 0) {
        snprintf(s->broken_msg, sizeof(s->broken_msg), "%s", msg);
        atomic_store(&s->broken, (int)st);
    }
    pthread_mutex_unlock(&s->mu);
}

pdl_status_t pdl_session_open(pdl_engine_t *e, pdl_mem_t *local, const void *remote_mem_desc, size_t len,
                              pdl_session_t **session_out, pdl_error_t *err)
{
    if (e == NULL || local == NULL || session_out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_session_open: engine, local and session_out must not be "
                                                   "NULL");
    if (local->engine != e || atomic_load(&local->dead))
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: local region %" PRIu64 " is not registered here",
                             e->key, local->id);
    pdl_session_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    pdl_status_t st = pdl__mem_desc_unpack(remote_mem_desc, len, &s->rmem, err);
    if (st != PDL_OK) {
        free(s);
        return pdl_error_prefix(err, st, "engine %s", e->key);
    }
    s->engine = e;
    s->local = local;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_lock(&e->mu);
    pdl_remote_t *r = e->remotes;
    while (r && strcmp(r->key, s->rmem.engine_key) != 0)
        r = r->next;
    if (r == NULL) {
        pthread_mutex_unlock(&e->mu);
        st = pdl_error_set(err, PDL_ERR_NOT_FOUND,
                           "engine %s: remote engine %s of region %" PRIu64 " was not added (pdl_engine_add_remote)",
                           e->key, s->rmem.engine_key, s->rmem.id);
        goto err_free;
    }
    r->refs++;
    s->remote = r;
    pthread_mutex_unlock(&e->mu);

    st = e->ops->session_open(s, err);
    if (st != PDL_OK)
        goto err_unref;
    pthread_mutex_lock(&e->mu);
    s->next = e->sessions;
    e->sessions = s;
    pthread_mutex_unlock(&e->mu);
    *session_out = s;
    return PDL_OK;

err_unref:
    pthread_mutex_lock(&e->mu);
    remote_unref_locked(e, r);
    pthread_mutex_unlock(&e->mu);
err_free:
    pthread_mutex_destroy(&s->mu);
    free(s);
    return st;
}

pdl_status_t pdl_session_prefault(pdl_session_t *s, pdl_error_t *err)
{
    if (s == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_session_prefault: no session");
    if (s->engine->ops->session_prefault == NULL)
        return PDL_OK;
    return s->engine->ops->session_prefault(s, err);
}

bool pdl_session_broken(pdl_session_t *s) { return s != NULL && atomic_load(&s->broken) != 0; }

void pdl_session_close(pdl_session_t *s)
{
    if (s == NULL)
        return;
    pdl_engine_t *e = s->engine;
    pthread_mutex_lock(&e->mu);
    pdl_session_t **pp = &e->sessions;
    while (*pp && *pp != s)
        pp = &(*pp)->next;
    if (*pp)
        *pp = s->next;
    pthread_mutex_unlock(&e->mu);
    e->ops->session_close(s);
    pthread_mutex_lock(&e->mu);
    remote_unref_locked(e, s->remote);
    pthread_mutex_unlock(&e->mu);
    pthread_mutex_destroy(&s->mu);
    free(atomic_exchange(&s->spare, NULL));
    free(s);
}

/* ---------------------------------------------------------------- batches */

/*
 * A batch of many descriptors is one large allocation (a 32,768-piece head split: 786 KiB). Fresh from
 * malloc on every post, its pages were faulted in again each time, since glibc gives blocks that large
 * back to the system when they are freed: that first touch cost more than checking and merging the
 * descriptors (tools/cuda-bench.c). So a session keeps the allocation of its last freed batch, and its
 * next post reuses it when it is large enough; pdl_session_close frees it.
 */
static pdl_batch_t *batch_alloc(pdl_session_t *s, size_t sz, size_t *cap)
{
    pdl_batch_t *b = atomic_exchange(&s->spare, NULL);
    if (b != NULL && b->alloc >= sz) {
        *cap = b->alloc;
        return b;
    }
    free(b);
    *cap = sz;
    return malloc(sz);
}

static pdl_status_t check_range(const pdl_session_t *s, pdl_op_t op, size_t i, const pdl_desc_t *d,
                                pdl_error_t *err)
{
    const pdl_engine_t *e = s->engine;
    if (d->len == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: %s descriptor %zu has length 0", e->key, op_name(op), i);
    if (d->local_off > s->local->size || d->len > s->local->size - d->local_off)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "engine %s: %s [%" PRIu64 ", +%" PRIu64 ") outside local region %" PRIu64
                             " (size %zu), descriptor %zu",
                             e->key, op_name(op), d->local_off, d->len, s->local->id, s->local->size, i);
    if (d->remote_off > s->rmem.size || d->len > s->rmem.size - d->remote_off)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "engine %s: %s [%" PRIu64 ", +%" PRIu64 ") outside region %" PRIu64
                             " of engine %s (size %" PRIu64 "), descriptor %zu",
                             e->key, op_name(op), d->remote_off, d->len, s->rmem.id, s->rmem.engine_key,
                             s->rmem.size, i);
    return PDL_OK;
}

pdl_status_t pdl_session_post(pdl_session_t *s, pdl_op_t op, const pdl_desc_t *descs, size_t n,
                              pdl_batch_t **batch_out, pdl_error_t *err)
{
    return pdl_session_post_granted(s, op, NULL, descs, n, batch_out, err);
}

/* The checks before any work: the arguments, the session's sticky error, the local region, and the
 * backend's own view of the session. */
static pdl_status_t post_check(pdl_session_t *s, pdl_op_t op, size_t glen, const pdl_desc_t *descs, size_t n,
                               pdl_batch_t **batch_out, pdl_error_t *err)
{
    if (glen > PDL_GRANT_NAME_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_session_post: grant name of %zu bytes (at most %d)", glen,
                             PDL_GRANT_NAME_MAX);
    if (s == NULL || batch_out == NULL || (descs == NULL && n > 0))
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_session_post: session, descs and batch_out must not be NULL");
    pdl_engine_t *e = s->engine;
    if (op != PDL_OP_READ && op != PDL_OP_WRITE)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: unknown op %d", e->key, (int)op);
    if (n == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "engine %s: empty %s batch", e->key, op_name(op));
    int broken = atomic_load(&s->broken);
    if (broken != 0) {
        pthread_mutex_lock(&s->mu);
        pdl_status_t st = pdl_error_set(err, (pdl_status_t)broken, "%s", s->broken_msg);
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    if (atomic_load(&s->local->dead))
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "engine %s: local region %" PRIu64 " was deregistered", e->key,
                             s->local->id);
    return e->ops->session_check(s, err);
}

/* Pass 1: check every range, count bytes and the descriptors left after merging runs adjacent on both
 * sides (the order given is kept). */
static pdl_status_t post_count(const pdl_session_t *s, pdl_op_t op, const pdl_desc_t *descs, size_t n,
                               uint64_t *bytes_p, size_t *merged_p, pdl_error_t *err)
{
    uint64_t bytes = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        pdl_status_t st = check_range(s, op, i, &descs[i], err);
        if (st != PDL_OK)
            return st;
        bytes += descs[i].len; /* cannot overflow: each len is bounded by a region size */
        if (i == 0 || descs[i - 1].local_off + descs[i - 1].len != descs[i].local_off ||
            descs[i - 1].remote_off + descs[i - 1].len != descs[i].remote_off)
            k++;
    }
    *bytes_p = bytes;
    *merged_p = k;
    return PDL_OK;
}

/*
 * Pass 2: merge descs into m (k runs, as post_count counted), then cut m into `nchunks` chunks of about
 * equal bytes in cut[], splitting a descriptor that crosses a boundary. With one chunk m is cut itself
 * and nothing is split. Returns the number of cut descriptors; *used_p is the number of chunks used.
 */
static size_t post_cut(const pdl_desc_t *descs, size_t n, pdl_desc_t *m, size_t k, uint64_t bytes, int nchunks,
                       pdl_chunk_t *chunks, pdl_desc_t *cut, int *used_p)
{
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (j > 0 && m[j - 1].local_off + m[j - 1].len == descs[i].local_off &&
            m[j - 1].remote_off + m[j - 1].len == descs[i].remote_off)
            m[j - 1].len += descs[i].len;
        else
            m[j++] = descs[i];
    }
    size_t nc = 0;
    int c = 0;
    if (nchunks == 1) {
        nc = k;
        chunks[0] = (pdl_chunk_t){0, k, bytes};
    } else {
        uint64_t target = (bytes + (uint64_t)nchunks - 1) / (uint64_t)nchunks;
        for (size_t i = 0; i < k; i++) {
            pdl_desc_t d = m[i];
            while (d.len > 0) {
                uint64_t room = target - chunks[c].bytes;
                uint64_t take = d.len < room || c == nchunks - 1 ? d.len : room;
                cut[nc++] = (pdl_desc_t){d.local_off, d.remote_off, take};
                chunks[c].count++;
                chunks[c].bytes += take;
                d.local_off += take;
                d.remote_off += take;
                d.len -= take;
                if (chunks[c].bytes >= target && c < nchunks - 1 && (d.len > 0 || i + 1 < k)) {
                    c++;
                    chunks[c].first = nc;
                }
            }
        }
    }
    *used_p = c + 1;
    return nc;
}

/* Start a filled batch: the backend's own submit, a copy now for a small batch, or the worker pool. */
static void post_start(pdl_engine_t *e, pdl_session_t *s, pdl_batch_t *b, struct pdl_job *jobs)
{
    if (e->ops->submit) {
        e->ops->submit(s, b);
        return;
    }
    if (b->nchunks == 1 && b->bytes <= e->ops->inline_max) {
        /* Small shm batch: copy now rather than wake a worker (the hand-off costs more than the copy). */
        pdl_error_t cerr;
        pdl_error_clear(&cerr);
        pdl_status_t cst = e->ops->run_chunk(s, b, 0, &cerr);
        pdl__batch_chunk_done(b, cst, &cerr);
        return;
    }
    pool_push(e, jobs, b->nchunks);
}

pdl_status_t pdl_session_post_granted(pdl_session_t *s, pdl_op_t op, const char *grant, const pdl_desc_t *descs,
                                      size_t n, pdl_batch_t **batch_out, pdl_error_t *err)
{
    size_t glen = grant ? strlen(grant) : 0;
    pdl_status_t st = post_check(s, op, glen, descs, n, batch_out, err);
    if (st != PDL_OK)
        return st;
    pdl_engine_t *e = s->engine;
    uint64_t bytes = 0;
    size_t k = 0;
    st = post_count(s, op, descs, n, &bytes, &k, err);
    if (st != PDL_OK)
        return st;
    int nchunks = e->ops->plan != NULL ? e->ops->plan(s, op, bytes, k) : 1;
    if (nchunks < 1)
        nchunks = 1;

    /* One allocation per batch: the batch, its jobs and chunks, the cut descriptors and (when cutting)
     * the merged list. Small batches are dominated by this fixed cost, so it is kept to one malloc. */
    size_t ncut = k + (size_t)nchunks - 1;
    size_t priv = (e->ops->chunk_priv + 15) & ~(size_t)15;
    size_t sz = sizeof(pdl_batch_t) + (size_t)nchunks * (sizeof(struct pdl_job) + sizeof(pdl_chunk_t) + priv) +
                (ncut + (nchunks > 1 ? k : 0)) * sizeof(pdl_desc_t);
    size_t cap = 0;
    pdl_batch_t *b = batch_alloc(s, sz, &cap);
    if (b == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory for a batch of %zu descriptors", e->key, n);
    memset(b, 0, sizeof(*b));
    b->alloc = cap;
    struct pdl_job *jobs = (struct pdl_job *)(b + 1);
    pdl_chunk_t *chunks = (pdl_chunk_t *)(jobs + nchunks);
    uint8_t *privp = (uint8_t *)(chunks + nchunks);
    pdl_desc_t *cut = (pdl_desc_t *)(privp + (size_t)nchunks * priv);
    pdl_desc_t *m = nchunks > 1 ? cut + ncut : cut;
    memset(chunks, 0, (size_t)nchunks * sizeof(*chunks));

    int used = 1;
    size_t nc = post_cut(descs, n, m, k, bytes, nchunks, chunks, cut, &used);
    b->session = s;
    b->op = op;
    memcpy(b->grant, grant ? grant : "", glen + 1);
    b->d = cut;
    b->n = nc;
    b->n_merged = k;
    b->bytes = bytes;
    b->chunks = chunks;
    b->nchunks = used;
    b->pending = b->nchunks;
    b->status = PDL_INPROGRESS;
    pthread_mutex_init(&b->mu, NULL);
    pdl__clock_cond_init(&b->cv);
    b->priv = priv ? privp : NULL;
    for (int q = 0; q < b->nchunks; q++) {
        jobs[q].batch = b;
        jobs[q].idx = q;
        jobs[q].drive = false;
    }
    *batch_out = b;
    post_start(e, s, b, jobs);
    return PDL_OK;
}

pdl_status_t pdl_batch_poll(pdl_batch_t *b, pdl_error_t *err)
{
    if (b == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_batch_poll: batch is NULL");
    if (b->session->engine->ops->progress) {
        pthread_mutex_lock(&b->mu);
        bool done = b->done;
        pthread_mutex_unlock(&b->mu);
        if (!done)
            b->session->engine->ops->progress(b, 0);
    }
    pthread_mutex_lock(&b->mu);
    pdl_status_t st = b->done ? b->status : PDL_INPROGRESS;
    if (b->done && st != PDL_OK && err != NULL)
        *err = b->err;
    pthread_mutex_unlock(&b->mu);
    return st;
}

pdl_status_t pdl_batch_wait(pdl_batch_t *b, int timeout_ms, pdl_error_t *err)
{
    if (b == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "pdl_batch_wait: batch is NULL");
    /* Deadline in pdl__clock_now_ns time: UINT64_MAX waits forever, 0 is one non-blocking pass. */
    uint64_t deadline = timeout_ms < 0    ? UINT64_MAX
                        : timeout_ms == 0 ? 0
                                          : pdl__clock_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    struct timespec dl = pdl__clock_timespec(deadline); /* b->cv waits on CLOCK_MONOTONIC */
    if (b->session->engine->ops->progress && !atomic_load_explicit(&b->done, memory_order_acquire)) {
        /* The waiting thread moves the batch's bytes itself (tcp): no hand-off, no extra wake-up. A batch
         * its post already finished (ucx over shared memory copies inside the post) skips the progress
         * pass, whose lane locks and worker progress were a measurable share of a 64 KiB batch. */
        b->session->engine->ops->progress(b, deadline);
    }
    pthread_mutex_lock(&b->mu);
    while (!b->done) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&b->cv, &b->mu);
        } else if (timeout_ms == 0 || pthread_cond_timedwait(&b->cv, &b->mu, &dl) == ETIMEDOUT) {
            if (b->done)
                break;
            pthread_mutex_unlock(&b->mu);
            return pdl_error_set(err, PDL_INPROGRESS,
                                 "engine %s: %s batch of %" PRIu64 " bytes from engine %s region %" PRIu64
                                 " still running after %d ms",
                                 b->session->engine->key, op_name(b->op), b->bytes, b->session->rmem.engine_key,
                                 b->session->rmem.id, timeout_ms);
        }
    }
    pdl_status_t st = b->status;
    if (st != PDL_OK && err != NULL)
        *err = b->err;
    pthread_mutex_unlock(&b->mu);
    return st;
}

void pdl_batch_free(pdl_batch_t *b)
{
    if (b == NULL)
        return;
    pthread_mutex_lock(&b->mu);
    bool done = b->done;
    pthread_mutex_unlock(&b->mu);
    if (!done) {
        /* A running batch may be stuck on a stalled peer: abort it so freeing cannot hang. */
        atomic_store(&b->cancel, true);
        if ((b->session->engine->ops->caps & PDL_BACKEND_CAP_ABORT_BREAKS) && b->session->engine->ops->session_kill) {
            char msg[PDL_ERR_MSG_LEN];
            snprintf(msg, sizeof(msg), "engine %.120s: session to engine %.120s aborted: a running batch was freed",
                     b->session->engine->key, b->session->rmem.engine_key);
            pdl__session_break(b->session, PDL_ERR_BAD_STATE, msg);
            b->session->engine->ops->session_kill(b->session);
        }
        if (b->session->engine->ops->progress)
            b->session->engine->ops->progress(b, UINT64_MAX); /* fails fast on the shut-down sockets */
        pthread_mutex_lock(&b->mu);
        while (!b->done)
            pthread_cond_wait(&b->cv, &b->mu);
        pthread_mutex_unlock(&b->mu);
    }
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    /* Descriptors, jobs and chunks live in the same allocation, kept for the session's next post. */
    free(atomic_exchange(&b->session->spare, b));
}

uint64_t pdl_batch_bytes(const pdl_batch_t *b) { return b ? b->bytes : 0; }

size_t pdl_batch_num_descs(const pdl_batch_t *b) { return b ? b->n_merged : 0; }
