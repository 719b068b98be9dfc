/*
 * test_engine_backends.c -- the engine between two processes, one body per behaviour, run for shm,
 * tcp and ucx (UCX-style parametrisation): random READ/WRITE batches verified byte by byte, a killed
 * peer, a stalled peer, a deregistered remote region, many batches in flight on one session (waited
 * out of order, from several threads, by polling only), and (tcp) hostile bytes on the data socket.
 *
 * ucx runs over the transports this machine has (no RDMA device): UCX's tcp (UCX_TLS=tcp, which is
 * also the one where the owner must answer, so a stopped owner stalls a batch) and, for the random
 * batches, a killed peer and a deregistered region, its shared-memory transports (UCX_TLS=sm:
 * posix/sysv/cma, one-sided without the owner where UCX maps the owner's region).
 * The variable is set before the target is forked, so both engines see the same one.
 *
 * tcp again with device memory (the _devmem tests): PDLINK_TEST_CUDA_FAKE=1 gives both processes the
 * test CUDA driver (src/engine/cudadrv_fake.c), the target's region 1 and the initiator's local region
 * are its PROT_NONE device memory (the staged path, docs/engine.md), and the test reaches their bytes
 * only through that driver.
 *
 * Each test forks the target before creating any thread (fork in a threaded process is unsafe, and
 * TSan refuses it). Parent and child talk over a socketpair: the child sends its engine descriptor and
 * two memory descriptors (a pdlink-allocated memfd region and a caller-registered one), then serves
 * commands: fill a region with a pattern, verify ranges, deregister, quit.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <cmocka.h>

#include "pdlink/engine.h"
#include "test_pattern.h"
#include "common/log.h"
#include "engine/backend.h" /* pdl__engine_desc_unpack: the test needs the target's port */
#include "engine/cudadrv.h" /* the test driver, for the _devmem tests */

#define REGION (4u << 20)
#define SLOT (64u << 10)
#define NSLOTS (REGION / SLOT)

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = tp_byte(seed, i);
}

/* ---------------------------------------------------------------- device memory (_devmem tests) */

static bool devmem(void)
{
    const char *v = getenv("PDLINK_TEST_CUDA_FAKE");
    return v != NULL && strcmp(v, "1") == 0;
}

/* The test driver of this process, opened at first use. */
static pdl_cudadrv_t *test_drv(void)
{
    static pdl_cudadrv_t *d;
    pdl_error_t err;
    if (d == NULL && (pdl__cudadrv_open("test", "test", &d, &err) != PDL_OK || pdl__cudadrv_ctx(d, "test", &err) != PDL_OK)) {
        fprintf(stderr, "the test CUDA driver: %s\n", err.msg);
        abort();
    }
    return d;
}

static CUdeviceptr dev_alloc(void)
{
    CUdeviceptr p = 0;
    if (test_drv()->api.MemAlloc(&p, REGION) != CUDA_SUCCESS)
        abort();
    return p;
}

/* Host bytes to / from device memory, through the test driver. */
static void dev_put(CUdeviceptr d, const void *h)
{
    if (test_drv()->api.MemcpyHtoDAsync(d, h, REGION, NULL) != CUDA_SUCCESS)
        abort();
}

static void dev_get(void *h, CUdeviceptr d)
{
    if (test_drv()->api.MemcpyDtoHAsync(h, d, REGION, NULL) != CUDA_SUCCESS)
        abort();
}

/* ---------------------------------------------------------------- control channel */

