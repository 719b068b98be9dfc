/*
 * digest_check.c -- the consumer's half of KV integrity (docs/integrity.md): after a rank's reads of a
 * pull completed, fetch each producer rank's digests on its handshake port and compare them with
 * digests of the bytes that landed here, piece by piece of the rank's read plan.
 *
 * The fetch is one request/reply on a fresh DEALER drawn from the socket budget's handshake share (as a
 * handshake is), bounded by handshake_timeout. A producer that does not advertise `kv_digest` is not
 * asked; one that answers "unknown" or "off", or not at all, leaves the pull unverified (counted
 * kv_digest_unverified) rather than failing it: the check can only add failures that are real.
 */
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "connector/digest.h"
#include "connector/internal.h"
#include "common/clock.h"

/* One request/reply with producer rank `prank` of `addr`. */
static pdl_status_t fetch_exchange(pdl_rank_t *r, const pdl_peer_addr_t *addr, int prank, const pdl_bytes_t *req,
                                   pdl_digest_reply_t *out, pdl_error_t *err)
{
    char ep[PDL_WIRE_HOST_MAX + 32];
    int port = addr->hs_base + pdl_topo_port_offset(addr->dp, addr->tp, prank);
    if (pdl__endpoint(ep, sizeof(ep), addr->host, port) < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "kv digests: host %.64s too long", addr->host);
    void *s = pdl__request_dealer(r->inst, addr->host, err);
    if (s == NULL)
        return pdl_error_prefix(err, PDL_ERR_TRANSPORT, "kv digests from %s", ep);
    int timeout_ms = (int)(r->inst->cfg.conn.handshake_timeout_s * 1000.0);
    pdl_status_t st = PDL_OK;
    if (zmq_connect(s, ep) != 0 || zmq_send(s, req->data, req->len, ZMQ_DONTWAIT) < 0)
        st = pdl_error_set(err, PDL_ERR_TRANSPORT, "kv digests from %s: %s", ep, zmq_strerror(zmq_errno()));
    zmq_msg_t f[2];
    int nf = 0;
    zmq_pollitem_t it = {.socket = s, .events = ZMQ_POLLIN};
    if (st == PDL_OK && zmq_poll(&it, 1, timeout_ms) <= 0)
        st = pdl_error_set(err, PDL_ERR_TIMEOUT, "kv digests from %s: no reply within %d ms", ep, timeout_ms);
    for (int more = st == PDL_OK; more && nf < 2; nf++) {
        zmq_msg_init(&f[nf]);
        if (zmq_msg_recv(&f[nf], s, 0) < 0) {
            st = pdl_error_set(err, PDL_ERR_TRANSPORT, "kv digests from %s: %s", ep, zmq_strerror(zmq_errno()));
            nf++;
            break;
        }
        more = zmq_msg_more(&f[nf]);
    }
    /* The handshake server answers [identity, "", payload]: a DEALER sees ["", payload]. */
    if (st == PDL_OK && (nf != 2 || zmq_msg_size(&f[0]) != 0))
        st = pdl_error_set(err, PDL_ERR_PARSE, "kv digests from %s: reply of %d frames, expected [\"\", payload]", ep,
                           nf);
    if (st == PDL_OK)
        st = pdl_wire_decode_digest_reply(zmq_msg_data(&f[1]), zmq_msg_size(&f[1]), out, err);
    for (int i = 0; i < nf; i++)
        zmq_msg_close(&f[i]);
    zmq_close(s);
    return st;
}

static pdl_status_t fetch(pdl_rank_t *r, const pdl_peer_addr_t *addr, int prank, const char *tid,
                          pdl_digest_reply_t *out, pdl_error_t *err)
{
    pdl_bytes_t req = {0};
    pdl_status_t st = pdl_wire_encode_digest_request(tid, &req, err);
    if (st != PDL_OK)
        return st;
    pdl_budget_t *b = &r->inst->sockets;
    if (!pdl__budget_take(b, PDL_SOCKETS_HANDSHAKE)) {
        pdl__budget_refused(b, PDL_SOCKETS_HANDSHAKE);
        pdl_bytes_free(&req);
        return pdl_error_set(err, PDL_ERR_TRANSPORT, "kv digests of %.100s not fetched: the socket budget's "
                             "handshake share is spent", tid);
    }
    st = fetch_exchange(r, addr, prank, &req, out, err);
    pdl__budget_put(b, PDL_SOCKETS_HANDSHAKE);
    pdl_bytes_free(&req);
    return st;
}

/* What one producer rank's reply is compared with. */
typedef struct check_ctx {
    pdl_rank_t *r;
    const pdl_peer_addr_t *producer;
    const char *tid;
    const uint32_t *local_blocks;
    size_t n;
    uint32_t stride;
    uint64_t salt;
} check_ctx_t;

