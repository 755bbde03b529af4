/*
 * threadpool: a persistent pool of worker threads for the data-parallel kernels.
 *
 * tp_run() runs fn(ctx, ith, nth) once for each part ith in [0, nth) and returns when all
 * have finished. The pool's threads (the caller among them) claim the parts as they come,
 * so a part may run on any thread, and one thread may run several. Workers spin briefly between
 * jobs and then sleep, so back-to-back kernels of one forward pass cost no system call, while an
 * idle server costs no CPU. One tp_run at a time per pool (the engine thread owns it).
 */
#ifndef PAGODA_COMMON_THREADPOOL_H
#define PAGODA_COMMON_THREADPOOL_H

struct threadpool;

typedef void (*tp_fn)(void *ctx, int ith, int nth);

/** Creates a pool of n threads in all (n-1 workers plus the caller); n <= 0 means one per core. */
struct threadpool *tp_create(int n);
void tp_destroy(struct threadpool *tp);

/** Number of threads that share each job (including the caller). */
int tp_size(const struct threadpool *tp);

/** Runs fn on each of tp_size() parts, spread over the pool's threads, and waits for all. */
void tp_run(struct threadpool *tp, tp_fn fn, void *ctx);

/** Splits [0, n) into nth near-equal ranges, rounded to multiples of `align`; gives thread ith's.
 */
static inline void tp_range(long n, int ith, int nth, long align, long *lo, long *hi)
{
    long chunks = (n + align - 1) / align;
    long a = chunks * ith / nth, b = chunks * (ith + 1) / nth;
    *lo = a * align < n ? a * align : n;
    *hi = b * align < n ? b * align : n;
}

#endif
