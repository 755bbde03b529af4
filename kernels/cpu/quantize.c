#include "kernels/cpu/quantize.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "common/util.h"

uint8_t quant_e4m3_encode(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    /* 464 is halfway between 448 (the largest code, 0x7e) and 480 (not a value of the "fn"
     * variant): from there on, and for NaN, the largest value. */
    if (!(a < 464.0f)) return sign | 0x7e;
    /* subnormals are multiples of 2^-9; 8 * 2^-9 rounds into the first normal code, 0x08 */
    if (a < 0x1p-6f) return sign | (uint8_t)lrintf(a * 512.0f);
    int e;
    float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1): 1.f * 2^(e-1) */
    int q = (int)lrintf(m * 16.0f);
    if (q == 16) { /* the mantissa rounded up into the next binade */
        q = 8;
        e++;
    }
    return sign | (uint8_t)(((e - 1 + 7) << 3) | (q - 8));
}

uint8_t quant_e2m1_encode(float x)
{
    uint8_t sign = signbit(x) ? 8 : 0;
    float a = fabsf(x);
    /* values 0, 0.5, 1, 1.5, 2, 3, 4, 6; a midpoint goes to the even code (<= vs <) */
    uint8_t c;
    if (a <= 0.25f)
        c = 0;
    else if (a < 0.75f)
        c = 1;
    else if (a <= 1.25f)
        c = 2;
    else if (a < 1.75f)
        c = 3;
    else if (a <= 2.5f)
        c = 4;
    else if (a < 3.5f)
        c = 5;
    else if (a <= 5.0f)
        c = 6;
    else
        c = 7; /* saturates; NaN lands here too */
    return sign | c;
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
            float div;
            uint8_t sc;
            if (t->fmt == WFMT_NVFP4) {
                sc = quant_e4m3_encode(amax / 6.0f);
                div = e4m3_value(sc);
            } else {
                sc = quant_e8m0_encode(amax / (t->fmt == WFMT_MXFP4 ? 6.0f : 448.0f));
                div = sc == 255 ? INFINITY : ldexpf(1.0f, (int)sc - 127);
            }
            if (scales) ((uint8_t *)scales)[gi] = sc;
            if (!codes) continue;
            for (int j = 0; j < g; j++) {
                float y = div == 0 ? 0.0f : xg[j] / div;
                q[j] = t->fmt == WFMT_MXFP8 ? quant_e4m3_encode(y) : quant_e2m1_encode(y);
            }
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
