/*
 * rank.c -- one TP rank's memory: its transfer engine, its KV region and geometry, and the handshake
 * payloads that advertise them (docs/protocol.md#handshake). Fixed once pdl__rank_init returned; read by every thread.
 *
 * Memory: each rank allocates ONE engine region holding all its layers (layer l at l * layer_len,
 * layer_len = pdl_layout_region_len of the rank's geometry) and pre-faults it, so the first transfer
 * does not pay for page faults -- or registers the caller's region of the same layout
 * (pdl_instance_config_t.kv_regions, host or device memory: kv_mem_type), which it neither clears nor
 * frees and, for device memory, never touches with the CPU (zeroing goes through pdl_mem_zero). The
 * handshake advertises that single registration for every layer;
 * a peer finds layer l at l * layer_len computed from the geometry the handshake carries.
 * With kv_layer_regions (one caller allocation per layer, as vLLM makes them on a GPU) each layer is its
 * own registration and the layer map carries each layer's descriptor: a peer opens a session per layer
 * and finds the layer at offset 0 of it; grants are then per layer too (pdl__grant_name), because an
 * engine grant covers one registration.
 *
 * pdl__rank_init (no I/O) also initialises the parts other files own (counters, outbound queue), so
 * instance destroy can tear every rank down the same way; pdl__rank_open then makes the
 * engine and the memory. instance.c binds the rank's ROUTERs (service.c) between the two.
 *
 * Ports: the rank's handshake and notify ROUTERs are bound FIRST (by instance.c, between
 * pdl__rank_init and pdl__rank_open), then the engine picks its data port
 * (tcp: an ephemeral one), and a data port inside the instance's configured handshake or notify range
 * (all DP ranks: base .. base + dp_size * tp_size) is refused and picked again. Before, the engine bound
 * first, and on a host whose configured ranges lie in the ephemeral range (the seed's second prefill
 * uses notify port 40006) its port could take one of them: "Address already in use" at start.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connector/internal.h"
#include "pdlink/version.h"

static pdl_status_t build_payloads(pdl_instance_t *inst, pdl_rank_t *r, pdl_error_t *err)
{
    pdl_agent_meta_t m;
    memset(&m, 0, sizeof(m));
    snprintf(m.engine_id, sizeof(m.engine_id), "%s", inst->engine_id);
    pdl_status_t st = pdl_engine_pack(r->mem.engine, &m.agent_metadata, err);
    if (st != PDL_OK)
        return st;
    int L = inst->cfg.model.num_layers;
    m.kv_caches_base_addr = calloc((size_t)L, sizeof(uint64_t));
    if (m.kv_caches_base_addr == NULL) {
        pdl_agent_meta_clear(&m);
        return pdl_error_set(err, PDL_ERR_NOMEM, "handshake payload: out of memory");
    }
    for (int l = 0; l < L; l++)
        m.kv_caches_base_addr[l] =
            (uint64_t)(uintptr_t)((uint8_t *)pdl_mem_ptr(pdl__layer_mem(&r->mem, l)) + pdl__layer_off(&r->mem, l));
    m.num_base_addr = (size_t)L;
    m.num_blocks = (int64_t)r->mem.geo.num_blocks;
    m.block_len = (int64_t)pdl_layout_block_len(&r->mem.geo);
    snprintf(m.attn_backend_name, sizeof(m.attn_backend_name), "%s", inst->attn_backend);
    m.has_pdlink = true;
    snprintf(m.pdlink_version, sizeof(m.pdlink_version), "%s", PDL_VERSION_STRING);
    m.tp_size = inst->tp;
    m.tp_rank = r->rank;
    m.dp_rank = inst->cfg.dp_rank;
    m.num_layers = L;
    m.total_num_kv_heads = inst->cfg.model.total_kv_heads;
    m.head_dim = inst->cfg.model.head_dim;
    m.kv_elem_size = inst->cfg.model.elem_size;
    m.block_size = inst->cfg.model.block_size;
    /* The peer compares it verbatim (handshake.c), so every fact that decides where a head lies is checked. */
    pdl_layout_name(&r->mem.geo, m.layout, sizeof(m.layout));
    m.is_mla = inst->cfg.model.is_mla;
    st = pdl_wire_encode_agent_meta(&m, &r->mem.meta_payload, err);
    pdl_agent_meta_clear(&m);
    if (st != PDL_OK)
        return st;

    pdl_bytes_t mem = {0};
    pdl_layer_map_t lm;
    memset(&lm, 0, sizeof(lm));
    for (int l = 0; l < L && st == PDL_OK; l++) {
        if (l == 0 || r->mem.layer_kv != NULL) {
            pdl_bytes_free(&mem);
            st = pdl_mem_pack(pdl__layer_mem(&r->mem, l), &mem, err);
            if (st != PDL_OK) {
                pdl_error_prefix(err, st, "instance rank %d layer %d: memory descriptor", r->rank, l);
                break;
            }
        }
        char name[64];
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.attn", l);
        st = pdl_layer_map_add(&lm, name, mem.data, mem.len, err);
    }
    if (st == PDL_OK)
        st = pdl_wire_encode_layer_map(&lm, &r->mem.layermap_payload, err);
    pdl_layer_map_clear(&lm);
    pdl_bytes_free(&mem);
    return st;
}

