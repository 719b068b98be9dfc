/*
 * cudadrv.h -- the CUDA driver as the engine uses it: the entry points loaded at run time, the context,
 * and the device copies (the gather kernel and the asynchronous memcpys). Shared by the cuda backend
 * (cuda.c: CUDA IPC between GPUs of one host) and the tcp backend's staged path for device memory
 * (stage.c). Only src/engine/ sources include this file.
 *
 * Nothing of CUDA is needed to build: the few types and prototypes used are declared here, and
 * libcuda.so.1 (or $PDLINK_LIBCUDA) is opened with dlopen when an engine asks for it. With
 * PDLINK_TEST_CUDA_FAKE=1 the entry points come from the test driver instead (cudadrv_fake.c), whose
 * "device memory" no CPU access survives; tests use it to prove that no pdlink path dereferences
 * device memory on a host without a GPU. PDLINK_TEST_CUDA_FAKE=nocopy is the same driver whose copies
 * and kernel launches move nothing, for measuring pdlink's host cost alone (tools/cuda-bench.c).
 *
 * A pdl_cudadrv_t belongs to one engine (no state is shared between engines). Its context is chosen
 * once, by the first pdl__cudadrv_ctx: the one current on the calling thread (torch makes its device's
 * primary context current), else device 0's primary context.
 */
#ifndef PDL_ENGINE_CUDADRV_H
#define PDL_ENGINE_CUDADRV_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/engine.h"
#include "pdlink/status.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct {
    char reserved[64]; /* CU_IPC_HANDLE_SIZE; descriptors carry it as PDL_CUDA_IPC_HANDLE bytes */
} CUipcMemHandle;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_NOT_READY 600
#define CU_STREAM_NON_BLOCKING 1u
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1u

/* The driver entry points used by pdlink (cuda.h's names without the "cu"). */
typedef struct pdl_cuda_api {
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
    CUresult (*StreamQuery)(CUstream);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
    CUresult (*GetErrorName)(CUresult, const char **);
} pdl_cuda_api_t;

/* One (src, dst, len) copy of a gather list, as the kernel reads it (24-byte records). */
typedef struct pdl_cuda_piece {
    uint64_t src, dst, len;
} pdl_cuda_piece_t;

/* A gather list: filled in pinned host memory, copied to the device and run by one kernel launch. */
typedef struct pdl_cuda_list {
    pdl_cuda_piece_t *host; /* pinned */
    CUdeviceptr dev;
    size_t cap, n;          /* entries of both; entries filled */
} pdl_cuda_list_t;

typedef struct pdl_cudadrv {
    void *lib;              /* dlopen handle; NULL for the test driver */
    bool fake;              /* the test driver (PDLINK_TEST_CUDA_FAKE=1 or nocopy) */
    const char *backend;    /* "cuda", "tcp": for messages (static) */
    pdl_cuda_api_t api;
    pthread_mutex_t mu;     /* the context's choice */
    CUcontext ctx;          /* NULL until pdl__cudadrv_ctx */
    CUdevice dev;
    bool retained;          /* ctx is device dev's primary context, retained here */
    CUmodule mod;
    CUfunction gather;
} pdl_cudadrv_t;

/* Pieces at least this long are one cuMemcpyDtoDAsync each in pdl__cudadrv_copy (a call costs a few
 * microseconds, which such a piece repays); shorter ones go through the gather kernel. */
#define PDL_CUDA_MEMCPY_MIN (4ull << 20)

/*
 * Load the driver for engine `key`: dlopen and every entry point, nothing more (cuInit waits for
 * pdl__cudadrv_ctx, so an engine that never sees device memory never initialises CUDA, which a process
 * that forks later would regret). PDL_ERR_UNSUPPORTED (the message names what is missing; `backend`, a
 * static string, names who needs it) or PDL_ERR_NOMEM; on success *out is the caller's
 * (pdl__cudadrv_close).
 */
