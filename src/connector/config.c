/*
 * config.c -- kv_connector_extra_config / --kv-transfer-config parsing (docs/protocol.md#configuration).
 *
 * The table below is the documentation: one row per MoRIIO key with its default and parser. Values are
 * taken the way upstream takes them: ports may be JSON integers or numeric strings (upstream calls
 * int(...)), read_mode accepts true / "true" / "1" / 1 (upstream: str(v).lower().strip() in
 * ("true", "1")), timeouts are seconds as numbers or numeric strings. A falsy handshake_port or
 * notify_port (0, "") means the default, as upstream's _set_port_defaults does.
 * backend: "tcp", "shm", "ucx" and "cuda" (KV in GPU memory, GPUs of one host: the instance's
 * kv_mem_type must then be CUDA) are pdlink's engines; "rdma" (upstream's default) maps to "ucx" when
 * UCX offers an RDMA transport (rc/dc/ud verbs) and to "tcp" otherwise (pdl_backend_pick_rdma), and
 * "xgmi" (upstream's intra-node GPU path) maps to "shm"; both are logged with the reason.
 */
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "connector/internal.h"
#include "pdlink/connector.h"
#include "pdlink/wire.h"

_Static_assert(PDL_CONNECTOR_HOST_MAX == PDL_WIRE_HOST_MAX, "connector and wire must agree on host names");
#include "common/log.h"

void pdl_connector_config_defaults(pdl_connector_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->role = PDL_ROLE_CONSUMER;
    strcpy(cfg->host_ip, "127.0.0.1");
    cfg->handshake_port = 6301;
    cfg->notify_port = 61005;
    cfg->read_mode = false;
    cfg->backend = PDL_BACKEND_TCP;
    cfg->backend_mapped_from_rdma = true; /* upstream's default backend is "rdma" */
    cfg->qp_per_transfer = 1;
    cfg->num_workers = 1;
    cfg->post_batch_size = -1;
    cfg->transfer_timeout_s = 30.0;
    cfg->defer_timeout_s = 60.0;
    cfg->handshake_timeout_s = 10.0;
    cfg->peer_backoff_s = 2.0;
    cfg->peer_backoff_max_s = 30.0;
    cfg->consumer_gone_timeout_s = 5.0;
}

/* Integer from a JSON integer, an integral real, or a string of decimal digits. */
static bool json_to_ll(const json_t *v, long long *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != floor(d) || fabs(d) > 9e15)
            return false;
        *out = (long long)d;
        return true;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        while (isspace((unsigned char)*s))
            s++;
        if (*s == '\0')
            return false;
        char *end;
        errno = 0;
        long long x = strtoll(s, &end, 10);
        while (isspace((unsigned char)*end))
            end++;
        if (errno != 0 || *end != '\0')
            return false;
        *out = x;
        return true;
    }
    return false;
}

static bool json_to_double(const json_t *v, double *out)
{
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return isfinite(*out);
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        double d = strtod(s, &end);
        while (isspace((unsigned char)*end))
            end++;
        if (errno != 0 || end == s || *end != '\0' || !isfinite(d))
            return false;
        *out = d;
        return true;
    }
    return false;
}

/* Short rendering of a JSON value for error messages. */
static void json_brief(const json_t *v, char *buf, size_t cap)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(buf, cap, "%.60s%s", s ? s : "?", (s && strlen(s) > 60) ? "..." : "");
    free(s);
}

typedef enum { K_STR, K_PORT, K_BASE_PORT, K_BOOL, K_BACKEND, K_POSINT, K_BATCH, K_SECONDS, K_HOSTS, K_PREWARM } key_kind_t;

typedef struct key_row {
    const char *name;
    key_kind_t kind;
    size_t offset;
    const char *doc;
} key_row_t;

