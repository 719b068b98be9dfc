/*
 * cuda.c -- transfer backend between GPUs of one host: CUDA IPC handles and copies run by the GPU.
 *
 * The CUDA driver is loaded at run time and its copies (the gather kernel) live in cudadrv.c, shared
 * with the tcp backend's staged path: nothing of CUDA is needed to build pdlink or to run it where
 * there is no GPU, and there engine creation fails with PDL_ERR_UNSUPPORTED and the reason.
 *
 * Why legacy IPC handles (cuIpcGetMemHandle): on the H200 this was built for, UCX's cuda_ipc transport
 * was not taken and NIXL moved 0.5 GB/s, while a copy through a legacy IPC handle (what torch uses)
 * ran at ~2,000 GB/s (docs/gpu.md). A registration's descriptor carries the handle of the allocation
 * holding it (cuMemGetAddressRange) and its offset inside; a session opens the handle once per remote
 * allocation (cached, reference-counted by sessions, closed when the last session on it closes).
 *
 * A batch's pieces go through one launch of cudadrv.c's gather kernel (pieces of 4 MiB or more through
 * cuMemcpyDtoDAsync), on a stream of its own lane. A batch of up to PDL_CUDA_INLINE_PIECES pieces is
 * launched by the posting thread on an inline lane and completed by whoever waits for it (the submit
 * and progress entries); a larger one, or one that finds every inline lane taken, runs on a worker
 * (one lane each), which synchronises its stream before the batch reports done.
 *
 * An inline batch's states (cuda_op_t.state): OP_RUNNING from cuda_submit's launch; OP_COMPLETING
 * while one thread's cuda_progress waits for its stream (others see it taken and leave it); then
 * OP_DONE (cuda_finish: the grant checked again, the lane given back, the chunk done), or back to
 * OP_RUNNING when the wait's deadline passes first. A worker's batch is OP_WORKER throughout and its
 * progress is the worker's.
 *
 * The CPU never reads or writes device memory here: registrations are checked with
 * cuMemGetAddressRange, and only the GPU touches the bytes.
 *
 * Security is shm's (same host, same uid): the peer's liveness and live-registration table come from
 * shm.c (pidfd, /proc/<pid>/fd of its table, which needs the same uid or root), ranges are checked at
 * post time against the registered sizes (engine.c). An IPC handle opens the whole allocation, not
 * just the registered range: a process that gets a descriptor can reach every byte of that allocation
 * (docs/security.md).
 *
 * The context: the one current on the thread that creates the engine (torch makes its device's primary
 * context current), else device 0's primary context. All registrations must be on that context's
 * device; peers on other GPUs of the host are reached through the IPC mapping (peer access).
 */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "engine/backend.h"
#include "engine/cudadrv.h"

#define PDL_CUDA_LANES 64
/*
 * Why inline: a batch handed to a worker pays two thread wake-ups (the worker's, then the waiter's),
 * a fixed cost per batch that a small one does not repay; launched by the poster it pays neither. A
 * batch of more pieces than this still goes to a worker, so that a thread posting one batch per layer
 * builds the next layer's list while a worker builds this one's (about 1.3 ns a piece on the build
 * machine, tools/cuda-bench.c). Inline lanes are their own: a worker never waits for a lane that only
 * a waiter's progress gives back.
 */
#define PDL_CUDA_INLINE_PIECES 8192
#define PDL_CUDA_INLINE_LANES 8

_Static_assert(sizeof(CUipcMemHandle) == PDL_CUDA_IPC_HANDLE, "descriptors carry a whole CUipcMemHandle");

typedef struct cuda_lane { /* a worker's stream and gather list; taken by one chunk at a time */
    CUstream stream;
    pdl_cuda_list_t list;
} cuda_lane_t;

/* An opened remote allocation: IPC handles open once per process and context, so sessions share it. */
typedef struct cuda_ipc {
    char engine_key[PDL_KEY_MAX];
    int64_t pid;
    uint8_t handle[PDL_CUDA_IPC_HANDLE];
    CUdeviceptr base;
    size_t size;
    int refs;
    struct cuda_ipc *next;
} cuda_ipc_t;

