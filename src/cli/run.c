/*
 * run.c -- `pdlink run`, the main job: a whole local P/D cluster per seed topology, driven through the
 * router, every response compared with a single node's and every KV byte accounted for.
 *
 * How it works, per run:
 *   1. Options; the executables pdlink-node and pdlink-router are taken from the directory of this
 *      binary (/proc/self/exe), so a build tree or an install prefix works without PATH games.
 *   2. SIGINT/SIGTERM/SIGHUP are blocked and read from a signalfd, which every waiting loop polls, so a
 *      Ctrl-C turns into an orderly stop (no global flag, no work in a signal handler).
 *   3. The same-run ceilings for the backend are measured (memcpy for shm and for ucx over its
 *      shared-memory transports, a loopback TCP stream for tcp and for ucx with UCX_TLS=tcp):
 *      with one thread (one rank's engine) and with one thread per rank of a decode instance.
 *   4. A non-disaggregated reference node answers the fixed workload once; its texts are the truth.
 *   5. For each topology: ports are found by binding, a router and the nodes are started (MoRIIO READ
 *      mode, kv-transfer-config JSON as in the seed), we wait for every node's /health and for the
 *      router's /workers to list them all, drive the workload through the router, wait for held blocks
 *      to drain, scrape every node's /metrics, stop everything, and judge the figures.
 *   6. One report (text, and JSON with --json); exit 0 only if every topology passed.
 *
 * Children are watched in every loop; one that dies unexpectedly ends its topology, is named with its
 * exit status and last log lines, and fails the run. Every exit path stops all children (SIGTERM to
 * each process group, then SIGKILL), and PR_SET_PDEATHSIG covers the case where we are killed.
 */
#include <curl/curl.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "app/parse.h"
#include "cli/cli.h"
#include "cli/run_chaos.h"
#include "cli/run_http.h"
#include "cli/run_metrics.h"
#include "cli/run_netns.h"
#include "cli/run_opts.h"
#include "cli/run_proc.h"
#include "cli/run_report.h"
#include "cli/run_router.h"
#include "common/log.h"
#include "pdlink/ports.h"
#include "pdlink/topo.h"

/* The same-run ceilings of `pdlink bench` (docs/benchmarks.md#how-it-is-measured), shared so both commands
 * measure alike. */
#include "bench/ceiling.h"
#include "common/clock.h"

enum {
    RUN_MAX_NODES = 2 * PDL_RUN_MAX_INST,
    RUN_STARTUP_TIMEOUT_MS = 120000,
    RUN_REQUEST_TIMEOUT_MS = 120000,
    RUN_DRAIN_TIMEOUT_MS = 15000,
    RUN_PREWARM_TIMEOUT_MS = 30000,
    RUN_PAIRS = 6, /* alternating (ceiling, round of the workload) pairs per topology */
    RUN_STOP_GRACE_MS = 5000,
    RUN_TAIL_LINES = 12,
    RUN_CHAOS_TRANSFER_TIMEOUT_S = 10,
    /* --chaos behind vllm-router: it sends no failed release when a decode leg fails, so the hold of a
     * request that failed in an outage waits for defer_timeout; 20 s instead of 60 s lets the chaos phase
     * wait for those and still keeps the holds of a paused decode (paused for at most --chaos-pause's
     * maximum, 6-8 s by default, below it). */
    RUN_CHAOS_DEFER_TIMEOUT_S = 20,
    /* After the last SIGCONT: the routers' registration TTL (5 s, both) and a second of sweep lag. */
    RUN_CHAOS_SETTLE_MS = 6000,
};

typedef enum { ROLE_PREFILL, ROLE_DECODE, ROLE_REFERENCE } node_role_t;

typedef struct run_node {
    pdl_run_child_t child;
    node_role_t role;
    int tp;
    int http_port, hs_base, notify_base;
    char host[32];
    char *metrics;                      /* last /metrics body */
} run_node_t;

/* The transfer figures of a cluster's /metrics that --chaos takes the final batch's share of: the
 * decodes' pulls (READ) or receives (WRITE), and the bytes moved by the side that moves them. */
typedef struct pull_figs {
    uint64_t pulls, kv_bytes, descriptors, verified;
    double seconds, busy_seconds, read_seconds;
    pdl_run_hist_t hist; /* pdlink_transfer_seconds_bucket, summed over the decodes */
} pull_figs_t;

typedef struct run_ctx {
    pdl_run_opts_t o;
    char exe_dir[PATH_MAX];
    char node_exe[PATH_MAX + 32];
    pdl_run_router_t rt;                /* the router in front of the nodes (run_router.h) */
    char log_dir[384];                  /* short enough for every log path to fit */
    bool log_dir_is_temp;
    int sigfd;
    sigset_t child_mask;
    bool interrupted;
    bool tty;
    pdl_port_picker_t ports;
    char model_id[128];
    double ceiling_gbps;                /* one thread: one rank's engine */
    int ceiling_threads;
    int ninst_ceil;                     /* with the threads of a decode instance, one per decode TP size */
    int inst_ceil_threads[8];
    double inst_ceil_gbps[8];
    bool fault_done;
    /* the workload and its truth */
    pdl_run_req_t *reqs;
    char **bodies;
    char **ref_text;
    double *ref_ttft_ms;                /* the reference's TTFT per request (-1: none) */
    /* the cluster being run */
    const char *phase_name;             /* progress prefix */
    pdl_run_result_t *cur;              /* result being filled */
    run_node_t nodes[RUN_MAX_NODES];
    int nnodes;
    pdl_run_child_t router;
    char router_host[32];
    int router_port, disc_port, prom_port;
    bool child_died;
    int last_progress;
    int round_off;                      /* requests of the earlier rounds (progress, fault injection) */
    pdl_run_netns_t *keep_ns;           /* namespaces of a cluster left up by --keep */
    pdl_run_chaos_t *chaos;             /* the chaos phase in progress, advanced by load_tick */
    pull_figs_t chaos_base;             /* --chaos: the decodes' pull figures when the chaos phase ended */
    uint64_t chaos_expired_base;        /* --chaos: pdlink_expired_total of the nodes then */
} run_ctx_t;

/* ---------------------------------------------------------------- progress and messages */

