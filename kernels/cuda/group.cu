/*
 * Collectives of a tensor-parallel group of GPUs on one host (model/tp.h), through NCCL,
 * which is loaded when a group is first made (libnccl.so.2): a build needs no NCCL headers,
 * and a server that runs on one GPU needs no NCCL at all. The few entry points used are
 * declared here as NCCL's API states them.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.cuh"

typedef int nccl_result; /* ncclResult_t: 0 is ncclSuccess */
typedef struct {
    char internal[128]; /* ncclUniqueId */
} nccl_unique_id;

enum { NCCL_FLOAT32 = 7 }; /* ncclFloat32 */
enum { NCCL_SUM = 0 };     /* ncclSum */

static struct {
    int tried, ok;
    char why[256];
    nccl_result (*comm_init_all)(void **comms, int ndev, const int *devs);
    nccl_result (*comm_destroy)(void *comm);
    nccl_result (*all_reduce)(const void *send, void *recv, size_t count, int dtype, int op,
                              void *comm, cudaStream_t s);
    nccl_result (*all_gather)(const void *send, void *recv, size_t count, int dtype, void *comm,
                              cudaStream_t s);
    nccl_result (*group_start)(void);
    nccl_result (*group_end)(void);
    const char *(*error_string)(nccl_result r);
    nccl_result (*get_version)(int *v);
} nccl;

static int nccl_load(void)
{
    if (nccl.tried) return nccl.ok;
    nccl.tried = 1;
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(nccl.why, sizeof nccl.why, "NCCL (libnccl.so.2) could not be loaded: %s",
                 dlerror());
        return 0;
    }
#define SYM(field, name)                                                                           \
    if (!(*(void **)&nccl.field = dlsym(h, name))) {                                               \
        snprintf(nccl.why, sizeof nccl.why, "libnccl.so.2 lacks %s", name);                        \
        return 0;                                                                                  \
    }
    SYM(comm_init_all, "ncclCommInitAll")
    SYM(comm_destroy, "ncclCommDestroy")
    SYM(all_reduce, "ncclAllReduce")
    SYM(all_gather, "ncclAllGather")
    SYM(group_start, "ncclGroupStart")
    SYM(group_end, "ncclGroupEnd")
    SYM(error_string, "ncclGetErrorString")
    SYM(get_version, "ncclGetVersion")
#undef SYM
    nccl.ok = 1;
    return 1;
}

int cu_group_init(void **comms, int n, const int *devs, char *msg, size_t msg_n)
{
    if (!nccl_load()) {
        snprintf(msg, msg_n, "%s", nccl.why);
        return -1;
    }
    /* every connection made now, not at a collective's first use, which may be while a
     * step's graph is being captured */
    setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    nccl_result r = nccl.comm_init_all(comms, n, devs);
    if (r) {
        snprintf(msg, msg_n, "ncclCommInitAll over %d GPUs: %s", n, nccl.error_string(r));
        return -1;
    }
    /* one sum over the group, outside any capture, before the first step */
    float *one[64];
    nccl.group_start();
    for (int i = 0; i < n; i++) {
        CU(cudaSetDevice(devs[i]));
        CU(cudaMalloc(&one[i], sizeof(float)));
        CU(cudaMemset(one[i], 0, sizeof(float)));
        r = r ? r : nccl.all_reduce(one[i], one[i], 1, NCCL_FLOAT32, NCCL_SUM, comms[i], 0);
    }
    nccl_result g = nccl.group_end();
    for (int i = 0; i < n; i++) {
        CU(cudaSetDevice(devs[i]));
        CU(cudaDeviceSynchronize());
        CU(cudaFree(one[i]));
    }
    if (r || g) {
        snprintf(msg, msg_n, "a first all-reduce over %d GPUs: %s", n,
                 nccl.error_string(r ? r : g));
        return -1;
    }
    return 0;
}

void cu_group_leave(void *comm)
{
    if (comm && nccl.ok) nccl.comm_destroy(comm);
}

static void check(nccl_result r, const char *what)
{
    if (r) cu_fatal(what, nccl.error_string(r), __FILE__, __LINE__);
}

void cu_all_reduce(cudaStream_t s, void *comm, float *x, int64_t n)
{
    check(nccl.all_reduce(x, x, (size_t)n, NCCL_FLOAT32, NCCL_SUM, comm, s), "ncclAllReduce");
}

void cu_all_gather(cudaStream_t s, void *comm, float *out, const float *in, float *scratch,
                   int size, int rows, int cols)
{
    size_t part = (size_t)rows * (size_t)cols;
    check(nccl.all_gather(in, scratch, part, NCCL_FLOAT32, comm, s), "ncclAllGather");
    /* [size][rows][cols] -> [rows][size * cols] */
    const size_t w = sizeof(float) * (size_t)cols;
    for (int r = 0; r < size; r++)
        CU(cudaMemcpy2DAsync(out + (size_t)r * cols, w * (size_t)size, scratch + (size_t)r * part,
                             w, w, (size_t)rows, cudaMemcpyDeviceToDevice, s));
}

