/*
 * xfer.c -- the transfer executor: one rank's share of a READ (pull.c) or a WRITE (push.c).
 *
 * A transfer is a direction, the remote instance's address and a list of pieces (head ranges of
 * remote ranks). The executor handshakes with every remote rank the pieces name (cached peers of the
 * calling side), posts ONE batched op per layer per remote rank (descriptors from
 * pdl_layout_build_descs, merged), and waits for everything it posted within transfer_timeout -- also
 * after a failure, because a posted batch still uses our blocks. Every peer whose post or batch
 * failed as gone (PDL_ERR_PEER_GONE / PDL_ERR_TRANSPORT) is evicted, and with it the other cached
 * ranks of the same remote instance: they live and die with it, and a stale one would otherwise fail
 * the next transfer too. The wall time goes to read_ns or write_ns by direction.
 *
 * The side (pdl_xfer_side_t) is one pdl_workq_t thread with the peer and DEALER caches it alone uses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connector/internal.h"
#include "common/clock.h"

typedef struct posted {
    pdl_batch_t *batch;
    pdl_peer_t *peer;
    int remote_rank;
} posted_t;

static bool is_gone(pdl_status_t st) { return st == PDL_ERR_PEER_GONE || st == PDL_ERR_TRANSPORT; }

static void add_gone(pdl_peer_t **gone, int *ngone, pdl_peer_t *p)
{
    for (int g = 0; g < *ngone; g++)
        if (gone[g] == p)
            return;
    gone[(*ngone)++] = p;
}

typedef struct sibling_ctx {
    const char *prefix; /* "engine_id|dp|" */
    size_t len;
    pdl_peer_t *found[PDL_TOPO_MAX_TP];
    int n;
} sibling_ctx_t;

static void collect_sibling(void *arg, const char *key, void *value)
{
    sibling_ctx_t *c = arg;
    if (c->n < PDL_TOPO_MAX_TP && strncmp(key, c->prefix, c->len) == 0)
        c->found[c->n++] = value;
}

/* Evict the gone peers and every other cached rank of their remote instance. */
static void evict_gone(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_xfer_t *x, pdl_peer_t **gone, int ngone)
{
    const char *what = x->dir == PDL_DIR_READ ? "read" : "write";
    for (int g = 0; g < ngone; g++)
        pdl_warn("rank %d: evicting peer %s after a failed %s", r->rank, gone[g]->key, what);
    if (ngone == 0)
        return;
    char prefix[PDL_WIRE_ID_MAX + 32];
    sibling_ctx_t c = {.prefix = prefix};
    c.len = (size_t)snprintf(prefix, sizeof(prefix), "%s|%d|", x->peer->engine_id, x->peer->dp);
    pdl__strmap_foreach(&side->peers, collect_sibling, &c); /* the gone peers are among them */
    for (int i = 0; i < c.n; i++)
        pdl__peer_evict(r, &side->peers, c.found[i]);
}

