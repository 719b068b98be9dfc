/*
 * tcp.h -- internals shared by the two halves of the tcp backend: tcp.c (initiator side and the ops
 * table) and tcp_server.c (owner side).
 */
#ifndef PDL_ENGINE_TCP_H
#define PDL_ENGINE_TCP_H

#include "engine/backend.h"
#include "engine/cudadrv.h"

typedef struct pdl_tcp_server pdl_tcp_server_t;

/* The tcp backend's engine state (e->bk). */
typedef struct pdl_tcp_engine {
    pdl_tcp_server_t *srv;
    /* The CUDA driver when it loads here (device memory then moves through staging windows, stage.h);
     * NULL otherwise, and the engine registers host memory only. Its context is chosen by the first
     * CUDA registration. */
    pdl_cudadrv_t *drv;
} pdl_tcp_engine_t;

/* Bind e->host:e->port (0 = ephemeral, e->port is updated) and start num_workers server threads. */
pdl_status_t pdl__tcp_server_start(pdl_engine_t *e, pdl_tcp_server_t **out, pdl_error_t *err);
/* Stop the threads, close every connection, release their references. Accepts NULL. */
void pdl__tcp_server_stop(pdl_tcp_server_t *srv);
/* Shut down the connections currently reading or writing `m` (deregistration). */
void pdl__tcp_server_kick(pdl_tcp_server_t *srv, pdl_mem_t *m);
/* tcp_sock.c: TCP_NODELAY, e->tcp_cc and pdl__tcp_bound_recovery; socket buffers are left to the kernel's autotuning (see docs/engine.md). */
void pdl__tcp_tune_socket(const pdl_engine_t *e, int fd);
/* Keepalive, TCP_USER_TIMEOUT and a retransmission ceiling on data socket fd (tcp.c says why and what
 * they bound); an option the kernel lacks is skipped. Cannot fail. */
void pdl__tcp_bound_recovery(int fd);
/* Resolve cfg->tcp_congestion into e->tcp_cc (see engine.h); PDL_ERR_INVALID if a named one cannot be set. */
pdl_status_t pdl__tcp_pick_congestion(pdl_engine_t *e, const char *want, pdl_error_t *err);

#endif
