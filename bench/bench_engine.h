/*
 * bench_engine.h -- `pdlink bench`: the transfer engine measured against this machine's own ceilings
 * (docs/benchmarks.md#how-it-is-measured). The CLI entry (src/cli/bench.c) forwards its arguments here.
 */
#ifndef PDL_BENCH_ENGINE_H
#define PDL_BENCH_ENGINE_H

/* Returns the process exit status: 0 ok, 1 a validation failed, 2 usage or set-up error. */
int pdl_bench_engine_main(int argc, char **argv);

#endif
