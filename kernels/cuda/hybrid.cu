/*
 * Kernels of the hybrid family (Qwen3.5): partial rotary, the gated attention's query/gate
 * split and output gate, the gated RMS norm, device copies, and Gated DeltaNet (the causal
 * convolution, then the delta rule). The formulas are the CPU backend's (kernels/cpu/hybrid.c,
 * model/backend_cpu.c); float32 throughout.
 *
 * The delta rule is sequential over a sequence's tokens: one block per (sequence, value head)
 * walks them in order with the k_dim x v_dim state in registers, so a prompt of n tokens costs
 * n dependent steps of a few hundred cycles each (a chunked form would trade them for
 * products; not done here).
 */
#include <math.h>

#include "kernels/cuda/cuda.cuh"

static unsigned grid_for(int64_t n, int threads)
{
    const int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 65535 * 16 ? 65535 * 16 : b);
}

/* ---- element-wise and row-wise ---- */

__global__ void k_rope_partial(float *x, int64_t total, int heads, int d, int half,
                               const float *__restrict__ c, const float *__restrict__ sn)
{
    allow_dependents();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int j = (int)(i % half);
        const int64_t rh = i / half, r = rh / heads; /* rh: row * heads + head */
        float *v = x + rh * d;
        const float a = v[j], b = v[j + half], cs = c[r * half + j], si = sn[r * half + j];
        v[j] = a * cs - b * si;
        v[j + half] = b * cs + a * si;
    }
}

void cu_rope_partial(cudaStream_t s, float *x, int rows, int heads, int d, int rot,
                     const float *cos_t, const float *sin_t)
{
    const int half = rot / 2;
    const int64_t total = (int64_t)rows * heads * half;
    if (total <= 0) return;
    k_rope_partial<<<grid_for(total, 256), 256, 0, s>>>(x, total, heads, d, half, cos_t, sin_t);
    CU_LAUNCHED();
}

__global__ void k_split_qgate(float *__restrict__ q, float *__restrict__ gate,
                              const float *__restrict__ qg, int64_t total, int d)
{
    allow_dependents();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t rh = i / d, j = i - rh * d;
        q[i] = qg[rh * 2 * d + j];
        gate[i] = qg[rh * 2 * d + d + j];
    }
}

void cu_split_qgate(cudaStream_t s, float *q, float *gate, const float *qg, int rows, int heads,
                    int d)
{
    const int64_t total = (int64_t)rows * heads * d;
    if (total <= 0) return;
    k_split_qgate<<<grid_for(total, 256), 256, 0, s>>>(q, gate, qg, total, d);
    CU_LAUNCHED();
}

__global__ void k_gate_mul(float *x, const float *__restrict__ g, int64_t total, int n, int gn)
{
    allow_dependents();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = gn == 1 ? g[i / n] : g[i];
        x[i] *= 1.0f / (1.0f + expf(-v));
    }
}

void cu_gate_mul(cudaStream_t s, float *x, const float *g, int rows, int n, int gn)
{
    const int64_t total = (int64_t)rows * n;
    if (total <= 0) return;
    k_gate_mul<<<grid_for(total, 256), 256, 0, s>>>(x, g, total, n, gn);
    CU_LAUNCHED();
}

__global__ void k_scale(float *x, int64_t n, float sc)
{
    allow_dependents();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= sc;
}

void cu_scale(cudaStream_t s, float *x, int64_t n, float sc)
{
    if (n <= 0) return;
    k_scale<<<grid_for(n, 256), 256, 0, s>>>(x, n, sc);
    CU_LAUNCHED();
}

/* A warp a row (the rows are short: a value head's v_dim); the sum of squares in double, as
 * the CPU's. In place (out == x): each lane rewrites only the values it read. */
#define RNG_WARPS 8
__global__ void __launch_bounds__(RNG_WARPS * 32)
    k_rms_norm_gated(float *out, const float *x, const float *__restrict__ z,
                     const float *__restrict__ w, int rows, int dim, float eps)
{
    allow_dependents();
    const int64_t r = (int64_t)blockIdx.x * RNG_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float *xr = x + r * dim, *zr = z + r * dim;
    float *o = out + r * dim;
    double ss = 0.0;
    for (int i = lane; i < dim; i += 32) ss += (double)xr[i] * xr[i];
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
    const float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
    for (int i = lane; i < dim; i += 32) {
        const float g = zr[i];
        o[i] = w[i] * (xr[i] * inv) * (g / (1.0f + expf(-g)));
    }
}

