/* AVX2 + FMA kernels (compiled with -mavx2 -mfma -mf16c, used only when the CPU has them). */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/scratch.h"
#include "common/util.h"
#include "kernels/cpu/impl.h"
#include "kernels/cpu/quant.h"

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 bf16 -> 8 float: widen to 32 bits and shift into the high half. */
static inline __m256 load_bf16(const uint16_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

static inline __m256 load_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static float dot_avx2(const float *a, const float *b, int n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_avx2(float *y, float a, const float *x, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---- row decoding: columns [k0, k0+len) of a row as floats ---- */

ALWAYS_INLINE __m256 load8(enum wfmt f, const uint8_t *row, int64_t j)
{
    switch (f) {
    case WFMT_BF16:
        return load_bf16((const uint16_t *)row + j);
    case WFMT_F16:
        return load_f16((const uint16_t *)row + j);
    default:
        return _mm256_loadu_ps((const float *)row + j);
    }
}

ALWAYS_INLINE float load1(enum wfmt f, const uint8_t *row, int64_t j)
{
    switch (f) {
    case WFMT_BF16:
        return bf16_to_f32(((const uint16_t *)row)[j]);
    case WFMT_F16:
        return f16_to_f32(((const uint16_t *)row)[j]);
    default:
        return ((const float *)row)[j];
    }
}

/* Affine 4- and 8-bit groups decoded with SIMD; every other format through the portable
 * decoder. dst gets len floats. */
static void decode_row(const struct qweight *w, int64_t r, int64_t k0, int64_t len, float *dst)
{
    const uint8_t *row = w->w + (size_t)r * w->row_bytes;
    if (w->fmt == WFMT_BF16 || w->fmt == WFMT_F16 || w->fmt == WFMT_F32) {
        int64_t j = 0;
        for (; j + 8 <= len; j += 8) _mm256_storeu_ps(dst + j, load8(w->fmt, row, k0 + j));
        for (; j < len; j++) dst[j] = load1(w->fmt, row, k0 + j);
        return;
    }
    if (w->fmt == WFMT_AFFINE && (w->bits == 4 || w->bits == 8)) {
        int64_t groups = w->k / w->group;
        const __m128i m4 = _mm_set1_epi8(0x0f);
        for (int64_t g0 = k0; g0 < k0 + len; g0 += w->group) {
            int64_t g = g0 / w->group;
            __m256 s = _mm256_set1_ps(quant_load_scale(w->scales, w->sdtype, r * groups + g));
            __m256 b = _mm256_set1_ps(quant_load_scale(w->biases, w->sdtype, r * groups + g));
            float *d = dst + (g0 - k0);
            if (w->bits == 8) {
                for (int j = 0; j < w->group; j += 8) {
                    __m128i q = _mm_loadl_epi64((const __m128i *)(row + g0 + j));
                    __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
                    _mm256_storeu_ps(d + j, _mm256_fmadd_ps(v, s, b));
                }
            } else {
                for (int j = 0; j < w->group; j += 16) {
                    /* 8 bytes = 16 nibbles, low nibble first: interleave lo/hi into order. */
                    __m128i q = _mm_loadl_epi64((const __m128i *)(row + (g0 + j) / 2));
                    __m128i lo = _mm_and_si128(q, m4);
                    __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
                    __m128i inter = _mm_unpacklo_epi8(lo, hi);
                    __m256 v0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(inter));
                    __m256 v1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(inter, 8)));
                    _mm256_storeu_ps(d + j, _mm256_fmadd_ps(v0, s, b));
                    _mm256_storeu_ps(d + j + 8, _mm256_fmadd_ps(v1, s, b));
                }
            }
        }
        return;
    }
    quant_dequant_row(w, r, k0, len, dst);
}

/* ---- gemv ---- */

/* Float-like rows (bf16, f16, f32): streamed once; 4 accumulators hide FMA latency at m = 1,
 * and up to 4 x rows share each loaded weight vector at m > 1. */
