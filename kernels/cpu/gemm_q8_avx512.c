/*
 * Affine 2- to 8-bit weights against int8 activations with AVX-512 VNNI (see gemm.h).
 *
 * A prepared x row: k int8 values (4-bit weights: each 8 columns as their 4 even ones, then
 * their 4 odd ones, the order a 4-bit panel unpacks to), padded to 64 bytes; then
 * per group its scale dx = max|x| / 127, then dx * sum(xq) (the bias term's input).
 * Cost: per 4 columns of 32 weight rows and one x row, 2 vpdpbusd; per group and x row,
 * 4 float operations per 16 weight rows.
 */
#if defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#include <string.h>

#include "common/scratch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_avx512.h"
#include "kernels/cpu/quant.h"

#define NB 32 /* weight rows per panel: 2 vectors of 16 */
#define MR 6  /* x rows per tile */

static int64_t xq_bytes(const struct qweight *w)
{
    return (w->k + 63) / 64 * 64;
}

size_t gemm_q8_prep_bytes(const struct qweight *w)
{
    return (size_t)xq_bytes(w) + (size_t)(w->k / w->group) * 2 * sizeof(float);
}

void gemm_q8_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride)
{
    int64_t k = w->k, G = w->group, groups = k / G, kq = xq_bytes(w);
    const __m512i o4 = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * k;
        int8_t *q = (int8_t *)(xp + (size_t)i * stride);
        float *dx = (float *)(xp + (size_t)i * stride + kq), *xs = dx + groups;
        for (int64_t g = 0; g < groups; g++) {
            const float *xg = xi + g * G;
            __m512 mx = _mm512_setzero_ps();
            for (int64_t j = 0; j < G; j += 16)
                mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(xg + j)));
            float amax = _mm512_reduce_max_ps(mx);
            float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
            __m512 vid = _mm512_set1_ps(id);
            __m512i sum = _mm512_setzero_si512();
            for (int64_t j = 0; j < G; j += 32) {
                __m512 a = _mm512_loadu_ps(xg + j), b = _mm512_loadu_ps(xg + j + 16);
                if (w->bits == 4) {
                    a = _mm512_permutexvar_ps(o4, a);
                    b = _mm512_permutexvar_ps(o4, b);
                }
                __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vid));
                __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vid));
                _mm_storeu_si128((__m128i *)(q + g * G + j), _mm512_cvtepi32_epi8(qa));
                _mm_storeu_si128((__m128i *)(q + g * G + j + 16), _mm512_cvtepi32_epi8(qb));
                sum = _mm512_add_epi32(sum, _mm512_add_epi32(qa, qb));
            }
            dx[g] = d;
            xs[g] = d * (float)_mm512_reduce_add_epi32(sum);
        }
    }
}

/*
 * The codes of a 4-bit panel: per 64 columns, each row's 32 bytes as 8 dwords of 8 codes,
 * transposed (two rows a vector, 8 x 8 dwords in each 256-bit half) so that vector d holds
 * dword d of 16 rows, a row a lane; its low nibbles are the row's codes 8d, 8d + 2, 8d + 4,
 * 8d + 6 and its high ones 8d + 1 .. 8d + 7: two steps of the tile, x prepared in that
 * order. 32 shuffles per 16 rows by 64 columns, where unpacking first and transposing 16
 * x 16 words took 112 (the panel's packing was most of a 16-row product).
 */
static void pack4(const struct qweight *w, int64_t rb, int nb, int64_t kp, int64_t len, uint8_t *pw)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13),
                  hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int v = 0; v < 2; v++)
        for (int64_t c = 0; c < len / 64; c++) {
            __m512i r[8], t[8];
            for (int l = 0; l < 8; l++) {
                int j0 = v * 16 + l, j1 = j0 + 8;
                const uint8_t *p = w->w + (size_t)(kp + c * 64) / 2;
                __m256i a = j0 < nb ? _mm256_loadu_si256(
                                          (const __m256i *)(p + (size_t)(rb + j0) * w->row_bytes))
                                    : _mm256_setzero_si256();
                __m256i b = j1 < nb ? _mm256_loadu_si256(
                                          (const __m256i *)(p + (size_t)(rb + j1) * w->row_bytes))
                                    : _mm256_setzero_si256();
                r[l] = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
            }
            for (int l = 0; l < 8; l += 2) {
                t[l] = _mm512_unpacklo_epi32(r[l], r[l + 1]);
                t[l + 1] = _mm512_unpackhi_epi32(r[l], r[l + 1]);
            }
            for (int l = 0; l < 8; l += 4) {
                r[l] = _mm512_unpacklo_epi64(t[l], t[l + 2]);     /* dwords 0 and 4 */
                r[l + 1] = _mm512_unpackhi_epi64(t[l], t[l + 2]); /* 1 and 5 */
                r[l + 2] = _mm512_unpacklo_epi64(t[l + 1], t[l + 3]);
                r[l + 3] = _mm512_unpackhi_epi64(t[l + 1], t[l + 3]);
            }
            for (int d = 0; d < 4; d++) { /* rows 0-3 in r[d], 4-7 in r[4 + d] */
                __m512i q[2] = {_mm512_permutex2var_epi64(r[d], lo, r[4 + d]),
                                _mm512_permutex2var_epi64(r[d], hi, r[4 + d])};
                for (int e = 0; e < 2; e++) {
                    int64_t s = c * 16 + 2 * (d + 4 * e);
                    _mm512_storeu_si512(pw + (s * 2 + v) * 64, _mm512_and_si512(q[e], m4));
                    _mm512_storeu_si512(pw + ((s + 1) * 2 + v) * 64,
                                        _mm512_and_si512(_mm512_srli_epi16(q[e], 4), m4));
                }
            }
        }
}

