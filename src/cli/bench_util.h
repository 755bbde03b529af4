/* Helpers shared by the bench subcommands. */
#ifndef PAGODA_CLI_BENCH_UTIL_H
#define PAGODA_CLI_BENCH_UTIL_H

#include <stdint.h>

/** A 64-bit mixer (splitmix64's finalizer): bench_mix(seed + i) is the i-th value of a
 * stream, so any piece of a random tensor is computed without the pieces before it. */
static inline uint64_t bench_mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

#endif
