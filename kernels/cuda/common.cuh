/*
 * Shared pieces of the CUDA kernels: error checks, the device view of a weight matrix and
 * the in-register decoders of every weight format (see model/weights.h for the layouts).
 *
 * A matrix is consumed as stored: packed codes, scales and biases are copied to the
 * device unchanged and every kernel decodes the values it needs into registers.
 */
#ifndef PAGODA_KERNELS_CUDA_COMMON_CUH
#define PAGODA_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* Reports a failed CUDA call with its file and line and ends the process: a CUDA error
 * leaves the context unusable, so no operation can continue after one. */
void cu_fatal(const char *what, const char *msg, const char *file, int line);

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t cu_e_ = (call);                                                                \
        if (cu_e_ != cudaSuccess) cu_fatal(#call, cudaGetErrorString(cu_e_), __FILE__, __LINE__);  \
    } while (0)

/* After every kernel launch. */
#define CU_LAUNCHED() CU(cudaGetLastError())

/* Lets the next kernel of the stream start now if it was launched as a programmatic
 * dependent (it still waits for this grid's results before reading them); kernels call it
 * first thing so that a dependent's loads that need nothing from them overlap their tail. */
static __device__ __forceinline__ void allow_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/* Two floats as the bf16 pair of an MMA operand register (lo in the low half). */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&h;
}

/* c += a b, m16n8k16, bf16 operands and float32 accumulators. */
static __device__ __forceinline__ void mma_bf16(float *c, const uint32_t *a, uint32_t b0,
                                                uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 2^x in one instruction (0 for -inf). */
static __device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* 16 bytes global -> shared, zero-filled when !valid. */
static __device__ __forceinline__ void cp16(void *dst, const void *src, bool valid)
{
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(n));
}

/* A 16-byte load of streamed weights: read once, so it takes no line in L1 (which keeps
 * what is read again, such as group scales). */
