/*
 * Kernel timeline (PAGODA_CUDA_KTRACE=FILE): the start and end of every kernel the process
 * runs, graph nodes included, written to FILE as CSV at exit. CUPTI's activity records give
 * the times the GPU itself stamped, so the gaps between a graph's kernels (and the overlap
 * of programmatic dependent launches) show as they are, which the eager per-operation
 * profile (PAGODA_CUDA_PROFILE) cannot. CUPTI is loaded at run time, so the binary does not
 * need it unless the trace is asked for. scripts/ktrace-summary.py reads the file.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.cuh"

#if __has_include(<cupti.h>)
#include <cupti.h>

#define KT_BUF (8u << 20)

struct kt_rec {
    uint64_t start, end;
    char name[96];
};

static struct {
    CUptiResult (*reg)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*flush)(uint32_t);
    CUptiResult (*next)(uint8_t *, size_t, CUpti_Activity **);
    pthread_mutex_t mu;
    kt_rec *recs;
    size_t n, cap;
    char path[512];
    bool on;
} kt = {NULL, NULL, NULL, NULL, PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, {0}, false};

static void CUPTIAPI kt_buffer(uint8_t **buf, size_t *size, size_t *max_records)
{
    *buf = (uint8_t *)aligned_alloc(8, KT_BUF);
    *size = *buf ? KT_BUF : 0;
    *max_records = 0;
}

static void CUPTIAPI kt_done(CUcontext, uint32_t, uint8_t *buf, size_t, size_t valid)
{
    CUpti_Activity *r = NULL;
    pthread_mutex_lock(&kt.mu);
    while (kt.next(buf, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
        if (kt.n == kt.cap) {
            const size_t cap = kt.cap ? 2 * kt.cap : 1 << 16;
            kt_rec *p = (kt_rec *)realloc(kt.recs, cap * sizeof *p);
            if (!p) break; /* the trace ends here; the run goes on */
            kt.recs = p;
            kt.cap = cap;
        }
        kt_rec *o = &kt.recs[kt.n++];
        o->start = k->start;
        o->end = k->end;
        snprintf(o->name, sizeof o->name, "%s", k->name ? k->name : "?");
    }
    pthread_mutex_unlock(&kt.mu);
    free(buf);
}

void cu_ktrace_start(const char *path)
{
    const char *libs[] = {"libcupti.so", "libcupti.so.13", "libcupti.so.12"};
    void *h = NULL;
    for (int i = 0; i < 3 && !h; i++) h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "pagoda: PAGODA_CUDA_KTRACE: cannot load CUPTI (%s); no trace\n",
                dlerror());
        return;
    }
    *(void **)&kt.reg = dlsym(h, "cuptiActivityRegisterCallbacks");
    *(void **)&kt.enable = dlsym(h, "cuptiActivityEnable");
    *(void **)&kt.flush = dlsym(h, "cuptiActivityFlushAll");
    *(void **)&kt.next = dlsym(h, "cuptiActivityGetNextRecord");
    if (!kt.reg || !kt.enable || !kt.flush || !kt.next ||
        kt.reg(kt_buffer, kt_done) != CUPTI_SUCCESS ||
        kt.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "pagoda: PAGODA_CUDA_KTRACE: CUPTI refused kernel activity; no trace\n");
        return;
    }
    snprintf(kt.path, sizeof kt.path, "%s", path);
    kt.on = true;
}

void cu_ktrace_stop(void)
{
    if (!kt.on) return;
    kt.on = false;
    cudaDeviceSynchronize();
    kt.flush(1);
    FILE *f = fopen(kt.path, "w");
    if (!f) {
        fprintf(stderr, "pagoda: PAGODA_CUDA_KTRACE: cannot write %s\n", kt.path);
        return;
    }
    pthread_mutex_lock(&kt.mu);
    fprintf(f, "start_ns,end_ns,kernel\n");
    for (size_t i = 0; i < kt.n; i++)
        fprintf(f, "%llu,%llu,%s\n", (unsigned long long)kt.recs[i].start,
                (unsigned long long)kt.recs[i].end, kt.recs[i].name);
    fprintf(stderr, "pagoda: kernel trace of %zu launches in %s\n", kt.n, kt.path);
    free(kt.recs);
    kt.recs = NULL;
    kt.n = kt.cap = 0;
    pthread_mutex_unlock(&kt.mu);
    fclose(f);
}

#else /* a toolkit without CUPTI's headers */

void cu_ktrace_start(const char *)
{
    fprintf(stderr, "pagoda: PAGODA_CUDA_KTRACE: built without CUPTI; no trace\n");
}

void cu_ktrace_stop(void) {}

#endif
