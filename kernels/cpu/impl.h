/*
 * impl: the per-instruction-set kernel table behind kernels/cpu/cpu.h. Internal to
 * kernels/cpu; the portable table lives in matmul.c, the AVX2 one in matmul_avx2.c.
 */
#ifndef PAGODA_KERNELS_CPU_IMPL_H
#define PAGODA_KERNELS_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "model/weights.h"

/* GEMM blocking: an MR x NR register tile of C, KC columns of k per packed panel. */
#define GEMM_MR 6
#define GEMM_NR 16
#define GEMM_KC 256

struct cpu_impl {
    /* y[i*ldy + r] = dot(W row r, x row i) for r in [r0, r1), i in [0, m). */
    void (*gemv)(const struct qweight *w, int64_t r0, int64_t r1, const float *x, int m, float *y,
                 int64_t ldy);
    /* Packs rows [r0, r0+nr) x cols [k0, k0+kc) of W as float dst[kc][GEMM_NR]
     * (columns nr..NR-1 zero). */
    void (*pack_b)(const struct qweight *w, int64_t r0, int nr, int64_t k0, int kc, float *dst);
    /* C[mr][nr] (row stride ldc) += A[kc][GEMM_MR] . B[kc][GEMM_NR]. */
    void (*micro)(int kc, const float *a, const float *b, float *c, int64_t ldc, int mr, int nr);
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n);
    /* XOR of every 64-bit word of p[0, n) (n a multiple of 64): a pure streaming read. */
    uint64_t (*read_sum)(const void *p, size_t n);
};

extern const struct cpu_impl cpu_impl_portable;
#if defined(PAGODA_X86)
extern const struct cpu_impl cpu_impl_avx2;
#endif

/* The table in use. */
extern const struct cpu_impl *cpu_impl;

/* Portable pieces the SIMD table reuses for formats it has no special path for. */
void cpu_pack_b_generic(const struct qweight *w, int64_t r0, int nr, int64_t k0, int kc,
                        float *dst);

#endif
