/*
 * instance.c -- one serving instance: TP ranks, their engines and KV memory, the block allocator,
 * held transfers and the aggregation of per-rank fan-in reports (SPEC §5).
 *
 * Memory: each rank allocates ONE engine region holding all its layers (layer l at l * layer_len,
 * layer_len = pdl_layout_region_len of the rank's geometry) and pre-faults it, so the first transfer
 * does not pay for page faults. The handshake advertises that single registration for every layer;
 * a peer finds layer l at l * layer_len computed from the geometry the handshake carries.
 *
 * Aggregation: vLLM frees a producer request only when every TP worker reported it finished
 * (KVOutputAggregator, reference §4.5). pdl_instance_hold registers the transfer on every rank's
 * fan-in; each rank calls pdl__instance_rank_resolved once (reported or expired); the last one frees
 * the blocks. A rank that resolves twice (cannot happen by construction) is ignored.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "common/clock.h"
#include "connector/internal.h"

int pdl__endpoint(char *buf, size_t cap, const char *host, int port)
{
    int n = strchr(host, ':') ? snprintf(buf, cap, "tcp://[%s]:%d", host, port)
                              : snprintf(buf, cap, "tcp://%s:%d", host, port);
    return (n < 0 || (size_t)n >= cap) ? -1 : n;
}

void pdl__rank_count_drop(pdl_rank_t *r, pdl_drop_kind_t kind, const char *fmt, ...)
{
    pthread_mutex_lock(&r->ctr_mu);
    r->ctr.dropped_malformed++;
    pthread_mutex_unlock(&r->ctr_mu);
    uint64_t suppressed = 0;
    if (!pdl_ratelimit_allow(&r->drop_rl[kind], &suppressed))
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (suppressed)
        pdl_warn("rank %d: dropped %s (and %llu similar frames since the last report)", r->rank, msg,
                 (unsigned long long)suppressed);
    else
        pdl_warn("rank %d: dropped %s", r->rank, msg);
}

void pdl__instance_emit(pdl_instance_t *inst, pdl_instance_event_t ev, const char *transfer_id, int rank)
{
    pthread_mutex_lock(&inst->cb_mu);
    pdl_instance_event_fn fn = inst->event_fn;
    void *arg = inst->event_arg;
    pthread_mutex_unlock(&inst->cb_mu);
    if (fn)
        fn(arg, ev, transfer_id, rank);
}

void pdl_instance_set_event_fn(pdl_instance_t *inst, pdl_instance_event_fn fn, void *arg)
{
    pthread_mutex_lock(&inst->cb_mu);
    inst->event_fn = fn;
    inst->event_arg = arg;
    pthread_mutex_unlock(&inst->cb_mu);
}

void pdl__instance_rank_resolved(pdl_instance_t *inst, const char *transfer_id, int rank, bool expired)
{
    pdl__instance_emit(inst, expired ? PDL_EVENT_RANK_EXPIRED : PDL_EVENT_RANK_REPORTED, transfer_id, rank);
    pdl_held_t *freed = NULL;
    pthread_mutex_lock(&inst->held_mu);
    pdl_held_t *h = pdl__strmap_get(&inst->held, transfer_id);
    if (h && !((h->rank_done[rank / 64] >> (rank % 64)) & 1u)) {
        h->rank_done[rank / 64] |= 1ull << (rank % 64);
        if (++h->resolved == inst->tp) {
            pdl__strmap_remove(&inst->held, transfer_id);
            inst->held_blocks -= h->n;
            freed = h;
        }
    }
    pthread_mutex_unlock(&inst->held_mu);
    if (freed) {
        pdl__blockalloc_free(inst->blocks, freed->ids, freed->n);
        free(freed->ids);
        free(freed);
        pdl__instance_emit(inst, PDL_EVENT_FREED, transfer_id, -1);
    }
}

/* ---- handshake payloads ----------------------------------------------------------------------- */

