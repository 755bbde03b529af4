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

#include <cuda_fp8.h>

#include "kernels/cuda/cuda.cuh"
#include "kernels/cuda/gemv_out.cuh"

#define GEMV_WARPS 8

template <int FMT, int BITS, int M, bool PAIR>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    k_gemv(cu_gemv_set g, const float *__restrict__ x, int m, int split)
{
    allow_dependents();
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
            const float up = acc[NA - 1][i];
            g.y[0][(int64_t)i * W.n + r] = act_of(acc[0][i], g.gelu) * up;
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
    allow_dependents();
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

/*
 * m = 1 (one sequence decoding): the x row stays in registers and each block streams whole
 * weight rows. A block has K / 1024 warps; warp w owns columns [1024 w, 1024 (w + 1)) and
 * each lane 32 of them, as whole 16-byte units of the row: unit (32 c + lane) of the
 * warp's slice for c < 32 / V. Every weight load of a warp is 512 contiguous bytes, and x
 * is read once per block instead of once per row. The block loops over rows R at a time
 * (loads of R rows in flight), a row's partial sums meet in shared memory.
 *
 * Packed integers become floats without conversion instructions: a byte q placed under
 * the exponent of 2^23 (byte permute) is the float 2^23 + q, and one subtraction leaves q.
 * An affine group then contributes scale * sum(x q) + bias * sum(x), with sum(x) of the
 * lane's unit computed once.
 */
/* Rows in flight per block iteration: 8 16-byte loads per lane (4 KB per warp). */
template <int NCH, int NA> struct row_r {
    static constexpr int value = 8 / (NCH * NA) < 1 ? 1 : 8 / (NCH * NA);
};

/* 2^23 + byte k of w, as a float, minus 2^23: the byte's integer value. */
static __device__ __forceinline__ float byte_val(uint32_t w, int k)
{
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7650u | (uint32_t)k)) - 8388608.0f;
}

/* Dot of one 16-byte unit with the lane's x values of that unit (no scale applied). */
template <int FMT, int BITS>
static __device__ __forceinline__ float unit_dot(uint4 q, const float *xv)
{
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
    float s0 = 0.0f, s1 = 0.0f;
    if (FMT == DF_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s0 = fmaf(__uint_as_float(w[i] << 16), xv[2 * i], s0);
            s1 = fmaf(__uint_as_float(w[i] & 0xffff0000u), xv[2 * i + 1], s1);
        }
    } else if (FMT == DF_F16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __half22float2(*(const __half2 *)&w[i]);
            s0 = fmaf(f.x, xv[2 * i], s0);
            s1 = fmaf(f.y, xv[2 * i + 1], s1);
        }
    } else if (FMT == DF_MXFP8) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2_raw lo =
                __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] & 0xffff), __NV_E4M3);
            __half2_raw hi =
                __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w[i] >> 16), __NV_E4M3);
            float2 a = __half22float2(*(const __half2 *)&lo),
                   b = __half22float2(*(const __half2 *)&hi);
            s0 = fmaf(a.x, xv[4 * i], s0);
            s1 = fmaf(a.y, xv[4 * i + 1], s1);
            s0 = fmaf(b.x, xv[4 * i + 2], s0);
            s1 = fmaf(b.y, xv[4 * i + 3], s1);
        }
    } else if (BITS == 8) { /* affine 8-bit: 16 bytes */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s0 = fmaf(byte_val(w[i], 0), xv[4 * i], s0);
            s1 = fmaf(byte_val(w[i], 1), xv[4 * i + 1], s1);
            s0 = fmaf(byte_val(w[i], 2), xv[4 * i + 2], s0);
            s1 = fmaf(byte_val(w[i], 3), xv[4 * i + 3], s1);
        }
    } else { /* affine 4-bit: value 2b of a word is the low nibble of byte b */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t lo = w[i] & 0x0f0f0f0fu, hi = (w[i] >> 4) & 0x0f0f0f0fu;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                s0 = fmaf(byte_val(lo, b), xv[8 * i + 2 * b], s0);
                s1 = fmaf(byte_val(hi, b), xv[8 * i + 2 * b + 1], s1);
            }
        }
    }
    return s0 + s1;
}

