/*
 * main.c -- the `pdlink` program: dispatches to a sub-command (plan, bench, run).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/log.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
} commands[] = {
    {"run", pdl_cli_run, "run a local P/D cluster per topology, drive a workload, verify every byte"},
    {"plan", pdl_cli_plan, "explain how KV moves between prefill and decode ranks for a topology"},
    {"bench", pdl_cli_bench, "measure the transfer engine against this machine's own ceilings"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: pdlink [--log-level LEVEL] COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %-6s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`pdlink COMMAND --help` describes a command. Logs go to stderr; PDLINK_LOG_LEVEL or\n"
               "--log-level sets error|warn|info|debug|trace (default info).\n");
}

int main(int argc, char **argv)
{
    const char *env = getenv("PDLINK_LOG_LEVEL");
    if (env != NULL && pdl_log_level_parse(env) >= 0)
        pdl_log_set_level((pdl_log_level_t)pdl_log_level_parse(env));
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("pdlink %s\n", PDL_VERSION_STRING);
            return 0;
        } else if (strcmp(argv[i], "--log-level") == 0 && i + 1 < argc) {
            int lvl = pdl_log_level_parse(argv[++i]);
            if (lvl < 0) {
                fprintf(stderr, "pdlink: unknown log level '%s' (error|warn|info|debug|trace)\n", argv[i]);
                return 2;
            }
            pdl_log_set_level((pdl_log_level_t)lvl);
        } else {
            fprintf(stderr, "pdlink: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    for (size_t c = 0; c < sizeof(commands) / sizeof(commands[0]); c++)
        if (strcmp(argv[i], commands[c].name) == 0)
            return commands[c].fn(argc - i, argv + i);
    fprintf(stderr, "pdlink: unknown command '%s'\n", argv[i]);
    usage(stderr);
    return 2;
}
