/*
 * test_security.c -- the attacks of docs/security.md's compatible mode, each run against live instances (docs/security.md).
 *
 * - outsider_data_plane: an outsider fetches a tcp producer's handshake (get_meta_msg answers anyone),
 *   builds its own engine from the descriptors in it and reads the whole KV region, writes 16 bytes into
 *   a held block and reads a held block under a guessed grant name. Before: the read returned the
 *   region and the write landed. Now every one is refused (0 bytes), counted in data_requests_denied,
 *   and the real consumer's pull still verifies. What compatible mode cannot prevent is tested too: a
 *   peer that learned the transfer id reads that transfer's blocks while they are held (and nothing
 *   outside them, and nothing once the transfer is released).
 * - redirect_refused: one pull whose params claim the real prefill's remote_engine_id at another
 *   prefill's address. Before: the other prefill was cached under the real id and the next normal
 *   pull read from it. Now that pull is refused with both ids named and the next one verifies.
 * - forged_release_refused: a release from another host (127.0.0.2) than the consumer's. Before: it
 *   freed the held blocks before the consumer read them. Now it is refused and counted, before the read
 *   (the consumer named by the request id) and after it (the host the grant was served to).
 * - forged_write_abandon_refused: WRITE mode's failed release (the decode's abandon of a push) from
 *   127.0.0.2, after the push, parked before it, and over the decode's parked remote_blocks. Before: it
 *   freed the push unwritten. Now each is refused and counted; the pushes verify.
 * - write_mode_consumer_guarded: a WRITE-mode decode's region takes writes only into the blocks it expects
 *   a push into, under the transfer id, until the receive ends.
 * - trusted_hosts_enforced: trusted_hosts refuses a pull to a host outside it before dialling, and a
 *   prefill drops handshakes from hosts outside it.
 * - control_ports_bind_host_ip: with host_ip 127.0.0.1 the handshake and notify ports are not bound on
 *   every address (another loopback address can bind the same port); with bind_all they are.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <zmq.h>

#include "pdlink/engine.h"
#include "pdlink/wire.h"
#include "test_connector_util.h"
#include "test_listen.h"

#define TOTAL 16
#define NBLK 2

/* One reply of a handshake: [empty frame, payload]; the payload is copied into *out. */
static void recv_reply(void *s, pdl_bytes_t *out)
{
    zmq_msg_t f;
    int n = 0;
    int more = 1;
    while (more) {
        zmq_msg_init(&f);
        assert_true(zmq_msg_recv(&f, s, 0) >= 0);
        if (n == 1) {
            out->len = zmq_msg_size(&f);
            out->data = malloc(out->len);
            memcpy(out->data, zmq_msg_data(&f), out->len);
        }
        n++;
        more = zmq_msg_more(&f);
        zmq_msg_close(&f);
    }
    assert_int_equal(n, 2);
}

/* What an outsider builds from a rank's public handshake: its own tcp engine, a local region as large
 * as the rank's KV region, and a session to that region. */
typedef struct outsider {
    pdl_engine_t *e;
    pdl_mem_t *m;
    pdl_session_t *s;
    uint64_t size;
} outsider_t;

static void outsider_open(outsider_t *o, int hs_port)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", hs_port);
    assert_int_equal(zmq_connect(s, ep), 0);
    assert_true(zmq_send(s, PDL_WIRE_GET_META, strlen(PDL_WIRE_GET_META), 0) >= 0);
    pdl_bytes_t meta_b = {0}, layers_b = {0};
    recv_reply(s, &meta_b);
    recv_reply(s, &layers_b);
    zmq_close(s);
    zmq_ctx_term(ctx);
    pdl_agent_meta_t meta;
    pdl_layer_map_t lm;
    memset(&lm, 0, sizeof(lm));
    pdl_error_t e;
    assert_int_equal(pdl_wire_decode_agent_meta(meta_b.data, meta_b.len, &meta, &e), PDL_OK);
    assert_int_equal(pdl_wire_decode_layer_map(layers_b.data, layers_b.len, &lm, &e), PDL_OK);
    o->size = (uint64_t)meta.num_blocks * 2 * (uint64_t)meta.block_len * (uint64_t)meta.num_layers;
    pdl_engine_config_t cfg = {.key = "outsider", .host = "127.0.0.1", .backend = PDL_BACKEND_TCP,
                               .qp_per_transfer = 1, .num_workers = 1};
    assert_int_equal(pdl_engine_create(&cfg, &o->e, &e), PDL_OK);
    assert_int_equal(pdl_engine_alloc_mem(o->e, o->size, &o->m, &e), PDL_OK);
    assert_int_equal(pdl_engine_add_remote(o->e, meta.agent_metadata.data, meta.agent_metadata.len, NULL, 0, &e),
                     PDL_OK);
    if (pdl_session_open(o->e, o->m, lm.layers[0].descs[0].data, lm.layers[0].descs[0].len, &o->s, &e) != PDL_OK)
        fail_msg("outsider session: %s", e.msg);
    pdl_layer_map_clear(&lm);
    pdl_agent_meta_clear(&meta);
    pdl_bytes_free(&meta_b);
    pdl_bytes_free(&layers_b);
}

