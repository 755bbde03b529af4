/*
 * hc: a single-threaded HTTP client for one origin (http://host:port), driven by epoll, that
 * keeps many requests in flight: HTTP/1.1 with a pool of keep-alive connections (one request
 * per connection at a time), or HTTP/2 (h2c with prior knowledge, or h2 over TLS by ALPN)
 * with many streams multiplexed on a few connections (libnghttp2). https URLs use TLS
 * (OpenSSL).
 *
 *     struct hc *c = hc_create(&url, HC_HTTP2, 1, &e);
 *     hc_submit(c, "POST", "/v1/completions", body, len, &callbacks, ctx);
 *     while (hc_active(c)) hc_poll(c, 100);       // callbacks fire inside hc_poll
 *     hc_destroy(c);
 *
 * Every submitted request gets exactly one on_done, from hc_poll, hc_cancel or hc_destroy.
 * Body bytes reach on_body as soon as a read returns them, so streamed responses can be
 * timed at the client.
 */
#ifndef PAGODA_BENCH_HC_H
#define PAGODA_BENCH_HC_H

#include <stddef.h>

#include "common/err.h"

struct hc;
struct hc_req;

/** http://host[:port][/prefix] split into its parts. */
struct hc_url {
    int tls; /* https */
    char host[256];
    char port[16];
    char prefix[512]; /* without a trailing slash; "" for none */
};

/** Parses an http:// or https:// URL. 0, or -1 + err. */
int hc_url_parse(const char *s, struct hc_url *u, struct err *e);

enum hc_proto { HC_HTTP1, HC_HTTP2 };

/** TLS settings for https URLs. */
struct hc_tls_opts {
    int insecure;       /* do not verify the server's certificate */
    const char *cafile; /* PEM CA certificates to verify it with (default: the system's) */
};

struct hc_callbacks {
    /** The response status is known (HTTP/2: the :status header; HTTP/1.1: the head). */
    void (*on_head)(void *ctx, int status);
    /** Body bytes as they arrive; nonzero cancels the request (on_done with an error). */
    int (*on_body)(void *ctx, const char *data, size_t len);
    /** Exactly once: ok = 1 when the whole response arrived, else error says why. */
    void (*on_done)(void *ctx, int ok, const char *error);
};

/**
 * Resolves the host and prepares the client (no connection is opened yet). http2: HTTP/2
 * over `connections` connections (streams spread round-robin). api_key, when non-NULL, is
 * sent as "Authorization: Bearer KEY"; tls applies to https URLs (NULL: defaults).
 */
struct hc *hc_create(const struct hc_url *u, enum hc_proto proto, int connections,
                     const char *api_key, const struct hc_tls_opts *tls, struct err *e);
/** Fails whatever is in flight (on_done with "client closed") and frees everything. */
void hc_destroy(struct hc *c);

/**
 * Queues a request; body is copied. Returns a handle valid until its on_done returns, or
 * NULL when the request already failed (its on_done has run) before hc_submit returned.
 */
struct hc_req *hc_submit(struct hc *c, const char *method, const char *path, const char *body,
                         size_t body_len, const struct hc_callbacks *cb, void *ctx);

/** Ends a request now: on_done(ctx, 0, reason) is called before this returns. */
void hc_cancel(struct hc *c, struct hc_req *r, const char *reason);

/** Waits up to timeout_ms for socket events and runs the callbacks. -1 on an epoll failure. */
int hc_poll(struct hc *c, int timeout_ms);

/** Requests submitted and not yet done. */
int hc_active(const struct hc *c);

/**
 * Blocking request for small bodies (/metrics, /v1/models): runs hc_poll until done or
 * timeout_s. *resp gets the NUL-terminated heap body, *status the status. 0 or -1 + err.
 */
int hc_fetch(struct hc *c, const char *method, const char *path, const char *body, double timeout_s,
             int *status, char **resp, size_t *resp_len, struct err *e);

#endif
