/*
 * Matrix-vector products for small m (decode): bound by reading the weights once, so each
 * warp streams its row's packed values with 16-byte loads, decodes them in registers and
 * dots them with every x row. A row may be split over S warps of the block when the
 * matrix has too few rows to fill the GPU; the S partial sums meet in shared memory.
 *
 * One launch may cover several matrices that read the same x (q, k and v projections):
 * warps pick their matrix by row. In pair mode a warp computes the same row of two
 * matrices (gate and up) and writes act(gate) * up, fusing the activation.
 *
 * The order of the sums of one output does not depend on m: a row's result is the same
 * whether it is computed alone or with others (batch invariance within this kernel).
 */
#include <string.h>

#include "kernels/cuda/cuda.cuh"

#define GEMV_WARPS 8

template <int FMT, int BITS, int M, bool PAIR>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv(cu_gemv_set g, const float *__restrict__ x, int m, int split)
{
    constexpr int V = unit_traits<FMT, BITS>::vals;
    constexpr int NA = PAIR ? 2 : 1;
    __shared__ float part[GEMV_WARPS][NA][M];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rows_per_block = GEMV_WARPS / split;
    int64_t r = (int64_t)blockIdx.x * rows_per_block + warp / split;
    const int sub = warp % split;
    /* Which matrix of the set this warp's row belongs to (uniform within the warp). */
    int wi = 0;
    while (wi + 1 < g.nw && r >= g.row_end[wi]) wi++;
    const bool live = r < g.row_end[g.nw - 1];
    if (wi > 0) r -= g.row_end[wi - 1];
    const dweight &W = g.w[wi];
    const int64_t units = W.k / V;
    float acc[NA][M];
#pragma unroll
    for (int a = 0; a < NA; a++)
#pragma unroll
        for (int i = 0; i < M; i++) acc[a][i] = 0.0f;
    if (live) {
#pragma unroll 4
        for (int64_t u = (int64_t)sub * 32 + lane; u < units; u += 32 * split) {
            float v[NA][V];
            decode_unit<FMT, BITS>(W, r, u, v[0]);
            if (PAIR) decode_unit<FMT, BITS>(g.w[1], r, u, v[NA - 1]);
#pragma unroll
            for (int i = 0; i < M; i++) {
                if (i < m) { /* a predicate, not a break: acc stays in registers */
                    const float4 *xp = (const float4 *)(x + (int64_t)i * W.k + u * V);
                    float s[NA];
#pragma unroll
                    for (int a = 0; a < NA; a++) s[a] = 0.0f;
#pragma unroll
                    for (int j = 0; j < V / 4; j++) {
                        float4 xv = __ldg(xp + j);
#pragma unroll
                        for (int a = 0; a < NA; a++) {
                            s[a] = fmaf(v[a][4 * j], xv.x, s[a]);
                            s[a] = fmaf(v[a][4 * j + 1], xv.y, s[a]);
                            s[a] = fmaf(v[a][4 * j + 2], xv.z, s[a]);
                            s[a] = fmaf(v[a][4 * j + 3], xv.w, s[a]);
                        }
                    }
#pragma unroll
                    for (int a = 0; a < NA; a++) acc[a][i] += s[a];
                }
            }
        }
    }
#pragma unroll
    for (int a = 0; a < NA; a++)
#pragma unroll
        for (int i = 0; i < M; i++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                acc[a][i] += __shfl_xor_sync(0xffffffffu, acc[a][i], o);
    if (split > 1) {
        if (lane == 0)
#pragma unroll
            for (int a = 0; a < NA; a++)
#pragma unroll
                for (int i = 0; i < M; i++) part[warp][a][i] = acc[a][i];
        __syncthreads();
        if (sub != 0) return;
#pragma unroll
        for (int a = 0; a < NA; a++)
#pragma unroll
            for (int i = 0; i < M; i++) {
                float t = 0.0f;
                for (int j = 0; j < split; j++) t += part[warp + j][a][i];
                acc[a][i] = t;
            }
    }
    if (lane != 0 || !live) return;
    for (int i = 0; i < m && i < M; i++) {
        if (PAIR) {
            /* gate and up rows: y0 = act(gate) * up, y1 = up */
            float gt = acc[0][i], up = acc[NA - 1][i], act;
            if (g.gelu) {
                const float kk = 0.7978845608028654f;
                act = 0.5f * gt * (1.0f + tanhf(kk * (gt + 0.044715f * gt * gt * gt)));
            } else {
                act = gt / (1.0f + expf(-gt));
            }
            g.y[0][(int64_t)i * W.n + r] = act * up;
            g.y[1][(int64_t)i * W.n + r] = up;
        } else {
            g.y[wi][(int64_t)i * W.n + r] = acc[0][i];
        }
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

template <int FMT, int BITS, bool PAIR>
static void launch(cudaStream_t s, const cu_gemv_set &g, const float *x, int m)
{
    constexpr int V = unit_traits<FMT, BITS>::vals;
    int64_t units = g.w[0].k / V, rows = g.row_end[g.nw - 1];
    /* Split rows over more warps while that keeps 4 blocks per multiprocessor busy. */
    int split = 1;
    while (split < GEMV_WARPS && (rows * split / GEMV_WARPS) < 132 * 4 && units >= 64 * split)
        split *= 2;
    int rpb = GEMV_WARPS / split;
    dim3 grid((unsigned)((rows + rpb - 1) / rpb));
    if (m == 1)
        k_gemv<FMT, BITS, 1, PAIR><<<grid, GEMV_WARPS * 32, 0, s>>>(g, x, m, split);
    else if (m <= 4)
        k_gemv<FMT, BITS, 4, PAIR><<<grid, GEMV_WARPS * 32, 0, s>>>(g, x, m, split);
    else
        k_gemv<FMT, BITS, 8, PAIR><<<grid, GEMV_WARPS * 32, 0, s>>>(g, x, m, split);
    CU_LAUNCHED();
}

template <int FMT, int BITS>
static void launch2(cudaStream_t s, const cu_gemv_set &g, const float *x, int m)
{
    if (g.pair)
        launch<FMT, BITS, true>(s, g, x, m);
    else
        launch<FMT, BITS, false>(s, g, x, m);
}

bool cu_gemv_set_ok(const cu_gemv_set &g)
{
    for (int i = 0; i < g.nw; i++) {
        const dweight &a = g.w[i], &b = g.w[0];
        if (!cu_gemv_fast(a) || a.fmt != b.fmt || a.bits != b.bits || a.k != b.k) return false;
    }
    return !g.pair || (g.nw == 2 && g.w[0].n == g.w[1].n);
}

void cu_gemv_multi(cudaStream_t s, const cu_gemv_set &g, const float *x, int m)
{
    const dweight &w = g.w[0];
    switch (w.fmt) {
    case DF_F32:
        return launch2<DF_F32, 32>(s, g, x, m);
    case DF_F16:
        return launch2<DF_F16, 16>(s, g, x, m);
    case DF_BF16:
        return launch2<DF_BF16, 16>(s, g, x, m);
    case DF_MXFP4:
        return launch2<DF_MXFP4, 4>(s, g, x, m);
    case DF_NVFP4:
        return launch2<DF_NVFP4, 4>(s, g, x, m);
    case DF_MXFP8:
        return launch2<DF_MXFP8, 8>(s, g, x, m);
    default:
        switch (w.bits) {
        case 2:
            return launch2<DF_AFFINE, 2>(s, g, x, m);
        case 3:
            return launch2<DF_AFFINE, 3>(s, g, x, m);
        case 4:
            return launch2<DF_AFFINE, 4>(s, g, x, m);
        case 5:
            return launch2<DF_AFFINE, 5>(s, g, x, m);
        case 6:
            return launch2<DF_AFFINE, 6>(s, g, x, m);
        default:
            return launch2<DF_AFFINE, 8>(s, g, x, m);
        }
    }
}

void cu_gemv(cudaStream_t s, const dweight &w, const float *x, int m, float *y, int64_t ldy)
{
    if (!cu_gemv_fast(w) || ldy != w.n) {
        dim3 grid((unsigned)((w.n + GEMV_WARPS - 1) / GEMV_WARPS));
        k_gemv_generic<<<grid, GEMV_WARPS * 32, 0, s>>>(w, x, y, m, ldy);
        CU_LAUNCHED();
        return;
    }
    cu_gemv_set g;
    memset(&g, 0, sizeof g);
    g.w[0] = w;
    g.y[0] = y;
    g.row_end[0] = w.n;
    g.nw = 1;
    cu_gemv_multi(s, g, x, m);
}
