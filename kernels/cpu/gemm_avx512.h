/*
 * gemm_avx512: the panel packing shared by the AVX-512 product kernels (see gemm.h);
 * include only from files compiled with AVX-512 F/BW/VL.
 */
#ifndef PAGODA_KERNELS_CPU_GEMM_AVX512_H
#define PAGODA_KERNELS_CPU_GEMM_AVX512_H

#include <immintrin.h>
#include <string.h>
#include <stdint.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* r[i] holds 16 words of row i; afterwards r[j] holds word j of rows 0 .. 15. */
ALWAYS_INLINE void gemm_transpose16(__m512i r[16])
{
    __m512i t[16];
    for (int j = 0; j < 16; j += 2) {
        t[j] = _mm512_unpacklo_epi32(r[j], r[j + 1]);
        t[j + 1] = _mm512_unpackhi_epi32(r[j], r[j + 1]);
    }
    for (int j = 0; j < 16; j += 4) {
        r[j] = _mm512_unpacklo_epi64(t[j], t[j + 2]);
        r[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
        r[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
        r[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
    }
    /* r[4a + c]: 128-bit lane L holds word 4L + c of rows 4a .. 4a + 3 */
    for (int c = 0; c < 4; c++) {
        t[c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
        t[8 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
    }
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
        r[4 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xdd);
    }
}

/* 64 codes of a row from column c0 (a multiple of 64), in the order x is prepared in: 8-bit
 * codes as they lie; 4-bit ones each 8 columns as their 4 even, then their 4 odd ones; 2,
 * 3, 5 and 6-bit ones (an LSB-first bit stream: 8 codes fill `bits` bytes) in column order. */
ALWAYS_INLINE __m512i gemm_q8_load_codes(const uint8_t *row, int bits, int64_t c0)
{
    if (bits == 8) return _mm512_loadu_si512(row + c0);
    if (bits != 4) {
        const __m512i sh = _mm512_setr_epi64(0, bits, 2 * bits, 3 * bits, 4 * bits, 5 * bits,
                                             6 * bits, 7 * bits),
                      mask = _mm512_set1_epi64((1 << bits) - 1);
        const uint8_t *p = row + c0 * bits / 8;
        __m128i part[4];
        for (int g = 0; g < 8; g += 2) { /* 8 codes a group: a field a 64-bit lane, then bytes */
            uint64_t v0 = 0, v1 = 0;
            memcpy(&v0, p + g * bits, (size_t)bits);
            memcpy(&v1, p + (g + 1) * bits, (size_t)bits);
            __m128i b0 = _mm512_cvtepi64_epi8(
                _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64((long long)v0), sh), mask));
            __m128i b1 = _mm512_cvtepi64_epi8(
                _mm512_and_si512(_mm512_srlv_epi64(_mm512_set1_epi64((long long)v1), sh), mask));
            part[g / 2] = _mm_unpacklo_epi64(b0, b1);
        }
        __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(part[0]), part[1], 1),
                hi = _mm256_inserti128_si256(_mm256_castsi128_si256(part[2]), part[3], 1);
        return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i v = _mm256_loadu_si256((const __m256i *)(row + c0 / 2));
    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    /* each 8 columns: their 4 even (low nibbles), then their 4 odd ones */
    __m256i ul = _mm256_unpacklo_epi32(lo, hi), uh = _mm256_unpackhi_epi32(lo, hi);
    __m256i a = _mm256_permute2x128_si256(ul, uh, 0x20),
            b = _mm256_permute2x128_si256(ul, uh, 0x31);
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

/* Four 16 x 16 float tiles (as AMX stores them: t[i][j] = weight row i, x row j; tile u holds
 * weight rows (u & 1) * 16 of a block of 32 against x rows xr + (u >> 1) * 16) into y, rows
 * ldy apart, transposed: weight rows past nb and x rows past m are not stored. */
ALWAYS_INLINE void gemm_tiles_store(float c[4][256], int tiles, float *y, int64_t ldy, int64_t wr,
                                    int nb, int xr, int m)
{
    for (int t = 0; t < tiles; t++) {
        int w0 = (t & 1) * 16, x0 = xr + (t >> 1) * 16;
        int cols = nb - w0 < 16 ? nb - w0 : 16;
        if (cols <= 0) continue;
        __m512i r[16];
        for (int i = 0; i < 16; i++) r[i] = _mm512_load_si512(c[t] + i * 16);
        gemm_transpose16(r); /* r[j]: x row x0 + j against the 16 weight rows */
        __mmask16 mask = (__mmask16)((1u << cols) - 1);
        for (int j = 0; j < 16 && x0 + j < m; j++)
            _mm512_mask_storeu_ps(y + (size_t)(x0 + j) * ldy + wr + w0, mask, (__m512)r[j]);
    }
}

#endif