static int xwrite(int fd, const void *b, size_t n)
{
    const uint8_t *p = b;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int xread(int fd, void *b, size_t n)
{
    uint8_t *p = b;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r <= 0) {
            if (r < 0 && errno == EINTR)
                continue;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int send_blob(int fd, const void *b, uint32_t n) { return xwrite(fd, &n, 4) || xwrite(fd, b, n) ? -1 : 0; }

static int recv_blob(int fd, uint8_t **b, uint32_t *n)
{
    if (xread(fd, n, 4) || *n > (16u << 20))
        return -1;
    *b = malloc(*n ? *n : 1);
    return xread(fd, *b, *n);
}

typedef struct cmd {
    char op;       /* 'F' fill, 'V' verify, 'D' deregister, 'S' stats, 'Q' quit */
    uint8_t region; /* 0 = memfd region, 1 = user region */
    uint64_t seed;
    uint32_t ndesc;
} cmd_t;

static void child_main(int fd, pdl_backend_kind_t backend)
{
    pdl_engine_config_t cfg = {"target:tp0", "127.0.0.1", 0, backend, 2, 2, NULL, false, NULL, NULL};
    pdl_engine_t *e = NULL;
    pdl_error_t err;
    if (pdl_engine_create(&cfg, &e, &err) != PDL_OK) {
        fprintf(stderr, "child: %s\n", err.msg);
        _exit(3);
    }
    pdl_mem_t *m[2] = {NULL, NULL};
    uint8_t *user = aligned_alloc(4096, REGION);
    memset(user, 0, REGION);
    /* _devmem: region 1 is device memory; `user` then mirrors it for fill and verify. */
    CUdeviceptr dev = devmem() ? dev_alloc() : 0;
    if (dev != 0)
        dev_put(dev, user);
    if (pdl_engine_alloc_mem(e, REGION, &m[0], &err) != PDL_OK ||
        (dev == 0 && pdl_engine_register_mem(e, user, REGION, &m[1], &err) != PDL_OK) ||
        (dev != 0 && pdl_engine_register_mem_type(e, (void *)(uintptr_t)dev, REGION, PDL_MEM_TYPE_CUDA, &m[1], &err) !=
                         PDL_OK))
        _exit(4);
    pdl_bytes_t ed = {0}, md0 = {0}, md1 = {0};
    pdl_engine_pack(e, &ed, NULL);
    pdl_mem_pack(m[0], &md0, NULL);
    pdl_mem_pack(m[1], &md1, NULL);
    send_blob(fd, ed.data, (uint32_t)ed.len);
    send_blob(fd, md0.data, (uint32_t)md0.len);
    send_blob(fd, md1.data, (uint32_t)md1.len);
    pdl_bytes_free(&ed);
    pdl_bytes_free(&md0);
    pdl_bytes_free(&md1);
    cmd_t c;
    while (xread(fd, &c, sizeof(c)) == 0) {
        int32_t result = 0;
        if (c.op == 'Q')
            break;
        bool on_dev = dev != 0 && c.region == 1;
        if (c.op == 'F') {
            fill(on_dev ? user : pdl_mem_ptr(m[c.region]), REGION, c.seed);
            if (on_dev)
                dev_put(dev, user);
        } else if (c.op == 'V') {
            pdl_desc_t *d = malloc(c.ndesc * sizeof(*d));
            xread(fd, d, c.ndesc * sizeof(*d));
            if (on_dev)
                dev_get(user, dev);
            const uint8_t *p = on_dev ? user : pdl_mem_ptr(m[c.region]);
            for (uint32_t i = 0; i < c.ndesc && result == 0; i++)
                for (uint64_t j = 0; j < d[i].len; j++)
                    if (p[d[i].remote_off + j] != tp_byte(c.seed, d[i].local_off + j)) {
                        result = (int32_t)i + 1;
                        break;
                    }
            free(d);
        } else if (c.op == 'D') {
            pdl_engine_deregister_mem(e, m[c.region]);
            m[c.region] = NULL;
        } else if (c.op == 'S') {
            pdl_engine_stats_t st;
            pdl_engine_get_stats(e, &st);
            result = (int32_t)st.connections_dropped_malformed;
        }
        xwrite(fd, &result, sizeof(result));
    }
    for (int i = 0; i < 2; i++)
        pdl_engine_deregister_mem(e, m[i]);
    pdl_engine_destroy(e);
    if (dev != 0)
        test_drv()->api.MemFree(dev);
    free(user);
    _exit(0);
}

typedef struct peer {
    pid_t pid;
    int fd;
    pdl_engine_t *e;
    pdl_mem_t *local;
    uint8_t *rdesc[2];
    uint32_t rlen[2];
    pdl_session_t *s[2];
    uint16_t port; /* target's tcp port */
    CUdeviceptr ldev; /* _devmem: the local region (device memory), else 0 */
    uint8_t *mirror;  /* _devmem: the test's host copy of it */
} peer_t;

static void peer_start(peer_t *p, pdl_backend_kind_t backend)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        close(sv[0]);
        child_main(sv[1], backend);
    }
    close(sv[1]);
    p->fd = sv[0];
    pdl_engine_config_t cfg = {"initiator:tp0", "127.0.0.1", 0, backend, 2, 2, NULL, false, NULL, NULL};
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&cfg, &p->e, &err), PDL_OK);
    p->ldev = 0;
    p->mirror = NULL;
    if (devmem()) {
        p->ldev = dev_alloc();
        p->mirror = calloc(1, REGION);
        dev_put(p->ldev, p->mirror);
        assert_int_equal(pdl_engine_register_mem_type(p->e, (void *)(uintptr_t)p->ldev, REGION, PDL_MEM_TYPE_CUDA,
                                                      &p->local, &err),
                         PDL_OK);
    } else {
        assert_int_equal(pdl_engine_alloc_mem(p->e, REGION, &p->local, &err), PDL_OK);
    }
    uint8_t *ed = NULL;
    uint32_t elen = 0;
    assert_int_equal(recv_blob(p->fd, &ed, &elen), 0);
    assert_int_equal(recv_blob(p->fd, &p->rdesc[0], &p->rlen[0]), 0);
    assert_int_equal(recv_blob(p->fd, &p->rdesc[1], &p->rlen[1]), 0);
    char key[64];
    pdl_status_t st = pdl_engine_add_remote(p->e, ed, elen, key, sizeof(key), &err);
    if (st != PDL_OK)
        fail_msg("add_remote: %s", err.msg);
    assert_string_equal(key, "target:tp0");
    /* Idempotent for the same descriptor. */
    assert_int_equal(pdl_engine_add_remote(p->e, ed, elen, NULL, 0, &err), PDL_OK);
    pdl_remote_t rd;
    assert_int_equal(pdl__engine_desc_unpack(ed, elen, &rd, &err), PDL_OK);
    p->port = rd.port;
    free(ed);
    for (int r = 0; r < 2; r++) {
        st = pdl_session_open(p->e, p->local, p->rdesc[r], p->rlen[r], &p->s[r], &err);
        if (st != PDL_OK)
            fail_msg("session_open: %s", err.msg);
    }
}

