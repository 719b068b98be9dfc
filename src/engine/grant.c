/*
 * grant.c -- the grants of an engine (see grant.h): a hash table of named, sorted and merged range
 * lists, checked by the tcp server before it serves a request on a guarded registration, and (shm)
 * mirrored into a table peers map, which they check around their own copies.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/random.h>
#include <sched.h>

#include "engine/grant.h"
#include "engine/tcp_wire.h"

struct pdl_grant {
    struct pdl_grant *next;
    char name[PDL_GRANT_NAME_MAX + 1];
    size_t name_len;
    uint64_t mem_id;
    unsigned ops;
    char served_to[PDL_GRANT_PEER_MAX]; /* numeric host of the first request served; "" = none yet */
    char bound_to[PDL_GRANT_PEER_MAX];  /* numeric host it serves only ("" = any host): pdl__grants_add_to */
    int64_t pub_slot; /* its slot in g->pub, or -1 */
    uint64_t pub_rfirst; /* its ranges in g->pub->range (x->n of them), when pub_slot >= 0 */
    uint64_t gen;        /* unique per grant added: a request admitted by it copies only under it */
    int busy;            /* server copies under it right now (pdl__grants_enter); under g->mu */
    pdl_range_t *r; /* sorted by off, merged: no two overlap or touch */
    size_t n;
};

/* getrandom without flags blocks only until the kernel's pool is first seeded (at boot). */
static void random_key(uint8_t *key, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = getrandom(key + got, len - got, 0);
        if (r > 0)
            got += (size_t)r;
    }
}

void pdl__grants_init(pdl_grants_t *g)
{
    memset(g, 0, sizeof(*g));
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->idle, NULL);
    g->next_gen = 1;
    random_key(g->key, sizeof(g->key));
}

void pdl__grants_publish(pdl_grants_t *g, pdl_grant_pub_t *pub)
{
    random_key(pub->key, sizeof(pub->key));
    pub->nslots = PDL_GRANT_PUB_SLOTS;
    pub->layout = PDL_GRANT_PUB_LAYOUT;
    g->pub = pub;
    g->fx = malloc((PDL_GRANT_PUB_SLOTS + 1) * sizeof(*g->fx));
    if (g->fx != NULL) {
        g->fx[0] = (pdl_grant_ext_t){0, PDL_GRANT_PUB_RANGES};
        g->nfx = 1;
    }
}

/* Under g->mu: n consecutive pool entries, first fit (keeps the touched part of the sparse pool
 * small); false when no free extent is that long. */
static bool pool_take(pdl_grants_t *g, uint64_t n, uint64_t *first)
{
    for (size_t i = 0; g->fx != NULL && i < g->nfx; i++) {
        if (g->fx[i].n < n)
            continue;
        *first = g->fx[i].first;
        g->fx[i].first += n;
        g->fx[i].n -= n;
        if (g->fx[i].n == 0) {
            memmove(&g->fx[i], &g->fx[i + 1], (g->nfx - i - 1) * sizeof(*g->fx));
            g->nfx--;
        }
        return true;
    }
    return false;
}

/* Under g->mu: give [first, first + n) back, merged with its neighbours. Extents lie between taken
 * ones, so there are at most (live grants + 1): the array never overflows. */
static void pool_give(pdl_grants_t *g, uint64_t first, uint64_t n)
{
    size_t i = 0;
    while (i < g->nfx && g->fx[i].first < first)
        i++;
    bool left = i > 0 && g->fx[i - 1].first + g->fx[i - 1].n == first;
    bool right = i < g->nfx && first + n == g->fx[i].first;
    if (left && right) {
        g->fx[i - 1].n += n + g->fx[i].n;
        memmove(&g->fx[i], &g->fx[i + 1], (g->nfx - i - 1) * sizeof(*g->fx));
        g->nfx--;
    } else if (left) {
        g->fx[i - 1].n += n;
    } else if (right) {
        g->fx[i].first = first;
        g->fx[i].n += n;
    } else {
        memmove(&g->fx[i + 1], &g->fx[i], (g->nfx - i) * sizeof(*g->fx));
        g->fx[i] = (pdl_grant_ext_t){first, n};
        g->nfx++;
    }
}

