/*
 * Attention over block-paged KV (bf16 rows [block][offset][kv head][head_dim]).
 *
 * One kernel serves prefill and decode tokens of a mixed batch on CUDA cores, for every even
 * head size up to CU_ATTN_MAX_D: a block takes one token, one KV head with up to 4 of the
 * query heads that share it (GQA), and one contiguous range of the token's visible keys
 * (split-K, flash-decoding style). Each warp walks every 4th key of the range with an online
 * softmax; the warps meet in shared memory. With more than one range per token, a second
 * kernel merges the ranges' partial results. Head sizes 64, 128 (and 256 for steps of 64-row
 * tiles) also have tensor-core kernels, below. Windows (sliding attention) and score
 * soft-capping follow the CPU reference.
 */
#include <assert.h>
#include <math.h>

extern "C" {
#include "common/err.h"
}

#include "kernels/cuda/cuda.cuh"

#include <cooperative_groups.h>

#define ATT_WARPS 4
#define ATT_HG    4 /* query heads per block */
#define ATT_U     4 /* keys in flight per warp (2 over head size 256) */

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

/*
 * A warp holds a row of head size D as DPL dimensions a lane: lane l has [l DPL, l DPL + DPL).
 * G = 0: D = 32 DPL (32 to 256 in steps of 32), every lane full, loads as wide as DPL allows.
 * G > 0: any other even D, with DPL = ceil(D / 32) rounded up to even (2 to 16): the lanes
 * from D / DPL on hold fewer dimensions or none, their scores' terms are 0 x 0 and their
 * output is not stored; loads are of G dimensions (2, 4 or 8 bf16), G dividing DPL and D so
 * that every group is aligned and lies wholly inside or outside the row.
 */
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

/* A lane's DPL dimensions of a row from p in loads of G, 0 from its n-th on (n, the
 * dimensions the lane holds, is a multiple of G; 0 or less: none, nothing read). */
template <int DPL, int G>
static __device__ __forceinline__ void load_row_part(const __nv_bfloat16 *p, float *out, int n)
{
#pragma unroll
    for (int i = 0; i < DPL / G; i++) {
        uint4 u = make_uint4(0u, 0u, 0u, 0u);
        if (G * i < n) {
            if constexpr (G == 8) {
                u = __ldg((const uint4 *)p + i);
            } else if constexpr (G == 4) {
                const uint2 h = __ldg((const uint2 *)p + i);
                u.x = h.x;
                u.y = h.y;
            } else {
                u.x = __ldg((const uint32_t *)p + i);
            }
        }
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int e = 0; e < G / 2; e++) {
            out[G * i + 2 * e] = __uint_as_float(w[e] << 16);
            out[G * i + 2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
        }
    }
}

/* Registers a thread: q and acc 4 DPL floats each, keys and values U DPL each. Over head
 * size 256 (DPL > 8) U is 2, not 4: 192 floats at DPL 16 (220 registers), where 4 keys would
 * take 256 and spill; a warp still has 4 KB of keys and values in flight, as at 256. */
