/*
 * test_engine_checks.c -- registration checks on both sides (every out-of-range variant refused,
 * unknown and deregistered ids), descriptor merging and batch status transitions. The owner's checks
 * are driven with hand-made frames on a raw socket, so they are tested without the initiator's own
 * checks in front of them.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/grant.h"
#include "engine/tcp_wire.h"
#include "tcp_raw_testutil.h"
#include "test_listen.h"
#include "pdlink/engine.h"
#include "common/log.h"

#define SZ 65536

typedef struct pair {
    pdl_engine_t *owner, *init;
    pdl_mem_t *om, *im;
    pdl_session_t *s;
} pair_t;

static void pair_open(pair_t *p, pdl_backend_kind_t b)
{
    pdl_engine_config_t oc = {"producer:tp1", "127.0.0.1", 0, b, 1, 1, NULL, false, NULL, NULL};
    pdl_engine_config_t ic = {"consumer:tp0", "127.0.0.1", 0, b, 2, 2, NULL, false, NULL, NULL};
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&oc, &p->owner, &err), PDL_OK);
    assert_int_equal(pdl_engine_create(&ic, &p->init, &err), PDL_OK);
    assert_int_equal(pdl_engine_alloc_mem(p->owner, SZ, &p->om, &err), PDL_OK);
    assert_int_equal(pdl_engine_alloc_mem(p->init, SZ, &p->im, &err), PDL_OK);
    pdl_bytes_t ed, md;
    assert_int_equal(pdl_engine_pack(p->owner, &ed, &err), PDL_OK);
    assert_int_equal(pdl_mem_pack(p->om, &md, &err), PDL_OK);
    assert_int_equal(pdl_engine_add_remote(p->init, ed.data, ed.len, NULL, 0, &err), PDL_OK);
    pdl_status_t st = pdl_session_open(p->init, p->im, md.data, md.len, &p->s, &err);
    if (st != PDL_OK)
        fail_msg("%s", err.msg);
    pdl_bytes_free(&ed);
    pdl_bytes_free(&md);
}

/* Byte i of the owner's region becomes (uint8_t)(i * 7), so what a test reads back says where it came
 * from; returns the region. */
static uint8_t *fill_owner(pair_t *p)
{
    uint8_t *om = pdl_mem_ptr(p->om);
    for (size_t i = 0; i < SZ; i++)
        om[i] = (uint8_t)(i * 7);
    return om;
}

static void pair_close(pair_t *p)
{
    pdl_session_close(p->s);
    pdl_engine_deregister_mem(p->init, p->im);
    if (p->om)
        pdl_engine_deregister_mem(p->owner, p->om);
    pdl_engine_destroy(p->init);
    pdl_engine_destroy(p->owner);
}

/* `fmt` with its "%ID" (if any) replaced by the registration id: ids are random (engine.h). */
static void with_id(char *out, size_t cap, const char *fmt, uint64_t id)
{
    const char *at = strstr(fmt, "%ID");
    if (at == NULL)
        snprintf(out, cap, "%s", fmt);
    else
        snprintf(out, cap, "%.*s%" PRIu64 "%s", (int)(at - fmt), fmt, id, at + 3);
}

static pdl_status_t run1(pdl_session_t *s, pdl_op_t op, uint64_t lo, uint64_t ro, uint64_t len, pdl_error_t *err)
{
    pdl_desc_t d = {lo, ro, len};
    pdl_batch_t *b = NULL;
    pdl_status_t st = pdl_session_post(s, op, &d, 1, &b, err);
    if (st != PDL_OK)
        return st;
    st = pdl_batch_wait(b, -1, err);
    pdl_batch_free(b);
    return st;
}

static void initiator_checks(pdl_backend_kind_t backend)
{
    pair_t p;
    pair_open(&p, backend);
    pdl_error_t err;
    struct {
        uint64_t lo, ro, len;
        const char *needle;
    } bad[] = {
        {0, SZ + 1, 1, "read [65537, +1) outside region %ID of engine producer:tp1 (size 65536)"}, /* offset beyond */
        {0, SZ, 1, "read [65536, +1) outside region"},                                          /* offset at end */
        {0, 1, SZ, "read [1, +65536) outside region"},                                          /* length beyond */
        {0, UINT64_MAX - 10, 100, "outside region %ID of engine producer:tp1"},                 /* overflow */
        {0, 4096, UINT64_MAX, "outside local region"},                                          /* huge length */
        {SZ - 10, 0, 11, "outside local region"},                                               /* local range */
        {0, 0, 0, "length 0"},                                                                  /* empty */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        pdl_status_t st = run1(p.s, PDL_OP_READ, bad[i].lo, bad[i].ro, bad[i].len, &err);
        assert_int_equal(st, PDL_ERR_INVALID);
        char needle[160];
        with_id(needle, sizeof(needle), bad[i].needle, pdl_mem_id(p.om));
        if (strstr(err.msg, needle) == NULL)
            fail_msg("case %zu: '%s' lacks '%s'", i, err.msg, needle);
        assert_non_null(strstr(err.msg, "engine consumer:tp0"));
    }
    /* The exact format of the message. */
    run1(p.s, PDL_OP_READ, 0, 4096, SZ, &err);
    char exact[160];
    with_id(exact, sizeof(exact), "engine consumer:tp0: read [4096, +65536) outside region %ID of engine producer:tp1 (size 65536)",
            pdl_mem_id(p.om));
    assert_non_null(strstr(err.msg, exact));
    assert_int_equal(run1(p.s, PDL_OP_WRITE, 0, 1, SZ, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "write [1, +65536)"));
    /* Nothing was transferred and nothing failed: refused before posting. */
    pdl_engine_stats_t st;
    pdl_engine_get_stats(p.init, &st);
    assert_int_equal(st.batches_ok + st.batches_failed, 0);
    /* The whole region at the exact edge is fine. */
    assert_int_equal(run1(p.s, PDL_OP_READ, 0, 0, SZ, &err), PDL_OK);

    /* Deregistration on the owner: the next batch fails with NOT_FOUND. */
    char region[64];
    with_id(region, sizeof(region), "region %ID", pdl_mem_id(p.om));
    pdl_engine_deregister_mem(p.owner, p.om);
    p.om = NULL;
    assert_int_equal(run1(p.s, PDL_OP_READ, 0, 0, 4096, &err), PDL_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, region));
    pair_close(&p);
}