#define OFF(f) offsetof(pdl_connector_config_t, f)
static const key_row_t k_rows[] = {
    {"host_ip", K_STR, OFF(host_ip), "address advertised to peers (default 127.0.0.1)"},
    {"proxy_ip", K_STR, OFF(proxy_ip), "router discovery address; empty = no discovery ping"},
    {"proxy_ping_port", K_PORT, OFF(proxy_ping_port), "router discovery port"},
    {"http_port", K_PORT, OFF(http_port), "this instance's HTTP port, advertised in the ping"},
    {"handshake_port", K_BASE_PORT, OFF(handshake_port), "base handshake port (6301); rank offset added"},
    {"notify_port", K_BASE_PORT, OFF(notify_port), "base notify port (61005); rank offset added"},
    {"read_mode", K_BOOL, OFF(read_mode), "true: READ (decode pulls); false: WRITE (default)"},
    {"backend", K_BACKEND, OFF(backend),
     "tcp | shm | ucx | cuda (GPU KV of one host, CUDA IPC) | rdma (ucx with RDMA, else tcp) | xgmi (mapped to shm)"},
    {"qp_per_transfer", K_POSINT, OFF(qp_per_transfer), "connections per session (1)"},
    {"num_workers", K_POSINT, OFF(num_workers), "engine worker threads (1)"},
    {"post_batch_size", K_BATCH, OFF(post_batch_size), "descriptors per posted batch; -1 = engine's choice"},
    {"transfer_timeout", K_SECONDS, OFF(transfer_timeout_s), "read deadline in seconds (30)"},
    {"defer_timeout", K_SECONDS, OFF(defer_timeout_s), "lease of held blocks in seconds (60)"},
    {"handshake_timeout", K_SECONDS, OFF(handshake_timeout_s), "handshake deadline in seconds (10)"},
    {"peer_backoff", K_SECONDS, OFF(peer_backoff_s),
     "pdlink: after a peer failed, requests fail fast for this long before one retries; doubles per failure (2)"},
    {"peer_backoff_max", K_SECONDS, OFF(peer_backoff_max_s), "pdlink: cap of peer_backoff's doubling (30)"},
    {"consumer_gone_timeout", K_SECONDS, OFF(consumer_gone_timeout_s),
     "pdlink: a producer frees the holds of a consumer unreachable for this long (5)"},
    {"trusted_hosts", K_HOSTS, OFF(trusted_hosts),
     "pdlink: addresses/CIDRs (list or comma-separated string) a decode may dial and a producer serves; "
     "empty = everyone"},
    {"prewarm_peers", K_PREWARM, OFF(prewarm_peers),
     "pdlink: producers a READ decode (consumers a WRITE prefill) handshakes with and maps at start-up, in "
     "the background: a list of "
     "\"host:handshake_port[:tp[:dp]]\" (or one comma-separated string)"},
    {"bind_all", K_BOOL, OFF(bind_all),
     "pdlink: listen on every address instead of host_ip only (false; upstream binds every address)"},
    {"scrub_freed_blocks", K_BOOL, OFF(scrub_freed_blocks),
     "pdlink: zero freed KV blocks on every rank before they are reused (false)"},
    {"auth_key_file", K_STR, OFF(auth_key_file),
     "pdlink: the cluster key file of authenticated mode (CURVE on control sockets, a challenge on data "
     "connections; pdlink peers only); empty = compatible mode"},
};
#undef OFF

