/*
 * run_workload.c -- the workload of `pdlink run`: a fixed set of requests (deterministic prompts spread over
 * --prompt-tokens, every 4th streaming, every 3rd a chat), and driving it through a router, in rounds that
 * alternate with the same-run ceilings so each round's rate is compared with a ceiling taken beside it.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/run_ctx.h"
#include "cli/run_http.h"

/* Deterministic PRNG (splitmix64): the same prompts in every run and every topology. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static const char *const vocab[] = {
    "the",    "prefill", "decode", "cache",  "tensor", "parallel", "block",  "head",    "layer",  "token",
    "rank",   "memory",  "read",   "write",  "release", "transfer", "router", "model",  "stream", "batch",
    "query",  "key",     "value",  "split",  "group",  "engine",   "notify", "handshake", "moves", "quickly",
    "across", "nodes",   "and",    "every",  "byte",   "is",       "checked", "twice",  "before", "serving",
};

int pdl_run_build_workload(run_ctx_t *c)
{
    int n = c->o.requests;
    c->reqs = calloc((size_t)n, sizeof(*c->reqs));
    c->bodies = calloc((size_t)n, sizeof(char *));
    c->ref_text = calloc((size_t)n, sizeof(char *));
    c->ref_ttft_ms = calloc((size_t)n, sizeof(double));
    if (c->reqs == NULL || c->bodies == NULL || c->ref_text == NULL || c->ref_ttft_ms == NULL)
        return -1;
    uint64_t seed = 0x706466696e6b31ULL; /* fixed: the workload is part of the test */
    int span = c->o.prompt_max - c->o.prompt_min + 1;
    for (int i = 0; i < n; i++) {
        /* Spread lengths evenly over the range so short and long prompts are both in every run. */
        int len = c->o.prompt_min + (n > 1 ? (int)((int64_t)span * ((i * 7) % n) / n) : 0);
        if (len > c->o.prompt_max)
            len = c->o.prompt_max;
        size_t cap = (size_t)len * 12 + 64;
        char *p = malloc(cap);
        if (p == NULL)
            return -1;
        size_t off = (size_t)snprintf(p, cap, "request %d:", i);
        for (int w = 1; w < len && off < cap; w++)
            off += (size_t)snprintf(p + off, cap - off, " %s", vocab[rng_next(&seed) % (sizeof(vocab) / sizeof(vocab[0]))]);
        pdl_run_req_t *r = &c->reqs[i];
        r->index = i;
        r->stream = (i % 4) == 3;
        r->chat = (i % 3) == 2;
        json_t *body;
        if (r->chat)
            body = json_pack("{s:s, s:[{s:s, s:s}], s:i, s:f, s:b}", "model", c->model_id, "messages", "role", "user",
                             "content", p, "max_tokens", c->o.max_tokens, "temperature", 0.0, "stream", r->stream);
        else
            body = json_pack("{s:s, s:s, s:i, s:f, s:b}", "model", c->model_id, "prompt", p, "max_tokens",
                             c->o.max_tokens, "temperature", 0.0, "stream", r->stream);
        free(p);
        if (body == NULL)
            return -1;
        c->bodies[i] = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        if (c->bodies[i] == NULL)
            return -1;
        r->body = c->bodies[i];
    }
    return 0;
}

void pdl_run_free_workload(run_ctx_t *c)
{
    for (int i = 0; c->reqs != NULL && i < c->o.requests; i++) {
        pdl_run_req_clear(&c->reqs[i]);
        free(c->bodies[i]);
        free(c->ref_text[i]);
    }
    free(c->reqs);
    free(c->bodies);
    free(c->ref_text);
    free(c->ref_ttft_ms);
}

static bool load_tick(void *ctx, int done, int total)
{
    run_ctx_t *c = ctx;
    (void)total;
    done += c->round_off;
    pdl_run_progress_requests(c, done, c->o.requests);
    if (!pdl_run_wait_ms(c, 0))
        return false;
    if (c->chaos != NULL)
        pdl_run_chaos_tick(c->chaos); /* before pdl_run_children_alive: a victim is restarted here */
    if (!pdl_run_children_alive(c))
        return false;
    if (c->o.fault_kill_decode_after >= 0 && !c->fault_done && done >= c->o.fault_kill_decode_after) {
        for (int i = 0; i < c->nnodes; i++)
            if (c->nodes[i].role == ROLE_DECODE) {
                fprintf(stderr, "pdlink run: fault injection: killing %s (%s) after %d requests\n",
                        c->nodes[i].child.name, c->nodes[i].child.what, done);
                pdl_run_child_signal(&c->nodes[i].child, SIGKILL);
                c->fault_done = true;
                break;
            }
    }
    return true;
}

