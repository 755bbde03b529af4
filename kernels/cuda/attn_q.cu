/*
 * KV cache formats on CUDA (paged_kv/kv_quant.h): the writer of the head blocks and an
 * attention kernel that reads their codes in place, for prefill and decode tokens alike.
 *
 * The writer follows kv_store_row: a CUDA block takes one KV head and role (K or V) and one
 * run of the step's tokens that land in the same KV block, and writes them in order (the
 * growing channel scales of int keys depend on it); a thread owns whole code bytes, so the
 * rescaling of earlier codes never races. The attention kernel gives a warp to each token
 * and query head: the lanes split the head's channels, walk the visible keys in order with an
 * online softmax, and decode each key's codes in registers (queries rotated for tq keys, the
 * value sum rotated back for tq values). It is the reference-shaped path: no tensor cores,
 * no key ranges in parallel.
 */
#include <math.h>

extern "C" {
#include "paged_kv/kv_quant.h"
}

#include "kernels/cuda/cuda.cuh"

#define KVQ_THREADS 128

__constant__ float kvq_cb2[4] = {-1.5104176f, -0.4527800f, 0.4527800f, 1.5104176f};
__constant__ float kvq_cb3[8] = {-2.1519457f, -1.3439093f, -0.7560053f, -0.2450942f,
                                 0.2450942f,  0.7560053f,  1.3439093f,  2.1519457f};
__constant__ float kvq_cb4[16] = {-2.7325896f, -2.0690172f, -1.6180464f, -1.2562312f,
                                  -0.9423405f, -0.6567591f, -0.3880483f, -0.1283950f,
                                  0.1283950f,  0.3880483f,  0.6567591f,  0.9423405f,
                                  1.2562312f,  1.6180464f,  2.0690172f,  2.7325896f};

static __device__ __forceinline__ const float *cb_of(int bits)
{
    return bits == 2 ? kvq_cb2 : bits == 3 ? kvq_cb3 : kvq_cb4;
}

static __device__ __forceinline__ int bits_of(int dt)
{
    switch (dt) {
    case KV_DTYPE_F32:
        return 32;
    case KV_DTYPE_BF16:
        return 16;
    case KV_DTYPE_FP8:
    case KV_DTYPE_INT8:
        return 8;
    case KV_DTYPE_INT4:
    case KV_DTYPE_TQ4:
        return 4;
    case KV_DTYPE_TQ3:
        return 3;
    default:
        return 2;
    }
}

static __device__ __forceinline__ bool rotated(int dt)
{
    return dt == KV_DTYPE_TQ4 || dt == KV_DTYPE_TQ3 || dt == KV_DTYPE_TQ2;
}

static __device__ __forceinline__ size_t header_bytes(int dt, int role, int B, int d)
{
    if (dt == KV_DTYPE_F32 || dt == KV_DTYPE_BF16) return 0;
    if ((dt == KV_DTYPE_INT8 || dt == KV_DTYPE_INT4) && role == KV_ROLE_K) return 2 * (size_t)d;
    return 2 * (size_t)B;
}

static __device__ __forceinline__ size_t row_bytes(int dt, int d)
{
    return (size_t)d * bits_of(dt) / 8;
}

static __device__ __forceinline__ size_t hb_bytes(int dt, int role, int B, int d)
{
    return (header_bytes(dt, role, B, d) + (size_t)B * row_bytes(dt, d) + 15) & ~(size_t)15;
}

