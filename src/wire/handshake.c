/*
 * handshake.c -- the two payloads a handshake server sends back for `get_meta_msg`: the agent metadata
 * map and the layer map (docs/protocol.md#handshake).
 *
 * Agent metadata: upstream encodes MoRIIOAgentMetadata with msgspec as a map in field order engine_id,
 * agent_metadata, kv_caches_base_addr, num_blocks, block_len, attn_backend_name; all six are required
 * since msgspec has no defaults for them. msgspec ignores unknown fields, so pdlink appends its
 * compatibility keys after them: pdlink_version, tp_size, tp_rank, dp_rank,
 * num_layers, total_num_kv_heads, head_dim, kv_elem_size, block_size, layout, is_mla, kv_digest. The pdlink keys
 * are read only when `pdlink_version` is present (they mean nothing without it) and each is optional;
 * an absent integer reads as -1, an absent layout as "" and an absent is_mla as false.
 *
 * Layer map: layer name (str) → array of bin (packed memory descriptors), in the order the sender wrote
 * them. Counts are bounded (PDL_WIRE_MAX_LAYERS, PDL_WIRE_MAX_LAYER_DESCS, PDL_WIRE_MAX_DESC_BYTES), a
 * layer must carry at least one descriptor, and a name appearing twice is refused.
 */
#include "pdlink/wire.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "wire/mp.h"

#define META_CTX "agent_meta"
#define LMAP_CTX "layer_map"
#define META_MAX_ITEMS (PDL_WIRE_MAX_BASE_ADDRS + 4096)
#define LMAP_MAX_ITEMS (PDL_WIRE_MAX_LAYERS * (2 + PDL_WIRE_MAX_LAYER_DESCS) + 64)

/* ---- agent metadata --------------------------------------------------------------------------- */

void pdl_agent_meta_init(pdl_agent_meta_t *m)
{
    memset(m, 0, sizeof(*m));
    m->tp_size = m->tp_rank = m->dp_rank = -1;
    m->num_layers = m->total_num_kv_heads = m->head_dim = m->kv_elem_size = m->block_size = -1;
}

void pdl_agent_meta_clear(pdl_agent_meta_t *m)
{
    if (m == NULL)
        return;
    pdl_bytes_free(&m->agent_metadata);
    free(m->kv_caches_base_addr);
    m->kv_caches_base_addr = NULL;
    m->num_base_addr = 0;
}

bool pdl_agent_meta_equal(const pdl_agent_meta_t *a, const pdl_agent_meta_t *b)
{
    if (strcmp(a->engine_id, b->engine_id) != 0 || a->agent_metadata.len != b->agent_metadata.len ||
        (a->agent_metadata.len > 0 && memcmp(a->agent_metadata.data, b->agent_metadata.data, a->agent_metadata.len) != 0))
        return false;
    if (a->num_base_addr != b->num_base_addr ||
        (a->num_base_addr > 0 &&
         memcmp(a->kv_caches_base_addr, b->kv_caches_base_addr, a->num_base_addr * sizeof(uint64_t)) != 0))
        return false;
    if (a->num_blocks != b->num_blocks || a->block_len != b->block_len ||
        strcmp(a->attn_backend_name, b->attn_backend_name) != 0 || a->has_pdlink != b->has_pdlink)
        return false;
    if (!a->has_pdlink)
        return true;
    return strcmp(a->pdlink_version, b->pdlink_version) == 0 && a->tp_size == b->tp_size && a->tp_rank == b->tp_rank &&
           a->dp_rank == b->dp_rank && a->num_layers == b->num_layers &&
           a->total_num_kv_heads == b->total_num_kv_heads && a->head_dim == b->head_dim &&
           a->kv_elem_size == b->kv_elem_size && a->block_size == b->block_size && strcmp(a->layout, b->layout) == 0 &&
           a->is_mla == b->is_mla && strcmp(a->kv_digest, b->kv_digest) == 0;
}

