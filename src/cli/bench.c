/* bench.c -- placeholder until the `pdlink bench` sub-command lands; says so and fails. */
#include <stdio.h>

#include "cli/cli.h"

int pdl_cli_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "pdlink bench: not built yet\n");
    return 2;
}