template <int FMT, int BITS, bool PAIR, bool NORM>
__global__ void __launch_bounds__(512) k_gemv_row(cu_gemv_set g, const float *__restrict__ x)
{
    allow_dependents();
    constexpr int V = unit_traits<FMT, BITS>::vals, NCH = 32 / V, NA = PAIR ? 2 : 1;
    constexpr int ROW_R = row_r<NCH, NA>::value;
    constexpr bool GROUPED = FMT == DF_AFFINE || FMT == DF_MXFP8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    __shared__ float part[2][ROW_R][NA][32];
    __shared__ float nsum[NORM ? 16 : 1];

    float xv[32], xs[NCH];
    bool have_x = false;
    const int64_t rows = g.row_end[g.nw - 1];
    const int gshift = g.w[0].gshift, sdt = g.w[0].sdtype;
    int buf = 0;
    for (int64_t r0 = (int64_t)blockIdx.x * ROW_R; r0 < rows;
         r0 += (int64_t)gridDim.x * ROW_R, buf ^= 1) {
        uint4 q[ROW_R][NA][NCH];
        float sc[ROW_R][NA][NCH], bi[ROW_R][NA][NCH];
        /* Issue every load of the R rows before using any. */
#pragma unroll
        for (int rr = 0; rr < ROW_R; rr++) {
            int64_t r = r0 + rr;
            const bool live = r < rows;
            if (!live) r = rows - 1;
            int wi = 0;
            if (!PAIR)
                while (wi + 1 < g.nw && r >= g.row_end[wi]) wi++;
            const int64_t rl = wi ? r - g.row_end[wi - 1] : r;
#pragma unroll
            for (int a = 0; a < NA; a++) {
                const set_mat M = set_pick(g, PAIR ? a : wi);
                const uint8_t *row = M.w + rl * M.row_bytes;
#pragma unroll
                for (int c = 0; c < NCH; c++) {
                    const int64_t u = (int64_t)warp * 32 * NCH + c * 32 + lane;
                    q[rr][a][c] = __ldg((const uint4 *)row + u);
                    sc[rr][a][c] = 1.0f;
                    bi[rr][a][c] = 0.0f;
                    if (GROUPED) {
                        const int64_t gi = rl * M.gpr + ((u * V) >> gshift);
                        if (FMT == DF_MXFP8) {
                            sc[rr][a][c] = e8m0(((const uint8_t *)M.scales)[gi]);
                        } else {
                            sc[rr][a][c] = load_scale(M.scales, sdt, gi);
                            bi[rr][a][c] = load_scale(M.biases, sdt, gi);
                        }
                    }
                }
            }
        }
        if (!have_x) {
            /* x comes from the previous kernel: with programmatic dependent launch this
             * block may start before that kernel ends, so the first rows' weight loads
             * above overlap its tail, and only here does the block wait for it. */
            grid_dependency_wait();
            /* The lane's x values and, per unit, their sum. */
            const float *xsrc = NORM ? g.nsrc : x;
#pragma unroll
            for (int c = 0; c < NCH; c++) {
                const int64_t u = (int64_t)warp * 32 * NCH + c * 32 + lane;
                const float4 *xp = (const float4 *)(xsrc + u * V);
                float t = 0.0f;
#pragma unroll
                for (int j = 0; j < V / 4; j++) {
                    float4 f = __ldg(xp + j);
                    xv[c * V + 4 * j] = f.x;
                    xv[c * V + 4 * j + 1] = f.y;
                    xv[c * V + 4 * j + 2] = f.z;
                    xv[c * V + 4 * j + 3] = f.w;
                    t += (f.x + f.y) + (f.z + f.w);
                }
                xs[c] = t;
            }
            if (NORM) {
                /* Fused rms_norm (the block's warps cover the whole row): the row's sum of
                 * squares, then x scaled by it and the norm weight; block 0 also stores the
                 * normed row as x. */
                float ss = 0.0f;
#pragma unroll
                for (int i = 0; i < 32; i++) ss = fmaf(xv[i], xv[i], ss);
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
                if (lane == 0) nsum[warp] = ss;
                __syncthreads();
                const float inv = norm_scale(nsum, nwarps, g.w[0].k, g.nepsilon);
#pragma unroll
                for (int c = 0; c < NCH; c++) {
                    const int64_t u = (int64_t)warp * 32 * NCH + c * 32 + lane;
                    float t = 0.0f;
#pragma unroll
                    for (int j = 0; j < V; j++) {
                        const float v = xv[c * V + j] * inv * __ldg(g.nweight + u * V + j);
                        xv[c * V + j] = v;
                        t += v;
                        if (blockIdx.x == 0) ((float *)x)[u * V + j] = v;
                    }
                    xs[c] = t;
                }
            }
            have_x = true;
        }
        float acc[ROW_R][NA];
#pragma unroll
        for (int rr = 0; rr < ROW_R; rr++)
#pragma unroll
            for (int a = 0; a < NA; a++) {
                float t = 0.0f;
#pragma unroll
                for (int c = 0; c < NCH; c++) {
                    float d = unit_dot<FMT, BITS>(q[rr][a][c], xv + c * V);
                    if (FMT == DF_AFFINE)
                        t += fmaf(sc[rr][a][c], d, bi[rr][a][c] * xs[c]);
                    else if (FMT == DF_MXFP8)
                        t = fmaf(sc[rr][a][c], d, t);
                    else
                        t += d;
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
                acc[rr][a] = t;
            }
        if (lane == 0)
#pragma unroll
            for (int rr = 0; rr < ROW_R; rr++)
#pragma unroll
                for (int a = 0; a < NA; a++) part[buf][rr][a][warp] = acc[rr][a];
        __syncthreads();
        if (threadIdx.x < ROW_R) {
            const int rr = threadIdx.x;
            const int64_t r = r0 + rr;
            if (r < rows) {
                float s[NA];
#pragma unroll
                for (int a = 0; a < NA; a++) {
                    s[a] = 0.0f;
                    for (int w = 0; w < nwarps; w++) s[a] += part[buf][rr][a][w];
                }
                if (PAIR) {
                    const float up = s[NA - 1];
                    g.y[0][r] = act_of(s[0], g.gelu) * up;
                    g.y[1][r] = up;
                } else {
                    int wi = 0;
                    while (wi + 1 < g.nw && r >= g.row_end[wi]) wi++;
                    g.y[wi][wi ? r - g.row_end[wi - 1] : r] = s[0];
                    if (g.resid) g.resid[r] += s[0]; /* one matrix: r is its row */
                }
            }
        }
    }
    if (!have_x) grid_dependency_wait(); /* ends after the grid it depends on, in any case */
}

/* Whether k_gemv_row takes this set at m = 1. */
static bool row_kernel_ok(const cu_gemv_set &g)
{
    const dweight &w = g.w[0];
    if (w.k % 1024 || w.k > 16 * 1024) return false;
    switch (w.fmt) {
    case DF_BF16:
    case DF_F16:
        break;
    case DF_MXFP8:
        if (w.group != 32) return false;
        break;
    case DF_AFFINE:
        if (w.bits != 4 && w.bits != 8) return false;
        if (w.gshift < 0 || w.group % (128 / w.bits) || w.sdtype == DS_U8) return false;
        break;
    default:
        return false;
    }
    for (int i = 0; i < g.nw; i++)
        if (g.w[i].row_bytes % 16 || ((uintptr_t)g.w[i].w % 16)) return false;
    return true;
}

template <int FMT, int BITS, bool PAIR, bool NORM>
static void launch_row(cudaStream_t s, const cu_gemv_set &g, const float *x)
{
    static int blocks_per_sm[17], sms;
    const int threads = (int)(g.w[0].k / 1024) * 32;
    int &bps = blocks_per_sm[threads / 32];
    if (!bps) {
        CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, k_gemv_row<FMT, BITS, PAIR, NORM>,
                                                         threads, 0));
        if (bps < 1) bps = 1;
        int dev;
        CU(cudaGetDevice(&dev));
        CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    const int64_t rows = g.row_end[g.nw - 1];
    constexpr int R = row_r < 32 / unit_traits<FMT, BITS>::vals, PAIR ? 2 : 1 > ::value;
    int64_t want = (rows + R - 1) / R, most = (int64_t)bps * sms;
    cu_launch l;
    cu_launch_init(&l, (unsigned)(want < most ? want : most), (unsigned)threads, 0, s, g.early);
    CU(cudaLaunchKernelEx(&l.cfg, k_gemv_row<FMT, BITS, PAIR, NORM>, g, x));
}

