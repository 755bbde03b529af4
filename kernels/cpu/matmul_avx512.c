/*
 * The AVX-512 table (F/BW/VL/VNNI/BF16; compiled with those flags, used only when the CPU
 * has them). Its kernels compute every output with the AVX2 table's arithmetic, so the two
 * tables agree bit for bit and the paths they share (many-row tiles, formats without a
 * kernel here) keep each output's arithmetic independent of m:
 *   affine 8-bit  vpdpwssd tiles for every m (affine8_avx512.c);
 *   affine 4-bit  vpdpbusd tiles over two 64-column chunks at once (affine4_avx512.c);
 *   the rest      the AVX2 kernels.
 */
#include <immintrin.h>

#include "kernels/cpu/affine4_tile.h"
#include "kernels/cpu/affine8.h"
#include "kernels/cpu/avx2.h"
#include "kernels/cpu/impl.h"

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
    .ternary = ternary_matmul_avx2,
};
