/*
 * Routed experts (backend_ops.moe) on the device: routing, the chosen experts' products, and
 * each row's sum of its experts. Every (row, chosen expert) entry's output is computed on its
 * own and a row's entries are added in expert order, so a row's result does not depend on
 * which other rows share the step's experts, and the order of the sum is the CPU backend's
 * (kernels/cpu/hybrid.c).
 *
 * Few rows (decode): a warp per output row of an entry's matrix, decoding whole units of
 * every format (common.cuh), gate and up with the activation in one launch, down in a
 * second that also adds a row's entries as it goes; the entries' experts are read from a
 * device table of descriptors, one per expert.
 * Many rows: the entries grouped by expert on the device (counts, offsets, lists). With few
 * entries an expert (decode of many sequences), a warp per output row of each expert's
 * matrices streams the row once for 8 of its entries at a time (k_moe_xgemv), giving each
 * entry the few-row path's result bit for bit. Else (prefill) a launch per matrix kind over
 * every expert's tiles of 64 entries, on tensor cores as
 * gemm.cu's k_gemm (x rounded to bf16, weight tiles decoded into shared memory), each entry's
 * output kept apart ([rows * top_k, hidden]) for a last launch to add. Its grid is
 * sized for the most tiles a step of that many rows can have; tiles past the device's count
 * exit at once. It reads each 64 x 64 weight tile once per 64 rows of its expert with no
 * pipelining of the tile loads: with few rows an expert (many experts, short prompts) it is
 * bound by the decode into shared memory, far from the bandwidth.
 */
#include "kernels/cuda/cuda.cuh"

#include <mma.h>

using namespace nvcuda;

static size_t al256(size_t b)
{
    return (b + 255) & ~(size_t)255;
}

size_t cu_moe_scratch_bytes(int rows, int top_k, int n_experts, int inner, int hidden)
{
    const size_t n = (size_t)(rows < CU_MOE_CHUNK ? rows : CU_MOE_CHUNK) * (size_t)top_k;
    return 3 * al256(4 * n) + 2 * al256(4 * ((size_t)n_experts + 1)) + al256(4 * n * inner) +
           al256(4 * n * hidden);
}

void cu_moe_carve(cu_moe_args *a, void *ws)
{
    const size_t n = (size_t)(a->rows < CU_MOE_CHUNK ? a->rows : CU_MOE_CHUNK) * a->top_k;
    uint8_t *p = (uint8_t *)ws;
    a->sel = (int32_t *)p;
    p += al256(4 * n);
    a->wt = (float *)p;
    p += al256(4 * n);
    a->list = (int32_t *)p;
    p += al256(4 * n);
    a->start = (int32_t *)p;
    p += al256(4 * ((size_t)a->n_experts + 1));
    a->tile0 = (int32_t *)p;
    p += al256(4 * ((size_t)a->n_experts + 1));
    a->h = (float *)p;
    p += al256(4 * n * a->inner);
    a->y = (float *)p;
}

/* ---- routing ---- */

/*
 * Routing, a block per row (more than 1,024 experts or top_k past 32; else the warp kernel
 * below): softmax over the router's n_experts logits (the sum in double, as the
 * CPU's), then top_k rounds of a block-wide pick of the largest not yet taken (the lower
 * index among equals; NaN counts as -inf), weights renormalized when norm_topk (summed in the
 * order they were picked), and the row's entries written sorted by expert id. Dynamic shared
 * memory: the logits [n_experts], then the picks' ids and weights [top_k] each.
 */
