/*
 * notify.h -- the notify fan-out (internal): one control message from a local rank to the notify ports
 * of a set of ranks of a remote instance. Releases, keepalives, remote_blocks, write_done and every
 * abandon go through pdl__notify, so the messages' encoding, the rank group, each rank's port, the
 * endpoint, the send, its counter and its failure are written once (notify.c).
 *
 * Which ranks: a consumer rank reads from the producer ranks of its group (pdl_topo_group); each of
 * those is told some things once, by the first consumer rank of its group (remote_blocks, abandons);
 * a producer rank writes to the consumer ranks it notifies (pdl_topo_consumers_of). Rank t of the
 * remote instance listens on notify_base + pdl_topo_port_offset(dp, tp, t).
 *
 * How: on a DEALER cache its owner thread holds (a lane's: no thread hop on the release path), or
 * queued for the rank's service thread (any thread; sender.c). Either way the DEALER is drawn from the
 * socket budget, in the verified share only when the caller says the peer answered our handshakes.
 */
#ifndef PDL_CONNECTOR_NOTIFY_H
#define PDL_CONNECTOR_NOTIFY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "connector/internal.h"
#include "connector/resolve.h"

/* The messages a rank sends to its peers' notify ports (docs/protocol.md). */
typedef enum pdl_note {
    PDL_NOTE_RELEASE,       /* consumer -> producer: done with (or giving up) the held blocks */
    PDL_NOTE_KEEPALIVE,     /* consumer -> pdlink producer: extend the hold's lease */
    PDL_NOTE_REMOTE_BLOCKS, /* consumer -> producer, WRITE: where to write */
    PDL_NOTE_WRITE_DONE,    /* producer -> consumer, WRITE: written (or not) */
} pdl_note_t;

typedef enum pdl_notify_set {
    PDL_NOTIFY_GROUP,     /* the producer ranks the local consumer rank reads from */
    PDL_NOTIFY_SPOKEN,    /* those of them the local rank speaks for (it is its group's first consumer rank) */
    PDL_NOTIFY_CONSUMERS, /* the consumer ranks the local producer rank notifies */
} pdl_notify_set_t;

/* Should remote rank `target` be left out (a keepalive to a producer that is not pdlink)? */
typedef bool (*pdl_notify_skip_fn)(const pdl_rank_t *r, int target, const void *arg);

typedef struct pdl_notify {
    pdl_note_t note;
    const char *transfer_id;
    bool ok;                     /* release, write_done: the status they carry */
    const char *request_id;      /* remote_blocks: the request (NULL or "": the transfer id) */
    const uint32_t *blocks;      /* remote_blocks: the consumer's blocks */
    size_t nblocks;
    const pdl_peer_addr_t *to;   /* the remote instance: host, notify_base, dp, tp */
    pdl_notify_set_t set;
    int first, count;            /* count > 0: these remote ranks instead of `set`'s (a READ plan's group) */
    pdl_notify_skip_fn skip;     /* NULL: every rank of the set */
    const void *skip_arg;
    pdl_strmap_t *dealers;       /* send on this cache (only its owner thread calls); NULL: r's service thread */
    bool verified;               /* the remote instance answered our handshakes: the verified share */
    bool stop_at_error;          /* return the first failure; else log each one and go on */
} pdl_notify_t;

/*
 * Send n's message from local rank r to each rank of n's set, counting each one sent in the message's
 * counter (releases and keepalives by the sender, write_done_sent, remote_blocks_sent); *sent (may be
 * NULL) is how many left. PDL_OK unless the set does not exist for the TPs (PDL_ERR_INVALID) or, with
 * stop_at_error, a message failed (its status; the error names the message, transfer and remote rank).
 */
pdl_status_t pdl__notify(pdl_rank_t *r, const pdl_notify_t *n, int *sent, pdl_error_t *err);

#endif /* PDL_CONNECTOR_NOTIFY_H */
