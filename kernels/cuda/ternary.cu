/*
 * Ternary products (BitNet b1.58's BitLinear; WFMT_TERNARY, model/weights.h) with the CPU's
 * semantics to the bit (kernels/cpu/ternary.c): each x row quantized to int8 by absmax
 * (s = 127 / max(absmax, 1e-5), round half to even, clamped to [-128, 127], NaN to 0), the
 * exact integer dot of the codes (value + 1) with the int8 row less the row's sum, then
 * y = (float)dot / (s * t_div) * t_mul: the same IEEE single-precision operations in the same
 * order as the CPU (explicit _rn intrinsics, so nothing is contracted), hence the same bits.
 *
 * Bytes j..j+3 of a 32-byte block, read as one word, hold columns 32 i + j .. 32 i + j + 3 of
 * the block in bits 2i..2i+1 of each byte: (word >> 2 i) & 0x03030303 is four unsigned codes
 * that one dp4a multiplies with four consecutive int8 activations.
 */
#include "kernels/cuda/cuda.cuh"

#define TQ_THREADS 256
#define TV_WARPS   8  /* rows of W a block of the matrix-vector kernel (a warp each) */
#define TT         64 /* the tiled kernel's tile: TT rows of W by TT rows of x */

static __device__ __forceinline__ float block_max(float v, float *sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float t = 0.0f;
    for (int i = 0; i < nw; i++) t = fmaxf(t, sh[i]);
    return t;
}

/* Row blockIdx.x of x [m, k] into q [m, kp] (zeros past k), its sum and its scale s. */
__global__ void __launch_bounds__(TQ_THREADS)
    k_ternary_quant(const float *__restrict__ x, int64_t k, int64_t kp, int8_t *__restrict__ q,
                    int32_t *__restrict__ qsum, float *__restrict__ qscale)
{
    __shared__ float shf[32];
    __shared__ int shi[32];
    const int64_t row = blockIdx.x;
    const float *xr = x + row * k;
    float mx = 0.0f; /* fmaxf skips NaN, as the CPU's loop does */
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) mx = fmaxf(mx, fabsf(xr[j]));
    mx = block_max(mx, shf);
    const float s = __fdiv_rn(127.0f, mx > 1e-5f ? mx : 1e-5f);
    int8_t *qr = q + row * kp;
    int acc = 0;
    for (int64_t j = threadIdx.x; j < kp; j += blockDim.x) {
        int v = 0;
        if (j < k) {
            const float f = rintf(__fmul_rn(xr[j], s)); /* half to even, as nearbyintf */
            v = f > 127.0f ? 127 : f < -128.0f ? -128 : f != f ? 0 : (int)f;
        }
        qr[j] = (int8_t)v;
        acc += v;
    }
    acc = block_sum(acc, shi);
    if (threadIdx.x == 0) {
        qsum[row] = acc;
        qscale[row] = s;
    }
}

/* The float scaling of one exact dot, in the CPU's order. */
static __device__ __forceinline__ float ternary_out(int dot, int sum, float s, float t_div,
                                                    float t_mul)
{
    return __fmul_rn(__fdiv_rn((float)(dot - sum), __fmul_rn(s, t_div)), t_mul);
}

/* M <= 8 rows of x: a warp a row of W, each lane 16 bytes (64 codes) at a time, the weights
 * read once for all M rows (memory-bound: 2 bits a weight against M int8 activations, which
 * stay in cache). */
template <int M>
__global__ void __launch_bounds__(TV_WARPS * 32)
    k_ternary_gemv(const uint8_t *__restrict__ w, int64_t n, int64_t row_bytes,
                   const int8_t *__restrict__ q, int64_t kp, const int32_t *__restrict__ qsum,
                   const float *__restrict__ qscale, float t_div, float t_mul, float *y,
                   int64_t ldy)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * TV_WARPS + warp;
    if (r >= n) return;
    const uint4 *wr = (const uint4 *)(w + r * row_bytes);
    const int64_t units = row_bytes / 16;
    int acc[M];
