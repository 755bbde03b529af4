/*
 * gemm_q8_avx2: the register tile of the many-row affine 4- and 8-bit products with 256-bit
 * vectors (see gemm.h), included by gemm_q8_avx2.c (AVX2) and gemm_q8_vnni_avx2.c
 * (AVX-VNNI). Internal to kernels/cpu.
 *
 * A panel holds 16 weight rows (2 vectors of 8) by up to GEMM_KC columns as
 * [columns / E][2 vectors][8 rows][E codes]: E = 4 int8 codes per 32-bit lane (the affine
 * formats: 4-bit and 8-bit codes as they are, or 8-bit ones as q - 128 on AVX2, where
 * vpmaddubsw would saturate on them: 2 * 255 * 127 > 32767) or E = 2 codes widened to int16
 * (mxfp8's scaled values, gemm_mx_avx2.c). An x row enters as one broadcast 32-bit word of E
 * int8 (or int16) values, and each step adds E products per lane into int32 sums, exactly:
 *   E = 4, AVX-VNNI: vpdpbusd;
 *   E = 4, AVX2:     vpmaddubsw (a nibble times an int8 is at most 15 * 127, a pair
 *                    3810), two steps added as int16 (7620), then vpmaddwd by ones;
 *   E = 4, AVX2, signed 8-bit codes: vpsignb puts each code's sign on x, vpmaddubsw
 *                    multiplies |q - 128| <= 128 by it (a pair at most 32512), then
 *                    vpmaddwd by ones;
 *   E = 2, AVX2:     vpmaddwd.
 * The integer sums are the same on every path; only the cost differs.
 */
#ifndef PAGODA_KERNELS_CPU_GEMM_Q8_AVX2_H
#define PAGODA_KERNELS_CPU_GEMM_Q8_AVX2_H

#include <string.h>

#include "kernels/cpu/avx2.h"

#define G8NB 16 /* weight rows per panel: 2 vectors of 8 */
#define G8MR 6  /* x rows per tile, at most (the register budget: g8_rows) */

struct g8_tile_args {
    const uint8_t *pw;
    const float *psc, *pbi; /* the panel's scales and biases, [group][16 rows] */
    int64_t gpp, spg;       /* groups in the panel, steps (E columns) per group */
    const uint8_t *xq;      /* the tile's first x row at the panel's first column */
    const float *dx, *xs;   /* its groups' dx and dx * sum(xq), from the panel's first group */
    size_t stride;          /* bytes between x rows (for xq, dx and xs alike) */
    float *park;            /* the tile's chains, 16 floats per x row */
    int resume;
    float *y; /* non-NULL on the last panel: the outputs, rows ldy apart */
    int64_t ldy;
    int nb;
};

#if defined(__AVXVNNI__)
/* acc + 4-byte dot products per lane, written out: GCC 12 copies every accumulator of the
 * intrinsic's loop once per iteration. */
ALWAYS_INLINE __m256i g8_dpbusd(__m256i acc, __m256i w, __m256i x)
{
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(w), "x"(x));
    return acc;
}

/* acc + int16 pair products per lane (vpdpwssd), written out for the same reason. */
ALWAYS_INLINE __m256i g8_dpwssd(__m256i acc, __m256i w, __m256i x)
{
    __asm__("%{vex%} vpdpwssd %2, %1, %0" : "+x"(acc) : "x"(w), "x"(x));
    return acc;
}
#endif

/* acc + vpmaddwd(w, x), and acc + vpmaddwd(vpmaddubsw(w0, x0) + vpmaddubsw(w1, x1), ones):
 * written out for the same reason (GCC 12 spills the tile's sums otherwise). */
ALWAYS_INLINE __m256i g8_madd(__m256i acc, __m256i w, __m256i x)
{
    __m256i t;
    __asm__("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+x"(acc), "=&x"(t) : "x"(w), "x"(x));
    return acc;
}

ALWAYS_INLINE __m256i g8_maddubs2(__m256i acc, __m256i w0, __m256i x0, __m256i w1, __m256i x1,
                                  __m256i ones)
{
    __m256i t, u;
    __asm__("vpmaddubsw %4, %3, %1\n\t"
            "vpmaddubsw %6, %5, %2\n\t"
            "vpaddw %2, %1, %1\n\t"
            "vpmaddwd %7, %1, %1\n\t"
            "vpaddd %1, %0, %0"
            : "+x"(acc), "=&x"(t), "=&x"(u)
            : "x"(w0), "x"(x0), "x"(w1), "x"(x1), "x"(ones));
    return acc;
}

/* acc + vpmaddwd(vpmaddubsw(|w|, sign(x, w)), ones) with w's signed codes read from
 * memory: w . x per pair of bytes (|w| <= 128, |x| <= 127: a pair at most 32512), summed
 * into int32 lanes; written out for the same reason. */
