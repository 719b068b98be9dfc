/*
 * optab.c -- the option-table walker (see optab.h): defaults, parsing and --help, all from the rows.
 *
 * The walker builds a getopt long-option array from the rows (each alias becomes a one-letter long name,
 * which getopt_long_only matches exactly as "-h", and another spelling such as "-tp" a name of its own)
 * and lets pdl_opts (opts.c) do the argv work; each flag found is handed to the store of its row's kind.
 * The store is the same for a default and for a value from argv, which is what keeps the printed default
 * and the applied one from drifting apart.
 */
#include "app/optab.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app/opts.h"
#include "app/parse.h"

/* Rows of one table, aliases included: getopt wants them in one array. Tables here have about 30. */
#define OPTAB_MAX_ROWS 96
/* --help's layout: where help text starts, and the width it is wrapped to. */
#define HELP_COL 26
#define HELP_WIDTH 104

static void *field(void *opts, size_t off) { return (char *)opts + off; }

static pdl_status_t store_double(const pdl_optdef_t *r, const char *flag, const char *v, void *opts, pdl_error_t *err)
{
    char *end = NULL;
    errno = 0;
    double d = v[0] != '\0' ? strtod(v, &end) : NAN;
    bool lo_ok = (r->flags & PDL_OPTF_LO_OPEN) ? d > r->dlo : d >= r->dlo;
    if (end == NULL || *end != '\0' || errno != 0 || !lo_ok || !(d <= r->dhi))
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected a number in %c%g, %g]", flag, v,
                             (r->flags & PDL_OPTF_LO_OPEN) ? '(' : '[', r->dlo, r->dhi);
    *(double *)field(opts, r->off) = d;
    return PDL_OK;
}

static pdl_status_t store_choice(const pdl_optdef_t *r, const char *flag, const char *v, void *opts, pdl_error_t *err)
{
    char words[256] = "";
    size_t o = 0;
    for (int k = 0; r->choices[k] != NULL; k++) {
        if (strcasecmp(v, r->choices[k]) == 0) {
            *(int *)field(opts, r->off) = k;
            return PDL_OK;
        }
        if (o < sizeof(words))
            o += (size_t)snprintf(words + o, sizeof(words) - o, "%s%s", k ? ", " : "", r->choices[k]);
    }
    return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected one of %s", flag, v, words);
}

static pdl_status_t store_int_list(const pdl_optdef_t *r, const char *flag, const char *v, void *opts,
                                   pdl_error_t *err)
{
    int *out = field(opts, r->off), n = 0;
    const char *p = v;
    while (*p != '\0' || p == v) {
        size_t len = strcspn(p, ",");
        char tok[32];
        int x = 0;
        if (n >= r->max_n || len == 0 || len >= sizeof(tok))
            break;
        memcpy(tok, p, len);
        tok[len] = '\0';
        if (pdl_parse_int(flag, tok, (int)r->lo, (int)r->hi, &x, NULL) != PDL_OK)
            break;
        out[n++] = x;
        p += len;
        if (*p == ',' && *++p == '\0')
            break; /* a trailing comma */
        if (*p == '\0') {
            *(int *)field(opts, r->off2) = n;
            return PDL_OK;
        }
    }
    return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected 1 to %d comma-separated integers in [%ld, %ld]", flag,
                         v, r->max_n, r->lo, r->hi);
}

static pdl_status_t store_range(const pdl_optdef_t *r, const char *flag, const char *v, void *opts, pdl_error_t *err)
{
    char a[32] = "", b[32] = "";
    const char *dash = strchr(v, '-');
    int lo = (int)r->lo, hi = (int)r->hi, mn = 0, mx = 0;
    if (dash != NULL && (size_t)(dash - v) < sizeof(a)) {
        memcpy(a, v, (size_t)(dash - v));
        snprintf(b, sizeof(b), "%s", dash + 1);
    } else {
        snprintf(a, sizeof(a), "%s", v);
        snprintf(b, sizeof(b), "%s", v);
    }
    if (pdl_parse_int(flag, a, lo, hi, &mn, NULL) != PDL_OK || pdl_parse_int(flag, b, lo, hi, &mx, NULL) != PDL_OK ||
        mn > mx)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s wants MIN-MAX with %d <= MIN <= MAX <= %d, not '%s'", flag, lo,
                             hi, v);
    *(int *)field(opts, r->off) = mn;
    *(int *)field(opts, r->off2) = mx;
    return PDL_OK;
}

