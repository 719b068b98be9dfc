/*
 * cli.h -- sub-commands of the `pdlink` program. Each takes the arguments after its name
 * (argv[0] is the sub-command name) and returns the process exit status:
 * 0 success, 1 the job ran and found a failure, 2 usage or set-up error.
 */
#ifndef PDL_CLI_H
#define PDL_CLI_H

int pdl_cli_plan(int argc, char **argv);
int pdl_cli_bench(int argc, char **argv);
int pdl_cli_run(int argc, char **argv);
int pdl_cli_check_config(int argc, char **argv);

#endif
