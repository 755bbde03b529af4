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
 */
#ifndef PAGODA_MODEL_WEIGHTS_H
#define PAGODA_MODEL_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"

enum wfmt { WFMT_F32, WFMT_F16, WFMT_BF16, WFMT_AFFINE, WFMT_MXFP4, WFMT_MXFP8, WFMT_NVFP4 };

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
};

/** Bits per weight including scales and biases (for reports). */
double qweight_bits_per_weight(const struct qweight *w);

/** Bytes the matrix occupies (values + scales + biases). */
size_t qweight_bytes(const struct qweight *w);

/** Short name of the format: "bf16", "mlx4", "mxfp4", ... into buf. */
const char *qweight_format_name(const struct qweight *w, char *buf, size_t n);

#endif
