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
#include "kernels/cuda/gemv_out.cuh"

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

/* (w & mask) | magic as one logic operation (ptxas splits the C expression into two when
 * both constants are immediates). */
template <uint32_t MASK, uint32_t MAGIC>
static __device__ __forceinline__ uint32_t and_or(uint32_t w)
{
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(w), "n"(MASK), "n"(MAGIC));
    return r;
}

/* The 8 nibbles of w as four fp16 pairs with offsets: (q0, q4) + 1024, (q1, q5) + 64,
 * (q2, q6) + 1024, (q3, q7) + 64. */
static __device__ __forceinline__ void nibbles_raw(uint32_t w, uint32_t *p)
{
    const uint32_t t = w >> 8;
    p[0] = and_or<0x000f000fu, 0x64006400u>(w);
    p[1] = and_or<0x00f000f0u, 0x54005400u>(w);
    p[2] = and_or<0x000f000fu, 0x64006400u>(t);
    p[3] = and_or<0x00f000f0u, 0x54005400u>(t);
}

/* The unit sums d[n] (column n: unit n of the lanes' quad) of rows g and g + 8 from this
 * lane's 16-byte units qa (row g) and qb (row g + 8) and its x pairs xp (zeros where g != t);
 * RAW: decoded by nibbles_raw, the offsets' share still in them. */
template <bool RAW = false>
static __device__ __forceinline__ void unit_mma(uint4 qa, uint4 qb, const uint4 *xp, float *d)
{
    const uint32_t wa[4] = {qa.x, qa.y, qa.z, qa.w}, wb[4] = {qb.x, qb.y, qb.z, qb.w};
    d[0] = d[1] = d[2] = d[3] = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t pa[4], pb[4];
        if (RAW) {
            nibbles_raw(wa[k], pa);
            nibbles_raw(wb[k], pb);
        } else {
            nibbles(wa[k], pa);
            nibbles(wb[k], pb);
        }
        const uint4 xv = xp[k];
        /* k (2t, 2t+1, 2t+8, 2t+9) <- columns (0, 4, 1, 5), then (2, 6, 3, 7) */
        mma_f16(d, pa[0], pb[0], pa[1], pb[1], xv.x, xv.y);
        mma_f16(d, pa[2], pb[2], pa[3], pb[3], xv.z, xv.w);
    }
}

/*
 * The end of a 16-row tile: each lane's row values v[a][h] (rows g and g + 8 of matrix a)
 * summed over its quad, then over the block's W warps through the double-buffered partials
 * (one barrier a tile), and written by the first 16 threads; a pair's gate row becomes
 * act(gate) * up.
 */
template <bool PAIR, int NA>
static __device__ __forceinline__ void tile_store(const cu_gemv_set &g, float *part, int buf, int W,
                                                  const float (&v)[NA][2], int64_t r0, int64_t rl,
                                                  int wi)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t = lane & 3;
    float *pb = part + buf * W * NA * 16;
#pragma unroll
    for (int a = 0; a < NA; a++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float u = v[a][h];
            u += __shfl_xor_sync(0xffffffffu, u, 1);
            u += __shfl_xor_sync(0xffffffffu, u, 2);
            if (t == 0) pb[(warp * NA + a) * 16 + g8 + 8 * h] = u;
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
        const int wi = PAIR ? 0 : set_row(g, r0, &rl);
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
                    float d[4];
                    unit_mma(qa[c][a], qb[c][a], xp, d);
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

        float v[NA][2];
#pragma unroll
        for (int a = 0; a < NA; a++)
#pragma unroll
            for (int h = 0; h < 2; h++) v[a][h] = fmaf(accq[a][h], down, accb[a][h]);
        tile_store<PAIR, NA>(g, part, buf, W, v, r0, rl, wi);
    }
    if (!staged) grid_dependency_wait(); /* ends after the grid it depends on, in any case */
}

/*
 * The same product with the weights streamed through shared memory (k_gemv_q4_ring).
 *
 * k_gemv_q4_tc holds a chunk's weights, scales and biases in registers from load to use: at
 * 128 registers a thread two blocks fit an SM, a warp's loads go out in one burst a chunk and
 * nothing is in flight while it computes, about 32 KB an SM on average: too little to cover
 * the latency of HBM at its bandwidth.
 *
 * Here each warp owns a ring of TCR_STAGES slots in shared memory, one warp step a slot: the
 * two 16-byte weight units of every lane (rows g and g + 8, unit t: 1 KB a matrix) and the
 * scales, then the biases, of the step's groups of the 16 rows as raw 16-bit values. They
 * arrive by asynchronous copies (cp.async: weights past L1, each lane copying its own units,
 * and one row's scales or biases a lane), so no register holds them in flight. A warp's steps
 * form one sequence over all the tiles its block takes, and the ring runs across tiles: while
 * the warp computes step i, steps i + 1 to i + TCR_STAGES - 1 are in flight, one commit group
 * each (an empty group past the last step, so that waiting until at most TCR_STAGES - 1
 * groups are pending always means that step i has landed). That is 7 KB a warp (14 KB for
 * gate and up), issued before the block waits for x and kept up to the last step. A lane
 * reads its own weight units back; the scales and biases, copied by other lanes, are read by
 * the lanes that apply them after a warp barrier, and a second barrier closes each step
 * before its slot is refilled.
 *
 * x is staged in one pass with a power of two per 32-column unit instead of one for all of
 * x: each unit is scaled to put its own largest magnitude near 2^14, and its inverse scale
 * is kept beside its float32 sum. A unit's products are a column of the MMA result of their
 * own, so the inverse scale joins the group scale there, in float32. No block-wide maximum
 * is needed (one pass over x and one barrier fewer), and units of small values keep all of
 * fp16's precision.
 *
 * Groups of 32, 64 and 128 (4, 2 or 1 a step and row), scales and biases in bf16 or f16.
 */

#define TCR_STAGES 8 /* slots of a warp's ring */

