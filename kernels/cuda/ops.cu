/* Element-wise and row-wise kernels of the CUDA backend (float32 activations). */
#include <math.h>

#include "kernels/cuda/cuda.cuh"

static unsigned blocks_for(int64_t n, int threads)
{
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 65535 * 16 ? 65535 * 16 : b);
}

/* The rope tables' entries e = blockIdx.x * blockDim.x + threadIdx.x, at a stride of the
 * grid's x threads (sincosf in full precision, as the host's cosf and sinf to an ulp or two). */
static __device__ __forceinline__ void rope_tab_fill(const cu_rope_tab &rt, int n)
{
    const int total = n * rt.half;
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const int t = e / rt.half, i = e - t * rt.half;
        float sn, cs;
        sincosf((float)rt.pos[t] * rt.inv[i], &sn, &cs);
        rt.cos_t[e] = cs * rt.mscale;
        rt.sin_t[e] = sn * rt.mscale;
    }
}

__global__ void k_rope_tab(cu_rope_tab rt, int n)
{
    rope_tab_fill(rt, n);
}

/* A token row of the table, times scale; the token's id from the last pick where
 * pick_rows names one of its rows (>= 0), else from tokens. A row of blocks past the tokens
 * (blockIdx.y == n) writes the rope tables. */
__global__ void k_embed(float *out, dweight W, const int32_t *__restrict__ tokens,
                        const int32_t *__restrict__ pick_rows, const int32_t *__restrict__ picks,
                        float scale, int n, cu_rope_tab rt)
{
    allow_dependents();
    int t = blockIdx.y;
    if (t == n) return rope_tab_fill(rt, n);
    const int pr = pick_rows ? pick_rows[t] : -1;
    int64_t id = pr >= 0 ? picks[pr] : tokens[t];
    for (int64_t c = blockIdx.x * blockDim.x + threadIdx.x; c < W.k; c += gridDim.x * blockDim.x)
        out[(int64_t)t * W.k + c] = dq_elem(W, id, c) * scale;
}

void cu_rope_tables(cudaStream_t s, const cu_rope_tab &rt, int n)
{
    if (n <= 0) return;
    const int total = n * rt.half;
    k_rope_tab<<<(unsigned)((total + 255) / 256 < 1024 ? (total + 255) / 256 : 1024), 256, 0, s>>>(
        rt, n);
    CU_LAUNCHED();
}

void cu_embed(cudaStream_t s, float *out, const dweight &table, const int32_t *tokens,
              const int32_t *pick_rows, const int32_t *picks, int n, float scale,
              const cu_rope_tab *rt)
{
    if (n <= 0) return;
    dim3 grid((unsigned)((table.k + 255) / 256), (unsigned)n + (rt ? 1 : 0));
    cu_rope_tab none = {};
    k_embed<<<grid, 256, 0, s>>>(out, table, tokens, pick_rows, picks, scale, n, rt ? *rt : none);
    CU_LAUNCHED();
}

/* The row kernels for any length: out (unless NULL) and its bf16 copy ob (unless NULL). */
__global__ void k_rms_norm(float *out, const float *x, const float *__restrict__ w, int dim,
                           float eps, __nv_bfloat16 *ob)
{
    allow_dependents();
    __shared__ float sh[32];
    const int64_t r0 = (int64_t)blockIdx.x * dim;
    const float *xr = x + r0;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
    ss = block_sum(ss, sh);
    float inv = rsqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] * inv * w[i];
        if (out) out[r0 + i] = v;
        if (ob) ob[r0 + i] = __float2bfloat16_rn(v);
    }
}

/*
 * Rows of up to 8192 values whose length is a multiple of 4: a block of 256 threads holds the
 * row in registers as float4 (C of them a thread), so every load of the row is in flight at
 * once and the row is read from memory once. ADD adds y into x first (x keeps the sum).
 */
