/*
 * test_app_optab.c -- the option-table walker (src/app/optab.c): defaults are applied through the rows,
 * every kind stores where its row says, range errors name the flag and the value, aliases and setters
 * work, --help is printed from the rows (hidden ones left out) and ends the parse, and a program's own
 * options stop at the first positional; a table copying another tool's flags (pdlink-node's vLLM ones)
 * takes a second spelling, '_' for '-', unsigned and char-array values and its positionals, and names
 * the flag as typed in errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "app/optab.h"

typedef struct t_opts {
    bool flag, on;
    int n, choice, list[4], nlist, lo, hi;
    long big;
    double x;
    const char *s;
    int calls;
} t_opts_t;

static const char *const words[] = {"read", "write", NULL};

static pdl_status_t count_call(void *opts, const pdl_optdef_t *row, const char *flag, const char *value,
                               bool *done_p, pdl_error_t *err)
{
    (void)row, (void)done_p;
    if (strcmp(value, "bad") == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': not good", flag, value);
    ((t_opts_t *)opts)->calls++;
    return PDL_OK;
}

#define TO(f) offsetof(t_opts_t, f)
static const pdl_optdef_t rows[] = {
    {.kind = PDL_OPT_SECTION, .help = "things:"},
    {.name = "flag", .alias = 'f', .kind = PDL_OPT_FLAG, .off = TO(flag), .help = "a switch"},
    {.name = "no-on", .kind = PDL_OPT_FLAG_OFF, .off = TO(on), .help = "clears on"},
    {.name = "n", .kind = PDL_OPT_INT, .metavar = "N", .def = "7", .off = TO(n), .lo = 1, .hi = 10, .help = "a count"},
    {.name = "big", .kind = PDL_OPT_LONG, .metavar = "N", .def = "1024", .off = TO(big), .lo = 1, .hi = 1L << 30,
     .help = "a long"},
    {.name = "x", .kind = PDL_OPT_DOUBLE, .metavar = "X", .def = "0.25", .off = TO(x), .dlo = 0, .dhi = 1,
     .flags = PDL_OPTF_LO_OPEN, .help = "a ratio"},
    {.name = "s", .kind = PDL_OPT_STRING, .metavar = "S", .off = TO(s), .help = "a string"},
    {.name = "mode", .kind = PDL_OPT_CHOICE, .metavar = "read|write", .def = "read", .off = TO(choice),
     .choices = words, .help = "a word"},
    {.name = "list", .kind = PDL_OPT_INT_LIST, .metavar = "LIST", .off = TO(list), .off2 = TO(nlist), .lo = 1,
     .hi = 64, .max_n = 4, .help = "sizes"},
    {.name = "range", .kind = PDL_OPT_RANGE, .metavar = "MIN-MAX", .def = "2-3", .off = TO(lo), .off2 = TO(hi),
     .lo = 1, .hi = 9, .help = "a range"},
    {.name = "call", .kind = PDL_OPT_CALL, .metavar = "V", .set = count_call, .help = "a setter"},
    {.name = "secret", .kind = PDL_OPT_FLAG, .off = TO(flag), .flags = PDL_OPTF_HIDDEN, .help = "hidden"},
    {.name = "help", .alias = 'h', .kind = PDL_OPT_HELP, .help = "this text"},
    {0},
};
#undef TO

static const pdl_optab_t table = {.prog = "t", .usage = "usage: t [options]\n", .rows = rows};

/* Parse a NULL-terminated list of arguments after a program name. */
static pdl_optab_result_t parse(const pdl_optab_t *t, t_opts_t *o, pdl_error_t *err, const char *first, ...)
{
    char *argv[32] = {"t"};
    int argc = 1;
    va_list ap;
    va_start(ap, first);
    for (const char *a = first; a != NULL && argc < 31; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a; /* read only: the walker rewrites no argv element */
    va_end(ap);
    memset(o, 0, sizeof(*o));
    o->on = true;
    pdl_error_clear(err);
    return pdl_optab_parse(t, o, argc, argv, NULL, err);
}

static void defaults_apply_through_the_rows(void **state)
{
    (void)state;
    t_opts_t o;
    pdl_error_t err;
    assert_int_equal(parse(&table, &o, &err, NULL), PDL_OPTAB_GO);
    assert_int_equal(o.n, 7);
    assert_int_equal(o.big, 1024);
    assert_true(o.x == 0.25);
    assert_int_equal(o.choice, 0);
    assert_int_equal(o.lo, 2);
    assert_int_equal(o.hi, 3);
    assert_false(o.flag);
    assert_true(o.on);
    assert_null(o.s);
}

static void every_kind_stores_where_its_row_says(void **state)
{
    (void)state;
    t_opts_t o;
    pdl_error_t err;
    assert_int_equal(parse(&table, &o, &err, "-f", "--no-on", "--n", "10", "--big=1073741824", "--x", "1", "--s",
                           "hi", "--mode", "WRITE", "--list", "4,4,8", "--range", "5", "--call", "a", "--call=b", NULL),
                     PDL_OPTAB_GO);
    assert_true(o.flag);
    assert_false(o.on);
    assert_int_equal(o.n, 10);
    assert_int_equal(o.big, 1L << 30);
    assert_true(o.x == 1.0);
    assert_string_equal(o.s, "hi");
    assert_int_equal(o.choice, 1);
    assert_int_equal(o.nlist, 3);
    assert_int_equal(o.list[2], 8);
    assert_int_equal(o.lo, 5);
    assert_int_equal(o.hi, 5);
    assert_int_equal(o.calls, 2);
}

static void errors_name_the_flag_and_the_value(void **state)
{
    (void)state;
    t_opts_t o;
    pdl_error_t err;
    static const struct {
        const char *flag, *value, *msg;
    } cases[] = {
        {"--n", "11", "--n '11': expected an integer in [1, 10]"},
        {"--n", "3x", "--n '3x': expected an integer in [1, 10]"},
        {"--x", "0", "--x '0': expected a number in (0, 1]"},
        {"--mode", "push", "--mode 'push': expected one of read, write"},
        {"--list", "4,,8", "--list '4,,8': expected 1 to 4 comma-separated integers in [1, 64]"},
        {"--list", "1,2,3,4,5", "--list '1,2,3,4,5': expected 1 to 4 comma-separated integers in [1, 64]"},
        {"--list", "4,", "--list '4,': expected 1 to 4 comma-separated integers in [1, 64]"},
        {"--range", "5-2", "--range wants MIN-MAX with 1 <= MIN <= MAX <= 9, not '5-2'"},
        {"--call", "bad", "--call 'bad': not good"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        assert_int_equal(parse(&table, &o, &err, cases[k].flag, cases[k].value, NULL), PDL_OPTAB_USAGE);
        assert_string_equal(err.msg, cases[k].msg);
    }
    assert_int_equal(parse(&table, &o, &err, "--bogus", NULL), PDL_OPTAB_USAGE);
    assert_non_null(strstr(err.msg, "unknown flag '--bogus'"));
    assert_int_equal(parse(&table, &o, &err, "--mod", "read", NULL), PDL_OPTAB_USAGE); /* no abbreviations */
    assert_int_equal(parse(&table, &o, &err, "--n", NULL), PDL_OPTAB_USAGE);
    assert_string_equal(err.msg, "--n needs a value");
    assert_int_equal(parse(&table, &o, &err, "extra", NULL), PDL_OPTAB_USAGE);
    assert_string_equal(err.msg, "unexpected argument 'extra' (see t --help)");
}

static void help_is_printed_from_the_rows(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    pdl_optab_help(&table, f);
    fclose(f);
    assert_non_null(strstr(text, "usage: t [options]\nthings:\n"));
    assert_non_null(strstr(text, "  --flag, -f"));
    assert_non_null(strstr(text, "  --n N                   a count (default 7)\n"));
    assert_non_null(strstr(text, "  --range MIN-MAX         a range (default 2-3)\n"));
    assert_null(strstr(text, "secret"));
    free(text);
    assert_non_null(pdl_optab_find(&table, "secret"));
    assert_null(pdl_optab_find(&table, "things:"));
}

static void help_ends_the_parse(void **state)
{
    (void)state;
    t_opts_t o;
    pdl_error_t err;
    FILE *saved = stdout;
    stdout = fopen("/dev/null", "w");
    pdl_optab_result_t r1 = parse(&table, &o, &err, "-h", "--n", "99", NULL);
    pdl_optab_result_t r2 = parse(&table, &o, &err, "--help", NULL);
    fclose(stdout);
    stdout = saved;
    assert_int_equal(r1, PDL_OPTAB_DONE);
    assert_int_equal(r2, PDL_OPTAB_DONE);
}

static void a_positional_can_end_the_options(void **state)
{
    (void)state;
    pdl_optab_t t = table;
    t.stop_at_positional = true;
    t_opts_t o = {0};
    pdl_error_t err;
    char *argv[] = {"t", "--n", "3", "sub", "--n", "99", NULL};
    int next = -1;
    assert_int_equal(pdl_optab_parse(&t, &o, 6, argv, &next, &err), PDL_OPTAB_GO);
    assert_int_equal(o.n, 3);
    assert_int_equal(next, 3);
    char *none[] = {"t", "-f", NULL};
    assert_int_equal(pdl_optab_parse(&t, &o, 2, none, &next, &err), PDL_OPTAB_GO);
    assert_int_equal(next, 2);
}

/* Options copied from another tool: "-tp", "--tensor_parallel_size", positionals in between. */
typedef struct v_opts {
    int tp;
    unsigned workers;
    char host[8];
    const char *pos[2];
    int npos;
} v_opts_t;

static pdl_status_t v_positional(void *opts, const char *arg, pdl_error_t *err)
{
    v_opts_t *o = opts;
    if (o->npos == 2)
        return pdl_error_set(err, PDL_ERR_INVALID, "unexpected argument '%s'", arg);
    o->pos[o->npos++] = arg;
    return PDL_OK;
}

#define VO(f) offsetof(v_opts_t, f)
static const pdl_optdef_t v_rows[] = {
    {.name = "tensor-parallel-size", .also = "-tp", .kind = PDL_OPT_INT, .metavar = "N", .def = "1", .off = VO(tp),
     .lo = 1, .hi = 256, .help = "TP ranks"},
    {.name = "workers", .kind = PDL_OPT_UINT, .metavar = "N", .def = "4", .off = VO(workers), .lo = 1,
     .hi = 1 << 16, .help = "workers"},
    {.name = "host", .kind = PDL_OPT_TEXT, .metavar = "H", .def = "a", .off = VO(host), .max_n = 8, .help = "host"},
    {.name = "quiet", .kind = PDL_OPT_FLAG, .off = VO(tp)},
    {0},
};
#undef VO

static void copied_flags_of_another_tool(void **state)
{
    (void)state;
    const pdl_optab_t t = {.prog = "v", .rows = v_rows, .positional = v_positional, .underscores = true};
    v_opts_t o = {0};
    pdl_error_t err;
    pdl_error_clear(&err);
    char a1[] = "--tensor_parallel_size", a2[] = "serve", a3[] = "--workers=9", a4[] = "m", a5[] = "--host",
         a6[] = "h1234";
    char *argv[] = {"v", a1, "4", a2, a3, a4, a5, a6, NULL};
    assert_int_equal(pdl_optab_parse(&t, &o, 8, argv, NULL, &err), PDL_OPTAB_GO);
    assert_int_equal(o.tp, 4);
    assert_int_equal(o.workers, 9);
    assert_string_equal(o.host, "h1234");
    assert_int_equal(o.npos, 2);
    assert_string_equal(o.pos[1], "m");
    static const struct {
        const char *flag, *value, *msg;
    } cases[] = {
        {"-tp", "0", "-tp '0': expected an integer in [1, 256]"},
        {"-tp=300", NULL, "-tp '300': expected an integer in [1, 256]"},
        {"--workers", "0", "--workers '0': expected an integer in [1, 65536]"},
        {"--host", "12345678", "--host: value of length 8 is empty or too long"},
        {"--host", "", "--host: value of length 0 is empty or too long"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char flag[32], value[32];
        snprintf(flag, sizeof(flag), "%s", cases[k].flag);
        snprintf(value, sizeof(value), "%s", cases[k].value ? cases[k].value : "");
        char *av[] = {"v", flag, cases[k].value ? value : NULL, NULL};
        memset(&o, 0, sizeof(o));
        assert_int_equal(pdl_optab_parse(&t, &o, cases[k].value ? 3 : 2, av, NULL, &err), PDL_OPTAB_USAGE);
        assert_string_equal(err.msg, cases[k].msg);
    }
    char *three[] = {"v", "a", "b", "c", NULL};
    memset(&o, 0, sizeof(o));
    assert_int_equal(pdl_optab_parse(&t, &o, 4, three, NULL, &err), PDL_OPTAB_USAGE);
    assert_string_equal(err.msg, "unexpected argument 'c'");
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    pdl_optab_help(&t, f);
    fclose(f);
    assert_non_null(strstr(text, "  --tensor-parallel-size, -tp N\n"));
    assert_non_null(strstr(text, "  --quiet\n")); /* no help, no default: the flag alone */
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_apply_through_the_rows),
        cmocka_unit_test(every_kind_stores_where_its_row_says),
        cmocka_unit_test(errors_name_the_flag_and_the_value),
        cmocka_unit_test(help_is_printed_from_the_rows),
        cmocka_unit_test(help_ends_the_parse),
        cmocka_unit_test(a_positional_can_end_the_options),
        cmocka_unit_test(copied_flags_of_another_tool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
