/*
 * The MoE and Gated DeltaNet kernels (kernels/cpu/hybrid.c) against their plain definitions
 * (below: one cpu_matmul per expert and product; the delta rule one scalar loop at a time),
 * bitwise, on 1, 2 and 3 threads and every instruction-set path; and batch invariance of the
 * experts: a row's output may not depend on the other rows of its step.
 */
#include <math.h>
#include <string.h>

#include "common/threadpool.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "test_util.h"

#define TEST_SEED 0x51ed2701u
#include "test_mat.h"

/* ---- the definitions ---- */

static void ref_moe(struct threadpool *tp, float *out, const float *x, const float *router,
                    const struct moe_params *p, int rows, int hidden)
{
    int E = p->n_experts, K = p->top_k, inner = (int)p->gate[0].n;
    float *xe = xmalloc(sizeof(float) * (size_t)hidden);
    float *g = xmalloc(sizeof(float) * (size_t)inner), *u = xmalloc(sizeof(float) * (size_t)inner);
    float *y = xmalloc(sizeof(float) * (size_t)hidden);
    int *sel = xmalloc(sizeof(int) * (size_t)K);
    float *wt = xmalloc(sizeof(float) * (size_t)K);
    memset(out, 0, sizeof(float) * (size_t)rows * hidden);
    for (int r = 0; r < rows; r++) {
        const float *lg = router + (size_t)r * E;
        float mx = lg[0];
        for (int e = 1; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += expf(lg[e] - mx);
        for (int i = 0; i < K; i++) { /* the i-th largest; ties to the lower index */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < i; q++) taken |= sel[q] == e;
                if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
            }
            sel[i] = best;
            wt[i] = (float)(expf(lg[best] - mx) / sum);
        }
        if (p->norm_topk) {
            float tot = 0;
            for (int i = 0; i < K; i++) tot += wt[i];
            for (int i = 0; i < K; i++) wt[i] /= tot;
        }
        /* experts add in expert order */
        for (int e = 0; e < E; e++)
            for (int i = 0; i < K; i++) {
                if (sel[i] != e) continue;
                memcpy(xe, x + (size_t)r * hidden, sizeof(float) * (size_t)hidden);
                cpu_matmul(tp, g, xe, &p->gate[e], 1);
                cpu_matmul(tp, u, xe, &p->up[e], 1);
                if (p->act == ACT_SILU)
                    cpu_silu_mul(g, g, u, inner);
                else
                    cpu_gelu_tanh_mul(g, g, u, inner);
                cpu_matmul(tp, y, g, &p->down[e], 1);
                float *o = out + (size_t)r * hidden;
                for (int c = 0; c < hidden; c++) o[c] += y[c] * wt[i];
            }
    }
    free(xe);
    free(g);
    free(u);
    free(y);
    free(sel);
    free(wt);
}

static float softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

static void l2norm(float *dst, const float *x, int n, float scale)
{
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss + 1e-6f) * scale;
    for (int i = 0; i < n; i++) dst[i] = x[i] * inv;
}