#define NORM4_THREADS 256
template <int C, bool ADD>
__global__ void __launch_bounds__(NORM4_THREADS)
    k_norm4(float *out, float *x, const float *y, const float *__restrict__ w, int dim, float eps,
            uint2 *ob)
{
    allow_dependents();
    __shared__ float sh[32];
    const int d4 = dim / 4;
    float4 *xr = (float4 *)(x + (int64_t)blockIdx.x * dim);
    const float4 *yr = (const float4 *)(y + (int64_t)blockIdx.x * dim);
    float4 *o = out ? (float4 *)(out + (int64_t)blockIdx.x * dim) : NULL;
    float4 v[C];
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int i = threadIdx.x + c * NORM4_THREADS;
        if (i < d4) {
            v[c] = xr[i];
            if (ADD) {
                const float4 t = yr[i];
                v[c].x += t.x;
                v[c].y += t.y;
                v[c].z += t.z;
                v[c].w += t.w;
                xr[i] = v[c];
            }
            ss = fmaf(v[c].x, v[c].x, ss);
            ss = fmaf(v[c].y, v[c].y, ss);
            ss = fmaf(v[c].z, v[c].z, ss);
            ss = fmaf(v[c].w, v[c].w, ss);
        }
    }
    ss = block_sum(ss, sh);
    const float inv = rsqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int c = 0; c < C; c++) {
        const int i = threadIdx.x + c * NORM4_THREADS;
        if (i < d4) {
            const float4 g = __ldg((const float4 *)w + i);
            const float4 r = make_float4(v[c].x * inv * g.x, v[c].y * inv * g.y, v[c].z * inv * g.z,
                                         v[c].w * inv * g.w);
            if (out) o[i] = r;
            if (ob) {
                __nv_bfloat162 a = __floats2bfloat162_rn(r.x, r.y),
                               b = __floats2bfloat162_rn(r.z, r.w);
                ob[(int64_t)blockIdx.x * d4 + i] = make_uint2(*(uint32_t *)&a, *(uint32_t *)&b);
            }
        }
    }
}

/* Launches k_norm4 when the row fits it; false otherwise. */
static bool norm4(cudaStream_t s, float *out, float *x, const float *y, const float *w, int rows,
                  int dim, float eps, bool add, __nv_bfloat16 *ob)
{
    if (dim % 4 || dim > 8 * 4 * NORM4_THREADS) return false;
    if (((uintptr_t)out | (uintptr_t)x | (uintptr_t)y | (uintptr_t)w | (uintptr_t)ob) % 16)
        return false;
    const int c = (dim / 4 + NORM4_THREADS - 1) / NORM4_THREADS;
    uint2 *o2 = (uint2 *)ob;
#define NORM4(C)                                                                                   \
    (add ? k_norm4<C, true><<<(unsigned)rows, NORM4_THREADS, 0, s>>>(out, x, y, w, dim, eps, o2)   \
         : k_norm4<C, false><<<(unsigned)rows, NORM4_THREADS, 0, s>>>(out, x, y, w, dim, eps, o2))
    if (c == 1)
        NORM4(1);
    else if (c == 2)
        NORM4(2);
    else if (c <= 4)
        NORM4(4);
    else
        NORM4(8);
#undef NORM4
    CU_LAUNCHED();
    return true;
}

void cu_rms_norm(cudaStream_t s, float *out, const float *x, const float *w, int rows, int dim,
                 float eps, __nv_bfloat16 *ob)
{
    if (rows <= 0) return;
    if (norm4(s, out, (float *)x, x, w, rows, dim, eps, false, ob)) return;
    int threads = dim >= 1024 ? 1024 : dim >= 256 ? 256 : dim >= 128 ? 128 : 32;
    k_rms_norm<<<(unsigned)rows, threads, 0, s>>>(out, x, w, dim, eps, ob);
    CU_LAUNCHED();
}

__global__ void k_add_rms_norm(float *out, float *x, const float *y, const float *__restrict__ w,
                               int dim, float eps, __nv_bfloat16 *ob)
{
    allow_dependents();
    __shared__ float sh[32];
    const int64_t r0 = (int64_t)blockIdx.x * dim;
    float *xr = x + r0;
    const float *yr = y + r0;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = xr[i] + yr[i];
        xr[i] = v;
        ss = fmaf(v, v, ss);
    }
    ss = block_sum(ss, sh);
    float inv = rsqrtf(ss / (float)dim + eps);
    /* each thread rereads only the elements it wrote */
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = xr[i] * inv * w[i];
        if (out) out[r0 + i] = v;
        if (ob) ob[r0 + i] = __float2bfloat16_rn(v);
    }
}

