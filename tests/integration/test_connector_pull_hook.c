/*
 * test_connector_pull_hook.c -- pdl_instance_pull_hooked (include/pdlink/pull_hook.h): the caller's
 * function runs once per consumer rank, on that rank's worker, after the rank's bytes arrived (the hook
 * itself checks every byte of its rank and finds them all) and after its releases went out; pdl_pull_wait
 * returns only once every hook returned; the argument is freed exactly once, with the pull, also when the
 * caller frees the pull without waiting; a rank whose read failed never runs the hook. P4 -> D8 (split
 * heads) and P8 -> D4 (gathers) over shm.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "pdlink/pull_hook.h"
#include "test_connector_util.h"

#define NBLK 3
#define SEED 4242u

typedef struct hook_ctx {
    pdl_instance_t *cons;
    int heads;
    uint32_t blocks[NBLK];
    _Atomic int calls[PDL_TOPO_MAX_TP];
    uint64_t bad[PDL_TOPO_MAX_TP], checked[PDL_TOPO_MAX_TP];
    uint64_t releases_sent_at_call[PDL_TOPO_MAX_TP];
    _Atomic int *freed; /* outlives the context */
} hook_ctx_t;

static void on_rank(void *arg, int r)
{
    hook_ctx_t *h = arg;
    atomic_fetch_add(&h->calls[r], 1);
    int tp = pdl_instance_tp_size(h->cons);
    h->bad[r] = tc_walk(h->cons, r, tc_first_head(tp, h->heads, false, r), h->blocks, NBLK, SEED, true,
                        &h->checked[r]);
    h->releases_sent_at_call[r] = TC_GET(h->cons, r, releases_sent);
}

static void free_ctx(void *arg)
{
    hook_ctx_t *h = arg;
    atomic_fetch_add(h->freed, 1);
    free(h);
}

/* A hooked pull of `params` into NBLK new blocks of cons, with a fresh context counted into *freed when
 * it goes; returns the pull, and the context (the pull's from now on) in *h_out. */
static pdl_pull_t *hooked_start(pdl_instance_t *cons, const pdl_kv_params_t *params, _Atomic int *freed,
                                hook_ctx_t **h_out)
{
    hook_ctx_t *h = calloc(1, sizeof(*h));
    assert_non_null(h);
    h->cons = cons;
    h->heads = 8;
    h->freed = freed;
    assert_int_equal(pdl_instance_alloc_blocks(cons, NBLK, h->blocks, NULL), PDL_OK);
    pdl_pull_t *pull = NULL;
    pdl_error_t err;
    if (pdl_instance_pull_hooked(cons, params, NULL, h->blocks, NBLK, on_rank, h, free_ctx, &pull, &err) != PDL_OK)
        fail_msg("hooked pull: %s", err.msg);
    *h_out = h;
    return pull;
}

static void hooked_pull(int P, int D)
{
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *prod, *cons;
    assert_true(tc_pair(&prod, &cons, P, D, &g, 16, PDL_BACKEND_SHM, 60, 60, NULL, NULL));
    uint32_t pblk[NBLK];
    assert_int_equal(tc_hold_filled(prod, "tx-hook", 8, false, pblk, NBLK, SEED), PDL_OK);
    pdl_kv_params_t params;
    tc_params(prod, "tx-hook", pblk, NBLK, &params);

    _Atomic int freed = 0;
    hook_ctx_t *h;
    pdl_pull_t *pull = hooked_start(cons, &params, &freed, &h);
    pdl_error_t err;
    assert_int_equal(pdl_pull_wait(pull, 20000, &err), PDL_OK);
    /* Every hook ran once, before the wait returned, saw all of its rank's bytes, after its releases. */
    for (int r = 0; r < D; r++) {
        assert_int_equal(atomic_load(&h->calls[r]), 1);
        assert_int_equal(h->bad[r], 0);
        assert_true(h->checked[r] > 0);
        assert_true(h->releases_sent_at_call[r] >= 1);
    }
    assert_int_equal(atomic_load(&freed), 0); /* the pull still owns it */
    pdl_pull_free(pull);
    /* A worker may still hold its reference for a moment and drop the last one: the context is freed
     * then, on that worker. Destroying the consumer joins the workers, so after it the free happened. */
    assert_true(tc_wait_for(tc_no_held, prod, 10000));
    pdl_instance_destroy(cons);
    assert_int_equal(atomic_load(&freed), 1);
    pdl_kv_params_clear(&params);
    pdl_instance_destroy(prod);
}

