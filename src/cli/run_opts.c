/*
 * run_opts.c -- the options of `pdlink run` (run_opts.h): one table row per flag, parsed and printed by
 * app/optab.c, then the checks that span flags (a custom topology both sides give, --chaos's schedule,
 * --netns's backend).
 */
#include "cli/run_opts.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "app/optab.h"
#include "app/parse.h"
#include "common/log.h"
#include "pdlink/topo.h"

/* The seed topologies: the deployments pdlink run exercises by default (README.md). */
static const pdl_run_topo_t seed_topos[] = {
    {"1p1d", 1, 1, {8}, {8}},
    {"2p1d", 2, 1, {4, 4}, {8}},
    {"1p2d", 1, 2, {8}, {4, 4}},
    {"p4d8", 1, 1, {4}, {8}},
    {"p8d4", 1, 1, {8}, {4}},
};
#define N_SEED_TOPOS ((int)(sizeof(seed_topos) / sizeof(seed_topos[0])))

static const char *const run_backends[] = {"shm", "tcp", "ucx", NULL};
static const char *const run_modes[] = {"read", "write", NULL};

static pdl_status_t set_topology(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                 pdl_error_t *err)
{
    (void)row, (void)flag, (void)done_p;
    pdl_run_opts_t *o = opts;
    int k = 0;
    while (k < N_SEED_TOPOS && strcasecmp(v, seed_topos[k].name) != 0)
        k++;
    if (k == N_SEED_TOPOS)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "unknown topology '%s' (1p1d, 2p1d, 1p2d, p4d8, p8d4, or --prefill-tp/--decode-tp)", v);
    if (o->ntopos >= PDL_RUN_MAX_TOPOS)
        return pdl_error_set(err, PDL_ERR_INVALID, "at most %d topologies", PDL_RUN_MAX_TOPOS);
    o->topos[o->ntopos++] = seed_topos[k];
    return PDL_OK;
}

