/*
 * run_report.h -- the figures `pdlink run` collects per topology, its verdict rules, and the two ways
 * it shows them: a text table on stdout (one column per topology) and a JSON document (jansson).
 */
#ifndef PDL_CLI_RUN_REPORT_H
#define PDL_CLI_RUN_REPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "bench/pairs.h"

/* Pairs: at most PDL_PAIRS_MAX, fewer than PDL_PAIRS_MIN give no figure (bench/pairs.h). */
enum { PDL_RUN_MAX_INST = 8, PDL_RUN_MAX_NOTES = 12, PDL_RUN_MAX_PAIRS = 16, PDL_RUN_MIN_PAIRS = PDL_PAIRS_MIN };

/*
 * A ratio to a ceiling from alternating pairs: the ceiling and the measurement taken one
 * after the other, A B A B ..., the ratio of each pair, then their median with the min-max. Robust to
 * another job taking the machine for a while: it moves a pair or two, not both figures of the ratio.
 * Summed up by bench/pairs.h, the same rule as `pdlink bench`.
 */
typedef struct pdl_run_ratio {
    int pairs;                /* pairs that gave a ratio (measurement >= 0, ceiling > 0) */
    double median, min, max;  /* of the per-pair ratios; -1 when pairs == 0 */
    double ceiling_median;    /* of the pairs' ceilings, for display; -1 when pairs == 0 */
    double spread;            /* (q3 - q1) / median of the per-pair ratios */
    bool wide;                /* spread > PDL_PAIRS_SPREAD_MAX: say so instead of a figure */
    bool above;               /* median > 1 + PDL_PAIRS_ABOVE_TOL: the "ceiling" was no upper bound here */
} pdl_run_ratio_t;

/* The ratio of n pairs meas[i] / ceil[i] (pairs with meas < 0 or ceil <= 0 are left out). Pure. */
void pdl_run_ratio_pairs(const double *meas, const double *ceil, int n, pdl_run_ratio_t *out);
/* The text cell of a ratio: "53% 44-61%", "wide 20-90%", "n=3<5 53%", "118%!" ... ("-" with no pair). */
void pdl_run_ratio_cell(const pdl_run_ratio_t *r, char *buf, size_t len);

/* One topology: prefill instances' TP sizes → decode instances' TP sizes. */
typedef struct pdl_run_topo {
    char name[32];                   /* "2p1d" */
    int np, nd;
    int ptp[PDL_RUN_MAX_INST];
    int dtp[PDL_RUN_MAX_INST];
} pdl_run_topo_t;

/* "TP4+TP4 -> TP8" */
void pdl_run_topo_describe(const pdl_run_topo_t *t, char *buf, size_t len);

/*
 * `pdlink run --chaos` (docs/run.md), per topology: requests sent while the chaos schedule's events ran
 * -- a decode or a prefill node killed with kill -9 and restarted, or stopped (SIGSTOP) for a while and
 * continued (SIGCONT) -- split by whether they overlapped an outage window (from the kill or stop to the
 * first success through the node again). Times are measured and shown, never judged.
 */
enum { PDL_RUN_CHAOS_VICTIMS = 8 }; /* events of a schedule, at most */
typedef enum { PDL_RUN_CHAOS_KILL, PDL_RUN_CHAOS_PAUSE } pdl_run_chaos_action_t;

/*
 * Requests served by the prefill that was NOT killed (a topology with two prefills), by when they ran
 * relative to the killed prefill's outage window: before the kill (and outside the decode's outage),
 * overlapping the window, and after it. Which prefill served a request is what pdlink-router's
 * X-Pdlink-Prefill header said. Latencies are of the successes (request start to last byte). Fewer
 * than PDL_RUN_CHAOS_MIN_SAMPLES successes in a phase give no p99 and no ratio: the report says
 * "n=k<20" instead (the convention of the ratios above: too few, say so).
 */
