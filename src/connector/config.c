/*
 * config.c -- kv_connector_extra_config / --kv-transfer-config parsing (docs/connector.md#configuration).
 *
 * One table (k_rows) has a row per kv_connector_extra_config key: name, value type, field, default,
 * range and meaning. The defaults, the parser, its error messages (naming the key, what it accepts and
 * the value) and pdl_connector_config_key (what pdlink-node --help-config prints) all read it.
 * Values are taken the way upstream takes them: ports may be JSON integers or numeric strings (upstream
 * calls int(...)), booleans accept true / "true" / "1" / 1 (upstream: str(v).lower().strip() in
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

/*
 * The keys. A row names its key, its value type, the field it fills, its default as text, its range and
 * what it means; the type (k_types) turns a JSON value into the field, stores the row's default and says
 * what it accepts. pdl_connector_config_defaults, the parser, the error messages and pdlink-node
 * --help-config all read these rows, so a key's default and range are written once.
 */
typedef struct key_row key_row_t;

typedef struct key_type {
    const char *name; /* printed by --help-config */
    pdl_status_t (*parse)(const key_row_t *row, const json_t *v, pdl_connector_config_t *cfg, pdl_error_t *err);
    void (*set_default)(const key_row_t *row, pdl_connector_config_t *cfg);
    /* What the row accepts, as error messages and --help-config say it. */
    void (*range)(const key_row_t *row, char *buf, size_t cap);
} key_type_t;

enum {
    /* null, "" and 0 mean the default, as upstream's _set_port_defaults and resolve_host_ip take them. */
    ROW_FALSY_IS_DEFAULT = 1u << 0,
    /* 0 is outside the range even when lo < 0 < hi (post_batch_size: -1 or a positive count). */
    ROW_NOT_ZERO = 1u << 1,
};

struct key_row {
    const char *name;
    const key_type_t *type;
    size_t offset, size; /* the field; the setter types (backend, prewarm_peers) fill their fields by name */
    const char *def;     /* the default as text: what set_default stores and --help-config prints */
    double lo, hi;       /* numbers: the accepted range (seconds: lo exclusive) */
    unsigned flags;
    const char *doc;
};

static void *row_field(const key_row_t *row, pdl_connector_config_t *cfg)
{
    return (char *)cfg + row->offset;
}

/* The one error of a wrong value: the key, what it accepts and what it got. */
static pdl_status_t bad_value(const key_row_t *row, const json_t *v, pdl_error_t *err)
{
    char range[sizeof(((pdl_connector_config_key_t *)0)->range)], got[96];
    row->type->range(row, range, sizeof(range));
    json_brief(v, got, sizeof(got));
    return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config.%s: expected %s, got %s", row->name, range,
                         got);
}

/* -- strings: at most the field's size - 1 bytes; null leaves the field as it is -- */

static void string_default(const key_row_t *row, pdl_connector_config_t *cfg)
{
    snprintf(row_field(row, cfg), row->size, "%s", row->def);
}

static pdl_status_t string_parse(const key_row_t *row, const json_t *v, pdl_connector_config_t *cfg, pdl_error_t *err)
{
    if (json_is_null(v))
        return PDL_OK;
    if (!json_is_string(v) || json_string_length(v) > row->size - 1)
        return bad_value(row, v, err);
    if (json_string_length(v) == 0 && (row->flags & ROW_FALSY_IS_DEFAULT)) {
        string_default(row, cfg);
        return PDL_OK;
    }
    memcpy(row_field(row, cfg), json_string_value(v), json_string_length(v) + 1);
    return PDL_OK;
}

static void string_range(const key_row_t *row, char *buf, size_t cap)
{
    snprintf(buf, cap, "a string of at most %zu bytes%s", row->size - 1,
             (row->flags & ROW_FALSY_IS_DEFAULT) ? "; \"\" = the default" : "");
}

/* -- integers and ports: a JSON integer, an integral real or a numeric string, in [lo, hi] -- */

