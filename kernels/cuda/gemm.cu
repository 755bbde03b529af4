/*
 * Matrix products for larger m (prefill, large decode batches): tensor cores with bf16
 * operands and float32 accumulation. bf16 weights go through cuBLASLt (activations are
 * rounded to bf16 first); the other formats through a tiled WMMA kernel that decodes each
 * 64 x 64 weight tile into shared memory as bf16 (no full-matrix expansion).
 */
#include <mma.h>
#include <stdio.h>

#include "kernels/cuda/cuda.cuh"

using namespace nvcuda;

static void lt_fatal(cublasStatus_t st, const char *what, const char *file, int line)
{
    char msg[64];
    snprintf(msg, sizeof msg, "cuBLAS status %d", (int)st);
    cu_fatal(what, msg, file, line);
}

#define LT(call)                                                                                   \
    do {                                                                                           \
        cublasStatus_t lt_s_ = (call);                                                             \
        if (lt_s_ != CUBLAS_STATUS_SUCCESS) lt_fatal(lt_s_, #call, __FILE__, __LINE__);            \
    } while (0)

#define TM   64
#define TN   64
#define TK   64
#define TPAD 8

struct gemm_smem {
    union {
        struct {
            __nv_bfloat16 a[TM][TK + TPAD];
            __nv_bfloat16 b[TN][TK + TPAD];
        } in;
        float c[TM][TN + 4];
    };
};

template <int FMT, int BITS, bool FAST>
__global__ void __launch_bounds__(128)
    k_gemm(dweight W, const float *__restrict__ x, float *__restrict__ y, int m)
{
    allow_dependents();
    __shared__ __align__(128) gemm_smem sm;
    const int64_t n0 = (int64_t)blockIdx.x * TN;
    const int m0 = blockIdx.y * TM;
    const int warp = threadIdx.x >> 5;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    for (int64_t k0 = 0; k0 < W.k; k0 += TK) {
        /* x tile: TM rows x TK floats -> bf16 */
        for (int i = threadIdx.x; i < TM * TK / 4; i += blockDim.x) {
            int rr = i / (TK / 4), cc = (i % (TK / 4)) * 4;
            int row = m0 + rr;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (row < m) {
                const float *src = x + (int64_t)row * W.k + k0 + cc;
                if (FAST) {
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
        load_wtile<FMT, BITS, FAST, TN, TK, TK + TPAD>(W, n0, k0, sm.in.b);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
            for (int i = 0; i < 2; i++)
                wmma::load_matrix_sync(fa[i], &sm.in.a[wm + 16 * i][kk], TK + TPAD);
#pragma unroll
            for (int j = 0; j < 2; j++)
                wmma::load_matrix_sync(fb[j], &sm.in.b[wn + 16 * j][kk], TK + TPAD);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&sm.c[wm + 16 * i][wn + 16 * j], acc[i][j], TN + 4,
                                    wmma::mem_row_major);
    __syncthreads();
    for (int i = threadIdx.x; i < TM * TN; i += blockDim.x) {
        int rr = i / TN, cc = i % TN;
        if (m0 + rr < m && n0 + cc < W.n) y[(int64_t)(m0 + rr) * W.n + n0 + cc] = sm.c[rr][cc];
    }
}

template <int FMT, int BITS>
static void launch_tc(cudaStream_t s, const dweight &w, const float *x, int m, float *y)
{
    dim3 grid((unsigned)((w.n + TN - 1) / TN), (unsigned)((m + TM - 1) / TM));
    if (cu_gemv_fast(w) && w.k % TK == 0)
        k_gemm<FMT, BITS, true><<<grid, 128, 0, s>>>(w, x, y, m);
    else
        k_gemm<FMT, BITS, false><<<grid, 128, 0, s>>>(w, x, y, m);
    CU_LAUNCHED();
}

static void gemm_tc(cudaStream_t s, const dweight &w, const float *x, int m, float *y)
{
    switch (w.fmt) {
    case DF_F32:
        return launch_tc<DF_F32, 32>(s, w, x, m, y);
    case DF_F16:
        return launch_tc<DF_F16, 16>(s, w, x, m, y);
    case DF_BF16:
        return launch_tc<DF_BF16, 16>(s, w, x, m, y);
    case DF_MXFP4:
        return launch_tc<DF_MXFP4, 4>(s, w, x, m, y);
    case DF_NVFP4:
        return launch_tc<DF_NVFP4, 4>(s, w, x, m, y);
    case DF_MXFP8:
        return launch_tc<DF_MXFP8, 8>(s, w, x, m, y);
    default:
        switch (w.bits) {
        case 2:
            return launch_tc<DF_AFFINE, 2>(s, w, x, m, y);
        case 3:
            return launch_tc<DF_AFFINE, 3>(s, w, x, m, y);
        case 4:
            return launch_tc<DF_AFFINE, 4>(s, w, x, m, y);
        case 5:
            return launch_tc<DF_AFFINE, 5>(s, w, x, m, y);
        case 6:
            return launch_tc<DF_AFFINE, 6>(s, w, x, m, y);
        default:
            return launch_tc<DF_AFFINE, 8>(s, w, x, m, y);
        }
    }
}

/* Up to `want` of cuBLASLt's candidate algorithms for plan p's shape, best first, within
 * the workspace; the number found (0: none). */
static int lt_candidates(cu_gemm_ctx *g, const cu_lt_plan *p, cublasLtMatmulHeuristicResult_t *res,
                         int want)
{
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &g->workspace_bytes, sizeof g->workspace_bytes));
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->a, p->b, p->c, p->c, pref,
                                                       want, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    return st == CUBLAS_STATUS_SUCCESS ? found : 0;
}

/* y = xb . W^T (accumulate: y += xb . W^T, y being C and D at once) with plan p and
 * algorithm algo on stream s; y float32, or bf16 with a plan of bf16 results. */
static cublasStatus_t lt_run(cudaStream_t s, cu_gemm_ctx *g, const cu_lt_plan *p, const void *w,
                             const __nv_bfloat16 *xb, void *y, const cublasLtMatmulAlgo_t *algo,
                             void *workspace, bool accumulate = false)
{
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return cublasLtMatmul(g->lt, p->op, &one, w, p->a, xb, p->b, &beta, y, p->c, y, p->c, algo,
                          workspace, g->workspace_bytes, s);
}

/* The cached cuBLASLt plan for y[m, n] = xb[m, k] . W^T, y float32 or (ob) bf16 (ok = 0
 * when there is none). */
static cu_lt_plan *lt_plan(cu_gemm_ctx *g, int m, int n, int k, int ob = 0)
{
    for (int i = 0; i < g->n_plans; i++)
        if (g->plans[i].m == m && g->plans[i].n == n && g->plans[i].k == k && g->plans[i].ob == ob)
            return &g->plans[i];
    int slot = g->n_plans < CU_LT_PLANS ? g->n_plans++ : (g->next_plan++ % CU_LT_PLANS);
    cu_lt_plan *p = &g->plans[slot];
    if (p->op) {
        cublasLtMatmulDescDestroy(p->op);
        cublasLtMatrixLayoutDestroy(p->a);
        cublasLtMatrixLayoutDestroy(p->b);
        cublasLtMatrixLayoutDestroy(p->c);
    }
    *p = cu_lt_plan{};
    /* Column-major view: y^T [n, m] = W [k, n]^T . xb^T [k, m]. */
    LT(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k, n, k));
    LT(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k, m, k));
    LT(cublasLtMatrixLayoutCreate(&p->c, ob ? CUDA_R_16BF : CUDA_R_32F, n, m, n));
    cublasLtMatmulHeuristicResult_t res;
    p->m = m;
    p->n = n;
    p->k = k;
    p->ob = ob;
    p->ok = lt_candidates(g, p, &res, 1) > 0;
    if (p->ok) p->algo = res.algo;
    return p;
}

