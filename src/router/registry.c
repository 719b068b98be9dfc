/*
 * registry.c -- live prefill/decode instances with a TTL and the cluster transfer-mode lock.
 *
 * Small arrays searched linearly: a deployment has a handful of instances, and a linear scan under
 * one mutex is cheaper and simpler than a hash map at that size. The bound PDL_REGISTRY_MAX_PER_ROLE
 * keeps a hostile sender from growing the tables without limit.
 */
#include "router/registry.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

typedef struct pdl_worker_table {
    pdl_worker_t *items;
    size_t n, cap;
} pdl_worker_table_t;

struct pdl_registry {
    pthread_mutex_t mu;
    uint32_t ttl_ms;
    pdl_transfer_mode_t mode;
    pdl_worker_table_t prefill, decode;
};

pdl_status_t pdl_registry_create(uint32_t ttl_ms, pdl_registry_t **reg_p)
{
    pdl_registry_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return PDL_ERR_NOMEM;
    pthread_mutex_init(&r->mu, NULL);
    r->ttl_ms = ttl_ms;
    r->mode = PDL_MODE_UNKNOWN;
    *reg_p = r;
    return PDL_OK;
}

void pdl_registry_destroy(pdl_registry_t *r)
{
    if (r == NULL)
        return;
    free(r->prefill.items);
    free(r->decode.items);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

const char *pdl_transfer_mode_name(pdl_transfer_mode_t m)
{
    return m == PDL_MODE_READ ? "READ" : m == PDL_MODE_WRITE ? "WRITE" : "unknown";
}

static pdl_worker_table_t *table_of(pdl_registry_t *r, char role)
{
    return role == 'P' ? &r->prefill : role == 'D' ? &r->decode : NULL;
}

pdl_status_t pdl_registry_upsert(pdl_registry_t *r, const pdl_registration_t *reg, const char *source, bool trusted,
                                 bool api_key, uint64_t now_ms, bool *added_p, pdl_error_t *err)
{
    if (source == NULL)
        source = "";
    if (added_p)
        *added_p = false;
    size_t hl = strnlen(reg->http_address, sizeof(reg->http_address));
    size_t zl = strnlen(reg->zmq_address, sizeof(reg->zmq_address));
    if (hl == 0 || hl == sizeof(reg->http_address) || zl == sizeof(reg->zmq_address))
        return pdl_error_set(err, PDL_ERR_INVALID, "registration has an empty or unterminated http_address");
    pdl_transfer_mode_t mode = reg->write_mode ? PDL_MODE_WRITE : PDL_MODE_READ;
    pthread_mutex_lock(&r->mu);
    pdl_worker_table_t *t = table_of(r, reg->type);
    if (t == NULL) {
        pthread_mutex_unlock(&r->mu);
        return pdl_error_set(err, PDL_ERR_INVALID, "instance %s: unknown role '%c'", reg->http_address, reg->type);
    }
    if (r->mode != PDL_MODE_UNKNOWN && r->mode != mode) {
        pdl_transfer_mode_t cur = r->mode;
        pthread_mutex_unlock(&r->mu);
        return pdl_error_set(err, PDL_ERR_MISMATCH,
                             "instance %s registered transfer_mode %s but the cluster mode is %s (fixed by the "
                             "first registration); ignored",
                             reg->http_address, pdl_transfer_mode_name(mode), pdl_transfer_mode_name(cur));
    }
    pdl_worker_t *w = NULL;
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->items[i].http_address, reg->http_address) == 0) {
            w = &t->items[i];
            break;
        }
    if (w != NULL && !trusted && strcmp(w->source, source) != 0) {
        char was[sizeof(w->source)], zmq[sizeof(w->zmq_address)];
        memcpy(was, w->source, sizeof(was));
        memcpy(zmq, w->zmq_address, sizeof(zmq));
        pthread_mutex_unlock(&r->mu);
        return pdl_error_set(err, PDL_ERR_DENIED,
                             "instance %s (zmq %s) was registered from %s; a registration from %s (zmq %s) is "
                             "ignored until the entry expires (authenticated mode, --auth-key-file, lets key "
                             "holders re-register from anywhere)",
                             reg->http_address, zmq, was[0] ? was : "an unknown address", source[0] ? source : "an unknown address",
                             reg->zmq_address);
    }
    if (w == NULL) {
        if (t->n == PDL_REGISTRY_MAX_PER_ROLE) {
            pthread_mutex_unlock(&r->mu);
            return pdl_error_set(err, PDL_ERR_NOMEM, "instance %s: the %s table is full (%d entries)",
                                 reg->http_address, reg->type == 'P' ? "prefill" : "decode",
                                 PDL_REGISTRY_MAX_PER_ROLE);
        }
        if (t->n == t->cap) {
            size_t ncap = t->cap ? t->cap * 2 : 8;
            pdl_worker_t *ni = realloc(t->items, ncap * sizeof(*ni));
            if (ni == NULL) {
                pthread_mutex_unlock(&r->mu);
                return pdl_error_set(err, PDL_ERR_NOMEM, "instance %s: out of memory", reg->http_address);
            }
            t->items = ni;
            t->cap = ncap;
        }
        w = &t->items[t->n++];
        memset(w, 0, sizeof(*w));
        w->role = reg->type;
        memcpy(w->http_address, reg->http_address, hl + 1);
        w->first_seen_ms = now_ms;
        if (added_p)
            *added_p = true;
    }
    snprintf(w->source, sizeof(w->source), "%s", source); /* the same, or a key holder's new one */
    memcpy(w->zmq_address, reg->zmq_address, zl + 1);
    w->dp_size = reg->dp_size > 0 ? reg->dp_size : 1;
    w->tp_size = reg->tp_size > 0 ? reg->tp_size : 1;
    w->is_g1 = reg->is_g1;
    w->api_key = api_key;
    w->expires_ms = now_ms + r->ttl_ms;
    w->registrations++;
    if (r->mode == PDL_MODE_UNKNOWN) {
        r->mode = mode;
        pdl_info("cluster transfer mode is %s (fixed by %s)", pdl_transfer_mode_name(mode), reg->http_address);
    }
    pthread_mutex_unlock(&r->mu);
    return PDL_OK;
}

