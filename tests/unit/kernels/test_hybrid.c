/*
 * The hybrid and MoE operations of the CPU backend, through its operation table:
 *   - Gated DeltaNet: one call over a sequence equals the same tokens split over calls that
 *     continue the slot's state (bitwise), and a sequence's outputs do not depend on the
 *     other sequences of the step; against a double-precision reference of the delta rule;
 *   - routed experts: the routing (softmax, top-k with ties to the lower index, the
 *     renormalized weights) on hand-made router logits with one-hot experts, exact; a row's
 *     output is bitwise the same alone and in a batch;
 *   - the gated norm, the gate multiply and the query/gate split on exact values.
 */
#include <math.h>
#include <string.h>

#include "common/util.h"
#include "model/backend.h"
#include "test_util.h"

static struct backend be;
static const struct backend_ops *o;

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float frand(void)
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((rs >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* Shapes of the Qwen3.5 tiny model: 2 key heads, 4 value heads, head dims 32, conv 4. */
enum { HK = 2, HV = 4, DK = 32, DV = 32, CK = 4, C = 2 * HK * DK + HV * DV };

struct dn {
    float conv_w[C * CK], a_log[HV], dt_bias[HV];
    struct delta_params p;
    struct state_layer st;
};

static void dn_init(struct dn *d, int slots)
{
    for (int i = 0; i < C * CK; i++) d->conv_w[i] = frand() * 0.5f;
    for (int h = 0; h < HV; h++) d->a_log[h] = frand(), d->dt_bias[h] = frand();
    d->p = (struct delta_params){HK, HV, DK, DV, CK, d->conv_w, d->a_log, d->dt_bias};
    d->st.conv = xcalloc((size_t)slots * (CK - 1) * C, sizeof(float));
    d->st.rec = xcalloc((size_t)slots * HV * DK * DV, sizeof(float));
}

/* The delta rule's chunked form for dn_run's next calls: chunk length (0: the token form)
 * and each sequence's mark (fwd_batch.delta_chunked). */
static int dn_chunk;
static int32_t dn_mark[8];

/* Runs sequences (start position, token count, slot) over inputs rows [sum n, C] / [sum n, HV]. */
static void dn_run(struct dn *d, int n_seqs, const int *start, const int *n, const int *slot,
                   const float *qkv_in, const float *b_in, const float *a_in, float *out)
{
    int T = 0, qs[8], pos[256];
    for (int s = 0; s < n_seqs; s++) {
        qs[s] = T;
        for (int j = 0; j < n[s]; j++) pos[T + j] = start[s] + j;
        T += n[s];
    }
    qs[n_seqs] = T;
    float *qkv = xmalloc(sizeof(float) * (size_t)T * C);
    memcpy(qkv, qkv_in, sizeof(float) * (size_t)T * C);
    struct fwd_batch b = {
        .n_tokens = T, .pos = pos, .n_seqs = n_seqs, .q_start = qs, .state_slot = slot};
    if (dn_chunk) b.delta_chunked = dn_mark, b.delta_chunk = dn_chunk;
    o->batch_begin(be.ctx, &b);
    o->delta_net(be.ctx, out, qkv, b_in, a_in, &d->st, &d->p, &b);
    free(qkv);
}

/* The delta rule in double precision from the convolved inputs (conv + SiLU in double too). */
static void dn_reference(const struct dn *d, int n, const float *x, const float *bi,
                         const float *ai, double *out)
{
    static double S[HV][DK][DV];
    memset(S, 0, sizeof S);
    double *y = xmalloc(sizeof(double) * (size_t)n * C);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < C; c++) {
            double acc = 0;
            for (int j = 0; j < CK; j++) {
                int tt = t - (CK - 1) + j;
                if (tt >= 0) acc += (double)d->conv_w[c * CK + j] * x[(size_t)tt * C + c];
            }
            y[(size_t)t * C + c] = acc / (1 + exp(-acc));
        }
    for (int t = 0; t < n; t++)
        for (int h = 0; h < HV; h++) {
            int kh = h / (HV / HK);
            const double *q = y + (size_t)t * C + kh * DK, *k = q + HK * DK;
            const double *v = y + (size_t)t * C + 2 * HK * DK + h * DV;
            double qn = 0, kn = 0;
            for (int i = 0; i < DK; i++) qn += q[i] * q[i], kn += k[i] * k[i];
            qn = 1 / sqrt(qn + 1e-6) / sqrt((double)DK), kn = 1 / sqrt(kn + 1e-6);
            double beta = 1 / (1 + exp(-bi[t * HV + h]));
            double ax = ai[t * HV + h] + d->dt_bias[h];
            double g = -exp(d->a_log[h]) * (ax > 20 ? ax : log1p(exp(ax)));
            for (int c = 0; c < DV; c++) {
                double kv = 0;
                for (int i = 0; i < DK; i++) kv += (S[h][i][c] *= exp(g)) * k[i] * kn;
                double delta = (v[c] - kv) * beta, acc = 0;
                for (int i = 0; i < DK; i++) acc += (S[h][i][c] += k[i] * kn * delta) * q[i] * qn;
                out[((size_t)t * HV + h) * DV + c] = acc;
            }
        }
    free(y);
}

static void test_delta_net(void)
{
    struct dn d;
    dn_init(&d, 3);
    enum { N = 37 };
    float *x = xmalloc(sizeof(float) * 2 * N * C), b[2 * N * HV], a[2 * N * HV];
    for (int i = 0; i < 2 * N * C; i++) x[i] = frand();
    for (int i = 0; i < 2 * N * HV; i++) b[i] = frand() * 2, a[i] = frand() * 2;
    float *whole = xmalloc(sizeof(float) * N * HV * DV),
          *split = xmalloc(sizeof(float) * N * HV * DV);
    float *both = xmalloc(sizeof(float) * 2 * N * HV * DV);

    int st0[1] = {0}, n0[1] = {N}, sl0[1] = {0};
    dn_run(&d, 1, st0, n0, sl0, x, b, a, whole);
    double *ref = xmalloc(sizeof(double) * N * HV * DV);
    dn_reference(&d, N, x, b, a, ref);
    double err = 0, norm = 0;
    for (int i = 0; i < N * HV * DV; i++) {
        err += (whole[i] - ref[i]) * (whole[i] - ref[i]);
        norm += ref[i] * ref[i];
    }
    /* float32 against double over 37 tokens: relative error far under 1e-5 */
    CHECK(sqrt(err / norm) < 1e-5, "delta rule vs double reference: relative error %g",
          sqrt(err / norm));

    /* the same tokens in chunks of 1, 5 and 31 continuing slot 1: bitwise equal */
    int cuts[4] = {0, 1, 6, N};
    for (int k = 0; k < 3; k++) {
        int st[1] = {cuts[k]}, n[1] = {cuts[k + 1] - cuts[k]}, sl[1] = {1};
        dn_run(&d, 1, st, n, sl, x + (size_t)cuts[k] * C, b + cuts[k] * HV, a + cuts[k] * HV,
               split + (size_t)cuts[k] * HV * DV);
    }
    CHECK(!memcmp(whole, split, sizeof(float) * N * HV * DV), "chunked run differs from one call");
    CHECK(!memcmp(d.st.rec, d.st.rec + HV * DK * DV, sizeof(float) * HV * DK * DV) &&
              !memcmp(d.st.conv, d.st.conv + (CK - 1) * C, sizeof(float) * (CK - 1) * C),
          "the states left by one call and by chunks differ");

    /* beside another sequence (slot 2, other inputs) in the same step: the same rows */
    float *x2 = xmalloc(sizeof(float) * 2 * N * C);
    memcpy(x2, x + (size_t)N * C, sizeof(float) * N * C);
    memcpy(x2 + (size_t)N * C, x, sizeof(float) * N * C);
    float b2[2 * N * HV], a2[2 * N * HV];
    memcpy(b2, b + N * HV, sizeof(float) * N * HV), memcpy(b2 + N * HV, b, sizeof(float) * N * HV);
    memcpy(a2, a + N * HV, sizeof(float) * N * HV), memcpy(a2 + N * HV, a, sizeof(float) * N * HV);
    int st2[2] = {0, 0}, n2[2] = {N, N}, sl2[2] = {2, 0};
    dn_run(&d, 2, st2, n2, sl2, x2, b2, a2, both);
    CHECK(!memcmp(whole, both + (size_t)N * HV * DV, sizeof(float) * N * HV * DV),
          "a sequence's rows depend on the other sequence of the step");
    free(x), free(x2), free(whole), free(split), free(both), free(ref);
    free(d.st.conv), free(d.st.rec);
}

static double rel_err(const float *x, const float *y, size_t n)
{
    double err = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        err += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        norm += (double)y[i] * y[i];
    }
    return sqrt(err / norm);
}

