/*
 * tokenizer_gen: a byte-level BPE tokenizer of any vocabulary size, for models that have no
 * tokenizer of their own (`pagoda bench make-model`). The files are what Hugging Face
 * tokenizers and transformers read, and what tok_load reads:
 *
 *   tokenizer.json         256 byte tokens (GPT-2's byte-to-unicode map, in GPT-2's order),
 *                          vocab - 260 merges, then 4 special tokens at the top ids:
 *                          <|begin_of_text|> (BOS, added by the post-processor),
 *                          <|end_of_text|>, <|im_start|>, <|im_end|>; the GPT-2 pre-tokenizer
 *                          regex and the ByteLevel decoder;
 *   tokenizer_config.json  bos_token, eos_token (<|im_end|>) and a ChatML chat_template.
 *
 *     if (tok_gen_write(dir, 32000, &e) != 0) ... e.msg ...
 *
 * The merges follow a fixed scheme, no corpus: a word-start token (the space marker Ġ or a
 * lowercase letter) or an earlier merge result, extended by one lowercase letter in English
 * letter-frequency order, breadth first. Every text encodes to ids that decode back to it.
 */
#ifndef PAGODA_TEXT_TOKENIZER_GEN_H
#define PAGODA_TEXT_TOKENIZER_GEN_H

#include <stdint.h>

#include "common/err.h"

/** The smallest vocabulary tok_gen_write accepts: 256 bytes and 4 special tokens. */
#define TOK_GEN_MIN_VOCAB 260

/** Ids of the special tokens of a generated vocabulary of size vocab. */
static inline int32_t tok_gen_bos_id(int32_t vocab)
{
    return vocab - 4;
}
static inline int32_t tok_gen_eos_id(int32_t vocab) /* <|im_end|> */
{
    return vocab - 1;
}
static inline int32_t tok_gen_end_of_text_id(int32_t vocab)
{
    return vocab - 3;
}

/**
 * Writes DIR/tokenizer.json and DIR/tokenizer_config.json for a vocabulary of `vocab` ids
 * (TOK_GEN_MIN_VOCAB .. 2^24). DIR must exist. 0, or -1 with e set.
 */
int tok_gen_write(const char *dir, int32_t vocab, struct err *e);

#endif
