/*
 * bench.c -- the `pdlink bench` sub-command: forwards to the engine benchmark in bench/bench_engine.c
 * (method, columns and options are described there and in docs/engine.md).
 */
#include "bench/bench_engine.h"
#include "cli/cli.h"

int pdl_cli_bench(int argc, char **argv) { return pdl_bench_engine_main(argc, argv); }
