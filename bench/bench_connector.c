/*
 * bench_connector.c -- `pdlink bench --connector`: what a request's KV transfer costs in pdlink itself,
 * without any model compute, against the engine alone and memcpy, in the same run.
 *
 * For each topology (1P1D = TP8->TP8, P4/D8, P8/D4, P4/D4; llama-3.1-8b geometry by default) one prefill
 * and one decode instance live in this process, their handshakes made by untimed warm-up transfers.
 * One connector transfer is the whole READ path: hold on the prefill, the kv_transfer_params, the pull
 * (plan, descriptors, one engine batch per layer per producer rank, the releases), the producer's
 * fan-in and the free of its blocks (its PDL_EVENT_FREED). The KV is written before and checked after,
 * every byte, outside the clock. The engine-only transfer posts the same descriptors (same geometry,
 * same block ids, built by pdl_layout_build_descs) straight to engines of the same backend, one batch
 * per consumer rank and producer rank with every layer in it, from one thread, no connector;
 * memcpy copies the same number of bytes between two warm buffers (bench/ceiling.h).
 *
 * Method: a sample is `reps` transfers of one kind; per row, samples alternate connector, engine,
 * memcpy, `pairs` times (>= 5). Each ratio is the median of the per-pair ratios, with min-max, summed
 * up by bench/pairs.h: a row whose spread is wider than PDL_PAIRS_SPREAD_MAX prints "spread" instead of
 * a number, and a throughput ratio above 1 + PDL_PAIRS_ABOVE_TOL is flagged ">1".
 *
 * Release latency: per transfer and producer rank, the time from the last consumer send among the
 * consumer ranks that release it (pdl_pull_release_sent_ns) to that producer rank's RANK_REPORTED
 * event, both on CLOCK_MONOTONIC. Next to it, in the same pairs, the round trip of a message of the
 * same bytes between a DEALER and a ROUTER (the release path's socket types) over loopback tcp, each
 * in its own ZeroMQ context as the instances' sockets are (one shared context would serve both ends
 * from one I/O thread, which a release never has), two ways: "hot", --zmq-rts round trips back to back after each connector sample (threads that never
 * sleep long: the release path at its best), and "cold", one round trip right after each connector
 * transfer, untimed, when that path's threads have slept as long as the release path's did. On a
 * loaded machine a thread woken from a long sleep waits for a CPU; the cold probe pays that wait too,
 * the hot one does not, so the difference between the two ratios is the machine's, not pdlink's.
 *
 * Split heads: P4/D8 and P8/D4 against P4/D4 moving the same bytes (every head of every layer), their
 * connector samples alternating.
 */
#include "bench/bench_connector.h"

#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "app/optab.h"
#include "bench/ceiling.h"
#include "bench/pairs.h"
#include "common/clock.h"
#include "pdlink/connector.h"
#include "common/log.h"
#include "pdlink/models.h"
#include "pdlink/params.h"
#include "app/ports.h"
#include "pdlink/topo.h"
#include "pdlink/wire.h"

#define BC_MAX_TOKENS 8
#define BC_MAX_PAIRS (PDL_PAIRS_MAX + 1) /* --pairs is 5..PDL_PAIRS_MAX */
#define BC_MAX_REPS 1000
#define BC_NTOPO 4
#define BC_WAIT_MS 30000

static const struct {
    const char *name;
    int P, D;
} bc_topos[BC_NTOPO] = {{"1P1D", 8, 8}, {"P4/D8", 4, 8}, {"P8/D4", 8, 4}, {"P4/D4", 4, 4}};
enum { BC_T_1P1D = 0, BC_T_P4D8 = 1, BC_T_P8D4 = 2, BC_T_P4D4 = 3 };

typedef struct bc_opts {
    const pdl_model_preset_t *model;
    int block_size;
    int tokens[BC_MAX_TOKENS];
    int ntokens;
    int pairs, reps, zmq_rts;
    bool topo_on[BC_NTOPO];
    pdl_backend_kind_t backend;
    pdl_kv_integrity_t integrity; /* both instances' kv_integrity */
    const char *json;
    bool connector; /* --connector: how pdl_cli_bench chose this benchmark */
} bc_opts_t;

/* ---- alternating pairs (bench/pairs.h) and plain medians of samples ---- */

typedef struct bc_ratio {
    double median, min, max;
    bool wide;  /* too few pairs, or the spread is too wide to print a number */
    bool above; /* median above 1 + PDL_PAIRS_ABOVE_TOL (meaningful for throughput ratios only) */
} bc_ratio_t;

/* The per-pair ratios a[i] / b[i] summed up by bench/pairs.h. */
static bc_ratio_t bc_pairs_ratio(const double *a, const double *b, int n)
{
    pdl_pairs_t p;
    pdl_pairs_init(&p);
    for (int i = 0; i < n; i++)
        (void)pdl_pairs_add(&p, a[i], b[i]); /* a failed sample (ceiling 0) is left out: fewer pairs */
    pdl_pairs_summary_t sum;
    pdl_pairs_summarize(&p, PDL_PAIRS_SPREAD_MAX, PDL_PAIRS_ABOVE_TOL, &sum);
    return (bc_ratio_t){.median = sum.ratio_median,
                        .min = sum.ratio_min,
                        .max = sum.ratio_max,
                        .wide = sum.verdict == PDL_PAIRS_TOO_FEW || sum.verdict == PDL_PAIRS_UNSTABLE,
                        .above = sum.verdict == PDL_PAIRS_ABOVE_CEILING};
}

/* ---- one topology: the instances, the engine-only mirror, the producer's events ---------------------- */

typedef struct bc_setup {
    const char *name;
    int P, D;
    int layers;
    pdl_instance_t *prod, *cons;
    int tokens; /* the row's prompt length: the hold zeroes its last block's rows past it, as a node does */
    /* The producer's events of the transfer in flight (one at a time). */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char tid[64];
    bool freed;
    uint64_t report_ns[PDL_TOPO_MAX_TP];
    /* Engine-only: one engine and region per rank of each side, sized like the instances' regions. */
    pdl_engine_t *pe[PDL_TOPO_MAX_TP], *ce[PDL_TOPO_MAX_TP];
    pdl_mem_t *pm[PDL_TOPO_MAX_TP], *cm[PDL_TOPO_MAX_TP];
    pdl_session_t *sess[PDL_TOPO_MAX_TP][PDL_TOPO_MAX_TP]; /* [consumer rank][producer rank] */
    pdl_read_plan_t plan[PDL_TOPO_MAX_TP];
    int seq;              /* transfers made, for ids and fill seeds */
    struct bc_zmq *probe; /* the round-trip sockets, for the cold probe after each transfer */
} bc_setup_t;

