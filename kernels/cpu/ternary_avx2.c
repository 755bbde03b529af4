/*
 * The AVX2 ternary kernel (see ternary.c): one 32-byte load holds 128 codes; four shift-and-
 * mask steps give 32 codes each, in column order, and vpmaddubsw multiplies them (unsigned,
 * 0..2) by the int8 inputs, adding pairs into int16. A pair is at most 2 * 2 * 128 = 512 in
 * magnitude, so 32 of them (8 blocks of 128 columns) add in int16 before one vpmaddwd widens
 * them to int32. Up to 4 input rows share each decoded block (prefill).
 *
 * AVX-VNNI's vpdpbusd (4 products into an int32 lane) would replace the three integer steps,
 * but timed slower here (bench matmul --format ternary, 128 rows: 101-115 ms against 77-89 ms
 * with AVX2, two int32 chains a row): its latency chains the accumulators, and 16 registers
 * leave no room for more of them. The AVX2 kernel serves both instruction sets.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/impl.h"

/* Blocks of 128 columns whose int16 sums fit: 8 blocks * 4 products * 512 = 16384. */
#define FLUSH_BLOCKS 8
#define PF_AHEAD     2048

ALWAYS_INLINE int32_t hsum_i32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Row r of W against MR input rows: the exact dots into out[MR]. */
ALWAYS_INLINE void ternary_row(const uint8_t *row, int64_t blocks, const int8_t *q, size_t stride,
                               int MR, int32_t *out)
{
    const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
    __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
    for (int64_t b0 = 0; b0 < blocks; b0 += FLUSH_BLOCKS) {
        int64_t b1 = b0 + FLUSH_BLOCKS < blocks ? b0 + FLUSH_BLOCKS : blocks;
        __m256i s16[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                          _mm256_setzero_si256()};
        for (int64_t b = b0; b < b1; b++) {
            /* Streams PF_AHEAD bytes ahead (into the next rows: a thread's rows are
             * contiguous), one prefetch per cache line. */
            if (!(b & 1)) _mm_prefetch((const char *)(row + b * 32 + PF_AHEAD), _MM_HINT_T0);
            __m256i v = _mm256_loadu_si256((const __m256i *)(row + b * 32));
            __m256i c0 = _mm256_and_si256(v, m3);
            __m256i c1 = _mm256_and_si256(_mm256_srli_epi16(v, 2), m3);
            __m256i c2 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m3);
            __m256i c3 = _mm256_and_si256(_mm256_srli_epi16(v, 6), m3);
            for (int i = 0; i < MR; i++) {
                const int8_t *qb = q + (size_t)i * stride + b * 128;
                __m256i p0 = _mm256_maddubs_epi16(c0, _mm256_loadu_si256((const __m256i *)qb));
                __m256i p1 =
                    _mm256_maddubs_epi16(c1, _mm256_loadu_si256((const __m256i *)(qb + 32)));
                __m256i p2 =
                    _mm256_maddubs_epi16(c2, _mm256_loadu_si256((const __m256i *)(qb + 64)));
                __m256i p3 =
                    _mm256_maddubs_epi16(c3, _mm256_loadu_si256((const __m256i *)(qb + 96)));
                s16[i] = _mm256_add_epi16(
                    s16[i], _mm256_add_epi16(_mm256_add_epi16(p0, p1), _mm256_add_epi16(p2, p3)));
            }
        }
        for (int i = 0; i < MR; i++)
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(s16[i], ones));
    }
    for (int i = 0; i < MR; i++) out[i] = hsum_i32(acc[i]);
}

/* Weight row outermost: its codes stay in L1 while every group of up to 4 input rows passes. */
void ternary_matmul_avx2(const struct qweight *w, int64_t r0, int64_t r1, const int8_t *q,
                         size_t stride, const int32_t *qsum, const float *qdiv, int m, float *y,
                         int64_t ldy)
{
    int64_t blocks = (int64_t)w->row_bytes / 32;
    int32_t d[4];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w->w + (size_t)r * w->row_bytes;
        for (int i0 = 0; i0 < m; i0 += 4) {
            const int8_t *qi = q + (size_t)i0 * stride;
            int mr = m - i0 < 4 ? m - i0 : 4;
            switch (mr) {
            case 4:
                ternary_row(row, blocks, qi, stride, 4, d);
                break;
            case 3:
                ternary_row(row, blocks, qi, stride, 3, d);
                break;
            case 2:
                ternary_row(row, blocks, qi, stride, 2, d);
                break;
            default:
                ternary_row(row, blocks, qi, stride, 1, d);
                break;
            }
            for (int i = 0; i < mr; i++)
                y[(size_t)(i0 + i) * ldy + r] =
                    (float)(d[i] - qsum[i0 + i]) / qdiv[i0 + i] * w->t_mul;
        }
    }
}

/* cpu_ternary_quantize with 8 lanes: the same float operations per value (a product, a
 * rounding half to even, the clamp, NaN to 0), so the same bytes and sum. */
float ternary_quantize_avx2(const float *x, int64_t k, int64_t kp, int8_t *q, int32_t *sum)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mv = _mm256_setzero_ps();
    int64_t j = 0;
    /* max(|x|, m) keeps m where |x| is NaN, as fmaxf does */
    for (; j + 8 <= k; j += 8)
        mv = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), mv);
    float lane[8], mx = 0;
    _mm256_storeu_ps(lane, mv);
    for (int i = 0; i < 8; i++) mx = lane[i] > mx ? lane[i] : mx;
    for (; j < k; j++) {
        float a = x[j] < 0 ? -x[j] : x[j];
        mx = a > mx ? a : mx;
    }
    float s = 127.0f / (mx > 1e-5f ? mx : 1e-5f);
    const __m256 vs = _mm256_set1_ps(s), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-128.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    __m256i acc = _mm256_setzero_si256();
    j = 0;
    for (; j + 32 <= k; j += 32) {
        __m256i r[4];
        for (int t = 0; t < 4; t++) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * t), vs);
            __m256 n = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            n = _mm256_max_ps(_mm256_min_ps(n, hi), lo);
            n = _mm256_and_ps(n, _mm256_cmp_ps(v, v, _CMP_ORD_Q)); /* NaN: 0 */
            r[t] = _mm256_cvtps_epi32(n);
            acc = _mm256_add_epi32(acc, r[t]);
        }
        __m256i b =
            _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
        _mm256_storeu_si256((__m256i *)(q + j), _mm256_permutevar8x32_epi32(b, order));
    }
    int32_t total = hsum_i32(acc);
    for (; j < k; j++) {
        float v = nearbyintf(x[j] * s);
        if (v > 127.0f)
            v = 127.0f;
        else if (v < -128.0f)
            v = -128.0f;
        else if (v != v)
            v = 0.0f;
        q[j] = (int8_t)v;
        total += q[j];
    }
    memset(q + k, 0, (size_t)(kp - k));
    *sum = total;
    return s;
}
