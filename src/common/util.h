/*
 * util: small helpers shared by every module: checked allocation, whole-file reads,
 * a monotonic clock and half-precision conversions.
 */
#ifndef PAGODA_COMMON_UTIL_H
#define PAGODA_COMMON_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/err.h"

/** malloc/calloc/realloc that abort with a message on exhaustion (start-up sized buffers). */
void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/** Reads a whole file into a NUL-terminated heap buffer; *len gets its size. NULL + err on failure.
 */
char *util_read_file(const char *path, size_t *len, struct err *e);

/** Seconds on a monotonic clock. */
double util_now(void);

/** Number of online CPU cores. */
int util_num_cores(void);
/* Raises the soft open-files limit to the hard one (every connection is a descriptor) and
 * prints "WHO: open files limit raised from A to B" when it did. Returns the soft limit now
 * (ULLONG_MAX when unlimited) and the hard one in *hard; 0 when the limits cannot be read. */
unsigned long long util_raise_nofile(const char *who, unsigned long long *hard);

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/** Round-to-nearest-even float -> bf16 (NaN stays NaN). */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

#endif