static size_t sweep_table(pdl_worker_table_t *t, uint64_t now_ms, const char *what)
{
    size_t kept = 0, dropped = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (t->items[i].expires_ms <= now_ms) {
            pdl_info("%s instance %s expired (no registration for the TTL)", what, t->items[i].http_address);
            dropped++;
            continue;
        }
        if (kept != i)
            t->items[kept] = t->items[i];
        kept++;
    }
    t->n = kept;
    return dropped;
}

size_t pdl_registry_sweep(pdl_registry_t *r, uint64_t now_ms)
{
    pthread_mutex_lock(&r->mu);
    size_t n = sweep_table(&r->prefill, now_ms, "prefill") + sweep_table(&r->decode, now_ms, "decode");
    pthread_mutex_unlock(&r->mu);
    return n;
}

static int cmp_worker(const void *a, const void *b)
{
    return strcmp(((const pdl_worker_t *)a)->http_address, ((const pdl_worker_t *)b)->http_address);
}

pdl_status_t pdl_registry_snapshot(pdl_registry_t *r, char role, uint64_t now_ms, pdl_worker_t **out_p, size_t *n_p)
{
    *out_p = NULL;
    *n_p = 0;
    pthread_mutex_lock(&r->mu);
    pdl_worker_table_t *t = table_of(r, role);
    if (t == NULL || t->n == 0) {
        pthread_mutex_unlock(&r->mu);
        return t ? PDL_OK : PDL_ERR_INVALID;
    }
    pdl_worker_t *out = malloc(t->n * sizeof(*out));
    if (out == NULL) {
        pthread_mutex_unlock(&r->mu);
        return PDL_ERR_NOMEM;
    }
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->items[i].expires_ms > now_ms)
            out[n++] = t->items[i];
    pthread_mutex_unlock(&r->mu);
    if (n == 0) {
        free(out);
        return PDL_OK;
    }
    qsort(out, n, sizeof(*out), cmp_worker);
    *out_p = out;
    *n_p = n;
    return PDL_OK;
}

void pdl_registry_counts(pdl_registry_t *r, uint64_t now_ms, size_t *n_prefill, size_t *n_decode)
{
    size_t p = 0, d = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->prefill.n; i++)
        p += r->prefill.items[i].expires_ms > now_ms;
    for (size_t i = 0; i < r->decode.n; i++)
        d += r->decode.items[i].expires_ms > now_ms;
    pthread_mutex_unlock(&r->mu);
    if (n_prefill)
        *n_prefill = p;
    if (n_decode)
        *n_decode = d;
}

pdl_transfer_mode_t pdl_registry_mode(pdl_registry_t *r)
{
    pthread_mutex_lock(&r->mu);
    pdl_transfer_mode_t m = r->mode;
    pthread_mutex_unlock(&r->mu);
    return m;
}
