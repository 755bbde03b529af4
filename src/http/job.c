/*
 * Generation jobs: one HTTP request = n_prompts * n engine requests (choices). Engine
 * events are copied on the engine thread into the choice's queue and handed to the loop
 * thread with one h2o multithread message per choice (sent only when the queue goes from
 * empty to non-empty, so a slow loop gets batches, never a flood of wake-ups). The loop
 * thread detokenizes, applies stop strings and writes SSE or the final body, one
 * h2o_send in flight at a time (the next waits for the generator's proceed).
 *
 * Lifetime: a job holds one reference for its h2o request (dropped when h2o disposes the
 * request, seen through a shared allocation in req->pool) and one per engine request not
 * yet finished (dropped when its last event is processed). All on the loop thread.
 */
#include <math.h>
#include <stdio.h>
#include <errno.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <string.h>

#include "common/util.h"
#include "http/job.h"

static void job_release(struct http_job *j);
static void job_flush(struct http_job *j);

/* ---- engine thread ---------------------------------------------------------------- */

static void on_engine_event(void *user, const struct engine_event *ev)
{
    struct job_choice *c = user;
    pthread_mutex_lock(&c->mu);
    if (c->nq == c->capq) {
        c->capq = c->capq ? c->capq * 2 : 8;
        c->q = xrealloc(c->q, sizeof *c->q * (size_t)c->capq);
    }
    struct ev_rec *r = &c->q[c->nq++];
    r->kind = ev->kind;
    r->token = ev->token;
    r->logprob = ev->logprob;
    r->n_top = ev->n_top < 0                         ? 0
               : ev->n_top > ENGINE_MAX_TOP_LOGPROBS ? ENGINE_MAX_TOP_LOGPROBS
                                                     : ev->n_top;
    if (r->n_top && ev->top) memcpy(r->top, ev->top, sizeof *r->top * (size_t)r->n_top);
    r->finish = ev->finish;
    r->n_prompt = ev->n_prompt;
    r->n_cached = ev->n_cached;
    r->n_output = ev->n_output;
    r->n_plp = 0;
    r->plp = NULL;
    r->ptop = NULL;
    if (ev->kind == ENGINE_EV_PROMPT_LOGPROBS && ev->n_prompt_lp > 0 && ev->prompt_lp) {
        r->n_plp = ev->n_prompt_lp;
        r->plp = xmalloc(sizeof *r->plp * (size_t)r->n_plp);
        memcpy(r->plp, ev->prompt_lp, sizeof *r->plp * (size_t)r->n_plp);
        if (r->n_top && ev->prompt_top) {
            size_t k = (size_t)r->n_plp * (size_t)r->n_top;
            r->ptop = xmalloc(sizeof *r->ptop * k);
            memcpy(r->ptop, ev->prompt_top, sizeof *r->ptop * k);
        }
    }
    r->t = util_now();
    int send = !c->pending;
    c->pending = 1;
    pthread_mutex_unlock(&c->mu);
    if (send) h2o_multithread_send_message(&c->job->loop->events, &c->msg);
}

/* ---- output ------------------------------------------------------------------------- */

static void on_proceed(h2o_generator_t *gen, h2o_req_t *req)
{
    (void)req;
    struct http_job *j = H2O_STRUCT_FROM_MEMBER(struct http_job, gen, gen);
    j->inflight = 0;
    j->sending.len = 0;
    job_flush(j);
}

static void abort_choices(struct http_job *j)
{
    struct engine *en = j->served->engine;
    for (int i = 0; i < j->n_c; i++)
        if (j->c[i].req_id && en) engine_abort(en, j->c[i].req_id);
}

/* The client is gone (or h2o is done with the request): never touch req again. */
static void req_gone(struct http_job *j)
{
    if (!j->req) return;
    /* an HTTP/2 stream ended before its response: the client reset it */
    int reset =
        !j->final_sent && j->req->version >= 0x200 && !atomic_load(&j->loop->srv->shutting_down);
    j->req = NULL;
    if (j->conn) http_conn_release(j->loop, j->conn, reset);
    j->conn = NULL;
    if (j->counted_stream) {
        http_metrics_streams(j->loop->srv->metrics, -1);
        j->counted_stream = 0;
    }
    if (!j->complete) abort_choices(j);
}

static void on_stop(h2o_generator_t *gen, h2o_req_t *req)
{
    (void)req;
    req_gone(H2O_STRUCT_FROM_MEMBER(struct http_job, gen, gen));
}

