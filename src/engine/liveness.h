/*
 * liveness.h -- whether a peer process on this host still runs, through a pidfd (immune to pid reuse
 * once open) that is proved to name the process that sent its engine descriptor: that descriptor
 * carries the sender's pid and its start time (field 22 of /proc/<pid>/stat), and the pidfd is kept
 * only if the process behind it started then. A pid from another pid namespace on the same host, or a
 * pid reused since, names a process with another start time, so it is never mistaken for the peer.
 * shm watches every peer this way; ucx the peers it reaches over UCX's shared memory, where UCX itself
 * notices a dead peer only after its keepalive interval (20 s by default) and never while the peer is
 * an unreaped zombie.
 */
#ifndef PDL_ENGINE_LIVENESS_H
#define PDL_ENGINE_LIVENESS_H

#include <stdbool.h>
#include <stdint.h>

/* Start time of process `pid` in clock ticks after boot, or 0 if it cannot be read (no such process,
 * no /proc). */
uint64_t pdl__proc_start_time(int64_t pid);

/* A pidfd for `pid` (close it), or -1 with errno: ESRCH the process is gone, ESTALE when `start` is
 * not 0 and the process now named `pid` started at another time (readable start time only: 0 skips
 * the proof), EINVAL a pid out of range, others from pidfd_open. */
int pdl__proc_pidfd(int64_t pid, uint64_t start);

/* Whether the process behind `pidfd` has exited: a pidfd becomes readable on exit, zombie or reaped. */
bool pdl__proc_exited(int pidfd);

/*
 * How many TCP connections of this network namespace are ESTABLISHED between local port `local_port`
 * and numeric address `host` (IPv4, IPv6, or IPv4 reached through a dual-stack socket), asked of the
 * kernel (sock_diag), or -1 with errno when it cannot tell (host not numeric, no sock_diag). A process
 * that dies has its connections closed by its kernel (a FIN, seen here at once), so an established
 * connection from a host says some process there still runs -- which one, the kernel cannot say.
 * A host that vanished without closing them keeps them until the keepalive or user timeout set on
 * the data sockets ends them (tcp.c: pdl__tcp_bound_recovery). Blocks the caller at most ~100 ms.
 */
int pdl__tcp_established(uint16_t local_port, const char *host);

#endif
