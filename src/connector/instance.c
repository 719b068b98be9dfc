/*
 * instance.c -- creates and destroys a serving instance: validates the configuration, initialises
 * every rank (rank.c), starts each rank's threads (service.c; pull.c's reader or push.c's writer) and
 * stops them in an order that lets the last messages leave; plus the instance's plain accessors and
 * the block allocator front. It owns nothing the other files reach back into.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "connector/digest.h"
#include "connector/internal.h"
#include "common/clock.h"
#include "common/ports.h"

/* ---- create / destroy ------------------------------------------------------------------------- */

/* The KV memory type against the backend, before any engine exists: a device region handed to a
 * backend without a device path would be read by the CPU (shm's process_vm_readv and mappings), and a
 * cuda engine cannot register the host memory the instance would allocate. Backends that may register
 * device memory (cuda, ucx, tcp for CUDA) are checked again once the engine exists
 * (rank.c, check_mem_type): whether they do depends on the host (the driver, UCX's build). */
static pdl_status_t validate_mem_type(const pdl_instance_config_t *cfg, pdl_error_t *err)
{
    pdl_mem_type_t t = cfg->kv_mem_type;
    const char *backend = pdl_backend_name(cfg->conn.backend);
    if (t != PDL_MEM_TYPE_HOST && t != PDL_MEM_TYPE_CUDA && t != PDL_MEM_TYPE_ROCM)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: kv_mem_type %d is not a memory type", (int)t);
    if (cfg->kv_regions != NULL && cfg->kv_layer_regions != NULL)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "instance: kv_regions and kv_layer_regions are both set (one region per rank, or one per "
                             "layer)");
    if (t != PDL_MEM_TYPE_HOST && cfg->kv_regions == NULL && cfg->kv_layer_regions == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "instance: kv_mem_type %s needs kv_regions (the instance allocates host memory only)",
                             pdl__mem_type_name(t));
    if (t == PDL_MEM_TYPE_HOST && cfg->conn.backend == PDL_BACKEND_CUDA)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "kv_connector_extra_config.backend \"cuda\" moves GPU memory only, but the KV cache is "
                             "host memory%s; use \"tcp\" or \"shm\" for host memory",
                             cfg->kv_regions == NULL && cfg->kv_layer_regions == NULL
                                 ? " (the instance's own: no kv_regions given)"
                                 : "");
    if (t != PDL_MEM_TYPE_HOST && cfg->conn.backend == PDL_BACKEND_SHM)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "instance: the KV cache is %s memory (kv_mem_type), but kv_connector_extra_config.backend "
                             "%s moves host memory only (its peers copy with the CPU); use backend \"tcp\" (staged "
                             "through host memory, any hosts), \"cuda\" (GPUs of one host) or \"ucx\" built with %s "
                             "support",
                             pdl__mem_type_name(t), backend, pdl__mem_type_name(t));
    if (t == PDL_MEM_TYPE_ROCM && cfg->conn.backend == PDL_BACKEND_TCP)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "instance: the KV cache is ROCm memory (kv_mem_type), but "
                             "kv_connector_extra_config.backend tcp%s stages CUDA memory only; use backend \"ucx\" "
                             "built with ROCm support",
                             cfg->conn.backend_mapped_from_rdma ? " (what \"rdma\" resolved to)" : "");
    return PDL_OK;
}