static void int_default(const key_row_t *row, pdl_connector_config_t *cfg)
{
    *(int *)row_field(row, cfg) = (int)strtol(row->def, NULL, 10);
}

static pdl_status_t int_parse(const key_row_t *row, const json_t *v, pdl_connector_config_t *cfg, pdl_error_t *err)
{
    bool falsy_is_default = (row->flags & ROW_FALSY_IS_DEFAULT) != 0;
    long long ll = 0;
    if (!(falsy_is_default && (json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0))) &&
        (!json_to_ll(v, &ll) || ll < (long long)row->lo || ll > (long long)row->hi ||
         (ll == 0 && (row->flags & ROW_NOT_ZERO))))
        return bad_value(row, v, err);
    if (ll == 0 && falsy_is_default) {
        int_default(row, cfg);
        return PDL_OK;
    }
    *(int *)row_field(row, cfg) = (int)ll;
    return PDL_OK;
}

static void int_range(const key_row_t *row, char *buf, size_t cap)
{
    if (row->flags & ROW_NOT_ZERO)
        snprintf(buf, cap, "%.0f or an integer 1-%.0f", row->lo, row->hi);
    else
        snprintf(buf, cap, "an integer %.0f-%.0f (a number or a numeric string)%s", row->lo, row->hi,
                 (row->flags & ROW_FALSY_IS_DEFAULT) ? "; 0 or \"\" = the default" : "");
}

/* -- seconds: a number or a numeric string, more than lo and at most hi -- */

static void seconds_default(const key_row_t *row, pdl_connector_config_t *cfg)
{
    *(double *)row_field(row, cfg) = strtod(row->def, NULL);
}

static pdl_status_t seconds_parse(const key_row_t *row, const json_t *v, pdl_connector_config_t *cfg,
                                  pdl_error_t *err)
{
    double d;
    if (!json_to_double(v, &d) || d <= row->lo || d > row->hi)
        return bad_value(row, v, err);
    *(double *)row_field(row, cfg) = d;
    return PDL_OK;
}

static void seconds_range(const key_row_t *row, char *buf, size_t cap)
{
    snprintf(buf, cap, "seconds above %.0f and at most %.0f (a number or a numeric string)", row->lo, row->hi);
}

/* -- booleans, in every form upstream's str(v).lower().strip() in ("true", "1") takes, and their opposites -- */

static void bool_default(const key_row_t *row, pdl_connector_config_t *cfg)
{
    *(bool *)row_field(row, cfg) = strcmp(row->def, "true") == 0;
}

static pdl_status_t bool_parse(const key_row_t *row, const json_t *v, pdl_connector_config_t *cfg, pdl_error_t *err)
{
    bool *out = row_field(row, cfg);
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return PDL_OK;
    }
    if (json_is_integer(v) && (json_integer_value(v) == 0 || json_integer_value(v) == 1)) {
        *out = json_integer_value(v) == 1;
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
        if (strcasecmp(t, "true") == 0 || strcmp(t, "1") == 0 || strcasecmp(t, "false") == 0 || strcmp(t, "0") == 0) {
            *out = strcasecmp(t, "true") == 0 || strcmp(t, "1") == 0;
            return PDL_OK;
        }
    }
    return bad_value(row, v, err);
}

static void bool_range(const key_row_t *row, char *buf, size_t cap)
{
    (void)row;
    snprintf(buf, cap, "true/false, \"true\"/\"false\" (any case), \"1\"/\"0\" or 1/0");
}

/* -- backend: sets backend and backend_mapped_from_rdma -- */

static void backend_range(const key_row_t *row, char *buf, size_t cap)
{
    (void)row;
    snprintf(buf, cap, "\"tcp\", \"shm\", \"ucx\", \"cuda\", \"rdma\" or \"xgmi\"");
}

/* No key is upstream's default "rdma", taken as tcp without asking UCX: a config that names no backend
 * starts the same engine on every host. */
static void backend_default(const key_row_t *row, pdl_connector_config_t *cfg)
{
    cfg->backend = (pdl_backend_kind_t)pdl_backend_parse(row->def);
    cfg->backend_mapped_from_rdma = true;
}