static bool lt_usable(const dweight &w)
{
    return w.fmt == DF_BF16 && w.k % 8 == 0;
}

bool cu_gemm_lt_ok(cu_gemm_ctx *g, const dweight &w, int m)
{
    return lt_usable(w) && lt_plan(g, m, (int)w.n, (int)w.k)->ok;
}

bool cu_gemm_lt_b16_ok(cu_gemm_ctx *g, const dweight &w, int m)
{
    return lt_usable(w) && lt_plan(g, m, (int)w.n, (int)w.k, 1)->ok;
}

void cu_gemm_lt_b16(cudaStream_t s, cu_gemm_ctx *g, const dweight &w, const __nv_bfloat16 *xb,
                    int m, __nv_bfloat16 *y, void *workspace)
{
    cu_lt_plan *p = lt_plan(g, m, (int)w.n, (int)w.k, 1);
    if (!p->ok) cu_fatal("cu_gemm_lt_b16", "no cuBLASLt plan for this shape", __FILE__, __LINE__);
    LT(lt_run(s, g, p, w.w, xb, y, &p->algo, workspace));
}

void cu_gemm_lt(cudaStream_t s, cu_gemm_ctx *g, const dweight &w, const __nv_bfloat16 *xb, int m,
                float *y, void *workspace, bool accumulate)
{
    cu_lt_plan *p = lt_plan(g, m, (int)w.n, (int)w.k);
    if (!p->ok) cu_fatal("cu_gemm_lt", "no cuBLASLt plan for this shape", __FILE__, __LINE__);
    LT(lt_run(s, g, p, w.w, xb, y, &p->algo, workspace, accumulate));
}

void cu_gemm(cudaStream_t s, cu_gemm_ctx *g, const dweight &w, const float *x, int m, float *y,
             __nv_bfloat16 *xb, bool accumulate)
{
    cu_lt_plan *p = lt_usable(w) ? lt_plan(g, m, (int)w.n, (int)w.k) : NULL;
    if (p && p->ok) {
        cu_to_bf16(s, xb, x, (int64_t)m * w.k);
        LT(lt_run(s, g, p, w.w, xb, y, &p->algo, g->workspace, accumulate));
        return;
    }
    if (accumulate)
        cu_fatal("cu_gemm", "accumulating product without cuBLASLt", __FILE__, __LINE__);
    gemm_tc(s, w, x, m, y);
}

void cu_gemm_ctx_destroy(cu_gemm_ctx *g)
{
    for (int i = 0; i < g->n_plans; i++) {
        cu_lt_plan *p = &g->plans[i];
        if (!p->op) continue;
        cublasLtMatmulDescDestroy(p->op);
        cublasLtMatrixLayoutDestroy(p->a);
        cublasLtMatrixLayoutDestroy(p->b);
        cublasLtMatrixLayoutDestroy(p->c);
    }
    g->n_plans = 0;
}
