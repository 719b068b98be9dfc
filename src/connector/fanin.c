/*
 * fanin.c -- release fan-in and lease state machine of one producer rank (states in fanin.h).
 *
 * Storage: held transfers and terminal (finished) ids in hash maps keyed by transfer id, the terminal
 * ids also in a FIFO ring so the oldest is forgotten first (upstream keeps the same kind of LRU of
 * 4096 terminal ids, reference §3.3). Parked releases are a FIFO list in arrival order: expiry and
 * eviction take from the head, a hold scans for its id (the list is bounded, default 1024).
 */
#include "connector/fanin.h"

#include <stdlib.h>
#include <string.h>

#include "connector/strmap.h"
#include "pdlink/topo.h"

#define FANIN_RANK_WORDS (PDL_TOPO_MAX_TP / 64)

typedef struct fanin_held {
    uint64_t deadline_ns;
    int count;
    uint64_t seen[FANIN_RANK_WORDS]; /* consumer ranks already counted */
} fanin_held_t;

typedef struct fanin_terminal {
    uint64_t seen[FANIN_RANK_WORDS];
    char *id; /* owned copy (the ring needs the key to remove it from the map) */
} fanin_terminal_t;

typedef struct fanin_parked {
    struct fanin_parked *prev, *next;
    uint64_t arrival_ns;
    int64_t consumer_tp_size, consumer_tp_rank;
    bool failed;
    char id[];
} fanin_parked_t;

struct pdl_fanin {
    pdl_fanin_config_t cfg;
    pdl_strmap_t held;     /* id → fanin_held_t* */
    pdl_strmap_t terminal; /* id → fanin_terminal_t* */
    fanin_terminal_t **ring;
    size_t ring_head, ring_len;
    fanin_parked_t *park_head, *park_tail;
    size_t park_len;
    pdl_fanin_counters_t c;
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
    if (f->ring == NULL) {
        free(f);
        return pdl_error_set(err, PDL_ERR_NOMEM, "fan-in: out of memory");
    }
    *out = f;
    return PDL_OK;
}

static void free_held_value(void *arg, const char *key, void *value)
{
    (void)arg;
    (void)key;
    free(value);
}

void pdl__fanin_destroy(pdl_fanin_t *f)
{
    if (f == NULL)
        return;
    pdl__strmap_foreach(&f->held, free_held_value, NULL);
    pdl__strmap_free(&f->held);
    for (size_t i = 0; i < f->ring_len; i++) {
        fanin_terminal_t *t = f->ring[(f->ring_head + i) % f->cfg.max_terminal];
        if (t) {
            free(t->id);
            free(t);
        }
    }
    pdl__strmap_free(&f->terminal);
    free(f->ring);
    fanin_parked_t *p = f->park_head;
    while (p) {
        fanin_parked_t *n = p->next;
        free(p);
        p = n;
    }
    free(f);
}

void pdl__fanin_set_defer_timeout(pdl_fanin_t *f, uint64_t defer_timeout_ns) { f->cfg.defer_timeout_ns = defer_timeout_ns; }

static bool seen_test(const uint64_t *seen, int64_t rank) { return (seen[rank / 64] >> (rank % 64)) & 1u; }
static void seen_set(uint64_t *seen, int64_t rank) { seen[rank / 64] |= 1ull << (rank % 64); }

/* Forget the oldest terminal id. */
static void terminal_evict_oldest(pdl_fanin_t *f)
{
    fanin_terminal_t *t = f->ring[f->ring_head];
    f->ring[f->ring_head] = NULL;
    f->ring_head = (f->ring_head + 1) % f->cfg.max_terminal;
    f->ring_len--;
    if (t == NULL)
        return;
    if (pdl__strmap_get(&f->terminal, t->id) == t)
        pdl__strmap_remove(&f->terminal, t->id);
    free(t->id);
    free(t);
}

/* Move an id into the terminal set with the ranks that were counted. Best effort under OOM. */
static void terminal_add(pdl_fanin_t *f, const char *id, const uint64_t *seen)
{
    fanin_terminal_t *old = pdl__strmap_get(&f->terminal, id);
    if (old) { /* re-held and finished again: refresh the ranks in place */
        memcpy(old->seen, seen, sizeof(old->seen));
        return;
    }
    if (f->ring_len == f->cfg.max_terminal)
        terminal_evict_oldest(f);
    fanin_terminal_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return;
    t->id = strdup(id);
    if (t->id == NULL || pdl__strmap_put(&f->terminal, id, t) != 0) {
        free(t->id);
        free(t);
        return;
    }
    memcpy(t->seen, seen, sizeof(t->seen));
    f->ring[(f->ring_head + f->ring_len) % f->cfg.max_terminal] = t;
    f->ring_len++;
}

