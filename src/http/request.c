/* Generation requests: sampling parameters, stops, prompts and output options. */
#include "http/request.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void http_gen_dispose(struct http_gen *g)
{
    for (int i = 0; i < g->n_prompts; i++) {
        free(g->prompts[i]);
        if (g->prompt_text) free(g->prompt_text[i]);
    }
    free(g->prompts);
    free(g->n_prompt);
    free(g->prompt_text);
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop_ids);
    free(g->bias);
    gram_unref(g->sp.grammar);
    cJSON_Delete(g->tools);
    free(g->think_start);
    free(g->think_end);
    free(g->trigger);
    memset(g, 0, sizeof *g);
}

int http_error_no_tokenizer(struct http_error *he, const char *param, const char *what)
{
    return http_error_set(he, 400, param,
                          "%s needs the tokenizer, and this server runs with "
                          "--skip-tokenizer-init: send token ids to /v1/completions",
                          what);
}

/* The prompt as text (for echo): "" without a tokenizer. */
static char *ids_text(const struct http_model *m, const int32_t *ids, int n)
{
    return m->tok ? tok_decode(m->tok, ids, (size_t)n, 0) : xstrdup("");
}

int http_check_model(const cJSON *body, const struct http_model *m, int required,
                     struct http_error *he)
{
    const char *name = NULL;
    int r = http_json_str(body, "model", &name, he);
    if (r < 0) return -1;
    if (r == 0) return required ? http_error_set(he, 400, "model", "'model' is required") : 0;
    int known = !strcmp(name, m->name);
    for (int i = 0; m->names && i < m->n_names; i++) known |= !strcmp(name, m->names[i]);
    if (!known) {
        http_error_set(he, 404, "model", "The model '%.100s' does not exist (this server has '%s')",
                       name, m->name);
        snprintf(he->code, sizeof he->code, "model_not_found");
        return -1;
    }
    return 0;
}

/* A JSON array of token ids, each checked against the vocabulary. */
static int parse_ids(const cJSON *arr, const char *where, int32_t vocab, int32_t **out, int *n,
                     struct http_error *he)
{
    int cnt = cJSON_GetArraySize(arr), i = 0;
    int32_t *ids = xmalloc(sizeof *ids * (size_t)(cnt ? cnt : 1));
    const cJSON *v;
    cJSON_ArrayForEach(v, arr)
    {
        double d = v->valuedouble;
        if (!cJSON_IsNumber(v) || d != floor(d)) {
            free(ids);
            return http_error_set(he, 400, where, "'%s[%d]' must be an integer token id", where, i);
        }
        if (d < 0 || d >= vocab) {
            free(ids);
            return http_error_set(he, 400, where,
                                  "'%s[%d]': token id %.0f is outside the vocabulary (0..%d)",
                                  where, i, d, vocab - 1);
        }
        ids[i++] = (int32_t)d;
    }
    *out = ids;
    *n = cnt;
    return 0;
}

static void add_prompt(struct http_gen *g, int32_t *ids, int n, char *text)
{
    g->prompts = xrealloc(g->prompts, sizeof *g->prompts * (size_t)(g->n_prompts + 1));
    g->n_prompt = xrealloc(g->n_prompt, sizeof *g->n_prompt * (size_t)(g->n_prompts + 1));
    g->prompt_text = xrealloc(g->prompt_text, sizeof *g->prompt_text * (size_t)(g->n_prompts + 1));
    g->prompts[g->n_prompts] = ids;
    g->n_prompt[g->n_prompts] = n;
    g->prompt_text[g->n_prompts] = text;
    g->n_prompts++;
}

static int all_numbers(const cJSON *arr)
{
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) if (!cJSON_IsNumber(v)) return 0;
    return 1;
}

