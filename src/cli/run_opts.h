/*
 * run_opts.h -- the options of `pdlink run`: what the command line chose, checked and completed
 * (topologies, the chaos schedule, the backend --netns implies). The flags are rows of one table in
 * run_opts.c, which also prints --help; docs/run.md#options documents each.
 */
#ifndef PDL_CLI_RUN_OPTS_H
#define PDL_CLI_RUN_OPTS_H

#include <stdbool.h>

#include "cli/run_chaos.h"
#include "cli/run_report.h"

enum { PDL_RUN_MAX_TOPOS = 16 };

typedef struct pdl_run_opts {
    pdl_run_topo_t topos[PDL_RUN_MAX_TOPOS]; /* --topology, then the custom one; the seed's when none */
    int ntopos;
    int ptp[PDL_RUN_MAX_INST], np;           /* --prefill-tp: a custom topology */
    int dtp[PDL_RUN_MAX_INST], nd;           /* --decode-tp */
    const char *model;
    int requests, concurrency, prompt_min, prompt_max, max_tokens;
    const char *backend;                     /* "shm" | "tcp" | "ucx" */
    const char *mode;                        /* "read" | "write" */
    int backend_i, mode_i;                   /* the table's choices; backend_i -1: not given */
    bool netns, keep, quiet;
    const char *json_path;
    const char *log_dir;
    int reference_tp;
    int fault_kill_decode_after;             /* hidden --fault kill-decode-after=N; -1 = none */
    const char *child_log_level;             /* --child-log-level: the nodes' and the router's --log-level */
    const char *router;                      /* --router: NULL (pdlink-router), "vllm-router" or a path */
    bool no_prewarm;                         /* --no-prewarm: peers are learnt from requests only */
    bool chaos;                              /* --chaos: the chaos schedule's kills and pauses (run_chaos.h) */
    const char *chaos_schedule;              /* --chaos-schedule, parsed into chaos_ev */
    int chaos_pause_min_s, chaos_pause_max_s;
    pdl_run_chaos_event_t chaos_ev[PDL_RUN_CHAOS_VICTIMS];
    int chaos_nev;
} pdl_run_opts_t;

/* Parse argv (argv[0] is "run") into *o. Returns 0 to run, 1 after --help (exit 0), -1 after a usage
 * error, printed on stderr with the flag and the value. */
int pdl_run_opts_parse(pdl_run_opts_t *o, int argc, char **argv);

#endif /* PDL_CLI_RUN_OPTS_H */