static pdl_status_t validate_config(const pdl_instance_config_t *cfg, pdl_error_t *err)
{
    const pdl_model_geometry_t *m = &cfg->model;
    pdl_status_t st;
    if (cfg->tp_size < 1 || cfg->tp_size > PDL_TOPO_MAX_TP)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: tp_size %d outside [1, %d]", cfg->tp_size, PDL_TOPO_MAX_TP);
    if (cfg->dp_size < 1 || cfg->dp_rank < 0 || cfg->dp_rank >= cfg->dp_size)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: dp_rank %d not in [0, dp_size %d)", cfg->dp_rank,
                             cfg->dp_size);
    if (cfg->num_blocks == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: num_blocks must be > 0");
    if (cfg->local_rank < -1 || cfg->local_rank >= cfg->tp_size)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "instance: local_rank %d is neither -1 (every rank) nor a rank in [0, tp_size %d)",
                             cfg->local_rank, cfg->tp_size);
    if (m->num_layers < 1 || m->head_dim < 1 || m->elem_size < 1 || m->block_size < 1 || m->total_kv_heads < 1)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "instance: model geometry needs positive num_layers (%d), total_kv_heads (%d), head_dim "
                             "(%d), elem_size (%d), block_size (%d)",
                             m->num_layers, m->total_kv_heads, m->head_dim, m->elem_size, m->block_size);
    if (m->kv_fused && m->is_mla)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: kv_fused (K and V per token) with is_mla (no V)");
    st = validate_mem_type(cfg, err);
    if (st != PDL_OK)
        return st;
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

void pdl_instance_destroy(pdl_instance_t *inst)
{
    if (inst == NULL)
        return;
    atomic_store(&inst->stopping, true);
    pdl__push_stop_waits(inst); /* a writer waiting for a push's layers would hold up its lane's stop */
    /* The prewarm first: its peers' sessions use the ranks' engines and its handshakes the context. */
    pdl__prewarm_stop(inst);
    /* Readers and writers first (they queue releases and close their peers' sessions while the
     * engines live), then the services (they flush the queue). */
    PDL_FOR_LOCAL(inst, i) {
        pdl__reader_stop(&inst->ranks[i]);
        pdl__writer_stop(&inst->ranks[i]);
    }
    pdl__prewarm_free(inst); /* the lanes asked it until they stopped */
    PDL_FOR_LOCAL(inst, i) {
        pdl__service_stop(&inst->ranks[i]);
        pdl__xfer_lanes_fini(&inst->ranks[i].readers);
        pdl__xfer_lanes_fini(&inst->ranks[i].writers);
    }
    pdl__authmode_stop(inst);
    if (inst->zctx)
        zmq_ctx_term(inst->zctx);
    PDL_FOR_LOCAL(inst, i)
        pdl__rank_fini(&inst->ranks[i]);
    pdl__authmode_free(inst);
    free(inst->ranks);
    pdl__held_free_all(inst);
    pdl__digests_destroy(inst->digests);
    pdl__push_free_all(inst);
    pdl__blockalloc_destroy(inst->blocks);
    pdl__cidrs_free(&inst->trusted);
    pthread_mutex_destroy(&inst->held_mu);
    pthread_mutex_destroy(&inst->cb_mu);
    free(inst);
}

/* A rank port in the kernel's ephemeral range can be taken by any outgoing connection before the rank
 * binds it, which shows up later as a random "Address already in use": say so up front. */
static void warn_ephemeral_ports(const pdl_instance_config_t *cfg)
{
    int lo = cfg->local_rank < 0 ? 0 : cfg->local_rank, hi = cfg->local_rank < 0 ? cfg->tp_size : lo + 1;
    int first = pdl_topo_port_offset(cfg->dp_rank, cfg->tp_size, lo), last = first + (hi - lo) - 1;
    pdl_ports_warn_ephemeral("kv_connector_extra_config.handshake_port", cfg->conn.handshake_port + first,
                             cfg->conn.handshake_port + last);
    pdl_ports_warn_ephemeral("kv_connector_extra_config.notify_port", cfg->conn.notify_port + first,
                             cfg->conn.notify_port + last);
}

