/*
 * Sampled drafts and their verification by rejection sampling (speculative sampling, Leviathan
 * et al. and Chen et al. 2023), for the drafters with a law of their own (draft model, MTP,
 * EAGLE-3) and requests that sample.
 *
 * Draft j is drawn from q_j, the drafter's row after the request's own processing (logit
 * bias, penalties over the context with drafts 0..j-1 as output, temperature, top-k, min-p,
 * top-p: sample_dist, as the target's rows are processed), with the uniform number of the
 * output position it stands for: the request's generator is read ahead (rng_peek), not wound
 * on, so that output position i always takes the i-th number whatever was drafted. The
 * verification of row j accepts the draft d with probability min(1, p_j(d) / q_j(d)) and
 * otherwise draws from max(0, p_j - q_j) normalized; both numbers come from a second
 * generator of the request (rng_spec). A token after every draft was kept (the bonus row), and
 * rows past the drafts with a law (greedy drafts where the arena ran out), take the target's
 * own draw as plain decoding does. Where q_j = p_j (the model drafting for itself) every draft
 * is kept and the tokens are those of plain decoding bitwise; otherwise a seeded request's
 * tokens depend on its seed and on which positions carried drafts.
 *
 * The laws are kept sparse: a draft's candidates and their probabilities in the spec's arena
 * (at most the vocabulary a draft; refilled from the start every step), which the residual
 * needs in full. Cost a sampled draft: its logits row copied to the host, one pass of the
 * sampler over it; a verified row: one more pass over the target's row, and for a rejection
 * a walk over both laws.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sched/spec.h"

void spec_q_init(struct engine *en)
{
    struct spec *s = en->spec;
    if (s->cfg.method != SPEC_DRAFT && s->cfg.method != SPEC_MTP && s->cfg.method != SPEC_EAGLE3)
        return;
    /* Requests that draft in a step: fewer than disable_n (spec_k), at most max_num_seqs. The
     * arena's pages are touched only as sampled drafts fill it, from its start. */
    int seqs = en->cfg.max_num_seqs > 0 && en->cfg.max_num_seqs < s->disable_n
                   ? en->cfg.max_num_seqs
                   : s->disable_n;
    s->q_cap = (size_t)seqs * (size_t)s->cfg.num_tokens * (size_t)en->vocab;
    s->q_ids = xmalloc(sizeof(int32_t) * s->q_cap);
    s->q_p = xmalloc(sizeof(float) * s->q_cap);
    s->row = xmalloc(sizeof(float) * (size_t)en->vocab);
    s->dl = xmalloc(sizeof(float) * (size_t)en->vocab);
    s->pp = xmalloc(sizeof(float) * (size_t)en->vocab);
    s->dense = xcalloc((size_t)en->vocab, sizeof(float));
}

void spec_q_dispose(struct spec *s)
{
    free(s->q_ids);
    free(s->q_p);
    free(s->row);
    free(s->dl);
    free(s->pp);
    free(s->dense);
}

int32_t spec_q_pick(struct engine *en, struct request *r, int j, const struct model *dm, int row,
                    const int32_t *d2t, int32_t pick)
{
    struct spec *s = en->spec;
    const int V = en->vocab, Vd = dm->cfg.vocab;
    if (!s->q_ids || r->sp.temperature <= 0 || j != r->n_q || s->q_used + (size_t)V > s->q_cap)
        return pick; /* greedy: a point mass, verified as such */
    const float *src = dm->logits + (size_t)row * (size_t)Vd;
    float *x = s->row;
    if (d2t) { /* the draft vocabulary's logits at their target ids, -inf elsewhere */
        en->be.ops->download(en->be.ctx, s->dl, src, sizeof(float) * (size_t)Vd);
        for (int i = 0; i < V; i++) x[i] = -INFINITY;
        for (int i = 0; i < Vd; i++) x[i + d2t[i]] = s->dl[i];
    } else {
        en->be.ops->download(en->be.ctx, x, src, sizeof(float) * (size_t)V);
    }
    if (j == 0) r->rng_peek = r->rng;
    struct rng g = r->rng_peek;
    const int base = r->n_tokens;
    int n;
    float *qp = s->q_p + s->q_used;
    r->n_tokens = base + j; /* the penalties see drafts 0..j-1 as output */
    int32_t t = sample_dist(en, r, x, &g, qp, &n);
    r->n_tokens = base;
    if (n == 0) return pick; /* no finite logit: no law to draw from */
    int at = 0;
    while (en->cand[at] != t) at++;
    memcpy(s->q_ids + s->q_used, en->cand, sizeof(int32_t) * (size_t)n);
    r->q_off[j] = s->q_used;
    r->q_n[j] = n;
    r->q_d[j] = qp[at];
    s->q_used += (size_t)n;
    r->rng_peek = g;
    r->n_q = j + 1;
    return t;
}

int32_t spec_rule(const int32_t *p_ids, const float *p, int p_n, const int32_t *q_ids,
                  const float *q, int q_n, int32_t d, float qd, struct rng *g, float *scratch,
                  int *accepted)
{
    float pd = 0;
    for (int i = 0; i < p_n; i++)
        if (p_ids[i] == d) {
            pd = p[i];
            break;
        }
    /* q(d) > 0: d was drawn from q */
    if (rng_uniform(g) * qd < pd) {
        *accepted = 1;
        return d;
    }
    *accepted = 0;
    for (int i = 0; i < q_n; i++) scratch[q_ids[i]] = q[i];
    double sum = 0, acc = 0;
    for (int i = 0; i < p_n; i++) {
        double x = (double)p[i] - scratch[p_ids[i]];
        if (x > 0) sum += x;
    }
    double u = rng_uniform(g);
    int32_t t = -1;
    if (sum > 0) {
        u *= sum;
        for (int i = 0; i < p_n; i++) {
            double x = (double)p[i] - scratch[p_ids[i]];
            if (x <= 0) continue;
            t = p_ids[i];
            acc += x;
            if (u < acc) break;
        }
    } else { /* p <= q everywhere to rounding (a rejection at p = q): p itself */
        for (int i = 0; i < p_n; i++) sum += p[i];
        u *= sum;
        for (int i = 0; i < p_n; i++) {
            t = p_ids[i];
            acc += p[i];
            if (u < acc) break;
        }
    }
    for (int i = 0; i < q_n; i++) scratch[q_ids[i]] = 0;
    return t;
}

int32_t spec_q_verify(struct engine *en, struct request *r, int j, const float *logits,
                      int *accepted)
{
    struct spec *s = en->spec;
    int n;
    /* the target's law at row j (r->n_tokens is the row's context); its candidates in
     * en->cand */
    sample_dist(en, r, logits, NULL, s->pp, &n);
    rng_uniform(&r->rng); /* the number of this output position, which drew the draft */
    return spec_rule(en->cand, s->pp, n, s->q_ids + r->q_off[j], s->q_p + r->q_off[j], r->q_n[j],
                     r->tokens[r->n_tokens], r->q_d[j], &r->rng_spec, s->dense, accepted);
}
