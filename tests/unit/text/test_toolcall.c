/*
 * Tool-call and reasoning parsers: fixed outputs of each format give the expected content
 * and calls, and give them in every chunking (every split point into two and three pieces,
 * byte by byte, random chunkings): the argument pieces a stream would send concatenate to
 * the final arguments, a call's name never changes once known, and no markup reaches the
 * content.
 */
#include <stdint.h>
#include <string.h>

#include "test_util.h"
#include "text/reasoning.h"
#include "text/toolcall.h"

struct want_call {
    const char *name, *args;
};

struct tcase {
    enum tcall_format f;
    const char *out;
    const char *content;
    int n_calls;
    struct want_call calls[3];
};

static const char *tools_json =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":"
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"opts\":{\"type\":\"object\"}}}}}]";

static const struct tcase cases[] = {
    {TCALL_HERMES, "Hello world", "Hello world", 0, {{0}}},
    {TCALL_HERMES, "a < b <tool but no call", "a < b <tool but no call", 0, {{0}}},
    {TCALL_HERMES,
     "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
     "\"days\": 3}}\n</tool_call>",
     "Let me check.\n",
     1,
     {{"get_weather", "{\"city\":\"Paris\",\"days\":3}"}}},
    {TCALL_HERMES,
     "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"s\": \"x } \\\" {\", \"n\": [1, {\"k\": "
     "null}]}}\n</tool_call>\n<tool_call>\n{\"arguments\": {}, \"name\": \"b\"}\n</tool_call>",
     "",
     2,
     {{"a", "{\"s\":\"x } \\\" {\",\"n\":[1,{\"k\":null}]}"}, {"b", "{}"}}},
    /* a scalar field after the arguments, and a call without arguments */
    {TCALL_HERMES,
     "<tool_call>{\"name\":\"f\",\"arguments\":{\"x\":1},\"id\":7}</tool_call><tool_call>{\"name\":"
     "\"g\"}</tool_call>",
     "",
     2,
     {{"f", "{\"x\":1}"}, {"g", "{}"}}},
    /* malformed before the name: it was content */
    {TCALL_HERMES, "<tool_call>oops</tool_call>", "<tool_call>oops</tool_call>", 0, {{0}}},
    /* cut short after the name: the call keeps what it had */
    {TCALL_HERMES,
     "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"ab",
     "",
     1,
     {{"f", "{\"q\":\"ab"}}},
    {TCALL_QWEN3_XML,
     "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew \"York\"\nline2\n</"
     "parameter>\n<parameter=days>\n5\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</"
     "parameter>\n</function>\n</tool_call>",
     "Sure.\n",
     1,
     {{"get_weather",
       "{\"city\":\"New \\\"York\\\"\\nline2\",\"days\":5,\"opts\":{\"a\":[1,2]}}"}}},
    {TCALL_QWEN3_XML,
     "<tool_call>\n<function=noargs>\n</function>\n</tool_call>\n<tool_call>\n<function=get_"
     "weather>\n<parameter=days>\nsoon\n</parameter>\n</function>\n</tool_call>",
     "",
     2,
     {{"noargs", "{}"}, {"get_weather", "{\"days\":\"soon\"}"}}},
    {TCALL_LLAMA3_JSON,
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
     "",
     1,
     {{"get_weather", "{\"city\":\"Oslo\"}"}}},
    {TCALL_LLAMA3_JSON,
     "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": "
     "{\"x\": [true]}}",
     "",
     2,
     {{"a", "{}"}, {"b", "{\"x\":[true]}"}}},
    {TCALL_LLAMA3_JSON, "The answer is {not a call}", "The answer is {not a call}", 0, {{0}}},
    {TCALL_MISTRAL,
     "ok [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"k\": \"v\"}}, {\"name\": \"b\", "
     "\"arguments\": {}}]",
     "ok ",
     2,
     {{"a", "{\"k\":\"v\"}"}, {"b", "{}"}}},
    {TCALL_MISTRAL,
     "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]b[ARGS]{}",
     "",
     2,
     {{"get_weather", "{\"city\":\"Rome\"}"}, {"b", "{}"}}},
    {TCALL_MISTRAL, "[TOOL_CALLS] is a tag", "[TOOL_CALLS] is a tag", 0, {{0}}},
    {TCALL_GEMMA4,
     "Checking.<|tool_call>call:get_weather{city:<|\"|>New \"York\"<|\"|>,days:3,opts:{a:[1,"
     "true,null],<|\"|>b c<|\"|>:<|\"|>x<|\"|>}}<tool_call|><|tool_call>call:noargs{}<tool_call|>",
     "Checking.",
     2,
     {{"get_weather", "{\"city\":\"New \\\"York\\\"\",\"days\":3,\"opts\":{\"a\":[1,true,"
                      "null],\"b c\":\"x\"}}"},
      {"noargs", "{}"}}},
    {TCALL_GEMMA4, "<|tool_call>nope", "<|tool_call>nope", 0, {{0}}},
    /* harmony: thinking (no reasoning parser) and preambles are content, markup is not */
    {TCALL_HARMONY,
     "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
     "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", "
     "\"days\": [1, 2]}<|call|>",
     "Need the weather.",
     1,
     {{"get_weather", "{\"city\":\"Paris\",\"days\":[1,2]}"}}},
    {TCALL_HARMONY, "<|channel|>final<|message|>It is 4 < 5.<|return|>", "It is 4 < 5.", 0, {{0}}},
    /* the recipient in the role part, a preamble, a call without arguments */
    {TCALL_HARMONY,
     "<|channel|>commentary<|message|>Plan: look.<|end|><|start|>assistant to=functions.a"
     "<|channel|>commentary json<|message|>{\"s\": \"x<|y\"}<|call|><|start|>assistant"
     "<|channel|>commentary to=functions.b<|message|><|call|>",
     "Plan: look.",
     2,
     {{"a", "{\"s\":\"x<|y\"}"}, {"b", "{}"}}},
    /* cut short (the stop token is not in the text): the call keeps what it had */
    {TCALL_HARMONY,
     "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"q\": \"ab",
     "",
     1,
     {{"f", "{\"q\":\"ab"}}},
    /* a built-in tool's input is not a call; a body that is not JSON gives {} */
    {TCALL_HARMONY,
     "<|channel|>analysis to=python<|message|>print(1)<|call|>",
     "print(1)",
     0,
     {{0}}},
    {TCALL_HARMONY,
     "<|channel|>commentary to=functions.f<|message|>not json<|call|>",
     "",
     1,
     {{"f", "{}"}}},
    {TCALL_HARMONY, "plain text, no messages", "plain text, no messages", 0, {{0}}},
    /* regression (mistral_name_span): markup in a name was seen only when it came before
     * [ARGS] did, so the chunking decided whether this was a call */
    {TCALL_MISTRAL, "[TOOL_CALLS]a[b{[ARGS]{}", "[TOOL_CALLS]a[b{[ARGS]{}", 0, {{0}}},
};

