/*
 * test_auth_mode.c -- authenticated mode (auth_key_file) between live instances (docs/security.md).
 *
 * - right_key_end_to_end: a producer and a consumer sharing the key: READ-mode pulls verify; nothing is
 *   refused. write_mode_end_to_end: the same for a WRITE-mode push (remote_blocks and write_done over
 *   CURVE, the prefill's data connections challenged).
 * - handshake_refused: a consumer without the key, and one with another cluster's key, cannot handshake
 *   with the producer (no metadata: the pull fails naming auth_key_file); an outsider's plain
 *   get_meta_msg gets no answer, nor does one who completes CURVE with its own key pair (the ZAP
 *   handler refuses it); the producer counts the refusals. Before, get_meta_msg answered anyone.
 * - notify_refused: a release sent without CURVE, or with another key, to an authenticated producer's
 *   notify port is dropped and counted; the blocks stay held; the same release from a key holder frees
 *   them. Before, the forged release freed them.
 * - key_file_errors: a missing, world-readable or too short key file, or the ucx backend, fail create
 *   with the path (or the backend) named.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include <cmocka.h>
#include <zmq.h>

#include "pdlink/auth.h"
#include "connector/curve.h"
#include "pdlink/wire.h"
#include "test_connector_util.h"

#define TOTAL 16
#define NBLK 2

static char g_dir[64];
static char g_key_a[96], g_key_b[96], g_key_open[96], g_key_short[96];
static const char k_secret_a[] = "test-cluster-a-5f1c0e7a9b2d4c6e8f0a1b3c5d7e9f10\n";
static const char k_secret_b[] = "test-cluster-b-0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d\n";

static void write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof(g_dir), "/tmp/pdl_auth_mode_XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        return -1;
    snprintf(g_key_a, sizeof(g_key_a), "%s/a.key", g_dir);
    snprintf(g_key_b, sizeof(g_key_b), "%s/b.key", g_dir);
    snprintf(g_key_open, sizeof(g_key_open), "%s/open.key", g_dir);
    snprintf(g_key_short, sizeof(g_key_short), "%s/short.key", g_dir);
    write_file(g_key_a, k_secret_a, 0600);
    write_file(g_key_b, k_secret_b, 0600);
    write_file(g_key_open, k_secret_a, 0644);
    write_file(g_key_short, "short\n", 0600);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_key_a);
    unlink(g_key_b);
    unlink(g_key_open);
    unlink(g_key_short);
    rmdir(g_dir);
    return 0;
}

static void key_a(pdl_instance_config_t *c) { snprintf(c->conn.auth_key_file, sizeof(c->conn.auth_key_file), "%s", g_key_a); }
static void key_b(pdl_instance_config_t *c)
{
    snprintf(c->conn.auth_key_file, sizeof(c->conn.auth_key_file), "%s", g_key_b);
    c->conn.handshake_timeout_s = 1;
}
static void no_key(pdl_instance_config_t *c) { c->conn.handshake_timeout_s = 1; }

static void right_key_end_to_end(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 2, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, 60, key_a, key_a));
    for (int i = 0; i < 3; i++) {
        uint32_t pb[NBLK], cb[NBLK];
        char tid[32];
        snprintf(tid, sizeof(tid), "tx-auth-%d", i);
        assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
        assert_int_equal(tc_hold_filled(p, tid, 8, false, pb, NBLK, 11 + (uint32_t)i), PDL_OK);
        pdl_kv_params_t kp;
        tc_params(p, tid, pb, NBLK, &kp);
        pdl_error_t e;
        if (tc_pull_wait(c, &kp, cb, NBLK, &e) != PDL_OK)
            fail_msg("pull %d: %s", i, e.msg);
        pdl_kv_params_clear(&kp);
        uint64_t checked = 0;
        assert_int_equal(tc_verify(c, 8, false, cb, NBLK, 11 + (uint32_t)i, &checked), 0);
        assert_true(checked > 0);
        pdl_instance_free_blocks(c, cb, NBLK);
    }
    /* Releases went over CURVE too: every hold was freed by them, not by the lease. */
    assert_true(tc_wait_for(tc_no_held, p, 30000));
    assert_int_equal(TC_SUM(p, expired), 0);
    assert_int_equal(TC_SUM(p, auth_refused), 0);
    assert_int_equal(TC_SUM(c, auth_refused), 0);
    assert_true(TC_SUM(p, data_requests_served) > 0);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

static void key_a_write(pdl_instance_config_t *c)
{
    key_a(c);
    c->conn.read_mode = false;
    c->allow_write_mode = true;
}

