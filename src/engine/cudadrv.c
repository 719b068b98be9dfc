/*
 * cudadrv.c -- the CUDA driver loaded at run time, its context, and the device copies every backend
 * uses (cudadrv.h says who and why).
 *
 * Why a kernel: a head-split transfer is thousands of 4 KiB pieces; one copy call per piece runs at
 * ~0.3 GB/s, one gather for all of them at ~1,400 GB/s (docs/gpu.md). A list of (src, dst, len)
 * triples is written to pinned host memory, copied to the device with one cuMemcpyHtoDAsync and run by
 * one launch of a kernel shipped as PTX text (compiled by the driver when the context is chosen),
 * 16-byte vectors when source, destination and length allow. Pieces of PDL_CUDA_MEMCPY_MIN or more go
 * through cuMemcpyDtoDAsync; pieces over PDL_CUDA_SPLIT are cut so that no thread block copies more.
 */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cudadrv.h"

/* The kernel copies each (src, dst, len) with one thread block: longer pieces are cut to this. */
#define PDL_CUDA_SPLIT (64ull << 10)
#define PDL_CUDA_THREADS 256u
#define PDL_CUDA_MAX_GRID 65535u

/*
 * The gather kernel: block b copies pieces b, b + gridDim.x, ...; its threads stride through a piece
 * 16 bytes each (4 loads in flight per thread while a piece has room for it), or a byte each when
 * src, dst or len is not a multiple of 16.
 */
static const char gather_ptx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry pdl_gather(.param .u64 p_list, .param .u32 p_n)\n"
    "{\n"
    "  .reg .pred %p<8>;\n"
    "  .reg .b32 %r<32>;\n"
    "  .reg .b64 %rd<40>;\n"
    "  ld.param.u64 %rd1, [p_list];\n"
    "  cvta.to.global.u64 %rd1, %rd1;\n"
    "  ld.param.u32 %r1, [p_n];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %nctaid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mov.u32 %r5, %ntid.x;\n"
    "PIECE:\n"
    "  setp.ge.u32 %p1, %r2, %r1;\n"
    "  @%p1 bra DONE;\n"
    "  mul.wide.u32 %rd2, %r2, 24;\n"
    "  add.s64 %rd3, %rd1, %rd2;\n"
    "  ld.global.u64 %rd4, [%rd3];\n"
    "  ld.global.u64 %rd5, [%rd3+8];\n"
    "  ld.global.u64 %rd6, [%rd3+16];\n"
    "  cvta.to.global.u64 %rd4, %rd4;\n"
    "  cvta.to.global.u64 %rd5, %rd5;\n"
    "  or.b64 %rd7, %rd4, %rd5;\n"
    "  or.b64 %rd7, %rd7, %rd6;\n"
    "  and.b64 %rd7, %rd7, 15;\n"
    "  setp.ne.u64 %p2, %rd7, 0;\n"
    "  @%p2 bra BYTES;\n"
    "  mul.wide.u32 %rd8, %r4, 16;\n"
    "  mul.wide.u32 %rd9, %r5, 16;\n"
    "  mul.lo.u64 %rd12, %rd9, 3;\n"
    "VLOOP4:\n"
    "  add.s64 %rd13, %rd8, %rd12;\n"
    "  add.s64 %rd13, %rd13, 16;\n"
    "  setp.gt.u64 %p4, %rd13, %rd6;\n"
    "  @%p4 bra VLOOP;\n"
    "  add.s64 %rd10, %rd4, %rd8;\n"
    "  add.s64 %rd14, %rd10, %rd9;\n"
    "  add.s64 %rd15, %rd14, %rd9;\n"
    "  add.s64 %rd16, %rd15, %rd9;\n"
    "  ld.global.v4.u32 {%r6, %r7, %r8, %r9}, [%rd10];\n"
    "  ld.global.v4.u32 {%r10, %r11, %r12, %r13}, [%rd14];\n"
    "  ld.global.v4.u32 {%r14, %r15, %r16, %r17}, [%rd15];\n"
    "  ld.global.v4.u32 {%r18, %r19, %r20, %r21}, [%rd16];\n"
    "  add.s64 %rd11, %rd5, %rd8;\n"
    "  add.s64 %rd17, %rd11, %rd9;\n"
    "  add.s64 %rd18, %rd17, %rd9;\n"
    "  add.s64 %rd19, %rd18, %rd9;\n"
    "  st.global.v4.u32 [%rd11], {%r6, %r7, %r8, %r9};\n"
    "  st.global.v4.u32 [%rd17], {%r10, %r11, %r12, %r13};\n"
    "  st.global.v4.u32 [%rd18], {%r14, %r15, %r16, %r17};\n"
    "  st.global.v4.u32 [%rd19], {%r18, %r19, %r20, %r21};\n"
    "  add.s64 %rd8, %rd8, %rd12;\n"
    "  add.s64 %rd8, %rd8, %rd9;\n"
    "  bra VLOOP4;\n"
    "VLOOP:\n"
    "  setp.ge.u64 %p3, %rd8, %rd6;\n"
    "  @%p3 bra NEXT;\n"
    "  add.s64 %rd10, %rd4, %rd8;\n"
    "  add.s64 %rd11, %rd5, %rd8;\n"
    "  ld.global.v4.u32 {%r6, %r7, %r8, %r9}, [%rd10];\n"
    "  st.global.v4.u32 [%rd11], {%r6, %r7, %r8, %r9};\n"
    "  add.s64 %rd8, %rd8, %rd9;\n"
    "  bra VLOOP;\n"
    "BYTES:\n"
    "  cvt.u64.u32 %rd8, %r4;\n"
    "  cvt.u64.u32 %rd9, %r5;\n"
    "BLOOP:\n"
    "  setp.ge.u64 %p3, %rd8, %rd6;\n"
    "  @%p3 bra NEXT;\n"
    "  add.s64 %rd10, %rd4, %rd8;\n"
    "  add.s64 %rd11, %rd5, %rd8;\n"
    "  ld.global.u8 %r6, [%rd10];\n"
    "  st.global.u8 [%rd11], %r6;\n"
    "  add.s64 %rd8, %rd8, %rd9;\n"
    "  bra BLOOP;\n"
    "NEXT:\n"
    "  add.u32 %r2, %r2, %r3;\n"
    "  bra PIECE;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

