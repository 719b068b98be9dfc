/*
 * test_connector_check.h -- steps the connector tests share that assert as they go (cmocka): a pull
 * checked byte for byte, and an instance restarted on its own ports. Include it after cmocka.h and
 * test_connector_util.h.
 */
#ifndef PDL_TEST_CONNECTOR_CHECK_H
#define PDL_TEST_CONNECTOR_CHECK_H

#include "connector/internal.h" /* the config of an instance restarted on its ports */
#include "test_connector_util.h"

/* The instances of one topology row (test_connector_topologies.c READs them, test_connector_write.c
 * pushes): tc->nprod producers of TP tc->P, producer i counting its events into ev[i], and tc->ncons
 * consumers of TP tc->D, with num_blocks blocks each; `tweak` (may be NULL) edits every config. */
static inline void tc_topo_open(const tc_topo_t *tc, uint32_t num_blocks, void (*tweak)(pdl_instance_config_t *),
                                pdl_instance_t *prod[2], pdl_instance_t *cons[2], tc_events_t *ev)
{
    for (int i = 0; i < tc->nprod; i++) {
        prod[i] = tc_instance(PDL_ROLE_PRODUCER, tc->P, &tc->g, num_blocks, tc->backend, 60, tweak);
        assert_non_null(prod[i]);
        pdl_instance_set_event_fn(prod[i], tc_on_event, &ev[i]);
    }
    for (int j = 0; j < tc->ncons; j++) {
        cons[j] = tc_instance(PDL_ROLE_CONSUMER, tc->D, &tc->g, num_blocks, tc->backend, 60, tweak);
        assert_non_null(cons[j]);
    }
}

/* The blocks of transfer number t of a topology row: n on the producer into pb and n on the consumer
 * into cb, the consumer's shifted by t % 2 blocks so the two sides' ids differ and a block-id mix-up
 * cannot go unnoticed. */
static inline void tc_topo_blocks(pdl_instance_t *p, pdl_instance_t *c, int t, size_t n, uint32_t *pb, uint32_t *cb)
{
    uint32_t skip[1];
    assert_int_equal(pdl_instance_alloc_blocks(p, n, pb, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, (size_t)(t % 2), skip, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, n, cb, NULL), PDL_OK);
    pdl_instance_free_blocks(c, skip, (size_t)(t % 2));
}

/* Once every transfer of a topology row landed: the consumer blocks of transfer t (cb + t * n, on
 * consumer t % tc->ncons) hold the pattern of seed t + 1 in every byte, and every byte of them was
 * compared (layers x halves x block length x ranks); they are freed. Returns the bytes compared. */
static inline uint64_t tc_topo_verify(const tc_topo_t *tc, pdl_instance_t *cons[2], const uint32_t *cb, size_t n)
{
    uint64_t checked = 0, bad = 0, want_checked = 0;
    for (int t = 0; t < tc->transfers; t++) {
        pdl_instance_t *c = cons[t % tc->ncons];
        const uint32_t *blocks = cb + (size_t)t * n;
        bad += tc_verify(c, tc->g.heads, tc->g.mla, blocks, n, (uint32_t)t + 1, &checked);
        want_checked += tc_instance_bytes(c, tc->g.layers, n);
        pdl_instance_free_blocks(c, blocks, n);
    }
    assert_int_equal(bad, 0);
    assert_int_equal(checked, want_checked);
    return checked;
}

/* A WRITE receive whose producer is about to go: a producer and a consumer of TP tp (WRITE mode, nothing
 * timing out) with num_blocks blocks each, leg `tid` of n blocks set up, and the consumer's receive
 * started once the producer has the consumer's block list (so only the producer's going can end it). */
static inline pdl_recv_t *tc_receive_waiting(int tp, uint32_t num_blocks, const char *tid, size_t n,
                                             pdl_instance_t **p, pdl_instance_t **c, tc_push_leg_t *l)
{
    tc_geo_t g = tc_geo_default(8);
    assert_true(tc_pair(p, c, tp, tp, &g, num_blocks, PDL_BACKEND_TCP, 600, 600, tc_write_slow, tc_write_slow));
    assert_int_equal(tc_push_leg(l, *p, *c, tid, 1, 8, n, 1), PDL_OK);
    pdl_recv_t *rv = NULL;
    pdl_error_t e;
    assert_int_equal(tc_push_leg_parked(l, *p, *c, n, &rv, &e), PDL_OK);
    return rv;
}

/* The end of such a receive after it failed: counted once as its producer gone, and once freed, the
 * consumer has every one of its num_blocks blocks back. Frees rv and l. */
static inline void tc_receive_gone(pdl_instance_t *c, pdl_recv_t *rv, tc_push_leg_t *l, size_t n, uint32_t num_blocks)
{
    assert_int_equal(TC_GET(c, 0, producer_gone_failed), 1);
    pdl_recv_free(rv);
    pdl_instance_free_blocks(c, l->cb, n);
    assert_int_equal(pdl_instance_free_block_count(c), num_blocks);
    tc_push_leg_clear(l);
}

/* One pull of 2 fresh blocks from p into 2 fresh blocks of c as transfer `tid`, the producer's filled
 * with the pattern of `seed` over `heads` heads; every byte is checked, p's hold must end, and c's blocks
 * are freed again. */
static inline void tc_pull_once(pdl_instance_t *p, pdl_instance_t *c, int heads, const char *tid, uint32_t seed)
{
    uint32_t b[2], lb[2];
    pdl_error_t e;
    assert_int_equal(pdl_instance_alloc_blocks(p, 2, b, NULL), PDL_OK);
    assert_int_equal(pdl_instance_alloc_blocks(c, 2, lb, NULL), PDL_OK);
    tc_fill(p, heads, false, b, 2, seed);
    assert_int_equal(pdl_instance_hold(p, tid, b, 2, NULL), PDL_OK);
    pdl_kv_params_t kp;
    tc_params(p, tid, b, 2, &kp);
    pdl_pull_t *pull;
    assert_int_equal(pdl_instance_pull(c, &kp, NULL, lb, 2, &pull, &e), PDL_OK);
    if (pdl_pull_wait(pull, 60000, &e) != PDL_OK)
        fail_msg("pull %s: %s", tid, e.msg);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, heads, false, lb, 2, seed, &checked), 0);
    assert_true(checked > 0);
    pdl_pull_free(pull);
    pdl_kv_params_clear(&kp);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    pdl_instance_free_blocks(c, lb, 2);
}

/* Destroy p and create it again from its own config, on the same ports (new engines, a new identity),
 * retrying for up to 2 s while a port is still being released; the test fails if it cannot. */
static inline pdl_instance_t *tc_restart(pdl_instance_t *p)
{
    pdl_instance_config_t cfg = p->cfg;
    cfg.attn_backend_name = NULL; /* points into the instance destroyed next */
    pdl_instance_destroy(p);
    pdl_instance_t *np = NULL;
    pdl_error_t e = {0};
    for (int i = 0; i < 200 && np == NULL; i++) {
        if (pdl_instance_create(&cfg, &np, &e) != PDL_OK)
            tc_sleep_ms(10);
    }
    if (np == NULL)
        fail_msg("restart on the same ports: %s", e.msg);
    return np;
}

#endif /* PDL_TEST_CONNECTOR_CHECK_H */
