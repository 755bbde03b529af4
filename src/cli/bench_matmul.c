/*
 * bench matmul: times one CPU matrix product y = x . W^T (random bf16, MLX 4- or 8-bit group-64,
 * mxfp4, mxfp8, nvfp4 or ternary (BitNet) weights, the shapes of a model's layers) for a given
 * number of x rows, best of repeated runs: the kernel alone, without the rest of a forward pass.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "common/threadpool.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float next_f(void)
{
    return (float)(next_u32() % 2000001) / 1000000.0f - 1.0f;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: pagoda bench matmul [--format bf16|mlx4|mlx8|mxfp4|mxfp8|nvfp4|ternary] "
               "[--rows M]\n"
               "         [--n N] [--k K] [--threads T] [--reps R] [--batch-invariant]\n"
               "  --rows M     x rows (default 16)\n"
               "  --n N, --k K weight rows and columns (default 8192 x 2048; K a multiple of 64)\n"
               "  --threads T  (default 2)   --reps R  timed runs, best reported (default 20)\n");
}

int cli_bench_matmul(int argc, char **argv)
{
    const char *fmt = "bf16";
    long m = 16, n = 8192, k = 2048, th = 2, reps = 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--batch-invariant")) {
            cpu_batch_invariant_set(1);
            continue;
        }
        static const char *const opts[] = {"--format", "--rows",    "--n",
                                           "--k",      "--threads", "--reps"};
        int known = 0;
        for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++) known |= !strcmp(a, opts[o]);
        if (!known) {
            fprintf(stderr, "pagoda bench matmul: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (!(v = arg_value(argc, argv, &i))) return 2;
        int bad = 0;
        if (!strcmp(a, "--format"))
            fmt = v;
        else if (!strcmp(a, "--rows"))
            bad = arg_int(a, v, 1, 4096, &m);
        else if (!strcmp(a, "--n"))
            bad = arg_int(a, v, 1, 1 << 20, &n);
        else if (!strcmp(a, "--k"))
            bad = arg_int(a, v, 64, 1 << 16, &k);
        else if (!strcmp(a, "--threads"))
            bad = arg_int(a, v, 1, 256, &th);
        else
            bad = arg_int(a, v, 1, 100000, &reps);
        if (bad) return 2;
    }
    int q4 = !strcmp(fmt, "mlx4"), q8 = !strcmp(fmt, "mlx8"), tern = !strcmp(fmt, "ternary");
    int mx4 = !strcmp(fmt, "mxfp4"), mx8 = !strcmp(fmt, "mxfp8"), nv4 = !strcmp(fmt, "nvfp4");
    if (!q4 && !q8 && !tern && !mx4 && !mx8 && !nv4 && strcmp(fmt, "bf16")) {
        fprintf(stderr, "pagoda bench matmul: --format must be bf16, mlx4, mlx8, mxfp4, mxfp8, "
                        "nvfp4 or ternary\n");
        return 2;
    }
    if (k % 64) {
        fprintf(stderr, "pagoda bench matmul: --k must be a multiple of 64\n");
        return 2;
    }
    cpu_kernels_init();
    struct qweight w = {0};
    w.n = n;
    w.k = k;
    size_t nk = (size_t)n * (size_t)k, ng = nk / 64;
    uint16_t *sc = NULL, *bi = NULL;
    uint8_t *data, *sc8 = NULL;
    if (q4 || q8) {
        w.fmt = WFMT_AFFINE;
        w.bits = q4 ? 4 : 8;
        w.group = 64;
        w.sdtype = ST_BF16;
        w.row_bytes = (size_t)k * (size_t)w.bits / 8;
        data = xmalloc((size_t)n * w.row_bytes);
        for (size_t i = 0; i < (size_t)n * w.row_bytes; i++) data[i] = (uint8_t)next_u32();
        sc = xmalloc(ng * 2);
        bi = xmalloc(ng * 2);
        for (size_t i = 0; i < ng; i++) {
            sc[i] = f32_to_bf16(0.01f + 0.001f * next_f());
            bi[i] = f32_to_bf16(0.05f * next_f());
        }
        w.scales = sc;
        w.biases = bi;
    } else if (mx4 || mx8 || nv4) {
        /* random codes (no e4m3 NaN), scales near 1: e8m0 per 32 columns, nvfp4's e4m3 per 16 */
        w.fmt = mx4 ? WFMT_MXFP4 : mx8 ? WFMT_MXFP8 : WFMT_NVFP4;
        w.bits = mx8 ? 8 : 4;
        w.group = nv4 ? 16 : 32;
        w.sdtype = ST_U8;
        w.row_bytes = (size_t)k * (size_t)w.bits / 8;
        data = xmalloc((size_t)n * w.row_bytes);
        for (size_t i = 0; i < (size_t)n * w.row_bytes; i++) {
            data[i] = (uint8_t)next_u32();
            if (mx8 && (data[i] & 0x7f) == 0x7f) data[i] ^= 1;
        }
        size_t groups = nk / (size_t)w.group;
        sc8 = xmalloc(groups);
        for (size_t i = 0; i < groups; i++)
            sc8[i] = nv4 ? (uint8_t)(0x30 + next_u32() % 16) : (uint8_t)(120 + next_u32() % 8);
        w.scales = sc8;
    } else if (tern) { /* random codes 0..2 (value + 1), four a byte */
        w.fmt = WFMT_TERNARY;
        w.bits = 2;
        w.row_bytes = qweight_ternary_row_bytes(k);
        w.t_div = w.t_mul = 1.0f;
        data = xmalloc((size_t)n * w.row_bytes);
        for (size_t i = 0; i < (size_t)n * w.row_bytes; i++) {
            uint32_t r = next_u32();
            data[i] = (uint8_t)(r % 3 | (r / 3 % 3) << 2 | (r / 9 % 3) << 4 | (r / 27 % 3) << 6);
        }
    } else {
        w.fmt = WFMT_BF16;
        w.bits = 16;
        w.row_bytes = (size_t)k * 2;
        data = xmalloc(nk * 2);
        for (size_t i = 0; i < nk; i++) ((uint16_t *)data)[i] = f32_to_bf16(next_f());
    }
    w.w = data;
    float *x = xmalloc(sizeof(float) * (size_t)m * (size_t)k);
    float *y = xmalloc(sizeof(float) * (size_t)m * (size_t)n);
    for (size_t i = 0; i < (size_t)m * (size_t)k; i++) x[i] = next_f();
    struct threadpool *tp = tp_create((int)th);
    cpu_matmul(tp, y, x, &w, (int)m); /* warm-up */
    double best = 1e30;
    for (long r = 0; r < reps; r++) {
        double t = util_now();
        cpu_matmul(tp, y, x, &w, (int)m);
        t = util_now() - t;
        if (t < best) best = t;
    }
    double flop = 2.0 * (double)m * (double)n * (double)k;
    printf("matmul %s %ld x %ld, %ld rows, %ld threads (%s): best %.3f ms, %.1f GFLOP/s, "
           "weights %.2f GB/s\n",
           fmt, n, k, m, th, cpu_isa_name(cpu_isa_get()), best * 1e3, flop / best * 1e-9,
           (double)qweight_bytes(&w) / best * 1e-9);
    tp_destroy(tp);
    free(x);
    free(y);
    free(data);
    free(sc);
    free(bi);
    free(sc8);
    return 0;
}
