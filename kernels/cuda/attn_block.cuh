/*
 * Decode attention of one token over one KV head by a whole block on CUDA cores, its keys
 * and values in shared memory, and the pieces the decode attention kernels share (a
 * token's keys, their cache rows, 2^x).
 *
 * The block copies the keys and values before the token's own into shared memory
 * (cp.async, no registers held) as soon as it starts, before it waits for the kernel that
 * writes the queries and stores the token's own key and value; after that wait it reads
 * only the group's query rows and that one cache row. Then: the scores of all keys (a warp
 * a key at a stride of the warps, a lane D / 32 dimensions, a reduction over the lanes),
 * each query row's softmax over them (a warp a row), and each output as the sum of the
 * probabilities times one value column over half of the keys (two threads an output). Used
 * by k_attention_dec1 (a block per token and KV head) and by the one-row q/k/v product that
 * runs its KV heads' attention itself (k_gemv_stream with attention).
 */
#ifndef PAGODA_KERNELS_CUDA_ATTN_BLOCK_CUH
#define PAGODA_KERNELS_CUDA_ATTN_BLOCK_CUH

#include "kernels/cuda/cuda.cuh"

/* 2^x in one instruction (0 for -inf). */
static __device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* One token's keys in one KV head, as a warp of the decode kernels reads them. */
struct dec_src {
    const __nv_bfloat16 *k, *v; /* the KV head's first dimension in the caches */
    const int32_t *bt;          /* the sequence's block table */
    int qpos, k_lo, k_hi;       /* the token's position; its visible keys [k_lo, k_hi) */
};

static __device__ __forceinline__ dec_src dec_src_of(const cu_attn_args &a, int t, int kvh, int D)
{
    dec_src s;
    s.qpos = a.pos[t];
    s.k_lo = a.window > 0 ? max(0, s.qpos - a.window + 1) : 0;
    s.k_hi = s.qpos + 1;
    s.bt = a.block_table + (int64_t)a.tok_seq[t] * a.max_blocks;
    s.k = a.k + (int64_t)kvh * D;
    s.v = a.v + (int64_t)kvh * D;
    return s;
}

/* The cache row of key position kp. */
static __device__ __forceinline__ int64_t dec_slot(const cu_attn_args &a, const int32_t *bt, int kp)
{
    const int bs = a.block_size;
    if (!(bs & (bs - 1))) {
        const int sh = __ffs(bs) - 1;
        return (int64_t)bt[kp >> sh] * bs + (kp & (bs - 1));
    }
    return (int64_t)bt[kp / bs] * bs + kp % bs;
}

/* Threads of the blocks that run ab_finish. */
#define AB_THREADS 1024

/* The shared memory of the block attention for up to `keys` keys and `gm` query rows: the
 * keys and values [keys][D] (bf16), the scores [gm][keys] (probabilities after the
 * softmax), the outputs' partial sums (two floats a thread), and what ab_prefetch leaves
 * for ab_finish: the cache address and row of the token's own key and value pieces (one a
 * thread of the first 2 D / 8), the number of keys, then a scale a row. */
struct ab_smem {
    __nv_bfloat16 *k, *v;
    float *s, *part;
    unsigned long long *own_src;
    int *own_dst, *n_keys;
    float *inv;
};

static __host__ __device__ __forceinline__ size_t ab_smem_bytes(int d, int gm, int keys)
{
    return (size_t)keys * d * 4 + (size_t)gm * keys * 4 + AB_THREADS * 8 + 32 * 12 + 16 + gm * 4;
}

static __device__ __forceinline__ ab_smem ab_carve(void *base, int d, int gm, int keys)
{
    ab_smem m;
    m.k = (__nv_bfloat16 *)base;
    m.v = m.k + (size_t)keys * d;
    m.s = (float *)(m.v + (size_t)keys * d);
    m.part = m.s + (size_t)gm * keys;
    m.own_src = (unsigned long long *)(m.part + 2 * AB_THREADS);
    m.own_dst = (int *)(m.own_src + 32);
    m.n_keys = m.own_dst + 32;
    m.inv = (float *)(m.n_keys + 4);
    return m;
}

/* Copies the keys and values before the token's own, [k_lo, qpos), into shared memory (row
 * j: key k_lo + j) without waiting for them, and notes where the token's own row lies and
 * goes; every thread of the block takes part. The block table and the positions are the
 * step's inputs, not a result of the kernel waited for. */
template <int D>
static __device__ __forceinline__ void ab_prefetch(const cu_attn_args &a, const dec_src &s,
                                                   const ab_smem &m, int keys)
{
    constexpr int C = D / 8; /* 16-byte pieces a row */
    const int64_t kv_row = (int64_t)a.n_kv_heads * D;
    const int n = (s.qpos - s.k_lo) * C;
    if (s.k_hi - s.k_lo > keys) __trap(); /* the caller keeps to CU_ATTN_BLOCK_KEYS */
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = i / C, c = i % C;
        const int64_t off = dec_slot(a, s.bt, s.k_lo + j) * kv_row + c * 8;
        const uint32_t dk = (uint32_t)__cvta_generic_to_shared(m.k + (size_t)j * D + c * 8);
        const uint32_t dv = (uint32_t)__cvta_generic_to_shared(m.v + (size_t)j * D + c * 8);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dk), "l"(s.k + off)
                     : "memory");
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dv), "l"(s.v + off)
                     : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    if (threadIdx.x < 2 * C) { /* read back by this same thread in ab_finish */
        const int c = threadIdx.x % C;
        const __nv_bfloat16 *src = threadIdx.x < C ? s.k : s.v;
        m.own_src[threadIdx.x] =
            (unsigned long long)(src + dec_slot(a, s.bt, s.qpos) * kv_row + c * 8);
        m.own_dst[threadIdx.x] = (s.qpos - s.k_lo) * D + c * 8;
    }
    if (threadIdx.x == 0) *m.n_keys = s.k_hi - s.k_lo;
}

