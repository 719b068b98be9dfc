/*
 * test_engine_staged.c -- device memory over the tcp backend through pinned staging windows, on a host
 * without a GPU.
 *
 * PDLINK_TEST_CUDA_FAKE=1 gives the engines the test CUDA driver (src/engine/cudadrv_fake.c): its
 * device memory is a PROT_NONE mapping, so a CPU access by pdlink dies of SIGSEGV (and a system call
 * on it fails with EFAULT), while the driver's own copies reach it through /proc/self/mem. Each case
 * runs in a child with an owner and an initiator tcp engine (two connections per session, so large
 * batches are striped); the parent fails the case if the child dies of a signal. Cases: READ and
 * WRITE with device memory on the initiator's side, the owner's side and both; whole 128 KiB blocks
 * in shuffled order (8 MiB: several windows per request) and 4 KiB pieces at an 8 KiB stride (1024
 * pieces in one request). Every byte of both regions is compared afterwards (device bytes read back
 * through the test driver): the pieces carry the source's bytes, everything else is untouched. Then the
 * failures: a device region whose memory vanished behind the engine fails its batch with the driver's
 * error, on the owner's side without breaking the session, on the initiator's side breaking it.
 *
 * The `_slow` cases rerun transfers with PDLINK_TEST_CUDA_FAKE_LATENCY_US set: the test driver's streams
 * then hold their copies back until that long after they were queued (cudadrv_fake.c), so a side that
 * sends or scatters a window before its copy completed moves stale bytes and fails the byte check.
 * owner_serves_others_while_copying: an owner with one server thread, device copies of 200 ms, serves
 * small host-memory READs of another session in under half that while a device READ waits for its
 * copies (the server thread polls its stages instead of waiting on them; waiting, the first small READ
 * took the whole 200 ms).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/clock.h"
#include "pdlink/engine.h"
#include "test_child.h"
#include "test_pattern.h"
#include "engine/cudadrv.h" /* the test driver, to make and read back device memory */
#include "test_fake_cuda.h"

#define REGION (8u << 20)
#define BLOCK (128u << 10)
#define NBLOCKS (REGION / BLOCK)
#define PIECE 4096u
#define STRIDE 8192u

enum { DEV_LOCAL = 1, DEV_REMOTE = 2 };

typedef struct side {
    bool dev;
    uint8_t *host;     /* host region, or NULL */
    CUdeviceptr dptr;  /* device region, or 0 */
    pdl_mem_t *mem;
} side_t;

static pdl_cudadrv_t *drv;

static pdl_engine_t *mk_workers(const char *key, int workers)
{
    pdl_engine_config_t cfg = {.key = key, .host = "127.0.0.1", .backend = PDL_BACKEND_TCP, .qp_per_transfer = 2,
                               .num_workers = workers};
    pdl_engine_t *e = NULL;
    pdl_error_t err;
    if (pdl_engine_create(&cfg, &e, &err) != PDL_OK) {
        fprintf(stderr, "create %s: %s\n", key, err.msg);
        _exit(2);
    }
    return e;
}

static pdl_engine_t *mk(const char *key) { return mk_workers(key, 2); }

/* A region filled with pattern `seed`, host or device, registered with e. */
static int side_make(pdl_engine_t *e, bool dev, uint64_t seed, side_t *sd)
{
    memset(sd, 0, sizeof(*sd));
    sd->dev = dev;
    uint8_t *buf = malloc(REGION);
    TCH_CHECK(buf != NULL, "malloc");
    for (size_t i = 0; i < REGION; i++)
        buf[i] = tp_byte(seed, i);
    pdl_error_t err;
    if (!dev) {
        sd->host = buf;
        TCH_CHECK(pdl_engine_register_mem(e, buf, REGION, &sd->mem, &err) == PDL_OK, "register: %s", err.msg);
        return 0;
    }
    TCH_CHECK(drv->api.MemAlloc(&sd->dptr, REGION) == CUDA_SUCCESS, "fake cuMemAlloc");
    TCH_CHECK(drv->api.MemcpyHtoDAsync(sd->dptr, buf, REGION, NULL) == CUDA_SUCCESS, "fake cuMemcpyHtoD");
    free(buf);
    pdl_status_t st = pdl_engine_register_mem_type(e, (void *)(uintptr_t)sd->dptr, REGION, PDL_MEM_TYPE_CUDA, &sd->mem,
                                                   &err);
    TCH_CHECK(st == PDL_OK, "register device memory: %s", err.msg);
    return 0;
}

