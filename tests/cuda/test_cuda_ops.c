/*
 * CUDA backend against the CPU backend, operation by operation, on fresh random inputs.
 * Each comparison is the norm-wise relative error |cuda - cpu| / |cpu| with a bound per
 * operation (stated next to each check). Matrix products are compared with a float64
 * product of the rows decoded by the CPU's reference decoder (kernels/cpu/quant.c):
 *   - exact decodes and copies (embed, add, add_bias, gather_rows, argmax): 1e-6 or equal;
 *   - float32 arithmetic in another order (norms, rope, activations, soft-capping): 1e-5;
 *     matrix-vector products (m <= 8) against the float64 product: 3e-5;
 *   - tensor-core products with bf16 operands (m > 8; bf16 weights from m = 2): 1e-2;
 *     affine 4-bit at m = 1 on tensor cores (x rounded to fp16): 2e-3;
 *   - attention (bf16 KV rows; inputs pre-rounded to bf16 so both sides see equal keys
 *     and values; fast exponentials): 1e-4 for the float32 kernel, 1e-2 for the
 *     tensor-core kernels (queries and probabilities rounded to bf16 as operands);
 *   - sampling: the token the definition of backend_ops.sample gives, computed in double,
 *     and exactly the host sampler's token (model/sampler.h: the kernel's arithmetic; only
 *     CUDA's expf, within 2 ulp of glibc's, could tell them apart, where a draw or a top-p
 *     threshold falls within those few units of a boundary: about 1 draw in 10^5 on flat
 *     rows of 128k candidates, so none is expected on these fixed rows and draws).
 * Sections (named on the command line after the test data folder; none: all): the default
 * backend (its shapes reach every one-row 4-bit kernel: the streaming one in 16- and 8-row
 * tiles, the ring one for k not a multiple of 256, the register one for groups of 256), then
 * each switch in a backend of its own with only its variable set: attn-check
 * (backend_ops.attn_check over every head size), attention (the default's choice per step
 * over every case, head sizes 2 to 512), attention-simt / attention-tc (PAGODA_CUDA_ATTN=simt:
 * the float32 kernel for every step; tc: the tile kernel wherever the head size allows),
 * attention-invariant (PAGODA_CUDA_BATCH_INVARIANT=1: the float32 kernel in fixed key ranges,
 * and a token's rows equal alone and in a batch), sample (PAGODA_CUDA_SAMPLE=1, the default),
 * no-fuse (PAGODA_CUDA_FUSE=0: every operation in a launch of its own, rope and the KV store
 * included), invariant (PAGODA_CUDA_BATCH_INVARIANT=1: every product through the
 * matrix-vector kernels, 8 rows a launch), decode-layers (whole decode layers: one warp a
 * pair, ranges merged through global memory), stream (the one-row 16-bit products at the
 * 8B widths), hybrid (the operations of the hybrid and MoE families, then their layers over
 * prefill and decode steps: ops_hybrid.h, which states its bounds) and hybrid-invariant (the
 * same with PAGODA_CUDA_BATCH_INVARIANT=1) and kv-formats (the KV cache formats: the head-block
 * writer and attention over them, ops_kvq.h, which states its bounds) and ternary / ternary-no-fuse
 * (BitNet's ternary products and ReLU^2, and its layer tail, in the default backend and with
 * PAGODA_CUDA_FUSE=0: ops_ternary.h, which states its bounds). Every output buffer is
 * poisoned with NaN before the CUDA run, so unwritten elements fail. Without a GPU the test prints
 * "no GPU: not run" and exits 77 (skipped).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/quant.h"
#include "model/backend.h"
#include "model/sampler.h"
#include "test_util.h"

#include "test_mat.h"

static struct backend cpu, gpu;

static float *rvec(size_t n)
{
    float *v = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) v[i] = frand();
    return v;
}

/* Device copy of host floats. */
static float *dev(const float *h, size_t n)
{
    float *d = gpu.ops->alloc(gpu.ctx, sizeof(float) * (n ? n : 1));
    if (n) gpu.ops->upload(gpu.ctx, d, h, sizeof(float) * n);
    return d;
}

/* A device buffer of n floats filled with NaN. */
static float *poisoned(size_t n)
{
    float *h = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    float *d = dev(h, n);
    free(h);
    return d;
}

static float *back(const float *d, size_t n)
{
    float *h = xmalloc(sizeof(float) * (n ? n : 1));
    gpu.ops->download(gpu.ctx, h, d, sizeof(float) * n);
    return h;
}

static double rel_err(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) && isfinite(ref[i])) return INFINITY;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- random weights of every format ---- */

/* A random matrix (test_mat.h) and its copy prepared for the GPU. */
struct mat {
    struct test_mat h;
    struct qweight w, wg; /* host (CPU backend) and prepared for the GPU */
};

static void mat_make(struct mat *m, enum wfmt fmt, int bits, int group, int64_t n, int64_t k)
{
    test_mat_make(&m->h, fmt, bits, group, n, k, ST_BF16);
    m->w = m->wg = m->h.w;
    struct err e = {0};
    CHECK(gpu.ops->weight_prepare(gpu.ctx, &m->wg, &e) == 0, "weight_prepare: %s", e.msg);
}

static void mat_free(struct mat *m)
{
    test_mat_free(&m->h);
}

/* y[i, r] = sum_c W[r, c] x[i, c] in float64 over the reference decode of W. */
static void mm_ref(const struct qweight *w, const float *x, int m, float *y)
{
    float *row = xmalloc(sizeof(float) * (size_t)w->k);
    for (int64_t r = 0; r < w->n; r++) {
        quant_dequant_row(w, r, 0, w->k, row);
        for (int i = 0; i < m; i++) {
            double acc = 0;
            for (int64_t c = 0; c < w->k; c++) acc += (double)row[c] * x[(size_t)i * w->k + c];
            y[(size_t)i * w->n + r] = (float)acc;
        }
    }
    free(row);
}

struct fmt_case {
    enum wfmt fmt;
    int bits, group;
    int64_t n, k;
};

static const struct fmt_case fmts[] = {
    {WFMT_F32, 32, 0, 70, 100},
    {WFMT_F16, 16, 0, 96, 256},
    {WFMT_BF16, 16, 0, 200, 512},
    {WFMT_BF16, 16, 0, 33, 100}, /* generic path */
    {WFMT_AFFINE, 2, 32, 64, 256},
    {WFMT_AFFINE, 3, 32, 72, 256},
    {WFMT_AFFINE, 3, 64, 40, 192},
    {WFMT_AFFINE, 4, 32, 130, 256},
    {WFMT_AFFINE, 4, 64, 64, 512},
    {WFMT_AFFINE, 4, 128, 48, 1024},
    {WFMT_AFFINE, 5, 32, 50, 256},
    {WFMT_AFFINE, 6, 64, 50, 256},
    {WFMT_AFFINE, 8, 32, 90, 256},
    {WFMT_AFFINE, 8, 64, 64, 128},
    {WFMT_MXFP4, 4, 32, 100, 256},
    {WFMT_MXFP8, 8, 32, 100, 256},
    {WFMT_NVFP4, 4, 16, 100, 256},
    {WFMT_AFFINE, 4, 8, 16, 64}, /* group 8: generic */
    /* k a multiple of 1024: the m = 1 row kernel */
    {WFMT_BF16, 16, 0, 300, 2048},
    {WFMT_F16, 16, 0, 70, 1024},
    {WFMT_AFFINE, 4, 64, 261, 3072},
    {WFMT_AFFINE, 4, 32, 45, 1024},
    {WFMT_AFFINE, 8, 64, 50, 2048},
    {WFMT_MXFP8, 8, 32, 67, 1024},
    /* 16-bit, k a multiple of 256: the streaming m = 1 kernel (a last chunk of 7 units) */
    {WFMT_BF16, 16, 0, 100, 3840},
    {WFMT_F16, 16, 0, 40, 768},
    /* the tensor-core 4-bit m = 1 kernels: rows a multiple of 8 and k of 256 for the
     * streaming one in 8-row tiles (25 tiles of 11 steps: its warps stop inside tiles; 40
     * rows: no other kernel of the kind takes them) */
    {WFMT_AFFINE, 4, 64, 160, 4096},
    {WFMT_AFFINE, 4, 128, 200, 2816},
    {WFMT_AFFINE, 4, 32, 40, 2048},
    /* and in 16-row tiles (where rows divide by 16): 13 tiles of 11 steps, 3 of 8 */
    {WFMT_AFFINE, 4, 128, 208, 2816},
    {WFMT_AFFINE, 4, 32, 48, 2048},
    /* rows of 16 and k a multiple of 128 but not of 256: the ring kernel, groups of 32, 64
     * and 128 (11 groups a row: the scale pairs' halves alternate by row) */
    {WFMT_AFFINE, 4, 32, 32, 1920},
    {WFMT_AFFINE, 4, 64, 32, 1152},
    {WFMT_AFFINE, 4, 128, 48, 1408},
    /* groups of 256, which neither takes: the kernel that keeps its loads in registers */
    {WFMT_AFFINE, 4, 256, 32, 1024},
    {WFMT_AFFINE, 4, 256, 48, 768},
};

/* Whether a product runs on a tensor-core 4-bit m = 1 kernel (x rounded to fp16): the
 * streaming one (groups up to 128, k a multiple of 256, rows of 8), else the others (k a
 * multiple of 128, rows of 16). In batch-invariant mode none does, and the float32 kernels'
 * errors stay within the bound of these. */
static int gemv_tc_case(int fmt, int bits, int group, int n, int k, int rows)
{
    if (rows != 1 || fmt != WFMT_AFFINE || bits != 4 || group < 32 || (group & (group - 1)) ||
        k > 16384)
        return 0;
    if (group <= 128 && k % 256 == 0 && n % 8 == 0) return 1;
    return k % 128 == 0 && n % 16 == 0;
}

/* Whether a bf16 product of m rows takes bf16 operands (cuBLASLt) rather than the
 * matrix-vector kernels (in batch-invariant mode it does not, and the bound of bf16 operands
 * holds for those all the same). */
static int bf16_operands(int m)
{
    return m > 1;
}

/* A batch of one sequence's n tokens and no logit rows. */
static struct fwd_batch one_seq(int n, const int32_t *tokens, const int32_t *pos,
                                const int32_t *slot, const int32_t *q_start, const int32_t *seq_len,
                                const int32_t *block_table, int max_blocks)
{
    struct fwd_batch b = {.n_tokens = n,
                          .tokens = tokens,
                          .pos = pos,
                          .slot = slot,
                          .n_seqs = 1,
                          .q_start = q_start,
                          .seq_len = seq_len,
                          .block_table = block_table,
                          .max_blocks = max_blocks,
                          .n_logits = 0,
                          .logit_rows = tokens};
    return b;
}

static void test_matmul_embed(void)
{
    const int ms[] = {1, 3, 8, 37, 130};
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++) {
        const struct fmt_case *fc = &fmts[f];
        struct mat m;
        mat_make(&m, fc->fmt, fc->bits, fc->group, fc->n, fc->k);
        char name[32];
        qweight_format_name(&m.w, name, sizeof name);
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            int rows = ms[mi];
            size_t nx = (size_t)rows * fc->k, ny = (size_t)rows * fc->n;
            float *x = rvec(nx), *ref = xmalloc(sizeof(float) * ny);
            mm_ref(&m.w, x, rows, ref);
            float *dx = dev(x, nx), *dy = poisoned(ny);
            gpu.ops->matmul(gpu.ctx, dy, dx, &m.wg, rows);
            float *y = back(dy, ny);
            double err = rel_err(y, ref, ny);
            double bound = gemv_tc_case(fc->fmt, fc->bits, fc->group, fc->n, fc->k, rows) ? 2e-3
                           : rows <= 8 && !(fc->fmt == WFMT_BF16 && bf16_operands(rows))  ? 3e-5
                                                                                          : 1e-2;
            CHECK(err <= bound, "matmul %s %lldx%lld m=%d: relative error %.3g > %.0e", name,
                  (long long)fc->n, (long long)fc->k, rows, err, bound);
            free(x);
            free(ref);
            free(y);
            gpu.ops->free(gpu.ctx, dx);
            gpu.ops->free(gpu.ctx, dy);
        }
        /* embed: exact decode of a few rows, scaled */
        int32_t toks[5] = {0, (int32_t)(fc->n - 1), 3, 7 % fc->n, 11 % fc->n};
        int32_t zero5[5] = {0}, one5[5] = {1, 1, 1, 1, 1}, qs[2] = {0, 5};
        struct fwd_batch b = one_seq(5, toks, zero5, zero5, qs, one5, zero5, 1);
        size_t ne = 5 * (size_t)fc->k;
        float *ref = xmalloc(sizeof(float) * ne);
        cpu.ops->batch_begin(cpu.ctx, &b);
        cpu.ops->embed(cpu.ctx, ref, &m.w, &b, 1.5f);
        float *de = poisoned(ne);
        gpu.ops->batch_begin(gpu.ctx, &b);
        gpu.ops->embed(gpu.ctx, de, &m.wg, &b, 1.5f);
        float *e = back(de, ne);
        double err = rel_err(e, ref, ne);
        CHECK(err <= 1e-6, "embed %s: relative error %.3g > 1e-6", name, err);
        free(ref);
        free(e);
        gpu.ops->free(gpu.ctx, de);
        mat_free(&m);
    }
}