/* Bytes of one slot of a ring: per matrix the 2 x 32 weight units of the warp's lanes, then
 * the scales and the biases of the 16 rows (8 bytes a row for 4 groups, else 4). */
static constexpr __host__ __device__ int tcr_stage(int na, int groups)
{
    return na * (1024 + 2 * 16 * (groups == 4 ? 8 : 4));
}

static __device__ __forceinline__ void cp_async16(uint32_t dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(dst), "l"(src)
                 : "memory");
}

/* N (4 or 8) bytes at dst: the first `have` from src, the rest zeros. */
template <int N>
static __device__ __forceinline__ void cp_async_small(uint32_t dst, const void *src, int have)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(N),
                 "r"(have)
                 : "memory");
}

static __device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

/* Until at most N of this thread's commit groups are pending. */
template <int N> static __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* A raw 16-bit scale or bias (the low half of h) as load_scale reads it, bf16 or f16:
 * both conversions and a select, no branch. */
static __device__ __forceinline__ float raw_scale(uint32_t h, int dt)
{
    const float b = __uint_as_float(h << 16), f = __half2float(__ushort_as_half((unsigned short)h));
    return dt == DS_BF16 ? b : f;
}

/* The source of a lane's copies: per matrix its weight units of rows g and g + 8 and the
 * scales (lanes 0-15) or biases (lanes 16-31) of row lane % 16, at step 0 of the warp's
 * k-slice of `tile`; `step` and `slot` are those of the next copy. */
template <int NA> struct tcr_feed {
    const uint8_t *w[NA], *w8[NA];
    const uint16_t *sb[NA];
    int64_t tile;
    int step, slot;
};

template <bool PAIR, int NA>
static __device__ __forceinline__ void tcr_aim(const cu_gemv_set &g, tcr_feed<NA> &f, int lane,
                                               int c_begin)
{
    int64_t rl = f.tile * TCV_ROWS;
    const int wi = PAIR ? 0 : set_row(g, f.tile * TCV_ROWS, &rl);
    const int gshift = g.w[0].gshift;
#pragma unroll
    for (int a = 0; a < NA; a++) {
        const set_mat M = set_pick(g, PAIR ? a : wi);
        f.w[a] = M.w + (rl + (lane >> 2)) * M.row_bytes + 16 * ((c_begin >> 5) + (lane & 3));
        f.w8[a] = f.w[a] + 8 * M.row_bytes;
        f.sb[a] = (const uint16_t *)(lane < 16 ? M.scales : M.biases) + (rl + (lane & 15)) * M.gpr +
                  (c_begin >> gshift);
    }
}

/* Copies the next step of the warp's sequence into its slot (nothing past the last tile)
 * and commits one group in any case. */
template <bool PAIR, int G, int NA>
static __device__ __forceinline__ void tcr_issue(const cu_gemv_set &g, tcr_feed<NA> &f,
                                                 uint32_t ring, int lane, int c_begin, int steps,
                                                 int64_t tiles)
{
    constexpr int SB = G == 4 ? 8 : 4, ST = tcr_stage(NA, G);
    if (f.tile < tiles) {
        const uint32_t d = ring + f.slot * ST;
#pragma unroll
        for (int a = 0; a < NA; a++) {
            /* 128 columns are 64 bytes of a row and G groups */
            cp_async16(d + 1024 * a + 16 * lane, f.w[a] + 64 * f.step);
            cp_async16(d + 1024 * a + 512 + 16 * lane, f.w8[a] + 64 * f.step);
            const uint16_t *q = f.sb[a] + G * f.step;
            const uint32_t ds = d + 1024 * NA + (32 * a + lane) * SB;
            if (G == 4) {
                cp_async_small<8>(ds, q, 8);
            } else if (G == 2) {
                cp_async_small<4>(ds, q, 4);
            } else {
                /* One group: the aligned pair that holds it, only it where it comes first
                 * (the reader takes the half of the index's parity). */
                const bool odd = ((uintptr_t)q & 2) != 0;
                cp_async_small<4>(ds, q - (odd ? 1 : 0), odd ? 4 : 2);
            }
        }
    }
    cp_async_commit();
    f.slot = f.slot + 1 == TCR_STAGES ? 0 : f.slot + 1;
    if (++f.step == steps) {
        f.step = 0;
        f.tile += gridDim.x;
        if (f.tile < tiles) tcr_aim<PAIR, NA>(g, f, lane, c_begin);
    }
}

