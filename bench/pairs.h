/*
 * pairs.h -- the robust comparison of a measurement with its ceiling on a shared, noisy machine: the
 * caller alternates the two loops over the same bytes (measured A, ceiling B, A, B, ...) and adds each
 * (A, B) pair here; the figure reported is the median of the per-pair ratios A/B, with their min and
 * max, and a verdict on whether that figure can be trusted.
 *
 * Why pairs: a neighbour's burst slows whichever loop is running; a pair's two loops run back to back,
 * so its ratio sees nearly the same conditions, and the median over pairs drops the pairs a burst
 * split. Taking the best of each kind separately (the method this replaces) pairs a quiet A with a
 * quiet B that ran seconds apart and gave ratios from 0.04 to 7.7 on one run.
 *
 * Spread = (third quartile - first quartile) / median of the per-pair ratios (quartiles by the
 * nearest-rank rule on the sorted ratios; with 5 pairs they are the 2nd and 4th). It ignores one
 * outlier on each side, which min-max would not: min and max are reported beside it for the reader.
 *
 * Pure logic: no I/O, no allocation, no global state; a pdl_pairs_t is a plain value the caller owns
 * (e.g. on the stack), initialised with pdl_pairs_init. Not thread-safe per object.
 */
#ifndef PDL_BENCH_PAIRS_H
#define PDL_BENCH_PAIRS_H

#include <stdbool.h>

#define PDL_PAIRS_MAX 64
/* Fewer pairs than this give PDL_PAIRS_TOO_FEW. */
#define PDL_PAIRS_MIN 5
/* Default limits for pdl_pairs_summarize: a spread above 0.25 is "unstable"; a median ratio above
 * 1 + 0.05 is "above the ceiling" (a ceiling is an upper bound; 5 % is the noise allowed for it). */
#define PDL_PAIRS_SPREAD_MAX 0.25
#define PDL_PAIRS_ABOVE_TOL 0.05

typedef struct pdl_pairs {
    /* Private: read through pdl_pairs_summarize. */
    int n;
    double measured[PDL_PAIRS_MAX], ceiling[PDL_PAIRS_MAX];
} pdl_pairs_t;

typedef enum pdl_pairs_verdict {
    PDL_PAIRS_OK = 0,        /* the median ratio is the figure */
    PDL_PAIRS_TOO_FEW,       /* fewer than PDL_PAIRS_MIN pairs: no figure */
    PDL_PAIRS_UNSTABLE,      /* spread > max_spread: print the spread, not a ratio */
    PDL_PAIRS_ABOVE_CEILING, /* stable, but the median ratio > 1 + above_tol: the ceiling or the
                              * measurement is wrong, say so */
} pdl_pairs_verdict_t;

typedef struct pdl_pairs_summary {
    int n;                                   /* pairs */
    double ratio_median, ratio_min, ratio_max; /* of the per-pair ratios measured / ceiling */
    double spread;                           /* (q3 - q1) / ratio_median, 0 when the median is 0 */
    double measured_median, ceiling_median;  /* medians of each column, e.g. GB/s */
    pdl_pairs_verdict_t verdict;
} pdl_pairs_summary_t;

void pdl_pairs_init(pdl_pairs_t *p);

/*
 * Add one pair (same units for both, e.g. GB/s). Returns 0, or -1 and adds nothing when the set is
 * full (PDL_PAIRS_MAX) or a value is not finite, the measurement is negative or the ceiling is not
 * positive (a failed ceiling run must not become a ratio).
 */
int pdl_pairs_add(pdl_pairs_t *p, double measured, double ceiling);

/* Pairs added so far. */
int pdl_pairs_count(const pdl_pairs_t *p);

/*
 * Summarize the pairs added so far into *out with the given limits (pass PDL_PAIRS_SPREAD_MAX and
 * PDL_PAIRS_ABOVE_TOL for the defaults). Every field is filled whatever the verdict (all 0 when there
 * are no pairs). The verdict is the first that applies of TOO_FEW, UNSTABLE, ABOVE_CEILING, OK.
 */
void pdl_pairs_summarize(const pdl_pairs_t *p, double max_spread, double above_tol, pdl_pairs_summary_t *out);

/* Median of v[0..n) (the mean of the two middle values when n is even), and the nearest-rank quantile q
 * in (0, 1] (the ceil(q * n)-th smallest value): the figures a benchmark prints beside its ratios. Both
 * sort v in place and return 0 for n == 0. */
double pdl_pairs_median(double *v, int n);
double pdl_pairs_quantile(double *v, int n, double q);

/* "ok", "too few pairs", "unstable", "ABOVE CEILING". */
const char *pdl_pairs_verdict_name(pdl_pairs_verdict_t v);

#endif /* PDL_BENCH_PAIRS_H */