/* Picks left on the device (argmax with no host output): the next step's embedding takes
 * them through pick_rows, and picks() reads them, the oldest first. Exact. */
static void test_picks(void)
{
    const int vocab = 300, k = 64, rows = 3;
    struct mat m;
    mat_make(&m, WFMT_BF16, 16, 0, vocab, k);
    float *l1 = rvec((size_t)rows * vocab), *l2 = rvec((size_t)rows * vocab);
    float *d1 = dev(l1, (size_t)rows * vocab), *d2 = dev(l2, (size_t)rows * vocab);
    int32_t want1[3], want2[3], got[3] = {-1, -1, -1};
    cpu.ops->argmax(cpu.ctx, want1, l1, rows, vocab);
    cpu.ops->argmax(cpu.ctx, want2, l2, rows, vocab);
    gpu.ops->argmax(gpu.ctx, NULL, d1, rows, vocab);

    /* a step whose tokens 0 and 2 are the picks of rows 2 and 0; token 1 its own */
    int32_t toks[3] = {5, 9, 5}, pr[3] = {2, -1, 0}, zero3[3] = {0}, one3[3] = {1, 1, 1};
    int32_t qs[2] = {0, 3}, eff[3] = {want1[2], 9, want1[0]};
    struct fwd_batch b = one_seq(3, toks, zero3, zero3, qs, one3, zero3, 1);
    b.pick_rows = pr;
    struct fwd_batch bc = one_seq(3, eff, zero3, zero3, qs, one3, zero3, 1);
    size_t ne = (size_t)rows * k;
    float *ref = xmalloc(sizeof(float) * ne), *de = poisoned(ne);
    cpu.ops->batch_begin(cpu.ctx, &bc);
    cpu.ops->embed(cpu.ctx, ref, &m.w, &bc, 1.0f);
    gpu.ops->batch_begin(gpu.ctx, &b);
    gpu.ops->embed(gpu.ctx, de, &m.wg, &b, 1.0f);
    gpu.ops->argmax(gpu.ctx, NULL, d2, rows, vocab); /* a second pick pending behind it */
    float *e = back(de, ne);
    CHECK(rel_err(e, ref, ne) == 0, "embed of picked tokens differs");
    gpu.ops->picks(gpu.ctx, got, rows);
    CHECK(!memcmp(got, want1, sizeof want1), "first picks: %d %d %d, want %d %d %d", got[0], got[1],
          got[2], want1[0], want1[1], want1[2]);
    gpu.ops->picks(gpu.ctx, got, rows);
    CHECK(!memcmp(got, want2, sizeof want2), "second picks: %d %d %d, want %d %d %d", got[0],
          got[1], got[2], want2[0], want2[1], want2[2]);
    free(l1);
    free(l2);
    free(ref);
    free(e);
    gpu.ops->free(gpu.ctx, d1);
    gpu.ops->free(gpu.ctx, d2);
    gpu.ops->free(gpu.ctx, de);
    mat_free(&m);
}

/* The greedy pick of one row written by a one-row product with the norm fused (the output
 * head of a decode step), which the product's blocks take themselves: the pick must be the
 * argmax of the row as written. Rows 7 and n - 3 are the same and largest (x itself): the
 * lower index wins. */
static void test_head_pick(void)
{
    const int64_t n = 50000, k = 512;
    float *x = rvec(k), *nw = xmalloc(sizeof(float) * k);
    for (int i = 0; i < k; i++) nw[i] = 1.0f;
    struct mat m;
    test_mat_make(&m.h, WFMT_BF16, 16, 0, n, k, ST_BF16);
    double ss = 0;
    for (int i = 0; i < k; i++) ss += (double)x[i] * x[i];
    const float inv = (float)(1.0 / sqrt(ss / k + 1e-6));
    for (int i = 0; i < k; i++) {
        const uint16_t v = f32_to_bf16(x[i] * inv);
        memcpy(m.h.data + 7 * m.h.w.row_bytes + 2 * i, &v, 2);
        memcpy(m.h.data + (n - 3) * m.h.w.row_bytes + 2 * i, &v, 2);
    }
    m.w = m.wg = m.h.w;
    struct err e = {0};
    CHECK(gpu.ops->weight_prepare(gpu.ctx, &m.wg, &e) == 0, "weight_prepare: %s", e.msg);
    float *dx = dev(x, k), *dn = dev(nw, k), *dh = poisoned(k), *dy = poisoned(n);
    for (int round = 0; round < 3; round++) { /* the slot and count must be left at zero */
        gpu.ops->rms_norm(gpu.ctx, dh, dx, dn, 1, (int)k, 1e-6f);
        gpu.ops->matmul(gpu.ctx, dy, dh, &m.wg, 1);
        int32_t got = -1, want = -1;
        gpu.ops->argmax(gpu.ctx, &got, dy, 1, (int)n);
        float *y = back(dy, n);
        cpu.ops->argmax(cpu.ctx, &want, y, 1, (int)n);
        CHECK(got == want && want == 7, "head pick round %d: %d, argmax of the row %d (want 7)",
              round, got, want);
        free(y);
    }
    free(x);
    free(nw);
    gpu.ops->free(gpu.ctx, dx);
    gpu.ops->free(gpu.ctx, dn);
    gpu.ops->free(gpu.ctx, dh);
    gpu.ops->free(gpu.ctx, dy);
    mat_free(&m);
}

/* backend_ops.rope_tables against the host's cosf and sinf of the same single-precision
 * angle (within 1e-6: the device's sincosf is within two ulps), alone and written by the
 * embedding launch after it; the embedding must not change. */
static void test_rope_tables(void)
{
    enum { N = 6, HALF = 64 };
    const int32_t pos[N] = {0, 1, 77, 4095, 70000, 131071}, toks[N] = {3, 1, 4, 1, 5, 9};
    const int32_t zero[N] = {0}, qs[2] = {0, N}, len[1] = {N}, bt[1] = {0};
    float inv[HALF];
    for (int i = 0; i < HALF; i++) inv[i] = (float)(1.0 / pow(500000.0, 2.0 * i / (2 * HALF)));
    struct fwd_batch b = one_seq(N, toks, pos, zero, qs, len, bt, 1);
    float *dinv = dev(inv, HALF);
    struct mat m;
    mat_make(&m, WFMT_BF16, 16, 0, 16, 256);
    float *ref_e = xmalloc(sizeof(float) * N * 256);
    cpu.ops->batch_begin(cpu.ctx, &b);
    cpu.ops->embed(cpu.ctx, ref_e, &m.w, &b, 0.5f);
    for (int fused = 0; fused < 2; fused++) {
        const float ms = fused ? 0.7f : 1.0f;
        float *dc = poisoned(N * HALF), *ds = poisoned(N * HALF), *de = poisoned(N * 256);
        gpu.ops->batch_begin(gpu.ctx, &b);
        gpu.ops->rope_tables(gpu.ctx, dc, ds, dinv, HALF, ms, &b);
        if (fused) gpu.ops->embed(gpu.ctx, de, &m.wg, &b, 0.5f);
        float *c = back(dc, N * HALF), *s = back(ds, N * HALF);
        double worst = 0;
        for (int t = 0; t < N; t++)
            for (int i = 0; i < HALF; i++) {
                const float ang = (float)pos[t] * inv[i];
                const double ec = fabs(c[t * HALF + i] - cosf(ang) * ms),
                             es = fabs(s[t * HALF + i] - sinf(ang) * ms);
                worst = fmax(worst, fmax(ec, es));
            }
        CHECK(worst <= 1e-6, "rope tables (%s): largest difference %.3g > 1e-6",
              fused ? "with the embedding" : "alone", worst);
        if (fused) {
            float *e = back(de, N * 256);
            CHECK(rel_err(e, ref_e, N * 256) == 0,
                  "embedding written with the rope tables differs");
            free(e);
        }
        free(c);
        free(s);
        gpu.ops->free(gpu.ctx, dc);
        gpu.ops->free(gpu.ctx, ds);
        gpu.ops->free(gpu.ctx, de);
    }
    free(ref_e);
    gpu.ops->free(gpu.ctx, dinv);
    mat_free(&m);
}

/* Runs one element-wise op on both backends and compares. */
static void test_elementwise(void)
{
    const int rows = 7, dim = 384;
    size_t n = (size_t)rows * dim;
    float *x = rvec(n), *y = rvec(n), *w = rvec(dim), *ref = xmalloc(sizeof(float) * n);
    float *dx = dev(x, n), *dy = dev(y, n), *dw = dev(w, dim);
    double err;

    /* rms_norm (out-of-place and in place) */
    cpu.ops->rms_norm(cpu.ctx, ref, x, w, rows, dim, 1e-6f);
    float *dout = poisoned(n);
    gpu.ops->rms_norm(gpu.ctx, dout, dx, dw, rows, dim, 1e-6f);
    float *got = back(dout, n);
    err = rel_err(got, ref, n);
    CHECK(err <= 1e-5, "rms_norm: relative error %.3g > 1e-5", err);
    free(got);

    /* rope over 3 heads of d=128 per row: x [rows][3][128] = the first rows*384 values */
    const int heads = 3, d = 128;
    float *cs = rvec((size_t)rows * d / 2), *sn = rvec((size_t)rows * d / 2);
    float *dcs = dev(cs, (size_t)rows * d / 2), *dsn = dev(sn, (size_t)rows * d / 2);
    memcpy(ref, x, sizeof(float) * n);
    cpu.ops->rope(cpu.ctx, ref, rows, heads, d, cs, sn);
    float *dr = dev(x, n);
    gpu.ops->rope(gpu.ctx, dr, rows, heads, d, dcs, dsn);
    got = back(dr, n);
    err = rel_err(got, ref, n);
    CHECK(err <= 1e-5, "rope: relative error %.3g > 1e-5", err);
    free(got);

    for (int act = 0; act < 2; act++) {
        cpu.ops->act_mul(cpu.ctx, ref, x, y, (int64_t)n, act ? ACT_GELU_TANH : ACT_SILU);
        gpu.ops->act_mul(gpu.ctx, dout, dx, dy, (int64_t)n, act ? ACT_GELU_TANH : ACT_SILU);
        got = back(dout, n);
        err = rel_err(got, ref, n);
        CHECK(err <= 1e-5, "act_mul %s: relative error %.3g > 1e-5", act ? "gelu" : "silu", err);
        free(got);
    }

    memcpy(ref, x, sizeof(float) * n);
    cpu.ops->add(cpu.ctx, ref, y, (int64_t)n);
    float *da = dev(x, n);
    gpu.ops->add(gpu.ctx, da, dy, (int64_t)n);
    got = back(da, n);
    CHECK(rel_err(got, ref, n) <= 1e-6, "add differs");
    free(got);

    memcpy(ref, x, sizeof(float) * n);
    cpu.ops->add_bias(cpu.ctx, ref, w, rows, dim);
    gpu.ops->upload(gpu.ctx, da, x, sizeof(float) * n);
    gpu.ops->add_bias(gpu.ctx, da, dw, rows, dim);
    got = back(da, n);
    CHECK(rel_err(got, ref, n) <= 1e-6, "add_bias differs");
    free(got);

    memcpy(ref, x, sizeof(float) * n);
    for (size_t i = 0; i < n; i++) ref[i] *= 40.0f;
    float *dsc = dev(ref, n);
    cpu.ops->softcap(cpu.ctx, ref, (int64_t)n, 30.0f);
    gpu.ops->softcap(gpu.ctx, dsc, (int64_t)n, 30.0f);
    got = back(dsc, n);
    err = rel_err(got, ref, n);
    CHECK(err <= 1e-5, "softcap: relative error %.3g > 1e-5", err);
    free(got);

    /* gather_rows with rows that are not the batch's logit rows */
    int32_t rws[4] = {6, 0, 3, 3};
    cpu.ops->gather_rows(cpu.ctx, ref, x, rws, 4, dim);
    float *dg = poisoned(4 * (size_t)dim);
    gpu.ops->gather_rows(gpu.ctx, dg, dx, rws, 4, dim);
    got = back(dg, 4 * (size_t)dim);
    CHECK(rel_err(got, ref, 4 * (size_t)dim) == 0, "gather_rows differs");
    free(got);

    /* argmax: ties go to the lowest index */
    int32_t am_cpu[7], am_gpu[7];
    float *lg = rvec(n);
    lg[5] = lg[100] = 7.0f; /* row 0: tie between 5 and 100 */
    float *dlg = dev(lg, n);
    cpu.ops->argmax(cpu.ctx, am_cpu, lg, rows, dim);
    gpu.ops->argmax(gpu.ctx, am_gpu, dlg, rows, dim);
    for (int r = 0; r < rows; r++)
        CHECK(am_cpu[r] == am_gpu[r], "argmax row %d: %d vs %d", r, am_gpu[r], am_cpu[r]);
    CHECK(am_gpu[0] == 5, "argmax tie: %d", am_gpu[0]);
    /* long rows (float4 loads 8 deep when the length is a multiple of 4, else one at a time):
     * row 0 ties at 17 and near its end, row 1 peaks at its last value */
    const int lens[2] = {40000, 10001};
    for (int li = 0; li < 2; li++) {
        const int ln = lens[li];
        float *l2 = rvec(2 * (size_t)ln);
        l2[17] = l2[ln - 3] = 9.0f;
        l2[2 * ln - 1] = 9.0f;
        float *dl2 = dev(l2, 2 * (size_t)ln);
        cpu.ops->argmax(cpu.ctx, am_cpu, l2, 2, ln);
        gpu.ops->argmax(gpu.ctx, am_gpu, dl2, 2, ln);
        CHECK(am_gpu[0] == 17 && am_cpu[0] == 17, "argmax of %d: row 0 %d (cpu %d)", ln, am_gpu[0],
              am_cpu[0]);
        CHECK(am_gpu[1] == ln - 1 && am_cpu[1] == ln - 1, "argmax of %d: row 1 %d (cpu %d)", ln,
              am_gpu[1], am_cpu[1]);
        free(l2);
        gpu.ops->free(gpu.ctx, dl2);
    }

    float *bufs[] = {dx, dy, dw, dout, dcs, dsn, dr, da, dsc, dg, dlg};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu.ops->free(gpu.ctx, bufs[i]);
    free(x);
    free(y);
    free(w);
    free(ref);
    free(cs);
    free(sn);
    free(lg);
}

