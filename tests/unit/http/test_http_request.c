/* Request parsing, error bodies, UTF-8 checks and stop strings of the HTTP server,
 * without a server: the real tokenizer and chat template of a tiny model. */
#include <stdlib.h>
#include <string.h>

#include "http/choice.h"
#include "http/request.h"
#include "text/tmpl.h"
#include "test_util.h"

static struct http_model model;

static int parse(enum http_api api, const char *json, struct http_gen *g, struct http_error *he)
{
    cJSON *body = cJSON_Parse(json);
    memset(he, 0, sizeof *he);
    int rc = http_gen_parse(api, body, &model, g, he);
    cJSON_Delete(body);
    return rc;
}

static void test_errors(void)
{
    struct http_error he = {0};
    http_error_set(&he, 400, "temperature", "'%s' must be a number", "temperature");
    char *o = http_error_openai(&he);
    CHECK(!strcmp(o, "{\"error\":{\"message\":\"'temperature' must be a number\",\"type\":"
                     "\"invalid_request_error\",\"param\":\"temperature\",\"code\":null}}"),
          "%s", o);
    free(o);
    char *a = http_error_anthropic(&he);
    CHECK(!strcmp(a, "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\","
                     "\"message\":\"temperature: must be a number\"}}"),
          "%s", a);
    free(a);
    /* Anthropic messages: one "dotted.path: message" form whatever the parser wrote */
    static const char *const forms[][3] = {
        {"messages[0].content[1]", "messages[0].content[1]: unsupported block",
         "messages.0.content.1: unsupported block"},
        {"messages.0.role", "messages.0.role: unknown role", "messages.0.role: unknown role"},
        {"stop_sequences", "must be a list", "stop_sequences: must be a list"},
        {"", "the request body is not valid JSON", "the request body is not valid JSON"},
    };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        http_error_set(&he, 400, forms[i][0][0] ? forms[i][0] : NULL, "%s", forms[i][1]);
        a = http_error_anthropic(&he);
        cJSON *j = cJSON_Parse(a);
        const char *m =
            cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message")->valuestring;
        CHECK(!strcmp(m, forms[i][2]), "%s -> %s", forms[i][1], m);
        cJSON_Delete(j);
        free(a);
    }
    /* raw control characters inside strings and repeated members are refused; escapes and
     * control characters between tokens are not */
    static const struct {
        const char *body;
        int ok;
    } bodies[] = {
        {"{\"a\":\"x\\ty\"}", 1},
        {"{\"a\":\"x\ty\"}", 0},
        {"{\n\t\"a\":\r\n1}", 1},
        {"{\"a\":\"\\\"\x01\"}", 0},
        {"{\"a\":1,\"a\":2}", 0},
        {"{\"a\":{\"b\":1,\"c\":2,\"b\":3}}", 0},
        {"{\"a\":[{\"b\":1},{\"b\":2}]}", 1},
        {"{\"a\":1,\"A\":2}", 1},
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        memset(&he, 0, sizeof he);
        cJSON *j = http_json_parse_body(bodies[i].body, strlen(bodies[i].body), &he);
        CHECK(!!j == bodies[i].ok && (j || he.status == 400), "body %zu: %s", i, he.msg);
        cJSON_Delete(j);
    }
    CHECK(http_utf8_valid("h\xc3\xa9", 3), "valid");
    CHECK(!http_utf8_valid("\xc3", 1), "cut");
    CHECK(!http_utf8_valid("\xc0\xaf", 2), "overlong");
    CHECK(!http_utf8_valid("\xed\xa0\x80", 3), "surrogate");
    CHECK(http_utf8_complete("ab\xe2\x82", 4) == 2, "incomplete tail");
    struct http_buf b = {0};
    http_buf_json_str(&b, "a\"\n\x01", 4);
    CHECK(!strcmp(b.p, "\"a\\\"\\n\\u0001\""), "%s", b.p);
    http_buf_dispose(&b);
}

