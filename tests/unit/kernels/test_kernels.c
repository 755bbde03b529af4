/*
 * Kernel tests: exact decodings of each weight format on hand-made codes; the portable
 * matmul against a double-precision reference; every SIMD kernel against the portable one
 * on random inputs, for every format, group size and both the gemv (small m) and GEMM
 * (large m) paths.
 */
#include <math.h>
#include <string.h>

#include "common/threadpool.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/quant.h"
#include "test_util.h"

#include "test_mat.h"

static void test_decodings(void)
{
    /* affine 4-bit: nibbles LSB first; w = scale * q + bias */
    uint32_t word[2] = {0x76543210u, 0xfedcba98u};
    uint16_t sc = f32_to_bf16(0.5f), bi = f32_to_bf16(-1.0f);
    struct qweight w = {.fmt = WFMT_AFFINE,
                        .bits = 4,
                        .group = 16,
                        .n = 1,
                        .k = 16,
                        .w = (const uint8_t *)word,
                        .row_bytes = 8,
                        .scales = &sc,
                        .biases = &bi,
                        .sdtype = ST_BF16};
    float out[16];
    quant_dequant_row(&w, 0, 0, 16, out);
    for (int i = 0; i < 16; i++) CHECK(out[i] == 0.5f * i - 1.0f, "affine4[%d] = %g", i, out[i]);

    /* affine 3-bit: a continuous bit stream; values 0..7 packed in 3 bytes */
    uint8_t b3[4] = {0}; /* q_j = j for j < 8: bits j*3.. */
    for (int j = 0; j < 8; j++)
        for (int b = 0; b < 3; b++)
            if (j >> b & 1) b3[(j * 3 + b) / 8] |= (uint8_t)(1 << ((j * 3 + b) % 8));
    uint16_t one = f32_to_bf16(1.0f), zero = 0;
    struct qweight w3 = {.fmt = WFMT_AFFINE,
                         .bits = 3,
                         .group = 8,
                         .n = 1,
                         .k = 8,
                         .w = b3,
                         .row_bytes = 3,
                         .scales = &one,
                         .biases = &zero,
                         .sdtype = ST_BF16};
    quant_dequant_row(&w3, 0, 0, 8, out);
    for (int i = 0; i < 8; i++) CHECK(out[i] == (float)i, "affine3[%d] = %g", i, out[i]);

    /* e2m1 codes and an e8m0 scale of 2^1 */
    uint32_t fp4[1] = {0xf9a87210u}; /* codes 0,1,2,7,8,10,9,15 */
    uint8_t e8 = 128;
    struct qweight w4 = {.fmt = WFMT_MXFP4,
                         .bits = 4,
                         .group = 8,
                         .n = 1,
                         .k = 8,
                         .w = (const uint8_t *)fp4,
                         .row_bytes = 4,
                         .scales = &e8,
                         .sdtype = ST_U8};
    quant_dequant_row(&w4, 0, 0, 8, out);
    const float want4[8] = {0, 1, 2, 12, -0.0f, -2, -1, -12};
    for (int i = 0; i < 8; i++)
        CHECK(out[i] == want4[i], "mxfp4[%d] = %g, want %g", i, out[i], want4[i]);

    /* e4m3: 0x38 = 1, 0x7e = 448 (largest), 0x01 = 2^-9 (smallest subnormal), 0xc0 = -2 */
    CHECK(quant_fp8_lut[0x38] == 1.0f, "fp8 0x38 = %g", quant_fp8_lut[0x38]);
    CHECK(quant_fp8_lut[0x7e] == 448.0f, "fp8 0x7e = %g", quant_fp8_lut[0x7e]);
    CHECK(quant_fp8_lut[0x01] == ldexpf(1, -9), "fp8 0x01 = %g", quant_fp8_lut[0x01]);
    CHECK(quant_fp8_lut[0xc0] == -2.0f, "fp8 0xc0 = %g", quant_fp8_lut[0xc0]);
    CHECK(isnan(quant_fp8_lut[0x7f]), "fp8 0x7f is NaN");
    CHECK(quant_e8m0(127) == 1.0f && quant_e8m0(0) == ldexpf(1, -127), "e8m0");

    /* nvfp4: e2m1 codes times an e4m3 scale (0x30 = 0.5) */
    uint8_t s16 = 0x30;
    uint32_t c16[2] = {0x00000076u, 0};
    struct qweight wn = {.fmt = WFMT_NVFP4,
                         .bits = 4,
                         .group = 16,
                         .n = 1,
                         .k = 16,
                         .w = (const uint8_t *)c16,
                         .row_bytes = 8,
                         .scales = &s16,
                         .sdtype = ST_U8};
    float o16[16];
    quant_dequant_row(&wn, 0, 0, 16, o16);
    CHECK(o16[0] == 2.0f && o16[1] == 3.0f && o16[2] == 0.0f, "nvfp4 %g %g %g", o16[0], o16[1],
          o16[2]);

    /* mxfp8 */
    uint8_t f8[4] = {0x38, 0xc0, 0x7e, 0x00};
    uint8_t e7 = 126; /* 0.5 */
    struct qweight w8 = {.fmt = WFMT_MXFP8,
                         .bits = 8,
                         .group = 4,
                         .n = 1,
                         .k = 4,
                         .w = f8,
                         .row_bytes = 4,
                         .scales = &e7,
                         .sdtype = ST_U8};
    quant_dequant_row(&w8, 0, 0, 4, out);
    CHECK(out[0] == 0.5f && out[1] == -1.0f && out[2] == 224.0f && out[3] == 0.0f, "mxfp8");
}

