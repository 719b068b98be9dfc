/*
 * cuda.c -- transfer backend between GPUs of one host: CUDA IPC handles and copies run by the GPU.
 *
 * The CUDA driver API is loaded at run time (dlopen("libcuda.so.1"), or $PDLINK_LIBCUDA): nothing of
 * CUDA is needed to build pdlink or to run it where there is no GPU, and there engine creation fails
 * with PDL_ERR_UNSUPPORTED and the reason. The few types and prototypes used are declared here.
 *
 * Why legacy IPC handles (cuIpcGetMemHandle): on the H200 this was built for, UCX's cuda_ipc transport
 * was not taken and NIXL moved 0.5 GB/s, while a copy through a legacy IPC handle (what torch uses)
 * ran at ~2,000 GB/s (docs/gpu.md). A registration's descriptor carries the handle of the allocation
 * holding it (cuMemGetAddressRange) and its offset inside; a session opens the handle once per remote
 * allocation (cached, reference-counted by sessions, closed when the last session on it closes).
 *
 * Why a kernel: a head-split pull is thousands of 4 KiB pieces; one copy call per piece runs at
 * ~0.3 GB/s, one gather for all of them at ~1,400 GB/s. A batch's pieces are written as (src, dst,
 * len) triples to a pinned host buffer, copied to the device with one cuMemcpyHtoDAsync and copied by
 * one launch of a gather kernel shipped as PTX text (compiled by the driver at engine creation),
 * 16-byte vectors when source, destination and length allow. Pieces of PDL_CUDA_MEMCPY_MIN or more go
 * through cuMemcpyDtoDAsync; pieces over PDL_CUDA_SPLIT are cut so that no thread block of the kernel
 * copies more than that. Every chunk runs on a stream of its own lane (one per worker) and is
 * synchronised before it reports done.
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
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/backend.h"

/* --- the slice of the CUDA driver API used here (cuda.h, declared by hand) --- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct {
    char reserved[PDL_CUDA_IPC_HANDLE];
} CUipcMemHandle;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_NO_DEVICE 100
#define CU_STREAM_NON_BLOCKING 1u
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1u

/* Pieces at least this long are one cuMemcpyDtoDAsync each (a call costs a few microseconds, which
 * such a piece repays); shorter ones go through the gather kernel. */
#define PDL_CUDA_MEMCPY_MIN (4ull << 20)
/* The kernel copies each (src, dst, len) with one thread block: longer pieces are cut to this. */
#define PDL_CUDA_SPLIT (64ull << 10)
#define PDL_CUDA_THREADS 256u
#define PDL_CUDA_MAX_GRID 65535u
#define PDL_CUDA_LANES 64

/* One entry of the gather list in device memory (the kernel reads 24-byte records). */
typedef struct cuda_piece {
    uint64_t src, dst, len;
} cuda_piece_t;

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

typedef struct cuda_api {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxPushCurrent)(CUcontext);
    CUresult (*CtxPopCurrent)(CUcontext *);
    CUresult (*CtxGetDevice)(CUdevice *);
    CUresult (*MemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
    CUresult (*IpcCloseMemHandle)(CUdeviceptr);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocHost)(void **, size_t);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
    CUresult (*GetErrorName)(CUresult, const char **);
} cuda_api_t;

/* Symbols and the versioned names the driver exports them under (cuda.h maps the plain names to these). */
static const struct {
    const char *sym;
    size_t off;
} cuda_syms[] = {
#define SYM(field, name) {name, offsetof(cuda_api_t, field)}
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
    SYM(MemAlloc, "cuMemAlloc_v2"),
    SYM(MemFree, "cuMemFree_v2"),
    SYM(MemAllocHost, "cuMemAllocHost_v2"),
    SYM(MemFreeHost, "cuMemFreeHost"),
    SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    SYM(MemsetD8Async, "cuMemsetD8Async"),
    SYM(ModuleLoadData, "cuModuleLoadData"),
    SYM(ModuleUnload, "cuModuleUnload"),
    SYM(ModuleGetFunction, "cuModuleGetFunction"),
    SYM(LaunchKernel, "cuLaunchKernel"),
    SYM(GetErrorName, "cuGetErrorName"),
#undef SYM
};

