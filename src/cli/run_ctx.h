/*
 * run_ctx.h -- what the files of `pdlink run` share: the run's context (options, the cluster being run,
 * the workload and its truth, the ceilings) and the functions each file offers the others. Internal to
 * src/cli; the files and what each is for:
 *   run.c            the job: the reference, one topology after another, the report
 *   run_opts.c       the options (one table) and the checks between them
 *   run_cluster.c    one cluster's processes: start, wait for health and registration, watch, stop
 *   run_workload.c   the fixed workload, and driving it through a router in rounds beside the ceilings
 *   run_judge.c      scraping the nodes' /metrics and judging the figures and the responses
 *   run_ceiling.c    the same-run ceilings (memcpy or TCP stream) with a rank's and an instance's threads
 *   run_chaos_phase.c  --chaos on a running cluster: the schedule's operations and the settling after it
 * and the helpers they build on: run_proc (children, signals), run_http (requests), run_metrics
 * (Prometheus text), run_router, run_netns, run_chaos (the schedule), run_report.
 */
#ifndef PDL_CLI_RUN_CTX_H
#define PDL_CLI_RUN_CTX_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/run_chaos.h"
#include "cli/run_metrics.h"
#include "cli/run_netns.h"
#include "cli/run_opts.h"
#include "cli/run_proc.h"
#include "cli/run_report.h"
#include "cli/run_router.h"
#include "app/ports.h"

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

/* run_cluster.c */
void pdl_run_progress(run_ctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pdl_run_progress_requests(run_ctx_t *c, int done, int total);
bool pdl_run_wait_ms(run_ctx_t *c, int ms);
bool pdl_run_children_alive(run_ctx_t *c);
int pdl_run_stop_cluster(run_ctx_t *c);
pdl_status_t pdl_run_start_node(run_ctx_t *c, run_node_t *nd, const char *proxy_ip, int netns_fd, pdl_error_t *err);
pdl_status_t pdl_run_start_router(run_ctx_t *c, int netns_fd, pdl_error_t *err);
void pdl_run_node_url(const run_node_t *nd, const char *path, char *out, size_t len);
pdl_status_t pdl_run_wait_http_ok(run_ctx_t *c, const char *url, uint64_t deadline_ms, pdl_error_t *err);
int pdl_run_workers_count(const char *body, const char *role);
pdl_status_t pdl_run_wait_registered(run_ctx_t *c, int np, int nd, uint64_t deadline_ms, pdl_error_t *err);
bool pdl_run_wait_prewarmed(run_ctx_t *c, pdl_run_result_t *r);
/* The cluster of topology t: addresses (loopback, or a network namespace per instance with --netns, in
 * *ns_p), ports, names and log paths of the router and the nodes. Nothing is started. */
pdl_status_t pdl_run_cluster_plan(run_ctx_t *c, const pdl_run_topo_t *t, pdl_run_netns_t **ns_p, pdl_error_t *err);
/* Start the planned cluster and wait until every node is healthy, listed by the router and prewarmed.
 * Returns 0 when it is, 1 when it did not come up (noted in r; *failed_note_p set unless a death or a
 * signal explains it), 2 for a set-up error (printed) that ends the run. */
int pdl_run_cluster_start(run_ctx_t *c, pdl_run_result_t *r, pdl_run_netns_t *ns, bool *failed_note_p);
/* Releases are asynchronous: wait (at most RUN_DRAIN_TIMEOUT_MS) until no block is held and -- except under
 * --chaos, where a killed node's counters restart -- every release (write_done) sent has been counted where
 * it arrives: nodes are scraped one after the other, so a sender's count can be ahead of its receiver's. */
void pdl_run_cluster_drain(run_ctx_t *c);

/* run_workload.c */
int pdl_run_build_workload(run_ctx_t *c);
void pdl_run_free_workload(run_ctx_t *c);
pdl_status_t pdl_run_drive(run_ctx_t *c, const char *base_url, int first, int n, pdl_error_t *err);
pdl_status_t pdl_run_drive_rounds(run_ctx_t *c, pdl_run_result_t *r, const char *base, pdl_error_t *err);

/* run_judge.c */
uint64_t pdl_run_msum(const run_node_t *nd, const char *name);
int pdl_run_scrape_all(run_ctx_t *c);
uint64_t pdl_run_total_held(const run_ctx_t *c);
void pdl_run_release_totals(const run_ctx_t *c, uint64_t *sent, uint64_t *received);
void pdl_run_pull_figs(const run_ctx_t *c, pull_figs_t *f);
void pdl_run_collect(run_ctx_t *c, pdl_run_result_t *r);
void pdl_run_judge_requests(run_ctx_t *c, pdl_run_result_t *r);

/* run_ceiling.c */
double pdl_run_ceiling_with(const run_ctx_t *c, int threads);
int pdl_run_topo_pull_threads(const pdl_run_topo_t *t);
double pdl_run_inst_ceiling(const run_ctx_t *c, int threads);
void pdl_run_measure_ceiling(run_ctx_t *c);

/* run_chaos_phase.c */
pdl_status_t pdl_run_chaos_phase(run_ctx_t *c, pdl_run_result_t *r, pdl_error_t *err);

#endif /* PDL_CLI_RUN_CTX_H */
