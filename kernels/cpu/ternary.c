/*
 * Ternary products (BitNet b1.58's BitLinear): each input row quantized to int8 by absmax,
 * its exact integer dot with 2-bit weight codes, one float scaling per output. The codes are
 * value + 1 (model/weights.h), so a row's dot is dot(codes, q) - sum(q): the kernels multiply
 * unsigned codes by signed bytes (vpmaddubsw) with no sign handling.
 */
#include <math.h>
#include <string.h>

#include "common/scratch.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/impl.h"

float cpu_ternary_quantize(const float *x, int64_t k, int64_t kp, int8_t *q, int32_t *sum)
{
#if defined(PAGODA_X86)
    if (cpu_isa_get() >= CPU_ISA_AVX2) return ternary_quantize_avx2(x, k, kp, q, sum);
#endif
    return ternary_quantize_portable(x, k, kp, q, sum);
}

float ternary_quantize_portable(const float *x, int64_t k, int64_t kp, int8_t *q, int32_t *sum)
{
    float mx = 0;
    for (int64_t j = 0; j < k; j++) mx = fmaxf(mx, fabsf(x[j]));
    float s = 127.0f / (mx > 1e-5f ? mx : 1e-5f);
    int32_t acc = 0;
    for (int64_t j = 0; j < k; j++) {
        float v = nearbyintf(x[j] * s); /* the default rounding mode: half to even */
        if (v > 127.0f)
            v = 127.0f;
        else if (v < -128.0f)
            v = -128.0f;
        else if (v != v)
            v = 0.0f; /* NaN: a defined byte */
        q[j] = (int8_t)v;
        acc += q[j];
    }
    memset(q + k, 0, (size_t)(kp - k));
    *sum = acc;
    return s;
}

void ternary_matmul_portable(const struct qweight *w, int64_t r0, int64_t r1, const int8_t *q,
                             size_t stride, const int32_t *qsum, const float *qdiv, int m, float *y,
                             int64_t ldy)
{
    int64_t blocks = (int64_t)w->row_bytes / 32;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w->w + (size_t)r * w->row_bytes;
        for (int i = 0; i < m; i++) {
            const int8_t *qi = q + (size_t)i * stride;
            int32_t acc = 0;
            for (int64_t b = 0; b < blocks; b++)
                for (int j = 0; j < 32; j++) {
                    int c = row[b * 32 + j];
                    const int8_t *qb = qi + b * 128 + j;
                    acc += (c & 3) * qb[0] + (c >> 2 & 3) * qb[32] + (c >> 4 & 3) * qb[64] +
                           (c >> 6) * qb[96];
                }
            y[(size_t)i * ldy + r] = (float)(acc - qsum[i]) / qdiv[i] * w->t_mul;
        }
    }
}

struct ternary_job {
    float *y;
    const struct qweight *w;
    const int8_t *q;
    size_t stride;
    const int32_t *qsum;
    const float *qdiv;
    int m;
};

/* Weight rows split between threads in multiples of 16, as cpu_matmul does; products of
 * many rows on the amx table run its tiles (the same results: the dots are exact). */
static void ternary_task(void *p, int ith, int nth)
{
    struct ternary_job *j = p;
    long lo, hi;
    tp_range((long)j->w->n, ith, nth, 16, &lo, &hi);
    if (lo >= hi) return;
#if defined(PAGODA_AMX)
    if (j->m >= TERNARY_AMX_MIN_M && cpu_isa_get() == CPU_ISA_AMX) {
        ternary_matmul_amx(j->w, lo, hi, j->q, j->stride, j->qsum, j->qdiv, j->m, j->y, j->w->n);
        return;
    }
#endif
    cpu_impl->ternary(j->w, lo, hi, j->q, j->stride, j->qsum, j->qdiv, j->m, j->y, j->w->n);
}

void cpu_ternary_matmul(struct threadpool *tp, float *y, const float *x, const struct qweight *w,
                        int m)
{
    int64_t kp = (int64_t)w->row_bytes * 4;
    size_t stride = ((size_t)kp + 63) / 64 * 64;
    /* [m][stride] int8 rows, then m sums and m divisors; O(m k) next to the O(m n k) product */
    size_t bytes = (size_t)m * (stride + sizeof(int32_t) + sizeof(float));
    int8_t *q = (int8_t *)scratch_get(SCRATCH_MM_X, (bytes + 3) / 4);
    int32_t *qsum = (int32_t *)(q + (size_t)m * stride);
    float *qdiv = (float *)(qsum + m);
    for (int i = 0; i < m; i++) {
        float s =
            cpu_ternary_quantize(x + (size_t)i * w->k, w->k, kp, q + (size_t)i * stride, &qsum[i]);
        qdiv[i] = s * w->t_div;
    }
    struct ternary_job j = {y, w, q, stride, qsum, qdiv, m};
    tp_run(tp, ternary_task, &j);
}
