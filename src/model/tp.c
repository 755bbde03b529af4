/* Tensor parallelism: the group's ranks and the calls run on each (see tp.h). */
#include "model/tp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

enum tp_job {
    JOB_NONE,
    JOB_FORWARD,
    JOB_STATE,
    JOB_STATE_COPY,
    JOB_HIDDEN,
    JOB_KV_FORMAT,
    JOB_QUIT
};

struct tp_rank {
    struct tp_group *g;
    int rank;
    struct backend be; /* ranks > 0: their own */
    struct model *m;
    pthread_t th;
    int started;
    int rc; /* of the last job */
    struct err err;
};

struct tp_group {
    int size;
    const char *dir;
    int dev0, threads, cpu;
    struct tp_rank r[TP_MAX];
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    unsigned long seq; /* bumped for each job */
    int pending;       /* ranks > 0 that have not finished it */
    /* the job */
    enum tp_job job;
    const struct fwd_batch *b;
    int args[5];
    const struct kv_spec *spec;
};

/* Rank r's part of the current job. */
static int run_job(struct tp_group *g, struct tp_rank *r, float *logits, struct err *e)
{
    struct model *m = r->m;
    switch (g->job) {
    case JOB_FORWARD:
        model_forward_rank(m, g->b, logits);
        /* Every rank launches what it recorded before the lead waits for the others: a rank
         * whose scratch grows mid-step waits on its stream, whose exchanges wait on every
         * peer's kernels, the lead's among them. */
        if (m->be->ops->submit) m->be->ops->submit(m->be->ctx);
        return 0;
    case JOB_STATE:
        return model_state_alloc_rank(m, g->args[0], g->args[1], g->args[2], g->args[3], g->args[4],
                                      e);
    case JOB_STATE_COPY:
        model_state_copy_rank(m, g->args[0], g->args[1]);
        return 0;
    case JOB_HIDDEN:
        return model_hidden_alloc_rank(m, g->args[0], e);
    case JOB_KV_FORMAT:
        return model_set_kv_format_rank(m, g->spec, e);
    default:
        return 0;
    }
}

static void *rank_main(void *arg)
{
    struct tp_rank *r = arg;
    struct tp_group *g = r->g;
    /* the backend and the model are made on this thread, which alone uses them */
    char dev[32];
    if (g->cpu)
        snprintf(dev, sizeof dev, "cpu");
    else
        snprintf(dev, sizeof dev, "cuda:%d", g->dev0 + r->rank);
    r->rc = backend_create(&r->be, dev, g->threads, &r->err);
    if (r->rc == 0) {
        r->m = model_load_rank(g->dir, &r->be, r->rank, g->size, &r->err);
        if (!r->m) r->rc = -1;
    }
    unsigned long seen = 0;
    pthread_mutex_lock(&g->mu);
    g->pending--;
    pthread_cond_signal(&g->done);
    for (;;) {
        while (g->seq == seen) pthread_cond_wait(&g->go, &g->mu);
        seen = g->seq;
        if (g->job == JOB_QUIT) break;
        pthread_mutex_unlock(&g->mu);
        int rc = r->m ? run_job(g, r, NULL, &r->err) : -1;
        pthread_mutex_lock(&g->mu);
        r->rc = rc;
        if (--g->pending == 0) pthread_cond_signal(&g->done);
    }
    pthread_mutex_unlock(&g->mu);
    model_destroy(r->m);
    r->m = NULL;
    if (r->be.ops) backend_destroy(&r->be);
    return NULL;
}

/* Runs the job set in g on every rank (rank 0 here, with `logits`) and waits for all; 0, or
 * -1 with the first rank's error. */
static int run_all(struct tp_group *g, float *logits, struct err *e)
{
    pthread_mutex_lock(&g->mu);
    g->pending = g->size - 1;
    g->seq++;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    int rc = run_job(g, &g->r[0], logits, e);
    pthread_mutex_lock(&g->mu);
    while (g->pending > 0) pthread_cond_wait(&g->done, &g->mu);
    pthread_mutex_unlock(&g->mu);
    for (int i = 1; i < g->size && rc == 0; i++)
        if (g->r[i].rc) {
            err_set(e, "tensor-parallel rank %d: %s", i, g->r[i].err.msg);
            rc = -1;
        }
    return rc;
}

void tpg_forward(struct tp_group *g, const struct fwd_batch *b, float *logits)
{
    g->job = JOB_FORWARD;
    g->b = b;
    struct err e;
    run_all(g, logits, &e); /* a forward step reports no errors */
}