enum {
    M_ENGINE_ID, M_AGENT_METADATA, M_BASE_ADDR, M_NUM_BLOCKS, M_BLOCK_LEN, M_ATTN, /* upstream, required */
    M_VERSION, M_TP_SIZE, M_TP_RANK, M_DP_RANK, M_NUM_LAYERS, M_HEADS, M_HEAD_DIM, M_ELEM, M_BLOCK_SIZE,
    M_LAYOUT, M_IS_MLA, M_KV_DIGEST, M_COUNT
};
static const char *const meta_keys[M_COUNT] = {
    "engine_id", "agent_metadata", "kv_caches_base_addr", "num_blocks", "block_len", "attn_backend_name",
    "pdlink_version", "tp_size", "tp_rank", "dp_rank", "num_layers", "total_num_kv_heads", "head_dim",
    "kv_elem_size", "block_size", "layout", "is_mla", "kv_digest",
};

/* The optional positive pdlink integers: key index, field, minimum. tp_rank/dp_rank are handled apart. */
typedef struct meta_int {
    int key;
    size_t off;
    int64_t min, max;
} meta_int_t;
static const meta_int_t meta_ints[] = {
    {M_TP_SIZE, offsetof(pdl_agent_meta_t, tp_size), 1, PDL_WIRE_MAX_TP},
    {M_DP_RANK, offsetof(pdl_agent_meta_t, dp_rank), 0, PDL_WIRE_MAX_TP - 1},
    {M_NUM_LAYERS, offsetof(pdl_agent_meta_t, num_layers), 0, INT32_MAX},
    {M_HEADS, offsetof(pdl_agent_meta_t, total_num_kv_heads), 1, INT32_MAX},
    {M_HEAD_DIM, offsetof(pdl_agent_meta_t, head_dim), 1, INT32_MAX},
    {M_ELEM, offsetof(pdl_agent_meta_t, kv_elem_size), 1, INT32_MAX},
    {M_BLOCK_SIZE, offsetof(pdl_agent_meta_t, block_size), 1, INT32_MAX},
};
#define FIELD(m, off) ((int64_t *)((char *)(m) + (off)))
#define CFIELD(m, off) ((const int64_t *)((const char *)(m) + (off)))

