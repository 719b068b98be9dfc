/*
 * strbuf.c -- the growable text buffer of strbuf.h: format in place, grow and retry when it did not fit.
 */
#include "common/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void pdl_strbuf_printf(pdl_strbuf_t *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if (b->p != NULL && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = (b->cap + (size_t)n + 1) * 2;
        if (ncap < 256)
            ncap = 256;
        char *np = realloc(b->p, ncap);
        if (np == NULL) {
            b->failed = true;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
}

void pdl_strbuf_free(pdl_strbuf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->failed = false;
}
