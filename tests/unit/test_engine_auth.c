/*
 * test_engine_auth.c -- the tcp engine in authenticated mode (docs/security.md; tcp_wire.h HELLO_AUTH /
 * AUTH): engines holding the same cluster key move data; an initiator without the key, with another key,
 * or a raw client that skips or fakes the challenge gets nothing (0 bytes, the connection closed), and
 * the owner counts each refusal in its stats and in the peer's row. An initiator with a key refuses an
 * owner without one. Before authenticated mode, every one of these reads succeeded.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/tcp_wire.h"
#include "tcp_raw_testutil.h"
#include "pdlink/auth.h"
#include "pdlink/engine.h"

#define SZ 65536

static pdl_auth_t *key_a, *key_b;

static int setup(void **state)
{
    (void)state;
    static const char a[] = "cluster-a-0123456789abcdef0123456789abcdef";
    static const char b[] = "cluster-b-0123456789abcdef0123456789abcdef";
    if (pdl_auth_from_secret(a, strlen(a), &key_a, NULL) != PDL_OK ||
        pdl_auth_from_secret(b, strlen(b), &key_b, NULL) != PDL_OK)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    pdl_auth_free(key_a);
    pdl_auth_free(key_b);
    return 0;
}

typedef struct pair {
    pdl_engine_t *owner, *init;
    pdl_mem_t *om, *im;
    pdl_bytes_t md;
} pair_t;

/* An owner (key `ok`) with a 64 KiB region of pattern bytes and an initiator (key `ik`); no session. */
static void pair_make(pair_t *p, const pdl_auth_t *ok, const pdl_auth_t *ik)
{
    pdl_engine_config_t oc = {.key = "producer:tp0", .host = "127.0.0.1", .backend = PDL_BACKEND_TCP,
                              .qp_per_transfer = 1, .num_workers = 1, .auth = ok};
    pdl_engine_config_t ic = {.key = "consumer:tp0", .host = "127.0.0.1", .backend = PDL_BACKEND_TCP,
                              .qp_per_transfer = 2, .num_workers = 1, .auth = ik};
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&oc, &p->owner, &err), PDL_OK);
    assert_int_equal(pdl_engine_create(&ic, &p->init, &err), PDL_OK);
    assert_int_equal(pdl_engine_alloc_mem(p->owner, SZ, &p->om, &err), PDL_OK);
    assert_int_equal(pdl_engine_alloc_mem(p->init, SZ, &p->im, &err), PDL_OK);
    uint8_t *o = pdl_mem_ptr(p->om);
    for (size_t i = 0; i < SZ; i++)
        o[i] = (uint8_t)(i * 7 + 1);
    pdl_bytes_t ed;
    assert_int_equal(pdl_engine_pack(p->owner, &ed, &err), PDL_OK);
    assert_int_equal(pdl_mem_pack(p->om, &p->md, &err), PDL_OK);
    assert_int_equal(pdl_engine_add_remote(p->init, ed.data, ed.len, NULL, 0, &err), PDL_OK);
    pdl_bytes_free(&ed);
}

static void pair_free(pair_t *p)
{
    pdl_bytes_free(&p->md);
    pdl_engine_deregister_mem(p->init, p->im);
    pdl_engine_deregister_mem(p->owner, p->om);
    pdl_engine_destroy(p->init);
    pdl_engine_destroy(p->owner);
}

static uint64_t owner_refused(pdl_engine_t *e)
{
    pdl_engine_stats_t st;
    pdl_engine_get_stats(e, &st);
    return st.connections_refused_auth;
}

static uint64_t peer_refused(pdl_engine_t *e, const char *host)
{
    pdl_engine_peer_stats_t rows[8];
    size_t n = pdl_engine_peer_stats(e, rows, 8);
    for (size_t i = 0; i < n && i < 8; i++)
        if (strcmp(rows[i].host, host) == 0)
            return rows[i].auth_refused;
    return 0;
}