static void write_mode_end_to_end(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 2, 2, &g, TOTAL, PDL_BACKEND_TCP, 60, 60, key_a_write, key_a_write));
    tc_push_leg_t l;
    assert_int_equal(tc_push_leg(&l, p, c, "tx-auth-w", 42, 8, NBLK, 6), PDL_OK);
    pdl_recv_t *rv;
    pdl_error_t e;
    assert_int_equal(pdl_instance_expect_push(c, &l.ck, l.rid, l.cb, NBLK, &rv, &e), PDL_OK);
    assert_int_equal(pdl_instance_push(p, &l.pk, l.rid, l.pb, NBLK, &e), PDL_OK);
    if (pdl_recv_wait(rv, 60000, &e) != PDL_OK)
        fail_msg("receive: %s", e.msg);
    pdl_recv_free(rv);
    tc_push_leg_clear(&l);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, 8, false, l.cb, NBLK, 6, &checked), 0);
    assert_true(checked > 0);
    assert_true(tc_wait_for(tc_no_held, p, 30000));
    assert_true(TC_SUM(c, write_done_received) >= 2);
    assert_int_equal(TC_SUM(p, auth_refused), 0);
    assert_int_equal(TC_SUM(c, auth_refused), 0);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

/* A ZeroMQ client's get_meta_msg to hs_port: true if anything came back within `ms`. The client speaks
 * CURVE with `auth`'s keys (NULL: plain), or -- a rogue -- with a key pair of its own and rogue_server_pk,
 * the cluster's public key, as the server key. */
static bool gets_meta(int hs_port, const pdl_auth_t *auth, const uint8_t *rogue_server_pk, int ms)
{
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    if (rogue_server_pk != NULL) {
        char pub[41], sec[41];
        assert_int_equal(zmq_curve_keypair(pub, sec), 0);
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, rogue_server_pk, 32), 0);
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 40), 0);
        assert_int_equal(zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 40), 0);
    } else {
        assert_int_equal(pdl_curve_client(s, auth, NULL), PDL_OK);
    }
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", hs_port);
    assert_int_equal(zmq_connect(s, ep), 0);
    zmq_send(s, PDL_WIRE_GET_META, strlen(PDL_WIRE_GET_META), ZMQ_DONTWAIT);
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    bool got = zmq_poll(&it, 1, ms) > 0;
    zmq_close(s);
    zmq_ctx_term(ctx);
    return got;
}

static void handshake_refused(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, key_a);
    assert_non_null(p);
    void (*tweaks[])(pdl_instance_config_t *) = {no_key, key_b};
    for (int k = 0; k < 2; k++) {
        pdl_instance_t *c = tc_instance(PDL_ROLE_CONSUMER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, tweaks[k]);
        assert_non_null(c);
        uint32_t pb[NBLK], cb[NBLK];
        char tid[32];
        snprintf(tid, sizeof(tid), "tx-refused-%d", k);
        assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
        assert_int_equal(tc_hold_filled(p, tid, 8, false, pb, NBLK, 3), PDL_OK);
        pdl_kv_params_t kp;
        tc_params(p, tid, pb, NBLK, &kp);
        pdl_error_t e;
        assert_int_not_equal(tc_pull_wait(c, &kp, cb, NBLK, &e), PDL_OK);
        if (k == 1) /* the consumer in authenticated mode says what to check */
            assert_non_null(strstr(e.msg, "auth_key_file"));
        pdl_kv_params_clear(&kp);
        assert_int_equal(TC_SUM(c, handshakes), 0);
        pdl_instance_destroy(c);
    }
    /* An outsider's own tools: a plain get_meta_msg and one under another cluster's key get no answer. */
    pdl_auth_t *other = NULL;
    assert_int_equal(pdl_auth_from_secret(k_secret_b, strlen(k_secret_b), &other, NULL), PDL_OK);
    assert_false(gets_meta(pdl_instance_handshake_port(p, 0), NULL, NULL, 500));
    assert_false(gets_meta(pdl_instance_handshake_port(p, 0), other, NULL, 500));
    pdl_auth_free(other);
    /* One who knows the cluster's public key (it is not secret) but not its secret half completes CURVE
     * with a key pair of its own: the ZAP handler refuses that key. */
    pdl_auth_t *mine = NULL;
    assert_int_equal(pdl_auth_from_secret(k_secret_a, strlen(k_secret_a), &mine, NULL), PDL_OK);
    uint64_t before = TC_SUM(p, auth_refused);
    assert_false(gets_meta(pdl_instance_handshake_port(p, 0), NULL, pdl_auth_curve_public(mine), 500));
    assert_int_equal(TC_SUM(p, handshakes), 0);
    tc_at_least_t r = {p, offsetof(pdl_rank_counters_t, auth_refused), before + 1};
    assert_true(tc_wait_for(tc_sum_reached, &r, 10000));
    /* Counted: the two consumers and the three outsiders (at least one attempt each). */
    tc_at_least_t w = {p, offsetof(pdl_rank_counters_t, auth_refused), 5};
    assert_true(tc_wait_for(tc_sum_reached, &w, 10000));
    /* A key holder is answered. */
    assert_true(gets_meta(pdl_instance_handshake_port(p, 0), mine, NULL, 5000));
    pdl_auth_free(mine);
    printf("handshake: no key, another key, plain get_meta_msg, another key's, a rogue CURVE key pair: 0 answers, %llu "
           "refusals counted\n", (unsigned long long)TC_SUM(p, auth_refused));
    pdl_instance_destroy(p);
}