#define ROUTE_THREADS 128
__global__ void __launch_bounds__(ROUTE_THREADS) k_moe_route(cu_moe_args a)
{
    allow_dependents();
    extern __shared__ float4 route4[];
    float *lg = (float *)route4;
    const int E = a.n_experts, K = a.top_k, r = blockIdx.x;
    int32_t *ks = (int32_t *)(lg + E);
    float *kw = (float *)(ks + K);
    __shared__ float rv[ROUTE_THREADS / 32];
    __shared__ int ri[ROUTE_THREADS / 32];
    __shared__ double rs[ROUTE_THREADS / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = ROUTE_THREADS / 32;
    const float *row = a.router + (int64_t)r * E;
    float mx = -INFINITY;
    for (int e = tid; e < E; e += ROUTE_THREADS) {
        const float v = row[e];
        lg[e] = v;
        mx = fmaxf(mx, v);
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
    if (lane == 0) rv[warp] = mx;
    __syncthreads();
    mx = rv[0];
    for (int w = 1; w < nw; w++) mx = fmaxf(mx, rv[w]);
    double sum = 0.0;
    for (int e = tid; e < E; e += ROUTE_THREADS) sum += (double)expf(lg[e] - mx);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if (lane == 0) rs[warp] = sum;
    __syncthreads(); /* also: every thread has read rv before the picks reuse it */
    sum = 0.0;
    for (int w = 0; w < nw; w++) sum += rs[w];
    for (int i = 0; i < K; i++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = tid; e < E; e += ROUTE_THREADS) {
            bool taken = false;
            for (int q = 0; q < i; q++) taken |= ks[q] == e;
            float v = lg[e];
            if (v != v) v = -INFINITY;
            if (!taken && (v > bv || (v == bv && e < bi))) {
                bv = v;
                bi = e;
            }
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, m);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, m);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            rv[warp] = bv;
            ri[warp] = bi;
        }
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < nw; w++)
                if (rv[w] > bv || (rv[w] == bv && ri[w] < bi)) {
                    bv = rv[w];
                    bi = ri[w];
                }
            ks[i] = bi;
            kw[i] = (float)((double)expf(lg[bi] - mx) / sum);
        }
        __syncthreads(); /* ks[i] for the next round; rv, ri read before they are rewritten */
    }
    if (tid) return;
    if (a.norm_topk) {
        float tot = 0.0f;
        for (int i = 0; i < K; i++) tot += kw[i];
        for (int i = 0; i < K; i++) kw[i] /= tot;
    }
    if (a.expert_scale)
        for (int i = 0; i < K; i++) kw[i] *= a.expert_scale[ks[i]];
    for (int i = 1; i < K; i++) { /* by expert id: the order of the row's sum */
        const int e = ks[i];
        const float w = kw[i];
        int j = i - 1;
        for (; j >= 0 && ks[j] > e; j--) {
            ks[j + 1] = ks[j];
            kw[j + 1] = kw[j];
        }
        ks[j + 1] = e;
        kw[j + 1] = w;
    }
    for (int i = 0; i < K; i++) {
        a.sel[(int64_t)r * K + i] = ks[i];
        a.wt[(int64_t)r * K + i] = kw[i];
    }
}

/*
 * The same, a warp per row, for up to 1,024 experts and top_k up to 32 (every model's): a
 * lane holds experts lane, lane + 32, ... in registers (EPL of them) with a bit each for
 * taken, each pick is a warp's butterfly over (value, index) pairs, lane i keeps pick i, and
 * the renormalizing sum runs over the picks in order through shuffles. No barrier: a decode
 * step's routing costs top_k rounds of five shuffles.
 */
template <int EPL> __global__ void __launch_bounds__(ROUTE_THREADS) k_moe_route_warp(cu_moe_args a)
{
    allow_dependents();
    const int lane = threadIdx.x & 31, r = blockIdx.x * (ROUTE_THREADS / 32) + (threadIdx.x >> 5);
    if (r >= a.rows) return; /* the whole warp; no barrier below */
    const int E = a.n_experts, K = a.top_k;
    const float *row = a.router + (int64_t)r * E;
    float v[EPL];
    unsigned taken = 0;
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < EPL; j++) {
        const int e = j * 32 + lane;
        v[j] = e < E ? row[e] : -INFINITY;
        if (e >= E) taken |= 1u << j;
        mx = fmaxf(mx, v[j]);
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, m));
    double sum = 0.0;
#pragma unroll
    for (int j = 0; j < EPL; j++)
        if (!(taken >> j & 1u)) sum += (double)expf(v[j] - mx);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
#pragma unroll
    for (int j = 0; j < EPL; j++)
        if (v[j] != v[j]) v[j] = -INFINITY; /* NaN is never picked */
    int my_e = 0;
    float my_w = 0.0f;
    for (int i = 0; i < K; i++) {
        float bv = -INFINITY;
        int be = 0x7fffffff;
#pragma unroll
        for (int j = 0; j < EPL; j++) {
            const int e = j * 32 + lane;
            if (!(taken >> j & 1u) && (v[j] > bv || (v[j] == bv && e < be))) {
                bv = v[j];
                be = e;
            }
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, m);
            const int oe = __shfl_xor_sync(0xffffffffu, be, m);
            if (ov > bv || (ov == bv && oe < be)) {
                bv = ov;
                be = oe;
            }
        }
        if ((be & 31) == lane) taken |= 1u << (be >> 5); /* K <= E: be is an expert */
        if (lane == i) {
            my_e = be;
            my_w = (float)((double)expf(bv - mx) / sum);
        }
    }
    if (a.norm_topk) {
        float tot = 0.0f; /* in the order of the picks, as the CPU's */
        for (int i = 0; i < K; i++) tot += __shfl_sync(0xffffffffu, my_w, i);
        my_w /= tot;
    }
    if (a.expert_scale && lane < K) my_w *= a.expert_scale[my_e];
    int rank = 0; /* the entry's place among the row's by expert id */
    for (int i = 0; i < K; i++) rank += __shfl_sync(0xffffffffu, my_e, i) < my_e;
    if (lane < K) {
        a.sel[(int64_t)r * K + rank] = my_e;
        a.wt[(int64_t)r * K + rank] = my_w;
    }
}

