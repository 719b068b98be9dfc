/*
 * prom.h -- a writer of the Prometheus text exposition format (version 0.0.4), used by pdlink-node's and
 * pdlink-router's /metrics.
 *
 * A document is a sequence of families: pdl_prom_family writes "# HELP" and "# TYPE" once per name (a
 * second call with the same name writes nothing, so a loop over ranks or routes can start its family
 * every time), then samples follow. Label values are escaped as the format requires (backslash, double
 * quote and newline), HELP text likewise (backslash, newline). Numbers: integers exactly, floats in the
 * shortest form that reads back to the same double, and +Inf, -Inf, NaN by their names.
 *
 * Memory: the writer grows one buffer; a failed allocation makes every later call a no-op and
 * pdl_prom_finish return NULL, so a renderer checks once at the end.
 */
#ifndef PDL_APP_PROM_H
#define PDL_APP_PROM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strbuf.h"

typedef enum pdl_prom_type {
    PDL_PROM_COUNTER,
    PDL_PROM_GAUGE,
    PDL_PROM_HISTOGRAM,
} pdl_prom_type_t;

typedef struct pdl_prom_label {
    const char *name;  /* a valid label name, never escaped */
    const char *value; /* any UTF-8 text, escaped */
} pdl_prom_label_t;

typedef struct pdl_prom {
    pdl_strbuf_t out;
    const char **families; /* names started so far (borrowed: they must outlive the writer) */
    size_t nfamilies, cap;
} pdl_prom_t;

/* Zero-initialise a writer (`pdl_prom_t w = {0};`) or call this. */
void pdl_prom_init(pdl_prom_t *w);

/* "# HELP name help" and "# TYPE name type", unless name was already started in this document. */
void pdl_prom_family(pdl_prom_t *w, const char *name, pdl_prom_type_t type, const char *help);

/* One sample line `name{labels} value`; nlabels may be 0 (labels may then be NULL). */
void pdl_prom_u64(pdl_prom_t *w, const char *name, const pdl_prom_label_t *labels, size_t nlabels, uint64_t v);
void pdl_prom_i64(pdl_prom_t *w, const char *name, const pdl_prom_label_t *labels, size_t nlabels, int64_t v);
void pdl_prom_f64(pdl_prom_t *w, const char *name, const pdl_prom_label_t *labels, size_t nlabels, double v);

/*
 * One histogram series: name_bucket for each bound (le last among the labels) and for +Inf, then name_sum
 * and name_count. cumulative[i] counts observations <= bounds[i] (Prometheus buckets are cumulative); the
 * +Inf bucket is `count`.
 */
void pdl_prom_histogram(pdl_prom_t *w, const char *name, const pdl_prom_label_t *labels, size_t nlabels,
                        const double *bounds, const uint64_t *cumulative, size_t nbounds, uint64_t count, double sum);

/* The document (malloc'd, NUL-terminated; *len_p its length if len_p is not NULL), or NULL when memory
 * ran out. The writer is left empty either way. */
char *pdl_prom_finish(pdl_prom_t *w, size_t *len_p);

/* Free a writer without taking its text. Accepts a zeroed writer. */
void pdl_prom_free(pdl_prom_t *w);

#endif /* PDL_APP_PROM_H */