static void ref_delta_net(float *out, float *qkv, const float *beta_in, const float *a,
                          const struct state_layer *st, const struct delta_params *p,
                          const struct fwd_batch *b)
{
    int Hk = p->n_k_heads, Hv = p->n_v_heads, dk = p->k_dim, dv = p->v_dim, K = p->conv_k;
    int C = 2 * Hk * dk + Hv * dv, ratio = Hv / Hk;
    for (int s = 0; s < b->n_seqs; s++)
        for (int c = 0; c < C; c++) {
            int t0 = b->q_start[s], t1 = b->q_start[s + 1];
            if (t0 == t1) continue;
            float *tail = st->conv + (size_t)b->state_slot[s] * (size_t)(K - 1) * C;
            const float *w = p->conv_w + (size_t)c * K;
            float win[16];
            for (int i = 0; i < K - 1; i++) win[i] = b->pos[t0] == 0 ? 0.0f : tail[i * C + c];
            for (int t = t0; t < t1; t++) {
                float x = qkv[(size_t)t * C + c], y = 0;
                for (int i = 0; i < K - 1; i++) y += w[i] * win[i];
                y += w[K - 1] * x;
                for (int i = 0; i + 1 < K - 1; i++) win[i] = win[i + 1];
                if (K > 1) win[K - 2] = x;
                qkv[(size_t)t * C + c] = y / (1.0f + expf(-y));
            }
            for (int i = 0; i < K - 1; i++) tail[i * C + c] = win[i];
        }
    float *q = xmalloc(sizeof(float) * (size_t)(2 * dk + 3 * dv));
    float *k = q + dk, *kvm = k + dk, *delta = kvm + dv, *o = delta + dv;
    for (int s = 0; s < b->n_seqs; s++)
        for (int h = 0; h < Hv; h++) {
            int t0 = b->q_start[s], t1 = b->q_start[s + 1], kh = h / ratio;
            if (t0 == t1) continue;
            float *S = st->rec + ((size_t)b->state_slot[s] * Hv + h) * (size_t)dk * dv;
            if (b->pos[t0] == 0) memset(S, 0, sizeof(float) * (size_t)dk * dv);
            float A = -expf(p->a_log[h]);
            for (int t = t0; t < t1; t++) {
                const float *row = qkv + (size_t)t * C;
                l2norm(q, row + kh * dk, dk, 1.0f / sqrtf((float)dk));
                l2norm(k, row + Hk * dk + kh * dk, dk, 1.0f);
                const float *v = row + 2 * Hk * dk + h * dv;
                float beta = 1.0f / (1.0f + expf(-beta_in[t * Hv + h]));
                float decay = expf(A * softplus(a[t * Hv + h] + p->dt_bias[h]));
                memset(kvm, 0, sizeof(float) * (size_t)dv);
                for (int i = 0; i < dk; i++)
                    for (int c = 0; c < dv; c++) {
                        S[i * dv + c] *= decay;
                        kvm[c] += S[i * dv + c] * k[i];
                    }
                for (int c = 0; c < dv; c++) delta[c] = (v[c] - kvm[c]) * beta;
                memset(o, 0, sizeof(float) * (size_t)dv);
                for (int i = 0; i < dk; i++)
                    for (int c = 0; c < dv; c++) {
                        S[i * dv + c] += k[i] * delta[c];
                        o[c] += S[i * dv + c] * q[i];
                    }
                memcpy(out + ((size_t)t * Hv + h) * dv, o, sizeof(float) * (size_t)dv);
            }
        }
    free(q);
}

/* ---- checks ---- */

static int same(const float *a, const float *b, size_t n, size_t *at)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float))) {
            *at = i;
            return 0;
        }
    return 1;
}

static void randv(float *v, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) v[i] = frand() * scale;
}

