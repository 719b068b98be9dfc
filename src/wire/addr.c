/*
 * addr.c -- peer addressing: MoRIIO's zmq_address string and the request ids that embed two of them
 * (docs/protocol.md#peer-addresses).
 *
 * zmq_address is "host:IP,handshake:PORT,notify:PORT". Like upstream's parse_moriio_zmq_address it is
 * split on ',' and each segment on its FIRST ':', so "host:::1" gives the IPv6 host "::1". host,
 * handshake and notify are required, other keys are ignored. pdlink is stricter than upstream where
 * laxness would be unsafe: ports are plain decimal 1..65535, a host may only hold the characters of a
 * name or an IPv4/IPv6 literal (it ends up inside a "tcp://host:port" endpoint), a repeated key is
 * refused, and every error names the segment.
 *
 * Request ids are "___prefill_addr_{zmq}___decode_addr_{zmq}_{32 lowercase hex}", possibly wrapped by
 * vLLM ("cmpl-<id>-0-1a2b3c4d"). The two upstream regexes are implemented by hand:
 *   prefill: ___prefill_addr_(.+?)___decode_addr_        -- the shortest capture after the first marker;
 *   decode:  ___decode_addr_(.+)_[0-9a-f]{32}(?:-.*)?$   -- greedy: up to the LAST '_' that is followed
 *            by 32 lowercase hex digits and then the end or a '-'.
 * Ids holding control characters are refused up front, which makes '.' (no newline) trivially true.
 */
#include "pdlink/wire.h"

#include <stdio.h>
#include <string.h>

#include "wire/mp.h"

#define PREFILL_MARK "___prefill_addr_"
#define DECODE_MARK "___decode_addr_"

static bool host_char(char c)
{
    /* No '_': host names cannot hold it (RFC 1123), and without it a host can never contain the
     * "___prefill_addr_" / "___decode_addr_" markers of a request id. */
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
           c == ':' || c == '%' || c == '[' || c == ']';
}

static bool parse_port(const char *s, size_t n, int *out)
{
    if (n == 0 || n > 5)
        return false;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
    }
    if (v < 1 || v > 65535)
        return false;
    *out = v;
    return true;
}