/* Tiles of the grouped products: 64 entries by 64 outputs by 64 of k. */
#define MOE_TM   64
#define MOE_TN   64
#define MOE_TK   64
#define MOE_TPAD 8

/*
 * One block: each expert's entry count (shared-memory atomics), their exclusive sums as the
 * experts' first list positions and first tiles (warp 0, 32 experts a round), then every
 * entry placed in its expert's part of the list (the order within an expert is whatever the
 * atomics give: each entry's result is its own, wherever its tile row). Dynamic shared
 * memory: [n_experts] counts, then fill positions.
 */
#define GROUP_THREADS 1024
__global__ void __launch_bounds__(GROUP_THREADS) k_moe_group(cu_moe_args a)
{
    allow_dependents();
    extern __shared__ int32_t grp[];
    const int E = a.n_experts, total = a.rows * a.top_k, tid = threadIdx.x;
    for (int e = tid; e < E; e += GROUP_THREADS) grp[e] = 0;
    __syncthreads();
    for (int i = tid; i < total; i += GROUP_THREADS) atomicAdd(&grp[a.sel[i]], 1);
    __syncthreads();
    if (tid < 32) {
        const int lane = tid;
        int base = 0, tbase = 0;
        for (int e0 = 0; e0 < E; e0 += 32) {
            const int e = e0 + lane;
            const int n = e < E ? grp[e] : 0, nt = (n + MOE_TM - 1) / MOE_TM;
            int inc = n, tinc = nt;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int u = __shfl_up_sync(0xffffffffu, inc, o),
                          tu = __shfl_up_sync(0xffffffffu, tinc, o);
                if (lane >= o) {
                    inc += u;
                    tinc += tu;
                }
            }
            if (e < E) {
                a.start[e] = base + inc - n;
                a.tile0[e] = tbase + tinc - nt;
                grp[e] = base + inc - n;
            }
            base += __shfl_sync(0xffffffffu, inc, 31);
            tbase += __shfl_sync(0xffffffffu, tinc, 31);
        }
        if (lane == 0) {
            a.start[E] = base;
            a.tile0[E] = tbase;
        }
    }
    __syncthreads();
    for (int i = tid; i < total; i += GROUP_THREADS) a.list[atomicAdd(&grp[a.sel[i]], 1)] = i;
}

/* ---- few rows: a product per entry ---- */

/* The dot of V decoded weights with x[0, V) (16-byte aligned). */
template <int V>
static __device__ __forceinline__ float dot_units(const float *v, const float *__restrict__ x)
{
    float t = 0.0f;
#pragma unroll
    for (int j = 0; j < V / 4; j++) {
        const float4 xv = __ldg((const float4 *)x + j);
        t = fmaf(v[4 * j], xv.x, t);
        t = fmaf(v[4 * j + 1], xv.y, t);
        t = fmaf(v[4 * j + 2], xv.z, t);
        t = fmaf(v[4 * j + 3], xv.w, t);
    }
    return t;
}

/* Rows r of gate and up dotted with x (W.k floats, 16-byte aligned where whole units
 * decode), each summed over the warp: every lane holds the sums. FMT < 0: element by
 * element, any layout. */
template <int FMT, int BITS>
static __device__ __forceinline__ void gate_up_dot(const dweight &G, const dweight &U, int64_t r,
                                                   const float *__restrict__ x, int lane, float &g,
                                                   float &u)
{
    g = u = 0.0f;
    if constexpr (FMT >= 0) {
        constexpr int V = unit_traits<FMT, BITS>::vals;
        const int64_t units = G.k / V;
#pragma unroll 2
        for (int64_t k = lane; k < units; k += 32) {
            float v[V];
            decode_unit<FMT, BITS>(G, r, k, v);
            g += dot_units<V>(v, x + k * V);
            decode_unit<FMT, BITS>(U, r, k, v);
            u += dot_units<V>(v, x + k * V);
        }
    } else {
        for (int64_t c = lane; c < G.k; c += 32) {
            g = fmaf(dq_elem(G, r, c), x[c], g);
            u = fmaf(dq_elem(U, r, c), x[c], u);
        }
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        g += __shfl_xor_sync(0xffffffffu, g, m);
        u += __shfl_xor_sync(0xffffffffu, u, m);
    }
}

/* Entries a row's down products take at once: their loads are in flight together. */
#define MOE_DOWN_BATCH 8

/* Row r of the down matrices of entries p0 .. p0 + nb - 1 (nb <= MOE_DOWN_BATCH) dotted with
 * their h rows, each summed over the warp into s[j] (every lane). */