static __device__ __forceinline__ uint4 ld_stream(const uint4 *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* The sum over a block (a multiple of 32 threads) of every thread's v, which every thread
 * gets; sh: 32 values of shared memory. Sums in one order: the same bits on every call. */
template <class T> static __device__ __forceinline__ T block_sum(T v, T *sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    T t = 0;
    for (int i = 0; i < nw; i++) t += sh[i];
    return t;
}

/* The rms_norm scale of a row of k values from its sums of squares, one a warp. */
static __device__ __forceinline__ float norm_scale(const float *red, int nw, int64_t k, float eps)
{
    float ss = 0.0f;
    for (int w = 0; w < nw; w++) ss += red[w];
    return rsqrtf(ss / (float)k + eps);
}

/* The gate's activation: act is enum act_kind (model/config.h): 0 SiLU, 1 GELU (tanh),
 * 2 ReLU^2 (BitNet; times up it is (r * r) * up, the CPU's order). */
static __device__ __forceinline__ float act_of(float g, int act)
{
    if (act == 2) {
        const float r = fmaxf(g, 0.0f); /* NaN to 0, as the CPU's g > 0 ? g : 0 */
        return __fmul_rn(r, r);
    }
    if (act) {
        const float k = 0.7978845608028654f;
        return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
    }
    return g / (1.0f + expf(-g));
}

/* Waits until the grids this one depends on have finished and their writes are visible
 * (a no-op unless the kernel was launched as a programmatic dependent). */
static __device__ __forceinline__ void grid_dependency_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* A launch configuration for cudaLaunchKernelEx; with early set, the kernel may start
 * while the previous kernel of the stream finishes (programmatic dependent launch: it must
 * call grid_dependency_wait before reading that kernel's results or writing anything). */
struct cu_launch {
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[1];
};

static inline void cu_launch_init(cu_launch *l, unsigned grid, unsigned threads, size_t smem,
                                  cudaStream_t s, bool early)
{
    *l = cu_launch{};
    l->cfg.gridDim = dim3(grid);
    l->cfg.blockDim = dim3(threads);
    l->cfg.dynamicSmemBytes = smem;
    l->cfg.stream = s;
    l->attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    l->attr[0].val.programmaticStreamSerializationAllowed = 1;
    if (early) {
        l->cfg.attrs = l->attr;
        l->cfg.numAttrs = 1;
    }
}

/* A running greedy pick: the largest value, the lowest index among equals; NaN never wins
 * (i stays 0x7fffffff while nothing has been taken). */
struct amax {
    float v;
    int i;
};

static __device__ __forceinline__ void amax_take(amax &b, float v, int i)
{
    if (v > b.v || (v == b.v && i < b.i)) {
        b.v = v;
        b.i = i;
    }
}

/* One block's best (b, in thread 0) joins a row's pick over several blocks: an
 * order-preserving 64-bit key (value bits, then the complement of the index: the lower index
 * wins a tie) by atomicMax into slot; the last of the nb blocks to count in writes the index
 * (0 where every value was NaN) and zeroes the slot and the count for the next launch. */
static __device__ __forceinline__ void amax_commit(amax b, unsigned long long *slot,
                                                   unsigned *count, int32_t *out, unsigned nb)
{
    if (b.i != 0x7fffffff) {
        const unsigned u = __float_as_uint(b.v);
        const unsigned key = u & 0x80000000u ? ~u : u | 0x80000000u;
        atomicMax(slot, (unsigned long long)key << 32 | (unsigned)~b.i);
    }
    __threadfence();
    if (atomicAdd(count, 1u) != nb - 1) return;
    const unsigned long long k = atomicExch(slot, 0ull);
    *count = 0;
    *out = k ? (int32_t) ~(unsigned)(k & 0xffffffffu) : 0;
}

/* Formats as the kernels see them. */
/* DF_TERNARY runs only through cu_ternary (ternary.cu): the other kernels never see it. */
enum dfmt { DF_F32, DF_F16, DF_BF16, DF_AFFINE, DF_MXFP4, DF_MXFP8, DF_NVFP4, DF_TERNARY };
/* Scale/bias storage of affine weights. */
enum dsc { DS_BF16, DS_F16, DS_F32, DS_U8 };

/* The device view of one weight matrix (passed by value to kernels). */
struct dweight {
    int fmt, bits, group, sdtype;
    int gshift;  /* log2(group) when group is a power of two, else -1 */
    int64_t gpr; /* groups per row (k / group) */
    int64_t n, k;
    int64_t row_bytes;
    const uint8_t *w;
    const void *scales;
    const void *biases;
};

static __device__ __forceinline__ float bf16_bits(uint32_t h)
{
    return __uint_as_float(h << 16);
}

static __device__ __forceinline__ float load_scale(const void *p, int dt, int64_t i)
{
    if (dt == DS_BF16) return bf16_bits(((const uint16_t *)p)[i]);
    if (dt == DS_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

/* 2^(e - 127) for an e8m0 byte; 255 is NaN. */
static __device__ __forceinline__ float e8m0(uint32_t e)
{
    if (e == 0) return __uint_as_float(0x00400000u);
    if (e == 255) return __uint_as_float(0x7fc00000u);
    return __uint_as_float(e << 23);
}

/* e2m1 code (bit 3 sign) to float: 0, .5, 1, 1.5, 2, 3, 4, 6. */
static __device__ __forceinline__ float fp4(uint32_t c)
{
    uint32_t e = (c >> 1) & 3, m = c & 1;
    uint32_t bits = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(bits | ((c & 8u) << 28));
}

/* e4m3 ("fn": 0x7f/0xff NaN, no infinities) to float. */
static __device__ __forceinline__ float fp8(uint32_t c)
{
    uint32_t e = (c >> 3) & 15, m = c & 7;
    float v;
    if (e == 0)
        v = (float)m * (1.0f / 512.0f);
    else if (e == 15 && m == 7)
        v = __uint_as_float(0x7fc00000u);
    else
        v = __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (c & 0x80) ? -v : v;
}

/* Field j of an LSB-first stream of `bits`-bit values. */
static __device__ __forceinline__ uint32_t field(const uint8_t *row, int64_t j, int bits)
{
    int64_t bit = j * bits;
    const uint8_t *p = row + (bit >> 3);
    uint32_t v = p[0];
    if ((bit & 7) + bits > 8) v |= (uint32_t)p[1] << 8;
    return (v >> (bit & 7)) & ((1u << bits) - 1);
}

/* Index of the scale of (r, c): shifts for power-of-two groups, no 64-bit division. */
static __device__ __forceinline__ int64_t group_index(const dweight &W, int64_t r, int64_t c)
{
    int gc = W.gshift >= 0 ? (int)c >> W.gshift : (int)c / W.group;
    return r * W.gpr + gc;
}

/* Any single element (row r, column c) of any format: embeddings, the generic paths. */
static __device__ __forceinline__ float dq_elem(const dweight &W, int64_t r, int64_t c)
{
    const uint8_t *row = W.w + r * W.row_bytes;
    int64_t gi = W.group ? group_index(W, r, c) : 0;
    switch (W.fmt) {
    case DF_F32:
        return ((const float *)row)[c];
    case DF_F16:
        return __half2float(((const __half *)row)[c]);
    case DF_BF16:
        return bf16_bits(((const uint16_t *)row)[c]);
    case DF_AFFINE:
        return load_scale(W.scales, W.sdtype, gi) * (float)field(row, c, W.bits) +
               load_scale(W.biases, W.sdtype, gi);
    case DF_MXFP4:
        return fp4(field(row, c, 4)) * e8m0(((const uint8_t *)W.scales)[gi]);
    case DF_NVFP4:
        return fp4(field(row, c, 4)) * fp8(((const uint8_t *)W.scales)[gi]);
    default: /* DF_MXFP8 */
        return fp8(row[c]) * e8m0(((const uint8_t *)W.scales)[gi]);
    }
}

/*
 * Unit decoders for the fast paths: a unit is the values one thread decodes at once from
 * one aligned load. Formats with 16, 8, 4 or 2 bits use 16-byte units (8, 16, 32 or 64
 * values; f32 uses 4); 3, 5 and 6 bits use 32-value units of 12, 20 or 24 bytes. A unit
 * spanning several groups reads one scale per 16 values (the smallest group).
 */
template <int FMT, int BITS> struct unit_traits {
    static constexpr int vals = FMT == DF_F32                         ? 4
                                : BITS == 3 || BITS == 5 || BITS == 6 ? 32
                                                                      : 128 / BITS;
    static constexpr int bytes = vals * BITS / 8;
};

/* The scale of value `c` of row r for group-quantized formats. */
static __device__ __forceinline__ float group_scale(const dweight &W, int64_t r, int64_t c)
{
    int64_t gi = group_index(W, r, c);
    if (W.fmt == DF_AFFINE) return load_scale(W.scales, W.sdtype, gi);
    uint32_t s = ((const uint8_t *)W.scales)[gi];
    return W.fmt == DF_NVFP4 ? fp8(s) : e8m0(s);
}

static __device__ __forceinline__ float group_bias(const dweight &W, int64_t r, int64_t c)
{
    return load_scale(W.biases, W.sdtype, group_index(W, r, c));
}

/* Decodes unit u of row r into v[vals]. */
template <int FMT, int BITS>
static __device__ __forceinline__ void decode_unit(const dweight &W, int64_t r, int64_t u, float *v)
{
    constexpr int V = unit_traits<FMT, BITS>::vals;
    const uint8_t *row = W.w + r * W.row_bytes;
    if (FMT == DF_BF16 || FMT == DF_F16) {
        uint4 q = __ldg((const uint4 *)row + u);
        uint32_t w4[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (FMT == DF_BF16) {
                v[2 * i] = __uint_as_float(w4[i] << 16);
                v[2 * i + 1] = __uint_as_float(w4[i] & 0xffff0000u);
            } else {
                __half2 h = *(const __half2 *)&w4[i];
                float2 f = __half22float2(h);
                v[2 * i] = f.x;
                v[2 * i + 1] = f.y;
            }
        }
        return;
    }
    if (FMT == DF_F32) {
        float4 q = __ldg((const float4 *)row + u);
        v[0] = q.x;
        v[1] = q.y;
        v[2] = q.z;
        v[3] = q.w;
        return;
    }
    /* Packed words of the unit. */
    constexpr int NW = unit_traits<FMT, BITS>::bytes / 4;
    uint32_t w[NW];
    if (NW % 4 == 0) {
#pragma unroll
        for (int i = 0; i < NW / 4; i++) {
            uint4 q = __ldg((const uint4 *)(row + u * unit_traits<FMT, BITS>::bytes) + i);
            w[4 * i] = q.x;
            w[4 * i + 1] = q.y;
            w[4 * i + 2] = q.z;
            w[4 * i + 3] = q.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < NW; i++)
            w[i] = __ldg((const uint32_t *)(row + u * unit_traits<FMT, BITS>::bytes) + i);
    }
    int64_t c0 = u * V;
    constexpr int SUB = V < 16 ? V : 16;
    float sc = 1.0f, bi = 0.0f;
#pragma unroll
    for (int s = 0; s < V / SUB; s++) {
        /* One scale (and bias) per 16 values (groups are never smaller), read once when
         * the whole unit sits in one group. */
        if (s == 0 || W.group < V) {
            sc = group_scale(W, r, c0 + s * SUB);
            if (FMT == DF_AFFINE) bi = group_bias(W, r, c0 + s * SUB);
        }
#pragma unroll
        for (int j = 0; j < SUB; j++) {
            int idx = s * SUB + j;
            uint32_t q;
            if (FMT == DF_MXFP8) {
                q = (w[idx / 4] >> (8 * (idx % 4))) & 0xff;
                v[idx] = fp8(q) * sc;
            } else if (FMT == DF_MXFP4 || FMT == DF_NVFP4) {
                q = (w[idx / 8] >> (4 * (idx % 8))) & 15;
                v[idx] = fp4(q) * sc;
            } else {
                constexpr int B = BITS;
                int bit = idx * B, wi = bit / 32, sh = bit % 32;
                uint64_t cat = w[wi];
                if (sh + B > 32 && wi + 1 < NW) cat |= (uint64_t)w[wi + 1] << 32;
                q = (uint32_t)((cat >> sh) & ((1ull << B) - 1));
                v[idx] = sc * (float)q + bi;
            }
        }
    }
}

/* Writes the bf16 decode of W rows [n0, n0 + WT_ROWS) x cols [k0, k0 + WT_COLS) into sb,
 * rows WT_LD values apart (past n or k: zero), as the tensor-core products stage a weight
 * tile. FAST: whole units (k a multiple of WT_COLS and the fast-path layout); else element
 * by element. */
template <int FMT, int BITS, bool FAST, int WT_ROWS, int WT_COLS, int WT_LD>
static __device__ __forceinline__ void load_wtile(const dweight &W, int64_t n0, int64_t k0,
                                                  __nv_bfloat16 (*sb)[WT_LD])
{
    if constexpr (FAST) {
        constexpr int V = unit_traits<FMT, BITS>::vals, UPR = WT_COLS / V; /* units per tile row */
        for (int i = threadIdx.x; i < WT_ROWS * UPR; i += blockDim.x) {
            const int rr = i / UPR, uu = i % UPR;
            const int64_t r = n0 + rr;
            float v[V];
            if (r < W.n) {
                decode_unit<FMT, BITS>(W, r, k0 / V + uu, v);
            } else {
#pragma unroll
                for (int j = 0; j < V; j++) v[j] = 0.0f;
            }
#pragma unroll
            for (int j = 0; j < V; j += 2)
                *(__nv_bfloat162 *)&sb[rr][uu * V + j] = __floats2bfloat162_rn(v[j], v[j + 1]);
        }
    } else {
        for (int i = threadIdx.x; i < WT_ROWS * WT_COLS; i += blockDim.x) {
            const int rr = i / WT_COLS, cc = i % WT_COLS;
            const int64_t r = n0 + rr, c = k0 + cc;
            sb[rr][cc] = __float2bfloat16_rn(r < W.n && c < W.k ? dq_elem(W, r, c) : 0.0f);
        }
    }
}

#endif