/* E experts of [I, H] x2 and [H, I] in one format; rows of routing with ties. */
static void check_moe(struct threadpool *tps[3], enum wfmt f, int bits, int group, int E, int K,
                      int H, int I, const char *name)
{
    struct test_mat *mats = xcalloc((size_t)(3 * E), sizeof *mats);
    struct qweight *w = xcalloc((size_t)(3 * E), sizeof *w);
    for (int i = 0; i < 3 * E; i++) {
        int down = i >= 2 * E;
        test_mat_make(&mats[i], f, bits, group, down ? H : I, down ? I : H, ST_BF16);
        w[i] = mats[i].w;
    }
    enum { MAXR = 40 };
    float *x = xmalloc(sizeof(float) * MAXR * (size_t)H), *lg = xmalloc(sizeof(float) * MAXR * E);
    randv(x, (size_t)MAXR * H, 1.0f);
    randv(lg, (size_t)MAXR * E, 2.0f);
    for (int r = 0; r < MAXR; r += 3) lg[r * E + 1] = lg[r * E + E - 1]; /* ties */
    float *want = xmalloc(sizeof(float) * MAXR * (size_t)H),
          *got = xmalloc(sizeof(float) * MAXR * (size_t)H);
    float *alone = xmalloc(sizeof(float) * MAXR * (size_t)H);
    const int rows[] = {1, 2, 3, 5, 8, 17, MAXR};
    for (int act = 0; act < 2; act++) {
        struct moe_params p = {E, K,     act == 0,  act ? ACT_GELU_TANH : ACT_SILU,
                               w, w + E, w + 2 * E, NULL};
        ref_moe(tps[0], want, x, lg, &p, MAXR, H);
        for (int r = 0; r < MAXR; r++)
            cpu_moe(tps[1], alone + (size_t)r * H, x + (size_t)r * H, lg + (size_t)r * E, &p, 1, H);
        size_t at = 0;
        CHECK(same(alone, want, (size_t)MAXR * H, &at), "%s %s act %d alone: [%zu] %.9g want %.9g",
              name, cpu_isa_name(cpu_isa_get()), act, at, alone[at], want[at]);
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++)
            for (int t = 0; t < 3; t++) {
                int n = rows[ri];
                memset(got, 0xff, sizeof(float) * (size_t)n * H);
                cpu_moe(tps[t], got, x, lg, &p, n, H);
                CHECK(same(got, want, (size_t)n * H, &at),
                      "%s %s act %d rows %d threads %d: [%zu] %.9g want %.9g", name,
                      cpu_isa_name(cpu_isa_get()), act, n, t + 1, at, got[at], want[at]);
            }
    }
    for (int i = 0; i < 3 * E; i++) test_mat_free(&mats[i]);
    free(mats);
    free(w);
    free(x);
    free(lg);
    free(want);
    free(got);
    free(alone);
}

/* Three sequences (a fresh prompt, a continued one, a single decode token) in one step,
 * against the definition; then the first sequence again split token by token. */
