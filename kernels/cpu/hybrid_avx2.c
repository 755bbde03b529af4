/*
 * The delta rule's token step (see impl.h) with AVX2: 8 columns of the state a vector,
 * the same multiplies and adds as delta_step_portable (no FMA: each product is rounded
 * before its add, as there), so the results are bitwise the same.
 *
 * The state is walked in blocks of 64 columns: for each block, all dk rows are decayed and
 * summed into S^T k (8 running sums in registers), then updated and summed into S^T q. The
 * block (dk x 64 floats, 32 KB at dk = 128) stays in L1 between the two walks, so a token
 * reads and writes each head's state once from memory (64 KB at 128 x 128): at decode the
 * rule runs at the speed of that traffic rather than of a scalar loop.
 *
 * Also the products of the rule's chunked form (gemm_avx2), with fused multiply-adds.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/impl.h"

/* Columns [c0, c0 + 8 NV) of the step. */
ALWAYS_INLINE void delta_block(float *S, const float *q, const float *k, const float *v, int dk,
                               int dv, int c0, __m256 decay, __m256 beta, float *o, const int NV)
{
    __m256 acc[8], d[8];
#pragma GCC unroll 8
    for (int u = 0; u < NV; u++) acc[u] = _mm256_setzero_ps();
    for (int i = 0; i < dk; i++) {
        float *Si = S + (size_t)i * dv + c0;
        __m256 ki = _mm256_set1_ps(k[i]);
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) {
            __m256 s = _mm256_mul_ps(_mm256_loadu_ps(Si + 8 * u), decay);
            _mm256_storeu_ps(Si + 8 * u, s);
            acc[u] = _mm256_add_ps(acc[u], _mm256_mul_ps(s, ki));
        }
    }
#pragma GCC unroll 8
    for (int u = 0; u < NV; u++) {
        d[u] = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + c0 + 8 * u), acc[u]), beta);
        acc[u] = _mm256_setzero_ps();
    }
    for (int i = 0; i < dk; i++) {
        float *Si = S + (size_t)i * dv + c0;
        __m256 ki = _mm256_set1_ps(k[i]), qi = _mm256_set1_ps(q[i]);
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) {
            __m256 s = _mm256_add_ps(_mm256_loadu_ps(Si + 8 * u), _mm256_mul_ps(ki, d[u]));
            _mm256_storeu_ps(Si + 8 * u, s);
            acc[u] = _mm256_add_ps(acc[u], _mm256_mul_ps(s, qi));
        }
    }
#pragma GCC unroll 8
    for (int u = 0; u < NV; u++) _mm256_storeu_ps(o + c0 + 8 * u, acc[u]);
}

void delta_step_avx2(float *S, const float *q, const float *k, const float *v, int dk, int dv,
                     float decay, float beta, float *o, float *tmp)
{
    __m256 dec = _mm256_set1_ps(decay), bet = _mm256_set1_ps(beta);
    int c = 0;
    for (; c + 64 <= dv; c += 64) delta_block(S, q, k, v, dk, dv, c, dec, bet, o, 8);
    for (; c + 8 <= dv; c += 8) delta_block(S, q, k, v, dk, dv, c, dec, bet, o, 1);
    if (c == dv) return;
    /* the last dv % 8 columns, as the portable step does them */
    int n = dv - c;
    float *kvm = tmp, *delta = tmp + n;
    memset(kvm, 0, sizeof(float) * (size_t)n);
    for (int i = 0; i < dk; i++) {
        float *Si = S + (size_t)i * dv + c, ki = k[i];
        for (int x = 0; x < n; x++) {
            Si[x] *= decay;
            kvm[x] += Si[x] * ki;
        }
    }
    for (int x = 0; x < n; x++) delta[x] = (v[c + x] - kvm[x]) * beta;
    memset(o + c, 0, sizeof(float) * (size_t)n);
    for (int i = 0; i < dk; i++) {
        float *Si = S + (size_t)i * dv + c, ki = k[i], qi = q[i];
        for (int x = 0; x < n; x++) {
            Si[x] += ki * delta[x];
            o[c + x] += Si[x] * qi;
        }
    }
}

/* 8 channels a vector for the usual kernel of 4 taps (their weights gathered, 4 floats
 * apart), the rest as the portable step does them. */
