/*
 * run.c -- `pdlink run`, the main job: a whole local P/D cluster per seed topology, driven through the
 * router, every response compared with a single node's and every KV byte accounted for.
 *
 * How it works, per run (run_ctx.h names the file of each part; this one holds the order of things):
 *   1. Options (run_opts.c); the executables pdlink-node and pdlink-router are taken from the directory of this
 *      binary (/proc/self/exe), so a build tree or an install prefix works without PATH games.
 *   2. SIGINT/SIGTERM/SIGHUP are blocked and read from a signalfd, which every waiting loop polls, so a
 *      Ctrl-C turns into an orderly stop (no global flag, no work in a signal handler).
 *   3. The same-run ceilings for the backend are measured (run_ceiling.c: memcpy for shm and for ucx over its
 *      shared-memory transports, a loopback TCP stream for tcp and for ucx with UCX_TLS=tcp):
 *      with one thread (one rank's engine) and with one thread per rank of a decode instance.
 *   4. A non-disaggregated reference node answers the fixed workload once; its texts are the truth.
 *   5. For each topology: ports are found by binding, a router and the nodes are started (run_cluster.c;
 *      kv-transfer-config JSON as in the seed), we wait for every node's /health and for the router's
 *      /workers to list them all, drive the workload through the router (run_workload.c; under --chaos
 *      first the chaos phase, run_chaos_phase.c), wait for held blocks to drain, scrape every node's
 *      /metrics, stop everything, and judge the figures (run_judge.c).
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/ceiling.h"
#include "cli/cli.h"
#include "cli/run_ctx.h"
#include "cli/run_http.h"
#include "common/clock.h"

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
    pdl_run_progress(c, "starting the single-node reference (%s)", nd->child.what);
    int rc = 0;
    char url[160];
    if (pdl_run_start_node(c, nd, NULL, -1, &err) != PDL_OK) {
        fprintf(stderr, "pdlink run: %s\n", err.msg);
        rc = 2;
        goto out;
    }
    pdl_run_node_url(nd, "/health", url, sizeof(url));
    if (pdl_run_wait_http_ok(c, url, pdl__clock_now_ms() + RUN_STARTUP_TIMEOUT_MS, &err) != PDL_OK) {
        if (!c->interrupted && !c->child_died)
            fprintf(stderr, "pdlink run: reference node: %s\n", err.msg);
        rc = c->interrupted ? 2 : 1;
        goto out;
    }
    /* The model id the nodes answer to: the first of /v1/models, else the preset name. */
    pdl_run_node_url(nd, "/v1/models", url, sizeof(url));
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
    if (pdl_run_build_workload(c) != 0) {
        fprintf(stderr, "pdlink run: out of memory building the workload\n");
        rc = 2;
        goto out;
    }
    char base[96];
    pdl_run_node_url(nd, "", base, sizeof(base));
    pdl_status_t st = pdl_run_drive(c, base, 0, c->o.requests, &err);
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
    pdl_run_stop_cluster(c);
    c->nnodes = 0;
    c->child_died = false;
    return rc;
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
    while (pdl_run_wait_ms(c, 500))
        if (!pdl_run_children_alive(c))
            break;
}

/* A topology starts with no cluster, no death seen and none of an earlier topology's chaos figures. */
static void topology_begin(run_ctx_t *c, pdl_run_result_t *r)
{
    c->phase_name = r->topo.name;
    c->cur = r;
    c->child_died = false;
    c->nnodes = 0;
    memset(&c->router, 0, sizeof(c->router));
    memset(&c->chaos_base, 0, sizeof(c->chaos_base)); /* per topology: set again when its chaos phase ends */
    c->chaos_expired_base = 0;
    char desc[96];
    pdl_run_topo_describe(&r->topo, desc, sizeof(desc));
    pdl_run_progress(c, "%s: starting a router and %d nodes", desc, r->topo.np + r->topo.nd);
}

/* The workload on a cluster that is up -- under --chaos the chaos phase first -- and its requests judged.
 * False when it failed (noted in r unless a death or a signal explains it). */