static pdl_status_t backend_parse(const key_row_t *row, const json_t *v, pdl_connector_config_t *cfg,
                                  pdl_error_t *err)
{
    if (!json_is_string(v))
        return bad_value(row, v, err);
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
    if (b < 0) {
        char range[sizeof(((pdl_connector_config_key_t *)0)->range)];
        backend_range(row, range, sizeof(range));
        return pdl_error_set(err, PDL_ERR_INVALID,
                             "kv_connector_extra_config.%s: unknown backend \"%.60s\" (expected %s)", row->name, s,
                             range);
    }
    cfg->backend = (pdl_backend_kind_t)b;
    cfg->backend_mapped_from_rdma = false;
    return PDL_OK;
}

/* -- lists: a JSON list of strings or one string of comma-separated entries -- */

static size_t list_len(const json_t *v)
{
    return json_is_array(v) ? json_array_size(v) : 1;
}

static const json_t *list_get(const json_t *v, size_t i)
{
    return json_is_array(v) ? json_array_get(v, i) : v;
}

/* trusted_hosts is kept as text (the engine and the instance parse it again) and checked here. */
static void hosts_default(const key_row_t *row, pdl_connector_config_t *cfg)
{
    string_default(row, cfg);
}

static pdl_status_t hosts_parse(const key_row_t *row, const json_t *v, pdl_connector_config_t *cfg, pdl_error_t *err)
{
    char *out = row_field(row, cfg);
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < list_len(v); i++) {
        const json_t *e = list_get(v, i);
        if (!json_is_string(e))
            return bad_value(row, v, err);
        int w = snprintf(out + len, row->size - len, "%s%s", len ? "," : "", json_string_value(e));
        if (w < 0 || (size_t)w >= row->size - len)
            return bad_value(row, v, err);
        len += (size_t)w;
    }
    pdl_cidrs_t l;
    pdl_status_t st = pdl__cidrs_parse(out, &l, err);
    if (st != PDL_OK)
        return pdl_error_prefix(err, st, "kv_connector_extra_config");
    pdl__cidrs_free(&l);
    return PDL_OK;
}

static void hosts_range(const key_row_t *row, char *buf, size_t cap)
{
    snprintf(buf, cap, "a list of numeric addresses or CIDRs, or one comma- or space-separated string of them, at "
                       "most %zu bytes", row->size - 1);
}

/* prewarm_peers appends to prewarm_peers[] through pdl_connector_config_add_prewarm. */
static void peers_default(const key_row_t *row, pdl_connector_config_t *cfg)
{
    (void)row;
    memset(cfg->prewarm_peers, 0, sizeof(cfg->prewarm_peers));
    cfg->num_prewarm_peers = 0;
}

static pdl_status_t peers_parse(const key_row_t *row, const json_t *v, pdl_connector_config_t *cfg, pdl_error_t *err)
{
    for (size_t i = 0; i < list_len(v); i++) {
        const json_t *e = list_get(v, i);
        if (!json_is_string(e))
            return bad_value(row, v, err);
        const char *p = json_string_value(e);
        char one[PDL_CONNECTOR_HOST_MAX + 48];
        while (*p) {
            size_t len = strcspn(p, ",");
            if (len >= sizeof(one))
                return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config.%s: entry %.40s... is longer "
                                     "than %zu bytes", row->name, p, sizeof(one) - 1);
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

static void peers_range(const key_row_t *row, char *buf, size_t cap)
{
    (void)row;
    snprintf(buf, cap, "a list of \"host:handshake_port[:tp[:dp]]\" strings (IPv6: [addr]:port) or one "
                       "comma-separated string of them, at most %d", PDL_CONNECTOR_PREWARM_MAX);
}

/* kv_integrity: one of pdl_kv_integrity_names, case-insensitive (docs/integrity.md). */
static const char *const k_integrity_names[] = {"off", "sample", "full"};

static void integrity_default(const key_row_t *row, pdl_connector_config_t *cfg)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(row->def, k_integrity_names[i]) == 0)
            cfg->kv_integrity = (pdl_kv_integrity_t)i;
}