void cu_add_rms_norm(cudaStream_t s, float *out, float *x, const float *y, const float *w, int rows,
                     int dim, float eps, __nv_bfloat16 *ob)
{
    if (rows <= 0) return;
    if (norm4(s, out, x, y, w, rows, dim, eps, true, ob)) return;
    int threads = dim >= 1024 ? 1024 : dim >= 256 ? 256 : dim >= 128 ? 128 : 32;
    k_add_rms_norm<<<(unsigned)rows, threads, 0, s>>>(out, x, y, w, dim, eps, ob);
    CU_LAUNCHED();
}

__global__ void k_rope(float *x, int64_t total, int heads, int half, const float *__restrict__ c,
                       const float *__restrict__ sn)
{
    allow_dependents();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int j = (int)(i % half);
        int64_t rh = i / half; /* row * heads + head */
        int64_t r = rh / heads;
        float *v = x + rh * 2 * half;
        float a = v[j], b = v[j + half];
        float cs = c[r * half + j], si = sn[r * half + j];
        v[j] = a * cs - b * si;
        v[j + half] = b * cs + a * si;
    }
}

void cu_rope(cudaStream_t s, float *x, int rows, int heads, int d, const float *cos_t,
             const float *sin_t)
{
    int64_t total = (int64_t)rows * heads * (d / 2);
    if (total <= 0) return;
    k_rope<<<blocks_for(total, 256), 256, 0, s>>>(x, total, heads, d / 2, cos_t, sin_t);
    CU_LAUNCHED();
}

/* One block per token: rope on its query and key heads, then the roped key and the value
 * rows stored into the paged cache as bf16. Without src, q and k are roped in place; with
 * it, each token's q, k and v are read from src (a row of src_stride values, q's heads then
 * k's then v's: the product of the three matrices at once) and written to q, k and v. */
__global__ void k_rope_kv(float *q, float *k, float *v, const float *__restrict__ src,
                          int64_t src_stride, __nv_bfloat16 *kc, __nv_bfloat16 *vc,
                          const int32_t *__restrict__ slot, int hq, int hkv, int half,
                          const float *__restrict__ c, const float *__restrict__ sn)
{
    allow_dependents();
    const int t = blockIdx.x, d = 2 * half, row = hkv * d;
    const float *ct = c + (int64_t)t * half, *st = sn + (int64_t)t * half;
    float *qt = q + (int64_t)t * hq * d, *kt = k + (int64_t)t * row, *vt = v + (int64_t)t * row;
    const float *qs = src ? src + (int64_t)t * src_stride : qt;
    const float *ks = src ? qs + (int64_t)hq * d : kt, *vs = src ? ks + row : vt;
    const int64_t dst = (int64_t)slot[t] * row;
    for (int i = threadIdx.x; i < (hq + hkv) * half; i += blockDim.x) {
        const int h = i / half, j = i % half;
        const bool is_q = h < hq;
        const float *x = is_q ? qs + h * d : ks + (h - hq) * d;
        float *y = is_q ? qt + h * d : kt + (h - hq) * d;
        const float a = x[j], b = x[j + half], cs = ct[j], si = st[j];
        const float ra = a * cs - b * si, rb = b * cs + a * si;
        y[j] = ra;
        y[j + half] = rb;
        if (!is_q) {
            const int64_t o = dst + (h - hq) * d + j;
            kc[o] = __float2bfloat16_rn(ra);
            kc[o + half] = __float2bfloat16_rn(rb);
        }
    }
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        const float x = vs[i];
        if (src) vt[i] = x;
        vc[dst + i] = __float2bfloat16_rn(x);
    }
}

void cu_rope_kv(cudaStream_t s, float *q, float *k, float *v, const float *src, __nv_bfloat16 *kc,
                __nv_bfloat16 *vc, const int32_t *slot, int n_tokens, int hq, int hkv, int d,
                const float *cos_t, const float *sin_t)
{
    if (n_tokens <= 0) return;
    const int64_t stride = (int64_t)(hq + 2 * hkv) * d;
    k_rope_kv<<<(unsigned)n_tokens, 256, 0, s>>>(q, k, v, src, stride, kc, vc, slot, hq, hkv, d / 2,
                                                 cos_t, sin_t);
    CU_LAUNCHED();
}

