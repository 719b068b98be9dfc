/*
 * run_metrics.c -- sums over a Prometheus text exposition (see run_metrics.h).
 *
 * One pass per question over the text, which is a few kilobytes per node: simpler than building an
 * index, and the scraper asks about twenty questions per node once per topology. Label values are
 * compared after the format's escapes (\\, \", \n) are undone, so `status="ok"` matches however the
 * exporter quoted it. Values use strtod, which accepts NaN/+Inf as the format allows; NaN values are
 * not added (a NaN counter would poison every total).
 */
#include "cli/run_metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The unescaped value of label `key` in [p, end) into out (cap bytes); false if absent or too long. */
static bool label_value(const char *p, const char *end, const char *key, char *out, size_t cap)
{
    size_t klen = strlen(key);
    while (p < end) {
        while (p < end && (*p == ' ' || *p == ','))
            p++;
        const char *k = p;
        while (p < end && *p != '=')
            p++;
        if (p >= end)
            return false;
        size_t kl = (size_t)(p - k);
        while (kl > 0 && k[kl - 1] == ' ')
            kl--;
        p++;
        while (p < end && *p == ' ')
            p++;
        if (p >= end || *p != '"')
            return false;
        p++;
        size_t n = 0;
        bool fits = true;
        while (p < end && *p != '"') {
            char ch = *p;
            if (ch == '\\' && p + 1 < end) {
                p++;
                ch = *p == 'n' ? '\n' : *p;
            }
            if (n + 1 < cap)
                out[n++] = ch;
            else
                fits = false;
            p++;
        }
        if (p >= end)
            return false;
        p++;
        out[n] = '\0';
        if (kl == klen && strncmp(k, key, klen) == 0)
            return fits;
    }
    return false;
}

/* Does the label set in [p, end) (without braces) contain key="val"? A value too long for the buffer
 * is longer than any val we look for, so it cannot match. */
static bool labels_match(const char *p, const char *end, const char *key, const char *val)
{
    char v[1024];
    return strlen(val) < sizeof(v) && label_value(p, end, key, v, sizeof(v)) && strcmp(v, val) == 0;
}

/*
 * The next series named exactly `name` at or after *pp: its label set [*lab, *lab_end) (NULL when it
 * has none) and its value. Advances *pp past the line; false at the end of the text.
 */
static bool next_series(const char **pp, const char *name, const char **lab_out, const char **lab_end_out,
                        double *value_out)
{
    size_t nlen = strlen(name);
    const char *p = *pp;
    while (p != NULL && *p != '\0') {
        const char *eol = strchr(p, '\n');
        const char *end = eol ? eol : p + strlen(p);
        const char *line = p;
        p = eol ? eol + 1 : NULL;
        while (line < end && (*line == ' ' || *line == '\t'))
            line++;
        if (line >= end || *line == '#')
            continue;
        if ((size_t)(end - line) <= nlen || strncmp(line, name, nlen) != 0)
            continue;
        const char *q = line + nlen;
        const char *lab = NULL, *lab_end = NULL;
        if (*q == '{') {
            lab = q + 1;
            /* The closing brace is the first '}' outside a quoted value. */
            bool inq = false;
            const char *r = lab;
            for (; r < end; r++) {
                if (inq && *r == '\\' && r + 1 < end) {
                    r++;
                    continue;
                }
                if (*r == '"')
                    inq = !inq;
                else if (*r == '}' && !inq)
                    break;
            }
            if (r >= end)
                continue; /* malformed */
            lab_end = r;
            q = r + 1;
        } else if (*q != ' ' && *q != '\t') {
            continue; /* a longer name with this prefix */
        }
        while (q < end && (*q == ' ' || *q == '\t'))
            q++;
        char num[64];
        size_t nl = 0;
        while (q < end && *q != ' ' && *q != '\t' && *q != '\r' && nl < sizeof(num) - 1)
            num[nl++] = *q++;
        num[nl] = '\0';
        char *ep = NULL;
        double v = strtod(num, &ep);
        if (nl == 0 || ep == num || *ep != '\0')
            continue;
        *lab_out = lab;
        *lab_end_out = lab_end;
        *value_out = v;
        *pp = p;
        return true;
    }
    *pp = p;
    return false;
}

double pdl_run_metrics_sum(const char *text, const char *name, const char *label_key, const char *label_val,
                           int *found_p)
{
    double sum = 0;
    int found = 0;
    const char *p = text, *lab, *lab_end;
    double v;
    while (next_series(&p, name, &lab, &lab_end, &v)) {
        if (label_key != NULL && (lab == NULL || !labels_match(lab, lab_end, label_key, label_val)))
            continue;
        found++;
        if (!isnan(v))
            sum += v;
    }
    if (found_p != NULL)
        *found_p = found;
    return sum;
}

int pdl_run_metrics_hist_add(const char *text, const char *bucket_name, pdl_run_hist_t *h)
{
    int added = 0;
    const char *p = text, *lab, *lab_end;
    double v;
    while (next_series(&p, bucket_name, &lab, &lab_end, &v)) {
        char les[64];
        if (lab == NULL || !label_value(lab, lab_end, "le", les, sizeof(les)))
            continue;
        char *ep = NULL;
        double le = strtod(les, &ep);
        if (ep == les || *ep != '\0' || isnan(le) || isinf(le) || isnan(v) || v < 0)
            continue; /* +Inf is the count, which the caller has from _count */
        int i = 0;
        while (i < h->n && h->le[i] < le)
            i++;
        if (i == h->n || h->le[i] != le) {
            if (h->n == PDL_RUN_HIST_MAX)
                continue;
            memmove(h->le + i + 1, h->le + i, sizeof(h->le[0]) * (size_t)(h->n - i));
            memmove(h->cum + i + 1, h->cum + i, sizeof(h->cum[0]) * (size_t)(h->n - i));
            h->le[i] = le;
            h->cum[i] = 0;
            h->n++;
        }
        h->cum[i] += v;
        added++;
    }
    return added;
}

double pdl_run_hist_quantile(const pdl_run_hist_t *h, double total, double q)
{
    if (h->n == 0 || total <= 0 || q < 0 || q > 1)
        return -1;
    double rank = q * total;
    double lo = 0, below = 0;
    for (int i = 0; i < h->n; i++) {
        if (h->cum[i] >= rank) {
            double in = h->cum[i] - below;
            return in > 0 ? lo + (h->le[i] - lo) * (rank - below) / in : h->le[i];
        }
        lo = h->le[i];
        below = h->cum[i];
    }
    return h->le[h->n - 1]; /* beyond the last finite bound: that bound, as histogram_quantile does */
}
