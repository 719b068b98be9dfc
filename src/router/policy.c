/*
 * policy.c -- consistent_hash, round_robin and random selection (docs/vllm-router.md#selection-policies).
 *
 * The hash functions are vllm-router's port of mcrouter's hash.c: murmur64a with seed 4193360111,
 * furc_hash over a bit stream of chained murmur words, and fbi_hash = murmur64a(le32(furc_hash(key,
 * 2^23-1))). The same worker as the Rust router picks is reached by hashing the same text, serde's
 * re-serialised JSON (serde_text.h), with the same ring.
 * The ring is a sorted array of (hash, worker index) rebuilt only when the url list changes.
 */
#include "router/policy.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MURMUR_M 0xc6a4a7935bd1e995ull
#define MURMUR_R 47
#define FURC_SHIFT 23
#define FURC_MAX_TRIES 32
/* Bits consumed by furc_hash: at most 32 tries of (23 + 23 * 23) bits, i.e. < 17700 bits. */
#define FURC_WORDS 320

typedef struct ring_entry {
    uint64_t hash;
    uint32_t worker;
    uint32_t order; /* insertion order, so a later duplicate hash wins as in an ordered map */
} ring_entry_t;

struct pdl_policy {
    pdl_policy_kind_t kind;
    pthread_mutex_t mu;
    uint64_t rr_next;
    uint64_t rng;
    char *ring_sig; /* the url list the ring was built from, joined with '\n' */
    ring_entry_t *ring;
    size_t ring_n;
};

uint64_t pdl_policy_murmur64a(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = seed ^ ((uint64_t)len * MURMUR_M);
    size_t nblocks = len / 8;
    for (size_t i = 0; i < nblocks; i++) {
        uint64_t k = 0;
        for (int b = 7; b >= 0; b--)
            k = (k << 8) | p[i * 8 + (size_t)b];
        k *= MURMUR_M;
        k ^= k >> MURMUR_R;
        k *= MURMUR_M;
        h ^= k;
        h *= MURMUR_M;
    }
    const unsigned char *tail = p + nblocks * 8;
    switch (len & 7) {
    case 7: h ^= (uint64_t)tail[6] << 48; /* fall through */
    case 6: h ^= (uint64_t)tail[5] << 40; /* fall through */
    case 5: h ^= (uint64_t)tail[4] << 32; /* fall through */
    case 4: h ^= (uint64_t)tail[3] << 24; /* fall through */
    case 3: h ^= (uint64_t)tail[2] << 16; /* fall through */
    case 2: h ^= (uint64_t)tail[1] << 8;  /* fall through */
    case 1:
        h ^= (uint64_t)tail[0];
        h *= MURMUR_M;
    }
    h ^= h >> MURMUR_R;
    h *= MURMUR_M;
    h ^= h >> MURMUR_R;
    return h;
}

static uint64_t rehash64a(uint64_t k)
{
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(k >> (8 * i));
    return pdl_policy_murmur64a(le, 8, PDL_POLICY_HASH_SEED);
}

typedef struct furc_bits {
    uint64_t words[FURC_WORDS];
    size_t have;
} furc_bits_t;

static int furc_bit(furc_bits_t *b, size_t idx)
{
    size_t w = idx >> 6;
    if (w >= FURC_WORDS)
        return 0; /* unreachable with the bounds above; keeps hostile m from reading past the array */
    while (b->have <= w) {
        b->words[b->have] = rehash64a(b->words[b->have - 1]);
        b->have++;
    }
    return (int)((b->words[w] >> (idx & 63)) & 1);
}

uint32_t pdl_policy_furc_hash(const void *key, size_t len, uint32_t m)
{
    if (m <= 1)
        return 0;
    furc_bits_t b;
    b.words[0] = pdl_policy_murmur64a(key, len, PDL_POLICY_HASH_SEED);
    b.have = 1;
    uint32_t d = 0;
    while (d < 32 && (1ull << d) < m)
        d++;
    size_t a = d;
    for (int tries = 0; tries < FURC_MAX_TRIES; tries++) {
        while (!furc_bit(&b, a)) {
            if (--d == 0)
                return 0;
            a = d;
        }
        a += FURC_SHIFT;
        uint64_t num = 1;
        for (uint32_t i = 0; i + 1 < d; i++) {
            num = (num << 1) | (uint64_t)furc_bit(&b, a);
            a += FURC_SHIFT;
        }
        if (num < m)
            return (uint32_t)num;
    }
    return 0;
}

uint64_t pdl_policy_fbi_hash(const void *key, size_t len)
{
    uint32_t f = pdl_policy_furc_hash(key, len, (1u << 23) - 1);
    unsigned char le[4] = {(unsigned char)f, (unsigned char)(f >> 8), (unsigned char)(f >> 16),
                           (unsigned char)(f >> 24)};
    return pdl_policy_murmur64a(le, 4, PDL_POLICY_HASH_SEED);
}

pdl_status_t pdl_policy_create(pdl_policy_kind_t kind, uint64_t random_seed, pdl_policy_t **policy_p)
{
    pdl_policy_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return PDL_ERR_NOMEM;
    p->kind = kind;
    p->rng = random_seed ? random_seed : 0x9e3779b97f4a7c15ull;
    pthread_mutex_init(&p->mu, NULL);
    *policy_p = p;
    return PDL_OK;
}