enum { PDL_RUN_CHAOS_BEFORE, PDL_RUN_CHAOS_DURING, PDL_RUN_CHAOS_AFTER, PDL_RUN_CHAOS_PHASES };
enum { PDL_RUN_CHAOS_MIN_SAMPLES = 20 };
typedef struct pdl_run_chaos_lat {
    int ok, failed;          /* requests of the phase that the healthy prefill served (or failed) */
    double p50_ms, p99_ms;   /* of the successes (nearest rank); -1 without any */
} pdl_run_chaos_lat_t;

typedef struct pdl_run_chaos_result {
    bool on;                         /* --chaos ran on this topology */
    int passes;                      /* passes of the workload sent while the kills and restarts went on */
    int ok_outage, failed_outage;    /* requests that overlapped an outage window */
    int ok_outside, failed_outside;  /* the others: every one must succeed */
    int parity_bad;                  /* successes whose text differs from the reference's (must be 0) */
    int nvictims;                    /* events of the schedule, in the order they ran */
    char victim[PDL_RUN_CHAOS_VICTIMS][48];    /* "decode-0", "prefill-0" */
    pdl_run_chaos_action_t action[PDL_RUN_CHAOS_VICTIMS];
    double pause_s[PDL_RUN_CHAOS_VICTIMS];     /* PAUSE: SIGSTOP -> SIGCONT as scheduled; KILL: 0 */
    int ok_event[PDL_RUN_CHAOS_VICTIMS];       /* requests whose outage overlap is this event's (the first */
    int failed_event[PDL_RUN_CHAOS_VICTIMS];   /* event's when two overlap), ok and failed */
    bool recovered[PDL_RUN_CHAOS_VICTIMS];     /* a request succeeded through the node again */
    double restart_s[PDL_RUN_CHAOS_VICTIMS];   /* kill or stop -> /health 200 again; -1 if never */
    double recover_s[PDL_RUN_CHAOS_VICTIMS];   /* kill or stop -> first success through it; -1 if never */
    uint64_t mismatched_killed;      /* mismatched bytes the victims had counted before their kill */
    /* Transfers reaped (pdlink_expired_total) during the chaos phase, the killed victims' included: behind
     * a router that sends no failed releases for a failed decode leg (vllm-router), the hold of a request
     * that failed in an outage waits for defer_timeout. excused_expired says whether they are (run.c). */
    uint64_t expired;
    bool excused_expired;
    char healthy[128];               /* "host:port" of the prefill not killed; "" with one prefill */
    pdl_run_chaos_lat_t healthy_lat[PDL_RUN_CHAOS_PHASES];
} pdl_run_chaos_result_t;

/* p99(during) / p99(before) of the healthy prefill, or -1 when either phase has too few successes. */
double pdl_run_chaos_p99_ratio(const pdl_run_chaos_result_t *ch);

