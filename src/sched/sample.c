/*
 * Sampling per request: logit bias, penalties, then greedy or temperature with top-k,
 * top-p and min-p filters and a draw from the request's own generator. Works on a copy of
 * the row, so reported log-probabilities stay those of the model.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sched/engine_impl.h"

static int32_t argmax(const float *w, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (w[i] > w[best]) best = i;
    return best;
}

/* Penalties over the request's tokens: repetition (prompt and output, as vLLM), presence
 * and frequency (output only). counts[] is zero on entry and on exit. */
static void apply_penalties(struct engine *en, const struct request *r, float *x)
{
    const struct sampling_params *sp = &r->sp;
    uint32_t *cnt = en->counts;
    int rep = sp->repetition_penalty != 1.0f;
    for (int i = r->n_prompt; i < r->n_tokens; i++) cnt[r->tokens[i]] += 2;
    if (rep)
        for (int i = 0; i < r->n_prompt; i++) cnt[r->tokens[i]] |= 1;
    int from = rep ? 0 : r->n_prompt;
    for (int i = from; i < r->n_tokens; i++) {
        int32_t t = r->tokens[i];
        uint32_t c = cnt[t];
        if (!c) continue; /* a repeat, already applied */
        cnt[t] = 0;
        uint32_t occ = c >> 1;
        if (rep) x[t] = x[t] > 0 ? x[t] / sp->repetition_penalty : x[t] * sp->repetition_penalty;
        if (occ) x[t] -= sp->frequency_penalty * (float)occ + sp->presence_penalty;
    }
}

