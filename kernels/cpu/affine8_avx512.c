/*
 * Affine 8-bit weights, the AVX-512 tiles (compiled with the AVX-512 flags, used only when
 * the CPU has them): vpmovzxbw widens 32 weight bytes to int16 and vpdpwssd multiplies them
 * by 32 int16 inputs, adding pairs into 16 int32 lanes; two instructions (the two parts of
 * x) per 32 weights and x row. Lanes 0-7 and 8-15 cover the two 16-column halves of each 32-column
 * step, so their sum at the end of a group is the AVX2 tile's 8 lane sums (affine8.h): the same
 * outputs.
 */
#include <immintrin.h>

#include "kernels/cpu/affine8.h"
#include "kernels/cpu/avx2.h"

ALWAYS_INLINE void a8_tile512(const struct qweight *w, int64_t r, int64_t g0, int64_t g1,
                              const uint8_t *xp, size_t stride, const int MR, float *acc,
                              int64_t ldacc, int resume, float *ssx)
{
    int64_t k = w->k, G = w->group, groups = k / G, ng = g1 - g0;
    const uint8_t *row = w->w + (size_t)r * w->row_bytes;
    const __m256 inv65536 = _mm256_set1_ps(1.0f / 65536.0f);
    __m256 tot[A8MR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
        tot[i] = resume ? _mm256_loadu_ps(acc + i * ldacc) : _mm256_setzero_ps();
        const float *xsc = (const float *)(xp + (size_t)i * stride + k * 4) + groups;
        affine_scale_sx(w, r, g0, g1, xsc, ssx + i * ng);
    }
    for (int64_t g = g0; g < g1; g++) {
        __m512i s[A8MR], sl[A8MR];
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) s[i] = sl[i] = _mm512_setzero_si512();
        for (int64_t c = g * G; c < (g + 1) * G; c += 32) {
            /* Streams 1 KB ahead, one prefetch per cache line. */
            if (!(c & 63)) _mm_prefetch((const char *)(row + c + 1024), _MM_HINT_T0);
            __m512i wv = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(row + c)));
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                const int16_t *xq = (const int16_t *)(xp + (size_t)i * stride) + c;
                s[i] = _mm512_dpwssd_epi32(s[i], wv, _mm512_loadu_si512(xq));
                sl[i] = _mm512_dpwssd_epi32(sl[i], wv, _mm512_loadu_si512(xq + k));
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            __m256i f =
                _mm256_add_epi32(_mm512_castsi512_si256(s[i]), _mm512_extracti64x4_epi64(s[i], 1));
            __m256i fl = _mm256_add_epi32(_mm512_castsi512_si256(sl[i]),
                                          _mm512_extracti64x4_epi64(sl[i], 1));
            __m256 c = _mm256_broadcast_ss(ssx + i * ng + (g - g0));
            tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(f), c, tot[i]);
            tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fl), _mm256_mul_ps(c, inv65536), tot[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) _mm256_storeu_ps(acc + i * ldacc, tot[i]);
}

#define A8(MR)                                                                                     \
    static void a8_avx512_##MR(const struct qweight *w, int64_t r, int nrows, int64_t g0,          \
                               int64_t g1, const uint8_t *xp, size_t stride, float *acc,           \
                               int64_t ldacc, int resume, float *ssx)                              \
    {                                                                                              \
        for (int j = 0; j < nrows; j++)                                                            \
            a8_tile512(w, r + j, g0, g1, xp, stride, MR, acc + j * 8, ldacc, resume, ssx);         \
    }
A8(1)
A8(2)
A8(3)
A8(4)
const a8_fn a8_tab_avx512[A8MR] = {a8_avx512_1, a8_avx512_2, a8_avx512_3, a8_avx512_4};
