/*
 * run_chaos_phase.c -- `pdlink run --chaos` on a running cluster: the operations the chaos schedule
 * (run_chaos.c) needs from it -- a pass of the workload, a node restarted on its ports, is the router
 * listing every node, is a victim listed -- and the phase itself: the schedule under load, then the wait
 * for its holds to drain and for the routers to list every node again before the final batch.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/run_ctx.h"
#include "cli/run_http.h"
#include "common/clock.h"

/* The chaos phase's operations (run_chaos.h) on this cluster. */
static pdl_status_t chaos_drive(void *ctx, pdl_error_t *err)
{
    run_ctx_t *c = ctx;
    char base[96];
    snprintf(base, sizeof(base), "http://%s:%d", c->router_host, c->router_port);
    for (int i = 0; i < c->o.requests; i++)
        pdl_run_req_clear(&c->reqs[i]);
    return pdl_run_drive(c, base, 0, c->o.requests, err);
}

static pdl_status_t chaos_restart(void *ctx, pdl_run_child_t *victim, pdl_error_t *err)
{
    run_ctx_t *c = ctx;
    for (int i = 0; i < c->nnodes; i++)
        if (&c->nodes[i].child == victim)
            return pdl_run_start_node(c, &c->nodes[i], c->router_host, -1, err);
    return pdl_error_set(err, PDL_ERR_NOT_FOUND, "%s is not a node of this topology", victim->name);
}

static bool chaos_registered(void *ctx)
{
    run_ctx_t *c = ctx;
    /* vllm-router lists instances only in its log, each address once, and drops none after 0.5 s down. */
    if (c->rt.real)
        return pdl_run_router_log_count(c->router.log_path, true) == c->cur->topo.np &&
               pdl_run_router_log_count(c->router.log_path, false) == c->cur->topo.nd;
    char url[128];
    snprintf(url, sizeof(url), "http://%s:%d/workers", c->router_host, c->router_port);
    long code = 0;
    char *body = NULL;
    pdl_run_http_get(url, 1000, &code, &body, NULL);
    bool all = code == 200 && body != NULL && pdl_run_workers_count(body, "prefill") == c->cur->topo.np &&
               pdl_run_workers_count(body, "decode") == c->cur->topo.nd;
    free(body);
    return all;
}

/* Is the victim listed by the router now; *removals_p: vllm-router's count of its removals (its log),
 * -1 for pdlink-router (its /workers shows who is listed, not who was dropped). */
static bool chaos_listed(void *ctx, const pdl_run_child_t *victim, int *removals_p)
{
    run_ctx_t *c = ctx;
    const run_node_t *nd = NULL;
    for (int i = 0; i < c->nnodes && nd == NULL; i++)
        nd = &c->nodes[i].child == victim ? &c->nodes[i] : NULL;
    *removals_p = -1;
    if (nd == NULL)
        return false;
    char addr[64];
    snprintf(addr, sizeof(addr), "%s:%d", nd->host, nd->http_port);
    bool prefill = nd->role == ROLE_PREFILL;
    if (c->rt.real) {
        bool listed = false;
        *removals_p = pdl_run_router_log_state(c->router.log_path, prefill, addr, &listed);
        return listed;
    }
    char url[128];
    snprintf(url, sizeof(url), "http://%s:%d/workers", c->router_host, c->router_port);
    long code = 0;
    char *body = NULL;
    bool listed = false;
    pdl_run_http_get(url, 1000, &code, &body, NULL);
    json_t *root = code == 200 && body != NULL ? json_loads(body, 0, NULL) : NULL;
    json_t *a = json_object_get(root, prefill ? "prefill" : "decode");
    size_t i;
    json_t *w;
    json_array_foreach(a, i, w)
    {
        const char *h = json_string_value(json_object_get(w, "http_address"));
        /* pdlink-router keeps the address as registered, with or without the scheme. */
        if (h != NULL && strncmp(h, "http://", 7) == 0)
            h += 7;
        listed = listed || (h != NULL && strcmp(h, addr) == 0);
    }
    json_decref(root);
    free(body);
    return listed;
}

/* Every node listed by the router now (vllm-router: by its log's last line for each). */
static bool all_listed(run_ctx_t *c)
{
    for (int i = 0; i < c->nnodes; i++) {
        int rm;
        if (!chaos_listed(c, &c->nodes[i].child, &rm))
            return false;
    }
    return true;
}

/* --chaos: the schedule's kills and pauses of decode-0 and prefill-0 under load (run_chaos.h), before the
 * final batch. */
