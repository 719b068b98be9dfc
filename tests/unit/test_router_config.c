/*
 * test_router_config.c -- pdlink-router's vllm-router command line (src/router/config.c, linked from
 * pdl_router): the seed's line parses; "--flag=value" and "--flag value" are the same; --policy fills in
 * only the per-role policies not given, whatever the order; usage errors name the flag.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "router/config.h"

typedef struct parsed {
    pdl_router_config_t c;
    pdl_status_t st;
    char msg[PDL_ERR_MSG_LEN];
} parsed_t;

static void parse(parsed_t *p, const char *const *words)
{
    char *argv[64];
    int argc = 0;
    argv[argc++] = strdup("pdlink-router");
    for (; *words != NULL; words++)
        argv[argc++] = strdup(*words);
    argv[argc] = NULL;
    pdl_router_config_init(&p->c);
    pdl_error_t err;
    memset(&err, 0, sizeof(err));
    p->st = pdl_router_config_parse(&p->c, argc, argv, &err);
    strcpy(p->msg, err.msg);
    for (int i = 0; i < argc; i++)
        free(argv[i]); /* the config copies its strings */
}

static void seed_line_parses(void **state)
{
    (void)state;
    const char *const words[] = {"--host", "0.0.0.0", "--port", "30000", "--vllm-pd-disaggregation",
                                 "--kv-connector", "moriio", "--vllm-discovery-address", "0.0.0.0:36367",
                                 "--policy", "consistent_hash", "--prefill-policy", "consistent_hash",
                                 "--decode-policy", "consistent_hash", "--log-level", "info", NULL};
    parsed_t p;
    parse(&p, words);
    assert_int_equal(p.st, PDL_OK);
    assert_string_equal(p.c.host, "0.0.0.0");
    assert_int_equal(p.c.port, 30000);
    assert_true(p.c.pd_disaggregation);
    assert_string_equal(p.c.discovery_host, "0.0.0.0");
    assert_int_equal(p.c.discovery_port, 36367);
    assert_int_equal(p.c.prefill_policy, PDL_POLICY_CONSISTENT_HASH);
    assert_int_equal(p.c.decode_policy, PDL_POLICY_CONSISTENT_HASH);
}

static void equals_form_and_policy_precedence(void **state)
{
    (void)state;
    const char *const words[] = {"--decode-policy=random", "--vllm-pd-disaggregation", "--port=0",
                                 "--vllm-discovery-address=[::1]:5", "--policy", "round_robin",
                                 "--intra-node-data-parallel-size=2", NULL};
    parsed_t p;
    parse(&p, words);
    assert_int_equal(p.st, PDL_OK);
    assert_int_equal(p.c.port, 0);
    assert_string_equal(p.c.discovery_host, "::1");
    assert_int_equal(p.c.discovery_port, 5);
    assert_int_equal(p.c.prefill_policy, PDL_POLICY_ROUND_ROBIN); /* from --policy */
    assert_int_equal(p.c.decode_policy, PDL_POLICY_RANDOM);       /* given, so --policy leaves it */
    assert_int_equal(p.c.intra_node_dp_size, 2);
}

static void errors_name_the_flag(void **state)
{
    (void)state;
    static const struct {
        const char *words[8];
        const char *msg;
    } cases[] = {
        {{"--vllm-pd-disaggregation", "--bogus", NULL}, "unknown flag '--bogus' (see --help)"},
        {{"--vllm-pd-disaggregation", "--pol", "random", NULL}, "unknown flag '--pol' (see --help)"},
        {{"--vllm-pd-disaggregation", "--port", NULL}, "--port needs a value"},
        {{"--vllm-pd-disaggregation", "--port", "70000", NULL}, "--port '70000': expected an integer in [0, 65535]"},
        {{"--vllm-pd-disaggregation=yes", NULL}, "--vllm-pd-disaggregation takes no value"},
        {{"--vllm-pd-disaggregation", "extra", NULL}, "unexpected argument 'extra'"},
        {{"--vllm-discovery-address", "h:1", NULL},
         "--vllm-pd-disaggregation is required (pdlink-router only implements P/D mode)"},
        {{"--vllm-pd-disaggregation", "--policy", "cache_aware", NULL},
         "--policy: unknown policy 'cache_aware' (expected consistent_hash, round_robin or random)"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        parsed_t p;
        parse(&p, cases[k].words);
        assert_int_equal(p.st, PDL_ERR_INVALID);
        assert_string_equal(p.msg, cases[k].msg);
    }
    const char *const help[] = {"--port", "1", "-h", "--bogus", NULL}; /* --help wins over what follows */
    parsed_t p;
    parse(&p, help);
    assert_int_equal(p.st, PDL_OK);
    assert_true(p.c.help);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(seed_line_parses),
        cmocka_unit_test(equals_form_and_policy_precedence),
        cmocka_unit_test(errors_name_the_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
