#include "kernels/cpu/quantize.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "common/util.h"

uint8_t quant_e4m3_encode(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    u &= 0x7fffffffu;
    /* 464 (0x43e80000) is halfway between 448, the largest code (0x7e), and 480, not a value
     * of the "fn" variant: from there on, and for NaN, the largest value */
    if (!(u < 0x43e80000u)) return sign | 0x7e;
    if (u < 0x3c800000u) { /* below 2^-6: subnormal codes, multiples of 2^-9 */
        float a;
        memcpy(&a, &u, 4);
        return sign | (uint8_t)lrintf(a * 512.0f); /* 8 * 2^-9 is the first normal code */
    }
    /* rebias the exponent (127 -> 7) and round the 20 dropped mantissa bits to even; a carry
     * moves into the exponent as it should */
    u -= 120u << 23;
    u += 0x7ffffu + ((u >> 20) & 1);
    return sign | (uint8_t)(u >> 20);
}

/* The e2m1 magnitude code of |x|: values 0, 0.5, 1, 1.5, 2, 3, 4, 6, counted thresholds so
 * that a midpoint goes to the even code (> vs >=) and past 5 saturates; NaN gives 0. No
 * branches: random weights would mispredict them. */
static inline uint8_t e2m1(float x)
{
    float a = fabsf(x);
    int c = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +
            (a > 5.0f);
    return (uint8_t)((signbit(x) ? 8 : 0) | c);
}

uint8_t quant_e2m1_encode(float x)
{
    return e2m1(x);
}

uint8_t quant_e8m0_encode(float s)
{
    if (!isfinite(s)) return 255;
    if (!(s > 0)) return 127;
    int e;
    float m = frexpf(s, &e); /* s = m * 2^e, m in [0.5, 1) */
    /* log2 s = e + log2 m, log2 m in [-1, 0): nearest is e when m > sqrt(1/2), i.e. when
     * m^2 > 1/2 (exact in double, m has 24 bits), else e - 1; never a tie. */
    int r = (double)m * m > 0.5 ? e : e - 1;
    r = r < -127 ? -127 : r > 127 ? 127 : r;
    return (uint8_t)(r + 127);
}

/* Value of an e4m3 code (the nvfp4 scale the codes are divided by). */
static float e4m3_value(uint8_t c)
{
    int exp = (c >> 3) & 15, mant = c & 7;
    float v = exp ? ldexpf(1.0f + (float)mant / 8.0f, exp - 7) : ldexpf((float)mant, -9);
    return c & 0x80 ? -v : v;
}

static void store_scale(void *dst, enum st_dtype t, int64_t i, float v)
{
    if (t == ST_BF16)
        ((uint16_t *)dst)[i] = f32_to_bf16(v);
    else if (t == ST_F16)
        ((uint16_t *)dst)[i] = f32_to_f16(v);
    else
        ((float *)dst)[i] = v;
}

/* MLX's affine scale and bias of one group, in float32 throughout and compared the way
 * std::min / std::max compare (a NaN value never becomes the min or max). */
static void affine_params(const float *x, int g, int bits, float *scale, float *bias)
{
    const float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
    float lo = INFINITY, hi = -INFINITY;
    for (int j = 0; j < g; j++) {
        hi = hi < x[j] ? x[j] : hi;
        lo = x[j] < lo ? x[j] : lo;
    }
    /* The edge of larger magnitude is the bias and the scale points from it towards the
     * other edge (negative when the edge is the max), so codes are round((w - edge) / scale)
     * >= 0. The scale is then adjusted so that edge / scale is a whole number of steps:
     * zero is exactly representable. */
    int min_edge = fabsf(lo) > fabsf(hi);
    float s = (hi - lo) / n_bins;
    s = s < eps ? eps : s;
    s = min_edge ? s : -s;
    float edge = min_edge ? lo : hi;
    float q0 = rintf(edge / s);
    float b = 0.0f;
    if (q0 != 0) {
        s = edge / q0;
        b = edge;
    }
    *scale = s;
    *bias = b;
}

void quant_quantize_row(const struct quant_target *t, const float *x, int64_t k, uint8_t *codes,
                        void *scales, void *biases)
{
    assert(t->group > 0 && k % t->group == 0 && (k * t->bits) % 8 == 0);
    const int g = t->group, bits = t->bits;
    uint64_t acc = 0; /* bits not yet written, LSB first */
    int nacc = 0;
    size_t out = 0;
    for (int64_t g0 = 0, gi = 0; g0 < k; g0 += g, gi++) {
        const float *xg = x + g0;
        uint8_t q[128]; /* codes of the group (group <= 128) */
        assert(g <= 128);
        if (t->fmt == WFMT_AFFINE) {
            float s, b, n_bins = (float)((1 << bits) - 1);
            affine_params(xg, g, bits, &s, &b);
            if (scales) store_scale(scales, t->sdtype, gi, s);
            if (biases) store_scale(biases, t->sdtype, gi, b);
            if (!codes) continue;
            for (int j = 0; j < g; j++) {
                /* with the unrounded float scale and bias, as MLX does */
                float v = rintf((xg[j] - b) / s);
                v = v < 0 ? 0 : v;
                v = n_bins < v ? n_bins : v;
                q[j] = v == v ? (uint8_t)v : 0;
            }
        } else {
            float amax = 0;
            for (int j = 0; j < g; j++) amax = amax < fabsf(xg[j]) ? fabsf(xg[j]) : amax;
            uint8_t sc;
            if (t->fmt == WFMT_NVFP4) {
                sc = quant_e4m3_encode(amax / 6.0f);
                float div = e4m3_value(sc);
                if (codes)
                    for (int j = 0; j < g; j++) q[j] = e2m1(div == 0 ? 0.0f : xg[j] / div);
            } else {
                sc = quant_e8m0_encode(amax / (t->fmt == WFMT_MXFP4 ? 6.0f : 448.0f));
                /* times 2^-e is w / 2^e exactly (2^-e is a float for e in [-127, 127]) */
                float mul = sc == 255 ? 0.0f : ldexpf(1.0f, 127 - (int)sc);
                if (codes && t->fmt == WFMT_MXFP8)
                    for (int j = 0; j < g; j++) q[j] = quant_e4m3_encode(xg[j] * mul);
                else if (codes)
                    for (int j = 0; j < g; j++) q[j] = e2m1(xg[j] * mul);
            }
            if (scales) ((uint8_t *)scales)[gi] = sc;
            if (!codes) continue;
        }
        for (int j = 0; j < g; j++) {
            acc |= (uint64_t)q[j] << nacc;
            nacc += bits;
            while (nacc >= 8) {
                codes[out++] = (uint8_t)acc;
                acc >>= 8;
                nacc -= 8;
            }
        }
    }
}
