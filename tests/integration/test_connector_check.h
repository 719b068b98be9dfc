/*
 * test_connector_check.h -- steps the connector tests share that assert as they go (cmocka): a pull
 * checked byte for byte, and an instance restarted on its own ports. Include it after cmocka.h and
 * test_connector_util.h.
 */
#ifndef PDL_TEST_CONNECTOR_CHECK_H
#define PDL_TEST_CONNECTOR_CHECK_H

#include "connector/internal.h" /* the config of an instance restarted on its ports */
#include "test_connector_util.h"

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