void cu_rms_norm_gated(cudaStream_t s, float *out, const float *x, const float *z, const float *w,
                       int rows, int dim, float eps)
{
    if (rows <= 0 || dim <= 0) return;
    k_rms_norm_gated<<<(unsigned)((rows + RNG_WARPS - 1) / RNG_WARPS), RNG_WARPS * 32, 0, s>>>(
        out, x, z, w, rows, dim, eps);
    CU_LAUNCHED();
}

template <class T> __global__ void k_copy(T *dst, const T *src, int64_t n)
{
    allow_dependents();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

void cu_copy(cudaStream_t s, void *dst, const void *src, size_t bytes)
{
    if (!bytes || dst == src) return;
    const uintptr_t al = (uintptr_t)dst | (uintptr_t)src | (uintptr_t)bytes;
    const int64_t n = (int64_t)bytes;
    if (al % 16 == 0) {
        const int64_t n16 = n / 16;
        k_copy<<<grid_for(n16, 256), 256, 0, s>>>((uint4 *)dst, (const uint4 *)src, n16);
    } else if (al % 4 == 0) {
        const int64_t n4 = n / 4;
        k_copy<<<grid_for(n4, 256), 256, 0, s>>>((uint32_t *)dst, (const uint32_t *)src, n4);
    } else {
        k_copy<<<grid_for(n, 256), 256, 0, s>>>((uint8_t *)dst, (const uint8_t *)src, n);
    }
    CU_LAUNCHED();
}

/* ---- Gated DeltaNet ---- */

static __device__ __forceinline__ float softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x)); /* torch's threshold: exact in float past 20 */
}

/*
 * The causal depthwise convolution, a thread per (channel, sequence): the last conv_k - 1
 * inputs in registers (zero when the sequence starts at position 0, else its slot's tail),
 * the sequence's tokens in order (B loads in flight), each output SiLU'd in place of its
 * input, the new tail written back. Sums in the CPU's order. W >= conv_k - 1 is the window's
 * size in registers (3, 7 or 15: conv_k is at most 16), its loops unrolled whole (B = 8, or
 * 4 for the largest window: its arrays stay in registers).
 */
#define DN_CONV_THREADS 64

template <int W> __global__ void __launch_bounds__(DN_CONV_THREADS) k_delta_conv(cu_delta_args d)
{
    constexpr int B = W < 15 ? 8 : 4;
    allow_dependents();
    const int C = 2 * d.n_k_heads * d.k_dim + d.n_v_heads * d.v_dim, K = d.conv_k;
    const int s = blockIdx.y, ch = blockIdx.x * DN_CONV_THREADS + threadIdx.x;
    if (ch >= C) return;
    const int t0 = d.q_start[s], t1 = d.q_start[s + 1];
    if (t0 >= t1) return;
    float *tail = d.conv + (int64_t)d.state_slot[s] * (K - 1) * C + ch;
    const float *w = d.conv_w + (int64_t)ch * K;
    const float wl = w[K - 1];
    const bool fresh = d.pos[t0] == 0;
    float wr[W], win[W]; /* constant indices only: they stay in registers */
#pragma unroll
    for (int i = 0; i < W; i++) {
        wr[i] = i < K - 1 ? w[i] : 0.0f;
        win[i] = i < K - 1 && !fresh ? tail[(int64_t)i * C] : 0.0f;
    }
    for (int tb = t0; tb < t1; tb += B) {
        float xs[B];
#pragma unroll
        for (int u = 0; u < B; u++) xs[u] = tb + u < t1 ? d.qkv[(int64_t)(tb + u) * C + ch] : 0.0f;
#pragma unroll
        for (int u = 0; u < B; u++) {
            if (tb + u < t1) {
                float y = 0.0f;
#pragma unroll
                for (int i = 0; i < W; i++)
                    if (i < K - 1) y += wr[i] * win[i];
                y += wl * xs[u];
#pragma unroll
                for (int i = 0; i + 1 < W; i++)
                    if (i + 1 < K - 1) win[i] = win[i + 1];
#pragma unroll
                for (int i = 0; i < W; i++)
                    if (i == K - 2) win[i] = xs[u];
                d.qkv[(int64_t)(tb + u) * C + ch] = y / (1.0f + expf(-y));
            }
        }
    }
#pragma unroll
    for (int i = 0; i < W; i++)
        if (i < K - 1) tail[(int64_t)i * C] = win[i];
}

