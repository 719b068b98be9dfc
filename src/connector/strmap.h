/*
 * strmap.h -- a small chained hash map from NUL-terminated strings to pointers (internal).
 *
 * The connector keys most of its state by transfer id (held transfers, finished transfers, remote
 * peers). Ids come from the network, so lookups must stay O(1) under a flood of distinct ids; a
 * linear list would let a hostile sender make every release cost a scan, and so would an unkeyed hash
 * (FNV-1a into power-of-two buckets: ids that share the hash's low bits are easy to compute). Each map
 * therefore hashes with SipHash-2-4 under its own random 128-bit key (getrandom(2), drawn at the first
 * insert), into a power-of-two bucket count that doubles when the load passes 2. Not thread-safe: the
 * owner guards it.
 */
#ifndef PDL_CONNECTOR_STRMAP_H
#define PDL_CONNECTOR_STRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pdl_strmap_entry {
    struct pdl_strmap_entry *next;
    uint64_t hash;
    void *value;
    char key[];
} pdl_strmap_entry_t;

typedef struct pdl_strmap {
    pdl_strmap_entry_t **buckets;
    size_t nbuckets; /* power of two, 0 before the first insert */
    size_t count;
    uint8_t key[16]; /* SipHash key of this map, drawn when the first bucket table is made */
} pdl_strmap_t;

/* A zeroed struct is an empty map. */
void pdl__strmap_free(pdl_strmap_t *m); /* frees entries, not the values; the map is empty again */
void *pdl__strmap_get(const pdl_strmap_t *m, const char *key);
/* 0 inserted; 1 the key exists (nothing changed); -1 out of memory. */
int pdl__strmap_put(pdl_strmap_t *m, const char *key, void *value);
/* Removes the key and returns its value (NULL if absent). */
void *pdl__strmap_remove(pdl_strmap_t *m, const char *key);
/* Calls fn for each entry; fn may not modify the map. */
void pdl__strmap_foreach(const pdl_strmap_t *m, void (*fn)(void *arg, const char *key, void *value), void *arg);

#endif /* PDL_CONNECTOR_STRMAP_H */