static void progress(run_ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void progress(run_ctx_t *c, const char *fmt, ...)
{
    if (c->o.quiet)
        return;
    /* On a terminal, first erase the request counter that progress_requests keeps redrawing. */
    flockfile(stderr);
    fprintf(stderr, "%s[%s] ", c->tty ? "\r\033[K" : "", c->phase_name);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    funlockfile(stderr);
}

static void progress_requests(run_ctx_t *c, int done, int total)
{
    if (c->o.quiet || done == c->last_progress)
        return;
    if (c->tty) {
        fprintf(stderr, "\r\033[K[%s] requests %d/%d", c->phase_name, done, total);
        if (done == total)
            fprintf(stderr, "\n");
    } else {
        /* A log file gets a line per quarter, not per request. */
        int q_prev = c->last_progress < 0 ? -1 : c->last_progress * 4 / (total > 0 ? total : 1);
        int q_now = done * 4 / (total > 0 ? total : 1);
        if (q_now != q_prev || done == total)
            fprintf(stderr, "[%s] requests %d/%d\n", c->phase_name, done, total);
    }
    c->last_progress = done;
}

/* ---------------------------------------------------------------- small helpers */

static bool wait_ms(run_ctx_t *c, int ms)
{
    /* Sleep, but wake for a signal; returns false once interrupted. */
    struct pollfd pfd = {.fd = c->sigfd, .events = POLLIN};
    poll(&pfd, 1, ms);
    int sig = pdl_run_signals_check(c->sigfd);
    if (sig != 0 && !c->interrupted) {
        c->interrupted = true;
        if (c->tty && !c->o.quiet)
            fprintf(stderr, "\n");
        fprintf(stderr, "pdlink run: %s received, stopping\n", strsignal(sig));
    }
    return !c->interrupted;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void str_argv_free(char **v)
{
    for (int i = 0; v[i] != NULL; i++)
        free(v[i]);
}

/* Append a printf-formatted argument to a NULL-terminated argv of capacity cap. */
static void argv_add(char **v, int cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void argv_add(char **v, int cap, const char *fmt, ...)
{
    int n = 0;
    while (v[n] != NULL)
        n++;
    if (n + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&v[n], fmt, ap) < 0)
        v[n] = NULL;
    va_end(ap);
    v[n + 1] = NULL;
}

/* Report a child that died: a note in the result, and its exit and last log lines on stderr. */
static void report_death(run_ctx_t *c, pdl_run_child_t *ch)
{
    char how[160];
    pdl_run_child_exit_text(ch, how, sizeof(how));
    if (c->tty && !c->o.quiet)
        fprintf(stderr, "\n");
    fprintf(stderr, "pdlink run: %s (%s) %s; last lines of %s:\n", ch->name, ch->what, how, ch->log_path);
    pdl_run_log_tail(stderr, ch->log_path, RUN_TAIL_LINES, "    | ");
    if (c->cur != NULL)
        pdl_run_result_note(c->cur, "%s (%s) %s unexpectedly; log %s", ch->name, ch->what, how, ch->log_path);
    c->child_died = true;
}

/* Poll every child of the current cluster; false if one died (reported once). */
static bool children_alive(run_ctx_t *c)
{
    if (c->child_died)
        return false;
    bool ok = true;
    if (c->router.started && pdl_run_child_died(&c->router)) {
        report_death(c, &c->router);
        ok = false;
    }
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i].child.started && pdl_run_child_died(&c->nodes[i].child)) {
            report_death(c, &c->nodes[i].child);
            ok = false;
        }
    return ok;
}

/* Stop the cluster's children; returns how many did not exit cleanly on SIGTERM (each noted). */
static int stop_cluster(run_ctx_t *c)
{
    pdl_run_child_t *all[RUN_MAX_NODES + 1];
    int n = 0;
    /* The router first, so nothing new reaches the nodes while they stop. */
    if (c->router.started)
        all[n++] = &c->router;
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i].child.started)
            all[n++] = &c->nodes[i].child;
    if (n == 0)
        return 0;
    children_alive(c); /* a death before the stop is still a death */
    int unclean = pdl_run_children_stop(all, n, RUN_STOP_GRACE_MS);
    if (unclean > 0 && c->cur != NULL) {
        for (int i = 0; i < n; i++) {
            pdl_run_child_t *ch = all[i];
            bool clean = (WIFEXITED(ch->wstatus) && WEXITSTATUS(ch->wstatus) == 0) ||
                         (WIFSIGNALED(ch->wstatus) && WTERMSIG(ch->wstatus) == SIGTERM);
            if (ch->stopping && !clean) {
                char how[160];
                pdl_run_child_exit_text(ch, how, sizeof(how));
                pdl_run_result_note(c->cur, "%s (%s) %s when stopped with SIGTERM; log %s", ch->name, ch->what,
                                    how, ch->log_path);
            }
        }
    }
    for (int i = 0; i < c->nnodes; i++) {
        free(c->nodes[i].metrics);
        c->nodes[i].metrics = NULL;
    }
    return unclean;
}

/* ---------------------------------------------------------------- the workload */

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

static int build_workload(run_ctx_t *c)
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

static void free_workload(run_ctx_t *c)
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
    progress_requests(c, done, c->o.requests);
    if (!wait_ms(c, 0))
        return false;
    if (c->chaos != NULL)
        pdl_run_chaos_tick(c->chaos); /* before children_alive: a victim is restarted here */
    if (!children_alive(c))
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
static pdl_status_t drive(run_ctx_t *c, const char *base_url, int first, int n, pdl_error_t *err)
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

/* ---------------------------------------------------------------- starting processes */

/* The role whose instances connect ahead of need: the one that moves the KV. */
static node_role_t prewarming_role(const run_ctx_t *c)
{
    return strcmp(c->o.mode, "read") == 0 ? ROLE_DECODE : ROLE_PREFILL;
}

static void kv_config(const run_ctx_t *c, const run_node_t *nd, const char *proxy_ip, char *out, size_t len)
{
    json_t *extra = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:b, s:s, s:i, s:i}", "host_ip", nd->host, "proxy_ip",
                              proxy_ip, "proxy_ping_port", c->disc_port, "http_port", nd->http_port,
                              "handshake_port", nd->hs_base, "notify_port", nd->notify_base, "read_mode",
                              strcmp(c->o.mode, "read") == 0, "backend", c->o.backend, "qp_per_transfer", 1,
                              "num_workers", 1);
    /* --chaos: a WRITE decode waits for a killed prefill's write_done until transfer_timeout (nothing tells
     * it the producer died); 10 s instead of the default 30 s bounds that stall, and the report shows it. */
    if (c->o.chaos)
        json_object_set_new(extra, "transfer_timeout", json_integer(RUN_CHAOS_TRANSFER_TIMEOUT_S));
    if (c->o.chaos && c->rt.real)
        json_object_set_new(extra, "defer_timeout", json_integer(RUN_CHAOS_DEFER_TIMEOUT_S));
    /* The cluster is known: the side that moves the KV (a READ decode, a WRITE prefill) connects to every
     * instance of the other side before the first request (prewarm_peers), so that no transfer pays a
     * handshake or a region mapping. */
    if (nd->role == prewarming_role(c) && !c->o.no_prewarm) {
        json_t *pw = json_array();
        for (int i = 0; i < c->nnodes; i++) {
            const run_node_t *p = &c->nodes[i];
            if (p->role != (nd->role == ROLE_DECODE ? ROLE_PREFILL : ROLE_DECODE))
                continue;
            char spec[64];
            snprintf(spec, sizeof(spec), "%s:%d:%d", p->host, p->hs_base, p->tp);
            json_array_append_new(pw, json_string(spec));
        }
        json_object_set_new(extra, "prewarm_peers", pw);
    }
    json_t *cfg = json_pack("{s:s, s:s, s:o}", "kv_connector", "MoRIIOConnector", "kv_role",
                            nd->role == ROLE_PREFILL ? "kv_producer" : "kv_consumer", "kv_connector_extra_config",
                            extra);
    char *s = json_dumps(cfg, JSON_COMPACT);
    snprintf(out, len, "%s", s ? s : "{}");
    free(s);
    json_decref(cfg);
}

