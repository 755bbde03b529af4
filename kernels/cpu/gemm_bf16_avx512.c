/*
 * bf16 weights against bf16-rounded activations with AVX-512 BF16 (see gemm.h): each
 * vdpbf16ps adds, for 16 weight rows, the products of one column pair with one x row's
 * pair (the x pair broadcast). A prepared x row is its k values rounded to bf16 (round to
 * nearest even), padded to 64 bytes. Cost: per 2 columns of 32 weight rows and one x row,
 * 2 vdpbf16ps; the panel's repacking is amortized over every x row.
 */
#if defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#include <string.h>

#include "common/scratch.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_avx512.h"

#define NB 32  /* weight rows per panel: 2 vectors of 16 */
#define MR 8   /* x rows per tile */
#define KC 256 /* columns per panel: 16 KB of weights */

size_t gemm_bf16_prep_bytes(const struct qweight *w)
{
    return (size_t)(w->k + 31) / 32 * 64;
}

void gemm_bf16_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride)
{
    int64_t k = w->k;
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * k;
        uint8_t *d = xp + (size_t)i * stride;
        for (int64_t j = 0; j < k; j += 32) {
            __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(xi + j + 16), _mm512_loadu_ps(xi + j));
            _mm512_storeu_si512(d + j * 2, (__m512i)v);
        }
    }
}

/* Rows [rb, rb + nb) of W, columns [kp, kp + len), into pw [len / 2][2][16 rows] of 2 bf16
 * values (rows past nb zero). */
static void pack(const struct qweight *w, int64_t rb, int nb, int64_t kp, int64_t len, uint8_t *pw)
{
    for (int v = 0; v < 2; v++)
        for (int64_t c = 0; c < len / 32; c++) {
            __m512i r[16];
            for (int l = 0; l < 16; l++) {
                int j = v * 16 + l;
                r[l] = j < nb ? _mm512_loadu_si512(w->w + (size_t)(rb + j) * w->row_bytes +
                                                   (size_t)(kp + c * 32) * 2)
                              : _mm512_setzero_si512();
            }
            gemm_transpose16(r);
            for (int t = 0; t < 16; t++)
                _mm512_storeu_si512(pw + ((c * 16 + t) * 2 + v) * 64, r[t]);
        }
}

struct bf_tile_args {
    const uint8_t *pw;
    int64_t pairs;     /* column pairs in the panel */
    const uint8_t *xp; /* the tile's first x row at the panel's first column */
    size_t stride;
    float *park; /* the tile's chains, NB floats per x row */
    int resume;
    float *y; /* non-NULL on the last panel: the outputs, rows ldy apart */
    int64_t ldy;
    int nb;
};

ALWAYS_INLINE void bf_tile(const int R, const struct bf_tile_args *a)
{
    __m512 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        acc[i][0] = a->resume ? _mm512_loadu_ps(a->park + i * NB) : _mm512_setzero_ps();
        acc[i][1] = a->resume ? _mm512_loadu_ps(a->park + i * NB + 16) : _mm512_setzero_ps();
    }
    for (int64_t q = 0; q < a->pairs; q++) {
        __m512bh w0 = (__m512bh)_mm512_loadu_si512(a->pw + q * 128);
        __m512bh w1 = (__m512bh)_mm512_loadu_si512(a->pw + q * 128 + 64);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            int32_t xv;
            memcpy(&xv, a->xp + (size_t)i * a->stride + q * 4, 4);
            __m512bh xb = (__m512bh)_mm512_set1_epi32(xv);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], w0, xb);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], w1, xb);
        }
    }
    if (a->y) {
        int c0 = a->nb < 16 ? a->nb : 16, c1 = a->nb > 16 ? a->nb - 16 : 0;
        __mmask16 m0 = (__mmask16)((1u << c0) - 1), m1 = (__mmask16)((1u << c1) - 1);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            _mm512_mask_storeu_ps(a->y + i * a->ldy, m0, acc[i][0]);
            _mm512_mask_storeu_ps(a->y + i * a->ldy + 16, m1, acc[i][1]);
        }
    } else {
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            _mm512_storeu_ps(a->park + i * NB, acc[i][0]);
            _mm512_storeu_ps(a->park + i * NB + 16, acc[i][1]);
        }
    }
}

#define BF_TILE(R)                                                                                 \
    static void bf_tile_##R(const struct bf_tile_args *a)                                          \
    {                                                                                              \
        bf_tile(R, a);                                                                             \
    }
BF_TILE(1)
BF_TILE(2)
BF_TILE(3)
BF_TILE(4)
BF_TILE(5)
BF_TILE(6)
BF_TILE(7)
BF_TILE(8)
static void (*const bf_tiles[MR])(const struct bf_tile_args *) = {
    bf_tile_1, bf_tile_2, bf_tile_3, bf_tile_4, bf_tile_5, bf_tile_6, bf_tile_7, bf_tile_8};

void gemm_bf16_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                    size_t stride, int m, float *y, int64_t ldy)
{
    int64_t k = w->k;
    uint8_t *pw = (uint8_t *)scratch_get(SCRATCH_GEMM_B, (size_t)(KC * NB * 2 / 4));
    float *park = scratch_get(SCRATCH_GEMM_A, (size_t)m * NB);
    for (int64_t rb = r0; rb < r1; rb += NB) {
        int nb = (int)(r1 - rb < NB ? r1 - rb : NB);
        for (int64_t kp = 0; kp < k; kp += KC) {
            int64_t len = k - kp < KC ? k - kp : KC;
            pack(w, rb, nb, kp, len, pw);
            int last = kp + len >= k;
            for (int i0 = 0; i0 < m; i0 += MR) {
                int mr = m - i0 < MR ? m - i0 : MR;
                struct bf_tile_args a = {pw,
                                         len / 2,
                                         xp + (size_t)i0 * stride + (size_t)kp * 2,
                                         stride,
                                         park + (size_t)i0 * NB,
                                         kp > 0,
                                         last ? y + i0 * ldy + rb : NULL,
                                         ldy,
                                         nb};
                bf_tiles[mr - 1](&a);
            }
        }
    }
}

#endif
