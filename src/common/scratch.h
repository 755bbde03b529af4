/*
 * scratch: per-thread working buffers for kernels, grown on demand and kept, so steady-state
 * steps allocate nothing. Freed when the thread exits.
 */
#ifndef PAGODA_COMMON_SCRATCH_H
#define PAGODA_COMMON_SCRATCH_H

#include <stddef.h>

enum scratch_slot {
    SCRATCH_GEMM_A,
    SCRATCH_GEMM_B,
    SCRATCH_GEMV,
    SCRATCH_ATTN,
    SCRATCH_MM_X,      /* a matmul's prepared input, written by the calling thread, read by all */
    SCRATCH_MOE_ROUTE, /* the routing of a step's rows (calling thread) */
    SCRATCH_MOE_X,     /* the rows routed to one expert, then its output */
    SCRATCH_MOE_G,     /* their gate products */
    SCRATCH_MOE_U,     /* their up products */
    SCRATCH_DELTA,     /* a delta-rule item's vectors */
    SCRATCH_ATTN_RUNS, /* an attention's runs of query tokens (calling thread) */
    SCRATCH_SLOTS
};

/** This thread's buffer `slot` with room for at least `floats` floats (contents undefined). */
float *scratch_get(enum scratch_slot slot, size_t floats);

#endif
