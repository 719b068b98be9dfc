/*
 * test_engine_cuda.c -- the cuda backend where there is no GPU (CI): engine creation refuses with
 * PDL_ERR_UNSUPPORTED and says why, and the descriptor fields device memory adds (memory type, CUDA IPC
 * handle and offset) survive encode/decode and are checked. With the test driver (cudadrv_fake.c), the
 * batch path: the gather list one pass builds (entries exact, grown mid-batch, long pieces as memcpys)
 * and READ/WRITE batches between two engines of this process, every byte, one list upload and one launch
 * per batch, on PROT_NONE "device memory" that any CPU access by pdlink would die on. The GPU paths run
 * in tools/gpu-check.
 */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/backend.h"
#include "engine/cudadrv.h"
#include "pdlink/engine.h"

static pdl_status_t create(pdl_engine_t **e, pdl_error_t *err)
{
    pdl_engine_config_t cfg = {.key = "decode:tp0", .backend = PDL_BACKEND_CUDA, .qp_per_transfer = 1,
                               .num_workers = 2};
    *e = NULL;
    return pdl_engine_create(&cfg, e, err);
}

static void test_refused_without_driver(void **state)
{
    (void)state;
    assert_int_equal(pdl_backend_parse("cuda"), PDL_BACKEND_CUDA);
    assert_string_equal(pdl_backend_name(PDL_BACKEND_CUDA), "cuda");
    setenv("PDLINK_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    pdl_engine_t *e;
    pdl_error_t err;
    assert_int_equal(create(&e, &err), PDL_ERR_UNSUPPORTED);
    assert_null(e);
    assert_non_null(strstr(err.msg, "engine decode:tp0: backend cuda: no CUDA driver: dlopen(/nonexistent/libcuda.so.1)"));
    assert_non_null(strstr(err.msg, "needs an NVIDIA GPU and its driver"));
    unsetenv("PDLINK_LIBCUDA");
    /* The real driver name: refused the same way on a host without one. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL && (h = dlopen("libcuda.so.1", RTLD_NOW)) == NULL) {
        assert_int_equal(create(&e, &err), PDL_ERR_UNSUPPORTED);
        assert_non_null(strstr(err.msg, "no CUDA driver: dlopen(libcuda.so.1)"));
    } else {
        dlclose(h);
    }
}

static void test_device_descriptor_fields(void **state)
{
    (void)state;
    pdl_rmem_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    assert_non_null(a);
    assert_non_null(b);
    strcpy(a->engine_key, "prefill:tp1");
    a->id = 0x1234567890abcdefull;
    a->size = 256u << 20;
    a->kind = PDL_MEM_USER;
    a->addr = 0x7f0000200000ull;
    a->fd = -1;
    a->pid = 4242;
    a->slot = 17;
    a->type = PDL_MEM_TYPE_CUDA;
    a->ipc_len = PDL_CUDA_IPC_HANDLE;
    for (int i = 0; i < PDL_CUDA_IPC_HANDLE; i++)
        a->ipc[i] = (uint8_t)(i * 37 + 1);
    a->ipc_off = 3u << 20;
    pdl_bytes_t out = {0};
    pdl_error_t err;
    assert_int_equal(pdl__mem_desc_encode(a, &out, &err), PDL_OK);
    assert_int_equal(pdl__mem_desc_unpack(out.data, out.len, b, &err), PDL_OK);
    assert_int_equal(b->type, PDL_MEM_TYPE_CUDA);
    assert_int_equal(b->ipc_len, PDL_CUDA_IPC_HANDLE);
    assert_memory_equal(b->ipc, a->ipc, PDL_CUDA_IPC_HANDLE);
    assert_int_equal(b->ipc_off, a->ipc_off);
    assert_int_equal(b->id, a->id);
    assert_int_equal(b->size, a->size);
    assert_int_equal(b->addr, a->addr);
    assert_int_equal(b->slot, a->slot);
    pdl_bytes_free(&out);

    /* Host memory: no device fields written, host read back. */
    a->type = PDL_MEM_TYPE_HOST;
    a->ipc_len = 0;
    a->ipc_off = 0;
    assert_int_equal(pdl__mem_desc_encode(a, &out, &err), PDL_OK);
    assert_null(memmem(out.data, out.len, "mem_type", 8));
    assert_null(memmem(out.data, out.len, "ipc", 3));
    assert_int_equal(pdl__mem_desc_unpack(out.data, out.len, b, &err), PDL_OK);
    assert_int_equal(b->type, PDL_MEM_TYPE_HOST);
    assert_int_equal(b->ipc_len, 0);
    pdl_bytes_free(&out);

    /* A type this pdlink does not know, and a handle of the wrong size, are malformed. */
    a->type = (pdl_mem_type_t)7;
    assert_int_equal(pdl__mem_desc_encode(a, &out, &err), PDL_OK);
    assert_int_equal(pdl__mem_desc_unpack(out.data, out.len, b, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "unknown memory type 7"));
    pdl_bytes_free(&out);
    a->type = PDL_MEM_TYPE_CUDA;
    a->ipc_len = 10;
    assert_int_equal(pdl__mem_desc_encode(a, &out, &err), PDL_OK);
    assert_int_equal(pdl__mem_desc_unpack(out.data, out.len, b, &err), PDL_ERR_PARSE);
    assert_non_null(strstr(err.msg, "'ipc' must be 64 bytes"));
    pdl_bytes_free(&out);
    free(a);
    free(b);
}

static pdl_cudadrv_t *open_test_driver(const char *mode)
{
    setenv("PDLINK_TEST_CUDA_FAKE", mode, 1);
    pdl_cudadrv_t *d = NULL;
    pdl_error_t err;
    assert_int_equal(pdl__cudadrv_open("test", "test", &d, &err), PDL_OK);
    assert_int_equal(pdl__cudadrv_ctx(d, "test", &err), PDL_OK);
    return d;
}

/* The list one pass builds: each piece of at most 64 KiB one entry, a longer one cut into 64 KiB entries,
 * one of 4 MiB or more a memcpy of its own; the list grows mid-batch and keeps what it had. */
static void test_gather_list_one_pass(void **state)
{
    (void)state;
    pdl_cudadrv_t *d = open_test_driver("nocopy"); /* the memcpy of the long piece moves nothing */
    const pdl_desc_t ds[] = {
        {0, 8192, 4096},                /* 1 entry */
        {1 << 20, 3 << 20, 5u << 20},   /* a memcpy */
        {64 << 20, 96 << 20, 65537},    /* 2 entries, the second of 1 byte */
        {128 << 20, 160 << 20, 1 << 20}, /* 16 entries */
        {7, 13, 3},                     /* 1 entry, odd */
    };
    const CUdeviceptr local = 0x100000000ull, remote = 0x200000000ull;
    for (int read = 0; read < 2; read++) {
        pdl_cuda_list_t l = {0};
        const char *what = NULL;
        pdl_cuda_fake_counts_t c0, c1;
        pdl__cudadrv_fake_counts(&c0);
        /* Twice into one list: the second pass starts with entries queued and must keep them. */
        for (int rep = 0; rep < 2; rep++)
            assert_int_equal(pdl__cudadrv_add_descs(d, &l, ds, 5, local, remote, read, NULL, &what), CUDA_SUCCESS);
        pdl__cudadrv_fake_counts(&c1);
        assert_int_equal(c1.copies - c0.copies, 2); /* the 5 MiB piece, each pass */
        assert_int_equal(l.n, 2 * 20);
        assert_true(l.cap >= l.n);
        size_t k = 0;
        for (int rep = 0; rep < 2; rep++)
            for (size_t i = 0; i < 5; i++) {
                if (ds[i].len >= PDL_CUDA_MEMCPY_MIN)
                    continue;
                for (uint64_t o = 0; o < ds[i].len; o += 64 << 10, k++) {
                    uint64_t src = read ? remote + ds[i].remote_off : local + ds[i].local_off;
                    uint64_t dst = read ? local + ds[i].local_off : remote + ds[i].remote_off;
                    uint64_t len = ds[i].len - o < (64 << 10) ? ds[i].len - o : 64 << 10;
                    assert_int_equal(l.host[k].src, src + o);
                    assert_int_equal(l.host[k].dst, dst + o);
                    assert_int_equal(l.host[k].len, len);
                }
            }
        assert_int_equal(k, l.n);
        pdl__cudadrv_list_free(d, &l);
    }
    /* Past the list's first size (4,096 entries): it grows between pieces and keeps every entry. */
    size_t n = 3000;
    pdl_desc_t *many = malloc(n * sizeof(*many));
    assert_non_null(many);
    for (size_t i = 0; i < n; i++)
        many[i] = (pdl_desc_t){i << 20, i << 21, (64 << 10) + 16}; /* 2 entries each */
    pdl_cuda_list_t l = {0};
    const char *what = NULL;
    assert_int_equal(pdl__cudadrv_add_descs(d, &l, many, n, 0, 0, true, NULL, &what), CUDA_SUCCESS);
    assert_int_equal(l.n, 2 * n);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(l.host[2 * i].src, i << 21);
        assert_int_equal(l.host[2 * i + 1].dst, (i << 20) + (64 << 10));
        assert_int_equal(l.host[2 * i + 1].len, 16);
    }
    pdl__cudadrv_list_free(d, &l);
    free(many);
    pdl__cudadrv_close(d);
    unsetenv("PDLINK_TEST_CUDA_FAKE");
}