/* A device output, its reference on the host and the bound of their norm-wise relative
 * error. */
struct out_ref {
    const char *name;
    float *d, *ref;
    size_t n;
    double bound;
};

/* Checks each output against its reference (what: the sequence, for the message) and frees
 * the device buffers; the references stay the caller's. */
static void check_outs(const struct out_ref *o, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        float *got = back(o[i].d, o[i].n);
        double err = rel_err(got, o[i].ref, o[i].n);
        CHECK(err <= o[i].bound, "%s, %s: relative error %.3g > %.0e", what, o[i].name, err,
              o[i].bound);
        free(got);
        gpu.ops->free(gpu.ctx, o[i].d);
    }
}

/*
 * The backend merges neighbouring operations (q/k/v products over one x, gate and up
 * products with the activation, a residual add with the next norm): run those sequences
 * through the op table and compare with the CPU backend doing them one by one (bound
 * 1e-4: the CPU's own decode kernels sum in another order than the float64 reference; 1e-2
 * at m = 40, where the products take bf16 operands). Gate and up are bf16 (gate_group 0) or
 * affine 4-bit with groups of gate_group.
 */
static void test_fusions_case(int H, int gate_group, int m)
{
    const int gate_bf16 = gate_group == 0;
    const int F = 2 * H, KV = H / 2;
    {
        struct mat wq, wk, wv, wg, wu, wd;
        mat_make(&wd, WFMT_BF16, 16, 0, H, F);
        mat_make(&wq, WFMT_BF16, 16, 0, H, H);
        mat_make(&wk, WFMT_BF16, 16, 0, KV, H);
        mat_make(&wv, WFMT_BF16, 16, 0, KV, H);
        if (gate_bf16) {
            mat_make(&wg, WFMT_BF16, 16, 0, F, H);
            mat_make(&wu, WFMT_BF16, 16, 0, F, H);
        } else {
            mat_make(&wg, WFMT_AFFINE, 4, gate_group, F, H);
            mat_make(&wu, WFMT_AFFINE, 4, gate_group, F, H);
        }
        size_t nh = (size_t)m * H, nf = (size_t)m * F, nk = (size_t)m * KV;
        float *x = rvec(nh), *res = rvec(nh), *nw = rvec(H);
        float *q = xmalloc(4 * nh), *k = xmalloc(4 * nk), *v = xmalloc(4 * nk);
        float *g = xmalloc(4 * nf), *u = xmalloc(4 * nf), *xr = xmalloc(4 * nh),
              *h = xmalloc(4 * nh);
        memcpy(xr, res, 4 * nh);
        cpu.ops->matmul(cpu.ctx, q, x, &wq.w, m);
        cpu.ops->matmul(cpu.ctx, k, x, &wk.w, m);
        cpu.ops->matmul(cpu.ctx, v, x, &wv.w, m);
        cpu.ops->matmul(cpu.ctx, g, x, &wg.w, m);
        cpu.ops->matmul(cpu.ctx, u, x, &wu.w, m);
        cpu.ops->act_mul(cpu.ctx, g, g, u, (int64_t)nf, ACT_SILU);
        float *dn = xmalloc(4 * nh);
        cpu.ops->matmul(cpu.ctx, dn, g, &wd.w, m);
        cpu.ops->add(cpu.ctx, xr, q, (int64_t)nh);
        cpu.ops->rms_norm(cpu.ctx, h, xr, nw, m, H, 1e-5f);

        float *dx = dev(x, nh), *dres = dev(res, nh), *dnw = dev(nw, H);
        float *dq = poisoned(nh), *dk = poisoned(nk), *dv = poisoned(nk), *dg = poisoned(nf),
              *du = poisoned(nf), *dh = poisoned(nh);
        gpu.ops->matmul(gpu.ctx, dq, dx, &wq.wg, m);
        gpu.ops->matmul(gpu.ctx, dk, dx, &wk.wg, m);
        gpu.ops->matmul(gpu.ctx, dv, dx, &wv.wg, m);
        gpu.ops->matmul(gpu.ctx, dg, dx, &wg.wg, m);
        gpu.ops->matmul(gpu.ctx, du, dx, &wu.wg, m);
        gpu.ops->act_mul(gpu.ctx, dg, dg, du, (int64_t)nf, ACT_SILU);
        /* right after the activation: at m > 8 it hands the product its bf16 x */
        float *ddn = poisoned(nh);
        gpu.ops->matmul(gpu.ctx, ddn, dg, &wd.wg, m);
        gpu.ops->add(gpu.ctx, dres, dq, (int64_t)nh);
        gpu.ops->rms_norm(gpu.ctx, dh, dres, dnw, m, H, 1e-5f);
        /* bf16 products of m > 1 take bf16 operands; 4-bit gate and up on tensor cores at
         * m = 1 round x to fp16 */
        const double b = bf16_operands(m) ? 1e-2 : 1e-4;
        const double bgu =
            m <= 8 && gemv_tc_case(WFMT_AFFINE, 4, gate_group, F, H, m) && !gate_bf16 ? 2e-3 : b;
        const struct out_ref outs[] = {
            {"q", dq, q, nh, b},           {"k", dk, k, nk, b},
            {"v", dv, v, nk, b},           {"act(gate)*up", dg, g, nf, bgu},
            {"up", du, u, nf, bgu},        {"x + q", dres, xr, nh, b},
            {"norm(x + q)", dh, h, nh, b}, {"down(act(gate)*up)", ddn, dn, nh, bgu}};
        char what[64];
        snprintf(what, sizeof what, "fused sequence H=%d m=%d", H, m);
        check_outs(outs, sizeof outs / sizeof outs[0], what);
        float *refs[] = {q, k, v, g, u, xr, h, dn};
        for (int i = 0; i < 8; i++) free(refs[i]);
        gpu.ops->free(gpu.ctx, dx);
        gpu.ops->free(gpu.ctx, dnw);
        free(x);
        free(res);
        free(nw);
        struct mat *ms[] = {&wq, &wk, &wv, &wg, &wu, &wd};
        for (int i = 0; i < 6; i++) mat_free(ms[i]);
    }
}

/*
 * Decoding rows through two residual blocks as the model records them: o product, x +=
 * it, rms_norm, q/k/v products; then down product, x += it, rms_norm, gate/up with the
 * activation. Where a streaming kernel takes a one-row product, each add joins the product
 * before it and each norm the products after it; either way every result matches the CPU
 * within 1e-4. in_place: each norm writes over the product that was added (as the model's
 * forward pass does), so a cuBLASLt product adds into x itself; the products' own results
 * are then not compared, being overwritten.
 */
/* The buffers of run_tails (host or device). */
struct tails {
    float *att, *x, *n1, *n2, *act, *h, *q, *k, *v, *h2, *g, *u, *h3;
};

/* The two block tails of test_norm_fusion_case through one backend (ws: o, q, k, v, down,
 * gate, up; their GPU copies when on_gpu). */
static void run_tails(const struct backend *be, int on_gpu, const struct tails *t,
                      const struct mat *const ws[7], int H, int F, int m, int in_place)
{
    const struct qweight *w[7];
    for (int i = 0; i < 7; i++) w[i] = on_gpu ? &ws[i]->wg : &ws[i]->w;
    void *c = be->ctx;
    float *n1_out = in_place ? t->h : t->h2, *n2_out = in_place ? t->h3 : t->h2;
    /* attention block's tail, the next norm and q/k/v */
    be->ops->matmul(c, t->h, t->att, w[0], m);
    be->ops->add(c, t->x, t->h, (int64_t)m * H);
    be->ops->rms_norm(c, n1_out, t->x, t->n1, m, H, 1e-5f);
    be->ops->matmul(c, t->q, n1_out, w[1], m);
    be->ops->matmul(c, t->k, n1_out, w[2], m);
    be->ops->matmul(c, t->v, n1_out, w[3], m);
    /* the feed-forward block's tail (down over act), the next norm and gate/up */
    be->ops->matmul(c, t->h3, t->act, w[4], m);
    be->ops->add(c, t->x, t->h3, (int64_t)m * H);
    be->ops->rms_norm(c, n2_out, t->x, t->n2, m, H, 1e-5f);
    be->ops->matmul(c, t->g, n2_out, w[5], m);
    be->ops->matmul(c, t->u, n2_out, w[6], m);
    be->ops->act_mul(c, t->g, t->g, t->u, (int64_t)m * F, ACT_SILU);
}

static void test_norm_fusion_case(int H, enum wfmt fmt, int bits, int group, int m, int in_place)
{
    const int F = 2 * H, KV = H / 2;
    struct mat wo, wq, wk, wv, wd, wg, wu;
    mat_make(&wo, fmt, bits, group, H, H);
    mat_make(&wq, fmt, bits, group, H, H);
    mat_make(&wk, fmt, bits, group, KV, H);
    mat_make(&wv, fmt, bits, group, KV, H);
    mat_make(&wd, fmt, bits, group, H, F);
    mat_make(&wg, fmt, bits, group, F, H);
    mat_make(&wu, fmt, bits, group, F, H);
    const size_t mH = (size_t)m * H, mF = (size_t)m * F, mK = (size_t)m * KV;
    float *att = rvec(mH), *x = rvec(mH), *n1 = rvec(H), *n2 = rvec(H), *act = rvec(mF);
    float *h = xmalloc(4 * mH), *q = xmalloc(4 * mH), *k = xmalloc(4 * mK), *v = xmalloc(4 * mK),
          *h2 = xmalloc(4 * mH), *g = xmalloc(4 * mF), *u = xmalloc(4 * mF), *h3 = xmalloc(4 * mH);
    float *dx = dev(x, mH), *datt = dev(att, mH), *dn1 = dev(n1, H), *dn2 = dev(n2, H),
          *dact = dev(act, mF);
    float *dh = poisoned(mH), *dq = poisoned(mH), *dk = poisoned(mK), *dv = poisoned(mK),
          *dh2 = poisoned(mH), *dg = poisoned(mF), *du = poisoned(mF), *dh3 = poisoned(mH);
    const struct mat *ws[7] = {&wo, &wq, &wk, &wv, &wd, &wg, &wu};
    struct tails th = {att, x, n1, n2, act, h, q, k, v, h2, g, u, h3};
    struct tails td = {datt, dx, dn1, dn2, dact, dh, dq, dk, dv, dh2, dg, du, dh3};
    run_tails(&cpu, 0, &th, ws, H, F, m, in_place);
    run_tails(&gpu, 1, &td, ws, H, F, m, in_place);
    /* 4-bit products on tensor cores round x to fp16; products of m > 8 take bf16 operands */
    const double e = (fmt == WFMT_BF16 ? bf16_operands(m) : m > 8) ? 1e-2
                     : gemv_tc_case(fmt, bits, group, KV, H, 1)    ? 2e-3
                                                                   : 1e-4;
    const struct out_ref outs[] = {{"q", dq, q, mH, e},
                                   {"k", dk, k, mK, e},
                                   {"v", dv, v, mK, e},
                                   {"residual x", dx, x, mH, e},
                                   {"act(gate)*up", dg, g, mF, e},
                                   {"up", du, u, mF, e},
                                   {in_place ? "norm(x) 1" : "o", dh, h, mH, e},
                                   {in_place ? "norm(x) 2" : "down", dh3, h3, mH, e},
                                   {"norm(x)", dh2, h2, mH, e}};
    char what[64];
    snprintf(what, sizeof what, "norm fusion H=%d m=%d %s%s", H, m,
             fmt == WFMT_AFFINE ? "4-bit" : "bf16", in_place ? " in place" : "");
    check_outs(outs, sizeof outs / sizeof outs[0] - (in_place ? 1 : 0), what);
    float *hb[] = {att, x, n1, n2, act, h, q, k, v, h2, g, u, h3};
    for (size_t i = 0; i < sizeof hb / sizeof hb[0]; i++) free(hb[i]);
    float *db[] = {datt, dn1, dn2, dact};
    for (size_t i = 0; i < sizeof db / sizeof db[0]; i++) gpu.ops->free(gpu.ctx, db[i]);
    struct mat *ms[] = {&wo, &wq, &wk, &wv, &wd, &wg, &wu};
    for (int i = 0; i < 7; i++) mat_free(ms[i]);
}

