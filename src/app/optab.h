/*
 * optab.h -- a program's options as one table: each row is one flag (its name, optional short alias,
 * the kind of value it takes, its default, its range, its help text and where the value is stored), and
 * one walker parses argv from that table and prints --help from it.
 *
 * The rows store into a caller's options struct by offset (offsetof), so a subcommand's options are a
 * plain struct and its table, with no switch over flags. Kinds cover the common values (switches, checked
 * integers and doubles, strings, one of a list of words, comma-separated integer lists); a row of kind
 * PDL_OPT_CALL hands its value to a setter for the odd ones (sizes with suffixes, model presets, actions
 * such as --version).
 *
 * A default is written as the text a user would type ("48", "6-8", "shm") and applied through the same
 * row before argv is read, so the default printed by --help is the default in effect. Errors name the
 * flag and the value: "--requests '0': expected an integer in [1, 100000]", "--mode 'push': expected one
 * of read, write". Parsing is on top of pdl_opts (opts.h): exact names only, "--flag value",
 * "--flag=value" and "-flag value" all accepted, and the same getopt caveat (one thread, from main()). A
 * value from argv is checked under the flag as typed ("-tp '0': ..."), a default under "--name".
 */
#ifndef PDL_APP_OPTAB_H
#define PDL_APP_OPTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "pdlink/status.h"

typedef enum pdl_opt_kind {
    PDL_OPT_SECTION,  /* not a flag: a heading in --help (help is its text) */
    PDL_OPT_FLAG,     /* no value: stores true in a bool */
    PDL_OPT_FLAG_OFF, /* no value: stores false in a bool ("--no-hetero") */
    PDL_OPT_INT,      /* an int in [lo, hi] */
    PDL_OPT_UINT,     /* an unsigned in [lo, hi] (lo >= 0) */
    PDL_OPT_LONG,     /* a long in [lo, hi] */
    PDL_OPT_DOUBLE,   /* a double in [dlo, dhi] ((dlo, dhi] with PDL_OPTF_LO_OPEN) */
    PDL_OPT_STRING,   /* a const char * pointing into argv (or at the default) */
    PDL_OPT_TEXT,     /* a copy in a char array of max_n bytes: empty or longer is an error */
    PDL_OPT_CHOICE,   /* one of `choices` (case-insensitive): stores its index in an int */
    PDL_OPT_INT_LIST, /* "4,4,8": ints in [lo, hi] into an int array; count in the int at count_off */
    PDL_OPT_RANGE,    /* "MIN-MAX" or "N": two ints lo <= MIN <= MAX <= hi at off and off2 */
    PDL_OPT_CALL,     /* set(): the value (NULL for a row without metavar) goes to the setter */
    PDL_OPT_HELP,     /* no value: prints --help to stdout and ends the parse with success */
} pdl_opt_kind_t;

enum {
    PDL_OPTF_HIDDEN = 1u << 0,  /* parsed, not printed by --help (test hooks) */
    PDL_OPTF_LO_OPEN = 1u << 1, /* PDL_OPT_DOUBLE: the lower bound is excluded */
};

struct pdl_optdef;

/*
 * A PDL_OPT_CALL row's setter: `flag` is "--name", `value` the argument (NULL when the row takes none).
 * Set *done_p to end the parse with success after this flag (an action that printed something). Return
 * PDL_OK or an error with err naming the flag and the value.
 */
typedef pdl_status_t (*pdl_opt_set_fn)(void *opts, const struct pdl_optdef *row, const char *flag, const char *value,
                                       bool *done_p, pdl_error_t *err);

typedef struct pdl_optdef {
    const char *name;             /* long name without dashes; NULL ends the table */
    char alias;                   /* one-letter alias ("-h"), or 0 */
    const char *also;             /* another spelling, dashes included ("-tp", "--num-gpu-blocks-override") */
    pdl_opt_kind_t kind;
    const char *metavar;          /* the value's name in --help ("N", "LIST"); NULL for a switch */
    const char *def;              /* default as typed, applied before argv; NULL: the struct's zero */
    size_t off;                   /* where the value goes: offsetof(options struct, field) */
    size_t off2;                  /* PDL_OPT_RANGE: MAX's field; PDL_OPT_INT_LIST: the count's field; CALL: a
                                     setter's second field, if it has one */
    long lo, hi;                  /* INT, UINT, LONG, INT_LIST, RANGE; CALL: a setter's range, if it has one */
    double dlo, dhi;              /* DOUBLE */
    int max_n;                    /* INT_LIST: the array's capacity; TEXT: the char array's size */
    const char *const *choices;   /* CHOICE: the words, NULL-terminated */
    pdl_opt_set_fn set;           /* CALL */
    unsigned flags;               /* PDL_OPTF_* */
    const char *help;             /* one line or more; wrapped by --help */
} pdl_optdef_t;

typedef struct pdl_optab {
    const char *prog;                /* "pdlink run": the prefix of every message */
    const char *usage;               /* printed first by --help (usage lines, what the command does) */
    const pdl_optdef_t *rows;        /* ends with a row whose name and help are NULL */
    void (*help_tail)(FILE *f);      /* printed after the rows (lists computed at run time), or NULL */
    bool stop_at_positional;         /* the first positional ends the parse (a sub-command's name) */
    /* Each positional argument, when not stop_at_positional; NULL: a positional is a usage error. */
    pdl_status_t (*positional)(void *opts, const char *arg, pdl_error_t *err);
    bool underscores;                /* read '_' in a flag name as '-', as vLLM does (rewrites argv) */
} pdl_optab_t;

/* What pdl_optab_parse found. */
typedef enum pdl_optab_result {
    PDL_OPTAB_GO = 0,    /* options stored: go on */
    PDL_OPTAB_DONE = 1,  /* an action (--help) ran: exit 0 */
    PDL_OPTAB_USAGE = 2, /* usage error, err says which flag and value: exit 2 */
} pdl_optab_result_t;

/*
 * Apply every default of t to opts, then parse argv[1..argc-1] into it. A positional argument goes to
 * t->positional, or is a usage error without one, unless t->stop_at_positional, where the first one
 * ends the parse and *next_p is its index (argc if none; next_p may be NULL otherwise). opts must be
 * zeroed or pre-set by the caller for fields without a default.
 */
pdl_optab_result_t pdl_optab_parse(const pdl_optab_t *t, void *opts, int argc, char **argv, int *next_p,
                                   pdl_error_t *err);

/* Apply every default of t to opts, as pdl_optab_parse does first: for a program's "defaults" function. */
pdl_status_t pdl_optab_defaults(const pdl_optab_t *t, void *opts, pdl_error_t *err);

/* --help: t->usage, then one line (or more) per visible row: flag, metavar, help, "(default X)"; a row
 * with neither help nor default prints its flag alone. */
void pdl_optab_help(const pdl_optab_t *t, FILE *f);

/* The row named `name` (without dashes), or NULL: for docs and tests that ask what a table holds. */
const pdl_optdef_t *pdl_optab_find(const pdl_optab_t *t, const char *name);

#endif /* PDL_APP_OPTAB_H */
