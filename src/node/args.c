/*
 * args.c -- the `vllm serve`-style command line of pdlink-node (see args.h).
 *
 * Flags take "--flag value" or "--flag=value". vLLM flags that mean nothing for an emulated instance
 * (GPU memory fraction, attention backend, tool parsers, ...) are accepted and ignored with a debug line,
 * so the seed's command lines run unchanged. An unknown flag is an error: silently accepting a typo of a
 * flag that matters (say --tensor-paralel-size) would produce a node with the wrong geometry.
 */
#include "node/args.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "pdlink/log.h"
#include "pdlink/models.h"

void pdl_node_args_defaults(pdl_node_args_t *a)
{
    memset(a, 0, sizeof(*a));
    a->host = "0.0.0.0";
    a->port = 8000;
    a->tp_size = 1;
    a->dp_size = 1;
    a->dp_rank = 0;
    a->block_size = 16;
    a->elem_size = 2;
    a->kv_cache_dtype = "auto";
    a->kv_cache_memory = 32ull << 20;
    a->seed = 0;
    a->kv_layout = PDL_KV_HND;
    a->kv_wait_ms = 30000;
    a->max_tokens_default = 16;
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
           "                                 with kv_role kv_both) the node serves alone\n"
           "  --kv-layout hnd|nhd            KV order inside a block (pdlink; default hnd)\n"
           "  --kv-interleaved               K and V interleaved per block instead of [2][blocks] (pdlink)\n"
           "  --kv-wait-timeout SECONDS      wait this long for free KV blocks before a 503 (pdlink; default 30)\n"
           "  --log-level error|warn|info|debug|trace\n"
           "  --help, --version\n"
           "Accepted and ignored: --trust-remote-code --language-model-only --no-enable-prefix-caching\n"
           "  --enable-prefix-caching --enable-auto-tool-choice --enforce-eager --disable-log-requests\n"
           "  --attention-backend X --gpu-memory-utilization X --tool-call-parser X --reasoning-parser X\n"
           "  --dtype X --max-num-seqs X --max-num-batched-tokens X --distributed-executor-backend X\n";
}

static pdl_status_t parse_int(const char *flag, const char *s, long lo, long hi, long *out, pdl_error_t *err)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s '%s': expected an integer in [%ld, %ld]", flag, s, lo, hi);
    *out = v;
    return PDL_OK;
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

/* vLLM flags that do not apply to an emulated instance. */
static const char *const ignored_switches[] = {
    "--trust-remote-code",     "--language-model-only", "--no-enable-prefix-caching", "--enable-prefix-caching",
    "--enable-auto-tool-choice", "--enforce-eager",     "--disable-log-requests",     "--disable-log-stats",
    NULL,
};
static const char *const ignored_valued[] = {
    "--attention-backend", "--gpu-memory-utilization", "--tool-call-parser", "--reasoning-parser", "--dtype",
    "--max-num-seqs", "--max-num-batched-tokens", "--distributed-executor-backend", "--uvicorn-log-level",
    "--swap-space", "--compilation-config", NULL,
};

static bool in_list(const char *const *list, const char *name)
{
    for (int i = 0; list[i] != NULL; i++)
        if (strcmp(list[i], name) == 0)
            return true;
    return false;
}

