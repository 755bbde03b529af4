/* AVX2 + FMA kernels (compiled with -mavx2 -mfma -mf16c, used only when the CPU has them). */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/scratch.h"
#include "common/util.h"
#include "kernels/cpu/affine8.h"
#include "kernels/cpu/avx2.h"
#include "kernels/cpu/impl.h"
#include "kernels/cpu/quant.h"

static inline __m256 load_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

float dot_avx2(const float *a, const float *b, int n)
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

void axpy_avx2(float *y, float a, const float *x, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

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

/* Affine 4- and 8-bit groups decoded here, affine 2/3/5/6-bit and the fp formats by
 * decode_row_fast (decode_avx2.c); the rest through the portable decoder. dst gets len
 * floats. */
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
    if (!decode_row_fast(w, r, k0, len, dst)) quant_dequant_row(w, r, k0, len, dst);
}

/* ---- float-weight kernels: bf16, f16, f32, and every other format decoded to f32 ---- */

/*
 * Output (i, r) is one 8-lane FMA chain over the columns in steps of 16 (the step's low
 * then high vector of 8 weights, steps in column order), then hsum, then the k % 16 tail
 * in column order. bf16 weights widen by interleaving with zero (vpunpcklwd/vpunpckhwd:
 * the shuffle port only, no shift on the FMA ports), which puts columns 0-3 and 8-11 of a
 * step in the low vector and 4-7, 12-15 in the high one; x is permuted to match once per
 * call (prep_avx2). A tile keeps MR x rows by NR weight rows of chains in registers, so
 * one loaded weight vector feeds MR FMAs; x comes from L1 as memory operands.
 */
#define FMR 3 /* tiles of up to 3 x rows */
#define FNR 4 /* by up to 4 weight rows */

struct ftile {
    const float *x; /* x rows at the panel's first column, ldx floats apart */
    int64_t ldx;
    const uint8_t *w; /* weight rows at the panel's first column, ldw bytes apart */
    size_t ldw;
    float *acc; /* chains: [i][j][8], row i ldacc floats apart */
    int64_t ldacc;
    int64_t steps; /* 16-column steps in the panel */
    int resume;    /* continue the chains in acc (else start them at zero) */
};

ALWAYS_INLINE void wload16(enum wfmt f, const uint8_t *w, int64_t s, __m256 *lo, __m256 *hi)
{
    if (f == WFMT_BF16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + s * 32));
        __m256i z = _mm256_setzero_si256();
        *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
        *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
    } else if (f == WFMT_F16) {
        *lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + s * 32)));
        *hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + s * 32 + 16)));
    } else {
        *lo = _mm256_loadu_ps((const float *)w + s * 16);
        *hi = _mm256_loadu_ps((const float *)w + s * 16 + 8);
    }
}

ALWAYS_INLINE void ftile_run(enum wfmt f, const int MR, const int NR, const int PF,
                             const struct ftile *t)
{
    __m256 a[FMR][FNR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++)
            a[i][j] =
                t->resume ? _mm256_loadu_ps(t->acc + i * t->ldacc + j * 8) : _mm256_setzero_ps();
    const int esz = f == WFMT_F32 ? 4 : 2;
    for (int64_t s = 0; s < t->steps; s++) {
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) {
            const uint8_t *wj = t->w + j * t->ldw;
            /* Streams 1 KB ahead, one prefetch per cache line: memory-bound decode needs it. */
            if (PF && (esz == 4 || (s & 1) == 0))
                _mm_prefetch((const char *)(wj + s * 16 * esz + 1024), _MM_HINT_T0);
            __m256 lo, hi;
            wload16(f, wj, s, &lo, &hi);
#pragma GCC unroll 8
            for (int i = 0; i < MR; i++) {
                const float *xi = t->x + i * t->ldx + s * 16;
                a[i][j] = _mm256_fmadd_ps(lo, _mm256_loadu_ps(xi), a[i][j]);
                a[i][j] = _mm256_fmadd_ps(hi, _mm256_loadu_ps(xi + 8), a[i][j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) _mm256_storeu_ps(t->acc + i * t->ldacc + j * 8, a[i][j]);
}

/* Half h (0: low, 1: high) of step s of a weight row, as wload16 gives it. */
ALWAYS_INLINE __m256 wload8(enum wfmt f, const uint8_t *w, int64_t s, int h)
{
    if (f == WFMT_BF16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(w + s * 32));
        __m256i z = _mm256_setzero_si256();
        return _mm256_castsi256_ps(h ? _mm256_unpackhi_epi16(z, v) : _mm256_unpacklo_epi16(z, v));
    }
    if (f == WFMT_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + s * 32 + h * 16)));
    return _mm256_loadu_ps((const float *)w + s * 16 + h * 8);
}