static bool in_range(int port, int base, int n) { return port >= base && port < base + n; }

/* An engine whose data port lies outside the configured handshake/notify ranges. Rejected engines are
 * kept until the end so the system cannot hand out the same port again. */
static pdl_status_t engine_outside_ranges(const pdl_instance_config_t *cfg, const pdl_engine_config_t *ec,
                                          pdl_engine_t **out, pdl_error_t *err)
{
    enum { ATTEMPTS = 16 };
    pdl_engine_t *rejected[ATTEMPTS];
    int nrej = 0;
    int n = cfg->dp_size * cfg->tp_size;
    pdl_status_t st = PDL_OK;
    for (;;) {
        pdl_engine_t *e = NULL;
        st = pdl_engine_create(ec, &e, err);
        if (st != PDL_OK)
            break;
        int port = pdl_engine_port(e);
        if (port == 0 || (!in_range(port, cfg->conn.handshake_port, n) && !in_range(port, cfg->conn.notify_port, n))) {
            *out = e;
            break;
        }
        pdl_debug("engine %s: data port %d lies in the configured handshake/notify ranges; picking another", ec->key,
                  port);
        if (nrej == ATTEMPTS) {
            pdl_engine_destroy(e);
            st = pdl_error_set(err, PDL_ERR_TRANSPORT,
                               "engine %s: %d data ports in a row fell inside handshake_port %d / notify_port %d + %d",
                               ec->key, ATTEMPTS + 1, cfg->conn.handshake_port, cfg->conn.notify_port, n);
            break;
        }
        rejected[nrej++] = e;
    }
    for (int i = 0; i < nrej; i++)
        pdl_engine_destroy(rejected[i]);
    return st;
}

/* Rank `rank`'s geometry (its heads from pdl_topo_heads) and the bytes of its region (every layer). */
static pdl_status_t rank_geometry(const pdl_instance_config_t *cfg, int rank, pdl_kv_geometry_t *geo,
                                  uint64_t *total_out, pdl_error_t *err)
{
    int first, count;
    pdl_status_t st = pdl_topo_heads(cfg->tp_size, cfg->model.total_kv_heads, cfg->model.is_mla, rank, &first,
                                     &count, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "instance rank %d", rank);
    memset(geo, 0, sizeof(*geo));
    geo->num_blocks = cfg->num_blocks;
    geo->block_size = (uint32_t)cfg->model.block_size;
    geo->num_heads = (uint32_t)count;
    geo->head_dim = (uint32_t)cfg->model.head_dim;
    geo->elem_size = (uint32_t)cfg->model.elem_size;
    geo->kv_separate = cfg->model.kv_separate;
    geo->kv_fused = cfg->model.kv_fused;
    geo->order = cfg->model.order;
    geo->is_mla = cfg->model.is_mla;
    st = pdl_layout_validate(geo, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "instance rank %d geometry", rank);
    if (cfg->model.num_layers < 1)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: num_layers %d must be > 0", cfg->model.num_layers);
    uint64_t layer_len = pdl_layout_region_len(geo);
    uint64_t total = layer_len * (uint64_t)cfg->model.num_layers;
    if (total / (uint64_t)cfg->model.num_layers != layer_len || total > (1ull << 46))
        return pdl_error_set(err, PDL_ERR_INVALID, "instance rank %d: KV region of %d layers x %llu bytes is too large",
                             rank, cfg->model.num_layers, (unsigned long long)layer_len);
    *total_out = total;
    return PDL_OK;
}