/* Runs one case in the given chunking (cuts: sorted split points); checks it like a stream
 * consumer would. Returns the number of failed checks. */
static int run_chunked(const struct tcase *tc, const cJSON *tools, const size_t *cuts, int n_cuts)
{
    int before = test_failures;
    struct tcall_parser *p = tcall_parser_create(tc->f, tools);
    struct tcall_str content = {0}, streamed[3] = {{0}};
    char *names[3] = {0};
    size_t n = strlen(tc->out), at = 0;
    for (int k = 0; k <= n_cuts; k++) {
        size_t to = k < n_cuts ? cuts[k] : n;
        if (k < n_cuts)
            tcall_parser_push(p, tc->out + at, to - at, &content);
        else
            tcall_parser_push(p, tc->out + at, to - at, &content), tcall_parser_finish(p, &content);
        at = to;
        /* what a stream sends after this push: names once, then the arguments' new bytes */
        for (int i = 0; i < tcall_parser_n_calls(p) && i < 3; i++) {
            const struct tcall *c = tcall_parser_call(p, i);
            if (!c->name) continue;
            if (!names[i]) names[i] = strdup(c->name);
            CHECK(!strcmp(names[i], c->name), "name changed: %s -> %s", names[i], c->name);
            CHECK(c->args.len >= streamed[i].len &&
                      !memcmp(c->args.p, streamed[i].p ? streamed[i].p : "", streamed[i].len),
                  "arguments rewritten");
            tcall_str_append(&streamed[i], c->args.p + streamed[i].len,
                             c->args.len - streamed[i].len);
        }
    }
    CHECK(!strcmp(content.p ? content.p : "", tc->content), "content '%s', want '%s' (%s)",
          content.p ? content.p : "", tc->content, tc->out);
    CHECK(tcall_parser_n_calls(p) == tc->n_calls, "%d calls, want %d (%s)", tcall_parser_n_calls(p),
          tc->n_calls, tc->out);
    for (int i = 0; i < tc->n_calls && i < tcall_parser_n_calls(p); i++) {
        const struct tcall *c = tcall_parser_call(p, i);
        CHECK(c->done, "call %d not done", i);
        CHECK(c->name && !strcmp(c->name, tc->calls[i].name), "name %s, want %s", c->name,
              tc->calls[i].name);
        CHECK(!strcmp(c->args.p, tc->calls[i].args), "args %s, want %s", c->args.p,
              tc->calls[i].args);
        CHECK(streamed[i].p && !strcmp(streamed[i].p, c->args.p), "streamed %s != final %s",
              streamed[i].p, c->args.p);
    }
    for (int i = 0; i < 3; i++) free(names[i]), tcall_str_dispose(&streamed[i]);
    tcall_str_dispose(&content);
    tcall_parser_destroy(p);
    return test_failures - before;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}

