/* The AVX2 rows of the quantized KV attention (impl.h kvq_dot / kvq_axpy): each 16 codes of
 * a row are decoded into two registers of floats and used there; nothing is written back.
 *
 *   fp8   the e4m3 byte becomes an IEEE half with the same mantissa bits (sign << 8,
 *         exponent and mantissa << 7; e4m3 subnormals land on half subnormals), converted
 *         with vcvtph2ps: value / 256, the 256 put back through the weight or the sum (a
 *         power of two, so no rounding changes). The NaN codes read as 0, as the table.
 *   int8  widened and converted; int4 and tq4 split into nibbles in code order.
 *   tq    codes index the codebook held in a register (vpermps: 8 entries a register;
 *         tq4 picks one of two registers by the code's top bit).
 *
 * Each call takes the query heads of a GQA group that share the rows (4, then 2, then 1
 * at a time, each head in its own registers): a row is decoded once for all of them.
 *
 * kvq_axpy runs the portable sequence per value (acc + w * x, a multiply then an add,
 * rows in order), so it gives bitwise the portable sums. kvq_dot sums 16 lanes and then
 * the lanes (avx2.h's hsum), so it agrees with the portable ordered sum to rounding:
 * |difference| <= d 2^-23 sum |q_c x_c|. Head sizes that are not a multiple of 16 take
 * the portable rows. */
#include <string.h>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/impl.h"
#include "paged_kv/kv_quant.h"

/* Registers a row decoder needs, loaded once per call. */
struct kvq_dec {
    __m256 cb0, cb1; /* codebook entries 0-7 and 8-15 (tq) */
    __m256i shift;   /* per-lane shifts of the packed tq3 / tq2 codes */
};

ALWAYS_INLINE struct kvq_dec dec_init(int dt)
{
    struct kvq_dec k;
    k.cb0 = k.cb1 = _mm256_setzero_ps();
    k.shift = _mm256_setzero_si256();
    if (dt == KV_DTYPE_TQ4) {
        k.cb0 = _mm256_loadu_ps(kv_tq_codebook(4));
        k.cb1 = _mm256_loadu_ps(kv_tq_codebook(4) + 8);
    } else if (dt == KV_DTYPE_TQ3) {
        k.cb0 = _mm256_loadu_ps(kv_tq_codebook(3));
        k.shift = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
    } else if (dt == KV_DTYPE_TQ2) {
        const float *cb = kv_tq_codebook(2);
        k.cb0 = _mm256_setr_ps(cb[0], cb[1], cb[2], cb[3], cb[0], cb[1], cb[2], cb[3]);
        k.shift = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    }
    return k;
}

ALWAYS_INLINE __m256 fp8x8(const uint8_t *p)
{
    __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    __m128i mag = _mm_and_si128(x, _mm_set1_epi16(0x7f));
    __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x80)), 8),
                             _mm_slli_epi16(mag, 7));
    h = _mm_andnot_si128(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)), h);
    return _mm256_cvtph_ps(h);
}

/* 8 bytes of packed nibbles -> 16 bytes, one code each, in code order (low nibble first). */
ALWAYS_INLINE __m128i nibbles16(const uint8_t *p)
{
    __m128i x = _mm_loadl_epi64((const __m128i *)p), m = _mm_set1_epi8(15);
    return _mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m));
}

ALWAYS_INLINE __m256 tq4x8(const struct kvq_dec *k, __m128i codes8)
{
    __m256i i = _mm256_cvtepu8_epi32(codes8);
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(k->cb0, i),
                            _mm256_permutevar8x32_ps(k->cb1, i),
                            _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)));
}

ALWAYS_INLINE uint32_t load32(const uint8_t *p)
{
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
}

/* Values c .. c + 15 of a row (c a multiple of 16) into lo, hi: fp8 divided by 256, int
 * codes unscaled, tq codebook entries. */
ALWAYS_INLINE void dec16(const int dt, const struct kvq_dec *k, const uint8_t *row, int c,
                         __m256 *lo, __m256 *hi)
{
    switch (dt) {
    case KV_DTYPE_F32:
        *lo = _mm256_loadu_ps((const float *)row + c);
        *hi = _mm256_loadu_ps((const float *)row + c + 8);
        return;
    case KV_DTYPE_BF16:
        *lo = load_bf16((const uint16_t *)row + c);
        *hi = load_bf16((const uint16_t *)row + c + 8);
        return;
    case KV_DTYPE_FP8:
        *lo = fp8x8(row + c);
        *hi = fp8x8(row + c + 8);
        return;
    case KV_DTYPE_INT8: {
        __m128i x = _mm_loadu_si128((const __m128i *)(row + c));
        *lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
        *hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)));
        return;
    }
    case KV_DTYPE_INT4: {
        __m128i x = _mm_sub_epi8(nibbles16(row + c / 2), _mm_set1_epi8(8));
        *lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
        *hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)));
        return;
    }
    case KV_DTYPE_TQ4: {
        __m128i x = nibbles16(row + c / 2);
        *lo = tq4x8(k, x);
        *hi = tq4x8(k, _mm_srli_si128(x, 8));
        return;
    }
    case KV_DTYPE_TQ3: {
        /* groups of 8 codes in 3 bytes; the second group is read from one byte before it
         * so that no read passes the row's end */
        const uint8_t *g = row + (size_t)c / 8 * 3;
        __m256i w0 = _mm256_set1_epi32((int)(load32(g) & 0xffffffu));
        __m256i w1 = _mm256_set1_epi32((int)(load32(g + 2) >> 8));
        __m256i seven = _mm256_set1_epi32(7);
        *lo = _mm256_permutevar8x32_ps(k->cb0,
                                       _mm256_and_si256(_mm256_srlv_epi32(w0, k->shift), seven));
        *hi = _mm256_permutevar8x32_ps(k->cb0,
                                       _mm256_and_si256(_mm256_srlv_epi32(w1, k->shift), seven));
        return;
    }
    default: { /* tq2: 16 codes in 4 bytes */
        uint32_t w = load32(row + c / 4);
        __m256i three = _mm256_set1_epi32(3);
        *lo = _mm256_permutevar8x32_ps(
            k->cb0,
            _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w), k->shift), three));
        *hi = _mm256_permutevar8x32_ps(
            k->cb0, _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)(w >> 16)), k->shift),
                                     three));
        return;
    }
    }
}