__global__ void k_act_mul(float *out, const float *gate, const float *up, int64_t n, int act,
                          __nv_bfloat16 *ob)
{
    allow_dependents();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = act_of(gate[i], act) * up[i];
        if (out) out[i] = v;
        if (ob) ob[i] = __float2bfloat16_rn(v);
    }
}

static __device__ __forceinline__ uint2 bf16x4(float4 v)
{
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    return make_uint2(*(uint32_t *)&a, *(uint32_t *)&b);
}

/* Four bf16 values as floats. */
static __device__ __forceinline__ float4 bf16x4_f(uint2 u)
{
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

/* Four activation inputs as floats: float32 as they are, bf16 (four in a uint2) widened. */
static __device__ __forceinline__ float4 in4(float4 v)
{
    return v;
}

static __device__ __forceinline__ float4 in4(uint2 u)
{
    return bf16x4_f(u);
}

/* The same on groups of four (T: float4 of float32 or uint2 of bf16 inputs): n4 of them, two
 * per thread and iteration, so that four loads are in flight before the first use. */
template <class T>
__global__ void k_act_mul4(float4 *out, const T *__restrict__ gate, const T *__restrict__ up,
                           int64_t n4, int act, uint2 *ob)
{
    allow_dependents();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4; i += 2 * stride) {
        const bool two = i + stride < n4;
        const T g0 = gate[i], u0 = up[i];
        T g1 = g0, u1 = u0;
        if (two) {
            g1 = gate[i + stride];
            u1 = up[i + stride];
        }
        const float4 a0 = in4(g0), b0 = in4(u0);
        const float4 v0 = make_float4(act_of(a0.x, act) * b0.x, act_of(a0.y, act) * b0.y,
                                      act_of(a0.z, act) * b0.z, act_of(a0.w, act) * b0.w);
        if (out) out[i] = v0;
        if (ob) ob[i] = bf16x4(v0);
        if (two) {
            const float4 a1 = in4(g1), b1 = in4(u1);
            const float4 v1 = make_float4(act_of(a1.x, act) * b1.x, act_of(a1.y, act) * b1.y,
                                          act_of(a1.z, act) * b1.z, act_of(a1.w, act) * b1.w);
            if (out) out[i + stride] = v1;
            if (ob) ob[i + stride] = bf16x4(v1);
        }
    }
}

void cu_act_mul(cudaStream_t s, float *out, const float *gate, const float *up, int64_t n, int act,
                __nv_bfloat16 *ob)
{
    if (n <= 0) return;
    if (n % 4 == 0 &&
        ((uintptr_t)out | (uintptr_t)gate | (uintptr_t)up | (uintptr_t)ob) % 16 == 0) {
        const int64_t n4 = n / 4;
        k_act_mul4<float4><<<blocks_for((n4 + 1) / 2, 256), 256, 0, s>>>(
            (float4 *)out, (const float4 *)gate, (const float4 *)up, n4, act, (uint2 *)ob);
        CU_LAUNCHED();
        return;
    }
    k_act_mul<<<blocks_for(n, 256), 256, 0, s>>>(out, gate, up, n, act, ob);
    CU_LAUNCHED();
}

void cu_act_mul_b16(cudaStream_t s, __nv_bfloat16 *ob, const __nv_bfloat16 *gate,
                    const __nv_bfloat16 *up, int64_t n, int act)
{
    if (n <= 0) return;
    const int64_t n4 = n / 4;
    k_act_mul4<uint2><<<blocks_for((n4 + 1) / 2, 256), 256, 0, s>>>(
        NULL, (const uint2 *)gate, (const uint2 *)up, n4, act, (uint2 *)ob);
    CU_LAUNCHED();
}