static void bc_on_event(void *arg, pdl_instance_event_t ev, const char *tid, int rank)
{
    bc_setup_t *s = arg;
    uint64_t now = pdl__clock_now_ns();
    pthread_mutex_lock(&s->mu);
    if (strcmp(tid, s->tid) == 0) {
        if (ev == PDL_EVENT_RANK_REPORTED && rank >= 0 && rank < PDL_TOPO_MAX_TP)
            s->report_ns[rank] = now;
        else if (ev == PDL_EVENT_FREED) {
            s->freed = true;
            pthread_cond_broadcast(&s->cv);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

static pdl_instance_t *bc_instance(const bc_opts_t *o, pdl_port_picker_t *pp, pdl_role_t role, int tp, uint32_t nblocks)
{
    for (int attempt = 0; attempt < 10; attempt++) {
        int hs = 0;
        pdl_error_t e;
        if (pdl_port_picker_take(pp, "127.0.0.1", 2 * tp, &hs, &e) != PDL_OK) {
            fprintf(stderr, "pdlink bench: no free ports: %s\n", e.msg);
            return NULL;
        }
        pdl_instance_config_t c;
        pdl_instance_config_defaults(&c);
        pdl_connector_config_defaults(&c.conn);
        c.conn.role = role;
        c.conn.read_mode = true;
        c.conn.backend = o->backend;
        c.conn.kv_integrity = o->integrity;
        c.conn.handshake_port = hs;
        c.conn.notify_port = hs + tp;
        c.model.num_layers = o->model->num_layers;
        c.model.total_kv_heads = o->model->total_kv_heads;
        c.model.head_dim = o->model->head_dim;
        c.model.elem_size = o->model->elem_size;
        c.model.block_size = o->block_size;
        c.model.is_mla = o->model->is_mla;
        c.model.kv_separate = true;
        c.model.order = PDL_KV_HND;
        c.tp_size = tp;
        c.dp_size = 1;
        c.num_blocks = nblocks;
        pdl_instance_t *inst = NULL;
        if (pdl_instance_create(&c, &inst, &e) == PDL_OK)
            return inst;
        if (strstr(e.msg, "in use") == NULL) {
            fprintf(stderr, "pdlink bench: instance (TP %d): %s\n", tp, e.msg);
            return NULL;
        }
    }
    fprintf(stderr, "pdlink bench: every free port range was taken before the instance could bind it\n");
    return NULL;
}

/* Bytes between layer 0 and layer 1 of a rank (the layers lie one after the other). */
static uint64_t bc_layer_len(const pdl_kv_geometry_t *g) { return pdl_layout_region_len(g); }

static pdl_status_t bc_engine(const char *who, int tp_rank, pdl_backend_kind_t be, const pdl_kv_geometry_t *g,
                              int layers, pdl_engine_t **eng, pdl_mem_t **mem, pdl_error_t *err)
{
    char key[96];
    snprintf(key, sizeof(key), "bench-%s-%d-%d", who, (int)getpid(), tp_rank);
    pdl_engine_config_t ec = {.key = key, .backend = be, .qp_per_transfer = 1, .num_workers = 1};
    pdl_status_t st = pdl_engine_create(&ec, eng, err);
    if (st == PDL_OK)
        st = pdl_engine_alloc_mem(*eng, (size_t)(bc_layer_len(g) * (uint64_t)layers), mem, err);
    return st;
}

static pdl_status_t bc_connect(pdl_engine_t *local, pdl_mem_t *lmem, pdl_engine_t *remote, pdl_mem_t *rmem,
                               pdl_session_t **out, pdl_error_t *err)
{
    pdl_bytes_t ed = {0}, md = {0};
    pdl_status_t st = pdl_engine_pack(remote, &ed, err);
    if (st == PDL_OK)
        st = pdl_engine_add_remote(local, ed.data, ed.len, NULL, 0, err);
    if (st == PDL_OK)
        st = pdl_mem_pack(rmem, &md, err);
    if (st == PDL_OK)
        st = pdl_session_open(local, lmem, md.data, md.len, out, err);
    pdl_bytes_free(&ed);
    pdl_bytes_free(&md);
    return st;
}

/* The engine-only mirror of a setup whose instances exist: engines, regions, sessions, read plans. */
static pdl_status_t bc_mirror(bc_setup_t *s, const bc_opts_t *o, pdl_error_t *err)
{
    const pdl_model_preset_t *m = o->model;
    pdl_status_t st = PDL_OK;
    char who[64];
    for (int p = 0; p < s->P && st == PDL_OK; p++) {
        snprintf(who, sizeof(who), "P%dD%d-prod", s->P, s->D);
        st = bc_engine(who, p, o->backend, pdl_instance_geometry(s->prod, p), s->layers, &s->pe[p], &s->pm[p], err);
    }
    for (int d = 0; d < s->D && st == PDL_OK; d++) {
        snprintf(who, sizeof(who), "P%dD%d-cons", s->P, s->D);
        st = bc_engine(who, d, o->backend, pdl_instance_geometry(s->cons, d), s->layers, &s->ce[d], &s->cm[d], err);
        if (st == PDL_OK)
            st = pdl_topo_read_plan(s->P, s->D, m->total_kv_heads, m->is_mla, d, &s->plan[d], err);
        for (int i = 0; st == PDL_OK && i < s->plan[d].num_pieces; i++) {
            int p = s->plan[d].pieces[i].producer_rank;
            if (s->sess[d][p] == NULL)
                st = bc_connect(s->ce[d], s->cm[d], s->pe[p], s->pm[p], &s->sess[d][p], err);
        }
    }
    return st;
}

static void bc_setup_free(bc_setup_t *s)
{
    for (int d = 0; d < PDL_TOPO_MAX_TP; d++)
        for (int p = 0; p < PDL_TOPO_MAX_TP; p++)
            pdl_session_close(s->sess[d][p]);
    for (int r = 0; r < PDL_TOPO_MAX_TP; r++) {
        pdl_engine_destroy(s->pe[r]); /* frees its regions too */
        pdl_engine_destroy(s->ce[r]);
    }
    pdl_instance_destroy(s->cons);
    pdl_instance_destroy(s->prod);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
}

static bool bc_setup_init(bc_setup_t *s, int topo, const bc_opts_t *o, pdl_port_picker_t *pp, uint32_t nblocks)
{
    memset(s, 0, sizeof(*s));
    s->name = bc_topos[topo].name;
    s->P = bc_topos[topo].P;
    s->D = bc_topos[topo].D;
    s->layers = o->model->num_layers;
    pthread_mutex_init(&s->mu, NULL);
    pdl__clock_cond_init(&s->cv);
    s->prod = bc_instance(o, pp, PDL_ROLE_PRODUCER, s->P, nblocks);
    s->cons = s->prod ? bc_instance(o, pp, PDL_ROLE_CONSUMER, s->D, nblocks) : NULL;
    if (s->cons == NULL)
        return false;
    pdl_instance_set_event_fn(s->prod, bc_on_event, s);
    pdl_error_t e;
    if (bc_mirror(s, o, &e) != PDL_OK) {
        fprintf(stderr, "pdlink bench: %s engine-only set-up: %s\n", s->name, e.msg);
        return false;
    }
    return true;
}

/* ---- the KV pattern: every 8 bytes a function of (seed, layer, global head, block index, half, word) ---- */

static uint64_t bc_word(uint64_t seed, int layer, int ghead, size_t bidx, int half, uint64_t w)
{
    uint64_t h = seed * 0x9E3779B97F4A7C15ull ^ (uint64_t)layer << 48 ^ (uint64_t)ghead << 40 ^ (uint64_t)bidx << 24 ^
                 (uint64_t)half << 20 ^ w;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 29);
}

/* Fill (bad == NULL) or check one rank's blocks; `layer0` is layer 0 of the rank's region (HND order). */
/* Checking, the rows of the last block from token `used_last` on must be zero (the hold zeroed them). */
static void bc_walk(uint8_t *layer0, const pdl_kv_geometry_t *g, int layers, int ghead0, const uint32_t *blocks,
                    size_t n, uint64_t seed, uint64_t used_last, uint64_t *bad, uint64_t *checked)
{
    const uint64_t hb = (uint64_t)g->block_size * g->head_dim * g->elem_size; /* one head of one block */
    const uint64_t row = (uint64_t)g->head_dim * g->elem_size;
    for (int l = 0; l < layers; l++)
        for (size_t i = 0; i < n; i++)
            for (int half = 0; half < pdl_layout_num_halves(g); half++)
                for (uint32_t lh = 0; lh < g->num_heads; lh++) {
                    uint8_t *p = layer0 + (uint64_t)l * bc_layer_len(g) + pdl_layout_half_offset(g, blocks[i], half) +
                                 lh * hb;
                    for (uint64_t w = 0; w < hb / 8; w++) {
                        uint64_t want = bc_word(seed, l, ghead0 + (int)lh, i, half, w), got;
                        if (bad != NULL && i == n - 1 && 8 * w / row >= used_last)
                            want = 0;
                        if (bad == NULL) {
                            memcpy(p + 8 * w, &want, 8);
                            continue;
                        }
                        memcpy(&got, p + 8 * w, 8);
                        *bad += got != want ? 8 : 0;
                    }
                    if (checked)
                        *checked += hb;
                }
}

static int bc_first_head(const bc_opts_t *o, int tp, int rank)
{
    int first = 0, count = 0;
    pdl_topo_heads(tp, o->model->total_kv_heads, o->model->is_mla, rank, &first, &count, NULL);
    return first;
}

/* Fill the producer side (instance or mirror) or check the consumer side; returns mismatching bytes. */
static uint64_t bc_kv(bc_setup_t *s, const bc_opts_t *o, bool mirror, bool check, const uint32_t *blocks, size_t n,
                      uint64_t seed, uint64_t *checked)
{
    uint64_t bad = 0;
    int tp = check ? s->D : s->P;
    pdl_instance_t *inst = check ? s->cons : s->prod;
    for (int r = 0; r < tp; r++) {
        const pdl_kv_geometry_t *g = pdl_instance_geometry(inst, r);
        uint8_t *base = mirror ? pdl_mem_ptr(check ? s->cm[r] : s->pm[r]) : pdl_instance_kv_layer(inst, r, 0);
        /* The connector's hold zeroes the last block's rows past the prompt; the engine path moves them. */
        uint64_t bs = g->block_size, used = mirror || s->tokens <= 0 ? bs : (uint64_t)s->tokens - (n - 1) * bs;
        bc_walk(base, g, s->layers, bc_first_head(o, tp, r), blocks, n, seed, used, check ? &bad : NULL, checked);
    }
    return bad;
}

/* ---- samples ------------------------------------------------------------------------------------- */

typedef struct bc_stats {
    uint64_t verified, bad; /* bytes compared, bytes that differed */
    int transfers;          /* transfers whose every byte was compared */
    int failures;           /* transfers that failed */
} bc_stats_t;

typedef struct bc_sample {
    double gbps;
    uint64_t bytes; /* per transfer */
    double pull_us[BC_MAX_REPS];
    double release_us[BC_MAX_REPS * PDL_TOPO_MAX_TP];
    double cold_rt_us[BC_MAX_REPS];
    int npull, nrelease, ncold;
} bc_sample_t;

static double bc_zmq_rt(struct bc_zmq *z, int n);

/* Release latencies of one finished transfer, one per producer rank, appended to smp. */
static void bc_release_lat(bc_setup_t *s, const pdl_pull_t *pull, bc_sample_t *smp)
{
    uint64_t last_send[PDL_TOPO_MAX_TP] = {0};
    for (int d = 0; d < s->D; d++) {
        int first = 0, count = 0;
        if (pdl_topo_group(s->P, s->D, d, &first, &count, NULL) != PDL_OK)
            continue;
        uint64_t t = pdl_pull_release_sent_ns(pull, d);
        for (int p = first; p < first + count; p++)
            last_send[p] = t > last_send[p] ? t : last_send[p];
    }
    pthread_mutex_lock(&s->mu);
    for (int p = 0; p < s->P; p++)
        if (last_send[p] && s->report_ns[p] >= last_send[p])
            smp->release_us[smp->nrelease++] = (double)(s->report_ns[p] - last_send[p]) / 1e3;
    pthread_mutex_unlock(&s->mu);
}

/* One connector transfer: returns the timed ns (0 on failure, counted in st). */
static uint64_t bc_conn_one(bc_setup_t *s, const bc_opts_t *o, size_t nblk, bc_sample_t *smp, bc_stats_t *st,
                            uint32_t *pblk_out, uint32_t *cblk_out)
{
    uint32_t pblk[256], cblk[256];
    pdl_error_t e;
    uint64_t seed = (uint64_t)++s->seq;
    if (pdl_instance_alloc_blocks(s->prod, nblk, pblk, &e) != PDL_OK ||
        pdl_instance_alloc_blocks(s->cons, nblk, cblk, &e) != PDL_OK) {
        fprintf(stderr, "pdlink bench: %s: %s\n", s->name, e.msg);
        st->failures++;
        return 0;
    }
    bc_kv(s, o, false, false, pblk, nblk, seed, NULL); /* the "prefill": untimed */
    pthread_mutex_lock(&s->mu);
    snprintf(s->tid, sizeof(s->tid), "bench-%d", s->seq);
    s->freed = false;
    memset(s->report_ns, 0, sizeof(s->report_ns));
    pthread_mutex_unlock(&s->mu);

    uint64_t t0 = pdl__clock_now_ns();
    pdl_pull_t *pull = NULL;
    pdl_kv_params_t kp;
    pdl_status_t rc = s->tokens > 0 ? pdl_instance_zero_tail(s->prod, pblk, nblk, (uint64_t)s->tokens, &e) : PDL_OK;
    if (rc == PDL_OK)
        rc = pdl_instance_hold(s->prod, s->tid, pblk, nblk, &e);
    bool held = rc == PDL_OK;
    if (rc == PDL_OK && (rc = pdl_instance_params(s->prod, s->tid, pblk, nblk, &kp, &e)) == PDL_OK) {
        rc = pdl_instance_pull(s->cons, &kp, NULL, cblk, nblk, &pull, &e);
        pdl_kv_params_clear(&kp);
    }
    if (rc == PDL_OK)
        rc = pdl_pull_wait(pull, BC_WAIT_MS, &e);
    uint64_t tpull = pdl__clock_now_ns();
    uint64_t deadline = pdl__clock_deadline_ms(BC_WAIT_MS);
    pthread_mutex_lock(&s->mu);
    while (rc == PDL_OK && !s->freed && pdl__clock_cond_wait(&s->cv, &s->mu, deadline))
        ;
    bool freed = s->freed;
    pthread_mutex_unlock(&s->mu);
    uint64_t t1 = pdl__clock_now_ns();
    double cold = s->probe ? bc_zmq_rt(s->probe, 1) : -1; /* untimed: see the top of the file */
    if (cold > 0 && smp->ncold < BC_MAX_REPS)
        smp->cold_rt_us[smp->ncold++] = cold;

    if (rc != PDL_OK || !freed) {
        fprintf(stderr, "pdlink bench: %s transfer %s: %s\n", s->name, s->tid, rc != PDL_OK ? e.msg : "never freed");
        st->failures++;
    } else {
        st->bad += bc_kv(s, o, false, true, cblk, nblk, seed, &st->verified);
        st->transfers++;
        smp->bytes = pdl_pull_bytes(pull);
        smp->pull_us[smp->npull++] = (double)(tpull - t0) / 1e3;
        bc_release_lat(s, pull, smp);
    }
    pdl_pull_free(pull);
    pdl_instance_free_blocks(s->cons, cblk, nblk);
    if (!held) /* else they are the instance's, freed by its fan-in or its reaper */
        pdl_instance_free_blocks(s->prod, pblk, nblk);
    if (pblk_out) {
        memcpy(pblk_out, pblk, nblk * sizeof(*pblk));
        memcpy(cblk_out, cblk, nblk * sizeof(*cblk));
    }
    return rc == PDL_OK && freed ? t1 - t0 : 0;
}

static void bc_conn_sample(bc_setup_t *s, const bc_opts_t *o, size_t nblk, bc_sample_t *smp, bc_stats_t *st)
{
    memset(smp, 0, sizeof(*smp));
    uint64_t ns = 0, bytes = 0;
    for (int i = 0; i < o->reps; i++) {
        uint64_t t = bc_conn_one(s, o, nblk, smp, st, NULL, NULL);
        ns += t;
        bytes += t ? smp->bytes : 0;
    }
    smp->gbps = ns ? (double)bytes / (double)ns : 0;
}

/* The engine-only batches of one transfer: one per consumer rank and producer rank of its plan, every
 * layer's descriptors in it (built as the connector builds them). */
typedef struct bc_batches {
    pdl_descv_t dv[PDL_TOPO_MAX_TP][PDL_TOPO_MAX_TP]; /* [d][p] */
    uint64_t bytes, ndescs;
} bc_batches_t;

static pdl_status_t bc_build(bc_setup_t *s, const uint32_t *pblk, const uint32_t *cblk, size_t nblk, bc_batches_t *b,
                             pdl_error_t *err)
{
    memset(b, 0, sizeof(*b));
    for (int d = 0; d < s->D; d++) {
        const pdl_kv_geometry_t *lg = pdl_instance_geometry(s->cons, d);
        const pdl_read_plan_t *pl = &s->plan[d];
        for (int p = 0; p < s->P; p++) {
            pdl_plan_piece_t pieces[PDL_TOPO_MAX_TP];
            int np = 0;
            for (int i = 0; i < pl->num_pieces; i++)
                if (pl->pieces[i].producer_rank == p)
                    pieces[np++] = pl->pieces[i];
            if (np == 0)
                continue;
            const pdl_kv_geometry_t *rg = pdl_instance_geometry(s->prod, p);
            for (int l = 0; l < s->layers; l++) {
                pdl_status_t st = pdl_layout_build_descs(lg, rg, PDL_DIR_READ, pieces, np, cblk, pblk, nblk,
                                                         (uint64_t)l * bc_layer_len(lg), (uint64_t)l * bc_layer_len(rg),
                                                         &b->dv[d][p], err);
                if (st != PDL_OK)
                    return st;
            }
            b->bytes += pdl_layout_total_bytes(&b->dv[d][p]);
            b->ndescs += b->dv[d][p].n;
        }
    }
    return PDL_OK;
}

static void bc_batches_free(bc_batches_t *b)
{
    for (int d = 0; d < PDL_TOPO_MAX_TP; d++)
        for (int p = 0; p < PDL_TOPO_MAX_TP; p++)
            pdl_descv_free(&b->dv[d][p]);
}

/* One engine-only transfer: every batch posted, then every batch waited for. Returns ns, 0 on failure. */
static uint64_t bc_engine_one(bc_setup_t *s, const bc_batches_t *b)
{
    pdl_batch_t *all[PDL_TOPO_MAX_TP * PDL_TOPO_MAX_TP];
    size_t n = 0;
    bool ok = true;
    pdl_error_t e;
    uint64_t t0 = pdl__clock_now_ns();
    for (int d = 0; d < s->D && ok; d++)
        for (int p = 0; p < s->P && ok; p++)
            if (b->dv[d][p].n > 0) {
                ok = pdl_session_post(s->sess[d][p], PDL_OP_READ, b->dv[d][p].v, b->dv[d][p].n, &all[n], &e) == PDL_OK;
                n += ok;
            }
    for (size_t i = 0; i < n; i++) {
        ok &= pdl_batch_wait(all[i], BC_WAIT_MS, &e) == PDL_OK;
        pdl_batch_free(all[i]);
    }
    uint64_t t1 = pdl__clock_now_ns();
    if (!ok)
        fprintf(stderr, "pdlink bench: %s engine-only: %s\n", s->name, e.msg);
    return ok ? t1 - t0 : 0;
}

static double bc_engine_sample(bc_setup_t *s, const bc_opts_t *o, const bc_batches_t *b, const uint32_t *pblk,
                               const uint32_t *cblk, size_t nblk, bc_stats_t *st)
{
    uint64_t ns = 0, bytes = 0;
    for (int i = 0; i < o->reps; i++) {
        uint64_t seed = (uint64_t)++s->seq;
        bc_kv(s, o, true, false, pblk, nblk, seed, NULL);
        uint64_t t = bc_engine_one(s, b);
        if (t == 0) {
            st->failures++;
            continue;
        }
        st->bad += bc_kv(s, o, true, true, cblk, nblk, seed, &st->verified);
        st->transfers++;
        ns += t;
        bytes += b->bytes;
    }
    return ns ? (double)bytes / (double)ns : 0;
}

/* ---- the ZeroMQ round trip: DEALER -> ROUTER -> DEALER, the release's bytes ---------------------- */

typedef struct bc_zmq {
    /* One context per end, as the two instances have (and two processes would): one shared context
     * serves both ends from one I/O thread, which a release never has. */
    void *rctx, *dctx, *router, *dealer;
    pthread_t echo;
    bool running;
    pdl_bytes_t msg;
} bc_zmq_t;

static void *bc_zmq_echo(void *arg)
{
    bc_zmq_t *z = arg;
    for (;;) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        if (zmq_msg_recv(&id, z->router, 0) < 0 || zmq_msg_recv(&body, z->router, 0) < 0) {
            zmq_msg_close(&id);
            zmq_msg_close(&body);
            return NULL; /* the context was shut down */
        }
        bool stop = zmq_msg_size(&body) == 0;
        zmq_msg_send(&id, z->router, ZMQ_SNDMORE);
        zmq_msg_send(&body, z->router, 0);
        zmq_msg_close(&id);
        zmq_msg_close(&body);
        if (stop)
            return NULL;
    }
}

static bool bc_zmq_init(bc_zmq_t *z)
{
    memset(z, 0, sizeof(*z));
    pdl_msg_t m;
    pdl_msg_init(&m, PDL_MSG_RELEASE);
    snprintf(m.transfer_id, sizeof(m.transfer_id), "bench-%d", 100000);
    m.consumer_tp_size = 8;
    m.producer_tp_size = 8;
    m.status = PDL_RELEASE_OK;
    pdl_status_t st = pdl_wire_encode_msg(&m, &z->msg, NULL);
    pdl_msg_clear(&m);
    z->rctx = zmq_ctx_new();
    z->dctx = zmq_ctx_new();
    z->router = z->rctx ? zmq_socket(z->rctx, ZMQ_ROUTER) : NULL;
    z->dealer = z->dctx ? zmq_socket(z->dctx, ZMQ_DEALER) : NULL;
    if (st != PDL_OK || z->router == NULL || z->dealer == NULL || zmq_bind(z->router, "tcp://127.0.0.1:*") != 0)
        return false;
    char ep[128];
    size_t len = sizeof(ep);
    int zero = 0;
    zmq_setsockopt(z->router, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(z->dealer, ZMQ_LINGER, &zero, sizeof(zero));
    if (zmq_getsockopt(z->router, ZMQ_LAST_ENDPOINT, ep, &len) != 0 || zmq_connect(z->dealer, ep) != 0)
        return false;
    z->running = pthread_create(&z->echo, NULL, bc_zmq_echo, z) == 0;
    return z->running;
}

/* Median round trip of `n` messages, in us (< 0 on failure). */
static double bc_zmq_rt(struct bc_zmq *z, int n)
{
    double v[1000];
    n = n > 1000 ? 1000 : n;
    for (int i = 0; i < n; i++) {
        uint64_t t0 = pdl__clock_now_ns();
        char buf[512];
        if (zmq_send(z->dealer, z->msg.data, z->msg.len, 0) < 0 || zmq_recv(z->dealer, buf, sizeof(buf), 0) < 0)
            return -1;
        v[i] = (double)(pdl__clock_now_ns() - t0) / 1e3;
    }
    return pdl_pairs_median(v, n);
}

static void bc_zmq_fini(bc_zmq_t *z)
{
    if (z->running) {
        char c = 0;
        zmq_send(z->dealer, &c, 0, 0); /* an empty body stops the echo thread */
        pthread_join(z->echo, NULL);
    }
    if (z->dealer)
        zmq_close(z->dealer);
    if (z->router)
        zmq_close(z->router);
    if (z->rctx)
        zmq_ctx_term(z->rctx);
    if (z->dctx)
        zmq_ctx_term(z->dctx);
    pdl_bytes_free(&z->msg);
}

/* ---- rows ---------------------------------------------------------------------------------------- */

typedef struct bc_row {
    const char *topo;
    int tokens;
    uint64_t bytes;
    double conn, engine, memcpy_gbps; /* medians over the pairs */
    bc_ratio_t vs_engine, vs_memcpy;
    double pull_p50, pull_p99;
    double zero_us; /* pdl_instance_zero_tail of the row's prompt, every rank (inside "conn" too) */
    double rel_p50, rel_p99, zmq_rt, zmq_cold;
    bc_ratio_t rel_vs_zmq, rel_vs_cold;
} bc_row_t;

typedef struct bc_split_row {
    const char *topo, *base;
    int tokens;
    uint64_t bytes;
    double split, homog;
    uint64_t descs_split, descs_homog; /* descriptors of one transfer, every rank */
    bc_ratio_t ratio, engine_ratio;
} bc_split_row_t;

static size_t bc_nblk(const bc_opts_t *o, int tokens) { return (size_t)((tokens + o->block_size - 1) / o->block_size); }

/* Warm a setup for `nblk` blocks (untimed: handshakes, lanes, DEALER connections and first touch of the
 * blocks) and build the engine-only batches on the block ids of a connector transfer (the allocator hands
 * the same ids out again). NULL on failure (logged). */
static bc_batches_t *bc_prepare(bc_setup_t *s, const bc_opts_t *o, size_t nblk, bc_stats_t *st, uint32_t *pblk,
                                uint32_t *cblk)
{
    bc_sample_t *smp = malloc(sizeof(*smp));
    if (smp == NULL)
        return NULL;
    uint64_t moved = 0;
    for (int i = 0; i < 4; i++) { /* 3 warm-ups, then the transfer whose block ids the batches use */
        memset(smp, 0, sizeof(*smp));
        moved = bc_conn_one(s, o, nblk, smp, st, i == 3 ? pblk : NULL, i == 3 ? cblk : NULL);
    }
    free(smp);
    if (moved == 0)
        return NULL;
    bc_batches_t *b = malloc(sizeof(*b));
    pdl_error_t e;
    if (b == NULL || bc_build(s, pblk, cblk, nblk, b, &e) != PDL_OK) {
        fprintf(stderr, "pdlink bench: %s descriptors: %s\n", s->name, b ? e.msg : "out of memory");
        if (b)
            bc_batches_free(b);
        free(b);
        return NULL;
    }
    bc_engine_sample(s, o, b, pblk, cblk, nblk, st); /* warm the mirror */
    return b;
}

static bool bc_row_run(bc_setup_t *s, const bc_opts_t *o, int tokens, pdl_ceiling_memcpy_t *mc, bc_zmq_t *z,
                       uint8_t *src, uint8_t *dst, bc_stats_t *st, bc_row_t *row)
{
    /* Too large for the stack (a release sample per producer rank per transfer): one allocation per row. */
    struct {
        bc_sample_t smp;
        double pulls[BC_MAX_PAIRS * BC_MAX_REPS], rels[BC_MAX_PAIRS * BC_MAX_REPS * PDL_TOPO_MAX_TP];
    } *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return false;
    bc_sample_t *smp = &w->smp;
    double *pulls = w->pulls, *rels = w->rels;
    double conn[BC_MAX_PAIRS], eng[BC_MAX_PAIRS], mem[BC_MAX_PAIRS], rel[BC_MAX_PAIRS], zrt[BC_MAX_PAIRS],
        zcold[BC_MAX_PAIRS];
    int npulls = 0, nrels = 0;
    size_t nblk = bc_nblk(o, tokens);
    uint32_t pblk[256], cblk[256];
    s->tokens = tokens;
    bc_batches_t *b = bc_prepare(s, o, nblk, st, pblk, cblk);
    if (b == NULL) {
        free(w);
        return false;
    }
    for (int i = 0; i < o->pairs; i++) {
        bc_conn_sample(s, o, nblk, smp, st);
        conn[i] = smp->gbps;
        for (int k = 0; k < smp->npull; k++)
            pulls[npulls++] = smp->pull_us[k];
        for (int k = 0; k < smp->nrelease; k++)
            rels[nrels++] = smp->release_us[k];
        rel[i] = pdl_pairs_median(smp->release_us, smp->nrelease);
        zcold[i] = pdl_pairs_median(smp->cold_rt_us, smp->ncold);
        zrt[i] = bc_zmq_rt(z, o->zmq_rts);
        eng[i] = bc_engine_sample(s, o, b, pblk, cblk, nblk, st);
        mem[i] = pdl_ceiling_memcpy_run(mc, dst, src, (size_t)b->bytes, o->reps);
    }
    /* The hold's zeroing alone, after the samples (it writes the producer's blocks, which no sample reads). */
    pdl_error_t ze;
    uint64_t z0 = pdl__clock_now_ns();
    for (int i = 0; i < 100; i++)
        if (pdl_instance_zero_tail(s->prod, pblk, nblk, (uint64_t)tokens, &ze) != PDL_OK)
            break;
    row->zero_us = (double)(pdl__clock_now_ns() - z0) / 100 / 1e3;
    row->topo = s->name;
    row->tokens = tokens;
    row->bytes = b->bytes;
    row->vs_engine = bc_pairs_ratio(conn, eng, o->pairs);
    row->vs_memcpy = bc_pairs_ratio(conn, mem, o->pairs);
    row->rel_vs_zmq = bc_pairs_ratio(rel, zrt, o->pairs);
    row->rel_vs_cold = bc_pairs_ratio(rel, zcold, o->pairs);
    row->rel_vs_zmq.above = row->rel_vs_cold.above = false; /* latencies: above 1 is the expected side */
    row->zmq_cold = pdl_pairs_median(zcold, o->pairs);
    row->conn = pdl_pairs_median(conn, o->pairs);
    row->engine = pdl_pairs_median(eng, o->pairs);
    row->memcpy_gbps = pdl_pairs_median(mem, o->pairs);
    row->zmq_rt = pdl_pairs_median(zrt, o->pairs);
    row->pull_p50 = pdl_pairs_quantile(pulls, npulls, 0.5);
    row->pull_p99 = pdl_pairs_quantile(pulls, npulls, 0.99);
    row->rel_p50 = pdl_pairs_quantile(rels, nrels, 0.5);
    row->rel_p99 = pdl_pairs_quantile(rels, nrels, 0.99);
    bc_batches_free(b);
    free(b);
    free(w);
    return true;
}

/* Split against homogeneous: connector samples alternating, and the engine-only batches of both (the same
 * bytes in smaller pieces, no ranks or threads), which says how much of a gap the descriptors cause. */
static bool bc_split_run(bc_setup_t *split, bc_setup_t *homog, const bc_opts_t *o, int tokens, bc_stats_t *st,
                         bc_split_row_t *row)
{
    bc_sample_t *smp = calloc(1, sizeof(*smp));
    if (smp == NULL)
        return false;
    double a[BC_MAX_PAIRS], b[BC_MAX_PAIRS], ea[BC_MAX_PAIRS], eb[BC_MAX_PAIRS];
    size_t nblk = bc_nblk(o, tokens);
    uint32_t sp[256], sc[256], hp[256], hc[256];
    bc_batches_t *bs = bc_prepare(split, o, nblk, st, sp, sc);
    bc_batches_t *bh = bs ? bc_prepare(homog, o, nblk, st, hp, hc) : NULL;
    if (bh == NULL) {
        if (bs)
            bc_batches_free(bs);
        free(bs);
        free(smp);
        return false;
    }
    for (int i = 0; i < o->pairs; i++) {
        bc_conn_sample(split, o, nblk, smp, st);
        a[i] = smp->gbps;
        row->bytes = smp->bytes;
        bc_conn_sample(homog, o, nblk, smp, st);
        b[i] = smp->gbps;
        ea[i] = bc_engine_sample(split, o, bs, sp, sc, nblk, st);
        eb[i] = bc_engine_sample(homog, o, bh, hp, hc, nblk, st);
    }
    row->topo = split->name;
    row->base = homog->name;
    row->tokens = tokens;
    row->descs_split = bs->ndescs;
    row->descs_homog = bh->ndescs;
    row->ratio = bc_pairs_ratio(a, b, o->pairs);
    row->engine_ratio = bc_pairs_ratio(ea, eb, o->pairs);
    row->split = pdl_pairs_median(a, o->pairs);
    row->homog = pdl_pairs_median(b, o->pairs);
    bc_batches_free(bs);
    bc_batches_free(bh);
    free(bs);
    free(bh);
    free(smp);
    return true;
}

/* ---- output -------------------------------------------------------------------------------------- */

static void bc_ratio_text(char *buf, size_t cap, bc_ratio_t r)
{
    if (r.wide)
        snprintf(buf, cap, "spread %.2f-%.2f", r.min, r.max);
    else
        snprintf(buf, cap, "%.2f (%.2f-%.2f)%s", r.median, r.min, r.max, r.above ? " >1" : "");
}

static json_t *bc_ratio_json(bc_ratio_t r)
{
    json_t *j = json_object();
    json_object_set_new(j, "median", r.wide ? json_null() : json_real(r.median));
    json_object_set_new(j, "min", json_real(r.min));
    json_object_set_new(j, "max", json_real(r.max));
    json_object_set_new(j, "spread_too_wide", json_boolean(r.wide));
    return j;
}

static void bc_print(const bc_opts_t *o, const bc_row_t *rows, int nrows, const bc_split_row_t *sr, int nsplit,
                     const bc_stats_t *st)
{
    char a[64], b[64];
    printf("pdlink bench --connector: %s, block_size %d, backend %s, kv_integrity %s, %d pairs of %d transfers per "
           "sample\n",
           o->model->name, o->block_size, pdl_backend_name(o->backend), pdl_kv_integrity_name(o->integrity), o->pairs,
           o->reps);
    printf("\n%-6s %6s %10s %8s %8s %8s  %-22s %-22s %9s %9s %9s\n", "topo", "tokens", "bytes", "conn", "engine",
           "memcpy", "conn/engine", "conn/memcpy", "pull p50", "pull p99", "zero");
    printf("%-6s %6s %10s %8s %8s %8s  %-22s %-22s %9s %9s %9s\n", "", "", "", "GB/s", "GB/s", "GB/s", "median (min-max)",
           "median (min-max)", "us", "us", "us");
    for (int i = 0; i < nrows; i++) {
        const bc_row_t *r = &rows[i];
        bc_ratio_text(a, sizeof(a), r->vs_engine);
        bc_ratio_text(b, sizeof(b), r->vs_memcpy);
        printf("%-6s %6d %10" PRIu64 " %8.2f %8.2f %8.2f  %-22s %-22s %9.0f %9.0f %9.1f\n", r->topo, r->tokens, r->bytes,
               r->conn, r->engine, r->memcpy_gbps, a, b, r->pull_p50, r->pull_p99, r->zero_us);
    }
    printf("\nrelease: consumer send -> producer report, next to a DEALER->ROUTER->DEALER round trip, hot (back to\n"
           "back) and cold (one after each transfer)\n");
    printf("%-6s %6s %9s %9s %9s %9s  %-22s %-22s\n", "topo", "tokens", "p50 us", "p99 us", "rt hot", "rt cold",
           "release/rt hot", "release/rt cold");
    for (int i = 0; i < nrows; i++) {
        const bc_row_t *r = &rows[i];
        bc_ratio_text(a, sizeof(a), r->rel_vs_zmq);
        bc_ratio_text(b, sizeof(b), r->rel_vs_cold);
        printf("%-6s %6d %9.1f %9.1f %9.1f %9.1f  %-22s %-22s\n", r->topo, r->tokens, r->rel_p50, r->rel_p99, r->zmq_rt,
               r->zmq_cold, a, b);
    }
    if (nsplit > 0) {
        printf("\nsplit heads: connector GB/s against the homogeneous plan moving the same bytes; the engine-only\n"
               "ratio of the same two descriptor lists (one thread, no ranks) isolates what the smaller pieces cost\n");
        printf("%-6s %-6s %6s %10s %7s %7s %8s %8s  %-22s %-22s\n", "split", "homog", "tokens", "bytes", "descs",
               "descs", "split", "homog", "conn split/homog", "engine split/homog");
        for (int i = 0; i < nsplit; i++) {
            bc_ratio_text(a, sizeof(a), sr[i].ratio);
            bc_ratio_text(b, sizeof(b), sr[i].engine_ratio);
            printf("%-6s %-6s %6d %10" PRIu64 " %7" PRIu64 " %7" PRIu64 " %8.2f %8.2f  %-22s %-22s\n", sr[i].topo,
                   sr[i].base, sr[i].tokens, sr[i].bytes, sr[i].descs_split, sr[i].descs_homog, sr[i].split,
                   sr[i].homog, a, b);
        }
    }
    printf("\nverified %" PRIu64 " bytes, %" PRIu64 " differed, %d transfers failed. \">1\": pdlink beat its "
           "reference in the median pair (conn/engine: the connector's ranks copy in parallel, the engine-only "
           "batches run on one thread).\n",
           st->verified, st->bad, st->failures);
}

static int bc_write_json(const bc_opts_t *o, const bc_row_t *rows, int nrows, const bc_split_row_t *sr, int nsplit,
                         const bc_stats_t *st)
{
    json_t *root = json_object(), *arr = json_array(), *rel = json_array(), *spl = json_array();
    json_object_set_new(root, "model", json_string(o->model->name));
    json_object_set_new(root, "block_size", json_integer(o->block_size));
    json_object_set_new(root, "backend", json_string(pdl_backend_name(o->backend)));
    json_object_set_new(root, "kv_integrity", json_string(pdl_kv_integrity_name(o->integrity)));
    json_object_set_new(root, "pairs", json_integer(o->pairs));
    json_object_set_new(root, "reps", json_integer(o->reps));
    json_object_set_new(root, "gb", json_string("1e9 bytes"));
    for (int i = 0; i < nrows; i++) {
        const bc_row_t *r = &rows[i];
        json_t *j = json_object();
        json_object_set_new(j, "topology", json_string(r->topo));
        json_object_set_new(j, "tokens", json_integer(r->tokens));
        json_object_set_new(j, "bytes", json_integer((json_int_t)r->bytes));
        json_object_set_new(j, "connector_gbps", json_real(r->conn));
        json_object_set_new(j, "engine_gbps", json_real(r->engine));
        json_object_set_new(j, "memcpy_gbps", json_real(r->memcpy_gbps));
        json_object_set_new(j, "connector_vs_engine", bc_ratio_json(r->vs_engine));
        json_object_set_new(j, "connector_vs_memcpy", bc_ratio_json(r->vs_memcpy));
        json_object_set_new(j, "zero_tail_us", json_real(r->zero_us));
        json_object_set_new(j, "pull_p50_us", json_real(r->pull_p50));
        json_object_set_new(j, "pull_p99_us", json_real(r->pull_p99));
        json_array_append_new(arr, j);
        j = json_object();
        json_object_set_new(j, "topology", json_string(r->topo));
        json_object_set_new(j, "tokens", json_integer(r->tokens));
        json_object_set_new(j, "release_p50_us", json_real(r->rel_p50));
        json_object_set_new(j, "release_p99_us", json_real(r->rel_p99));
        json_object_set_new(j, "zmq_rt_us", json_real(r->zmq_rt));
        json_object_set_new(j, "release_vs_zmq_rt", bc_ratio_json(r->rel_vs_zmq));
        json_object_set_new(j, "zmq_rt_cold_us", json_real(r->zmq_cold));
        json_object_set_new(j, "release_vs_zmq_rt_cold", bc_ratio_json(r->rel_vs_cold));
        json_array_append_new(rel, j);
    }
    for (int i = 0; i < nsplit; i++) {
        json_t *j = json_object();
        json_object_set_new(j, "topology", json_string(sr[i].topo));
        json_object_set_new(j, "homogeneous", json_string(sr[i].base));
        json_object_set_new(j, "tokens", json_integer(sr[i].tokens));
        json_object_set_new(j, "bytes", json_integer((json_int_t)sr[i].bytes));
        json_object_set_new(j, "split_gbps", json_real(sr[i].split));
        json_object_set_new(j, "homogeneous_gbps", json_real(sr[i].homog));
        json_object_set_new(j, "split_vs_homogeneous", bc_ratio_json(sr[i].ratio));
        json_object_set_new(j, "engine_split_vs_homogeneous", bc_ratio_json(sr[i].engine_ratio));
        json_object_set_new(j, "descriptors_split", json_integer((json_int_t)sr[i].descs_split));
        json_object_set_new(j, "descriptors_homogeneous", json_integer((json_int_t)sr[i].descs_homog));
        json_array_append_new(spl, j);
    }
    json_object_set_new(root, "rows", arr);
    json_object_set_new(root, "release", rel);
    json_object_set_new(root, "split", spl);
    json_object_set_new(root, "verified_bytes", json_integer((json_int_t)st->verified));
    json_object_set_new(root, "verified_transfers", json_integer(st->transfers));
    json_object_set_new(root, "bad_bytes", json_integer((json_int_t)st->bad));
    json_object_set_new(root, "failed_transfers", json_integer(st->failures));
    int rc = strcmp(o->json, "-") == 0 ? json_dumpf(root, stdout, JSON_INDENT(1)) : json_dump_file(root, o->json, JSON_INDENT(1));
    json_decref(root);
    if (rc != 0)
        fprintf(stderr, "pdlink bench: cannot write %s\n", o->json);
    return rc;
}

/* ---- options and main ---------------------------------------------------------------------------- */

static pdl_status_t bc_set_model(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                 pdl_error_t *err)
{
    (void)row, (void)done_p;
    bc_opts_t *o = opts;
    if ((o->model = pdl_model_find(v)) == NULL || o->model->is_mla)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': an unknown preset, or an MLA one (its heads are not split)",
                             flag, v);
    return PDL_OK;
}

static pdl_status_t bc_set_topos(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                 pdl_error_t *err)
{
    (void)row, (void)done_p;
    bc_opts_t *o = opts;
    memset(o->topo_on, 0, sizeof(o->topo_on));
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < BC_NTOPO && strcasecmp(t, bc_topos[k].name) != 0)
            k++;
        if (k == BC_NTOPO)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected names of 1P1D, P4/D8, P8/D4, P4/D4", flag, v);
        o->topo_on[k] = true;
    }
    return PDL_OK;
}

