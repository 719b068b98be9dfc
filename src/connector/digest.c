/*
 * digest.c -- KV integrity on the connector's READ path (docs/integrity.md).
 *
 * Producer: when the params of a held transfer are made (pdl_instance_params: the KV is final, the
 * decode is about to be told where it is), each local rank digests its heads of the held blocks, one
 * XXH3 per (layer, block, head) (layout/digest.c), into this store; with `sample` only the (layer,
 * block) pairs pdl_layout_digest_sampled picks. A consumer rank asks each producer rank it read from
 * on that rank's handshake port (PDL_WIRE_GET_DIGESTS; the service thread answers from the store).
 * Producers advertise the digest in their handshake metadata (`kv_digest`), so a pdlink consumer never
 * asks upstream MoRIIO or an older pdlink, and works with them as before.
 *
 * Consumer: after its reads completed (pdl__xfer_run returned: every batch waited for, the bytes are in
 * our memory), the lane fetches the digests and recomputes those of its own heads over the landed
 * bytes, piece by piece of its read plan -- each consumer rank checks exactly what it read, from
 * whichever producer ranks, without waiting for another rank. The checked pairs are those both sides'
 * modes digest (the larger stride).
 *
 * Store bounds: DIGESTS_MAX_ENTRIES transfers, DIGESTS_MAX_BYTES of digests; entries live twice
 * defer_timeout (a hold's lease) and the oldest go first when a bound is reached.
 */
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "connector/digest.h"
#include "connector/internal.h"
#include "common/clock.h"

#define DIGESTS_MAX_ENTRIES 4096
#define DIGESTS_MAX_BYTES (256ull << 20)

typedef struct digest_entry {
    char transfer_id[PDL_WIRE_ID_MAX + 1];
    uint64_t born_ns;
    uint64_t num_blocks;
    uint32_t stride;
    uint8_t **rank_digests; /* tp entries; the local ranks' are L * n * heads * 8 bytes */
    size_t bytes;
} digest_entry_t;

struct pdl_digests {
    pthread_mutex_t mu;
    digest_entry_t **v;
    size_t n, cap, bytes;
};

pdl_digests_t *pdl__digests_create(void)
{
    pdl_digests_t *d = calloc(1, sizeof(*d));
    if (d != NULL)
        pthread_mutex_init(&d->mu, NULL);
    return d;
}

static void entry_free(digest_entry_t *e, int tp)
{
    if (e == NULL)
        return;
    for (int i = 0; e->rank_digests && i < tp; i++)
        free(e->rank_digests[i]);
    free(e->rank_digests);
    free(e);
}

void pdl__digests_destroy(pdl_digests_t *d)
{
    if (d == NULL)
        return;
    for (size_t i = 0; i < d->n; i++)
        entry_free(d->v[i], PDL_TOPO_MAX_TP);
    free(d->v);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

static uint32_t mode_stride(pdl_kv_integrity_t m) { return m == PDL_KV_INTEGRITY_FULL ? 1 : PDL_DIGEST_SAMPLE_STRIDE; }

static const uint8_t *layer_ptr(const pdl_rank_t *r, int l)
{
    return (const uint8_t *)pdl_mem_ptr(pdl__layer_mem(&r->mem, l)) + pdl__layer_off(&r->mem, l);
}

static bool digests_usable(const pdl_instance_t *inst)
{
    return inst->cfg.conn.kv_integrity != PDL_KV_INTEGRITY_OFF && inst->cfg.kv_mem_type == PDL_MEM_TYPE_HOST;
}

void pdl__digests_advertise(pdl_rank_t *r)
{
    if (!digests_usable(r->inst))
        return;
    pdl_agent_meta_t m;
    pdl_bytes_t out = {0};
    if (pdl_wire_decode_agent_meta(r->mem.meta_payload.data, r->mem.meta_payload.len, &m, NULL) != PDL_OK)
        return;
    snprintf(m.kv_digest, sizeof(m.kv_digest), "%s", PDL_WIRE_DIGEST_XXH3);
    if (pdl_wire_encode_agent_meta(&m, &out, NULL) == PDL_OK) {
        pdl_bytes_free(&r->mem.meta_payload);
        r->mem.meta_payload = out;
    }
    pdl_agent_meta_clear(&m);
}

/* Rank r's digests of blocks ids[0..n) into a new array (NULL without memory). */
static uint8_t *rank_digest(pdl_rank_t *r, const uint32_t *ids, size_t n, uint64_t salt, uint32_t stride,
                            size_t *bytes)
{
    const pdl_kv_geometry_t *g = &r->mem.geo;
    uint32_t L = (uint32_t)r->inst->cfg.model.num_layers, H = g->num_heads;
    *bytes = (size_t)L * n * H * 8;
    uint8_t *dg = calloc(*bytes ? *bytes : 1, 1);
    if (dg == NULL)
        return NULL;
    uint64_t t0 = pdl__clock_now_ns(), hashed = 0;
    for (uint32_t l = 0; l < L; l++) {
        const uint8_t *base = layer_ptr(r, (int)l);
        for (size_t i = 0; i < n; i++) {
            if (!pdl_layout_digest_sampled(salt, l, i, stride))
                continue;
            for (uint32_t h = 0; h < H; h++)
                pdl_digest_put(dg, ((uint64_t)l * n + i) * H + h, pdl_layout_digest_head(g, base, ids[i], h));
            hashed += (uint64_t)pdl_layout_num_halves(g) * pdl_layout_block_len(g);
        }
    }
    PDL_CTR_ADD(r, kv_digest_bytes, hashed);
    PDL_CTR_ADD(r, kv_digest_ns, pdl__clock_now_ns() - t0);
    return dg;
}

/* Drop entry i (under mu). */
static void store_drop(pdl_digests_t *d, size_t i)
{
    d->bytes -= d->v[i]->bytes;
    entry_free(d->v[i], PDL_TOPO_MAX_TP);
    memmove(d->v + i, d->v + i + 1, (d->n - i - 1) * sizeof(d->v[0]));
    d->n--;
}

/* Make room for e and add it, replacing an entry of the same id (under mu). False without memory. */
static bool store_put(pdl_digests_t *d, digest_entry_t *e, uint64_t max_age_ns)
{
    uint64_t now = pdl__clock_now_ns();
    for (size_t i = d->n; i-- > 0;)
        if (strcmp(d->v[i]->transfer_id, e->transfer_id) == 0 || now - d->v[i]->born_ns > max_age_ns)
            store_drop(d, i);
    while (d->n > 0 && (d->n >= DIGESTS_MAX_ENTRIES || d->bytes + e->bytes > DIGESTS_MAX_BYTES))
        store_drop(d, 0); /* in age order: the oldest first */
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        digest_entry_t **v = realloc(d->v, cap * sizeof(*v));
        if (v == NULL)
            return false;
        d->v = v;
        d->cap = cap;
    }
    d->v[d->n++] = e;
    d->bytes += e->bytes;
    return true;
}