pdl_status_t pdl_instance_kv_region_len(const pdl_instance_config_t *cfg, int tp_rank, uint64_t *len_out,
                                        pdl_error_t *err)
{
    if (cfg == NULL || len_out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: no config or no output");
    if (cfg->tp_size < 1 || cfg->tp_size > PDL_TOPO_MAX_TP || tp_rank < 0 || tp_rank >= cfg->tp_size)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: tp rank %d not in [0, tp_size %d)", tp_rank,
                             cfg->tp_size);
    if (cfg->num_blocks == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: num_blocks must be > 0");
    pdl_kv_geometry_t geo;
    uint64_t total = 0; /* rank_geometry sets it only on success */
    pdl_status_t st = rank_geometry(cfg, tp_rank, &geo, &total, err);
    if (st != PDL_OK)
        return st;
    *len_out = total;
    return PDL_OK;
}

void pdl__rank_init_locks(pdl_rank_t *r)
{
    pdl__ctr_init(&r->ctr);
    pdl__outq_init(&r->out);
}

pdl_status_t pdl__rank_init(pdl_instance_t *inst, pdl_rank_t *r, int rank, pdl_error_t *err)
{
    const pdl_instance_config_t *cfg = &inst->cfg;
    r->inst = inst;
    r->rank = rank;
    int port_offset = pdl_topo_port_offset(cfg->dp_rank, cfg->tp_size, rank);
    r->hs_port = cfg->conn.handshake_port + port_offset;
    r->notify_port = cfg->conn.notify_port + port_offset;
    pdl__rank_init_locks(r);
    pdl_rank_mem_t *m = &r->mem;

    uint64_t total;
    pdl_status_t st = rank_geometry(cfg, rank, &m->geo, &total, err);
    if (st != PDL_OK)
        return st;
    m->layer_len = pdl_layout_region_len(&m->geo);
    return PDL_OK;
}

const char *pdl__mem_type_name(pdl_mem_type_t t)
{
    return t == PDL_MEM_TYPE_CUDA ? "CUDA" : t == PDL_MEM_TYPE_ROCM ? "ROCm" : "host";
}

static const char *type_suffix(pdl_mem_type_t type)
{
    return type == PDL_MEM_TYPE_CUDA ? ", CUDA" : type == PDL_MEM_TYPE_ROCM ? ", ROCm" : "";
}

/* Whether the rank's engine registers the KV's memory type depends on this host (tcp: the CUDA driver
 * loads; ucx: UCX's build), so it is asked once the engine exists, before any region is registered,
 * and the refusal names the config keys and the remedy rather than the engine's registration call. */
static pdl_status_t check_mem_type(const pdl_instance_config_t *cfg, const pdl_rank_mem_t *m, int rank,
                                   pdl_error_t *err)
{
    pdl_mem_type_t t = cfg->kv_mem_type;
    if (pdl_engine_mem_types(m->engine) & (1u << t))
        return PDL_OK;
    pdl_backend_kind_t b = cfg->conn.backend;
    const char *why = b == PDL_BACKEND_TCP && t == PDL_MEM_TYPE_CUDA
                          ? "tcp stages CUDA memory through the CUDA driver, which did not load (libcuda.so.1 or "
                            "$PDLINK_LIBCUDA; PDLINK_LOG_LEVEL=debug says why); install the NVIDIA driver, or keep the "
                            "KV cache in host memory"
                      : b == PDL_BACKEND_UCX ? "UCX reports no support for it; use a UCX built with it, or backend "
                                               "\"tcp\" for CUDA (staged through host memory)"
                                             : "the engine registers other memory only";
    const char *rdma = cfg->conn.backend_mapped_from_rdma && b == PDL_BACKEND_TCP ? " (what \"rdma\" resolved to)" : "";
    return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                         "instance rank %d: kv_mem_type %s with kv_connector_extra_config.backend %s%s: %s", rank,
                         pdl__mem_type_name(t), pdl_backend_name(b), rdma,
                         why);
}

/* kv_layer_regions: register each of rank r's layers on its own (the caller's allocations, any memory
 * type), never touched by the CPU. On failure the layers registered so far stay in layer_kv for
 * pdl__rank_fini. */
