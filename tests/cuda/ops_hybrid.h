/*
 * The `hybrid` and `hybrid-invariant` sections of test_cuda_ops.c (included by it, after its
 * helpers): the operations of the hybrid and MoE families against the CPU backend, then two
 * layers of each kind as the model records them over a prefill, a mixed and two decode steps.
 * Bounds (norm-wise relative error):
 *   - split_qgate, copy and the convolution's state tail: exact;
 *   - float32 arithmetic in another order or with the device's expf (rope_partial, gate_mul,
 *     rms_norm_gated, the convolution's outputs): 1e-5;
 *   - the delta rule (float32 state, sums over k_dim in another order, carried from token to
 *     token and step to step) and the experts through the matrix-vector kernels (few rows, or
 *     every row in batch-invariant mode): 1e-4, but 5e-4 for MLX 4-bit of groups of 64 or
 *     more, whose CPU products take x in 16-bit fixed point (kernels/cpu/affine4_avx2.c: at
 *     the tiny models' 128 x 64 experts the CPU alone is up to 1e-4 from a float64 product);
 *   - the experts grouped on tensor cores (more than 8 rows: x and the activations rounded to
 *     bf16 as operands): 1e-2;
 *   - the layers, residual stream and states: 2e-2 (products with bf16 operands, bf16 KV rows,
 *     the experts grouped on tensor cores; up to 1.1e-2 seen); in batch-invariant mode, every
 *     product in float32: 2e-3 (up to 5e-4 seen).
 * The inputs are random, drawn afresh each run (test_cuda_ops.c seeds from the clock).
 */

/* A sequence of a step: its identity (its KV blocks), first position, tokens and state slot. */
struct hyb_seq {
    int id, pos0, n, state;
};

#define HB_TOKENS 160
#define HB_SEQS   8
#define HB_BS     16 /* KV block size */
#define HB_BLOCKS 8  /* blocks a sequence */

struct hyb_batch {
    struct fwd_batch b;
    int32_t tokens[HB_TOKENS], pos[HB_TOKENS], slot[HB_TOKENS], qs[HB_SEQS + 1], sl[HB_SEQS],
        bt[HB_SEQS * HB_BLOCKS], st[HB_SEQS];
};

static void hyb_batch_make(struct hyb_batch *hb, const struct hyb_seq *seqs, int n_seqs)
{
    int t = 0;
    for (int s = 0; s < n_seqs; s++) {
        const struct hyb_seq *q = &seqs[s];
        hb->qs[s] = t;
        for (int j = 0; j < HB_BLOCKS; j++) hb->bt[s * HB_BLOCKS + j] = q->id * HB_BLOCKS + j;
        for (int j = 0; j < q->n; j++, t++) {
            const int p = q->pos0 + j;
            hb->tokens[t] = 1;
            hb->pos[t] = p;
            hb->slot[t] = (q->id * HB_BLOCKS + p / HB_BS) * HB_BS + p % HB_BS;
        }
        hb->sl[s] = q->pos0 + q->n;
        hb->st[s] = q->state;
    }
    hb->qs[n_seqs] = t;
    hb->b = (struct fwd_batch){.n_tokens = t,
                               .tokens = hb->tokens,
                               .pos = hb->pos,
                               .slot = hb->slot,
                               .n_seqs = n_seqs,
                               .q_start = hb->qs,
                               .seq_len = hb->sl,
                               .block_table = hb->bt,
                               .max_blocks = HB_BLOCKS,
                               .n_logits = 0,
                               .logit_rows = hb->tokens,
                               .state_slot = hb->st};
}

static void scale_vec(float *v, size_t n, float s)
{
    for (size_t i = 0; i < n; i++) v[i] *= s;
}

/* The device buffer d against the host reference ref (n floats) within bound (0: equal). */
static void check_buf(const float *d, const float *ref, size_t n, double bound, const char *what)
{
    float *got = back(d, n);
    const double err = rel_err(got, ref, n);
    CHECK(bound > 0 ? err <= bound : err == 0, "%s: relative error %.3g > %.0e", what, err, bound);
    free(got);
}

/* rope_partial, split_qgate, gate_mul (both gate widths), rms_norm_gated (apart and in place)
 * and copy (each alignment; at once and recorded behind another operation). */
