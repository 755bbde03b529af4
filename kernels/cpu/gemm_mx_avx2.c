/*
 * The microscaled float formats (mxfp4, nvfp4, mxfp8) on the many-row integer tiles of
 * gemm_q8_avx2.h (AVX2, AVX-VNNI; the AVX-512 table runs them too): the input preparation,
 * the panel packing and the driver. The tiles compute, per weight group g and x row,
 *   y += s_g * dx_g * (u_g . xq_g) + b_g * dx_g * sum(xq_g)
 * over integer codes u; each format only chooses u, s and b when it packs a panel:
 *
 *   mxfp4, nvfp4: an e2m1 value v times 2 is an integer in [-12, 12], so u = 2 v + 12 in
 *     [0, 24] (unsigned, as vpmaddubsw and vpdpbusd want their weight operand), s = scale / 2,
 *     b = -6 scale (scale: the e8m0 byte, or nvfp4's e4m3 one, per 32 or 16 columns). The
 *     integer sums are exact; AVX2 adds two vpmaddubsw steps as int16, at most
 *     4 * 24 * 127 = 12192. The two float terms cancel in part (the +12): a relative error
 *     of about 12 * 2^-24 of sum |x| per group, far below the int8 input rounding.
 *   mxfp8: e4m3 values are M * 2^(e - 10) with M in [0, 15] and e in [1, 15], not small
 *     integers: int8 codes with a per-group shift would be exact only where a group's
 *     exponents span 3 or less. Each group is instead scaled to int16 by its largest
 *     exponent E: u = round(M * 2^(e + 5 - h)), h = max(E - 5, 0), so |u| <= 15 * 2^10 and
 *     s = scale * 2^(h - 15), b = 0. Values with e >= E - 10 stay exact; the rest round to
 *     a step of at most 2^-13 of the group's largest value (half away from zero: an error
 *     of at most 2^-14 of it). The panel is int16 (E = 2), multiplied by int16 x with
 *     vpmaddwd (vpdpwssd with AVX-VNNI). The two NaN codes read as +-480 here, where the
 *     invariant kernels give NaN; checkpoints hold none.
 *
 * A prepared x row holds k int8 values in column order (int16 for mxfp8), padded to 64
 * bytes, then per group dx = max|x| / 127, then dx * sum(xq). Packing decodes each weight
 * once per call (per thread and panel), a few vector operations per 16 or 32 codes.
 */
#include <math.h>
#include <string.h>

#include "common/scratch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_q8_avx2.h"
#include "kernels/cpu/quant.h"

/* Codes per 32-bit panel lane: 4 int8 (fp4) or 2 int16 (mxfp8). */
static int lane_codes(const struct qweight *w)
{
    return w->fmt == WFMT_MXFP8 ? 2 : 4;
}

static int64_t xq_bytes(const struct qweight *w)
{
    return g8_xq_bytes(w->k, lane_codes(w));
}

size_t gemm_mx_avx2_prep_bytes(const struct qweight *w)
{
    return (size_t)xq_bytes(w) + (size_t)(w->k / w->group) * 2 * sizeof(float);
}

void gemm_mx_avx2_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride)
{
    int64_t k = w->k, G = w->group, groups = k / G, kq = xq_bytes(w);
    int wide = lane_codes(w) == 2;
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * k;
        uint8_t *row = xp + (size_t)i * stride;
        float *dx = (float *)(row + kq), *xs = dx + groups;
        for (int64_t g = 0; g < groups; g++) {
            const float *xg = xi + g * G;
            float amax = g8_absmax(xg, G);
            float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
            __m256 vid = _mm256_set1_ps(id);
            __m256i sum = _mm256_setzero_si256();
            for (int64_t j = 0; j < G; j += 8) {
                /* |q| <= 127: the saturating packs are exact */
                __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + j), vid));
                sum = _mm256_add_epi32(sum, q);
                __m128i q16 =
                    _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
                int64_t c = g * G + j;
                if (wide)
                    _mm_storeu_si128((__m128i *)((int16_t *)row + c), q16);
                else
                    _mm_storel_epi64((__m128i *)(row + c), _mm_packs_epi16(q16, q16));
            }
            __m128i s4 =
                _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            dx[g] = d;
            xs[g] = d * (float)_mm_cvtsi128_si32(s4);
        }
    }
}

/* 32 e2m1 codes of a row from column c0 (16 bytes, low nibble first) as u = 2 v + 12, in
 * column order. */
ALWAYS_INLINE __m256i load_fp4(const uint8_t *row, int64_t c0)
{
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m128i lut = _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    __m128i v = _mm_loadu_si128((const __m128i *)(row + c0 / 2));
    __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
    __m128i a = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));
    __m128i b = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
}

/* The shift h of an e4m3 group of 32 codes (see the top of the file). */
static int fp8_shift(const uint8_t *p)
{
    const __m256i m7 = _mm256_set1_epi8(0x7f);
    __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)p), m7);
    __m128i s = _mm_max_epu8(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_max_epu8(s, _mm_srli_si128(s, 8));
    s = _mm_max_epu8(s, _mm_srli_si128(s, 4));
    s = _mm_max_epu8(s, _mm_srli_si128(s, 2));
    s = _mm_max_epu8(s, _mm_srli_si128(s, 1));
    int e = (_mm_cvtsi128_si32(s) & 0x7f) >> 3; /* the magnitude bits order as the values */
    e = e < 1 ? 1 : e;
    return e > 5 ? e - 5 : 0;
}