static pdl_status_t meta_fields(const msgpack_object *map, pdl_agent_meta_t *out, pdl_error_t *err)
{
    if (map->type != MSGPACK_OBJECT_MAP)
        return pdl_error_set(err, PDL_ERR_PARSE, META_CTX ": payload is %s, expected a map", pdl__mp_kind(map));
    const msgpack_object *v[M_COUNT] = {0};
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        for (int k = 0; k < M_COUNT; k++) {
            if (!pdl__mp_key_is(&kv->key, meta_keys[k]))
                continue;
            if (v[k] != NULL)
                return pdl_error_set(err, PDL_ERR_PARSE, META_CTX ": duplicate key %s", meta_keys[k]);
            v[k] = &kv->val;
            break;
        }
    }
    for (int k = M_ENGINE_ID; k <= M_ATTN; k++)
        if (v[k] == NULL)
            return pdl_error_set(err, PDL_ERR_PARSE, META_CTX ": %s is missing", meta_keys[k]);

    pdl_status_t st = pdl__mp_str(v[M_ENGINE_ID], META_CTX, "engine_id", out->engine_id, sizeof(out->engine_id), false,
                                  err);
    if (st == PDL_OK)
        st = pdl__mp_bin(v[M_AGENT_METADATA], META_CTX, "agent_metadata", PDL_WIRE_MAX_DESC_BYTES, &out->agent_metadata,
                         err);
    if (st == PDL_OK)
        st = pdl__mp_int(v[M_NUM_BLOCKS], META_CTX, "num_blocks", 0, INT64_MAX, &out->num_blocks, err);
    if (st == PDL_OK)
        st = pdl__mp_int(v[M_BLOCK_LEN], META_CTX, "block_len", 0, INT64_MAX, &out->block_len, err);
    if (st == PDL_OK)
        st = pdl__mp_str(v[M_ATTN], META_CTX, "attn_backend_name", out->attn_backend_name,
                         sizeof(out->attn_backend_name), true, err);
    if (st != PDL_OK)
        return st;

    const msgpack_object *a = v[M_BASE_ADDR];
    if (a->type != MSGPACK_OBJECT_ARRAY)
        return pdl_error_set(err, PDL_ERR_PARSE, META_CTX ": kv_caches_base_addr is %s, expected an array of addresses",
                             pdl__mp_kind(a));
    size_t n = a->via.array.size;
    if (n > PDL_WIRE_MAX_BASE_ADDRS)
        return pdl_error_set(err, PDL_ERR_PARSE, META_CTX ": kv_caches_base_addr has %zu entries, the limit is %d", n,
                             PDL_WIRE_MAX_BASE_ADDRS);
    if (n > 0) {
        out->kv_caches_base_addr = malloc(n * sizeof(uint64_t));
        if (out->kv_caches_base_addr == NULL)
            return pdl_error_set(err, PDL_ERR_NOMEM, META_CTX ": out of memory for %zu addresses", n);
        out->num_base_addr = n;
        for (size_t i = 0; i < n; i++) {
            char key[48];
            snprintf(key, sizeof(key), "kv_caches_base_addr[%zu]", i);
            st = pdl__mp_uint64(&a->via.array.ptr[i], META_CTX, key, &out->kv_caches_base_addr[i], err);
            if (st != PDL_OK)
                return st;
        }
    }

    if (v[M_VERSION] == NULL)
        return PDL_OK; /* an upstream peer: the pdlink keys are not read */
    st = pdl__mp_str(v[M_VERSION], META_CTX, "pdlink_version", out->pdlink_version, sizeof(out->pdlink_version), false,
                     err);
    if (st != PDL_OK)
        return st;
    out->has_pdlink = true;
    for (size_t i = 0; i < sizeof(meta_ints) / sizeof(meta_ints[0]); i++) {
        const meta_int_t *mi = &meta_ints[i];
        if (v[mi->key] == NULL)
            continue;
        st = pdl__mp_int(v[mi->key], META_CTX, meta_keys[mi->key], mi->min, mi->max, FIELD(out, mi->off), err);
        if (st != PDL_OK)
            return st;
    }
    if (v[M_TP_RANK] != NULL) {
        int64_t max = out->tp_size > 0 ? out->tp_size - 1 : PDL_WIRE_MAX_TP - 1;
        st = pdl__mp_int(v[M_TP_RANK], META_CTX, "tp_rank", 0, max, &out->tp_rank, err);
    }
    if (st == PDL_OK && v[M_LAYOUT] != NULL)
        st = pdl__mp_str(v[M_LAYOUT], META_CTX, "layout", out->layout, sizeof(out->layout), true, err);
    if (st == PDL_OK && v[M_IS_MLA] != NULL)
        st = pdl__mp_bool(v[M_IS_MLA], META_CTX, "is_mla", &out->is_mla, err);
    if (st == PDL_OK && v[M_KV_DIGEST] != NULL)
        st = pdl__mp_str(v[M_KV_DIGEST], META_CTX, "kv_digest", out->kv_digest, sizeof(out->kv_digest), true, err);
    return st;
}

pdl_status_t pdl_wire_decode_agent_meta(const void *buf, size_t len, pdl_agent_meta_t *out, pdl_error_t *err)
{
    pdl_agent_meta_init(out);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    pdl_status_t st = pdl__mp_unpack(buf, len, META_MAX_ITEMS, META_CTX, &u, err);
    if (st == PDL_OK)
        st = meta_fields(&u.data, out, err);
    msgpack_unpacked_destroy(&u);
    if (st != PDL_OK) {
        pdl_agent_meta_clear(out);
        pdl_agent_meta_init(out);
    }
    return st;
}