template <int DPL, int G>
__global__ void __launch_bounds__(ATT_WARPS * 32) k_attention(cu_attn_args a)
{
    allow_dependents();
    constexpr int U = DPL <= 8 ? ATT_U : 2;
    const int D = G ? a.head_dim : DPL * 32;
    const int t = blockIdx.x;
    const int group = a.n_heads / a.n_kv_heads;
    const int chunks = (group + ATT_HG - 1) / ATT_HG;
    const int kvh = blockIdx.y / chunks, h0 = kvh * group + (blockIdx.y % chunks) * ATT_HG;
    const int nh = min(ATT_HG, kvh * group + group - h0);
    const int sp = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nd = G ? min(DPL, D - lane * DPL) : DPL; /* dimensions this lane holds */

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
            q[hh][j] = hh < nh && (!G || j < nd)
                           ? a.q[((int64_t)t * a.n_heads + h0 + hh) * D + lane * DPL + j] * a.scale
                           : 0.0f;
        }
    }
    const int32_t *bt = a.block_table + (int64_t)s * a.max_blocks;
    const int64_t kv_row = (int64_t)a.n_kv_heads * D;
    /* U keys per warp and iteration: their block-table entries and rows are all loaded
     * before the first is used, so the loads' latencies overlap. */
    for (int base = k_lo + warp; base < k_hi; base += ATT_WARPS * U) {
        float kr[U][DPL], vr[U][DPL];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kp = min(base + u * ATT_WARPS, k_hi - 1);
            int64_t slot = (int64_t)bt[kp / a.block_size] * a.block_size + kp % a.block_size;
            const int64_t off = slot * kv_row + (int64_t)kvh * D + lane * DPL;
            if constexpr (G) {
                load_row_part<DPL, G>(a.k + off, kr[u], nd);
                load_row_part<DPL, G>(a.v + off, vr[u], nd);
            } else {
                load_row<DPL>(a.k + off, kr[u]);
                load_row<DPL>(a.v + off, vr[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
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
        for (int j = 0; j < DPL; j++)
            if (!G || j < nd) s_acc[(warp * ATT_HG + hh) * D + lane * DPL + j] = acc[hh][j];
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

/*
 * Tensor-core attention (prefill and large batches), head sizes 64, 128 and 256: a block
 * takes 64 query rows of one sequence and one KV head (the rows of a GQA group share every
 * key), each of its 4 warps 16 of them. Key tiles of 64 keys (32 at 256) are copied from the
 * paged cache into shared memory with cp.async, the next tile's copy in flight while the
 * current one is used. Scores S = Q K^T and the output O += P V run as bf16 mma.sync
 * m16n8k16 with float32 accumulators; the softmax is online in float32 (FlashAttention-2
 * order). Q and P are rounded to bf16 as operands, so results differ from the float32 path
 * by about 1e-3 relative.
 *
 * At 256 a thread's O fragments alone are 128 registers: its Q fragments (64 more) stay in
 * shared memory, each lane reading back only its own 16 bytes a k-step, and the key tiles
 * are 32 keys (scores 16 registers, not 32). Shared memory 98 KB a block (tiles 66, Q 32):
 * two blocks an SM, and within the 99 KB that sm_86/89 allow a block.
 */
#define TC_KEYS 64

template <int D> struct tc_smem {
    static constexpr int KEYS = D > 128 ? 32 : TC_KEYS; /* keys a tile */
    __nv_bfloat16 k[2][KEYS][D + 8]; /* 16 bytes of padding: conflict-free fragments */
    __nv_bfloat16 v[2][KEYS][D + 8];
};

/* Dynamic shared memory of k_attention_tc<D>: the tiles, then at D > 128 the Q fragments
 * [warp][k-step][lane], 16 bytes each. */
template <int D> static constexpr size_t tc_smem_bytes()
{
    return sizeof(tc_smem<D>) + (D > 128 ? (size_t)4 * (D / 16) * 32 * 16 : 0);
}
static_assert(tc_smem_bytes<256>() <= 99 * 1024, "k_attention_tc<256> shared memory");

template <int D> __global__ void __launch_bounds__(128) k_attention_tc(cu_attn_args a)
{
    allow_dependents();
    extern __shared__ __align__(16) unsigned char tc_raw[];
    tc_smem<D> &sm = *(tc_smem<D> *)tc_raw;
    constexpr int DK = D / 16; /* k-steps of Q K^T */
    constexpr int DN = D / 8;  /* n-tiles of O */
    constexpr int CH = D / 8;  /* 16-byte chunks per key row */
    constexpr int KT = tc_smem<D>::KEYS;
    constexpr bool QS = D > 128; /* Q fragments in shared memory */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int s = a.tile_seq[blockIdx.x], row0 = a.tile_row[blockIdx.x];
    const int kvh = blockIdx.y;
    const int group = a.n_heads / a.n_kv_heads;
    const int t0 = a.q_start[s], n_rows = (a.q_start[s + 1] - t0) * group;

    /* This thread's two rows (g and g + 8 of the warp's 16): token, head, position. */
    int tok[2], head[2], qpos[2], first[2];
    bool live[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = row0 + warp * 16 + g + 8 * h;
        live[h] = r < n_rows;
        if (!live[h]) r = n_rows - 1;
        tok[h] = t0 + r / group;
        head[h] = kvh * group + r % group;
        qpos[h] = a.pos[tok[h]];
        first[h] = a.window > 0 ? max(0, qpos[h] - a.window + 1) : 0;
    }
    /* The block's key range: from the first row's first key to the last row's position. */
    const int r_last = min(row0 + CU_ATTN_TC_ROWS, n_rows) - 1;
    const int p_first = a.pos[t0 + row0 / group], p_last = a.pos[t0 + r_last / group];
    const int k_lo = a.window > 0 ? max(0, p_first - a.window + 1) : 0, k_hi = p_last + 1;
    const bool warp_live = row0 + warp * 16 < n_rows;

    const int32_t *bt = a.block_table + (int64_t)s * a.max_blocks;
    const int64_t kv_row = (int64_t)a.n_kv_heads * D;
    auto load_tile = [&](int buf, int kt0) {
        for (int i = threadIdx.x; i < KT * CH; i += blockDim.x) {
            const int key = i / CH, c = i % CH, kp = kt0 + key;
            const bool ok = kp < k_hi;
            int64_t off = 0;
            if (ok) {
                const int64_t slot =
                    (int64_t)bt[kp / a.block_size] * a.block_size + kp % a.block_size;
                off = slot * kv_row + (int64_t)kvh * D + c * 8;
            }
            cp16(&sm.k[buf][key][c * 8], a.k + off, ok);
            cp16(&sm.v[buf][key][c * 8], a.v + off, ok);
        }
        asm volatile("cp.async.commit_group;");
    };

    const int kt_begin = k_lo / KT * KT;
    load_tile(0, kt_begin);

    /* Q fragments (A operand, row-major 16 x 16 per k-step), rounded to bf16. */
    uint32_t qf[QS ? 1 : DK][4];
    uint4 *sq = (uint4 *)(tc_raw + sizeof(tc_smem<D>)) + warp * DK * 32 + lane; /* QS: [kk * 32] */
    if constexpr (QS) {
#pragma unroll
        for (int kk = 0; kk < DK; kk++) {
            uint32_t f[4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float *qr =
                    a.q + ((int64_t)tok[h] * a.n_heads + head[h]) * D + kk * 16 + 2 * tq;
                float2 lo = *(const float2 *)qr, hi = *(const float2 *)(qr + 8);
                f[h] = pack_bf16(lo.x, lo.y);
                f[2 + h] = pack_bf16(hi.x, hi.y);
            }
            sq[kk * 32] = make_uint4(f[0], f[1], f[2], f[3]);
        }
    } else {
#pragma unroll
        for (int kk = 0; kk < DK; kk++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float *qr =
                    a.q + ((int64_t)tok[h] * a.n_heads + head[h]) * D + kk * 16 + 2 * tq;
                float2 lo = *(const float2 *)qr, hi = *(const float2 *)(qr + 8);
                qf[kk][h] = pack_bf16(lo.x, lo.y);
                qf[kk][2 + h] = pack_bf16(hi.x, hi.y);
            }
    }

    float o[DN][4];
#pragma unroll
    for (int j = 0; j < DN; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    int buf = 0;
    for (int kt0 = kt_begin; kt0 < k_hi; kt0 += KT, buf ^= 1) {
        if (kt0 + KT < k_hi) {
            load_tile(buf ^ 1, kt0 + KT);
            asm volatile("cp.async.wait_group 1;");
        } else {
            asm volatile("cp.async.wait_group 0;");
        }
        __syncthreads();
        if (warp_live) {
            float sc[KT / 8][4];
            if constexpr (QS) {
                /* k-steps outside: each Q fragment read once a tile; every sc[j] still sums
                 * its k-steps in order */
#pragma unroll
                for (int j = 0; j < KT / 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < DK; kk++) {
                    const uint4 f = sq[kk * 32];
                    const uint32_t qa[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
                    for (int j = 0; j < KT / 8; j++) {
                        const __nv_bfloat16 *kr = &sm.k[buf][8 * j + g][kk * 16 + 2 * tq];
                        mma_bf16(sc[j], qa, *(const uint32_t *)kr, *(const uint32_t *)(kr + 8));
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < KT / 8; j++) {
                    sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
                    for (int kk = 0; kk < DK; kk++) {
                        const __nv_bfloat16 *kr = &sm.k[buf][8 * j + g][kk * 16 + 2 * tq];
                        mma_bf16(sc[j], qf[kk], *(const uint32_t *)kr, *(const uint32_t *)(kr + 8));
                    }
                }
            }
            /* scale, soft-cap, mask; the tile's row maxima */
            float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < KT / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e >> 1, kp = kt0 + 8 * j + 2 * tq + (e & 1);
                    float v = sc[j][e] * a.scale;
                    if (a.softcap > 0) v = a.softcap * tanhf(v / a.softcap);
                    if (kp < first[h] || kp > qpos[h]) v = -INFINITY;
                    sc[j][e] = v;
                    tmax[h] = fmaxf(tmax[h], v);
                }
            float corr[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 1));
                tmax[h] = fmaxf(tmax[h], __shfl_xor_sync(0xffffffffu, tmax[h], 2));
                const float mn = fmaxf(mx[h], tmax[h]);
                /* all keys so far masked: nothing to scale, probabilities 0 */
                const float base = mn == -INFINITY ? 0.0f : mn;
                corr[h] = __expf(mx[h] - base);
                mx[h] = mn;
                tmax[h] = base;
            }
            float rs[2] = {0.0f, 0.0f};
            uint32_t pf[KT / 16][4];
#pragma unroll
            for (int j = 0; j < KT / 8; j++) {
                const float p0 = __expf(sc[j][0] - tmax[0]), p1 = __expf(sc[j][1] - tmax[0]);
                const float p2 = __expf(sc[j][2] - tmax[1]), p3 = __expf(sc[j][3] - tmax[1]);
                rs[0] += p0 + p1;
                rs[1] += p2 + p3;
                pf[j >> 1][(j & 1) * 2] = pack_bf16(p0, p1);
                pf[j >> 1][(j & 1) * 2 + 1] = pack_bf16(p2, p3);
            }
#pragma unroll
            for (int h = 0; h < 2; h++) l[h] = l[h] * corr[h] + rs[h];
#pragma unroll
            for (int j = 0; j < DN; j++) {
                o[j][0] *= corr[0];
                o[j][1] *= corr[0];
                o[j][2] *= corr[1];
                o[j][3] *= corr[1];
            }
            /* O += P V: V fragments (k = key, n = dim) by transposing loads */
            const int mi = lane >> 3, ri = lane & 7;
#pragma unroll
            for (int ks = 0; ks < KT / 16; ks++)
#pragma unroll
                for (int dt = 0; dt < D / 16; dt++) {
                    const __nv_bfloat16 *vp =
                        &sm.v[buf][ks * 16 + ri + (mi & 1) * 8][dt * 16 + (mi >> 1) * 8];
                    uint32_t b0, b1, b2, b3;
                    asm volatile(
                        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                        : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                        : "r"((uint32_t)__cvta_generic_to_shared(vp)));
                    mma_bf16(o[2 * dt], pf[ks], b0, b1);
                    mma_bf16(o[2 * dt + 1], pf[ks], b2, b3);
                }
        }
        __syncthreads(); /* the buffer is refilled two tiles on */
    }

    if (!warp_live) return;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (!live[h]) continue;
        const float inv = 1.0f / l[h];
        float *out = a.out + ((int64_t)tok[h] * a.n_heads + head[h]) * D + 2 * tq;
#pragma unroll
        for (int j = 0; j < DN; j++)
            *(float2 *)(out + 8 * j) = make_float2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
    }
}

/*
 * Decode attention on tensor cores (steps where every sequence has one token): a block takes
 * one token, one KV head and one range of its keys (gridDim.z ranges), the rows of the GQA
 * group (up to 16) in every warp, and the 4 warps split the range, 16 keys a warp at a time
 * (keys 16 w, 16 (w + 4), ...). A decode token has only `group` rows, so the 64-row tiles of
 * k_attention_tc would leave most of their rows empty and walk all keys in one warp; here
 * every warp reads keys. With few sequences the keys go in ranges over the GPU (a round of
 * 64 keys or more each); each block leaves its unscaled result with its maximum and sum,
 * and the last block of the token and KV head to finish merges them. Launched early, a
 * block loads its first round of keys, all but the token's own, before it waits for the
 * kernel that writes the queries and stores that key.
 *
 * Keys and values go from global memory straight into registers with 16-byte loads, in the
 * order the MMA operands want them, by numbering the dimensions differently in each product
 * (a dot product does not depend on the order of its terms):
 *   - S = Q K^T (m = rows, n = 8 keys, k = 16 dimensions): lane (g, t) loads key g's
 *     dimensions 32 i + 8 t .. + 8 for each i; step 2 i takes the first four of them and step
 *     2 i + 1 the last four, and Q's fragments are read in the same order;
 *   - O += P V (m = rows, n = 8 dimensions, k = 16 keys): lane (g, t) loads keys 2 t, 2 t + 1,
 *     2 t + 8, 2 t + 9 of the 16, dimensions 64 c + 8 g .. + 8; column g of n-tile 8 c + e is
 *     dimension 64 c + 8 g + e, and two byte permutes pair the keys of a fragment register.
 * The score fragments of two 8-key tiles are then the P operand as they are (FlashAttention-2
 * order), and a lane ends with 16 contiguous output dimensions per 64. The warps merge their
 * online-softmax states in shared memory. Scores and probabilities round to bf16 as operands
 * (about 1e-3 relative), as in k_attention_tc.
 */
#define DEC_WARPS 4
#define DEC_KR    16                   /* keys a warp takes a round */
#define DEC_KEYS  (DEC_WARPS * DEC_KR) /* keys a block takes a round */

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

/* A lane's loads of the 16 keys from kb (keys past the token's last read as the last one,
 * masked later); with `which` 1 only those of keys before the token's own (stored by the
 * kernel before this one), 2 only its own, 3 all. */
template <int D>
static __device__ __forceinline__ void dec_load_k(const cu_attn_args &a, const dec_src &s, int kb,
                                                  int which, int g, int tq, uint4 (&kr)[2][D / 32])
{
    const int64_t kv_row = (int64_t)a.n_kv_heads * D;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int kp = min(kb + g + 8 * h, s.k_hi - 1);
        if (!(which & (kp == s.qpos ? 2 : 1))) continue;
        const int64_t off = dec_slot(a, s.bt, kp) * kv_row + 8 * tq;
#pragma unroll
        for (int i = 0; i < D / 32; i++) kr[h][i] = __ldg((const uint4 *)(s.k + off + 32 * i));
    }
}

template <int D>
static __device__ __forceinline__ void dec_load_v(const cu_attn_args &a, const dec_src &s, int kb,
                                                  int which, int g, int tq, uint4 (&vr)[4][D / 64])
{
    const int64_t kv_row = (int64_t)a.n_kv_heads * D;
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const int kp = min(kb + 2 * tq + (u & 1) + 8 * (u >> 1), s.k_hi - 1);
        if (!(which & (kp == s.qpos ? 2 : 1))) continue;
        const int64_t off = dec_slot(a, s.bt, kp) * kv_row + 8 * g;
#pragma unroll
        for (int c = 0; c < D / 64; c++) vr[u][c] = __ldg((const uint4 *)(s.v + off + 64 * c));
    }
}

/* A warp's first round from kb, if it has one (live), around the wait for the kernel before
 * (launched early, the warp may start while that kernel finishes): the loads of the earlier
 * keys go out before it, those of the token's own key (stored by that kernel) after it. */
template <int D>
static __device__ __forceinline__ void
dec_first_loads(const cu_attn_args &a, const dec_src &s, int kb, bool live, int g, int tq,
                uint4 (&kr)[2][D / 32], uint4 (&vr)[4][D / 64])
{
    if (live) {
        dec_load_k<D>(a, s, kb, 1, g, tq, kr);
        dec_load_v<D>(a, s, kb, 1, g, tq, vr);
    }
    grid_dependency_wait();
    if (live) {
        dec_load_k<D>(a, s, kb, 2, g, tq, kr);
        dec_load_v<D>(a, s, kb, 2, g, tq, vr);
    }
}

/* Q fragments of token t's rows in KV head kvh: rows g (and g + 8), dimensions in the key
 * loads' order, bf16. */
template <int D, bool G16>
static __device__ __forceinline__ void dec_load_q(const cu_attn_args &a, int t, int kvh, int g,
                                                  int tq, uint32_t (&qf)[D / 16][4])
{
    const int group = a.n_heads / a.n_kv_heads;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        const bool ok = r < group && (G16 || h == 0);
        const float *qr = a.q + ((int64_t)t * a.n_heads + kvh * group + (ok ? r : 0)) * D + 8 * tq;
#pragma unroll
        for (int i = 0; i < D / 32; i++) {
            float4 lo = make_float4(0, 0, 0, 0), hi = lo;
            if (ok) {
                lo = *(const float4 *)(qr + 32 * i);
                hi = *(const float4 *)(qr + 32 * i + 4);
            }
            qf[2 * i][h] = pack_bf16(lo.x, lo.y);
            qf[2 * i][2 + h] = pack_bf16(lo.z, lo.w);
            qf[2 * i + 1][h] = pack_bf16(hi.x, hi.y);
            qf[2 * i + 1][2 + h] = pack_bf16(hi.z, hi.w);
        }
    }
}

