/*
 * The AVX-512 table (F/BW/VL/VNNI/BF16; compiled with those flags, used only when the CPU
 * has them). Its kernels compute every output with the AVX2 table's arithmetic, so the two
 * tables agree bit for bit and the paths they share (many-row tiles, formats without a
 * kernel here) keep each output's arithmetic independent of m:
 *   bf16, m <= 3  the AVX2 decode chains (8 lanes per output, 16-column steps, see
 *                 matmul_avx2.c), two weight rows' chains in each 512-bit register;
 *   affine 8-bit  vpdpwssd tiles for every m (affine8_avx512.c);
 *   affine 4-bit  vpdpbusd tiles over two 64-column chunks at once (affine4_avx512.c);
 *   the rest      the AVX2 kernels.
 */
#include <immintrin.h>

#include "kernels/cpu/affine4_tile.h"
#include "kernels/cpu/affine8.h"
#include "kernels/cpu/avx2.h"
#include "kernels/cpu/impl.h"
#include "kernels/cpu/quant.h"

/* Up to this many x rows run the bf16 decode kernel below (as the AVX2 table's SMALL_M). */
#define BF16_SMALL_M 3

/* 16 bf16 weights of step s of two rows as two vectors of 16 floats, each row's half as
 * the AVX2 kernel widens it: low 256 bits row a (columns 0-3, 8-11 in lo; 4-7, 12-15 in
 * hi), high 256 bits row b. */
ALWAYS_INLINE void wload2(const uint8_t *a, const uint8_t *b, int64_t s, __m512 *lo, __m512 *hi)
{
    __m512i v = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a + s * 32))),
        _mm256_loadu_si256((const __m256i *)(b + s * 32)), 1);
    __m512i z = _mm512_setzero_si512();
    *lo = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, v));
    *hi = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, v));
}

/* 8 floats at p in both halves of a vector */
ALWAYS_INLINE __m512 bcast8(const float *p)
{
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)p)));
}

/* MR x rows by NP pairs of weight rows (2 NP rows from w, ldw bytes apart), `steps` steps:
 * chains[i][2 p] and [i][2 p + 1] out, 8 floats each, row i 16 NP floats apart. */
ALWAYS_INLINE void bf16_pairs(const int MR, const int NP, const float *xk, int64_t ldx,
                              const uint8_t *w, size_t ldw, int64_t steps, float *chains)
{
    __m512 a[BF16_SMALL_M][2];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) a[i][p] = _mm512_setzero_ps();
    for (int64_t s = 0; s < steps; s++) {
        __m512 xl[BF16_SMALL_M], xh[BF16_SMALL_M];
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            xl[i] = bcast8(xk + i * ldx + s * 16);
            xh[i] = bcast8(xk + i * ldx + s * 16 + 8);
        }
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) {
            const uint8_t *wa = w + (size_t)(2 * p) * ldw, *wb = wa + ldw;
            /* Streams 1 KB ahead, one prefetch per cache line and row. */
            if (!(s & 1)) {
                _mm_prefetch((const char *)(wa + s * 32 + 1024), _MM_HINT_T0);
                _mm_prefetch((const char *)(wb + s * 32 + 1024), _MM_HINT_T0);
            }
            __m512 lo, hi;
            wload2(wa, wb, s, &lo, &hi);
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) {
                a[i][p] = _mm512_fmadd_ps(lo, xl[i], a[i][p]);
                a[i][p] = _mm512_fmadd_ps(hi, xh[i], a[i][p]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int p = 0; p < NP; p++) _mm512_storeu_ps(chains + i * 16 * NP + p * 16, a[i][p]);
}

/* One weight row alone: the AVX2 chain itself. */
ALWAYS_INLINE void bf16_one(const int MR, const float *xk, int64_t ldx, const uint8_t *w,
                            int64_t steps, float *chains)
{
    __m256 a[BF16_SMALL_M];
    const __m256i z = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) a[i] = _mm256_setzero_ps();
    for (int64_t s = 0; s < steps; s++) {
        if (!(s & 1)) _mm_prefetch((const char *)(w + s * 32 + 1024), _MM_HINT_T0);
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + s * 32));
        __m256 lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
        __m256 hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            a[i] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xk + i * ldx + s * 16), a[i]);
            a[i] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xk + i * ldx + s * 16 + 8), a[i]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) _mm256_storeu_ps(chains + i * 8, a[i]);
}

typedef void (*bf16_fn)(const float *xk, int64_t ldx, const uint8_t *w, size_t ldw, int64_t steps,
                        float *chains);
