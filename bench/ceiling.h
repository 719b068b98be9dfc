/*
 * ceiling.h -- this machine's own ceilings, measured in the same run as the figure they bound
 * (docs/benchmarks.md#how-it-is-measured).
 *
 * memcpy: the bandwidth of copying between two warm buffers with T threads (each thread copies 1/T
 * of the bytes between two barriers), whole-loop timer, one untimed warm-up pass first. When each
 * thread copies 8 MiB or more it is the faster of glibc memcpy and the engine's streaming copy (non-temporal,
 * page-interleaved; src/common/copy.c): on this VM glibc's speed depends on the call size (~10 GB/s
 * for 64 MiB calls, ~17 GB/s for 128 MiB ones with 2 threads), and a ceiling must be the best of both. Copies below
 * PDL_CEILING_SPLIT_MIN use one thread, as the engine does (waking a second thread costs more than it
 * saves there). TCP: a plain stream over a loopback (or any local) address with large writes, one
 * sender and one receiver thread per stream (reads of 256 KiB with MSG_WAITALL: larger reads are
 * slower here), warm buffers, warm-up excluded. GB = 10^9 bytes.
 *
 * Buffers: the caller may pass its own (so the ceiling touches exactly the memory the measured path
 * touches), or use the one-shot helpers, which allocate, pre-fault and warm their own.
 * Nothing here keeps global state; every function is thread-safe.
 */
#ifndef PDL_BENCH_CEILING_H
#define PDL_BENCH_CEILING_H

#include <stdbool.h>
#include <stddef.h>

#define PDL_CEILING_SPLIT_MIN (4u << 20)

/*
 * Which ceiling bounds a backend (by name: "shm", "tcp", "ucx") between two processes of this host:
 * true = memcpy, false = a TCP stream. ucx follows the transport UCX picks: its shared-memory ones
 * (memcpy) unless UCX_TLS names only network transports (e.g. UCX_TLS=tcp: a TCP stream).
 */
bool pdl_ceiling_is_memcpy(const char *backend);

typedef struct pdl_ceiling_memcpy pdl_ceiling_memcpy_t;

/* A copier with `threads` threads (1..64) started once; NULL on failure. */
pdl_ceiling_memcpy_t *pdl_ceiling_memcpy_create(int threads);
/*
 * Copy `bytes` from src to dst `reps` times (after one untimed warm-up copy); returns GB/s of the
 * timed loop (bytes * reps / seconds / 1e9).
 */
double pdl_ceiling_memcpy_run(pdl_ceiling_memcpy_t *c, void *dst, const void *src, size_t bytes, int reps);
void pdl_ceiling_memcpy_destroy(pdl_ceiling_memcpy_t *c);

/* One shot: allocate and pre-fault two buffers of `bytes`, warm them, measure, free. < 0 on failure. */
double pdl_ceiling_memcpy_gbps(size_t bytes, int threads, int reps);

/*
 * TCP stream ceiling: `streams` connections to a listener on `host` (e.g. "127.0.0.1"; port chosen by
 * the kernel), `total_bytes` spread over the streams, written `write_size` bytes per send (1 MiB is a
 * "large write"; 128 KiB is iperf3's default). 16 MiB per stream are sent first and not timed.
 * Returns GB/s, or < 0 on failure (message on stderr).
 */
double pdl_ceiling_tcp_gbps(const char *host, size_t total_bytes, size_t write_size, int streams);
/*
 * The same with the buffers each side cycles through set to `buf_bytes` (>= write_size): pass the
 * bytes of one batch so the stream touches as much memory as the transfer it bounds (a 1 MiB batch
 * is served from cache, a 256 MiB one from DRAM). pdl_ceiling_tcp_gbps uses min(64 MiB, total/streams).
 */
double pdl_ceiling_tcp_gbps_buf(const char *host, size_t total_bytes, size_t write_size, int streams,
                                size_t buf_bytes);
/* The same with congestion control `cc` (TCP_CONGESTION) set on both ends; NULL or "" = the system
 * default. A transfer whose sockets use some algorithm is bounded by a stream using it too. */
double pdl_ceiling_tcp_gbps_cc(const char *host, size_t total_bytes, size_t write_size, int streams,
                               size_t buf_bytes, const char *cc);

/*
 * A TCP stream ceiling kept open across measurements, for benchmarks that alternate it with the
 * transfer it bounds: `streams` connected pairs over `host` (both ends in this process), congestion
 * control `cc` on both ends (NULL or "" = the system default), TCP_NODELAY. The one-shot functions
 * above open fresh connections and fault in fresh buffers for every figure, which the engine they
 * bound never does (its connections and regions live for the whole run); this one does neither, so
 * it can be alternated cheaply with the engine's loop. NULL on failure (message on stderr).
 */
typedef struct pdl_ceiling_tcp pdl_ceiling_tcp_t;
pdl_ceiling_tcp_t *pdl_ceiling_tcp_create(const char *host, int streams, const char *cc);
/*
 * Stream `total_bytes` (split evenly over the streams) with `write_size` per send and reads of
 * min(write_size, 256 KiB): stream i's sender cycles over its slice of src and its receiver over the
 * same slice of dst (slice = buf_bytes / streams, rounded down to 4 KiB; it must hold one write, else
 * -1). The caller's buffers: pass the memory the bounded transfer touches (e.g. dst = the engine's
 * local region of a READ), pre-faulted. One untimed pass over each slice (at most 16 MiB) runs right
 * before the timed bytes. Returns GB/s, or < 0 on failure (message on stderr). Not thread-safe per
 * object.
 */
double pdl_ceiling_tcp_run(pdl_ceiling_tcp_t *t, void *dst, const void *src, size_t buf_bytes, size_t total_bytes,
                           size_t write_size);
/* Closes the connections; NULL is a no-op. */
void pdl_ceiling_tcp_destroy(pdl_ceiling_tcp_t *t);

/* Allocate `bytes` of anonymous memory, pre-faulted (MAP_POPULATE + a write per page); NULL on failure.
 * Free with pdl_ceiling_free(p, bytes). */
void *pdl_ceiling_alloc(size_t bytes);
void pdl_ceiling_free(void *p, size_t bytes);

#endif /* PDL_BENCH_CEILING_H */