static void test_hybrid_elementwise(void)
{
    const int rows = 7, heads = 3, d = 64;
    const size_t n = (size_t)rows * heads * d;
    float *x = rvec(n), *ref = xmalloc(sizeof(float) * 2 * n);
    char what[96];
    for (int rot = 16; rot <= 64; rot *= 2) { /* rot = d: the whole head */
        float *cs = rvec((size_t)rows * rot / 2), *sn = rvec((size_t)rows * rot / 2);
        float *dcs = dev(cs, (size_t)rows * rot / 2), *dsn = dev(sn, (size_t)rows * rot / 2);
        memcpy(ref, x, sizeof(float) * n);
        cpu.ops->rope_partial(cpu.ctx, ref, rows, heads, d, rot, cs, sn);
        float *dx = dev(x, n);
        gpu.ops->rope_partial(gpu.ctx, dx, rows, heads, d, rot, dcs, dsn);
        snprintf(what, sizeof what, "rope_partial %d of %d", rot, d);
        check_buf(dx, ref, n, 1e-5, what);
        float *bufs[] = {cs, sn};
        for (int i = 0; i < 2; i++) free(bufs[i]);
        float *dbufs[] = {dcs, dsn, dx};
        for (int i = 0; i < 3; i++) gpu.ops->free(gpu.ctx, dbufs[i]);
    }

    /* split_qgate: qg [rows, heads, 2 d] */
    float *qg = rvec(2 * n), *dqg = dev(qg, 2 * n), *dq = poisoned(n), *dgt = poisoned(n);
    cpu.ops->split_qgate(cpu.ctx, ref, ref + n, qg, rows, heads, d);
    gpu.ops->split_qgate(gpu.ctx, dq, dgt, dqg, rows, heads, d);
    check_buf(dq, ref, n, 0, "split_qgate q");
    check_buf(dgt, ref + n, n, 0, "split_qgate gate");

    /* gate_mul, gn = n and gn = 1 */
    const int gw = heads * d, gns[2] = {gw, 1};
    for (int gi = 0; gi < 2; gi++) {
        const int gn = gns[gi];
        float *g = rvec((size_t)rows * gn);
        scale_vec(g, (size_t)rows * gn, 4.0f);
        float *dg = dev(g, (size_t)rows * gn), *dx = dev(x, n);
        memcpy(ref, x, sizeof(float) * n);
        cpu.ops->gate_mul(cpu.ctx, ref, g, rows, gw, gn);
        gpu.ops->gate_mul(gpu.ctx, dx, dg, rows, gw, gn);
        snprintf(what, sizeof what, "gate_mul gn=%d", gn);
        check_buf(dx, ref, n, 1e-5, what);
        free(g);
        gpu.ops->free(gpu.ctx, dg);
        gpu.ops->free(gpu.ctx, dx);
    }

    /* scale (Gemma 4's layer scalars): one rounding, so exact */
    {
        float *dx = dev(x, n);
        memcpy(ref, x, sizeof(float) * n);
        cpu.ops->scale(cpu.ctx, ref, (int64_t)n, 0.3125f);
        gpu.ops->scale(gpu.ctx, dx, (int64_t)n, 0.3125f);
        check_buf(dx, ref, n, 0, "scale");
        gpu.ops->free(gpu.ctx, dx);
    }

    /* rms_norm_gated over rows of 32 and 128 (a value head's width), apart and in place */
    for (int dim = 32; dim <= 128; dim *= 4) {
        const int nr = (int)(n / dim);
        float *z = rvec(n), *w = rvec(dim), *dz = dev(z, n), *dw = dev(w, dim);
        cpu.ops->rms_norm_gated(cpu.ctx, ref, x, z, w, nr, dim, 1e-6f);
        for (int in_place = 0; in_place < 2; in_place++) {
            float *dx = dev(x, n), *dout = in_place ? dx : poisoned(n);
            gpu.ops->rms_norm_gated(gpu.ctx, dout, dx, dz, dw, nr, dim, 1e-6f);
            snprintf(what, sizeof what, "rms_norm_gated dim %d%s", dim,
                     in_place ? " in place" : "");
            check_buf(dout, ref, (size_t)nr * dim, 1e-5, what);
            gpu.ops->free(gpu.ctx, dx);
            if (!in_place) gpu.ops->free(gpu.ctx, dout);
        }
        free(z);
        free(w);
        gpu.ops->free(gpu.ctx, dz);
        gpu.ops->free(gpu.ctx, dw);
    }

    /* copy: 16-byte, 4-byte and 1-byte units; with nothing recorded (at once) and behind a
     * recorded operation (on the tape, in order with it) */
    const size_t sizes[3][2] = {{0, 4 * n}, {4, 4 * n - 12}, {1, 4 * n - 7}}; /* offset, bytes */
    for (int si = 0; si < 3; si++)
        for (int behind = 0; behind < 2; behind++) {
            float *src = dev(x, n), *dst = poisoned(n), *other = dev(x, n), *g = dev(x, n);
            const size_t off = sizes[si][0], bytes = sizes[si][1];
            if (behind) gpu.ops->gate_mul(gpu.ctx, other, g, rows, gw, gw);
            gpu.ops->copy(gpu.ctx, (char *)dst + off, (const char *)src + off, bytes);
            uint8_t *got = xmalloc(4 * n), *want = xmalloc(4 * n);
            gpu.ops->download(gpu.ctx, got, dst, 4 * n);
            memset(want, 0xff, 4 * n); /* the poison's bytes around the copy */
            float nan = NAN;
            for (size_t i = 0; i < n; i++) memcpy(want + 4 * i, &nan, 4);
            memcpy(want + off, (const char *)x + off, bytes);
            CHECK(!memcmp(got, want, 4 * n), "copy of %zu bytes at offset %zu%s differs", bytes,
                  off, behind ? " (recorded)" : "");
            free(got);
            free(want);
            float *dbufs[] = {src, dst, other, g};
            for (int i = 0; i < 4; i++) gpu.ops->free(gpu.ctx, dbufs[i]);
        }
    free(x);
    free(ref);
    free(qg);
    gpu.ops->free(gpu.ctx, dqg);
    gpu.ops->free(gpu.ctx, dq);
    gpu.ops->free(gpu.ctx, dgt);
}

