/*
 * One-sequence matrix-vector products (m = 1) of MLX affine 4-bit weights on tensor cores.
 *
 * The 4-bit kernel on CUDA cores spends about 8 instructions per weight and is bound by
 * instruction issue. Here the nibbles become fp16 integers with two logic operations per
 * pair (0x6400 is 1024 in fp16: OR-ing a nibble into its low mantissa bits gives 1024 + q,
 * or 1024 + 16 q for the nibble above it) and an fp16 subtraction or multiply-add, and the
 * products and sums run as mma.sync m16n8k16 with float32 accumulators.
 *
 * A tile is 16 rows; the W warps of a block split k. In each step a warp takes 128 columns: lane
 * (g, t) holds the 16-byte unit t (32 columns) of rows g and g + 8. The MMA's k index runs
 * over the four lanes' units, so the units' products have to stay apart for their scales:
 * the x operand has column n nonzero only for the k indices of unit n (lane (g, t) supplies
 * x only where g == t), and column n of the result is then unit n's sum. Lanes t = 0, 1 hold
 * the results of units 2t and 2t + 1 of rows g and g + 8 and apply each unit's group scale
 * and bias (bias times the unit's sum of x, in float32) to their own accumulators.
 *
 * Blocks are persistent: as many as fit on the GPU at once, each taking row tiles in turn,
 * so x is staged once per block rather than once per 16 rows (for a 4096-column x that
 * staging reads as many bytes as the tile's weights). A warp issues the loads of 4 steps
 * (2 for gate and up) before using any, and the first tile's loads go out before the block
 * waits for the kernel that writes x.
 *
 * x is staged in shared memory as fp16 pairs in the order the MMA takes
 * them, after scaling by a power of two that puts its largest value near 2^14 (fp16's range
 * and precision without overflow), and the unit sums of x in float32. The weights are
 * exact in fp16; x rounds to fp16, so results differ from the float32 kernels by about
 * 3e-4 relative.
 */
#include "kernels/cuda/cuda.cuh"

#define TCV_ROWS 16

