/*
 * Random weight matrices of every format for the kernel tests: codes are random bits,
 * float values and scales in a sane range (no NaN codes), affine scales and biases in a
 * chosen dtype. The generator is a fixed xorshift, seeded by TEST_SEED (define it before
 * including) or by assigning test_rs.
 */
#ifndef PAGODA_TESTS_TEST_MAT_H
#define PAGODA_TESTS_TEST_MAT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/weights.h"

#ifndef TEST_SEED
#define TEST_SEED 0x1234567
#endif

static uint64_t test_rs = TEST_SEED;

static inline uint32_t rnd(void)
{
    test_rs ^= test_rs << 13;
    test_rs ^= test_rs >> 7;
    test_rs ^= test_rs << 17;
    return (uint32_t)(test_rs >> 16);
}

/* Uniform in [-1, 1]. */
static inline float frand(void)
{
    return (float)(rnd() % 2000001) / 1000000.0f - 1.0f;
}

struct test_mat {
    struct qweight w;
    uint8_t *data, *scales, *biases;
};

static inline void test_mat_make(struct test_mat *m, enum wfmt fmt, int bits, int group, int64_t n,
                                 int64_t k, enum st_dtype sdtype)
{
    memset(m, 0, sizeof *m);
    struct qweight *w = &m->w;
    w->fmt = fmt;
    w->bits = bits;
    w->group = group;
    w->n = n;
    w->k = k;
    w->row_bytes = (size_t)(k * bits / 8);
    size_t nb = (size_t)n * w->row_bytes;
    m->data = xmalloc(nb + 8);
    for (size_t i = 0; i < nb; i++) m->data[i] = (uint8_t)rnd();
    if (fmt == WFMT_BF16)
        for (size_t i = 0; i < nb / 2; i++) ((uint16_t *)m->data)[i] = f32_to_bf16(frand());
    if (fmt == WFMT_F16)
        for (size_t i = 0; i < nb / 2; i++) ((uint16_t *)m->data)[i] = f32_to_f16(frand());
    if (fmt == WFMT_F32)
        for (size_t i = 0; i < nb / 4; i++) ((float *)m->data)[i] = frand();
    if (fmt == WFMT_MXFP8) /* avoid the NaN codes 0x7f / 0xff */
        for (size_t i = 0; i < nb; i++)
            if ((m->data[i] & 0x7f) == 0x7f) m->data[i] ^= 1;
    w->w = m->data;
    size_t ng = group ? (size_t)(n * (k / group)) : 0;
    if (fmt == WFMT_AFFINE) {
        size_t es = sdtype == ST_F32 ? 4 : 2;
        m->scales = xmalloc(ng * es);
        m->biases = xmalloc(ng * es);
        for (size_t i = 0; i < ng; i++) {
            float s = frand() * 0.1f, b = frand() * 0.5f;
            if (sdtype == ST_F32) {
                ((float *)m->scales)[i] = s;
                ((float *)m->biases)[i] = b;
            } else if (sdtype == ST_F16) {
                ((uint16_t *)m->scales)[i] = f32_to_f16(s);
                ((uint16_t *)m->biases)[i] = f32_to_f16(b);
            } else {
                ((uint16_t *)m->scales)[i] = f32_to_bf16(s);
                ((uint16_t *)m->biases)[i] = f32_to_bf16(b);
            }
        }
        w->sdtype = sdtype;
        w->biases = m->biases;
    } else if (group) {
        m->scales = xmalloc(ng);
        for (size_t i = 0; i < ng; i++) /* e4m3 about 0.25..1 for nvfp4, else e8m0 */
            m->scales[i] =
                fmt == WFMT_NVFP4 ? (uint8_t)(0x30 + rnd() % 16) : (uint8_t)(120 + rnd() % 8);
        w->sdtype = ST_U8;
    }
    w->scales = m->scales;
}

static inline void test_mat_free(struct test_mat *m)
{
    free(m->data);
    free(m->scales);
    free(m->biases);
}

#endif