/* Compare the pieces of producer rank `prank` with its reply; the first mismatch goes to err. */
static pdl_status_t check_rank(const check_ctx_t *c, const pdl_read_plan_t *plan, int prank,
                               const pdl_digest_reply_t *rep, uint64_t *hashed, pdl_error_t *err)
{
    const pdl_kv_geometry_t *g = &c->r->mem.geo;
    uint32_t L = (uint32_t)c->r->inst->cfg.model.num_layers;
    if (rep->num_layers != L || rep->num_blocks < c->n)
        return pdl_error_set(err, PDL_ERR_MISMATCH, "kv digests of %.100s from producer rank %d: %u layers x %llu "
                             "blocks, expected %u layers and at least %zu blocks", c->tid, prank, rep->num_layers,
                             (unsigned long long)rep->num_blocks, L, c->n);
    uint64_t bad = 0;
    pdl_status_t st = PDL_OK;
    for (int k = 0; k < plan->num_pieces; k++) {
        const pdl_plan_piece_t *p = &plan->pieces[k];
        if (p->producer_rank != prank || p->src_head + p->num_heads > (int)rep->num_heads)
            continue;
        for (uint32_t l = 0; l < L; l++) {
            const uint8_t *base = (const uint8_t *)pdl_mem_ptr(pdl__layer_mem(&c->r->mem, (int)l)) +
                                  pdl__layer_off(&c->r->mem, (int)l);
            for (size_t i = 0; i < c->n; i++) {
                uint64_t pos = rep->num_blocks - c->n + i; /* the last n of the producer's blocks were read */
                if (!pdl_layout_digest_sampled(c->salt, l, pos, c->stride))
                    continue;
                for (int h = 0; h < p->num_heads; h++) {
                    uint64_t want = pdl_digest_reply_get(rep, l, pos, (uint32_t)(p->src_head + h));
                    uint64_t got = pdl_layout_digest_head(g, base, c->local_blocks[i], (uint32_t)(p->dst_head + h));
                    *hashed += (uint64_t)pdl_layout_num_halves(g) * pdl_layout_row_len(g) * g->block_size;
                    if (got == want || bad++ > 0)
                        continue;
                    st = pdl_error_set(err, PDL_ERR_MISMATCH,
                                       "kv digest mismatch: transfer %.100s layer %u block %zu (local block %u) head "
                                       "%d, producer rank %d -> consumer rank %d, peer %.100s (%.64s:%d): expected "
                                       "%016llx, landed %016llx",
                                       c->tid, l, i, c->local_blocks[i], p->first_head + h, prank, c->r->rank,
                                       c->producer->engine_id, c->producer->host, c->producer->hs_base,
                                       (unsigned long long)want, (unsigned long long)got);
                }
            }
        }
    }
    if (bad > 0) {
        PDL_CTR_ADD(c->r, kv_digest_mismatches, bad);
        if (bad > 1)
            pdl_error_prefix(err, st, "%llu pieces differ; the first", (unsigned long long)bad);
    }
    return st;
}

/* Does the cached peer of producer rank g advertise our digest? */
static bool peer_digests(pdl_xfer_side_t *side, const pdl_peer_addr_t *addr, int g)
{
    const pdl_peer_t *peer = pdl__peer_cached(side, addr, g);
    return peer != NULL && peer->meta.has_pdlink && strcmp(peer->meta.kv_digest, PDL_WIRE_DIGEST_XXH3) == 0;
}

pdl_status_t pdl__digests_check(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_peer_addr_t *producer,
                                const char *transfer_id, const pdl_read_plan_t *plan, const uint32_t *local_blocks,
                                size_t n, pdl_error_t *err)
{
    if (r->inst->cfg.conn.kv_integrity == PDL_KV_INTEGRITY_OFF || r->inst->cfg.kv_mem_type != PDL_MEM_TYPE_HOST)
        return PDL_OK;
    uint64_t t0 = pdl__clock_now_ns(), hashed = 0;
    check_ctx_t c = {.r = r, .producer = producer, .tid = transfer_id, .local_blocks = local_blocks, .n = n,
                     .salt = pdl_layout_digest_salt(transfer_id)};
    pdl_status_t st = PDL_OK;
    int asked[PDL_TOPO_MAX_TP], nasked = 0;
    for (int k = 0; k < plan->num_pieces && st == PDL_OK; k++) {
        int prank = plan->pieces[k].producer_rank;
        bool seen = false;
        for (int a = 0; a < nasked; a++)
            seen |= asked[a] == prank;
        if (seen || !peer_digests(side, producer, prank))
            continue;
        asked[nasked++] = prank;
        pdl_digest_reply_t rep;
        memset(&rep, 0, sizeof(rep));
        pdl_error_t fe;
        pdl_error_clear(&fe);
        bool fetched = fetch(r, producer, prank, transfer_id, &rep, &fe) == PDL_OK;
        if (!fetched || rep.status != PDL_DIGEST_OK) {
            pdl_debug("rank %d: transfer %.100s not checked against producer rank %d: %s", r->rank, transfer_id, prank,
                      fetched ? pdl_digest_status_name(rep.status) : fe.msg);
            PDL_CTR_ADD(r, kv_digest_unverified, 1);
            pdl_digest_reply_clear(&rep);
            continue;
        }
        uint32_t own = r->inst->cfg.conn.kv_integrity == PDL_KV_INTEGRITY_FULL ? 1 : PDL_DIGEST_SAMPLE_STRIDE;
        c.stride = rep.stride > own ? rep.stride : own;
        st = check_rank(&c, plan, prank, &rep, &hashed, err);
        pdl_digest_reply_clear(&rep);
    }
    PDL_CTR_ADD(r, kv_digest_bytes, hashed);
    PDL_CTR_ADD(r, kv_digest_ns, pdl__clock_now_ns() - t0);
    return st;
}
