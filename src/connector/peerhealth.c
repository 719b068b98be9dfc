/*
 * peerhealth.c -- failed peers and their backoff (pure; the state diagram is in peerhealth.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connector/peerhealth.h"

typedef struct pdl_health_entry {
    pdl_health_state_t state;
    int failures;
    pdl_status_t status;
    uint64_t failed_at_ns, retry_at_ns;
    uint64_t rechecked_ns; /* the last pdl__health_recheck_due that said yes; 0 = none since the failure */
    char reason[PDL_HEALTH_REASON_MAX];
} pdl_health_entry_t;

void pdl__health_init(pdl_peerhealth_t *h, uint64_t initial_ns, uint64_t max_ns, size_t max_entries)
{
    memset(h, 0, sizeof(*h));
    h->initial_ns = initial_ns;
    h->max_ns = max_ns < initial_ns ? initial_ns : max_ns;
    h->max_entries = max_entries;
}

static void free_entry(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    free(value);
}

void pdl__health_fini(pdl_peerhealth_t *h)
{
    pdl__strmap_foreach(&h->map, free_entry, NULL);
    pdl__strmap_free(&h->map);
}

bool pdl__health_admit(pdl_peerhealth_t *h, const char *key, uint64_t now_ns, pdl_status_t *st_out, char *why,
                       size_t cap)
{
    pdl_health_entry_t *e = pdl__strmap_get(&h->map, key);
    if (e == NULL)
        return true;
    if (e->state == PDL_HEALTH_BACKOFF && now_ns >= e->retry_at_ns) {
        e->state = PDL_HEALTH_PROBING;
        return true;
    }
    /* Still backing off, or another attempt is already probing the peer. */
    if (st_out)
        *st_out = e->status;
    if (why && cap > 0) {
        double ago = now_ns > e->failed_at_ns ? (double)(now_ns - e->failed_at_ns) / 1e9 : 0.0;
        if (e->state == PDL_HEALTH_PROBING)
            snprintf(why, cap, "%s, %.1f s ago; a retry is under way", e->reason, ago);
        else
            snprintf(why, cap, "%s, %.1f s ago; retry in %.1f s", e->reason, ago,
                     (double)(e->retry_at_ns - now_ns) / 1e9);
    }
    return false;
}

void pdl__health_failed(pdl_peerhealth_t *h, const char *key, uint64_t now_ns, pdl_status_t st, const char *reason)
{
    pdl_health_entry_t *e = pdl__strmap_get(&h->map, key);
    if (e == NULL) {
        if (h->map.count >= h->max_entries)
            return;
        e = calloc(1, sizeof(*e));
        if (e == NULL)
            return;
        if (pdl__strmap_put(&h->map, key, e) != 0) {
            free(e);
            return;
        }
    }
    e->failures++;
    uint64_t backoff = h->initial_ns;
    for (int i = 1; i < e->failures && backoff < h->max_ns; i++)
        backoff *= 2;
    if (backoff > h->max_ns)
        backoff = h->max_ns;
    e->state = PDL_HEALTH_BACKOFF;
    e->status = st;
    e->failed_at_ns = now_ns;
    e->retry_at_ns = now_ns + backoff;
    e->rechecked_ns = 0; /* the peer may be restarted right after it refused: the first recheck is free */
    snprintf(e->reason, sizeof(e->reason), "%s", reason ? reason : "failed");
}

bool pdl__health_recheck_due(pdl_peerhealth_t *h, const char *key, uint64_t now_ns, uint64_t every_ns)
{
    pdl_health_entry_t *e = pdl__strmap_get(&h->map, key);
    if (e == NULL || e->state != PDL_HEALTH_BACKOFF || e->status != PDL_ERR_PEER_GONE ||
        (e->rechecked_ns != 0 && now_ns < e->rechecked_ns + every_ns))
        return false;
    e->rechecked_ns = now_ns;
    return true;
}

void pdl__health_readmit(pdl_peerhealth_t *h, const char *key)
{
    pdl_health_entry_t *e = pdl__strmap_get(&h->map, key);
    if (e != NULL && e->state == PDL_HEALTH_BACKOFF)
        e->state = PDL_HEALTH_PROBING;
}

void pdl__health_ok(pdl_peerhealth_t *h, const char *key) { free(pdl__strmap_remove(&h->map, key)); }

pdl_health_state_t pdl__health_state(const pdl_peerhealth_t *h, const char *key, int *failures, uint64_t *retry_at_ns)
{
    const pdl_health_entry_t *e = pdl__strmap_get(&h->map, key);
    if (failures)
        *failures = e ? e->failures : 0;
    if (retry_at_ns)
        *retry_at_ns = e ? e->retry_at_ns : 0;
    return e ? e->state : PDL_HEALTH_HEALTHY;
}

size_t pdl__health_count(const pdl_peerhealth_t *h) { return h->map.count; }
