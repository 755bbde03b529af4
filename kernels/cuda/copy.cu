/*
 * The copy engine of the host-memory KV tier (paged_kv/kv_host.h): block copies between
 * device memory and pinned host memory on a stream of their own, so that they overlap the
 * steps. A copy waits for the step work queued before it (an event on the step's stream)
 * and nothing on the step's stream waits for copies unless fenced. Tickets are events in a
 * ring, recorded on the copy stream; a ticket is done once its event has completed.
 */
#include <stdlib.h>

#include "kernels/cuda/cuda.cuh"

/* Tickets outstanding at most: marks come a few per engine iteration, so the ring wraps
 * only when the copy stream is that far behind (the mark then waits for the oldest). */
#define CU_COPY_TICKETS 256

struct cu_copier {
    cudaStream_t st;
    cudaEvent_t after_step; /* recorded on the step's stream before a batch of copies */
    cudaEvent_t fence;
    cudaEvent_t ev[CU_COPY_TICKETS];
    uint64_t issued, done; /* tickets handed out, and known complete */
};

cu_copier *cu_copier_create(void)
{
    cu_copier *k = (cu_copier *)calloc(1, sizeof *k);
    if (!k) cu_fatal("calloc", "out of host memory", __FILE__, __LINE__);
    CU(cudaStreamCreateWithFlags(&k->st, cudaStreamNonBlocking));
    CU(cudaEventCreateWithFlags(&k->after_step, cudaEventDisableTiming));
    CU(cudaEventCreateWithFlags(&k->fence, cudaEventDisableTiming));
    for (int i = 0; i < CU_COPY_TICKETS; i++)
        CU(cudaEventCreateWithFlags(&k->ev[i], cudaEventDisableTiming));
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
    free(k);
}

void cu_copier_follow(cu_copier *k, cudaStream_t step)
{
    CU(cudaEventRecord(k->after_step, step));
    CU(cudaStreamWaitEvent(k->st, k->after_step, 0));
}

void cu_copier_copy(cu_copier *k, void *dst, const void *src, size_t bytes, int to_host)
{
    CU(cudaMemcpyAsync(dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                       k->st));
}

uint64_t cu_copier_mark(cu_copier *k)
{
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
    CU(cudaEventRecord(k->fence, k->st));
    CU(cudaStreamWaitEvent(step, k->fence, 0));
}