typedef struct cuda_engine {
    pdl_cudadrv_t *drv;
    pthread_mutex_t mu; /* free lanes, ipc cache */
    pthread_cond_t cv;
    cuda_lane_t lanes[PDL_CUDA_LANES + PDL_CUDA_INLINE_LANES]; /* the workers', then the inline ones */
    int free_lanes[PDL_CUDA_LANES];
    int free_inline[PDL_CUDA_INLINE_LANES];
    int nfree, ninline, nlanes;
    cuda_ipc_t *ipcs;
} cuda_engine_t;

enum { OP_WORKER, OP_RUNNING, OP_COMPLETING, OP_DONE };

typedef struct cuda_op { /* a chunk's state (b->priv) */
    _Atomic int state;
    cuda_lane_t *ln;     /* the inline lane it runs on */
    uint64_t slot, seq;  /* its grant's, checked again when it completes */
} cuda_op_t;

typedef struct cuda_mem {
    CUipcMemHandle handle;
    uint64_t off; /* of the registration in its allocation */
} cuda_mem_t;

typedef struct cuda_session {
    cuda_ipc_t *ipc;    /* NULL when the owner is this process */
    CUdeviceptr remote; /* the remote region's first byte, here */
} cuda_session_t;

static const char *cu_name(const cuda_engine_t *ce, CUresult r) { return pdl__cudadrv_errname(ce->drv, r); }

/* Run a driver call with the engine's context pushed on the calling thread (the caller's own current
 * context, if any, is restored). */
static bool ctx_push(cuda_engine_t *ce) { return pdl__cudadrv_push(ce->drv); }
static void ctx_pop(cuda_engine_t *ce) { pdl__cudadrv_pop(ce->drv); }

/* ---------------------------------------------------------------- engine */

static void lanes_free(cuda_engine_t *ce)
{
    for (int i = 0; i < ce->nlanes; i++) {
        cuda_lane_t *ln = &ce->lanes[i];
        pdl__cudadrv_list_free(ce->drv, &ln->list);
        if (ln->stream)
            ce->drv->api.StreamDestroy(ln->stream);
    }
    ce->nlanes = 0;
}

static void cuda_release(cuda_engine_t *ce)
{
    if (ce == NULL)
        return;
    if (ce->drv != NULL && ce->drv->ctx != NULL && ctx_push(ce)) {
        while (ce->ipcs) {
            cuda_ipc_t *c = ce->ipcs;
            ce->ipcs = c->next;
            ce->drv->api.IpcCloseMemHandle(c->base);
            free(c);
        }
        lanes_free(ce);
        ctx_pop(ce);
    }
    pdl__cudadrv_close(ce->drv);
    pthread_mutex_destroy(&ce->mu);
    pthread_cond_destroy(&ce->cv);
    free(ce);
}

static pdl_status_t cuda_engine_init(pdl_engine_t *e, pdl_error_t *err)
{
    cuda_engine_t *ce = calloc(1, sizeof(*ce));
    if (ce == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    pthread_mutex_init(&ce->mu, NULL);
    pthread_cond_init(&ce->cv, NULL);
    pdl_status_t st = pdl__cudadrv_open(e->key, "cuda", &ce->drv, err);
    if (st == PDL_OK)
        st = pdl__cudadrv_ctx(ce->drv, e->key, err);
    if (st == PDL_OK && !ctx_push(ce))
        st = pdl_error_set(err, PDL_ERR_UNSUPPORTED, "engine %s: cannot make the CUDA context current", e->key);
    else if (st == PDL_OK) {
        int nw = e->num_workers < PDL_CUDA_LANES ? e->num_workers : PDL_CUDA_LANES;
        for (int i = 0; st == PDL_OK && i < nw + PDL_CUDA_INLINE_LANES; i++) {
            cuda_lane_t *ln = &ce->lanes[i];
            ce->nlanes = i + 1;
            CUresult r = ce->drv->api.StreamCreate(&ln->stream, CU_STREAM_NON_BLOCKING);
            if (r != CUDA_SUCCESS)
                st = pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: backend cuda: cuStreamCreate: %s", e->key,
                                   cu_name(ce, r));
            if (i < nw)
                ce->free_lanes[ce->nfree++] = i;
            else
                ce->free_inline[ce->ninline++] = i;
        }
        ctx_pop(ce);
    }
    if (st != PDL_OK) {
        cuda_release(ce);
        return st;
    }
    e->mem_types = 1u << PDL_MEM_TYPE_CUDA; /* device memory only: host memory has shm */
    e->bk = ce;
    return PDL_OK;
}

