/*
 * push.h -- what WRITE mode's files share (internal): the producer that pushes (push.c), the consumer
 * that expects the push (push_recv.c) and the park both use (push_park.c).
 *
 * roles.c dispatches to these roles; they never call each other.
 *
 * The park holds messages that came before the push or receive they belong to, under "rank|transfer
 * id" in inst->parked: a producer rank's remote_blocks or abandon that came before pdl_instance_push,
 * and a consumer's failed write_done that came before pdl_instance_expect_push (under "0|transfer id",
 * dropped by the first local rank). The pushes, the receives and the park are all guarded by inst->push_mu, which is
 * never held while calling into the held-transfer table (held_mu) or sending.
 */
#ifndef PDL_CONNECTOR_PUSH_H
#define PDL_CONNECTOR_PUSH_H

#include "connector/internal.h"

/* Bounds on the park per instance: a flood of unknown transfer ids cannot grow memory. Entries, and
 * bytes of block ids: each list holds at most num_blocks ids (a push never holds more), and all of them
 * together at most PDL_PARK_MAX_BYTES. Without the byte bound, 1,024 lists of up to 1,048,576 ids each
 * could be parked (~4 GiB; 150 made-up ones would grow a prefill from 12 MB to 631 MB). */
#define PDL_PARK_MAX 1024
#define PDL_PARK_MAX_BYTES (4u << 20)
#define PDL_PARK_KEY_MAX (PDL_WIRE_ID_MAX + 16)

typedef struct pdl_parked {
    uint32_t *blocks; /* NULL when abandoned */
    bool abandoned;   /* the consumer said it will not take the push (a failed release came first); on a
                       * consumer: the producer abandoned the transfer (a failed write_done came first) */
    char sender[64];  /* the host it came from (Peer-Address; "" = unknown): an abandon's is checked when the
                       * push is made, a remote_blocks' binds an abandon that would replace it */
    size_t n;
    int decode_dp;
    int said_tp; /* consumer_tp_size from the message, 0 when absent */
    int rank;    /* the rank whose service thread drops it after defer_timeout */
    uint64_t at_ns;
} pdl_parked_t;

/* Free a parked entry (NULL is fine). */
void pdl__parked_free(pdl_parked_t *k);
/* The park key of rank `rank` and transfer tid, "rank|tid", into key[PDL_PARK_KEY_MAX]. */
void pdl__park_key(char key[PDL_PARK_KEY_MAX], int rank, const char *tid);
/* Drop rank r's parked entries older than defer_timeout (remote_blocks counted in remote_blocks_dropped;
 * abandons expire uncounted: they were acted on when they came) / free the whole park at destroy. */
void pdl__park_reap(pdl_rank_t *r);
void pdl__park_free_all(pdl_instance_t *inst);

/* push.c, producer: reap rank r's shares still waiting for remote_blocks after defer_timeout / free every
 * push and tombstone at instance destroy / pdl_instance_abandon's failed write_done. */
void pdl__push_reap_shares(pdl_rank_t *r);
void pdl__push_free_pushes(pdl_instance_t *inst);
pdl_status_t pdl__push_abandon_producer(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                                        pdl_error_t *err);

/* push_recv.c, consumer: finish rank r's part of receives past transfer_timeout / take every receive out
 * of the map at instance destroy (its caller still frees it) / pdl_instance_abandon's failed releases. */
void pdl__recv_reap(pdl_rank_t *r);
void pdl__recv_orphan_all(pdl_instance_t *inst);
pdl_status_t pdl__recv_abandon(pdl_instance_t *inst, const pdl_kv_params_t *params, const char *request_id,
                               pdl_error_t *err);

#endif /* PDL_CONNECTOR_PUSH_H */
