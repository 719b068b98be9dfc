/*
 * test_connector_faults.c -- races and faults of the READ flow (docs/protocol.md#read-flow, #leases): a release before
 * the hold (parked, then counted), duplicate and late releases, a consumer that never reads (reaped,
 * counted as expired), keepalives, a read that fails (release with status "failed", load error), a
 * peer that does not answer, a handshake mismatch (error naming the field and both values, other
 * peers unaffected), missing peer addresses, WRITE mode refused. Assertions are on counters and
 * states, never on timing (waits poll with generous deadlines).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <zmq.h>

#include "pdlink/pull_hook.h"
#include "test_connector_util.h"

#define TOTAL 16

/* One frame to a notify port through a fresh DEALER (linger so it is delivered). */
static void send_frame(int port, const void *data, size_t len)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 5000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
    assert_int_equal(zmq_connect(s, ep), 0);
    assert_true(zmq_send(s, data, len, 0) >= 0);
    zmq_close(s);
    zmq_ctx_term(ctx);
}

static void send_release(pdl_instance_t *p, int prank, const char *tid, int csize, int crank, bool failed)
{
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_RELEASE);
    snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
    m.consumer_tp_size = csize;
    m.consumer_tp_rank = crank;
    if (failed)
        m.status = PDL_RELEASE_FAILED;
    pdl_bytes_t b;
    assert_int_equal(pdl_wire_encode_msg(&m, &b, NULL), PDL_OK);
    send_frame(pdl_instance_notify_port(p, prank), b.data, b.len);
    pdl_bytes_free(&b);
    pdl_msg_clear(&m);
}

static void send_keepalive(pdl_instance_t *p, int prank, const char *tid)
{
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_KEEPALIVE);
    snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
    pdl_bytes_t b;
    assert_int_equal(pdl_wire_encode_msg(&m, &b, NULL), PDL_OK);
    send_frame(pdl_instance_notify_port(p, prank), b.data, b.len);
    pdl_bytes_free(&b);
    pdl_msg_clear(&m);
}

typedef struct ctr_cond {
    pdl_instance_t *inst;
    int rank;
    size_t off;
    uint64_t want;
} ctr_cond_t;

static bool ctr_reached(void *arg)
{
    ctr_cond_t *c = arg;
    return tc_get(c->inst, c->rank, c->off) >= c->want;
}

#define WAIT_CTR(inst_, rank_, field_, want_)                                                                       \
    do {                                                                                                            \
        ctr_cond_t cc_ = {(inst_), (rank_), offsetof(pdl_rank_counters_t, field_), (want_)};                        \
        assert_true(tc_wait_for(ctr_reached, &cc_, 20000));                                                         \
    } while (0)

static void faults_release_before_hold(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_SHM, 60, NULL);
    assert_non_null(p);
    /* P2/D4: consumers 0,1 release producer rank 0; consumers 2,3 release rank 1 -- all early. */
    send_release(p, 0, "early", 4, 0, false);
    send_release(p, 0, "early", 4, 1, false);
    send_release(p, 1, "early", 4, 2, false);
    WAIT_CTR(p, 0, releases_parked, 2);
    WAIT_CTR(p, 1, releases_parked, 1);
    uint32_t ids[2];
    assert_int_equal(pdl_instance_alloc_blocks(p, 2, ids, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(p, "early", ids, 2, NULL), PDL_OK);
    /* rank 0 was complete at the hold; rank 1 still waits for consumer 3 */
    assert_int_equal(TC_GET(p, 0, transfers), 1);
    assert_int_equal(TC_GET(p, 1, transfers), 0);
    assert_int_equal(pdl_instance_held_transfers(p), 1);
    send_release(p, 1, "early", 4, 3, false);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    assert_int_equal(TC_GET(p, 1, transfers), 1);
    assert_int_equal(TC_SUM(p, releases_received), 4);
    assert_int_equal(TC_SUM(p, releases_parked), 3);
    assert_int_equal(TC_SUM(p, releases_parked_dropped), 0);
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL);
    pdl_instance_destroy(p);
}