static bool launch_row_any(cudaStream_t s, const cu_gemv_set &g, const float *x)
{
    if (!row_kernel_ok(g)) return false;
    const int fmt = g.w[0].fmt, bits = g.w[0].bits;
#define ROWK(F, B)                                                                                 \
    do {                                                                                           \
        if (g.pair)                                                                                \
            g.nsrc ? launch_row<F, B, true, true>(s, g, x)                                         \
                   : launch_row<F, B, true, false>(s, g, x);                                       \
        else                                                                                       \
            g.nsrc ? launch_row<F, B, false, true>(s, g, x)                                        \
                   : launch_row<F, B, false, false>(s, g, x);                                      \
    } while (0)
    if (fmt == DF_BF16)
        ROWK(DF_BF16, 16);
    else if (fmt == DF_F16)
        ROWK(DF_F16, 16);
    else if (fmt == DF_MXFP8)
        ROWK(DF_MXFP8, 8);
    else if (bits == 4)
        ROWK(DF_AFFINE, 4);
    else
        ROWK(DF_AFFINE, 8);
#undef ROWK
    return true;
}

/*
 * m = 1 of 16-bit weights with x in shared memory: each block (one a multiprocessor, 32
 * warps) stages x once (with the norm fused, x times the norm weight, the row's scale
 * applied to each row's sum), and each warp then streams whole rows on its own with no
 * barrier between rows. A warp owns the rows of its
 * block's range at a stride of the block's warps; a lane takes the 16-byte units
 * u = 32 i + lane of a row, STREAM_CH of them a chunk, and the next chunk's loads (the
 * next row's at a row's end) are issued before the current chunk is used, so every warp
 * keeps one to two chunks (2-4 KB) in flight. x is stored so that the two float4 of a
 * lane's unit sit 32 float4 apart: a warp's shared-memory reads are conflict-free. The
 * first weight loads go out before the wait for the previous kernel (programmatic
 * dependent launch). Measured against 512 threads with chunks of 8 and against loads with
 * an L2 sector hint: within 3 %, this one the fastest; weights read past L1 (ld_stream)
 * gave 1.5 % more than through it (docs/BENCHMARKS.md). A task's residual value or rope
 * cosine and sine is loaded ahead of its end (the first task's while x is staged), so that
 * no load from L2 waits between its last sums and its stores (+0.8 % on an H100).
 */
