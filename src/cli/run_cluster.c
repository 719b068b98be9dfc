/*
 * run_cluster.c -- the processes of one `pdlink run` cluster: progress lines, the node and router command
 * lines (the seed's kv-transfer-config JSON), starting them, waiting for their /health, for the router to
 * list them and for their prewarm, watching for a death, and stopping them.
 *
 * Every wait polls the signal fd (wait_ms), so Ctrl-C ends it, and checks the children, so a death ends
 * it too; a death is reported once, with the child's exit and the last lines of its log.
 */
#include <jansson.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cli/run_ctx.h"
#include "cli/run_http.h"
#include "common/clock.h"

void pdl_run_progress(run_ctx_t *c, const char *fmt, ...)
{
    if (c->o.quiet)
        return;
    /* On a terminal, first erase the request counter that pdl_run_progress_requests keeps redrawing. */
    flockfile(stderr);
    fprintf(stderr, "%s[%s] ", c->tty ? "\r\033[K" : "", c->phase_name);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    funlockfile(stderr);
}

void pdl_run_progress_requests(run_ctx_t *c, int done, int total)
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

bool pdl_run_wait_ms(run_ctx_t *c, int ms)
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
bool pdl_run_children_alive(run_ctx_t *c)
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
int pdl_run_stop_cluster(run_ctx_t *c)
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
    pdl_run_children_alive(c); /* a death before the stop is still a death */
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

pdl_status_t pdl_run_start_node(run_ctx_t *c, run_node_t *nd, const char *proxy_ip, int netns_fd, pdl_error_t *err)
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

pdl_status_t pdl_run_start_router(run_ctx_t *c, int netns_fd, pdl_error_t *err)
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

void pdl_run_node_url(const run_node_t *nd, const char *path, char *out, size_t len)
{
    snprintf(out, len, "http://%s:%d%s", nd->host, nd->http_port, path);
}

/* Wait until GET url returns 200 (or a child dies, a signal arrives, the deadline passes). */
pdl_status_t pdl_run_wait_http_ok(run_ctx_t *c, const char *url, uint64_t deadline_ms, pdl_error_t *err)
{
    for (;;) {
        long code = 0;
        pdl_error_t e;
        pdl_error_clear(&e);
        pdl_run_http_get(url, 2000, &code, NULL, &e);
        if (code == 200)
            return PDL_OK;
        if (!pdl_run_children_alive(c))
            return pdl_error_set(err, PDL_ERR_PEER_GONE, "a process died during start-up");
        if (pdl__clock_now_ms() >= deadline_ms)
            return pdl_error_set(err, PDL_ERR_TIMEOUT, "%s did not return 200 within %d s (last: %s)", url,
                                 RUN_STARTUP_TIMEOUT_MS / 1000, code ? "non-200 status" : e.msg);
        if (!pdl_run_wait_ms(c, 100))
            return pdl_error_set(err, PDL_ERR_BAD_STATE, "interrupted");
    }
}

/* Count the router's registered workers of each role from GET /workers. */
int pdl_run_workers_count(const char *body, const char *role)
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

pdl_status_t pdl_run_wait_registered(run_ctx_t *c, int np, int nd, uint64_t deadline_ms, pdl_error_t *err)
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
            p = pdl_run_workers_count(body, "prefill");
            d = pdl_run_workers_count(body, "decode");
        }
        free(body);
        if (p != lp || d != ld) {
            if (p >= 0)
                pdl_run_progress(c, "registered at the router: %d/%d prefill, %d/%d decode", p, np, d, nd);
            lp = p;
            ld = d;
        }
        if (p == np && d == nd)
            return PDL_OK;
        if (!pdl_run_children_alive(c))
            return pdl_error_set(err, PDL_ERR_PEER_GONE, "a process died during registration");
        if (pdl__clock_now_ms() >= deadline_ms)
            return pdl_error_set(err, PDL_ERR_TIMEOUT,
                                 "router %s lists %d/%d prefill and %d/%d decode workers after %d s", url, p, np, d,
                                 nd, RUN_STARTUP_TIMEOUT_MS / 1000);
        if (!pdl_run_wait_ms(c, 100))
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
bool pdl_run_wait_prewarmed(run_ctx_t *c, pdl_run_result_t *r)
{
    uint64_t deadline = pdl__clock_now_ms() + RUN_PREWARM_TIMEOUT_MS, t0 = pdl__clock_now_ms();
    for (;;) {
        pdl_run_scrape_all(c);
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
            pdl_run_progress(c, "every %s connected to its peers in %.1f s", prewarming_role(c) == ROLE_DECODE ? "decode" : "prefill",
                     (pdl__clock_now_ms() - t0) / 1e3);
            return true;
        }
        if (!pdl_run_children_alive(c))
            return false;
        if (pdl__clock_now_ms() >= deadline) {
            pdl_run_result_note(r, "%d %s instance(s) still connecting to their peers after %d s; started anyway", waiting,
                                prewarming_role(c) == ROLE_DECODE ? "decode" : "prefill", RUN_PREWARM_TIMEOUT_MS / 1000);
            return true;
        }
        if (!pdl_run_wait_ms(c, 50))
            return false;
    }
}

/* The ports of a topology's cluster, from one contiguous free run: the router's three, then per node its
 * HTTP port and a handshake and a notify port per rank. */