static void test_parse(void)
{
    struct http_gen g;
    struct http_error he;
    CHECK(parse(HTTP_API_CHAT,
                "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                "\"temperature\":0.5,\"top_k\":5,\"stop\":\"x\",\"n\":2,\"seed\":3,"
                "\"logprobs\":true,\"top_logprobs\":4}",
                &g, &he) == 0,
          "%s", he.msg);
    CHECK(g.n == 2 && g.n_prompts == 1 && g.sp.temperature == 0.5f && g.sp.top_k == 5, "fields");
    CHECK(g.n_stop == 1 && !strcmp(g.stop[0], "x") && g.sp.has_seed && g.sp.seed == 3, "stop");
    CHECK(g.logprobs == 1 && g.top_logprobs == 4 && g.sp.top_logprobs == 4, "logprobs");
    CHECK(g.sp.max_tokens == model.max_model_len - g.n_prompt[0], "default max %d",
          g.sp.max_tokens);
    http_gen_dispose(&g);

    CHECK(parse(HTTP_API_COMPLETIONS, "{\"model\":\"tiny\",\"prompt\":[[1,2],[3]],\"echo\":true}",
                &g, &he) == 0,
          "%s", he.msg);
    CHECK(g.n_prompts == 2 && g.n_prompt[0] == 2 && g.prompts[1][0] == 3, "id prompts");
    CHECK(g.sp.max_tokens == 16 && g.echo, "completion defaults");
    http_gen_dispose(&g);

    static const struct {
        enum http_api api;
        const char *body;
        int status;
        const char *param;
    } bad[] = {
        {HTTP_API_CHAT, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"bot\",\"content\":\"x\"}]}",
         400, "messages[0].role"},
        {HTTP_API_CHAT,
         "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
         "\"temperature\":3}",
         400, "temperature"},
        {HTTP_API_CHAT, "{\"model\":\"other\",\"messages\":[]}", 404, "model"},
        {HTTP_API_COMPLETIONS, "{\"model\":\"tiny\",\"prompt\":[1,2048]}", 400, "prompt"},
        {HTTP_API_COMPLETIONS, "{\"model\":\"tiny\",\"prompt\":\"a\",\"max_tokens\":4096}", 400,
         "max_tokens"},
        {HTTP_API_COMPLETIONS, "{\"model\":\"tiny\",\"prompt\":\"a\",\"suffix\":\"b\"}", 400,
         "suffix"},
        {HTTP_API_COMPLETIONS, "{\"model\":\"tiny\",\"prompt\":\"a\",\"stop\":[\"\"]}", 400,
         "stop"},
        {HTTP_API_MESSAGES,
         "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 400,
         "max_tokens"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(parse(bad[i].api, bad[i].body, &g, &he) == -1, "case %zu accepted", i);
        CHECK(he.status == bad[i].status && !strcmp(he.param, bad[i].param), "case %zu: %d %s (%s)",
              i, he.status, he.param, he.msg);
    }
}

/* Stop strings: held back while they may start, cut on a match, released at the end. */
static void test_stops(const struct tok *t)
{
    const char *text = "Hello world, hello there";
    int32_t *ids;
    size_t n;
    struct err e = {0};
    CHECK(tok_encode(t, text, strlen(text), 0, &ids, &n, &e) == 0, "%s", e.msg);
    char *stops[] = {"lo there", "world,"};
    struct http_choice c;
    http_choice_init(&c, t, 1, stops, 2);
    struct http_buf out = {0};
    int matched = 0;
    for (size_t i = 0; i < n && !matched; i++) {
        matched = http_choice_push(&c, ids[i], &out);
        /* Never a released prefix of a stop string at the end of the output. */
        CHECK(!out.len || !strstr(out.p, "world"), "released '%s'", out.p);
    }
    CHECK(matched && c.stop_index == 1, "matched %d index %d", matched, c.stop_index);
    CHECK(out.len == 6 && !memcmp(out.p, "Hello ", 6), "'%.*s'", (int)out.len, out.p);
    http_choice_dispose(&c);
    http_buf_dispose(&out);

    char *none[] = {"there!"};
    http_choice_init(&c, t, 1, none, 1);
    for (size_t i = 0; i < n; i++) CHECK(!http_choice_push(&c, ids[i], &out), "false match");
    CHECK(out.len < strlen(text), "'there' is held back");
    http_choice_finish(&c, &out);
    CHECK(out.len == strlen(text) && !memcmp(out.p, text, out.len), "'%s'", out.p);
    http_choice_dispose(&c);
    http_buf_dispose(&out);
    free(ids);
}

/* --skip-tokenizer-init: the model has no tokenizer and no template. Token-id prompts parse,
 * with return_token_ids on by default; what needs the tokenizer is a 400 naming the flag. */
static void test_no_tokenizer(void)
{
    struct http_model with = model;
    model.tok = NULL;
    model.tmpl_src = NULL;
    model.tmpl_vars = NULL;
    struct http_gen g;
    struct http_error he;
    CHECK(parse(HTTP_API_COMPLETIONS, "{\"prompt\":[[5,6],[7]],\"max_tokens\":3}", &g, &he) == 0,
          "%s", he.msg);
    CHECK(g.n_prompts == 2 && g.n_prompt[0] == 2 && g.prompts[0][1] == 6 && g.prompts[1][0] == 7,
          "ids");
    CHECK(g.return_ids == 1 && !strcmp(g.prompt_text[0], ""), "ids out, no text");
    http_gen_dispose(&g);
    CHECK(parse(HTTP_API_COMPLETIONS, "{\"prompt\":[5],\"return_token_ids\":false}", &g, &he) == 0,
          "%s", he.msg);
    CHECK(g.return_ids == 0, "return_token_ids false");
    http_gen_dispose(&g);
    static const struct {
        enum http_api api;
        const char *body, *param;
    } bad[] = {
        {HTTP_API_COMPLETIONS, "{\"prompt\":\"hi\"}", "prompt"},
        {HTTP_API_COMPLETIONS, "{\"prompt\":[[1],\"hi\"]}", "prompt[1]"},
        {HTTP_API_COMPLETIONS, "{\"prompt\":[1],\"stop\":\"x\"}", "stop"},
        {HTTP_API_COMPLETIONS, "{\"prompt\":[1],\"echo\":true}", "echo"},
        {HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "messages"},
        {HTTP_API_MESSAGES,
         "{\"model\":\"tiny\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":"
         "\"hi\"}]}",
         "messages"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(parse(bad[i].api, bad[i].body, &g, &he) == -1, "%s accepted", bad[i].body);
        CHECK(he.status == 400 && !strcmp(he.param, bad[i].param) &&
                  strstr(he.msg, "--skip-tokenizer-init"),
              "%s: %d %s %s", bad[i].body, he.status, he.param, he.msg);
    }
    /* with the tokenizer, return_token_ids is off unless asked for */
    model = with;
    CHECK(parse(HTTP_API_COMPLETIONS, "{\"prompt\":[5]}", &g, &he) == 0, "%s", he.msg);
    CHECK(g.return_ids == 0, "default off");
    http_gen_dispose(&g);
    CHECK(parse(HTTP_API_CHAT,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"return_token_ids\":true}",
                &g, &he) == 0,
          "%s", he.msg);
    CHECK(g.return_ids == 1, "asked for");
    http_gen_dispose(&g);
}

/* response_format and guided_*: compiled into sp.grammar, shared through the compile
 * cache; bad ones a 400 naming the field. */
static void test_structured(void)
{
    struct http_gen g, g2;
    struct http_error he;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],";
    char buf[1024];
    snprintf(buf, sizeof buf,
             "%s\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
             "\"strict\":true,\"schema\":{\"type\":\"integer\"}}}}",
             chat);
    CHECK(parse(HTTP_API_CHAT, buf, &g, &he) == 0 && g.sp.grammar, "%s", he.msg);
    CHECK(parse(HTTP_API_CHAT, buf, &g2, &he) == 0 && g2.sp.grammar == g.sp.grammar,
          "the same schema text is compiled once");
    http_gen_dispose(&g);
    http_gen_dispose(&g2);
    snprintf(buf, sizeof buf, "{\"prompt\":\"a\",\"guided_choice\":[\"x\",\"y\"]}");
    CHECK(parse(HTTP_API_COMPLETIONS, buf, &g, &he) == 0 && g.sp.grammar, "%s", he.msg);
    http_gen_dispose(&g);
    snprintf(buf, sizeof buf, "%s\"response_format\":{\"type\":\"text\"}}", chat);
    CHECK(parse(HTTP_API_CHAT, buf, &g, &he) == 0 && !g.sp.grammar, "text: no grammar");
    http_gen_dispose(&g);
    static const char *const bad[][3] = {
        {"\"guided_regex\":\"a{2,1}\"}", "guided_regex", "'guided_regex' is invalid: repetition"},
        {"\"guided_json\":{\"type\":\"object\",\"if\":{}}}", "guided_json",
         "'if' is not supported"},
        {"\"guided_grammar\":\"root ::= root \\\"a\\\"\"}", "guided_grammar", "left-recursive"},
        {"\"response_format\":{\"type\":\"json_schema\"}}", "response_format.json_schema",
         "must be an object"},
        {"\"response_format\":\"json\"}", "response_format", "must be an object"},
        {"\"guided_choice\":[\"a\",3]}", "guided_choice", "'guided_choice[1]'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(buf, sizeof buf, "%s%s", chat, bad[i][0]);
        CHECK(parse(HTTP_API_CHAT, buf, &g, &he) < 0 && he.status == 400, "bad %zu accepted", i);
        CHECK(!strcmp(he.param, bad[i][1]), "bad %zu: param '%s'", i, he.param);
        CHECK(strstr(he.msg, bad[i][2]), "bad %zu: '%s' lacks '%s'", i, he.msg, bad[i][2]);
    }
    snprintf(buf, sizeof buf,
             "{\"model\":\"tiny\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":"
             "\"hi\"}],\"guided_regex\":\"a\"}");
    CHECK(parse(HTTP_API_MESSAGES, buf, &g, &he) < 0 && !strcmp(he.param, "guided_regex"),
          "messages");
}

int main(int argc, char **argv)
{
    const char *data = argc > 1 ? argv[1] : "../shared/testdata";
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", data);
    struct err e = {0};
    struct tok *t = tok_load(dir, &e);
    if (!t) {
        fprintf(stderr, "cannot load %s: %s\n", dir, e.msg);
        return 1;
    }
    char *src = tmpl_load_from_model(dir, NULL, &e);
    cJSON *vars = tmpl_special_tokens(dir);
    model = (struct http_model){.name = "tiny",
                                .tok = t,
                                .tmpl_src = src,
                                .tmpl_vars = vars,
                                .vocab = tok_vocab_size(t),
                                .max_model_len = 4096};
    CHECK(model.vocab == 2048, "vocab %d", model.vocab);
    test_errors();
    test_parse();
    test_stops(t);
    test_no_tokenizer();
    test_structured();
    free(src);
    cJSON_Delete(vars);
    tok_destroy(t);
    TEST_DONE();
}
