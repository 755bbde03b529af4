/* The step-time model: an online least-squares fit and the planner's questions (cost.h). */
#include "sched/cost.h"

/* Forgetting of the step-time fit: a sample's weight halves in about 70 steps, so that the
 * fit follows a change of load (longer contexts, another mix) within a second or two while
 * remembering the prefill steps among the decode ones. */
#define COST_FORGET 0.99

void sched_fit_add(struct sched_fit *f, double forget, double x1, double x2, double y)
{
    f->w = forget * f->w + 1;
    f->x1 = forget * f->x1 + x1;
    f->x2 = forget * f->x2 + x2;
    f->y = forget * f->y + y;
    f->x11 = forget * f->x11 + x1 * x1;
    f->x12 = forget * f->x12 + x1 * x2;
    f->x22 = forget * f->x22 + x2 * x2;
    f->x1y = forget * f->x1y + x1 * y;
    f->x2y = forget * f->x2y + x2 * y;
}

int sched_fit_solve(const struct sched_fit *f, int use_x2, double *a, double *b, double *c)
{
    if (f->w < 4) return 0;
    const double w = f->w, m1 = f->x1 / w, m2 = f->x2 / w, my = f->y / w;
    /* centered sums: the covariances times w */
    const double s11 = f->x11 - w * m1 * m1, s1y = f->x1y - w * m1 * my;
    const double s22 = f->x22 - w * m2 * m2, s2y = f->x2y - w * m2 * my;
    const double s12 = f->x12 - w * m1 * m2;
    if (!(s11 > 1e-9 * f->x11)) return 0; /* every sample had the same x1 */
    double B = s1y / s11, C = 0;
    const double det = s11 * s22 - s12 * s12;
    if (use_x2 && s22 > 1e-9 * f->x22 && det > 1e-9 * s11 * s22) {
        B = (s22 * s1y - s12 * s2y) / det;
        C = (s11 * s2y - s12 * s1y) / det;
        if (C < 0) { /* x2 explains nothing that x1 does not: x1 alone */
            C = 0;
            B = s1y / s11;
        } else if (B < 0) {
            B = 0;
            C = s2y / s22;
        }
    }
    if (B < 0) B = 0;
    if (C < 0) C = 0;
    double A = my - B * m1 - C * m2;
    *a = A > 0 ? A : 0;
    *b = B;
    *c = C;
    return 1;
}

double sched_cost_predict(const struct sched_cost *m, int rows, double ctx)
{
    return m->a + m->b * rows + m->c * ctx;
}

void sched_cost_observe(struct sched_cost *m, int rows, double ctx, double dt)
{
    if (m->fixed || rows <= 0 || !(dt > 0)) return;
    sched_fit_add(&m->fit, COST_FORGET, rows, ctx, dt);
    if (sched_fit_solve(&m->fit, 1, &m->a, &m->b, &m->c)) m->ready = 1;
}

int sched_cost_fit_tokens(const struct sched_cost *m, double t_max, int rows, double ctx,
                          int computed, int want)
{
    if (want <= 0) return 0;
    if (sched_cost_predict(m, rows + want, ctx + sched_cost_keys(computed, want)) <= t_max)
        return want;
    int lo = 0, hi = want; /* lo fits, hi does not */
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (sched_cost_predict(m, rows + mid, ctx + sched_cost_keys(computed, mid)) <= t_max)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}
