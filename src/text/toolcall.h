/*
 * toolcall: the tool calls in a model's output text, as vLLM's tool parsers find them, read
 * incrementally. Text goes in as it is generated; what is plain content comes out as soon
 * as it can no longer be the start of tool markup, and each call's name and arguments grow
 * as they become certain. Arguments only ever grow (they are never rewritten), so the
 * pieces a client receives concatenate to the final arguments in any chunking.
 *
 *     struct tcall_parser *p = tcall_parser_create(TCALL_HERMES, tools);
 *     tcall_parser_push(p, text, len, &content);      // content: released plain text
 *     for (int i = 0; i < tcall_parser_n_calls(p); i++) {
 *         const struct tcall *c = tcall_parser_call(p, i);   // name NULL until known
 *     }
 *     tcall_parser_finish(p, &content);                // the output ended
 *     tcall_parser_destroy(p);
 *
 * Formats (the wire formats of the model families; vLLM's parser names):
 *   hermes      <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>, repeated
 *   qwen3_xml   <tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>\n</function>\n
 *               </tool_call>; values typed by the tool's JSON Schema (strings as they are,
 *               other types parsed as JSON)
 *   llama3_json an output that starts with {"name": N, "parameters": {...}} (optionally
 *               after <|python_tag|>); calls separated by ';'
 *   mistral     [TOOL_CALLS][{"name": N, "arguments": {...}}, ...] or, from v11 templates,
 *               [TOOL_CALLS]N[ARGS]{...}
 *   gemma4      <|tool_call>call:N{key:value,...}<tool_call|>, repeated; Gemma 4's argument
 *               syntax (bare keys, strings between <|"|> marks, numbers, true, false, null,
 *               {} and [] as in JSON) converted to JSON
 *   harmony     gpt-oss's messages (harmony.h): <|channel|>commentary to=functions.N
 *               <|constrain|>json<|message|>{...}<|call|>; other messages' bodies are
 *               content (analysis too, when no reasoning parser took it), their markup dropped
 * JSON arguments are kept in compact form (whitespace outside strings dropped). A call whose
 * markup turns out malformed before its name is known is released as content; one cut short
 * after that (the output ran out) keeps the arguments it had.
 */
#ifndef PAGODA_TEXT_TOOLCALL_H
#define PAGODA_TEXT_TOOLCALL_H

#include <stddef.h>

#include <cjson/cJSON.h>

enum tcall_format {
    TCALL_NONE,
    TCALL_HERMES,
    TCALL_QWEN3_XML,
    TCALL_LLAMA3_JSON,
    TCALL_MISTRAL,
    TCALL_GEMMA4,
    TCALL_HARMONY,
};

/** A format by its vLLM name; -1 when unknown (or one pagoda does not read). */
int tcall_format_from_name(const char *name);
const char *tcall_format_name(enum tcall_format f);
/** The format a chat template's tool markup implies (TCALL_NONE when it shows none). */
enum tcall_format tcall_format_detect(const char *template_src);
/** The text that opens a call in the output (what an `auto` grammar waits for), or NULL
 * when a call is recognised only at the start of the output (llama3_json). */
const char *tcall_format_trigger(enum tcall_format f);

/** The markup strings of a format (NULL-terminated): the text of tokens that a tokenizer
 * may hold as special tokens and that the parser must still see. */
const char *const *tcall_format_tags(enum tcall_format f);

/** A growable string (text module's own; zero-initialized is empty). */
struct tcall_str {
    char *p;
    size_t len, cap;
};
void tcall_str_append(struct tcall_str *s, const char *p, size_t n);
void tcall_str_dispose(struct tcall_str *s);

/** One call found in the output. */
struct tcall {
    char *name;            /* NUL-terminated; NULL until the whole name has been read */
    struct tcall_str args; /* the arguments (JSON) so far; args.p never NULL */
    int done;              /* the call's markup is complete: args are final */
};

struct tcall_parser;

/** tools: the request's tools in OpenAI's shape (borrowed for the parser's life; read by
 * qwen3_xml for the parameter types), or NULL. */
struct tcall_parser *tcall_parser_create(enum tcall_format f, const cJSON *tools);
void tcall_parser_destroy(struct tcall_parser *p);
/** Feeds output text; appends the text that is plain content to `content`. */
void tcall_parser_push(struct tcall_parser *p, const char *s, size_t n, struct tcall_str *content);
/** The output ended: releases what was held back (as content or into the open call). */
void tcall_parser_finish(struct tcall_parser *p, struct tcall_str *content);
int tcall_parser_n_calls(const struct tcall_parser *p);
const struct tcall *tcall_parser_call(const struct tcall_parser *p, int i);

#endif
