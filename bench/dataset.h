/*
 * dataset: the prompts a benchmark sends. Four sources, as vLLM's serving benchmark has:
 *   random             prompts of --input-len tokens (± range ratio), --output-len outputs
 *   sharegpt           the first human turn of ShareGPT-format conversations
 *   prefix-repetition  num_prefixes shared prefixes, each followed by distinct suffixes
 *   jsonl              one prompt per line
 *   multi-turn         conversations, one turn at a time (bench/multiturn.h)
 *
 * Token-exact prompts need the model's tokenizer (--tokenizer DIR). Without one, random and
 * prefix-repetition prompts for the completions endpoint are lists of token ids (exact
 * lengths on any server); for chat they are English words, about one token each, and their
 * lengths are known only from the server's usage.
 */
#ifndef PAGODA_BENCH_DATASET_H
#define PAGODA_BENCH_DATASET_H

#include <stdint.h>

#include "common/err.h"

struct tok;

struct prompt {
    char *text;   /* UTF-8 prompt, or NULL when ids are sent */
    int32_t *ids; /* token ids (completions only) */
    int n_ids;
    int input_len;  /* prompt tokens as the client knows them; -1 when unknown */
    int output_len; /* max_tokens to ask for */
    double arrival; /* trace replay: s after the first request (scaled); 0 otherwise */
};

struct dataset {
    struct prompt *p;
    int n;
};

/* DS_MULTITURN: conversations whose turns each send the whole conversation so far
 * (bench/multiturn.h builds them turn by turn; dataset_build refuses it). DS_TRACE: the
 * requests of a trace file at their arrival times (bench/trace.h builds them). */
enum dataset_kind { DS_RANDOM, DS_SHAREGPT, DS_PREFIX, DS_JSONL, DS_MULTITURN, DS_TRACE };

struct dataset_cfg {
    enum dataset_kind kind;
    const char *path;          /* sharegpt / jsonl file */
    int num;                   /* prompts to make (file sources: at most this many) */
    int input_len, output_len; /* random; output_len also overrides file sources when > 0 */
    double range_ratio;        /* random: lengths uniform in [len*(1-r), len*(1+r)] */
    int prefix_len, suffix_len, num_prefixes; /* prefix-repetition */
    int token_ids;                            /* 1: ids are allowed (completions endpoint) */
    int32_t vocab_size; /* ids are drawn below this when no tokenizer is given */
    uint64_t seed;
    const struct tok *tok; /* optional */
};

/** Parses "random", "sharegpt", "prefix-repetition", "jsonl", "multi-turn" or "trace".
 * 0, or -1 + err. */
int dataset_kind_parse(const char *s, enum dataset_kind *k, struct err *e);

/** Builds the prompts. 0, or -1 + err (missing file, bad format, no usable prompt). */
int dataset_build(const struct dataset_cfg *cfg, struct dataset *ds, struct err *e);
void dataset_free(struct dataset *ds);

struct rng;
/** One prompt of n tokens drawn from r: token ids, --tokenizer text or words (see above);
 * output_len and arrival are left 0. */
void dataset_prompt_make(const struct dataset_cfg *cfg, struct rng *r, int n, struct prompt *p);
/** Tokens of text under t; -1 when it cannot be encoded. */
int dataset_count_tokens(const struct tok *t, const char *text);

/** A small deterministic generator (splitmix64) shared by the load generator. */
struct rng {
    uint64_t s;
};
uint64_t rng_next(struct rng *r);
double rng_uniform(struct rng *r); /* [0, 1) */
/** Gamma(shape, scale) by Marsaglia and Tsang; shape 1 is the exponential distribution. */
double rng_gamma(struct rng *r, double shape, double scale);

#endif