#define STREAM_THREADS 1024
#define STREAM_CH      4

/* Where a warp is in its stream: task t, chunk s of it (with two rows a task, the first
 * row's chunks, then the second's). */
struct stream_pos {
    int64_t t;
    int s;
};

/* The tasks of a set: its rows, half of them with two rows a task from one matrix. */
template <int MODE> static __host__ __device__ int64_t stream_tasks(const cu_gemv_set &g)
{
    return g.row_end[g.nw - 1] / (MODE == SM_ROPE ? 2 : 1);
}

template <int MODE>
static __device__ __forceinline__ void stream_load(const cu_gemv_set &g, uint4 (&q)[STREAM_CH],
                                                   stream_pos p, int nch, int upl, int lane)
{
    const int a = MODE != SM_ROWS && p.s >= nch ? 1 : 0, c = p.s - a * nch;
    int64_t rl;
    const set_mat M = set_pick(g, task_row<MODE>(g, p.t, a, &rl));
    const uint4 *row = (const uint4 *)(M.w + rl * M.row_bytes) + c * STREAM_CH * 32 + lane;
#pragma unroll
    for (int u = 0; u < STREAM_CH; u++)
        q[u] = c * STREAM_CH + u < upl ? ld_stream(row + u * 32) : make_uint4(0, 0, 0, 0);
}

/* The position after p. */
template <int MODE>
static __device__ __forceinline__ stream_pos stream_next(stream_pos p, int nch, int nwarps)
{
    if (++p.s == (MODE == SM_ROWS ? 1 : 2) * nch) {
        p.s = 0;
        p.t += nwarps;
    }
    return p;
}

