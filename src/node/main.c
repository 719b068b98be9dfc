/*
 * main.c -- pdlink-node: an emulated `vllm serve` instance (docs/node.md).
 *
 * Start-up: parse the command line, find the model preset, read --kv-transfer-config (the seed's JSON
 * verbatim) into the connector config, size the KV cache, create the KV store (a connector instance for
 * kv_producer/kv_consumer, local memory when serving alone), start the HTTP server, log one line naming
 * the model, TP, KV bytes per rank and ports, then wait for SIGTERM/SIGINT. The signals are blocked in
 * every thread and taken with sigwait() in main, so no handler and no global flag are needed. Shutdown
 * stops HTTP first (no new requests), then destroys the instance, and exits 0.
 */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "node/node.h"
#include "common/log.h"
#include "common/ports.h"
#include "pdlink/topo.h"
#include "pdlink/version.h"

static void human_bytes(uint64_t b, char *out, size_t cap)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, cap, "%.1f %s", v, unit[u]);
}

/* Print text from column 4, wrapped before column 100 at spaces. */
static void print_wrapped(FILE *out, const char *text)
{
    const int indent = 4, width = 100;
    while (*text) {
        int len = (int)strlen(text);
        int take = len;
        if (indent + len > width) {
            take = width - indent;
            while (take > 0 && text[take] != ' ')
                take--;
            if (take == 0)
                take = (int)strcspn(text, " ");
        }
        fprintf(out, "%*s%.*s\n", indent, "", take, text);
        text += take;
        while (*text == ' ')
            text++;
    }
}

/*
 * --help-config: the connector's key table, one paragraph per key. The first line of each is
 * "NAME  TYPE  default DEFAULT" ("" for an empty default), which tests/integration/test_docs_config.sh
 * reads; then what the key accepts and what it means.
 */
static void print_config_keys(FILE *out)
{
    fputs("The keys of \"kv_connector_extra_config\" in --kv-transfer-config (others are logged and ignored):\n",
          out);
    pdl_connector_config_key_t k;
    for (size_t i = 0; pdl_connector_config_key(i, &k); i++) {
        fprintf(out, "\n%-22s %-8s default %s\n", k.name, k.type, k.def[0] ? k.def : "\"\"");
        char accepts[sizeof(k.range) + 16];
        snprintf(accepts, sizeof(accepts), "accepts %s", k.range);
        print_wrapped(out, accepts);
        print_wrapped(out, k.doc);
    }
}

/*
 * Read --kv-transfer-config. kv_both (or no config) means "serve alone": pdlink's connector has only the
 * producer and consumer roles, and a kv_both vLLM instance serving a whole request does no transfer.
 */
static pdl_status_t load_transfer_config(pdl_node_t *node, int http_port, pdl_error_t *err)
{
    node->role = PDL_NODE_ALONE;
    node->role_label = "both";
    const char *text = node->args.kv_transfer_config;
    if (text == NULL)
        return PDL_OK;
    json_error_t jerr;
    json_t *root = json_loads(text, 0, &jerr);
    if (root == NULL)
        return pdl_error_set(err, PDL_ERR_PARSE, "--kv-transfer-config: invalid JSON at line %d column %d: %s",
                             jerr.line, jerr.column, jerr.text);
    const json_t *role = json_object_get(root, "kv_role");
    bool both = json_is_string(role) && strcmp(json_string_value(role), "kv_both") == 0;
    json_decref(root);
    if (both) {
        pdl_info("kv_role kv_both: serving whole requests alone, no KV transfer");
        return PDL_OK;
    }
    pdl_status_t st = pdl_connector_config_parse(text, &node->conn, err);
    if (st != PDL_OK) {
        pdl_error_prefix(err, st, "--kv-transfer-config");
        return st;
    }
    for (int i = 0; i < node->args.num_prewarm_peers; i++) {
        st = pdl_connector_config_add_prewarm(&node->conn, node->args.prewarm_peers[i], err);
        if (st != PDL_OK)
            return pdl_error_prefix(err, st, "--prewarm-peer");
    }
    if (node->conn.role == PDL_ROLE_PRODUCER) {
        node->role = PDL_NODE_PRODUCER;
        node->role_label = "prefill";
    } else {
        node->role = PDL_NODE_CONSUMER;
        node->role_label = "decode";
    }
    /* The discovery ping advertises host_ip:http_port; with no http_port that is the port we bound. */
    if (node->conn.http_port <= 0) {
        node->conn.http_port = http_port;
    } else if (node->conn.http_port != http_port) {
        pdl_warn("kv_connector_extra_config.http_port %d differs from the HTTP port %d; the router will be told %d",
                 node->conn.http_port, http_port, node->conn.http_port);
    }
    /* backend "rdma" → the best available backend: the connector's config parser logs which one. */
    return PDL_OK;
}

