/*
 * http choice: the text of one generated sequence. Tokens are detokenized incrementally
 * (tok_stream) and checked against the request's stop strings; text that could still be
 * the start of a stop string is held back until the next token decides it, so a client
 * never sees part of a stop string.
 *
 *     http_choice_init(&c, tok, 1, stops, n_stops);    // tok NULL: the text stays empty
 *     if (http_choice_push(&c, id, &delta)) engine_abort(...);  // a stop string matched
 *     http_choice_finish(&c, &delta);                          // the engine finished
 *     http_choice_dispose(&c);
 */
#ifndef PAGODA_HTTP_CHOICE_H
#define PAGODA_HTTP_CHOICE_H

#include <stdint.h>

#include "http/json.h"
#include "text/tokenizer.h"

struct http_choice {
    struct tok_stream *ts;
    char *const *stop;
    int n_stop;
    struct http_buf held; /* decoded text not released yet (a possible stop-string start) */
    int stopped;          /* a stop string matched: later tokens are ignored */
    int stop_index;       /* which one, -1 when none */
};

void http_choice_init(struct http_choice *c, const struct tok *t, int skip_special,
                      char *const *stop, int n_stop);
void http_choice_dispose(struct http_choice *c);

/**
 * Feeds one generated token and appends the text it releases to out. Returns 1 when a stop
 * string matched: the text before it is released, the stop string and anything after it
 * are dropped, and every later push is ignored.
 */
int http_choice_push(struct http_choice *c, int32_t id, struct http_buf *out);

/** Feeds text that stands for a token the detokenizer leaves out (a special token the
 * output parser needs), with the same stop-string rules as http_choice_push. */
int http_choice_push_text(struct http_choice *c, const char *s, size_t n, struct http_buf *out);

/** The sequence ended: appends what is still held (and the detokenizer's tail) to out. */
void http_choice_finish(struct http_choice *c, struct http_buf *out);

#endif
