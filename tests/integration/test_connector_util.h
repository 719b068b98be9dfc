/*
 * test_connector_util.h -- shared helpers of the connector integration tests (header-only, static).
 *
 * - tc_instance: creates an instance on free handshake and notify ranges (test_ports.h: outside the
 *   kernel's ephemeral range, probed by binding), retried on a new range when the create still hits
 *   EADDRINUSE because another test took a port in between.
 * - tc_fill / tc_verify: KV bytes as a function of (layer, global head, token, dim, byte, K/V, the
 *   block's index in the transfer, a per-transfer seed), written on the producer through its own
 *   geometry and checked on every consumer rank through the consumer's geometry -- so a byte read from
 *   the wrong head, block, token, layer or half is caught.
 * - tc_wait_for: poll a condition with a generous deadline (no timing assertions).
 */
#ifndef PDL_TEST_CONNECTOR_UTIL_H
#define PDL_TEST_CONNECTOR_UTIL_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/clock.h"
#include "pdlink/connector.h"
#include "common/log.h"
#include "wire/params_json.h"
#include "pdlink/topo.h"
#include "pdlink/wire.h"
#include "test_ports.h"

static inline void tc_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Poll `cond(arg)` every 2 ms until true or `ms` pass; returns the final value. */
static inline bool tc_wait_for(bool (*cond)(void *), void *arg, int ms)
{
    uint64_t end = pdl__clock_now_ms() + (uint64_t)ms;
    while (!cond(arg)) {
        if (pdl__clock_now_ms() > end)
            return cond(arg);
        tc_sleep_ms(2);
    }
    return true;
}

static inline bool tc_port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return ok;
}

/* A "blackholed" peer: n consecutive ports that accept TCP connections into the kernel's backlog and
 * never answer (nobody calls accept), like a host whose process hangs. Returns the first port and
 * fills fds[n] (close them to end it); 0 when no free range was found. */
static inline int tc_blackhole(int n, int *fds)
{
    for (int attempt = 0; attempt < 200; attempt++) {
        int base = 20001 + (int)(rand() % 12000);
        int i = 0;
        for (; i < n; i++) {
            fds[i] = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(base + i)),
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            if (fds[i] < 0 || bind(fds[i], (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fds[i], 64) != 0) {
                if (fds[i] >= 0)
                    close(fds[i]);
                break;
            }
        }
        if (i == n)
            return base;
        while (i-- > 0)
            close(fds[i]);
    }
    return 0;
}

static inline unsigned tc_rand(void)
{
    static _Thread_local unsigned s;
    if (s == 0)
        s = (unsigned)getpid() * 2654435761u ^ (unsigned)pdl__clock_now_ns();
    s = s * 1103515245u + 12345u;
    return s >> 8;
}

typedef struct tc_geo {
    int layers, heads, head_dim, elem, block_size;
    bool mla, kv_separate;
    pdl_kv_order_t order;
    bool kv_fused; /* vLLM's CPU cache: one half, rows of K then V */
} tc_geo_t;

static inline tc_geo_t tc_geo_default(int heads)
{
    tc_geo_t g = {.layers = 2, .heads = heads, .head_dim = 8, .elem = 2, .block_size = 4,
                  .mla = false, .kv_separate = true, .order = PDL_KV_HND};
    return g;
}

/* Variants of the default geometry the topology tables use. */
static inline tc_geo_t tc_geo_mla(void)
{
    tc_geo_t g = tc_geo_default(1);
    g.mla = true;
    g.head_dim = 16;
    return g;
}
static inline tc_geo_t tc_geo_nhd(int heads, int elem)
{
    tc_geo_t g = tc_geo_default(heads);
    g.order = PDL_KV_NHD;
    g.elem = elem;
    return g;
}
static inline tc_geo_t tc_geo_blockfirst(int heads)
{
    tc_geo_t g = tc_geo_default(heads);
    g.kv_separate = false;
    return g;
}

/* One row of a topology table (READ: test_connector_topologies.c, WRITE: test_connector_write.c):
 * nprod producer instances of TP P and ncons consumer instances of TP D move `transfers` transfers. */