static __device__ __forceinline__ float bf(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* Round to nearest even (NaN never reaches here). */
static __device__ __forceinline__ uint16_t to_bf(float f)
{
    uint32_t u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The least bf16 at or above s >= 0. */
static __device__ __forceinline__ uint16_t bf_up(float s)
{
    uint32_t u = __float_as_uint(s);
    if (u & 0xffffu) u += 0x10000u;
    return (uint16_t)(u >> 16);
}

static __device__ __forceinline__ float e4m3_val(uint8_t b)
{
    int e = (b >> 3) & 15, m = b & 7;
    float v = e ? ldexpf(1.0f + m * 0.125f, e - 7) : m * 0.001953125f;
    if (e == 15 && m == 7) v = 0;
    return (b & 0x80) ? -v : v;
}

static __device__ __forceinline__ uint8_t to_e4m3(float x)
{
    uint8_t s = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (a >= 448.0f) return s | 0x7e;
    if (a < 0.015625f) return s | (uint8_t)__float2int_rn(a * 512.0f);
    int e;
    float f = frexpf(a, &e);
    int m = __float2int_rn((f * 2.0f - 1.0f) * 8.0f), E = e + 6;
    if (m == 8) {
        m = 0;
        E++;
    }
    return s | (uint8_t)(E << 3) | (uint8_t)m;
}

/* Code c of a row of b-bit tq codes (3 bits: groups of 8 codes in 3 bytes). */
static __device__ __forceinline__ int tq_code(const uint8_t *row, int bits, int c)
{
    if (bits == 4) return (row[c >> 1] >> ((c & 1) * 4)) & 15;
    if (bits == 2) return (row[c >> 2] >> ((c & 3) * 2)) & 3;
    const uint8_t *g = row + (c >> 3) * 3;
    uint32_t w = (uint32_t)g[0] | (uint32_t)g[1] << 8 | (uint32_t)g[2] << 16;
    return (int)(w >> ((c & 7) * 3)) & 7;
}

/* Value c of a row, before the row's and the block's scales. */
static __device__ __forceinline__ float code_val(int dt, const uint8_t *row, int c)
{
    switch (dt) {
    case KV_DTYPE_F32:
        return ((const float *)row)[c];
    case KV_DTYPE_BF16:
        return bf(((const uint16_t *)row)[c]);
    case KV_DTYPE_FP8:
        return e4m3_val(row[c]);
    case KV_DTYPE_INT8:
        return (float)((const int8_t *)row)[c];
    case KV_DTYPE_INT4:
        return (float)(((row[c >> 1] >> ((c & 1) * 4)) & 15) - 8);
    default: {
        int bits = bits_of(dt);
        return cb_of(bits)[tq_code(row, bits, c)];
    }
    }
}

/* Sign of coordinate c of the rotation: splitmix64 of the seed and c / 64 (kv_quant.c). */
static __device__ __forceinline__ bool rot_sign(int c)
{
    uint64_t z = 0x70a90da5eed00001ull + (uint64_t)(c >> 6) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (z >> (c & 63)) & 1;
}

/* x [d] in shared memory <- R x (inverse: R^T x), by the n threads t of a block (sync: a
 * block barrier) or of a warp. Per power-of-two piece: signs, then the normalized
 * Walsh-Hadamard butterflies. */
template <bool BLOCK>
static __device__ void rotate_smem(float *x, int d, int t, int n, bool inverse)
{
    auto sync = [] {
        if (BLOCK)
            __syncthreads();
        else
            __syncwarp();
    };
    for (int start = 0; start < d;) {
        int m = 1;
        while (m * 2 <= d - start) m *= 2;
        float *p = x + start;
        if (!inverse)
            for (int i = t; i < m; i += n)
                if (rot_sign(start + i)) p[i] = -p[i];
        sync();
        for (int h = 1; h < m; h *= 2) {
            for (int k = t; k < m / 2; k += n) {
                int i = (k / h) * 2 * h + k % h;
                float a = p[i], b = p[i + h];
                p[i] = a + b;
                p[i + h] = a - b;
            }
            sync();
        }
        float s = 1.0f / sqrtf((float)m);
        for (int i = t; i < m; i += n) {
            p[i] *= s;
            if (inverse && rot_sign(start + i)) p[i] = -p[i];
        }
        sync();
        start += m;
    }
}

static __device__ float block_reduce(float v, float *red, bool is_max)
{
    for (int o = 16; o; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, w) : v + w;
    }
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    v = red[0];
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) v = is_max ? fmaxf(v, red[i]) : v + red[i];
    return v;
}

/* Round half away from zero of q / 2^k. */
static __device__ __forceinline__ int shift_round(int q, int k)
{
    if (k > 16) return 0;
    int h = 1 << (k - 1);
    return q >= 0 ? (q + h) >> k : -((-q + h) >> k);
}

