/*
 * Attention over block-paged KV (bf16 rows [block][offset][kv head][head_dim]).
 *
 * One kernel serves prefill and decode tokens of a mixed batch: a block takes one token,
 * one KV head with up to 4 of the query heads that share it (GQA), and one contiguous
 * range of the token's visible keys (split-K, flash-decoding style). Each warp walks every
 * 4th key of the range with an online softmax; the warps meet in shared memory. With more
 * than one range per token, a second kernel merges the ranges' partial results.
 * Windows (sliding attention) and score soft-capping follow the CPU reference.
 */
#include <math.h>

#include "kernels/cuda/cuda.cuh"

#define ATT_WARPS 4
#define ATT_HG    4 /* query heads per block */
#define ATT_U     4 /* keys in flight per warp */

__global__ void k_kv_store(__nv_bfloat16 *kc, __nv_bfloat16 *vc, const float *__restrict__ k,
                           const float *__restrict__ v, const int32_t *__restrict__ slot, int row)
{
    allow_dependents();
    int t = blockIdx.y;
    int64_t dst = (int64_t)slot[t] * row;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < row; j += gridDim.x * blockDim.x) {
        kc[dst + j] = __float2bfloat16_rn(k[(int64_t)t * row + j]);
        vc[dst + j] = __float2bfloat16_rn(v[(int64_t)t * row + j]);
    }
}

void cu_kv_store(cudaStream_t s, __nv_bfloat16 *kc, __nv_bfloat16 *vc, const float *k,
                 const float *v, const int32_t *slot, int n_tokens, int row)
{
    dim3 grid((unsigned)((row + 255) / 256), (unsigned)n_tokens);
    k_kv_store<<<grid, 256, 0, s>>>(kc, vc, k, v, slot, row);
    CU_LAUNCHED();
}

template <int DPL>
static __device__ __forceinline__ void load_row(const __nv_bfloat16 *p, float *out)
{
    if (DPL % 4 == 0) {
#pragma unroll
        for (int i = 0; i < DPL / 4; i++) {
            uint2 u = __ldg((const uint2 *)p + i);
            out[4 * i] = __uint_as_float(u.x << 16);
            out[4 * i + 1] = __uint_as_float(u.x & 0xffff0000u);
            out[4 * i + 2] = __uint_as_float(u.y << 16);
            out[4 * i + 3] = __uint_as_float(u.y & 0xffff0000u);
        }
    } else if (DPL % 2 == 0) {
#pragma unroll
        for (int i = 0; i < DPL / 2; i++) {
            uint32_t u = __ldg((const uint32_t *)p + i);
            out[2 * i] = __uint_as_float(u << 16);
            out[2 * i + 1] = __uint_as_float(u & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int i = 0; i < DPL; i++) out[i] = __bfloat162float(p[i]);
    }
}

template <int DPL> __global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(cu_attn_args a)
{
    allow_dependents();
    const int D = DPL * 32;
    const int t = blockIdx.x;
    const int group = a.n_heads / a.n_kv_heads;
    const int chunks = (group + ATT_HG - 1) / ATT_HG;
    const int kvh = blockIdx.y / chunks, h0 = kvh * group + (blockIdx.y % chunks) * ATT_HG;
    const int nh = min(ATT_HG, kvh * group + group - h0);
    const int sp = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    const int s = a.tok_seq[t], qpos = a.pos[t];
    int first = 0;
    if (a.window > 0 && qpos - a.window + 1 > 0) first = qpos - a.window + 1;
    const int n_keys = qpos + 1 - first;
    const int chunk = a.key_chunk > 0 ? a.key_chunk : (n_keys + a.splits - 1) / a.splits;
    const int k_lo = first + sp * chunk, k_hi = min(qpos + 1, k_lo + chunk);

    float q[ATT_HG][DPL], acc[ATT_HG][DPL], mx[ATT_HG], l[ATT_HG];
#pragma unroll
    for (int hh = 0; hh < ATT_HG; hh++) {
        mx[hh] = -INFINITY;
        l[hh] = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            acc[hh][j] = 0.0f;
            q[hh][j] = hh < nh
                           ? a.q[((int64_t)t * a.n_heads + h0 + hh) * D + lane * DPL + j] * a.scale
                           : 0.0f;
        }
    }
    const int32_t *bt = a.block_table + (int64_t)s * a.max_blocks;
    const int64_t kv_row = (int64_t)a.n_kv_heads * D;
    /* ATT_U keys per warp and iteration: their block-table entries and rows are all
     * loaded before the first is used, so the loads' latencies overlap. */
    for (int base = k_lo + warp; base < k_hi; base += ATT_WARPS * ATT_U) {
        float kr[ATT_U][DPL], vr[ATT_U][DPL];
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            int kp = min(base + u * ATT_WARPS, k_hi - 1);
            int64_t slot = (int64_t)bt[kp / a.block_size] * a.block_size + kp % a.block_size;
            const int64_t off = slot * kv_row + (int64_t)kvh * D + lane * DPL;
            load_row<DPL>(a.k + off, kr[u]);
            load_row<DPL>(a.v + off, vr[u]);
        }
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            if (base + u * ATT_WARPS >= k_hi) break;
#pragma unroll
            for (int hh = 0; hh < ATT_HG; hh++) {
                if (hh >= nh) break;
                float sc = 0.0f;
#pragma unroll
                for (int j = 0; j < DPL; j++) sc = fmaf(q[hh][j], kr[u][j], sc);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) sc += __shfl_xor_sync(0xffffffffu, sc, o);
                if (a.softcap > 0) sc = a.softcap * tanhf(sc / a.softcap);
                float mn = fmaxf(mx[hh], sc);
                float corr = __expf(mx[hh] - mn), p = __expf(sc - mn);
                l[hh] = l[hh] * corr + p;
#pragma unroll
                for (int j = 0; j < DPL; j++) acc[hh][j] = fmaf(acc[hh][j], corr, p * vr[u][j]);
                mx[hh] = mn;
            }
        }
    }

    /* Merge the warps: [warp][head] maxima and sums, then [warp][head][D] accumulators. */
    __shared__ float s_m[ATT_WARPS][ATT_HG], s_l[ATT_WARPS][ATT_HG];
    extern __shared__ float s_acc[]; /* [ATT_WARPS][ATT_HG][D] */
    if (lane == 0)
