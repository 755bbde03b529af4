#include "model/sampler.h"

#include <math.h>
#include <stdlib.h>

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

int32_t sampler_pick(const float *logits, int n, float temperature, struct rng *r)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (temperature <= 0) return best;
    double mx = logits[best], sum = 0;
    for (int i = 0; i < n; i++) sum += exp((logits[i] - mx) / temperature);
    double u = rng_uniform(r) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp((logits[i] - mx) / temperature);
        if (acc > u) return i;
    }
    return best;
}
