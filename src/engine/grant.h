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
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/siphash.h"
#include "pdlink/engine.h"

#define PDL_GRANT_BUCKETS 256
#define PDL_GRANT_PEER_MAX 64 /* a numeric IPv6 address with a scope fits */
#define PDL_GRANT_PUB_SLOTS 16384 /* live grants an engine can publish (768 KiB of slots) */
/*
 * Ranges all published grants hold together (after merging), 16 bytes each: 64 MiB of the control
 * memfd at most. The memfd is sparse, so only the pages the owner ever wrote cost memory: the most
 * ranges live at once, rounded up to pages (first fit keeps the pool's low end in use). A hold of
 * 2,048 blocks x 32 layers x K/V, none of them adjacent, is 131,072 ranges: 32 such holds fit.
 */
#define PDL_GRANT_PUB_RANGES (1u << 22)
/* The published table's layout; a peer refuses another (a pdlink of another version). */
#define PDL_GRANT_PUB_LAYOUT 0x70646c6700000002ull

typedef struct pdl_grant pdl_grant_t;

/*
 * The published grant table: a copy of which grants are live, in memory the owner shares with peers
 * that access its registrations without a server (shm maps it). Such a peer cannot be refused by the
 * owner, so it checks for itself: before a copy it looks the grant up (pdl__grant_pub_find), and after
 * the copy it checks that the grant's slot did not change (pdl__grant_pub_still). Every change of a
 * slot bumps its sequence number (odd while it changes, a seqlock), and the owner revokes a grant
 * before it reuses the blocks, so a copy whose slot is unchanged afterwards read no reused byte, and
 * one whose slot changed is failed: a reader that was paused while its hold was given up gets an
 * error, not another prompt's KV. Slots are found by open addressing on a keyed hash of the name; a
 * slot with ops 0 is free (a revoked one keeps its hash so lookups probe past it).
 *
 * A slot also names its grant's byte ranges: rcount sorted, merged ranges at range[rfirst...] of the
 * table's pool, written by the owner before the slot's seq turns even, and given back to the pool only
 * after the slot is revoked (its seq changed). So a peer checks every segment of its batch against
 * them (pdl__grant_pub_covers) and then the seq (pdl__grant_pub_still) before it copies: a grant of
 * block A under name N does not let it touch block B under N. Only the owner writes any of it; the
 * request's fields (name, op, offsets) select and test, never widen.
 */
typedef struct pdl_grant_slot {
    _Atomic uint64_t seq; /* odd while the owner changes the slot */
    _Atomic uint64_t hash;
    _Atomic uint64_t mem_id;
    _Atomic uint64_t ops; /* 0 = free */
    _Atomic uint64_t rfirst, rcount; /* its ranges in pdl_grant_pub_t.range */
} pdl_grant_slot_t;

typedef struct pdl_grant_pub {
    uint8_t key[PDL_SIPHASH_KEY_LEN]; /* the name hash's key: random per engine, not the buckets' key */
    uint64_t nslots;
    uint64_t layout; /* PDL_GRANT_PUB_LAYOUT */
    pdl_grant_slot_t slot[PDL_GRANT_PUB_SLOTS];
    _Atomic uint64_t range[PDL_GRANT_PUB_RANGES][2]; /* off, len */
} pdl_grant_pub_t;

typedef struct pdl_grant_ext {
    uint64_t first, n;
} pdl_grant_ext_t;

typedef struct pdl_grants {
    pthread_mutex_t mu;
    pthread_cond_t idle; /* a revoked grant's last server copy ended (pdl__grants_leave) */
    uint64_t next_gen;   /* generation of the next grant added: never 0, never reused */
    uint8_t key[PDL_SIPHASH_KEY_LEN];
    pdl_grant_t *b[PDL_GRANT_BUCKETS];
    size_t count;
    pdl_grant_pub_t *pub; /* NULL: grants are not published (tcp checks them in its server) */
    /* The pool's free extents (owner-private), sorted by first, never adjacent: at most one more than
     * the live grants, so PDL_GRANT_PUB_SLOTS + 1 entries. NULL when publish could not allocate it:
     * then every published grant fails with PDL_ERR_NOMEM. */
    pdl_grant_ext_t *fx;
    size_t nfx;
} pdl_grants_t;

/* Draw the hash key (getrandom) and empty the table; cannot fail. */
void pdl__grants_init(pdl_grants_t *g);
/* Free every grant. */
void pdl__grants_fini(pdl_grants_t *g);
/* Publish every later grant in `pub` (zeroed shared memory the caller maps for peers): draws its key.
 * Call before the first grant is added. */