ALWAYS_INLINE void gemv_float_body(enum wfmt f, const struct qweight *w, int64_t r0, int64_t r1,
                                   const float *x, int m, float *y, int64_t ldy)
{
    int64_t k = w->k, k32 = k / 32 * 32, k8 = k / 8 * 8;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *wr = w->w + (size_t)r * w->row_bytes;
        if (m == 1) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            int64_t j = 0;
            for (; j < k32; j += 32) {
                _mm_prefetch((const char *)wr + (j + 32) * (f == WFMT_F32 ? 4 : 2) + 1024,
                             _MM_HINT_T0);
                if (f == WFMT_F32)
                    _mm_prefetch((const char *)wr + (j + 16) * 4 + 1024, _MM_HINT_T0);
                a0 = _mm256_fmadd_ps(load8(f, wr, j), _mm256_loadu_ps(x + j), a0);
                a1 = _mm256_fmadd_ps(load8(f, wr, j + 8), _mm256_loadu_ps(x + j + 8), a1);
                a2 = _mm256_fmadd_ps(load8(f, wr, j + 16), _mm256_loadu_ps(x + j + 16), a2);
                a3 = _mm256_fmadd_ps(load8(f, wr, j + 24), _mm256_loadu_ps(x + j + 24), a3);
            }
            for (; j < k8; j += 8)
                a0 = _mm256_fmadd_ps(load8(f, wr, j), _mm256_loadu_ps(x + j), a0);
            float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            for (; j < k; j++) s += load1(f, wr, j) * x[j];
            y[r] = s;
            continue;
        }
        for (int i0 = 0; i0 < m; i0 += 4) {
            int mi = m - i0 < 4 ? m - i0 : 4;
            const float *x0 = x + (size_t)i0 * k;
            __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                             _mm256_setzero_ps()};
            int64_t j = 0;
            for (; j < k8; j += 8) {
                __m256 wv = load8(f, wr, j);
                for (int i = 0; i < mi; i++)
                    acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x0 + i * k + j), acc[i]);
            }
            for (int i = 0; i < mi; i++) {
                float s = hsum(acc[i]);
                for (int64_t jj = j; jj < k; jj++) s += load1(f, wr, jj) * x0[i * k + jj];
                y[(i0 + i) * ldy + r] = s;
            }
        }
    }
}

static float *scratch(size_t n)
{
    return scratch_get(SCRATCH_GEMV, n);
}

/* Affine 4-bit, one x row: sum_g (s_g * sum_j q_j x_j + b_g * sum_j x_j). Within each 32
 * values the 16 bytes hold even elements in low nibbles and odd ones in high nibbles, so x
 * is first reordered (evens then odds per 32) to meet them without shuffles. */
static void gemv_affine4_m1(const struct qweight *w, int64_t r0, int64_t r1, const float *x,
                            float *y)
{
    int64_t k = w->k, groups = k / w->group;
    float *xp = scratch((size_t)k + (size_t)groups);
    float *xs = xp + k;
    for (int64_t b = 0; b < k; b += 32)
        for (int j = 0; j < 16; j++) {
            xp[b + j] = x[b + 2 * j];
            xp[b + 16 + j] = x[b + 2 * j + 1];
        }
    for (int64_t g = 0; g < groups; g++) {
        float s = 0;
        for (int j = 0; j < w->group; j++) s += x[g * w->group + j];
        xs[g] = s;
    }
    const __m128i m4 = _mm_set1_epi8(0x0f);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w->w + (size_t)r * w->row_bytes;
        __m256 tot = _mm256_setzero_ps();
        float bias_sum = 0;
        for (int64_t g = 0; g < groups; g++) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            for (int64_t j = g * w->group; j < (g + 1) * w->group; j += 32) {
                __m128i q = _mm_loadu_si128((const __m128i *)(row + j / 2));
                __m128i lo = _mm_and_si128(q, m4);
                __m128i hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
                const float *xj = xp + j;
                a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
                                     _mm256_loadu_ps(xj), a0);
                a1 =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))),
                                    _mm256_loadu_ps(xj + 8), a1);
                a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
                                     _mm256_loadu_ps(xj + 16), a0);
                a1 =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))),
                                    _mm256_loadu_ps(xj + 24), a1);
            }
            float sc = quant_load_scale(w->scales, w->sdtype, r * groups + g);
            bias_sum += quant_load_scale(w->biases, w->sdtype, r * groups + g) * xs[g];
            tot = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(sc), tot);
        }
        y[r] = hsum(tot) + bias_sum;
    }
}

