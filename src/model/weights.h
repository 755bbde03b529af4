/*
 * weights: how one weight matrix is stored, as the kernels consume it in place.
 *
 * A matrix has n rows (output features) of k columns (input features), row-major as in
 * PyTorch's Linear.weight [out, in]. Quantized formats keep MLX's layout:
 *   affine  `weight` uint32 [n, k*bits/32] (an LSB-first bit stream per row),
 *           `scales`, `biases` [n, k/group] (bf16/f16/f32): w = scale * q + bias;
 *   mxfp4   e2m1 codes, 8 per uint32, `scales` uint8 e8m0 [n, k/32]: w = fp4 * 2^(s-127);
 *   mxfp8   e4m3 codes, 4 per uint32, `scales` uint8 e8m0 [n, k/32];
 *   nvfp4   e2m1 codes, `scales` uint8 e4m3 [n, k/16]: w = fp4 * fp8(s).
 * and one format of pagoda's own, which a loader builds from the checkpoint's:
 *   ternary BitNet b1.58's BitLinear: values in {-1, 0, 1} stored as code value + 1 in 2 bits,
 *           each row ceil(k / 128) blocks of 32 bytes; column 128 b + 32 i + j of a row sits
 *           in bits 2i..2i+1 of byte j of block b (columns past k hold code 1, a zero). A
 *           product with it quantizes each input row to int8 first (absmax, as the reference
 *           does) and is y = (int8 row . ternary row) / (row scale * t_div) * t_mul.
 */
#ifndef PAGODA_MODEL_WEIGHTS_H
#define PAGODA_MODEL_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"

enum wfmt {
    WFMT_F32,
    WFMT_F16,
    WFMT_BF16,
    WFMT_AFFINE,
    WFMT_MXFP4,
    WFMT_MXFP8,
    WFMT_NVFP4,
    WFMT_TERNARY
};

struct qweight {
    enum wfmt fmt;
    int bits;  /* bits per stored value */
    int group; /* values per scale (quantized formats) */
    int64_t n, k;
    const uint8_t *w; /* n rows of row_bytes */
    size_t row_bytes;
    const void *scales;   /* n rows of k/group entries */
    const void *biases;   /* affine only */
    enum st_dtype sdtype; /* dtype of scales and biases (affine); U8 for mx/nv formats */
    void *dev;            /* a backend's own copy (device memory), when it keeps one */
    float t_div, t_mul;   /* ternary: the per-tensor scale the product divides by, multiplies by */
};

/** Bits per weight including scales and biases (for reports). */
double qweight_bits_per_weight(const struct qweight *w);

/** Bytes the matrix occupies (values + scales + biases). */
size_t qweight_bytes(const struct qweight *w);

/** Bytes of one ternary row of k values: ceil(k / 128) blocks of 32. */
size_t qweight_ternary_row_bytes(int64_t k);

/** Packs k values in {-1, 0, 1} into one ternary row (qweight_ternary_row_bytes(k) bytes). */
void qweight_ternary_pack(const int8_t *vals, int64_t k, uint8_t *row);

/** Value j of a ternary row: -1, 0 or 1. */
static inline int qweight_ternary_get(const uint8_t *row, int64_t j)
{
    int64_t c = j % 128;
    return (row[(j / 128) * 32 + c % 32] >> (2 * (c / 32)) & 3) - 1;
}

/** Short name of the format: "bf16", "mlx4", "mxfp4", ... into buf. */
const char *qweight_format_name(const struct qweight *w, char *buf, size_t n);

#endif