#pragma unroll
        for (int hh = 0; hh < ATT_HG; hh++) {
            s_m[warp][hh] = mx[hh];
            s_l[warp][hh] = l[hh];
        }
#pragma unroll
    for (int hh = 0; hh < ATT_HG; hh++)
#pragma unroll
        for (int j = 0; j < DPL; j++) s_acc[(warp * ATT_HG + hh) * D + lane * DPL + j] = acc[hh][j];
    __syncthreads();
    for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
        int hh = i / D, d = i % D;
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, s_m[w][hh]);
        float L = 0.0f, o = 0.0f;
        if (M != -INFINITY) {
            for (int w = 0; w < ATT_WARPS; w++) {
                float f = __expf(s_m[w][hh] - M);
                L += s_l[w][hh] * f;
                o += s_acc[(w * ATT_HG + hh) * D + d] * f;
            }
        }
        int h = h0 + hh;
        if (a.splits == 1) {
            a.out[((int64_t)t * a.n_heads + h) * D + d] = o / L;
        } else {
            float *p = a.part + (((int64_t)t * a.n_heads + h) * a.splits + sp) * (D + 2);
            p[d] = o;
            if (d == 0) {
                p[D] = M;
                p[D + 1] = L;
            }
        }
    }
}

__global__ void k_attn_merge(float *out, const float *__restrict__ part, int splits, int D)
{
    allow_dependents();
    const int64_t th = blockIdx.x; /* token * n_heads + head */
    const float *p = part + th * splits * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, p[s * (D + 2) + D]);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float L = 0.0f, o = 0.0f;
        for (int s = 0; s < splits; s++) {
            const float *q = p + s * (D + 2);
            if (q[D] == -INFINITY) continue;
            float f = __expf(q[D] - M);
            L += q[D + 1] * f;
            o += q[d] * f;
        }
        out[th * D + d] = o / L;
    }
}

int cu_attn_splits(int n_tokens, int n_kv_heads, int max_keys, int sms)
{
    int blocks = n_tokens * n_kv_heads;
    int want = (2 * sms + blocks - 1) / blocks;
    int most = (max_keys + 15) / 16; /* at least 16 keys per range */
    if (want > most) want = most;
    if (want > 32) want = 32;
    return want < 1 ? 1 : want;
}

template <int DPL> static void launch(cudaStream_t s, const cu_attn_args &a)
{
    int group = a.n_heads / a.n_kv_heads;
    int chunks = (group + ATT_HG - 1) / ATT_HG;
    dim3 grid((unsigned)a.n_tokens, (unsigned)(a.n_kv_heads * chunks), (unsigned)a.splits);
    size_t smem = sizeof(float) * ATT_WARPS * ATT_HG * DPL * 32;
    k_attention<DPL><<<grid, ATT_WARPS * 32, smem, s>>>(a);
    CU_LAUNCHED();
    if (a.splits > 1) {
        k_attn_merge<<<(unsigned)(a.n_tokens * a.n_heads), 128, 0, s>>>(a.out, a.part, a.splits,
                                                                        a.head_dim);
        CU_LAUNCHED();
    }
}

void cu_attention(cudaStream_t s, const cu_attn_args &a)
{
    switch (a.head_dim / 32) {
    case 1:
        return launch<1>(s, a);
    case 2:
        return launch<2>(s, a);
    case 3:
        return launch<3>(s, a);
    case 4:
        return launch<4>(s, a);
    case 5:
        return launch<5>(s, a);
    case 6:
        return launch<6>(s, a);
    case 7:
        return launch<7>(s, a);
    default:
        return launch<8>(s, a);
    }
}