/*
 * The delta rule, a block per (sequence, value head, 32 columns of the state): the columns
 * of S are independent (only q's and k's norms are shared, and each block computes them), so
 * a head's v_dim columns go to v_dim / 32 blocks. Thread (c, g) = (tid / 4, tid % 4) holds
 * rows [g R, g R + R) of column c in registers (R = k_dim / 4 rounded up to 8, 16 or 32; rows
 * past k_dim stay zero), so a column's sums over k_dim are R products a thread and two
 * shuffles among its 4 lanes. A token's q and k heads, the block's 32 values of v, beta and a
 * are staged in shared memory by cp.async DN_RING - 1 tokens ahead; one barrier a token. A
 * stage holds q and k as 4 groups of R values R + 4 apart (a quarter-warp's float4 reads of
 * the 4 groups hit distinct banks), then v [32], beta, a.
 *
 * Per token (the CPU's formulas): q, k L2-normalized (q also by 1 / sqrt(k_dim)), beta =
 * sigmoid(b), decay = exp(-exp(A_log) softplus(a + dt_bias)); S *= decay; kv = S^T k;
 * delta = (v - kv) beta; S += k delta^T; o = S^T q.
 */
#define DN_GROUPS  4
#define DN_COLS    32
#define DN_THREADS (DN_GROUPS * DN_COLS)
#define DN_RING    4
#define DN_MAX_DK  (DN_GROUPS * 32)

static __device__ __forceinline__ void cp_async4(float *dst, const float *src)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(src) : "memory");
}

static __device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int N> static __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Floats of one token's stage (a multiple of 4: stages stay 16-byte aligned). */
static __host__ __device__ constexpr int dn_stage_floats(int R)
{
    return 2 * DN_GROUPS * (R + 4) + DN_COLS + 4;
}

/* Every thread's share of token t's copies into stage st (v columns [c0, c0 + 32) of value
 * head h; those past v_dim are not copied and stay zero). */
template <int R>
static __device__ __forceinline__ void dn_stage_load(float *st, const cu_delta_args &d, int t,
                                                     int h, int kh, int c0, int C)
{
    constexpr int QK = DN_GROUPS * (R + 4);
    const int dk = d.k_dim, n = 2 * dk + DN_COLS + 2;
    const float *row = d.qkv + (int64_t)t * C;
    for (int e = threadIdx.x; e < n; e += DN_THREADS) {
        const float *src;
        float *dst;
        if (e < 2 * dk) { /* q then k of key head kh */
            const int which = e >= dk, i = e - which * dk;
            src = row + (int64_t)which * d.n_k_heads * dk + (int64_t)kh * dk + i;
            dst = st + which * QK + (i / R) * (R + 4) + i % R;
        } else if (e < 2 * dk + DN_COLS) { /* the block's columns of v */
            const int j = e - 2 * dk;
            if (c0 + j >= d.v_dim) continue;
            src = row + (int64_t)2 * d.n_k_heads * dk + (int64_t)h * d.v_dim + c0 + j;
            dst = st + 2 * QK + j;
        } else { /* beta's input, then a */
            const int which = e - 2 * dk - DN_COLS;
            src = (which ? d.a : d.beta) + (int64_t)t * d.n_v_heads + h;
            dst = st + 2 * QK + DN_COLS + which;
        }
        cp_async4(dst, src);
    }
}

