/*
 * fanin.c -- the held-transfer table of one producer instance: a record per transfer id holding each
 * rank's release fan-in and lease (states in fanin.h).
 *
 * Why one record with per-rank state in it, rather than a record in the instance plus a fan-in map per
 * rank: every rank of an instance holds the same transfers (a hold or a push names them all), so N
 * per-rank maps keyed by the same id were N copies of one key kept in step by hand -- a consumer that
 * went away had to be cancelled in every rank's map, and the instance counted "ranks resolved" beside
 * the fan-ins that resolved them. Here the record is the only place a held id lives: the owner's data
 * (its blocks), how many ranks are unresolved, and per rank the lease, the release count and the
 * consumer ranks seen. The other way round -- the owner's record embedding the fan-in state -- would
 * have left the releases of ids that are not held (parked, and late ones after the record left) with
 * no home but a second table.
 *
 * Storage: records, and terminal records (gone, with a rank finished through the fan-in), in hash maps
 * keyed by id (strmap.h: ids come from the network, so the hash is keyed). A record is one allocation:
 * the per-rank array (cfg.ranks entries) with the id behind it; when it becomes terminal it is kept as
 * it is, also in a FIFO ring so the oldest is forgotten first (upstream keeps the same kind of LRU of
 * 4096 terminal ids). Parked releases are a FIFO list per rank in arrival order: expiry
 * and eviction take from the head, a hold scans its rank's list for its id (bounded, default 1024), and
 * a flood aimed at one rank cannot push out another rank's.
 */
#include "connector/fanin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connector/strmap.h"
#include "pdlink/topo.h"

#define FANIN_RANK_WORDS (PDL_TOPO_MAX_TP / 64)

typedef enum fanin_state { ST_OPEN = 0, ST_HELD, ST_REPORTED, ST_EXPIRED, ST_DROPPED } fanin_state_t;

typedef struct fanin_rank {
    fanin_state_t state;
    bool resolved; /* by the owner (pdl__fanin_resolve) */
    int count;
    uint64_t deadline_ns;
    uint64_t seen[FANIN_RANK_WORDS]; /* consumer ranks already counted */
} fanin_rank_t;

typedef struct fanin_record {
    void *data;     /* the owner's; NULL once terminal */
    int unresolved; /* ranks the owner has not resolved */
    char *id;       /* behind rank[] (the ring needs the key to remove a terminal record from its map) */
    fanin_rank_t rank[];
} fanin_record_t;

typedef struct fanin_parked {
    struct fanin_parked *prev, *next;
    uint64_t arrival_ns;
    int64_t consumer_tp_size, consumer_tp_rank;
    bool failed;
    char sender[64]; /* numeric host ("" = unknown), checked when the hold comes */
    char id[];
} fanin_parked_t;

typedef struct fanin_park {
    fanin_parked_t *head, *tail;
    size_t len;
} fanin_park_t;

struct pdl_fanin {
    pdl_fanin_config_t cfg;
    pdl_strmap_t held;     /* id → fanin_record_t*: every record with a rank unresolved */
    pdl_strmap_t terminal; /* id → fanin_record_t*: gone, remembered for late/duplicate */
    fanin_record_t **ring;
    size_t ring_head, ring_len;
    fanin_park_t *park;     /* per rank */
    pdl_fanin_counters_t *c; /* per rank */
};

const char *pdl__fanin_result_name(pdl_fanin_result_t r)
{
    switch (r) {
    case PDL_FANIN_COUNTED: return "counted";
    case PDL_FANIN_REPORTED: return "reported";
    case PDL_FANIN_DUPLICATE: return "duplicate";
    case PDL_FANIN_LATE: return "late";
    case PDL_FANIN_PARKED: return "parked";
    case PDL_FANIN_INVALID: return "invalid";
    }
    return "?";
}

