#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/scratch.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/impl.h"
#include "kernels/cpu/quant.h"

const struct cpu_impl *cpu_impl = &cpu_impl_portable;
static enum cpu_isa current_isa = CPU_ISA_PORTABLE;

int cpu_isa_available(enum cpu_isa isa)
{
    if (isa == CPU_ISA_PORTABLE) return 1;
#if defined(PAGODA_X86)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

const char *cpu_isa_name(enum cpu_isa isa)
{
    return isa == CPU_ISA_AVX2 ? "avx2" : "portable";
}

void cpu_isa_set(enum cpu_isa isa)
{
    if (!cpu_isa_available(isa)) isa = CPU_ISA_PORTABLE;
    current_isa = isa;
#if defined(PAGODA_X86)
    cpu_impl = isa == CPU_ISA_AVX2 ? &cpu_impl_avx2 : &cpu_impl_portable;
#else
    cpu_impl = &cpu_impl_portable;
#endif
}

enum cpu_isa cpu_isa_get(void)
{
    return current_isa;
}

void cpu_kernels_init(void)
{
    quant_init();
    const char *force = getenv("PAGODA_CPU_ISA");
    if (force && !strcmp(force, "portable"))
        cpu_isa_set(CPU_ISA_PORTABLE);
    else
        cpu_isa_set(CPU_ISA_AVX2);
}

/* ---- portable kernels ---- */

/* Columns decoded per chunk by the generic paths: a multiple of every group size. */
#define CHUNK 256

static void gemv_portable(const struct qweight *w, int64_t r0, int64_t r1, const float *x, int m,
                          float *y, int64_t ldy)
{
    float buf[CHUNK];
    for (int64_t r = r0; r < r1; r++) {
        for (int i = 0; i < m; i++) y[i * ldy + r] = 0;
        for (int64_t k0 = 0; k0 < w->k; k0 += CHUNK) {
            int len = (int)(w->k - k0 < CHUNK ? w->k - k0 : CHUNK);
            quant_dequant_row(w, r, k0, len, buf);
            for (int i = 0; i < m; i++) {
                const float *xi = x + (size_t)i * w->k + k0;
                float s = 0;
                for (int j = 0; j < len; j++) s += buf[j] * xi[j];
                y[i * ldy + r] += s;
            }
        }
    }
}

void cpu_pack_b_generic(const struct qweight *w, int64_t r0, int nr, int64_t k0, int kc, float *dst)
{
    float row[GEMM_KC];
    for (int r = 0; r < GEMM_NR; r++) {
        if (r < nr)
            quant_dequant_row(w, r0 + r, k0, kc, row);
        else
            memset(row, 0, sizeof(float) * (size_t)kc);
        for (int k = 0; k < kc; k++) dst[k * GEMM_NR + r] = row[k];
    }
}

static void micro_portable(int kc, const float *a, const float *b, float *c, int64_t ldc, int mr,
                           int nr)
{
    float acc[GEMM_MR][GEMM_NR] = {{0}};
    for (int k = 0; k < kc; k++)
        for (int i = 0; i < GEMM_MR; i++)
            for (int j = 0; j < GEMM_NR; j++) acc[i][j] += a[k * GEMM_MR + i] * b[k * GEMM_NR + j];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) c[i * ldc + j] += acc[i][j];
}

