/*
 * harmony: the messages of OpenAI gpt-oss's output (the harmony format), read incrementally
 * for the tool-call and reasoning parsers. The output is a run of messages
 *
 *     <|start|>ROLE[ to=R]<|channel|>CHANNEL[ to=R][ <|constrain|>TYPE]<|message|>BODY END
 *
 * whose first one begins at <|channel|> (the prompt ends with <|start|>assistant), END
 * being <|end|>, <|call|> (a tool call follows) or <|return|> (the answer is complete).
 * A body is told by its header: a recipient functions.NAME makes it a tool call whose body
 * is the arguments (JSON); channel analysis (or a recipient of a built-in tool) makes it
 * thinking; final, a commentary preamble or a header without a channel make it content.
 * The markup itself goes nowhere. Text outside any message is content.
 *
 *     struct harmony h;
 *     harmony_init(&h, 0);
 *     harmony_run(&h, &held, at_end, &sink, ctx);  // consumes held: what is certain goes out
 *     harmony_dispose(&h);
 *
 * A run costs O(held * longest tag); what stays held is shorter than a tag, or an unfinished
 * header (at most HARMONY_HEAD_MAX bytes: a longer one is read as content).
 */
#ifndef PAGODA_TEXT_HARMONY_H
#define PAGODA_TEXT_HARMONY_H

#include <stddef.h>

#include "text/toolcall.h"

#define HARMONY_HEAD_MAX 256

/** Where the pieces of the output go; ctx is harmony_run's. */
struct harmony_sink {
    void (*text)(void *ctx, const char *s, size_t n);  /* content */
    void (*think)(void *ctx, const char *s, size_t n); /* analysis */
    void (*call_open)(void *ctx, const char *name, size_t n);
    void (*call_args)(void *ctx, const char *s, size_t n);
    void (*call_end)(void *ctx); /* also at the end of an output cut short */
};

struct harmony {
    int st;                /* between messages, in a header, in a body */
    int kind;              /* the open body's: text, thinking or a call */
    struct tcall_str head; /* the open header so far */
};

/** in_analysis: the prompt ends inside an analysis message (its header given). */
void harmony_init(struct harmony *h, int in_analysis);
void harmony_dispose(struct harmony *h);
/** Reads held (the text not consumed yet), leaving only what the next text decides. */
void harmony_run(struct harmony *h, struct tcall_str *held, int at_end,
                 const struct harmony_sink *k, void *ctx);
/** The open message is thinking. */
int harmony_thinking(const struct harmony *h);

/** The special tokens of the format (NULL-terminated). */
extern const char *const harmony_tags[];

#endif