/* Completions "prompt": a string, strings, token ids, or lists of token ids. */
static int completion_prompts(const cJSON *body, const struct http_model *m, struct http_gen *g,
                              struct http_error *he)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(body, "prompt");
    if (!p || cJSON_IsNull(p)) return http_error_set(he, 400, "prompt", "'prompt' is required");
    const char *bad = "'prompt' must be a string, an array of strings, an array of token ids or "
                      "an array of token-id arrays";
    struct err e = {0};
    if (!m->tok && cJSON_IsString(p)) return http_error_no_tokenizer(he, "prompt", "a text prompt");
    if (cJSON_IsString(p)) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tok_encode(m->tok, p->valuestring, strlen(p->valuestring), 1, &ids, &n, &e) != 0)
            return http_error_set(he, 400, "prompt", "the prompt cannot be tokenized: %s", e.msg);
        add_prompt(g, ids, (int)n, xstrdup(p->valuestring));
        return 0;
    }
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
        return http_error_set(he, 400, "prompt", "%s, and not empty", bad);
    if (all_numbers(p)) {
        int32_t *ids;
        int n;
        if (parse_ids(p, "prompt", m->vocab, &ids, &n, he) < 0) return -1;
        add_prompt(g, ids, n, ids_text(m, ids, n));
        return 0;
    }
    if (cJSON_GetArraySize(p) > HTTP_MAX_PROMPTS)
        return http_error_set(he, 400, "prompt", "at most %d prompts per request",
                              HTTP_MAX_PROMPTS);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, p)
    {
        char where[32];
        snprintf(where, sizeof where, "prompt[%d]", i++);
        if (cJSON_IsString(v) && !m->tok) {
            return http_error_no_tokenizer(he, where, "a text prompt");
        } else if (cJSON_IsString(v)) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (tok_encode(m->tok, v->valuestring, strlen(v->valuestring), 1, &ids, &n, &e) != 0)
                return http_error_set(he, 400, where, "'%s' cannot be tokenized: %s", where, e.msg);
            add_prompt(g, ids, (int)n, xstrdup(v->valuestring));
        } else if (cJSON_IsArray(v)) {
            int32_t *ids;
            int n;
            if (parse_ids(v, where, m->vocab, &ids, &n, he) < 0) return -1;
            add_prompt(g, ids, n, ids_text(m, ids, n));
        } else {
            return http_error_set(he, 400, "prompt", "%s", bad);
        }
    }
    return 0;
}

/* "stop" (OpenAI: a string or strings) or "stop_sequences" (Anthropic: strings). */
static int parse_stop(const cJSON *body, const char *name, int allow_string, int no_tok,
                      struct http_gen *g, struct http_error *he)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(body, name);
    if (!s || cJSON_IsNull(s)) return 0;
    if (no_tok && !(cJSON_IsArray(s) && cJSON_GetArraySize(s) == 0))
        return http_error_no_tokenizer(he, name, "a stop string");
    const cJSON *one = allow_string && cJSON_IsString(s) ? s : NULL;
    if (!one && !cJSON_IsArray(s))
        return http_error_set(he, 400, name, "'%s' must be %san array of strings", name,
                              allow_string ? "a string or " : "");
    if (!one && cJSON_GetArraySize(s) > HTTP_MAX_STOP)
        return http_error_set(he, 400, name, "'%s' has more than %d entries", name, HTTP_MAX_STOP);
    const cJSON *v;
    for (v = one ? one : s->child; v; v = one ? NULL : v->next) {
        if (!cJSON_IsString(v))
            return http_error_set(he, 400, name, "'%s' must contain only strings", name);
        size_t len = strlen(v->valuestring);
        if (len == 0 || len > HTTP_MAX_STOP_LEN)
            return http_error_set(he, 400, name, "'%s' entries must be 1 to %d bytes long", name,
                                  HTTP_MAX_STOP_LEN);
        g->stop[g->n_stop++] = xstrdup(v->valuestring);
    }
    return 0;
}

static int parse_logit_bias(const cJSON *body, const struct http_model *m, struct http_gen *g,
                            struct http_error *he)
{
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(body, "logit_bias");
    if (!lb || cJSON_IsNull(lb)) return 0;
    if (!cJSON_IsObject(lb))
        return http_error_set(he, 400, "logit_bias",
                              "'logit_bias' must be an object of token id -> bias");
    int n = cJSON_GetArraySize(lb);
    if (n > 1024)
        return http_error_set(he, 400, "logit_bias", "'logit_bias' has more than 1024 entries");
    g->bias = xcalloc((size_t)(n ? n : 1), sizeof *g->bias);
    const cJSON *v;
    cJSON_ArrayForEach(v, lb)
    {
        char *end;
        long id = strtol(v->string, &end, 10);
        if (!v->string[0] || *end || id < 0 || id >= m->vocab)
            return http_error_set(he, 400, "logit_bias",
                                  "'logit_bias': key '%.40s' is not a token id in 0..%d", v->string,
                                  m->vocab - 1);
        if (!cJSON_IsNumber(v) || v->valuedouble < -100 || v->valuedouble > 100)
            return http_error_set(he, 400, "logit_bias",
                                  "'logit_bias': the bias of token %ld must be a number in "
                                  "[-100, 100]",
                                  id);
        g->bias[g->n_bias].id = (int32_t)id;
        g->bias[g->n_bias].bias = (float)v->valuedouble;
        g->n_bias++;
    }
    return 0;
}

