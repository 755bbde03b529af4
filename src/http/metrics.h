/*
 * http metrics: the server's counters and histograms, updated from every loop thread
 * (atomics and one mutex per histogram), rendered with the engine's statistics in the
 * Prometheus text format (version 0.0.4) for GET /metrics: pagoda's own names (pagoda_*),
 * and beside them the vLLM names that routers, autoscalers and dashboards read (vllm:*,
 * with vLLM's labels model_name and engine, and vLLM's histogram buckets).
 */
#ifndef PAGODA_HTTP_METRICS_H
#define PAGODA_HTTP_METRICS_H

#include "http/json.h"
#include "sched/engine.h"

enum http_route {
    HTTP_ROUTE_CHAT,
    HTTP_ROUTE_COMPLETIONS,
    HTTP_ROUTE_MESSAGES,
    HTTP_ROUTE_COUNT_TOKENS,
    HTTP_ROUTE_MODELS,
    HTTP_ROUTE_HEALTH,
    HTTP_ROUTE_METRICS,
    HTTP_ROUTE_TOKENIZE,
    HTTP_ROUTE_DETOKENIZE,
    HTTP_ROUTE_EMBEDDINGS,
    HTTP_ROUTE_OTHER, /* unknown paths (404) */
    HTTP_ROUTE_N
};

/** The route label ("/v1/chat/completions", ..., "other"). */
const char *http_route_name(enum http_route r);

struct http_metrics;

/** model_name: the served model name, the vllm:* metrics' model_name label. */
struct http_metrics *http_metrics_create(const char *model_name);
void http_metrics_destroy(struct http_metrics *m);

/** One answered request (status: the HTTP status sent). */
void http_metrics_request(struct http_metrics *m, enum http_route r, int status);
/** Streams open now: +1 when one starts, -1 when it ends. */
void http_metrics_streams(struct http_metrics *m, int delta);
/** Why the server ended a stream whose client stopped reading. */
enum http_stream_abort {
    HTTP_STREAM_ABORT_BUFFER_FULL,  /* more than --max-stream-buffer bytes waited for the client */
    HTTP_STREAM_ABORT_IDLE_TIMEOUT, /* a write waited --stream-idle-timeout seconds */
    HTTP_STREAM_ABORT_N
};
/** One stream ended by the server for reason why. */
void http_metrics_stream_abort(struct http_metrics *m, enum http_stream_abort why);
/** One GOAWAY (ENHANCE_YOUR_CALM) sent to a connection that reset streams too fast. */
void http_metrics_goaway(struct http_metrics *m);
/** One request refused (429): the engine's queue was full, or (per_conn) its connection's. */
void http_metrics_rejected(struct http_metrics *m, int per_conn);
/** Seconds from a request's arrival to its first token. */
void http_metrics_ttft(struct http_metrics *m, double seconds);
/** Seconds between two tokens of one sequence. */
void http_metrics_itl(struct http_metrics *m, double seconds);
/** Seconds from a request's arrival to its last event (one per finished sequence). */
void http_metrics_e2e(struct http_metrics *m, double seconds);

/** Appends the exposition of the HTTP metrics and of st (when non-NULL) to out. */
void http_metrics_render(struct http_metrics *m, const struct engine_stats *st,
                         struct http_buf *out);

#endif
