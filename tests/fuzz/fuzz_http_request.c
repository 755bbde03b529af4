/*
 * libFuzzer target for the server's request parsing: arbitrary bytes are parsed as a JSON
 * body and, when they are JSON, validated as a chat completions, a completions and an
 * Anthropic messages request against the tiny Llama's tokenizer and chat template.
 * Property: parsing never crashes, leaks or overruns; a rejected request always carries a
 * 4xx status and a message; an accepted one has prompts of valid token ids.
 * Built and run by tests/fuzz/run.sh.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/request.h"
#include "text/tmpl.h"

static struct http_model model;

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
                                .max_model_len = 512};
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
    cJSON_Delete(body);
    return 0;
}