static void faults_duplicate_and_late(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_SHM, 60, NULL);
    assert_non_null(p);
    uint32_t ids[2];
    assert_int_equal(pdl_instance_alloc_blocks(p, 2, ids, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(p, "dup", ids, 2, NULL), PDL_OK);
    send_release(p, 0, "dup", 4, 0, false);
    send_release(p, 0, "dup", 4, 0, false); /* the same consumer rank again: counted once */
    WAIT_CTR(p, 0, releases_duplicate, 1);
    assert_int_equal(TC_GET(p, 0, transfers), 0);
    send_release(p, 0, "dup", 4, 1, false); /* a distinct rank: completes rank 0 */
    WAIT_CTR(p, 0, transfers, 1);
    send_frame(pdl_instance_notify_port(p, 1), "dup", 3); /* legacy string: one release, consumer_tp_size 1 */
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    send_release(p, 0, "dup", 4, 0, false); /* after the report: still a duplicate of rank 0 */
    send_release(p, 0, "dup", 4, 3, false); /* a rank never seen: late */
    send_frame(pdl_instance_notify_port(p, 0), "dup", 3); /* legacy after the report: late */
    WAIT_CTR(p, 0, releases_late, 2);
    assert_int_equal(TC_GET(p, 0, releases_duplicate), 2);
    assert_int_equal(TC_GET(p, 0, releases_received), 6);
    assert_int_equal(TC_GET(p, 1, releases_received), 1);
    assert_int_equal(TC_GET(p, 0, transfers), 1);
    assert_int_equal(TC_GET(p, 1, transfers), 1);
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL);
    pdl_instance_destroy(p);
}

typedef struct ev_exp {
    _Atomic int expired, freed;
} ev_exp_t;

static void on_ev(void *arg, pdl_instance_event_t ev, const char *tid, int rank)
{
    (void)tid;
    (void)rank;
    ev_exp_t *e = arg;
    if (ev == PDL_EVENT_RANK_EXPIRED)
        atomic_fetch_add(&e->expired, 1);
    if (ev == PDL_EVENT_FREED)
        atomic_fetch_add(&e->freed, 1);
}

static void faults_consumer_never_reads(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_SHM, 0.2, NULL);
    assert_non_null(p);
    ev_exp_t ev = {0};
    pdl_instance_set_event_fn(p, on_ev, &ev);
    uint32_t ids[3];
    assert_int_equal(pdl_instance_alloc_blocks(p, 3, ids, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(p, "never", ids, 3, NULL), PDL_OK);
    assert_int_equal(pdl_instance_held_blocks(p), 3);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    assert_int_equal(TC_GET(p, 0, expired), 1);
    assert_int_equal(TC_GET(p, 1, expired), 1);
    assert_int_equal(TC_SUM(p, transfers), 0);
    assert_int_equal(atomic_load(&ev.expired), 2);
    assert_int_equal(atomic_load(&ev.freed), 1);
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL);
    send_release(p, 0, "never", 2, 0, false); /* the consumer shows up after all: late */
    WAIT_CTR(p, 0, releases_late, 1);
    pdl_instance_destroy(p);
}

static void faults_keepalive_counted(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 1, &g, TOTAL, PDL_BACKEND_SHM, 60, NULL);
    assert_non_null(p);
    uint32_t ids[1];
    assert_int_equal(pdl_instance_alloc_blocks(p, 1, ids, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(p, "ka", ids, 1, NULL), PDL_OK);
    send_keepalive(p, 0, "ka");
    send_keepalive(p, 0, "ka");
    send_keepalive(p, 0, "not-held"); /* ignored, not counted */
    WAIT_CTR(p, 0, keepalives_received, 2);
    assert_int_equal(pdl_instance_held_transfers(p), 1); /* a keepalive never counts as a release */
    send_release(p, 0, "ka", 1, 0, false);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    assert_int_equal(TC_GET(p, 0, keepalives_received), 2);
    assert_int_equal(TC_GET(p, 0, expired), 0);
    assert_int_equal(TC_GET(p, 0, dropped_malformed), 0);
    pdl_instance_destroy(p);
}