static void cuda_engine_fini(pdl_engine_t *e)
{
    cuda_release(e->bk);
    e->bk = NULL;
}

/* ---------------------------------------------------------------- registrations */

static pdl_status_t cuda_mem_init(pdl_engine_t *e, pdl_mem_t *m, pdl_error_t *err)
{
    cuda_engine_t *ce = e->bk;
    if (m->type != PDL_MEM_TYPE_CUDA)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED, "engine %s: backend cuda registers CUDA memory only", e->key);
    cuda_mem_t *cm = calloc(1, sizeof(*cm));
    if (cm == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    if (!ctx_push(ce)) {
        free(cm);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: cannot make its CUDA context current", e->key);
    }
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)m->ptr, base = 0;
    size_t asize = 0;
    pdl_status_t st = PDL_OK;
    CUresult r = ce->drv->api.MemGetAddressRange(&base, &asize, p);
    if (r != CUDA_SUCCESS)
        st = pdl_error_set(err, PDL_ERR_INVALID,
                           "engine %s: %p is not device memory of this engine's CUDA context (cuMemGetAddressRange: "
                           "%s)",
                           e->key, m->ptr, cu_name(ce, r));
    else if (p - base > asize || m->size > asize - (p - base))
        st = pdl_error_set(err, PDL_ERR_INVALID,
                           "engine %s: [%p, +%zu) runs past the end of its CUDA allocation (%zu bytes at 0x%llx)",
                           e->key, m->ptr, m->size, asize, base);
    else if ((r = ce->drv->api.IpcGetMemHandle(&cm->handle, base)) != CUDA_SUCCESS)
        st = pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                           "engine %s: cuIpcGetMemHandle of the allocation holding %p: %s (legacy CUDA IPC needs "
                           "cudaMalloc/cuMemAlloc memory: not managed, host or VMM memory such as torch's "
                           "expandable segments)",
                           e->key, m->ptr, cu_name(ce, r));
    ctx_pop(ce);
    if (st != PDL_OK) {
        free(cm);
        return st;
    }
    cm->off = p - base;
    m->bk = cm;
    return PDL_OK;
}

static void cuda_mem_fini(pdl_engine_t *e, pdl_mem_t *m)
{
    (void)e;
    free(m->bk);
    m->bk = NULL;
}

static void cuda_mem_desc_fill(const pdl_mem_t *m, pdl_rmem_t *rm)
{
    const cuda_mem_t *cm = m->bk;
    memcpy(rm->ipc, cm->handle.reserved, PDL_CUDA_IPC_HANDLE);
    rm->ipc_len = PDL_CUDA_IPC_HANDLE;
    rm->ipc_off = cm->off;
}

/* ---------------------------------------------------------------- sessions */

static pdl_status_t cuda_session_check(pdl_session_t *s, pdl_error_t *err) { return pdl__shm_session_check(s, err); }