/* One round of a warp: the 16 keys from kb (in kr and vr) into the online softmax state (o,
 * mx, l). next_k runs once the scores have taken kr, next_v once P V has taken vr: each
 * loads the warp's next round there, so one round of loads stays in flight throughout. */
template <int D, bool G16, class NK, class NV>
static __device__ __forceinline__ void
dec_round(const cu_attn_args &a, const uint32_t (&qf)[D / 16][4], const uint4 (&kr)[2][D / 32],
          const uint4 (&vr)[4][D / 64], float (&o)[D / 8][4], float (&mx)[2], float (&l)[2], int kb,
          int k_hi, int tq, NK next_k, NV next_v)
{
    constexpr int NC = D / 32, VC = D / 64, DN = D / 8, H = 2;
    const float LOG2E = 1.4426950408889634f, sl2 = a.scale * LOG2E;

    /* S for keys kb + 8 h .. + 7, as two chains of products (even and odd steps) */
    float sc[H][4];
#pragma unroll
    for (int h = 0; h < H; h++) {
        float e2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        sc[h][0] = sc[h][1] = sc[h][2] = sc[h][3] = 0.0f;
#pragma unroll
        for (int i = 0; i < NC; i++) {
            mma_bf16(sc[h], qf[2 * i], kr[h][i].x, kr[h][i].y);
            mma_bf16(e2, qf[2 * i + 1], kr[h][i].z, kr[h][i].w);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) sc[h][e] += e2[e];
    }
    next_k();
    /* scale (log2 units), soft-cap, mask; row maxima over the quad */
    float tmax[2] = {-INFINITY, -INFINITY};
    if (a.softcap > 0) {
#pragma unroll
        for (int h = 0; h < H; h++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[h][e] = a.softcap * tanhf(sc[h][e] * a.scale / a.softcap) * LOG2E;
    } else {
#pragma unroll
        for (int h = 0; h < H; h++)
#pragma unroll
            for (int e = 0; e < 4; e++) sc[h][e] *= sl2;
    }
#pragma unroll
    for (int h = 0; h < H; h++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if (kb + 8 * h + 2 * tq + (e & 1) >= k_hi) sc[h][e] = -INFINITY;
            tmax[e >> 1] = fmaxf(tmax[e >> 1], sc[h][e]);
        }
    float corr[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
        const float mn = fmaxf(mx[r], tmax[r]);
        base[r] = mn == -INFINITY ? 0.0f : mn;
        corr[r] = ex2(mx[r] - base[r]);
        mx[r] = mn;
    }
    uint32_t pf[2 * H];
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < H; h++) {
        const float p0 = ex2(sc[h][0] - base[0]), p1 = ex2(sc[h][1] - base[0]);
        const float p2 = ex2(sc[h][2] - base[1]), p3 = ex2(sc[h][3] - base[1]);
        rs[0] += p0 + p1;
        rs[1] += p2 + p3;
        pf[2 * h] = pack_bf16(p0, p1);
        pf[2 * h + 1] = G16 ? pack_bf16(p2, p3) : 0u;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) l[r] = l[r] * corr[r] + rs[r];
#pragma unroll
    for (int j = 0; j < DN; j++) {
        o[j][0] *= corr[0];
        o[j][1] *= corr[0];
        if (G16) {
            o[j][2] *= corr[1];
            o[j][3] *= corr[1];
        }
    }
    /* O += P V: register u of keys (2t, 2t + 1) pairs the same dimension of two keys */
#pragma unroll
    for (int c = 0; c < VC; c++) {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const uint32_t sel = e & 1 ? 0x7632u : 0x5410u;
            const int wi = e >> 1;
            const uint32_t *w0 = (const uint32_t *)&vr[0][c], *w1 = (const uint32_t *)&vr[1][c],
                           *w2 = (const uint32_t *)&vr[2][c], *w3 = (const uint32_t *)&vr[3][c];
            float d[4] = {o[8 * c + e][0], o[8 * c + e][1], G16 ? o[8 * c + e][2] : 0.0f,
                          G16 ? o[8 * c + e][3] : 0.0f};
            mma_bf16(d, pf, __byte_perm(w0[wi], w1[wi], sel), __byte_perm(w2[wi], w3[wi], sel));
            o[8 * c + e][0] = d[0];
            o[8 * c + e][1] = d[1];
            if (G16) {
                o[8 * c + e][2] = d[2];
                o[8 * c + e][3] = d[3];
            }
        }
    }
    next_v();
}

