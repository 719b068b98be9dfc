/*
 * peer.c -- a lane's peer cache: the peer (handshaked remote rank, its engine and session) each
 * transfer needs, from the cache, from the prewarm, or from a handshake (handshake.c).
 *
 * Peers are cached per lane under "engine_id|dp|rank", each cache used by one thread only
 * (pdl_xfer_side_t). A miss first asks the prewarm (prewarm.c) for a peer connected ahead of need;
 * a handshake a transfer has to make itself is counted (transfer_handshakes); a producer first seen
 * there gets the instance's other rank pairs connected in the background, and the prewarm is told how
 * the lane's own handshake went (it never forgets a pair a lane holds). A peer is evicted when a
 * transfer reports it gone (and handed back to the prewarm to connect again); a failed handshake is not
 * cached, but remembered in the lane's peer health (peerhealth.h) when it says the peer is unreachable
 * (timeout, refused, transport): transfers within the backoff fail at once with that reason, and the
 * first one after it tries again. A peer that refused is also let through early once its handshake
 * port accepts a connect again (peer_backoff_cleared): a restarted prefill serves the first request
 * after its restart instead of being refused for the rest of the backoff.
 */
#include <stdio.h>
#include <string.h>

#include "connector/internal.h"
#include "common/clock.h"

/* A peer in backoff after a refusal is looked at again (one connect, bounded) at most this often. */
#define PEER_RECHECK_MS 100
#define PEER_RECHECK_NS (PEER_RECHECK_MS * 1000000ull)

/* The engine id a request claims must be the one the dialled address answered with. The peer stays
 * cached: it is what that address is; only the request that lied is refused. */
static pdl_status_t check_identity(pdl_rank_t *r, const pdl_peer_addr_t *addr, const pdl_peer_t *p, const char *who,
                                   pdl_error_t *err)
{
    if (addr->claimed_id[0] == '\0' || strcmp(addr->claimed_id, p->meta.engine_id) == 0)
        return PDL_OK;
    PDL_CTR_ADD(r, peer_identity_refused, 1);
    return pdl_error_set(err, PDL_ERR_DENIED,
                         "kv_transfer_params.remote_engine_id is %.100s, but %s is engine %.100s (verified in its "
                         "handshake): refusing to read from an address the request misattributes",
                         addr->claimed_id, who, p->meta.engine_id);
}


const pdl_peer_t *pdl__peer_cached(const pdl_xfer_side_t *side, const pdl_peer_addr_t *addr, int prank)
{
    char key[PDL_WIRE_ID_MAX + 64];
    pdl__peer_key(addr, prank, key, sizeof(key));
    return pdl__strmap_get(&side->peers, key);
}

pdl_status_t pdl__peer_get(pdl_rank_t *r, pdl_xfer_side_t *side, const pdl_peer_addr_t *addr, int prank,
                           pdl_peer_t **peer_out, bool *handshaked, pdl_error_t *err)
{
    pdl_strmap_t *cache = &side->peers;
    char key[PDL_WIRE_ID_MAX + 64];
    pdl__peer_key(addr, prank, key, sizeof(key));
    if (handshaked)
        *handshaked = false;
    char who[PDL_WIRE_HOST_MAX + 64];
    pdl__peer_who(addr, prank, who, sizeof(who));
    pdl_peer_t *p = pdl__strmap_get(cache, key);
    if (p) {
        *peer_out = p;
        return check_identity(r, addr, p, who, err);
    }
    /* Connected ahead of need (prewarm.c): this transfer pays neither the handshake nor the mapping. */
    pdl_status_t wst = PDL_OK;
    p = pdl__prewarm_take(r, addr, key, &wst, err);
    if (wst != PDL_OK) {
        if (pdl__peer_unreachable(wst))
            pdl__health_failed(&side->health, key, pdl__clock_now_ns(), wst, err ? err->msg : pdl_status_name(wst));
        return wst;
    }
    if (p != NULL) {
        if (pdl__strmap_put(cache, key, p) != 0) {
            pdl__peer_free(r, p);
            pdl__prewarm_lane_done(r, key, PDL_ERR_NOMEM);
            return pdl_error_set(err, PDL_ERR_NOMEM, "peer %s: out of memory", who);
        }
        pdl__health_ok(&side->health, key);
        *peer_out = p;
        return check_identity(r, addr, p, who, err);
    }
    char why[PDL_HEALTH_REASON_MAX + 64];
    pdl_status_t hst = PDL_ERR_PEER_GONE;
    uint64_t now = pdl__clock_now_ns();
    if (!pdl__health_admit(&side->health, key, now, &hst, why, sizeof(why))) {
        /* A peer that refused and listens again was restarted: try it now, not after the backoff. */
        if (!pdl__health_recheck_due(&side->health, key, now, PEER_RECHECK_NS) ||
            pdl__peer_listening(addr, prank, PEER_RECHECK_MS) != PDL_OK) {
            PDL_CTR_ADD(r, peer_backoff_refusals, 1);
            pdl__prewarm_lane_done(r, key, hst);
            return pdl_error_set(err, hst, "%s: failed recently, not retried yet (peer_backoff): %s", who, why);
        }
        pdl__health_readmit(&side->health, key);
        PDL_CTR_ADD(r, peer_backoff_cleared, 1);
    }
    pdl_status_t st = pdl__peer_connect(r, addr, prank, &p, err);
    if (st == PDL_OK && pdl__strmap_put(cache, key, p) != 0) {
        pdl__peer_free(r, p);
        st = pdl_error_set(err, PDL_ERR_NOMEM, "peer %s: out of memory", who);
    }
    /* Whether this lane holds the pair now: one it holds is never evicted from the prewarm's table. */
    pdl__prewarm_lane_done(r, key, st);
    if (st != PDL_OK) {
        /* Remembered only when it says the peer cannot be reached: a mismatch is fast to find again, and
         * a fixed peer must not wait out a backoff. */
        if (pdl__peer_unreachable(st))
            pdl__health_failed(&side->health, key, pdl__clock_now_ns(), st, err ? err->msg : pdl_status_name(st));
        else
            pdl__health_ok(&side->health, key);
        /* Logged once, by the transfer that fails because of it (pull.c, push.c). */
        pdl_debug("rank %d: %s", r->rank, err ? err->msg : "handshake failed");
        return st;
    }
    PDL_CTR_ADD(r, transfer_handshakes, 1);
    pdl__health_ok(&side->health, key);
    if (handshaked)
        *handshaked = true;
    *peer_out = p;
    return check_identity(r, addr, p, who, err);
}
void pdl__peer_evict(pdl_rank_t *r, pdl_strmap_t *cache, pdl_peer_t *peer)
{
    if (pdl__strmap_remove(cache, peer->key) != peer)
        return;
    char key[sizeof(peer->key)];
    memcpy(key, peer->key, sizeof(key));
    pdl__peer_free(r, peer);
    /* A restarted producer is connected again before the next request needs it. */
    pdl__prewarm_again(r, key);
}

static void free_peer(void *arg, const char *key, void *value)
{
    (void)key;
    pdl__peer_free(arg, value);
}

void pdl__peers_free(pdl_rank_t *r, pdl_strmap_t *cache)
{
    if (r->mem.engine)
        pdl__strmap_foreach(cache, free_peer, r);
    pdl__strmap_free(cache);
}