static void outsider_close(outsider_t *o)
{
    pdl_session_close(o->s);
    pdl_engine_deregister_mem(o->e, o->m);
    pdl_engine_destroy(o->e);
}

/* One op of `len` bytes at remote offset `off` under `grant` (NULL: none); the batch's status. */
static pdl_status_t outsider_op(outsider_t *o, pdl_op_t op, const char *grant, uint64_t off, uint64_t len,
                                pdl_error_t *err)
{
    pdl_desc_t d = {0, off, len};
    pdl_batch_t *b;
    pdl_status_t st = pdl_session_post_granted(o->s, op, grant, &d, 1, &b, err);
    if (st != PDL_OK)
        return st;
    st = pdl_batch_wait(b, -1, err);
    pdl_batch_free(b);
    return st;
}

static bool all_zero(const uint8_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] != 0)
            return false;
    return true;
}

static void pull_ok(pdl_instance_t *c, const pdl_kv_params_t *kp, const uint32_t *cb)
{
    pdl_error_t e;
    if (tc_pull_wait(c, kp, cb, NBLK, &e) != PDL_OK)
        fail_msg("pull: %s", e.msg);
}

static void outsider_data_plane(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, 60, NULL, NULL));
    uint32_t pb[NBLK], cb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
    assert_int_equal(tc_hold_filled(p, "tx-secret-1", 8, false, pb, NBLK, 7), PDL_OK);

    outsider_t o;
    outsider_open(&o, pdl_instance_handshake_port(p, 0));
    uint8_t *mine = pdl_mem_ptr(o.m);
    pdl_error_t e;
    /* The region holds the prompt's KV now; the outsider reads all of it. */
    assert_int_equal(outsider_op(&o, PDL_OP_READ, NULL, 0, o.size, &e), PDL_ERR_DENIED);
    assert_non_null(strstr(e.msg, "denied: the region is guarded and the request names no grant"));
    /* A held block's exact bytes: block pb[0] of layer 0 (K half) under a guessed grant name. */
    uint64_t layer_len = o.size / (uint64_t)g.layers;
    uint64_t blk = layer_len / 2 / TOTAL; /* kv_separate: [K blocks][V blocks] per layer */
    assert_int_equal(outsider_op(&o, PDL_OP_READ, "tx-secret-2", pb[0] * blk, blk, &e), PDL_ERR_DENIED);
    /* 16 bytes written into the held block would corrupt the consumer's KV. */
    memset(mine, 0xEE, 16);
    assert_int_equal(outsider_op(&o, PDL_OP_WRITE, NULL, pb[0] * blk, 16, &e), PDL_ERR_DENIED);
    assert_int_equal(outsider_op(&o, PDL_OP_WRITE, "tx-secret-1", pb[0] * blk, 16, &e), PDL_ERR_DENIED);
    memset(mine, 0, 16);
    assert_true(all_zero(mine, o.size));
    assert_int_equal(TC_GET(p, 0, data_requests_denied), 4);
    assert_int_equal(TC_GET(p, 0, data_requests_served), 0);

    /* What compatible mode cannot prevent: whoever learned the transfer id reads its held blocks
     * (only them) until the transfer is released. */
    assert_int_equal(outsider_op(&o, PDL_OP_READ, "tx-secret-1", pb[0] * blk, blk, &e), PDL_OK);
    assert_false(all_zero(mine, blk));
    uint32_t other = 0;
    while (other == pb[0] || other == pb[1])
        other++;
    assert_int_equal(outsider_op(&o, PDL_OP_READ, "tx-secret-1", other * blk, blk, &e), PDL_ERR_DENIED);

    /* The real consumer is unaffected: every byte verifies. */
    pdl_kv_params_t kp;
    tc_params(p, "tx-secret-1", pb, NBLK, &kp);
    pull_ok(c, &kp, cb);
    pdl_kv_params_clear(&kp);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, cb, NBLK, 7, &checked), 0);
    assert_true(tc_wait_for(tc_no_held, p, 60000));
    /* Released: the grant is gone with it. */
    assert_int_equal(outsider_op(&o, PDL_OP_READ, "tx-secret-1", pb[0] * blk, blk, &e), PDL_ERR_DENIED);
    assert_int_equal(TC_GET(p, 0, data_requests_denied), 6);
    assert_true(TC_GET(p, 0, data_requests_served) >= 2);
    /* Who read: every served request is on the one loopback peer's row. */
    pdl_engine_peer_stats_t rows[4];
    assert_int_equal(pdl_instance_peer_stats(p, 0, rows, 4), 1);
    assert_string_equal(rows[0].host, "127.0.0.1");
    assert_int_equal(rows[0].requests, TC_GET(p, 0, data_requests_served));
    printf("outsider: whole-region read, guessed-grant read, 2 writes, out-of-grant read, read after release: "
           "%llu requests denied, 0 bytes; the consumer verified %llu bytes\n",
           (unsigned long long)TC_GET(p, 0, data_requests_denied), (unsigned long long)checked);
    outsider_close(&o);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void redirect_refused(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *real = tc_instance(PDL_ROLE_PRODUCER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, NULL);
    pdl_instance_t *evil = tc_instance(PDL_ROLE_PRODUCER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, NULL);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, NULL);
    assert_non_null(real);
    assert_non_null(evil);
    assert_non_null(c);
    uint32_t eb[NBLK], cb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
    assert_int_equal(tc_hold_filled(evil, "tx-evil", 8, false, eb, NBLK, 666), PDL_OK);
    /* The attacker's request: its own prefill's address under the real prefill's engine id. */
    pdl_kv_params_t kp;
    tc_params(evil, "tx-evil", eb, NBLK, &kp);
    snprintf(kp.remote_engine_id, sizeof(kp.remote_engine_id), "%s", pdl_instance_engine_id(real));
    pdl_pull_t *pull;
    pdl_error_t e;
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, cb, NBLK, &pull, &e), PDL_OK);
    assert_int_equal(pdl_pull_wait(pull, 60000, &e), PDL_ERR_DENIED);
    pdl_pull_free(pull);
    pdl_kv_params_clear(&kp);
    assert_non_null(strstr(e.msg, pdl_instance_engine_id(real)));
    assert_non_null(strstr(e.msg, pdl_instance_engine_id(evil)));
    assert_int_equal(TC_GET(c, 0, peer_identity_refused), 1);
    /* The next normal requests read from the real prefill. */
    for (int t = 0; t < 4; t++) {
        uint32_t pb[NBLK];
        assert_int_equal(pdl_instance_alloc_blocks(real, NBLK, pb, NULL), PDL_OK);
        tc_fill(real, 8, false, pb, NBLK, (uint32_t)t + 1);
        char tid[32];
        snprintf(tid, sizeof(tid), "tx-real-%d", t);
        assert_int_equal(pdl_instance_hold(real, tid, pb, NBLK, NULL), PDL_OK);
        tc_params(real, tid, pb, NBLK, &kp);
        pull_ok(c, &kp, cb);
        pdl_kv_params_clear(&kp);
        uint64_t checked = 0;
        assert_int_equal(tc_verify(c, 8, false, cb, NBLK, (uint32_t)t + 1, &checked), 0);
        assert_true(tc_wait_for(tc_no_held, real, 60000));
    }
    printf("redirect: refused (%s); 4 later pulls from the real prefill verified\n", e.msg);
    pdl_instance_destroy(c);
    pdl_instance_destroy(evil);
    pdl_instance_destroy(real);
}