static int32_t peer_cmd(peer_t *p, char op, int region, uint64_t seed, const pdl_desc_t *d, uint32_t n)
{
    cmd_t c = {op, (uint8_t)region, seed, n};
    assert_int_equal(xwrite(p->fd, &c, sizeof(c)), 0);
    if (n)
        assert_int_equal(xwrite(p->fd, d, n * sizeof(*d)), 0);
    int32_t r = -1;
    assert_int_equal(xread(p->fd, &r, sizeof(r)), 0);
    return r;
}

static void peer_stop(peer_t *p, bool kill_it)
{
    for (int r = 0; r < 2; r++)
        pdl_session_close(p->s[r]);
    if (kill_it) {
        kill(p->pid, SIGKILL);
    } else {
        cmd_t c = {'Q', 0, 0, 0};
        xwrite(p->fd, &c, sizeof(c));
    }
    int status = 0;
    assert_int_equal(waitpid(p->pid, &status, 0), p->pid);
    if (!kill_it)
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(p->fd);
    pdl_engine_deregister_mem(p->e, p->local);
    pdl_engine_destroy(p->e);
    if (p->ldev != 0)
        test_drv()->api.MemFree(p->ldev);
    free(p->mirror);
    free(p->rdesc[0]);
    free(p->rdesc[1]);
}

/* The local region's bytes as the test sees them: itself, or (_devmem) its mirror. Before a READ,
 * local_set writes the mirror to the device; after one, local_get reads the device into it. */
static uint8_t *local_bytes(peer_t *p) { return p->ldev ? p->mirror : pdl_mem_ptr(p->local); }
static void local_set(peer_t *p)
{
    if (p->ldev)
        dev_put(p->ldev, p->mirror);
}
static void local_get(peer_t *p)
{
    if (p->ldev)
        dev_get(p->mirror, p->ldev);
}

