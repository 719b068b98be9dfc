/*
 * mp.c -- the guarded door into msgpack-c's decoder, typed accessors and encoder glue for the wire codecs.
 *
 * Decoding is msgpack-c's (msgpack_unpack_next builds a msgpack_object tree in a zone). Its C API has
 * no limits, and it allocates an array or map's element table as soon as it reads the header: the five
 * bytes `dd ff ff ff ff` (array32 of 2^32 - 1 elements) make it malloc 128 GiB, which aborts under
 * ASan and libFuzzer and costs address space everywhere else. So before msgpack-c sees a frame,
 * pdl__mp_scan walks the type bytes once, without building anything, and checks two facts msgpack-c
 * cannot: every element a container announces needs at least one more byte of input (so a count larger
 * than what is left is a truncated frame, not an allocation), and the total number of elements stays
 * under the caller's limit. The scan also finds where the first object ends, which tells a whole-frame
 * map apart from a legacy text id that merely starts with a byte msgpack can read. It only skips
 * payloads by their declared lengths; all values are still produced by msgpack-c.
 *
 * Encoding is msgpack-c's packer into an sbuffer; msgpack_pack_str/int64/bin already pick the same
 * smallest forms as msgpack-python (fixstr/str8/str16, positive ints as fixint/uint8/16/32/64), which
 * the golden vectors in tests/unit/test_wire_msg.c pin.
 */
#include "wire/mp.h"

#include "pdlink/wire.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Big-endian length fields of 1, 2 or 4 bytes; the caller has checked they are inside the buffer. */
static uint64_t be_read(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

pdl__mp_scan_t pdl__mp_scan(const uint8_t *buf, size_t len, size_t max_items, size_t *end_p)
{
    size_t pos = 0;
    uint64_t pending = 1; /* objects still to be read, including nested ones announced so far */
    uint64_t items = 0;   /* elements announced by every container, the figure msgpack-c allocates for */

    while (pending > 0) {
        if (pos >= len)
            return PDL__MP_TRUNCATED;
        uint8_t b = buf[pos++];
        pending--;
        size_t lenbytes = 0;     /* size of a length field that follows the type byte */
        uint64_t skip = 0;       /* fixed payload bytes */
        uint64_t count = 0;      /* elements announced by a container */
        int kind = 0;            /* 0 scalar, 1 sized payload, 2 array, 3 map */

        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            kind = 0;
        } else if (b <= 0x8f) {
            kind = 3, count = b & 0x0f;
        } else if (b <= 0x9f) {
            kind = 2, count = b & 0x0f;
        } else if (b <= 0xbf) {
            skip = b & 0x1f;
        } else {
            switch (b) {
            case 0xc1: return PDL__MP_INVALID;
            case 0xc4: case 0xd9: kind = 1, lenbytes = 1; break;           /* bin8, str8 */
            case 0xc5: case 0xda: kind = 1, lenbytes = 2; break;           /* bin16, str16 */
            case 0xc6: case 0xdb: kind = 1, lenbytes = 4; break;           /* bin32, str32 */
            case 0xc7: kind = 1, lenbytes = 1, skip = 1; break;            /* ext8: + type byte */
            case 0xc8: kind = 1, lenbytes = 2, skip = 1; break;
            case 0xc9: kind = 1, lenbytes = 4, skip = 1; break;
            case 0xca: skip = 4; break;
            case 0xcb: skip = 8; break;
            case 0xcc: case 0xd0: skip = 1; break;
            case 0xcd: case 0xd1: skip = 2; break;
            case 0xce: case 0xd2: skip = 4; break;
            case 0xcf: case 0xd3: skip = 8; break;
            case 0xd4: skip = 2; break;                                     /* fixext: type + data */
            case 0xd5: skip = 3; break;
            case 0xd6: skip = 5; break;
            case 0xd7: skip = 9; break;
            case 0xd8: skip = 17; break;
            case 0xdc: kind = 2, lenbytes = 2; break;
            case 0xdd: kind = 2, lenbytes = 4; break;
            case 0xde: kind = 3, lenbytes = 2; break;
            case 0xdf: kind = 3, lenbytes = 4; break;
            default: return PDL__MP_INVALID; /* unreachable: every byte value is covered above */
            }
        }
        if (lenbytes > 0) {
            if (len - pos < lenbytes)
                return PDL__MP_TRUNCATED;
            uint64_t v = be_read(buf + pos, lenbytes);
            pos += lenbytes;
            if (kind == 1)
                skip += v;
            else
                count = v;
        }
        if (skip > len - pos)
            return PDL__MP_TRUNCATED;
        pos += (size_t)skip;
        if (kind >= 2) {
            uint64_t n = kind == 3 ? 2 * count : count;
            items += n;
            if (items > max_items)
                return PDL__MP_TOO_MANY;
            pending += n;
            /* Each pending object needs at least one byte; more than that cannot be a real frame. */
            if (pending > len - pos)
                return PDL__MP_TRUNCATED;
        }
    }
    if (end_p != NULL)
        *end_p = pos;
    return pos == len ? PDL__MP_ONE : PDL__MP_TRAILING;
}

