/*
 * strbuf.h -- a growable text buffer with printf-style appends, for building documents such as a
 * Prometheus exposition or a report.
 *
 * Zero-initialise (`pdl_strbuf_t b = {0};`), append with pdl_strbuf_printf, read `b.p`/`b.len`
 * (always NUL-terminated once anything was appended), free with pdl_strbuf_free. A failed allocation
 * sets `failed` and makes every later append a no-op, so a writer checks once at the end.
 */
#ifndef PDLINK_STRBUF_H
#define PDLINK_STRBUF_H

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

void pdl_strbuf_printf(pdl_strbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void pdl_strbuf_free(pdl_strbuf_t *b);

#ifdef __cplusplus
}
#endif

#endif /* PDLINK_STRBUF_H */