/* The region's bytes, read back through the test driver for device memory (caller frees). */
static uint8_t *side_read(const side_t *sd)
{
    if (!sd->dev) {
        uint8_t *c = malloc(REGION);
        if (c)
            memcpy(c, sd->host, REGION);
        return c;
    }
    uint8_t *c = malloc(REGION);
    if (c && drv->api.MemcpyDtoHAsync(c, sd->dptr, REGION, NULL) != CUDA_SUCCESS) {
        free(c);
        return NULL;
    }
    return c;
}

static void side_free(pdl_engine_t *e, side_t *sd)
{
    pdl_engine_deregister_mem(e, sd->mem);
    if (sd->dev)
        drv->api.MemFree(sd->dptr);
    free(sd->host);
}

/* Whole blocks, remote block i -> local block perm(i); or 4 KiB pieces at an 8 KiB stride, each remote
 * piece at the other half of the local stride. */
static size_t make_descs(bool strided, pdl_desc_t *d)
{
    if (strided) {
        for (size_t i = 0; i < REGION / STRIDE; i++)
            d[i] = (pdl_desc_t){(uint64_t)i * STRIDE, (uint64_t)i * STRIDE + PIECE, PIECE};
        return REGION / STRIDE;
    }
    for (size_t i = 0; i < NBLOCKS; i++)
        d[i] = (pdl_desc_t){((i * 37 + 11) % NBLOCKS) * BLOCK, i * BLOCK, BLOCK};
    return NBLOCKS;
}

/* Every byte: the destination's pieces hold the source's bytes, every other byte its own pattern. */
static int verify(pdl_op_t op, const side_t *loc, const side_t *rem, const pdl_desc_t *d, size_t n)
{
    uint8_t *lb = side_read(loc), *rb = side_read(rem);
    TCH_CHECK(lb != NULL && rb != NULL, "reading the regions back");
    bool rd = op == PDL_OP_READ;
    uint8_t *dst = rd ? lb : rb;
    const uint8_t *src = rd ? rb : lb;
    uint64_t dseed = rd ? 1 : 2, sseed = rd ? 2 : 1;
    uint8_t *hit = calloc(REGION, 1);
    TCH_CHECK(hit != NULL, "calloc");
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t doff = rd ? d[i].local_off : d[i].remote_off, soff = rd ? d[i].remote_off : d[i].local_off;
        for (uint64_t k = 0; k < d[i].len; k++) {
            hit[doff + k] = 1;
            wrong += dst[doff + k] != src[soff + k] || src[soff + k] != tp_byte(sseed, soff + k);
        }
    }
    for (size_t i = 0; i < REGION; i++)
        wrong += !hit[i] && dst[i] != tp_byte(dseed, i);
    free(hit);
    free(lb);
    free(rb);
    TCH_CHECK(wrong == 0, "%zu wrong bytes", wrong);
    return 0;
}

/* One batch: initiator region (seed 1) <-> owner region (seed 2), device memory where `where` says. */
/* Tell ini about own and rem's region, and open ini's session from loc to it; ed and md (the packed
 * engine and region) are the caller's to free. 0, or 2 with the failing step on stderr. */
static int connect_sides(pdl_engine_t *own, pdl_engine_t *ini, side_t *loc, side_t *rem, pdl_bytes_t *ed,
                         pdl_bytes_t *md, pdl_session_t **s)
{
    pdl_error_t err;
    TCH_CHECK(pdl_engine_pack(own, ed, &err) == PDL_OK && pdl_engine_add_remote(ini, ed->data, ed->len, NULL, 0, &err) == PDL_OK &&
              pdl_mem_pack(rem->mem, md, &err) == PDL_OK,
          "setup: %s", err.msg);
    TCH_CHECK(pdl_session_open(ini, loc->mem, md->data, md->len, s, &err) == PDL_OK, "session_open: %s", err.msg);
    return 0;
}