static pdl_status_t start_node(run_ctx_t *c, run_node_t *nd, const char *proxy_ip, int netns_fd, pdl_error_t *err)
{
    char *argv[40] = {NULL};
    argv_add(argv, 40, "%s", c->node_exe);
    argv_add(argv, 40, "--model");
    argv_add(argv, 40, "%s", c->o.model);
    argv_add(argv, 40, "--host");
    argv_add(argv, 40, "%s", nd->host);
    argv_add(argv, 40, "--port");
    argv_add(argv, 40, "%d", nd->http_port);
    argv_add(argv, 40, "--tensor-parallel-size");
    argv_add(argv, 40, "%d", nd->tp);
    /*
     * KV blocks per rank, sized from the workload rather than a memory budget so that it holds for every
     * preset: `concurrency` requests of the longest prompt plus output, twice over (a prefill keeps its
     * blocks until the releases arrive, while the router already sends it the next request), plus slack.
     * Pre-faulting this at start-up stays cheap for large models.
     */
    int blocks = c->o.concurrency * ((c->o.prompt_max + c->o.max_tokens + 15) / 16 + 1) * 3 + 64;
    argv_add(argv, 40, "--num-gpu-blocks");
    argv_add(argv, 40, "%d", blocks);
    if (nd->role != ROLE_REFERENCE) {
        char cfg[2048];
        kv_config(c, nd, proxy_ip, cfg, sizeof(cfg));
        argv_add(argv, 40, "--kv-transfer-config");
        argv_add(argv, 40, "%s", cfg);
    }
    argv_add(argv, 40, "--log-level");
    argv_add(argv, 40, "%s", c->o.child_log_level);
    pdl_status_t st = pdl_run_child_start(&nd->child, argv, &c->child_mask, netns_fd, err);
    str_argv_free(argv);
    return st;
}

static pdl_status_t start_router(run_ctx_t *c, int netns_fd, pdl_error_t *err)
{
    char *argv[40] = {NULL};
    /* round_robin spreads a fixed workload over both instances of 2p1d/1p2d for sure; the real
     * vllm-router runs with the seed's consistent_hash (run_router.c). */
    if (pdl_run_router_argv(&c->rt, argv, 40, c->router_host, c->router_port, c->disc_port, c->prom_port,
                            "round_robin", c->o.child_log_level) < 0) {
        str_argv_free(argv);
        return pdl_error_set(err, PDL_ERR_NOMEM, "router command line for %s", c->rt.exe);
    }
    pdl_status_t st = pdl_run_child_start(&c->router, argv, &c->child_mask, netns_fd, err);
    str_argv_free(argv);
    return st;
}

static void node_url(const run_node_t *nd, const char *path, char *out, size_t len)
{
    snprintf(out, len, "http://%s:%d%s", nd->host, nd->http_port, path);
}

/* Wait until GET url returns 200 (or a child dies, a signal arrives, the deadline passes). */
static pdl_status_t wait_http_ok(run_ctx_t *c, const char *url, uint64_t deadline_ms, pdl_error_t *err)
{
    for (;;) {
        long code = 0;
        pdl_error_t e;
        pdl_error_clear(&e);
        pdl_run_http_get(url, 2000, &code, NULL, &e);
        if (code == 200)
            return PDL_OK;
        if (!children_alive(c))
            return pdl_error_set(err, PDL_ERR_PEER_GONE, "a process died during start-up");
        if (pdl__clock_now_ms() >= deadline_ms)
            return pdl_error_set(err, PDL_ERR_TIMEOUT, "%s did not return 200 within %d s (last: %s)", url,
                                 RUN_STARTUP_TIMEOUT_MS / 1000, code ? "non-200 status" : e.msg);
        if (!wait_ms(c, 100))
            return pdl_error_set(err, PDL_ERR_BAD_STATE, "interrupted");
    }
}

/* Count the router's registered workers of each role from GET /workers. */
static int workers_count(const char *body, const char *role)
{
    json_t *root = json_loads(body, 0, NULL);
    int n = -1;
    if (json_is_object(root)) {
        json_t *a = json_object_get(root, role);
        if (json_is_array(a))
            n = (int)json_array_size(a);
    }
    json_decref(root);
    return n;
}

static pdl_status_t wait_registered(run_ctx_t *c, int np, int nd, uint64_t deadline_ms, pdl_error_t *err)
{
    char url[128];
    snprintf(url, sizeof(url), "http://%s:%d/workers", c->router_host, c->router_port);
    int lp = -2, ld = -2;
    for (;;) {
        long code = 0;
        char *body = NULL;
        pdl_run_http_get(url, 2000, &code, &body, NULL);
        int p = -1, d = -1;
        if (c->rt.real) {
            /* vllm-router lists discovered instances nowhere but in its log (run_router.h). */
            p = pdl_run_router_log_count(c->router.log_path, true);
            d = pdl_run_router_log_count(c->router.log_path, false);
        } else if (code == 200 && body != NULL) {
            p = workers_count(body, "prefill");
            d = workers_count(body, "decode");
        }
        free(body);
        if (p != lp || d != ld) {
            if (p >= 0)
                progress(c, "registered at the router: %d/%d prefill, %d/%d decode", p, np, d, nd);
            lp = p;
            ld = d;
        }
        if (p == np && d == nd)
            return PDL_OK;
        if (!children_alive(c))
            return pdl_error_set(err, PDL_ERR_PEER_GONE, "a process died during registration");
        if (pdl__clock_now_ms() >= deadline_ms)
            return pdl_error_set(err, PDL_ERR_TIMEOUT,
                                 "router %s lists %d/%d prefill and %d/%d decode workers after %d s", url, p, np, d,
                                 nd, RUN_STARTUP_TIMEOUT_MS / 1000);
        if (!wait_ms(c, 100))
            return pdl_error_set(err, PDL_ERR_BAD_STATE, "interrupted");
    }
}

/*
 * Wait until every READ decode (WRITE prefill) reports pdlink_prewarm_pending 0: its background prewarm
 * connected and mapped every rank it will read from (write to), so the first requests measure
 * transfers, not set-up. Bounded:
 * past the deadline the workload starts anyway, and the report's "pulls that handshaked" row shows what
 * the requests paid for it. False only when interrupted or a child died.
 */
static int scrape_all(run_ctx_t *c);
static bool wait_prewarmed(run_ctx_t *c, pdl_run_result_t *r)
{
    uint64_t deadline = pdl__clock_now_ms() + RUN_PREWARM_TIMEOUT_MS, t0 = pdl__clock_now_ms();
    for (;;) {
        scrape_all(c);
        int waiting = 0;
        for (int i = 0; i < c->nnodes; i++) {
            const run_node_t *nd = &c->nodes[i];
            if (nd->role != prewarming_role(c))
                continue;
            int found = 0;
            double v = pdl_run_metrics_sum(nd->metrics ? nd->metrics : "", "pdlink_prewarm_pending", NULL, NULL, &found);
            waiting += found == 0 || v > 0;
        }
        if (waiting == 0) {
            progress(c, "every %s connected to its peers in %.1f s", prewarming_role(c) == ROLE_DECODE ? "decode" : "prefill",
                     (pdl__clock_now_ms() - t0) / 1e3);
            return true;
        }
        if (!children_alive(c))
            return false;
        if (pdl__clock_now_ms() >= deadline) {
            pdl_run_result_note(r, "%d %s instance(s) still connecting to their peers after %d s; started anyway", waiting,
                                prewarming_role(c) == ROLE_DECODE ? "decode" : "prefill", RUN_PREWARM_TIMEOUT_MS / 1000);
            return true;
        }
        if (!wait_ms(c, 50))
            return false;
    }
}

