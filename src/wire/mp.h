/*
 * mp.h -- internal helpers shared by the wire codecs: one guarded entry point into msgpack-c's
 * decoder, typed accessors on decoded objects that produce key-naming errors, encoder glue and a
 * strict UTF-8 check. Not a public header: the codecs in src/wire and the engine's descriptor codec
 * (src/engine/desc.c, a layer above) include it. Every decoder of bytes from the network calls
 * pdl__mp_unpack and never msgpack_unpack_next / msgpack_unpacker directly.
 */
#ifndef PDLINK_WIRE_MP_H
#define PDLINK_WIRE_MP_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pdlink/status.h"
#include "pdlink/types.h"

/* What the pre-scan found in a buffer (see pdl__mp_scan in mp.c for why it exists). */
typedef enum pdl__mp_scan {
    PDL__MP_ONE = 0,       /* exactly one complete object that ends at the end of the buffer */
    PDL__MP_TRAILING,      /* one complete object followed by more bytes */
    PDL__MP_TRUNCATED,     /* the buffer ends inside the object (or a count cannot fit in it) */
    PDL__MP_INVALID,       /* the reserved byte 0xc1 */
    PDL__MP_TOO_MANY,      /* containers announce more elements than the caller allows */
} pdl__mp_scan_t;

pdl__mp_scan_t pdl__mp_scan(const uint8_t *buf, size_t len, size_t max_items, size_t *end_p);

/*
 * Decode exactly one msgpack object spanning the whole buffer into `u` (initialised by the caller,
 * destroyed by the caller in every case). `what` names the message in errors. Objects in `u` may point
 * into `buf`, which must outlive them.
 */
pdl_status_t pdl__mp_unpack(const void *buf, size_t len, size_t max_items, const char *what,
                            msgpack_unpacked *u, pdl_error_t *err);

/* Untrusted text for an error message: at most 40 bytes of s[0..n) into dst (NUL-terminated), each
 * unprintable byte replaced by '?', "..." appended when cut. For the text codecs too (addr.c). */
void pdl__wire_quote(char *dst, size_t cap, const char *s, size_t n);

/* "a string", "binary", "a negative integer", ... for error messages. */
const char *pdl__mp_kind(const msgpack_object *o);

/* True if `s` is strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF). */
bool pdl__utf8_valid(const void *s, size_t n);

/* A str, or a bin holding valid UTF-8 (upstream normalises bin to str); sets *s and *n. */
bool pdl__mp_text(const msgpack_object *o, const char **s, size_t *n);

/* Like pdl__mp_text but any str bytes pass: for comparing against ASCII constants, where bad UTF-8
 * simply fails to match and gets the "must be one of" message. */
bool pdl__mp_token(const msgpack_object *o, const char **s, size_t *n);

/* True if key `k` (str or UTF-8 bin) equals the C string `name`. */
bool pdl__mp_key_is(const msgpack_object *k, const char *name);

/*
 * Typed reads of a map value. `ctx` is the message name and `key` the key (or "key[i]") for the error
 * message, e.g. "release: consumer_tp_size must be >= 1, got 0".
 */
pdl_status_t pdl__mp_int(const msgpack_object *o, const char *ctx, const char *key, int64_t min, int64_t max,
                         int64_t *out, pdl_error_t *err);
pdl_status_t pdl__mp_uint64(const msgpack_object *o, const char *ctx, const char *key, uint64_t *out,
                            pdl_error_t *err);
/* Text into dst (NUL-terminated); refuses NUL bytes, invalid UTF-8, empty (unless allow_empty) and
 * anything that does not fit in cap - 1 bytes. */
pdl_status_t pdl__mp_str(const msgpack_object *o, const char *ctx, const char *key, char *dst, size_t cap,
                         bool allow_empty, pdl_error_t *err);
pdl_status_t pdl__mp_bin(const msgpack_object *o, const char *ctx, const char *key, size_t max,
                         pdl_bytes_t *out, pdl_error_t *err);
pdl_status_t pdl__mp_bool(const msgpack_object *o, const char *ctx, const char *key, bool *out, pdl_error_t *err);

/* Validate a C string for use as a text field of an encoded message (same rules as pdl__mp_str). */
pdl_status_t pdl__text_check(const char *s, size_t cap, bool allow_empty, const char *ctx, const char *key,
                             pdl_error_t *err);

/* An encoder: msgpack-c's sbuffer plus packer; `rc` collects failures of every pack call. */
typedef struct pdl__mp_enc {
    msgpack_sbuffer sb;
    msgpack_packer pk;
    int rc;
} pdl__mp_enc_t;

void pdl__enc_init(pdl__mp_enc_t *e);
void pdl__enc_map(pdl__mp_enc_t *e, size_t n);
void pdl__enc_array(pdl__mp_enc_t *e, size_t n);
void pdl__enc_str(pdl__mp_enc_t *e, const char *s); /* NUL-terminated, packed as str */
void pdl__enc_strn(pdl__mp_enc_t *e, const char *s, size_t n);
void pdl__enc_int(pdl__mp_enc_t *e, int64_t v);     /* smallest form, like msgpack-python */
void pdl__enc_uint(pdl__mp_enc_t *e, uint64_t v);
void pdl__enc_bin(pdl__mp_enc_t *e, const void *p, size_t n);
void pdl__enc_bool(pdl__mp_enc_t *e, bool v);
/* Hand the bytes to `out` (or free them on failure); always releases the encoder. */
pdl_status_t pdl__enc_finish(pdl__mp_enc_t *e, const char *what, pdl_bytes_t *out, pdl_error_t *err);
void pdl__enc_abort(pdl__mp_enc_t *e);

/* zmq_address parsing over a length-delimited string (addr.c); `ctx` prefixes error messages. */
struct pdl_zmq_addr;
pdl_status_t pdl__zmq_parse_n(const char *s, size_t n, const char *ctx, struct pdl_zmq_addr *out, pdl_error_t *err);

#endif /* PDLINK_WIRE_MP_H */