static pdl_status_t register_layers(const pdl_instance_config_t *cfg, pdl_rank_t *r, pdl_error_t *err)
{
    pdl_rank_mem_t *m = &r->mem;
    int L = cfg->model.num_layers;
    void *const *ptrs = cfg->kv_layer_regions[r->rank];
    const size_t *lens = cfg->kv_layer_region_lens ? cfg->kv_layer_region_lens[r->rank] : NULL;
    if (ptrs == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance rank %d: kv_layer_regions[%d] is NULL (one region per layer "
                             "needed)", r->rank, r->rank);
    m->layer_kv = calloc((size_t)L, sizeof(*m->layer_kv));
    if (m->layer_kv == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "instance rank %d: out of memory for %d layer registrations", r->rank, L);
    for (int l = 0; l < L; l++) {
        size_t len = lens ? lens[l] : 0;
        if (ptrs[l] == NULL || len < m->layer_len)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "instance rank %d layer %d: caller KV region %p of %zu bytes, but a layer needs %llu "
                                 "(pdl_instance_kv_region_len / num_layers)",
                                 r->rank, l, ptrs[l], len, (unsigned long long)m->layer_len);
        pdl_status_t st =
            pdl_engine_register_mem_type(m->engine, ptrs[l], (size_t)m->layer_len, cfg->kv_mem_type, &m->layer_kv[l], err);
        if (st != PDL_OK)
            return pdl_error_prefix(err, st, "instance rank %d layer %d: caller KV region %p (%llu bytes%s)", r->rank, l,
                                    ptrs[l], (unsigned long long)m->layer_len, type_suffix(cfg->kv_mem_type));
    }
    return PDL_OK;
}

pdl_status_t pdl__rank_open(pdl_instance_t *inst, pdl_rank_t *r, pdl_error_t *err)
{
    const pdl_instance_config_t *cfg = &inst->cfg;
    pdl_rank_mem_t *m = &r->mem;
    int rank = r->rank;
    uint64_t total = m->layer_len * (uint64_t)cfg->model.num_layers; /* checked by rank_geometry */
    pdl_status_t st;

    snprintf(m->engine_key, sizeof(m->engine_key), "%s:%s:%d:tp%d:dp%d",
             cfg->conn.role == PDL_ROLE_PRODUCER ? "producer" : "consumer", cfg->conn.host_ip, cfg->conn.handshake_port,
             rank, cfg->dp_rank);
    pdl_engine_config_t ec = {.key = m->engine_key,
                              .host = cfg->conn.host_ip,
                              .port = 0,
                              .backend = cfg->conn.backend,
                              .qp_per_transfer = cfg->conn.qp_per_transfer,
                              .num_workers = cfg->conn.num_workers,
                              .bind_all = cfg->conn.bind_all,
                              .trusted_hosts = cfg->conn.trusted_hosts,
                              .auth = inst->auth};
    st = engine_outside_ranges(cfg, &ec, &m->engine, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "instance rank %d", rank);
    if (cfg->kv_regions != NULL || cfg->kv_layer_regions != NULL) {
        st = check_mem_type(cfg, m, rank, err);
        if (st != PDL_OK)
            return st;
    }
    if (cfg->kv_layer_regions != NULL) {
        st = register_layers(cfg, r, err);
        if (st != PDL_OK)
            return st;
    } else if (cfg->kv_regions != NULL) {
        /* The caller's memory (a numpy array, a torch tensor on the CPU or a GPU): registered as is, with
         * its memory type, never cleared, never touched by the CPU when it is device memory. */
        void *ptr = cfg->kv_regions[rank];
        size_t len = cfg->kv_region_lens ? cfg->kv_region_lens[rank] : 0;
        if (ptr == NULL || len < total)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "instance rank %d: caller KV region %p of %zu bytes, but the geometry needs %llu "
                                 "(pdl_instance_kv_region_len)",
                                 rank, ptr, len, (unsigned long long)total);
        pdl_mem_type_t type = cfg->kv_mem_type;
        st = pdl_engine_register_mem_type(m->engine, ptr, (size_t)total, type, &m->kv, err);
        if (st != PDL_OK)
            return pdl_error_prefix(err, st, "instance rank %d caller KV memory (%llu bytes%s)", rank,
                                    (unsigned long long)total,
                                    type == PDL_MEM_TYPE_CUDA   ? ", CUDA"
                                    : type == PDL_MEM_TYPE_ROCM ? ", ROCm"
                                                                : "");
        m->kv_ptr = pdl_mem_ptr(m->kv);
    } else {
        st = pdl_engine_alloc_mem(m->engine, (size_t)total, &m->kv, err);
        if (st != PDL_OK)
            return pdl_error_prefix(err, st, "instance rank %d KV memory (%llu bytes)", rank, (unsigned long long)total);
        m->kv_ptr = pdl_mem_ptr(m->kv);
        memset(m->kv_ptr, 0, (size_t)total); /* pre-fault every page now, not during the first transfer */
    }
    /* Least privilege (docs/security.md): the engine serves this region only inside grants -- the
     * blocks a READ producer holds for a transfer, the blocks a WRITE consumer expects a push into,
     * each to requests naming that transfer. */
    for (int l = 0; l < (m->layer_kv ? cfg->model.num_layers : 1); l++)
        pdl_mem_guard(pdl__layer_mem(m, l));

    return build_payloads(inst, r, err);
}