static pdl_status_t meta_check(const pdl_agent_meta_t *m, pdl_error_t *err)
{
    pdl_status_t st = pdl__text_check(m->engine_id, sizeof(m->engine_id), false, META_CTX, "engine_id", err);
    if (st == PDL_OK)
        st = pdl__text_check(m->attn_backend_name, sizeof(m->attn_backend_name), true, META_CTX, "attn_backend_name",
                             err);
    if (st != PDL_OK)
        return st;
    if (m->agent_metadata.len > PDL_WIRE_MAX_DESC_BYTES || (m->agent_metadata.len > 0 && m->agent_metadata.data == NULL))
        return pdl_error_set(err, PDL_ERR_INVALID, META_CTX ": agent_metadata of %zu bytes (limit %d, data %s)",
                             m->agent_metadata.len, PDL_WIRE_MAX_DESC_BYTES, m->agent_metadata.data ? "set" : "NULL");
    if (m->num_base_addr > PDL_WIRE_MAX_BASE_ADDRS || (m->num_base_addr > 0 && m->kv_caches_base_addr == NULL))
        return pdl_error_set(err, PDL_ERR_INVALID, META_CTX ": %zu kv_caches_base_addr entries (limit %d)",
                             m->num_base_addr, PDL_WIRE_MAX_BASE_ADDRS);
    if (m->num_blocks < 0 || m->block_len < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, META_CTX ": num_blocks %" PRId64 " and block_len %" PRId64
                             " must be >= 0", m->num_blocks, m->block_len);
    if (!m->has_pdlink)
        return PDL_OK;
    st = pdl__text_check(m->pdlink_version, sizeof(m->pdlink_version), false, META_CTX, "pdlink_version", err);
    if (st == PDL_OK)
        st = pdl__text_check(m->layout, sizeof(m->layout), true, META_CTX, "layout", err);
    if (st == PDL_OK)
        st = pdl__text_check(m->kv_digest, sizeof(m->kv_digest), true, META_CTX, "kv_digest", err);
    if (st != PDL_OK)
        return st;
    for (size_t i = 0; i < sizeof(meta_ints) / sizeof(meta_ints[0]); i++) {
        int64_t v = *CFIELD(m, meta_ints[i].off);
        if (v != -1 && (v < meta_ints[i].min || v > meta_ints[i].max))
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 META_CTX ": %s must be -1 (absent) or in [%" PRId64 ", %" PRId64 "], got %" PRId64,
                                 meta_keys[meta_ints[i].key], meta_ints[i].min, meta_ints[i].max, v);
    }
    int64_t rmax = m->tp_size > 0 ? m->tp_size : PDL_WIRE_MAX_TP;
    if (m->tp_rank != -1 && (m->tp_rank < 0 || m->tp_rank >= rmax))
        return pdl_error_set(err, PDL_ERR_INVALID, META_CTX ": tp_rank must be -1 (absent) or in [0, %" PRId64
                             "), got %" PRId64, rmax, m->tp_rank);
    return PDL_OK;
}

