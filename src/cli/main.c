/*
 * main.c -- the `pdlink` program: its own options (one table, app/optab.h), then the sub-command
 * (plan, bench, run, check-config) named by the first positional argument, which gets the rest of argv.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/optab.h"
#include "cli/cli.h"
#include "common/log.h"
#include "pdlink/version.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} commands[] = {
    {"run", pdl_cli_run, "run a local P/D cluster per topology, drive a workload, verify every byte"},
    {"plan", pdl_cli_plan, "explain how KV moves between prefill and decode ranks for a topology"},
    {"bench", pdl_cli_bench, "measure the transfer engine against this machine's own ceilings"},
    {"check-config", pdl_cli_check_config, "validate a --kv-transfer-config JSON without starting anything"},
};

/* The program's options hold nothing: each row acts at once. */
typedef struct main_opts {
    int unused;
} main_opts_t;

static pdl_status_t set_log_level(void *opts, const pdl_optdef_t *row, const char *flag, const char *value,
                                  bool *done_p, pdl_error_t *err)
{
    (void)opts, (void)row, (void)done_p;
    int lvl = pdl_log_level_parse(value);
    if (lvl < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected error, warn, info, debug or trace", flag, value);
    pdl_log_set_level((pdl_log_level_t)lvl);
    return PDL_OK;
}

static pdl_status_t print_version(void *opts, const pdl_optdef_t *row, const char *flag, const char *value,
                                  bool *done_p, pdl_error_t *err)
{
    (void)opts, (void)row, (void)flag, (void)value, (void)err;
    printf("pdlink %s\n", PDL_VERSION_STRING);
    *done_p = true;
    return PDL_OK;
}

static void help_commands(FILE *f)
{
    fprintf(f, "\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`pdlink COMMAND --help` describes a command. Logs go to stderr; PDLINK_LOG_LEVEL sets the\n"
               "level too, and --log-level wins over it.\n");
}

static const pdl_optdef_t main_rows[] = {
    {.name = "log-level", .kind = PDL_OPT_CALL, .metavar = "LEVEL", .set = set_log_level,
     .help = "error, warn, info, debug or trace (default info)"},
    {.name = "version", .kind = PDL_OPT_CALL, .set = print_version, .help = "print the version and exit"},
    {.name = "help", .alias = 'h', .kind = PDL_OPT_HELP, .help = "this text"},
    {0},
};

static const pdl_optab_t main_table = {
    .prog = "pdlink",
    .usage = "usage: pdlink [--log-level LEVEL] COMMAND [ARGS...]\n\n",
    .rows = main_rows,
    .help_tail = help_commands,
    .stop_at_positional = true,
};

int main(int argc, char **argv)
{
    const char *env = getenv("PDLINK_LOG_LEVEL");
    if (env != NULL && pdl_log_level_parse(env) >= 0)
        pdl_log_set_level((pdl_log_level_t)pdl_log_level_parse(env));
    main_opts_t o = {0};
    pdl_error_t err;
    pdl_error_clear(&err);
    int i = argc;
    pdl_optab_result_t r = pdl_optab_parse(&main_table, &o, argc, argv, &i, &err);
    if (r == PDL_OPTAB_DONE)
        return 0;
    if (r == PDL_OPTAB_USAGE)
        fprintf(stderr, "pdlink: %s\n", err.msg);
    if (r == PDL_OPTAB_USAGE || i >= argc) {
        pdl_optab_help(&main_table, stderr);
        return 2;
    }
    for (size_t c = 0; c < sizeof(commands) / sizeof(commands[0]); c++)
        if (strcmp(argv[i], commands[c].name) == 0)
            return commands[c].fn(argc - i, argv + i);
    fprintf(stderr, "pdlink: unknown command '%s'\n", argv[i]);
    pdl_optab_help(&main_table, stderr);
    return 2;
}
