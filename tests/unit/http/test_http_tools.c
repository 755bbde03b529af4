/*
 * Tool calling and reasoning in requests, without a server: tools of both APIs in one
 * shape, tool_choice and its grammar, assistant tool calls, tool results and Anthropic
 * blocks as the template sees them (rendered by a small template that prints every field),
 * chat_template_kwargs, thinking and its budget.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/request.h"
#include "text/toolcall.h"
#include "text/tmpl.h"
#include "test_util.h"

static struct http_model model;

/* Prints what HF templates read of messages and tools. */
static const char *const tmpl =
    "{% for m in messages %}{{ m.role }}:{{ m.content }}"
    "{% for c in m.tool_calls or [] %}[{{ c.id }} {{ c.function.name }}"
    "{% for k, v in c.function.arguments|items %} {{ k }}={{ v }}{% endfor %}]{% endfor %}"
    "{% if m.tool_call_id %}<{{ m.tool_call_id }}>{% endif %}|{% endfor %}"
    "{% if tools %}T{% for t in tools %} {{ t.function.name }}:{{ t.function.parameters.type }}"
    "{% endfor %}{% endif %}{% if enable_thinking is defined %} think={{ enable_thinking }}"
    "{% endif %}{% if add_generation_prompt %}<think>\n{% endif %}";

static char *render(enum http_api api, const char *json)
{
    cJSON *body = cJSON_Parse(json);
    struct http_error he = {0};
    int32_t *ids = NULL;
    int n = 0;
    char *text = NULL;
    int rc = http_chat_prompt(api, body, &model, &ids, &n, &text, &he);
    CHECK(rc == 0, "%s: %s", json, he.msg);
    cJSON_Delete(body);
    free(ids);
    return text;
}

static int parse(enum http_api api, const char *json, struct http_gen *g, struct http_error *he)
{
    cJSON *body = cJSON_Parse(json);
    memset(he, 0, sizeof *he);
    int rc = http_gen_parse(api, body, &model, g, he);
    cJSON_Delete(body);
    return rc;
}

static void test_messages(void)
{
    char *t =
        render(HTTP_API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
               "\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
               "\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"city\\\": \\\"Oslo\\\", "
               "\\\"n\\\": 2}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":"
               "\"5 C\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\","
               "\"parameters\":{\"type\":\"object\"}}}]}");
    CHECK(t && !strcmp(t, "user:hi|assistant:[c1 get city=Oslo n=2]|tool:5 C<c1>|T get:object"
                          "<think>\n"),
          "%s", t);
    free(t);
    /* Anthropic: tool_use in the assistant turn, tool_result as a tool message before the
     * user's text; tools converted, thinking to enable_thinking */
    t = render(HTTP_API_MESSAGES,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
               "\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\",\"signature\":\"\"},"
               "{\"type\":\"text\",\"text\":\"Let me look.\"},{\"type\":\"tool_use\",\"id\":"
               "\"t1\",\"name\":\"get\",\"input\":{\"city\":\"Rome\"}}]},{\"role\":\"user\","
               "\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\",\"content\":[{"
               "\"type\":\"text\",\"text\":\"20 C\"}]},{\"type\":\"text\",\"text\":\"thanks\"}]}],"
               "\"tools\":[{\"name\":\"get\",\"input_schema\":{\"type\":\"object\"}}],"
               "\"thinking\":{\"type\":\"disabled\"}}");
    CHECK(t && !strcmp(t, "user:hi|assistant:Let me look.[t1 get city=Rome]|tool:20 C<t1>|user:"
                          "thanks|T get:object think=False<think>\n"),
          "%s", t);
    free(t);
    t = render(HTTP_API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                              "\"chat_template_kwargs\":{\"enable_thinking\":true}}");
    CHECK(t && !strcmp(t, "user:hi| think=True<think>\n"), "%s", t);
    free(t);
}

