/*
 * args.c -- the `vllm serve`-style command line of pdlink-node (see args.h): one table row per flag.
 *
 * The table walker (app/optab.c) reads "--flag value", "--flag=value" and vLLM's short spellings "-tp 4",
 * "-dp 2"; '_' in a flag name reads as '-', as in vLLM. vLLM flags that mean nothing for an emulated
 * instance (GPU memory fraction, attention backend, tool parsers, ...) are accepted and ignored with a
 * debug line, so the seed's command lines run unchanged. An unknown flag is an error: silently accepting a
 * typo of a flag that matters (say --tensor-paralel-size) would produce a node with the wrong geometry.
 */
#include "node/args.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/optab.h"
#include "app/parse.h"
#include "common/log.h"
#include "pdlink/models.h"

static pdl_status_t parse_bytes(const char *flag, const char *s, uint64_t *out, pdl_error_t *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || s[0] == '-')
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected a byte count like 67108864 or 64M", flag, s);
    uint64_t mult = 1;
    if (*end != '\0') {
        char c = *end++;
        if (c == 'k' || c == 'K')
            mult = 1ull << 10;
        else if (c == 'm' || c == 'M')
            mult = 1ull << 20;
        else if (c == 'g' || c == 'G')
            mult = 1ull << 30;
        else
            return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': unknown unit (use K, M or G)", flag, s);
        if (*end == 'i')
            end++;
        if (*end == 'B' || *end == 'b')
            end++;
        if (*end != '\0')
            return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': trailing characters", flag, s);
    }
    if (v == 0 || v > UINT64_MAX / mult)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': must be positive and fit in 64 bits", flag, s);
    *out = v * mult;
    return PDL_OK;
}

