/*
 * The outputs of the one-row streaming kernels (k_gemv_stream for 16-bit weights,
 * k_gemv_q4_stream for affine 4-bit): what a task is and how its sums leave the kernel,
 * with the residual add, the gated activation or rope and the KV store fused.
 */
#ifndef PAGODA_KERNELS_CUDA_GEMV_OUT_CUH
#define PAGODA_KERNELS_CUDA_GEMV_OUT_CUH

#include "kernels/cuda/cuda.cuh"

/* What a task of the streaming kernel is: one output row (of one of the set's matrices),
 * the same row of gate and up (then act(gate) * up), or rows j and j + d/2 of one head of
 * q, k or v, which leave rotated (q, k) and, for k and v, stored into the KV cache. */
enum { SM_ROWS, SM_PAIR, SM_ROPE };

/* The rope task t: matrix wi (q, k, v), the head in it and the dimension j (its rows
 * head * d + j and head * d + j + d/2). */
struct rope_task {
    int wi, head, j;
};

static __device__ __forceinline__ rope_task rope_of(const cu_gemv_set &g, int64_t t)
{
    const int half = g.rope_half, d = 2 * half, ti = (int)t, hh = ti / half;
    const int hq = (int)(g.w[0].n / d), hkv = (int)(g.w[1].n / d);
    rope_task r;
    r.j = ti - hh * half;
    r.wi = hh < hq ? 0 : hh < hq + hkv ? 1 : 2;
    r.head = hh - (r.wi == 0 ? 0 : r.wi == 1 ? hq : hq + hkv);
    return r;
}

/* The matrix of the set's row r (counted over its matrices in order) and the row in it. */
static __device__ __forceinline__ int set_row(const cu_gemv_set &g, int64_t r, int64_t *rl)
{
    int wi = 0;
    while (wi + 1 < g.nw && r >= g.row_end[wi]) wi++;
    *rl = wi ? r - g.row_end[wi - 1] : r;
    return wi;
}

/* The matrix and the row in it of row a (0: the first, 1: the second) of task t. */
template <int MODE>
static __device__ __forceinline__ int task_row(const cu_gemv_set &g, int64_t t, int a, int64_t *rl)
{
    if (MODE == SM_ROWS) return set_row(g, t, rl);
    if (MODE == SM_PAIR) {
        *rl = t;
        return a;
    }
    const rope_task r = rope_of(g, t);
    *rl = (int64_t)r.head * 2 * g.rope_half + r.j + a * g.rope_half;
    return r.wi;
}

/* What a task's outputs read besides its sums: the residual row (plain rows with the add),
 * the rope angle's cosine and sine (q/k/v; the cache slot, one word every warp reads, is
 * left to the end). Loaded ahead of the task's end (stream_ep_load), so that no load from
 * L2 waits between its last sums and its stores. */
struct stream_ep {
    float r, cs, sn;
};

template <int MODE>
static __device__ __forceinline__ void stream_ep_load(const cu_gemv_set &g, int64_t t, stream_ep &e)
{
    if (MODE == SM_ROWS) {
        if (g.resid) e.r = __ldcg(g.resid + t); /* one matrix: t is its row */
    } else if (MODE == SM_ROPE) {
        const rope_task r = rope_of(g, t);
        if (r.wi < 2) {
            e.cs = g.rcos[r.j];
            e.sn = g.rsin[r.j];
        }
    }
}

/* The outputs of a finished task (one thread; a and b: the sums of its first and second
 * row; e: its stream_ep_load). */
template <int MODE>
static __device__ __forceinline__ void stream_out_ep(const cu_gemv_set &g, int64_t t, float a,
                                                     float b, const stream_ep &e)
{
    if (MODE == SM_PAIR) {
        g.y[0][t] = act_of(a, g.gelu) * b;
        g.y[1][t] = b;
    } else if (MODE == SM_ROWS) {
        int64_t rl;
        const int wi = set_row(g, t, &rl);
        g.y[wi][rl] = a;
        if (g.resid) g.resid[t] = e.r + a;
    } else {
        const rope_task r = rope_of(g, t);
        const int half = g.rope_half;
        if (r.wi < 2) { /* as k_rope_kv */
            const float ra = a * e.cs - b * e.sn, rb = b * e.cs + a * e.sn;
            a = ra;
            b = rb;
        }
        const int64_t r0 = (int64_t)r.head * 2 * half + r.j;
        float *y = r.wi == 0 ? g.y[0] : r.wi == 1 ? g.y[1] : g.y[2];
        y[r0] = a;
        y[r0 + half] = b;
        if (r.wi) {
            __nv_bfloat16 *cache = (r.wi == 1 ? g.kc : g.vc) + (int64_t)g.slot[0] * g.w[1].n;
            cache[r0] = __float2bfloat16_rn(a);
            cache[r0 + half] = __float2bfloat16_rn(b);
        }
    }
}

/* The same with its inputs loaded now. */
template <int MODE>
static __device__ __forceinline__ void stream_out(const cu_gemv_set &g, int64_t t, float a, float b)
{
    stream_ep e = {0.0f, 0.0f, 0.0f};
    stream_ep_load<MODE>(g, t, e);
    stream_out_ep<MODE>(g, t, a, b, e);
}

#endif