/* A new instance's memory and names, before any part of it starts; NULL when out of memory. */
static pdl_instance_t *instance_new(const pdl_instance_config_t *cfg)
{
    pdl_instance_t *inst = calloc(1, sizeof(*inst));
    if (inst == NULL)
        return NULL;
    inst->cfg = *cfg;
    snprintf(inst->attn_backend, sizeof(inst->attn_backend), "%s",
             cfg->attn_backend_name ? cfg->attn_backend_name : "pdlink");
    inst->cfg.attn_backend_name = inst->attn_backend;
    inst->tp = cfg->tp_size;
    inst->lo = cfg->local_rank < 0 ? 0 : cfg->local_rank;
    inst->hi = cfg->local_rank < 0 ? cfg->tp_size : cfg->local_rank + 1;
    pthread_mutex_init(&inst->held_mu, NULL);
    pthread_mutex_init(&inst->cb_mu, NULL);
    pthread_mutex_init(&inst->push_mu, NULL);
    pdl__clock_cond_init(&inst->push_cv);
    snprintf(inst->engine_id, sizeof(inst->engine_id), "%s:%d", cfg->conn.host_ip, cfg->conn.handshake_port);
    pdl_zmq_addr_t za;
    memset(&za, 0, sizeof(za));
    snprintf(za.host, sizeof(za.host), "%s", cfg->conn.host_ip);
    za.handshake_port = cfg->conn.handshake_port;
    za.notify_port = cfg->conn.notify_port; /* the base: peers add the rank offset (docs/topology.md#ports) */
    if (pdl_wire_format_zmq_address(&za, inst->zmq_address, sizeof(inst->zmq_address)) < 0)
        snprintf(inst->zmq_address, sizeof(inst->zmq_address), "host:%s,handshake:%d,notify:%d", cfg->conn.host_ip,
                 cfg->conn.handshake_port, cfg->conn.notify_port);
    return inst;
}

/* Free an instance whose ranks were never allocated (nothing started: no lane, no thread). */
static void instance_free_unstarted(pdl_instance_t *inst)
{
    if (inst->zctx)
        zmq_ctx_term(inst->zctx);
    pdl__blockalloc_destroy(inst->blocks);
    pdl__held_free_all(inst);
    pdl__digests_destroy(inst->digests);
    pdl__cidrs_free(&inst->trusted);
    pdl__authmode_free(inst);
    pthread_mutex_destroy(&inst->held_mu);
    pthread_mutex_destroy(&inst->cb_mu);
    pthread_mutex_destroy(&inst->push_mu);
    pthread_cond_destroy(&inst->push_cv);
    free(inst);
}

/* Every local rank: its lanes, memory, ROUTERs, engine, then its service thread. On failure the ranks
 * initialised (even partially) are torn down by destroy, the later ones' locks are initialised so
 * destroy may take them. */
static pdl_status_t start_ranks(pdl_instance_t *inst, pdl_error_t *err)
{
    /* Lanes first, for every rank: they start no thread until a transfer needs one, and the service
     * threads (started below) sweep them from their first tick; destroy stops them on every rank. */
    PDL_FOR_LOCAL(inst, i) {
        pdl__reader_start(&inst->ranks[i]);
        pdl__writer_start(&inst->ranks[i]);
    }
    pdl_status_t st = pdl__authmode_start(inst, err); /* the ZAP handler, before any ROUTER can accept */
    if (st != PDL_OK) {
        PDL_FOR_LOCAL(inst, j)
            pdl__rank_init_locks(&inst->ranks[j]);
        return st;
    }
    PDL_FOR_LOCAL(inst, i) {
        /* The rank's ROUTERs are bound before its engine picks a data port (rank.c, "Ports"). */
        st = pdl__rank_init(inst, &inst->ranks[i], i, err);
        if (st == PDL_OK)
            st = pdl__service_bind(&inst->ranks[i], err);
        if (st == PDL_OK)
            st = pdl__rank_open(inst, &inst->ranks[i], err);
        /* The handshake payloads exist once the rank is open: add the digest a producer serves. */
        if (st == PDL_OK && inst->cfg.conn.role == PDL_ROLE_PRODUCER && inst->cfg.conn.read_mode)
            pdl__digests_advertise(&inst->ranks[i]);
        if (st != PDL_OK) {
            for (int j = i + 1; j < inst->hi; j++)
                pdl__rank_init_locks(&inst->ranks[j]);
            return st;
        }
    }
    PDL_FOR_LOCAL(inst, i) {
        st = pdl__service_start(&inst->ranks[i], err);
        if (st != PDL_OK)
            return st;
    }
    return PDL_OK;
}