/* G: groups a row in 128 columns (4, 2, 1 for groups of 32, 64, 128). */
template <bool PAIR, int G>
__global__ void __launch_bounds__(256, 2) k_gemv_q4_ring(cu_gemv_set g, const float *__restrict__ x)
{
    allow_dependents();
    constexpr int NA = PAIR ? 2 : 1, S = TCR_STAGES, ST = tcr_stage(NA, G);
    extern __shared__ __align__(16) unsigned char tcv_raw[];
    const int K = (int)g.w[0].k, W = blockDim.x >> 5;
    unsigned char *ring = tcv_raw;            /* [W][S][ST] */
    uint4 *xs = (uint4 *)(ring + W * S * ST); /* [K / 8], as in k_gemv_q4_tc */
    uint4 *zero = xs + K / 8;                 /* [4] */
    float2 *xu = (float2 *)(zero + 4);        /* [K / 32]: the unit's sum and inverse scale */
    float *part = (float *)(xu + K / 32);     /* [2][W][NA][16] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t = lane & 3;
    const int64_t tiles = g.row_end[g.nw - 1] / TCV_ROWS, gpr = g.w[0].gpr;
    const int cols = K / W, c_begin = warp * cols, steps = cols / 128;
    const int sdt = g.w[0].sdtype;
    const bool scaler = t < 2; /* lanes that hold units' results */
    const unsigned char *mine = ring + warp * S * ST;
    const uint32_t mine_sa = (uint32_t)__cvta_generic_to_shared(mine);

    /* The first S - 1 steps go out before the wait for x: the weights do not depend on the
     * kernel that writes it. */
    tcr_feed<NA> f;
    f.tile = blockIdx.x;
    f.step = f.slot = 0;
    if (f.tile < tiles) tcr_aim<PAIR, NA>(g, f, lane, c_begin);
    for (int i = 0; i < S - 1; i++)
        tcr_issue<PAIR, G, NA>(g, f, mine_sa, lane, c_begin, steps, tiles);

    grid_dependency_wait();
    for (int u = threadIdx.x; u < K / 32; u += blockDim.x) {
        const float4 *p = (const float4 *)(x + 32 * u);
        float4 v[8];
        float mx = 0.0f, sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            v[j] = __ldg(p + j);
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)),
                                 fmaxf(fabsf(v[j].z), fabsf(v[j].w))));
        }
        int ex = 0;
        frexpf(mx, &ex);
        const float up = mx > 0.0f ? ldexpf(1.0f, min(14 - ex, 100)) : 1.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float4 a = v[2 * j], b = v[2 * j + 1];
            sum += (a.x + a.y) + (a.z + a.w) + (b.x + b.y) + (b.z + b.w);
            xs[4 * u + j] = make_uint4(h2_bits(__floats2half2_rn(a.x * up, b.x * up)),
                                       h2_bits(__floats2half2_rn(a.y * up, b.y * up)),
                                       h2_bits(__floats2half2_rn(a.z * up, b.z * up)),
                                       h2_bits(__floats2half2_rn(a.w * up, b.w * up)));
        }
        xu[u] = make_float2(sum, 1.0f / up);
    }
    if (threadIdx.x < 4) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
    __syncthreads();

    int slot = 0, buf = 0;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x, buf ^= 1) {
        const int64_t r0 = tile * TCV_ROWS;
        int64_t rl = r0;
        const int wi = PAIR ? 0 : set_row(g, r0, &rl);
        /* G = 1: the half of a row's scale word that holds its group at step 0 (the same
         * for rows g and g + 8), alternating by step */
        const int par0 = (int)(((rl + g8) * gpr + (c_begin >> 7)) & 1);
        float acc[NA][2];
#pragma unroll
        for (int a = 0; a < NA; a++) acc[a][0] = acc[a][1] = 0.0f;

        for (int s = 0; s < steps; s++) {
            /* One group committed per step (the step S - 1 ahead, or an empty one), so with
             * at most S - 1 pending this step has landed: this lane's copies by the wait,
             * the other lanes' (scales and biases) by the barrier after it. */
            tcr_issue<PAIR, G, NA>(g, f, mine_sa, lane, c_begin, steps, tiles);
            cp_async_wait<S - 1>();
            __syncwarp();
            const unsigned char *st = mine + slot * ST;
            const int ub = (c_begin >> 5) + 4 * s; /* the step's first unit */
            /* x pairs of this lane's unit where it supplies them (g == t), else zeros */
            const uint4 *xp = g8 == t ? xs + 4 * (ub + t) : zero;
            /* units 2t and 2t + 1: sum, inverse scale, sum, inverse scale */
            float4 xd = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (scaler) xd = *(const float4 *)(xu + ub + 2 * t);
#pragma unroll
            for (int a = 0; a < NA; a++) {
                const uint4 qa = ((const uint4 *)st)[64 * a + lane],
                            qb = ((const uint4 *)st)[64 * a + 32 + lane];
                float d[4];
                unit_mma(qa, qb, xp, d);
                if (scaler) {
                    /* scales [16 rows][G], then biases [16 rows][G] (raw 16-bit) */
                    const unsigned char *sc = st + 1024 * NA + 32 * a * (G == 4 ? 8 : 4);
                    if (G == 4) { /* groups 2t and 2t + 1 of rows g and g + 8 */
                        const uint32_t *q = (const uint32_t *)sc;
                        const uint32_t s0 = q[2 * g8 + t], s1 = q[2 * g8 + 16 + t],
                                       b0 = q[2 * g8 + 32 + t], b1 = q[2 * g8 + 48 + t];
                        acc[a][0] =
                            fmaf(raw_scale(s0, sdt) * xd.y, d[0],
                                 fmaf(raw_scale(s0 >> 16, sdt) * xd.w, d[1],
                                      fmaf(raw_scale(b0, sdt), xd.x,
                                           fmaf(raw_scale(b0 >> 16, sdt), xd.z, acc[a][0]))));
                        acc[a][1] =
                            fmaf(raw_scale(s1, sdt) * xd.y, d[2],
                                 fmaf(raw_scale(s1 >> 16, sdt) * xd.w, d[3],
                                      fmaf(raw_scale(b1, sdt), xd.x,
                                           fmaf(raw_scale(b1 >> 16, sdt), xd.z, acc[a][1]))));
                    } else { /* one group for both units: group t (G = 2) or the one (G = 1) */
                        const uint16_t *q = (const uint16_t *)sc;
                        const int h = G == 2 ? t : par0 ^ (s & 1);
                        const float xsum = xd.x + xd.z, q0 = fmaf(xd.y, d[0], xd.w * d[1]),
                                    q1 = fmaf(xd.y, d[2], xd.w * d[3]);
                        acc[a][0] = fmaf(raw_scale(q[2 * g8 + h], sdt), q0,
                                         fmaf(raw_scale(q[2 * g8 + 32 + h], sdt), xsum, acc[a][0]));
                        acc[a][1] = fmaf(raw_scale(q[2 * g8 + 16 + h], sdt), q1,
                                         fmaf(raw_scale(q[2 * g8 + 48 + h], sdt), xsum, acc[a][1]));
                    }
                }
            }
            __syncwarp(); /* every lane has read the slot before a copy refills it */
            slot = slot + 1 == S ? 0 : slot + 1;
        }

        tile_store<PAIR, NA>(g, part, buf, W, acc, r0, rl, wi);
    }
    /* Every step copied was waited for above; only empty groups can be pending. */
    asm volatile("cp.async.wait_all;" ::: "memory");
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