static void same_key_moves_data(void **state)
{
    (void)state;
    pair_t p;
    pair_make(&p, key_a, key_a);
    pdl_session_t *s = NULL;
    pdl_error_t err;
    if (pdl_session_open(p.init, p.im, p.md.data, p.md.len, &s, &err) != PDL_OK)
        fail_msg("%s", err.msg);
    pdl_desc_t d = {0, 0, SZ};
    pdl_batch_t *b = NULL;
    assert_int_equal(pdl_session_post(s, PDL_OP_READ, &d, 1, &b, &err), PDL_OK);
    assert_int_equal(pdl_batch_wait(b, -1, &err), PDL_OK);
    pdl_batch_free(b);
    assert_memory_equal(pdl_mem_ptr(p.im), pdl_mem_ptr(p.om), SZ);
    assert_int_equal(owner_refused(p.owner), 0);
    pdl_session_close(s);
    pair_free(&p);
}

/* The initiator holds no key, or another one: the session never opens; nothing was read. */
static void keyless_and_wrong_key_refused(void **state)
{
    (void)state;
    const pdl_auth_t *keys[] = {NULL, key_b};
    for (int k = 0; k < 2; k++) {
        pair_t p;
        pair_make(&p, key_a, keys[k]);
        pdl_session_t *s = NULL;
        pdl_error_t err;
        assert_int_equal(pdl_session_open(p.init, p.im, p.md.data, p.md.len, &s, &err), PDL_ERR_DENIED);
        assert_null(s);
        if (k == 0) {
            /* A plain HELLO: the owner refuses it with a message naming authenticated mode, and counts it. */
            assert_non_null(strstr(err.msg, "refused HELLO"));
            assert_non_null(strstr(err.msg, "auth_key_file"));
            assert_int_equal(owner_refused(p.owner), 1);
            assert_int_equal(peer_refused(p.owner, "127.0.0.1"), 1);
        } else {
            /* Another key: the owner's proof does not verify, so the initiator stops before sending its own. */
            assert_non_null(strstr(err.msg, "failed to prove the cluster key"));
        }
        const uint8_t *im = pdl_mem_ptr(p.im);
        for (size_t i = 0; i < SZ; i++)
            assert_int_equal(im[i], 0);
        pair_free(&p);
    }
}

/* An initiator with a key refuses an owner without one (it could be anyone listening there). */
static void owner_without_key_refused(void **state)
{
    (void)state;
    pair_t p;
    pair_make(&p, NULL, key_a);
    pdl_session_t *s = NULL;
    pdl_error_t err;
    assert_int_equal(pdl_session_open(p.init, p.im, p.md.data, p.md.len, &s, &err), PDL_ERR_MISMATCH);
    assert_non_null(strstr(err.msg, "not in authenticated mode"));
    pair_free(&p);
}

/* ---- raw clients -------------------------------------------------------------------------------- */