/* A release of `tid` (consumer_tp_size 1: it alone completes a TP1 fan-in; `failed`: the failed release
 * that abandons a WRITE push) sent to notify `port` from local address `src` -- 127.0.0.2 plays another
 * host: loopback routes all of 127/8. */
static void send_release_status(const char *src, int port, const char *tid, bool failed)
{
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_RELEASE);
    snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
    m.status = failed ? PDL_RELEASE_FAILED : PDL_RELEASE_OK;
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
}

static void send_release(const char *src, int port, const char *tid) { send_release_status(src, port, tid, false); }

typedef struct ctr_at_least {
    pdl_instance_t *inst;
    size_t off;
    uint64_t want;
} ctr_at_least_t;

static bool ctr_reached(void *arg)
{
    ctr_at_least_t *c = arg;
    return tc_get(c->inst, 0, c->off) >= c->want;
}

/*
 * Forged releases: from another host, for a transfer held for a consumer its request id names (refused
 * before any read), and for one whose grant was served to a host (refused after the read). Before, the
 * first one freed the held blocks while the consumer had not read them. Releases from the consumer's
 * host are accepted as before.
 */
static void forged_release_refused(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, 600, NULL, NULL));
    int notify = pdl_instance_notify_port(p, 0);
    uint8_t uuid[16] = {12};
    char rid[1024];
    assert_true(pdl_wire_format_request_id(pdl_instance_zmq_address(p), pdl_instance_zmq_address(c), uuid, rid,
                                           sizeof(rid)) > 0);
    uint32_t pb[NBLK], cb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, pb, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
    tc_fill(p, 8, false, pb, NBLK, 9);
    assert_int_equal(pdl_instance_hold_for(p, "tx-f1", rid, pb, NBLK, NULL), PDL_OK);
    send_release("127.0.0.2", notify, "tx-f1");
    ctr_at_least_t w = {p, offsetof(pdl_rank_counters_t, releases_refused), 1};
    assert_true(tc_wait_for(ctr_reached, &w, 60000));
    assert_int_equal(pdl_instance_held_blocks(p), NBLK);
    pdl_kv_params_t kp;
    tc_params(p, "tx-f1", pb, NBLK, &kp);
    pull_ok(c, &kp, cb);
    pdl_kv_params_clear(&kp);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, cb, NBLK, 9, &checked), 0);
    assert_true(tc_wait_for(tc_no_held, p, 60000)); /* the consumer's own release (127.0.0.1) */

    /* No request id: the consumer is whoever the grant was served to. */
    assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, pb, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(p, "tx-f2", pb, NBLK, NULL), PDL_OK);
    outsider_t o; /* the "consumer" here, reading from 127.0.0.1 */
    outsider_open(&o, pdl_instance_handshake_port(p, 0));
    pdl_error_t e;
    uint64_t blk = o.size / (uint64_t)g.layers / 2 / TOTAL;
    if (outsider_op(&o, PDL_OP_READ, "tx-f2", pb[0] * blk, blk, &e) != PDL_OK)
        fail_msg("read under tx-f2: %s", e.msg);
    send_release("127.0.0.2", notify, "tx-f2");
    w.want = 2;
    assert_true(tc_wait_for(ctr_reached, &w, 60000));
    assert_int_equal(pdl_instance_held_blocks(p), NBLK);
    send_release("127.0.0.1", notify, "tx-f2");
    assert_true(tc_wait_for(tc_no_held, p, 60000));
    assert_int_equal(TC_GET(p, 0, releases_refused), 2);
    printf("forged releases: 2 refused, held blocks stayed %d until the consumer's own release\n", NBLK);
    outsider_close(&o);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void set_bind_all(pdl_instance_config_t *c) { c->conn.bind_all = true; }

