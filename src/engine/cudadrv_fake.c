/*
 * cudadrv_fake.c -- a CUDA driver for tests on hosts without a GPU (PDLINK_TEST_CUDA_FAKE=1, cudadrv.h).
 *
 * "Device memory" (cuMemAlloc) is an anonymous PROT_NONE mapping between two read-only guard pages, so
 * it is one mapping of its own in /proc/self/maps (cuMemGetAddressRange reads it there) and any CPU
 * access to it by pdlink dies of SIGSEGV, while a system call on it fails with EFAULT. The driver's
 * own copies (the async memcpys, memset and the gather kernel) move the bytes with pread/pwrite on
 * /proc/self/mem, which bypasses page protection, the way a GPU's copy engine ignores the CPU's page
 * tables. "Pinned host memory" (cuMemHostAlloc) is ordinary memory. One context, one device.
 *
 * IPC handles name an allocation (its base address and its process's pid): cuIpcGetMemHandle gives one,
 * so the cuda backend can register fake device memory and run batches between two engines of one
 * process (whose sessions use the owner's address, as they do on a GPU) or of two. Opening a handle of
 * another process reserves an inaccessible mapping of the allocation's size here (the address the
 * importer uses) and records whose bytes it stands for; a copy touching it reads or writes the owner's
 * allocation through /proc/<pid>/mem, so the owner must be one this process may ptrace (a child, or any
 * process of the user where kernel.yama.ptrace_scope is 0), as process_vm_readv needs for shm. A
 * process's own handle is refused, as CUDA refuses it.
 *
 * Streams: by default work queued on a stream runs before the call returns. A stream created while
 * PDLINK_TEST_CUDA_FAKE_LATENCY_US is set holds its work back instead, as a GPU finishes copies after
 * the calls that queued them returned: the queued copies, memsets and kernel launches run in order once
 * that many microseconds passed since the last was queued, when cuStreamQuery finds the time passed
 * (before it, CUDA_ERROR_NOT_READY) or cuStreamSynchronize waits for it. A caller that uses a window
 * before its copy completed then reads stale bytes, and one that waits where it should poll is seen
 * waiting. The NULL stream always runs at once.
 *
 * PDLINK_TEST_CUDA_FAKE=nocopy is a measurement aid, not a test of correctness: the memcpys, the
 * memset and the gather launch return at once without moving a byte, so a benchmark run with it
 * (tools/cuda-bench.c) sees pdlink's host cost of a batch alone, what a GPU would overlap with nothing.
 * The driver calls are counted in both modes (pdl__cudadrv_fake_counts).
 *
 * State lives in the streams (their queues), the memory and those counters; an allocation's size comes
 * back from /proc/self/maps, and each copy opens /proc/self/mem.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/clock.h"
#include "engine/cudadrv.h"

/* Non-NULL names for the driver's opaque objects; never dereferenced. */
#define FAKE_HANDLE(type) ((type)(uintptr_t)0x1000)
#define FAKE_COPY_BUF (1u << 20)
#define FAKE_IPC_MAGIC "pdlfake"

/* Set once by pdl__cudadrv_fake_fill, before any copy: true for PDLINK_TEST_CUDA_FAKE=nocopy. */
static atomic_bool fake_nocopy;
static atomic_uint_fast64_t n_copies, n_launches, n_pieces, n_list_bytes, n_syncs;