/* The largest dynamic shared memory a block may ask for, and the SM count (0 before
 * cu_gemv_tc_init: no ring kernel). */
static int tcr_optin, tcr_sms;

/* Dynamic shared memory of the ring kernel: rings, x pairs, zeros, unit sums and scales,
 * partials. */
static size_t tcr_smem(int64_t k, int W, int na, int groups)
{
    return (size_t)W * TCR_STAGES * tcr_stage(na, groups) + (size_t)k / 8 * 16 + 64 +
           (size_t)k / 32 * 8 + 2 * (size_t)W * na * 16 * 4;
}

template <bool PAIR, int G> static void tcr_allow()
{
    /* the most any launch asks: k = 16384 and 8 warps */
    size_t most = tcr_smem(16384, 8, PAIR ? 2 : 1, G);
    if (most > (size_t)tcr_optin) most = (size_t)tcr_optin;
    CU(cudaFuncSetAttribute(k_gemv_q4_ring<PAIR, G>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)most));
}

static void q4s_init(void);

void cu_gemv_tc_init(void)
{
    int dev;
    CU(cudaGetDevice(&dev));
    CU(cudaDeviceGetAttribute(&tcr_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CU(cudaDeviceGetAttribute(&tcr_sms, cudaDevAttrMultiProcessorCount, dev));
    tcr_allow<false, 4>();
    tcr_allow<false, 2>();
    tcr_allow<false, 1>();
    tcr_allow<true, 4>();
    tcr_allow<true, 2>();
    tcr_allow<true, 1>();
    q4s_init();
}

/* Whether the ring kernel takes a set that k_gemv_q4_tc takes: groups of 32 to 128, 16-bit
 * scales and biases aligned for the copies (8 bytes for groups of 32, else 4: a row's and a
 * step's first group then fall on such a boundary), the shared memory allowed. */
static bool tcr_ok(const cu_gemv_set &g, size_t smem)
{
    const dweight &w = g.w[0];
    if (w.gshift < 5 || w.gshift > 7 || smem > (size_t)tcr_optin) return false;
    if (w.sdtype != DS_BF16 && w.sdtype != DS_F16) return false;
    const uintptr_t al = w.gshift == 5 ? 8 : 4;
    for (int i = 0; i < g.nw; i++)
        if (!g.w[i].scales || !g.w[i].biases || (uintptr_t)g.w[i].scales % al ||
            (uintptr_t)g.w[i].biases % al)
            return false;
    return true;
}

template <bool PAIR, int G>
static void launch_ring(cudaStream_t s, const cu_gemv_set &g, const float *x, int W, size_t smem)
{
    /* Persistent blocks as for k_gemv_q4_tc; blocks an SM by (warps, shared memory). */
    static struct {
        int w, b;
        size_t smem;
    } seen[16];
    static int n_seen;
    int b = 0;
    for (int i = 0; i < n_seen && !b; i++)
        if (seen[i].w == W && seen[i].smem == smem) b = seen[i].b;
    if (!b) {
        CU(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k_gemv_q4_ring<PAIR, G>, W * 32,
                                                         smem));
        if (b < 1) b = 1;
        if (n_seen < 16) {
            seen[n_seen].w = W;
            seen[n_seen].b = b;
            seen[n_seen++].smem = smem;
        }
    }
    const int64_t tiles = g.row_end[g.nw - 1] / TCV_ROWS, most = (int64_t)b * tcr_sms;
    const int64_t rounds = (tiles + most - 1) / most, blocks = (tiles + rounds - 1) / rounds;
    cu_launch l;
    cu_launch_init(&l, (unsigned)blocks, (unsigned)(W * 32), smem, s, g.early);
    CU(cudaLaunchKernelEx(&l.cfg, k_gemv_q4_ring<PAIR, G>, g, x));
}

/*
 * m = 1 of affine 4-bit weights streamed the way k_gemv_stream streams 16-bit ones. One
 * block of 32 warps an SM stages x once (fp16 pairs with per-unit sums and scales as for
 * the ring kernel; with the norm fused, x times the norm weight, the row's scale applied to
 * the sums at the end); every warp then streams its
 * own share of the block's 8-row tiles with no barrier until the end. A step is 256
 * columns of a tile: 128 contiguous bytes of each of its 8 rows (a warp reading 16 rows x
 * 64 bytes a step reached 2.3 TB/s where 8 x 128 reaches 3.5: docs/BENCHMARKS.md). The
 * MMA's row g takes the first 128 columns of row g and its row g + 8 the last 128; its
 * columns 0-3 hold the x units of the first half and 4-7 those of the second, so that
 * output column n < 4 of row g and n >= 4 of row g + 8 are the unit sums, and each lane of
 * a quad ends with two units of its row (units 2t and 2t + 1 of the step), whose group
 * scales and biases it loads itself. With 16-row tiles (the default where every matrix's
 * rows divide by 16; 16 warps a block, 3 steps in flight a warp) a step is 128 bytes of
 * each of 16 rows and a lane takes rows g and g + 8: one MMA pass over both rows' first
 * halves and one over their second halves use the same x fragments, so that x is read
 * from shared memory once per 2 KB of weights (x reads were about a third of the L1
 * wavefronts of a step: 459.6 against 502.8 tok/s, docs/BENCHMARKS.md). Weights are read
 * past L1 (no allocation there), so that the scales and biases, read in pieces of 2 to 8
 * bytes a row, stay in it. The block's tiles x steps are cut into equal ranges, one a warp,
 * so a warp may stop inside a tile and the next one go on there. A warp keeps the loads of
 * its next step in flight in registers while it uses one (deeper, through registers with
 * fewer warps or through a cp.async ring in shared memory, measured no faster), and its
 * first loads go out before the wait for the kernel that writes x.
 *
 * The nibbles become fp16 values with one logic operation a pair and no arithmetic: OR-ed
 * into 0x6400 (1024, where fp16's last place is 1) a nibble in bits 0-3 reads 1024 + q, and
 * into 0x5400 (64, last place 1/16) one in bits 4-7 reads 64 + q. The MMA sums
 * (offset + q) x in float32; the offsets' share (1024 times the sum of the unit's
 * even-column x, 64 times the odd, summed exactly in float64 when x is staged) is
 * subtracted from each unit's result.
 *
 * A warp leaves the row sums of each run of its steps within one tile (a segment) in
 * shared memory; after the one barrier the block adds each tile's segments in warp order
 * (the same order in every run) and writes the outputs through stream_out: the residual
 * add, the gated activation of gate and up, or rope and the KV store. Walking the block's
 * sequence, each tile boundary and each warp boundary starts a segment, so warp w's
 * segment in tile i is number i + w: unique, fewer than tiles + warps.
 *
 * Gate and up, and the two halves of a rope task, are tiles next to each other (a unit of
 * two tiles), so that a task's two rows end in one block.
 */

/* Rows a tile: 8, or 16 where every matrix's rows divide by 16, each lane taking rows g and
 * g + 8: the MMAs of the two rows' first halves and of their second halves share the x
 * fragments, which are then read from shared memory once per 2 KB of weights instead of
 * per 1 KB.
 * Threads a block and steps in flight a warp: 1,024 and 2 with 8 rows (64 registers),
 * 512 and 3 with 16 (up to 128; 768 threads spilled at 80). */
template <int RW> struct q4s_cfg {
    static constexpr int THREADS = RW == 8 ? 1024 : 512, WARPS = THREADS / 32, H = RW / 8;
    static constexpr int DEPTH = RW == 8 ? 2 : 3; /* steps a warp has loaded or is loading */
};

/* One step's loads of a lane (g, t), for each of its rows (g, and g + 8 in 16-row tiles):
 * bytes 16t to 16t + 15 of the row's 128 (a) and bytes 64 + 16t on (b), the scales and the
 * biases of its units' groups (G = 4: two groups, in the two halves). */
template <int H> struct q4s_step {
    uint4 a[H], b[H];
    uint32_t s[H], z[H];
};

/* Where a warp's next load comes from: the lane's first unit of row g, its first scale and
 * bias at step 0 of block-local tile i, the step s and the position p in the warp's
 * range. */
struct q4s_feed {
    const uint4 *a;
    const uint16_t *s, *z;
    int i, st, p;
};

/* The kernel's work units: tiles, or pairs of tiles for gate and up and for rope. */
template <int MODE, int RW> static __host__ __device__ int64_t q4s_units(const cu_gemv_set &g)
{
    return MODE == SM_ROWS ? g.row_end[g.nw - 1] / RW
                           : (MODE == SM_PAIR ? g.w[0].n : g.row_end[g.nw - 1] / 2) / RW;
}

template <int MODE, int G, int RW>
static __device__ __forceinline__ void q4s_aim(const cu_gemv_set &g, q4s_feed &f, int64_t tile,
                                               int lane)
{
    /* a tile of rows, or with two rows a task (gate and up; j and j + d/2 of a head) the
     * first or second rows of RW tasks */
    int64_t rl;
    const int wi = MODE == SM_ROWS ? task_row<MODE>(g, tile * RW, 0, &rl)
                                   : task_row<MODE>(g, (tile >> 1) * RW, (int)(tile & 1), &rl);
    const int g8 = lane >> 2, t = lane & 3;
    const set_mat M = set_pick(g, wi);
    /* the lane's units 2t and 2t + 1 of a step: columns 64t to 64t + 63 */
    const int64_t gi = (rl + g8) * M.gpr + (G == 4 ? 2 * t : G == 2 ? t : t >> 1);
    f.a = (const uint4 *)(M.w + (rl + g8) * M.row_bytes) + t;
    f.s = (const uint16_t *)M.scales + gi;
    f.z = (const uint16_t *)M.biases + gi;
}

/* Loads the warp's next step into q (nothing past its range) and moves on; row g + 8 lies
 * r8 16-byte units (and 8 gpr groups) after row g. */
template <int MODE, int G, int RW>
static __device__ __forceinline__ void q4s_issue(const cu_gemv_set &g, q4s_feed &f,
                                                 q4s_step<RW / 8> &q, int end, int steps,
                                                 int64_t t0, int lane, int64_t r8)
{
    if (f.p >= end) return;
    const int64_t gr8 = 8 * g.w[0].gpr;
#pragma unroll
    for (int h = 0; h < RW / 8; h++) {
        q.a[h] = ld_stream(f.a + h * r8 + 8 * f.st);
        q.b[h] = ld_stream(f.a + h * r8 + 8 * f.st + 4);
    }
#pragma unroll
    for (int h = 0; h < RW / 8; h++) {
        if (G == 4) { /* two groups a lane: 4 bytes each */
            q.s[h] = __ldg((const unsigned int *)(f.s + h * gr8 + 8 * f.st));
            q.z[h] = __ldg((const unsigned int *)(f.z + h * gr8 + 8 * f.st));
        } else {
            q.s[h] = __ldg((const unsigned short *)f.s + h * gr8 + 2 * G * f.st);
            q.z[h] = __ldg((const unsigned short *)f.z + h * gr8 + 2 * G * f.st);
        }
    }
    if (++f.p < end && ++f.st == steps) {
        f.st = 0;
        q4s_aim<MODE, G, RW>(g, f, t0 + ++f.i, lane);
    }
}

/* The lane's two unit sums u0, u1 of one row, scaled by the units' x scales (xd: sum,
 * inverse scale, sum, inverse scale) and the groups' scales s and biases z, into acc. */
template <int G>
static __device__ __forceinline__ void q4s_add(float u0, float u1, uint32_t s, uint32_t z,
                                               float4 xd, int sdt, float &acc)
{
    if (G == 4) {
        acc = fmaf(raw_scale(s, sdt) * xd.y, u0,
                   fmaf(raw_scale(s >> 16, sdt) * xd.w, u1,
                        fmaf(raw_scale(z, sdt), xd.x, fmaf(raw_scale(z >> 16, sdt), xd.z, acc))));
    } else {
        acc = fmaf(raw_scale(s, sdt), fmaf(xd.y, u0, xd.w * u1),
                   fmaf(raw_scale(z, sdt), xd.x + xd.z, acc));
    }
}

/* One step: the MMAs, then the lane's two unit sums of each of its rows, the offsets' share
 * off taken out. 8-row tiles: the MMA's rows g and g + 8 are row g's two halves, and the
 * lane's units are columns 2t, 2t + 1 of MMA row g for t < 2, of row g + 8 for t >= 2.
 * 16-row tiles: one MMA pass over rows g and g + 8's first halves, one over their second
 * halves, with the same x fragments; the lane's units are columns 2t, 2t + 1 of the first
 * pass (t < 2) or of the second (t >= 2), for both rows. */
template <int G, int RW>
static __device__ __forceinline__ void q4s_use(const q4s_step<RW / 8> &q, const uint4 *xp,
                                               float4 xd, float2 off, int sdt, int t,
                                               float (&acc)[RW / 8])
{
    if (RW == 8) {
        float d[4];
        unit_mma<true>(q.a[0], q.b[0], xp, d);
        const float u0 = (t < 2 ? d[0] : d[2]) - off.x, u1 = (t < 2 ? d[1] : d[3]) - off.y;
        q4s_add<G>(u0, u1, q.s[0], q.z[0], xd, sdt, acc[0]);
    } else {
        float d1[4], d2[4];
        unit_mma<true>(q.a[0], q.a[RW / 8 - 1], xp, d1);
        unit_mma<true>(q.b[0], q.b[RW / 8 - 1], xp, d2);
        const bool lo = t < 2;
        q4s_add<G>((lo ? d1[0] : d2[0]) - off.x, (lo ? d1[1] : d2[1]) - off.y, q.s[0], q.z[0], xd,
                   sdt, acc[0]);
        q4s_add<G>((lo ? d1[2] : d2[2]) - off.x, (lo ? d1[3] : d2[3]) - off.y, q.s[RW / 8 - 1],
                   q.z[RW / 8 - 1], xd, sdt, acc[RW / 8 - 1]);
    }
}

/* The sum of row r over block-local tile i's segments, in warp order. */
template <int RW>
static __device__ __forceinline__ float q4s_sum(const float *part, int i, int r, int work,
                                                int steps, int nw)
{
    /* the warp whose range holds position p: the largest w with work * w / nw <= p */
    const int wf = (nw * (i * steps + 1) - 1) / work, wl = (nw * ((i + 1) * steps) - 1) / work;
    float s = 0.0f;
    for (int w = wf; w <= wl; w++) /* warps of empty ranges wrote nothing */
        if (work * w / nw < work * (w + 1) / nw) s += part[(i + w) * RW + r];
    return s;
}

template <int MODE, int G, bool NORM, int RW>
__global__ void __launch_bounds__(q4s_cfg<RW>::THREADS, 1)
    k_gemv_q4_stream(cu_gemv_set g, const float *__restrict__ x)
{
    allow_dependents();
    constexpr int D = q4s_cfg<RW>::DEPTH, NW = q4s_cfg<RW>::WARPS, H = RW / 8;
    constexpr int R = MODE == SM_ROWS ? 1 : 2; /* tiles a unit */
    extern __shared__ __align__(16) unsigned char q4s_raw[];
    const int K = (int)g.w[0].k, steps = K >> 8, sdt = g.w[0].sdtype;
    uint4 *xs = (uint4 *)q4s_raw;       /* [K / 8], as in k_gemv_q4_tc */
    uint4 *zero = xs + K / 8;           /* [4] */
    float2 *xu = (float2 *)(zero + 4);  /* [K / 32]: the unit's sum and inverse scale */
    float *xo = (float *)(xu + K / 32); /* [K / 32]: the offsets' share of the unit */
    float *red = xo + K / 32;           /* [32]: the norm's partial sums */
    float *part = red + 32;             /* [tiles + warps - 1][RW]: segment sums */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g8 = lane >> 2, t = lane & 3;
    const int64_t units = q4s_units<MODE, RW>(g), u0 = units * blockIdx.x / gridDim.x,
                  u1 = units * (blockIdx.x + 1) / gridDim.x, t0 = R * u0;
    const int nt = (int)(R * (u1 - u0)), work = nt * steps;
    const int begin = work * warp / NW, end = work * (warp + 1) / NW;

    /* The first D - 1 steps go out before the wait for x. */
    q4s_feed f;
    f.i = begin / steps;
    f.st = begin - f.i * steps;
    f.p = begin;
    if (begin < end) q4s_aim<MODE, G, RW>(g, f, t0 + f.i, lane);
    const int64_t r8 = 8 * g.w[0].row_bytes / 16;
    q4s_step<H> q[D];
#pragma unroll
    for (int j = 0; j < D - 1; j++) q4s_issue<MODE, G, RW>(g, f, q[j], end, steps, t0, lane, r8);
    grid_dependency_wait();
    /* x staged; with the norm, x * weight: the row's scale, known only after the block's
     * sum of squares, multiplies the products' sums at the end (one pass over x, not two) */
    const float *src = NORM ? g.nsrc : x;
    float ss = 0.0f;
    /* Two lanes a 32-column unit, 16 values each (the loads in flight leave room for no
     * more); whole warps go round together for the shuffles that join a unit's halves. */
    for (int h0 = warp * 32; h0 < K / 16; h0 += blockDim.x) {
        const int h = h0 + lane;
        const bool in = h < K / 16;
        float4 v[4];
        float mx = 0.0f, sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[j] =
                in ? __ldg((const float4 *)src + 4 * h + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (NORM && in) {
                ss += (v[j].x * v[j].x + v[j].y * v[j].y) + (v[j].z * v[j].z + v[j].w * v[j].w);
                const float4 w = __ldg((const float4 *)g.nweight + 4 * h + j);
                v[j].x *= w.x;
                v[j].y *= w.y;
                v[j].z *= w.z;
                v[j].w *= w.w;
            }
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)),
                                 fmaxf(fabsf(v[j].z), fabsf(v[j].w))));
            sum += (v[j].x + v[j].y) + (v[j].z + v[j].w);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        int ex = 0;
        frexpf(mx, &ex);
        const float up = mx > 0.0f ? ldexpf(1.0f, min(14 - ex, 100)) : 1.0f;
        double even = 0.0, odd = 0.0; /* of the fp16 values as staged: exact */
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const float4 a = v[2 * j], b = v[2 * j + 1];
            const __half2 p0 = __floats2half2_rn(a.x * up, b.x * up),
                          p1 = __floats2half2_rn(a.y * up, b.y * up),
                          p2 = __floats2half2_rn(a.z * up, b.z * up),
                          p3 = __floats2half2_rn(a.w * up, b.w * up);
            const float2 f0 = __half22float2(p0), f1 = __half22float2(p1), f2 = __half22float2(p2),
                         f3 = __half22float2(p3);
            even += ((double)f0.x + f0.y) + ((double)f2.x + f2.y);
            odd += ((double)f1.x + f1.y) + ((double)f3.x + f3.y);
            if (in) xs[2 * h + j] = make_uint4(h2_bits(p0), h2_bits(p1), h2_bits(p2), h2_bits(p3));
        }
        even += __shfl_xor_sync(0xffffffffu, even, 1);
        odd += __shfl_xor_sync(0xffffffffu, odd, 1);
        if (in && !(h & 1)) {
            xu[h >> 1] = make_float2(sum, 1.0f / up);
            xo[h >> 1] = (float)(1024.0 * even + 64.0 * odd);
        }
    }
    if (NORM) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) red[warp] = ss;
    }
    if (threadIdx.x < 4) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
    __syncthreads();
    if (NORM) {
        /* the block's share of the normalized row, stored as x for any later reader: 16
         * values a thread, read again (from L1) with the row's scale now known */
        const int h1 = (int)((int64_t)K / 16 * (blockIdx.x + 1) / gridDim.x);
        const float inv = norm_scale(red, NW, K, g.nepsilon);
        for (int h = (int)((int64_t)K / 16 * blockIdx.x / gridDim.x) + threadIdx.x; h < h1;
             h += blockDim.x) {
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float4 v = __ldg((const float4 *)src + 4 * h + j),
                             w = __ldg((const float4 *)g.nweight + 4 * h + j);
                ((float4 *)x)[4 * h + j] =
                    make_float4(v.x * inv * w.x, v.y * inv * w.y, v.z * inv * w.z, v.w * inv * w.w);
            }
        }
    }

    float acc[H];
