/*
 * run_judge.c -- what `pdlink run` concludes about a topology: the nodes' /metrics scraped and summed (KV
 * bytes, verification, releases, holds, expiries, transfer times), and every response compared with the
 * reference's; notes for each thing that is off. The verdict itself is pdl_run_result_judge (run_report.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/run_ctx.h"
#include "cli/run_http.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array. */
static double percentile(const double *v, int n, double p)
{
    if (n <= 0)
        return -1;
    int k = (int)((p / 100.0) * n + 0.999999);
    if (k < 1)
        k = 1;
    if (k > n)
        k = n;
    return v[k - 1];
}

static const char *const per_rank_metrics[] = {
    "pdlink_transfers_total",          "pdlink_kv_bytes_total",         "pdlink_descriptors_total",
    "pdlink_releases_sent_total",      "pdlink_releases_received_total", "pdlink_expired_total",
    "pdlink_held_blocks",              "pdlink_kv_bytes_verified_total", "pdlink_kv_bytes_mismatched_total",
    "pdlink_transfer_seconds_sum",     "pdlink_transfer_seconds_count",  "pdlink_requests_total",
    "pdlink_read_seconds_total",       "pdlink_transfer_busy_seconds_total",
};

uint64_t pdl_run_msum(const run_node_t *nd, const char *name)
{
    double v = pdl_run_metrics_sum(nd->metrics ? nd->metrics : "", name, NULL, NULL, NULL);
    return v > 0 ? (uint64_t)(v + 0.5) : 0;
}

/* Scrape every node; returns the number of nodes scraped. */
int pdl_run_scrape_all(run_ctx_t *c)
{
    int got = 0;
    for (int i = 0; i < c->nnodes; i++) {
        run_node_t *nd = &c->nodes[i];
        char url[160];
        pdl_run_node_url(nd, "/metrics", url, sizeof(url));
        long code = 0;
        char *body = NULL;
        if (pdl_run_http_get(url, 5000, &code, &body, NULL) == PDL_OK && code == 200) {
            free(nd->metrics);
            nd->metrics = body;
            got++;
        } else {
            free(body);
        }
    }
    return got;
}

uint64_t pdl_run_total_held(const run_ctx_t *c)
{
    uint64_t h = 0;
    for (int i = 0; i < c->nnodes; i++)
        h += pdl_run_msum(&c->nodes[i], "pdlink_held_blocks");
    return h;
}

/*
 * Releases (READ: sent by decode ranks, received by prefill ranks) or write_done (WRITE: sent by
 * prefill ranks, received by decode ranks), summed over the nodes as last scraped. Both modes carry
 * max(P, D) per request.
 */
void pdl_run_release_totals(const run_ctx_t *c, uint64_t *sent, uint64_t *received)
{
    bool wm = strcmp(c->o.mode, "write") == 0;
    *sent = *received = 0;
    for (int i = 0; i < c->nnodes; i++) {
        const run_node_t *nd = &c->nodes[i];
        if (nd->role == ROLE_DECODE) {
            if (wm)
                *received += pdl_run_msum(nd, "pdlink_write_done_received_total");
            else
                *sent += pdl_run_msum(nd, "pdlink_releases_sent_total");
        } else if (nd->role == ROLE_PREFILL) {
            if (wm)
                *sent += pdl_run_msum(nd, "pdlink_write_done_sent_total");
            else
                *received += pdl_run_msum(nd, "pdlink_releases_received_total");
        }
    }
}

/* The transfer figures as last scraped (a node not scraped adds nothing). */
void pdl_run_pull_figs(const run_ctx_t *c, pull_figs_t *f)
{
    memset(f, 0, sizeof(*f));
    bool wm = strcmp(c->o.mode, "write") == 0;
    for (int i = 0; i < c->nnodes; i++) {
        const run_node_t *nd = &c->nodes[i];
        if (nd->metrics == NULL)
            continue;
        f->verified += pdl_run_msum(nd, "pdlink_kv_bytes_verified_total");
        if (nd->role == (wm ? ROLE_PREFILL : ROLE_DECODE)) {
            f->kv_bytes += pdl_run_msum(nd, "pdlink_kv_bytes_total");
            f->descriptors += pdl_run_msum(nd, "pdlink_descriptors_total");
            f->read_seconds += pdl_run_metrics_sum(nd->metrics, "pdlink_read_seconds_total", NULL, NULL, NULL);
        }
        if (nd->role != ROLE_DECODE)
            continue;
        f->pulls += pdl_run_msum(nd, "pdlink_transfer_seconds_count");
        f->seconds += pdl_run_metrics_sum(nd->metrics, "pdlink_transfer_seconds_sum", NULL, NULL, NULL);
        f->busy_seconds += pdl_run_metrics_sum(nd->metrics, "pdlink_transfer_busy_seconds_total", NULL, NULL, NULL);
        pdl_run_metrics_hist_add(nd->metrics, "pdlink_transfer_seconds_bucket", &f->hist);
    }
}

/* f -= base: counters only grow on a live node, and a node restarted before base was taken counts
 * from its restart on both sides, so the difference is what came after base. */