template <int FMT, int BITS>
static __device__ __forceinline__ void down_dots(const cu_moe_args &a, int p0, int nb, int64_t r,
                                                 int lane, float (&s)[MOE_DOWN_BATCH])
{
#pragma unroll
    for (int j = 0; j < MOE_DOWN_BATCH; j++) s[j] = 0.0f;
    if constexpr (FMT >= 0) {
        constexpr int V = unit_traits<FMT, BITS>::vals;
        const int64_t units = a.inner / V;
        for (int64_t k = lane; k < units; k += 32) {
#pragma unroll
            for (int j = 0; j < MOE_DOWN_BATCH; j++) {
                if (j < nb) {
                    float v[V];
                    decode_unit<FMT, BITS>(a.down[a.sel[p0 + j]], r, k, v);
                    s[j] += dot_units<V>(v, a.h + (int64_t)(p0 + j) * a.inner + k * V);
                }
            }
        }
    } else {
        for (int64_t c = lane; c < a.inner; c += 32)
#pragma unroll
            for (int j = 0; j < MOE_DOWN_BATCH; j++)
                if (j < nb)
                    s[j] = fmaf(dq_elem(a.down[a.sel[p0 + j]], r, c),
                                a.h[(int64_t)(p0 + j) * a.inner + c], s[j]);
    }
#pragma unroll
    for (int j = 0; j < MOE_DOWN_BATCH; j++)
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) s[j] += __shfl_xor_sync(0xffffffffu, s[j], m);
}

/*
 * A warp per output row r of the entries' matrices. PAIR: row r of each entry's expert's
 * gate and up over the entry's x row, h = act(gate) * up (grid: inner / 8 by entries, at a
 * stride of gridDim.y). Else row r of down over each entry's h row (8 entries' loads in
 * flight at once), the row's entries weighted and added in expert order into out itself
 * (grid: hidden / 8 by rows): no per-entry results and no launch to add them. FMT < 0: any
 * layout, element by element (experts whose matrices differ in layout, or that the unit
 * decoders do not take).
 */
#define MOE_GEMV_WARPS 8
template <int FMT, int BITS, bool PAIR>
__global__ void __launch_bounds__(MOE_GEMV_WARPS * 32) k_moe_gemv(cu_moe_args a)
{
    allow_dependents();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * MOE_GEMV_WARPS + warp;
    if (r >= (PAIR ? a.inner : a.hidden)) return; /* the whole warp; no barrier below */
    const int K = a.top_k;
    if constexpr (PAIR) {
        for (int pr = blockIdx.y; pr < a.rows * K; pr += gridDim.y) {
            const int e = a.sel[pr];
            float g, u;
            gate_up_dot<FMT, BITS>(a.gate[e], a.up[e], r, a.x + (int64_t)(pr / K) * a.hidden, lane,
                                   g, u);
            if (lane == 0) a.h[(int64_t)pr * a.inner + r] = act_of(g, a.gelu) * u;
        }
    } else {
        for (int row = blockIdx.y; row < a.rows; row += gridDim.y) {
            float o = 0.0f;
            for (int j0 = 0; j0 < K; j0 += MOE_DOWN_BATCH) {
                const int nb = K - j0 < MOE_DOWN_BATCH ? K - j0 : MOE_DOWN_BATCH;
                float s[MOE_DOWN_BATCH];
                down_dots<FMT, BITS>(a, row * K + j0, nb, r, lane, s);
#pragma unroll
                for (int j = 0; j < MOE_DOWN_BATCH; j++)
                    if (j < nb) o += s[j] * a.wt[row * K + j0 + j];
            }
            if (lane == 0) a.out[(int64_t)row * a.hidden + r] = o;
        }
    }
}

/*
 * Entries grouped by expert, few of them an expert (decode of many sequences: 256 rows of top
 * 8 over 256 experts give about 8 an expert): a warp per MOE_XG_R output rows of expert
 * blockIdx.y's matrix (units of 8 values or fewer; else one row), streaming the rows once for
 * up to MOE_XG_M of the expert's entries at a time, each x load serving every row of the
 * warp, as the dense matrix-vector kernel serves its x rows (gemv.cu). Each entry's sums run
 * in k_moe_gemv's order (lane l takes units l, l + 32, ...; then a warp butterfly), so its
 * results are the few-row path's bit for bit. PAIR: act(gate) * up into h at the entries'
 * list positions (as k_moe_mm); else the down products into y by entry, for k_moe_combine.
 * Whole units only (units_ok).
 */
#define MOE_XG_M 8
/* Entries an expert on average up to which a step takes k_moe_xgemv over the tiles. On an
 * H200, 256 experts of top 8 (the Qwen3.6-35B-A3B shape, bf16): at 2 an expert (64
 * sequences) the streamed products made decode 1.41x faster than the tiles, at 8 (256
 * sequences) the tiles were 1.38x faster; the crossover lies between. */
