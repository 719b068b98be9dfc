/*
 * run_chaos.c -- the chaos phase of `pdlink run --chaos` (docs/run.md#chaos---chaos): the schedule's kills (kill -9,
 * restart) and pauses (SIGSTOP, SIGCONT) of a decode and a prefill under load; the state machine, the
 * outage windows and the classification of every request are described in run_chaos.h.
 *
 * A request overlaps an outage when it was in flight at some moment between a kill (or stop) and the
 * first success through the node again: its start (seen done at end_ms, minus its own total_ms) is
 * before the window's end and its end after the kill. end_ms has the tick's resolution (about 50 ms),
 * which only widens the window a little; the windows bound what is excused, they are never judged as
 * times.
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

/* The names of the schedule's events. */
static const struct {
    const char *name;
    pdl_run_chaos_action_t action;
    bool prefill;
} chaos_event_names[] = {
    {"kill-decode", PDL_RUN_CHAOS_KILL, false},
    {"kill-prefill", PDL_RUN_CHAOS_KILL, true},
    {"pause-decode", PDL_RUN_CHAOS_PAUSE, false},
    {"pause-prefill", PDL_RUN_CHAOS_PAUSE, true},
};

int pdl_run_chaos_schedule_parse(const char *list, int pause_min_ms, int pause_max_ms, pdl_run_chaos_event_t *ev,
                                 int cap, pdl_error_t *err)
{
    int n = 0, npause = 0;
    const char *p = list;
    while (*p != '\0') {
        size_t len = strcspn(p, ",");
        size_t k = 0;
        for (; k < sizeof(chaos_event_names) / sizeof(chaos_event_names[0]); k++)
            if (strlen(chaos_event_names[k].name) == len && strncmp(p, chaos_event_names[k].name, len) == 0)
                break;
        if (k == sizeof(chaos_event_names) / sizeof(chaos_event_names[0])) {
            pdl_error_set(err, PDL_ERR_INVALID, "--chaos-schedule: unknown event '%.*s' (kill-decode, kill-prefill, "
                                                "pause-decode, pause-prefill)", (int)len, p);
            return -1;
        }
        if (n == cap) {
            pdl_error_set(err, PDL_ERR_INVALID, "--chaos-schedule: at most %d events", cap);
            return -1;
        }
        ev[n++] = (pdl_run_chaos_event_t){.action = chaos_event_names[k].action, .prefill = chaos_event_names[k].prefill};
        npause += chaos_event_names[k].action == PDL_RUN_CHAOS_PAUSE;
        p += len;
        if (*p == ',')
            p++;
    }
    if (n == 0) {
        pdl_error_set(err, PDL_ERR_INVALID, "--chaos-schedule: no event in '%s'", list);
        return -1;
    }
    /* Spread the durations so that one run sees short and long pauses, the same in every run. */
    for (int k = 0, i = 0; k < n; k++)
        if (ev[k].action == PDL_RUN_CHAOS_PAUSE) {
            ev[k].pause_ms = npause > 1 ? pause_min_ms + (int)((int64_t)(pause_max_ms - pause_min_ms) * i / (npause - 1))
                                        : pause_min_ms;
            i++;
        }
    return n;
}