/* A read that fails: the consumer releases with status "failed", the pull is a load error. */
static void faults_read_fails(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 2, &g, TOTAL, PDL_BACKEND_SHM, 60, 60, NULL, NULL));
    uint32_t ids[2], local[2];
    assert_int_equal(pdl_instance_alloc_blocks(p, 2, ids, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 2, local, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(p, "bad-read", ids, 2, NULL), PDL_OK);
    uint32_t lie[2] = {ids[0], 9999}; /* a block outside the producer's KV cache */
    pdl_kv_params_t kp;
    tc_params(p, "bad-read", lie, 2, &kp);
    pdl_pull_t *pull;
    pdl_error_t e;
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, local, 2, &pull, &e), PDL_OK);
    pdl_status_t st = pdl_pull_wait(pull, 30000, &e);
    assert_int_not_equal(st, PDL_OK);
    assert_non_null(strstr(e.msg, "9999"));
    pdl_pull_free(pull);
    pdl_kv_params_clear(&kp);
    assert_true(tc_wait_for(tc_no_held, p, 20000)); /* freed by the failed releases, not by the reaper */
    assert_int_equal(TC_GET(p, 0, releases_failed_status), 2);
    assert_int_equal(TC_GET(p, 0, transfers), 1);
    assert_int_equal(TC_GET(p, 0, expired), 0);
    assert_int_equal(TC_SUM(c, read_failures), 2);
    assert_int_equal(TC_SUM(c, transfers), 0);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void with_head_dim_16(pdl_instance_config_t *c) { c->model.head_dim = 16; }

/* A handshake mismatch fails the pulls that need that peer with a message naming the field and both
 * values; a pull from a compatible producer in the same consumer is unaffected. */
static void faults_handshake_mismatch(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *good = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_SHM, 60, NULL);
    pdl_instance_t *bad = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_SHM, 60, with_head_dim_16);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 4, &g, TOTAL, PDL_BACKEND_SHM, 60, NULL);
    assert_non_null(good);
    assert_non_null(bad);
    assert_non_null(c);
    uint32_t gi[2], bi[2], l1[2], l2[2];
    assert_int_equal(pdl_instance_alloc_blocks(good, 2, gi, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(bad, 2, bi, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 2, l1, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 2, l2, NULL), PDL_OK);
    tc_fill(good, 8, false, gi, 2, 77);
    assert_int_equal(pdl_instance_hold(good, "g", gi, 2, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(bad, "b", bi, 2, NULL), PDL_OK);
    pdl_kv_params_t kg, kb;
    tc_params(good, "g", gi, 2, &kg);
    tc_params(bad, "b", bi, 2, &kb);
    pdl_pull_t *pg, *pb;
    pdl_error_t e;
    assert_int_equal(pdl_instance_pull(c, &kb, NULL, l2, 2, &pb, &e), PDL_OK);
    assert_int_equal(pdl_instance_pull(c, &kg, NULL, l1, 2, &pg, &e), PDL_OK);
    assert_int_equal(pdl_pull_wait(pb, 30000, &e), PDL_ERR_MISMATCH);
    assert_non_null(strstr(e.msg, "head_dim"));
    assert_non_null(strstr(e.msg, "local 8"));
    assert_non_null(strstr(e.msg, "remote 16"));
    assert_int_equal(pdl_pull_wait(pg, 30000, &e), PDL_OK);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, l1, 2, 77, &checked), 0);
    assert_true(checked > 0);
    /* the blocks of the pull that failed do not hold the good data: verification is not vacuous */
    uint64_t checked2 = 0;
    assert_true(tc_verify(c, 8, false, l2, 2, 77, &checked2) > 0);
    pdl_pull_free(pg);
    pdl_pull_free(pb);
    pdl_kv_params_clear(&kg);
    pdl_kv_params_clear(&kb);
    assert_true(TC_SUM(c, handshake_failures) >= 4);
    /* the incompatible producer still gets failed releases and frees its blocks */
    assert_true(tc_wait_for(tc_no_held, bad, 20000));
    assert_true(tc_wait_for(tc_no_held, good, 20000));
    assert_int_equal(TC_SUM(bad, releases_failed_status), 4);
    assert_int_equal(TC_SUM(good, releases_failed_status), 0);
    pdl_instance_destroy(c);
    pdl_instance_destroy(bad);
    pdl_instance_destroy(good);
}

static void short_handshake(pdl_instance_config_t *c) { c->conn.handshake_timeout_s = 0.3; }

/* A producer that does not answer (its ports accept connections, nothing replies): the handshake
 * times out, the pull fails, nothing hangs. A producer whose ports are closed fails at once with
 * "Connection refused" (no handshake_timeout: the connect probe in peer.c). */
