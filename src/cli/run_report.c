/*
 * run_report.c -- verdict rules and the text/JSON report of `pdlink run` (see run_report.h).
 *
 * The text table has one row per figure and one column per topology: five seed topologies fit an
 * 80-100 column terminal that way, while a row per topology would need twenty columns. Notes (a dead
 * child, a failed request's reason, a missing metric) follow the table per topology, then one verdict
 * line that a script can grep ("PASS" / "FAIL").
 */
#include "cli/run_report.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void pdl_run_topo_describe(const pdl_run_topo_t *t, char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < t->np && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%sTP%d", i ? "+" : "", t->ptp[i]);
    if (off < len)
        off += (size_t)snprintf(buf + off, len - off, " -> ");
    for (int i = 0; i < t->nd && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%sTP%d", i ? "+" : "", t->dtp[i]);
}

void pdl_run_ratio_pairs(const double *meas, const double *ceil, int n, pdl_run_ratio_t *out)
{
    pdl_pairs_t p;
    pdl_pairs_init(&p);
    for (int i = 0; i < n && pdl_pairs_count(&p) < PDL_RUN_MAX_PAIRS; i++)
        (void)pdl_pairs_add(&p, meas[i], ceil[i]); /* a round without a figure (< 0) or a failed ceiling: no pair */
    pdl_pairs_summary_t sum;
    pdl_pairs_summarize(&p, PDL_PAIRS_SPREAD_MAX, PDL_PAIRS_ABOVE_TOL, &sum);
    *out = (pdl_run_ratio_t){.pairs = sum.n, .median = -1, .min = -1, .max = -1, .ceiling_median = -1};
    if (sum.n == 0)
        return;
    out->median = sum.ratio_median;
    out->min = sum.ratio_min;
    out->max = sum.ratio_max;
    out->ceiling_median = sum.ceiling_median;
    out->spread = sum.spread;
    out->wide = sum.verdict == PDL_PAIRS_UNSTABLE;
    out->above = sum.verdict == PDL_PAIRS_ABOVE_CEILING;
}

void pdl_run_ratio_cell(const pdl_run_ratio_t *r, char *buf, size_t len)
{
    if (r->pairs == 0)
        snprintf(buf, len, "-");
    else if (r->pairs < PDL_RUN_MIN_PAIRS)
        snprintf(buf, len, "n=%d<%d %.0f%%", r->pairs, PDL_RUN_MIN_PAIRS, 100 * r->median);
    else if (r->wide)
        snprintf(buf, len, "wide %.0f-%.0f%%", 100 * r->min, 100 * r->max);
    else
        snprintf(buf, len, "%.0f%% %.0f-%.0f%s", 100 * r->median, 100 * r->min, 100 * r->max, r->above ? "!" : "");
}

double pdl_run_chaos_p99_ratio(const pdl_run_chaos_result_t *ch)
{
    const pdl_run_chaos_lat_t *b = &ch->healthy_lat[PDL_RUN_CHAOS_BEFORE], *d = &ch->healthy_lat[PDL_RUN_CHAOS_DURING];
    if (b->ok < PDL_RUN_CHAOS_MIN_SAMPLES || d->ok < PDL_RUN_CHAOS_MIN_SAMPLES || b->p99_ms <= 0)
        return -1;
    return d->p99_ms / b->p99_ms;
}

/* A healthy-prefill phase cell: "12 / 30 (n=24)", "n=6<20 12 ms" (too few for a p99), "-" (none). The
 * failures of the phase follow as "+2 failed". */
static int chaos_lat_cell(const pdl_run_chaos_lat_t *l, char *buf, size_t len)
{
    char fails[32] = "";
    if (l->failed > 0)
        snprintf(fails, sizeof(fails), " +%d failed", l->failed);
    if (l->ok == 0)
        return snprintf(buf, len, "-%s", fails);
    if (l->ok < PDL_RUN_CHAOS_MIN_SAMPLES)
        return snprintf(buf, len, "n=%d<%d %.0f%s", l->ok, PDL_RUN_CHAOS_MIN_SAMPLES, l->p50_ms, fails);
    return snprintf(buf, len, "%.0f / %.0f (n=%d)%s", l->p50_ms, l->p99_ms, l->ok, fails);
}

void pdl_run_result_note(pdl_run_result_t *r, const char *fmt, ...)
{
    if (r->nnotes >= PDL_RUN_MAX_NOTES)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->notes[r->nnotes], sizeof(r->notes[0]), fmt, ap);
    va_end(ap);
    r->nnotes++;
}

