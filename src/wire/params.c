/*
 * params.c -- vLLM's kv_transfer_params JSON object ↔ pdl_kv_params_t
 * (docs/protocol.md#kv_transfer_params).
 *
 * Parsing reads the keys pdlink uses and ignores the rest (routers add their own). JSON null counts as
 * absent for every key, since routers send `remote_engine_id: null` and `remote_block_ids: null` on the
 * first leg. Everything else is type-checked without coercion: a port sent as "6301" or 6301.0 is an
 * error naming `kv_transfer_params.<key>`, not a guess.
 *
 * The public functions take and give JSON text (pdlink/params.h); the connector and the programs, which
 * already hold the request's JSON tree, use the jansson forms (wire/params_json.h) underneath them.
 *
 * to_json builds what a prefill returns in READ mode: do_remote_prefill true, do_remote_decode false,
 * remote_block_ids, remote_engine_id, remote_host, remote_handshake_port, remote_notify_port,
 * remote_dp_size, tp_size (the prefill's TP) and the echoed transfer_id; remote_dp_rank is added when
 * set. It never writes remote_tp_size: a router forwards these params to the decode, and a value copied
 * from the request the prefill received (the decode's own TP) would be stale. The consumer reads
 * tp_size first anyway (pdl_kv_params_peer_tp, as upstream MoRIIO does).
 */
#include "wire/params_json.h"

#include <stdlib.h>
#include <string.h>

#include "wire/mp.h"

#define PCTX "kv_transfer_params"

void pdl_kv_params_init(pdl_kv_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->remote_dp_size = 1;
    p->remote_dp_rank = -1;
}

void pdl_kv_params_clear(pdl_kv_params_t *p)
{
    if (p == NULL)
        return;
    free(p->remote_block_ids);
    p->remote_block_ids = NULL;
    p->num_remote_blocks = 0;
    p->has_remote_block_ids = false;
}

static const char *json_kind(const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

/* The value of `key`, or NULL when absent or null. */
static const json_t *get(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return (v == NULL || json_is_null(v)) ? NULL : v;
}

static pdl_status_t get_bool(const json_t *obj, const char *key, bool *out, pdl_error_t *err)
{
    const json_t *v = get(obj, key);
    if (v == NULL)
        return PDL_OK;
    if (!json_is_boolean(v))
        return pdl_error_set(err, PDL_ERR_PARSE, PCTX ".%s: expected a boolean, got %s", key, json_kind(v));
    *out = json_is_true(v);
    return PDL_OK;
}

static pdl_status_t get_int(const json_t *obj, const char *key, json_int_t min, json_int_t max, int *out,
                            pdl_error_t *err)
{
    const json_t *v = get(obj, key);
    if (v == NULL)
        return PDL_OK;
    if (!json_is_integer(v))
        return pdl_error_set(err, PDL_ERR_PARSE, PCTX ".%s: expected an integer, got %s", key, json_kind(v));
    json_int_t x = json_integer_value(v);
    if (x < min || x > max)
        return pdl_error_set(err, PDL_ERR_PARSE, PCTX ".%s: must be in %lld..%lld, got %lld", key, (long long)min,
                             (long long)max, (long long)x);
    *out = (int)x;
    return PDL_OK;
}

static pdl_status_t get_str(const json_t *obj, const char *key, char *dst, size_t cap, pdl_error_t *err)
{
    const json_t *v = get(obj, key);
    if (v == NULL)
        return PDL_OK;
    if (!json_is_string(v))
        return pdl_error_set(err, PDL_ERR_PARSE, PCTX ".%s: expected a string, got %s", key, json_kind(v));
    size_t n = json_string_length(v);
    const char *s = json_string_value(v);
    if (n >= cap)
        return pdl_error_set(err, PDL_ERR_PARSE, PCTX ".%s: %zu bytes, the limit is %zu", key, n, cap - 1);
    if (memchr(s, '\0', n) != NULL)
        return pdl_error_set(err, PDL_ERR_PARSE, PCTX ".%s: contains a NUL character", key);
    memcpy(dst, s, n);
    dst[n] = '\0';
    return PDL_OK;
}

static pdl_status_t get_blocks(const json_t *obj, pdl_kv_params_t *out, pdl_error_t *err)
{
    const json_t *v = get(obj, "remote_block_ids");
    if (v == NULL)
        return PDL_OK;
    if (!json_is_array(v))
        return pdl_error_set(err, PDL_ERR_PARSE, PCTX ".remote_block_ids: expected an array of block ids, got %s",
                             json_kind(v));
    size_t n = json_array_size(v);
    if (n > PDL_WIRE_MAX_BLOCKS)
        return pdl_error_set(err, PDL_ERR_PARSE, PCTX ".remote_block_ids: %zu entries, the limit is %d", n,
                             PDL_WIRE_MAX_BLOCKS);
    uint32_t *ids = malloc((n > 0 ? n : 1) * sizeof(*ids));
    if (ids == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, PCTX ".remote_block_ids: out of memory for %zu ids", n);
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        if (!json_is_integer(e)) {
            free(ids);
            return pdl_error_set(err, PDL_ERR_PARSE, PCTX ".remote_block_ids[%zu]: expected a non-negative integer, got %s",
                                 i, json_kind(e));
        }
        json_int_t x = json_integer_value(e);
        if (x < 0 || x > (json_int_t)UINT32_MAX) {
            free(ids);
            return pdl_error_set(err, PDL_ERR_PARSE, PCTX ".remote_block_ids[%zu]: must be in 0..%u, got %lld", i,
                                 (unsigned)UINT32_MAX, (long long)x);
        }
        ids[i] = (uint32_t)x;
    }
    out->remote_block_ids = ids;
    out->num_remote_blocks = n;
    out->has_remote_block_ids = true;
    return PDL_OK;
}