static pdl_status_t store_text(const pdl_optdef_t *r, const char *flag, const char *v, void *opts, pdl_error_t *err)
{
    size_t n = strlen(v);
    if (n == 0 || n >= (size_t)r->max_n)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: value of length %zu is empty or too long", flag, n);
    memcpy(field(opts, r->off), v, n + 1);
    return PDL_OK;
}

/* Store one value (argv's or the default) the way the row's kind says; `flag` names it in errors. */
static pdl_status_t store(const pdl_optab_t *t, const pdl_optdef_t *r, const char *flag, const char *v, void *opts,
                          bool *done_p, pdl_error_t *err)
{
    long l = 0;
    switch (r->kind) {
    case PDL_OPT_FLAG: *(bool *)field(opts, r->off) = true; return PDL_OK;
    case PDL_OPT_FLAG_OFF: *(bool *)field(opts, r->off) = false; return PDL_OK;
    case PDL_OPT_INT: return pdl_parse_int(flag, v, (int)r->lo, (int)r->hi, field(opts, r->off), err);
    case PDL_OPT_UINT:
        if (pdl_parse_long(flag, v, r->lo, r->hi, &l, err) != PDL_OK)
            return PDL_ERR_INVALID;
        *(unsigned *)field(opts, r->off) = (unsigned)l;
        return PDL_OK;
    case PDL_OPT_LONG:
        if (pdl_parse_long(flag, v, r->lo, r->hi, &l, err) != PDL_OK)
            return PDL_ERR_INVALID;
        *(long *)field(opts, r->off) = l;
        return PDL_OK;
    case PDL_OPT_DOUBLE: return store_double(r, flag, v, opts, err);
    case PDL_OPT_STRING: *(const char **)field(opts, r->off) = v; return PDL_OK;
    case PDL_OPT_TEXT: return store_text(r, flag, v, opts, err);
    case PDL_OPT_CHOICE: return store_choice(r, flag, v, opts, err);
    case PDL_OPT_INT_LIST: return store_int_list(r, flag, v, opts, err);
    case PDL_OPT_RANGE: return store_range(r, flag, v, opts, err);
    case PDL_OPT_CALL: return r->set(opts, r, flag, v, done_p, err);
    case PDL_OPT_HELP:
        pdl_optab_help(t, stdout);
        *done_p = true;
        return PDL_OK;
    case PDL_OPT_SECTION: break;
    }
    return pdl_error_set(err, PDL_ERR_INVALID, "%s: a table row of no kind", flag);
}

static bool takes_value(const pdl_optdef_t *r)
{
    return r->kind != PDL_OPT_FLAG && r->kind != PDL_OPT_FLAG_OFF && r->kind != PDL_OPT_HELP &&
           !(r->kind == PDL_OPT_CALL && r->metavar == NULL);
}

/* getopt's array: `val` is 2 + the row's index (pdl_opts reserves 0 and 1); a row's alias and its other
 * spelling (without its dashes: getopt_long_only takes "-tp" and "--tp" alike) share it. Returns the
 * count, -1 if full. */
static int build_longopts(const pdl_optab_t *t, struct option *lo, char (*alias)[2], int cap)
{
    int n = 0;
    for (int i = 0; t->rows[i].name != NULL || t->rows[i].help != NULL; i++) {
        const pdl_optdef_t *r = &t->rows[i];
        if (r->kind == PDL_OPT_SECTION)
            continue;
        int has = takes_value(r) ? required_argument : no_argument;
        if (n + 3 >= cap || i >= cap)
            return -1;
        lo[n++] = (struct option){r->name, has, NULL, 2 + i};
        if (r->also != NULL)
            lo[n++] = (struct option){r->also + strspn(r->also, "-"), has, NULL, 2 + i};
        if (r->alias != 0) {
            alias[i][0] = r->alias;
            alias[i][1] = '\0';
            lo[n++] = (struct option){alias[i], has, NULL, 2 + i};
        }
    }
    lo[n] = (struct option){NULL, 0, NULL, 0};
    return n;
}

pdl_status_t pdl_optab_defaults(const pdl_optab_t *t, void *opts, pdl_error_t *err)
{
    for (const pdl_optdef_t *r = t->rows; r->name != NULL || r->help != NULL; r++) {
        if (r->kind == PDL_OPT_SECTION || r->def == NULL)
            continue;
        bool done = false;
        char flag[72];
        snprintf(flag, sizeof(flag), "--%s", r->name);
        if (store(t, r, flag, r->def, opts, &done, err) != PDL_OK)
            return pdl_error_prefix(err, PDL_ERR_INVALID, "the default of --%s", r->name);
    }
    return PDL_OK;
}

