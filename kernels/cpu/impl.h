/*
 * impl: the per-instruction-set kernel table behind kernels/cpu/cpu.h. Internal to
 * kernels/cpu; the portable table lives in matmul.c, the AVX2 one in matmul_avx2.c, the
 * AVX-512 one in matmul_avx512.c.
 *
 * Batch invariance: each table computes output (i, r) of a matmul with one fixed sequence
 * of float operations that depends only on x row i and weight row r, never on m, on the
 * other rows, or on which thread owns r. Register and cache blocking only decide how many
 * such sequences run side by side.
 */
#ifndef PAGODA_KERNELS_CPU_IMPL_H
#define PAGODA_KERNELS_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "model/weights.h"

struct cpu_impl {
    /* Bytes per x row of the kernel's own input layout for w, or 0 when it reads x as is. */
    size_t (*prep_bytes)(const struct qweight *w);
    /* Writes rows [0, m) of x in that layout, row i at xp + i * stride. */
    void (*prep)(const struct qweight *w, const float *x, int m, uint8_t *xp, size_t stride);
    /* y[i*ldy + r] = dot(W row r, x row i) for r in [r0, r1), i in [0, m); xp is the
     * prepared x (NULL when prep_bytes is 0). */
    void (*matmul)(const struct qweight *w, int64_t r0, int64_t r1, const float *x,
                   const uint8_t *xp, size_t stride, int m, float *y, int64_t ldy);
    float (*dot)(const float *a, const float *b, int n);
    void (*axpy)(float *y, float a, const float *x, int n);
    /* XOR of every 64-bit word of p[0, n) (n a multiple of 64): a pure streaming read. */
    uint64_t (*read_sum)(const void *p, size_t n);
    /* One token of the delta rule on one value head's state S [dk][dv]: S *= decay,
     * delta = (v - S^T k) * beta, S += k delta^T, o = S^T q (o [dv]; tmp: 2 dv floats).
     * Every table runs the same float operations in the same order per element (separate
     * multiplies and adds, sums over i in order), so all give bitwise the same results. */
    void (*delta_step)(float *S, const float *q, const float *k, const float *v, int dk, int dv,
                       float decay, float beta, float *o, float *tmp);
    /* conv_token_portable's step (same operations, same order) */
    void (*conv_token)(float *x, float *tail, size_t ldt, const float *w, int n, int K, int fresh);
    /* y[m][n] = (acc ? scale * y[m][n] : 0) + the sum over k (in order, from 0) of
     * x[m][k] * b[k][n], for m < M, n < N (rows ldy, ldx, ldb floats apart): the delta rule's
     * chunked form. Each element's operations are fixed by its position alone; the AVX2
     * table fuses each multiply and add, so tables agree to rounding, not bitwise. */
    void (*gemm)(float *y, size_t ldy, const float *x, size_t ldx, const float *b, size_t ldb,
                 int M, int K, int N, float scale, int acc);
    /* Ternary products (WFMT_TERNARY): y[i*ldy + r] = (float)(dot(codes of row r, q_i) -
     * qsum[i]) / qdiv[i] * w->t_mul for r in [r0, r1), i < m, with q_i the int8 row at
     * q + i * stride (zero past k) and qsum[i] its sum (a code is value + 1). The integer dot
     * is exact, so every table gives bitwise the same y. */
    void (*ternary)(const struct qweight *w, int64_t r0, int64_t r1, const int8_t *q, size_t stride,
                    const int32_t *qsum, const float *qdiv, int m, float *y, int64_t ldy);
    /* Quantized KV attention (attn_q.c) over n token rows of one head block, row i at
     * rows + i * rb, in format dt (paged_kv/kv_quant.h) with head_dim d, for nq query heads
     * that share the block (GQA): each row is decoded once, in registers, for all of them;
     * the rows' own scales are left to the caller. Head j's results do not depend on nq
     * (the same operations in the same order), so callers may group heads as they like.
     * kvq_dot: s[j * lds + i] = q_j . (the values of row i), q_j at q + j * ldq; fp8 as
     * e4m3 values, int as codes, tq as codebook entries. The tables agree to rounding
     * (|difference| <= d 2^-23 sum_c |q_c x_c|): the SIMD ones sum in lanes.
     * kvq_axpy: acc_j[c] += w[j * ldw + i] * (value c of row i) for i in order, acc_j at
     * acc + j * lda, each a rounded multiply then a rounded add: every table gives bitwise
     * the same sums. */
    void (*kvq_dot)(int dt, const uint8_t *rows, size_t rb, int n, int d, const float *q,
                    size_t ldq, int nq, float *s, size_t lds);
    void (*kvq_axpy)(int dt, const uint8_t *rows, size_t rb, int n, int d, float *acc, size_t lda,
                     int nq, const float *w, size_t ldw);
    /* Softmax weights before normalization: s[i] = e^(s[i] - m) for i < n, returning their
     * sum. The portable table calls expf and sums in order; the AVX2 one (also on avx512)
     * evaluates e^x by a polynomial in 8 lanes (within 2 ulp of expf, 0 below -87.3) and
     * sums in 8 lanes then a fixed tree. Each element's operations depend on its index
     * and n alone. */
    float (*softmax)(float *s, int n, float m);
};

