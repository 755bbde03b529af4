#include "common/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common/util.h"

/* Spin iterations before a waiting thread sleeps: about 50 us on a current x86 core, longer
 * than the gap between two kernels of one forward pass, far shorter than an idle period. */
#define TP_SPIN 20000

/* A job's nth parts are claimed, not assigned: each thread takes the next unclaimed part
 * until none is left, so a worker that the OS has descheduled (a machine shared with other
 * work) delays the job by at most the part it is running, instead of the caller waiting a
 * whole time slice for the part that was its. Part ith covers the same work whichever thread
 * runs it, so results do not change. */
struct threadpool {
    int n;
    pthread_t *threads;
    _Atomic(tp_fn) fn;
    _Atomic(void *) ctx;
    /* (generation << 32) | next unclaimed part: one word, so that a claim names its job */
    atomic_ullong claim;
    atomic_int done; /* parts of the current job finished */
    atomic_int stop;
    atomic_int sleepers;
    pthread_mutex_t mu;
    pthread_cond_t wake;
};

struct worker_arg {
    struct threadpool *tp;
    int ith;
};

/* Runs unclaimed parts of job `gen` until none is left (or a later job has started). */
static void run_parts(struct threadpool *tp, unsigned long long gen)
{
    for (;;) {
        unsigned long long v = atomic_load_explicit(&tp->claim, memory_order_acquire);
        if (v >> 32 != gen || (int)(v & 0xffffffffu) >= tp->n) return;
        tp_fn fn = atomic_load_explicit(&tp->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&tp->ctx, memory_order_relaxed);
        /* a successful claim means the job was unfinished, so fn and ctx were its own */
        if (!atomic_compare_exchange_weak_explicit(&tp->claim, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue;
        fn(ctx, (int)(v & 0xffffffffu), tp->n);
        atomic_fetch_add_explicit(&tp->done, 1, memory_order_release);
    }
}

static void *worker_main(void *p)
{
    struct worker_arg *wa = p;
    struct threadpool *tp = wa->tp;
    free(wa);
    unsigned long long seen = 0;
    for (;;) {
        unsigned long long gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&tp->claim, memory_order_acquire) >> 32) == seen &&
               !atomic_load(&tp->stop)) {
            if (++spins < TP_SPIN) {
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            pthread_mutex_lock(&tp->mu);
            atomic_fetch_add(&tp->sleepers, 1);
            while (atomic_load(&tp->claim) >> 32 == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->wake, &tp->mu);
            atomic_fetch_sub(&tp->sleepers, 1);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) return NULL;
        seen = gen;
        run_parts(tp, gen);
    }
}

struct threadpool *tp_create(int n)
{
    if (n <= 0) n = util_num_cores();
    struct threadpool *tp = xcalloc(1, sizeof *tp);
    tp->n = n;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->wake, NULL);
    tp->threads = xcalloc((size_t)n, sizeof(pthread_t));
    for (int i = 1; i < n; i++) {
        struct worker_arg *wa = xmalloc(sizeof *wa);
        wa->tp = tp;
        wa->ith = i;
        if (pthread_create(&tp->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            tp->n = i; /* run with the threads we got */
            break;
        }
    }
    return tp;
}

void tp_destroy(struct threadpool *tp)
{
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n; i++) pthread_join(tp->threads[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->wake);
    free(tp->threads);
    free(tp);
}

int tp_size(const struct threadpool *tp)
{
    return tp->n;
}

void tp_run(struct threadpool *tp, tp_fn fn, void *ctx)
{
    if (tp->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    atomic_store_explicit(&tp->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&tp->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&tp->done, 0, memory_order_relaxed);
    unsigned long long gen = (atomic_load(&tp->claim) >> 32) + 1;
    atomic_store_explicit(&tp->claim, gen << 32, memory_order_release);
    if (atomic_load(&tp->sleepers) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->wake);
        pthread_mutex_unlock(&tp->mu);
    }
    run_parts(tp, gen);
    int spins = 0;
    while (atomic_load_explicit(&tp->done, memory_order_acquire) < tp->n) {
        if (++spins > TP_SPIN) sched_yield();
#if defined(__x86_64__)
        else
            __builtin_ia32_pause();
#endif
    }
}