#define MOE_XG_PER_EXPERT 4
template <int V> struct xg_rows {
    static constexpr int n = V <= 8 ? 4 : 1;
};
template <int FMT, int BITS, bool PAIR>
__global__ void __launch_bounds__(MOE_GEMV_WARPS * 32) k_moe_xgemv(cu_moe_args a)
{
    allow_dependents();
    constexpr int V = unit_traits<FMT, BITS>::vals;
    constexpr int NA = PAIR ? 2 : 1, R = xg_rows<V>::n;
    const int e = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int p0 = a.start[e], p1 = a.start[e + 1];
    const int64_t n = PAIR ? a.inner : a.hidden;
    const int64_t r0 = ((int64_t)blockIdx.x * MOE_GEMV_WARPS + warp) * R;
    if (p0 == p1 || r0 >= n) return; /* the whole warp */
    const int nr = n - r0 < R ? (int)(n - r0) : R;
    const dweight &W = PAIR ? a.gate[e] : a.down[e];
    const dweight &U = PAIR ? a.up[e] : a.down[e];
    const int64_t units = W.k / V;
    for (int q0 = p0; q0 < p1; q0 += MOE_XG_M) {
        const int nb = p1 - q0 < MOE_XG_M ? p1 - q0 : MOE_XG_M;
        const float *xr[MOE_XG_M];
#pragma unroll
        for (int i = 0; i < MOE_XG_M; i++) {
            const int p = q0 + (i < nb ? i : 0);
            xr[i] =
                PAIR ? a.x + (int64_t)(a.list[p] / a.top_k) * a.hidden : a.h + (int64_t)p * a.inner;
        }
        float acc[R][NA][MOE_XG_M];
#pragma unroll
        for (int rr = 0; rr < R; rr++)
#pragma unroll
            for (int q = 0; q < NA; q++)
#pragma unroll
                for (int i = 0; i < MOE_XG_M; i++) acc[rr][q][i] = 0.0f;
        for (int64_t k = lane; k < units; k += 32) {
            float v[R][NA][V];
#pragma unroll
            for (int rr = 0; rr < R; rr++) {
                const int64_t r = r0 + (rr < nr ? rr : 0);
                decode_unit<FMT, BITS>(W, r, k, v[rr][0]);
                if (PAIR) decode_unit<FMT, BITS>(U, r, k, v[rr][NA - 1]);
            }
#pragma unroll
            for (int i = 0; i < MOE_XG_M; i++) {
                if (i >= nb) continue; /* a predicate, not a break: acc stays in registers */
                const float4 *xp = (const float4 *)(xr[i] + k * V);
                float t[R][NA];
#pragma unroll
                for (int rr = 0; rr < R; rr++)
#pragma unroll
                    for (int q = 0; q < NA; q++) t[rr][q] = 0.0f;
#pragma unroll
                for (int j = 0; j < V / 4; j++) { /* dot_units' order, x loaded once */
                    const float4 xv = __ldg(xp + j);
#pragma unroll
                    for (int rr = 0; rr < R; rr++)
#pragma unroll
                        for (int q = 0; q < NA; q++) {
                            t[rr][q] = fmaf(v[rr][q][4 * j], xv.x, t[rr][q]);
                            t[rr][q] = fmaf(v[rr][q][4 * j + 1], xv.y, t[rr][q]);
                            t[rr][q] = fmaf(v[rr][q][4 * j + 2], xv.z, t[rr][q]);
                            t[rr][q] = fmaf(v[rr][q][4 * j + 3], xv.w, t[rr][q]);
                        }
                }
#pragma unroll
                for (int rr = 0; rr < R; rr++)
#pragma unroll
                    for (int q = 0; q < NA; q++) acc[rr][q][i] += t[rr][q];
            }
        }
#pragma unroll
        for (int rr = 0; rr < R; rr++)
#pragma unroll
            for (int q = 0; q < NA; q++)
#pragma unroll
                for (int i = 0; i < MOE_XG_M; i++)
#pragma unroll
                    for (int m = 16; m > 0; m >>= 1)
                        acc[rr][q][i] += __shfl_xor_sync(0xffffffffu, acc[rr][q][i], m);
        if (lane == 0) {
#pragma unroll
            for (int rr = 0; rr < R; rr++) {
                if (rr >= nr) continue;
#pragma unroll
                for (int i = 0; i < MOE_XG_M; i++) {
                    if (i >= nb) continue;
                    if (PAIR)
                        a.h[(int64_t)(q0 + i) * a.inner + r0 + rr] =
                            act_of(acc[rr][0][i], a.gelu) * acc[rr][NA - 1][i];
                    else
                        a.y[(int64_t)a.list[q0 + i] * a.hidden + r0 + rr] = acc[rr][0][i];
                }
            }
        }
    }
}

/* ---- many rows: grouped by expert, on tensor cores ---- */

template <bool PAIR> struct moe_mm_smem {
    union {
        struct {
            __nv_bfloat16 a[MOE_TM][MOE_TK + MOE_TPAD];
            __nv_bfloat16 b[PAIR ? 2 : 1][MOE_TN][MOE_TK + MOE_TPAD];
        } in;
        float c[PAIR ? 2 : 1][MOE_TM][MOE_TN + 4];
    };
    int32_t src[MOE_TM]; /* the tile row's x row (-1: none) */
    int32_t dst[MOE_TM]; /* its output row */
};