void pdl__rank_fini(pdl_rank_t *r)
{
    pdl_rank_mem_t *m = &r->mem;
    pdl_bytes_free(&m->meta_payload);
    pdl_bytes_free(&m->layermap_payload);
    if (m->kv)
        pdl_engine_deregister_mem(m->engine, m->kv);
    if (m->layer_kv) {
        for (int l = 0; l < r->inst->cfg.model.num_layers; l++)
            if (m->layer_kv[l])
                pdl_engine_deregister_mem(m->engine, m->layer_kv[l]);
        free(m->layer_kv);
        m->layer_kv = NULL;
    }
    if (m->engine)
        pdl_engine_destroy(m->engine);
    pdl__outq_fini(&r->out);
    pdl__ctr_fini(&r->ctr);
}

/* Revoke the grants of `name` on rank i's layers [0, nl) (every layer: num_layers). */
static void revoke_layers(pdl_instance_t *inst, const char *name, int i, int nl)
{
    pdl_rank_mem_t *m = &inst->ranks[i].mem;
    char g[PDL_GRANT_NAME_MAX + 1];
    for (int l = 0; l < (m->layer_kv ? nl : 1); l++) {
        pdl__grant_name(g, sizeof(g), name, m->layer_kv != NULL, l);
        pdl_engine_revoke(m->engine, g, NULL); /* NOT_FOUND: nothing to forget */
    }
}

void pdl__rank_revoke(pdl_instance_t *inst, const char *name, int rank)
{
    for (int i = rank < 0 ? inst->lo : rank; i < (rank < 0 ? inst->hi : rank + 1); i++)
        revoke_layers(inst, name, i, inst->cfg.model.num_layers);
}

size_t pdl__rank_block_ranges(const pdl_rank_mem_t *m, int l0, int l1, const uint32_t *ids, size_t n,
                              pdl_range_t *out)
{
    int halves = pdl_layout_num_halves(&m->geo);
    uint64_t blen = pdl_layout_block_len(&m->geo);
    size_t k = 0;
    for (int l = l0; l < l1; l++)
        for (size_t b = 0; b < n; b++) {
            if (ids[b] >= m->geo.num_blocks)
                continue;
            for (int h = 0; h < halves; h++)
                out[k++] = (pdl_range_t){pdl__layer_off(m, l) + pdl_layout_half_offset(&m->geo, ids[b], h), blen};
        }
    return k;
}

pdl_status_t pdl__rank_zero(const pdl_rank_mem_t *m, int layers, const pdl_range_t *rg, size_t k, pdl_error_t *err)
{
    size_t per = m->layer_kv ? k / (size_t)layers : k;
    pdl_status_t first = PDL_OK;
    for (int l = 0; l < (m->layer_kv ? layers : 1); l++) {
        pdl_error_t e;
        pdl_status_t st = pdl_mem_zero(pdl__layer_mem(m, l), rg + (size_t)l * per, per, &e);
        if (st != PDL_OK && first == PDL_OK) /* the other layers are still zeroed */
            first = m->layer_kv ? pdl_error_set(err, st, "layer %d: %s", l, e.msg) : pdl_error_set(err, st, "%s", e.msg);
    }
    return first;
}

