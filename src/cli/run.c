/* run.c -- placeholder until the `pdlink run` sub-command lands; says so and fails. */
#include <stdio.h>

#include "cli/cli.h"

int pdl_cli_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "pdlink run: not built yet\n");
    return 2;
}