/* Fields of the OpenAI APIs this server does not implement: rejected, never ignored. */
static int reject_unsupported(enum http_api api, const cJSON *body, struct http_error *he)
{
    static const char *const chat[] = {"functions",  "function_call",      "audio",
                                       "prediction", "web_search_options", NULL};
    static const char *const completions[] = {"suffix", NULL};
    static const char *const messages[] = {"mcp_servers", "container", NULL};
    const char *const *list = api == HTTP_API_CHAT          ? chat
                              : api == HTTP_API_COMPLETIONS ? completions
                                                            : messages;
    for (int i = 0; list[i]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, list[i]);
        if (!v || cJSON_IsNull(v)) continue;
        if ((cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0) ||
            (cJSON_IsString(v) && !v->valuestring[0]))
            continue;
        return http_error_set(he, 400, list[i], "'%s' is not supported by this server", list[i]);
    }
    if (api == HTTP_API_COMPLETIONS) {
        long best_of = 0;
        if (http_json_int(body, "best_of", 1, HTTP_MAX_N, &best_of, he) < 0) return -1;
        long n = 1;
        if (http_json_int(body, "n", 1, HTTP_MAX_N, &n, he) < 0) return -1;
        if (best_of && best_of != n)
            return http_error_set(he, 400, "best_of", "'best_of' other than n is not supported");
    }
    return 0;
}

/* Sampling fields shared by the three APIs (ranges as OpenAI / Anthropic document them). */
static int parse_sampling(enum http_api api, const cJSON *body, const struct http_model *m,
                          struct http_gen *g, struct http_error *he)
{
    struct sampling_params *sp = &g->sp;
    double d;
    long l;
    int r, b;
    if ((r = http_json_num(body, "temperature", 0, api == HTTP_API_MESSAGES ? 1 : 2, &d, he)) < 0)
        return -1;
    if (r) sp->temperature = (float)d;
    if ((r = http_json_num(body, "top_p", 0, 1, &d, he)) < 0) return -1;
    if (r && d <= 0) return http_error_set(he, 400, "top_p", "'top_p' must be in (0, 1]");
    if (r) sp->top_p = (float)d;
    if ((r = http_json_int(body, "top_k", -1, 1 << 30, &l, he)) < 0) return -1;
    if (r) sp->top_k = l < 0 ? 0 : (int)l;
    if (api == HTTP_API_MESSAGES) {
        if (parse_stop(body, "stop_sequences", 0, !m->tok, g, he) < 0) return -1;
        return 0;
    }
    if ((r = http_json_num(body, "min_p", 0, 1, &d, he)) < 0) return -1;
    if (r) sp->min_p = (float)d;
    if ((r = http_json_num(body, "presence_penalty", -2, 2, &d, he)) < 0) return -1;
    if (r) sp->presence_penalty = (float)d;
    if ((r = http_json_num(body, "frequency_penalty", -2, 2, &d, he)) < 0) return -1;
    if (r) sp->frequency_penalty = (float)d;
    if ((r = http_json_num(body, "repetition_penalty", 0, 100, &d, he)) < 0) return -1;
    if (r && d <= 0)
        return http_error_set(he, 400, "repetition_penalty", "'repetition_penalty' must be > 0");
    if (r) sp->repetition_penalty = (float)d;
    if ((r = http_json_int(body, "seed", -(1L << 53), 1L << 53, &l, he)) < 0) return -1;
    if (r) sp->has_seed = 1, sp->seed = (uint64_t)l;
    /* vLLM's extension: lower runs first, ties by arrival */
    if ((r = http_json_int(body, "priority", INT32_MIN, INT32_MAX, &l, he)) < 0) return -1;
    if (r) g->priority = (int)l;
    if ((r = http_json_bool(body, "ignore_eos", &b, he)) < 0) return -1;
    if (r) sp->ignore_eos = b;
    if ((r = http_json_bool(body, "skip_special_tokens", &b, he)) < 0) return -1;
    if (r) g->skip_special = b;
    if (parse_stop(body, "stop", 1, !m->tok, g, he) < 0) return -1;
    if (parse_logit_bias(body, m, g, he) < 0) return -1;
    const cJSON *sti = cJSON_GetObjectItemCaseSensitive(body, "stop_token_ids");
    if (sti && !cJSON_IsNull(sti)) {
        if (!cJSON_IsArray(sti) || cJSON_GetArraySize(sti) > 64)
            return http_error_set(he, 400, "stop_token_ids",
                                  "'stop_token_ids' must be an array of at most 64 token ids");
        if (parse_ids(sti, "stop_token_ids", m->vocab, &g->stop_ids, &g->n_stop_ids, he) < 0)
            return -1;
    }
    if ((r = http_json_int(body, "n", 1, HTTP_MAX_N, &l, he)) < 0) return -1;
    if (r) g->n = (int)l;
    return 0;
}