pdl_status_t pdl__mp_unpack(const void *buf, size_t len, size_t max_items, const char *what,
                            msgpack_unpacked *u, pdl_error_t *err)
{
    if (buf == NULL && len > 0)
        return pdl_error_set(err, PDL_ERR_INVALID, "%s: NULL buffer", what);
    if (len == 0)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: empty frame", what);
    if (len > PDL_WIRE_MAX_FRAME)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: frame of %zu bytes exceeds the %u byte limit", what, len,
                             (unsigned)PDL_WIRE_MAX_FRAME);
    size_t end = 0;
    switch (pdl__mp_scan(buf, len, max_items, &end)) {
    case PDL__MP_ONE:
        break;
    case PDL__MP_TRAILING:
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %zu trailing bytes after the msgpack object (%zu bytes)", what,
                             len - end, end);
    case PDL__MP_TRUNCATED:
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: truncated msgpack (%zu bytes)", what, len);
    case PDL__MP_INVALID:
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: invalid msgpack (reserved byte 0xc1)", what);
    case PDL__MP_TOO_MANY:
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: more than %zu msgpack elements", what, max_items);
    }
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(u, buf, len, &off);
    /* msgpack-c reports nesting deeper than its fixed parser stack (32 levels) as NOMEM_ERROR; after the
     * scan bounded every allocation, that is by far the likelier cause, so the frame counts as malformed. */
    if (r == MSGPACK_UNPACK_NOMEM_ERROR)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: msgpack nested deeper than 32 levels (or out of memory)", what);
    if (r != MSGPACK_UNPACK_SUCCESS || off != len)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: invalid msgpack", what);
    return PDL_OK;
}

void pdl__wire_quote(char *dst, size_t cap, const char *s, size_t n)
{
    size_t o = 0, lim = n < 40 ? n : 40;
    for (size_t i = 0; i < lim && o + 1 < cap; i++)
        dst[o++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (n > lim && o + 4 < cap)
        dst[o++] = '.', dst[o++] = '.', dst[o++] = '.';
    dst[o] = '\0';
}

const char *pdl__mp_kind(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "a boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return "an integer";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "a negative integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "a float";
    case MSGPACK_OBJECT_STR: return "a string";
    case MSGPACK_OBJECT_ARRAY: return "an array";
    case MSGPACK_OBJECT_MAP: return "a map";
    case MSGPACK_OBJECT_BIN: return "binary";
    case MSGPACK_OBJECT_EXT: return "an extension";
    }
    return "an unknown type";
}