pdl_status_t pdl_run_chaos_phase(run_ctx_t *c, pdl_run_result_t *r, pdl_error_t *err)
{
    const pdl_run_chaos_event_t *ev = c->o.chaos_ev;
    int nev = c->o.chaos_nev;
    pdl_run_child_t *victims[PDL_RUN_CHAOS_VICTIMS];
    char health[PDL_RUN_CHAOS_VICTIMS][160], metrics[PDL_RUN_CHAOS_VICTIMS][160];
    const char *hu[PDL_RUN_CHAOS_VICTIMS], *mu[PDL_RUN_CHAOS_VICTIMS], *served[PDL_RUN_CHAOS_VICTIMS];
    for (int k = 0; k < nev; k++) {
        run_node_t *nd = ev[k].prefill ? &c->nodes[0] : &c->nodes[r->topo.np];
        victims[k] = &nd->child;
        pdl_run_node_url(nd, "/health", health[k], sizeof(health[k]));
        pdl_run_node_url(nd, "/metrics", metrics[k], sizeof(metrics[k]));
        hu[k] = health[k];
        mu[k] = metrics[k];
        /* Served again: a decode completed a request; a prefill's KV reached a decode (its releases in READ
         * mode, its write_done in WRITE mode), which its own pdlink_requests_total does not say. */
        served[k] = !ev[k].prefill                     ? "pdlink_requests_total"
                    : strcmp(c->o.mode, "write") == 0 ? "pdlink_write_done_sent_total"
                                                      : "pdlink_releases_received_total";
    }
    pdl_run_chaos_ops_t ops = {.ctx = c, .run_pass = chaos_drive, .restart = chaos_restart, .registered = chaos_registered,
                               .listed = chaos_listed};
    pdl_run_chaos_t ch;
    if (pdl_run_chaos_init(&ch, &ops, r->topo.name, c->o.quiet, ev, victims, hu, mu, served, nev, c->reqs, c->ref_text,
                           c->o.requests, r) != PDL_OK)
        return pdl_error_set(err, PDL_ERR_NOMEM, "chaos phase: out of memory");
    /* Behind a router that sends no failed release for a failed decode leg, the holds of requests that
     * failed in an outage are reaped after defer_timeout: counted, and excused up to what the failures
     * explain (pdl_run_chaos_expired_bound). */
    r->chaos.excused_expired = c->rt.real;
    pdl_run_progress(c, "chaos: sending the workload while the schedule runs: %s", c->o.chaos_schedule);
    c->chaos = &ch;
    pdl_status_t st = pdl_run_chaos_run(&ch, err);
    c->chaos = NULL;
    pdl_run_chaos_fini(&ch); /* keeps last_pause_up_ms */
    pdl_run_progress(c, "chaos: %d/%d ok during the outages, %d/%d outside", r->chaos.ok_outage,
             r->chaos.ok_outage + r->chaos.failed_outage, r->chaos.ok_outside,
             r->chaos.ok_outside + r->chaos.failed_outside);
    if (st != PDL_OK)
        return st;
    /* The final batch is judged alone: let the chaos phase's holds go first (released, given up by the
     * watch, or -- behind vllm-router -- reaped after the shortened defer_timeout), so that none of them
     * is reaped or counted as held in the final batch's figures. */
    uint64_t deadline = pdl__clock_now_ms() + RUN_DRAIN_TIMEOUT_MS + (c->rt.real ? RUN_CHAOS_DEFER_TIMEOUT_S * 1000 : 0);
    uint64_t last_pause_up = ch.last_pause_up_ms;
    for (;;) {
        int got = pdl_run_scrape_all(c);
        /* A router may drop a node whose pings stopped while it was paused only once it runs again (its
         * TTL sweep lags): the final batch starts once no such drop can still come and every node is
         * listed, so that its requests meet the cluster whole. */
        bool settled = last_pause_up == 0 ||
                       (pdl__clock_now_ms() - last_pause_up >= RUN_CHAOS_SETTLE_MS && chaos_registered(c) &&
                        all_listed(c));
        if (got == c->nnodes && pdl_run_total_held(c) == 0 && settled)
            break;
        if (!pdl_run_children_alive(c) || pdl__clock_now_ms() >= deadline || !pdl_run_wait_ms(c, 200))
            break;
    }
    c->chaos_expired_base = 0;
    for (int i = 0; i < c->nnodes; i++)
        c->chaos_expired_base += pdl_run_msum(&c->nodes[i], "pdlink_expired_total");
    r->chaos.expired += c->chaos_expired_base;
    if (r->chaos.expired > 0)
        pdl_run_result_note(r, "chaos: %llu transfers reaped after defer_timeout during the chaos phase (%llu "
                               "excused by %d requests failed in the outages)",
                            (unsigned long long)r->chaos.expired,
                            (unsigned long long)pdl_run_chaos_expired_bound(r), r->chaos.failed_outage);
    pdl_run_progress(c, "chaos: %llu transfers reaped during the phase; now the final batch",
             (unsigned long long)r->chaos.expired);
    return PDL_OK;
}