/* A release of `tid` (consumer_tp_size 1) to notify `port`, under `auth` (NULL: plain ZeroMQ). */
static void send_release(int port, const char *tid, const pdl_auth_t *auth)
{
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_RELEASE);
    snprintf(m.transfer_id, sizeof(m.transfer_id), "%s", tid);
    m.status = PDL_RELEASE_OK;
    pdl_bytes_t b;
    assert_int_equal(pdl_wire_encode_msg(&m, &b, NULL), PDL_OK);
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 1000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    assert_int_equal(pdl_curve_client(s, auth, NULL), PDL_OK);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", port);
    assert_int_equal(zmq_connect(s, ep), 0);
    zmq_send(s, b.data, b.len, ZMQ_DONTWAIT);
    zmq_close(s);
    zmq_ctx_term(ctx);
    pdl_bytes_free(&b);
}

static void notify_refused(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p = tc_instance(PDL_ROLE_PRODUCER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, key_a);
    assert_non_null(p);
    uint32_t pb[NBLK];
    assert_int_equal(tc_hold_filled(p, "tx-notify", 8, false, pb, NBLK, 5), PDL_OK);
    int port = pdl_instance_notify_port(p, 0);
    pdl_auth_t *other = NULL, *mine = NULL;
    assert_int_equal(pdl_auth_from_secret(k_secret_b, strlen(k_secret_b), &other, NULL), PDL_OK);
    assert_int_equal(pdl_auth_from_secret(k_secret_a, strlen(k_secret_a), &mine, NULL), PDL_OK);
    send_release(port, "tx-notify", NULL);
    send_release(port, "tx-notify", other);
    tc_at_least_t w = {p, offsetof(pdl_rank_counters_t, auth_refused), 2};
    assert_true(tc_wait_for(tc_sum_reached, &w, 10000));
    tc_sleep_ms(200);
    assert_int_equal(pdl_instance_held_transfers(p), 1);
    assert_int_equal(TC_SUM(p, releases_received), 0);
    /* The cluster's own release frees it. */
    send_release(port, "tx-notify", mine);
    assert_true(tc_wait_for(tc_no_held, p, 10000));
    assert_int_equal(TC_SUM(p, releases_received), 1);
    pdl_auth_free(other);
    pdl_auth_free(mine);
    pdl_instance_destroy(p);
}

static void set_ucx(pdl_instance_config_t *c)
{
    key_a(c);
    c->conn.backend = PDL_BACKEND_UCX;
}

static void key_file_errors(void **state)
{
    (void)state;
    const char *paths[] = {"/nonexistent/pdl.key", g_key_open, g_key_short};
    for (int i = 0; i < 3; i++) {
        pdl_instance_config_t c;
        pdl_instance_config_defaults(&c);
        c.conn.role = PDL_ROLE_PRODUCER;
        c.conn.read_mode = true;
        c.conn.handshake_port = 20001; /* never bound: create fails first */
        c.conn.notify_port = 20003;
        snprintf(c.conn.auth_key_file, sizeof(c.conn.auth_key_file), "%s", paths[i]);
        c.model = (pdl_model_geometry_t){2, 8, 16, 2, 4, false, PDL_KV_HND, true, false};
        c.tp_size = 1;
        c.num_blocks = 4;
        pdl_instance_t *inst = NULL;
        pdl_error_t e;
        assert_int_not_equal(pdl_instance_create(&c, &inst, &e), PDL_OK);
        assert_null(inst);
        if (strstr(e.msg, paths[i]) == NULL || strstr(e.msg, "auth_key_file") == NULL)
            fail_msg("'%s' does not name auth_key_file %s", e.msg, paths[i]);
    }
    tc_geo_t g = tc_geo_default(8);
    assert_null(tc_instance(PDL_ROLE_PRODUCER, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, set_ucx));
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(right_key_end_to_end),
        cmocka_unit_test(write_mode_end_to_end),
        cmocka_unit_test(handshake_refused),
        cmocka_unit_test(notify_refused),
        cmocka_unit_test(key_file_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
