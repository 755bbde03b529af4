/*
 * The `ternary` and `ternary-no-fuse` sections of test_cuda_ops.c (included by it, after its
 * helpers): BitNet b1.58's operations against the CPU backend. Bounds:
 *   - ternary products (WFMT_TERNARY): equal values. Both backends quantize each x row to
 *     int8 with the same float operations (absmax, 127 / max(absmax, 1e-5), round half to
 *     even, clamp, NaN to 0), the dots are exact integers, and the scaling is the same three
 *     IEEE operations in the same order (kernels/cuda/ternary.cu);
 *   - act_mul with ReLU^2: equal values ((r * r) * up on both);
 *   - BitNet's MLP and attention output as its layers record them (products over one x
 *     reusing its int8 rows, ReLU^2, the sub-norms before down and o, the residual add and
 *     the next norm): 1e-2. The norms sum in another order, and a last-bit difference moves
 *     a value that sits on a rounding boundary of the int8 quantization after it by one
 *     step of up to 127: about 1e-3 of a dot over 1024 inputs for each such value.
 * Rows with ties at every value (x * s = j + 0.5), an all-zero row with a NaN and a row with
 * one large value are among the inputs.
 */

struct tmat {
    struct qweight w, wg; /* host (CPU backend) and prepared for the GPU */
    uint8_t *data;
};

static void tmat_make(struct tmat *t, int64_t n, int64_t k, float t_div, float t_mul)
{
    memset(t, 0, sizeof *t);
    t->w.fmt = WFMT_TERNARY;
    t->w.bits = 2;
    t->w.n = n;
    t->w.k = k;
    t->w.row_bytes = qweight_ternary_row_bytes(k);
    t->w.t_div = t_div;
    t->w.t_mul = t_mul;
    t->data = xmalloc((size_t)n * t->w.row_bytes);
    int8_t *v = xmalloc((size_t)k);
    for (int64_t r = 0; r < n; r++) {
        for (int64_t j = 0; j < k; j++) v[j] = (int8_t)((int)(rnd() % 3) - 1);
        qweight_ternary_pack(v, k, t->data + (size_t)r * t->w.row_bytes);
    }
    free(v);
    t->w.w = t->data;
    t->wg = t->w;
    struct err e = {0};
    CHECK(gpu.ops->weight_prepare(gpu.ctx, &t->wg, &e) == 0, "weight_prepare (ternary): %s", e.msg);
}

/* x [m, k] random, with special rows where m allows: row 1 all ties (its absmax 127 makes
 * the scale 1, and every other value sits halfway between two integers), row 2 zeros and a
 * NaN, row 3 one value far above the rest. */
static float *ternary_x(int m, int64_t k)
{
    float *x = rvec((size_t)m * (size_t)k);
    if (m > 1)
        for (int64_t j = 0; j < k; j++) x[k + j] = j ? (float)(j % 16) - 7.5f : 127.0f;
    if (m > 2) {
        memset(x + 2 * k, 0, sizeof(float) * (size_t)k);
        x[2 * k + k / 2] = NAN;
    }
    if (m > 3) x[3 * k + k - 1] = 1e4f;
    return x;
}

/* Counts the outputs that differ, reporting the first. */
static int ternary_diff(const float *got, const float *ref, int m, int64_t n, const char *what)
{
    int bad = 0;
    for (size_t i = 0; i < (size_t)m * (size_t)n; i++)
        if (!(got[i] == ref[i])) {
            if (!bad)
                fprintf(stderr, "%s: y[%zu][%zu] = %.9g, cpu %.9g\n", what, i / (size_t)n,
                        i % (size_t)n, (double)got[i], (double)ref[i]);
            bad++;
        }
    return bad;
}