static int transfer_case(pdl_op_t op, int where, bool strided)
{
    pdl_engine_t *own = mk("staged:owner"), *ini = mk("staged:initiator");
    pdl_error_t err;
    TCH_CHECK(pdl_engine_mem_types(ini) & (1u << PDL_MEM_TYPE_CUDA), "a tcp engine with the test driver claims CUDA");
    side_t loc, rem;
    if (side_make(ini, where & DEV_LOCAL, 1, &loc) || side_make(own, where & DEV_REMOTE, 2, &rem))
        return 2;
    pdl_bytes_t ed = {0}, md = {0};
    pdl_session_t *s = NULL;
    if (connect_sides(own, ini, &loc, &rem, &ed, &md, &s))
        return 2;
    pdl_desc_t *d = malloc(sizeof(*d) * (REGION / STRIDE));
    size_t n = make_descs(strided, d);
    pdl_batch_t *b = NULL;
    TCH_CHECK(pdl_session_post(s, op, d, n, &b, &err) == PDL_OK, "post: %s", err.msg);
    pdl_status_t st = pdl_batch_wait(b, 30000, &err);
    TCH_CHECK(st == PDL_OK, "batch: %s: %s", pdl_status_name(st), err.msg);
    pdl_batch_free(b);
    if (verify(op, &loc, &rem, d, n))
        return 2;
    pdl_engine_stats_t stats;
    pdl_engine_get_stats(own, &stats);
    TCH_CHECK(stats.bytes_served == (uint64_t)n * d[0].len, "owner served %llu bytes",
          (unsigned long long)stats.bytes_served);
    free(d);
    pdl_session_close(s);
    pdl_bytes_free(&ed);
    pdl_bytes_free(&md);
    side_free(ini, &loc);
    side_free(own, &rem);
    pdl_engine_destroy(ini);
    pdl_engine_destroy(own);
    return 0;
}

/*
 * Take a device region's bytes away from the driver too: a shared mapping of an empty memfd over it
 * (read-protected like device memory) faults even through /proc/self/mem, so the test driver's copies
 * fail with CUDA_ERROR_INVALID_VALUE. Unlike unmapping, it keeps the addresses taken, so no later
 * allocation lands there. cuMemFree later unmaps it with its guard pages.
 */
