/* Placeholder until the tokenizer lands: every entry point reports that it is missing. */
#include "model/tokenizer.h"

#include <stdlib.h>

struct tok *tok_load(const char *dir, struct err *e)
{
    err_set(e, "%s: tokenizer support is not built yet; pass --prompt-ids", dir);
    return NULL;
}

void tok_destroy(struct tok *t)
{
    (void)t;
}

int32_t tok_vocab_size(const struct tok *t)
{
    (void)t;
    return 0;
}

int tok_encode(const struct tok *t, const char *text, size_t len, int add_special, int32_t **ids,
               size_t *n, struct err *e)
{
    (void)t;
    (void)text;
    (void)len;
    (void)add_special;
    (void)ids;
    (void)n;
    return err_set(e, "tokenizer support is not built yet");
}

char *tok_decode(const struct tok *t, const int32_t *ids, size_t n, int skip_special)
{
    (void)t;
    (void)ids;
    (void)n;
    (void)skip_special;
    return NULL;
}

int32_t tok_token_id(const struct tok *t, const char *token)
{
    (void)t;
    (void)token;
    return -1;
}

struct tok_stream *tok_stream_create(const struct tok *t, int skip_special)
{
    (void)t;
    (void)skip_special;
    return NULL;
}

void tok_stream_destroy(struct tok_stream *s)
{
    (void)s;
}

char *tok_stream_push(struct tok_stream *s, int32_t id)
{
    (void)s;
    (void)id;
    return NULL;
}

char *tok_stream_finish(struct tok_stream *s)
{
    (void)s;
    return NULL;
}
