/*
 * cost: a step-time model fitted online from the engine's own measured steps, and what the
 * planner asks of it.
 *
 * A step's time is modelled as
 *
 *     t = a + b * rows + c * ctx
 *
 * a: what every step pays once (the weights read, launches, sampling), b: a query row's
 * share of the GEMMs (flops per row / the measured flop rate), c: attention per key a
 * row reads (ctx: the keys the step's rows attend to, summed over rows). The coefficients
 * are a least-squares fit with exponential forgetting over recent steps (sched_fit, also
 * used by speculation for its rows-only fit). The fit is centered (means first), which
 * keeps it well conditioned where ctx is five orders of magnitude above rows.
 *
 * With a bound on the step time (--max-step-ms), the planner gives every decode row its
 * place, then adds prefill tokens while the predicted time stays under the bound
 * (sched_cost_fit_tokens), at least a minimal chunk a step so that prefill never starves.
 */
#ifndef PAGODA_SCHED_COST_H
#define PAGODA_SCHED_COST_H

#include <stdint.h>

/** Weighted sums of a least-squares fit of y on up to two regressors, forgetting old
 * samples geometrically. Zero-initialized is empty. */
struct sched_fit {
    double w, x1, x2, y;            /* sums of weights and weighted values */
    double x11, x12, x22, x1y, x2y; /* and of products */
};

/** Adds the sample (x1, x2, y) after scaling the old ones by forget (in (0, 1]). */
void sched_fit_add(struct sched_fit *f, double forget, double x1, double x2, double y);

/**
 * Solves y = a + b * x1 + c * x2 (c = 0 when use_x2 is 0). A slope that comes out negative
 * is dropped (set to 0, the other refitted alone): a step never gets cheaper with more
 * work. Returns 0 (a, b, c left as they were) while the samples cannot tell the slopes
 * (fewer than 4 in weight, or no spread in the regressors), else 1.
 */
int sched_fit_solve(const struct sched_fit *f, int use_x2, double *a, double *b, double *c);

/** The step-time model of one engine. */
struct sched_cost {
    struct sched_fit fit;
    double a, b, c; /* seconds, seconds a row, seconds a key a row reads */
    int ready;      /* a, b, c hold a fit (until then the bound is not applied) */
    int fixed;      /* a, b, c were set by the caller and are not fitted (tests) */
};

/** Keys read by n rows appended to a sequence that has `computed` tokens:
 * sum_{j<n} (computed + j + 1). */
static inline double sched_cost_keys(int computed, int n)
{
    return (double)n * computed + (double)n * (n + 1) / 2;
}

/** Predicted seconds of a step of `rows` query rows reading `ctx` keys in all. */
double sched_cost_predict(const struct sched_cost *m, int rows, double ctx);

/** A step of rows and ctx took dt seconds: refits (unless fixed). */
void sched_cost_observe(struct sched_cost *m, int rows, double ctx, double dt);

/**
 * The largest n <= want such that a step already holding `rows` rows and `ctx` keys, plus
 * n rows of a sequence that has `computed` tokens, is predicted to take at most t_max
 * seconds; 0 when not even one fits. Cost: about 2 log2(want) predictions.
 */
int sched_cost_fit_tokens(const struct sched_cost *m, double t_max, int rows, double ctx,
                          int computed, int want);

#endif