/* One weight group of the integer 4-bit kernel: cpg chunks of 64 values (32 bytes). */
ALWAYS_INLINE __m256 affine4_group(const uint8_t *row, const int8_t *xq, int64_t g, int cpg,
                                   const float *ssx, __m256 tot)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256i ah = _mm256_setzero_si256(), al = ah;
    for (int64_t c = g * cpg; c < (g + 1) * cpg; c++) {
        /* Streams 1 KB ahead: the prefetcher alone leaves the loads waiting. */
        _mm_prefetch((const char *)(row + c * 32 + 1024), _MM_HINT_T0);
        __m256i v = _mm256_loadu_si256((const __m256i *)(row + c * 32));
        __m256i lo = _mm256_and_si256(v, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        const __m256i *b = (const __m256i *)(xq + c * 128);
        __m256i ph = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(b)),
                                      _mm256_maddubs_epi16(hi, _mm256_loadu_si256(b + 1)));
        __m256i pl = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(b + 2)),
                                      _mm256_maddubs_epi16(hi, _mm256_loadu_si256(b + 3)));
        ah = _mm256_add_epi32(ah, _mm256_madd_epi16(ph, ones));
        al = _mm256_add_epi32(al, _mm256_madd_epi16(pl, ones));
    }
    __m256i comb = _mm256_add_epi32(_mm256_slli_epi32(ah, 8), al);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(comb), _mm256_broadcast_ss(ssx + g), tot);
}

/* Per-row prologue of the integer kernel, vectorized for bf16: the combined scales
 * ssx[g] = s_g * sx_g, and the returned bias term sum_g b_g * xsum_g. */
static float affine_row_prologue(const struct qweight *w, int64_t r, const float *xs,
                                 const float *xsc, float *ssx)
{
    int64_t groups = w->k / w->group, g = 0;
    float bias_sum = 0;
    if (w->sdtype == ST_BF16) {
        const uint16_t *sr = (const uint16_t *)w->scales + r * groups;
        const uint16_t *br = (const uint16_t *)w->biases + r * groups;
        __m256 bacc = _mm256_setzero_ps();
        for (; g + 8 <= groups; g += 8) {
            _mm256_storeu_ps(ssx + g, _mm256_mul_ps(load_bf16(sr + g), _mm256_loadu_ps(xsc + g)));
            bacc = _mm256_fmadd_ps(load_bf16(br + g), _mm256_loadu_ps(xs + g), bacc);
        }
        bias_sum = hsum(bacc);
    }
    for (; g < groups; g++) {
        ssx[g] = quant_load_scale(w->scales, w->sdtype, r * groups + g) * xsc[g];
        bias_sum += quant_load_scale(w->biases, w->sdtype, r * groups + g) * xs[g];
    }
    return bias_sum;
}

/*
 * Affine 4-bit, one x row, groups of 64 or more: integer dot products. x is split per
 * weight group into a 16-bit fixed-point value held as two int8 halves (x ~ sx * (256 hi +
 * lo), |error| <= sx / 2 with sx = max|x| / 32639, about 1.5e-5 of the group's largest
 * input), so vpmaddubsw multiplies 32 nibbles by 32 inputs per instruction. That is 2.5x
 * fewer instructions than converting nibbles to float, which decides the speed of
 * memory-bound decode. Each 64 values (32 bytes) hold even elements in low nibbles and odd
 * ones in high nibbles per 32-value block; the x halves are laid out to match.
 */
