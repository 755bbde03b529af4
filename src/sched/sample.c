/*
 * Sampling per request: logit bias, penalties, then greedy or temperature with top-k,
 * top-p and min-p filters and a draw from the request's own generator. Works on a copy of
 * the row, so reported log-probabilities stay those of the model. The filters and the draw
 * are backend_ops.sample's, computed as the CUDA kernel does (model/sampler.h): a seeded
 * request gets the same tokens whether its rows are sampled here or on the GPU.
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

    /* the kept candidates and the draw as backend_ops.sample defines them (model/sampler.h),
     * so a row gives the same token on the host as where the logits are */
    const struct sample_row row = {
        .temperature = sp->temperature, .top_k = sp->top_k, .top_p = sp->top_p, .min_p = sp->min_p};
    struct sampler_cand *c = en->scand;
    uint64_t total;
    int n = sampler_cut(w, V, &row, c, &total);
    if (n == 0) return argmax(w, V);
    int at = g ? sampler_draw(c, n, total, (float)rng_uniform(g)) : 0;
    int32_t *ids = en->cand;
    float mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        ids[i] = c[i].id;
        if (c[i].v > mx) mx = c[i].v;
    }
    *n_out = n;
    if (probs) { /* the law in double, for log-probabilities and the speculative rule */
        double inv_t = 1.0 / sp->temperature, sum = 0;
        for (int i = 0; i < n; i++) sum += exp((c[i].v - mx) * inv_t);
        for (int i = 0; i < n; i++) probs[i] = (float)(exp((c[i].v - mx) * inv_t) / sum);
    }
    return c[at].id;
}