/* Symbols and the versioned names the driver exports them under (cuda.h maps the plain names to these). */
static const struct {
    const char *sym;
    size_t off;
} cuda_syms[] = {
#define SYM(field, name) {name, offsetof(pdl_cuda_api_t, field)}
    SYM(Init, "cuInit"),
    SYM(DeviceGetCount, "cuDeviceGetCount"),
    SYM(DeviceGet, "cuDeviceGet"),
    SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    SYM(CtxGetCurrent, "cuCtxGetCurrent"),
    SYM(CtxSetCurrent, "cuCtxSetCurrent"),
    SYM(CtxPushCurrent, "cuCtxPushCurrent_v2"),
    SYM(CtxPopCurrent, "cuCtxPopCurrent_v2"),
    SYM(CtxGetDevice, "cuCtxGetDevice"),
    SYM(MemGetAddressRange, "cuMemGetAddressRange_v2"),
    SYM(IpcGetMemHandle, "cuIpcGetMemHandle"),
    SYM(IpcOpenMemHandle, "cuIpcOpenMemHandle_v2"),
    SYM(IpcCloseMemHandle, "cuIpcCloseMemHandle"),
    SYM(StreamCreate, "cuStreamCreate"),
    SYM(StreamDestroy, "cuStreamDestroy_v2"),
    SYM(StreamSynchronize, "cuStreamSynchronize"),
    SYM(StreamQuery, "cuStreamQuery"),
    SYM(MemAlloc, "cuMemAlloc_v2"),
    SYM(MemFree, "cuMemFree_v2"),
    SYM(MemHostAlloc, "cuMemHostAlloc"),
    SYM(MemFreeHost, "cuMemFreeHost"),
    SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    SYM(MemsetD8Async, "cuMemsetD8Async"),
    SYM(ModuleLoadData, "cuModuleLoadData"),
    SYM(ModuleUnload, "cuModuleUnload"),
    SYM(ModuleGetFunction, "cuModuleGetFunction"),
    SYM(LaunchKernel, "cuLaunchKernel"),
    SYM(GetErrorName, "cuGetErrorName"),
#undef SYM
};