ALWAYS_INLINE __m256i g8_signmadd(__m256i acc, __m256i aw, const uint8_t *w, __m256i x,
                                  __m256i ones)
{
    __m256i t;
    __asm__("vpsignb %3, %2, %1\n\t"
            "vpmaddubsw %1, %4, %1\n\t"
            "vpmaddwd %5, %1, %1\n\t"
            "vpaddd %1, %0, %0"
            : "+x"(acc), "=&x"(t)
            : "x"(x), "m"(*(const __m256i *)w), "x"(aw), "x"(ones));
    return acc;
}

ALWAYS_INLINE __m256i g8_bcast(const uint8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Stores the first n (<= 8) lanes of v at p. */
ALWAYS_INLINE void g8_store(float *p, __m256 v, int n)
{
    if (n >= 8) {
        _mm256_storeu_ps(p, v);
    } else if (n > 0) {
        float t[8];
        _mm256_storeu_ps(t, v);
        memcpy(p, t, sizeof(float) * (size_t)n);
    }
}

/* R x rows (R <= G8MR); E codes per lane; VNNI 1: vpdpbusd (E = 4) or vpdpwssd (E = 2);
 * VNNI 2 (E = 4, AVX2): signed 8-bit codes (q - 128) by vpsignb + vpmaddubsw. */
ALWAYS_INLINE void g8_tile(const int R, const int E, const int VNNI, const struct g8_tile_args *a)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const int xb = E == 4 ? 1 : 2; /* bytes per x value */
    for (int64_t g = 0; g < a->gpp; g++) {
        __m256i s[G8MR][2];
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) s[i][0] = s[i][1] = _mm256_setzero_si256();
        const uint8_t *wg = a->pw + g * a->spg * 64;
        const uint8_t *xg = a->xq + g * a->spg * E * xb;
        if (E == 2) {
            for (int64_t q = 0; q < a->spg; q++) {
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(wg + q * 64)),
                        w1 = _mm256_loadu_si256((const __m256i *)(wg + q * 64 + 32));
#pragma GCC unroll 8
                for (int i = 0; i < R; i++) {
                    __m256i x = g8_bcast(xg + (size_t)i * a->stride + q * 4);
#if defined(__AVXVNNI__)
                    if (VNNI) {
                        s[i][0] = g8_dpwssd(s[i][0], w0, x);
                        s[i][1] = g8_dpwssd(s[i][1], w1, x);
                        continue;
                    }
#endif
                    s[i][0] = g8_madd(s[i][0], w0, x);
                    s[i][1] = g8_madd(s[i][1], w1, x);
                }
            }
        } else if (VNNI == 2) {
            for (int64_t q = 0; q < a->spg; q++) {
                const uint8_t *w0 = wg + q * 64, *w1 = w0 + 32;
                __m256i a0 = _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)w0)),
                        a1 = _mm256_abs_epi8(_mm256_loadu_si256((const __m256i *)w1));
#pragma GCC unroll 8
                for (int i = 0; i < R; i++) {
                    __m256i x = g8_bcast(xg + (size_t)i * a->stride + q * 4);
                    s[i][0] = g8_signmadd(s[i][0], a0, w0, x, ones);
                    s[i][1] = g8_signmadd(s[i][1], a1, w1, x, ones);
                }
            }
        } else if (VNNI) {
#if defined(__AVXVNNI__)
            for (int64_t q = 0; q < a->spg; q++) {
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(wg + q * 64)),
                        w1 = _mm256_loadu_si256((const __m256i *)(wg + q * 64 + 32));
#pragma GCC unroll 8
                for (int i = 0; i < R; i++) {
                    __m256i x = g8_bcast(xg + (size_t)i * a->stride + q * 4);
                    s[i][0] = g8_dpbusd(s[i][0], w0, x);
                    s[i][1] = g8_dpbusd(s[i][1], w1, x);
                }
            }
