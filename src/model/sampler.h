/*
 * sampler: picking the next token from a row of logits, and the log-probabilities
 * reported with it. Log-probabilities are always those of the model's distribution
 * (before temperature), as OpenAI-compatible servers report them.
 */
#ifndef PAGODA_MODEL_SAMPLER_H
#define PAGODA_MODEL_SAMPLER_H

#include <stdint.h>

struct token_logprob {
    int32_t id;
    float logprob;
};

/** A small, fast, seedable generator (splitmix64 seeding a xoshiro256**). */
struct rng {
    uint64_t s[4];
};
void rng_seed(struct rng *r, uint64_t seed);
uint64_t rng_next(struct rng *r);
/** Uniform double in [0, 1). */
double rng_uniform(struct rng *r);

/** log-softmax of logits[id] over n entries (computed in double). */
float sampler_logprob(const float *logits, int n, int32_t id);

/** The k most likely tokens with their log-probabilities, best first (ties: lower id). */
void sampler_top_logprobs(const float *logits, int n, int k, struct token_logprob *out);

/*
 * backend_ops.sample's definition on the host, with the CUDA kernel's arithmetic
 * (kernels/cuda/sample.cu), so that a row gives the same token for the same uniform number
 * whichever side samples it. Candidates are the finite values in canonical order (larger
 * value first, then lower index). A candidate's weight is exp((v - max) * (1 / T)) in float
 * (expf), as a multiple of 2^-40 truncated to an integer; sums are exact. Top-k keeps the
 * first k, min-p the values >= (float)(max + ln(min_p) / (1 / T)) (in double), top-p the
 * shortest prefix whose weight reaches ceil(top_p * total), and the draw takes the first
 * kept candidate at which the cumulative weight reaches floor(u * total) + 1 (at most the
 * total). No row is sorted: each cut and the draw is a selection over the canonical order
 * (a radix pass over the values' top bits, then a quickselect: expected O(n)). The token can
 * differ from the kernel's only where glibc's expf and CUDA's differ (CUDA's is within
 * 2 ulp) and a threshold falls within those few units: with 1-ulp errors on 30 % of the
 * weights, a simulation finds 1 to 4 draws in 10^5 differ on flat rows of 128k candidates,
 * none on peaked rows of 32k.
 */
struct sample_row;

/** A candidate of the row being sampled: its value, its id and its fixed-point weight. */
struct sampler_cand {
    float v;
    int32_t id;
    uint64_t w;
};

/** The candidates that row x[0..n) keeps under p (temperature > 0), with their weights, in
 * c[0..m) (c: room for n; any order, the largest value among them); returns m (0: no
 * finite value) and their total weight in *total. */
int sampler_cut(const float *x, int n, const struct sample_row *p, struct sampler_cand *c,
                uint64_t *total);

/** The position in c[0..m) (sampler_cut's) of the candidate that the uniform number u draws;
 * reorders c. */
int sampler_draw(struct sampler_cand *c, int m, uint64_t total, float u);

/** The token backend_ops.sample gives for row x[0..n) under p (p->u the draw); greedy
 * (temperature <= 0): the largest value, the lowest index among equals, 0 if none is
 * finite. c: scratch for n candidates. */
int32_t sampler_row_pick(const float *x, int n, const struct sample_row *p, struct sampler_cand *c);

#endif
