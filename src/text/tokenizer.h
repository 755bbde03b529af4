/*
 * tokenizer: Hugging Face tokenizer.json (BPE, byte-level and SentencePiece-style) with
 * tokenizer_config.json, encoding to exactly the ids that Hugging Face tokenizers produce,
 * and streaming detokenization.
 *
 *     struct tok *t = tok_load(dir, &e);
 *     tok_encode(t, text, len, 1, &ids, &n, &e);   // 1: run the post-processor (BOS...)
 *     char *s = tok_decode(t, ids, n, 0);
 */
#ifndef PAGODA_MODEL_TOKENIZER_H
#define PAGODA_MODEL_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

struct tok;

/** Loads DIR/tokenizer.json (+ tokenizer_config.json when present). NULL + err on failure. */
struct tok *tok_load(const char *dir, struct err *e);
void tok_destroy(struct tok *t);

/** Vocabulary size including added tokens (max id + 1). */
int32_t tok_vocab_size(const struct tok *t);

/**
 * Encodes UTF-8 text. add_special = 1 runs the post-processor (BOS/EOS as configured).
 * *ids is a heap array owned by the caller. Returns 0, or -1 with err set.
 */
int tok_encode(const struct tok *t, const char *text, size_t len, int add_special, int32_t **ids,
               size_t *n, struct err *e);

/** Decodes ids to a heap NUL-terminated string; skip_special drops special tokens. */
char *tok_decode(const struct tok *t, const int32_t *ids, size_t n, int skip_special);
/** tok_decode that also reports the length (the text may contain NUL, e.g. from <0x00>). */
char *tok_decode_len(const struct tok *t, const int32_t *ids, size_t n, int skip_special,
                     size_t *len);

/** The id of a token string (added or vocabulary), or -1. */
int32_t tok_token_id(const struct tok *t, const char *token);

/** 1 when id is a special added token (what skip_special drops). */
int tok_is_special(const struct tok *t, int32_t id);

/** bos_token / eos_token of tokenizer_config.json, or -1 when absent. */
int32_t tok_bos_id(const struct tok *t);
int32_t tok_eos_id(const struct tok *t);

/**
 * The bytes token id adds to a decoded text in the middle of a sequence (byte-level
 * mapping and <0xXX> byte tokens undone, no UTF-8 repair), into out[cap]. Returns the
 * length, or -1 for an unknown id or a token longer than cap. For constrained decoding.
 */
int tok_token_bytes(const struct tok *t, int32_t id, char *out, size_t cap);

/** The token string of an id (owned by t), or NULL when the id is unknown. */
const char *tok_id_to_token(const struct tok *t, int32_t id);

/** Streaming detokenizer: feed ids one at a time, get text as soon as it is final. */
struct tok_stream;
struct tok_stream *tok_stream_create(const struct tok *t, int skip_special);
void tok_stream_destroy(struct tok_stream *s);
/** Appends id; returns a heap string with the newly final text ("" when none yet). */
char *tok_stream_push(struct tok_stream *s, int32_t id);
/** Flushes what is left (incomplete UTF-8 becomes U+FFFD as in a one-shot decode). */
char *tok_stream_finish(struct tok_stream *s);
/** The same, reporting the length of the returned text (which may contain NUL). */
char *tok_stream_push_len(struct tok_stream *s, int32_t id, size_t *len);
char *tok_stream_finish_len(struct tok_stream *s, size_t *len);

#endif