static void test_norm_fusion(void)
{
    test_norm_fusion_case(1024, WFMT_BF16, 16, 0, 1, 0);
    test_norm_fusion_case(2048, WFMT_AFFINE, 4, 64, 1, 0);
    /* 4-bit with k = 384 (and 768 for down): q/k/v and gate/up on the ring kernel, their
     * norms and o's add in launches of their own; groups of 256: the register kernel */
    test_norm_fusion_case(384, WFMT_AFFINE, 4, 64, 1, 0);
    test_norm_fusion_case(512, WFMT_AFFINE, 4, 256, 1, 0);
    /* k under 1024: around the general kernel */
    test_norm_fusion_case(256, WFMT_BF16, 16, 0, 1, 0);
    test_norm_fusion_case(1024, WFMT_BF16, 16, 0, 1, 1);
    /* cuBLASLt products: the norms hand q/k/v and gate/up their bf16 input */
    test_norm_fusion_case(1024, WFMT_BF16, 16, 0, 40, 0);
    /* and o and down add into x in their epilogue */
    test_norm_fusion_case(1024, WFMT_BF16, 16, 0, 40, 1);
    test_norm_fusion_case(512, WFMT_BF16, 16, 0, 256, 1);
}

/* Small shapes take the general matrix-vector kernel; k = 1024 at m = 1 the row kernel. At
 * m = 1, 4-bit gate and up take the streaming kernel (k a multiple of 256), the ring kernel
 * (k = 384) or the register one (groups of 256) as a pair. */
static void test_fusions(void)
{
    const int ms[] = {1, 8, 40};
    for (int i = 0; i < 3; i++) {
        test_fusions_case(256, 64, ms[i]);
        test_fusions_case(1024, 64, ms[i]);
        test_fusions_case(1024, 0, ms[i]);
        test_fusions_case(384, 64, ms[i]);
        test_fusions_case(512, 256, ms[i]);
    }
}

static float round_bf16(float v)
{
    return bf16_to_f32(f32_to_bf16(v));
}

/*
 * A mixed batch on paged KV: sequence 0 prefills 37 tokens from position 0, sequence 1
 * decodes one token at position `dec_pos` over a context stored by an earlier step,
 * sequence 2 prefills 20 tokens at positions 50..69 after 50 stored ones. Blocks are
 * scattered (reversed order) to exercise the block tables.
 */
static double attn_bound;

/*
 * rope(q), rope(k), kv_store(k, v) as the model records them (the CUDA backend runs the
 * three as one launch): q and k after rope within 1e-5, the cache rows equal to the CPU's
 * rounded to bf16 within 1e-3 norm-wise (a float32 difference in the last place can move
 * a rounding; one such element of thousands stays far below the bound).
 */
/* The GPU's bf16 K and V caches against the CPU's float ones rounded to bf16 (in place):
 * within the bound (1e-3 where the values themselves agree within 1e-4). */
static void check_kv_caches(const struct kv_layer *kv_gpu, float *kc, float *vc, size_t kv_elems,
                            double bound, const char *what)
{
    uint16_t *hb = xmalloc(kv_elems * 2);
    float *got = xmalloc(kv_elems * sizeof(float));
    for (int which = 0; which < 2; which++) {
        float *ref = which ? vc : kc;
        gpu.ops->download(gpu.ctx, hb, which ? kv_gpu->v : kv_gpu->k, kv_elems * 2);
        for (size_t i = 0; i < kv_elems; i++) {
            got[i] = bf16_to_f32(hb[i]);
            ref[i] = round_bf16(ref[i]);
        }
        double err = rel_err(got, ref, kv_elems);
        CHECK(err <= bound, "%s: %s cache relative error %.3g > %g", what, which ? "v" : "k", err,
              bound);
    }
    free(hb);
    free(got);
}

static void test_rope_kv(int n, int hq, int hkv, int d)
{
    const int bs = 16, n_blocks = (n + bs - 1) / bs + 2, kv_row = hkv * d;
    int32_t tokens[64], pos[64], slot[64], qs[2] = {0, n}, sl[1] = {n}, bt[16];
    for (int i = 0; i < n_blocks; i++) bt[i] = n_blocks - 1 - i;
    for (int t = 0; t < n; t++) {
        tokens[t] = 0;
        pos[t] = t;
        slot[t] = bt[t / bs] * bs + t % bs;
    }
    struct fwd_batch b = one_seq(n, tokens, pos, slot, qs, sl, bt, n_blocks);
    size_t nq = (size_t)n * hq * d, nk = (size_t)n * kv_row, nh = (size_t)n * d / 2;
    size_t kv_elems = (size_t)n_blocks * bs * kv_row;
    float *q = rvec(nq), *k = rvec(nk), *v = rvec(nk), *cs = rvec(nh), *sn = rvec(nh);
    float *dq = dev(q, nq), *dk = dev(k, nk), *dv = dev(v, nk), *dcs = dev(cs, nh),
          *dsn = dev(sn, nh);
    float *kc = xcalloc(kv_elems, sizeof(float)), *vc = xcalloc(kv_elems, sizeof(float));
    struct kv_layer kv_cpu = {kc, vc};
    struct kv_layer kv_gpu = {gpu.ops->alloc(gpu.ctx, kv_elems * 2),
                              gpu.ops->alloc(gpu.ctx, kv_elems * 2)};
    struct kv_geom g = {.n_blocks = n_blocks, .block_size = bs, .n_kv_heads = hkv, .head_dim = d};
    cpu.ops->batch_begin(cpu.ctx, &b);
    cpu.ops->rope(cpu.ctx, q, n, hq, d, cs, sn);
    cpu.ops->rope(cpu.ctx, k, n, hkv, d, cs, sn);
    cpu.ops->kv_store(cpu.ctx, &kv_cpu, &g, k, v, &b);
    gpu.ops->batch_begin(gpu.ctx, &b);
    gpu.ops->rope(gpu.ctx, dq, n, hq, d, dcs, dsn);
    gpu.ops->rope(gpu.ctx, dk, n, hkv, d, dcs, dsn);
    gpu.ops->kv_store(gpu.ctx, &kv_gpu, &g, dk, dv, &b);
    float *gq = back(dq, nq), *gk = back(dk, nk);
    double err = rel_err(gq, q, nq);
    CHECK(err <= 1e-5, "rope+kv_store n=%d: q relative error %.3g > 1e-5", n, err);
    err = rel_err(gk, k, nk);
    CHECK(err <= 1e-5, "rope+kv_store n=%d: k relative error %.3g > 1e-5", n, err);
    char what[48];
    snprintf(what, sizeof what, "rope+kv_store n=%d", n);
    check_kv_caches(&kv_gpu, kc, vc, kv_elems, 1e-3, what);
    free(gq);
    free(gk);
    float *bufs[] = {q, k, v, cs, sn, kc, vc};
    for (int i = 0; i < 7; i++) free(bufs[i]);
    float *dbufs[] = {dq, dk, dv, dcs, dsn, kv_gpu.k, kv_gpu.v};
    for (int i = 0; i < 7; i++) gpu.ops->free(gpu.ctx, dbufs[i]);
}

static void test_attention_case(int n_heads, int n_kv, int hd, int window, float softcap)
{
    const int bs = 16, max_blocks = 16, n_blocks = 3 * max_blocks, dec_pos = 200;
    const int kv_row = n_kv * hd;
    int32_t bt[3 * 16];
    for (int i = 0; i < 3 * max_blocks; i++) bt[i] = n_blocks - 1 - i;
    const int pre[3] = {0, dec_pos, 50}, cnt[3] = {37, 1, 20};
    size_t kv_elems = (size_t)n_blocks * bs * kv_row;
    float *kc = xcalloc(kv_elems, sizeof(float)), *vc = xcalloc(kv_elems, sizeof(float));
    struct kv_layer kv_cpu = {kc, vc};
    struct kv_layer kv_gpu = {gpu.ops->alloc(gpu.ctx, kv_elems * 2),
                              gpu.ops->alloc(gpu.ctx, kv_elems * 2)};
    struct kv_geom g = {.n_blocks = n_blocks, .block_size = bs, .n_kv_heads = n_kv, .head_dim = hd};
    struct attn_params p = {n_heads, n_kv, hd, 1.0f / sqrtf((float)hd), softcap, window};

    /* Step 0 prefills the earlier context of sequences 1 and 2; step 1 is the mixed batch. */
    for (int step = 0; step < 2; step++) {
        int32_t tokens[512], pos[512], slot[512], qs[4], sl[3], lr[1] = {0};
        int nt = 0, ns = 0;
        for (int s = 0; s < 3; s++) {
            int lo = step == 0 ? 0 : pre[s], c = step == 0 ? pre[s] : cnt[s];
            if (c == 0) continue;
            qs[ns] = nt;
            for (int j = 0; j < c; j++, nt++) {
                int ps = lo + j;
                tokens[nt] = 0;
                pos[nt] = ps;
                slot[nt] = bt[s * max_blocks + ps / bs] * bs + ps % bs;
            }
            sl[ns] = lo + c;
            ns++;
        }
        qs[ns] = nt;
        /* block table rows of the sequences present in this step */
        int32_t bts[3 * 16];
        for (int s = 0, r = 0; s < 3; s++) {
            int c = step == 0 ? pre[s] : cnt[s];
            if (c == 0) continue;
            memcpy(bts + r * max_blocks, bt + s * max_blocks, sizeof(int32_t) * max_blocks);
            r++;
        }
        struct fwd_batch b = {.n_tokens = nt,
                              .tokens = tokens,
                              .pos = pos,
                              .slot = slot,
                              .n_seqs = ns,
                              .q_start = qs,
                              .seq_len = sl,
                              .block_table = bts,
                              .max_blocks = max_blocks,
                              .n_logits = 0,
                              .logit_rows = lr};
        size_t nq = (size_t)nt * n_heads * hd, nk = (size_t)nt * kv_row;
        float *q = rvec(nq), *k = rvec(nk), *v = rvec(nk);
        for (size_t i = 0; i < nk; i++) {
            k[i] = round_bf16(k[i] * 2.0f);
            v[i] = round_bf16(v[i]);
        }
        for (size_t i = 0; i < nq; i++) q[i] *= 2.0f;
        float *ref = xmalloc(sizeof(float) * nq);
        cpu.ops->batch_begin(cpu.ctx, &b);
        cpu.ops->kv_store(cpu.ctx, &kv_cpu, &g, k, v, &b);
        cpu.ops->attention(cpu.ctx, ref, q, &kv_cpu, &g, &b, &p);
        float *dq = dev(q, nq), *dk = dev(k, nk), *dv = dev(v, nk), *dout = poisoned(nq);
        gpu.ops->batch_begin(gpu.ctx, &b);
        gpu.ops->kv_store(gpu.ctx, &kv_gpu, &g, dk, dv, &b);
        gpu.ops->attention(gpu.ctx, dout, dq, &kv_gpu, &g, &b, &p);
        float *got = back(dout, nq);
        double err = rel_err(got, ref, nq);
        CHECK(err <= attn_bound,
              "attention (%s) heads %d/%d d=%d window %d softcap %g step %d: relative error "
              "%.3g > %.0e",
              getenv("PAGODA_CUDA_ATTN"), n_heads, n_kv, hd, window, softcap, step, err,
              attn_bound);
        free(q);
        free(k);
        free(v);
        free(ref);
        free(got);
        gpu.ops->free(gpu.ctx, dq);
        gpu.ops->free(gpu.ctx, dk);
        gpu.ops->free(gpu.ctx, dv);
        gpu.ops->free(gpu.ctx, dout);
    }
    gpu.ops->free(gpu.ctx, kv_gpu.k);
    gpu.ops->free(gpu.ctx, kv_gpu.v);
    free(kc);
    free(vc);
}

/* Block tables of n_seqs sequences that interleave their blocks: block i of sequence s is
 * i * n_seqs + n_seqs - 1 - s. */