static void check_delta(struct threadpool *tps[3], int Hk, int Hv, int dk, int dv, int K)
{
    int C = 2 * Hk * dk + Hv * dv, T = 9, slots = 3;
    struct delta_params p = {Hk, Hv, dk, dv, K, NULL, NULL, NULL};
    float *cw = xmalloc(sizeof(float) * (size_t)C * K), *al = xmalloc(sizeof(float) * Hv);
    float *dt = xmalloc(sizeof(float) * Hv);
    randv(cw, (size_t)C * K, 0.8f);
    for (int h = 0; h < Hv; h++) {
        al[h] = logf(1.0f + 7.5f * (frand() + 1.0f));
        dt[h] = 1.0f + 0.2f * frand();
    }
    p.conv_w = cw;
    p.a_log = al;
    p.dt_bias = dt;
    float *qkv0 = xmalloc(sizeof(float) * (size_t)T * C), *bi = xmalloc(sizeof(float) * T * Hv);
    float *ai = xmalloc(sizeof(float) * T * Hv);
    randv(qkv0, (size_t)T * C, 1.0f);
    randv(bi, (size_t)T * Hv, 2.0f);
    randv(ai, (size_t)T * Hv, 2.0f);
    size_t conv_n = (size_t)slots * (K - 1) * C, rec_n = (size_t)slots * Hv * dk * dv;
    float *st0 = xmalloc(sizeof(float) * (conv_n + rec_n));
    randv(st0, conv_n + rec_n, 0.5f);
    /* tokens: sequence 0 (slot 2) a fresh prompt of 5, sequence 1 (slot 0) 3 more tokens
     * from position 7, sequence 2 (slot 1) one token at position 20 */
    int32_t pos[] = {0, 1, 2, 3, 4, 7, 8, 9, 20}, q_start[] = {0, 5, 8, 9}, sslot[] = {2, 0, 1};
    struct fwd_batch b = {
        .n_tokens = T, .pos = pos, .n_seqs = 3, .q_start = q_start, .state_slot = sslot};
    float *want = xmalloc(sizeof(float) * (size_t)T * Hv * dv),
          *got = xmalloc(sizeof(float) * (size_t)T * Hv * dv);
    float *qw = xmalloc(sizeof(float) * (size_t)T * C),
          *qg = xmalloc(sizeof(float) * (size_t)T * C);
    float *sw = xmalloc(sizeof(float) * (conv_n + rec_n)),
          *sg = xmalloc(sizeof(float) * (conv_n + rec_n));
    memcpy(qw, qkv0, sizeof(float) * (size_t)T * C);
    memcpy(sw, st0, sizeof(float) * (conv_n + rec_n));
    struct state_layer stw = {sw, sw + conv_n}, stg = {sg, sg + conv_n};
    ref_delta_net(want, qw, bi, ai, &stw, &p, &b);
    char name[96];
    snprintf(name, sizeof name, "delta %d/%d heads of %d/%d conv %d %s", Hk, Hv, dk, dv, K,
             cpu_isa_name(cpu_isa_get()));
    size_t at = 0;
    for (int t = 0; t < 3; t++) {
        memcpy(qg, qkv0, sizeof(float) * (size_t)T * C);
        memcpy(sg, st0, sizeof(float) * (conv_n + rec_n));
        memset(got, 0xff, sizeof(float) * (size_t)T * Hv * dv);
        cpu_delta_net(tps[t], got, qg, bi, ai, &stg, &p, &b);
        CHECK(same(got, want, (size_t)T * Hv * dv, &at), "%s threads %d out [%zu] %.9g want %.9g",
              name, t + 1, at, got[at], want[at]);
        CHECK(same(qg, qw, (size_t)T * C, &at), "%s threads %d conv [%zu]", name, t + 1, at);
        CHECK(same(sg, sw, conv_n + rec_n, &at), "%s threads %d state [%zu]", name, t + 1, at);
    }
    /* sequence 0's prompt one token a step gives the same outputs and state */
    memcpy(qg, qkv0, sizeof(float) * (size_t)T * C);
    memcpy(sg, st0, sizeof(float) * (conv_n + rec_n));
    for (int t = 0; t < 5; t++) {
        int32_t qs1[] = {0, 1}, sl1[] = {2};
        struct fwd_batch b1 = {
            .n_tokens = 1, .pos = pos + t, .n_seqs = 1, .q_start = qs1, .state_slot = sl1};
        cpu_delta_net(tps[1], got + (size_t)t * Hv * dv, qg + (size_t)t * C, bi + t * Hv,
                      ai + t * Hv, &stg, &p, &b1);
    }
    CHECK(same(got, want, (size_t)5 * Hv * dv, &at), "%s token by token: out [%zu]", name, at);
    size_t s2 = (size_t)2 * Hv * dk * dv;
    CHECK(same(sg + conv_n + s2, sw + conv_n + s2, (size_t)Hv * dk * dv, &at),
          "%s token by token: state [%zu]", name, at);
    free(cw);
    free(al);
    free(dt);
    free(qkv0);
    free(bi);
    free(ai);
    free(st0);
    free(want);
    free(got);
    free(qw);
    free(qg);
    free(sw);
    free(sg);
}

int main(void)
{
    cpu_kernels_init();
    /* the tables are compared bitwise: the fast many-row products (test_gemm.c) are off */
    cpu_batch_invariant_set(1);
    struct threadpool *tps[3] = {tp_create(1), tp_create(2), tp_create(3)};
    enum cpu_isa isas[] = {CPU_ISA_PORTABLE, CPU_ISA_AVX2, CPU_ISA_AVXVNNI, CPU_ISA_AVX512};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!cpu_isa_available(isas[i])) continue;
        cpu_isa_set(isas[i]);
        check_moe(tps, WFMT_BF16, 16, 0, 16, 4, 128, 48, "bf16 16 experts top 4");
        check_moe(tps, WFMT_AFFINE, 4, 64, 16, 4, 128, 64, "mlx4 16 experts top 4");
        check_moe(tps, WFMT_AFFINE, 8, 64, 8, 8, 64, 128, "mlx8 8 experts top 8");
        check_moe(tps, WFMT_F32, 32, 0, 5, 2, 40, 24, "f32 5 experts top 2");
        check_delta(tps, 2, 4, 32, 32, 4);
        check_delta(tps, 1, 3, 24, 40, 3);
        check_delta(tps, 2, 2, 128, 128, 4);
    }
    for (int t = 0; t < 3; t++) tp_destroy(tps[t]);
    TEST_DONE();
}
