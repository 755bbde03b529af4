/*
 * The fast many-row products (kernels/cpu/gemm.h) against a double-precision reference
 * from the decoded weights and the exact inputs, on every instruction set the machine has,
 * on 1, 2 and 3 threads, for odd shapes: m not a multiple of the tile height, n not a
 * multiple of 16 or 32, k across panel and group boundaries.
 *
 * The affine kernels run on the AVX2, AVX-VNNI and AVX-512 tables (the 256-bit ones with
 * vpmaddubsw/vpmaddwd or vpdpbusd, for 4 and 8 bits; 2, 3, 5 and 6 bits from AVX-512 up) and AMX
 * (TDPBUSD, groups of 64 and 128: bitwise the AVX-512 kernel's), bf16 on AVX-512 (weights
 * widened to float32, float32 x) and AMX (TDPBF16PS); with m up to 300 over k = 2048, more x rows
 * than one pass of an AMX kernel takes; mxfp4, nvfp4 and mxfp8 on the 256-bit tiles under every x86
 * table, for m up to 300. Tolerances follow from the input rounding, per output (i, r) with w = W
 * row r: int8 activations (affine): |y - ref| <= sum over groups g of dx_g / 2 * sum_g |w_j| (dx_g
 * = max|x_g| / 127: each xq is off by at most half a step), plus float32 accumulation, bounded by
 * 1e-5 * sum |w_j x_j| (mxfp4, nvfp4 too: their integer sums are exact); mxfp8 adds its int16
 * weight rounding, at most 2^-14 of the group's largest |w| per value: 2^-14 * max_g |w_j| * sum_g
 * |x_j|; bf16 activations (AMX): |y - ref| <= 2^-9 * sum |w_j x_j| (round to nearest even), plus
 *     the same accumulation term; bf16 weights on AVX-512 keep x in float32: the
 *     accumulation term alone.
 * Paths without the fast kernels (and batch-invariant mode) must give bitwise the rows
 * computed alone, and m <= 8 stays on the invariant kernels in either mode.
 */
#include <math.h>
#include <string.h>

#include "common/threadpool.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quant.h"
#include "test_util.h"

#define TEST_SEED 0x5bd1e9955bd1e995ull
#include "test_mat.h"

static double worst_ratio[CPU_ISA_BEST + 1]; /* the largest error / bound per table */

static void check_case(struct threadpool *tps[3], enum wfmt f, int bits, int group,
                       enum st_dtype sd, int m, int64_t n, int64_t k)
{
    struct test_mat mt;
    test_mat_make(&mt, f, bits, group, n, k, sd);
    const struct qweight *w = &mt.w;
    float *x = xmalloc(sizeof(float) * (size_t)(m * k));
    for (int64_t i = 0; i < m * k; i++) x[i] = frand() * (i % 7 == 0 ? 4.0f : 1.0f);
    float *wd = xmalloc(sizeof(float) * (size_t)(n * k));
    for (int64_t r = 0; r < n; r++) quant_dequant_row(w, r, 0, k, wd + r * k);
    float *y = xmalloc(sizeof(float) * (size_t)(m * n));
    float *alone = xmalloc(sizeof(float) * (size_t)(m * n));
    enum gemm_kind kind = gemm_kind_of(w);
    char name[64];
    char fname[16];
    snprintf(name, sizeof name, "%s bits=%d g=%d m=%d n=%lld k=%lld",
             qweight_format_name(w, fname, sizeof fname), bits, group, m, (long long)n,
             (long long)k);
    for (int isa = CPU_ISA_PORTABLE; isa <= CPU_ISA_BEST; isa++) {
        if (!cpu_isa_available((enum cpu_isa)isa)) continue;
        cpu_isa_set((enum cpu_isa)isa);
        cpu_batch_invariant_set(1);
        for (int i = 0; i < m; i++) cpu_matmul(tps[0], alone + i * n, x + i * k, w, 1);
        for (int inv = 0; inv < 2; inv++) {
            cpu_batch_invariant_set(inv);
            int fast = !inv && m >= GEMM_MIN_M &&
                       (kind == GEMM_MX     ? isa != CPU_ISA_PORTABLE
                        : kind == GEMM_Q8   ? isa >= CPU_ISA_AVX512 || (isa != CPU_ISA_PORTABLE &&
                                                                      (bits == 4 || bits == 8))
                        : kind == GEMM_BF16 ? isa >= CPU_ISA_AVX512
                                            : 0);
            for (int t = 0; t < 3; t++) {
                memset(y, 0xff, sizeof(float) * (size_t)(m * n));
                cpu_matmul(tps[t], y, x, w, m);
                int bad = 0;
                for (int i = 0; i < m && !bad; i++)
                    for (int64_t r = 0; r < n && !bad; r++) {
                        float got = y[i * n + r];
                        if (!fast) {
                            bad = memcmp(&got, &alone[i * n + r], sizeof got) != 0;
                            CHECK(!bad, "%s %s inv=%d threads=%d: y[%d][%lld] = %.9g, alone %.9g",
                                  name, cpu_isa_name((enum cpu_isa)isa), inv, t + 1, i,
                                  (long long)r, got, alone[i * n + r]);
                            continue;
                        }
                        const float *xi = x + i * k, *wr = wd + r * k;
                        double ref = 0, mag = 0, bound = 0;
                        for (int64_t j = 0; j < k; j++) {
                            ref += (double)wr[j] * xi[j];
                            mag += fabs((double)wr[j] * xi[j]);
                        }
                        if (kind == GEMM_Q8 || kind == GEMM_MX)
                            for (int64_t g = 0; g < k / group; g++) {
                                double amax = 0, sw = 0, wmax = 0, sx = 0;
                                for (int64_t j = g * group; j < (g + 1) * group; j++) {
                                    amax = fmax(amax, fabs(xi[j]));
                                    sw += fabs(wr[j]);
                                    wmax = fmax(wmax, fabs(wr[j]));
                                    sx += fabs(xi[j]);
                                }
                                bound += amax / 127.0 / 2.0 * sw;
                                if (f == WFMT_MXFP8) bound += ldexp(wmax, -14) * sx;
                            }
                        else if (isa != CPU_ISA_AVX512) /* AMX rounds x to bf16 */
                            bound = mag / 512.0;
                        bound += 1e-5 * mag;
                        double err = fabs(got - ref);
                        if (err / bound > worst_ratio[isa]) worst_ratio[isa] = err / bound;
                        bad = !(err <= bound);
                        CHECK(!bad,
                              "%s %s threads=%d: y[%d][%lld] = %.9g, reference %.9g, bound %.3g",
                              name, cpu_isa_name((enum cpu_isa)isa), t + 1, i, (long long)r, got,
                              ref, bound);
                    }
            }
        }
    }
    cpu_batch_invariant_set(0);
    /* AMX's affine products (groups of 64 or a multiple) are the AVX-512 kernel's, bit for bit */
    if (kind == GEMM_Q8 && group % 64 == 0 && m >= GEMM_MIN_M && cpu_isa_available(CPU_ISA_AMX)) {
        cpu_isa_set(CPU_ISA_AVX512);
        cpu_matmul(tps[1], alone, x, w, m);
        cpu_isa_set(CPU_ISA_AMX);
        for (int t = 0; t < 3; t++) {
            memset(y, 0xff, sizeof(float) * (size_t)(m * n));
            cpu_matmul(tps[t], y, x, w, m);
            CHECK(!memcmp(y, alone, sizeof(float) * (size_t)(m * n)),
                  "%s threads=%d: amx differs from avx512", name, t + 1);
        }
    }
    free(x);
    free(wd);
    free(y);
    free(alone);
    test_mat_free(&mt);
}

