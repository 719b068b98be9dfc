/*
 * registration.c -- the discovery registration every instance's rank 0 sends to the router every 3 s
 * (docs/protocol.md#discovery-pings).
 *
 * Current vLLM (G2) sends {type "P"|"D", http_address "ip:port", zmq_address "host:..,handshake:..,
 * notify:..", dp_size, tp_size, transfer_mode "READ"|"WRITE"}; the encoder writes exactly that, in that
 * key order, so the bytes equal msgpack-python's. The decoder also accepts the original MoRIIO format
 * (G1): {type "register", role, index, request_address "http://ip:port/v1/completions", handshake_port,
 * notify_port, dp_size, tp_size, transfer_mode}, from which it derives http_address and zmq_address and
 * sets is_g1. G1's keep-alive {type "HELLO"} carries nothing and gets PDL_ERR_UNSUPPORTED, so a router
 * can skip it without counting it as malformed. All six G2 keys are required, as the Rust router
 * requires them in MoRIIO mode; transfer_mode is case-sensitive like there. Addresses are validated
 * because the router puts them into URLs and request ids.
 */
#include "pdlink/wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "wire/mp.h"

#define REG_CTX "registration"

enum {
    R_TYPE, R_HTTP, R_ZMQ, R_DP, R_TP, R_MODE, R_ROLE, R_REQADDR, R_HS_PORT, R_NT_PORT, R_COUNT
};
static const char *const reg_keys[R_COUNT] = {
    "type", "http_address", "zmq_address", "dp_size", "tp_size", "transfer_mode",
    "role", "request_address", "handshake_port", "notify_port",
};

bool pdl_registration_equal(const pdl_registration_t *a, const pdl_registration_t *b)
{
    return a->type == b->type && strcmp(a->http_address, b->http_address) == 0 &&
           strcmp(a->zmq_address, b->zmq_address) == 0 && a->dp_size == b->dp_size && a->tp_size == b->tp_size &&
           a->write_mode == b->write_mode;
}

/* "host:port" with a non-empty host of name/IP characters (IPv6 in brackets) and a port in 1..65535. */
static bool http_address_ok(const char *s, size_t n)
{
    if (n < 3)
        return false;
    const char *colon = NULL;
    for (size_t i = n; i-- > 0;)
        if (s[i] == ':') {
            colon = s + i;
            break;
        }
    if (colon == NULL || colon == s)
        return false;
    size_t hl = (size_t)(colon - s), pl = n - hl - 1;
    if (pl == 0 || pl > 5)
        return false;
    int port = 0;
    for (size_t i = 0; i < pl; i++) {
        if (colon[1 + i] < '0' || colon[1 + i] > '9')
            return false;
        port = port * 10 + (colon[1 + i] - '0');
    }
    if (port < 1 || port > 65535)
        return false;
    bool bracket = s[0] == '[';
    if (bracket && (hl < 3 || s[hl - 1] != ']'))
        return false;
    for (size_t i = bracket ? 1 : 0; i < (bracket ? hl - 1 : hl); i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                  c == '-' || c == '_' || (bracket && (c == ':' || c == '%'));
        if (!ok)
            return false;
    }
    return true;
}

static pdl_status_t get_role(const msgpack_object *o, const char *key, char *out, pdl_error_t *err)
{
    const char *s;
    size_t n;
    if (!pdl__mp_token(o, &s, &n))
        return pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": %s is %s, expected \"P\" or \"D\"", key, pdl__mp_kind(o));
    if (n != 1 || (s[0] != 'P' && s[0] != 'D'))
        return pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": %s must be \"P\" or \"D\"", key);
    *out = s[0];
    return PDL_OK;
}

static pdl_status_t get_mode(const msgpack_object *o, bool *write_mode, pdl_error_t *err)
{
    const char *s;
    size_t n;
    if (!pdl__mp_token(o, &s, &n))
        return pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": transfer_mode is %s, expected \"READ\" or \"WRITE\"",
                             pdl__mp_kind(o));
    if (n == 4 && memcmp(s, "READ", 4) == 0)
        *write_mode = false;
    else if (n == 5 && memcmp(s, "WRITE", 5) == 0)
        *write_mode = true;
    else
        return pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": transfer_mode must be \"READ\" or \"WRITE\" (case-sensitive)");
    return PDL_OK;
}

