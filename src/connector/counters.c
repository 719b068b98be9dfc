/*
 * counters.c -- a rank's counters (pdl_rank_counters_t, the table in connector.h) and the drop log.
 *
 * Every thread of a rank counts here under one leaf mutex; the fan-in's own counters are merged in
 * when a snapshot is taken, so a reader sees one consistent set per rank.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "connector/internal.h"

void pdl__ctr_init(pdl_rank_ctr_t *c)
{
    pthread_mutex_init(&c->mu, NULL);
    for (int k = 0; k < PDL_DROP_KINDS; k++)
        pdl_ratelimit_init(&c->drop_rl[k], 10000, 1);
    pdl_ratelimit_init(&c->late_rl, 10000, 1);
    pdl_ratelimit_init(&c->expired_rl, 10000, 5);
    pdl_ratelimit_init(&c->ping_rl, 30000, 1);
    pdl_ratelimit_init(&c->send_rl, 10000, 1);
    pdl_ratelimit_init(&c->refused_rl, 10000, 5);
    pdl_ratelimit_init(&c->listen_rl, 10000, 1);
    pdl_ratelimit_init(&c->fail_rl, 10000, 5);
}

void pdl__ctr_fini(pdl_rank_ctr_t *c) { pthread_mutex_destroy(&c->mu); }

void pdl__ctr_add(pdl_rank_ctr_t *c, size_t offset, uint64_t v)
{
    pthread_mutex_lock(&c->mu);
    *(uint64_t *)((char *)&c->v + offset) += v;
    pthread_mutex_unlock(&c->mu);
}

/* Counts one event in the counter at `offset` and asks the event's rate limiter whether to log it, both
 * under mu (the limiters are shared by the service thread and the lanes). */
static bool count_limited(pdl_rank_t *r, size_t offset, pdl_ratelimit_t *rl, uint64_t *suppressed)
{
    pthread_mutex_lock(&r->ctr.mu);
    *(uint64_t *)((char *)&r->ctr.v + offset) += 1;
    bool log = pdl_ratelimit_allow(rl, suppressed);
    pthread_mutex_unlock(&r->ctr.mu);
    return log;
}

void pdl__ctr_refused(pdl_rank_t *r, size_t offset, const char *fmt, ...)
{
    uint64_t suppressed = 0;
    if (!count_limited(r, offset, &r->ctr.refused_rl, &suppressed))
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (suppressed)
        pdl_warn("rank %d: %s (%llu similar refusals since the last report)", r->rank, msg,
                 (unsigned long long)suppressed);
    else
        pdl_warn("rank %d: %s", r->rank, msg);
}

void pdl__ctr_drop(pdl_rank_t *r, pdl_drop_kind_t kind, const char *fmt, ...)
{
    /* One limiter per kind, so a flood of one malformed kind does not hide the first of another. */
    uint64_t suppressed = 0;
    if (!count_limited(r, offsetof(pdl_rank_counters_t, dropped_malformed), &r->ctr.drop_rl[kind], &suppressed))
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

pdl_status_t pdl_instance_counters(pdl_instance_t *inst, int tp_rank, pdl_rank_counters_t *out, pdl_error_t *err)
{
    if (inst == NULL || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "counters: no instance or no output");
    pdl_status_t st = pdl__rank_check(inst, tp_rank, "counters", err);
    if (st != PDL_OK)
        return st;
    pdl_rank_t *r = &inst->ranks[tp_rank];
    pthread_mutex_lock(&r->ctr.mu);
    *out = r->ctr.v;
    pthread_mutex_unlock(&r->ctr.mu);
    pdl_fanin_counters_t fc;
    pthread_mutex_lock(&inst->held_mu);
    pdl__fanin_get_counters(inst->held, tp_rank, &fc);
    pthread_mutex_unlock(&inst->held_mu);
    out->transfers += fc.reported;
    out->releases_received = fc.received;
    out->releases_duplicate = fc.duplicate;
    out->releases_late = fc.late;
    out->releases_parked = fc.parked;
    out->releases_failed_status = fc.failed_status;
    out->releases_parked_dropped = fc.parked_dropped;
    out->expired += fc.expired; /* plus WRITE-mode pushes reaped (push.c) */
    out->keepalives_received = fc.keepalives;
    if (r->inst->zap_refused != NULL) /* authmode.c: the ZAP handler's refusals on this rank's ROUTERs */
        out->auth_refused += atomic_load(&r->inst->zap_refused[r->rank]);
    if (r->mem.engine != NULL) {
        pdl_engine_stats_t es;
        pdl_engine_get_stats(r->mem.engine, &es);
        out->data_requests_served = es.requests_served;
        out->data_requests_denied = es.requests_denied;
        out->untrusted_refused += es.connections_refused_untrusted;
        out->data_connections_shed = es.connections_shed;
        out->auth_refused += es.connections_refused_auth;
    }
    return PDL_OK;
}

size_t pdl_instance_peer_stats(pdl_instance_t *inst, int tp_rank, pdl_engine_peer_stats_t *out, size_t cap)
{
    if (inst == NULL || !pdl__is_local(inst, tp_rank))
        return 0;
    return pdl_engine_peer_stats(inst->ranks[tp_rank].mem.engine, out, cap);
}

static const pdl_counter_info_t counter_table[] = {
#define PDL__COUNTER_INFO(field, name, kind, help) {name, help, kind, offsetof(pdl_rank_counters_t, field)},
    PDL_RANK_COUNTERS(PDL__COUNTER_INFO)
#undef PDL__COUNTER_INFO
};

const pdl_counter_info_t *pdl_rank_counters_table(size_t *n)
{
    if (n != NULL)
        *n = sizeof(counter_table) / sizeof(counter_table[0]);
    return counter_table;
}

void pdl_instance_sockets(pdl_instance_t *inst, pdl_socket_stats_t out[PDL_SOCKETS_SHARES])
{
    if (inst != NULL && out != NULL)
        pdl__budget_stats(&inst->sockets, out);
}