static void on_req_dispose(void *p)
{
    struct http_job *j = *(struct http_job **)p;
    req_gone(j);
    job_release(j);
}

static void start_stream(struct http_job *j)
{
    h2o_req_t *req = j->req;
    req->res.status = 200;
    req->res.reason = "OK";
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                   H2O_STRLIT("text/event-stream; charset=utf-8"));
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL,
                   H2O_STRLIT("no-cache"));
    j->gen.proceed = on_proceed;
    j->gen.stop = on_stop;
    h2o_start_response(req, &j->gen);
    j->started = 1;
    j->header_sent = 1; /* from here a gone client is seen at the next write */
    http_metrics_request(j->loop->srv->metrics, j->route, 200);
    http_metrics_streams(j->loop->srv->metrics, 1);
    j->counted_stream = 1;
}

/* Writes what is pending when no write is in flight; the last write is FINAL. */
static void job_flush(struct http_job *j)
{
    if (!j->req) {
        j->out.len = 0;
        return;
    }
    if (!j->started || j->inflight || j->final_sent) return;
    if (!j->out.len && !j->complete) return;
    struct http_buf t = j->sending;
    j->sending = j->out;
    j->out = t;
    j->out.len = 0;
    h2o_iovec_t buf = h2o_iovec_init(j->sending.p, j->sending.len);
    int final = j->complete;
    j->inflight = !final;
    j->t_write = util_now();
    if (final) {
        j->final_sent = 1;
        if (j->counted_stream) http_metrics_streams(j->loop->srv->metrics, -1);
        j->counted_stream = 0;
    }
    h2o_send(j->req, &buf, buf.len ? 1 : 0,
             final ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
}

/*
 * A client that does not read (or holds an HTTP/2 window at zero) leaves one write in
 * flight for good while the engine keeps producing: past --max-stream-buffer bytes waiting
 * behind that write, the request is aborted so that the stream holds at most that much.
 */
static void stall(struct http_job *j, enum http_stream_abort why)
{
    if (j->stalled) return;
    j->stalled = 1 + (int)why;
    http_metrics_stream_abort(j->loop->srv->metrics, why);
    abort_choices(j);
}

static void check_buffer(struct http_job *j)
{
    if (j->req && j->inflight && j->out.len > j->loop->srv->cfg.max_stream_buffer)
        stall(j, HTTP_STREAM_ABORT_BUFFER_FULL);
}

/* ---- the job ------------------------------------------------------------------------ */

static void job_free(struct http_job *j)
{
    for (int i = 0; i < j->n_c; i++) {
        struct job_choice *c = &j->c[i];
        for (int k = 0; k < c->nq; k++) free(c->q[k].plp), free(c->q[k].ptop);
        free(c->q);
        free(c->work);
        pthread_mutex_destroy(&c->mu);
        http_choice_dispose(&c->ch);
        http_buf_dispose(&c->text);
        if (c->text_pos.ts) tok_stream_destroy(c->text_pos.ts);
        free(c->lps);
        free(c->plps);
        free(c->ids);
        http_out_destroy(c->out);
    }
    free(j->c);
    http_gen_dispose(&j->g);
    http_buf_dispose(&j->out);
    http_buf_dispose(&j->sending);
    h2o_linklist_unlink(&j->link);
    http_models_release(j->loop->srv->models, j->served);
    atomic_fetch_sub(&j->loop->srv->jobs, 1);
    free(j);
}

static void job_release(struct http_job *j)
{
    if (--j->refs == 0) job_free(j);
}

/* Everything finished: write the tail (streaming) or the whole response. */
static void job_complete(struct http_job *j)
{
    j->complete = 1;
    if (!j->req) return;
    if (!j->started) {
        struct http_buf body = {0};
        if (j->failed_status) {
            http_reply_error(j->req, j->route, &j->err);
            j->final_sent = 1;
            return;
        }
        http_fmt_final(j, &body);
        http_reply(j->req, j->route, 200, "application/json", body.p, body.len);
        http_buf_dispose(&body);
        j->final_sent = 1;
        return;
    }
    http_fmt_stream_tail(j, &j->out);
    job_flush(j);
}

static void add_lp(struct http_lp **v, int *n, int *cap, const struct ev_rec *r)
{
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        *v = xrealloc(*v, sizeof **v * (size_t)*cap);
    }
    struct http_lp *lp = &(*v)[(*n)++];
    lp->id = r->token;
    lp->logprob = r->logprob;
    lp->has_lp = 1;
    lp->n_top = r->n_top;
    memcpy(lp->top, r->top, sizeof *lp->top * (size_t)r->n_top);
}

