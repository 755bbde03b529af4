/*
 * Embedding jobs: one POST /v1/embeddings = one engine request per input, all submitted at
 * once so that the engine batches them with whatever else runs. On the engine thread each
 * input's vector is copied into its own row of the job's [n_inputs, dim] buffer (no lock:
 * rows are disjoint), and the input that ends last posts one message to the loop that owns
 * the request, which writes the response.
 *
 * Lifetime: a job holds one reference for its h2o request (dropped when h2o disposes it)
 * and one for its engine requests (dropped when the last has ended and the message is
 * processed). Both on the loop thread; an HTTP request that goes away aborts its inputs.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "http/embed.h"
#include "http/internal.h"

struct embed_job;

struct embed_item {
    struct embed_job *job;
    int index;
    enum finish_reason finish; /* engine thread, read by the loop after the message */
};

struct embed_job {
    struct http_loop *loop;
    struct http_served *served; /* held until the job is freed */
    h2o_req_t *req;             /* NULL once h2o disposed it */
    struct http_embed q;
    struct embed_item *items; /* [q.n_inputs] */
    uint64_t *ids;            /* [q.n_inputs] engine request ids, 0 when not submitted */
    atomic_int left;          /* engine requests not ended, plus one while submitting */
    int refs, done;
    struct http_error err; /* a submission refused by the engine */
    h2o_multithread_message_t msg;
    h2o_linklist_t link;
};

/* ---- engine thread ---------------------------------------------------------------- */

static void on_engine_event(void *user, const struct engine_event *ev)
{
    struct embed_item *it = user;
    struct embed_job *j = it->job;
    if (ev->kind == ENGINE_EV_EMBEDDING && ev->n_embedding == j->q.dim)
        memcpy(j->q.vecs + (size_t)it->index * j->q.dim, ev->embedding,
               sizeof(float) * (size_t)j->q.dim);
    if (ev->finish == FINISH_NONE) return;
    it->finish = ev->kind == ENGINE_EV_EMBEDDING ? FINISH_STOP : ev->finish;
    if (atomic_fetch_sub(&j->left, 1) == 1) h2o_multithread_send_message(&j->loop->embeds, &j->msg);
}

/* ---- loop thread ------------------------------------------------------------------ */

static void job_release(struct embed_job *j)
{
    if (--j->refs > 0) return;
    h2o_linklist_unlink(&j->link);
    http_models_release(j->loop->srv->models, j->served);
    atomic_fetch_sub(&j->loop->srv->jobs, 1);
    http_embed_dispose(&j->q);
    free(j->items);
    free(j->ids);
    free(j);
}

static void abort_inputs(struct embed_job *j)
{
    struct engine *en = j->served->engine;
    for (int i = 0; en && i < j->q.n_inputs; i++)
        if (j->ids[i]) engine_abort(en, j->ids[i]);
}

static void on_req_dispose(void *p)
{
    struct embed_job *j = *(struct embed_job **)p;
    j->req = NULL;
    if (!j->done) abort_inputs(j);
    job_release(j);
}

/* Every input has ended: the vectors, or the error of the first that has none. */
static void job_complete(struct embed_job *j)
{
    j->done = 1;
    if (j->req) {
        struct http_error he = j->err;
        for (int i = 0; i < j->q.n_inputs && !he.status; i++) {
            if (j->items[i].finish == FINISH_ERROR)
                http_error_set(&he, 400, "input",
                               "input %d cannot be served: it does not fit the KV cache", i);
            else if (j->items[i].finish != FINISH_STOP)
                http_error_set(&he, 503, NULL,
                               "the request was aborted: the server is shutting down");
        }
        if (he.status) {
            http_reply_error(j->req, HTTP_ROUTE_EMBEDDINGS, &he);
        } else {
            struct http_buf body = {0};
            http_embed_format(&j->q, &j->served->model, &body);
            http_reply(j->req, HTTP_ROUTE_EMBEDDINGS, 200, "application/json", body.p, body.len);
            http_buf_dispose(&body);
        }
    }
    job_release(j);
}

void http_embed_on_done(h2o_multithread_receiver_t *r, h2o_linklist_t *messages)
{
    (void)r;
    while (!h2o_linklist_is_empty(messages)) {
        h2o_multithread_message_t *m =
            H2O_STRUCT_FROM_MEMBER(h2o_multithread_message_t, link, messages->next);
        h2o_linklist_unlink(&m->link);
        job_complete(H2O_STRUCT_FROM_MEMBER(struct embed_job, msg, m));
    }
}

void http_embed_abort_all(struct http_loop *l)
{
    for (h2o_linklist_t *n = l->embed_jobs.next; n != &l->embed_jobs; n = n->next) {
        struct embed_job *j = H2O_STRUCT_FROM_MEMBER(struct embed_job, link, n);
        if (!j->done) abort_inputs(j);
    }
}

void http_embed_start(struct http_loop *l, h2o_req_t *req, struct http_served *m,
                      struct http_embed *q)
{
    struct http_server *s = l->srv;
    struct engine *en = m->engine;
    struct embed_job *j = xcalloc(1, sizeof *j);
    j->loop = l;
    j->served = m;
    j->req = req;
    j->q = *q;
    memset(q, 0, sizeof *q);
    int n = j->q.n_inputs;
    j->items = xcalloc((size_t)n, sizeof *j->items);
    j->ids = xcalloc((size_t)n, sizeof *j->ids);
    atomic_init(&j->left, n + 1);
    h2o_linklist_insert(&l->embed_jobs, &j->link);
    atomic_fetch_add(&s->jobs, 1);
    struct embed_job **guard = h2o_mem_alloc_shared(&req->pool, sizeof *guard, on_req_dispose);
    *guard = j;
    j->refs = 2; /* the h2o request, the engine requests */
    int submitted = 0;
    for (int i = 0; i < n; i++) {
        j->items[i] = (struct embed_item){j, i, FINISH_NONE};
        struct engine_request er = {.prompt = j->q.inputs[i],
                                    .n_prompt = j->q.n_input[i],
                                    .embed = 1,
                                    .pool_skip = j->q.pool_skip[i],
                                    .on_event = on_engine_event,
                                    .user = &j->items[i]};
        struct err e = {0};
        j->ids[i] = en ? engine_submit(en, &er, &e) : 0;
        if (!j->ids[i]) {
            http_error_set(&j->err, en ? 400 : 503, en ? "input" : NULL, "%s",
                           en ? e.msg : "the model is not loaded");
            break;
        }
        submitted++;
    }
    if (j->err.status) abort_inputs(j);
    /* the inputs never submitted and the submission's own count */
    int gone = n - submitted + 1;
    if (atomic_fetch_sub(&j->left, gone) == gone) job_complete(j);
}