#pragma unroll
    for (int h = 0; h < H; h++) acc[h] = 0.0f;
    int ci = begin / steps, cs = begin - ci * steps;
    /* B column n of the MMA: unit n of the step's first half (n < 4) or unit n - 4 of its
     * second, supplied by the lanes with t = n % 4, zeros from the others */
    const int xl = (g8 & 3) == t ? 4 * (t + 4 * (g8 >> 2)) : -1;
    for (int p = begin; p < end;) {
#pragma unroll
        for (int j = 0; j < D; j++) {
            q4s_issue<MODE, G, RW>(g, f, q[(j + D - 1) % D], end, steps, t0, lane, r8);
            const int ub = 8 * cs; /* the step's first unit */
            const uint4 *xp = xl >= 0 ? xs + 4 * ub + xl : zero;
            const float4 xd = *(const float4 *)(xu + ub + 2 * t);
            const float2 off = *(const float2 *)(xo + ub + 2 * t);
            q4s_use<G, RW>(q[j], xp, xd, off, sdt, t, acc);
            if (++p == end || ++cs == steps) { /* the segment's end: the rows' sums */
#pragma unroll
                for (int h = 0; h < H; h++) {
                    float s = acc[h] + __shfl_xor_sync(0xffffffffu, acc[h], 1);
                    s += __shfl_xor_sync(0xffffffffu, s, 2);
                    if (t == 0) part[(ci + warp) * RW + g8 + 8 * h] = s;
                    acc[h] = 0.0f;
                }
                if (cs == steps) {
                    cs = 0;
                    ci++;
                }
            }
            if (p == end) break;
        }
    }
    __syncthreads();

    const float inv = NORM ? norm_scale(red, NW, K, g.nepsilon) : 1.0f;
    const int items = nt / R * RW;
    for (int e = threadIdx.x; e < items; e += blockDim.x) {
        const int r = e & (RW - 1), i = e / RW;
        const float a = q4s_sum<RW>(part, R * i, r, work, steps, NW);
        stream_out<MODE>(g, (u0 + i) * RW + r, a * inv,
                         R == 2 ? q4s_sum<RW>(part, 2 * i + 1, r, work, steps, NW) * inv : 0.0f);
    }
}