/* n random descriptors: distinct slots on both sides, random lengths and offsets inside a slot. */
static uint32_t random_descs(pdl_desc_t *d, uint32_t n, unsigned *rng)
{
    uint32_t ls[NSLOTS], rs[NSLOTS];
    for (uint32_t i = 0; i < NSLOTS; i++)
        ls[i] = rs[i] = i;
    for (uint32_t i = NSLOTS - 1; i > 0; i--) {
        uint32_t a = (uint32_t)rand_r(rng) % (i + 1), b = (uint32_t)rand_r(rng) % (i + 1), t;
        t = ls[i], ls[i] = ls[a], ls[a] = t;
        t = rs[i], rs[i] = rs[b], rs[b] = t;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = 1 + (uint64_t)rand_r(rng) % (rand_r(rng) % 4 == 0 ? SLOT : 4096);
        uint64_t lo = (uint64_t)rand_r(rng) % (SLOT - len + 1), ro = (uint64_t)rand_r(rng) % (SLOT - len + 1);
        d[i] = (pdl_desc_t){(uint64_t)ls[i] * SLOT + lo, (uint64_t)rs[i] * SLOT + ro, len};
    }
    return n;
}

static pdl_status_t run(pdl_session_t *s, pdl_op_t op, const pdl_desc_t *d, size_t n, int timeout_ms, pdl_error_t *err)
{
    pdl_batch_t *b = NULL;
    pdl_status_t st = pdl_session_post(s, op, d, n, &b, err);
    if (st != PDL_OK)
        return st;
    st = pdl_batch_wait(b, timeout_ms, err);
    pdl_batch_free(b);
    return st;
}

/* SIGSTOP and wait until every thread of the peer has really stopped (kill() only queues it). */
static void stop_peer(peer_t *p)
{
    int status = 0;
    kill(p->pid, SIGSTOP);
    assert_int_equal(waitpid(p->pid, &status, WUNTRACED), p->pid);
    assert_true(WIFSTOPPED(status));
}

/* ---------------------------------------------------------------- tests */

/* The UCX transports the ucx engines of the next test use (read by ucp_config_read at engine create;
 * set before the target is forked). */
static void ucx_tls(const char *tls)
{
    assert_int_equal(setenv("UCX_TLS", tls, 1), 0);
}

static void random_batches(pdl_backend_kind_t backend)
{
    peer_t p;
    peer_start(&p, backend);
    unsigned rng = 12345;
    pdl_desc_t d[NSLOTS];
    uint8_t *local = local_bytes(&p);
    for (int iter = 0; iter < 24; iter++) {
        int region = iter % 2;
        uint64_t seed = 1000 + (uint64_t)iter;
        uint32_t n = 1 + (uint32_t)rand_r(&rng) % NSLOTS;
        random_descs(d, n, &rng);
        pdl_error_t err;
        if (iter % 4 < 2) { /* READ: the target fills, we verify */
            assert_int_equal(peer_cmd(&p, 'F', region, seed, NULL, 0), 0);
            memset(local, 0, REGION);
            local_set(&p);
            pdl_status_t st = run(p.s[region], PDL_OP_READ, d, n, -1, &err);
            if (st != PDL_OK)
                fail_msg("read: %s", err.msg);
            local_get(&p);
            for (uint32_t i = 0; i < n; i++)
                for (uint64_t j = 0; j < d[i].len; j++)
                    if (local[d[i].local_off + j] != tp_byte(seed, d[i].remote_off + j))
                        fail_msg("%s read: desc %u byte %llu differs", pdl_backend_name(backend), i,
                                 (unsigned long long)j);
        } else { /* WRITE: we fill, the target verifies */
            fill(local, REGION, seed);
            local_set(&p);
            pdl_status_t st = run(p.s[region], PDL_OP_WRITE, d, n, -1, &err);
            if (st != PDL_OK)
                fail_msg("write: %s", err.msg);
            assert_int_equal(peer_cmd(&p, 'V', region, seed, d, n), 0);
        }
    }
    /* One large batch that the engine splits over its workers / connections. */
    pdl_desc_t big = {0, 0, REGION};
    assert_int_equal(peer_cmd(&p, 'F', 0, 77, NULL, 0), 0);
    pdl_error_t err;
    assert_int_equal(run(p.s[0], PDL_OP_READ, &big, 1, -1, &err), PDL_OK);
    local_get(&p);
    for (size_t j = 0; j < REGION; j += 4093)
        assert_int_equal(local[j], tp_byte(77, j));
    pdl_engine_stats_t st;
    pdl_engine_get_stats(p.e, &st);
    assert_int_equal(st.batches_failed, 0);
    assert_true(st.batches_ok >= 25);
    assert_true(st.bytes_read > REGION);
    peer_stop(&p, false);
}

