/*
 * affine4_tile: the integer tile of the affine 4-bit kernel (see affine4_avx2.c), included
 * by affine4_avx2.c (AVX2: vpmaddubsw + vpmaddwd) and affine4_vnni_avx2.c (AVX-VNNI:
 * vpdpbusd).
 * Both compute the same exact int32 sums per group (every product of a nibble and an int8
 * input half, added without rounding or saturation), so they give bitwise the same outputs.
 */
#ifndef PAGODA_KERNELS_CPU_AFFINE4_TILE_H
#define PAGODA_KERNELS_CPU_AFFINE4_TILE_H

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/quant.h"

#define QMR 4 /* x rows per tile */

/*
 * Groups [g0, g1) of weight row r against MR prepared x rows: continues the float chains
 * in acc ([i][8], i ldacc floats apart). CPG (64-column chunks per group) is a constant for
 * the common group sizes, 0 for any other (then cpg gives it).
 */
ALWAYS_INLINE void q4_tile(const struct qweight *w, int64_t r, int64_t g0, int64_t g1,
                           const uint8_t *xp, size_t stride, const int MR, const int CPG, int cpg,
                           float *acc, int64_t ldacc, int resume, float *ssx, const int VNNI)
{
    if (CPG) cpg = CPG;
    int64_t groups = w->k / w->group, chunks = w->k / 64;
    const uint8_t *row = w->w + (size_t)r * w->row_bytes;
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    const __m256i c256 = _mm256_set1_epi16(256);
    __m256 tot[QMR];
    /* ssx[i][g - g0] = s_g * sx_g (the same products as scalar multiplies) */
    int64_t ng = g1 - g0;
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
        tot[i] = resume ? _mm256_loadu_ps(acc + i * ldacc) : _mm256_setzero_ps();
        const float *xsc =
            (const float *)(xp + (size_t)i * stride + affine4_xs_off(chunks, 0)) + groups;
        float *d = ssx + i * ng;
        int64_t g = g0;
        if (w->sdtype == ST_BF16) {
            const uint16_t *sr = (const uint16_t *)w->scales + r * groups;
            for (; g + 8 <= g1; g += 8)
                _mm256_storeu_ps(d + (g - g0),
                                 _mm256_mul_ps(load_bf16(sr + g), _mm256_loadu_ps(xsc + g)));
        }
        for (; g < g1; g++)
            d[g - g0] = quant_load_scale(w->scales, w->sdtype, r * groups + g) * xsc[g];
    }
    for (int64_t g = g0; g < g1; g++) {
        __m256i s[QMR], sh[QMR]; /* sh: the hi halves' sums (VNNI only) */
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) s[i] = sh[i] = _mm256_setzero_si256();
        for (int64_t c = g * cpg; c < (g + 1) * cpg; c++) {
            /* Streams 1 KB ahead: the prefetcher alone leaves the loads waiting. */
            _mm_prefetch((const char *)(row + c * 32 + 1024), _MM_HINT_T0);
            __m256i v = _mm256_loadu_si256((const __m256i *)(row + c * 32));
            __m256i lo = _mm256_and_si256(v, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
#if defined(__AVXVNNI__)
            if (VNNI) {
                /* the same products, summed 4 at a time straight into int32 lanes */
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    const __m256i *b = (const __m256i *)(xp + (size_t)i * stride + c * 128);
                    sh[i] = _mm256_dpbusd_avx_epi32(sh[i], lo, _mm256_loadu_si256(b));
                    sh[i] = _mm256_dpbusd_avx_epi32(sh[i], hi, _mm256_loadu_si256(b + 1));
                    s[i] = _mm256_dpbusd_avx_epi32(s[i], lo, _mm256_loadu_si256(b + 2));
                    s[i] = _mm256_dpbusd_avx_epi32(s[i], hi, _mm256_loadu_si256(b + 3));
                }
                continue;
            }
#endif
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                const __m256i *b = (const __m256i *)(xp + (size_t)i * stride + c * 128);
                __m256i ph = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(b)),
                                              _mm256_maddubs_epi16(hi, _mm256_loadu_si256(b + 1)));
                __m256i pl = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(b + 2)),
                                              _mm256_maddubs_epi16(hi, _mm256_loadu_si256(b + 3)));
                /* 256 * hi products + lo products, exact in int32 */
                s[i] = _mm256_add_epi32(s[i], _mm256_add_epi32(_mm256_madd_epi16(ph, c256),
                                                               _mm256_madd_epi16(pl, ones)));
            }
        }
        if (VNNI)
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) s[i] = _mm256_add_epi32(s[i], _mm256_slli_epi32(sh[i], 8));
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++)
            tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]),
                                     _mm256_broadcast_ss(ssx + i * ng + (g - g0)), tot[i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) _mm256_storeu_ps(acc + i * ldacc, tot[i]);
}

typedef void (*q4_fn)(const struct qweight *w, int64_t r, int nrows, int64_t g0, int64_t g1,
                      const uint8_t *xp, size_t stride, int cpg, float *acc, int64_t ldacc,
                      int resume, float *ssx);
/* Weight rows [r, r + nrows), their chains 8 floats apart in acc. */
#define Q4(P, V, MR, CPG)                                                                          \
    static void P##_##MR##_##CPG(const struct qweight *w, int64_t r, int nrows, int64_t g0,        \
                                 int64_t g1, const uint8_t *xp, size_t stride, int cpg,            \
                                 float *acc, int64_t ldacc, int resume, float *ssx)                \
    {                                                                                              \
        for (int j = 0; j < nrows; j++)                                                            \
            q4_tile(w, r + j, g0, g1, xp, stride, MR, CPG, cpg, acc + j * 8, ldacc, resume, ssx,   \
                    V);                                                                            \
    }
#define Q4_ROW(P, V, MR) Q4(P, V, MR, 1) Q4(P, V, MR, 2) Q4(P, V, MR, 0)
/* NAME[MR - 1][groups of 64, of 128, other]; V: 1 for the VNNI tiles */
#define Q4_TABLE(NAME, V)                                                                          \
    Q4_ROW(NAME, V, 1)                                                                             \
    Q4_ROW(NAME, V, 2)                                                                             \
    Q4_ROW(NAME, V, 3) Q4_ROW(NAME, V, 4) const q4_fn NAME[QMR][3] = {                             \
        {NAME##_1_1, NAME##_1_2, NAME##_1_0},                                                      \
        {NAME##_2_1, NAME##_2_2, NAME##_2_0},                                                      \
        {NAME##_3_1, NAME##_3_2, NAME##_3_0},                                                      \
        {NAME##_4_1, NAME##_4_2, NAME##_4_0},                                                      \
    };

/* The AVX2 tiles (affine4_avx2.c), the AVX-VNNI ones (affine4_vnni_avx2.c, built when
 * PAGODA_AVXVNNI is defined) and the AVX-512 ones (affine4_avx512.c, over the paired
 * layout; built when PAGODA_AVX512 is defined). */
extern const q4_fn q4_tab_avx2[QMR][3];
extern const q4_fn q4_tab_vnni[QMR][3];
extern const q4_fn q4_tab_avx512[QMR][3];

/* affine4_matmul with the tiles of `tab` over x prepared in the layout `paired` says. */
void affine4_matmul_tab(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                        size_t stride, int m, float *y, int64_t ldy, const q4_fn (*tab)[3],
                        int paired);

#endif