static void test_initiator_checks_shm(void **state)
{
    (void)state;
    initiator_checks(PDL_BACKEND_SHM);
}

static void test_initiator_checks_tcp(void **state)
{
    (void)state;
    initiator_checks(PDL_BACKEND_TCP);
}

/* UCX bounds a get only by the rkey's whole region (and its tcp emulation not at all): the same
 * refusals must come from pdlink, over both of the transports this machine has. */
static void test_initiator_checks_ucx(void **state)
{
    (void)state;
    const char *tls[] = {"tcp", "sm"};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(setenv("UCX_TLS", tls[i], 1), 0);
        initiator_checks(PDL_BACKEND_UCX);
    }
    unsetenv("UCX_TLS");
}

/* ---------------------------------------------------------------- owner side, raw frames */

/* A data connection from local address `src` (host order; 0 = the kernel's choice) after its HELLO. */
static int raw_hello_from(uint16_t port, const char *key, uint32_t src)
{
    int fd = raw_dial(port, src);
    uint8_t h[PDL_TCP_REQ_HDR];
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, PDL_TCP_OP_HELLO, 0, 0, 0, strlen(key), 0};
    pdl_tcp_req_encode(h, &r);
    assert_int_equal(send(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
    assert_int_equal(send(fd, key, strlen(key), 0), (ssize_t)strlen(key));
    uint8_t rh[PDL_TCP_RESP_HDR];
    assert_int_equal(recv(fd, rh, sizeof(rh), MSG_WAITALL), (ssize_t)sizeof(rh));
    pdl_tcp_resp_t rr;
    pdl_tcp_resp_decode(rh, &rr);
    assert_int_equal(rr.status, 0);
    return fd;
}

static int raw_hello(uint16_t port, const char *key) { return raw_hello_from(port, key, 0); }

/* Send one request naming `grant` (NULL: none), as an outsider's own client would; return the response
 * status; read and return payload/message into buf. */
static int32_t raw_req_g(int fd, uint16_t op, uint64_t id, const char *grant, const uint64_t *segs, uint32_t nseg,
                         const uint8_t *payload, uint8_t *buf, size_t cap, uint64_t *got)
{
    uint8_t h[PDL_TCP_REQ_HDR];
    uint64_t total = 0;
    for (uint32_t i = 0; i < nseg; i++)
        total += segs[2 * i + 1];
    uint32_t glen = grant ? (uint32_t)strlen(grant) : 0;
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, op, nseg, glen, id, total, 99};
    pdl_tcp_req_encode(h, &r);
    assert_int_equal(send(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
    uint8_t sb[16 * 8];
    for (uint32_t i = 0; i < nseg; i++) {
        pdl_tcp_put64(sb + 16 * i, segs[2 * i]);
        pdl_tcp_put64(sb + 16 * i + 8, segs[2 * i + 1]);
    }
    assert_int_equal(send(fd, sb, 16 * nseg, 0), (ssize_t)(16 * nseg));
    if (glen)
        assert_int_equal(send(fd, grant, glen, 0), (ssize_t)glen);
    if (op == PDL_TCP_OP_WRITE)
        assert_int_equal(send(fd, payload, total, 0), (ssize_t)total);
    return raw_response(fd, 99, buf, cap, got);
}

static int32_t raw_req(int fd, uint16_t op, uint64_t id, const uint64_t *segs, uint32_t nseg, const uint8_t *payload,
                       uint8_t *buf, size_t cap, uint64_t *got)
{
    return raw_req_g(fd, op, id, NULL, segs, nseg, payload, buf, cap, got);
}

static void test_owner_checks_tcp(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, PDL_BACKEND_TCP);
    uint8_t *om = fill_owner(&p);
    int fd = raw_hello(pdl_engine_port(p.owner), "producer:tp1");
    uint8_t buf[SZ + 1024];
    uint64_t got;
    uint64_t id = pdl_mem_id(p.om);
    struct {
        uint64_t id, off, len;
        int32_t st;
        const char *needle;
    } bad[] = {
        {999, 0, 16, PDL_ERR_NOT_FOUND, "no such registration"},
        {0, 0, 16, PDL_ERR_NOT_FOUND, "no such registration"},
        {id, SZ + 1, 1, PDL_ERR_INVALID, "read [65537, +1) outside region %ID of engine producer:tp1 (size 65536)"},
        {id, 0, SZ + 1, PDL_ERR_INVALID, "outside region"},
        {id, UINT64_MAX - 8, 16, PDL_ERR_INVALID, "outside region"},
        {id, SZ, 1, PDL_ERR_INVALID, "outside region"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t seg[2] = {bad[i].off, bad[i].len};
        int32_t st = raw_req(fd, PDL_TCP_OP_READ, bad[i].id, seg, 1, NULL, buf, sizeof(buf), &got);
        assert_int_equal(st, bad[i].st);
        char needle[160];
        with_id(needle, sizeof(needle), bad[i].needle, id);
        if (strstr((char *)buf, needle) == NULL)
            fail_msg("case %zu: '%s' lacks '%s'", i, buf, needle);
    }
    /* One bad segment among good ones refuses the whole request. */
    uint64_t mixed[4] = {0, 16, SZ - 8, 16};
    assert_int_equal(raw_req(fd, PDL_TCP_OP_READ, id, mixed, 2, NULL, buf, sizeof(buf), &got), PDL_ERR_INVALID);
    /* A refused WRITE is drained: nothing lands in the region and the connection stays in sync. */
    uint8_t payload[32];
    memset(payload, 0xEE, sizeof(payload));
    uint64_t wseg[2] = {SZ - 16, 32};
    assert_int_equal(raw_req(fd, PDL_TCP_OP_WRITE, id, wseg, 1, payload, buf, sizeof(buf), &got), PDL_ERR_INVALID);
    for (size_t i = SZ - 16; i < SZ; i++)
        assert_int_equal(om[i], (uint8_t)(i * 7));
    /* The same connection still serves a good READ of two segments, in request order. */
    uint64_t good[4] = {100, 8, 10, 4};
    assert_int_equal(raw_req(fd, PDL_TCP_OP_READ, id, good, 2, NULL, buf, sizeof(buf), &got), 0);
    assert_int_equal(got, 12);
    for (int i = 0; i < 8; i++)
        assert_int_equal(buf[i], (uint8_t)((100 + i) * 7));
    for (int i = 0; i < 4; i++)
        assert_int_equal(buf[8 + i], (uint8_t)((10 + i) * 7));
    /* And a good WRITE. */
    uint64_t wgood[2] = {0, 32};
    assert_int_equal(raw_req(fd, PDL_TCP_OP_WRITE, id, wgood, 1, payload, buf, sizeof(buf), &got), 0);
    assert_int_equal(om[0], 0xEE);
    assert_int_equal(om[31], 0xEE);
    pdl_engine_stats_t st;
    pdl_engine_get_stats(p.owner, &st);
    assert_int_equal(st.requests_refused, 8);
    assert_int_equal(st.connections_dropped_malformed, 0);
    assert_int_equal(st.bytes_served, 12 + 32);

    /* Deregistered: refused with NOT_FOUND naming the deregistration. */
    pdl_engine_deregister_mem(p.owner, p.om);
    p.om = NULL;
    uint64_t seg[2] = {0, 16};
    assert_int_equal(raw_req(fd, PDL_TCP_OP_READ, id, seg, 1, NULL, buf, sizeof(buf), &got), PDL_ERR_NOT_FOUND);
    assert_non_null(strstr((char *)buf, "deregistered"));
    close(fd);
    /* A HELLO naming another engine is refused. */
    int fd2 = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(pdl_engine_port(p.owner))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd2, (struct sockaddr *)&a, sizeof(a)), 0);
    uint8_t h[PDL_TCP_REQ_HDR];
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, PDL_TCP_OP_HELLO, 0, 0, 0, 5, 0};
    pdl_tcp_req_encode(h, &r);
    send(fd2, h, sizeof(h), 0);
    send(fd2, "other", 5, 0);
    uint8_t rh[PDL_TCP_RESP_HDR];
    assert_int_equal(recv(fd2, rh, sizeof(rh), MSG_WAITALL), (ssize_t)sizeof(rh));
    pdl_tcp_resp_t rr;
    pdl_tcp_resp_decode(rh, &rr);
    assert_int_equal(rr.status, PDL_ERR_MISMATCH);
    close(fd2);
    pair_close(&p);
}

