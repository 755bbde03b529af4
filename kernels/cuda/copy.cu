/*
 * The copy engine of the host-memory KV tier (paged_kv/kv_host.h): block copies between the
 * device KV pool and mapped pinned host memory on a stream of their own, so that they overlap
 * the steps. A block's pieces (each KV layer's K and V rows, cu_copier_setup) are gathered
 * into its host slot, or scattered back, by one kernel per batch that reads and writes host
 * memory over the bus directly: a batch of up to CU_COPY_BATCH blocks is one launch instead
 * of two cudaMemcpyAsync calls per layer and block (64 per block of a 32-layer model, each
 * moving 32 KiB: about 3 GB/s measured on an H200). The recurrent-state slots of hybrid
 * models (each linear-attention layer's conv rows and delta-rule matrix) move the same way,
 * as units of a second kind with pieces of their own. Blocks queue on the host until the next
 * mark or fence (one engine iteration's stores are one launch), and a batch waits for the
 * step work queued before it (an event on the step's stream); nothing on the step's stream
 * waits for copies unless fenced. Tickets are events in a ring, recorded on the copy stream;
 * each batch is timed by a pair of events, summed per direction once complete.
 */
#include <stdlib.h>

#include "kernels/cuda/cuda.cuh"

/* Tickets outstanding at most: marks come a few per engine iteration, so the ring wraps
 * only when the copy stream is that far behind (the mark then waits for the oldest). */
#define CU_COPY_TICKETS 256
/* Timed batches outstanding at most (the same bound, the same wait). */
#define CU_COPY_TIMED 256
/* Blocks per launch: their ids and host addresses go in the kernel's parameters (12 bytes
 * each, within the 4 KiB parameter limit). */
#define CU_COPY_BATCH 256
/* Pinned allocations the engine maps (one arena in practice). */
#define CU_COPY_MAPS 4
/* CTAs per launch: enough reads in flight to fill the bus (128 x 256 threads x 64 bytes,
 * 2 MiB), few enough to leave the step most of the SMs. */
#define CU_COPY_CTAS 128
/* Kinds of units (backend_copy_kind): KV blocks, recurrent-state slots. */
#define CU_COPY_KINDS 2

struct cu_copy_seg {
    char *base;   /* block b's piece: base + bytes * b */
    size_t bytes; /* a multiple of 16 when vec */
    size_t off;   /* where it lies in the block's host image */
};

struct cu_copy_args {
    int32_t blk[CU_COPY_BATCH];
    char *host[CU_COPY_BATCH]; /* device addresses of the blocks' host images */
};

struct cu_copier {
    cudaStream_t st;
    cudaEvent_t after_step; /* recorded on the step's stream before a batch of copies */
    cudaEvent_t fence;
    cudaEvent_t ev[CU_COPY_TICKETS];
    uint64_t issued, done; /* tickets handed out, and known complete */
    /* the pieces of a unit of each kind (KV block, state slot), in device memory [n_seg] */
    cu_copy_seg *segs[CU_COPY_KINDS];
    int n_seg[CU_COPY_KINDS], vec[CU_COPY_KINDS];
    /* mapped allocations: host address, its device address, bytes */
    char *map_h[CU_COPY_MAPS], *map_d[CU_COPY_MAPS];
    size_t map_n[CU_COPY_MAPS];
    int n_map;
    /* units queued for the next launch, all one kind and one direction */
    cu_copy_args pend;
    int n_pend, pend_in, pend_kind;
    /* timed batches [t_done, t_issued) modulo CU_COPY_TIMED */
    cudaEvent_t t0[CU_COPY_TIMED], t1[CU_COPY_TIMED];
    uint8_t t_in[CU_COPY_TIMED];
    uint64_t t_issued, t_done;
    double secs[2]; /* [0] down (to host), [1] up */
};

/* Each CTA copies whole pieces (block i's segment s), 64 bytes a thread per round: four
 * 16-byte loads in flight before their stores, as reads of host memory take a bus round
 * trip each. */
