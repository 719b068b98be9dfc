/*
 * strmap.c -- chained string → pointer hash map used by the connector's bookkeeping (see strmap.h).
 */
#include "connector/strmap.h"

#include <stdlib.h>
#include <string.h>

static uint64_t strmap_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a offset basis */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
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
    pdl_strmap_entry_t **pp = strmap_slot(m, key, strmap_hash(key));
    return *pp ? (*pp)->value : NULL;
}

static int strmap_grow(pdl_strmap_t *m)
{
    size_t nb = m->nbuckets ? m->nbuckets * 2 : 64;
    pdl_strmap_entry_t **b = calloc(nb, sizeof(*b));
    if (b == NULL)
        return -1;
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
    uint64_t h = strmap_hash(key);
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
    pdl_strmap_entry_t **pp = strmap_slot(m, key, strmap_hash(key));
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