static __device__ __forceinline__ void mma_f16(float *c, uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ uint32_t h2_bits(__half2 h)
{
    return *(uint32_t *)&h;
}

static __device__ __forceinline__ __half2 bits_h2(uint32_t u)
{
    return *(__half2 *)&u;
}

/* The 8 nibbles of w as four fp16 pairs: (q0, q4), (q1, q5), (q2, q6), (q3, q7). */
static __device__ __forceinline__ void nibbles(uint32_t w, uint32_t *p)
{
    const __half2 k1024 = __floats2half2_rn(1024.0f, 1024.0f);
    const __half2 k16th = __floats2half2_rn(0.0625f, 0.0625f),
                  km64 = __floats2half2_rn(-64.0f, -64.0f);
    const uint32_t t = w >> 8;
    p[0] = h2_bits(__hsub2(bits_h2((w & 0x000f000fu) | 0x64006400u), k1024));
    p[1] = h2_bits(__hfma2(bits_h2((w & 0x00f000f0u) | 0x64006400u), k16th, km64));
    p[2] = h2_bits(__hsub2(bits_h2((t & 0x000f000fu) | 0x64006400u), k1024));
    p[3] = h2_bits(__hfma2(bits_h2((t & 0x00f000f0u) | 0x64006400u), k16th, km64));
}

/* Matrix index and local row of the block's row tile (tiles never straddle matrices). */
static __device__ __forceinline__ int tile_matrix(const cu_gemv_set &g, int64_t r0, int64_t *rl)
{
    int wi = 0;
    while (wi + 1 < g.nw && r0 >= g.row_end[wi]) wi++;
    *rl = wi ? r0 - g.row_end[wi - 1] : r0;
    return wi;
}

template <bool PAIR, bool G64>
__global__ void __launch_bounds__(256) k_gemv_q4_tc(cu_gemv_set g, const float *__restrict__ x)
{
    allow_dependents();
    /* CH: steps of 128 columns whose loads a warp issues before using any (8 16-byte loads
     * a lane) */
    constexpr int NA = PAIR ? 2 : 1, CH = PAIR ? 2 : 4;
    extern __shared__ __align__(16) unsigned char tcv_raw[];
    const int K = (int)g.w[0].k, W = blockDim.x >> 5;
    uint4 *xs = (uint4 *)tcv_raw;           /* [K / 8]: (x0,x4) (x1,x5) (x2,x6) (x3,x7) */
    float *xsum = (float *)(xs + K / 8);    /* [K / 32] */
    uint4 *zero = (uint4 *)(xsum + K / 32); /* [4] */
    float *part = (float *)(zero + 4);      /* [2][W][NA][16] */
    __shared__ float red[8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t = lane & 3;
    const int64_t tiles = g.row_end[g.nw - 1] / TCV_ROWS;
    const int cols = K / W, c_begin = warp * cols, steps = cols / 128;
    const int gshift = g.w[0].gshift, sdt = g.w[0].sdtype;
    const bool scaler = t < 2; /* lanes that hold units' results */
    float up = 1.0f, down = 1.0f;
    bool staged = false;
    int buf = 0;

    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, buf ^= 1) {
        const int64_t r0 = tile * TCV_ROWS;
        int64_t rl = r0;
        const int wi = PAIR ? 0 : tile_matrix(g, r0, &rl);
        float accq[NA][2], accb[NA][2];
#pragma unroll
        for (int a = 0; a < NA; a++) accq[a][0] = accq[a][1] = accb[a][0] = accb[a][1] = 0.0f;

        for (int s0 = 0; s0 < steps; s0 += CH) {
            /* Issue the loads of CH steps (weights of rows g and g + 8, and the scales and
             * biases of the lanes that apply them) before using any. */
            uint4 qa[CH][NA], qb[CH][NA];
            float sc[CH][NA][4], bi[CH][NA][4];
#pragma unroll
            for (int a = 0; a < NA; a++) {
                const set_mat M = set_pick(g, PAIR ? a : wi);
                const uint8_t *row_g = M.w + (rl + g8) * M.row_bytes,
                              *row_g8 = row_g + 8 * M.row_bytes;
                const int64_t gi_g = (rl + g8) * M.gpr, gi_g8 = gi_g + 8 * M.gpr;
#pragma unroll
                for (int c = 0; c < CH; c++) {
                    const int s = s0 + c < steps ? s0 + c : steps - 1; /* repeats are unused */
                    const int64_t ub = ((c_begin + 128 * s) >> 5) + t; /* this lane's unit */
                    qa[c][a] = __ldg((const uint4 *)row_g + ub);
                    qb[c][a] = __ldg((const uint4 *)row_g8 + ub);
#pragma unroll
                    for (int j = 0; j < 4; j++) sc[c][a][j] = bi[c][a][j] = 0.0f;
                    if (scaler) {
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            if (G64 && j == 1) { /* units 2t and 2t + 1 share a group */
                                sc[c][a][1] = sc[c][a][0];
                                bi[c][a][1] = bi[c][a][0];
                                sc[c][a][3] = sc[c][a][2];
                                bi[c][a][3] = bi[c][a][2];
                                continue;
                            }
                            const int64_t u = ((c_begin + 128 * s) >> 5) + 2 * t + j,
                                          gc = (u * 32) >> gshift;
                            sc[c][a][j] = load_scale(M.scales, sdt, gi_g + gc);
                            bi[c][a][j] = load_scale(M.biases, sdt, gi_g + gc);
                            sc[c][a][2 + j] = load_scale(M.scales, sdt, gi_g8 + gc);
                            bi[c][a][2 + j] = load_scale(M.biases, sdt, gi_g8 + gc);
                        }
                    }
                }
            }
            if (!staged) {
                /* x comes from the previous kernel: the first weight loads above overlap its
                 * end (programmatic dependent launch), and only here does the block wait
                 * for it. Staging: the largest magnitude, then fp16 pairs scaled by a power
                 * of two, and the float32 sum of each 32-column unit. */
                grid_dependency_wait();
                float mx = 0.0f;
                for (int u = threadIdx.x; u < K / 32; u += blockDim.x) {
                    const float4 *p = (const float4 *)(x + 32 * u);
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        float4 f = __ldg(p + j);
                        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)),
                                             fmaxf(fabsf(f.z), fabsf(f.w))));
                    }
                }
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                if (lane == 0) red[warp] = mx;
                if (threadIdx.x < 4) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
                __syncthreads();
                mx = 0.0f;
                for (int i = 0; i < W; i++) mx = fmaxf(mx, red[i]);
                int ex = 0;
                frexpf(mx, &ex);
                up = mx > 0.0f ? ldexpf(1.0f, min(14 - ex, 100)) : 1.0f;
                down = 1.0f / up;
                for (int u = threadIdx.x; u < K / 32; u += blockDim.x) {
                    const float4 *p = (const float4 *)(x + 32 * u);
                    float sum = 0.0f;
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const float4 a = __ldg(p + 2 * j), b = __ldg(p + 2 * j + 1);
                        sum += (a.x + a.y) + (a.z + a.w) + (b.x + b.y) + (b.z + b.w);
                        xs[4 * u + j] = make_uint4(h2_bits(__floats2half2_rn(a.x * up, b.x * up)),
                                                   h2_bits(__floats2half2_rn(a.y * up, b.y * up)),
                                                   h2_bits(__floats2half2_rn(a.z * up, b.z * up)),
                                                   h2_bits(__floats2half2_rn(a.w * up, b.w * up)));
                    }
                    xsum[u] = sum;
                }
                __syncthreads();
                staged = true;
            }
