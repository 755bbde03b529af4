/*
 * http server: `pagoda serve`. The engine behind h2o: OpenAI (/v1/chat/completions,
 * /v1/completions, /v1/embeddings, /v1/models) and Anthropic (/v1/messages,
 * /v1/messages/count_tokens) routes with SSE streaming, /health, /metrics, /tokenize and
 * /detokenize, over HTTP/1.1, h2c (prior knowledge and Upgrade) and h2 over TLS (ALPN).
 *
 *     struct http_config cfg;
 *     http_config_default(&cfg);
 *     http_model_spec_parse("models/demo", &spec, &e);
 *     cfg.models = &spec, cfg.n_models = 1;
 *     return http_serve(&cfg, &e) == 0 ? 0 : 1;   // returns after SIGTERM / SIGINT
 *
 * One model is loaded at start; several are loaded when a request names one (http/models.h).
 */
#ifndef PAGODA_HTTP_SERVER_H
#define PAGODA_HTTP_SERVER_H

#include <stddef.h>

#include "common/err.h"
#include "http/models.h"
#include "sched/engine.h"

struct http_config {
    const struct http_model_spec *models; /* [n_models] folders and their names */
    int n_models;
    double model_idle_timeout;      /* seconds an idle model stays loaded; 0: for good */
    size_t models_budget;           /* bytes the loaded models may take; 0: no bound */
    const char *host;               /* default 127.0.0.1 */
    int port;                       /* default 8080; 0 picks a free port (printed at start) */
    int threads;                    /* event loops; default 1 */
    const char *tls_cert, *tls_key; /* PEM files: serve HTTPS (h2 via ALPN, and HTTP/1.1) */
    const char *api_key;            /* required on every route but /health and /metrics */
    size_t max_body;                /* request body bytes at most; default 8 MiB */
    double shutdown_timeout;        /* seconds in-flight requests get at shutdown; default 30 */
    int skip_tokenizer_init;        /* no tokenizer: token-id prompts in, token ids out */
    const char *allowed_origins;    /* CORS: "*", a comma or JSON list; NULL/"": none */
    int max_waiting;                /* requests waiting in the engine at most; 0: no bound */
    int max_conn_streams;         /* generation requests in progress per connection; 0: no bound */
    size_t max_stream_buffer;     /* bytes a stream may hold for a client that does not read */
    double stream_idle_timeout;   /* seconds a stream's write may wait for the client */
    const char *chat_template;    /* a template file in place of the model's; NULL: the model's */
    const char *tool_call_parser; /* vLLM's parser name; NULL: from the chat template */
    const char *reasoning_parser; /* vLLM's parser name; NULL: no thinking split */
    struct engine_config engine;
};

void http_config_default(struct http_config *cfg);

/**
 * Serves until SIGTERM or SIGINT, then stops accepting, lets in-flight requests finish
 * for up to shutdown_timeout seconds, aborts the rest and returns 0. -1 + err when the
 * server cannot start (bad model, port in use, bad certificate).
 */
int http_serve(const struct http_config *cfg, struct err *e);

#endif
