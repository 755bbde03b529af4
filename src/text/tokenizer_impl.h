/*
 * tokenizer_impl: the parts of the tokenizer shared between its source files (not a public
 * interface). tokenizer.c loads tokenizer.json and runs the encode pipeline
 *     added tokens -> normalizer -> pre-tokenizer -> BPE model -> post-processor
 * tokenizer_norm.c holds the normalizers and their Unicode algorithms, tokenizer_pre.c the
 * pre-tokenizers, tokenizer_bpe.c the BPE model and tokenizer_dec.c the decoders (one-shot
 * and streaming). Every stage mirrors the Hugging Face tokenizers component of the same name.
 */
#ifndef PAGODA_MODEL_TOKENIZER_IMPL_H
#define PAGODA_MODEL_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/err.h"
#include "common/strmap.h"

/* ---- growable buffers ---- */

struct tok_buf {
    char *p;
    size_t len, cap;
};

void tok_buf_reserve(struct tok_buf *b, size_t extra);
void tok_buf_put(struct tok_buf *b, const void *s, size_t n);
void tok_buf_putc(struct tok_buf *b, char c);
void tok_buf_dispose(struct tok_buf *b);

struct tok_ids {
    int32_t *v;
    size_t n, cap;
};

void tok_ids_push(struct tok_ids *a, int32_t id);

/* ---- UTF-8 ---- */

/** Length of the valid UTF-8 sequence at s (at most n bytes), or 0 when it is invalid. */
int tok_utf8_len(const unsigned char *s, size_t n);
/** Decodes one character of valid UTF-8 (checked beforehand); *len gets its size. */
uint32_t tok_utf8_get(const unsigned char *s, size_t *len);
/** Encodes cp; returns the number of bytes written to out (1..4). */
int tok_utf8_put(uint32_t cp, char *out);
/** Byte offset of the first invalid UTF-8 sequence in s, or n when it is all valid. */
size_t tok_utf8_check(const char *s, size_t n);
int tok_is_whitespace(uint32_t cp); /* Unicode White_Space, like Rust's char::is_whitespace */

/**
 * Lossy UTF-8 decoding that matches Rust's String::from_utf8_lossy: every maximal invalid
 * subpart becomes one U+FFFD. Streaming: feed bytes as they come, `final` = no more bytes;
 * an incomplete sequence at the end waits in `pend` until more bytes or the end.
 */
struct tok_utf8_lossy {
    unsigned char pend[4];
    int npend;
};
void tok_utf8_lossy_feed(struct tok_utf8_lossy *u, const unsigned char *s, size_t n, int final,
                         struct tok_buf *out);

/* ---- regular expressions (PCRE2, UTF + UCP, JIT when available) ---- */

pcre2_code *tok_regex_compile(const char *pattern, size_t len, struct err *e);
/** Literal string pattern: compiled as a regex with every character quoted. */
pcre2_code *tok_regex_literal(const char *s, size_t len, struct err *e);

/** Per-call matching state (match data and a JIT stack); one per tok_encode call. */
struct tok_matcher {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;
    size_t *seg; /* split scratch: (start, end, is_match) triples */
    size_t nseg, segcap;
};
void tok_matcher_init(struct tok_matcher *m);
void tok_matcher_dispose(struct tok_matcher *m);

/**
 * Finds the next match of re in s[0..n) at or after `from`. Returns 1 with [*ms, *me), 0 when
 * there is none, -1 on a matching error (resource limits).
 */
int tok_regex_next(const pcre2_code *re, struct tok_matcher *m, const char *s, size_t n,
                   size_t from, size_t *ms, size_t *me);

/* ---- normalizers ---- */

enum tok_norm_kind {
    TOK_NORM_SEQUENCE,
    TOK_NORM_PREPEND,
    TOK_NORM_REPLACE,
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP,
};

struct tok_norm {
    enum tok_norm_kind kind;
    struct tok_norm *subs; /* SEQUENCE: nsubs children */
    int nsubs;
    char *str; /* PREPEND: the prefix; REPLACE: the replacement content */
    size_t slen;
    pcre2_code *re;  /* REPLACE: the pattern (a literal is quoted into a regex) */
    int left, right; /* STRIP */
};

int tok_norm_parse(const cJSON *j, struct tok_norm *n, struct err *e);
void tok_norm_dispose(struct tok_norm *n);
/** Appends normalize(s[0..len)) to out. Returns 0, -1 on a regex error. */
int tok_norm_apply(const struct tok_norm *n, const char *s, size_t len, struct tok_buf *out,
                   struct tok_matcher *m);

/* Unicode algorithms used by the normalizers (exposed for the tests). */
enum tok_nf { TOK_NF_C, TOK_NF_D, TOK_NF_KC, TOK_NF_KD };
void tok_unicode_normalize(enum tok_nf form, const char *s, size_t len, struct tok_buf *out);
void tok_unicode_lowercase(const char *s, size_t len, struct tok_buf *out);

/* ---- pre-tokenizers ---- */

enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS,
};

enum tok_pre_kind {
    TOK_PRE_SEQUENCE,
    TOK_PRE_SPLIT,     /* regex or literal, with a behavior and invert */
    TOK_PRE_BYTELEVEL, /* optional prefix space, optional GPT-2 regex, then the byte map */
    TOK_PRE_METASPACE, /* spaces -> replacement, prepend scheme, optional split */
    TOK_PRE_CHARCLASS, /* Digits, Punctuation, Whitespace(Split): a regex + behavior */
};

enum tok_prepend { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };

