/*
 * The speculative-sampling rule (spec_rule) on fixed laws p (target) and q (drafter): drafts
 * drawn from q, 1,000,000 verifications a case. The tokens kept follow p (Pearson's
 * chi-square at significance 0.001, dof = the tokens of p's support - 1), the tokens drawn
 * after a rejection follow max(0, p - q) normalized (the same test), the acceptance rate is
 * sum min(p, q) (within 5 standard deviations), and no token outside p's support comes out.
 * Cases: overlapping supports of different shapes, q = p (every draft kept), disjoint
 * supports (none kept), q wider than p. The generators are seeded: the outcome is fixed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sched/spec.h"
#include "test_util.h"

#define V 12
#define N 1000000L

/* 99.9th percentiles of chi-square, dof 1..11 */
static const double crit999[] = {0,     10.83, 13.82, 16.27, 18.47, 20.52,
                                 22.46, 24.32, 26.12, 27.88, 29.59, 31.26};

/* A law as the sampler gives it: candidates (support, in a shuffled order) and probabilities. */
struct law {
    int32_t ids[V];
    float p[V];
    int n;
    double dense[V];
};

static void law_make(struct law *l, const double *w)
{
    double sum = 0;
    for (int t = 0; t < V; t++) sum += w[t];
    l->n = 0;
    /* a fixed non-sorted order, as top-k's selection leaves it */
    static const int order[V] = {5, 2, 9, 0, 11, 7, 3, 8, 1, 10, 4, 6};
    for (int i = 0; i < V; i++) {
        int t = order[i];
        l->dense[t] = w[t] / sum;
        if (w[t] > 0) {
            l->ids[l->n] = t;
            l->p[l->n++] = (float)(w[t] / sum);
        }
    }
}

/* Pearson's chi-square of counts against law e (dense) over e's support; INFINITY when a
 * token outside it was counted. */
static double chi2(const long *cnt, const double *e, long n, int *dof)
{
    double x = 0;
    *dof = -1;
    for (int t = 0; t < V; t++) {
        if (e[t] <= 0) {
            if (cnt[t]) return INFINITY;
            continue;
        }
        double m = e[t] * (double)n;
        x += (cnt[t] - m) * (cnt[t] - m) / m;
        (*dof)++;
    }
    return x;
}

static void run_case(const char *name, const double *wp, const double *wq, int want)
{
    struct law p, q;
    law_make(&p, wp);
    law_make(&q, wq);
    double res[V], rsum = 0, overlap = 0;
    for (int t = 0; t < V; t++) {
        double x = p.dense[t] - q.dense[t];
        res[t] = x > 0 ? x : 0;
        rsum += res[t];
        overlap += p.dense[t] < q.dense[t] ? p.dense[t] : q.dense[t];
    }
    for (int t = 0; t < V; t++) res[t] = rsum > 0 ? res[t] / rsum : 0;
    float scratch[V] = {0};
    struct rng gq, g;
    rng_seed(&gq, 2024);
    rng_seed(&g, 77);
    long all[V] = {0}, rej[V] = {0}, n_acc = 0;
    for (long i = 0; i < N; i++) {
        /* the draft: inverse CDF of q in its candidates' order */
        double u = rng_uniform(&gq), acc = 0;
        int at = q.n - 1;
        for (int j = 0; j < q.n; j++) {
            acc += q.p[j];
            if (u < acc) {
                at = j;
                break;
            }
        }
        int accepted;
        int32_t t =
            spec_rule(p.ids, p.p, p.n, q.ids, q.p, q.n, q.ids[at], q.p[at], &g, scratch, &accepted);
        CHECK(t >= 0 && t < V, "%s: token %d", name, t);
        if (t < 0 || t >= V) return;
        all[t]++;
        if (accepted) {
            n_acc++;
            CHECK(t == q.ids[at], "%s: accepted %d, draft %d", name, t, q.ids[at]);
        } else {
            rej[t]++;
        }
    }
    for (int t = 0; t < V; t++) CHECK(scratch[t] == 0, "%s: scratch left dirty at %d", name, t);
    int dof;
    double x = chi2(all, p.dense, N, &dof);
    CHECK(dof >= 1 && dof < 12 && x < crit999[dof], "%s: kept tokens vs p: chi2 %.2f, dof %d", name,
          x, dof);
    printf("%-10s kept     chi2 %7.2f dof %2d (crit %.2f)  accepted %.4f, sum min(p,q) %.4f\n",
           name, x, dof, dof >= 1 && dof < 12 ? crit999[dof] : 0, (double)n_acc / N, overlap);
    long n_rej = N - n_acc;
    if (n_rej > 0) {
        x = chi2(rej, res, n_rej, &dof);
        CHECK(dof >= 0 && dof < 12 && (dof == 0 || x < crit999[dof]),
              "%s: after rejections vs residual: chi2 %.2f, dof %d", name, x, dof);
        printf("%-10s residual chi2 %7.2f dof %2d (%ld draws)\n", name, x, dof, n_rej);
    }
    double sd = sqrt(overlap * (1 - overlap) / N);
    CHECK(fabs((double)n_acc / N - overlap) <= 5 * sd + 1e-9, "%s: acceptance %.5f, want %.5f",
          name, (double)n_acc / N, overlap);
    if (want >= 0) CHECK(n_acc == (want ? N : 0), "%s: %ld of %ld accepted", name, n_acc, N);
}

int main(void)
{
    /* p on 0..7, q on 2..11, shapes unlike each other */
    const double p1[V] = {3, 1, 4, 1, 5, 9, 2, 6, 0, 0, 0, 0};
    const double q1[V] = {0, 0, 2, 7, 1, 8, 2, 8, 1, 8, 2, 8};
    run_case("overlap", p1, q1, -1);
    run_case("q = p", p1, p1, 1);
    const double q2[V] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4};
    run_case("disjoint", p1, q2, 0);
    /* q close to p but wider: most drafts kept, a residual on p's heavy tokens */
    const double q3[V] = {3, 1, 3, 1, 4, 7, 2, 5, 1, 1, 1, 1};
    run_case("wider", p1, q3, -1);
    TEST_DONE();
}