/*
 * Gated DeltaNet over two steps of several sequences in one call each: step 0 starts three
 * sequences at position 0, step 1 continues them (7 tokens, a single token, 2 tokens), starts
 * a fourth at 0 in a slot holding another state, and continues a fifth from a state the test
 * wrote (as an earlier call would have). Every step compares the outputs, the convolution's
 * outputs left in qkv, and all six slots' states (untouched ones included).
 */
static void test_delta_net_case(int hk, int hv, int dk, int dv, int ck)
{
    enum { SLOTS = 6 };
    const int C = 2 * hk * dk + hv * dv;
    const size_t conv_n = (size_t)SLOTS * (ck - 1) * C, rec_n = (size_t)SLOTS * hv * dk * dv;
    float *conv = rvec(conv_n + 1), *rec = rvec(rec_n);
    scale_vec(rec, rec_n, 0.1f);
    struct state_layer sc = {conv, rec}, sg = {dev(conv, conv_n + 1), dev(rec, rec_n)};
    float *cw = rvec((size_t)C * ck), *alog = rvec(hv), *dtb = rvec(hv);
    scale_vec(cw, (size_t)C * ck, 0.5f);
    float *dcw = dev(cw, (size_t)C * ck), *dalog = dev(alog, hv), *ddtb = dev(dtb, hv);
    struct delta_params pc = {hk, hv, dk, dv, ck, cw, alog, dtb};
    struct delta_params pg = {hk, hv, dk, dv, ck, dcw, dalog, ddtb};
    const struct hyb_seq steps[2][5] = {
        {{0, 0, 5, 1}, {1, 0, 3, 3}, {2, 0, 1, 4}},
        {{0, 5, 7, 1}, {1, 3, 1, 3}, {3, 0, 9, 0}, {2, 1, 2, 4}, {4, 11, 3, 5}},
    };
    const int n_seqs[2] = {3, 5};
    for (int step = 0; step < 2; step++) {
        struct hyb_batch hb;
        hyb_batch_make(&hb, steps[step], n_seqs[step]);
        const int n = hb.b.n_tokens;
        const size_t nq = (size_t)n * C, nb = (size_t)n * hv, no = (size_t)n * hv * dv;
        float *qkv = rvec(nq), *beta = rvec(nb), *a = rvec(nb), *out = xmalloc(4 * no);
        scale_vec(beta, nb, 3.0f);
        float *dqkv = dev(qkv, nq), *dbeta = dev(beta, nb), *da = dev(a, nb), *dout = poisoned(no);
        cpu.ops->batch_begin(cpu.ctx, &hb.b);
        cpu.ops->delta_net(cpu.ctx, out, qkv, beta, a, &sc, &pc, &hb.b);
        gpu.ops->batch_begin(gpu.ctx, &hb.b);
        gpu.ops->delta_net(gpu.ctx, dout, dqkv, dbeta, da, &sg, &pg, &hb.b);
        char what[128];
        snprintf(what, sizeof what, "delta_net %d/%d heads of %d/%d, conv %d, step %d", hk, hv, dk,
                 dv, ck, step);
        char w2[160];
        snprintf(w2, sizeof w2, "%s: output", what);
        check_buf(dout, out, no, 1e-4, w2);
        snprintf(w2, sizeof w2, "%s: convolution outputs", what);
        check_buf(dqkv, qkv, nq, 1e-5, w2);
        snprintf(w2, sizeof w2, "%s: convolution tails", what);
        check_buf(sg.conv, conv, conv_n, 0, w2);
        snprintf(w2, sizeof w2, "%s: states", what);
        check_buf(sg.rec, rec, rec_n, 1e-4, w2);
        float *bufs[] = {qkv, beta, a, out};
        for (int i = 0; i < 4; i++) free(bufs[i]);
        float *dbufs[] = {dqkv, dbeta, da, dout};
        for (int i = 0; i < 4; i++) gpu.ops->free(gpu.ctx, dbufs[i]);
    }
    float *bufs[] = {conv, rec, cw, alog, dtb};
    for (int i = 0; i < 5; i++) free(bufs[i]);
    float *dbufs[] = {sg.conv, sg.rec, dcw, dalog, ddtb};
    for (int i = 0; i < 5; i++) gpu.ops->free(gpu.ctx, dbufs[i]);
}

/* E experts of one format: gate, up [I, H] and down [H, I] each, host and prepared copies. */
struct hyb_experts {
    int E;
    struct mat *m;           /* [3 E]: gates, ups, downs */
    struct qweight *hw, *gw; /* [3 E] host and device views, as moe_params takes them */
};

static void experts_make(struct hyb_experts *x, int E, int H, int I, enum wfmt fmt, int bits,
                         int group)
{
    x->E = E;
    x->m = xmalloc(sizeof(struct mat) * 3 * (size_t)E);
    x->hw = xmalloc(sizeof(struct qweight) * 3 * (size_t)E);
    x->gw = xmalloc(sizeof(struct qweight) * 3 * (size_t)E);
    for (int i = 0; i < 3 * E; i++) {
        mat_make(&x->m[i], fmt, bits, group, i < 2 * E ? I : H, i < 2 * E ? H : I);
        x->hw[i] = x->m[i].w;
        x->gw[i] = x->m[i].wg;
    }
}

