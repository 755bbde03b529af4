/*
 * The host sampler's draw against backend_ops.sample's definition, computed the plain way:
 * the finite candidates sorted in canonical order (larger value first, lower index first
 * among equals), top-k, min-p and top-p cuts as prefixes of that order, fixed-point weights
 * (the CUDA kernel's: expf((v - max) * (1 / T)) * 2^40 truncated, in float) and a walk to
 * the first candidate whose cumulative weight reaches floor(u * total) + 1. The sampler
 * selects instead of sorting; the tokens, the kept sets and their weights must be identical.
 * Rows: vocabularies of real size and small ones, many ties, -inf entries, every value equal,
 * peaked and flat; T 0.6, 1 and 1.5; top-k, top-p and min-p alone and together; u at 0, near
 * 0, near 1 and 1 (a double draw near 1 rounds to 1.0f). Then sample_dist (the engine's
 * sampler) on a bare engine: its token for a request's generator is the definition's for
 * the draw rounded to float, its law is the kept set, and its probabilities add up to 1.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/backend.h"
#include "model/sampler.h"
#include "sched/engine_impl.h"
#include "test_rand.h"
#include "test_util.h"

static const float *cmp_x;

static int by_order(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (cmp_x[i] != cmp_x[j]) return cmp_x[i] > cmp_x[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

static int by_id(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    return i < j ? -1 : i > j;
}

/* A row and its finite candidates in canonical order. */
struct row {
    float *x;
    int n;
    int32_t *ord;
    int f;
};

static void row_sort(struct row *r)
{
    r->f = 0;
    for (int i = 0; i < r->n; i++)
        if (r->x[i] > -INFINITY) r->ord[r->f++] = i;
    cmp_x = r->x;
    qsort(r->ord, (size_t)r->f, sizeof(int32_t), by_order);
}

/* The definition: the token, the kept candidates (ord[0..*kept)) and their weight. */
static int32_t ref_pick(const struct row *r, const struct sample_row *p, int *kept, uint64_t *total)
{
    *kept = 0;
    *total = 0;
    if (p->temperature <= 0 || r->f == 0) return r->f ? r->ord[0] : 0;
    const float mx = r->x[r->ord[0]], inv_t = 1.0f / p->temperature;
    int m = r->f;
    if (p->top_k > 0 && p->top_k < m) m = p->top_k;
    if (p->min_p > 0) {
        const float cut = (float)((double)mx + log((double)p->min_p) / (double)inv_t);
        int k = 0;
        while (k < m && r->x[r->ord[k]] >= cut) k++;
        m = k;
    }
    uint64_t *w = xmalloc(sizeof(uint64_t) * (size_t)(m + 1)), tot = 0;
    for (int i = 0; i < m; i++) {
        w[i] = (uint64_t)(expf((r->x[r->ord[i]] - mx) * inv_t) * 1099511627776.0f);
        tot += w[i];
    }
    if (p->top_p < 1) {
        uint64_t need = (uint64_t)ceil((double)p->top_p * (double)tot), acc = 0;
        if (need < 1) need = 1;
        if (need > tot) need = tot;
        int k = 0;
        while (acc < need) acc += w[k++];
        m = k;
        tot = acc;
    }
    uint64_t need = (uint64_t)floor((double)p->u * (double)tot) + 1, acc = 0;
    if (need > tot) need = tot;
    int k = 0;
    while (acc < need) acc += w[k++];
    free(w);
    *kept = m;
    *total = tot;
    return r->ord[k - 1];
}

static const char *label = "";

/* sampler_row_pick on row r under p against the definition. */
static void check_pick(const struct row *r, const struct sample_row *p, struct sampler_cand *c)
{
    int kept;
    uint64_t total;
    const int32_t want = ref_pick(r, p, &kept, &total);
    const int32_t got = sampler_row_pick(r->x, r->n, p, c);
    CHECK(got == want, "%s T=%g k=%d p=%g min_p=%g u=%.9g: token %d, the definition %d", label,
          p->temperature, p->top_k, p->top_p, p->min_p, p->u, got, want);
}

