/*
 * reasoning: the thinking text of a reasoning model's output, split from its answer as
 * vLLM's reasoning parsers do, read incrementally. Thinking runs from <think> (or from the
 * start of the output when the prompt already opened it) to </think>; what follows is the
 * answer. Text that may be part of a tag is held until the next push decides it.
 *
 *     struct reason_parser r;
 *     reason_parser_init(&r, REASON_QWEN3, prompt_opened_thinking);
 *     reason_parser_push(&r, text, len, &thinking, &answer);
 *     reason_parser_finish(&r, &thinking, &answer);
 *     reason_parser_dispose(&r);
 *
 * Formats: qwen3 (the output may start with <think>; without it the output is all answer),
 * deepseek_r1 (the output is thinking until </think>, a leading <think> dropped), gemma4
 * (as qwen3 with Gemma 4's <|channel>thought ... <channel|>), harmony (gpt-oss: the bodies of
 * analysis messages are thinking, final and preamble bodies the answer, their markup
 * dropped; a tool call is passed on to the answer as <|start|>assistant<|channel|>commentary
 * to=functions.N <|constrain|>json<|message|>ARGS<|call|> for the harmony tool-call parser).
 */
#ifndef PAGODA_TEXT_REASONING_H
#define PAGODA_TEXT_REASONING_H

#include "text/harmony.h"
#include "text/toolcall.h"

enum reason_format { REASON_NONE, REASON_QWEN3, REASON_DEEPSEEK_R1, REASON_GEMMA4, REASON_HARMONY };

/** A format by its vLLM name; -1 when unknown. */
int reason_format_from_name(const char *name);
const char *reason_format_name(enum reason_format f);

/** The tags that open and close thinking in a format's output. */
const char *reason_format_start(enum reason_format f);
const char *reason_format_end(enum reason_format f);
/** The markup of a format's thinking that tokenizers may hold as special tokens
 * (NULL-terminated): what the output parser must see, and constrained decoding may write. */
const char *const *reason_format_tags(enum reason_format f);

struct reason_parser {
    enum reason_format f;
    int state;             /* before thinking, in it, after it */
    int fresh;             /* in thinking, nothing read yet: a <think> may still come */
    struct tcall_str held; /* text not decided yet */
    struct harmony h;      /* harmony: the messages */
};

/** in_thinking: the prompt ends inside an open <think> (the template opened it). */
void reason_parser_init(struct reason_parser *r, enum reason_format f, int in_thinking);
void reason_parser_dispose(struct reason_parser *r);
/** Feeds output text; appends thinking text to `thinking` and answer text to `answer`. */
void reason_parser_push(struct reason_parser *r, const char *s, size_t n,
                        struct tcall_str *thinking, struct tcall_str *answer);
/** The output ended: releases what is held. */
void reason_parser_finish(struct reason_parser *r, struct tcall_str *thinking,
                          struct tcall_str *answer);
/** Whether the parser is inside the thinking part. */
int reason_parser_thinking(const struct reason_parser *r);

#endif