pdl_status_t pdl_wire_encode_agent_meta(const pdl_agent_meta_t *m, pdl_bytes_t *out, pdl_error_t *err)
{
    if (m == NULL || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, META_CTX " encode: NULL argument");
    out->data = NULL;
    out->len = 0;
    pdl_status_t st = meta_check(m, err);
    if (st != PDL_OK)
        return st;

    size_t n = 6;
    if (m->has_pdlink) {
        n += 2; /* pdlink_version, is_mla */
        n += m->layout[0] != '\0';
        n += m->kv_digest[0] != '\0';
        n += m->tp_rank != -1;
        for (size_t i = 0; i < sizeof(meta_ints) / sizeof(meta_ints[0]); i++)
            n += *CFIELD(m, meta_ints[i].off) != -1;
    }
    pdl__mp_enc_t e;
    pdl__enc_init(&e);
    pdl__enc_map(&e, n);
    pdl__enc_str(&e, "engine_id");
    pdl__enc_str(&e, m->engine_id);
    pdl__enc_str(&e, "agent_metadata");
    pdl__enc_bin(&e, m->agent_metadata.data, m->agent_metadata.len);
    pdl__enc_str(&e, "kv_caches_base_addr");
    pdl__enc_array(&e, m->num_base_addr);
    for (size_t i = 0; i < m->num_base_addr; i++)
        pdl__enc_uint(&e, m->kv_caches_base_addr[i]);
    pdl__enc_str(&e, "num_blocks");
    pdl__enc_int(&e, m->num_blocks);
    pdl__enc_str(&e, "block_len");
    pdl__enc_int(&e, m->block_len);
    pdl__enc_str(&e, "attn_backend_name");
    pdl__enc_str(&e, m->attn_backend_name);
    if (m->has_pdlink) {
        pdl__enc_str(&e, "pdlink_version");
        pdl__enc_str(&e, m->pdlink_version);
        /* Key order: tp_size, tp_rank, dp_rank, then the geometry, layout, is_mla. */
        if (m->tp_size != -1) {
            pdl__enc_str(&e, "tp_size");
            pdl__enc_int(&e, m->tp_size);
        }
        if (m->tp_rank != -1) {
            pdl__enc_str(&e, "tp_rank");
            pdl__enc_int(&e, m->tp_rank);
        }
        for (size_t i = 1; i < sizeof(meta_ints) / sizeof(meta_ints[0]); i++) {
            int64_t v = *CFIELD(m, meta_ints[i].off);
            if (v == -1)
                continue;
            pdl__enc_str(&e, meta_keys[meta_ints[i].key]);
            pdl__enc_int(&e, v);
        }
        if (m->layout[0] != '\0') {
            pdl__enc_str(&e, "layout");
            pdl__enc_str(&e, m->layout);
        }
        pdl__enc_str(&e, "is_mla");
        pdl__enc_bool(&e, m->is_mla);
        if (m->kv_digest[0] != '\0') {
            pdl__enc_str(&e, "kv_digest");
            pdl__enc_str(&e, m->kv_digest);
        }
    }
    return pdl__enc_finish(&e, META_CTX, out, err);
}

/* ---- layer map -------------------------------------------------------------------------------- */

void pdl_layer_map_clear(pdl_layer_map_t *m)
{
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->num_layers; i++) {
        pdl_layer_entry_t *l = &m->layers[i];
        for (size_t d = 0; d < l->num_descs; d++)
            pdl_bytes_free(&l->descs[d]);
        free(l->descs);
        free(l->name);
    }
    free(m->layers);
    m->layers = NULL;
    m->num_layers = 0;
    m->layers_cap = 0;
}

bool pdl_layer_map_equal(const pdl_layer_map_t *a, const pdl_layer_map_t *b)
{
    if (a->num_layers != b->num_layers)
        return false;
    for (size_t i = 0; i < a->num_layers; i++) {
        const pdl_layer_entry_t *x = &a->layers[i], *y = &b->layers[i];
        if (strcmp(x->name, y->name) != 0 || x->num_descs != y->num_descs)
            return false;
        for (size_t d = 0; d < x->num_descs; d++)
            if (x->descs[d].len != y->descs[d].len ||
                (x->descs[d].len > 0 && memcmp(x->descs[d].data, y->descs[d].data, x->descs[d].len) != 0))
                return false;
    }
    return true;
}

const pdl_layer_entry_t *pdl_layer_map_find(const pdl_layer_map_t *m, const char *name)
{
    for (size_t i = 0; i < m->num_layers; i++)
        if (strcmp(m->layers[i].name, name) == 0)
            return &m->layers[i];
    return NULL;
}