uint64_t pdl_run_chaos_expired_bound(const pdl_run_result_t *r)
{
    if (!r->chaos.excused_expired)
        return 0;
    /* A failed request leaves at most one hold per rank of the prefill that served it, each reaped once. */
    int tp = 1;
    for (int i = 0; i < r->topo.np; i++)
        tp = r->topo.ptp[i] > tp ? r->topo.ptp[i] : tp;
    return (uint64_t)r->chaos.failed_outage * (uint64_t)tp;
}

void pdl_run_result_judge(pdl_run_result_t *r, bool had_failure_note)
{
    r->pass = r->ran && !had_failure_note && r->requests > 0 && r->failed == 0 && r->ok == r->requests &&
              r->parity_ok == r->requests && r->mismatched == 0 && r->expired == 0 && r->held_blocks == 0 &&
              r->metrics_ok && r->kv_bytes > 0 && r->verified > 0;
    const pdl_run_chaos_result_t *ch = &r->chaos;
    if (ch->on) {
        bool all_back = ch->nvictims > 0;
        for (int k = 0; k < ch->nvictims; k++)
            all_back = all_back && ch->recovered[k];
        r->pass = r->pass && all_back && ch->failed_outside == 0 && ch->parity_bad == 0 &&
                  ch->mismatched_killed == 0 && ch->expired <= pdl_run_chaos_expired_bound(r);
    }
}

static void fmt_bytes(char *b, size_t n, uint64_t v)
{
    if (v >= 10000000000ULL)
        snprintf(b, n, "%.2f GB", (double)v / 1e9);
    else if (v >= 10000000ULL)
        snprintf(b, n, "%.1f MB", (double)v / 1e6);
    else
        snprintf(b, n, "%llu", (unsigned long long)v);
}

void pdl_run_report_verdict(FILE *out, const pdl_run_result_t *rs, int n)
{
    int pass = 0;
    for (int i = 0; i < n; i++)
        pass += rs[i].pass;
    if (n > 0 && pass == n) {
        fprintf(out, "PASS: %d/%d topologies: every response equals the single-node reference, every KV byte "
                     "verified, no expired transfer, no block left held\n", pass, n);
        return;
    }
    fprintf(out, "FAIL: %d/%d topologies passed; failed:", pass, n);
    for (int i = 0; i < n; i++)
        if (!rs[i].pass)
            fprintf(out, " %s", rs[i].topo.name);
    fprintf(out, "\n");
}

#define ROW(label, ...)                                                    \
    do {                                                                   \
        fprintf(out, "  %-24s", label);                                    \
        for (int i_ = 0; i_ < n; i_++) {                                   \
            const pdl_run_result_t *r = &rs[i_];                           \
            char cell[64];                                                 \
            __VA_ARGS__;                                                   \
            fprintf(out, " %16s", cell);                                   \
        }                                                                  \
        fprintf(out, "\n");                                                \
    } while (0)

/* The run's settings and the ceilings measured. */
static void print_header(FILE *out, const pdl_run_report_info_t *info)
{
    fprintf(out, "\npdlink run: model %s, backend %s, %s mode, %d requests per topology at concurrency %d, "
                 "prompts %d-%d tokens, max_tokens %d\n",
            info->model, info->backend, info->mode, info->requests, info->concurrency, info->prompt_min,
            info->prompt_max, info->max_tokens);
    if (info->ceiling_gbps > 0 || info->ninst_ceilings > 0) {
        fprintf(out, "ceilings (measured in this run, %s):", info->ceiling_kind);
        if (info->ceiling_gbps > 0)
            fprintf(out, " %.2f GB/s with %d thread%s (one rank's engine)", info->ceiling_gbps,
                    info->ceiling_threads, info->ceiling_threads == 1 ? "" : "s");
        for (int i = 0; i < info->ninst_ceilings; i++)
            fprintf(out, "%s %.2f GB/s with %d threads", i == 0 && info->ceiling_gbps > 0 ? ";" : (i ? "," : ""),
                    info->inst_ceiling_gbps[i], info->inst_ceiling_threads[i]);
        if (info->ninst_ceilings > 0)
            fprintf(out, " (a decode instance: one pull worker per rank)");
        fprintf(out, "\n");
    } else {
        fprintf(out, "ceiling: not measured\n");
    }
}