/* ---------------------------------------------------------------- status transitions, merging */

static void transitions(pdl_backend_kind_t backend)
{
    pair_t p;
    pair_open(&p, backend);
    uint8_t *om = pdl_mem_ptr(p.om), *im = pdl_mem_ptr(p.im);
    for (size_t i = 0; i < SZ; i++)
        om[i] = (uint8_t)(i * 13 + 1);
    /* Three descriptors adjacent on both sides merge into one; a fourth elsewhere does not. */
    pdl_desc_t d[4] = {{0, 1024, 100}, {100, 1124, 200}, {300, 1324, 50}, {8192, 0, 10}};
    pdl_batch_t *b = NULL;
    pdl_error_t err;
    assert_int_equal(pdl_session_post(p.s, PDL_OP_READ, d, 4, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_num_descs(b), 2);
    assert_int_equal(pdl_batch_bytes(b), 360);
    pdl_status_t st = pdl_batch_poll(b, &err);
    assert_true(st == PDL_INPROGRESS || st == PDL_OK);
    assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_OK);
    assert_int_equal(pdl_batch_poll(b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, 0, &err), PDL_OK);
    pdl_batch_free(b);
    for (int i = 0; i < 350; i++)
        assert_int_equal(im[i], (uint8_t)((1024 + i) * 13 + 1));
    for (int i = 0; i < 10; i++)
        assert_int_equal(im[8192 + i], (uint8_t)(i * 13 + 1));
    /* A failed batch reports the same status from poll and wait. */
    char region[64];
    with_id(region, sizeof(region), "region %ID", pdl_mem_id(p.om));
    pdl_engine_deregister_mem(p.owner, p.om);
    p.om = NULL;
    if (backend == PDL_BACKEND_TCP) {
        /* tcp checks at the owner, so the post succeeds and the batch fails. */
        assert_int_equal(pdl_session_post(p.s, PDL_OP_READ, d, 1, &b, &err), PDL_OK);
        assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_ERR_NOT_FOUND);
        assert_int_equal(pdl_batch_poll(b, &err), PDL_ERR_NOT_FOUND);
        assert_non_null(strstr(err.msg, region));
        pdl_batch_free(b);
        pdl_engine_stats_t s;
        pdl_engine_get_stats(p.init, &s);
        assert_int_equal(s.batches_failed, 1);
        assert_int_equal(s.batches_ok, 1);
        assert_int_equal(s.bytes_read, 360);
    } else {
        assert_int_equal(pdl_session_post(p.s, PDL_OP_READ, d, 1, &b, &err), PDL_ERR_NOT_FOUND);
    }
    pair_close(&p);
}