pdl_status_t pdl_kv_params_from_json(const json_t *obj, pdl_kv_params_t *out, pdl_error_t *err)
{
    if (out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, PCTX ": NULL output");
    pdl_kv_params_init(out);
    if (obj == NULL || json_is_null(obj))
        return PDL_OK;
    if (!json_is_object(obj))
        return pdl_error_set(err, PDL_ERR_PARSE, PCTX ": expected an object, got %s", json_kind(obj));

    pdl_status_t st = get_bool(obj, "do_remote_prefill", &out->do_remote_prefill, err);
    if (st == PDL_OK)
        st = get_bool(obj, "do_remote_decode", &out->do_remote_decode, err);
    if (st == PDL_OK)
        st = get_str(obj, "transfer_id", out->transfer_id, sizeof(out->transfer_id), err);
    if (st == PDL_OK)
        st = get_str(obj, "remote_engine_id", out->remote_engine_id, sizeof(out->remote_engine_id), err);
    if (st == PDL_OK)
        st = get_str(obj, "remote_host", out->remote_host, sizeof(out->remote_host), err);
    if (st == PDL_OK)
        st = get_int(obj, "remote_handshake_port", 1, 65535, &out->remote_handshake_port, err);
    if (st == PDL_OK)
        st = get_int(obj, "remote_notify_port", 1, 65535, &out->remote_notify_port, err);
    if (st == PDL_OK)
        st = get_int(obj, "remote_dp_size", 1, PDL_WIRE_MAX_TP, &out->remote_dp_size, err);
    if (st == PDL_OK)
        st = get_int(obj, "remote_dp_rank", 0, PDL_WIRE_MAX_TP - 1, &out->remote_dp_rank, err);
    if (st == PDL_OK)
        st = get_int(obj, "remote_tp_size", 1, PDL_WIRE_MAX_TP, &out->remote_tp_size, err);
    if (st == PDL_OK)
        st = get_int(obj, "tp_size", 1, PDL_WIRE_MAX_TP, &out->tp_size, err);
    if (st == PDL_OK)
        st = get_blocks(obj, out, err);
    if (st != PDL_OK) {
        pdl_kv_params_clear(out);
        pdl_kv_params_init(out);
    }
    return st;
}