pdl_status_t pdl_run_chaos_init(pdl_run_chaos_t *ch, const pdl_run_chaos_ops_t *ops, const char *name, bool quiet,
                                const pdl_run_chaos_event_t ev[], pdl_run_child_t *const victims[],
                                const char *const health_urls[], const char *const metrics_urls[],
                                const char *const served[], int nv, pdl_run_req_t *reqs, char *const *ref_text, int n,
                                pdl_run_result_t *r)
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
    /* A quarter of the workload before each event: the cluster is busy, not starting or draining. */
    ch->gap = n / 4 > 0 ? n / 4 : 1;
    ch->next_kill_at = ch->gap;
    memset(ch->res, 0, sizeof(*ch->res));
    ch->res->on = true;
    ch->res->nvictims = ch->nv;
    for (int k = 0; k < PDL_RUN_CHAOS_VICTIMS; k++)
        ch->res->restart_s[k] = ch->res->recover_s[k] = -1;
    ch->pk = -1;
    for (int k = 0; k < ch->nv; k++) {
        pdl_run_chaos_victim_t *v = &ch->v[k];
        v->ev = ev[k];
        v->child = victims[k];
        snprintf(v->health_url, sizeof(v->health_url), "%s", health_urls[k]);
        snprintf(v->metrics_url, sizeof(v->metrics_url), "%s", metrics_urls[k]);
        v->served_metric = served[k];
        snprintf(ch->res->victim[k], sizeof(ch->res->victim[k]), "%s", victims[k]->name);
        ch->res->action[k] = ev[k].action;
        ch->res->pause_s[k] = ev[k].pause_ms / 1e3;
        /* The healthy prefill is measured around the first prefill kill, else the first prefill pause. */
        if (ev[k].prefill && (ch->pk < 0 || (ev[ch->pk].action != PDL_RUN_CHAOS_KILL && ev[k].action == PDL_RUN_CHAOS_KILL)))
            ch->pk = k;
    }
    /* "http://host:port/health" -> "host:port": how the router names the prefill victim. */
    if (ch->pk >= 0) {
        const char *hu = health_urls[ch->pk];
        const char *h = strstr(hu, "://");
        h = h ? h + 3 : hu;
        const char *slash = strchr(h, '/');
        snprintf(ch->victim_prefill, sizeof(ch->victim_prefill), "%.*s", (int)(slash ? slash - h : (long)strlen(h)), h);
    }
    ch->extra_until = -1;
    return PDL_OK;
}