static pdl_status_t bc_set_backend(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                   pdl_error_t *err)
{
    (void)row, (void)done_p;
    int b = pdl_backend_parse(v);
    if (b != PDL_BACKEND_SHM && b != PDL_BACKEND_TCP && b != PDL_BACKEND_UCX)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected shm, tcp or ucx", flag, v);
    ((bc_opts_t *)opts)->backend = (pdl_backend_kind_t)b;
    return PDL_OK;
}

static pdl_status_t bc_set_integrity(void *opts, const pdl_optdef_t *row, const char *flag, const char *v,
                                     bool *done_p, pdl_error_t *err)
{
    (void)row, (void)done_p;
    for (int m = PDL_KV_INTEGRITY_OFF; m <= PDL_KV_INTEGRITY_FULL; m++)
        if (strcmp(v, pdl_kv_integrity_name((pdl_kv_integrity_t)m)) == 0) {
            ((bc_opts_t *)opts)->integrity = (pdl_kv_integrity_t)m;
            return PDL_OK;
        }
    return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected off, sample or full", flag, v);
}

#define BCO(field) offsetof(bc_opts_t, field)
static const pdl_optdef_t bc_rows[] = {
    {.name = "connector", .kind = PDL_OPT_FLAG, .off = BCO(connector),
     .help = "this benchmark (the engine's without it)"},
    {.name = "model", .kind = PDL_OPT_CALL, .metavar = "NAME", .def = "llama-3.1-8b", .set = bc_set_model,
     .help = "geometry preset, not MLA (`pdlink plan --help` lists them)"},
    {.name = "tokens", .kind = PDL_OPT_INT_LIST, .metavar = "LIST", .def = "16,64,256", .off = BCO(tokens),
     .off2 = BCO(ntokens), .lo = 1, .hi = 4096, .max_n = BC_MAX_TOKENS,
     .help = "prompt lengths; a length that leaves its last block part empty has that block's other rows zeroed "
             "before the hold, as pdlink-node does"},
    {.name = "topologies", .kind = PDL_OPT_CALL, .metavar = "LIST", .def = "1P1D,P4/D8,P8/D4,P4/D4",
     .set = bc_set_topos, .help = "of 1P1D (TP8->TP8), P4/D8, P8/D4, P4/D4"},
    {.name = "pairs", .kind = PDL_OPT_INT, .metavar = "N", .def = "7", .off = BCO(pairs), .lo = 5,
     .hi = BC_MAX_PAIRS - 1, .help = "alternating pairs per row"},
    {.name = "reps", .kind = PDL_OPT_INT, .metavar = "N", .def = "4", .off = BCO(reps), .lo = 1, .hi = BC_MAX_REPS,
     .help = "transfers per sample"},
    {.name = "block-size", .kind = PDL_OPT_INT, .metavar = "N", .def = "16", .off = BCO(block_size), .lo = 1,
     .hi = 1000, .help = "tokens per KV block"},
    {.name = "backend", .kind = PDL_OPT_CALL, .metavar = "NAME", .def = "shm", .set = bc_set_backend,
     .help = "shm, tcp or ucx (UCX_TLS honoured)"},
    {.name = "kv-integrity", .kind = PDL_OPT_CALL, .metavar = "MODE", .def = "sample", .set = bc_set_integrity,
     .help = "kv_integrity of both instances: off, sample or full (docs/integrity.md)"},
    {.name = "zmq-rts", .kind = PDL_OPT_INT, .metavar = "N", .def = "200", .off = BCO(zmq_rts), .lo = 1, .hi = 1000,
     .help = "ZeroMQ round trips per pair for the release comparison"},
    {.name = "json", .kind = PDL_OPT_STRING, .metavar = "FILE", .off = BCO(json),
     .help = "also write the rows as JSON (\"-\": stdout, instead of the table)"},
    {.name = "help", .kind = PDL_OPT_HELP, .help = "this text"},
    {0},
};
#undef BCO