/* Append one layer with no descriptors; the name is copied. */
static pdl_status_t add_layer(pdl_layer_map_t *m, const char *name, size_t n, pdl_layer_entry_t **l_p,
                              pdl_error_t *err)
{
    if (m->num_layers >= PDL_WIRE_MAX_LAYERS)
        return pdl_error_set(err, PDL_ERR_INVALID, LMAP_CTX ": more than %d layers", PDL_WIRE_MAX_LAYERS);
    if (m->num_layers == m->layers_cap) {
        size_t ncap = m->layers_cap ? m->layers_cap * 2 : 8;
        pdl_layer_entry_t *nl = realloc(m->layers, ncap * sizeof(*nl));
        if (nl == NULL)
            return pdl_error_set(err, PDL_ERR_NOMEM, LMAP_CTX ": out of memory for %zu layers", ncap);
        m->layers = nl;
        m->layers_cap = ncap;
    }
    char *copy = malloc(n + 1);
    if (copy == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, LMAP_CTX ": out of memory for a layer name");
    memcpy(copy, name, n);
    copy[n] = '\0';
    pdl_layer_entry_t *l = &m->layers[m->num_layers++];
    l->name = copy;
    l->descs = NULL;
    l->num_descs = 0;
    *l_p = l;
    return PDL_OK;
}

static pdl_status_t add_desc(pdl_layer_entry_t *l, const void *desc, size_t len, pdl_error_t *err)
{
    if (l->num_descs >= PDL_WIRE_MAX_LAYER_DESCS)
        return pdl_error_set(err, PDL_ERR_INVALID, LMAP_CTX ": layer %s has more than %d descriptors", l->name,
                             PDL_WIRE_MAX_LAYER_DESCS);
    pdl_bytes_t *nd = realloc(l->descs, (l->num_descs + 1) * sizeof(*nd));
    if (nd == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, LMAP_CTX ": out of memory");
    l->descs = nd;
    uint8_t *copy = malloc(len > 0 ? len : 1);
    if (copy == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, LMAP_CTX ": out of memory for a %zu byte descriptor", len);
    if (len > 0)
        memcpy(copy, desc, len);
    l->descs[l->num_descs++] = (pdl_bytes_t){copy, len};
    return PDL_OK;
}

pdl_status_t pdl_layer_map_add(pdl_layer_map_t *m, const char *name, const void *desc, size_t len, pdl_error_t *err)
{
    if (m == NULL || name == NULL || (desc == NULL && len > 0))
        return pdl_error_set(err, PDL_ERR_INVALID, LMAP_CTX ": NULL argument");
    pdl_status_t st = pdl__text_check(name, PDL_WIRE_ID_MAX + 1, false, LMAP_CTX, "layer name", err);
    if (st != PDL_OK)
        return st;
    if (len > PDL_WIRE_MAX_DESC_BYTES)
        return pdl_error_set(err, PDL_ERR_INVALID, LMAP_CTX ": descriptor of %zu bytes for layer %s exceeds %d", len,
                             name, PDL_WIRE_MAX_DESC_BYTES);
    pdl_layer_entry_t *l = (pdl_layer_entry_t *)pdl_layer_map_find(m, name);
    if (l == NULL) {
        st = add_layer(m, name, strlen(name), &l, err);
        if (st != PDL_OK)
            return st;
        st = add_desc(l, desc, len, err);
        if (st != PDL_OK) { /* leave the map as it was (add_desc may have grown descs before failing) */
            free(l->descs);
            free(l->name);
            m->num_layers--;
        }
        return st;
    }
    return add_desc(l, desc, len, err);
}

/* Names sorted by hash find a duplicate in O(n log n) even when an attacker sends 4096 near-equal names. */
typedef struct name_ref {
    uint64_t hash;
    const char *s;
    size_t n;
} name_ref_t;

static int name_ref_cmp(const void *pa, const void *pb)
{
    const name_ref_t *a = pa, *b = pb;
    if (a->hash != b->hash)
        return a->hash < b->hash ? -1 : 1;
    if (a->n != b->n)
        return a->n < b->n ? -1 : 1;
    return memcmp(a->s, b->s, a->n);
}

