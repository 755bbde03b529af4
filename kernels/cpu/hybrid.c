/*
 * The kernels of the hybrid and MoE families on the CPU: Gated DeltaNet (causal conv and
 * the delta rule), partial rotary embeddings and the gated norm. The routed experts are in
 * moe.c.
 *
 * The delta rule runs in one of two forms: one token after another, or (prefill) in chunks
 * of C tokens aligned to positions 0, C, 2C... that fwd_batch.delta_chunked marks, in the
 * WY form of Yang et al.'s Gated DeltaNet. Either way a token's result depends only on its
 * sequence's tokens up to it and on which form its position takes, never on how the tokens
 * are split into steps or batched, provided steps end at chunk boundaries below the mark.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "common/scratch.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/impl.h"

void cpu_rope_partial(float *x, int rows, int heads, int d, int rot, const float *cos_t,
                      const float *sin_t)
{
    int half = rot / 2;
    for (int r = 0; r < rows; r++) {
        const float *c = cos_t + (size_t)r * half, *s = sin_t + (size_t)r * half;
        for (int h = 0; h < heads; h++) {
            float *v = x + ((size_t)r * heads + h) * d;
            for (int j = 0; j < half; j++) {
                float a = v[j], b = v[j + half];
                v[j] = a * c[j] - b * s[j];
                v[j + half] = b * c[j] + a * s[j];
            }
        }
    }
}

void cpu_rms_norm_gated(float *out, const float *x, const float *z, const float *w, int rows,
                        int dim, float eps)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim, *zr = z + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int i = 0; i < dim; i++) {
            float g = zr[i];
            o[i] = w[i] * (xr[i] * inv) * (g / (1.0f + expf(-g)));
        }
    }
}

static float softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x)); /* torch's threshold: exact in float past 20 */
}

static float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

struct delta_job {
    float *out, *qkv;
    const float *beta_in, *a;
    const struct state_layer *st;
    const struct delta_params *p;
    const struct fwd_batch *b;
    int conv_dim;
    int chunk; /* delta-rule chunk length, 0 when no token takes the chunked form */
};

/* The causal depthwise convolution of channel c over sequence s's tokens, with SiLU, in
 * place, continuing the slot's last conv_k - 1 inputs and leaving the new ones there. */
static void conv_channel(const struct delta_job *j, int s, int c)
{
    const struct fwd_batch *b = j->b;
    int C = j->conv_dim, K = j->p->conv_k;
    int t0 = b->q_start[s], t1 = b->q_start[s + 1];
    float *tail = j->st->conv + (size_t)b->state_slot[s] * (size_t)(K - 1) * C;
    const float *w = j->p->conv_w + (size_t)c * K;
    float win[16]; /* the last K - 1 inputs, oldest first (K <= 16, checked at load) */
    int fresh = b->pos[t0] == 0;
    for (int i = 0; i < K - 1; i++) win[i] = fresh ? 0.0f : tail[(size_t)i * C + c];
    for (int t = t0; t < t1; t++) {
        float x = j->qkv[(size_t)t * C + c];
        float y = 0;
        for (int i = 0; i < K - 1; i++) y += w[i] * win[i];
        y += w[K - 1] * x;
        for (int i = 0; i + 1 < K - 1; i++) win[i] = win[i + 1];
        if (K > 1) win[K - 2] = x;
        j->qkv[(size_t)t * C + c] = y / (1.0f + expf(-y));
    }
    for (int i = 0; i < K - 1; i++) tail[(size_t)i * C + c] = win[i];
}

void conv_token_portable(float *x, float *tail, size_t ldt, const float *w, int n, int K, int fresh)
{
    for (int c = 0; c < n; c++) {
        const float *wc = w + (size_t)c * K;
        float xin = x[c], y = 0;
        for (int i = 0; i < K - 1; i++) y += wc[i] * (fresh ? 0.0f : tail[(size_t)i * ldt + c]);
        y += wc[K - 1] * xin;
        for (int i = 0; i + 1 < K - 1; i++)
            tail[(size_t)i * ldt + c] = fresh ? 0.0f : tail[(size_t)(i + 1) * ldt + c];
        if (K > 1) tail[(size_t)(K - 2) * ldt + c] = xin;
        x[c] = y;
    }
}

/* Channels [c0, c0 + n) of sequence s, token after token through the kernel table's
 * convolution step, then SiLU: the same float operations per channel, in the same order, as
 * conv_channel. */
