/*
 * test_connector_hostile.c -- hostile input on live services while real transfers run
 * (docs/protocol.md#bad-frames).
 *
 * A thread sends, to producer rank 0, N frames of each malformed kind: random bytes, truncated
 * msgpack, wrong-typed fields, an unknown type, consumer_tp_size <= 0, an empty block list, multi-frame
 * junk on the notify port, junk requests and multi-frame junk on the handshake port, plus a few 10 MB
 * frames (10 000 of those would be 100 GB; 8 are sent) and N releases for transfers that do not exist
 * (parked, then dropped unused: counted in releases_parked). Meanwhile the main thread runs real
 * P2/D4 transfers and verifies every byte. At the end dropped_malformed on rank 0 equals the number of
 * malformed frames sent, exactly, and the services still serve -- also after a 17 MB frame, which
 * libzmq refuses at the transport (ZMQ_MAXMSGSIZE) without it reaching the service.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <msgpack.h>
#include <zmq.h>

#include "test_connector_util.h"

#define N 10000
#define NBIG 8
#define TOTAL 32
#define NBLK 2

typedef struct hostile {
    int notify_port, hs_port;
    uint64_t malformed_sent; /* frames that must be counted in dropped_malformed */
    uint64_t ghosts_sent;
} hostile_t;