/* ---------------------------------------------------------------- the reference */

static int run_reference(run_ctx_t *c)
{
    c->phase_name = "reference";
    c->nnodes = 1;
    c->cur = NULL;
    run_node_t *nd = &c->nodes[0];
    memset(nd, 0, sizeof(*nd));
    nd->role = ROLE_REFERENCE;
    nd->tp = c->o.reference_tp;
    snprintf(nd->host, sizeof(nd->host), "127.0.0.1");
    pdl_error_t err;
    pdl_error_clear(&err);
    if (pdl_port_picker_take(&c->ports, "127.0.0.1", 1, &nd->http_port, &err) != PDL_OK) {
        fprintf(stderr, "pdlink run: %s\n", err.msg);
        return 2;
    }
    snprintf(nd->child.name, sizeof(nd->child.name), "reference");
    snprintf(nd->child.what, sizeof(nd->child.what), "pdlink-node TP%d, no KV transfer, port %d", nd->tp, nd->http_port);
    snprintf(nd->child.log_path, sizeof(nd->child.log_path), "%s/reference.log", c->log_dir);
    progress(c, "starting the single-node reference (%s)", nd->child.what);
    int rc = 0;
    char url[160];
    if (start_node(c, nd, NULL, -1, &err) != PDL_OK) {
        fprintf(stderr, "pdlink run: %s\n", err.msg);
        rc = 2;
        goto out;
    }
    node_url(nd, "/health", url, sizeof(url));
    if (wait_http_ok(c, url, pdl__clock_now_ms() + RUN_STARTUP_TIMEOUT_MS, &err) != PDL_OK) {
        if (!c->interrupted && !c->child_died)
            fprintf(stderr, "pdlink run: reference node: %s\n", err.msg);
        rc = c->interrupted ? 2 : 1;
        goto out;
    }
    /* The model id the nodes answer to: the first of /v1/models, else the preset name. */
    node_url(nd, "/v1/models", url, sizeof(url));
    {
        long code = 0;
        char *body = NULL;
        snprintf(c->model_id, sizeof(c->model_id), "%s", c->o.model);
        if (pdl_run_http_get(url, 5000, &code, &body, NULL) == PDL_OK && code == 200) {
            json_t *root = json_loads(body, 0, NULL);
            json_t *id = json_object_get(json_array_get(json_object_get(root, "data"), 0), "id");
            if (json_is_string(id))
                snprintf(c->model_id, sizeof(c->model_id), "%s", json_string_value(id));
            json_decref(root);
        }
        free(body);
    }
    if (build_workload(c) != 0) {
        fprintf(stderr, "pdlink run: out of memory building the workload\n");
        rc = 2;
        goto out;
    }
    char base[96];
    node_url(nd, "", base, sizeof(base));
    pdl_status_t st = drive(c, base, 0, c->o.requests, &err);
    if (st != PDL_OK) {
        if (!c->interrupted && !c->child_died)
            fprintf(stderr, "pdlink run: reference workload: %s\n", err.msg);
        rc = c->interrupted ? 2 : 1;
        goto out;
    }
    int bad = 0;
    for (int i = 0; i < c->o.requests; i++) {
        c->ref_ttft_ms[i] = c->reqs[i].ok ? c->reqs[i].ttft_ms : -1;
        if (c->reqs[i].ok) {
            c->ref_text[i] = c->reqs[i].text;
            c->reqs[i].text = NULL;
        } else if (bad++ < 3) {
            fprintf(stderr, "pdlink run: reference request %d failed: %s\n", i, c->reqs[i].error);
        }
    }
    if (bad > 0) {
        fprintf(stderr, "pdlink run: %d of %d requests failed on the single-node reference; nothing to compare "
                        "with (log %s)\n", bad, c->o.requests, nd->child.log_path);
        rc = 1;
    }
out:
    stop_cluster(c);
    c->nnodes = 0;
    c->child_died = false;
    return rc;
}

/* ---------------------------------------------------------------- one topology */

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

static uint64_t msum(const run_node_t *nd, const char *name)
{
    double v = pdl_run_metrics_sum(nd->metrics ? nd->metrics : "", name, NULL, NULL, NULL);
    return v > 0 ? (uint64_t)(v + 0.5) : 0;
}

