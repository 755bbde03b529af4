/* The dispatcher of the fast many-row products (see gemm.h) and the batch-invariant switch. */
#include "kernels/cpu/gemm.h"

#include "common/scratch.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/impl.h"

static int batch_invariant;

void cpu_batch_invariant_set(int on)
{
    batch_invariant = on != 0;
}

int cpu_batch_invariant_get(void)
{
    return batch_invariant;
}

enum gemm_kind gemm_kind_of(const struct qweight *w)
{
    if (w->fmt == WFMT_AFFINE && w->bits >= 2 && w->bits <= 8 && w->bits != 7 && w->group >= 32 &&
        w->group % 32 == 0 && GEMM_KC % w->group == 0 && w->k % 64 == 0)
        return GEMM_Q8;
    if (w->fmt == WFMT_BF16 && w->k % 32 == 0) return GEMM_BF16;
    if (((w->fmt == WFMT_MXFP4 || w->fmt == WFMT_MXFP8) && w->group == 32) ||
        (w->fmt == WFMT_NVFP4 && w->group == 16))
        return w->k % 32 == 0 ? GEMM_MX : GEMM_NONE;
    return GEMM_NONE;
}

#if defined(PAGODA_X86)
/* Which kernels run: the AMX ones, the AVX-512 ones, or the 256-bit affine ones of the AVX2
 * and AVX-VNNI tables. */
enum gemm_isa { GI_AVX2, GI_VNNI, GI_AVX512, GI_AMX };

struct gemm_job {
    float *y;
    const float *x;
    const struct qweight *w;
    int m;
    enum gemm_kind kind;
    enum gemm_isa isa;
    uint8_t *xp;
    size_t stride;
};

static void prep_task(void *p, int ith, int nth)
{
    struct gemm_job *j = p;
    long lo, hi;
#if defined(PAGODA_AMX)
    if (j->isa == GI_AMX) { /* blocks of 16 rows */
        tp_range((j->m + 15) / 16, ith, nth, 1, &lo, &hi);
        if (lo >= hi) return;
        if (j->kind == GEMM_Q8)
            gemm_q8_amx_prep(j->w, j->x, j->m, (int)lo, (int)hi, j->xp);
        else
            gemm_bf16_amx_prep(j->w, j->x, j->m, (int)lo, (int)hi, j->xp);
        return;
    }
#endif
    tp_range(j->m, ith, nth, 1, &lo, &hi);
    if (lo >= hi) return;
    const float *x = j->x + (size_t)lo * j->w->k;
    uint8_t *xp = j->xp + (size_t)lo * j->stride;
    if (j->kind == GEMM_MX) {
        gemm_mx_avx2_prep(j->w, x, (int)(hi - lo), xp, j->stride);
        return;
    }
#if defined(PAGODA_AVX512)
    if (j->isa == GI_AVX512) {
        if (j->kind == GEMM_Q8)
            gemm_q8_prep(j->w, x, (int)(hi - lo), xp, j->stride);
        else
            gemm_bf16_prep(j->w, x, (int)(hi - lo), xp, j->stride);
        return;
    }
#endif
    gemm_q8_avx2_prep(j->w, x, (int)(hi - lo), xp, j->stride);
}

/* Weight rows split between threads in multiples of 32, the widest panel height. */
static void rows_task(void *p, int ith, int nth)
{
    struct gemm_job *j = p;
    long lo, hi;
    tp_range((long)j->w->n, ith, nth, 32, &lo, &hi);
    if (lo >= hi) return;
#if defined(PAGODA_AMX)
    if (j->isa == GI_AMX) {
        gemm_amx_begin();
        if (j->kind == GEMM_Q8)
            gemm_q8_amx_rows(j->w, lo, hi, j->xp, j->m, j->y, j->w->n);
        else
            gemm_bf16_amx_rows(j->w, lo, hi, j->xp, j->m, j->y, j->w->n);
        gemm_amx_end();
        return;
    }
#endif
    if (j->kind == GEMM_MX) {
        gemm_mx_avx2_rows(j->w, lo, hi, j->xp, j->stride, j->m, j->y, j->w->n, j->isa == GI_VNNI);
        return;
    }
#if defined(PAGODA_AVX512)
    if (j->isa == GI_AVX512) {
        if (j->kind == GEMM_Q8)
            gemm_q8_rows(j->w, lo, hi, j->xp, j->stride, j->m, j->y, j->w->n);
        else
            gemm_bf16_rows(j->w, lo, hi, j->xp, j->stride, j->m, j->y, j->w->n);
        return;
    }
#endif
    gemm_q8_avx2_rows(j->w, lo, hi, j->xp, j->stride, j->m, j->y, j->w->n, j->isa == GI_VNNI);
}
#endif

int gemm_run(struct threadpool *tp, float *y, const float *x, const struct qweight *w, int m)
{
#if defined(PAGODA_X86)
    enum cpu_isa isa = cpu_isa_get();
    if (batch_invariant || m < GEMM_MIN_M || isa == CPU_ISA_PORTABLE) return 0;
    enum gemm_kind kind = gemm_kind_of(w);
    if (kind == GEMM_NONE) return 0;
    struct gemm_job j = {y, x, w, m, kind, GI_AVX2, NULL, 0};
    size_t bytes = 0;
    if (kind == GEMM_MX) {
        /* The 256-bit tiles on every table; vpdpbusd where the CPU has AVX-VNNI. */
        j.isa = affine4_vnni ? GI_VNNI : GI_AVX2;
        bytes = gemm_mx_avx2_prep_bytes(w);
    }
#if defined(PAGODA_AMX)
    else if (isa == CPU_ISA_AMX && (kind == GEMM_BF16 || gemm_q8_amx_serves(w))) {
        /* x prepared as tiles, blocks of 16 rows (not rows `stride` apart) */
        j.isa = GI_AMX;
        bytes = kind == GEMM_Q8 ? gemm_q8_amx_prep_bytes(w, m) : gemm_bf16_amx_prep_bytes(w, m);
        j.xp = (uint8_t *)scratch_get(SCRATCH_MM_X, (bytes + 3) / sizeof(float));
        tp_run(tp, prep_task, &j);
        tp_run(tp, rows_task, &j);
        return 1;
    }
#endif
#if defined(PAGODA_AVX512)
    else if (isa >= CPU_ISA_AVX512) {
        j.isa = GI_AVX512;
        bytes = kind == GEMM_Q8 ? gemm_q8_prep_bytes(w) : gemm_bf16_prep_bytes(w);
    }
#endif
    if (kind != GEMM_MX && j.isa != GI_AVX512) {
        /* bf16 stays on the invariant kernels here: widened to float32, a product is FMA-bound
         * either way, and a fast tile of 6 x 16 measured no faster at 128 rows and slower at
         * 16 (bench matmul, 2048 x 2048). */
        if (kind != GEMM_Q8 || (w->bits != 4 && w->bits != 8)) return 0;
        j.isa = isa == CPU_ISA_AVXVNNI ? GI_VNNI : GI_AVX2;
        bytes = gemm_q8_avx2_prep_bytes(w);
    }
    j.stride = (bytes + 63) / 64 * 64;
    j.xp = (uint8_t *)scratch_get(SCRATCH_MM_X, (size_t)m * j.stride / sizeof(float));
    tp_run(tp, prep_task, &j);
    tp_run(tp, rows_task, &j);
    return 1;
#else
    (void)tp;
    (void)y;
    (void)x;
    (void)w;
    (void)m;
    return 0;
#endif
}
