/*
 * http embed: POST /v1/embeddings (OpenAI's shape). The body parsed and validated into the
 * token-id inputs of embedding requests (embed.c, pure: the tokenizer and the model's
 * pooling, no engine), the response body written from the vectors, and the job that runs
 * the inputs through the engine and answers (embed_job.c).
 *
 *     struct http_embed q;
 *     if (http_embed_parse(body, &model, &q, &he) < 0) reply_error(&he);
 *     ... one engine request (embed = 1) per input, vectors into q.vecs ...
 *     http_embed_format(&q, &model, &out);
 *     http_embed_dispose(&q);
 */
#ifndef PAGODA_HTTP_EMBED_H
#define PAGODA_HTTP_EMBED_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "http/json.h"
#include "http/request.h"

#define HTTP_MAX_EMBED_INPUTS 2048 /* inputs per request, as OpenAI */

/** One parsed embeddings request. */
struct http_embed {
    int32_t **inputs; /* [n_inputs] token ids (the prompt, when named, prepended) */
    int *n_input;     /* [n_inputs] */
    int *pool_skip;   /* [n_inputs] leading tokens mean pooling leaves out (engine_request) */
    int n_inputs;
    int base64;     /* encoding_format "base64": little-endian float32 bytes */
    int dimensions; /* values kept (renormalized); the model's dimension when not given */
    int dim;        /* the model's dimension */
    float *vecs;    /* [n_inputs, dim] filled by the caller before http_embed_format */
};

/** Parses and validates body into q. 0, or -1 with he (q then holds nothing). */
int http_embed_parse(const cJSON *body, const struct http_model *m, struct http_embed *q,
                     struct http_error *he);

/** The response: {"object":"list","data":[{"object":"embedding","index",...,"embedding"}],
 * "model","usage"}, each vector truncated to q->dimensions and renormalized when fewer. */
void http_embed_format(struct http_embed *q, const struct http_model *m, struct http_buf *out);

void http_embed_dispose(struct http_embed *q);

#endif