/* a_i = fma(w, x_i, a_i) for i < 3 with w loaded once into a scratch register: the same
 * arithmetic as _mm256_fmadd_ps, written out so that a 3 x 4 tile (12 chains, 3 x vectors,
 * 1 weight vector: all 16 registers) compiles without spills. */
ALWAYS_INLINE void fma3_w(__m256 *a0, __m256 *a1, __m256 *a2, const float *w, __m256 x0, __m256 x1,
                          __m256 x2)
{
    __m256 t;
    __asm__("vmovups %4, %3\n\t"
            "vfmadd231ps %3, %5, %0\n\t"
            "vfmadd231ps %3, %6, %1\n\t"
            "vfmadd231ps %3, %7, %2"
            : "+x"(*a0), "+x"(*a1), "+x"(*a2), "=&x"(t)
            : "m"(*(const __m256_u *)w), "x"(x0), "x"(x1), "x"(x2));
}

/* The same chains with x in registers: per half step, MR x vectors and NR weight vectors
 * feed MR * NR register-only FMAs (loads: MR + NR per MR * NR FMAs). */
ALWAYS_INLINE void ftile_reg(enum wfmt f, const int MR, const int NR, const struct ftile *t)
{
    __m256 a[FMR][FNR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++)
            a[i][j] =
                t->resume ? _mm256_loadu_ps(t->acc + i * t->ldacc + j * 8) : _mm256_setzero_ps();
    for (int64_t s = 0; s < t->steps; s++) {
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 xv[FMR];
#pragma GCC unroll 8
            for (int i = 0; i < MR; i++) {
                xv[i] = _mm256_loadu_ps(t->x + i * t->ldx + s * 16 + h * 8);
                /* keeps the vector in a register: one load feeds NR FMAs */
                __asm__("" : "+x"(xv[i]));
            }
            if (f == WFMT_F32 && MR == 3 && NR == 4) {
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    fma3_w(&a[0][j], &a[1][j], &a[2][j],
                           (const float *)(t->w + j * t->ldw) + s * 16 + h * 8, xv[0], xv[1],
                           xv[2]);
                continue;
            }
#pragma GCC unroll 8
            for (int j = 0; j < NR; j++) {
                __m256 wv = wload8(f, t->w + j * t->ldw, s, h);
                if (f == WFMT_F32) __asm__("" : "+x"(wv));
#pragma GCC unroll 8
                for (int i = 0; i < MR; i++) a[i][j] = _mm256_fmadd_ps(wv, xv[i], a[i][j]);
            }
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 8
        for (int j = 0; j < NR; j++) _mm256_storeu_ps(t->acc + i * t->ldacc + j * 8, a[i][j]);
}

typedef void (*ftile_fn)(const struct ftile *t);

#define FTS(F, MR, NR)                                                                             \
    static void fts_##F##_##MR##_##NR(const struct ftile *t)                                       \
    {                                                                                              \
        ftile_run(WFMT_##F, MR, NR, 1, t);                                                         \
    }
#define FTS_ALL(F)                                                                                 \
    FTS(F, 1, 1)                                                                                   \
    FTS(F, 1, 2)                                                                                   \
    FTS(F, 1, 3)                                                                                   \
    FTS(F, 1, 4)                                                                                   \
    FTS(F, 2, 1)                                                                                   \
    FTS(F, 2, 2) FTS(F, 2, 3) FTS(F, 2, 4) FTS(F, 3, 1) FTS(F, 3, 2) FTS(F, 3, 3) FTS(F, 3, 4)
FTS_ALL(BF16)
FTS_ALL(F16)
FTS_ALL(F32)
#define FTS_ROW(F, MR)                                                                             \
    {                                                                                              \
        fts_##F##_##MR##_1, fts_##F##_##MR##_2, fts_##F##_##MR##_3, fts_##F##_##MR##_4             \
    }
#define FTS_TAB(F)                                                                                 \
    {                                                                                              \
        FTS_ROW(F, 1), FTS_ROW(F, 2), FTS_ROW(F, 3)                                                \
    }
/* Small m, weights read in place: [bf16, f16, f32][MR - 1][NR - 1] */
static const ftile_fn ft_small[3][3][4] = {FTS_TAB(BF16), FTS_TAB(F16), FTS_TAB(F32)};

#define FTL(MR, NR)                                                                                \
    static void ftl_##MR##_##NR(const struct ftile *t)                                             \
    {                                                                                              \
        ftile_reg(WFMT_F32, MR, NR, t);                                                            \
    }
FTL(1, 1)
FTL(1, 2)
FTL(1, 3)
FTL(2, 1)
FTL(2, 2)
FTL(2, 3)
FTL(3, 1)
FTL(3, 2)
FTL(3, 3)
FTL(1, 4)
FTL(2, 4)
FTL(3, 4)
/* Large m, f32 panels: [MR - 1][NR - 1] */
static const ftile_fn ft_large[3][4] = {{ftl_1_1, ftl_1_2, ftl_1_3, ftl_1_4},
                                        {ftl_2_1, ftl_2_2, ftl_2_3, ftl_2_4},
                                        {ftl_3_1, ftl_3_2, ftl_3_3, ftl_3_4}};

/* Blocking. Up to SMALL_M x rows (decode): whole rows, 4 weight rows at a time streamed
 * from memory with prefetch, weights widened in registers. Above: blocks of LNB weight
 * rows by panels of LKC columns widened once to f32 (24 KB, reused by every x row), 3 x 4
 * register tiles (12 chains: enough to cover the FMA latency; x in registers, 7 loads per
 * 12 FMAs, every register in use), chains parked in acc between panels. Measured on
 * 8192 x 2048 bf16, one thread: 74 GFLOP/s at m = 16 (3 x 3 tiles: 70; the FMA peak is
 * about 100). */
#define SMALL_M 3
#define LNB     24
#define LKC     256
#define LMR     3
#define LNR     4
/* x rows a pass over the weights takes at most: past 128 or so, x's panels (128 rows of
 * LKC columns: 128 KB) outgrow what the tiles read quickly (8192 x 2048 bf16 at 512 rows:
 * 151 GFLOP/s in one pass, 186 in passes of 128); each pass reads the weights again. */
#define LMB 128

/*
 * Rows [r0, r1) of W against m rows of x: xk is x as the kernel reads it (ldx floats per
 * row; permuted for bf16), x the caller's (the k % 16 tail reads it).
 */
static void matmul_float(const struct qweight *w, int64_t r0, int64_t r1, const float *xk,
                         int64_t ldx, const float *x, int m, float *y, int64_t ldy)
{
    enum wfmt f = w->fmt;
    size_t esz = f == WFMT_F32 ? 4 : 2;
    int64_t k = w->k, k16 = k / 16 * 16;
    int small = m <= SMALL_M;
    if (m > LMB) { /* every output's chain is the same in any pass */
        for (int i0 = 0; i0 < m; i0 += LMB)
            matmul_float(w, r0, r1, xk + (size_t)i0 * ldx, ldx, x + (size_t)i0 * k,
                         m - i0 < LMB ? m - i0 : LMB, y + (size_t)i0 * ldy, ldy);
        return;
    }
    /* Large m widens each bf16/f16 panel to f32 once for all x rows: the tiles then run
     * nothing but loads and FMAs. */
    int direct = f == WFMT_F32 || (small && (f == WFMT_BF16 || f == WFMT_F16));
    int fi = !direct ? 2 : f == WFMT_BF16 ? 0 : f == WFMT_F16 ? 1 : 2;
    int nbmax = small ? 4 : LNB, mrt = small ? SMALL_M : LMR, nrt = small ? 4 : LNR;
    int64_t kcmax = small ? k16 : LKC;
    if (!direct && w->group > 0 && kcmax % w->group) /* decoded panels hold whole groups */
        kcmax = kcmax < w->group ? w->group : kcmax / w->group * w->group;
    int64_t ldacc = (int64_t)nbmax * 8;
    float *acc = scratch_get(SCRATCH_GEMM_A, (size_t)m * (size_t)ldacc);
    float *dec = direct ? NULL : scratch_get(SCRATCH_GEMM_B, (size_t)nbmax * (size_t)kcmax);
    for (int64_t rb = r0; rb < r1; rb += nbmax) {
        int nb = (int)(r1 - rb < nbmax ? r1 - rb : nbmax);
        for (int64_t k0 = 0; k0 < k16; k0 += kcmax) {
            int64_t kc = k16 - k0 < kcmax ? k16 - k0 : kcmax;
            const uint8_t *wp;
            size_t ldw;
            if (direct) {
                wp = w->w + (size_t)rb * w->row_bytes + (size_t)k0 * esz;
                ldw = w->row_bytes;
            } else {
                for (int r = 0; r < nb; r++) {
                    float *d = dec + (size_t)r * kc;
                    if (f == WFMT_BF16 || f == WFMT_F16) {
                        const uint8_t *wr = w->w + (size_t)(rb + r) * w->row_bytes + k0 * 2;
                        /* The next panel of this row streams in while this one is widened
                         * and multiplied (a panel's tiles take longer than its bytes). */
                        const char *nx =
                            k0 + kc < k16 ? (const char *)wr + kc * 2
                            : rb + nbmax + r < r1
                                ? (const char *)w->w + (size_t)(rb + nbmax + r) * w->row_bytes
                                : (const char *)wr;
                        for (int64_t st = 0; st < kc / 16; st++) {
                            __m256 lo, hi;
                            if (!(st & 1)) _mm_prefetch(nx + st * 32, _MM_HINT_T0);
                            wload16(f, wr, st, &lo, &hi);
                            _mm256_storeu_ps(d + st * 16, lo);
                            _mm256_storeu_ps(d + st * 16 + 8, hi);
                        }
                    } else {
                        decode_row(w, rb + r, k0, kc, d);
                    }
                }
                wp = (const uint8_t *)dec;
                ldw = (size_t)kc * sizeof(float);
            }
            for (int i0 = 0, mr; i0 < m; i0 += mr) {
                mr = m - i0 < mrt ? m - i0 : mrt;
                /* 3-row blocks; the last 4 rows as 2 + 2 rather than 3 + 1 */
                if (!small && m - i0 == 4) mr = 2;
                for (int j0 = 0; j0 < nb; j0 += nrt) {
                    int nr = nb - j0 < nrt ? nb - j0 : nrt;
                    struct ftile t = {xk + (size_t)i0 * ldx + k0,
                                      ldx,
                                      wp + (size_t)j0 * ldw,
                                      ldw,
                                      acc + i0 * ldacc + j0 * 8,
                                      ldacc,
                                      kc / 16,
                                      k0 > 0};
                    if (small)
                        ft_small[fi][mr - 1][nr - 1](&t);
                    else
                        ft_large[mr - 1][nr - 1](&t);
                }
            }
        }
        for (int i = 0; i < m; i++)
            for (int r = 0; r < nb; r++) {
                float s = k16 ? hsum(_mm256_loadu_ps(acc + i * ldacc + r * 8)) : 0.0f;
                /* quantized formats have k a multiple of their group (>= 16): no tail */
                const uint8_t *wr = w->w + (size_t)(rb + r) * w->row_bytes;
                for (int64_t j = k16; j < k; j++) s += load1(f, wr, j) * x[(size_t)i * k + j];
                y[i * ldy + rb + r] = s;
            }
    }
}

/* x rows for bf16 weights: per 16 columns, 0-3 8-11 4-7 12-15 (see above); the tail as is. */
static void prep_bf16(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride)
{
    int64_t k = w->k, k16 = k / 16 * 16;
    for (int i = 0; i < m; i++) {
        const float *xi = x + (size_t)i * k;
        float *d = (float *)(xp + (size_t)i * stride);
        for (int64_t j = 0; j < k16; j += 16) {
            __m256 a = _mm256_loadu_ps(xi + j), b = _mm256_loadu_ps(xi + j + 8);
            _mm256_storeu_ps(d + j, _mm256_permute2f128_ps(a, b, 0x20));
            _mm256_storeu_ps(d + j + 8, _mm256_permute2f128_ps(a, b, 0x31));
        }
        for (int64_t j = k16; j < k; j++) d[j] = xi[j];
    }
}

size_t prep_bytes_avx2(const struct qweight *w)
{
    if (w->fmt == WFMT_BF16) return (size_t)w->k * sizeof(float);
    if (affine4_int(w)) return affine4_prep_bytes(w, 0);
    if (affine8_int(w)) return affine8_prep_bytes(w);
    return 0;
}

void prep_avx2(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride)
{
    if (w->fmt == WFMT_BF16)
        prep_bf16(w, x, m, xp, stride);
    else if (affine8_int(w))
        affine8_prep(w, x, m, xp, stride);
    else
        affine4_prep(w, x, m, xp, stride, 0);
}

void matmul_avx2(const struct qweight *w, int64_t r0, int64_t r1, const float *x, const uint8_t *xp,
                 size_t stride, int m, float *y, int64_t ldy)
{
    if (affine4_int(w))
        affine4_matmul(w, r0, r1, xp, stride, m, y, ldy);
    else if (affine8_int(w))
        affine8_matmul(w, r0, r1, xp, stride, m, y, ldy, a8_tab_avx2);
    else if (w->fmt == WFMT_BF16)
        matmul_float(w, r0, r1, (const float *)xp, (int64_t)(stride / sizeof(float)), x, m, y, ldy);
    else
        matmul_float(w, r0, r1, x, w->k, x, m, y, ldy);
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
    .prep_bytes = prep_bytes_avx2,
    .prep = prep_avx2,
    .matmul = matmul_avx2,
    .dot = dot_avx2,
    .axpy = axpy_avx2,
    .read_sum = read_sum_avx2,
    .delta_step = delta_step_avx2,
    .conv_token = conv_token_avx2,
    .gemm = gemm_avx2,
    .ternary = ternary_matmul_avx2,
    .kvq_dot = kvq_dot_avx2,
    .kvq_axpy = kvq_axpy_avx2,
    .softmax = softmax_avx2,
};