static void park_unlink(pdl_fanin_t *f, fanin_parked_t *p)
{
    if (p->prev)
        p->prev->next = p->next;
    else
        f->park_head = p->next;
    if (p->next)
        p->next->prev = p->prev;
    else
        f->park_tail = p->prev;
    f->park_len--;
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

/* Apply a valid release to a held entry. */
static pdl_fanin_result_t apply_to_held(pdl_fanin_t *f, const char *id, fanin_held_t *h, int64_t rank, int expected,
                                        bool failed)
{
    if (rank >= 0 && seen_test(h->seen, rank)) {
        f->c.duplicate++;
        return PDL_FANIN_DUPLICATE;
    }
    if (rank >= 0)
        seen_set(h->seen, rank);
    h->count++;
    f->c.counted++;
    if (failed)
        f->c.failed_status++;
    if (h->count < expected)
        return PDL_FANIN_COUNTED;
    f->c.reported++;
    uint64_t seen[FANIN_RANK_WORDS];
    memcpy(seen, h->seen, sizeof(seen));
    pdl__strmap_remove(&f->held, id);
    free(h);
    terminal_add(f, id, seen);
    return PDL_FANIN_REPORTED;
}

pdl_fanin_result_t pdl__fanin_release(pdl_fanin_t *f, const pdl_fanin_release_t *rel, uint64_t now_ns,
                                      pdl_error_t *err)
{
    int expected = 1;
    if (!release_valid(f, rel, &expected, err)) {
        f->c.invalid++;
        return PDL_FANIN_INVALID;
    }
    f->c.received++;
    const char *id = rel->transfer_id;
    fanin_held_t *h = pdl__strmap_get(&f->held, id);
    if (h)
        return apply_to_held(f, id, h, rel->consumer_tp_rank, expected, rel->failed);
    fanin_terminal_t *t = pdl__strmap_get(&f->terminal, id);
    if (t) {
        if (rel->consumer_tp_rank >= 0 && seen_test(t->seen, rel->consumer_tp_rank)) {
            f->c.duplicate++;
            return PDL_FANIN_DUPLICATE;
        }
        f->c.late++;
        return PDL_FANIN_LATE;
    }
    /* Early release: park it. When the park is full the oldest goes, so a flood of releases for ids
     * that never get held costs bounded memory (upstream's buffer was unbounded, reference §8.5 #50674). */
    size_t idl = strlen(id);
    fanin_parked_t *p = malloc(sizeof(*p) + idl + 1);
    if (p == NULL) {
        f->c.parked_dropped++;
        f->c.parked++;
        return PDL_FANIN_PARKED;
    }
    if (f->park_len >= f->cfg.max_parked) {
        fanin_parked_t *old = f->park_head;
        park_unlink(f, old);
        free(old);
        f->c.parked_dropped++;
    }
    p->arrival_ns = now_ns;
    p->consumer_tp_size = rel->consumer_tp_size;
    p->consumer_tp_rank = rel->consumer_tp_rank;
    p->failed = rel->failed;
    memcpy(p->id, id, idl + 1);
    p->next = NULL;
    p->prev = f->park_tail;
    if (f->park_tail)
        f->park_tail->next = p;
    else
        f->park_head = p;
    f->park_tail = p;
    f->park_len++;
    f->c.parked++;
    return PDL_FANIN_PARKED;
}

pdl_status_t pdl__fanin_hold(pdl_fanin_t *f, const char *transfer_id, uint64_t now_ns, bool *reported_out,
                             pdl_error_t *err)
{
    if (reported_out)
        *reported_out = false;
    if (transfer_id == NULL || transfer_id[0] == '\0')
        return pdl_error_set(err, PDL_ERR_INVALID, "hold: empty transfer id");
    if (pdl__strmap_get(&f->held, transfer_id))
        return pdl_error_set(err, PDL_ERR_BAD_STATE, "hold: transfer %s is already held", transfer_id);
    fanin_held_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "hold: out of memory");
    h->deadline_ns = now_ns + f->cfg.defer_timeout_ns;
    if (pdl__strmap_put(&f->held, transfer_id, h) != 0) {
        free(h);
        return pdl_error_set(err, PDL_ERR_NOMEM, "hold: out of memory");
    }
    /* A re-used id starts a new life: its old terminal record must not make new releases "late". */
    fanin_terminal_t *t = pdl__strmap_remove(&f->terminal, transfer_id);
    if (t) {
        for (size_t i = 0; i < f->ring_len; i++) {
            size_t k = (f->ring_head + i) % f->cfg.max_terminal;
            if (f->ring[k] == t)
                f->ring[k] = NULL; /* slot stays until it is the oldest */
        }
        free(t->id);
        free(t);
    }
    /* Apply parked releases for this id in arrival order. */
    fanin_parked_t *p = f->park_head;
    bool reported = false;
    while (p) {
        fanin_parked_t *n = p->next;
        if (strcmp(p->id, transfer_id) == 0) {
            park_unlink(f, p);
            if (!reported) {
                int expected = 1;
                pdl_topo_expected_acks(f->cfg.producer_tp, (int)p->consumer_tp_size, &expected, NULL);
                h = pdl__strmap_get(&f->held, transfer_id);
                if (apply_to_held(f, transfer_id, h, p->consumer_tp_rank, expected, p->failed) == PDL_FANIN_REPORTED)
                    reported = true;
            } else {
                /* More parked releases than the fan-in needed: they are late now. */
                f->c.late++;
            }
            free(p);
        }
        p = n;
    }
    if (reported_out)
        *reported_out = reported;
    return PDL_OK;
}

