/*
 * Matrix-vector products for small m (decode): bound by reading the weights once, so each
 * warp streams its row's packed values with 16-byte loads, decodes them in registers and
 * dots them with every x row. A row may be split over S warps of the block when the
 * matrix has too few rows to fill the GPU; the S partial sums meet in shared memory.
 *
 * The order of the sums of one output does not depend on m: a row's result is the same
 * whether it is computed alone or with others (batch invariance within this kernel).
 */
#include "kernels/cuda/cuda.cuh"

#define GEMV_WARPS 8

template <int FMT, int BITS, int M>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv(dweight W, const float *__restrict__ x, float *__restrict__ y, int m, int64_t ldy,
           int split)
{
    constexpr int V = unit_traits<FMT, BITS>::vals;
    __shared__ float part[GEMV_WARPS][M];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rows_per_block = GEMV_WARPS / split;
    const int64_t r = (int64_t)blockIdx.x * rows_per_block + warp / split;
    const int sub = warp % split;
    const int64_t units = W.k / V;
    float acc[M];
#pragma unroll
    for (int i = 0; i < M; i++) acc[i] = 0.0f;
    if (r < W.n) {
#pragma unroll 4
        for (int64_t u = (int64_t)sub * 32 + lane; u < units; u += 32 * split) {
            float v[V];
            decode_unit<FMT, BITS>(W, r, u, v);
#pragma unroll
            for (int i = 0; i < M; i++) {
                if (i >= m) break;
                const float4 *xp = (const float4 *)(x + (int64_t)i * W.k + u * V);
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < V / 4; j++) {
                    float4 xv = __ldg(xp + j);
                    s = fmaf(v[4 * j], xv.x, s);
                    s = fmaf(v[4 * j + 1], xv.y, s);
                    s = fmaf(v[4 * j + 2], xv.z, s);
                    s = fmaf(v[4 * j + 3], xv.w, s);
                }
                acc[i] += s;
            }
        }
    }
#pragma unroll
    for (int i = 0; i < M; i++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o);
    }
    if (split == 1) {
        if (lane == 0 && r < W.n)
            for (int i = 0; i < m && i < M; i++) y[(int64_t)i * ldy + r] = acc[i];
        return;
    }
    if (lane == 0)
        for (int i = 0; i < M; i++) part[warp][i] = acc[i];
    __syncthreads();
    if (sub == 0 && lane < m && lane < M && r < W.n) {
        float s = 0.0f;
        for (int j = 0; j < split; j++) s += part[warp + j][lane];
        y[(int64_t)lane * ldy + r] = s;
    }
}

/* Any format, any k: one warp per row, one element at a time (rare shapes only). */
__global__ void k_gemv_generic(dweight W, const float *__restrict__ x, float *__restrict__ y, int m,
                               int64_t ldy)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * GEMV_WARPS + warp;
    if (r >= W.n) return;
    float acc[CU_GEMV_MAX_M] = {0};
    for (int64_t c = lane; c < W.k; c += 32) {
        float w = dq_elem(W, r, c);
        for (int i = 0; i < m; i++) acc[i] += w * x[(int64_t)i * W.k + c];
    }
    for (int i = 0; i < m; i++) {
        float s = acc[i];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) y[(int64_t)i * ldy + r] = s;
    }
}

static int unit_vals(const dweight &w)
{
    switch (w.fmt) {
    case DF_F32:
        return 4;
    case DF_F16:
    case DF_BF16:
        return 8;
    case DF_MXFP8:
        return 16;
    case DF_MXFP4:
    case DF_NVFP4:
        return 32;
    default:
        return w.bits == 3 || w.bits == 5 || w.bits == 6 ? 32 : 128 / w.bits;
    }
}

bool cu_gemv_fast(const dweight &w)
{
    if (w.fmt == DF_AFFINE && (w.bits < 2 || w.bits > 8 || w.bits == 7)) return false;
    if (w.group && (w.group < 16 || w.group % 16)) return false;
    int V = unit_vals(w);
    if (w.k % V) return false;
    if ((w.row_bytes % 16) && !(w.fmt == DF_AFFINE && (w.bits == 3 || w.bits == 5 || w.bits == 6)))
        return false;
    if ((w.row_bytes % 4)) return false;
    return true;
}

template <int FMT, int BITS>
static void launch(cudaStream_t s, const dweight &w, const float *x, int m, float *y, int64_t ldy)
{
    constexpr int V = unit_traits<FMT, BITS>::vals;
    int64_t units = w.k / V;
    /* Split rows over more warps while that keeps 4 blocks per multiprocessor busy. */
    int split = 1;
    while (split < GEMV_WARPS && (w.n * split / GEMV_WARPS) < 132 * 4 && units >= 64 * split)
        split *= 2;
    int rows = GEMV_WARPS / split;
    dim3 grid((unsigned)((w.n + rows - 1) / rows));
    if (m == 1)
        k_gemv<FMT, BITS, 1><<<grid, GEMV_WARPS * 32, 0, s>>>(w, x, y, m, ldy, split);
    else if (m <= 4)
        k_gemv<FMT, BITS, 4><<<grid, GEMV_WARPS * 32, 0, s>>>(w, x, y, m, ldy, split);
    else
        k_gemv<FMT, BITS, 8><<<grid, GEMV_WARPS * 32, 0, s>>>(w, x, y, m, ldy, split);
    CU_LAUNCHED();
}

void cu_gemv(cudaStream_t s, const dweight &w, const float *x, int m, float *y, int64_t ldy)
{
    if (!cu_gemv_fast(w)) {
        dim3 grid((unsigned)((w.n + GEMV_WARPS - 1) / GEMV_WARPS));
        k_gemv_generic<<<grid, GEMV_WARPS * 32, 0, s>>>(w, x, y, m, ldy);
        CU_LAUNCHED();
        return;
    }
    switch (w.fmt) {
    case DF_F32:
        return launch<DF_F32, 32>(s, w, x, m, y, ldy);
    case DF_F16:
        return launch<DF_F16, 16>(s, w, x, m, y, ldy);
    case DF_BF16:
        return launch<DF_BF16, 16>(s, w, x, m, y, ldy);
    case DF_MXFP4:
        return launch<DF_MXFP4, 4>(s, w, x, m, y, ldy);
    case DF_NVFP4:
        return launch<DF_NVFP4, 4>(s, w, x, m, y, ldy);
    case DF_MXFP8:
        return launch<DF_MXFP8, 8>(s, w, x, m, y, ldy);
    default:
        switch (w.bits) {
        case 2:
            return launch<DF_AFFINE, 2>(s, w, x, m, y, ldy);
        case 3:
            return launch<DF_AFFINE, 3>(s, w, x, m, y, ldy);
        case 4:
            return launch<DF_AFFINE, 4>(s, w, x, m, y, ldy);
        case 5:
            return launch<DF_AFFINE, 5>(s, w, x, m, y, ldy);
        case 6:
            return launch<DF_AFFINE, 6>(s, w, x, m, y, ldy);
        default:
            return launch<DF_AFFINE, 8>(s, w, x, m, y, ldy);
        }
    }
}