#define FIG_SUB(x) (f->x = f->x > base->x ? f->x - base->x : 0)
static void pull_figs_sub(pull_figs_t *f, const pull_figs_t *base)
{
    FIG_SUB(pulls);
    FIG_SUB(kv_bytes);
    FIG_SUB(descriptors);
    FIG_SUB(verified);
    FIG_SUB(seconds);
    FIG_SUB(busy_seconds);
    FIG_SUB(read_seconds);
    for (int i = 0; i < f->hist.n; i++)
        for (int j = 0; j < base->hist.n; j++)
            if (f->hist.le[i] == base->hist.le[j])
                f->hist.cum[i] = f->hist.cum[i] > base->hist.cum[j] ? f->hist.cum[i] - base->hist.cum[j] : 0;
}
#undef FIG_SUB

void pdl_run_collect(run_ctx_t *c, pdl_run_result_t *r)
{
    r->metrics_ok = true;
    for (int i = 0; i < c->nnodes; i++) {
        run_node_t *nd = &c->nodes[i];
        if (nd->metrics == NULL) {
            pdl_run_result_note(r, "%s: /metrics could not be scraped", nd->child.name);
            r->metrics_ok = false;
            continue;
        }
        for (size_t k = 0; k < sizeof(per_rank_metrics) / sizeof(per_rank_metrics[0]); k++) {
            int found = 0;
            pdl_run_metrics_sum(nd->metrics, per_rank_metrics[k], NULL, NULL, &found);
            if (found == 0) {
                pdl_run_result_note(r, "%s: metric %s missing from /metrics", nd->child.name, per_rank_metrics[k]);
                r->metrics_ok = false;
            }
        }
        r->mismatched += pdl_run_msum(nd, "pdlink_kv_bytes_mismatched_total");
        r->expired += pdl_run_msum(nd, "pdlink_expired_total");
        r->held_blocks += pdl_run_msum(nd, "pdlink_held_blocks");
        r->node_failed_requests += (uint64_t)pdl_run_metrics_sum(nd->metrics, "pdlink_requests_total", "status",
                                                                 "failed", NULL);
        /* READ mode: the decode ranks read (bytes, descriptors, read time); WRITE mode: the prefill
         * ranks write. The transfer time (receive wait on the decode) is measured on the decode in both
         * modes. Only the side that moves the KV handshakes (and prewarms). */
        bool wm = strcmp(c->o.mode, "write") == 0;
        if (nd->role == (wm ? ROLE_PREFILL : ROLE_DECODE)) {
            r->prewarm_handshakes += pdl_run_msum(nd, "pdlink_prewarm_handshakes_total");
            r->transfer_handshakes += pdl_run_msum(nd, "pdlink_transfer_handshakes_total");
        }
    }
    /* Under --chaos what the chaos phase reaped is its own row (chaos.expired); this one is the final batch's. */
    r->expired = r->expired > c->chaos_expired_base ? r->expired - c->chaos_expired_base : 0;
    pdl_run_release_totals(c, &r->releases_sent, &r->releases_received);
    /* Under --chaos the transfers of the chaos passes are left out: these rows describe the final batch
     * (mismatched bytes stay whole-run: a chaos pass's mismatch must not vanish). */
    pull_figs_t pf;
    pdl_run_pull_figs(c, &pf);
    pull_figs_sub(&pf, &c->chaos_base);
    r->verified = pf.verified;
    r->kv_bytes = pf.kv_bytes;
    r->descriptors = pf.descriptors;
    r->read_seconds = pf.read_seconds;
    r->pulls = pf.pulls;
    r->pull_seconds = pf.seconds;
    r->busy_seconds = pf.busy_seconds;
    /*
     * The rate is bytes over the wall time during which the decode instances had a pull in flight (the
     * union of the pull intervals, per instance, summed over instances): the sum of pull seconds would
     * count the same wall time once per overlapping pull. It includes everything a pull waits for on
     * its instance (rank queues, handshakes, releases), as a transfer user sees it.
     */
    r->gbps = (r->kv_bytes > 0 && r->busy_seconds > 0) ? (double)r->kv_bytes / r->busy_seconds / 1e9 : -1;
    r->read_gbps = (r->kv_bytes > 0 && r->read_seconds > 0) ? (double)r->kv_bytes / r->read_seconds / 1e9 : -1;
    r->pull_p50_ms = r->pull_p99_ms = -1;
    if (r->pulls > 0 && pf.hist.n > 0) {
        r->pull_p50_ms = 1e3 * pdl_run_hist_quantile(&pf.hist, (double)r->pulls, 0.50);
        r->pull_p99_ms = 1e3 * pdl_run_hist_quantile(&pf.hist, (double)r->pulls, 0.99);
    }
    r->rank_ceiling_gbps = c->ceiling_gbps;
    r->ceiling_threads = pdl_run_topo_pull_threads(&r->topo);
    r->ceiling_gbps = pdl_run_inst_ceiling(c, r->ceiling_threads);
    if (r->ok > 0 && r->kv_bytes == 0)
        pdl_run_result_note(r, "no KV bytes moved although %d requests succeeded", r->ok);
    if (r->mismatched > 0)
        pdl_run_result_note(r, "%llu KV bytes mismatched at decode verification", (unsigned long long)r->mismatched);
    if (r->expired > 0)
        pdl_run_result_note(r, "%llu transfers expired (releases never came; reaped)", (unsigned long long)r->expired);
    if (r->held_blocks > 0) {
        char who[200] = "";
        size_t off = 0;
        for (int i = 0; i < c->nnodes && off < sizeof(who); i++) {
            uint64_t h = pdl_run_msum(&c->nodes[i], "pdlink_held_blocks");
            if (h > 0)
                off += (size_t)snprintf(who + off, sizeof(who) - off, "%s%s %llu", off ? ", " : "",
                                        c->nodes[i].child.name, (unsigned long long)h);
        }
        pdl_run_result_note(r, "%llu blocks still held %d s after the last response (%s)",
                            (unsigned long long)r->held_blocks, RUN_DRAIN_TIMEOUT_MS / 1000, who);
    }
    /* Moved bytes are whole blocks, verified bytes the prompt's token slots only, so verified < moved
     * is normal; nothing verified while KV moved means the decode never checked what it received. */
    if (r->verified == 0 && r->kv_bytes > 0)
        pdl_run_result_note(r, "%llu KV bytes moved but none verified", (unsigned long long)r->kv_bytes);
    if (r->releases_received != r->releases_expected || r->releases_sent != r->releases_expected)
        pdl_run_result_note(r, "%s: %llu sent, %llu received, %llu expected (max(P,D) per request)",
                            strcmp(c->o.mode, "write") == 0 ? "write_done" : "releases",
                            (unsigned long long)r->releases_sent, (unsigned long long)r->releases_received,
                            (unsigned long long)r->releases_expected);
}