void pdl__digests_take(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n)
{
    if (inst->digests == NULL || !digests_usable(inst) || transfer_id == NULL || transfer_id[0] == '\0' ||
        strlen(transfer_id) > PDL_WIRE_ID_MAX || n == 0)
        return;
    digest_entry_t *e = calloc(1, sizeof(*e));
    if (e != NULL)
        e->rank_digests = calloc(PDL_TOPO_MAX_TP, sizeof(uint8_t *));
    if (e == NULL || e->rank_digests == NULL) {
        entry_free(e, 0);
        return;
    }
    snprintf(e->transfer_id, sizeof(e->transfer_id), "%s", transfer_id);
    e->num_blocks = n;
    e->stride = mode_stride(inst->cfg.conn.kv_integrity);
    uint64_t salt = pdl_layout_digest_salt(transfer_id);
    bool ok = true;
    PDL_FOR_LOCAL(inst, i) {
        size_t b = 0;
        ok = ok && (e->rank_digests[i] = rank_digest(&inst->ranks[i], ids, n, salt, e->stride, &b)) != NULL;
        e->bytes += b;
    }
    e->born_ns = pdl__clock_now_ns();
    pthread_mutex_lock(&inst->digests->mu);
    ok = ok && store_put(inst->digests, e, (uint64_t)(2e9 * inst->cfg.conn.defer_timeout_s));
    pthread_mutex_unlock(&inst->digests->mu);
    if (!ok) {
        pdl_warn("transfer %.100s: no KV digests kept (out of memory); its consumers cannot check it", transfer_id);
        entry_free(e, PDL_TOPO_MAX_TP);
    }
}

pdl_status_t pdl__digests_serve(pdl_rank_t *r, const void *req, size_t len, pdl_bytes_t *reply, pdl_error_t *err)
{
    pdl_digest_reply_t rep;
    memset(&rep, 0, sizeof(rep));
    pdl_status_t st = pdl_wire_decode_digest_request(req, len, rep.transfer_id, sizeof(rep.transfer_id), err);
    if (st != PDL_OK)
        return st;
    pdl_digests_t *d = r->inst->digests;
    rep.status = digests_usable(r->inst) && d != NULL ? PDL_DIGEST_UNKNOWN : PDL_DIGEST_OFF;
    rep.stride = 1;
    if (d == NULL)
        return pdl_wire_encode_digest_reply(&rep, reply, err);
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; rep.status == PDL_DIGEST_UNKNOWN && i < d->n; i++) {
        const digest_entry_t *e = d->v[i];
        if (strcmp(e->transfer_id, rep.transfer_id) != 0 || e->rank_digests[r->rank] == NULL)
            continue;
        rep.status = PDL_DIGEST_OK;
        rep.stride = e->stride;
        rep.num_layers = (uint32_t)r->inst->cfg.model.num_layers;
        rep.num_blocks = e->num_blocks;
        rep.num_heads = r->mem.geo.num_heads;
        rep.digests.data = e->rank_digests[r->rank]; /* borrowed: encoded (copied) under mu */
        rep.digests.len = (size_t)rep.num_layers * e->num_blocks * rep.num_heads * 8;
    }
    st = pdl_wire_encode_digest_reply(&rep, reply, err);
    pthread_mutex_unlock(&d->mu);
    return st;
}