static void control_ports_bind_host_ip(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, NULL);
    assert_non_null(p);
    for (int r = 0; r < 2; r++) {
        assert_false(tl_reaches_other_loopback(pdl_instance_handshake_port(p, r)));
        assert_false(tl_reaches_other_loopback(pdl_instance_notify_port(p, r)));
    }
    pdl_instance_destroy(p);
    p = tc_instance(PDL_ROLE_PRODUCER, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, set_bind_all);
    assert_non_null(p);
    for (int r = 0; r < 2; r++) {
        assert_true(tl_reaches_other_loopback(pdl_instance_handshake_port(p, r)));
        assert_true(tl_reaches_other_loopback(pdl_instance_notify_port(p, r)));
    }
    pdl_instance_destroy(p);
}

static void write_mode(pdl_instance_config_t *c)
{
    c->conn.read_mode = false;
    c->allow_write_mode = true;
}

/*
 * WRITE mode: a decode expecting a push grants WRITE of exactly the blocks it expects, under the transfer
 * id, until the receive ends. An outsider writes nothing without the id, nothing outside those blocks
 * with it, reads nothing at all, and nothing once the receive was freed; the real push verifies.
 */
static void write_mode_consumer_guarded(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, 60, write_mode, write_mode));
    tc_push_leg_t l;
    assert_int_equal(tc_push_leg(&l, p, c, "tx-w", 21, 8, NBLK, 3), PDL_OK);
    pdl_recv_t *rv;
    pdl_error_t e;
    assert_int_equal(pdl_instance_expect_push(c, &l.ck, l.rid, l.cb, NBLK, &rv, &e), PDL_OK);

    outsider_t o;
    outsider_open(&o, pdl_instance_handshake_port(c, 0));
    uint64_t blk = o.size / (uint64_t)g.layers / 2 / TOTAL;
    uint32_t other = 0;
    while (other == l.cb[0] || other == l.cb[1])
        other++;
    assert_int_equal(outsider_op(&o, PDL_OP_WRITE, NULL, l.cb[0] * blk, 16, &e), PDL_ERR_DENIED);
    assert_int_equal(outsider_op(&o, PDL_OP_WRITE, "tx-w", other * blk, 16, &e), PDL_ERR_DENIED);
    assert_int_equal(outsider_op(&o, PDL_OP_READ, "tx-w", l.cb[0] * blk, 16, &e), PDL_ERR_DENIED);
    assert_int_equal(TC_GET(c, 0, data_requests_denied), 3);

    /* The real push lands and verifies. */
    assert_int_equal(pdl_instance_push(p, &l.pk, l.rid, l.pb, NBLK, &e), PDL_OK);
    if (pdl_recv_wait(rv, 60000, &e) != PDL_OK)
        fail_msg("receive: %s", e.msg);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, l.cb, NBLK, 3, &checked), 0);
    pdl_recv_free(rv);
    /* The receive is over: the grant went with it. */
    assert_int_equal(outsider_op(&o, PDL_OP_WRITE, "tx-w", l.cb[0] * blk, 16, &e), PDL_ERR_DENIED);
    assert_int_equal(TC_GET(c, 0, data_requests_denied), 4);
    outsider_close(&o);
    tc_push_leg_clear(&l);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/*
 * WRITE mode: a failed release (the decode's abandon) from another host than the push's consumer, sent
 * after the push was made (round 0), before it (round 1: parked, checked when the push comes), and after
 * the decode's remote_blocks were parked but before the push (round 2: it would have discarded them).
 * Before, each one freed the push unwritten and the decode's receive waited for write_done until
 * transfer_timeout. Now all are refused and counted, the blocks stay held, and the real push verifies.
 */
