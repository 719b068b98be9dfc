/*
 * test_connector_trust.c -- trusted_hosts refuses every role and direction, before anything is dialled
 * or sent: one table of (mode, role, call) run against an instance whose list lacks loopback, then the
 * same table against one whose list has it (where none of the calls may be refused for trust).
 *
 * Before the peer resolver (src/connector/resolve.c), only the READ pull and the WRITE push checked the
 * list: a WRITE decode's pdl_instance_expect_push returned PDL_OK and sent remote_blocks to 127.0.0.1
 * with trusted_hosts 10.0.0.0/8, and its abandon, a WRITE prefill's abandon and a READ hold naming an
 * untrusted decode went through the same way.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_connector_util.h"
#include "pdlink/wire.h"

#define NBLK 2
#define TOTAL 16

typedef enum { OP_PULL, OP_HOLD_FOR, OP_PUSH, OP_PUSH_START, OP_EXPECT_PUSH, OP_ABANDON } op_t;

typedef struct trust_row {
    const char *name;
    bool write_mode;
    pdl_role_t role;
    op_t op;
} trust_row_t;

static const trust_row_t k_rows[] = {
    {"READ decode: pull", false, PDL_ROLE_CONSUMER, OP_PULL},
    {"READ decode: abandon", false, PDL_ROLE_CONSUMER, OP_ABANDON},
    {"READ prefill: hold for a decode", false, PDL_ROLE_PRODUCER, OP_HOLD_FOR},
    {"WRITE prefill: push", true, PDL_ROLE_PRODUCER, OP_PUSH},
    {"WRITE prefill: push layer by layer", true, PDL_ROLE_PRODUCER, OP_PUSH_START},
    {"WRITE prefill: abandon", true, PDL_ROLE_PRODUCER, OP_ABANDON},
    {"WRITE decode: expect a push", true, PDL_ROLE_CONSUMER, OP_EXPECT_PUSH},
    {"WRITE decode: abandon", true, PDL_ROLE_CONSUMER, OP_ABANDON},
};

static const char *g_trusted;
static bool g_write;

static void tweak(pdl_instance_config_t *c)
{
    snprintf(c->conn.trusted_hosts, sizeof(c->conn.trusted_hosts), "%s", g_trusted);
    if (g_write)
        tc_write_slow(c);
}

/* Run row's call on inst, the request id naming inst itself (loopback) on both sides. */
static pdl_status_t run_row(pdl_instance_t *inst, const trust_row_t *row, uint32_t *ids, pdl_error_t *e)
{
    char rid[1024];
    uint8_t uuid[16] = {7};
    const char *self = pdl_instance_zmq_address(inst);
    assert_true(pdl_wire_format_request_id(self, self, uuid, rid, sizeof(rid)) > 0);
    pdl_kv_params_t kp;
    pdl_kv_params_init(&kp);
    snprintf(kp.transfer_id, sizeof(kp.transfer_id), "tx-trust");
    kp.remote_tp_size = 1;
    uint32_t remote[NBLK] = {0, 1};
    kp.remote_block_ids = remote; /* borrowed: never cleared */
    kp.num_remote_blocks = NBLK;
    kp.has_remote_block_ids = true;
    pdl_pull_t *pull = NULL;
    pdl_recv_t *rv = NULL;
    pdl_status_t st;
    switch (row->op) {
    case OP_PULL: st = pdl_instance_pull(inst, &kp, rid, ids, NBLK, &pull, e); break;
    case OP_HOLD_FOR: st = pdl_instance_hold_for(inst, kp.transfer_id, rid, ids, NBLK, e); break;
    case OP_PUSH: st = pdl_instance_push(inst, &kp, rid, ids, NBLK, e); break;
    case OP_PUSH_START: st = pdl_instance_push_start(inst, &kp, rid, ids, NBLK, e); break;
    case OP_EXPECT_PUSH: st = pdl_instance_expect_push(inst, &kp, rid, ids, NBLK, &rv, e); break;
    default: st = pdl_instance_abandon(inst, &kp, rid, e); break;
    }
    /* The control rows may have started something: it ends with the instance. */
    pdl_pull_free(pull);
    pdl_recv_free(rv);
    return st;
}

static pdl_instance_t *row_instance(const trust_row_t *row, const char *trusted)
{
    tc_geo_t g = tc_geo_default(4);
    g_trusted = trusted;
    g_write = row->write_mode;
    pdl_instance_t *inst = tc_instance(row->role, 1, &g, TOTAL, PDL_BACKEND_TCP, 60, tweak);
    assert_non_null(inst);
    return inst;
}

/* With trusted_hosts 10.0.0.0/8, every row is refused with PDL_ERR_DENIED naming the host and the list,
 * counted once in untrusted_refused, and sends nothing. */
static void every_role_refuses_untrusted(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(k_rows) / sizeof(k_rows[0]); i++) {
        const trust_row_t *row = &k_rows[i];
        pdl_instance_t *inst = row_instance(row, "10.0.0.0/8");
        uint32_t ids[NBLK];
        assert_int_equal(pdl_instance_alloc_blocks(inst, NBLK, ids, NULL), PDL_OK);
        pdl_error_t e;
        pdl_error_clear(&e);
        pdl_status_t st = run_row(inst, row, ids, &e);
        fprintf(stderr, "%s: %s: %s\n", row->name, pdl_status_name(st), e.msg);
        if (st != PDL_ERR_DENIED)
            fail_msg("%s: %s, not PDL_ERR_DENIED (%s)", row->name, pdl_status_name(st), e.msg);
        assert_non_null(strstr(e.msg, "127.0.0.1 is not in trusted_hosts (10.0.0.0/8)"));
        assert_int_equal(TC_GET(inst, 0, untrusted_refused), 1);
        assert_int_equal(TC_SUM(inst, remote_blocks_sent) + TC_SUM(inst, write_done_sent) + TC_SUM(inst, handshakes),
                         0);
        assert_int_equal(pdl_instance_held_transfers(inst), 0);
        pdl_instance_free_blocks(inst, ids, NBLK);
        assert_int_equal(pdl_instance_free_block_count(inst), TOTAL);
        pdl_instance_destroy(inst);
    }
}

/* The control: with loopback trusted, no row is refused for trust (whatever else it runs into). */
static void every_role_accepts_trusted(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(k_rows) / sizeof(k_rows[0]); i++) {
        const trust_row_t *row = &k_rows[i];
        pdl_instance_t *inst = row_instance(row, "127.0.0.0/8");
        uint32_t ids[NBLK];
        assert_int_equal(pdl_instance_alloc_blocks(inst, NBLK, ids, NULL), PDL_OK);
        pdl_error_t e;
        pdl_error_clear(&e);
        pdl_status_t st = run_row(inst, row, ids, &e);
        if (st == PDL_ERR_DENIED || TC_GET(inst, 0, untrusted_refused) != 0)
            fail_msg("%s: refused with loopback trusted: %s", row->name, e.msg);
        pdl_instance_destroy(inst);
    }
}

int main(void)
{
    tc_log_level_from_env();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_role_refuses_untrusted),
        cmocka_unit_test(every_role_accepts_trusted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