static void experts_free(struct hyb_experts *x)
{
    for (int i = 0; i < 3 * x->E; i++) mat_free(&x->m[i]);
    free(x->m);
    free(x->hw);
    free(x->gw);
}

static struct moe_params moe_params_of(const struct hyb_experts *x, int K, int norm, int gelu,
                                       int device)
{
    const struct qweight *w = device ? x->gw : x->hw;
    return (struct moe_params){.n_experts = x->E,
                               .top_k = K,
                               .norm_topk = norm,
                               .act = gelu ? ACT_GELU_TANH : ACT_SILU,
                               .gate = w,
                               .up = w + x->E,
                               .down = w + 2 * x->E};
}

/*
 * Routed experts of a format, over 1, 3, 18 and 40 rows (and 1100 with few experts: two chunks
 * of the grouped path): the routing (row 0's logits tie at the top_k-th place: the lower
 * expert wins), the products and each row's sum in expert order. scaled: per-expert scales of
 * the chosen weights (Gemma 4), in [0.5, 1.5].
 */
static void test_moe_case(int E, int K, int H, int I, enum wfmt fmt, int bits, int group, int norm,
                          int gelu, int scaled, int invariant)
{
    struct hyb_experts x;
    experts_make(&x, E, H, I, fmt, bits, group);
    char name[32];
    qweight_format_name(&x.m[0].w, name, sizeof name);
    struct moe_params pc = moe_params_of(&x, K, norm, gelu, 0),
                      pg = moe_params_of(&x, K, norm, gelu, 1);
    float *es = NULL;
    if (scaled) {
        es = xmalloc(sizeof(float) * (size_t)E);
        for (int e = 0; e < E; e++) es[e] = 1.0f + 0.5f * frand();
        pc.expert_scale = pg.expert_scale = es;
    }
    const int rows_list[] = {1, 3, 18, 40, 1100};
    for (int ri = 0; ri < 5; ri++) {
        const int rows = rows_list[ri];
        if (rows > 40 && E > 8) continue;
        const size_t nx = (size_t)rows * H, nr = (size_t)rows * E;
        float *xin = rvec(nx), *router = rvec(nr), *ref = xmalloc(4 * nx);
        scale_vec(router, nr, 2.0f);
        /* row 0: experts 2 .. K clear winners (tied among themselves; K - 1 <= E - 3 here),
         * then experts 1 and E - 2 tied for the last place: 1 must win it */
        for (int e = 0; e < E; e++) router[e] = e >= 2 && e <= K ? 3.0f : frand() * 0.5f;
        router[1] = router[E - 2] = 2.0f;
        float *dx = dev(xin, nx), *dr = dev(router, nr), *dout = poisoned(nx);
        cpu.ops->moe(cpu.ctx, ref, xin, router, &pc, rows, H);
        gpu.ops->moe(gpu.ctx, dout, dx, dr, &pg, rows, H);
        char what[128];
        snprintf(what, sizeof what, "moe %s, %d experts top %d%s%s%s, %d rows", name, E, K,
                 norm ? " renormalized" : "", gelu ? ", gelu" : "", scaled ? ", scaled" : "", rows);
        const double few = fmt == WFMT_AFFINE && bits == 4 && group >= 64 ? 5e-4 : 1e-4;
        /* rows whose entries go through the per-entry products: 8 rows or fewer, the
         * batch-invariant mode, or (shapes whose rows decode in whole units) up to 4 entries
         * an expert, streamed by expert (moe.cu's MOE_XG_PER_EXPERT); else tiles on tensor
         * cores, x rounded to bf16 */
        const int whole = H % 32 == 0 && I % 32 == 0;
        const int exact = rows <= 8 || invariant || (whole && rows * K <= 4 * E);
        check_buf(dout, ref, nx, exact ? few : 1e-2, what);
        if (exact && rows > 8 && whole) {
            /* each entry's result does not depend on the other rows of the step: the first
             * rows alone (the few-row path) give the same bits */
            float *all = back(dout, nx);
            for (int i = 0; i < 3; i++) {
                float *d1 = poisoned((size_t)H);
                gpu.ops->moe(gpu.ctx, d1, dx + (size_t)i * H, dr + (size_t)i * E, &pg, 1, H);
                float *one = back(d1, (size_t)H);
                CHECK(!memcmp(one, all + (size_t)i * H, sizeof(float) * (size_t)H),
                      "%s: row %d alone gives other bits", what, i);
                free(one);
                gpu.ops->free(gpu.ctx, d1);
            }
            free(all);
        }
        free(xin);
        free(router);
        free(ref);
        gpu.ops->free(gpu.ctx, dx);
        gpu.ops->free(gpu.ctx, dr);
        gpu.ops->free(gpu.ctx, dout);
    }
    free(es);
    experts_free(&x);
}

/* ---- two layers of each kind, as the model records them ---- */