void pdl_policy_destroy(pdl_policy_t *p)
{
    if (p == NULL)
        return;
    free(p->ring_sig);
    free(p->ring);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

static int cmp_ring(const void *a, const void *b)
{
    const ring_entry_t *x = a, *y = b;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order ? 1 : 0;
}

/* Rebuild the ring if the url list differs from the one it was built from. Called with p->mu held. */
static int ring_update(pdl_policy_t *p, const char *const *urls, size_t n)
{
    size_t siglen = 0;
    for (size_t i = 0; i < n; i++)
        siglen += strlen(urls[i]) + 1;
    char *sig = malloc(siglen + 1);
    if (sig == NULL)
        return -1;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(urls[i]);
        memcpy(sig + off, urls[i], l);
        off += l;
        sig[off++] = '\n';
    }
    sig[off] = '\0';
    if (p->ring_sig != NULL && strcmp(p->ring_sig, sig) == 0) {
        free(sig);
        return 0;
    }
    ring_entry_t *ring = malloc(n * PDL_POLICY_VIRTUAL_NODES * sizeof(*ring));
    if (ring == NULL) {
        free(sig);
        return -1;
    }
    size_t k = 0;
    for (size_t w = 0; w < n; w++) {
        for (int v = 0; v < PDL_POLICY_VIRTUAL_NODES; v++) {
            char key[1024];
            int kl = snprintf(key, sizeof(key), "%s:%d", urls[w], v);
            if (kl < 0 || (size_t)kl >= sizeof(key))
                kl = (int)sizeof(key) - 1;
            ring[k].hash = pdl_policy_fbi_hash(key, (size_t)kl);
            ring[k].worker = (uint32_t)w;
            ring[k].order = (uint32_t)k;
            k++;
        }
    }
    qsort(ring, k, sizeof(*ring), cmp_ring);
    /* Keep the last of equal hashes (a later insert overwrites in the reference's ordered map). */
    size_t m = 0;
    for (size_t i = 0; i < k; i++) {
        if (m > 0 && ring[m - 1].hash == ring[i].hash)
            ring[m - 1] = ring[i];
        else
            ring[m++] = ring[i];
    }
    free(p->ring);
    free(p->ring_sig);
    p->ring = ring;
    p->ring_n = m;
    p->ring_sig = sig;
    return 0;
}

static uint64_t xorshift64(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

size_t pdl_policy_pick(pdl_policy_t *p, const char *const *urls, size_t n, const char *hash_key)
{
    if (n <= 1)
        return 0;
    size_t idx = 0;
    pthread_mutex_lock(&p->mu);
    switch (p->kind) {
    case PDL_POLICY_ROUND_ROBIN:
        idx = (size_t)(p->rr_next++ % n);
        break;
    case PDL_POLICY_RANDOM:
        idx = (size_t)(xorshift64(&p->rng) % n);
        break;
    case PDL_POLICY_CONSISTENT_HASH: {
        if (ring_update(p, urls, n) != 0 || p->ring_n == 0) {
            idx = (size_t)(p->rr_next++ % n); /* out of memory: any worker beats failing the request */
            break;
        }
        const char *key = hash_key ? hash_key : "";
        uint64_t h = pdl_policy_fbi_hash(key, strlen(key));
        size_t lo = 0, hi = p->ring_n; /* first entry with hash >= h */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (p->ring[mid].hash < h)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == p->ring_n)
            lo = 0;
        idx = p->ring[lo].worker;
        break;
    }
    }
    pthread_mutex_unlock(&p->mu);
    return idx < n ? idx : 0;
}

/* The value of a key as the text scan in the reference would see it: strings raw, numbers as text. */
static char *scalar_text(const json_t *v)
{
    char buf[64];
    if (json_is_string(v))
        return strndup(json_string_value(v), json_string_length(v));
    if (json_is_integer(v)) {
        snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return strdup(buf);
    }
    if (json_is_real(v)) {
        snprintf(buf, sizeof(buf), "%.17g", json_real_value(v));
        return strdup(buf);
    }
    return NULL;
}

static char *prefixed(const char *prefix, char *value)
{
    if (value == NULL)
        return NULL;
    size_t pl = strlen(prefix), vl = strlen(value);
    char *out = malloc(pl + vl + 1);
    if (out != NULL) {
        memcpy(out, prefix, pl);
        memcpy(out + pl, value, vl + 1);
    }
    free(value);
    return out;
}

char *pdl_policy_hash_key(const json_t *body, const char *text, size_t text_len)
{
    if (json_is_object(body)) {
        const json_t *sp = json_object_get(body, "session_params");
        char *v;
        if (json_is_object(sp) && (v = scalar_text(json_object_get(sp, "session_id"))) != NULL)
            return prefixed("session:", v);
        if ((v = scalar_text(json_object_get(body, "user"))) != NULL)
            return prefixed("user:", v);
        if ((v = scalar_text(json_object_get(body, "session_id"))) != NULL)
            return prefixed("session:", v);
        if ((v = scalar_text(json_object_get(body, "user_id"))) != NULL)
            return prefixed("user:", v);
    }
    if (text_len > 100) {
        char *out = malloc(32);
        if (out != NULL)
            snprintf(out, 32, "request_hash:%016llx", (unsigned long long)pdl_policy_fbi_hash(text, text_len));
        return out;
    }
    char *out = malloc(text_len + 9);
    if (out != NULL) {
        memcpy(out, "request:", 8);
        memcpy(out + 8, text, text_len);
        out[8 + text_len] = '\0';
    }
    return out;
}