static void test_tool_parsers(void)
{
    cJSON *tools = cJSON_Parse(tools_json);
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        const struct tcase *tc = &cases[t];
        size_t n = strlen(tc->out);
        if (run_chunked(tc, tools, NULL, 0)) continue; /* one piece */
        int bad = 0;
        for (size_t a = 1; a < n && !bad; a++) { /* every split into two */
            size_t cuts[1] = {a};
            bad = run_chunked(tc, tools, cuts, 1);
        }
        for (size_t a = 1; a < n && !bad; a++) /* every split into three */
            for (size_t b = a + 1; b < n && !bad; b++) {
                size_t cuts[2] = {a, b};
                bad = run_chunked(tc, tools, cuts, 2);
            }
        size_t *cuts = malloc(sizeof *cuts * (n ? n : 1));
        for (size_t i = 1; i < n; i++) cuts[i - 1] = i; /* byte by byte */
        if (!bad) bad = run_chunked(tc, tools, cuts, (int)n - 1);
        for (int r = 0; r < 200 && !bad; r++) { /* random chunkings */
            int k = 0;
            for (size_t i = 1; i < n; i++)
                if (next_rand() % 4 == 0) cuts[k++] = i;
            bad = run_chunked(tc, tools, cuts, k);
        }
        free(cuts);
    }
    cJSON_Delete(tools);
}

/* regression (gemma4_key_cut): a key without ':' was cut where the held text happened to
 * pass 256 bytes, so the chunking decided the arguments; now always at 256 bytes */
static void test_gemma_long_key(void)
{
    static char out[512], args[512];
    char k300[301], k256[257], k44[45];
    memset(k300, 'k', 300), k300[300] = 0;
    memset(k256, 'k', 256), k256[256] = 0;
    memset(k44, 'k', 44), k44[44] = 0;
    snprintf(out, sizeof out, "<|tool_call>call:f{%s:1}<tool_call|>", k300);
    snprintf(args, sizeof args, "{\"%s\":%s:1}", k256, k44);
    struct tcase tc = {TCALL_GEMMA4, out, "", 1, {{"f", args}}};
    size_t n = strlen(out);
    int bad = run_chunked(&tc, NULL, NULL, 0);
    for (size_t a = 1; a < n && !bad; a++) {
        size_t cuts[1] = {a};
        bad = run_chunked(&tc, NULL, cuts, 1);
    }
}

