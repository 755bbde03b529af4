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

#include <cuda_fp8.h>

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

static void reference_q(cudaStream_t s, const cu_attnq_args &a)
{
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

/*
 * The tensor-core kernel: fp8 or tq4 keys and values (the same format for both), head sizes
 * 64 and 128, up to 8 query heads a KV head, blocks of a multiple of 16 tokens. A warp takes
 * one token, one KV head with every query head of its group (the rows of an m16n8k16 MMA),
 * and one range of the token's visible keys, in rounds of 16 keys that lie in one KV block.
 * Each round's codes and scales are copied into the warp's shared memory with cp.async,
 * QD_STAGES - 1 rounds ahead, keys outside the token's view zero-filled (masked later); the
 * lanes read their operands from there into registers and widen them to bf16, so no
 * dequantized copy is made. The per-token scales (fp8) and gains (tq4) multiply the scores
 * and the probabilities instead of the codes.
 *   - S = Q K^T: lane (g, tq) reads key g's (and g + 8's) dimensions tq D/4 .. + D/4, as they
 *     lie in the row; k-step s takes 4 of them (the pairs of b0 and b1), and Q's fragments are
 *     read in the same order.
 *   - O += P V: lane (g, tq) reads dimensions g D/8 .. + D/8 of keys 2 tq, 2 tq + 1, 2 tq + 8,
 *     2 tq + 9 (the keys of its P fragment); n-tile j's column g is dimension g D/8 + j, so
 *     lane (g, tq) ends with row g's dimensions tq D/4 .. + D/4.
 * A row's 16-byte pieces lie XOR-swizzled by the key's index, so that neither read meets a
 * bank twice. fp8 codes widen exactly: e4m3 pairs to f16 (one instruction); S^T takes them
 * so, with the queries as f16 (scaled by a power of two if any is 2^14 or more), and for V
 * the f16 bits shifted are the bf16 of the value times 2^-112, the probabilities carrying the
 * 2^112 (exact). tq4 codes widen through a table of the 256 byte values as bf16 pairs of
 * centroids, one copy per lane (bank = lane): a key byte holds two dimensions (b0 or b1 as it
 * is); for V the byte is built from one code of each of two keys. For tq4 the queries are
 * rotated first and each output row rotated back (the rotation is linear, so before the
 * ranges merge). Queries (f16 for fp8, bf16 for tq4) and probabilities (bf16) round as
 * operands, as in the bf16 decode kernel (about 1e-3 relative); softmax and sums in float32.
 */
#define QD_WARPS  4
#define QD_KR     16 /* keys a round */
#define QD_STAGES 3  /* rounds in shared memory: the one in use and those in flight */

template <int DT, int D> struct qd_fmt {
    static constexpr int bits = DT == KV_DTYPE_FP8 ? 8 : 4;
    static constexpr int row = D * bits / 8; /* bytes of a row */
    static constexpr int nch = row / 16;     /* its 16-byte pieces */
    static constexpr int kw = row / 4 / 4;   /* words of a lane's K chunk (D/4 dimensions) */
    static constexpr int vw = row / 8 / 4;   /* words of a lane's V chunk (D/8 dimensions) */
    /* a stage: K rows, V rows, K scales, V scales */
    static constexpr int stage = 2 * QD_KR * row + 2 * 2 * QD_KR;
    static constexpr int table = DT == KV_DTYPE_TQ4 ? 256 * 32 * 4 : 0;
    static constexpr size_t smem = table + (size_t)QD_WARPS * (QD_STAGES * stage + 4 * D);
};

/* Byte offset of byte b of key `key`'s row in a stage's rows. */
template <int ROW, int NCH> static __device__ __forceinline__ int qd_swz(int key, int b)
{
    return key * ROW + ((((b >> 4) ^ key) & (NCH - 1)) << 4) + (b & 15);
}

/* W words from shared memory at p (aligned to 4 W bytes, W = 1, 2 or 4 a load). */
template <int W> static __device__ __forceinline__ void lds_words(const uint8_t *p, uint32_t *w)
{
    if (W >= 4) {
        const uint4 u = *(const uint4 *)p;
        w[0] = u.x;
        w[1] = u.y;
        w[2] = u.z;
        w[3] = u.w;
    } else if (W == 2) {
        const uint2 u = *(const uint2 *)p;
        w[0] = u.x;
        w[1] = u.y;
    } else {
        w[0] = *(const uint32_t *)p;
    }
}

/* Two e4m3 codes (low byte first) as an f16 pair, exactly. */
static __device__ __forceinline__ uint32_t f8_half2(uint32_t x)
{
    const __half2_raw h =
        __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(x & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | (uint32_t)h.y << 16;
}

/* Two e4m3 codes as a bf16 pair of their values times 2^-112: the f16 bits shifted (e4m3
 * values are f16 normals, so their exponents fit bf16's low ones). */
static __device__ __forceinline__ uint32_t f8_pair(uint32_t x)
{
    const uint32_t u = f8_half2(x);
    return ((u >> 3) & 0x0fff0fffu) | (u & 0x80008000u);
}

/* c += a b, m16n8k16, f16 operands and float32 accumulators. */
static __device__ __forceinline__ void mma_f16(float *c, const uint32_t *a, uint32_t b0,
                                               uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t pack_f16(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&h;
}

/* bf16 pair of centroids for byte value e, lane's copy. */
static __device__ __forceinline__ uint32_t qd_tab(const uint32_t *tab, uint32_t e, int lane)
{
    return tab[e * 32 + lane];
}

/* One token and KV head's keys as a warp copies them. */
struct qd_src {
    const uint8_t *k, *v; /* the KV head's block in block 0 of each cache */
    const int32_t *bt;
    size_t stride;        /* bytes from a block's KV head block to the next block's */
    int k_first, k_end;   /* the token's visible keys */
    int max_blocks, sh;   /* the table's width; log2 of the block size, or -1 */
    int bt_base, bt_lane; /* the table's entries bt_base + lane, one a lane */
};

/* The copies of the round from key kb into stage st (zero for keys outside the view). */
template <int DT, int D>
static __device__ __forceinline__ void qd_issue(const cu_attnq_args &a, qd_src &s, int kb,
                                                uint8_t *st, int lane)
{
    using F = qd_fmt<DT, D>;
    const int B = a.block_size, bi = s.sh >= 0 ? kb >> s.sh : kb / B, off0 = kb - bi * B;
    if ((unsigned)(bi - s.bt_base) >= 32u) { /* the next 32 entries of the table */
        s.bt_base = bi;
        s.bt_lane = bi + lane < s.max_blocks ? s.bt[bi + lane] : 0;
    }
    const size_t blk = (size_t)__shfl_sync(0xffffffffu, s.bt_lane, bi - s.bt_base) * s.stride;
    const uint8_t *kh = s.k + blk, *vh = s.v + blk;
    const size_t rows = header_bytes(DT, KV_ROLE_K, B, D) + (size_t)off0 * F::row; /* K's = V's */
#pragma unroll
    for (int i = lane; i < QD_KR * F::nch; i += 32) {
        const int key = i / F::nch, c = i % F::nch;
        const int kp = kb + key;
        const bool ok = kp >= s.k_first && kp < s.k_end;
        const size_t src = rows + (size_t)key * F::row + 16 * c;
        const int dst = qd_swz<F::row, F::nch>(key, 16 * c);
        cp16(st + dst, kh + src, ok);
        cp16(st + QD_KR * F::row + dst, vh + src, ok);
    }
    if (lane < 4) { /* scales: K keys 0-7, 8-15, then V */
        const uint8_t *h = lane < 2 ? kh : vh;
        const int half = lane & 1;
        const bool ok = kb + 8 * half < s.k_end;
        cp16(st + 2 * QD_KR * F::row + 16 * lane, h + 2 * (size_t)off0 + 16 * half, ok);
    }
}

/* The 8 x 8 matrix of bf16 pairs (lane (g, tq): row g, columns 2 tq and 2 tq + 1) transposed. */
static __device__ __forceinline__ uint32_t transpose8(uint32_t x)
{
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}

/* Bytes b, 4 + b, b + 1, 5 + b of (x, y): byte b of x and of y, then byte b + 1 of each. */
static __device__ __forceinline__ uint32_t pair_bytes(uint32_t x, uint32_t y, int b)
{
    return __byte_perm(x, y, (uint32_t)(b | (4 + b) << 4 | (b + 1) << 8 | (5 + b) << 12));
}

template <int DT, int D>
__global__ void __launch_bounds__(QD_WARPS * 32) k_attention_qd(cu_attnq_args a)
{
    using F = qd_fmt<DT, D>;
    constexpr bool TQ = DT == KV_DTYPE_TQ4;
    constexpr int S = D / 16; /* k-steps of S^T; 16-dimension tiles of O^T */
    extern __shared__ __align__(16) uint8_t qd_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const uint32_t *tab = (const uint32_t *)qd_smem;
    uint8_t *stages = qd_smem + F::table + (size_t)warp * (QD_STAGES * F::stage + 4 * D);
    float *x = (float *)(stages + QD_STAGES * F::stage); /* a row being rotated */
    if (TQ) {
        for (int i = threadIdx.x; i < 256 * 32; i += blockDim.x) {
            const int e = i >> 5;
            ((uint32_t *)qd_smem)[i] = pack_bf16(kvq_cb4[e & 15], kvq_cb4[e >> 4]);
        }
        __syncthreads();
    }
    const int ns = a.splits, item = blockIdx.x * QD_WARPS + warp;
    if (item >= a.n_tokens * a.n_kv_heads * ns) return;
    const int sp = item % ns, kvh = item / ns % a.n_kv_heads, t = item / ns / a.n_kv_heads;
    const int group = a.n_heads / a.n_kv_heads, B = a.block_size;
    const float X = TQ ? 1.0f : 0x1p112f; /* fp8 operands are the values times 2^-112 */

    /* the token's keys in rounds from a multiple of 16; this warp's share of the rounds */
    const int qpos = a.pos[t];
    qd_src src;
    src.k_first = a.window > 0 ? max(0, qpos - a.window + 1) : 0;
    src.k_end = qpos + 1;
    const int a0 = src.k_first & ~(QD_KR - 1), rounds = (src.k_end - a0 + QD_KR - 1) / QD_KR;
    const int per = (rounds + ns - 1) / ns, r_lo = min(rounds, sp * per),
              r_hi = min(rounds, r_lo + per);
    const size_t hb = hb_bytes(DT, KV_ROLE_K, B, D); /* K's = V's for fp8 and tq4 */
    src.bt = a.block_table + (size_t)a.tok_seq[t] * a.max_blocks;
    src.k = (const uint8_t *)a.k + (size_t)kvh * hb;
    src.v = (const uint8_t *)a.v + (size_t)kvh * hb;
    src.stride = (size_t)a.n_kv_heads * hb;
    src.max_blocks = a.max_blocks;
    src.sh = (B & (B - 1)) ? -1 : __ffs(B) - 1;
    src.bt_base = -64;
    src.bt_lane = 0;
#pragma unroll
    for (int i = 0; i < QD_STAGES - 1; i++) {
        if (r_lo + i < r_hi)
            qd_issue<DT, D>(a, src, a0 + (r_lo + i) * QD_KR, stages + i * F::stage, lane);
        asm volatile("cp.async.commit_group;");
    }

    /* The products run transposed: S^T = K Q^T (16 keys by 8 query rows) and O^T = V^T P^T
     * (16 dimensions by 8 rows), so that the group's rows fill the n side of the MMAs. Q^T
     * fragments (b0, b1) of row g: dimensions tq D/4 + 4 s .. + 4 at step s. */
    uint32_t qb[S][2];
    const int64_t row0 = (int64_t)t * a.n_heads + (int64_t)kvh * group;
    if (TQ) {
        for (int rr = 0; rr < group; rr++) {
            const float *qr = a.q + (row0 + rr) * D;
            for (int c = lane; c < D; c += 32) x[c] = qr[c];
            __syncwarp();
            rotate_smem<false>(x, D, lane, 32, false);
            if (g == rr)
#pragma unroll
                for (int s = 0; s < S; s++) {
                    const float *p = x + tq * (D / 4) + 4 * s;
                    qb[s][0] = pack_bf16(p[0], p[1]);
                    qb[s][1] = pack_bf16(p[2], p[3]);
                }
            __syncwarp();
        }
    }
    /* fp8: keys widen to f16 exactly and S^T runs on f16 operands, the queries scaled by
     * 2^-qe so that the largest is below 2^14 (scores times 2^qe after) */
    float qscale = 1.0f;
    if (TQ && g >= group)
#pragma unroll
        for (int s = 0; s < S; s++) qb[s][0] = qb[s][1] = 0u;
    if (!TQ) {
        const bool ok = g < group;
        const float *qr = a.q + (row0 + (ok ? g : 0)) * D + tq * (D / 4);
        float4 qv[S];
        float amax = 0.0f;
#pragma unroll
        for (int s = 0; s < S; s++) {
            qv[s] = ok ? *(const float4 *)(qr + 4 * s) : make_float4(0, 0, 0, 0);
            amax = fmaxf(amax, fmaxf(fmaxf(fabsf(qv[s].x), fabsf(qv[s].y)),
                                     fmaxf(fabsf(qv[s].z), fabsf(qv[s].w))));
        }
        for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        int qe = 0;
        if (amax >= 16384.0f) {
            frexpf(amax, &qe);
            qe -= 14;
        }
        const float down = ldexpf(1.0f, -qe);
        qscale = ldexpf(1.0f, qe);
#pragma unroll
        for (int s = 0; s < S; s++) {
            qb[s][0] = pack_f16(qv[s].x * down, qv[s].y * down);
            qb[s][1] = pack_f16(qv[s].z * down, qv[s].w * down);
        }
    }

    /* O^T tile i: c0 / c1 dimension 2 i of lane g's D/8, rows 2 tq / 2 tq + 1; c2 / c3
     * dimension 2 i + 1. The softmax state of rows 2 tq + e: mx[e], l[e] (this lane's keys) */
    float o[S][4];
#pragma unroll
    for (int i = 0; i < S; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float LOG2E = 1.4426950408889634f, sl2 = a.scale * LOG2E;
    for (int r = r_lo; r < r_hi; r++) {
        const int kb = a0 + r * QD_KR, nr = r + QD_STAGES - 1;
        asm volatile("cp.async.wait_group %0;" ::"n"(QD_STAGES - 2));
        __syncwarp(); /* the round is in; every lane is done with the stage refilled next */
        if (nr < r_hi)
            qd_issue<DT, D>(a, src, a0 + nr * QD_KR, stages + (nr - r_lo) % QD_STAGES * F::stage,
                            lane);
        asm volatile("cp.async.commit_group;");
        const uint8_t *st = stages + (r - r_lo) % QD_STAGES * F::stage;
        const uint8_t *sk = st, *sv = st + QD_KR * F::row, *ss = st + 2 * QD_KR * F::row;

        /* S^T: keys g (a0, a2) and g + 8 (a1, a3), two chains of products */
        uint32_t k0[F::kw], k1[F::kw];
        constexpr int KL = F::kw < 4 ? F::kw : 4;
#pragma unroll
        for (int i = 0; i < F::kw; i += KL) {
            lds_words<KL>(sk + qd_swz<F::row, F::nch>(g, tq * F::kw * 4 + 4 * i), k0 + i);
            lds_words<KL>(sk + qd_swz<F::row, F::nch>(g + 8, tq * F::kw * 4 + 4 * i), k1 + i);
        }
        float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, e2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int s = 0; s < S; s++) {
            uint32_t af[4];
            if (TQ) {
                const uint32_t w0 = k0[s >> 1] >> (16 * (s & 1)), w1 = k1[s >> 1] >> (16 * (s & 1));
                af[0] = qd_tab(tab, w0 & 255u, lane);
                af[1] = qd_tab(tab, w1 & 255u, lane);
                af[2] = qd_tab(tab, (w0 >> 8) & 255u, lane);
                af[3] = qd_tab(tab, (w1 >> 8) & 255u, lane);
                mma_bf16(s & 1 ? e2 : sc, af, qb[s][0], qb[s][1]);
            } else {
                af[0] = f8_half2(k0[s]);
                af[1] = f8_half2(k1[s]);
                af[2] = f8_half2(k0[s] >> 16);
                af[3] = f8_half2(k1[s] >> 16);
                mma_f16(s & 1 ? e2 : sc, af, qb[s][0], qb[s][1]);
            }
        }
        /* scales of keys g and g + 8: K's, then V's */
        const uint16_t *sh16 = (const uint16_t *)ss;
        const float ks[2] = {bf(sh16[g]), bf(sh16[g + 8])};
        const float vs[2] = {bf(sh16[16 + g]), bf(sh16[24 + g])};
        const bool live[2] = {kb + g >= src.k_first && kb + g < src.k_end,
                              kb + g + 8 >= src.k_first && kb + g + 8 < src.k_end};
        /* scales, soft-cap, mask (log2 units); each row's maximum over the lanes of its tq */
        float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = (sc[e] + e2[e]) * (ks[e >> 1] * qscale);
            v = a.softcap > 0 ? a.softcap * tanhf(v * a.scale / a.softcap) * LOG2E : v * sl2;
            if (!live[e >> 1]) v = -INFINITY;
            sc[e] = v;
            tmax[e & 1] = fmaxf(tmax[e & 1], v);
        }
        float corr[2], base[2];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            tmax[e] = fmaxf(tmax[e], __shfl_xor_sync(0xffffffffu, tmax[e], 4));
            tmax[e] = fmaxf(tmax[e], __shfl_xor_sync(0xffffffffu, tmax[e], 8));
            tmax[e] = fmaxf(tmax[e], __shfl_xor_sync(0xffffffffu, tmax[e], 16));
            const float mn = fmaxf(mx[e], tmax[e]);
            base[e] = mn == -INFINITY ? 0.0f : mn;
            corr[e] = ex2(mx[e] - base[e]);
            mx[e] = mn;
        }
        float pv[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = ex2(sc[e] - base[e & 1]);
            l[e & 1] = (e < 2 ? l[e & 1] * corr[e & 1] : l[e & 1]) + p;
            /* a zero-filled scale may be absent: dead keys weigh 0 */
            pv[e] = live[e >> 1] ? p * vs[e >> 1] * X : 0.0f;
        }
        /* O is rescaled only in rounds that raise a maximum (1 exactly otherwise) */
        const bool rescale = __any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f);
        /* P^T fragments: keys 2 tq, 2 tq + 1 (b0) and + 8 (b1) of row g */
        const uint32_t pb0 = transpose8(pack_bf16(pv[0], pv[1]));
        const uint32_t pb1 = transpose8(pack_bf16(pv[2], pv[3]));
        /* O^T += V^T P^T: keys 2 tq + (u & 1) + 8 (u >> 1), lane g's D/8 dimensions */
        uint32_t vr[4][F::vw];
        constexpr int VL = F::vw < 4 ? F::vw : 4;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int key = 2 * tq + (u & 1) + 8 * (u >> 1);
#pragma unroll
            for (int i = 0; i < F::vw; i += VL)
                lds_words<VL>(sv + qd_swz<F::row, F::nch>(key, g * F::vw * 4 + 4 * i), vr[u] + i);
        }
#pragma unroll
        for (int i = 0; i < S; i++) {
            uint32_t af[4];
            if (TQ) {
                const int w = i >> 2, sh = 8 * (i & 3); /* dimensions 2 i, 2 i + 1 */
                const uint32_t c0 = vr[0][w] >> sh, c1 = vr[1][w] >> sh, c2 = vr[2][w] >> sh,
                               c3 = vr[3][w] >> sh;
                af[0] = qd_tab(tab, (c0 & 15u) | (c1 & 15u) << 4, lane);
                af[1] = qd_tab(tab, ((c0 >> 4) & 15u) | (c1 & 0xf0u), lane);
                af[2] = qd_tab(tab, (c2 & 15u) | (c3 & 15u) << 4, lane);
                af[3] = qd_tab(tab, ((c2 >> 4) & 15u) | (c3 & 0xf0u), lane);
            } else {
                const int w = i >> 1, b = 2 * (i & 1);
                const uint32_t lo = pair_bytes(vr[0][w], vr[1][w], b),
                               hi = pair_bytes(vr[2][w], vr[3][w], b);
                af[0] = f8_pair(lo);
                af[1] = f8_pair(lo >> 16);
                af[2] = f8_pair(hi);
                af[3] = f8_pair(hi >> 16);
            }
            if (rescale) {
                o[i][0] *= corr[0];
                o[i][1] *= corr[1];
                o[i][2] *= corr[0];
                o[i][3] *= corr[1];
            }
            mma_bf16(o[i], af, pb0, pb1);
        }
    }
    asm volatile("cp.async.wait_group 0;");
