/*
 * quant: portable decoding of every weight format (see model/weights.h), one row segment
 * at a time. The reference that the SIMD kernels are tested against, and the fallback
 * for formats without a dedicated SIMD path.
 */
#ifndef PAGODA_KERNELS_CPU_QUANT_H
#define PAGODA_KERNELS_CPU_QUANT_H

#include <stdint.h>

#include "common/util.h"
#include "model/weights.h"

/* e2m1 (fp4) code -> value; index is the 4-bit code (bit 3 = sign). */
extern const float quant_fp4_lut[16];
/* e4m3 (fp8, "fn": no infinities, 0x7f/0xff are NaN) code -> value. */
extern float quant_fp8_lut[256];

/** Fills the lookup tables (idempotent; called by cpu_kernels_init). */
void quant_init(void);

/** 2^(e - 127) for an e8m0 scale byte (255 is NaN). */
float quant_e8m0(uint8_t e);

/** Reads scale or bias entry i in dtype t (BF16, F16 or F32). Inline: it sits in the
 * per-group step of every affine kernel. */
static inline float quant_load_scale(const void *p, enum st_dtype t, int64_t i)
{
    if (t == ST_BF16) return bf16_to_f32(((const uint16_t *)p)[i]);
    if (t == ST_F16) return f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

/**
 * Decodes columns [k0, k0+len) of row `row` into dst (float32). k0 and len must be
 * multiples of the format's group size (any value for f32/f16/bf16).
 */
void quant_dequant_row(const struct qweight *w, int64_t row, int64_t k0, int64_t len, float *dst);

#endif
