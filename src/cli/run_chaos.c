/*
 * run_chaos.c -- the chaos phase of `pdlink run --chaos` (issue 11): kill -9 and restart a decode, then
 * a prefill, under load; the state machine, the outage windows and the classification of every request
 * are described in run_chaos.h.
 *
 * A request overlaps an outage when it was in flight at some moment between a kill and the first
 * success through the restarted node: its start (seen done at end_ms, minus its own total_ms) is before
 * the window's end and its end after the kill. end_ms has the tick's resolution (about 50 ms), which
 * only widens the window a little; the windows bound what is excused, they are never judged as times.
 */
#include "cli/run_chaos.h"

#include <signal.h>
#include <time.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/run_metrics.h"
#include "common/clock.h"

static void chaos_say(const pdl_run_chaos_t *ch, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void chaos_say(const pdl_run_chaos_t *ch, const char *fmt, ...)
{
    if (ch->quiet)
        return;
    flockfile(stderr);
    fprintf(stderr, "[%s] chaos: ", ch->name);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    funlockfile(stderr);
}

pdl_status_t pdl_run_chaos_init(pdl_run_chaos_t *ch, const pdl_run_chaos_ops_t *ops, const char *name, bool quiet,
                                pdl_run_child_t *const victims[], const char *const health_urls[],
                                const char *const metrics_urls[], const char *const served[], int nv,
                                pdl_run_req_t *reqs, char *const *ref_text, int n, pdl_run_result_t *r)
{
    memset(ch, 0, sizeof(*ch));
    ch->end_ms = calloc((size_t)(n > 0 ? n : 1), sizeof(uint64_t));
    if (ch->end_ms == NULL)
        return PDL_ERR_NOMEM;
    ch->ops = *ops;
    ch->name = name;
    ch->quiet = quiet;
    ch->nv = nv < PDL_RUN_CHAOS_VICTIMS ? nv : PDL_RUN_CHAOS_VICTIMS;
    ch->reqs = reqs;
    ch->ref_text = ref_text;
    ch->n = n;
    ch->res = &r->chaos;
    ch->notes = r;
    /* A quarter of the workload before each kill: the cluster is busy, not starting or draining. */
    ch->gap = n / 4 > 0 ? n / 4 : 1;
    ch->next_kill_at = ch->gap;
    memset(ch->res, 0, sizeof(*ch->res));
    ch->res->on = true;
    ch->res->nvictims = ch->nv;
    for (int k = 0; k < PDL_RUN_CHAOS_VICTIMS; k++)
        ch->res->restart_s[k] = ch->res->recover_s[k] = -1;
    for (int k = 0; k < ch->nv; k++) {
        pdl_run_chaos_victim_t *v = &ch->v[k];
        v->child = victims[k];
        snprintf(v->health_url, sizeof(v->health_url), "%s", health_urls[k]);
        snprintf(v->metrics_url, sizeof(v->metrics_url), "%s", metrics_urls[k]);
        v->served_metric = served[k];
        snprintf(ch->res->victim[k], sizeof(ch->res->victim[k]), "%s", victims[k]->name);
    }
    /* "http://host:port/health" -> "host:port": how the router names the prefill victim. */
    if (ch->nv > 1) {
        const char *h = strstr(health_urls[1], "://");
        h = h ? h + 3 : health_urls[1];
        const char *slash = strchr(h, '/');
        snprintf(ch->victim_prefill, sizeof(ch->victim_prefill), "%.*s", (int)(slash ? slash - h : (long)strlen(h)), h);
    }
    ch->extra_until = -1;
    return PDL_OK;
}

void pdl_run_chaos_fini(pdl_run_chaos_t *ch)
{
    free(ch->end_ms);
    ch->end_ms = NULL;
    free(ch->samples);
    ch->samples = NULL;
}

/* Keep finished request q as a sample; the first prefill other than the victim is the healthy one. */
static void add_sample(pdl_run_chaos_t *ch, const pdl_run_req_t *q)
{
    if (ch->nsamples == ch->capsamples) {
        int nc = ch->capsamples ? 2 * ch->capsamples : 256;
        pdl_run_chaos_sample_t *ns = realloc(ch->samples, (size_t)nc * sizeof(*ns));
        if (ns == NULL)
            return; /* fewer samples: the report says so if it leaves too few */
        ch->samples = ns;
        ch->capsamples = nc;
    }
    if (ch->res->healthy[0] == '\0' && q->prefill[0] != '\0' && ch->victim_prefill[0] != '\0' &&
        strcmp(q->prefill, ch->victim_prefill) != 0)
        snprintf(ch->res->healthy, sizeof(ch->res->healthy), "%s", q->prefill);
    ch->samples[ch->nsamples++] = (pdl_run_chaos_sample_t){
        .start_ms = q->start_ns / 1000000,
        .end_ms = q->end_ns / 1000000,
        .ms = q->total_ms,
        .ok = q->ok,
        .healthy = ch->res->healthy[0] != '\0' && strcmp(q->prefill, ch->res->healthy) == 0,
    };
}

/* Does sample s overlap victim k's outage window [kill, first success] (open-ended while not served)? */
static bool overlaps(const pdl_run_chaos_t *ch, const pdl_run_chaos_sample_t *s, int k)
{
    const pdl_run_chaos_victim_t *v = &ch->v[k];
    if (v->kill_ms == 0)
        return false;
    uint64_t until = v->served_ms != 0 ? v->served_ms : UINT64_MAX;
    return s->start_ms <= until && s->end_ms >= v->kill_ms;
}

/* The phase of a healthy sample relative to the prefill victim (index 1): BEFORE, DURING, AFTER, or -1
 * (during the decode's outage, or before the prefill victim exists). */
static int sample_phase(const pdl_run_chaos_t *ch, const pdl_run_chaos_sample_t *s)
{
    if (ch->nv < 2 || overlaps(ch, s, 0))
        return -1;
    const pdl_run_chaos_victim_t *v = &ch->v[1];
    if (overlaps(ch, s, 1))
        return PDL_RUN_CHAOS_DURING;
    if (v->kill_ms == 0 || s->end_ms < v->kill_ms)
        return PDL_RUN_CHAOS_BEFORE;
    return PDL_RUN_CHAOS_AFTER;
}

/* Successes through the healthy prefill in `phase` so far. */
static int healthy_ok(const pdl_run_chaos_t *ch, int phase)
{
    int n = 0;
    for (int i = 0; i < ch->nsamples; i++)
        n += ch->samples[i].healthy && ch->samples[i].ok && sample_phase(ch, &ch->samples[i]) == phase;
    return n;
}

/* Fill res->healthy_lat from the samples. */
static void healthy_summary(pdl_run_chaos_t *ch)
{
    double *v = malloc((size_t)(ch->nsamples > 0 ? ch->nsamples : 1) * sizeof(double));
    for (int p = 0; p < PDL_RUN_CHAOS_PHASES; p++) {
        pdl_run_chaos_lat_t *l = &ch->res->healthy_lat[p];
        *l = (pdl_run_chaos_lat_t){.p50_ms = -1, .p99_ms = -1};
        int n = 0;
        for (int i = 0; i < ch->nsamples; i++) {
            const pdl_run_chaos_sample_t *s = &ch->samples[i];
            if (!s->healthy || sample_phase(ch, s) != p)
                continue;
            if (!s->ok)
                l->failed++;
            else if (v != NULL)
                v[n++] = s->ms;
        }
        l->ok = n;
        if (n > 0) {
            l->p50_ms = pdl_pairs_quantile(v, n, 0.5);
            l->p99_ms = pdl_pairs_quantile(v, n, 0.99);
        }
    }
    free(v);
}

/* GET the victim's /metrics and sum one series (label may be NULL); -1 when it does not answer. */
static double victim_metric(const pdl_run_chaos_victim_t *v, const char *name, const char *lk, const char *lv)
{
    long code = 0;
    char *body = NULL;
    double x = -1;
    if (pdl_run_http_get(v->metrics_url, 1000, &code, &body, NULL) == PDL_OK && code == 200 && body != NULL)
        x = pdl_run_metrics_sum(body, name, lk, lv, NULL);
    free(body);
    return x;
}

static double secs(uint64_t from, uint64_t to)
{
    return (double)(to - from) / 1e3;
}

static void victim_kill(pdl_run_chaos_t *ch, pdl_run_chaos_victim_t *v)
{
    /* Its counters die with it: keep what it had verified wrong so far. */
    double mis = victim_metric(v, "pdlink_kv_bytes_mismatched_total", NULL, NULL);
    if (mis > 0)
        ch->res->mismatched_killed += (uint64_t)(mis + 0.5);
    /* Expected exit: the run's check for dead children must not take it for a crash. */
    v->child->stopping = true;
    pdl_run_child_signal(v->child, SIGKILL);
    for (int i = 0; i < 200 && !pdl_run_child_poll(v->child); i++)
        nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
    v->kill_ms = pdl__clock_now_ms();
    v->state = PDL_CHAOS_DOWN;
    chaos_say(ch, "killed %s (%s) with kill -9 after %d completed requests", v->child->name, v->child->what,
              ch->completed);
}

static void victim_step(pdl_run_chaos_t *ch, pdl_run_chaos_victim_t *v, int k)
{
    uint64_t now = pdl__clock_now_ms();
    if (v->state != PDL_CHAOS_WAIT && v->state != PDL_CHAOS_DONE && now - v->kill_ms > PDL_RUN_CHAOS_RECOVER_MS) {
        pdl_run_result_note(ch->notes, "chaos: %s did not serve a request within %d s of its kill (stuck %s)",
                            v->child->name, PDL_RUN_CHAOS_RECOVER_MS / 1000,
                            v->state == PDL_CHAOS_STARTING      ? "before /health answered 200"
                            : v->state == PDL_CHAOS_REGISTERING ? "before the router listed it"
                                                                : "waiting for a success through it");
        v->state = PDL_CHAOS_DONE;
    }
    switch (v->state) {
    case PDL_CHAOS_WAIT:
        /* The prefill victim waits for a baseline through the healthy prefill too, a bounded while. */
        if (ch->completed >= ch->next_kill_at &&
            (k != 1 || ch->res->healthy[0] == '\0' || healthy_ok(ch, PDL_RUN_CHAOS_BEFORE) >= PDL_RUN_CHAOS_MIN_SAMPLES ||
             ch->completed >= ch->next_kill_at + PDL_RUN_CHAOS_EXTRA_PASSES * ch->n))
            victim_kill(ch, v);
        break;
    case PDL_CHAOS_DOWN:
        if (now - v->kill_ms >= PDL_RUN_CHAOS_DOWN_MS) {
            pdl_error_t err;
            pdl_error_clear(&err);
            if (ch->ops.restart(ch->ops.ctx, v->child, &err) != PDL_OK) {
                pdl_run_result_note(ch->notes, "chaos: %s could not be restarted: %s", v->child->name, err.msg);
                v->state = PDL_CHAOS_DONE;
                break;
            }
            chaos_say(ch, "restarted %s on the same ports", v->child->name);
            v->state = PDL_CHAOS_STARTING;
        }
        break;
    case PDL_CHAOS_STARTING: {
        long code = 0;
        pdl_run_http_get(v->health_url, 500, &code, NULL, NULL);
        if (code == 200) {
            v->up_ms = now;
            ch->res->restart_s[k] = secs(v->kill_ms, now);
            v->state = PDL_CHAOS_REGISTERING;
        }
        break;
    }
    case PDL_CHAOS_REGISTERING:
        if (ch->ops.registered(ch->ops.ctx)) {
            chaos_say(ch, "%s healthy and registered %.1f s after its kill", v->child->name, secs(v->kill_ms, now));
            v->state = PDL_CHAOS_SERVING;
        }
        break;
    case PDL_CHAOS_SERVING: {
        bool req = strcmp(v->served_metric, "pdlink_requests_total") == 0;
        if (victim_metric(v, v->served_metric, req ? "status" : NULL, req ? "ok" : NULL) > 0) {
            v->served_ms = now;
            ch->res->recovered[k] = true;
            ch->res->recover_s[k] = secs(v->kill_ms, now);
            chaos_say(ch, "first success through the restarted %s %.1f s after its kill", v->child->name,
                      ch->res->recover_s[k]);
            v->state = PDL_CHAOS_DONE;
        }
        break;
    }
    case PDL_CHAOS_DONE: break;
    }
    if (v->state == PDL_CHAOS_DONE) {
        ch->cur++;
        ch->next_kill_at = ch->completed + ch->gap;
    }
}

void pdl_run_chaos_tick(pdl_run_chaos_t *ch)
{
    uint64_t now = pdl__clock_now_ms();
    for (int i = 0; i < ch->n; i++)
        if (ch->reqs[i].done && ch->end_ms[i] == 0) {
            ch->end_ms[i] = now;
            ch->completed++;
            add_sample(ch, &ch->reqs[i]);
        }
    if (ch->cur < ch->nv)
        victim_step(ch, &ch->v[ch->cur], ch->cur);
}

/* The victim whose window [kill, first success] (open-ended while not served) [start, end] overlaps, or -1. */
static int in_outage(const pdl_run_chaos_t *ch, uint64_t start, uint64_t end)
{
    for (int k = 0; k < ch->nv; k++) {
        const pdl_run_chaos_victim_t *v = &ch->v[k];
        if (v->kill_ms == 0)
            continue;
        uint64_t until = v->served_ms != 0 ? v->served_ms : UINT64_MAX;
        if (start <= until && end >= v->kill_ms)
            return k;
    }
    return -1;
}

/* Classify every request of the pass that finished; note the first failures of each outage (counted in
 * fail_notes[victim]) and every one outside. */
static void classify_pass(pdl_run_chaos_t *ch, int *fail_notes)
{
    uint64_t now = pdl__clock_now_ms();
    for (int i = 0; i < ch->n; i++) {
        const pdl_run_req_t *q = &ch->reqs[i];
        if (!q->done)
            continue; /* cancelled by an abort: neither sent to the end nor answered */
        uint64_t end = ch->end_ms[i] != 0 ? ch->end_ms[i] : now;
        uint64_t took = q->total_ms > 0 ? (uint64_t)q->total_ms : 0;
        uint64_t start = end > took ? end - took : 0;
        int who = in_outage(ch, start, end);
        bool outage = who >= 0;
        if (q->ok) {
            outage ? ch->res->ok_outage++ : ch->res->ok_outside++;
            /* A success is a success only with the reference's text, outage or not. */
            if (ch->ref_text[i] == NULL || strcmp(q->text, ch->ref_text[i]) != 0) {
                if (ch->res->parity_bad++ == 0)
                    pdl_run_result_note(ch->notes, "chaos pass %d: request %d differs from the reference: \"%.60s\"",
                                        ch->res->passes + 1, i, q->text);
            }
            continue;
        }
        outage ? ch->res->failed_outage++ : ch->res->failed_outside++;
        if (!outage || fail_notes[who]++ < PDL_RUN_CHAOS_FAIL_NOTES)
            pdl_run_result_note(ch->notes, "chaos pass %d: request %d failed %s%s%s: %s", ch->res->passes + 1, i,
                                outage ? "while " : "OUTSIDE the outages", outage ? ch->v[who].child->name : "",
                                outage ? " was down (expected)" : "", q->error);
    }
}

/* After the last victim: another pass while the healthy prefill has too few successes after the
 * prefill's outage, within PDL_RUN_CHAOS_EXTRA_PASSES passes' worth of completions. */
static bool more_after(pdl_run_chaos_t *ch)
{
    if (ch->res->healthy[0] == '\0' || ch->nv < 2 || !ch->res->recovered[1])
        return false;
    if (ch->extra_until < 0)
        ch->extra_until = ch->completed + PDL_RUN_CHAOS_EXTRA_PASSES * ch->n;
    return ch->completed < ch->extra_until && healthy_ok(ch, PDL_RUN_CHAOS_AFTER) < PDL_RUN_CHAOS_MIN_SAMPLES;
}

pdl_status_t pdl_run_chaos_run(pdl_run_chaos_t *ch, pdl_error_t *err)
{
    pdl_status_t st = PDL_OK;
    int fail_notes[PDL_RUN_CHAOS_VICTIMS] = {0};
    /* Ends: each victim is DONE at the latest PDL_RUN_CHAOS_RECOVER_MS after its kill, and every pass
     * completes requests, which brings the next kill. */
    while (st == PDL_OK && (ch->cur < ch->nv || more_after(ch))) {
        memset(ch->end_ms, 0, (size_t)ch->n * sizeof(uint64_t));
        int ok_before = ch->res->ok_outage + ch->res->ok_outside;
        st = ch->ops.run_pass(ch->ops.ctx, err);
        pdl_run_chaos_tick(ch); /* the completions after the last tick */
        classify_pass(ch, fail_notes);
        ch->res->passes++;
        /* A pass where every request failed at once (the router refusing fast) would spin: pace it like
         * a client that retries. */
        if (ok_before == ch->res->ok_outage + ch->res->ok_outside)
            nanosleep(&(struct timespec){.tv_nsec = PDL_RUN_CHAOS_RETRY_MS * 1000 * 1000}, NULL);
    }
    healthy_summary(ch);
    return st;
}