typedef struct tc_topo {
    const char *name;
    int P, D;
    int nprod, ncons;
    int transfers;
    tc_geo_t g;
    pdl_backend_kind_t backend;
} tc_topo_t;

/* The topologies both directions run, as X(id, name, P, D, nprod, ncons, transfers, geometry, backend);
 * each test file expands it with its own runner (and adds the cases only one direction has). */
#define TC_TOPOLOGIES(X)                                                                                        \
    X(1p1d_tp4_tp4, "1P1D-TP4-TP4", 4, 4, 1, 1, 3, tc_geo_default(8), PDL_BACKEND_SHM)                          \
    X(p4_d8_h8_split, "P4-D8-H8-split", 4, 8, 1, 1, 3, tc_geo_default(8), PDL_BACKEND_SHM)                      \
    X(p8_d4_h8_split, "P8-D4-H8-split", 8, 4, 1, 1, 3, tc_geo_default(8), PDL_BACKEND_SHM)                      \
    X(p4_d8_mla, "P4-D8-MLA", 4, 8, 1, 1, 2, tc_geo_mla(), PDL_BACKEND_SHM)                                     \
    X(p8_d4_mla, "P8-D4-MLA", 8, 4, 1, 1, 2, tc_geo_mla(), PDL_BACKEND_SHM)                                     \
    X(2p1d_tp4_tp8, "2P1D-TP4+TP4-TP8", 4, 8, 2, 1, 4, tc_geo_default(8), PDL_BACKEND_SHM)                      \
    X(1p2d_tp8_tp4, "1P2D-TP8-TP4+TP4", 8, 4, 1, 2, 4, tc_geo_default(8), PDL_BACKEND_SHM)

/* Defines `static void <prefix>_<id>(void **)` running `runner` on one row. */
#define TC_TOPO_CASE(prefix, runner, id, name, P, D, np, nc, T, geo, be)                                         \
    static void prefix##_##id(void **state)                                                                      \
    {                                                                                                            \
        (void)state;                                                                                             \
        tc_topo_t tc = {name, P, D, np, nc, T, geo, be};                                                         \
        runner(&tc);                                                                                             \
    }

/* The instance-wide model geometry of g. */
static inline pdl_model_geometry_t tc_model(const tc_geo_t *g)
{
    return (pdl_model_geometry_t){.num_layers = g->layers,
                                  .total_kv_heads = g->heads,
                                  .head_dim = g->head_dim,
                                  .elem_size = g->elem,
                                  .block_size = g->block_size,
                                  .is_mla = g->mla,
                                  .order = g->order,
                                  .kv_separate = g->kv_separate,
                                  .kv_fused = g->kv_fused};
}

/* The tests' instance config: READ mode, short timeouts, geometry g, handshake ports from hs and notify
 * ports from nt (rank r on hs + r, nt + r). */
static inline void tc_config(pdl_instance_config_t *c, pdl_role_t role, int tp, const tc_geo_t *g, uint32_t num_blocks,
                             pdl_backend_kind_t backend, double defer_s, int hs, int nt)
{
    pdl_instance_config_defaults(c);
    c->conn.role = role;
    c->conn.read_mode = true;
    c->conn.backend = backend;
    c->conn.handshake_port = hs;
    c->conn.notify_port = nt;
    c->conn.defer_timeout_s = defer_s;
    c->conn.transfer_timeout_s = 20;
    c->conn.handshake_timeout_s = 5;
    c->model = tc_model(g);
    c->tp_size = tp;
    c->num_blocks = num_blocks;
}