/* The codes of any other width: each row's 64 codes of a chunk in column order
 * (gemm_q8_load_codes), 16 x 16 words transposed. */
static void pack_codes(const struct qweight *w, int64_t rb, int nb, int64_t kp, int64_t len,
                       uint8_t *pw)
{
    for (int v = 0; v < 2; v++)
        for (int64_t c = 0; c < len / 64; c++) {
            __m512i r[16];
            for (int l = 0; l < 16; l++) {
                int j = v * 16 + l;
                r[l] = j < nb ? gemm_q8_load_codes(w->w + (size_t)(rb + j) * w->row_bytes, w->bits,
                                                   kp + c * 64)
                              : _mm512_setzero_si512();
            }
            gemm_transpose16(r);
            for (int t = 0; t < 16; t++)
                _mm512_storeu_si512(pw + ((c * 16 + t) * 2 + v) * 64, r[t]);
        }
}

/*
 * Rows [rb, rb + nb) of W, columns [kp, kp + len), into the panel: pw [len / 4][2][16 rows]
 * of 4 codes (rows past nb zero), ps [gpp][NB] scales then [gpp][NB] biases at ps + NB * gmax.
 */
static void pack(const struct qweight *w, int64_t rb, int nb, int64_t kp, int64_t len, uint8_t *pw,
                 float *ps, int64_t gmax)
{
    int64_t groups = w->k / w->group, gpp = len / w->group;
    if (w->bits == 4)
        pack4(w, rb, nb, kp, len, pw);
    else
        pack_codes(w, rb, nb, kp, len, pw);
    const int64_t g0 = kp / w->group;
    for (int j = 0; j < NB; j++) {
        const int64_t e = (rb + j) * groups + g0;
        for (int64_t g = 0; g < gpp; g++) {
            ps[g * NB + j] = j < nb ? quant_load_scale(w->scales, w->sdtype, e + g) : 0.0f;
            ps[NB * gmax + g * NB + j] =
                j < nb ? quant_load_scale(w->biases, w->sdtype, e + g) : 0.0f;
        }
    }
}

/* acc + 4-byte dot products of w (unsigned) and x (signed) per lane: vpdpbusd, written out
 * because GCC 12 copies every accumulator of the intrinsic's loop once per iteration. */
ALWAYS_INLINE __m512i dpbusd(__m512i acc, __m512i w, __m512i x)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
    return acc;
}

struct q8_tile_args {
    const uint8_t *pw;
    const float *psc, *pbi;
    int64_t gpp, qpg;
    const uint8_t *xp; /* the tile's first x row */
    size_t stride;
    int64_t kp, g0, groups, kq;
    float *park; /* the tile's chains, NB floats per x row */
    int resume;
    float *y; /* non-NULL on the last panel: the outputs, rows ldy apart */
    int64_t ldy;
    int nb;
};

