/*
 * args.c -- the `vllm serve`-style command line of pdlink-node (see args.h).
 *
 * Flags are read by getopt_long_only (app/opts.h): "--flag value", "--flag=value" and vLLM's short
 * spellings "-tp 4", "-dp 2"; '_' in a flag name reads as '-', as in vLLM. vLLM flags that mean nothing
 * for an emulated instance (GPU memory fraction, attention backend, tool parsers, ...) are accepted and
 * ignored with a debug line, so the seed's command lines run unchanged. An unknown flag is an error: silently accepting a typo of a
 * flag that matters (say --tensor-paralel-size) would produce a node with the wrong geometry.
 */
#include "node/args.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "app/opts.h"
#include "app/parse.h"
#include "common/log.h"
#include "pdlink/models.h"

void pdl_node_args_defaults(pdl_node_args_t *a)
{
    *a = (pdl_node_args_t){
        .host = "0.0.0.0",
        .port = 8000,
        .tp_size = 1,
        .dp_size = 1,
        .block_size = 16,
        .elem_size = 2,
        .kv_cache_dtype = "auto",
        .kv_cache_memory = 32ull << 20,
        .kv_layout = PDL_KV_HND,
        .kv_wait_ms = 30000,
        .max_tokens_default = 16,
        /* A node's clients are routers and proxies holding pooled keep-alive connections. 60 s idle is
         * longer than any pool keeps one; 1024 workers cover the concurrency a router sends (each waiting
         * KV pull is a worker); 256 MiB of bodies is 16 bodies at the 16 MiB a request may have. Headers
         * are due within the idle timeout, a body within 120 s of its headers (140 kB/s for 16 MiB), so a
         * client trickling bytes holds its connection no longer. */
        .http = {.idle_timeout_s = 60, .header_timeout_s = 60, .body_timeout_s = 120, .max_connections = 4096,
                 .threads = 2, .workers = 1024, .body_budget = 256u << 20},
    };
}

const char *pdl_node_args_usage(void)
{
    return "usage: pdlink-node [serve] [MODEL] [options]\n"
           "An emulated `vllm serve` instance: TP ranks with a paged KV cache of a real model's geometry,\n"
           "a deterministic synthetic model, an OpenAI-compatible HTTP API and the MoRIIO connector.\n"
           "\n"
           "  --model PRESET                 tiny, tiny-mla, llama-3.1-8b, llama-3.1-70b, qwen3-32b, deepseek-v3\n"
           "                                 (a Hugging Face name whose last part matches a preset works too)\n"
           "  --served-model-name NAME       name in /v1/models and responses (default: the model as given)\n"
           "  --host H                       bind address (default 0.0.0.0)\n"
           "  --port P                       HTTP port (default 8000; 0 = any free port, see --port-file)\n"
           "  --port-file PATH               write the bound HTTP port to PATH once listening (pdlink)\n"
           "  --tensor-parallel-size N, -tp  TP ranks (default 1)\n"
           "  --data-parallel-size N, -dp    DP size advertised (default 1); --data-parallel-rank R (default 0)\n"
           "  --block-size N                 tokens per KV block (default 16)\n"
           "  --kv-cache-dtype fp8|bf16|auto element size 1 or 2 bytes (auto = bf16)\n"
           "  --num-gpu-blocks N             KV blocks per rank (alias --num-gpu-blocks-override)\n"
           "  --kv-cache-memory BYTES        KV memory per rank when --num-gpu-blocks is absent (default 32M;\n"
           "                                 suffixes K M G, alias --kv-cache-memory-bytes)\n"
           "  --seed N                       model seed: KV bytes and outputs depend on it (default 0)\n"
           "  --max-model-len N              prompt + generated tokens limit (default: the preset's)\n"
           "  --kv-transfer-config JSON      MoRIIO connector config, the seed's JSON verbatim; without it (or\n"
           "                                 with kv_role kv_both) the node serves alone. Its extra config's\n"
           "                                 auth_key_file turns on authenticated mode (docs/security.md)\n"
           "  --api-key KEY                  /v1 routes require Authorization: Bearer KEY (as vLLM; 401 without)\n"
"  --prewarm-peer HOST:PORT[:TP[:DP]]  a READ decode handshakes with and maps this producer (a WRITE\n"
           "                                 prefill: this decode) at start-up, in the background, retried\n"
           "                                 until it answers; PORT is its base\n"
           "                                 handshake port, TP its TP size (default ours). Repeatable; adds to\n"
           "                                 prewarm_peers (pdlink)\n"
           "  --kv-layout hnd|nhd            KV order inside a block (pdlink; default hnd)\n"
           "  --kv-interleaved               K and V interleaved per block instead of [2][blocks] (pdlink)\n"
           "  --kv-wait-timeout SECONDS      wait this long for free KV blocks before a 503 (pdlink; default 30)\n"
           "  --http-idle-timeout SECONDS    close an HTTP connection silent this long (pdlink; default 60, 0 = never)\n"
           "  --http-max-connections N       open HTTP connections at most (pdlink; default 4096, lowered to 3/8 of\n"
           "                                 ulimit -n)\n"
           "  --http-max-connections-per-client N  from one IP address (pdlink; default 3/4 of the above)\n"
           "  --http-threads N               HTTP polling threads (pdlink; default 2)\n"
           "  --http-workers N               requests handled at once; more wait (pdlink; default 1024)\n"
           "  --http-header-timeout SECONDS  a request's headers are due this long after the connection opened or\n"
           "                                 its previous response, however slowly they trickle (pdlink; default 60)\n"
           "  --http-body-timeout SECONDS    a request's body is due this long after its headers (pdlink; default\n"
           "                                 120; 0 = never for either)\n"
           "  --log-level error|warn|info|debug|trace\n"
           "  --help-config                  the keys of kv_connector_extra_config: type, default, accepted\n"
           "                                 values, meaning\n"
           "  --help, --version\n"
           "Accepted and ignored: --trust-remote-code --language-model-only --no-enable-prefix-caching\n"
           "  --enable-prefix-caching --enable-auto-tool-choice --enforce-eager --disable-log-requests\n"
           "  --attention-backend X --gpu-memory-utilization X --tool-call-parser X --reasoning-parser X\n"
           "  --dtype X --max-num-seqs X --max-num-batched-tokens X --distributed-executor-backend X\n";
}

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

