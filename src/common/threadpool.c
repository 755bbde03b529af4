#include "common/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common/util.h"

/* Spin iterations before a waiting thread sleeps: about 50 us on a current x86 core, longer
 * than the gap between two kernels of one forward pass, far shorter than an idle period. */
#define TP_SPIN 20000

struct threadpool {
    int n;
    pthread_t *threads;
    tp_fn fn;
    void *ctx;
    atomic_uint generation; /* bumped once per job */
    atomic_int pending;     /* workers still running the current job */
    atomic_int stop;
    atomic_int sleepers;
    pthread_mutex_t mu;
    pthread_cond_t wake;
};

struct worker_arg {
    struct threadpool *tp;
    int ith;
};

static void *worker_main(void *p)
{
    struct worker_arg *wa = p;
    struct threadpool *tp = wa->tp;
    int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen &&
               !atomic_load(&tp->stop)) {
            if (++spins < TP_SPIN) {
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            pthread_mutex_lock(&tp->mu);
            atomic_fetch_add(&tp->sleepers, 1);
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->wake, &tp->mu);
            atomic_fetch_sub(&tp->sleepers, 1);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) return NULL;
        seen = gen;
        tp->fn(tp->ctx, ith, tp->n);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_release);
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
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->pending, tp->n - 1, memory_order_relaxed);
    atomic_fetch_add(&tp->generation, 1);
    if (atomic_load(&tp->sleepers) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->wake);
        pthread_mutex_unlock(&tp->mu);
    }
    fn(ctx, 0, tp->n);
    int spins = 0;
    while (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0) {
        if (++spins > TP_SPIN) sched_yield();
#if defined(__x86_64__)
        else
            __builtin_ia32_pause();
#endif
    }
}