/* A published hash is never 0: 0 marks a slot never used, where a lookup stops. */
static uint64_t pub_hash(const pdl_grant_pub_t *pub, const char *name, size_t len)
{
    uint64_t h = pdl__siphash24(pub->key, name, len);
    return h ? h : 1;
}

/* The owner changes a slot (under g->mu; readers see an odd seq meanwhile, or a new even one). */
static void pub_write(pdl_grant_slot_t *s, uint64_t hash, uint64_t mem_id, uint64_t ops, uint64_t rfirst,
                      uint64_t rcount)
{
    uint64_t q = atomic_load_explicit(&s->seq, memory_order_relaxed);
    atomic_store_explicit(&s->seq, q + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&s->hash, hash, memory_order_relaxed);
    atomic_store_explicit(&s->mem_id, mem_id, memory_order_relaxed);
    atomic_store_explicit(&s->ops, ops, memory_order_relaxed);
    atomic_store_explicit(&s->rfirst, rfirst, memory_order_relaxed);
    atomic_store_explicit(&s->rcount, rcount, memory_order_relaxed);
    atomic_store_explicit(&s->seq, q + 2, memory_order_release);
    /* What the caller does next (free the blocks, let them be rewritten) must not be seen before the
     * new seq by a reader that checks it after its copy. */
    atomic_thread_fence(memory_order_seq_cst);
}

/* Under g->mu: a free slot on the name's probe sequence for x, or false when every slot is live. */
static bool pub_add(pdl_grants_t *g, pdl_grant_t *x)
{
    pdl_grant_pub_t *pub = g->pub;
    uint64_t h = pub_hash(pub, x->name, x->name_len), first;
    if (!pool_take(g, x->n, &first))
        return false;
    /* The ranges go in before the slot names them; the slot's release store publishes both. */
    for (size_t j = 0; j < x->n; j++) {
        atomic_store_explicit(&pub->range[first + j][0], x->r[j].off, memory_order_relaxed);
        atomic_store_explicit(&pub->range[first + j][1], x->r[j].len, memory_order_relaxed);
    }
    for (uint64_t i = 0; i < PDL_GRANT_PUB_SLOTS; i++) {
        uint64_t k = (h + i) % PDL_GRANT_PUB_SLOTS;
        if (atomic_load_explicit(&pub->slot[k].ops, memory_order_relaxed) == 0) {
            pub_write(&pub->slot[k], h, x->mem_id, x->ops, first, x->n);
            x->pub_slot = (int64_t)k;
            x->pub_rfirst = first;
            return true;
        }
    }
    pool_give(g, first, x->n);
    return false;
}

static void pub_revoke(pdl_grants_t *g, pdl_grant_t *x)
{
    if (g->pub == NULL || x->pub_slot < 0)
        return;
    pdl_grant_slot_t *s = &g->pub->slot[x->pub_slot];
    pub_write(s, atomic_load_explicit(&s->hash, memory_order_relaxed), 0, 0, 0, 0);
    /* Only now may the ranges be overwritten: a reader that saw them sees the slot's new seq too. */
    pool_give(g, x->pub_rfirst, x->n);
}

/* A consistent snapshot of slot k; false if the owner kept changing it. */
static bool pub_read(const pdl_grant_slot_t *s, uint64_t *seq, uint64_t *hash, uint64_t *mem_id, uint64_t *ops)
{
    for (int tries = 0; tries < 1000; tries++) {
        uint64_t q = atomic_load_explicit(&s->seq, memory_order_acquire);
        if (q & 1) {
            sched_yield();
            continue;
        }
        *hash = atomic_load_explicit(&s->hash, memory_order_relaxed);
        *mem_id = atomic_load_explicit(&s->mem_id, memory_order_relaxed);
        *ops = atomic_load_explicit(&s->ops, memory_order_relaxed);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&s->seq, memory_order_relaxed) == q) {
            *seq = q;
            return true;
        }
    }
    return false;
}