#pragma unroll
            for (int c = 0; c < CH; c++) {
                if (s0 + c >= steps) break;
                const int64_t ub = ((c_begin + 128 * (s0 + c)) >> 5) + t;
                /* x pairs of this lane's unit where it supplies them (g == t), else zeros */
                const uint4 *xp = g8 == t ? xs + 4 * ub : zero;
                float xu[2] = {0.0f, 0.0f};
                if (scaler) {
                    const int64_t u = ((c_begin + 128 * (s0 + c)) >> 5) + 2 * t;
                    xu[0] = xsum[u];
                    xu[1] = xsum[u + 1];
                }
#pragma unroll
                for (int a = 0; a < NA; a++) {
                    const uint32_t wa[4] = {qa[c][a].x, qa[c][a].y, qa[c][a].z, qa[c][a].w},
                                   wb[4] = {qb[c][a].x, qb[c][a].y, qb[c][a].z, qb[c][a].w};
                    float d[4] = {0, 0, 0, 0};
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        uint32_t pa[4], pb[4];
                        nibbles(wa[k], pa);
                        nibbles(wb[k], pb);
                        const uint4 xv = xp[k];
                        /* k (2t, 2t+1, 2t+8, 2t+9) <- columns (0, 4, 1, 5), then (2, 6, 3, 7) */
                        mma_f16(d, pa[0], pb[0], pa[1], pb[1], xv.x, xv.y);
                        mma_f16(d, pa[2], pb[2], pa[3], pb[3], xv.z, xv.w);
                    }
                    if (scaler) {
                        const float *S = sc[c][a], *B = bi[c][a];
                        accq[a][0] = fmaf(S[0], d[0], fmaf(S[1], d[1], accq[a][0]));
                        accq[a][1] = fmaf(S[2], d[2], fmaf(S[3], d[3], accq[a][1]));
                        accb[a][0] = fmaf(B[0], xu[0], fmaf(B[1], xu[1], accb[a][0]));
                        accb[a][1] = fmaf(B[2], xu[0], fmaf(B[3], xu[1], accb[a][1]));
                    }
                }
            }
        }

        /* rows g and g + 8: units of lanes t = 0, 1, then the warps (double-buffered
         * partials: one barrier a tile) */
        float *pb = part + buf * W * NA * 16;