/* Shapes of the layer check: hidden 256; gated attention of 4 heads of 64 over 2 KV heads,
 * rotary on 32 of each head's values; Gated DeltaNet of 2 key and 4 value heads of 64; 8
 * experts, top 2, of 128 (bf16 in the linear-attention layer with a gated shared expert of
 * 128, MLX 4-bit in the attention layer, whose experts' result is copied into h), routed by
 * routers of zeros (see test_hybrid_layers). */
enum {
    HL_H = 256,
    HL_HEADS = 4,
    HL_KVH = 2,
    HL_D = 64,
    HL_ROT = 32,
    HL_HK = 2,
    HL_HV = 4,
    HL_DK = 64,
    HL_CK = 4,
    HL_C = 2 * HL_HK * HL_DK + HL_HV * HL_DK,
    HL_E = 8,
    HL_TOPK = 2,
    HL_I = 128,
    HL_SLOTS = 4,
    HL_MAXT = 32,
};

/* Activations of one backend ([HL_MAXT] rows each). */
struct hl_bufs {
    float *x, *h, *qkv, *z, *bb, *aa, *lo, *router, *moe, *sg, *gate, *up, *qg, *q, *qgate, *k, *v,
        *att, *cs, *sn;
};

/* One backend's weights and state. */
struct hl_w {
    const struct qweight *in_qkv, *in_z, *in_b, *in_a, *out, *router, *sgate, *sh_g, *sh_u, *sh_d;
    const struct qweight *wq, *wk, *wv, *wo, *router2;
    struct moe_params moe1, moe2;
    struct delta_params dp;
    const float *an1, *fn1, *nw, *an2, *fn2, *qn, *kn;
    struct state_layer st;
    struct kv_layer kv;
};

static void hl_run(const struct backend *be, const struct hl_bufs *t, const struct hl_w *w,
                   const struct kv_geom *g, const struct fwd_batch *b)
{
    const struct backend_ops *o = be->ops;
    void *c = be->ctx;
    const int n = b->n_tokens, H = HL_H;
    const float eps = 1e-6f;
    /* Gated DeltaNet (blk_linear), then routed experts with the gated shared expert (blk_moe) */
    o->rms_norm(c, t->h, t->x, w->an1, n, H, eps);
    o->matmul(c, t->qkv, t->h, w->in_qkv, n);
    o->matmul(c, t->z, t->h, w->in_z, n);
    o->matmul(c, t->bb, t->h, w->in_b, n);
    o->matmul(c, t->aa, t->h, w->in_a, n);
    o->delta_net(c, t->lo, t->qkv, t->bb, t->aa, &w->st, &w->dp, b);
    o->rms_norm_gated(c, t->lo, t->lo, t->z, w->nw, n * HL_HV, HL_DK, eps);
    o->matmul(c, t->h, t->lo, w->out, n);
    o->add(c, t->x, t->h, (int64_t)n * H);
    o->rms_norm(c, t->h, t->x, w->fn1, n, H, eps);
    o->matmul(c, t->router, t->h, w->router, n);
    o->moe(c, t->moe, t->h, t->router, &w->moe1, n, H);
    o->matmul(c, t->sg, t->h, w->sgate, n);
    o->matmul(c, t->gate, t->h, w->sh_g, n);
    o->matmul(c, t->up, t->h, w->sh_u, n);
    o->act_mul(c, t->gate, t->gate, t->up, (int64_t)n * HL_I, ACT_SILU);
    o->matmul(c, t->h, t->gate, w->sh_d, n);
    o->gate_mul(c, t->h, t->sg, n, H, 1);
    o->add(c, t->h, t->moe, (int64_t)n * H);
    o->add(c, t->x, t->h, (int64_t)n * H);
    /* gated attention with partial rotary (blk_attn), then experts copied into h */
    const int qdim = HL_HEADS * HL_D;
    o->rms_norm(c, t->h, t->x, w->an2, n, H, eps);
    o->matmul(c, t->qg, t->h, w->wq, n);
    o->split_qgate(c, t->q, t->qgate, t->qg, n, HL_HEADS, HL_D);
    o->matmul(c, t->k, t->h, w->wk, n);
    o->matmul(c, t->v, t->h, w->wv, n);
    o->rms_norm(c, t->q, t->q, w->qn, n * HL_HEADS, HL_D, eps);
    o->rms_norm(c, t->k, t->k, w->kn, n * HL_KVH, HL_D, eps);
    o->rope_partial(c, t->q, n, HL_HEADS, HL_D, HL_ROT, t->cs, t->sn);
    o->rope_partial(c, t->k, n, HL_KVH, HL_D, HL_ROT, t->cs, t->sn);
    o->kv_store(c, &w->kv, g, t->k, t->v, b);
    const struct attn_params ap = {HL_HEADS, HL_KVH, HL_D, 1.0f / sqrtf((float)HL_D), 0.0f, 0};
    o->attention(c, t->att, t->q, &w->kv, g, b, &ap);
    o->gate_mul(c, t->att, t->qgate, n, qdim, qdim);
    o->matmul(c, t->h, t->att, w->wo, n);
    o->add(c, t->x, t->h, (int64_t)n * H);
    o->rms_norm(c, t->h, t->x, w->fn2, n, H, eps);
    o->matmul(c, t->router, t->h, w->router2, n);
    o->moe(c, t->moe, t->h, t->router, &w->moe2, n, H);
    o->copy(c, t->h, t->moe, sizeof(float) * (size_t)n * H);
    o->add(c, t->x, t->h, (int64_t)n * H);
}