/* NQ query heads (1, 2 or 4) against n rows: each 16 values decoded once for all of them;
 * head j's lanes are summed as with NQ = 1. */
ALWAYS_INLINE void dots(const int dt, const int NQ, const uint8_t *rows, size_t rb, int n, int d,
                        const float *q, size_t ldq, float *s, size_t lds)
{
    struct kvq_dec k = dec_init(dt);
    float post = dt == KV_DTYPE_FP8 ? 256.0f : 1.0f;
    for (int i = 0; i < n; i++) {
        const uint8_t *row = rows + (size_t)i * rb;
        __m256 a0[4], a1[4];
        for (int j = 0; j < NQ; j++) a0[j] = a1[j] = _mm256_setzero_ps();
        for (int c = 0; c < d; c += 16) {
            __m256 lo, hi;
            dec16(dt, &k, row, c, &lo, &hi);
            for (int j = 0; j < NQ; j++) {
                a0[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * ldq + c), lo, a0[j]);
                a1[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * ldq + c + 8), hi, a1[j]);
            }
        }
        for (int j = 0; j < NQ; j++) s[j * lds + i] = hsum(_mm256_add_ps(a0[j], a1[j])) * post;
    }
}

/* acc + w x as the portable kernel: a rounded product, then a rounded sum (no FMA). */
ALWAYS_INLINE __m256 madd(__m256 acc, __m256 w, __m256 x)
{
    return _mm256_add_ps(acc, _mm256_mul_ps(w, x));
}

/* 16 columns of NQ heads' sums held in registers over all n rows. */
ALWAYS_INLINE void axpys(const int dt, const int NQ, const uint8_t *rows, size_t rb, int n, int d,
                         float *acc, size_t lda, const float *w, size_t ldw)
{
    struct kvq_dec k = dec_init(dt);
    float post = dt == KV_DTYPE_FP8 ? 256.0f : 1.0f;
    for (int c = 0; c < d; c += 16) {
        __m256 a0[4], a1[4];
        for (int j = 0; j < NQ; j++) {
            a0[j] = _mm256_loadu_ps(acc + j * lda + c);
            a1[j] = _mm256_loadu_ps(acc + j * lda + c + 8);
        }
        for (int i = 0; i < n; i++) {
            __m256 x0, x1;
            dec16(dt, &k, rows + (size_t)i * rb, c, &x0, &x1);
            for (int j = 0; j < NQ; j++) {
                __m256 wv = _mm256_set1_ps(w[j * ldw + i] * post);
                a0[j] = madd(a0[j], wv, x0);
                a1[j] = madd(a1[j], wv, x1);
            }
        }
        for (int j = 0; j < NQ; j++) {
            _mm256_storeu_ps(acc + j * lda + c, a0[j]);
            _mm256_storeu_ps(acc + j * lda + c + 8, a1[j]);
        }
    }
}

/* e^x in 8 lanes for x <= 0: x = n ln 2 + r with n the nearest integer to x / ln 2 (ln 2 in
 * two parts), e^r by its degree-6 polynomial on [-ln 2 / 2, ln 2 / 2] (Cephes' expf
 * coefficients), times 2^n built in the exponent bits; x below -87.3 (where 2^n would be
 * under 2^-126) gives 0, NaN stays NaN. */
static inline __m256 exp8(__m256 x)
{
    const __m256 magic = _mm256_set1_ps(12582912.0f);     /* 1.5 * 2^23: rounds to an integer */
    __m256 xc = _mm256_max_ps(_mm256_set1_ps(-88.0f), x); /* NaN: x */
    __m256 n =
        _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), magic), magic);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_blendv_ps(y, _mm256_setzero_ps(),
                            _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ));
}

float softmax_avx2(float *s, int n, float m)
{
    const __m256 mv = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
        _mm256_storeu_ps(s + i, y);
        acc = _mm256_add_ps(acc, y);
    }
    if (i < n) { /* the last 1 to 7: the same lanes, the others neither read nor added */
        const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), idx);
        __m256 y = exp8(_mm256_sub_ps(_mm256_maskload_ps(s + i, mask), mv));
        y = _mm256_and_ps(y, _mm256_castsi256_ps(mask));
        _mm256_maskstore_ps(s + i, mask, y);
        acc = _mm256_add_ps(acc, y);
    }
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

void kvq_dot_avx2(int dt, const uint8_t *rows, size_t rb, int n, int d, const float *q, size_t ldq,
                  int nq, float *s, size_t lds)
{
    if (d % 16) {
        kvq_dot_portable(dt, rows, rb, n, d, q, ldq, nq, s, lds);
        return;
    }
    KVQ_CASES(dots, q, ldq, s, lds)
}

void kvq_axpy_avx2(int dt, const uint8_t *rows, size_t rb, int n, int d, float *acc, size_t lda,
                   int nq, const float *w, size_t ldw)
{
    if (d % 16) {
        kvq_axpy_portable(dt, rows, rb, n, d, acc, lda, nq, w, ldw);
        return;
    }
    KVQ_CASES(axpys, acc, lda, w, ldw)
}