static void faults_handshake_timeout(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 2, &g, TOTAL, PDL_BACKEND_SHM, 60, short_handshake);
    assert_non_null(c);
    int fds[2];
    int port = tc_blackhole(2, fds);
    assert_true(port > 0);
    pdl_kv_params_t kp;
    pdl_kv_params_init(&kp);
    snprintf(kp.transfer_id, sizeof(kp.transfer_id), "nobody");
    snprintf(kp.remote_host, sizeof(kp.remote_host), "127.0.0.1");
    kp.remote_handshake_port = port;
    kp.remote_notify_port = port + 2;
    kp.tp_size = 2;
    uint32_t rb[1] = {0}, lb[1];
    kp.remote_block_ids = rb;
    kp.num_remote_blocks = 1;
    kp.has_remote_block_ids = true;
    assert_int_equal(pdl_instance_alloc_blocks(c, 1, lb, NULL), PDL_OK);
    pdl_pull_t *pull;
    pdl_error_t e;
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, lb, 1, &pull, &e), PDL_OK);
    assert_int_equal(pdl_pull_wait(pull, 60000, &e), PDL_ERR_TIMEOUT);
    assert_non_null(strstr(e.msg, "no reply"));
    pdl_pull_free(pull);
    assert_int_equal(TC_SUM(c, handshake_failures), 2);
    assert_int_equal(TC_SUM(c, read_failures), 2);
    for (int i = 0; i < 2; i++)
        close(fds[i]);
    /* Now closed: refused at once -- by a consumer that has not seen this address fail, so the first
     * failure's backoff (kept per dialled address) does not apply. */
    pdl_instance_t *c2 = tc_instance(PDL_ROLE_CONSUMER, 2, &g, TOTAL, PDL_BACKEND_SHM, 60, short_handshake);
    assert_non_null(c2);
    assert_int_equal(pdl_instance_alloc_blocks(c2, 1, lb, NULL), PDL_OK);
    assert_int_equal(pdl_instance_pull(c2, &kp, NULL, lb, 1, &pull, &e), PDL_OK);
    assert_int_equal(pdl_pull_wait(pull, 60000, &e), PDL_ERR_PEER_GONE);
    assert_non_null(strstr(e.msg, "refused"));
    pdl_pull_free(pull);
    assert_int_equal(TC_SUM(c2, handshake_failures), 2);
    kp.remote_block_ids = NULL;
    pdl_instance_destroy(c2);
    pdl_instance_destroy(c);
}

/* Peer address from the request id when the params lack it; neither → a clear error. */
/* A hold the producer drops (its request was aborted after the hold): the pull that comes anyway is
 * refused, the blocks are back in the allocator at once, and a second drop finds nothing. */
static void faults_dropped_hold_is_gone_at_once(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_SHM, 60, 60, NULL, NULL));
    size_t free_before = pdl_instance_free_block_count(p);
    uint32_t ids[2], lb[2];
    assert_int_equal(pdl_instance_alloc_blocks(c, 2, lb, NULL), PDL_OK);
    assert_int_equal(tc_hold_filled(p, "dropped", 8, false, ids, 2, 9), PDL_OK);
    assert_int_equal(pdl_instance_held_transfers(p), 1);
    pdl_error_t e;
    assert_int_equal(pdl_instance_drop(p, "dropped", &e), PDL_OK);
    assert_int_equal(pdl_instance_held_transfers(p), 0);
    assert_int_equal(pdl_instance_held_blocks(p), 0);
    assert_int_equal(pdl_instance_free_block_count(p), free_before);
    assert_int_equal(pdl_instance_drop(p, "dropped", &e), PDL_ERR_NOT_FOUND);
    assert_non_null(strstr(e.msg, "dropped"));
    assert_int_equal(pdl_instance_drop(p, "never-held", &e), PDL_ERR_NOT_FOUND);
    pdl_kv_params_t kp;
    tc_params(p, "dropped", ids, 2, &kp);
    assert_int_not_equal(tc_pull_wait(c, &kp, lb, 2, &e), PDL_OK);
    pdl_kv_params_clear(&kp);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void faults_peer_address_sources(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_SHM, 60, 60, NULL, NULL));
    uint32_t ids[1], lb[1];
    assert_int_equal(pdl_instance_alloc_blocks(c, 1, lb, NULL), PDL_OK);
    assert_int_equal(tc_hold_filled(p, "rid", 8, false, ids, 1, 5), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "rid", ids, 1, &kp);
    kp.remote_host[0] = '\0';
    kp.remote_handshake_port = 0;
    kp.remote_notify_port = 0;
    pdl_pull_t *pull;
    pdl_error_t e;
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, lb, 1, &pull, &e), PDL_ERR_INVALID);
    assert_non_null(strstr(e.msg, "remote_host"));
    char rid[1024];
    uint8_t uuid[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    assert_true(pdl_wire_format_request_id(pdl_instance_zmq_address(p), pdl_instance_zmq_address(c), uuid, rid,
                                           sizeof(rid)) > 0);
    char wrapped[1100];
    snprintf(wrapped, sizeof(wrapped), "cmpl-%s-0", rid);
    assert_int_equal(pdl_instance_pull(c, &kp, wrapped, lb, 1, &pull, &e), PDL_OK);
    assert_int_equal(pdl_pull_wait(pull, 30000, &e), PDL_OK);
    pdl_pull_free(pull);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, lb, 1, 5, &checked), 0);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    pdl_kv_params_clear(&kp);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void dp1_of_2(pdl_instance_config_t *c)
{
    c->dp_rank = 1;
    c->dp_size = 2;
}

