/*
 * Affine 4-bit weights with groups of 64 or more (AVX2): integer dot products, for every m.
 *
 * Each x row is split once per call, per weight group, into a 16-bit fixed-point value held
 * as two int8 halves: x ~ sx * (256 hi + lo), |error| <= sx / 2 with sx = max|x| / 32639
 * (about 1.5e-5 of the group's largest input). vpmaddubsw then multiplies 32 nibbles by 32
 * inputs per instruction, 2.5x fewer instructions than converting nibbles to float. The
 * split depends on the x row alone, and the integer sums are exact, so output (i, r) is
 *   hsum(sum over groups g in order of fma(float(q_g . x_g), s_g * sx_g)) + bias(r, i)
 * with bias(r, i) = sum_g b_g * sum(x_g) in a fixed order, whatever m is.
 *
 * Layout of a prepared row: per 64 columns (32 weight bytes: even columns in low nibbles,
 * odd ones in high nibbles) 128 bytes: hi halves of the 32 even columns, of the 32 odd
 * ones, then the lo halves likewise; after all chunks, the groups' sums of x, then sx.
 * The paired layout (the AVX-512 tiles) interleaves chunks 2j and 2j + 1 in 256 bytes, each
 * of the 4 parts 64 bytes: chunk 2j's 32 then chunk 2j + 1's, one 512-bit load.
 */
#include <math.h>

#include "common/scratch.h"
#include "kernels/cpu/affine8.h"
#include "kernels/cpu/avx2.h"
#include "kernels/cpu/impl.h"
#include "kernels/cpu/quant.h"

int affine4_vnni;

size_t affine4_prep_bytes(const struct qweight *w, int paired)
{
    return affine4_xs_off(w->k / 64, paired) + (size_t)(w->k / w->group) * 2 * sizeof(float);
}

/* 32 int32 values (4 vectors, in order) -> 32 int8 at dst. */
static inline void store_i8x32(int8_t *dst, __m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)dst, p);
}

/* round half to even, as rintf */
#define ROUND_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

/* Splits 32 scaled values (4 vectors) into hi and lo halves, stored lo_off bytes apart. */
static inline void split32(int8_t *dst, const __m256 *t, size_t lo_off)
{
    const __m256 lim_h = _mm256_set1_ps(127.0f), lim_l = _mm256_set1_ps(-128.0f);
    const __m256 c256 = _mm256_set1_ps(256.0f), inv256 = _mm256_set1_ps(1.0f / 256.0f);
    __m256i h[4], l[4];
    for (int v = 0; v < 4; v++) {
        __m256 hv = _mm256_round_ps(_mm256_mul_ps(t[v], inv256), ROUND_NEAREST);
        hv = _mm256_min_ps(_mm256_max_ps(hv, _mm256_sub_ps(_mm256_setzero_ps(), lim_h)), lim_h);
        __m256 lv = _mm256_round_ps(_mm256_fnmadd_ps(c256, hv, t[v]), ROUND_NEAREST);
        lv = _mm256_min_ps(_mm256_max_ps(lv, lim_l), lim_h);
        h[v] = _mm256_cvtps_epi32(hv);
        l[v] = _mm256_cvtps_epi32(lv);
    }
    store_i8x32(dst, h[0], h[1], h[2], h[3]);
    store_i8x32(dst + lo_off, l[0], l[1], l[2], l[3]);
}

void affine4_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride,
                  int paired)
{
    int64_t k = w->k, G = w->group, groups = k / G, chunks = k / 64;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * k;
        int8_t *xq = (int8_t *)(xp + (size_t)i * stride);
        float *xs = (float *)(xp + (size_t)i * stride + affine4_xs_off(chunks, paired));
        float *xsc = xs + groups;
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
            float sx = amax > 0 ? amax / 32639.0f : 1.0f;
            xsc[g] = sx;
            __m256 inv = _mm256_set1_ps(1.0f / sx);
            for (int64_t c = 0; c < G / 64; c++) {
                const float *xc = xg + c * 64;
                __m256 ev[4], od[4];
                for (int v = 0; v < 4; v++) {
                    __m256 a = _mm256_loadu_ps(xc + 16 * v), b = _mm256_loadu_ps(xc + 16 * v + 8);
                    /* [a0 a2 b0 b2 | a4 a6 b4 b6] -> a0 a2 a4 a6 b0 b2 b4 b6 */
                    __m256 e = _mm256_shuffle_ps(a, b, 0x88), o = _mm256_shuffle_ps(a, b, 0xdd);
                    e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xd8));
                    o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xd8));
                    ev[v] = _mm256_mul_ps(e, inv);
                    od[v] = _mm256_mul_ps(o, inv);
                }
                int64_t ch = g * G / 64 + c;
                size_t part = paired ? 64 : 32;
                int8_t *dst = xq + (paired ? (ch / 2) * 256 + (ch % 2) * 32 : ch * 128);
                split32(dst, ev, 2 * part);
                split32(dst + part, od, 2 * part);
            }
        }
    }
}