/* max |a - b| / max(|b|, 1) over n values */
static double rel_err(const float *a, const float *b, int64_t n)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(fabs(b[i]), 1.0);
        if (d > worst || d != d) worst = d != d ? INFINITY : d;
    }
    return worst;
}

/* max |a - b| / mag over n outputs, mag being each output's sum of |products| */
static double rel_err_mag(const float *a, const float *b, const double *mag, int64_t n)
{
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(mag[i], 1e-30);
        if (d != d) return INFINITY;
        if (d > worst) worst = d;
    }
    return worst;
}

static void test_matmul_formats(struct threadpool *tp)
{
    struct {
        enum wfmt f;
        int bits, group;
        const char *name;
    } fmts[] = {
        {WFMT_F32, 32, 0, "f32"},
        {WFMT_F16, 16, 0, "f16"},
        {WFMT_BF16, 16, 0, "bf16"},
        {WFMT_AFFINE, 2, 32, "mlx2"},
        {WFMT_AFFINE, 3, 32, "mlx3"},
        {WFMT_AFFINE, 4, 32, "mlx4"},
        {WFMT_AFFINE, 4, 64, "mlx4"},
        {WFMT_AFFINE, 4, 128, "mlx4"},
        {WFMT_AFFINE, 5, 64, "mlx5"},
        {WFMT_AFFINE, 6, 64, "mlx6"},
        {WFMT_AFFINE, 8, 32, "mlx8"},
        {WFMT_AFFINE, 8, 64, "mlx8"},
        {WFMT_AFFINE, 8, 128, "mlx8"},
        {WFMT_AFFINE, 2, 128, "mlx2"},
        {WFMT_MXFP4, 4, 32, "mxfp4"},
        {WFMT_MXFP8, 8, 32, "mxfp8"},
        {WFMT_NVFP4, 4, 16, "nvfp4"},
        /* k = 576 below: an odd number of 64-column chunks (the 512-bit 4-bit tiles pair
         * them), and groups of 3 chunks */
        {WFMT_AFFINE, 4, 64, "mlx4"},
        {WFMT_AFFINE, 4, 192, "mlx4"},
        {WFMT_AFFINE, 8, 192, "mlx8"},
        {WFMT_AFFINE, 8, 96, "mlx8"},
    };
    const size_t odd_k = sizeof fmts / sizeof fmts[0] - 4; /* the entries from here */
    const int ms[] = {1, 2, 5, 8, 9, 13, 40};
    const int64_t n = 72; /* n not a multiple of the 16-wide tiles: edge paths run */
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        const int64_t k = fi < odd_k ? 512 : 576;
        struct test_mat m;
        test_mat_make(&m, fmts[fi].f, fmts[fi].bits, fmts[fi].group, n, k, ST_BF16);
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            int rows = ms[mi];
            float *x = xmalloc(sizeof(float) * (size_t)(rows * k));
            for (int64_t i = 0; i < rows * k; i++) x[i] = frand();
            float *yp = xmalloc(sizeof(float) * (size_t)(rows * n));
            float *ys = xmalloc(sizeof(float) * (size_t)(rows * n));
            float *yr = xmalloc(sizeof(float) * (size_t)(rows * n));
            double *mag = xmalloc(sizeof(double) * (size_t)(rows * n));
            float *row = xmalloc(sizeof(float) * (size_t)k);
            for (int64_t r = 0; r < n; r++) {
                quant_dequant_row(&m.w, r, 0, k, row);
                for (int i = 0; i < rows; i++) {
                    double s = 0, a = 0;
                    for (int64_t j = 0; j < k; j++) {
                        s += (double)row[j] * x[i * k + j];
                        a += fabs((double)row[j] * x[i * k + j]);
                    }
                    yr[i * n + r] = (float)s;
                    mag[i * n + r] = a;
                }
            }
            cpu_isa_set(CPU_ISA_PORTABLE);
            cpu_matmul(tp, yp, x, &m.w, rows);
            /* Float32 sums of k = 512 products in different orders: the error of each
             * output is bounded by about k * 2^-24 * sum |w_j x_j| (3e-5 of it); in practice
             * it is near sqrt(k) * 2^-24 (1.4e-6). The bound checked is 1e-5 of sum |w x|. */
            double ep = rel_err_mag(yp, yr, mag, rows * n);
            CHECK(ep < 1e-5, "%s g%d m=%d: portable vs reference rel err %g", fmts[fi].name,
                  fmts[fi].group, rows, ep);
            if (cpu_isa_available(CPU_ISA_AVX2)) {
                cpu_isa_set(CPU_ISA_AVX2);
                cpu_matmul(tp, ys, x, &m.w, rows);
                double es = rel_err_mag(ys, yp, mag, rows * n);
                CHECK(es < 1e-5, "%s g%d m=%d: avx2 vs portable rel err %g", fmts[fi].name,
                      fmts[fi].group, rows, es);
                /* AVX-VNNI changes only how exact integer sums are formed: same bits */
                if (cpu_isa_available(CPU_ISA_AVXVNNI)) {
                    cpu_isa_set(CPU_ISA_AVXVNNI);
                    cpu_matmul(tp, yp, x, &m.w, rows);
                    CHECK(!memcmp(yp, ys, sizeof(float) * (size_t)(rows * n)),
                          "%s g%d m=%d: avxvnni differs from avx2", fmts[fi].name, fmts[fi].group,
                          rows);
                }
                /* The AVX-512 table computes the AVX2 table's arithmetic: same bits */
                if (cpu_isa_available(CPU_ISA_AVX512)) {
                    cpu_isa_set(CPU_ISA_AVX512);
                    cpu_matmul(tp, yp, x, &m.w, rows);
                    CHECK(!memcmp(yp, ys, sizeof(float) * (size_t)(rows * n)),
                          "%s g%d m=%d: avx512 differs from avx2", fmts[fi].name, fmts[fi].group,
                          rows);
                }
                /* AMX changes only the fast bf16 products, off here: same bits */
                if (cpu_isa_available(CPU_ISA_AMX)) {
                    cpu_isa_set(CPU_ISA_AMX);
                    cpu_matmul(tp, yp, x, &m.w, rows);
                    CHECK(!memcmp(yp, ys, sizeof(float) * (size_t)(rows * n)),
                          "%s g%d m=%d: amx differs from avx2", fmts[fi].name, fmts[fi].group,
                          rows);
                }
            }
            free(x);
            free(yp);
            free(ys);
            free(yr);
            free(mag);
            free(row);
        }
        test_mat_free(&m);
    }
}