static __device__ __forceinline__ int clamp_code(float v, int qmax)
{
    int q = __float2int_rn(v);
    return q > qmax ? qmax : q < -qmax ? -qmax : q;
}

static __device__ __forceinline__ int int_get(int dt, const uint8_t *row, int c)
{
    return dt == KV_DTYPE_INT8 ? ((const int8_t *)row)[c]
                               : ((row[c >> 1] >> ((c & 1) * 4)) & 15) - 8;
}

static __device__ __forceinline__ void int_set(int dt, uint8_t *row, int c, int q)
{
    if (dt == KV_DTYPE_INT8) {
        ((int8_t *)row)[c] = (int8_t)q;
        return;
    }
    int sh = (c & 1) * 4;
    row[c >> 1] = (uint8_t)((row[c >> 1] & ~(15 << sh)) | ((q + 8) << sh));
}

/* One token's row x [d] (shared memory) as token off of head block hb; all threads. */
static __device__ void store_row(int dt, int role, uint8_t *hb, int off, int B, int d, float *x,
                                 float fixed, float *red)
{
    const int t = threadIdx.x, n = blockDim.x;
    uint16_t *sc = (uint16_t *)hb;
    uint8_t *data = hb + header_bytes(dt, role, B, d);
    size_t rb = row_bytes(dt, d);
    uint8_t *row = data + (size_t)off * rb;
    if (dt == KV_DTYPE_F32) {
        for (int c = t; c < d; c += n) ((float *)row)[c] = x[c];
        return;
    }
    if (dt == KV_DTYPE_BF16) {
        for (int c = t; c < d; c += n) ((uint16_t *)row)[c] = to_bf(x[c]);
        return;
    }
    if (dt == KV_DTYPE_INT8 || dt == KV_DTYPE_INT4) {
        const int qmax = dt == KV_DTYPE_INT8 ? 127 : 7, per = dt == KV_DTYPE_INT8 ? 1 : 2;
        if (role == KV_ROLE_K) { /* per channel; a thread owns whole bytes */
            for (int u = t; u < d / per; u += n)
                for (int c = u * per; c < u * per + per; c++) {
                    float a = fabsf(x[c]), s = off ? bf(sc[c]) : 0;
                    if (off == 0 || s == 0) {
                        s = bf(bf_up(a / (float)qmax));
                    } else if (a > s * (float)qmax) {
                        int k = 0;
                        while (s * (float)qmax < a) {
                            s *= 2;
                            k++;
                        }
                        for (int tt = 0; tt < off; tt++) {
                            uint8_t *r = data + (size_t)tt * rb;
                            int_set(dt, r, c, shift_round(int_get(dt, r, c), k));
                        }
                    }
                    sc[c] = to_bf(s);
                    int_set(dt, row, c, s > 0 ? clamp_code(x[c] / s, qmax) : 0);
                }
            return;
        }
        float amax = 0;
        for (int c = t; c < d; c += n) amax = fmaxf(amax, fabsf(x[c]));
        amax = block_reduce(amax, red, true);
        uint16_t s16 = bf_up(amax / (float)qmax);
        float s = bf(s16), inv = s > 0 ? 1.0f / s : 0;
        if (t == 0) sc[off] = s16;
        for (int u = t; u < d / per; u += n)
            for (int c = u * per; c < u * per + per; c++)
                int_set(dt, row, c, clamp_code(x[c] * inv, qmax));
        return;
    }
    if (dt == KV_DTYPE_FP8) {
        float amax = 0;
        for (int c = t; c < d; c += n) amax = fmaxf(amax, fabsf(x[c]));
        amax = block_reduce(amax, red, true);
        uint16_t s16 = fixed > 0 ? to_bf(fixed) : bf_up(amax / 448.0f);
        float s = bf(s16), inv = s > 0 ? 1.0f / s : 0;
        if (t == 0) sc[off] = s16;
        for (int c = t; c < d; c += n) row[c] = to_e4m3(x[c] * inv);
        return;
    }
    /* rotated: norm, rotation, nearest centroids, gain */
    const int bits = bits_of(dt), nc = 1 << bits;
    const float *cb = cb_of(bits);
    float n2 = 0;
    for (int c = t; c < d; c += n) n2 += x[c] * x[c];
    float norm = sqrtf(block_reduce(n2, red, false));
    rotate_smem<true>(x, d, t, n, false);
    float f = norm > 0 ? sqrtf((float)d) / norm : 0, q2 = 0;
    const int per = bits == 3 ? 8 : 8 / bits; /* codes per owned unit (3 bytes for tq3) */
    for (int u = t; u < d / per; u += n) {
        uint32_t w = 0;
        for (int i = 0; i < per; i++) {
            float v = x[u * per + i] * f;
            int q = 0;
            while (q < nc - 1 && v > 0.5f * (cb[q] + cb[q + 1])) q++;
            q2 += cb[q] * cb[q];
            w |= (uint32_t)q << (i * bits);
        }
        if (bits == 3) {
            row[u * 3] = (uint8_t)w;
            row[u * 3 + 1] = (uint8_t)(w >> 8);
            row[u * 3 + 2] = (uint8_t)(w >> 16);
        } else {
            row[u] = (uint8_t)w;
        }
    }
    q2 = block_reduce(q2, red, false);
    if (t == 0) sc[off] = to_bf(norm > 0 ? norm / sqrtf(q2) : 0);
}