/* The chunked form against the token form and the double reference, for chunks of 2 to 64
 * tokens over 37 and 100 tokens (a partial last chunk, which runs token by token past the
 * mark); decays from a_log and dt_bias in [-1, 1] and inputs in [-2, 2] (about 0.98 to 3e-4
 * a token) on two heads, a_log -5 (0.9999 to 0.98) on the other two. Bitwise: one call equals calls
 * split at chunk boundaries and the same sequence beside another; a step that ends inside a chunk
 * falls back to the token form. */
static void test_delta_chunked(void)
{
    static const int chunks[] = {2, 4, 8, 16, 32, 64};
    static const int lens[] = {37, 100};
    struct dn d;
    dn_init(&d, 3);
    for (int h = 0; h < HV; h += 2) d.a_log[h] = -5.0f; /* slow decays: 0.9999 to 0.98 */
    enum { NMAX = 100 };
    float *x = xmalloc(sizeof(float) * 2 * NMAX * C), b[2 * NMAX * HV], a[2 * NMAX * HV];
    for (int i = 0; i < 2 * NMAX * C; i++) x[i] = frand();
    for (int i = 0; i < 2 * NMAX * HV; i++) b[i] = frand() * 2, a[i] = frand() * 2;
    size_t rows = (size_t)NMAX * HV * DV;
    float *tok = xmalloc(sizeof(float) * rows), *chk = xmalloc(sizeof(float) * rows);
    float *split = xmalloc(sizeof(float) * rows), *both = xmalloc(sizeof(float) * 2 * rows);
    float *st_tok = xmalloc(sizeof(float) * HV * DK * DV);
    double *ref = xmalloc(sizeof(double) * rows);
    float *reff = xmalloc(sizeof(float) * rows);
    for (int li = 0; li < 2; li++) {
        int N = lens[li];
        int st0[1] = {0}, n0[1] = {N}, sl0[1] = {0};
        dn_chunk = 0;
        dn_run(&d, 1, st0, n0, sl0, x, b, a, tok);
        memcpy(st_tok, d.st.rec, sizeof(float) * HV * DK * DV);
        dn_reference(&d, N, x, b, a, ref);
        for (size_t i = 0; i < (size_t)N * HV * DV; i++) reff[i] = (float)ref[i];
        for (int ci = 0; ci < 6; ci++) {
            int CC = chunks[ci];
            dn_chunk = CC;
            dn_mark[0] = dn_mark[1] = N / CC * CC;
            dn_run(&d, 1, st0, n0, sl0, x, b, a, chk);
            /* float32 forms of the same rule over up to 100 tokens: relative error under
             * 1e-5, as the token form against double precision */
            size_t n = (size_t)N * HV * DV;
            double e_tok = rel_err(chk, tok, n), e_ref = rel_err(chk, reff, n);
            double e_st = rel_err(d.st.rec, st_tok, (size_t)HV * DK * DV);
            CHECK(e_tok < 1e-5 && e_ref < 1e-5 && e_st < 1e-5,
                  "chunks of %d over %d tokens: relative error %g (token form), %g (double), "
                  "state %g",
                  CC, N, e_tok, e_ref, e_st);
            CHECK(memcmp(chk, tok, sizeof(float) * n) != 0 || CC > N,
                  "chunks of %d over %d tokens: bitwise the token form (chunks not taken?)", CC, N);
            /* split at the first chunk boundary: slot 1, bitwise the same */
            int c1 = CC < N ? CC : N;
            int cuts[3] = {0, c1, N};
            for (int k = 0; k < 2; k++) {
                int st[1] = {cuts[k]}, nn[1] = {cuts[k + 1] - cuts[k]}, sl[1] = {1};
                if (nn[0] == 0) continue;
                dn_run(&d, 1, st, nn, sl, x + (size_t)cuts[k] * C, b + cuts[k] * HV,
                       a + cuts[k] * HV, split + (size_t)cuts[k] * HV * DV);
            }
            CHECK(!memcmp(chk, split, sizeof(float) * n) &&
                      !memcmp(d.st.rec, d.st.rec + HV * DK * DV, sizeof(float) * HV * DK * DV),
                  "chunks of %d: a call split at a chunk boundary differs", CC);
            /* beside another sequence of other inputs (slot 2) */
            int st2[2] = {0, 0}, n2[2] = {N, N}, sl2[2] = {2, 0};
            float *x2 = xmalloc(sizeof(float) * 2 * N * C), b2[2 * NMAX * HV], a2[2 * NMAX * HV];
            memcpy(x2, x + (size_t)NMAX * C, sizeof(float) * N * C);
            memcpy(x2 + (size_t)N * C, x, sizeof(float) * N * C);
            memcpy(b2, b + NMAX * HV, sizeof(float) * N * HV);
            memcpy(b2 + N * HV, b, sizeof(float) * N * HV);
            memcpy(a2, a + NMAX * HV, sizeof(float) * N * HV);
            memcpy(a2 + N * HV, a, sizeof(float) * N * HV);
            dn_run(&d, 2, st2, n2, sl2, x2, b2, a2, both);
            CHECK(!memcmp(chk, both + n, sizeof(float) * n),
                  "chunks of %d: a sequence's rows depend on the other sequence", CC);
            free(x2);
            /* a step ending one token into a chunk: that chunk goes token by token (finite,
             * close), no crash */
            if (CC + 1 < N) {
                int cuts2[3] = {0, CC + 1, N};
                for (int k = 0; k < 2; k++) {
                    int st[1] = {cuts2[k]}, nn[1] = {cuts2[k + 1] - cuts2[k]}, sl[1] = {1};
                    dn_run(&d, 1, st, nn, sl, x + (size_t)cuts2[k] * C, b + cuts2[k] * HV,
                           a + cuts2[k] * HV, split + (size_t)cuts2[k] * HV * DV);
                }
                double e = rel_err(split, tok, n);
                CHECK(e < 1e-5, "chunks of %d, a step ending mid-chunk: relative error %g", CC, e);
            }
        }
    }
    dn_chunk = 0;
    free(x), free(tok), free(chk), free(split), free(both), free(st_tok), free(ref), free(reff);
    free(d.st.conv), free(d.st.rec);
}