static void ternary_matmul_case(int m, int64_t n, int64_t k, float t_div, float t_mul)
{
    struct tmat a, b;
    tmat_make(&a, n, k, t_div, t_mul);
    tmat_make(&b, n + 40, k, 1.0f, t_mul * 0.5f); /* a second matrix over the same x */
    float *x = ternary_x(m, k);
    float *ref = xmalloc(sizeof(float) * (size_t)m * (size_t)(n + 40));
    float *ref2 = xmalloc(sizeof(float) * (size_t)m * (size_t)(n + 40));
    float *dx = dev(x, (size_t)m * (size_t)k), *dy = poisoned((size_t)m * (size_t)n),
          *dy2 = poisoned((size_t)m * (size_t)(n + 40));
    cpu.ops->matmul(cpu.ctx, ref, x, &a.w, m);
    cpu.ops->matmul(cpu.ctx, ref2, x, &b.w, m);
    gpu.ops->matmul(gpu.ctx, dy, dx, &a.wg, m);
    gpu.ops->matmul(gpu.ctx, dy2, dx, &b.wg, m); /* reuses the int8 rows of the first */
    float *got = back(dy, (size_t)m * (size_t)n), *got2 = back(dy2, (size_t)m * (size_t)(n + 40));
    char what[96];
    snprintf(what, sizeof what, "ternary matmul m=%d n=%lld k=%lld", m, (long long)n, (long long)k);
    int bad = ternary_diff(got, ref, m, n, what);
    CHECK(!bad, "%s: %d of %lld outputs differ from the CPU's", what, bad, (long long)m * n);
    snprintf(what, sizeof what, "ternary matmul m=%d n=%lld k=%lld (x quantized before)", m,
             (long long)(n + 40), (long long)k);
    bad = ternary_diff(got2, ref2, m, n + 40, what);
    CHECK(!bad, "%s: %d of %lld outputs differ from the CPU's", what, bad, (long long)m * (n + 40));
    free(got);
    free(got2);
    gpu.ops->free(gpu.ctx, dx);
    gpu.ops->free(gpu.ctx, dy);
    gpu.ops->free(gpu.ctx, dy2);
    free(x);
    free(ref);
    free(ref2);
    free(a.data);
    free(b.data);
}

static void test_relu2(void)
{
    for (int t = 0; t < 2; t++) {
        const int64_t n = t ? 1001 : 7 * 384; /* the scalar kernel, the float4 one */
        float *g = rvec((size_t)n), *u = rvec((size_t)n), *ref = xmalloc(sizeof(float) * (size_t)n);
        g[5] = NAN; /* relu gives 0 on both */
        g[6] = -0.0f;
        cpu.ops->act_mul(cpu.ctx, ref, g, u, n, ACT_RELU2);
        float *dg = dev(g, (size_t)n), *du = dev(u, (size_t)n), *dout = poisoned((size_t)n);
        gpu.ops->act_mul(gpu.ctx, dout, dg, du, n, ACT_RELU2);
        float *got = back(dout, (size_t)n);
        int bad = ternary_diff(got, ref, 1, n, "act_mul relu2");
        CHECK(!bad, "act_mul relu2 (n %lld): %d values differ from the CPU's", (long long)n, bad);
        free(got);
        free(g);
        free(u);
        free(ref);
        gpu.ops->free(gpu.ctx, dg);
        gpu.ops->free(gpu.ctx, du);
        gpu.ops->free(gpu.ctx, dout);
    }
}

/* Buffers of the BitNet tail on one backend: the model's h, gate, up, att, x. */
struct bn_bufs {
    float *h, *gate, *up, *att, *x, *out;
};

/* blk_mlp and the end of blk_attn as arch_bitnet runs them, then the residual adds and the
 * next layer's norm into out. */
static void bn_run(const struct backend *be, const struct bn_bufs *b, const struct qweight *w,
                   const float *const *norms, int m, int H, int F, int Q)
{
    const struct backend_ops *o = be->ops;
    void *c = be->ctx;
    o->rms_norm(c, b->att, b->att, norms[0], m, Q, 1e-5f); /* attn_sub_norm */
    o->matmul(c, b->h, b->att, &w[0], m);                  /* o */
    o->add(c, b->x, b->h, (int64_t)m * H);
    o->rms_norm(c, b->h, b->x, norms[1], m, H, 1e-5f);
    o->matmul(c, b->gate, b->h, &w[1], m);
    o->matmul(c, b->up, b->h, &w[2], m);
    o->act_mul(c, b->gate, b->gate, b->up, (int64_t)m * F, ACT_RELU2);
    o->rms_norm(c, b->gate, b->gate, norms[2], m, F, 1e-5f); /* ffn_sub_norm */
    o->matmul(c, b->h, b->gate, &w[3], m);                   /* down */
    o->add(c, b->x, b->h, (int64_t)m * H);
    o->rms_norm(c, b->out, b->x, norms[1], m, H, 1e-5f);
}