/* The causal depthwise convolution of one token over n channels (decode): x[c] becomes
 * sum over i < K - 1 (in order, from 0) of w[c][i] * tail[i][c] (0 when `fresh`), plus
 * w[c][K - 1] * x[c]; the tail rows (ldt floats apart) shift up and take x. */
void conv_token_portable(float *x, float *tail, size_t ldt, const float *w, int n, int K,
                         int fresh);
void delta_step_portable(float *S, const float *q, const float *k, const float *v, int dk, int dv,
                         float decay, float beta, float *o, float *tmp);
void gemm_portable(float *y, size_t ldy, const float *x, size_t ldx, const float *b, size_t ldb,
                   int M, int K, int N, float scale, int acc);
/* The AVX2 versions (hybrid_avx2.c; only built and called on x86-64) */
void conv_token_avx2(float *x, float *tail, size_t ldt, const float *w, int n, int K, int fresh);
void delta_step_avx2(float *S, const float *q, const float *k, const float *v, int dk, int dv,
                     float decay, float beta, float *o, float *tmp);
void gemm_avx2(float *y, size_t ldy, const float *x, size_t ldx, const float *b, size_t ldb, int M,
               int K, int N, float scale, int acc);

void ternary_matmul_portable(const struct qweight *w, int64_t r0, int64_t r1, const int8_t *q,
                             size_t stride, const int32_t *qsum, const float *qdiv, int m, float *y,
                             int64_t ldy);
/* cpu_ternary_quantize's portable form, and its AVX2 one (ternary_avx2.c): the same bytes */
float ternary_quantize_portable(const float *x, int64_t k, int64_t kp, int8_t *q, int32_t *sum);
float ternary_quantize_avx2(const float *x, int64_t k, int64_t kp, int8_t *q, int32_t *sum);
/* The AVX2 version (ternary_avx2.c; only built and called on x86-64) */
void ternary_matmul_avx2(const struct qweight *w, int64_t r0, int64_t r1, const int8_t *q,
                         size_t stride, const int32_t *qsum, const float *qdiv, int m, float *y,
                         int64_t ldy);
/* The AVX-512 VNNI tile for 4 or more rows, the AVX2 kernel for the rest (ternary_avx512.c) */
void ternary_matmul_avx512(const struct qweight *w, int64_t r0, int64_t r1, const int8_t *q,
                           size_t stride, const int32_t *qsum, const float *qdiv, int m, float *y,
                           int64_t ldy);
/* The AMX kernel (ternary_amx.c), taken on the amx table for TERNARY_AMX_MIN_M rows or more;
 * it loads and releases the thread's tile configuration itself */
#define TERNARY_AMX_MIN_M 16
void ternary_matmul_amx(const struct qweight *w, int64_t r0, int64_t r1, const int8_t *q,
                        size_t stride, const int32_t *qsum, const float *qdiv, int m, float *y,
                        int64_t ldy);

float softmax_portable(float *s, int n, float m);
float softmax_avx2(float *s, int n, float m);
void kvq_dot_portable(int dt, const uint8_t *rows, size_t rb, int n, int d, const float *q,
                      size_t ldq, int nq, float *s, size_t lds);
