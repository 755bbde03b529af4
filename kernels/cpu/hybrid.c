/*
 * The kernels of the hybrid and MoE families on the CPU: Gated DeltaNet (causal conv and
 * the delta rule, one token after another: the state after token t depends only on the
 * tokens up to t, so results are the same however a prompt is split into steps), partial
 * rotary embeddings and the gated norm. The routed experts are in moe.c.
 */
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

/* Channels [c0, c0 + n) of sequence s: a single token (decode) through the kernel table's
 * convolution step, then SiLU; longer runs channel by channel. Both make the same float
 * operations per channel, in the same order. */
static void conv_span(const struct delta_job *j, int s, int c0, int n)
{
    const struct fwd_batch *b = j->b;
    int t0 = b->q_start[s];
    if (b->q_start[s + 1] - t0 != 1) {
        for (int c = c0; c < c0 + n; c++) conv_channel(j, s, c);
        return;
    }
    int C = j->conv_dim, K = j->p->conv_k;
    float *tail = j->st->conv + (size_t)b->state_slot[s] * (size_t)(K - 1) * C + c0;
    float *x = j->qkv + (size_t)t0 * C + c0;
    cpu_impl->conv_token(x, tail, (size_t)C, j->p->conv_w + (size_t)c0 * K, n, K, b->pos[t0] == 0);
    for (int c = 0; c < n; c++) x[c] = x[c] / (1.0f + expf(-x[c]));
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
    for (int t = t0; t < t1; t++) {
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

static float *rule_buf(const struct delta_params *p)
{
    return scratch_get(SCRATCH_DELTA, (size_t)(2 * p->k_dim + 2 * p->v_dim));
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
    float *buf = rule_buf(j->p);
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
    float *buf = rule_buf(p);
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
    struct delta_job j = {out, qkv, beta_in, a,
                          st,  p,   b,       2 * p->n_k_heads * p->k_dim + p->n_v_heads * p->v_dim};
    /* One hand-off when the key heads keep every thread busy (decode: 16 of them on
     * Qwen3.6), else the channels and then the value heads spread over the pool. */
    if ((long)b->n_seqs * p->n_k_heads >= tp_size(tp)) {
        tp_run(tp, group_task, &j);
        return;
    }
    tp_run(tp, conv_task, &j);
    tp_run(tp, rule_task, &j);
}
