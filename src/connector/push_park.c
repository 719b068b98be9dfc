/*
 * push_park.c -- the park WRITE mode's producer (push.c) and consumer (push_recv.c) share: messages that
 * came before their push or receive (push.h), dropped after defer_timeout and at instance destroy.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connector/push.h"
#include "common/clock.h"

void pdl__parked_free(pdl_parked_t *k)
{
    if (k) {
        free(k->blocks);
        free(k);
    }
}

void pdl__park_key(char key[PDL_PARK_KEY_MAX], int rank, const char *tid)
{
    snprintf(key, PDL_PARK_KEY_MAX, "%d|%s", rank, tid);
}

/* ---- reaping ---------------------------------------------------------------------------------- */

typedef struct park_reap {
    int rank;
    uint64_t now, defer_ns;
    char **keys;
    size_t n, cap;
} park_reap_t;

static void reap_parked(void *arg, const char *key, void *value)
{
    park_reap_t *c = arg;
    pdl_parked_t *k = value;
    if (k->rank != c->rank || pdl__clock_since(c->now, k->at_ns) < c->defer_ns)
        return;
    if (c->n == c->cap) {
        size_t nc = c->cap ? 2 * c->cap : 8;
        char **nv = realloc(c->keys, nc * sizeof(*nv));
        if (nv == NULL)
            return;
        c->keys = nv;
        c->cap = nc;
    }
    char *d = strdup(key);
    if (d)
        c->keys[c->n++] = d;
}

/* Drop rank r's parked entries older than defer_timeout. Parked abandons expire uncounted: they were
 * acted on when they came. */
void pdl__park_reap(pdl_rank_t *r)
{
    pdl_instance_t *inst = r->inst;
    park_reap_t c = {.rank = r->rank, .defer_ns = (uint64_t)(inst->cfg.conn.defer_timeout_s * 1e9)};
    size_t dropped_rb = 0;
    pthread_mutex_lock(&inst->push_mu);
    c.now = pdl__clock_now_ns(); /* read under the lock: every entry in the park is older */
    if (inst->parked.count > 0)
        pdl__strmap_foreach(&inst->parked, reap_parked, &c);
    for (size_t i = 0; i < c.n; i++) {
        pdl_parked_t *k = pdl__strmap_remove(&inst->parked, c.keys[i]);
        dropped_rb += k != NULL && !k->abandoned;
        pdl__parked_free(k);
        free(c.keys[i]);
    }
    pthread_mutex_unlock(&inst->push_mu);
    free(c.keys);
    if (dropped_rb > 0) {
        PDL_CTR_ADD(r, remote_blocks_dropped, dropped_rb);
        pdl_debug("rank %d: %zu parked remote_blocks dropped after defer_timeout", r->rank, dropped_rb);
    }
}

/* ---- instance destroy ------------------------------------------------------------------------- */

static void free_parked_v(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    pdl__parked_free(value);
}

void pdl__park_free_all(pdl_instance_t *inst)
{
    pdl__strmap_foreach(&inst->parked, free_parked_v, NULL);
    pdl__strmap_free(&inst->parked);
}
