/*
 * config.c -- parse pdlink-router's command line (vllm-router's flag names, docs/vllm-router.md#flags).
 *
 * Flags are read by getopt_long_only (app/opts.h): "--flag value" and "--flag=value" are accepted, as
 * clap (vllm-router's parser) accepts both.
 * --policy sets the default of --prefill-policy and --decode-policy whatever the order of the flags,
 * as in vllm-router. MoRIIO without a discovery address is refused, as vllm-router's config validation
 * refuses it (docs/vllm-router.md#discovery).
 */
#include "router/config.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/opts.h"
#include "app/parse.h"
#include "common/log.h"

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
    /* Bodies are relayed to both legs; 64 MiB bounds what one client can make the router hold. The
     * in-flight budget bounds all of them: a routed request holds about five copies of its body while
     * its legs are built (parsed, prefill and decode JSON, their texts), so 256 MiB of bodies is about
     * 1.3 GiB at the peak. Clients of a router are many and long-lived (streams), hence 8192
     * connections and 1024 workers (each running request or stream is one). */
    c->max_payload_size = 16u << 20; /* pdlink-node refuses larger bodies: the router need not hold them */
    /* Header and body deadlines bound what a trickling client holds: 60 s for the headers is the idle
     * timeout a keep-alive connection already had; 120 s for a 16 MiB body is 140 kB/s. */
    c->http = (pdl_http_limits_t){.idle_timeout_s = 60, .header_timeout_s = 60, .body_timeout_s = 120,
                                  .max_connections = 8192, .threads = 2, .workers = 1024, .body_budget = 256u << 20};
    /* A prefill leg (max_tokens 1, not streamed) answers at once when its prefill is done, so its first
     * byte is its whole answer: 300 s is a long prompt queued behind others, and a paused or hung prefill
     * fails its clients after that rather than never. A decode's first byte is its headers (a stream) or
     * its whole answer; 1800 s overall is vllm-router's --request-timeout-secs. */
    c->prefill_timeouts = (pdl_leg_timeouts_t){.connect_s = 10, .first_byte_s = 300, .total_s = 600};
    c->decode_timeouts = (pdl_leg_timeouts_t){.connect_s = 10, .first_byte_s = 600, .total_s = 1800};
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
           "  --max-payload-size BYTES        one request body at most (default 16777216 = 16 MiB, pdlink-node's\n"
           "                                  limit; 413 above, refused from Content-Length before the body)\n"
           "  --max-payload-in-flight BYTES   request bodies held at once (default 268435456 = 256 MiB; 503 above)\n"
           "  --auth-key-file PATH            authenticated mode: the cluster key file of the nodes' auth_key_file;\n"
           "                                  the discovery socket then admits only key holders (CURVE)\n"
           "  --api-key KEY                   /v1 routes require Authorization: Bearer KEY (401 without), and it\n"
           "                                  is sent to the nodes the same way (their --api-key)\n"
           "  --http-idle-timeout SECONDS     close a connection silent this long (default 60, 0 = never)\n"
           "  --http-max-connections N        open connections at most (default 8192, lowered to 3/8 of ulimit -n)\n"
           "  --http-max-connections-per-client N  from one IP address (default 3/4 of the above)\n"
           "  --http-threads N                HTTP polling threads (default 2)\n"
           "  --http-workers N                requests and streams handled at once; more wait (default 1024)\n"
           "  --http-header-timeout SECONDS   a request's headers must arrive within this of the connection's\n"
           "                                  open or its previous response, however slowly (default 60, 0 = never)\n"
           "  --http-body-timeout SECONDS     a request's body must arrive within this of its headers\n"
           "                                  (default 120, 0 = never)\n"
           "  --prefill-connect-timeout S     deadlines of a prefill leg (0 = none): connect (default 10),\n"
           "  --prefill-first-byte-timeout S  first response byte (default 300; the prefill's whole answer),\n"
           "  --prefill-timeout S             whole exchange (default 600). Past one: 504, the prefill released\n"
           "  --decode-connect-timeout S      deadlines of a decode leg: connect (default 10), first response\n"
           "  --decode-first-byte-timeout S   byte (default 600), whole exchange including the stream\n"
           "  --decode-timeout S              (default 1800, vllm-router's --request-timeout-secs)\n"
           "  -h, --help                      show this text\n"
           "\n"
           "endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,\n"
           "           GET /readiness, GET /liveness, GET /metrics, GET /workers (JSON), GET /list_workers\n";
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
    pdl_status_t st = pdl_parse_int(flag, colon + 1, 0, 65535, port, err);
    if (st != PDL_OK)
        return st;
    memcpy(host, h, hl);
    host[hl] = '\0';
    return PDL_OK;
}