struct tok_pre {
    enum tok_pre_kind kind;
    struct tok_pre *subs;
    int nsubs;
    pcre2_code *re;
    enum tok_split_behavior behavior;
    int invert;
    int add_prefix_space; /* BYTELEVEL */
    char repl[8];         /* METASPACE: the replacement character, UTF-8 */
    int repl_len;
    enum tok_prepend prepend;
    int split;
};

/** One pre-token: bytes [off, off+len) of the arena; first = it starts the input text. */
struct tok_piece {
    size_t off, len;
    int first;
};

struct tok_pieces {
    struct tok_piece *v;
    size_t n, cap;
};

void tok_pieces_push(struct tok_pieces *p, size_t off, size_t len, int first);

int tok_pre_parse(const cJSON *j, struct tok_pre *p, struct err *e);
void tok_pre_dispose(struct tok_pre *p);
/**
 * Runs the pre-tokenizer over `in`, writing the resulting pieces to `out` (cleared first).
 * Transforming stages append their new text to the arena. Returns 0, -1 on a regex error.
 */
int tok_pre_apply(const struct tok_pre *p, struct tok_buf *arena, struct tok_pieces *in,
                  struct tok_pieces *out, struct tok_matcher *m);

/** The GPT-2 byte map: byte -> code point, and code point (< 324) -> byte or -1. */
extern uint32_t tok_byte_to_cp[256];
extern int16_t tok_cp_to_byte[324];
void tok_bytemap_init(void);

/* ---- BPE model ---- */

struct tok_bpe {
    struct strmap vocab; /* token -> id */
    /* merges: open-addressing map (left id << 32 | right id) -> (rank, merged id) */
    uint64_t *mkeys;
    int32_t *mrank, *mnew;
    size_t mcap;
    int32_t unk_id; /* -1 when none */
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_id[256];  /* id of "<0xXX>" or -1 */
    char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix (or NULL) */
};

/** Parses the "model" object. Token strings of the vocabulary are reported via id2tok. */
int tok_bpe_parse(const cJSON *model, struct tok_bpe *b, struct err *e);
void tok_bpe_dispose(struct tok_bpe *b);

/** Scratch of one BPE call; grows to the longest word seen and is reused. */
struct tok_bpe_scratch {
    int32_t *id, *prev, *next;
    uint32_t *heap_rank, *heap_pos; /* a binary min-heap of candidate merges */
    int32_t *heap_id;
    size_t cap, hcap;
};
void tok_bpe_scratch_dispose(struct tok_bpe_scratch *s);

/** Appends the ids of one pre-token (already mapped to vocabulary characters). */
void tok_bpe_word(const struct tok_bpe *b, const char *w, size_t len, struct tok_ids *out,
                  struct tok_bpe_scratch *s);

/* ---- decoders ---- */

enum tok_dec_kind {
    TOK_DEC_BYTELEVEL,
    TOK_DEC_REPLACE,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
    TOK_DEC_METASPACE,
};

struct tok_dec {
    enum tok_dec_kind kind;
    pcre2_code *re;      /* REPLACE: regex pattern (NULL for a literal) */
    char *pat, *content; /* REPLACE: literal pattern and content */
    size_t plen, clen;
    uint32_t strip_cp; /* STRIP: the character; start/stop counts */
    int start, stop;
    uint32_t repl_cp; /* METASPACE */
    int prepend;      /* METASPACE: prepend_scheme != never (strip the first-token spaces) */
};

/** A flattened decoder chain (Sequence decoders are inlined); n = 0: join tokens with " ". */
struct tok_decoder {
    struct tok_dec *v;
    int n;
    int present; /* 0: no decoder in tokenizer.json */
};

int tok_decoder_parse(const cJSON *j, struct tok_decoder *d, struct err *e);
void tok_decoder_dispose(struct tok_decoder *d);

/** A list of token strings: bytes of token i are buf[off[i], off[i+1]). */
struct tok_strs {
    struct tok_buf buf;
    size_t *off;
    size_t n, cap;
};
void tok_strs_push(struct tok_strs *l, const char *s, size_t len);
void tok_strs_clear(struct tok_strs *l);
void tok_strs_dispose(struct tok_strs *l);

/** One-shot decode of token strings through the chain; appends the text to out. */
void tok_decoder_run(const struct tok_decoder *d, const struct tok_strs *in, struct tok_buf *out);

/* ---- the tokenizer ---- */

struct tok_added {
    char *content;
    size_t len;
    int32_t id;
    int special, lstrip, rstrip, single_word, normalized;
};

struct tok {
    struct tok_bpe bpe;
    char **id2tok; /* id -> token string (vocabulary or added), NULL for holes */
    uint32_t *id2len;
    uint8_t *is_special; /* id -> 1 for special added tokens */
    int32_t nids;        /* max id + 1 */

    struct tok_added *added; /* sorted by id */
    int nadded;
    struct strmap added_map; /* content -> index into added */
    int32_t first_raw[257];  /* added-token candidates bucketed by first byte (raw pass) */
    int32_t *raw_order;      /* indices into added, grouped by first byte, longest first */
    int32_t first_norm[257]; /* the same for normalized added tokens (normalized content) */
    int32_t *norm_order;
    char **norm_content; /* normalized content of added tokens (normalized = true) */
    size_t *norm_len;
    int has_norm_added;

    struct tok_norm *norm; /* NULL: none */
    struct tok_pre *pre;   /* NULL: none */
    struct tok_decoder dec;

    /* post-processor reduced to what a single sequence needs: ids before and after */
    int32_t *post_pre, *post_post;
    int npost_pre, npost_post;

    int32_t bos_id, eos_id; /* from tokenizer_config.json, -1 when absent */
    pcre2_code *alnum_re;   /* one alphanumeric character, for single_word added tokens */
};

#endif