static void test_transitions_shm(void **state)
{
    (void)state;
    transitions(PDL_BACKEND_SHM);
}

static void test_transitions_tcp(void **state)
{
    (void)state;
    transitions(PDL_BACKEND_TCP);
}

/* remove_remote: later posts fail with PEER_GONE. */
static void test_remove_remote(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, PDL_BACKEND_TCP);
    pdl_error_t err;
    assert_int_equal(run1(p.s, PDL_OP_READ, 0, 0, 4096, &err), PDL_OK);
    assert_int_equal(pdl_engine_remove_remote(p.init, "producer:tp1", &err), PDL_OK);
    assert_int_equal(run1(p.s, PDL_OP_READ, 0, 0, 4096, &err), PDL_ERR_PEER_GONE);
    assert_non_null(strstr(err.msg, "peer gone"));
    pair_close(&p);
}

/* Deregistering a region while a stalled peer is being served from it: the connection is shut down,
 * deregistration returns, and the engine keeps serving others. */
static void test_dereg_while_serving_tcp(void **state)
{
    (void)state;
    pdl_engine_config_t oc = {"producer:tp1", "127.0.0.1", 0, PDL_BACKEND_TCP, 1, 1, NULL, false, NULL, NULL};
    pdl_engine_t *e = NULL;
    pdl_mem_t *m = NULL, *m2 = NULL;
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&oc, &e, &err), PDL_OK);
    /* Larger than the socket buffers of a peer that never reads, so the server cannot finish. */
    const size_t big = 24u << 20;
    assert_int_equal(pdl_engine_alloc_mem(e, big, &m, &err), PDL_OK);
    assert_int_equal(pdl_engine_alloc_mem(e, 4096, &m2, &err), PDL_OK);
    int fd = raw_hello(pdl_engine_port(e), "producer:tp1");
    uint8_t h[PDL_TCP_REQ_HDR], seg[16];
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, PDL_TCP_OP_READ, 1, 0, pdl_mem_id(m), big, 1};
    pdl_tcp_req_encode(h, &r);
    pdl_tcp_put64(seg, 0);
    pdl_tcp_put64(seg + 8, big);
    assert_int_equal(send(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
    assert_int_equal(send(fd, seg, sizeof(seg), 0), (ssize_t)sizeof(seg));
    /* The response header arriving proves the server is serving the region (it holds a reference). */
    static uint8_t sink[1 << 16];
    assert_int_equal(recv(fd, sink, PDL_TCP_RESP_HDR, MSG_WAITALL), PDL_TCP_RESP_HDR);
    pdl_engine_deregister_mem(e, m); /* must return although the peer never reads */
    /* The stalled connection was shut down: draining it ends in EOF or a reset, never hangs. */
    ssize_t n;
    size_t total = PDL_TCP_RESP_HDR;
    while ((n = recv(fd, sink, sizeof(sink), 0)) > 0)
        total += (size_t)n;
    assert_true(total < big + PDL_TCP_RESP_HDR);
    close(fd);
    /* Others are still served. */
    int fd2 = raw_hello(pdl_engine_port(e), "producer:tp1");
    uint64_t s2[2] = {0, 16};
    uint8_t buf[64];
    uint64_t got;
    assert_int_equal(raw_req(fd2, PDL_TCP_OP_READ, pdl_mem_id(m2), s2, 1, NULL, buf, sizeof(buf), &got), 0);
    assert_int_equal(got, 16);
    close(fd2);
    pdl_engine_deregister_mem(e, m2);
    pdl_engine_destroy(e);
}

/* Registration ids must not be guessable: sequential ids (1, 2, 3...) would let anyone who reached the
 * data port read a region with a raw READ, and the handshake metadata must not name them either. */
static void test_ids_random(void **state)
{
    (void)state;
    pdl_engine_config_t oc = {"producer:tp1", "127.0.0.1", 0, PDL_BACKEND_TCP, 1, 1, NULL, false, NULL, NULL};
    pdl_engine_t *e;
    assert_int_equal(pdl_engine_create(&oc, &e, NULL), PDL_OK);
    pdl_mem_t *m[8];
    int small = 0;
    for (int i = 0; i < 8; i++) {
        assert_int_equal(pdl_engine_alloc_mem(e, 4096, &m[i], NULL), PDL_OK);
        small += pdl_mem_id(m[i]) < (1ull << 32);
        for (int k = 0; k < i; k++)
            assert_true(pdl_mem_id(m[k]) != pdl_mem_id(m[i]));
    }
    /* 8 random 64-bit ids all fall below 2^32 with probability 2^-256. */
    assert_true(small < 8);
    for (int i = 0; i < 8; i++)
        pdl_engine_deregister_mem(e, m[i]);
    pdl_engine_destroy(e);
}

/*
 * A guarded region is served only inside a grant. An outsider who reached the data port
 * and knows the registration id (here: told it) reads 0 bytes and writes 0 bytes without the grant's
 * name, and even with it gets nothing outside the granted ranges or ops; every refusal is counted.
 */
static void test_guarded_tcp(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, PDL_BACKEND_TCP);
    uint8_t *om = fill_owner(&p);
    uint64_t id = pdl_mem_id(p.om);
    pdl_mem_guard(p.om);
    pdl_error_t err;
    /* Two separate ranges, given out of order and overlapping: [4096, 12288) and [32768, 36864). */
    pdl_range_t rg[3] = {{32768, 4096}, {4096, 4096}, {6144, 6144}};
    assert_int_equal(pdl_engine_grant(p.owner, p.om, "tx-a", PDL_GRANT_READ, rg, 3, &err), PDL_OK);
    assert_int_equal(pdl_engine_grant(p.owner, p.om, "tx-a", PDL_GRANT_READ, rg, 1, &err), PDL_ERR_BAD_STATE);
    int fd = raw_hello(pdl_engine_port(p.owner), "producer:tp1");
    uint8_t buf[SZ + 1024];
    uint64_t got;
    uint64_t whole[2] = {0, SZ};
    /* The attack of the issue: a raw READ of the whole region without a grant. */
    assert_int_equal(raw_req(fd, PDL_TCP_OP_READ, id, whole, 1, NULL, buf, sizeof(buf), &got), PDL_ERR_DENIED);
    assert_non_null(strstr((char *)buf, "denied: the region is guarded and the request names no grant"));
    /* A guessed grant name, a granted range under a wrong name, a range beyond the grant. */
    uint64_t inside[2] = {4096, 8192};
    assert_int_equal(raw_req_g(fd, PDL_TCP_OP_READ, id, "tx-b", inside, 1, NULL, buf, sizeof(buf), &got),
                     PDL_ERR_DENIED);
    uint64_t across[2] = {4096, 8193};
    assert_int_equal(raw_req_g(fd, PDL_TCP_OP_READ, id, "tx-a", across, 1, NULL, buf, sizeof(buf), &got),
                     PDL_ERR_DENIED);
    assert_non_null(strstr((char *)buf, "[4096, +8193) is outside grant tx-a"));
    uint64_t gap[4] = {4096, 16, 20000, 16}; /* one good segment, one in the gap: the whole request */
    assert_int_equal(raw_req_g(fd, PDL_TCP_OP_READ, id, "tx-a", gap, 2, NULL, buf, sizeof(buf), &got), PDL_ERR_DENIED);
    /* A WRITE, with and without the (read-only) grant: nothing lands. */
    uint8_t payload[32];
    memset(payload, 0xEE, sizeof(payload));
    uint64_t w[2] = {4096, 32};
    assert_int_equal(raw_req(fd, PDL_TCP_OP_WRITE, id, w, 1, payload, buf, sizeof(buf), &got), PDL_ERR_DENIED);
    assert_int_equal(raw_req_g(fd, PDL_TCP_OP_WRITE, id, "tx-a", w, 1, payload, buf, sizeof(buf), &got),
                     PDL_ERR_DENIED);
    assert_non_null(strstr((char *)buf, "grant tx-a does not allow writes"));
    for (size_t i = 0; i < SZ; i++)
        assert_int_equal(om[i], (uint8_t)(i * 7));
    pdl_engine_stats_t st;
    pdl_engine_get_stats(p.owner, &st);
    assert_int_equal(st.requests_denied, 6);
    assert_int_equal(st.requests_refused, 6);
    assert_int_equal(st.bytes_served, 0);
    assert_int_equal(st.requests_served, 0);
    /* Inside the grant, on the same connection (refusals keep it in sync), and through the API. */
    assert_int_equal(raw_req_g(fd, PDL_TCP_OP_READ, id, "tx-a", inside, 1, NULL, buf, sizeof(buf), &got), 0);
    assert_int_equal(got, 8192);
    assert_int_equal(buf[0], (uint8_t)(4096 * 7));
    pdl_desc_t d[2] = {{0, 32768, 4096}, {4096, 4096, 16}};
    pdl_batch_t *b;
    assert_int_equal(pdl_session_post_granted(p.s, PDL_OP_READ, "tx-a", d, 2, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_OK);
    pdl_batch_free(b);
    assert_int_equal(((uint8_t *)pdl_mem_ptr(p.im))[0], (uint8_t)(32768 * 7));
    assert_int_equal(pdl_session_post(p.s, PDL_OP_READ, d, 1, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_ERR_DENIED);
    pdl_batch_free(b);
    /* Revoked: denied again. */
    assert_int_equal(pdl_engine_revoke(p.owner, "tx-a", &err), PDL_OK);
    assert_int_equal(pdl_engine_revoke(p.owner, "tx-a", &err), PDL_ERR_NOT_FOUND);
    assert_int_equal(raw_req_g(fd, PDL_TCP_OP_READ, id, "tx-a", inside, 1, NULL, buf, sizeof(buf), &got),
                     PDL_ERR_DENIED);
    pdl_engine_get_stats(p.owner, &st);
    assert_int_equal(st.requests_denied, 8);
    assert_int_equal(st.requests_served, 2);
    close(fd);
    pair_close(&p);
}

/* trusted_hosts: a data connection from an address outside the list is closed at accept, before a byte. */
static void test_untrusted_tcp(void **state)
{
    (void)state;
    pdl_engine_config_t oc = {.key = "producer:tp1", .host = "127.0.0.1", .backend = PDL_BACKEND_TCP,
                              .qp_per_transfer = 1, .num_workers = 1, .trusted_hosts = "127.0.0.2, 10.0.0.0/8"};
    pdl_engine_t *e;
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&oc, &e, &err), PDL_OK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(pdl_engine_port(e))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    uint8_t b[1];
    assert_int_equal(recv(fd, b, 1, 0), 0); /* closed by the owner without reading anything */
    close(fd);
    pdl_engine_stats_t st;
    pdl_engine_get_stats(e, &st);
    assert_int_equal(st.connections_refused_untrusted, 1);
    pdl_engine_destroy(e);
    oc.trusted_hosts = "owner.example";
    assert_int_equal(pdl_engine_create(&oc, &e, &err), PDL_ERR_INVALID);
    assert_non_null(strstr(err.msg, "engine producer:tp1: trusted_hosts: 'owner.example' is not a numeric"));
}

/* Successful remote accesses are counted per peer host; past PDL_ENGINE_MAX_PEERS hosts
 * (127.0.0.2 .. 127.0.0.80 here: loopback routes all of 127/8) the rest share the row "other". */
static void test_peer_stats_tcp(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, PDL_BACKEND_TCP);
    uint8_t buf[64];
    uint64_t got, seg[2] = {0, 16};
    for (uint32_t h = 2; h <= 80; h++) {
        int fd = raw_hello_from(pdl_engine_port(p.owner), "producer:tp1", 0x7f000000u + h);
        for (uint32_t k = 0; k < (h == 2 ? 3u : 1u); k++)
            assert_int_equal(raw_req(fd, PDL_TCP_OP_READ, pdl_mem_id(p.om), seg, 1, NULL, buf, sizeof(buf), &got), 0);
        close(fd);
    }
    pdl_engine_peer_stats_t rows[PDL_ENGINE_MAX_PEERS + 1];
    size_t n = pdl_engine_peer_stats(p.owner, rows, PDL_ENGINE_MAX_PEERS + 1);
    assert_int_equal(n, PDL_ENGINE_MAX_PEERS + 1);
    assert_string_equal(rows[0].host, "127.0.0.2");
    assert_int_equal(rows[0].requests, 3);
    assert_int_equal(rows[0].bytes, 48);
    assert_string_equal(rows[63].host, "127.0.0.65");
    assert_string_equal(rows[64].host, "other");
    assert_int_equal(rows[64].requests, 80 - 65); /* 127.0.0.66 .. 127.0.0.80 */
    pair_close(&p);
}

