#include "kernels/cpu/quant.h"

#include <math.h>
#include <string.h>

#include "common/util.h"

const float quant_fp4_lut[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
float quant_fp8_lut[256];

void quant_init(void)
{
    for (int c = 0; c < 256; c++) {
        int sign = c >> 7, exp = (c >> 3) & 15, mant = c & 7;
        float v;
        if (exp == 15 && mant == 7)
            v = NAN;
        else if (exp == 0)
            v = ldexpf((float)mant, -9); /* subnormal: mant/8 * 2^-6 */
        else
            v = ldexpf(1.0f + (float)mant / 8.0f, exp - 7);
        quant_fp8_lut[c] = sign ? -v : v;
    }
}

float quant_e8m0(uint8_t e)
{
    if (e == 255) return NAN;
    return ldexpf(1.0f, (int)e - 127);
}

/* Value j of an LSB-first bit stream of `bits`-bit fields. */
static inline uint32_t bitfield(const uint8_t *row, int64_t j, int bits)
{
    int64_t bit = j * bits;
    const uint8_t *p = row + (bit >> 3);
    uint32_t v = p[0];
    if ((bit & 7) + bits > 8) v |= (uint32_t)p[1] << 8; /* a field of <= 8 bits spans <= 2 bytes */
    return (v >> (bit & 7)) & ((1u << bits) - 1);
}

void quant_dequant_row(const struct qweight *w, int64_t row, int64_t k0, int64_t len, float *dst)
{
    const uint8_t *r = w->w + (size_t)row * w->row_bytes;
    int64_t groups = w->k / (w->group ? w->group : 1);
    switch (w->fmt) {
    case WFMT_F32:
        memcpy(dst, (const float *)r + k0, (size_t)len * 4);
        return;
    case WFMT_BF16:
        for (int64_t j = 0; j < len; j++) dst[j] = bf16_to_f32(((const uint16_t *)r)[k0 + j]);
        return;
    case WFMT_F16:
        for (int64_t j = 0; j < len; j++) dst[j] = f16_to_f32(((const uint16_t *)r)[k0 + j]);
        return;
    case WFMT_AFFINE:
        for (int64_t j = 0; j < len; j++) {
            int64_t c = k0 + j, g = c / w->group;
            float s = quant_load_scale(w->scales, w->sdtype, row * groups + g);
            float b = quant_load_scale(w->biases, w->sdtype, row * groups + g);
            dst[j] = s * (float)bitfield(r, c, w->bits) + b;
        }
        return;
    case WFMT_MXFP4:
    case WFMT_NVFP4:
        for (int64_t j = 0; j < len; j++) {
            int64_t c = k0 + j, g = c / w->group;
            uint8_t sc = ((const uint8_t *)w->scales)[row * groups + g];
            float s = w->fmt == WFMT_MXFP4 ? quant_e8m0(sc) : quant_fp8_lut[sc];
            dst[j] = quant_fp4_lut[bitfield(r, c, 4)] * s;
        }
        return;
    case WFMT_MXFP8:
        for (int64_t j = 0; j < len; j++) {
            int64_t c = k0 + j, g = c / w->group;
            float s = quant_e8m0(((const uint8_t *)w->scales)[row * groups + g]);
            dst[j] = quant_fp8_lut[r[c]] * s;
        }
        return;
    case WFMT_TERNARY: /* the weight's value; products quantize x too (cpu_ternary_matmul) */
        for (int64_t j = 0; j < len; j++)
            dst[j] = (float)qweight_ternary_get(r, k0 + j) / w->t_div * w->t_mul;
        return;
    }
}
