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