__global__ void k_add(float *x, const float *y, int64_t n)
{
    allow_dependents();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

void cu_add(cudaStream_t s, float *x, const float *y, int64_t n)
{
    if (n <= 0) return;
    k_add<<<blocks_for(n, 256), 256, 0, s>>>(x, y, n);
    CU_LAUNCHED();
}

__global__ void k_add_bias(float *y, const float *__restrict__ b, int64_t total, int n)
{
    allow_dependents();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += b[i % n];
}

void cu_add_bias(cudaStream_t s, float *y, const float *bias, int m, int n)
{
    int64_t total = (int64_t)m * n;
    if (total <= 0) return;
    k_add_bias<<<blocks_for(total, 256), 256, 0, s>>>(y, bias, total, n);
    CU_LAUNCHED();
}

__global__ void k_softcap(float *x, int64_t n, float cap)
{
    allow_dependents();
    float inv = 1.0f / cap;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] * inv);
}

void cu_softcap(cudaStream_t s, float *x, int64_t n, float cap)
{
    if (n <= 0) return;
    k_softcap<<<blocks_for(n, 256), 256, 0, s>>>(x, n, cap);
    CU_LAUNCHED();
}

/* In place (dst == src): rows copied in increasing i, as the CPU reference does. */
__global__ void k_gather(float *dst, const float *src, const int32_t *__restrict__ rows, int n,
                         int dim)
{
    allow_dependents();
    for (int i = 0; i < n; i++) {
        const float *s = src + (int64_t)rows[i] * dim;
        float *d = dst + (int64_t)i * dim;
        for (int j0 = 0; j0 < dim; j0 += blockDim.x) {
            int j = j0 + threadIdx.x;
            float v = j < dim ? s[j] : 0.0f;
            __syncthreads();
            if (j < dim) d[j] = v;
        }
        __syncthreads();
    }
}

__global__ void k_gather_par(float *dst, const float *__restrict__ src,
                             const int32_t *__restrict__ rows, int dim)
{
    allow_dependents();
    const float *s = src + (int64_t)rows[blockIdx.x] * dim;
    float *d = dst + (int64_t)blockIdx.x * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) d[j] = s[j];
}

void cu_gather_rows(cudaStream_t s, float *dst, const float *src, const int32_t *rows, int n,
                    int dim)
{
    if (n <= 0) return;
    if (dst == src) {
        k_gather<<<1, 1024, 0, s>>>(dst, src, rows, n, dim);
    } else {
        k_gather_par<<<(unsigned)n, 256, 0, s>>>(dst, src, rows, dim);
    }
    CU_LAUNCHED();
}

__global__ void k_to_bf16(__nv_bfloat16 *dst, const float *__restrict__ src, int64_t n)
{
    allow_dependents();
    for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 2; i < n;
         i += (int64_t)gridDim.x * blockDim.x * 2) {
        if (i + 1 < n)
            *(__nv_bfloat162 *)(dst + i) = __floats2bfloat162_rn(src[i], src[i + 1]);
        else
            dst[i] = __float2bfloat16_rn(src[i]);
    }
}

void cu_to_bf16(cudaStream_t s, __nv_bfloat16 *dst, const float *src, int64_t n)
{
    if (n <= 0) return;
    k_to_bf16<<<blocks_for((n + 1) / 2, 256), 256, 0, s>>>(dst, src, n);
    CU_LAUNCHED();
}

/* Columns of src [m, n0 + n1 + n2] into y0 [m, n0], y1 [m, n1], y2 [m, n2], in float4 units
 * (every n a multiple of 4). */
__global__ void k_split3(const float4 *__restrict__ src, int m, int n0, int n1, int n2, float4 *y0,
                         float4 *y1, float4 *y2)
{
    allow_dependents();
    const int n = n0 + n1 + n2;
    for (int r = blockIdx.y; r < m; r += gridDim.y)
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < n; c += gridDim.x * blockDim.x) {
            const float4 v = src[(int64_t)r * n + c];
            if (c < n0)
                y0[(int64_t)r * n0 + c] = v;
            else if (c < n0 + n1)
                y1[(int64_t)r * n1 + c - n0] = v;
            else
                y2[(int64_t)r * n2 + c - n0 - n1] = v;
        }
}

void cu_split3(cudaStream_t s, const float *src, int m, int n0, int n1, int n2, float *y0,
               float *y1, float *y2)
{
    if (m <= 0) return;
    const int n4 = (n0 + n1 + n2) / 4;
    dim3 grid((unsigned)((n4 + 255) / 256), (unsigned)(m < 65535 ? m : 65535));
    k_split3<<<grid, 256, 0, s>>>((const float4 *)src, m, n0 / 4, n1 / 4, n2 / 4, (float4 *)y0,
                                  (float4 *)y1, (float4 *)y2);
    CU_LAUNCHED();
}

