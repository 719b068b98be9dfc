/*
 * test_connector_budget.c -- every socket the connector opens toward a peer comes from the instance's
 * one socket budget (src/connector/budget.c), whichever role a flood of requests comes through: one
 * table of (mode, role, call) made FLOOD times against endpoints that accept a TCP connect into the
 * kernel's backlog and never answer (tc_blackhole), each request naming another one.
 *
 * For each row, while the flood's sockets are open: no share of pdl_instance_sockets ever exceeds its
 * cap, and the process's descriptors grow by no more than the budget's small shares allow. Before the
 * budget the peer watch opened a probe and an identity socket per named endpoint outside any cap
 * (1,750 named endpoints: 29 -> 1,712 descriptors), and so did every handshake.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_connector_util.h"
#include "pdlink/wire.h"

#define FLOOD 300 /* well past every small share (64) */
#define NBLK 1
#define TOTAL (FLOOD + 8)
#define SAMPLE_MS 2500
#define SETTLED_AFTER_MS 1500

typedef enum { OP_PULL, OP_HOLD_FOR, OP_PUSH, OP_EXPECT_PUSH } op_t;

typedef struct flood_row {
    const char *name;
    bool write_mode;
    pdl_role_t role;
    op_t op;
    pdl_socket_share_t share; /* the share the flood must fill, not exceed */
    int also;                 /* another share it draws from, or -1 */
} flood_row_t;

static const flood_row_t k_rows[] = {
    {"READ prefill: holds for silent decodes (watch probes)", false, PDL_ROLE_PRODUCER, OP_HOLD_FOR,
     PDL_SOCKETS_PROBE, -1},
    {"READ decode: pulls from silent prefills (handshakes)", false, PDL_ROLE_CONSUMER, OP_PULL,
     PDL_SOCKETS_HANDSHAKE, -1},
    {"WRITE prefill: pushes to silent decodes (watch probes)", true, PDL_ROLE_PRODUCER, OP_PUSH, PDL_SOCKETS_PROBE,
     -1},
    {"WRITE decode: receives from silent prefills (remote_blocks, probes)", true, PDL_ROLE_CONSUMER,
     OP_EXPECT_PUSH, PDL_SOCKETS_PROBE, PDL_SOCKETS_UNVERIFIED},
};

static bool g_write;

static void tweak(pdl_instance_config_t *c)
{
    if (g_write)
        tc_write_slow(c);
    c->conn.consumer_gone_timeout_s = 0.4; /* probes every 0.1 s */
    c->conn.handshake_timeout_s = 4;       /* handshakes with silent peers stay in flight while sampled */
}

static int count_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

/* Request i of the flood: its peer is the silent endpoint at port base + i. */
static pdl_status_t run_one(pdl_instance_t *inst, const flood_row_t *row, int base, int i, uint32_t *id,
                            pdl_pull_t **pull, pdl_recv_t **rv, pdl_error_t *e)
{
    char self[256], peer[128], rid[1024], tid[32];
    snprintf(self, sizeof(self), "%s", pdl_instance_zmq_address(inst));
    snprintf(peer, sizeof(peer), "host:127.0.0.1,handshake:%d,notify:%d", base + i, base + i);
    snprintf(tid, sizeof(tid), "tx-flood-%d", i);
    uint8_t uuid[16] = {(uint8_t)i, (uint8_t)(i >> 8), 9};
    bool producer = row->role == PDL_ROLE_PRODUCER;
    assert_true(pdl_wire_format_request_id(producer ? self : peer, producer ? peer : self, uuid, rid, sizeof(rid)) > 0);
    pdl_kv_params_t kp;
    pdl_kv_params_init(&kp);
    snprintf(kp.transfer_id, sizeof(kp.transfer_id), "%s", tid);
    kp.remote_tp_size = 1;
    uint32_t remote[NBLK] = {0};
    kp.remote_block_ids = remote; /* borrowed: never cleared */
    kp.num_remote_blocks = NBLK;
    kp.has_remote_block_ids = true;
    switch (row->op) {
    case OP_PULL: return pdl_instance_pull(inst, &kp, rid, id, NBLK, pull, e);
    case OP_HOLD_FOR: return pdl_instance_hold_for(inst, tid, rid, id, NBLK, e);
    case OP_PUSH: return pdl_instance_push(inst, &kp, rid, id, NBLK, e);
    default: return pdl_instance_expect_push(inst, &kp, rid, id, NBLK, rv, e);
    }
}

