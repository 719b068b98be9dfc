/*
 * test_engine_backends.c -- the engine between two processes, one body per behaviour (a case), run for
 * every backend configuration (a variant) from one table, UCX-style: random READ/WRITE batches verified
 * byte by byte, a killed peer, a stalled peer, a deregistered remote region, hostile bytes on the data
 * socket, many batches in flight on one session (waited out of order, by polling only) and four threads
 * on one session. A case that does not apply to a variant is left out in the table with the reason; the
 * test list is made from the table, so nothing is skipped at run time.
 *
 * ucx runs over the transports this machine has (no RDMA device): UCX's tcp (UCX_TLS=tcp, which is
 * also the one where the owner must answer, so a stopped owner stalls a batch) and its shared-memory
 * transports (UCX_TLS=sm: posix/sysv/cma, one-sided without the owner where UCX maps the owner's
 * region). The variable is set before the target is forked, so both engines see the same one.
 *
 * Device memory (tcp_devmem and cuda): PDLINK_TEST_CUDA_FAKE=1 gives both processes the test CUDA
 * driver (src/engine/cudadrv_fake.c), whose "device memory" is PROT_NONE, so any CPU access by pdlink
 * dies; the test reaches its bytes only through that driver. tcp_devmem: the target's region 1 and the
 * initiator's local region are device memory (tcp's staged path, docs/engine.md). cuda: every region
 * is (the backend registers nothing else), and the initiator opens the target's regions by their IPC
 * handles, which the test driver serves from the target's memory.
 *
 * Each test forks the target before creating any thread (fork in a threaded process is unsafe, and
 * TSan refuses it). Parent and child talk over a socketpair: the child sends its engine descriptor and
 * two memory descriptors (region 0: pdlink-allocated memfd memory; region 1: caller-registered
 * memory), then serves commands: fill a region with a pattern, verify ranges, deregister, quit.
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

/* A backend configuration the cases run on. */
typedef struct variant {
    const char *name;
    pdl_backend_kind_t kind;
    const char *ucx_tls; /* UCX_TLS for both processes, or NULL */
    bool devmem;         /* device memory through the test driver (the header says which regions) */
    bool one_sided;      /* a copy needs nothing of the owner: a killed owner's mapping may still serve one */
} variant_t;

/* Region r of the target is device memory (region 0 only where the backend registers nothing else). */
static bool target_dev(const variant_t *v, int r) { return v->devmem && (r == 1 || v->kind == PDL_BACKEND_CUDA); }

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

/* Host bytes to / from device memory, through the test driver: the whole region, or [off, +len). */
static void dev_put(CUdeviceptr d, const void *h)
{
    if (test_drv()->api.MemcpyHtoDAsync(d, h, REGION, NULL) != CUDA_SUCCESS)
        abort();
}

static void dev_get_range(uint8_t *h, CUdeviceptr d, uint64_t off, uint64_t len)
{
    if (test_drv()->api.MemcpyDtoHAsync(h + off, d + off, len, NULL) != CUDA_SUCCESS)
        abort();
}

static void dev_get(void *h, CUdeviceptr d) { dev_get_range(h, d, 0, REGION); }

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

/* Target region r: device memory (a PROT_NONE test-driver allocation, mirrored in host memory for fill and
 * verify), or host memory (region 0 pdlink's memfd, region 1 the caller's). */
static pdl_mem_t *child_region(pdl_engine_t *e, const variant_t *v, int r, CUdeviceptr *dev, uint8_t *host)
{
    pdl_mem_t *m = NULL;
    pdl_error_t err;
    pdl_status_t st;
    *dev = target_dev(v, r) ? dev_alloc() : 0;
    if (*dev != 0) {
        dev_put(*dev, host);
        st = pdl_engine_register_mem_type(e, (void *)(uintptr_t)*dev, REGION, PDL_MEM_TYPE_CUDA, &m, &err);
    } else {
        st = r == 0 ? pdl_engine_alloc_mem(e, REGION, &m, &err) : pdl_engine_register_mem(e, host, REGION, &m, &err);
    }
    if (st != PDL_OK) {
        fprintf(stderr, "child: region %d: %s\n", r, err.msg);
        _exit(4);
    }
    return m;
}