/* The ranges of one token and KV head launched as one cluster (a.cluster): once every
 * block has its partial result in shared memory (c_o, c_ml), each merges its share of the
 * group's outputs from all of them through distributed shared memory. This takes the place
 * of the partial results' round trip through global memory, the count and the merge by the
 * last block. */
template <int D>
static __device__ __forceinline__ void dec_cluster_merge(const cu_attn_args &a, float *c_o,
                                                         float *c_ml, int64_t row0, int sp, int ns)
{
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync(); /* every range's result is in */
    const int group = a.n_heads / a.n_kv_heads, items = group * D / 4;
    const int lo = items * sp / ns, hi = items * (sp + 1) / ns;
    for (int i = lo + (int)threadIdx.x; i < hi; i += blockDim.x) {
        const int r = i / (D / 4), d = 4 * (i % (D / 4));
        float2 ml[8];
        float4 v[8];
        float M = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < ns) {
                ml[j] = *(const float2 *)cl.map_shared_rank(c_ml + 2 * r, j);
                v[j] = *(const float4 *)cl.map_shared_rank(c_o + r * D + d, j);
                M = fmaxf(M, ml[j].x);
            }
        float L = 0.0f;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < ns) {
                const float f = ml[j].x == -INFINITY ? 0.0f : ex2(ml[j].x - M);
                L = fmaf(ml[j].y, f, L);
                acc.x = fmaf(v[j].x, f, acc.x);
                acc.y = fmaf(v[j].y, f, acc.y);
                acc.z = fmaf(v[j].z, f, acc.z);
                acc.w = fmaf(v[j].w, f, acc.w);
            }
        const float inv = 1.0f / L;
        acc = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
        if (a.out) *(float4 *)(a.out + (row0 + r) * D + d) = acc;
        if (a.outb) {
            const __nv_bfloat162 l2 = __floats2bfloat162_rn(acc.x, acc.y),
                                 h2 = __floats2bfloat162_rn(acc.z, acc.w);
            *(uint2 *)(a.outb + (row0 + r) * D + d) =
                make_uint2(*(const uint32_t *)&l2, *(const uint32_t *)&h2);
        }
    }
    cl.sync(); /* no block leaves while another reads its shared memory */
}