#define BP(MR, NP)                                                                                 \
    static void bp_##MR##_##NP(const float *xk, int64_t ldx, const uint8_t *w, size_t ldw,         \
                               int64_t steps, float *chains)                                       \
    {                                                                                              \
        if (NP)                                                                                    \
            bf16_pairs(MR, NP, xk, ldx, w, ldw, steps, chains);                                    \
        else                                                                                       \
            bf16_one(MR, xk, ldx, w, steps, chains);                                               \
    }
BP(1, 0)
BP(1, 1)
BP(1, 2)
BP(2, 0)
BP(2, 1)
BP(2, 2)
BP(3, 0)
BP(3, 1)
BP(3, 2)
/* [MR - 1][pairs: 0 for one row alone] */
static const bf16_fn bf16_tab[BF16_SMALL_M][3] = {
    {bp_1_0, bp_1_1, bp_1_2}, {bp_2_0, bp_2_1, bp_2_2}, {bp_3_0, bp_3_1, bp_3_2}};

/* Rows [r0, r1) of bf16 W against m <= BF16_SMALL_M rows: xk the permuted x (prep_avx2,
 * ldx floats a row), x the caller's (the k % 16 tail). */
static void bf16_small(const struct qweight *w, int64_t r0, int64_t r1, const float *xk,
                       int64_t ldx, const float *x, int m, float *y, int64_t ldy)
{
    int64_t k = w->k, k16 = k / 16 * 16;
    float chains[BF16_SMALL_M * 4 * 8];
    for (int64_t rb = r0; rb < r1;) {
        int nb = r1 - rb >= 4 ? 4 : r1 - rb >= 2 ? 2 : 1;
        const uint8_t *wr = w->w + (size_t)rb * w->row_bytes;
        bf16_tab[m - 1][nb / 2](xk, ldx, wr, w->row_bytes, k16 / 16, chains);
        for (int i = 0; i < m; i++)
            for (int j = 0; j < nb; j++) {
                float s = k16 ? hsum(_mm256_loadu_ps(chains + (i * nb + j) * 8)) : 0.0f;
                const uint16_t *wj = (const uint16_t *)(wr + (size_t)j * w->row_bytes);
                for (int64_t c = k16; c < k; c++) s += bf16_to_f32(wj[c]) * x[(size_t)i * k + c];
                y[i * ldy + rb + j] = s;
            }
        rb += nb;
    }
}

static size_t prep_bytes_avx512(const struct qweight *w)
{
    return affine4_int(w) ? affine4_prep_bytes(w, 1) : prep_bytes_avx2(w);
}

static void prep_avx512(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride)
{
    if (affine4_int(w))
        affine4_prep(w, x, m, xp, stride, 1);
    else
        prep_avx2(w, x, m, xp, stride);
}

static void matmul_avx512(const struct qweight *w, int64_t r0, int64_t r1, const float *x,
                          const uint8_t *xp, size_t stride, int m, float *y, int64_t ldy)
{
    if (affine4_int(w))
        affine4_matmul_tab(w, r0, r1, xp, stride, m, y, ldy, q4_tab_avx512, 1);
    else if (affine8_int(w))
        affine8_matmul(w, r0, r1, xp, stride, m, y, ldy, a8_tab_avx512);
    else if (w->fmt == WFMT_BF16 && m <= BF16_SMALL_M)
        bf16_small(w, r0, r1, (const float *)xp, (int64_t)(stride / sizeof(float)), x, m, y, ldy);
    else
        matmul_avx2(w, r0, r1, x, xp, stride, m, y, ldy);
}

static uint64_t read_sum_avx512(const void *p, size_t n)
{
    const __m512i *q = p;
    __m512i a = _mm512_setzero_si512(), b = a;
    size_t i = 0;
    for (; i + 2 <= n / 64; i += 2) {
        a = _mm512_xor_si512(a, _mm512_loadu_si512(q + i));
        b = _mm512_xor_si512(b, _mm512_loadu_si512(q + i + 1));
    }
    if (i < n / 64) a = _mm512_xor_si512(a, _mm512_loadu_si512(q + i));
    uint64_t t[8];
    _mm512_storeu_si512(t, _mm512_xor_si512(a, b));
    return t[0] ^ t[1] ^ t[2] ^ t[3] ^ t[4] ^ t[5] ^ t[6] ^ t[7];
}

const struct cpu_impl cpu_impl_avx512 = {
    .prep_bytes = prep_bytes_avx512,
    .prep = prep_avx512,
    .matmul = matmul_avx512,
    .dot = dot_avx2,
    .axpy = axpy_avx2,
    .read_sum = read_sum_avx512,
    .delta_step = delta_step_avx2,
    .conv_token = conv_token_avx2,
    .gemm = gemm_avx2,
    .ternary = ternary_matmul_avx512,
    .kvq_dot = kvq_dot_avx512,
    .kvq_axpy = kvq_axpy_avx512,
    .softmax = softmax_avx2,
};