/* The prompt logprobs event (echo + logprobs): one record per prompt token. */
static void take_prompt_lps(struct http_job *j, struct job_choice *c, const struct ev_rec *r)
{
    const int32_t *ids = j->g.prompts[c->prompt];
    int n = j->g.n_prompt[c->prompt];
    free(c->plps);
    c->plps = xcalloc((size_t)(n ? n : 1), sizeof *c->plps);
    c->n_plps = n;
    for (int i = 0; i < n; i++) {
        struct http_lp *lp = &c->plps[i];
        lp->id = ids[i];
        lp->has_lp = i > 0 && i < r->n_plp && isfinite(r->plp[i]);
        lp->logprob = lp->has_lp ? r->plp[i] : 0;
        lp->n_top = lp->has_lp && r->ptop ? r->n_top : 0;
        if (lp->n_top)
            memcpy(lp->top, r->ptop + (size_t)i * (size_t)r->n_top,
                   sizeof *lp->top * (size_t)lp->n_top);
    }
}

/* Processes one batch of a choice's events on the loop thread. */
static void process(struct http_job *j, struct job_choice *c, struct ev_rec *evs, int n)
{
    struct http_server *s = j->loop->srv;
    struct http_buf delta = {0};
    struct http_lp *lps = NULL; /* this batch's logprobs (streaming) */
    int n_lps = 0, cap_lps = 0, finished = 0;
    for (int k = 0; k < n; k++) {
        struct ev_rec *r = &evs[k];
        if (!c->seen) {
            c->seen = 1;
            c->n_prompt = r->n_prompt;
            c->n_cached = r->n_cached;
        }
        if (r->kind == ENGINE_EV_PROMPT_LOGPROBS) {
            take_prompt_lps(j, c, r);
        } else if (r->kind == ENGINE_EV_TOKEN && !c->ch.stopped && !j->g.score_only) {
            if (c->n_output == 0)
                http_metrics_ttft(s->metrics, r->t - j->t_start);
            else
                http_metrics_itl(s->metrics, r->t - c->t_last);
            c->t_last = r->t;
            c->n_output = r->n_output;
            if (j->g.logprobs) {
                if (j->g.stream)
                    add_lp(&lps, &n_lps, &cap_lps, r);
                else
                    add_lp(&c->lps, &c->n_lps, &c->cap_lps, r);
            }
            if (j->g.return_ids) {
                if (c->n_ids == c->cap_ids) {
                    c->cap_ids = c->cap_ids ? c->cap_ids * 2 : 64;
                    c->ids = xrealloc(c->ids, sizeof *c->ids * (size_t)c->cap_ids);
                }
                c->ids[c->n_ids++] = r->token;
            }
            int special = c->out ? http_out_special(j, c, r->token, &delta) : 0;
            if (special == 2 || (!special && http_choice_push(&c->ch, r->token, &delta))) {
                c->finish = FINISH_STOP;
                struct engine *en = j->served->engine;
                if (r->finish == FINISH_NONE && en) engine_stop_request(en, c->req_id);
            }
        }
        if (r->finish != FINISH_NONE) {
            finished = 1;
            if (!c->done) http_metrics_e2e(s->metrics, r->t - j->t_start);
            if (!c->ch.stopped) {
                c->finish = r->finish;
                http_choice_finish(&c->ch, &delta);
            } else if (r->finish != FINISH_STOP) {
                /* the engine ended it (length, say) before our stop request reached it */
                struct engine *en = j->served->engine;
                if (en) engine_recount_stop(en, r->finish);
            }
        }
        free(r->plp);
        free(r->ptop);
    }
    if (c->out) {
        if (j->req || !j->g.stream)
            http_out_feed(j, c, delta.p ? delta.p : "", delta.len, lps, n_lps, finished);
        if (j->g.stream) c->n_ids = 0;
    } else if (j->g.stream) {
        if (j->req)
            http_fmt_stream_choice(j, c->index, delta.p ? delta.p : "", delta.len, lps, n_lps,
                                   finished);
        c->n_ids = 0;
    } else if (delta.len) {
        http_buf_append(&c->text, delta.p, delta.len);
    }
    free(lps);
    http_buf_dispose(&delta);
    if (finished && !c->done) {
        c->done = 1;
        c->req_id = 0;
        if (c->finish == FINISH_ERROR && !j->failed_status)
            j->failed_status = http_error_set(&j->err, 400, NULL,
                                              "the request cannot be served: it does not fit "
                                              "the KV cache")
                                   ? 400
                                   : 0;
        if (c->finish == FINISH_ABORT && j->req && !j->failed_status) {
            const char *why = j->stalled ? "the client did not read its stream"
                              : atomic_load(&s->shutting_down) ? "the server is shutting down"
                                                               : "the engine ended it";
            j->failed_status =
                http_error_set(&j->err, 503, NULL, "the request was aborted: %s", why) ? 503 : 0;
        }
        if (--j->live == 0) job_complete(j);
        job_release(j);
    }
}