static pdl_status_t integrity_parse(const key_row_t *row, const json_t *v, pdl_connector_config_t *cfg,
                                    pdl_error_t *err)
{
    for (int i = 0; json_is_string(v) && i < 3; i++)
        if (strcasecmp(json_string_value(v), k_integrity_names[i]) == 0) {
            cfg->kv_integrity = (pdl_kv_integrity_t)i;
            return PDL_OK;
        }
    return bad_value(row, v, err);
}

static void integrity_range(const key_row_t *row, char *buf, size_t cap)
{
    (void)row;
    snprintf(buf, cap, "\"off\", \"sample\" or \"full\" (any case)");
}

const char *pdl_kv_integrity_name(pdl_kv_integrity_t m)
{
    return (unsigned)m < 3 ? k_integrity_names[m] : "invalid";
}

static const key_type_t t_string = {"string", string_parse, string_default, string_range};
static const key_type_t t_port = {"port", int_parse, int_default, int_range};
static const key_type_t t_int = {"integer", int_parse, int_default, int_range};
static const key_type_t t_seconds = {"seconds", seconds_parse, seconds_default, seconds_range};
static const key_type_t t_bool = {"bool", bool_parse, bool_default, bool_range};
static const key_type_t t_backend = {"backend", backend_parse, backend_default, backend_range};
static const key_type_t t_hosts = {"hosts", hosts_parse, hosts_default, hosts_range};
static const key_type_t t_peers = {"peers", peers_parse, peers_default, peers_range};
static const key_type_t t_integrity = {"integrity", integrity_parse, integrity_default, integrity_range};

