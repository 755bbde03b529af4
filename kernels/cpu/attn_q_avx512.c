/* The 512-bit rows of the KV attention (impl.h kvq_dot / kvq_axpy) for the layers that hold
 * plain values: float32 (auto) and bf16, 16 values a register. The other formats, and head
 * sizes that are not a multiple of 16, take the AVX2 rows.
 *
 * kvq_axpy runs the portable sequence per value (acc + w x, a multiply then an add, rows in
 * order), so it gives bitwise the portable sums. kvq_dot sums each 16 lanes in one register
 * over the head and then the lanes (a fixed tree), so it agrees with the portable ordered
 * sum to rounding: |difference| <= d 2^-23 sum |q_c x_c|. A query's operations do not depend
 * on how many share the call. */
#include <immintrin.h>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/impl.h"
#include "paged_kv/kv_quant.h"

/* Values c .. c + 15 of a row. */
ALWAYS_INLINE __m512 row16(const int dt, const uint8_t *row, int c)
{
    if (dt == KV_DTYPE_F32) return _mm512_loadu_ps((const float *)row + c);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* NQ queries (1, 2 or 4) against n rows. */
ALWAYS_INLINE void dots512(const int dt, const int NQ, const uint8_t *rows, size_t rb, int n, int d,
                           const float *q, size_t ldq, float *s, size_t lds)
{
    for (int i = 0; i < n; i++) {
        const uint8_t *row = rows + (size_t)i * rb;
        __m512 a[4];
        for (int j = 0; j < NQ; j++) a[j] = _mm512_setzero_ps();
        for (int c = 0; c < d; c += 16) {
            __m512 x = row16(dt, row, c);
            for (int j = 0; j < NQ; j++)
                a[j] = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * ldq + c), x, a[j]);
        }
        for (int j = 0; j < NQ; j++) s[j * lds + i] = _mm512_reduce_add_ps(a[j]);
    }
}

/* 16 columns of NQ queries' sums held in registers over all n rows. */
ALWAYS_INLINE void axpys512(const int dt, const int NQ, const uint8_t *rows, size_t rb, int n,
                            int d, float *acc, size_t lda, const float *w, size_t ldw)
{
    for (int c = 0; c < d; c += 16) {
        __m512 a[4];
        for (int j = 0; j < NQ; j++) a[j] = _mm512_loadu_ps(acc + j * lda + c);
        for (int i = 0; i < n; i++) {
            __m512 x = row16(dt, rows + (size_t)i * rb, c);
            for (int j = 0; j < NQ; j++)
                a[j] = _mm512_add_ps(a[j], _mm512_mul_ps(_mm512_set1_ps(w[j * ldw + i]), x));
        }
        for (int j = 0; j < NQ; j++) _mm512_storeu_ps(acc + j * lda + c, a[j]);
    }
}

void kvq_dot_avx512(int dt, const uint8_t *rows, size_t rb, int n, int d, const float *q,
                    size_t ldq, int nq, float *s, size_t lds)
{
    if (d % 16 || (dt != KV_DTYPE_F32 && dt != KV_DTYPE_BF16)) {
        kvq_dot_avx2(dt, rows, rb, n, d, q, ldq, nq, s, lds);
        return;
    }
    if (dt == KV_DTYPE_F32)
        KVQ_NQ(dots512, KV_DTYPE_F32, q, ldq, s, lds);
    else
        KVQ_NQ(dots512, KV_DTYPE_BF16, q, ldq, s, lds);
}

void kvq_axpy_avx512(int dt, const uint8_t *rows, size_t rb, int n, int d, float *acc, size_t lda,
                     int nq, const float *w, size_t ldw)
{
    if (d % 16 || (dt != KV_DTYPE_F32 && dt != KV_DTYPE_BF16)) {
        kvq_axpy_avx2(dt, rows, rb, n, d, acc, lda, nq, w, ldw);
        return;
    }
    if (dt == KV_DTYPE_F32)
        KVQ_NQ(axpys512, KV_DTYPE_F32, acc, lda, w, ldw);
    else
        KVQ_NQ(axpys512, KV_DTYPE_BF16, acc, lda, w, ldw);
}