/*
 * The attention of token t over KV head kvh once its queries and own key and value are
 * written (by this kernel's other blocks or the kernel waited for: read through L2) and
 * ab_prefetch has been issued; outputs to a.out and a.outb. GM: the most query rows a group
 * (group x D <= 512, so a lane's query values stay in registers). Every thread of the
 * block (AB_THREADS) calls it; it ends with a barrier.
 *   Scores: a warp takes 16 / GM keys at a time, a lane D / 32 dimensions of each; the 16
 * sums (keys x rows) are reduced over the lanes by halves (after the exchanges at 16, 8, 4
 * and 2 lanes apart a lane pair holds one of them), so that a key costs a warp one
 * shuffle, not five. Softmax: a warp a row. Outputs: a thread two dimensions of one row
 * over a contiguous part of the keys, the parts added in order after a barrier.
 */
template <int D, int GM>
static __device__ __forceinline__ void ab_finish(const cu_attn_args &a, int t, int kvh,
                                                 const ab_smem &m, int keys)
{
    constexpr int DPL = D / 32, C = D / 8, KW = 16 / GM;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const int group = a.n_heads / a.n_kv_heads;
    const float LOG2E = 1.4426950408889634f;
    if (threadIdx.x < 2 * C) /* the token's own key and value */
        *(uint4 *)((threadIdx.x < C ? m.k : m.v) + m.own_dst[threadIdx.x]) =
            __ldcg((const uint4 *)m.own_src[threadIdx.x]);
    /* the group's query rows, a lane's D / 32 dimensions of each, in log2 units unless
     * soft-capped */
    float q[GM][DPL];
    const float qs = a.softcap > 0 ? 1.0f : a.scale * LOG2E;
#pragma unroll
    for (int r = 0; r < GM; r++) {
        const float *qr =
            a.q + ((int64_t)t * a.n_heads + kvh * group + min(r, group - 1)) * D + lane * DPL;
#pragma unroll
        for (int e = 0; e < DPL; e++) q[r][e] = __ldcg(qr + e) * qs;
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    const int L = *m.n_keys;

    /* scores */
    for (int j0 = warp * KW; j0 < L; j0 += nwarps * KW) {
        float v[16];
#pragma unroll
        for (int kk = 0; kk < KW; kk++) {
            const uint32_t *kr =
                (const uint32_t *)(m.k + (size_t)min(j0 + kk, L - 1) * D) + lane * (DPL / 2);
            float kf[DPL];
#pragma unroll
            for (int i = 0; i < DPL / 2; i++) {
                const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)(kr + i));
                kf[2 * i] = f.x;
                kf[2 * i + 1] = f.y;
            }
#pragma unroll
            for (int r = 0; r < GM; r++) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < DPL; e++) d += q[r][e] * kf[e];
                v[kk * GM + r] = d;
            }
        }
#pragma unroll
        for (int n = 16, o = 16; n > 1; n >>= 1, o >>= 1) {
            const bool hi = lane & o;
#pragma unroll
            for (int i = 0; i < n / 2; i++) {
                const float send = hi ? v[i] : v[i + n / 2], keep = hi ? v[i + n / 2] : v[i];
                v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
            }
        }
        v[0] += __shfl_xor_sync(0xffffffffu, v[0], 1);
        const int idx = lane >> 1, j = j0 + idx / GM, r = idx % GM;
        if (!(lane & 1) && j < L && r < group) {
            float sc = v[0];
            if (a.softcap > 0) sc = a.softcap * tanhf(sc * a.scale / a.softcap) * LOG2E;
            m.s[r * keys + j] = sc;
        }
    }
    __syncthreads();

    /* each row's softmax: a warp a row */
    for (int r = warp; r < group; r += nwarps) {
        float *sr = m.s + (size_t)r * keys;
        float mx = -INFINITY;
        for (int j = lane; j < L; j += 32) mx = fmaxf(mx, sr[j]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float l = 0.0f;
        for (int j = lane; j < L; j += 32) {
            const float p = ex2(sr[j] - mx);
            sr[j] = p;
            l += p;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        if (lane == 0) m.inv[r] = 1.0f / l;
    }
    __syncthreads();

    /* outputs: unit u is dimensions 2 c and 2 c + 1 of row r; part p of the keys */
    const int units = group * D / 2, parts = (int)blockDim.x / units;
    const int u = threadIdx.x % units, p = threadIdx.x / units;
    if (p < parts) {
        const int r = u / (D / 2), c = u % (D / 2), j1 = (p + 1) * L / parts;
        const float *pr = m.s + (size_t)r * keys;
        const __nv_bfloat162 *vc = (const __nv_bfloat162 *)m.v + c;
        float ax = 0.0f, ay = 0.0f;
#pragma unroll 4
        for (int j = p * L / parts; j < j1; j++) {
            const float w = pr[j];
            const float2 f = __bfloat1622float2(vc[(size_t)j * (D / 2)]);
            ax += w * f.x;
            ay += w * f.y;
        }
        *(float2 *)(m.part + (size_t)p * 2 * units + 2 * u) = make_float2(ax, ay);
    }
    __syncthreads();
    for (int o = threadIdx.x; o < 2 * units; o += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < parts; i++) acc += m.part[(size_t)i * 2 * units + o];
        const float v = acc * m.inv[o / D];
        const int64_t row = ((int64_t)t * a.n_heads + kvh * group) * D + o;
        if (a.out) a.out[row] = v;
        if (a.outb) a.outb[row] = __float2bfloat16_rn(v);
    }
    __syncthreads();
}

#endif