/* DP rank 1 of 2 listens on base + 1*tp + rank (injective, docs/topology.md#ports), and a consumer given
 * remote_dp_rank 1 dials exactly those ports. */
static void faults_dp_rank_ports(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 2, 4, &g, TOTAL, PDL_BACKEND_SHM, 60, 60, dp1_of_2, NULL));
    pdl_kv_params_t kp;
    uint32_t ids[2], lb[2];
    assert_int_equal(pdl_instance_alloc_blocks(p, 2, ids, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 2, lb, NULL), PDL_OK);
    tc_params(p, "dp1", ids, 2, &kp);
    assert_int_equal(pdl_instance_handshake_port(p, 0), kp.remote_handshake_port + 2);
    assert_int_equal(pdl_instance_notify_port(p, 1), kp.remote_notify_port + 3);
    assert_int_equal(kp.remote_dp_rank, 1);
    tc_fill(p, 8, false, ids, 2, 21);
    assert_int_equal(pdl_instance_hold(p, "dp1", ids, 2, NULL), PDL_OK);
    pdl_pull_t *pull;
    pdl_error_t e;
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, lb, 2, &pull, &e), PDL_OK);
    if (pdl_pull_wait(pull, 30000, &e) != PDL_OK)
        fail_msg("pull from DP rank 1: %s", e.msg);
    pdl_pull_free(pull);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, lb, 2, 21, &checked), 0);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    assert_int_equal(TC_SUM(p, releases_received), 4);
    pdl_kv_params_clear(&kp);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static int g_ping_port;
static void with_proxy(pdl_instance_config_t *c)
{
    snprintf(c->conn.proxy_ip, sizeof(c->conn.proxy_ip), "127.0.0.1");
    c->conn.proxy_ping_port = g_ping_port;
    c->conn.http_port = 8123;
}

/* Rank 0 registers with the router every 3 s, keeps retrying while the router is absent, and an
 * absent router never blocks shutdown. */
static void faults_discovery_ping(void **state)
{
    (void)state;
    g_ping_port = tp_free_range(1);
    assert_true(g_ping_port > 0);
    tc_geo_t g = tc_geo_default(8);
    /* router absent for the whole life of this instance: destroy must still return */
    pdl_instance_t *lonely = tc_instance(PDL_ROLE_CONSUMER, 1, &g, TOTAL, PDL_BACKEND_SHM, 60, with_proxy);
    assert_non_null(lonely);
    pdl_instance_destroy(lonely);

    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_SHM, 60, with_proxy);
    assert_non_null(p);
    tc_sleep_ms(100); /* the first ping goes out while nobody listens */
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://*:%d", g_ping_port);
    assert_int_equal(zmq_bind(router, ep), 0);
    pdl_registration_t reg;
    pdl_error_t e;
    if (tc_recv_registration(router, 30000, &reg, &e) != PDL_OK)
        fail_msg("%s", e.msg);
    assert_int_equal(reg.type, 'P');
    assert_string_equal(reg.zmq_address, pdl_instance_zmq_address(p));
    assert_string_equal(reg.http_address, "127.0.0.1:8123");
    assert_int_equal(reg.tp_size, 2);
    assert_int_equal(reg.dp_size, 1);
    assert_false(reg.write_mode);
    pdl_instance_destroy(p);
    zmq_close(router);
    zmq_ctx_term(ctx);
}

/* Holds a lane: waits until the test queued the next pull, then 1.1 s more, so that pull provably
 * waited over 1 s in its lane's queue (the keepalive threshold). */
typedef struct slow_hook {
    atomic_int go;
} slow_hook_t;