/* The table: one column per topology, one row per figure. */
static void print_rows(FILE *out, const pdl_run_report_info_t *info, const pdl_run_result_t *rs, int n)
{
    /* In WRITE mode the prefill pushes: the fan-in is write_done, and a decode "pull" is a receive. */
    bool w = strcmp(info->mode, "write") == 0;
    fprintf(out, "\n  %-24s", "topology");
    for (int i = 0; i < n; i++)
        fprintf(out, " %16s", rs[i].topo.name);
    fprintf(out, "\n");
    ROW("prefill -> decode", pdl_run_topo_describe(&r->topo, cell, sizeof(cell)));
    ROW("requests (streaming)", snprintf(cell, sizeof(cell), "%d (%d)", r->requests, r->streaming));
    ROW("ok / failed", snprintf(cell, sizeof(cell), "%d / %d", r->ok, r->failed));
    ROW("output parity", snprintf(cell, sizeof(cell), "%d/%d", r->parity_ok, r->requests));
    ROW("KV bytes moved", fmt_bytes(cell, sizeof(cell), r->kv_bytes));
    ROW("bytes verified", fmt_bytes(cell, sizeof(cell), r->verified));
    ROW("mismatched bytes", snprintf(cell, sizeof(cell), "%llu", (unsigned long long)r->mismatched));
    ROW("descriptors", snprintf(cell, sizeof(cell), "%llu", (unsigned long long)r->descriptors));
    ROW(w ? "write_done sent / recv" : "releases sent / recv", snprintf(cell, sizeof(cell), "%llu / %llu", (unsigned long long)r->releases_sent,
                                         (unsigned long long)r->releases_received));
    ROW("expired", snprintf(cell, sizeof(cell), "%llu", (unsigned long long)r->expired));
    ROW("blocks held at end", snprintf(cell, sizeof(cell), "%llu", (unsigned long long)r->held_blocks));
    ROW("TTFT p50 / p99 (ms)", r->ttft_p50_ms < 0 ? snprintf(cell, sizeof(cell), "-")
                                                  : snprintf(cell, sizeof(cell), "%.1f / %.1f", r->ttft_p50_ms,
                                                             r->ttft_p99_ms));
    ROW("TTFT added p50 / p99", r->ttft_added_p50_ms == -1 && r->ttft_added_p99_ms == -1
                                    ? snprintf(cell, sizeof(cell), "-")
                                    : snprintf(cell, sizeof(cell), "%+.1f / %+.1f", r->ttft_added_p50_ms,
                                               r->ttft_added_p99_ms));
    ROW(w ? "receive % of TTFT / req" : "transfer % of TTFT / req",
        (r->ttft_seconds <= 0 || r->request_seconds <= 0)
            ? snprintf(cell, sizeof(cell), "-")
            : snprintf(cell, sizeof(cell), "%.0f%% / %.0f%%", 100.0 * r->pull_seconds / r->ttft_seconds,
                       100.0 * r->pull_seconds / r->request_seconds));
    ROW(w ? "receives" : "pulls", snprintf(cell, sizeof(cell), "%llu", (unsigned long long)r->pulls));
    ROW(w ? "receive p50 / p99 (ms)" : "pull p50 / p99 (ms)", r->pull_p50_ms < 0 ? snprintf(cell, sizeof(cell), "-")
                                                  : snprintf(cell, sizeof(cell), "%.1f / %.1f", r->pull_p50_ms,
                                                             r->pull_p99_ms));
    ROW(w ? "pushes that handshaked" : "pulls that handshaked",
        snprintf(cell, sizeof(cell), "%llu (%llu ahead)", (unsigned long long)r->transfer_handshakes,
                 (unsigned long long)r->prewarm_handshakes));
    ROW("transfer busy (s)", snprintf(cell, sizeof(cell), "%.3f", r->busy_seconds));
    ROW("transfer GB/s", r->gbps < 0 ? snprintf(cell, sizeof(cell), "-") : snprintf(cell, sizeof(cell), "%.2f", r->gbps));
    ROW("of ceiling, T threads", pdl_run_ratio_cell(&r->inst_ratio, cell, sizeof(cell)));
    ROW(w ? "engine write GB/s/rank" : "engine read GB/s/rank", r->read_gbps < 0 ? snprintf(cell, sizeof(cell), "-")
                                                  : snprintf(cell, sizeof(cell), "%.2f", r->read_gbps));
    ROW("of ceiling, 1 thread", pdl_run_ratio_cell(&r->rank_ratio, cell, sizeof(cell)));
    ROW("ceiling T (threads)", r->inst_ratio.pairs == 0 ? snprintf(cell, sizeof(cell), "-")
                                                        : snprintf(cell, sizeof(cell), "%.2f (%d)",
                                                                   r->inst_ratio.ceiling_median, r->ceiling_threads));
}

