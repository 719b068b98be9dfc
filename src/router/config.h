/*
 * config.h -- pdlink-router's command line, modelled on vllm-router's flags (docs/vllm-router.md#flags,
 * docs/router.md#flags), parsed and printed by one option table (app/optab.h).
 *
 * The parser fills a pdl_router_config_t and never exits: a usage error comes back as PDL_ERR_INVALID
 * with a message naming the flag and the value, and main() turns it into exit status 2.
 */
#ifndef PDL_ROUTER_CONFIG_H
#define PDL_ROUTER_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "app/http.h"
#include "pdlink/status.h"
#include "router/upstream.h"

typedef enum pdl_policy_kind {
    PDL_POLICY_CONSISTENT_HASH = 0,
    PDL_POLICY_ROUND_ROBIN = 1,
    PDL_POLICY_RANDOM = 2,
} pdl_policy_kind_t;

typedef struct pdl_router_config {
    char host[256];
    int port;                      /* 0 = ephemeral (tests), read back with --port-file */
    bool pd_disaggregation;
    char kv_connector[32];         /* "moriio" (the only one implemented) */
    char discovery_host[256];
    int discovery_port;            /* 0 = ephemeral */
    bool has_discovery;
    pdl_policy_kind_t prefill_policy;
    pdl_policy_kind_t decode_policy;
    int log_level;                 /* pdl_log_level_t, -1 = leave as is */
    int prometheus_port;           /* -1 = no separate listener; 0 = ephemeral */
    char prometheus_host[256];
    uint32_t worker_ttl_ms;        /* hidden: registration TTL, default 5000 (vllm-router's 5 s) */
    char port_file[1024];          /* hidden: write "http=P discovery=P prometheus=P" here once bound */
    int intra_node_dp_size;        /* --intra-node-data-parallel-size, default 1 */
    size_t max_payload_size;       /* --max-payload-size: one request body, default 16 MiB (the nodes' limit) */
    pdl_leg_timeouts_t prefill_timeouts, decode_timeouts; /* --prefill-*-timeout, --decode-*-timeout */
    pdl_http_limits_t http;        /* --http-* and --max-payload-in-flight (http.body_budget) */
    char auth_key_file[1024];      /* --auth-key-file: authenticated mode's cluster key ("" = compatible mode) */
    char api_key[512];             /* --api-key: sent as "Authorization: Bearer <key>" to verified workers only */
    char api_key_hosts[1024];      /* --api-key-hosts: CIDRs of the hosts trusted with it in compatible mode */
    bool help;
} pdl_router_config_t;

/* Defaults, from the option table's rows: host 127.0.0.1, port 30000, consistent_hash policies, TTL 5000 ms,
 * no prometheus port, leg deadlines (seconds; connect, first byte, total) prefill 10/300/600 and decode
 * 10/600/1800. */
void pdl_router_config_init(pdl_router_config_t *c);

/* Parse argv (argv[0] skipped). On PDL_ERR_INVALID err->msg names the offending flag/value. */
pdl_status_t pdl_router_config_parse(pdl_router_config_t *c, int argc, char **argv, pdl_error_t *err);

/* --help, printed from the option table. */
void pdl_router_help(FILE *f);

const char *pdl_policy_kind_name(pdl_policy_kind_t k);

#endif /* PDL_ROUTER_CONFIG_H */
