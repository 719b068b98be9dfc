/*
 * bench_connector.h -- `pdlink bench --connector`: the whole READ path of the connector (hold, plan,
 * descriptors, engine batches, releases, fan-in, free) between a prefill and a decode instance in one
 * process, against the engine-only batches of the same descriptors and memcpy of the same bytes, in
 * the same run (alternating pairs). Also the release latency against a ZeroMQ round trip, and split-head
 * plans against the homogeneous plan. The CLI entry (src/cli/bench.c) forwards its arguments here.
 */
#ifndef PDL_BENCH_CONNECTOR_H
#define PDL_BENCH_CONNECTOR_H

/* Returns the process exit status: 0 ok, 1 a byte differed or a transfer failed, 2 usage or set-up error. */
int pdl_bench_connector_main(int argc, char **argv);

#endif