/* The lane's share of chunk p's dot product with the staged x (q: its units of the chunk),
 * added into the task's sums; at the task's last chunk (the next position n starts
 * another task), the task's outputs. */
template <int FMT, int MODE, bool AMAX>
static __device__ __forceinline__ void
stream_use(const cu_gemv_set &g, const float4 *xs4, const uint4 (&q)[STREAM_CH], stream_pos p,
           stream_pos n, float (&acc)[2], amax &best, stream_ep &ep, int64_t t_end, int nch,
           int upl, float inv, int lane)
{
    constexpr int NA = MODE == SM_ROWS ? 1 : 2;
    const int a = NA == 2 && p.s >= nch ? 1 : 0, c = p.s - a * nch;
    float t = 0.0f;
#pragma unroll
    for (int u = 0; u < STREAM_CH; u++) {
        const int su = c * STREAM_CH + u;
        if (su < upl) {
            const float4 lo = xs4[(2 * su) * 32 + lane], hi = xs4[(2 * su + 1) * 32 + lane];
            const float xv[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            t += unit_dot<FMT, 16>(q[u], xv);
        }
    }
    if (a)
        acc[1] += t;
    else
        acc[0] += t;
    if (n.s == 0) { /* the task's last chunk: its sums, then its outputs */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], o);
            if (NA == 2) acc[1] += __shfl_xor_sync(0xffffffffu, acc[1], o);
        }
        if (lane == 0) {
            const float y0 = acc[0] * inv;
            stream_out_ep<MODE>(g, p.t, y0, acc[1] * inv, ep);
            if (AMAX) amax_take(best, y0, (int)p.t);           /* one matrix: t is its row */
            if (n.t < t_end) stream_ep_load<MODE>(g, n.t, ep); /* the next task's */
        }
        acc[0] = acc[1] = 0.0f;
    }
}

/* One chunk of the current task: uses cur, loads the next position's chunk into nxt and
 * finishes the task at its last chunk. Returns false when the warp's rows are done. */
template <int FMT, int MODE, bool AMAX>
static __device__ __forceinline__ bool
stream_step(const cu_gemv_set &g, const float4 *xs4, uint4 (&cur)[STREAM_CH],
            uint4 (&nxt)[STREAM_CH], stream_pos &p, float (&acc)[2], amax &best, stream_ep &ep,
            int64_t t_end, int nwarps, int nch, int upl, float inv, int lane)
{
    const stream_pos n = stream_next<MODE>(p, nch, nwarps);
    if (n.t < t_end) stream_load<MODE>(g, nxt, n, nch, upl, lane);
    stream_use<FMT, MODE, AMAX>(g, xs4, cur, p, n, acc, best, ep, t_end, nch, upl, inv, lane);
    p = n;
    return n.t < t_end;
}

/* x staged in shared memory for the streaming kernels (xs4: the two float4 of a lane's
 * unit 32 float4 apart); with the norm, x * weight, and the row's scale returned (known
 * only after the block's sum of squares, it multiplies the products' sums instead: one
 * pass over x, not two), the block's share of the normalized row stored as x for any later
 * reader. Every thread of the block takes part; red: a float a warp. */
template <bool NORM>
static __device__ __forceinline__ float stream_stage_x(const cu_gemv_set &g, const float *x,
                                                       float4 *xs4, float *red, int64_t k)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const int nq = (int)(k >> 2);
    const float4 *src = (const float4 *)(NORM ? g.nsrc : x);
    float ss = 0.0f;
    for (int f = threadIdx.x; f < nq; f += blockDim.x) {
        float4 v = __ldg(src + f);
        if (NORM) {
            ss += (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w);
            const float4 w = __ldg((const float4 *)g.nweight + f);
            v.x *= w.x;
            v.y *= w.y;
            v.z *= w.z;
            v.w *= w.w;
        }
        const int u = f >> 1;
        xs4[((u >> 5) * 2 + (f & 1)) * 32 + (u & 31)] = v;
    }
    if (NORM) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) red[warp] = ss;
    }
    __syncthreads();
    if (!NORM) return 1.0f;
    const float inv = norm_scale(red, nwarps, k, g.nepsilon);
    const int f1 = (int)((int64_t)nq * (blockIdx.x + 1) / gridDim.x);
    for (int f = (int)((int64_t)nq * blockIdx.x / gridDim.x) + threadIdx.x; f < f1;
         f += blockDim.x) {
        const int u = f >> 1;
        const float4 v = xs4[((u >> 5) * 2 + (f & 1)) * 32 + (u & 31)];
        ((float4 *)x)[f] = make_float4(v.x * inv, v.y * inv, v.z * inv, v.w * inv);
    }
    return inv;
}