pdl_status_t pdl__fanin_create(const pdl_fanin_config_t *cfg, pdl_fanin_t **out, pdl_error_t *err)
{
    if (cfg == NULL || out == NULL || cfg->producer_tp <= 0 || cfg->producer_tp > PDL_TOPO_MAX_TP)
        return pdl_error_set(err, PDL_ERR_INVALID, "fan-in: producer TP %d outside [1, %d]",
                             cfg ? cfg->producer_tp : 0, PDL_TOPO_MAX_TP);
    if (cfg->first_rank < 0 || cfg->ranks < 1 || cfg->ranks > cfg->producer_tp - cfg->first_rank)
        return pdl_error_set(err, PDL_ERR_INVALID, "fan-in: ranks [%d, %d + %d) outside producer TP %d",
                             cfg->first_rank, cfg->first_rank, cfg->ranks, cfg->producer_tp);
    pdl_fanin_t *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "fan-in: out of memory");
    f->cfg = *cfg;
    if (f->cfg.max_parked == 0)
        f->cfg.max_parked = 1024;
    if (f->cfg.max_park_age_ns == 0)
        f->cfg.max_park_age_ns = cfg->defer_timeout_ns;
    if (f->cfg.max_terminal == 0)
        f->cfg.max_terminal = 4096;
    f->ring = calloc(f->cfg.max_terminal, sizeof(*f->ring));
    f->park = calloc((size_t)cfg->ranks, sizeof(*f->park));
    f->c = calloc((size_t)cfg->ranks, sizeof(*f->c));
    if (f->ring == NULL || f->park == NULL || f->c == NULL) {
        pdl__fanin_destroy(f);
        return pdl_error_set(err, PDL_ERR_NOMEM, "fan-in: out of memory");
    }
    *out = f;
    return PDL_OK;
}

static void free_record_value(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    free(value);
}

void pdl__fanin_destroy(pdl_fanin_t *f)
{
    if (f == NULL)
        return;
    pdl__strmap_foreach(&f->held, free_record_value, NULL);
    pdl__strmap_free(&f->held);
    for (size_t i = 0; f->ring != NULL && i < f->ring_len; i++)
        free(f->ring[(f->ring_head + i) % f->cfg.max_terminal]);
    pdl__strmap_free(&f->terminal);
    free(f->ring);
    for (int s = 0; f->park != NULL && s < f->cfg.ranks; s++) {
        fanin_parked_t *p = f->park[s].head;
        while (p) {
            fanin_parked_t *n = p->next;
            free(p);
            p = n;
        }
    }
    free(f->park);
    free(f->c);
    free(f);
}

/* The index of producer rank `rank` in the per-rank arrays; -1 when it is not counted here. */
static int slot_of(const pdl_fanin_t *f, int rank)
{
    int s = rank - f->cfg.first_rank;
    return s >= 0 && s < f->cfg.ranks ? s : -1;
}

static bool seen_test(const uint64_t *seen, int64_t rank) { return (seen[rank / 64] >> (rank % 64)) & 1u; }
static void seen_set(uint64_t *seen, int64_t rank) { seen[rank / 64] |= 1ull << (rank % 64); }
static bool finished(fanin_state_t st) { return st == ST_REPORTED || st == ST_EXPIRED; }

/* Forget the oldest terminal record. */
static void terminal_evict_oldest(pdl_fanin_t *f)
{
    fanin_record_t *t = f->ring[f->ring_head];
    f->ring[f->ring_head] = NULL;
    f->ring_head = (f->ring_head + 1) % f->cfg.max_terminal;
    f->ring_len--;
    if (t == NULL)
        return;
    if (pdl__strmap_get(&f->terminal, t->id) == t)
        pdl__strmap_remove(&f->terminal, t->id);
    free(t);
}

/* Forget id's terminal record now (the id is recorded again); its ring slot stays until it is the oldest. */
static void terminal_forget(pdl_fanin_t *f, const char *id)
{
    fanin_record_t *t = pdl__strmap_remove(&f->terminal, id);
    if (t == NULL)
        return;
    for (size_t i = 0; i < f->ring_len; i++) {
        size_t k = (f->ring_head + i) % f->cfg.max_terminal;
        if (f->ring[k] == t)
            f->ring[k] = NULL;
    }
    free(t);
}

/* A record that left `held`: remembered while a rank finished it through the fan-in (its later
 * releases are late or duplicate), else freed. Best effort under OOM. */