void http_job_on_events(h2o_multithread_receiver_t *r, h2o_linklist_t *messages)
{
    (void)r;
    while (!h2o_linklist_is_empty(messages)) {
        h2o_multithread_message_t *m =
            H2O_STRUCT_FROM_MEMBER(h2o_multithread_message_t, link, messages->next);
        h2o_linklist_unlink(&m->link);
        struct job_choice *c = H2O_STRUCT_FROM_MEMBER(struct job_choice, msg, m);
        struct http_job *j = c->job;
        j->refs++; /* the job outlives this batch even when its last event is in it */
        pthread_mutex_lock(&c->mu);
        struct ev_rec *evs = c->q;
        int n = c->nq, cap = c->capq;
        c->q = c->work;
        c->capq = c->capw;
        c->nq = 0;
        c->work = evs;
        c->capw = cap;
        c->pending = 0;
        pthread_mutex_unlock(&c->mu);
        process(j, c, evs, n);
        check_buffer(j);
        job_flush(j);
        job_release(j);
    }
}

/*
 * A write that waited --stream-idle-timeout seconds: the request is aborted and the
 * connection shut down (the socket stays open for h2o, whose pending write then fails and
 * which closes the connection itself).
 */
static void check_idle(struct http_job *j, double now)
{
    if (!j->req || !j->inflight || now - j->t_write < j->loop->srv->cfg.stream_idle_timeout) return;
    if (j->stalled == 1 + HTTP_STREAM_ABORT_IDLE_TIMEOUT) return;
    j->stalled = 0; /* counted again, under the reason that ends the connection */
    stall(j, HTTP_STREAM_ABORT_IDLE_TIMEOUT);
    h2o_socket_t *sock = j->req->conn->callbacks->get_socket
                             ? j->req->conn->callbacks->get_socket(j->req->conn)
                             : NULL;
    int fd = sock ? h2o_socket_get_fd(sock) : -1;
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
}

void http_job_probe_clients(struct http_loop *l)
{
    double now = util_now();
    for (h2o_linklist_t *n = l->jobs.next; n != &l->jobs; n = n->next) {
        struct http_job *j = H2O_STRUCT_FROM_MEMBER(struct http_job, link, n);
        check_idle(j, now);
        if (!j->req || j->complete || j->header_sent || j->req->version >= 0x200) continue;
        h2o_socket_t *sock = j->req->conn->callbacks->get_socket
                                 ? j->req->conn->callbacks->get_socket(j->req->conn)
                                 : NULL;
        int fd = sock ? h2o_socket_get_fd(sock) : -1;
        if (fd < 0) continue;
        char c;
        ssize_t got = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            abort_choices(j); /* a reset: the client is gone */
        } else if (got == 0 && j->eof_seen) {
            /* after the end of stream recv keeps saying 0; the reset shows in the state */
            struct tcp_info ti;
            socklen_t tl = sizeof ti;
            if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 && ti.tcpi_state == TCP_CLOSE)
                abort_choices(j);
        } else if (got == 0 && !j->eof_seen) {
            /*
             * End of stream: the client closed its connection, or only its sending side
             * (shutdown(SHUT_WR) after the request, which HTTP/1.1 allows). An interim
             * "102 Processing" tells them apart: a closed socket answers it with a reset,
             * which the next check sees; a half-closed client skips it and gets its
             * response. Over TLS no bytes can be slipped in, and the request is aborted.
             */
            j->eof_seen = 1;
            static const char interim[] = "HTTP/1.1 102 Processing\r\n\r\n";
            if (sock->ssl || send(fd, interim, sizeof interim - 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
                abort_choices(j);
        }
    }
}

void http_job_abort_all(struct http_loop *l)
{
    for (h2o_linklist_t *n = l->jobs.next; n != &l->jobs; n = n->next)
        abort_choices(H2O_STRUCT_FROM_MEMBER(struct http_job, link, n));
}