bool pdl__utf8_valid(const void *s, size_t n)
{
    const uint8_t *p = s;
    size_t i = 0;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint32_t cp, min;
        if (c >= 0xc2 && c <= 0xdf)
            need = 1, cp = c & 0x1f, min = 0x80;
        else if (c >= 0xe0 && c <= 0xef)
            need = 2, cp = c & 0x0f, min = 0x800;
        else if (c >= 0xf0 && c <= 0xf4)
            need = 3, cp = c & 0x07, min = 0x10000;
        else
            return false; /* continuation byte, overlong lead 0xc0/0xc1, or beyond U+10FFFF */
        if (n - i - 1 < need)
            return false;
        for (size_t k = 1; k <= need; k++) {
            uint8_t cc = p[i + k];
            if ((cc & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (cc & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += need + 1;
    }
    return true;
}

bool pdl__mp_text(const msgpack_object *o, const char **s, size_t *n)
{
    if (o->type == MSGPACK_OBJECT_STR) {
        *s = o->via.str.ptr, *n = o->via.str.size;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_BIN && pdl__utf8_valid(o->via.bin.ptr, o->via.bin.size)) {
        *s = o->via.bin.ptr, *n = o->via.bin.size;
        return true;
    }
    return false;
}

bool pdl__mp_token(const msgpack_object *o, const char **s, size_t *n)
{
    if (o->type == MSGPACK_OBJECT_STR) {
        *s = o->via.str.ptr, *n = o->via.str.size;
        return true;
    }
    return pdl__mp_text(o, s, n);
}

bool pdl__mp_key_is(const msgpack_object *k, const char *name)
{
    const char *s;
    size_t n;
    if (!pdl__mp_text(k, &s, &n))
        return false;
    size_t nl = strlen(name);
    return n == nl && (n == 0 || memcmp(s, name, n) == 0);
}

pdl_status_t pdl__mp_int(const msgpack_object *o, const char *ctx, const char *key, int64_t min, int64_t max,
                         int64_t *out, pdl_error_t *err)
{
    int64_t v;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX)
            return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s is %" PRIu64 ", beyond the int64 range", ctx, key,
                                 o->via.u64);
        v = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        v = o->via.i64;
    } else {
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s is %s, expected %s", ctx, key, pdl__mp_kind(o),
                             min >= 0 ? "a non-negative integer" : "an integer");
    }
    if (v < min)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s must be >= %" PRId64 ", got %" PRId64, ctx, key, min, v);
    if (v > max)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s must be <= %" PRId64 ", got %" PRId64, ctx, key, max, v);
    *out = v;
    return PDL_OK;
}

pdl_status_t pdl__mp_uint64(const msgpack_object *o, const char *ctx, const char *key, uint64_t *out,
                            pdl_error_t *err)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *out = o->via.u64;
        return PDL_OK;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s must be >= 0, got %" PRId64, ctx, key, o->via.i64);
    return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s is %s, expected a non-negative integer", ctx, key,
                         pdl__mp_kind(o));
}

static pdl_status_t text_rules(const char *s, size_t n, size_t cap, bool allow_empty, const char *ctx,
                               const char *key, pdl_error_t *err)
{
    if (n == 0 && !allow_empty)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s is empty", ctx, key);
    if (n >= cap)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s is %zu bytes, the limit is %zu", ctx, key, n, cap - 1);
    if (n > 0 && memchr(s, '\0', n) != NULL)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s contains a NUL byte", ctx, key);
    if (!pdl__utf8_valid(s, n))
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s is not valid UTF-8", ctx, key);
    return PDL_OK;
}

pdl_status_t pdl__mp_str(const msgpack_object *o, const char *ctx, const char *key, char *dst, size_t cap,
                         bool allow_empty, pdl_error_t *err)
{
    const char *s;
    size_t n;
    if (o->type == MSGPACK_OBJECT_STR) {
        s = o->via.str.ptr, n = o->via.str.size;
    } else if (o->type == MSGPACK_OBJECT_BIN) {
        s = o->via.bin.ptr, n = o->via.bin.size; /* upstream S2 decodes bin values to str when it can */
    } else {
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s is %s, expected a string", ctx, key, pdl__mp_kind(o));
    }
    pdl_status_t st = text_rules(s, n, cap, allow_empty, ctx, key, err);
    if (st != PDL_OK)
        return st;
    if (n > 0)
        memcpy(dst, s, n);
    dst[n] = '\0';
    return PDL_OK;
}

pdl_status_t pdl__text_check(const char *s, size_t cap, bool allow_empty, const char *ctx, const char *key,
                             pdl_error_t *err)
{
    size_t n = strnlen(s, cap);
    pdl_status_t st = text_rules(s, n, cap, allow_empty, ctx, key, err);
    if (st == PDL_OK)
        return PDL_OK;
    /* The caller passed a bad value to an encoder: that is an invalid argument, not malformed input. */
    if (err != NULL)
        err->status = PDL_ERR_INVALID;
    return PDL_ERR_INVALID;
}