static void pk_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* Build one msgpack map frame of kind k (variant i) into sb. */
static void build_map(int kind, int i, msgpack_sbuffer *sb)
{
    msgpack_sbuffer_clear(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    switch (kind) {
    case 0: /* wrong types */
        if (i % 3 == 0) {
            msgpack_pack_map(&pk, 2);
            pk_str(&pk, "type"), pk_str(&pk, "release");
            pk_str(&pk, "transfer_id"), msgpack_pack_int(&pk, 123);
        } else if (i % 3 == 1) {
            msgpack_pack_map(&pk, 3);
            pk_str(&pk, "type"), pk_str(&pk, "release");
            pk_str(&pk, "transfer_id"), pk_str(&pk, "tx-h");
            pk_str(&pk, "consumer_tp_size"), pk_str(&pk, "eight");
        } else {
            msgpack_pack_map(&pk, 2);
            pk_str(&pk, "type"), msgpack_pack_int(&pk, 7);
            pk_str(&pk, "transfer_id"), pk_str(&pk, "tx-h");
        }
        break;
    case 1: /* unknown type */
        msgpack_pack_map(&pk, 2);
        pk_str(&pk, "type"), pk_str(&pk, "frobnicate");
        pk_str(&pk, "transfer_id"), pk_str(&pk, "tx-h");
        break;
    case 2: /* consumer_tp_size <= 0 */
        msgpack_pack_map(&pk, 3);
        pk_str(&pk, "type"), pk_str(&pk, "release");
        pk_str(&pk, "transfer_id"), pk_str(&pk, "tx-h");
        pk_str(&pk, "consumer_tp_size"), msgpack_pack_int(&pk, -(i % 5));
        break;
    case 3: /* empty block list */
        msgpack_pack_map(&pk, 5);
        pk_str(&pk, "type"), pk_str(&pk, "remote_blocks");
        pk_str(&pk, "transfer_id"), pk_str(&pk, "tx-h");
        pk_str(&pk, "req_id"), pk_str(&pk, "req-h");
        pk_str(&pk, "block_notify_list"), msgpack_pack_array(&pk, 0);
        pk_str(&pk, "decode_rank"), msgpack_pack_int(&pk, 0);
        break;
    case 4: /* a well-formed release for a transfer nobody holds */
    default: {
        char id[48];
        snprintf(id, sizeof(id), "ghost-%d", i);
        msgpack_pack_map(&pk, 3);
        pk_str(&pk, "type"), pk_str(&pk, "release");
        pk_str(&pk, "transfer_id"), pk_str(&pk, id);
        pk_str(&pk, "consumer_tp_size"), msgpack_pack_int(&pk, 4);
        break;
    }
    }
}

static void send_or_die(void *s, const void *d, size_t n, int flags)
{
    if (zmq_send(s, d, n, flags) < 0)
        fprintf(stderr, "hostile send: %s\n", zmq_strerror(zmq_errno()));
}

static void *hostile_main(void *arg)
{
    hostile_t *h = arg;
    void *ctx = zmq_ctx_new();
    void *ns = zmq_socket(ctx, ZMQ_DEALER), *hs = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 20000;
    zmq_setsockopt(ns, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(hs, ZMQ_LINGER, &linger, sizeof(linger));
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", h->notify_port);
    zmq_connect(ns, ep);
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", h->hs_port);
    zmq_connect(hs, ep);
    uint8_t buf[128];
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    /* a valid release to truncate */
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_RELEASE);
    snprintf(m.transfer_id, sizeof(m.transfer_id), "tx-truncated-release-id");
    m.consumer_tp_size = 4;
    m.consumer_tp_rank = 1;
    pdl_bytes_t full;
    pdl_wire_encode_msg(&m, &full, NULL);
    pdl_msg_clear(&m);
    for (int i = 0; i < N; i++) {
        /* random bytes: 0xc1 is never used by msgpack and is invalid UTF-8 */
        size_t n = 1 + tc_rand() % 64;
        buf[0] = 0xc1;
        for (size_t k = 1; k < n; k++)
            buf[k] = (uint8_t)tc_rand();
        send_or_die(ns, buf, n, 0);
        /* truncated msgpack */
        send_or_die(ns, full.data, 1 + (size_t)i % (full.len - 1), 0);
        /* wrong types, unknown type, consumer_tp_size <= 0, empty block list */
        for (int kind = 0; kind < 4; kind++) {
            build_map(kind, i, &sb);
            send_or_die(ns, sb.data, sb.size, 0);
        }
        /* multi-frame junk on the notify port */
        send_or_die(ns, "a", 1, ZMQ_SNDMORE);
        send_or_die(ns, "bb", 2, ZMQ_SNDMORE);
        send_or_die(ns, "ccc", 3, 0);
        /* handshake junk: an unknown request, and a multi-frame one */
        send_or_die(hs, buf, n, 0);
        send_or_die(hs, "get_meta_msg", 12, ZMQ_SNDMORE);
        send_or_die(hs, "x", 1, 0);
        /* a release for a transfer that does not exist: parked, not malformed */
        build_map(4, i, &sb);
        send_or_die(ns, sb.data, sb.size, 0);
    }
    h->malformed_sent += (uint64_t)N * 9;
    h->ghosts_sent += N;
    size_t big = 10u << 20;
    uint8_t *b = calloc(1, big);
    b[0] = 0xc1;
    for (int i = 0; i < NBIG; i++)
        send_or_die(ns, b, big, 0);
    h->malformed_sent += NBIG;
    free(b);
    pdl_bytes_free(&full);
    msgpack_sbuffer_destroy(&sb);
    zmq_close(ns);
    zmq_close(hs);
    zmq_ctx_term(ctx);
    return NULL;
}

typedef struct drop_cond {
    pdl_instance_t *p;
    uint64_t want;
} drop_cond_t;

static bool drops_reached(void *arg)
{
    drop_cond_t *d = arg;
    return TC_GET(d->p, 0, dropped_malformed) >= d->want;
}

static void hostile_flood_while_transferring(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 2, 4, &g, TOTAL, PDL_BACKEND_SHM, 60, 60, NULL, NULL));
    hostile_t h = {.notify_port = pdl_instance_notify_port(p, 0), .hs_port = pdl_instance_handshake_port(p, 0)};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, hostile_main, &h), 0);
    int transfers = 0;
    uint64_t checked = 0;
    bool flood_done = false;
    /* Keep transferring until the flood is over (at least 10 transfers), then one more. */
    for (int t = 0; t < 10000 && (!flood_done || t < 10); t++) {
        uint32_t pb[NBLK], cb[NBLK];
        assert_int_equal(pdl_instance_alloc_blocks(p, NBLK, pb, NULL), PDL_OK);
        assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
        tc_fill(p, 8, false, pb, NBLK, (uint32_t)t + 100);
        char tid[32];
        snprintf(tid, sizeof(tid), "real-%d", t);
        assert_int_equal(pdl_instance_hold(p, tid, pb, NBLK, NULL), PDL_OK);
        pdl_kv_params_t kp;
        tc_params(p, tid, pb, NBLK, &kp);
        pdl_pull_t *pull;
        pdl_error_t e;
        assert_int_equal(pdl_instance_pull(c, &kp, NULL, cb, NBLK, &pull, &e), PDL_OK);
        if (pdl_pull_wait(pull, 60000, &e) != PDL_OK)
            fail_msg("transfer %d during the flood: %s", t, e.msg);
        pdl_pull_free(pull);
        pdl_kv_params_clear(&kp);
        assert_int_equal(tc_verify(c, 8, false, cb, NBLK, (uint32_t)t + 100, &checked), 0);
        pdl_instance_free_blocks(c, cb, NBLK);
        /* the release to rank 0 queues behind the flood: wait for it before the next allocation */
        assert_true(tc_wait_for(tc_no_held, p, 60000));
        transfers++;
        if (!flood_done && pthread_tryjoin_np(th, NULL) == 0)
            flood_done = true;
    }
    if (!flood_done)
        pthread_join(th, NULL);
    drop_cond_t dc = {p, h.malformed_sent};
    assert_true(tc_wait_for(drops_reached, &dc, 120000));
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    /* Exactly the malformed frames, nothing more: the valid traffic was never counted as malformed. */
    assert_int_equal(TC_GET(p, 0, dropped_malformed), h.malformed_sent);
    assert_int_equal(TC_GET(p, 1, dropped_malformed), 0);
    assert_int_equal(TC_GET(p, 0, releases_parked), h.ghosts_sent);
    assert_int_equal(TC_GET(p, 0, transfers), (uint64_t)transfers);
    assert_int_equal(TC_GET(p, 1, transfers), (uint64_t)transfers);
    assert_int_equal(TC_SUM(p, releases_received), TC_SUM(c, releases_sent) + h.ghosts_sent);
    assert_int_equal(TC_SUM(p, expired), 0);
    assert_int_equal(pdl_instance_free_block_count(p), TOTAL);
    /* A frame above the 16 MB limit: libzmq drops the sender's connection before we see it (not counted
     * per frame); the rank keeps serving. */
    {
        void *ctx = zmq_ctx_new();
        void *s = zmq_socket(ctx, ZMQ_DEALER);
        int linger = 2000;
        zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
        char ep[64];
        snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%d", h.notify_port);
        zmq_connect(s, ep);
        size_t huge = (17u << 20);
        uint8_t *b = calloc(1, huge);
        zmq_send(s, b, huge, 0);
        free(b);
        zmq_close(s);
        zmq_ctx_term(ctx);
        uint32_t pb[NBLK], cb[NBLK];
        assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, cb, NULL), PDL_OK);
        assert_int_equal(tc_hold_filled(p, "after-huge", 8, false, pb, NBLK, 4242), PDL_OK);
        pdl_kv_params_t kp;
        tc_params(p, "after-huge", pb, NBLK, &kp);
        pdl_error_t e;
        assert_int_equal(tc_pull_wait(c, &kp, cb, NBLK, &e), PDL_OK);
        pdl_kv_params_clear(&kp);
        assert_int_equal(tc_verify(c, 8, false, cb, NBLK, 4242, &checked), 0);
        assert_true(tc_wait_for(tc_no_held, p, 20000));
        assert_int_equal(TC_GET(p, 0, dropped_malformed), h.malformed_sent);
        transfers++;
    }
    printf("hostile: %llu malformed frames and %llu ghost releases sent to producer rank 0, %llu dropped and counted, "
           "%llu parked; %d real P2/D4 transfers verified (%llu bytes) meanwhile\n",
           (unsigned long long)h.malformed_sent, (unsigned long long)h.ghosts_sent,
           (unsigned long long)TC_GET(p, 0, dropped_malformed), (unsigned long long)TC_GET(p, 0, releases_parked),
           transfers, (unsigned long long)checked);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hostile_flood_while_transferring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