void conv_token_avx2(float *x, float *tail, size_t ldt, const float *w, int n, int K, int fresh)
{
    int c = 0;
    if (K == 4) {
        const __m256i idx = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        float *t0 = tail, *t1 = tail + ldt, *t2 = tail + 2 * ldt;
        for (; c + 8 <= n; c += 8) {
            const float *wc = w + (size_t)c * 4;
            __m256 w0 = _mm256_i32gather_ps(wc, idx, 4), w1 = _mm256_i32gather_ps(wc + 1, idx, 4);
            __m256 w2 = _mm256_i32gather_ps(wc + 2, idx, 4),
                   w3 = _mm256_i32gather_ps(wc + 3, idx, 4);
            __m256 zero = _mm256_setzero_ps(), xin = _mm256_loadu_ps(x + c);
            __m256 a0 = fresh ? zero : _mm256_loadu_ps(t0 + c);
            __m256 a1 = fresh ? zero : _mm256_loadu_ps(t1 + c);
            __m256 a2 = fresh ? zero : _mm256_loadu_ps(t2 + c);
            __m256 y = _mm256_add_ps(zero, _mm256_mul_ps(w0, a0));
            y = _mm256_add_ps(y, _mm256_mul_ps(w1, a1));
            y = _mm256_add_ps(y, _mm256_mul_ps(w2, a2));
            y = _mm256_add_ps(y, _mm256_mul_ps(w3, xin));
            _mm256_storeu_ps(t0 + c, a1);
            _mm256_storeu_ps(t1 + c, a2);
            _mm256_storeu_ps(t2 + c, xin);
            _mm256_storeu_ps(x + c, y);
        }
    }
    if (c < n) conv_token_portable(x + c, tail + c, ldt, w + (size_t)c * K, n - c, K, fresh);
}

/* Rows [m, m + NR) by columns [n, n + 8 NV) of gemm_avx2: NR x NV accumulators, each a
 * chain of fused multiply-adds over k in order. */
ALWAYS_INLINE void gemm_tile(float *y, size_t ldy, const float *x, size_t ldx, const float *b,
                             size_t ldb, int m, int n, int K, __m256 scale, int acc, const int NR,
                             const int NV)
{
    __m256 c[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int u = 0; u < NV; u++)
            c[r][u] = acc ? _mm256_mul_ps(scale, _mm256_loadu_ps(y + (m + r) * ldy + n + 8 * u))
                          : _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        const float *bk = b + k * ldb + n;
        __m256 b0 = _mm256_loadu_ps(bk), b1 = NV > 1 ? _mm256_loadu_ps(bk + 8) : b0;
#pragma GCC unroll 4
        for (int r = 0; r < NR; r++) {
            __m256 xr = _mm256_broadcast_ss(x + (m + r) * ldx + k);
            c[r][0] = _mm256_fmadd_ps(xr, b0, c[r][0]);
            if (NV > 1) c[r][1] = _mm256_fmadd_ps(xr, b1, c[r][1]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; r++)
#pragma GCC unroll 2
        for (int u = 0; u < NV; u++) _mm256_storeu_ps(y + (m + r) * ldy + n + 8 * u, c[r][u]);
}

/* Tiles of 4 rows by 16 columns (8 accumulators; a 16-column strip of b, K x 64 bytes, stays
 * in L1 over the rows), then the edges; columns past the last 8 with scalar fused steps. */
void gemm_avx2(float *y, size_t ldy, const float *x, size_t ldx, const float *b, size_t ldb, int M,
               int K, int N, float scale, int acc)
{
    __m256 sc = _mm256_set1_ps(scale);
    int n = 0;
    for (; n + 16 <= N; n += 16) {
        int m = 0;
        for (; m + 4 <= M; m += 4) gemm_tile(y, ldy, x, ldx, b, ldb, m, n, K, sc, acc, 4, 2);
        for (; m < M; m++) gemm_tile(y, ldy, x, ldx, b, ldb, m, n, K, sc, acc, 1, 2);
    }
    for (; n + 8 <= N; n += 8)
        for (int m = 0; m < M; m++) gemm_tile(y, ldy, x, ldx, b, ldb, m, n, K, sc, acc, 1, 1);
    for (; n < N; n++)
        for (int m = 0; m < M; m++) {
            float s = acc ? scale * y[m * ldy + n] : 0.0f;
            for (int k = 0; k < K; k++) s = fmaf(x[m * ldx + k], b[k * ldb + n], s);
            y[m * ldy + n] = s;
        }
}