/* pdlink's layout string: the order, plus "-blockfirst" when K and V are interleaved per block. The
 * peer compares it verbatim, so both facts that decide where a head lies are checked. */
static void layout_string(const pdl_model_geometry_t *m, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", pdl_layout_order_name(m->order), m->kv_separate ? "" : "-blockfirst");
}

static pdl_status_t rank_build_payloads(pdl_instance_t *inst, pdl_rank_t *r, pdl_error_t *err)
{
    pdl_agent_meta_t m;
    memset(&m, 0, sizeof(m));
    snprintf(m.engine_id, sizeof(m.engine_id), "%s", inst->engine_id);
    pdl_status_t st = pdl_engine_pack(r->engine, &m.agent_metadata, err);
    if (st != PDL_OK)
        return st;
    int L = inst->cfg.model.num_layers;
    m.kv_caches_base_addr = calloc((size_t)L, sizeof(uint64_t));
    if (m.kv_caches_base_addr == NULL) {
        pdl_agent_meta_clear(&m);
        return pdl_error_set(err, PDL_ERR_NOMEM, "handshake payload: out of memory");
    }
    for (int l = 0; l < L; l++)
        m.kv_caches_base_addr[l] = (uint64_t)(uintptr_t)(r->kv_ptr + (uint64_t)l * r->layer_len);
    m.num_base_addr = (size_t)L;
    m.num_blocks = (int64_t)r->geo.num_blocks;
    m.block_len = (int64_t)pdl_layout_block_len(&r->geo);
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
    layout_string(&inst->cfg.model, m.layout, sizeof(m.layout));
    m.is_mla = inst->cfg.model.is_mla;
    st = pdl_wire_encode_agent_meta(&m, &r->meta_payload, err);
    pdl_agent_meta_clear(&m);
    if (st != PDL_OK)
        return st;

    pdl_bytes_t mem;
    st = pdl_mem_pack(r->kv, &mem, err);
    if (st != PDL_OK)
        return st;
    pdl_layer_map_t lm;
    memset(&lm, 0, sizeof(lm));
    for (int l = 0; l < L && st == PDL_OK; l++) {
        char name[64];
        snprintf(name, sizeof(name), "model.layers.%d.self_attn.attn", l);
        st = pdl_layer_map_add(&lm, name, mem.data, mem.len, err);
    }
    if (st == PDL_OK)
        st = pdl_wire_encode_layer_map(&lm, &r->layermap_payload, err);
    pdl_layer_map_clear(&lm);
    pdl_bytes_free(&mem);
    return st;
}

/* ---- create / destroy ------------------------------------------------------------------------- */

static pdl_status_t validate_config(const pdl_instance_config_t *cfg, pdl_error_t *err)
{
    const pdl_model_geometry_t *m = &cfg->model;
    if (cfg->tp_size < 1 || cfg->tp_size > PDL_TOPO_MAX_TP)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: tp_size %d outside [1, %d]", cfg->tp_size, PDL_TOPO_MAX_TP);
    if (cfg->dp_size < 1 || cfg->dp_rank < 0 || cfg->dp_rank >= cfg->dp_size)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: dp_rank %d not in [0, dp_size %d)", cfg->dp_rank,
                             cfg->dp_size);
    if (cfg->num_blocks == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: num_blocks must be > 0");
    if (m->num_layers < 1 || m->head_dim < 1 || m->elem_size < 1 || m->block_size < 1 || m->total_kv_heads < 1)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "instance: model geometry needs positive num_layers (%d), total_kv_heads (%d), head_dim "
                             "(%d), elem_size (%d), block_size (%d)",
                             m->num_layers, m->total_kv_heads, m->head_dim, m->elem_size, m->block_size);
    if (!cfg->conn.read_mode && !cfg->allow_write_mode)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "kv_connector_extra_config.read_mode is false (WRITE mode): this program does not serve "
                             "WRITE mode (it did not set allow_write_mode); set \"read_mode\": true");
    int top_port = cfg->dp_size * cfg->tp_size;
    if (cfg->conn.handshake_port < 1 || cfg->conn.handshake_port + top_port > 65536 || cfg->conn.notify_port < 1 ||
        cfg->conn.notify_port + top_port > 65536)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "instance: handshake_port %d / notify_port %d + %d ranks do not fit below 65536",
                             cfg->conn.handshake_port, cfg->conn.notify_port, top_port);
    return PDL_OK;
}