bool cu_gemv_q4s_ok(const dweight &w)
{
    if (w.fmt != DF_AFFINE || w.bits != 4 || w.k % 256 || w.k > 16384 || w.n % 8) return false;
    if (w.gshift < 5 || w.gshift > 7 || (w.sdtype != DS_BF16 && w.sdtype != DS_F16)) return false;
    /* a lane's scales (and biases) a step: 4 bytes for groups of 32, else 2 */
    const uintptr_t al = w.gshift == 5 ? 4 : 2;
    return w.row_bytes % 16 == 0 && (uintptr_t)w.w % 16 == 0 && w.scales && w.biases &&
           (uintptr_t)w.scales % al == 0 && (uintptr_t)w.biases % al == 0;
}

template <int MODE, int G, int RW> static void q4s_allow()
{
    CU(cudaFuncSetAttribute(k_gemv_q4_stream<MODE, G, false, RW>,
                            cudaFuncAttributeMaxDynamicSharedMemorySize, tcr_optin));
    CU(cudaFuncSetAttribute(k_gemv_q4_stream<MODE, G, true, RW>,
                            cudaFuncAttributeMaxDynamicSharedMemorySize, tcr_optin));
}

template <int MODE> static void q4s_allow_all()
{
    q4s_allow<MODE, 4, 8>();
    q4s_allow<MODE, 2, 8>();
    q4s_allow<MODE, 1, 8>();
    q4s_allow<MODE, 4, 16>();
    q4s_allow<MODE, 2, 16>();
    q4s_allow<MODE, 1, 16>();
}