static void hook_p4_d8(void **state)
{
    (void)state;
    hooked_pull(4, 8);
}

static void hook_p8_d4(void **state)
{
    (void)state;
    hooked_pull(8, 4);
}

/* Freed without waiting: the context lives until the last rank is done with it, then goes exactly once. */
static void hook_arg_outlives_an_early_free(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *prod, *cons;
    assert_true(tc_pair(&prod, &cons, 2, 4, &g, 16, PDL_BACKEND_SHM, 60, 60, NULL, NULL));
    uint32_t pblk[NBLK];
    assert_int_equal(tc_hold_filled(prod, "tx-early", 8, false, pblk, NBLK, SEED), PDL_OK);
    pdl_kv_params_t params;
    tc_params(prod, "tx-early", pblk, NBLK, &params);
    _Atomic int freed = 0;
    hook_ctx_t *h;
    pdl_pull_t *pull = hooked_start(cons, &params, &freed, &h);
    pdl_pull_free(pull); /* no wait: the ranks keep their references */
    assert_true(tc_wait_for(tc_no_held, prod, 10000)); /* every rank released, so every rank finished... */
    pdl_instance_destroy(cons);                         /* ...and destroy joins the workers */
    assert_int_equal(atomic_load(&freed), 1);
    pdl_kv_params_clear(&params);
    pdl_instance_destroy(prod);
}

static void tweak_short_handshake(pdl_instance_config_t *c) { c->conn.handshake_timeout_s = 1; }

/* A rank whose read fails (the producer is gone) never runs the hook; the argument is still freed. */
static void hook_not_called_on_failed_read(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *prod, *cons;
    assert_true(tc_pair(&prod, &cons, 2, 2, &g, 16, PDL_BACKEND_SHM, 60, 60, NULL, tweak_short_handshake));
    uint32_t pblk[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(prod, NBLK, pblk, NULL), PDL_OK);
    assert_int_equal(pdl_instance_hold(prod, "tx-gone", pblk, NBLK, NULL), PDL_OK);
    pdl_kv_params_t params;
    tc_params(prod, "tx-gone", pblk, NBLK, &params);
    pdl_instance_destroy(prod); /* nobody answers the handshake now */
    _Atomic int freed = 0;
    hook_ctx_t *h;
    pdl_pull_t *pull = hooked_start(cons, &params, &freed, &h);
    pdl_error_t err;
    assert_int_not_equal(pdl_pull_wait(pull, 30000, &err), PDL_OK);
    for (int r = 0; r < 2; r++)
        assert_int_equal(atomic_load(&h->calls[r]), 0);
    pdl_pull_free(pull);
    pdl_instance_destroy(cons); /* joins the workers: whoever dropped the last reference has freed h */
    assert_int_equal(atomic_load(&freed), 1);
    pdl_kv_params_clear(&params);
}

static void failed_call_leaves_arg_with_caller(void **state)
{
    (void)state;
    tc_geo_t g = tc_geo_default(8);
    pdl_instance_t *cons = tc_instance(PDL_ROLE_CONSUMER, 2, &g, 16, PDL_BACKEND_SHM, 60, tweak_short_handshake);
    assert_non_null(cons);
    pdl_kv_params_t params;
    pdl_kv_params_init(&params); /* no transfer id: refused at once */
    _Atomic int freed = 0;
    hook_ctx_t h = {.cons = cons, .heads = 8, .freed = &freed};
    uint32_t blocks[1] = {0};
    pdl_pull_t *pull = NULL;
    pdl_error_t err;
    assert_int_equal(pdl_instance_pull_hooked(cons, &params, NULL, blocks, 1, on_rank, &h, free_ctx, &pull, &err),
                     PDL_ERR_INVALID);
    assert_int_equal(atomic_load(&freed), 0);
    pdl_kv_params_clear(&params);
    pdl_instance_destroy(cons);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hook_p4_d8),
        cmocka_unit_test(hook_p8_d4),
        cmocka_unit_test(hook_arg_outlives_an_early_free),
        cmocka_unit_test(hook_not_called_on_failed_read),
        cmocka_unit_test(failed_call_leaves_arg_with_caller),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