static void test_random_shm(void **state)
{
    (void)state;
    random_batches(PDL_BACKEND_SHM);
}
static void test_random_tcp(void **state)
{
    (void)state;
    random_batches(PDL_BACKEND_TCP);
}
/* Device memory on the initiator's side, and on the target's for region 1 (the header says how). */
static void test_random_tcp_devmem(void **state)
{
    (void)state;
    assert_int_equal(setenv("PDLINK_TEST_CUDA_FAKE", "1", 1), 0);
    random_batches(PDL_BACKEND_TCP);
    unsetenv("PDLINK_TEST_CUDA_FAKE");
}
static void test_random_ucx_tcp(void **state)
{
    (void)state;
    ucx_tls("tcp");
    random_batches(PDL_BACKEND_UCX);
}
static void test_random_ucx_sm(void **state)
{
    (void)state;
    ucx_tls("sm");
    random_batches(PDL_BACKEND_UCX);
}

/*
 * The peer dies while a batch is in flight: stopped first, so a batch that needs the owner (tcp, UCX's
 * tcp, UCX's software RMA) is surely in flight when SIGKILL comes, and then left unreaped, a zombie, as
 * long as the test runs (a dead process UCX's keepalive still takes for alive). A two-sided transfer
 * fails with PEER_GONE. A one-sided one (shm, UCX's shared memory) may complete from the mapping the
 * owner leaves, as it may before the kill; the batches after it fail once the death is seen.
 */
static void peer_killed(pdl_backend_kind_t backend, bool one_sided)
{
    peer_t p;
    peer_start(&p, backend);
    pdl_desc_t big = {0, 0, REGION};
    pdl_error_t err;
    pdl_batch_t *b = NULL;
    stop_peer(&p);
    assert_int_equal(pdl_session_post(p.s[0], PDL_OP_READ, &big, 1, &b, &err), PDL_OK);
    kill(p.pid, SIGKILL);
    pdl_status_t st = pdl_batch_wait(b, -1, &err);
    pdl_batch_free(b);
    if (one_sided) {
        if (st != PDL_OK && st != PDL_ERR_PEER_GONE)
            fail_msg("the batch in flight at the kill: status %d: %s", (int)st, err.msg);
        /* Until the death is seen (shm polls its pidfd every ms; ucx's progress thread is woken by
         * it); the bound only turns a hang into a failure. */
        for (int i = 0; i < 30000 && st == PDL_OK; i++) {
            st = run(p.s[i % 2], PDL_OP_READ, &big, 1, -1, &err);
            if (st == PDL_OK)
                usleep(1000);
        }
    }
    if (st != PDL_ERR_PEER_GONE)
        fail_msg("after the kill: status %d: %s", (int)st, err.msg);
    assert_non_null(strstr(err.msg, "peer gone"));
    /* Sticky, on both regions' sessions (at post, or at wait where the backend checks when it runs). */
    assert_int_equal(run(p.s[0], PDL_OP_READ, &big, 1, -1, &err), PDL_ERR_PEER_GONE);
    assert_int_equal(run(p.s[1], PDL_OP_READ, &big, 1, -1, &err), PDL_ERR_PEER_GONE);
    peer_stop(&p, true);
}

static void test_killed_shm(void **state)
{
    (void)state;
    peer_killed(PDL_BACKEND_SHM, true);
}
static void test_killed_tcp(void **state)
{
    (void)state;
    peer_killed(PDL_BACKEND_TCP, false);
}

static void test_killed_ucx(void **state)
{
    (void)state;
    ucx_tls("tcp");
    peer_killed(PDL_BACKEND_UCX, false);
}
/* Over UCX's shared memory: UCX maps the owner's region (a chunk is a copy through it) or, when it
 * does not, emulates the get with messages the owner's worker answers; the engine's watch of the
 * owner's pidfd is what ends both. */
static void test_killed_ucx_sm(void **state)
{
    (void)state;
    ucx_tls("sm");
    peer_killed(PDL_BACKEND_UCX, true);
}