int tpg_state_alloc(struct tp_group *g, int max_tokens, int max_logits, int n_blocks,
                    int block_size, int n_states, struct err *e)
{
    g->job = JOB_STATE;
    g->args[0] = max_tokens;
    g->args[1] = max_logits;
    g->args[2] = n_blocks;
    g->args[3] = block_size;
    g->args[4] = n_states;
    return run_all(g, NULL, e);
}

void tpg_state_copy(struct tp_group *g, int dst, int src)
{
    g->job = JOB_STATE_COPY;
    g->args[0] = dst;
    g->args[1] = src;
    struct err e;
    run_all(g, NULL, &e); /* a copy reports no errors */
}

int tpg_hidden_alloc(struct tp_group *g, int max_rows, struct err *e)
{
    g->job = JOB_HIDDEN;
    g->args[0] = max_rows;
    return run_all(g, NULL, e);
}

int tpg_set_kv_format(struct tp_group *g, const struct kv_spec *s, struct err *e)
{
    g->job = JOB_KV_FORMAT;
    g->spec = s;
    return run_all(g, NULL, e);
}

int tpg_size(const struct tp_group *g)
{
    return g->size;
}

struct model *tpg_rank_model(struct tp_group *g, int r)
{
    return g->r[r].m;
}

void tpg_destroy(struct tp_group *g)
{
    pthread_mutex_lock(&g->mu);
    g->job = JOB_QUIT;
    g->seq++;
    pthread_cond_broadcast(&g->go);
    pthread_mutex_unlock(&g->mu);
    for (int i = 1; i < g->size; i++)
        if (g->r[i].started) pthread_join(g->r[i].th, NULL);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->go);
    pthread_cond_destroy(&g->done);
    if (g->r[0].m) g->r[0].m->tp = NULL;
    free(g);
}

struct model *model_load_tp(const char *dir, struct backend *be, const char *device, int size,
                            int threads, struct err *e)
{
    if (size == 1) return model_load(dir, be, e);
    if (size < 1 || size > TP_MAX) {
        err_set(e, "--tensor-parallel-size %d: expected 1 to %d", size, TP_MAX);
        return NULL;
    }
    if (!be->ops->group_create || !be->ops->all_reduce || !be->ops->all_gather) {
        err_set(e, "--tensor-parallel-size %d: the %s backend does not run tensor parallelism",
                size, be->ops->name);
        return NULL;
    }
    struct tp_group *g = xcalloc(1, sizeof *g);
    g->size = size;
    g->dir = dir;
    /* the CPU's cores shared out among the ranks (each has its own pool) */
    g->threads = threads;
    if (!strcmp(be->ops->name, "cpu") && threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        g->threads = cores / size > 1 ? (int)(cores / size) : 1;
    }
    g->cpu = !strcmp(be->ops->name, "cpu");
    if (!g->cpu && device && !strncmp(device, "cuda:", 5)) g->dev0 = atoi(device + 5);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->go, NULL);
    pthread_cond_init(&g->done, NULL);
    /* every rank loads at once; rank 0 here, on the caller's backend */
    g->pending = size - 1;
    for (int i = 0; i < size; i++) {
        g->r[i].g = g;
        g->r[i].rank = i;
    }
    for (int i = 1; i < size; i++)
        g->r[i].started = pthread_create(&g->r[i].th, NULL, rank_main, &g->r[i]) == 0;
    g->r[0].m = model_load_rank(dir, be, 0, size, e);
    pthread_mutex_lock(&g->mu);
    for (int i = 1; i < size; i++)
        if (!g->r[i].started) g->pending--;
    while (g->pending > 0) pthread_cond_wait(&g->done, &g->mu);
    pthread_mutex_unlock(&g->mu);
    int ok = g->r[0].m != NULL;
    for (int i = 1; i < size && ok; i++) {
        if (!g->r[i].started) {
            err_set(e, "tensor-parallel rank %d: could not start its thread", i);
            ok = 0;
        } else if (g->r[i].rc) {
            err_set(e, "tensor-parallel rank %d: %s", i, g->r[i].err.msg);
            ok = 0;
        }
    }
    if (ok) {
        void *members[TP_MAX];
        for (int i = 0; i < size; i++) members[i] = g->r[i].m->be->ctx;
        /* every rank's backend is of the lead's kind, on a device of its own */
        ok = be->ops->group_create(be->ctx, size, members, e) == 0;
    }
    struct model *m = g->r[0].m;
    if (!ok) {
        tpg_destroy(g);
        model_destroy(m);
        return NULL;
    }
    m->tp = g;
    return m;
}