/* Instance on free ports; `tweak` (may be NULL) edits the config before create. */
static inline pdl_instance_t *tc_instance(pdl_role_t role, int tp, const tc_geo_t *g, uint32_t num_blocks,
                                          pdl_backend_kind_t backend, double defer_s,
                                          void (*tweak)(pdl_instance_config_t *))
{
    for (int attempt = 0; attempt < 10; attempt++) {
        int hs = tp_free_range(2 * tp);
        if (hs < 0)
            return NULL;
        pdl_instance_config_t c;
        tc_config(&c, role, tp, g, num_blocks, backend, defer_s, hs, hs + tp);
        if (tweak)
            tweak(&c);
        pdl_instance_t *inst = NULL;
        pdl_error_t e;
        if (pdl_instance_create(&c, &inst, &e) == PDL_OK)
            return inst;
        if (strstr(e.msg, "in use") == NULL) {
            fprintf(stderr, "instance create failed: %s\n", e.msg);
            return NULL;
        }
    }
    fprintf(stderr, "tc_instance: every free port range was taken before the instance could bind it\n");
    return NULL;
}

/* A producer (TP ptp, defer_timeout pdefer, tweak ptweak) and then a consumer (ctp, cdefer, ctweak) of
 * geometry g with num_blocks blocks each, on free ports (tc_instance). False, with neither left, unless
 * both were made; *p and *c are set either way. */
static inline bool tc_pair(pdl_instance_t **p, pdl_instance_t **c, int ptp, int ctp, const tc_geo_t *g,
                           uint32_t num_blocks, pdl_backend_kind_t backend, double pdefer, double cdefer,
                           void (*ptweak)(pdl_instance_config_t *), void (*ctweak)(pdl_instance_config_t *))
{
    *p = tc_instance(PDL_ROLE_PRODUCER, ptp, g, num_blocks, backend, pdefer, ptweak);
    *c = tc_instance(PDL_ROLE_CONSUMER, ctp, g, num_blocks, backend, cdefer, ctweak);
    if (*p != NULL && *c != NULL)
        return true;
    pdl_instance_destroy(*c);
    pdl_instance_destroy(*p);
    *p = *c = NULL;
    return false;
}

static inline uint8_t tc_byte(uint32_t seed, int layer, int ghead, uint32_t bidx, int token, int dim, int byte, int half)
{
    uint32_t h = seed * 0x9E3779B1u;
    h ^= (uint32_t)layer * 0x85EBCA77u;
    h ^= (uint32_t)ghead * 0xC2B2AE3Du;
    h ^= bidx * 0x27D4EB2Fu;
    h ^= (uint32_t)token * 0x165667B1u;
    h ^= (uint32_t)dim * 0xD3A2646Cu;
    h ^= (uint32_t)byte * 0xFD7046C5u;
    h ^= (uint32_t)half * 0xB55A4F09u;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    return (uint8_t)(h ^ (h >> 24));
}

/* Offset of element (head index within the rank, token, dim) of K (half 0) or V (half 1) inside one
 * half-block -- for a fused geometry inside the block, whose row of a (head, token) is K then V. */
/* Bytes of rank 0's KV region (every layer) for geometry g at TP tp with num_blocks blocks; 0 when the
 * configuration is refused. */
static inline uint64_t tc_region_len(const tc_geo_t *g, int tp, uint32_t num_blocks)
{
    pdl_instance_config_t c;
    pdl_instance_config_defaults(&c);
    c.model = tc_model(g);
    c.tp_size = tp;
    c.num_blocks = num_blocks;
    uint64_t total = 0;
    return pdl_instance_kv_region_len(&c, 0, &total, NULL) == PDL_OK ? total : 0;
}

static inline uint64_t tc_elem_off(const pdl_kv_geometry_t *g, int lhead, int token, int dim, int half)
{
    uint64_t e = g->elem_size, row = g->kv_fused ? 2u * g->head_dim : g->head_dim;
    uint64_t in_row = (uint64_t)dim + (g->kv_fused ? (uint64_t)half * g->head_dim : 0);
    if (g->order == PDL_KV_HND)
        return (((uint64_t)lhead * g->block_size + (uint64_t)token) * row + in_row) * e;
    return (((uint64_t)token * g->num_heads + (uint64_t)lhead) * row + in_row) * e;
}

/* Walk every byte of `blocks` in layer l of one rank (geometry g, the layer's bytes at `base`) whose first
 * global head is `ghead0`; fill (verify false) or count mismatching bytes (verify true, *checked += bytes
 * compared). `base` may be a host copy of a layer kept elsewhere (device memory). */