/* The largest value of a row, the lowest index among equals; NaN never wins. A block reads
 * float4 units [lo4, hi4) of row r (8 loads a thread in flight: one at a time took 52 us
 * for a row of 128256 values) and, with `tail`, the values past the last whole unit (all
 * of them when n4 is 0); thread 0 gets the block's best. */
#define ARGMAX_UNROLL 8
static __device__ amax block_argmax(const float *r, int n, int n4, int lo4, int hi4, bool tail)
{
    amax b = {-INFINITY, 0x7fffffff};
    const int step = (int)blockDim.x;
    const float4 *r4 = (const float4 *)r;
    for (int base = lo4 + threadIdx.x; base < hi4; base += ARGMAX_UNROLL * step) {
        float4 v[ARGMAX_UNROLL];
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; u++)
            if (base + u * step < hi4) v[u] = __ldg(r4 + base + u * step);
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; u++) {
            const int i = base + u * step;
            if (i < hi4) {
                amax_take(b, v[u].x, 4 * i);
                amax_take(b, v[u].y, 4 * i + 1);
                amax_take(b, v[u].z, 4 * i + 2);
                amax_take(b, v[u].w, 4 * i + 3);
            }
        }
    }
    if (tail)
        for (int i = 4 * n4 + threadIdx.x; i < n; i += step) amax_take(b, r[i], i);
    __shared__ amax sb[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax_take(b, __shfl_xor_sync(0xffffffffu, b.v, o), __shfl_xor_sync(0xffffffffu, b.i, o));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) sb[warp] = b;
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) amax_take(b, sb[w].v, sb[w].i);
    return b;
}

static __device__ __forceinline__ int row_units(const float *x, int n)
{
    return n % 4 == 0 && (uintptr_t)x % 16 == 0 ? n / 4 : 0;
}

/* One block a row. */
__global__ void k_argmax(int32_t *out, const float *__restrict__ x, int n)
{
    allow_dependents();
    grid_dependency_wait();
    const int n4 = row_units(x, n);
    const amax b = block_argmax(x + (int64_t)blockIdx.x * n, n, n4, 0, n4, true);
    if (threadIdx.x == 0) out[blockIdx.x] = b.i == 0x7fffffff ? 0 : b.i;
}

/* Rows too few to fill the GPU a block each: gridDim.x blocks a row, each over a range of
 * its units. Each block's best joins the row's slot as an order-preserving 64-bit key
 * (value bits, then the complement of the index: the lower index wins a tie) by
 * atomicMax; the row's last block to count in writes the index and zeroes the slot and the
 * count for the next launch. */
__global__ void k_argmax_split(int32_t *out, const float *__restrict__ x, int n,
                               unsigned long long *slot, unsigned *count)
{
    allow_dependents();
    grid_dependency_wait();
    const int row = blockIdx.y, nb = (int)gridDim.x;
    const int n4 = row_units(x, n);
    const int lo4 = (int)((int64_t)n4 * blockIdx.x / nb),
              hi4 = (int)((int64_t)n4 * (blockIdx.x + 1) / nb);
    const amax b = block_argmax(x + (int64_t)row * n, n, n4, lo4, hi4, (int)blockIdx.x == nb - 1);
    if (threadIdx.x == 0) amax_commit(b, &slot[row], &count[row], &out[row], (unsigned)nb);
}

void cu_argmax(cudaStream_t s, int32_t *out, const float *x, int rows, int n, int split,
               unsigned long long *slot, unsigned *count, bool early)
{
    if (rows <= 0) return;
    cu_launch l;
    if (split > 1 && slot) {
        cu_launch_init(&l, (unsigned)split, 256, 0, s, early);
        l.cfg.gridDim = dim3((unsigned)split, (unsigned)rows);
        CU(cudaLaunchKernelEx(&l.cfg, k_argmax_split, out, x, n, slot, count));
    } else {
        cu_launch_init(&l, (unsigned)rows, 1024, 0, s, early);
        CU(cudaLaunchKernelEx(&l.cfg, k_argmax, out, x, n));
    }
}