#pragma unroll
    for (int e = 0; e < 2; e++) {
        l[e] += __shfl_xor_sync(0xffffffffu, l[e], 4);
        l[e] += __shfl_xor_sync(0xffffffffu, l[e], 8);
        l[e] += __shfl_xor_sync(0xffffffffu, l[e], 16);
    }

    /* Rows 2 tq + e, dimensions g D/8 .. + D/8. One range: O / l. Several: O unscaled, then M
     * (natural log) and L, to be merged. */
    auto dst_of = [&](int rr) {
        return ns > 1 ? a.part + ((row0 + rr) * ns + sp) * (D + 2) : a.out + (row0 + rr) * D;
    };
    float f[2];
#pragma unroll
    for (int e = 0; e < 2; e++) f[e] = ns > 1 ? 1.0f : (l[e] > 0 ? 1.0f / l[e] : 0.0f);
    if (TQ) {
        for (int rr = 0; rr < group; rr++) {
            if ((rr >> 1) == tq) {
                const bool odd = rr & 1; /* selects, not indices: o stays in registers */
                const float fr = odd ? f[1] : f[0];
#pragma unroll
                for (int i = 0; i < S; i++) {
                    x[g * (D / 8) + 2 * i] = (odd ? o[i][1] : o[i][0]) * fr;
                    x[g * (D / 8) + 2 * i + 1] = (odd ? o[i][3] : o[i][2]) * fr;
                }
            }
            __syncwarp();
            rotate_smem<false>(x, D, lane, 32, true);
            float *dr = dst_of(rr);
            for (int c = lane; c < D; c += 32) dr[c] = x[c];
            __syncwarp();
        }
    } else {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            if (2 * tq + e >= group) continue;
            float *dr = dst_of(2 * tq + e) + g * (D / 8);
#pragma unroll
            for (int i = 0; i < S; i++) /* rows of D + 2 floats: 8-byte stores */
                *(float2 *)(dr + 2 * i) = make_float2(o[i][e] * f[e], o[i][2 + e] * f[e]);
        }
    }
    if (ns > 1 && g == 0)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            if (2 * tq + e >= group) continue;
            float *dr = dst_of(2 * tq + e);
            dr[D] = mx[e] == -INFINITY ? -INFINITY : mx[e] * 0.6931471805599453f;
            dr[D + 1] = l[e];
        }
}