static void forged_write_abandon_refused(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, 600, write_mode, write_mode));
    int notify = pdl_instance_notify_port(p, 0);
    for (int round = 0; round < 3; round++) {
        char tid[32];
        snprintf(tid, sizeof(tid), "tx-wa%d", round);
        tc_push_leg_t l;
        assert_int_equal(tc_push_leg(&l, p, c, tid, (uint8_t)(30 + round), 8, NBLK, (uint32_t)(5 + round)), PDL_OK);
        pdl_error_t e;
        pdl_recv_t *rv = NULL;
        uint64_t refused = (uint64_t)round + 1;
        ctr_at_least_t w = {p, offsetof(pdl_rank_counters_t, releases_refused), refused};
        if (round == 0) {
            assert_int_equal(pdl_instance_push(p, &l.pk, l.rid, l.pb, NBLK, &e), PDL_OK);
            send_release_status("127.0.0.2", notify, tid, true);
            assert_true(tc_wait_for(ctr_reached, &w, 60000));
        } else if (round == 1) {
            send_release_status("127.0.0.2", notify, tid, true);
            ctr_at_least_t parked = {p, offsetof(pdl_rank_counters_t, pushes_abandoned), 1};
            assert_true(tc_wait_for(ctr_reached, &parked, 60000));
            assert_int_equal(pdl_instance_push(p, &l.pk, l.rid, l.pb, NBLK, &e), PDL_OK);
            /* Refused as the push is made (counted then, synchronously). */
            assert_int_equal(TC_GET(p, 0, releases_refused), refused);
        } else {
            assert_int_equal(pdl_instance_expect_push(c, &l.ck, l.rid, l.cb, NBLK, &rv, &e), PDL_OK);
            ctr_at_least_t parked = {p, offsetof(pdl_rank_counters_t, remote_blocks_parked), 1};
            assert_true(tc_wait_for(ctr_reached, &parked, 60000));
            send_release_status("127.0.0.2", notify, tid, true);
            assert_true(tc_wait_for(ctr_reached, &w, 60000));
            assert_int_equal(pdl_instance_push(p, &l.pk, l.rid, l.pb, NBLK, &e), PDL_OK);
        }
        assert_int_equal(TC_GET(p, 0, pushes_abandoned), round == 0 ? 0 : 1); /* round 1 parked its (refused) one */
        if (rv == NULL)
            assert_int_equal(pdl_instance_expect_push(c, &l.ck, l.rid, l.cb, NBLK, &rv, &e), PDL_OK);
        if (pdl_recv_wait(rv, 60000, &e) != PDL_OK)
            fail_msg("receive %s: %s", tid, e.msg);
        uint64_t checked = 0;
        assert_int_equal(tc_verify(c, 8, false, l.cb, NBLK, (uint32_t)(5 + round), &checked), 0);
        assert_true(checked > 0);
        pdl_recv_free(rv);
        assert_true(tc_wait_for(tc_no_held, p, 60000));
        assert_int_equal(TC_SUM(p, expired), 0);
        pdl_instance_free_blocks(c, l.cb, NBLK);
        tc_push_leg_clear(&l);
    }
    assert_int_equal(TC_GET(p, 0, releases_refused), 3);
    assert_int_equal(TC_GET(p, 0, transfers), 3);
    printf("forged WRITE abandons: 3 refused (after the push, parked before it, over parked remote_blocks); "
           "all pushes verified\n");
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void trust_other_host(pdl_instance_config_t *c) { snprintf(c->conn.trusted_hosts, sizeof(c->conn.trusted_hosts), "127.0.0.2"); }
static void trust_loopback(pdl_instance_config_t *c) { snprintf(c->conn.trusted_hosts, sizeof(c->conn.trusted_hosts), "127.0.0.0/8, ::1"); }