template <int D, bool G16>
__global__ void __launch_bounds__(DEC_WARPS * 32) k_attention_dec(cu_attn_args a)
{
    allow_dependents();
    constexpr int NC = D / 32, VC = D / 64, DN = D / 8;
    extern __shared__ float dec_sm[]; /* [DEC_WARPS][group][D], then m and l [DEC_WARPS][16] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int t = blockIdx.x, kvh = blockIdx.y, sp = blockIdx.z, ns = gridDim.z;
    const int group = a.n_heads / a.n_kv_heads;
    const dec_src src = dec_src_of(a, t, kvh, D);
    /* this block's range of the token's keys: equal shares in whole rounds of the block's
     * warps, the last ones empty where the keys run out */
    const int share = ((src.k_hi - src.k_lo + ns - 1) / ns + DEC_KEYS - 1) / DEC_KEYS * DEC_KEYS;
    const int k_lo = min(src.k_hi, src.k_lo + sp * share), k_hi = min(src.k_hi, k_lo + share);
    dec_src rs = src; /* the range's keys */
    rs.k_hi = k_hi;

    /* the first round's loads around the wait for the kernel that stores this token's key
     * and value and writes the queries */
    uint4 kr[2][NC], vr[4][VC];
    dec_first_loads<D>(a, rs, k_lo + DEC_KR * warp, k_lo + DEC_KR * warp < k_hi, g, tq, kr, vr);
    uint32_t qf[2 * NC][4];
    dec_load_q<D, G16>(a, t, kvh, g, tq, qf);

    float o[DN][4];
#pragma unroll
    for (int j = 0; j < DN; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int kb = k_lo + DEC_KR * warp; kb < k_hi; kb += DEC_KEYS) {
        const int next = kb + DEC_KEYS;
        dec_round<D, G16>(
            a, qf, kr, vr, o, mx, l, kb, k_hi, tq,
            [&] {
                if (next < k_hi) dec_load_k<D>(a, rs, next, 3, g, tq, kr);
            },
            [&] {
                if (next < k_hi) dec_load_v<D>(a, rs, next, 3, g, tq, vr);
            });
    }

    /* Merge the warps: this warp's rows g (and g + 8) and its 16 dimensions per 64. */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    float *s_o = dec_sm, *s_m = dec_sm + DEC_WARPS * group * D, *s_l = s_m + DEC_WARPS * 16;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        if (r >= group || (!G16 && h)) continue;
        if (tq == 0) {
            s_m[warp * 16 + r] = mx[h];
            s_l[warp * 16 + r] = l[h];
        }
        float *dst = s_o + ((int64_t)warp * group + r) * D + 16 * tq;
#pragma unroll
        for (int c = 0; c < VC; c++)
#pragma unroll
            for (int e = 0; e < 8; e++) {
                dst[64 * c + e] = o[8 * c + e][2 * h];
                dst[64 * c + 8 + e] = o[8 * c + e][2 * h + 1];
            }
    }
    __syncthreads();
    /* Each row's weight for each warp, once: 2^(m_w - M) (0 for a warp without keys), over L
     * where this block has all of the token's keys, in place of the maxima. With several
     * ranges the block's partial result goes to a.part: O unscaled at [row][range][D], then
     * M and L at [row][range][2] after all of those (-inf and 0 for an empty range, whose O
     * is 0). */
    const int64_t row0 = (int64_t)t * a.n_heads + kvh * group; /* the group's first row */
    float *p_ml = a.part + (int64_t)a.n_tokens * a.n_heads * ns * D;
    /* with the ranges in one cluster, the partial result stays in shared memory: O
     * unscaled [group][D], then M and L a row */
    float *c_o = s_l + DEC_WARPS * 16, *c_ml = c_o + group * D;
    if (threadIdx.x < group) {
        const int r = threadIdx.x;
        float M = -INFINITY, L = 0.0f, f[DEC_WARPS];
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, s_m[w * 16 + r]);
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) {
            f[w] = M == -INFINITY ? 0.0f : ex2(s_m[w * 16 + r] - M);
            L += s_l[w * 16 + r] * f[w];
        }
        const float inv = ns > 1 ? 1.0f : 1.0f / L;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) s_m[w * 16 + r] = f[w] * inv;
        if (a.cluster)
            *(float2 *)(c_ml + 2 * r) = make_float2(M, L);
        else if (ns > 1)
            *(float2 *)(p_ml + ((row0 + r) * ns + sp) * 2) = make_float2(M, L);
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
        const int r = i / D, d = i % D;
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++)
            acc = fmaf(s_o[((int64_t)w * group + r) * D + d], s_m[w * 16 + r], acc);
        if (a.cluster) {
            c_o[r * D + d] = acc;
        } else if (ns > 1) {
            a.part[((row0 + r) * ns + sp) * D + d] = acc;
        } else {
            if (a.out) a.out[(row0 + r) * D + d] = acc;
            if (a.outb) a.outb[(row0 + r) * D + d] = __float2bfloat16_rn(acc);
        }
    }
    if (ns == 1) return;
    if (a.cluster) return dec_cluster_merge<D>(a, c_o, c_ml, row0, sp, ns);

    /* The last of the token's ranges to finish (counted in a.sem, which it sets back to 0
     * for the next launch) merges them. */
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int *cnt = a.sem + (int64_t)t * a.n_kv_heads + kvh;
        last = atomicAdd(cnt, 1) == ns - 1;
        if (last) *cnt = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* each (row, range)'s weight 2^(m - M) / L, in shared memory; then each row's O, four
     * dimensions a thread, the ranges' loads independent of each other */
    float *w = dec_sm; /* [group][ns] maxima, then sums (the warps' O are no longer needed) */
    for (int i = threadIdx.x; i < group * ns; i += blockDim.x) {
        const float2 ml = __ldcg((const float2 *)(p_ml + (row0 * ns + i) * 2));
        w[i] = ml.x;
        w[group * ns + i] = ml.y;
    }
    __syncthreads();
    if (threadIdx.x < group) {
        float *wr = w + threadIdx.x * ns, *lr = w + (group + threadIdx.x) * ns;
        float M = -INFINITY, L = 0.0f;
        for (int j = 0; j < ns; j++) M = fmaxf(M, wr[j]);
        for (int j = 0; j < ns; j++) {
            wr[j] = wr[j] == -INFINITY ? 0.0f : ex2(wr[j] - M);
            L = fmaf(lr[j], wr[j], L);
        }
        const float inv = 1.0f / L;
        for (int j = 0; j < ns; j++) wr[j] *= inv;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * D / 4; i += blockDim.x) {
        const int r = i / (D / 4), d = 4 * (i % (D / 4));
        const float4 *src = (const float4 *)(a.part + (row0 + r) * ns * D + d);
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
        for (int j = 0; j < ns; j++) {
            const float4 v = __ldcg(src + j * (D / 4));
            const float f = w[r * ns + j];
            acc.x = fmaf(v.x, f, acc.x);
            acc.y = fmaf(v.y, f, acc.y);
            acc.z = fmaf(v.z, f, acc.z);
            acc.w = fmaf(v.w, f, acc.w);
        }
        if (a.out) *(float4 *)(a.out + (row0 + r) * D + d) = acc;
        if (a.outb) {
            const __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x, acc.y),
                                 hi = __floats2bfloat162_rn(acc.z, acc.w);
            *(uint2 *)(a.outb + (row0 + r) * D + d) =
                make_uint2(*(const uint32_t *)&lo, *(const uint32_t *)&hi);
        }
    }
}

