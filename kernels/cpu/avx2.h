/*
 * avx2: helpers shared by the AVX2 + FMA kernel files (internal to kernels/cpu; include only
 * from files compiled with -mavx2 -mfma -mf16c).
 */
#ifndef PAGODA_KERNELS_CPU_AVX2_H
#define PAGODA_KERNELS_CPU_AVX2_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "model/weights.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The one horizontal-sum tree of every AVX2 kernel: (lanes 0-3 + 4-7), then pairs. */
ALWAYS_INLINE float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 bf16 -> 8 float: widen to 32 bits and shift into the high half. */
ALWAYS_INLINE __m256 load_bf16(const uint16_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* r[i] holds 8 words of row i; afterwards r[j] holds word j of rows 0 .. 7. */
ALWAYS_INLINE void transpose8x32(__m256i r[8])
{
    __m256i t[8], u[8];
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm256_unpacklo_epi32(r[j], r[j + 1]);
        t[j + 1] = _mm256_unpackhi_epi32(r[j], r[j + 1]);
    }
    for (int j = 0; j < 8; j += 4) {
        u[j] = _mm256_unpacklo_epi64(t[j], t[j + 2]);
        u[j + 1] = _mm256_unpackhi_epi64(t[j], t[j + 2]);
        u[j + 2] = _mm256_unpacklo_epi64(t[j + 1], t[j + 3]);
        u[j + 3] = _mm256_unpackhi_epi64(t[j + 1], t[j + 3]);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
        r[4 + j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
    }
}

/* Affine 4-bit with groups of 64 or more: the integer kernel (affine4_avx2.c), used for
 * every m. x is first prepared per row into affine4_prep_bytes() bytes. */
static inline int affine4_int(const struct qweight *w)
{
    return w->fmt == WFMT_AFFINE && w->bits == 4 && w->group % 64 == 0;
}
/* Bytes of a prepared row's int8 halves, before its groups' sums and scales (`paired`: the
 * AVX-512 tiles' layout; see affine4_avx2.c). */
static inline size_t affine4_xs_off(int64_t chunks, int paired)
{
    return paired ? (size_t)((chunks + 1) / 2) * 256 : (size_t)chunks * 128;
}
size_t affine4_prep_bytes(const struct qweight *w, int paired);
void affine4_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride,
                  int paired);
void affine4_matmul(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                    size_t stride, int m, float *y, int64_t ldy);

/* Columns [k0, k0 + len) of row r (whole groups) of affine 2/3/5/6-bit, mxfp4, nvfp4 or
 * mxfp8 weights into dst, exactly as quant_dequant_row (decode_avx2.c); 0 for any other
 * format, which the caller decodes. */
int decode_row_fast(const struct qweight *w, int64_t r, int64_t k0, int64_t len, float *dst);

/* Entries of the AVX2 table (matmul_avx2.c) that the AVX-512 table shares. */
float dot_avx2(const float *a, const float *b, int n);
void axpy_avx2(float *y, float a, const float *x, int n);
size_t prep_bytes_avx2(const struct qweight *w);
void prep_avx2(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride);
void matmul_avx2(const struct qweight *w, int64_t r0, int64_t r1, const float *x, const uint8_t *xp,
                 size_t stride, int m, float *y, int64_t ldy);

#endif
