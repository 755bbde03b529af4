/* The 512-bit rows of the KV attention (impl.h kvq_dot / kvq_axpy): every format, 16 values
 * a register, decoded there as the AVX2 rows decode them (attn_q_avx2.c): float32 (auto)
 * and bf16 widened; fp8 through IEEE halves (value / 256, the 256 put back through the sum
 * or the weight); int8, int4 widened and converted; tq codes indexing the codebook held in
 * one register (vpermps over 16 entries). Head sizes that are not a multiple of 16 take the
 * AVX2 rows.
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

#include <string.h>

/* The codebook (tq formats), held for a call. */
ALWAYS_INLINE __m512 cb_init(int dt)
{
    float cb[16] = {0};
    if (dt == KV_DTYPE_TQ4) memcpy(cb, kv_tq_codebook(4), sizeof(float) * 16);
    if (dt == KV_DTYPE_TQ3) memcpy(cb, kv_tq_codebook(3), sizeof(float) * 8);
    if (dt == KV_DTYPE_TQ2) memcpy(cb, kv_tq_codebook(2), sizeof(float) * 4);
    return _mm512_loadu_ps(cb);
}

ALWAYS_INLINE uint32_t load32_512(const uint8_t *p)
{
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
}

/* Values c .. c + 15 of a row (c a multiple of 16): fp8 divided by 256, int codes
 * unscaled, tq codebook entries. */
ALWAYS_INLINE __m512 row16(const int dt, __m512 cb, const uint8_t *row, int c)
{
    switch (dt) {
    case KV_DTYPE_F32:
        return _mm512_loadu_ps((const float *)row + c);
    case KV_DTYPE_BF16: {
        __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case KV_DTYPE_FP8: {
        __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(row + c)));
        __m256i mag = _mm256_and_si256(x, _mm256_set1_epi16(0x7f));
        __m256i h =
            _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8),
                            _mm256_slli_epi16(mag, 7));
        h = _mm256_andnot_si256(_mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f)), h);
        return _mm512_cvtph_ps(h);
    }
    case KV_DTYPE_INT8:
        return _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + c))));
    case KV_DTYPE_INT4:
    case KV_DTYPE_TQ4: {
        __m128i x = _mm_loadl_epi64((const __m128i *)(row + c / 2)), m = _mm_set1_epi8(15);
        x = _mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m));
        if (dt == KV_DTYPE_TQ4) return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(x), cb);
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_sub_epi8(x, _mm_set1_epi8(8))));
    }
    case KV_DTYPE_TQ3: {
        /* two groups of 8 codes in 3 bytes each; the second read from one byte before it so
         * that no read passes the row's end */
        const uint8_t *g = row + (size_t)c / 8 * 3;
        __m512i w = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_set1_epi32((int)(load32_512(g) & 0xffffffu))),
            _mm256_set1_epi32((int)(load32_512(g + 2) >> 8)), 1);
        const __m512i sh =
            _mm512_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21, 0, 3, 6, 9, 12, 15, 18, 21);
        return _mm512_permutexvar_ps(
            _mm512_and_si512(_mm512_srlv_epi32(w, sh), _mm512_set1_epi32(7)), cb);
    }
    default: { /* tq2: 16 codes in 4 bytes */
        const __m512i sh =
            _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        __m512i w = _mm512_set1_epi32((int)load32_512(row + c / 4));
        return _mm512_permutexvar_ps(
            _mm512_and_si512(_mm512_srlv_epi32(w, sh), _mm512_set1_epi32(3)), cb);
    }
    }
}

/* NQ queries (1, 2 or 4) against n rows. */
ALWAYS_INLINE void dots512(const int dt, const int NQ, const uint8_t *rows, size_t rb, int n, int d,
                           const float *q, size_t ldq, float *s, size_t lds)
{
    const __m512 cb = cb_init(dt);
    const float post = dt == KV_DTYPE_FP8 ? 256.0f : 1.0f;
    for (int i = 0; i < n; i++) {
        const uint8_t *row = rows + (size_t)i * rb;
        __m512 a[4];
        for (int j = 0; j < NQ; j++) a[j] = _mm512_setzero_ps();
        for (int c = 0; c < d; c += 16) {
            __m512 x = row16(dt, cb, row, c);
            for (int j = 0; j < NQ; j++)
                a[j] = _mm512_fmadd_ps(_mm512_loadu_ps(q + j * ldq + c), x, a[j]);
        }
        for (int j = 0; j < NQ; j++) s[j * lds + i] = _mm512_reduce_add_ps(a[j]) * post;
    }
}