void kvq_axpy_portable(int dt, const uint8_t *rows, size_t rb, int n, int d, float *acc, size_t lda,
                       int nq, const float *w, size_t ldw);
/* The AVX2 versions (attn_q_avx2.c; only built and called on x86-64) */
void kvq_dot_avx2(int dt, const uint8_t *rows, size_t rb, int n, int d, const float *q, size_t ldq,
                  int nq, float *s, size_t lds);
void kvq_axpy_avx2(int dt, const uint8_t *rows, size_t rb, int n, int d, float *acc, size_t lda,
                   int nq, const float *w, size_t ldw);
/* The SIMD row kernels' dispatch over query heads (attn_q_avx2.c, attn_q_avx512.c): one
 * instance of each loop per format and head count, both constants inside; heads go 4, then
 * 2, then 1 at a time, the per-head pointers a and b stepping by la and lb (the caller's
 * rows, rb, n, d and nq in scope). */
#define KVQ_NQ(F, DT, a, la, b, lb)                                                                \
    do {                                                                                           \
        for (; nq >= 4; nq -= 4, a += 4 * la, b += 4 * lb) F(DT, 4, rows, rb, n, d, a, la, b, lb); \
        if (nq >= 2) {                                                                             \
            F(DT, 2, rows, rb, n, d, a, la, b, lb);                                                \
            nq -= 2, a += 2 * la, b += 2 * lb;                                                     \
        }                                                                                          \
        if (nq) F(DT, 1, rows, rb, n, d, a, la, b, lb);                                            \
    } while (0)

/* The format's call of F through KVQ_NQ: every KV format, a constant in each (the row
 * kernels' switch over dt, shared by the AVX2 and AVX-512 rows). */
#define KVQ_CASES(F, a, la, b, lb)                                                                 \
    switch (dt) {                                                                                  \
    case KV_DTYPE_F32:                                                                             \
        KVQ_NQ(F, KV_DTYPE_F32, a, la, b, lb);                                                     \
        return;                                                                                    \
    case KV_DTYPE_BF16:                                                                            \
        KVQ_NQ(F, KV_DTYPE_BF16, a, la, b, lb);                                                    \
        return;                                                                                    \
    case KV_DTYPE_FP8:                                                                             \
        KVQ_NQ(F, KV_DTYPE_FP8, a, la, b, lb);                                                     \
        return;                                                                                    \
    case KV_DTYPE_INT8:                                                                            \
        KVQ_NQ(F, KV_DTYPE_INT8, a, la, b, lb);                                                    \
        return;                                                                                    \
    case KV_DTYPE_INT4:                                                                            \
        KVQ_NQ(F, KV_DTYPE_INT4, a, la, b, lb);                                                    \
        return;                                                                                    \
    case KV_DTYPE_TQ4:                                                                             \
        KVQ_NQ(F, KV_DTYPE_TQ4, a, la, b, lb);                                                     \
        return;                                                                                    \
    case KV_DTYPE_TQ3:                                                                             \
        KVQ_NQ(F, KV_DTYPE_TQ3, a, la, b, lb);                                                     \
        return;                                                                                    \
    default:                                                                                       \
        KVQ_NQ(F, KV_DTYPE_TQ2, a, la, b, lb);                                                     \
        return;                                                                                    \
    }

/* The AVX-512 versions: every format in 512-bit registers; head sizes that are not a
 * multiple of 16 take the AVX2 ones (attn_q_avx512.c) */
void kvq_dot_avx512(int dt, const uint8_t *rows, size_t rb, int n, int d, const float *q,
                    size_t ldq, int nq, float *s, size_t lds);
void kvq_axpy_avx512(int dt, const uint8_t *rows, size_t rb, int n, int d, float *acc, size_t lda,
                     int nq, const float *w, size_t ldw);

extern const struct cpu_impl cpu_impl_portable;
#if defined(PAGODA_X86)
extern const struct cpu_impl cpu_impl_avx2;
/* Set with CPU_ISA_AVXVNNI: the AVX2 table's affine 4-bit kernel runs its AVX-VNNI tiles
 * (bitwise the same results). */
extern int affine4_vnni;
#endif
#if defined(PAGODA_AVX512)
extern const struct cpu_impl cpu_impl_avx512;
#endif

/* The table in use. */
extern const struct cpu_impl *cpu_impl;

#endif