pdl_status_t pdl_instance_zero_tail(pdl_instance_t *inst, const uint32_t *ids, size_t n, uint64_t num_tokens,
                                    pdl_error_t *err)
{
    if (inst == NULL || (ids == NULL && n > 0))
        return pdl_error_set(err, PDL_ERR_INVALID, "zero_tail: instance and ids must not be NULL");
    int L = inst->cfg.model.num_layers;
    PDL_FOR_LOCAL(inst, i) {
        pdl_rank_mem_t *m = &inst->ranks[i].mem;
        const pdl_kv_geometry_t *g = &m->geo;
        uint64_t bs = g->block_size;
        if (n == 0 || num_tokens <= (uint64_t)(n - 1) * bs || num_tokens > (uint64_t)n * bs)
            return pdl_error_set(err, PDL_ERR_INVALID, "zero_tail: %" PRIu64 " tokens do not fill %zu blocks of %" PRIu64,
                                 num_tokens, n, bs);
        uint32_t last = ids[n - 1];
        if (last >= g->num_blocks)
            return pdl_error_set(err, PDL_ERR_INVALID, "zero_tail: block %" PRIu32 " of %" PRIu64, last, g->num_blocks);
        uint64_t used = num_tokens - (uint64_t)(n - 1) * bs;
        if (used == bs)
            return PDL_OK; /* the same for every rank: the block is full */
        /* Rows past `used`: NHD keeps a token's heads together (one range per half), HND a head's
         * tokens (one range per head and half). */
        uint64_t row = pdl_layout_row_len(g), heads = g->num_heads;
        int halves = pdl_layout_num_halves(g);
        size_t per_half = g->order == PDL_KV_HND ? (size_t)heads : 1;
        size_t nr = (size_t)L * (size_t)halves * per_half;
        pdl_range_t *rg = malloc(nr * sizeof(*rg));
        if (rg == NULL)
            return pdl_error_set(err, PDL_ERR_NOMEM, "zero_tail: out of memory for %zu ranges", nr);
        size_t k = 0;
        for (int l = 0; l < L; l++)
            for (int h = 0; h < halves; h++) {
                uint64_t base = pdl__layer_off(m, l) + pdl_layout_half_offset(g, last, h);
                if (g->order == PDL_KV_HND) {
                    for (uint64_t hd = 0; hd < heads; hd++)
                        rg[k++] = (pdl_range_t){base + hd * bs * row + used * row, (bs - used) * row};
                } else {
                    rg[k++] = (pdl_range_t){base + used * heads * row, (bs - used) * heads * row};
                }
            }
        pdl_status_t st = pdl__rank_zero(m, L, rg, k, err);
        free(rg);
        if (st != PDL_OK)
            return pdl_error_prefix(err, st, "zero_tail: rank %d", i);
    }
    return PDL_OK;
}

pdl_status_t pdl__rank_grant(pdl_instance_t *inst, const char *name, unsigned ops, const uint32_t *ids, size_t n,
                             pdl_error_t *err)
{
    return pdl__rank_grant_to(inst, name, ops, ids, n, NULL, err);
}

pdl_status_t pdl__rank_grant_to(pdl_instance_t *inst, const char *name, unsigned ops, const uint32_t *ids, size_t n,
                                const char *host, pdl_error_t *err)
{
    int L = inst->cfg.model.num_layers;
    PDL_FOR_LOCAL(inst, i) {
        pdl_rank_mem_t *m = &inst->ranks[i].mem;
        int halves = pdl_layout_num_halves(&m->geo);
        /* A grant covers one registration: one for every layer, or one per layer (pdl__grant_name). */
        int nreg = m->layer_kv ? L : 1, per_reg = m->layer_kv ? 1 : L;
        size_t nr = (size_t)per_reg * n * (size_t)halves;
        pdl_range_t *rg = malloc(nr * sizeof(*rg));
        pdl_status_t st = PDL_OK;
        int done = 0;
        if (rg == NULL)
            st = pdl_error_set(err, PDL_ERR_NOMEM, "%s: out of memory for %zu grant ranges", name, nr);
        for (int reg = 0; reg < nreg && st == PDL_OK; reg++) {
            size_t k = pdl__rank_block_ranges(m, reg, reg + per_reg, ids, n, rg);
            char g[PDL_GRANT_NAME_MAX + 1];
            pdl__grant_name(g, sizeof(g), name, m->layer_kv != NULL, reg);
            st = pdl_engine_grant_to(m->engine, pdl__layer_mem(m, reg), g, ops, rg, k, host, err);
            if (st != PDL_OK && m->layer_kv)
                pdl_error_prefix(err, st, "%s: rank %d layer %d", name, i, reg);
            else if (st != PDL_OK)
                pdl_error_prefix(err, st, "%s: rank %d", name, i);
            else
                done++;
        }
        free(rg);
        if (st != PDL_OK) {
            revoke_layers(inst, name, i, done);
            for (int q = inst->lo; q < i; q++)
                pdl__rank_revoke(inst, name, q);
            return st;
        }
    }
    return PDL_OK;
}