#pragma unroll
        for (int a = 0; a < NA; a++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float v = fmaf(accq[a][h], down, accb[a][h]);
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                if (t == 0) pb[(warp * NA + a) * 16 + g8 + 8 * h] = v;
            }
        __syncthreads();
        if (threadIdx.x < TCV_ROWS) {
            const int r = threadIdx.x;
            float sum[NA];
#pragma unroll
            for (int a = 0; a < NA; a++) {
                sum[a] = 0.0f;
                for (int w = 0; w < W; w++) sum[a] += pb[(w * NA + a) * 16 + r];
            }
            if (PAIR) {
                const float upv = sum[NA - 1];
                g.y[0][r0 + r] = act_of(sum[0], g.gelu) * upv;
                g.y[1][r0 + r] = upv;
            } else {
                g.y[wi][rl + r] = sum[0];
            }
        }
    }
    if (!staged) grid_dependency_wait(); /* ends after the grid it depends on, in any case */
}

bool cu_gemv_q4_tc_ok(const cu_gemv_set &g)
{
    const dweight &w = g.w[0];
    if (w.fmt != DF_AFFINE || w.bits != 4 || w.k % 128 || w.k > 16384 || w.gshift < 5) return false;
    if (w.sdtype == DS_U8) return false;
    for (int i = 0; i < g.nw; i++)
        if (g.w[i].n % TCV_ROWS || g.w[i].row_bytes % 16 || (uintptr_t)g.w[i].w % 16 ||
            g.w[i].gshift != w.gshift || g.w[i].sdtype != w.sdtype)
            return false;
    return true;
}

template <bool PAIR, bool G64>
static void launch_q4_tc(cudaStream_t s, const cu_gemv_set &g, const float *x, int W, size_t smem)
{
    /* Persistent blocks: as many as fit at once, each taking tiles blockIdx.x + i * grid,
     * spread so that every block has the same number of tiles (x is staged once a block). */
    static int bps[17][2], sms;
    int &b = bps[W][g.w[0].k > 8192];
    if (!b) {
        CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k_gemv_q4_tc<PAIR, G64>, W * 32,
                                                         smem));
        if (b < 1) b = 1;
        int dev;
        CU(cudaGetDevice(&dev));
        CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    }
    const int64_t tiles = g.row_end[g.nw - 1] / TCV_ROWS, most = (int64_t)b * sms;
    const int64_t rounds = (tiles + most - 1) / most, blocks = (tiles + rounds - 1) / rounds;
    cu_launch l;
    cu_launch_init(&l, (unsigned)blocks, (unsigned)(W * 32), smem, s, g.early);
    CU(cudaLaunchKernelEx(&l.cfg, k_gemv_q4_tc<PAIR, G64>, g, x));
}

void cu_gemv_q4_tc(cudaStream_t s, const cu_gemv_set &g, const float *x)
{
    const int64_t k = g.w[0].k;
    const int W = k % 1024 == 0 ? 8 : k % 512 == 0 ? 4 : k % 256 == 0 ? 2 : 1;
    const int NA = g.pair ? 2 : 1;
    const size_t smem = (size_t)k / 8 * 16 + (size_t)k / 32 * 4 + 64 + 2 * (size_t)W * NA * 16 * 4;
    const bool g64 = g.w[0].gshift >= 6;
    if (g.pair)
        g64 ? launch_q4_tc<true, true>(s, g, x, W, smem)
            : launch_q4_tc<true, false>(s, g, x, W, smem);
    else
        g64 ? launch_q4_tc<false, true>(s, g, x, W, smem)
            : launch_q4_tc<false, false>(s, g, x, W, smem);
}