static uint8_t pat(uint64_t o) { return (uint8_t)(o * 131 + (o >> 9) + 7); }

/* Two cuda engines of this process on the test driver: the owner's region R holds pat(), the reader's
 * region Lo is zeroed, and s is the reader's session to R. Both regions are PROT_NONE. */
typedef struct rig {
    pdl_cudadrv_t *d;
    pdl_engine_t *own, *rd;
    CUdeviceptr R, Lo;
    size_t sz;
    pdl_mem_t *mr, *ml;
    pdl_session_t *s;
    uint8_t *host, *back;
} rig_t;

static void rig_open(rig_t *g, size_t sz)
{
    memset(g, 0, sizeof(*g));
    g->d = open_test_driver("1");
    g->sz = sz;
    pdl_engine_config_t cfg = {.key = "owner", .backend = PDL_BACKEND_CUDA, .qp_per_transfer = 1, .num_workers = 2};
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&cfg, &g->own, &err), PDL_OK);
    cfg.key = "reader";
    assert_int_equal(pdl_engine_create(&cfg, &g->rd, &err), PDL_OK);
    pdl_bytes_t pb;
    assert_int_equal(pdl_engine_pack(g->own, &pb, &err), PDL_OK);
    assert_int_equal(pdl_engine_add_remote(g->rd, pb.data, pb.len, NULL, 0, &err), PDL_OK);
    pdl_bytes_free(&pb);
    assert_int_equal(g->d->api.MemAlloc(&g->R, sz), CUDA_SUCCESS);
    assert_int_equal(g->d->api.MemAlloc(&g->Lo, sz), CUDA_SUCCESS);
    g->host = malloc(sz);
    g->back = malloc(sz);
    assert_non_null(g->host);
    assert_non_null(g->back);
    for (size_t o = 0; o < sz; o++)
        g->host[o] = pat(o);
    assert_int_equal(g->d->api.MemcpyHtoDAsync(g->R, g->host, sz, NULL), CUDA_SUCCESS);
    assert_int_equal(g->d->api.MemsetD8Async(g->Lo, 0, sz, NULL), CUDA_SUCCESS);
    assert_int_equal(pdl_engine_register_mem_type(g->own, (void *)(uintptr_t)g->R, sz, PDL_MEM_TYPE_CUDA, &g->mr, &err),
                     PDL_OK);
    assert_int_equal(pdl_engine_register_mem_type(g->rd, (void *)(uintptr_t)g->Lo, sz, PDL_MEM_TYPE_CUDA, &g->ml, &err),
                     PDL_OK);
    assert_int_equal(pdl_mem_pack(g->mr, &pb, &err), PDL_OK);
    assert_int_equal(pdl_session_open(g->rd, g->ml, pb.data, pb.len, &g->s, &err), PDL_OK);
    pdl_bytes_free(&pb);
}