static inline uint64_t tc_walk_layer(const pdl_kv_geometry_t *g, uint8_t *base, int l, int ghead0,
                                     const uint32_t *blocks, size_t n, uint32_t seed, bool verify, uint64_t *checked)
{
    uint64_t bad = 0;
    for (size_t i = 0; i < n; i++)
        for (int half = 0; half < (g->is_mla ? 1 : 2); half++) {
            uint64_t hoff = pdl_layout_half_offset(g, blocks[i], g->kv_fused ? 0 : half);
            for (int lh = 0; lh < (int)g->num_heads; lh++)
                for (int t = 0; t < (int)g->block_size; t++)
                    for (int d = 0; d < (int)g->head_dim; d++)
                        for (int b = 0; b < (int)g->elem_size; b++) {
                            uint8_t *p = base + hoff + tc_elem_off(g, lh, t, d, half) + (uint64_t)b;
                            uint8_t want = tc_byte(seed, l, ghead0 + lh, (uint32_t)i, t, d, b, half);
                            if (!verify) {
                                *p = want;
                                continue;
                            }
                            bad += *p != want;
                            (*checked)++;
                        }
        }
    return bad;
}

/* tc_walk_layer over every layer of one rank of an instance, in the instance's own (host) memory. */
static inline uint64_t tc_walk(pdl_instance_t *inst, int rank, int ghead0, const uint32_t *blocks, size_t n,
                               uint32_t seed, bool verify, uint64_t *checked)
{
    const pdl_kv_geometry_t *g = pdl_instance_geometry(inst, rank);
    uint64_t bad = 0;
    for (int l = 0; pdl_instance_kv_layer(inst, rank, l) != NULL; l++)
        bad += tc_walk_layer(g, pdl_instance_kv_layer(inst, rank, l), l, ghead0, blocks, n, seed, verify, checked);
    return bad;
}

static inline int tc_first_head(int tp, int heads, bool mla, int rank)
{
    int first = 0, count = 0;
    if (pdl_topo_heads(tp, heads, mla, rank, &first, &count, NULL) != PDL_OK)
        return -1;
    return first;
}

/* Fill `blocks` on every rank of a producer instance (ranks it does not run: tc_walk sees no layer). */
static inline void tc_fill(pdl_instance_t *inst, int heads, bool mla, const uint32_t *blocks, size_t n, uint32_t seed)
{
    int tp = pdl_instance_tp_size(inst);
    for (int r = 0; r < tp; r++)
        tc_walk(inst, r, tc_first_head(tp, heads, mla, r), blocks, n, seed, false, NULL);
}

/* Verify `blocks` on every rank of a consumer instance; returns mismatching bytes, adds to *checked. */
static inline uint64_t tc_verify(pdl_instance_t *inst, int heads, bool mla, const uint32_t *blocks, size_t n,
                                 uint32_t seed, uint64_t *checked)
{
    int tp = pdl_instance_tp_size(inst);
    uint64_t bad = 0;
    for (int r = 0; r < tp; r++)
        bad += tc_walk(inst, r, tc_first_head(tp, heads, mla, r), blocks, n, seed, true, checked);
    return bad;
}

/* The bytes n blocks of `layers` layers span on every rank of an instance: what tc_verify compares when
 * each rank received its whole share. */
static inline uint64_t tc_instance_bytes(pdl_instance_t *inst, int layers, size_t n)
{
    uint64_t sum = 0;
    for (int r = 0; r < pdl_instance_tp_size(inst); r++) {
        const pdl_kv_geometry_t *g = pdl_instance_geometry(inst, r);
        sum += (uint64_t)layers * (uint64_t)pdl_layout_num_halves(g) * pdl_layout_block_len(g) * n;
    }
    return sum;
}

/* Sum of a counter field over the ranks the instance runs: TC_SUM(inst, releases_sent). */
static inline uint64_t tc_sum(pdl_instance_t *inst, size_t off)
{
    uint64_t s = 0;
    for (int r = 0; r < pdl_instance_tp_size(inst); r++) {
        pdl_rank_counters_t c;
        if (pdl_instance_counters(inst, r, &c, NULL) == PDL_OK) /* not a local rank: another process's */
            s += *(const uint64_t *)((const char *)&c + off);
    }
    return s;
}
#define TC_SUM(inst, field) tc_sum((inst), offsetof(pdl_rank_counters_t, field))

