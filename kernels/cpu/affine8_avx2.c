/*
 * Affine 8-bit weights (AVX2): the input preparation, the driver and the AVX2 tiles of the
 * integer kernel described in affine8.h. vpmaddwd multiplies 16 zero-extended weight bytes
 * by 16 int16 inputs and adds pairs into 8 int32 lanes: 4 instructions per 16 weights and
 * x row (two parts of x), where decoding to float and FMAs take 6.
 */
#include "common/scratch.h"
#include "kernels/cpu/affine8.h"
#include "kernels/cpu/avx2.h"
#include "kernels/cpu/quant.h"

size_t affine8_prep_bytes(const struct qweight *w)
{
    return (size_t)w->k * 2 * sizeof(int16_t) + (size_t)(w->k / w->group) * 2 * sizeof(float);
}

void affine8_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride)
{
    int64_t k = w->k, G = w->group, groups = k / G;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 lim = _mm256_set1_ps(32767.0f), nlim = _mm256_set1_ps(-32767.0f);
    const __m256 c65536 = _mm256_set1_ps(65536.0f);
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * k;
        int16_t *xq = (int16_t *)(xp + (size_t)i * stride);
        int16_t *xl = xq + k;
        float *xs = (float *)(xl + k), *xsc = xs + groups;
        for (int64_t g = 0; g < groups; g++) {
            const float *xg = xi + g * G;
            __m256 mx = _mm256_setzero_ps(), sm = _mm256_setzero_ps();
            for (int64_t j = 0; j < G; j += 8) {
                __m256 v = _mm256_loadu_ps(xg + j);
                mx = _mm256_max_ps(mx, _mm256_and_ps(v, absmask));
                sm = _mm256_add_ps(sm, v);
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            xs[g] = hsum(sm);
            float sx = amax > 0 ? amax / 32767.0f : 1.0f;
            xsc[g] = sx;
            __m256 inv = _mm256_set1_ps(1.0f / sx);
            for (int64_t j = 0; j < G; j += 16) {
                __m256i q[2], l[2];
                for (int h = 0; h < 2; h++) {
                    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(xg + j + 8 * h), inv);
                    t = _mm256_min_ps(_mm256_max_ps(t, nlim), lim);
                    /* round half to even, as rintf */
                    __m256 tq = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    __m256 tl = _mm256_mul_ps(_mm256_sub_ps(t, tq), c65536);
                    tl = _mm256_min_ps(_mm256_max_ps(tl, nlim), lim);
                    q[h] = _mm256_cvtps_epi32(tq);
                    l[h] = _mm256_cvtps_epi32(tl);
                }
                _mm256_storeu_si256((__m256i *)(xq + g * G + j),
                                    _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xd8));
                _mm256_storeu_si256((__m256i *)(xl + g * G + j),
                                    _mm256_permute4x64_epi64(_mm256_packs_epi32(l[0], l[1]), 0xd8));
            }
        }
    }
}

void affine_scale_sx(const struct qweight *w, int64_t r, int64_t g0, int64_t g1, const float *xsc,
                     float *d)
{
    int64_t groups = w->k / w->group, g = g0;
    if (w->sdtype == ST_BF16) {
        const uint16_t *sr = (const uint16_t *)w->scales + r * groups;
        for (; g + 8 <= g1; g += 8)
            _mm256_storeu_ps(d + (g - g0),
                             _mm256_mul_ps(load_bf16(sr + g), _mm256_loadu_ps(xsc + g)));
    }
    for (; g < g1; g++) d[g - g0] = quant_load_scale(w->scales, w->sdtype, r * groups + g) * xsc[g];
}

ALWAYS_INLINE void a8_tile(const struct qweight *w, int64_t r, int64_t g0, int64_t g1,
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
        __m256i s[A8MR], sl[A8MR];
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) s[i] = sl[i] = _mm256_setzero_si256();
        for (int64_t c = g * G; c < (g + 1) * G; c += 16) {
            /* Streams 1 KB ahead, one prefetch per cache line. */
            if (!(c & 63)) _mm_prefetch((const char *)(row + c + 1024), _MM_HINT_T0);
            __m256i wv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(row + c)));
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                const int16_t *xq = (const int16_t *)(xp + (size_t)i * stride) + c;
                s[i] = _mm256_add_epi32(
                    s[i], _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)xq)));
                sl[i] = _mm256_add_epi32(
                    sl[i], _mm256_madd_epi16(wv, _mm256_loadu_si256((const __m256i *)(xq + k))));
            }
        }
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            __m256 c = _mm256_broadcast_ss(ssx + i * ng + (g - g0));
            tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[i]), c, tot[i]);
            tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sl[i]), _mm256_mul_ps(c, inv65536), tot[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) _mm256_storeu_ps(acc + i * ldacc, tot[i]);
}

#define A8(MR)                                                                                     \
    static void a8_avx2_##MR(const struct qweight *w, int64_t r, int nrows, int64_t g0,            \
                             int64_t g1, const uint8_t *xp, size_t stride, float *acc,             \
                             int64_t ldacc, int resume, float *ssx)                                \
    {                                                                                              \
        for (int j = 0; j < nrows; j++)                                                            \
            a8_tile(w, r + j, g0, g1, xp, stride, MR, acc + j * 8, ldacc, resume, ssx);            \
    }
A8(1)
A8(2)
A8(3)
A8(4)
const a8_fn a8_tab_avx2[A8MR] = {a8_avx2_1, a8_avx2_2, a8_avx2_3, a8_avx2_4};

/* Blocking: up to SMALL_M x rows, whole weight rows (decode); above, blocks of QNB weight
 * rows by panels of about QKC columns (x panel of 4 rows: 4 KB; weight panel: 16 KB), the
 * chains parked between panels. */
#define SMALL_M 3
#define QNB     32
#define QKC     512

void affine8_matmul(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                    size_t stride, int m, float *y, int64_t ldy, const a8_fn *tab)
{
    int64_t k = w->k, G = w->group, groups = k / G;
    int small = m <= SMALL_M;
    int nbmax = small ? 16 : QNB;
    int64_t gpp = small ? groups : (QKC / G > 0 ? QKC / G : 1); /* groups per panel */
    int64_t ldacc = (int64_t)nbmax * 8;
    float *acc = scratch_get(SCRATCH_GEMM_A, (size_t)m * (size_t)ldacc);
    float *ssx = scratch_get(SCRATCH_GEMV, (size_t)(A8MR * gpp));
    for (int64_t rb = r0; rb < r1; rb += nbmax) {
        int nb = (int)(r1 - rb < nbmax ? r1 - rb : nbmax);
        for (int64_t g0 = 0; g0 < groups; g0 += gpp) {
            int64_t g1 = g0 + gpp < groups ? g0 + gpp : groups;
            for (int i0 = 0; i0 < m; i0 += A8MR) {
                int mr = m - i0 < A8MR ? m - i0 : A8MR;
                tab[mr - 1](w, rb, nb, g0, g1, xp + (size_t)i0 * stride, stride, acc + i0 * ldacc,
                            ldacc, g0 > 0, ssx);
            }
        }
        for (int i = 0; i < m; i++) {
            const float *xs = (const float *)(xp + (size_t)i * stride + k * 4);
            for (int j = 0; j < nb; j++)
                y[i * ldy + rb + j] =
                    hsum(_mm256_loadu_ps(acc + i * ldacc + j * 8)) + affine_bias_dot(w, rb + j, xs);
        }
    }
}