typedef struct cuda_lane { /* a worker's stream and gather list; taken by one chunk at a time */
    CUstream stream;
    cuda_piece_t *host; /* pinned */
    CUdeviceptr dev;
    size_t cap; /* entries of both */
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
    void *lib;
    cuda_api_t api;
    CUcontext ctx;
    CUdevice dev;
    bool retained; /* ctx is device dev's primary context, retained here */
    CUmodule mod;
    CUfunction gather;
    pthread_mutex_t mu; /* free lanes, ipc cache */
    pthread_cond_t cv;
    cuda_lane_t lanes[PDL_CUDA_LANES];
    int free_lanes[PDL_CUDA_LANES];
    int nfree, nlanes;
    cuda_ipc_t *ipcs;
} cuda_engine_t;

typedef struct cuda_mem {
    CUipcMemHandle handle;
    uint64_t off; /* of the registration in its allocation */
} cuda_mem_t;

typedef struct cuda_session {
    cuda_ipc_t *ipc;    /* NULL when the owner is this process */
    CUdeviceptr remote; /* the remote region's first byte, here */
} cuda_session_t;

static const char *cu_name(const cuda_engine_t *ce, CUresult r)
{
    const char *s = NULL;
    if (ce->api.GetErrorName == NULL || ce->api.GetErrorName(r, &s) != CUDA_SUCCESS || s == NULL)
        return "unknown CUDA error";
    return s;
}

/* Run a driver call with the engine's context pushed on the calling thread (the caller's own current
 * context, if any, is restored). */
static bool ctx_push(cuda_engine_t *ce) { return ce->api.CtxPushCurrent(ce->ctx) == CUDA_SUCCESS; }
static void ctx_pop(cuda_engine_t *ce)
{
    CUcontext c;
    ce->api.CtxPopCurrent(&c);
}

/* ---------------------------------------------------------------- engine */

static void lanes_free(cuda_engine_t *ce)
{
    for (int i = 0; i < ce->nlanes; i++) {
        cuda_lane_t *ln = &ce->lanes[i];
        if (ln->host)
            ce->api.MemFreeHost(ln->host);
        if (ln->dev)
            ce->api.MemFree(ln->dev);
        if (ln->stream)
            ce->api.StreamDestroy(ln->stream);
    }
    ce->nlanes = 0;
}

static void cuda_release(cuda_engine_t *ce)
{
    if (ce == NULL)
        return;
    if (ce->ctx != NULL && ctx_push(ce)) {
        while (ce->ipcs) {
            cuda_ipc_t *c = ce->ipcs;
            ce->ipcs = c->next;
            ce->api.IpcCloseMemHandle(c->base);
            free(c);
        }
        lanes_free(ce);
        if (ce->mod)
            ce->api.ModuleUnload(ce->mod);
        ctx_pop(ce);
    }
    if (ce->retained)
        ce->api.DevicePrimaryCtxRelease(ce->dev);
    if (ce->lib)
        dlclose(ce->lib);
    pthread_mutex_destroy(&ce->mu);
    pthread_cond_destroy(&ce->cv);
    free(ce);
}

static pdl_status_t unsupported(pdl_engine_t *e, cuda_engine_t *ce, const char *what, CUresult r, pdl_error_t *err)
{
    pdl_status_t st = pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                                    "engine %s: backend cuda: %s (%s): this backend needs an NVIDIA GPU and its "
                                    "driver on this host; use shm, tcp or ucx for host memory",
                                    e->key, what, cu_name(ce, r));
    cuda_release(ce);
    return st;
}