static void gemv_affine4_int(const struct qweight *w, int64_t r0, int64_t r1, const float *x,
                             float *y)
{
    int64_t k = w->k, groups = k / w->group, chunks = k / 64;
    /* scratch: [chunks][4][32] int8 halves, then groups sums of x and groups scales */
    float *sp = scratch((size_t)chunks * 32 + 2 * (size_t)groups);
    int8_t *xq = (int8_t *)sp;
    float *xs = sp + chunks * 32, *xsc = xs + groups;
    for (int64_t g = 0; g < groups; g++) {
        const float *xg = x + g * w->group;
        float mx = 0, sum = 0;
        for (int j = 0; j < w->group; j++) {
            float a = xg[j] < 0 ? -xg[j] : xg[j];
            if (a > mx) mx = a;
            sum += xg[j];
        }
        xs[g] = sum;
        float sx = mx > 0 ? mx / 32639.0f : 1.0f, inv = 1.0f / sx;
        xsc[g] = sx;
        /* element e of chunk c: evens at c*128 + e/2, odds at c*128 + 32 + e/2 (hi halves),
         * the lo halves 64 bytes further */
        for (int j = 0; j < w->group; j++) {
            uint64_t e = (uint64_t)(g * w->group + j), in = e & 63;
            int8_t *slot = xq + (e >> 6) * 128 + (in & 1) * 32 + (in >> 1);
            float t = xg[j] * inv;
            float h = rintf(t * (1.0f / 256.0f));
            h = h > 127.0f ? 127.0f : h < -127.0f ? -127.0f : h;
            float l = rintf(t - 256.0f * h);
            l = l > 127.0f ? 127.0f : l < -128.0f ? -128.0f : l;
            slot[0] = (int8_t)h;
            slot[64] = (int8_t)l;
        }
    }
    float *ssx = scratch_get(SCRATCH_GEMM_B, (size_t)groups); /* unused during a gemv */
    int cpg = w->group / 64;
    for (int64_t r = r0; r < r1; r++) {
        float bias_sum = affine_row_prologue(w, r, xs, xsc, ssx);
        const uint8_t *row = w->w + (size_t)r * w->row_bytes;
        __m256 tot = _mm256_setzero_ps();
        /* constant trip counts for the common group sizes let the chunk loop unroll */
        if (cpg == 1)
            for (int64_t g = 0; g < groups; g++) tot = affine4_group(row, xq, g, 1, ssx, tot);
        else if (cpg == 2)
            for (int64_t g = 0; g < groups; g++) tot = affine4_group(row, xq, g, 2, ssx, tot);
        else
            for (int64_t g = 0; g < groups; g++) tot = affine4_group(row, xq, g, cpg, ssx, tot);
        y[r] = hsum(tot) + bias_sum;
    }
}

static void gemv_affine8_m1(const struct qweight *w, int64_t r0, int64_t r1, const float *x,
                            float *y)
{
    int64_t k = w->k, groups = k / w->group;
    float *xs = scratch((size_t)groups);
    for (int64_t g = 0; g < groups; g++) {
        float s = 0;
        for (int j = 0; j < w->group; j++) s += x[g * w->group + j];
        xs[g] = s;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w->w + (size_t)r * w->row_bytes;
        __m256 tot = _mm256_setzero_ps();
        float bias_sum = 0;
        for (int64_t g = 0; g < groups; g++) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            for (int64_t j = g * w->group; j < (g + 1) * w->group; j += 16) {
                if ((j & 63) == 0) _mm_prefetch((const char *)(row + j + 1024), _MM_HINT_T0);
                __m128i q = _mm_loadu_si128((const __m128i *)(row + j));
                a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)),
                                     _mm256_loadu_ps(x + j), a0);
                a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8))),
                                     _mm256_loadu_ps(x + j + 8), a1);
            }
            float sc = quant_load_scale(w->scales, w->sdtype, r * groups + g);
            bias_sum += quant_load_scale(w->biases, w->sdtype, r * groups + g) * xs[g];
            tot = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), _mm256_set1_ps(sc), tot);
        }
        y[r] = hsum(tot) + bias_sum;
    }
}