/* A warp's rows of token t in KV head kvh once all of its keys are in (o, l): lane (g, tq)
 * holds row g (and g + 8), dimensions 64 c + 16 tq .. + 16. */
template <int D, bool G16>
static __device__ __forceinline__ void dec_write_rows(const cu_attn_args &a, float (&o)[D / 8][4],
                                                      float (&l)[2], int t, int kvh, int g, int tq)
{
    constexpr int VC = D / 64;
    const int group = a.n_heads / a.n_kv_heads;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        if (r >= group || (!G16 && h)) continue;
        const float inv = 1.0f / l[h];
        const int64_t row = ((int64_t)t * a.n_heads + kvh * group + r) * D + 16 * tq;
#pragma unroll
        for (int c = 0; c < VC; c++) {
            float v[16];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                v[e] = o[8 * c + e][2 * h] * inv;
                v[8 + e] = o[8 * c + e][2 * h + 1] * inv;
            }
            if (a.out) {
                float4 *dst = (float4 *)(a.out + row + 64 * c);
#pragma unroll
                for (int j = 0; j < 4; j++)
                    dst[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
            }
            if (a.outb) {
                uint4 *dst = (uint4 *)(a.outb + row + 64 * c);
#pragma unroll
                for (int j = 0; j < 2; j++)
                    dst[j] = make_uint4(pack_bf16(v[8 * j], v[8 * j + 1]),
                                        pack_bf16(v[8 * j + 2], v[8 * j + 3]),
                                        pack_bf16(v[8 * j + 4], v[8 * j + 5]),
                                        pack_bf16(v[8 * j + 6], v[8 * j + 7]));
            }
        }
    }
}