static pdl_status_t check_unique_names(const msgpack_object *map, pdl_error_t *err)
{
    size_t n = map->via.map.size;
    if (n < 2)
        return PDL_OK;
    name_ref_t *refs = malloc(n * sizeof(*refs));
    if (refs == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, LMAP_CTX ": out of memory");
    for (size_t i = 0; i < n; i++) {
        const char *s = NULL;
        size_t len = 0;
        (void)pdl__mp_text(&map->via.map.ptr[i].key, &s, &len); /* keys were type-checked already */
        uint64_t h = 1469598103934665603ull; /* FNV-1a */
        for (size_t k = 0; k < len; k++)
            h = (h ^ (uint8_t)s[k]) * 1099511628211ull;
        refs[i] = (name_ref_t){h, s, len};
    }
    qsort(refs, n, sizeof(*refs), name_ref_cmp);
    pdl_status_t st = PDL_OK;
    for (size_t i = 1; i < n && st == PDL_OK; i++)
        if (name_ref_cmp(&refs[i - 1], &refs[i]) == 0) {
            char q[48];
            size_t ql = refs[i].n < 40 ? refs[i].n : 40;
            for (size_t k = 0; k < ql; k++)
                q[k] = (refs[i].s[k] >= 0x20 && refs[i].s[k] < 0x7f) ? refs[i].s[k] : '?';
            q[ql] = '\0';
            st = pdl_error_set(err, PDL_ERR_PARSE, LMAP_CTX ": layer \"%s\" appears twice", q);
        }
    free(refs);
    return st;
}

static pdl_status_t lmap_fields(const msgpack_object *map, pdl_layer_map_t *out, pdl_error_t *err)
{
    if (map->type != MSGPACK_OBJECT_MAP)
        return pdl_error_set(err, PDL_ERR_PARSE, LMAP_CTX ": payload is %s, expected a map", pdl__mp_kind(map));
    size_t n = map->via.map.size;
    if (n > PDL_WIRE_MAX_LAYERS)
        return pdl_error_set(err, PDL_ERR_PARSE, LMAP_CTX ": %zu layers, the limit is %d", n, PDL_WIRE_MAX_LAYERS);
    for (size_t i = 0; i < n; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        const msgpack_object *v = &map->via.map.ptr[i].val;
        char key[48];
        snprintf(key, sizeof(key), "layer name [%zu]", i);
        char name[PDL_WIRE_ID_MAX + 1];
        pdl_status_t st = pdl__mp_str(k, LMAP_CTX, key, name, sizeof(name), false, err);
        if (st != PDL_OK)
            return st;
        if (v->type != MSGPACK_OBJECT_ARRAY)
            return pdl_error_set(err, PDL_ERR_PARSE, LMAP_CTX ": layer %.64s is %s, expected an array of descriptors",
                                 name, pdl__mp_kind(v));
        size_t nd = v->via.array.size;
        if (nd == 0 || nd > PDL_WIRE_MAX_LAYER_DESCS)
            return pdl_error_set(err, PDL_ERR_PARSE, LMAP_CTX ": layer %.64s has %zu descriptors, expected 1..%d", name,
                                 nd, PDL_WIRE_MAX_LAYER_DESCS);
    }
    pdl_status_t st = check_unique_names(map, err);
    if (st != PDL_OK)
        return st;
    if (n > 0) {
        out->layers = calloc(n, sizeof(*out->layers));
        if (out->layers == NULL)
            return pdl_error_set(err, PDL_ERR_NOMEM, LMAP_CTX ": out of memory for %zu layers", n);
        out->layers_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        const char *s;
        size_t sl;
        (void)pdl__mp_text(&map->via.map.ptr[i].key, &s, &sl);
        const msgpack_object *v = &map->via.map.ptr[i].val;
        pdl_layer_entry_t *l = &out->layers[i];
        out->num_layers = i + 1; /* so that a failure below frees what was built */
        l->name = malloc(sl + 1);
        l->descs = calloc(v->via.array.size, sizeof(*l->descs));
        if (l->name == NULL || l->descs == NULL)
            return pdl_error_set(err, PDL_ERR_NOMEM, LMAP_CTX ": out of memory");
        memcpy(l->name, s, sl);
        l->name[sl] = '\0';
        for (size_t d = 0; d < v->via.array.size; d++) {
            char key[PDL_WIRE_ID_MAX + 32];
            snprintf(key, sizeof(key), "layer %.64s descriptor[%zu]", l->name, d);
            st = pdl__mp_bin(&v->via.array.ptr[d], LMAP_CTX, key, PDL_WIRE_MAX_DESC_BYTES, &l->descs[d], err);
            if (st != PDL_OK)
                return st;
            l->num_descs = d + 1;
        }
    }
    return PDL_OK;
}

