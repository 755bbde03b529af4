/*
 * http internal: the structures the server's files share. One http_loop per event-loop
 * thread owns its connections, its requests (jobs) and three receivers: engine events,
 * finished embeddings and control messages from the main thread. Nothing here is touched
 * off its loop thread except the atomics of http_server.
 */
#ifndef PAGODA_HTTP_INTERNAL_H
#define PAGODA_HTTP_INTERNAL_H

#ifndef H2O_USE_LIBUV
#define H2O_USE_LIBUV 0
#endif
#include <h2o.h>
#include <pthread.h>
#include <stdatomic.h>

#include "http/embed.h"
#include "http/metrics.h"
#include "http/models.h"
#include "http/request.h"
#include "http/server.h"

struct http_server {
    struct http_config cfg;
    struct http_models *models;
    /* 0 while the one model given loads at start (its requests are a 503); 1 once it is
     * loaded, and from the start when several models load on demand */
    atomic_int ready;
    struct http_metrics *metrics;
    atomic_int shutting_down;
    atomic_int jobs; /* generation and embeddings requests not finished, over all loops */
    /* engine requests admitted but not yet submitted (held until the rest of their read is
     * handled): --max-waiting-requests counts them as waiting */
    atomic_int unsubmitted;
    atomic_ulong next_id;
    time_t started;
    h2o_globalconf_t conf;
    SSL_CTX *ssl;
    int listen_fd;
    struct http_loop *loops;
    int n_loops;
    pthread_mutex_t start_mu; /* a loop thread reports that it is listening */
    pthread_cond_t start_cv;
};

struct http_loop {
    struct http_server *srv;
    h2o_evloop_t *loop;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept;
    h2o_socket_t *listener;
    h2o_multithread_receiver_t events;  /* engine thread -> this loop: token events */
    h2o_multithread_receiver_t control; /* main thread -> this loop: shutdown stages */
    h2o_multithread_receiver_t embeds;  /* engine thread -> this loop: embeddings done */
    h2o_multithread_receiver_t models;  /* model loader -> this loop: a model's state changed */
    h2o_linklist_t model_waits;         /* requests waiting for their model to load (routes.c) */
    h2o_linklist_t jobs;                /* struct http_job of this loop */
    h2o_linklist_t embed_jobs;          /* embedding jobs of this loop (embed_job.c) */
    h2o_linklist_t to_submit;           /* jobs not yet handed to the engine (job.c) */
    h2o_timeout_entry_t submit;         /* hands them over once the current read is handled */
    h2o_timeout_t probe_timeout;        /* the client probe's period */
    h2o_timeout_entry_t probe;          /* looks for HTTP/1.1 clients that hung up */
    int exit;
    struct conn_slot *conns; /* per-connection requests and resets (conns.c) */
    size_t conns_cap, conns_used;
    h2o_timeout_entry_t calm; /* sends GOAWAY to connections that reset too fast */
    int probes;               /* probe ticks, for the once-a-second sweep of conns */
    atomic_ulong accepted;    /* connections this loop accepted (read by /metrics) */
    int started; /* 0 while the thread sets the loop up, 1 when it runs, -errno on failure */
    pthread_t thread;
};

/** The loop of the calling handler's context. */
struct http_loop *http_loop_of(h2o_req_t *req);

/** Sends a complete response (body copied) and counts it. */
void http_reply(h2o_req_t *req, enum http_route route, int status, const char *content_type,
                const char *body, size_t len);
/** Sends he as an OpenAI- or Anthropic-shaped error body. */
void http_reply_error(h2o_req_t *req, enum http_route route, const struct http_error *he);

/** Starts a generation request (takes g and the hold on m); answers itself, errors included. */
void http_job_start(struct http_loop *l, h2o_req_t *req, enum http_route route,
                    struct http_served *m, struct http_gen *g);
/** Generation requests in progress on conn (counted for HTTP/2, and for all with
 * --max-streams-per-connection). */
int http_conn_streams(struct http_loop *l, const h2o_conn_t *conn);
/** One more request of conn in progress. */
void http_conn_hold(struct http_loop *l, const h2o_conn_t *conn);
/** One request of conn ended; reset: the client reset its stream before the response ended. */
void http_conn_release(struct http_loop *l, const h2o_conn_t *conn, int reset);
/** Timeout callback of http_loop.calm: GOAWAY (ENHANCE_YOUR_CALM) to the flagged connections. */
void http_conn_send_calm(h2o_timeout_entry_t *entry);
/** Drops the entries of connections with nothing in progress and nothing to remember. */
void http_conn_sweep(struct http_loop *l);
/** Timeout callback of http_loop.submit: submits the jobs of http_loop.to_submit. */
void http_job_submit_pending(h2o_timeout_entry_t *entry);
/** Receiver callback of http_loop.events. */
void http_job_on_events(h2o_multithread_receiver_t *r, h2o_linklist_t *messages);
/** Aborts the engine requests of every job of the loop (shutdown). */
void http_job_abort_all(struct http_loop *l);
/**
 * Aborts the jobs whose HTTP/1.1 client closed its connection before the response started
 * (h2o reads no HTTP/1.1 socket while a request is handled, so nothing else notices).
 * Runs every 100 ms on each loop.
 */
void http_job_probe_clients(struct http_loop *l);

/** Starts an embeddings request (takes q and the hold on m); answers itself, errors included. */
void http_embed_start(struct http_loop *l, h2o_req_t *req, struct http_served *m,
                      struct http_embed *q);
/** Receiver callback of http_loop.embeds. */
void http_embed_on_done(h2o_multithread_receiver_t *r, h2o_linklist_t *messages);
/** Aborts the engine requests of every embedding job of the loop (shutdown). */
void http_embed_abort_all(struct http_loop *l);

/** The route handlers; each answers req. */
int http_routes_dispatch(struct http_loop *l, h2o_req_t *req);
/** The route of a request path (the query ignored); HTTP_ROUTE_OTHER when none. */
enum http_route http_route_of_path(h2o_iovec_t path);
/**
 * Registers on host's fallback path the filter that turns the errors h2o answers itself
 * (before any handler: a body over the limit, broken chunked encoding, a bad Content-Length,
 * an unknown Transfer-Encoding or Expect) into OpenAI- or Anthropic-shaped JSON (transport.c).
 */
void http_transport_register(h2o_hostconf_t *host);
/** 1 when the client says it speaks the Anthropic API (an anthropic-version header). */
int http_anthropic_client(h2o_req_t *req);
/** The routes that need a model (generation, embeddings, tokenize, count_tokens): picks it
 * by the body's "model", holds it for the request, or makes the request wait for its load. */
void http_routes_model(struct http_loop *l, h2o_req_t *req, enum http_route route);
/** GET /v1/models (id NULL) and GET /v1/models/{id} (id still percent-encoded). */
void http_routes_models(struct http_server *s, h2o_req_t *req, const char *id, size_t id_len);
/** The per-model series of /metrics. */
void http_routes_models_metrics(struct http_models *ms, struct http_buf *b);
/** Parks req until model (whose failed loads were `failures`) loads or fails to. */
void http_models_wait(struct http_loop *l, h2o_req_t *req, enum http_route route, int model,
                      unsigned failures);
/** Receiver callback of http_loop.models: resumes the requests whose model loaded or failed. */
void http_routes_on_models(h2o_multithread_receiver_t *r, h2o_linklist_t *messages);
/** Answers every request waiting for a model with a 503 (shutdown). */
void http_routes_drop_waits(struct http_loop *l);

/** A fresh response id suffix (hex). */
void http_new_id(struct http_server *s, char *buf, size_t n);

#endif