static pdl_status_t set_kv_dtype(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                 pdl_error_t *err)
{
    (void)row, (void)done_p;
    pdl_node_args_t *a = opts;
    int es = pdl_model_dtype_size(v);
    if (es < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected fp8, bf16 or auto", flag, v);
    a->elem_size = es;
    a->kv_cache_dtype = v;
    return PDL_OK;
}

static pdl_status_t set_kv_memory(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                  pdl_error_t *err)
{
    (void)row, (void)done_p;
    return parse_bytes(flag, v, &((pdl_node_args_t *)opts)->kv_cache_memory, err);
}

static pdl_status_t set_seed(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                             pdl_error_t *err)
{
    (void)row, (void)done_p;
    char *end = NULL;
    errno = 0;
    unsigned long long s = strtoull(v, &end, 0);
    if (errno != 0 || end == v || *end != '\0' || v[0] == '-')
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected a non-negative integer", flag, v);
    ((pdl_node_args_t *)opts)->seed = s;
    return PDL_OK;
}

static pdl_status_t set_api_key(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                pdl_error_t *err)
{
    (void)row, (void)done_p;
    if (v[0] == '\0')
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: empty (omit it to serve without a key)", flag);
    ((pdl_node_args_t *)opts)->api_key = v;
    return PDL_OK;
}

/* Checked now, so a typo is a usage error before anything starts; added to the config in main. */
static pdl_status_t set_prewarm_peer(void *opts, const pdl_optdef_t *row, const char *flag, const char *v,
                                     bool *done_p, pdl_error_t *err)
{
    (void)row, (void)done_p;
    pdl_node_args_t *a = opts;
    pdl_connector_config_t scratch;
    pdl_connector_config_defaults(&scratch);
    pdl_status_t st = pdl_connector_config_add_prewarm(&scratch, v, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "%s", flag);
    if (a->num_prewarm_peers == PDL_CONNECTOR_PREWARM_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: more than %d peers", flag, PDL_CONNECTOR_PREWARM_MAX);
    a->prewarm_peers[a->num_prewarm_peers++] = v;
    return PDL_OK;
}

static pdl_status_t set_log_level(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                  pdl_error_t *err)
{
    (void)row, (void)done_p;
    if (pdl_log_level_parse(v) < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected error, warn, info, debug or trace", flag, v);
    ((pdl_node_args_t *)opts)->log_level = v;
    return PDL_OK;
}

static pdl_status_t set_kv_layout(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                  pdl_error_t *err)
{
    (void)row, (void)done_p;
    int o = pdl_layout_order_parse(v);
    if (o < 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected hnd or nhd", flag, v);
    ((pdl_node_args_t *)opts)->kv_layout = (pdl_kv_order_t)o;
    return PDL_OK;
}

static pdl_status_t set_kv_wait(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                                pdl_error_t *err)
{
    (void)row, (void)done_p;
    int s = 0;
    pdl_status_t st = pdl_parse_int(flag, v, 0, 3600, &s, err);
    if (st == PDL_OK)
        ((pdl_node_args_t *)opts)->kv_wait_ms = s * 1000;
    return st;
}

/* A vLLM flag with no meaning for an emulated instance: accepted so the seed's lines run unchanged. */
static pdl_status_t ignore(void *opts, const pdl_optdef_t *row, const char *flag, const char *v, bool *done_p,
                           pdl_error_t *err)
{
    (void)opts, (void)row, (void)done_p, (void)err;
    pdl_debug("ignoring vLLM option %s%s%s (no meaning for an emulated instance)", flag, v ? " " : "", v ? v : "");
    return PDL_OK;
}

#define NA(field) offsetof(pdl_node_args_t, field)
#define IGNORED(name_) {.name = name_, .kind = PDL_OPT_CALL, .set = ignore}
#define IGNORED_VALUE(name_) {.name = name_, .kind = PDL_OPT_CALL, .metavar = "X", .set = ignore}
static const pdl_optdef_t node_rows[] = {
    {.name = "model", .kind = PDL_OPT_STRING, .metavar = "PRESET", .off = NA(model),
     .help = "tiny, tiny-mla, llama-3.1-8b, llama-3.1-70b, qwen3-32b, deepseek-v3 (a Hugging Face name whose last "
             "part matches a preset works too)"},
    {.name = "served-model-name", .kind = PDL_OPT_STRING, .metavar = "NAME", .off = NA(served_model_name),
     .help = "name in /v1/models and responses (default: the model as given)"},
    {.name = "host", .kind = PDL_OPT_STRING, .metavar = "H", .def = "0.0.0.0", .off = NA(host), .help = "bind address"},
    {.name = "port", .kind = PDL_OPT_INT, .metavar = "P", .def = "8000", .off = NA(port), .lo = 0, .hi = 65535,
     .help = "HTTP port; 0 = any free port, see --port-file"},
    {.name = "port-file", .kind = PDL_OPT_STRING, .metavar = "PATH", .off = NA(port_file),
     .help = "pdlink: write the bound HTTP port to PATH once listening"},
    {.name = "tensor-parallel-size", .also = "-tp", .kind = PDL_OPT_INT, .metavar = "N", .def = "1",
     .off = NA(tp_size), .lo = 1, .hi = 256, .help = "TP ranks"},
    {.name = "data-parallel-size", .also = "-dp", .kind = PDL_OPT_INT, .metavar = "N", .def = "1", .off = NA(dp_size),
     .lo = 1, .hi = 1024, .help = "DP size advertised"},
    {.name = "data-parallel-rank", .also = "-dpr", .kind = PDL_OPT_INT, .metavar = "R", .def = "0",
     .off = NA(dp_rank), .lo = 0, .hi = 1023, .help = "this node's DP rank (ports are offset by R*TP)"},
    {.name = "block-size", .kind = PDL_OPT_INT, .metavar = "N", .def = "16", .off = NA(block_size), .lo = 1,
     .hi = 65536, .help = "tokens per KV block"},
    {.name = "kv-cache-dtype", .kind = PDL_OPT_CALL, .metavar = "fp8|bf16|auto", .def = "auto", .set = set_kv_dtype,
     .help = "element size 1 or 2 bytes (auto = bf16)"},
    {.name = "num-gpu-blocks", .also = "--num-gpu-blocks-override", .kind = PDL_OPT_UINT, .metavar = "N",
     .off = NA(num_gpu_blocks), .lo = 1, .hi = 1 << 24, .help = "KV blocks per rank"},
    {.name = "kv-cache-memory", .also = "--kv-cache-memory-bytes", .kind = PDL_OPT_CALL, .metavar = "BYTES",
     .def = "32M", .set = set_kv_memory,
     .help = "KV memory per rank when --num-gpu-blocks is absent (suffixes K M G)"},
    {.name = "seed", .kind = PDL_OPT_CALL, .metavar = "N", .def = "0", .set = set_seed,
     .help = "model seed: KV bytes and outputs depend on it"},
    {.name = "max-model-len", .kind = PDL_OPT_INT, .metavar = "N", .off = NA(max_model_len), .lo = 1, .hi = INT_MAX,
     .help = "prompt + generated tokens limit (default: the preset's)"},
    {.name = "kv-transfer-config", .kind = PDL_OPT_STRING, .metavar = "JSON", .off = NA(kv_transfer_config),
     .help = "MoRIIO connector config, the seed's JSON verbatim; without it (or with kv_role kv_both) the node "
             "serves alone. Its extra config's auth_key_file turns on authenticated mode (docs/security.md)"},
    {.name = "api-key", .kind = PDL_OPT_CALL, .metavar = "KEY", .set = set_api_key,
     .help = "/v1 routes require Authorization: Bearer KEY (as vLLM; 401 without)"},
    {.name = "prewarm-peer", .kind = PDL_OPT_CALL, .metavar = "HOST:PORT[:TP[:DP]]", .set = set_prewarm_peer,
     .help = "pdlink: a READ decode handshakes with and maps this producer (a WRITE prefill: this decode) at "
             "start-up, in the background, retried until it answers; PORT is its base handshake port, TP its TP "
             "size (default ours). Repeatable; adds to prewarm_peers"},
    {.name = "kv-layout", .kind = PDL_OPT_CALL, .metavar = "hnd|nhd", .def = "hnd", .set = set_kv_layout,
     .help = "pdlink: KV order inside a block"},
    {.name = "kv-interleaved", .kind = PDL_OPT_FLAG, .off = NA(kv_interleaved),
     .help = "pdlink: K and V interleaved per block instead of [2][blocks]"},
    {.name = "kv-wait-timeout", .kind = PDL_OPT_CALL, .metavar = "SECONDS", .def = "30", .set = set_kv_wait,
     .help = "pdlink: wait this long for free KV blocks before a 503"},
    {.name = "default-max-tokens", .kind = PDL_OPT_INT, .metavar = "N", .def = "16", .off = NA(max_tokens_default),
     .lo = 1, .hi = 1 << 20, .help = "max_tokens of a request that has none (as vLLM's completions)"},
    /* A node's clients are routers and proxies holding pooled keep-alive connections. 60 s idle is longer
     * than any pool keeps one; 1024 workers cover the concurrency a router sends (each waiting KV pull is a
     * worker). Headers are due within the idle timeout, a body within 120 s of its headers (140 kB/s for
     * the 16 MiB a request may have), so a client trickling bytes holds its connection no longer. */
    {PDL_HTTP_ROW_IDLE_TIMEOUT(pdl_node_args_t, http), .def = "60",
     .help = "pdlink: close an HTTP connection silent this long (0 = never)"},
    {PDL_HTTP_ROW_MAX_CONNECTIONS(pdl_node_args_t, http), .def = "4096",
     .help = "pdlink: open HTTP connections at most (lowered to 3/8 of ulimit -n)"},
    {PDL_HTTP_ROW_MAX_PER_CLIENT(pdl_node_args_t, http),
     .help = "pdlink: from one IP address (default 1/4 of the above)"},
    {PDL_HTTP_ROW_THREADS(pdl_node_args_t, http), .def = "2", .help = "pdlink: HTTP polling threads"},
    {PDL_HTTP_ROW_WORKERS(pdl_node_args_t, http), .def = "1024",
     .help = "pdlink: requests handled at once; more wait"},
    {PDL_HTTP_ROW_HEADER_TIMEOUT(pdl_node_args_t, http), .def = "60",
     .help = "pdlink: a request's headers are due this long after the connection opened or its previous "
             "response, however slowly they trickle (0 = never)"},
    {PDL_HTTP_ROW_BODY_TIMEOUT(pdl_node_args_t, http), .def = "120",
     .help = "pdlink: a request's body is due this long after its headers (0 = never)"},
    {.name = "log-level", .kind = PDL_OPT_CALL, .metavar = "error|warn|info|debug|trace", .set = set_log_level,
     .help = "stderr log level (default info, or PDLINK_LOG_LEVEL)"},
    {.name = "help-config", .kind = PDL_OPT_FLAG, .off = NA(help_config),
     .help = "pdlink: the keys of kv_connector_extra_config (type, default, accepted values, meaning)"},
    {.name = "version", .kind = PDL_OPT_FLAG, .off = NA(version), .help = "print the version"},
    {.name = "help", .alias = 'h', .kind = PDL_OPT_FLAG, .off = NA(help), .help = "this text"},
    {.kind = PDL_OPT_SECTION, .help = "\naccepted and ignored (vLLM flags with no meaning for an emulated instance):"},
    IGNORED("trust-remote-code"),
    IGNORED("language-model-only"),
    IGNORED("no-enable-prefix-caching"),
    IGNORED("enable-prefix-caching"),
    IGNORED("enable-auto-tool-choice"),
    IGNORED("enforce-eager"),
    IGNORED("disable-log-requests"),
    IGNORED("disable-log-stats"),
    IGNORED_VALUE("attention-backend"),
    IGNORED_VALUE("gpu-memory-utilization"),
    IGNORED_VALUE("tool-call-parser"),
    IGNORED_VALUE("reasoning-parser"),
    IGNORED_VALUE("dtype"),
    IGNORED_VALUE("max-num-seqs"),
    IGNORED_VALUE("max-num-batched-tokens"),
    IGNORED_VALUE("distributed-executor-backend"),
    IGNORED_VALUE("uvicorn-log-level"),
    IGNORED_VALUE("swap-space"),
    IGNORED_VALUE("compilation-config"),
    {0},
};
#undef IGNORED_VALUE
#undef IGNORED
#undef NA

/* Positional: "serve" (optional, first), then MODEL. */
static pdl_status_t take_positional(void *opts, const char *arg, pdl_error_t *err)
{
    pdl_node_args_t *a = opts;
    bool first = !a->positional_seen;
    a->positional_seen = true;
    if (first && strcmp(arg, "serve") == 0)
        return PDL_OK;
    if (a->positional_model != NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "unexpected argument '%s' (MODEL is '%s')", arg,
                             a->positional_model);
    a->positional_model = arg;
    return PDL_OK;
}

static const pdl_optab_t node_table = {
    .prog = "pdlink-node",
    .usage = "usage: pdlink-node [serve] [MODEL] [options]\n"
             "An emulated `vllm serve` instance: TP ranks with a paged KV cache of a real model's geometry,\n"
             "a deterministic synthetic model, an OpenAI-compatible HTTP API and the MoRIIO connector.\n"
             "\n",
    .rows = node_rows,
    .positional = take_positional,
    .underscores = true,
};

void pdl_node_args_defaults(pdl_node_args_t *a)
{
    *a = (pdl_node_args_t){
        /* 256 MiB of bodies is 16 bodies at the 16 MiB a request may have. */
        .http = {.body_budget = 256u << 20},
    };
    pdl_error_t err;
    pdl_error_clear(&err);
    if (pdl_optab_defaults(&node_table, a, &err) != PDL_OK)
        pdl_error("pdlink-node: %s", err.msg); /* a bad row: test_node_args fails on it */
}

void pdl_node_args_help(FILE *f)
{
    pdl_optab_help(&node_table, f);
}

pdl_status_t pdl_node_args_parse(int argc, char **argv, pdl_node_args_t *a, pdl_error_t *err)
{
    if (pdl_optab_parse(&node_table, a, argc, argv, NULL, err) != PDL_OPTAB_GO)
        return PDL_ERR_INVALID;
    /* `serve NAME --model PRESET`: NAME is what clients ask for, PRESET gives the geometry. */
    if (a->positional_model != NULL) {
        if (a->model == NULL)
            a->model = a->positional_model;
        else if (a->served_model_name == NULL && strcmp(a->model, a->positional_model) != 0)
            a->served_model_name = a->positional_model;
    }
    if (!a->help && !a->help_config && !a->version && a->model == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "no model: give --model PRESET or a MODEL argument");
    return PDL_OK;
}