template <int MODE, int G, int RW>
static void q4s_launch(cudaStream_t s, const cu_gemv_set &g, const float *x, unsigned blocks,
                       size_t smem)
{
    void (*kern)(cu_gemv_set, const float *) =
        g.nsrc ? k_gemv_q4_stream<MODE, G, true, RW> : k_gemv_q4_stream<MODE, G, false, RW>;
    cu_launch l;
    cu_launch_init(&l, blocks, q4s_cfg<RW>::THREADS, smem, s, g.early);
    CU(cudaLaunchKernelEx(&l.cfg, kern, g, x));
}

/* One block an SM, each with the same number of units to a unit; false where the shared
 * memory does not suffice. */
template <int MODE, int RW> static bool q4s_go(cudaStream_t s, const cu_gemv_set &g, const float *x)
{
    const int64_t units = q4s_units<MODE, RW>(g), k = g.w[0].k;
    if (units < 1) return false;
    const int64_t blocks = units < tcr_sms ? units : tcr_sms;
    const int64_t tiles = (units + blocks - 1) / blocks * (MODE == SM_ROWS ? 1 : 2);
    const size_t smem = (size_t)k / 8 * 16 + 64 + (size_t)k / 32 * 12 + 32 * sizeof(float) +
                        (size_t)(tiles + q4s_cfg<RW>::WARPS) * RW * sizeof(float);
    if (smem > (size_t)tcr_optin) return false;
    const int gs = g.w[0].gshift;
    gs == 5   ? q4s_launch<MODE, 4, RW>(s, g, x, (unsigned)blocks, smem)
    : gs == 6 ? q4s_launch<MODE, 2, RW>(s, g, x, (unsigned)blocks, smem)
              : q4s_launch<MODE, 1, RW>(s, g, x, (unsigned)blocks, smem);
    return true;
}

