/*
 * run_chaos.h -- `pdlink run --chaos` (docs/run.md#chaos---chaos): while a topology's workload runs, the chaos
 * schedule's events happen one after the other: kill -9 a decode (or prefill) node, restart it on the
 * same ports and wait until a request succeeds through it again; or stop it with SIGSTOP for longer than
 * the nodes' consumer_gone_timeout (a long GC, a stalled host), continue it with SIGCONT and wait the
 * same way. Every request sent meanwhile is classified by whether it overlapped an outage window (from a
 * kill or stop to the first success through the node again): inside, a failure is expected and counted;
 * outside, it fails the topology. run.c owns the cluster and gives the chaos phase three operations
 * (drive one pass of the workload, restart a node, "is every node registered again").
 *
 * The phase is a state machine per event, advanced from the workload's tick (about every 50 ms and
 * after each completion, so the load never stops while a node is down):
 *
 *   WAIT --(enough completions)--> DOWN (KILL: scrape its mismatched and expired counters, kill -9, reap;
 *                                        PAUSE: read its "served" counter, SIGSTOP)
 *   DOWN --(KILL: PDL_RUN_CHAOS_DOWN_MS later, so requests meet the dead node: ops.restart;
 *           PAUSE: its pause later: SIGCONT)--> STARTING
 *   STARTING --(GET /health 200)--> REGISTERING --(ops.registered)--> SERVING
 *   SERVING --(its "served" counter above its value before the event: a decode's
 *              requests_total{status="ok"}, a prefill's releases or write_done, i.e. its KV reached a
 *              decode)--> DONE; the next event's WAIT
 *   any state but WAIT/DONE --(PDL_RUN_CHAOS_RECOVER_MS after the restart or SIGCONT)--> DONE, not recovered
 *
 * The prefill that is not killed (a topology with two prefills): every finished request is kept as a
 * sample with the prefill pdlink-router named for it (X-Pdlink-Prefill), so the report can show that
 * prefill's latencies before, during and after the other's outage (run_report.h) -- the outage of the
 * schedule's first prefill kill (else its first prefill pause). That event's WAIT also waits for
 * PDL_RUN_CHAOS_MIN_SAMPLES successes through the healthy prefill outside the other events' outages, and
 * the phase goes on after the last event until as many came after its outage -- each for at most
 * PDL_RUN_CHAOS_EXTRA_PASSES more passes of the workload, so a workload that hashes (almost) nothing to
 * that prefill does not run on.
 */
#ifndef PDL_CLI_RUN_CHAOS_H
#define PDL_CLI_RUN_CHAOS_H

#include <stdbool.h>
#include <stdint.h>

#include "cli/run_http.h"
#include "cli/run_proc.h"
#include "cli/run_report.h"
#include "pdlink/status.h"

enum {
    /* How long a victim stays dead before its restart: shorter than the two refused probes (1 s apart)
     * the consumer-gone watch needed before it told a restarted decode from its dead process by the
     * handshake metadata (watch.c). With 500 ms and that older watch, the dead process's holds stayed on
     * a surviving prefill until defer_timeout (60 s; 2p1d, 3 of 6 runs) -- docs/run.md, "--chaos". */
    PDL_RUN_CHAOS_DOWN_MS = 500,
    PDL_RUN_CHAOS_RECOVER_MS = 60000, /* restart or SIGCONT -> first success through it, at most */
    PDL_RUN_CHAOS_RETRY_MS = 100,     /* pause after a pass in which every request failed */
    PDL_RUN_CHAOS_FAIL_NOTES = 2,   /* failures noted per outage (all are counted) */
    PDL_RUN_CHAOS_EXTRA_PASSES = 4, /* passes' worth of completions waited at most for latency samples */
    PDL_RUN_CHAOS_WATCH_MS = 200,   /* between looks at the victims' registrations at the router */
};

/* One event of the schedule: what happens to the first decode (decode-0) or prefill (prefill-0). */
typedef struct pdl_run_chaos_event {
    pdl_run_chaos_action_t action;
    bool prefill;
    int pause_ms;                    /* PAUSE: SIGSTOP to SIGCONT; KILL: 0 */
} pdl_run_chaos_event_t;

/* The default schedule, for --help and docs/run.md. */
#define PDL_RUN_CHAOS_SCHEDULE_DEFAULT "kill-decode,kill-prefill,pause-decode,pause-prefill"

/*
 * Parse a schedule, a comma-separated list of kill-decode, kill-prefill, pause-decode, pause-prefill, into
 * ev[0..cap); pauses get durations spread evenly over [pause_min_ms, pause_max_ms] in the order they
 * come (one pause: pause_min_ms). Returns the number of events, or -1 with err naming the bad entry (an
 * unknown name, none, more than cap).
 */
int pdl_run_chaos_schedule_parse(const char *list, int pause_min_ms, int pause_max_ms, pdl_run_chaos_event_t *ev,
                                 int cap, pdl_error_t *err);

/* One finished request of the phase, for the healthy prefill's latencies. */
typedef struct pdl_run_chaos_sample {
    uint64_t start_ms, end_ms; /* pdl__clock_now_ms() scale */
    double ms;                 /* its total time */
    bool ok;
    bool healthy;              /* served by the prefill that is not killed */
} pdl_run_chaos_sample_t;