static inline uint64_t tc_get(pdl_instance_t *inst, int rank, size_t off)
{
    pdl_rank_counters_t c;
    pdl_instance_counters(inst, rank, &c, NULL);
    return *(const uint64_t *)((const char *)&c + off);
}
#define TC_GET(inst, rank, field) tc_get((inst), (rank), offsetof(pdl_rank_counters_t, field))

/* For tc_wait_for: the counter at `off` (offsetof in pdl_rank_counters_t), summed over inst's ranks,
 * reached `want`. */
typedef struct {
    pdl_instance_t *inst;
    size_t off;
    uint64_t want;
} tc_at_least_t;

static inline bool tc_sum_reached(void *arg)
{
    tc_at_least_t *a = arg;
    return tc_sum(a->inst, a->off) >= a->want;
}

static inline bool tc_no_held(void *arg) { return pdl_instance_held_transfers((pdl_instance_t *)arg) == 0; }

/* tc_wait_for condition: no instance of the NULL-terminated array arg holds a transfer. */
static inline bool tc_none_held(void *arg)
{
    pdl_instance_t **v = arg;
    for (int i = 0; v[i]; i++)
        if (pdl_instance_held_transfers(v[i]) != 0)
            return false;
    return true;
}

/* Producer events counted per rank (pdl_instance_set_event_fn(inst, tc_on_event, &count)). */
typedef struct tc_events {
    _Atomic int reported[PDL_TOPO_MAX_TP];
    _Atomic int expired[PDL_TOPO_MAX_TP];
    _Atomic int expired_all; /* RANK_EXPIRED of any rank */
    _Atomic int freed;
} tc_events_t;

static inline void tc_on_event(void *arg, pdl_instance_event_t ev, const char *tid, int rank)
{
    (void)tid;
    tc_events_t *c = arg;
    bool in = rank >= 0 && rank < PDL_TOPO_MAX_TP;
    if (ev == PDL_EVENT_RANK_REPORTED && in)
        atomic_fetch_add(&c->reported[rank], 1);
    else if (ev == PDL_EVENT_RANK_EXPIRED) {
        atomic_fetch_add(&c->expired_all, 1);
        if (in)
            atomic_fetch_add(&c->expired[rank], 1);
    } else if (ev == PDL_EVENT_FREED)
        atomic_fetch_add(&c->freed, 1);
}

/* Count inst's producer events into *ev from zero on. */
static inline void tc_count_events(pdl_instance_t *inst, tc_events_t *ev)
{
    memset(ev, 0, sizeof(*ev));
    pdl_instance_set_event_fn(inst, tc_on_event, ev);
}

/* Build kv_transfer_params as a consumer receives them (through JSON, like the router passes them). */
static inline void tc_params(pdl_instance_t *prod, const char *tid, const uint32_t *ids, size_t n, pdl_kv_params_t *out)
{
    pdl_kv_params_t held;
    json_t *j = NULL;
    if (pdl_instance_params(prod, tid, ids, n, &held, NULL) == PDL_OK) {
        j = pdl_kv_params_to_json(&held);
        pdl_kv_params_clear(&held);
    }
    pdl_kv_params_init(out);
    pdl_error_t e;
    if (pdl_kv_params_from_json(j, out, &e) != PDL_OK)
        fprintf(stderr, "params: %s\n", e.msg);
    json_decref(j);
}

/* The next discovery ping the ROUTER socket `router` (standing in for the router's discovery port)
 * receives within timeout_ms, decoded into *reg: PDL_OK, PDL_ERR_TIMEOUT (none came), PDL_ERR_TRANSPORT
 * (a receive failed) or the decoder's error. */