static int32_t *interleaved_tables(int n_seqs, int max_blocks)
{
    int32_t *bt = xmalloc(sizeof(int32_t) * (size_t)n_seqs * max_blocks);
    for (int s = 0; s < n_seqs; s++)
        for (int i = 0; i < max_blocks; i++) bt[s * max_blocks + i] = i * n_seqs + (n_seqs - 1 - s);
    return bt;
}

/* One of the two steps of a decode test: step 0 stores each sequence's first ctx[s] tokens
 * (its earlier keys), step 1 decodes one token a sequence at position ctx[s]. Sequences with
 * no token in the step are left out. */
struct step_batch {
    struct fwd_batch b;
    int32_t *tokens, *pos, *slot, *qs, *sl, *bts;
    int32_t lr[1];
};

static void step_batch_make(struct step_batch *sb, int step, int n_seqs, const int32_t *ctx,
                            const int32_t *bt, int max_blocks, int bs)
{
    int nt = 0;
    for (int s = 0; s < n_seqs; s++) nt += step ? 1 : ctx[s];
    sb->tokens = xcalloc((size_t)nt + 1, sizeof(int32_t));
    sb->pos = xmalloc(sizeof(int32_t) * ((size_t)nt + 1));
    sb->slot = xmalloc(sizeof(int32_t) * ((size_t)nt + 1));
    sb->qs = xmalloc(sizeof(int32_t) * (size_t)(n_seqs + 1));
    sb->sl = xmalloc(sizeof(int32_t) * (size_t)n_seqs);
    sb->bts = xmalloc(sizeof(int32_t) * (size_t)n_seqs * max_blocks);
    int t = 0, ns = 0;
    for (int s = 0; s < n_seqs; s++) {
        const int lo = step ? ctx[s] : 0, c = step ? 1 : ctx[s];
        if (c == 0) continue;
        sb->qs[ns] = t;
        for (int j = 0; j < c; j++, t++) {
            sb->pos[t] = lo + j;
            sb->slot[t] = bt[s * max_blocks + (lo + j) / bs] * bs + (lo + j) % bs;
        }
        sb->sl[ns] = lo + c;
        memcpy(sb->bts + ns * max_blocks, bt + s * max_blocks, sizeof(int32_t) * max_blocks);
        ns++;
    }
    sb->qs[ns] = t;
    sb->lr[0] = 0;
    sb->b = (struct fwd_batch){.n_tokens = nt,
                               .tokens = sb->tokens,
                               .pos = sb->pos,
                               .slot = sb->slot,
                               .n_seqs = ns,
                               .q_start = sb->qs,
                               .seq_len = sb->sl,
                               .block_table = sb->bts,
                               .max_blocks = max_blocks,
                               .n_logits = 0,
                               .logit_rows = sb->lr};
}

static void step_batch_free(struct step_batch *sb)
{
    free(sb->tokens);
    free(sb->pos);
    free(sb->slot);
    free(sb->qs);
    free(sb->sl);
    free(sb->bts);
}

/*
 * A decode step of n_seqs sequences, one token each, over contexts of different lengths
 * (from ctx_base + 11 on, below max_blocks x 16 - 5 earlier keys; block tables interleaved
 * across sequences). Decode steps run the decode kernel (keys split among a block's warps);
 * with few sequences it splits their keys into ranges over the GPU (blocks of a token and KV
 * head), merged within a cluster (up to 8 ranges) or by the last range's block (more); with
 * 4 (token, KV head) pairs an SM or more (70 sequences of 8 KV heads on 132 SMs), a warp
 * takes each pair whole.
 */
static void test_attention_decode_ctx(int n_seqs, int n_heads, int n_kv, int hd, int window,
                                      float softcap, int max_blocks, int ctx_base)
{
    const int bs = 16, n_blocks = n_seqs * max_blocks, kv_row = n_kv * hd;
    int32_t *bt = interleaved_tables(n_seqs, max_blocks);
    int32_t *ctx = xmalloc(sizeof(int32_t) * (size_t)n_seqs);
    for (int s = 0; s < n_seqs; s++) ctx[s] = (ctx_base + s * 37 + 11) % (bs * max_blocks - 5);
    size_t kv_elems = (size_t)n_blocks * bs * kv_row;
    float *kc = xcalloc(kv_elems, sizeof(float)), *vc = xcalloc(kv_elems, sizeof(float));
    struct kv_layer kv_cpu = {kc, vc};
    struct kv_layer kv_gpu = {gpu.ops->alloc(gpu.ctx, kv_elems * 2),
                              gpu.ops->alloc(gpu.ctx, kv_elems * 2)};
    struct kv_geom g = {.n_blocks = n_blocks, .block_size = bs, .n_kv_heads = n_kv, .head_dim = hd};
    struct attn_params p = {n_heads, n_kv, hd, 1.0f / sqrtf((float)hd), softcap, window};
    /* step 0 stores every sequence's earlier keys (no attention), step 1 decodes */
    for (int step = 0; step < 2; step++) {
        struct step_batch sb;
        step_batch_make(&sb, step, n_seqs, ctx, bt, max_blocks, bs);
        const struct fwd_batch b = sb.b;
        const int nt = b.n_tokens;
        if (nt == 0) {
            step_batch_free(&sb);
            continue;
        }
        size_t nq = (size_t)nt * n_heads * hd, nk = (size_t)nt * kv_row;
        float *k = rvec(nk), *v = rvec(nk);
        for (size_t i = 0; i < nk; i++) {
            k[i] = round_bf16(k[i] * 2.0f);
            v[i] = round_bf16(v[i]);
        }
        float *dk = dev(k, nk), *dv = dev(v, nk);
        cpu.ops->batch_begin(cpu.ctx, &b);
        cpu.ops->kv_store(cpu.ctx, &kv_cpu, &g, k, v, &b);
        gpu.ops->batch_begin(gpu.ctx, &b);
        gpu.ops->kv_store(gpu.ctx, &kv_gpu, &g, dk, dv, &b);
        if (step) {
            float *q = rvec(nq), *ref = xmalloc(sizeof(float) * nq);
            for (size_t i = 0; i < nq; i++) q[i] *= 2.0f;
            cpu.ops->attention(cpu.ctx, ref, q, &kv_cpu, &g, &b, &p);
            float *dq = dev(q, nq), *dout = poisoned(nq);
            gpu.ops->attention(gpu.ctx, dout, dq, &kv_gpu, &g, &b, &p);
            float *got = back(dout, nq);
            double err = rel_err(got, ref, nq);
            CHECK(err <= attn_bound,
                  "decode attention (%s) %d sequences, heads %d/%d d=%d window %d softcap %g, "
                  "keys from %d: relative error %.3g > %.0e",
                  getenv("PAGODA_CUDA_ATTN"), n_seqs, n_heads, n_kv, hd, window, softcap,
                  ctx[0] + 1, err, attn_bound);
            free(q);
            free(ref);
            free(got);
            gpu.ops->free(gpu.ctx, dq);
            gpu.ops->free(gpu.ctx, dout);
        }
        gpu.ops->free(gpu.ctx, dk);
        gpu.ops->free(gpu.ctx, dv);
        free(k);
        free(v);
        step_batch_free(&sb);
    }
    gpu.ops->free(gpu.ctx, kv_gpu.k);
    gpu.ops->free(gpu.ctx, kv_gpu.v);
    free(kc);
    free(vc);
    free(bt);
    free(ctx);
}

static void test_attention_decode(int n_seqs, int n_heads, int n_kv, int hd, int window,
                                  float softcap)
{
    test_attention_decode_ctx(n_seqs, n_heads, n_kv, hd, window, softcap, 16, 0);
}

static void test_attention_decodes(void)
{
    test_attention_decode(70, 32, 8, 128, 0, 0);     /* 4 query heads per KV head */
    test_attention_decode(64, 16, 2, 128, 0, 0);     /* 8 */
    test_attention_decode(65, 16, 1, 64, 0, 0);      /* 16 */
    test_attention_decode(66, 8, 4, 128, 40, 30.0f); /* window and soft-capping */
    test_attention_decode(67, 12, 4, 64, 0, 0);      /* 3 */
    test_attention_decode(5, 32, 8, 128, 0, 0);      /* few sequences */
    test_attention_decode(6, 32, 2, 128, 0, 0);      /* few, 16 query heads per KV head */
    /* 640 pairs and more (a warp a pair up to 160 SMs): both head sizes, groups up to 8 and
     * of 16 rows, window and soft-capping */
    test_attention_decode(80, 128, 8, 128, 0, 0);     /* 16 */
    test_attention_decode(160, 64, 4, 64, 0, 0);      /* 16 */
    test_attention_decode(170, 12, 4, 64, 0, 0);      /* 3 */
    test_attention_decode(80, 64, 8, 128, 40, 30.0f); /* 8, window and soft-capping */
    /* one sequence of 911 keys (16 ranges of 64 where the decode kernel runs), three of 34
     * to 248 (4 ranges: some of them empty), windows of 40 keys in 8 ranges */
    test_attention_decode_ctx(1, 32, 8, 128, 0, 0, 64, 900);
    test_attention_decode_ctx(3, 32, 8, 128, 0, 0, 16, 200);
    test_attention_decode_ctx(2, 8, 4, 128, 40, 30.0f, 32, 300);
    test_attention_decode_ctx(2, 16, 1, 64, 0, 0, 32, 100); /* 16 query heads a KV head */
}

/* The operations of one layer of a dense model as model_forward records them, on buffers of
 * one backend (x the residual stream). */
struct layer_bufs {
    float *x, *h, *q, *k, *v, *att, *gate, *up, *cs, *sn;
};
struct layer_w {
    const struct qweight *q, *k, *v, *o, *g, *u, *d;
    const float *an, *fn;
};

static void run_layer(const struct backend *be, const struct layer_bufs *t, const struct layer_w *w,
                      const struct kv_layer *kv, const struct kv_geom *g, const struct fwd_batch *b,
                      const struct attn_params *p, int H, int F)
{
    void *c = be->ctx;
    const int n = b->n_tokens, D = p->head_dim;
    be->ops->rms_norm(c, t->h, t->x, w->an, n, H, 1e-5f);
    be->ops->matmul(c, t->q, t->h, w->q, n);
    be->ops->matmul(c, t->k, t->h, w->k, n);
    be->ops->matmul(c, t->v, t->h, w->v, n);
    be->ops->rope(c, t->q, n, p->n_heads, D, t->cs, t->sn);
    be->ops->rope(c, t->k, n, p->n_kv_heads, D, t->cs, t->sn);
    be->ops->kv_store(c, kv, g, t->k, t->v, b);
    be->ops->attention(c, t->att, t->q, kv, g, b, p);
    be->ops->matmul(c, t->h, t->att, w->o, n);
    be->ops->add(c, t->x, t->h, (int64_t)n * H);
    be->ops->rms_norm(c, t->h, t->x, w->fn, n, H, 1e-5f);
    be->ops->matmul(c, t->gate, t->h, w->g, n);
    be->ops->matmul(c, t->up, t->h, w->u, n);
    be->ops->act_mul(c, t->gate, t->gate, t->up, (int64_t)n * F, ACT_SILU);
    be->ops->matmul(c, t->h, t->gate, w->d, n);
    be->ops->add(c, t->x, t->h, (int64_t)n * H);
}

/*
 * A decode step of n_seqs sequences (one token each, over contexts an earlier step stored)
 * through two bf16 layers as the model records them. The CUDA backend then runs q/k/v as one
 * product whose columns the rope + KV store launch reads itself, decode attention writing
 * the o product's bf16 input, skips the float32 results of the norms, the activation and
 * attention that only the next product reads (as bf16) before the second layer overwrites
 * them, and has the first layer's gate and up products write bf16 for the activation. The
 * residual stream and both layers' caches must match the CPU within 1e-2 (products on bf16
 * operands, attention on bf16 scores and probabilities).
 */