/* sampler_cut on row r under p: the definition's kept candidates and weight. */
static void check_cut(const struct row *r, const struct sample_row *p, struct sampler_cand *c,
                      int32_t *ids)
{
    int kept;
    uint64_t total, t;
    ref_pick(r, p, &kept, &total);
    int m = sampler_cut(r->x, r->n, p, c, &t);
    CHECK(m == kept && t == total,
          "%s T=%g k=%d p=%g min_p=%g: %d kept of weight %llu, the definition %d of %llu", label,
          p->temperature, p->top_k, p->top_p, p->min_p, m, (unsigned long long)t, kept,
          (unsigned long long)total);
    if (m != kept) return;
    /* the same candidates (the sampler leaves them in any order) */
    int32_t *ref = ids + m;
    for (int i = 0; i < m; i++) ids[i] = c[i].id;
    memcpy(ref, r->ord, sizeof(int32_t) * (size_t)m);
    qsort(ids, (size_t)m, sizeof(int32_t), by_id);
    qsort(ref, (size_t)m, sizeof(int32_t), by_id);
    CHECK(!memcmp(ids, ref, sizeof(int32_t) * (size_t)m),
          "%s T=%g k=%d p=%g min_p=%g: the kept candidates differ from the definition's", label,
          p->temperature, p->top_k, p->top_p, p->min_p);
}

/* Logit rows: kind 0 normal * 3 (a model's spread), 1 a few large and most small, 2 values
 * rounded to 0.25 (ties), 3 every value equal, 4 flat (normal * 0.2); a share `holes` of
 * -inf entries. */
static void fill(struct row *r, int kind, double holes)
{
    for (int i = 0; i < r->n; i++) {
        double v;
        switch (kind) {
        case 0:
            v = 3.0 * gauss();
            break;
        case 1:
            v = 30.0 * urand() * urand();
            break;
        case 2:
            v = floor(12.0 * urand() * urand() / 0.25) * 0.25;
            break;
        case 3:
            v = 1.5;
            break;
        default:
            v = 0.2 * gauss();
            break;
        }
        r->x[i] = urand() < holes ? -INFINITY : (float)v;
    }
    row_sort(r);
}

static void test_rows(void)
{
    static const int sizes[] = {151936, 128256, 32000, 300, 17, 1};
    static const float temps[] = {0.6f, 1.0f, 1.5f};
    static const struct {
        int k;
        float p, min_p;
    } cuts[] = {{0, 1, 0},        {40, 1, 0},       {1, 1, 0},     {0, 0.9f, 0},
                {0, 0.1f, 0},     {0, 0.999f, 0},   {0, 1, 0.05f}, {40, 0.8f, 0.02f},
                {1000, 0.95f, 0}, {0, 0.5f, 0.001f}};
    /* fixed draws: 0, the smallest steps above it, the middle, the largest float below 1, 1 */
    static const float us[] = {0.0f, 1e-9f, 5.9604645e-8f, 0.5f, 0.99999994f, 1.0f};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        struct row r = {.n = sizes[si]};
        r.x = xmalloc(sizeof(float) * (size_t)r.n);
        r.ord = xmalloc(sizeof(int32_t) * (size_t)r.n);
        struct sampler_cand *c = xmalloc(sizeof(struct sampler_cand) * (size_t)r.n);
        int32_t *ids = xmalloc(sizeof(int32_t) * 2 * (size_t)r.n);
        for (int kind = 0; kind < 5; kind++) {
            fill(&r, kind, kind == 2 ? 0.3 : kind == 0 ? 0.01 : 0);
            char what[64];
            snprintf(what, sizeof what, "n=%d kind %d", r.n, kind);
            label = what;
            struct sample_row p = {0};
            check_pick(&r, &p, c); /* greedy */
            for (size_t ti = 0; ti < sizeof temps / sizeof temps[0]; ti++)
                for (size_t ci = 0; ci < sizeof cuts / sizeof cuts[0]; ci++) {
                    p = (struct sample_row){.temperature = temps[ti],
                                            .top_k = cuts[ci].k,
                                            .top_p = cuts[ci].p,
                                            .min_p = cuts[ci].min_p};
                    check_cut(&r, &p, c, ids);
                    for (size_t ui = 0; ui < sizeof us / sizeof us[0]; ui++) {
                        p.u = us[ui];
                        check_pick(&r, &p, c);
                    }
                    for (int d = 0; d < (r.n > 50000 ? 3 : 40); d++) {
                        p.u = (float)urand();
                        check_pick(&r, &p, c);
                    }
                }
        }
        /* no finite value: token 0, sampled or greedy */
        for (int i = 0; i < r.n; i++) r.x[i] = -INFINITY;
        row_sort(&r);
        struct sample_row p = {.temperature = 1.0f, .top_p = 1, .u = 0.3f};
        CHECK(sampler_row_pick(r.x, r.n, &p, c) == 0, "n=%d: all -inf sampled", r.n);
        p.temperature = 0;
        CHECK(sampler_row_pick(r.x, r.n, &p, c) == 0, "n=%d: all -inf greedy", r.n);
        free(r.x);
        free(r.ord);
        free(c);
        free(ids);
    }
}