__global__ void k_kv_copy(const cu_copy_seg *__restrict__ segs, int n_seg, int vec, int n,
                          int to_host, const __grid_constant__ cu_copy_args a)
{
    for (int p = blockIdx.x; p < n * n_seg; p += gridDim.x) {
        int i = p / n_seg;
        cu_copy_seg g = segs[p % n_seg];
        char *dev = g.base + g.bytes * (size_t)a.blk[i], *host = a.host[i] + g.off;
        char *dst = to_host ? host : dev;
        const char *src = to_host ? dev : host;
        if (vec) {
            const uint4 *s4 = (const uint4 *)src;
            uint4 *d4 = (uint4 *)dst;
            size_t n4 = g.bytes / 16, step = blockDim.x;
            for (size_t j = threadIdx.x; j < n4; j += 4 * step) {
                uint4 v[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (j + u * step < n4) v[u] = s4[j + u * step];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (j + u * step < n4) d4[j + u * step] = v[u];
            }
        } else {
            for (size_t j = threadIdx.x; j < g.bytes; j += blockDim.x) dst[j] = src[j];
        }
    }
}

cu_copier *cu_copier_create(void)
{
    cu_copier *k = (cu_copier *)calloc(1, sizeof *k);
    if (!k) cu_fatal("calloc", "out of host memory", __FILE__, __LINE__);
    CU(cudaStreamCreateWithFlags(&k->st, cudaStreamNonBlocking));
    CU(cudaEventCreateWithFlags(&k->after_step, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&k->fence, cudaEventDisableTiming));
    for (int i = 0; i < CU_COPY_TICKETS; i++)
        CU(cudaEventCreateWithFlags(&k->ev[i], cudaEventDisableTiming));
    for (int i = 0; i < CU_COPY_TIMED; i++) {
        CU(cudaEventCreate(&k->t0[i]));
        CU(cudaEventCreate(&k->t1[i]));
    }
    return k;
}

void cu_copier_destroy(cu_copier *k)
{
    if (!k) return;
    CU(cudaStreamSynchronize(k->st));
    CU(cudaStreamDestroy(k->st));
    CU(cudaEventDestroy(k->after_step));
    CU(cudaEventDestroy(k->fence));
    for (int i = 0; i < CU_COPY_TICKETS; i++) CU(cudaEventDestroy(k->ev[i]));
    for (int i = 0; i < CU_COPY_TIMED; i++) {
        CU(cudaEventDestroy(k->t0[i]));
        CU(cudaEventDestroy(k->t1[i]));
    }
    for (int i = 0; i < CU_COPY_KINDS; i++)
        if (k->segs[i]) CU(cudaFree(k->segs[i]));
    free(k);
}

void cu_copier_map(cu_copier *k, void *host, size_t bytes)
{
    if (k->n_map == CU_COPY_MAPS)
        cu_fatal("host_alloc", "too many mapped areas", __FILE__, __LINE__);
    void *d = NULL;
    CU(cudaHostGetDevicePointer(&d, host, 0));
    k->map_h[k->n_map] = (char *)host;
    k->map_d[k->n_map] = (char *)d;
    k->map_n[k->n_map++] = bytes;
}

int cu_copier_unmap(cu_copier *k, void *host)
{
    for (int i = 0; i < k->n_map; i++)
        if (k->map_h[i] == host) {
            k->n_map--;
            k->map_h[i] = k->map_h[k->n_map];
            k->map_d[i] = k->map_d[k->n_map];
            k->map_n[i] = k->map_n[k->n_map];
            break;
        }
    return k->n_map;
}

void cu_copier_setup(cu_copier *k, int kind, int n_seg, void *const *base, const size_t *bytes)
{
    if (kind < 0 || kind >= CU_COPY_KINDS || n_seg < 1)
        cu_fatal("copy_setup", "bad kind or no segment", __FILE__, __LINE__);
    cu_copy_seg *h = (cu_copy_seg *)malloc(sizeof *h * (size_t)n_seg);
    if (!h) cu_fatal("malloc", "out of host memory", __FILE__, __LINE__);
    size_t off = 0;
    int vec = 1;
    for (int s = 0; s < n_seg; s++) {
        h[s].base = (char *)base[s];
        h[s].bytes = bytes[s];
        h[s].off = off;
        off += bytes[s];
        if (bytes[s] % 16 || (uintptr_t)base[s] % 16) vec = 0;
    }
    if (off % 16) vec = 0; /* host images then start unaligned in an arena */
    CU(cudaStreamSynchronize(k->st));
    if (k->segs[kind]) CU(cudaFree(k->segs[kind]));
    CU(cudaMalloc((void **)&k->segs[kind], sizeof *h * (size_t)n_seg));
    CU(cudaMemcpy(k->segs[kind], h, sizeof *h * (size_t)n_seg, cudaMemcpyHostToDevice));
    k->n_seg[kind] = n_seg;
    k->vec[kind] = vec;
    free(h);
}

/* Sums the times of the batches completed so far; wait: the oldest one at least. */
static void harvest(cu_copier *k, int wait)
{
    while (k->t_done < k->t_issued) {
        int j = (int)(k->t_done % CU_COPY_TIMED);
        if (wait) {
            CU(cudaEventSynchronize(k->t1[j]));
            wait = 0;
        } else {
            cudaError_t r = cudaEventQuery(k->t1[j]);
            if (r == cudaErrorNotReady) return;
            CU(r);
        }
        float ms = 0;
        CU(cudaEventElapsedTime(&ms, k->t0[j], k->t1[j]));
        k->secs[k->t_in[j]] += ms * 1e-3;
        k->t_done++;
    }
}

void cu_copier_flush(cu_copier *k, cudaStream_t step)
{
    if (!k->n_pend) return;
    int kd = k->pend_kind;
    if (!k->segs[kd]) cu_fatal("copy_blocks", "used before copy_setup", __FILE__, __LINE__);
    if (k->t_issued - k->t_done == CU_COPY_TIMED) harvest(k, 1);
    int j = (int)(k->t_issued++ % CU_COPY_TIMED);
    k->t_in[j] = (uint8_t)k->pend_in;
    CU(cudaEventRecord(k->after_step, step));
    CU(cudaStreamWaitEvent(k->st, k->after_step, 0));
    CU(cudaEventRecord(k->t0[j], k->st));
    int pieces = k->n_pend * k->n_seg[kd], ctas = pieces < CU_COPY_CTAS ? pieces : CU_COPY_CTAS;
    k_kv_copy<<<ctas, 256, 0, k->st>>>(k->segs[kd], k->n_seg[kd], k->vec[kd], k->n_pend,
                                       !k->pend_in, k->pend);
    CU(cudaGetLastError());
    CU(cudaEventRecord(k->t1[j], k->st));
    k->n_pend = 0;
}

void cu_copier_block(cu_copier *k, cudaStream_t step, int kind, int32_t block, void *host,
                     int to_host)
{
    char *h = (char *)host, *d = NULL;
    for (int i = 0; i < k->n_map && !d; i++)
        if (h >= k->map_h[i] && h < k->map_h[i] + k->map_n[i]) d = k->map_d[i] + (h - k->map_h[i]);
    if (!d) cu_fatal("copy_blocks", "host memory not from host_alloc", __FILE__, __LINE__);
    if (kind < 0 || kind >= CU_COPY_KINDS)
        cu_fatal("copy_blocks", "bad kind", __FILE__, __LINE__);
    /* copies run in the order queued: a change of direction or kind starts a new launch */
    if (k->n_pend &&
        (k->n_pend == CU_COPY_BATCH || k->pend_in != !to_host || k->pend_kind != kind))
        cu_copier_flush(k, step);
    k->pend_in = !to_host;
    k->pend_kind = kind;
    k->pend.blk[k->n_pend] = block;
    k->pend.host[k->n_pend++] = d;
}

uint64_t cu_copier_mark(cu_copier *k, cudaStream_t step)
{
    cu_copier_flush(k, step);
    if (k->issued - k->done == CU_COPY_TICKETS) {
        CU(cudaEventSynchronize(k->ev[(k->done + 1) % CU_COPY_TICKETS]));
        k->done++;
    }
    k->issued++;
    CU(cudaEventRecord(k->ev[k->issued % CU_COPY_TICKETS], k->st));
    return k->issued;
}

int cu_copier_done(cu_copier *k, uint64_t t)
{
    harvest(k, 0);
    while (k->done < t) {
        cudaError_t r = cudaEventQuery(k->ev[(k->done + 1) % CU_COPY_TICKETS]);
        if (r == cudaErrorNotReady) return 0;
        CU(r);
        k->done++;
    }
    return 1;
}

void cu_copier_fence(cu_copier *k, cudaStream_t step)
{
    cu_copier_flush(k, step);
    CU(cudaEventRecord(k->fence, k->st));
    CU(cudaStreamWaitEvent(step, k->fence, 0));
}

void cu_copier_seconds(cu_copier *k, double *out_s, double *in_s)
{
    harvest(k, 0);
    *out_s = k->secs[0];
    *in_s = k->secs[1];
}
