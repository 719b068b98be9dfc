/*
 * stage.c -- device memory through pinned host staging windows (stage.h says what for).
 *
 * Window w lives in buffer w % 2; a buffer is its pinned host window, its device window, its stream
 * and its gather list. Out, window w's copy is: the gather kernel collects the window's pieces of the
 * device ranges into the device window, then one cuMemcpyDtoHAsync moves it to the host window (a
 * window that is one piece of one range skips the gather and is copied straight to the host). In is
 * the reverse: one cuMemcpyHtoDAsync to the device window, then the kernel scatters it to the ranges.
 * So however small the pieces (4 KiB head slices), a window costs two copy calls and one launch, and
 * the driver is never called once per piece.
 *
 * Pipelining, out: begin queues windows 0 and 1; taking window w (w >= 1) first queues window w + 1
 * into the buffer of window w - 1, which the caller has finished sending, then waits for window w.
 * In: the caller receives window w into its buffer while window w - 1 is copied to the device; taking
 * window w waits for window w - 2, the last user of that buffer.
 *
 * Waiting: a stage made with `nowait` asks the buffer's stream (cuStreamQuery) instead of synchronising
 * with it, and answers PDL_INPROGRESS while the copy runs; the call is then repeated and resumes where it
 * stopped (out_next queues the next window's copy once per window, however often it is asked).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/stage.h"

typedef struct stage_buf {
    CUstream stream;
    uint8_t *host;      /* pinned, PDL_STAGE_WINDOW bytes */
    CUdeviceptr dev;    /* PDL_STAGE_WINDOW bytes: the gather's side of the window */
    pdl_cuda_list_t list;
    size_t len;         /* bytes of the window in this buffer */
    bool busy;          /* a copy was queued and not yet waited for */
} stage_buf_t;

struct pdl_stage {
    pdl_cudadrv_t *d;
    const char *key;
    stage_buf_t b[2];
    bool to_host;
    struct iovec *v;
    size_t n, cap;
    size_t ci;          /* next byte to queue: range ci, offset cskip */
    uint64_t cskip;
    uint64_t total, queued, handed;
    unsigned next;      /* window handed out next */
    bool prefetched;    /* out: the copy out_next queues for window `next` is queued */
    bool open;          /* a window was handed out and not committed (in) */
    bool nowait;        /* PDL_INPROGRESS instead of waiting for a copy */
    pdl_status_t st;    /* sticky error of this transfer */
    char msg[PDL_ERR_MSG_LEN];
};

static pdl_status_t fail(pdl_stage_t *st, const char *what, CUresult r, pdl_error_t *err)
{
    if (st->st == PDL_OK) {
        st->st = PDL_ERR_TRANSPORT;
        snprintf(st->msg, sizeof(st->msg), "engine %s: staging %s device memory: %s: %s", st->key,
                 st->to_host ? "from" : "into", what, pdl__cudadrv_errname(st->d, r));
    }
    return pdl_error_set(err, st->st, "%s", st->msg);
}

