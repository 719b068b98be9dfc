/*
 * test_security_bound.c -- grants and parked releases bound to the party the transfer names
 * (docs/security.md, "Bound to the producer; parked releases; the control memfd"). 127.0.0.2 plays
 * another host (loopback routes all of 127/8); every wait is on a counter or a state, with a bound that
 * only a failure reaches.
 *
 * - write_grant_bound_to_host: the engine alone. A WRITE grant made for 127.0.0.1 is refused to a data
 *   connection from 127.0.0.2 that names it (PDL_ERR_DENIED, 0 bytes written) and served to one from
 *   127.0.0.1; an unbound grant is served to both. Before, the grant had no host: both were served.
 * - outsider_cannot_write_into_a_receive: WRITE mode, a decode expecting a push from the prefill on
 *   127.0.0.1. An outsider on 127.0.0.2 that knows the transfer id and the block ids writes 32 bytes into
 *   the expected blocks under the transfer's grant: refused, the blocks' bytes unchanged, and the real
 *   push lands and verifies. Before, the write landed (the receive would then go on from the outsider's
 *   bytes wherever the producer had not written yet, or had already written: layer by layer).
 * - parked_release_bound_to_consumer: READ mode. A release from 127.0.0.2 for a transfer not held yet
 *   (parked) does not complete the hold made afterwards for the decode at 127.0.0.1: it is refused when
 *   the hold is made (releases_refused), the blocks stay held, and the decode's own release frees them.
 *   Before, the parked release completed the hold at once and freed the blocks unread.
 * - shm_control_memfd_sealed: the shm engine's control memfd (live registrations, published grants) is
 *   mode 0400 and sealed against writes: a same-uid peer opening it read-write through /proc cannot
 *   write or map it writable. Before, it was mode 0777 with no seal.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <zmq.h>

#include "../unit/tcp_raw_testutil.h"
#include "connector/internal.h"
#include "engine/backend.h"
#include "pdlink/engine.h"
#include "test_connector_util.h"

#define TOTAL 16
#define NBLK 2
#define LOOP2 0x7f000002u /* 127.0.0.2 */

/* ---- raw data-plane client (tcp wire frames, as an outsider's own program sends them) ----------------- */

