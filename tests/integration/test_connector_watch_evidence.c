/*
 * test_connector_watch_evidence.c -- the consumer-gone watch (watch.c) frees a decode's holds on proof
 * of its death, not on refusals alone, and knows a restart even when the hold was its first contact:
 *
 * - A live decode whose handshake port refuses (a firewall REJECT with a TCP reset, a NetworkPolicy, a
 *   listener paused for descriptors) while its data connections to the prefill's tcp engine are
 *   established keeps its hold, however many refusals the watch counts; the pull made once the port
 *   answers again reads the right bytes. Before, two refusals in a row freed it ("its handshake port
 *   refused 2 connects in a row") and the pull was refused.
 * - The same decode destroyed (its connections closed) while the port still refuses: its hold is freed
 *   within seconds, as before.
 * - A hold made for a decode that the watch had not asked yet (its probes learned nothing: the port
 *   unreachable for a moment), then the decode restarted on its ports: the new instance answers that it
 *   came up after the hold was made, so the hold is freed at once. Before, the first identity was taken
 *   for the hold's and the hold stayed until defer_timeout (600 s here).
 *
 * The refusals are the watch's own connect replaced (connector/watch.h): no root, no iptables. Each step
 * waits for a counter or an outcome within generous bounds; the restart is in-process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_connector_util.h"
#include "test_connector_check.h"
#include "connector/watch.h"
#include "common/clock.h"

#define NBLK 3
#define TOTAL 24
#define HEADS 8

/* The handshake port the probes of which are refused (as a closed port: a reset) or get no answer. */
static atomic_int refused_port, unreachable_port, calls_unreachable;

static int port_of(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)a)->sin_port);
    if (a->sa_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
    return -1;
}

static int fake_connect(int fd, const struct sockaddr *a, socklen_t len)
{
    int port = port_of(a);
    if (port == atomic_load(&refused_port)) {
        errno = ECONNREFUSED;
        return -1;
    }
    if (port == atomic_load(&unreachable_port)) {
        atomic_fetch_add(&calls_unreachable, 1);
        errno = EHOSTUNREACH;
        return -1;
    }
    return connect(fd, a, len);
}

static void hooks_reset(void)
{
    atomic_store(&refused_port, -1);
    atomic_store(&unreachable_port, -1);
    atomic_store(&calls_unreachable, 0);
}

/* Hold NBLK filled blocks as `tid` for consumer `c` (seed t). */
static void hold_for(pdl_instance_t *p, pdl_instance_t *c, const char *tid, int t, uint32_t *ids)
{
    pdl_error_t e;
    if (tc_hold_for(p, pdl_instance_zmq_address(c), tid, t, ids, NBLK, &e) != PDL_OK)
        fail_msg("hold %s: %s", tid, e.msg);
    tc_fill(p, HEADS, false, ids, NBLK, (uint32_t)t);
}

/* c pulls `tid` (held in ids) into its blocks lb and checks every byte. */
static void pull_ok(pdl_instance_t *p, pdl_instance_t *c, const char *tid, int t, const uint32_t *ids, uint32_t *lb)
{
    pdl_kv_params_t kp;
    pdl_error_t e;
    tc_params(p, tid, ids, NBLK, &kp);
    pdl_status_t st = tc_pull_wait(c, &kp, lb, NBLK, &e);
    pdl_kv_params_clear(&kp);
    if (st != PDL_OK)
        fail_msg("pull %s: %s: %s", tid, pdl_status_name(st), e.msg);
    uint64_t checked = 0;
    assert_int_equal(tc_verify(c, HEADS, false, lb, NBLK, (uint32_t)t, &checked), 0);
    assert_true(checked > 0);
}

typedef struct refused_or_freed {
    tc_at_least_t refused;
} refused_or_freed_t;

/* Enough refusals counted, or the hold given up (then the watch forgets the peer and counts no more). */
static bool refused_or_freed(void *arg)
{
    refused_or_freed_t *a = arg;
    return tc_sum_reached(&a->refused) || TC_SUM(a->refused.inst, consumer_gone_freed) > 0;
}

