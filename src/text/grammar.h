/*
 * grammar: constrained decoding. A context-free grammar over bytes (GBNF-like: rules,
 * sequences, alternatives, character classes, literals, repetition), compiled from GBNF
 * text, a regular expression, a JSON Schema or a list of choices; a matcher that runs it
 * as a pushdown automaton over the bytes of the output; and per-step token masks over a
 * vocabulary trie.
 *
 *     struct gram *g = gram_from_json_schema(text, len, &e);      // NULL + e when invalid
 *     struct gram_vocab *v = gram_vocab_create(tok, n_vocab, eos, n_eos, &e);
 *     struct gram_matcher *m = gram_matcher_create(g);
 *     gram_matcher_fill_mask(m, v, mask);   // bit id set: the token may come next
 *     gram_matcher_accept_token(m, v, id);  // advance with the chosen token
 *     gram_unref(g);                        // the matcher holds its own reference
 *
 * A compiled grammar is immutable but for its mask cache (guarded by its own lock), so one
 * grammar serves any number of matchers on any threads; a matcher belongs to one thread.
 */
#ifndef PAGODA_TEXT_GRAMMAR_H
#define PAGODA_TEXT_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "text/tokenizer.h"

struct gram;

/** GBNF text (llama.cpp's grammar format); the start rule is "root". */
struct gram *gram_from_gbnf(const char *text, size_t len, struct err *e);
/** A regular expression matched against the whole output (see grammar_regex.c). */
struct gram *gram_from_regex(const char *re, size_t len, struct err *e);
/** A JSON Schema (JSON text): the output is one JSON value valid under it. */
struct gram *gram_from_json_schema(const char *json, size_t len, struct err *e);
/** Any JSON object (OpenAI response_format json_object). */
struct gram *gram_json_object(void);
/** Exactly one of n strings (vLLM guided_choice). */
struct gram *gram_from_choices(const char *const *s, const size_t *len, int n, struct err *e);

/**
 * Tool calls in a parser's wire format, described by spec (JSON text): {"begin": S,
 * "calls": [{"prefix": S, "schema": {...}, "suffix": S}, ...], "sep": S, "max": N, "end": S}.
 * The output is begin, then 1..max calls separated by sep, then end; each call is one of
 * `calls`: its prefix (or one of several: "prefix": [S, ...]), a JSON value valid under
 * its schema, its suffix. With "syntax": "gemma4" the values are written in Gemma 4's
 * argument syntax instead of JSON (bare keys, strings between <|"|> marks holding no '<',
 * no whitespace). "tags": [S, ...] names the markup that the tokenizer holds as single
 * special tokens: wherever one occurs in begin, prefix, suffix, sep, end (and as Gemma 4's
 * string mark) the grammar asks for the token (GRAM_TAG_MARK), not the spelt text.
 */
struct gram *gram_from_tool_spec(const char *json, size_t len, struct err *e);

enum gram_kind { GRAM_JSON_SCHEMA, GRAM_REGEX, GRAM_GBNF, GRAM_JSON_OBJECT, GRAM_TOOL_SPEC };
/**
 * Compiles through a process-wide cache keyed by the source's hash (text unused for
 * GRAM_JSON_OBJECT): the same text gives the same grammar, one more reference to it.
 */
struct gram *gram_compile_cached(enum gram_kind kind, const char *text, size_t len, struct err *e);

/** Compiles (any of the above) running longer than ms fail with an error naming the bound
 * (the server's --grammar-compile-timeout); 0: no bound. Process-wide; default
 * GRAM_COMPILE_TIMEOUT_MS. */
#define GRAM_COMPILE_TIMEOUT_MS 5000
void gram_set_compile_timeout(int ms);

/** References: creators return one; each gram_ref needs a gram_unref. */
struct gram *gram_ref(struct gram *g);
void gram_unref(struct gram *g);
/** Rules and symbols, for tests and logs. */
int gram_n_rules(const struct gram *g);

/**
 * A special token whose text is one of the vocabulary's tags (a tool-call or reasoning
 * format's markup: <|tool_call>, <|channel|>) reads as this byte followed by its text, so
 * that a grammar tells the single token from the same text spelt in ordinary tokens, and
 * no grammar that spells text (JSON strings, character classes: always UTF-8) admits it.
 * Write GRAM_TAG_MARK_S "<|tool_call>" in a grammar where the token must come. The byte
 * never occurs in UTF-8, so ordinary tokens holding it are left out of the vocabulary.
 */
#define GRAM_TAG_MARK   '\xFF'
#define GRAM_TAG_MARK_S "\xFF"

/**
 * The vocabulary as a trie of token bytes. Special tokens are left out, but those whose
 * text is one of tags (NULL-terminated, or NULL: none), which join as GRAM_TAG_MARK + text;
 * eos ids end the output where the grammar may end, and one that is a tag also where the
 * grammar expects its marked text and may end after it.
 */
struct gram_vocab;
struct gram_vocab *gram_vocab_create(const struct tok *t, int32_t n_vocab, const int32_t *eos,
                                     int n_eos, const char *const *tags, struct err *e);
void gram_vocab_destroy(struct gram_vocab *v);
int32_t gram_vocab_size(const struct gram_vocab *v);
/** Token bytes as the grammar reads them (NULL + *len 0 for ids left out). */
const char *gram_vocab_token(const struct gram_vocab *v, int32_t id, size_t *len);

/** The state of one output under a grammar. */
struct gram_matcher;
struct gram_matcher *gram_matcher_create(struct gram *g);
void gram_matcher_destroy(struct gram_matcher *m);
/** Advances over n bytes if the grammar allows all of them: 1; else 0, state unchanged. */
int gram_matcher_accept_bytes(struct gram_matcher *m, const char *s, size_t n);
/** Whether n bytes would be accepted; the state does not change. */
int gram_matcher_try_bytes(struct gram_matcher *m, const char *s, size_t n);
/** Advances over a token; an end-of-sequence id is accepted when the grammar can end. */
int gram_matcher_accept_token(struct gram_matcher *m, const struct gram_vocab *v, int32_t id);
/** The bytes so far form a complete sentence. */
int gram_matcher_can_end(const struct gram_matcher *m);
/** Complete, and no byte may follow (nothing but end-of-sequence is left). */
int gram_matcher_is_terminated(const struct gram_matcher *m);
/**
 * The tokens that may come next: mask[(n_vocab + 31) / 32] words, bit id of word id / 32
 * set when the token's bytes are a valid continuation (eos ids: when the grammar can end).
 * Cached per state in the grammar; a miss joins the token sets of the state's stacks'
 * top frames (computed once per grammar by gram_prepare, or by a trie walk when first met,
 * and also cached) and checks against each stack only the few tokens that run past the
 * frames its sets were computed with.
 */
void gram_matcher_fill_mask(struct gram_matcher *m, const struct gram_vocab *v, uint32_t *mask);
/**
 * Computes the token sets of every position of g over v now (once per grammar and
 * vocabulary; later calls return at once), so that no mask of any matcher of g walks the
 * trie for a position met for the first time: the step that meets a new state only joins
 * sets and checks its few uncertain tokens. Stops past the compile timeout
 * (gram_set_compile_timeout; a later call goes on) or 65536 entries below the top frames,
 * leaving the rest to be computed when first met (masks are exact either way). Safe alongside
 * matchers of g on other threads. Returns the number of token-set entries made.
 */
int gram_prepare(struct gram *g, const struct gram_vocab *v);

#endif