bool pdl__fanin_keepalive(pdl_fanin_t *f, const char *transfer_id, uint64_t now_ns)
{
    fanin_held_t *h = transfer_id ? pdl__strmap_get(&f->held, transfer_id) : NULL;
    if (h == NULL)
        return false;
    uint64_t d = now_ns + f->cfg.defer_timeout_ns;
    if (d > h->deadline_ns)
        h->deadline_ns = d;
    f->c.keepalives++;
    return true;
}

typedef struct reap_ctx {
    uint64_t now_ns;
    char **ids;
    size_t n, cap;
    bool oom;
} reap_ctx_t;

static void collect_expired(void *arg, const char *key, void *value)
{
    reap_ctx_t *rc = arg;
    fanin_held_t *h = value;
    if (h->deadline_ns > rc->now_ns || rc->oom)
        return;
    if (rc->n == rc->cap) {
        size_t nc = rc->cap ? rc->cap * 2 : 16;
        char **v = realloc(rc->ids, nc * sizeof(*v));
        if (v == NULL) {
            rc->oom = true;
            return;
        }
        rc->ids = v;
        rc->cap = nc;
    }
    rc->ids[rc->n] = strdup(key);
    if (rc->ids[rc->n] == NULL) {
        rc->oom = true;
        return;
    }
    rc->n++;
}

size_t pdl__fanin_reap(pdl_fanin_t *f, uint64_t now_ns, void (*expired_fn)(void *arg, const char *transfer_id),
                       void *arg)
{
    while (f->park_head && f->park_head->arrival_ns + f->cfg.max_park_age_ns <= now_ns) {
        fanin_parked_t *p = f->park_head;
        park_unlink(f, p);
        free(p);
        f->c.parked_dropped++;
    }
    reap_ctx_t rc = {.now_ns = now_ns};
    pdl__strmap_foreach(&f->held, collect_expired, &rc);
    for (size_t i = 0; i < rc.n; i++) {
        fanin_held_t *h = pdl__strmap_remove(&f->held, rc.ids[i]);
        if (h) {
            terminal_add(f, rc.ids[i], h->seen);
            free(h);
            f->c.expired++;
            if (expired_fn)
                expired_fn(arg, rc.ids[i]);
        }
        free(rc.ids[i]);
    }
    free(rc.ids);
    return rc.n;
}

static void min_deadline(void *arg, const char *key, void *value)
{
    (void)key;
    uint64_t *m = arg;
    fanin_held_t *h = value;
    if (h->deadline_ns < *m)
        *m = h->deadline_ns;
}

uint64_t pdl__fanin_next_deadline(const pdl_fanin_t *f)
{
    uint64_t m = UINT64_MAX;
    pdl__strmap_foreach(&f->held, min_deadline, &m);
    if (f->park_head && f->park_head->arrival_ns + f->cfg.max_park_age_ns < m)
        m = f->park_head->arrival_ns + f->cfg.max_park_age_ns;
    return m;
}

bool pdl__fanin_cancel(pdl_fanin_t *f, const char *transfer_id)
{
    fanin_held_t *h = pdl__strmap_remove(&f->held, transfer_id);
    free(h);
    return h != NULL;
}

bool pdl__fanin_is_held(const pdl_fanin_t *f, const char *transfer_id)
{
    return pdl__strmap_get(&f->held, transfer_id) != NULL;
}

size_t pdl__fanin_held_count(const pdl_fanin_t *f) { return f->held.count; }
size_t pdl__fanin_parked_count(const pdl_fanin_t *f) { return f->park_len; }

int pdl__fanin_count_of(const pdl_fanin_t *f, const char *transfer_id)
{
    const fanin_held_t *h = pdl__strmap_get(&f->held, transfer_id);
    return h ? h->count : -1;
}

void pdl__fanin_get_counters(const pdl_fanin_t *f, pdl_fanin_counters_t *out) { *out = f->c; }