static pdl_status_t rank_init(pdl_instance_t *inst, pdl_rank_t *r, int rank, pdl_error_t *err)
{
    const pdl_instance_config_t *cfg = &inst->cfg;
    r->inst = inst;
    r->rank = rank;
    r->wake_fd = -1;
    r->port_offset = pdl_topo_port_offset(cfg->dp_rank, cfg->tp_size, rank);
    r->hs_port = cfg->conn.handshake_port + r->port_offset;
    r->notify_port = cfg->conn.notify_port + r->port_offset;
    pthread_mutex_init(&r->out_mu, NULL);
    pthread_mutex_init(&r->fan_mu, NULL);
    pthread_mutex_init(&r->job_mu, NULL);
    pthread_cond_init(&r->job_cv, NULL);
    pthread_mutex_init(&r->ctr_mu, NULL);
    pthread_mutex_init(&r->push_job_mu, NULL);
    pthread_cond_init(&r->push_job_cv, NULL);
    for (int k = 0; k < PDL_DROP_KINDS; k++)
        pdl_ratelimit_init(&r->drop_rl[k], 10000, 1);
    pdl_ratelimit_init(&r->late_rl, 10000, 1);
    pdl_ratelimit_init(&r->expired_rl, 10000, 5);
    pdl_ratelimit_init(&r->ping_rl, 30000, 1);
    pdl_ratelimit_init(&r->send_rl, 10000, 1);

    int first, count;
    pdl_status_t st = pdl_topo_heads(cfg->tp_size, cfg->model.total_kv_heads, cfg->model.is_mla, rank, &first,
                                     &count, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, "instance rank %d", rank);
    r->geo.num_blocks = cfg->num_blocks;
    r->geo.block_size = (uint32_t)cfg->model.block_size;
    r->geo.num_heads = (uint32_t)count;
    r->geo.head_dim = (uint32_t)cfg->model.head_dim;
    r->geo.elem_size = (uint32_t)cfg->model.elem_size;
    r->geo.kv_separate = cfg->model.kv_separate;
    r->geo.order = cfg->model.order;
    r->geo.is_mla = cfg->model.is_mla;
    st = pdl_layout_validate(&r->geo, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, "instance rank %d geometry", rank);
    r->layer_len = pdl_layout_region_len(&r->geo);
    uint64_t total = r->layer_len * (uint64_t)cfg->model.num_layers;
    if (total / (uint64_t)cfg->model.num_layers != r->layer_len || total > (1ull << 46))
        return pdl_error_set(err, PDL_ERR_INVALID, "instance rank %d: KV region of %d layers x %llu bytes is too large",
                             rank, cfg->model.num_layers, (unsigned long long)r->layer_len);

    snprintf(r->engine_key, sizeof(r->engine_key), "%s:%s:%d:tp%d:dp%d",
             cfg->conn.role == PDL_ROLE_PRODUCER ? "producer" : "consumer", cfg->conn.host_ip, cfg->conn.handshake_port,
             rank, cfg->dp_rank);
    pdl_engine_config_t ec = {.key = r->engine_key,
                              .host = cfg->conn.host_ip,
                              .port = 0,
                              .backend = cfg->conn.backend,
                              .qp_per_transfer = cfg->conn.qp_per_transfer,
                              .num_workers = cfg->conn.num_workers};
    st = pdl_engine_create(&ec, &r->engine, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, "instance rank %d", rank);
    st = pdl_engine_alloc_mem(r->engine, (size_t)total, &r->kv, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, "instance rank %d KV memory (%llu bytes)", rank, (unsigned long long)total);
    r->kv_ptr = pdl_mem_ptr(r->kv);
    memset(r->kv_ptr, 0, (size_t)total); /* pre-fault every page now, not during the first transfer */

    pdl_fanin_config_t fc = {.producer_tp = cfg->tp_size,
                             .defer_timeout_ns = (uint64_t)(cfg->conn.defer_timeout_s * 1e9),
                             .max_parked = 1024,
                             .max_park_age_ns = 0,
                             .max_terminal = 4096};
    st = pdl__fanin_create(&fc, &r->fanin, err);
    if (st != PDL_OK)
        return st;
    return rank_build_payloads(inst, r, err);
}

