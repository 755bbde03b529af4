/*
 * request: one benchmark request against an OpenAI-compatible server: its JSON body
 * (/v1/completions or /v1/chat/completions, streamed with usage), and the handling of the
 * streamed response that fills a struct req_result: content chunk arrival times, usage,
 * finish reason, and an error message for anything but a clean 200 stream.
 */
#ifndef PAGODA_BENCH_REQUEST_H
#define PAGODA_BENCH_REQUEST_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "bench/dataset.h"
#include "bench/hc.h"
#include "bench/sse.h"
#include "bench/stats.h"

struct req_opts {
    int chat; /* chat completions; else completions */
    const char *model;
    double temperature; /* < 0: not sent */
    int ignore_eos;     /* send "ignore_eos": true */
    const cJSON *extra; /* an object whose members are added to every body (or NULL) */
};

/** The request body for prompt p; a heap string. */
char *request_body(const struct req_opts *o, const struct prompt *p);

struct breq;
typedef void (*breq_done_fn)(void *owner, struct breq *b);

struct breq {
    struct req_result *res;
    struct sse_parser sse;
    double t_send; /* util_now() when sent */
    double t_run0; /* util_now() when the run started (chunk times are relative to it) */
    char *errbody; /* the body of a non-200 response (first 4 KiB) */
    size_t errlen;
    char *stream_error; /* an error event inside the stream */
    struct hc_req *h;
    breq_done_fn done;
    void *owner;
    long *chunk_counter; /* incremented per content chunk (progress display), may be NULL */
    int slot;            /* the owner's bookkeeping */
};

/** Callbacks for hc_submit with a struct breq as ctx. */
extern const struct hc_callbacks breq_callbacks;

/** Prepares b for a request whose result goes to res (res is reset first). */
void breq_init(struct breq *b, struct req_result *res, double t_run0, breq_done_fn done,
               void *owner);
/** Frees what b holds (not res). */
void breq_dispose(struct breq *b);

/** Handles one SSE event of a streamed completion (exposed for tests). 0, 1 to stop. */
int breq_on_event(void *ctx, const char *event, const char *data, size_t len);

#endif