bool pdl__grant_pub_find(const pdl_grant_pub_t *pub, const char *name, uint64_t mem_id, unsigned op, uint64_t *slot,
                         uint64_t *seq)
{
    size_t len = strlen(name);
    uint64_t h = pub_hash(pub, name, len);
    for (uint64_t i = 0; i < PDL_GRANT_PUB_SLOTS; i++) {
        uint64_t k = (h + i) % PDL_GRANT_PUB_SLOTS;
        uint64_t q, sh, sm, so;
        if (!pub_read(&pub->slot[k], &q, &sh, &sm, &so))
            return false;
        if (sh == 0)
            return false; /* never used: the end of this name's probe sequence */
        if (sh == h && so != 0 && sm == mem_id && (so & op)) {
            *slot = k;
            *seq = q;
            return true;
        }
    }
    return false;
}

bool pdl__grant_pub_covers(const pdl_grant_pub_t *pub, uint64_t slot, uint64_t off, uint64_t len)
{
    if (slot >= PDL_GRANT_PUB_SLOTS || len == 0)
        return false;
    uint64_t first = atomic_load_explicit(&pub->slot[slot].rfirst, memory_order_relaxed);
    uint64_t n = atomic_load_explicit(&pub->slot[slot].rcount, memory_order_relaxed);
    /* The owner's memory is read as it is: a torn or hostile list must not take us outside the pool. */
    if (first > PDL_GRANT_PUB_RANGES || n > PDL_GRANT_PUB_RANGES - first)
        return false;
    size_t lo = 0, hi = (size_t)n; /* the last range with r.off <= off is at lo - 1, as in covered() */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (atomic_load_explicit(&pub->range[first + mid][0], memory_order_relaxed) <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return false;
    uint64_t r_off = atomic_load_explicit(&pub->range[first + lo - 1][0], memory_order_relaxed);
    uint64_t r_len = atomic_load_explicit(&pub->range[first + lo - 1][1], memory_order_relaxed);
    return off - r_off <= r_len && len <= r_len - (off - r_off);
}

bool pdl__grant_pub_still(const pdl_grant_pub_t *pub, uint64_t slot, uint64_t seq)
{
    atomic_thread_fence(memory_order_acquire);
    return slot < PDL_GRANT_PUB_SLOTS && atomic_load_explicit(&pub->slot[slot].seq, memory_order_acquire) == seq;
}

static void grant_free(pdl_grant_t *x)
{
    free(x->r);
    free(x);
}

void pdl__grants_fini(pdl_grants_t *g)
{
    for (size_t i = 0; i < PDL_GRANT_BUCKETS; i++) {
        while (g->b[i]) {
            pdl_grant_t *x = g->b[i];
            g->b[i] = x->next;
            grant_free(x);
        }
    }
    free(g->fx);
    g->fx = NULL;
    pthread_cond_destroy(&g->idle);
    pthread_mutex_destroy(&g->mu);
}

static size_t bucket(const pdl_grants_t *g, const char *name, size_t len)
{
    return (size_t)(pdl__siphash24(g->key, name, len) % PDL_GRANT_BUCKETS);
}

/* Under g->mu. */
static pdl_grant_t **find(pdl_grants_t *g, const char *name, size_t len)
{
    pdl_grant_t **pp = &g->b[bucket(g, name, len)];
    while (*pp && ((*pp)->name_len != len || memcmp((*pp)->name, name, len) != 0))
        pp = &(*pp)->next;
    return pp;
}

static int by_off(const void *a, const void *b)
{
    const pdl_range_t *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

pdl_status_t pdl__grants_add(pdl_grants_t *g, const char *name, uint64_t mem_id, unsigned ops,
                             const pdl_range_t *ranges, size_t n, pdl_error_t *err)
{
    return pdl__grants_add_to(g, name, mem_id, ops, ranges, n, NULL, err);
}

pdl_status_t pdl__grants_add_to(pdl_grants_t *g, const char *name, uint64_t mem_id, unsigned ops,
                                const pdl_range_t *ranges, size_t n, const char *host, pdl_error_t *err)
{
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > PDL_GRANT_NAME_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID, "grant: name empty or longer than %d bytes", PDL_GRANT_NAME_MAX);
    if ((ops & (PDL_GRANT_READ | PDL_GRANT_WRITE)) == 0 || (ops & ~(unsigned)(PDL_GRANT_READ | PDL_GRANT_WRITE)))
        return pdl_error_set(err, PDL_ERR_INVALID, "grant %s: ops 0x%x, expected PDL_GRANT_READ and/or _WRITE", name,
                             ops);
    if (n == 0 || ranges == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "grant %s: no ranges", name);
    if (host != NULL && strlen(host) >= PDL_GRANT_PEER_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID, "grant %s: host %.80s is longer than %d bytes", name, host,
                             PDL_GRANT_PEER_MAX - 1);
    pdl_grant_t *x = calloc(1, sizeof(*x));
    if (x == NULL || (x->r = malloc(n * sizeof(*x->r))) == NULL) {
        free(x);
        return pdl_error_set(err, PDL_ERR_NOMEM, "grant %s: out of memory for %zu ranges", name, n);
    }
    for (size_t i = 0; i < n; i++) {
        if (ranges[i].len == 0 || ranges[i].off > UINT64_MAX - ranges[i].len) {
            grant_free(x);
            return pdl_error_set(err, PDL_ERR_INVALID, "grant %s: range %zu [%" PRIu64 ", +%" PRIu64 ") is empty or wraps",
                                 name, i, ranges[i].off, ranges[i].len);
        }
    }
    memcpy(x->r, ranges, n * sizeof(*x->r));
    qsort(x->r, n, sizeof(*x->r), by_off);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k > 0 && x->r[i].off <= x->r[k - 1].off + x->r[k - 1].len) {
            uint64_t end = x->r[i].off + x->r[i].len;
            if (end > x->r[k - 1].off + x->r[k - 1].len)
                x->r[k - 1].len = end - x->r[k - 1].off;
        } else {
            x->r[k++] = x->r[i];
        }
    }
    x->n = k;
    memcpy(x->name, name, len + 1);
    x->name_len = len;
    x->mem_id = mem_id;
    x->ops = ops;
    snprintf(x->bound_to, sizeof(x->bound_to), "%s", host ? host : "");
    x->pub_slot = -1;
    pthread_mutex_lock(&g->mu);
    pdl_grant_t **pp = find(g, name, len);
    bool taken = *pp != NULL, full = false;
    if (!taken && g->pub)
        full = !pub_add(g, x);
    if (!taken && !full) {
        x->gen = g->next_gen++;
        *pp = x;
        g->count++;
    }
    pthread_mutex_unlock(&g->mu);
    if (taken || full) {
        grant_free(x);
        return taken ? pdl_error_set(err, PDL_ERR_BAD_STATE, "grant %s: a grant of that name exists (revoke it first)", name)
                     : pdl_error_set(err, PDL_ERR_NOMEM,
                                     "grant %s: the published table is full (%d grants, or %u ranges in all; this one "
                                     "has %zu after merging): revoke some first",
                                     name, PDL_GRANT_PUB_SLOTS, PDL_GRANT_PUB_RANGES, k);
    }
    return PDL_OK;
}