static void test_detect(void)
{
    CHECK(tcall_format_detect("{{ '<tool_call>' }}") == TCALL_HERMES, "hermes");
    CHECK(tcall_format_detect("<tool_call>\n<function=x>") == TCALL_QWEN3_XML, "qwen3_xml");
    CHECK(tcall_format_detect("[TOOL_CALLS]") == TCALL_MISTRAL, "mistral");
    CHECK(tcall_format_detect("<|python_tag|>") == TCALL_LLAMA3_JSON, "llama3_json");
    CHECK(tcall_format_detect("{{ messages }}") == TCALL_NONE, "none");
    CHECK(tcall_format_detect("'<|tool_call>call:'") == TCALL_GEMMA4, "gemma4");
    CHECK(tcall_format_detect("<|start|>assistant<|channel|>final<|message|>") == TCALL_HARMONY,
          "harmony");
    CHECK(tcall_format_detect("<|channel>thought") == TCALL_NONE, "gemma's channel is not harmony");
    CHECK(tcall_format_from_name("harmony") == TCALL_HARMONY, "harmony name");
    CHECK(tcall_format_from_name("hermes") == TCALL_HERMES, "name");
    CHECK(tcall_format_from_name("pythonic") == -1, "unknown name");
}

struct rcase {
    enum reason_format f;
    int opened;
    const char *out, *thinking, *answer;
};

#define X50  "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
#define X300 X50 X50 X50 X50 X50 X50

static const struct rcase rcases[] = {
    {REASON_QWEN3, 0, "<think>\nhmm, 2+2\n</think>\n\nIt is 4.", "\nhmm, 2+2\n", "It is 4."},
    {REASON_QWEN3, 0, "No thinking here", "", "No thinking here"},
    {REASON_QWEN3, 0, "  <thin but not", "", "  <thin but not"},
    {REASON_QWEN3, 1, "deep </thought> </think>answer", "deep </thought> ", "answer"},
    {REASON_QWEN3, 0, "<think>never closed", "never closed", ""},
    {REASON_DEEPSEEK_R1, 0, "reason</think>ans", "reason", "ans"},
    {REASON_DEEPSEEK_R1, 0, "<think>r</think>\n a", "r", "a"},
    {REASON_GEMMA4, 0, "<|channel>thought\nplan<channel|>Done", "\nplan", "Done"},
    {REASON_GEMMA4, 0, "<|channel|>final", "", "<|channel|>final"},
    {REASON_HARMONY, 0,
     "<|channel|>analysis<|message|>2+2 is 4.<|end|><|start|>assistant<|channel|>final"
     "<|message|>4<|return|>",
     "2+2 is 4.", "4"},
    {REASON_HARMONY, 0, "<|channel|>analysis<|message|>cut sh", "cut sh", ""},
    {REASON_HARMONY, 1, "still thinking<|end|><|start|>assistant<|channel|>final<|message|>ok",
     "still thinking", "ok"},
    /* a call goes on to the tool-call parser in one form, whatever the header's order */
    {REASON_HARMONY, 0,
     "<|channel|>analysis<|message|>t<|end|><|start|>assistant to=functions.f<|channel|>"
     "commentary json<|message|>{}<|call|>",
     "t",
     "<|start|>assistant<|channel|>commentary to=functions.f "
     "<|constrain|>json<|message|>{}<|call|>"},
    /* a header past its bound (256 bytes) is text */
    {REASON_HARMONY, 0, "<|channel|>" X300 "yz<|end|>", "", X300 "yz"},
};

