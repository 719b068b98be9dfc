/*
 * args.h -- pdlink-node's command line, modelled on `vllm serve` so the seed's commands translate line by
 * line (see docs/node.md): one option table (app/optab.h) parses it and prints --help. The parser never
 * exits: a usage error comes back as PDL_ERR_INVALID naming the flag and the value, and main() turns it
 * into exit status 2.
 */
#ifndef PDL_NODE_ARGS_H
#define PDL_NODE_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "app/http.h"
#include "pdlink/connector.h"
#include "pdlink/layout.h"
#include "pdlink/status.h"

typedef struct pdl_node_args {
    const char *model;              /* preset (or HF-style name of a preset) */
    const char *served_model_name;  /* NULL: the name given on the command line */
    const char *positional_model;   /* `serve MODEL`: the served name when --model also names a preset */
    bool positional_seen;           /* "serve" is the verb only as the first positional */
    const char *host;               /* default "0.0.0.0" */
    int port;                       /* default 8000; 0 = ephemeral (see port_file) */
    const char *port_file;          /* pdlink extension: write the bound port here */
    int tp_size;
    int dp_size;
    int dp_rank;
    int block_size;                 /* default 16, like vLLM */
    int elem_size;                  /* fp8 = 1, bf16/auto = 2 */
    const char *kv_cache_dtype;
    uint32_t num_gpu_blocks;        /* 0: derive from kv_cache_memory */
    uint64_t kv_cache_memory;       /* bytes per rank; default 32 MiB */
    uint64_t seed;
    int max_model_len;              /* 0: the preset's */
    const char *kv_transfer_config; /* NULL: serve alone */
    /* pdlink extension --prewarm-peer HOST:PORT[:TP[:DP]], repeatable: added to prewarm_peers */
    const char *prewarm_peers[PDL_CONNECTOR_PREWARM_MAX];
    int num_prewarm_peers;
    const char *log_level;
    pdl_kv_order_t kv_layout;       /* pdlink extension --kv-layout hnd|nhd; default hnd */
    bool kv_interleaved;            /* pdlink extension --kv-interleaved: [blocks][2] instead of [2][blocks] */
    int kv_wait_ms;                 /* pdlink extension --kv-wait-timeout SECONDS: wait for free blocks */
    int max_tokens_default;         /* default max_tokens when a request has none (vLLM: 16) */
    pdl_http_limits_t http;         /* pdlink extension --http-*: the HTTP listener's limits */
    const char *api_key;            /* vLLM's --api-key: /v1 routes require Authorization: Bearer <it>; NULL = open */
    bool help;
    bool help_config; /* --help-config: print the kv_connector_extra_config keys */
    bool version;
} pdl_node_args_t;

/* Every default, those of the option table's rows included. */
void pdl_node_args_defaults(pdl_node_args_t *a);

/* Parse argv (argv[0] is the program) over the defaults already in *a. Pointers in *a point into argv, and
 * '_' in flag names is rewritten to '-' in place (vLLM's --tensor_parallel_size). Uses getopt: call from
 * one thread. On error returns PDL_ERR_INVALID with err naming the flag and the value. */
pdl_status_t pdl_node_args_parse(int argc, char **argv, pdl_node_args_t *a, pdl_error_t *err);

/* --help, printed from the option table. */
void pdl_node_args_help(FILE *f);

#endif /* PDL_NODE_ARGS_H */