/* A stopped owner: wait with a short timeout reports PDL_INPROGRESS, and freeing does not hang. */
static void stalled(pdl_backend_kind_t backend)
{
    peer_t p;
    peer_start(&p, backend);
    stop_peer(&p);
    pdl_desc_t big = {0, 0, REGION};
    pdl_error_t err;
    pdl_batch_t *b = NULL;
    assert_int_equal(pdl_session_post(p.s[1], PDL_OP_READ, &big, 1, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, 100, &err), PDL_INPROGRESS);
    assert_non_null(strstr(err.msg, "still running"));
    assert_int_equal(pdl_batch_poll(b, &err), PDL_INPROGRESS);
    /* A second batch queued behind the stalled one on the same connection times out too. */
    pdl_batch_t *b2 = NULL;
    pdl_desc_t small = {0, 0, 4096};
    assert_int_equal(pdl_session_post(p.s[1], PDL_OP_READ, &small, 1, &b2, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b2, 20, &err), PDL_INPROGRESS);
    pdl_batch_free(b); /* aborts the stalled batch (and the session) */
    assert_int_equal(pdl_batch_wait(b2, -1, &err), PDL_ERR_BAD_STATE);
    pdl_batch_free(b2);
    kill(p.pid, SIGCONT);
    peer_stop(&p, true);
}

static void test_stalled_tcp(void **state)
{
    (void)state;
    stalled(PDL_BACKEND_TCP);
}
static void test_stalled_ucx(void **state)
{
    (void)state;
    ucx_tls("tcp");
    stalled(PDL_BACKEND_UCX);
}

/* After the owner deregisters a region, batches naming it fail and nothing is served. */
static void deregistered(pdl_backend_kind_t backend)
{
    peer_t p;
    peer_start(&p, backend);
    pdl_desc_t d = {0, 4096, 8192};
    pdl_error_t err;
    assert_int_equal(run(p.s[0], PDL_OP_READ, &d, 1, -1, &err), PDL_OK);
    assert_int_equal(peer_cmd(&p, 'D', 0, 0, NULL, 0), 0);
    assert_int_equal(run(p.s[0], PDL_OP_READ, &d, 1, -1, &err), PDL_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "region"));
    assert_int_equal(run(p.s[0], PDL_OP_WRITE, &d, 1, -1, &err), PDL_ERR_NOT_FOUND);
    /* The other region still works. */
    assert_int_equal(run(p.s[1], PDL_OP_READ, &d, 1, -1, &err), PDL_OK);
    peer_stop(&p, false);
}

static void test_dereg_shm(void **state)
{
    (void)state;
    deregistered(PDL_BACKEND_SHM);
}
static void test_dereg_tcp(void **state)
{
    (void)state;
    deregistered(PDL_BACKEND_TCP);
}
static void test_dereg_ucx(void **state)
{
    (void)state;
    ucx_tls("tcp");
    deregistered(PDL_BACKEND_UCX);
}
/* Over UCX's shared memory the deregistration is seen through the mapped live table. */
static void test_dereg_ucx_sm(void **state)
{
    (void)state;
    ucx_tls("sm");
    deregistered(PDL_BACKEND_UCX);
}

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* true if the server closed the connection (EOF or reset) within 10 s */
static bool closed_by_server(int fd)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 10000) != 1)
        return false;
    char buf[256];
    ssize_t r = recv(fd, buf, sizeof(buf), 0);
    return r == 0 || (r < 0 && errno == ECONNRESET);
}

/* Hostile bytes close that connection only; the engine keeps serving a good client. */
static void test_malformed_tcp(void **state)
{
    (void)state;
    peer_t p;
    peer_start(&p, PDL_BACKEND_TCP);
    uint16_t port = p.port;

    /* 1: bad magic */
    int fd = raw_connect(port);
    uint8_t junk[40];
    memset(junk, 0xAB, sizeof(junk));
    assert_int_equal(send(fd, junk, sizeof(junk), 0), (ssize_t)sizeof(junk));
    assert_true(closed_by_server(fd));
    close(fd);
    /* 2: huge length with a valid magic/version */
    fd = raw_connect(port);
    uint8_t hdr[40] = {'P', 'D', 'L', 'D', 1, 0, 1, 0, /* nseg */ 1, 0, 0, 0, 0, 0, 0, 0};
    hdr[16] = 1;   /* reg id 1 */
    hdr[31] = 0x7f; /* total_len ~ 2^62 */
    assert_int_equal(send(fd, hdr, sizeof(hdr), 0), (ssize_t)sizeof(hdr));
    assert_true(closed_by_server(fd));
    close(fd);
    /* 3: truncated header, then EOF */
    fd = raw_connect(port);
    assert_int_equal(send(fd, hdr, 10, 0), 10);
    shutdown(fd, SHUT_WR);
    assert_true(closed_by_server(fd));
    close(fd);

    /* The engine still serves the good client. */
    assert_int_equal(peer_cmd(&p, 'F', 1, 5, NULL, 0), 0);
    pdl_desc_t d = {0, 0, 65536};
    pdl_error_t err;
    assert_int_equal(run(p.s[1], PDL_OP_READ, &d, 1, -1, &err), PDL_OK);
    const uint8_t *local = pdl_mem_ptr(p.local);
    for (size_t j = 0; j < 65536; j++)
        assert_int_equal(local[j], tp_byte(5, j));
    assert_int_equal(peer_cmd(&p, 'S', 0, 0, NULL, 0), 3);
    peer_stop(&p, false);
}