#define FIELD(f) offsetof(pdl_connector_config_t, f), sizeof(((pdl_connector_config_t *)0)->f)
#define NO_FIELD 0, 0
#define YEAR_S (86400.0 * 365)
static const key_row_t k_rows[] = {
    {"host_ip", &t_string, FIELD(host_ip), "127.0.0.1", 0, 0, ROW_FALSY_IS_DEFAULT,
     "the address advertised to peers, and the one the ports listen on (see bind_all)"},
    {"proxy_ip", &t_string, FIELD(proxy_ip), "", 0, 0, 0,
     "the router's discovery address; \"\" = no discovery ping"},
    {"proxy_ping_port", &t_port, FIELD(proxy_ping_port), "0", 0, 65535, 0, "the router's discovery port"},
    {"http_port", &t_port, FIELD(http_port), "0", 0, 65535, 0,
     "this instance's HTTP port, advertised in the discovery ping (pdlink-node: 0 = the port it bound)"},
    {"handshake_port", &t_port, FIELD(handshake_port), "6301", 0, 65535, ROW_FALSY_IS_DEFAULT,
     "the base handshake port; rank r of DP rank d listens on base + d*tp_size + r"},
    {"notify_port", &t_port, FIELD(notify_port), "61005", 0, 65535, ROW_FALSY_IS_DEFAULT,
     "the base notify port, offset like handshake_port"},
    {"read_mode", &t_bool, FIELD(read_mode), "false", 0, 0, 0,
     "true: READ (the decode pulls from the prefill); false: WRITE (the prefill pushes to the decode)"},
    {"backend", &t_backend, NO_FIELD, "tcp", 0, 0, 0,
     "the transfer engine: tcp, shm (one host), ucx, cuda (GPU KV of one host, CUDA IPC); \"rdma\" (upstream's "
     "default) selects ucx when UCX offers an rc, dc or ud verbs transport, else tcp (always tcp without UCX in "
     "the build); \"xgmi\" selects shm; both are logged with the reason. No key: tcp, UCX not consulted"},
    {"qp_per_transfer", &t_int, FIELD(qp_per_transfer), "1", 1, 1024, 0, "connections per session"},
    {"num_workers", &t_int, FIELD(num_workers), "1", 1, 1024, 0, "engine worker threads"},
    {"post_batch_size", &t_int, FIELD(post_batch_size), "-1", -1, 1000000, ROW_NOT_ZERO,
     "descriptors per posted batch; -1 = the engine's choice"},
    {"transfer_timeout", &t_seconds, FIELD(transfer_timeout_s), "30", 0, YEAR_S, 0,
     "a transfer's deadline: a pull or push waits this long for what it posted, a WRITE receive for its "
     "write_done messages"},
    {"defer_timeout", &t_seconds, FIELD(defer_timeout_s), "60", 0, YEAR_S, 0,
     "the lease of held blocks: a producer rank frees a hold this long after it took it unless released (a "
     "keepalive extends it); parked early releases and remote_blocks are dropped this old"},
    {"handshake_timeout", &t_seconds, FIELD(handshake_timeout_s), "10", 0, YEAR_S, 0, "a handshake's deadline"},
    {"peer_backoff", &t_seconds, FIELD(peer_backoff_s), "2", 0, YEAR_S, 0,
     "pdlink: after a peer failed, requests to it fail at once for this long before one retries; doubles per "
     "consecutive failure"},
    {"peer_backoff_max", &t_seconds, FIELD(peer_backoff_max_s), "30", 0, YEAR_S, 0,
     "pdlink: the cap of peer_backoff's doubling"},
    {"consumer_gone_timeout", &t_seconds, FIELD(consumer_gone_timeout_s), "5", 0, YEAR_S, 0,
     "pdlink: a producer frees the holds of a consumer unreachable this long (refused twice: sooner)"},
    {"trusted_hosts", &t_hosts, FIELD(trusted_hosts), "", 0, 0, 0,
     "pdlink: the hosts a decode may dial and a producer serves; \"\" = everyone"},
    {"prewarm_peers", &t_peers, NO_FIELD, "", 0, 0, 0,
     "pdlink: the producer instances a READ decode (the consumer instances a WRITE prefill) handshakes with and "
     "maps at start-up, in the background; port is the remote's base handshake port, tp its TP size (omitted or "
     "0: ours), dp its DP rank (0)"},
    {"bind_all", &t_bool, FIELD(bind_all), "false", 0, 0, 0,
     "pdlink: true: the handshake, notify and data ports listen on every address instead of host_ip only "
     "(upstream binds every address)"},
    {"scrub_freed_blocks", &t_bool, FIELD(scrub_freed_blocks), "false", 0, 0, 0,
     "pdlink: true: zero a block's bytes on every rank before it goes back to the allocator, so freed blocks do "
     "not keep earlier prompts' KV"},
    {"kv_integrity", &t_integrity, FIELD(kv_integrity), "off", 0, 0, 0,
     "pdlink: KV digests (XXH3 per layer, block and head) checked by the consumer over what landed, READ mode: "
     "off; sample (one block and layer in 16 per transfer); full (every piece). A mismatch fails the transfer"},
    {"auth_key_file", &t_string, FIELD(auth_key_file), "", 0, 0, 0,
     "pdlink: the cluster key file of authenticated mode (CURVE on control sockets, a challenge on data "
     "connections; pdlink peers only); \"\" = compatible mode"},
};
#undef YEAR_S
#undef NO_FIELD
#undef FIELD
#define NROWS (sizeof(k_rows) / sizeof(k_rows[0]))

void pdl_connector_config_defaults(pdl_connector_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->role = PDL_ROLE_CONSUMER;
    for (size_t i = 0; i < NROWS; i++)
        k_rows[i].type->set_default(&k_rows[i], cfg);
}

bool pdl_connector_config_key(size_t i, pdl_connector_config_key_t *key)
{
    if (i >= NROWS || key == NULL)
        return false;
    const key_row_t *row = &k_rows[i];
    key->name = row->name;
    key->type = row->type->name;
    key->def = row->def;
    row->type->range(row, key->range, sizeof(key->range));
    key->doc = row->doc;
    return true;
}

