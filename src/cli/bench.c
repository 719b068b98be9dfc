/*
 * bench.c -- the `pdlink bench` sub-command: forwards to the engine benchmark in bench/bench_engine.c
 * (method, columns and options are described there and in docs/engine.md), or with --connector to the
 * connector benchmark in bench/bench_connector.c (docs/connector.md).
 */
#include <string.h>

#include "bench/bench_connector.h"
#include "bench/bench_engine.h"
#include "cli/cli.h"

int pdl_cli_bench(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--connector") == 0)
            return pdl_bench_connector_main(argc, argv);
    return pdl_bench_engine_main(argc, argv);
}