/* Experts that add a one-hot: expert e maps x to e_hot * silu(1) * 1 (gate and up rows read
 * x[0] = 1), so out[row] = sum over chosen e of weight_e * silu(1) in column e. */
static void test_moe(void)
{
    enum { E = 6, H = 8, I = 1, K = 2 };
    float gw[E][I * H], uw[E][I * H], dw[E][H * I];
    struct qweight g[E], u[E], dn[E];
    memset(gw, 0, sizeof gw), memset(uw, 0, sizeof uw), memset(dw, 0, sizeof dw);
    for (int e = 0; e < E; e++) {
        gw[e][0] = 1, uw[e][0] = 1, dw[e][e] = 1;
        g[e] = (struct qweight){.fmt = WFMT_F32,
                                .bits = 32,
                                .n = I,
                                .k = H,
                                .w = (const uint8_t *)gw[e],
                                .row_bytes = H * 4};
        u[e] = g[e], u[e].w = (const uint8_t *)uw[e];
        dn[e] = (struct qweight){.fmt = WFMT_F32,
                                 .bits = 32,
                                 .n = H,
                                 .k = I,
                                 .w = (const uint8_t *)dw[e],
                                 .row_bytes = 4};
    }
    struct moe_params p = {E, K, 1, ACT_SILU, g, u, dn, NULL};
    /* rows: a clear top 2 (experts 4, 1); a tie between 2 and 3 for second place (2 wins); */
    float router[3][E] = {{0, 1, 0, 0, 2, 0}, {3, 0, 1, 1, 0, 0}, {0, 0, 0, 0, 0, 5}};
    float x[3][H] = {{1}, {1}, {1}};
    float out[3][H], alone[H];
    o->moe(be.ctx, &out[0][0], &x[0][0], &router[0][0], &p, 3, H);
    double s1 = 1 / (1 + exp(-1.0)); /* silu(1) */
    double e4 = exp(2.0), e1 = exp(1.0);
    CHECK(fabs(out[0][4] - s1 * e4 / (e4 + e1)) < 1e-6 &&
              fabs(out[0][1] - s1 * e1 / (e4 + e1)) < 1e-6 && out[0][0] == 0 && out[0][2] == 0,
          "row 0: experts 4 and 1 weighted %g %g", out[0][4], out[0][1]);
    double e3 = exp(3.0);
    CHECK(fabs(out[1][0] - s1 * e3 / (e3 + e1)) < 1e-6 && out[1][2] > 0 && out[1][3] == 0,
          "row 1: the tie goes to the lower expert: %g %g %g", out[1][0], out[1][2], out[1][3]);
    /* top 2 of a row where 5 dominates: the second is the lowest of the equal rest */
    CHECK(out[2][5] > 0 && out[2][0] > 0 && out[2][1] == 0, "row 2: %g %g", out[2][5], out[2][0]);
    o->moe(be.ctx, alone, &x[1][0], &router[1][0], &p, 1, H);
    CHECK(!memcmp(alone, out[1], sizeof alone), "a row's experts differ alone and in a batch");
    /* without renormalization the weights are the softmax probabilities themselves */
    p.norm_topk = 0;
    o->moe(be.ctx, alone, &x[0][0], &router[0][0], &p, 1, H);
    double z = 4 + e1 + e4;
    CHECK(fabs(alone[4] - s1 * e4 / z) < 1e-6, "softmax weight without renormalization %g",
          alone[4]);
    /* Gemma 4's per-expert scales multiply the renormalized weights: exactly 2x and 0.5x */
    float scale[E] = {1, 0.5f, 1, 1, 2, 1}, scaled[H];
    p.norm_topk = 1;
    p.expert_scale = scale;
    o->moe(be.ctx, scaled, &x[0][0], &router[0][0], &p, 1, H);
    CHECK(scaled[4] == 2 * out[0][4] && scaled[1] == 0.5f * out[0][1],
          "per-expert scales: %g %g, want %g %g", scaled[4], scaled[1], 2 * out[0][4],
          0.5f * out[0][1]);
}