static pdl_status_t cuda_session_open(pdl_session_t *s, pdl_error_t *err)
{
    pdl_engine_t *e = s->engine;
    cuda_engine_t *ce = e->bk;
    const pdl_rmem_t *rm = &s->rmem;
    if (rm->type != PDL_MEM_TYPE_CUDA || rm->ipc_len != PDL_CUDA_IPC_HANDLE)
        return pdl_error_set(err, PDL_ERR_PARSE,
                             "engine %s: region %" PRIu64 " of engine %s is not CUDA memory with an IPC handle "
                             "(registered by a cuda engine?)",
                             e->key, rm->id, rm->engine_key);
    if (rm->pid != s->remote->pid)
        return pdl_error_set(err, PDL_ERR_MISMATCH,
                             "engine %s: region %" PRIu64 " names pid %" PRId64 " but engine %s runs as pid %" PRId64,
                             e->key, rm->id, rm->pid, s->remote->key, s->remote->pid);
    pdl_status_t st = cuda_session_check(s, err);
    if (st != PDL_OK)
        return st;
    cuda_session_t *cs = calloc(1, sizeof(*cs));
    if (cs == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    if (rm->pid == (int64_t)getpid()) {
        /* The owner is this process: its address is valid here, and CUDA refuses to open one's own handle. */
        cs->remote = (CUdeviceptr)rm->addr;
        s->bk = cs;
        return PDL_OK;
    }
    pthread_mutex_lock(&ce->mu);
    cuda_ipc_t *c = ce->ipcs;
    while (c && !(c->pid == rm->pid && strcmp(c->engine_key, rm->engine_key) == 0 &&
                  memcmp(c->handle, rm->ipc, PDL_CUDA_IPC_HANDLE) == 0))
        c = c->next;
    if (c == NULL) {
        c = calloc(1, sizeof(*c));
        if (c == NULL) {
            st = pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
        } else if (!ctx_push(ce)) {
            st = pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: cannot make its CUDA context current", e->key);
        } else {
            CUipcMemHandle h;
            memcpy(h.reserved, rm->ipc, PDL_CUDA_IPC_HANDLE);
            CUresult r = ce->drv->api.IpcOpenMemHandle(&c->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
            CUdeviceptr b2 = 0;
            if (r == CUDA_SUCCESS && (r = ce->drv->api.MemGetAddressRange(&b2, &c->size, c->base)) != CUDA_SUCCESS)
                ce->drv->api.IpcCloseMemHandle(c->base);
            if (r != CUDA_SUCCESS)
                st = pdl_error_set(err, PDL_ERR_SYSTEM,
                                   "engine %s: cuIpcOpenMemHandle of region %" PRIu64 " of engine %s (pid %" PRId64
                                   "): %s (both processes need the same host and access to each other's GPU)",
                                   e->key, rm->id, rm->engine_key, rm->pid, cu_name(ce, r));
            ctx_pop(ce);
        }
        if (st == PDL_OK) {
            snprintf(c->engine_key, sizeof(c->engine_key), "%s", rm->engine_key);
            c->pid = rm->pid;
            memcpy(c->handle, rm->ipc, PDL_CUDA_IPC_HANDLE);
            c->next = ce->ipcs;
            ce->ipcs = c;
        } else {
            free(c);
            c = NULL;
        }
    }
    if (c != NULL && (rm->ipc_off > c->size || rm->size > c->size - rm->ipc_off)) {
        st = pdl_error_set(err, PDL_ERR_MISMATCH,
                           "engine %s: region %" PRIu64 " of engine %s claims [%" PRIu64 ", +%" PRIu64
                           ") of an allocation of %zu bytes",
                           e->key, rm->id, rm->engine_key, rm->ipc_off, rm->size, c->size);
        c = NULL; /* stays cached for the sessions that fit it; closed with the engine if none */
    }
    if (c != NULL)
        c->refs++;
    pthread_mutex_unlock(&ce->mu);
    if (st != PDL_OK) {
        free(cs);
        return st;
    }
    cs->ipc = c;
    cs->remote = c->base + rm->ipc_off;
    s->bk = cs;
    return PDL_OK;
}

static void cuda_session_close(pdl_session_t *s)
{
    cuda_session_t *cs = s->bk;
    if (cs == NULL)
        return;
    cuda_engine_t *ce = s->engine->bk;
    if (cs->ipc != NULL) {
        pthread_mutex_lock(&ce->mu);
        if (--cs->ipc->refs == 0) {
            cuda_ipc_t **pp = &ce->ipcs;
            while (*pp && *pp != cs->ipc)
                pp = &(*pp)->next;
            if (*pp)
                *pp = cs->ipc->next;
            if (ctx_push(ce)) {
                ce->drv->api.IpcCloseMemHandle(cs->ipc->base);
                ctx_pop(ce);
            }
            free(cs->ipc);
        }
        pthread_mutex_unlock(&ce->mu);
    }
    free(cs);
    s->bk = NULL;
}

/* ---------------------------------------------------------------- batches */

static cuda_lane_t *lane_take(cuda_engine_t *ce)
{
    pthread_mutex_lock(&ce->mu);
    while (ce->nfree == 0)
        pthread_cond_wait(&ce->cv, &ce->mu);
    cuda_lane_t *ln = &ce->lanes[ce->free_lanes[--ce->nfree]];
    pthread_mutex_unlock(&ce->mu);
    return ln;
}

static void lane_give(cuda_engine_t *ce, cuda_lane_t *ln)
{
    pthread_mutex_lock(&ce->mu);
    ce->free_lanes[ce->nfree++] = (int)(ln - ce->lanes);
    pthread_cond_signal(&ce->cv);
    pthread_mutex_unlock(&ce->mu);
}

/* An inline lane, or NULL when all are taken (never waits: they come back only through progress). */
static cuda_lane_t *inline_take(cuda_engine_t *ce)
{
    pthread_mutex_lock(&ce->mu);
    cuda_lane_t *ln = ce->ninline > 0 ? &ce->lanes[ce->free_inline[--ce->ninline]] : NULL;
    pthread_mutex_unlock(&ce->mu);
    return ln;
}

static void inline_give(cuda_engine_t *ce, cuda_lane_t *ln)
{
    pthread_mutex_lock(&ce->mu);
    ce->free_inline[ce->ninline++] = (int)(ln - ce->lanes);
    pthread_mutex_unlock(&ce->mu);
}

static pdl_status_t cuda_copy(pdl_session_t *s, pdl_batch_t *b, int idx, pdl_error_t *err);

/* Like shm, the owner serves nothing itself: the grant is checked around the copy (backend.h). */
static pdl_status_t cuda_run_chunk(pdl_session_t *s, pdl_batch_t *b, int idx, pdl_error_t *err)
{
    uint64_t slot = 0, seq = 0;
    pdl_status_t st = pdl__shm_grant_enter(s, b, &slot, &seq, err);
    if (st == PDL_OK)
        st = cuda_copy(s, b, idx, err);
    return st == PDL_OK ? pdl__shm_grant_leave(s, b, slot, seq, err) : st;
}

/* Zero ranges of a registration of this engine on the GPU, one memset each on one lane's stream. */
static pdl_status_t cuda_mem_zero(pdl_mem_t *m, const pdl_range_t *rg, size_t n, pdl_error_t *err)
{
    pdl_engine_t *e = m->engine;
    cuda_engine_t *ce = e->bk;
    CUresult r = ce->drv->api.CtxSetCurrent(ce->drv->ctx);
    const char *what = "cuCtxSetCurrent";
    if (r == CUDA_SUCCESS) {
        cuda_lane_t *ln = lane_take(ce);
        what = "cuMemsetD8Async";
        for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++)
            r = ce->drv->api.MemsetD8Async((CUdeviceptr)(uintptr_t)m->ptr + rg[i].off, 0, rg[i].len, ln->stream);
        CUresult r2 = ce->drv->api.StreamSynchronize(ln->stream);
        lane_give(ce, ln);
        if (r == CUDA_SUCCESS && r2 != CUDA_SUCCESS) {
            r = r2;
            what = "cuStreamSynchronize";
        }
    }
    if (r != CUDA_SUCCESS)
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: zeroing %zu ranges of region %" PRIu64 ": %s: %s",
                             e->key, n, m->id, what, cu_name(ce, r));
    return PDL_OK;
}

