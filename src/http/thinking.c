/*
 * The thinking budget of a chat or messages request: Anthropic thinking.budget_tokens,
 * or OpenAI reasoning_effort mapped to a number of tokens. The engine counts the tokens
 * after the start of thinking and forces the end-of-thinking tag at the budget (its ids
 * here, the tags' own tokenization). Needs --reasoning-parser (the server knows the tags).
 */
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

#include "http/request.h"

/* reasoning_effort -> thinking tokens at most ("none" turns thinking off in the template). */
static const struct {
    const char *effort;
    int budget;
} efforts[] = {{"minimal", 256}, {"low", 1024}, {"medium", 4096}, {"high", 16384}};

static int tokenize(const struct http_model *m, const char *s, int32_t **ids, int *n)
{
    size_t k = 0;
    struct err e = {0};
    if (tok_encode(m->tok, s, strlen(s), 0, ids, &k, &e) != 0) return -1;
    *n = (int)k;
    return 0;
}

int http_parse_thinking(enum http_api api, const cJSON *body, const struct http_model *m,
                        struct http_gen *g, struct http_error *he)
{
    int budget = 0;
    const cJSON *th = cJSON_GetObjectItemCaseSensitive(body, "thinking");
    const cJSON *effort = cJSON_GetObjectItemCaseSensitive(body, "reasoning_effort");
    if (api == HTTP_API_MESSAGES && cJSON_IsObject(th)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(th, "type");
        long l = 0;
        int r = http_json_int(th, "budget_tokens", 1, 1L << 30, &l, he);
        if (r < 0) {
            snprintf(he->param, sizeof he->param, "thinking.budget_tokens");
            return -1;
        }
        int enabled = cJSON_IsString(type) && !strcmp(type->valuestring, "enabled");
        if (enabled && !r)
            return http_error_set(he, 400, "thinking.budget_tokens",
                                  "thinking.budget_tokens: field required");
        if (enabled && l >= g->sp.max_tokens)
            return http_error_set(he, 400, "thinking.budget_tokens",
                                  "thinking.budget_tokens: must be less than max_tokens");
        if (enabled) budget = (int)l;
    } else if (api == HTTP_API_CHAT && cJSON_IsString(effort)) {
        for (size_t i = 0; i < sizeof efforts / sizeof *efforts; i++)
            if (!strcmp(effort->valuestring, efforts[i].effort)) budget = efforts[i].budget;
    }
    if (!budget || !g->reason_format || !m->tok) return 0;
    enum reason_format f = g->reason_format;
    if (tokenize(m, reason_format_end(f), &g->think_end, &g->sp.n_think_end) < 0) return 0;
    if (!g->think_open && f != REASON_DEEPSEEK_R1 &&
        tokenize(m, reason_format_start(f), &g->think_start, &g->sp.n_think_start) < 0)
        return 0;
    g->sp.think_budget = budget;
    g->sp.think_start = g->think_start;
    g->sp.think_end = g->think_end;
    return 0;
}