static void test_small_ops(void)
{
    /* q_proj rows of 2 heads of 2: [q0 q0 g0 g0 | q1 q1 g1 g1] */
    float qg[8] = {1, 2, 3, 4, 5, 6, 7, 8}, q[4], gt[4];
    o->split_qgate(be.ctx, q, gt, qg, 1, 2, 2);
    CHECK(q[0] == 1 && q[1] == 2 && q[2] == 5 && q[3] == 6 && gt[0] == 3 && gt[3] == 8,
          "split_qgate");
    float x[4] = {2, 2, 2, 2}, g1[2] = {0, 100}, g4[4] = {0, 0, -100, 100};
    o->gate_mul(be.ctx, x, g1, 2, 2, 1); /* per row: sigmoid(0) = 0.5, sigmoid(100) = 1 */
    CHECK(x[0] == 1 && x[1] == 1 && x[2] == 2 && x[3] == 2, "gate_mul per row");
    o->gate_mul(be.ctx, x, g4, 1, 4, 4);
    CHECK(x[0] == 0.5f && x[1] == 0.5f && x[2] < 1e-30f && x[3] == 2, "gate_mul elementwise");
    /* RMSNorm of (3, 4) is (3, 4) / sqrt(12.5); times w = 2 and silu(z) */
    float v[2] = {3, 4}, z[2] = {0, 1}, w[2] = {2, 2}, r[2];
    o->rms_norm_gated(be.ctx, r, v, z, w, 1, 2, 0);
    CHECK(r[0] == 0 && fabsf(r[1] - 2 * 4 / sqrtf(12.5f) * (1 / (1 + expf(-1)))) < 1e-6f,
          "rms_norm_gated %g %g", r[0], r[1]);
    /* partial rotary over 2 of 4 values by 90 degrees: (a, b) -> (-b, a), the rest kept */
    float h[4] = {1, 2, 3, 4}, c[1] = {0}, s[1] = {1};
    o->rope_partial(be.ctx, h, 1, 1, 4, 2, c, s);
    CHECK(h[0] == -2 && h[1] == 1 && h[2] == 3 && h[3] == 4, "rope_partial %g %g", h[0], h[1]);
    float sc[3] = {1, -2, 0.5f};
    o->scale(be.ctx, sc, 3, 4);
    CHECK(sc[0] == 4 && sc[1] == -8 && sc[2] == 2, "scale %g %g %g", sc[0], sc[1], sc[2]);
}

int main(void)
{
    struct err e = {0};
    if (backend_cpu_create(&be, 2, &e)) return 1;
    o = be.ops;
    test_delta_net();
    test_delta_chunked();
    test_moe();
    test_small_ops();
    backend_destroy(&be);
    TEST_DONE();
}