pdl_status_t pdl_node_args_parse(int argc, char **argv, pdl_node_args_t *a, pdl_error_t *err)
{
    int positional = 0;
    for (int i = 1; i < argc; i++) {
        char *arg = argv[i];
        if (arg[0] != '-' || arg[1] == '\0') {
            /* Positional: "serve" (optional, first), then MODEL. */
            if (positional == 0 && strcmp(arg, "serve") == 0) {
                positional = 1;
                continue;
            }
            if (a->positional_model != NULL)
                return pdl_error_set(err, PDL_ERR_INVALID, "unexpected argument '%s' (MODEL is '%s')", arg,
                                     a->positional_model);
            a->positional_model = arg;
            positional = 2;
            continue;
        }
        /* Split "--flag=value". */
        char name[64];
        const char *value = NULL;
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        if (nlen >= sizeof(name))
            return pdl_error_set(err, PDL_ERR_INVALID, "unknown option '%.60s...'", arg);
        memcpy(name, arg, nlen);
        name[nlen] = '\0';
        if (eq)
            value = eq + 1;
        for (char *c = name; *c; c++)
            if (*c == '_')
                *c = '-'; /* vLLM accepts --tensor_parallel_size too */

        if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
            a->help = true;
            continue;
        }
        if (strcmp(name, "--version") == 0) {
            a->version = true;
            continue;
        }
        if (in_list(ignored_switches, name)) {
            pdl_debug("ignoring vLLM option %s (no meaning for an emulated instance)", name);
            continue;
        }
        if (strcmp(name, "--kv-interleaved") == 0) {
            a->kv_interleaved = true;
            continue;
        }
        /* Everything else takes a value. */
        if (value == NULL) {
            if (i + 1 >= argc)
                return pdl_error_set(err, PDL_ERR_INVALID, "option %s needs a value", name);
            value = argv[++i];
        }
        if (in_list(ignored_valued, name)) {
            pdl_debug("ignoring vLLM option %s %s (no meaning for an emulated instance)", name, value);
            continue;
        }
        long v = 0;
        pdl_status_t st = PDL_OK;
        if (strcmp(name, "--model") == 0) {
            a->model = value;
        } else if (strcmp(name, "--served-model-name") == 0) {
            a->served_model_name = value;
        } else if (strcmp(name, "--host") == 0) {
            a->host = value;
        } else if (strcmp(name, "--port") == 0) {
            if ((st = parse_int(name, value, 0, 65535, &v, err)) == PDL_OK)
                a->port = (int)v;
        } else if (strcmp(name, "--port-file") == 0) {
            a->port_file = value;
        } else if (strcmp(name, "--tensor-parallel-size") == 0 || strcmp(name, "-tp") == 0) {
            if ((st = parse_int(name, value, 1, 256, &v, err)) == PDL_OK)
                a->tp_size = (int)v;
        } else if (strcmp(name, "--data-parallel-size") == 0 || strcmp(name, "-dp") == 0) {
            if ((st = parse_int(name, value, 1, 1024, &v, err)) == PDL_OK)
                a->dp_size = (int)v;
        } else if (strcmp(name, "--data-parallel-rank") == 0 || strcmp(name, "-dpr") == 0) {
            if ((st = parse_int(name, value, 0, 1023, &v, err)) == PDL_OK)
                a->dp_rank = (int)v;
        } else if (strcmp(name, "--block-size") == 0) {
            if ((st = parse_int(name, value, 1, 65536, &v, err)) == PDL_OK)
                a->block_size = (int)v;
        } else if (strcmp(name, "--kv-cache-dtype") == 0) {
            int es = pdl_model_dtype_size(value);
            if (es < 0)
                return pdl_error_set(err, PDL_ERR_INVALID, "--kv-cache-dtype '%s': expected fp8, bf16 or auto", value);
            a->elem_size = es;
            a->kv_cache_dtype = value;
        } else if (strcmp(name, "--num-gpu-blocks") == 0 || strcmp(name, "--num-gpu-blocks-override") == 0) {
            if ((st = parse_int(name, value, 1, 1L << 24, &v, err)) == PDL_OK)
                a->num_gpu_blocks = (uint32_t)v;
        } else if (strcmp(name, "--kv-cache-memory") == 0 || strcmp(name, "--kv-cache-memory-bytes") == 0) {
            st = parse_bytes(name, value, &a->kv_cache_memory, err);
        } else if (strcmp(name, "--seed") == 0) {
            char *end = NULL;
            errno = 0;
            unsigned long long s = strtoull(value, &end, 0);
            if (errno != 0 || end == value || *end != '\0' || value[0] == '-')
                return pdl_error_set(err, PDL_ERR_INVALID, "--seed '%s': expected a non-negative integer", value);
            a->seed = s;
        } else if (strcmp(name, "--max-model-len") == 0) {
            if ((st = parse_int(name, value, 1, INT_MAX, &v, err)) == PDL_OK)
                a->max_model_len = (int)v;
        } else if (strcmp(name, "--kv-transfer-config") == 0) {
            a->kv_transfer_config = value;
        } else if (strcmp(name, "--log-level") == 0) {
            if (pdl_log_level_parse(value) < 0)
                return pdl_error_set(err, PDL_ERR_INVALID,
                                     "--log-level '%s': expected error, warn, info, debug or trace", value);
            a->log_level = value;
        } else if (strcmp(name, "--kv-layout") == 0) {
            int o = pdl_layout_order_parse(value);
            if (o < 0)
                return pdl_error_set(err, PDL_ERR_INVALID, "--kv-layout '%s': expected hnd or nhd", value);
            a->kv_layout = (pdl_kv_order_t)o;
        } else if (strcmp(name, "--kv-wait-timeout") == 0) {
            if ((st = parse_int(name, value, 0, 3600, &v, err)) == PDL_OK)
                a->kv_wait_ms = (int)v * 1000;
        } else if (strcmp(name, "--default-max-tokens") == 0) {
            if ((st = parse_int(name, value, 1, 1 << 20, &v, err)) == PDL_OK)
                a->max_tokens_default = (int)v;
        } else {
            return pdl_error_set(err, PDL_ERR_INVALID, "unknown option '%s' (see --help)", name);
        }
        if (st != PDL_OK)
            return st;
    }
    /* `serve NAME --model PRESET`: NAME is what clients ask for, PRESET gives the geometry. */
    if (a->positional_model != NULL) {
        if (a->model == NULL)
            a->model = a->positional_model;
        else if (a->served_model_name == NULL && strcmp(a->model, a->positional_model) != 0)
            a->served_model_name = a->positional_model;
    }
    if (!a->help && !a->version && a->model == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "no model: give --model PRESET or a MODEL argument");
    return PDL_OK;
}