static void slow_rank(void *arg, int rank)
{
    (void)rank;
    slow_hook_t *h = arg;
    while (!atomic_load(&h->go))
        tc_sleep_ms(1);
    tc_sleep_ms(1100);
}

/* A pull that waited more than 1 s in its lane's queue (behind a pull whose hook holds the lane)
 * extends the producer's lease with a keepalive -- to a pdlink peer only -- then reads. */
static void faults_keepalive_from_queued_pull(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_SHM, 60, 60, NULL, NULL));
    uint32_t w[1], q[1], sl[1], lw[1], lq[1], ls[1];
    assert_int_equal(pdl_instance_alloc_blocks(p, 1, w, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(p, 1, q, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(p, 1, sl, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 1, lw, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 1, lq, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 1, ls, NULL), PDL_OK);
    tc_fill(p, 8, false, q, 1, 31);
    assert_int_equal(pdl_instance_hold(p, "warm", w, 1, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(p, "queued", q, 1, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(p, "slow", sl, 1, NULL), PDL_OK);
    pdl_kv_params_t kw, kq, ks;
    tc_params(p, "warm", w, 1, &kw);
    tc_params(p, "queued", q, 1, &kq);
    tc_params(p, "slow", sl, 1, &ks);
    pdl_pull_t *pw, *ps, *pq;
    pdl_error_t e;
    assert_int_equal(pdl_instance_pull(c, &kw, NULL, lw, 1, &pw, &e), PDL_OK); /* caches the pdlink peer */
    assert_int_equal(pdl_pull_wait(pw, 30000, &e), PDL_OK);
    assert_int_equal(TC_GET(c, 0, keepalives_sent), 0);
    /* A third transfer with a hook that holds the lane ("warm" again would be refused: its grant went
     * with its release). */
    slow_hook_t h = {0};
    assert_int_equal(pdl_instance_pull_hooked(c, &ks, NULL, ls, 1, slow_rank, &h, NULL, &ps, &e), PDL_OK);
    assert_int_equal(pdl_instance_pull(c, &kq, NULL, lq, 1, &pq, &e), PDL_OK);
    atomic_store(&h.go, 1);
    assert_int_equal(pdl_pull_wait(ps, 30000, &e), PDL_OK);
    assert_int_equal(pdl_pull_wait(pq, 30000, &e), PDL_OK);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, lq, 1, 31, &checked), 0);
    assert_int_equal(TC_GET(c, 0, keepalives_sent), 1);
    WAIT_CTR(p, 0, keepalives_received, 1);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    pdl_pull_free(pw);
    pdl_pull_free(ps);
    pdl_pull_free(pq);
    pdl_kv_params_clear(&kw);
    pdl_kv_params_clear(&kq);
    pdl_kv_params_clear(&ks);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void write_mode(pdl_instance_config_t *c) { c->conn.read_mode = false; }

static void faults_write_mode_refused(void **state)
{
    (void)state;
    pdl_instance_config_t c;
    pdl_instance_config_defaults(&c);
    pdl_connector_config_defaults(&c.conn);
    c.model.num_layers = 1;
    c.model.total_kv_heads = 1;
    c.model.head_dim = 8;
    c.model.elem_size = 1;
    c.model.block_size = 4;
    c.model.kv_separate = true;
    c.tp_size = 1;
    c.dp_size = 1;
    c.num_blocks = 4;
    write_mode(&c);
    pdl_instance_t *inst = NULL;
    pdl_error_t e;
    assert_int_equal(pdl_instance_create(&c, &inst, &e), PDL_ERR_UNSUPPORTED);
    assert_null(inst);
    assert_non_null(strstr(e.msg, "read_mode"));
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(faults_release_before_hold),
        cmocka_unit_test(faults_duplicate_and_late),
        cmocka_unit_test(faults_consumer_never_reads),
        cmocka_unit_test(faults_keepalive_counted),
        cmocka_unit_test(faults_read_fails),
        cmocka_unit_test(faults_handshake_mismatch),
        cmocka_unit_test(faults_handshake_timeout),
        cmocka_unit_test(faults_peer_address_sources),
        cmocka_unit_test(faults_dropped_hold_is_gone_at_once),
        cmocka_unit_test(faults_write_mode_refused),
        cmocka_unit_test(faults_dp_rank_ports),
        cmocka_unit_test(faults_discovery_ping),
        cmocka_unit_test(faults_keepalive_from_queued_pull),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