/* Random READs into disjoint 64 KiB local slots: descriptor i of batch k reads remote slot rs into
 * local slot k (one descriptor per batch, random length/offset inside the slot). */
static void slot_desc(pdl_desc_t *d, uint32_t k, unsigned *rng)
{
    uint64_t len = 1 + (uint64_t)rand_r(rng) % SLOT;
    uint64_t off = (uint64_t)rand_r(rng) % (SLOT - len + 1);
    uint32_t rs = (uint32_t)rand_r(rng) % NSLOTS;
    *d = (pdl_desc_t){(uint64_t)k * SLOT + off, (uint64_t)rs * SLOT + off, len};
}

static void check_read(const uint8_t *local, const pdl_desc_t *d, uint64_t seed)
{
    for (uint64_t j = 0; j < d->len; j++)
        if (local[d->local_off + j] != tp_byte(seed, d->remote_off + j))
            fail_msg("read [%llu, +%llu): byte %llu differs", (unsigned long long)d->remote_off,
                     (unsigned long long)d->len, (unsigned long long)j);
}

/* Many batches in flight on one session (requests pipelined on its connections), waited in reverse
 * order, then the same with WRITEs; every byte checked. */
static void pipelined(pdl_backend_kind_t backend)
{
    peer_t p;
    peer_start(&p, backend);
    enum { NB = NSLOTS };
    pdl_desc_t d[NB];
    pdl_batch_t *b[NB];
    pdl_error_t err;
    unsigned rng = 99;
    uint8_t *local = pdl_mem_ptr(p.local);
    assert_int_equal(peer_cmd(&p, 'F', 1, 41, NULL, 0), 0);
    memset(local, 0, REGION);
    for (uint32_t k = 0; k < NB; k++) {
        slot_desc(&d[k], k, &rng);
        assert_int_equal(pdl_session_post(p.s[1], PDL_OP_READ, &d[k], 1, &b[k], &err), PDL_OK);
    }
    for (int k = NB - 1; k >= 0; k--) {
        pdl_status_t st = pdl_batch_wait(b[k], -1, &err);
        if (st != PDL_OK)
            fail_msg("pipelined read %d: %s", k, err.msg);
        pdl_batch_free(b[k]);
    }
    for (uint32_t k = 0; k < NB; k++)
        check_read(local, &d[k], 41);

    /* WRITEs: local slot k to remote slot k (disjoint), posted together, waited in reverse order. */
    fill(local, REGION, 42);
    for (uint32_t k = 0; k < NB; k++) {
        uint64_t len = 1 + (uint64_t)rand_r(&rng) % SLOT;
        d[k] = (pdl_desc_t){(uint64_t)k * SLOT, (uint64_t)k * SLOT, len};
        assert_int_equal(pdl_session_post(p.s[0], PDL_OP_WRITE, &d[k], 1, &b[k], &err), PDL_OK);
    }
    for (int k = NB - 1; k >= 0; k--) {
        pdl_status_t st = pdl_batch_wait(b[k], -1, &err);
        if (st != PDL_OK)
            fail_msg("pipelined write %d: %s", k, err.msg);
        pdl_batch_free(b[k]);
    }
    assert_int_equal(peer_cmd(&p, 'V', 0, 42, d, NB), 0);

    /* Progress by polling only (no wait): a whole-region READ, striped over both connections. */
    assert_int_equal(peer_cmd(&p, 'F', 0, 43, NULL, 0), 0);
    pdl_desc_t big = {0, 0, REGION};
    pdl_batch_t *pb = NULL;
    assert_int_equal(pdl_session_post(p.s[0], PDL_OP_READ, &big, 1, &pb, &err), PDL_OK);
    pdl_status_t st = PDL_INPROGRESS;
    for (long i = 0; i < 100000000L && st == PDL_INPROGRESS; i++)
        st = pdl_batch_poll(pb, &err);
    assert_int_equal(st, PDL_OK);
    pdl_batch_free(pb);
    check_read(local, &big, 43);
    pdl_engine_stats_t es;
    pdl_engine_get_stats(p.e, &es);
    assert_int_equal(es.batches_failed, 0);
    assert_int_equal(es.batches_ok, 2 * NB + 1);
    peer_stop(&p, false);
}