static void test_choice(void)
{
    static const char *const tools =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"],"
        "\"additionalProperties\":false}}}]";
    static const struct {
        enum http_api api;
        const char *extra;
        enum http_tool_choice choice;
        int grammar, trigger, parallel;
    } cases[] = {
        {HTTP_API_CHAT, "", HTTP_TOOLS_AUTO, 1, 1, 1},
        {HTTP_API_CHAT, ",\"tool_choice\":\"none\"", HTTP_TOOLS_NONE, 0, 0, 1},
        {HTTP_API_CHAT, ",\"tool_choice\":\"required\",\"parallel_tool_calls\":false",
         HTTP_TOOLS_REQUIRED, 1, 0, 0},
        {HTTP_API_CHAT, ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get\"}}",
         HTTP_TOOLS_NAMED, 1, 0, 1},
        {HTTP_API_MESSAGES,
         ",\"tool_choice\":{\"type\":\"any\",\"disable_parallel_tool_use\":true}",
         HTTP_TOOLS_REQUIRED, 1, 0, 0},
        {HTTP_API_MESSAGES, ",\"tool_choice\":{\"type\":\"none\"}", HTTP_TOOLS_NONE, 0, 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[2048];
        const char *t = cases[i].api == HTTP_API_MESSAGES
                            ? "\"tools\":[{\"name\":\"get\",\"input_schema\":{\"type\":\"object\","
                              "\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":[\"n\"],"
                              "\"additionalProperties\":false}}]"
                            : tools;
        snprintf(json, sizeof json,
                 "{\"model\":\"tiny\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\","
                 "\"content\":\"hi\"}],%s%s}",
                 t, cases[i].extra);
        struct http_gen g;
        struct http_error he;
        int rc = parse(cases[i].api, json, &g, &he);
        CHECK(rc == 0, "case %zu: %s", i, he.msg);
        if (rc) continue;
        CHECK(g.tool_choice == cases[i].choice, "case %zu: choice %d", i, g.tool_choice);
        CHECK(!!g.sp.grammar == cases[i].grammar, "case %zu: grammar", i);
        CHECK(!!g.sp.grammar_trigger == cases[i].trigger, "case %zu: trigger", i);
        CHECK(g.parallel_calls == cases[i].parallel, "case %zu: parallel", i);
        CHECK(g.tool_format == (cases[i].choice ? TCALL_HERMES : TCALL_NONE), "case %zu", i);
        if (cases[i].choice == HTTP_TOOLS_NAMED) {
            /* the grammar takes exactly the hermes call of the named tool */
            struct gram_matcher *m = gram_matcher_create(g.sp.grammar);
            const char *call = "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"n\": 12}}\n"
                               "</tool_call>";
            CHECK(gram_matcher_accept_bytes(m, call, strlen(call)) && gram_matcher_can_end(m),
                  "named call refused");
            gram_matcher_destroy(m);
            m = gram_matcher_create(g.sp.grammar);
            const char *bad = "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"n\": \"x\"";
            CHECK(!gram_matcher_accept_bytes(m, bad, strlen(bad)), "a string for n accepted");
            gram_matcher_destroy(m);
        }
        http_gen_dispose(&g);
    }
}

static void test_thinking(void)
{
    struct http_gen g;
    struct http_error he;
    /* the template opens <think>: with a reasoning parser the output starts thinking, and
     * the budget's end ids are the tag's */
    model.reason_format = REASON_QWEN3;
    int rc = parse(HTTP_API_MESSAGES,
                   "{\"model\":\"tiny\",\"max_tokens\":50,\"messages\":[{\"role\":\"user\","
                   "\"content\":\"hi\"}],\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":"
                   "20}}",
                   &g, &he);
    CHECK(rc == 0, "%s", he.msg);
    if (!rc) {
        CHECK(g.think_open && g.reason_format == REASON_QWEN3, "think_open %d", g.think_open);
        CHECK(g.sp.think_budget == 20 && g.sp.n_think_end > 0 && g.sp.n_think_start == 0,
              "budget %d end %d start %d", g.sp.think_budget, g.sp.n_think_end, g.sp.n_think_start);
        char *end = tok_decode(model.tok, g.sp.think_end, (size_t)g.sp.n_think_end, 0);
        CHECK(!strcmp(end, "</think>"), "%s", end);
        free(end);
        http_gen_dispose(&g);
    }
    rc = parse(HTTP_API_CHAT,
               "{\"model\":\"tiny\",\"max_tokens\":50,\"reasoning_effort\":\"low\",\"messages\":[{"
               "\"role\":\"user\",\"content\":\"hi\"}]}",
               &g, &he);
    CHECK(rc == 0 && g.sp.think_budget == 1024, "effort low: %d", g.sp.think_budget);
    if (!rc) http_gen_dispose(&g);
    rc = parse(HTTP_API_MESSAGES,
               "{\"model\":\"tiny\",\"max_tokens\":50,\"messages\":[{\"role\":\"user\","
               "\"content\":\"hi\"}],\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":50}}",
               &g, &he);
    CHECK(rc < 0 && !strcmp(he.param, "thinking.budget_tokens"), "budget >= max_tokens: %s",
          he.msg);
    /* a required call after thinking: the grammar waits for </think> and starts with it */
    rc = parse(HTTP_API_CHAT,
               "{\"model\":\"tiny\",\"max_tokens\":50,\"messages\":[{\"role\":\"user\","
               "\"content\":\"hi\"}],\"tool_choice\":\"required\",\"tools\":[{\"type\":"
               "\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
               "\"properties\":{},\"additionalProperties\":false}}}]}",
               &g, &he);
    CHECK(rc == 0, "%s", he.msg);
    if (!rc) {
        CHECK(g.sp.grammar_trigger && !strcmp(g.sp.grammar_trigger, "</think>"), "trigger %s",
              g.sp.grammar_trigger ? g.sp.grammar_trigger : "(none)");
        struct gram_matcher *m = gram_matcher_create(g.sp.grammar);
        const char *out = "</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n"
                          "</tool_call>";
        CHECK(gram_matcher_accept_bytes(m, out, strlen(out)) && gram_matcher_can_end(m),
              "the call after </think> refused");
        gram_matcher_destroy(m);
        http_gen_dispose(&g);
    }
    model.reason_format = REASON_NONE;
}