/* Requests [first, first + n) of the workload. */
pdl_status_t pdl_run_drive(run_ctx_t *c, const char *base_url, int first, int n, pdl_error_t *err)
{
    pdl_run_load_t ld = {.base_url = base_url,
                         .concurrency = c->o.concurrency,
                         .timeout_ms = RUN_REQUEST_TIMEOUT_MS,
                         .tick = load_tick,
                         .tick_ctx = c};
    if (first == 0)
        c->last_progress = -1;
    c->round_off = first;
    pdl_status_t st = pdl_run_load_drive(&ld, c->reqs + first, n, err);
    c->round_off = 0;
    return st;
}

/* What moved so far, summed as pdl_run_collect() sums it: KV bytes and engine seconds of the ranks that move
 * (decode in READ mode, prefill in WRITE mode), busy seconds of the decodes. From the last scrape. */
typedef struct run_totals {
    double bytes, read_s, busy_s;
} run_totals_t;

static run_totals_t totals_now(const run_ctx_t *c)
{
    run_totals_t t = {0, 0, 0};
    bool wm = strcmp(c->o.mode, "write") == 0;
    for (int i = 0; i < c->nnodes; i++) {
        const run_node_t *nd = &c->nodes[i];
        const char *m = nd->metrics ? nd->metrics : "";
        if (nd->role == (wm ? ROLE_PREFILL : ROLE_DECODE)) {
            t.bytes += pdl_run_metrics_sum(m, "pdlink_kv_bytes_total", NULL, NULL, NULL);
            t.read_s += pdl_run_metrics_sum(m, "pdlink_read_seconds_total", NULL, NULL, NULL);
        }
        if (nd->role == ROLE_DECODE)
            t.busy_s += pdl_run_metrics_sum(m, "pdlink_transfer_busy_seconds_total", NULL, NULL, NULL);
    }
    return t;
}

/* Bytes over seconds in GB/s, or -1 when nothing moved or no time passed. */
static double delta_gbps(double bytes, double seconds)
{
    return bytes > 0 && seconds > 0 ? bytes / seconds / 1e9 : -1;
}

/*
 * The workload in RUN_PAIRS rounds (fewer with fewer requests), each right after its own ceiling
 * measurements: A B A B ..., so the ratio of each pair compares figures taken within a second of each
 * other, and the median of the pairs' ratios survives another job taking the machine for a while (the
 * best of separate rounds gave ratios from 0.04 to 7.7 on the shared 2-vCPU machine). Per round: the
 * transfer GB/s of the decode instances against the ceiling with a decode instance's threads, and one
 * rank's engine GB/s against the one-thread ceiling. The ratios go into r; the whole-run figures come
 * from pdl_run_collect().
 * Written so that a shared alternating-pairs helper can replace pdl_run_ratio_pairs later.
 */
pdl_status_t pdl_run_drive_rounds(run_ctx_t *c, pdl_run_result_t *r, const char *base, pdl_error_t *err)
{
    int n = c->o.requests, rounds = n < RUN_PAIRS ? n : RUN_PAIRS, T = pdl_run_topo_pull_threads(&r->topo);
    double inst_meas[RUN_PAIRS], inst_ceil[RUN_PAIRS], rank_meas[RUN_PAIRS], rank_ceil[RUN_PAIRS];
    /* Rounds after a failure never run: their requests must not keep the outcome of an earlier run. */
    for (int i = 0; i < n; i++)
        pdl_run_req_clear(&c->reqs[i]);
    pdl_run_scrape_all(c);
    run_totals_t prev = totals_now(c);
    pdl_status_t st = PDL_OK;
    int k = 0;
    for (; k < rounds && st == PDL_OK; k++) {
        inst_ceil[k] = pdl_run_ceiling_with(c, T);
        rank_ceil[k] = T == 1 ? inst_ceil[k] : pdl_run_ceiling_with(c, 1);
        int first = (int)((int64_t)k * n / rounds), end = (int)((int64_t)(k + 1) * n / rounds);
        st = pdl_run_drive(c, base, first, end - first, err);
        pdl_run_scrape_all(c);
        run_totals_t cur = totals_now(c);
        inst_meas[k] = delta_gbps(cur.bytes - prev.bytes, cur.busy_s - prev.busy_s);
        rank_meas[k] = delta_gbps(cur.bytes - prev.bytes, cur.read_s - prev.read_s);
        prev = cur;
    }
    pdl_run_ratio_pairs(inst_meas, inst_ceil, k, &r->inst_ratio);
    pdl_run_ratio_pairs(rank_meas, rank_ceil, k, &r->rank_ratio);
    if (r->inst_ratio.above || r->rank_ratio.above)
        pdl_run_result_note(r, "a transfer rate above its same-run ceiling (median ratio %.2f / %.2f): the "
                               "ceiling is no upper bound here, or a figure is wrong", r->inst_ratio.median,
                            r->rank_ratio.median);
    return st;
}
