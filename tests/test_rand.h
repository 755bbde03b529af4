/* A test's own random numbers (xorshift64), the same on every machine: define TEST_RAND_SEED
 * before the include for another sequence. */
#ifndef PAGODA_TESTS_TEST_RAND_H
#define PAGODA_TESTS_TEST_RAND_H

#include <math.h>
#include <stdint.h>

#ifndef TEST_RAND_SEED
#define TEST_RAND_SEED 0x9e3779b97f4a7c15ull
#endif

static uint64_t rng = TEST_RAND_SEED;

/* Uniform in [0, 1). */
static inline double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* Standard normal (Box-Muller). */
static inline float gauss(void)
{
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

#endif