static pdl_status_t parse_row(const key_row_t *row, const json_t *v, pdl_connector_config_t *cfg, pdl_error_t *err)
{
    char vb[96];
    long long ll;
    double d;
    char *base = (char *)cfg;
    json_brief(v, vb, sizeof(vb));
    switch (row->kind) {
    case K_STR: {
        if (json_is_null(v))
            return PDL_OK;
        if (!json_is_string(v))
            return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config.%s: expected a string, got %s",
                                 row->name, vb);
        const char *s = json_string_value(v);
        if (strlen(s) > PDL_WIRE_HOST_MAX)
            return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config.%s: longer than %d bytes",
                                 row->name, PDL_WIRE_HOST_MAX);
        /* An empty host_ip falls back to the default, as upstream's resolve_host_ip does. */
        if (s[0] == '\0' && strcmp(row->name, "host_ip") == 0)
            return PDL_OK;
        strcpy(base + row->offset, s);
        return PDL_OK;
    }
    case K_PORT:
    case K_BASE_PORT:
        if (row->kind == K_BASE_PORT && (json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0)))
            return PDL_OK;
        if (!json_to_ll(v, &ll) || ll < 0 || ll > 65535)
            return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config.%s: expected a port 0-65535, got %s",
                                 row->name, vb);
        if (row->kind == K_BASE_PORT && ll == 0)
            return PDL_OK;
        *(int *)(base + row->offset) = (int)ll;
        return PDL_OK;
    case K_BOOL:
        if (json_is_boolean(v)) {
            *(bool *)(base + row->offset) = json_is_true(v);
            return PDL_OK;
        }
        if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) {
            *(bool *)(base + row->offset) = json_integer_value(v) == 1;
            return PDL_OK;
        }
        if (json_is_string(v)) {
            char t[16];
            const char *s = json_string_value(v);
            while (isspace((unsigned char)*s))
                s++;
            snprintf(t, sizeof(t), "%s", s);
            for (size_t n = strlen(t); n > 0 && isspace((unsigned char)t[n - 1]); n--)
                t[n - 1] = '\0';
            if (strcasecmp(t, "true") == 0 || strcmp(t, "1") == 0) {
                *(bool *)(base + row->offset) = true;
                return PDL_OK;
            }
            if (strcasecmp(t, "false") == 0 || strcmp(t, "0") == 0) {
                *(bool *)(base + row->offset) = false;
                return PDL_OK;
            }
        }
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "kv_connector_extra_config.%s: expected true/false, \"true\"/\"false\", \"1\"/\"0\" or 1/0, got %s",
                             row->name, vb);
    case K_BACKEND: {
        if (!json_is_string(v))
            return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config.%s: expected a string, got %s",
                                 row->name, vb);
        const char *s = json_string_value(v);
        if (strcasecmp(s, "rdma") == 0) {
            char why[256];
            cfg->backend = pdl_backend_pick_rdma(why, sizeof(why));
            cfg->backend_mapped_from_rdma = true;
            pdl_info("kv_connector_extra_config.backend \"rdma\": %s", why);
            return PDL_OK;
        }
        if (strcasecmp(s, "xgmi") == 0) {
            cfg->backend = PDL_BACKEND_SHM;
            cfg->backend_mapped_from_rdma = true;
            pdl_info("kv_connector_extra_config.backend \"xgmi\": using pdlink's shm engine (same host)");
            return PDL_OK;
        }
        int b = pdl_backend_parse(s);
        if (b < 0)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "kv_connector_extra_config.%s: unknown backend %s (expected \"tcp\", \"shm\", \"ucx\", \"cuda\", "
                                 "\"rdma\" or \"xgmi\")",
                                 row->name, vb);
        cfg->backend = (pdl_backend_kind_t)b;
        cfg->backend_mapped_from_rdma = false;
        return PDL_OK;
    }
    case K_POSINT:
        if (!json_to_ll(v, &ll) || ll < 1 || ll > 1024)
            return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config.%s: expected an integer 1-1024, got %s",
                                 row->name, vb);
        *(int *)(base + row->offset) = (int)ll;
        return PDL_OK;
    case K_BATCH:
        if (!json_to_ll(v, &ll) || ll == 0 || ll < -1 || ll > 1000000)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "kv_connector_extra_config.%s: expected -1 or a positive integer, got %s", row->name, vb);
        *(int *)(base + row->offset) = (int)ll;
        return PDL_OK;
    case K_PREWARM: {
        size_t n = json_is_array(v) ? json_array_size(v) : 1;
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
            if (!json_is_string(e))
                return pdl_error_set(err, PDL_ERR_INVALID,
                                     "kv_connector_extra_config.%s: expected a list of \"host:port[:tp[:dp]]\" "
                                     "strings or one comma-separated string, got %s", row->name, vb);
            /* One string may hold several entries, comma-separated (as trusted_hosts). */
            const char *p = json_string_value(e);
            char one[PDL_CONNECTOR_HOST_MAX + 48];
            while (*p) {
                size_t len = strcspn(p, ",");
                if (len >= sizeof(one))
                    return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config.%s: entry %.40s... is "
                                         "longer than %zu bytes", row->name, p, sizeof(one) - 1);
                memcpy(one, p, len);
                one[len] = '\0';
                pdl_status_t st = pdl_connector_config_add_prewarm(cfg, one, err);
                if (st != PDL_OK)
                    return pdl_error_prefix(err, st, "kv_connector_extra_config.%s", row->name);
                p += len + (p[len] == ',');
            }
        }
        return PDL_OK;
    }
    case K_HOSTS: {
        /* A JSON list of strings or one comma-separated string; kept as text, checked here. */
        char *out = base + row->offset;
        size_t cap = PDL_CONNECTOR_TRUSTED_MAX + 1, len = 0;
        out[0] = '\0';
        size_t n = json_is_array(v) ? json_array_size(v) : 1;
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
            if (!json_is_string(e))
                return pdl_error_set(err, PDL_ERR_INVALID,
                                     "kv_connector_extra_config.%s: expected a list of addresses/CIDRs or a "
                                     "comma-separated string, got %s", row->name, vb);
            int w = snprintf(out + len, cap - len, "%s%s", len ? "," : "", json_string_value(e));
            if (w < 0 || (size_t)w >= cap - len)
                return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config.%s: longer than %d bytes",
                                     row->name, PDL_CONNECTOR_TRUSTED_MAX);
            len += (size_t)w;
        }
        pdl_cidrs_t l;
        pdl_status_t st = pdl__cidrs_parse(out, &l, err);
        if (st != PDL_OK) {
            pdl_error_prefix(err, st, "kv_connector_extra_config");
            return st;
        }
        pdl__cidrs_free(&l);
        return PDL_OK;
    }
    case K_SECONDS:
        if (!json_to_double(v, &d) || d <= 0 || d > 86400.0 * 365)
            return pdl_error_set(err, PDL_ERR_INVALID,
                                 "kv_connector_extra_config.%s: expected a positive number of seconds, got %s", row->name,
                                 vb);
        *(double *)(base + row->offset) = d;
        return PDL_OK;
    }
    return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config.%s: internal error", row->name);
}