/* Fill in the request-side figures of a result. */
void pdl_run_judge_requests(run_ctx_t *c, pdl_run_result_t *r)
{
    int n = c->o.requests;
    double *ttft = calloc((size_t)n, sizeof(double));
    double *added = calloc((size_t)n, sizeof(double));
    int nt = 0, na = 0, shown = 0;
    r->requests = n;
    for (int i = 0; i < n; i++) {
        pdl_run_req_t *q = &c->reqs[i];
        r->streaming += q->stream;
        if (!q->ok) {
            r->failed++;
            if (shown++ < 3)
                pdl_run_result_note(r, "request %d (%s%s) failed: %s", i, q->chat ? "chat" : "completion",
                                    q->stream ? ", streaming" : "", q->done ? q->error : "not completed");
            continue;
        }
        r->ok++;
        if (ttft != NULL && q->ttft_ms >= 0)
            ttft[nt++] = q->ttft_ms;
        /* The same prompt on one node: what P/D adds is the difference, request by request. */
        if (added != NULL && q->ttft_ms >= 0 && c->ref_ttft_ms != NULL && c->ref_ttft_ms[i] >= 0)
            added[na++] = q->ttft_ms - c->ref_ttft_ms[i];
        if (q->ttft_ms >= 0)
            r->ttft_seconds += q->ttft_ms / 1e3;
        r->request_seconds += q->total_ms / 1e3;
        if (c->ref_text[i] != NULL && strcmp(q->text, c->ref_text[i]) == 0) {
            r->parity_ok++;
        } else if (shown++ < 3) {
            pdl_run_result_note(r, "request %d: response differs from the reference: \"%.60s\" vs \"%.60s\"", i,
                                q->text, c->ref_text[i] ? c->ref_text[i] : "(none)");
        }
    }
    if (shown > 3)
        pdl_run_result_note(r, "... and %d more failed or differing requests", shown - 3);
    if (ttft != NULL && nt > 0) {
        qsort(ttft, (size_t)nt, sizeof(double), cmp_double);
        r->ttft_p50_ms = percentile(ttft, nt, 50);
        r->ttft_p99_ms = percentile(ttft, nt, 99);
    } else {
        r->ttft_p50_ms = r->ttft_p99_ms = -1;
    }
    free(ttft);
    if (added != NULL && na > 0) {
        qsort(added, (size_t)na, sizeof(double), cmp_double);
        r->ttft_added_p50_ms = percentile(added, na, 50);
        r->ttft_added_p99_ms = percentile(added, na, 99);
    } else {
        r->ttft_added_p50_ms = r->ttft_added_p99_ms = -1;
    }
    free(added);
    int pmax = 0, dmax = 0;
    for (int k = 0; k < r->topo.np; k++)
        pmax = r->topo.ptp[k] > pmax ? r->topo.ptp[k] : pmax;
    for (int k = 0; k < r->topo.nd; k++)
        dmax = r->topo.dtp[k] > dmax ? r->topo.dtp[k] : dmax;
    /* Exact only when all instances of a side have one TP size (the seed topologies); see pdl_run_collect(). */
    r->releases_expected = (uint64_t)r->ok * (uint64_t)(pmax > dmax ? pmax : dmax);
}