/* grid (n_tokens, n_kv_heads, 2): a block whose token starts a run of tokens in one KV block
 * writes the run's rows of one head and role, in order. */
__global__ void __launch_bounds__(KVQ_THREADS) k_kv_store_q(cu_kvq_args a)
{
    extern __shared__ float kvq_smem[];
    float *x = kvq_smem, *red = kvq_smem + a.head_dim;
    const int t0 = blockIdx.x, h = blockIdx.y, role = blockIdx.z, B = a.block_size, d = a.head_dim;
    const int blk = a.slot[t0] / B;
    if (t0 > 0 && a.slot[t0 - 1] / B == blk) return; /* inside another block's run */
    const int dt = role ? a.v_dtype : a.k_dtype;
    const float *src = role ? a.v : a.k;
    uint8_t *base = (uint8_t *)(role ? a.vc : a.kc);
    uint8_t *hb = base + ((size_t)blk * a.n_kv_heads + h) * hb_bytes(dt, role, B, d);
    for (int t = t0; t < a.n_tokens && a.slot[t] / B == blk; t++) {
        const float *xr = src + ((size_t)t * a.n_kv_heads + h) * d;
        for (int c = threadIdx.x; c < d; c += blockDim.x) x[c] = xr[c];
        __syncthreads();
        store_row(dt, role, hb, a.slot[t] % B, B, d, x, role ? a.v_scale : a.k_scale, red);
        __syncthreads();
    }
}

void cu_kv_store_q(cudaStream_t s, const cu_kvq_args &a)
{
    if (a.n_tokens <= 0) return;
    dim3 grid(a.n_tokens, a.n_kv_heads, 2);
    size_t smem = sizeof(float) * ((size_t)a.head_dim + 32);
    k_kv_store_q<<<grid, KVQ_THREADS, smem, s>>>(a);
}

