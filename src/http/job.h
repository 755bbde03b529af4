/*
 * http job: the state of one generation request between the route that parsed it and the
 * response (see job.c for the threading and lifetime rules), and the formatters that
 * turn it into OpenAI / Anthropic bodies and SSE events (format.c).
 */
#ifndef PAGODA_HTTP_JOB_H
#define PAGODA_HTTP_JOB_H

#include "http/choice.h"
#include "http/internal.h"

/** One token's log-probabilities as reported to clients. */
struct http_lp {
    int32_t id;
    int has_lp; /* 0 for the first prompt token (no log-probability) */
    float logprob;
    int n_top;
    struct token_logprob top[ENGINE_MAX_TOP_LOGPROBS];
};

/** Where a sequence's text stands, for text_offset: a detokenizer and its characters. */
struct http_text_pos {
    struct tok_stream *ts; /* created at the first token */
    long chars;            /* code points made final so far */
};

struct ev_rec {
    enum engine_event_kind kind;
    int32_t token;
    float logprob;
    int n_top;
    struct token_logprob top[ENGINE_MAX_TOP_LOGPROBS];
    enum finish_reason finish;
    int n_prompt, n_cached, n_output;
    int n_plp;
    float *plp;                 /* prompt logprobs [n_plp] (heap) */
    struct token_logprob *ptop; /* [n_plp * n_top] (heap) */
    double t;                   /* engine-side arrival, seconds */
};

struct http_out; /* the reasoning and tool-call parsing of a choice's output (output.c) */

struct job_choice {
    struct http_job *job;
    int index, prompt;
    uint64_t req_id; /* 0 once finished (or never submitted) */
    /* engine thread -> loop thread */
    pthread_mutex_t mu;
    struct ev_rec *q;
    int nq, capq, pending;
    h2o_multithread_message_t msg;
    /* loop thread */
    struct ev_rec *work;
    int capw;
    struct http_choice ch;
    int seen, done;
    int n_prompt, n_cached, n_output;
    enum finish_reason finish;
    double t_last;
    int sent_first;                /* streaming: the choice's first chunk is out */
    struct http_text_pos text_pos; /* completions logprobs, streaming: text_offset state */
    struct http_buf text;          /* non-streaming: all text */
    struct http_lp *lps;           /* non-streaming: logprobs of every token */
    int n_lps, cap_lps;
    struct http_lp *plps; /* echo: prompt logprobs */
    int n_plps;
    int32_t *ids; /* return_token_ids: generated ids not sent yet (streaming) or all of them */
    int n_ids, cap_ids;
    struct http_out *out; /* NULL: the text is all content */
    int n_calls;          /* tool calls found in the output */
};

struct http_job {
    struct http_loop *loop;
    struct http_served *served; /* held (http_models_acquire) until the job is freed */
    h2o_req_t *req;             /* NULL once h2o disposed it */
    enum http_route route;
    struct http_gen g;
    struct job_choice *c;
    int n_c, live, refs;
    int complete; /* every choice finished: the tail is written */
    int final_sent, inflight, started, header_sent, counted_stream;
    int msg_started;   /* Anthropic stream: message_start is out */
    int failed_status; /* non-zero: answer with this error */
    int eof_seen;      /* HTTP/1.1: the client's end of stream was seen (the probe) */
    int stalled;       /* 1 + enum http_stream_abort once the client stopped reading */
    double t_write;    /* when the write in flight was handed to h2o */
    struct http_error err;
    struct http_buf out, sending;
    h2o_generator_t gen;
    char id[48];
    long created;
    double t_start;
    const h2o_conn_t *conn; /* counted in loop->conns while req is set (when bounded) */
    h2o_linklist_t link;
    h2o_linklist_t submit_link; /* in loop->to_submit until handed to the engine */
};

/** The complete non-streaming body of a finished job. */
void http_fmt_final(struct http_job *j, struct http_buf *out);
/** SSE events for choice `index`: new text, its tokens' logprobs and ids (the choice's
 * `ids`, which the caller then empties), and the finish. */
void http_fmt_stream_choice(struct http_job *j, int index, const char *delta, size_t len,
                            const struct http_lp *lps, int n_lps, int finished);
/** The end of a stream: usage, [DONE] / message_stop, or the error event. */
void http_fmt_stream_tail(struct http_job *j, struct http_buf *out);
/** One SSE event (event NULL: a data-only one). */
void http_fmt_sse(struct http_buf *o, const char *event, const struct http_buf *data);
/** A chat chunk of choice `index` whose delta is the JSON object delta_json (the role chunk
 * first when the choice has sent nothing yet). */
void http_fmt_stream_delta(struct http_job *j, int index, const char *delta_json);
/** Anthropic: message_start (and, without output parsing, the text block). */
void http_fmt_anthropic_start(struct http_job *j, struct http_buf *o);

/**
 * Output parsing (output.c): reasoning split and tool calls of a chat or messages choice.
 * http_out_create returns NULL when the request needs neither.
 */
struct http_out *http_out_create(struct http_job *j);
void http_out_destroy(struct http_out *o);
/** Runs the parsers over new text of c (finished: the output ended); non-streaming keeps
 * the parts, streaming writes their events, content through http_fmt_stream_choice. */
void http_out_feed(struct http_job *j, struct job_choice *c, const char *s, size_t n,
                   const struct http_lp *lps, int n_lps, int finished);
/**
 * A special token whose text is markup the output parsers read (a tool-call or thinking
 * tag that the tokenizer holds as a special token, which the text otherwise drops): pushes
 * its text through c's stop strings into delta and returns 1 (2 when a stop string
 * matched); 0 for any other token.
 */
int http_out_special(struct http_job *j, struct job_choice *c, int32_t id, struct http_buf *delta);
/** Final bodies: the chat message object, the Anthropic content array. */
void http_out_openai_message(struct http_job *j, struct job_choice *c, struct http_buf *o);
void http_out_anthropic_content(struct http_job *j, struct job_choice *c, struct http_buf *o);
/** Anthropic stream tail: closes the open content block (an empty text block if none),
 * into j->out. */
void http_out_anthropic_close(struct http_job *j);

#endif