static CUresult fake_init(unsigned f) { (void)f; return CUDA_SUCCESS; }
static CUresult fake_count(int *n) { *n = 1; return CUDA_SUCCESS; }
static CUresult fake_dev_get(CUdevice *d, int i) { *d = i; return i == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
static CUresult fake_retain(CUcontext *c, CUdevice d) { (void)d; *c = FAKE_HANDLE(CUcontext); return CUDA_SUCCESS; }
static CUresult fake_release(CUdevice d) { (void)d; return CUDA_SUCCESS; }
static CUresult fake_ctx_get(CUcontext *c) { *c = NULL; return CUDA_SUCCESS; }
static CUresult fake_ctx_set(CUcontext c) { (void)c; return CUDA_SUCCESS; }
static CUresult fake_ctx_pop(CUcontext *c) { *c = NULL; return CUDA_SUCCESS; }
static CUresult fake_ctx_dev(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
static CUresult fake_range(CUdeviceptr *base, size_t *size, CUdeviceptr p);
static CUresult maps_range(const char *maps, CUdeviceptr *base, size_t *size, CUdeviceptr p);
static CUresult fake_alloc(CUdeviceptr *p, size_t size);
static CUresult fake_free(CUdeviceptr p);

/* Another process's allocation opened here: [local, local + size) stands for [remote, remote + size)
 * of process pid. */
typedef struct fake_import {
    uint64_t local, remote, size;
    int64_t pid;
    struct fake_import *next;
} fake_import_t;

static pthread_mutex_t imports_mu = PTHREAD_MUTEX_INITIALIZER;
static fake_import_t *imports;

/* The handle of the allocation starting at p: magic, pid, base address. */
static CUresult fake_ipc_get(CUipcMemHandle *h, CUdeviceptr p)
{
    CUdeviceptr base;
    size_t size;
    if (fake_range(&base, &size, p) != CUDA_SUCCESS || base != p)
        return CUDA_ERROR_INVALID_VALUE;
    int64_t pid = (int64_t)getpid();
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, FAKE_IPC_MAGIC, sizeof(FAKE_IPC_MAGIC));
    memcpy(h->reserved + 8, &pid, sizeof(pid));
    memcpy(h->reserved + 16, &base, sizeof(base));
    return CUDA_SUCCESS;
}
static CUresult fake_ipc_open(CUdeviceptr *p, CUipcMemHandle h, unsigned f)
{
    (void)f;
    int64_t pid;
    uint64_t base;
    memcpy(&pid, h.reserved + 8, sizeof(pid));
    memcpy(&base, h.reserved + 16, sizeof(base));
    if (memcmp(h.reserved, FAKE_IPC_MAGIC, sizeof(FAKE_IPC_MAGIC)) != 0 || pid <= 0 || pid == (int64_t)getpid())
        return CUDA_ERROR_NOT_SUPPORTED;
    char maps[64];
    snprintf(maps, sizeof(maps), "/proc/%" PRId64 "/maps", pid);
    CUdeviceptr rb = 0;
    size_t size = 0;
    if (maps_range(maps, &rb, &size, base) != CUDA_SUCCESS || rb != base)
        return CUDA_ERROR_INVALID_VALUE;
    fake_import_t *im = calloc(1, sizeof(*im));
    CUdeviceptr local = 0;
    if (im == NULL || fake_alloc(&local, size) != CUDA_SUCCESS) {
        free(im);
        return CUDA_ERROR_INVALID_VALUE;
    }
    *im = (fake_import_t){.local = local, .remote = base, .size = size, .pid = pid};
    pthread_mutex_lock(&imports_mu);
    im->next = imports;
    imports = im;
    pthread_mutex_unlock(&imports_mu);
    *p = local;
    return CUDA_SUCCESS;
}

static CUresult fake_ipc_close(CUdeviceptr p)
{
    pthread_mutex_lock(&imports_mu);
    fake_import_t **pp = &imports;
    while (*pp && (*pp)->local != p)
        pp = &(*pp)->next;
    fake_import_t *im = *pp;
    if (im != NULL)
        *pp = im->next;
    pthread_mutex_unlock(&imports_mu);
    if (im == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    free(im);
    return fake_free(p);
}

/* Where the byte at address a of this process lives: at a in `self` (/proc/self/mem), or, inside an
 * opened handle's reservation, in its owner's /proc/<pid>/mem, opened here (the caller closes an fd that
 * is not `self`; -1 if the owner cannot be opened, gone or not ours to ptrace). */
static int mem_fd(int self, uint64_t a, uint64_t *at)
{
    *at = a;
    int64_t pid = 0;
    pthread_mutex_lock(&imports_mu);
    for (const fake_import_t *im = imports; im != NULL && pid == 0; im = im->next)
        if (a >= im->local && a - im->local < im->size) {
            pid = im->pid;
            *at = im->remote + (a - im->local);
        }
    pthread_mutex_unlock(&imports_mu);
    if (pid == 0)
        return self;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%" PRId64 "/mem", pid);
    return open(path, O_RDWR | O_CLOEXEC);
}

static void mem_fd_close(int self, int fd)
{
    if (fd >= 0 && fd != self)
        close(fd);
}
static CUresult fake_mod_load(CUmodule *m, const void *img) { (void)img; *m = FAKE_HANDLE(CUmodule); return CUDA_SUCCESS; }
static CUresult fake_mod_unload(CUmodule m) { (void)m; return CUDA_SUCCESS; }
static CUresult fake_mod_func(CUfunction *f, CUmodule m, const char *name)
{
    (void)m;
    if (strcmp(name, "pdl_gather") != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *f = FAKE_HANDLE(CUfunction);
    return CUDA_SUCCESS;
}

static CUresult fake_errname(CUresult r, const char **s)
{
    switch (r) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *s = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
    default: *s = "CUDA_ERROR_UNKNOWN (test driver)"; break;
    }
    return CUDA_SUCCESS;
}

/* The inaccessible (PROT_NONE) mapping holding p in the process whose maps file is `maps`:
 * [*base, *base + *size). */
static CUresult maps_range(const char *maps, CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    FILE *f = fopen(maps, "re");
    if (f == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    char line[512];
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    while (fgets(line, sizeof(line), f)) {
        unsigned long long lo, hi;
        char perms[8];
        if (sscanf(line, "%llx-%llx %7s", &lo, &hi, perms) != 3 || p < lo || p >= hi)
            continue;
        if (strncmp(perms, "---", 3) == 0) {
            *base = lo;
            *size = (size_t)(hi - lo);
            r = CUDA_SUCCESS;
        }
        break;
    }
    fclose(f);
    return r;
}

static CUresult fake_range(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    return maps_range("/proc/self/maps", base, size, p);
}

static CUresult fake_alloc(CUdeviceptr *p, size_t size)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size = (size + pg - 1) / pg * pg;
    uint8_t *m = mmap(NULL, size + 2 * pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return CUDA_ERROR_INVALID_VALUE;
    if (mprotect(m + pg, size, PROT_NONE) != 0) {
        munmap(m, size + 2 * pg);
        return CUDA_ERROR_INVALID_VALUE;
    }
    *p = (CUdeviceptr)(uintptr_t)(m + pg);
    return CUDA_SUCCESS;
}

static CUresult fake_free(CUdeviceptr p)
{
    CUdeviceptr base;
    size_t size, pg = (size_t)sysconf(_SC_PAGESIZE);
    if (fake_range(&base, &size, p) != CUDA_SUCCESS || base != p)
        return CUDA_ERROR_INVALID_VALUE;
    munmap((uint8_t *)(uintptr_t)base - pg, size + 2 * pg);
    return CUDA_SUCCESS;
}

static CUresult fake_host_alloc(void **p, size_t size, unsigned flags)
{
    (void)flags;
    return posix_memalign(p, 4096, size ? size : 1) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_host_free(void *p)
{
    free(p);
    return CUDA_SUCCESS;
}

/* Copy len bytes between any two addresses of this process through fd (/proc/self/mem); a side inside an
 * opened handle's reservation is its owner's memory (mem_fd). A piece never spans two allocations. */
static CUresult mem_copy(int fd, uint64_t dst, uint64_t src, uint64_t len, uint8_t *buf)
{
    uint64_t s, d;
    int sfd = mem_fd(fd, src, &s), dfd = mem_fd(fd, dst, &d);
    CUresult r = sfd >= 0 && dfd >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (uint64_t o = 0; r == CUDA_SUCCESS && o < len;) {
        size_t k = len - o < FAKE_COPY_BUF ? (size_t)(len - o) : FAKE_COPY_BUF;
        if (pread(sfd, buf, k, (off_t)(s + o)) != (ssize_t)k || pwrite(dfd, buf, k, (off_t)(d + o)) != (ssize_t)k)
            r = CUDA_ERROR_INVALID_VALUE;
        o += k;
    }
    mem_fd_close(fd, sfd);
    mem_fd_close(fd, dfd);
    return r;
}

static CUresult copy_one(uint64_t dst, uint64_t src, uint64_t len)
{
    atomic_fetch_add_explicit(&n_copies, 1, memory_order_relaxed);
    if (atomic_load_explicit(&fake_nocopy, memory_order_relaxed))
        return CUDA_SUCCESS;
    int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    uint8_t *buf = malloc(FAKE_COPY_BUF);
    CUresult r = fd >= 0 && buf != NULL ? mem_copy(fd, dst, src, len, buf) : CUDA_ERROR_INVALID_VALUE;
    free(buf);
    if (fd >= 0)
        close(fd);
    return r;
}

static CUresult memset_now(CUdeviceptr d, unsigned char v, size_t n)
{
    atomic_fetch_add_explicit(&n_copies, 1, memory_order_relaxed);
    if (atomic_load_explicit(&fake_nocopy, memory_order_relaxed))
        return CUDA_SUCCESS;
    int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    uint64_t at = d;
    int dfd = fd >= 0 ? mem_fd(fd, d, &at) : -1;
    uint8_t *buf = malloc(FAKE_COPY_BUF);
    CUresult r = dfd >= 0 && buf != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (buf)
        memset(buf, v, FAKE_COPY_BUF);
    for (size_t o = 0; r == CUDA_SUCCESS && o < n;) {
        size_t k = n - o < FAKE_COPY_BUF ? n - o : FAKE_COPY_BUF;
        if (pwrite(dfd, buf, k, (off_t)(at + o)) != (ssize_t)k)
            r = CUDA_ERROR_INVALID_VALUE;
        o += k;
    }
    free(buf);
    mem_fd_close(fd, dfd);
    if (fd >= 0)
        close(fd);
    return r;
}

/* The gather kernel over the n pieces of the list at device address `list` (cudadrv.c). */
static CUresult gather_now(CUdeviceptr list, unsigned n)
{
    atomic_fetch_add_explicit(&n_launches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&n_pieces, n, memory_order_relaxed);
    if (atomic_load_explicit(&fake_nocopy, memory_order_relaxed))
        return CUDA_SUCCESS;
    int fd = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
    uint8_t *buf = malloc(FAKE_COPY_BUF);
    pdl_cuda_piece_t *p = malloc((size_t)n * sizeof(*p) + 1);
    CUresult r = fd >= 0 && buf != NULL && p != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && pread(fd, p, (size_t)n * sizeof(*p), (off_t)list) != (ssize_t)((size_t)n * sizeof(*p)))
        r = CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; r == CUDA_SUCCESS && i < n; i++)
        r = mem_copy(fd, p[i].dst, p[i].src, p[i].len, buf);
    free(p);
    free(buf);
    if (fd >= 0)
        close(fd);
    return r;
}

/* ---- streams ------------------------------------------------------------------------------------ */

enum { OP_COPY, OP_MEMSET, OP_GATHER };

/* One piece of work held back on a stream: a copy (dst, src, len), a memset (dst, v, len) or a gather
 * launch (src = the list, len = its pieces; kernel arguments are taken when launched, as CUDA does). */
typedef struct fake_op {
    int kind;
    uint64_t dst, src, len;
    unsigned char v;
    struct fake_op *next;
} fake_op_t;

typedef struct fake_stream {
    uint64_t latency_ns; /* 0: work runs when queued */
    uint64_t ready_ns;   /* when the work held back may run */
    fake_op_t *head, *tail;
} fake_stream_t;

static CUresult op_run(const fake_op_t *op)
{
    switch (op->kind) {
    case OP_COPY: return copy_one(op->dst, op->src, op->len);
    case OP_MEMSET: return memset_now(op->dst, op->v, op->len);
    default: return gather_now(op->src, (unsigned)op->len);
    }
}

/* Run op now (no stream, or one without latency) or hold it back on the stream. */
static CUresult op_queue(CUstream s, fake_op_t op)
{
    fake_stream_t *fs = (fake_stream_t *)s;
    if (fs == NULL || fs->latency_ns == 0)
        return op_run(&op);
    fake_op_t *q = malloc(sizeof(*q));
    if (q == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *q = op;
    q->next = NULL;
    if (fs->tail)
        fs->tail->next = q;
    else
        fs->head = q;
    fs->tail = q;
    fs->ready_ns = pdl__clock_now_ns() + fs->latency_ns;
    return CUDA_SUCCESS;
}

/* Run the work held back on s, in order; the first failure is the stream's error, as the driver
 * reports an asynchronous failure at the next query or synchronisation. */
static CUresult stream_drain(fake_stream_t *fs)
{
    CUresult r = CUDA_SUCCESS;
    while (fs->head) {
        fake_op_t *op = fs->head;
        fs->head = op->next;
        CUresult r1 = op_run(op);
        if (r == CUDA_SUCCESS)
            r = r1;
        free(op);
    }
    fs->tail = NULL;
    return r;
}

static CUresult fake_stream_create(CUstream *s, unsigned f)
{
    (void)f;
    fake_stream_t *fs = calloc(1, sizeof(*fs));
    if (fs == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const char *lat = getenv("PDLINK_TEST_CUDA_FAKE_LATENCY_US");
    fs->latency_ns = lat ? strtoull(lat, NULL, 10) * 1000u : 0;
    *s = (CUstream)fs;
    return CUDA_SUCCESS;
}

/* Queries and synchronisations both count as syncs (pdl__cudadrv_fake_counts): a batch completed by
 * polling is synchronised by its last query. */
static CUresult fake_stream_query(CUstream s)
{
    fake_stream_t *fs = (fake_stream_t *)s;
    atomic_fetch_add_explicit(&n_syncs, 1, memory_order_relaxed);
    if (fs == NULL || fs->head == NULL)
        return CUDA_SUCCESS;
    return pdl__clock_now_ns() < fs->ready_ns ? CUDA_ERROR_NOT_READY : stream_drain(fs);
}

static CUresult fake_stream_sync(CUstream s)
{
    fake_stream_t *fs = (fake_stream_t *)s;
    atomic_fetch_add_explicit(&n_syncs, 1, memory_order_relaxed);
    if (fs == NULL || fs->head == NULL)
        return CUDA_SUCCESS;
    uint64_t now = pdl__clock_now_ns();
    if (now < fs->ready_ns) {
        struct timespec ts = {(time_t)((fs->ready_ns - now) / 1000000000u), (long)((fs->ready_ns - now) % 1000000000u)};
        nanosleep(&ts, NULL);
    }
    return stream_drain(fs);
}

static CUresult fake_stream_destroy(CUstream s)
{
    fake_stream_t *fs = (fake_stream_t *)s;
    if (fs == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    stream_drain(fs); /* a destroyed stream's work still completes */
    free(fs);
    return CUDA_SUCCESS;
}

static CUresult fake_htod(CUdeviceptr d, const void *h, size_t n, CUstream s)
{
    atomic_fetch_add_explicit(&n_list_bytes, n, memory_order_relaxed);
    return op_queue(s, (fake_op_t){.kind = OP_COPY, .dst = d, .src = (uint64_t)(uintptr_t)h, .len = n});
}
static CUresult fake_dtoh(void *h, CUdeviceptr d, size_t n, CUstream s)
{
    return op_queue(s, (fake_op_t){.kind = OP_COPY, .dst = (uint64_t)(uintptr_t)h, .src = d, .len = n});
}
static CUresult fake_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s)
{
    return op_queue(s, (fake_op_t){.kind = OP_COPY, .dst = dst, .src = src, .len = n});
}
static CUresult fake_memset(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    return op_queue(s, (fake_op_t){.kind = OP_MEMSET, .dst = d, .v = v, .len = n});
}

/* The gather kernel: args are the list's device address and its length (cudadrv.c). */
static CUresult fake_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                            unsigned shmem, CUstream s, void **args, void **extra)
{
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)extra;
    if (f != FAKE_HANDLE(CUfunction) || args == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return op_queue(s, (fake_op_t){.kind = OP_GATHER, .src = *(CUdeviceptr *)args[0], .len = *(unsigned *)args[1]});
}

void pdl__cudadrv_fake_counts(pdl_cuda_fake_counts_t *out)
{
    out->copies = atomic_load(&n_copies);
    out->launches = atomic_load(&n_launches);
    out->pieces = atomic_load(&n_pieces);
    out->htod_bytes = atomic_load(&n_list_bytes);
    out->syncs = atomic_load(&n_syncs);
}

void pdl__cudadrv_fake_fill(pdl_cuda_api_t *api, bool nocopy)
{
    atomic_store(&fake_nocopy, nocopy);
    *api = (pdl_cuda_api_t){
        .Init = fake_init,
        .DeviceGetCount = fake_count,
        .DeviceGet = fake_dev_get,
        .DevicePrimaryCtxRetain = fake_retain,
        .DevicePrimaryCtxRelease = fake_release,
        .CtxGetCurrent = fake_ctx_get,
        .CtxSetCurrent = fake_ctx_set,
        .CtxPushCurrent = fake_ctx_set,
        .CtxPopCurrent = fake_ctx_pop,
        .CtxGetDevice = fake_ctx_dev,
        .MemGetAddressRange = fake_range,
        .IpcGetMemHandle = fake_ipc_get,
        .IpcOpenMemHandle = fake_ipc_open,
        .IpcCloseMemHandle = fake_ipc_close,
        .StreamCreate = fake_stream_create,
        .StreamDestroy = fake_stream_destroy,
        .StreamSynchronize = fake_stream_sync,
        .StreamQuery = fake_stream_query,
        .MemAlloc = fake_alloc,
        .MemFree = fake_free,
        .MemHostAlloc = fake_host_alloc,
        .MemFreeHost = fake_host_free,
        .MemcpyHtoDAsync = fake_htod,
        .MemcpyDtoHAsync = fake_dtoh,
        .MemcpyDtoDAsync = fake_dtod,
        .MemsetD8Async = fake_memset,
        .ModuleLoadData = fake_mod_load,
        .ModuleUnload = fake_mod_unload,
        .ModuleGetFunction = fake_mod_func,
        .LaunchKernel = fake_launch,
        .GetErrorName = fake_errname,
    };
}
