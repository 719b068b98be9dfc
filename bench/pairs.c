/*
 * pairs.c -- median of per-pair ratios, quartile spread and a verdict (see pairs.h for the method).
 */
#include "pairs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void pdl_pairs_init(pdl_pairs_t *p) { memset(p, 0, sizeof(*p)); }

int pdl_pairs_add(pdl_pairs_t *p, double measured, double ceiling)
{
    if (p->n >= PDL_PAIRS_MAX || !isfinite(measured) || !isfinite(ceiling) || measured < 0 || ceiling <= 0)
        return -1;
    p->measured[p->n] = measured;
    p->ceiling[p->n] = ceiling;
    p->n++;
    return 0;
}

int pdl_pairs_count(const pdl_pairs_t *p) { return p->n; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of a sorted array (mean of the two middle values when n is even). */
static double median_sorted(const double *v, int n) { return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2; }

/* Nearest-rank quantile q in (0, 1] of a sorted array: the ceil(q * n)-th value. */
static double rank_sorted(const double *v, int n, double q)
{
    int k = (int)ceil(q * n);
    return v[k < 1 ? 0 : k > n ? n - 1 : k - 1];
}

double pdl_pairs_median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return median_sorted(v, n);
}

double pdl_pairs_quantile(double *v, int n, double q)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return rank_sorted(v, n, q);
}

void pdl_pairs_summarize(const pdl_pairs_t *p, double max_spread, double above_tol, pdl_pairs_summary_t *out)
{
    memset(out, 0, sizeof(*out));
    out->n = p->n;
    out->verdict = PDL_PAIRS_TOO_FEW;
    if (p->n == 0)
        return;
    double r[PDL_PAIRS_MAX], m[PDL_PAIRS_MAX], c[PDL_PAIRS_MAX];
    for (int i = 0; i < p->n; i++) {
        r[i] = p->measured[i] / p->ceiling[i];
        m[i] = p->measured[i];
        c[i] = p->ceiling[i];
    }
    qsort(r, (size_t)p->n, sizeof(double), cmp_double);
    qsort(m, (size_t)p->n, sizeof(double), cmp_double);
    qsort(c, (size_t)p->n, sizeof(double), cmp_double);
    out->ratio_median = median_sorted(r, p->n);
    out->ratio_min = r[0];
    out->ratio_max = r[p->n - 1];
    out->measured_median = median_sorted(m, p->n);
    out->ceiling_median = median_sorted(c, p->n);
    double iqr = rank_sorted(r, p->n, 0.75) - rank_sorted(r, p->n, 0.25);
    out->spread = out->ratio_median > 0 ? iqr / out->ratio_median : 0;
    if (p->n < PDL_PAIRS_MIN)
        out->verdict = PDL_PAIRS_TOO_FEW;
    else if (out->spread > max_spread)
        out->verdict = PDL_PAIRS_UNSTABLE;
    else if (out->ratio_median > 1 + above_tol)
        out->verdict = PDL_PAIRS_ABOVE_CEILING;
    else
        out->verdict = PDL_PAIRS_OK;
}

const char *pdl_pairs_verdict_name(pdl_pairs_verdict_t v)
{
    switch (v) {
    case PDL_PAIRS_OK:
        return "ok";
    case PDL_PAIRS_TOO_FEW:
        return "too few pairs";
    case PDL_PAIRS_UNSTABLE:
        return "unstable";
    case PDL_PAIRS_ABOVE_CEILING:
        return "ABOVE CEILING";
    }
    return "?";
}
