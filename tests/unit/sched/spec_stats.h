/* What the speculative-sampling unit tests share: Pearson's chi-square of token counts, and
 * the law of a logit row under T = 1, top-k 6, top-p 0.9. */
#ifndef PAGODA_TEST_SPEC_STATS_H
#define PAGODA_TEST_SPEC_STATS_H

#include <math.h>
#include <string.h>

/* Pearson's chi-square of counts cnt[n_cat] (n in all) against the law p over its support;
 * INFINITY when a token outside the support was counted. dof: the support's size - 1. */
static inline double spec_chi2(const long *cnt, const double *p, int n_cat, long n, int *dof)
{
    double x = 0;
    *dof = -1;
    for (int t = 0; t < n_cat; t++) {
        if (p[t] <= 0) {
            if (cnt[t]) return INFINITY;
            continue;
        }
        double e = p[t] * (double)n;
        x += (cnt[t] - e) * (cnt[t] - e) / e;
        (*dof)++;
    }
    return x;
}

/* The law of row[n] (n <= 64, distinct values: a plain order) under T = 1, top-k 6,
 * top-p 0.9, into p[n]. */
static inline void spec_law_k6_p09(const float *row, int n, double *p)
{
    int ids[64];
    for (int i = 0; i < n; i++) ids[i] = i;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (row[ids[j]] > row[ids[i]]) {
                int t = ids[i];
                ids[i] = ids[j];
                ids[j] = t;
            }
    double w[6], sum = 0, acc = 0;
    for (int i = 0; i < 6; i++) sum += w[i] = exp(row[ids[i]] - row[ids[0]]);
    memset(p, 0, sizeof(double) * (size_t)n);
    int k = 0;
    while (k < 6) {
        acc += w[k++];
        if (acc >= 0.9 * sum) break;
    }
    for (int i = 0; i < k; i++) p[ids[i]] = w[i] / acc;
}

#endif