pdl_status_t pdl_wire_decode_layer_map(const void *buf, size_t len, pdl_layer_map_t *out, pdl_error_t *err)
{
    memset(out, 0, sizeof(*out));
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    pdl_status_t st = pdl__mp_unpack(buf, len, LMAP_MAX_ITEMS, LMAP_CTX, &u, err);
    if (st == PDL_OK)
        st = lmap_fields(&u.data, out, err);
    msgpack_unpacked_destroy(&u);
    if (st != PDL_OK)
        pdl_layer_map_clear(out);
    return st;
}

pdl_status_t pdl_wire_encode_layer_map(const pdl_layer_map_t *m, pdl_bytes_t *out, pdl_error_t *err)
{
    if (m == NULL || out == NULL || (m->num_layers > 0 && m->layers == NULL))
        return pdl_error_set(err, PDL_ERR_INVALID, LMAP_CTX " encode: NULL argument");
    out->data = NULL;
    out->len = 0;
    if (m->num_layers > PDL_WIRE_MAX_LAYERS)
        return pdl_error_set(err, PDL_ERR_INVALID, LMAP_CTX ": %zu layers exceed the limit of %d", m->num_layers,
                             PDL_WIRE_MAX_LAYERS);
    for (size_t i = 0; i < m->num_layers; i++) {
        const pdl_layer_entry_t *l = &m->layers[i];
        if (l->name == NULL)
            return pdl_error_set(err, PDL_ERR_INVALID, LMAP_CTX ": layer %zu has no name", i);
        pdl_status_t st = pdl__text_check(l->name, PDL_WIRE_ID_MAX + 1, false, LMAP_CTX, "layer name", err);
        if (st != PDL_OK)
            return st;
        if (l->num_descs == 0 || l->num_descs > PDL_WIRE_MAX_LAYER_DESCS || l->descs == NULL)
            return pdl_error_set(err, PDL_ERR_INVALID, LMAP_CTX ": layer %s has %zu descriptors, expected 1..%d",
                                 l->name, l->num_descs, PDL_WIRE_MAX_LAYER_DESCS);
        for (size_t d = 0; d < l->num_descs; d++)
            if (l->descs[d].len > PDL_WIRE_MAX_DESC_BYTES || (l->descs[d].len > 0 && l->descs[d].data == NULL))
                return pdl_error_set(err, PDL_ERR_INVALID, LMAP_CTX ": layer %s descriptor %zu is invalid (%zu bytes)",
                                     l->name, d, l->descs[d].len);
    }
    pdl__mp_enc_t e;
    pdl__enc_init(&e);
    pdl__enc_map(&e, m->num_layers);
    for (size_t i = 0; i < m->num_layers; i++) {
        const pdl_layer_entry_t *l = &m->layers[i];
        pdl__enc_str(&e, l->name);
        pdl__enc_array(&e, l->num_descs);
        for (size_t d = 0; d < l->num_descs; d++)
            pdl__enc_bin(&e, l->descs[d].data, l->descs[d].len);
    }
    return pdl__enc_finish(&e, LMAP_CTX, out, err);
}
