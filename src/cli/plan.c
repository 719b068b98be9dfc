/* plan.c -- placeholder until the `pdlink plan` sub-command lands; says so and fails. */
#include <stdio.h>

#include "cli/cli.h"

int pdl_cli_plan(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "pdlink plan: not built yet\n");
    return 2;
}