/* --chaos: the chaos phase's rows, then one group per event of the schedule and the healthy prefill's
 * latency by phase. */
static void print_chaos_rows(FILE *out, const pdl_run_result_t *rs, int n)
{
    ROW("chaos: passes", snprintf(cell, sizeof(cell), "%d", r->chaos.passes));
    ROW("outage ok / failed", snprintf(cell, sizeof(cell), "%d / %d", r->chaos.ok_outage, r->chaos.failed_outage));
    ROW("outside ok / failed", snprintf(cell, sizeof(cell), "%d / %d", r->chaos.ok_outside,
                                        r->chaos.failed_outside));
    /* One pair of rows per event of the schedule (the same for every topology of a run). */
    const pdl_run_chaos_result_t *c0 = NULL;
    for (int i = 0; i < n && c0 == NULL; i++)
        c0 = rs[i].chaos.on ? &rs[i].chaos : NULL;
    for (int k = 0; k < c0->nvictims; k++) {
        char label[48];
        if (c0->action[k] == PDL_RUN_CHAOS_PAUSE)
            snprintf(label, sizeof(label), "paused %.1f s", c0->pause_s[k]);
        else
            snprintf(label, sizeof(label), "killed");
        ROW(label, snprintf(cell, sizeof(cell), "%s", k < r->chaos.nvictims ? r->chaos.victim[k] : "-"));
        ROW("  ok / failed", k >= r->chaos.nvictims ? snprintf(cell, sizeof(cell), "-")
                                                   : snprintf(cell, sizeof(cell), "%d / %d", r->chaos.ok_event[k],
                                                              r->chaos.failed_event[k]));
        ROW("  healthy / served (s)",
            k >= r->chaos.nvictims || (r->chaos.restart_s[k] < 0 && r->chaos.recover_s[k] < 0)
                ? snprintf(cell, sizeof(cell), "-")
                : snprintf(cell, sizeof(cell), "%.1f / %.1f", r->chaos.restart_s[k], r->chaos.recover_s[k]));
    }
    ROW("chaos: reaped (allowed)", snprintf(cell, sizeof(cell), "%llu (%llu)", (unsigned long long)r->chaos.expired,
                                            (unsigned long long)pdl_run_chaos_expired_bound(r)));
    ROW("chaos: parity", snprintf(cell, sizeof(cell), "%d/%d", r->chaos.ok_outage + r->chaos.ok_outside -
                                  r->chaos.parity_bad, r->chaos.ok_outage + r->chaos.ok_outside));
    ROW("victims' mismatched", snprintf(cell, sizeof(cell), "%llu", (unsigned long long)r->chaos.mismatched_killed));
    ROW("prefill not killed", snprintf(cell, sizeof(cell), "%.60s", r->chaos.healthy[0] ? r->chaos.healthy : "-"));
    static const char *const phase_row[PDL_RUN_CHAOS_PHASES] = {
        "  before: p50 / p99 ms", "  outage: p50 / p99 ms", "  after: p50 / p99 ms"};
    for (int k = 0; k < PDL_RUN_CHAOS_PHASES; k++)
        ROW(phase_row[k], r->chaos.healthy[0] ? chaos_lat_cell(&r->chaos.healthy_lat[k], cell, sizeof(cell))
                                              : snprintf(cell, sizeof(cell), "-"));
    ROW("  p99 outage / before", pdl_run_chaos_p99_ratio(&r->chaos) < 0
                                     ? snprintf(cell, sizeof(cell), "-")
                                     : snprintf(cell, sizeof(cell), "%.2f%s", pdl_run_chaos_p99_ratio(&r->chaos),
                                                pdl_run_chaos_p99_ratio(&r->chaos) > 2 ? "!" : ""));
}