/* Every value equal: canonical order is index order, so u picks index floor(u * n). */
static void test_ties(void)
{
    const int n = 32000;
    float *x = xmalloc(sizeof(float) * n);
    struct sampler_cand *c = xmalloc(sizeof(struct sampler_cand) * n);
    for (int i = 0; i < n; i++) x[i] = 1.5f;
    for (int d = 0; d < 200; d++) {
        struct sample_row p = {.temperature = 1.0f, .top_p = 1, .u = (float)urand()};
        int32_t t = sampler_row_pick(x, n, &p, c);
        CHECK(t == (int32_t)floor((double)p.u * n), "ties: token %d for u = %.9g", t, p.u);
    }
    free(x);
    free(c);
}

/* sample_dist on a bare engine (no penalties, no grammar) against the definition with the
 * request's next uniform number rounded to float. */
static void test_sample_dist(void)
{
    const int V = 32000;
    struct engine en;
    memset(&en, 0, sizeof en);
    en.vocab = V;
    en.work = xcalloc(V, sizeof(float));
    en.counts = xcalloc(V, sizeof(uint32_t));
    en.cand = xcalloc(V, sizeof(int32_t));
    en.scand = xcalloc(V, sizeof(struct sampler_cand));
    struct request rq;
    memset(&rq, 0, sizeof rq);
    int32_t toks[4] = {0};
    rq.tokens = toks;
    sampling_params_default(&rq.sp);
    rng_seed(&rq.rng, 4242);
    struct row r = {.n = V};
    r.x = xmalloc(sizeof(float) * V);
    r.ord = xmalloc(sizeof(int32_t) * V);
    float *probs = xmalloc(sizeof(float) * V);
    label = "sample_dist";
    for (int it = 0; it < 60; it++) {
        fill(&r, it % 5, it % 3 == 0 ? 0.1 : 0);
        rq.sp.temperature = it % 4 == 0 ? 0.6f : it % 4 == 1 ? 1.5f : 1.0f;
        rq.sp.top_k = it % 3 == 1 ? 40 : 0;
        rq.sp.top_p = it % 5 == 2 ? 0.9f : 1.0f;
        rq.sp.min_p = it % 7 == 3 ? 0.05f : 0.0f;
        struct rng next = rq.rng;
        const struct sample_row p = {.temperature = rq.sp.temperature,
                                     .top_k = rq.sp.top_k,
                                     .top_p = rq.sp.top_p,
                                     .min_p = rq.sp.min_p,
                                     .u = (float)rng_uniform(&next)};
        int kept, n;
        uint64_t total;
        const int32_t want = ref_pick(&r, &p, &kept, &total);
        const int32_t got = sample_dist(&en, &rq, r.x, &rq.rng, probs, &n);
        CHECK(got == want, "sample_dist %d: token %d, the definition %d (u = %.9g)", it, got, want,
              p.u);
        CHECK(!memcmp(&rq.rng, &next, sizeof next), "sample_dist %d: one number drawn", it);
        CHECK(n == kept, "sample_dist %d: %d candidates, the definition keeps %d", it, n, kept);
        double s = 0;
        int at = -1;
        for (int i = 0; i < n; i++) {
            s += probs[i];
            if (en.cand[i] == got) at = i;
        }
        /* float probabilities added in double: 1 within n float roundings */
        CHECK(fabs(s - 1) < 1e-7 * n + 1e-6, "sample_dist %d: probabilities add up to %.9f", it, s);
        CHECK(at >= 0 && probs[at] > 0, "sample_dist %d: the token is not in the law", it);
        /* the law alone (no draw) is the same set */
        int n2;
        sample_dist(&en, &rq, r.x, NULL, probs, &n2);
        CHECK(n2 == n, "sample_dist %d: %d candidates without a draw, %d with", it, n2, n);
    }
    free(r.x);
    free(r.ord);
    free(probs);
    free(en.work);
    free(en.counts);
    free(en.cand);
    free(en.scand);
}

int main(void)
{
    test_rows();
    test_ties();
    test_sample_dist();
    TEST_DONE();
}
