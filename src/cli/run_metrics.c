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

/* Does the label set in [p, end) (without braces) contain key="val"? */
static bool labels_match(const char *p, const char *end, const char *key, const char *val)
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
        p++; /* '=' */
        while (p < end && *p == ' ')
            p++;
        if (p >= end || *p != '"')
            return false;
        p++;
        /* Compare the unescaped value with val as we scan it. */
        const char *v = val;
        bool same = true;
        while (p < end && *p != '"') {
            char ch = *p;
            if (ch == '\\' && p + 1 < end) {
                p++;
                ch = *p == 'n' ? '\n' : *p;
            }
            if (*v == '\0' || *v != ch)
                same = false;
            else
                v++;
            p++;
        }
        if (p >= end)
            return false; /* unterminated value */
        p++;              /* closing quote */
        if (kl == klen && strncmp(k, key, klen) == 0 && same && *v == '\0')
            return true;
    }
    return false;
}

double pdl_run_metrics_sum(const char *text, const char *name, const char *label_key, const char *label_val,
                           int *found_p)
{
    double sum = 0;
    int found = 0;
    size_t nlen = strlen(name);
    const char *p = text;
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
        if (label_key != NULL && (lab == NULL || !labels_match(lab, lab_end, label_key, label_val)))
            continue;
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
        found++;
        if (!isnan(v))
            sum += v;
    }
    if (found_p != NULL)
        *found_p = found;
    return sum;
}