static int vanish(CUdeviceptr p)
{
    int fd = memfd_create("pdlink-test-vanished", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    void *m = mmap((void *)(uintptr_t)p, REGION, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, 0);
    close(fd);
    return m == (void *)(uintptr_t)p ? 0 : -1;
}

/* A device region whose memory the driver no longer has: the owner's (session stays usable, the error
 * names the staging) or the initiator's (the session breaks with the same error). */
static int failure_case(pdl_op_t op, bool owner_side)
{
    pdl_engine_t *own = mk("staged:owner"), *ini = mk("staged:initiator");
    pdl_error_t err;
    side_t loc, rem, good;
    if (side_make(ini, !owner_side, 1, &loc) || side_make(own, owner_side, 2, &rem) || side_make(own, false, 3, &good))
        return 2;
    pdl_bytes_t ed = {0}, md = {0};
    pdl_session_t *s = NULL;
    if (connect_sides(own, ini, &loc, &rem, &ed, &md, &s))
        return 2;
    side_t *gone = owner_side ? &rem : &loc;
    TCH_CHECK(vanish(gone->dptr) == 0, "replacing the device region: %s", strerror(errno));
    pdl_desc_t d[2] = {{0, 0, 3u << 20}, {4u << 20, 4u << 20, 64u << 10}};
    for (int round = 0; round < 2; round++) {
        pdl_batch_t *b = NULL;
        pdl_status_t st = pdl_session_post(s, op, d, 2, &b, &err);
        if (st == PDL_OK) {
            st = pdl_batch_wait(b, 30000, &err);
            pdl_batch_free(b);
        }
        fprintf(stderr, "round %d: %s: %s\n", round, pdl_status_name(st), err.msg);
        TCH_CHECK(st == PDL_ERR_TRANSPORT, "a failed device copy ends the batch with PDL_ERR_TRANSPORT, not %s",
              pdl_status_name(st));
        TCH_CHECK(strstr(err.msg, "staging") != NULL && strstr(err.msg, "CUDA_ERROR_INVALID_VALUE") != NULL,
              "the message names the staging and the driver's error: %s", err.msg);
    }
    pdl_session_close(s);
    /* The owner's engine still serves: a new session to its host region from a fresh host region. */
    pdl_bytes_t gd = {0};
    side_t fresh;
    if (side_make(ini, false, 4, &fresh))
        return 2;
    TCH_CHECK(pdl_mem_pack(good.mem, &gd, &err) == PDL_OK, "pack");
    TCH_CHECK(pdl_session_open(ini, fresh.mem, gd.data, gd.len, &s, &err) == PDL_OK, "session_open: %s", err.msg);
    pdl_batch_t *b = NULL;
    TCH_CHECK(pdl_session_post(s, PDL_OP_READ, d, 2, &b, &err) == PDL_OK, "post: %s", err.msg);
    TCH_CHECK(pdl_batch_wait(b, 30000, &err) == PDL_OK, "the engines still work: %s", err.msg);
    pdl_batch_free(b);
    pdl_session_close(s);
    pdl_bytes_free(&ed);
    pdl_bytes_free(&md);
    pdl_bytes_free(&gd);
    side_free(ini, &loc);
    side_free(own, &rem);
    side_free(own, &good);
    side_free(ini, &fresh);
    pdl_engine_destroy(ini);
    pdl_engine_destroy(own);
    return 0;
}

/* A session from a fresh initiator region to the owner's region `rem` (its engine added once). */
static int open_to(pdl_engine_t *ini, pdl_engine_t *own, bool add, side_t *loc, const side_t *rem,
                   pdl_session_t **s)
{
    pdl_error_t err;
    pdl_bytes_t ed = {0}, md = {0};
    if (add) {
        TCH_CHECK(pdl_engine_pack(own, &ed, &err) == PDL_OK && pdl_engine_add_remote(ini, ed.data, ed.len, NULL, 0, &err) ==
                  PDL_OK, "add_remote: %s", err.msg);
        pdl_bytes_free(&ed);
    }
    TCH_CHECK(pdl_mem_pack(rem->mem, &md, &err) == PDL_OK, "pack: %s", err.msg);
    pdl_status_t st = pdl_session_open(ini, loc->mem, md.data, md.len, s, &err);
    pdl_bytes_free(&md);
    TCH_CHECK(st == PDL_OK, "session_open: %s", err.msg);
    return 0;
}

/* An owner with one server thread: while a device READ (8 MiB, two connections, copies of 200 ms)
 * waits for its copies, small READs of host memory from another session keep being served. Counted,
 * not timed (this machine's load made single reads take up to 60 ms): the READs finished before the
 * first device copy could have, of which a server thread waiting on the device serves at most the one
 * it may take before the device READ (0 in three runs with it waiting, thousands without). */
static int serve_while_copying(void)
{
    setenv("PDLINK_TEST_CUDA_FAKE_LATENCY_US", "200000", 1);
    pdl_engine_t *own = mk_workers("staged:owner", 1), *ini = mk("staged:initiator");
    pdl_error_t err;
    side_t dloc, drem, hloc, hrem;
    if (side_make(ini, false, 1, &dloc) || side_make(own, true, 2, &drem) || side_make(ini, false, 3, &hloc) ||
        side_make(own, false, 4, &hrem))
        return 2;
    pdl_session_t *ds = NULL, *hs = NULL;
    if (open_to(ini, own, true, &dloc, &drem, &ds) || open_to(ini, own, false, &hloc, &hrem, &hs))
        return 2;
    pdl_desc_t *d = malloc(sizeof(*d) * NBLOCKS);
    TCH_CHECK(d != NULL, "malloc");
    size_t n = make_descs(false, d);
    pdl_desc_t small = {0, 0, 64u << 10};
    pdl_batch_t *big = NULL;
    uint64_t t0 = pdl__clock_now_ns(), worst = 0;
    TCH_CHECK(pdl_session_post(ds, PDL_OP_READ, d, n, &big, &err) == PDL_OK, "post: %s", err.msg);
    int smalls = 0, early = 0;
    pdl_status_t st;
    while ((st = pdl_batch_poll(big, &err)) == PDL_INPROGRESS) {
        uint64_t s0 = pdl__clock_now_ns();
        pdl_batch_t *b = NULL;
        TCH_CHECK(pdl_session_post(hs, PDL_OP_READ, &small, 1, &b, &err) == PDL_OK, "post: %s", err.msg);
        TCH_CHECK(pdl_batch_wait(b, 30000, &err) == PDL_OK, "small read: %s", err.msg);
        pdl_batch_free(b);
        uint64_t dt = pdl__clock_now_ns() - s0;
        worst = dt > worst ? dt : worst;
        smalls++;
        early += pdl__clock_now_ns() - t0 < 180000000u;
    }
    TCH_CHECK(st == PDL_OK, "device read: %s: %s", pdl_status_name(st), err.msg);
    uint64_t total = pdl__clock_now_ns() - t0;
    pdl_batch_free(big);
    fprintf(stderr, "device read %.1f ms; %d host reads meanwhile (%d in its first 180 ms), the slowest %.2f ms\n",
            total / 1e6, smalls, early, worst / 1e6);
    TCH_CHECK(total >= 200000000u, "the device read took %.1f ms: were its copies held back?", total / 1e6);
    TCH_CHECK(early >= 5, "%d host reads in the first 180 ms of the device read: the server thread waited for the device",
          early);
    if (verify(PDL_OP_READ, &dloc, &drem, d, n))
        return 2;
    free(d);
    pdl_session_close(ds);
    pdl_session_close(hs);
    side_free(ini, &dloc);
    side_free(ini, &hloc);
    side_free(own, &drem);
    side_free(own, &hrem);
    pdl_engine_destroy(ini);
    pdl_engine_destroy(own);
    return 0;
}

typedef struct tcase {
    pdl_op_t op;
    int where;   /* DEV_LOCAL | DEV_REMOTE; 0 = a failure case (or, with `slow`, the serving case) */
    bool strided;
    bool owner_side;
    bool slow;   /* device copies held back (PDLINK_TEST_CUDA_FAKE_LATENCY_US) */
} tcase_t;

static int child(const tcase_t *tc)
{
    if (tfc_open(tc->slow ? "3000" : NULL, &drv))
        return 2;
    int rc = tc->where      ? transfer_case(tc->op, tc->where, tc->strided)
             : tc->slow     ? serve_while_copying()
                            : failure_case(tc->op, tc->owner_side);
    pdl__cudadrv_close(drv);
    return rc;
}

#define CASE(name, ...) TCH_DEVICE_CASE(name, child, tcase_t, __VA_ARGS__)

CASE(read_blocks_into_device, PDL_OP_READ, DEV_LOCAL, false, false, false)
CASE(read_blocks_from_device, PDL_OP_READ, DEV_REMOTE, false, false, false)
CASE(read_blocks_device_both, PDL_OP_READ, DEV_LOCAL | DEV_REMOTE, false, false, false)
CASE(write_blocks_from_device, PDL_OP_WRITE, DEV_LOCAL, false, false, false)
CASE(write_blocks_into_device, PDL_OP_WRITE, DEV_REMOTE, false, false, false)
CASE(write_blocks_device_both, PDL_OP_WRITE, DEV_LOCAL | DEV_REMOTE, false, false, false)
CASE(read_strided_into_device, PDL_OP_READ, DEV_LOCAL, true, false, false)
CASE(read_strided_from_device, PDL_OP_READ, DEV_REMOTE, true, false, false)
CASE(read_strided_device_both, PDL_OP_READ, DEV_LOCAL | DEV_REMOTE, true, false, false)
CASE(write_strided_from_device, PDL_OP_WRITE, DEV_LOCAL, true, false, false)
CASE(write_strided_into_device, PDL_OP_WRITE, DEV_REMOTE, true, false, false)
CASE(write_strided_device_both, PDL_OP_WRITE, DEV_LOCAL | DEV_REMOTE, true, false, false)
CASE(read_fails_on_owner_device, PDL_OP_READ, 0, false, true, false)
CASE(write_fails_on_owner_device, PDL_OP_WRITE, 0, false, true, false)
CASE(read_fails_on_initiator_device, PDL_OP_READ, 0, false, false, false)
CASE(write_fails_on_initiator_device, PDL_OP_WRITE, 0, false, false, false)
CASE(read_blocks_device_both_slow, PDL_OP_READ, DEV_LOCAL | DEV_REMOTE, false, false, true)
CASE(write_blocks_device_both_slow, PDL_OP_WRITE, DEV_LOCAL | DEV_REMOTE, false, false, true)
CASE(read_strided_device_both_slow, PDL_OP_READ, DEV_LOCAL | DEV_REMOTE, true, false, true)
CASE(write_strided_device_both_slow, PDL_OP_WRITE, DEV_LOCAL | DEV_REMOTE, true, false, true)
CASE(owner_serves_others_while_copying, PDL_OP_READ, 0, false, false, true)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(read_blocks_into_device),   cmocka_unit_test(read_blocks_from_device),
        cmocka_unit_test(read_blocks_device_both),   cmocka_unit_test(write_blocks_from_device),
        cmocka_unit_test(write_blocks_into_device),  cmocka_unit_test(write_blocks_device_both),
        cmocka_unit_test(read_strided_into_device),  cmocka_unit_test(read_strided_from_device),
        cmocka_unit_test(read_strided_device_both),  cmocka_unit_test(write_strided_from_device),
        cmocka_unit_test(write_strided_into_device), cmocka_unit_test(write_strided_device_both),
        cmocka_unit_test(read_fails_on_owner_device),     cmocka_unit_test(write_fails_on_owner_device),
        cmocka_unit_test(read_fails_on_initiator_device), cmocka_unit_test(write_fails_on_initiator_device),
        cmocka_unit_test(read_blocks_device_both_slow),   cmocka_unit_test(write_blocks_device_both_slow),
        cmocka_unit_test(read_strided_device_both_slow),  cmocka_unit_test(write_strided_device_both_slow),
        cmocka_unit_test(owner_serves_others_while_copying),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