bool cu_attnq_fast_ok(int k_dtype, int v_dtype, int head_dim, int group, int block_size)
{
    return k_dtype == v_dtype && (k_dtype == KV_DTYPE_FP8 || k_dtype == KV_DTYPE_TQ4) &&
           (head_dim == 64 || head_dim == 128) && group >= 1 && group <= 8 && block_size > 0 &&
           block_size % QD_KR == 0;
}

int cu_attnq_splits(int n_tokens, int n_kv_heads, int max_keys, int sms)
{
    /* about 32 warps an SM in all (a few waves of those that fit at once, so that the last
     * wave is short), ranges of 128 keys or more, at most 64 of them (the merge reads every
     * range's row, a block a row) */
    const int items = n_tokens * n_kv_heads, want = 32 * sms;
    if (items >= want) return 1;
    int n = (want + items - 1) / items, most = max_keys / 128;
    if (n > most) n = most;
    if (n > 64) n = 64;
    return n > 1 ? n : 1;
}

template <int DT, int D> static void launch_qd(cudaStream_t s, const cu_attnq_args &a)
{
    const int items = a.n_tokens * a.n_kv_heads * a.splits;
    k_attention_qd<DT, D>
        <<<(items + QD_WARPS - 1) / QD_WARPS, QD_WARPS * 32, qd_fmt<DT, D>::smem, s>>>(a);
    if (a.splits > 1)
        k_attn_merge<<<(unsigned)(a.n_tokens * a.n_heads), D, 0, s>>>(a.out, a.part, a.splits, D);
}

template <int DT, int D> static void allow_smem()
{
    CU(cudaFuncSetAttribute(k_attention_qd<DT, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)qd_fmt<DT, D>::smem));
}

void cu_attention_q_init(void)
{
    allow_smem<KV_DTYPE_FP8, 64>();
    allow_smem<KV_DTYPE_FP8, 128>();
    allow_smem<KV_DTYPE_TQ4, 64>();
    allow_smem<KV_DTYPE_TQ4, 128>();
}

void cu_attention_q(cudaStream_t s, const cu_attnq_args &a)
{
    if (a.n_tokens <= 0) return;
    if (a.splits <= 0) return reference_q(s, a);
    if (a.k_dtype == KV_DTYPE_FP8)
        return a.head_dim == 64 ? launch_qd<KV_DTYPE_FP8, 64>(s, a)
                                : launch_qd<KV_DTYPE_FP8, 128>(s, a);
    return a.head_dim == 64 ? launch_qd<KV_DTYPE_TQ4, 64>(s, a)
                            : launch_qd<KV_DTYPE_TQ4, 128>(s, a);
}