/* What one topology's run produced. All byte counts are summed over instances and TP ranks. */
typedef struct pdl_run_result {
    pdl_run_topo_t topo;
    bool ran;                        /* the workload was started */
    int requests, ok, failed;
    int parity_ok;                   /* responses equal to the reference node's */
    int streaming;                   /* how many of the requests streamed */
    uint64_t kv_bytes;               /* pdlink_kv_bytes_total on decode instances */
    uint64_t verified, mismatched;   /* pdlink_kv_bytes_verified/mismatched_total */
    uint64_t descriptors;            /* pdlink_descriptors_total on decode instances */
    uint64_t releases_sent;          /* by decode ranks */
    uint64_t releases_received;      /* by prefill ranks */
    uint64_t releases_expected;      /* max(P, D) per successful request */
    uint64_t expired;                /* pdlink_expired_total, all instances */
    uint64_t held_blocks;            /* pdlink_held_blocks at the end, all instances */
    uint64_t node_failed_requests;   /* pdlink_requests_total{status="failed"} */
    uint64_t pulls;                  /* pdlink_transfer_seconds_count on decode instances */
    double pull_seconds;             /* pdlink_transfer_seconds_sum on decode instances (overlapping pulls
                                      * each count their whole wall time: not a rate's denominator) */
    double pull_p50_ms, pull_p99_ms; /* per-pull latency, estimated from the histogram buckets; -1 if none */
    double busy_seconds;             /* pdlink_transfer_busy_seconds_total, summed over decode instances */
    double read_seconds;             /* pdlink_read_seconds_total on decode ranks (engine time) */
    double read_gbps;                /* kv_bytes / read_seconds / 1e9: one rank's engine rate; -1 if none */
    double ttft_p50_ms, ttft_p99_ms; /* through the router; -1 when no request succeeded */
    double ttft_added_p50_ms, ttft_added_p99_ms; /* per request: TTFT here minus the single-node
                                      * reference's for the same prompt; -1 when none pair up */
    double ttft_seconds, request_seconds; /* sums over the successful requests (first byte, whole) */
    uint64_t prewarm_handshakes;     /* decode: peers connected ahead of need (pdlink_prewarm_handshakes_total) */
    uint64_t transfer_handshakes;    /* decode: handshakes a pull waited for (pdlink_transfer_handshakes_total) */
    double gbps;                     /* kv_bytes / busy_seconds / 1e9: a decode instance's rate while it
                                      * pulls; -1 when nothing moved */
    double ceiling_gbps;             /* same-run ceiling with the threads of one decode instance's pull path
                                      * (one per rank); <= 0 when unknown */
    int ceiling_threads;             /* those threads: the decode TP size */
    double rank_ceiling_gbps;        /* same-run one-thread ceiling, for the per-rank engine rate */
    /* The rows "of ceiling": the workload ran in rounds, each right after its own ceiling measurement
     * (one per round with a decode instance's threads, one with 1 thread): alternating pairs. */
    pdl_run_ratio_t inst_ratio;      /* a round's transfer GB/s over the T-thread ceiling */
    pdl_run_ratio_t rank_ratio;      /* a round's engine read GB/s/rank over the 1-thread ceiling */
    bool metrics_ok;                 /* every contract metric was present on every node */
    pdl_run_chaos_result_t chaos;    /* --chaos only (chaos.on) */
    bool pass;
    int nnotes;
    char notes[PDL_RUN_MAX_NOTES][400]; /* failures and remarks, in order of discovery */
} pdl_run_result_t;

/* Append a note (printf-style); silently drops notes past PDL_RUN_MAX_NOTES. */
void pdl_run_result_note(pdl_run_result_t *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --chaos: how many transfers reaped during the chaos phase the outages excuse: 0 unless
 * chaos.excused_expired, else one per rank of the largest prefill for each request failed in an outage. */
uint64_t pdl_run_chaos_expired_bound(const pdl_run_result_t *r);

/* Apply the verdict rules: any failed request, differing response, mismatched byte, expired
 * transfer or held block, a missing metric, KV that did not move or was not verified, or a failure
 * flagged by the caller (a dead process, a start-up error) fails the topology. With chaos.on
 * the figures above are the final batch's, and also fatal are: a request that failed outside the
 * outage windows, a success that differs from the reference, a victim that never served again, a byte a
 * victim had mismatched before its kill, a transfer reaped during the chaos phase unless excused_expired
 * (then more of them than requests failed in the outages, times the largest prefill TP, still fails). */
void pdl_run_result_judge(pdl_run_result_t *r, bool had_failure_note);

/* Settings shown in the report header and the JSON. */
typedef struct pdl_run_report_info {
    const char *model;
    const char *backend;
    const char *mode;
    int requests, concurrency, prompt_min, prompt_max, max_tokens;
    int ceiling_threads;             /* 1: the per-rank ceiling */
    const char *ceiling_kind;        /* "memcpy" or "tcp stream" */
    double ceiling_gbps;
    int ninst_ceilings;              /* ceilings with the threads of a decode instance, one per decode TP */
    int inst_ceiling_threads[8];
    double inst_ceiling_gbps[8];
    double elapsed_s;
    const char *log_dir;             /* NULL when removed */
} pdl_run_report_info_t;

void pdl_run_report_print(FILE *out, const pdl_run_report_info_t *info, const pdl_run_result_t *rs, int n);

/* The verdict line alone ("PASS: 5/5 topologies ..."). */
void pdl_run_report_verdict(FILE *out, const pdl_run_result_t *rs, int n);

/* The whole report as a JSON object (new reference). */
json_t *pdl_run_report_json(const pdl_run_report_info_t *info, const pdl_run_result_t *rs, int n);

#endif
