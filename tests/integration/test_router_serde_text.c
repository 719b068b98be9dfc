/*
 * test_router_serde_text.c -- pdlink-router's reproduction of the text vllm-router hashes for
 * consistent_hash (linked from the router's library, pdl_router).
 *
 * Every expected string below is what vllm-router 0.1.17 (the PyPI wheel) forwarded to a worker for
 * the given client body, minus the kv_transfer_params it appends, and every expected key is what that
 * router logged ("Extracted hash key: …") for the same request: the bodies and keys were captured by
 * running the wheel in front of tests/integration/fake_vllm.py. tests/pypi/test_hash_parity.py then
 * checks worker choices against the live router.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "router/policy.h"
#include "router/serde_text.h"

typedef struct fixture {
    bool chat;
    const char *client;   /* what the client sent */
    const char *serde;    /* what vllm-router re-serialised */
    const char *key;      /* the hash key it logged */
} fixture_t;

static const fixture_t fixtures[] = {
    {false, "{\"model\":\"tiny\",\"prompt\":\"The quick brown fox\",\"max_tokens\":8,\"temperature\":0}",
     "{\"model\":\"tiny\",\"prompt\":\"The quick brown fox\",\"max_tokens\":8,\"temperature\":0.0,\"stream\":false,"
     "\"echo\":false,\"no_stop_trim\":false,\"ignore_eos\":false,\"skip_special_tokens\":true,"
     "\"return_hidden_states\":false}",
     "request_hash:8d95b9c1ff9a0a64"},
    /* f32 widening, unknown keys kept in order (nested objects too), user_id as the key, escapes. */
    {false,
     "{\"zeta\":1,\"prompt\":\"x\",\"alpha\":{\"b\":1,\"a\":2.5},\"temperature\":0.7,\"top_p\":1e-5,"
     "\"presence_penalty\":1,\"model\":\"m\",\"user_id\":\"u1\",\"stop\":\"\\n\",\"s\":\"\xc3\xa9\\u0001/\"}",
     "{\"model\":\"m\",\"prompt\":\"x\",\"temperature\":0.699999988079071,\"top_p\":9.999999747378752e-6,"
     "\"stream\":false,\"echo\":false,\"stop\":\"\\n\",\"presence_penalty\":1.0,\"no_stop_trim\":false,"
     "\"ignore_eos\":false,\"skip_special_tokens\":true,\"return_hidden_states\":false,\"zeta\":1,"
     "\"alpha\":{\"b\":1,\"a\":2.5},\"user_id\":\"u1\",\"s\":\"\xc3\xa9\\u0001/\"}",
     "user:u1"},
    /* Chat: per-role message shapes (unknown message keys dropped, null assistant content skipped). */
    {true,
     "{\"messages\":[{\"role\":\"system\",\"content\":\"s\",\"extra\":1},{\"role\":\"user\",\"content\":"
     "[{\"type\":\"text\",\"text\":\"hi\"}],\"name\":\"bob\"},{\"role\":\"assistant\",\"content\":null}],"
     "\"temperature\":1,\"max_completion_tokens\":5,\"top_k\":-1,\"zz\":null}",
     "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
     "\"text\":\"hi\"}],\"name\":\"bob\"},{\"role\":\"assistant\"}],\"temperature\":1.0,\"stream\":false,"
     "\"max_completion_tokens\":5,\"logprobs\":false,\"top_k\":-1,\"no_stop_trim\":false,\"ignore_eos\":false,"
     "\"continue_final_message\":false,\"skip_special_tokens\":true,\"separate_reasoning\":true,"
     "\"stream_reasoning\":true,\"return_hidden_states\":false,\"include_reasoning\":true,\"zz\":null}",
     "request_hash:8436f2756bbb7e1a"},
    {false, "{\"prompt\":[1,2,3],\"max_tokens\":3}",
     "{\"prompt\":[1,2,3],\"max_tokens\":3,\"stream\":false,\"echo\":false,\"no_stop_trim\":false,"
     "\"ignore_eos\":false,\"skip_special_tokens\":true,\"return_hidden_states\":false}",
     "request_hash:fce2290d7b6250fc"},
    {false, "{\"prompt\":\"y\",\"max_tokens\":3,\"user\":\"alice\"}",
     "{\"prompt\":\"y\",\"max_tokens\":3,\"stream\":false,\"echo\":false,\"user\":\"alice\",\"no_stop_trim\":false,"
     "\"ignore_eos\":false,\"skip_special_tokens\":true,\"return_hidden_states\":false}",
     "user:alice"},
    /* stream_options keeps only include_usage. */
    {false,
     "{\"prompt\":\"y\",\"max_tokens\":3,\"stream\":true,\"stream_options\":{\"include_usage\":true,"
     "\"continuous_usage_stats\":false}}",
     "{\"prompt\":\"y\",\"max_tokens\":3,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
     "\"echo\":false,\"no_stop_trim\":false,\"ignore_eos\":false,\"skip_special_tokens\":true,"
     "\"return_hidden_states\":false}",
     "request_hash:e13b5fc69cf9ae4b"},
    /* What lm-eval's local-completions sends. */
    {false, "{\"prompt\":[\"a b c\"],\"max_tokens\":4,\"logprobs\":1,\"echo\":true,\"stop\":[\"\\n\"],\"seed\":1234}",
     "{\"prompt\":[\"a b c\"],\"max_tokens\":4,\"stream\":false,\"logprobs\":1,\"echo\":true,\"stop\":[\"\\n\"],"
     "\"seed\":1234,\"no_stop_trim\":false,\"ignore_eos\":false,\"skip_special_tokens\":true,"
     "\"return_hidden_states\":false}",
     NULL},
};