/*
 * Tile blockIdx.y of the step's expert tiles (expert e's tiles are [tile0[e], tile0[e + 1]),
 * its entries list[start[e] + 64 j ...]) by output columns [64 blockIdx.x, + 64). PAIR: x rows
 * are the entries' rows of x, outputs h at the entries' list positions, act(gate) * up; else
 * x rows are h at the list positions and outputs the entries' y rows. 4 warps, each a 32 x 32
 * quarter of the tile (as k_gemm).
 */
template <int FMT, int BITS, bool FAST, bool PAIR>
__global__ void __launch_bounds__(128) k_moe_mm(cu_moe_args a)
{
    allow_dependents();
    constexpr int NM = PAIR ? 2 : 1;
    __shared__ __align__(128) moe_mm_smem<PAIR> sm;
    const int E = a.n_experts, tile = blockIdx.y;
    if (tile >= a.tile0[E]) return; /* the whole block: before any barrier */
    int lo = 0, hi = E - 1;         /* the last expert whose first tile is at or before it */
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (a.tile0[mid] <= tile)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int e = lo;
    const int p0 = a.start[e] + (tile - a.tile0[e]) * MOE_TM, left = a.start[e + 1] - p0;
    const int mrows = left < MOE_TM ? left : MOE_TM;
    const dweight W = PAIR ? a.gate[e] : a.down[e];
    const dweight U = PAIR ? a.up[e] : W;
    const float *xs = PAIR ? a.x : a.h;
    const int64_t ldx = PAIR ? a.hidden : a.inner;
    if (threadIdx.x < MOE_TM) {
        const int rr = threadIdx.x, p = p0 + rr;
        sm.src[rr] = rr < mrows ? (PAIR ? a.list[p] / a.top_k : p) : -1;
        sm.dst[rr] = rr < mrows ? (PAIR ? p : a.list[p]) : -1;
    }
    __syncthreads();
    const int64_t n0 = (int64_t)blockIdx.x * MOE_TN;
    const int warp = threadIdx.x >> 5, wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NM][2][2];
#pragma unroll
    for (int q = 0; q < NM; q++)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[q][i][j], 0.0f);
    for (int64_t k0 = 0; k0 < W.k; k0 += MOE_TK) {
        for (int i = threadIdx.x; i < MOE_TM * MOE_TK / 4; i += blockDim.x) {
            const int rr = i / (MOE_TK / 4), cc = (i % (MOE_TK / 4)) * 4, row = sm.src[rr];
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (row >= 0) {
                const float *src = xs + (int64_t)row * ldx + k0 + cc;
                if constexpr (FAST) {
                    v = __ldg((const float4 *)src);
                } else {
                    float t[4];
                    for (int j = 0; j < 4; j++) t[j] = k0 + cc + j < W.k ? src[j] : 0.0f;
                    v = make_float4(t[0], t[1], t[2], t[3]);
                }
            }
            *(__nv_bfloat162 *)&sm.in.a[rr][cc] = __floats2bfloat162_rn(v.x, v.y);
            *(__nv_bfloat162 *)&sm.in.a[rr][cc + 2] = __floats2bfloat162_rn(v.z, v.w);
        }
        load_wtile<FMT, BITS, FAST, MOE_TN, MOE_TK, MOE_TK + MOE_TPAD>(W, n0, k0, sm.in.b[0]);
        if (PAIR)
            load_wtile<FMT, BITS, FAST, MOE_TN, MOE_TK, MOE_TK + MOE_TPAD>(U, n0, k0,
                                                                           sm.in.b[NM - 1]);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MOE_TK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(fa[i], &sm.in.a[wm + 16 * i][kk], MOE_TK + MOE_TPAD);
#pragma unroll
            for (int q = 0; q < NM; q++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
                for (int j = 0; j < 2; j++)
                    wmma::load_matrix_sync(fb[j], &sm.in.b[q][wn + 16 * j][kk], MOE_TK + MOE_TPAD);
#pragma unroll
                for (int i = 0; i < 2; i++)
#pragma unroll
                    for (int j = 0; j < 2; j++)
                        wmma::mma_sync(acc[q][i][j], fa[i], fb[j], acc[q][i][j]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int q = 0; q < NM; q++)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::store_matrix_sync(&sm.c[q][wm + 16 * i][wn + 16 * j], acc[q][i][j],
                                        MOE_TN + 4, wmma::mem_row_major);
    __syncthreads();
    for (int i = threadIdx.x; i < MOE_TM * MOE_TN; i += blockDim.x) {
        const int rr = i / MOE_TN, cc = i % MOE_TN;
        if (rr >= mrows || n0 + cc >= W.n) continue;
        if (PAIR)
            a.h[(int64_t)sm.dst[rr] * a.inner + n0 + cc] =
                act_of(sm.c[0][rr][cc], a.gelu) * sm.c[NM - 1][rr][cc];
        else
            a.y[(int64_t)sm.dst[rr] * a.hidden + n0 + cc] = sm.c[0][rr][cc];
    }
}

/* ---- the rows' sums ---- */

/* out[r, c] = sum over j of y[r * top_k + j, c] * wt[r * top_k + j], j in expert order
 * (route sorted them), from 0 as the CPU's. */
__global__ void k_moe_combine(cu_moe_args a)
{
    allow_dependents();
    const int64_t total = (int64_t)a.rows * a.hidden;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / a.hidden, c = i - r * a.hidden, e0 = r * a.top_k;
        float o = 0.0f;
        for (int j = 0; j < a.top_k; j++) o += a.y[(e0 + j) * a.hidden + c] * a.wt[e0 + j];
        a.out[i] = o;
    }
}