/* Keys upstream or its deployments use that pdlink accepts and ignores without a warning. */
static const char *const k_known_ignored[] = {"recv_abort_timeout", "allow_full_cudagraph", "trusted_remote_hosts", NULL};

static pdl_status_t config_from_extra(const json_t *extra, pdl_connector_config_t *cfg, pdl_error_t *err)
{
    if (cfg == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config: no output");
    if (extra == NULL || json_is_null(extra))
        return PDL_OK;
    if (!json_is_object(extra))
        return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config: expected a JSON object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)extra, key, v) {
        const key_row_t *row = NULL;
        for (size_t i = 0; i < sizeof(k_rows) / sizeof(k_rows[0]); i++)
            if (strcmp(k_rows[i].name, key) == 0)
                row = &k_rows[i];
        if (row == NULL) {
            bool ignored = false;
            for (int i = 0; k_known_ignored[i]; i++)
                ignored |= strcmp(k_known_ignored[i], key) == 0;
            if (ignored)
                pdl_info("kv_connector_extra_config.%s: accepted and ignored by pdlink", key);
            else
                pdl_warn("kv_connector_extra_config: unknown key \"%s\" ignored", key);
            continue;
        }
        pdl_status_t st = parse_row(row, v, cfg, err);
        if (st != PDL_OK)
            return st;
    }
    return PDL_OK;
}

