/*
 * test_node_args.c -- pdlink-node's `vllm serve` command line (src/node/args.c, linked from pdl_node):
 * the seed's prefill line parses with its GPU-only flags ignored; the TP size is read from
 * --tensor-parallel-size N, --tensor-parallel-size=N, -tp N and --tensor_parallel_size N; unknown flags,
 * abbreviations, missing values and bad numbers fail with the flag named; a second parse in the same
 * process starts afresh.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "node/args.h"

typedef struct parsed {
    pdl_node_args_t a;
    pdl_status_t st;
    char msg[PDL_ERR_MSG_LEN];
    int argc;
    char *argv[64];
} parsed_t;

/* Parse writable copies of words (as main() gets them); the copies live in p until parsed_free. */
static void parse(parsed_t *p, const char *const *words)
{
    p->argc = 0;
    p->argv[p->argc++] = strdup("pdlink-node");
    for (; *words != NULL; words++)
        p->argv[p->argc++] = strdup(*words);
    p->argv[p->argc] = NULL;
    pdl_node_args_defaults(&p->a);
    pdl_error_t err;
    memset(&err, 0, sizeof(err));
    p->st = pdl_node_args_parse(p->argc, p->argv, &p->a, &err);
    strcpy(p->msg, err.msg);
}

static void parsed_free(parsed_t *p)
{
    for (int i = 0; i < p->argc; i++)
        free(p->argv[i]);
}

static void seed_prefill_line_parses(void **state)
{
    (void)state;
    /* /work/shared/seed: the prefill node's `vllm serve`, with --model tiny for the geometry. */
    const char *const words[] = {"serve", "MiniMaxAI/MiniMax-M3-MXFP8", "--model", "tiny", "--host", "0.0.0.0",
                                 "--port", "8100", "--trust-remote-code", "--tensor-parallel-size", "8",
                                 "--block-size", "128", "--language-model-only", "--kv-cache-dtype", "fp8",
                                 "--attention-backend", "TRITON_ATTN", "--no-enable-prefix-caching",
                                 "--gpu-memory-utilization", "0.90", "--tool-call-parser", "minimax_m3",
                                 "--reasoning-parser", "minimax_m3", "--enable-auto-tool-choice",
                                 "--kv-transfer-config", "{\"kv_role\": \"kv_producer\"}", NULL};
    parsed_t p;
    parse(&p, words);
    assert_int_equal(p.st, PDL_OK);
    assert_string_equal(p.a.model, "tiny");
    assert_string_equal(p.a.served_model_name, "MiniMaxAI/MiniMax-M3-MXFP8");
    assert_string_equal(p.a.host, "0.0.0.0");
    assert_int_equal(p.a.port, 8100);
    assert_int_equal(p.a.tp_size, 8);
    assert_int_equal(p.a.block_size, 128);
    assert_int_equal(p.a.elem_size, 1);
    assert_string_equal(p.a.kv_transfer_config, "{\"kv_role\": \"kv_producer\"}");
    parsed_free(&p);
}

static void tp_in_every_spelling(void **state)
{
    (void)state;
    const char *const spellings[][4] = {
        {"--tensor-parallel-size", "4", NULL},
        {"--tensor-parallel-size=4", NULL},
        {"-tp", "4", NULL},
        {"-tp=4", NULL},
        {"--tensor_parallel_size", "4", NULL},
    };
    for (size_t k = 0; k < sizeof(spellings) / sizeof(spellings[0]); k++) {
        const char *words[8] = {"--model", "tiny"};
        memcpy(&words[2], spellings[k], sizeof(spellings[k]));
        parsed_t p;
        parse(&p, words);
        assert_int_equal(p.st, PDL_OK);
        assert_int_equal(p.a.tp_size, 4);
        parsed_free(&p);
    }
    const char *const dp[] = {"tiny", "-dp", "2", "-dpr", "1", "--kv-interleaved", "--seed=0x10", NULL};
    parsed_t p;
    parse(&p, dp);
    assert_int_equal(p.st, PDL_OK);
    assert_string_equal(p.a.model, "tiny");
    assert_int_equal(p.a.dp_size, 2);
    assert_int_equal(p.a.dp_rank, 1);
    assert_true(p.a.kv_interleaved);
    assert_int_equal(p.a.seed, 16);
    parsed_free(&p);
}

static void errors_name_the_flag(void **state)
{
    (void)state;
    static const struct {
        const char *words[6];
        const char *msg;
    } cases[] = {
        {{"--model", "tiny", "--tensor-paralel-size", "4", NULL}, "unknown flag '--tensor-paralel-size' (see --help)"},
        {{"--model", "tiny", "--tensor", "4", NULL}, "unknown flag '--tensor' (see --help)"},
        {{"--model", "tiny", "--port", NULL}, "--port needs a value"},
        {{"--model", "tiny", "-tp", "0", NULL}, "-tp '0': expected an integer in [1, 256]"},
        {{"--model", "tiny", "--port=8x", NULL}, "--port '8x': expected an integer in [0, 65535]"},
        {{"--model", "tiny", "--enforce-eager=1", NULL}, "--enforce-eager takes no value"},
        {{"--model", "tiny", "--kv-cache-dtype", "fp4", NULL}, "--kv-cache-dtype 'fp4': expected fp8, bf16 or auto"},
        {{"serve", "a", "b", NULL}, "unexpected argument 'b' (MODEL is 'a')"},
        {{"--port", "1", NULL}, "no model: give --model PRESET or a MODEL argument"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        parsed_t p;
        parse(&p, cases[k].words);
        assert_int_equal(p.st, PDL_ERR_INVALID);
        assert_string_equal(p.msg, cases[k].msg);
        parsed_free(&p);
    }
}

static void help_and_version_need_no_model(void **state)
{
    (void)state;
    const char *const help[] = {"-h", NULL};
    parsed_t p;
    parse(&p, help);
    assert_int_equal(p.st, PDL_OK);
    assert_true(p.a.help);
    parsed_free(&p);
    const char *const version[] = {"--version", NULL};
    parse(&p, version);
    assert_int_equal(p.st, PDL_OK);
    assert_true(p.a.version);
    parsed_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(seed_prefill_line_parses),
        cmocka_unit_test(tp_in_every_spelling),
        cmocka_unit_test(errors_name_the_flag),
        cmocka_unit_test(help_and_version_need_no_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