float affine_bias_dot(const struct qweight *w, int64_t r, const float *xs)
{
    int64_t groups = w->k / w->group, g = 0;
    float s = 0;
    if (w->sdtype == ST_BF16) {
        const uint16_t *br = (const uint16_t *)w->biases + r * groups;
        __m256 acc = _mm256_setzero_ps();
        for (; g + 8 <= groups; g += 8)
            acc = _mm256_fmadd_ps(load_bf16(br + g), _mm256_loadu_ps(xs + g), acc);
        s = hsum(acc);
    }
    for (; g < groups; g++) s += quant_load_scale(w->biases, w->sdtype, r * groups + g) * xs[g];
    return s;
}

#include "kernels/cpu/affine4_tile.h"

Q4_TABLE(q4_tab_avx2, 0)

/* Blocking: up to SMALL_M x rows, whole weight rows (decode); above, blocks
 * of QNB weight rows by panels of about QKC columns (x panel of 4 rows: 4 KB; weight panel:
 * 8 KB), the chains parked between panels. */
#define SMALL_M 3
#define QNB     32
#define QKC     512

void affine4_matmul(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                    size_t stride, int m, float *y, int64_t ldy)
{
#if defined(PAGODA_AVXVNNI)
    const q4_fn(*tab)[3] = affine4_vnni ? q4_tab_vnni : q4_tab_avx2;
#else
    const q4_fn(*tab)[3] = q4_tab_avx2;
#endif
    affine4_matmul_tab(w, r0, r1, xp, stride, m, y, ldy, tab, 0);
}

void affine4_matmul_tab(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                        size_t stride, int m, float *y, int64_t ldy, const q4_fn (*tab)[3],
                        int paired)
{
    int64_t k = w->k, G = w->group, groups = k / G, chunks = k / 64;
    int cpg = (int)(G / 64), ci = cpg == 1 ? 0 : cpg == 2 ? 1 : 2;
    int small = m <= SMALL_M;
    int nbmax = small ? 16 : QNB;
    int64_t gpp = small ? groups : (QKC / G > 0 ? QKC / G : 1); /* groups per panel */
    int64_t ldacc = (int64_t)nbmax * 8;
    float *acc = scratch_get(SCRATCH_GEMM_A, (size_t)m * (size_t)ldacc);
    float *ssx = scratch_get(SCRATCH_GEMV, (size_t)(QMR * gpp)); /* a tile's combined scales */
    for (int64_t rb = r0; rb < r1; rb += nbmax) {
        int nb = (int)(r1 - rb < nbmax ? r1 - rb : nbmax);
        for (int64_t g0 = 0; g0 < groups; g0 += gpp) {
            int64_t g1 = g0 + gpp < groups ? g0 + gpp : groups;
            for (int i0 = 0; i0 < m; i0 += QMR) {
                int mr = m - i0 < QMR ? m - i0 : QMR;
                tab[mr - 1][ci](w, rb, nb, g0, g1, xp + (size_t)i0 * stride, stride, cpg,
                                acc + i0 * ldacc, ldacc, g0 > 0, ssx);
            }
        }
        for (int i = 0; i < m; i++) {
            const float *xs =
                (const float *)(xp + (size_t)i * stride + affine4_xs_off(chunks, paired));
            for (int j = 0; j < nb; j++)
                y[i * ldy + rb + j] =
                    hsum(_mm256_loadu_ps(acc + i * ldacc + j * 8)) + affine_bias_dot(w, rb + j, xs);
        }
    }
}