static void bc_help_tail(FILE *f)
{
    fprintf(f,
            "\nOne prefill and one decode instance per topology in this process; per transfer the whole READ path\n"
            "(hold, plan, descriptors, engine batches, releases, fan-in, free) with no model compute, against the\n"
            "same descriptors posted straight to the engine and memcpy of the same bytes, alternating (connector,\n"
            "engine, memcpy) --pairs times (>= 5) with --reps transfers per sample. Ratios are medians of the\n"
            "per-pair ratios with min-max; a spread (q3 - q1) / median over %.2f prints \"spread\" instead.\n"
            "Every KV byte is written before and checked after each transfer, outside the clock.\n"
            "Exit status 1 if a byte differed or a transfer failed, 2 on a usage or set-up error.\n",
            PDL_PAIRS_SPREAD_MAX);
}

static const pdl_optab_t bc_table = {
    .prog = "pdlink bench --connector",
    .usage = "usage: pdlink bench --connector [--model NAME] [--tokens LIST] [--topologies LIST] [--pairs N]\n"
             "                    [--reps N] [--block-size N] [--backend shm|tcp|ucx] [--kv-integrity MODE]\n"
             "                    [--zmq-rts N] [--json FILE|-]\n\n",
    .rows = bc_rows,
    .help_tail = bc_help_tail,
};