enum {
    OPT_HELP = 256, OPT_PD, OPT_HOST, OPT_PORT, OPT_KV_CONNECTOR, OPT_DISCOVERY, OPT_POLICY, OPT_PREFILL_POLICY,
    OPT_DECODE_POLICY, OPT_LOG_LEVEL, OPT_PROM_PORT, OPT_PROM_HOST, OPT_WORKER_TTL, OPT_PORT_FILE, OPT_DP_SIZE,
    OPT_MAX_PAYLOAD, OPT_MAX_PAYLOAD_IN_FLIGHT, OPT_AUTH_KEY_FILE, OPT_API_KEY,
    OPT_LEG_TIMEOUT, /* the first of k_leg_timeouts' entries; one value each */
};

/* The leg deadline flags, in the order of their OPT_LEG_TIMEOUT + i in router_options: the field of the
 * config each sets (seconds, 0 = none). */
static const size_t k_leg_timeouts[] = {
    offsetof(pdl_router_config_t, prefill_timeouts.connect_s),  offsetof(pdl_router_config_t, prefill_timeouts.first_byte_s),
    offsetof(pdl_router_config_t, prefill_timeouts.total_s),    offsetof(pdl_router_config_t, decode_timeouts.connect_s),
    offsetof(pdl_router_config_t, decode_timeouts.first_byte_s), offsetof(pdl_router_config_t, decode_timeouts.total_s),
};
#define N_LEG_TIMEOUTS (sizeof(k_leg_timeouts) / sizeof(k_leg_timeouts[0]))

static const struct option router_options[] = {
    {"help", no_argument, NULL, OPT_HELP},
    {"h", no_argument, NULL, OPT_HELP},
    {"vllm-pd-disaggregation", no_argument, NULL, OPT_PD},
    {"host", required_argument, NULL, OPT_HOST},
    {"port", required_argument, NULL, OPT_PORT},
    {"kv-connector", required_argument, NULL, OPT_KV_CONNECTOR},
    {"vllm-discovery-address", required_argument, NULL, OPT_DISCOVERY},
    {"policy", required_argument, NULL, OPT_POLICY},
    {"prefill-policy", required_argument, NULL, OPT_PREFILL_POLICY},
    {"decode-policy", required_argument, NULL, OPT_DECODE_POLICY},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"prometheus-port", required_argument, NULL, OPT_PROM_PORT},
    {"prometheus-host", required_argument, NULL, OPT_PROM_HOST},
    {"worker-ttl-ms", required_argument, NULL, OPT_WORKER_TTL},
    {"port-file", required_argument, NULL, OPT_PORT_FILE},
    {"intra-node-data-parallel-size", required_argument, NULL, OPT_DP_SIZE},
    {"max-payload-size", required_argument, NULL, OPT_MAX_PAYLOAD},
    {"max-payload-in-flight", required_argument, NULL, OPT_MAX_PAYLOAD_IN_FLIGHT},
    {"auth-key-file", required_argument, NULL, OPT_AUTH_KEY_FILE},
    {"api-key", required_argument, NULL, OPT_API_KEY},
    {"prefill-connect-timeout", required_argument, NULL, OPT_LEG_TIMEOUT + 0},
    {"prefill-first-byte-timeout", required_argument, NULL, OPT_LEG_TIMEOUT + 1},
    {"prefill-timeout", required_argument, NULL, OPT_LEG_TIMEOUT + 2},
    {"decode-connect-timeout", required_argument, NULL, OPT_LEG_TIMEOUT + 3},
    {"decode-first-byte-timeout", required_argument, NULL, OPT_LEG_TIMEOUT + 4},
    {"decode-timeout", required_argument, NULL, OPT_LEG_TIMEOUT + 5},
    PDL_HTTP_LONGOPTS,
    {NULL, 0, NULL, 0},
};

/* The policy flags as given; --policy only fills in the ones not given (vllm-router's precedence). */
typedef struct policy_flags {
    bool have_policy, have_prefill, have_decode;
    pdl_policy_kind_t policy;
} policy_flags_t;