static void rig_close(rig_t *g)
{
    pdl_session_close(g->s);
    pdl_engine_deregister_mem(g->rd, g->ml);
    pdl_engine_deregister_mem(g->own, g->mr);
    pdl_engine_destroy(g->rd);
    pdl_engine_destroy(g->own);
    g->d->api.MemFree(g->R);
    g->d->api.MemFree(g->Lo);
    free(g->host);
    free(g->back);
    pdl__cudadrv_close(g->d);
    unsetenv("PDLINK_TEST_CUDA_FAKE");
}

/* Region `dev` against the pattern READ descriptors ds[0..n) put there (zeros elsewhere), or the one
 * WRITE descriptors put into a zeroed remote region (remote = true). */
static void rig_expect(rig_t *g, CUdeviceptr dev, const pdl_desc_t *ds, size_t n, bool remote)
{
    assert_int_equal(g->d->api.MemcpyDtoHAsync(g->back, dev, g->sz, NULL), CUDA_SUCCESS);
    memset(g->host, 0, g->sz);
    for (size_t i = 0; i < n; i++)
        for (uint64_t o = 0; o < ds[i].len; o++)
            g->host[(remote ? ds[i].remote_off : ds[i].local_off) + o] = pat(ds[i].remote_off + o);
    assert_memory_equal(g->back, g->host, g->sz);
}