static float dot_portable(const float *a, const float *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_portable(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static uint64_t read_sum_portable(const void *p, size_t n)
{
    const uint64_t *q = p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        a ^= q[i];
        b ^= q[i + 1];
        c ^= q[i + 2];
        d ^= q[i + 3];
    }
    return a ^ b ^ c ^ d;
}

const struct cpu_impl cpu_impl_portable = {
    .gemv = gemv_portable,
    .pack_b = cpu_pack_b_generic,
    .micro = micro_portable,
    .dot = dot_portable,
    .axpy = axpy_portable,
    .read_sum = read_sum_portable,
};

/* ---- the threaded driver ---- */

/* At or below this many rows of x, a weight row is streamed once and dotted with every x
 * row (memory-bound decode); above it the packed GEMM wins. */
#define GEMV_MAX_M 8

struct mm_job {
    float *y;
    const float *x;
    const struct qweight *w;
    int m;
};

static void mm_gemv_task(void *p, int ith, int nth)
{
    struct mm_job *j = p;
    long lo, hi;
    tp_range((long)j->w->n, ith, nth, 16, &lo, &hi);
    if (lo < hi) cpu_impl->gemv(j->w, lo, hi, j->x, j->m, j->y, j->w->n);
}

/* Packs rows [0, m) x cols [k0, k0+kc) of x as blocks of [kc][MR] (rows past m zero). */
static void pack_a(const float *x, int m, int64_t k, int64_t k0, int kc, float *dst)
{
    for (int mb = 0; mb < m; mb += GEMM_MR) {
        float *d = dst + (size_t)mb * kc;
        for (int i = 0; i < GEMM_MR; i++) {
            if (mb + i < m) {
                const float *src = x + (size_t)(mb + i) * k + k0;
                for (int kk = 0; kk < kc; kk++) d[kk * GEMM_MR + i] = src[kk];
            } else {
                for (int kk = 0; kk < kc; kk++) d[kk * GEMM_MR + i] = 0;
            }
        }
    }
}

static void mm_gemm_task(void *p, int ith, int nth)
{
    struct mm_job *j = p;
    const struct qweight *w = j->w;
    long lo, hi;
    tp_range((long)w->n, ith, nth, GEMM_NR, &lo, &hi);
    if (lo >= hi) return;
    int mpad = (j->m + GEMM_MR - 1) / GEMM_MR * GEMM_MR;
    float *pa = scratch_get(SCRATCH_GEMM_A, (size_t)mpad * GEMM_KC);
    float *pb = scratch_get(SCRATCH_GEMM_B, (size_t)GEMM_KC * GEMM_NR);
    for (int i = 0; i < j->m; i++)
        memset(j->y + (size_t)i * w->n + lo, 0, sizeof(float) * (size_t)(hi - lo));
    for (int64_t k0 = 0; k0 < w->k; k0 += GEMM_KC) {
        int kc = (int)(w->k - k0 < GEMM_KC ? w->k - k0 : GEMM_KC);
        pack_a(j->x, j->m, w->k, k0, kc, pa);
        for (long nb = lo; nb < hi; nb += GEMM_NR) {
            int nr = (int)(hi - nb < GEMM_NR ? hi - nb : GEMM_NR);
            cpu_impl->pack_b(w, nb, nr, k0, kc, pb);
            for (int mb = 0; mb < j->m; mb += GEMM_MR) {
                int mr = j->m - mb < GEMM_MR ? j->m - mb : GEMM_MR;
                cpu_impl->micro(kc, pa + (size_t)mb * kc, pb, j->y + (size_t)mb * w->n + nb, w->n,
                                mr, nr);
            }
        }
    }
}

void cpu_matmul(struct threadpool *tp, float *y, const float *x, const struct qweight *w, int m)
{
    struct mm_job j = {y, x, w, m};
    tp_run(tp, m <= GEMV_MAX_M ? mm_gemv_task : mm_gemm_task, &j);
}

void cpu_embed_row(const struct qweight *w, int64_t id, float scale, float *out)
{
    quant_dequant_row(w, id, 0, w->k, out);
    if (scale != 1.0f)
        for (int64_t i = 0; i < w->k; i++) out[i] *= scale;
}

float cpu_dot(const float *a, const float *b, int n)
{
    return cpu_impl->dot(a, b, n);
}

void cpu_axpy(float *y, float a, const float *x, int n)
{
    cpu_impl->axpy(y, a, x, n);
}

struct read_job {
    const uint8_t *p;
    size_t n;
    uint64_t out[64];
};

static void read_task(void *arg, int ith, int nth)
{
    struct read_job *j = arg;
    long lo, hi;
    tp_range((long)(j->n / 64), ith, nth, 1, &lo, &hi);
    j->out[ith % 64] = cpu_impl->read_sum(j->p + (size_t)lo * 64, (size_t)(hi - lo) * 64);
}

uint64_t cpu_read_all(struct threadpool *tp, const void *p, size_t n)
{
    struct read_job j = {p, n, {0}};
    tp_run(tp, read_task, &j);
    uint64_t x = 0;
    for (int i = 0; i < 64; i++) x ^= j.out[i];
    return x;
}