/*
 * trusted_hosts: a decode whose list lacks the prefill's host refuses the pull before dialling it; a
 * prefill whose list lacks the caller's host drops its handshake unanswered; a list that has them works.
 */
static void trusted_hosts_enforced(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, trust_loopback);
    pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, trust_other_host);
    pdl_instance_t *ok = tc_instance(PDL_ROLE_CONSUMER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, trust_loopback);
    pdl_instance_t *guarded = tc_instance(PDL_ROLE_PRODUCER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, trust_other_host);
    assert_non_null(p);
    assert_non_null(c);
    assert_non_null(ok);
    assert_non_null(guarded);
    uint32_t pb[NBLK], cb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
    assert_int_equal(tc_hold_filled(p, "tx-t", 8, false, pb, NBLK, 5), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, "tx-t", pb, NBLK, &kp);
    pdl_pull_t *pull;
    pdl_error_t e;
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, cb, NBLK, &pull, &e), PDL_ERR_DENIED);
    assert_non_null(strstr(e.msg, "producer host 127.0.0.1 is not in trusted_hosts (127.0.0.2)"));
    assert_int_equal(TC_GET(c, 0, untrusted_refused), 1);
    assert_int_equal(TC_SUM(c, handshakes) + TC_SUM(p, handshakes), 0);
    uint32_t ob[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(ok, NBLK, ob, NULL), PDL_OK);
    pull_ok(ok, &kp, ob);
    pdl_kv_params_clear(&kp);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(ok, 8, false, ob, NBLK, 5, &checked), 0);

    /* The guarded prefill drops a handshake from 127.0.0.1 without answering. */
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", pdl_instance_handshake_port(guarded, 0));
    assert_int_equal(zmq_connect(s, ep), 0);
    assert_true(zmq_send(s, PDL_WIRE_GET_META, strlen(PDL_WIRE_GET_META), 0) >= 0);
    ctr_at_least_t w = {guarded, offsetof(pdl_rank_counters_t, untrusted_refused), 1};
    assert_true(tc_wait_for(ctr_reached, &w, 60000));
    assert_int_equal(TC_GET(guarded, 0, handshakes), 0);
    zmq_msg_t m;
    zmq_msg_init(&m);
    assert_int_equal(zmq_msg_recv(&m, s, ZMQ_DONTWAIT), -1); /* nothing was sent back */
    zmq_msg_close(&m);
    zmq_close(s);
    zmq_ctx_term(ctx);
    pdl_instance_destroy(guarded);
    pdl_instance_destroy(ok);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(outsider_data_plane),
        cmocka_unit_test(redirect_refused),
        cmocka_unit_test(forged_release_refused),
        cmocka_unit_test(write_mode_consumer_guarded),
        cmocka_unit_test(forged_write_abandon_refused),
        cmocka_unit_test(control_ports_bind_host_ip),
        cmocka_unit_test(trusted_hosts_enforced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