pdl_optab_result_t pdl_optab_parse(const pdl_optab_t *t, void *opts, int argc, char **argv, int *next_p,
                                   pdl_error_t *err)
{
    struct option lo[OPTAB_MAX_ROWS + 1];
    char alias[OPTAB_MAX_ROWS][2];
    if (next_p != NULL)
        *next_p = argc;
    if (build_longopts(t, lo, alias, OPTAB_MAX_ROWS) < 0) {
        pdl_error_set(err, PDL_ERR_INVALID, "%s: more than %d options in its table", t->prog, OPTAB_MAX_ROWS);
        return PDL_OPTAB_USAGE;
    }
    if (pdl_optab_defaults(t, opts, err) != PDL_OK)
        return PDL_OPTAB_USAGE;
    pdl_opts_t o;
    pdl_opts_init(&o, argc, argv, lo, t->underscores);
    for (;;) {
        const char *value = NULL;
        int opt = pdl_opts_next(&o, &value, err);
        if (opt == 0)
            return PDL_OPTAB_GO;
        if (opt < 0)
            return PDL_OPTAB_USAGE;
        if (opt == 1 && t->stop_at_positional) {
            if (next_p != NULL)
                *next_p = o.at;
            return PDL_OPTAB_GO;
        }
        if (opt == 1 && t->positional != NULL) {
            if (t->positional(opts, value, err) != PDL_OK)
                return PDL_OPTAB_USAGE;
            continue;
        }
        if (opt == 1) {
            pdl_error_set(err, PDL_ERR_INVALID, "unexpected argument '%s' (see %s --help)", value, t->prog);
            return PDL_OPTAB_USAGE;
        }
        bool done = false;
        if (store(t, &t->rows[opt - 2], o.flag, value, opts, &done, err) != PDL_OK)
            return PDL_OPTAB_USAGE;
        if (done)
            return PDL_OPTAB_DONE;
    }
}

/* Print `text` from column `col` (the cursor is there), wrapped at HELP_WIDTH; a '\n' in it breaks. */
static void print_wrapped(FILE *f, const char *text, int col)
{
    int at = col;
    const char *p = text;
    while (*p != '\0') {
        if (*p == '\n') {
            fprintf(f, "\n%*s", col, "");
            at = col;
            p++;
            continue;
        }
        size_t w = strcspn(p, " \n");
        if (at > col && at + 1 + (int)w > HELP_WIDTH) {
            fprintf(f, "\n%*s", col, "");
            at = col;
        } else if (at > col) {
            fputc(' ', f);
            at++;
        }
        fprintf(f, "%.*s", (int)w, p);
        at += (int)w;
        p += w;
        while (*p == ' ')
            p++;
    }
    fputc('\n', f);
}

void pdl_optab_help(const pdl_optab_t *t, FILE *f)
{
    if (t->usage != NULL)
        fputs(t->usage, f);
    for (const pdl_optdef_t *r = t->rows; r->name != NULL || r->help != NULL; r++) {
        if (r->flags & PDL_OPTF_HIDDEN)
            continue;
        if (r->kind == PDL_OPT_SECTION) {
            fprintf(f, "%s\n", r->help);
            continue;
        }
        char left[128];
        int n = snprintf(left, sizeof(left), "  --%s%s%s%s%s%s%s", r->name, r->alias ? ", -" : "",
                         r->alias ? (char[]){r->alias, '\0'} : "", r->also ? ", " : "", r->also ? r->also : "",
                         r->metavar ? " " : "", r->metavar ? r->metavar : "");
        fputs(left, f);
        if (r->help == NULL && r->def == NULL) {
            fputc('\n', f); /* a flag that needs no words (an accepted and ignored one) */
            continue;
        }
        if (n >= HELP_COL - 1)
            fprintf(f, "\n%*s", HELP_COL, "");
        else
            fprintf(f, "%*s", HELP_COL - n, "");
        char text[1024];
        snprintf(text, sizeof(text), "%s%s%s%s", r->help ? r->help : "", r->def ? " (default " : "",
                 r->def ? r->def : "", r->def ? ")" : "");
        print_wrapped(f, text, HELP_COL);
    }
    if (t->help_tail != NULL)
        t->help_tail(f);
}

const pdl_optdef_t *pdl_optab_find(const pdl_optab_t *t, const char *name)
{
    for (const pdl_optdef_t *r = t->rows; r->name != NULL || r->help != NULL; r++)
        if (r->name != NULL && strcmp(r->name, name) == 0)
            return r;
    return NULL;
}