/* json_object_set_new that remembers a failure (it also consumes `v` on failure). */
static void put(json_t *o, const char *key, json_t *v, bool *ok)
{
    if (v == NULL || json_object_set_new(o, key, v) != 0)
        *ok = false;
}

static json_t *str_or_null(const char *s) { return s[0] != '\0' ? json_string(s) : json_null(); }
static json_t *int_or_null(int v, int absent) { return v != absent ? json_integer(v) : json_null(); }

json_t *pdl_kv_params_to_json(const pdl_kv_params_t *p)
{
    if (p == NULL)
        return NULL;
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    bool ok = true;
    put(o, "do_remote_prefill", json_true(), &ok);
    put(o, "do_remote_decode", json_false(), &ok);
    json_t *ids = json_array();
    for (size_t i = 0; ids != NULL && i < p->num_remote_blocks; i++)
        if (json_array_append_new(ids, json_integer(p->remote_block_ids[i])) != 0)
            ok = false;
    put(o, "remote_block_ids", ids, &ok);
    put(o, "remote_engine_id", str_or_null(p->remote_engine_id), &ok);
    put(o, "remote_host", str_or_null(p->remote_host), &ok);
    put(o, "remote_handshake_port", int_or_null(p->remote_handshake_port, 0), &ok);
    put(o, "remote_notify_port", int_or_null(p->remote_notify_port, 0), &ok);
    put(o, "remote_dp_size", json_integer(p->remote_dp_size > 0 ? p->remote_dp_size : 1), &ok);
    put(o, "tp_size", int_or_null(p->tp_size, 0), &ok);
    if (p->transfer_id[0] != '\0')
        put(o, "transfer_id", json_string(p->transfer_id), &ok);
    if (p->remote_dp_rank >= 0)
        put(o, "remote_dp_rank", json_integer(p->remote_dp_rank), &ok);
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}

pdl_status_t pdl_kv_params_parse(const char *json_text, pdl_kv_params_t *out, pdl_error_t *err)
{
    if (out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, PCTX ": NULL output");
    if (json_text == NULL || json_text[0] == '\0') {
        pdl_kv_params_init(out);
        return PDL_OK;
    }
    json_error_t je;
    json_t *j = json_loads(json_text, JSON_DECODE_ANY, &je);
    if (j == NULL) {
        pdl_kv_params_init(out);
        return pdl_error_set(err, PDL_ERR_PARSE, PCTX ": invalid JSON: %s", je.text);
    }
    pdl_status_t st = pdl_kv_params_from_json(j, out, err);
    json_decref(j);
    return st;
}

char *pdl_kv_params_format(const pdl_kv_params_t *p)
{
    json_t *j = pdl_kv_params_to_json(p);
    if (j == NULL)
        return NULL;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

int pdl_kv_params_peer_tp(const pdl_kv_params_t *p, int local_tp, bool *disagree)
{
    /* Upstream MoRIIO's request metadata: tp_size if present, else remote_tp_size, else 1. tp_size is
     * what the prefill itself reported in its READ-mode return, so it wins over a remote_tp_size a
     * router added or left stale; falling back to 1 rather than our own TP is upstream's choice too,
     * and keeps a pdlink peer and an upstream peer on the same ranks for the same params. local_tp
     * decides nothing: it is part of the public signature, which callers already use. */
    (void)local_tp;
    if (disagree != NULL)
        *disagree = p->remote_tp_size > 0 && p->tp_size > 0 && p->remote_tp_size != p->tp_size;
    if (p->tp_size > 0)
        return p->tp_size;
    if (p->remote_tp_size > 0)
        return p->remote_tp_size;
    return 1;
}