static void test_pipelined_tcp(void **state)
{
    (void)state;
    pipelined(PDL_BACKEND_TCP);
}
static void test_pipelined_ucx(void **state)
{
    (void)state;
    ucx_tls("tcp");
    pipelined(PDL_BACKEND_UCX);
}

typedef struct reader_arg {
    pdl_session_t *s;
    uint8_t *local;
    uint32_t first; /* local slots [first, first + 8) are this thread's */
    unsigned seed;
    int failures;
} reader_arg_t;

static void *reader_main(void *arg)
{
    reader_arg_t *a = arg;
    unsigned rng = a->seed;
    for (int it = 0; it < 40; it++) {
        pdl_desc_t d[4];
        pdl_batch_t *b[4];
        pdl_error_t err;
        int n = 1 + it % 4;
        for (int k = 0; k < n; k++) {
            slot_desc(&d[k], a->first + (uint32_t)k, &rng);
            if (pdl_session_post(a->s, PDL_OP_READ, &d[k], 1, &b[k], &err) != PDL_OK) {
                a->failures++;
                return NULL;
            }
        }
        for (int k = 0; k < n; k++) {
            if (pdl_batch_wait(b[k], -1, &err) != PDL_OK)
                a->failures++;
            pdl_batch_free(b[k]);
            for (uint64_t j = 0; j < d[k].len; j++)
                if (a->local[d[k].local_off + j] != tp_byte(51, d[k].remote_off + j)) {
                    a->failures++;
                    break;
                }
        }
    }
    return NULL;
}

/* Four threads post and wait on the same session at once: every batch completes with its own bytes. */
static void shared_session(pdl_backend_kind_t backend)
{
    peer_t p;
    peer_start(&p, backend);
    assert_int_equal(peer_cmd(&p, 'F', 0, 51, NULL, 0), 0);
    pthread_t t[4];
    reader_arg_t a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (reader_arg_t){p.s[0], pdl_mem_ptr(p.local), (uint32_t)i * 8, 1000u + (unsigned)i, 0};
        assert_int_equal(pthread_create(&t[i], NULL, reader_main, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(a[i].failures, 0);
    }
    peer_stop(&p, false);
}

static void test_shared_session_tcp(void **state)
{
    (void)state;
    shared_session(PDL_BACKEND_TCP);
}
static void test_shared_session_ucx(void **state)
{
    (void)state;
    ucx_tls("tcp");
    shared_session(PDL_BACKEND_UCX);
}

int main(void)
{
    pdl_log_set_level(PDL_LOG_ERROR);
    signal(SIGPIPE, SIG_IGN);
    if (getenv("PDL_TEST_FILTER") != NULL) /* e.g. PDL_TEST_FILTER='*ucx*' to run one backend's tests */
        cmocka_set_test_filter(getenv("PDL_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_shm),  cmocka_unit_test(test_random_tcp),  cmocka_unit_test(test_random_tcp_devmem),  cmocka_unit_test(test_killed_shm),
        cmocka_unit_test(test_killed_tcp),  cmocka_unit_test(test_stalled_tcp), cmocka_unit_test(test_dereg_shm),
        cmocka_unit_test(test_dereg_tcp),   cmocka_unit_test(test_malformed_tcp), cmocka_unit_test(test_pipelined_tcp),
        cmocka_unit_test(test_shared_session_tcp), cmocka_unit_test(test_random_ucx_tcp),
        cmocka_unit_test(test_random_ucx_sm), cmocka_unit_test(test_killed_ucx), cmocka_unit_test(test_stalled_ucx),
        cmocka_unit_test(test_dereg_ucx), cmocka_unit_test(test_pipelined_ucx), cmocka_unit_test(test_shared_session_ucx),
        cmocka_unit_test(test_killed_ucx_sm), cmocka_unit_test(test_dereg_ucx_sm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