/* Returns 0 to run, -1 after --help, 2 on a usage error (printed). */
static int bc_parse(int argc, char **argv, bc_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    pdl_error_t e;
    pdl_error_clear(&e);
    pdl_optab_result_t r = pdl_optab_parse(&bc_table, o, argc, argv, NULL, &e);
    if (r != PDL_OPTAB_GO) {
        if (r == PDL_OPTAB_USAGE)
            fprintf(stderr, "pdlink bench: %s\n", e.msg);
        return r == PDL_OPTAB_DONE ? -1 : 2;
    }
    int maxtok = 0;
    for (int i = 0; i < o->ntokens; i++)
        maxtok = o->tokens[i] > maxtok ? o->tokens[i] : maxtok;
    if (bc_nblk(o, maxtok) > 256 || (uint64_t)o->block_size * o->model->head_dim * o->model->elem_size % 8 != 0) {
        fprintf(stderr, "pdlink bench: %d tokens need more than 256 blocks of %d, or a head's block is not a "
                        "multiple of 8 bytes\n", maxtok, o->block_size);
        return 2;
    }
    return 0;
}

int pdl_bench_connector_main(int argc, char **argv)
{
    bc_opts_t o;
    int rc = bc_parse(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    int maxtok = 0;
    for (int i = 0; i < o.ntokens; i++)
        maxtok = o.tokens[i] > maxtok ? o.tokens[i] : maxtok;
    size_t maxblk = bc_nblk(&o, maxtok);
    /* The split rows need their homogeneous base. */
    bool need[BC_NTOPO];
    memcpy(need, o.topo_on, sizeof(need));
    if (o.topo_on[BC_T_P4D8] || o.topo_on[BC_T_P8D4])
        need[BC_T_P4D4] = true;
    bc_setup_t *setups = calloc(BC_NTOPO, sizeof(*setups)); /* large: per-rank engines, plans, sessions */
    bc_stats_t st = {0};
    bc_row_t rows[BC_NTOPO * BC_MAX_TOKENS];
    bc_split_row_t srows[2 * BC_MAX_TOKENS];
    int nrows = 0, nsplit = 0;
    bool inited[BC_NTOPO] = {0}, ok = true;
    pdl_port_picker_t pp;
    pdl_port_picker_init(&pp, ((uint64_t)getpid() << 32) ^ pdl__clock_now_ns());
    bc_zmq_t z;
    pdl_ceiling_memcpy_t *mc = pdl_ceiling_memcpy_create(2);
    uint64_t maxbytes = (uint64_t)maxblk * o.block_size * o.model->num_layers * 2 * o.model->total_kv_heads *
                        o.model->head_dim * o.model->elem_size;
    uint8_t *src = pdl_ceiling_alloc((size_t)maxbytes), *dst = pdl_ceiling_alloc((size_t)maxbytes);
    if (!bc_zmq_init(&z) || mc == NULL || src == NULL || dst == NULL || setups == NULL) {
        fprintf(stderr, "pdlink bench: set-up failed (ZeroMQ round-trip sockets, memcpy threads or %" PRIu64
                        " bytes of buffers)\n", maxbytes);
        ok = false;
    }
    for (int k = 0; k < BC_NTOPO && ok; k++)
        if (need[k]) {
            ok = inited[k] = bc_setup_init(&setups[k], k, &o, &pp, (uint32_t)(maxblk + 4));
            setups[k].probe = &z;
        }
    for (int k = 0; k < BC_NTOPO && ok; k++)
        for (int t = 0; o.topo_on[k] && t < o.ntokens && ok; t++) {
            ok = bc_row_run(&setups[k], &o, o.tokens[t], mc, &z, src, dst, &st, &rows[nrows]);
            nrows += ok;
        }
    for (int k = BC_T_P4D8; k <= BC_T_P8D4 && ok; k++)
        for (int t = 0; o.topo_on[k] && t < o.ntokens && ok; t++) {
            ok = bc_split_run(&setups[k], &setups[BC_T_P4D4], &o, o.tokens[t], &st, &srows[nsplit]);
            nsplit += ok;
        }
    if (ok) {
        if (o.json == NULL || strcmp(o.json, "-") != 0)
            bc_print(&o, rows, nrows, srows, nsplit, &st);
        if (o.json != NULL && bc_write_json(&o, rows, nrows, srows, nsplit, &st) != 0)
            ok = false;
    }
    for (int k = 0; k < BC_NTOPO && setups != NULL; k++)
        if (setups[k].name != NULL) /* begun, maybe not finished */
            bc_setup_free(&setups[k]);
    free(setups);
    bc_zmq_fini(&z);
    pdl_ceiling_memcpy_destroy(mc);
    if (src)
        pdl_ceiling_free(src, (size_t)maxbytes);
    if (dst)
        pdl_ceiling_free(dst, (size_t)maxbytes);
    if (!ok)
        return 2;
    return st.bad > 0 || st.failures > 0 ? 1 : 0;
}