static void retire(pdl_fanin_t *f, fanin_record_t *rec)
{
    bool keep = false;
    for (int s = 0; s < f->cfg.ranks; s++)
        keep = keep || finished(rec->rank[s].state);
    rec->data = NULL;
    if (!keep || pdl__strmap_put(&f->terminal, rec->id, rec) != 0) {
        free(rec);
        return;
    }
    if (f->ring_len == f->cfg.max_terminal)
        terminal_evict_oldest(f);
    f->ring[(f->ring_head + f->ring_len) % f->cfg.max_terminal] = rec;
    f->ring_len++;
}

static void park_unlink(fanin_park_t *pk, fanin_parked_t *p)
{
    if (p->prev)
        p->prev->next = p->next;
    else
        pk->head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    else
        pk->tail = p->prev;
    pk->len--;
}

/* Validate consumer_tp_size/rank against P; fills *expected. */
static bool release_valid(const pdl_fanin_t *f, const pdl_fanin_release_t *rel, int *expected, pdl_error_t *err)
{
    if (rel->transfer_id == NULL || rel->transfer_id[0] == '\0') {
        pdl_error_set(err, PDL_ERR_INVALID, "release without transfer_id");
        return false;
    }
    if (rel->consumer_tp_size < 1 || rel->consumer_tp_size > PDL_TOPO_MAX_TP) {
        pdl_error_set(err, PDL_ERR_INVALID, "release %s: consumer_tp_size %lld outside [1, %d]", rel->transfer_id,
                      (long long)rel->consumer_tp_size, PDL_TOPO_MAX_TP);
        return false;
    }
    if (rel->consumer_tp_rank < -1 || rel->consumer_tp_rank >= rel->consumer_tp_size) {
        pdl_error_set(err, PDL_ERR_INVALID, "release %s: consumer_tp_rank %lld outside [0, %lld)", rel->transfer_id,
                      (long long)rel->consumer_tp_rank, (long long)rel->consumer_tp_size);
        return false;
    }
    pdl_error_t e;
    if (pdl_topo_expected_acks(f->cfg.producer_tp, (int)rel->consumer_tp_size, expected, &e) != PDL_OK) {
        pdl_error_set(err, PDL_ERR_INVALID, "release %s: %s", rel->transfer_id, e.msg);
        return false;
    }
    return true;
}

/* Apply a valid release to rank s, which holds rec. */
static pdl_fanin_result_t apply_to_held(pdl_fanin_t *f, fanin_record_t *rec, int s, int64_t consumer_rank,
                                        int expected, bool failed)
{
    fanin_rank_t *fr = &rec->rank[s];
    pdl_fanin_counters_t *c = &f->c[s];
    if (consumer_rank >= 0 && seen_test(fr->seen, consumer_rank)) {
        c->duplicate++;
        return PDL_FANIN_DUPLICATE;
    }
    if (consumer_rank >= 0)
        seen_set(fr->seen, consumer_rank);
    fr->count++;
    c->counted++;
    if (failed)
        c->failed_status++;
    if (fr->count < expected)
        return PDL_FANIN_COUNTED;
    c->reported++;
    fr->state = ST_REPORTED;
    return PDL_FANIN_REPORTED;
}

/* Early release: park it on rank s. When the park is full the oldest goes, so a flood of releases for
 * ids that never get held costs bounded memory (upstream's buffer is unbounded). */
static pdl_fanin_result_t park(pdl_fanin_t *f, int s, const pdl_fanin_release_t *rel, uint64_t now_ns)
{
    fanin_park_t *pk = &f->park[s];
    pdl_fanin_counters_t *c = &f->c[s];
    size_t idl = strlen(rel->transfer_id);
    fanin_parked_t *p = malloc(sizeof(*p) + idl + 1);
    c->parked++;
    if (p == NULL) {
        c->parked_dropped++;
        return PDL_FANIN_PARKED;
    }
    if (pk->len >= f->cfg.max_parked) {
        fanin_parked_t *old = pk->head;
        park_unlink(pk, old);
        free(old);
        c->parked_dropped++;
    }
    p->arrival_ns = now_ns;
    p->consumer_tp_size = rel->consumer_tp_size;
    p->consumer_tp_rank = rel->consumer_tp_rank;
    p->failed = rel->failed;
    snprintf(p->sender, sizeof(p->sender), "%s", rel->sender ? rel->sender : "");
    memcpy(p->id, rel->transfer_id, idl + 1);
    p->next = NULL;
    p->prev = pk->tail;
    if (pk->tail)
        pk->tail->next = p;
    else
        pk->head = p;
    pk->tail = p;
    pk->len++;
    return PDL_FANIN_PARKED;
}

