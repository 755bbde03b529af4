/*
 * gemm: the fast matrix products for many rows (prefill, batched decode), used by
 * cpu_matmul when m >= GEMM_MIN_M and batch-invariant mode is off (cpu_batch_invariant_set).
 * Internal to kernels/cpu.
 *
 * Affine weights are repacked per thread, one panel at a time, so that each 32-bit lane of
 * a 512-bit vector holds one weight row: a panel of 32 rows by up to GEMM_KC columns becomes
 * [columns / 4][2 vectors][16 rows][4 bytes]. An x row then enters as one broadcast 32-bit
 * word, and every instruction of the tile is a dot product (vpdpbusd) of 16 rows at once:
 * no horizontal sums, outputs stored as vectors.
 *
 *   affine 2 to 8 bit (2, 3, 5 and 6 from AVX-512 up): x quantized once per call to int8 per
 *     weight group
 *     (xq = round(x * 127 / max|x|), as llama.cpp's Q8 activations), integer sums per group,
 *     y = sum_g [s_g * dx_g * (q_g . xq_g) + b_g * dx_g * sum(xq_g)];
 *   bf16 (AVX-512): read in place, no repacking; x stays float32 (laid out once per call as
 *     each 32 columns' even then odd values), the weights widen to float32 in registers
 *     and each output is one FMA chain, its 16 lanes summed at the end (gemm_bf16_avx512.c;
 *     vdpbf16ps runs at half the pace of vfmadd231ps on the CPUs measured);
 *     with AMX (CPU_ISA_AMX) x rounded to bf16 (nearest even) and TDPBF16PS over tiles of
 *     16 x 32 taken straight from the weights (gemm_bf16_amx.c): no repacking of the
 *     weights. Affine weights with groups of 64 or a multiple take their integer sums from
 *     TDPBUSD there (gemm_q8_amx.c), with the AVX-512 kernel's float steps: the same results.
 *
 * The AVX2 and AVX-VNNI tables run the affine kernels with 256-bit vectors (gemm_q8_avx2.h:
 * panels of 16 rows, 8 per vector, the same int8 activations; vpmaddubsw + vpmaddwd, with
 * 8-bit codes signed and vpsignb, or vpdpbusd); bf16 stays on the invariant kernels there.
 *
 * mxfp4, nvfp4 and mxfp8 run the same 256-bit tiles on every x86 table (gemm_mx_avx2.c):
 * the e2m1 values times 2 as unsigned int8 codes against int8 activations, e4m3 values as
 * int16 codes scaled per group against int16 activations.
 *
 * None is batch-invariant in the strict sense (an output's arithmetic does not depend
 * on m, but it differs from the m <= 8 kernels' arithmetic, so a row computed alone and in
 * a batch of 9 or more differ by the input rounding); tests state the tolerances.
 */
#ifndef PAGODA_KERNELS_CPU_GEMM_H
#define PAGODA_KERNELS_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/threadpool.h"
#include "model/weights.h"

/* Smallest m that the fast kernels take (below: the decode kernels). */
#define GEMM_MIN_M 9
/* Columns per weight panel (a multiple of every group size it serves) */
#define GEMM_KC 512

/* GEMM_MX: mxfp4, nvfp4 and mxfp8 on the 256-bit integer tiles (gemm_mx_avx2.c), on every
 * x86 table. */
enum gemm_kind { GEMM_NONE, GEMM_Q8, GEMM_BF16, GEMM_MX };

/* Which fast kernel serves w (GEMM_NONE: none; the caller runs the invariant kernels). */
enum gemm_kind gemm_kind_of(const struct qweight *w);

/**
 * y[m, n] = x[m, k] . W^T with the fast kernels when the ISA in use has them, w's format
 * is served and m >= GEMM_MIN_M; returns 1 when it ran, 0 when the caller must.
 */
int gemm_run(struct threadpool *tp, float *y, const float *x, const struct qweight *w, int m);

#if defined(PAGODA_AVX512)
/* gemm_q8_avx512.c: bytes per prepared x row, the preparation, rows [r0, r1) of y. */
size_t gemm_q8_prep_bytes(const struct qweight *w);
void gemm_q8_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride);
void gemm_q8_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp, size_t stride,
                  int m, float *y, int64_t ldy);
/* gemm_bf16_avx512.c: the same for bf16 weights */
size_t gemm_bf16_prep_bytes(const struct qweight *w);
void gemm_bf16_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride);
void gemm_bf16_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                    size_t stride, int m, float *y, int64_t ldy);
#endif

#if defined(PAGODA_AMX)
/* gemm_bf16_amx.c: a thread's tile configuration, loaded before its first AMX product and
 * released after its last; bytes of prepared x for m rows; x blocks [b0, b1) (16 rows each)
 * prepared; rows [r0, r1) of y. */
void gemm_amx_begin(void);
void gemm_amx_end(void);
size_t gemm_bf16_amx_prep_bytes(const struct qweight *w, int m);
void gemm_bf16_amx_prep(const struct qweight *w, const float *x, int m, int b0, int b1,
                        uint8_t *xp);
void gemm_bf16_amx_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp, int m,
                        float *y, int64_t ldy);
/* gemm_q8_amx.c: the same for affine 2- to 8-bit weights whose groups are 64 columns or a
 * multiple (gemm_q8_amx_serves); the AVX-512 kernel's results, bit for bit */
int gemm_q8_amx_serves(const struct qweight *w);
size_t gemm_q8_amx_prep_bytes(const struct qweight *w, int m);
void gemm_q8_amx_prep(const struct qweight *w, const float *x, int m, int b0, int b1, uint8_t *xp);
void gemm_q8_amx_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp, int m,
                      float *y, int64_t ldy);
#endif

#if defined(PAGODA_X86)
/* gemm_q8_avx2.c: the same with 256-bit vectors, for the AVX2 table (vnni 0) and the
 * AVX-VNNI one (vnni 1; see gemm_q8_avx2.h). */
size_t gemm_q8_avx2_prep_bytes(const struct qweight *w);
void gemm_q8_avx2_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride);
void gemm_q8_avx2_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                       size_t stride, int m, float *y, int64_t ldy, int vnni);
/* gemm_mx_avx2.c: the same for mxfp4, nvfp4 and mxfp8 (vnni: vpdpbusd, vpdpwssd tiles) */
size_t gemm_mx_avx2_prep_bytes(const struct qweight *w);
void gemm_mx_avx2_prep(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride);
void gemm_mx_avx2_rows(const struct qweight *w, int64_t r0, int64_t r1, const uint8_t *xp,
                       size_t stride, int m, float *y, int64_t ldy, int vnni);
#endif

#endif