static pdl_status_t cuda_engine_init(pdl_engine_t *e, pdl_error_t *err)
{
    cuda_engine_t *ce = calloc(1, sizeof(*ce));
    if (ce == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "engine %s: out of memory", e->key);
    pthread_mutex_init(&ce->mu, NULL);
    pthread_cond_init(&ce->cv, NULL);
    const char *path = getenv("PDLINK_LIBCUDA");
    if (path == NULL || path[0] == '\0')
        path = "libcuda.so.1";
    ce->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (ce->lib == NULL) {
        const char *why = dlerror();
        pdl_status_t st = pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                                        "engine %s: backend cuda: no CUDA driver: dlopen(%s): %s; this backend "
                                        "needs an NVIDIA GPU and its driver on this host (use shm, tcp or ucx for "
                                        "host memory)",
                                        e->key, path, why ? why : "failed");
        cuda_release(ce);
        return st;
    }
    for (size_t i = 0; i < sizeof(cuda_syms) / sizeof(cuda_syms[0]); i++) {
        void *f = dlsym(ce->lib, cuda_syms[i].sym);
        if (f == NULL) {
            pdl_status_t st = pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                                            "engine %s: backend cuda: the CUDA driver %s has no %s (a driver older "
                                            "than CUDA 11?)",
                                            e->key, path, cuda_syms[i].sym);
            cuda_release(ce);
            return st;
        }
        memcpy((char *)&ce->api + cuda_syms[i].off, &f, sizeof(f));
    }
    CUresult r = ce->api.Init(0);
    if (r != CUDA_SUCCESS)
        return unsupported(e, ce, r == CUDA_ERROR_NO_DEVICE ? "no CUDA device" : "cuInit failed", r, err);
    int n = 0;
    r = ce->api.DeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n < 1)
        return unsupported(e, ce, "no CUDA device", r != CUDA_SUCCESS ? r : CUDA_ERROR_NO_DEVICE, err);
    /* The caller's current context (torch's device), else device 0's primary context. */
    CUcontext cur = NULL;
    if (ce->api.CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL) {
        ce->ctx = cur;
        if (!ctx_push(ce) || ce->api.CtxGetDevice(&ce->dev) != CUDA_SUCCESS)
            return unsupported(e, ce, "the current CUDA context has no device", CUDA_ERROR_NO_DEVICE, err);
        ctx_pop(ce);
    } else {
        if ((r = ce->api.DeviceGet(&ce->dev, 0)) != CUDA_SUCCESS ||
            (r = ce->api.DevicePrimaryCtxRetain(&ce->ctx, ce->dev)) != CUDA_SUCCESS)
            return unsupported(e, ce, "cannot retain device 0's primary context", r, err);
        ce->retained = true;
    }
    if (!ctx_push(ce))
        return unsupported(e, ce, "cannot make the CUDA context current", CUDA_ERROR_NO_DEVICE, err);
    pdl_status_t st = PDL_OK;
    if ((r = ce->api.ModuleLoadData(&ce->mod, gather_ptx)) != CUDA_SUCCESS ||
        (r = ce->api.ModuleGetFunction(&ce->gather, ce->mod, "pdl_gather")) != CUDA_SUCCESS) {
        st = pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: backend cuda: loading the gather kernel (PTX): %s",
                           e->key, cu_name(ce, r));
    }
    int nl = e->num_workers < PDL_CUDA_LANES ? e->num_workers : PDL_CUDA_LANES;
    for (int i = 0; st == PDL_OK && i < nl; i++) {
        cuda_lane_t *ln = &ce->lanes[i];
        ce->nlanes = i + 1;
        if ((r = ce->api.StreamCreate(&ln->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
            st = pdl_error_set(err, PDL_ERR_SYSTEM, "engine %s: backend cuda: cuStreamCreate: %s", e->key,
                               cu_name(ce, r));
        ce->free_lanes[ce->nfree++] = i;
    }
    ctx_pop(ce);
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
    CUresult r = ce->api.MemGetAddressRange(&base, &asize, p);
    if (r != CUDA_SUCCESS)
        st = pdl_error_set(err, PDL_ERR_INVALID,
                           "engine %s: %p is not device memory of this engine's CUDA context (cuMemGetAddressRange: "
                           "%s)",
                           e->key, m->ptr, cu_name(ce, r));
    else if (p - base > asize || m->size > asize - (p - base))
        st = pdl_error_set(err, PDL_ERR_INVALID,
                           "engine %s: [%p, +%zu) runs past the end of its CUDA allocation (%zu bytes at 0x%llx)",
                           e->key, m->ptr, m->size, asize, base);
    else if ((r = ce->api.IpcGetMemHandle(&cm->handle, base)) != CUDA_SUCCESS)
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
            CUresult r = ce->api.IpcOpenMemHandle(&c->base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
            CUdeviceptr b2 = 0;
            if (r == CUDA_SUCCESS && (r = ce->api.MemGetAddressRange(&b2, &c->size, c->base)) != CUDA_SUCCESS)
                ce->api.IpcCloseMemHandle(c->base);
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
                ce->api.IpcCloseMemHandle(cs->ipc->base);
                ctx_pop(ce);
            }
            free(cs->ipc);
        }
        pthread_mutex_unlock(&ce->mu);
    }
    free(cs);
    s->bk = NULL;
}

