/*
 * run_ceiling.h -- the same-run ceilings `pdlink run` prints next to its transfer rates (SPEC §8):
 * memcpy bandwidth (the bound of the shm backend) and a plain loopback TCP stream (the bound of the
 * tcp backend), each with a given number of threads, warm pre-faulted buffers, GB = 10^9 bytes.
 */
#ifndef PDL_CLI_RUN_CEILING_H
#define PDL_CLI_RUN_CEILING_H

#include <stddef.h>

#include "pdlink/status.h"

/*
 * memcpy between two pre-faulted, warmed buffers of buf_bytes per thread, `threads` threads at once,
 * until `total_bytes` were copied in all; *gbps_p gets total_bytes / wall time.
 */
pdl_status_t pdl_run_ceiling_memcpy(int threads, size_t buf_bytes, size_t total_bytes, double *gbps_p,
                                    pdl_error_t *err);

/*
 * `threads` loopback TCP connections, each with a writer thread sending 1 MiB writes and a reader
 * thread receiving, `total_bytes` in all after a warm-up; *gbps_p gets total_bytes / wall time.
 */
pdl_status_t pdl_run_ceiling_tcp(int threads, size_t total_bytes, double *gbps_p, pdl_error_t *err);

#endif