pdl_status_t pdl__mp_bin(const msgpack_object *o, const char *ctx, const char *key, size_t max,
                         pdl_bytes_t *out, pdl_error_t *err)
{
    if (o->type != MSGPACK_OBJECT_BIN)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s is %s, expected binary", ctx, key, pdl__mp_kind(o));
    size_t n = o->via.bin.size;
    if (n > max)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s is %zu bytes, the limit is %zu", ctx, key, n, max);
    uint8_t *d = malloc(n > 0 ? n : 1);
    if (d == NULL)
        return pdl_error_set(err, PDL_ERR_NOMEM, "%s: out of memory copying %s (%zu bytes)", ctx, key, n);
    if (n > 0)
        memcpy(d, o->via.bin.ptr, n);
    out->data = d;
    out->len = n;
    return PDL_OK;
}

pdl_status_t pdl__mp_bool(const msgpack_object *o, const char *ctx, const char *key, bool *out, pdl_error_t *err)
{
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return pdl_error_set(err, PDL_ERR_PARSE, "%s: %s is %s, expected a boolean", ctx, key, pdl__mp_kind(o));
    *out = o->via.boolean;
    return PDL_OK;
}

/* ---- encoder ---------------------------------------------------------------------------------- */

void pdl__enc_init(pdl__mp_enc_t *e)
{
    msgpack_sbuffer_init(&e->sb);
    msgpack_packer_init(&e->pk, &e->sb, msgpack_sbuffer_write);
    e->rc = 0;
}

void pdl__enc_map(pdl__mp_enc_t *e, size_t n)
{
    e->rc |= n > UINT32_MAX ? -1 : msgpack_pack_map(&e->pk, n);
}

void pdl__enc_array(pdl__mp_enc_t *e, size_t n)
{
    e->rc |= n > UINT32_MAX ? -1 : msgpack_pack_array(&e->pk, n);
}

void pdl__enc_strn(pdl__mp_enc_t *e, const char *s, size_t n)
{
    if (n > UINT32_MAX) {
        e->rc |= -1;
        return;
    }
    e->rc |= msgpack_pack_str(&e->pk, n);
    if (n > 0)
        e->rc |= msgpack_pack_str_body(&e->pk, s, n);
}

void pdl__enc_str(pdl__mp_enc_t *e, const char *s) { pdl__enc_strn(e, s, strlen(s)); }

void pdl__enc_int(pdl__mp_enc_t *e, int64_t v) { e->rc |= msgpack_pack_int64(&e->pk, v); }

void pdl__enc_uint(pdl__mp_enc_t *e, uint64_t v) { e->rc |= msgpack_pack_uint64(&e->pk, v); }

void pdl__enc_bin(pdl__mp_enc_t *e, const void *p, size_t n)
{
    if (n > UINT32_MAX) {
        e->rc |= -1;
        return;
    }
    e->rc |= msgpack_pack_bin(&e->pk, n);
    if (n > 0)
        e->rc |= msgpack_pack_bin_body(&e->pk, p, n);
}

void pdl__enc_bool(pdl__mp_enc_t *e, bool v)
{
    e->rc |= v ? msgpack_pack_true(&e->pk) : msgpack_pack_false(&e->pk);
}

void pdl__enc_abort(pdl__mp_enc_t *e) { msgpack_sbuffer_destroy(&e->sb); }

pdl_status_t pdl__enc_finish(pdl__mp_enc_t *e, const char *what, pdl_bytes_t *out, pdl_error_t *err)
{
    if (e->rc != 0) {
        msgpack_sbuffer_destroy(&e->sb);
        return pdl_error_set(err, PDL_ERR_NOMEM, "%s: encoding failed (out of memory)", what);
    }
    size_t n = e->sb.size;
    out->data = (uint8_t *)msgpack_sbuffer_release(&e->sb); /* malloc'd by the sbuffer: free() works */
    out->len = n;
    msgpack_sbuffer_destroy(&e->sb);
    return PDL_OK;
}