/* READ and WRITE batches of the cuda backend on the test driver: every byte lands, and each batch is one
 * list upload, one launch and one synchronisation (plus a memcpy per piece of 4 MiB or more), whatever
 * its number of pieces. The regions are PROT_NONE: a CPU access by pdlink would kill this test. */
static void test_batches_on_test_driver(void **state)
{
    (void)state;
    rig_t g;
    rig_open(&g, 16u << 20);
    pdl_error_t err;
    /* 200 head-split pieces, a 5 MiB piece, three of 1 MiB, one odd: none adjacent on both sides. */
    pdl_desc_t ds[205];
    size_t n = 0;
    for (size_t i = 0; i < 200; i++)
        ds[n++] = (pdl_desc_t){i * 4096, i * 8192 + 4096, 4096};
    ds[n++] = (pdl_desc_t){1u << 20, 2u << 20, 5u << 20};
    for (size_t j = 0; j < 3; j++)
        ds[n++] = (pdl_desc_t){(7 + 2 * j) << 20, (8 + 2 * j) << 20, 1u << 20};
    ds[n++] = (pdl_desc_t){(13u << 20) + 1, (14u << 20) + 3, 4097};
    for (int op = 0; op < 2; op++) {
        pdl_cuda_fake_counts_t c0, c1;
        pdl__cudadrv_fake_counts(&c0);
        pdl_batch_t *b;
        assert_int_equal(pdl_session_post(g.s, op ? PDL_OP_WRITE : PDL_OP_READ, ds, n, &b, &err), PDL_OK);
        assert_int_equal(pdl_batch_wait(b, 10000, &err), PDL_OK);
        pdl_batch_free(b);
        pdl__cudadrv_fake_counts(&c1);
        assert_int_equal(c1.launches - c0.launches, 1);
        assert_int_equal(c1.pieces - c0.pieces, 200 + 3 * 16 + 1);
        assert_int_equal(c1.copies - c0.copies, 2); /* the list's upload and the 5 MiB memcpy */
        assert_int_equal(c1.syncs - c0.syncs, 1);
        if (op == 0) {
            rig_expect(&g, g.Lo, ds, n, false);
            /* WRITE next: the local bytes back to the remote region, which is zeroed first. */
            assert_int_equal(g.d->api.MemsetD8Async(g.R, 0, g.sz, NULL), CUDA_SUCCESS);
        } else {
            rig_expect(&g, g.R, ds, n, true);
        }
    }
    rig_close(&g);
}

/* Batches launched by the posting thread (small ones) and handed to workers (past 8,192 pieces, or when
 * every inline lane is taken) side by side: twelve small batches posted before any wait (more than the
 * inline lanes), one large one, waited for in reverse order, one polled to completion, one freed
 * without a wait; every byte lands and nothing hangs. */
