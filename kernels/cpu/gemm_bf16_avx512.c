/*
 * bf16 weights against float32 activations, products of 9 or more rows on the `avx512`
 * table (see gemm.h), the weights read in place: each output (x row i, weight row r) is one
 * 16-lane chain of vfmadd231ps, 32 columns a step in column order (the step's even columns,
 * then its odd ones), then the sum of its 16 lanes. A bf16 pair widens to float32 in two
 * instructions (a shift for the even value, a mask for the odd one), so the x row is laid
 * out once per call as each 32 columns' 16 even then 16 odd values. A tile of 4 weight rows
 * by 4 x rows widens 4 weight vectors for 32 FMAs.
 *
 * Measured on a Xeon with AVX-512 BF16 (bench matmul, 8192 x 2048, 2 threads): vdpbf16ps
 * runs at half the pace of vfmadd231ps there (123 against 246 GFLOP/s a core in a loop of
 * independent instructions), so this kernel reaches 281 GFLOP/s at 16 rows and 297 at 512,
 * where vdpbf16ps over repacked panels reached 162 and 202 (the repacking, a 16 x 16 word
 * transpose per 32 columns and 16 rows, was a third of a 16-row product).
 */
#if defined(__AVX512BF16__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#include "kernels/cpu/gemm.h"

size_t gemm_bf16_prep_bytes(const struct qweight *w)
{
    return (size_t)w->k * sizeof(float);
}

void gemm_bf16_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride)
{
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd =
        _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    int64_t k = w->k;
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * k;
        float *d = (float *)(xp + (size_t)i * stride);
        for (int64_t j = 0; j < k; j += 32) {
            __m512 a = _mm512_loadu_ps(xi + j), b = _mm512_loadu_ps(xi + j + 16);
            _mm512_storeu_ps(d + j, _mm512_permutex2var_ps(a, even, b));
            _mm512_storeu_ps(d + j + 16, _mm512_permutex2var_ps(a, odd, b));
        }
    }
}

/* The tile: TW weight rows by TX x rows, one 16-lane chain per output. */
#define TW 4
#define TX 4
/* x rows a pass takes: their rows (64 x 8 KB at k = 2048) stay in L2 while every weight
 * row of the thread's share goes by once. */
#define XB 64

/*
 * Outputs (i, r) for weight rows w[0 .. TW) and prepared x rows x[0 .. TX) over k columns:
 * per 32 columns, the weights' even and odd columns widened to float32 (a shift, a mask),
 * then two FMAs per output into its chain; then the chain's 16 lanes summed. Stores the
 * first nw x nx outputs; rows past nw and nx are the callers' repeats of the last valid
 * one: computed, not stored.
 */
static void bf_dot(const uint16_t *const w[TW], const float *const x[TX], int64_t k, float *y,
                   int64_t ldy, int nw, int nx)
{
    const __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 acc[TW][TX];
#pragma GCC unroll 8
    for (int r = 0; r < TW; r++)
#pragma GCC unroll 8
        for (int i = 0; i < TX; i++) acc[r][i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < k; c += 32) {
        __m512 we[TW], wo[TW];
#pragma GCC unroll 8
        for (int r = 0; r < TW; r++) {
            /* Streams the weight rows 1 KB ahead, one prefetch per cache line. */
            _mm_prefetch((const char *)(w[r] + c + 512), _MM_HINT_T0);
            __m512i v = _mm512_loadu_si512(w[r] + c);
            we[r] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            wo[r] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
        }
#pragma GCC unroll 8
        for (int i = 0; i < TX; i++) {
            __m512 xe = _mm512_loadu_ps(x[i] + c), xo = _mm512_loadu_ps(x[i] + c + 16);
#pragma GCC unroll 8
            for (int r = 0; r < TW; r++)
                acc[r][i] = _mm512_fmadd_ps(wo[r], xo, _mm512_fmadd_ps(we[r], xe, acc[r][i]));
        }
    }
    for (int i = 0; i < nx; i++)
        for (int r = 0; r < nw; r++) y[i * ldy + r] = _mm512_reduce_add_ps(acc[r][i]);
}

void gemm_bf16_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                    size_t stride, int m, float *y, int64_t ldy)
{
    const int64_t k = w->k, ldw = (int64_t)w->row_bytes / 2;
    const uint16_t *w0 = (const uint16_t *)w->w;
    for (int i0 = 0; i0 < m; i0 += XB) {
        int i1 = m - i0 < XB ? m : i0 + XB;
        for (int64_t rb = r0; rb < r1; rb += TW) {
            int nw = (int)(r1 - rb < TW ? r1 - rb : TW);
            const uint16_t *wr[TW];
            for (int r = 0; r < TW; r++) wr[r] = w0 + (rb + (r < nw ? r : nw - 1)) * ldw;
            for (int i = i0; i < i1; i += TX) {
                int nx = i1 - i < TX ? i1 - i : TX;
                const float *xr[TX];
                for (int j = 0; j < TX; j++)
                    xr[j] = (const float *)(xp + (size_t)(i + (j < nx ? j : nx - 1)) * stride);
                bf_dot(wr, xr, k, y + (size_t)i * ldy + rb, ldy, nw, nx);
            }
        }
    }
}

#endif
