/*
 * prewarm_policy.c -- which remote instance the prewarm (prewarm.c) forgets: the eviction rule of its
 * bounded target table, pure (no locks, no clock: the caller passes "now"), so it is unit-tested alone.
 *
 * Why: remote instances are learnt from requests, and a request can name any address. Without
 * eviction a client naming many fake producers filled the table for good, and no real producer
 * learnt after that was connected ahead of need. The rule, per remote instance:
 *   - configured (prewarm_peers) ones are never dropped: the operator named them;
 *   - one in use (a pair being connected, a warm peer waiting for its lane, a peer a lane holds or is
 *     connecting) is never dropped: re-learning it later would connect a pair the lane already has,
 *     and the two peers would share (and on free remove) one remote engine;
 *   - a learnt one whose every pair's last attempt failed, the latest ttl ago or earlier, is dropped
 *     (the lanes' peer health keeps refusing it meanwhile; a request naming it again re-learns it);
 *   - when the table has no room for a new instance, the learnt unused one that failed longest ago
 *     makes room, or else (none failed) the one learnt first, not yet connected.
 */
#include "connector/internal.h"

long pdl__prewarm_pick_victim(const pdl_prewarm_cand_t *c, size_t n, uint64_t now_ns, uint64_t ttl_ns, bool need_room)
{
    long failed = -1, oldest = -1;
    for (size_t i = 0; i < n; i++) {
        if (c[i].configured || c[i].in_use)
            continue;
        if (c[i].failed_ns != 0 && (failed < 0 || c[i].failed_ns < c[failed].failed_ns))
            failed = (long)i;
        if (c[i].failed_ns == 0 && (oldest < 0 || c[i].learnt_ns < c[oldest].learnt_ns))
            oldest = (long)i;
    }
    if (failed >= 0 && (need_room || now_ns >= c[failed].failed_ns + ttl_ns))
        return failed;
    return need_room ? oldest : -1;
}
