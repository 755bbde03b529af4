#include "model/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "model/backend.h"

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(struct rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s, res = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return res;
}

double rng_uniform(struct rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static double log_sum_exp(const float *x, int n)
{
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

float sampler_logprob(const float *logits, int n, int32_t id)
{
    return (float)((double)logits[id] - log_sum_exp(logits, n));
}

void sampler_top_logprobs(const float *logits, int n, int k, struct token_logprob *out)
{
    if (k > n) k = n;
    double lse = log_sum_exp(logits, n);
    int cnt = 0;
    /* Insertion into a sorted array of k: O(n * k), k is small (<= 20). */
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (cnt == k && v <= logits[out[cnt - 1].id]) continue;
        int j = cnt < k ? cnt++ : k - 1;
        while (j > 0 && logits[out[j - 1].id] < v) {
            out[j] = out[j - 1];
            j--;
        }
        out[j].id = i;
    }
    for (int i = 0; i < cnt; i++) out[i].logprob = (float)((double)logits[out[i].id] - lse);
}

/* Canonical order: larger value first, then lower id (-0 and +0 are equal values). */
static inline int ahead(const struct sampler_cand *a, const struct sampler_cand *b)
{
    return a->v != b->v ? a->v > b->v : a->id < b->id;
}

static inline void swap(struct sampler_cand *a, struct sampler_cand *b)
{
    struct sampler_cand t = *a;
    *a = *b;
    *b = t;
}

/* The kernel's fixed_weight: expf((v - mx) * inv_t) * 2^40 truncated, every step in float.
 * NaN (v = mx with 1 / T infinite, or v = mx = +inf) weighs 1, the limit; the kernel is not
 * matched on such rows. */
static inline uint64_t fixed_weight(float v, float mx, float inv_t)
{
    float e = expf((v - mx) * inv_t) * 1099511627776.0f;
    return e == e ? (uint64_t)e : (uint64_t)1 << 40;
}

/* The top 12 bits of the value made order-preserving (-0 as +0): a larger bucket is ahead.
 * Without branches: the sign of a logit is a coin toss. */
#define SELECT_BUCKETS 4096
static inline unsigned bucket(float v)
{
    union {
        float f;
        uint32_t u;
    } b = {.f = v};
    uint32_t u = b.u == 0x80000000u ? 0 : b.u;
    return (u ^ ((0u - (u >> 31)) | 0x80000000u)) >> 20;
}

/*
 * Reorders c[0..n) so that the candidate at which, walked in canonical order, the weight
 * (by_count: the count) first reaches need (1 <= need <= the total) is at the position
 * returned, p; with prefix set, those before it are in c[0..p) (in any order) and those
 * after it behind. *sum = the weight of the candidates up to it.
 *
 * A large range selected by weight first takes one radix step: a pass adds the weights by
 * bucket of the value's top 12 bits, and a pass (two with prefix) moves the bucket holding
 * the target forward; their branches are rarely mispredicted (most candidates are on one
 * side), where a partition's are a coin toss when the target lies mid-way (as a flat row's
 * draw does: measured 0.3 ms instead of 1.4 ms a draw over 128,256 candidates on one x86 core).
 * Then a quickselect with pivots at pseudo-random positions (the result does not depend on them)
 * keeps the side holding the target: expected about 3m comparisons over m candidates (the bucket;
 * every candidate when all values are equal). By count (top-k: the target near the front) the
 * quickselect alone is faster.
 */
static int select_canon(struct sampler_cand *c, int n, uint64_t need, int by_count, int prefix,
                        uint64_t *sum)
{
    uint64_t before = 0, r = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    int lo = 0, hi = n;
    if (need < 1) need = 1;
    if (n > 1024 && !by_count) {
        uint64_t hist[SELECT_BUCKETS] = {0};
        for (int i = 0; i < n; i++) hist[bucket(c[i].v)] += c[i].w;
        unsigned b = SELECT_BUCKETS - 1;
        for (; b > 0 && before + hist[b] < need; b--) before += hist[b];
        if (prefix)
            for (int i = 0; i < n; i++)
                if (bucket(c[i].v) > b) swap(&c[i], &c[lo++]);
        hi = lo;
        for (int i = lo; i < n; i++)
            if (bucket(c[i].v) == b) swap(&c[i], &c[hi++]);
        need -= before;
    }
    while (hi - lo > 16) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        swap(&c[lo + (int)(r % (uint64_t)(hi - lo))], &c[hi - 1]);
        const struct sampler_cand pv = c[hi - 1];
        int s = lo;
        uint64_t wa = 0;
        for (int i = lo; i < hi - 1; i++)
            if (ahead(&c[i], &pv)) {
                wa += by_count ? 1 : c[i].w;
                swap(&c[i], &c[s++]);
            }
        c[hi - 1] = c[s];
        c[s] = pv;
        const uint64_t wp = by_count ? 1 : pv.w;
        if (need <= wa) {
            hi = s; /* in the part ahead of the pivot (wa >= 1: not empty) */
        } else if (need - wa <= wp) {
            *sum = before + wa + wp;
            return s;
        } else {
            need -= wa + wp;
            before += wa + wp;
            lo = s + 1;
        }
    }
    for (int i = lo + 1; i < hi; i++) {
        struct sampler_cand t = c[i];
        int j = i;
        while (j > lo && ahead(&t, &c[j - 1])) {
            c[j] = c[j - 1];
            j--;
        }
        c[j] = t;
    }
    uint64_t acc = 0;
    for (int i = lo; i < hi; i++) {
        acc += by_count ? 1 : c[i].w;
        if (acc >= need || i == hi - 1) {
            *sum = before + acc;
            return i;
        }
    }
    *sum = before;
    return lo; /* not reached: the range is never empty */
}

