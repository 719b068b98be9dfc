/*
 * notify.c -- the notify fan-out (notify.h): the one place that encodes a control message for a peer
 * rank and sends it to that rank's notify port.
 */
#include <stdio.h>
#include <string.h>

#include "connector/notify.h"
#include "pdlink/topo.h"

/* What each message is: its name, wire type, the sender's counter kind, and the counter a send bumps
 * here (releases and keepalives are counted by sender.c once the DEALER took them). */
typedef struct note_info {
    const char *name;
    pdl_msg_type_t type;
    int out_kind;
    size_t ctr;
    bool counted;
} note_info_t;

static const note_info_t NOTES[] = {
    [PDL_NOTE_RELEASE] = {"release", PDL_MSG_RELEASE, PDL_OUT_RELEASE, 0, false},
    [PDL_NOTE_KEEPALIVE] = {"keepalive", PDL_MSG_KEEPALIVE, PDL_OUT_KEEPALIVE, 0, false},
    [PDL_NOTE_REMOTE_BLOCKS] = {"remote_blocks", PDL_MSG_REMOTE_BLOCKS, PDL_OUT_OTHER,
                                offsetof(pdl_rank_counters_t, remote_blocks_sent), true},
    [PDL_NOTE_WRITE_DONE] = {"write_done", PDL_MSG_WRITE_DONE, PDL_OUT_OTHER,
                             offsetof(pdl_rank_counters_t, write_done_sent), true},
};

/* Consumer rank d tells producer rank g (of P, with D consumer ranks) once: by g's first consumer rank. */
static bool speaks_for(int P, int D, int d, int g)
{
    int cfirst = 0, ccount = 0;
    return pdl_topo_consumers_of(P, D, g, &cfirst, &ccount, NULL) == PDL_OK && cfirst == d;
}

/* Fill the fields of the message from local rank r to remote rank t. The block ids are borrowed. */
static void fill(const pdl_rank_t *r, const pdl_notify_t *n, int t, pdl_msg_t *m)
{
    int local_tp = r->inst->tp, remote_tp = n->to->tp;
    snprintf(m->transfer_id, sizeof(m->transfer_id), "%s", n->transfer_id);
    switch (n->note) {
    case PDL_NOTE_RELEASE:
        m->status = n->ok ? PDL_RELEASE_OK : PDL_RELEASE_FAILED;
        m->producer_tp_size = remote_tp;
        m->producer_tp_rank = t;
        m->consumer_tp_size = local_tp;
        m->consumer_tp_rank = r->rank;
        break;
    case PDL_NOTE_KEEPALIVE:
        m->consumer_tp_size = local_tp;
        m->consumer_tp_rank = r->rank;
        break;
    case PDL_NOTE_REMOTE_BLOCKS:
        snprintf(m->req_id, sizeof(m->req_id), "%.*s", PDL_WIRE_ID_MAX,
                 n->request_id && n->request_id[0] ? n->request_id : n->transfer_id);
        m->decode_rank = r->inst->cfg.dp_rank;
        m->consumer_tp_size = local_tp;
        m->consumer_tp_rank = r->rank;
        m->block_ids = (uint32_t *)n->blocks;
        m->num_blocks = n->nblocks;
        break;
    case PDL_NOTE_WRITE_DONE:
        m->status = n->ok ? PDL_RELEASE_OK : PDL_RELEASE_FAILED;
        m->producer_tp_size = local_tp;
        m->producer_tp_rank = r->rank;
        break;
    }
}

static pdl_status_t encode(const pdl_rank_t *r, const pdl_notify_t *n, int t, pdl_bytes_t *b, pdl_error_t *err)
{
    pdl_msg_t m;
    pdl_msg_init(&m, NOTES[n->note].type);
    fill(r, n, t, &m);
    pdl_status_t st = pdl_wire_encode_msg(&m, b, err);
    m.block_ids = NULL; /* borrowed */
    m.num_blocks = 0;
    pdl_msg_clear(&m);
    return st;
}

/* One message to remote rank t: encoded, on the lane's DEALER or queued for the service thread. */
static pdl_status_t send_one(pdl_rank_t *r, const pdl_notify_t *n, int t, pdl_error_t *err)
{
    const note_info_t *ni = &NOTES[n->note];
    int off = pdl_topo_port_offset(n->to->dp, n->to->tp, t);
    if (off < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "no notify port for DP rank %d of TP %d", n->to->dp, n->to->tp);
    int port = n->to->notify_base + off, kind = ni->out_kind | (n->verified ? PDL_OUT_VERIFIED : 0);
    pdl_bytes_t b = {0};
    pdl_status_t st = encode(r, n, t, &b, err);
    if (st == PDL_OK && n->dealers == NULL) {
        st = pdl__outq_send(r, n->to->host, port, kind, &b, err);
    } else if (st == PDL_OK) {
        char ep[PDL_WIRE_HOST_MAX + 32];
        if (pdl__endpoint(ep, sizeof(ep), n->to->host, port) < 0)
            st = pdl_error_set(err, PDL_ERR_INVALID, "host %.64s too long", n->to->host);
        else if (!pdl__dealer_send(r, n->dealers, ep, kind, &b))
            st = pdl_error_set(err, PDL_ERR_TRANSPORT, "not sent to %s (counted by the sender)", ep);
    }
    pdl_bytes_free(&b);
    if (st == PDL_OK && ni->counted)
        pdl__ctr_add(&r->ctr, ni->ctr, 1);
    return st;
}

/* The remote ranks of n's set for local rank r, as [first, first + count). */
static pdl_status_t target_range(const pdl_rank_t *r, const pdl_notify_t *n, int *first, int *count,
                                 pdl_error_t *err)
{
    if (n->count > 0) {
        *first = n->first;
        *count = n->count;
        return PDL_OK;
    }
    int local_tp = r->inst->tp, remote_tp = n->to->tp;
    pdl_status_t st = n->set == PDL_NOTIFY_CONSUMERS
                          ? pdl_topo_consumers_of(local_tp, remote_tp, r->rank, first, count, err)
                          : pdl_topo_group(remote_tp, local_tp, r->rank, first, count, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "%s of %.100s: no rank set for remote TP %d with local TP %d",
                                NOTES[n->note].name, n->transfer_id, remote_tp, local_tp);
    return PDL_OK;
}

pdl_status_t pdl__notify(pdl_rank_t *r, const pdl_notify_t *n, int *sent, pdl_error_t *err)
{
    int first = 0, count = 0, nsent = 0;
    if (sent)
        *sent = 0;
    pdl_status_t st = target_range(r, n, &first, &count, err);
    for (int t = first; st == PDL_OK && t < first + count; t++) {
        if (n->set == PDL_NOTIFY_SPOKEN && !speaks_for(n->to->tp, r->inst->tp, r->rank, t))
            continue;
        if (n->skip && n->skip(r, t, n->skip_arg))
            continue;
        pdl_error_t e;
        pdl_error_clear(&e);
        pdl_status_t s = send_one(r, n, t, &e);
        if (s == PDL_OK) {
            nsent++;
        } else if (n->stop_at_error) {
            st = pdl_error_set(err, s, "%s of %.100s to remote rank %d: %s", NOTES[n->note].name,
                               n->transfer_id, t, e.msg);
        } else if (s != PDL_ERR_TRANSPORT) { /* a refused DEALER was counted and logged by the sender */
            pdl_warn("rank %d: %s of %.100s to remote rank %d not sent: %s", r->rank, NOTES[n->note].name,
                     n->transfer_id, t, e.msg);
        }
    }
    if (sent)
        *sent = nsent;
    return st;
}
