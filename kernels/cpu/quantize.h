/*
 * quantize: the encoders of the quantized weight formats, the inverse of quant.c's decoders
 * and bit for bit what MLX writes, one row of a matrix at a time.
 *
 *   affine  per group: min / max, scale = (max - min) / (2^bits - 1) signed so that the
 *           larger-magnitude edge is the bias and zero is a whole step away from it; codes
 *           round((w - bias) / scale) clipped to [0, 2^bits - 1] with the unrounded float
 *           scale and bias, which are then rounded to the scale dtype (bf16, f16 or f32);
 *   mxfp4 / mxfp8  per 32: e8m0 exponent round(log2(max|w| / 6 or 448)), values w / 2^e
 *           to e2m1 / e4m3, nearest with ties to even, saturating;
 *   nvfp4   per 16: e4m3 scale of max|w| / 6, values w / scale to e2m1.
 *
 * Codes are an LSB-first bit stream per row (k * bits / 8 bytes), as quant_dequant_row reads
 * them; mxfp8 is one byte a value.
 */
#ifndef PAGODA_KERNELS_CPU_QUANTIZE_H
#define PAGODA_KERNELS_CPU_QUANTIZE_H

#include <stdint.h>

#include "model/weights.h"

/** What a row is quantized to: fmt one of WFMT_AFFINE, WFMT_MXFP4, WFMT_MXFP8, WFMT_NVFP4;
 * sdtype the affine scales' and biases' dtype (ST_BF16, ST_F16 or ST_F32). */
struct quant_target {
    enum wfmt fmt;
    int bits;  /* affine 2, 3, 4, 5, 6 or 8; 4 for fp4 formats, 8 for mxfp8 */
    int group; /* values per scale: affine 32, 64 or 128; mx 32; nv 16 */
    enum st_dtype sdtype;
};

/**
 * Quantizes x[k] (k a multiple of t->group) into codes (k * bits / 8 bytes), scales
 * (k / group entries: sdtype for affine, one byte each for mx / nv) and biases (affine only).
 * Any of the three outputs may be NULL when not wanted; the work per value is the same.
 * Non-finite inputs give finite codes (never undefined behaviour).
 */
void quant_quantize_row(const struct quant_target *t, const float *x, int64_t k, uint8_t *codes,
                        void *scales, void *biases);

/** Nearest e4m3 ("fn") code of x, ties to even, saturating at +-448 (never NaN codes). */
uint8_t quant_e4m3_encode(float x);

/** Nearest e2m1 code of x (the 3-bit magnitude and bit 3 the sign), ties to even,
 * saturating at +-6 (NaN: a zero code). */
uint8_t quant_e2m1_encode(float x);

/** The e8m0 byte of an mx scale s > 0: 127 + round(log2 s), clamped to [0, 254]; 127 for
 * s = 0 and 255 when s is not finite. */
uint8_t quant_e8m0_encode(float s);

#endif
