/*
 * cuda-bench.c -- the host cost of the cuda backend's batch path, measured where there is no GPU.
 *
 * Two cuda engines of this process (an owner and a reader: a session then uses the owner's address, no
 * IPC mapping) move the KV shapes of tools/gpu-check.c: per layer, one region of (2, num_blocks, 16,
 * 32 heads, 128) fp16 on the owner, and READ batches of
 *   blocks  every block, K and V, from a permuted block id: 128 KiB pieces, none adjacent;
 *   heads   a P2/D4 head split: one 4 KiB piece per token at an 8 KiB stride (32,768 per layer,
 *           131,072 over the default 4 layers).
 * The driver is the test driver in its nocopy mode by default (PDLINK_TEST_CUDA_FAKE=nocopy,
 * cudadrv_fake.c): copies and kernel launches cost nothing, so every microsecond reported is pdlink's
 * own work on the CPU, the part a GPU cannot hide. --driver fake moves the bytes through the test
 * driver and verifies them; --driver real uses libcuda (on a GPU: the same rows with the copies).
 *
 * Rows, each the best of --iters passes:
 *   serial    one batch at a time: post (the posting thread: checks, merging, the hand-off) and done
 *             (from the post's return to pdl_batch_wait's: the worker's list, upload, launch, wait).
 *             Where cores are few the woken worker may run before the post returns, so that its time
 *             shows under post: only the sum, the batch's host time, compares between runs;
 *   parallel  one batch per layer in flight together, as gpu-check times them.
 * With the test driver, the driver calls one batch made (memcpys, launches, list entries, bytes
 * uploaded, synchronisations). Not a CTest test: its figures depend on the machine.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cudadrv.h"
#include "tools/gpu-opts.h"
#include "pdlink/engine.h"

static int L = 4, NB = 1024, BS = 16, HP = 32, HD = 128, ITERS = 20;
#define ELEM 2
static size_t row_p(void) { return (size_t)HP * HD * ELEM; }
static size_t blk_p(void) { return (size_t)BS * row_p(); }
static size_t layer_p(void) { return 2 * (size_t)NB * blk_p(); }
static size_t row_h(void) { return row_p() / 2; }
static size_t layer_h(void) { return 2 * (size_t)NB * BS * row_h(); }
static size_t rb(size_t i) { return (i * 7 + 3) % (size_t)NB; }

static pdl_cudadrv_t *drv;

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "cuda-bench: FAIL: %s: %s\n", what, msg);
    exit(1);
}

static void pk(pdl_status_t st, const pdl_error_t *err, const char *what)
{
    if (st != PDL_OK)
        die(what, err->msg);
}

static void ck(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS)
        die(what, pdl__cudadrv_errname(drv, r));
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static uint32_t pat(int l, uint64_t o)
{
    uint64_t x = ((uint64_t)(l + 1) << 40) ^ (o >> 2);
    x *= 0x9E3779B97F4A7C15ull;
    x ^= x >> 29;
    return (uint32_t)(x >> 32);
}

static pdl_engine_t *engine(const char *key)
{
    pdl_engine_config_t cfg = {.key = key, .host = "127.0.0.1", .backend = PDL_BACKEND_CUDA, .qp_per_transfer = 2,
                               .num_workers = 4};
    pdl_engine_t *e = NULL;
    pdl_error_t err;
    pk(pdl_engine_create(&cfg, &e, &err), &err, "pdl_engine_create(cuda)");
    return e;
}

static CUdeviceptr dalloc(size_t n)
{
    CUdeviceptr p;
    ck(drv->api.MemAlloc(&p, n), "cuMemAlloc");
    return p;
}

static void counts(pdl_cuda_fake_counts_t *c)
{
    memset(c, 0, sizeof(*c));
    if (drv->fake)
        pdl__cudadrv_fake_counts(c);
}

typedef struct row {
    double post_us, done_us, par_us; /* serial: post, post-return to done; parallel: all layers */
    pdl_cuda_fake_counts_t calls;    /* of one serial batch */
} row_t;

