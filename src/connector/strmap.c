/*
 * strmap.c -- chained string → pointer hash map used by the connector's bookkeeping (see strmap.h).
 */
#include "connector/strmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/siphash.h"

static uint64_t strmap_hash(const pdl_strmap_t *m, const char *s) { return pdl__siphash24(m->key, s, strlen(s)); }

/*
 * Draw the map's key. getrandom(2) without flags blocks only until the kernel's pool is first
 * initialised at boot and then never fails except with EINTR. Should it be unavailable (ENOSYS under
 * an old kernel or a seccomp filter), the key falls back to values an attacker cannot read remotely
 * with any precision (the map's address, the monotonic clock in ns, the pid), mixed by SipHash: weaker
 * than a random key, but still per map and not a constant an attacker could compute against.
 */
static void strmap_seed(pdl_strmap_t *m)
{
    size_t got = 0;
    while (got < sizeof(m->key)) {
        ssize_t r = getrandom(m->key + got, sizeof(m->key) - got, 0);
        if (r > 0)
            got += (size_t)r;
        else if (r < 0 && errno != EINTR)
            break;
    }
    if (got == sizeof(m->key))
        return;
    uint64_t parts[4] = {(uint64_t)(uintptr_t)m, pdl__clock_now_ns(), (uint64_t)getpid(), 0};
    static const uint8_t zero[16];
    uint64_t k0 = pdl__siphash24(zero, parts, sizeof(parts));
    parts[0] ^= k0;
    uint64_t k1 = pdl__siphash24(zero, parts, sizeof(parts));
    memcpy(m->key, &k0, 8);
    memcpy(m->key + 8, &k1, 8);
}
void pdl__strmap_free(pdl_strmap_t *m)
{
    for (size_t i = 0; i < m->nbuckets; i++) {
        pdl_strmap_entry_t *e = m->buckets[i];
        while (e) {
            pdl_strmap_entry_t *n = e->next;
            free(e);
            e = n;
        }
    }
    free(m->buckets);
    m->buckets = NULL;
    m->nbuckets = 0;
    m->count = 0;
}

static pdl_strmap_entry_t **strmap_slot(const pdl_strmap_t *m, const char *key, uint64_t h)
{
    pdl_strmap_entry_t **pp = &m->buckets[h & (m->nbuckets - 1)];
    while (*pp && ((*pp)->hash != h || strcmp((*pp)->key, key) != 0))
        pp = &(*pp)->next;
    return pp;
}

void *pdl__strmap_get(const pdl_strmap_t *m, const char *key)
{
    if (m->nbuckets == 0)
        return NULL;
    pdl_strmap_entry_t **pp = strmap_slot(m, key, strmap_hash(m, key));
    return *pp ? (*pp)->value : NULL;
}

static int strmap_grow(pdl_strmap_t *m)
{
    size_t nb = m->nbuckets ? m->nbuckets * 2 : 64;
    pdl_strmap_entry_t **b = calloc(nb, sizeof(*b));
    if (b == NULL)
        return -1;
    /* A new key only while the map is empty: entries keep their hash, which must stay valid. */
    if (m->nbuckets == 0)
        strmap_seed(m);
    for (size_t i = 0; i < m->nbuckets; i++) {
        pdl_strmap_entry_t *e = m->buckets[i];
        while (e) {
            pdl_strmap_entry_t *n = e->next;
            e->next = b[e->hash & (nb - 1)];
            b[e->hash & (nb - 1)] = e;
            e = n;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = nb;
    return 0;
}

int pdl__strmap_put(pdl_strmap_t *m, const char *key, void *value)
{
    if ((m->nbuckets == 0 || m->count >= 2 * m->nbuckets) && strmap_grow(m) != 0 && m->nbuckets == 0)
        return -1;
    uint64_t h = strmap_hash(m, key);
    pdl_strmap_entry_t **pp = strmap_slot(m, key, h);
    if (*pp)
        return 1;
    size_t kl = strlen(key);
    pdl_strmap_entry_t *e = malloc(sizeof(*e) + kl + 1);
    if (e == NULL)
        return -1;
    e->next = NULL;
    e->hash = h;
    e->value = value;
    memcpy(e->key, key, kl + 1);
    *pp = e;
    m->count++;
    return 0;
}

void *pdl__strmap_remove(pdl_strmap_t *m, const char *key)
{
    if (m->nbuckets == 0)
        return NULL;
    pdl_strmap_entry_t **pp = strmap_slot(m, key, strmap_hash(m, key));
    pdl_strmap_entry_t *e = *pp;
    if (e == NULL)
        return NULL;
    *pp = e->next;
    void *v = e->value;
    free(e);
    m->count--;
    return v;
}

void pdl__strmap_foreach(const pdl_strmap_t *m, void (*fn)(void *arg, const char *key, void *value), void *arg)
{
    for (size_t i = 0; i < m->nbuckets; i++)
        for (pdl_strmap_entry_t *e = m->buckets[i]; e; e = e->next)
            fn(arg, e->key, e->value);
}