void pdl__grants_publish(pdl_grants_t *g, pdl_grant_pub_t *pub);
/*
 * Peer side of a published table (read-only mapping). find: is a grant named `name` live for
 * registration mem_id allowing `op`? On true, *slot and *seq identify what was seen; still: is that
 * slot unchanged since (call after the copy; it orders the copy's loads before its own).
 */
bool pdl__grant_pub_find(const pdl_grant_pub_t *pub, const char *name, uint64_t mem_id, unsigned op, uint64_t *slot,
                         uint64_t *seq);
bool pdl__grant_pub_still(const pdl_grant_pub_t *pub, uint64_t slot, uint64_t seq);
/* Does the grant seen at (slot, seq) cover [off, off + len)? Reads owner-written memory without a lock:
 * the answer counts only if pdl__grant_pub_still(slot, seq) is true afterwards. False for a slot whose
 * range list lies outside the pool, or len == 0. */
bool pdl__grant_pub_covers(const pdl_grant_pub_t *pub, uint64_t slot, uint64_t off, uint64_t len);
/* Add a grant; the name and ranges are copied. PDL_ERR_INVALID for an empty or too long name, ops
 * without READ or WRITE, n == 0 or a range of length 0; PDL_ERR_BAD_STATE when the name is taken;
 * PDL_ERR_NOMEM, also when a published table has PDL_GRANT_PUB_SLOTS live grants or no room in its range
 * pool for this grant's ranges. The message names the grant. */
pdl_status_t pdl__grants_add(pdl_grants_t *g, const char *name, uint64_t mem_id, unsigned ops,
                             const pdl_range_t *ranges, size_t n, pdl_error_t *err);
/* The same, served only to requests from `host` (a numeric address; NULL or "" = any host, which is
 * pdl__grants_add): a WRITE grant names its producer, so an outsider that learned the name cannot write
 * under it. PDL_ERR_INVALID also for a host of PDL_GRANT_PEER_MAX bytes or more. */
pdl_status_t pdl__grants_add_to(pdl_grants_t *g, const char *name, uint64_t mem_id, unsigned ops,
                                const pdl_range_t *ranges, size_t n, const char *host, pdl_error_t *err);
/* Remove a grant; false when no grant has that name. Returns once no step under it is held
 * (pdl__grants_enter), so it must not be called from a tcp server thread. */
bool pdl__grants_revoke(pdl_grants_t *g, const char *name);
/*
 * May a request named `name` (name_len bytes, not NUL-terminated) from host `peer` (numeric) do `op`
 * (PDL_GRANT_READ or _WRITE) on registration mem_id, on the nseg segments at `segs` (tcp wire form: u64
 * offset, u64 length, little-endian)? True only when a grant of that name exists for that registration
 * and op, is bound to no host or to `peer`, and every segment lies inside one of its ranges; then the
 * grant's generation goes to *gen (unless NULL: the server keeps it for the request's copies,
 * pdl__grants_enter) and the first such peer is remembered as the one the grant was served to
 * (pdl__grants_peer). Else false with the reason in why (cap bytes).
 */
bool pdl__grants_check(pdl_grants_t *g, const char *name, size_t name_len, uint64_t mem_id, unsigned op,
                       const uint8_t *segs, uint32_t nseg, const char *peer, uint64_t *gen, char *why, size_t cap);
/*
 * Around every step that moves a request's bytes into or out of the region after the check (the tcp
 * server's system calls and its device copies): enter is true only while the grant named `name` is
 * still the one of generation `gen` -- not revoked, and not revoked and granted again under the same
 * name -- and then *x stays held until pdl__grants_leave(g, *x). pdl__grants_revoke waits until no
 * step under the grant is held, so after it returns no byte lands in or leaves its ranges through the
 * server. A holder must never wait on the network while it holds (a step is one non-blocking system
 * call of at most 1 MiB, or a device copy of one staging window), so that wait is short.
 */
bool pdl__grants_enter(pdl_grants_t *g, const char *name, size_t name_len, uint64_t gen, pdl_grant_t **x);
void pdl__grants_leave(pdl_grants_t *g, pdl_grant_t *x);
/* The host the grant was first served to ("" = not served yet) into out; false when no such grant. */
bool pdl__grants_peer(pdl_grants_t *g, const char *name, char *out, size_t cap);

#endif /* PDL_ENGINE_GRANT_H */