static void conv_span(const struct delta_job *j, int s, int c0, int n)
{
    const struct fwd_batch *b = j->b;
    int C = j->conv_dim, K = j->p->conv_k;
    float *tail = j->st->conv + (size_t)b->state_slot[s] * (size_t)(K - 1) * C + c0;
    for (int t = b->q_start[s]; t < b->q_start[s + 1]; t++) {
        float *x = j->qkv + (size_t)t * C + c0;
        cpu_impl->conv_token(x, tail, (size_t)C, j->p->conv_w + (size_t)c0 * K, n, K,
                             t == b->q_start[s] && b->pos[t] == 0);
        for (int c = 0; c < n; c++) x[c] = x[c] / (1.0f + expf(-x[c]));
    }
}

static void l2norm(float *dst, const float *x, int n, float scale)
{
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss + 1e-6f) * scale;
    for (int i = 0; i < n; i++) dst[i] = x[i] * inv;
}

void delta_step_portable(float *S, const float *q, const float *k, const float *v, int dk, int dv,
                         float decay, float beta, float *o, float *tmp)
{
    float *kvm = tmp, *delta = tmp + dv;
    memset(kvm, 0, sizeof(float) * (size_t)dv);
    for (int i = 0; i < dk; i++) {
        float *Si = S + (size_t)i * dv, ki = k[i];
        for (int c = 0; c < dv; c++) {
            Si[c] *= decay;
            kvm[c] += Si[c] * ki;
        }
    }
    for (int c = 0; c < dv; c++) delta[c] = (v[c] - kvm[c]) * beta;
    memset(o, 0, sizeof(float) * (size_t)dv);
    for (int i = 0; i < dk; i++) {
        float *Si = S + (size_t)i * dv, ki = k[i], qi = q[i];
        for (int c = 0; c < dv; c++) {
            Si[c] += ki * delta[c];
            o[c] += Si[c] * qi;
        }
    }
}

void gemm_portable(float *y, size_t ldy, const float *x, size_t ldx, const float *b, size_t ldb,
                   int M, int K, int N, float scale, int acc)
{
    for (int m = 0; m < M; m++) {
        float *ym = y + m * ldy;
        for (int n = 0; n < N; n++) ym[n] = acc ? scale * ym[n] : 0.0f;
        for (int k = 0; k < K; k++) {
            float xk = x[m * ldx + k];
            const float *bk = b + k * ldb;
            for (int n = 0; n < N; n++) ym[n] += xk * bk[n];
        }
    }
}

/* x * scale / |x| with the sum of squares through the kernel table (the chunked form's
 * own: its order differs from l2norm's). */
static void l2norm_dot(float *dst, const float *x, int n, float scale)
{
    float inv = 1.0f / sqrtf(cpu_impl->dot(x, x, n) + 1e-6f) * scale;
    for (int i = 0; i < n; i++) dst[i] = x[i] * inv;
}

/*
 * C tokens [t, t + C) of value head h in the chunked form, from the state S0 before them.
 * With G_i the running sum of the log decays g (so that token i's state is
 * S_i = e^(G_i) S0 + sum over j <= i of e^(G_i - G_j) k_j d_j^T) and A the strictly lower
 * [C][C] matrix A_ij = beta_i e^(G_i - G_j) k_i.k_j, the value updates are
 * d = T (beta v) - T (beta e^G k) S0 = U - W S0 with T = (I + A)^-1 (forward substitution),
 * o_i = e^(G_i) q_i S0 + sum over j <= i of e^(G_i - G_j) (q_i.k_j) d_j, and
 * S_C = e^(G_C) S0 + sum over j of (e^(G_C - G_j) k_j) d_j^T. Every product but T's goes
 * through the table's gemm: the three with the state take 3 C dk dv multiply-adds, as many
 * as C token steps, in register tiles instead of streaming the state through each token.
 */