/* Makes (make) or frees t's buffers of HL_MAXT rows, in host or (device) backend memory. */
static void hl_bufs(struct hl_bufs *t, int device, int make)
{
    const size_t T = HL_MAXT;
    float **f[] = {&t->x,      &t->h,   &t->qkv, &t->z,    &t->bb, &t->aa, &t->lo,
                   &t->router, &t->moe, &t->sg,  &t->gate, &t->up, &t->qg, &t->q,
                   &t->qgate,  &t->k,   &t->v,   &t->att,  &t->cs, &t->sn};
    const size_t n[] = {T * HL_H,
                        T * HL_H,
                        T * HL_C,
                        T * HL_HV * HL_DK,
                        T * HL_HV,
                        T * HL_HV,
                        T * HL_HV * HL_DK,
                        T * HL_E,
                        T * HL_H,
                        T,
                        T * HL_I,
                        T * HL_I,
                        T * 2 * HL_HEADS * HL_D,
                        T * HL_HEADS * HL_D,
                        T * HL_HEADS * HL_D,
                        T * HL_KVH * HL_D,
                        T * HL_KVH * HL_D,
                        T * HL_HEADS * HL_D,
                        T * HL_ROT / 2,
                        T * HL_ROT / 2};
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) {
        if (make)
            *f[i] = device ? poisoned(n[i]) : xcalloc(n[i], sizeof(float));
        else if (device)
            gpu.ops->free(gpu.ctx, *f[i]);
        else
            free(*f[i]);
    }
}

/* A norm weight of dim values around scale. */
static float *norm_w(int dim, float scale)
{
    float *v = rvec(dim);
    for (int i = 0; i < dim; i++) v[i] = scale * (1.0f + 0.25f * v[i]);
    return v;
}

/*
 * Steps: three sequences prefill (fresh states, one of a single token), then a mixed step
 * (two decode, one continues its prompt, a fourth starts), then two decode steps of all four
 * (the second replays the first's graph: same operations, per-step values in the metadata).
 * After each step the residual stream and the recurrent states must match the CPU's.
 */