static void run_shape(pdl_session_t **s, const pdl_desc_t *d, size_t n, row_t *out)
{
    pdl_error_t err;
    pdl_batch_t *b[16];
    out->post_us = out->done_us = out->par_us = 1e30;
    for (int it = 0; it < ITERS; it++) {
        for (int l = 0; l < L; l++) {
            pdl_cuda_fake_counts_t c0, c1;
            counts(&c0);
            double t0 = now_us();
            pk(pdl_session_post(s[l], PDL_OP_READ, d, n, &b[l], &err), &err, "pdl_session_post");
            double t1 = now_us();
            pk(pdl_batch_wait(b[l], 60000, &err), &err, "pdl_batch_wait");
            double t2 = now_us();
            counts(&c1);
            pdl_batch_free(b[l]);
            if (t1 - t0 + (t2 - t1) < out->post_us + out->done_us) {
                out->post_us = t1 - t0;
                out->done_us = t2 - t1;
            }
            out->calls = (pdl_cuda_fake_counts_t){c1.copies - c0.copies, c1.launches - c0.launches,
                                                  c1.pieces - c0.pieces, c1.htod_bytes - c0.htod_bytes,
                                                  c1.syncs - c0.syncs};
        }
        double t0 = now_us();
        for (int l = 0; l < L; l++)
            pk(pdl_session_post(s[l], PDL_OP_READ, d, n, &b[l], &err), &err, "pdl_session_post");
        for (int l = 0; l < L; l++) {
            pk(pdl_batch_wait(b[l], 60000, &err), &err, "pdl_batch_wait");
            pdl_batch_free(b[l]);
        }
        double t = now_us() - t0;
        out->par_us = t < out->par_us ? t : out->par_us;
    }
}

/* Every word of each layer's destination against the owner's pattern (--driver fake or real). */
static uint64_t verify(const CUdeviceptr *dst, size_t dst_len, const pdl_desc_t *d, size_t n, uint32_t *host)
{
    uint64_t bad = 0;
    for (int l = 0; l < L; l++) {
        ck(drv->api.MemcpyDtoHAsync(host, dst[l], dst_len, NULL), "cuMemcpyDtoHAsync");
        ck(drv->api.StreamSynchronize(NULL), "cuStreamSynchronize");
        for (size_t k = 0; k < n; k++)
            for (uint64_t w = 0; w < d[k].len / 4; w++)
                bad += host[d[k].local_off / 4 + w] != pat(l, d[k].remote_off + w * 4);
    }
    return bad;
}

static void print_row(const char *name, size_t n, uint64_t bytes, const row_t *r)
{
    double per = r->post_us + r->done_us;
    printf("%-8s %8zu %8.1f %8.1f %8.1f %8.1f %10.1f %8.1f", name, n, r->post_us, r->done_us, per,
           per * 1e3 / (double)n, r->par_us, r->par_us * 1e3 / ((double)n * L));
    if (drv->fake)
        printf(" %7" PRIu64 " %7" PRIu64 " %8" PRIu64 " %9" PRIu64 " %5" PRIu64, r->calls.copies, r->calls.launches,
               r->calls.pieces, r->calls.htod_bytes, r->calls.syncs);
    printf("   (%.1f GB/s parallel)\n", (double)bytes * L / r->par_us / 1e3);
}

static const char *const drivers[] = {"nocopy", "fake", "real", NULL};

static const pdl_optdef_t bench_rows[] = {
    GPU_OPT_SHAPE_ROWS("20"),
    {.name = "driver", .kind = PDL_OPT_CHOICE, .metavar = "nocopy|fake|real", .def = "nocopy", .off = GPU_OPT(driver),
     .choices = drivers,
     .help = "nocopy: the test driver, copies and launches free (host time only); fake: the test driver moving "
             "and checking the bytes; real: libcuda"},
    {.name = "help", .alias = 'h', .kind = PDL_OPT_HELP, .help = "this text"},
    {0},
};

static const pdl_optab_t bench_table = {
    .prog = "cuda-bench",
    .usage = "usage: pdl-cuda-bench [--layers N] [--blocks N] [--iters N] [--driver nocopy|fake|real]\n"
             "The host cost of the cuda backend's batch path (docs/gpu.md); exit 77 without a CUDA driver.\n",
    .rows = bench_rows,
};