static void bodies_match_vllm_router(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(fixtures) / sizeof(fixtures[0]); i++) {
        const fixture_t *f = &fixtures[i];
        json_error_t je;
        json_t *body = json_loads(f->client, 0, &je);
        assert_non_null(body);
        size_t len = 0;
        char *text = pdl_rt_serde_text(body, f->chat, &len);
        if (text == NULL || strcmp(text, f->serde) != 0)
            fail_msg("fixture %zu:\n got  %s\n want %s", i, text ? text : "(null)", f->serde);
        assert_int_equal(len, strlen(f->serde));
        if (f->key != NULL) {
            char *key = pdl_policy_hash_key(body, text, len);
            assert_non_null(key);
            if (strcmp(key, f->key) != 0)
                fail_msg("fixture %zu: key %s, vllm-router logged %s", i, key, f->key);
            free(key);
        }
        free(text);
        json_decref(body);
    }
}

/* serde_json's float printer: plain decimals for a point position in (-5, 16], exponents outside, a
 * positive one with "+" (1e16 came back from vllm-router 0.1.17 as 1e+16, 1e-6 as 1e-6, 1e-5 as 0.00001). */
static void f64_as_ryu_prints_it(void **state)
{
    (void)state;
    static const struct { double v; const char *s; } cases[] = {
        {0.0, "0.0"},        {1.0, "1.0"},          {-2.0, "-2.0"},    {0.5, "0.5"},
        {2.5, "2.5"},        {100000.0, "100000.0"}, {1e15, "1000000000000000.0"},
        {1e16, "1e+16"},     {1.5e17, "1.5e+17"},    {0.001, "0.001"},  {0.0001, "0.0001"},
        {1e-5, "0.00001"},   {1e-6, "1e-6"},        {1.25e-7, "1.25e-7"},  {123.456, "123.456"},
        {(double)0.7f, "0.699999988079071"},        {(double)1e-5f, "9.999999747378752e-6"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char out[48];
        pdl_rt_serde_f64(cases[i].v, out, sizeof(out));
        if (strcmp(out, cases[i].s) != 0)
            fail_msg("%.17g printed %s, serde_json prints %s", cases[i].v, out, cases[i].s);
    }
}

static void refused_bodies_fall_back(void **state)
{
    (void)state;
    /* vllm-router answers 400 for these; pdlink-router hashes its own dump instead (NULL here). */
    static const char *const bad[] = {
        "{\"prompt\":\"x\",\"max_tokens\":1.5}",
        "{\"prompt\":\"x\",\"stream\":\"yes\"}",
        "{\"max_tokens\":3}",
        "[1,2]",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *body = json_loads(bad[i], 0, NULL);
        assert_non_null(body);
        size_t len = 7;
        char *text = pdl_rt_serde_text(body, false, &len);
        if (text != NULL)
            fail_msg("%s gave %s", bad[i], text);
        assert_int_equal(len, 0);
        json_decref(body);
    }
    json_t *chat = json_loads("{\"messages\":[{\"content\":\"no role\"}]}", 0, NULL);
    size_t len = 0;
    assert_null(pdl_rt_serde_text(chat, true, &len));
    json_decref(chat);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bodies_match_vllm_router),
        cmocka_unit_test(f64_as_ryu_prints_it),
        cmocka_unit_test(refused_bodies_fall_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
