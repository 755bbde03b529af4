/*
 * Batch invariance of cpu_matmul: row i of y = x . W^T must be bitwise the same whatever
 * else is in the batch (m = 1 .. 300 rows) and whatever the thread count (1, 2, 3), for
 * every weight format, group size and instruction-set path (each compared with itself).
 * The engine relies on it in batch-invariant mode (cpu_batch_invariant_set), where a
 * request's greedy tokens may not depend on its batch-mates.
 */
#include <string.h>

#include "common/threadpool.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "test_util.h"

#define TEST_SEED 0x9e3779b97f4a7c15ull
#include "test_mat.h"

#define MAXM 300

/* For one matrix and ISA: every row of every batch equals that row computed alone. */
static void check_invariance(struct threadpool *tps[3], const struct qweight *w, const float *x,
                             const char *name, enum cpu_isa isa)
{
    const int ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 33, 100, 131, MAXM};
    int64_t n = w->n, k = w->k;
    cpu_isa_set(isa);
    float *alone = xmalloc(sizeof(float) * (size_t)(MAXM * n));
    float *y = xmalloc(sizeof(float) * (size_t)(MAXM * n));
    for (int i = 0; i < MAXM; i++) cpu_matmul(tps[0], alone + i * n, x + i * k, w, 1);
    int bad = 0;
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0] && !bad; mi++)
        for (int t = 0; t < 3 && !bad; t++) {
            int m = ms[mi];
            memset(y, 0xff, sizeof(float) * (size_t)(m * n));
            cpu_matmul(tps[t], y, x, w, m);
            for (int i = 0; i < m && !bad; i++)
                for (int64_t r = 0; r < n; r++)
                    if (memcmp(&y[i * n + r], &alone[i * n + r], sizeof(float))) {
                        CHECK(0, "%s %s m=%d threads=%d: y[%d][%lld] = %.9g, alone %.9g", name,
                              cpu_isa_name(isa), m, t + 1, i, (long long)r, y[i * n + r],
                              alone[i * n + r]);
                        bad = 1;
                        break;
                    }
        }
    CHECK(!bad, "%s %s: batch invariance", name, cpu_isa_name(isa));
    free(alone);
    free(y);
}

int main(void)
{
    cpu_kernels_init();
    cpu_batch_invariant_set(1); /* the guarantee holds in batch-invariant mode */
    struct threadpool *tps[3] = {tp_create(1), tp_create(2), tp_create(3)};
    struct {
        enum wfmt f;
        int bits, group;
        enum st_dtype sd;
        const char *name;
    } fmts[] = {
        {WFMT_F32, 32, 0, ST_U8, "f32"},
        {WFMT_BF16, 16, 0, ST_U8, "bf16"},
        {WFMT_AFFINE, 4, 64, ST_BF16, "mlx4 g64"},
        {WFMT_AFFINE, 8, 32, ST_F16, "mlx8 g32 f16 scales"},
        {WFMT_F16, 16, 0, ST_U8, "f16"},
        {WFMT_BF16, 16, 0, ST_U8, "bf16"},
        {WFMT_AFFINE, 2, 32, ST_BF16, "mlx2 g32"},
        {WFMT_AFFINE, 2, 64, ST_BF16, "mlx2 g64"},
        {WFMT_AFFINE, 2, 128, ST_BF16, "mlx2 g128"},
        {WFMT_AFFINE, 3, 32, ST_BF16, "mlx3 g32"},
        {WFMT_AFFINE, 3, 64, ST_BF16, "mlx3 g64"},
        {WFMT_AFFINE, 3, 128, ST_BF16, "mlx3 g128"},
        {WFMT_AFFINE, 4, 32, ST_BF16, "mlx4 g32"},
        {WFMT_AFFINE, 4, 64, ST_BF16, "mlx4 g64"},
        {WFMT_AFFINE, 4, 128, ST_BF16, "mlx4 g128"},
        {WFMT_AFFINE, 4, 64, ST_F16, "mlx4 g64 f16 scales"},
        {WFMT_AFFINE, 4, 128, ST_F32, "mlx4 g128 f32 scales"},
        {WFMT_AFFINE, 5, 32, ST_BF16, "mlx5 g32"},
        {WFMT_AFFINE, 5, 64, ST_BF16, "mlx5 g64"},
        {WFMT_AFFINE, 5, 128, ST_BF16, "mlx5 g128"},
        {WFMT_AFFINE, 6, 32, ST_BF16, "mlx6 g32"},
        {WFMT_AFFINE, 6, 64, ST_BF16, "mlx6 g64"},
        {WFMT_AFFINE, 6, 128, ST_BF16, "mlx6 g128"},
        {WFMT_AFFINE, 8, 32, ST_BF16, "mlx8 g32"},
        {WFMT_AFFINE, 8, 64, ST_BF16, "mlx8 g64"},
        {WFMT_AFFINE, 8, 128, ST_BF16, "mlx8 g128"},
        {WFMT_MXFP4, 4, 32, ST_U8, "mxfp4"},
        {WFMT_MXFP8, 8, 32, ST_U8, "mxfp8"},
        {WFMT_NVFP4, 4, 16, ST_U8, "nvfp4"},
    };
    /* n = 40: thread ranges of 16, 16 and 8 rows (tails of every tile width); k crosses a
     * 512-column panel and, for the float formats, leaves a 7-column tail. */
    const int64_t n = 40;
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        int64_t k = fmts[fi].group ? 640 : 647;
        struct test_mat mt;
        test_mat_make(&mt, fmts[fi].f, fmts[fi].bits, fmts[fi].group, n, k, fmts[fi].sd);
        /* rows of very different magnitudes: per-row input scaling must not leak */
        float *x = xmalloc(sizeof(float) * (size_t)(MAXM * k));
        for (int i = 0; i < MAXM; i++) {
            float mag = (float)(1 + rnd() % 1000) / 100.0f;
            for (int64_t j = 0; j < k; j++) x[i * k + j] = frand() * mag;
        }
        check_invariance(tps, &mt.w, x, fmts[fi].name, CPU_ISA_PORTABLE);
        if (cpu_isa_available(CPU_ISA_AVX2))
            check_invariance(tps, &mt.w, x, fmts[fi].name, CPU_ISA_AVX2);
        if (cpu_isa_available(CPU_ISA_AVXVNNI))
            check_invariance(tps, &mt.w, x, fmts[fi].name, CPU_ISA_AVXVNNI);
        if (cpu_isa_available(CPU_ISA_AVX512))
            check_invariance(tps, &mt.w, x, fmts[fi].name, CPU_ISA_AVX512);
        if (cpu_isa_available(CPU_ISA_AMX))
            check_invariance(tps, &mt.w, x, fmts[fi].name, CPU_ISA_AMX);
        free(x);
        test_mat_free(&mt);
    }
    for (int t = 0; t < 3; t++) tp_destroy(tps[t]);
    TEST_DONE();
}