static void test_vector_kernels(void)
{
    if (!cpu_isa_available(CPU_ISA_AVX2)) {
        printf("no AVX2 on this CPU: SIMD comparisons skipped\n");
        return;
    }
    for (int n = 1; n < 200; n += 13) {
        float a[200], b[200], y1[200], y2[200];
        for (int i = 0; i < n; i++) a[i] = frand(), b[i] = frand(), y1[i] = y2[i] = frand();
        cpu_isa_set(CPU_ISA_PORTABLE);
        float dp = cpu_dot(a, b, n);
        cpu_axpy(y1, 0.37f, a, n);
        cpu_isa_set(CPU_ISA_AVX2);
        float ds = cpu_dot(a, b, n);
        cpu_axpy(y2, 0.37f, a, n);
        CHECK(fabsf(dp - ds) < 1e-5f * n, "dot n=%d: %g vs %g", n, dp, ds);
        CHECK(rel_err(y2, y1, n) < 1e-6, "axpy n=%d", n);
    }
}

static void test_elementwise(void)
{
    /* RMSNorm of [3, 4] with unit weights: x / sqrt(mean(x^2) + eps) */
    float x[2] = {3, 4}, w[2] = {1, 2}, o[2];
    cpu_rms_norm(o, x, w, 1, 2, 0);
    float r = sqrtf(12.5f);
    CHECK(fabsf(o[0] - 3 / r) < 1e-6f && fabsf(o[1] - 8 / r) < 1e-6f, "rms_norm %g %g", o[0], o[1]);
    /* rope by 90 degrees maps (a, b) -> (-b, a) */
    float v[4] = {1, 2, 3, 4}, c[2] = {0, 0}, s[2] = {1, 1};
    cpu_rope(v, 1, 1, 4, c, s);
    CHECK(v[0] == -3 && v[1] == -4 && v[2] == 1 && v[3] == 2, "rope %g %g %g %g", v[0], v[1], v[2],
          v[3]);
    float g[3] = {0, 1, -2}, u[3] = {1, 1, 1}, out[3];
    cpu_silu_mul(out, g, u, 3);
    CHECK(out[0] == 0 && fabsf(out[1] - 0.7310586f) < 1e-6f && fabsf(out[2] + 0.2384058f) < 1e-6f,
          "silu %g %g %g", out[0], out[1], out[2]);
    cpu_gelu_tanh_mul(out, g, u, 3);
    CHECK(out[0] == 0 && fabsf(out[1] - 0.8411920f) < 1e-6f && fabsf(out[2] + 0.0454023f) < 1e-6f,
          "gelu %g %g %g", out[0], out[1], out[2]);
    float sc[2] = {100, -1};
    cpu_softcap(sc, 2, 30);
    CHECK(fabsf(sc[0] - 30 * tanhf(100.0f / 30)) < 1e-5f &&
              fabsf(sc[1] - 30 * tanhf(-1.0f / 30)) < 1e-6f,
          "softcap");
}

