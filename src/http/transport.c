/*
 * The errors h2o answers itself, before any handler runs, in the APIs' JSON shape. h2o
 * sends those through h2o_send_error_generic with no path bound yet, which binds the host's
 * fallback path: a filter there sees exactly these responses (pagoda's own go through the
 * "/" path, which has none). The filter swaps h2o's plain-text body ("broken
 * chunked-encoding") for an OpenAI-shaped error, or an Anthropic-shaped one on the
 * Anthropic routes, keeping h2o's status, and counts it in /metrics.
 *
 * What h2o 2.2 answers without that path, and so without a hook, is in docs/SERVER.md
 * ("Transport errors"): an HTTP/1.1 request head with more than 100 headers (a fixed
 * "400 Bad Request" written to the socket), one over 408 KiB (the connection closed), and
 * over HTTP/2 a body past twice --max-body-size (REFUSED_STREAM) and a Content-Length that
 * the DATA frames do not match (PROTOCOL_ERROR).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/internal.h"

/* What h2o says (its body text), and what pagoda says instead. */
static const struct {
    const char *h2o, *message;
} messages[] = {
    {"request entity is too large", "the request body is larger than --max-body-size (%zu bytes)"},
    {"broken chunked-encoding", "the request body's chunked transfer encoding is malformed"},
    {"broken content-length header", "the Content-Length header is not a valid length"},
    {"unknown transfer-encoding", "the Transfer-Encoding is not supported (only chunked is)"},
    {"unknown expectation", "the Expect header is not supported (only 100-continue is)"},
};

static void on_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t bufcnt,
                    h2o_send_state_t state)
{
    struct http_loop *l = http_loop_of(req);
    char text[160];
    size_t n = 0;
    for (size_t i = 0; i < bufcnt && n < sizeof text - 1; i++) {
        size_t k = bufs[i].len < sizeof text - 1 - n ? bufs[i].len : sizeof text - 1 - n;
        memcpy(text + n, bufs[i].base, k);
        n += k;
    }
    text[n] = 0;
    struct http_error he = {0};
    const char *fmt = NULL;
    for (size_t i = 0; i < sizeof messages / sizeof messages[0]; i++)
        if (!strcmp(text, messages[i].h2o)) fmt = messages[i].message;
    if (fmt)
        http_error_set(&he, req->res.status, NULL, fmt, l->srv->cfg.max_body);
    else
        http_error_set(&he, req->res.status, NULL, "%s", n ? text : req->res.reason);
    enum http_route route = http_route_of_path(req->input.path);
    int anthropic = route == HTTP_ROUTE_MESSAGES || route == HTTP_ROUTE_COUNT_TOKENS ||
                    http_anthropic_client(req);
    char *body = anthropic ? http_error_anthropic(&he) : http_error_openai(&he);
    h2o_iovec_t out = h2o_strdup(&req->pool, body, strlen(body));
    free(body);
    req->res.content_length = out.len;
    ssize_t ct = h2o_find_header(&req->res.headers, H2O_TOKEN_CONTENT_TYPE, -1);
    if (ct >= 0)
        req->res.headers.entries[ct].value = h2o_iovec_init(H2O_STRLIT("application/json"));
    else
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                       H2O_STRLIT("application/json"));
    http_metrics_request(l->srv->metrics, route, req->res.status);
    int head = h2o_memis(req->input.method.base, req->input.method.len, H2O_STRLIT("HEAD"));
    h2o_ostream_send_next(self, req, &out, head ? 0 : 1, state);
}

static void on_setup_ostream(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    (void)self;
    if (req->res.status >= 400) {
        h2o_ostream_t *o = h2o_add_ostream(req, sizeof *o, slot);
        o->do_send = on_send;
        slot = &o->next;
    }
    h2o_setup_next_ostream(req, slot);
}

void http_transport_register(h2o_hostconf_t *host)
{
    h2o_filter_t *f = h2o_create_filter(&host->fallback_path, sizeof *f);
    f->on_setup_ostream = on_setup_ostream;
}