/* What the rows mean where it is not obvious, each topology's notes, the time and the verdict. */
static void print_footer(FILE *out, const pdl_run_report_info_t *info, const pdl_run_result_t *rs, int n, bool chaos)
{
    if (chaos)
        fprintf(out, "\n  --chaos: the rows above \"chaos\" are the final batch's, sent after the chaos schedule; an"
                     " outage runs from\n  a kill (or SIGSTOP) to the first success through the node again (\"served\","
                     " seconds after the kill\n  or stop); \"reaped\": transfers expired during the chaos phase, and"
                     " how many the outages' failures excuse\n  \"prefill not killed\": the requests pdlink-router's X-Pdlink-Prefill header"
                     " says it served,\n  before the other's kill (outside the decode's outage), during its outage"
                     " and after; p50 / p99\n  of the successes (start to last byte), \"n=k<%d\": too few for a p99,"
                     " no ratio; \"!\": ratio above 2\n", PDL_RUN_CHAOS_MIN_SAMPLES);
    fprintf(out, "\n  of ceiling: median of %d+ alternating pairs (a round of the workload right after its own ceiling)"
                 " with min-max;\n  \"wide\": spread (q3 - q1) / median > %.2f, no figure; \"!\": above the ceiling"
                 " (by > %.0f%%), which is then no upper bound\n", PDL_RUN_MIN_PAIRS, PDL_PAIRS_SPREAD_MAX,
            100 * PDL_PAIRS_ABOVE_TOL);
    for (int i = 0; i < n; i++) {
        if (rs[i].nnotes == 0)
            continue;
        fprintf(out, "\n%s:\n", rs[i].topo.name);
        for (int k = 0; k < rs[i].nnotes; k++)
            fprintf(out, "  - %s\n", rs[i].notes[k]);
    }
    fprintf(out, "\n(%.1f s", info->elapsed_s);
    if (info->log_dir != NULL)
        fprintf(out, "; logs in %s", info->log_dir);
    fprintf(out, ")\n");
    pdl_run_report_verdict(out, rs, n);
}

void pdl_run_report_print(FILE *out, const pdl_run_report_info_t *info, const pdl_run_result_t *rs, int n)
{
    bool chaos = false;
    for (int i = 0; i < n; i++)
        chaos = chaos || rs[i].chaos.on;
    print_header(out, info);
    print_rows(out, info, rs, n);
    if (chaos)
        print_chaos_rows(out, rs, n);
    ROW("result", snprintf(cell, sizeof(cell), "%s", r->pass ? "pass" : "FAIL"));
    print_footer(out, info, rs, n, chaos);
}

/* {"pairs", "median", "min", "max", "wide", "above"}; the numbers null without a pair. */
static json_t *ratio_json(const pdl_run_ratio_t *q)
{
    json_t *o = json_object();
    json_object_set_new(o, "pairs", json_integer(q->pairs));
    json_object_set_new(o, "median", q->pairs ? json_real(q->median) : json_null());
    json_object_set_new(o, "min", q->pairs ? json_real(q->min) : json_null());
    json_object_set_new(o, "max", q->pairs ? json_real(q->max) : json_null());
    json_object_set_new(o, "ceiling_gbps", q->pairs ? json_real(q->ceiling_median) : json_null());
    json_object_set_new(o, "spread", q->pairs ? json_real(q->spread) : json_null());
    json_object_set_new(o, "wide", json_boolean(q->wide));
    json_object_set_new(o, "above", json_boolean(q->above));
    return o;
}

/* --chaos: {"passes", "ok_outage", ..., "victims": [{"node", "action", "recovered", "restart_seconds", ...}],
 * "expired", "expired_allowed"}. */