static void test_threadpool(void)
{
    /* every element written exactly once across uneven ranges */
    for (int threads = 1; threads <= 3; threads++) {
        struct threadpool *tp = tp_create(threads);
        for (long n = 0; n < 50; n += 7) {
            long cover = 0;
            for (int ith = 0; ith < threads; ith++) {
                long lo, hi;
                tp_range(n, ith, threads, 4, &lo, &hi);
                CHECK(lo <= hi && lo % 4 == 0, "range n=%ld ith=%d", n, ith);
                cover += hi - lo;
            }
            CHECK(cover == n, "ranges of %ld cover %ld", n, cover);
        }
        tp_destroy(tp);
    }
}

/* The SIMD decoders of the formats multiplied as decoded floats give each weight exactly as
 * quant_dequant_row does: with one-hot rows of x every output is one weight (its product
 * with 1, plus zeros), for the decode (m = 1) and many-row paths of every table. */
static void test_decode_exact(struct threadpool *tp)
{
    struct {
        enum wfmt f;
        int bits, group;
    } fmts[] = {{WFMT_AFFINE, 2, 32},  {WFMT_AFFINE, 3, 64},  {WFMT_AFFINE, 5, 32},
                {WFMT_AFFINE, 6, 128}, {WFMT_AFFINE, 2, 128}, {WFMT_MXFP4, 4, 32},
                {WFMT_NVFP4, 4, 16},   {WFMT_MXFP8, 8, 32}};
    const int64_t n = 24, k = 256;
    float *x = xmalloc(sizeof(float) * (size_t)(k * k));
    float *y = xmalloc(sizeof(float) * (size_t)(k * n));
    float *row = xmalloc(sizeof(float) * (size_t)k);
    for (int64_t i = 0; i < k * k; i++) x[i] = i / k == i % k ? 1.0f : 0.0f;
    for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
        struct test_mat m;
        test_mat_make(&m, fmts[fi].f, fmts[fi].bits, fmts[fi].group, n, k, ST_BF16);
        for (int isa = CPU_ISA_PORTABLE; isa <= CPU_ISA_BEST; isa++) {
            if (!cpu_isa_available((enum cpu_isa)isa)) continue;
            cpu_isa_set((enum cpu_isa)isa);
            int bad = 0;
            for (int rows = 1; rows <= k && !bad; rows += k - 1) { /* 1, then k */
                cpu_matmul(tp, y, x, &m.w, rows);
                for (int64_t r = 0; r < n && !bad; r++) {
                    quant_dequant_row(&m.w, r, 0, k, row);
                    for (int j = 0; j < rows && !bad; j++)
                        if (y[j * n + r] != row[j]) {
                            CHECK(0, "%s bits %d g%d m=%d: w[%lld][%d] = %.9g, decoded %.9g",
                                  cpu_isa_name((enum cpu_isa)isa), fmts[fi].bits, fmts[fi].group,
                                  rows, (long long)r, j, y[j * n + r], row[j]);
                            bad = 1;
                        }
                }
            }
        }
        test_mat_free(&m);
    }
    free(x);
    free(y);
    free(row);
}