static void rule_chunk(const struct delta_job *j, float *S, int h, int kh, int t, int C, float A_h,
                       float *buf)
{
    const struct delta_params *p = j->p;
    int Hv = p->n_v_heads, Hk = p->n_k_heads, dk = p->k_dim, dv = p->v_dim, cd = j->conv_dim;
    size_t c = (size_t)C, ldo = (size_t)Hv * dv;
    float *Q = buf, *K = Q + c * dk, *W = K + c * dk;                         /* [C][dk] each */
    float *Kt = W + c * dk;                                                   /* [dk][C] */
    float *U = Kt + c * dk, *Y = U + c * dv;                                  /* [C][dv] each */
    float *A = Y + c * dv, *T = A + c * c, *TU = T + c * c, *TW = TU + c * c; /* [C][C] each */
    float *M = TW + c * c, *beta = M + c * c, *G = beta + c;
    const float *v0 = j->qkv + (size_t)t * cd + (size_t)2 * Hk * dk + (size_t)h * dv;
    float *o0 = j->out + ((size_t)t * Hv + h) * dv;
    float g = 0;
    for (int i = 0; i < C; i++) {
        const float *row = j->qkv + (size_t)(t + i) * cd;
        beta[i] = sigmoid(j->beta_in[(size_t)(t + i) * Hv + h]);
        g += A_h * softplus(j->a[(size_t)(t + i) * Hv + h] + p->dt_bias[h]);
        G[i] = g;
        l2norm_dot(Q + i * dk, row + (size_t)kh * dk, dk, 1.0f / sqrtf((float)dk));
        l2norm_dot(K + i * dk, row + (size_t)Hk * dk + (size_t)kh * dk, dk, 1.0f);
        for (int r = 0; r < dk; r++) Kt[(size_t)r * C + i] = K[i * dk + r];
    }
    /* A = K K^T and M = Q K^T, then their decays: A strictly lower times beta_i
     * e^(G_i - G_j), M lower times e^(G_i - G_j) */
    cpu_impl->gemm(A, c, K, (size_t)dk, Kt, c, C, dk, C, 0.0f, 0);
    cpu_impl->gemm(M, c, Q, (size_t)dk, Kt, c, C, dk, C, 0.0f, 0);
    for (int i = 0; i < C; i++)
        for (int jj = 0; jj < C; jj++) {
            float e = jj <= i ? expf(G[i] - G[jj]) : 0.0f;
            A[i * c + jj] = jj < i ? beta[i] * e * A[i * c + jj] : 0.0f;
            M[i * c + jj] = e * M[i * c + jj];
        }
    /* T = (I + A)^-1, unit lower: row i from the rows above it; then TU = T diag(beta),
     * TW = T diag(beta e^G) */
    for (int i = 0; i < C; i++)
        for (int jj = 0; jj <= i; jj++) {
            float x = jj == i ? 1.0f : 0.0f;
            for (int m = jj; m < i; m++) x -= A[i * c + m] * T[m * c + jj];
            T[i * c + jj] = x;
            TU[i * c + jj] = x * beta[jj];
            TW[i * c + jj] = x * beta[jj] * expf(G[jj]);
        }
    for (int i = 0; i < C; i++)
        for (int jj = i + 1; jj < C; jj++) TU[i * c + jj] = TW[i * c + jj] = 0.0f;
    cpu_impl->gemm(U, (size_t)dv, TU, c, v0, (size_t)cd, C, C, dv, 0.0f, 0);
    cpu_impl->gemm(W, (size_t)dk, TW, c, K, (size_t)dk, C, C, dk, 0.0f, 0);
    /* d = U - W S0; o = e^G (Q S0) + M d; S = e^(G_C) S0 + (e^(G_C - G) K)^T d */
    cpu_impl->gemm(Y, (size_t)dv, W, (size_t)dk, S, (size_t)dv, C, dk, dv, 0.0f, 0);
    for (size_t i = 0; i < c * dv; i++) U[i] -= Y[i];
    cpu_impl->gemm(o0, ldo, Q, (size_t)dk, S, (size_t)dv, C, dk, dv, 0.0f, 0);
    for (int i = 0; i < C; i++) {
        float e = expf(G[i]), *oi = o0 + i * ldo;
        for (int x = 0; x < dv; x++) oi[x] *= e;
    }
    cpu_impl->gemm(o0, ldo, M, c, U, (size_t)dv, C, C, dv, 1.0f, 1);
    for (int jj = 0; jj < C; jj++) {
        float e = expf(G[C - 1] - G[jj]);
        for (int r = 0; r < dk; r++) Kt[(size_t)r * C + jj] *= e;
    }
    cpu_impl->gemm(S, (size_t)dv, Kt, c, U, (size_t)dv, dk, C, dv, expf(G[C - 1]), 1);
}

/* Floats of rule_head's buffer for chunks of C tokens (0: the token form alone). */
static size_t rule_buf_floats(const struct delta_params *p, int C)
{
    size_t dk = (size_t)p->k_dim, dv = (size_t)p->v_dim, c = (size_t)C;
    size_t chunk = c * (4 * dk + 2 * dv + 2) + 5 * c * c;
    size_t token = 2 * dk + 2 * dv;
    return chunk > token ? chunk : token;
}