static void test_bitnet_tail(int m)
{
    const int H = 256, F = 704, Q = 320; /* F and Q: not multiples of 128 */
    struct tmat t[4];
    tmat_make(&t[0], H, Q, 1.3f, 1.0f);
    tmat_make(&t[1], F, H, 1.0f, 0.7f);
    tmat_make(&t[2], F, H, 1.0f, 0.7f);
    tmat_make(&t[3], H, F, 2.0f, 1.0f);
    struct qweight wc[4], wg[4];
    for (int i = 0; i < 4; i++) {
        wc[i] = t[i].w;
        wg[i] = t[i].wg;
    }
    float *n0 = rvec((size_t)Q), *n1 = rvec((size_t)H), *n2 = rvec((size_t)F);
    const float *nc[3] = {n0, n1, n2};
    const float *ng[3] = {dev(n0, (size_t)Q), dev(n1, (size_t)H), dev(n2, (size_t)F)};
    float *att = rvec((size_t)m * Q), *x = rvec((size_t)m * H);
    struct bn_bufs bc = {
        xmalloc(sizeof(float) * (size_t)m * H), xmalloc(sizeof(float) * (size_t)m * F),
        xmalloc(sizeof(float) * (size_t)m * F), xmalloc(sizeof(float) * (size_t)m * Q),
        xmalloc(sizeof(float) * (size_t)m * H), xmalloc(sizeof(float) * (size_t)m * H)};
    memcpy(bc.att, att, sizeof(float) * (size_t)m * Q);
    memcpy(bc.x, x, sizeof(float) * (size_t)m * H);
    struct bn_bufs bg = {poisoned((size_t)m * H), poisoned((size_t)m * F), poisoned((size_t)m * F),
                         dev(att, (size_t)m * Q), dev(x, (size_t)m * H),   poisoned((size_t)m * H)};
    bn_run(&cpu, &bc, wc, nc, m, H, F, Q);
    bn_run(&gpu, &bg, wg, ng, m, H, F, Q);
    float *got = back(bg.out, (size_t)m * H), *gx = back(bg.x, (size_t)m * H);
    double err = rel_err(got, bc.out, (size_t)m * H), errx = rel_err(gx, bc.x, (size_t)m * H);
    CHECK(err <= 1e-2 && errx <= 1e-2,
          "BitNet layer tail (m %d): relative error %.3g (normed), %.3g (residual) > 1e-2", m, err,
          errx);
    free(got);
    free(gx);
    float *hb[] = {bc.h, bc.gate, bc.up, bc.att, bc.x, bc.out, n0, n1, n2, att, x};
    for (size_t i = 0; i < sizeof hb / sizeof hb[0]; i++) free(hb[i]);
    float *db[] = {bg.h, bg.gate, bg.up, bg.att, bg.x, bg.out};
    for (size_t i = 0; i < sizeof db / sizeof db[0]; i++) gpu.ops->free(gpu.ctx, db[i]);
    for (int i = 0; i < 3; i++) gpu.ops->free(gpu.ctx, (void *)ng[i]);
    for (int i = 0; i < 4; i++) free(t[i].data);
}

static void ternary_section(void)
{
    static const int ms[] = {1, 3, 8, 9, 64, 300};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        ternary_matmul_case(ms[i], 256, 1024, 1.0f, 1.0f);
        ternary_matmul_case(ms[i], 200, 1000, 2.5f, 1.0f);   /* k past a block of 128 */
        ternary_matmul_case(ms[i], 72, 300, 1.0f, 0.0421f);  /* n not a multiple of 64 */
        ternary_matmul_case(ms[i], 1000, 100, 0.37f, 1.75f); /* k under one block */
    }
    test_relu2();
    test_bitnet_tail(1);
    test_bitnet_tail(5);
    test_bitnet_tail(77);
}