pdl_status_t pdl_connector_config_from_extra(const char *extra_json, pdl_connector_config_t *cfg, pdl_error_t *err)
{
    if (extra_json == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config: no input");
    json_error_t je;
    json_t *extra = json_loads(extra_json, 0, &je);
    if (extra == NULL)
        return pdl_error_set(err, PDL_ERR_PARSE, "kv_connector_extra_config: not JSON: %s (line %d)", je.text, je.line);
    pdl_status_t st = config_from_extra(extra, cfg, err);
    json_decref(extra);
    return st;
}

/* Top-level KVTransferConfig fields of vLLM that pdlink does not use; not worth a warning. */
static const char *const k_transfer_keys[] = {"kv_connector",  "kv_role",        "kv_connector_extra_config",
                                              "kv_rank",       "kv_parallel_size", "kv_buffer_device",
                                              "kv_buffer_size", "kv_ip",          "kv_port",
                                              "engine_id",     "kv_connector_module_path", "kv_load_failure_policy",
                                              NULL};

pdl_status_t pdl_connector_config_parse(const char *json_text, pdl_connector_config_t *cfg, pdl_error_t *err)
{
    if (json_text == NULL || cfg == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "kv-transfer-config: no input");
    pdl_connector_config_defaults(cfg);
    json_error_t je;
    json_t *root = json_loads(json_text, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL)
        return pdl_error_set(err, PDL_ERR_PARSE, "kv-transfer-config: invalid JSON at line %d column %d: %s", je.line,
                             je.column, je.text);
    pdl_status_t st = PDL_OK;
    if (!json_is_object(root)) {
        st = pdl_error_set(err, PDL_ERR_INVALID, "kv-transfer-config: expected a JSON object");
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        bool known = false;
        for (int i = 0; k_transfer_keys[i]; i++)
            known |= strcmp(k_transfer_keys[i], key) == 0;
        if (!known)
            pdl_warn("kv-transfer-config: unknown key \"%s\" ignored", key);
    }
    json_t *conn = json_object_get(root, "kv_connector");
    if (conn && !json_is_null(conn)) {
        if (!json_is_string(conn)) {
            st = pdl_error_set(err, PDL_ERR_INVALID, "kv-transfer-config.kv_connector: expected a string");
            goto out;
        }
        /* PdlinkConnector is pdlink's own vLLM connector (python/pdlink): the same protocol. */
        if (strcmp(json_string_value(conn), "MoRIIOConnector") != 0 &&
            strcmp(json_string_value(conn), "PdlinkConnector") != 0)
            pdl_warn("kv-transfer-config.kv_connector is \"%s\"; pdlink speaks MoRIIOConnector's protocol",
                     json_string_value(conn));
    }
    json_t *role = json_object_get(root, "kv_role");
    if (role && !json_is_null(role)) {
        if (!json_is_string(role)) {
            st = pdl_error_set(err, PDL_ERR_INVALID, "kv-transfer-config.kv_role: expected a string");
            goto out;
        }
        const char *r = json_string_value(role);
        /* Upstream: kv_role == "kv_producer" is the producer, anything else the consumer. */
        if (strcmp(r, "kv_producer") == 0)
            cfg->role = PDL_ROLE_PRODUCER;
        else if (strcmp(r, "kv_consumer") == 0 || strcmp(r, "kv_both") == 0)
            cfg->role = PDL_ROLE_CONSUMER;
        else {
            st = pdl_error_set(err, PDL_ERR_INVALID,
                               "kv-transfer-config.kv_role: \"%s\" is not kv_producer, kv_consumer or kv_both", r);
            goto out;
        }
    }
    st = config_from_extra(json_object_get(root, "kv_connector_extra_config"), cfg, err);
out:
    json_decref(root);
    return st;
}

/* A whole decimal number in [lo, hi] from [s, end); false for anything else (sign, junk, empty). */
static bool parse_int_field(const char *s, const char *end, long lo, long hi, int *out)
{
    if (s >= end || end - s > 6)
        return false;
    long v = 0;
    for (const char *c = s; c < end; c++) {
        if (*c < '0' || *c > '9')
            return false;
        v = v * 10 + (*c - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

pdl_status_t pdl_connector_config_add_prewarm(pdl_connector_config_t *cfg, const char *spec, pdl_error_t *err)
{
    if (cfg == NULL || spec == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "prewarm peer: no input");
    while (isspace((unsigned char)*spec))
        spec++;
    size_t sl = strlen(spec);
    while (sl > 0 && isspace((unsigned char)spec[sl - 1]))
        sl--;
    pdl_prewarm_peer_t pp;
    memset(&pp, 0, sizeof(pp));
    const char *end = spec + sl, *rest;
    size_t hl;
    if (*spec == '[') { /* [IPv6]:port... */
        const char *close = memchr(spec, ']', sl);
        if (close == NULL || close + 1 >= end || close[1] != ':')
            return pdl_error_set(err, PDL_ERR_INVALID, "prewarm peer \"%.80s\": an IPv6 host is written [addr]:port",
                                 spec);
        hl = (size_t)(close - spec - 1);
        memcpy(pp.host, spec + 1, hl < sizeof(pp.host) ? hl : 0);
        rest = close + 2;
    } else {
        const char *colon = memchr(spec, ':', sl);
        if (colon == NULL)
            return pdl_error_set(err, PDL_ERR_INVALID, "prewarm peer \"%.80s\": expected host:handshake_port[:tp[:dp]]",
                                 spec);
        hl = (size_t)(colon - spec);
        memcpy(pp.host, spec, hl < sizeof(pp.host) ? hl : 0);
        rest = colon + 1;
    }
    if (hl == 0 || hl > PDL_CONNECTOR_HOST_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID, "prewarm peer \"%.80s\": the host is empty or longer than %d bytes",
                             spec, PDL_CONNECTOR_HOST_MAX);
    for (size_t i = 0; i < hl; i++) {
        unsigned char c = (unsigned char)pp.host[i];
        if (!isalnum(c) && c != '.' && c != '-' && c != '_' && c != ':' && c != '%')
            return pdl_error_set(err, PDL_ERR_INVALID, "prewarm peer \"%.80s\": character 0x%02x in the host", spec, c);
    }
    /* port, then optional tp and dp, colon-separated */
    const char *f[3] = {rest, NULL, NULL}, *fe[3] = {end, NULL, NULL};
    int nf = 1;
    for (const char *c = rest; c < end; c++) {
        if (*c != ':')
            continue;
        if (nf == 3)
            return pdl_error_set(err, PDL_ERR_INVALID, "prewarm peer \"%.80s\": more than host:port:tp:dp", spec);
        fe[nf - 1] = c;
        f[nf] = c + 1;
        fe[nf] = end;
        nf++;
    }
    if (!parse_int_field(f[0], fe[0], 1, 65535, &pp.handshake_port))
        return pdl_error_set(err, PDL_ERR_INVALID, "prewarm peer \"%.80s\": the handshake port must be 1-65535", spec);
    if (nf > 1 && !parse_int_field(f[1], fe[1], 0, PDL_TOPO_MAX_TP, &pp.tp))
        return pdl_error_set(err, PDL_ERR_INVALID, "prewarm peer \"%.80s\": tp must be 0-%d (0: ours)", spec,
                             PDL_TOPO_MAX_TP);
    if (nf > 2 && !parse_int_field(f[2], fe[2], 0, 1023, &pp.dp))
        return pdl_error_set(err, PDL_ERR_INVALID, "prewarm peer \"%.80s\": dp must be 0-1023", spec);
    for (int i = 0; i < cfg->num_prewarm_peers; i++) {
        const pdl_prewarm_peer_t *q = &cfg->prewarm_peers[i];
        if (strcmp(q->host, pp.host) == 0 && q->handshake_port == pp.handshake_port && q->tp == pp.tp && q->dp == pp.dp)
            return PDL_OK;
    }
    if (cfg->num_prewarm_peers == PDL_CONNECTOR_PREWARM_MAX)
        return pdl_error_set(err, PDL_ERR_INVALID, "prewarm peer \"%.80s\": more than %d producers listed", spec,
                             PDL_CONNECTOR_PREWARM_MAX);
    cfg->prewarm_peers[cfg->num_prewarm_peers++] = pp;
    return PDL_OK;
}

bool pdl__trust_host(const pdl_cidrs_t *trusted, const char *host)
{
    return trusted->n == 0 || pdl__cidrs_match_host(trusted, host);
}

bool pdl__trust_addr(const pdl_cidrs_t *trusted, const char *numeric)
{
    return trusted->n == 0 || pdl__cidrs_match_text(trusted, numeric);
}