void pdl_run_chaos_fini(pdl_run_chaos_t *ch)
{
    for (int k = 0; k < ch->nv; k++)
        if (ch->v[k].ev.action == PDL_RUN_CHAOS_PAUSE && ch->v[k].state == PDL_CHAOS_DOWN)
            pdl_run_child_signal(ch->v[k].child, SIGCONT);
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

/* The end of event k's outage window: its first success through the victim, or its listing again at the
 * router if that dropped it meanwhile, whichever is later; UINT64_MAX while either is to come. */
static uint64_t window_end(const pdl_run_chaos_victim_t *v)
{
    uint64_t until = v->served_ms != 0 ? v->served_ms : UINT64_MAX;
    if (v->dropped && (v->readd_ms == 0 || v->readd_ms > until))
        until = v->readd_ms != 0 ? v->readd_ms : UINT64_MAX;
    return until;
}

/* Does sample s overlap victim k's outage window [kill, window_end]? */
static bool overlaps(const pdl_run_chaos_t *ch, const pdl_run_chaos_sample_t *s, int k)
{
    const pdl_run_chaos_victim_t *v = &ch->v[k];
    if (v->kill_ms == 0)
        return false;
    return s->start_ms <= window_end(v) && s->end_ms >= v->kill_ms;
}

/* The phase of a healthy sample relative to event pk's outage: BEFORE, DURING, AFTER, or -1 (during
 * another event's outage, or without a prefill event). */
static int sample_phase(const pdl_run_chaos_t *ch, const pdl_run_chaos_sample_t *s)
{
    if (ch->pk < 0)
        return -1;
    for (int k = 0; k < ch->nv; k++)
        if (k != ch->pk && overlaps(ch, s, k))
            return -1;
    const pdl_run_chaos_victim_t *v = &ch->v[ch->pk];
    if (overlaps(ch, s, ch->pk))
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

/* The victim's "served" counter now; -1 when it does not answer. */
static double victim_served(const pdl_run_chaos_victim_t *v)
{
    bool req = strcmp(v->served_metric, "pdlink_requests_total") == 0;
    return victim_metric(v, v->served_metric, req ? "status" : NULL, req ? "ok" : NULL);
}

static void victim_kill(pdl_run_chaos_t *ch, pdl_run_chaos_victim_t *v)
{
    /* Its counters die with it: keep what it had verified wrong, and reaped, so far. */
    double mis = victim_metric(v, "pdlink_kv_bytes_mismatched_total", NULL, NULL);
    if (mis > 0)
        ch->res->mismatched_killed += (uint64_t)(mis + 0.5);
    double exp = victim_metric(v, "pdlink_expired_total", NULL, NULL);
    if (exp > 0)
        ch->res->expired += (uint64_t)(exp + 0.5);
    /* Expected exit: the run's check for dead children must not take it for a crash. */
    v->child->stopping = true;
    pdl_run_child_signal(v->child, SIGKILL);
    for (int i = 0; i < 200 && !pdl_run_child_poll(v->child); i++)
        nanosleep(&(struct timespec){.tv_nsec = 5 * 1000 * 1000}, NULL);
    v->served_base = 0;
    int rm = -1;
    ch->ops.listed(ch->ops.ctx, v->child, &rm);
    v->removals_base = v->removals_last = rm;
    v->kill_ms = pdl__clock_now_ms();
    v->state = PDL_CHAOS_DOWN;
    chaos_say(ch, "killed %s (%s) with kill -9 after %d completed requests", v->child->name, v->child->what,
              ch->completed);
}

static void victim_pause(pdl_run_chaos_t *ch, pdl_run_chaos_victim_t *v)
{
    /* The process goes on afterwards, counters included: it has served again once its counter moves. */
    double base = victim_served(v);
    v->served_base = base > 0 ? base : 0;
    int rm = -1;
    ch->ops.listed(ch->ops.ctx, v->child, &rm);
    v->removals_base = v->removals_last = rm;
    pdl_run_child_signal(v->child, SIGSTOP);
    v->kill_ms = pdl__clock_now_ms();
    v->state = PDL_CHAOS_DOWN;
    chaos_say(ch, "stopped %s (%s) with SIGSTOP for %.1f s after %d completed requests", v->child->name,
              v->child->what, v->ev.pause_ms / 1e3, ch->completed);
}

/* How long the event keeps its victim down: a killed node's restart comes after PDL_RUN_CHAOS_DOWN_MS. */
static uint64_t down_ms(const pdl_run_chaos_victim_t *v)
{
    return v->ev.action == PDL_RUN_CHAOS_PAUSE ? (uint64_t)v->ev.pause_ms : PDL_RUN_CHAOS_DOWN_MS;
}

static void victim_step(pdl_run_chaos_t *ch, pdl_run_chaos_victim_t *v, int k)
{
    uint64_t now = pdl__clock_now_ms();
    bool pause = v->ev.action == PDL_RUN_CHAOS_PAUSE;
    if (v->state != PDL_CHAOS_WAIT && v->state != PDL_CHAOS_DONE && v->state != PDL_CHAOS_DOWN &&
        now - v->kill_ms > down_ms(v) + PDL_RUN_CHAOS_RECOVER_MS) {
        pdl_run_result_note(ch->notes, "chaos: %s did not serve a request within %d s of its %s (stuck %s)",
                            v->child->name, PDL_RUN_CHAOS_RECOVER_MS / 1000, pause ? "SIGCONT" : "restart",
                            v->state == PDL_CHAOS_STARTING      ? "before /health answered 200"
                            : v->state == PDL_CHAOS_REGISTERING ? "before the router listed it"
                                                                : "waiting for a success through it");
        v->state = PDL_CHAOS_DONE;
    }
    switch (v->state) {
    case PDL_CHAOS_WAIT:
        /* The healthy prefill's event waits for a baseline through the healthy prefill too, a bounded while. */
        if (ch->completed >= ch->next_kill_at &&
            (k != ch->pk || ch->res->healthy[0] == '\0' ||
             healthy_ok(ch, PDL_RUN_CHAOS_BEFORE) >= PDL_RUN_CHAOS_MIN_SAMPLES ||
             ch->completed >= ch->next_kill_at + PDL_RUN_CHAOS_EXTRA_PASSES * ch->n)) {
            if (pause)
                victim_pause(ch, v);
            else
                victim_kill(ch, v);
        }
        break;
    case PDL_CHAOS_DOWN:
        if (now - v->kill_ms < down_ms(v))
            break;
        if (pause) {
            pdl_run_child_signal(v->child, SIGCONT);
            ch->last_pause_up_ms = now;
            chaos_say(ch, "continued %s with SIGCONT", v->child->name);
        } else {
            pdl_error_t err;
            pdl_error_clear(&err);
            if (ch->ops.restart(ch->ops.ctx, v->child, &err) != PDL_OK) {
                pdl_run_result_note(ch->notes, "chaos: %s could not be restarted: %s", v->child->name, err.msg);
                v->state = PDL_CHAOS_DONE;
                break;
            }
            chaos_say(ch, "restarted %s on the same ports", v->child->name);
        }
        v->state = PDL_CHAOS_STARTING;
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
        if (ch->ops.registered(ch->ops.ctx) && ch->ops.listed(ch->ops.ctx, v->child, &(int){0})) {
            chaos_say(ch, "%s healthy and registered %.1f s after its %s", v->child->name, secs(v->kill_ms, now),
                      pause ? "SIGSTOP" : "kill");
            v->state = PDL_CHAOS_SERVING;
        }
        break;
    case PDL_CHAOS_SERVING:
        if (victim_served(v) > v->served_base) {
            v->served_ms = now;
            ch->res->recovered[k] = true;
            ch->res->recover_s[k] = secs(v->kill_ms, now);
            chaos_say(ch, "first success through the %s %s %.1f s after its %s", pause ? "continued" : "restarted",
                      v->child->name, ch->res->recover_s[k], pause ? "SIGSTOP" : "kill");
            v->state = PDL_CHAOS_DONE;
        }
        break;
    case PDL_CHAOS_DONE: break;
    }
    if (v->state == PDL_CHAOS_DONE) {
        ch->cur++;
        ch->next_kill_at = ch->completed + ch->gap;
    }
}

/* Whether the router dropped a victim after its event began, and when it listed it again. A node's
 * registration belongs to the latest event begun on it. Looked at every PDL_RUN_CHAOS_WATCH_MS. */
static void watch_registrations(pdl_run_chaos_t *ch, uint64_t now)
{
    if (now - ch->last_watch_ms < PDL_RUN_CHAOS_WATCH_MS)
        return;
    ch->last_watch_ms = now;
    for (int k = 0; k < ch->nv; k++) {
        pdl_run_chaos_victim_t *v = &ch->v[k];
        if (v->kill_ms == 0)
            continue;
        bool later = false;
        for (int j = k + 1; j < ch->nv && !later; j++)
            later = ch->v[j].kill_ms != 0 && ch->v[j].child == v->child;
        if (later)
            continue;
        int rm = -1;
        bool listed = ch->ops.listed(ch->ops.ctx, v->child, &rm);
        /* A node down (killed, not yet restarted) is not listed either: only a drop counts, a drop being
         * a removal the count shows, or the victim unlisted once it was up again. */
        bool drop = (rm >= 0 && v->removals_last >= 0 && rm > v->removals_last) || (!listed && v->up_ms != 0);
        if (rm >= 0)
            v->removals_last = rm;
        if (drop) {
            if (!v->dropped)
                chaos_say(ch, "the router dropped %s (its pings stopped); the outage lasts until it lists it again",
                          v->child->name);
            v->dropped = true;
            v->readd_ms = 0;
        }
        if (v->dropped && listed && v->readd_ms == 0 && v->up_ms != 0)
            v->readd_ms = now;
    }
}

void pdl_run_chaos_tick(pdl_run_chaos_t *ch)
{
    uint64_t now = pdl__clock_now_ms();
    watch_registrations(ch, now);
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
        if (start <= window_end(v) && end >= v->kill_ms)
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
        if (outage)
            q->ok ? ch->res->ok_event[who]++ : ch->res->failed_event[who]++;
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
                                outage ? (ch->v[who].ev.action == PDL_RUN_CHAOS_PAUSE ? " was stopped (expected)"
                                                                                      : " was down (expected)")
                                       : "",
                                q->error);
    }
}

/* After the last victim: another pass while the healthy prefill has too few successes after the
 * prefill's outage, within PDL_RUN_CHAOS_EXTRA_PASSES passes' worth of completions. */
static bool more_after(pdl_run_chaos_t *ch)
{
    if (ch->res->healthy[0] == '\0' || ch->pk < 0 || !ch->res->recovered[ch->pk])
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