pdl_status_t pdl__cudadrv_open(const char *key, const char *backend, pdl_cudadrv_t **out, pdl_error_t *err);
/* Unload the gather kernel, release a retained primary context, dlclose. Accepts NULL. */
void pdl__cudadrv_close(pdl_cudadrv_t *d);
/* cuInit, then choose the context (once; later calls return at once) and load the gather kernel into it.
 * PDL_ERR_UNSUPPORTED without a device or a usable context, PDL_ERR_SYSTEM when the kernel does not load. */
pdl_status_t pdl__cudadrv_ctx(pdl_cudadrv_t *d, const char *key, pdl_error_t *err);
/* Make the context current on the calling thread with push/pop (the caller's own is restored). */
bool pdl__cudadrv_push(pdl_cudadrv_t *d);
void pdl__cudadrv_pop(pdl_cudadrv_t *d);
/* The driver's name of an error ("CUDA_ERROR_..."); never NULL. */
const char *pdl__cudadrv_errname(const pdl_cudadrv_t *d, CUresult r);

/* Gather lists. reserve grows the list to hold n entries (allocations of the context current on the
 * thread); free releases both buffers. */
CUresult pdl__cudadrv_list_reserve(pdl_cudadrv_t *d, pdl_cuda_list_t *l, size_t n);
void pdl__cudadrv_list_free(pdl_cudadrv_t *d, pdl_cuda_list_t *l);
/* List entries a piece of `len` bytes takes in pdl__cudadrv_add (0 for one of PDL_CUDA_MEMCPY_MIN or more). */
size_t pdl__cudadrv_entries(uint64_t len);
/*
 * Queue the copy of `len` bytes from src to dst (device addresses, or pinned host memory, which
 * unified addressing maps into the device's space) on `stream`: a piece of PDL_CUDA_MEMCPY_MIN or more
 * at once as one cuMemcpyDtoDAsync, a shorter one (cut to 64 KiB) into list `l` for
 * pdl__cudadrv_launch. `l` must have room (pdl__cudadrv_entries, pdl__cudadrv_list_reserve).
 */
CUresult pdl__cudadrv_add(pdl_cudadrv_t *d, pdl_cuda_list_t *l, uint64_t src, uint64_t dst, uint64_t len,
                          CUstream stream);
/*
 * Queue the n descriptors ds (offsets into the regions at `local` and `remote`; a READ copies remote to
 * local, a WRITE local to remote) as pdl__cudadrv_add would, in one pass: no counting pass first, the
 * list grows while it fills (rarely: it keeps its size from one batch to the next). Stops at the first
 * failure (a cuMemcpyDtoDAsync of a long piece, or the list's allocation; *what names it).
 */
CUresult pdl__cudadrv_add_descs(pdl_cudadrv_t *d, pdl_cuda_list_t *l, const pdl_desc_t *ds, size_t n,
                                CUdeviceptr local, CUdeviceptr remote, bool read, CUstream stream, const char **what);
/* Copy list `l` to the device and run it with one launch of the gather kernel on `stream` (nothing for an
 * empty list), then empty it. The list's buffers stay in use until the stream is synchronised. On
 * failure *what names the call that failed. */
CUresult pdl__cudadrv_launch(pdl_cudadrv_t *d, pdl_cuda_list_t *l, CUstream stream, const char **what);

/* The test driver's entry points (cudadrv_fake.c), filled into *api; with `nocopy` its copies and
 * launches move nothing (a measurement aid: PDLINK_TEST_CUDA_FAKE=nocopy). */
void pdl__cudadrv_fake_fill(pdl_cuda_api_t *api, bool nocopy);

/* What the test driver was asked to do since the process started (every engine together). */
typedef struct pdl_cuda_fake_counts {
    uint64_t copies;     /* memcpys and memsets, each call */
    uint64_t launches;   /* kernel launches */
    uint64_t pieces;     /* gather list entries the launches were given */
    uint64_t htod_bytes; /* bytes of host-to-device copies (the gather lists, for the cuda backend) */
    uint64_t syncs;      /* stream synchronisations */
} pdl_cuda_fake_counts_t;
void pdl__cudadrv_fake_counts(pdl_cuda_fake_counts_t *out);

#endif /* PDL_ENGINE_CUDADRV_H */
