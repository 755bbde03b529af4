/*
 * The kernels of the hybrid and MoE families on the CPU: Gated DeltaNet (causal conv and
 * the delta rule, one token after another: the state after token t depends only on the
 * tokens up to t, so results are the same however a prompt is split into steps) and routed
 * experts (one pass per active expert over the rows routed to it, through the batch-invariant
 * matrix products).
 */
#include <math.h>
#include <string.h>

#include "common/scratch.h"
#include "kernels/cpu/cpu.h"

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

/* Phase 1, one (sequence, channel) per item: the causal depthwise convolution with SiLU, in
 * place, continuing the slot's last conv_k - 1 inputs and leaving the new ones there. */
static void conv_task(void *arg, int ith, int nth)
{
    struct delta_job *j = arg;
    const struct fwd_batch *b = j->b;
    int C = j->conv_dim, K = j->p->conv_k;
    long lo, hi;
    tp_range((long)b->n_seqs * C, ith, nth, 16, &lo, &hi);
    for (long item = lo; item < hi; item++) {
        int s = (int)(item / C), c = (int)(item % C);
        int t0 = b->q_start[s], t1 = b->q_start[s + 1];
        if (t0 == t1) continue;
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
}

static void l2norm(float *dst, const float *x, int n, float scale)
{
    float ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss + 1e-6f) * scale;
    for (int i = 0; i < n; i++) dst[i] = x[i] * inv;
}

/* Phase 2, one (sequence, value head) per item: the delta rule over the sequence's tokens.
 * Two passes over the dk x dv state a token: decay and S^T k, then the update and S^T q. */
static void rule_task(void *arg, int ith, int nth)
{
    struct delta_job *j = arg;
    const struct delta_params *p = j->p;
    const struct fwd_batch *b = j->b;
    int Hv = p->n_v_heads, dk = p->k_dim, dv = p->v_dim, C = j->conv_dim;
    int ratio = Hv / p->n_k_heads;
    float *buf = scratch_get(SCRATCH_DELTA, (size_t)(2 * dk + 3 * dv));
    float *q = buf, *k = buf + dk, *kvm = k + dk, *delta = kvm + dv, *o = delta + dv;
    float qscale = 1.0f / sqrtf((float)dk);
    long lo, hi;
    tp_range((long)b->n_seqs * Hv, ith, nth, 1, &lo, &hi);
    for (long item = lo; item < hi; item++) {
        int s = (int)(item / Hv), h = (int)(item % Hv), kh = h / ratio;
        int t0 = b->q_start[s], t1 = b->q_start[s + 1];
        if (t0 == t1) continue;
        float *S = j->st->rec + ((size_t)b->state_slot[s] * Hv + h) * (size_t)dk * dv;
        if (b->pos[t0] == 0) memset(S, 0, sizeof(float) * (size_t)dk * dv);
        float A = -expf(p->a_log[h]);
        for (int t = t0; t < t1; t++) {
            const float *row = j->qkv + (size_t)t * C;
            l2norm(q, row + (size_t)kh * dk, dk, qscale);
            l2norm(k, row + (size_t)p->n_k_heads * dk + (size_t)kh * dk, dk, 1.0f);
            const float *v = row + (size_t)2 * p->n_k_heads * dk + (size_t)h * dv;
            float beta = sigmoid(j->beta_in[(size_t)t * Hv + h]);
            float decay = expf(A * softplus(j->a[(size_t)t * Hv + h] + p->dt_bias[h]));
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
            memcpy(j->out + ((size_t)t * Hv + h) * dv, o, sizeof(float) * (size_t)dv);
        }
    }
}

void cpu_delta_net(struct threadpool *tp, float *out, float *qkv, const float *beta_in,
                   const float *a, const struct state_layer *st, const struct delta_params *p,
                   const struct fwd_batch *b)
{
    struct delta_job j = {out, qkv, beta_in, a,
                          st,  p,   b,       2 * p->n_k_heads * p->k_dim + p->n_v_heads * p->v_dim};
    tp_run(tp, conv_task, &j);
    tp_run(tp, rule_task, &j);
}

/* Rows routed to one expert are gathered, run through its three products, weighted and
 * added to their rows. Per row, experts add in expert order, whatever else the step holds. */
void cpu_moe(struct threadpool *tp, float *out, const float *x, const float *router,
             const struct moe_params *p, int rows, int hidden)
{
    int E = p->n_experts, K = p->top_k;
    /* routing: [rows * K] expert ids and weights, then per-expert row lists */
    float *route = scratch_get(SCRATCH_MOE_ROUTE, (size_t)rows * K * 3 + (size_t)E * 2 + 1);
    int32_t *sel = (int32_t *)route;
    float *wt = route + (size_t)rows * K;
    int32_t *list = (int32_t *)(wt + (size_t)rows * K);
    int32_t *start = list + (size_t)rows * K; /* [E + 1] */
    for (int r = 0; r < rows; r++) {
        const float *lg = router + (size_t)r * E;
        float mx = lg[0];
        for (int e = 1; e < E; e++) mx = lg[e] > mx ? lg[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += expf(lg[e] - mx);
        int32_t *rs = sel + (size_t)r * K;
        float *rw = wt + (size_t)r * K;
        for (int i = 0; i < K; i++) { /* the i-th largest; ties to the lower index */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < i; q++) taken |= rs[q] == e;
                if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
            }
            rs[i] = best;
            rw[i] = (float)(expf(lg[best] - mx) / sum);
        }
        if (p->norm_topk) {
            float tot = 0;
            for (int i = 0; i < K; i++) tot += rw[i];
            for (int i = 0; i < K; i++) rw[i] /= tot;
        }
    }
    memset(start, 0, sizeof(int32_t) * (size_t)(E + 1));
    for (int i = 0; i < rows * K; i++) start[sel[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    int32_t *fill =
        (int32_t *)scratch_get(SCRATCH_MOE_G, (size_t)E); /* reused below, after the lists */
    memcpy(fill, start, sizeof(int32_t) * (size_t)E);
    for (int i = 0; i < rows * K; i++) list[fill[sel[i]]++] = i; /* entry r * K + slot */

    memset(out, 0, sizeof(float) * (size_t)rows * hidden);
    for (int e = 0; e < E; e++) {
        int n = start[e + 1] - start[e];
        if (!n) continue;
        int inner = (int)p->gate[e].n;
        float *xe = scratch_get(SCRATCH_MOE_X, (size_t)n * hidden);
        float *ge = scratch_get(SCRATCH_MOE_G, (size_t)n * inner);
        float *ue = scratch_get(SCRATCH_MOE_U, (size_t)n * inner);
        for (int i = 0; i < n; i++)
            memcpy(xe + (size_t)i * hidden, x + (size_t)(list[start[e] + i] / K) * hidden,
                   sizeof(float) * (size_t)hidden);
        cpu_matmul(tp, ge, xe, &p->gate[e], n);
        cpu_matmul(tp, ue, xe, &p->up[e], n);
        if (p->act == ACT_SILU)
            cpu_silu_mul(ge, ge, ue, (int64_t)n * inner);
        else
            cpu_gelu_tanh_mul(ge, ge, ue, (int64_t)n * inner);
        cpu_matmul(tp, xe, ge, &p->down[e], n);
        for (int i = 0; i < n; i++) {
            int entry = list[start[e] + i];
            float w = wt[entry], *o = out + (size_t)(entry / K) * hidden;
            const float *y = xe + (size_t)i * hidden;
            for (int c = 0; c < hidden; c++) o[c] += y[c] * w;
        }
    }
}