/* Quickselect: moves the k largest of w over ids[0..n) to the front (any order). */
static void select_top(int32_t *ids, int n, int k, const float *w)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = w[ids[lo + (hi - lo) / 2]];
        int i = lo, j = hi;
        while (i <= j) {
            while (w[ids[i]] > pivot) i++;
            while (w[ids[j]] < pivot) j--;
            if (i <= j) {
                int32_t t = ids[i];
                ids[i++] = ids[j];
                ids[j--] = t;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

/* Total order for sorting: larger weight first, then lower id. */
static int ahead(const float *w, int32_t a, int32_t b)
{
    return w[a] != w[b] ? w[a] > w[b] : a < b;
}

static void sort_desc(int32_t *ids, int n, const float *w)
{
    while (n > 16) {
        int32_t a = ids[0], b = ids[n / 2], c = ids[n - 1], pv;
        if (ahead(w, a, b))
            pv = ahead(w, b, c) ? b : ahead(w, a, c) ? c : a;
        else
            pv = ahead(w, a, c) ? a : ahead(w, b, c) ? c : b;
        int i = 0, j = n - 1;
        while (i <= j) {
            while (ahead(w, ids[i], pv)) i++;
            while (ahead(w, pv, ids[j])) j--;
            if (i <= j) {
                int32_t t = ids[i];
                ids[i++] = ids[j];
                ids[j--] = t;
            }
        }
        /* recurse into the smaller side, loop on the larger */
        if (j + 1 < n - i) {
            sort_desc(ids, j + 1, w);
            ids += i;
            n -= i;
        } else {
            sort_desc(ids + i, n - i, w);
            n = j + 1;
        }
    }
    for (int i = 1; i < n; i++) {
        int32_t t = ids[i];
        int j = i;
        while (j > 0 && ahead(w, t, ids[j - 1])) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = t;
    }
}

/* Walks ids[0..n) (sorted) adding probabilities until they reach keep; the count taken, or
 * -1 if they never do. */
static int walk_until(const int32_t *ids, int n, const float *w, float mx, double inv_t,
                      double keep, double *acc)
{
    double a = 0;
    for (int m = 0; m < n; m++) {
        a += exp((w[ids[m]] - mx) * inv_t);
        if (a >= keep) {
            *acc = a;
            return m + 1;
        }
    }
    *acc = a;
    return -1;
}

/*
 * Top-p: sorts ids[0..n) far enough to hold the smallest prefix (largest weight first, lower
 * id first among equals) whose probabilities add up to keep, and returns its length, the
 * sum in *acc. The nucleus is usually a few tokens of a large vocabulary, so instead of
 * sorting all of it: select the k largest, extend them with every other id that ties the
 * smallest of them (the set is then exactly a prefix of the full order), sort and walk that;
 * only when it falls short, try 8 times as many. The sums run in the same order as over a
 * full sort, so the result is the same.
 */
int sample_nucleus(int32_t *ids, int n, const float *w, float mx, double inv_t, double keep,
                   double *acc)
{
    for (int k = 256; k < n / 2; k *= 8) {
        select_top(ids, n, k, w);
        float wb = w[ids[0]];
        for (int i = 1; i < k; i++)
            if (w[ids[i]] < wb) wb = w[ids[i]];
        int p = k;
        for (int i = k; i < n; i++)
            if (w[ids[i]] >= wb) {
                int32_t t = ids[p];
                ids[p++] = ids[i];
                ids[i] = t;
            }
        sort_desc(ids, p, w);
        int m = walk_until(ids, p, w, mx, inv_t, keep, acc);
        if (m > 0) return m;
    }
    sort_desc(ids, n, w);
    int m = walk_until(ids, n, w, mx, inv_t, keep, acc);
    return m > 0 ? m : n;
}

/* Structured output: tokens the grammar does not allow next get -inf. When none is
 * allowed (the grammar is complete and the vocabulary has no end-of-sequence id the model
 * knows), the row is left as it is: the request ends on this token by its stop check. */
static void apply_grammar(struct engine *en, struct request *r, float *x)
{
    uint32_t *mask = en->gmask;
    if (r->gmask_ready) { /* computed during the forward pass (masks.c) */
        mask = r->gmask;
        r->gmask_ready = 0;
    } else {
        gram_matcher_fill_mask(r->gm, en->gvocab, mask);
    }
    int V = en->vocab, any = 0;
    for (int w = 0; w < (V + 31) / 32; w++) any |= mask[w] != 0;
    if (!any) return;
    for (int w = 0; w < (V + 31) / 32; w++) {
        uint32_t m = mask[w];
        if (m == 0xFFFFFFFFu) continue;
        for (int b = 0; b < 32 && w * 32 + b < V; b++)
            if (!(m >> b & 1)) x[w * 32 + b] = -INFINITY;
    }
}

int32_t sample_next(struct engine *en, struct request *r, const float *logits)
{
    int n;
    return sample_dist(en, r, logits, &r->rng, NULL, &n);
}

int32_t sample_dist(struct engine *en, struct request *r, const float *logits, struct rng *g,
                    float *probs, int *n_out)
{
    const struct sampling_params *sp = &r->sp;
    int V = en->vocab;
    const float *w = logits;
    *n_out = 0;
    if (sp->n_logit_bias || sp->repetition_penalty != 1.0f || sp->presence_penalty != 0 ||
        sp->frequency_penalty != 0 || r->gm) {
        float *x = en->work;
        memcpy(x, logits, sizeof(float) * (size_t)V);
        for (int i = 0; i < sp->n_logit_bias; i++)
            x[sp->logit_bias[i].id] += sp->logit_bias[i].bias;
        apply_penalties(en, r, x);
        if (r->gm) apply_grammar(en, r, x);
        w = x;
    }
    if (sp->temperature <= 0) return argmax(w, V);

    int32_t *ids = en->cand;
    int n = 0;
    for (int i = 0; i < V; i++)
        if (w[i] > -INFINITY) ids[n++] = i;
    if (n == 0) return argmax(w, V);
    if (sp->top_k > 0 && sp->top_k < n) {
        select_top(ids, n, sp->top_k, w);
        n = sp->top_k;
    }
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (w[ids[i]] > mx) mx = w[ids[i]];
    double inv_t = 1.0 / sp->temperature;
    /* min-p: keep tokens whose probability is at least min_p times the largest. */
    if (sp->min_p > 0) {
        double cut = log(sp->min_p) / inv_t + mx; /* exp((w - mx)/T) >= min_p */
        int m = 0;
        for (int i = 0; i < n; i++)
            if (w[ids[i]] >= cut) ids[m++] = ids[i];
        n = m;
    }
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((w[ids[i]] - mx) * inv_t);
    if (sp->top_p < 1.0f) {
        double keep = sp->top_p * sum, acc = 0;
        int m = sample_nucleus(ids, n, w, mx, inv_t, keep, &acc);
        n = m;
        sum = acc;
    }
    *n_out = n;
    if (probs)
        for (int i = 0; i < n; i++) probs[i] = (float)(exp((w[ids[i]] - mx) * inv_t) / sum);
    if (!g) return ids[0];
    double u = rng_uniform(g) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp((w[ids[i]] - mx) * inv_t);
        if (u < acc) return ids[i];
    }
    return ids[n - 1];
}