/* logprobs / top_logprobs (chat: a boolean and a count; completions: a count). */
static int parse_logprobs(enum http_api api, const cJSON *body, const struct http_model *m,
                          struct http_gen *g, struct http_error *he)
{
    long l;
    int r, b;
    if (api == HTTP_API_CHAT) {
        if ((r = http_json_bool(body, "logprobs", &b, he)) < 0) return -1;
        if (r) g->logprobs = b;
        if ((r = http_json_int(body, "top_logprobs", 0, ENGINE_MAX_TOP_LOGPROBS, &l, he)) < 0)
            return -1;
        if (r && !g->logprobs && l > 0)
            return http_error_set(he, 400, "top_logprobs",
                                  "'top_logprobs' requires 'logprobs' to be true");
        if (r) g->top_logprobs = (int)l;
    } else if (api == HTTP_API_COMPLETIONS) {
        if ((r = http_json_int(body, "logprobs", 0, ENGINE_MAX_TOP_LOGPROBS, &l, he)) < 0)
            return -1;
        if (r) g->logprobs = 1, g->top_logprobs = (int)l;
        if ((r = http_json_bool(body, "echo", &b, he)) < 0) return -1;
        if (r) g->echo = b;
        if (g->echo && !m->tok) return http_error_no_tokenizer(he, "echo", "'echo'");
    }
    if (api != HTTP_API_MESSAGES) {
        g->return_ids = !m->tok;
        if ((r = http_json_bool(body, "return_token_ids", &b, he)) < 0) return -1;
        if (r) g->return_ids = b;
    }
    if ((r = http_json_bool(body, "return_tokens_as_token_ids", &b, he)) < 0) return -1;
    if (r) g->tokens_as_ids = b;
    g->sp.logprobs = g->logprobs;
    g->sp.top_logprobs = g->top_logprobs;
    if (g->echo && g->logprobs) g->sp.prompt_logprobs = g->top_logprobs;
    return 0;
}

static int parse_stream(enum http_api api, const cJSON *body, struct http_gen *g,
                        struct http_error *he)
{
    int r, b;
    if ((r = http_json_bool(body, "stream", &b, he)) < 0) return -1;
    if (r) g->stream = b;
    if (api == HTTP_API_MESSAGES) return 0;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(body, "stream_options");
    if (!so || cJSON_IsNull(so)) return 0;
    if (!cJSON_IsObject(so))
        return http_error_set(he, 400, "stream_options", "'stream_options' must be an object");
    if (!g->stream)
        return http_error_set(he, 400, "stream_options",
                              "'stream_options' is only allowed when 'stream' is true");
    if ((r = http_json_bool(so, "include_usage", &b, he)) < 0) {
        snprintf(he->param, sizeof he->param, "stream_options.include_usage");
        return -1;
    }
    if (r) g->include_usage = b;
    return 0;
}

