/*
 * test_app_parse.c -- the programs' shared flag helpers (src/app): pdl_parse_long/int refuse trailing
 * garbage, empty and blank-led strings, overflow and out-of-range values, name the flag in the message and
 * leave the output alone on failure; pdl_opts_next (getopt_long_only) returns flags and positionals in
 * order, refuses abbreviations and names the flag of every usage error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/opts.h"
#include "app/parse.h"

static void parse_accepts_whole_integers_in_range(void **state)
{
    (void)state;
    long v = 0;
    assert_int_equal(pdl_parse_long("--n", "42", 0, 100, &v, NULL), PDL_OK);
    assert_int_equal(v, 42);
    assert_int_equal(pdl_parse_long("--n", "-3", -5, 5, &v, NULL), PDL_OK);
    assert_int_equal(v, -3);
    assert_int_equal(pdl_parse_long("--n", "0", 0, 0, &v, NULL), PDL_OK); /* both bounds inclusive */
    assert_int_equal(v, 0);
    int i = 0;
    assert_int_equal(pdl_parse_int("--port", "65535", 0, 65535, &i, NULL), PDL_OK);
    assert_int_equal(i, 65535);
}

static void parse_refuses_garbage_overflow_and_range(void **state)
{
    (void)state;
    static const char *const bad[] = {"12abc", "", " 7", "7 ", "0x10", "99999999999999999999", "-99999999999999999999",
                                      "101", "-1", "1.5"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        long v = 77;
        pdl_error_t err;
        memset(&err, 0, sizeof(err));
        assert_int_equal(pdl_parse_long("--n", bad[k], 0, 100, &v, &err), PDL_ERR_INVALID);
        assert_int_equal(v, 77); /* untouched on failure */
        assert_non_null(strstr(err.msg, "--n '"));
        assert_non_null(strstr(err.msg, bad[k]));
    }
    pdl_error_t err;
    int i = 5;
    assert_int_equal(pdl_parse_int("--port", "70000", 0, 65535, &i, &err), PDL_ERR_INVALID);
    assert_string_equal(err.msg, "--port '70000': expected an integer in [0, 65535]");
    assert_int_equal(i, 5);
}

enum { O_SWITCH = 256, O_VALUE, O_TP };
static const struct option test_options[] = {
    {"switch", no_argument, NULL, O_SWITCH},
    {"value-flag", required_argument, NULL, O_VALUE},
    {"tensor-parallel-size", required_argument, NULL, O_TP},
    {"tp", required_argument, NULL, O_TP},
    {NULL, 0, NULL, 0},
};

/* argv of writable copies, as main() gets it (pdl_opts_next may rewrite '_' in flag names). */
typedef struct test_argv {
    int argc;
    char *argv[16];
} test_argv_t;

static void argv_make(test_argv_t *t, const char *const *words)
{
    t->argc = 0;
    t->argv[t->argc++] = strdup("prog");
    for (; *words != NULL; words++)
        t->argv[t->argc++] = strdup(*words);
    t->argv[t->argc] = NULL;
}

static void argv_free(test_argv_t *t)
{
    for (int i = 0; i < t->argc; i++)
        free(t->argv[i]);
}

/* Run one parse; returns the last result (0 at the end, -1 on error) and the values seen in order. */
static int opts_run(const char *const *words, bool underscores, int *vals, const char **values, char *err_msg)
{
    test_argv_t t;
    argv_make(&t, words);
    pdl_opts_t o;
    pdl_opts_init(&o, t.argc, t.argv, test_options, underscores);
    pdl_error_t err;
    memset(&err, 0, sizeof(err));
    int r, n = 0;
    static char keep[16][64];
    while ((r = pdl_opts_next(&o, &values[n], &err)) > 0) {
        vals[n] = r;
        snprintf(keep[n], sizeof(keep[n]), "%s", values[n] ? values[n] : "(null)");
        values[n] = keep[n];
        n++;
    }
    vals[n] = r;
    strcpy(err_msg, err.msg);
    argv_free(&t);
    return r;
}