static void gemv_avx2(const struct qweight *w, int64_t r0, int64_t r1, const float *x, int m,
                      float *y, int64_t ldy)
{
    switch (w->fmt) {
    case WFMT_BF16:
        gemv_float_body(WFMT_BF16, w, r0, r1, x, m, y, ldy);
        return;
    case WFMT_F16:
        gemv_float_body(WFMT_F16, w, r0, r1, x, m, y, ldy);
        return;
    case WFMT_F32:
        gemv_float_body(WFMT_F32, w, r0, r1, x, m, y, ldy);
        return;
    default:
        break;
    }
    if (m == 1 && w->fmt == WFMT_AFFINE && w->bits == 4 && w->group % 64 == 0) {
        gemv_affine4_int(w, r0, r1, x, y);
        return;
    }
    if (m == 1 && w->fmt == WFMT_AFFINE && w->bits == 4) {
        gemv_affine4_m1(w, r0, r1, x, y);
        return;
    }
    if (m == 1 && w->fmt == WFMT_AFFINE && w->bits == 8) {
        gemv_affine8_m1(w, r0, r1, x, y);
        return;
    }
    /* Other formats, or several x rows: decode the row once, then dot it with each x row. */
    float *buf = scratch((size_t)w->k);
    for (int64_t r = r0; r < r1; r++) {
        decode_row(w, r, 0, w->k, buf);
        for (int i = 0; i < m; i++) y[i * ldy + r] = dot_avx2(buf, x + (size_t)i * w->k, (int)w->k);
    }
}

/* ---- GEMM pieces ---- */

static void pack_b_avx2(const struct qweight *w, int64_t r0, int nr, int64_t k0, int kc, float *dst)
{
    float rows[GEMM_NR][GEMM_KC];
    for (int r = 0; r < nr; r++) decode_row(w, r0 + r, k0, kc, rows[r]);
    for (int r = nr; r < GEMM_NR; r++) memset(rows[r], 0, sizeof(float) * (size_t)kc);
    /* Transpose 8x8 blocks: rows[r][k..k+8] -> dst[k..k+8][r]. */
    for (int k = 0; k < kc; k += 8) {
        for (int rb = 0; rb < GEMM_NR; rb += 8) {
            if (k + 8 > kc) {
                for (int kk = k; kk < kc; kk++)
                    for (int r = 0; r < 8; r++) dst[kk * GEMM_NR + rb + r] = rows[rb + r][kk];
                continue;
            }
            __m256 v0 = _mm256_loadu_ps(rows[rb + 0] + k), v1 = _mm256_loadu_ps(rows[rb + 1] + k);
            __m256 v2 = _mm256_loadu_ps(rows[rb + 2] + k), v3 = _mm256_loadu_ps(rows[rb + 3] + k);
            __m256 v4 = _mm256_loadu_ps(rows[rb + 4] + k), v5 = _mm256_loadu_ps(rows[rb + 5] + k);
            __m256 v6 = _mm256_loadu_ps(rows[rb + 6] + k), v7 = _mm256_loadu_ps(rows[rb + 7] + k);
            __m256 t0 = _mm256_unpacklo_ps(v0, v1), t1 = _mm256_unpackhi_ps(v0, v1);
            __m256 t2 = _mm256_unpacklo_ps(v2, v3), t3 = _mm256_unpackhi_ps(v2, v3);
            __m256 t4 = _mm256_unpacklo_ps(v4, v5), t5 = _mm256_unpackhi_ps(v4, v5);
            __m256 t6 = _mm256_unpacklo_ps(v6, v7), t7 = _mm256_unpackhi_ps(v6, v7);
            __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
            __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
            __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
            __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
            float *d = dst + (size_t)k * GEMM_NR + rb;
            _mm256_storeu_ps(d + 0 * GEMM_NR, _mm256_permute2f128_ps(s0, s4, 0x20));
            _mm256_storeu_ps(d + 1 * GEMM_NR, _mm256_permute2f128_ps(s1, s5, 0x20));
            _mm256_storeu_ps(d + 2 * GEMM_NR, _mm256_permute2f128_ps(s2, s6, 0x20));
            _mm256_storeu_ps(d + 3 * GEMM_NR, _mm256_permute2f128_ps(s3, s7, 0x20));
            _mm256_storeu_ps(d + 4 * GEMM_NR, _mm256_permute2f128_ps(s0, s4, 0x31));
            _mm256_storeu_ps(d + 5 * GEMM_NR, _mm256_permute2f128_ps(s1, s5, 0x31));
            _mm256_storeu_ps(d + 6 * GEMM_NR, _mm256_permute2f128_ps(s2, s6, 0x31));
            _mm256_storeu_ps(d + 7 * GEMM_NR, _mm256_permute2f128_ps(s3, s7, 0x31));
        }
    }
}