/* The sum over a column's 4 lanes (adjacent lanes 4 c .. 4 c + 3). */
static __device__ __forceinline__ float col_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <int R> __global__ void __launch_bounds__(DN_THREADS) k_delta_rule(cu_delta_args d)
{
    allow_dependents();
    constexpr int QK = DN_GROUPS * (R + 4), SF = dn_stage_floats(R);
    __shared__ __align__(16) float smem[DN_RING * SF];
    const int Hv = d.n_v_heads, dk = d.k_dim, dv = d.v_dim, nch = (dv + DN_COLS - 1) / DN_COLS;
    const int chunk = blockIdx.x % nch, hs = blockIdx.x / nch, h = hs % Hv, s = hs / Hv;
    const int t0 = d.q_start[s], t1 = d.q_start[s + 1];
    if (t0 >= t1) return; /* the whole block: before any barrier */
    const int kh = h / (Hv / d.n_k_heads), C = 2 * d.n_k_heads * dk + Hv * dv;
    const int lc = threadIdx.x >> 2, g = threadIdx.x & 3, c0 = chunk * DN_COLS, c = c0 + lc;
    const bool col = c < dv;
    float *Sg = d.rec + ((int64_t)d.state_slot[s] * Hv + h) * dk * dv;
    const bool fresh = d.pos[t0] == 0;
    float S[R];
#pragma unroll
    for (int j = 0; j < R; j++) {
        const int i = g * R + j;
        S[j] = !fresh && col && i < dk ? Sg[(int64_t)i * dv + c] : 0.0f;
    }
    /* zero every stage once: rows past k_dim, columns past v_dim and the gaps are never
     * copied to */
    for (int e = threadIdx.x; e < DN_RING * SF; e += DN_THREADS) smem[e] = 0.0f;
    __syncthreads();
    const float A = -expf(d.a_log[h]), dtb = d.dt_bias[h];
    const float qscale = 1.0f / sqrtf((float)dk);
#pragma unroll
    for (int p = 0; p < DN_RING - 1; p++) {
        if (t0 + p < t1) dn_stage_load<R>(smem + p * SF, d, t0 + p, h, kh, c0, C);
        cp_async_commit();
    }
    for (int t = t0; t < t1; t++) {
        const int li = t - t0;
        /* groups committed: DN_RING - 1 + li; token t's is the (li + 1)-th */
        cp_async_wait<DN_RING - 2>();
        __syncthreads(); /* every thread's copies of token t landed; token t - 1's stage is free */
        if (t + DN_RING - 1 < t1)
            dn_stage_load<R>(smem + ((li + DN_RING - 1) % DN_RING) * SF, d, t + DN_RING - 1, h, kh,
                             c0, C);
        cp_async_commit(); /* empty past the end: the count above stays right */
        const float *st = smem + (li % DN_RING) * SF;
        const float4 *q4 = (const float4 *)(st + g * (R + 4));
        const float4 *k4 = (const float4 *)(st + QK + g * (R + 4));
        const float *vb = st + 2 * QK;
        float sq = 0.0f, sk = 0.0f;
#pragma unroll
        for (int m = 0; m < R / 4; m++) {
            const float4 a = q4[m], b = k4[m];
            sq += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
            sk += b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
        }
        sq = col_sum(sq);
        sk = col_sum(sk);
        const float iq = 1.0f / sqrtf(sq + 1e-6f) * qscale, ik = 1.0f / sqrtf(sk + 1e-6f);
        const float beta = 1.0f / (1.0f + expf(-vb[DN_COLS]));
        const float decay = expf(A * softplus(vb[DN_COLS + 1] + dtb));
        float kv = 0.0f;
#pragma unroll
        for (int m = 0; m < R / 4; m++) {
            const float4 b = k4[m];
            const float kk[4] = {b.x * ik, b.y * ik, b.z * ik, b.w * ik};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                S[4 * m + e] *= decay;
                kv += S[4 * m + e] * kk[e];
            }
        }
        kv = col_sum(kv);
        const float delta = (vb[lc] - kv) * beta;
        float o = 0.0f;
#pragma unroll
        for (int m = 0; m < R / 4; m++) {
            const float4 a = q4[m], b = k4[m];
            const float qq[4] = {a.x * iq, a.y * iq, a.z * iq, a.w * iq};
            const float kk[4] = {b.x * ik, b.y * ik, b.z * ik, b.w * ik};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                S[4 * m + e] += kk[e] * delta;
                o += S[4 * m + e] * qq[e];
            }
        }
        o = col_sum(o);
        if (g == 0 && col) d.out[((int64_t)t * Hv + h) * dv + c] = o;
    }
#pragma unroll
    for (int j = 0; j < R; j++) {
        const int i = g * R + j;
        if (col && i < dk) Sg[(int64_t)i * dv + c] = S[j];
    }
}

/*
 * k_dim past 128 (which k_delta_rule does not take): the state stays in the slot in
 * global memory, a thread per column walks its k_dim rows in the CPU's order; q and k of the
 * token in shared memory ([2][k_dim]), their norms summed over the block.
 */