static bool topology_workload(run_ctx_t *c, pdl_run_result_t *r, bool *failed_note_p)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    char base[96];
    snprintf(base, sizeof(base), "http://%s:%d", c->router_host, c->router_port);
    pdl_run_progress(c, "all registered; sending %d requests through the router at concurrency %d", c->o.requests,
                     c->o.concurrency);
    r->ran = true;
    pdl_status_t st = c->o.chaos ? pdl_run_chaos_phase(c, r, &err) : PDL_OK;
    if (st == PDL_OK && c->o.chaos) {
        pdl_run_scrape_all(c);
        pdl_run_pull_figs(c, &c->chaos_base);
    }
    if (st == PDL_OK)
        st = pdl_run_drive_rounds(c, r, base, &err);
    pdl_run_judge_requests(c, r);
    if (st == PDL_OK)
        return true;
    if (!c->interrupted && !c->child_died) {
        pdl_run_result_note(r, "workload: %s", err.msg);
        *failed_note_p = true;
    }
    /* Still show what the surviving nodes moved and verified up to the failure. */
    if (!c->interrupted) {
        pdl_run_scrape_all(c);
        pdl_run_collect(c, r);
    }
    return false;
}

/* Run one topology into *r; returns 0, or 2 for a set-up error that should end the run. With `keep` a
 * cluster that passed is left up (c->keep_ns) for pdl_cli_run to wait on. */
static int run_topology(run_ctx_t *c, pdl_run_result_t *r, bool keep)
{
    topology_begin(c, r);
    pdl_run_netns_t *ns = NULL;
    pdl_error_t err;
    pdl_error_clear(&err);
    if (pdl_run_cluster_plan(c, &r->topo, &ns, &err) != PDL_OK) {
        fprintf(stderr, "pdlink run: %s\n", err.msg);
        return 2;
    }
    bool failed_note = false;
    int rc = pdl_run_cluster_start(c, r, ns, &failed_note);
    if (rc == 0 && topology_workload(c, r, &failed_note)) {
        pdl_run_cluster_drain(c);
        if (!c->child_died && !c->interrupted) {
            pdl_run_collect(c, r);
            pdl_run_progress(c, "done: %d/%d ok, parity %d/%d, %llu KV bytes, %llu mismatched", r->ok, r->requests,
                             r->parity_ok, r->requests, (unsigned long long)r->kv_bytes,
                             (unsigned long long)r->mismatched);
        }
        if (keep && !c->interrupted && !c->child_died) {
            /* Leave the cluster up: pdl_cli_run prints the report, waits for Ctrl-C, then stops it. */
            pdl_run_result_judge(r, failed_note);
            c->keep_ns = ns;
            c->cur = NULL;
            return 0;
        }
    }
    if (c->interrupted)
        pdl_run_result_note(r, "interrupted by a signal");
    /* A node that crashes on SIGTERM is a failure too: it would lose work in a real deployment. */
    if (pdl_run_stop_cluster(c) > 0)
        failed_note = true;
    pdl_run_netns_destroy(ns);
    /* Notes about release accounting alone are remarks; the judged figures and these flags decide. */
    pdl_run_result_judge(r, failed_note || c->child_died || c->interrupted);
    c->nnodes = 0;
    c->cur = NULL;
    return rc == 2 ? 2 : 0;
}

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

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Set-up before anything runs: options, the executables, the signal fd, libcurl. Returns 0, 1 after
 * --help, or 2 (printed). On 0, *old_mask_p is the signal mask to restore and libcurl is initialised. */
static int run_setup(run_ctx_t *c, int argc, char **argv, sigset_t *old_mask_p)
{
    int prc = pdl_run_opts_parse(&c->o, argc, argv);
    if (prc != 0)
        return prc > 0 ? 1 : 2;
    pdl_error_t err;
    pdl_error_clear(&err);
    if (c->o.netns && pdl_run_netns_check(&err) != PDL_OK) {
        fprintf(stderr, "pdlink run: %s\n", err.msg);
        return 2;
    }
    if (find_executables(c) != 0)
        return 2;
    c->tty = isatty(STDERR_FILENO) == 1;
    pdl_port_picker_init(&c->ports, ((uint64_t)getpid() << 32) ^ pdl__clock_now_ns());
    /* Signals are blocked before libcurl can start a thread, so every thread inherits the mask. */
    c->sigfd = pdl_run_signals_open(old_mask_p, &err);
    if (c->sigfd < 0) {
        fprintf(stderr, "pdlink run: %s\n", err.msg);
        return 2;
    }
    c->child_mask = *old_mask_p;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) {
        fprintf(stderr, "pdlink run: curl_global_init failed\n");
        pdl_run_signals_close(c->sigfd, old_mask_p);
        return 2;
    }
    return 0;
}

static const char *ceiling_kind(const run_ctx_t *c)
{
    return pdl_ceiling_is_memcpy(c->o.backend) ? "memcpy" : "tcp stream";
}