enum {
    OPT_HELP = 256, OPT_HELP_CONFIG, OPT_VERSION, OPT_IGNORED_SWITCH, OPT_IGNORED_VALUE, OPT_KV_INTERLEAVED, OPT_MODEL,
    OPT_SERVED_NAME, OPT_HOST, OPT_PORT, OPT_PORT_FILE, OPT_TP, OPT_DP, OPT_DP_RANK, OPT_BLOCK_SIZE,
    OPT_KV_DTYPE, OPT_NUM_BLOCKS, OPT_KV_MEMORY, OPT_SEED, OPT_MAX_MODEL_LEN, OPT_KV_TRANSFER_CONFIG,
    OPT_LOG_LEVEL, OPT_KV_LAYOUT, OPT_KV_WAIT, OPT_DEFAULT_MAX_TOKENS, OPT_PREWARM_PEER, OPT_API_KEY,
};

static const struct option node_options[] = {
    {"help", no_argument, NULL, OPT_HELP},
    {"h", no_argument, NULL, OPT_HELP},
    {"help-config", no_argument, NULL, OPT_HELP_CONFIG},
    {"version", no_argument, NULL, OPT_VERSION},
    {"kv-interleaved", no_argument, NULL, OPT_KV_INTERLEAVED},
    {"model", required_argument, NULL, OPT_MODEL},
    {"served-model-name", required_argument, NULL, OPT_SERVED_NAME},
    {"host", required_argument, NULL, OPT_HOST},
    {"port", required_argument, NULL, OPT_PORT},
    {"port-file", required_argument, NULL, OPT_PORT_FILE},
    {"tensor-parallel-size", required_argument, NULL, OPT_TP},
    {"tp", required_argument, NULL, OPT_TP},
    {"data-parallel-size", required_argument, NULL, OPT_DP},
    {"dp", required_argument, NULL, OPT_DP},
    {"data-parallel-rank", required_argument, NULL, OPT_DP_RANK},
    {"dpr", required_argument, NULL, OPT_DP_RANK},
    {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
    {"kv-cache-dtype", required_argument, NULL, OPT_KV_DTYPE},
    {"num-gpu-blocks", required_argument, NULL, OPT_NUM_BLOCKS},
    {"num-gpu-blocks-override", required_argument, NULL, OPT_NUM_BLOCKS},
    {"kv-cache-memory", required_argument, NULL, OPT_KV_MEMORY},
    {"kv-cache-memory-bytes", required_argument, NULL, OPT_KV_MEMORY},
    {"seed", required_argument, NULL, OPT_SEED},
    {"max-model-len", required_argument, NULL, OPT_MAX_MODEL_LEN},
    {"kv-transfer-config", required_argument, NULL, OPT_KV_TRANSFER_CONFIG},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"prewarm-peer", required_argument, NULL, OPT_PREWARM_PEER},
    {"kv-layout", required_argument, NULL, OPT_KV_LAYOUT},
    {"kv-wait-timeout", required_argument, NULL, OPT_KV_WAIT},
    {"default-max-tokens", required_argument, NULL, OPT_DEFAULT_MAX_TOKENS},
    {"api-key", required_argument, NULL, OPT_API_KEY},
    /* vLLM flags that mean nothing for an emulated instance: accepted so the seed's lines run unchanged. */
    {"trust-remote-code", no_argument, NULL, OPT_IGNORED_SWITCH},
    {"language-model-only", no_argument, NULL, OPT_IGNORED_SWITCH},
    {"no-enable-prefix-caching", no_argument, NULL, OPT_IGNORED_SWITCH},
    {"enable-prefix-caching", no_argument, NULL, OPT_IGNORED_SWITCH},
    {"enable-auto-tool-choice", no_argument, NULL, OPT_IGNORED_SWITCH},
    {"enforce-eager", no_argument, NULL, OPT_IGNORED_SWITCH},
    {"disable-log-requests", no_argument, NULL, OPT_IGNORED_SWITCH},
    {"disable-log-stats", no_argument, NULL, OPT_IGNORED_SWITCH},
    {"attention-backend", required_argument, NULL, OPT_IGNORED_VALUE},
    {"gpu-memory-utilization", required_argument, NULL, OPT_IGNORED_VALUE},
    {"tool-call-parser", required_argument, NULL, OPT_IGNORED_VALUE},
    {"reasoning-parser", required_argument, NULL, OPT_IGNORED_VALUE},
    {"dtype", required_argument, NULL, OPT_IGNORED_VALUE},
    {"max-num-seqs", required_argument, NULL, OPT_IGNORED_VALUE},
    {"max-num-batched-tokens", required_argument, NULL, OPT_IGNORED_VALUE},
    {"distributed-executor-backend", required_argument, NULL, OPT_IGNORED_VALUE},
    {"uvicorn-log-level", required_argument, NULL, OPT_IGNORED_VALUE},
    {"swap-space", required_argument, NULL, OPT_IGNORED_VALUE},
    {"compilation-config", required_argument, NULL, OPT_IGNORED_VALUE},
    PDL_HTTP_LONGOPTS,
    {NULL, 0, NULL, 0},
};