/* With a 5 s receive timeout: a refused peer's missing answer fails the test instead of hanging it. */
static int raw_connect(uint16_t port)
{
    int fd = raw_dial(port, 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* Send a setup-style request (no segments) with `body`; the response's status (its payload/message in buf). */
static int32_t raw_step(int fd, uint16_t op, const void *body, size_t len, uint8_t *buf, size_t cap, uint64_t *got)
{
    uint8_t h[PDL_TCP_REQ_HDR];
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, op, 0, 0, 0, len, 7};
    pdl_tcp_req_encode(h, &r);
    assert_int_equal(send(fd, h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    assert_int_equal(send(fd, body, len, MSG_NOSIGNAL), (ssize_t)len);
    return raw_response(fd, -1, buf, cap, got);
}

/* The owner closed the connection: EOF, or a reset when it closed with our unread request bytes. */
static void assert_closed(int fd)
{
    uint8_t c;
    ssize_t n = recv(fd, &c, 1, 0);
    assert_true(n == 0 || (n < 0 && errno == ECONNRESET));
    close(fd);
}

/*
 * An outsider's own client on the data port of an authenticated owner: a READ without any setup, a
 * plain HELLO, a HELLO_AUTH followed by a made-up MAC. Each gets PDL_ERR_DENIED and a closed
 * connection; none gets a byte of the region.
 */
static void raw_outsider_refused(void **state)
{
    (void)state;
    pair_t p;
    pair_make(&p, key_a, key_a);
    uint16_t port = pdl_engine_port(p.owner);
    uint8_t buf[1024];
    uint64_t got = 0;

    int fd = raw_connect(port);
    uint8_t h[PDL_TCP_REQ_HDR], seg[16];
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, PDL_TCP_OP_READ, 1, 0, pdl_mem_id(p.om), 4096, 9};
    pdl_tcp_req_encode(h, &r);
    pdl_tcp_put64(seg, 0);
    pdl_tcp_put64(seg + 8, 4096);
    assert_int_equal(send(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
    assert_int_equal(send(fd, seg, sizeof(seg), 0), (ssize_t)sizeof(seg));
    uint8_t rh[PDL_TCP_RESP_HDR];
    assert_int_equal(recv(fd, rh, sizeof(rh), MSG_WAITALL), (ssize_t)sizeof(rh));
    pdl_tcp_resp_t rr;
    pdl_tcp_resp_decode(rh, &rr);
    assert_int_equal(rr.status, PDL_ERR_DENIED);
    assert_int_equal(rr.payload_len, 0);
    assert_true(rr.msg_len > 0 && rr.msg_len < sizeof(buf));
    assert_int_equal(recv(fd, buf, rr.msg_len, MSG_WAITALL), (ssize_t)rr.msg_len);
    assert_closed(fd);

    fd = raw_connect(port);
    assert_int_equal(raw_step(fd, PDL_TCP_OP_HELLO, "producer:tp0", 12, buf, sizeof(buf), &got), PDL_ERR_DENIED);
    assert_closed(fd);

    fd = raw_connect(port);
    uint8_t body[12 + PDL_TCP_AUTH_LEN];
    memcpy(body, "producer:tp0", 12);
    memset(body + 12, 0x5a, PDL_TCP_AUTH_LEN);
    assert_int_equal(raw_step(fd, PDL_TCP_OP_HELLO_AUTH, body, sizeof(body), buf, sizeof(buf), &got), 0);
    assert_int_equal(got, 2 * PDL_TCP_AUTH_LEN); /* the owner's nonce and MAC: nothing of the region */
    uint8_t fake[PDL_TCP_AUTH_LEN];
    memset(fake, 0xa5, sizeof(fake));
    assert_int_equal(raw_step(fd, PDL_TCP_OP_AUTH, fake, sizeof(fake), buf, sizeof(buf), &got), PDL_ERR_DENIED);
    assert_non_null(strstr((char *)buf, "proof of the cluster key is wrong"));
    assert_closed(fd);

    /* Replaying an earlier owner answer is no use either: each connection draws a fresh nonce. */
    fd = raw_connect(port);
    assert_int_equal(raw_step(fd, PDL_TCP_OP_HELLO_AUTH, body, sizeof(body), buf, sizeof(buf), &got), 0);
    uint8_t first[2 * PDL_TCP_AUTH_LEN];
    memcpy(first, buf, sizeof(first));
    close(fd);
    fd = raw_connect(port);
    assert_int_equal(raw_step(fd, PDL_TCP_OP_HELLO_AUTH, body, sizeof(body), buf, sizeof(buf), &got), 0);
    assert_memory_not_equal(first, buf, sizeof(first));
    close(fd);

    assert_int_equal(owner_refused(p.owner), 3);
    assert_int_equal(peer_refused(p.owner, "127.0.0.1"), 3);
    pdl_engine_stats_t st;
    pdl_engine_get_stats(p.owner, &st);
    assert_int_equal(st.requests_served, 0);
    assert_int_equal(st.bytes_served, 0);
    pair_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_key_moves_data),
        cmocka_unit_test(keyless_and_wrong_key_refused),
        cmocka_unit_test(owner_without_key_refused),
        cmocka_unit_test(raw_outsider_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
