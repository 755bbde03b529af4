/*
 * bf16 weights against float32 activations with AVX2 + FMA (see gemm.h): each panel of 16
 * weight rows by up to BKC columns is widened to float32 once, as [column][16 rows], and
 * every x row of the product runs over it in register tiles of 6 x rows by 16 weight rows:
 * per column, one broadcast x value and 2 FMAs per x row. x is read as is (no rounding), so
 * output (i, r) is one FMA chain over the columns in order, then the panels in order: the
 * same arithmetic for any m, but not the m <= 8 kernels' arithmetic.
 * Cost: per column of 16 weight rows and 6 x rows, 2 loads, 6 broadcasts and 12 FMAs;
 * widening is amortized over every x row.
 */
#include "common/scratch.h"
#include "kernels/cpu/avx2.h"
#include "kernels/cpu/gemm.h"

#define NB  16  /* weight rows per panel: 2 vectors of 8 */
#define MR  6   /* x rows per tile */
#define BKC 256 /* columns per panel: 16 KB of float32 */

/* Rows [rb, rb + nb) of W, columns [kp, kp + len) (len a multiple of 8), widened into
 * pw [len][16] (rows past nb zero). */
static void pack(const struct qweight *w, int64_t rb, int nb, int64_t kp, int64_t len, float *pw)
{
    for (int v = 0; v < 2; v++)
        for (int64_t c = 0; c < len; c += 8) {
            __m256i r[8];
            for (int l = 0; l < 8; l++) {
                int j = v * 8 + l;
                r[l] =
                    j < nb
                        ? _mm256_castps_si256(load_bf16(
                              (const uint16_t *)(w->w + (size_t)(rb + j) * w->row_bytes) + kp + c))
                        : _mm256_setzero_si256();
            }
            transpose8x32(r); /* r[q]: column c + q of the 8 rows */
            for (int q = 0; q < 8; q++)
                _mm256_storeu_si256((__m256i *)(pw + (c + q) * NB + v * 8), r[q]);
        }
}

struct bf_tile_args {
    const float *pw;
    int64_t len;    /* columns in the panel */
    const float *x; /* the tile's first x row at the panel's first column */
    int64_t ldx;
    float *park; /* the tile's chains, 16 floats per x row */
    int resume;
    float *y; /* non-NULL on the last panel: the outputs, rows ldy apart */
    int64_t ldy;
    int nb;
};

ALWAYS_INLINE void store_n(float *p, __m256 v, int n)
{
    if (n >= 8) {
        _mm256_storeu_ps(p, v);
    } else if (n > 0) {
        float t[8];
        _mm256_storeu_ps(t, v);
        for (int j = 0; j < n; j++) p[j] = t[j];
    }
}

ALWAYS_INLINE void bf_tile(const int R, const struct bf_tile_args *a)
{
    __m256 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        acc[i][0] = a->resume ? _mm256_loadu_ps(a->park + i * NB) : _mm256_setzero_ps();
        acc[i][1] = a->resume ? _mm256_loadu_ps(a->park + i * NB + 8) : _mm256_setzero_ps();
    }
    for (int64_t c = 0; c < a->len; c++) {
        __m256 w0 = _mm256_loadu_ps(a->pw + c * NB), w1 = _mm256_loadu_ps(a->pw + c * NB + 8);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            __m256 xb = _mm256_broadcast_ss(a->x + i * a->ldx + c);
            acc[i][0] = _mm256_fmadd_ps(w0, xb, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(w1, xb, acc[i][1]);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        if (a->y) {
            store_n(a->y + i * a->ldy, acc[i][0], a->nb);
            store_n(a->y + i * a->ldy + 8, acc[i][1], a->nb - 8);
        } else {
            _mm256_storeu_ps(a->park + i * NB, acc[i][0]);
            _mm256_storeu_ps(a->park + i * NB + 8, acc[i][1]);
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
static void (*const bf_tiles[MR])(const struct bf_tile_args *) = {bf_tile_1, bf_tile_2, bf_tile_3,
                                                                  bf_tile_4, bf_tile_5, bf_tile_6};

void gemm_bf16_avx2_rows(const struct qweight *w, int64_t r0, int64_t r1, const float *x, int m,
                         float *y, int64_t ldy)
{
    int64_t k = w->k;
    float *pw = scratch_get(SCRATCH_GEMM_B, (size_t)(BKC * NB));
    float *park = scratch_get(SCRATCH_GEMM_A, (size_t)m * NB);
    for (int64_t rb = r0; rb < r1; rb += NB) {
        int nb = (int)(r1 - rb < NB ? r1 - rb : NB);
        for (int64_t kp = 0; kp < k; kp += BKC) {
            int64_t len = k - kp < BKC ? k - kp : BKC;
            pack(w, rb, nb, kp, len, pw);
            int last = kp + len >= k;
            for (int i0 = 0; i0 < m; i0 += MR) {
                int mr = m - i0 < MR ? m - i0 : MR;
                struct bf_tile_args a = {pw,
                                         len,
                                         x + (size_t)i0 * k + kp,
                                         k,
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
