/* Embeddings requests: the input forms, the prompt, the encoding and the dimensions; the
 * response body. */
#include "http/embed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void http_embed_dispose(struct http_embed *q)
{
    for (int i = 0; i < q->n_inputs; i++) free(q->inputs[i]);
    free(q->inputs);
    free(q->n_input);
    free(q->pool_skip);
    free(q->vecs);
    memset(q, 0, sizeof *q);
}

static void add_input(struct http_embed *q, int32_t *ids, int n, int skip)
{
    size_t k = (size_t)q->n_inputs + 1;
    q->inputs = xrealloc(q->inputs, sizeof *q->inputs * k);
    q->n_input = xrealloc(q->n_input, sizeof *q->n_input * k);
    q->pool_skip = xrealloc(q->pool_skip, sizeof *q->pool_skip * k);
    q->inputs[q->n_inputs] = ids;
    q->n_input[q->n_inputs] = n;
    q->pool_skip[q->n_inputs++] = skip;
}

/* A text input: the prompt prepended, tokenized with the tokenizer's special tokens (as
 * sentence-transformers does). Mean pooling that leaves the prompt out skips its tokens as
 * sentence-transformers counts them: the prompt tokenized alone, less one. */
static int text_input(struct http_embed *q, const struct http_model *m, const char *prompt,
                      const char *text, const char *where, struct http_error *he)
{
    if (!text[0]) return http_error_set(he, 400, where, "'%s' must not be empty", where);
    if (!m->tok) return http_error_no_tokenizer(he, where, "a text input");
    size_t pl = prompt ? strlen(prompt) : 0, tl = strlen(text);
    char *full = xmalloc(pl + tl + 1);
    memcpy(full, prompt ? prompt : "", pl);
    memcpy(full + pl, text, tl + 1);
    int32_t *ids = NULL;
    size_t n = 0;
    struct err e = {0};
    int rc = tok_encode(m->tok, full, pl + tl, 1, &ids, &n, &e);
    free(full);
    if (rc) return http_error_set(he, 400, where, "'%s' cannot be tokenized: %s", where, e.msg);
    int skip = 0;
    const struct pooling_config *pc = m->pooling;
    if (prompt && !pc->include_prompt && pc->kind == POOLING_MEAN) {
        int32_t *p_ids = NULL;
        size_t pn = 0;
        if (tok_encode(m->tok, prompt, pl, 1, &p_ids, &pn, &e) == 0 && pn > 1) skip = (int)pn - 1;
        free(p_ids);
        if (skip >= (int)n) skip = (int)n - 1; /* a token is always pooled */
    }
    add_input(q, ids, (int)n, skip);
    return 0;
}

/* A token-id input: a non-empty array of ids of the vocabulary. */
static int ids_input(struct http_embed *q, const struct http_model *m, const cJSON *arr,
                     const char *where, struct http_error *he)
{
    int cnt = cJSON_GetArraySize(arr), i = 0;
    if (cnt == 0) return http_error_set(he, 400, where, "'%s' must not be empty", where);
    int32_t *ids = xmalloc(sizeof *ids * (size_t)cnt);
    const cJSON *v;
    cJSON_ArrayForEach(v, arr)
    {
        double d = v->valuedouble;
        if (!cJSON_IsNumber(v) || d != floor(d) || d < 0 || d >= m->vocab) {
            free(ids);
            return http_error_set(he, 400, where,
                                  "'%s[%d]' must be a token id of the vocabulary (0..%d)", where, i,
                                  m->vocab - 1);
        }
        ids[i++] = (int32_t)d;
    }
    add_input(q, ids, cnt, 0);
    return 0;
}

static int all_of(const cJSON *arr, cJSON_bool (*is)(const cJSON *))
{
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) if (!is(v)) return 0;
    return 1;
}

/* `input`: a string, strings, token ids, or token-id arrays. */
static int parse_inputs(const cJSON *body, const struct http_model *m, const char *prompt,
                        int named, struct http_embed *q, struct http_error *he)
{
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(body, "input");
    const char *bad = "'input' must be a string, an array of strings, an array of token ids or "
                      "an array of token-id arrays";
    if (!in || cJSON_IsNull(in)) return http_error_set(he, 400, "input", "'input' is required");
    if (cJSON_IsString(in)) return text_input(q, m, prompt, in->valuestring, "input", he);
    if (!cJSON_IsArray(in)) return http_error_set(he, 400, "input", "%s", bad);
    int cnt = cJSON_GetArraySize(in);
    if (cnt == 0) return http_error_set(he, 400, "input", "'input' must not be empty");
    int strings = all_of(in, cJSON_IsString), lists = all_of(in, cJSON_IsArray);
    if (!strings && !lists && !all_of(in, cJSON_IsNumber))
        return http_error_set(he, 400, "input", "%s", bad);
    if (named && !strings)
        return http_error_set(he, 400, "prompt_name",
                              "'prompt_name' applies to text inputs, not to token ids");
    if (!strings && !lists) return ids_input(q, m, in, "input", he);
    if (cnt > HTTP_MAX_EMBED_INPUTS)
        return http_error_set(he, 400, "input", "at most %d inputs per request",
                              HTTP_MAX_EMBED_INPUTS);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, in)
    {
        char where[32];
        snprintf(where, sizeof where, "input[%d]", i++);
        if (strings ? text_input(q, m, prompt, v->valuestring, where, he)
                    : ids_input(q, m, v, where, he))
            return -1;
    }
    return 0;
}