/* max_tokens against the context: prompt + max_tokens <= max_model_len. */
static int parse_max_tokens(enum http_api api, const cJSON *body, const struct http_model *m,
                            struct http_gen *g, struct http_error *he)
{
    long l = 0;
    int r = 0;
    const char *name = "max_tokens";
    if (api == HTTP_API_CHAT) {
        if ((r = http_json_int(body, "max_completion_tokens", 1, 1L << 30, &l, he)) < 0) return -1;
        if (r) name = "max_completion_tokens";
    }
    /* completions with echo may ask for 0 tokens: the prompt is scored (lm-eval's
     * loglikelihood requests, which vLLM serves the same way) */
    long least = api == HTTP_API_COMPLETIONS && g->echo ? 0 : 1;
    if (!r && (r = http_json_int(body, "max_tokens", least, 1L << 30, &l, he)) < 0) return -1;
    if (!r && api == HTTP_API_MESSAGES)
        return http_error_set(he, 400, "max_tokens", "max_tokens: field required");
    int longest = 0;
    for (int i = 0; i < g->n_prompts; i++) {
        if (g->n_prompt[i] == 0) {
            char where[32];
            snprintf(where, sizeof where, g->n_prompts > 1 ? "prompt[%d]" : "prompt", i);
            return http_error_set(he, 400, api == HTTP_API_COMPLETIONS ? where : "messages",
                                  "the prompt is empty (no tokens)");
        }
        if (g->n_prompt[i] > longest) longest = g->n_prompt[i];
    }
    const char *what = api == HTTP_API_COMPLETIONS ? "prompt" : "messages";
    if (longest >= m->max_model_len) {
        http_error_set(he, 400, what,
                       "This model's maximum context length is %d tokens, but the prompt has "
                       "%d tokens",
                       m->max_model_len, longest);
        snprintf(he->code, sizeof he->code, "context_length_exceeded");
        return -1;
    }
    if (!r) {
        /* Chat: as much as the context allows; completions: OpenAI's 16, within the context. */
        l = api == HTTP_API_CHAT ? m->max_model_len - longest : 16;
        if (l > m->max_model_len - longest) l = m->max_model_len - longest;
    } else if (longest + l > m->max_model_len) {
        http_error_set(he, 400, name,
                       "This model's maximum context length is %d tokens. However, you requested "
                       "%ld tokens (%d in the %s, %ld in the completion)",
                       m->max_model_len, longest + l, longest, what, l);
        snprintf(he->code, sizeof he->code, "context_length_exceeded");
        return -1;
    }
    g->score_only = r && l == 0;
    g->sp.max_tokens = g->score_only ? 1 : (int)l; /* the engine makes one token, dropped */
    g->max_tokens_given = r;
    return 0;
}

/* The prompt ends inside <think> (the template opened it): the output starts thinking. */
static int prompt_opens_thinking(const char *text, enum reason_format f)
{
    const char *tag = reason_format_start(f);
    size_t n = strlen(text), t = strlen(tag);
    while (n && (text[n - 1] == '\n' || text[n - 1] == ' ')) n--;
    return n >= t && !memcmp(text + n - t, tag, t);
}

int http_gen_parse(enum http_api api, const cJSON *body, const struct http_model *m,
                   struct http_gen *g, struct http_error *he)
{
    memset(g, 0, sizeof *g);
    g->api = api;
    g->n = 1;
    g->skip_special = 1;
    sampling_params_default(&g->sp);
    if (http_check_model(body, m, api == HTTP_API_MESSAGES, he) < 0) goto fail;
    if (reject_unsupported(api, body, he) < 0) goto fail;
    if (parse_sampling(api, body, m, g, he) < 0) goto fail;
    if (parse_logprobs(api, body, m, g, he) < 0) goto fail;
    if (parse_stream(api, body, g, he) < 0) goto fail;
    if (http_parse_structured(api, body, g, he) < 0) goto fail;
    if (api == HTTP_API_COMPLETIONS) {
        if (completion_prompts(body, m, g, he) < 0) goto fail;
        if (g->n_prompts * g->n > HTTP_MAX_PROMPTS)
            if (http_error_set(he, 400, "n", "prompts x n must be at most %d", HTTP_MAX_PROMPTS))
                goto fail;
    } else {
        int32_t *ids = NULL;
        int n = 0;
        char *text = NULL;
        if (http_chat_prompt(api, body, m, &ids, &n, &text, he) < 0) goto fail;
        add_prompt(g, ids, n, text);
        g->reason_format = m->reason_format;
        g->think_open = g->reason_format && prompt_opens_thinking(text, g->reason_format);
        if (http_parse_tools(api, body, m, g, he) < 0) goto fail;
    }
    if (parse_max_tokens(api, body, m, g, he) < 0) goto fail;
    if (http_parse_thinking(api, body, m, g, he) < 0) goto fail;
    return 0;
fail:
    http_gen_dispose(g);
    return -1;
}