static void run_ceilings(run_ctx_t *c)
{
    c->phase_name = "ceiling";
    pdl_run_measure_ceiling(c);
    if (c->ceiling_gbps > 0)
        pdl_run_progress(c, "%s: %.2f GB/s with %d thread", ceiling_kind(c), c->ceiling_gbps, c->ceiling_threads);
    for (int i = 0; i < c->ninst_ceil; i++)
        if (c->inst_ceil_gbps[i] > 0)
            pdl_run_progress(c, "%s: %.2f GB/s with %d threads", ceiling_kind(c), c->inst_ceil_gbps[i],
                             c->inst_ceil_threads[i]);
}

/* The topologies in order into results (one with --keep), until one ends the run or a signal comes. Returns
 * 0 or the exit status of a set-up error; *nres_p counts the results begun. */
static int run_topologies(run_ctx_t *c, pdl_run_result_t *results, int ntopo, int *nres_p)
{
    for (int i = 0; i < ntopo && !c->interrupted; i++) {
        results[i].topo = c->o.topos[i];
        results[i].gbps = results[i].read_gbps = -1;
        results[i].ttft_p50_ms = results[i].ttft_p99_ms = -1;
        (*nres_p)++;
        int trc = run_topology(c, &results[i], c->o.keep && i == 0);
        if (trc != 0)
            return trc;
    }
    return 0;
}

/* The report on stdout, and as JSON with --json. Returns 0, or 2 when the JSON could not be written. */
static int run_report(run_ctx_t *c, const pdl_run_result_t *results, int nres, uint64_t t_start, bool remove_logs)
{
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
        .ceiling_kind = ceiling_kind(c),
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
    if (c->o.json_path == NULL)
        return 0;
    json_t *j = pdl_run_report_json(&info, results, nres);
    int rc = 0;
    if (j == NULL || json_dump_file(j, c->o.json_path, JSON_INDENT(2)) != 0) {
        fprintf(stderr, "pdlink run: cannot write the JSON report to %s\n", c->o.json_path);
        rc = 2;
    }
    json_decref(j);
    return rc;
}

/* --keep: wait for Ctrl-C with the kept cluster up, then stop it. False if a process of it failed. */
static bool run_keep(run_ctx_t *c, pdl_run_result_t *result)
{
    c->cur = result;
    wait_for_keep(c);
    c->interrupted = false; /* Ctrl-C is the expected way out of --keep */
    bool ok = true;
    if (pdl_run_stop_cluster(c) > 0 || c->child_died) {
        fprintf(stderr, "pdlink run: a process of the kept cluster failed; logs in %s\n", c->log_dir);
        ok = false;
    }
    c->nnodes = 0;
    pdl_run_netns_destroy(c->keep_ns);
    c->keep_ns = NULL;
    return ok;
}

/* The reference, the topologies, the report; returns the exit status. */
static int run_job(run_ctx_t *c)
{
    uint64_t t_start = pdl__clock_now_ms();
    pdl_run_result_t *results = NULL;
    int nres = 0, ntopo = c->o.keep ? 1 : c->o.ntopos;
    int rc = make_log_dir(c) != 0 ? 2 : 0;
    if (rc == 0) {
        run_ceilings(c);
        rc = run_reference(c);
    }
    if (rc == 0 && (results = calloc((size_t)ntopo, sizeof(*results))) == NULL)
        rc = 2;
    if (rc == 0)
        rc = run_topologies(c, results, ntopo, &nres);
    if (rc != 0) {
        /* Early exits: say where the logs are. */
        if (c->log_dir[0] != '\0')
            fprintf(stderr, "pdlink run: logs in %s\n", c->log_dir);
        free(results);
        return rc;
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
    if (run_report(c, results, nres, t_start, remove_logs) != 0 && rc == 0)
        rc = 2;
    if (c->o.keep && nres == 1 && (c->router.started || c->nnodes > 0) && !run_keep(c, &results[0])) {
        rc = rc == 0 ? 1 : rc;
        remove_logs = false;
    }
    if (remove_logs)
        nftw(c->log_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(results);
    return rc;
}

int pdl_cli_run(int argc, char **argv)
{
    run_ctx_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        fprintf(stderr, "pdlink run: out of memory\n");
        return 2;
    }
    c->sigfd = -1;
    sigset_t old_mask;
    int rc = run_setup(c, argc, argv, &old_mask);
    if (rc != 0) {
        free(c);
        return rc == 1 ? 0 : 2;
    }
    rc = run_job(c);
    pdl_run_stop_cluster(c);
    pdl_run_netns_destroy(c->keep_ns);
    pdl_run_free_workload(c);
    curl_global_cleanup();
    pdl_run_signals_close(c->sigfd, &old_mask);
    free(c);
    return rc;
}