static void rank_fini(pdl_rank_t *r)
{
    pdl__peers_free(r);
    for (int i = 0; i < r->nplans; i++)
        free(r->plans[i]);
    pdl_bytes_free(&r->meta_payload);
    pdl_bytes_free(&r->layermap_payload);
    if (r->kv)
        pdl_engine_deregister_mem(r->engine, r->kv);
    if (r->engine)
        pdl_engine_destroy(r->engine);
    pdl_bytes_free(&r->ping_payload);
    pdl__fanin_destroy(r->fanin);
    pdl_outmsg_t *o = r->out_head;
    while (o) {
        pdl_outmsg_t *n = o->next;
        pdl_bytes_free(&o->payload);
        free(o);
        o = n;
    }
    pthread_mutex_destroy(&r->out_mu);
    pthread_mutex_destroy(&r->fan_mu);
    pthread_mutex_destroy(&r->job_mu);
    pthread_cond_destroy(&r->job_cv);
    pthread_mutex_destroy(&r->ctr_mu);
    pthread_mutex_destroy(&r->push_job_mu);
    pthread_cond_destroy(&r->push_job_cv);
}

static void free_held(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    pdl_held_t *h = value;
    free(h->ids);
    free(h);
}

void pdl_instance_destroy(pdl_instance_t *inst)
{
    if (inst == NULL)
        return;
    atomic_store(&inst->stopping, true);
    /* Workers first (they queue releases), then the services (they flush the queue). */
    for (int i = 0; i < inst->tp; i++)
        if (inst->ranks[i].worker_started)
            pdl__worker_stop(&inst->ranks[i]);
    for (int i = 0; i < inst->tp; i++)
        if (inst->ranks[i].pusher_started)
            pdl__pusher_stop(&inst->ranks[i]);
    for (int i = 0; i < inst->tp; i++)
        if (inst->ranks[i].service_started)
            pdl__service_stop(&inst->ranks[i]);
    if (inst->zctx)
        zmq_ctx_term(inst->zctx);
    for (int i = 0; i < inst->tp; i++)
        rank_fini(&inst->ranks[i]);
    free(inst->ranks);
    pdl__strmap_foreach(&inst->held, free_held, NULL);
    pdl__strmap_free(&inst->held);
    pdl__push_free_all(inst);
    pdl__blockalloc_destroy(inst->blocks);
    pthread_mutex_destroy(&inst->held_mu);
    pthread_mutex_destroy(&inst->cb_mu);
    free(inst);
}