pdl_fanin_result_t pdl__fanin_release(pdl_fanin_t *f, int rank, const pdl_fanin_release_t *rel, uint64_t now_ns,
                                      pdl_error_t *err)
{
    int s = slot_of(f, rank);
    if (s < 0) {
        pdl_error_set(err, PDL_ERR_INVALID, "release: producer rank %d is not counted here", rank);
        return PDL_FANIN_INVALID;
    }
    int expected = 1;
    if (!release_valid(f, rel, &expected, err)) {
        f->c[s].invalid++;
        return PDL_FANIN_INVALID;
    }
    f->c[s].received++;
    /* An id is in one map at most: recorded (some rank unresolved) or terminal. */
    fanin_record_t *rec = pdl__strmap_get(&f->held, rel->transfer_id);
    if (rec == NULL)
        rec = pdl__strmap_get(&f->terminal, rel->transfer_id);
    fanin_rank_t *fr = rec ? &rec->rank[s] : NULL;
    if (fr != NULL && fr->state == ST_HELD)
        return apply_to_held(f, rec, s, rel->consumer_tp_rank, expected, rel->failed);
    if (fr != NULL && finished(fr->state)) {
        if (rel->consumer_tp_rank >= 0 && seen_test(fr->seen, rel->consumer_tp_rank)) {
            f->c[s].duplicate++;
            return PDL_FANIN_DUPLICATE;
        }
        f->c[s].late++;
        return PDL_FANIN_LATE;
    }
    return park(f, s, rel, now_ns); /* unknown to this rank: not recorded, OPEN, or DROPPED */
}

pdl_status_t pdl__fanin_add(pdl_fanin_t *f, const char *transfer_id, void *data, pdl_error_t *err)
{
    if (transfer_id == NULL || transfer_id[0] == '\0')
        return pdl_error_set(err, PDL_ERR_INVALID, "empty transfer id");
    if (pdl__strmap_get(&f->held, transfer_id))
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "transfer %s is already held", transfer_id);
    size_t ranks_len = (size_t)f->cfg.ranks * sizeof(fanin_rank_t), idl = strlen(transfer_id);
    fanin_record_t *rec = calloc(1, sizeof(*rec) + ranks_len + idl + 1);
    if (rec == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "transfer %s: out of memory", transfer_id);
    rec->data = data;
    rec->unresolved = f->cfg.ranks;
    rec->id = (char *)rec->rank + ranks_len;
    memcpy(rec->id, transfer_id, idl + 1);
    if (pdl__strmap_put(&f->held, transfer_id, rec) != 0) {
        free(rec);
        return pdl_error_set(err, PDL_ERR_NOMEM, "transfer %s: out of memory", transfer_id);
    }
    /* A re-used id starts a new life: its old terminal record must not make new releases "late". */
    terminal_forget(f, transfer_id);
    return PDL_OK;
}

pdl_status_t pdl__fanin_hold(pdl_fanin_t *f, const char *transfer_id, int rank, uint64_t now_ns, bool *reported_out,
                             pdl_error_t *err)
{
    return pdl__fanin_hold_from(f, transfer_id, rank, now_ns, NULL, NULL, reported_out, err);
}