/* ---- the one-shot all-reduce over peer memory ----
 *
 * For the small sums of a decode step (a few rows of the hidden size) NCCL's latency is most
 * of an exchange. Here every GPU of the group maps every other's memory (peer access over
 * NVLink or PCIe), and one kernel does the exchange: each block writes its piece of the
 * local rows into every rank's receive buffer (this rank's slot there), raises its flag in
 * every rank, and waits until every block of every rank has raised its flag here; then the
 * rows are all local, and the blocks add the slots up in rank order, so every rank computes
 * the same bits. The fused form goes on: x += sum, then out = rms_norm(x) * w (and its bf16
 * copy), the residual add and the norm that follow the exchange in every layer.
 *
 * Safety without a second barrier: the receive buffer alternates between two halves by the
 * call's count, and a rank that starts call k + 1 has seen every rank's flags of call k, so
 * no rank still reads the half of call k - 1 that it then overwrites. Every call runs the
 * same AR_BLOCKS blocks, so every block's count is the call's count on every rank. The
 * counts and flags live in device memory and are advanced by the kernel, so that a captured
 * graph replays the exchange as it is. */

struct cu_ar {
    cu_ar_peers p; /* every rank's receive buffer and flags; this rank's counts */
    int dev;
};

static __device__ __forceinline__ unsigned ld_acquire_sys(const unsigned *a)
{
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
    return v;
}

static __device__ __forceinline__ void st_release_sys(unsigned *a, unsigned v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}

/* The sum over the ranks' slots of float4 i (slots of AR_MAX_FLOATS from in), in rank order:
 * every load first, then the adds. */
static __device__ __forceinline__ float4 ar_sum4(const float *in, int size, int64_t i)
{
    float4 v[AR_MAX_RANKS];
#pragma unroll
    for (int r = 0; r < AR_MAX_RANKS; r++)
        if (r < size) v[r] = __ldcg((const float4 *)(in + (size_t)r * AR_MAX_FLOATS) + i);
    float4 s = v[0];
#pragma unroll
    for (int r = 1; r < AR_MAX_RANKS; r++)
        if (r < size) {
            s.x += v[r].x;
            s.y += v[r].y;
            s.z += v[r].z;
            s.w += v[r].w;
        }
    return s;
}

template <bool NORM>
__global__ void __launch_bounds__(AR_THREADS)
    k_all_reduce(cu_ar_peers P, int rank, int size, float *y, float *x, float *out,
                 const float *__restrict__ w, __nv_bfloat16 *ob, int rows, int dim, int64_t n,
                 float eps)
{
    __shared__ unsigned s_epoch;
    __shared__ float sh[32];
    const int b = blockIdx.x, t = threadIdx.x;
    const int64_t n4 = n / 4, per = (n4 + AR_BLOCKS - 1) / AR_BLOCKS;
    const int64_t lo = min((int64_t)b * per, n4), hi = min(lo + per, n4);
    if (t == 0) {
        const unsigned e = P.count[b] + 1;
        P.count[b] = e;
        s_epoch = e;
    }
    __syncthreads();
    const unsigned epoch = s_epoch;
    const size_t half = (size_t)(epoch & 1) * (size_t)size * AR_MAX_FLOATS;
    const size_t slot = half + (size_t)rank * AR_MAX_FLOATS;
    /* 1. the block's piece of this rank's rows into every rank's slot for it */
    const float4 *y4 = (const float4 *)y;
    for (int64_t i = lo + t; i < hi; i += AR_THREADS) {
        const float4 v = y4[i];
#pragma unroll
        for (int r = 0; r < AR_MAX_RANKS; r++)
            if (r < size) ((float4 *)(P.buf[r] + slot))[i] = v;
    }
    /* 2. this block's flag in every rank; then every block's of every rank here */
    __syncthreads();
    if (t < size) {
        __threadfence_system();
        st_release_sys(P.sig[t] + b * AR_MAX_RANKS + rank, epoch);
    }
    if (t < AR_BLOCKS * size) {
        const unsigned *f = P.sig[rank] + (t / size) * AR_MAX_RANKS + t % size;
        while ((int)(ld_acquire_sys(f) - epoch) < 0) {
        }
    }
    __syncthreads();
    /* 3. the sums, from this rank's memory */
    const float *in = P.buf[rank] + half;
    if (!NORM) {
        for (int64_t i = lo + t; i < hi; i += AR_THREADS) ((float4 *)y)[i] = ar_sum4(in, size, i);
        return;
    }
    float4 *x4 = (float4 *)x;
    const float4 *w4 = (const float4 *)w;
    const int d4 = dim / 4;
    for (int r = b; r < rows; r += AR_BLOCKS) { /* a row a block */
        const int64_t r0 = (int64_t)r * d4;
        float ss = 0.0f;
        for (int j = t; j < d4; j += AR_THREADS) {
            const float4 s = ar_sum4(in, size, r0 + j);
            float4 v = x4[r0 + j];
            v.x += s.x;
            v.y += s.y;
            v.z += s.z;
            v.w += s.w;
            x4[r0 + j] = v;
            ss = fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, ss))));
        }
        const float inv = rsqrtf(block_sum(ss, sh) / (float)dim + eps);
        for (int j = t; j < d4; j += AR_THREADS) { /* each thread rereads what it wrote */
            const float4 v = x4[r0 + j], g = w4[j];
            const float4 o =
                make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
            if (out) ((float4 *)out)[r0 + j] = o;
            if (ob) {
                __nv_bfloat162 *o2 = (__nv_bfloat162 *)ob + 2 * (r0 + j);
                o2[0] = __floats2bfloat162_rn(o.x, o.y);
                o2[1] = __floats2bfloat162_rn(o.z, o.w);
            }
        }
    }
}