/* The data port listens on `host` only, unless bind_all. */
static void test_bind_all_tcp(void **state)
{
    (void)state;
    pdl_engine_config_t oc = {.key = "producer:tp1", .host = "127.0.0.1", .backend = PDL_BACKEND_TCP,
                              .qp_per_transfer = 1, .num_workers = 1};
    for (int all = 0; all < 2; all++) {
        oc.bind_all = all;
        pdl_engine_t *e;
        assert_int_equal(pdl_engine_create(&oc, &e, NULL), PDL_OK);
        assert_int_equal(tl_reaches_other_loopback(pdl_engine_port(e)), all);
        pdl_engine_destroy(e);
    }
}

/*
 * shm has no server, so a batch naming a grant checks the owner's published grants itself: refused
 * before the copy once the grant is revoked (a paused decode whose hold was given up and whose blocks
 * were reused read another prompt's KV here before), and void when the grant changed during the copy.
 */
static void test_guarded_shm(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, PDL_BACKEND_SHM);
    uint8_t *om = pdl_mem_ptr(p.om);
    memset(om, 0x5A, SZ);
    pdl_mem_guard(p.om);
    pdl_error_t err;
    pdl_range_t rg = {0, SZ};
    assert_int_equal(pdl_engine_grant(p.owner, p.om, "tx-a", PDL_GRANT_READ, &rg, 1, &err), PDL_OK);
    pdl_desc_t d = {0, 4096, 8192};
    pdl_batch_t *b;
    assert_int_equal(pdl_session_post_granted(p.s, PDL_OP_READ, "tx-a", &d, 1, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_OK);
    pdl_batch_free(b);
    assert_int_equal(((uint8_t *)pdl_mem_ptr(p.im))[0], 0x5A);
    /* A read-only grant does not allow writes; an unknown name allows nothing. */
    assert_int_equal(pdl_session_post_granted(p.s, PDL_OP_WRITE, "tx-a", &d, 1, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_ERR_DENIED);
    pdl_batch_free(b);
    assert_int_equal(pdl_session_post_granted(p.s, PDL_OP_READ, "tx-b", &d, 1, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_ERR_DENIED);
    assert_non_null(strstr(err.msg, "grant tx-b is not live"));
    pdl_batch_free(b);
    /* The owner gives the transfer up and reuses the blocks: the late reader gets an error, not them. */
    assert_int_equal(pdl_engine_revoke(p.owner, "tx-a", &err), PDL_OK);
    memset(om, 0xC3, SZ);
    memset(pdl_mem_ptr(p.im), 0, SZ);
    assert_int_equal(pdl_session_post_granted(p.s, PDL_OP_READ, "tx-a", &d, 1, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_ERR_DENIED);
    assert_non_null(strstr(err.msg, "grant tx-a is not live"));
    pdl_batch_free(b);
    assert_int_equal(((uint8_t *)pdl_mem_ptr(p.im))[0], 0);
    pair_close(&p);
}

/*
 * Issue 36: a shm grant covers only its ranges. The owner grants READ of block A (the first 16 KiB)
 * under "tx-a"; a batch naming tx-a that touches block B (the next 16 KiB), wholly or by one byte, is
 * refused with PDL_ERR_DENIED and copies nothing; A itself still reads. Before the published table
 * carried ranges, the read of B succeeded and returned the owner's bytes of B.
 */
static void test_grant_ranges_shm(void **state)
{
    (void)state;
    pair_t p;
    pair_open(&p, PDL_BACKEND_SHM);
    uint8_t *om = pdl_mem_ptr(p.om), *im = pdl_mem_ptr(p.im);
    memset(om, 0xA1, 16384);
    memset(om + 16384, 0xB2, 16384);
    pdl_mem_guard(p.om);
    pdl_error_t err;
    pdl_range_t a = {0, 16384};
    assert_int_equal(pdl_engine_grant(p.owner, p.om, "tx-a", PDL_GRANT_READ, &a, 1, &err), PDL_OK);
    pdl_desc_t outside[] = {{0, 16384, 16384}, {0, 16383, 2}, {0, 4096, 4096}};
    for (size_t i = 0; i < sizeof(outside) / sizeof(outside[0]); i++) {
        memset(im, 0, SZ);
        pdl_batch_t *b;
        /* The last case: an allowed piece of A first, then B, in one batch: B refuses all of it. */
        pdl_desc_t two[2] = {{0, 0, 4096}, outside[i]};
        bool pair = i == 2;
        if (pair)
            two[1] = (pdl_desc_t){8192, 20000, 4096};
        assert_int_equal(pdl_session_post_granted(p.s, PDL_OP_READ, "tx-a", pair ? two : &outside[i], pair ? 2 : 1,
                                                  &b, &err),
                         PDL_OK);
        assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_ERR_DENIED);
        assert_non_null(strstr(err.msg, "outside its grant tx-a"));
        pdl_batch_free(b);
        for (size_t k = 0; k < SZ; k++)
            assert_int_equal(im[k], 0);
    }
    pdl_desc_t in = {0, 0, 16384};
    pdl_batch_t *b;
    assert_int_equal(pdl_session_post_granted(p.s, PDL_OP_READ, "tx-a", &in, 1, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_OK);
    pdl_batch_free(b);
    assert_int_equal(im[0], 0xA1);
    assert_int_equal(im[16383], 0xA1);
    /* A WRITE grant of B does not widen the READ grant of A (another name, another op). */
    pdl_range_t bb = {16384, 16384};
    assert_int_equal(pdl_engine_grant(p.owner, p.om, "tx-b", PDL_GRANT_WRITE, &bb, 1, &err), PDL_OK);
    pdl_desc_t rb = {0, 16384, 16384};
    assert_int_equal(pdl_session_post_granted(p.s, PDL_OP_READ, "tx-b", &rb, 1, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_ERR_DENIED);
    pdl_batch_free(b);
    pair_close(&p);
}

/* The published range pool gives revoked grants' entries back: 3 x PDL_GRANT_PUB_RANGES / 2 ranges
 * granted and revoked in turn fit, a grant larger than the pool is refused with PDL_ERR_NOMEM, and a
 * grant added after revocations sees only its own ranges. */
static void test_grant_pub_pool(void **state)
{
    (void)state;
    pdl_grants_t g;
    pdl__grants_init(&g);
    pdl_grant_pub_t *pub = calloc(1, sizeof(*pub));
    assert_non_null(pub);
    pdl__grants_publish(&g, pub);
    size_t n = PDL_GRANT_PUB_RANGES / 2;
    pdl_range_t *rg = malloc((PDL_GRANT_PUB_RANGES + 1) * sizeof(*rg));
    assert_non_null(rg);
    for (size_t i = 0; i <= PDL_GRANT_PUB_RANGES; i++)
        rg[i] = (pdl_range_t){(uint64_t)i * 8, 4}; /* never adjacent: no merging */
    pdl_error_t err;
    assert_int_equal(pdl__grants_add(&g, "big", 7, PDL_GRANT_READ, rg, PDL_GRANT_PUB_RANGES + 1, &err), PDL_ERR_NOMEM);
    assert_int_equal(pdl__grants_add(&g, "h1", 7, PDL_GRANT_READ, rg, n, &err), PDL_OK);
    assert_int_equal(pdl__grants_add(&g, "h2", 7, PDL_GRANT_READ, rg + n, n, &err), PDL_OK);
    assert_int_equal(pdl__grants_add(&g, "h3", 7, PDL_GRANT_READ, rg, 1, &err), PDL_ERR_NOMEM);
    assert_true(pdl__grants_revoke(&g, "h1"));
    pdl_range_t one = {100, 8};
    assert_int_equal(pdl__grants_add(&g, "h3", 7, PDL_GRANT_READ, &one, 1, &err), PDL_OK);
    uint64_t slot, seq;
    assert_true(pdl__grant_pub_find(pub, "h3", 7, PDL_GRANT_READ, &slot, &seq));
    assert_true(pdl__grant_pub_covers(pub, slot, 100, 8));
    assert_false(pdl__grant_pub_covers(pub, slot, 0, 4)); /* h1's old range, now free */
    assert_false(pdl__grant_pub_covers(pub, slot, 104, 5));
    assert_true(pdl__grant_pub_still(pub, slot, seq));
    assert_true(pdl__grant_pub_find(pub, "h2", 7, PDL_GRANT_READ, &slot, &seq));
    assert_true(pdl__grant_pub_covers(pub, slot, (uint64_t)(n + 5) * 8, 4));
    assert_false(pdl__grant_pub_covers(pub, slot, (uint64_t)(n + 5) * 8, 5));
    assert_true(pdl__grants_revoke(&g, "h2"));
    assert_true(pdl__grants_revoke(&g, "h3"));
    assert_int_equal(g.nfx, 1); /* everything merged back into one free extent */
    free(rg);
    pdl__grants_fini(&g);
    free(pub);
}

/* The published table's seqlock: a slot seen live and then revoked, or revoked and granted again
 * under the same name (it may land in the same slot), is not "still" the one the reader saw. */
static void test_grant_pub_seq(void **state)
{
    (void)state;
    pdl_grants_t g;
    pdl__grants_init(&g);
    pdl_grant_pub_t *pub = calloc(1, sizeof(*pub));
    assert_non_null(pub);
    pdl__grants_publish(&g, pub);
    pdl_error_t err;
    pdl_range_t rg = {0, 4096};
    uint64_t slot, seq, slot2, seq2;
    assert_false(pdl__grant_pub_find(pub, "t1", 7, PDL_GRANT_READ, &slot, &seq));
    assert_int_equal(pdl__grants_add(&g, "t1", 7, PDL_GRANT_READ, &rg, 1, &err), PDL_OK);
    assert_true(pdl__grant_pub_find(pub, "t1", 7, PDL_GRANT_READ, &slot, &seq));
    assert_false(pdl__grant_pub_find(pub, "t1", 8, PDL_GRANT_READ, &slot2, &seq2));  /* another region */
    assert_false(pdl__grant_pub_find(pub, "t1", 7, PDL_GRANT_WRITE, &slot2, &seq2)); /* another op */
    assert_true(pdl__grant_pub_still(pub, slot, seq));
    assert_true(pdl__grants_revoke(&g, "t1"));
    assert_false(pdl__grant_pub_still(pub, slot, seq));
    assert_false(pdl__grant_pub_find(pub, "t1", 7, PDL_GRANT_READ, &slot2, &seq2));
    assert_int_equal(pdl__grants_add(&g, "t1", 7, PDL_GRANT_READ, &rg, 1, &err), PDL_OK);
    assert_true(pdl__grant_pub_find(pub, "t1", 7, PDL_GRANT_READ, &slot2, &seq2));
    assert_false(pdl__grant_pub_still(pub, slot, seq));
    assert_true(pdl__grant_pub_still(pub, slot2, seq2));
    /* Many names: each found in its own slot, found again after others around it were revoked. */
    char name[32];
    for (int i = 0; i < 2000; i++) {
        snprintf(name, sizeof(name), "n%d", i);
        assert_int_equal(pdl__grants_add(&g, name, 7, PDL_GRANT_READ | PDL_GRANT_WRITE, &rg, 1, &err), PDL_OK);
    }
    for (int i = 0; i < 2000; i += 2) {
        snprintf(name, sizeof(name), "n%d", i);
        assert_true(pdl__grants_revoke(&g, name));
    }
    for (int i = 0; i < 2000; i++) {
        snprintf(name, sizeof(name), "n%d", i);
        assert_int_equal(pdl__grant_pub_find(pub, name, 7, PDL_GRANT_WRITE, &slot2, &seq2), i % 2 == 1);
    }
    pdl__grants_fini(&g);
    free(pub);
}

int main(void)
{
    pdl_log_set_level(PDL_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_initiator_checks_shm), cmocka_unit_test(test_initiator_checks_tcp),
        cmocka_unit_test(test_initiator_checks_ucx),
        cmocka_unit_test(test_owner_checks_tcp),     cmocka_unit_test(test_transitions_shm),
        cmocka_unit_test(test_transitions_tcp),      cmocka_unit_test(test_remove_remote),
        cmocka_unit_test(test_dereg_while_serving_tcp),
        cmocka_unit_test(test_ids_random),             cmocka_unit_test(test_bind_all_tcp),             cmocka_unit_test(test_peer_stats_tcp),             cmocka_unit_test(test_untrusted_tcp),             cmocka_unit_test(test_guarded_tcp), cmocka_unit_test(test_guarded_shm), cmocka_unit_test(test_grant_pub_seq), cmocka_unit_test(test_grant_ranges_shm), cmocka_unit_test(test_grant_pub_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