static int run_reason(const struct rcase *rc, const size_t *cuts, int n_cuts)
{
    int before = test_failures;
    struct reason_parser r;
    reason_parser_init(&r, rc->f, rc->opened);
    struct tcall_str th = {0}, an = {0};
    size_t n = strlen(rc->out), at = 0;
    for (int k = 0; k <= n_cuts; k++) {
        size_t to = k < n_cuts ? cuts[k] : n;
        reason_parser_push(&r, rc->out + at, to - at, &th, &an);
        at = to;
    }
    reason_parser_finish(&r, &th, &an);
    CHECK(!strcmp(th.p ? th.p : "", rc->thinking), "thinking '%s' want '%s'", th.p ? th.p : "",
          rc->thinking);
    CHECK(!strcmp(an.p ? an.p : "", rc->answer), "answer '%s' want '%s'", an.p ? an.p : "",
          rc->answer);
    tcall_str_dispose(&th);
    tcall_str_dispose(&an);
    reason_parser_dispose(&r);
    return test_failures - before;
}

static void test_reasoning(void)
{
    for (size_t t = 0; t < sizeof rcases / sizeof *rcases; t++) {
        const struct rcase *rc = &rcases[t];
        size_t n = strlen(rc->out);
        int bad = run_reason(rc, NULL, 0);
        for (size_t a = 1; a < n && !bad; a++)
            for (size_t b = a; b < n && !bad; b++) {
                size_t cuts[2] = {a, b};
                bad = run_reason(rc, cuts, 2);
            }
    }
}

/* harmony through both parsers, as the server chains them: thinking, content and the call
 * come out the same in every split into three pieces, and the arguments only grow */
static int run_harmony_chain(const char *out, const size_t *cuts, int n_cuts)
{
    int before = test_failures;
    struct reason_parser r;
    reason_parser_init(&r, REASON_HARMONY, 0);
    struct tcall_parser *p = tcall_parser_create(TCALL_HARMONY, NULL);
    struct tcall_str th = {0}, content = {0};
    size_t n = strlen(out), at = 0, sent = 0;
    for (int k = 0; k <= n_cuts; k++) {
        size_t to = k < n_cuts ? cuts[k] : n;
        struct tcall_str an = {0};
        reason_parser_push(&r, out + at, to - at, &th, &an);
        if (k == n_cuts) reason_parser_finish(&r, &th, &an);
        tcall_parser_push(p, an.p ? an.p : "", an.len, &content);
        if (k == n_cuts) tcall_parser_finish(p, &content);
        tcall_str_dispose(&an);
        at = to;
        if (tcall_parser_n_calls(p)) {
            const struct tcall *c = tcall_parser_call(p, 0);
            CHECK(c->args.len >= sent, "arguments shrank");
            sent = c->args.len;
        }
    }
    CHECK(!strcmp(th.p ? th.p : "", "Check <|weather|>."), "thinking '%s'", th.p ? th.p : "");
    CHECK(!strcmp(content.p ? content.p : "", "Looking."), "content '%s'",
          content.p ? content.p : "");
    CHECK(tcall_parser_n_calls(p) == 1, "%d calls", tcall_parser_n_calls(p));
    if (tcall_parser_n_calls(p) == 1) {
        const struct tcall *c = tcall_parser_call(p, 0);
        CHECK(c->done && !strcmp(c->name, "get_weather"), "name %s", c->name);
        CHECK(!strcmp(c->args.p, "{\"city\":\"Oslo\"}"), "args %s", c->args.p);
    }
    tcall_str_dispose(&th);
    tcall_str_dispose(&content);
    tcall_parser_destroy(p);
    reason_parser_dispose(&r);
    return test_failures - before;
}

static void test_harmony_chain(void)
{
    static const char out[] =
        "<|channel|>analysis<|message|>Check <|weather|>.<|end|><|start|>assistant<|channel|>"
        "commentary<|message|>Looking.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>";
    size_t n = strlen(out);
    int bad = run_harmony_chain(out, NULL, 0);
    for (size_t a = 1; a < n && !bad; a++)
        for (size_t b = a; b < n && !bad; b++) {
            size_t cuts[2] = {a, b};
            bad = run_harmony_chain(out, cuts, 2);
        }
}

int main(void)
{
    test_detect();
    test_tool_parsers();
    test_gemma_long_key();
    test_reasoning();
    test_harmony_chain();
    TEST_DONE();
}
