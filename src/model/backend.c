/* Picking a backend from a device string. */
#include <stdlib.h>
#include <string.h>

#include "model/backend.h"

#include "kernels/cpu/cpu.h"

#ifdef PAGODA_HAVE_CUDA
int backend_cuda_create(struct backend *be, int device, struct err *e);
int backend_cuda_device_count(void);
#endif

int backend_cuda_available(void)
{
#ifdef PAGODA_HAVE_CUDA
    return backend_cuda_device_count() > 0;
#else
    return 0;
#endif
}

int backend_gpu_count(void)
{
#ifdef PAGODA_HAVE_CUDA
    return backend_cuda_device_count();
#else
    return 0;
#endif
}

void backend_batch_invariant_set(int on)
{
    cpu_batch_invariant_set(on);
    if (on) setenv("PAGODA_CUDA_BATCH_INVARIANT", "1", 1);
}

void backend_custom_all_reduce_set(int on)
{
    setenv("PAGODA_CUDA_CUSTOM_ALL_REDUCE", on ? "1" : "0", 1);
}

int backend_create(struct backend *be, const char *device, int threads, struct err *e)
{
    if (!device || !*device) device = backend_cuda_available() ? "cuda" : "cpu";
    if (!strcmp(device, "cpu")) return backend_cpu_create(be, threads, e);
    if (!strncmp(device, "cuda", 4) && (device[4] == 0 || device[4] == ':')) {
        int idx = 0;
        if (device[4] == ':') {
            char *end;
            long v = strtol(device + 5, &end, 10);
            if (end == device + 5 || *end || v < 0 || v > 1023) {
                err_set(e, "--device %s: expected cuda:N with N a GPU index", device);
                return -1;
            }
            idx = (int)v;
        }
#ifdef PAGODA_HAVE_CUDA
        return backend_cuda_create(be, idx, e);
#else
        (void)idx;
        err_set(e, "--device %s: this build of pagoda has no CUDA backend", device);
        return -1;
#endif
    }
    err_set(e, "--device %s: expected cpu, cuda or cuda:N", device);
    return -1;
}

size_t backend_kv_budget(const struct backend_info *bi, double util, size_t resident)
{
    double allowed = util * (double)bi->mem_total;
    if (allowed <= (double)resident) return 0;
    size_t b = (size_t)(allowed - (double)resident);
    /* Weights already loaded are not free any more: cap by what is free beyond them. */
    if (bi->mem_free && b > bi->mem_free) b = bi->mem_free;
    return b;
}