/* The 6x16 register tile: 12 accumulators, 2 B vectors, 1 broadcast A value. */
static void micro_avx2(int kc, const float *a, const float *b, float *c, int64_t ldc, int mr,
                       int nr)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(b + k * GEMM_NR), b1 = _mm256_loadu_ps(b + k * GEMM_NR + 8);
        const float *ak = a + k * GEMM_MR;
        __m256 av = _mm256_broadcast_ss(ak + 0);
        c00 = _mm256_fmadd_ps(av, b0, c00);
        c01 = _mm256_fmadd_ps(av, b1, c01);
        av = _mm256_broadcast_ss(ak + 1);
        c10 = _mm256_fmadd_ps(av, b0, c10);
        c11 = _mm256_fmadd_ps(av, b1, c11);
        av = _mm256_broadcast_ss(ak + 2);
        c20 = _mm256_fmadd_ps(av, b0, c20);
        c21 = _mm256_fmadd_ps(av, b1, c21);
        av = _mm256_broadcast_ss(ak + 3);
        c30 = _mm256_fmadd_ps(av, b0, c30);
        c31 = _mm256_fmadd_ps(av, b1, c31);
        av = _mm256_broadcast_ss(ak + 4);
        c40 = _mm256_fmadd_ps(av, b0, c40);
        c41 = _mm256_fmadd_ps(av, b1, c41);
        av = _mm256_broadcast_ss(ak + 5);
        c50 = _mm256_fmadd_ps(av, b0, c50);
        c51 = _mm256_fmadd_ps(av, b1, c51);
    }
    __m256 acc[GEMM_MR][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                              {c30, c31}, {c40, c41}, {c50, c51}};
    if (nr == GEMM_NR) {
        for (int i = 0; i < mr; i++) {
            float *ci = c + i * ldc;
            _mm256_storeu_ps(ci, _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]));
            _mm256_storeu_ps(ci + 8, _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]));
        }
        return;
    }
    float t[GEMM_NR];
    for (int i = 0; i < mr; i++) {
        _mm256_storeu_ps(t, acc[i][0]);
        _mm256_storeu_ps(t + 8, acc[i][1]);
        for (int j = 0; j < nr; j++) c[i * ldc + j] += t[j];
    }
}

static uint64_t read_sum_avx2(const void *p, size_t n)
{
    const __m256i *q = p;
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i < n / 32; i += 4) {
        a = _mm256_xor_si256(a, _mm256_loadu_si256(q + i));
        b = _mm256_xor_si256(b, _mm256_loadu_si256(q + i + 1));
        c = _mm256_xor_si256(c, _mm256_loadu_si256(q + i + 2));
        d = _mm256_xor_si256(d, _mm256_loadu_si256(q + i + 3));
    }
    __m256i x = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *)t, x);
    return t[0] ^ t[1] ^ t[2] ^ t[3];
}

const struct cpu_impl cpu_impl_avx2 = {
    .gemv = gemv_avx2,
    .pack_b = pack_b_avx2,
    .micro = micro_avx2,
    .dot = dot_avx2,
    .axpy = axpy_avx2,
    .read_sum = read_sum_avx2,
};