static int raw_hello_from(uint16_t port, const char *key, uint32_t src)
{
    int fd = raw_dial(port, src);
    uint8_t h[PDL_TCP_REQ_HDR];
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, PDL_TCP_OP_HELLO, 0, 0, 0, strlen(key), 0};
    pdl_tcp_req_encode(h, &r);
    assert_int_equal(send(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
    assert_int_equal(send(fd, key, strlen(key), 0), (ssize_t)strlen(key));
    uint8_t buf[PDL_TCP_MAX_MSG + 1];
    uint64_t got;
    assert_int_equal(raw_response(fd, -1, buf, sizeof(buf), &got), 0);
    return fd;
}

/* One WRITE of `len` bytes of `byte` at `off` of registration `id` under grant `grant`; the status. */
static int32_t raw_write(int fd, uint64_t id, const char *grant, uint64_t off, uint64_t len, uint8_t byte,
                         char *msg, size_t cap)
{
    uint8_t h[PDL_TCP_REQ_HDR], seg[PDL_TCP_SEG], payload[256];
    assert_true(len <= sizeof(payload));
    uint32_t glen = (uint32_t)strlen(grant);
    pdl_tcp_req_t r = {PDL_TCP_REQ_MAGIC, PDL_TCP_VERSION, PDL_TCP_OP_WRITE, 1, glen, id, len, 7};
    pdl_tcp_req_encode(h, &r);
    pdl_tcp_put64(seg, off);
    pdl_tcp_put64(seg + 8, len);
    memset(payload, byte, len);
    assert_int_equal(send(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
    assert_int_equal(send(fd, seg, sizeof(seg), 0), (ssize_t)sizeof(seg));
    assert_int_equal(send(fd, grant, glen, 0), (ssize_t)glen);
    assert_int_equal(send(fd, payload, len, 0), (ssize_t)len);
    uint8_t buf[PDL_TCP_MAX_MSG + 1];
    uint64_t got;
    int32_t st = raw_response(fd, 7, buf, sizeof(buf), &got);
    snprintf(msg, cap, "%s", (char *)buf);
    return st;
}

static void write_grant_bound_to_host(void **state)
{
    (void)state;
    pdl_engine_config_t oc = {.key = "decode:tp1", .host = "127.0.0.1", .backend = PDL_BACKEND_TCP,
                              .qp_per_transfer = 1, .num_workers = 1};
    pdl_engine_t *e;
    pdl_mem_t *m;
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&oc, &e, &err), PDL_OK);
    assert_int_equal(pdl_engine_alloc_mem(e, 65536, &m, &err), PDL_OK);
    pdl_mem_guard(m);
    uint8_t *mem = pdl_mem_ptr(m);
    pdl_range_t rg = {4096, 4096};
    assert_int_equal(pdl_engine_grant_to(e, m, "tx-bound", PDL_GRANT_WRITE, &rg, 1, "127.0.0.1", &err), PDL_OK);
    assert_int_equal(pdl_engine_grant(e, m, "tx-open", PDL_GRANT_WRITE, &rg, 1, &err), PDL_OK);
    char many[PDL_GRANT_PEER_MAX + 8];
    memset(many, '1', sizeof(many) - 1);
    many[sizeof(many) - 1] = '\0';
    assert_int_equal(pdl_engine_grant_to(e, m, "tx-long", PDL_GRANT_WRITE, &rg, 1, many, &err), PDL_ERR_INVALID);
    char msg[PDL_TCP_MAX_MSG + 1];
    int other = raw_hello_from(pdl_engine_port(e), "decode:tp1", LOOP2);
    int same = raw_hello_from(pdl_engine_port(e), "decode:tp1", 0);
    assert_int_equal(raw_write(other, pdl_mem_id(m), "tx-bound", 4096, 32, 0xAA, msg, sizeof(msg)), PDL_ERR_DENIED);
    assert_non_null(strstr(msg, "denied: grant tx-bound is bound to another host than 127.0.0.2"));
    assert_int_equal(mem[4096], 0);
    assert_int_equal(raw_write(same, pdl_mem_id(m), "tx-bound", 4096, 32, 0xBB, msg, sizeof(msg)), 0);
    assert_int_equal(mem[4096], 0xBB);
    /* An unbound grant serves any host, as before. */
    assert_int_equal(raw_write(other, pdl_mem_id(m), "tx-open", 4128, 32, 0xCC, msg, sizeof(msg)), 0);
    assert_int_equal(mem[4128], 0xCC);
    pdl_engine_stats_t st;
    pdl_engine_get_stats(e, &st);
    assert_int_equal(st.requests_denied, 1);
    printf("bound grant: 127.0.0.2 denied (0 bytes), 127.0.0.1 served; unbound grant served to 127.0.0.2\n");
    close(other);
    close(same);
    pdl_engine_deregister_mem(e, m);
    pdl_engine_destroy(e);
}

static void write_mode(pdl_instance_config_t *c) { tc_write_slow(c); }

static void outsider_cannot_write_into_a_receive(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, 600, write_mode, write_mode));
    tc_push_leg_t l;
    assert_int_equal(tc_push_leg(&l, p, c, "tx-inj", 51, 8, NBLK, 9), PDL_OK);
    pdl_recv_t *rv;
    pdl_error_t e;
    assert_int_equal(pdl_instance_expect_push(c, &l.ck, l.rid, l.cb, NBLK, &rv, &e), PDL_OK);
    /* The outsider knows the transfer id and the decode's block ids (it is a client of both nodes). */
    pdl_rank_mem_t *cm = &c->ranks[0].mem;
    pdl_range_t blk[2];
    assert_int_equal(pdl__rank_block_ranges(cm, 0, 1, l.cb, 1, blk), 2);
    uint8_t *base = pdl_mem_ptr(pdl__layer_mem(cm, 0));
    uint8_t before[32];
    memcpy(before, base + blk[0].off, sizeof(before));
    int fd = raw_hello_from(pdl_engine_port(cm->engine), pdl_engine_key(cm->engine), LOOP2);
    char msg[PDL_TCP_MAX_MSG + 1];
    int32_t st = raw_write(fd, pdl_mem_id(pdl__layer_mem(cm, 0)), "tx-inj", blk[0].off, 32, 0xEE, msg, sizeof(msg));
    if (st != PDL_ERR_DENIED)
        fail_msg("the outsider's write under the receive's grant got status %d (expected denied)", st);
    assert_memory_equal(base + blk[0].off, before, sizeof(before));
    close(fd);
    /* The real push lands and verifies. */
    assert_int_equal(pdl_instance_push(p, &l.pk, l.rid, l.pb, NBLK, &e), PDL_OK);
    if (pdl_recv_wait(rv, 60000, &e) != PDL_OK)
        fail_msg("receive: %s", e.msg);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, l.cb, NBLK, 9, &checked), 0);
    printf("outsider (127.0.0.2) write under tx-inj denied, 0 of 32 bytes changed; the push verified %" PRIu64
           " bytes\n", checked);
    pdl_recv_free(rv);
    tc_push_leg_clear(&l);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* ---- parked releases --------------------------------------------------------------------------------- */

static void send_release_from(const char *src, int port, const char *tid)
{
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_RELEASE);
    snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
    m.status = PDL_RELEASE_OK;
    pdl_bytes_t b;
    assert_int_equal(pdl_wire_encode_msg(&m, &b, NULL), PDL_OK);
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 2000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    char ep[96];
    snprintf(ep, sizeof(ep), "tcp://%s:0;127.0.0.1:%d", src, port); /* libzmq: source;destination */
    assert_int_equal(zmq_connect(s, ep), 0);
    assert_true(zmq_send(s, b.data, b.len, 0) >= 0);
    zmq_close(s);
    zmq_ctx_term(ctx);
    pdl_bytes_free(&b);
    pdl_msg_clear(&m);
}