static void test_hybrid_layers(int invariant)
{
    const double bound = invariant ? 2e-3 : 2e-2; /* see the top of this file */
    const int H = HL_H;
    struct mat mw[15];
    const int64_t shapes[15][2] = {{HL_C, H},
                                   {HL_HV * HL_DK, H},
                                   {HL_HV, H},
                                   {HL_HV, H},
                                   {H, HL_HV * HL_DK},
                                   {HL_E, H},
                                   {1, H},
                                   {HL_I, H},
                                   {HL_I, H},
                                   {H, HL_I},
                                   {2 * HL_HEADS * HL_D, H},
                                   {HL_KVH * HL_D, H},
                                   {HL_KVH * HL_D, H},
                                   {H, HL_HEADS * HL_D},
                                   {HL_E, H}};
    for (int i = 0; i < 15; i++) {
        /* the routers (5, 14) are zeros: every row picks experts 0 and 1 by the tie rule. With
         * products of bf16 operands on one side only, logits a few thousandths apart could
         * pick other experts on the two backends (the op check compares routing on equal
         * logits). */
        test_mat_make(&mw[i].h, WFMT_BF16, 16, 0, shapes[i][0], shapes[i][1], ST_BF16);
        if (i == 5 || i == 14) memset(mw[i].h.data, 0, (size_t)shapes[i][0] * shapes[i][1] * 2);
        mw[i].w = mw[i].wg = mw[i].h.w;
        struct err e = {0};
        CHECK(gpu.ops->weight_prepare(gpu.ctx, &mw[i].wg, &e) == 0, "weight_prepare: %s", e.msg);
    }
    struct hyb_experts e1, e2;
    experts_make(&e1, HL_E, H, HL_I, WFMT_BF16, 16, 0);
    experts_make(&e2, HL_E, H, HL_I, WFMT_AFFINE, 4, 64);
    /* norm weights small enough that scores and activations stay of order 1 */
    float *hv[7] = {norm_w(H, 0.3f), norm_w(H, 0.3f),    norm_w(HL_DK, 1.0f), norm_w(H, 0.3f),
                    norm_w(H, 0.3f), norm_w(HL_D, 0.5f), norm_w(HL_D, 0.5f)};
    const int hv_n[7] = {H, H, HL_DK, H, H, HL_D, HL_D};
    float *cw = rvec((size_t)HL_C * HL_CK), *alog = rvec(HL_HV), *dtb = rvec(HL_HV);
    scale_vec(cw, (size_t)HL_C * HL_CK, 0.5f);
    const size_t conv_n = (size_t)HL_SLOTS * (HL_CK - 1) * HL_C,
                 rec_n = (size_t)HL_SLOTS * HL_HV * HL_DK * HL_DK;
    float *conv0 = rvec(conv_n), *rec0 = rvec(rec_n); /* whatever the slots held before */
    const int n_kv_blocks = HB_SEQS * HB_BLOCKS;
    const size_t kv_elems = (size_t)n_kv_blocks * HB_BS * HL_KVH * HL_D;
    struct kv_geom g = {
        .n_blocks = n_kv_blocks, .block_size = HB_BS, .n_kv_heads = HL_KVH, .head_dim = HL_D};
    struct hl_w w[2]; /* CPU, GPU */
    for (int i = 0; i < 2; i++) {
        struct hl_w *x = &w[i];
        const struct qweight **q[15] = {&x->in_qkv, &x->in_z,  &x->in_b, &x->in_a, &x->out,
                                        &x->router, &x->sgate, &x->sh_g, &x->sh_u, &x->sh_d,
                                        &x->wq,     &x->wk,    &x->wv,   &x->wo,   &x->router2};
        for (int j = 0; j < 15; j++) *q[j] = i ? &mw[j].wg : &mw[j].w;
        x->moe1 = moe_params_of(&e1, HL_TOPK, 1, 0, i);
        x->moe2 = moe_params_of(&e2, HL_TOPK, 0, 0, i);
        const float *nv[7];
        for (int j = 0; j < 7; j++) nv[j] = i ? dev(hv[j], hv_n[j]) : hv[j];
        x->an1 = nv[0];
        x->fn1 = nv[1];
        x->nw = nv[2];
        x->an2 = nv[3];
        x->fn2 = nv[4];
        x->qn = nv[5];
        x->kn = nv[6];
        x->dp = (struct delta_params){HL_HK,
                                      HL_HV,
                                      HL_DK,
                                      HL_DK,
                                      HL_CK,
                                      i ? dev(cw, (size_t)HL_C * HL_CK) : cw,
                                      i ? dev(alog, HL_HV) : alog,
                                      i ? dev(dtb, HL_HV) : dtb};
        if (i) {
            x->st = (struct state_layer){dev(conv0, conv_n), dev(rec0, rec_n)};
            x->kv = (struct kv_layer){gpu.ops->alloc(gpu.ctx, kv_elems * 2),
                                      gpu.ops->alloc(gpu.ctx, kv_elems * 2)};
        } else {
            x->st = (struct state_layer){xmalloc(4 * conv_n), xmalloc(4 * rec_n)};
            memcpy(x->st.conv, conv0, 4 * conv_n);
            memcpy(x->st.rec, rec0, 4 * rec_n);
            x->kv = (struct kv_layer){xcalloc(kv_elems, 4), xcalloc(kv_elems, 4)};
        }
    }
    struct hl_bufs bc, bg;
    hl_bufs(&bc, 0, 1);
    hl_bufs(&bg, 1, 1);
    const struct hyb_seq steps[4][4] = {
        {{0, 0, 11, 2}, {1, 0, 1, 0}, {2, 0, 6, 3}},
        {{0, 11, 1, 2}, {1, 1, 5, 0}, {2, 6, 1, 3}, {3, 0, 9, 1}},
        {{0, 12, 1, 2}, {1, 6, 1, 0}, {2, 7, 1, 3}, {3, 9, 1, 1}},
        {{0, 13, 1, 2}, {1, 7, 1, 0}, {2, 8, 1, 3}, {3, 10, 1, 1}},
    };
    const int n_seqs[4] = {3, 4, 4, 4};
    for (int step = 0; step < 4; step++) {
        struct hyb_batch hb;
        hyb_batch_make(&hb, steps[step], n_seqs[step]);
        const int n = hb.b.n_tokens;
        float *x = rvec((size_t)n * H), *cs = rvec((size_t)n * HL_ROT / 2),
              *sn = rvec((size_t)n * HL_ROT / 2);
        memcpy(bc.x, x, sizeof(float) * n * H);
        memcpy(bc.cs, cs, sizeof(float) * n * HL_ROT / 2);
        memcpy(bc.sn, sn, sizeof(float) * n * HL_ROT / 2);
        gpu.ops->upload(gpu.ctx, bg.x, x, sizeof(float) * n * H);
        gpu.ops->upload(gpu.ctx, bg.cs, cs, sizeof(float) * n * HL_ROT / 2);
        gpu.ops->upload(gpu.ctx, bg.sn, sn, sizeof(float) * n * HL_ROT / 2);
        cpu.ops->batch_begin(cpu.ctx, &hb.b);
        hl_run(&cpu, &bc, &w[0], &g, &hb.b);
        gpu.ops->batch_begin(gpu.ctx, &hb.b);
        hl_run(&gpu, &bg, &w[1], &g, &hb.b);
        char what[96];
        snprintf(what, sizeof what, "hybrid layers, step %d (%d tokens): residual", step, n);
        float *got = back(bg.x, (size_t)n * H);
        const double err = rel_err(got, bc.x, (size_t)n * H);
        printf("hybrid layers, step %d (%d tokens): residual relative error %.3g\n", step, n, err);
        CHECK(err <= bound, "%s relative error %.3g > %g", what, err, bound);
        free(got);
        /* where a difference starts, for the log: the linear-attention layer's convolved
         * q/k/v and its gated output, the attention layer's experts (router logits of zeros:
         * equal on both sides) */
        const struct {
            const float *d, *h;
            size_t n;
            const char *name;
        } parts[] = {{bg.qkv, bc.qkv, (size_t)n * HL_C, "conv"},
                     {bg.lo, bc.lo, (size_t)n * HL_HV * HL_DK, "delta+norm"},
                     {bg.router, bc.router, (size_t)n * HL_E, "router"},
                     {bg.moe, bc.moe, (size_t)n * H, "experts"}};
        printf("  parts:");
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
            float *pg = back(parts[i].d, parts[i].n);
            printf(" %s %.3g", parts[i].name, rel_err(pg, parts[i].h, parts[i].n));
            free(pg);
        }
        printf("\n");
        snprintf(what, sizeof what, "hybrid layers, step %d: convolution tails", step);
        check_buf(w[1].st.conv, w[0].st.conv, conv_n, bound, what);
        snprintf(what, sizeof what, "hybrid layers, step %d: states", step);
        check_buf(w[1].st.rec, w[0].st.rec, rec_n, bound, what);
        free(x);
        free(cs);
        free(sn);
    }
    hl_bufs(&bc, 0, 0);
    hl_bufs(&bg, 1, 0);
    free(w[0].st.conv);
    free(w[0].st.rec);
    free(w[0].kv.k);
    free(w[0].kv.v);
    void *dbufs[] = {(void *)w[1].an1,
                     (void *)w[1].fn1,
                     (void *)w[1].nw,
                     (void *)w[1].an2,
                     (void *)w[1].fn2,
                     (void *)w[1].qn,
                     (void *)w[1].kn,
                     (void *)w[1].dp.conv_w,
                     (void *)w[1].dp.a_log,
                     (void *)w[1].dp.dt_bias,
                     w[1].st.conv,
                     w[1].st.rec,
                     w[1].kv.k,
                     w[1].kv.v};
    for (size_t i = 0; i < sizeof dbufs / sizeof dbufs[0]; i++) gpu.ops->free(gpu.ctx, dbufs[i]);
    for (int i = 0; i < 7; i++) free(hv[i]);
    free(cw);
    free(alog);
    free(dtb);
    free(conv0);
    free(rec0);
    for (int i = 0; i < 15; i++) mat_free(&mw[i]);
    experts_free(&e1);
    experts_free(&e2);
}