#endif
        } else {
            /* two steps per vpmaddwd: the int16 sums stay below 2 * 3810 */
            for (int64_t q = 0; q < a->spg; q += 2) {
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(wg + q * 64)),
                        w1 = _mm256_loadu_si256((const __m256i *)(wg + q * 64 + 32)),
                        w2 = _mm256_loadu_si256((const __m256i *)(wg + q * 64 + 64)),
                        w3 = _mm256_loadu_si256((const __m256i *)(wg + q * 64 + 96));
#pragma GCC unroll 8
                for (int i = 0; i < R; i++) {
                    __m256i x0 = g8_bcast(xg + (size_t)i * a->stride + q * 4),
                            x1 = g8_bcast(xg + (size_t)i * a->stride + q * 4 + 4);
                    s[i][0] = g8_maddubs2(s[i][0], w0, x0, w2, x1, ones);
                    s[i][1] = g8_maddubs2(s[i][1], w1, x0, w3, x1, ones);
                }
            }
        }
        __m256 sv0 = _mm256_loadu_ps(a->psc + g * G8NB),
               sv1 = _mm256_loadu_ps(a->psc + g * G8NB + 8);
        __m256 bv0 = _mm256_loadu_ps(a->pbi + g * G8NB),
               bv1 = _mm256_loadu_ps(a->pbi + g * G8NB + 8);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            float *pk = a->park + i * G8NB;
            const float *dxi = (const float *)((const uint8_t *)a->dx + (size_t)i * a->stride);
            const float *xsi = (const float *)((const uint8_t *)a->xs + (size_t)i * a->stride);
            __m256 d = _mm256_set1_ps(dxi[g]), e = _mm256_set1_ps(xsi[g]);
            int first = g == 0 && !a->resume;
            __m256 t0 = first ? _mm256_setzero_ps() : _mm256_loadu_ps(pk);
            __m256 t1 = first ? _mm256_setzero_ps() : _mm256_loadu_ps(pk + 8);
            t0 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[i][0]), sv0), d, t0);
            t1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[i][1]), sv1), d, t1);
            t0 = _mm256_fmadd_ps(bv0, e, t0);
            t1 = _mm256_fmadd_ps(bv1, e, t1);
            if (a->y && g == a->gpp - 1) {
                g8_store(a->y + i * a->ldy, t0, a->nb);
                g8_store(a->y + i * a->ldy + 8, t1, a->nb - 8);
            } else {
                _mm256_storeu_ps(pk, t0);
                _mm256_storeu_ps(pk + 8, t1);
            }
        }
    }
}

typedef void (*g8_fn)(const struct g8_tile_args *a);

/* The largest |x| of n floats (n a multiple of 8): a group's int8 scale. */
static inline float g8_absmax(const float *x, int64_t n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 8)
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Bytes of a quantized x row's values (int8, or int16 with E = 2 codes a lane), rounded up
 * to 64; its groups' scales and sums follow them. */
static inline int64_t g8_xq_bytes(int64_t k, int E)
{
    return (k * (E == 2 ? 2 : 1) + 63) / 64 * 64;
}

/* x rows per tile that fit 16 registers: 2 sums per row, plus the weights, x and temporaries
 * (AVX-VNNI: 12 + 2 + 1; AVX2, int16 codes: 12 + 2 + 1 + 1; AVX2, 4-bit: 8 + 4 + 2 + 1 + 2;
 * AVX2, signed 8-bit: 8 + 2 + 1 + 1 + 1). */
static inline int g8_rows(int E, int vnni)
{
    return vnni == 1 ? 6 : E == 2 ? 6 : 4;
}

#define G8_TILE(P, R, E, V)                                                                        \
    static void P##_##R(const struct g8_tile_args *a)                                              \
    {                                                                                              \
        g8_tile(R, E, V, a);                                                                       \
    }
/* NAME[R - 1]: the tiles of 1 to 6 x rows */
#define G8_TABLE(NAME, E, V)                                                                       \
    G8_TILE(NAME, 1, E, V)                                                                         \
    G8_TILE(NAME, 2, E, V)                                                                         \
    G8_TILE(NAME, 3, E, V)                                                                         \
    G8_TILE(NAME, 4, E, V)                                                                         \
    G8_TILE(NAME, 5, E, V)                                                                         \
    G8_TILE(NAME, 6, E, V)                                                                         \
    const g8_fn NAME[G8MR] = {NAME##_1, NAME##_2, NAME##_3, NAME##_4, NAME##_5, NAME##_6};

/* gemm_q8_avx2.c: E = 4 and E = 2 with AVX2; gemm_q8_vnni_avx2.c (built when PAGODA_AVXVNNI
 * is defined): E = 4 with AVX-VNNI, and E = 2 (mxfp8's int16 panels). */
extern const g8_fn g8_tab_avx2_e4[G8MR];
extern const g8_fn g8_tab_avx2_e2[G8MR];
extern const g8_fn g8_tab_avx2_s8[G8MR];
extern const g8_fn g8_tab_vnni[G8MR];
extern const g8_fn g8_tab_vnni_e2[G8MR];

/* Packs rows [rb, rb + nb) (nb <= G8NB) of w over columns [kp, kp + len) into pw (E codes a
 * lane, in the tiles' order) and their groups' scales ps[g * G8NB + j] and biases
 * ps[G8NB * gmax + g * G8NB + j]. */
typedef void (*g8_pack_fn)(const struct qweight *w, int E, int64_t rb, int nb, int64_t kp,
                           int64_t len, uint8_t *pw, float *ps, int64_t gmax);

/* The many-row product's panel loop (gemm_q8_avx2.c): rows [r0, r1) of w in panels of G8NB
 * rows packed by pack, GEMM_KC columns at a time, over m quantized x rows xp (stride bytes
 * apart, their int8 or int16 values then kq bytes on their groups' scales and sums) in tiles
 * of up to MR rows through tab; y [m, ldy]. */
void g8_run(const struct qweight *w, int E, const g8_fn *tab, int MR, int64_t kq, g8_pack_fn pack,
            int64_t r0, int64_t r1, const uint8_t *xp, size_t stride, int m, float *y, int64_t ldy);

#endif