static pdl_status_t copy_failed(pdl_session_t *s, pdl_batch_t *b, const char *what, CUresult r, pdl_error_t *err)
{
    cuda_engine_t *ce = s->engine->bk;
    return pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: %s batch with engine %s region %" PRIu64 ": %s: %s",
                         s->engine->key, b->op == PDL_OP_READ ? "read" : "write", s->rmem.engine_key, s->rmem.id,
                         what, cu_name(ce, r));
}

/* Queue chunk idx's copies on lane ln's stream: the gather list and its launch, the long pieces' memcpys.
 * On failure the stream is synchronised (the host list may be read by a copy in flight) and emptied. */
static CUresult chunk_start(pdl_session_t *s, pdl_batch_t *b, int idx, cuda_lane_t *ln, const char **what)
{
    cuda_engine_t *ce = s->engine->bk;
    const pdl_chunk_t *c = &b->chunks[idx];
    CUdeviceptr local = (CUdeviceptr)(uintptr_t)s->local->ptr, remote = ((cuda_session_t *)s->bk)->remote;
    CUresult r = pdl__cudadrv_add_descs(ce->drv, &ln->list, &b->d[c->first], c->count, local, remote,
                                        b->op == PDL_OP_READ, ln->stream, what);
    if (r == CUDA_SUCCESS)
        r = pdl__cudadrv_launch(ce->drv, &ln->list, ln->stream, what);
    if (r != CUDA_SUCCESS) {
        ln->list.n = 0;
        ce->drv->api.StreamSynchronize(ln->stream);
    }
    return r;
}