/* The KV cache's geometry and size from the command line and the preset; 0, or the exit code (2). */
static int kv_config(pdl_node_t *node, pdl_node_kv_config_t *kc)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    const pdl_node_args_t *a = &node->args;
    memset(kc, 0, sizeof(*kc));
    kc->model.num_layers = node->preset->num_layers;
    kc->model.total_kv_heads = node->preset->total_kv_heads;
    kc->model.head_dim = node->preset->head_dim;
    kc->model.is_mla = node->preset->is_mla;
    kc->model.elem_size = a->elem_size;
    kc->model.block_size = a->block_size;
    kc->model.order = a->kv_layout;
    kc->model.kv_separate = !a->kv_interleaved;
    kc->tp_size = a->tp_size;
    kc->dp_rank = a->dp_rank;
    kc->dp_size = a->dp_size;
    if (a->dp_rank >= a->dp_size) {
        pdl_error("--data-parallel-rank %d: must be below --data-parallel-size %d", a->dp_rank, a->dp_size);
        return 2;
    }
    uint64_t block_bytes = pdl_node_kv_block_bytes(&kc->model, a->tp_size, &err);
    if (block_bytes == 0) {
        pdl_error("model %s with --tensor-parallel-size %d: %s", node->preset->name, a->tp_size, err.msg);
        return 2;
    }
    if (a->num_gpu_blocks > 0) {
        kc->num_blocks = a->num_gpu_blocks;
        return 0;
    }
    uint64_t nb = a->kv_cache_memory / block_bytes;
    if (nb == 0) {
        pdl_error("--kv-cache-memory %llu bytes holds no block of %llu bytes (model %s, TP %d, block size %d)",
                  (unsigned long long)a->kv_cache_memory, (unsigned long long)block_bytes, node->preset->name,
                  a->tp_size, a->block_size);
        return 2;
    }
    kc->num_blocks = nb > (1u << 24) ? (1u << 24) : (uint32_t)nb;
    return 0;
}

/* --port-file: the bound port, written to PATH.tmp and renamed, so a reader never sees half of it. */
static void write_port_file(const char *path, int port)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    bool written = f != NULL && fprintf(f, "%d\n", port) > 0;
    if (f != NULL && fclose(f) != 0)
        written = false;
    if (!written || rename(tmp, path) != 0)
        pdl_warn("--port-file %s: cannot write: %m", path);
}

/* The one line that says the node is up: model, TP, KV per rank, ports and, with a connector, its role. */
static void log_ready(const pdl_node_t *node, const pdl_node_kv_config_t *kc, int port)
{
    const pdl_node_args_t *a = &node->args;
    char kvb[32];
    human_bytes(pdl_node_kv_rank_bytes(node->kv), kvb, sizeof(kvb));
    int first = 0, heads = 0;
    pdl_node_kv_heads(node->kv, 0, &first, &heads);
    if (node->role == PDL_NODE_ALONE)
        pdl_info("pdlink-node ready: model %s (%s; %d layers, %d KV heads x %d%s, %s), TP %d (%d heads/rank), "
                 "block size %d, %u blocks/rank, KV %s/rank, seed %llu, http %s:%d, serving alone",
                 node->served_name, node->preset->name, node->preset->num_layers, node->preset->total_kv_heads,
                 node->preset->head_dim, node->preset->is_mla ? " MLA" : "", a->elem_size == 1 ? "fp8" : "bf16",
                 a->tp_size, heads, a->block_size, kc->num_blocks, kvb, (unsigned long long)a->seed, a->host, port);
    else
        pdl_info("pdlink-node ready: model %s (%s; %d layers, %d KV heads x %d%s, %s), TP %d (%d heads/rank), "
                 "DP %d/%d, block size %d, %u blocks/rank, KV %s/rank, seed %llu, http %s:%d, role %s (%s mode), "
                 "engine %s, handshake %d+, notify %d+, backend %s%s%s",
                 node->served_name, node->preset->name, node->preset->num_layers, node->preset->total_kv_heads,
                 node->preset->head_dim, node->preset->is_mla ? " MLA" : "", a->elem_size == 1 ? "fp8" : "bf16",
                 a->tp_size, heads, a->dp_rank, a->dp_size, a->block_size, kc->num_blocks, kvb,
                 (unsigned long long)a->seed, a->host, port, node->role_label, node->conn.read_mode ? "READ" : "WRITE",
                 pdl_instance_engine_id(pdl_node_kv_instance(node->kv)), node->conn.handshake_port,
                 node->conn.notify_port, pdl_backend_name(node->conn.backend),
                 node->conn.proxy_ip[0] ? ", discovery " : "", node->conn.proxy_ip);
}

