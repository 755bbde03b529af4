/*
 * pooling: how a sentence-transformers folder turns the final hidden states of a prompt
 * into one embedding. modules.json lists the pipeline (Transformer, Pooling, optionally
 * Normalize); the Pooling module's config.json picks the rows (last token, mean, first
 * token); config_sentence_transformers.json names prompts to prepend to inputs.
 *
 *     struct pooling_config pc;
 *     if (pooling_config_load(&pc, dir, hidden, &e)) ...;   // malformed file: an error
 *     if (!pc.can_embed) printf("no embeddings: %s\n", pc.why);
 *     const char *q = pooling_prompt(&pc, "query");          // NULL: no such prompt
 *     pooling_config_dispose(&pc);
 */
#ifndef PAGODA_MODEL_POOLING_H
#define PAGODA_MODEL_POOLING_H

#include "common/err.h"

enum pooling_kind {
    POOLING_LAST, /* pooling_mode_lasttoken: the prompt's last row */
    POOLING_MEAN, /* pooling_mode_mean_tokens: the mean of every row */
    POOLING_CLS,  /* pooling_mode_cls_token: the first row */
};

/** "last-token", "mean", "cls". */
const char *pooling_kind_name(enum pooling_kind k);

struct pooling_prompt {
    char *name, *text;
};

struct pooling_config {
    int can_embed; /* 1: a sentence-transformers pipeline pagoda runs */
    char why[256]; /* when can_embed is 0: what is missing or unsupported */
    enum pooling_kind kind;
    int normalize;      /* a Normalize module follows: the vector is divided by its L2 norm */
    int include_prompt; /* mean pooling counts a prepended prompt's tokens too */
    int dim;            /* word_embedding_dimension, equal to the model's hidden size */
    struct pooling_prompt *prompts; /* [n_prompts] of config_sentence_transformers.json */
    int n_prompts;
    char *default_prompt; /* default_prompt_name, or NULL */
};

/**
 * Reads the sentence-transformers files of dir for a model of `hidden` dimensions. A folder
 * without modules.json, or with a pipeline pagoda does not run (a Dense module, max
 * pooling, a dimension other than hidden), loads with can_embed 0 and `why` set; a file
 * that is present but malformed is an error (-1 + err naming it).
 */
int pooling_config_load(struct pooling_config *pc, const char *dir, int hidden, struct err *e);

/** The text of the prompt called name, or NULL. */
const char *pooling_prompt(const struct pooling_config *pc, const char *name);

/** Matryoshka truncation (an API's `dimensions`): v's first `keep` values rescaled to unit
 * L2 norm, in place (a zero vector stays zero). */
void pooling_truncate(float *v, int keep);

void pooling_config_dispose(struct pooling_config *pc);

#endif