/* Channels a lane owns: [lane * CPL, lane * CPL + CPL) of a head of at most 32 * CPL. */
template <int CPL> __global__ void __launch_bounds__(32) k_attention_q(cu_attnq_args a)
{
    extern __shared__ float aq_smem[];
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int d = a.head_dim, B = a.block_size, H = a.n_kv_heads, kvh = h / (a.n_heads / H);
    const int kd = a.k_dtype, vd = a.v_dtype, c0 = lane * CPL;
    const size_t hbk = hb_bytes(kd, KV_ROLE_K, B, d), hbv = hb_bytes(vd, KV_ROLE_V, B, d);
    const size_t hk = header_bytes(kd, KV_ROLE_K, B, d), hv = header_bytes(vd, KV_ROLE_V, B, d);
    const size_t rk = row_bytes(kd, d), rv = row_bytes(vd, d);
    const bool k_int = kd == KV_DTYPE_INT8 || kd == KV_DTYPE_INT4;
    const bool k_row = kd != KV_DTYPE_F32 && kd != KV_DTYPE_BF16 && !k_int;
    const bool v_row = vd != KV_DTYPE_F32 && vd != KV_DTYPE_BF16;
    const float *qg = a.q + ((size_t)t * a.n_heads + h) * d;
    float q[CPL], acc[CPL];
    if (rotated(kd)) {
        for (int c = lane; c < d; c += 32) aq_smem[c] = qg[c];
        __syncwarp();
        rotate_smem<false>(aq_smem, d, lane, 32, false);
        for (int i = 0; i < CPL; i++) q[i] = c0 + i < d ? aq_smem[c0 + i] : 0;
        __syncwarp();
    } else {
        for (int i = 0; i < CPL; i++) q[i] = c0 + i < d ? qg[c0 + i] : 0;
    }
    for (int i = 0; i < CPL; i++) acc[i] = 0;
    const int s = a.tok_seq[t], qpos = a.pos[t];
    int first = 0;
    if (a.window > 0 && qpos - a.window + 1 > 0) first = qpos - a.window + 1;
    const int32_t *bt = a.block_table + (size_t)s * a.max_blocks;
    const uint8_t *kb = (const uint8_t *)a.k, *vb = (const uint8_t *)a.v;
    float m = -INFINITY, l = 0;
    for (int kp = first; kp <= qpos; kp++) {
        const int blk = bt[kp / B], off = kp % B;
        const uint8_t *hbk_p = kb + ((size_t)blk * H + kvh) * hbk;
        const uint8_t *krow = hbk_p + hk + (size_t)off * rk;
        float part = 0;
        for (int i = 0; i < CPL; i++) {
            int c = c0 + i;
            if (c >= d) break;
            float kv = code_val(kd, krow, c);
            if (k_int) kv *= bf(((const uint16_t *)hbk_p)[c]);
            part += q[i] * kv;
        }
        for (int o = 16; o; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
        if (k_row) part *= bf(((const uint16_t *)hbk_p)[off]);
        float sc = part * a.scale;
        if (a.softcap > 0) sc = a.softcap * tanhf(sc / a.softcap);
        float mn = fmaxf(m, sc), corr = expf(m - mn), p = expf(sc - mn);
        l = l * corr + p;
        m = mn;
        const uint8_t *hbv_p = vb + ((size_t)blk * H + kvh) * hbv;
        const uint8_t *vrow = hbv_p + hv + (size_t)off * rv;
        float w = p * (v_row ? bf(((const uint16_t *)hbv_p)[off]) : 1.0f);
        for (int i = 0; i < CPL; i++) {
            int c = c0 + i;
            acc[i] = acc[i] * corr + (c < d ? w * code_val(vd, vrow, c) : 0);
        }
    }
    float inv = l > 0 ? 1.0f / l : 0;
    float *o = a.out + ((size_t)t * a.n_heads + h) * d;
    if (rotated(vd)) {
        for (int i = 0; i < CPL; i++)
            if (c0 + i < d) aq_smem[c0 + i] = acc[i] * inv;
        __syncwarp();
        rotate_smem<false>(aq_smem, d, lane, 32, true);
        for (int c = lane; c < d; c += 32) o[c] = aq_smem[c];
    } else {
        for (int i = 0; i < CPL; i++)
            if (c0 + i < d) o[c0 + i] = acc[i] * inv;
    }
}

template <int CPL> static void launch_q(cudaStream_t s, const cu_attnq_args &a)
{
    dim3 grid(a.n_tokens, a.n_heads);
    k_attention_q<CPL><<<grid, 32, sizeof(float) * (size_t)a.head_dim, s>>>(a);
}

void cu_attention_q(cudaStream_t s, const cu_attnq_args &a)
{
    if (a.n_tokens <= 0) return;
    int cpl = (a.head_dim + 31) / 32;
    if (cpl <= 1)
        launch_q<1>(s, a);
    else if (cpl <= 2)
        launch_q<2>(s, a);
    else if (cpl <= 4)
        launch_q<4>(s, a);
    else if (cpl <= 8)
        launch_q<8>(s, a);
    else
        launch_q<16>(s, a);
}