/*
 * Decode attention for many sequences (k_attention_decw): each warp takes whole (token, KV
 * head) pairs, every visible key in rounds of 16 with the same online softmax as
 * k_attention_dec, and writes the pair's rows itself: no barrier, no merge, no partial
 * results. The grid is as many blocks as fit at once; its warps take the pairs at a stride
 * of their count, and a warp's next round, in its next pair once the current pair's keys run
 * out, loads while the current round computes, so every warp keeps keys or values in flight
 * from its first pair to its last. Launched early, the first round's loads of the earlier
 * keys go out before the wait. Taken for steps of many pairs over short contexts (a pair's
 * keys are one warp's work).
 */
template <int D, bool G16>
__global__ void __launch_bounds__(DEC_WARPS * 32) k_attention_decw(cu_attn_args a)
{
    allow_dependents();
    constexpr int NC = D / 32, VC = D / 64, DN = D / 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int n_pairs = a.n_tokens * a.n_kv_heads, stride = gridDim.x * DEC_WARPS;
    int pr = blockIdx.x * DEC_WARPS + (threadIdx.x >> 5);
    if (pr >= n_pairs) return;
    dec_src cur = dec_src_of(a, pr / a.n_kv_heads, pr % a.n_kv_heads, D);
    uint4 kr[2][NC], vr[4][VC];
    dec_first_loads<D>(a, cur, cur.k_lo, true, g, tq, kr, vr);
    for (;;) {
        const int t = pr / a.n_kv_heads, kvh = pr % a.n_kv_heads;
        uint32_t qf[2 * NC][4];
        dec_load_q<D, G16>(a, t, kvh, g, tq, qf);
        float o[DN][4];
#pragma unroll
        for (int j = 0; j < DN; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
        float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
        /* the round after this one: the next of this pair, or the first of the next pair */
        dec_src nxt = cur;
        int np = pr;
        for (int kb = cur.k_lo;; kb += DEC_KR) {
            int nkb = kb + DEC_KR;
            const bool last = nkb >= cur.k_hi;
            if (last) {
                np = pr + stride;
                if (np < n_pairs) {
                    nxt = dec_src_of(a, np / a.n_kv_heads, np % a.n_kv_heads, D);
                    nkb = nxt.k_lo;
                }
            }
            const bool more = np < n_pairs;
            dec_round<D, G16>(
                a, qf, kr, vr, o, mx, l, kb, cur.k_hi, tq,
                [&] {
                    if (more) dec_load_k<D>(a, nxt, nkb, 3, g, tq, kr);
                },
                [&] {
                    if (more) dec_load_v<D>(a, nxt, nkb, 3, g, tq, vr);
                });
            if (last) break;
        }
        dec_write_rows<D, G16>(a, o, l, t, kvh, g, tq);
        if (np >= n_pairs) break;
        pr = np;
        cur = nxt;
    }
}

bool cu_attn_dec_ok(int head_dim, int group)
{
    return (head_dim == 64 || head_dim == 128) && group >= 1 && group <= 16;
}

int cu_attn_dec_splits(int n_tokens, int n_kv_heads, int max_keys, int sms)
{
    /* ranges of whole rounds of a block's warps, up to one block an SM and 64 a token (the
     * merge keeps two floats a range and row in shared memory) */
    const int blocks = n_tokens * n_kv_heads, rounds = (max_keys + DEC_KEYS - 1) / DEC_KEYS;
    int n = (sms + blocks - 1) / blocks;
    if (n > rounds) n = rounds;
    if (n > 64) n = 64;
    return n > 1 ? n : 1;
}

template <int D> static void launch_dec(cudaStream_t s, const cu_attn_args &a)
{
    const int group = a.n_heads / a.n_kv_heads;
    const size_t smem = sizeof(float) * (DEC_WARPS * (size_t)group * D + 2 * DEC_WARPS * 16 +
                                         (a.cluster ? (size_t)group * D + 32 : 0));
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2];
    cfg.gridDim = dim3((unsigned)a.n_tokens, (unsigned)a.n_kv_heads, (unsigned)a.splits);
    cfg.blockDim = dim3(DEC_WARPS * 32);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    if (a.early) {
        attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (a.cluster) { /* a token and KV head's ranges in one cluster */
        attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
        attr[cfg.numAttrs].val.clusterDim.x = 1;
        attr[cfg.numAttrs].val.clusterDim.y = 1;
        attr[cfg.numAttrs++].val.clusterDim.z = (unsigned)a.splits;
    }
    if (group > 8)
        CU(cudaLaunchKernelEx(&cfg, k_attention_dec<D, true>, a));
    else
        CU(cudaLaunchKernelEx(&cfg, k_attention_dec<D, false>, a));
}

/* Blocks of k_attention_decw: as many as fit on the GPU at once, none without a pair. */
template <int D, bool G16> static void launch_decw1(cudaStream_t s, const cu_attn_args &a)
{
    static int most;
    if (!most) {
        int bps, dev, sms;
        CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, k_attention_decw<D, G16>,
                                                         DEC_WARPS * 32, 0));
        CU(cudaGetDevice(&dev));
        CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        most = (bps > 0 ? bps : 1) * sms;
    }
    const int want = (a.n_tokens * a.n_kv_heads + DEC_WARPS - 1) / DEC_WARPS;
    cu_launch l;
    cu_launch_init(&l, (unsigned)(want < most ? want : most), DEC_WARPS * 32, 0, s, a.early);
    CU(cudaLaunchKernelEx(&l.cfg, k_attention_decw<D, G16>, a));
}