static void log_started(const pdl_instance_t *inst)
{
    const pdl_instance_config_t *cfg = &inst->cfg;
    char ranks[48] = "every rank";
    if (cfg->local_rank >= 0)
        snprintf(ranks, sizeof(ranks), "rank %d only", cfg->local_rank);
    pdl_info("instance %s (%s, TP %d, %s, DP rank %d/%d): handshake ports %d-%d, notify ports %d-%d, backend %s, %u "
             "blocks%s x %d layers",
             inst->engine_id, cfg->conn.role == PDL_ROLE_PRODUCER ? "producer" : "consumer", inst->tp, ranks,
             cfg->dp_rank, cfg->dp_size, inst->ranks[inst->lo].hs_port, inst->ranks[inst->hi - 1].hs_port,
             inst->ranks[inst->lo].notify_port, inst->ranks[inst->hi - 1].notify_port,
             pdl_backend_name(cfg->conn.backend), cfg->num_blocks, cfg->external_blocks ? " (caller-owned ids)" : "",
             cfg->model.num_layers);
}

pdl_status_t pdl_instance_create(const pdl_instance_config_t *cfg, pdl_instance_t **inst_out, pdl_error_t *err)
{
    if (cfg == NULL || inst_out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "instance: no config");
    pdl_status_t st = validate_config(cfg, err);
    if (st != PDL_OK)
        return st;
    warn_ephemeral_ports(cfg);
    pdl_instance_t *inst = instance_new(cfg);
    if (inst == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "instance: out of memory");
    /* external_blocks: the caller (vLLM's scheduler) owns the ids; inst->blocks stays NULL. */
    st = cfg->external_blocks ? PDL_OK : pdl__blockalloc_create(cfg->num_blocks, &inst->blocks, err);
    if (st == PDL_OK)
        st = pdl__held_init(inst, err);
    if (st == PDL_OK && (inst->digests = pdl__digests_create()) == NULL)
        st = pdl_error_set(err, PDL_ERR_NOMEM, "instance: out of memory (digest store)");
    if (st == PDL_OK)
        st = pdl__cidrs_parse(cfg->conn.trusted_hosts, &inst->trusted, err);
    if (st == PDL_OK)
        st = pdl__authmode_load(inst, err);
    if (st == PDL_OK) {
        inst->ranks = calloc((size_t)inst->tp, sizeof(pdl_rank_t));
        inst->zctx = zmq_ctx_new();
        if (inst->ranks == NULL || inst->zctx == NULL) {
            free(inst->ranks);
            inst->ranks = NULL;
            st = pdl_error_set(err, PDL_ERR_NOMEM, "instance: out of memory (ranks or zmq context)");
        }
    }
    if (st != PDL_OK) {
        instance_free_unstarted(inst);
        return st;
    }
    st = start_ranks(inst, err);
    if (st == PDL_OK)
        st = pdl__prewarm_start(inst, err); /* connects in the background: start-up never waits for a peer */
    if (st != PDL_OK) {
        pdl_instance_destroy(inst);
        return st;
    }
    log_started(inst);
    *inst_out = inst;
    return PDL_OK;
}

/* ---- accessors -------------------------------------------------------------------------------- */

const char *pdl_instance_engine_id(const pdl_instance_t *inst) { return inst->engine_id; }
const char *pdl_instance_zmq_address(const pdl_instance_t *inst) { return inst->zmq_address; }
int pdl_instance_tp_size(const pdl_instance_t *inst) { return inst->tp; }
int pdl_instance_local_rank(const pdl_instance_t *inst) { return inst->cfg.local_rank; }