/* What run.c does for the chaos phase; ctx is passed back to each. */
typedef struct pdl_run_chaos_ops {
    void *ctx;
    /* Send reqs[0..n) once (cleared first); the load's tick must call pdl_run_chaos_tick. */
    pdl_status_t (*run_pass)(void *ctx, pdl_error_t *err);
    /* Start the killed child again with the same command line (same ports). */
    pdl_status_t (*restart)(void *ctx, pdl_run_child_t *victim, pdl_error_t *err);
    /* One look: does the router list every node of the topology? */
    bool (*registered)(void *ctx);
    /* One look at the victim's registration: listed now, and *removals_p the times the router has
     * dropped it so far (-1: unknown). Both routers drop an instance whose pings stopped for 5 s. */
    bool (*listed)(void *ctx, const pdl_run_child_t *victim, int *removals_p);
} pdl_run_chaos_ops_t;

typedef enum { PDL_CHAOS_WAIT, PDL_CHAOS_DOWN, PDL_CHAOS_STARTING, PDL_CHAOS_REGISTERING, PDL_CHAOS_SERVING,
               PDL_CHAOS_DONE } pdl_run_chaos_state_t;

typedef struct pdl_run_chaos_victim {
    pdl_run_chaos_event_t ev;
    pdl_run_child_t *child;          /* borrowed from run.c's node table */
    char health_url[160], metrics_url[160];
    const char *served_metric;       /* above served_base once it served again (a static string) */
    double served_base;              /* PAUSE: the counter before SIGSTOP; KILL: 0 (a new process) */
    pdl_run_chaos_state_t state;
    uint64_t kill_ms, up_ms, served_ms; /* pdl__clock_now_ms(); 0 = not yet (kill_ms: the kill or SIGSTOP) */
    /* The router dropped the victim after the event began (a pause longer than its ping TTL; seen on a
     * tick, or by its removal count): the outage lasts until it is listed again, at readd_ms (0: not
     * yet), even when that is after the first success through it. */
    int removals_base, removals_last;
    bool dropped;
    uint64_t readd_ms;
} pdl_run_chaos_victim_t;

typedef struct pdl_run_chaos {
    pdl_run_chaos_ops_t ops;
    const char *name;                /* the topology, for progress lines */
    bool quiet;
    pdl_run_chaos_victim_t v[PDL_RUN_CHAOS_VICTIMS];
    int nv, cur;                     /* victims, and the one in progress */
    int gap;                         /* completions between one victim's recovery and the next kill */
    int completed, next_kill_at;     /* completions over all passes */
    pdl_run_req_t *reqs;             /* the workload, borrowed; n requests */
    char *const *ref_text;           /* the single-node reference's texts, borrowed (NULL entries: none) */
    int n;
    uint64_t *end_ms;                /* when each request of the pass was seen done; 0 = not yet */
    int pk;                          /* the prefill event the healthy prefill is measured around; -1: none */
    char victim_prefill[128];        /* "host:port" of that event's victim (from its health URL) */
    pdl_run_chaos_sample_t *samples; /* every finished request of the phase, in order */
    int nsamples, capsamples;
    int extra_until;                 /* completions after the last victim: go on until then at most */
    uint64_t last_watch_ms;          /* the last look at the victims' registrations */
    uint64_t last_pause_up_ms;       /* SIGCONT of the last pause; 0 without one */
    pdl_run_chaos_result_t *res;     /* filled as the phase goes */
    pdl_run_result_t *notes;         /* failures and events are noted here */
} pdl_run_chaos_t;

/*
 * Prepare the phase: events ev[0..nv) happen in that order, event k to victims[k], reached at
 * health_urls[k]/metrics_urls[k], serving again once the counter served[k] of its /metrics is above its
 * value before the event ("pdlink_requests_total" counts its status="ok" series only). reqs[0..n) is the
 * workload each pass sends, ref_text[0..n) the reference's answers every success must equal.
 * Results go to r->chaos, notes to r. PDL_ERR_NOMEM when the per-request table cannot be allocated.
 */
pdl_status_t pdl_run_chaos_init(pdl_run_chaos_t *ch, const pdl_run_chaos_ops_t *ops, const char *name, bool quiet,
                                const pdl_run_chaos_event_t ev[], pdl_run_child_t *const victims[],
                                const char *const health_urls[], const char *const metrics_urls[],
                                const char *const served[], int nv, pdl_run_req_t *reqs, char *const *ref_text, int n,
                                pdl_run_result_t *r);

/* Advance the state machine and note the requests finished since the last tick. Never blocks long
 * (one GET with a short timeout at most). */
void pdl_run_chaos_tick(pdl_run_chaos_t *ch);

/*
 * Drive passes of the workload until every event is DONE (bounded by PDL_RUN_CHAOS_RECOVER_MS each), classifying
 * every finished request. Returns the first error of ops->run_pass (an interrupt, a dead process); a
 * request failing is not an error.
 */
pdl_status_t pdl_run_chaos_run(pdl_run_chaos_t *ch, pdl_error_t *err);

/* Free what init allocated; a victim still stopped (an interrupted phase) is continued first, so that
 * stopping the cluster is not left waiting on it. */
void pdl_run_chaos_fini(pdl_run_chaos_t *ch);

#endif