static void opts_take_every_spelling_in_order(void **state)
{
    (void)state;
    int vals[16];
    const char *values[16];
    char msg[PDL_ERR_MSG_LEN];
    const char *const words[] = {"serve", "--tensor-parallel-size", "4", "-tp", "2", "--tp=8", "--value-flag=a=b",
                                 "MODEL", "-switch", "--switch", NULL};
    assert_int_equal(opts_run(words, false, vals, values, msg), 0);
    const int want[] = {1, O_TP, O_TP, O_TP, O_VALUE, 1, O_SWITCH, O_SWITCH, 0};
    const char *const want_v[] = {"serve", "4", "2", "8", "a=b", "MODEL", "(null)", "(null)"};
    for (int k = 0; k < 8; k++) {
        assert_int_equal(vals[k], want[k]);
        assert_string_equal(values[k], want_v[k]);
    }
    assert_int_equal(vals[8], 0);
    /* "--" ends the flags: what follows is positional even when it looks like a flag. */
    const char *const dashdash[] = {"--switch", "--", "--tp", NULL};
    assert_int_equal(opts_run(dashdash, false, vals, values, msg), 0);
    assert_int_equal(vals[0], O_SWITCH);
    assert_int_equal(vals[1], 1);
    assert_string_equal(values[1], "--tp");
}

static void opts_name_the_flag_of_each_error(void **state)
{
    (void)state;
    int vals[16];
    const char *values[16];
    char msg[PDL_ERR_MSG_LEN];
    const char *const unknown[] = {"--tp", "1", "--tensor-paralel-size", "4", NULL};
    assert_int_equal(opts_run(unknown, false, vals, values, msg), -1);
    assert_string_equal(msg, "unknown flag '--tensor-paralel-size' (see --help)");
    const char *const abbrev[] = {"--tensor", "4", NULL}; /* getopt would take the prefix; we do not */
    assert_int_equal(opts_run(abbrev, false, vals, values, msg), -1);
    assert_string_equal(msg, "unknown flag '--tensor' (see --help)");
    const char *const missing[] = {"--switch", "--value-flag", NULL};
    assert_int_equal(opts_run(missing, false, vals, values, msg), -1);
    assert_string_equal(msg, "--value-flag needs a value");
    const char *const novalue[] = {"--switch=yes", NULL};
    assert_int_equal(opts_run(novalue, false, vals, values, msg), -1);
    assert_string_equal(msg, "--switch takes no value");
    const char *const unknown_eq[] = {"--bogus=3", NULL};
    assert_int_equal(opts_run(unknown_eq, false, vals, values, msg), -1);
    assert_string_equal(msg, "unknown flag '--bogus' (see --help)");
}

static void opts_underscores_only_when_asked(void **state)
{
    (void)state;
    int vals[16];
    const char *values[16];
    char msg[PDL_ERR_MSG_LEN];
    const char *const words[] = {"--tensor_parallel_size=2", "--value_flag", "x_y", NULL};
    assert_int_equal(opts_run(words, true, vals, values, msg), 0);
    assert_int_equal(vals[0], O_TP);
    assert_string_equal(values[0], "2");
    assert_int_equal(vals[1], O_VALUE);
    assert_string_equal(values[1], "x_y"); /* values are never rewritten */
    assert_int_equal(opts_run(words, false, vals, values, msg), -1);
    assert_string_equal(msg, "unknown flag '--tensor_parallel_size' (see --help)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_accepts_whole_integers_in_range),
        cmocka_unit_test(parse_refuses_garbage_overflow_and_range),
        cmocka_unit_test(opts_take_every_spelling_in_order),
        cmocka_unit_test(opts_name_the_flag_of_each_error),
        cmocka_unit_test(opts_underscores_only_when_asked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