/* One flag with its value (NULL for a switch); `flag` is the name as typed, for messages. */
static pdl_status_t take_flag(pdl_router_config_t *c, policy_flags_t *pf, int opt, const char *flag, const char *v,
                              pdl_error_t *err)
{
    pdl_status_t st;
    int x = 0;
    long l = 0;
    if (pdl_http_is_opt(opt))
        return pdl_http_limits_take(&c->http, opt, flag, v, err);
    if (opt >= OPT_LEG_TIMEOUT && opt < OPT_LEG_TIMEOUT + (int)N_LEG_TIMEOUTS) {
        if ((st = pdl_parse_int(flag, v, 0, 86400, &x, err)) == PDL_OK)
            *(unsigned *)(void *)((char *)c + k_leg_timeouts[opt - OPT_LEG_TIMEOUT]) = (unsigned)x;
        return st;
    }
    switch (opt) {
    case OPT_HELP: c->help = true; return PDL_OK;
    case OPT_PD: c->pd_disaggregation = true; return PDL_OK;
    case OPT_HOST: return copy_str(flag, v, c->host, sizeof(c->host), err);
    case OPT_PORT: return pdl_parse_int(flag, v, 0, 65535, &c->port, err);
    case OPT_KV_CONNECTOR:
        if (strcmp(v, "moriio") != 0)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "%s: '%s' is not supported (pdlink-router implements moriio)", flag, v);
        return copy_str(flag, v, c->kv_connector, sizeof(c->kv_connector), err);
    case OPT_DISCOVERY:
        st = parse_hostport(flag, v, c->discovery_host, sizeof(c->discovery_host), &c->discovery_port, err);
        c->has_discovery = st == PDL_OK;
        return st;
    case OPT_POLICY:
        pf->have_policy = true;
        return parse_policy(flag, v, &pf->policy, err);
    case OPT_PREFILL_POLICY:
        pf->have_prefill = true;
        return parse_policy(flag, v, &c->prefill_policy, err);
    case OPT_DECODE_POLICY:
        pf->have_decode = true;
        return parse_policy(flag, v, &c->decode_policy, err);
    case OPT_LOG_LEVEL:
        c->log_level = pdl_log_level_parse(v);
        if (c->log_level < 0)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s: unknown level '%s' (error, warn, info, debug, trace)",
                                 flag, v);
        return PDL_OK;
    case OPT_PROM_PORT: return pdl_parse_int(flag, v, 0, 65535, &c->prometheus_port, err);
    case OPT_PROM_HOST: return copy_str(flag, v, c->prometheus_host, sizeof(c->prometheus_host), err);
    case OPT_WORKER_TTL:
        if ((st = pdl_parse_int(flag, v, 1, 3600000, &x, err)) == PDL_OK)
            c->worker_ttl_ms = (uint32_t)x;
        return st;
    case OPT_PORT_FILE: return copy_str(flag, v, c->port_file, sizeof(c->port_file), err);
    case OPT_DP_SIZE: return pdl_parse_int(flag, v, 1, 1024, &c->intra_node_dp_size, err);
    case OPT_MAX_PAYLOAD:
        if ((st = pdl_parse_long(flag, v, 1, 1l << 40, &l, err)) == PDL_OK)
            c->max_payload_size = (size_t)l;
        return st;
    case OPT_MAX_PAYLOAD_IN_FLIGHT:
        if ((st = pdl_parse_long(flag, v, 1, 1l << 40, &l, err)) == PDL_OK)
            c->http.body_budget = (size_t)l;
        return st;
    case OPT_AUTH_KEY_FILE: return copy_str(flag, v, c->auth_key_file, sizeof(c->auth_key_file), err);
    case OPT_API_KEY:
        /* It becomes a header line: a CR or LF in it would let it add headers of its own. */
        if (v[0] == '\0' || strpbrk(v, "\r\n") != NULL)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s: empty, or holds a line break", flag);
        return copy_str(flag, v, c->api_key, sizeof(c->api_key), err);
    }
    return pdl_error_set(err, PDL_ERR_INVALID, "%s: no handler (a bug in config.c)", flag);
}

typedef struct parse_ctx {
    pdl_router_config_t *c;
    policy_flags_t pf;
} parse_ctx_t;

static pdl_status_t take(pdl_opts_t *o, int opt, const char *value, void *ctx, pdl_error_t *err)
{
    parse_ctx_t *p = ctx;
    if (opt == 1)
        return pdl_error_set(err, PDL_ERR_INVALID, "unexpected argument '%s'", value);
    pdl_status_t st = take_flag(p->c, &p->pf, opt, o->flag, value, err);
    o->done = p->c->help; /* --help wins over anything after it, and over missing required flags */
    return st;
}

pdl_status_t pdl_router_config_parse(pdl_router_config_t *c, int argc, char **argv, pdl_error_t *err)
{
    parse_ctx_t p = {.c = c, .pf = {.policy = PDL_POLICY_CONSISTENT_HASH}};
    /* clap, vllm-router's parser, takes its flags with '-' only, so '_' is not read as '-' here. */
    pdl_status_t st = pdl_opts_parse(argc, argv, router_options, false, take, &p, err);
    if (st != PDL_OK || c->help)
        return st;
    const policy_flags_t pf = p.pf;
    if (pf.have_policy) {
        if (!pf.have_prefill)
            c->prefill_policy = pf.policy;
        if (!pf.have_decode)
            c->decode_policy = pf.policy;
    }
    if (!c->pd_disaggregation)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "--vllm-pd-disaggregation is required (pdlink-router only implements P/D mode)");
    if (!c->has_discovery)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "--vllm-discovery-address HOST:PORT is required with --kv-connector moriio");
    return PDL_OK;
}