static json_t *chaos_json(const pdl_run_result_t *r)
{
    const pdl_run_chaos_result_t *ch = &r->chaos;
    json_t *vs = json_array();
    for (int k = 0; k < ch->nvictims; k++)
        json_array_append_new(vs, json_pack("{s:s, s:s, s:f, s:i, s:i, s:b, s:o, s:o}", "node", ch->victim[k],
                                            "action", ch->action[k] == PDL_RUN_CHAOS_PAUSE ? "pause" : "kill",
                                            "pause_seconds", ch->pause_s[k], "ok", ch->ok_event[k], "failed",
                                            ch->failed_event[k], "recovered",
                                            ch->recovered[k], "restart_seconds",
                                            ch->restart_s[k] < 0 ? json_null() : json_real(ch->restart_s[k]),
                                            "recover_seconds",
                                            ch->recover_s[k] < 0 ? json_null() : json_real(ch->recover_s[k])));
    json_t *healthy = json_null();
    if (ch->healthy[0]) {
        static const char *const phase[PDL_RUN_CHAOS_PHASES] = {"before", "during", "after"};
        healthy = json_pack("{s:s, s:i}", "prefill", ch->healthy, "min_samples", PDL_RUN_CHAOS_MIN_SAMPLES);
        for (int k = 0; k < PDL_RUN_CHAOS_PHASES; k++) {
            const pdl_run_chaos_lat_t *l = &ch->healthy_lat[k];
            bool enough = l->ok >= PDL_RUN_CHAOS_MIN_SAMPLES;
            json_object_set_new(healthy, phase[k],
                                json_pack("{s:i, s:i, s:o, s:o}", "ok", l->ok, "failed", l->failed, "p50_ms",
                                          l->ok ? json_real(l->p50_ms) : json_null(), "p99_ms",
                                          enough ? json_real(l->p99_ms) : json_null()));
        }
        double ratio = pdl_run_chaos_p99_ratio(ch);
        json_object_set_new(healthy, "p99_ratio", ratio < 0 ? json_null() : json_real(ratio));
    }
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:I, s:o, s:I, s:I}", "passes", ch->passes, "ok_outage",
                     ch->ok_outage, "failed_outage", ch->failed_outage, "ok_outside", ch->ok_outside, "failed_outside",
                     ch->failed_outside, "parity_bad", ch->parity_bad, "victims", vs, "mismatched_killed",
                     (json_int_t)ch->mismatched_killed, "healthy_prefill", healthy, "expired", (json_int_t)ch->expired,
                     "expired_allowed", (json_int_t)pdl_run_chaos_expired_bound(r));
}