const pdl_kv_geometry_t *pdl_instance_geometry(const pdl_instance_t *inst, int tp_rank)
{
    if (!pdl__is_local(inst, tp_rank))
        return NULL;
    return &inst->ranks[tp_rank].mem.geo;
}

uint8_t *pdl_instance_kv_layer(pdl_instance_t *inst, int tp_rank, int layer)
{
    if (!pdl__is_local(inst, tp_rank) || layer < 0 || layer >= inst->cfg.model.num_layers)
        return NULL;
    pdl_rank_t *r = &inst->ranks[tp_rank];
    return (uint8_t *)pdl_mem_ptr(pdl__layer_mem(&r->mem, layer)) + pdl__layer_off(&r->mem, layer);
}

int pdl_instance_handshake_port(const pdl_instance_t *inst, int tp_rank)
{
    return pdl__is_local(inst, tp_rank) ? inst->ranks[tp_rank].hs_port : -1;
}

int pdl_instance_notify_port(const pdl_instance_t *inst, int tp_rank)
{
    return pdl__is_local(inst, tp_rank) ? inst->ranks[tp_rank].notify_port : -1;
}

pdl_status_t pdl_instance_alloc_blocks(pdl_instance_t *inst, size_t n, uint32_t *ids_out, pdl_error_t *err)
{
    if (inst->blocks == NULL)
        return pdl_error_set(err, PDL_ERR_UNSUPPORTED,
                             "alloc_blocks: this instance has external_blocks (the caller owns the block ids)");
    return pdl__blockalloc_alloc(inst->blocks, n, ids_out, err);
}

void pdl_instance_free_blocks(pdl_instance_t *inst, const uint32_t *ids, size_t n)
{
    if (inst->blocks != NULL) {
        pdl__scrub_blocks(inst, ids, n);
        pdl__blockalloc_free(inst->blocks, ids, n);
    }
}

size_t pdl_instance_free_block_count(pdl_instance_t *inst)
{
    return inst->blocks != NULL ? pdl__blockalloc_free_count(inst->blocks) : 0;
}

void pdl_instance_config_defaults(pdl_instance_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    pdl_connector_config_defaults(&cfg->conn);
    cfg->dp_size = 1;
    cfg->local_rank = -1;
}

pdl_status_t pdl_instance_params(pdl_instance_t *inst, const char *transfer_id, const uint32_t *ids, size_t n,
                                 pdl_kv_params_t *out, pdl_error_t *err)
{
    pdl_kv_params_init(out);
    if (n > 0 && (out->remote_block_ids = malloc(n * sizeof(uint32_t))) == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "params of %s: out of memory for %zu block ids", transfer_id, n);
    if (n > 0)
        memcpy(out->remote_block_ids, ids, n * sizeof(uint32_t));
    out->num_remote_blocks = n;
    out->has_remote_block_ids = true;
    out->do_remote_prefill = true;
    out->do_remote_decode = false;
    snprintf(out->transfer_id, sizeof(out->transfer_id), "%s", transfer_id ? transfer_id : "");
    snprintf(out->remote_engine_id, sizeof(out->remote_engine_id), "%s", inst->engine_id);
    snprintf(out->remote_host, sizeof(out->remote_host), "%s", inst->cfg.conn.host_ip);
    out->remote_handshake_port = inst->cfg.conn.handshake_port;
    out->remote_notify_port = inst->cfg.conn.notify_port;
    out->remote_dp_size = inst->cfg.dp_size;
    out->remote_dp_rank = inst->cfg.dp_rank;
    out->tp_size = inst->tp;
    /* The KV is final when its params are handed out: the moment to digest it (docs/integrity.md). */
    if (inst->cfg.conn.read_mode && inst->cfg.conn.role == PDL_ROLE_PRODUCER)
        pdl__digests_take(inst, transfer_id, ids, n);
    return PDL_OK;
}