int http_embed_parse(const cJSON *body, const struct http_model *m, struct http_embed *q,
                     struct http_error *he)
{
    memset(q, 0, sizeof *q);
    if (http_check_model(body, m, 0, he) < 0) return -1;
    const struct pooling_config *pc = m->pooling;
    if (!pc || !pc->can_embed)
        return http_error_set(he, 400, "model", "the model '%s' cannot embed: %s", m->name,
                              pc ? pc->why : "no pooling configuration");
    q->dim = q->dimensions = pc->dim;
    const char *fmt = NULL, *name = NULL, *user = NULL;
    long dims;
    if (http_json_str(body, "encoding_format", &fmt, he) < 0) return -1;
    if (fmt && strcmp(fmt, "float") && strcmp(fmt, "base64"))
        return http_error_set(he, 400, "encoding_format",
                              "'encoding_format' must be \"float\" or \"base64\"");
    q->base64 = fmt && !strcmp(fmt, "base64");
    int got = http_json_int(body, "dimensions", 1, pc->dim, &dims, he);
    if (got < 0) return -1;
    if (got) q->dimensions = (int)dims;
    if (http_json_str(body, "user", &user, he) < 0) return -1;
    if (http_json_str(body, "prompt_name", &name, he) < 0) return -1;
    const char *prompt = name ? pooling_prompt(pc, name) : NULL;
    if (name && !prompt) {
        struct http_buf names = {0};
        for (int i = 0; i < pc->n_prompts; i++)
            http_buf_printf(&names, "%s'%s'", i ? ", " : "", pc->prompts[i].name);
        http_error_set(he, 400, "prompt_name",
                       "'prompt_name': '%.100s' is not a prompt of the "
                       "model (it has %s)",
                       name, names.len ? names.p : "none");
        http_buf_dispose(&names);
        return -1;
    }
    if (!name && pc->default_prompt) prompt = pooling_prompt(pc, pc->default_prompt);
    if (parse_inputs(body, m, prompt, name != NULL, q, he) < 0) goto fail;
    for (int i = 0; i < q->n_inputs; i++)
        if (q->n_input[i] > m->max_model_len) {
            http_error_set(he, 400, "input",
                           "input %d has %d tokens, more than the context length (%d)", i,
                           q->n_input[i], m->max_model_len);
            snprintf(he->code, sizeof he->code, "context_length_exceeded");
            goto fail;
        }
    q->vecs = xcalloc((size_t)q->n_inputs * (size_t)q->dim, sizeof *q->vecs);
    return 0;
fail:
    http_embed_dispose(q);
    return -1;
}

/* v as little-endian float32 bytes in base64 (RFC 4648, padded), quoted. */
static void put_base64(struct http_buf *o, const float *v, int n)
{
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t bytes = (size_t)n * 4;
    unsigned char *le = xmalloc(bytes + 2);
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int b = 0; b < 4; b++) le[(size_t)i * 4 + b] = (unsigned char)(u >> (8 * b));
    }
    le[bytes] = le[bytes + 1] = 0;
    char *enc = xmalloc((bytes + 2) / 3 * 4 + 2);
    size_t len = 0;
    for (size_t i = 0; i < bytes; i += 3) {
        uint32_t w = (uint32_t)le[i] << 16 | (uint32_t)le[i + 1] << 8 | le[i + 2];
        enc[len++] = alpha[w >> 18 & 63];
        enc[len++] = alpha[w >> 12 & 63];
        enc[len++] = i + 1 < bytes ? alpha[w >> 6 & 63] : '=';
        enc[len++] = i + 2 < bytes ? alpha[w & 63] : '=';
    }
    enc[len++] = '"';
    http_buf_puts(o, "\"");
    http_buf_append(o, enc, len);
    free(enc);
    free(le);
}

void http_embed_format(struct http_embed *q, const struct http_model *m, struct http_buf *o)
{
    long tokens = 0;
    http_buf_puts(o, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < q->n_inputs; i++) {
        float *v = q->vecs + (size_t)i * q->dim;
        if (q->dimensions < q->dim) pooling_truncate(v, q->dimensions);
        http_buf_printf(o, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "",
                        i);
        if (q->base64) {
            put_base64(o, v, q->dimensions);
        } else {
            http_buf_puts(o, "[");
            /* %.9g: every float32 reads back exactly */
            for (int d = 0; d < q->dimensions; d++)
                http_buf_printf(o, "%s%.9g", d ? "," : "", (double)v[d]);
            http_buf_puts(o, "]");
        }
        http_buf_puts(o, "}");
        tokens += q->n_input[i];
    }
    http_buf_puts(o, "],\"model\":");
    http_buf_json_str(o, m->name, strlen(m->name));
    http_buf_printf(o, ",\"usage\":{\"prompt_tokens\":%ld,\"total_tokens\":%ld}}", tokens, tokens);
}