void http_job_start(struct http_loop *l, h2o_req_t *req, enum http_route route,
                    struct http_served *m, struct http_gen *g)
{
    struct http_server *s = l->srv;
    struct http_job *j = xcalloc(1, sizeof *j);
    j->loop = l;
    j->served = m;
    j->req = req;
    j->route = route;
    j->g = *g;
    memset(g, 0, sizeof *g);
    j->n_c = j->g.n_prompts * j->g.n;
    j->c = xcalloc((size_t)j->n_c, sizeof *j->c);
    j->t_start = util_now();
    j->created = (long)time(NULL);
    char hex[24];
    http_new_id(s, hex, sizeof hex);
    snprintf(j->id, sizeof j->id, "%s%s",
             route == HTTP_ROUTE_MESSAGES      ? "msg_"
             : route == HTTP_ROUTE_COMPLETIONS ? "cmpl-"
                                               : "chatcmpl-",
             hex);
    h2o_linklist_insert(&l->jobs, &j->link);
    atomic_fetch_add(&s->jobs, 1);
    if (s->cfg.max_conn_streams > 0 || req->version >= 0x200) {
        j->conn = req->conn;
        http_conn_hold(l, j->conn);
    }
    for (int i = 0; i < j->n_c; i++) {
        struct job_choice *c = &j->c[i];
        c->job = j;
        c->index = i;
        c->prompt = i / j->g.n;
        pthread_mutex_init(&c->mu, NULL);
        http_choice_init(&c->ch, m->model.tok, j->g.skip_special, j->g.stop, j->g.n_stop);
        c->out = http_out_create(j);
    }
    /* The request reference: dropped when h2o disposes req. */
    struct http_job **guard = h2o_mem_alloc_shared(&req->pool, sizeof *guard, on_req_dispose);
    *guard = j;
    j->refs = 2; /* and one until the submission below */
    if (j->g.stream) start_stream(j);
    /*
     * The engine gets the request once h2o has handled the rest of what this read brought:
     * a client that resets the stream in the same packet (HTTP/2 rapid reset) costs no
     * prefill, since its request is dropped here before the engine ever sees it.
     */
    atomic_fetch_add(&l->srv->unsubmitted, j->n_c);
    h2o_linklist_insert(&l->to_submit, &j->submit_link);
    if (!h2o_timeout_is_linked(&l->submit))
        h2o_timeout_link(l->loop, &l->ctx.zero_timeout, &l->submit);
}

static void job_submit(struct http_job *j)
{
    struct engine *en = j->served->engine;
    if (!j->req) { /* reset before it was submitted */
        atomic_fetch_sub(&j->loop->srv->unsubmitted, j->n_c);
        job_complete(j);
        return;
    }
    struct sampling_params sp = j->g.sp;
    sp.stop_ids = j->g.stop_ids;
    sp.n_stop_ids = j->g.n_stop_ids;
    sp.logit_bias = j->g.bias;
    sp.n_logit_bias = j->g.n_bias;
    for (int i = 0; i < j->n_c; i++) {
        struct job_choice *c = &j->c[i];
        struct engine_request er = {.prompt = j->g.prompts[c->prompt],
                                    .n_prompt = j->g.n_prompt[c->prompt],
                                    .sp = sp,
                                    .on_event = on_engine_event,
                                    .priority = j->g.priority,
                                    .user = c};
        /* n > 1 without a seed: each choice its own draw; with one, seed + index. */
        if (sp.has_seed) er.sp.seed = sp.seed + (uint64_t)i;
        struct err e = {0};
        j->refs++;
        j->live++;
        c->req_id = en ? engine_submit(en, &er, &e) : 0;
        if (!c->req_id) {
            j->refs--;
            j->live--;
            c->done = 1;
            http_error_set(&j->err, en ? 400 : 503, NULL, "%s",
                           en ? e.msg : "the model is not loaded");
            j->failed_status = j->err.status;
            break;
        }
    }
    atomic_fetch_sub(&j->loop->srv->unsubmitted, j->n_c); /* now the engine counts them */
    if (j->failed_status) abort_choices(j);
    if (j->live == 0) job_complete(j);
    job_flush(j);
}

void http_job_submit_pending(h2o_timeout_entry_t *entry)
{
    struct http_loop *l = H2O_STRUCT_FROM_MEMBER(struct http_loop, submit, entry);
    while (!h2o_linklist_is_empty(&l->to_submit)) {
        struct http_job *j =
            H2O_STRUCT_FROM_MEMBER(struct http_job, submit_link, l->to_submit.next);
        h2o_linklist_unlink(&j->submit_link);
        job_submit(j);
        job_release(j);
    }
}