json_t *pdl_run_report_json(const pdl_run_report_info_t *info, const pdl_run_result_t *rs, int n)
{
    json_t *tops = json_array();
    int pass = 0;
    for (int i = 0; i < n; i++) {
        const pdl_run_result_t *r = &rs[i];
        pass += r->pass;
        char desc[96];
        pdl_run_topo_describe(&r->topo, desc, sizeof(desc));
        json_t *ptp = json_array(), *dtp = json_array(), *notes = json_array();
        for (int k = 0; k < r->topo.np; k++)
            json_array_append_new(ptp, json_integer(r->topo.ptp[k]));
        for (int k = 0; k < r->topo.nd; k++)
            json_array_append_new(dtp, json_integer(r->topo.dtp[k]));
        for (int k = 0; k < r->nnotes; k++)
            json_array_append_new(notes, json_string(r->notes[k]));
        json_t *t = json_pack("{s:s, s:s, s:o, s:o, s:b, s:i, s:i, s:i, s:i, s:i}", "name", r->topo.name,
                              "description", desc, "prefill_tp", ptp, "decode_tp", dtp, "ran", r->ran,
                              "requests", r->requests, "streaming", r->streaming, "ok", r->ok, "failed",
                              r->failed, "parity_ok", r->parity_ok);
        json_object_set_new(t, "parity_total", json_integer(r->requests));
        json_object_set_new(t, "kv_bytes", json_integer((json_int_t)r->kv_bytes));
        json_object_set_new(t, "bytes_verified", json_integer((json_int_t)r->verified));
        json_object_set_new(t, "bytes_mismatched", json_integer((json_int_t)r->mismatched));
        json_object_set_new(t, "descriptors", json_integer((json_int_t)r->descriptors));
        json_object_set_new(t, "releases_sent", json_integer((json_int_t)r->releases_sent));
        json_object_set_new(t, "releases_received", json_integer((json_int_t)r->releases_received));
        json_object_set_new(t, "releases_expected", json_integer((json_int_t)r->releases_expected));
        json_object_set_new(t, "expired", json_integer((json_int_t)r->expired));
        json_object_set_new(t, "held_blocks", json_integer((json_int_t)r->held_blocks));
        json_object_set_new(t, "node_failed_requests", json_integer((json_int_t)r->node_failed_requests));
        json_object_set_new(t, "pulls", json_integer((json_int_t)r->pulls));
        json_object_set_new(t, "pull_seconds", json_real(r->pull_seconds));
        json_object_set_new(t, "pull_p50_ms", r->pull_p50_ms < 0 ? json_null() : json_real(r->pull_p50_ms));
        json_object_set_new(t, "pull_p99_ms", r->pull_p99_ms < 0 ? json_null() : json_real(r->pull_p99_ms));
        json_object_set_new(t, "transfer_busy_seconds", json_real(r->busy_seconds));
        json_object_set_new(t, "ttft_added_p50_ms",
                            r->ttft_added_p50_ms == -1 && r->ttft_added_p99_ms == -1 ? json_null()
                                                                                    : json_real(r->ttft_added_p50_ms));
        json_object_set_new(t, "ttft_added_p99_ms",
                            r->ttft_added_p50_ms == -1 && r->ttft_added_p99_ms == -1 ? json_null()
                                                                                    : json_real(r->ttft_added_p99_ms));
        json_object_set_new(t, "transfer_share_of_ttft",
                            r->ttft_seconds > 0 ? json_real(r->pull_seconds / r->ttft_seconds) : json_null());
        json_object_set_new(t, "transfer_share_of_request",
                            r->request_seconds > 0 ? json_real(r->pull_seconds / r->request_seconds) : json_null());
        json_object_set_new(t, "prewarm_handshakes", json_integer((json_int_t)r->prewarm_handshakes));
        json_object_set_new(t, "transfer_handshakes", json_integer((json_int_t)r->transfer_handshakes));
        json_object_set_new(t, "read_seconds", json_real(r->read_seconds));
        json_object_set_new(t, "engine_read_gbps", r->read_gbps < 0 ? json_null() : json_real(r->read_gbps));
        json_object_set_new(t, "ttft_p50_ms", r->ttft_p50_ms < 0 ? json_null() : json_real(r->ttft_p50_ms));
        json_object_set_new(t, "ttft_p99_ms", r->ttft_p99_ms < 0 ? json_null() : json_real(r->ttft_p99_ms));
        json_object_set_new(t, "transfer_gbps", r->gbps < 0 ? json_null() : json_real(r->gbps));
        json_object_set_new(t, "ceiling_gbps", r->ceiling_gbps <= 0 ? json_null() : json_real(r->ceiling_gbps));
        json_object_set_new(t, "ceiling_ratio", ratio_json(&r->inst_ratio));
        json_object_set_new(t, "ceiling_threads", json_integer(r->ceiling_threads));
        json_object_set_new(t, "rank_ceiling_gbps",
                            r->rank_ceiling_gbps <= 0 ? json_null() : json_real(r->rank_ceiling_gbps));
        json_object_set_new(t, "engine_read_ceiling_ratio", ratio_json(&r->rank_ratio));
        json_object_set_new(t, "metrics_complete", json_boolean(r->metrics_ok));
        if (r->chaos.on)
            json_object_set_new(t, "chaos", chaos_json(r));
        json_object_set_new(t, "notes", notes);
        json_object_set_new(t, "pass", json_boolean(r->pass));
        json_array_append_new(tops, t);
    }
    json_t *root = json_object();
    json_object_set_new(root, "model", json_string(info->model));
    json_object_set_new(root, "backend", json_string(info->backend));
    json_object_set_new(root, "mode", json_string(info->mode));
    json_object_set_new(root, "requests_per_topology", json_integer(info->requests));
    json_object_set_new(root, "concurrency", json_integer(info->concurrency));
    json_object_set_new(root, "prompt_tokens", json_pack("[i,i]", info->prompt_min, info->prompt_max));
    json_object_set_new(root, "max_tokens", json_integer(info->max_tokens));
    json_object_set_new(root, "ceiling", json_pack("{s:s, s:i, s:o}", "kind", info->ceiling_kind, "threads",
                                                   info->ceiling_threads, "gbps",
                                                   info->ceiling_gbps > 0 ? json_real(info->ceiling_gbps)
                                                                          : json_null()));
    json_t *ic = json_array();
    for (int i = 0; i < info->ninst_ceilings; i++)
        json_array_append_new(ic, json_pack("{s:i, s:f}", "threads", info->inst_ceiling_threads[i], "gbps",
                                            info->inst_ceiling_gbps[i]));
    json_object_set_new(root, "instance_ceilings", ic);
    json_object_set_new(root, "elapsed_seconds", json_real(info->elapsed_s));
    json_object_set_new(root, "log_dir", info->log_dir ? json_string(info->log_dir) : json_null());
    json_object_set_new(root, "topologies", tops);
    json_object_set_new(root, "passed", json_integer(pass));
    json_object_set_new(root, "pass", json_boolean(n > 0 && pass == n));
    return root;
}