ALWAYS_INLINE void q8_tile(const int R, const struct q8_tile_args *a)
{
    __m512 tot[MR][2];
    const int8_t *xq[MR];
    const float *dx[MR], *xs[MR];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        const uint8_t *base = a->xp + (size_t)i * a->stride;
        xq[i] = (const int8_t *)base + a->kp;
        dx[i] = (const float *)(base + a->kq) + a->g0;
        xs[i] = dx[i] + a->groups;
        tot[i][0] = a->resume ? _mm512_loadu_ps(a->park + i * NB) : _mm512_setzero_ps();
        tot[i][1] = a->resume ? _mm512_loadu_ps(a->park + i * NB + 16) : _mm512_setzero_ps();
    }
    for (int64_t g = 0; g < a->gpp; g++) {
        __m512i s[MR][2];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) s[i][0] = s[i][1] = _mm512_setzero_si512();
        const uint8_t *wg = a->pw + g * a->qpg * 128;
        int64_t xo = g * a->qpg * 4;
        for (int64_t q = 0; q < a->qpg; q++) {
            __m512i w0 = _mm512_loadu_si512(wg + q * 128),
                    w1 = _mm512_loadu_si512(wg + q * 128 + 64);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                int32_t xv;
                memcpy(&xv, xq[i] + xo + q * 4, 4);
                __m512i xb = _mm512_set1_epi32(xv);
                s[i][0] = dpbusd(s[i][0], w0, xb);
                s[i][1] = dpbusd(s[i][1], w1, xb);
            }
        }
        __m512 sv0 = _mm512_loadu_ps(a->psc + g * NB), sv1 = _mm512_loadu_ps(a->psc + g * NB + 16);
        __m512 bv0 = _mm512_loadu_ps(a->pbi + g * NB), bv1 = _mm512_loadu_ps(a->pbi + g * NB + 16);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m512 d = _mm512_set1_ps(dx[i][g]), e = _mm512_set1_ps(xs[i][g]);
            tot[i][0] =
                _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s[i][0]), sv0), d, tot[i][0]);
            tot[i][1] =
                _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s[i][1]), sv1), d, tot[i][1]);
            tot[i][0] = _mm512_fmadd_ps(bv0, e, tot[i][0]);
            tot[i][1] = _mm512_fmadd_ps(bv1, e, tot[i][1]);
        }
    }
    if (a->y) {
        int c0 = a->nb < 16 ? a->nb : 16, c1 = a->nb > 16 ? a->nb - 16 : 0;
        __mmask16 m0 = (__mmask16)((1u << c0) - 1), m1 = (__mmask16)((1u << c1) - 1);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            _mm512_mask_storeu_ps(a->y + i * a->ldy, m0, tot[i][0]);
            _mm512_mask_storeu_ps(a->y + i * a->ldy + 16, m1, tot[i][1]);
        }
    } else {
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            _mm512_storeu_ps(a->park + i * NB, tot[i][0]);
            _mm512_storeu_ps(a->park + i * NB + 16, tot[i][1]);
        }
    }
}

#define Q8_TILE(R)                                                                                 \
    static void q8_tile_##R(const struct q8_tile_args *a)                                          \
    {                                                                                              \
        q8_tile(R, a);                                                                             \
    }
Q8_TILE(1)
Q8_TILE(2)
Q8_TILE(3)
Q8_TILE(4)
Q8_TILE(5)
Q8_TILE(6)
static void (*const q8_tiles[MR])(const struct q8_tile_args *) = {q8_tile_1, q8_tile_2, q8_tile_3,
                                                                  q8_tile_4, q8_tile_5, q8_tile_6};

void gemm_q8_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp, size_t stride,
                  int m, float *y, int64_t ldy)
{
    int64_t k = w->k, G = w->group, groups = k / G, kc = GEMM_KC, gmax = kc / G;
    uint8_t *pw = (uint8_t *)scratch_get(SCRATCH_GEMM_B, (size_t)(kc * NB / 4));
    float *ps = scratch_get(SCRATCH_GEMV, (size_t)(2 * NB * gmax));
    float *park = scratch_get(SCRATCH_GEMM_A, (size_t)m * NB);
    for (int64_t rb = r0; rb < r1; rb += NB) {
        int nb = (int)(r1 - rb < NB ? r1 - rb : NB);
        for (int64_t kp = 0; kp < k; kp += kc) {
            int64_t len = k - kp < kc ? k - kp : kc;
            pack(w, rb, nb, kp, len, pw, ps, gmax);
            int last = kp + len >= k;
            for (int i0 = 0; i0 < m; i0 += MR) {
                int mr = m - i0 < MR ? m - i0 : MR;
                struct q8_tile_args a = {pw,
                                         ps,
                                         ps + NB * gmax,
                                         len / G,
                                         G / 4,
                                         xp + (size_t)i0 * stride,
                                         stride,
                                         kp,
                                         kp / G,
                                         groups,
                                         xq_bytes(w),
                                         park + (size_t)i0 * NB,
                                         kp > 0,
                                         last ? y + i0 * ldy + rb : NULL,
                                         ldy,
                                         nb};
                q8_tiles[mr - 1](&a);
            }
        }
    }
}

#endif