static void test_decode_layers(int n_seqs, int d, int max_blocks, int ctx_base)
{
    enum { NL = 2 };
    const int H = 512, hq = 8, hkv = 2, F = 1024, bs = 16, half = d / 2;
    const int n_blocks = n_seqs * max_blocks, kv_row = hkv * d;
    int32_t *bt = interleaved_tables(n_seqs, max_blocks);
    int32_t *ctx = xmalloc(sizeof(int32_t) * (size_t)n_seqs);
    for (int s = 0; s < n_seqs; s++) ctx[s] = (ctx_base + s * 29 + 7) % (bs * max_blocks - 5) + 1;
    const size_t kv_elems = (size_t)n_blocks * bs * kv_row;
    struct kv_geom g = {.n_blocks = n_blocks, .block_size = bs, .n_kv_heads = hkv, .head_dim = d};
    struct attn_params p = {hq, hkv, d, 1.0f / sqrtf((float)d), 0.0f, 0};
    struct kv_layer kv_cpu[NL], kv_gpu[NL];
    struct mat w[NL][7];
    float *an[NL], *fn[NL], *dan[NL], *dfn[NL];
    for (int l = 0; l < NL; l++) {
        kv_cpu[l].k = xcalloc(kv_elems, sizeof(float));
        kv_cpu[l].v = xcalloc(kv_elems, sizeof(float));
        kv_gpu[l].k = gpu.ops->alloc(gpu.ctx, kv_elems * 2);
        kv_gpu[l].v = gpu.ops->alloc(gpu.ctx, kv_elems * 2);
        const int64_t shape[7][2] = {{hq * d, H}, {kv_row, H}, {kv_row, H}, {H, hq * d},
                                     {F, H},      {F, H},      {H, F}};
        for (int j = 0; j < 7; j++) mat_make(&w[l][j], WFMT_BF16, 16, 0, shape[j][0], shape[j][1]);
        /* norm weights of 1/16 of the others' size: attention scores of order 1, as in a
         * trained model (with weights of order 1 they reach hundreds, the probabilities are
         * one-hot, and bf16 rounding anywhere before them flips which key wins) */
        an[l] = rvec(H);
        fn[l] = rvec(H);
        for (int i = 0; i < H; i++) {
            an[l][i] *= 0.0625f;
            fn[l][i] *= 0.0625f;
        }
        dan[l] = dev(an[l], H);
        dfn[l] = dev(fn[l], H);
    }
    /* step 0 stores each sequence's earlier keys in both layers; step 1 decodes */
    for (int step = 0; step < 2; step++) {
        struct step_batch sb;
        step_batch_make(&sb, step, n_seqs, ctx, bt, max_blocks, bs);
        const struct fwd_batch b = sb.b;
        const int nt = b.n_tokens;
        if (!step) {
            const size_t nk = (size_t)nt * kv_row;
            for (int l = 0; l < NL; l++) {
                float *k = rvec(nk), *v = rvec(nk);
                for (size_t i = 0; i < nk; i++) {
                    k[i] = round_bf16(k[i]);
                    v[i] = round_bf16(v[i]);
                }
                float *dk = dev(k, nk), *dv = dev(v, nk);
                cpu.ops->batch_begin(cpu.ctx, &b);
                cpu.ops->kv_store(cpu.ctx, &kv_cpu[l], &g, k, v, &b);
                gpu.ops->batch_begin(gpu.ctx, &b);
                gpu.ops->kv_store(gpu.ctx, &kv_gpu[l], &g, dk, dv, &b);
                gpu.ops->free(gpu.ctx, dk);
                gpu.ops->free(gpu.ctx, dv);
                free(k);
                free(v);
            }
        } else {
            const size_t nh = (size_t)nt * H, nq = (size_t)nt * hq * d, nk = (size_t)nt * kv_row,
                         nf = (size_t)nt * F, nr = (size_t)nt * half;
            float *x = rvec(nh), *cs = rvec(nr), *sn = rvec(nr);
            struct layer_bufs hb = {x,
                                    xmalloc(4 * nh),
                                    xmalloc(4 * nq),
                                    xmalloc(4 * nk),
                                    xmalloc(4 * nk),
                                    xmalloc(4 * nq),
                                    xmalloc(4 * nf),
                                    xmalloc(4 * nf),
                                    cs,
                                    sn};
            struct layer_bufs db = {dev(x, nh),   poisoned(nh), poisoned(nq), poisoned(nk),
                                    poisoned(nk), poisoned(nq), poisoned(nf), poisoned(nf),
                                    dev(cs, nr),  dev(sn, nr)};
            cpu.ops->batch_begin(cpu.ctx, &b);
            gpu.ops->batch_begin(gpu.ctx, &b);
            for (int l = 0; l < NL; l++) {
                struct layer_w lw = {&w[l][0].w, &w[l][1].w, &w[l][2].w, &w[l][3].w, &w[l][4].w,
                                     &w[l][5].w, &w[l][6].w, an[l],      fn[l]};
                struct layer_w gw = {&w[l][0].wg, &w[l][1].wg, &w[l][2].wg,
                                     &w[l][3].wg, &w[l][4].wg, &w[l][5].wg,
                                     &w[l][6].wg, dan[l],      dfn[l]};
                run_layer(&cpu, &hb, &lw, &kv_cpu[l], &g, &b, &p, H, F);
                run_layer(&gpu, &db, &gw, &kv_gpu[l], &g, &b, &p, H, F);
            }
            float *gx = back(db.x, nh);
            const double err = rel_err(gx, hb.x, nh);
            char what[64];
            snprintf(what, sizeof what, "two decode layers, %d sequences, heads of %d", n_seqs, d);
            printf("%s: residual relative error %.3g\n", what, err);
            CHECK(err <= 1e-2, "%s: residual relative error %.3g > 1e-2", what, err);
            for (int l = 0; l < NL; l++) {
                char wl[80];
                snprintf(wl, sizeof wl, "%s, layer %d", what, l);
                check_kv_caches(&kv_gpu[l], kv_cpu[l].k, kv_cpu[l].v, kv_elems, 1e-2, wl);
            }
            free(gx);
            float *hbufs[] = {hb.x, hb.h, hb.q, hb.k, hb.v, hb.att, hb.gate, hb.up, cs, sn};
            for (int i = 0; i < 10; i++) free(hbufs[i]);
            float *dbufs[] = {db.x, db.h, db.q, db.k, db.v, db.att, db.gate, db.up, db.cs, db.sn};
            for (int i = 0; i < 10; i++) gpu.ops->free(gpu.ctx, dbufs[i]);
        }
        step_batch_free(&sb);
    }
    for (int l = 0; l < NL; l++) {
        free(kv_cpu[l].k);
        free(kv_cpu[l].v);
        gpu.ops->free(gpu.ctx, kv_gpu[l].k);
        gpu.ops->free(gpu.ctx, kv_gpu[l].v);
        for (int j = 0; j < 7; j++) mat_free(&w[l][j]);
        free(an[l]);
        free(fn[l]);
        gpu.ops->free(gpu.ctx, dan[l]);
        gpu.ops->free(gpu.ctx, dfn[l]);
    }
    free(bt);
    free(ctx);
}

static void decode_layers_section(void)
{
    /* twice each: the first run of a shape grows scratch buffers and moves the q/k/v
     * matrices next to each other, running the operations recorded before it first, so only
     * the second records each step whole */
    for (int rep = 0; rep < 2; rep++) {
        test_decode_layers(40, 64, 8, 0);    /* one block a token and KV head */
        test_decode_layers(40, 128, 8, 30);  /* heads of 128, as in the 8B shape */
        test_decode_layers(3, 128, 16, 90);  /* few sequences: key ranges, merged by the last */
        test_decode_layers(1, 64, 16, 60);   /* one sequence: the one-row products */
        test_decode_layers(1, 128, 16, 150); /* heads of 128, 159 keys */
        /* 908 keys in 16 ranges: merged by the last range through global memory */
        test_decode_layers(1, 128, 64, 900);
        test_decode_layers(320, 64, 8, 0); /* 640 pairs: a warp a (sequence, KV head) pair */
    }
}

/*
 * Head sizes other than 64 and 128: prefill, mixed and decode steps. Those that are not a
 * multiple of 32 (or over 256) run the float32 kernel with lanes that hold fewer dimensions
 * than the others or none; the sizes below take each of its layouts (dimensions a lane,
 * load width): 2, 48, 50 (2, 2; 1, 24 and 25 lanes), 80, 112 (4, 4), 102 (4, 2: the last lane
 * half full), 176 (6, 2), 200 (8, 8), 226 (8, 2), 320 (10, 2), 354 (12, 2), 384 (12, 4),
 * 448 (14, 2), 510 (16, 2), 512 (16, 8). 256 also runs the tile kernel on tensor cores
 * (steps with prompt tokens or 64 tokens and more).
 */
static void test_attention_head_sizes(void)
{
    test_attention_case(6, 2, 48, 0, 0);       /* 3 query heads a KV head */
    test_attention_case(16, 2, 48, 24, 30.0f); /* 8, window and soft-capping */
    test_attention_case(6, 2, 80, 0, 0);
    test_attention_case(16, 2, 80, 0, 50.0f);
    test_attention_case(14, 2, 112, 24, 0); /* 7: a block of 4 heads and one of 3 */
    test_attention_case(12, 4, 96, 0, 0);
    test_attention_case(12, 4, 192, 0, 0);
    test_attention_case(16, 2, 256, 0, 0);
    test_attention_case(6, 2, 256, 24, 50.0f);
    test_attention_case(32, 1, 256, 0, 0); /* 32 query heads a KV head */
    test_attention_case(6, 2, 512, 0, 0);
    test_attention_case(16, 2, 512, 24, 30.0f);
    const int odd[] = {2, 50, 102, 176, 200, 226, 320, 354, 384, 448, 510};
    for (int i = 0; i < (int)(sizeof odd / sizeof odd[0]); i++)
        test_attention_case(6, 2, odd[i], 0, 0);
    /* decode steps: few sequences split their keys into ranges (merged after); 70 of them
     * take the tile kernel at 256 */
    test_attention_decode(5, 6, 2, 48, 0, 0);
    test_attention_decode(3, 16, 2, 80, 40, 30.0f);
    test_attention_decode(2, 14, 2, 112, 0, 0);
    test_attention_decode(4, 16, 2, 256, 0, 0);
    test_attention_decode(70, 16, 2, 256, 0, 0);
    test_attention_decode(66, 6, 2, 80, 0, 0);
    test_attention_decode(3, 6, 2, 512, 40, 0);
    test_attention_decode_ctx(1, 16, 2, 512, 0, 0, 64, 900); /* 911 keys */
    test_attention_decode_ctx(1, 6, 2, 102, 0, 50.0f, 64, 600);
}

static void test_attention(void)
{
    test_attention_case(4, 2, 32, 0, 0);
    test_attention_case(8, 8, 64, 0, 0);
    test_attention_case(32, 8, 128, 0, 0);
    test_attention_case(16, 2, 128, 0, 0); /* 8 query heads per KV head */
    test_attention_case(4, 2, 256, 24, 0); /* sliding window */
    test_attention_case(8, 4, 96, 0, 50.0f);
    test_attention_case(32, 8, 128, 24, 0);   /* window, 128-wide heads */
    test_attention_case(8, 4, 128, 0, 50.0f); /* soft-capping, 128-wide heads */
    test_attention_case(8, 1, 64, 40, 30.0f); /* 8 heads per KV head, both */
    test_attention_decodes();
    test_attention_head_sizes();
}

/*
 * Batch-invariant mode: the first sequence's decode token gives the same rows, bit for bit,
 * in a step of n_seqs sequences and in a step of its own (the float32 kernel's key ranges
 * are fixed, whatever the batch).
 */
static void test_attention_invariant_case(int n_seqs, int n_heads, int n_kv, int hd)
{
    const int bs = 16, max_blocks = 16, n_blocks = n_seqs * max_blocks, kv_row = n_kv * hd;
    int32_t *bt = interleaved_tables(n_seqs, max_blocks);
    int32_t *ctx = xmalloc(sizeof(int32_t) * (size_t)n_seqs);
    for (int s = 0; s < n_seqs; s++) ctx[s] = (s * 37 + 100) % (bs * max_blocks - 5);
    const size_t kv_elems = (size_t)n_blocks * bs * kv_row, nq1 = (size_t)n_heads * hd;
    struct kv_layer kv = {gpu.ops->alloc(gpu.ctx, kv_elems * 2),
                          gpu.ops->alloc(gpu.ctx, kv_elems * 2)};
    struct kv_geom g = {.n_blocks = n_blocks, .block_size = bs, .n_kv_heads = n_kv, .head_dim = hd};
    struct attn_params p = {n_heads, n_kv, hd, 1.0f / sqrtf((float)hd), 0.0f, 0};
    float *rows[2] = {NULL, NULL};
    /* step 0 stores the earlier keys, step 1 decodes every sequence, step 2 (as step 1 of
     * one sequence) the first alone with the same query, key and value */
    float *q = NULL, *k = NULL, *v = NULL;
    for (int step = 0; step < 3; step++) {
        struct step_batch sb;
        step_batch_make(&sb, step > 0, step == 2 ? 1 : n_seqs, ctx, bt, max_blocks, bs);
        const int nt = sb.b.n_tokens;
        const size_t nk = (size_t)nt * kv_row, nq = (size_t)nt * nq1;
        if (step < 2) {
            free(q);
            free(k);
            free(v);
            q = rvec(nq);
            k = rvec(nk);
            v = rvec(nk);
            for (size_t i = 0; i < nk; i++) {
                k[i] = round_bf16(k[i] * 2.0f);
                v[i] = round_bf16(v[i]);
            }
        }
        float *dk = dev(k, nk), *dv = dev(v, nk);
        gpu.ops->batch_begin(gpu.ctx, &sb.b);
        gpu.ops->kv_store(gpu.ctx, &kv, &g, dk, dv, &sb.b);
        if (step) {
            float *dq = dev(q, nq), *dout = poisoned(nq);
            gpu.ops->attention(gpu.ctx, dout, dq, &kv, &g, &sb.b, &p);
            rows[step - 1] = back(dout, nq1); /* the first token's rows */
            gpu.ops->free(gpu.ctx, dq);
            gpu.ops->free(gpu.ctx, dout);
        }
        gpu.ops->free(gpu.ctx, dk);
        gpu.ops->free(gpu.ctx, dv);
        step_batch_free(&sb);
    }
    CHECK(!memcmp(rows[0], rows[1], sizeof(float) * nq1),
          "batch-invariant attention heads %d/%d d=%d: the first token's rows differ alone and "
          "among %d sequences",
          n_heads, n_kv, hd, n_seqs);
    free(rows[0]);
    free(rows[1]);
    free(q);
    free(k);
    free(v);
    gpu.ops->free(gpu.ctx, kv.k);
    gpu.ops->free(gpu.ctx, kv.v);
    free(bt);
    free(ctx);
}