static pdl_status_t set_child_log_level(void *opts, const pdl_optdef_t *row, const char *flag, const char *v,
                                        bool *done_p, pdl_error_t *err)
{
    (void)row, (void)done_p;
    if (pdl_log_level_parse(v) < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected error, warn, info, debug or trace", flag, v);
    ((pdl_run_opts_t *)opts)->child_log_level = v;
    return PDL_OK;
}

static pdl_status_t set_fault(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                              pdl_error_t *err)
{
    (void)row, (void)done_p;
    if (strncmp(v, "kill-decode-after=", 18) != 0 ||
        pdl_parse_int(flag, v + 18, 0, 1000000, &((pdl_run_opts_t *)opts)->fault_kill_decode_after, NULL) != PDL_OK)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected kill-decode-after=N", flag, v);
    return PDL_OK;
}

#define RO(field) offsetof(pdl_run_opts_t, field)
static const pdl_optdef_t run_rows[] = {
    {.kind = PDL_OPT_SECTION, .help = "topologies (default: all five seed topologies):"},
    {.name = "topology", .kind = PDL_OPT_CALL, .metavar = "NAME", .set = set_topology,
     .help = "1p1d (TP8->TP8), 2p1d (TP4+TP4->TP8), 1p2d (TP8->TP4+TP4), p4d8 (TP4->TP8), p8d4 (TP8->TP4); "
             "repeatable"},
    {.name = "prefill-tp", .kind = PDL_OPT_INT_LIST, .metavar = "LIST", .off = RO(ptp), .off2 = RO(np), .lo = 1,
     .hi = 64, .max_n = PDL_RUN_MAX_INST, .help = "a custom topology, e.g. --prefill-tp 4,4 --decode-tp 8"},
    {.name = "decode-tp", .kind = PDL_OPT_INT_LIST, .metavar = "LIST", .off = RO(dtp), .off2 = RO(nd), .lo = 1,
     .hi = 64, .max_n = PDL_RUN_MAX_INST, .help = "the decode side of that topology"},
    {.kind = PDL_OPT_SECTION, .help = "workload:"},
    {.name = "model", .kind = PDL_OPT_STRING, .metavar = "PRESET", .def = "llama-3.1-8b", .off = RO(model),
     .help = "model preset of the nodes"},
    {.name = "requests", .kind = PDL_OPT_INT, .metavar = "N", .def = "48", .off = RO(requests), .lo = 1, .hi = 100000,
     .help = "requests per topology; every 4th streams"},
    {.name = "concurrency", .kind = PDL_OPT_INT, .metavar = "C", .def = "8", .off = RO(concurrency), .lo = 1,
     .hi = 1024, .help = "requests in flight"},
    {.name = "prompt-tokens", .kind = PDL_OPT_RANGE, .metavar = "MIN-MAX", .def = "16-256", .off = RO(prompt_min),
     .off2 = RO(prompt_max), .lo = 1, .hi = 1000000, .help = "prompt lengths"},
    {.name = "max-tokens", .kind = PDL_OPT_INT, .metavar = "N", .def = "16", .off = RO(max_tokens), .lo = 1,
     .hi = 100000, .help = "tokens generated per request"},
    {.kind = PDL_OPT_SECTION, .help = "transfer:"},
    {.name = "backend", .kind = PDL_OPT_CHOICE, .metavar = "shm|tcp|ucx", .off = RO(backend_i), .choices = run_backends,
     .help = "transfer backend of the nodes (default shm, tcp with --netns; ucx honours UCX_TLS)"},
    {.name = "mode", .kind = PDL_OPT_CHOICE, .metavar = "read|write", .def = "read", .off = RO(mode_i),
     .choices = run_modes, .help = "MoRIIO mode"},
    {.name = "netns", .kind = PDL_OPT_FLAG, .off = RO(netns),
     .help = "each instance in its own network namespace over veth (tcp backend; needs root)"},
    {.kind = PDL_OPT_SECTION, .help = "output and control:"},
    {.name = "json", .kind = PDL_OPT_STRING, .metavar = "FILE", .off = RO(json_path),
     .help = "write the whole report as JSON"},
    {.name = "log-dir", .kind = PDL_OPT_STRING, .metavar = "DIR", .off = RO(log_dir),
     .help = "keep the children's logs in DIR (default: a temporary directory, removed on success, kept and "
             "printed on failure)"},
    {.name = "keep", .kind = PDL_OPT_FLAG, .off = RO(keep),
     .help = "run the first topology, then leave its cluster up and print the router URL and a curl command; "
             "Ctrl-C stops it"},
    {.name = "quiet", .kind = PDL_OPT_FLAG, .off = RO(quiet), .help = "no progress display on stderr"},
    {.name = "child-log-level", .kind = PDL_OPT_CALL, .metavar = "L", .def = "info", .set = set_child_log_level,
     .help = "--log-level of the nodes and the router (debug logs where each pull and request spends its time, "
             "see --log-dir)"},
    {.name = "no-prewarm", .kind = PDL_OPT_FLAG, .off = RO(no_prewarm),
     .help = "decodes (WRITE: prefills) are not told their peers: each learns them from its first request, which "
             "pays the handshake and the mapping"},
    {.name = "router", .kind = PDL_OPT_STRING, .metavar = "R", .off = RO(router),
     .help = "the router: pdlink (default, pdlink-router), vllm-router (the real one from the project venv or "
             "$PATH, with the seed's flags and consistent_hash), or the path of a router executable"},
    {.name = "chaos", .kind = PDL_OPT_FLAG, .off = RO(chaos),
     .help = "per topology, while the workload runs, the chaos schedule: kill -9 a node and restart it on its "
             "ports, or stop it (SIGSTOP) and continue it (SIGCONT), each time waiting for a success through it; "
             "then the workload once more, which must all pass. Reports requests failed during and outside the "
             "outages and the time to recover; not with --keep or --netns"},
    {.name = "chaos-schedule", .kind = PDL_OPT_STRING, .metavar = "LIST", .def = PDL_RUN_CHAOS_SCHEDULE_DEFAULT,
     .off = RO(chaos_schedule),
     .help = "the events of --chaos, in order, from kill-decode, kill-prefill, pause-decode, pause-prefill "
             "(decode-0 / prefill-0)"},
    /* Longer than the nodes' consumer_gone_timeout (5 s), and below the shortened defer_timeout of --chaos
     * behind vllm-router (RUN_CHAOS_DEFER_TIMEOUT_S, run_ctx.h), so a paused decode keeps its holds. */
    {.name = "chaos-pause", .kind = PDL_OPT_RANGE, .metavar = "MIN-MAX", .def = "6-8", .off = RO(chaos_pause_min_s),
     .off2 = RO(chaos_pause_max_s), .lo = 1, .hi = 300,
     .help = "seconds a pause lasts, spread over the schedule's pauses (longer than the nodes' "
             "consumer_gone_timeout, 5 s)"},
    /* Hidden: fault injection for tests/integration/test_run_fault.sh, and the reference's TP. */
    {.name = "fault", .kind = PDL_OPT_CALL, .metavar = "kill-decode-after=N", .set = set_fault,
     .flags = PDL_OPTF_HIDDEN, .help = "kill a decode after N requests"},
    {.name = "reference-tp", .kind = PDL_OPT_INT, .metavar = "N", .def = "2", .off = RO(reference_tp), .lo = 1,
     .hi = 64, .flags = PDL_OPTF_HIDDEN, .help = "TP of the single-node reference"},
    {.name = "help", .alias = 'h', .kind = PDL_OPT_HELP, .help = "this text"},
    {0},
};
#undef RO

static const pdl_optab_t run_table = {
    .prog = "pdlink run",
    .usage = "usage: pdlink run [OPTIONS]\n"
             "\n"
             "Start a pdlink-router and pdlink-node processes on this machine for each topology, send a fixed\n"
             "workload through the router, compare every response with a single non-disaggregated node's,\n"
             "account for every KV byte from the nodes' /metrics, and print one report. Exit status: 0 all\n"
             "passed, 1 a check failed (response differs, byte mismatched, transfer expired, block held,\n"
             "request failed, process died), 2 usage or set-up error.\n"
             "\n",
    .rows = run_rows,
};

/* --prefill-tp with --decode-tp: one more topology, refused now if the topology rules reject a pairing
 * (docs/topology.md#compatible-sizes) rather than as failed requests later. */
static pdl_status_t add_custom_topology(pdl_run_opts_t *o, pdl_error_t *err)
{
    if ((o->np > 0) != (o->nd > 0))
        return pdl_error_set(err, PDL_ERR_INVALID, "--prefill-tp and --decode-tp go together");
    if (o->np == 0)
        return PDL_OK;
    pdl_run_topo_t t;
    memset(&t, 0, sizeof(t));
    snprintf(t.name, sizeof(t.name), "custom");
    t.np = o->np;
    t.nd = o->nd;
    memcpy(t.ptp, o->ptp, sizeof(t.ptp));
    memcpy(t.dtp, o->dtp, sizeof(t.dtp));
    for (int i = 0; i < t.np; i++)
        for (int k = 0; k < t.nd; k++) {
            pdl_error_t e;
            pdl_error_clear(&e);
            int rr = 0;
            if (pdl_topo_map_rank(0, t.dtp[k], t.ptp[i], &rr, &e) != PDL_OK ||
                pdl_topo_map_rank(0, t.ptp[i], t.dtp[k], &rr, &e) != PDL_OK)
                return pdl_error_set(err, PDL_ERR_INVALID, "prefill TP%d with decode TP%d: %s", t.ptp[i], t.dtp[k],
                                     e.msg);
        }
    if (o->ntopos >= PDL_RUN_MAX_TOPOS)
        return pdl_error_set(err, PDL_ERR_INVALID, "at most %d topologies", PDL_RUN_MAX_TOPOS);
    o->topos[o->ntopos++] = t;
    return PDL_OK;
}

/* The checks between flags, and what they imply. */
static pdl_status_t complete(pdl_run_opts_t *o, pdl_error_t *err)
{
    if (add_custom_topology(o, err) != PDL_OK)
        return PDL_ERR_INVALID;
    if (o->ntopos == 0) {
        memcpy(o->topos, seed_topos, sizeof(seed_topos));
        o->ntopos = N_SEED_TOPOS;
    }
    /* The chaos phase restarts a node in the root namespace, and --keep would leave a cluster whose
     * victims' state the report no longer describes. */
    if (o->chaos && (o->keep || o->netns))
        return pdl_error_set(err, PDL_ERR_INVALID, "--chaos works without --keep and --netns");
    if (o->chaos) {
        o->chaos_nev = pdl_run_chaos_schedule_parse(o->chaos_schedule, o->chaos_pause_min_s * 1000,
                                                    o->chaos_pause_max_s * 1000, o->chaos_ev, PDL_RUN_CHAOS_VICTIMS,
                                                    err);
        if (o->chaos_nev < 0)
            return PDL_ERR_INVALID;
    }
    if (o->netns && o->backend_i >= 0 && strcmp(run_backends[o->backend_i], "tcp") != 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "--netns needs --backend tcp (shm cannot cross hosts)");
    o->backend = o->backend_i >= 0 ? run_backends[o->backend_i] : o->netns ? "tcp" : "shm";
    o->mode = run_modes[o->mode_i];
    return PDL_OK;
}

int pdl_run_opts_parse(pdl_run_opts_t *o, int argc, char **argv)
{
    memset(o, 0, sizeof(*o));
    o->backend_i = -1;
    o->fault_kill_decode_after = -1;
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_optab_result_t r = pdl_optab_parse(&run_table, o, argc, argv, NULL, &err);
    if (r == PDL_OPTAB_DONE)
        return 1;
    if (r == PDL_OPTAB_GO && complete(o, &err) == PDL_OK)
        return 0;
    fprintf(stderr, "pdlink run: %s\n", err.msg);
    return -1;
}
