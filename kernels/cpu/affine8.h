/*
 * affine8: the integer kernel of affine 8-bit weights (MLX 8-bit, groups of 32 to 1024 by
 * 32), internal to kernels/cpu. affine8_avx2.c holds the input preparation, the driver and
 * the AVX2 tiles; affine8_avx512.c the AVX-512 tiles, which give bitwise the same outputs.
 *
 * Each x row is converted once per call, per weight group, to two 16-bit fixed-point parts:
 * t = x / sx with sx = max|x| / 32767, xq = round(t), xl = round((t - xq) * 65536) (t - xq is
 * exact), so x = sx (xq + xl / 65536) to within sx / 2^17 plus the rounding of t: float32's
 * precision (one part alone, 1.5e-5 of the group's largest input, moved the log-probabilities
 * of a small MLX 8-bit model by 1.4e-3). A weight byte q (0..255) times either part is exact
 * in int32, and so is each lane's share of a group's sum (at most 1024 / 16 * 2 * 255 * 32767
 * < 2^31). Output (i, r) is
 *   hsum(sum over groups g in order of
 *        fma(float(lane sums of q_g . xl_g), c_g / 65536, fma(float(lane sums of q_g . xq_g), c_g,
 * .)))
 *     + sum_g b_g * sum(x_g)                                      (affine_bias_dot's order)
 * with c_g = s_g * sx_g, where lane l of a group's 8 int32 sums holds columns 16 c + 2 l and
 * 16 c + 2 l + 1 of every 16-column block c of the group (vpmaddwd's pairs). The AVX-512
 * tiles add 32 columns per vpdpwssd into 16 lanes and fold the halves before the float
 * step: the same integers.
 *
 * Layout of a prepared row: int16 xq[k], int16 xl[k], then the groups' float sums of x, then
 * their sx.
 */
#ifndef PAGODA_KERNELS_CPU_AFFINE8_H
#define PAGODA_KERNELS_CPU_AFFINE8_H

#include <stddef.h>
#include <stdint.h>

#include "model/weights.h"

#define A8MR 4 /* x rows per tile */

static inline int affine8_int(const struct qweight *w)
{
    return w->fmt == WFMT_AFFINE && w->bits == 8 && w->group % 32 == 0 && w->group <= 1024;
}

size_t affine8_prep_bytes(const struct qweight *w);
void affine8_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride);

/* Weight rows [r, r + nrows) against MR prepared x rows over groups [g0, g1): continues the
 * 8-lane float chains in acc (row j's at acc + 8 j, x row i's ldacc floats apart); ssx is
 * scratch for MR * (g1 - g0) floats. */
typedef void (*a8_fn)(const struct qweight *w, int64_t r, int nrows, int64_t g0, int64_t g1,
                      const uint8_t *xp, size_t stride, float *acc, int64_t ldacc, int resume,
                      float *ssx);

/* [MR - 1] */
extern const a8_fn a8_tab_avx2[A8MR];
#if defined(PAGODA_AVX512)
extern const a8_fn a8_tab_avx512[A8MR];
#endif

/* Rows [r0, r1) of y for m prepared x rows, with the tiles of `tab`. */
void affine8_matmul(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                    size_t stride, int m, float *y, int64_t ldy, const a8_fn *tab);

/* s_g * sx_g for groups [g0, g1) of weight row r into d (xsc: the row's sx per group), the
 * same products in every table. */
void affine_scale_sx(const struct qweight *w, int64_t r, int64_t g0, int64_t g1, const float *xsc,
                     float *d);

/* sum_g b_g * xs_g for weight row r (xs: the row's group sums of x): 8 groups per vector
 * step, hsum, then the remaining groups in order. */
float affine_bias_dot(const struct qweight *w, int64_t r, const float *xs);

#endif