pdl_status_t pdl__stage_create(pdl_cudadrv_t *d, const char *key, bool nowait, pdl_stage_t **out, pdl_error_t *err)
{
    pdl_stage_t *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", key);
    st->d = d;
    st->key = key;
    st->nowait = nowait;
    if (!pdl__cudadrv_push(d)) {
        free(st);
        return pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: cannot make its CUDA context current", key);
    }
    CUresult r = CUDA_SUCCESS;
    const char *what = "cuStreamCreate";
    for (int i = 0; i < 2 && r == CUDA_SUCCESS; i++) {
        stage_buf_t *b = &st->b[i];
        if ((r = d->api.StreamCreate(&b->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
            break;
        what = "cuMemHostAlloc of a staging window";
        if ((r = d->api.MemHostAlloc((void **)&b->host, PDL_STAGE_WINDOW, 0)) != CUDA_SUCCESS)
            break;
        what = "cuMemAlloc of a staging window";
        r = d->api.MemAlloc(&b->dev, PDL_STAGE_WINDOW);
    }
    pdl__cudadrv_pop(d);
    if (r != CUDA_SUCCESS) {
        pdl_status_t s = pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: %s: %s", key, what,
                                       pdl__cudadrv_errname(d, r));
        pdl__stage_destroy(st);
        return s;
    }
    *out = st;
    return PDL_OK;
}

/* Called with the context pushed. */
static void wait_all(pdl_stage_t *st)
{
    for (int i = 0; i < 2; i++) {
        if (st->b[i].busy)
            st->d->api.StreamSynchronize(st->b[i].stream);
        st->b[i].busy = false;
    }
}

void pdl__stage_destroy(pdl_stage_t *st)
{
    if (st == NULL)
        return;
    pdl_cudadrv_t *d = st->d;
    if (pdl__cudadrv_push(d)) {
        wait_all(st);
        for (int i = 0; i < 2; i++) {
            stage_buf_t *b = &st->b[i];
            pdl__cudadrv_list_free(d, &b->list);
            if (b->host)
                d->api.MemFreeHost(b->host);
            if (b->dev)
                d->api.MemFree(b->dev);
            if (b->stream)
                d->api.StreamDestroy(b->stream);
        }
        pdl__cudadrv_pop(d);
    }
    free(st->v);
    free(st);
}

void pdl__stage_abort(pdl_stage_t *st)
{
    if (pdl__cudadrv_push(st->d)) {
        wait_all(st);
        pdl__cudadrv_pop(st->d);
    }
    st->total = st->queued = st->handed = 0;
    st->open = st->prefetched = false;
    st->st = PDL_OK;
}

/*
 * The pieces of the next `len` bytes of the ranges, from the cursor, into b's gather list: device
 * window offset <-> range address (out: range -> window; in: window -> range). Sets *direct to the one
 * range address when the window is a single piece (no gather needed). Called with the context pushed.
 */
static CUresult window_pieces(pdl_stage_t *st, stage_buf_t *b, uint64_t len, uint64_t *direct)
{
    size_t ci = st->ci, need = 0;
    uint64_t skip = st->cskip, left = len;
    while (left > 0) {
        uint64_t k = st->v[ci].iov_len - skip < left ? st->v[ci].iov_len - skip : left;
        need += pdl__cudadrv_entries(k);
        left -= k;
        skip = 0;
        ci++;
    }
    uint64_t first = (uint64_t)(uintptr_t)st->v[st->ci].iov_base + st->cskip;
    *direct = st->v[st->ci].iov_len - st->cskip >= len ? first : 0;
    if (*direct == 0) {
        CUresult r = pdl__cudadrv_list_reserve(st->d, &b->list, need);
        if (r != CUDA_SUCCESS)
            return r;
    }
    for (uint64_t off = 0; off < len;) {
        uint64_t addr = (uint64_t)(uintptr_t)st->v[st->ci].iov_base + st->cskip;
        uint64_t k = st->v[st->ci].iov_len - st->cskip < len - off ? st->v[st->ci].iov_len - st->cskip : len - off;
        if (*direct == 0) {
            CUresult r = st->to_host ? pdl__cudadrv_add(st->d, &b->list, addr, b->dev + off, k, b->stream)
                                     : pdl__cudadrv_add(st->d, &b->list, b->dev + off, addr, k, b->stream);
            if (r != CUDA_SUCCESS)
                return r;
        }
        off += k;
        st->cskip += k;
        if (st->cskip == st->v[st->ci].iov_len) {
            st->ci++;
            st->cskip = 0;
        }
    }
    return CUDA_SUCCESS;
}

/* Out: queue the copy of the next window into buffer b. Called with the context pushed. */
static pdl_status_t queue_out(pdl_stage_t *st, stage_buf_t *b, pdl_error_t *err)
{
    uint64_t len = st->total - st->queued < PDL_STAGE_WINDOW ? st->total - st->queued : PDL_STAGE_WINDOW;
    uint64_t direct = 0;
    const char *what = "allocating the gather list";
    CUresult r = window_pieces(st, b, len, &direct);
    if (r == CUDA_SUCCESS && direct != 0) {
        what = "cuMemcpyDtoHAsync";
        r = st->d->api.MemcpyDtoHAsync(b->host, direct, len, b->stream);
    } else if (r == CUDA_SUCCESS && (r = pdl__cudadrv_launch(st->d, &b->list, b->stream, &what)) == CUDA_SUCCESS) {
        what = "cuMemcpyDtoHAsync";
        r = st->d->api.MemcpyDtoHAsync(b->host, b->dev, len, b->stream);
    }
    b->list.n = 0;
    b->busy = true; /* whatever was queued must be waited for before the buffer is reused */
    if (r != CUDA_SUCCESS)
        return fail(st, what, r, err);
    b->len = len;
    st->queued += len;
    return PDL_OK;
}

pdl_status_t pdl__stage_begin(pdl_stage_t *st, bool to_host, const struct iovec *v, size_t n, pdl_error_t *err)
{
    pdl__stage_abort(st);
    if (n > st->cap) {
        struct iovec *nv = realloc(st->v, n * sizeof(*nv));
        if (nv == NULL)
            return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", st->key);
        st->v = nv;
        st->cap = n;
    }
    memcpy(st->v, v, n * sizeof(*v));
    st->n = n;
    st->ci = 0;
    st->cskip = 0;
    st->next = 0;
    st->prefetched = false;
    st->to_host = to_host;
    for (size_t i = 0; i < n; i++)
        st->total += v[i].iov_len;
    if (!to_host || st->total == 0)
        return PDL_OK;
    if (!pdl__cudadrv_push(st->d))
        return fail(st, "cuCtxPushCurrent", CUDA_ERROR_INVALID_VALUE, err);
    pdl_status_t s = queue_out(st, &st->b[0], err);
    if (s == PDL_OK && st->queued < st->total)
        s = queue_out(st, &st->b[1], err);
    pdl__cudadrv_pop(st->d);
    return s;
}

/* Wait for buffer b's copy, or (nowait) PDL_INPROGRESS while it runs. Called with the context pushed. */
static pdl_status_t wait_buf(pdl_stage_t *st, stage_buf_t *b, pdl_error_t *err)
{
    if (!b->busy)
        return PDL_OK;
    CUresult r = st->nowait ? st->d->api.StreamQuery(b->stream) : st->d->api.StreamSynchronize(b->stream);
    if (r == CUDA_ERROR_NOT_READY && st->nowait)
        return PDL_INPROGRESS;
    b->busy = false;
    return r == CUDA_SUCCESS ? PDL_OK : fail(st, st->nowait ? "cuStreamQuery" : "cuStreamSynchronize", r, err);
}

pdl_status_t pdl__stage_out_next(pdl_stage_t *st, uint8_t **p, size_t *len, pdl_error_t *err)
{
    if (st->st != PDL_OK)
        return pdl_error_set(err, st->st, "%s", st->msg);
    *len = 0;
    if (st->handed == st->total)
        return PDL_OK;
    if (!pdl__cudadrv_push(st->d))
        return fail(st, "cuCtxPushCurrent", CUDA_ERROR_INVALID_VALUE, err);
    pdl_status_t s = PDL_OK;
    stage_buf_t *b = &st->b[st->next % 2];
    if (!st->prefetched && st->next >= 1 && st->queued < st->total)
        s = queue_out(st, &st->b[(st->next - 1) % 2], err);
    st->prefetched = true;
    if (s == PDL_OK)
        s = wait_buf(st, b, err);
    pdl__cudadrv_pop(st->d);
    if (s != PDL_OK)
        return s;
    *p = b->host;
    *len = b->len;
    st->handed += b->len;
    st->next++;
    st->prefetched = false;
    return PDL_OK;
}

pdl_status_t pdl__stage_in_window(pdl_stage_t *st, uint8_t **p, size_t *len, pdl_error_t *err)
{
    if (st->st != PDL_OK)
        return pdl_error_set(err, st->st, "%s", st->msg);
    *len = 0;
    if (st->handed == st->total)
        return PDL_OK;
    stage_buf_t *b = &st->b[st->next % 2];
    if (b->busy) {
        if (!pdl__cudadrv_push(st->d))
            return fail(st, "cuCtxPushCurrent", CUDA_ERROR_INVALID_VALUE, err);
        pdl_status_t s = wait_buf(st, b, err);
        pdl__cudadrv_pop(st->d);
        if (s != PDL_OK)
            return s;
    }
    b->len = st->total - st->handed < PDL_STAGE_WINDOW ? st->total - st->handed : PDL_STAGE_WINDOW;
    st->open = true;
    *p = b->host;
    *len = b->len;
    return PDL_OK;
}

pdl_status_t pdl__stage_in_commit(pdl_stage_t *st, pdl_error_t *err)
{
    if (st->st != PDL_OK)
        return pdl_error_set(err, st->st, "%s", st->msg);
    if (!st->open)
        return PDL_OK;
    stage_buf_t *b = &st->b[st->next % 2];
    st->open = false;
    st->handed += b->len;
    st->next++;
    if (!pdl__cudadrv_push(st->d))
        return fail(st, "cuCtxPushCurrent", CUDA_ERROR_INVALID_VALUE, err);
    uint64_t direct = 0;
    const char *what = "allocating the gather list";
    CUresult r = window_pieces(st, b, b->len, &direct);
    if (r == CUDA_SUCCESS && direct != 0) {
        what = "cuMemcpyHtoDAsync";
        r = st->d->api.MemcpyHtoDAsync(direct, b->host, b->len, b->stream);
    } else if (r == CUDA_SUCCESS) {
        what = "cuMemcpyHtoDAsync";
        if ((r = st->d->api.MemcpyHtoDAsync(b->dev, b->host, b->len, b->stream)) == CUDA_SUCCESS)
            r = pdl__cudadrv_launch(st->d, &b->list, b->stream, &what);
    }
    b->list.n = 0;
    b->busy = true;
    st->queued += b->len;
    pdl__cudadrv_pop(st->d);
    return r == CUDA_SUCCESS ? PDL_OK : fail(st, what, r, err);
}

pdl_status_t pdl__stage_in_end(pdl_stage_t *st, pdl_error_t *err)
{
    if (!pdl__cudadrv_push(st->d))
        return fail(st, "cuCtxPushCurrent", CUDA_ERROR_INVALID_VALUE, err);
    pdl_status_t s = wait_buf(st, &st->b[0], err);
    pdl_status_t s2 = wait_buf(st, &st->b[1], err);
    pdl__cudadrv_pop(st->d);
    if (st->st != PDL_OK)
        return pdl_error_set(err, st->st, "%s", st->msg);
    return s != PDL_OK ? s : s2;
}
