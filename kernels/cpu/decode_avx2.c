/*
 * SIMD decoding (AVX2) of the formats without an integer kernel: affine 2/3/5/6-bit, mxfp4,
 * nvfp4 and mxfp8, 8 values at a time. Each value is the one quant_dequant_row gives, bit
 * for bit (the same products and sums, each rounded once), so the kernels that multiply the
 * decoded panels give the results they gave with the portable decoder, only sooner.
 */
#include <string.h>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/quant.h"

/* The 8 `bits`-bit fields of v (LSB first) as 8 int32, in order. */
ALWAYS_INLINE __m256i fields8(uint64_t v, int bits)
{
    __m256i b = _mm256_set1_epi64x((long long)v);
    __m256i lo = _mm256_srlv_epi64(b, _mm256_setr_epi64x(0, bits, 2 * bits, 3 * bits));
    __m256i hi = _mm256_srlv_epi64(b, _mm256_setr_epi64x(4 * bits, 5 * bits, 6 * bits, 7 * bits));
    /* per 128-bit lane: fields 0 1 4 5 | 2 3 6 7, then the 64-bit pairs into order */
    __m256i q = _mm256_castps_si256(
        _mm256_shuffle_ps(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi), 0x88));
    q = _mm256_permute4x64_epi64(q, 0xd8);
    return _mm256_and_si256(q, _mm256_set1_epi32((1 << bits) - 1));
}

int decode_row_fast(const struct qweight *w, int64_t r, int64_t k0, int64_t len, float *dst)
{
    const uint8_t *row = w->w + (size_t)r * w->row_bytes;
    int64_t G = w->group;
    if (G <= 0 || G % 8 || k0 % G || len % G) return 0;
    int64_t groups = w->k / G;
    if (w->fmt == WFMT_AFFINE) {
        int bits = w->bits;
        if (bits != 2 && bits != 3 && bits != 5 && bits != 6) return 0;
        for (int64_t g0 = k0; g0 < k0 + len; g0 += G) {
            int64_t g = g0 / G;
            __m256 s = _mm256_set1_ps(quant_load_scale(w->scales, w->sdtype, r * groups + g));
            __m256 b = _mm256_set1_ps(quant_load_scale(w->biases, w->sdtype, r * groups + g));
            for (int64_t c = g0; c < g0 + G; c += 8) {
                uint64_t v = 0; /* 8 fields fill `bits` whole bytes */
                memcpy(&v, row + c * bits / 8, (size_t)bits);
                __m256 q = _mm256_cvtepi32_ps(fields8(v, bits));
                _mm256_storeu_ps(dst + (c - k0), _mm256_add_ps(_mm256_mul_ps(s, q), b));
            }
        }
        return 1;
    }
    if (w->fmt == WFMT_MXFP4 || w->fmt == WFMT_NVFP4) {
        /* magnitudes of the 8 positive codes; bit 3 of a code is the sign */
        const __m256 mag = _mm256_loadu_ps(quant_fp4_lut);
        for (int64_t g0 = k0; g0 < k0 + len; g0 += G) {
            uint8_t sc = ((const uint8_t *)w->scales)[r * groups + g0 / G];
            __m256 s = _mm256_set1_ps(w->fmt == WFMT_MXFP4 ? quant_e8m0(sc) : quant_fp8_lut[sc]);
            for (int64_t c = g0; c < g0 + G; c += 8) {
                uint32_t v;
                memcpy(&v, row + c / 2, 4);
                __m256i code = fields8(v, 4);
                __m256 val = _mm256_permutevar8x32_ps(mag, code);
                __m256i sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28);
                val = _mm256_xor_ps(val, _mm256_castsi256_ps(sign));
                _mm256_storeu_ps(dst + (c - k0), _mm256_mul_ps(val, s));
            }
        }
        return 1;
    }
    if (w->fmt == WFMT_MXFP8) {
        for (int64_t g0 = k0; g0 < k0 + len; g0 += G) {
            __m256 s =
                _mm256_set1_ps(quant_e8m0(((const uint8_t *)w->scales)[r * groups + g0 / G]));
            for (int64_t c = g0; c < g0 + G; c += 8) {
                __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + c)));
                __m256 val = _mm256_i32gather_ps(quant_fp8_lut, code, 4);
                _mm256_storeu_ps(dst + (c - k0), _mm256_mul_ps(val, s));
            }
        }
        return 1;
    }
    return 0;
}