const char *pdl__cudadrv_errname(const pdl_cudadrv_t *d, CUresult r)
{
    const char *s = NULL;
    if (d == NULL || d->api.GetErrorName == NULL || d->api.GetErrorName(r, &s) != CUDA_SUCCESS || s == NULL)
        return "unknown CUDA error";
    return s;
}

static pdl_status_t load_syms(pdl_cudadrv_t *d, const char *key, const char *backend, pdl_error_t *err)
{
    const char *fake = getenv("PDLINK_TEST_CUDA_FAKE");
    if (fake != NULL && (strcmp(fake, "1") == 0 || strcmp(fake, "nocopy") == 0)) {
        d->fake = true;
        pdl__cudadrv_fake_fill(&d->api, strcmp(fake, "nocopy") == 0);
        return PDL_OK;
    }
    const char *path = getenv("PDLINK_LIBCUDA");
    if (path == NULL || path[0] == '\0')
        path = "libcuda.so.1";
    d->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (d->lib == NULL) {
        const char *why = dlerror();
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "engine %s: backend %s: no CUDA driver: dlopen(%s): %s; device memory needs an NVIDIA "
                             "GPU and its driver on this host (use shm, tcp or ucx for host memory)",
                             key, backend, path, why ? why : "failed");
    }
    for (size_t i = 0; i < sizeof(cuda_syms) / sizeof(cuda_syms[0]); i++) {
        void *f = dlsym(d->lib, cuda_syms[i].sym);
        if (f == NULL)
            return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                                 "engine %s: backend %s: the CUDA driver %s has no %s (a driver older than CUDA 11?)",
                                 key, backend, path, cuda_syms[i].sym);
        memcpy((char *)&d->api + cuda_syms[i].off, &f, sizeof(f));
    }
    return PDL_OK;
}

pdl_status_t pdl__cudadrv_open(const char *key, const char *backend, pdl_cudadrv_t **out, pdl_error_t *err)
{
    pdl_cudadrv_t *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", key);
    pthread_mutex_init(&d->mu, NULL);
    d->backend = backend;
    pdl_status_t st = load_syms(d, key, backend, err);
    if (st != PDL_OK) {
        pdl__cudadrv_close(d);
        return st;
    }
    *out = d;
    return PDL_OK;
}

bool pdl__cudadrv_push(pdl_cudadrv_t *d) { return d->api.CtxPushCurrent(d->ctx) == CUDA_SUCCESS; }

void pdl__cudadrv_pop(pdl_cudadrv_t *d)
{
    CUcontext c;
    d->api.CtxPopCurrent(&c);
}

static pdl_status_t no_device(pdl_cudadrv_t *d, const char *key, const char *what, CUresult r, pdl_error_t *err)
{
    return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                         "engine %s: backend %s: %s (%s): device memory needs an NVIDIA GPU and its driver on this "
                         "host",
                         key, d->backend, what, pdl__cudadrv_errname(d, r));
}

