/*
 * strbuf.h -- a growable text buffer with printf-style appends, for building documents such as a
 * Prometheus exposition or a report.
 *
 * Internal (not part of the public API): a helper for pdlink's own programs; no transfer API takes or
 * returns one.
 *
 * Zero-initialise (`pdl_strbuf_t b = {0};`), append with pdl_strbuf_printf, read `b.p`/`b.len`
 * (NUL-terminated once an append succeeded; `p` is NULL before that), free with pdl_strbuf_free.
 * Error convention: appends return nothing. A failed allocation (or an encoding error in the format)
 * sets `failed` and makes every later append a no-op, so a writer checks `failed` once at the end;
 * the text appended before the failure stays intact. The holder owns `p`; `cap` is the allocated size.
 * One thread at a time per buffer.
 */
#ifndef PDL_COMMON_STRBUF_H
#define PDL_COMMON_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pdl_strbuf {
    char *p;
    size_t len;
    size_t cap;
    bool failed;
} pdl_strbuf_t;

/* Append printf-style text, growing the buffer as needed. `b` and `fmt` must not be NULL. */
void pdl_strbuf_printf(pdl_strbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Free the text and zero the buffer (failed included), which may be reused. `b` must not be NULL. */
void pdl_strbuf_free(pdl_strbuf_t *b);

#ifdef __cplusplus
}
#endif

#endif /* PDL_COMMON_STRBUF_H */
