/*
 * The affine 4-bit integer tiles with AVX-512 VNNI (compiled with the AVX-512 flags, used
 * only when the CPU has them): one 512-bit vpdpbusd multiplies 128 nibble x int8 products,
 * two 64-column chunks at once, over x prepared in the paired layout (affine4_avx2.c).
 * Each int32 lane gets the products the AVX2 tile's lane gets (affine4_tile.h): with groups
 * of 64 a vector's halves are two groups, each folded into the float chain as the AVX2 tile
 * does; larger groups add the halves (exact) first. The outputs are bitwise the AVX2 ones.
 */
#include <immintrin.h>

#include "kernels/cpu/affine4_tile.h"
#include "kernels/cpu/affine8.h"

/* Part p (0: hi even, 1: hi odd, 2: lo even, 3: lo odd) of chunk c in a paired row. */
ALWAYS_INLINE const uint8_t *xpart(const uint8_t *xi, int64_t c, int p)
{
    return xi + (c / 2) * 256 + (c % 2) * 32 + p * 64;
}

/* The 8-lane sums of one chunk (s: lo products, sh: hi products). */
ALWAYS_INLINE void chunk256(const uint8_t *row, int64_t c, const uint8_t *xi, __m256i *s,
                            __m256i *sh)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i v = _mm256_loadu_si256((const __m256i *)(row + c * 32));
    __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    *sh = _mm256_dpbusd_epi32(*sh, lo, _mm256_loadu_si256((const __m256i *)xpart(xi, c, 0)));
    *sh = _mm256_dpbusd_epi32(*sh, hi, _mm256_loadu_si256((const __m256i *)xpart(xi, c, 1)));
    *s = _mm256_dpbusd_epi32(*s, lo, _mm256_loadu_si256((const __m256i *)xpart(xi, c, 2)));
    *s = _mm256_dpbusd_epi32(*s, hi, _mm256_loadu_si256((const __m256i *)xpart(xi, c, 3)));
}

ALWAYS_INLINE void q4_tile512(const struct qweight *w, int64_t r, int64_t g0, int64_t g1,
                              const uint8_t *xp, size_t stride, const int MR, const int CPG,
                              int cpg, float *acc, int64_t ldacc, int resume, float *ssx)
{
    if (CPG) cpg = CPG;
    int64_t groups = w->k / w->group, chunks = w->k / 64, ng = g1 - g0;
    const uint8_t *row = w->w + (size_t)r * w->row_bytes;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m256 tot[QMR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
        tot[i] = resume ? _mm256_loadu_ps(acc + i * ldacc) : _mm256_setzero_ps();
        const float *xsc =
            (const float *)(xp + (size_t)i * stride + affine4_xs_off(chunks, 1)) + groups;
        affine_scale_sx(w, r, g0, g1, xsc, ssx + i * ng);
    }
    if (cpg == 1) {
        for (int64_t g = g0; g < g1;) {
            if (g & 1 || g + 1 == g1) { /* a chunk without its pair */
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    __m256i s = _mm256_setzero_si256(), sh = s;
                    chunk256(row, g, xp + (size_t)i * stride, &s, &sh);
                    s = _mm256_add_epi32(s, _mm256_slli_epi32(sh, 8));
                    tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s),
                                             _mm256_broadcast_ss(ssx + i * ng + (g - g0)), tot[i]);
                }
                g++;
                continue;
            }
            /* Streams 1 KB ahead: the prefetcher alone leaves the loads waiting. */
            _mm_prefetch((const char *)(row + g * 32 + 1024), _MM_HINT_T0);
            __m512i v = _mm512_loadu_si512(row + g * 32);
            __m512i lo = _mm512_and_si512(v, m4),
                    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                const uint8_t *b = xp + (size_t)i * stride + (g / 2) * 256;
                __m512i sh = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(b));
                sh = _mm512_dpbusd_epi32(sh, hi, _mm512_loadu_si512(b + 64));
                __m512i s =
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(b + 128));
                s = _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(b + 192));
                __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(s, _mm512_slli_epi32(sh, 8)));
                const float *sc = ssx + i * ng + (g - g0);
                tot[i] =
                    _mm256_fmadd_ps(_mm512_castps512_ps256(f), _mm256_broadcast_ss(sc), tot[i]);
                tot[i] = _mm256_fmadd_ps(
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)),
                    _mm256_broadcast_ss(sc + 1), tot[i]);
            }
            g += 2;
        }
    } else {
        for (int64_t g = g0; g < g1; g++) {
            __m512i s[QMR], sh[QMR];
            __m256i s1[QMR], sh1[QMR];
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                s[i] = sh[i] = _mm512_setzero_si512();
                s1[i] = sh1[i] = _mm256_setzero_si256();
            }
            for (int64_t c = g * cpg; c < (g + 1) * cpg;) {
                if (c & 1 || c + 1 == (g + 1) * cpg) {
#pragma GCC unroll 4
                    for (int i = 0; i < MR; i++)
                        chunk256(row, c, xp + (size_t)i * stride, &s1[i], &sh1[i]);
                    c++;
                    continue;
                }
                _mm_prefetch((const char *)(row + c * 32 + 1024), _MM_HINT_T0);
                __m512i v = _mm512_loadu_si512(row + c * 32);
                __m512i lo = _mm512_and_si512(v, m4);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    const uint8_t *b = xp + (size_t)i * stride + (c / 2) * 256;
                    sh[i] = _mm512_dpbusd_epi32(sh[i], lo, _mm512_loadu_si512(b));
                    sh[i] = _mm512_dpbusd_epi32(sh[i], hi, _mm512_loadu_si512(b + 64));
                    s[i] = _mm512_dpbusd_epi32(s[i], lo, _mm512_loadu_si512(b + 128));
                    s[i] = _mm512_dpbusd_epi32(s[i], hi, _mm512_loadu_si512(b + 192));
                }
                c += 2;
            }
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                __m512i t = _mm512_add_epi32(s[i], _mm512_slli_epi32(sh[i], 8));
                __m256i f =
                    _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
                f = _mm256_add_epi32(f, _mm256_add_epi32(s1[i], _mm256_slli_epi32(sh1[i], 8)));
                tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(f),
                                         _mm256_broadcast_ss(ssx + i * ng + (g - g0)), tot[i]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) _mm256_storeu_ps(acc + i * ldacc, tot[i]);
}

#define Q4Z(MR, CPG)                                                                               \
    static void q4z_##MR##_##CPG(const struct qweight *w, int64_t r, int nrows, int64_t g0,        \
                                 int64_t g1, const uint8_t *xp, size_t stride, int cpg,            \
                                 float *acc, int64_t ldacc, int resume, float *ssx)                \
    {                                                                                              \
        for (int j = 0; j < nrows; j++)                                                            \
            q4_tile512(w, r + j, g0, g1, xp, stride, MR, CPG, cpg, acc + j * 8, ldacc, resume,     \
                       ssx);                                                                       \
    }
#define Q4Z_ROW(MR) Q4Z(MR, 1) Q4Z(MR, 2) Q4Z(MR, 0)
Q4Z_ROW(1)
Q4Z_ROW(2)
Q4Z_ROW(3)
Q4Z_ROW(4)
const q4_fn q4_tab_avx512[QMR][3] = {
    {q4z_1_1, q4z_1_2, q4z_1_0},
    {q4z_2_1, q4z_2_2, q4z_2_0},
    {q4z_3_1, q4z_3_2, q4z_3_0},
    {q4z_4_1, q4z_4_2, q4z_4_0},
};