static pdl_status_t decode_g2(const msgpack_object *const *v, pdl_registration_t *out, pdl_error_t *err)
{
    for (int k = R_HTTP; k <= R_MODE; k++)
        if (v[k] == NULL)
            return pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": %s is missing", reg_keys[k]);
    pdl_status_t st = pdl__mp_str(v[R_HTTP], REG_CTX, "http_address", out->http_address, sizeof(out->http_address),
                                  false, err);
    if (st == PDL_OK && !http_address_ok(out->http_address, strlen(out->http_address)))
        st = pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": http_address \"%.64s\" is not host:port", out->http_address);
    if (st == PDL_OK)
        st = pdl__mp_str(v[R_ZMQ], REG_CTX, "zmq_address", out->zmq_address, sizeof(out->zmq_address), false, err);
    pdl_zmq_addr_t za;
    if (st == PDL_OK)
        st = pdl__zmq_parse_n(out->zmq_address, strlen(out->zmq_address), REG_CTX, &za, err);
    if (st == PDL_OK)
        st = pdl__mp_int(v[R_DP], REG_CTX, "dp_size", 1, PDL_WIRE_MAX_TP, &out->dp_size, err);
    if (st == PDL_OK)
        st = pdl__mp_int(v[R_TP], REG_CTX, "tp_size", 1, PDL_WIRE_MAX_TP, &out->tp_size, err);
    if (st == PDL_OK)
        st = get_mode(v[R_MODE], &out->write_mode, err);
    return st;
}

static pdl_status_t decode_g1(const msgpack_object *const *v, pdl_registration_t *out, pdl_error_t *err)
{
    const int need[] = {R_ROLE, R_REQADDR, R_HS_PORT, R_NT_PORT, R_MODE};
    for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++)
        if (v[need[i]] == NULL)
            return pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": G1 %s is missing", reg_keys[need[i]]);
    out->is_g1 = true;
    pdl_status_t st = get_role(v[R_ROLE], "role", &out->type, err);
    char url[PDL_WIRE_HOST_MAX + 256];
    if (st == PDL_OK)
        st = pdl__mp_str(v[R_REQADDR], REG_CTX, "request_address", url, sizeof(url), false, err);
    int64_t hs = 0, nt = 0;
    if (st == PDL_OK)
        st = pdl__mp_int(v[R_HS_PORT], REG_CTX, "handshake_port", 1, 65535, &hs, err);
    if (st == PDL_OK)
        st = pdl__mp_int(v[R_NT_PORT], REG_CTX, "notify_port", 1, 65535, &nt, err);
    out->dp_size = out->tp_size = 1; /* the oldest senders may leave the sizes out */
    if (st == PDL_OK && v[R_DP] != NULL)
        st = pdl__mp_int(v[R_DP], REG_CTX, "dp_size", 1, PDL_WIRE_MAX_TP, &out->dp_size, err);
    if (st == PDL_OK && v[R_TP] != NULL)
        st = pdl__mp_int(v[R_TP], REG_CTX, "tp_size", 1, PDL_WIRE_MAX_TP, &out->tp_size, err);
    if (st == PDL_OK)
        st = get_mode(v[R_MODE], &out->write_mode, err);
    if (st != PDL_OK)
        return st;

    /* "http://IP:PORT/v1/completions" → "IP:PORT" */
    const char *hp = url;
    if (strncmp(hp, "http://", 7) == 0)
        hp += 7;
    else if (strncmp(hp, "https://", 8) == 0)
        hp += 8;
    size_t hl = strcspn(hp, "/");
    if (hl >= sizeof(out->http_address) || !http_address_ok(hp, hl))
        return pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": request_address \"%.64s\" has no host:port", url);
    memcpy(out->http_address, hp, hl);
    out->http_address[hl] = '\0';
    const char *colon = strrchr(out->http_address, ':');
    const char *host = out->http_address;
    size_t host_len = (size_t)(colon - host);
    if (host[0] == '[') /* IPv6 literal: zmq_address carries it without brackets */
        host++, host_len -= 2;
    int n = snprintf(out->zmq_address, sizeof(out->zmq_address), "host:%.*s,handshake:%d,notify:%d", (int)host_len,
                     host, (int)hs, (int)nt);
    if (n < 0 || (size_t)n >= sizeof(out->zmq_address))
        return pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": request_address host too long");
    pdl_zmq_addr_t za;
    return pdl__zmq_parse_n(out->zmq_address, (size_t)n, REG_CTX, &za, err);
}