static void flood_row(const flood_row_t *row)
{
    tc_geo_t g = tc_geo_default(4);
    g_write = row->write_mode;
    pdl_instance_t *inst = tc_instance(row->role, 1, &g, TOTAL, PDL_BACKEND_TCP, 600, tweak);
    assert_non_null(inst);
    static int holes[FLOOD];
    int base = tc_blackhole(FLOOD, holes);
    assert_true(base > 0);
    int fds0 = count_fds();
    static uint32_t ids[FLOOD];
    static pdl_pull_t *pulls[FLOOD];
    static pdl_recv_t *rvs[FLOOD];
    memset(pulls, 0, sizeof(pulls));
    memset(rvs, 0, sizeof(rvs));
    assert_int_equal(pdl_instance_alloc_blocks(inst, FLOOD, ids, NULL), PDL_OK);
    for (int i = 0; i < FLOOD; i++) {
        pdl_error_t e;
        pdl_error_clear(&e);
        pdl_status_t st = run_one(inst, row, base, i, &ids[i], &pulls[i], &rvs[i], &e);
        if (st != PDL_OK)
            fail_msg("%s: request %d: %s: %s", row->name, i, pdl_status_name(st), e.msg);
    }
    /* The flood's sockets come and go with the probes and handshakes: sample them for a while. */
    int max_open[PDL_SOCKETS_SHARES] = {0}, max_total = 0, max_fds = 0;
    long settled_sum = 0, settled_n = 0;
    pdl_socket_stats_t sk[PDL_SOCKETS_SHARES];
    for (int t = 0; t < SAMPLE_MS / 10; t++) {
        pdl_instance_sockets(inst, sk);
        int total = 0;
        for (int s = 0; s < PDL_SOCKETS_SHARES; s++) {
            assert_true(sk[s].open <= sk[s].cap);
            max_open[s] = sk[s].open > max_open[s] ? sk[s].open : max_open[s];
            total += sk[s].open;
        }
        max_total = total > max_total ? total : max_total;
        int fds = count_fds();
        max_fds = fds > max_fds ? fds : max_fds;
        if (t >= SETTLED_AFTER_MS / 10) { /* past the burst of the requests themselves */
            settled_sum += fds;
            settled_n++;
        }
        tc_sleep_ms(10);
    }
    int settled_fds = (int)(settled_sum / settled_n);
    pdl_instance_sockets(inst, sk);
    fprintf(stderr, "%s: %d requests; most open: verified %d, unverified %d, handshake %d, probe %d (caps %d/%d/%d); "
            "refused by %s: %llu; descriptors %d -> at most %d, %d on average once settled\n",
            row->name, FLOOD, max_open[0], max_open[1], max_open[2], max_open[3], sk[1].cap, sk[2].cap, sk[3].cap,
            sk[row->share].name, (unsigned long long)sk[row->share].refused, fds0, max_fds, settled_fds);
    assert_true(max_total <= PDL_SOCKETS_MAX);
    /* A socket costs at most 3 descriptors (a DEALER's TCP connection and libzmq's mailbox, a probe's
     * connect): once the burst of requests is over (DEALERs evicted during it are closed by libzmq's
     * reaper a moment later), the row's small shares bound what its flood holds on average. Before the
     * budget the watch held ~2 per named endpoint for most of every probe interval. */
    int small = sk[row->share].cap + (row->also >= 0 ? sk[row->also].cap : 0);
    assert_true(settled_fds - fds0 <= 3 * small);
    assert_true(max_open[row->share] > 0); /* the flood did go through that share */
    for (int i = 0; i < FLOOD; i++) {
        pdl_pull_free(pulls[i]);
        pdl_recv_free(rvs[i]);
    }
    pdl_instance_destroy(inst);
    for (int i = 0; i < FLOOD; i++)
        close(holes[i]);
}

static void every_role_stays_in_budget(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(k_rows) / sizeof(k_rows[0]); i++)
        flood_row(&k_rows[i]);
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_role_stays_in_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
