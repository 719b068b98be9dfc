/*
 * prom.c -- Prometheus text exposition (see prom.h; the format is
 * https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format).
 */
#include "app/prom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[] = {"counter", "gauge", "histogram"};

void pdl_prom_init(pdl_prom_t *w)
{
    memset(w, 0, sizeof(*w));
}

/* Append s escaped: backslash and newline always, '"' too inside a label value (quote). */
static void put_escaped(pdl_strbuf_t *b, const char *s, bool quote)
{
    for (const char *run = s;; s++) {
        if (*s != '\0' && *s != '\\' && *s != '\n' && !(quote && *s == '"'))
            continue;
        if (s > run)
            pdl_strbuf_printf(b, "%.*s", (int)(s - run), run);
        if (*s == '\0')
            return;
        pdl_strbuf_printf(b, "%s", *s == '\n' ? "\\n" : *s == '\\' ? "\\\\" : "\\\"");
        run = s + 1;
    }
}

/* The shortest of %.15g..%.17g that reads back as v: 0.1 stays "0.1", sums keep every bit. */
static void format_double(char out[32], double v)
{
    if (isnan(v)) {
        snprintf(out, 32, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, 32, "%s", v > 0 ? "+Inf" : "-Inf");
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(out, 32, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

void pdl_prom_family(pdl_prom_t *w, const char *name, pdl_prom_type_t type, const char *help)
{
    for (size_t i = 0; i < w->nfamilies; i++)
        if (strcmp(w->families[i], name) == 0)
            return;
    if (w->nfamilies == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 32;
        const char **f = realloc(w->families, cap * sizeof(*f));
        if (f == NULL) {
            w->out.failed = true;
            return;
        }
        w->families = f;
        w->cap = cap;
    }
    w->families[w->nfamilies++] = name;
    pdl_strbuf_printf(&w->out, "# HELP %s ", name);
    put_escaped(&w->out, help, false);
    pdl_strbuf_printf(&w->out, "\n# TYPE %s %s\n", name, type_names[type]);
}

/* `name{a="x",b="y"` plus extra (e.g. le) when given, then `} `; no braces without labels. */
static void put_series(pdl_strbuf_t *b, const char *name, const char *suffix, const pdl_prom_label_t *labels,
                       size_t n, const pdl_prom_label_t *extra)
{
    pdl_strbuf_printf(b, "%s%s", name, suffix);
    if (n == 0 && extra == NULL) {
        pdl_strbuf_printf(b, " ");
        return;
    }
    for (size_t i = 0; i <= n; i++) {
        const pdl_prom_label_t *l = i < n ? &labels[i] : extra;
        if (l == NULL)
            break;
        pdl_strbuf_printf(b, "%s%s=\"", i == 0 ? "{" : ",", l->name);
        put_escaped(b, l->value, true);
        pdl_strbuf_printf(b, "\"");
    }
    pdl_strbuf_printf(b, "} ");
}

void pdl_prom_u64(pdl_prom_t *w, const char *name, const pdl_prom_label_t *labels, size_t nlabels, uint64_t v)
{
    put_series(&w->out, name, "", labels, nlabels, NULL);
    pdl_strbuf_printf(&w->out, "%llu\n", (unsigned long long)v);
}

void pdl_prom_i64(pdl_prom_t *w, const char *name, const pdl_prom_label_t *labels, size_t nlabels, int64_t v)
{
    put_series(&w->out, name, "", labels, nlabels, NULL);
    pdl_strbuf_printf(&w->out, "%lld\n", (long long)v);
}

void pdl_prom_f64(pdl_prom_t *w, const char *name, const pdl_prom_label_t *labels, size_t nlabels, double v)
{
    char s[32];
    format_double(s, v);
    put_series(&w->out, name, "", labels, nlabels, NULL);
    pdl_strbuf_printf(&w->out, "%s\n", s);
}

void pdl_prom_histogram(pdl_prom_t *w, const char *name, const pdl_prom_label_t *labels, size_t nlabels,
                        const double *bounds, const uint64_t *cumulative, size_t nbounds, uint64_t count, double sum)
{
    for (size_t i = 0; i <= nbounds; i++) {
        char le[32];
        format_double(le, i < nbounds ? bounds[i] : INFINITY);
        const pdl_prom_label_t le_label = {"le", le};
        put_series(&w->out, name, "_bucket", labels, nlabels, &le_label);
        pdl_strbuf_printf(&w->out, "%llu\n", (unsigned long long)(i < nbounds ? cumulative[i] : count));
    }
    char s[32];
    format_double(s, sum);
    put_series(&w->out, name, "_sum", labels, nlabels, NULL);
    pdl_strbuf_printf(&w->out, "%s\n", s);
    put_series(&w->out, name, "_count", labels, nlabels, NULL);
    pdl_strbuf_printf(&w->out, "%llu\n", (unsigned long long)count);
}

char *pdl_prom_finish(pdl_prom_t *w, size_t *len_p)
{
    char *text = NULL;
    if (!w->out.failed) {
        /* An empty document is "", not NULL: NULL means out of memory. */
        text = w->out.p != NULL ? w->out.p : calloc(1, 1);
        w->out.p = NULL;
        if (len_p != NULL)
            *len_p = w->out.len;
    }
    pdl_prom_free(w);
    return text;
}

void pdl_prom_free(pdl_prom_t *w)
{
    pdl_strbuf_free(&w->out);
    free(w->families);
    memset(w, 0, sizeof(*w));
}