/* 16 e4m3 codes of a row from column c0 as int16 u = round(M * 2^t), t = e' + 5 - h, with
 * the rounding multiply of vpmulhrsw: (M * 2^11 * 2^(t + 4) + 2^14) >> 15, 2^(t + 4) read
 * from a table (t + 4 = e' + bias, bias = 9 - h, lies in [0, 14] for every code of the
 * group). About 20 vector operations per 16 codes. */
ALWAYS_INLINE __m256i load_fp8(const uint8_t *row, int64_t c0, __m128i bias)
{
    const __m128i m15 = _mm_set1_epi8(15), m7 = _mm_set1_epi8(7), one = _mm_set1_epi8(1);
    const __m128i plo = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, (char)128, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m128i phi = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, 0);
    __m128i c = _mm_loadu_si128((const __m128i *)(row + c0));
    __m128i e = _mm_and_si128(_mm_srli_epi16(c, 3), m15);
    __m128i mant = _mm_or_si128(_mm_and_si128(c, m7), _mm_slli_epi16(_mm_min_epu8(e, one), 3));
    __m128i t4 = _mm_add_epi8(_mm_max_epu8(e, one), bias);
    __m128i lo = _mm_shuffle_epi8(plo, t4), hi = _mm_shuffle_epi8(phi, t4);
    __m256i p = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(lo, hi)),
                                        _mm_unpackhi_epi8(lo, hi), 1);
    __m256i u = _mm256_mulhrs_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(mant), 11), p);
    return _mm256_sign_epi16(u, _mm256_cvtepi8_epi16(_mm_or_si128(c, one)));
}

/* 2^p as a float, by its bits where p is a normal exponent (the scale loop runs per row and
 * group of every panel: a libm call there costs as much as the tile at 16 rows). */
static inline float pow2i(int p)
{
    if (p < -126 || p > 127) return ldexpf(1.0f, p);
    uint32_t b = (uint32_t)(p + 127) << 23;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* scale * 2^p for an e8m0 scale byte (255: NaN, as quant_e8m0). */
static inline float e8m0_mul(uint8_t e, int p)
{
    return e == 255 ? NAN : pow2i((int)e - 127 + p);
}

/*
 * Rows [rb, rb + nb) of W, columns [kp, kp + len), into the panel: pw [len / E][2][8 rows]
 * of E codes (rows past nb zero), ps [gpp][16] scales then [gpp][16] biases at
 * ps + 16 * gmax.
 */
static void pack(const struct qweight *w, int E, int64_t rb, int nb, int64_t kp, int64_t len,
                 uint8_t *pw, float *ps, int64_t gmax)
{
    int64_t G = w->group, groups = w->k / G, gpp = len / G, span = 8 * E;
    uint8_t sh[G8NB][GEMM_KC / 32]; /* mxfp8: each row's and group's shift h */
    if (E == 2)
        for (int j = 0; j < nb; j++)
            for (int64_t g = 0; g < gpp; g++)
                sh[j][g] = (uint8_t)fp8_shift(w->w + (size_t)(rb + j) * w->row_bytes + kp + g * G);
    for (int v = 0; v < 2; v++)
        for (int64_t c = 0; c < len / span; c++) {
            __m256i r[8];
            for (int l = 0; l < 8; l++) {
                int j = v * 8 + l;
                const uint8_t *row = w->w + (size_t)(rb + j) * w->row_bytes;
                if (j >= nb)
                    r[l] = _mm256_setzero_si256();
                else if (E == 2)
                    r[l] = load_fp8(row, kp + c * span,
                                    _mm_set1_epi8((char)(9 - sh[j][c * span / G])));
                else
                    r[l] = load_fp4(row, kp + c * span);
            }
            transpose8x32(r);
            for (int t = 0; t < 8; t++)
                _mm256_storeu_si256((__m256i *)(pw + ((c * 8 + t) * 2 + v) * 32), r[t]);
        }
    const uint8_t *sc = w->scales + kp / G;
    for (int64_t g = 0; g < gpp; g++)
        for (int j = 0; j < G8NB; j++) {
            float s = 0, b = 0;
            if (j < nb) {
                uint8_t e = sc[(rb + j) * groups + g];
                if (w->fmt == WFMT_MXFP8) {
                    s = e8m0_mul(e, sh[j][g] - 15);
                } else {
                    float f = w->fmt == WFMT_NVFP4 ? quant_fp8_lut[e] : e8m0_mul(e, 0);
                    s = 0.5f * f;
                    b = -6.0f * f;
                }
            }
            ps[g * G8NB + j] = s;
            ps[G8NB * gmax + g * G8NB + j] = b;
        }
}

void gemm_mx_avx2_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                       size_t stride, int m, float *y, int64_t ldy, int vnni)
{
    int E = lane_codes(w);
    const g8_fn *tab = E == 2 ? g8_tab_avx2_e2 : g8_tab_avx2_e4;
#if defined(PAGODA_AVXVNNI)
    if (vnni) tab = E == 2 ? g8_tab_vnni_e2 : g8_tab_vnni;
#endif
    g8_run(w, E, tab, g8_rows(E, vnni), xq_bytes(w), pack, r0, r1, xp, stride, m, y, ldy);
}