/* The block's greedy pick (lane 0 of each warp holds its warp's) joins the row's over the
 * grid (amax_commit). Every thread of the block takes part. */
static __device__ void stream_amax_commit(const cu_gemv_set &g, amax b)
{
    __shared__ amax sb[STREAM_THREADS / 32];
    const int warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) sb[warp] = b;
    __syncthreads();
    if (threadIdx.x) return;
    for (int w = 1; w < nwarps; w++) amax_take(b, sb[w].v, sb[w].i);
    amax_commit(b, g.amax_slot, g.amax_count, g.amax_out, gridDim.x);
}

template <int FMT, int MODE, bool NORM, bool AMAX>
__global__ void __launch_bounds__(STREAM_THREADS, 1)
    k_gemv_stream(cu_gemv_set g, const float *__restrict__ x)
{
    allow_dependents();
    extern __shared__ float4 xs4[];
    __shared__ float red[STREAM_THREADS / 32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const int64_t k = g.w[0].k, rows = stream_tasks<MODE>(g);
    const int upl = (int)(k >> 8), nch = (upl + STREAM_CH - 1) / STREAM_CH;
    const int64_t t_end = rows * (blockIdx.x + 1) / gridDim.x;
    stream_pos p = {rows * blockIdx.x / gridDim.x + warp, 0};

    uint4 qa[STREAM_CH], qb[STREAM_CH];
    if (p.t < t_end) stream_load<MODE>(g, qa, p, nch, upl, lane);
    /* x comes from the previous kernel: only now wait for it (one chunk a warp loaded before
     * the wait measured best: 238.4 tok/s with none, 242.2 with two, 243.5 with one) */
    grid_dependency_wait();
    /* the first task's residual or rope values, written by earlier kernels: loaded while x
     * is staged */
    stream_ep ep = {0.0f, 0.0f, 0.0f};
    if (lane == 0 && p.t < t_end) stream_ep_load<MODE>(g, p.t, ep);
    const float inv = stream_stage_x<NORM>(g, x, xs4, red, k);
    amax best = {-INFINITY, 0x7fffffff};
    if (p.t < t_end) {
        float acc[2] = {0.0f, 0.0f};
        for (;;) {
            if (!stream_step<FMT, MODE, AMAX>(g, xs4, qa, qb, p, acc, best, ep, t_end, nwarps, nch,
                                              upl, inv, lane))
                break;
            if (!stream_step<FMT, MODE, AMAX>(g, xs4, qb, qa, p, acc, best, ep, t_end, nwarps, nch,
                                              upl, inv, lane))
                break;
        }
    }
    if (AMAX) stream_amax_commit(g, best);
}

bool cu_gemv_stream_ok(const dweight &w)
{
    return (w.fmt == DF_BF16 || w.fmt == DF_F16) && w.k % 256 == 0 && w.k <= 16 * 1024 &&
           w.row_bytes % 16 == 0 && (uintptr_t)w.w % 16 == 0;
}

/* Whether k_gemv_stream takes this set at m = 1. */
static bool stream_ok(const cu_gemv_set &g)
{
    if (g.nsrc && ((uintptr_t)g.nsrc % 16 || (uintptr_t)g.nweight % 16)) return false;
    if (g.rope_half && (g.nw != 3 || g.pair || g.resid)) return false;
    for (int i = 0; i < g.nw; i++)
        if (!cu_gemv_stream_ok(g.w[i])) return false;
    return true;
}

template <int FMT, int MODE, bool NORM, bool AMAX = false>
static void launch_stream(cudaStream_t s, const cu_gemv_set &g, const float *x)
{
    static int bps, sms;
    const size_t smem = sizeof(float) * (size_t)g.w[0].k;
    void (*kern)(cu_gemv_set, const float *) = k_gemv_stream<FMT, MODE, NORM, AMAX>;
    if (!sms) {
        /* room for the largest x (k = 16384) */
        CU(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
        CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, kern, STREAM_THREADS, 64 * 1024));
        if (bps < 1) bps = 1;
        int dev;
        CU(cudaGetDevice(&dev));
        CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    const int64_t want = (stream_tasks<MODE>(g) + 1) / 2, most = (int64_t)bps * sms;
    cu_launch l;
    cu_launch_init(&l, (unsigned)(want < most ? want : most), STREAM_THREADS, smem, s, g.early);
    CU(cudaLaunchKernelEx(&l.cfg, kern, g, x));
}

bool cu_gemv_amax_ok(const cu_gemv_set &g)
{
    return !g.keep_order && g.nw == 1 && !g.pair && !g.rope_half && !g.resid && stream_ok(g) &&
           g.w[0].n < 0x7fffffff;
}

static bool launch_stream_any(cudaStream_t s, const cu_gemv_set &g, const float *x)
{
    if (!stream_ok(g)) return false;
#define STREAMM(F, M)                                                                              \
    do {                                                                                           \
        if (g.nsrc)                                                                                \
            launch_stream<F, M, true>(s, g, x);                                                    \
        else                                                                                       \
            launch_stream<F, M, false>(s, g, x);                                                   \
    } while (0)
#define STREAMK(F)                                                                                 \
    do {                                                                                           \
        if (g.amax_out && g.nsrc)                                                                  \
            launch_stream<F, SM_ROWS, true, true>(s, g, x);                                        \
        else if (g.amax_out)                                                                       \
            launch_stream<F, SM_ROWS, false, true>(s, g, x);                                       \
        else if (g.pair)                                                                           \
            STREAMM(F, SM_PAIR);                                                                   \
        else if (g.rope_half)                                                                      \
            STREAMM(F, SM_ROPE);                                                                   \
        else                                                                                       \
            STREAMM(F, SM_ROWS);                                                                   \
    } while (0)
    if (g.w[0].fmt == DF_BF16)
        STREAMK(DF_BF16);
    else
        STREAMK(DF_F16);
#undef STREAMK
#undef STREAMM
    return true;
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
    if (g.nsrc || g.resid || g.rope_half) {
        /* Fused neighbours: the streaming kernels take them all, the row kernel the norm and
         * the residual add; elsewhere they run around the product. */
        if (m == 1 && !g.keep_order && (launch_stream_any(s, g, x) || cu_gemv_q4_stream(s, g, x)))
            return;
        if (g.rope_half) {
            cu_gemv_set h = g;
            h.rope_half = 0;
            h.rcos = h.rsin = NULL;
            h.kc = h.vc = NULL;
            h.slot = NULL;
            cu_gemv_multi(s, h, x, m);
            const int d = 2 * g.rope_half;
            cu_rope_kv(s, g.y[0], g.y[1], g.y[2], NULL, g.kc, g.vc, g.slot, 1, (int)(g.w[0].n / d),
                       (int)(g.w[1].n / d), d, g.rcos, g.rsin);
            return;
        }
        if (m == 1 && !g.keep_order && !cu_gemv_q4_tc_ok(g) && launch_row_any(s, g, x)) return;
        cu_gemv_set h = g;
        h.nsrc = h.nweight = NULL;
        h.resid = NULL;
        if (g.nsrc) cu_rms_norm(s, (float *)x, g.nsrc, g.nweight, 1, (int)w.k, g.nepsilon, NULL);
        cu_gemv_multi(s, h, x, m);
        if (g.resid) cu_add(s, g.resid, g.y[0], w.n);
        return;
    }
    if (m == 1 && !g.keep_order && cu_gemv_q4_tc_ok(g)) return cu_gemv_q4_tc(s, g, x);
    if (m == 1 && !g.keep_order && (launch_stream_any(s, g, x) || launch_row_any(s, g, x))) return;
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
    g.keep_order = 1;
    cu_gemv_multi(s, g, x, m);
}