/* PAGODA_CPU_ISA: names round-trip; a lower table is taken as asked; an unknown name or one
 * the CPU lacks gives the best table with a warning naming it. */
static void test_isa_choose(void)
{
    enum cpu_isa best = CPU_ISA_PORTABLE, isa;
    for (int i = CPU_ISA_PORTABLE; i <= CPU_ISA_BEST; i++) {
        CHECK(!cpu_isa_parse(cpu_isa_name((enum cpu_isa)i), &isa) && isa == (enum cpu_isa)i,
              "parse %s", cpu_isa_name((enum cpu_isa)i));
        if (cpu_isa_available((enum cpu_isa)i)) best = (enum cpu_isa)i;
    }
    CHECK(cpu_isa_parse("avx-512", &isa) == -1, "parse rejects avx-512");
    char warn[160];
    CHECK(cpu_isa_choose(NULL, warn, sizeof warn) == best && !warn[0], "default is %s",
          cpu_isa_name(best));
    CHECK(cpu_isa_choose("", warn, sizeof warn) == best && !warn[0], "empty is the default");
    CHECK(cpu_isa_choose("portable", warn, sizeof warn) == CPU_ISA_PORTABLE && !warn[0],
          "portable forced");
    isa = cpu_isa_choose("bogus", warn, sizeof warn);
    CHECK(isa == best && strstr(warn, "bogus") && strstr(warn, cpu_isa_name(best)),
          "unknown name: %s", warn);
    for (int i = CPU_ISA_AVX2; i <= CPU_ISA_BEST; i++) {
        const char *name = cpu_isa_name((enum cpu_isa)i);
        isa = cpu_isa_choose(name, warn, sizeof warn);
        if (cpu_isa_available((enum cpu_isa)i))
            CHECK(isa == (enum cpu_isa)i && !warn[0], "%s forced", name);
        else
            CHECK(isa == best && strstr(warn, name) && strstr(warn, cpu_isa_name(best)),
                  "%s unavailable: %s", name, warn);
    }
    /* setting a table the CPU lacks takes the best one below it */
    cpu_isa_set(CPU_ISA_BEST);
    CHECK(cpu_isa_get() == best, "set %s gives %s", cpu_isa_name(CPU_ISA_BEST),
          cpu_isa_name(cpu_isa_get()));
    if (!cpu_isa_available(CPU_ISA_AVX512))
        printf("no AVX-512 (F/BW/VL/VNNI/BF16) on this CPU or build: avx512 comparisons "
               "skipped\n");
    if (!cpu_isa_available(CPU_ISA_AVXVNNI))
        printf("no AVX-VNNI on this CPU or build: avxvnni comparisons skipped\n");
    if (!cpu_isa_available(CPU_ISA_AMX))
        printf("no AMX (TILE/BF16, with the kernel's leave) on this CPU or build: amx "
               "comparisons skipped\n");
}

int main(void)
{
    cpu_kernels_init();
    /* the tables are compared bitwise: the fast many-row products (test_gemm.c) are off */
    cpu_batch_invariant_set(1);
    struct threadpool *tp = tp_create(2);
    test_isa_choose();
    test_decodings();
    test_matmul_formats(tp);
    test_decode_exact(tp);
    test_vector_kernels();
    test_elementwise();
    test_threadpool();
    tp_destroy(tp);
    TEST_DONE();
}