template <int D> static void launch_decw(cudaStream_t s, const cu_attn_args &a)
{
    if (a.n_heads / a.n_kv_heads > 8)
        launch_decw1<D, true>(s, a);
    else
        launch_decw1<D, false>(s, a);
}

bool cu_attn_tc_ok(int head_dim)
{
    return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

void cu_attention_init(void)
{
    /* More than 48 KB of shared memory must be allowed per kernel, before any launch (and
     * outside graph capture). */
    CU(cudaFuncSetAttribute(k_attention_tc<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)tc_smem_bytes<64>()));
    CU(cudaFuncSetAttribute(k_attention_tc<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)tc_smem_bytes<128>()));
    CU(cudaFuncSetAttribute(k_attention_tc<256>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)tc_smem_bytes<256>()));
    cu_attention_q_init();
}

template <int D> static void launch_tc(cudaStream_t s, const cu_attn_args &a)
{
    const size_t smem = tc_smem_bytes<D>();
    dim3 grid((unsigned)a.n_tiles, (unsigned)a.n_kv_heads);
    k_attention_tc<D><<<grid, 128, smem, s>>>(a);
    CU_LAUNCHED();
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

template <int DPL, int G> static void launch(cudaStream_t s, const cu_attn_args &a)
{
    int group = a.n_heads / a.n_kv_heads;
    int chunks = (group + ATT_HG - 1) / ATT_HG;
    dim3 grid((unsigned)a.n_tokens, (unsigned)(a.n_kv_heads * chunks), (unsigned)a.splits);
    size_t smem = sizeof(float) * ATT_WARPS * ATT_HG * a.head_dim; /* 32 KB at 512 */
    k_attention<DPL, G><<<grid, ATT_WARPS * 32, smem, s>>>(a);
    CU_LAUNCHED();
    if (a.splits > 1) {
        k_attn_merge<<<(unsigned)(a.n_tokens * a.n_heads), 128, 0, s>>>(a.out, a.part, a.splits,
                                                                        a.head_dim);
        CU_LAUNCHED();
    }
}

/* A head size with lanes that hold fewer than DPL dimensions: loads of 8 or 4 where D and
 * DPL allow, else of 2. */
template <int DPL> static void launch_part(cudaStream_t s, const cu_attn_args &a)
{
    constexpr int GW = DPL % 8 == 0 ? 8 : DPL % 4 == 0 ? 4 : 2;
    if (a.head_dim % GW == 0) return launch<DPL, GW>(s, a);
    return launch<DPL, 2>(s, a);
}

static void launch_simt(cudaStream_t s, const cu_attn_args &a)
{
    const int D = a.head_dim;
    if (D % 32 == 0 && D <= 256) {
        switch (D / 32) {
        case 1:
            return launch<1, 0>(s, a);
        case 2:
            return launch<2, 0>(s, a);
        case 3:
            return launch<3, 0>(s, a);
        case 4:
            return launch<4, 0>(s, a);
        case 5:
            return launch<5, 0>(s, a);
        case 6:
            return launch<6, 0>(s, a);
        case 7:
            return launch<7, 0>(s, a);
        default:
            return launch<8, 0>(s, a);
        }
    }
    const int dpl = ((D + 31) / 32 + 1) & ~1;
    switch (dpl) {
    case 2:
        return launch_part<2>(s, a);
    case 4:
        return launch_part<4>(s, a);
    case 6:
        return launch_part<6>(s, a);
    case 8:
        return launch_part<8>(s, a);
    case 10:
        return launch_part<10>(s, a);
    case 12:
        return launch_part<12>(s, a);
    case 14:
        return launch_part<14>(s, a);
    default:
        return launch_part<16>(s, a);
    }
}

bool cu_attn_ok(int head_dim, int n_heads, int n_kv_heads)
{
    return head_dim >= 2 && head_dim <= CU_ATTN_MAX_D && head_dim % 2 == 0 && n_kv_heads >= 1 &&
           n_heads >= n_kv_heads && n_heads <= 65535 && n_heads % n_kv_heads == 0;
}

int cu_attn_check(void *ctx, int head_dim, int n_heads, int n_kv_heads, struct err *e)
{
    (void)ctx;
    if (cu_attn_ok(head_dim, n_heads, n_kv_heads)) return 0;
    return err_set(e,
                   "the CUDA backend runs attention of even head sizes from 2 to %d, with the "
                   "query heads (up to 65535) a multiple of the KV heads",
                   CU_ATTN_MAX_D);
}

void cu_attention(cudaStream_t s, const cu_attn_args &a)
{
    assert(cu_attn_ok(a.head_dim, a.n_heads, a.n_kv_heads));
    if (a.decode == 2) return a.head_dim == 64 ? launch_decw<64>(s, a) : launch_decw<128>(s, a);
    if (a.decode) return a.head_dim == 64 ? launch_dec<64>(s, a) : launch_dec<128>(s, a);
    if (a.n_tiles > 0) {
        if (a.head_dim == 64) return launch_tc<64>(s, a);
        if (a.head_dim == 128) return launch_tc<128>(s, a);
        return launch_tc<256>(s, a);
    }
    launch_simt(s, a);
}