typedef struct parse_ctx {
    pdl_node_args_t *a;
    bool positional_seen; /* "serve" is the verb only before any other positional */
} parse_ctx_t;

/* Positional: "serve" (optional, first), then MODEL. */
static pdl_status_t take_positional(parse_ctx_t *p, const char *arg, pdl_error_t *err)
{
    bool first = !p->positional_seen;
    p->positional_seen = true;
    if (first && strcmp(arg, "serve") == 0)
        return PDL_OK;
    if (p->a->positional_model != NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "unexpected argument '%s' (MODEL is '%s')", arg,
                             p->a->positional_model);
    p->a->positional_model = arg;
    return PDL_OK;
}

/* One flag with its value (NULL for a switch); `flag` is the name as typed, for messages. */
static pdl_status_t take_flag(pdl_node_args_t *a, int opt, const char *flag, const char *value, pdl_error_t *err)
{
    if (pdl_http_is_opt(opt))
        return pdl_http_limits_take(&a->http, opt, flag, value, err);
    switch (opt) {
    case OPT_HELP: a->help = true; return PDL_OK;
    case OPT_HELP_CONFIG: a->help_config = true; return PDL_OK;
    case OPT_VERSION: a->version = true; return PDL_OK;
    case OPT_KV_INTERLEAVED: a->kv_interleaved = true; return PDL_OK;
    case OPT_IGNORED_SWITCH:
        pdl_debug("ignoring vLLM option %s (no meaning for an emulated instance)", flag);
        return PDL_OK;
    case OPT_IGNORED_VALUE:
        pdl_debug("ignoring vLLM option %s %s (no meaning for an emulated instance)", flag, value);
        return PDL_OK;
    case OPT_MODEL: a->model = value; return PDL_OK;
    case OPT_SERVED_NAME: a->served_model_name = value; return PDL_OK;
    case OPT_HOST: a->host = value; return PDL_OK;
    case OPT_PORT: return pdl_parse_int(flag, value, 0, 65535, &a->port, err);
    case OPT_PORT_FILE: a->port_file = value; return PDL_OK;
    case OPT_TP: return pdl_parse_int(flag, value, 1, 256, &a->tp_size, err);
    case OPT_DP: return pdl_parse_int(flag, value, 1, 1024, &a->dp_size, err);
    case OPT_DP_RANK: return pdl_parse_int(flag, value, 0, 1023, &a->dp_rank, err);
    case OPT_BLOCK_SIZE: return pdl_parse_int(flag, value, 1, 65536, &a->block_size, err);
    case OPT_KV_DTYPE: {
        int es = pdl_model_dtype_size(value);
        if (es < 0)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected fp8, bf16 or auto", flag, value);
        a->elem_size = es;
        a->kv_cache_dtype = value;
        return PDL_OK;
    }
    case OPT_NUM_BLOCKS: {
        int v = 0;
        pdl_status_t st = pdl_parse_int(flag, value, 1, 1 << 24, &v, err);
        if (st == PDL_OK)
            a->num_gpu_blocks = (uint32_t)v;
        return st;
    }
    case OPT_KV_MEMORY: return parse_bytes(flag, value, &a->kv_cache_memory, err);
    case OPT_SEED: {
        char *end = NULL;
        errno = 0;
        unsigned long long s = strtoull(value, &end, 0);
        if (errno != 0 || end == value || *end != '\0' || value[0] == '-')
            return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected a non-negative integer", flag, value);
        a->seed = s;
        return PDL_OK;
    }
    case OPT_MAX_MODEL_LEN: return pdl_parse_int(flag, value, 1, INT_MAX, &a->max_model_len, err);
    case OPT_KV_TRANSFER_CONFIG: a->kv_transfer_config = value; return PDL_OK;
    case OPT_API_KEY:
        if (value[0] == '\0')
            return pdl_error_set(err, PDL_ERR_INVALID, "%s: empty (omit it to serve without a key)", flag);
        a->api_key = value;
        return PDL_OK;
    case OPT_PREWARM_PEER: {
        /* Checked now, so a typo is a usage error before anything starts; added to the config in main. */
        pdl_connector_config_t scratch;
        pdl_connector_config_defaults(&scratch);
        pdl_status_t st = pdl_connector_config_add_prewarm(&scratch, value, err);
        if (st != PDL_OK)
            return pdl_error_prefix(err, st, "%s", flag);
        if (a->num_prewarm_peers == PDL_CONNECTOR_PREWARM_MAX)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s: more than %d peers", flag, PDL_CONNECTOR_PREWARM_MAX);
        a->prewarm_peers[a->num_prewarm_peers++] = value;
        return PDL_OK;
    }
    case OPT_LOG_LEVEL:
        if (pdl_log_level_parse(value) < 0)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected error, warn, info, debug or trace", flag,
                                 value);
        a->log_level = value;
        return PDL_OK;
    case OPT_KV_LAYOUT: {
        int o = pdl_layout_order_parse(value);
        if (o < 0)
            return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected hnd or nhd", flag, value);
        a->kv_layout = (pdl_kv_order_t)o;
        return PDL_OK;
    }
    case OPT_KV_WAIT: {
        int s = 0;
        pdl_status_t st = pdl_parse_int(flag, value, 0, 3600, &s, err);
        if (st == PDL_OK)
            a->kv_wait_ms = s * 1000;
        return st;
    }
    case OPT_DEFAULT_MAX_TOKENS: return pdl_parse_int(flag, value, 1, 1 << 20, &a->max_tokens_default, err);
    }
    return pdl_error_set(err, PDL_ERR_INVALID, "%s: no handler (a bug in args.c)", flag);
}

static pdl_status_t take(pdl_opts_t *o, int opt, const char *value, void *ctx, pdl_error_t *err)
{
    parse_ctx_t *p = ctx;
    return opt == 1 ? take_positional(p, value, err) : take_flag(p->a, opt, o->flag, value, err);
}

pdl_status_t pdl_node_args_parse(int argc, char **argv, pdl_node_args_t *a, pdl_error_t *err)
{
    parse_ctx_t p = {.a = a};
    pdl_status_t st = pdl_opts_parse(argc, argv, node_options, true, take, &p, err);
    if (st != PDL_OK)
        return st;
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