#define DN_ANY_THREADS 256
__global__ void __launch_bounds__(DN_ANY_THREADS, 1) k_delta_rule_any(cu_delta_args d)
{
    allow_dependents();
    extern __shared__ float4 dn_any4[];
    float *qs = (float *)dn_any4, *ks = qs + d.k_dim;
    __shared__ float red[2][DN_ANY_THREADS / 32];
    const int Hv = d.n_v_heads, h = blockIdx.x % Hv, s = blockIdx.x / Hv;
    const int t0 = d.q_start[s], t1 = d.q_start[s + 1];
    if (t0 >= t1) return;
    const int dk = d.k_dim, dv = d.v_dim, Hk = d.n_k_heads, kh = h / (Hv / Hk);
    const int C = 2 * Hk * dk + Hv * dv, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *S = d.rec + ((int64_t)d.state_slot[s] * Hv + h) * dk * dv;
    if (d.pos[t0] == 0) /* each thread zeroes the columns it owns below */
        for (int c = threadIdx.x; c < dv; c += blockDim.x)
            for (int i = 0; i < dk; i++) S[(int64_t)i * dv + c] = 0.0f;
    const float A = -expf(d.a_log[h]), dtb = d.dt_bias[h];
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int t = t0; t < t1; t++) {
        const float *row = d.qkv + (int64_t)t * C;
        float sq = 0.0f, sk = 0.0f;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            const float q = row[(int64_t)kh * dk + i], k = row[(int64_t)(Hk + kh) * dk + i];
            qs[i] = q;
            ks[i] = k;
            sq += q * q;
            sk += k * k;
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
            sq += __shfl_xor_sync(0xffffffffu, sq, m);
            sk += __shfl_xor_sync(0xffffffffu, sk, m);
        }
        if (lane == 0) {
            red[0][warp] = sq;
            red[1][warp] = sk;
        }
        __syncthreads();
        sq = sk = 0.0f;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
            sq += red[0][w];
            sk += red[1][w];
        }
        const float iq = 1.0f / sqrtf(sq + 1e-6f) * qscale, ik = 1.0f / sqrtf(sk + 1e-6f);
        const float beta = 1.0f / (1.0f + expf(-d.beta[(int64_t)t * Hv + h]));
        const float decay = expf(A * softplus(d.a[(int64_t)t * Hv + h] + dtb));
        for (int c = threadIdx.x; c < dv; c += blockDim.x) {
            float kv = 0.0f;
            for (int i = 0; i < dk; i++) {
                const float v = S[(int64_t)i * dv + c] * decay;
                S[(int64_t)i * dv + c] = v;
                kv += v * (ks[i] * ik);
            }
            const float delta = (row[(int64_t)2 * Hk * dk + (int64_t)h * dv + c] - kv) * beta;
            float o = 0.0f;
            for (int i = 0; i < dk; i++) {
                const float v = S[(int64_t)i * dv + c] + (ks[i] * ik) * delta;
                S[(int64_t)i * dv + c] = v;
                o += v * (qs[i] * iq);
            }
            d.out[((int64_t)t * Hv + h) * dv + c] = o;
        }
        __syncthreads(); /* q, k and red are rewritten for the next token */
    }
}

void cu_delta_net(cudaStream_t s, const cu_delta_args &d)
{
    if (d.n_tokens <= 0 || d.n_seqs <= 0) return;
    const int C = 2 * d.n_k_heads * d.k_dim + d.n_v_heads * d.v_dim;
    dim3 cg((unsigned)((C + DN_CONV_THREADS - 1) / DN_CONV_THREADS), (unsigned)d.n_seqs);
    if (d.conv_k <= 4)
        k_delta_conv<3><<<cg, DN_CONV_THREADS, 0, s>>>(d);
    else if (d.conv_k <= 8)
        k_delta_conv<7><<<cg, DN_CONV_THREADS, 0, s>>>(d);
    else
        k_delta_conv<15><<<cg, DN_CONV_THREADS, 0, s>>>(d);
    CU_LAUNCHED();
    const unsigned heads = (unsigned)d.n_seqs * (unsigned)d.n_v_heads;
    if (d.k_dim > DN_MAX_DK) {
        k_delta_rule_any<<<heads, DN_ANY_THREADS, sizeof(float) * 2 * (size_t)d.k_dim, s>>>(d);
        CU_LAUNCHED();
        return;
    }
    const unsigned blocks = heads * (unsigned)((d.v_dim + DN_COLS - 1) / DN_COLS);
    if (d.k_dim <= 32)
        k_delta_rule<8><<<blocks, DN_THREADS, 0, s>>>(d);
    else if (d.k_dim <= 64)
        k_delta_rule<16><<<blocks, DN_THREADS, 0, s>>>(d);
    else
        k_delta_rule<32><<<blocks, DN_THREADS, 0, s>>>(d);
    CU_LAUNCHED();
}
