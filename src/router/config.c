/*
 * config.c -- parse pdlink-router's command line (vllm-router's flag names, router-spec §6).
 *
 * Both "--flag value" and "--flag=value" are accepted, as clap (vllm-router's parser) accepts both.
 * --policy sets the default of --prefill-policy and --decode-policy whatever the order of the flags,
 * as in vllm-router. MoRIIO without a discovery address is refused, as vllm-router's config validation
 * refuses it (router-spec §3.5).
 */
#include "router/config.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdlink/log.h"

void pdl_router_config_init(pdl_router_config_t *c)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->host, sizeof(c->host), "127.0.0.1");
    c->port = 30000;
    snprintf(c->kv_connector, sizeof(c->kv_connector), "moriio");
    c->prefill_policy = PDL_POLICY_CONSISTENT_HASH;
    c->decode_policy = PDL_POLICY_CONSISTENT_HASH;
    c->log_level = -1;
    c->prometheus_port = -1;
    snprintf(c->prometheus_host, sizeof(c->prometheus_host), "127.0.0.1");
    c->worker_ttl_ms = 5000;
    c->intra_node_dp_size = 1;
}

const char *pdl_policy_kind_name(pdl_policy_kind_t k)
{
    switch (k) {
    case PDL_POLICY_CONSISTENT_HASH: return "consistent_hash";
    case PDL_POLICY_ROUND_ROBIN: return "round_robin";
    case PDL_POLICY_RANDOM: return "random";
    }
    return "unknown";
}

const char *pdl_router_usage(void)
{
    return "usage: pdlink-router --vllm-pd-disaggregation --kv-connector moriio\n"
           "                     --vllm-discovery-address HOST:PORT [options]\n"
           "\n"
           "A prefill/decode router speaking vllm-router's MoRIIO mode: instances register over ZeroMQ on\n"
           "the discovery address; completions are sent to a prefill and then (READ) or at the same time\n"
           "(WRITE) to a decode instance, and the decode's response is streamed back.\n"
           "\n"
           "options:\n"
           "  --host HOST                     HTTP listen address (default 127.0.0.1)\n"
           "  --port PORT                     HTTP listen port (default 30000)\n"
           "  --vllm-pd-disaggregation        prefill/decode mode (required)\n"
           "  --kv-connector moriio           KV connector of the instances (only moriio)\n"
           "  --vllm-discovery-address H:P    ZeroMQ ROUTER address instances register to (required)\n"
           "  --policy P                      consistent_hash | round_robin | random (default consistent_hash)\n"
           "  --prefill-policy P              policy for prefill instances (default: --policy)\n"
           "  --decode-policy P               policy for decode instances (default: --policy)\n"
           "  --intra-node-data-parallel-size N  remote_dp_size sent in READ mode (default 1)\n"
           "  --log-level L                   error | warn | info | debug | trace (default info)\n"
           "  --prometheus-host HOST          metrics listener address (default 127.0.0.1)\n"
           "  --prometheus-port PORT          separate metrics listener; /metrics is also on --port\n"
           "  -h, --help                      show this text\n"
           "\n"
           "endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,\n"
           "           GET /readiness, GET /liveness, GET /metrics, GET /workers (JSON), GET /list_workers\n";
}

static pdl_status_t parse_int(const char *flag, const char *v, long lo, long hi, long *out, pdl_error_t *err)
{
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: '%s' is not an integer in [%ld, %ld]", flag, v, lo, hi);
    *out = x;
    return PDL_OK;
}

static pdl_status_t parse_policy(const char *flag, const char *v, pdl_policy_kind_t *out, pdl_error_t *err)
{
    if (strcmp(v, "consistent_hash") == 0)
        *out = PDL_POLICY_CONSISTENT_HASH;
    else if (strcmp(v, "round_robin") == 0)
        *out = PDL_POLICY_ROUND_ROBIN;
    else if (strcmp(v, "random") == 0)
        *out = PDL_POLICY_RANDOM;
    else
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "%s: unknown policy '%s' (expected consistent_hash, round_robin or random)", flag, v);
    return PDL_OK;
}

static pdl_status_t copy_str(const char *flag, const char *v, char *dst, size_t cap, pdl_error_t *err)
{
    size_t n = strlen(v);
    if (n == 0 || n >= cap)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: value of length %zu is empty or too long", flag, n);
    memcpy(dst, v, n + 1);
    return PDL_OK;
}

/* "host:port", "[v6]:port" or "v6::addr:port": the port follows the last ':'. */
static pdl_status_t parse_hostport(const char *flag, const char *v, char *host, size_t cap, int *port,
                                   pdl_error_t *err)
{
    const char *colon = strrchr(v, ':');
    if (colon == NULL || colon == v)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: '%s' is not HOST:PORT", flag, v);
    const char *h = v;
    size_t hl = (size_t)(colon - v);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl >= cap)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: host of '%s' is empty or too long", flag, v);
    long p = 0;
    pdl_status_t st = parse_int(flag, colon + 1, 0, 65535, &p, err);
    if (st != PDL_OK)
        return st;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    return PDL_OK;
}