/* Scrape every node; returns the number of nodes scraped. */
static int scrape_all(run_ctx_t *c)
{
    int got = 0;
    for (int i = 0; i < c->nnodes; i++) {
        run_node_t *nd = &c->nodes[i];
        char url[160];
        node_url(nd, "/metrics", url, sizeof(url));
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

static uint64_t total_held(const run_ctx_t *c)
{
    uint64_t h = 0;
    for (int i = 0; i < c->nnodes; i++)
        h += msum(&c->nodes[i], "pdlink_held_blocks");
    return h;
}

/*
 * Releases (READ: sent by decode ranks, received by prefill ranks) or write_done (WRITE: sent by
 * prefill ranks, received by decode ranks), summed over the nodes as last scraped. Both modes carry
 * max(P, D) per request.
 */
static void release_totals(const run_ctx_t *c, uint64_t *sent, uint64_t *received)
{
    bool wm = strcmp(c->o.mode, "write") == 0;
    *sent = *received = 0;
    for (int i = 0; i < c->nnodes; i++) {
        const run_node_t *nd = &c->nodes[i];
        if (nd->role == ROLE_DECODE) {
            if (wm)
                *received += msum(nd, "pdlink_write_done_received_total");
            else
                *sent += msum(nd, "pdlink_releases_sent_total");
        } else if (nd->role == ROLE_PREFILL) {
            if (wm)
                *sent += msum(nd, "pdlink_write_done_sent_total");
            else
                *received += msum(nd, "pdlink_releases_received_total");
        }
    }
}

static int topo_pull_threads(const pdl_run_topo_t *t);
static double ceiling_with(const run_ctx_t *c, int threads);
static double inst_ceiling(const run_ctx_t *c, int threads);

/* The transfer figures as last scraped (a node not scraped adds nothing). */
static void pull_figs(const run_ctx_t *c, pull_figs_t *f)
{
    memset(f, 0, sizeof(*f));
    bool wm = strcmp(c->o.mode, "write") == 0;
    for (int i = 0; i < c->nnodes; i++) {
        const run_node_t *nd = &c->nodes[i];
        if (nd->metrics == NULL)
            continue;
        f->verified += msum(nd, "pdlink_kv_bytes_verified_total");
        if (nd->role == (wm ? ROLE_PREFILL : ROLE_DECODE)) {
            f->kv_bytes += msum(nd, "pdlink_kv_bytes_total");
            f->descriptors += msum(nd, "pdlink_descriptors_total");
            f->read_seconds += pdl_run_metrics_sum(nd->metrics, "pdlink_read_seconds_total", NULL, NULL, NULL);
        }
        if (nd->role != ROLE_DECODE)
            continue;
        f->pulls += msum(nd, "pdlink_transfer_seconds_count");
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

static void collect(run_ctx_t *c, pdl_run_result_t *r)
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
        r->mismatched += msum(nd, "pdlink_kv_bytes_mismatched_total");
        r->expired += msum(nd, "pdlink_expired_total");
        r->held_blocks += msum(nd, "pdlink_held_blocks");
        r->node_failed_requests += (uint64_t)pdl_run_metrics_sum(nd->metrics, "pdlink_requests_total", "status",
                                                                 "failed", NULL);
        /* READ mode: the decode ranks read (bytes, descriptors, read time); WRITE mode: the prefill
         * ranks write. The transfer time (receive wait on the decode) is measured on the decode in both
         * modes. Only the side that moves the KV handshakes (and prewarms). */
        bool wm = strcmp(c->o.mode, "write") == 0;
        if (nd->role == (wm ? ROLE_PREFILL : ROLE_DECODE)) {
            r->prewarm_handshakes += msum(nd, "pdlink_prewarm_handshakes_total");
            r->transfer_handshakes += msum(nd, "pdlink_transfer_handshakes_total");
        }
    }
    /* Under --chaos what the chaos phase reaped is its own row (chaos.expired); this one is the final batch's. */
    r->expired = r->expired > c->chaos_expired_base ? r->expired - c->chaos_expired_base : 0;
    release_totals(c, &r->releases_sent, &r->releases_received);
    /* Under --chaos the transfers of the chaos passes are left out: these rows describe the final batch
     * (mismatched bytes stay whole-run: a chaos pass's mismatch must not vanish). */
    pull_figs_t pf;
    pull_figs(c, &pf);
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
    r->ceiling_threads = topo_pull_threads(&r->topo);
    r->ceiling_gbps = inst_ceiling(c, r->ceiling_threads);
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
            uint64_t h = msum(&c->nodes[i], "pdlink_held_blocks");
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
static void judge_requests(run_ctx_t *c, pdl_run_result_t *r)
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
    /* Exact only when all instances of a side have one TP size (the seed topologies); see collect(). */
    r->releases_expected = (uint64_t)r->ok * (uint64_t)(pmax > dmax ? pmax : dmax);
}

static void wait_for_keep(run_ctx_t *c)
{
    printf("\ncluster %s is up (--keep). Router: http://%s:%d\n", c->cur->topo.name, c->router_host, c->router_port);
    printf("try:\n  curl -s http://%s:%d/v1/completions -H 'Content-Type: application/json' \\\n"
           "    -d '{\"model\": \"%s\", \"prompt\": \"the prefill moves the cache\", \"max_tokens\": %d}'\n",
           c->router_host, c->router_port, c->model_id, c->o.max_tokens);
    for (int i = 0; i < c->nnodes; i++)
        printf("  %-10s http://%s:%d  (%s, log %s)\n", c->nodes[i].child.name, c->nodes[i].host,
               c->nodes[i].http_port, c->nodes[i].child.what, c->nodes[i].child.log_path);
    printf("press Ctrl-C to stop it\n");
    fflush(stdout);
    while (wait_ms(c, 500))
        if (!children_alive(c))
            break;
}

/* What moved so far, summed as collect() sums it: KV bytes and engine seconds of the ranks that move
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
 * other, and the median of the pairs' ratios survives another job taking the machine for a while (issue
 * 16: the best of separate rounds gave ratios from 0.04 to 7.7). Per round: the transfer GB/s of the
 * decode instances against the ceiling with a decode instance's threads, and one rank's engine GB/s
 * against the one-thread ceiling. The ratios go into r; the whole-run figures come from collect().
 * Written so that a shared alternating-pairs helper can replace pdl_run_ratio_pairs later.
 */
static pdl_status_t drive_rounds(run_ctx_t *c, pdl_run_result_t *r, const char *base, pdl_error_t *err)
{
    int n = c->o.requests, rounds = n < RUN_PAIRS ? n : RUN_PAIRS, T = topo_pull_threads(&r->topo);
    double inst_meas[RUN_PAIRS], inst_ceil[RUN_PAIRS], rank_meas[RUN_PAIRS], rank_ceil[RUN_PAIRS];
    /* Rounds after a failure never run: their requests must not keep the outcome of an earlier run. */
    for (int i = 0; i < n; i++)
        pdl_run_req_clear(&c->reqs[i]);
    scrape_all(c);
    run_totals_t prev = totals_now(c);
    pdl_status_t st = PDL_OK;
    int k = 0;
    for (; k < rounds && st == PDL_OK; k++) {
        inst_ceil[k] = ceiling_with(c, T);
        rank_ceil[k] = T == 1 ? inst_ceil[k] : ceiling_with(c, 1);
        int first = (int)((int64_t)k * n / rounds), end = (int)((int64_t)(k + 1) * n / rounds);
        st = drive(c, base, first, end - first, err);
        scrape_all(c);
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

/* The chaos phase's operations (run_chaos.h) on this cluster. */
static pdl_status_t chaos_drive(void *ctx, pdl_error_t *err)
{
    run_ctx_t *c = ctx;
    char base[96];
    snprintf(base, sizeof(base), "http://%s:%d", c->router_host, c->router_port);
    for (int i = 0; i < c->o.requests; i++)
        pdl_run_req_clear(&c->reqs[i]);
    return drive(c, base, 0, c->o.requests, err);
}

static pdl_status_t chaos_restart(void *ctx, pdl_run_child_t *victim, pdl_error_t *err)
{
    run_ctx_t *c = ctx;
    for (int i = 0; i < c->nnodes; i++)
        if (&c->nodes[i].child == victim)
            return start_node(c, &c->nodes[i], c->router_host, -1, err);
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
    bool all = code == 200 && body != NULL && workers_count(body, "prefill") == c->cur->topo.np &&
               workers_count(body, "decode") == c->cur->topo.nd;
    free(body);
    return all;
}

static bool chaos_listed(void *ctx, const pdl_run_child_t *victim, int *removals_p);

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

/* --chaos: the schedule's kills and pauses of decode-0 and prefill-0 under load (run_chaos.h), before the
 * final batch. */
static pdl_status_t chaos_phase(run_ctx_t *c, pdl_run_result_t *r, pdl_error_t *err)
{
    const pdl_run_chaos_event_t *ev = c->o.chaos_ev;
    int nev = c->o.chaos_nev;
    pdl_run_child_t *victims[PDL_RUN_CHAOS_VICTIMS];
    char health[PDL_RUN_CHAOS_VICTIMS][160], metrics[PDL_RUN_CHAOS_VICTIMS][160];
    const char *hu[PDL_RUN_CHAOS_VICTIMS], *mu[PDL_RUN_CHAOS_VICTIMS], *served[PDL_RUN_CHAOS_VICTIMS];
    for (int k = 0; k < nev; k++) {
        run_node_t *nd = ev[k].prefill ? &c->nodes[0] : &c->nodes[r->topo.np];
        victims[k] = &nd->child;
        node_url(nd, "/health", health[k], sizeof(health[k]));
        node_url(nd, "/metrics", metrics[k], sizeof(metrics[k]));
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
    progress(c, "chaos: sending the workload while the schedule runs: %s", c->o.chaos_schedule);
    c->chaos = &ch;
    pdl_status_t st = pdl_run_chaos_run(&ch, err);
    c->chaos = NULL;
    pdl_run_chaos_fini(&ch); /* keeps last_pause_up_ms */
    progress(c, "chaos: %d/%d ok during the outages, %d/%d outside", r->chaos.ok_outage,
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
        int got = scrape_all(c);
        /* A router may drop a node whose pings stopped while it was paused only once it runs again (its
         * TTL sweep lags): the final batch starts once no such drop can still come and every node is
         * listed, so that its requests meet the cluster whole. */
        bool settled = last_pause_up == 0 ||
                       (pdl__clock_now_ms() - last_pause_up >= RUN_CHAOS_SETTLE_MS && chaos_registered(c) &&
                        all_listed(c));
        if (got == c->nnodes && total_held(c) == 0 && settled)
            break;
        if (!children_alive(c) || pdl__clock_now_ms() >= deadline || !wait_ms(c, 200))
            break;
    }
    c->chaos_expired_base = 0;
    for (int i = 0; i < c->nnodes; i++)
        c->chaos_expired_base += msum(&c->nodes[i], "pdlink_expired_total");
    r->chaos.expired += c->chaos_expired_base;
    if (r->chaos.expired > 0)
        pdl_run_result_note(r, "chaos: %llu transfers reaped after defer_timeout during the chaos phase (%llu "
                               "excused by %d requests failed in the outages)",
                            (unsigned long long)r->chaos.expired,
                            (unsigned long long)pdl_run_chaos_expired_bound(r), r->chaos.failed_outage);
    progress(c, "chaos: %llu transfers reaped during the phase; now the final batch",
             (unsigned long long)r->chaos.expired);
    return PDL_OK;
}

/* Run one topology into *r; returns 0, or 2 for a set-up error that should end the run. */
static int run_topology(run_ctx_t *c, pdl_run_result_t *r, bool keep)
{
    const pdl_run_topo_t *t = &r->topo;
    c->phase_name = t->name;
    c->cur = r;
    c->child_died = false;
    c->nnodes = 0;
    memset(&c->router, 0, sizeof(c->router));
    memset(&c->chaos_base, 0, sizeof(c->chaos_base)); /* per topology: set again when its chaos phase ends */
    c->chaos_expired_base = 0;
    pdl_error_t err;
    pdl_error_clear(&err);
    int rc = 0;
    bool failed_note = false;
    pdl_run_netns_t *ns = NULL;
    char desc[96];
    pdl_run_topo_describe(t, desc, sizeof(desc));
    progress(c, "%s: starting a router and %d nodes", desc, t->np + t->nd);

    /* Addresses: loopback, or one namespace per instance (router = 0, nodes 1..). */
    int ninst = t->np + t->nd;
    if (c->o.netns) {
        char nslog[sizeof(c->log_dir) + 48];
        snprintf(nslog, sizeof(nslog), "%s/%s-netns.log", c->log_dir, t->name);
        if (pdl_run_netns_create(ninst + 1, nslog, &ns, &err) != PDL_OK) {
            fprintf(stderr, "pdlink run: %s\n", err.msg);
            return 2;
        }
        snprintf(c->router_host, sizeof(c->router_host), "%s", pdl_run_netns_ip(ns, 0));
    } else {
        snprintf(c->router_host, sizeof(c->router_host), "127.0.0.1");
    }

    /* Ports: one contiguous free run, carved up. */
    int need = 3;
    for (int i = 0; i < t->np; i++)
        need += 1 + 2 * t->ptp[i];
    for (int i = 0; i < t->nd; i++)
        need += 1 + 2 * t->dtp[i];
    int port = 0;
    if (pdl_port_picker_take(&c->ports, "127.0.0.1", need, &port, &err) != PDL_OK) {
        fprintf(stderr, "pdlink run: %s\n", err.msg);
        pdl_run_netns_destroy(ns);
        return 2;
    }
    c->router_port = port++;
    c->disc_port = port++;
    c->prom_port = port++;
    snprintf(c->router.name, sizeof(c->router.name), "router");
    snprintf(c->router.what, sizeof(c->router.what), "%s, port %d, discovery %d",
             c->rt.real ? "vllm-router" : "pdlink-router", c->router_port, c->disc_port);
    snprintf(c->router.log_path, sizeof(c->router.log_path), "%s/%s-router.log", c->log_dir, t->name);
    for (int i = 0; i < ninst; i++) {
        run_node_t *nd = &c->nodes[c->nnodes++];
        memset(nd, 0, sizeof(*nd));
        bool pre = i < t->np;
        int k = pre ? i : i - t->np;
        nd->role = pre ? ROLE_PREFILL : ROLE_DECODE;
        nd->tp = pre ? t->ptp[k] : t->dtp[k];
        nd->http_port = port++;
        nd->hs_base = port;
        port += nd->tp;
        nd->notify_base = port;
        port += nd->tp;
        snprintf(nd->host, sizeof(nd->host), "%s", ns ? pdl_run_netns_ip(ns, i + 1) : "127.0.0.1");
        snprintf(nd->child.name, sizeof(nd->child.name), "%s-%d", pre ? "prefill" : "decode", k);
        snprintf(nd->child.what, sizeof(nd->child.what), "pdlink-node TP%d, port %d", nd->tp, nd->http_port);
        char cname[sizeof(nd->child.name)];
        memcpy(cname, nd->child.name, sizeof(cname));
        snprintf(nd->child.log_path, sizeof(nd->child.log_path), "%s/%s-%s.log", c->log_dir, t->name, cname);
    }

    uint64_t deadline = pdl__clock_now_ms() + RUN_STARTUP_TIMEOUT_MS;
    if (start_router(c, ns ? pdl_run_netns_fd(ns, 0) : -1, &err) != PDL_OK) {
        fprintf(stderr, "pdlink run: %s\n", err.msg);
        rc = 2;
        goto out;
    }
    for (int i = 0; i < c->nnodes; i++) {
        if (start_node(c, &c->nodes[i], c->router_host, ns ? pdl_run_netns_fd(ns, i + 1) : -1, &err) != PDL_OK) {
            fprintf(stderr, "pdlink run: %s\n", err.msg);
            rc = 2;
            goto out;
        }
    }
    progress(c, "waiting for %d nodes to be healthy", c->nnodes);
    for (int i = 0; i < c->nnodes; i++) {
        char url[160];
        node_url(&c->nodes[i], "/health", url, sizeof(url));
        if (wait_http_ok(c, url, deadline, &err) != PDL_OK) {
            if (!c->interrupted && !c->child_died) {
                pdl_run_result_note(r, "%s (%s): %s", c->nodes[i].child.name, c->nodes[i].child.what, err.msg);
                failed_note = true;
            }
            goto out;
        }
    }
    if (wait_registered(c, t->np, t->nd, deadline, &err) != PDL_OK) {
        if (!c->interrupted && !c->child_died) {
            pdl_run_result_note(r, "%s", err.msg);
            failed_note = true;
        }
        goto out;
    }

    if (!c->o.no_prewarm && !wait_prewarmed(c, r))
        goto out;

    char base[96];
    snprintf(base, sizeof(base), "http://%s:%d", c->router_host, c->router_port);
    progress(c, "all registered; sending %d requests through the router at concurrency %d", c->o.requests,
             c->o.concurrency);
    r->ran = true;
    pdl_status_t st = c->o.chaos ? chaos_phase(c, r, &err) : PDL_OK;
    if (st == PDL_OK && c->o.chaos) {
        scrape_all(c);
        pull_figs(c, &c->chaos_base);
    }
    if (st == PDL_OK)
        st = drive_rounds(c, r, base, &err);
    judge_requests(c, r);
    if (st != PDL_OK) {
        if (!c->interrupted && !c->child_died) {
            pdl_run_result_note(r, "workload: %s", err.msg);
            failed_note = true;
        }
        /* Still show what the surviving nodes moved and verified up to the failure. */
        if (!c->interrupted) {
            scrape_all(c);
            collect(c, r);
        }
        goto out;
    }

    /* Releases are asynchronous: give the held blocks a moment to drain before the final scrape, and
     * the releases (write_done) in flight a moment to be counted where they arrive -- nodes are scraped
     * one after the other, so the sender's count can be ahead of the receiver's in one round. Under
     * --chaos a killed node's counters restart, so there only the held blocks are waited for. */
    uint64_t drain_deadline = pdl__clock_now_ms() + RUN_DRAIN_TIMEOUT_MS;
    for (;;) {
        int got = scrape_all(c);
        uint64_t sent, received;
        release_totals(c, &sent, &received);
        if (got == c->nnodes && total_held(c) == 0 && (c->o.chaos || sent == received))
            break;
        if (!children_alive(c) || pdl__clock_now_ms() >= drain_deadline || !wait_ms(c, 100))
            break;
    }
    if (!c->child_died && !c->interrupted) {
        collect(c, r);
        progress(c, "done: %d/%d ok, parity %d/%d, %llu KV bytes, %llu mismatched", r->ok, r->requests,
                 r->parity_ok, r->requests, (unsigned long long)r->kv_bytes, (unsigned long long)r->mismatched);
    }
    if (keep && !c->interrupted && !c->child_died) {
        /* Leave the cluster up: pdl_cli_run prints the report, waits for Ctrl-C, then stops it. */
        pdl_run_result_judge(r, failed_note);
        c->keep_ns = ns;
        c->cur = NULL;
        return 0;
    }
out:
    if (c->interrupted)
        pdl_run_result_note(r, "interrupted by a signal");
    /* A node that crashes on SIGTERM is a failure too: it would lose work in a real deployment. */
    if (stop_cluster(c) > 0)
        failed_note = true;
    pdl_run_netns_destroy(ns);
    /* Notes about release accounting alone are remarks; the judged figures and these flags decide. */
    pdl_run_result_judge(r, failed_note || c->child_died || c->interrupted);
    c->nnodes = 0;
    c->cur = NULL;
    return rc;
}

/* ---------------------------------------------------------------- entry */

static int find_executables(run_ctx_t *c)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
        fprintf(stderr, "pdlink run: readlink /proc/self/exe: %s\n", strerror(errno));
        return -1;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash != NULL)
        *slash = '\0';
    snprintf(c->exe_dir, sizeof(c->exe_dir), "%s", self);
    snprintf(c->node_exe, sizeof(c->node_exe), "%s/pdlink-node", c->exe_dir);
    int bad = 0;
    if (access(c->node_exe, X_OK) != 0) {
        fprintf(stderr, "pdlink run: %s not found or not executable (it is built next to pdlink: "
                        "cmake --build <build dir>)\n", c->node_exe);
        bad = -1;
    }
    pdl_error_t e;
    pdl_error_clear(&e);
    if (pdl_run_router_resolve(c->o.router, c->exe_dir, &c->rt, &e) != PDL_OK) {
        fprintf(stderr, "pdlink run: %s\n", e.msg);
        bad = -1;
    }
    return bad;
}

static int make_log_dir(run_ctx_t *c)
{
    if (c->o.log_dir != NULL) {
        if (strlen(c->o.log_dir) >= sizeof(c->log_dir)) {
            fprintf(stderr, "pdlink run: --log-dir path is longer than %zu characters\n", sizeof(c->log_dir) - 1);
            return -1;
        }
        if (mkdir(c->o.log_dir, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "pdlink run: --log-dir %s: %s\n", c->o.log_dir, strerror(errno));
            return -1;
        }
        snprintf(c->log_dir, sizeof(c->log_dir), "%s", c->o.log_dir);
        c->log_dir_is_temp = false;
        return 0;
    }
    const char *tmp = getenv("TMPDIR");
    if (tmp != NULL && strlen(tmp) > 300)
        tmp = "/tmp";
    snprintf(c->log_dir, sizeof(c->log_dir), "%s/pdlink-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(c->log_dir) == NULL) {
        fprintf(stderr, "pdlink run: mkdtemp %s: %s\n", c->log_dir, strerror(errno));
        return -1;
    }
    c->log_dir_is_temp = true;
    return 0;
}

/* The backend's ceiling with `threads` threads (memcpy) or streams (tcp); 0 when it failed. */
static double ceiling_with(const run_ctx_t *c, int threads)
{
    double g;
    if (!pdl_ceiling_is_memcpy(c->o.backend))
        g = pdl_ceiling_tcp_gbps("127.0.0.1", (size_t)512 << 20, (size_t)1 << 20, threads);
    else
        g = pdl_ceiling_memcpy_gbps((size_t)32 << 20, threads, 16);
    if (g <= 0) {
        pdl_warn("the %s ceiling with %d thread(s) could not be measured; its ratios are left out",
                 pdl_ceiling_is_memcpy(c->o.backend) ? "memcpy" : "tcp stream", threads);
        return 0;
    }
    return g;
}

/* Pull threads of one decode instance of the topology: its TP size (the largest, if they differ). */
static int topo_pull_threads(const pdl_run_topo_t *t)
{
    int m = 0;
    for (int k = 0; k < t->nd; k++)
        m = t->dtp[k] > m ? t->dtp[k] : m;
    return m;
}

static double inst_ceiling(const run_ctx_t *c, int threads)
{
    for (int i = 0; i < c->ninst_ceil; i++)
        if (c->inst_ceil_threads[i] == threads)
            return c->inst_ceil_gbps[i];
    return 0;
}

static void measure_ceiling(run_ctx_t *c)
{
    /*
     * Each rank pulls with its own worker thread and one engine worker (num_workers = 1 in kv_config):
     * one rank's engine rate is compared with a 1-thread memcpy or a single TCP stream, and a decode
     * instance of TP T pulls with T threads (one per rank, all copying at once when pulls overlap), so
     * its transfer rate is compared with a T-thread memcpy or T streams (the same threads:
     * docs/benchmarks.md#how-it-is-measured).
     * More threads than cores share the cores, as the ranks do. 32 MiB is about two llama-3.1-8b pulls
     * of this workload, large enough to leave the caches.
     */
    c->ceiling_threads = 1;
    c->ceiling_gbps = ceiling_with(c, 1);
    for (int i = 0; i < c->o.ntopos; i++) {
        int t = topo_pull_threads(&c->o.topos[i]);
        bool seen = false;
        for (int k = 0; k < c->ninst_ceil; k++)
            seen |= c->inst_ceil_threads[k] == t;
        if (t < 1 || seen || c->ninst_ceil == (int)(sizeof(c->inst_ceil_gbps) / sizeof(c->inst_ceil_gbps[0])))
            continue;
        c->inst_ceil_threads[c->ninst_ceil] = t;
        c->inst_ceil_gbps[c->ninst_ceil] = t == 1 ? c->ceiling_gbps : ceiling_with(c, t);
        c->ninst_ceil++;
    }
}

int pdl_cli_run(int argc, char **argv)
{
    run_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        fprintf(stderr, "pdlink run: out of memory\n");
        return 2;
    }
    c->sigfd = -1;
    int prc = pdl_run_opts_parse(&c->o, argc, argv);
    if (prc != 0) {
        free(c);
        return prc > 0 ? 0 : 2;
    }
    if (c->o.netns) {
        pdl_error_t err;
        pdl_error_clear(&err);
        if (pdl_run_netns_check(&err) != PDL_OK) {
            fprintf(stderr, "pdlink run: %s\n", err.msg);
            free(c);
            return 2;
        }
    }
    if (find_executables(c) != 0) {
        free(c);
        return 2;
    }
    c->tty = isatty(STDERR_FILENO) == 1;
    uint64_t t_start = pdl__clock_now_ms();
    pdl_port_picker_init(&c->ports, ((uint64_t)getpid() << 32) ^ pdl__clock_now_ns());

    /* Signals are blocked before libcurl can start a thread, so every thread inherits the mask. */
    pdl_error_t err;
    pdl_error_clear(&err);
    sigset_t old_mask;
    c->sigfd = pdl_run_signals_open(&old_mask, &err);
    if (c->sigfd < 0) {
        fprintf(stderr, "pdlink run: %s\n", err.msg);
        free(c);
        return 2;
    }
    c->child_mask = old_mask;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, "pdlink run: curl_global_init failed\n");
        pdl_run_signals_close(c->sigfd, &old_mask);
        free(c);
        return 2;
    }
    int rc = 0;
    pdl_run_result_t *results = NULL;
    int nres = 0;
    if (make_log_dir(c) != 0) {
        rc = 2;
        goto done;
    }
    c->phase_name = "ceiling";
    measure_ceiling(c);
    if (c->ceiling_gbps > 0)
        progress(c, "%s: %.2f GB/s with %d thread", pdl_ceiling_is_memcpy(c->o.backend) ? "memcpy" : "tcp stream",
                 c->ceiling_gbps, c->ceiling_threads);
    for (int i = 0; i < c->ninst_ceil; i++)
        if (c->inst_ceil_gbps[i] > 0)
            progress(c, "%s: %.2f GB/s with %d threads", pdl_ceiling_is_memcpy(c->o.backend) ? "memcpy" : "tcp stream",
                     c->inst_ceil_gbps[i], c->inst_ceil_threads[i]);

    rc = run_reference(c);
    if (rc != 0)
        goto done;

    int ntopo = c->o.keep ? 1 : c->o.ntopos;
    results = calloc((size_t)ntopo, sizeof(*results));
    if (results == NULL) {
        rc = 2;
        goto done;
    }
    for (int i = 0; i < ntopo && !c->interrupted; i++) {
        results[i].topo = c->o.topos[i];
        results[i].gbps = results[i].read_gbps = -1;
        results[i].ttft_p50_ms = results[i].ttft_p99_ms = -1;
        nres++;
        int trc = run_topology(c, &results[i], c->o.keep && i == 0);
        if (trc != 0) {
            rc = trc;
            goto done;
        }
    }

    int passed = 0;
    for (int i = 0; i < nres; i++)
        passed += results[i].pass;
    bool all_pass = nres == ntopo && passed == nres && !c->interrupted;
    rc = all_pass ? 0 : (c->interrupted ? 2 : 1);
    if (c->interrupted)
        fprintf(stderr, "pdlink run: interrupted; children stopped\n");
    /* --keep prints the kept nodes' log paths, so their logs stay. */
    bool remove_logs = all_pass && c->log_dir_is_temp && !c->o.keep;
    pdl_run_report_info_t info = {
        .model = c->o.model,
        .backend = c->o.backend,
        .mode = c->o.mode,
        .requests = c->o.requests,
        .concurrency = c->o.concurrency,
        .prompt_min = c->o.prompt_min,
        .prompt_max = c->o.prompt_max,
        .max_tokens = c->o.max_tokens,
        .ceiling_threads = c->ceiling_threads,
        .ceiling_kind = pdl_ceiling_is_memcpy(c->o.backend) ? "memcpy" : "tcp stream",
        .ceiling_gbps = c->ceiling_gbps,
        .ninst_ceilings = c->ninst_ceil,
        .elapsed_s = (double)(pdl__clock_now_ms() - t_start) / 1000.0,
        .log_dir = remove_logs ? NULL : c->log_dir,
    };
    for (int i = 0; i < c->ninst_ceil && i < (int)(sizeof(info.inst_ceiling_gbps) / sizeof(double)); i++) {
        info.inst_ceiling_threads[i] = c->inst_ceil_threads[i];
        info.inst_ceiling_gbps[i] = c->inst_ceil_gbps[i];
    }
    pdl_run_report_print(stdout, &info, results, nres);
    fflush(stdout);
    if (c->o.json_path != NULL) {
        json_t *j = pdl_run_report_json(&info, results, nres);
        if (j == NULL || json_dump_file(j, c->o.json_path, JSON_INDENT(2)) != 0) {
            fprintf(stderr, "pdlink run: cannot write the JSON report to %s\n", c->o.json_path);
            if (rc == 0)
                rc = 2;
        }
        json_decref(j);
    }
    if (c->o.keep && nres == 1 && (c->router.started || c->nnodes > 0)) {
        c->cur = &results[0];
        wait_for_keep(c);
        c->interrupted = false; /* Ctrl-C is the expected way out of --keep */
        if (stop_cluster(c) > 0 || c->child_died) {
            fprintf(stderr, "pdlink run: a process of the kept cluster failed; logs in %s\n", c->log_dir);
            rc = rc == 0 ? 1 : rc;
            remove_logs = false;
        }
        c->nnodes = 0;
        pdl_run_netns_destroy(c->keep_ns);
        c->keep_ns = NULL;
    }
    if (remove_logs)
        nftw(c->log_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    goto cleanup;

done:
    /* Early exits: say where the logs are. */
    if (c->log_dir[0] != '\0')
        fprintf(stderr, "pdlink run: logs in %s\n", c->log_dir);
cleanup:
    stop_cluster(c);
    pdl_run_netns_destroy(c->keep_ns);
    free(results);
    free_workload(c);
    curl_global_cleanup();
    pdl_run_signals_close(c->sigfd, &old_mask);
    free(c);
    return rc;
}