/* The CUDA backend's attn_check (kernels/cuda/attention.cu), called without a backend too:
 * it reads no device state. */
int cu_attn_check(void *ctx, int head_dim, int n_heads, int n_kv_heads, struct err *e);

/* An attn_check: every even head size up to 512 with GQA groups of 1 to 32 runs; odd, zero
 * and larger sizes and query heads that are not a multiple of the KV heads are refused with
 * a message that names the supported sizes. */
static void check_attn_check(int (*check)(void *, int, int, int, struct err *), void *ctx)
{
    const int heads[][2] = {{1, 1}, {6, 2}, {16, 2}, {32, 8}, {16, 1}, {28, 4}, {32, 1}, {64, 64}};
    struct err e = {0};
    for (int d = 2; d <= 512; d += 2)
        for (int i = 0; i < (int)(sizeof heads / sizeof heads[0]); i++) {
            int r = check(ctx, d, heads[i][0], heads[i][1], &e);
            CHECK(r == 0, "attn_check head_dim %d, %d/%d heads: %d (%s)", d, heads[i][0],
                  heads[i][1], r, e.msg);
        }
    const int bad[][3] = {{0, 8, 2},   {-2, 8, 2},   {1, 8, 2},  {47, 6, 2}, {514, 8, 2},
                          {576, 8, 2}, {1024, 8, 2}, {64, 6, 4}, {64, 2, 4}, {64, 8, 0}};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        e.msg[0] = 0;
        int r = check(ctx, bad[i][0], bad[i][1], bad[i][2], &e);
        CHECK(r == -1 && strstr(e.msg, "even head sizes") && strstr(e.msg, "512"),
              "attn_check head_dim %d, %d/%d heads: %d, message '%s'", bad[i][0], bad[i][1],
              bad[i][2], r, e.msg);
    }
}

/* The backend's operation table has it. */
static void test_attn_check(void)
{
    CHECK(gpu.ops->attn_check != NULL, "the CUDA backend has no attn_check");
    if (gpu.ops->attn_check) check_attn_check(gpu.ops->attn_check, gpu.ctx);
}

/* Canonical order of backend_ops.sample: larger value first, then lower index. */
static const float *cmp_vals;
static int cmp_canon(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = cmp_vals[i], y = cmp_vals[j];
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : i > j;
}

/*
 * Checks one sampled token against backend_ops.sample's definition computed in double:
 * greedy rows exactly; otherwise the token must be the kept candidate (in canonical order)
 * at which the cumulative weight first exceeds u times the kept total, where a target
 * within 1e-6 of the total from a boundary may go either way (the backend sums float
 * weights in fixed point).
 */
static void check_sample(const float *x, int n, const struct sample_row *p, int32_t got,
                         const char *what)
{
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)n);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (x[i] > -INFINITY) ids[m++] = i;
    cmp_vals = x;
    qsort(ids, (size_t)m, sizeof ids[0], cmp_canon);
    if (p->temperature <= 0 || m == 0) {
        CHECK(got == (m ? ids[0] : 0), "sample %s: greedy token %d, want %d", what, got,
              m ? ids[0] : 0);
        free(ids);
        return;
    }
    double mx = x[ids[0]], inv_t = 1.0 / p->temperature;
    if (p->top_k > 0 && p->top_k < m) m = p->top_k;
    if (p->min_p > 0) {
        double cut = mx + log(p->min_p) / inv_t;
        int k = 0;
        while (k < m && x[ids[k]] >= cut) k++;
        m = k;
    }
    double *cum = xmalloc(sizeof(double) * (size_t)(m + 1));
    cum[0] = 0;
    for (int i = 0; i < m; i++) cum[i + 1] = cum[i] + exp((x[ids[i]] - mx) * inv_t);
    double tol = 1e-6 * cum[m];
    int lo = m, hi = m; /* the nucleus may end anywhere in [lo, hi] */
    if (p->top_p < 1.0f) {
        double keep = p->top_p * cum[m];
        lo = 1;
        while (lo < m && cum[lo] < keep - tol) lo++;
        hi = lo;
        while (hi < m && cum[hi] < keep + tol) hi++;
    }
    int pos = 0;
    while (pos < m && ids[pos] != got) pos++;
    CHECK(pos < hi, "sample %s: token %d is not among the %d kept", what, got, hi);
    if (pos < hi) {
        /* with the nucleus ending at e, the target is u * cum[e] */
        int ok = 0;
        for (int e = lo; e <= hi && !ok; e++) {
            double t = p->u * cum[e];
            ok = pos < e && cum[pos] <= t + tol && cum[pos + 1] > t - tol;
        }
        CHECK(ok, "sample %s: token %d at position %d does not hold the draw u = %g", what, got,
              pos, p->u);
    }
    free(cum);
    free(ids);
}

/* backend_ops.sample (PAGODA_CUDA_SAMPLE=1): rows of random logits (some -inf, one of
 * equal values) under each filter, checked against the definition, and every row sampled
 * alone giving the same token as in the batch. */
static void test_sample(void)
{
    const int n = 32000, rows = 9;
    struct sampler_cand *cand = xmalloc(sizeof(struct sampler_cand) * n);
    float *x = rvec((size_t)rows * n);
    for (size_t i = 0; i < (size_t)rows * n; i++) x[i] *= 4.0f;
    for (int i = 0; i < n; i += 7) x[3 * n + i] = -INFINITY;
    for (int i = 0; i < n; i++) x[8 * n + i] = 1.5f; /* ties: canonical order is index order */
    struct sample_row p[9] = {
        {0, 0, 1, 0, 0},       {1.0f, 0, 1, 0, 0},     {0.7f, 50, 1, 0, 0},
        {1.2f, 0, 0.9f, 0, 0}, {0.8f, 0, 1, 0.05f, 0}, {1.0f, 40, 0.8f, 0.02f, 0},
        {2.0f, 0, 0.5f, 0, 0}, {0.5f, 1, 1, 0, 0},     {1.0f, 0, 1, 0, 0},
    };
    for (int round = 0; round < 8; round++) {
        for (int r = 0; r < rows; r++) p[r].u = (float)(rnd() >> 8) / 16777216.0f; /* exact */
        if (round == 0) p[1].u = 0.0f;
        float *dx = dev(x, (size_t)rows * n);
        int32_t got[9], one;
        gpu.ops->sample(gpu.ctx, got, dx, rows, n, p);
        for (int r = 0; r < rows; r++) {
            char what[32];
            snprintf(what, sizeof what, "row %d round %d", r, round);
            check_sample(x + (size_t)r * n, n, &p[r], got[r], what);
            int32_t host = sampler_row_pick(x + (size_t)r * n, n, &p[r], cand);
            CHECK(got[r] == host, "sample %s: token %d, the host sampler's %d (u = %.9g)", what,
                  got[r], host, p[r].u);
            gpu.ops->sample(gpu.ctx, &one, dx + (size_t)r * n, 1, n, &p[r]);
            CHECK(one == got[r], "sample %s: %d alone, %d in the batch", what, one, got[r]);
        }
        CHECK(got[8] == (int32_t)floor((double)p[8].u * n),
              "sample ties: token %d for u = %g over %d equal values", got[8], p[8].u, n);
        gpu.ops->free(gpu.ctx, dx);
    }
    free(x);
    free(cand);
}

/* The host sampler against the kernel, token for token: 96 rows of a 128,256 vocabulary
 * (logits of a model's spread, some -inf, one row of ties, one flat) under temperatures
 * 0.6, 1 and 1.5 with and without each cut, 4 draws each (u = 0, near 1 and random). A
 * seeded request gets the same tokens whichever side samples its rows. */
static void test_sample_host(void)
{
    const int n = 128256, rows = 96;
    float *x = rvec((size_t)rows * n);
    for (size_t i = 0; i < (size_t)rows * n; i++) x[i] *= 6.0f;
    for (int i = 0; i < n; i += 5) x[7 * n + i] = -INFINITY;
    for (int i = 0; i < n; i++) x[11 * n + i] = 0.5f;                         /* ties */
    for (int i = 0; i < n; i++) x[13 * n + i] = 0.05f * x[13 * n + i];        /* flat */
    for (int i = 0; i < n; i++) x[17 * n + i] = floorf(x[17 * n + i]) * 0.5f; /* many ties */
    struct sample_row *p = xmalloc(sizeof(struct sample_row) * rows);
    static const float temps[] = {0.6f, 1.0f, 1.5f};
    struct sampler_cand *cand = xmalloc(sizeof(struct sampler_cand) * n);
    int32_t *got = xmalloc(sizeof(int32_t) * rows);
    float *dx = dev(x, (size_t)rows * n);
    int differ = 0;
    for (int round = 0; round < 4; round++) {
        for (int r = 0; r < rows; r++) {
            int f = r % 8; /* no cut, top-k 40, top-p 0.9, min-p 0.05, all three, ... */
            p[r] = (struct sample_row){.temperature = temps[r % 3],
                                       .top_k = f == 1 || f == 4 ? 40
                                                : f == 6         ? 1000
                                                                 : 0,
                                       .top_p = f == 2 || f == 4 ? 0.9f
                                                : f == 7         ? 0.5f
                                                                 : 1.0f,
                                       .min_p = f == 3 || f == 4 ? 0.05f : 0.0f};
            p[r].u = round == 0   ? 0.0f
                     : round == 1 ? 0.99999994f
                                  : (float)(rnd() >> 8) / 16777216.0f;
        }
        gpu.ops->sample(gpu.ctx, got, dx, rows, n, p);
        for (int r = 0; r < rows; r++) {
            int32_t host = sampler_row_pick(x + (size_t)r * n, n, &p[r], cand);
            if (got[r] != host) differ++;
            CHECK(got[r] == host,
                  "sample host row %d round %d (T %g, top-k %d, top-p %g, min-p %g, u %.9g): "
                  "kernel %d, host %d",
                  r, round, p[r].temperature, p[r].top_k, p[r].top_p, p[r].min_p, p[r].u, got[r],
                  host);
        }
    }
    printf("  sample: kernel and host sampler, %d of %d tokens differ\n", differ, 4 * rows);
    gpu.ops->free(gpu.ctx, dx);
    free(x);
    free(p);
    free(cand);
    free(got);
}

/* Runs fn with `gpu` a backend made with the environment variable var set to val, then
 * restores the default backend. */
static void with_backend(const char *var, const char *val, void (*fn)(void))
{
    struct backend keep = gpu;
    struct err e = {0};
    setenv(var, val, 1);
    CHECK(backend_create(&gpu, "cuda", 0, &e) == 0, "cuda backend (%s=%s): %s", var, val, e.msg);
    fn();
    backend_destroy(&gpu);
    unsetenv(var);
    gpu = keep;
}

static void products_and_fusions(void)
{
    test_matmul_embed();
    test_fusions();
}

/* A 4-bit m = 1 product with more 16-row tiles than the GPU holds blocks at once, so that
 * each block of a tensor-core kernel takes several tiles in turn: the streaming kernel (k =
 * 1024), the ring kernel (k = 1152: one warp a block, up to about 18 blocks an SM, so 4,096
 * tiles), the register one (groups of 256). */
static void test_gemv_tc_many_tiles_case(int group, int n, int k)
{
    struct mat m;
    mat_make(&m, WFMT_AFFINE, 4, group, n, k);
    float *x = rvec(k), *ref = xmalloc(sizeof(float) * n);
    mm_ref(&m.w, x, 1, ref);
    float *dx = dev(x, k), *dy = poisoned(n);
    gpu.ops->matmul(gpu.ctx, dy, dx, &m.wg, 1);
    float *y = back(dy, n);
    double err = rel_err(y, ref, n);
    CHECK(err <= 2e-3, "4-bit m=1 %dx%d groups of %d (many tiles): relative error %.3g > 2e-3", n,
          k, group, err);
    free(x);
    free(ref);
    free(y);
    gpu.ops->free(gpu.ctx, dx);
    gpu.ops->free(gpu.ctx, dy);
    mat_free(&m);
}