pdl_status_t pdl_wire_decode_registration(const void *buf, size_t len, pdl_registration_t *out, pdl_error_t *err)
{
    memset(out, 0, sizeof(*out));
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    pdl_status_t st = pdl__mp_unpack(buf, len, 1024, REG_CTX, &u, err);
    if (st != PDL_OK)
        goto done;
    const msgpack_object *map = &u.data;
    if (map->type != MSGPACK_OBJECT_MAP) {
        st = pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": payload is %s, expected a map", pdl__mp_kind(map));
        goto done;
    }
    const msgpack_object *v[R_COUNT] = {0};
    for (uint32_t i = 0; i < map->via.map.size && st == PDL_OK; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        for (int k = 0; k < R_COUNT; k++) {
            if (!pdl__mp_key_is(&kv->key, reg_keys[k]))
                continue;
            if (v[k] != NULL)
                st = pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": duplicate key %s", reg_keys[k]);
            v[k] = &kv->val;
            break;
        }
    }
    if (st != PDL_OK)
        goto done;
    if (v[R_TYPE] == NULL) {
        st = pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": type is missing");
        goto done;
    }
    const char *t;
    size_t tn;
    if (!pdl__mp_token(v[R_TYPE], &t, &tn)) {
        st = pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": type is %s, expected a string", pdl__mp_kind(v[R_TYPE]));
    } else if (tn == 1 && (t[0] == 'P' || t[0] == 'D')) {
        out->type = t[0];
        st = decode_g2(v, out, err);
    } else if (tn == 8 && memcmp(t, "register", 8) == 0) {
        st = decode_g1(v, out, err);
    } else if (tn == 5 && memcmp(t, "HELLO", 5) == 0) {
        st = pdl_error_set(err, PDL_ERR_UNSUPPORTED, REG_CTX ": G1 HELLO carries no registration (ignore it)");
    } else {
        st = pdl_error_set(err, PDL_ERR_PARSE, REG_CTX ": unknown type (expected \"P\", \"D\" or \"register\")");
    }
done:
    msgpack_unpacked_destroy(&u);
    if (st != PDL_OK)
        memset(out, 0, sizeof(*out));
    return st;
}

pdl_status_t pdl_wire_encode_registration(const pdl_registration_t *r, pdl_bytes_t *out, pdl_error_t *err)
{
    if (r == NULL || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, REG_CTX " encode: NULL argument");
    out->data = NULL;
    out->len = 0;
    if (r->type != 'P' && r->type != 'D')
        return pdl_error_set(err, PDL_ERR_INVALID, REG_CTX ": type must be 'P' or 'D'");
    size_t hl = strnlen(r->http_address, sizeof(r->http_address));
    if (hl >= sizeof(r->http_address) || !http_address_ok(r->http_address, hl))
        return pdl_error_set(err, PDL_ERR_INVALID, REG_CTX ": http_address \"%.64s\" is not host:port",
                             hl < sizeof(r->http_address) ? r->http_address : "");
    size_t zl = strnlen(r->zmq_address, sizeof(r->zmq_address));
    pdl_zmq_addr_t za;
    if (zl >= sizeof(r->zmq_address))
        return pdl_error_set(err, PDL_ERR_INVALID, REG_CTX ": zmq_address is not NUL-terminated");
    if (pdl__zmq_parse_n(r->zmq_address, zl, REG_CTX, &za, err) != PDL_OK) {
        if (err != NULL) /* keep the parser's message; a bad argument is not malformed input */
            err->status = PDL_ERR_INVALID;
        return PDL_ERR_INVALID;
    }
    if (r->dp_size < 1 || r->dp_size > PDL_WIRE_MAX_TP || r->tp_size < 1 || r->tp_size > PDL_WIRE_MAX_TP)
        return pdl_error_set(err, PDL_ERR_INVALID, REG_CTX ": dp_size %" PRId64 " and tp_size %" PRId64
                             " must be in [1, %d]", r->dp_size, r->tp_size, PDL_WIRE_MAX_TP);
    char type[2] = {r->type, '\0'};
    pdl__mp_enc_t e;
    pdl__enc_init(&e);
    pdl__enc_map(&e, 6);
    pdl__enc_str(&e, "type");
    pdl__enc_str(&e, type);
    pdl__enc_str(&e, "http_address");
    pdl__enc_str(&e, r->http_address);
    pdl__enc_str(&e, "zmq_address");
    pdl__enc_str(&e, r->zmq_address);
    pdl__enc_str(&e, "dp_size");
    pdl__enc_int(&e, r->dp_size);
    pdl__enc_str(&e, "tp_size");
    pdl__enc_int(&e, r->tp_size);
    pdl__enc_str(&e, "transfer_mode");
    pdl__enc_str(&e, r->write_mode ? "WRITE" : "READ");
    return pdl__enc_finish(&e, REG_CTX, out, err);
}