static int run(pdl_node_t *node)
{
    pdl_error_t err;
    pdl_error_clear(&err);
    pdl_node_args_t *a = &node->args;

    node->preset = pdl_node_preset_find(a->model);
    if (node->preset == NULL) {
        char names[256];
        pdl_node_preset_names(names, sizeof(names));
        pdl_error("--model '%s': unknown model preset (known: %s)", a->model, names);
        return 2;
    }
    node->served_name = a->served_model_name ? a->served_model_name : a->model;
    node->max_model_len = a->max_model_len > 0 ? a->max_model_len : pdl_node_preset_max_len(node->preset);
    node->started = time(NULL);
    pdl_node_kv_config_t kc;
    int rc = kv_config(node, &kc);
    if (rc != 0)
        return rc;

    /*
     * HTTP first: the port is known (also with --port 0) before the connector starts pinging the router
     * with it, and /health answers 503 until the KV cache and connector are up, as vLLM's does.
     */
    node->metrics = pdl_node_metrics_create();
    if (node->metrics == NULL) {
        pdl_error("out of memory");
        return 1;
    }
    pdl_http_t *http = NULL;
    int port = 0;
    /* Port 0 is chosen by the kernel at bind time; only a configured port can be taken first. */
    if (a->port > 0)
        pdl_ports_warn_ephemeral("--port", a->port, a->port);
    if (pdl_node_http_start(node, &http, &port, &err) != PDL_OK) {
        pdl_error("%s", err.msg);
        pdl_node_metrics_destroy(node->metrics);
        return 1;
    }
    if (load_transfer_config(node, port, &err) != PDL_OK) {
        pdl_error("%s", err.msg);
        pdl_http_stop(http);
        pdl_node_metrics_destroy(node->metrics);
        return 2;
    }
    kc.conn = node->role == PDL_NODE_ALONE ? NULL : &node->conn;
    if (pdl_node_kv_create(&kc, &node->kv, &err) != PDL_OK) {
        pdl_error("cannot create the KV cache: %s", err.msg);
        pdl_http_stop(http);
        pdl_node_metrics_destroy(node->metrics);
        return 1;
    }
    atomic_store(&node->ready, true);
    if (a->port_file != NULL)
        write_port_file(a->port_file, port);
    log_ready(node, &kc, port);

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    int sig = 0;
    while (sigwait(&set, &sig) != 0) {
    }
    pdl_info("signal %d: shutting down", sig);
    atomic_store(&node->ready, false);
    pdl_http_stop(http);
    pdl_node_kv_destroy(node->kv);
    pdl_node_metrics_destroy(node->metrics);
    pdl_info("stopped");
    return 0;
}

int main(int argc, char **argv)
{
    /* Block the shutdown signals (and SIGPIPE) before any thread exists, so every thread inherits it. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    pdl_log_set_ident("pdlink-node");
    const char *env = getenv("PDLINK_LOG_LEVEL");
    if (env != NULL && pdl_log_level_parse(env) >= 0)
        pdl_log_set_level((pdl_log_level_t)pdl_log_level_parse(env));
    /* --log-level is applied before parsing the rest, so ignored-flag debug lines honour it. */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--log-level") == 0 && pdl_log_level_parse(argv[i + 1]) >= 0)
            pdl_log_set_level((pdl_log_level_t)pdl_log_level_parse(argv[i + 1]));
        else if (strncmp(argv[i], "--log-level=", 12) == 0 && pdl_log_level_parse(argv[i] + 12) >= 0)
            pdl_log_set_level((pdl_log_level_t)pdl_log_level_parse(argv[i] + 12));

    pdl_node_t node;
    memset(&node, 0, sizeof(node));
    pdl_node_args_defaults(&node.args);
    pdl_error_t err;
    pdl_error_clear(&err);
    if (pdl_node_args_parse(argc, argv, &node.args, &err) != PDL_OK) {
        fprintf(stderr, "pdlink-node: %s\n", err.msg);
        return 2;
    }
    if (node.args.help) {
        pdl_node_args_help(stdout);
        return 0;
    }
    if (node.args.help_config) {
        print_config_keys(stdout);
        return 0;
    }
    if (node.args.version) {
        printf("pdlink-node %s\n", PDL_VERSION_STRING);
        return 0;
    }
    return run(&node);
}