int main(int argc, char **argv)
{
    gpu_opts_t o = {0};
    int parsed = gpu_opts_parse(&bench_table, &o, argc, argv, &L, &NB, &ITERS);
    if (parsed >= 0)
        return parsed;
    const char *mode = drivers[o.driver];
    if (strcmp(mode, "real") == 0)
        unsetenv("PDLINK_TEST_CUDA_FAKE");
    else
        setenv("PDLINK_TEST_CUDA_FAKE", strcmp(mode, "fake") == 0 ? "1" : "nocopy", 1);
    pdl_error_t err;
    pdl_status_t st = pdl__cudadrv_open("cuda-bench", "cuda", &drv, &err);
    if (st == PDL_OK)
        st = pdl__cudadrv_ctx(drv, "cuda-bench", &err);
    if (st == PDL_ERR_UNSUPPORTED) { /* no driver or no device */
        printf("cuda-bench: SKIP: %s\n", err.msg);
        return 77;
    }
    pk(st, &err, "the CUDA driver and context");
    if (!pdl__cudadrv_push(drv))
        die("cuCtxPushCurrent", "failed");

    pdl_engine_t *own = engine("bench-owner"), *rd = engine("bench-reader");
    pdl_bytes_t pb;
    pk(pdl_engine_pack(own, &pb, &err), &err, "pdl_engine_pack");
    pk(pdl_engine_add_remote(rd, pb.data, pb.len, NULL, 0, &err), &err, "pdl_engine_add_remote");
    pdl_bytes_free(&pb);
    CUdeviceptr P[16], E[16], H[16];
    pdl_mem_t *mp[16], *me[16], *mh[16];
    pdl_session_t *se[16], *sh[16];
    uint32_t *host = NULL;
    bool check = strcmp(mode, "nocopy") != 0;
    if (check && (host = malloc(layer_p())) == NULL)
        die("malloc", "out of memory");
    for (int l = 0; l < L; l++) {
        P[l] = dalloc(layer_p());
        E[l] = dalloc(layer_p());
        H[l] = dalloc(layer_h());
        if (check) {
            for (uint64_t w = 0; w < layer_p() / 4; w++)
                host[w] = pat(l, w * 4);
            ck(drv->api.MemcpyHtoDAsync(P[l], host, layer_p(), NULL), "cuMemcpyHtoDAsync");
            ck(drv->api.StreamSynchronize(NULL), "cuStreamSynchronize");
        }
        pk(pdl_engine_register_mem_type(own, (void *)(uintptr_t)P[l], layer_p(), PDL_MEM_TYPE_CUDA, &mp[l], &err), &err,
           "register P");
        pk(pdl_engine_register_mem_type(rd, (void *)(uintptr_t)E[l], layer_p(), PDL_MEM_TYPE_CUDA, &me[l], &err), &err,
           "register E");
        pk(pdl_engine_register_mem_type(rd, (void *)(uintptr_t)H[l], layer_h(), PDL_MEM_TYPE_CUDA, &mh[l], &err), &err,
           "register H");
        pk(pdl_mem_pack(mp[l], &pb, &err), &err, "pdl_mem_pack");
        pk(pdl_session_open(rd, me[l], pb.data, pb.len, &se[l], &err), &err, "pdl_session_open (blocks)");
        pk(pdl_session_open(rd, mh[l], pb.data, pb.len, &sh[l], &err), &err, "pdl_session_open (heads)");
        pdl_bytes_free(&pb);
    }
    size_t nblk = 2 * (size_t)NB, nhead = 2 * (size_t)NB * BS;
    pdl_desc_t *db = malloc(nblk * sizeof(*db)), *dh = malloc(nhead * sizeof(*dh));
    if (db == NULL || dh == NULL)
        die("malloc", "out of memory");
    for (size_t kv = 0; kv < 2; kv++)
        for (size_t i = 0; i < (size_t)NB; i++) {
            size_t k = kv * NB + i, r = kv * NB + rb(i);
            db[k] = (pdl_desc_t){k * blk_p(), r * blk_p(), blk_p()};
            for (size_t t = 0; t < (size_t)BS; t++)
                dh[k * BS + t] = (pdl_desc_t){(k * BS + t) * row_h(), (r * BS + t) * row_p() + row_h(), row_h()};
        }
    row_t rb_, rh;
    run_shape(se, db, nblk, &rb_);
    run_shape(sh, dh, nhead, &rh);
    printf("cuda-bench: driver %s (%s), %d layers, best of %d\n", mode,
           strcmp(mode, "nocopy") == 0 ? "copies and launches cost nothing: host time only"
           : strcmp(mode, "fake") == 0 ? "the test driver's copies through /proc/self/mem"
                                       : "libcuda",
           L, ITERS);
    printf("%-8s %8s %8s %8s %8s %8s %10s %8s", "shape", "descs", "post us", "done us", "batch us", "ns/desc",
           "par us", "ns/desc");
    if (drv->fake)
        printf(" %7s %7s %8s %9s %5s", "copies", "launch", "entries", "htod B", "syncs");
    printf("\n");
    print_row("blocks", nblk, layer_p(), &rb_);
    print_row("heads", nhead, layer_h(), &rh);
    int rc = 0;
    if (check) {
        uint64_t bad_b = verify(E, layer_p(), db, nblk, host), bad_h = verify(H, layer_h(), dh, nhead, host);
        printf("cuda-bench: verified every word: blocks %" PRIu64 " wrong, heads %" PRIu64 " wrong\n", bad_b, bad_h);
        rc = bad_b || bad_h ? 1 : 0;
    }
    for (int l = 0; l < L; l++) {
        pdl_session_close(se[l]);
        pdl_session_close(sh[l]);
        pdl_engine_deregister_mem(rd, me[l]);
        pdl_engine_deregister_mem(rd, mh[l]);
        pdl_engine_deregister_mem(own, mp[l]);
        drv->api.MemFree(P[l]);
        drv->api.MemFree(E[l]);
        drv->api.MemFree(H[l]);
    }
    pdl_engine_destroy(rd);
    pdl_engine_destroy(own);
    pdl__cudadrv_pop(drv);
    pdl__cudadrv_close(drv);
    free(host);
    free(db);
    free(dh);
    return rc;
}