static const key_row_t *row_find(const char *name)
{
    for (size_t i = 0; i < NROWS; i++)
        if (strcmp(k_rows[i].name, name) == 0)
            return &k_rows[i];
    return NULL;
}
/* Keys upstream or its deployments use that pdlink accepts and ignores without a warning. */
static const char *const k_known_ignored[] = {"recv_abort_timeout", "allow_full_cudagraph", "trusted_remote_hosts", NULL};

/* Levenshtein distance of a and b; a name of 64 bytes or more is "far" (64): no key is that long. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), prev[64], cur[64];
    if (la >= 64 || lb >= 64)
        return 64;
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]), del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(prev));
    }
    return prev[lb];
}

/* The key (of the table or the known-ignored list) nearest to an unknown one, or NULL when none is near
 * enough to be what was meant: at most a third of its letters changed, and at least 1 allowed. */
static const char *nearest_key(const char *unknown)
{
    const char *best = NULL;
    size_t best_d = strlen(unknown) / 3 + 1;
    for (size_t i = 0; i < NROWS; i++) {
        size_t d = edit_distance(unknown, k_rows[i].name);
        if (d < best_d)
            best = k_rows[i].name, best_d = d;
    }
    for (int i = 0; k_known_ignored[i]; i++) {
        size_t d = edit_distance(unknown, k_known_ignored[i]);
        if (d < best_d)
            best = k_known_ignored[i], best_d = d;
    }
    return best;
}

/* An unknown key: a warning for the lenient parsers (a running pdlink-node keeps its old behaviour), an
 * error with the nearest key for the strict one (pdl_connector_config_check), which runs before anything
 * is started so a typo cannot silently become a default. */
static pdl_status_t unknown_key(const char *key, bool strict, pdl_error_t *err)
{
    for (int i = 0; k_known_ignored[i]; i++)
        if (strcmp(k_known_ignored[i], key) == 0) {
            pdl_info("kv_connector_extra_config.%s: accepted and ignored by pdlink", key);
            return PDL_OK;
        }
    if (!strict) {
        pdl_warn("kv_connector_extra_config: unknown key \"%s\" ignored", key);
        return PDL_OK;
    }
    const char *near = nearest_key(key);
    if (near)
        return pdl_error_set(err, PDL_ERR_INVALID, "kv_connector_extra_config: unknown key \"%.80s\" (did you mean \"%s\"?)",
                             key, near);
    return pdl_error_set(err, PDL_ERR_INVALID,
                         "kv_connector_extra_config: unknown key \"%.80s\" (pdlink-node --help-config lists the keys)", key);
}

static pdl_status_t config_from_extra(const json_t *extra, pdl_connector_config_t *cfg, bool strict, pdl_error_t *err)
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
        const key_row_t *row = row_find(key);
        pdl_status_t st = row ? row->type->parse(row, v, cfg, err) : unknown_key(key, strict, err);
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
    pdl_status_t st = config_from_extra(extra, cfg, false, err);
    json_decref(extra);
    return st;
}

/* Top-level KVTransferConfig fields of vLLM that pdlink does not use; not worth a warning. */
static const char *const k_transfer_keys[] = {"kv_connector",  "kv_role",        "kv_connector_extra_config",
                                              "kv_rank",       "kv_parallel_size", "kv_buffer_device",
                                              "kv_buffer_size", "kv_ip",          "kv_port",
                                              "engine_id",     "kv_connector_module_path", "kv_load_failure_policy",
                                              NULL};

static pdl_status_t config_parse(const char *json_text, pdl_connector_config_t *cfg, bool strict, pdl_error_t *err)
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
    st = config_from_extra(json_object_get(root, "kv_connector_extra_config"), cfg, strict, err);
out:
    json_decref(root);
    return st;
}

pdl_status_t pdl_connector_config_parse(const char *json_text, pdl_connector_config_t *cfg, pdl_error_t *err)
{
    return config_parse(json_text, cfg, false, err);
}

pdl_status_t pdl_connector_config_check(const char *json_text, pdl_connector_config_t *cfg, pdl_error_t *err)
{
    return config_parse(json_text, cfg, true, err);
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