/* Called with d->mu held, until it succeeds. */
static pdl_status_t ctx_choose(pdl_cudadrv_t *d, const char *key, pdl_error_t *err)
{
    CUcontext cur = NULL;
    CUresult r = d->api.Init(0);
    if (r != CUDA_SUCCESS)
        return no_device(d, key, r == CUDA_ERROR_NO_DEVICE ? "no CUDA device" : "cuInit failed", r, err);
    int n = 0;
    r = d->api.DeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n < 1)
        return no_device(d, key, "no CUDA device", r != CUDA_SUCCESS ? r : CUDA_ERROR_NO_DEVICE, err);
    if (d->ctx != NULL) {
        /* chosen by an earlier call whose kernel load failed */
    } else if (d->api.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL) {
        d->ctx = cur;
        if (!pdl__cudadrv_push(d) || d->api.CtxGetDevice(&d->dev) != CUDA_SUCCESS) {
            d->ctx = NULL;
            return no_device(d, key, "the current CUDA context has no device", CUDA_ERROR_NO_DEVICE, err);
        }
        pdl__cudadrv_pop(d);
    } else {
        if ((r = d->api.DeviceGet(&d->dev, 0)) != CUDA_SUCCESS ||
            (r = d->api.DevicePrimaryCtxRetain(&d->ctx, d->dev)) != CUDA_SUCCESS) {
            d->ctx = NULL;
            return no_device(d, key, "cannot retain device 0's primary context", r, err);
        }
        d->retained = true;
    }
    if (!pdl__cudadrv_push(d))
        return no_device(d, key, "cannot make the CUDA context current", CUDA_ERROR_INVALID_VALUE, err);
    pdl_status_t st = PDL_OK;
    if ((d->mod == NULL && (r = d->api.ModuleLoadData(&d->mod, gather_ptx)) != CUDA_SUCCESS) ||
        (r = d->api.ModuleGetFunction(&d->gather, d->mod, "pdl_gather")) != CUDA_SUCCESS)
        st = pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: loading the gather kernel (PTX): %s", key,
                           pdl__cudadrv_errname(d, r));
    pdl__cudadrv_pop(d);
    return st;
}

pdl_status_t pdl__cudadrv_ctx(pdl_cudadrv_t *d, const char *key, pdl_error_t *err)
{
    pthread_mutex_lock(&d->mu);
    pdl_status_t st = d->gather != NULL ? PDL_OK : ctx_choose(d, key, err);
    pthread_mutex_unlock(&d->mu);
    return st;
}

void pdl__cudadrv_close(pdl_cudadrv_t *d)
{
    if (d == NULL)
        return;
    if (d->mod != NULL && d->ctx != NULL && pdl__cudadrv_push(d)) {
        d->api.ModuleUnload(d->mod);
        pdl__cudadrv_pop(d);
    }
    if (d->retained)
        d->api.DevicePrimaryCtxRelease(d->dev);
    if (d->lib)
        dlclose(d->lib);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

CUresult pdl__cudadrv_list_reserve(pdl_cudadrv_t *d, pdl_cuda_list_t *l, size_t n)
{
    if (n <= l->cap)
        return CUDA_SUCCESS;
    size_t cap = l->cap ? l->cap : 4096;
    while (cap < n)
        cap *= 2;
    void *h = NULL;
    CUdeviceptr dv = 0;
    CUresult r = d->api.MemHostAlloc(&h, cap * sizeof(pdl_cuda_piece_t), 0);
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = d->api.MemAlloc(&dv, cap * sizeof(pdl_cuda_piece_t))) != CUDA_SUCCESS) {
        d->api.MemFreeHost(h);
        return r;
    }
    /* Entries already queued (l->n) are kept: a caller may grow the list between pieces. */
    if (l->n > 0)
        memcpy(h, l->host, l->n * sizeof(pdl_cuda_piece_t));
    pdl__cudadrv_list_free(d, l);
    l->host = h;
    l->dev = dv;
    l->cap = cap;
    return CUDA_SUCCESS;
}

void pdl__cudadrv_list_free(pdl_cudadrv_t *d, pdl_cuda_list_t *l)
{
    if (l->host)
        d->api.MemFreeHost(l->host);
    if (l->dev)
        d->api.MemFree(l->dev);
    l->host = NULL;
    l->dev = 0;
    l->cap = 0;
}

size_t pdl__cudadrv_entries(uint64_t len)
{
    return len >= PDL_CUDA_MEMCPY_MIN ? 0 : (size_t)((len + PDL_CUDA_SPLIT - 1) / PDL_CUDA_SPLIT);
}

CUresult pdl__cudadrv_add(pdl_cudadrv_t *d, pdl_cuda_list_t *l, uint64_t src, uint64_t dst, uint64_t len,
                          CUstream stream)
{
    if (len >= PDL_CUDA_MEMCPY_MIN)
        return d->api.MemcpyDtoDAsync(dst, src, len, stream);
    for (uint64_t o = 0; o < len; o += PDL_CUDA_SPLIT) {
        uint64_t k = len - o < PDL_CUDA_SPLIT ? len - o : PDL_CUDA_SPLIT;
        l->host[l->n++] = (pdl_cuda_piece_t){src + o, dst + o, k};
    }
    return CUDA_SUCCESS;
}