pdl_status_t pdl__fanin_hold_from(pdl_fanin_t *f, const char *transfer_id, int rank, uint64_t now_ns,
                                  bool (*allowed)(void *arg, const char *sender), void *arg, bool *reported_out,
                                  pdl_error_t *err)
{
    if (reported_out)
        *reported_out = false;
    int s = slot_of(f, rank);
    if (s < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "hold %s: producer rank %d is not counted here",
                             transfer_id ? transfer_id : "", rank);
    fanin_record_t *rec = transfer_id ? pdl__strmap_get(&f->held, transfer_id) : NULL;
    if (rec == NULL)
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "hold: transfer %s is not recorded (or resolved already)",
                             transfer_id ? transfer_id : "");
    fanin_rank_t *fr = &rec->rank[s];
    if (fr->state != ST_OPEN)
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "hold: rank %d already held (or resolved) transfer %s", rank,
                             transfer_id);
    fr->state = ST_HELD;
    fr->deadline_ns = now_ns + f->cfg.defer_timeout_ns;
    /* Apply this rank's parked releases for this id in arrival order. */
    fanin_park_t *pk = &f->park[s];
    fanin_parked_t *p = pk->head;
    bool reported = false;
    while (p) {
        fanin_parked_t *n = p->next;
        if (strcmp(p->id, transfer_id) == 0) {
            park_unlink(pk, p);
            if (allowed != NULL && !allowed(arg, p->sender)) {
                f->c[s].parked_refused++; /* from another party than the one the hold names */
            } else if (!reported) {
                int expected = 1;
                pdl_topo_expected_acks(f->cfg.producer_tp, (int)p->consumer_tp_size, &expected, NULL);
                reported = apply_to_held(f, rec, s, p->consumer_tp_rank, expected, p->failed) == PDL_FANIN_REPORTED;
            } else {
                /* More parked releases than the fan-in needed: they are late now. */
                f->c[s].late++;
            }
            free(p);
        }
        p = n;
    }
    if (reported_out)
        *reported_out = reported;
    return PDL_OK;
}

bool pdl__fanin_keepalive(pdl_fanin_t *f, const char *transfer_id, int rank, uint64_t now_ns)
{
    int s = slot_of(f, rank);
    fanin_record_t *rec = transfer_id && s >= 0 ? pdl__strmap_get(&f->held, transfer_id) : NULL;
    if (rec == NULL || rec->rank[s].state != ST_HELD)
        return false;
    uint64_t d = now_ns + f->cfg.defer_timeout_ns;
    if (d > rec->rank[s].deadline_ns)
        rec->rank[s].deadline_ns = d;
    f->c[s].keepalives++;
    return true;
}

typedef struct reap_ctx {
    pdl_fanin_t *f;
    int s;
    uint64_t now_ns;
    size_t max, n;
    void (*fn)(void *arg, const char *transfer_id);
    void *arg;
} reap_ctx_t;

/* Expiring changes a record, never the map (the record stays until its owner resolves the rank), so it
 * is done during the walk. */
static void expire_due(void *arg, const char *key, void *value)
{
    reap_ctx_t *rc = arg;
    fanin_rank_t *fr = &((fanin_record_t *)value)->rank[rc->s];
    if (fr->state != ST_HELD || fr->deadline_ns > rc->now_ns || rc->n == rc->max)
        return;
    fr->state = ST_EXPIRED;
    rc->f->c[rc->s].expired++;
    rc->n++;
    if (rc->fn)
        rc->fn(rc->arg, key);
}

size_t pdl__fanin_reap(pdl_fanin_t *f, int rank, uint64_t now_ns, size_t max,
                       void (*expired_fn)(void *arg, const char *transfer_id), void *arg)
{
    int s = slot_of(f, rank);
    if (s < 0)
        return 0;
    fanin_park_t *pk = &f->park[s];
    while (pk->head && pk->head->arrival_ns + f->cfg.max_park_age_ns <= now_ns) {
        fanin_parked_t *p = pk->head;
        park_unlink(pk, p);
        free(p);
        f->c[s].parked_dropped++;
    }
    reap_ctx_t rc = {.f = f, .s = s, .now_ns = now_ns, .max = max, .fn = expired_fn, .arg = arg};
    pdl__strmap_foreach(&f->held, expire_due, &rc);
    return rc.n;
}

typedef struct deadline_ctx {
    int s;
    uint64_t min;
} deadline_ctx_t;

static void min_deadline(void *arg, const char *key, void *value)
{
    (void)key;
    deadline_ctx_t *dc = arg;
    const fanin_rank_t *fr = &((const fanin_record_t *)value)->rank[dc->s];
    if (fr->state == ST_HELD && fr->deadline_ns < dc->min)
        dc->min = fr->deadline_ns;
}