pdl_status_t pdl__xfer_run(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_xfer_t *x, uint64_t *bytes,
                           uint64_t *descs, pdl_xfer_times_t *times, pdl_error_t *err)
{
    const char *remote_role = x->dir == PDL_DIR_READ ? "producer" : "consumer";
    uint64_t tp0 = pdl__clock_now_ns();
    int L = r->inst->cfg.model.num_layers;
    /* Remote ranks in first-seen order, each with its pieces (pieces of one remote rank are adjacent in
     * head order, but nothing here relies on it). */
    int rranks[PDL_TOPO_MAX_TP];
    int nr = 0;
    for (int i = 0; i < x->npieces; i++) {
        bool seen = false;
        for (int k = 0; k < nr; k++)
            seen |= rranks[k] == x->pieces[i].remote_rank;
        if (!seen)
            rranks[nr++] = x->pieces[i].remote_rank;
    }
    pdl_peer_t *peers[PDL_TOPO_MAX_TP];
    for (int k = 0; k < nr; k++) {
        pdl_status_t st = pdl__peer_get(r, &side->peers, x->peer, rranks[k], &peers[k], err);
        if (st != PDL_OK)
            return st;
    }
    times->peers += pdl__clock_now_ns() - tp0;
    posted_t *posted = calloc((size_t)L * (size_t)(nr > 0 ? nr : 1), sizeof(*posted));
    if (posted == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "%s: out of memory", x->dir == PDL_DIR_READ ? "read" : "write");
    size_t nposted = 0;
    pdl_descv_t dv = {0};
    pdl_plan_piece_t pieces[PDL_TOPO_MAX_TP];
    pdl_status_t st = PDL_OK;
    pdl_peer_t *gone[PDL_TOPO_MAX_TP];
    int ngone = 0;
    pdl_op_t op = x->dir == PDL_DIR_READ ? PDL_OP_READ : PDL_OP_WRITE;
    uint64_t t0 = pdl__clock_now_ns();
    for (int l = 0; l < L && st == PDL_OK; l++) {
        for (int k = 0; k < nr && st == PDL_OK; k++) {
            int np = 0;
            for (int i = 0; i < x->npieces; i++)
                if (x->pieces[i].remote_rank == rranks[k])
                    pieces[np++] = x->pieces[i].piece;
            pdl_descv_reset(&dv);
            uint64_t tb = pdl__clock_now_ns();
            st = pdl_layout_build_descs(&r->mem.geo, &peers[k]->geo, x->dir, pieces, np, x->local_blocks,
                                        x->remote_blocks, x->n, (uint64_t)l * r->mem.layer_len,
                                        (uint64_t)l * peers[k]->layer_len, &dv, err);
            if (st != PDL_OK) {
                pdl_error_prefix(err, "layer %d, %s rank %d", l, remote_role, rranks[k]);
                break;
            }
            pdl_batch_t *b = NULL;
            uint64_t tpost = pdl__clock_now_ns();
            times->build += tpost - tb;
            st = pdl_session_post(peers[k]->session, op, dv.v, dv.n, &b, err);
            times->post += pdl__clock_now_ns() - tpost;
            if (st != PDL_OK) {
                pdl_error_prefix(err, "layer %d, %s rank %d: post", l, remote_role, rranks[k]);
                if (is_gone(st))
                    add_gone(gone, &ngone, peers[k]);
                break;
            }
            posted[nposted++] = (posted_t){.batch = b, .peer = peers[k], .remote_rank = rranks[k]};
            *descs += dv.n;
            *bytes += pdl_layout_total_bytes(&dv);
        }
    }
    pdl_descv_free(&dv);
    uint64_t tw = pdl__clock_now_ns();
    double timeout_s = r->inst->cfg.conn.transfer_timeout_s;
    uint64_t deadline = t0 + (uint64_t)(timeout_s * 1e9);
    for (size_t i = 0; i < nposted; i++) {
        uint64_t now = pdl__clock_now_ns();
        int left_ms = now >= deadline ? 0 : (int)((deadline - now) / 1000000);
        pdl_error_t e;
        pdl_status_t bst = pdl_batch_wait(posted[i].batch, left_ms, &e);
        if (bst != PDL_OK && st == PDL_OK) {
            st = bst;
            if (bst == PDL_ERR_TIMEOUT)
                pdl_error_set(err, PDL_ERR_TIMEOUT, "%s rank %d: %s not finished within transfer_timeout %.1f s (%s)",
                              remote_role, posted[i].remote_rank, x->dir == PDL_DIR_READ ? "read" : "write",
                              timeout_s, e.msg);
            else if (err)
                *err = e;
        }
        if (is_gone(bst))
            add_gone(gone, &ngone, posted[i].peer);
        pdl_batch_free(posted[i].batch);
    }
    free(posted);
    times->wait += pdl__clock_now_ns() - tw;
    evict_gone(r, side, x, gone, ngone);
    if (x->dir == PDL_DIR_READ)
        PDL_CTR_ADD(r, read_ns, pdl__clock_now_ns() - t0);
    else
        PDL_CTR_ADD(r, write_ns, pdl__clock_now_ns() - t0);
    return st;
}

pdl_status_t pdl__xfer_side_start(pdl_rank_t *r, pdl_xfer_side_t *side, pdl_workq_run_fn run,
                                  pdl_workq_exit_fn on_exit, const char *what, pdl_error_t *err)
{
    char who[64];
    snprintf(who, sizeof(who), "rank %d %s", r->rank, what);
    pdl_status_t st = pdl__workq_start(&side->q, 1, run, on_exit, r, who, err);
    side->started = st == PDL_OK;
    return st;
}

void pdl__xfer_side_stop(pdl_rank_t *r, pdl_xfer_side_t *side)
{
    if (side->started)
        pdl__workq_stop(&side->q);
    side->started = false;
    pdl__peers_free(r, &side->peers);
    pdl__dealers_close(&side->dealers); /* normally closed by the thread at exit; idempotent */
}