CUresult pdl__cudadrv_add_descs(pdl_cudadrv_t *d, pdl_cuda_list_t *l, const pdl_desc_t *ds, size_t n,
                                CUdeviceptr local, CUdeviceptr remote, bool read, CUstream stream, const char **what)
{
    /* A head split is tens of thousands of 4 KiB pieces per batch: this loop is the worker's whole share
     * of it, so a piece that fits the list (one entry, or its 64 KiB entries) costs a bounds check and
     * the 24-byte stores, with no call.
     * The list's fields live in locals meanwhile: its entries are uint64_t like l->n, so every store
     * would otherwise make the compiler reload them. */
    CUdeviceptr sb = read ? remote : local, db = read ? local : remote;
    CUresult r = CUDA_SUCCESS;
    *what = "allocating the gather list (cuMemHostAlloc/cuMemAlloc)";
    if ((r = pdl__cudadrv_list_reserve(d, l, l->n + n)) != CUDA_SUCCESS)
        return r;
    pdl_cuda_piece_t *h = l->host;
    size_t k = l->n, cap = l->cap;
    for (size_t i = 0; i < n; i++) {
        uint64_t so = read ? ds[i].remote_off : ds[i].local_off, dof = read ? ds[i].local_off : ds[i].remote_off;
        uint64_t len = ds[i].len;
        if (len <= PDL_CUDA_SPLIT && k < cap) {
            h[k++] = (pdl_cuda_piece_t){sb + so, db + dof, len};
            continue;
        }
        if (len < PDL_CUDA_MEMCPY_MIN && k + (len + PDL_CUDA_SPLIT - 1) / PDL_CUDA_SPLIT <= cap) {
            for (uint64_t o = 0; o < len; o += PDL_CUDA_SPLIT) {
                uint64_t part = len - o < PDL_CUDA_SPLIT ? len - o : PDL_CUDA_SPLIT;
                h[k++] = (pdl_cuda_piece_t){sb + so + o, db + dof + o, part};
            }
            continue;
        }
        /* A piece for a memcpy, or a full list: room for this piece and one entry per piece to come. */
        l->n = k;
        if ((r = pdl__cudadrv_list_reserve(d, l, k + pdl__cudadrv_entries(len) + (n - i))) != CUDA_SUCCESS)
            return r;
        if ((r = pdl__cudadrv_add(d, l, sb + so, db + dof, len, stream)) != CUDA_SUCCESS) {
            *what = "cuMemcpyDtoDAsync";
            return r;
        }
        h = l->host;
        k = l->n;
        cap = l->cap;
    }
    l->n = k;
    return CUDA_SUCCESS;
}

CUresult pdl__cudadrv_launch(pdl_cudadrv_t *d, pdl_cuda_list_t *l, CUstream stream, const char **what)
{
    size_t k = l->n;
    size_t at = 0;
    CUresult r = CUDA_SUCCESS;
    l->n = 0;
    while (at < k) {
        /* Launches of at most 2^32 - 1 pieces; a batch this large does not happen, but n is a u32. */
        unsigned cnt = k - at > UINT32_MAX ? UINT32_MAX : (unsigned)(k - at);
        *what = "cuMemcpyHtoDAsync of the gather list";
        CUdeviceptr list = l->dev + at * sizeof(pdl_cuda_piece_t);
        if ((r = d->api.MemcpyHtoDAsync(list, l->host + at, cnt * sizeof(pdl_cuda_piece_t), stream)) != CUDA_SUCCESS)
            return r;
        void *args[] = {&list, &cnt};
        unsigned grid = cnt < PDL_CUDA_MAX_GRID ? cnt : PDL_CUDA_MAX_GRID;
        *what = "cuLaunchKernel (gather)";
        if ((r = d->api.LaunchKernel(d->gather, grid, 1, 1, PDL_CUDA_THREADS, 1, 1, 0, stream, args, NULL)) !=
            CUDA_SUCCESS)
            return r;
        at += cnt;
    }
    return r;
}
