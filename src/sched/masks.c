/*
 * Grammar masks off the engine thread. A step whose requests sample on the host runs its
 * forward pass synchronously; the token masks of its grammar requests depend only on the
 * tokens already accepted, so a worker thread computes them meanwhile (each into the
 * request's own buffer) and sampling finds them ready. A matcher is touched by one thread
 * at a time: the worker between masks_start and masks_wait, the engine thread otherwise.
 */
#include <stdlib.h>

#include "common/util.h"
#include "sched/engine_impl.h"

static void *worker(void *arg)
{
    struct engine *en = arg;
    pthread_mutex_lock(&en->mmu);
    for (;;) {
        while (!en->mquit && !en->mq_busy) pthread_cond_wait(&en->mcv, &en->mmu);
        if (en->mquit) break;
        int n = en->mq_n;
        pthread_mutex_unlock(&en->mmu);
        for (int i = 0; i < n; i++) {
            struct request *r = en->mq[i];
            gram_matcher_fill_mask(r->gm, en->gvocab, r->gmask);
        }
        pthread_mutex_lock(&en->mmu);
        en->mq_busy = 0;
        en->mq_done = 1;
        pthread_cond_broadcast(&en->mcv);
    }
    pthread_mutex_unlock(&en->mmu);
    return NULL;
}

void masks_start(struct engine *en, const struct step_seq *plan, int n_plan)
{
    int n = 0;
    for (int s = 0; s < n_plan; s++) n += plan[s].r && plan[s].samples && plan[s].r->gm;
    if (!n || !en->gvocab) return;
    if (!en->mthread_on) {
        pthread_mutex_init(&en->mmu, NULL);
        pthread_cond_init(&en->mcv, NULL);
        if (pthread_create(&en->mthread, NULL, worker, en)) { /* masks stay on this thread */
            pthread_cond_destroy(&en->mcv);
            pthread_mutex_destroy(&en->mmu);
            return;
        }
        en->mthread_on = 1;
    }
    if (n > en->mq_cap) {
        en->mq_cap = n;
        en->mq = xrealloc(en->mq, sizeof *en->mq * (size_t)n);
    }
    int words = (en->vocab + 31) / 32, k = 0;
    for (int s = 0; s < n_plan; s++) {
        struct request *r = plan[s].r;
        if (!r || !plan[s].samples || !r->gm) continue;
        if (!r->gmask) r->gmask = xmalloc(sizeof *r->gmask * (size_t)words);
        r->gmask_ready = 0;
        en->mq[k++] = r;
    }
    pthread_mutex_lock(&en->mmu);
    en->mq_n = k;
    en->mq_done = 0;
    en->mq_busy = 1;
    pthread_cond_broadcast(&en->mcv);
    pthread_mutex_unlock(&en->mmu);
}

void masks_wait(struct engine *en)
{
    if (!en->mthread_on || !en->mq_n) return;
    pthread_mutex_lock(&en->mmu);
    while (!en->mq_done) pthread_cond_wait(&en->mcv, &en->mmu);
    int n = en->mq_n;
    en->mq_n = 0;
    pthread_mutex_unlock(&en->mmu);
    for (int i = 0; i < n; i++) en->mq[i]->gmask_ready = 1;
}

void masks_stop(struct engine *en)
{
    if (en->mthread_on) {
        pthread_mutex_lock(&en->mmu);
        en->mquit = 1;
        pthread_cond_broadcast(&en->mcv);
        pthread_mutex_unlock(&en->mmu);
        pthread_join(en->mthread, NULL);
        pthread_cond_destroy(&en->mcv);
        pthread_mutex_destroy(&en->mmu);
        en->mthread_on = 0;
    }
    free(en->mq);
    en->mq = NULL;
}