int sampler_cut(const float *x, int n, const struct sample_row *p, struct sampler_cand *c,
                uint64_t *total)
{
    int m = 0;
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > -INFINITY) {
            c[m].v = x[i];
            c[m++].id = i;
            if (x[i] > mx) mx = x[i];
        }
    *total = 0;
    if (m == 0) return 0;
    const float inv_t = 1.0f / p->temperature;
    if (p->min_p > 0.0f) { /* a value threshold: the kept stay a prefix of the order */
        const float cut = (float)((double)mx + log((double)p->min_p) / (double)inv_t);
        int k = 0;
        for (int i = 0; i < m; i++)
            if (c[i].v >= cut) c[k++] = c[i];
        m = k;
        if (m == 0) return 0; /* min_p > 1 */
    }
    uint64_t s;
    if (p->top_k > 0 && p->top_k < m) m = select_canon(c, m, (uint64_t)p->top_k, 1, 1, &s) + 1;
    uint64_t tot = 0;
    for (int i = 0; i < m; i++) tot += c[i].w = fixed_weight(c[i].v, mx, inv_t);
    if (p->top_p < 1.0f) {
        uint64_t need = (uint64_t)ceil((double)p->top_p * (double)tot);
        need = need < 1 ? 1 : need > tot ? tot : need;
        m = select_canon(c, m, need, 0, 1, &tot) + 1;
    }
    *total = tot;
    return m;
}

int sampler_draw(struct sampler_cand *c, int m, uint64_t total, float u)
{
    uint64_t need = (uint64_t)floor((double)u * (double)total) + 1, s;
    if (need > total) need = total;
    return select_canon(c, m, need, 0, 0, &s);
}

int32_t sampler_row_pick(const float *x, int n, const struct sample_row *p, struct sampler_cand *c)
{
    uint64_t total;
    int m = p->temperature > 0.0f ? sampler_cut(x, n, p, c, &total) : 0;
    if (m > 0) return c[sampler_draw(c, m, total, p->u)].id;
    int32_t best = -1;
    for (int i = 0; i < n; i++)
        if (x[i] > -INFINITY && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : best;
}