/* ---- launches ---- */

/* Calls F<FMT, BITS>() for w's format (one of those cu_gemv_fast takes). */
#define MOE_DISPATCH(w, CALL)                                                                      \
    do {                                                                                           \
        switch ((w).fmt) {                                                                         \
        case DF_F32:                                                                               \
            CALL(DF_F32, 32);                                                                      \
            break;                                                                                 \
        case DF_F16:                                                                               \
            CALL(DF_F16, 16);                                                                      \
            break;                                                                                 \
        case DF_BF16:                                                                              \
            CALL(DF_BF16, 16);                                                                     \
            break;                                                                                 \
        case DF_MXFP4:                                                                             \
            CALL(DF_MXFP4, 4);                                                                     \
            break;                                                                                 \
        case DF_NVFP4:                                                                             \
            CALL(DF_NVFP4, 4);                                                                     \
            break;                                                                                 \
        case DF_MXFP8:                                                                             \
            CALL(DF_MXFP8, 8);                                                                     \
            break;                                                                                 \
        default:                                                                                   \
            switch ((w).bits) {                                                                    \
            case 2:                                                                                \
                CALL(DF_AFFINE, 2);                                                                \
                break;                                                                             \
            case 3:                                                                                \
                CALL(DF_AFFINE, 3);                                                                \
                break;                                                                             \
            case 4:                                                                                \
                CALL(DF_AFFINE, 4);                                                                \
                break;                                                                             \
            case 5:                                                                                \
                CALL(DF_AFFINE, 5);                                                                \
                break;                                                                             \
            case 6:                                                                                \
                CALL(DF_AFFINE, 6);                                                                \
                break;                                                                             \
            default:                                                                               \
                CALL(DF_AFFINE, 8);                                                                \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Whether whole units decode: every expert's matrix of the kind laid out as expert 0's, a
 * layout the unit decoders take, and x rows (of w.k floats) 16-byte aligned. */
static bool units_ok(const cu_moe_args &a, bool pair, const float *x)
{
    return (pair ? a.uniform_gu : a.uniform_down) && cu_gemv_fast(pair ? a.ex_gu : a.ex_down) &&
           (uintptr_t)x % 16 == 0;
}

template <bool PAIR> static void launch_gemv(cudaStream_t s, const cu_moe_args &a)
{
    const dweight &w = PAIR ? a.ex_gu : a.ex_down;
    const int64_t n = PAIR ? a.inner : a.hidden;
    const int ny = PAIR ? a.rows * a.top_k : a.rows;
    const dim3 grid((unsigned)((n + MOE_GEMV_WARPS - 1) / MOE_GEMV_WARPS),
                    (unsigned)(ny < 65535 ? ny : 65535));
    if (!units_ok(a, PAIR, PAIR ? a.x : a.h)) {
        k_moe_gemv<-1, 0, PAIR><<<grid, MOE_GEMV_WARPS * 32, 0, s>>>(a);
        CU_LAUNCHED();
        return;
    }
#define GEMV_CALL(F, B) k_moe_gemv<F, B, PAIR><<<grid, MOE_GEMV_WARPS * 32, 0, s>>>(a)
    MOE_DISPATCH(w, GEMV_CALL);
#undef GEMV_CALL
    CU_LAUNCHED();
}

template <bool PAIR> static void launch_mm(cudaStream_t s, const cu_moe_args &a)
{
    const dweight &w = PAIR ? a.ex_gu : a.ex_down;
    const int64_t n = PAIR ? a.inner : a.hidden;
    const int np = a.rows * a.top_k;
    /* sum over experts of ceil(count / 64) <= np / 64 + (experts with entries) */
    const int tiles = (np + MOE_TM - 1) / MOE_TM + (a.n_experts < np ? a.n_experts : np);
    const dim3 grid((unsigned)((n + MOE_TN - 1) / MOE_TN), (unsigned)tiles);
    if (!units_ok(a, PAIR, PAIR ? a.x : a.h) || w.k % MOE_TK) {
        k_moe_mm<DF_F32, 32, false, PAIR><<<grid, 128, 0, s>>>(a);
        CU_LAUNCHED();
        return;
    }
#define MM_CALL(F, B) k_moe_mm<F, B, true, PAIR><<<grid, 128, 0, s>>>(a)
    MOE_DISPATCH(w, MM_CALL);
#undef MM_CALL
    CU_LAUNCHED();
}

template <int FMT, int BITS, bool PAIR>
static void launch_xgemv_fmt(cudaStream_t s, const cu_moe_args &a)
{
    constexpr int R = xg_rows<unit_traits<FMT, BITS>::vals>::n;
    const int64_t n = PAIR ? a.inner : a.hidden, per = (int64_t)MOE_GEMV_WARPS * R;
    const dim3 grid((unsigned)((n + per - 1) / per), (unsigned)a.n_experts);
    k_moe_xgemv<FMT, BITS, PAIR><<<grid, MOE_GEMV_WARPS * 32, 0, s>>>(a);
}

template <bool PAIR> static void launch_xgemv(cudaStream_t s, const cu_moe_args &a)
{
    const dweight &w = PAIR ? a.ex_gu : a.ex_down;
#define XGEMV_CALL(F, B) launch_xgemv_fmt<F, B, PAIR>(s, a)
    MOE_DISPATCH(w, XGEMV_CALL);
#undef XGEMV_CALL
    CU_LAUNCHED();
}

bool cu_moe_streamed(const cu_moe_args &a)
{
    return a.grouped && units_ok(a, true, a.x) && units_ok(a, false, a.h) &&
           (a.exact || (int64_t)(a.rows < CU_MOE_CHUNK ? a.rows : CU_MOE_CHUNK) * a.top_k <=
                           (int64_t)MOE_XG_PER_EXPERT * a.n_experts);
}

static unsigned combine_blocks(int64_t n)
{
    const int64_t b = (n + 255) / 256;
    return (unsigned)(b > 65535 * 16 ? 65535 * 16 : b);
}

static void route(cudaStream_t s, const cu_moe_args &a)
{
    const int E = a.n_experts;
    if (E > 32 * 32 || a.top_k > 32) {
        const size_t smem = sizeof(float) * (size_t)E + 8 * (size_t)a.top_k;
        k_moe_route<<<(unsigned)a.rows, ROUTE_THREADS, smem, s>>>(a);
        CU_LAUNCHED();
        return;
    }
    const unsigned blocks = (unsigned)((a.rows + ROUTE_THREADS / 32 - 1) / (ROUTE_THREADS / 32));
    if (E <= 32)
        k_moe_route_warp<1><<<blocks, ROUTE_THREADS, 0, s>>>(a);
    else if (E <= 64)
        k_moe_route_warp<2><<<blocks, ROUTE_THREADS, 0, s>>>(a);
    else if (E <= 128)
        k_moe_route_warp<4><<<blocks, ROUTE_THREADS, 0, s>>>(a);
    else if (E <= 256)
        k_moe_route_warp<8><<<blocks, ROUTE_THREADS, 0, s>>>(a);
    else if (E <= 512)
        k_moe_route_warp<16><<<blocks, ROUTE_THREADS, 0, s>>>(a);
    else
        k_moe_route_warp<32><<<blocks, ROUTE_THREADS, 0, s>>>(a);
    CU_LAUNCHED();
}

void cu_moe(cudaStream_t s, const cu_moe_args &a0)
{
    for (int r0 = 0; r0 < a0.rows; r0 += CU_MOE_CHUNK) {
        cu_moe_args a = a0;
        a.rows = a0.rows - r0 < CU_MOE_CHUNK ? a0.rows - r0 : CU_MOE_CHUNK;
        a.x += (int64_t)r0 * a.hidden;
        a.router += (int64_t)r0 * a.n_experts;
        a.out += (int64_t)r0 * a.hidden;
        route(s, a);
        /* few entries an expert (or the batch-invariant mode): the weights streamed once per
         * MOE_XG_M entries, each entry's result the few-row path's; else tiles of 64 */
        const bool xg = cu_moe_streamed(a);
        if (!a.grouped || (a.exact && !xg)) {
            launch_gemv<true>(s, a);
            launch_gemv<false>(s, a); /* adds the entries into out itself */
            continue;
        }
        k_moe_group<<<1, GROUP_THREADS, sizeof(int32_t) * (size_t)a.n_experts, s>>>(a);
        CU_LAUNCHED();
        if (xg) {
            launch_xgemv<true>(s, a);
            launch_xgemv<false>(s, a);
        } else {
            launch_mm<true>(s, a);
            launch_mm<false>(s, a);
        }
        k_moe_combine<<<combine_blocks((int64_t)a.rows * a.hidden), 256, 0, s>>>(a);
        CU_LAUNCHED();
    }
}