bool pdl__grants_revoke(pdl_grants_t *g, const char *name)
{
    size_t len = name ? strlen(name) : 0;
    pthread_mutex_lock(&g->mu);
    pdl_grant_t **pp = find(g, name ? name : "", len);
    pdl_grant_t *x = *pp;
    if (x) {
        *pp = x->next;
        g->count--;
        pub_revoke(g, x);
        /* Out of the table, so no copy enters any more; wait for those under way (each is one bounded
         * system call or device copy, never a wait on the network: grant.h). */
        while (x->busy > 0)
            pthread_cond_wait(&g->idle, &g->mu);
    }
    pthread_mutex_unlock(&g->mu);
    if (x)
        grant_free(x);
    return x != NULL;
}

/* Is [off, off + len) inside one range of x? The ranges are merged, so one range must hold it all. */
static bool covered(const pdl_grant_t *x, uint64_t off, uint64_t len)
{
    size_t lo = 0, hi = x->n; /* the last range with r.off <= off is at lo - 1 after the search */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (x->r[mid].off <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return false;
    const pdl_range_t *r = &x->r[lo - 1];
    /* off >= r->off; the subtraction form cannot overflow (the server bounded off + len already). */
    return off - r->off <= r->len && len <= r->len - (off - r->off);
}

bool pdl__grants_peer(pdl_grants_t *g, const char *name, char *out, size_t cap)
{
    pthread_mutex_lock(&g->mu);
    const pdl_grant_t *x = *find(g, name, strlen(name));
    if (x)
        snprintf(out, cap, "%s", x->served_to);
    pthread_mutex_unlock(&g->mu);
    return x != NULL;
}

bool pdl__grants_enter(pdl_grants_t *g, const char *name, size_t name_len, uint64_t gen, pdl_grant_t **xp)
{
    pthread_mutex_lock(&g->mu);
    pdl_grant_t *x = *find(g, name, name_len);
    bool ok = x != NULL && x->gen == gen;
    if (ok) {
        x->busy++;
        *xp = x;
    }
    pthread_mutex_unlock(&g->mu);
    return ok;
}

void pdl__grants_leave(pdl_grants_t *g, pdl_grant_t *x)
{
    pthread_mutex_lock(&g->mu);
    if (--x->busy == 0)
        pthread_cond_broadcast(&g->idle);
    pthread_mutex_unlock(&g->mu);
}

/* A numeric host as 16 bytes (IPv4 as its IPv4-mapped IPv6 form); false when it is not one. */
static bool host_bytes(const char *h, uint8_t out[16])
{
    struct in_addr a4;
    if (inet_pton(AF_INET, h, &a4) == 1) {
        memset(out, 0, 10);
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &a4, 4);
        return true;
    }
    return inet_pton(AF_INET6, h, out) == 1;
}