uint64_t pdl__fanin_next_deadline(const pdl_fanin_t *f, int rank)
{
    deadline_ctx_t dc = {.s = slot_of(f, rank), .min = UINT64_MAX};
    if (dc.s < 0)
        return UINT64_MAX;
    pdl__strmap_foreach(&f->held, min_deadline, &dc);
    const fanin_parked_t *head = f->park[dc.s].head;
    if (head && head->arrival_ns + f->cfg.max_park_age_ns < dc.min)
        dc.min = head->arrival_ns + f->cfg.max_park_age_ns;
    return dc.min;
}

bool pdl__fanin_resolve(pdl_fanin_t *f, const char *transfer_id, int rank, pdl_fanin_outcome_t *out)
{
    pdl_fanin_outcome_t ignored;
    if (out == NULL)
        out = &ignored;
    *out = (pdl_fanin_outcome_t){0};
    int s = slot_of(f, rank);
    fanin_record_t *rec = transfer_id && s >= 0 ? pdl__strmap_get(&f->held, transfer_id) : NULL;
    if (rec == NULL || rec->rank[s].resolved)
        return false;
    fanin_rank_t *fr = &rec->rank[s];
    fr->resolved = true;
    if (!finished(fr->state))
        fr->state = ST_DROPPED;
    if (--rec->unresolved > 0)
        return true;
    out->last = true;
    out->data = rec->data;
    pdl__strmap_remove(&f->held, rec->id);
    retire(f, rec);
    return true;
}

bool pdl__fanin_cancel(pdl_fanin_t *f, const char *transfer_id, void **data_out)
{
    fanin_record_t *rec = transfer_id ? pdl__strmap_remove(&f->held, transfer_id) : NULL;
    if (data_out)
        *data_out = rec ? rec->data : NULL;
    free(rec);
    return rec != NULL;
}

void *pdl__fanin_data(const pdl_fanin_t *f, const char *transfer_id)
{
    const fanin_record_t *rec = pdl__strmap_get(&f->held, transfer_id);
    return rec ? rec->data : NULL;
}

typedef struct foreach_ctx {
    void (*fn)(void *arg, const char *transfer_id, void *data);
    void *arg;
} foreach_ctx_t;

static void foreach_one(void *arg, const char *key, void *value)
{
    foreach_ctx_t *fc = arg;
    fc->fn(fc->arg, key, ((fanin_record_t *)value)->data);
}

void pdl__fanin_foreach(const pdl_fanin_t *f, void (*fn)(void *arg, const char *transfer_id, void *data), void *arg)
{
    foreach_ctx_t fc = {.fn = fn, .arg = arg};
    pdl__strmap_foreach(&f->held, foreach_one, &fc);
}

size_t pdl__fanin_count(const pdl_fanin_t *f) { return f->held.count; }

/* Rank `rank`'s state of transfer_id while it holds it, else NULL. */
static const fanin_rank_t *held_rank(const pdl_fanin_t *f, const char *transfer_id, int rank)
{
    int s = slot_of(f, rank);
    const fanin_record_t *rec = s >= 0 ? pdl__strmap_get(&f->held, transfer_id) : NULL;
    return rec != NULL && rec->rank[s].state == ST_HELD ? &rec->rank[s] : NULL;
}

bool pdl__fanin_is_held(const pdl_fanin_t *f, const char *transfer_id, int rank)
{
    return held_rank(f, transfer_id, rank) != NULL;
}

int pdl__fanin_count_of(const pdl_fanin_t *f, const char *transfer_id, int rank)
{
    const fanin_rank_t *fr = held_rank(f, transfer_id, rank);
    return fr ? fr->count : -1;
}

size_t pdl__fanin_parked_count(const pdl_fanin_t *f, int rank)
{
    int s = slot_of(f, rank);
    return s >= 0 ? f->park[s].len : 0;
}

void pdl__fanin_get_counters(const pdl_fanin_t *f, int rank, pdl_fanin_counters_t *out)
{
    int s = slot_of(f, rank);
    if (s >= 0)
        *out = f->c[s];
    else
        *out = (pdl_fanin_counters_t){0};
}
