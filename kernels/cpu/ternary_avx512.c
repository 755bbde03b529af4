/*
 * The AVX-512 ternary kernel for products of 4 or more input rows (prefill; see ternary.c):
 * tiles of 4 weight rows by 4 input rows, 16 int32 accumulators of 16 lanes. A 32-byte block
 * of codes (128 columns) decodes into two 64-code vectors in column order (the low two bit
 * pairs of each byte, then the high two), and 512-bit vpdpbusd multiplies the unsigned codes
 * (0..2) by the int8 inputs, 4 products into each int32 lane: a lane adds at most
 * 4 * 2 * 128 per block, so int32 holds any k. The 4 input rows' 128 bytes of a block are
 * loaded once for the 4 weight rows. Fewer than 4 rows, and a product's last 1 to 3 rows,
 * take the AVX2 kernel (a weight row against up to 4 input rows). The dots are exact, the
 * scaling the same float operations: the results equal the other kernels' to the bit.
 */
#include <immintrin.h>

#include "kernels/cpu/impl.h"

#define NR 4 /* weight rows a tile */
#define MR 4 /* input rows a tile */

/* Weight rows r..r+NR against input rows q[0..MR): the exact dots into d[NR][MR]. */
static inline __attribute__((always_inline)) void tile(const uint8_t *w, size_t row_bytes,
                                                       int64_t blocks, const int8_t *q,
                                                       size_t stride, int32_t d[NR][MR])
{
    const __m256i m3 = _mm256_set1_epi8(3);
    __m512i acc[NR][MR];
#pragma GCC unroll 4
    for (int a = 0; a < NR; a++)
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) acc[a][i] = _mm512_setzero_si512();
    for (int64_t b = 0; b < blocks; b++) {
        __m512i x0[MR], x1[MR];
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            const int8_t *qb = q + (size_t)i * stride + b * 128;
            x0[i] = _mm512_loadu_si512((const void *)qb);
            x1[i] = _mm512_loadu_si512((const void *)(qb + 64));
        }
#pragma GCC unroll 4
        for (int a = 0; a < NR; a++) {
            const __m256i v =
                _mm256_loadu_si256((const __m256i *)(w + (size_t)a * row_bytes + b * 32));
            const __m256i c0 = _mm256_and_si256(v, m3);
            const __m256i c1 = _mm256_and_si256(_mm256_srli_epi16(v, 2), m3);
            const __m256i c2 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m3);
            const __m256i c3 = _mm256_and_si256(_mm256_srli_epi16(v, 6), m3);
            const __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1);
            const __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(c2), c3, 1);
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                acc[a][i] = _mm512_dpbusd_epi32(acc[a][i], lo, x0[i]);
                acc[a][i] = _mm512_dpbusd_epi32(acc[a][i], hi, x1[i]);
            }
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < NR; a++)
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) d[a][i] = _mm512_reduce_add_epi32(acc[a][i]);
}

void ternary_matmul_avx512(const struct qweight *w, int64_t r0, int64_t r1, const int8_t *q,
                           size_t stride, const int32_t *qsum, const float *qdiv, int m, float *y,
                           int64_t ldy)
{
    const int m4 = m - m % MR;
    if (m4 == 0) {
        ternary_matmul_avx2(w, r0, r1, q, stride, qsum, qdiv, m, y, ldy);
        return;
    }
    const int64_t blocks = (int64_t)w->row_bytes / 32;
    int64_t r = r0;
    for (; r + NR <= r1; r += NR) {
        const uint8_t *rows = w->w + (size_t)r * w->row_bytes;
        for (int i0 = 0; i0 < m4; i0 += MR) {
            int32_t d[NR][MR];
            tile(rows, w->row_bytes, blocks, q + (size_t)i0 * stride, stride, d);
            for (int a = 0; a < NR; a++)
                for (int i = 0; i < MR; i++)
                    y[(size_t)(i0 + i) * ldy + r + a] =
                        (float)(d[a][i] - qsum[i0 + i]) / qdiv[i0 + i] * w->t_mul;
        }
    }
    /* the rows past the last whole tile of weight rows, and the last m % MR input rows */
    if (r < r1) ternary_matmul_avx2(w, r, r1, q, stride, qsum, qdiv, m4, y, ldy);
    if (m4 < m)
        ternary_matmul_avx2(w, r0, r1, q + (size_t)m4 * stride, stride, qsum + m4, qdiv + m4,
                            m - m4, y + (size_t)m4 * ldy, ldy);
}