pdl_status_t pdl_instance_create(const pdl_instance_config_t *cfg, pdl_instance_t **inst_out, pdl_error_t *err)
{
    if (cfg == NULL || inst_out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: no config");
    pdl_status_t st = validate_config(cfg, err);
    if (st != PDL_OK)
        return st;
    pdl_instance_t *inst = calloc(1, sizeof(*inst));
    if (inst == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "instance: out of memory");
    inst->cfg = *cfg;
    snprintf(inst->attn_backend, sizeof(inst->attn_backend), "%s",
             cfg->attn_backend_name ? cfg->attn_backend_name : "pdlink");
    inst->cfg.attn_backend_name = inst->attn_backend;
    inst->tp = cfg->tp_size;
    pthread_mutex_init(&inst->held_mu, NULL);
    pthread_mutex_init(&inst->cb_mu, NULL);
    pthread_mutex_init(&inst->push_mu, NULL);
    snprintf(inst->engine_id, sizeof(inst->engine_id), "%s:%d", cfg->conn.host_ip, cfg->conn.handshake_port);
    pdl_zmq_addr_t za;
    memset(&za, 0, sizeof(za));
    snprintf(za.host, sizeof(za.host), "%s", cfg->conn.host_ip);
    za.handshake_port = cfg->conn.handshake_port;
    za.notify_port = cfg->conn.notify_port; /* the base: peers add the rank offset (reference §2.3) */
    if (pdl_wire_format_zmq_address(&za, inst->zmq_address, sizeof(inst->zmq_address)) < 0)
        snprintf(inst->zmq_address, sizeof(inst->zmq_address), "host:%s,handshake:%d,notify:%d", cfg->conn.host_ip,
                 cfg->conn.handshake_port, cfg->conn.notify_port);

    st = pdl__blockalloc_create(cfg->num_blocks, &inst->blocks, err);
    if (st != PDL_OK)
        goto fail;
    inst->ranks = calloc((size_t)inst->tp, sizeof(pdl_rank_t));
    inst->zctx = zmq_ctx_new();
    if (inst->ranks == NULL || inst->zctx == NULL) {
        st = pdl_error_set(err, PDL_ERR_NOMEM, "instance: out of memory (ranks or zmq context)");
        goto fail;
    }
    /* Ranks that were initialised (even partially) are torn down by destroy; later ones are zero. */
    for (int i = 0; i < inst->tp; i++) {
        st = rank_init(inst, &inst->ranks[i], i, err);
        if (st != PDL_OK) {
            for (int j = i + 1; j < inst->tp; j++) {
                pdl_rank_t *z = &inst->ranks[j];
                pthread_mutex_init(&z->out_mu, NULL);
                pthread_mutex_init(&z->fan_mu, NULL);
                pthread_mutex_init(&z->job_mu, NULL);
                pthread_cond_init(&z->job_cv, NULL);
                pthread_mutex_init(&z->ctr_mu, NULL);
                pthread_mutex_init(&z->push_job_mu, NULL);
                pthread_cond_init(&z->push_job_cv, NULL);
            }
            goto fail;
        }
    }
    for (int i = 0; i < inst->tp; i++) {
        st = pdl__service_start(&inst->ranks[i], err);
        if (st != PDL_OK)
            goto fail;
        st = pdl__worker_start(&inst->ranks[i], err);
        if (st != PDL_OK)
            goto fail;
        if (!cfg->conn.read_mode && cfg->conn.role == PDL_ROLE_PRODUCER) {
            st = pdl__pusher_start(&inst->ranks[i], err);
            if (st != PDL_OK)
                goto fail;
        }
    }
    pdl_info("instance %s (%s, TP %d, DP rank %d/%d): handshake ports %d-%d, notify ports %d-%d, backend %s, %u "
             "blocks x %d layers",
             inst->engine_id, cfg->conn.role == PDL_ROLE_PRODUCER ? "producer" : "consumer", inst->tp, cfg->dp_rank,
             cfg->dp_size, inst->ranks[0].hs_port, inst->ranks[inst->tp - 1].hs_port, inst->ranks[0].notify_port,
             inst->ranks[inst->tp - 1].notify_port, pdl_backend_name(cfg->conn.backend), cfg->num_blocks,
             cfg->model.num_layers);
    *inst_out = inst;
    return PDL_OK;
fail:
    if (inst->ranks == NULL) {
        if (inst->zctx)
            zmq_ctx_term(inst->zctx);
        pdl__blockalloc_destroy(inst->blocks);
        pthread_mutex_destroy(&inst->held_mu);
        pthread_mutex_destroy(&inst->cb_mu);
        pthread_mutex_destroy(&inst->push_mu);
        free(inst);
        return st;
    }
    pdl_instance_destroy(inst);
    return st;
}

/* ---- accessors -------------------------------------------------------------------------------- */

const char *pdl_instance_engine_id(const pdl_instance_t *inst) { return inst->engine_id; }
const char *pdl_instance_zmq_address(const pdl_instance_t *inst) { return inst->zmq_address; }
int pdl_instance_tp_size(const pdl_instance_t *inst) { return inst->tp; }

const pdl_kv_geometry_t *pdl_instance_geometry(const pdl_instance_t *inst, int tp_rank)
{
    if (tp_rank < 0 || tp_rank >= inst->tp)
        return NULL;
    return &inst->ranks[tp_rank].geo;
}

uint8_t *pdl_instance_kv_layer(pdl_instance_t *inst, int tp_rank, int layer)
{
    if (tp_rank < 0 || tp_rank >= inst->tp || layer < 0 || layer >= inst->cfg.model.num_layers)
        return NULL;
    pdl_rank_t *r = &inst->ranks[tp_rank];
    return r->kv_ptr + (uint64_t)layer * r->layer_len;
}

int pdl_instance_handshake_port(const pdl_instance_t *inst, int tp_rank)
{
    return (tp_rank < 0 || tp_rank >= inst->tp) ? -1 : inst->ranks[tp_rank].hs_port;
}

int pdl_instance_notify_port(const pdl_instance_t *inst, int tp_rank)
{
    return (tp_rank < 0 || tp_rank >= inst->tp) ? -1 : inst->ranks[tp_rank].notify_port;
}

pdl_status_t pdl_instance_alloc_blocks(pdl_instance_t *inst, size_t n, uint32_t *ids_out, pdl_error_t *err)
{
    return pdl__blockalloc_alloc(inst->blocks, n, ids_out, err);
}

void pdl_instance_free_blocks(pdl_instance_t *inst, const uint32_t *ids, size_t n)
{
    pdl__blockalloc_free(inst->blocks, ids, n);
}

size_t pdl_instance_free_block_count(pdl_instance_t *inst) { return pdl__blockalloc_free_count(inst->blocks); }

/* ---- producer: holds -------------------------------------------------------------------------- */

pdl_status_t pdl_instance_hold(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n,
                               pdl_error_t *err)
{
    if (transfer_id == NULL || transfer_id[0] == '\0' || strlen(transfer_id) > PDL_WIRE_ID_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID, "hold: transfer id empty or longer than %d bytes", PDL_WIRE_ID_MAX);
    if (n == 0 || ids == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "hold %s: no blocks", transfer_id);
    pdl_status_t st = pdl__blockalloc_check_owned(inst->blocks, ids, n, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, "hold %s", transfer_id);
    pdl_held_t *h = calloc(1, sizeof(*h));
    if (h == NULL || (h->ids = malloc(n * sizeof(uint32_t))) == NULL) {
        free(h);
        return pdl_error_set(err, PDL_ERR_NOMEM, "hold %s: out of memory", transfer_id);
    }
    memcpy(h->ids, ids, n * sizeof(uint32_t));
    h->n = n;
    pthread_mutex_lock(&inst->held_mu);
    int rc = pdl__strmap_put(&inst->held, transfer_id, h);
    if (rc == 0)
        inst->held_blocks += n;
    pthread_mutex_unlock(&inst->held_mu);
    if (rc != 0) {
        free(h->ids);
        free(h);
        return rc > 0 ? pdl_error_set(err, PDL_ERR_BAD_STATE, "hold: transfer %s is already held", transfer_id)
                      : pdl_error_set(err, PDL_ERR_NOMEM, "hold %s: out of memory", transfer_id);
    }
    uint64_t now = pdl__clock_now_ns();
    for (int i = 0; i < inst->tp; i++) {
        pdl_rank_t *r = &inst->ranks[i];
        /* The peer's read request reaches the engine through a socket, which orders nothing for the
         * engine's serving threads; publish the caller's KV writes to them before the params go out. */
        pdl_engine_publish(r->engine);
        bool reported = false;
        pthread_mutex_lock(&r->fan_mu);
        pdl_error_t e;
        pdl_status_t hst = pdl__fanin_hold(r->fanin, transfer_id, now, &reported, &e);
        pthread_mutex_unlock(&r->fan_mu);
        if (hst != PDL_OK) {
            /* Cannot happen while the instance map refuses duplicates; resolve the rank so the blocks
             * are not stuck forever. */
            pdl_warn("rank %d: %s", i, e.msg);
            reported = true;
        }
        if (reported) {
            pdl_debug("rank %d: transfer %s completed by parked releases at hold", i, transfer_id);
            pdl__instance_rank_resolved(inst, transfer_id, i, false);
        }
    }
    return PDL_OK;
}

size_t pdl_instance_held_transfers(pdl_instance_t *inst)
{
    pthread_mutex_lock(&inst->held_mu);
    size_t n = inst->held.count;
    pthread_mutex_unlock(&inst->held_mu);
    return n;
}

size_t pdl_instance_held_blocks(pdl_instance_t *inst)
{
    pthread_mutex_lock(&inst->held_mu);
    size_t n = inst->held_blocks;
    pthread_mutex_unlock(&inst->held_mu);
    return n;
}

json_t *pdl_instance_params_json(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n)
{
    pdl_kv_params_t p;
    pdl_kv_params_init(&p);
    p.do_remote_prefill = true;
    p.do_remote_decode = false;
    snprintf(p.transfer_id, sizeof(p.transfer_id), "%s", transfer_id ? transfer_id : "");
    p.remote_block_ids = (uint32_t *)ids;
    p.num_remote_blocks = n;
    p.has_remote_block_ids = true;
    snprintf(p.remote_engine_id, sizeof(p.remote_engine_id), "%s", inst->engine_id);
    snprintf(p.remote_host, sizeof(p.remote_host), "%s", inst->cfg.conn.host_ip);
    p.remote_handshake_port = inst->cfg.conn.handshake_port;
    p.remote_notify_port = inst->cfg.conn.notify_port;
    p.remote_dp_size = inst->cfg.dp_size;
    p.remote_dp_rank = inst->cfg.dp_rank;
    p.tp_size = inst->tp;
    json_t *j = pdl_kv_params_to_json(&p);
    p.remote_block_ids = NULL; /* borrowed */
    p.num_remote_blocks = 0;
    pdl_kv_params_clear(&p);
    return j;
}

/* ---- counters --------------------------------------------------------------------------------- */

pdl_status_t pdl_instance_counters(pdl_instance_t *inst, int tp_rank, pdl_rank_counters_t *out, pdl_error_t *err)
{
    if (out == NULL || tp_rank < 0 || tp_rank >= inst->tp)
        return pdl_error_set(err, PDL_ERR_INVALID, "counters: rank %d outside [0, %d)", tp_rank, inst->tp);
    pdl_rank_t *r = &inst->ranks[tp_rank];
    pthread_mutex_lock(&r->ctr_mu);
    *out = r->ctr;
    pthread_mutex_unlock(&r->ctr_mu);
    pdl_fanin_counters_t fc;
    pthread_mutex_lock(&r->fan_mu);
    pdl__fanin_get_counters(r->fanin, &fc);
    pthread_mutex_unlock(&r->fan_mu);
    out->transfers += fc.reported;
    out->releases_received = fc.received;
    out->releases_duplicate = fc.duplicate;
    out->releases_late = fc.late;
    out->releases_parked = fc.parked;
    out->releases_failed_status = fc.failed_status;
    out->releases_parked_dropped = fc.parked_dropped;
    out->expired += fc.expired; /* plus WRITE-mode pushes reaped (push.c) */
    out->keepalives_received = fc.keepalives;
    return PDL_OK;
}
