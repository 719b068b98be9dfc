/*
 * config.c -- pdlink-router's command line (vllm-router's flag names, docs/vllm-router.md#flags): one
 * table row per flag, parsed and printed by app/optab.c.
 *
 * "--flag value" and "--flag=value" are accepted, as clap (vllm-router's parser) accepts both; clap takes
 * its flags with '-' only, so '_' is not read as '-' here. --policy sets the default of --prefill-policy
 * and --decode-policy whatever the order of the flags, as in vllm-router. MoRIIO without a discovery
 * address is refused, as vllm-router's config validation refuses it (docs/vllm-router.md#discovery).
 */
#include "router/config.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/optab.h"
#include "app/parse.h"
#include "common/log.h"
#include "router/apikey.h"

/* What the table stores into: the config, and the policy flags as given, since --policy only fills in
 * the per-role policies not given (vllm-router's precedence). */
typedef struct router_opts {
    pdl_router_config_t c;
    pdl_policy_kind_t policy;
    bool have_prefill, have_decode;
} router_opts_t;

const char *pdl_policy_kind_name(pdl_policy_kind_t k)
{
    switch (k) {
    case PDL_POLICY_CONSISTENT_HASH: return "consistent_hash";
    case PDL_POLICY_ROUND_ROBIN: return "round_robin";
    case PDL_POLICY_RANDOM: return "random";
    }
    return "unknown";
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

static pdl_status_t set_help(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                             pdl_error_t *err)
{
    (void)row, (void)flag, (void)v, (void)err;
    ((router_opts_t *)opts)->c.help = true;
    *done_p = true; /* --help wins over anything after it, and over missing required flags */
    return PDL_OK;
}

static pdl_status_t set_policy(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                               pdl_error_t *err)
{
    (void)row, (void)done_p;
    return parse_policy(flag, v, &((router_opts_t *)opts)->policy, err);
}

/* --prefill-policy, --decode-policy: the policy at row->off, and the bool at row->off2 says it was given. */
static pdl_status_t set_role_policy(void *opts, const pdl_optdef_t *row, const char *flag, const char *v,
                                    bool *done_p, pdl_error_t *err)
{
    (void)done_p;
    *(bool *)(void *)((char *)opts + row->off2) = true;
    return parse_policy(flag, v, (pdl_policy_kind_t *)(void *)((char *)opts + row->off), err);
}

static pdl_status_t set_kv_connector(void *opts, const pdl_optdef_t *row, const char *flag, const char *v,
                                     bool *done_p, pdl_error_t *err)
{
    (void)row, (void)done_p;
    pdl_router_config_t *c = &((router_opts_t *)opts)->c;
    if (strcmp(v, "moriio") != 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: '%s' is not supported (pdlink-router implements moriio)",
                             flag, v);
    return copy_str(flag, v, c->kv_connector, sizeof(c->kv_connector), err);
}

static pdl_status_t set_discovery(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                  pdl_error_t *err)
{
    (void)row, (void)done_p;
    pdl_router_config_t *c = &((router_opts_t *)opts)->c;
    pdl_status_t st = parse_hostport(flag, v, c->discovery_host, sizeof(c->discovery_host), &c->discovery_port, err);
    c->has_discovery = st == PDL_OK;
    return st;
}

static pdl_status_t set_log_level(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                  pdl_error_t *err)
{
    (void)row, (void)done_p;
    pdl_router_config_t *c = &((router_opts_t *)opts)->c;
    c->log_level = pdl_log_level_parse(v);
    if (c->log_level < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: unknown level '%s' (error, warn, info, debug, trace)", flag,
                             v);
    return PDL_OK;
}

/* A byte count in [row->lo, row->hi] into the size_t at row->off. */
static pdl_status_t set_size(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                             pdl_error_t *err)
{
    (void)done_p;
    long l = 0;
    pdl_status_t st = pdl_parse_long(flag, v, row->lo, row->hi, &l, err);
    if (st == PDL_OK)
        *(size_t *)(void *)((char *)opts + row->off) = (size_t)l;
    return st;
}

static pdl_status_t set_api_key(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                pdl_error_t *err)
{
    (void)row, (void)done_p;
    pdl_router_config_t *c = &((router_opts_t *)opts)->c;
    /* It becomes a header line: a CR or LF in it would let it add headers of its own. */
    if (v[0] == '\0' || strpbrk(v, "\r\n") != NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: empty, or holds a line break", flag);
    return copy_str(flag, v, c->api_key, sizeof(c->api_key), err);
}

/* Parsed here only to refuse a bad list at the command line (exit 2); router.c parses it again for use. */
static pdl_status_t set_api_key_hosts(void *opts, const pdl_optdef_t *row, const char *flag, const char *v,
                                      bool *done_p, pdl_error_t *err)
{
    (void)row, (void)done_p;
    pdl_router_config_t *c = &((router_opts_t *)opts)->c;
    pdl_cidrs_t l = {0};
    pdl_status_t st = pdl_rt_apikey_parse_hosts(v, &l, err);
    size_t n = l.n;
    pdl__cidrs_free(&l);
    if (st != PDL_OK)
        return st;
    if (n == 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: '%s' names no address", flag, v);
    return copy_str(flag, v, c->api_key_hosts, sizeof(c->api_key_hosts), err);
}

#define RC(field) offsetof(router_opts_t, c.field)
#define CAP(field) ((int)sizeof(((pdl_router_config_t *)0)->field))
#define LEG_TIMEOUT(name_, field_, def_, help_)                                                                  \
    {.name = name_, .kind = PDL_OPT_UINT, .metavar = "S", .def = def_, .off = RC(field_), .lo = 0, .hi = 86400,  \
     .help = help_}
static const pdl_optdef_t router_rows[] = {
    {.name = "host", .kind = PDL_OPT_TEXT, .metavar = "HOST", .def = "127.0.0.1", .off = RC(host), .max_n = CAP(host),
     .help = "HTTP listen address"},
    {.name = "port", .kind = PDL_OPT_INT, .metavar = "PORT", .def = "30000", .off = RC(port), .lo = 0, .hi = 65535,
     .help = "HTTP listen port"},
    {.name = "vllm-pd-disaggregation", .kind = PDL_OPT_FLAG, .off = RC(pd_disaggregation),
     .help = "prefill/decode mode (required)"},
    {.name = "kv-connector", .kind = PDL_OPT_CALL, .metavar = "moriio", .def = "moriio", .set = set_kv_connector,
     .help = "KV connector of the instances (only moriio)"},
    {.name = "vllm-discovery-address", .kind = PDL_OPT_CALL, .metavar = "H:P", .set = set_discovery,
     .help = "ZeroMQ ROUTER address instances register to (required)"},
    {.name = "policy", .kind = PDL_OPT_CALL, .metavar = "P", .def = "consistent_hash", .set = set_policy,
     .help = "consistent_hash | round_robin | random"},
    {.name = "prefill-policy", .kind = PDL_OPT_CALL, .metavar = "P", .off = RC(prefill_policy),
     .off2 = offsetof(router_opts_t, have_prefill), .set = set_role_policy,
     .help = "policy for prefill instances (default: --policy)"},
    {.name = "decode-policy", .kind = PDL_OPT_CALL, .metavar = "P", .off = RC(decode_policy),
     .off2 = offsetof(router_opts_t, have_decode), .set = set_role_policy,
     .help = "policy for decode instances (default: --policy)"},
    {.name = "intra-node-data-parallel-size", .kind = PDL_OPT_INT, .metavar = "N", .def = "1",
     .off = RC(intra_node_dp_size), .lo = 1, .hi = 1024, .help = "remote_dp_size sent in READ mode"},
    {.name = "log-level", .kind = PDL_OPT_CALL, .metavar = "L", .set = set_log_level,
     .help = "error | warn | info | debug | trace (default info)"},
    {.name = "prometheus-host", .kind = PDL_OPT_TEXT, .metavar = "HOST", .def = "127.0.0.1",
     .off = RC(prometheus_host), .max_n = CAP(prometheus_host), .help = "metrics listener address"},
    {.name = "prometheus-port", .kind = PDL_OPT_INT, .metavar = "PORT", .off = RC(prometheus_port), .lo = 0,
     .hi = 65535, .help = "separate metrics listener; /metrics is also on --port"},
    /* Bodies are relayed to both legs; pdlink-node refuses bodies over 16 MiB, so the router need not hold
     * larger ones. The in-flight budget bounds all of them: a routed request holds about five copies of
     * its body while its legs are built (parsed, prefill and decode JSON, their texts), so 256 MiB of
     * bodies is about 1.3 GiB at the peak. */
    {.name = "max-payload-size", .kind = PDL_OPT_CALL, .metavar = "BYTES", .def = "16777216",
     .off = RC(max_payload_size), .lo = 1, .hi = 1l << 40, .set = set_size,
     .help = "one request body at most (16 MiB, pdlink-node's limit; 413 above, refused from Content-Length "
             "before the body)"},
    {.name = "max-payload-in-flight", .kind = PDL_OPT_CALL, .metavar = "BYTES", .def = "268435456",
     .off = RC(http.body_budget), .lo = 1, .hi = 1l << 40, .set = set_size,
     .help = "request bodies held at once (256 MiB; 503 above)"},
    {.name = "auth-key-file", .kind = PDL_OPT_TEXT, .metavar = "PATH", .off = RC(auth_key_file),
     .max_n = CAP(auth_key_file),
     .help = "authenticated mode: the cluster key file of the nodes' auth_key_file; the discovery socket then "
             "admits only key holders (CURVE)"},
    {.name = "api-key", .kind = PDL_OPT_CALL, .metavar = "KEY", .set = set_api_key,
     .help = "/v1 routes require Authorization: Bearer KEY (401 without), and it is sent the same way to the "
             "workers the router verified (their --api-key): all in authenticated mode, else those of "
             "--api-key-hosts"},
    {.name = "api-key-hosts", .kind = PDL_OPT_CALL, .metavar = "CIDR[,CIDR]", .set = set_api_key_hosts,
     .help = "compatible mode: numeric addresses/networks of the workers trusted with --api-key; any other "
             "registered worker gets its legs without it"},
    /* Clients of a router are many and long-lived (streams), hence 8192 connections and 1024 workers (each
     * running request or stream is one). Header and body deadlines bound what a trickling client holds:
     * 60 s for the headers is the idle timeout a keep-alive connection already had; 120 s for a 16 MiB
     * body is 140 kB/s. */
    {PDL_HTTP_ROW_IDLE_TIMEOUT(router_opts_t, c.http), .def = "60",
     .help = "close a connection silent this long (0 = never)"},
    {PDL_HTTP_ROW_MAX_CONNECTIONS(router_opts_t, c.http), .def = "8192",
     .help = "open connections at most (lowered to 3/8 of ulimit -n)"},
    {PDL_HTTP_ROW_MAX_PER_CLIENT(router_opts_t, c.http), .help = "from one IP address (default 1/4 of the above)"},
    {PDL_HTTP_ROW_THREADS(router_opts_t, c.http), .def = "2", .help = "HTTP polling threads"},
    {PDL_HTTP_ROW_WORKERS(router_opts_t, c.http), .def = "1024",
     .help = "requests and streams handled at once; more wait"},
    {PDL_HTTP_ROW_HEADER_TIMEOUT(router_opts_t, c.http), .def = "60",
     .help = "a request's headers must arrive within this of the connection's open or its previous response, "
             "however slowly (0 = never)"},
    {PDL_HTTP_ROW_BODY_TIMEOUT(router_opts_t, c.http), .def = "120",
     .help = "a request's body must arrive within this of its headers (0 = never)"},
    /* A prefill leg (max_tokens 1, not streamed) answers at once when its prefill is done, so its first
     * byte is its whole answer: 300 s is a long prompt queued behind others, and a paused or hung prefill
     * fails its clients after that rather than never. A decode's first byte is its headers (a stream) or
     * its whole answer; 1800 s overall is vllm-router's --request-timeout-secs. */
    LEG_TIMEOUT("prefill-connect-timeout", prefill_timeouts.connect_s, "10",
                "a prefill leg's TCP connect, in seconds (0 = none; past a deadline: 504, the prefill released)"),
    LEG_TIMEOUT("prefill-first-byte-timeout", prefill_timeouts.first_byte_s, "300",
                "a prefill leg's first response byte (its whole answer)"),
    LEG_TIMEOUT("prefill-timeout", prefill_timeouts.total_s, "600", "a prefill leg's whole exchange"),
    LEG_TIMEOUT("decode-connect-timeout", decode_timeouts.connect_s, "10", "a decode leg's TCP connect"),
    LEG_TIMEOUT("decode-first-byte-timeout", decode_timeouts.first_byte_s, "600",
                "a decode leg's first response byte"),
    LEG_TIMEOUT("decode-timeout", decode_timeouts.total_s, "1800",
                "a decode leg's whole exchange, the stream included (vllm-router's --request-timeout-secs)"),
    {.name = "help", .alias = 'h', .kind = PDL_OPT_CALL, .set = set_help, .help = "show this text"},
    /* Test hooks: the registration TTL (vllm-router's 5 s), and where to write the bound ports. */
    {.name = "worker-ttl-ms", .kind = PDL_OPT_UINT, .metavar = "N", .def = "5000", .off = RC(worker_ttl_ms), .lo = 1,
     .hi = 3600000, .flags = PDL_OPTF_HIDDEN, .help = "registration TTL"},
    {.name = "port-file", .kind = PDL_OPT_TEXT, .metavar = "PATH", .off = RC(port_file), .max_n = CAP(port_file),
     .flags = PDL_OPTF_HIDDEN, .help = "write \"http=P discovery=P prometheus=P\" here once bound"},
    {0},
};
#undef LEG_TIMEOUT
#undef CAP
#undef RC

static pdl_status_t take_positional(void *opts, const char *arg, pdl_error_t *err)
{
    (void)opts;
    return pdl_error_set(err, PDL_ERR_INVALID, "unexpected argument '%s'", arg);
}

static void help_tail(FILE *f)
{
    fputs("\n"
          "endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,\n"
          "           GET /readiness, GET /liveness, GET /metrics, GET /workers (JSON), GET /list_workers\n",
          f);
}

static const pdl_optab_t router_table = {
    .prog = "pdlink-router",
    .usage = "usage: pdlink-router --vllm-pd-disaggregation --kv-connector moriio\n"
             "                     --vllm-discovery-address HOST:PORT [options]\n"
             "\n"
             "A prefill/decode router speaking vllm-router's MoRIIO mode: instances register over ZeroMQ on\n"
             "the discovery address; completions are sent to a prefill and then (READ) or at the same time\n"
             "(WRITE) to a decode instance, and the decode's response is streamed back.\n"
             "\n"
             "options:\n",
    .rows = router_rows,
    .help_tail = help_tail,
    .positional = take_positional,
};

void pdl_router_config_init(pdl_router_config_t *c)
{
    router_opts_t o = {.c = {.log_level = -1, .prometheus_port = -1}};
    pdl_error_t err;
    pdl_error_clear(&err);
    if (pdl_optab_defaults(&router_table, &o, &err) != PDL_OK)
        pdl_error("pdlink-router: %s", err.msg); /* a bad row: test_router_config fails on it */
    o.c.prefill_policy = o.c.decode_policy = o.policy;
    *c = o.c;
}

void pdl_router_help(FILE *f)
{
    pdl_optab_help(&router_table, f);
}

pdl_status_t pdl_router_config_parse(pdl_router_config_t *c, int argc, char **argv, pdl_error_t *err)
{
    router_opts_t o = {.c = *c};
    pdl_optab_result_t r = pdl_optab_parse(&router_table, &o, argc, argv, NULL, err);
    *c = o.c;
    if (r == PDL_OPTAB_USAGE)
        return PDL_ERR_INVALID;
    if (c->help)
        return PDL_OK;
    if (!o.have_prefill)
        c->prefill_policy = o.policy;
    if (!o.have_decode)
        c->decode_policy = o.policy;
    if (!c->pd_disaggregation)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "--vllm-pd-disaggregation is required (pdlink-router only implements P/D mode)");
    if (!c->has_discovery)
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "--vllm-discovery-address HOST:PORT is required with --kv-connector moriio");
    return PDL_OK;
}