/* A required or named choice under another format: the grammar takes exactly the format's
 * call of the tool, with arguments under its schema. */
static void check_format_grammar(enum tcall_format f, const char *choice, const char *good,
                                 const char *bad)
{
    model.tool_format = f;
    char json[1024];
    snprintf(json, sizeof json,
             "{\"model\":\"tiny\",\"max_tokens\":8,\"messages\":[{\"role\":\"user\","
             "\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
             "\"get\",\"parameters\":{\"type\":\"object\",\"properties\":{\"n\":{\"type\":"
             "\"integer\"},\"s\":{\"type\":\"string\"}},\"required\":[\"n\"],"
             "\"additionalProperties\":false}}}],\"tool_choice\":%s}",
             choice);
    struct http_gen g;
    struct http_error he;
    int rc = parse(HTTP_API_CHAT, json, &g, &he);
    CHECK(rc == 0, "%s %s: %s", tcall_format_name(f), choice, he.msg);
    model.tool_format = TCALL_HERMES;
    if (rc) return;
    CHECK(g.sp.grammar && !g.sp.grammar_trigger, "%s: no grammar", tcall_format_name(f));
    struct gram_matcher *m = gram_matcher_create(g.sp.grammar);
    CHECK(gram_matcher_accept_bytes(m, good, strlen(good)) && gram_matcher_can_end(m),
          "%s: call refused: %s", tcall_format_name(f), good);
    gram_matcher_destroy(m);
    m = gram_matcher_create(g.sp.grammar);
    CHECK(!gram_matcher_accept_bytes(m, bad, strlen(bad)), "%s: accepted %s", tcall_format_name(f),
          bad);
    gram_matcher_destroy(m);
    http_gen_dispose(&g);
}

/* What the gemma4 parser makes of a call the grammar accepts: the arguments as JSON. */
static void check_gemma_roundtrip(const char *out, const char *want)
{
    struct tcall_parser *p = tcall_parser_create(TCALL_GEMMA4, NULL);
    struct tcall_str content = {0};
    tcall_parser_push(p, out, strlen(out), &content);
    tcall_parser_finish(p, &content);
    CHECK(tcall_parser_n_calls(p) == 1 && !strcmp(tcall_parser_call(p, 0)->args.p, want),
          "gemma4 %s -> %s, want %s", out,
          tcall_parser_n_calls(p) ? tcall_parser_call(p, 0)->args.p : "(none)", want);
    tcall_str_dispose(&content);
    tcall_parser_destroy(p);
}

static void test_format_grammars(void)
{
    /* gemma4: Gemma 4's argument syntax (bare keys, strings between <|"|> marks without '<',
     * no whitespace); calls follow one another without a separator */
    static const char *const gemma_call =
        "<|tool_call>call:get{n:12,s:<|\"|>a \"b\"\nc<|\"|>}<tool_call|>";
    check_format_grammar(TCALL_GEMMA4, "\"required\"", gemma_call,
                         "<|tool_call>call:get{n:<|\"|>x");
    check_format_grammar(TCALL_GEMMA4, "\"required\"",
                         "<|tool_call>call:get{n:-1}<tool_call|><|tool_call>call:get{n:2}"
                         "<tool_call|>",
                         "<|tool_call>call:get{\"n\":1}");
    check_format_grammar(TCALL_GEMMA4, "{\"type\":\"function\",\"function\":{\"name\":\"get\"}}",
                         "<|tool_call>call:get{n:0}<tool_call|>",
                         "<|tool_call>call:get{n:1, s:<|\"|>x<|\"|>}<tool_call|>");
    check_format_grammar(TCALL_GEMMA4, "\"required\"", "<|tool_call>call:get{n:1}<tool_call|>",
                         "<|tool_call>call:get{n:1,s:<|\"|>a<b<|\"|>}");
    check_gemma_roundtrip(gemma_call, "{\"n\":12,\"s\":\"a \\\"b\\\"\\nc\"}");
    /* harmony: one call (<|call|> stops the output), even with parallel calls allowed */
    check_format_grammar(TCALL_HARMONY, "\"required\"",
                         "<|channel|>commentary to=functions.get <|constrain|>json<|message|>"
                         "{\"n\": 12, \"s\": \"a\"}<|call|>",
                         "<|channel|>commentary to=functions.get <|constrain|>json<|message|>"
                         "{\"n\": 12}<|call|><|start|>");
    check_format_grammar(TCALL_HARMONY, "{\"type\":\"function\",\"function\":{\"name\":\"get\"}}",
                         "<|channel|>commentary to=functions.get <|constrain|>json<|message|>"
                         "{\"n\": -1}<|call|>",
                         "<|channel|>commentary to=functions.get <|constrain|>json<|message|>"
                         "{\"n\": \"x\"");
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
    model = (struct http_model){.name = "tiny",
                                .tok = t,
                                .tmpl_src = tmpl,
                                .vocab = tok_vocab_size(t),
                                .max_model_len = 4096,
                                .tool_format = TCALL_HERMES};
    test_messages();
    test_choice();
    test_thinking();
    test_format_grammars();
    tok_destroy(t);
    TEST_DONE();
}