/* The delta rule of value head h over sequence s's tokens (their channels convolved). */
static void rule_head(const struct delta_job *j, int s, int h, float *buf)
{
    const struct delta_params *p = j->p;
    const struct fwd_batch *b = j->b;
    int Hv = p->n_v_heads, dk = p->k_dim, dv = p->v_dim, C = j->conv_dim;
    int kh = h / (Hv / p->n_k_heads);
    int t0 = b->q_start[s], t1 = b->q_start[s + 1];
    float *q = buf, *k = buf + dk, *tmp = k + dk;
    float *S = j->st->rec + ((size_t)b->state_slot[s] * Hv + h) * (size_t)dk * dv;
    if (b->pos[t0] == 0) memset(S, 0, sizeof(float) * (size_t)dk * dv);
    float A = -expf(p->a_log[h]);
    int CC = j->chunk, mark = CC ? b->delta_chunked[s] : 0;
    for (int t = t0; t < t1; t++) {
        int pt = b->pos[t];
        if (CC && pt % CC == 0 && pt + CC <= mark && t + CC <= t1) {
            rule_chunk(j, S, h, kh, t, CC, A, buf);
            t += CC - 1;
            continue;
        }
        const float *row = j->qkv + (size_t)t * C;
        l2norm(q, row + (size_t)kh * dk, dk, 1.0f / sqrtf((float)dk));
        l2norm(k, row + (size_t)p->n_k_heads * dk + (size_t)kh * dk, dk, 1.0f);
        const float *v = row + (size_t)2 * p->n_k_heads * dk + (size_t)h * dv;
        float beta = sigmoid(j->beta_in[(size_t)t * Hv + h]);
        float decay = expf(A * softplus(j->a[(size_t)t * Hv + h] + p->dt_bias[h]));
        cpu_impl->delta_step(S, q, k, v, dk, dv, decay, beta, j->out + ((size_t)t * Hv + h) * dv,
                             tmp);
    }
}

static float *rule_buf(const struct delta_job *j)
{
    return scratch_get(SCRATCH_DELTA, rule_buf_floats(j->p, j->chunk));
}

/* Phase 1 of the two-job form, one (sequence, channel) per item. */
static void conv_task(void *arg, int ith, int nth)
{
    struct delta_job *j = arg;
    const struct fwd_batch *b = j->b;
    int C = j->conv_dim;
    long lo, hi;
    tp_range((long)b->n_seqs * C, ith, nth, 16, &lo, &hi);
    for (long item = lo; item < hi; item++) {
        int s = (int)(item / C);
        if (b->q_start[s] < b->q_start[s + 1]) conv_channel(j, s, (int)(item % C));
    }
}

/* Phase 2, one (sequence, value head) per item. */
static void rule_task(void *arg, int ith, int nth)
{
    struct delta_job *j = arg;
    const struct fwd_batch *b = j->b;
    int Hv = j->p->n_v_heads;
    float *buf = rule_buf(j);
    long lo, hi;
    tp_range((long)b->n_seqs * Hv, ith, nth, 1, &lo, &hi);
    for (long item = lo; item < hi; item++) {
        int s = (int)(item / Hv);
        if (b->q_start[s] < b->q_start[s + 1]) rule_head(j, s, (int)(item % Hv), buf);
    }
}

/* Both phases in one job, one (sequence, key head) per item: the channels of key head kh
 * (its q and k, the v of its value heads) are convolved, then its value heads' rules run.
 * No other item reads those channels, so no thread waits for another. */
static void group_task(void *arg, int ith, int nth)
{
    struct delta_job *j = arg;
    const struct delta_params *p = j->p;
    const struct fwd_batch *b = j->b;
    int Hk = p->n_k_heads, dk = p->k_dim, dv = p->v_dim, ratio = p->n_v_heads / Hk;
    float *buf = rule_buf(j);
    long lo, hi;
    tp_range((long)b->n_seqs * Hk, ith, nth, 1, &lo, &hi);
    for (long item = lo; item < hi; item++) {
        int s = (int)(item / Hk), kh = (int)(item % Hk);
        if (b->q_start[s] == b->q_start[s + 1]) continue;
        conv_span(j, s, kh * dk, dk);
        conv_span(j, s, (Hk + kh) * dk, dk);
        conv_span(j, s, 2 * Hk * dk + kh * ratio * dv, ratio * dv);
        for (int h = kh * ratio; h < (kh + 1) * ratio; h++) rule_head(j, s, h, buf);
    }
}

void cpu_delta_net(struct threadpool *tp, float *out, float *qkv, const float *beta_in,
                   const float *a, const struct state_layer *st, const struct delta_params *p,
                   const struct fwd_batch *b)
{
    int chunk = b->delta_chunked && b->delta_chunk >= 2 ? b->delta_chunk : 0;
    assert(chunk <= DELTA_CHUNK_MAX);
    struct delta_job j = {out,  qkv, beta_in, a,
                          st,   p,   b,       2 * p->n_k_heads * p->k_dim + p->n_v_heads * p->v_dim,
                          chunk};
    /* One hand-off when the key heads keep every thread busy (decode: 16 of them on
     * Qwen3.6), else the channels and then the value heads spread over the pool. */
    if ((long)b->n_seqs * p->n_k_heads >= tp_size(tp)) {
        tp_run(tp, group_task, &j);
        return;
    }
    tp_run(tp, conv_task, &j);
    tp_run(tp, rule_task, &j);
}