pdl_status_t pdl_router_config_parse(pdl_router_config_t *c, int argc, char **argv, pdl_error_t *err)
{
    bool have_policy = false, have_pp = false, have_dp = false;
    pdl_policy_kind_t policy = PDL_POLICY_CONSISTENT_HASH;
    pdl_status_t st = PDL_OK;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            c->help = true;
            return PDL_OK;
        }
        if (strncmp(arg, "--", 2) != 0)
            return pdl_error_set(err, PDL_ERR_INVALID, "unexpected argument '%s'", arg);
        char name[64];
        const char *eq = strchr(arg, '=');
        size_t nl = eq ? (size_t)(eq - arg) : strlen(arg);
        if (nl >= sizeof(name))
            return pdl_error_set(err, PDL_ERR_INVALID, "unknown flag '%s'", arg);
        memcpy(name, arg, nl);
        name[nl] = '\0';

        if (strcmp(name, "--vllm-pd-disaggregation") == 0) {
            if (eq)
                return pdl_error_set(err, PDL_ERR_INVALID, "%s takes no value", name);
            c->pd_disaggregation = true;
            continue;
        }
        static const char *const valued[] = {
            "--host", "--port", "--kv-connector", "--vllm-discovery-address", "--policy", "--prefill-policy",
            "--decode-policy", "--log-level", "--prometheus-port", "--prometheus-host", "--worker-ttl-ms",
            "--port-file", "--intra-node-data-parallel-size", NULL};
        bool known = false;
        for (int k = 0; valued[k]; k++)
            known = known || strcmp(name, valued[k]) == 0;
        if (!known)
            return pdl_error_set(err, PDL_ERR_INVALID, "unknown flag '%s' (see --help)", name);
        const char *v;
        if (eq) {
            v = eq + 1;
        } else {
            if (i + 1 >= argc)
                return pdl_error_set(err, PDL_ERR_INVALID, "%s needs a value", name);
            v = argv[++i];
        }
        long x = 0;
        if (strcmp(name, "--host") == 0) {
            st = copy_str(name, v, c->host, sizeof(c->host), err);
        } else if (strcmp(name, "--port") == 0) {
            if ((st = parse_int(name, v, 0, 65535, &x, err)) == PDL_OK)
                c->port = (int)x;
        } else if (strcmp(name, "--kv-connector") == 0) {
            if (strcmp(v, "moriio") != 0)
                return pdl_error_set(err, PDL_ERR_INVALID,
                                     "--kv-connector: '%s' is not supported (pdlink-router implements moriio)", v);
            st = copy_str(name, v, c->kv_connector, sizeof(c->kv_connector), err);
        } else if (strcmp(name, "--vllm-discovery-address") == 0) {
            st = parse_hostport(name, v, c->discovery_host, sizeof(c->discovery_host), &c->discovery_port, err);
            c->has_discovery = st == PDL_OK;
        } else if (strcmp(name, "--policy") == 0) {
            st = parse_policy(name, v, &policy, err);
            have_policy = true;
        } else if (strcmp(name, "--prefill-policy") == 0) {
            st = parse_policy(name, v, &c->prefill_policy, err);
            have_pp = true;
        } else if (strcmp(name, "--decode-policy") == 0) {
            st = parse_policy(name, v, &c->decode_policy, err);
            have_dp = true;
        } else if (strcmp(name, "--log-level") == 0) {
            c->log_level = pdl_log_level_parse(v);
            if (c->log_level < 0)
                return pdl_error_set(err, PDL_ERR_INVALID,
                                     "--log-level: unknown level '%s' (error, warn, info, debug, trace)", v);
        } else if (strcmp(name, "--prometheus-port") == 0) {
            if ((st = parse_int(name, v, 0, 65535, &x, err)) == PDL_OK)
                c->prometheus_port = (int)x;
        } else if (strcmp(name, "--prometheus-host") == 0) {
            st = copy_str(name, v, c->prometheus_host, sizeof(c->prometheus_host), err);
        } else if (strcmp(name, "--worker-ttl-ms") == 0) {
            if ((st = parse_int(name, v, 1, 3600000, &x, err)) == PDL_OK)
                c->worker_ttl_ms = (uint32_t)x;
        } else if (strcmp(name, "--port-file") == 0) {
            st = copy_str(name, v, c->port_file, sizeof(c->port_file), err);
        } else if (strcmp(name, "--intra-node-data-parallel-size") == 0) {
            if ((st = parse_int(name, v, 1, 1024, &x, err)) == PDL_OK)
                c->intra_node_dp_size = (int)x;
        }
        if (st != PDL_OK)
            return st;
    }
    if (have_policy) {
        if (!have_pp)
            c->prefill_policy = policy;
        if (!have_dp)
            c->decode_policy = policy;
    }
    if (!c->pd_disaggregation)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "--vllm-pd-disaggregation is required (pdlink-router only implements P/D mode)");
    if (!c->has_discovery)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "--vllm-discovery-address HOST:PORT is required with --kv-connector moriio");
    return PDL_OK;
}