static void refused_but_connected_decode_keeps_its_hold(void **state)
{
    (void)state;
    hooks_reset();
    tc_geo_t g = tc_geo_default(HEADS);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, 60, tc_watch_slow, NULL));
    pdl__watch_set_connect(p, fake_connect);
    uint32_t a[NBLK], b[NBLK], lb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, lb, NULL), PDL_OK);
    /* A pull opens the decode's data connections to the prefill's engine (kept for the next pulls). */
    hold_for(p, c, "tx-a", 1, a);
    pull_ok(p, c, "tx-a", 1, a, lb);
    assert_true(tc_wait_for(tc_no_held, p, 20000));

    hold_for(p, c, "tx-b", 2, b);
    tc_at_least_t idents = {p, offsetof(pdl_rank_counters_t, watch_identities), TC_SUM(p, watch_identities) + 2};
    assert_true(tc_wait_for(tc_sum_reached, &idents, 20000));
    /* Its handshake port refuses from now on, the process lives: four refusals, twice the old verdict. */
    atomic_store(&refused_port, pdl_instance_handshake_port(c, 0));
    refused_or_freed_t rf = {{p, offsetof(pdl_rank_counters_t, watch_refused), TC_SUM(p, watch_refused) + 4}};
    assert_true(tc_wait_for(refused_or_freed, &rf, 20000));
    assert_int_equal(TC_SUM(p, consumer_gone_freed), 0); /* before: 1, at the second refusal */
    assert_int_equal(pdl_instance_held_transfers(p), 1);
    atomic_store(&refused_port, -1);
    pull_ok(p, c, "tx-b", 2, b, lb);
    assert_true(tc_wait_for(tc_no_held, p, 20000));
    assert_int_equal(TC_SUM(p, consumer_gone_freed), 0);

    /* Dead for real while its port still refuses: nothing says it lives any more. */
    uint32_t d[NBLK];
    hold_for(p, c, "tx-d", 3, d);
    assert_true(tc_wait_for(tc_sum_reached, &(tc_at_least_t){p, offsetof(pdl_rank_counters_t, watch_identities),
                                                             TC_SUM(p, watch_identities) + 2},
                            20000));
    atomic_store(&refused_port, pdl_instance_handshake_port(c, 0));
    uint64_t t0 = pdl__clock_now_ns();
    pdl_instance_destroy(c);
    pdl_instance_t *plist[2] = {p, NULL};
    assert_true(tc_wait_for(tc_none_held, plist, 20000));
    fprintf(stderr, "evidence: the destroyed decode's hold freed %.2f s after it went\n",
            (pdl__clock_now_ns() - t0) / 1e9);
    assert_int_equal(TC_SUM(p, consumer_gone_freed), 1);
    assert_int_equal(TC_SUM(p, expired), 0); /* by the watch, not the reaper */
    pdl_instance_destroy(p);
    hooks_reset();
}

static void first_contact_hold_freed_when_decode_restarted(void **state)
{
    (void)state;
    hooks_reset();
    tc_geo_t g = tc_geo_default(HEADS);
    pdl_instance_t *p, *c;
    assert_true(tc_pair(&p, &c, 1, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, 60, tc_watch_slow, NULL));
    pdl__watch_set_connect(p, fake_connect);
    /* The watch's probes learn nothing until the restart: the hold is its first contact. */
    atomic_store(&unreachable_port, pdl_instance_handshake_port(c, 0));
    uint32_t old_ids[NBLK], new_ids[NBLK];
    hold_for(p, c, "tx-old", 1, old_ids);
    while (atomic_load(&calls_unreachable) < 1) /* the watch saw the hold and tried */
        tc_sleep_ms(2);
    uint64_t t0 = pdl__clock_now_ns();
    c = tc_restart(c);
    atomic_store(&unreachable_port, -1);
    tc_at_least_t freed = {p, offsetof(pdl_rank_counters_t, consumer_gone_freed), 1};
    assert_true(tc_wait_for(tc_sum_reached, &freed, 10000));
    fprintf(stderr, "epoch: the first-contact hold of the restarted decode freed %.2f s after the restart\n",
            (pdl__clock_now_ns() - t0) / 1e9);
    assert_int_equal(TC_SUM(p, expired), 0);
    assert_int_equal(pdl_instance_held_transfers(p), 0);

    /* A hold for the new process is kept, however often the watch looks. */
    hold_for(p, c, "tx-new", 2, new_ids);
    tc_at_least_t more = {p, offsetof(pdl_rank_counters_t, watch_identities), TC_SUM(p, watch_identities) + 4};
    assert_true(tc_wait_for(tc_sum_reached, &more, 20000));
    assert_int_equal(TC_SUM(p, consumer_gone_freed), 1);
    assert_int_equal(pdl_instance_held_transfers(p), 1);
    uint32_t lb[NBLK];
    assert_int_equal(pdl_instance_alloc_blocks(c, NBLK, lb, NULL), PDL_OK);
    pull_ok(p, c, "tx-new", 2, new_ids, lb);
    pdl_instance_destroy(c);
    pdl_instance_destroy(p);
    hooks_reset();
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(refused_but_connected_decode_keeps_its_hold),
        cmocka_unit_test(first_contact_hold_freed_when_decode_restarted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