/*
 * Is `peer` (getnameinfo's numeric host of a data connection) the host a grant is bound to ("" = any)?
 * Compared as addresses, not text: an IPv4 client of a dual-stack listener shows as ::ffff:a.b.c.d, and
 * one IPv6 address has several spellings. Text that is no address (a scoped one) must match exactly.
 */
static bool same_host(const char *bound, const char *peer)
{
    if (bound[0] == '\0')
        return true;
    uint8_t a[16], b[16];
    if (peer == NULL)
        return false;
    if (host_bytes(bound, a) && host_bytes(peer, b))
        return memcmp(a, b, 16) == 0;
    return strcmp(bound, peer) == 0;
}

bool pdl__grants_check(pdl_grants_t *g, const char *name, size_t name_len, uint64_t mem_id, unsigned op,
                       const uint8_t *segs, uint32_t nseg, const char *peer, uint64_t *gen, char *why, size_t cap)
{
    if (name_len == 0) {
        snprintf(why, cap, "the region is guarded and the request names no grant");
        return false;
    }
    bool ok = true;
    pthread_mutex_lock(&g->mu);
    pdl_grant_t *x = *find(g, name, name_len);
    if (x == NULL || x->mem_id != mem_id) {
        /* The name is the peer's: print only its length, never its bytes, into logs. */
        snprintf(why, cap, "no grant of that name (%zu bytes) for this region", name_len);
        ok = false;
    } else if ((x->ops & op) == 0) {
        snprintf(why, cap, "grant %s does not allow %s", x->name, op == PDL_GRANT_READ ? "reads" : "writes");
        ok = false;
    } else if (!same_host(x->bound_to, peer)) {
        /* Which host it is bound to is not said: the asker is not that host. */
        snprintf(why, cap, "grant %s is bound to another host than %s", x->name, peer);
        ok = false;
    } else {
        for (uint32_t i = 0; i < nseg && ok; i++) {
            uint64_t off = pdl_tcp_get64(segs + (size_t)i * PDL_TCP_SEG);
            uint64_t len = pdl_tcp_get64(segs + (size_t)i * PDL_TCP_SEG + 8);
            if (!covered(x, off, len)) {
                snprintf(why, cap, "[%" PRIu64 ", +%" PRIu64 ") is outside grant %s", off, len, x->name);
                ok = false;
            }
        }
        if (ok && x->served_to[0] == '\0')
            snprintf(x->served_to, sizeof(x->served_to), "%s", peer);
        if (ok && gen != NULL)
            *gen = x->gen;
    }
    pthread_mutex_unlock(&g->mu);
    return ok;
}
