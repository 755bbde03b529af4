/*
 * sse: an incremental parser of Server-Sent Events (text/event-stream, as the WHATWG HTML
 * standard defines it), fed with whatever bytes a socket read returns.
 *
 *     struct sse_parser p;
 *     sse_init(&p, on_event, ctx);
 *     while (read ...) if (sse_feed(&p, buf, n) != 0) break;   // on_event fires per event
 *     sse_dispose(&p);
 *
 * Lines end with CRLF, LF or CR (a CRLF split between two reads is one line end). A blank
 * line dispatches the event built so far; "data:" lines are joined with LF; "event:" sets
 * the type (default "message"); lines starting with ':' are comments (keep-alives), counted
 * in `comments`; "id:" and "retry:" are accepted and ignored. A UTF-8 BOM before the first
 * byte is skipped. An event not ended by a blank line when the stream closes is not
 * dispatched (sse_pending tells the caller one was cut off).
 */
#ifndef PAGODA_BENCH_SSE_H
#define PAGODA_BENCH_SSE_H

#include <stddef.h>
#include <stdint.h>

/** Called per event; data is NUL-terminated (len excludes the NUL). Nonzero stops the feed. */
typedef int (*sse_event_fn)(void *ctx, const char *event, const char *data, size_t len);

#define SSE_MAX_LINE (16u << 20) /* a longer line is an error: a server is misbehaving */

struct sse_parser {
    sse_event_fn on_event;
    void *ctx;
    char *line; /* the line being assembled (no terminator) */
    size_t line_len, line_cap;
    char *data; /* the event's data lines joined with LF (each followed by LF until dispatch) */
    size_t data_len, data_cap;
    char event[64];    /* the event type; "" means "message" */
    int has_data;      /* a data field was seen since the last dispatch */
    int after_cr;      /* the last byte was CR: a following LF belongs to the same line end */
    int bom_state;     /* 0..2 BOM bytes matched at the stream start, 3 = past the start */
    uint64_t comments; /* comment lines seen */
    uint64_t events;   /* events dispatched */
};

void sse_init(struct sse_parser *p, sse_event_fn on_event, void *ctx);
void sse_dispose(struct sse_parser *p);

/**
 * Parses n more bytes. Returns 0; the nonzero value of a callback that asked to stop
 * (the rest of buf is then not parsed); or -1 when a line exceeds SSE_MAX_LINE.
 */
int sse_feed(struct sse_parser *p, const char *buf, size_t n);

/** 1 when a partial line or an undispatched event is held (the stream was cut mid-event). */
int sse_pending(const struct sse_parser *p);

#endif