static inline pdl_status_t tc_recv_registration(void *router, int timeout_ms, pdl_registration_t *reg,
                                                pdl_error_t *e)
{
    zmq_pollitem_t it = {.socket = router, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, timeout_ms) != 1)
        return pdl_error_set(e, PDL_ERR_TIMEOUT, "no discovery ping within %d ms", timeout_ms);
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    pdl_status_t st;
    if (zmq_msg_recv(&id, router, 0) < 0 || zmq_msg_recv(&body, router, 0) < 0)
        st = pdl_error_set(e, PDL_ERR_TRANSPORT, "discovery ping: %s", zmq_strerror(zmq_errno()));
    else
        st = pdl_wire_decode_registration(zmq_msg_data(&body), zmq_msg_size(&body), reg, e);
    zmq_msg_close(&id);
    zmq_msg_close(&body);
    return st;
}

/* PDLINK_LOG_LEVEL=debug|info|warn|error, when set, is the log level of the test program. */
static inline void tc_log_level_from_env(void)
{
    const char *lvl = getenv("PDLINK_LOG_LEVEL");
    if (lvl && pdl_log_level_parse(lvl) >= 0)
        pdl_log_set_level((pdl_log_level_t)pdl_log_level_parse(lvl));
}

/* A request id carrying both instances' addresses, as the router builds it (uuid bytes t*16 .. t*16+15).
 * False when the addresses do not fit `cap`. */
static inline bool tc_request_id_to(pdl_instance_t *p, const char *caddr, int t, char *buf, size_t cap)
{
    uint8_t uuid[16];
    for (int i = 0; i < 16; i++)
        uuid[i] = (uint8_t)(t * 16 + i);
    return pdl_wire_format_request_id(pdl_instance_zmq_address(p), caddr, uuid, buf, cap) > 0;
}

static inline bool tc_request_id(pdl_instance_t *p, pdl_instance_t *c, int t, char *buf, size_t cap)
{
    return tc_request_id_to(p, pdl_instance_zmq_address(c), t, buf, cap);
}

/* A producer's hold of n new blocks (into ids) as `tid`, for the decode at zmq address `caddr` (which
 * may be dead: the request id names it), request uuid tag t. Returns the first failure (err filled). */
static inline pdl_status_t tc_hold_for(pdl_instance_t *p, const char *caddr, const char *tid, int t, uint32_t *ids,
                                       size_t n, pdl_error_t *err)
{
    char rid[1024];
    if (!tc_request_id_to(p, caddr, t, rid, sizeof(rid)))
        return pdl_error_set(err, PDL_ERR_INVALID, "request id for %s", caddr);
    pdl_status_t st = pdl_instance_alloc_blocks(p, n, ids, err);
    return st != PDL_OK ? st : pdl_instance_hold_for(p, tid, rid, ids, n, err);
}

/* WRITE mode, with transfer and consumer-gone timeouts far beyond any test's bound: what ends a wait
 * early is the watch (refusals, identities), never a timeout. */
static inline void tc_write_slow(pdl_instance_config_t *c)
{
    c->conn.read_mode = false;
    c->allow_write_mode = true;
    c->conn.transfer_timeout_s = 600;
    c->conn.consumer_gone_timeout_s = 600;
}

/* A producer whose consumer-gone watch gives up only on refusals or identities, never on its timeout. */
static inline void tc_watch_slow(pdl_instance_config_t *c) { c->conn.consumer_gone_timeout_s = 600; }

/* The params each leg carries in WRITE mode (docs/vllm-router.md#write-dispatch): the transfer id and the peer's TP. */
static inline void tc_leg_params(const char *tid, int peer_tp, pdl_kv_params_t *kp)
{
    pdl_kv_params_init(kp);
    snprintf(kp->transfer_id, sizeof(kp->transfer_id), "%s", tid);
    kp->remote_tp_size = peer_tp;
}

/* One WRITE-mode transfer from producer p to consumer c, set up as each leg receives it: the request id
 * naming both (uuid tag `tag`), n <= TC_LEG_MAX blocks allocated on each side (the producer's filled
 * with the pattern of `seed`, tc_fill) and each leg's params under transfer id `tid`. Returns the first
 * failure; tc_push_leg_clear gives the params back (the blocks stay the caller's). */