static void child_main(int fd, const variant_t *v)
{
    pdl_engine_config_t cfg = {"target:tp0", "127.0.0.1", 0, v->kind, 2, 2, NULL, false, NULL, NULL};
    pdl_engine_t *e = NULL;
    pdl_error_t err;
    if (pdl_engine_create(&cfg, &e, &err) != PDL_OK) {
        fprintf(stderr, "child: %s\n", err.msg);
        _exit(3);
    }
    pdl_mem_t *m[2];
    CUdeviceptr dev[2];
    /* host[r]: region 1's memory when it is the caller's, else the mirror of a device region. */
    uint8_t *host[2];
    for (int r = 0; r < 2; r++) {
        host[r] = aligned_alloc(4096, REGION);
        memset(host[r], 0, REGION);
        m[r] = child_region(e, v, r, &dev[r], host[r]);
    }
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
        CUdeviceptr d_r = dev[c.region];
        uint8_t *bytes = d_r != 0 || c.region == 1 ? host[c.region] : pdl_mem_ptr(m[c.region]);
        if (c.op == 'F') {
            fill(bytes, REGION, c.seed);
            if (d_r != 0)
                dev_put(d_r, bytes);
        } else if (c.op == 'V') {
            pdl_desc_t *d = malloc(c.ndesc * sizeof(*d));
            xread(fd, d, c.ndesc * sizeof(*d));
            if (d_r != 0)
                dev_get(bytes, d_r);
            for (uint32_t i = 0; i < c.ndesc && result == 0; i++)
                for (uint64_t j = 0; j < d[i].len; j++)
                    if (bytes[d[i].remote_off + j] != tp_byte(c.seed, d[i].local_off + j)) {
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
    for (int r = 0; r < 2; r++) {
        pdl_engine_deregister_mem(e, m[r]);
        if (dev[r] != 0)
            test_drv()->api.MemFree(dev[r]);
    }
    pdl_engine_destroy(e);
    free(host[0]);
    free(host[1]);
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

static void peer_start(peer_t *p, const variant_t *v)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        close(sv[0]);
        child_main(sv[1], v);
    }
    close(sv[1]);
    p->fd = sv[0];
    pdl_engine_config_t cfg = {"initiator:tp0", "127.0.0.1", 0, v->kind, 2, 2, NULL, false, NULL, NULL};
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&cfg, &p->e, &err), PDL_OK);
    p->ldev = 0;
    p->mirror = NULL;
    if (v->devmem) {
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
/* local_get of the bytes of one descriptor (threads reading disjoint slots). */
static void local_get_desc(peer_t *p, const pdl_desc_t *d)
{
    if (p->ldev)
        dev_get_range(p->mirror, p->ldev, d->local_off, d->len);
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

/* ---------------------------------------------------------------- cases */

/* Random READ and WRITE batches on both regions, every byte checked, then one whole-region READ that the
 * engine splits over its workers or connections. */
static void case_random(const variant_t *v)
{
    peer_t p;
    peer_start(&p, v);
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
                        fail_msg("%s read: desc %u byte %llu differs", v->name, i,
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

/*
 * The peer dies while a batch is in flight: stopped first, so a batch that needs the owner (tcp, UCX's
 * tcp, UCX's software RMA) is surely in flight when SIGKILL comes, and then left unreaped, a zombie, as
 * long as the test runs (a dead process UCX's keepalive still takes for alive). A two-sided transfer
 * fails with PEER_GONE. A one-sided one (shm, UCX's shared memory) may complete from the mapping the
 * owner leaves, as it may before the kill; the batches after it fail once the death is seen.
 */
static void case_killed(const variant_t *v)
{
    peer_t p;
    peer_start(&p, v);
    pdl_desc_t big = {0, 0, REGION};
    pdl_error_t err;
    pdl_batch_t *b = NULL;
    stop_peer(&p);
    assert_int_equal(pdl_session_post(p.s[0], PDL_OP_READ, &big, 1, &b, &err), PDL_OK);
    kill(p.pid, SIGKILL);
    pdl_status_t st = pdl_batch_wait(b, -1, &err);
    pdl_batch_free(b);
    if (v->one_sided) {
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

/* A stopped owner: wait with a short timeout reports PDL_INPROGRESS, and freeing does not hang. */
static void case_stalled(const variant_t *v)
{
    peer_t p;
    peer_start(&p, v);
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

/* After the owner deregisters a region, batches naming it fail and nothing is served. */
static void case_dereg(const variant_t *v)
{
    peer_t p;
    peer_start(&p, v);
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
static void case_malformed(const variant_t *v)
{
    peer_t p;
    peer_start(&p, v);
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
static void case_pipelined(const variant_t *v)
{
    peer_t p;
    peer_start(&p, v);
    enum { NB = NSLOTS };
    pdl_desc_t d[NB];
    pdl_batch_t *b[NB];
    pdl_error_t err;
    unsigned rng = 99;
    uint8_t *local = local_bytes(&p);
    assert_int_equal(peer_cmd(&p, 'F', 1, 41, NULL, 0), 0);
    memset(local, 0, REGION);
    local_set(&p);
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
    local_get(&p);
    for (uint32_t k = 0; k < NB; k++)
        check_read(local, &d[k], 41);

    /* WRITEs: local slot k to remote slot k (disjoint), posted together, waited in reverse order. */
    fill(local, REGION, 42);
    local_set(&p);
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
    local_get(&p);
    check_read(local, &big, 43);
    pdl_engine_stats_t es;
    pdl_engine_get_stats(p.e, &es);
    assert_int_equal(es.batches_failed, 0);
    assert_int_equal(es.batches_ok, 2 * NB + 1);
    peer_stop(&p, false);
}

typedef struct reader_arg {
    peer_t *p;
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
            local_get_desc(a->p, &d[k]);
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
static void case_shared_session(const variant_t *v)
{
    peer_t p;
    peer_start(&p, v);
    assert_int_equal(peer_cmd(&p, 'F', 0, 51, NULL, 0), 0);
    pthread_t t[4];
    reader_arg_t a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (reader_arg_t){&p, p.s[0], local_bytes(&p), (uint32_t)i * 8, 1000u + (unsigned)i, 0};
        assert_int_equal(pthread_create(&t[i], NULL, reader_main, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(a[i].failures, 0);
    }
    peer_stop(&p, false);
}

/* ---------------------------------------------------------------- the table */

enum { V_SHM, V_TCP, V_TCP_DEVMEM, V_UCX_TCP, V_UCX_SM, V_CUDA, NVARIANTS };

static const variant_t variants[NVARIANTS] = {
    [V_SHM] = {"shm", PDL_BACKEND_SHM, NULL, false, true},
    [V_TCP] = {"tcp", PDL_BACKEND_TCP, NULL, false, false},
    [V_TCP_DEVMEM] = {"tcp_devmem", PDL_BACKEND_TCP, NULL, true, false},
    [V_UCX_TCP] = {"ucx_tcp", PDL_BACKEND_UCX, "tcp", false, false},
    /* UCX maps the owner's region (a chunk is a copy through it) or, where it does not, emulates the get
     * with messages the owner's worker answers; the engine's watch of the owner's pidfd ends both when the
     * owner dies, and a deregistration is seen through the mapped live table. */
    [V_UCX_SM] = {"ucx_sm", PDL_BACKEND_UCX, "sm", false, true},
    [V_CUDA] = {"cuda", PDL_BACKEND_CUDA, NULL, true, true},
};

typedef struct conf_case {
    const char *name;
    void (*run)(const variant_t *v);
    const char *skip[NVARIANTS]; /* why the case does not apply to a variant; NULL: it runs */
} conf_case_t;

#define ONE_SIDED "one-sided: the copy reaches the owner's memory without the owner, so a stopped owner stalls nothing"
#define NO_SOCKET "tcp's data socket only: this backend has no socket of pdlink's that a stranger can write to"

static const conf_case_t cases[] = {
    {"random", case_random, {0}},
    {"killed", case_killed, {
        [V_CUDA] = "the test driver reads a killed owner's memory through /proc/<pid>/mem, which fails (a driver "
                   "error, PDL_ERR_TRANSPORT) between the teardown of the owner's memory and its exit becoming "
                   "visible to the pidfd check, so PEER_GONE cannot be asserted here; the owner-death check cuda "
                   "shares with shm (pdl__shm_session_check) runs in killed_shm",
    }},
    {"stalled", case_stalled, {[V_SHM] = ONE_SIDED, [V_UCX_SM] = ONE_SIDED, [V_CUDA] = ONE_SIDED}},
    {"dereg", case_dereg, {0}},
    {"malformed", case_malformed, {
        [V_SHM] = NO_SOCKET, [V_UCX_TCP] = NO_SOCKET " (UCX owns its sockets)", [V_UCX_SM] = NO_SOCKET,
        [V_CUDA] = NO_SOCKET,
        [V_TCP_DEVMEM] = "the same server as tcp: a frame is refused before the memory it names is looked at",
    }},
    {"pipelined", case_pipelined, {0}},
    {"shared_session", case_shared_session, {0}},
};

#define NCASES (sizeof(cases) / sizeof(cases[0]))

typedef struct cell {
    const conf_case_t *c;
    const variant_t *v;
    char name[64];
} cell_t;

/* One case on one variant: its environment is set before the target is forked and cleared after. */
static void run_cell(void **state)
{
    const cell_t *cell = *state;
    const variant_t *v = cell->v;
    if (v->ucx_tls != NULL)
        assert_int_equal(setenv("UCX_TLS", v->ucx_tls, 1), 0);
    if (v->devmem)
        assert_int_equal(setenv("PDLINK_TEST_CUDA_FAKE", "1", 1), 0);
    cell->c->run(v);
    unsetenv("UCX_TLS");
    unsetenv("PDLINK_TEST_CUDA_FAKE");
}

int main(void)
{
    pdl_log_set_level(PDL_LOG_ERROR);
    signal(SIGPIPE, SIG_IGN);
    if (getenv("PDL_TEST_FILTER") != NULL) /* e.g. PDL_TEST_FILTER='*ucx*' to run one backend's tests */
        cmocka_set_test_filter(getenv("PDL_TEST_FILTER"));
    static cell_t cells[NCASES * NVARIANTS];
    static struct CMUnitTest tests[NCASES * NVARIANTS];
    size_t n = 0;
    for (size_t v = 0; v < NVARIANTS; v++)
        for (size_t c = 0; c < NCASES; c++) {
            if (cases[c].skip[v] != NULL) {
                printf("[ NOT RUN  ] test_%s_%s: %s\n", cases[c].name, variants[v].name, cases[c].skip[v]);
                continue;
            }
            cells[n] = (cell_t){&cases[c], &variants[v], ""};
            snprintf(cells[n].name, sizeof(cells[n].name), "test_%s_%s", cases[c].name, variants[v].name);
            tests[n] = (struct CMUnitTest){cells[n].name, run_cell, NULL, NULL, &cells[n]};
            n++;
        }
    return _cmocka_run_group_tests("engine_backends", tests, n, NULL, NULL);
}