static pdl_status_t cuda_copy(pdl_session_t *s, pdl_batch_t *b, int idx, pdl_error_t *err)
{
    cuda_engine_t *ce = s->engine->bk;
    const char *what = "cuCtxSetCurrent";
    CUresult r = ce->drv->api.CtxSetCurrent(ce->drv->ctx); /* a worker thread of this engine's pool */
    if (r != CUDA_SUCCESS)
        return copy_failed(s, b, what, r, err);
    cuda_lane_t *ln = lane_take(ce);
    if ((r = chunk_start(s, b, idx, ln, &what)) == CUDA_SUCCESS) {
        what = "cuStreamSynchronize";
        r = ce->drv->api.StreamSynchronize(ln->stream);
    }
    lane_give(ce, ln);
    return r == CUDA_SUCCESS ? PDL_OK : copy_failed(s, b, what, r, err);
}

/* A chunk handed to a worker by cuda_submit: run it as pool_run would (engine.c), then report it. */
static void cuda_drive_chunk(pdl_batch_t *b, int idx)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_status_t st;
    if (atomic_load(&b->cancel))
        st = pdl_error_set(&err, PDL_ERR_BAD_STATE, "engine %s: %s batch cancelled (freed while running)",
                           b->session->engine->key, b->op == PDL_OP_READ ? "read" : "write");
    else
        st = cuda_run_chunk(b->session, b, idx, &err);
    pdl__batch_chunk_done(b, st, &err);
}

/* Launch the batch from the posting thread on an inline lane, or hand it to a worker (see
 * PDL_CUDA_INLINE_PIECES). A batch is one chunk (the table has no plan). The caller's current context is kept. */
