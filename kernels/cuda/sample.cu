/*
 * Sampling where the logits are: one block per logit row, the token written to device
 * memory, so a step copies back one id per row instead of the row (513 KB at a vocabulary
 * of 128k).
 *
 * The semantics are backend_ops.sample's: canonical order (larger value first, then lower
 * index), top-k, min-p and top-p cuts, and the token at which the cumulative weight of the
 * kept candidates first exceeds u times their total. No row is sorted: every cut is a radix
 * selection over a 64-bit key that orders candidates canonically (the value's bits made
 * order-preserving, then the complemented index), 8 bits a pass, by count (top-k) or by
 * weight (top-p, the draw). Weights exp((x - max) / T) are summed as 40-bit fixed point in
 * 64-bit integers, so every sum is exact and the result does not depend on the order the
 * threads add in: a row samples the same token alone or in any batch. The host sampler
 * (model/sampler.c) computes the same cuts and draw with the same float arithmetic, so that a
 * row gets the same token on either side: a change here goes there too.
 */
#include <math.h>

extern "C" {
#include "model/backend.h"
}

#include "kernels/cuda/cuda.cuh"

#define SAMPLE_THREADS 1024

/* Order-preserving key: larger value first, then lower index (both compare larger). */
static __device__ __forceinline__ uint64_t canon_key(float v, int i)
{
    uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((uint64_t)b << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
}

/* exp((v - mx) * inv_t) in [0, 1] as a multiple of 2^-40. */
static __device__ __forceinline__ uint64_t fixed_weight(float v, float mx, float inv_t)
{
    return __float2ull_rz(expf((v - mx) * inv_t) * 1099511627776.0f);
}

struct sample_smem {
    unsigned long long hist[256];
    unsigned long long red[SAMPLE_THREADS / 32];
    float fred[SAMPLE_THREADS / 32];
    unsigned long long need;
    int sel;
};

static __device__ unsigned long long block_sum(unsigned long long v, sample_smem &sm)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) sm.red[warp] = v;
    __syncthreads();
    unsigned long long s = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += sm.red[w];
    __syncthreads();
    return s;
}

static __device__ float block_max(float v, sample_smem &sm)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) sm.fred[warp] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) m = fmaxf(m, sm.fred[w]);
    __syncthreads();
    return m;
}

/*
 * The key at which the candidates (finite, key >= kmin, value >= cut) walked in canonical
 * order first bring their count (WEIGHT false) or weight (true) to `need` (>= 1, at most
 * their total).
 */
template <bool WEIGHT>
static __device__ uint64_t select_key(const float *x, int n, uint64_t kmin, float cut, float mx,
                                      float inv_t, unsigned long long need, sample_smem &sm)
{
    uint64_t prefix = 0, pmask = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) sm.hist[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const float v = x[i];
            if (!(v > -INFINITY) || v < cut) continue;
            const uint64_t k = canon_key(v, i);
            if (k < kmin || (k & pmask) != prefix) continue;
            atomicAdd(&sm.hist[(k >> shift) & 255], WEIGHT ? fixed_weight(v, mx, inv_t) : 1ull);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long acc = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (acc + sm.hist[b] >= need) break;
                acc += sm.hist[b];
            }
            sm.need = need - acc;
            sm.sel = b;
        }
        __syncthreads();
        need = sm.need;
        prefix |= (uint64_t)sm.sel << shift;
        pmask |= (uint64_t)255 << shift;
        __syncthreads();
    }
    return prefix;
}

static __device__ unsigned long long kept_weight(const float *x, int n, uint64_t kmin, float cut,
                                                 float mx, float inv_t, sample_smem &sm)
{
    unsigned long long s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = x[i];
        if (!(v > -INFINITY) || v < cut || canon_key(v, i) < kmin) continue;
        s += fixed_weight(v, mx, inv_t);
    }
    return block_sum(s, sm);
}

__global__ void __launch_bounds__(SAMPLE_THREADS)
    k_sample(int32_t *out, const float *__restrict__ logits, int n, const sample_row *rows)
{
    allow_dependents();
    __shared__ sample_smem sm;
    const float *x = logits + (int64_t)blockIdx.x * n;
    const sample_row p = rows[blockIdx.x];

    float m = -INFINITY;
    unsigned long long finite = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = x[i];
        if (v > -INFINITY) {
            m = fmaxf(m, v);
            finite++;
        }
    }
    const float mx = block_max(m, sm);
    finite = block_sum(finite, sm);
    if (p.temperature <= 0.0f || finite == 0) {
        /* the largest value, the lowest index among equals; index 0 when none is finite */
        uint64_t k = 0;
        if (finite) k = select_key<false>(x, n, 0, -INFINITY, mx, 1.0f, 1, sm);
        if (threadIdx.x == 0) out[blockIdx.x] = finite ? (int32_t)(0xffffffffu - (uint32_t)k) : 0;
        return;
    }
    const float inv_t = 1.0f / p.temperature;
    uint64_t kmin = 0;
    float cut = -INFINITY;
    if (p.top_k > 0 && (unsigned long long)p.top_k < finite)
        kmin = select_key<false>(x, n, 0, -INFINITY, mx, inv_t, (unsigned long long)p.top_k, sm);
    if (p.min_p > 0.0f) cut = (float)((double)mx + log((double)p.min_p) / (double)inv_t);
    unsigned long long total = kept_weight(x, n, kmin, cut, mx, inv_t, sm);
    if (p.top_p < 1.0f) {
        unsigned long long need = (unsigned long long)ceil((double)p.top_p * (double)total);
        need = need < 1 ? 1 : need > total ? total : need;
        kmin = select_key<true>(x, n, kmin, cut, mx, inv_t, need, sm);
        total = kept_weight(x, n, kmin, cut, mx, inv_t, sm);
    }
    unsigned long long need = (unsigned long long)floor((double)p.u * (double)total) + 1;
    if (need > total) need = total;
    const uint64_t k = select_key<true>(x, n, kmin, cut, mx, inv_t, need, sm);
    if (threadIdx.x == 0) out[blockIdx.x] = (int32_t)(0xffffffffu - (uint32_t)k);
}

void cu_sample(cudaStream_t s, int32_t *out, const float *x, int rows, int n, const sample_row *p)
{
    if (rows <= 0) return;
    k_sample<<<(unsigned)rows, SAMPLE_THREADS, 0, s>>>(out, x, n, p);
    CU_LAUNCHED();
}