static void test_gemv_tc_many_tiles(void)
{
    test_gemv_tc_many_tiles_case(64, 16 * 1024, 1024);
    test_gemv_tc_many_tiles_case(64, 64 * 1024, 1152);
    test_gemv_tc_many_tiles_case(256, 16 * 1024, 1024);
}

/*
 * One decoding token: q/k/v products of its x, rope on q and k and the KV store, as the
 * model records them. The streaming kernels (16-bit and 4-bit) take all of it in one launch
 * (the rope and the store in their epilogue); q, k and both caches must match the CPU
 * within the one-row product bound (1e-4; 2e-3 for 4-bit on tensor cores) and the bf16
 * rounding of the caches (1e-3, or twice the 4-bit product bound).
 */
static void test_qkv_rope_kv(int H, int hq, int hkv, int d, enum wfmt fmt, int bits, int group,
                             int pos)
{
    const int bs = 16, n_blocks = pos / bs + 3, kv_row = hkv * d, half = d / 2;
    int32_t token = 0, p1 = pos, qs[2] = {0, 1}, sl[1] = {pos + 1}, bt[64];
    for (int i = 0; i < n_blocks; i++) bt[i] = n_blocks - 1 - i;
    int32_t slot = bt[pos / bs] * bs + pos % bs;
    struct fwd_batch b = one_seq(1, &token, &p1, &slot, qs, sl, bt, n_blocks);
    struct mat wq, wk, wv;
    mat_make(&wq, fmt, bits, group, (int64_t)hq * d, H);
    mat_make(&wk, fmt, bits, group, kv_row, H);
    mat_make(&wv, fmt, bits, group, kv_row, H);
    const size_t nq = (size_t)hq * d, kv_elems = (size_t)n_blocks * bs * kv_row;
    float *x = rvec(H), *cs = rvec(half), *sn = rvec(half);
    float *q = xmalloc(4 * nq), *k = xmalloc(4 * (size_t)kv_row), *v = xmalloc(4 * (size_t)kv_row);
    float *dx = dev(x, H), *dcs = dev(cs, half), *dsn = dev(sn, half);
    float *dq = poisoned(nq), *dk = poisoned(kv_row), *dv = poisoned(kv_row);
    float *kc = xcalloc(kv_elems, sizeof(float)), *vc = xcalloc(kv_elems, sizeof(float));
    struct kv_layer kv_cpu = {kc, vc};
    struct kv_layer kv_gpu = {gpu.ops->alloc(gpu.ctx, kv_elems * 2),
                              gpu.ops->alloc(gpu.ctx, kv_elems * 2)};
    uint16_t *hb = xcalloc(kv_elems, 2);
    gpu.ops->upload(gpu.ctx, kv_gpu.k, hb, kv_elems * 2);
    gpu.ops->upload(gpu.ctx, kv_gpu.v, hb, kv_elems * 2);
    struct kv_geom g = {.n_blocks = n_blocks, .block_size = bs, .n_kv_heads = hkv, .head_dim = d};
    const struct backend *bes[2] = {&cpu, &gpu};
    for (int i = 0; i < 2; i++) {
        const struct backend *be = bes[i];
        void *c = be->ctx;
        float *bx = i ? dx : x, *bq = i ? dq : q, *bk = i ? dk : k, *bv = i ? dv : v;
        float *bcs = i ? dcs : cs, *bsn = i ? dsn : sn;
        be->ops->batch_begin(c, &b);
        be->ops->matmul(c, bq, bx, i ? &wq.wg : &wq.w, 1);
        be->ops->matmul(c, bk, bx, i ? &wk.wg : &wk.w, 1);
        be->ops->matmul(c, bv, bx, i ? &wv.wg : &wv.w, 1);
        be->ops->rope(c, bq, 1, hq, d, bcs, bsn);
        be->ops->rope(c, bk, 1, hkv, d, bcs, bsn);
        be->ops->kv_store(c, i ? &kv_gpu : &kv_cpu, &g, bk, bv, &b);
    }
    /* 4-bit products on tensor cores round x to fp16 */
    const double e = gemv_tc_case(fmt, bits, group, kv_row, H, 1) ? 2e-3 : 1e-4;
    const struct out_ref outs[] = {
        {"q", dq, q, nq, e}, {"k", dk, k, kv_row, e}, {"v", dv, v, kv_row, e}};
    char what[80];
    snprintf(what, sizeof what, "q/k/v + rope + KV store H=%d %d/%d heads of %d, %d-bit", H, hq,
             hkv, d, bits);
    check_outs(outs, 3, what);
    /* values that already differ by e round to bf16 each on its own, up to half a bf16 step
     * (2^-8 of the value) each way: e + 2^-7 (a few values, as with heads of 8, come close
     * to it; 1e-3 holds for the 16-bit products) */
    check_kv_caches(&kv_gpu, kc, vc, kv_elems, e > 1e-4 ? e + 0x1p-7 : 1e-3, what);
    free(hb);
    float *hbufs[] = {x, cs, sn, q, k, v, kc, vc};
    for (int i = 0; i < 8; i++) free(hbufs[i]);
    float *dbufs[] = {dx, dcs, dsn, kv_gpu.k, kv_gpu.v};
    for (int i = 0; i < 5; i++) gpu.ops->free(gpu.ctx, dbufs[i]);
    mat_free(&wq);
    mat_free(&wk);
    mat_free(&wv);
}

static void rope_kv_cases(void)
{
    test_rope_kv(1, 32, 8, 128);
    test_rope_kv(37, 8, 2, 64);
    test_qkv_rope_kv(1024, 16, 4, 128, WFMT_BF16, 16, 0, 37);
    test_qkv_rope_kv(768, 12, 2, 64, WFMT_F16, 16, 0, 200);
    test_qkv_rope_kv(512, 8, 8, 64, WFMT_BF16, 16, 0, 0);
    /* affine 4-bit: the streaming 4-bit kernel, groups of 64, 32 and 128 */
    test_qkv_rope_kv(1024, 16, 4, 128, WFMT_AFFINE, 4, 64, 37);
    test_qkv_rope_kv(768, 12, 4, 64, WFMT_AFFINE, 4, 32, 5);
    test_qkv_rope_kv(512, 8, 2, 64, WFMT_AFFINE, 4, 128, 0);
    /* heads of 16: two 8-row tiles a head; heads of 8: half a head is less than a tile,
     * rope runs after the products */
    test_qkv_rope_kv(256, 8, 2, 16, WFMT_AFFINE, 4, 64, 3);
    test_qkv_rope_kv(256, 8, 2, 8, WFMT_AFFINE, 4, 64, 3);
}

/* One-row 16-bit products at the 8B shape's widths (H = 4096: rows of 4 to 16 chunks, tens
 * of rows a block, several a warp), then the fused norms, residual adds, gate/up pairs and
 * rope + KV store of the smaller cases. */
static void stream_section(void)
{
    test_norm_fusion_case(4096, WFMT_BF16, 16, 0, 1, 0);
    test_norm_fusion_case(4096, WFMT_BF16, 16, 0, 1, 1);
    test_qkv_rope_kv(4096, 32, 8, 128, WFMT_BF16, 16, 0, 77);
    test_norm_fusion();
    rope_kv_cases();
}

/* Every operation in a launch of its own (PAGODA_CUDA_FUSE=0): rope and the KV store, the
 * norms and residual adds around the one-row products, and a decode step through two
 * layers with none of its operations merged. */
static void no_fuse_section(void)
{
    rope_kv_cases();
    test_norm_fusion();
    decode_layers_section();
}

static void sample_section(void)
{
    CHECK(gpu.ops->sample != NULL, "PAGODA_CUDA_SAMPLE=1: no sample operation");
    if (gpu.ops->sample) {
        test_sample();
        test_sample_host();
    }
}

static void attention_simt(void)
{
    attn_bound = 1e-4;
    test_attention();
}

/* Tensor cores where the head size and the step allow (the default), or the tile kernel
 * wherever the head size allows (PAGODA_CUDA_ATTN=tc). */
static void attention_tc(void)
{
    attn_bound = 1e-2;
    test_attention();
}

/* PAGODA_CUDA_BATCH_INVARIANT=1: the float32 kernel in fixed key ranges for every step. */
static void attention_invariant(void)
{
    attn_bound = 1e-4;
    test_attention();
    test_attention_invariant_case(5, 6, 2, 48);
    test_attention_invariant_case(7, 16, 2, 80);
    test_attention_invariant_case(3, 32, 8, 128);
    test_attention_invariant_case(4, 16, 2, 256);
    test_attention_invariant_case(6, 8, 2, 512);
}

/* The default backend: products, element-wise operations, fusions, rope + KV store. */
static void default_section(void)
{
    products_and_fusions();
    test_elementwise();
    test_picks();
    test_head_pick();
    test_rope_tables();
    rope_kv_cases();
    test_norm_fusion(); /* also 4-bit q/k/v as one set and gate/up as a pair */
    test_gemv_tc_many_tiles();
    attn_bound = 1e-2; /* decode steps of 64 or more sequences: the tensor-core decode kernel */
    test_attention_decodes();
}

#include "ops_hybrid.h"
#include "ops_kvq.h"
#include "ops_ternary.h"

/* Sections, each selectable by name after the test data folder (none: all). Each
 * switchable path runs in a backend of its own, with only its variable set. */
static const struct {
    const char *name, *var, *val;
    void (*fn)(void);
} sections[] = {
    {"default", NULL, NULL, default_section},
    {"attn-check", NULL, NULL, test_attn_check},
    {"attention", NULL, NULL, attention_tc},
    {"attention-simt", "PAGODA_CUDA_ATTN", "simt", attention_simt},
    {"attention-tc", "PAGODA_CUDA_ATTN", "tc", attention_tc},
    {"attention-invariant", "PAGODA_CUDA_BATCH_INVARIANT", "1", attention_invariant},
    {"sample", "PAGODA_CUDA_SAMPLE", "1", sample_section},
    {"no-fuse", "PAGODA_CUDA_FUSE", "0", no_fuse_section},
    {"invariant", "PAGODA_CUDA_BATCH_INVARIANT", "1", products_and_fusions},
    {"decode-layers", NULL, NULL, decode_layers_section},
    {"stream", NULL, NULL, stream_section},
    {"hybrid", NULL, NULL, hybrid_section},
    {"hybrid-invariant", "PAGODA_CUDA_BATCH_INVARIANT", "1", hybrid_invariant_section},
    {"kv-formats", NULL, NULL, kv_formats_section},
    {"ternary", NULL, NULL, ternary_section},
    {"ternary-no-fuse", "PAGODA_CUDA_FUSE", "0", ternary_section},
};
#define N_SECTIONS (int)(sizeof sections / sizeof sections[0])

int main(int argc, char **argv)
{
    for (int a = 2; a < argc; a++) {
        int known = 0;
        for (int i = 0; i < N_SECTIONS; i++) known |= !strcmp(argv[a], sections[i].name);
        if (!known) {
            fprintf(stderr, "test_cuda_ops: no section '%s'; sections:", argv[a]);
            for (int i = 0; i < N_SECTIONS; i++) fprintf(stderr, " %s", sections[i].name);
            fprintf(stderr, "\n");
            return 2;
        }
    }
    int want_check = argc <= 2;
    for (int a = 2; a < argc; a++) want_check |= !strcmp(argv[a], "attn-check");
    if (!backend_cuda_available()) {
        if (want_check) { /* the one part that needs no GPU */
            check_attn_check(cu_attn_check, NULL);
            if (test_failures) TEST_DONE();
        }
        printf("no GPU: not run (this test compares the CUDA backend with the CPU one)\n");
        return 77;
    }
    struct err e = {0};
    /* The reference: the CPU's exact float kernels for every row count (its fast kernels
     * for many rows quantize the input, a rounding of their own that the bounds below do
     * not allow for). The CUDA backend keeps its default products. */
    cpu_batch_invariant_set(1);
    CHECK(backend_cpu_create(&cpu, 0, &e) == 0, "cpu backend: %s", e.msg);
    if (backend_create(&gpu, "cuda", 0, &e)) {
        fprintf(stderr, "cuda backend: %s\n", e.msg);
        return 1;
    }
    struct backend_info bi;
    gpu.ops->info(gpu.ctx, &bi);
    printf("device: %s\n", bi.device);
    for (int round = 0; round < 2; round++) { /* fresh random inputs each round */
        test_rs = 0x9e3779b97f4a7c15ull ^ (uint64_t)(util_now() * 1e6) ^ (uint64_t)round;
        for (int i = 0; i < N_SECTIONS; i++) {
            int run = argc <= 2;
            for (int a = 2; a < argc; a++) run |= !strcmp(argv[a], sections[i].name);
            if (!run) continue;
            printf("section %s, round %d\n", sections[i].name, round);
            fflush(stdout);
            if (sections[i].var)
                with_backend(sections[i].var, sections[i].val, sections[i].fn);
            else
                sections[i].fn();
        }
    }
    backend_destroy(&gpu);
    backend_destroy(&cpu);
    TEST_DONE();
}