cu_ar *cu_ar_create(int n, const int *devs, char *why, size_t why_n)
{
    if (n < 2 || n > AR_MAX_RANKS) {
        snprintf(why, why_n, "%d GPUs (2 to %d)", n, AR_MAX_RANKS);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            int ok = 0;
            if (i != j && cudaDeviceCanAccessPeer(&ok, devs[i], devs[j]) == cudaSuccess && !ok) {
                snprintf(why, why_n, "cuda:%d cannot map the memory of cuda:%d", devs[i], devs[j]);
                return NULL;
            }
        }
    for (int i = 0; i < n; i++) {
        CU(cudaSetDevice(devs[i]));
        for (int j = 0; j < n; j++) {
            if (i == j) continue;
            cudaError_t r = cudaDeviceEnablePeerAccess(devs[j], 0);
            if (r == cudaErrorPeerAccessAlreadyEnabled) {
                cudaGetLastError();
            } else if (r != cudaSuccess) {
                cudaGetLastError();
                snprintf(why, why_n, "cuda:%d: peer access to cuda:%d: %s", devs[i], devs[j],
                         cudaGetErrorString(r));
                return NULL;
            }
        }
    }
    cu_ar *a = (cu_ar *)calloc((size_t)n, sizeof *a);
    if (!a) cu_fatal("calloc", "out of host memory", __FILE__, __LINE__);
    float *buf[AR_MAX_RANKS];
    unsigned *sig[AR_MAX_RANKS];
    for (int i = 0; i < n; i++) {
        CU(cudaSetDevice(devs[i]));
        const size_t sig_bytes = sizeof(unsigned) * AR_BLOCKS * (AR_MAX_RANKS + 1);
        CU(cudaMalloc(&buf[i], sizeof(float) * 2 * (size_t)n * AR_MAX_FLOATS));
        CU(cudaMalloc(&sig[i], sig_bytes));
        CU(cudaMemset(sig[i], 0, sig_bytes));
        a[i].dev = devs[i];
        a[i].p.count = sig[i] + AR_BLOCKS * AR_MAX_RANKS;
    }
    for (int i = 0; i < n; i++) {
        CU(cudaSetDevice(devs[i]));
        CU(cudaDeviceSynchronize());
        for (int j = 0; j < n; j++) {
            a[i].p.buf[j] = buf[j];
            a[i].p.sig[j] = sig[j];
        }
    }
    return a;
}

const cu_ar_peers *cu_ar_rank(cu_ar *a, int rank)
{
    return &a[rank].p;
}

void cu_ar_leave(cu_ar *a, int rank)
{
    if (!a) return;
    CU(cudaSetDevice(a[rank].dev));
    CU(cudaFree(a[rank].p.buf[rank]));
    CU(cudaFree(a[rank].p.sig[rank]));
    if (rank == 0) free(a);
}

bool cu_ar_fits(int64_t n, const void *y, const void *x, const void *out, const void *w,
                const void *ob)
{
    return n > 0 && n <= AR_MAX_FLOATS && n % 4 == 0 &&
           (((uintptr_t)y | (uintptr_t)x | (uintptr_t)out | (uintptr_t)w) & 15) == 0 &&
           ((uintptr_t)ob & 7) == 0;
}

void cu_ar_run(cudaStream_t s, const cu_ar_peers *P, int rank, int size, float *y, float *x,
               float *out, const float *w, __nv_bfloat16 *ob, int rows, int dim, int64_t n,
               float eps)
{
    if (x)
        k_all_reduce<true>
            <<<AR_BLOCKS, AR_THREADS, 0, s>>>(*P, rank, size, y, x, out, w, ob, rows, dim, n, eps);
    else
        k_all_reduce<false><<<AR_BLOCKS, AR_THREADS, 0, s>>>(*P, rank, size, y, NULL, NULL, NULL,
                                                             NULL, 0, 0, n, 0.0f);
    CU_LAUNCHED();
}