int main(void)
{
    cpu_kernels_init();
    enum cpu_isa best = cpu_isa_get();
    struct threadpool *tps[3] = {tp_create(1), tp_create(2), tp_create(3)};
    static const int ms[] = {8, 9, 13, 17, 33};
    static const int64_t shapes[][2] = {{40, 64}, {100, 576}, {16, 1024}, {70, 128}};
    static const struct {
        enum wfmt f;
        int bits, group;
        enum st_dtype sd;
    } fmts[] = {
        {WFMT_BF16, 16, 0, ST_U8},
        {WFMT_AFFINE, 4, 32, ST_BF16},
        {WFMT_AFFINE, 4, 64, ST_BF16},
        {WFMT_AFFINE, 4, 128, ST_BF16},
        {WFMT_AFFINE, 4, 64, ST_F16},
        {WFMT_AFFINE, 8, 32, ST_BF16},
        {WFMT_AFFINE, 8, 64, ST_BF16},
        {WFMT_AFFINE, 8, 128, ST_F32},
        /* 2, 3, 5 and 6 bits: fast from AVX-512 up, the invariant path on AVX2 in both modes */
        {WFMT_AFFINE, 3, 64, ST_BF16},
        {WFMT_AFFINE, 2, 32, ST_BF16},
        {WFMT_AFFINE, 5, 64, ST_F16},
        {WFMT_AFFINE, 6, 128, ST_BF16},
    };
    for (size_t fi = 0; fi < sizeof fmts / sizeof *fmts; fi++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            if (fmts[fi].group && shapes[si][1] % fmts[fi].group) continue;
            for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
                check_case(tps, fmts[fi].f, fmts[fi].bits, fmts[fi].group, fmts[fi].sd, ms[mi],
                           shapes[si][0], shapes[si][1]);
        }
    /* bf16 over more x rows than one pass of the AMX kernel takes (256 at k = 2048), n not a
     * multiple of 32 */
    check_case(tps, WFMT_BF16, 16, 0, ST_U8, 300, 70, 2048);
    check_case(tps, WFMT_AFFINE, 4, 64, ST_BF16, 300, 70, 2048);
    check_case(tps, WFMT_AFFINE, 8, 128, ST_F16, 100, 40, 4096);
    /* The microscaled float formats: m from the smallest fast product to a long prefill,
     * k an odd number of 32-column blocks, within one panel and across two. */
    static const int mx_ms[] = {8, 9, 16, 64, 300};
    static const int64_t mx_shapes[][2] = {{40, 96}, {70, 160}, {33, 1056}};
    static const struct {
        enum wfmt f;
        int bits, group;
    } mx[] = {{WFMT_MXFP4, 4, 32}, {WFMT_NVFP4, 4, 16}, {WFMT_MXFP8, 8, 32}};
    for (size_t fi = 0; fi < sizeof mx / sizeof *mx; fi++)
        for (size_t si = 0; si < sizeof mx_shapes / sizeof *mx_shapes; si++)
            for (size_t mi = 0; mi < sizeof mx_ms / sizeof *mx_ms; mi++)
                check_case(tps, mx[fi].f, mx[fi].bits, mx[fi].group, ST_U8, mx_ms[mi],
                           mx_shapes[si][0], mx_shapes[si][1]);
    for (int isa = CPU_ISA_AVX2; isa <= CPU_ISA_BEST; isa++)
        if (cpu_isa_available((enum cpu_isa)isa))
            printf("fast kernels on %s: largest error / bound %.3f\n",
                   cpu_isa_name((enum cpu_isa)isa), worst_ratio[isa]);
    cpu_isa_set(best);
    for (int t = 0; t < 3; t++) tp_destroy(tps[t]);
    TEST_DONE();
}
