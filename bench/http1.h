/*
 * http1: an incremental parser of HTTP/1.1 responses (RFC 9112) for the load client: status
 * line, headers, then a body framed by Content-Length, chunked transfer coding, or the
 * connection's close. Body bytes are handed to a callback as they arrive, so a streamed
 * response can be timed byte by byte.
 *
 *     struct h1_resp r;
 *     h1_resp_init(&r, on_body, ctx);
 *     ssize_t used = h1_resp_feed(&r, buf, n);     // -1: malformed (r.error says why)
 *     if (r.state == H1_DONE) ...                  // r.status, r.keep_alive
 */
#ifndef PAGODA_BENCH_HTTP1_H
#define PAGODA_BENCH_HTTP1_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/** Called with each run of body bytes (already de-chunked). Nonzero aborts the parse. */
typedef int (*h1_body_fn)(void *ctx, const char *data, size_t len);

enum h1_state {
    H1_HEAD,       /* status line and headers */
    H1_BODY_LEN,   /* Content-Length bytes left */
    H1_CHUNK_SIZE, /* a chunk-size line */
    H1_CHUNK_DATA, /* chunk bytes left */
    H1_CHUNK_END,  /* the CRLF after a chunk */
    H1_TRAILERS,   /* trailer lines after the last chunk */
    H1_BODY_CLOSE, /* body until the connection closes */
    H1_DONE,
    H1_ERROR,
};

#define H1_MAX_HEAD 65536 /* bytes of status line + headers */

struct h1_resp {
    enum h1_state state;
    int status;
    int keep_alive;         /* the connection may carry another request */
    int64_t content_length; /* -1 when absent */
    uint64_t left;          /* bytes left in the body or chunk */
    char head[H1_MAX_HEAD];
    size_t head_len;
    char line[128]; /* a chunk-size or trailer line being assembled */
    size_t line_len;
    int head_request; /* the request was HEAD: no body whatever the headers say */
    h1_body_fn on_body;
    void *ctx;
    char error[128];
    char content_type[128];
};

void h1_resp_init(struct h1_resp *r, h1_body_fn on_body, void *ctx);

/**
 * Parses up to n bytes; returns the bytes used (less than n only when the response ended
 * inside buf: the rest belongs to the next response) or -1 with r->error set. A callback's
 * nonzero return also gives -1 ("aborted").
 */
ssize_t h1_resp_feed(struct h1_resp *r, const char *buf, size_t n);

/** The connection closed: completes a close-delimited body; 0 when the response is whole. */
int h1_resp_eof(struct h1_resp *r);

#endif