/* 16 columns of NQ queries' sums held in registers over all n rows. */
ALWAYS_INLINE void axpys512(const int dt, const int NQ, const uint8_t *rows, size_t rb, int n,
                            int d, float *acc, size_t lda, const float *w, size_t ldw)
{
    const __m512 cb = cb_init(dt);
    const float post = dt == KV_DTYPE_FP8 ? 256.0f : 1.0f;
    for (int c = 0; c < d; c += 16) {
        __m512 a[4];
        for (int j = 0; j < NQ; j++) a[j] = _mm512_loadu_ps(acc + j * lda + c);
        for (int i = 0; i < n; i++) {
            __m512 x = row16(dt, cb, rows + (size_t)i * rb, c);
            for (int j = 0; j < NQ; j++)
                a[j] = _mm512_add_ps(a[j], _mm512_mul_ps(_mm512_set1_ps(w[j * ldw + i] * post), x));
        }
        for (int j = 0; j < NQ; j++) _mm512_storeu_ps(acc + j * lda + c, a[j]);
    }
}

/*
 * float32 rows (auto KV) of head size up to 128: per query, 16 keys at a time, each key one
 * chain of FMAs over its d/16 pieces into 16 lanes, then the 16 chains' lanes summed by one
 * transposing tree (four levels of shuffle and add) into one register of 16 scores. A key's
 * sum takes the same operations whatever keys share its 16 and whatever other queries the
 * call has; about twice the pace of a horizontal sum per key and query.
 */
static void dots512_f32(const uint8_t *rows, size_t rb, int n, int d, const float *q, size_t ldq,
                        int nq, float *s, size_t lds)
{
    /* the tree leaves key k in lane order[k] */
    const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
    const int nc = d / 16;
    for (int j = 0; j < nq; j++) {
        __m512 qc[8];
        for (int c = 0; c < nc; c++) qc[c] = _mm512_loadu_ps(q + j * ldq + 16 * c);
        for (int i0 = 0; i0 < n; i0 += 16) {
            const int nk = n - i0 < 16 ? n - i0 : 16;
            __m512 a[16];
#pragma GCC unroll 16
            for (int k = 0; k < 16; k++) {
                a[k] = _mm512_setzero_ps();
                if (k >= nk) continue;
                const float *x = (const float *)(rows + (size_t)(i0 + k) * rb);
#pragma GCC unroll 8
                for (int c = 0; c < nc; c++)
                    a[k] = _mm512_fmadd_ps(qc[c], _mm512_loadu_ps(x + 16 * c), a[k]);
            }
            __m512 b[8];
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++) /* 256-bit halves: keys k (low) and k + 8 (high) */
                b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a[k], a[k + 8], 0x44),
                                     _mm512_shuffle_f32x4(a[k], a[k + 8], 0xee));
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) /* 128-bit quarters */
                b[k] = _mm512_add_ps(_mm512_shuffle_f32x4(b[k], b[k + 4], 0x88),
                                     _mm512_shuffle_f32x4(b[k], b[k + 4], 0xdd));
#pragma GCC unroll 2
            for (int k = 0; k < 2; k++) /* pairs within quarters */
                b[k] = _mm512_add_ps(_mm512_shuffle_ps(b[k], b[k + 2], 0x44),
                                     _mm512_shuffle_ps(b[k], b[k + 2], 0xee));
            __m512 f = _mm512_add_ps(_mm512_shuffle_ps(b[0], b[1], 0x88),
                                     _mm512_shuffle_ps(b[0], b[1], 0xdd));
            _mm512_mask_storeu_ps(s + j * lds + i0, (__mmask16)((1u << nk) - 1),
                                  _mm512_permutexvar_ps(order, f));
        }
    }
}

void kvq_dot_avx512(int dt, const uint8_t *rows, size_t rb, int n, int d, const float *q,
                    size_t ldq, int nq, float *s, size_t lds)
{
    if (dt == KV_DTYPE_F32 && d % 16 == 0 && d <= 128) {
        dots512_f32(rows, rb, n, d, q, ldq, nq, s, lds);
        return;
    }
    if (d % 16) {
        kvq_dot_avx2(dt, rows, rb, n, d, q, ldq, nq, s, lds);
        return;
    }
    KVQ_CASES(dots512, q, ldq, s, lds)
}

void kvq_axpy_avx512(int dt, const uint8_t *rows, size_t rb, int n, int d, float *acc, size_t lda,
                     int nq, const float *w, size_t ldw)
{
    if (d % 16) {
        kvq_axpy_avx2(dt, rows, rb, n, d, acc, lda, nq, w, ldw);
        return;
    }
    KVQ_CASES(axpys512, acc, lda, w, ldw)
}