static int cluster_ports(const pdl_run_topo_t *t)
{
    int need = 3;
    for (int i = 0; i < t->np; i++)
        need += 1 + 2 * t->ptp[i];
    for (int i = 0; i < t->nd; i++)
        need += 1 + 2 * t->dtp[i];
    return need;
}

/* Node i of the topology (prefills first) on host `host`, from port `port` on; returns the next free one. */
static int cluster_node(run_ctx_t *c, const pdl_run_topo_t *t, int i, const char *host, int port)
{
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
    snprintf(nd->host, sizeof(nd->host), "%s", host);
    snprintf(nd->child.name, sizeof(nd->child.name), "%s-%d", pre ? "prefill" : "decode", k);
    snprintf(nd->child.what, sizeof(nd->child.what), "pdlink-node TP%d, port %d", nd->tp, nd->http_port);
    char cname[sizeof(nd->child.name)];
    memcpy(cname, nd->child.name, sizeof(cname));
    snprintf(nd->child.log_path, sizeof(nd->child.log_path), "%s/%s-%s.log", c->log_dir, t->name, cname);
    return port;
}

pdl_status_t pdl_run_cluster_plan(run_ctx_t *c, const pdl_run_topo_t *t, pdl_run_netns_t **ns_p, pdl_error_t *err)
{
    pdl_run_netns_t *ns = NULL;
    int ninst = t->np + t->nd, port = 0;
    /* Addresses: loopback, or one namespace per instance (router = 0, nodes 1..). */
    if (c->o.netns) {
        char nslog[sizeof(c->log_dir) + 48];
        snprintf(nslog, sizeof(nslog), "%s/%s-netns.log", c->log_dir, t->name);
        if (pdl_run_netns_create(ninst + 1, nslog, &ns, err) != PDL_OK)
            return PDL_ERR_INVALID;
    }
    snprintf(c->router_host, sizeof(c->router_host), "%s", ns ? pdl_run_netns_ip(ns, 0) : "127.0.0.1");
    if (pdl_port_picker_take(&c->ports, "127.0.0.1", cluster_ports(t), &port, err) != PDL_OK) {
        pdl_run_netns_destroy(ns);
        return PDL_ERR_INVALID;
    }
    c->router_port = port++;
    c->disc_port = port++;
    c->prom_port = port++;
    snprintf(c->router.name, sizeof(c->router.name), "router");
    snprintf(c->router.what, sizeof(c->router.what), "%s, port %d, discovery %d",
             c->rt.real ? "vllm-router" : "pdlink-router", c->router_port, c->disc_port);
    snprintf(c->router.log_path, sizeof(c->router.log_path), "%s/%s-router.log", c->log_dir, t->name);
    for (int i = 0; i < ninst; i++)
        port = cluster_node(c, t, i, ns ? pdl_run_netns_ip(ns, i + 1) : "127.0.0.1", port);
    *ns_p = ns;
    return PDL_OK;
}

int pdl_run_cluster_start(run_ctx_t *c, pdl_run_result_t *r, pdl_run_netns_t *ns, bool *failed_note_p)
{
    const pdl_run_topo_t *t = &r->topo;
    pdl_error_t err;
    pdl_error_clear(&err);
    uint64_t deadline = pdl__clock_now_ms() + RUN_STARTUP_TIMEOUT_MS;
    if (pdl_run_start_router(c, ns ? pdl_run_netns_fd(ns, 0) : -1, &err) != PDL_OK) {
        fprintf(stderr, "pdlink run: %s\n", err.msg);
        return 2;
    }
    for (int i = 0; i < c->nnodes; i++)
        if (pdl_run_start_node(c, &c->nodes[i], c->router_host, ns ? pdl_run_netns_fd(ns, i + 1) : -1, &err) != PDL_OK) {
            fprintf(stderr, "pdlink run: %s\n", err.msg);
            return 2;
        }
    pdl_run_progress(c, "waiting for %d nodes to be healthy", c->nnodes);
    for (int i = 0; i < c->nnodes; i++) {
        char url[160];
        pdl_run_node_url(&c->nodes[i], "/health", url, sizeof(url));
        if (pdl_run_wait_http_ok(c, url, deadline, &err) != PDL_OK) {
            if (!c->interrupted && !c->child_died) {
                pdl_run_result_note(r, "%s (%s): %s", c->nodes[i].child.name, c->nodes[i].child.what, err.msg);
                *failed_note_p = true;
            }
            return 1;
        }
    }
    if (pdl_run_wait_registered(c, t->np, t->nd, deadline, &err) != PDL_OK) {
        if (!c->interrupted && !c->child_died) {
            pdl_run_result_note(r, "%s", err.msg);
            *failed_note_p = true;
        }
        return 1;
    }
    if (!c->o.no_prewarm && !pdl_run_wait_prewarmed(c, r))
        return 1;
    return 0;
}

void pdl_run_cluster_drain(run_ctx_t *c)
{
    uint64_t deadline = pdl__clock_now_ms() + RUN_DRAIN_TIMEOUT_MS;
    for (;;) {
        int got = pdl_run_scrape_all(c);
        uint64_t sent, received;
        pdl_run_release_totals(c, &sent, &received);
        if (got == c->nnodes && pdl_run_total_held(c) == 0 && (c->o.chaos || sent == received))
            break;
        if (!pdl_run_children_alive(c) || pdl__clock_now_ms() >= deadline || !pdl_run_wait_ms(c, 100))
            break;
    }
}