static void test_batches_in_flight(void **state)
{
    (void)state;
    rig_t g;
    rig_open(&g, 16u << 20);
    pdl_error_t err;
    enum { SMALL = 12, PER = 64, LARGE = 9000 };
    pdl_desc_t *ds = malloc((SMALL * PER + LARGE) * sizeof(*ds));
    assert_non_null(ds);
    size_t n = 0;
    for (size_t i = 0; i < SMALL * PER; i++, n++) /* 1 KiB pieces at a 2 KiB stride, from 8 MiB on */
        ds[n] = (pdl_desc_t){i * 1024, (8u << 20) + i * 2048, 1024};
    for (size_t i = 0; i < LARGE; i++, n++) /* 256-byte pieces at a 512-byte stride, past the small ones */
        ds[n] = (pdl_desc_t){(1u << 20) + i * 256, i * 512, 256};
    pdl_batch_t *b[SMALL + 1];
    for (int k = 0; k < SMALL; k++)
        assert_int_equal(pdl_session_post(g.s, PDL_OP_READ, &ds[k * PER], PER, &b[k], &err), PDL_OK);
    assert_int_equal(pdl_session_post(g.s, PDL_OP_READ, &ds[SMALL * PER], LARGE, &b[SMALL], &err), PDL_OK);
    pdl_status_t st;
    while ((st = pdl_batch_poll(b[0], &err)) == PDL_INPROGRESS)
        ;
    assert_int_equal(st, PDL_OK);
    pdl_batch_free(b[0]);
    pdl_batch_free(b[1]); /* never waited for: freeing completes it */
    for (int k = SMALL; k >= 2; k--) {
        assert_int_equal(pdl_batch_wait(b[k], 10000, &err), PDL_OK);
        pdl_batch_free(b[k]);
    }
    rig_expect(&g, g.Lo, ds, n, false);
    /* Zeroing on the device still finds a lane (the workers'). */
    pdl_range_t all = {0, g.sz};
    assert_int_equal(pdl_mem_zero(g.ml, &all, 1, &err), PDL_OK);
    rig_expect(&g, g.Lo, ds, 0, false);
    free(ds);
    rig_close(&g);
}

/*
 * Issue 36 on cuda (the fence shm.c runs for this backend too): a READ grant of block A (the first
 * 64 KiB of R) under "tx-a"; a batch naming tx-a that reads block B is refused with PDL_ERR_DENIED and
 * moves nothing, whether the posting thread launches it (a small batch) or a worker does (past 8,192
 * pieces); A itself reads. Before the published table carried ranges, both reads of B succeeded.
 */
static void test_grant_ranges_cuda(void **state)
{
    (void)state;
    rig_t g;
    rig_open(&g, 4u << 20);
    pdl_error_t err;
    pdl_mem_guard(g.mr);
    pdl_range_t a = {0, 65536};
    assert_int_equal(pdl_engine_grant(g.own, g.mr, "tx-a", PDL_GRANT_READ, &a, 1, &err), PDL_OK);
    enum { MANY = 9000 };
    pdl_desc_t *many = malloc(MANY * sizeof(*many));
    assert_non_null(many);
    for (size_t i = 0; i < MANY; i++) /* 4-byte pieces of A at an 8-byte stride, the last one in B */
        many[i] = (pdl_desc_t){i * 8, i * 8, 4};
    many[MANY - 1] = (pdl_desc_t){(MANY - 1) * 8, 65536, 4};
    pdl_desc_t b_only = {0, 65536, 65536};
    for (int k = 0; k < 2; k++) {
        pdl_batch_t *b;
        assert_int_equal(pdl_session_post_granted(g.s, PDL_OP_READ, "tx-a", k ? many : &b_only, k ? MANY : 1, &b,
                                                  &err),
                         PDL_OK);
        assert_int_equal(pdl_batch_wait(b, 10000, &err), PDL_ERR_DENIED);
        assert_non_null(strstr(err.msg, "outside its grant tx-a"));
        pdl_batch_free(b);
        rig_expect(&g, g.Lo, NULL, 0, false); /* nothing landed */
    }
    pdl_desc_t in = {0, 0, 65536};
    pdl_batch_t *b;
    assert_int_equal(pdl_session_post_granted(g.s, PDL_OP_READ, "tx-a", &in, 1, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, 10000, &err), PDL_OK);
    pdl_batch_free(b);
    rig_expect(&g, g.Lo, &in, 1, false);
    assert_int_equal(pdl_engine_revoke(g.own, "tx-a", &err), PDL_OK);
    free(many);
    rig_close(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_without_driver),
        cmocka_unit_test(test_device_descriptor_fields),
        cmocka_unit_test(test_gather_list_one_pass),
        cmocka_unit_test(test_batches_on_test_driver),
        cmocka_unit_test(test_batches_in_flight),
        cmocka_unit_test(test_grant_ranges_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