static bool reached(pdl_instance_t *inst, size_t off, uint64_t want)
{
    tc_at_least_t w = {inst, off, want};
    return tc_wait_for(tc_sum_reached, &w, 60000);
}
#define REACHED(inst, field, want) reached((inst), offsetof(pdl_rank_counters_t, field), (want))

static void parked_release_bound_to_consumer(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, tc_watch_slow);
    assert_non_null(p);
    int notify = pdl_instance_notify_port(p, 0);
    /* Before the hold exists: parked, whoever sent it. */
    send_release_from("127.0.0.2", notify, "tx-pk1");
    assert_true(REACHED(p, releases_parked, 1));
    uint32_t pb[NBLK];
    pdl_error_t e;
    assert_int_equal(tc_hold_for(p, "host:127.0.0.1,handshake:9,notify:9", "tx-pk1", 3, pb, NBLK, &e), PDL_OK);
    assert_int_equal(TC_GET(p, 0, releases_refused), 1);
    assert_int_equal(pdl_instance_held_blocks(p), NBLK);
    /* The decode the request id names releases it. */
    send_release_from("127.0.0.1", notify, "tx-pk1");
    assert_true(tc_wait_for(tc_no_held, p, 60000));
    /* The same from the consumer's own host, parked first, still completes the hold when it is made. */
    send_release_from("127.0.0.1", notify, "tx-pk2");
    assert_true(REACHED(p, releases_parked, 2));
    assert_int_equal(tc_hold_for(p, "host:127.0.0.1,handshake:9,notify:9", "tx-pk2", 4, pb, NBLK, &e), PDL_OK);
    assert_true(tc_wait_for(tc_no_held, p, 60000));
    assert_int_equal(TC_GET(p, 0, releases_refused), 1);
    printf("parked release from 127.0.0.2 refused at the hold (blocks kept); the consumer's parked one completes\n");
    pdl_instance_destroy(p);
}

/* ---- the shm control memfd ------------------------------------------------------------------------- */

static void shm_control_memfd_sealed(void **state)
{
    (void)state;
    pdl_engine_config_t oc = {.key = "owner:shm", .host = "127.0.0.1", .backend = PDL_BACKEND_SHM,
                              .qp_per_transfer = 1, .num_workers = 1};
    pdl_engine_t *e;
    pdl_error_t err;
    assert_int_equal(pdl_engine_create(&oc, &e, &err), PDL_OK);
    pdl_mem_t *m;
    assert_int_equal(pdl_engine_alloc_mem(e, 65536, &m, &err), PDL_OK);
    pdl_range_t rg = {0, 4096};
    assert_int_equal(pdl_engine_grant(e, m, "tx-shm", PDL_GRANT_READ, &rg, 1, &err), PDL_OK);
    int ctl = e->ctl_fd;
    assert_true(ctl >= 0);
    struct stat sb;
    assert_int_equal(fstat(ctl, &sb), 0);
    if ((sb.st_mode & 0777) != 0400)
        fail_msg("control memfd mode %o (expected 0400)", (unsigned)(sb.st_mode & 0777));
    int seals = fcntl(ctl, F_GET_SEALS);
    assert_true(seals >= 0);
    assert_true(seals & F_SEAL_SEAL);
    assert_true(seals & (F_SEAL_SHRINK | F_SEAL_GROW));
    /* What a peer would do: reopen it through /proc (mode 0400 refuses write access to a non-root
     * owner; root passes the mode, and the seal then refuses writes and writable maps). */
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", ctl);
    int rw = open(path, O_RDWR);
    if (rw >= 0) {
        uint8_t b = 1;
        assert_true(pwrite(rw, &b, 1, 0) < 0);
        assert_true(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0) == MAP_FAILED);
        close(rw);
    }
    /* The owner still writes through its own mapping: a second grant is published and found. */
    assert_int_equal(pdl_engine_grant(e, m, "tx-shm2", PDL_GRANT_READ, &rg, 1, &err), PDL_OK);
    const pdl_grant_pub_t *pub = (const pdl_grant_pub_t *)((const uint8_t *)e->ctl + PDL_CTL_LIVE_BYTES);
    uint64_t slot, seq;
    assert_true(pdl__grant_pub_find(pub, "tx-shm2", pdl_mem_id(m), PDL_GRANT_READ, &slot, &seq));
    printf("control memfd: mode 0400, seals 0x%x, peer open O_RDWR %s\n", (unsigned)seals,
           rw >= 0 ? "allowed (root) but writes refused" : "refused");
    pdl_engine_deregister_mem(e, m);
    pdl_engine_destroy(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(write_grant_bound_to_host),
        cmocka_unit_test(outsider_cannot_write_into_a_receive),
        cmocka_unit_test(parked_release_bound_to_consumer),
        cmocka_unit_test(shm_control_memfd_sealed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