pdl_status_t pdl__zmq_parse_n(const char *s, size_t n, const char *ctx, pdl_zmq_addr_t *out, pdl_error_t *err)
{
    if (n == 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: zmq_address is empty", ctx);
    if (n > 2 * PDL_WIRE_HOST_MAX)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: zmq_address is %zu bytes, the limit is %d", ctx, n,
                             2 * PDL_WIRE_HOST_MAX);
    pdl_zmq_addr_t a = {.handshake_port = 0, .notify_port = 0};
    bool have_host = false;
    size_t pos = 0;
    while (pos <= n) {
        const char *seg = s + pos;
        const char *comma = memchr(seg, ',', n - pos);
        size_t sl = comma ? (size_t)(comma - seg) : n - pos;
        char q[64];
        pdl__wire_quote(q, sizeof(q), seg, sl);
        const char *colon = memchr(seg, ':', sl);
        if (colon == NULL)
            return pdl_error_set(err, PDL_ERR_PARSE, "%s: zmq_address segment \"%s\" has no ':' (expected key:value)",
                                 ctx, q);
        size_t kl = (size_t)(colon - seg), vl = sl - kl - 1;
        const char *val = colon + 1;
        if (kl == 4 && memcmp(seg, "host", 4) == 0) {
            if (have_host)
                return pdl_error_set(err, PDL_ERR_PARSE, "%s: zmq_address has host twice (segment \"%s\")", ctx, q);
            if (vl == 0 || vl > PDL_WIRE_HOST_MAX)
                return pdl_error_set(err, PDL_ERR_PARSE, "%s: zmq_address segment \"%s\": host must be 1..%d bytes", ctx,
                                     q, PDL_WIRE_HOST_MAX);
            for (size_t i = 0; i < vl; i++)
                if (!host_char(val[i]))
                    return pdl_error_set(err, PDL_ERR_PARSE,
                                         "%s: zmq_address segment \"%s\": host has a character that no host name or "
                                         "IP address contains",
                                         ctx, q);
            memcpy(a.host, val, vl);
            a.host[vl] = '\0';
            have_host = true;
        } else if ((kl == 9 && memcmp(seg, "handshake", 9) == 0) || (kl == 6 && memcmp(seg, "notify", 6) == 0)) {
            int *port = kl == 9 ? &a.handshake_port : &a.notify_port;
            if (*port != 0)
                return pdl_error_set(err, PDL_ERR_PARSE, "%s: zmq_address has %.*s twice (segment \"%s\")", ctx,
                                     (int)kl, seg, q);
            if (!parse_port(val, vl, port))
                return pdl_error_set(err, PDL_ERR_PARSE,
                                     "%s: zmq_address segment \"%s\": port must be an integer in 1..65535", ctx, q);
        }
        /* Other keys are ignored, as upstream does. */
        if (comma == NULL)
            break;
        pos += sl + 1;
    }
    if (!have_host)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: zmq_address has no host segment", ctx);
    if (a.handshake_port == 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: zmq_address has no handshake segment", ctx);
    if (a.notify_port == 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: zmq_address has no notify segment", ctx);
    *out = a;
    return PDL_OK;
}

pdl_status_t pdl_wire_parse_zmq_address(const char *s, pdl_zmq_addr_t *out, pdl_error_t *err)
{
    if (s == NULL || out == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "zmq_address: NULL argument");
    return pdl__zmq_parse_n(s, strnlen(s, 2 * PDL_WIRE_HOST_MAX + 1), "zmq_address", out, err);
}

int pdl_wire_format_zmq_address(const pdl_zmq_addr_t *a, char *buf, size_t cap)
{
    if (a == NULL || buf == NULL || cap == 0)
        return -1;
    size_t hl = strnlen(a->host, sizeof(a->host));
    if (hl == 0 || hl >= sizeof(a->host) || a->handshake_port < 1 || a->handshake_port > 65535 ||
        a->notify_port < 1 || a->notify_port > 65535)
        return -1;
    for (size_t i = 0; i < hl; i++)
        if (!host_char(a->host[i]))
            return -1;
    int n = snprintf(buf, cap, "host:%s,handshake:%d,notify:%d", a->host, a->handshake_port, a->notify_port);
    if (n < 0 || (size_t)n >= cap) {
        buf[0] = '\0';
        return -1;
    }
    return n;
}

static bool is_hex32(const char *p)
{
    for (int i = 0; i < 32; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return false;
    return true;
}

pdl_status_t pdl_wire_parse_request_id(const char *rid, pdl_zmq_addr_t *prefill, pdl_zmq_addr_t *decode,
                                       pdl_error_t *err)
{
    if (rid == NULL)
        return pdl_error_set(err, PDL_ERR_INVALID, "request id: NULL argument");
    size_t len = strnlen(rid, PDL_WIRE_RID_MAX + 1);
    if (len > PDL_WIRE_RID_MAX)
        return pdl_error_set(err, PDL_ERR_PARSE, "request id: longer than %d bytes", PDL_WIRE_RID_MAX);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)rid[i] < 0x20 || rid[i] == 0x7f)
            return pdl_error_set(err, PDL_ERR_PARSE, "request id: control character at byte %zu", i);
    bool want_p = prefill != NULL || decode == NULL;
    bool want_d = decode != NULL || prefill == NULL;
    pdl_zmq_addr_t pa = {0}, da = {0};

    if (want_p) {
        const char *m = strstr(rid, PREFILL_MARK);
        if (m == NULL)
            return pdl_error_set(err, PDL_ERR_PARSE, "request id: no " PREFILL_MARK " section");
        const char *start = m + strlen(PREFILL_MARK);
        /* (.+?) takes at least one byte, then stops at the first decode marker. */
        const char *end = *start != '\0' ? strstr(start + 1, DECODE_MARK) : NULL;
        if (end == NULL)
            return pdl_error_set(err, PDL_ERR_PARSE, "request id: no " DECODE_MARK " after " PREFILL_MARK);
        pdl_status_t st = pdl__zmq_parse_n(start, (size_t)(end - start), "request id prefill address", &pa, err);
        if (st != PDL_OK)
            return st;
    }
    if (want_d) {
        const char *m = strstr(rid, DECODE_MARK);
        if (m == NULL)
            return pdl_error_set(err, PDL_ERR_PARSE, "request id: no " DECODE_MARK " section");
        size_t cstart = (size_t)(m - rid) + strlen(DECODE_MARK);
        /* Greedy (.+): the last '_' at cstart+1 or later followed by 32 hex and then the end or '-'. */
        size_t p = 0;
        bool found = false;
        if (len >= 33) {
            for (size_t i = len - 33 + 1; i-- > cstart + 1;) {
                if (rid[i] == '_' && is_hex32(rid + i + 1) && (rid[i + 33] == '\0' || rid[i + 33] == '-')) {
                    p = i;
                    found = true;
                    break;
                }
            }
        }
        if (!found)
            return pdl_error_set(err, PDL_ERR_PARSE,
                                 "request id: no _<32 lowercase hex> suffix after the " DECODE_MARK " section");
        pdl_status_t st = pdl__zmq_parse_n(rid + cstart, p - cstart, "request id decode address", &da, err);
        if (st != PDL_OK)
            return st;
    }
    if (prefill != NULL)
        *prefill = pa;
    if (decode != NULL)
        *decode = da;
    return PDL_OK;
}

int pdl_wire_format_request_id(const char *prefill_zmq, const char *decode_zmq, const uint8_t uuid[16], char *buf,
                               size_t cap)
{
    if (prefill_zmq == NULL || decode_zmq == NULL || uuid == NULL || buf == NULL || cap == 0)
        return -1;
    /* An address holding a marker would make the id parse differently from how it was built. */
    const char *marks[2] = {PREFILL_MARK, DECODE_MARK};
    for (int i = 0; i < 2; i++)
        if (strstr(prefill_zmq, marks[i]) != NULL || strstr(decode_zmq, marks[i]) != NULL)
            return -1;
    pdl_zmq_addr_t a;
    if (pdl_wire_parse_zmq_address(prefill_zmq, &a, NULL) != PDL_OK ||
        pdl_wire_parse_zmq_address(decode_zmq, &a, NULL) != PDL_OK)
        return -1;
    char hex[33];
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", uuid[i]);
    int n = snprintf(buf, cap, PREFILL_MARK "%s" DECODE_MARK "%s_%s", prefill_zmq, decode_zmq, hex);
    if (n < 0 || (size_t)n >= cap || n > PDL_WIRE_RID_MAX) {
        buf[0] = '\0';
        return -1;
    }
    return n;
}
