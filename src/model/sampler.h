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

/** Greedy (temperature <= 0) or temperature sampling. */
int32_t sampler_pick(const float *logits, int n, float temperature, struct rng *r);

#endif