#define TC_LEG_MAX 16
typedef struct tc_push_leg {
    char rid[1024];
    uint32_t pb[TC_LEG_MAX], cb[TC_LEG_MAX];
    pdl_kv_params_t pk, ck; /* the producer's leg (names the consumer) and the consumer's */
} tc_push_leg_t;

static inline pdl_status_t tc_push_leg(tc_push_leg_t *l, pdl_instance_t *p, pdl_instance_t *c, const char *tid,
                                       uint8_t tag, int heads, size_t n, uint32_t seed)
{
    uint8_t uuid[16] = {tag};
    pdl_kv_params_init(&l->pk);
    pdl_kv_params_init(&l->ck);
    if (n > TC_LEG_MAX || pdl_wire_format_request_id(pdl_instance_zmq_address(p), pdl_instance_zmq_address(c), uuid,
                                                     l->rid, sizeof(l->rid)) <= 0)
        return PDL_ERR_INVALID;
    pdl_status_t st = pdl_instance_alloc_blocks(p, n, l->pb, NULL);
    if (st == PDL_OK)
        st = pdl_instance_alloc_blocks(c, n, l->cb, NULL);
    if (st != PDL_OK)
        return st;
    tc_fill(p, heads, false, l->pb, n, seed);
    snprintf(l->ck.transfer_id, sizeof(l->ck.transfer_id), "%s", tid);
    snprintf(l->pk.transfer_id, sizeof(l->pk.transfer_id), "%s", tid);
    l->ck.remote_tp_size = pdl_instance_tp_size(p);
    l->pk.remote_tp_size = pdl_instance_tp_size(c);
    return PDL_OK;
}

static inline void tc_push_leg_clear(tc_push_leg_t *l)
{
    pdl_kv_params_clear(&l->pk);
    pdl_kv_params_clear(&l->ck);
}

/* The consumer's side of l: c expects the push of l->cb[0..n) and p has parked its remote_blocks on
 * every producer rank (before any push), for tests that then take p away. Returns the first failure
 * (PDL_ERR_TIMEOUT if p did not park them within 20 s). */
static inline pdl_status_t tc_push_leg_parked(tc_push_leg_t *l, pdl_instance_t *p, pdl_instance_t *c, size_t n,
                                              pdl_recv_t **rv, pdl_error_t *e)
{
    pdl_status_t st = pdl_instance_expect_push(c, &l->ck, l->rid, l->cb, n, rv, e);
    if (st != PDL_OK)
        return st;
    tc_at_least_t parked = {p, offsetof(pdl_rank_counters_t, remote_blocks_parked), (uint64_t)pdl_instance_tp_size(p)};
    return tc_wait_for(tc_sum_reached, &parked, 20000) ? PDL_OK : PDL_ERR_TIMEOUT;
}

/* A producer's transfer ready to be pulled: n blocks allocated into ids, filled with the pattern of
 * `seed` (tc_fill) and held as `tid`. Returns the first failure. */
static inline pdl_status_t tc_hold_filled(pdl_instance_t *p, const char *tid, int heads, bool mla, uint32_t *ids,
                                          size_t n, uint32_t seed)
{
    pdl_status_t st = pdl_instance_alloc_blocks(p, n, ids, NULL);
    if (st != PDL_OK)
        return st;
    tc_fill(p, heads, mla, ids, n, seed);
    return pdl_instance_hold(p, tid, ids, n, NULL);
}

/* Pull kp into the consumer's blocks ids and wait for it (the 60 s deadline only bounds a failure).
 * Returns the pull's status; its message is in *e. */
static inline pdl_status_t tc_pull_wait(pdl_instance_t *c, const pdl_kv_params_t *kp, const uint32_t *ids, size_t n,
                                        pdl_error_t *e)
{
    pdl_pull_t *pull;
    pdl_status_t st = pdl_instance_pull(c, kp, NULL, ids, n, &pull, e);
    if (st != PDL_OK)
        return st;
    st = pdl_pull_wait(pull, 60000, e);
    pdl_pull_free(pull);
    return st;
}

#endif /* PDL_TEST_CONNECTOR_UTIL_H */