template <int RW> static bool q4s_go_rw(cudaStream_t s, const cu_gemv_set &g, const float *x)
{
    return g.pair        ? q4s_go<SM_PAIR, RW>(s, g, x)
           : g.rope_half ? q4s_go<SM_ROPE, RW>(s, g, x)
                         : q4s_go<SM_ROWS, RW>(s, g, x);
}

bool cu_gemv_q4_stream(cudaStream_t s, const cu_gemv_set &g, const float *x)
{
    const dweight &w = g.w[0];
    if (!tcr_sms || g.keep_order || (uintptr_t)x % 16) return false;
    bool rows16 = true; /* 16-row tiles where every matrix has rows of 16 */
    for (int i = 0; i < g.nw; i++) {
        if (!cu_gemv_q4s_ok(g.w[i]) || g.w[i].k != w.k || g.w[i].gshift != w.gshift ||
            g.w[i].sdtype != w.sdtype)
            return false;
        rows16 &= g.w[i].n % 16 == 0;
    }
    if (g.nsrc && ((uintptr_t)g.nsrc % 16 || (uintptr_t)g.nweight % 16)) return false;
    if (g.resid && (g.nw != 1 || g.pair)) return false;
    if (g.rope_half && (g.nw != 3 || g.pair || g.rope_half % 8)) return false;
    rows16 &= g.rope_half % 16 == 0;
    return (rows16 && q4s_go_rw<16>(s, g, x)) || q4s_go_rw<8>(s, g, x);
}

void cu_gemv_q4_tc(cudaStream_t s, const cu_gemv_set &g, const float *x)
{
    const int64_t k = g.w[0].k;
    const int W = k % 1024 == 0 ? 8 : k % 512 == 0 ? 4 : k % 256 == 0 ? 2 : 1;
    const int NA = g.pair ? 2 : 1;
    const bool g64 = g.w[0].gshift >= 6;
    /* the streaming kernel where it takes the set; else the ring kernel (steps of 128
     * columns a warp, K / W a whole number of them) where its groups and shared memory
     * allow; else the one that keeps its loads in registers */
    if (cu_gemv_q4_stream(s, g, x)) return;
    const int G = g.w[0].gshift == 5 ? 4 : g.w[0].gshift == 6 ? 2 : 1;
    const size_t rs = tcr_smem(k, W, NA, G);
    if (tcr_ok(g, rs)) {
        if (g.pair)
            G == 4   ? launch_ring<true, 4>(s, g, x, W, rs)
            : G == 2 ? launch_ring<true, 2>(s, g, x, W, rs)
                     : launch_ring<true, 1>(s, g, x, W, rs);
        else
            G == 4   ? launch_ring<false, 4>(s, g, x, W, rs)
            : G == 2 ? launch_ring<false, 2>(s, g, x, W, rs)
                     : launch_ring<false, 1>(s, g, x, W, rs);
        return;
    }
    const size_t smem = (size_t)k / 8 * 16 + (size_t)k / 32 * 4 + 64 + 2 * (size_t)W * NA * 16 * 4;
    if (g.pair)
        g64 ? launch_q4_tc<true, true>(s, g, x, W, smem)
            : launch_q4_tc<true, false>(s, g, x, W, smem);
    else
        g64 ? launch_q4_tc<false, true>(s, g, x, W, smem)
            : launch_q4_tc<false, false>(s, g, x, W, smem);
}

static void q4s_init(void)
{

    q4s_allow_all<SM_ROWS>();
    q4s_allow_all<SM_PAIR>();
    q4s_allow_all<SM_ROPE>();
}
