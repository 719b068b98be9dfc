/*
 * grant.h -- the grants of an engine: which byte ranges of a guarded registration a remote request may
 * read or write, by the name the request carries (internal; the API is pdl_engine_grant/_revoke in
 * engine.h, the design is in docs/security.md).
 *
 * A grant is (name, registration id, ops, ranges). The ranges are copied, sorted and merged when the
 * grant is added, so a check is one binary search per segment. Names are up to PDL_GRANT_NAME_MAX
 * bytes and hashed with SipHash under a random key per table, because the tcp server looks them up
 * with names a peer chose (see src/common/siphash.h). Every function takes the table's mutex itself.
 */
#ifndef PDL_ENGINE_GRANT_H
#define PDL_ENGINE_GRANT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/siphash.h"
#include "pdlink/engine.h"

#define PDL_GRANT_BUCKETS 256
#define PDL_GRANT_PEER_MAX 64 /* a numeric IPv6 address with a scope fits */

typedef struct pdl_grant pdl_grant_t;

typedef struct pdl_grants {
    pthread_mutex_t mu;
    uint8_t key[PDL_SIPHASH_KEY_LEN];
    pdl_grant_t *b[PDL_GRANT_BUCKETS];
    size_t count;
} pdl_grants_t;

/* Draw the hash key (getrandom) and empty the table; cannot fail. */
void pdl__grants_init(pdl_grants_t *g);
/* Free every grant. */
void pdl__grants_fini(pdl_grants_t *g);
/* Add a grant; the name and ranges are copied. PDL_ERR_INVALID for an empty or too long name, ops
 * without READ or WRITE, n == 0 or a range of length 0; PDL_ERR_BAD_STATE when the name is taken;
 * PDL_ERR_NOMEM. The message names the grant. */
pdl_status_t pdl__grants_add(pdl_grants_t *g, const char *name, uint64_t mem_id, unsigned ops,
                             const pdl_range_t *ranges, size_t n, pdl_error_t *err);
/* Remove a grant; false when no grant has that name. */
bool pdl__grants_revoke(pdl_grants_t *g, const char *name);
/*
 * May a request named `name` (name_len bytes, not NUL-terminated) from host `peer` (numeric) do `op`
 * (PDL_GRANT_READ or _WRITE) on registration mem_id, on the nseg segments at `segs` (tcp wire form: u64
 * offset, u64 length, little-endian)? True only when a grant of that name exists for that registration
 * and op and every segment lies inside one of its ranges; the first such peer is remembered as the one
 * the grant was served to (pdl__grants_peer). Else false with the reason in why (cap bytes).
 */
bool pdl__grants_check(pdl_grants_t *g, const char *name, size_t name_len, uint64_t mem_id, unsigned op,
                       const uint8_t *segs, uint32_t nseg, const char *peer, char *why, size_t cap);
/* The host the grant was first served to ("" = not served yet) into out; false when no such grant. */
bool pdl__grants_peer(pdl_grants_t *g, const char *name, char *out, size_t cap);

#endif /* PDL_ENGINE_GRANT_H */
