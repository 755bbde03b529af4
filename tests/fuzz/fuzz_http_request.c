/*
 * libFuzzer target for the server's request parsing: arbitrary bytes are parsed as a JSON
 * body and, when they are JSON, validated as a chat completions, a completions, an
 * Anthropic messages and an embeddings request against the tiny Llama's tokenizer and chat
 * template (and a mean pooling that leaves its "query" prompt out).
 * Property: parsing never crashes, leaks or overruns; a rejected request always carries a
 * 4xx status and a message; an accepted one has prompts of valid token ids.
 * Built and run by tests/fuzz/run.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/embed.h"
#include "http/request.h"
#include "text/tmpl.h"

static struct http_model model;
static struct pooling_prompt query = {"query", "Query: "};
static struct pooling_config pooling = {.can_embed = 1,
                                        .kind = POOLING_MEAN,
                                        .include_prompt = 0,
                                        .dim = 64,
                                        .prompts = &query,
                                        .n_prompts = 1};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *data = getenv("PAGODA_TESTDATA");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", data ? data : "../shared/testdata");
    struct err e = {0};
    struct tok *t = tok_load(dir, &e);
    if (!t) {
        fprintf(stderr, "fuzz_http_request: %s\n", e.msg);
        abort();
    }
    model = (struct http_model){.name = "tiny",
                                .tok = t,
                                .tmpl_src = tmpl_load_from_model(dir, NULL, &e),
                                .tmpl_vars = tmpl_special_tokens(dir),
                                .vocab = tok_vocab_size(t),
                                .max_model_len = 512,
                                .pooling = &pooling};
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    cJSON *body = cJSON_ParseWithLength((const char *)data, size);
    if (!body) return 0;
    static const enum http_api apis[] = {HTTP_API_CHAT, HTTP_API_COMPLETIONS, HTTP_API_MESSAGES};
    for (size_t a = 0; a < 3; a++) {
        struct http_gen g;
        struct http_error he = {0};
        if (http_gen_parse(apis[a], body, &model, &g, &he) < 0) {
            if (he.status < 400 || he.status > 499 || !he.msg[0]) abort();
            continue;
        }
        if (g.n_prompts < 1) abort();
        for (int p = 0; p < g.n_prompts; p++)
            for (int i = 0; i < g.n_prompt[p]; i++)
                if (g.prompts[p][i] < 0 || g.prompts[p][i] >= model.vocab) abort();
        http_gen_dispose(&g);
    }
    struct http_embed q;
    struct http_error he = {0};
    if (http_embed_parse(body, &model, &q, &he) < 0) {
        if (he.status < 400 || he.status > 499 || !he.msg[0]) abort();
    } else {
        if (q.n_inputs < 1 || q.dimensions < 1 || q.dimensions > q.dim || !q.vecs) abort();
        for (int p = 0; p < q.n_inputs; p++) {
            if (q.n_input[p] < 1 || q.pool_skip[p] < 0 || q.pool_skip[p] >= q.n_input[p]) abort();
            for (int i = 0; i < q.n_input[p]; i++)
                if (q.inputs[p][i] < 0 || q.inputs[p][i] >= model.vocab) abort();
        }
        http_embed_dispose(&q);
    }
    cJSON_Delete(body);
    return 0;
}