static void hybrid_cases(int invariant)
{
    test_hybrid_elementwise();
    test_delta_net_case(2, 4, 32, 32, 4);     /* the tiny models' shape */
    test_delta_net_case(2, 4, 64, 64, 4);     /* the layer check's: two column blocks a head */
    test_delta_net_case(16, 32, 128, 128, 4); /* Qwen3.5 / 3.6 */
    test_delta_net_case(2, 2, 48, 48, 3);     /* rows past k_dim, a part-filled column block */
    test_delta_net_case(1, 2, 160, 40, 2);    /* k_dim past 128: the state in global memory */
    test_moe_case(8, 2, 256, 128, WFMT_BF16, 16, 0, 1, 0, 0, invariant);
    test_moe_case(8, 2, 256, 128, WFMT_AFFINE, 4, 64, 1, 1, 0, invariant);
    test_moe_case(64, 8, 256, 128, WFMT_BF16, 16, 0, 0, 0, 0, invariant);
    test_moe_case(64, 8, 256, 128, WFMT_AFFINE, 4, 64, 0, 0, 0, invariant);
    test_moe_case(8, 2, 192, 96, WFMT_AFFINE, 3, 32, 1, 0, 0, invariant); /* units of 3 bits */
    test_moe_case(8, 2, 100, 60, WFMT_BF16, 16, 0, 1, 0, 0, invariant);   /* element by element */
    test_moe_case(40, 33, 128, 64, WFMT_BF16, 16, 0, 1, 0, 0, invariant); /* top_k past 32 */
    /* Gemma 4's per-expert scales, on the warp and the block routing kernels */
    test_moe_case(8, 2, 256, 128, WFMT_BF16, 16, 0, 1, 1, 1, invariant);
    test_moe_case(40, 33, 128, 64, WFMT_BF16, 16, 0, 1, 0, 1, invariant);
    /* the tiny models' experts (hidden 128, 64 inner): bf16, MLX 4- and 8-bit of group 64 */
    test_moe_case(8, 2, 128, 64, WFMT_BF16, 16, 0, 1, 0, 0, invariant);
    test_moe_case(8, 2, 128, 64, WFMT_AFFINE, 4, 64, 1, 0, 0, invariant);
    test_moe_case(8, 2, 128, 64, WFMT_AFFINE, 8, 64, 0, 0, 0, invariant);
    /* a rank's share of gemma4moe-tiny's experts split 2 and 4 ways (32 and 16 inner): gelu,
     * per-expert scales, down's inputs fewer than a tensor-core tile */
    test_moe_case(8, 2, 128, 32, WFMT_BF16, 16, 0, 1, 1, 1, invariant);
    test_moe_case(8, 2, 128, 16, WFMT_BF16, 16, 0, 1, 1, 1, invariant);
    test_hybrid_layers(invariant);
}

static void hybrid_section(void)
{
    hybrid_cases(0);
}

/* PAGODA_CUDA_BATCH_INVARIANT=1: the experts through the per-entry products for every row. */
static void hybrid_invariant_section(void)
{
    hybrid_cases(1);
}