#pragma unroll
    for (int t = 0; t < M; t++) acc[t] = 0;
    for (int64_t u = lane; u < units; u += 32) {
        const uint4 c = __ldg(wr + u);
        const int64_t col = (u >> 1) * 128 + (u & 1) * 16; /* of the code in bits 0..1 of c.x */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c0 = (int)((c.x >> 2 * i) & 0x03030303u),
                      c1 = (int)((c.y >> 2 * i) & 0x03030303u),
                      c2 = (int)((c.z >> 2 * i) & 0x03030303u),
                      c3 = (int)((c.w >> 2 * i) & 0x03030303u);
#pragma unroll
            for (int t = 0; t < M; t++) {
                const int4 a = __ldg((const int4 *)(q + t * kp + col + 32 * i));
                acc[t] = __dp4a(c0, a.x, acc[t]);
                acc[t] = __dp4a(c1, a.y, acc[t]);
                acc[t] = __dp4a(c2, a.z, acc[t]);
                acc[t] = __dp4a(c3, a.w, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < M; t++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
        if (lane == t) y[t * ldy + r] = ternary_out(acc[t], qsum[t], qscale[t], t_div, t_mul);
    }
}

/* Any m: a block a TT x TT tile of y, 128 columns at a time through shared memory (the codes
 * expanded to one dp4a operand a word), each thread 4 x 4 outputs. */
__global__ void __launch_bounds__(256)
    k_ternary_gemm(const uint8_t *__restrict__ w, int64_t n, int64_t row_bytes,
                   const int8_t *__restrict__ q, int64_t kp, const int32_t *__restrict__ qsum,
                   const float *__restrict__ qscale, float t_div, float t_mul, float *y, int m,
                   int64_t ldy)
{
    /* word c of a row: columns 4c..4c+3 of the block (a row of 33: no bank conflicts) */
    __shared__ int sq[TT][33], sw[TT][33];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int64_t r0 = (int64_t)blockIdx.x * TT;
    const int i0 = blockIdx.y * TT;
    int acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b] = 0;
    const int64_t blocks = row_bytes / 32;
    for (int64_t bk = 0; bk < blocks; bk++) {
        for (int e = tid; e < TT * 8; e += 256) { /* TT rows of 8 x 16 bytes */
            const int row = e >> 3, u = e & 7;
            int4 v = make_int4(0, 0, 0, 0);
            if (i0 + row < m) v = __ldg((const int4 *)(q + (i0 + row) * kp + bk * 128 + u * 16));
            sq[row][4 * u] = v.x;
            sq[row][4 * u + 1] = v.y;
            sq[row][4 * u + 2] = v.z;
            sq[row][4 * u + 3] = v.w;
        }
        { /* TT rows of 4 x 8 bytes; word j of a block holds columns 32 i + 4 j.. for each i */
            const int row = tid >> 2, part = tid & 3;
            uint2 v = make_uint2(0, 0);
            if (r0 + row < n)
                v = __ldg((const uint2 *)(w + (r0 + row) * row_bytes + bk * 32) + part);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                sw[row][8 * i + 2 * part] = (int)((v.x >> 2 * i) & 0x03030303u);
                sw[row][8 * i + 2 * part + 1] = (int)((v.y >> 2 * i) & 0x03030303u);
            }
        }
        __syncthreads();
#pragma unroll 8
        for (int c = 0; c < 32; c++) {
            int a[4], b[4];
#pragma unroll
            for (int t = 0; t < 4; t++) {
                a[t] = sq[ty + 16 * t][c];
                b[t] = sw[tx + 16 * t][c];
            }
#pragma unroll
            for (int t = 0; t < 4; t++)
#pragma unroll
                for (int r = 0; r < 4; r++) acc[t][r] = __dp4a(b[r], a[t], acc[t][r]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const int i = i0 + ty + 16 * t;
        if (i >= m) continue;
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int64_t o = r0 + tx + 16 * r;
            if (o < n) y[i * ldy + o] = ternary_out(acc[t][r], qsum[i], qscale[i], t_div, t_mul);
        }
    }
}

size_t cu_ternary_scratch(const dweight &w, int m)
{
    return (size_t)m * (size_t)(w.row_bytes * 4) + (size_t)m * (sizeof(int32_t) + sizeof(float));
}

void cu_ternary(cudaStream_t s, const dweight &w, const float *x, int m, float *y, void *scratch,
                float t_div, float t_mul, bool quantize)
{
    if (m <= 0) return;
    const int64_t kp = w.row_bytes * 4;
    int8_t *q = (int8_t *)scratch;
    int32_t *qsum = (int32_t *)(q + (size_t)m * (size_t)kp);
    float *qscale = (float *)(qsum + m);
    if (quantize) {
        k_ternary_quant<<<(unsigned)m, TQ_THREADS, 0, s>>>(x, w.k, kp, q, qsum, qscale);
        CU_LAUNCHED();
    }
    if (m > CU_GEMV_MAX_M) {
        dim3 grid((unsigned)((w.n + TT - 1) / TT), (unsigned)((m + TT - 1) / TT));
        k_ternary_gemm<<<grid, 256, 0, s>>>(w.w, w.n, w.row_bytes, q, kp, qsum, qscale, t_div,
                                            t_mul, y, m, w.n);
        CU_LAUNCHED();
        return;
    }
    const unsigned blocks = (unsigned)((w.n + TV_WARPS - 1) / TV_WARPS);
#define TV(M)                                                                                      \
    k_ternary_gemv<M><<<blocks, TV_WARPS * 32, 0, s>>>(w.w, w.n, w.row_bytes, q, kp, qsum, qscale, \
                                                       t_div, t_mul, y, w.n)
    switch (m) {
    case 1:
        TV(1);
        break;
    case 2:
        TV(2);
        break;
    case 3:
        TV(3);
        break;
    case 4:
        TV(4);
        break;
    case 5:
        TV(5);
        break;
    case 6:
        TV(6);
        break;
    case 7:
        TV(7);
        break;
    default:
        TV(8);
        break;
    }
#undef TV
    CU_LAUNCHED();
}