static void cuda_session_kill(pdl_session_t *s) { (void)s; }

/* One chunk: the GPU runs a batch as one launch, and lanes are for batches side by side. */
static int cuda_plan(pdl_session_t *s, pdl_op_t op, uint64_t bytes, size_t n)
{
    (void)s;
    (void)op;
    (void)bytes;
    (void)n;
    return 1;
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

static CUresult lane_reserve(cuda_engine_t *ce, cuda_lane_t *ln, size_t n)
{
    if (n <= ln->cap)
        return CUDA_SUCCESS;
    size_t cap = ln->cap ? ln->cap : 4096;
    while (cap < n)
        cap *= 2;
    void *h = NULL;
    CUdeviceptr d = 0;
    CUresult r = ce->api.MemAllocHost(&h, cap * sizeof(cuda_piece_t));
    if (r != CUDA_SUCCESS)
        return r;
    if ((r = ce->api.MemAlloc(&d, cap * sizeof(cuda_piece_t))) != CUDA_SUCCESS) {
        ce->api.MemFreeHost(h);
        return r;
    }
    if (ln->host)
        ce->api.MemFreeHost(ln->host);
    if (ln->dev)
        ce->api.MemFree(ln->dev);
    ln->host = h;
    ln->dev = d;
    ln->cap = cap;
    return CUDA_SUCCESS;
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
    CUresult r = ce->api.CtxSetCurrent(ce->ctx);
    const char *what = "cuCtxSetCurrent";
    if (r == CUDA_SUCCESS) {
        cuda_lane_t *ln = lane_take(ce);
        what = "cuMemsetD8Async";
        for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++)
            r = ce->api.MemsetD8Async((CUdeviceptr)(uintptr_t)m->ptr + rg[i].off, 0, rg[i].len, ln->stream);
        CUresult r2 = ce->api.StreamSynchronize(ln->stream);
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

static pdl_status_t cuda_copy(pdl_session_t *s, pdl_batch_t *b, int idx, pdl_error_t *err)
{
    pdl_engine_t *e = s->engine;
    cuda_engine_t *ce = e->bk;
    const pdl_chunk_t *c = &b->chunks[idx];
    CUdeviceptr local = (CUdeviceptr)(uintptr_t)s->local->ptr, remote = ((cuda_session_t *)s->bk)->remote;
    bool rd = b->op == PDL_OP_READ;
    cuda_lane_t *ln = NULL;
    const char *what = "cuCtxSetCurrent";
    CUresult r = ce->api.CtxSetCurrent(ce->ctx); /* a worker thread of this engine's pool */
    if (r != CUDA_SUCCESS)
        goto fail;
    /* Size the gather list: every piece under PDL_CUDA_MEMCPY_MIN, cut to PDL_CUDA_SPLIT. */
    size_t n = 0;
    for (size_t i = c->first; i < c->first + c->count; i++)
        if (b->d[i].len < PDL_CUDA_MEMCPY_MIN)
            n += (size_t)((b->d[i].len + PDL_CUDA_SPLIT - 1) / PDL_CUDA_SPLIT);
    ln = lane_take(ce);
    what = "allocating the gather list (cuMemAllocHost/cuMemAlloc)";
    if ((r = lane_reserve(ce, ln, n)) != CUDA_SUCCESS)
        goto fail_lane;
    size_t k = 0;
    what = "cuMemcpyDtoDAsync";
    for (size_t i = c->first; i < c->first + c->count; i++) {
        const pdl_desc_t *d = &b->d[i];
        CUdeviceptr l = local + d->local_off, rr = remote + d->remote_off;
        CUdeviceptr src = rd ? rr : l, dst = rd ? l : rr;
        if (d->len >= PDL_CUDA_MEMCPY_MIN) {
            if ((r = ce->api.MemcpyDtoDAsync(dst, src, d->len, ln->stream)) != CUDA_SUCCESS)
                goto fail_sync;
            continue;
        }
        for (uint64_t o = 0; o < d->len; o += PDL_CUDA_SPLIT) {
            uint64_t len = d->len - o < PDL_CUDA_SPLIT ? d->len - o : PDL_CUDA_SPLIT;
            ln->host[k++] = (cuda_piece_t){src + o, dst + o, len};
        }
    }
    while (k > 0) {
        /* Launches of at most 2^31 pieces; a batch this large does not happen, but n is a u32. */
        unsigned cnt = k > UINT32_MAX ? UINT32_MAX : (unsigned)k;
        what = "cuMemcpyHtoDAsync of the gather list";
        if ((r = ce->api.MemcpyHtoDAsync(ln->dev, ln->host, cnt * sizeof(cuda_piece_t), ln->stream)) != CUDA_SUCCESS)
            goto fail_sync;
        CUdeviceptr list = ln->dev;
        void *args[] = {&list, &cnt};
        unsigned grid = cnt < PDL_CUDA_MAX_GRID ? cnt : PDL_CUDA_MAX_GRID;
        what = "cuLaunchKernel (gather)";
        if ((r = ce->api.LaunchKernel(ce->gather, grid, 1, 1, PDL_CUDA_THREADS, 1, 1, 0, ln->stream, args, NULL)) !=
            CUDA_SUCCESS)
            goto fail_sync;
        k -= cnt;
    }
    what = "cuStreamSynchronize";
    r = ce->api.StreamSynchronize(ln->stream);
    lane_give(ce, ln);
    if (r != CUDA_SUCCESS)
        goto fail;
    return PDL_OK;

fail_sync:
    ce->api.StreamSynchronize(ln->stream); /* the host list may still be read by a copy in flight */
fail_lane:
    lane_give(ce, ln);
fail:
    return pdl_error_set(err, PDL_ERR_TRANSPORT, "engine %s: %s batch with engine %s region %" PRIu64 ": %s: %s",
                         e->key, rd ? "read" : "write", s->rmem.engine_key, s->rmem.id, what, cu_name(ce, r));
}

const pdl_backend_ops_t pdl__cuda_ops = {
    .name = "cuda",
    .caps = PDL_BACKEND_CAP_LIVE_TABLE,
    .inline_max = 0, /* the copy runs on the GPU; a worker waits for it, never the poster */
    .engine_init = cuda_engine_init,
    .engine_fini = cuda_engine_fini,
    .remote_add = pdl__shm_remote_add,
    .remote_free = pdl__shm_remote_free,
    .mem_kick = pdl__backend_nop_mem_kick,
    .mem_init = cuda_mem_init,
    .mem_fini = cuda_mem_fini,
    .engine_desc_fill = pdl__backend_nop_engine_desc_fill,
    .mem_desc_fill = cuda_mem_desc_fill,
    .session_open = cuda_session_open,
    .session_close = cuda_session_close,
    .session_prefault = NULL,
    .session_kill = cuda_session_kill,
    .session_check = cuda_session_check,
    .plan = cuda_plan,
    .run_chunk = cuda_run_chunk,
    .mem_zero = cuda_mem_zero,
};