static void cuda_submit(pdl_session_t *s, pdl_batch_t *b)
{
    cuda_engine_t *ce = s->engine->bk;
    cuda_op_t *op = b->priv;
    op->ln = NULL;
    atomic_init(&op->state, OP_WORKER);
    cuda_lane_t *ln = b->chunks[0].count <= PDL_CUDA_INLINE_PIECES ? inline_take(ce) : NULL;
    if (ln == NULL) {
        pdl__engine_pool_drive(b, 0);
        return;
    }
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_status_t st = pdl__shm_grant_enter(s, b, &op->slot, &op->seq, &err);
    if (st == PDL_OK && !ctx_push(ce)) {
        st = pdl_error_set(&err, PDL_ERR_TRANSPORT, "engine %s: cannot make its CUDA context current", s->engine->key);
    } else if (st == PDL_OK) {
        const char *what = NULL;
        CUresult r = chunk_start(s, b, 0, ln, &what);
        ctx_pop(ce);
        if (r != CUDA_SUCCESS)
            st = copy_failed(s, b, what, r, &err);
    }
    if (st != PDL_OK) {
        inline_give(ce, ln);
        atomic_store(&op->state, OP_DONE);
        pdl__batch_chunk_done(b, st, &err);
        return;
    }
    op->ln = ln;
    atomic_store(&op->state, OP_RUNNING);
}

/* Wait for an inline chunk's stream until the deadline (backend.h: 0 = look once, UINT64_MAX = none):
 * CUDA_ERROR_NOT_READY when it passes first. */
static CUresult stream_wait(cuda_engine_t *ce, CUstream st, uint64_t deadline)
{
    if (deadline == UINT64_MAX)
        return ce->drv->api.StreamSynchronize(st);
    for (;;) {
        CUresult r = ce->drv->api.StreamQuery(st);
        if (r != CUDA_ERROR_NOT_READY || deadline == 0 || pdl__clock_now_ns() >= deadline)
            return r;
        sched_yield();
    }
}

/* Complete an inline batch if no other thread is at it; a worker's batch is the worker's. The batch may
 * be freed as soon as its chunk is done, so nothing of it is touched after. */
static void cuda_progress(pdl_batch_t *b, uint64_t deadline)
{
    pdl_session_t *s = b->session;
    cuda_engine_t *ce = s->engine->bk;
    cuda_op_t *op = b->priv;
    int want = OP_RUNNING;
    if (!atomic_compare_exchange_strong(&op->state, &want, OP_COMPLETING))
        return;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (ctx_push(ce)) {
        r = stream_wait(ce, op->ln->stream, deadline);
        ctx_pop(ce);
    }
    if (r == CUDA_ERROR_NOT_READY) {
        atomic_store(&op->state, OP_RUNNING);
        return;
    }
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_status_t st = r == CUDA_SUCCESS ? pdl__shm_grant_leave(s, b, op->slot, op->seq, &err)
                                        : copy_failed(s, b, "cuStreamSynchronize", r, &err);
    inline_give(ce, op->ln);
    atomic_store(&op->state, OP_DONE);
    pdl__batch_chunk_done(b, st, &err);
}

const pdl_backend_ops_t pdl__cuda_ops = {
    .name = "cuda",
    .caps = PDL_BACKEND_CAP_LIVE_TABLE,
    .inline_max = 0, /* unused: submit decides who launches a batch */
    .engine_init = cuda_engine_init,
    .engine_fini = cuda_engine_fini,
    .remote_add = pdl__shm_remote_add,
    .remote_free = pdl__shm_remote_free,
    .mem_init = cuda_mem_init,
    .mem_fini = cuda_mem_fini,
    .mem_desc_fill = cuda_mem_desc_fill,
    .session_open = cuda_session_open,
    .session_close = cuda_session_close,
    .session_check = cuda_session_check,
    /* No plan: one chunk, since the GPU runs a batch as one launch and lanes are for batches side by
     * side (cuda_submit and cuda_progress rely on it). No run_chunk: submit launches every batch, and
     * the pool runs the ones it hands over through drive_chunk. No session_kill: a launched copy runs to
     * its end, and nothing else of a session is in flight. */
    .chunk_priv = sizeof(cuda_op_t),
    .submit = cuda_submit,
    .progress = cuda_progress,
    .drive_chunk = cuda_drive_chunk,
    .mem_zero = cuda_mem_zero,
};
