/*
 * opts.h -- getopt_long_only for the programs whose flags copy another tool's (`vllm serve`, vllm-router),
 * with the checks those tools make and getopt does not.
 *
 * getopt_long_only takes "--flag value", "--flag=value", "-flag value" (vLLM's "-tp 4") and returns
 * positionals in order. On top of it, pdl_opts_next:
 *   - refuses abbreviations ("--tensor" for "--tensor-parallel-size"): neither vLLM's command lines nor
 *     vllm-router's need them, and accepting a prefix would turn a typo of one flag into another flag;
 *   - optionally reads '_' in a flag name as '-' (vLLM accepts --tensor_parallel_size), by rewriting the
 *     name part of that argv element in place;
 *   - turns getopt's '?' and ':' into a message naming the flag as it was typed.
 * getopt keeps its state in optind/optarg (process globals), so a parse must run on one thread and may
 * not interleave with another getopt loop; the programs parse once, from main().
 */
#ifndef PDL_APP_OPTS_H
#define PDL_APP_OPTS_H

#include <getopt.h>
#include <stdbool.h>

#include "pdlink/status.h"

typedef struct pdl_opts {
    int argc;
    char **argv;
    const struct option *longopts; /* ends with a zeroed entry; every entry has flag == NULL */
    bool dash_underscores;         /* read '_' in a flag name as '-' (rewrites argv in place) */
    int rest;                      /* > 0 once getopt is done: the next positional after "--" */
    int at;                        /* argv index of the positional last returned */
    bool done;                     /* set by a pdl_opts_take_fn to end pdl_opts_parse early */
    char flag[64];                 /* the flag last returned, as typed ("-tp", "--port"), for messages */
} pdl_opts_t;

/* Start a parse of argv[1..argc-1]. Resets getopt, so a program (or a test) may parse several times. */
void pdl_opts_init(pdl_opts_t *o, int argc, char **argv, const struct option *longopts, bool dash_underscores);

/*
 * The next argument. Returns the `val` of the flag found (its value, if it takes one, in *value_p), 1 for
 * a positional argument (in *value_p), 0 at the end, or -1 on a usage error with err naming the flag:
 * "unknown flag '--bogus' (see --help)", "--port needs a value", "--vllm-pd-disaggregation takes no value".
 * Flag `val`s must therefore be > 1. *value_p points into argv; a positional's index is then in o->at.
 */
int pdl_opts_next(pdl_opts_t *o, const char **value_p, pdl_error_t *err);

/*
 * What a parse does with each argument: opt is the flag's `val` (o->flag holds the flag as typed, value
 * its value or NULL for a switch) or 1 for a positional (value). Return PDL_OK to go on, an error (with
 * err filled) to stop with it; set o->done to end the parse with success (--help).
 */
typedef pdl_status_t (*pdl_opts_take_fn)(pdl_opts_t *o, int opt, const char *value, void *ctx, pdl_error_t *err);

/* The whole loop: pdl_opts_init, then take() for each argument. Returns PDL_OK, PDL_ERR_INVALID for a
 * usage error found by pdl_opts_next, or take's error. */
pdl_status_t pdl_opts_parse(int argc, char **argv, const struct option *longopts, bool dash_underscores,
                            pdl_opts_take_fn take, void *ctx, pdl_error_t *err);

#endif /* PDL_APP_OPTS_H */
